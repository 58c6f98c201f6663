/* The ib out-of-band handshake (transports/common/oob.c) under attack, over loopback (no RDMA
 * device needed):
 *  - verify first, then prove: a stranger who sends a valid hello gets the acceptor's nonce
 *    and nothing else; the acceptor's proof only goes to a connector that proved itself;
 *  - the connector's bytes of a real handshake, recorded, replayed to a later acceptor with
 *    the same secret and communicator: refused;
 *  - many silent strangers on the listener do not delay a real connector (they used to be
 *    served one at a time, 5 s each), and a connector closed early reconnects;
 *  - the non-blocking dial (lazy ib connections, shoal_oob_dial_*) against the acceptor, both
 *    driven in one thread without blocking: it authenticates; a dial with another secret is
 *    closed right after its proof (proved, not refused); one the acceptor does not expect is
 *    closed before it (neither); a port nobody listens on is refused; an acceptor with
 *    another secret never gets our proof accepted;
 *  - a stranger that connects as fast as it can: a real connector is still served, and a
 *    non-blocking acceptor call (deadline now, as lazy ib's progress makes) returns at once;
 *  - out of file descriptors with a connection in the backlog: accept() fails at every call,
 *    and is logged once a second, not once a call. */
#include "tenant/breaker.h"
#include "tests/tap.h"
#include "transports/common/oob.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const uint8_t secret[SHOAL_SECRET_BYTES] = "oob-adversarial-secret-32-bytes!";
#define COMM 0x51ab0001u

static shoal_oob_auth_t auth_of(uint32_t self)
{
    return (shoal_oob_auth_t){.secret = secret, .label = "shoal-ib", .comm_id = COMM,
                              .self = self};
}

static int expect_3(void *arg, uint32_t r)
{
    (void)arg;
    return r == 3;
}

static int raw_connect(const shoal_oob_addr_t *a)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(a->port)};
    memcpy(&sin.sin_addr, a->ip, 4);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Bytes that arrive on fd within ms (until EOF or silence); -1 if none and no EOF. */
static ssize_t raw_drain(int fd, uint8_t *buf, size_t len, int ms, int *eof_p)
{
    size_t got = 0;
    *eof_p = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ms) != 1) {
            return (ssize_t)got;
        }
        ssize_t r = recv(fd, buf + got, len - got, 0);
        if (r <= 0) {
            *eof_p = 1;
            return (ssize_t)got;
        }
        got += (size_t)r;
        if (got == len) {
            return (ssize_t)got;
        }
    }
}

/* A hello as the oob protocol lays it out: magic, version, comm, from, to, nonce. */
static void hello_make(uint8_t h[52], uint32_t from, uint32_t to)
{
    shoal_put_le(h, 0x424f4853u, 4);
    shoal_put_le(h + 4, 2, 4);
    shoal_put_le(h + 8, COMM, 4);
    shoal_put_le(h + 12, from, 4);
    shoal_put_le(h + 16, to, 4);
    shoal_random_bytes(h + 20, 32);
}

typedef struct {
    int lfd;
    shoal_status_t st;
    uint32_t peer;
    int fd;
} acc_t;

/* The sequential acceptor (oob.c's shoal_oob_auth_accept) on one connection. */
static void *acc_one(void *arg)
{
    acc_t *a = arg;
    shoal_oob_auth_t au = auth_of(1);
    char why[160];
    int fd = -1;
    a->st = shoal_oob_accept(a->lfd, shoal_deadline_ns(5000), NULL, &fd);
    if (a->st == SHOAL_OK) {
        a->st = shoal_oob_auth_accept(fd, &au, expect_3, NULL, &a->peer, shoal_deadline_ns(5000),
                                      why, sizeof(why));
        close(fd);
    }
    return NULL;
}

