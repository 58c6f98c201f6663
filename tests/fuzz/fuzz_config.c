/* Fuzz target: the config value parser (shoal_cfg_parse_value, src/util/config.c) on every
 * row of every table (BOOL, INT, UINT, SIZE, TIME, STRING, ENUM). Input: two bytes choose the
 * row, the rest is the value's text. A value that parses is formatted (as shoal_info -c does)
 * and parsed again: it must give the same value. */
#include "tests/fuzz/fuzz.h"

#include <ctype.h>

#define FUZZ_CFG_GUARD 16

static const shoal_cfg_field_t *fuzz_cfg_field(unsigned idx)
{
    size_t n = 0;
    for (size_t t = 0; t < shoal_cfg_ntables; t++) {
        n += shoal_cfg_tables[t]->nfields;
    }
    if (n == 0) {
        return NULL;
    }
    idx %= (unsigned)n;
    for (size_t t = 0; t < shoal_cfg_ntables; t++) {
        if (idx < shoal_cfg_tables[t]->nfields) {
            return &shoal_cfg_tables[t]->fields[idx];
        }
        idx -= (unsigned)shoal_cfg_tables[t]->nfields;
    }
    return NULL;
}

static size_t fuzz_cfg_size(shoal_cfg_type_t type)
{
    switch (type) {
    case SHOAL_CFG_SIZE: return sizeof(size_t);
    case SHOAL_CFG_STRING: return sizeof(const char *);
    case SHOAL_CFG_UINT: return sizeof(unsigned);
    default: return sizeof(int);
    }
}

static int fuzz_cfg_strings;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    fuzz_cfg_strings = getenv("FUZZ_CFG_STRINGS") != NULL;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const shoal_cfg_field_t *f;
    /* the value, then guard bytes that no parser may touch */
    uint8_t dst[sizeof(size_t) + FUZZ_CFG_GUARD], dst2[sizeof(dst)];
    char text[256], *s;
    size_t w;

    if (size < 2) {
        return 0;
    }
    f = fuzz_cfg_field((unsigned)data[0] | (unsigned)data[1] << 8);
    /* STRING rows: the parser copies into a pool kept for the life of the process, so every
     * input would grow it (and make libFuzzer scan for leaks each time); the replay driver
     * still runs them (FUZZ_CFG_STRINGS). */
    if (f == NULL || (f->type == SHOAL_CFG_STRING && !fuzz_cfg_strings)) {
        return 0;
    }
    w = fuzz_cfg_size(f->type);
    s = fuzz_strndup(data + 2, size - 2);
    memset(dst, 0xa5, sizeof(dst));
    if (shoal_cfg_parse_value(f, s, dst) == 0) {
        for (size_t i = w; i < sizeof(dst); i++) {
            fuzz_require(dst[i] == 0xa5);
        }
        shoal_cfg_format_value(f, dst, text, sizeof(text));
        fuzz_require(memchr(text, '\0', sizeof(text)) != NULL);
        memset(dst2, 0xa5, sizeof(dst2));
        if (f->type == SHOAL_CFG_STRING) {
            /* the value without its leading and trailing blanks (as the conf file's);
             * blanks alone are unset */
            const char *v = *(const char **)dst, *b = s;
            size_t n;
            while (isspace((unsigned char)*b)) {
                b++;
            }
            n = strlen(b);
            while (n > 0 && isspace((unsigned char)b[n - 1])) {
                n--;
            }
            fuzz_require(v == NULL ? n == 0 : strlen(v) == n && memcmp(v, b, n) == 0);
        } else if (strlen(text) < sizeof(text) - 1) {
            fuzz_require(shoal_cfg_parse_value(f, text, dst2) == 0);
            fuzz_require(memcmp(dst, dst2, w) == 0);
        }
    } else {
        for (size_t i = 0; i < sizeof(dst); i++) {
            fuzz_require(dst[i] == 0xa5); /* written only on success */
        }
    }
    free(s);
    return 0;
}
