/*
 * The ring exchange of the bootstrap (SHOAL_BOOT_EXCHANGE=ring). The root's part is one round
 * of O(1) bytes per rank: each rank sends the address of a listener it opened for its peers,
 * the root answers rank k with the listeners of ranks k-1 and k+1 only. Rank k then dials
 * rank k+1 and accepts rank k-1; both links are authenticated as strongly as the root link
 * (challenge, hello and welcome MAC'd with the job secret, identity checked, fresh nonces both
 * ways, derived link keys, every later frame MAC'd and sequenced, the circuit breaker on the
 * listener). A round is then a ring allgather: n-1 steps, each rank passing on the record it
 * received one step before. The barrier and the failure notices stay with the root.
 *
 * A rank whose ring fails (a neighbour gone, a bad frame, the deadline) leaves the root
 * without a bye; the root takes that for a rank that left and tells every rank at once, which
 * every rank hears because it watches its root connection while it waits on the ring.
 */
#include "core/core.h"
#include "core/boot_proto.h"
#include "tenant/breaker.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An unauthenticated connection to this rank's listener: challenged, its hello awaited. */
typedef struct {
    int fd;                              /* -1: free slot */
    uint64_t deadline_ns;
    struct sockaddr_storage addr;
    char peer[64];
    uint8_t nonce[SHOAL_BOOT_NONCE];
    uint8_t buf[SHOAL_BOOT_PEER_HELLO_BYTES];
    size_t have;
} shoal_ring_pending_t;

enum { SHOAL_RING_OUT_CHALLENGE = 0, SHOAL_RING_OUT_WELCOME, SHOAL_RING_OUT_DONE };

struct shoal_boot_ring {
    int lfd;                             /* listener until the previous rank proved itself */
    int next_fd;                         /* to rank + 1 (dialed; this rank sends on it) */
    int prev_fd;                         /* from rank - 1 (accepted; this rank reads it) */
    uint8_t next_key[SHOAL_HMAC_BYTES];
    uint8_t prev_key[SHOAL_HMAC_BYTES];
    uint64_t tx_seq;
    uint64_t rx_seq;
    struct sockaddr_storage prev_addr;   /* trusted by the breaker while accepting */
    int prev_trusted;
    struct sockaddr_storage next_addr;
    socklen_t next_len;
    char next_str[64];
    /* the outgoing handshake */
    int out_state;
    int redial;                          /* the next rank dropped the handshake: dial again */
    unsigned redials;
    uint8_t out_buf[sizeof(shoal_boot_frame_t) + SHOAL_HMAC_BYTES];
    size_t out_have;
    shoal_boot_hello_t out_hello;
    uint8_t out_lnonce[SHOAL_BOOT_NONCE];
    shoal_ring_pending_t pend[SHOAL_BOOT_MAX_PENDING];
    unsigned refused;
    uint64_t bytes_in, bytes_out;
    shoal_accept_stall_t accept_stall;   /* accept() failing for want of a resource */
};

/* ---- the listener's check (pure) ------------------------------------------------------- */

