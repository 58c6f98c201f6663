/*
 * One rank of the metering exactness test (run by tests/meter/run_meter.sh under shoalrun):
 * collectives whose traffic is known exactly (forced ring algorithms, SHOAL_RING_ORDER=rank,
 * point-to-point around the ring, the intra-node direct path with forced protocols), each
 * followed by a check that shoal_comm_stats moved by exactly the expected bytes (per transport
 * and locality: the transport of the channel to the ring neighbour, same host or not by
 * SHOAL_HOSTID), ops and seq. At the end the sums over ranks of every sent bucket equal those
 * of the received ones, and each rank writes its final counters (METER_STATS_FILE) for the
 * script to compare with what the test acceptor read from the shared page.
 *
 *   meter_rank CASE...   cases: allreduce allgather reduce_scatter p2p bcast reduce alltoall
 *                        barrier shmd errors split_abort hold=SECONDS breaker=N cred_wiped
 *                        cred_nodump fork_child overlap
 * Environment read by the test itself: SHOAL_TRANSPORT (forced transport), MP_HOSTMAP /
 * MP_PPN (virtual hosts, as hostid_wrap.sh), METER_STATS_FILE, METER_TENANT and METER_JOB
 * (the names configured, default acme / meter-test), METER_LIFE_FILE (each rank appends
 * "pid=P rank=R life_ns=N": CLOCK_REALTIME from the page's creation, as the library stamped
 * it in the metering page, to the return of shoal_comm_destroy), METER_ACC_FILE (the test
 * acceptor's output, case fork_child).
 */
#include "tests/mp/mptest.h"
#include "core/core.h"
#include "meter/meter.h"
#include "tenant/breaker.h"
#if SHOAL_HAVE_CUDA
#include "cuda/cuda_drv.h"
#endif

#include <arpa/inet.h>
#include <inttypes.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/wait.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NB SHOAL_STATS_NTL
#define MAX_CASES 32

static mp_ctx_t ctx;
static int P, R;
static const char *tl_names[] = {"shm", "tcp", "ucx", "ib"};
/* Per case: this rank's deltas of every bucket, for the sums over ranks at the end. */
static uint64_t deltas[MAX_CASES][2][NB][2];
static int ncases;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int host_of(int r)
{
    const char *map = getenv("MP_HOSTMAP"), *ppn = getenv("MP_PPN");
    if (map != NULL && map[0] != '\0') {
        const char *s = map;
        for (int i = 0; i < r && s != NULL; i++) {
            s = strchr(s, ',');
            s = s != NULL ? s + 1 : NULL;
        }
        return s != NULL ? atoi(s) : -1;
    }
    return ppn != NULL ? r / atoi(ppn) : 0; /* no virtual hosts: all on this host */
}

/* Transport and locality of the channel to peer q (as the library picks it). */
static void bucket_of(int q, int *tl_p, int *loc_p)
{
    const char *forced = getenv("SHOAL_TRANSPORT");
    int same = host_of(q) == host_of(R);
    *loc_p = same ? SHOAL_STATS_SAME_HOST : SHOAL_STATS_OTHER_HOST;
    *tl_p = same ? SHOAL_STATS_TL_SHM : SHOAL_STATS_TL_TCP;
    if (forced != NULL && forced[0] != '\0') {
        for (int i = 0; i < 4; i++) {
            if (strcmp(forced, tl_names[i]) == 0) {
                *tl_p = i;
            }
        }
    }
}

static shoal_stats_t snap(shoal_comm_t comm)
{
    shoal_stats_t s = SHOAL_STATS_INIT;
    if (shoal_comm_stats(comm, &s) != SHOAL_OK) {
        fprintf(stderr, "# rank %d: shoal_comm_stats failed\n", R);
        exit(2);
    }
    return s;
}

static uint64_t d_sent(const shoal_stats_t *a, const shoal_stats_t *b, int tl, int loc)
{
    return b->bytes_sent_by[tl][loc] - a->bytes_sent_by[tl][loc];
}

static uint64_t d_recv(const shoal_stats_t *a, const shoal_stats_t *b, int tl, int loc)
{
    return b->bytes_recv_by[tl][loc] - a->bytes_recv_by[tl][loc];
}

/* Records the case's deltas and checks ops (one call of type per call), totals and time. */
static void check_common(int g, const char *what, const shoal_stats_t *a, const shoal_stats_t *b,
                         int type, uint64_t calls, uint64_t wall_ns)
{
    int c = ncases++;
    for (int t = 0; t < NB; t++) {
        for (int l = 0; l < 2; l++) {
            deltas[c][0][t][l] = d_sent(a, b, t, l);
            deltas[c][1][t][l] = d_recv(a, b, t, l);
        }
    }
    mp_case(g, b->ops[type] - a->ops[type] == calls, R, "%s: ops[%d] +%llu, want +%llu", what,
            type, (unsigned long long)(b->ops[type] - a->ops[type]), (unsigned long long)calls);
    mp_case(g, b->ops_total - a->ops_total == calls, R, "%s: ops_total +%llu, want +%llu", what,
            (unsigned long long)(b->ops_total - a->ops_total), (unsigned long long)calls);
    /* coll_ns runs on the TSC at a rate measured against CLOCK_MONOTONIC (2 ms at first,
     * bracketed reads: ~1e-6; refined every second): within 1e-3 + 1 us of the test's own
     * clock. */
    mp_case(g, b->coll_ns > a->coll_ns && b->coll_ns - a->coll_ns <= wall_ns + wall_ns / 1000 +
                                                                     1000, R,
            "%s: coll_ns +%llu, wall %llu ns", what,
            (unsigned long long)(b->coll_ns - a->coll_ns), (unsigned long long)wall_ns);
    mp_case(g, b->errors == a->errors && b->peer_failures == a->peer_failures, R,
            "%s: errors +%llu, peer failures +%llu", what,
            (unsigned long long)(b->errors - a->errors),
            (unsigned long long)(b->peer_failures - a->peer_failures));
}

