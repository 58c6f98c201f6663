/*
 * tune_rank: one rank of the settings-agreement test (tests/tune/test_tune_agree.sh).
 *
 * Rank 1 is given another machine profile (TUNE_TEST_RANK1_MACHINE becomes its
 * SHOAL_TUNE_MACHINE) and optionally an explicit setting of its own (TUNE_TEST_RANK1_ENV,
 * "NAME=VALUE"), so that deciding locally would give it other sizes and limits than rank 0.
 * Every rank reports what its communicator uses; rank 0 checks that all ranks hold rank 0's
 * values and sources, that rank 1's own resolution really differs, that the algorithm state
 * uses those values, and that AllReduce around each limit is right. The transport sizes
 * (shm ring, tcp split, ucx inline) are each rank's own, taken from the lowest local rank in
 * round 0: on one host, rank 0's; rank 1's own shm ring would differ (the communicator
 * would not connect if it used them). Rank 0 prints TAP.
 */
#include "coll/coll.h"

#include <shoal.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K SHOAL_TUNE_NKNOBS
#define ROW (3 * K + 3)

/* AllReduce SUM of float32 (rank + 1) * (i % 7 + 1) at count elements; 0 if right. */
static int tune_check_allreduce(shoal_comm_t comm, int n, size_t count)
{
    float *buf = malloc((count + 1) * sizeof(float));
    int bad = 0;
    int rank;

    if (buf == NULL) {
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    for (size_t i = 0; i < count; i++) {
        buf[i] = (float)((rank + 1) * (int)(i % 7 + 1));
    }
    if (shoal_allreduce(buf, buf, count, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL) != SHOAL_OK) {
        bad = 1;
    }
    for (size_t i = 0; i < count && !bad; i++) {
        bad = buf[i] != (float)(n * (n + 1) / 2 * (int)(i % 7 + 1));
    }
    free(buf);
    return bad;
}

int main(void)
{
    const char *r = getenv("SHOAL_RANK"), *pert = getenv("TUNE_TEST_RANK1_MACHINE");
    const char *env1 = getenv("TUNE_TEST_RANK1_ENV");
    uint64_t row[ROW], *all;
    shoal_comm_t comm;
    struct shoal_comm *c;
    shoal_tune_t mine;
    int rank, n, bad = 0;

    if (r != NULL && atoi(r) == 1) {
        if (pert != NULL) {
            setenv("SHOAL_TUNE_MACHINE", pert, 1);
        }
        if (env1 != NULL && strchr(env1, '=') != NULL) {
            char name[64];
            snprintf(name, sizeof(name), "%.*s", (int)(strchr(env1, '=') - env1), env1);
            setenv(name, strchr(env1, '=') + 1, 1);
        }
    }
    if (shoal_comm_init_env(&comm, NULL) != SHOAL_OK) {
        printf("not ok 1 - shoal_comm_init_env\n1..1\n");
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &n);
    c = comm;
    shoal_tune_resolve_local(shoal_topo_config.topo_discovery, &mine);
    for (int k = 0; k < K; k++) {
        row[k] = c->coll->tune.value[k];
        row[K + k] = c->coll->tune.src[k];
        row[2 * K + k] = mine.value[k];
    }
    /* the algorithm state uses the agreed values */
    row[3 * K] = c->coll->chunk == SHOAL_MAX(SHOAL_ALIGN_UP(row[SHOAL_TUNE_CHUNK], 64), 4096) &&
                 c->coll->shape.chunk == c->coll->chunk &&
                 (!c->coll->shm_ok || c->coll->window <= row[SHOAL_TUNE_SHM_WINDOW]) &&
                 (c->coll->shape.shm_oneshot_max == row[SHOAL_TUNE_SHM_ONESHOT_OWN] ||
                  c->coll->shape.shm_oneshot_max == row[SHOAL_TUNE_SHM_ONESHOT_SHARED]);
    {
        size_t ll = row[SHOAL_TUNE_SHM_LL_MAX] / 4, one = c->coll->shape.shm_oneshot_max / 4;
        size_t win = c->coll->shm_ok ? c->coll->window / 4 : c->coll->chunk / 4;
        size_t counts[] = {1, ll, ll + 1, one, one + 3, win + 5, 3 * win + 7};
        int b = 0;
        for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
            b |= tune_check_allreduce(comm, n, counts[i] > 0 ? counts[i] : 1);
        }
        row[3 * K + 1] = (uint64_t)b;
    }
    {
        shoal_tl_sizes_t z;
        shoal_tune_tl_sizes_of(&c->coll->tune, &z);
        row[3 * K + 2] = c->all_local && memcmp(&z, &c->tl_sizes, sizeof(z)) == 0;
    }
    all = calloc((size_t)n, sizeof(row));
    if (all == NULL ||
        shoal_allgather(row, all, ROW, SHOAL_UINT64, comm, NULL) != SHOAL_OK) {
        printf("not ok 1 - allgather of the reports\n1..1\n");
        return 1;
    }
    if (rank == 0) {
        int same = 1, differs = 0, used = 1, ar = 0, tl = 1;
        for (int q = 0; q < n; q++) {
            const uint64_t *o = all + (size_t)q * ROW;
            for (int k = 0; k < 2 * K; k++) {
                if (o[k] != all[k]) {
                    same = 0;
                    fprintf(stderr, "# rank %d: %s %s %llu, rank 0 %llu\n", q,
                            shoal_tune_knob_names[k % K], k < K ? "value" : "source",
                            (unsigned long long)o[k], (unsigned long long)all[k]);
                }
            }
            used &= o[3 * K] == 1;
            ar |= o[3 * K + 1] != 0;
            tl &= o[3 * K + 2] == 1;
        }
        for (int k = 0; n > 1 && k < K; k++) {
            differs |= all[ROW + 2 * K + k] != all[k];
        }
        printf("%s 1 - every rank holds rank 0's settings and sources (%d ranks)\n",
               same ? "ok" : "not ok", n);
        printf("%s 2 - rank 1's own resolution differs from them (the test perturbs it)\n",
               differs ? "ok" : "not ok");
        printf("%s 3 - chunk, window and one-shot limit of every rank come from them\n",
               used ? "ok" : "not ok");
        printf("%s 4 - allreduce around each limit is right\n", ar ? "not ok" : "ok");
        printf("%s 5 - every rank's transports got local rank 0's sizes\n", tl ? "ok" : "not ok");
        for (int k = 0; k < K; k++) {
            printf("# %s = %llu (%s; rank 1 alone: %llu)\n", shoal_tune_knob_names[k],
                   (unsigned long long)all[k], shoal_tune_src_name((int)all[K + k]),
                   (unsigned long long)(n > 1 ? all[ROW + 2 * K + k] : 0));
        }
        printf("1..5\n");
        bad = !(same && differs && used && !ar && tl);
    }
    free(all);
    shoal_comm_destroy(comm);
    return bad;
}