shoal_status_t shoal_boot_peer_check(const uint8_t *secret, const shoal_boot_ident_t *ident,
                                     int me, int nranks, const uint8_t *lnonce,
                                     const uint8_t *bytes, shoal_boot_hello_t *h, char *why,
                                     size_t len)
{
    shoal_boot_frame_t f;
    uint8_t mac[SHOAL_HMAC_BYTES];
    int want = nranks > 0 ? (me + nranks - 1) % nranks : -1;

    memcpy(&f, bytes, sizeof(f));
    memcpy(h, bytes + sizeof(f), sizeof(*h));
    if (f.magic != SHOAL_BOOT_FRAME_MAGIC || f.type != SHOAL_BOOT_HELLO ||
        f.len != sizeof(*h) || f.round != 0) {
        snprintf(why, len, "not a peer hello (bad frame header)");
        return SHOAL_ERR_PROTOCOL;
    }
    shoal_boot_peer_hello_mac(secret, lnonce, h, mac);
    if (!shoal_memeq_ct(mac, h->mac, sizeof(mac))) {
        snprintf(why, len, "wrong job secret (bad HMAC proof)");
        return SHOAL_ERR_AUTH;
    }
    if (!shoal_memeq_ct(h->ident.tenant, ident->tenant, SHOAL_BOOT_DIGEST)) {
        snprintf(why, len, "rank %d knows the job secret but is configured for another tenant",
                 h->rank);
        return SHOAL_ERR_PERMISSION;
    }
    if (!shoal_memeq_ct(h->ident.job, ident->job, SHOAL_BOOT_DIGEST)) {
        snprintf(why, len, "rank %d knows the job secret but is configured for another job",
                 h->rank);
        return SHOAL_ERR_PERMISSION;
    }
    if (h->ident.epoch != ident->epoch) {
        snprintf(why, len, "rank %d is of epoch %llu, the job of epoch %llu", h->rank,
                 (unsigned long long)h->ident.epoch, (unsigned long long)ident->epoch);
        return SHOAL_ERR_PERMISSION;
    }
    if (h->nranks != nranks || h->rank != want) {
        snprintf(why, len, "rank %d of %d is not this listener's ring neighbour (rank %d of %d)",
                 h->rank, h->nranks, want, nranks);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

/* ---- addresses ------------------------------------------------------------------------- */

static void shoal_ring_rec_encode(const struct sockaddr_storage *ss, uint8_t *rec)
{
    uint16_t family = ss->ss_family, port;
    memset(rec, 0, SHOAL_BOOT_RING_REC);
    if (family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        port = s6->sin6_port;
        memcpy(rec + 4, &s6->sin6_addr, 16);
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        port = s4->sin_port;
        memcpy(rec + 4, &s4->sin_addr, 4);
    }
    memcpy(rec, &family, 2);
    memcpy(rec + 2, &port, 2);
}

/* A record holds no interface: a link-local IPv6 address (a root at SHOAL_ROOT=[fe80::..%if])
 * cannot be dialed without one (EINVAL), and every ring link failed. The neighbours share the
 * link of the root: this rank's own connection to it names the interface. */
static void shoal_ring_rec_scope(const shoal_boot_t *b, struct sockaddr_storage *ss)
{
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss, mine;
    socklen_t len = sizeof(mine);

    if (ss->ss_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr) &&
        getsockname(b->fd, (struct sockaddr *)&mine, &len) == 0 &&
        mine.sin6_family == AF_INET6) {
        s6->sin6_scope_id = mine.sin6_scope_id;
    }
}

static shoal_status_t shoal_ring_rec_decode(const uint8_t *rec, struct sockaddr_storage *ss,
                                            socklen_t *len_p)
{
    uint16_t family, port;
    memcpy(&family, rec, 2);
    memcpy(&port, rec + 2, 2);
    memset(ss, 0, sizeof(*ss));
    if (port == 0 || (family != AF_INET && family != AF_INET6)) {
        return SHOAL_ERR_PROTOCOL;
    }
    if (family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = port;
        memcpy(&s6->sin6_addr, rec + 4, 16);
        *len_p = sizeof(*s6);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        s4->sin_port = port;
        memcpy(&s4->sin_addr, rec + 4, 4);
        *len_p = sizeof(*s4);
    }
    return SHOAL_OK;
}

/* A listener on the address this rank reaches the root from (an interface its peers can
 * reach too, the loopback when the root is local), any port. */
static shoal_status_t shoal_ring_listen(shoal_boot_t *b, shoal_boot_ring_t *g, uint8_t *rec)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd;

    if (getsockname(b->fd, (struct sockaddr *)&ss, &len) != 0) {
        shoal_error(BOOT, "rank %d: getsockname of the root connection failed: %s", b->rank,
                    strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    if (ss.ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    } else {
        ((struct sockaddr_in *)&ss)->sin_port = 0;
    }
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) != 0 ||
        listen(fd, SHOAL_BOOT_MAX_PENDING) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        shoal_error(BOOT, "rank %d: cannot open the bootstrap's peer listener: %s", b->rank,
                    strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return SHOAL_ERR_SYSTEM;
    }
    g->lfd = fd;
    shoal_ring_rec_encode(&ss, rec);
    return SHOAL_OK;
}

/* Connects to the next rank's listener. It exists (the root answered only after every rank
 * had opened its own, and it stays open until this rank has proved itself), so the kernel
 * completes the connection without the peer's help; a refusal means the next rank is gone.
 * The root connection is watched meanwhile: its failure notice ends the wait. */
static shoal_status_t shoal_ring_root_notice(shoal_boot_t *b, uint64_t deadline);

static shoal_status_t shoal_ring_dial(shoal_boot_t *b, shoal_boot_ring_t *g, uint64_t deadline)
{
    int one = 1, err = 0, fd = socket(g->next_addr.ss_family,
                                      SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    socklen_t elen = sizeof(err);

    if (fd < 0) {
        return shoal_boot_fail(b, SHOAL_ERR_SYSTEM, "socket() for the ring's link");
    }
    if (connect(fd, (const struct sockaddr *)&g->next_addr, g->next_len) != 0) {
        err = errno;
    }
    while (err == EINPROGRESS || err == EINTR) {
        struct pollfd pfds[2] = {{.fd = b->fd, .events = POLLIN}, {.fd = fd, .events = POLLOUT}};
        int ret;
        if (shoal_aborted(b->abort_flag)) {
            close(fd);
            return shoal_boot_fail(b, SHOAL_ERR_ABORTED, "connecting to the next rank of the "
                                   "ring");
        }
        if (shoal_deadline_passed(deadline)) {
            close(fd);
            return shoal_boot_fail(b, SHOAL_ERR_TIMEOUT, "connecting to the next rank of the "
                                   "ring");
        }
        ret = poll(pfds, 2, shoal_deadline_left_ms(deadline, 100));
        if (ret < 0 && errno != EINTR) {
            err = errno;
        } else if (ret > 0 && pfds[0].revents != 0) {
            close(fd);
            return shoal_ring_root_notice(b, deadline);
        } else if (ret > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
            err = errno;
        }
    }
    if (err != 0) {
        char what[160];
        close(fd);
        snprintf(what, sizeof(what), "connecting to rank %d's peer listener %s: %s",
                 (b->rank + 1) % b->nranks, g->next_str, strerror(err));
        return shoal_boot_fail(b, err == ECONNREFUSED || err == ECONNRESET
                                      ? SHOAL_ERR_PEER_FAILED
                                      : SHOAL_ERR_TRANSPORT,
                               what);
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    g->next_fd = fd;
    return SHOAL_OK;
}

/* ---- the listener --------------------------------------------------------------------- */

static void shoal_ring_pend_close(shoal_ring_pending_t *p)
{
    if (p->fd >= 0) {
        close(p->fd);
    }
    memset(p, 0, sizeof(*p));
    p->fd = -1;
}

static void shoal_ring_refuse(shoal_boot_t *b, shoal_boot_ring_t *g, shoal_ring_pending_t *p,
                              shoal_status_t why, const char *what)
{
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_REFUSED,
                            .len = 0, .round = (uint32_t)(int32_t)why};
    g->refused++;
    /* As the root: the breaker counts the source's failure; logged in full once per source
     * per minute, traced otherwise. */
    if (shoal_tenant_breaker_note_fail((const struct sockaddr *)&p->addr)) {
        shoal_error(BOOT, "rank %d refused a peer connection from %s: %s (%u refused so far)",
                    b->rank, p->peer, what, g->refused);
    } else {
        shoal_trace(BOOT, "rank %d refused a peer connection from %s: %s (%u refused so far)",
                    b->rank, p->peer, what, g->refused);
    }
    (void)!send(p->fd, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
    shoal_ring_pend_close(p);
}

static void shoal_ring_accept(shoal_boot_t *b, shoal_boot_ring_t *g)
{
    int one = 1;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        shoal_ring_pending_t *p = NULL;
        int fd = accept4(g->lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED) {
                continue;
            }
            /* Out of descriptors or memory: see shoal_ring_links. */
            (void)shoal_accept_stall_note(&g->accept_stall, err);
            return;
        }
        (void)shoal_accept_stall_note(&g->accept_stall, 0);
        if (!shoal_tenant_breaker_admit((const struct sockaddr *)&ss)) {
            close(fd);
            continue;
        }
        for (int i = 0; i < SHOAL_BOOT_MAX_PENDING; i++) {
            if (g->pend[i].fd < 0) {
                p = &g->pend[i];
                break;
            }
            if (p == NULL || g->pend[i].deadline_ns < p->deadline_ns) {
                p = &g->pend[i];
            }
        }
        if (p->fd >= 0) {
            /* Every slot taken: evict the oldest stranger (the real neighbour answers its
             * challenge at once). */
            shoal_ring_refuse(b, g, p, SHOAL_ERR_PROTOCOL,
                              "evicted: too many unauthenticated connections");
        }
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        p->fd = fd;
        p->addr = ss;
        p->have = 0;
        p->deadline_ns = shoal_deadline_ns(b->timeout_ms < 0 ? 60000
                                                             : SHOAL_MIN(b->timeout_ms, 60000));
        shoal_sockaddr_str(&ss, p->peer, sizeof(p->peer));
        shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_CHALLENGE,
                                .len = SHOAL_BOOT_NONCE, .round = 0};
        uint8_t msg[sizeof(f) + SHOAL_BOOT_NONCE];
        if (shoal_random_bytes(p->nonce, sizeof(p->nonce)) != SHOAL_OK) {
            shoal_ring_pend_close(p);
            continue;
        }
        memcpy(msg, &f, sizeof(f));
        memcpy(msg + sizeof(f), p->nonce, SHOAL_BOOT_NONCE);
        /* A fresh socket's buffer always takes 48 bytes. */
        if (send(fd, msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(msg)) {
            shoal_ring_pend_close(p);
            continue;
        }
        g->bytes_out += sizeof(msg);
    }
}

/* Reads what a pending connection sent; at a complete hello, refuses or welcomes it. */
static shoal_status_t shoal_ring_pend_read(shoal_boot_t *b, shoal_boot_ring_t *g,
                                           shoal_ring_pending_t *p)
{
    shoal_boot_hello_t h;
    char why[160];
    shoal_status_t st;
    ssize_t n = recv(p->fd, p->buf + p->have, sizeof(p->buf) - p->have, MSG_DONTWAIT);

    if (n == 0) {
        shoal_ring_refuse(b, g, p, SHOAL_ERR_PROTOCOL, "closed before a complete hello");
        return SHOAL_OK;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            /* a reset counts as a close does (as at the root) */
            shoal_ring_refuse(b, g, p, SHOAL_ERR_PROTOCOL, "reset before a complete hello");
        }
        return SHOAL_OK;
    }
    g->bytes_in += (uint64_t)n;
    p->have += (size_t)n;
    if (p->have >= sizeof(shoal_boot_frame_t)) {
        shoal_boot_frame_t f;
        memcpy(&f, p->buf, sizeof(f));
        if (f.magic != SHOAL_BOOT_FRAME_MAGIC || f.type != SHOAL_BOOT_HELLO ||
            f.len != sizeof(shoal_boot_hello_t)) {
            shoal_ring_refuse(b, g, p, SHOAL_ERR_PROTOCOL, "garbage (not a peer hello)");
            return SHOAL_OK;
        }
    }
    if (p->have < sizeof(p->buf)) {
        return SHOAL_OK;
    }
    st = shoal_boot_peer_check(b->secret, &b->ident, b->rank, b->nranks, p->nonce, p->buf, &h,
                               why, sizeof(why));
    if (st != SHOAL_OK) {
        shoal_ring_refuse(b, g, p, st, why);
        return SHOAL_OK;
    }
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_WELCOME,
                            .len = SHOAL_HMAC_BYTES, .round = 0};
    uint8_t msg[sizeof(f) + SHOAL_HMAC_BYTES];
    memcpy(msg, &f, sizeof(f));
    shoal_boot_peer_welcome_mac(b->secret, p->nonce, &h, msg + sizeof(f));
    st = shoal_sock_write_all(p->fd, msg, sizeof(msg), shoal_deadline_ns(b->timeout_ms),
                              b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "welcoming the previous rank of the ring");
    }
    g->bytes_out += sizeof(msg);
    shoal_boot_peer_session_key(b->secret, p->nonce, &h, g->prev_key);
    shoal_tenant_breaker_note_ok((const struct sockaddr *)&p->addr);
    shoal_trace(BOOT, "rank %d: ring link from rank %d (%s) up", b->rank, h.rank, p->peer);
    g->prev_fd = p->fd;
    p->fd = -1;
    shoal_ring_pend_close(p);
    return SHOAL_OK;
}