static void test_verify_first(const shoal_oob_addr_t *la, int lfd)
{
    acc_t a = {.lfd = lfd};
    pthread_t th;
    uint8_t h[52], buf[128], junk[SHOAL_HMAC_BYTES];
    int eof;
    hello_make(h, 3, 1);
    pthread_create(&th, NULL, acc_one, &a);
    int fd = raw_connect(la);
    ssize_t n = fd >= 0 && send(fd, h, sizeof(h), MSG_NOSIGNAL) == (ssize_t)sizeof(h)
                    ? raw_drain(fd, buf, sizeof(buf), 500, &eof) : -1;
    tap_is_int((int)n, SHOAL_OOB_NONCE_BYTES, "a stranger's valid hello gets the acceptor's "
               "nonce and nothing more (no proof before the connector proved itself)");
    memset(junk, 0x33, sizeof(junk));
    n = fd >= 0 && send(fd, junk, sizeof(junk), MSG_NOSIGNAL) == (ssize_t)sizeof(junk)
            ? raw_drain(fd, buf, sizeof(buf), 3000, &eof) : -1;
    tap_ok(n == 0 && eof, "a wrong proof: closed without a proof of the acceptor's");
    if (fd >= 0) {
        close(fd);
    }
    pthread_join(th, NULL);
    tap_is_int(a.st, SHOAL_ERR_AUTH, "the acceptor reports SHOAL_ERR_AUTH");
}

/* A real connector through a recording relay; then its bytes replayed to a new acceptor. */
typedef struct {
    int lfd;
    shoal_oob_addr_t up;
    uint8_t c2a[256];
    size_t n;
} relay_t;

static void *relay_run(void *arg)
{
    relay_t *r = arg;
    int c = -1, u = raw_connect(&r->up);
    struct pollfd p = {.fd = r->lfd, .events = POLLIN};
    if (u < 0 || poll(&p, 1, 5000) != 1 || (c = accept(r->lfd, NULL, NULL)) < 0) {
        return NULL;
    }
    for (int open = 2; open > 0;) {
        struct pollfd q[2] = {{.fd = c, .events = POLLIN}, {.fd = u, .events = POLLIN}};
        uint8_t b[512];
        if (poll(q, 2, 5000) <= 0) {
            break;
        }
        for (int k = 0; k < 2; k++) {
            if (q[k].revents == 0 || q[k].fd < 0) {
                continue;
            }
            ssize_t m = recv(q[k].fd, b, sizeof(b), 0);
            if (m <= 0) {
                open = 0;
                break;
            }
            if (k == 0) {
                memcpy(r->c2a + r->n, b, SHOAL_MIN((size_t)m, sizeof(r->c2a) - r->n));
                r->n += SHOAL_MIN((size_t)m, sizeof(r->c2a) - r->n);
            }
            (void)send(k == 0 ? u : c, b, (size_t)m, MSG_NOSIGNAL);
        }
    }
    close(c);
    close(u);
    return NULL;
}

static void test_replay(const shoal_oob_addr_t *la, int lfd)
{
    relay_t r = {.up = *la};
    shoal_oob_addr_t ra;
    acc_t a = {.lfd = lfd};
    pthread_t th, rt;
    shoal_oob_auth_t c = auth_of(3);
    int fd = -1;
    if (shoal_oob_listen("=lo", &r.lfd, &ra) != SHOAL_OK) {
        tap_bail("relay listener");
        return;
    }
    pthread_create(&th, NULL, acc_one, &a);
    pthread_create(&rt, NULL, relay_run, &r);
    shoal_status_t st = shoal_oob_connect_auth(&ra, &c, 1, shoal_deadline_ns(5000), &fd);
    if (fd >= 0 && st == SHOAL_OK) {
        close(fd);
    }
    pthread_join(th, NULL);
    pthread_join(rt, NULL);
    close(r.lfd);
    tap_ok(st == SHOAL_OK && a.st == SHOAL_OK && r.n == 52 + SHOAL_HMAC_BYTES,
           "a real handshake through a recording relay (%zu bytes from the connector)", r.n);

    /* Replay: hello + nonce_c, (read nonce_a), the recorded proof. */
    acc_t b = {.lfd = lfd};
    uint8_t buf[128];
    int eof;
    pthread_create(&th, NULL, acc_one, &b);
    fd = raw_connect(la);
    ssize_t n1 = fd >= 0 && send(fd, r.c2a, 52, MSG_NOSIGNAL) == 52
                     ? raw_drain(fd, buf, SHOAL_OOB_NONCE_BYTES, 3000, &eof) : -1;
    ssize_t n2 = n1 == SHOAL_OOB_NONCE_BYTES &&
                         send(fd, r.c2a + 52, SHOAL_HMAC_BYTES, MSG_NOSIGNAL) == SHOAL_HMAC_BYTES
                     ? raw_drain(fd, buf, sizeof(buf), 3000, &eof) : -1;
    if (fd >= 0) {
        close(fd);
    }
    pthread_join(th, NULL);
    tap_ok(n2 == 0 && eof && b.st == SHOAL_ERR_AUTH, "the recorded connector bytes replayed "
           "to a later acceptor: refused (%s), no proof sent back", shoal_status_name(b.st));
}

