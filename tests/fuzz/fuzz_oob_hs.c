/* Fuzz target: the out-of-band handshake of transports/common/oob.c (the ib transport's side
 * channel), fed a stranger's bytes over a socketpair: the concurrent acceptor (its slots
 * driven by shoal_oob_acceptor_next, the connection handed in with shoal_oob_acceptor_add, the
 * input sent in chunks with one pass of the acceptor after each, so that partial reads
 * happen), the sequential acceptor shoal_oob_auth_accept and the connector
 * shoal_oob_auth_connect (both given the whole input, then EOF). The job: ranks 0..3, a
 * communicator id and a secret drawn at random per process (the fuzzer cannot forge a proof).
 * Input: 5 control bytes, then the stranger's bytes (at most 4 KiB):
 *   c0 bits 0-1  0, 1: the concurrent acceptor; 2: the sequential one; 3: the connector
 *      bit 2     concurrent acceptor, honest: the target knows the secret and puts the right
 *                connector's proof (bytes 52..83) in place of the input's, so that the steps
 *                after the proof run too
 *      bit 3     concurrent acceptor: the stranger shuts its side after its last byte (EOF)
 *      bit 4     concurrent acceptor: a hello deadline of 0 ms (SHOAL_SOCKET_HELLO_TIMEOUT)
 *      bit 5     concurrent acceptor: expect() says no at the end (connected meanwhile)
 *   c1           our rank (bits 0-1); the ranks expect() admits (bits 4-7, one bit a rank);
 *                connector: the peer's rank (bits 2-3)
 *   c2           bit 7: c2 % 18 silent strangers take slots first (16 slots: eviction)
 *   c3, c4       chunk lengths (each % 64 + 1, alternately); chunks also end at 52, where
 *                the honest proof starts.
 * Invariants: without the right proof no connection is authenticated and no acceptor sends
 * more than its 32-byte nonce (verify first, then prove), and only to a hello that checks
 * out; with it (and a valid hello, still expected) the connection comes out of
 * acceptor_next as the rank that sent the hello, with the acceptor's proof HMAC(secret)
 * over both nonces; the connector's proof covers the nonces and ranks; a refused
 * connection is closed; eviction takes the oldest silent stranger first. */
#include "transports/common/oob.h"
#include "transports/tcp/tcp.h" /* shoal_tcp_config.hello_timeout_ms */
#include "tests/fuzz/fuzz.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#define FUZZ_COMM 0x0b5e55edu
#define FUZZ_LABEL "shoal-ib"
#define FUZZ_MAGIC 0x424f4853u /* "SHOB" */
#define FUZZ_VERSION 2
#define FUZZ_HELLO 52          /* magic, version, comm, from, to (4 bytes each), nonce */
#define FUZZ_NONCE 32
#define FUZZ_SLOTS 16
#define FUZZ_MAX_STREAM 4096

static uint8_t fuzz_secret[SHOAL_SECRET_BYTES];
static int fuzz_lfd = -1; /* a listener nobody connects to: acceptor_next's accept finds none */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    (void)argc;
    (void)argv;
    fuzz_quiet_log();
    if (shoal_random_bytes(fuzz_secret, sizeof(fuzz_secret)) != SHOAL_OK) {
        abort();
    }
    fuzz_lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fuzz_lfd < 0 || bind(fuzz_lfd, (struct sockaddr *)&sin, sizeof(sin)) != 0 ||
        listen(fuzz_lfd, 1) != 0) {
        perror("fuzz_oob_hs: loopback listener");
        abort();
    }
    return 0;
}

typedef struct {
    uint8_t self;
    uint8_t admit;   /* bit r: rank r may connect */
    int said_no;     /* expect() answers no from now on */
} fuzz_ctl_t;

static int fuzz_expect(void *arg, uint32_t rank)
{
    fuzz_ctl_t *ctl = arg;
    return !ctl->said_no && rank < 4 && ((ctl->admit >> rank) & 1);
}

typedef struct {
    int fd;           /* the stranger's end */
    uint8_t got[256]; /* what the other side sent */
    size_t ngot;
    int eof;
} fuzz_peer_t;

static void fuzz_drain(fuzz_peer_t *p)
{
    for (;;) {
        uint8_t tmp[256];
        ssize_t r = recv(p->fd, tmp, sizeof(tmp), MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            p->eof = 1;
        }
        if (r <= 0) {
            return;
        }
        for (ssize_t i = 0; i < r; i++) {
            if (p->ngot < sizeof(p->got)) {
                p->got[p->ngot] = tmp[i];
            }
            p->ngot++;
        }
    }
}