/* ---- the outgoing handshake ----------------------------------------------------------- */

/* The next rank's listener challenged this rank: prove the secret, this rank and the job. */
static shoal_status_t shoal_ring_out_hello(shoal_boot_t *b, shoal_boot_ring_t *g)
{
    struct {
        shoal_boot_frame_t f;
        shoal_boot_hello_t h;
    } msg;
    shoal_status_t st;

    memset(&msg, 0, sizeof(msg));
    msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                 .len = sizeof(msg.h)};
    msg.h.rank = b->rank;
    msg.h.nranks = b->nranks;
    msg.h.ident = b->ident;
    SHOAL_CHECK(shoal_random_bytes(msg.h.nonce, sizeof(msg.h.nonce)));
    shoal_boot_peer_hello_mac(b->secret, g->out_lnonce, &msg.h, msg.h.mac);
    g->out_hello = msg.h;
    st = shoal_sock_write_all(g->next_fd, &msg, sizeof(msg), shoal_deadline_ns(b->timeout_ms),
                              b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "sending the hello to the next rank of the ring");
    }
    g->bytes_out += sizeof(msg);
    g->out_state = SHOAL_RING_OUT_WELCOME;
    return SHOAL_OK;
}

/* The next rank's listener let this rank's connection go before the welcome: evicted by a
 * flood of strangers, or the next rank is gone. Dial again (a rank that is gone refuses the
 * connection, which then fails the ring; so does the deadline). */
