/*
 * meter_bench: what metering (src/meter) costs one collective call, measured in one process.
 *
 * Two communicators split from the same parent, identical but for the meter (the second is
 * created with the module's switch SHOAL_METER turned off), run alternating batches of the
 * same collective (the order of each pair alternates too, so drift and warm-up fall on both).
 * With -d qos the two differ in the QoS pacer instead (src/qos/pace.h): the first is created
 * with a rate cap too high to ever hold a call back (SHOAL_QOS_RATE_MAX, -r, default 1000g:
 * the pacer's take on every send, never a wait), the second with none (one branch per send):
 * issue 12's overhead of QoS for a tenant alone, in one process (perf/qos_bench.sh --mode
 * overhead).
 * Per batch: the mean ns per call (CLOCK_MONOTONIC around the batch). Rank 0 prints the
 * medians and minima of both, the ratios, and the median of the per-pair differences (the
 * metering's cost per call: the most robust figure on a loaded machine).
 *
 * It also times, on rank 0 alone, the pieces the meter adds to a call on this machine: one
 * read of the call path's clock (shoal_ticks: the TSC where it is invariant), one
 * clock_gettime, and the hooks of src/meter/meter.h around an empty call on the real page,
 * with both clock reads and with the entry read given (in a process without the CUDA driver
 * the entry read is shared with the CUDA layer's check, src/coll/api.c). A design that
 * measures each call's time cannot go below two clock reads per call.
 *
 *   shoalrun -n 2 build/meter_bench [-b BYTES] [-n CALLS] [-k PAIRS] [-w WARMUP] [-c COLL]
 *                                   [-o on|off] [-d meter|qos] [-r RATE] [-S]
 *   COLL: allreduce (default) | broadcast | barrier
 *   -S: split the unmetered (unpaced) communicator first (the default splits the other first):
 *       the two orders bracket what favours one split over the other (measured here: up to
 *       30 ns at 8 B either way, more than the cost itself); perf/qos_bench.sh runs both.
 *   -o: only CALLS calls on the metered (on) or the unmetered (off) communicator, after the
 *       warm-up, nothing timed: for an instruction count under valgrind --tool=callgrind
 *       --toggle-collect=shoal_allreduce (two values of CALLS, the difference per call).
 * Output: "key value" lines (perf/meter_overhead.sh reads them).
 */
#include "core/core.h"
#include "meter/meter.h"
#include "qos/pace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) {
        m = v[i] < m ? v[i] : m;
    }
    return m;
}

typedef enum { COLL_ALLREDUCE, COLL_BROADCAST, COLL_BARRIER } coll_t;

static int one_call(shoal_comm_t comm, coll_t coll, const void *in, void *out, size_t count)
{
    shoal_status_t st;
    switch (coll) {
    case COLL_BROADCAST:
        st = shoal_broadcast(in, out, count, SHOAL_UINT8, 0, comm, NULL);
        break;
    case COLL_BARRIER:
        st = shoal_barrier(comm, NULL);
        break;
    default:
        st = shoal_allreduce(in, out, count, SHOAL_UINT8, SHOAL_SUM, comm, NULL);
        break;
    }
    if (st != SHOAL_OK) {
        fprintf(stderr, "meter_bench: a collective failed: %s\n", shoal_strerror(st));
        return -1;
    }
    return 0;
}

/* ns per call of one batch of n calls. */
static double batch(shoal_comm_t comm, coll_t coll, const void *in, void *out, size_t count,
                    int n)
{
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
        if (one_call(comm, coll, in, out, count) != 0) {
            exit(1);
        }
    }
    return (double)(now_ns() - t0) / n;
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Median ns per iteration of 31 runs of 1M iterations of body, in this thread's CPU time (a
 * loaded machine's preemptions do not count). */
#define TIME_LOOP(result, body)                                                              \
    do {                                                                                     \
        double v_[31];                                                                       \
        for (int r_ = 0; r_ < 31; r_++) {                                                    \
            uint64_t t0_ = cpu_ns();                                                         \
            for (int i_ = 0; i_ < 1000000; i_++) {                                           \
                body;                                                                        \
            }                                                                                \
            v_[r_] = (double)(cpu_ns() - t0_) / 1e6;                                         \
        }                                                                                    \
        (result) = median(v_, 31);                                                           \
    } while (0)