/* HMAC(secret, "shoal-ib" suffix | comm | nonce_c | nonce_a | from | to), as oob.h says. */
static void fuzz_proof(const char *suffix, const uint8_t *nc, const uint8_t *na, uint32_t from,
                       uint32_t to, uint8_t out[SHOAL_HMAC_BYTES])
{
    uint8_t msg[64 + 4 + 2 * FUZZ_NONCE + 8];
    size_t off = (size_t)snprintf((char *)msg, 64, "%s%s", FUZZ_LABEL, suffix);
    shoal_put_le(msg + off, FUZZ_COMM, 4);
    off += 4;
    memcpy(msg + off, nc, FUZZ_NONCE);
    off += FUZZ_NONCE;
    memcpy(msg + off, na, FUZZ_NONCE);
    off += FUZZ_NONCE;
    shoal_put_le(msg + off, from, 4);
    shoal_put_le(msg + off + 4, to, 4);
    fuzz_require(shoal_hmac(fuzz_secret, SHOAL_SECRET_BYTES, msg, off + 8, out) == SHOAL_OK);
}

/* The acceptor had to go on after this hello. */
static int fuzz_hello_ok(const uint8_t *s, size_t slen, fuzz_ctl_t *ctl)
{
    return slen >= FUZZ_HELLO && shoal_get_le(s, 4) == FUZZ_MAGIC &&
           shoal_get_le(s + 4, 4) == FUZZ_VERSION && shoal_get_le(s + 8, 4) == FUZZ_COMM &&
           shoal_get_le(s + 16, 4) == ctl->self &&
           shoal_get_le(s + 12, 4) < 4 && ((ctl->admit >> shoal_get_le(s + 12, 4)) & 1);
}