static shoal_status_t shoal_ring_out_dropped(shoal_boot_t *b, shoal_boot_ring_t *g,
                                             const char *what)
{
    shoal_warn(BOOT, "rank %d: the next rank of the ring (%s) %s before its handshake "
               "finished; redialing", b->rank, g->next_str, what);
    g->redials++;
    g->redial = 1;
    return SHOAL_OK;
}

static shoal_status_t shoal_ring_out_read(shoal_boot_t *b, shoal_boot_ring_t *g)
{
    shoal_boot_frame_t f;
    size_t want = sizeof(f);
    ssize_t n;

    if (g->out_have >= sizeof(f)) {
        memcpy(&f, g->out_buf, sizeof(f));
        want += f.len;
    }
    n = recv(g->next_fd, g->out_buf + g->out_have, want - g->out_have, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
        return shoal_ring_out_dropped(b, g, "closed the link");
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            return SHOAL_OK;
        }
        return shoal_boot_fail(b, SHOAL_ERR_PEER_FAILED, "reading the next rank of the ring");
    }
    g->bytes_in += (uint64_t)n;
    g->out_have += (size_t)n;
    if (g->out_have < sizeof(f)) {
        return SHOAL_OK;
    }
    memcpy(&f, g->out_buf, sizeof(f));
    if (f.magic == SHOAL_BOOT_FRAME_MAGIC && f.type == SHOAL_BOOT_REFUSED && f.len == 0) {
        shoal_status_t why = (shoal_status_t)(int32_t)f.round;
        if (why != SHOAL_ERR_AUTH && why != SHOAL_ERR_PERMISSION && why != SHOAL_ERR_INVALID_ARG) {
            /* Evicted or too slow (strangers filled the listener's slots): another try. */
            return shoal_ring_out_dropped(b, g, "dropped the connection");
        }
        return shoal_boot_fail(b, why, "the next rank of the ring refused this rank");
    }
    if (f.magic != SHOAL_BOOT_FRAME_MAGIC || f.len != SHOAL_BOOT_NONCE ||
        f.type != (g->out_state == SHOAL_RING_OUT_CHALLENGE ? SHOAL_BOOT_CHALLENGE
                                                             : SHOAL_BOOT_WELCOME)) {
        return shoal_boot_fail(b, SHOAL_ERR_PROTOCOL, "unexpected frame from the next rank of "
                               "the ring during its handshake");
    }
    if (g->out_have < sizeof(f) + f.len) {
        return SHOAL_OK;
    }
    g->out_have = 0;
    if (g->out_state == SHOAL_RING_OUT_CHALLENGE) {
        memcpy(g->out_lnonce, g->out_buf + sizeof(f), SHOAL_BOOT_NONCE);
        return shoal_ring_out_hello(b, g);
    }
    uint8_t want_mac[SHOAL_HMAC_BYTES];
    shoal_boot_peer_welcome_mac(b->secret, g->out_lnonce, &g->out_hello, want_mac);
    if (!shoal_memeq_ct(want_mac, g->out_buf + sizeof(f), sizeof(want_mac))) {
        return shoal_boot_fail(b, SHOAL_ERR_AUTH, "the next rank of the ring does not know the "
                               "job secret");
    }
    shoal_boot_peer_session_key(b->secret, g->out_lnonce, &g->out_hello, g->next_key);
    g->out_state = SHOAL_RING_OUT_DONE;
    shoal_trace(BOOT, "rank %d: ring link to rank %d (%s) up", b->rank, (b->rank + 1) % b->nranks,
                g->next_str);
    return SHOAL_OK;
}

