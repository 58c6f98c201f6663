/* Test helper: commits records read from stdin into a ledger, 100 lines per commit.
 *   ledger_fill URL KEYFILE < lines
 * A line: tenant job class minute gpu_seconds bytes_same bytes_cross ops coll_seconds
 *         failed_platform failed_tenant
 * Exit 0 when every line was committed. */
#include "agent/ledger.h"
#include "util/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FILL_BATCH 100

int main(int argc, char **argv)
{
    static shoal_ledger_record_t recs[FILL_BATCH];
    uint8_t key[1024];
    size_t keylen, n = 0, total = 0;
    shoal_ledger_t *l;
    char line[512];
    FILE *kf;

    if (argc != 3) {
        fprintf(stderr, "usage: ledger_fill URL KEYFILE < records\n");
        return 2;
    }
    shoal_config_global_init();
    kf = fopen(argv[2], "rb");
    if (kf == NULL)
        return 2;
    keylen = fread(key, 1, sizeof(key), kf);
    fclose(kf);
    if (shoal_ledger_open(argv[1], key, keylen, &l) != SHOAL_OK)
        return 1;
    while (fgets(line, sizeof(line), stdin) != NULL) {
        shoal_ledger_record_t *r = &recs[n];

        memset(r, 0, sizeof(*r));
        if (sscanf(line, "%63s %63s %15s %" SCNd64 " %lf %" SCNu64 " %" SCNu64 " %" SCNu64
                   " %lf %" SCNu64 " %" SCNu64, r->tenant, r->job, r->qos_class, &r->minute,
                   &r->gpu_seconds, &r->bytes_same_host, &r->bytes_cross_host, &r->ops,
                   &r->coll_seconds, &r->failed_platform, &r->failed_tenant) != 11) {
            fprintf(stderr, "ledger_fill: bad line: %s", line);
            return 2;
        }
        if (++n == FILL_BATCH) {
            if (shoal_ledger_commit(l, recs, n, NULL, 0) != SHOAL_OK)
                return 1;
            total += n;
            n = 0;
        }
    }
    if (n > 0 && shoal_ledger_commit(l, recs, n, NULL, 0) != SHOAL_OK)
        return 1;
    total += n;
    shoal_ledger_close(l);
    printf("%zu\n", total);
    return 0;
}