/* All sent bytes to the ring's next rank, all received from the previous one. */
static void check_ring(int g, const char *what, const shoal_stats_t *a, const shoal_stats_t *b,
                       uint64_t sent, uint64_t recv)
{
    int ts, ls, tr, lr;
    bucket_of((R + 1) % P, &ts, &ls);
    bucket_of((R + P - 1) % P, &tr, &lr);
    mp_case(g, d_sent(a, b, ts, ls) == sent, R, "%s: sent %s/%s +%llu, want %llu", what,
            tl_names[ts], ls ? "other" : "same", (unsigned long long)d_sent(a, b, ts, ls),
            (unsigned long long)sent);
    mp_case(g, d_recv(a, b, tr, lr) == recv, R, "%s: recv %s/%s +%llu, want %llu", what,
            tl_names[tr], lr ? "other" : "same", (unsigned long long)d_recv(a, b, tr, lr),
            (unsigned long long)recv);
    mp_case(g, b->bytes_sent - a->bytes_sent == sent && b->bytes_recv - a->bytes_recv == recv,
            R, "%s: totals sent +%llu recv +%llu, want %llu %llu (bytes in other buckets)", what,
            (unsigned long long)(b->bytes_sent - a->bytes_sent),
            (unsigned long long)(b->bytes_recv - a->bytes_recv), (unsigned long long)sent,
            (unsigned long long)recv);
    mp_case(g, (b->bytes_sent_same_host - a->bytes_sent_same_host) +
                       (b->bytes_sent_other_host - a->bytes_sent_other_host) == sent &&
                   (ls ? b->bytes_sent_other_host - a->bytes_sent_other_host
                       : b->bytes_sent_same_host - a->bytes_sent_same_host) == sent,
            R, "%s: locality split of sent bytes", what);
}

static void check_totals(int g, const char *what, const shoal_stats_t *a, const shoal_stats_t *b,
                         uint64_t sent, uint64_t recv)
{
    mp_case(g, b->bytes_sent - a->bytes_sent == sent, R, "%s: sent +%llu, want %llu", what,
            (unsigned long long)(b->bytes_sent - a->bytes_sent), (unsigned long long)sent);
    mp_case(g, b->bytes_recv - a->bytes_recv == recv, R, "%s: recv +%llu, want %llu", what,
            (unsigned long long)(b->bytes_recv - a->bytes_recv), (unsigned long long)recv);
}

#define RUN(g, what, type, calls, expr)                                                         \
    do {                                                                                        \
        shoal_stats_t a_ = snap(comm), b_;                                                      \
        uint64_t t0_ = now_ns();                                                                \
        shoal_status_t st_ = (expr);                                                            \
        uint64_t w_ = now_ns() - t0_;                                                           \
        b_ = snap(comm);                                                                        \
        mp_case(g, st_ == SHOAL_OK, R, "%s: %s", what, shoal_strerror(st_));                    \
        mp_case(g, (b_.size == sizeof(b_)), R, "%s: size", what);                               \
        check_common(g, what, &a_, &b_, type, calls, w_);                                       \
        sa = a_;                                                                                \
        sb = b_;                                                                                \
    } while (0)

static void *buf_a, *buf_b;

static void case_allreduce(shoal_comm_t comm)
{
    int g = mp_group("meter: ring allreduce bytes exact");
    shoal_stats_t sa, sb;
    size_t k = 300000; /* per rank block > one 512 KiB chunk of int32: several slices */
    RUN(g, "allreduce", SHOAL_STATS_ALLREDUCE, 1,
        shoal_allreduce(buf_a, buf_b, k * (size_t)P, SHOAL_INT32, SHOAL_SUM, comm, NULL));
    check_ring(g, "allreduce", &sa, &sb, 2ull * (P - 1) * k * 4, 2ull * (P - 1) * k * 4);
    /* In place, and a count that is not a multiple of P: only the sums at the end know. */
    RUN(g, "allreduce odd", SHOAL_STATS_ALLREDUCE, 1,
        shoal_allreduce(buf_b, buf_b, 1001, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL));
}

static void case_allgather(shoal_comm_t comm)
{
    int g = mp_group("meter: ring allgather bytes exact");
    shoal_stats_t sa, sb;
    size_t k = 70001;
    RUN(g, "allgather", SHOAL_STATS_ALLGATHER, 1,
        shoal_allgather(buf_a, buf_b, k, SHOAL_UINT8, comm, NULL));
    check_ring(g, "allgather", &sa, &sb, (uint64_t)(P - 1) * k, (uint64_t)(P - 1) * k);
}

static void case_reduce_scatter(shoal_comm_t comm)
{
    int g = mp_group("meter: ring reduce_scatter bytes exact");
    shoal_stats_t sa, sb;
    size_t k = 50000;
    RUN(g, "reduce_scatter", SHOAL_STATS_REDUCE_SCATTER, 1,
        shoal_reduce_scatter(buf_a, buf_b, k, SHOAL_FLOAT64, SHOAL_MAX, comm, NULL));
    check_ring(g, "reduce_scatter", &sa, &sb, (uint64_t)(P - 1) * k * 8,
               (uint64_t)(P - 1) * k * 8);
}