/* The root connection is quiet during ring rounds: whatever arrives is the root's failure
 * notice (or its end). Always an error. */
static shoal_status_t shoal_ring_root_notice(shoal_boot_t *b, uint64_t deadline)
{
    uint8_t none = 0;
    shoal_status_t st = shoal_boot_read_frame(b, 1, SHOAL_BOOT_FAILED, &none, 1, deadline);
    return st != SHOAL_OK ? st : SHOAL_ERR_PROTOCOL;
}

/* Both links of this rank, with the listener serving strangers meanwhile. */
static shoal_status_t shoal_ring_links(shoal_boot_t *b, shoal_boot_ring_t *g, uint64_t deadline)
{
    struct pollfd pfds[3 + SHOAL_BOOT_MAX_PENDING];
    shoal_ring_pending_t *who[3 + SHOAL_BOOT_MAX_PENDING];

    while (g->out_state != SHOAL_RING_OUT_DONE || g->prev_fd < 0) {
        int n = 0, ret, stalled = g->accept_stall.since_ns != 0 && g->prev_fd < 0;
        char why[192], what[256];
        if (shoal_aborted(b->abort_flag)) {
            return shoal_boot_fail(b, SHOAL_ERR_ABORTED, "making the ring's links");
        }
        /* accept() failing for want of a resource fails again at every pass while the
         * previous rank waits in the backlog, and the listener stays readable: the rank spun
         * on it without a word until its timeout, then blamed the previous rank. It tries
         * every 50 ms, and gives up after SHOAL_ACCEPT_STALL_NS, saying why. */
        if (stalled && shoal_accept_stall_over(&g->accept_stall, SHOAL_ACCEPT_STALL_NS, why,
                                               sizeof(why))) {
            snprintf(what, sizeof(what), "the ring's listener cannot take the previous "
                     "rank: %.190s", why);
            return shoal_boot_fail(b, SHOAL_ERR_SYSTEM, what);
        }
        if (shoal_deadline_passed(deadline)) {
            return shoal_boot_fail(b, SHOAL_ERR_TIMEOUT, g->prev_fd < 0
                                                             ? "the previous rank of the ring "
                                                               "never proved itself"
                                                             : "the next rank of the ring "
                                                               "never answered");
        }
        pfds[n] = (struct pollfd){.fd = b->fd, .events = POLLIN};
        who[n++] = NULL;
        pfds[n] = (struct pollfd){.fd = g->out_state != SHOAL_RING_OUT_DONE ? g->next_fd : -1,
                                  .events = POLLIN};
        who[n++] = NULL;
        pfds[n] = (struct pollfd){.fd = g->prev_fd < 0 && !stalled ? g->lfd : -1,
                                  .events = POLLIN};
        who[n++] = NULL;
        for (int i = 0; i < SHOAL_BOOT_MAX_PENDING && g->prev_fd < 0; i++) {
            if (g->pend[i].fd >= 0) {
                if (shoal_deadline_passed(g->pend[i].deadline_ns)) {
                    shoal_ring_refuse(b, g, &g->pend[i], SHOAL_ERR_TIMEOUT, "no hello in time");
                    continue;
                }
                pfds[n] = (struct pollfd){.fd = g->pend[i].fd, .events = POLLIN};
                who[n++] = &g->pend[i];
            }
        }
        ret = poll(pfds, (nfds_t)n, shoal_deadline_left_ms(deadline, stalled ? 50 : 100));
        if (ret < 0 && errno != EINTR) {
            return shoal_boot_fail(b, SHOAL_ERR_SYSTEM, "poll on the ring's links");
        }
        if (stalled) {
            shoal_ring_accept(b, g);
        }
        if (ret <= 0) {
            continue;
        }
        if (pfds[0].revents != 0) {
            return shoal_ring_root_notice(b, deadline);
        }
        if (pfds[1].revents != 0) {
            SHOAL_CHECK(shoal_ring_out_read(b, g));
        }
        if (g->redial) {
            close(g->next_fd);
            g->next_fd = -1;
            g->redial = 0;
            g->out_state = SHOAL_RING_OUT_CHALLENGE;
            g->out_have = 0;
            shoal_sleep_us(SHOAL_MIN(1000u << SHOAL_MIN(g->redials, 7u), 100000u));
            SHOAL_CHECK(shoal_ring_dial(b, g, deadline));
        }
        for (int k = 3; k < n && g->prev_fd < 0; k++) {
            if (pfds[k].revents != 0 && who[k]->fd == pfds[k].fd) {
                SHOAL_CHECK(shoal_ring_pend_read(b, g, who[k]));
            }
        }
        if (pfds[2].revents != 0 && g->prev_fd < 0) {
            shoal_ring_accept(b, g);
        }
    }
    return SHOAL_OK;
}

static void shoal_ring_untrust(shoal_boot_ring_t *g)
{
    if (g->prev_trusted) {
        shoal_tenant_breaker_trust((const struct sockaddr *)&g->prev_addr, -1);
        g->prev_trusted = 0;
    }
}

