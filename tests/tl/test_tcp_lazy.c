/* tcp transport, connections at first use (params.lazy, SHOAL_CONNECT=lazy): real contexts on
 * loopback, driven from one thread (a lazy connect_all never waits for anyone):
 *  - connect_all returns at once with no peer present, and opens no socket;
 *  - only the lower rank posts (a send the higher never receives yet): it connects by itself,
 *    and its send completes, as an eager one would (no dependence on the peer posting);
 *  - both ranks post to each other at once, 1 and 4 sockets per pair: exactly one connection
 *    per socket survives on both sides, and data flows both ways;
 *  - a stranger with the wrong key (another job or tenant: keys are derived from the identity)
 *    posting to rank 0 gets SHOAL_ERR_AUTH and never becomes rank 0's peer; rank 0's real
 *    peer connects afterwards;
 *  - a silent stranger on the listener, which lives on after init, is closed after the hello
 *    deadline;
 *  - a peer that listens but never answers: the send fails with SHOAL_ERR_TIMEOUT after the
 *    timeout, not before, never hangs; a peer whose process is gone (listener closed), or
 *    alive but with its communicator failed: SHOAL_ERR_PEER_FAILED at once; the same for an
 *    eager connect_all to a peer whose listener is gone (it waited for the whole timeout);
 *  - a communicator that fails while its connection is under way connects nobody: the peer
 *    does not get a connection that no message will ever come on; nor does an endpoint that
 *    fails (its own connection refused) while the peer's connection to it is past the hello;
 *  - a failed communicator's destroy waits for its peer to take what it sent: a bulk message
 *    and then the abort notice, which a reset at the close would discard (the close of a
 *    socket with unread data sends one);
 *  - out of file descriptors while a peer waits in the backlog: accept() fails at every
 *    progress call; the warning is logged once a second, not once a call;
 *  - a peer list with a bad address (eager and lazy): SHOAL_ERR_INVALID_ARG, and no file
 *    descriptor of the process is closed;
 *  - no interface of the family asked for: the error names the family as it is set;
 *  - a stranger's forged hello naming the peer, then silence, holds the socket no longer than
 *    the hello deadline once the rank needs it (it waited for the communicator timeout);
 *  - a peer that failed with one of its sockets established: the refusal of the next one
 *    names the rank its abort notice on the established socket blames;
 *  - a frame of another call (the ranks' calls do not match): the receiver's endpoint fails,
 *    and the sender, waiting for the receiver's part, learns it at once. */
#include "tests/tap.h"
#include "transports/tcp/tcp.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const shoal_tl_ops_t *tl = &shoal_tl_tcp_ops;
static const uint8_t key_a[SHOAL_SECRET_BYTES] = "lazy-tcp-secret-of-job-A-32bytes";
static const uint8_t key_b[SHOAL_SECRET_BYTES] = "lazy-tcp-secret-of-job-B-32bytes";
static const volatile int no_abort;

#define NR 3 /* ranks 0..2 of one communicator; a side is one of them */

typedef struct {
    shoal_tl_ctx_t *ctx;
    int rank;
    shoal_ep_t *eps[NR];  /* by rank */
    shoal_status_t st;
} side_t;

static double now_ms(void)
{
    return (double)shoal_time_ns() / 1e6;
}

static int side_init(side_t *s, int rank, uint32_t comm_id, const uint8_t *key, int timeout_ms)
{
    shoal_tl_params_t p = {
        .rank = rank, .nranks = NR, .local_rank = rank, .local_size = NR, .comm_id = comm_id,
        .secret = key, .timeout_ms = timeout_ms, .abort_flag = &no_abort, .lazy = 1,
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

/* connect_all to every other rank of addrs[NR]; returns its duration in ms, or -1. */
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
            lens[n] = SHOAL_TCP_ADDR_BYTES;
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
    (void)tl->ready(s->ctx); /* what the core does after its barrier: a lazy one keeps all */
    return now_ms() - t0;
}

static void side_fini(side_t *s)
{
    if (s->ctx != NULL) {
        tl->fini(s->ctx);
        s->ctx = NULL;
    }
}

static int nsockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    while (d != NULL && (e = readdir(d)) != NULL) {
        char path[300], t[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, t, sizeof(t) - 1);
        if (len > 0) {
            t[len] = '\0';
            n += strncmp(t, "socket:", 7) == 0;
        }
    }
    if (d != NULL) {
        closedir(d);
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

/* Progresses every side in sides[] until all reqs are done or ms pass; 1 if all are done. */
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

/* Ranks 0 and 1 each send 64 KiB to the other at once; 1 if both arrive intact. */
static int both_ways(side_t *a, side_t *b, uint32_t comm_id, uint32_t seq)
{
    static uint8_t sa[65536], sb[65536], ra[65536], rb[65536];
    shoal_tl_req_t s0 = mkreq(comm_id, seq, sa, sizeof(sa)), s1 = mkreq(comm_id, seq, sb,
                                                                           sizeof(sb));
    shoal_tl_req_t r0 = mkreq(comm_id, seq, ra, sizeof(ra)), r1 = mkreq(comm_id, seq, rb,
                                                                           sizeof(rb));
    shoal_tl_req_t *reqs[] = {&s0, &s1, &r0, &r1};
    side_t *sides[] = {a, b};
    memset(sa, 0xa0 + (int)seq, sizeof(sa));
    memset(sb, 0xb0 + (int)seq, sizeof(sb));
    memset(ra, 0, sizeof(ra));
    memset(rb, 0, sizeof(rb));
    tl->irecv(a->eps[b->rank], &r0);
    tl->irecv(b->eps[a->rank], &r1);
    tl->isend(a->eps[b->rank], &s0);
    tl->isend(b->eps[a->rank], &s1);
    return drive(sides, 2, reqs, 4, 10000) && s0.status == SHOAL_OK && s1.status == SHOAL_OK &&
           r0.status == SHOAL_OK && r1.status == SHOAL_OK && memcmp(ra, sb, sizeof(ra)) == 0 &&
           memcmp(rb, sa, sizeof(rb)) == 0;
}

static void test_race(unsigned nsocks)
{
    const uint32_t comm_id = 0x1a2c0001u + nsocks;
    unsigned saved = shoal_tcp_config.nsocks;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX];
    side_t s[2];
    int base = nsockets();

    shoal_tcp_config.nsocks = nsocks;
    if (side_init(&s[0], 0, comm_id, key_a, 10000) != 0 ||
        side_init(&s[1], 1, comm_id, key_a, 10000) != 0) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s[0], addrs[0]);
    side_addr(&s[1], addrs[1]);
    memcpy(addrs[2], addrs[1], SHOAL_TL_ADDR_MAX); /* rank 2 is never used here */
    double ms0 = side_connect(&s[0], addrs), ms1 = side_connect(&s[1], addrs);
    int after_connect = nsockets() - base;
    tap_ok(ms0 >= 0 && ms1 >= 0 && ms0 < 100 && ms1 < 100 && after_connect == 2,
           "%u socket(s) per pair: connect_all returns at once (%.1f, %.1f ms), only the 2 "
           "listeners open (%d sockets)", nsocks, ms0, ms1, after_connect);
    int ok = both_ways(&s[0], &s[1], comm_id, 1);
    /* the loser of a race is closed when its acceptor reads it: a second exchange settles */
    ok = ok && both_ways(&s[0], &s[1], comm_id, 2);
    int socks = nsockets() - base - 2;
    tap_ok(ok && socks == 2 * (int)nsocks && s[0].eps[1]->nestablished == (int)nsocks &&
               s[1].eps[0]->nestablished == (int)nsocks,
           "%u socket(s) per pair: both ranks post to each other at once; data flows both "
           "ways and exactly one connection per socket survives (%d sockets, %d per side)",
           nsocks, socks, nsocks);
    side_fini(&s[0]);
    side_fini(&s[1]);
    shoal_tcp_config.nsocks = saved;
}

