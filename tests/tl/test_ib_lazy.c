/* ib transport, queue pairs connected at first use (params.lazy, SHOAL_CONNECT=lazy): real
 * contexts on one RDMA device (the Soft-RoCE VM, tests/vm/guest_ib.sh; skipped where there is
 * none), driven from one thread (a lazy connect_all never waits for anyone):
 *  - connect_all returns at once with no peer present, and creates no queue pair;
 *  - only rank 0 posts (a send rank 1 does not receive yet): the pair connects by itself, the
 *    data waits in rank 1's ring until its receive is posted; one queue pair on each side;
 *  - ranks 0 and 2 post to each other at once: one queue pair each, data both ways, in order
 *    behind a second message queued before the connection;
 *  - a stranger with another job's key posting to rank 0 gets SHOAL_ERR_AUTH and never
 *    becomes its peer;
 *  - a peer that listens but never progresses: SHOAL_ERR_TIMEOUT after the timeout, not
 *    before; a peer whose process is gone (context finished) and one whose communicator failed
 *    (fail() closes its listener): SHOAL_ERR_PEER_FAILED within 200 ms;
 *  - the abort flag while connecting: SHOAL_ERR_ABORTED;
 *  - a waiter sleeps in poll on wait_fd while its connection is being made (no busy loop),
 *    and the connection still times out when due. */
#include "tests/tap.h"
#include "transports/ib/ib_verbs.h"

#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const shoal_tl_ops_t *tl = &shoal_tl_ib_ops;
static const uint8_t key_a[SHOAL_SECRET_BYTES] = "lazy-ib-secret-of-job-A-32-bytes";
static const uint8_t key_b[SHOAL_SECRET_BYTES] = "lazy-ib-secret-of-job-B-32-bytes";
static volatile int abort_flag;

#define NR 3

typedef struct {
    shoal_tl_ctx_t *ctx;
    int rank;
    shoal_ep_t *eps[NR];
    shoal_status_t st;
} side_t;

static double now_ms(void)
{
    return (double)shoal_time_ns() / 1e6;
}

static int side_init(side_t *s, int rank, uint32_t comm_id, const uint8_t *key, int timeout_ms)
{
    shoal_tl_params_t p = {
        .rank = rank, .nranks = NR, .local_rank = 0, .local_size = 1, .comm_id = comm_id,
        .secret = key, .timeout_ms = timeout_ms, .abort_flag = &abort_flag, .lazy = 1,
    };
    memset(s, 0, sizeof(*s));
    s->rank = rank;
    return tl->init(&p, &s->ctx) == SHOAL_OK ? 0 : -1;
}

static void side_addr(side_t *s, uint8_t *out)
{
    size_t len = SHOAL_TL_ADDR_MAX;
    (void)tl->address(s->ctx, out, &len);
}

/* connect_all to every other rank; its duration in ms, or -1. */
static double side_connect(side_t *s, uint8_t addrs[NR][SHOAL_TL_ADDR_MAX])
{
    int peers[NR - 1], n = 0;
    const void *a[NR - 1];
    size_t lens[NR - 1];
    shoal_ep_t *eps[NR - 1];
    double t0 = now_ms();
    for (int r = 0; r < NR; r++) {
        if (r != s->rank) {
            peers[n] = r;
            a[n] = addrs[r];
            lens[n] = SHOAL_IB_ADDR_BYTES;
            n++;
        }
    }
    s->st = tl->connect_all(s->ctx, peers, n, a, lens, eps);
    if (s->st != SHOAL_OK) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        s->eps[peers[i]] = eps[i];
    }
    (void)tl->ready(s->ctx); /* a lazy context keeps its listener */
    return now_ms() - t0;
}

static void side_fini(side_t *s)
{
    if (s->ctx != NULL) {
        tl->fini(s->ctx);
        s->ctx = NULL;
    }
}

static int nqps(const side_t *s)
{
    int n = 0;
    for (int i = 0; i < s->ctx->neps; i++) {
        n += s->ctx->eps[i].qp != NULL;
    }
    return n;
}

static shoal_tl_req_t mkreq(uint32_t comm_id, uint32_t seq, void *buf, size_t len)
{
    shoal_wire_hdr_t h = {.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                          .type = SHOAL_WIRE_DATA, .comm_id = comm_id, .seq = seq,
                          .length = len};
    return (shoal_tl_req_t){.hdr = h, .buf = buf};
}