/* The listener's work is over once the previous rank is in: strangers still waiting are
 * closed with it. */
static void shoal_ring_stop_listening(shoal_boot_ring_t *g)
{
    for (int i = 0; i < SHOAL_BOOT_MAX_PENDING; i++) {
        if (g->pend[i].fd >= 0) {
            shoal_ring_pend_close(&g->pend[i]);
        }
    }
    if (g->lfd >= 0) {
        close(g->lfd);
        g->lfd = -1;
    }
    shoal_ring_untrust(g);
}

static shoal_status_t shoal_ring_open(shoal_boot_t *b)
{
    uint64_t deadline = shoal_deadline_ns(b->timeout_ms);
    uint8_t rec[SHOAL_BOOT_RING_REC], pair[2 * SHOAL_BOOT_RING_REC];
    socklen_t plen;
    shoal_boot_ring_t *g = calloc(1, sizeof(*g));
    shoal_status_t st;

    if (g == NULL) {
        return shoal_boot_fail(b, SHOAL_ERR_NO_MEMORY, "allocating the ring");
    }
    g->lfd = g->next_fd = g->prev_fd = -1;
    for (int i = 0; i < SHOAL_BOOT_MAX_PENDING; i++) {
        g->pend[i].fd = -1;
    }
    b->ring = g;
    SHOAL_CHECK(shoal_ring_listen(b, g, rec));
    st = shoal_boot_send_frame(b, SHOAL_BOOT_RING, rec, sizeof(rec), deadline);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "sending to the root");
    }
    SHOAL_CHECK(shoal_boot_read_frame(b, 1, SHOAL_BOOT_RING, pair, sizeof(pair), deadline));
    b->round++;
    if (shoal_ring_rec_decode(pair, &g->prev_addr, &plen) != SHOAL_OK ||
        shoal_ring_rec_decode(pair + SHOAL_BOOT_RING_REC, &g->next_addr, &g->next_len) !=
            SHOAL_OK) {
        return shoal_boot_fail(b, SHOAL_ERR_PROTOCOL, "the root's ring answer holds no address");
    }
    shoal_ring_rec_scope(b, &g->prev_addr);
    shoal_ring_rec_scope(b, &g->next_addr);
    shoal_tenant_breaker_trust((const struct sockaddr *)&g->prev_addr, +1);
    g->prev_trusted = 1;
    shoal_sockaddr_str(&g->next_addr, g->next_str, sizeof(g->next_str));
    SHOAL_CHECK(shoal_ring_dial(b, g, deadline));
    SHOAL_CHECK(shoal_ring_links(b, g, deadline));
    shoal_ring_stop_listening(g);
    return SHOAL_OK;
}

/* ---- ring rounds ---------------------------------------------------------------------- */

/* One received frame of a ring step. */
typedef struct {
    shoal_boot_frame_t hdr;
    size_t hdr_have;
    uint8_t *payload;                    /* where the record goes */
    size_t have;
    uint8_t mac[SHOAL_BOOT_MAC];
    size_t mac_have;
} shoal_ring_rx_t;

/* Bytes for the frame being read: header, then payload, then MAC. */
static uint8_t *shoal_ring_rx_target(shoal_ring_rx_t *x, size_t *want_p)
{
    if (x->hdr_have < sizeof(x->hdr)) {
        *want_p = sizeof(x->hdr) - x->hdr_have;
        return (uint8_t *)&x->hdr + x->hdr_have;
    }
    if (x->have < x->hdr.len) {
        *want_p = x->hdr.len - x->have;
        return x->payload + x->have;
    }
    *want_p = sizeof(x->mac) - x->mac_have;
    return x->mac + x->mac_have;
}

/* Reads what the previous rank sent of the frame carrying the record of rank origin. fixed:
 * the record's length, read into *dst; (uint32_t)-1: any length up to SHOAL_BOOT_MAX_BLOB,
 * into a buffer allocated here (x->payload). *got_p: the frame is complete and its MAC holds. */
