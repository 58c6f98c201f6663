/*
 * select_bench: the automatic algorithm choice against every forced one, interleaved in one
 * process. One communicator per algorithm (auto first, then each name given), all over the
 * same ranks; per size and repetition every communicator runs its timed loop in turn, so
 * that machine drift hits all of them alike. Prints per size and algorithm the median over
 * the repetitions of the slowest rank's time per call (us):
 *     <coll> <bytes> <algo> <median_us>
 * Run it under shoalrun with SHOAL_DEBUG=INFO SHOAL_DEBUG_SUBSYS=COLL to see what each
 * communicator chose (perf/select_check.sh does, and compares).
 *
 * usage: select_bench [-c allreduce|broadcast|allgather|reduce_scatter] [-b MIN] [-e MAX]
 *                     [-f FACTOR] [-r REPS] [-t TARGET_US] ALGO...
 * bytes is the whole message for allreduce and broadcast, the gathered / scattered total
 * for allgather and reduce_scatter (as the *_perf tools' size column).
 */
#include "perf/perf_args.h"

#include <shoal.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SB_MAX_ALGOS 12

typedef struct {
    const char *coll;
    size_t minb, maxb;
    int factor, reps;
    double target_us;
    int nalgo;
    const char *algo[SB_MAX_ALGOS];
} sb_opts_t;

static double sb_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int sb_call(const sb_opts_t *o, shoal_comm_t c, int n, size_t bytes, void *sb, void *rb)
{
    size_t cnt = bytes / 4;
    shoal_status_t st;
    if (strcmp(o->coll, "broadcast") == 0) {
        st = shoal_broadcast(sb, rb, cnt, SHOAL_FLOAT32, 0, c, NULL);
    } else if (strcmp(o->coll, "allgather") == 0) {
        st = shoal_allgather(sb, rb, cnt / (size_t)n, SHOAL_FLOAT32, c, NULL);
    } else if (strcmp(o->coll, "reduce_scatter") == 0) {
        st = shoal_reduce_scatter(sb, rb, cnt / (size_t)n, SHOAL_FLOAT32, SHOAL_SUM, c, NULL);
    } else {
        st = shoal_allreduce(sb, rb, cnt, SHOAL_FLOAT32, SHOAL_SUM, c, NULL);
    }
    if (st != SHOAL_OK) {
        fprintf(stderr, "select_bench: %s of %zu bytes: %s\n", o->coll, bytes,
                shoal_status_name(st));
        return -1;
    }
    return 0;
}

static int sb_parse(int argc, char **argv, sb_opts_t *o)
{
    int opt;
    *o = (sb_opts_t){.coll = "allreduce", .minb = 8, .maxb = 64u << 20, .factor = 4,
                     .reps = 5, .target_us = 20000, .algo = {"auto"}, .nalgo = 1};
    while ((opt = getopt(argc, argv, "c:b:e:f:r:t:h")) != -1) {
        switch (opt) {
        case 'c': o->coll = optarg; break;
        case 'b': if (perf_arg_size(optarg, &o->minb) != 0) o->minb = 0; break;
        case 'e': if (perf_arg_size(optarg, &o->maxb) != 0) o->maxb = 0; break;
        case 'f': if (perf_arg_int(optarg, 2, 1 << 20, &o->factor) != 0) o->factor = 0; break;
        case 'r': if (perf_arg_int(optarg, 1, 1 << 20, &o->reps) != 0) o->reps = 0; break;
        case 't': o->target_us = atof(optarg); break;
        default:
            fprintf(stderr, "usage: select_bench [-c COLL] [-b MIN] [-e MAX] [-f FACTOR] "
                            "[-r REPS] [-t TARGET_US] ALGO...\n");
            return -1;
        }
    }
    for (; optind < argc && o->nalgo < SB_MAX_ALGOS; optind++) {
        o->algo[o->nalgo++] = argv[optind];
    }
    if (o->factor < 2 || o->reps < 1 || o->minb < 4 || o->maxb < o->minb) {
        fprintf(stderr, "select_bench: sizes from 4 bytes up (-b <= -e), a factor of at least 2 "
                        "and at least one repetition\n");
        return -1;
    }
    return 0;
}