static void case_p2p(shoal_comm_t comm)
{
    int g = mp_group("meter: send/recv around the ring bytes exact");
    shoal_stats_t sa, sb, s0, s1;
    size_t b = 123457;
    int next = (R + 1) % P, prev = (R + P - 1) % P;
    if (R == 0) {
        RUN(g, "send", SHOAL_STATS_SEND, 1, shoal_send(buf_a, b, SHOAL_UINT8, next, comm, NULL));
        s0 = sa;
        RUN(g, "recv", SHOAL_STATS_RECV, 1, shoal_recv(buf_b, b, SHOAL_UINT8, prev, comm, NULL));
        s1 = sb;
    } else {
        RUN(g, "recv", SHOAL_STATS_RECV, 1, shoal_recv(buf_b, b, SHOAL_UINT8, prev, comm, NULL));
        s0 = sa;
        RUN(g, "send", SHOAL_STATS_SEND, 1, shoal_send(buf_a, b, SHOAL_UINT8, next, comm, NULL));
        s1 = sb;
    }
    ncases--; /* one case: the pair */
    for (int t = 0; t < NB; t++) {
        for (int l = 0; l < 2; l++) {
            deltas[ncases - 1][0][t][l] = d_sent(&s0, &s1, t, l);
            deltas[ncases - 1][1][t][l] = d_recv(&s0, &s1, t, l);
        }
    }
    check_ring(g, "send+recv", &s0, &s1, b, b);
}

/* The same exchange inside a group, every rank sending first (the group's end posts both):
 * counted as the two calls one after the other would be, an op each and the bytes once. */
static void case_p2p_group(shoal_comm_t comm)
{
    int g = mp_group("meter: send/recv in a group bytes and ops exact");
    size_t b = 300001; /* more than the shm buffers: the send waits for the receive */
    int next = (R + 1) % P, prev = (R + P - 1) % P, c = ncases++;
    shoal_stats_t s0 = snap(comm), s1;
    shoal_status_t st = shoal_group_start();
    if (st == SHOAL_OK) {
        st = shoal_send(buf_a, b, SHOAL_UINT8, next, comm, NULL);
    }
    if (st == SHOAL_OK) {
        st = shoal_recv(buf_b, b, SHOAL_UINT8, prev, comm, NULL);
    }
    shoal_status_t st2 = shoal_group_end();
    st = st != SHOAL_OK ? st : st2;
    s1 = snap(comm);
    mp_case(g, st == SHOAL_OK, R, "group: %s", shoal_strerror(st));
    for (int t = 0; t < NB; t++) {
        for (int l = 0; l < 2; l++) {
            deltas[c][0][t][l] = d_sent(&s0, &s1, t, l);
            deltas[c][1][t][l] = d_recv(&s0, &s1, t, l);
        }
    }
    mp_case(g, s1.ops[SHOAL_STATS_SEND] - s0.ops[SHOAL_STATS_SEND] == 1 &&
                   s1.ops[SHOAL_STATS_RECV] - s0.ops[SHOAL_STATS_RECV] == 1 &&
                   s1.ops_total - s0.ops_total == 2,
            R, "ops send +%llu recv +%llu total +%llu, want 1 1 2",
            (unsigned long long)(s1.ops[SHOAL_STATS_SEND] - s0.ops[SHOAL_STATS_SEND]),
            (unsigned long long)(s1.ops[SHOAL_STATS_RECV] - s0.ops[SHOAL_STATS_RECV]),
            (unsigned long long)(s1.ops_total - s0.ops_total));
    mp_case(g, s1.errors == s0.errors && s1.coll_ns > s0.coll_ns, R,
            "errors +%llu, coll_ns +%llu", (unsigned long long)(s1.errors - s0.errors),
            (unsigned long long)(s1.coll_ns - s0.coll_ns));
    check_ring(g, "group send+recv", &s0, &s1, b, b);
}

static void case_bcast(shoal_comm_t comm)
{
    int g = mp_group("meter: broadcast: every non-root receives the buffer once");
    shoal_stats_t sa, sb;
    size_t b = 200003;
    RUN(g, "broadcast", SHOAL_STATS_BROADCAST, 1,
        shoal_broadcast(buf_a, buf_b, b, SHOAL_UINT8, 0, comm, NULL));
    mp_case(g, sb.bytes_recv - sa.bytes_recv == (R == 0 ? 0 : b), R, "broadcast: recv +%llu",
            (unsigned long long)(sb.bytes_recv - sa.bytes_recv));
    mp_case(g, R != 0 || sb.bytes_sent - sa.bytes_sent >= b, R, "broadcast: root sent +%llu",
            (unsigned long long)(sb.bytes_sent - sa.bytes_sent));
}

static void case_reduce(shoal_comm_t comm)
{
    int g = mp_group("meter: reduce: every non-root sends the buffer once");
    shoal_stats_t sa, sb;
    size_t k = 40000;
    RUN(g, "reduce", SHOAL_STATS_REDUCE, 1,
        shoal_reduce(buf_a, buf_b, k, SHOAL_INT64, SHOAL_SUM, 0, comm, NULL));
    mp_case(g, sb.bytes_sent - sa.bytes_sent == (R == 0 ? 0 : k * 8), R, "reduce: sent +%llu",
            (unsigned long long)(sb.bytes_sent - sa.bytes_sent));
}