static shoal_status_t shoal_ring_rx_read(shoal_boot_t *b, shoal_boot_ring_t *g,
                                         shoal_ring_rx_t *x, uint32_t type, int origin,
                                         uint32_t fixed, uint8_t *dst, int *got_p)
{
    while (!*got_p) {
        size_t want;
        uint8_t *to = shoal_ring_rx_target(x, &want);
        ssize_t n = recv(g->prev_fd, to, want, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            return shoal_boot_fail(b, SHOAL_ERR_PEER_FAILED, "the previous rank of the ring "
                                   "left during the exchange");
        }
        if (n < 0) {
            return SHOAL_OK;
        }
        g->bytes_in += (uint64_t)n;
        if (x->hdr_have < sizeof(x->hdr)) {
            x->hdr_have += (size_t)n;
            if (x->hdr_have < sizeof(x->hdr)) {
                continue;
            }
            /* The length is the sender's word until the MAC says otherwise: bounded before
             * any allocation. */
            if (x->hdr.magic != SHOAL_BOOT_FRAME_MAGIC || x->hdr.type != type ||
                x->hdr.round != (uint32_t)origin ||
                (fixed != UINT32_MAX ? x->hdr.len != fixed : x->hdr.len > SHOAL_BOOT_MAX_BLOB)) {
                return shoal_boot_fail(b, SHOAL_ERR_PROTOCOL, "unexpected frame from the "
                                       "previous rank of the ring");
            }
            x->payload = fixed != UINT32_MAX ? dst : malloc(x->hdr.len > 0 ? x->hdr.len : 1);
            if (x->payload == NULL) {
                return shoal_boot_fail(b, SHOAL_ERR_NO_MEMORY, "a ring record");
            }
        } else if (x->have < x->hdr.len) {
            x->have += (size_t)n;
        } else {
            uint8_t digest[SHOAL_HMAC_BYTES], want_mac[SHOAL_BOOT_MAC];
            x->mac_have += (size_t)n;
            if (x->mac_have < sizeof(x->mac)) {
                continue;
            }
            shoal_boot_payload_digest(x->payload, x->hdr.len, digest);
            shoal_boot_frame_mac(g->prev_key, SHOAL_BOOT_DIR_UP, g->rx_seq, &x->hdr, digest,
                                 want_mac);
            if (!shoal_memeq_ct(want_mac, x->mac, sizeof(want_mac))) {
                return shoal_boot_fail(b, SHOAL_ERR_AUTH, "a frame from the previous rank of "
                                       "the ring fails its MAC (tampered, replayed or "
                                       "reordered)");
            }
            g->rx_seq++;
            *got_p = 1;
        }
    }
    return SHOAL_OK;
}

/* One step: sends the frame in tx (already MAC'd) while it receives the previous rank's
 * frame for the record of rank origin (fixed, *dst as shoal_ring_rx_read; a record of any
 * length is returned in *dst). The root connection is watched for its failure notice. */
static shoal_status_t shoal_ring_step(shoal_boot_t *b, shoal_boot_ring_t *g, uint32_t type,
                                      const uint8_t *tx, size_t txlen, int origin,
                                      uint32_t fixed, uint8_t **dst, uint32_t *dlen,
                                      uint64_t deadline)
{
    shoal_ring_rx_t x = {.payload = NULL};
    size_t sent = 0;
    int got = 0;
    shoal_status_t st = SHOAL_OK;

    while (st == SHOAL_OK && (sent < txlen || !got)) {
        struct pollfd pfds[3] = {{.fd = b->fd, .events = POLLIN},
                                 {.fd = sent < txlen ? g->next_fd : -1, .events = POLLOUT},
                                 {.fd = got ? -1 : g->prev_fd, .events = POLLIN}};
        int ret;
        if (shoal_aborted(b->abort_flag)) {
            st = shoal_boot_fail(b, SHOAL_ERR_ABORTED, "in a ring round");
            break;
        }
        if (shoal_deadline_passed(deadline)) {
            st = shoal_boot_fail(b, SHOAL_ERR_TIMEOUT, got ? "the next rank of the ring does not "
                                                             "take its records"
                                                           : "no record from the previous rank "
                                                             "of the ring");
            break;
        }
        ret = poll(pfds, 3, shoal_deadline_left_ms(deadline, 100));
        if (ret < 0 && errno != EINTR) {
            st = shoal_boot_fail(b, SHOAL_ERR_SYSTEM, "poll in a ring round");
        } else if (ret > 0 && pfds[0].revents != 0) {
            st = shoal_ring_root_notice(b, deadline);
        } else if (ret > 0) {
            if (pfds[1].revents != 0) {
                ssize_t n = send(g->next_fd, tx + sent, txlen - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n > 0) {
                    sent += (size_t)n;
                    g->bytes_out += (uint64_t)n;
                } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    st = shoal_boot_fail(b, SHOAL_ERR_PEER_FAILED, "the next rank of the ring "
                                         "left during the exchange");
                }
            }
            if (st == SHOAL_OK && pfds[2].revents != 0) {
                st = shoal_ring_rx_read(b, g, &x, type, origin, fixed, *dst, &got);
            }
        }
    }
    if (st == SHOAL_OK) {
        if (fixed == UINT32_MAX) {
            *dst = x.payload;
            x.payload = NULL;
        }
        *dlen = x.hdr.len;
    }
    if (fixed == UINT32_MAX) {
        free(x.payload);
    }
    return st;
}

/* header | payload | MAC of a record for the next rank. */
static uint8_t *shoal_ring_frame(shoal_boot_ring_t *g, uint32_t type, int origin,
                                 const uint8_t *rec, uint32_t len, size_t *len_p)
{
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = type, .len = len,
                            .round = (uint32_t)origin};
    uint8_t digest[SHOAL_HMAC_BYTES];
    uint8_t *buf = malloc(sizeof(f) + (size_t)len + SHOAL_BOOT_MAC);
    if (buf == NULL) {
        return NULL;
    }
    memcpy(buf, &f, sizeof(f));
    if (len > 0) {
        memcpy(buf + sizeof(f), rec, len);
    }
    shoal_boot_payload_digest(rec, len, digest);
    shoal_boot_frame_mac(g->next_key, SHOAL_BOOT_DIR_UP, g->tx_seq++, &f, digest,
                         buf + sizeof(f) + len);
    *len_p = sizeof(f) + (size_t)len + SHOAL_BOOT_MAC;
    return buf;
}

/* n-1 steps: at step s this rank sends the record of rank (me - s) and receives that of rank
 * (me - s - 1). recs[me] / lens[me] hold this rank's own record; fixed as shoal_ring_step. */
