/* Fuzz target: src/tune's parsers. Input: a settings record as rank 0 sends it
 * (shoal_tune_record_check, then printed) when the input is at least that long, and the rest
 * (or all of a shorter input) as tuning-file text (shoal_tune_override) and as a
 * SHOAL_TUNE_MACHINE string (shoal_tune_machine_parse). */
#include "tune/tune.h"
#include "tests/fuzz/fuzz.h"

#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    shoal_tune_machine_t m = {0}, none = {0};
    shoal_tune_t rec, t;
    char *text;

    if (size >= sizeof(rec)) {
        memcpy(&rec, data, sizeof(rec));
        if (shoal_tune_record_check(&rec)) {
            FILE *fp = fopen("/dev/null", "w");
            if (fp != NULL) {
                shoal_tune_print(&rec, fp);
                fclose(fp);
            }
        }
        data += sizeof(rec);
        size -= sizeof(rec);
    }
    text = fuzz_strndup(data, size);
    shoal_tune_derive(&none, &t);
    (void)shoal_tune_override(&t, text);
    fuzz_require(shoal_tune_record_check(&t));
    if (shoal_tune_machine_parse(text, &m) >= 0) {
        shoal_tune_derive(&m, &t);
        fuzz_require(shoal_tune_record_check(&t));
    }
    free(text);
    return 0;
}