/* A failure is a descriptor leaked by an earlier input (at most 20 are open at once). */
static void fuzz_pair(int sv[2])
{
    fuzz_require(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
}

static void fuzz_concurrent(const uint8_t *c, uint8_t *s, size_t slen, fuzz_ctl_t *ctl,
                            const shoal_oob_auth_t *auth)
{
    shoal_oob_acceptor_t *acc = NULL;
    fuzz_peer_t peer = {.fd = -1}, silent[FUZZ_SLOTS + 2];
    int sv[2], nsilent = (c[2] & 0x80) ? c[2] % 18 : 0, honest = (c[0] >> 2) & 1;
    int saved_hello_ms = shoal_tcp_config.hello_timeout_ms, authed = 0, out_fd = -1, raced = 0;
    uint32_t out_peer = UINT32_MAX;
    struct sockaddr_storage ss;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    size_t sent = 0, ci = 0;
    shoal_status_t st;

    memset(&ss, 0, sizeof(ss));
    sin->sin_family = AF_INET;
    sin->sin_port = htons(40000);
    sin->sin_addr.s_addr = htonl(0xc0000263u); /* 192.0.2.99, the stranger */
    /* whatever the environment says: the longest hello deadline (5 s), or one that has
     * always passed at the acceptor's first pass (1 ms, every pass told it is 2 ms later
     * than it is; SHOAL_SOCKET_HELLO_TIMEOUT=0 means no limit of its own) */
    uint64_t skew_ns = (c[0] & 0x10) ? 2000000ull : 0;
    shoal_tcp_config.hello_timeout_ms = (c[0] & 0x10) ? 1 : 5000;
    st = shoal_oob_acceptor_create(fuzz_lfd, auth, fuzz_expect, ctl, &acc);
    shoal_tcp_config.hello_timeout_ms = saved_hello_ms;
    fuzz_require(st == SHOAL_OK);

    for (int i = 0; i < nsilent; i++) {
        silent[i] = (fuzz_peer_t){.fd = -1};
        fuzz_pair(sv);
        silent[i].fd = sv[1];
        fuzz_require(shoal_oob_acceptor_add(acc, sv[0], &ss) == 1);
    }
    fuzz_pair(sv);
    peer.fd = sv[1];
    /* when every slot holds a silent stranger, one is evicted */
    fuzz_require(shoal_oob_acceptor_add(acc, sv[0], &ss) == 1);
    /* the oldest silent strangers made room, the others still wait */
    for (int i = 0; i < nsilent; i++) {
        fuzz_drain(&silent[i]);
        fuzz_require(silent[i].ngot == 0 && silent[i].eof == (i < nsilent + 1 - FUZZ_SLOTS));
    }

    while (sent < slen && !peer.eof && !authed) {
        size_t n = (size_t)c[3 + (ci++ & 1)] % 64 + 1, end = SHOAL_MIN(sent + n, slen);
        if (sent < FUZZ_HELLO && end > FUZZ_HELLO) {
            end = FUZZ_HELLO;
        }
        if (honest && sent == FUZZ_HELLO && slen >= FUZZ_HELLO + SHOAL_HMAC_BYTES &&
            peer.ngot >= FUZZ_NONCE) {
            /* the acceptor sent its nonce: the connector's proof over the hello we sent */
            fuzz_proof("-con", s + 20, peer.got, (uint32_t)shoal_get_le(s + 12, 4), ctl->self,
                       s + FUZZ_HELLO);
            if (c[0] & 0x20) {
                ctl->said_no = 1;
                raced = 1;
            }
        }
        ssize_t w = send(peer.fd, s + sent, end - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) {
            break; /* the acceptor closed it */
        }
        sent += (size_t)w;
        st = shoal_oob_acceptor_next(acc, shoal_time_ns() + skew_ns, &out_peer, &out_fd);
        fuzz_require(st == SHOAL_OK || st == SHOAL_ERR_TIMEOUT);
        authed = st == SHOAL_OK;
        fuzz_drain(&peer);
    }
    if ((c[0] & 8) && !authed && !peer.eof) {
        shutdown(peer.fd, SHUT_WR);
        st = shoal_oob_acceptor_next(acc, shoal_time_ns() + skew_ns, &out_peer, &out_fd);
        fuzz_require(st == SHOAL_ERR_TIMEOUT);
        fuzz_drain(&peer);
        fuzz_require(peer.eof); /* the acceptor closed it */
    }

    int valid = fuzz_hello_ok(s, sent, ctl);
    int proved = honest && valid && sent >= FUZZ_HELLO + SHOAL_HMAC_BYTES;
    /* the nonce only answers a hello that checked out */
    fuzz_require(peer.ngot == 0 || valid);
    /* verify first, then prove: a stranger gets the nonce and nothing more */
    fuzz_require(peer.ngot <= FUZZ_NONCE || proved);
    if (proved) {
        uint8_t ack[SHOAL_HMAC_BYTES];
        fuzz_require(peer.ngot == FUZZ_NONCE + SHOAL_HMAC_BYTES);
        fuzz_proof("-acc", s + 20, peer.got, (uint32_t)shoal_get_le(s + 12, 4), ctl->self, ack);
        fuzz_require(memcmp(ack, peer.got + FUZZ_NONCE, sizeof(ack)) == 0);
    }
    if (authed) {
        fuzz_require(proved && !raced && out_fd == sv[0] &&
                     out_peer == (uint32_t)shoal_get_le(s + 12, 4));
        close(out_fd);
    } else {
        /* a proved connector comes out, unless it was connected meanwhile */
        fuzz_require(!proved || raced);
    }
    if (c[0] & 0x10) {
        /* no time for a hello: refused at the first pass unless it came whole at once */
        size_t first = SHOAL_MIN((size_t)c[3] % 64 + 1, (size_t)FUZZ_HELLO);
        if (slen > 0 && (first < FUZZ_HELLO || slen < FUZZ_HELLO)) {
            fuzz_drain(&peer);
            fuzz_require(peer.eof && peer.ngot == 0);
        }
    }

    shoal_oob_acceptor_destroy(acc);
    if (peer.fd >= 0) {
        close(peer.fd);
    }
    for (int i = 0; i < nsilent; i++) {
        close(silent[i].fd);
    }
}

/* The sequential acceptor, given the whole input then EOF. */
static void fuzz_sequential(const uint8_t *s, size_t slen, fuzz_ctl_t *ctl,
                            const shoal_oob_auth_t *auth)
{
    fuzz_peer_t peer = {.fd = -1};
    int sv[2];
    uint32_t from = UINT32_MAX;
    char why[160];
    shoal_status_t st;

    fuzz_pair(sv);
    peer.fd = sv[1];
    if (slen > 0) {
        fuzz_require(send(peer.fd, s, slen, MSG_NOSIGNAL) == (ssize_t)slen);
    }
    shutdown(peer.fd, SHUT_WR);
    memset(why, 0x55, sizeof(why));
    why[0] = '\0';
    st = shoal_oob_auth_accept(sv[0], auth, fuzz_expect, ctl, &from,
                               shoal_deadline_ns(2000), why, sizeof(why));
    fuzz_drain(&peer);
    fuzz_require(st != SHOAL_OK && from == UINT32_MAX);
    fuzz_require(memchr(why, '\0', sizeof(why)) != NULL);
    if (slen < FUZZ_HELLO) {
        fuzz_require(st == SHOAL_ERR_PEER_FAILED && peer.ngot == 0);
    } else if (!fuzz_hello_ok(s, slen, ctl)) {
        fuzz_require(st == SHOAL_ERR_PROTOCOL && peer.ngot == 0);
    } else {
        fuzz_require(peer.ngot == FUZZ_NONCE);
        fuzz_require(st == (slen < FUZZ_HELLO + SHOAL_HMAC_BYTES ? SHOAL_ERR_PEER_FAILED
                                                                 : SHOAL_ERR_AUTH));
    }
    close(sv[0]);
    close(peer.fd);
}

/* The connector, given the acceptor's side (nonce, proof) whole, then EOF. */
static void fuzz_connector(const uint8_t *c, const uint8_t *s, size_t slen, fuzz_ctl_t *ctl,
                           const shoal_oob_auth_t *auth)
{
    fuzz_peer_t peer = {.fd = -1};
    uint32_t to = (c[1] >> 2) & 3;
    int sv[2];
    shoal_status_t st;

    fuzz_pair(sv);
    peer.fd = sv[1];
    if (slen > 0) {
        fuzz_require(send(peer.fd, s, slen, MSG_NOSIGNAL) == (ssize_t)slen);
    }
    shutdown(peer.fd, SHUT_WR);
    st = shoal_oob_auth_connect(sv[0], auth, to, shoal_deadline_ns(2000));
    fuzz_drain(&peer);
    /* its hello */
    fuzz_require(peer.ngot >= FUZZ_HELLO && shoal_get_le(peer.got, 4) == FUZZ_MAGIC &&
                 shoal_get_le(peer.got + 4, 4) == FUZZ_VERSION &&
                 shoal_get_le(peer.got + 8, 4) == FUZZ_COMM &&
                 shoal_get_le(peer.got + 12, 4) == ctl->self &&
                 shoal_get_le(peer.got + 16, 4) == to);
    if (slen < FUZZ_NONCE) {
        fuzz_require(st == SHOAL_ERR_PEER_FAILED && peer.ngot == FUZZ_HELLO);
    } else {
        /* its proof, over both nonces and both ranks */
        uint8_t want[SHOAL_HMAC_BYTES];
        fuzz_require(peer.ngot == FUZZ_HELLO + SHOAL_HMAC_BYTES);
        fuzz_proof("-con", peer.got + 20, s, ctl->self, to, want);
        fuzz_require(memcmp(want, peer.got + FUZZ_HELLO, sizeof(want)) == 0);
        fuzz_require(st == (slen < FUZZ_NONCE + SHOAL_HMAC_BYTES ? SHOAL_ERR_PEER_FAILED
                                                                 : SHOAL_ERR_AUTH));
    }
    close(sv[0]);
    close(peer.fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = {.p = data, .left = size};
    uint8_t c[5], s[FUZZ_MAX_STREAM];
    size_t slen;
    fuzz_ctl_t ctl;
    shoal_oob_auth_t auth;

    fuzz_take(&in, c, sizeof(c));
    slen = SHOAL_MIN(in.left, sizeof(s));
    fuzz_take(&in, s, slen);
    ctl = (fuzz_ctl_t){.self = c[1] & 3, .admit = c[1] >> 4};
    auth = (shoal_oob_auth_t){.secret = fuzz_secret, .label = FUZZ_LABEL,
                              .comm_id = FUZZ_COMM, .self = ctl.self};
    switch (c[0] & 3) {
    case 0:
    case 1:
        fuzz_concurrent(c, s, slen, &ctl, &auth);
        break;
    case 2:
        fuzz_sequential(s, slen, &ctl, &auth);
        break;
    default:
        fuzz_connector(c, s, slen, &ctl, &auth);
        break;
    }
    return 0;
}
