/* tcp transport against hostile input. While rank 0 sits in connect_all, raw sockets send its
 * listener garbage, a truncated hello, hellos with an absurd length / a wrong communicator / a
 * rank that is not a peer, a wrong HMAC, and a rank with the wrong job secret tries to join;
 * a silent socket stays open. Each is refused, and the real rank 1 then connects and data
 * flows. On established endpoints, frames with a bad magic, an absurd length, an ABORT header
 * and a truncated payload are injected: the receive fails with the right status and never
 * writes past its buffer (run under ASan: buffers are malloc'ed to the exact size). */
#include "tests/tap.h"
#include "transports/tcp/tcp.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const shoal_tl_ops_t *tl = &shoal_tl_tcp_ops;
static const uint8_t secret[SHOAL_SECRET_BYTES] = "garbage-test-secret-of-32-bytes!";
static const uint8_t wrong_secret[SHOAL_SECRET_BYTES] = "not-the-secret-of-this-job-32b!!";
static const volatile int no_abort;

typedef struct {
    shoal_tl_ctx_t *ctx;
    int rank;
    int peer;
    uint8_t peer_addr[SHOAL_TL_ADDR_MAX];
    size_t peer_len;
    shoal_ep_t *ep;
    shoal_status_t st;
} side_t;

typedef struct {
    side_t s[2];
    uint32_t comm_id;
} pair_t;

static shoal_status_t side_init(side_t *s, int rank, uint32_t comm_id, const uint8_t *key,
                                int timeout_ms)
{
    shoal_tl_params_t p = {
        .rank = rank,
        .nranks = 2,
        .local_rank = rank,
        .local_size = 2,
        .comm_id = comm_id,
        .secret = key,
        .timeout_ms = timeout_ms,
        .abort_flag = &no_abort,
    };
    s->rank = rank;
    s->peer = 1 - rank;
    return tl->init(&p, &s->ctx);
}

static void *side_connect(void *arg)
{
    side_t *s = arg;
    const void *a[1] = {s->peer_addr};
    s->st = tl->connect_all(s->ctx, &s->peer, 1, a, &s->peer_len, &s->ep);
    return NULL;
}

static void addr_of(side_t *from, uint8_t *out, size_t *len_p)
{
    *len_p = SHOAL_TL_ADDR_MAX;
    (void)tl->address(from->ctx, out, len_p);
}

static int pair_init(pair_t *p, uint32_t comm_id)
{
    memset(p, 0, sizeof(*p));
    p->comm_id = comm_id;
    if (side_init(&p->s[0], 0, comm_id, secret, 10000) != SHOAL_OK ||
        side_init(&p->s[1], 1, comm_id, secret, 10000) != SHOAL_OK) {
        return -1;
    }
    addr_of(&p->s[1], p->s[0].peer_addr, &p->s[0].peer_len);
    addr_of(&p->s[0], p->s[1].peer_addr, &p->s[1].peer_len);
    return 0;
}

static int pair_connect(pair_t *p)
{
    pthread_t th;
    pthread_create(&th, NULL, side_connect, &p->s[0]);
    side_connect(&p->s[1]);
    pthread_join(th, NULL);
    if (p->s[0].st != SHOAL_OK || p->s[1].st != SHOAL_OK) {
        return -1;
    }
    tl->ready(p->s[0].ctx);
    tl->ready(p->s[1].ctx);
    return 0;
}

static void pair_fini(pair_t *p)
{
    for (int i = 0; i < 2; i++) {
        if (p->s[i].ctx != NULL) {
            tl->fini(p->s[i].ctx);
            p->s[i].ctx = NULL;
        }
    }
}

static shoal_wire_hdr_t hdr_make(uint32_t comm_id, uint32_t seq, uint64_t len)
{
    return (shoal_wire_hdr_t){
        .magic = SHOAL_WIRE_MAGIC,
        .version = SHOAL_WIRE_VERSION,
        .type = SHOAL_WIRE_DATA,
        .comm_id = comm_id,
        .seq = seq,
        .length = len,
    };
}

