/* tcp transport join under attack (issue 10, findings 3 and 4), two real ranks in threads:
 *  - a handshake recorded by a man in the middle on loopback is replayed against a later run
 *    with the same secret and communicator: the acceptor's recorded bytes to a new connector
 *    (it must not take the impostor for rank 0), the connector's recorded bytes to a new
 *    acceptor: both refused;
 *  - slow-loris: strangers open more connections than rank 0 has handshake slots and send
 *    nothing, or one byte at a time; the real ranks still connect well within the timeout;
 *  - a connector whose first connections are closed early by the acceptor's side reconnects
 *    and succeeds;
 *  - the circuit breaker: a source (127.0.0.2) that keeps failing is refused, logged once
 *    however many connections it makes, with counts; strangers from the real rank's own
 *    address are never refused and the rank joins;
 *  - a forged abort notice sent to the listener by a stranger is refused and harms nothing;
 *    once the ranks are ready, nobody can connect at all;
 *  - out of file descriptors with a peer in the backlog: connect_all fails within about a
 *    second, naming the cause and the limit, and sleeps meanwhile;
 *  - a peer whose sockets were established and which then goes away (closes them, or they are
 *    reset) while this rank still waits for another peer: connect_all fails within 0.5 s with
 *    SHOAL_ERR_PEER_FAILED naming the gone peer, on the accepting and on the connecting side,
 *    not at its timeout blaming the peer still missing. */
#include "tests/tap.h"
#include "tenant/breaker.h"
#include "transports/tcp/tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static const shoal_tl_ops_t *tl = &shoal_tl_tcp_ops;
static const uint8_t secret[SHOAL_SECRET_BYTES] = "adversarial-tcp-secret-32-bytes!";
static const volatile int no_abort;
static char logpath[64];

typedef struct {
    shoal_tl_ctx_t *ctx;
    int rank, peer;
    uint8_t peer_addr[SHOAL_TL_ADDR_MAX];
    size_t peer_len;
    shoal_ep_t *ep;
    shoal_status_t st;
    double ms;              /* connect_all's duration */
} side_t;

static double now_ms(void)
{
    return (double)shoal_time_ns() / 1e6;
}

static shoal_status_t side_init(side_t *s, int rank, uint32_t comm_id, int timeout_ms)
{
    shoal_tl_params_t p = {
        .rank = rank, .nranks = 2, .local_rank = rank, .local_size = 2, .comm_id = comm_id,
        .secret = secret, .timeout_ms = timeout_ms, .abort_flag = &no_abort,
    };
    memset(s, 0, sizeof(*s));
    s->rank = rank;
    s->peer = 1 - rank;
    return tl->init(&p, &s->ctx);
}

static void side_addr(side_t *s, uint8_t *out, size_t *len_p)
{
    *len_p = SHOAL_TL_ADDR_MAX;
    (void)tl->address(s->ctx, out, len_p);
}

static void *side_connect(void *arg)
{
    side_t *s = arg;
    const void *a[1] = {s->peer_addr};
    double t0 = now_ms();
    s->st = tl->connect_all(s->ctx, &s->peer, 1, a, &s->peer_len, &s->ep);
    s->ms = now_ms() - t0;
    return NULL;
}

static void side_fini(side_t *s)
{
    if (s->ctx != NULL) {
        tl->fini(s->ctx);
        s->ctx = NULL;
    }
}

/* 100 bytes each way on established endpoints. */
static int data_flows(side_t *a, side_t *b, uint32_t comm_id)
{
    uint8_t sb[100], rb[100];
    shoal_wire_hdr_t h = {.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                          .type = SHOAL_WIRE_DATA, .comm_id = comm_id, .seq = 1,
                          .length = sizeof(sb)};
    shoal_tl_req_t s = {.hdr = h, .buf = sb}, r = {.hdr = h, .buf = rb};
    uint64_t deadline = shoal_time_ns() + 5000000000ull;
    memset(sb, 0x5c, sizeof(sb));
    memset(rb, 0, sizeof(rb));
    tl->ready(a->ctx);
    tl->ready(b->ctx);
    tl->isend(a->ep, &s);
    tl->irecv(b->ep, &r);
    while ((!s.done || !r.done) && shoal_time_ns() < deadline) {
        tl->progress(a->ctx);
        tl->progress(b->ctx);
        sched_yield();
    }
    return s.done && r.done && s.status == SHOAL_OK && r.status == SHOAL_OK &&
           memcmp(sb, rb, sizeof(sb)) == 0;
}

/* ---- raw sockets ------------------------------------------------------------------------- */