static void case_alltoall(shoal_comm_t comm)
{
    int g = mp_group("meter: alltoall bytes exact");
    shoal_stats_t sa, sb;
    size_t k = 10007;
    RUN(g, "alltoall", SHOAL_STATS_ALLTOALL, 1,
        shoal_alltoall(buf_a, buf_b, k, SHOAL_UINT8, comm, NULL));
    check_totals(g, "alltoall", &sa, &sb, (uint64_t)(P - 1) * k, (uint64_t)(P - 1) * k);
}

static void case_barrier(shoal_comm_t comm)
{
    int g = mp_group("meter: barrier counts an op and no bytes");
    shoal_stats_t sa, sb;
    RUN(g, "barrier", SHOAL_STATS_BARRIER, 1, shoal_barrier(comm, NULL));
    check_totals(g, "barrier", &sa, &sb, 0, 0);
}

/* SHOAL_ALGO=shm, SHOAL_SHM_LL_MAX=1024, SHOAL_SHM_ONESHOT_MAX=16k (set by the script). */
static void case_shmd(shoal_comm_t comm)
{
    int g = mp_group("meter: intra-node direct allreduce (LL, one-shot, two-shot)");
    shoal_stats_t sa, sb;
    uint64_t n1 = (uint64_t)P - 1;
    RUN(g, "shm LL 512 B", SHOAL_STATS_ALLREDUCE, 1,
        shoal_allreduce(buf_a, buf_b, 128, SHOAL_INT32, SHOAL_SUM, comm, NULL));
    check_ring(g, "shm LL", &sa, &sb, n1 * 512, n1 * 512);
    RUN(g, "shm one-shot 8 KiB", SHOAL_STATS_ALLREDUCE, 1,
        shoal_allreduce(buf_a, buf_b, 2048, SHOAL_INT32, SHOAL_SUM, comm, NULL));
    check_ring(g, "shm one-shot", &sa, &sb, n1 * 8192, n1 * 8192);
    /* Two-shot over several windows: sent == received on every rank, and the sums over
     * ranks are 2 (P - 1) B (checked at the end with the other sums). */
    RUN(g, "shm two-shot 4 MiB + 12 B", SHOAL_STATS_ALLREDUCE, 1,
        shoal_allreduce(buf_a, buf_b, (4u << 20) / 4 + 3, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL));
    mp_case(g, sb.bytes_sent - sa.bytes_sent == sb.bytes_recv - sa.bytes_recv, R,
            "two-shot: sent +%llu != recv +%llu",
            (unsigned long long)(sb.bytes_sent - sa.bytes_sent),
            (unsigned long long)(sb.bytes_recv - sa.bytes_recv));
    mp_case(g, sb.bytes_sent_by[SHOAL_STATS_TL_SHM][SHOAL_STATS_SAME_HOST] -
                       sa.bytes_sent_by[SHOAL_STATS_TL_SHM][SHOAL_STATS_SAME_HOST] ==
                   sb.bytes_sent - sa.bytes_sent,
            R, "two-shot: bytes outside shm/same-host");
}

/* 1 if this process can run stream-ordered calls (a CUDA build and a driver). */
static int cuda_usable(void)
{
#if SHOAL_HAVE_CUDA
    return shoal_cuda_drv_load() == SHOAL_OK;
#else
    return 0;
#endif
}

static void case_errors(shoal_comm_t comm)
{
    int g = mp_group("meter: refused calls count errors, not ops");
    shoal_stats_t a = snap(comm), b;
    shoal_status_t st1 = shoal_broadcast(buf_a, buf_b, 4, SHOAL_UINT8, P, comm, NULL);
    shoal_status_t st2 = shoal_allreduce(buf_a, buf_b, 4, (shoal_dtype_t)99, SHOAL_SUM, comm,
                                         NULL);
    /* nonblocking: no request pointer, and a bad dtype */
    shoal_status_t st3 = shoal_iallreduce(buf_a, buf_b, 4, SHOAL_INT32, SHOAL_SUM, comm, NULL);
    shoal_request_t req = NULL;
    shoal_status_t st4 = shoal_iallgather(buf_a, buf_b, 4, (shoal_dtype_t)99, comm, &req);
    /* a stream where CUDA is unavailable: the CUDA layer refuses it (a dummy stream, so only
     * where there is no driver to hand it to) */
    int cuda = cuda_usable();
    shoal_status_t st5 = cuda ? SHOAL_ERR_UNSUPPORTED
                              : shoal_allreduce(buf_a, buf_b, 4, SHOAL_INT32, SHOAL_SUM, comm,
                                                (void *)&req);
    b = snap(comm);
    mp_case(g, st5 != SHOAL_OK, R, "a stream without CUDA: %s", shoal_strerror(st5));
    mp_case(g, st1 == SHOAL_ERR_INVALID_ARG && st2 == SHOAL_ERR_INVALID_ARG &&
                   st3 == SHOAL_ERR_INVALID_ARG && st4 == SHOAL_ERR_INVALID_ARG, R,
            "statuses %d %d %d %d", st1, st2, st3, st4);
    mp_case(g, b.errors - a.errors == (cuda ? 4u : 5u) && b.ops_total == a.ops_total &&
                   b.peer_failures == a.peer_failures && b.bytes_sent == a.bytes_sent,
            R, "errors +%llu ops +%llu", (unsigned long long)(b.errors - a.errors),
            (unsigned long long)(b.ops_total - a.ops_total));
}