typedef struct {
    double ticks;    /* one read of the call path's clock (shoal_ticks: rdtsc) */
    double mono;     /* one clock_gettime(CLOCK_MONOTONIC) */
    double hooks;    /* the meter's hooks around an empty call, both clock reads */
    double marginal; /* the same with the entry read given (what a call pays for the meter when
                      * the entry read is shared with the CUDA layer's check) */
} pieces_t;

static void pieces(struct shoal_meter *m, pieces_t *p)
{
    uint64_t sink = 0, t0 = shoal_ticks();
    TIME_LOOP(p->ticks, sink += shoal_ticks());
    TIME_LOOP(p->mono, sink += now_ns());
    TIME_LOOP(p->hooks, {
        uint64_t e_ = shoal_ticks();
        shoal_meter_call_enter(m);
        __asm__ volatile("" : : : "memory");
        shoal_meter_call_end(m, SHOAL_METER_ALLREDUCE, SHOAL_OK, e_);
    });
    TIME_LOOP(p->marginal, {
        shoal_meter_call_enter(m);
        __asm__ volatile("" : : : "memory");
        shoal_meter_call_end(m, SHOAL_METER_ALLREDUCE, SHOAL_OK, t0);
    });
    __asm__ volatile("" : : "r"(sink));
}

int main(int argc, char **argv)
{
    size_t bytes = 8;
    int calls = 2000, pairs = 101, warmup = 2000, opt, rank, only = -1, qos = 0, swap = 0;
    size_t rate = (size_t)1000 << 30;
    coll_t coll = COLL_ALLREDUCE;
    shoal_comm_t parent, on, off;
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    double *ton, *toff, *diff;
    char *in, *out;

    while ((opt = getopt(argc, argv, "b:n:k:w:c:o:d:r:S")) != -1) {
        switch (opt) {
        case 'S':
            swap = 1;
            break;
        case 'd':
            qos = strcmp(optarg, "qos") == 0;
            break;
        case 'r': {
            char *end;
            rate = strtoull(optarg, &end, 0);
            rate <<= *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20
                     : *end == 'G' || *end == 'g' ? 30 : 0;
            break;
        }
        case 'o':
            only = strcmp(optarg, "on") == 0;
            break;
        case 'b': {
            char *end;
            bytes = strtoull(optarg, &end, 0);
            bytes <<= *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20
                      : *end == 'G' || *end == 'g' ? 30 : 0;
            break;
        }
        case 'n':
            calls = atoi(optarg);
            break;
        case 'k':
            pairs = atoi(optarg);
            break;
        case 'w':
            warmup = atoi(optarg);
            break;
        case 'c':
            coll = strcmp(optarg, "broadcast") == 0 ? COLL_BROADCAST
                   : strcmp(optarg, "barrier") == 0 ? COLL_BARRIER
                                                    : COLL_ALLREDUCE;
            break;
        default:
            fprintf(stderr, "usage: meter_bench [-b BYTES] [-n CALLS] [-k PAIRS] [-w WARMUP] "
                            "[-c allreduce|broadcast|barrier] [-o on|off] [-d meter|qos] "
                            "[-r RATE] [-S]\n");
            return 2;
        }
    }
    if (calls < 1 || pairs < 1 || rate == 0) {
        fprintf(stderr, "meter_bench: -n, -k and -r must be positive\n");
        return 2;
    }
    in = calloc(1, bytes ? bytes : 1);
    out = calloc(1, bytes ? bytes : 1);
    ton = calloc((size_t)pairs, sizeof(double));
    toff = calloc((size_t)pairs, sizeof(double));
    diff = calloc((size_t)pairs, sizeof(double));
    if (in == NULL || out == NULL || ton == NULL || toff == NULL || diff == NULL) {
        fprintf(stderr, "meter_bench: out of memory\n");
        return 1;
    }
    if (shoal_comm_init_env(&parent, &cfg) != SHOAL_OK) {
        fprintf(stderr, "meter_bench: shoal_comm_init_env failed\n");
        return 1;
    }
    shoal_comm_rank(parent, &rank);
    /* Same split, same channels and areas: only the meter (or the pacer) differs. -S splits
     * the unmetered (unpaced) one first: whatever favours the first or the second split
     * (placement of its areas) falls on the other side, so that the two orders bracket it. */
    if (qos) {
        const char *rp = shoal_qos_pace_config.rates;
        if (shoal_qos_pace_config.rate_max != 0 || (rp != NULL && strcmp(rp, "none") != 0)) {
            fprintf(stderr, "meter_bench: -d qos compares with no pacer: unset "
                            "SHOAL_QOS_RATE_MAX and SHOAL_QOS_RATES\n");
            return 1;
        }
    }
    for (int k = 0; k < 2; k++) {
        int want_on = swap ? k == 1 : k == 0;
        shoal_qos_pace_config.rate_max = qos && want_on ? rate : 0;
        shoal_meter_config.enabled = qos || want_on;
        if (shoal_comm_split(parent, 0, rank, want_on ? &on : &off) != SHOAL_OK) {
            fprintf(stderr, "meter_bench: split failed\n");
            return 1;
        }
    }
    shoal_qos_pace_config.rate_max = 0;
    shoal_meter_config.enabled = 1;
    if (!qos && (on->meter == NULL || off->meter != NULL)) {
        fprintf(stderr, "meter_bench: SHOAL_METER must be on (the default) to compare\n");
        return 1;
    }
    if (qos && (on->pace == NULL || off->pace != NULL)) {
        fprintf(stderr, "meter_bench: the paced communicator has no pacer\n");
        return 1;
    }
    batch(on, coll, in, out, bytes, warmup);
    batch(off, coll, in, out, bytes, warmup);
    if (only >= 0) {
        batch(only ? on : off, coll, in, out, bytes, calls);
        pairs = 0;
    }
    for (int k = 0; k < pairs; k++) {
        if (k % 2 == 0) {
            ton[k] = batch(on, coll, in, out, bytes, calls);
            toff[k] = batch(off, coll, in, out, bytes, calls);
        } else {
            toff[k] = batch(off, coll, in, out, bytes, calls);
            ton[k] = batch(on, coll, in, out, bytes, calls);
        }
        diff[k] = ton[k] - toff[k];
    }
    if (rank == 0 && pairs > 0) {
        int nranks;
        double mon, moff, mnon, mnoff, md;
        pieces_t pc;
        shoal_comm_size(parent, &nranks);
        mnon = minimum(ton, pairs);
        mnoff = minimum(toff, pairs);
        mon = median(ton, pairs);
        moff = median(toff, pairs);
        md = median(diff, pairs);
        printf("ranks %d\nbytes %zu\ncalls_per_batch %d\npairs %d\ndiffers %s\nsplit_first %s\n",
               nranks, bytes, calls, pairs, qos ? "qos" : "meter", swap ? "off" : "on");
        printf("on_median_ns %.2f\noff_median_ns %.2f\nratio_median %.4f\n", mon, moff,
               mon / moff);
        printf("on_min_ns %.2f\noff_min_ns %.2f\nratio_min %.4f\n", mnon, mnoff, mnon / mnoff);
        printf("diff_median_ns %.2f\nratio_diff %.4f\n", md, (moff + md) / moff);
        if (!qos) {
            pieces(on->meter, &pc);
            printf("clock %s\nclock_ghz %.3f\nclock_read_ns %.2f\nclock_gettime_ns %.2f\n"
                   "hooks_ns %.2f\nhooks_marginal_ns %.2f\n",
                   shoal_tick_clock.tsc ? "tsc" : "clock_monotonic",
                   (double)shoal_tick_clock.ticks_per_sec / 1e9, pc.ticks, pc.mono, pc.hooks,
                   pc.marginal);
        } else {
            printf("paced_ns %llu\n", (unsigned long long)shoal_qos_pace_held_ns(on->pace));
        }
    }
    shoal_comm_destroy(off);
    shoal_comm_destroy(on);
    shoal_comm_destroy(parent);
    free(in);
    free(out);
    free(ton);
    free(toff);
    free(diff);
    return 0;
}