/* Ranks 0 and 1 of comm_id with key_a and timeout_ms, each connect_all'd to the other (lazy:
 * nothing is connected yet); 0, or -1 after a bail. */
static int pair_up(side_t *s, uint32_t comm_id, int timeout_ms)
{
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX];
    if (side_init(&s[0], 0, comm_id, key_a, timeout_ms) != 0 ||
        side_init(&s[1], 1, comm_id, key_a, timeout_ms) != 0) {
        tap_bail("tcp init failed");
        return -1;
    }
    side_addr(&s[0], addrs[0]);
    side_addr(&s[1], addrs[1]);
    memcpy(addrs[2], addrs[1], SHOAL_TL_ADDR_MAX); /* rank 2 is never used here */
    side_connect(&s[0], addrs);
    side_connect(&s[1], addrs);
    return 0;
}

/* Only rank 0 posts a send; rank 1 progresses but posts nothing: the lower rank connects. */
static void test_one_sided(void)
{
    const uint32_t comm_id = 0x1a2c0010u;
    uint8_t buf[1000], rb[1000];
    side_t s[2];
    side_t *sides[2] = {&s[0], &s[1]};

    if (pair_up(s, comm_id, 10000) != 0) {
        return;
    }
    memset(buf, 0x42, sizeof(buf));
    shoal_tl_req_t sr = mkreq(comm_id, 7, buf, sizeof(buf)), rr = mkreq(comm_id, 7, rb,
                                                                          sizeof(rb));
    shoal_tl_req_t *reqs[] = {&sr};
    tl->isend(s[0].eps[1], &sr);
    int sent = drive(sides, 2, reqs, 1, 5000);
    tap_ok(sent && sr.status == SHOAL_OK,
           "only the lower rank posts: it connects by itself and its send completes while the "
           "higher rank has posted nothing");
    reqs[0] = &rr;
    tl->irecv(s[1].eps[0], &rr);
    tap_ok(drive(sides, 2, reqs, 1, 5000) && rr.status == SHOAL_OK &&
               memcmp(buf, rb, sizeof(buf)) == 0,
           "the higher rank's receive, posted later, gets the message");
    side_fini(&s[0]);
    side_fini(&s[1]);
}