static shoal_status_t shoal_ring_round(shoal_boot_t *b, uint32_t type, uint32_t fixed,
                                       uint8_t **recs, uint32_t *lens)
{
    uint64_t deadline = shoal_deadline_ns(b->timeout_ms), t0 = shoal_time_ns();
    shoal_boot_ring_t *g;
    int n = b->nranks;

    if (b->ring == NULL) {
        shoal_status_t st = shoal_ring_open(b);
        if (st != SHOAL_OK) {
            b->ring_failed = 1;
            return st;
        }
    }
    g = b->ring;
    for (int s = 0; s < n - 1; s++) {
        int send_of = (b->rank - s + n) % n, recv_of = (b->rank - s - 1 + 2 * n) % n;
        size_t txlen = 0;
        uint8_t *tx = shoal_ring_frame(g, type, send_of, recs[send_of], lens[send_of], &txlen);
        shoal_status_t st;
        if (tx == NULL) {
            b->ring_failed = 1;
            return shoal_boot_fail(b, SHOAL_ERR_NO_MEMORY, "a ring frame");
        }
        st = shoal_ring_step(b, g, type, tx, txlen, recv_of, fixed, &recs[recv_of],
                             &lens[recv_of], deadline);
        free(tx);
        if (st != SHOAL_OK) {
            b->ring_failed = 1;
            return st;
        }
    }
    shoal_trace(BOOT, "rank %d: ring round of %d ranks in %.1f ms (%llu bytes in, %llu out on "
                "the links so far)", b->rank, n, (double)(shoal_time_ns() - t0) / 1e6,
                (unsigned long long)g->bytes_in, (unsigned long long)g->bytes_out);
    return SHOAL_OK;
}

shoal_status_t shoal_boot_ring_allgather(shoal_boot_t *b, const void *in, size_t len,
                                         void *out)
{
    uint8_t **recs;
    uint32_t *lens;
    shoal_status_t st;

    if (len > SHOAL_BOOT_MAX_BLOB || (size_t)b->nranks * len > UINT32_MAX) {
        return shoal_boot_fail(b, SHOAL_ERR_INVALID_ARG, "allgather blob too large");
    }
    recs = malloc(sizeof(*recs) * (size_t)b->nranks);
    lens = malloc(sizeof(*lens) * (size_t)b->nranks);
    if (recs == NULL || lens == NULL) {
        free(recs);
        free(lens);
        return shoal_boot_fail(b, SHOAL_ERR_NO_MEMORY, "allocating a ring round");
    }
    for (int k = 0; k < b->nranks; k++) {
        recs[k] = (uint8_t *)out + (size_t)k * len;
        lens[k] = (uint32_t)len;
    }
    if (len > 0) {
        memmove(recs[b->rank], in, len);
    }
    st = shoal_ring_round(b, SHOAL_BOOT_AG, (uint32_t)len, recs, lens);
    free(recs);
    free(lens);
    return st;
}

shoal_status_t shoal_boot_ring_allgatherv(shoal_boot_t *b, const void *in, size_t len,
                                          uint8_t **table_p, const uint8_t **ents,
                                          uint32_t *lens)
{
    int n = b->nranks;
    uint8_t **recs = calloc((size_t)n, sizeof(*recs)), *table = NULL;
    size_t total = 0, off = 0;
    shoal_status_t st;

    if (recs == NULL) {
        return shoal_boot_fail(b, SHOAL_ERR_NO_MEMORY, "allocating a ring round");
    }
    recs[b->rank] = malloc(len > 0 ? len : 1);
    if (recs[b->rank] == NULL) {
        st = shoal_boot_fail(b, SHOAL_ERR_NO_MEMORY, "allocating a ring round");
        goto out;
    }
    if (len > 0) {
        memcpy(recs[b->rank], in, len);
    }
    lens[b->rank] = (uint32_t)len;
    st = shoal_ring_round(b, SHOAL_BOOT_AGV, UINT32_MAX, recs, lens);
    if (st != SHOAL_OK) {
        goto out;
    }
    /* The same table as the root's: per rank u32 length | record. */
    for (int k = 0; k < n; k++) {
        total += 4 + (size_t)lens[k];
    }
    table = malloc(total > 0 ? total : 1);
    if (table == NULL) {
        st = shoal_boot_fail(b, SHOAL_ERR_NO_MEMORY, "allocating the round's table");
        goto out;
    }
    for (int k = 0; k < n; k++) {
        shoal_put_le(table + off, lens[k], 4);
        if (lens[k] > 0) {
            memcpy(table + off + 4, recs[k], lens[k]);
        }
        ents[k] = table + off + 4;
        off += 4 + (size_t)lens[k];
    }
    *table_p = table;
out:
    for (int k = 0; k < n; k++) {
        free(recs[k]);
    }
    free(recs);
    return st;
}

void shoal_boot_ring_close(shoal_boot_t *b)
{
    shoal_boot_ring_t *g = b->ring;
    if (g == NULL) {
        return;
    }
    shoal_ring_stop_listening(g);
    if (g->next_fd >= 0) {
        close(g->next_fd);
    }
    if (g->prev_fd >= 0) {
        close(g->prev_fd);
    }
    shoal_secret_wipe(g->next_key, sizeof(g->next_key));
    shoal_secret_wipe(g->prev_key, sizeof(g->prev_key));
    free(g);
    b->ring = NULL;
}
