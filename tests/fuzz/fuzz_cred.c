/* Fuzz target: the job credential parser (shoal_tenant_cred_parse, src/tenant/cred.c). A text
 * the parser accepts must format back to exactly the same text (one credential, one text form)
 * and re-parse to the same fields and MAC. Seeds: tests/fuzz/corpus/cred/. */
#include "tenant/tenant.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int fuzz_cred_same(const shoal_tenant_cred_t *a, const shoal_tenant_cred_t *b)
{
    return strcmp(a->id.tenant, b->id.tenant) == 0 && strcmp(a->id.job, b->id.job) == 0 &&
           a->id.epoch == b->id.epoch && a->id.qos_class == b->id.qos_class &&
           a->id.qos_weight == b->id.qos_weight && a->expires == b->expires &&
           memcmp(a->mac, b->mac, sizeof(a->mac)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    shoal_tenant_cred_t a, b;
    char out[SHOAL_TENANT_CRED_TEXT_MAX];
    char *text;

    if (!quiet) {
        shoal_log_level_cur = SHOAL_LOG_NONE; /* every rejected input would log a line */
        quiet = 1;
    }
    text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    if (shoal_tenant_cred_parse(text, &a) == SHOAL_OK) {
        if (shoal_tenant_cred_format(&a, out, sizeof(out)) != SHOAL_OK)
            abort(); /* an accepted credential always formats */
        if (strcmp(out, text) != 0)
            abort(); /* and gives back the text it came from */
        if (shoal_tenant_cred_parse(out, &b) != SHOAL_OK || !fuzz_cred_same(&a, &b))
            abort(); /* which parses to the same credential */
    }
    free(text);
    return 0;
}