/* Progresses sides until every req is done or ms pass; 1 if all are done. */
static int drive(side_t **sides, int nsides, shoal_tl_req_t **reqs, int nreqs, int ms)
{
    uint64_t deadline = shoal_time_ns() + (uint64_t)ms * 1000000ull;
    for (;;) {
        int done = 1;
        for (int i = 0; i < nreqs; i++) {
            done &= reqs[i]->done;
        }
        if (done) {
            return 1;
        }
        if (shoal_time_ns() > deadline) {
            return 0;
        }
        for (int i = 0; i < nsides; i++) {
            tl->progress(sides[i]->ctx);
        }
        sched_yield();
    }
}

static void test_connect(void)
{
    const uint32_t comm = 0x1b2c0001u;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX];
    static uint8_t s01[65536], r01[65536], s02[3000], s20[3000], r02[3000], r20[3000];
    static uint8_t s02b[100], r02b[100];
    side_t s[NR];
    for (int r = 0; r < NR; r++) {
        if (side_init(&s[r], r, comm, key_a, 20000) != 0) {
            tap_bail("ib init failed");
            return;
        }
        side_addr(&s[r], addrs[r]);
    }
    double ms0 = side_connect(&s[0], addrs);
    tap_ok(ms0 >= 0 && ms0 < 200 && nqps(&s[0]) == 0,
           "connect_all returns at once with no peer there (%.1f ms), no queue pair (%d)", ms0,
           nqps(&s[0]));
    double ms1 = side_connect(&s[1], addrs), ms2 = side_connect(&s[2], addrs);
    tap_ok(ms1 >= 0 && ms2 >= 0, "ranks 1 and 2 connect_all too (%.1f, %.1f ms)", ms1, ms2);

    /* only rank 0 posts: the pair connects from both progress paths; rank 1 receives later */
    memset(s01, 0x5c, sizeof(s01));
    memset(r01, 0, sizeof(r01));
    shoal_tl_req_t snd = mkreq(comm, 1, s01, sizeof(s01)), rcv = mkreq(comm, 1, r01,
                                                                         sizeof(r01));
    shoal_tl_req_t *one[] = {&snd}, *both[] = {&snd, &rcv};
    side_t *s01p[] = {&s[0], &s[1]}, *all[] = {&s[0], &s[1], &s[2]};
    tap_ok(tl->isend(s[0].eps[1], &snd) == SHOAL_OK, "rank 0 posts a 64 KiB send to rank 1");
    int sent = drive(s01p, 2, one, 1, 10000);
    tap_ok(sent && snd.status == SHOAL_OK && nqps(&s[0]) == 1 && nqps(&s[1]) == 1 &&
               s[0].ctx->lz_qps == 1 && s[1].ctx->lz_qps == 1 && nqps(&s[2]) == 0,
           "its send completes with rank 1 receiving nothing yet (%s); one queue pair each on "
           "0 and 1, none on 2", shoal_status_name(snd.status));
    int got = tl->irecv(s[1].eps[0], &rcv) == SHOAL_OK && drive(s01p, 2, both, 2, 10000);
    tap_ok(got && rcv.status == SHOAL_OK && memcmp(s01, r01, sizeof(r01)) == 0,
           "rank 1's receive posted afterwards gets the bytes (%s)",
           shoal_status_name(rcv.status));

    /* 0 and 2 post to each other at once, two messages each way, queued before connecting */
    memset(s02, 0x02, sizeof(s02));
    memset(s20, 0x20, sizeof(s20));
    memset(s02b, 0x2b, sizeof(s02b));
    shoal_tl_req_t a = mkreq(comm, 2, s02, sizeof(s02)), b = mkreq(comm, 2, s20, sizeof(s20));
    shoal_tl_req_t ra = mkreq(comm, 2, r20, sizeof(r20)), rb = mkreq(comm, 2, r02, sizeof(r02));
    shoal_tl_req_t a2 = mkreq(comm, 3, s02b, sizeof(s02b)), rb2 = mkreq(comm, 3, r02b,
                                                                       sizeof(r02b));
    shoal_tl_req_t *six[] = {&a, &b, &ra, &rb, &a2, &rb2};
    tl->irecv(s[0].eps[2], &ra);
    tl->irecv(s[2].eps[0], &rb);
    tl->irecv(s[2].eps[0], &rb2);
    tl->isend(s[0].eps[2], &a);
    tl->isend(s[0].eps[2], &a2);
    tl->isend(s[2].eps[0], &b);
    int ok = drive(all, 3, six, 6, 10000);
    for (int i = 0; i < 6; i++) {
        ok &= six[i]->status == SHOAL_OK;
    }
    tap_ok(ok && memcmp(r02, s02, sizeof(r02)) == 0 && memcmp(r20, s20, sizeof(r20)) == 0 &&
               memcmp(r02b, s02b, sizeof(r02b)) == 0,
           "ranks 0 and 2 post to each other at once: both ways, two messages in order");
    tap_ok(nqps(&s[0]) == 2 && nqps(&s[2]) == 1 && s[0].ctx->lz_qps == 2 &&
               s[2].ctx->lz_qps == 1,
           "one queue pair per pair after the race (rank 0: %d, rank 2: %d)", nqps(&s[0]),
           nqps(&s[2]));
    for (int r = 0; r < NR; r++) {
        side_fini(&s[r]);
    }
}