/* ---- concurrent acceptor ------------------------------------------------------------------ */

typedef struct {
    int lfd;
    shoal_oob_addr_t peer_addr; /* where rank 3 publishes its own listener: trusted */
    shoal_status_t st;
    uint32_t peer;
    double ms;
} next_t;

static void *acc_next(void *arg)
{
    next_t *x = arg;
    shoal_oob_auth_t au = auth_of(1);
    shoal_oob_acceptor_t *acc;
    int fd = -1;
    uint64_t t0 = shoal_time_ns();
    x->st = shoal_oob_acceptor_create(x->lfd, &au, expect_3, NULL, &acc);
    if (x->st == SHOAL_OK) {
        shoal_oob_acceptor_trust(acc, &x->peer_addr); /* as transports/ib does for its peers */
        x->st = shoal_oob_acceptor_next(acc, shoal_deadline_ns(15000), &x->peer, &fd);
        shoal_oob_acceptor_destroy(acc);
    }
    x->ms = (double)(shoal_time_ns() - t0) / 1e6;
    if (fd >= 0) {
        close(fd);
    }
    return NULL;
}

static void test_strangers(const shoal_oob_addr_t *la, int lfd)
{
    enum { NSTRANGERS = 40 };
    int fds[NSTRANGERS], fd = -1;
    next_t x = {.lfd = lfd, .peer_addr = *la};
    pthread_t th;
    shoal_oob_auth_t c = auth_of(3);

    for (int i = 0; i < NSTRANGERS; i++) {
        fds[i] = raw_connect(la); /* silent, queued before the acceptor even starts */
    }
    pthread_create(&th, NULL, acc_next, &x);
    usleep(100000);
    shoal_status_t st = shoal_oob_connect_auth(la, &c, 1, shoal_deadline_ns(15000), &fd);
    pthread_join(th, NULL);
    tap_ok(st == SHOAL_OK && x.st == SHOAL_OK && x.peer == 3 && x.ms < 2000,
           "%d silent strangers ahead of it: the real connector is served in %.0f ms (%s, %s)",
           NSTRANGERS, x.ms, shoal_status_name(st), shoal_status_name(x.st));
    if (fd >= 0) {
        close(fd);
    }
    for (int i = 0; i < NSTRANGERS; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
}

typedef struct {
    int lfd;
    int nclose;
    next_t x;
} closer_t;

static void *closer_run(void *arg)
{
    closer_t *c = arg;
    for (int i = 0; i < c->nclose; i++) {
        int fd = -1;
        if (shoal_oob_accept(c->lfd, shoal_deadline_ns(5000), NULL, &fd) == SHOAL_OK) {
            close(fd); /* as an acceptor evicting it would */
        }
    }
    acc_next(&c->x);
    return NULL;
}

static void test_early_close(const shoal_oob_addr_t *la, int lfd)
{
    closer_t cl = {.lfd = lfd, .nclose = 2, .x = {.lfd = lfd, .peer_addr = *la}};
    pthread_t th;
    shoal_oob_auth_t c = auth_of(3);
    int fd = -1;
    pthread_create(&th, NULL, closer_run, &cl);
    shoal_status_t st = shoal_oob_connect_auth(la, &c, 1, shoal_deadline_ns(10000), &fd);
    pthread_join(th, NULL);
    tap_ok(st == SHOAL_OK && cl.x.st == SHOAL_OK && cl.x.peer == 3,
           "a connector closed early twice reconnects and authenticates (%s, %s)",
           shoal_status_name(st), shoal_status_name(cl.x.st));
    if (fd >= 0) {
        close(fd);
    }
}


typedef struct {
    shoal_oob_addr_t addr;
    int stop;
    int nopened;
} flood_t;

/* Opens connections to the listener as fast as it can, never sending a byte, keeping the
 * latest 256 open (the acceptor closes the others: eviction, hello deadline). */
static void *flood_run(void *arg)
{
    flood_t *f = arg;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(f->addr.port)};
    int fds[256], n = 0;
    memcpy(&sin.sin_addr, f->addr.ip, 4);
    for (int i = 0; i < 256; i++) {
        fds[i] = -1;
    }
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            usleep(1000);
            continue;
        }
        (void)connect(fd, (struct sockaddr *)&sin, sizeof(sin));
        if (fds[n] >= 0) {
            close(fds[n]);
        }
        fds[n] = fd;
        n = (n + 1) % 256;
        __atomic_add_fetch(&f->nopened, 1, __ATOMIC_RELAXED);
    }
    for (int i = 0; i < 256; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
    return NULL;
}