static void stats_line(FILE *f, int c, const shoal_stats_t *s)
{
    fprintf(f, "pid=%d c=%d rank=%d ops=", (int)getpid(), c, R);
    for (int i = 0; i < SHOAL_STATS_NCOLL; i++) {
        fprintf(f, "%s%llu", i ? "," : "", (unsigned long long)s->ops[i]);
    }
    fprintf(f, " sent=");
    for (int t = 0; t < 4; t++) {
        fprintf(f, "%s%llu,%llu", t ? "," : "", (unsigned long long)s->bytes_sent_by[t][0],
                (unsigned long long)s->bytes_sent_by[t][1]);
    }
    fprintf(f, " recv=");
    for (int t = 0; t < 4; t++) {
        fprintf(f, "%s%llu,%llu", t ? "," : "", (unsigned long long)s->bytes_recv_by[t][0],
                (unsigned long long)s->bytes_recv_by[t][1]);
    }
    fprintf(f, " coll_ns=%llu errors=%llu peer_failures=%llu aborts=%llu\n",
            (unsigned long long)s->coll_ns, (unsigned long long)s->errors,
            (unsigned long long)s->peer_failures, (unsigned long long)s->aborts);
}

static uint64_t real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void write_life(uint64_t ns)
{
    const char *path = getenv("METER_LIFE_FILE");
    FILE *f;
    if (path == NULL || path[0] == '\0') {
        return;
    }
    f = fopen(path, "a");
    if (f != NULL) {
        fprintf(f, "pid=%d rank=%d life_ns=%llu\n", (int)getpid(), R, (unsigned long long)ns);
        fclose(f);
    }
}

static void write_stats(int c, const shoal_stats_t *s)
{
    const char *path = getenv("METER_STATS_FILE");
    FILE *f;
    if (path == NULL || path[0] == '\0') {
        return;
    }
    f = fopen(path, "a");
    if (f != NULL) {
        stats_line(f, c, s);
        fclose(f);
    }
}

/* A second communicator (split), aborted: aborts +1, a nonblocking call the proxy starts
 * after the abort and the next call are refused (errors +2, no peer failure); its counters
 * are written too (the acceptor gets its page as well). */
static void case_split_abort(shoal_comm_t comm)
{
    int g = mp_group("meter: split communicator, abort");
    shoal_comm_t sub = NULL;
    shoal_stats_t a, b;
    shoal_request_t req = NULL;
    shoal_status_t ist;
    uint64_t ticket;
    shoal_status_t st = shoal_comm_split(comm, 0, R, &sub);
    mp_case(g, st == SHOAL_OK && sub != NULL, R, "split: %s", shoal_strerror(st));
    if (sub == NULL) {
        return;
    }
    st = shoal_allreduce(buf_a, buf_b, 1000, SHOAL_INT32, SHOAL_SUM, sub, NULL);
    a = snap(sub);
    mp_case(g, st == SHOAL_OK && a.ops_total == 1 && a.ops[SHOAL_STATS_ALLREDUCE] == 1 &&
                   a.aborts == 0 && a.errors == 0, R, "sub: ops %llu",
            (unsigned long long)a.ops_total);
    /* A nonblocking call posted while this thread holds the ticket, so that the proxy starts
     * it only after the abort: refused there, it counts in errors like a blocking call. */
    ticket = shoal_comm_ticket_take(sub);
    ist = shoal_comm_ticket_wait(sub, ticket);
    if (ist == SHOAL_OK) {
        ist = shoal_ibarrier(sub, &req);
    }
    shoal_comm_abort(sub);
    shoal_comm_ticket_release(sub);
    if (ist == SHOAL_OK) {
        ist = shoal_wait(&req);
    }
    mp_case(g, ist != SHOAL_OK, R, "ibarrier started after the abort: %s", shoal_strerror(ist));
    st = shoal_barrier(sub, NULL);
    b = snap(sub);
    mp_case(g, st == SHOAL_ERR_ABORTED, R, "after abort: %s", shoal_strerror(st));
    mp_case(g, b.aborts == 1 && b.errors == 2 && b.peer_failures == 0 &&
                   b.ops_total == a.ops_total, R,
            "after abort: aborts %llu errors %llu peer failures %llu ops %llu",
            (unsigned long long)b.aborts, (unsigned long long)b.errors,
            (unsigned long long)b.peer_failures, (unsigned long long)b.ops_total);
    write_stats(1, &b);
    shoal_comm_destroy(sub);
}

/* Calls for SECONDS (the acceptor drops the first registration: the library registers again
 * on a call at least a second later). The time inside them (coll_ticks in the page, converted
 * by the rate the page publishes, meter_page.h) never goes back, across the once-a-second
 * refinement of the rate too, and stays within the wall time of the calls. */