/* A stranger (another job's key) claiming rank 1 posts to rank 0: AUTH; rank 0's real rank 1
 * connects afterwards. */
static void test_stranger(void)
{
    const uint32_t comm = 0x1b2c0002u;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX], x[64] = {1}, y[64];
    side_t s[NR], st;
    for (int r = 0; r < NR; r++) {
        if (side_init(&s[r], r, comm, key_a, 20000) != 0) {
            tap_bail("ib init failed");
            return;
        }
        side_addr(&s[r], addrs[r]);
    }
    if (side_init(&st, 1, comm, key_b, 20000) != 0) {
        tap_bail("ib init failed");
        return;
    }
    for (int r = 0; r < NR; r++) {
        (void)side_connect(&s[r], addrs);
    }
    (void)side_connect(&st, addrs);
    shoal_tl_req_t bad = mkreq(comm, 1, x, sizeof(x)), *one[] = {&bad};
    side_t *pair[] = {&s[0], &st};
    tl->isend(st.eps[0], &bad);
    double t0 = now_ms();
    int done = drive(pair, 2, one, 1, 10000);
    tap_ok(done && bad.status == SHOAL_ERR_AUTH && nqps(&s[0]) == 0,
           "a stranger with another key posting to rank 0: %s after %.0f ms, no queue pair "
           "at rank 0", shoal_status_name(bad.status), now_ms() - t0);
    shoal_tl_req_t snd = mkreq(comm, 1, x, sizeof(x)), rcv = mkreq(comm, 1, y, sizeof(y));
    shoal_tl_req_t *two[] = {&snd, &rcv};
    side_t *real[] = {&s[0], &s[1]};
    tl->isend(s[1].eps[0], &snd);
    tl->irecv(s[0].eps[1], &rcv);
    int got = drive(real, 2, two, 2, 10000);
    tap_ok(got && snd.status == SHOAL_OK && rcv.status == SHOAL_OK &&
               memcmp(x, y, sizeof(x)) == 0,
           "rank 0's real rank 1 connects afterwards (%s)", shoal_status_name(rcv.status));
    side_fini(&st);
    for (int r = 0; r < NR; r++) {
        side_fini(&s[r]);
    }
}

/* Rank 0 sends to peer 1 in a given condition; the status and how long it took. */
static shoal_status_t send_to(side_t *s0, side_t *s1, int progress_peer, double *ms_p)
{
    static uint8_t x[256];
    shoal_tl_req_t snd = mkreq(s0->ctx->comm_id, 1, x, sizeof(x)), *one[] = {&snd};
    side_t *sides[] = {s0, s1};
    double t0 = now_ms();
    if (tl->isend(s0->eps[1], &snd) != SHOAL_OK) {
        *ms_p = 0;
        return snd.status;
    }
    (void)drive(sides, progress_peer ? 2 : 1, one, 1, 20000);
    *ms_p = now_ms() - t0;
    return snd.done ? snd.status : SHOAL_IN_PROGRESS;
}