static void addr_sockaddr(const uint8_t *addr, struct sockaddr_storage *ss, socklen_t *slen)
{
    shoal_tcp_addr_t a;
    (void)shoal_tcp_addr_decode(addr, SHOAL_TCP_ADDR_BYTES, &a);
    shoal_tcp_addr_sockaddr(&a, ss, slen);
}

/* Connects to a tcp address, from source IP src when not NULL. */
static int raw_connect_from(const uint8_t *addr, const char *src)
{
    struct sockaddr_storage ss;
    socklen_t slen;
    addr_sockaddr(addr, &ss, &slen);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    if (src != NULL) {
        struct sockaddr_in sin = {.sin_family = AF_INET};
        inet_pton(AF_INET, src, &sin.sin_addr);
        if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
            close(fd);
            return -1;
        }
    }
    if (connect(fd, (struct sockaddr *)&ss, slen) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* 1 if the other side closes fd within ms, having sent at most `upto` bytes. */
static int raw_closed(int fd, int ms, size_t upto)
{
    uint8_t b[256];
    size_t got = 0;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, ms) != 1) {
            return 0;
        }
        ssize_t r = recv(fd, b, sizeof(b), 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET)) {
            return got <= upto;
        }
        if (r < 0) {
            return 0;
        }
        got += (size_t)r;
    }
}

/* ---- a man in the middle on loopback: relays and records, or closes the first few ---------- */

#define MITM_MAX 8

typedef struct {
    int lfd;
    struct sockaddr_storage up;       /* the real acceptor */
    socklen_t uplen;
    uint8_t addr[SHOAL_TCP_ADDR_BYTES]; /* the acceptor's address with our port */
    int close_first;                  /* connections to close at once, unanswered */
    int nconn;
    int stop;
    /* per relayed connection: bytes each way */
    uint8_t c2a[MITM_MAX][256], a2c[MITM_MAX][256];
    size_t nc2a[MITM_MAX], na2c[MITM_MAX];
    int cfd[MITM_MAX], afd[MITM_MAX];
    pthread_t th;
} mitm_t;

static void mitm_pump(mitm_t *m, int i, int from_client)
{
    uint8_t b[4096];
    int src = from_client ? m->cfd[i] : m->afd[i], dst = from_client ? m->afd[i] : m->cfd[i];
    ssize_t r = recv(src, b, sizeof(b), MSG_DONTWAIT);
    if (r <= 0) {
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            shutdown(dst, SHUT_WR);
            close(src);
            if (from_client) {
                m->cfd[i] = -1;
            } else {
                m->afd[i] = -1;
            }
        }
        return;
    }
    uint8_t *rec = from_client ? m->c2a[i] : m->a2c[i];
    size_t *n = from_client ? &m->nc2a[i] : &m->na2c[i];
    size_t k = SHOAL_MIN((size_t)r, sizeof(m->c2a[i]) - *n);
    memcpy(rec + *n, b, k);
    *n += k;
    (void)send(dst, b, (size_t)r, MSG_NOSIGNAL);
}