/* One communicator per algorithm over the ranks of world (uid from world's rank 0). */
static int sb_comms(shoal_comm_t world, int n, int rank, const sb_opts_t *o, shoal_comm_t *c)
{
    for (int a = 0; a < o->nalgo; a++) {
        shoal_uid_t uid;
        shoal_config_t cfg = SHOAL_CONFIG_INIT;
        memset(&uid, 0, sizeof(uid));
        if (rank == 0 && shoal_get_unique_id(&uid) != SHOAL_OK) {
            return -1;
        }
        if (shoal_broadcast(&uid, &uid, sizeof(uid), SHOAL_UINT8, 0, world, NULL) != SHOAL_OK) {
            return -1;
        }
        cfg.algorithm = strcmp(o->algo[a], "auto") == 0 ? NULL : o->algo[a];
        if (shoal_comm_init(&c[a], n, rank, &uid, &cfg) != SHOAL_OK) {
            fprintf(stderr, "select_bench: cannot create the '%s' communicator\n", o->algo[a]);
            return -1;
        }
    }
    return 0;
}

static int sb_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Slowest rank's us per call of iters calls, after a barrier. */
static int sb_time(const sb_opts_t *o, shoal_comm_t world, shoal_comm_t c, int n, size_t bytes,
                   int iters, void *sb, void *rb, double *us)
{
    double t0, t;
    if (sb_call(o, c, n, bytes, sb, rb) != 0 || shoal_barrier(c, NULL) != SHOAL_OK) {
        return -1;
    }
    t0 = sb_now_us();
    for (int i = 0; i < iters; i++) {
        if (sb_call(o, c, n, bytes, sb, rb) != 0) {
            return -1;
        }
    }
    t = (sb_now_us() - t0) / iters;
    if (shoal_allreduce(&t, us, 1, SHOAL_FLOAT64, SHOAL_MAX, world, NULL) != SHOAL_OK) {
        return -1;
    }
    return 0;
}

static int sb_size_run(const sb_opts_t *o, shoal_comm_t world, shoal_comm_t *c, int n,
                       int rank, size_t bytes, void *sb, void *rb)
{
    double t[SB_MAX_ALGOS][64], probe;
    int iters, reps = o->reps < 64 ? o->reps : 64;

    /* Iterations: about target_us per timed loop, from one probe call of auto. */
    if (sb_time(o, world, c[0], n, bytes, 1, sb, rb, &probe) != 0) {
        return -1;
    }
    iters = (int)(o->target_us / (probe > 0.1 ? probe : 0.1));
    iters = iters < 2 ? 2 : iters > 2000 ? 2000 : iters;
    for (int r = 0; r < reps; r++) {
        for (int a = 0; a < o->nalgo; a++) {
            if (sb_time(o, world, c[a], n, bytes, iters, sb, rb, &t[a][r]) != 0) {
                return -1;
            }
        }
    }
    for (int a = 0; rank == 0 && a < o->nalgo; a++) {
        qsort(t[a], (size_t)reps, sizeof(double), sb_cmp);
        printf("%s %zu %s %.2f\n", o->coll, bytes, o->algo[a],
               reps % 2 ? t[a][reps / 2] : (t[a][reps / 2 - 1] + t[a][reps / 2]) / 2);
    }
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    sb_opts_t o;
    shoal_comm_t world, c[SB_MAX_ALGOS];
    int n, rank, rc = 0;
    void *sb, *rb;

    if (sb_parse(argc, argv, &o) != 0) {
        return 2;
    }
    if (shoal_comm_init_env(&world, NULL) != SHOAL_OK) {
        fprintf(stderr, "select_bench: shoal_comm_init_env failed (run under shoalrun)\n");
        return 1;
    }
    shoal_comm_rank(world, &rank);
    shoal_comm_size(world, &n);
    sb = aligned_alloc(4096, (o.maxb + 4095) / 4096 * 4096);
    rb = aligned_alloc(4096, (o.maxb + 4095) / 4096 * 4096);
    if (sb == NULL || rb == NULL || sb_comms(world, n, rank, &o, c) != 0) {
        return 1;
    }
    memset(sb, 0, o.maxb); /* fault the pages in once */
    memset(rb, 0, o.maxb);
    for (size_t b = o.minb; b <= o.maxb && rc == 0; b *= (size_t)o.factor) {
        if (b / 4 / (size_t)n == 0 && strcmp(o.coll, "allreduce") != 0 &&
            strcmp(o.coll, "broadcast") != 0) {
            continue;
        }
        rc = sb_size_run(&o, world, c, n, rank, b, sb, rb);
    }
    for (int a = 0; a < o.nalgo; a++) {
        shoal_comm_destroy(c[a]);
    }
    shoal_comm_destroy(world);
    free(sb);
    free(rb);
    return rc == 0 ? 0 : 1;
}