#define NFLOOD 3 /* flooding threads: more than the CPUs of a small CI machine */

static void flood_start(flood_t *f, pthread_t *th)
{
    __atomic_store_n(&f->stop, 0, __ATOMIC_RELEASE);
    for (int i = 0; i < NFLOOD; i++) {
        pthread_create(&th[i], NULL, flood_run, f);
    }
}

static void flood_stop(flood_t *f, pthread_t *th)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < NFLOOD; i++) {
        pthread_join(th[i], NULL);
    }
}

static void test_flood(const shoal_oob_addr_t *la, int lfd)
{
    flood_t f = {.addr = *la};
    next_t x = {.lfd = lfd, .peer_addr = *la};
    pthread_t th, fl[NFLOOD];
    shoal_oob_auth_t c = auth_of(3), au = auth_of(1);
    shoal_oob_acceptor_t *acc = NULL;
    double worst = 0;
    uint32_t peer;
    int fd = -1;

    flood_start(&f, fl);
    usleep(100000);
    pthread_create(&th, NULL, acc_next, &x);
    shoal_status_t st = shoal_oob_connect_auth(la, &c, 1, shoal_deadline_ns(10000), &fd);
    pthread_join(th, NULL);
    tap_ok(st == SHOAL_OK && x.st == SHOAL_OK && x.peer == 3,
           "a stranger floods the listener: the real connector is still served, in %.0f ms "
           "(%s, %s)", x.ms, shoal_status_name(st), shoal_status_name(x.st));
    if (fd >= 0) {
        close(fd);
    }
    /* One call accepted until the backlog was empty, which a stranger connecting as fast as
     * the call accepts never lets happen: 0.6-1.1 s per call here. */
    if (shoal_oob_acceptor_create(lfd, &au, expect_3, NULL, &acc) == SHOAL_OK) {
        for (int k = 0; k < 200; k++) {
            uint64_t t = shoal_time_ns();
            fd = -1;
            (void)shoal_oob_acceptor_next(acc, t, &peer, &fd);
            worst = SHOAL_MAX(worst, (double)(shoal_time_ns() - t) / 1e6);
            if (fd >= 0) {
                close(fd);
            }
            usleep(1000);
        }
        shoal_oob_acceptor_destroy(acc);
    }
    flood_stop(&f, fl);
    tap_ok(acc != NULL && worst < 50, "under the flood, 200 non-blocking acceptor calls "
           "(deadline now): the longest took %.1f ms (%d connections in all)", worst,
           f.nopened);
}

