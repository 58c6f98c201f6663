/* Fuzz target: the tuning file (SHOAL_TUNING_FILE, shoal_tuning_parse in
 * src/topo/topo_model.c). Input: the file's text. */
#include "topo/topo.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_strndup(data, size);
    shoal_tuning_t t;

    if (shoal_tuning_parse(text, &t) == SHOAL_OK) {
        for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
            fuzz_require(t.have[k] == 0 || t.have[k] == 1);
            if (t.have[k]) {
                fuzz_require(t.link[k].alpha_us >= 0 && t.link[k].beta_us >= 0 &&
                             t.link[k].send_us >= 0 && t.link[k].recv_us >= 0);
            }
        }
        fuzz_require(t.reduce_gbs >= 0 && t.copy_gbs >= 0);
    }
    free(text);
    return 0;
}