static void case_hold(shoal_comm_t comm, double secs)
{
    int g = mp_group("meter: calls over %.1f s count exactly", secs);
    shoal_stats_t a = snap(comm), b, prev = a;
    const shoal_meter_page_t *pg = comm->meter != NULL ? comm->meter->page : NULL;
    uint64_t t0 = now_ns(), end = t0 + (uint64_t)(secs * 1e9), n = 0, in_calls = 0, back = 0;
    uint64_t slot0 = pg != NULL ? __atomic_load_n(&pg->tick_slot, __ATOMIC_ACQUIRE) : 0;
    /* The page's rate 1e-4 off (as a first calibration may be), so that the next
     * once-a-second check must move the page to the refined rate even where the calibration
     * was exact (a VM whose TSC and CLOCK_MONOTONIC come from one source). */
    if (shoal_tick_clock.tsc && secs >= 1.1 && pg != NULL) {
        uint64_t m = __atomic_load_n(&shoal_tick_clock.mult, __ATOMIC_RELAXED);
        shoal_meter_tick_rebase(comm->meter->page, m + m / 10000);
        slot0 = __atomic_load_n(&pg->tick_slot, __ATOMIC_ACQUIRE);
    }
    uint64_t rebases = 0;
    int32_t more = 1;
    while (more) {
        uint64_t c0 = now_ns(), slot;
        mp_case(g, shoal_allreduce(buf_a, buf_b, 1024, SHOAL_INT32, SHOAL_SUM, comm, NULL) ==
                       SHOAL_OK, R, "allreduce");
        more = now_ns() < end;
        /* every rank stops after the same call */
        mp_case(g, shoal_allreduce(&more, &more, 1, SHOAL_INT32, SHOAL_MIN, comm, NULL) ==
                       SHOAL_OK, R, "allreduce");
        in_calls += now_ns() - c0;
        n += 2;
        b = snap(comm);
        back += b.coll_ns < prev.coll_ns;
        prev = b;
        slot = pg != NULL ? __atomic_load_n(&pg->tick_slot, __ATOMIC_ACQUIRE) : 0;
        rebases += slot != slot0;
        slot0 = slot;
        usleep(20000);
    }
    b = snap(comm);
    mp_case(g, b.ops[SHOAL_STATS_ALLREDUCE] - a.ops[SHOAL_STATS_ALLREDUCE] == n, R,
            "ops +%llu, want %llu",
            (unsigned long long)(b.ops[SHOAL_STATS_ALLREDUCE] - a.ops[SHOAL_STATS_ALLREDUCE]),
            (unsigned long long)n);
    mp_case(g, back == 0, R, "coll_ns went back %llu times", (unsigned long long)back);
    /* within the test's own clock around the calls: 1e-3 (the rate) + 1 us per call */
    mp_case(g, b.coll_ns > a.coll_ns && b.coll_ns - a.coll_ns <= in_calls + in_calls / 1000 +
                                                                 1000 * n, R,
            "coll_ns +%llu, the calls took %llu ns", (unsigned long long)(b.coll_ns - a.coll_ns),
            (unsigned long long)in_calls);
    /* the rate was refined (a TSC clock, over a second): the page's conversion moved on and
     * has the clock's rate */
    uint64_t in_force = pg != NULL ? __atomic_load_n(&pg->tick_slot, __ATOMIC_ACQUIRE) & 1 : 0;
    uint64_t page_mult = pg != NULL ? __atomic_load_n(&pg->tick_conv[in_force].mult,
                                                      __ATOMIC_RELAXED) : 0;
    uint64_t clock_mult = __atomic_load_n(&shoal_tick_clock.mult, __ATOMIC_RELAXED);
    mp_case(g, secs < 1.1 || !shoal_tick_clock.tsc || pg == NULL ||
                   (rebases > 0 && page_mult == clock_mult), R,
            "the tick rate's refinement reached the page in %.1f s: %llu rebases, page %llu, "
            "clock %llu ns per tick << 32", secs, (unsigned long long)rebases,
            (unsigned long long)page_mult, (unsigned long long)clock_mult);
}

/* N failed authentications from a stranger (192.0.2.1, TEST-NET) noted in this process's
 * circuit breaker as its join listeners note them, then 2 connections from it offered to the
 * breaker: within the library's once-a-second check (calls for 1.2 s) the metering page
 * carries the breaker's process-wide counters (auth_failed, auth_refused, breaker_opened). */
static void case_breaker(shoal_comm_t comm, int n)
{
    int g = mp_group("meter: %d failed authentications reach the metering page", n);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(9)};
    const shoal_meter_page_t *pg = comm->meter != NULL ? comm->meter->page : NULL;
    shoal_tenant_breaker_stats_t b0, b1;
    size_t ns;
    inet_pton(AF_INET, "192.0.2.1", &sa.sin_addr);
    shoal_tenant_breaker_stats(&b0, NULL, 0, &ns);
    for (int i = 0; i < n; i++) {
        shoal_tenant_breaker_note_fail((const struct sockaddr *)&sa);
    }
    for (int i = 0; i < 2; i++) {
        shoal_tenant_breaker_admit((const struct sockaddr *)&sa);
    }
    shoal_tenant_breaker_stats(&b1, NULL, 0, &ns);
    mp_case(g, b1.failed == b0.failed + (uint64_t)n, R, "breaker: failed %llu -> %llu",
            (unsigned long long)b0.failed, (unsigned long long)b1.failed);
    case_hold(comm, 1.2);
    mp_case(g, pg != NULL, R, "no metering page");
    if (pg != NULL) {
        mp_case(g, pg->auth_failed == b1.failed && pg->auth_refused == b1.refused &&
                       pg->breaker_opened == b1.opened, R,
                "page: failed %llu refused %llu opened %llu, breaker: %llu %llu %llu",
                (unsigned long long)pg->auth_failed, (unsigned long long)pg->auth_refused,
                (unsigned long long)pg->breaker_opened, (unsigned long long)b1.failed,
                (unsigned long long)b1.refused, (unsigned long long)b1.opened);
    }
}

/* Run with a job credential and no agent that could be given it (SHOAL_AGENT=none, or one
 * that refused): the library keeps no copy of the credential text (a secret). */
static void case_cred_wiped(shoal_comm_t comm)
{
    int g = mp_group("meter: no copy of the credential text without an agent to send it to");
    const struct shoal_meter *m = comm->meter;
    int zero = 1;
    mp_case(g, m != NULL, R, "no meter");
    if (m == NULL) {
        return;
    }
    for (size_t i = 0; i < sizeof(m->cred); i++) {
        zero &= m->cred[i] == 0;
    }
    mp_case(g, m->cred_len == 0 && zero, R, "the meter holds %zu bytes of credential text",
            m->cred_len);
}