/* A stranger of another job or tenant (another key) claims rank 2 and sends to rank 0. */
static void test_stranger(void)
{
    const uint32_t comm_id = 0x1a2c0020u;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX], buf[100], rb[100];
    side_t s0, s2, evil;
    side_t *sides[3] = {&s0, &evil, &s2};

    if (side_init(&s0, 0, comm_id, key_a, 8000) != 0 ||
        side_init(&evil, 2, comm_id, key_b, 8000) != 0) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s0, addrs[0]);
    side_addr(&evil, addrs[2]);
    memcpy(addrs[1], addrs[2], SHOAL_TL_ADDR_MAX);
    side_connect(&s0, addrs);
    side_connect(&evil, addrs);
    memset(buf, 0x17, sizeof(buf));
    shoal_tl_req_t es = mkreq(comm_id, 1, buf, sizeof(buf));
    shoal_tl_req_t *reqs[] = {&es};
    double t0 = now_ms();
    tl->isend(evil.eps[0], &es);
    int done = drive(sides, 2, reqs, 1, 6000);
    double dt = now_ms() - t0;
    tap_ok(done && es.status == SHOAL_ERR_AUTH && s0.eps[2]->nestablished == 0 && dt < 4000,
           "a stranger with another job's key posting to rank 0: SHOAL_ERR_AUTH after %.0f ms "
           "(%s), never rank 0's peer", dt, shoal_status_name(es.status));
    /* The real rank 2 (same address book entry would differ in a real job: give rank 0 a
     * fresh communicator in which rank 2 is real) */
    side_fini(&evil);
    side_fini(&s0);
    if (side_init(&s0, 0, comm_id + 1, key_a, 8000) != 0 ||
        side_init(&s2, 2, comm_id + 1, key_a, 8000) != 0 ||
        side_init(&evil, 1, comm_id + 1, key_b, 8000) != 0) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s0, addrs[0]);
    side_addr(&evil, addrs[1]);
    side_addr(&s2, addrs[2]);
    side_connect(&s0, addrs);
    side_connect(&evil, addrs);
    side_connect(&s2, addrs);
    /* the stranger (rank 1's slot, wrong key) and the real rank 2 both send to rank 0 */
    shoal_tl_req_t e2 = mkreq(comm_id + 1, 1, buf, sizeof(buf));
    shoal_tl_req_t g2 = mkreq(comm_id + 1, 1, buf, sizeof(buf));
    shoal_tl_req_t r2 = mkreq(comm_id + 1, 1, rb, sizeof(rb));
    shoal_tl_req_t *all[] = {&e2, &g2, &r2};
    memset(rb, 0, sizeof(rb));
    tl->isend(evil.eps[0], &e2);
    tl->isend(s2.eps[0], &g2);
    tl->irecv(s0.eps[2], &r2);
    done = drive(sides, 3, all, 3, 6000);
    tap_ok(done && e2.status == SHOAL_ERR_AUTH && g2.status == SHOAL_OK &&
               r2.status == SHOAL_OK && memcmp(buf, rb, sizeof(rb)) == 0 &&
               s0.eps[1]->nestablished == 0,
           "beside a stranger refused with SHOAL_ERR_AUTH, the real rank 2 connects to rank 0 "
           "and its message arrives");
    side_fini(&evil);
    side_fini(&s2);
    side_fini(&s0);
}

static void test_silent_stranger(void)
{
    const uint32_t comm_id = 0x1a2c0030u;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX];
    int saved = shoal_tcp_config.hello_timeout_ms;
    side_t s0;
    struct sockaddr_storage ss;
    socklen_t slen;
    shoal_tcp_addr_t a;

    shoal_tcp_config.hello_timeout_ms = 500;
    if (side_init(&s0, 0, comm_id, key_a, 5000) != 0) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s0, addrs[0]);
    memcpy(addrs[1], addrs[0], SHOAL_TL_ADDR_MAX);
    memcpy(addrs[2], addrs[0], SHOAL_TL_ADDR_MAX);
    side_connect(&s0, addrs);
    (void)shoal_tcp_addr_decode(addrs[0], SHOAL_TCP_ADDR_BYTES, &a);
    shoal_tcp_addr_sockaddr(&a, &ss, &slen);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int closed = 0;
    double t0 = now_ms(), dt = 0;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&ss, slen) == 0) {
        while (now_ms() - t0 < 3000 && !closed) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            char b[8];
            tl->progress(s0.ctx);
            if (poll(&pfd, 1, 5) == 1) {
                ssize_t r = recv(fd, b, sizeof(b), 0);
                closed = r == 0 || (r < 0 && errno == ECONNRESET);
            }
        }
        dt = now_ms() - t0;
    }
    tap_ok(closed && dt >= 400 && dt < 2000, "after init the lazy listener lives on; a silent "
           "stranger is closed after the hello deadline (500 ms: %.0f ms)", dt);
    if (fd >= 0) {
        close(fd);
    }
    side_fini(&s0);
    shoal_tcp_config.hello_timeout_ms = saved;
}

static void test_unanswered(void)
{
    const uint32_t comm_id = 0x1a2c0040u;
    uint8_t buf[64];
    side_t s[2];
    side_t *sides[1] = {&s[0]};

    if (pair_up(s, comm_id, 1500) != 0) {
        return;
    }
    /* rank 1 listens (its kernel accepts) but never progresses: nobody answers the hello */
    shoal_tl_req_t r = mkreq(comm_id, 1, buf, sizeof(buf));
    shoal_tl_req_t *reqs[] = {&r};
    double t0 = now_ms();
    tl->irecv(s[0].eps[1], &r);
    int done = drive(sides, 1, reqs, 1, 6000);
    double dt = now_ms() - t0;
    tap_ok(done && r.status == SHOAL_ERR_TIMEOUT && dt >= 1400 && dt < 3500,
           "a peer that never answers: SHOAL_ERR_TIMEOUT after %.0f ms (timeout 1500 ms), %s",
           dt, shoal_status_name(r.status));
    side_fini(&s[0]);
    /* rank 1 again, its peer gone: rank 0's listener is closed */
    r = mkreq(comm_id, 2, buf, sizeof(buf));
    sides[0] = &s[1];
    t0 = now_ms();
    tl->isend(s[1].eps[0], &r);
    done = drive(sides, 1, reqs, 1, 6000);
    dt = now_ms() - t0;
    tap_ok(done && r.status == SHOAL_ERR_PEER_FAILED && dt < 1000,
           "a peer whose listener is gone: SHOAL_ERR_PEER_FAILED after %.0f ms (%s)", dt,
           shoal_status_name(r.status));
    side_fini(&s[1]);
}

/* Eager: rank 0 published its address and is gone before rank 1 connects (its process died
 * or its init failed). Its port refuses every connection: rank 1's connect_all fails with
 * SHOAL_ERR_PEER_FAILED at once, as a lazy one does, not SHOAL_ERR_TIMEOUT at the end of the
 * communicator timeout (300 s by default). */