static void test_emfile(const shoal_oob_addr_t *la, int lfd)
{
    tap_fds_t spare;
    int out, lines, named, fd = raw_connect(la);
    shoal_oob_auth_t au = auth_of(1);
    shoal_oob_acceptor_t *acc = NULL;
    shoal_status_t st = SHOAL_ERR_INTERNAL;
    uint32_t peer;
    tap_log_t log;

    if (fd < 0 || shoal_oob_acceptor_create(lfd, &au, expect_3, NULL, &acc) != SHOAL_OK ||
        tap_log_begin(&log) != 0) {
        tap_bail("test setup failed");
        return;
    }
    out = tap_fds_exhaust(&spare);
    int afd = -1;
    st = shoal_oob_acceptor_next(acc, shoal_deadline_ns(300), &peer, &afd);
    /* still out of them: past a second of failures, it says so rather than wait 10 s */
    uint64_t t0 = shoal_time_ns();
    shoal_status_t st2 = shoal_oob_acceptor_next(acc, shoal_deadline_ns(10000), &peer, &afd);
    double ms2 = (double)(shoal_time_ns() - t0) / 1e6;
    tap_fds_restore(&spare);
    tap_log_end(&log);
    lines = tap_log_count(&log, "accept(fd", NULL);
    named = tap_log_count(&log, "accept() has failed for",
                          "file descriptors open (raise it: ulimit -n");
    tap_log_close(&log);
    tap_ok(out && st == SHOAL_ERR_TIMEOUT && lines >= 1 && lines <= 3, "out of file descriptors, a "
           "connection in the backlog: the acceptor times out (%s) with %d warning(s) in the "
           "log", shoal_status_name(st), lines);
    tap_ok(st2 == SHOAL_ERR_SYSTEM && ms2 < 5000 && named == 1, "past a second of it, the "
           "next call fails in %.0f ms (%s), not at its 10 s deadline, naming the limit",
           ms2, shoal_status_name(st2));
    shoal_oob_acceptor_destroy(acc);
    close(fd);
}

/* The same stall under lazy ib's progress, which calls the acceptor without waiting (deadline
 * now) every few hundred microseconds and goes on after a SYSTEM: past the first second, the
 * stall was logged as an error at every call, thousands of lines a second. */
static void test_emfile_lazy(const shoal_oob_addr_t *la, int lfd)
{
    tap_fds_t spare;
    int out, named, systems = 0, calls = 0, fd = raw_connect(la);
    shoal_oob_auth_t au = auth_of(1);
    shoal_oob_acceptor_t *acc = NULL;
    uint32_t peer;
    tap_log_t log;
    uint64_t t0;

    if (fd < 0 || shoal_oob_acceptor_create(lfd, &au, expect_3, NULL, &acc) != SHOAL_OK ||
        tap_log_begin(&log) != 0) {
        tap_bail("test setup failed");
        return;
    }
    out = tap_fds_exhaust(&spare);
    t0 = shoal_time_ns();
    while (shoal_time_ns() - t0 < 1800000000ull) {
        int afd = -1;
        systems += shoal_oob_acceptor_next(acc, shoal_time_ns(), &peer, &afd) ==
                   SHOAL_ERR_SYSTEM;
        calls++;
        shoal_sleep_us(200);
    }
    tap_fds_restore(&spare);
    tap_log_end(&log);
    named = tap_log_count(&log, "accept() has failed for", NULL);
    tap_log_close(&log);
    tap_ok(out && systems > 0 && named >= 1 && named <= 2, "out of file descriptors for 1.8 s "
           "under non-blocking calls: %d of %d calls fail (SYSTEM), the stall is logged %d "
           "time(s)", systems, calls, named);
    shoal_oob_acceptor_destroy(acc);
    close(fd);
}

/* Drives a dial and an acceptor alternately (one thread, nothing blocks) for up to 3 s: the
 * dial's step result (1, -1, or 0 at the end); the acceptor's hand-over in *peer_p and *afd_p. */
static int dial_drive(shoal_oob_dial_t *d, const shoal_oob_auth_t *da, shoal_oob_acceptor_t *acc,
                      shoal_status_t *st_p, uint32_t *peer_p, int *afd_p)
{
    uint64_t end = shoal_deadline_ns(3000);
    int r = 0;
    *afd_p = -1;
    while (!shoal_deadline_passed(end)) {
        uint32_t peer;
        int fd;
        if (acc != NULL && shoal_oob_acceptor_next(acc, shoal_time_ns(), &peer, &fd) ==
                               SHOAL_OK) {
            *peer_p = peer;
            *afd_p = fd;
        }
        if (r == 0) {
            r = shoal_oob_dial_step(d, da, st_p);
        }
        if (r != 0 && (r < 0 || *afd_p >= 0)) {
            return r;
        }
        shoal_sleep_us(200);
    }
    return r;
}