/* 1 if /proc/self/smaps marks the mapping that holds addr "dd" (left out of core dumps),
 * 0 if not, -1 if no mapping holds it or smaps cannot be read. */
static int mapping_is_nodump(const void *addr)
{
    uintptr_t a = (uintptr_t)addr, lo, hi;
    char line[512];
    int in = 0, res = -1;
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (fp == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 &&
            strchr(line, ':') > strchr(line, ' ')) {
            in = a >= lo && a < hi; /* a mapping's first line: "lo-hi perms ..." */
        } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            res = strstr(line, " dd") != NULL;
            break;
        }
    }
    fclose(fp);
    return res;
}

/* Run with a job credential and an agent that took the page: the meter keeps the credential
 * text to register again should the agent restart, but out of core dumps (it was on the heap,
 * in every core of a rank). */
static void case_cred_nodump(shoal_comm_t comm)
{
    int g = mp_group("meter: the credential text kept for the agent is not in core dumps");
    const struct shoal_meter *m = comm->meter;
    int dd;
    mp_case(g, m != NULL && m->cred_len > 0, R, "no credential text kept (registered?)");
    if (m == NULL) {
        return;
    }
    dd = mapping_is_nodump(m->cred);
    mp_case(g, dd == 1, R, "the mapping of the credential text is %s",
            dd < 0 ? "not found in /proc/self/smaps" : "dumped (no MADV_DONTDUMP)");
}

/* A child forked while the communicator lives (as a data loader forks its workers) holds
 * copies of every descriptor: the agent must still learn at shoal_comm_destroy that the
 * communicator ended (fork_child_check, after the destroy). */
static pid_t fork_pid = -1;

static void case_fork_child(void)
{
    int g = mp_group("meter: a forked child does not keep the agent's connection open");
    fork_pid = fork();
    if (fork_pid == 0) {
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++) {
            dup2(null, fd); /* the launcher's pipes: not held */
        }
        sleep(30);
        _exit(0);
    }
    mp_case(g, fork_pid > 0, R, "fork failed");
}

/* After shoal_comm_destroy, the child still alive: within 3 s the acceptor (its output file
 * METER_ACC_FILE) wrote this process's first page as closed. 0 if not; the child ends. */
static int fork_child_check(void)
{
    const char *path = getenv("METER_ACC_FILE");
    char want[64], line[512];
    int seen = 0;
    snprintf(want, sizeof(want), "ident pid=%d c=0 ", (int)getpid());
    for (int i = 0; i < 30 && !seen && path != NULL; i++) {
        FILE *f = fopen(path, "r");
        while (f != NULL && !seen && fgets(line, sizeof(line), f) != NULL) {
            seen = strncmp(line, want, strlen(want)) == 0;
        }
        if (f != NULL) {
            fclose(f);
        }
        if (!seen) {
            usleep(100000);
        }
    }
    if (!seen) {
        printf("# rank %d: 3 s after shoal_comm_destroy the agent had not seen the communicator "
               "end (a forked child holds the connection)\n", R);
    }
    kill(fork_pid, SIGKILL);
    waitpid(fork_pid, NULL, 0);
    return seen;
}

/* Two nonblocking calls in flight together on rank 0 (the other ranks post theirs 0.5 s
 * later): the page's seq is odd all the while (a reader must not take the bytes they posted
 * without their ops for a consistent snapshot), even once both ended. */
static void case_overlap(shoal_comm_t comm)
{
    int g = mp_group("meter: seq odd while nonblocking calls overlap");
    const shoal_meter_page_t *pg = comm->meter != NULL ? comm->meter->page : NULL;
    shoal_request_t r1 = NULL, r2 = NULL;
    size_t k = 1 << 18; /* int32: 1 MiB per call */
    shoal_stats_t a = snap(comm), b;
    uint64_t mid = 0;
    if (R != 0) {
        usleep(500000);
    }
    mp_case(g, shoal_iallreduce(buf_a, buf_b, k, SHOAL_INT32, SHOAL_SUM, comm, &r1) == SHOAL_OK &&
                   shoal_iallreduce((char *)buf_a + (4 << 20), (char *)buf_b + (4 << 20), k,
                                    SHOAL_INT32, SHOAL_SUM, comm, &r2) == SHOAL_OK,
            R, "post");
    if (R == 0 && pg != NULL) {
        usleep(200000); /* both started, waiting for the peers */
        mid = __atomic_load_n(&pg->seq, __ATOMIC_ACQUIRE);
        mp_case(g, (mid & 1) == 1, R, "two calls in flight, seq %llu is even",
                (unsigned long long)mid);
    }
    mp_case(g, shoal_wait(&r1) == SHOAL_OK && shoal_wait(&r2) == SHOAL_OK, R, "wait");
    b = snap(comm);
    mp_case(g, b.ops[SHOAL_STATS_ALLREDUCE] - a.ops[SHOAL_STATS_ALLREDUCE] == 2, R, "ops");
    mp_case(g, pg == NULL || (__atomic_load_n(&pg->seq, __ATOMIC_ACQUIRE) & 1) == 0, R,
            "seq odd after both calls ended");
}

