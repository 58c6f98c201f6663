/*
 * nbc_overlap: do nonblocking collectives on different communicators overlap? Three ranks;
 * communicator A holds ranks 0 and 1, B ranks 0 and 2, so rank 0 is in both and each
 * communicator's traffic crosses its own link (perf/nbc_overlap.sh puts the ranks on network
 * namespaces whose links to ranks 1 and 2 are the slow ones). Rank 0 times, per repetition:
 *   one:  an iallreduce of SIZE bytes on A, waited for; then the same on B;
 *   two:  one on A and one on B in flight at once, both waited for;
 *   same: two on A in flight at once (one link: about twice "one", for reference).
 * and prints the medians and the ratio two / one (1.0: full overlap, 2.0: one after the
 * other). Environment as for any shoal rank (shoalrun, or SHOAL_UID/RANK/NRANKS).
 *
 *   nbc_overlap [-b BYTES[K|M|G]] [-n REPS]
 */
#include "perf/perf_args.h"

#include <shoal.h>

#include "perf/bench_stats.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double nbc_now(void)
{
    return (double)bench_now_ns() * 1e-9;
}

#define NBC_CHECK(x)                                                                          \
    do {                                                                                      \
        shoal_status_t st_ = (x);                                                             \
        if (st_ != SHOAL_OK) {                                                                \
            fprintf(stderr, "nbc_overlap: %s: %s\n", #x, shoal_status_name(st_));              \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

int main(int argc, char **argv)
{
    size_t bytes = (size_t)8 << 20;
    int reps = 5, rank, n, opt;
    shoal_comm_t world, ca = NULL, cb = NULL;
    float *s[2], *r[2];
    double *one, *two, *same;

    while ((opt = getopt(argc, argv, "b:n:")) != -1) {
        if (opt == 'b' && perf_arg_size(optarg, &bytes) == 0 && bytes >= sizeof(float)) {
            continue;
        }
        /* at least one: the medians of none read before the arrays (-n 0 printed one) */
        if (opt == 'n' && perf_arg_int(optarg, 1, 1000000, &reps) == 0) {
            continue;
        }
        fprintf(stderr, "usage: nbc_overlap [-b BYTES[K|M|G], at least 4] [-n REPS, at least 1]\n");
        return 2;
    }
    NBC_CHECK(shoal_comm_init_env(&world, NULL));
    NBC_CHECK(shoal_comm_rank(world, &rank));
    NBC_CHECK(shoal_comm_size(world, &n));
    if (n != 3) {
        fprintf(stderr, "nbc_overlap: needs 3 ranks, got %d\n", n);
        return 2;
    }
    NBC_CHECK(shoal_comm_split(world, rank == 2 ? SHOAL_SPLIT_NOCOLOR : 0, rank, &ca));
    NBC_CHECK(shoal_comm_split(world, rank == 1 ? SHOAL_SPLIT_NOCOLOR : 0, rank, &cb));
    size_t count = bytes / sizeof(float);
    for (int i = 0; i < 2; i++) {
        s[i] = malloc(count * sizeof(float));
        r[i] = malloc(count * sizeof(float));
        if (s[i] == NULL || r[i] == NULL) {
            return 2;
        }
        for (size_t j = 0; j < count; j++) {
            s[i][j] = (float)(j % 17);
        }
        memset(r[i], 0, count * sizeof(float));
    }
    one = calloc((size_t)reps, sizeof(double));
    two = calloc((size_t)reps, sizeof(double));
    same = calloc((size_t)reps, sizeof(double));
    for (int it = -1; it < reps; it++) { /* -1: warm-up (connections, pages) */
        shoal_request_t q[2];
        shoal_comm_t mine = rank == 1 ? ca : cb; /* ranks 1, 2: their one communicator */
        double t0, t1, ta, tb;

        /* one: A alone, then B alone */
        NBC_CHECK(shoal_barrier(world, NULL));
        t0 = nbc_now();
        if (rank != 2) {
            NBC_CHECK(shoal_iallreduce(s[0], r[0], count, SHOAL_FLOAT32, SHOAL_SUM, ca, &q[0]));
            NBC_CHECK(shoal_wait(&q[0]));
        }
        ta = nbc_now() - t0;
        NBC_CHECK(shoal_barrier(world, NULL));
        t0 = nbc_now();
        if (rank != 1) {
            NBC_CHECK(shoal_iallreduce(s[1], r[1], count, SHOAL_FLOAT32, SHOAL_SUM, cb, &q[1]));
            NBC_CHECK(shoal_wait(&q[1]));
        }
        tb = nbc_now() - t0;
        /* two: both at once */
        NBC_CHECK(shoal_barrier(world, NULL));
        t0 = nbc_now();
        if (rank == 0) {
            NBC_CHECK(shoal_iallreduce(s[0], r[0], count, SHOAL_FLOAT32, SHOAL_SUM, ca, &q[0]));
            NBC_CHECK(shoal_iallreduce(s[1], r[1], count, SHOAL_FLOAT32, SHOAL_SUM, cb, &q[1]));
            NBC_CHECK(shoal_wait(&q[1]));
            NBC_CHECK(shoal_wait(&q[0]));
        } else {
            NBC_CHECK(shoal_iallreduce(s[0], r[0], count, SHOAL_FLOAT32, SHOAL_SUM, mine, &q[0]));
            NBC_CHECK(shoal_wait(&q[0]));
        }
        t1 = nbc_now() - t0;
        if (it >= 0) {
            one[it] = (ta + tb) / 2;
            two[it] = t1;
        }
        /* same: two on A (one link) */
        NBC_CHECK(shoal_barrier(world, NULL));
        t0 = nbc_now();
        if (rank != 2) {
            NBC_CHECK(shoal_iallreduce(s[0], r[0], count, SHOAL_FLOAT32, SHOAL_SUM, ca, &q[0]));
            NBC_CHECK(shoal_iallreduce(s[1], r[1], count, SHOAL_FLOAT32, SHOAL_SUM, ca, &q[1]));
            NBC_CHECK(shoal_wait(&q[0]));
            NBC_CHECK(shoal_wait(&q[1]));
        }
        if (it >= 0) {
            same[it] = nbc_now() - t0;
        }
        if (rank == 0 && it >= 0) {
            printf("# rep %d: one %.3f s (A %.3f, B %.3f), two on A and B %.3f s, two on A %.3f s\n",
                   it, one[it], ta, tb, two[it], same[it]);
        }
    }
    /* the results of the last round: 2 ranks x (j % 17) */
    for (size_t j = 0; j < count && rank != 2; j += 4097) {
        if (r[0][j] != (float)(2 * (j % 17))) {
            fprintf(stderr, "nbc_overlap: rank %d: element %zu is %g, expected %g\n", rank, j,
                    (double)r[0][j], (double)(2 * (j % 17)));
            return 1;
        }
    }
    if (rank == 0) {
        double m1 = bench_median(one, reps), m2 = bench_median(two, reps);
        double ms = bench_median(same, reps);
        printf("bytes %zu reps %d one %.3f s two %.3f s ratio %.2f same-comm %.3f s ratio %.2f\n",
               bytes, reps, m1, m2, m2 / m1, ms, ms / m1);
    }
    NBC_CHECK(shoal_barrier(world, NULL));
    shoal_comm_destroy(cb);
    shoal_comm_destroy(ca);
    shoal_comm_destroy(world);
    free(one);
    free(two);
    free(same);
    for (int i = 0; i < 2; i++) {
        free(s[i]);
        free(r[i]);
    }
    return 0;
}