static void *mitm_run(void *arg)
{
    mitm_t *m = arg;
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p[1 + 2 * MITM_MAX];
        int who[1 + 2 * MITM_MAX], n = 0;
        p[n] = (struct pollfd){.fd = m->lfd, .events = POLLIN};
        who[n++] = -1;
        for (int i = 0; i < m->nconn; i++) {
            if (m->cfd[i] >= 0) {
                p[n] = (struct pollfd){.fd = m->cfd[i], .events = POLLIN};
                who[n++] = 2 * i;
            }
            if (m->afd[i] >= 0) {
                p[n] = (struct pollfd){.fd = m->afd[i], .events = POLLIN};
                who[n++] = 2 * i + 1;
            }
        }
        if (poll(p, (nfds_t)n, 20) <= 0) {
            continue;
        }
        for (int k = 0; k < n; k++) {
            if ((p[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
                continue;
            }
            if (who[k] >= 0) {
                mitm_pump(m, who[k] / 2, who[k] % 2 == 0);
                continue;
            }
            int fd = accept(m->lfd, NULL, NULL);
            if (fd < 0) {
                continue;
            }
            if (m->close_first > 0) {
                m->close_first--;
                close(fd); /* as an acceptor evicting or timing us out would */
                continue;
            }
            if (m->nconn == MITM_MAX) {
                close(fd);
                continue;
            }
            int i = m->nconn;
            m->cfd[i] = fd;
            m->afd[i] = socket(m->up.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (m->afd[i] < 0 || connect(m->afd[i], (struct sockaddr *)&m->up, m->uplen) != 0) {
                close(fd);
                continue;
            }
            m->nc2a[i] = m->na2c[i] = 0;
            __atomic_store_n(&m->nconn, i + 1, __ATOMIC_RELEASE);
        }
    }
    return NULL;
}

/* Listens on the acceptor's IP, relays to it; m->addr is what the connector must dial. */
static int mitm_start(mitm_t *m, const uint8_t *acceptor_addr, int close_first)
{
    struct sockaddr_storage ss;
    socklen_t slen;
    shoal_tcp_addr_t a;
    memset(m, 0, sizeof(*m));
    for (int i = 0; i < MITM_MAX; i++) {
        m->cfd[i] = m->afd[i] = -1;
    }
    m->close_first = close_first;
    addr_sockaddr(acceptor_addr, &m->up, &m->uplen);
    memcpy(&ss, &m->up, sizeof(ss));
    slen = m->uplen;
    ((struct sockaddr_in *)&ss)->sin_port = 0; /* same offset in sockaddr_in6 */
    m->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (m->lfd < 0 || bind(m->lfd, (struct sockaddr *)&ss, slen) != 0 || listen(m->lfd, 64) != 0 ||
        getsockname(m->lfd, (struct sockaddr *)&ss, &slen) != 0) {
        return -1;
    }
    (void)shoal_tcp_addr_decode(acceptor_addr, SHOAL_TCP_ADDR_BYTES, &a);
    a.port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    shoal_tcp_addr_encode(&a, m->addr);
    return pthread_create(&m->th, NULL, mitm_run, m);
}

static void mitm_stop(mitm_t *m)
{
    __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
    pthread_join(m->th, NULL);
    close(m->lfd);
    for (int i = 0; i < m->nconn; i++) {
        if (m->cfd[i] >= 0) {
            close(m->cfd[i]);
        }
        if (m->afd[i] >= 0) {
            close(m->afd[i]);
        }
    }
}

/* A real run of rank 1 -> (man in the middle) -> rank 0; the middle keeps the bytes. */
static int record_run(uint32_t comm_id, mitm_t *m)
{
    side_t s0, s1;
    pthread_t th;
    int ok;
    if (side_init(&s0, 0, comm_id, 10000) != SHOAL_OK ||
        side_init(&s1, 1, comm_id, 10000) != SHOAL_OK) {
        return 0;
    }
    side_addr(&s1, s0.peer_addr, &s0.peer_len);
    side_addr(&s0, s1.peer_addr, &s1.peer_len);
    if (mitm_start(m, s1.peer_addr, 0) != 0) {
        return 0;
    }
    memcpy(s1.peer_addr, m->addr, SHOAL_TCP_ADDR_BYTES); /* rank 1 dials the middle */
    pthread_create(&th, NULL, side_connect, &s0);
    side_connect(&s1);
    pthread_join(th, NULL);
    ok = s0.st == SHOAL_OK && s1.st == SHOAL_OK && data_flows(&s1, &s0, comm_id);
    mitm_stop(m);
    side_fini(&s0);
    side_fini(&s1);
    return ok && m->nconn == (int)shoal_tcp_config.nsocks;
}

/* The recorded connection whose hello (connector -> acceptor) names socket idx. */
static int rec_for_socket(const mitm_t *m, uint32_t idx)
{
    for (int i = 0; i < m->nconn; i++) {
        if (m->nc2a[i] >= 24 && shoal_get_le(m->c2a[i] + 16, 4) == idx) {
            return i;
        }
    }
    return -1;
}

typedef struct {
    int lfd;
    const mitm_t *rec;
    int served;
    int stop;
} replayer_t;

/* A fake rank 0: for every connection, reads the hello and plays back what the real rank 0
 * sent on that socket in the recorded run, one message after each of the connector's. */
static void *replay_acceptor_run(void *arg)
{
    replayer_t *r = arg;
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {.fd = r->lfd, .events = POLLIN};
        uint8_t hello[SHOAL_TCP_HELLO_BYTES], proof[SHOAL_HMAC_BYTES];
        if (poll(&p, 1, 20) != 1) {
            continue;
        }
        int fd = accept(r->lfd, NULL, NULL);
        if (fd < 0) {
            continue;
        }
        /* The old hello was 24 bytes, the new one longer: read what the connector sends. */
        ssize_t n = recv(fd, hello, sizeof(hello), 0);
        int i = n >= 24 ? rec_for_socket(r->rec, (uint32_t)shoal_get_le(hello + 16, 4)) : -1;
        if (i >= 0 && r->rec->na2c[i] >= 64) {
            (void)send(fd, r->rec->a2c[i], 32, MSG_NOSIGNAL);           /* the challenge */
            if (tap_read_n(fd, proof, sizeof(proof), 3000) == 0) {
                (void)send(fd, r->rec->a2c[i] + 32, 32, MSG_NOSIGNAL); /* rank 0's proof */
                r->served++;
            }
        }
        (void)raw_closed(fd, 3000, 1 << 20); /* until the connector hangs up */
        close(fd);
    }
    return NULL;
}

static void test_replay(void)
{
    const uint32_t comm_id = 0x7e9a0001u;
    mitm_t *m = calloc(1, sizeof(*m));
    int recorded = record_run(comm_id, m);
    tap_ok(recorded, "recorded a real handshake through a man in the middle (%d sockets)",
           m->nconn);

    /* (a) the acceptor's bytes to a later connector. */
    side_t s1, s0;
    replayer_t r = {0};
    pthread_t th;
    struct sockaddr_storage ss;
    socklen_t slen = sizeof(ss);
    if (side_init(&s0, 0, comm_id, 4000) != SHOAL_OK ||
        side_init(&s1, 1, comm_id, 4000) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s0, s1.peer_addr, &s1.peer_len);
    side_fini(&s0); /* the real rank 0 of the later run is not there: an impostor is */
    addr_sockaddr(s1.peer_addr, &ss, &slen);
    r.lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    r.rec = m;
    int one = 1;
    (void)setsockopt(r.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (r.lfd < 0 || bind(r.lfd, (struct sockaddr *)&ss, slen) != 0 || listen(r.lfd, 16) != 0) {
        tap_bail("replayer cannot listen on the old port");
        return;
    }
    pthread_create(&th, NULL, replay_acceptor_run, &r);
    side_connect(&s1);
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    close(r.lfd);
    tap_is_int(s1.st, SHOAL_ERR_AUTH, "replayed acceptor handshake: the later connector "
               "refuses the impostor with SHOAL_ERR_AUTH");
    side_fini(&s1);

    /* (b) the connector's bytes to a later acceptor. */
    if (side_init(&s0, 0, comm_id, 4000) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    s0.peer_len = SHOAL_TCP_ADDR_BYTES;
    memcpy(s0.peer_addr, m->addr, SHOAL_TCP_ADDR_BYTES); /* rank 1's address: any valid one */
    uint8_t a0[SHOAL_TL_ADDR_MAX];
    size_t l0;
    side_addr(&s0, a0, &l0);
    pthread_create(&th, NULL, side_connect, &s0);
    int refused = 1, i = rec_for_socket(m, 0);
    int fd = raw_connect_from(a0, NULL);
    uint8_t chal[SHOAL_TCP_CHALLENGE_BYTES];
    size_t hello_len = SHOAL_TCP_HELLO_BYTES;
    refused = fd >= 0 && i >= 0 &&
              send(fd, m->c2a[i], hello_len, MSG_NOSIGNAL) == (ssize_t)hello_len &&
              tap_read_n(fd, chal, sizeof(chal), 3000) == 0 &&
              send(fd, m->c2a[i] + hello_len, SHOAL_HMAC_BYTES, MSG_NOSIGNAL) == SHOAL_HMAC_BYTES &&
              raw_closed(fd, 3000, 0);
    if (fd >= 0) {
        close(fd);
    }
    tap_ok(refused, "replayed connector handshake: the later acceptor closes it without "
           "sending a proof");
    pthread_join(th, NULL);
    tap_is_int(s0.st, SHOAL_ERR_TIMEOUT, "that acceptor never took the replay for rank 1");
    side_fini(&s0);
    free(m);
}

/* ---- slow-loris, early close -------------------------------------------------------------- */

typedef struct {
    const uint8_t *addr;
    int nsilent, ntrickle;
    int fds[256];
    int n;
    int stop;
    int trickle_closed;     /* trickling connections the listener closed */
} loris_t;

/* Silent connections first, then trickling ones that send one byte of a hello every 100 ms. */
static void *loris_run(void *arg)
{
    loris_t *l = arg;
    uint8_t junk[SHOAL_TCP_HELLO_BYTES];
    memset(junk, 0x48, sizeof(junk));
    for (int i = 0; i < l->nsilent + l->ntrickle && l->n < 256; i++) {
        int fd = raw_connect_from(l->addr, NULL);
        if (fd >= 0) {
            l->fds[l->n++] = fd;
        }
    }
    for (int step = 0; !__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE) && step < 100; step++) {
        for (int i = l->nsilent; i < l->n; i++) {
            if (l->fds[i] >= 0 &&
                send(l->fds[i], junk + step % sizeof(junk), 1, MSG_NOSIGNAL) != 1) {
                close(l->fds[i]);
                l->fds[i] = -1;
                l->trickle_closed++;
            }
        }
        usleep(100000);
    }
    return NULL;
}

static void test_slow_loris(void)
{
    const uint32_t comm_id = 0x7e9a0002u;
    side_t s0, s1;
    loris_t l = {.nsilent = 100, .ntrickle = 20};
    pthread_t lt, th;
    const int timeout_ms = 20000;

    if (side_init(&s0, 0, comm_id, timeout_ms) != SHOAL_OK ||
        side_init(&s1, 1, comm_id, timeout_ms) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s1, s0.peer_addr, &s0.peer_len);
    side_addr(&s0, s1.peer_addr, &s1.peer_len);
    l.addr = s1.peer_addr;
    pthread_create(&th, NULL, side_connect, &s0); /* rank 0 accepts */
    pthread_create(&lt, NULL, loris_run, &l);
    usleep(300000); /* the strangers are in before the real rank */
    side_connect(&s1);
    pthread_join(th, NULL);
    tap_ok(l.n == l.nsilent + l.ntrickle, "%d silent and %d trickling strangers connected "
           "(rank 0 has %d handshake slots)", l.nsilent, l.ntrickle,
           64 + 2 * (int)shoal_tcp_config.nsocks);
    tap_ok(s0.st == SHOAL_OK && s1.st == SHOAL_OK && s1.ms < timeout_ms / 4,
           "slow-loris: both real ranks connect (%s, %s) in %.0f ms, well within the %d ms "
           "timeout", shoal_status_name(s0.st), shoal_status_name(s1.st), s1.ms, timeout_ms);
    tap_ok(s0.st == SHOAL_OK && s1.st == SHOAL_OK && data_flows(&s0, &s1, comm_id),
           "slow-loris: data flows afterwards");
    __atomic_store_n(&l.stop, 1, __ATOMIC_RELEASE);
    pthread_join(lt, NULL);
    for (int i = 0; i < l.n; i++) {
        if (l.fds[i] >= 0) {
            close(l.fds[i]);
        }
    }
    side_fini(&s0);
    side_fini(&s1);
}

static void test_hello_deadline(void)
{
    const uint32_t comm_id = 0x7e9a0003u;
    side_t s0;
    pthread_t th;
    int saved = shoal_tcp_config.hello_timeout_ms;
    uint8_t a0[SHOAL_TL_ADDR_MAX];
    size_t l0;

    shoal_tcp_config.hello_timeout_ms = 500;
    if (side_init(&s0, 0, comm_id, 3000) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    s0.peer_len = SHOAL_TCP_ADDR_BYTES;
    side_addr(&s0, a0, &l0);
    memcpy(s0.peer_addr, a0, l0); /* any valid address: rank 1 never comes */
    pthread_create(&th, NULL, side_connect, &s0);
    int fd = raw_connect_from(a0, NULL);
    double t0 = now_ms();
    int closed = fd >= 0 && raw_closed(fd, 2500, 0);
    double dt = now_ms() - t0;
    tap_ok(closed && dt >= 400 && dt < 1500, "a silent stranger is closed after the hello "
           "deadline (SHOAL_SOCKET_HELLO_TIMEOUT=500ms: %.0f ms), not the 3000 ms timeout", dt);
    if (fd >= 0) {
        close(fd);
    }
    pthread_join(th, NULL);
    side_fini(&s0);
    shoal_tcp_config.hello_timeout_ms = saved;
}

static void test_early_close(void)
{
    const uint32_t comm_id = 0x7e9a0004u;
    side_t s0, s1;
    pthread_t th;
    mitm_t *m = calloc(1, sizeof(*m));

    if (side_init(&s0, 0, comm_id, 10000) != SHOAL_OK ||
        side_init(&s1, 1, comm_id, 10000) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s1, s0.peer_addr, &s0.peer_len);
    side_addr(&s0, s1.peer_addr, &s1.peer_len);
    if (mitm_start(m, s1.peer_addr, 3) != 0) {
        tap_bail("man in the middle cannot listen");
        return;
    }
    memcpy(s1.peer_addr, m->addr, SHOAL_TCP_ADDR_BYTES);
    pthread_create(&th, NULL, side_connect, &s0);
    side_connect(&s1);
    pthread_join(th, NULL);
    tap_ok(s1.st == SHOAL_OK && s0.st == SHOAL_OK,
           "a connector whose first 3 connections are closed before the handshake reconnects "
           "and succeeds (%s, %s)", shoal_status_name(s1.st), shoal_status_name(s0.st));
    mitm_stop(m);
    free(m);
    side_fini(&s0);
    side_fini(&s1);
}

/* ---- circuit breaker ------------------------------------------------------------------------ */

/* Lines of the log holding both needles. */
static int log_count2(const char *a, const char *b)
{
    char line[1024];
    int n = 0;
    FILE *f = fopen(logpath, "r");
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        n += strstr(line, a) != NULL && strstr(line, b) != NULL;
    }
    fclose(f);
    return n;
}

static int log_count(const char *needle)
{
    return log_count2(needle, needle);
}

static void test_breaker(void)
{
    const uint32_t comm_id = 0x7e9a0005u;
    side_t s0, s1;
    pthread_t th;
    uint8_t a0[SHOAL_TL_ADDR_MAX], junk[SHOAL_TCP_HELLO_BYTES];
    size_t l0;
    const char *saved_if = shoal_tcp_config.ifname;
    shoal_tenant_breaker_config_t saved = shoal_tenant_breaker_config;
    struct sockaddr_in evil = {.sin_family = AF_INET}, lo = {.sin_family = AF_INET};

    inet_pton(AF_INET, "127.0.0.2", &evil.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &lo.sin_addr);
    shoal_tenant_breaker_reset();
    shoal_tenant_breaker_config.fails = 4;
    shoal_tcp_config.ifname = "=lo"; /* both ranks on 127.0.0.1; the stranger on 127.0.0.2 */
    if (side_init(&s0, 0, comm_id, 15000) != SHOAL_OK ||
        side_init(&s1, 1, comm_id, 15000) != SHOAL_OK) {
        tap_bail("tcp init on lo failed");
        return;
    }
    shoal_tcp_config.ifname = saved_if;
    side_addr(&s1, s0.peer_addr, &s0.peer_len);
    side_addr(&s0, s1.peer_addr, &s1.peer_len);
    side_addr(&s0, a0, &l0);
    memset(junk, 0xee, sizeof(junk));
    pthread_create(&th, NULL, side_connect, &s0);

    int garbage_refused = 0, refused_at_once = 0, nrefused = 20;
    for (int i = 0; i < 4; i++) {
        int fd = raw_connect_from(a0, "127.0.0.2");
        garbage_refused += fd >= 0 && send(fd, junk, sizeof(junk), MSG_NOSIGNAL) > 0 &&
                           raw_closed(fd, 3000, 0);
        if (fd >= 0) {
            close(fd);
        }
    }
    tap_is_int(garbage_refused, 4, "4 garbage hellos from 127.0.0.2 refused");
    tap_ok(shoal_tenant_breaker_is_open((struct sockaddr *)&evil),
           "after 4 failures within the window the breaker is open for 127.0.0.2");
    for (int i = 0; i < nrefused; i++) {
        int fd = raw_connect_from(a0, "127.0.0.2");
        refused_at_once += fd >= 0 && raw_closed(fd, 3000, 0);
        if (fd >= 0) {
            close(fd);
        }
    }
    tap_is_int(refused_at_once, nrefused, "its next %d connections are closed at once, "
               "unanswered", nrefused);

    /* Strangers from the real rank's own address: failures counted, never refused. */
    int same_refused = 0;
    for (int i = 0; i < 10; i++) {
        int fd = raw_connect_from(a0, "127.0.0.1");
        same_refused += fd >= 0 && send(fd, junk, sizeof(junk), MSG_NOSIGNAL) > 0 &&
                        raw_closed(fd, 3000, 0);
        if (fd >= 0) {
            close(fd);
        }
    }
    tap_ok(same_refused == 10 && !shoal_tenant_breaker_is_open((struct sockaddr *)&lo),
           "10 failures from 127.0.0.1, rank 1's published address: the breaker stays closed");
    side_connect(&s1);
    pthread_join(th, NULL);
    tap_ok(s0.st == SHOAL_OK && s1.st == SHOAL_OK && data_flows(&s0, &s1, comm_id),
           "the real rank 1 from 127.0.0.1 joins (%s, %s) and data flows",
           shoal_status_name(s0.st), shoal_status_name(s1.st));

    shoal_tenant_breaker_stats_t st;
    shoal_tenant_breaker_source_t src[8];
    size_t n = 0;
    uint64_t evil_failed = 0, evil_refused = 0;
    shoal_tenant_breaker_stats(&st, src, 8, &n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(src[i].addr, "127.0.0.2") == 0) {
            evil_failed = src[i].failed;
            evil_refused = src[i].refused;
        }
    }
    tap_ok(evil_failed == 4 && evil_refused == (uint64_t)nrefused && st.refused >= 20 &&
           st.opened == 1 && st.failed >= 14, "counters: 127.0.0.2 failed %llu, refused %llu; "
           "total failed %llu, refused %llu, opened %llu",
           (unsigned long long)evil_failed, (unsigned long long)evil_refused,
           (unsigned long long)st.failed, (unsigned long long)st.refused,
           (unsigned long long)st.opened);
    int lines = log_count("refusing connections from 127.0.0.2");
    int opened = log_count("127.0.0.2 failed to authenticate 4 times");
    int fail_lines = log_count("refused connection from 127.0.0.1:");
    tap_ok(opened == 1 && lines == 0 && fail_lines == 1,
           "logged once: the breaker opening (%d line), no line per refused connection in the "
           "same minute (%d), one of the 10 failures from 127.0.0.1 (%d)", opened, lines,
           fail_lines);
    side_fini(&s0);
    side_fini(&s1);
    shoal_tenant_breaker_config = saved;
    shoal_tenant_breaker_reset();
}

/* ---- forged abort notice ------------------------------------------------------------------- */

static void test_forged_abort(void)
{
    const uint32_t comm_id = 0x7e9a0006u;
    side_t s0, s1;
    pthread_t th;
    uint8_t a0[SHOAL_TL_ADDR_MAX], frame[SHOAL_WIRE_HDR_BYTES];
    size_t l0;
    shoal_wire_hdr_t h = {.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                          .type = SHOAL_WIRE_ABORT, .comm_id = comm_id, .chunk = 1};

    if (side_init(&s0, 0, comm_id, 10000) != SHOAL_OK ||
        side_init(&s1, 1, comm_id, 10000) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s1, s0.peer_addr, &s0.peer_len);
    side_addr(&s0, s1.peer_addr, &s1.peer_len);
    side_addr(&s0, a0, &l0);
    pthread_create(&th, NULL, side_connect, &s0);
    shoal_wire_encode(&h, frame);
    int fd = raw_connect_from(a0, NULL);
    int refused = fd >= 0 && send(fd, frame, sizeof(frame), MSG_NOSIGNAL) > 0 &&
                  raw_closed(fd, 6000, 0);
    if (fd >= 0) {
        close(fd);
    }
    tap_ok(refused, "a stranger's abort notice claiming rank 1 failed is refused at the "
           "listener");
    side_connect(&s1);
    pthread_join(th, NULL);
    tap_ok(s0.st == SHOAL_OK && s1.st == SHOAL_OK && s0.ep->status == SHOAL_OK &&
           data_flows(&s0, &s1, comm_id),
           "rank 0 did not believe it: it connects to rank 1 and data flows");
    fd = raw_connect_from(a0, NULL);
    tap_ok(fd < 0, "once ready, the listener is gone: a forged notice has nowhere to go");
    if (fd >= 0) {
        close(fd);
    }
    side_fini(&s0);
    side_fini(&s1);
}

/* ---- out of file descriptors --------------------------------------------------------------- */

/* Rank 1 (a child process, whose file descriptors are its own) connects and waits in rank 0's
 * backlog; then this process runs out of file descriptors and rank 0 starts to accept: its
 * accept() fails at every pass, and the listener stays readable. connect_all fails after
 * about a second with the cause and the limit, sleeping meanwhile, not at its 10 s timeout. */
static void test_emfile(void)
{
    const uint32_t comm_id = 0x7e9a0007u;
    tap_fds_t spare;
    int out, status = 0;
    side_t s0, s1;
    struct rusage r0, r1;
    pid_t child;

    if (side_init(&s0, 0, comm_id, 10000) != SHOAL_OK ||
        side_init(&s1, 1, comm_id, 10000) != SHOAL_OK) {
        tap_bail("tcp init failed");
        return;
    }
    side_addr(&s1, s0.peer_addr, &s0.peer_len);
    side_addr(&s0, s1.peer_addr, &s1.peer_len);
    fflush(NULL);
    child = fork();
    if (child == 0) {
        side_connect(&s1); /* fails once rank 0 is gone */
        _exit(0);
    }
    /* until rank 1's connection waits in rank 0's backlog: the listener reads ready */
    struct pollfd lp = {.fd = s0.ctx->listen_fd, .events = POLLIN};
    (void)poll(&lp, 1, 5000);
    out = tap_fds_exhaust(&spare);
    getrusage(RUSAGE_THREAD, &r0);
    side_connect(&s0);
    getrusage(RUSAGE_THREAD, &r1);
    tap_fds_restore(&spare);
    tap_ok(child > 0 && out && (lp.revents & POLLIN) != 0, "a connection in the backlog, the "
           "process out of file descriptors");
    double cpu_ms = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec +
                             r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1e3 +
                    (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec +
                             r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e3;
    tap_ok(s0.st == SHOAL_ERR_SYSTEM && s0.ms < 5000,
           "out of file descriptors with a peer in the backlog: connect_all fails in %.0f ms "
           "(%s), not at its 10 s timeout", s0.ms, shoal_status_name(s0.st));
    tap_ok(cpu_ms < s0.ms / 2, "and sleeps while accept() fails: %.0f ms of CPU in %.0f ms",
           cpu_ms, s0.ms);
    tap_ok(log_count("cannot take the peers' connections: accept() has failed for") == 1 &&
               log_count("file descriptors open (raise it: ulimit -n") == 1,
           "the error names the cause and the limit");
    side_fini(&s0); /* rank 1 then sees its connection closed */
    if (child > 0) {
        for (int i = 0; i < 200 && waitpid(child, &status, WNOHANG) == 0; i++) {
            usleep(50000);
        }
        kill(child, SIGKILL);
        (void)waitpid(child, &status, 0);
    }
    side_fini(&s1);
}

/* ---- a peer gone after its sockets were established ------------------------------------------ */


typedef struct {
    shoal_tl_ctx_t *ctx;
    int peer;
    uint8_t peer_addr[SHOAL_TL_ADDR_MAX];
    size_t peer_len;
    int reset;              /* leave with a reset (SO_LINGER 0), not a close */
    shoal_status_t st;
} quitter_t;

/* Connects to its one peer, then goes away 200 ms later, as a rank whose connect_all to
 * someone else failed (or whose process died) does. */
static void *quitter_run(void *arg)
{
    quitter_t *q = arg;
    const void *a[1] = {q->peer_addr};
    shoal_ep_t *ep = NULL;
    q->st = tl->connect_all(q->ctx, &q->peer, 1, a, &q->peer_len, &ep);
    usleep(200000);
    for (int i = 0; q->st == SHOAL_OK && q->reset && i < ep->nsocks; i++) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        (void)setsockopt(ep->fds[i], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    tl->fini(q->ctx);
    q->ctx = NULL;
    return NULL;
}

/* Three ranks. The quitter (rank `gone`) connects to rank `me` only and goes away; rank `me`
 * waits in connect_all for the third rank, which never takes part (its listener is open, so
 * a connection to it waits in its backlog). */
static void gone_case(int me, int gone, int reset, const char *what)
{
    const uint32_t comm_id = 0x7e9a0008u + (uint32_t)(2 * me + reset);
    shoal_tl_params_t p = {
        .nranks = 3, .local_size = 3, .comm_id = comm_id, .secret = secret,
        .timeout_ms = 5000, .abort_flag = &no_abort,
    };
    shoal_tl_ctx_t *c[3] = {NULL, NULL, NULL};
    uint8_t addr[3][SHOAL_TL_ADDR_MAX];
    size_t len[3];
    quitter_t q = {.peer = me, .reset = reset};
    pthread_t th;
    int peers[2], n = 0, absent = 3 - me - gone;
    const void *a[2];
    size_t l[2];
    shoal_ep_t *eps[2];

    for (int r = 0; r < 3; r++) {
        p.rank = p.local_rank = r;
        len[r] = SHOAL_TL_ADDR_MAX;
        if (tl->init(&p, &c[r]) != SHOAL_OK || tl->address(c[r], addr[r], &len[r]) != SHOAL_OK) {
            tap_bail("tcp init failed");
            return;
        }
    }
    for (int r = 0; r < 3; r++) {
        if (r != me) {
            peers[n] = r;
            a[n] = addr[r];
            l[n++] = len[r];
        }
    }
    q.ctx = c[gone];
    memcpy(q.peer_addr, addr[me], len[me]);
    q.peer_len = len[me];
    c[gone] = NULL;
    pthread_create(&th, NULL, quitter_run, &q);
    double t0 = now_ms();
    shoal_status_t st = tl->connect_all(c[me], peers, 2, a, l, eps);
    double dt = now_ms() - t0;
    pthread_join(th, NULL);
    char needle[32];
    snprintf(needle, sizeof(needle), "peer %d (", gone);
    tap_ok(q.st == SHOAL_OK && st == SHOAL_ERR_PEER_FAILED && dt < 2500 &&
               log_count2(needle, "after its handshake") == 1,
           "%s: rank %d's connect_all fails with %s in %.0f ms naming peer %d, not at its "
           "5000 ms timeout blaming peer %d", what, me, shoal_status_name(st), dt, gone,
           absent);
    for (int r = 0; r < 3; r++) {
        if (c[r] != NULL) {
            tl->fini(c[r]);
        }
    }
}

static void test_gone_established(void)
{
    gone_case(0, 1, 0, "accepting side, the peer closes its established sockets");
    gone_case(0, 2, 1, "accepting side, the peer's established sockets are reset");
    gone_case(2, 0, 0, "connecting side, the peer closes its established sockets");
}

int main(void)
{
    alarm(240);
    snprintf(logpath, sizeof(logpath), "/tmp/shoal_tcp_adv.%d.log", (int)getpid());
    setenv("SHOAL_DEBUG_FILE", logpath, 1);
    setenv("SHOAL_DEBUG", "WARN", 1);
    shoal_config_global_init();
    test_replay();
    test_slow_loris();
    test_hello_deadline();
    test_early_close();
    test_breaker();
    test_forged_abort();
    test_emfile();
    test_gone_established();
    unlink(logpath);
    return tap_done();
}