/* Sums over ranks of every bucket of every case: sent == received. */
static void check_sums(shoal_comm_t comm)
{
    int g = mp_group("meter: per case and bucket, sum over ranks of sent == of received");
    size_t n = (size_t)ncases * 2 * NB * 2;
    uint64_t *all = mp_alloc(n * 8 * (size_t)P);
    mp_case(g, shoal_allgather(deltas, all, n, SHOAL_UINT64, comm, NULL) == SHOAL_OK, R,
            "allgather");
    for (int c = 0; c < ncases; c++) {
        for (int t = 0; t < NB; t++) {
            for (int l = 0; l < 2; l++) {
                uint64_t s = 0, r = 0;
                for (int p = 0; p < P; p++) {
                    uint64_t(*d)[2][NB][2] = (void *)(all + (size_t)p * n);
                    s += d[c][0][t][l];
                    r += d[c][1][t][l];
                }
                mp_case(g, s == r, R, "case %d bucket %s/%s: sent %llu recv %llu", c,
                        t < 4 ? tl_names[t] : "?", l ? "other" : "same",
                        (unsigned long long)s, (unsigned long long)r);
            }
        }
    }    free(all);
}

int main(int argc, char **argv)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t comm;
    shoal_stats_t fin;
    shoal_status_t st;
    uint64_t t_init;
    int failed;

    setvbuf(stdout, NULL, _IOLBF, 0);
    cfg.tenant = getenv("METER_TENANT") != NULL ? getenv("METER_TENANT") : "acme";
    cfg.job_name = getenv("METER_JOB") != NULL ? getenv("METER_JOB") : "meter-test";
    st = shoal_comm_init_env(&comm, &cfg);
    t_init = st == SHOAL_OK && comm->meter != NULL ? comm->meter->page->created_unix_ns : 0;
    if (argc > 1 && strncmp(argv[1], "expect_init=", 12) == 0) {
        /* A refused or absent agent with SHOAL_AGENT_REQUIRED=1: init fails with a status. */
        printf("init: %s\n", shoal_status_name(st));
        if (st == SHOAL_OK) {
            shoal_comm_destroy(comm);
        }
        return strcmp(shoal_status_name(st), argv[1] + 12) != 0;
    }
    if (st != SHOAL_OK) {
        printf("Bail out! shoal_comm_init_env: %s\n", shoal_strerror(st));
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "disabled") == 0) {
        /* SHOAL_METER=0: calls work, shoal_comm_stats says the counters are not kept. */
        shoal_stats_t s = SHOAL_STATS_INIT;
        int32_t v = 1;
        int ok = shoal_allreduce(&v, &v, 1, SHOAL_INT32, SHOAL_SUM, comm, NULL) == SHOAL_OK;
        ok &= shoal_comm_stats(comm, &s) == SHOAL_ERR_UNSUPPORTED;
        printf("disabled: %s\n", ok ? "ok" : "FAILED");
        shoal_comm_destroy(comm);
        return !ok;
    }
    shoal_comm_rank(comm, &R);
    shoal_comm_size(comm, &P);
    ctx = (mp_ctx_t){.comm = comm, .rank = R, .nranks = P};
    buf_a = mp_alloc((size_t)16 << 20);
    buf_b = mp_alloc((size_t)16 << 20);
    {
        shoal_stats_t s0 = snap(comm);
        int g = mp_group("meter: a new communicator counts nothing");
        mp_case(g, s0.ops_total == 0 && s0.bytes_sent == 0 && s0.bytes_recv == 0 &&
                       s0.coll_ns == 0 && s0.errors == 0, R, "initial counters not zero");
    }
    for (int i = 1; i < argc; i++) {
        if (ncases >= MAX_CASES - 4) {
            break;
        }
        if (strcmp(argv[i], "allreduce") == 0) {
            case_allreduce(comm);
        } else if (strcmp(argv[i], "allgather") == 0) {
            case_allgather(comm);
        } else if (strcmp(argv[i], "reduce_scatter") == 0) {
            case_reduce_scatter(comm);
        } else if (strcmp(argv[i], "p2p") == 0) {
            case_p2p(comm);
        } else if (strcmp(argv[i], "p2p_group") == 0) {
            case_p2p_group(comm);
        } else if (strcmp(argv[i], "bcast") == 0) {
            case_bcast(comm);
        } else if (strcmp(argv[i], "reduce") == 0) {
            case_reduce(comm);
        } else if (strcmp(argv[i], "alltoall") == 0) {
            case_alltoall(comm);
        } else if (strcmp(argv[i], "barrier") == 0) {
            case_barrier(comm);
        } else if (strcmp(argv[i], "shmd") == 0) {
            case_shmd(comm);
        } else if (strcmp(argv[i], "errors") == 0) {
            case_errors(comm);
        } else if (strcmp(argv[i], "cred_wiped") == 0) {
            case_cred_wiped(comm);
        } else if (strcmp(argv[i], "cred_nodump") == 0) {
            case_cred_nodump(comm);
        } else if (strcmp(argv[i], "overlap") == 0) {
            case_overlap(comm);
        } else if (strcmp(argv[i], "fork_child") == 0) {
            case_fork_child();
        } else if (strncmp(argv[i], "hold=", 5) == 0) {
            case_hold(comm, atof(argv[i] + 5));
        } else if (strncmp(argv[i], "breaker=", 8) == 0) {
            case_breaker(comm, atoi(argv[i] + 8));
        } else if (strcmp(argv[i], "split_abort") != 0) {
            printf("Bail out! unknown case %s\n", argv[i]);
            return 1;
        }
    }
    check_sums(comm);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "split_abort") == 0) {
            case_split_abort(comm);
        }
    }
    failed = mp_groups_report(&ctx);
    fin = snap(comm);
    write_stats(0, &fin);
    shoal_comm_destroy(comm);
    if (fork_pid > 0 && !fork_child_check()) {
        failed = 1;
    }
    if (t_init != 0) {
        write_life(real_ns() - t_init);
    }
    free(buf_a);
    free(buf_b);
    return failed != 0;
}
