/*
 * In place against out of place, with and without the input written before each call.
 *
 *   shoalrun -n 2 inplace_bench [-b SIZE] [-e SIZE] [-n ITERS] [-w WARMUP]
 *
 * allreduce_perf (like nccl-tests) calls the collective again and again on an input nobody
 * writes, so an out-of-place input stays in every core's cache, while an in-place buffer was
 * last written by the call before. A training step writes its gradients before each
 * AllReduce. Here every call is timed alone (barrier, then the call), in four modes per size:
 * out of place / in place, each with the input untouched or rewritten before the call (one
 * store per 64-byte line, outside the timed region, as a producer would). Rank 0 prints the
 * median and mean per call in microseconds, and in place / out of place for both patterns.
 * float sum; buffers page-aligned and faulted in before the first call.
 */
#include "perf/perf_args.h"

#include <shoal.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double ib_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int ib_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One mode: median and mean per call (rank 0's times). */
static int ib_mode(shoal_comm_t comm, float *s, float *r, size_t n, int inplace, int touch,
                   int iters, int warmup, double *t, double *med_p, double *mean_p)
{
    float *in = inplace ? r : s;
    double sum = 0;

    for (int i = 0; i < warmup + iters; i++) {
        double t0;
        shoal_status_t st;
        if (touch) {
            for (size_t j = 0; j < n; j += 16) {
                in[j] = (float)(i & 7);
            }
        }
        if (shoal_barrier(comm, NULL) != SHOAL_OK) {
            return -1;
        }
        t0 = ib_now_us();
        st = shoal_allreduce(in, r, n, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL);
        if (st != SHOAL_OK) {
            fprintf(stderr, "inplace_bench: shoal_allreduce: %s\n", shoal_comm_last_error(comm));
            return -1;
        }
        if (i >= warmup) {
            t[i - warmup] = ib_now_us() - t0;
            sum += t[i - warmup];
        }
    }
    qsort(t, (size_t)iters, sizeof(*t), ib_cmp);
    *med_p = t[iters / 2];
    *mean_p = sum / iters;
    return 0;
}

int main(int argc, char **argv)
{
    size_t lo = 64 << 10, hi = 1 << 20;
    int iters = 1000, warmup = 50, rank = 0, nranks = 0, rc = 0;
    shoal_comm_t comm;
    float *s, *r;
    double *t;

    for (int i = 1; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = v == NULL;
        if (bad) {
            /* an option without its value: it was ignored */
        } else if (strcmp(argv[i], "-b") == 0) {
            bad = perf_arg_size(v, &lo);
        } else if (strcmp(argv[i], "-e") == 0) {
            bad = perf_arg_size(v, &hi);
        } else if (strcmp(argv[i], "-n") == 0) {
            bad = perf_arg_int(v, 1, 1 << 30, &iters);
        } else if (strcmp(argv[i], "-w") == 0) {
            bad = perf_arg_int(v, 0, 1 << 30, &warmup);
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "usage: inplace_bench [-b SIZE] [-e SIZE] [-n ITERS] [-w WARMUP]\n");
            return 2;
        }
    }
    if (lo < 64 || hi < lo || iters < 1 || warmup < 0) {
        fprintf(stderr, "inplace_bench: bad sizes or counts\n");
        return 2;
    }
    if (shoal_comm_init_env(&comm, NULL) != SHOAL_OK) {
        fprintf(stderr, "inplace_bench: shoal_comm_init_env failed (run under shoalrun)\n");
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &nranks);
    s = aligned_alloc(4096, (hi + 4095) & ~(size_t)4095);
    r = aligned_alloc(4096, (hi + 4095) & ~(size_t)4095);
    t = malloc(sizeof(*t) * (size_t)iters);
    if (s == NULL || r == NULL || t == NULL) {
        fprintf(stderr, "inplace_bench: out of memory\n");
        return 1;
    }
    memset(s, 0, hi);
    memset(r, 0, hi);
    if (rank == 0) {
        printf("# inplace_bench: %d ranks, float sum, %d calls per mode (after %d), us per call"
               " (median / mean); ip/oop of the medians\n", nranks, iters, warmup);
        printf("# %10s  %17s  %17s  %17s  %17s  %7s  %7s\n", "bytes", "oop untouched",
               "ip untouched", "oop written", "ip written", "ip/oop", "ip/oop");
        printf("# %10s  %17s  %17s  %17s  %17s  %7s  %7s\n", "", "", "", "", "", "untouch",
               "written");
    }
    for (size_t bytes = lo; bytes <= hi && rc == 0; bytes *= 2) {
        double med[4], mean[4];
        for (int m = 0; m < 4 && rc == 0; m++) {
            rc = ib_mode(comm, s, r, bytes / 4, m & 1, m >> 1, iters, warmup, t, &med[m],
                         &mean[m]);
        }
        if (rc == 0 && rank == 0) {
            printf("  %10zu  %8.2f/%8.2f  %8.2f/%8.2f  %8.2f/%8.2f  %8.2f/%8.2f  %7.3f  %7.3f\n",
                   bytes, med[0], mean[0], med[1], mean[1], med[2], mean[2], med[3], mean[3],
                   med[1] / med[0], med[3] / med[2]);
        }
    }
    free(t);
    free(r);
    free(s);
    shoal_comm_destroy(comm);
    return rc == 0 ? 0 : 1;
}
