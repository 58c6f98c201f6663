/* Fuzz target: SHOAL_CONF_FILE, line by line as the loader reads it (getline: each line
 * with its newline), through shoal_cfg_line_parse (src/util/config.c); each assignment to a
 * known variable goes on to that row's value parser. Input: the file. */
#include "tests/fuzz/fuzz.h"

static const shoal_cfg_field_t *fuzz_conf_find(const char *name, size_t len)
{
    for (size_t t = 0; t < shoal_cfg_ntables; t++) {
        for (size_t i = 0; i < shoal_cfg_tables[t]->nfields; i++) {
            const shoal_cfg_field_t *f = &shoal_cfg_tables[t]->fields[i];
            if (strlen(f->name) == len && strncmp(f->name, name, len) == 0) {
                return f;
            }
        }
    }
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;

    while (off < size) {
        const uint8_t *nl = memchr(data + off, '\n', size - off);
        size_t len = nl != NULL ? (size_t)(nl - (data + off)) + 1 : size - off;
        char *line = fuzz_strndup(data + off, len);
        size_t slen = strlen(line), name_len;
        const char *name, *value;
        int ret = shoal_cfg_line_parse(line, &name, &name_len, &value);

        fuzz_require(ret >= -1 && ret <= 1);
        if (ret == 1) {
            const shoal_cfg_field_t *f;
            uint8_t dst[sizeof(size_t)];
            fuzz_require(name >= line && name + name_len <= line + slen && name_len > 0);
            fuzz_require(value >= line && value + strlen(value) <= line + slen);
            fuzz_require(memchr(name, '=', name_len) == NULL);
            f = fuzz_conf_find(name, name_len);
            if (f != NULL && f->type != SHOAL_CFG_STRING) {
                (void)shoal_cfg_parse_value(f, value, dst);
            }
        }
        free(line);
        off += len;
    }
    return 0;
}