/* Progresses both contexts until the requests are done or 5 s pass. */
static int pair_wait(pair_t *p, shoal_tl_req_t **reqs, int n)
{
    uint64_t deadline = shoal_time_ns() + 5000000000ull;
    while (shoal_time_ns() < deadline) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            left += reqs[i]->done == 0;
        }
        if (left == 0) {
            return 0;
        }
        for (int i = 0; i < 2; i++) {
            if (p->s[i].ctx != NULL) {
                tl->progress(p->s[i].ctx);
            }
        }
        sched_yield();
    }
    return -1;
}

/* ---- raw sockets against the listener ------------------------------------------------------ */

static int raw_connect(const uint8_t *addr, size_t len)
{
    shoal_tcp_addr_t a;
    struct sockaddr_storage ss;
    socklen_t slen;
    if (shoal_tcp_addr_decode(addr, len, &a) != 0) {
        return -1;
    }
    shoal_tcp_addr_sockaddr(&a, &ss, &slen);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&ss, slen) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* 1 if the other side closes fd (EOF or reset) within ms, without sending anything else. */
static int raw_closed(int fd, int ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    uint8_t b[64];
    if (poll(&pfd, 1, ms) != 1) {
        return 0;
    }
    ssize_t r = recv(fd, b, sizeof(b), 0);
    return r == 0 || (r < 0 && errno == ECONNRESET);
}

static shoal_tcp_hello_t hello_make(uint32_t comm_id, uint32_t rank, uint32_t idx)
{
    return (shoal_tcp_hello_t){
        .magic = SHOAL_TCP_HELLO_MAGIC,
        .version = SHOAL_TCP_HELLO_VERSION,
        .length = SHOAL_TCP_HELLO_BYTES,
        .comm_id = comm_id,
        .rank = rank,
        .sock_idx = idx,
        .nsocks = shoal_tcp_config.nsocks,
    };
}

/* Sends bytes on a fresh socket; 1 if the listener then closes it. */
static int raw_send_refused(const uint8_t *addr, size_t alen, const void *msg, size_t len)
{
    int fd = raw_connect(addr, alen);
    if (fd < 0) {
        return 0;
    }
    int ok = send(fd, msg, len, MSG_NOSIGNAL) == (ssize_t)len && raw_closed(fd, 3000);
    close(fd);
    return ok;
}

static int raw_hello_refused(const uint8_t *addr, size_t alen, shoal_tcp_hello_t h)
{
    uint8_t b[SHOAL_TCP_HELLO_BYTES];
    shoal_tcp_hello_encode(&h, b);
    return raw_send_refused(addr, alen, b, sizeof(b));
}

/* A valid hello as rank 1 socket 0, then a proof made with the wrong key. */
static int raw_wrong_hmac(const uint8_t *addr, size_t alen, uint32_t comm_id)
{
    uint8_t b[SHOAL_TCP_HELLO_BYTES], chal[SHOAL_TCP_CHALLENGE_BYTES], proof[SHOAL_HMAC_BYTES];
    shoal_tcp_hello_t h = hello_make(comm_id, 1, 0);
    shoal_tcp_transcript_t t = {.comm_id = comm_id, .nonce_c = h.nonce, .nonce_a = chal,
                                .from = 1, .to = 0, .sock_idx = 0, .nsocks = h.nsocks};
    int fd = raw_connect(addr, alen), ok = 0;
    if (fd < 0) {
        return 0;
    }
    shoal_tcp_hello_encode(&h, b);
    if (send(fd, b, sizeof(b), MSG_NOSIGNAL) == (ssize_t)sizeof(b) &&
        tap_read_n(fd, chal, sizeof(chal), 3000) == 0 &&
        shoal_tcp_proof(wrong_secret, "shoal-tcp", &t, proof) == SHOAL_OK &&
        send(fd, proof, sizeof(proof), MSG_NOSIGNAL) == (ssize_t)sizeof(proof)) {
        ok = raw_closed(fd, 3000);
    }
    close(fd);
    return ok;
}