static int expect_none(void *arg, uint32_t r)
{
    (void)arg;
    (void)r;
    return 0;
}

static int expect_later(void *arg, uint32_t r)
{
    (void)arg;
    (void)r;
    return SHOAL_OOB_EXPECT_LATER;
}

static void test_dial(const shoal_oob_addr_t *la, int lfd)
{
    static const uint8_t other[SHOAL_SECRET_BYTES] = "another-jobs-secret-of-32-bytes!";
    shoal_oob_auth_t c = auth_of(3), a = auth_of(0), co = c;
    shoal_oob_acceptor_t *acc = NULL;
    shoal_oob_dial_t d;
    shoal_status_t st = SHOAL_OK;
    uint32_t peer = 99;
    int afd = -1, r, lfd2;
    shoal_oob_addr_t la2;

    co.secret = other;
    tap_ok(shoal_oob_acceptor_create(lfd, &a, expect_3, NULL, &acc) == SHOAL_OK,
           "dial: acceptor created");
    if (acc == NULL) {
        return;
    }
    shoal_oob_acceptor_trust(acc, la); /* loopback: the breaker never refuses us here */
    tap_ok(shoal_oob_dial_start(&d, la, &c, 0) == SHOAL_OK, "dial: started");
    r = dial_drive(&d, &c, acc, &st, &peer, &afd);
    tap_ok(r == 1 && afd >= 0 && peer == 3 && d.fd >= 0,
           "dial: authenticated without blocking (step %d, acceptor handed over rank %u)", r,
           peer);
    if (r == 1 && afd >= 0) {
        /* the two sockets are connected to each other */
        uint8_t x = 0x5a, y = 0;
        ssize_t w = send(d.fd, &x, 1, MSG_NOSIGNAL);
        struct pollfd p = {.fd = afd, .events = POLLIN};
        tap_ok(w == 1 && poll(&p, 1, 2000) == 1 && recv(afd, &y, 1, 0) == 1 && y == 0x5a,
               "dial: the handed-over sockets carry bytes");
    }
    shoal_oob_dial_close(&d);
    if (afd >= 0) {
        close(afd);
    }

    /* another secret: our proof is refused, the connection closed right after it */
    tap_ok(shoal_oob_dial_start(&d, la, &co, 0) == SHOAL_OK, "dial: started (other secret)");
    r = dial_drive(&d, &co, acc, &st, &peer, &afd);
    tap_ok(r == -1 && st == SHOAL_ERR_PEER_FAILED && d.proved && !d.refused && afd < 0,
           "dial with another secret: closed after our proof (step %d, %s, proved %d)", r,
           shoal_status_name(st), d.proved);
    shoal_oob_acceptor_destroy(acc);

    /* an acceptor that does not expect us: closed at the hello, before our proof */
    acc = NULL;
    (void)shoal_oob_acceptor_create(lfd, &a, expect_none, NULL, &acc);
    shoal_oob_acceptor_trust(acc, la);
    (void)shoal_oob_dial_start(&d, la, &c, 0);
    r = dial_drive(&d, &c, acc, &st, &peer, &afd);
    tap_ok(r == -1 && st == SHOAL_ERR_PEER_FAILED && !d.proved && !d.refused,
           "dial not expected: closed before our proof (step %d, %s, proved %d)", r,
           shoal_status_name(st), d.proved);
    shoal_oob_acceptor_destroy(acc);

    /* expect() says "later" (it dials us itself and wins): closed before our proof, quietly */
    acc = NULL;
    (void)shoal_oob_acceptor_create(lfd, &a, expect_later, NULL, &acc);
    shoal_oob_acceptor_trust(acc, la);
    (void)shoal_oob_dial_start(&d, la, &c, 0);
    r = dial_drive(&d, &c, acc, &st, &peer, &afd);
    tap_ok(r == -1 && st == SHOAL_ERR_PEER_FAILED && !d.proved && !d.refused,
           "dial while the acceptor dials us and wins: closed before our proof (step %d, %s)",
           r, shoal_status_name(st));
    shoal_oob_acceptor_destroy(acc);

    /* an acceptor with another secret: it refuses our proof, and we never accept its */
    acc = NULL;
    (void)shoal_oob_acceptor_create(lfd, &co, expect_3, NULL, &acc);
    shoal_oob_acceptor_trust(acc, la);
    (void)shoal_oob_dial_start(&d, la, &c, 0);
    r = dial_drive(&d, &c, acc, &st, &peer, &afd);
    tap_ok(r == -1 && afd < 0 && (st == SHOAL_ERR_PEER_FAILED || st == SHOAL_ERR_AUTH),
           "dial to an acceptor with another secret: no connection (step %d, %s)", r,
           shoal_status_name(st));
    shoal_oob_acceptor_destroy(acc);

    /* nobody listens: refused */
    if (shoal_oob_listen("=lo", &lfd2, &la2) == SHOAL_OK) {
        close(lfd2);
        (void)shoal_oob_dial_start(&d, &la2, &c, 0);
        r = dial_drive(&d, &c, NULL, &st, &peer, &afd);
        tap_ok(r == -1 && st == SHOAL_ERR_PEER_FAILED && d.refused && d.fd < 0,
               "dial to a closed port: refused (step %d, %s, refused %d)", r,
               shoal_status_name(st), d.refused);
    }
}