static void test_gone_eager(void)
{
    shoal_tl_params_t p = {
        .rank = 0, .nranks = 2, .local_rank = 0, .local_size = 2, .comm_id = 0x1a2c00c0u,
        .secret = key_a, .timeout_ms = 5000, .abort_flag = &no_abort,
    };
    shoal_tl_ctx_t *c0 = NULL, *c1 = NULL;
    uint8_t a0[SHOAL_TL_ADDR_MAX];
    size_t len = sizeof(a0);
    const void *a[1] = {a0};
    int peer = 0;
    shoal_ep_t *ep;

    if (tl->init(&p, &c0) != SHOAL_OK || tl->address(c0, a0, &len) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    p.rank = 1;
    p.local_rank = 1;
    if (tl->init(&p, &c1) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    tl->fini(c0);
    double t0 = now_ms();
    shoal_status_t st = tl->connect_all(c1, &peer, 1, a, &len, &ep);
    double dt = now_ms() - t0;
    tl->fini(c1);
    tap_ok(st == SHOAL_ERR_PEER_FAILED && dt < 1000, "eager: a peer whose listener is gone: %s "
           "after %.0f ms, not at the 5000 ms timeout", shoal_status_name(st), dt);
}

/* Rank 1 gets a frame of another call from rank 0 (SHOAL_ERR_PROTOCOL: the ranks' calls do
 * not match) and its endpoint fails; rank 0, which waits for rank 1's part, learns at once. No
 * abort notice goes on such an endpoint, and its sockets stayed open until destroy: rank 0
 * waited for its timeout (or for a destroy that an application may not make). */
static void test_mismatch_told(void)
{
    const uint32_t comm_id = 0x1a2c0051u;
    uint8_t buf[64], rbuf[64], back[64];
    side_t s[2];
    side_t *sides[2] = {&s[0], &s[1]};

    if (pair_up(s, comm_id, 8000) != 0) {
        return;
    }
    memset(buf, 7, sizeof(buf));
    shoal_tl_req_t sr = mkreq(comm_id, 5, buf, sizeof(buf));
    shoal_tl_req_t rr = mkreq(comm_id, 6, rbuf, sizeof(rbuf)); /* another call's */
    shoal_tl_req_t wr = mkreq(comm_id, 7, back, sizeof(back));
    shoal_tl_req_t *first[] = {&sr, &rr};
    shoal_tl_req_t *then[] = {&wr};
    tl->isend(s[0].eps[1], &sr);
    tl->irecv(s[1].eps[0], &rr);
    int done = drive(sides, 2, first, 2, 4000);
    tap_ok(done && sr.status == SHOAL_OK && rr.status == SHOAL_ERR_PROTOCOL,
           "rank 1 refuses a frame of another call: %s (send %s)", shoal_status_name(rr.status),
           shoal_status_name(sr.status));
    double t0 = now_ms();
    tl->irecv(s[0].eps[1], &wr);
    done = drive(sides, 2, then, 1, 4000);
    double dt = now_ms() - t0;
    tap_ok(done && wr.status == SHOAL_ERR_PEER_FAILED && dt < 1000,
           "rank 0, waiting for rank 1's part, learns it at once: %s after %.0f ms (not done "
           "after 4000 ms before)", done ? shoal_status_name(wr.status) : "not done", dt);
    side_fini(&s[0]);
    side_fini(&s[1]);
}

/* Rank 1 is alive and progresses, but its communicator failed: rank 0 learns at once. */
static void test_failed_peer(void)
{
    const uint32_t comm_id = 0x1a2c0050u;
    uint8_t buf[64];
    side_t s[2];
    side_t *sides[2] = {&s[0], &s[1]};

    if (pair_up(s, comm_id, 8000) != 0) {
        return;
    }
    tl->fail(s[1].ctx, 1, SHOAL_ERR_ABORTED);
    shoal_tl_req_t r = mkreq(comm_id, 1, buf, sizeof(buf));
    shoal_tl_req_t *reqs[] = {&r};
    double t0 = now_ms();
    tl->isend(s[0].eps[1], &r);
    int done = drive(sides, 2, reqs, 1, 6000);
    double dt = now_ms() - t0;
    tap_ok(done && r.status == SHOAL_ERR_PEER_FAILED && dt < 1000,
           "a live peer whose communicator failed stops listening: SHOAL_ERR_PEER_FAILED "
           "after %.0f ms, not the 8000 ms timeout (%s)", dt, shoal_status_name(r.status));
    side_fini(&s[0]);
    side_fini(&s[1]);
}

/* Rank 0's communicator fails while its connection to rank 1 is under way (its send started
 * it). A failed context connects nobody any more: rank 1, which would take that connection
 * and then wait on it for rank 0's messages until its timeout (8 s here), fails its receive
 * from rank 0 with SHOAL_ERR_PEER_FAILED at once. */
static void test_fail_connecting(void)
{
    const uint32_t comm_id = 0x1a2c00d0u;
    uint8_t sbuf[64], rbuf[64];
    side_t s[2];
    side_t *sides[2] = {&s[0], &s[1]};

    if (pair_up(s, comm_id, 8000) != 0) {
        return;
    }
    shoal_tl_req_t sr = mkreq(comm_id, 1, sbuf, sizeof(sbuf));
    tl->isend(s[0].eps[1], &sr);
    tl->progress(s[0].ctx); /* starts rank 0's connection */
    tl->fail(s[0].ctx, 0, SHOAL_ERR_ABORTED);
    /* both progress on, as a failed communicator's may, until rank 0's connection is due */
    for (double t = now_ms(); now_ms() - t < 200;) {
        tl->progress(s[0].ctx);
        tl->progress(s[1].ctx);
        sched_yield();
    }
    shoal_tl_req_t rr = mkreq(comm_id, 1, rbuf, sizeof(rbuf));
    shoal_tl_req_t *reqs[] = {&rr};
    double t0 = now_ms();
    tl->irecv(s[1].eps[0], &rr);
    int done = drive(sides, 2, reqs, 1, 3000);
    double dt = now_ms() - t0;
    tap_ok(sr.status == SHOAL_ERR_ABORTED && done && rr.status == SHOAL_ERR_PEER_FAILED &&
               dt < 1000,
           "a communicator that fails while connecting connects nobody: its peer's receive "
           "fails with SHOAL_ERR_PEER_FAILED after %.0f ms (%s), rank 0 holds %d socket(s) "
           "to it", dt, done ? shoal_status_name(rr.status) : "still waiting",
           s[0].eps[1]->nestablished);
    side_fini(&s[0]);
    side_fini(&s[1]);
}

/* Rank 1 (raw sockets with the job's key) connects socket 0 to rank 0 and is past its hello
 * when rank 0's endpoint to rank 1 fails: rank 0's own connection of socket 1 is refused (the
 * address rank 1 published no longer listens). Rank 1 then sends its proof: rank 0 must close
 * the connection without its proof, not finish the handshake and establish a socket of the
 * failed endpoint (rank 1 would have a connection that no message ever comes on, and its
 * requests would wait for their timeout). */
static void test_fail_accepting(void)
{
    const uint32_t comm_id = 0x1a2c00e0u;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX], sbuf[64];
    uint8_t hello[SHOAL_TCP_HELLO_BYTES], chal[SHOAL_TCP_CHALLENGE_BYTES];
    uint8_t nonce[SHOAL_TCP_NONCE_BYTES], proof[SHOAL_HMAC_BYTES], got[64];
    side_t s0, gone;
    side_t *sides[1] = {&s0};
    struct sockaddr_storage ss;
    socklen_t slen;
    shoal_tcp_addr_t a;
    size_t ngot = 0, nchal = 0;
    int closed = 0;

    if (side_init(&s0, 0, comm_id, key_a, 5000) != 0 ||
        side_init(&gone, 1, comm_id, key_a, 5000) != 0) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s0, addrs[0]);
    side_addr(&gone, addrs[1]);
    side_fini(&gone); /* its port refuses from now on */
    memcpy(addrs[2], addrs[1], SHOAL_TL_ADDR_MAX);
    side_connect(&s0, addrs);
    int nsocks = s0.eps[1]->nsocks;
    shoal_tcp_hello_t h = {.magic = SHOAL_TCP_HELLO_MAGIC, .version = SHOAL_TCP_HELLO_VERSION,
                           .length = SHOAL_TCP_HELLO_BYTES, .comm_id = comm_id, .rank = 1,
                           .sock_idx = 0, .nsocks = (uint32_t)nsocks};
    memset(nonce, 0x3c, sizeof(nonce));
    memcpy(h.nonce, nonce, sizeof(nonce));
    shoal_tcp_hello_encode(&h, hello);
    (void)shoal_tcp_addr_decode(addrs[0], SHOAL_TCP_ADDR_BYTES, &a);
    shoal_tcp_addr_sockaddr(&a, &ss, &slen);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&ss, slen) != 0 ||
        send(fd, hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello)) {
        tap_bail("cannot connect to rank 0");
        return;
    }
    /* rank 0 takes the hello and sends its challenge */
    for (double t = now_ms(); now_ms() - t < 2000 && nchal < sizeof(chal);) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        tl->progress(s0.ctx);
        if (poll(&pfd, 1, 1) == 1) {
            ssize_t r = recv(fd, chal + nchal, sizeof(chal) - nchal, 0);
            if (r <= 0) {
                break;
            }
            nchal += (size_t)r;
        }
    }
    /* rank 0's send connects socket 1 itself (socket 0 is under way): refused, it fails */
    shoal_tl_req_t sr = mkreq(comm_id, 1, sbuf, sizeof(sbuf));
    shoal_tl_req_t *reqs[] = {&sr};
    memset(sbuf, 0, sizeof(sbuf));
    tl->isend(s0.eps[1], &sr);
    int done = drive(sides, 1, reqs, 1, 3000);
    shoal_tcp_transcript_t t = {.comm_id = comm_id, .nonce_c = nonce, .nonce_a = chal,
                                .from = 1, .to = 0, .sock_idx = 0, .nsocks = (uint32_t)nsocks};
    (void)shoal_tcp_proof(key_a, "shoal-tcp", &t, proof);
    (void)send(fd, proof, sizeof(proof), MSG_NOSIGNAL);
    for (double t0 = now_ms(); now_ms() - t0 < 1000 && !closed;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        tl->progress(s0.ctx);
        if (poll(&pfd, 1, 1) == 1) {
            ssize_t r = recv(fd, got, sizeof(got) - ngot, 0);
            closed = r == 0 || (r < 0 && errno == ECONNRESET);
            ngot += r > 0 ? (size_t)r : 0;
        }
    }
    tap_ok(nchal == sizeof(chal) && done && sr.status == SHOAL_ERR_PEER_FAILED && closed &&
               ngot == 0 && s0.eps[1]->nestablished == 0,
           "an endpoint that failed (%s) while the peer's connection to it was past the hello "
           "does not finish it: %s, %zu bytes of its proof sent, %d socket(s) established",
           done ? shoal_status_name(sr.status) : "still waiting",
           closed ? "closed" : "not closed", ngot, s0.eps[1]->nestablished);
    close(fd);
    side_fini(&s0);
}