static void test_handshake_garbage(void)
{
    pair_t p;
    pthread_t th;
    uint8_t junk[4096], b[SHOAL_TCP_HELLO_BYTES];
    const uint8_t *a0 = p.s[1].peer_addr;
    size_t *l0 = &p.s[1].peer_len;

    if (pair_init(&p, 0x6a7b0001u) != 0) {
        tap_bail("tcp init failed");
        return;
    }
    pthread_create(&th, NULL, side_connect, &p.s[0]); /* rank 0 waits for rank 1 */

    int silent = raw_connect(a0, *l0);
    tap_ok(silent >= 0, "a silent connection is accepted by the kernel and left hanging");
    shoal_random_bytes(junk, sizeof(junk));
    tap_ok(raw_send_refused(a0, *l0, junk, sizeof(junk)), "4 KiB of random garbage refused");
    shoal_tcp_hello_t h = hello_make(p.comm_id, 1, 0);
    shoal_tcp_hello_encode(&h, b);
    int fd = raw_connect(a0, *l0);
    tap_ok(fd >= 0 && send(fd, b, 10, MSG_NOSIGNAL) == 10, "truncated hello sent, then closed");
    if (fd >= 0) {
        close(fd);
    }
    h.length = 60000;
    tap_ok(raw_hello_refused(a0, *l0, h), "hello with an absurd length field refused");
    tap_ok(raw_hello_refused(a0, *l0, hello_make(p.comm_id + 1, 1, 0)),
           "hello for another communicator refused");
    tap_ok(raw_hello_refused(a0, *l0, hello_make(p.comm_id, 7, 0)),
           "hello from a rank that is not a peer refused");
    tap_ok(raw_hello_refused(a0, *l0, hello_make(p.comm_id, 1, 99)),
           "hello with a socket index out of range refused");
    tap_ok(raw_wrong_hmac(a0, *l0, p.comm_id), "proof made with the wrong secret refused");

    /* A full rank 1 with the wrong secret. */
    side_t evil = {0};
    if (side_init(&evil, 1, p.comm_id, wrong_secret, 3000) == SHOAL_OK) {
        memcpy(evil.peer_addr, a0, *l0);
        evil.peer_len = *l0;
        side_connect(&evil);
        tap_is_int(evil.st, SHOAL_ERR_AUTH, "a rank with the wrong job secret gets SHOAL_ERR_AUTH");
        tl->fini(evil.ctx);
    } else {
        tap_ok(0, "init of the wrong-secret rank");
    }

    side_connect(&p.s[1]);
    pthread_join(th, NULL);
    tap_is_int(p.s[0].st, SHOAL_OK, "rank 0's connect_all succeeds after all that");
    tap_is_int(p.s[1].st, SHOAL_OK, "the real rank 1 connects");
    if (silent >= 0) {
        close(silent);
    }
    if (p.s[0].st != SHOAL_OK || p.s[1].st != SHOAL_OK) {
        pair_fini(&p);
        return;
    }
    tl->ready(p.s[0].ctx);
    tl->ready(p.s[1].ctx);

    size_t big = 1u << 20;
    uint8_t *sb = malloc(big), *rb = malloc(big);
    uint8_t s2[100], r2[100];
    for (size_t i = 0; i < big; i++) {
        sb[i] = (uint8_t)(i * 7 + 3);
    }
    memset(s2, 0x42, sizeof(s2));
    shoal_tl_req_t s = {.hdr = hdr_make(p.comm_id, 1, big), .buf = sb};
    shoal_tl_req_t r = {.hdr = hdr_make(p.comm_id, 1, big), .buf = rb};
    shoal_tl_req_t sr = {.hdr = hdr_make(p.comm_id, 2, sizeof(s2)), .buf = s2};
    shoal_tl_req_t rr = {.hdr = hdr_make(p.comm_id, 2, sizeof(r2)), .buf = r2};
    shoal_tl_req_t *all[4] = {&s, &r, &sr, &rr};
    tl->isend(p.s[0].ep, &s);
    tl->irecv(p.s[1].ep, &r);
    tl->isend(p.s[1].ep, &sr);
    tl->irecv(p.s[0].ep, &rr);
    int w = pair_wait(&p, all, 4);
    tap_ok(w == 0 && s.status == SHOAL_OK && r.status == SHOAL_OK && sr.status == SHOAL_OK &&
           rr.status == SHOAL_OK && memcmp(sb, rb, big) == 0 && memcmp(s2, r2, sizeof(s2)) == 0,
           "data flows both ways afterwards (1 MiB striped + 100 B)");
    free(sb);
    free(rb);
    pair_fini(&p);
}