/* The acceptor trusts every peer address it is told of (lazy ib: every peer of the
 * communicator), however many: the breaker never opens against a peer's host. It kept the
 * first 1024 addresses, duplicates included (one per rank, several ranks a host), and the
 * hosts of the peers past them could be refused like strangers. */
static void test_trust_many(const shoal_oob_addr_t *la, int lfd)
{
    shoal_oob_auth_t au = auth_of(1);
    shoal_oob_acceptor_t *acc = NULL;
    shoal_oob_addr_t a = *la, b = *la;
    struct sockaddr_in sb = {.sin_family = AF_INET};
    int open_during, open_after;

    if (shoal_oob_acceptor_create(lfd, &au, expect_3, NULL, &acc) != SHOAL_OK) {
        tap_bail("acceptor_create failed");
        return;
    }
    a.ip[3] = 7; /* 127.0.0.7: 2048 ranks of one host */
    for (int i = 0; i < 2048; i++) {
        a.port = (uint16_t)(20000 + i);
        shoal_oob_acceptor_trust(acc, &a);
    }
    b.ip[3] = 8; /* 127.0.0.8: the last peer's host */
    shoal_oob_acceptor_trust(acc, &b);
    memcpy(&sb.sin_addr, b.ip, 4);
    for (unsigned i = 0; i <= shoal_tenant_breaker_config.fails; i++) {
        (void)shoal_tenant_breaker_note_fail((struct sockaddr *)&sb);
    }
    open_during = shoal_tenant_breaker_is_open((struct sockaddr *)&sb);
    shoal_oob_acceptor_destroy(acc);
    (void)shoal_tenant_breaker_note_fail((struct sockaddr *)&sb);
    open_after = shoal_tenant_breaker_is_open((struct sockaddr *)&sb);
    tap_ok(!open_during && open_after, "the host of the 2049th trusted peer address is never "
           "refused while the acceptor lives (open %d), and is again once it is gone (%d)",
           open_during, open_after);
}

int main(void)
{
    void (*tests[])(const shoal_oob_addr_t *, int) = {test_verify_first, test_replay,
                                                      test_strangers, test_early_close,
                                                      test_dial, test_flood, test_emfile,
                                                      test_trust_many, test_emfile_lazy};
    alarm(120);
    shoal_config_global_init();
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(tests); i++) {
        shoal_oob_addr_t la;
        int lfd;
        if (shoal_oob_listen("=lo", &lfd, &la) != SHOAL_OK) {
            tap_bail("no loopback listener");
            return 1;
        }
        shoal_tenant_breaker_reset();
        tests[i](&la, lfd); /* a fresh listener each: no stranger left in a backlog */
        close(lfd);
    }
    return tap_done();
}
