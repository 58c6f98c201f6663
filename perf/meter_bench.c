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
 * measures each call's time cannot go below two clock reads per call. In context: the same
 * after a wait like a peer's (a spin with pause whose exit is mispredicted), where a call's
 * end comes: the wait alone, with one clock read, with the meter's hooks (entry read given),
 * and with the hooks of page version 1 (a multiply per call, on a scratch page).
 * Per batch it also takes this thread's CPU time (cpu_* keys): in a 1-rank run, whose calls
 * never wait, the cost of the meter on the call path without the machine's preemptions.
 *
 *   shoalrun -n 2 build/meter_bench [-b BYTES] [-n CALLS] [-k PAIRS] [-w WARMUP] [-c COLL]
 *                                   [-o on|off] [-d meter|qos] [-r RATE] [-S | -T]
 *   COLL: allreduce (default) | broadcast | barrier
 *   -S: split the unmetered (unpaced) communicator first (the default splits the other first):
 *       the two orders bracket what favours one split over the other (measured here: up to
 *       80 ns at 8 B either way, more than the cost itself); -T has no such bias.
 *   -T: one communicator for both sides: the unmetered batches run with its page detached
 *       (the communicator's meter and its channels' counter pointers NULL, as a communicator
 *       made with SHOAL_METER=0 has them), the metered ones with it attached again; with -d
 *       qos the same with its pacer (NULL as without SHOAL_QOS_RATE_MAX). Both sides then use
 *       the same channels and shared areas, so that the placement of two communicators' areas
 *       (the bias -S brackets) is not in the ratio. The switch happens between batches, with
 *       no call in flight (this thread is the only caller and nothing runs on the proxy
 *       thread). The tool checks that a detached batch leaves the page's counters (the
 *       pacer's clock reads) as they were.
 *   -o: only CALLS calls on the metered (on) or the unmetered (off) communicator, after the
 *       warm-up, nothing timed: for an instruction count under valgrind --tool=callgrind
 *       --toggle-collect=shoal_allreduce (two values of CALLS, the difference per call).
 * Output: "key value" lines (perf/meter_overhead.sh reads them).
 */
#include "core/core.h"
#include "meter/meter.h"
#include "qos/pace.h"
#include "perf/bench_stats.h"

#include "perf/perf_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* -T: a communicator's meter (or, -d qos, its pacer), detached for the unmetered (unpaced)
 * batches and attached again. */
typedef struct {
    int active;              /* -T */
    int qos;                 /* the pacer, not the meter */
    struct shoal_meter *meter;
    uint64_t **sent, **recv; /* [nranks]: the channels' counter pointers */
    struct shoal_qos_pacer *pace;
} meter_attach_t;

static int meter_detach_init(shoal_comm_t comm, meter_attach_t *ma, int qos)
{
    ma->active = 1;
    ma->qos = qos;
    ma->pace = comm->pace;
    ma->meter = comm->meter;
    ma->sent = calloc((size_t)comm->nranks, sizeof(*ma->sent));
    ma->recv = calloc((size_t)comm->nranks, sizeof(*ma->recv));
    if (ma->sent == NULL || ma->recv == NULL) {
        return -1;
    }
    for (int q = 0; q < comm->nranks; q++) {
        ma->sent[q] = comm->chans[q].meter_sent;
        ma->recv[q] = comm->chans[q].meter_recv;
    }
    return 0;
}