/* ---- frames injected on an established endpoint -------------------------------------------- */

typedef enum { INJ_MAGIC, INJ_LENGTH, INJ_COMM, INJ_ABORT, INJ_TRUNC } inj_t;

static void test_inject(inj_t kind, uint32_t comm_id, shoal_status_t want, const char *what)
{
    pair_t p;
    if (pair_init(&p, comm_id) != 0 || pair_connect(&p) != 0) {
        tap_ok(0, "%s: pair setup", what);
        pair_fini(&p);
        return;
    }
    size_t len = 100;
    uint8_t *buf = malloc(len); /* exact size: ASan sees any overrun */
    char err[200] = "";
    shoal_tl_req_t r = {.hdr = hdr_make(comm_id, 3, len), .buf = buf, .errbuf = err,
                        .errlen = sizeof(err)};
    shoal_tl_req_t *pr = &r;
    shoal_wire_hdr_t h = hdr_make(comm_id, 3, len);
    uint8_t frame[SHOAL_WIRE_HDR_BYTES + 4096];
    size_t flen = SHOAL_WIRE_HDR_BYTES + 4096;

    memset(buf, 0x77, len);
    memset(frame, 0xab, sizeof(frame));
    switch (kind) {
    case INJ_MAGIC:
        h.magic = 0xdeadbeef;
        break;
    case INJ_LENGTH:
        h.length = 1ull << 62;
        break;
    case INJ_COMM:
        h.comm_id ^= 1;
        break;
    case INJ_ABORT:
        h.type = SHOAL_WIRE_ABORT;
        h.chunk = 3;
        h.length = 0;
        break;
    case INJ_TRUNC:
        flen = SHOAL_WIRE_HDR_BYTES + 40;
        break;
    }
    shoal_wire_encode(&h, frame);
    tl->irecv(p.s[1].ep, &r);
    int fd0 = p.s[0].ep->fds[0];
    int sent = send(fd0, frame, flen, MSG_NOSIGNAL) == (ssize_t)flen;
    if (kind == INJ_TRUNC) {
        tl->fini(p.s[0].ctx); /* the sender dies mid-message */
        p.s[0].ctx = NULL;
    }
    int w = pair_wait(&p, &pr, 1);
    int intact = 1;
    for (size_t i = kind == INJ_TRUNC ? 40 : 0; i < len; i++) {
        intact &= buf[i] == 0x77;
    }
    tap_ok(sent && w == 0 && r.status == want && err[0] != '\0' && intact,
           "%s: receive fails with %s (got %s: \"%s\"), nothing written past what arrived",
           what, shoal_status_name(want), shoal_status_name(r.status), err);
    free(buf);
    pair_fini(&p);
}

int main(void)
{
    alarm(120);
    shoal_config_global_init();
    test_handshake_garbage();
    test_inject(INJ_MAGIC, 0x6a7b0002u, SHOAL_ERR_PROTOCOL, "bad magic");
    test_inject(INJ_LENGTH, 0x6a7b0003u, SHOAL_ERR_PROTOCOL, "length 2^62");
    test_inject(INJ_COMM, 0x6a7b0004u, SHOAL_ERR_PROTOCOL, "other communicator");
    test_inject(INJ_ABORT, 0x6a7b0005u, SHOAL_ERR_PEER_FAILED, "ABORT header");
    test_inject(INJ_TRUNC, 0x6a7b0006u, SHOAL_ERR_PEER_FAILED, "payload cut short");
    return tap_done();
}