static void test_failures(void)
{
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX];
    side_t s[NR];
    shoal_status_t st;
    double ms;

    for (int c = 0; c < 4; c++) {
        const uint32_t comm = 0x1b2c0010u + (uint32_t)c;
        for (int r = 0; r < NR; r++) {
            if (side_init(&s[r], r, comm, key_a, 1500) != 0) {
                tap_bail("ib init failed");
                return;
            }
            side_addr(&s[r], addrs[r]);
        }
        for (int r = 0; r < NR; r++) {
            (void)side_connect(&s[r], addrs);
        }
        switch (c) {
        case 0: /* rank 1 never progresses */
            st = send_to(&s[0], &s[1], 0, &ms);
            tap_ok(st == SHOAL_ERR_TIMEOUT && ms >= 1400 && ms < 4000,
                   "a peer that never answers: %s after %.0f ms (timeout 1500 ms)",
                   shoal_status_name(st), ms);
            break;
        case 1: /* rank 1's process is gone: its listener closed */
            side_fini(&s[1]);
            st = send_to(&s[0], &s[1], 0, &ms);
            tap_ok(st == SHOAL_ERR_PEER_FAILED && ms < 200,
                   "a peer whose context is gone: %s after %.0f ms", shoal_status_name(st),
                   ms);
            break;
        case 2: /* rank 1's communicator failed (because of rank 2) */
            tl->fail(s[1].ctx, 2, SHOAL_ERR_PEER_FAILED);
            st = send_to(&s[0], &s[1], 1, &ms);
            tap_ok(st == SHOAL_ERR_PEER_FAILED && ms < 200,
                   "a peer whose communicator failed: %s after %.0f ms", shoal_status_name(st),
                   ms);
            break;
        case 3: /* the abort flag while connecting to a silent peer */
            abort_flag = 1;
            st = send_to(&s[0], &s[1], 0, &ms);
            abort_flag = 0;
            tap_ok(st == SHOAL_ERR_ABORTED && ms < 200, "aborted while connecting: %s after "
                   "%.0f ms", shoal_status_name(st), ms);
            break;
        }
        for (int r = 0; r < NR; r++) {
            side_fini(&s[r]);
        }
    }
}

/* A waiter sleeps while its connection is being made: rank 1 listens but never progresses,
 * rank 0 waits as core does (progress, wait_fd, poll up to 1 ms). Its poll must time out
 * rather than return at once (wait_fd used to ring its own eventfd while connecting: a busy
 * loop), and the connection still times out when due. */
static void test_sleep(void)
{
    const uint32_t comm = 0x1b2c0020u;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX];
    static uint8_t x[256];
    side_t s[NR];
    shoal_tl_req_t snd;
    struct rusage r0, r1;
    int polls = 0, ready = 0;
    double t0, t_quiet = -1, cpu_ms = 0, wall_ms;

    for (int r = 0; r < NR; r++) {
        if (side_init(&s[r], r, comm, key_a, 1500) != 0) {
            tap_bail("ib init failed");
            return;
        }
        side_addr(&s[r], addrs[r]);
    }
    for (int r = 0; r < NR; r++) {
        (void)side_connect(&s[r], addrs);
    }
    snd = mkreq(comm, 1, x, sizeof(x));
    t0 = now_ms();
    getrusage(RUSAGE_SELF, &r0);
    tap_ok(tl->isend(s[0].eps[1], &snd) == SHOAL_OK, "sleep: rank 0 posts to a silent rank 1");
    while (!snd.done && now_ms() - t0 < 4000) {
        struct pollfd p = {.events = POLLIN};
        tl->progress(s[0].ctx);
        p.fd = tl->wait_fd(s[0].ctx);
        if (poll(&p, 1, 1) > 0) {
            ready++;
        }
        polls++;
        if (t_quiet < 0 && now_ms() - t0 >= 500) { /* the first 500 ms: the dial's part */
            getrusage(RUSAGE_SELF, &r1);
            t_quiet = now_ms() - t0;
            cpu_ms = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec -
                      r0.ru_stime.tv_sec) * 1e3 +
                     (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec -
                      r0.ru_stime.tv_usec) / 1e3;
            tap_diag("sleep: first %.0f ms: %d polls, %d returned at once, CPU %.1f ms",
                     t_quiet, polls, ready, cpu_ms);
            tap_ok(ready * 10 < polls && cpu_ms < 0.5 * t_quiet,
                   "sleep: the waiter sleeps while connecting (%d of %d polls woke at once, "
                   "CPU %.0f of %.0f ms)", ready, polls, cpu_ms, t_quiet);
        }
    }
    wall_ms = now_ms() - t0;
    tap_ok(snd.done && snd.status == SHOAL_ERR_TIMEOUT && wall_ms >= 1400 && wall_ms < 4000,
           "sleep: the connection still times out when due: %s after %.0f ms (timeout 1500)",
           shoal_status_name(snd.done ? snd.status : SHOAL_IN_PROGRESS), wall_ms);
    for (int r = 0; r < NR; r++) {
        side_fini(&s[r]);
    }
}

int main(void)
{
    alarm(240);
    shoal_config_global_init();
    if (!tl->query()) {
        printf("1..0 # SKIP no RDMA device with an ACTIVE port here\n");
        return 0;
    }
    test_connect();
    test_stranger();
    test_failures();
    test_sleep();
    return tap_done();
}