/* Rank 0 has unread data from rank 1 (a message it never receives) and sends rank 1 a 256 KiB
 * message that rank 1 does not read yet: most of it waits in rank 0's send queue. Rank 0's
 * communicator then fails because of rank 2 (its abort notice queues behind the message) and
 * is destroyed. Rank 1 (a child process) starts reading 50 ms later: it must get the whole
 * message and then the notice naming rank 2. Without the destroy's wait, the close sends a
 * reset that discards the queue, and rank 1 reads a reset in the middle of the message. */
static void test_linger(void)
{
    const uint32_t comm_id = 0x1a2c0030u;
    const size_t mlen = 256 << 10;
    unsigned saved = shoal_tcp_config.nsocks;
    uint8_t small[1000];
    uint8_t *msg = malloc(mlen);
    side_t s[2];
    side_t *sides[2] = {&s[0], &s[1]};
    int sndbuf = 8 << 20, status = 0;
    pid_t pid;

    if (msg == NULL) {
        tap_bail("out of memory");
    }
    shoal_tcp_config.nsocks = 1;
    if (pair_up(s, comm_id, 10000) != 0) {
        return;
    }
    if (!both_ways(&s[0], &s[1], comm_id, 1)) {
        tap_bail("no connection between ranks 0 and 1");
        return;
    }
    /* rank 1's small message, never received by rank 0: its unread data */
    shoal_tl_req_t sm = mkreq(comm_id, 2, small, sizeof(small));
    shoal_tl_req_t *smp[] = {&sm};
    memset(small, 0x5a, sizeof(small));
    tl->isend(s[1].eps[0], &sm);
    drive(sides, 2, smp, 1, 5000);
    /* rank 0's kernel takes the whole message at once */
    (void)setsockopt(s[0].eps[1]->fds[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    fflush(stdout);
    pid = fork();
    if (pid == 0) { /* rank 1 */
        uint8_t *got = calloc(1, mlen), one;
        shoal_tl_req_t rm = mkreq(comm_id, 3, got, mlen), rn = mkreq(comm_id, 4, &one, 1);
        shoal_tl_req_t *rr[] = {&rm, &rn};
        int ok;
        side_fini(&s[0]); /* rank 0's sockets are rank 0's: its close must close them */
        usleep(50000);
        tl->irecv(s[1].eps[0], &rm);
        tl->irecv(s[1].eps[0], &rn);
        drive(&sides[1], 1, rr, 2, 5000);
        ok = got != NULL && rm.status == SHOAL_OK && got[0] == 0x3c && got[mlen - 1] == 0x3c &&
             rn.status == SHOAL_ERR_PEER_FAILED && rn.culprit == 2;
        if (!ok) {
            fprintf(stderr, "rank 1: message %s, then %s naming rank %d\n",
                    shoal_status_name(rm.status), shoal_status_name(rn.status), rn.culprit);
        }
        _exit(ok ? 0 : 1);
    }
    if (pid < 0) {
        tap_bail("fork: %s", strerror(errno));
        return;
    }
    /* rank 0 */
    memset(msg, 0x3c, mlen);
    shoal_tl_req_t m = mkreq(comm_id, 3, msg, mlen);
    shoal_tl_req_t *mp[] = {&m};
    tl->isend(s[0].eps[1], &m);
    drive(sides, 1, mp, 1, 2000);
    tl->fail(s[0].ctx, 2, SHOAL_ERR_PEER_FAILED);
    double t0 = now_ms();
    side_fini(&s[0]);
    double fini_ms = now_ms() - t0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    tap_ok(m.status != SHOAL_ERR_TIMEOUT && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "a failed communicator's destroy: the peer, reading 50 ms later, got the whole "
           "256 KiB message and then the abort notice naming rank 2");
    tap_ok(fini_ms < 1000, "... the destroy waited %.0f ms for it (200 ms at most once the "
           "peer stops reading)", fini_ms);
    side_fini(&s[1]);
    free(msg);
    shoal_tcp_config.nsocks = saved;
}

/* Rank 0 connects to rank 1, then the process runs out of file descriptors: rank 1's accept()
 * fails at every progress call while rank 0's connection waits in its backlog. */
static void test_emfile(void)
{
    const uint32_t comm_id = 0x1a2c0070u;
    uint8_t buf[100];
    side_t s[2];
    side_t *sides[2] = {&s[0], &s[1]};
    tap_fds_t spare;
    int out, calls = 0, lines;
    tap_log_t log;

    if (pair_up(s, comm_id, 10000) != 0) {
        return;
    }
    shoal_tl_req_t sr = mkreq(comm_id, 1, buf, sizeof(buf));
    shoal_tl_req_t *reqs[] = {&sr};
    tl->isend(s[0].eps[1], &sr);
    drive(sides, 1, reqs, 1, 100); /* rank 0 connects: it waits in rank 1's backlog */
    if (tap_log_begin(&log) != 0) {
        tap_bail("no temporary file for the log");
        return;
    }
    out = tap_fds_exhaust(&spare);
    uint64_t t0 = shoal_time_ns();
    while (shoal_time_ns() - t0 < 300000000ull) {
        tl->progress(s[1].ctx);
        calls++;
    }
    tap_fds_restore(&spare);
    tap_log_end(&log);
    lines = tap_log_count(&log, "accept(", NULL);
    tap_log_close(&log);
    tap_ok(out && lines >= 1 && lines <= 2, "out of file descriptors, accept() failing at each of %d "
           "progress calls in 300 ms: %d warning(s) in the log", calls, lines);
    side_fini(&s[0]);
    side_fini(&s[1]);
}

/* connect_all with the address of rank 1 garbage: refused before any connection, and the
 * endpoints after the bad one (never set up) close nothing. fd 0 is a pipe here: a close of
 * it shows. */
static void test_bad_address(int lazy)
{
    const uint32_t comm_id = 0x1a2c0090u + (uint32_t)lazy;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX];
    shoal_tl_params_t p = {
        .rank = 0, .nranks = 4, .local_rank = 0, .local_size = 4, .comm_id = comm_id,
        .secret = key_a, .timeout_ms = 2000, .abort_flag = &no_abort, .lazy = lazy,
    };
    int peers[3] = {1, 2, 3}, pfd[2], saved0 = dup(0);
    const void *a[3];
    size_t lens[3] = {SHOAL_TCP_ADDR_BYTES, SHOAL_TCP_ADDR_BYTES, SHOAL_TCP_ADDR_BYTES};
    shoal_ep_t *eps[3];
    shoal_tl_ctx_t *ctx = NULL;
    shoal_status_t st = SHOAL_ERR_INTERNAL;

    if (saved0 < 0 || pipe(pfd) != 0 || dup2(pfd[0], 0) != 0 ||
        tl->init(&p, &ctx) != SHOAL_OK) {
        tap_bail("test setup failed");
        return;
    }
    side_t s = {.ctx = ctx};
    side_addr(&s, addrs[0]);
    memcpy(addrs[2], addrs[0], SHOAL_TL_ADDR_MAX);
    memset(addrs[1], 0xee, SHOAL_TL_ADDR_MAX); /* rank 2's: no magic */
    a[0] = addrs[0];
    a[1] = addrs[1];
    a[2] = addrs[2];
    st = tl->connect_all(ctx, peers, 3, a, lens, eps);
    int fd0_open = fcntl(0, F_GETFD) >= 0;
    tl->fini(ctx);
    dup2(saved0, 0);
    close(saved0);
    close(pfd[0]);
    close(pfd[1]);
    tap_ok(st == SHOAL_ERR_INVALID_ARG && fd0_open, "%s: a bad address in the peer list: %s, "
           "and fd 0 is %s", lazy ? "lazy" : "eager", shoal_status_name(st),
           fd0_open ? "still open" : "closed");
}

/* SHOAL_SOCKET_IFNAME names no interface: init fails, and the error names the family as the
 * user sets it (it printed the enum's index: "SHOAL_SOCKET_FAMILY=2" for AF_INET6, which is
 * AF_INET's number). */
static void test_no_interface(void)
{
    const char *saved_if = shoal_tcp_config.ifname;
    int saved_fam = shoal_tcp_config.family, named;
    shoal_tl_params_t p = {
        .rank = 0, .nranks = 2, .local_rank = 0, .local_size = 2, .comm_id = 0x1a2c00b0u,
        .secret = key_a, .timeout_ms = 2000, .abort_flag = &no_abort,
    };
    shoal_tl_ctx_t *ctx = NULL;
    shoal_status_t st;
    tap_log_t log;

    if (tap_log_begin(&log) != 0) {
        tap_bail("no temporary file for the log");
        return;
    }
    shoal_tcp_config.ifname = "=shoal-no-such-if";
    shoal_tcp_config.family = SHOAL_TCP_FAMILY_INET6;
    st = tl->init(&p, &ctx);
    tap_log_end(&log);
    named = tap_log_count(&log, "SHOAL_SOCKET_FAMILY=AF_INET6)", NULL);
    tap_log_close(&log);
    if (ctx != NULL) {
        tl->fini(ctx);
    }
    shoal_tcp_config.ifname = saved_if;
    shoal_tcp_config.family = saved_fam;
    tap_ok(st == SHOAL_ERR_TRANSPORT && named == 1, "no interface of the family: %s, the "
           "error names SHOAL_SOCKET_FAMILY=AF_INET6 (%d line)", shoal_status_name(st), named);
}

/* A stranger that knows the communicator (its id travels in every header) sends one hello
 * naming rank `claim`, socket 0, to the other rank, and goes silent. That rank then sends to
 * `claim`, which progresses but posts nothing: the forged hello must not hold the socket for
 * the whole communicator timeout (the rank waited for it instead of connecting itself, 10 s
 * here, 300 s by default); it gets the hello deadline (500 ms) like any silent stranger. */
static void test_forged_hello(int claim)
{
    const uint32_t comm_id = 0x1a2c00a0u + (uint32_t)claim;
    int saved = shoal_tcp_config.hello_timeout_ms, other = 1 - claim;
    uint8_t b[SHOAL_TCP_HELLO_BYTES], buf[100];
    struct sockaddr_storage ss;
    socklen_t slen;
    shoal_tcp_addr_t a;
    side_t s[2];
    side_t *sides[2] = {&s[0], &s[1]};
    shoal_tcp_hello_t h = {
        .magic = SHOAL_TCP_HELLO_MAGIC, .version = SHOAL_TCP_HELLO_VERSION,
        .length = SHOAL_TCP_HELLO_BYTES, .comm_id = comm_id, .rank = (uint32_t)claim,
        .sock_idx = 0, .nsocks = shoal_tcp_config.nsocks,
    };

    shoal_tcp_config.hello_timeout_ms = 500;
    if (pair_up(s, comm_id, 10000) != 0) {
        shoal_tcp_config.hello_timeout_ms = saved;
        return;
    }
    uint8_t addr[SHOAL_TL_ADDR_MAX];
    side_addr(&s[other], addr);
    (void)shoal_tcp_addr_decode(addr, SHOAL_TCP_ADDR_BYTES, &a);
    shoal_tcp_addr_sockaddr(&a, &ss, &slen);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    shoal_tcp_hello_encode(&h, b);
    int forged = fd >= 0 && connect(fd, (struct sockaddr *)&ss, slen) == 0 &&
                 send(fd, b, sizeof(b), MSG_NOSIGNAL) == (ssize_t)sizeof(b);
    for (int i = 0; i < 100; i++) { /* the hello is taken: the slot is past it */
        tl->progress(s[other].ctx);
        usleep(1000);
    }
    memset(buf, 0x5a, sizeof(buf));
    shoal_tl_req_t sr = mkreq(comm_id, 1, buf, sizeof(buf));
    shoal_tl_req_t *reqs[] = {&sr};
    double t0 = now_ms();
    tl->isend(s[other].eps[claim], &sr);
    int done = drive(sides, 2, reqs, 1, 4000);
    double dt = now_ms() - t0;
    tap_ok(forged && done && sr.status == SHOAL_OK && dt < 2500,
           "a stranger's forged hello naming rank %d, then silence: rank %d's send to it "
           "completes in %.0f ms (%s), not at the communicator timeout (10 s)", claim, other,
           dt, done ? shoal_status_name(sr.status) : "not done");
    if (fd >= 0) {
        close(fd);
    }
    side_fini(&s[0]);
    side_fini(&s[1]);
    shoal_tcp_config.hello_timeout_ms = saved;
}

/* Rank 1 (raw sockets with the job's key) has connected socket 0 of its 2 to rank 0 when its
 * communicator fails because of rank 2: it sends its abort notice on socket 0 and stops
 * listening, as a failing lazy context does. Rank 0 then sends to rank 1: its connection of
 * socket 1 is refused. The failure must name rank 2 from the notice waiting on socket 0 (it
 * named nobody: the core blamed rank 1). */
static void test_partial_notice(void)
{
    const uint32_t comm_id = 0x1a2c00b0u;
    uint8_t addrs[NR][SHOAL_TL_ADDR_MAX], sbuf[64], got[SHOAL_HMAC_BYTES];
    uint8_t hello[SHOAL_TCP_HELLO_BYTES], chal[SHOAL_TCP_CHALLENGE_BYTES];
    uint8_t nonce[SHOAL_TCP_NONCE_BYTES], proof[SHOAL_HMAC_BYTES], notice[SHOAL_WIRE_HDR_BYTES];
    unsigned saved = shoal_tcp_config.nsocks;
    side_t s0, gone;
    side_t *sides[1] = {&s0};
    struct sockaddr_storage ss;
    socklen_t slen;
    shoal_tcp_addr_t a;
    size_t ngot = 0, nchal = 0;

    shoal_tcp_config.nsocks = 2;
    if (side_init(&s0, 0, comm_id, key_a, 5000) != 0 ||
        side_init(&gone, 1, comm_id, key_a, 5000) != 0) {
        shoal_tcp_config.nsocks = saved;
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s0, addrs[0]);
    side_addr(&gone, addrs[1]);
    side_fini(&gone); /* its port refuses from now on */
    memcpy(addrs[2], addrs[1], SHOAL_TL_ADDR_MAX);
    side_connect(&s0, addrs);
    shoal_tcp_hello_t h = {.magic = SHOAL_TCP_HELLO_MAGIC, .version = SHOAL_TCP_HELLO_VERSION,
                           .length = SHOAL_TCP_HELLO_BYTES, .comm_id = comm_id, .rank = 1,
                           .sock_idx = 0, .nsocks = 2};
    memset(nonce, 0x4d, sizeof(nonce));
    memcpy(h.nonce, nonce, sizeof(nonce));
    shoal_tcp_hello_encode(&h, hello);
    (void)shoal_tcp_addr_decode(addrs[0], SHOAL_TCP_ADDR_BYTES, &a);
    shoal_tcp_addr_sockaddr(&a, &ss, &slen);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&ss, slen) != 0 ||
        send(fd, hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello)) {
        shoal_tcp_config.nsocks = saved;
        tap_bail("cannot connect to rank 0");
        return;
    }
    for (double t = now_ms(); now_ms() - t < 2000 && ngot < sizeof(got);) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        tl->progress(s0.ctx);
        if (poll(&pfd, 1, 1) != 1) {
            continue;
        }
        ssize_t r = nchal < sizeof(chal) ? recv(fd, chal + nchal, sizeof(chal) - nchal, 0)
                                         : recv(fd, got + ngot, sizeof(got) - ngot, 0);
        if (r <= 0) {
            break;
        }
        if (nchal < sizeof(chal)) {
            nchal += (size_t)r;
            if (nchal == sizeof(chal)) { /* the challenge: our proof */
                shoal_tcp_transcript_t t = {.comm_id = comm_id, .nonce_c = nonce,
                                            .nonce_a = chal, .from = 1, .to = 0,
                                            .sock_idx = 0, .nsocks = 2};
                (void)shoal_tcp_proof(key_a, "shoal-tcp", &t, proof);
                (void)send(fd, proof, sizeof(proof), MSG_NOSIGNAL);
            }
        } else {
            ngot += (size_t)r;
        }
    }
    shoal_wire_hdr_t ab = {.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                           .type = SHOAL_WIRE_ABORT, .comm_id = comm_id, .chunk = 2};
    shoal_wire_encode(&ab, notice);
    int partial = ngot == sizeof(got) && s0.eps[1]->nestablished == 1 &&
                  send(fd, notice, sizeof(notice), MSG_NOSIGNAL) == (ssize_t)sizeof(notice);
    shoal_tl_req_t sr = mkreq(comm_id, 1, sbuf, sizeof(sbuf));
    shoal_tl_req_t *reqs[] = {&sr};
    memset(sbuf, 0, sizeof(sbuf));
    tl->isend(s0.eps[1], &sr);
    int done = drive(sides, 1, reqs, 1, 3000);
    tap_ok(partial && done && sr.status == SHOAL_ERR_PEER_FAILED && sr.culprit == 2,
           "socket 0 of 2 established, the peer's notice naming rank 2 on it, socket 1 "
           "refused: the send fails with %s naming rank %d (want SHOAL_ERR_PEER_FAILED, 2)",
           done ? shoal_status_name(sr.status) : "still waiting", sr.culprit);
    close(fd);
    side_fini(&s0);
    shoal_tcp_config.nsocks = saved;
}

int main(void)
{
    alarm(120);
    shoal_config_global_init();
    test_race(1);
    test_race(4);
    test_one_sided();
    test_stranger();
    test_silent_stranger();
    test_unanswered();
    test_gone_eager();
    test_failed_peer();
    test_mismatch_told();
    test_fail_connecting();
    test_fail_accepting();
    test_linger();
    test_emfile();
    test_bad_address(0);
    test_bad_address(1);
    test_no_interface();
    test_forged_hello(1);
    test_forged_hello(0);
    test_partial_notice();
    return tap_done();
}
