/*
 * shm_ll_bench: what the LL protocol's prefetch for writing (src/coll/shmdirect.c,
 * SHOAL_SHM_PREFETCHW) changes on one communicator, both sides in one process.
 *
 * For each size, alternating batches of the same intra-node AllReduce run with the
 * communicator's prefetch on and off (the field SHOAL_SHM_PREFETCHW sets at init; the order of
 * each pair alternates too), so that where the communicator's shared areas lie, drift and load
 * fall on both. A second communicator, one made with the other setting, would differ by where
 * its areas lie: up to 30% at 8 B on 2 ranks here (perf/results/overhead-2026-12-05.txt),
 * more than the effect. Every batch's last result is checked (the prefetch is a hint: it must
 * change no value).
 *
 *   shoalrun -n 2 build/shm_ll_bench [-b BYTES[,BYTES...]] [-n CALLS] [-k PAIRS] [-w WARMUP]
 *   default sizes 8,64,112,168,512,4096 (float32 sum; LL needs SHOAL_SHM_LL_MAX >= the size,
 *   which the tool raises to 4k for its communicator)
 * Rank 0 prints per size: "size B on_ns OFF_ns diff_ns ratio" (medians of the pairs; diff: the
 * median per-pair difference on - off; ratio: (off + diff) / off), and "prefetchw 0|1" (whether
 * the CPU has the instruction: without it both sides are the same).
 */
#include "coll/coll.h"
#include "perf/bench_stats.h"

#include "perf/perf_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ns per call of n calls; 0 on success, the first wrong element's index + 1 otherwise */
static size_t batch(shoal_comm_t comm, const float *in, float *out, size_t count, int n,
                    float want, double *ns)
{
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < n; i++) {
        if (shoal_allreduce(in, out, count, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL) != SHOAL_OK) {
            fprintf(stderr, "shm_ll_bench: shoal_allreduce failed: %s\n",
                    shoal_comm_last_error(comm));
            exit(1);
        }
    }
    *ns = (double)(bench_now_ns() - t0) / n;
    for (size_t e = 0; e < count; e++) {
        if (out[e] != want) {
            return e + 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *sizes = "8,64,112,168,512,4096";
    int calls = 2000, pairs = 41, warmup = 2000, opt, rank, nranks, bad;
    shoal_comm_t comm;
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    char *list, *tok, *save = NULL;

    while ((opt = getopt(argc, argv, "b:n:k:w:")) != -1) {
        switch (opt) {
        case 'b':
            sizes = optarg;
            break;
        case 'n':
            bad = perf_arg_int(optarg, 1, 1 << 30, &calls);
            break;
        case 'k':
            bad = perf_arg_int(optarg, 1, 1 << 30, &pairs);
            break;
        case 'w':
            bad = perf_arg_int(optarg, 0, 1 << 30, &warmup);
            break;
        default:
            bad = -1;
            break;
        }
        if (bad != 0) {
            fprintf(stderr, "usage: shm_ll_bench [-b BYTES[,BYTES...]] [-n CALLS] [-k PAIRS] "
                            "[-w WARMUP]\n");
            return 2;
        }
    }
    if (calls < 1 || pairs < 1 || warmup < 0) {
        fprintf(stderr, "shm_ll_bench: -n and -k must be positive, -w not negative\n");
        return 2;
    }
    setenv("SHOAL_SHM_LL_MAX", "4k", 1); /* every size of the list in LL lines */
    if (shoal_comm_init_env(&comm, &cfg) != SHOAL_OK) {
        fprintf(stderr, "shm_ll_bench: shoal_comm_init_env failed\n");
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &nranks);
    if (!comm->coll->shm_ok) {
        fprintf(stderr, "shm_ll_bench: the communicator has no intra-node path (its ranks must "
                        "share a host)\n");
        return 1;
    }
    if (rank == 0) {
        printf("ranks %d\nprefetchw %d\ncalls_per_batch %d\npairs %d\n", nranks,
               shoal_cpu_prefetchw(), calls, pairs);
        printf("# %8s %10s %10s %10s %8s\n", "bytes", "on_ns", "off_ns", "diff_ns", "ratio");
    }
    list = strdup(sizes);
    if (list == NULL) {
        fprintf(stderr, "shm_ll_bench: out of memory\n");
        return 1;
    }
    for (tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        size_t bytes = 0, count, bad = 0;
        float *in, *out;
        double *ton, *toff, *diff, ns;
        int prefetch = shoal_cpu_prefetchw();

        if (perf_arg_size(tok, &bytes) != 0 || (count = bytes / sizeof(float)) == 0 ||
            bytes > 4096 || bytes % sizeof(float) != 0) {
            fprintf(stderr, "shm_ll_bench: size '%s': a multiple of 4 from 4 to 4096 bytes\n",
                    tok);
            return 2;
        }
        in = malloc(count * sizeof(float));
        out = malloc(count * sizeof(float));
        ton = calloc((size_t)pairs, sizeof(double));
        toff = calloc((size_t)pairs, sizeof(double));
        diff = calloc((size_t)pairs, sizeof(double));
        if (in == NULL || out == NULL || ton == NULL || toff == NULL || diff == NULL) {
            fprintf(stderr, "shm_ll_bench: out of memory\n");
            return 1;
        }
        for (size_t e = 0; e < count; e++) {
            in[e] = (float)(rank + 1);
        }
        for (int side = 0; side < 2 && bad == 0; side++) {
            comm->coll->ll_prefetchw = side && prefetch;
            bad = batch(comm, in, out, count, warmup, (float)(nranks * (nranks + 1) / 2), &ns);
        }
        for (int k = 0; k < pairs && bad == 0; k++) {
            for (int s = 0; s < 2; s++) {
                int on = (k % 2 == 0) == (s == 0);
                comm->coll->ll_prefetchw = on && prefetch;
                bad = batch(comm, in, out, count, calls, (float)(nranks * (nranks + 1) / 2), &ns);
                *(on ? &ton[k] : &toff[k]) = ns;
            }
            diff[k] = ton[k] - toff[k];
        }
        if (bad != 0) {
            fprintf(stderr, "shm_ll_bench: rank %d: %zu B: element %zu is %g, not %d\n", rank,
                    bytes, bad - 1, (double)out[bad - 1], nranks * (nranks + 1) / 2);
            return 1;
        }
        if (rank == 0) {
            double on = bench_median(ton, pairs), off = bench_median(toff, pairs);
            double d = bench_median(diff, pairs);
            printf("size %zu %.1f %.1f %.1f %.4f\n", bytes, on, off, d, (off + d) / off);
        }
        free(in);
        free(out);
        free(ton);
        free(toff);
        free(diff);
    }
    free(list);
    shoal_comm_destroy(comm);
    return 0;
}