static void meter_attach(shoal_comm_t comm, const meter_attach_t *ma, int on)
{
    if (ma->qos) {
        comm->pace = on ? ma->pace : NULL;
        return;
    }
    comm->meter = on ? ma->meter : NULL;
    for (int q = 0; q < comm->nranks; q++) {
        comm->chans[q].meter_sent = on ? ma->sent[q] : NULL;
        comm->chans[q].meter_recv = on ? ma->recv[q] : NULL;
    }
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

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ns per call of one batch of n calls (wall clock); *cpu: the same in this thread's CPU time
 * (time the thread was preempted does not count: on a loaded machine the robust figure of a
 * 1-rank run, whose calls never wait; a waiting rank's spinning counts as CPU time). */
static double batch(shoal_comm_t comm, coll_t coll, const void *in, void *out, size_t count,
                    int n, double *cpu)
{
    uint64_t t0 = bench_now_ns(), c0 = cpu_ns();
    for (int i = 0; i < n; i++) {
        if (one_call(comm, coll, in, out, count) != 0) {
            exit(1);
        }
    }
    if (cpu != NULL) {
        *cpu = (double)(cpu_ns() - c0) / n;
    }
    return (double)(bench_now_ns() - t0) / n;
}

/* A batch on one side: with -T, the meter (pacer) attached or detached first. */
static double side_batch(shoal_comm_t comm, const meter_attach_t *ma, int metered, coll_t coll,
                         const void *in, void *out, size_t count, int n, double *cpu)
{
    if (ma->active) {
        meter_attach(comm, ma, metered);
    }
    return batch(comm, coll, in, out, count, n, cpu);
}

/* Median ns per iteration of 31 runs of n iterations of body, in this thread's CPU time (a
 * loaded machine's preemptions do not count). */
#define TIME_LOOP_N(result, n, body)                                                         \
    do {                                                                                     \
        double v_[31];                                                                       \
        for (int r_ = 0; r_ < 31; r_++) {                                                    \
            uint64_t t0_ = cpu_ns();                                                         \
            for (int i_ = 0; i_ < (n); i_++) {                                               \
                body;                                                                        \
            }                                                                                \
            v_[r_] = (double)(cpu_ns() - t0_) / (n);                                         \
        }                                                                                    \
        (result) = bench_median(v_, 31);                                                     \
    } while (0)
#define TIME_LOOP(result, body) TIME_LOOP_N(result, 1000000, body)

typedef struct {
    double ticks;    /* one read of the call path's clock (shoal_ticks: rdtsc) */
    double mono;     /* one clock_gettime(CLOCK_MONOTONIC) */
    double hooks;    /* the meter's hooks around an empty call, both clock reads */
    double marginal; /* the same with the entry read given (what a call pays for the meter when
                      * the entry read is shared with the CUDA layer's check) */
    double mul;      /* the hooks of page version 1 (the time converted to ns per call: a
                      * 128-bit multiply), entry read given: what version 2 (ticks) saved */
    double wait;     /* in context: a wait like a peer's (a spin with pause of unpredictable
                      * length, so its exit is mispredicted as a real wait's is), then a short
                      * dependent path */
    double wait_clock; /* the same with one clock read after the wait */
    double wait_meter; /* the same with the meter's hooks (entry read given) after the wait */
    double wait_mul;   /* the same with the hooks of version 1 */
} pieces_t;

/* shoal_meter_call_end of page version 1 (the time converted to ns per call), timed by
 * pieces() on a scratch page beside today's (ticks, converted by readers). */
static inline void call_end_mul(struct shoal_meter *m, int type, shoal_status_t st, uint64_t t0)
{
    shoal_meter_page_t *p = m->page;
    uint64_t now = shoal_ticks();
    shoal_meter_add(&p->ops[type], 1);
    shoal_meter_add(&p->coll_ns, shoal_ticks_ns(now - t0));
    if (SHOAL_UNLIKELY(st != SHOAL_OK)) {
        __atomic_fetch_add(&p->errors, 1, __ATOMIC_RELAXED);
        if (shoal_meter_is_peer_failure(st)) {
            shoal_meter_add(&p->peer_failures, 1);
        }
    }
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELEASE);
    if (SHOAL_UNLIKELY(now >= m->next_check)) {
        m->next_check = now + shoal_tick_clock.ticks_per_sec;
    }
}

static void pieces(struct shoal_meter *m, pieces_t *p)
{
    uint64_t sink = 0, t0 = shoal_ticks(), x = 1;
    volatile uint64_t flag = 0;
    volatile shoal_status_t st = SHOAL_OK;
    static shoal_meter_page_t scratch;
    struct shoal_meter alt = {.page = &scratch, .next_check = UINT64_MAX};
    uint8_t trips[4096];

    for (int i = 0; i < 4096; i++) {
        trips[i] = (uint8_t)(1 + rand() % 8);
    }
    TIME_LOOP(p->ticks, sink += shoal_ticks());
    TIME_LOOP(p->mono, sink += bench_now_ns());
    TIME_LOOP(p->hooks, {
        uint64_t e_ = shoal_ticks();
        shoal_meter_call_enter(m);
        __asm__ volatile("" : : : "memory");
        shoal_meter_call_end(m, SHOAL_METER_ALLREDUCE, st, e_);
    });
    TIME_LOOP(p->marginal, {
        shoal_meter_call_enter(m);
        __asm__ volatile("" : : : "memory");
        shoal_meter_call_end(m, SHOAL_METER_ALLREDUCE, st, t0);
    });
    TIME_LOOP(p->mul, {
        shoal_meter_call_enter(&alt);
        __asm__ volatile("" : : : "memory");
        call_end_mul(&alt, SHOAL_METER_ALLREDUCE, st, t0);
    });
#define WAIT_PATH                                                                            \
    for (unsigned j_ = trips[(unsigned)i_ * 7u & 4095u]; j_ > 0; j_--) {                     \
        x += flag;                                                                           \
        shoal_cpu_relax();                                                                   \
    }                                                                                        \
    for (int k_ = 0; k_ < 8; k_++) {                                                         \
        x += x >> 3;                                                                         \
        x ^= (uint64_t)k_;                                                                   \
    }
    TIME_LOOP_N(p->wait, 200000, { WAIT_PATH });
    TIME_LOOP_N(p->wait_clock, 200000, {
        WAIT_PATH;
        sink += shoal_ticks();
    });
    TIME_LOOP_N(p->wait_meter, 200000, {
        WAIT_PATH;
        shoal_meter_call_enter(m);
        __asm__ volatile("" : : : "memory");
        shoal_meter_call_end(m, SHOAL_METER_ALLREDUCE, st, t0);
    });
    TIME_LOOP_N(p->wait_mul, 200000, {
        WAIT_PATH;
        shoal_meter_call_enter(&alt);
        __asm__ volatile("" : : : "memory");
        call_end_mul(&alt, SHOAL_METER_ALLREDUCE, st, t0);
    });
#undef WAIT_PATH
    __asm__ volatile("" : : "r"(sink), "r"(x));
}

int main(int argc, char **argv)
{
    size_t bytes = 8;
    int calls = 2000, pairs = 101, warmup = 2000, opt, rank, only = -1, qos = 0, swap = 0;
    int toggle = 0;
    meter_attach_t ma = {0};
    shoal_stats_t st0 = SHOAL_STATS_INIT, st1 = SHOAL_STATS_INIT;
    uint64_t want = 0, pace_reads0 = 0;
    size_t rate = (size_t)1000 << 30;
    coll_t coll = COLL_ALLREDUCE;
    shoal_comm_t parent, on, off;
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    double *ton, *toff, *diff, *con, *coff, *cdiff;
    char *in, *out;

    while ((opt = getopt(argc, argv, "b:n:k:w:c:o:d:r:ST")) != -1) {
        switch (opt) {
        case 'S':
            swap = 1;
            break;
        case 'T':
            toggle = 1;
            break;
        case 'd':
            qos = strcmp(optarg, "qos") == 0;
            break;
        case 'r':
            if (perf_arg_size(optarg, &rate) != 0) {
                fprintf(stderr, "meter_bench: -r %s: a rate in bytes/s expected\n", optarg);
                return 2;
            }
            break;
        case 'o':
            only = strcmp(optarg, "on") == 0;
            break;
        case 'b':
            if (perf_arg_size(optarg, &bytes) != 0) {
                fprintf(stderr, "meter_bench: -b %s: a size in bytes expected\n", optarg);
                return 2;
            }
            break;
        case 'n':
        case 'k':
        case 'w':
            if (perf_arg_int(optarg, opt == 'w' ? 0 : 1, 1 << 30,
                             opt == 'n' ? &calls : opt == 'k' ? &pairs : &warmup) != 0) {
                fprintf(stderr, "meter_bench: -%c %s: a count expected\n", opt, optarg);
                return 2;
            }
            break;
        case 'c':
            coll = strcmp(optarg, "broadcast") == 0 ? COLL_BROADCAST
                   : strcmp(optarg, "barrier") == 0 ? COLL_BARRIER
                                                    : COLL_ALLREDUCE;
            break;
        default:
            fprintf(stderr, "usage: meter_bench [-b BYTES] [-n CALLS] [-k PAIRS] [-w WARMUP] "
                            "[-c allreduce|broadcast|barrier] [-o on|off] [-d meter|qos] "
                            "[-r RATE] [-S | -T]\n");
            return 2;
        }
    }
    if (calls < 1 || pairs < 1 || rate == 0) {
        fprintf(stderr, "meter_bench: -n, -k and -r must be positive\n");
        return 2;
    }
    if (toggle && swap) {
        fprintf(stderr, "meter_bench: -T (one communicator) and -S (the order of two) exclude "
                        "each other\n");
        return 2;
    }
    in = calloc(1, bytes ? bytes : 1);
    out = calloc(1, bytes ? bytes : 1);
    ton = calloc((size_t)pairs, sizeof(double));
    toff = calloc((size_t)pairs, sizeof(double));
    diff = calloc((size_t)pairs, sizeof(double));
    con = calloc((size_t)pairs, sizeof(double));
    coff = calloc((size_t)pairs, sizeof(double));
    cdiff = calloc((size_t)pairs, sizeof(double));
    if (in == NULL || out == NULL || ton == NULL || toff == NULL || diff == NULL ||
        con == NULL || coff == NULL || cdiff == NULL) {
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
    for (int k = 0; k < (toggle ? 1 : 2); k++) { /* -T: the metered (paced) one only */
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
    if (toggle) {
        off = on;
    }
    if (!qos && (on->meter == NULL || (!toggle && off->meter != NULL))) {
        fprintf(stderr, "meter_bench: SHOAL_METER must be on (the default) to compare\n");
        return 1;
    }
    if (qos && (on->pace == NULL || (!toggle && off->pace != NULL))) {
        fprintf(stderr, "meter_bench: the paced communicator has no pacer\n");
        return 1;
    }
    if (toggle) { /* both sides on the metered (paced) communicator (see -T) */
        if (meter_detach_init(on, &ma, qos) != 0 || shoal_comm_stats(on, &st0) != SHOAL_OK) {
            fprintf(stderr, "meter_bench: -T: cannot set up (memory, or shoal_comm_stats)\n");
            return 1;
        }
        /* the metered calls: the warm-up's, then -o on's or a batch of each pair */
        want = (uint64_t)warmup + (only >= 0 ? (uint64_t)(only ? calls : 0)
                                               : (uint64_t)pairs * (uint64_t)calls);
        pace_reads0 = qos ? on->pace->clock_reads : 0;
    }
    side_batch(on, &ma, 1, coll, in, out, bytes, warmup, NULL);
    side_batch(off, &ma, 0, coll, in, out, bytes, warmup, NULL);
    if (only >= 0) {
        side_batch(only ? on : off, &ma, only, coll, in, out, bytes, calls, NULL);
        pairs = 0;
    }
    for (int k = 0; k < pairs; k++) {
        if (k % 2 == 0) {
            ton[k] = side_batch(on, &ma, 1, coll, in, out, bytes, calls, &con[k]);
            toff[k] = side_batch(off, &ma, 0, coll, in, out, bytes, calls, &coff[k]);
        } else {
            toff[k] = side_batch(off, &ma, 0, coll, in, out, bytes, calls, &coff[k]);
            ton[k] = side_batch(on, &ma, 1, coll, in, out, bytes, calls, &con[k]);
        }
        diff[k] = ton[k] - toff[k];
        cdiff[k] = con[k] - coff[k];
    }
    if (toggle && qos) {
        /* The paced batches used the pacer (its fast path reads the clock every
         * SHOAL_QOS_PACE_FAST takes) and a detached batch leaves it as it was. */
        uint64_t r1, r2;
        unsigned f1;
        meter_attach(on, &ma, 1);
        r1 = on->pace->clock_reads;
        f1 = on->pace->fast_left;
        side_batch(on, &ma, 0, coll, in, out, bytes, calls, NULL);
        meter_attach(on, &ma, 1); /* as made: the pacer goes with the communicator */
        r2 = on->pace->clock_reads;
        if (r2 != r1 || on->pace->fast_left != f1 ||
            (want >= 2 * SHOAL_QOS_PACE_FAST && coll != COLL_BARRIER && r1 == pace_reads0)) {
            fprintf(stderr, "meter_bench: -T -d qos: the paced batches read the pacer's clock "
                            "%llu times, a detached batch %llu times\n",
                    (unsigned long long)(r1 - pace_reads0), (unsigned long long)(r2 - r1));
            return 1;
        }
    } else if (toggle) {
        /* The page counted the metered batches, and one more detached batch changes none of
         * its counters: else the detached side was not unmetered (a counter pointer this tool
         * does not know of), and the comparison would be wrong. */
        shoal_stats_t st2 = SHOAL_STATS_INIT;
        int bad;
        meter_attach(on, &ma, 1);
        bad = shoal_comm_stats(on, &st1) != SHOAL_OK;
        side_batch(on, &ma, 0, coll, in, out, bytes, calls, NULL);
        meter_attach(on, &ma, 1); /* as made: the page goes with the communicator */
        bad |= shoal_comm_stats(on, &st2) != SHOAL_OK;
        if (bad || st1.ops_total - st0.ops_total != want || st2.ops_total != st1.ops_total ||
            st2.bytes_sent != st1.bytes_sent || st2.bytes_recv != st1.bytes_recv ||
            st2.coll_ns != st1.coll_ns) {
            fprintf(stderr, "meter_bench: -T: the page counted %llu calls, the metered batches "
                            "made %llu; a detached batch changed calls by %llu, bytes sent by "
                            "%llu, received by %llu, time by %llu ns%s\n",
                    (unsigned long long)(st1.ops_total - st0.ops_total),
                    (unsigned long long)want, (unsigned long long)(st2.ops_total - st1.ops_total),
                    (unsigned long long)(st2.bytes_sent - st1.bytes_sent),
                    (unsigned long long)(st2.bytes_recv - st1.bytes_recv),
                    (unsigned long long)(st2.coll_ns - st1.coll_ns),
                    bad ? " (shoal_comm_stats failed)" : "");
            return 1;
        }
    }
    if (rank == 0 && pairs > 0) {
        int nranks;
        double mon, moff, mnon, mnoff, md;
        pieces_t pc;
        shoal_comm_size(parent, &nranks);
        mnon = minimum(ton, pairs);
        mnoff = minimum(toff, pairs);
        mon = bench_median(ton, pairs);
        moff = bench_median(toff, pairs);
        md = bench_median(diff, pairs);
        printf("ranks %d\nbytes %zu\ncalls_per_batch %d\npairs %d\ndiffers %s\nsplit_first %s\n",
               nranks, bytes, calls, pairs, qos ? "qos" : "meter",
               toggle ? "one" : swap ? "off" : "on");
        if (toggle) {
            printf("%s_calls %llu\n", qos ? "paced" : "metered", (unsigned long long)want);
        }
        printf("on_median_ns %.2f\noff_median_ns %.2f\nratio_median %.4f\n", mon, moff,
               mon / moff);
        printf("on_min_ns %.2f\noff_min_ns %.2f\nratio_min %.4f\n", mnon, mnoff, mnon / mnoff);
        printf("diff_median_ns %.2f\nratio_diff %.4f\n", md, (moff + md) / moff);
        md = bench_median(cdiff, pairs);
        moff = bench_median(coff, pairs);
        printf("cpu_on_median_ns %.2f\ncpu_off_median_ns %.2f\ncpu_diff_median_ns %.2f\n"
               "cpu_ratio_diff %.4f\n", bench_median(con, pairs), moff, md, (moff + md) / moff);
        if (!qos) {
            pieces(on->meter, &pc);
            printf("clock %s\nclock_ghz %.3f\nclock_read_ns %.2f\nclock_gettime_ns %.2f\n"
                   "hooks_ns %.2f\nhooks_marginal_ns %.2f\nhooks_mul_ns %.2f\n"
                   "wait_ns %.2f\nwait_clock_ns %.2f\nwait_meter_ns %.2f\nwait_mul_ns %.2f\n",
                   shoal_tick_clock.tsc ? "tsc" : "clock_monotonic",
                   (double)shoal_tick_clock.ticks_per_sec / 1e9, pc.ticks, pc.mono, pc.hooks,
                   pc.marginal, pc.mul, pc.wait, pc.wait_clock, pc.wait_meter, pc.wait_mul);
        } else {
            printf("paced_ns %llu\n", (unsigned long long)shoal_qos_pace_held_ns(on->pace));
        }
    }
    if (off != on) {
        shoal_comm_destroy(off);
    }
    shoal_comm_destroy(on);
    free(ma.sent);
    free(ma.recv);
    shoal_comm_destroy(parent);
    free(in);
    free(out);
    free(ton);
    free(toff);
    free(diff);
    free(con);
    free(coff);
    free(cdiff);
    return 0;
}
