/* TCP transport: connect_all. Lower ranks accept, higher ranks connect, nsocks sockets per
 * pair. Every socket runs a mutual challenge-response handshake in which both sides
 * contribute a fresh nonce, so that no recorded handshake replays against a later run:
 *   connector -> hello (magic, version, length, comm_id, rank, socket index, nsocks, nonce_c)
 *   acceptor  -> nonce_a (32 random bytes)
 *   connector -> HMAC(secret, "shoal-tcp" | transcript)
 *   acceptor  -> HMAC(secret, "shoal-tcp-ack" | transcript), only once the connector's proof
 *                checked out (a stranger never obtains a proof of ours);
 * transcript = comm_id | nonce_c | nonce_a | from | to | socket index | nsocks. The connector
 * checks the acceptor's proof before the socket carries data.
 * All non-blocking connects and accepted sockets are driven together by one epoll loop, so no
 * rank waits for another to reach a particular point. Strangers are refused and forgotten:
 * an accepted connection must send its hello within SHOAL_SOCKET_HELLO_TIMEOUT and finish the
 * handshake within the communicator timeout; when every slot is taken, the oldest connection
 * that has not proved anything is closed (connectors reconnect when closed early); sources
 * that keep failing are refused by the circuit breaker (src/tenant/breaker.c). */
#include "transports/tcp/tcp_hs.h"
#include "tenant/breaker.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOAL_TCP_SPARE_SLOTS 64     /* room for strangers next to the expected sockets */
#define SHOAL_TCP_LOOP_MS 10         /* the abort flag is looked at this often */
#define SHOAL_TCP_RETRY_MS 20        /* first pause before connecting again after a refusal */
#define SHOAL_TCP_READ_DEFAULT_MS 30000 /* handshake deadline when timeout_ms < 0 */
#define SHOAL_TCP_AUTH_TRIES 3       /* closes right after our proof before SHOAL_ERR_AUTH */
#define SHOAL_TCP_LAZY_GRACE_MS 20   /* lazy: the lower rank's head start to the higher's */
#define SHOAL_TCP_GONE_GRACE_MS 200  /* eager: a gone peer's blame waits this long for ours */

static int shoal_tcp_hs_sending(int state)
{
    return state == SHOAL_TCP_HS_C_HELLO || state == SHOAL_TCP_HS_C_PROOF ||
           state == SHOAL_TCP_HS_A_CHAL || state == SHOAL_TCP_HS_A_ACK;
}

static void shoal_tcp_hs_next(shoal_tcp_hs_t *hs, int state, size_t len)
{
    hs->state = state;
    hs->off = 0;
    hs->len = len;
}

static void shoal_tcp_hs_free(shoal_tcp_hs_t *hs)
{
    if (hs->fd >= 0) {
        close(hs->fd);
    }
    hs->fd = -1;
    hs->state = SHOAL_TCP_HS_FREE;
}

/* Acceptor side: refuse, count against the source, log (in full once per source per
 * minute, so that a flood does not flood the log), forget. */
static void shoal_tcp_hs_refuse(shoal_tcp_hs_t *hs, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void shoal_tcp_hs_refuse(shoal_tcp_hs_t *hs, const char *fmt, ...)
{
    char why[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (shoal_tenant_breaker_note_fail((struct sockaddr *)&hs->src)) {
        shoal_error(TCP, "refused connection from %s: %s", hs->from, why);
    } else {
        shoal_trace(TCP, "refused connection from %s: %s", hs->from, why);
    }
    shoal_tcp_hs_free(hs);
}

/* Connector side: the first fatal error ends connect_all. */
static void shoal_tcp_conn_fatal(shoal_tcp_conn_t *conn, shoal_status_t st, const char *fmt,
                                 ...) __attribute__((format(printf, 3, 4)));
static void shoal_tcp_conn_fatal(shoal_tcp_conn_t *conn, shoal_status_t st, const char *fmt, ...)
{
    char why[224];
    va_list ap;
    if (conn->status != SHOAL_OK) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    shoal_error(TCP, "%s", why);
    snprintf(conn->why, sizeof(conn->why), "%s", why);
    conn->status = st;
}

static shoal_ep_t *shoal_tcp_conn_ep(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    return &conn->ctx->eps[hs->ep_idx];
}

static int shoal_tcp_find_ep(shoal_tl_ctx_t *ctx, uint32_t rank)
{
    int lo = 0, hi = ctx->neps - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if ((uint32_t)ctx->eps[mid].peer == rank) {
            return mid;
        }
        if ((uint32_t)ctx->eps[mid].peer < rank) {
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return -1;
}

static shoal_status_t shoal_tcp_epoll_add(shoal_tl_ctx_t *ctx, int fd)
{
    struct epoll_event ev = {
        .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
        .data.fd = fd,
    };
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        shoal_error(TCP, "epoll_ctl(ADD, fd %d) failed: %s", fd, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    return SHOAL_OK;
}

static int shoal_tcp_hs_connector(const shoal_tcp_hs_t *hs)
{
    return hs->state >= SHOAL_TCP_HS_RETRY && hs->state < SHOAL_TCP_HS_A_HELLO;
}

/* Lazy: the slot other than skip that carries socket sock_idx of endpoint ep_idx, connecting
 * (connector 1), accepting past the hello (0) or either (-1); NULL if none. */
static shoal_tcp_hs_t *shoal_tcp_lazy_find(shoal_tcp_conn_t *conn, int ep_idx, int sock_idx,
                                           int connector, const shoal_tcp_hs_t *skip)
{
    for (int i = 0; i < conn->nslots; i++) {
        shoal_tcp_hs_t *hs = &conn->slots[i];
        if (hs != skip && hs->state != SHOAL_TCP_HS_FREE && hs->ep_idx == ep_idx &&
            hs->sock_idx == sock_idx &&
            (connector < 0 || connector == shoal_tcp_hs_connector(hs))) {
            return hs;
        }
    }
    return NULL;
}

/* Lazy: socket sock_idx of endpoint ep_idx is established, whichever side connected it. Our
 * own connection of the same socket, if any, lost the race (see shoal_tcp_hs_got_hello). */
static void shoal_tcp_lazy_established(shoal_tcp_conn_t *conn, int ep_idx, int sock_idx)
{
    shoal_ep_t *ep = &conn->ctx->eps[ep_idx];
    shoal_tcp_hs_t *mine;
    while ((mine = shoal_tcp_lazy_find(conn, ep_idx, sock_idx, 1, NULL)) != NULL) {
        shoal_tcp_hs_free(mine);
    }
    if (ep->nestablished == ep->nsocks) {
        conn->ctx->nconnected++;
        shoal_trace(TCP, "rank %d: connected to peer %d (%s) at first use, %d sockets (%d of "
                    "%d peers)", conn->ctx->rank, ep->peer, ep->name, ep->nsocks,
                    conn->ctx->nconnected, conn->ctx->neps);
    }
}

/* The handshake socket becomes data socket sock_idx of its endpoint. */
static void shoal_tcp_hs_establish(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    ep->fds[hs->sock_idx] = hs->fd;
    if (conn->ctx->qos_rate_max > 0) {
        shoal_tcp_socket_qos(conn->ctx, hs->fd,
                             SHOAL_MAX(conn->ctx->qos_rate_max / (uint64_t)ep->nsocks, 1));
    }
    ep->nestablished++;
    conn->nestablished++;
    shoal_trace(TCP, "rank %d: socket %d of %d to peer %d (%s) established (fd %d)",
                conn->ctx->rank, hs->sock_idx, ep->nsocks, ep->peer, ep->name, hs->fd);
    hs->fd = -1;
    hs->state = SHOAL_TCP_HS_FREE;
    if (conn->lazy) {
        shoal_tcp_lazy_established(conn, hs->ep_idx, hs->sock_idx);
    }
}

/* ---- connector --------------------------------------------------------------------------- */

static int shoal_tcp_retryable(int err)
{
    return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH ||
           err == EHOSTUNREACH || err == ECONNRESET || err == EAGAIN;
}

static void shoal_tcp_hs_retry(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs, int err)
{
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    if (!shoal_tcp_retryable(err)) {
        shoal_tcp_conn_fatal(conn, SHOAL_ERR_TRANSPORT, "connect to peer %d (%s) failed: %s",
                             ep->peer, ep->name, strerror(err));
        return;
    }
    /* Its listener was there (we learnt its address after it listened): a refusal means it
     * has closed, its process is gone or has failed its init. A peer listens until every
     * rank has connected to it (eager: ready() comes after the core's barrier, so not before
     * our sockets are established), a lazy one from init to destroy: refused twice more, it
     * is gone. Eager waited for the whole timeout here (300 s by default), then blamed a
     * timeout on a peer that had refused every connection. */
    if (err == ECONNREFUSED && (hs->early_closes + hs->auth_closes > 0 || hs->retries >= 2)) {
        shoal_tcp_conn_fatal(conn, SHOAL_ERR_PEER_FAILED, "peer %d (%s) %s on socket %d and "
                             "no longer listens", ep->peer, ep->name,
                             hs->early_closes + hs->auth_closes > 0
                                 ? "closed our handshake" : "refused our connections",
                             hs->sock_idx);
        return;
    }
    shoal_trace(TCP, "connect to peer %d (%s): %s, retrying", ep->peer, ep->name,
                strerror(err));
    if (hs->fd >= 0) {
        close(hs->fd);
        hs->fd = -1;
    }
    hs->retries++;
    hs->state = SHOAL_TCP_HS_RETRY;
    hs->time_ns = shoal_time_ns() +
                  (uint64_t)SHOAL_TCP_RETRY_MS * SHOAL_MIN(hs->retries, 10) * 1000000ull;
}

void shoal_tcp_hs_hello(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    if (shoal_random_bytes(hs->nc, sizeof(hs->nc)) != SHOAL_OK) {
        conn->status = SHOAL_ERR_SYSTEM;
        return;
    }
    shoal_tcp_hello_t h = {
        .magic = SHOAL_TCP_HELLO_MAGIC,
        .version = SHOAL_TCP_HELLO_VERSION,
        .length = SHOAL_TCP_HELLO_BYTES,
        .comm_id = conn->ctx->comm_id,
        .rank = (uint32_t)conn->ctx->rank,
        .sock_idx = (uint32_t)hs->sock_idx,
        .nsocks = (uint32_t)ep->nsocks,
    };
    memcpy(h.nonce, hs->nc, sizeof(h.nonce));
    shoal_tcp_hello_encode(&h, hs->buf);
    shoal_tcp_hs_next(hs, SHOAL_TCP_HS_C_HELLO, SHOAL_TCP_HELLO_BYTES);
}

static void shoal_tcp_hs_connect(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    struct sockaddr_storage ss;
    socklen_t slen;
    shoal_tcp_addr_t a;

    (void)shoal_tcp_addr_decode(ep->addr_raw, SHOAL_TCP_ADDR_BYTES, &a);
    shoal_tcp_addr_sockaddr(&a, &ss, &slen);
    hs->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (hs->fd < 0) {
        shoal_tcp_conn_fatal(conn, SHOAL_ERR_TRANSPORT, "socket() to connect to peer %d (%s) "
                             "failed: %s", ep->peer, ep->name, strerror(errno));
        return;
    }
    if (shoal_tcp_socket_setopts(ctx, hs->fd, 1) != SHOAL_OK ||
        shoal_tcp_epoll_add(ctx, hs->fd) != SHOAL_OK) {
        conn->status = SHOAL_ERR_TRANSPORT;
        return;
    }
    if (connect(hs->fd, (struct sockaddr *)&ss, slen) == 0) {
        shoal_tcp_hs_hello(conn, hs);
    } else if (errno == EINPROGRESS || errno == EINTR) {
        hs->state = SHOAL_TCP_HS_CONNECTING;
    } else {
        shoal_tcp_hs_retry(conn, hs, errno);
    }
}

/* A non-blocking connect finished? */
static void shoal_tcp_hs_connecting(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    int err = 0;
    socklen_t elen = sizeof(err);
    struct sockaddr_storage ss;
    socklen_t slen = sizeof(ss);

    if (getsockopt(hs->fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
        err = errno;
    }
    if (err != 0) {
        shoal_tcp_hs_retry(conn, hs, err);
    } else if (getpeername(hs->fd, (struct sockaddr *)&ss, &slen) == 0) {
        shoal_tcp_hs_hello(conn, hs);
    } else if (errno != ENOTCONN) {
        shoal_tcp_hs_retry(conn, hs, errno);
    }
}

/* The transcript of hs: the connector's rank first. */
static shoal_tcp_transcript_t shoal_tcp_hs_transcript(shoal_tcp_conn_t *conn,
                                                      shoal_tcp_hs_t *hs, int connector)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    return (shoal_tcp_transcript_t){
        .comm_id = ctx->comm_id,
        .nonce_c = hs->nc,
        .nonce_a = hs->na,
        .from = (uint32_t)(connector ? ctx->rank : ep->peer),
        .to = (uint32_t)(connector ? ep->peer : ctx->rank),
        .sock_idx = (uint32_t)hs->sock_idx,
        .nsocks = (uint32_t)ep->nsocks,
    };
}

static void shoal_tcp_hs_connector_step(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    shoal_tcp_transcript_t t = shoal_tcp_hs_transcript(conn, hs, 1);
    uint8_t want[SHOAL_HMAC_BYTES];

    switch (hs->state) {
    case SHOAL_TCP_HS_C_HELLO:
        shoal_tcp_hs_next(hs, SHOAL_TCP_HS_C_CHAL, SHOAL_TCP_CHALLENGE_BYTES);
        break;
    case SHOAL_TCP_HS_C_CHAL:
        memcpy(hs->na, hs->buf, SHOAL_TCP_NONCE_BYTES);
        if (shoal_tcp_proof(ctx->secret, "shoal-tcp", &t, hs->buf) != SHOAL_OK) {
            conn->status = SHOAL_ERR_INTERNAL;
            break;
        }
        shoal_tcp_hs_next(hs, SHOAL_TCP_HS_C_PROOF, SHOAL_HMAC_BYTES);
        break;
    case SHOAL_TCP_HS_C_PROOF:
        shoal_tcp_hs_next(hs, SHOAL_TCP_HS_C_ACK, SHOAL_HMAC_BYTES);
        break;
    case SHOAL_TCP_HS_C_ACK:
        if (shoal_tcp_proof(ctx->secret, "shoal-tcp-ack", &t, want) != SHOAL_OK) {
            conn->status = SHOAL_ERR_INTERNAL;
            break;
        }
        if (!shoal_memeq_ct(want, hs->buf, SHOAL_HMAC_BYTES)) {
            shoal_tcp_conn_fatal(conn, SHOAL_ERR_AUTH, "peer %d (%s) failed to prove the job "
                                 "secret on socket %d", ep->peer, ep->name, hs->sock_idx);
            break;
        }
        shoal_tcp_hs_establish(conn, hs);
        break;
    }
}

/* ---- acceptor ---------------------------------------------------------------------------- */

static void shoal_tcp_hs_got_hello(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    shoal_tcp_hello_t h;
    shoal_ep_t *ep;

    shoal_tcp_hello_decode(hs->buf, &h);
    if (h.magic != SHOAL_TCP_HELLO_MAGIC || h.version != SHOAL_TCP_HELLO_VERSION ||
        h.length != SHOAL_TCP_HELLO_BYTES) {
        shoal_tcp_hs_refuse(hs, "bad hello (magic 0x%08x, version %u, length %u)", h.magic,
                            h.version, h.length);
        return;
    }
    if (h.comm_id != ctx->comm_id) {
        shoal_tcp_hs_refuse(hs, "hello for communicator %08x, ours is %08x", h.comm_id,
                            ctx->comm_id);
        return;
    }
    hs->ep_idx = shoal_tcp_find_ep(ctx, h.rank);
    if (hs->ep_idx < 0 || h.rank == (uint32_t)ctx->rank ||
        (!conn->lazy && h.rank < (uint32_t)ctx->rank)) {
        shoal_tcp_hs_refuse(hs, "hello from rank %u, not a peer that connects to rank %d",
                            h.rank, ctx->rank);
        return;
    }
    ep = &ctx->eps[hs->ep_idx];
    /* Lazy, both sides connecting the same socket at once: the higher rank's connection
     * wins on both sides. The higher refuses the lower's hello here; the lower goes on with
     * the higher's and drops its own once this one is established (never at a mere hello,
     * which anyone can send). Once the higher has taken the lower's hello it does not
     * connect that socket itself (shoal_tcp_lazy_kick), so one connection survives. The
     * lower's connection may still arrive once the higher's is established: closed quietly
     * too (the lower rank starts its own only SHOAL_TCP_LAZY_GRACE_MS after it needs the
     * socket, so this is rare). */
    if (conn->lazy && ep->status != SHOAL_OK) {
        shoal_tcp_hs_refuse(hs, "rank %u: the endpoint failed", h.rank);
        return;
    }
    if (conn->lazy && h.rank < (uint32_t)ctx->rank && h.sock_idx < (uint32_t)ep->nsocks &&
        (ep->fds[h.sock_idx] >= 0 ||
         shoal_tcp_lazy_find(conn, hs->ep_idx, (int)h.sock_idx, 1, hs) != NULL)) {
        /* Not a stranger's failure: closed without counting against the source. */
        shoal_trace(TCP, "rank %d: socket %u of rank %u closed: we connect it ourselves and the "
                    "higher rank's connection wins", ctx->rank, h.sock_idx, h.rank);
        shoal_tcp_hs_free(hs);
        return;
    }
    if (h.nsocks != (uint32_t)ep->nsocks || h.sock_idx >= (uint32_t)ep->nsocks ||
        ep->fds[h.sock_idx] >= 0) {
        shoal_tcp_hs_refuse(hs, "rank %u: socket %u of %u, expected one of %d not yet "
                            "connected", h.rank, h.sock_idx, h.nsocks, ep->nsocks);
        return;
    }
    hs->sock_idx = (int)h.sock_idx;
    memcpy(hs->nc, h.nonce, sizeof(hs->nc));
    if (shoal_random_bytes(hs->na, sizeof(hs->na)) != SHOAL_OK) {
        conn->status = SHOAL_ERR_SYSTEM;
        return;
    }
    memcpy(hs->buf, hs->na, sizeof(hs->na));
    /* A hello that checks out: the rest of the handshake gets the communicator timeout. */
    hs->time_ns = hs->start_ns + conn->read_ns;
    shoal_tcp_hs_next(hs, SHOAL_TCP_HS_A_CHAL, SHOAL_TCP_CHALLENGE_BYTES);
}

static void shoal_tcp_hs_got_proof(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    shoal_tcp_transcript_t t = shoal_tcp_hs_transcript(conn, hs, 0);
    uint8_t want[SHOAL_HMAC_BYTES];

    /* Verify first, then prove: our proof goes only to a connector that proved itself. */
    if (shoal_tcp_proof(ctx->secret, "shoal-tcp", &t, want) != SHOAL_OK) {
        conn->status = SHOAL_ERR_INTERNAL;
        return;
    }
    if (!shoal_memeq_ct(want, hs->buf, SHOAL_HMAC_BYTES)) {
        shoal_tcp_hs_refuse(hs, "wrong proof of the job secret (claimed rank %d, socket %d)",
                            ep->peer, hs->sock_idx);
        return;
    }
    if (shoal_tcp_proof(ctx->secret, "shoal-tcp-ack", &t, hs->buf) != SHOAL_OK) {
        conn->status = SHOAL_ERR_INTERNAL;
        return;
    }
    shoal_tcp_hs_next(hs, SHOAL_TCP_HS_A_ACK, SHOAL_HMAC_BYTES);
}

static void shoal_tcp_hs_acceptor_step(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    switch (hs->state) {
    case SHOAL_TCP_HS_A_HELLO:
        shoal_tcp_hs_got_hello(conn, hs);
        break;
    case SHOAL_TCP_HS_A_CHAL:
        shoal_tcp_hs_next(hs, SHOAL_TCP_HS_A_PROOF, SHOAL_HMAC_BYTES);
        break;
    case SHOAL_TCP_HS_A_PROOF:
        shoal_tcp_hs_got_proof(conn, hs);
        break;
    case SHOAL_TCP_HS_A_ACK:
        if (shoal_tcp_conn_ep(conn, hs)->fds[hs->sock_idx] >= 0) {
            shoal_tcp_hs_refuse(hs, "duplicate socket %d of rank %d", hs->sock_idx,
                                shoal_tcp_conn_ep(conn, hs)->peer);
            break;
        }
        shoal_tenant_breaker_note_ok((struct sockaddr *)&hs->src);
        shoal_tcp_hs_establish(conn, hs);
        break;
    }
}

/* All slots taken: the oldest accepted connection that has not sent a hello, else the oldest
 * that has not proved the secret (only one that knows the communicator gets that far) makes
 * room. A real connector that was closed early reconnects. NULL if none qualifies. */
static shoal_tcp_hs_t *shoal_tcp_conn_evict(shoal_tcp_conn_t *conn)
{
    shoal_tcp_hs_t *victim = NULL;
    for (int tier = 0; tier < 2 && victim == NULL; tier++) {
        for (int i = 0; i < conn->nslots; i++) {
            shoal_tcp_hs_t *hs = &conn->slots[i];
            int ok = tier == 0 ? hs->state == SHOAL_TCP_HS_A_HELLO
                               : hs->state == SHOAL_TCP_HS_A_CHAL ||
                                     hs->state == SHOAL_TCP_HS_A_PROOF;
            if (ok && (victim == NULL || hs->start_ns < victim->start_ns)) {
                victim = hs;
            }
        }
    }
    if (victim != NULL) {
        shoal_tcp_hs_refuse(victim, "evicted: every handshake slot is taken and it has not "
                            "%s", victim->state == SHOAL_TCP_HS_A_HELLO
                                      ? "sent its hello" : "proved the job secret");
    }
    return victim;
}

static shoal_tcp_hs_t *shoal_tcp_conn_slot(shoal_tcp_conn_t *conn)
{
    for (int i = 0; i < conn->nslots; i++) {
        if (conn->slots[i].state == SHOAL_TCP_HS_FREE) {
            return &conn->slots[i];
        }
    }
    if (conn->lazy && conn->nslots < conn->maxslots) {
        /* Lazy: slots for the handshakes under way, grown on demand (the caller holds no
         * slot pointer across this call). */
        int n = SHOAL_MIN(conn->nslots * 2, conn->maxslots);
        shoal_tcp_hs_t *slots = realloc(conn->slots, (size_t)n * sizeof(*slots));
        if (slots != NULL) {
            memset(slots + conn->nslots, 0, (size_t)(n - conn->nslots) * sizeof(*slots));
            for (int i = conn->nslots; i < n; i++) {
                slots[i].fd = -1;
                slots[i].ep_idx = -1;
            }
            conn->slots = slots;
            int first = conn->nslots;
            conn->nslots = n;
            return &conn->slots[first];
        }
    }
    return shoal_tcp_conn_evict(conn);
}

void shoal_tcp_hs_accepted(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs, int fd,
                           const struct sockaddr_storage *src, const char *from)
{
    memset(hs, 0, sizeof(*hs));
    hs->fd = fd;
    hs->ep_idx = -1;
    snprintf(hs->from, sizeof(hs->from), "%s", from);
    memcpy(&hs->src, src, sizeof(*src));
    hs->start_ns = shoal_time_ns();
    hs->time_ns = hs->start_ns + conn->hello_ns;
    shoal_tcp_hs_next(hs, SHOAL_TCP_HS_A_HELLO, SHOAL_TCP_HELLO_BYTES);
}

/* accept() failed other than for an empty backlog. One that fails for want of a resource
 * (EMFILE, ENFILE, ENOBUFS) fails again at every pass while the connection waits in the
 * backlog, whose listener stays readable: once per pass it was 50000 lines in 300 ms. Logged
 * at most once a second, with the count of those not logged. */
static void shoal_tcp_conn_accept_failed(shoal_tcp_conn_t *conn, int err)
{
    unsigned missed;
    if (shoal_log_limit_pass(&conn->accept_warn, 1000000000ull, &missed)) {
        shoal_warn(TCP, "accept(fd %d) failed: %s (%u more failures not logged)",
                   conn->ctx->listen_fd, strerror(err), missed);
    }
}

static void shoal_tcp_conn_accept(shoal_tcp_conn_t *conn)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    /* At most a few slots' worth per pass: the loop then drives the handshakes and looks at
     * its deadline and abort flag, however fast a co-located stranger connects. */
    for (int n = 0; n < 4 * SHOAL_MAX(conn->nslots, 16); n++) {
        struct sockaddr_storage ss;
        socklen_t slen = sizeof(ss);
        char from[SHOAL_TCP_NAME_MAX];
        int fd = accept4(ctx->listen_fd, (struct sockaddr *)&ss, &slen,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == ECONNABORTED || err == EINTR) {
                continue;
            }
            if (err != EAGAIN && err != EWOULDBLOCK) {
                shoal_tcp_conn_accept_failed(conn, err);
            }
            (void)shoal_accept_stall_note(&conn->accept_stall, err);
            return;
        }
        (void)shoal_accept_stall_note(&conn->accept_stall, 0);
        if (!shoal_tenant_breaker_admit((struct sockaddr *)&ss)) {
            close(fd); /* logged by the breaker, once a minute */
            continue;
        }
        shoal_tcp_sockaddr_str((struct sockaddr *)&ss, from, sizeof(from));
        shoal_tcp_hs_t *hs = shoal_tcp_conn_slot(conn);
        if (hs == NULL || shoal_tcp_socket_setopts(ctx, fd, 1) != SHOAL_OK ||
            shoal_tcp_epoll_add(ctx, fd) != SHOAL_OK) {
            shoal_error(TCP, "refused connection from %s: %s", from,
                        hs == NULL ? "too many handshakes in progress" : "socket setup failed");
            close(fd);
            continue;
        }
        shoal_tcp_hs_accepted(conn, hs, fd, &ss, from);
    }
}

/* ---- the loop ---------------------------------------------------------------------------- */

/* Moves hs's current buffer. 1 complete, 0 would block, -1 error (errno; 0 = EOF). */
static int shoal_tcp_hs_io(shoal_tcp_hs_t *hs)
{
    return shoal_sock_step(hs->fd, hs->buf, &hs->off, hs->len, shoal_tcp_hs_sending(hs->state));
}

/* The acceptor closed (or reset) the connection: before our proof, it may have evicted us
 * (slots full of strangers) or timed us out: reconnect, within the communicator timeout. Right
 * after our proof, it refused the proof, unless it evicted us at that moment: reconnect a few
 * times, then conclude that the secrets differ. */
static void shoal_tcp_hs_closed_early(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs,
                                      const char *cause)
{
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    if (hs->state == SHOAL_TCP_HS_C_ACK || hs->state == SHOAL_TCP_HS_C_PROOF) {
        if (++hs->auth_closes >= SHOAL_TCP_AUTH_TRIES) {
            shoal_tcp_conn_fatal(conn, SHOAL_ERR_AUTH, "peer %d (%s) refused our handshake on "
                                 "socket %d %d times (%s): different job secret?", ep->peer,
                                 ep->name, hs->sock_idx, hs->auth_closes, cause);
            return;
        }
    } else {
        hs->early_closes++;
    }
    shoal_info(TCP, "peer %d (%s): %s during the handshake on socket %d, reconnecting",
               ep->peer, ep->name, cause, hs->sock_idx);
    shoal_tcp_hs_retry(conn, hs, ECONNRESET);
}

static void shoal_tcp_hs_io_failed(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs, int err)
{
    const char *cause = err == 0 ? "connection closed" : strerror(err);
    if (hs->state >= SHOAL_TCP_HS_A_HELLO) {
        shoal_tcp_hs_refuse(hs, "%s during the handshake", cause);
        return;
    }
    if (err == 0 || err == ECONNRESET || err == EPIPE || err == ECONNABORTED) {
        shoal_tcp_hs_closed_early(conn, hs, cause);
        return;
    }
    shoal_ep_t *ep = shoal_tcp_conn_ep(conn, hs);
    shoal_tcp_conn_fatal(conn, SHOAL_ERR_PEER_FAILED, "peer %d (%s): %s during the "
                         "handshake on socket %d", ep->peer, ep->name, cause, hs->sock_idx);
}

/* Lazy: an accepted connection past its hello keeps us from connecting its socket ourselves
 * (shoal_tcp_lazy_kick). One that has not proved the job secret may be a stranger that knows
 * the communicator (its id travels in every header): a hello, then silence, held the socket
 * for the whole communicator timeout while our requests to that peer waited on it. Once we
 * need the socket it gets the hello deadline, counted from its accept; a real peer that was
 * that slow reconnects (closed before its proof), and we connect meanwhile. */
static int shoal_tcp_hs_holds_wanted(shoal_tcp_conn_t *conn, const shoal_tcp_hs_t *hs,
                                     uint64_t now)
{
    const shoal_ep_t *ep;
    if (!conn->lazy || hs->ep_idx < 0 || now < hs->start_ns + conn->hello_ns ||
        (hs->state != SHOAL_TCP_HS_A_CHAL && hs->state != SHOAL_TCP_HS_A_PROOF)) {
        return 0;
    }
    ep = &conn->ctx->eps[hs->ep_idx];
    return ep->status == SHOAL_OK && (ep->sq_head != NULL || ep->rq_head != NULL);
}

void shoal_tcp_hs_drive(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs, uint64_t now)
{
    while (conn->status == SHOAL_OK) {
        int state = hs->state;
        if (state == SHOAL_TCP_HS_FREE) {
            return;
        }
        if (state == SHOAL_TCP_HS_RETRY) {
            if (now < hs->time_ns) {
                return;
            }
            shoal_tcp_hs_connect(conn, hs);
        } else if (state == SHOAL_TCP_HS_CONNECTING) {
            shoal_tcp_hs_connecting(conn, hs);
        } else {
            int r = shoal_tcp_hs_io(hs);
            if (r < 0) {
                shoal_tcp_hs_io_failed(conn, hs, errno);
            } else if (r == 0) {
                if (state == SHOAL_TCP_HS_A_HELLO && now >= hs->time_ns) {
                    shoal_tcp_hs_refuse(hs, "no hello within %llu ms",
                                        (unsigned long long)(conn->hello_ns / 1000000ull));
                } else if (state > SHOAL_TCP_HS_A_HELLO && now >= hs->time_ns) {
                    shoal_tcp_hs_refuse(hs, "handshake not finished within %llu ms",
                                        (unsigned long long)(conn->read_ns / 1000000ull));
                } else if (shoal_tcp_hs_holds_wanted(conn, hs, now)) {
                    shoal_tcp_hs_refuse(hs, "no proof within %llu ms while rank %d needs "
                                        "the socket", (unsigned long long)(conn->hello_ns /
                                                                           1000000ull),
                                        conn->ctx->rank);
                }
                return;
            } else if (state >= SHOAL_TCP_HS_A_HELLO) {
                shoal_tcp_hs_acceptor_step(conn, hs);
            } else {
                shoal_tcp_hs_connector_step(conn, hs);
            }
        }
        if (hs->state == state) {
            return; /* no progress possible now */
        }
    }
}

static shoal_status_t shoal_tcp_conn_timeout(shoal_tcp_conn_t *conn)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    int logged = 0;
    for (int i = 0; i < ctx->neps && logged < 4; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->nestablished < ep->nsocks) {
            shoal_error(TCP, "rank %d: timed out after %d ms waiting for peer %d (%s) to %s: "
                        "%d of %d sockets established", ctx->rank, ctx->timeout_ms, ep->peer,
                        ep->name, ep->peer < ctx->rank ? "accept" : "connect",
                        ep->nestablished, ep->nsocks);
            logged++;
        }
    }
    return SHOAL_ERR_TIMEOUT;
}

/* Eager: nothing travels on an established socket before the core's barrier, which comes
 * after every rank's connect_all, so its end or a reset while we still wait for other sockets
 * means that its peer is gone (its process died, or its connect_all failed and closed them).
 * Unlooked at, connect_all waited for the rest until its timeout and then blamed the peers
 * still missing. Peeked at: data that arrives (a peer done before us may send) stays. 1 (the
 * sentence in why) if a peer is gone. */
static int shoal_tcp_conn_gone(shoal_tcp_conn_t *conn, char *why, size_t len)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        for (int s = 0; s < ep->nsocks; s++) {
            uint8_t b;
            ssize_t r;
            if (ep->fds[s] < 0) {
                continue;
            }
            do {
                r = recv(ep->fds[s], &b, 1, MSG_PEEK | MSG_DONTWAIT);
            } while (r < 0 && errno == EINTR);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                snprintf(why, len, "rank %d: peer %d (%s)%s%s on socket %d after its handshake, "
                         "while connect_all waited for %d more sockets: the peer is gone",
                         ctx->rank, ep->peer, ep->name, r == 0 ? " closed the connection" : ": ",
                         r == 0 ? "" : strerror(errno), s, conn->nneeded - conn->nestablished);
                return 1;
            }
        }
    }
    return 0;
}

static shoal_status_t shoal_tcp_conn_loop(shoal_tcp_conn_t *conn)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    uint64_t deadline = shoal_deadline_ns(ctx->timeout_ms), gone_ns = 0;
    int hangup = 0; /* the last wait saw a socket's end, reset or error */
    char gone[224];

    for (;;) {
        uint64_t now = shoal_time_ns();
        char why[160];
        int nev;
        shoal_tcp_conn_accept(conn);
        /* Out of file descriptors, the peers waiting in the backlog can never be taken: say
         * so now, not at the timeout, minutes later. */
        if (shoal_accept_stall_over(&conn->accept_stall, SHOAL_ACCEPT_STALL_NS, why,
                                    sizeof(why))) {
            shoal_tcp_conn_fatal(conn, SHOAL_ERR_SYSTEM, "rank %d: cannot take the peers' "
                                 "connections: %s", ctx->rank, why);
        }
        for (int i = 0; i < conn->nslots && conn->status == SHOAL_OK; i++) {
            shoal_tcp_hs_drive(conn, &conn->slots[i], now);
        }
        /* After the drive: the edge may have come while its socket was a handshake's (a peer
         * that leaves right after its last step), established only now. A peer that gave up
         * at its own timeout or abort leaves at about the moment ours ends too (every rank
         * starts after the same address exchange, with the same timeout): ours gets
         * SHOAL_TCP_GONE_GRACE_MS to say so first, so that each rank reports its own cause
         * rather than the first one's close. */
        if (hangup && gone_ns == 0 && shoal_tcp_conn_gone(conn, gone, sizeof(gone))) {
            gone_ns = now + SHOAL_TCP_GONE_GRACE_MS * 1000000ull;
        }
        hangup = 0;
        if (conn->status == SHOAL_OK && gone_ns != 0 &&
            (now >= gone_ns || conn->nestablished == conn->nneeded)) {
            shoal_tcp_conn_fatal(conn, SHOAL_ERR_PEER_FAILED, "%s", gone);
        }
        if (conn->status != SHOAL_OK || conn->nestablished == conn->nneeded) {
            return conn->status;
        }
        if (shoal_aborted(ctx->abort_flag)) {
            shoal_info(TCP, "rank %d: connect_all aborted", ctx->rank);
            return SHOAL_ERR_ABORTED;
        }
        if (shoal_deadline_passed(deadline)) {
            return shoal_tcp_conn_timeout(conn);
        }
        int ms = shoal_deadline_left_ms(deadline, SHOAL_TCP_LOOP_MS);
        if (conn->accept_stall.since_ns != 0) {
            shoal_sleep_us(1000); /* the listener stays readable: a wait would not wait */
            continue;
        }
        nev = epoll_wait(ctx->epfd, ctx->events, SHOAL_TCP_EVENTS, ms);
        if (nev < 0 && errno != EINTR) {
            shoal_error(TCP, "epoll_wait(fd %d) failed: %s", ctx->epfd, strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
        for (int i = 0; i < nev; i++) {
            hangup |= (ctx->events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0;
        }
    }
}

/* Endpoints from the peers' addresses; counts the sockets to connect and to accept. */
static shoal_status_t shoal_tcp_conn_eps(shoal_tl_ctx_t *ctx, const int *peers, int npeers,
                                         const void *const *addrs, const size_t *addr_lens,
                                         int *nconnect_p, int *naccept_p)
{
    ctx->eps = calloc((size_t)(npeers > 0 ? npeers : 1), sizeof(*ctx->eps));
    if (ctx->eps == NULL) {
        shoal_error(TCP, "out of memory allocating %d endpoints", npeers);
        return SHOAL_ERR_NO_MEMORY;
    }
    ctx->neps = npeers;
    *nconnect_p = *naccept_p = 0;
    /* Every endpoint holds no socket before any is checked: a refused list closes them all
     * (err_eps), and calloc's 0 would be fd 0, the application's. */
    for (int i = 0; i < npeers; i++) {
        for (int s = 0; s < SHOAL_TCP_MAX_SOCKS; s++) {
            ctx->eps[i].fds[s] = -1;
        }
    }
    for (int i = 0; i < npeers; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        shoal_tcp_addr_t a;
        struct sockaddr_storage ss;
        socklen_t slen;
        ep->ctx = ctx;
        ep->peer = peers[i];
        if (peers[i] == ctx->rank || (i > 0 && peers[i] <= peers[i - 1]) ||
            shoal_tcp_addr_decode(addrs[i], addr_lens[i], &a) != 0) {
            shoal_error(TCP, "rank %d: bad peer list or address at index %d (peer %d)",
                        ctx->rank, i, peers[i]);
            return SHOAL_ERR_INVALID_ARG;
        }
        memcpy(ep->addr_raw, addrs[i], SHOAL_TCP_ADDR_BYTES);
        shoal_tcp_addr_sockaddr(&a, &ss, &slen);
        shoal_tcp_sockaddr_str((struct sockaddr *)&ss, ep->name, sizeof(ep->name));
        ep->nsocks = (int)SHOAL_MIN(ctx->nsocks, a.nsocks);
        ep->min_split = SHOAL_MAX(ctx->min_split, (size_t)a.min_split);
        ep->status = SHOAL_OK;
        *(peers[i] < ctx->rank ? nconnect_p : naccept_p) += ep->nsocks;
    }
    return SHOAL_OK;
}

static void shoal_tcp_conn_start(shoal_tcp_conn_t *conn)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    int k = 0;
    for (int i = 0; i < ctx->neps && ctx->eps[i].peer < ctx->rank; i++) {
        for (int s = 0; s < ctx->eps[i].nsocks; s++, k++) {
            shoal_tcp_hs_t *hs = &conn->slots[k];
            hs->fd = -1;
            hs->ep_idx = i;
            hs->sock_idx = s;
            hs->state = SHOAL_TCP_HS_RETRY; /* time 0: connect at the first drive */
        }
    }
    for (; k < conn->nslots; k++) {
        conn->slots[k].fd = -1;
    }
}

/* The circuit breaker never refuses the addresses our peers published while we expect them
 * (see src/tenant/breaker.h). */
static void shoal_tcp_conn_trust(shoal_tl_ctx_t *ctx, int delta, int all)
{
    for (int i = 0; i < ctx->neps; i++) {
        shoal_tcp_addr_t a;
        struct sockaddr_storage ss;
        socklen_t slen;
        if ((all || ctx->eps[i].peer > ctx->rank) &&
            shoal_tcp_addr_decode(ctx->eps[i].addr_raw, SHOAL_TCP_ADDR_BYTES, &a) == 0) {
            shoal_tcp_addr_sockaddr(&a, &ss, &slen);
            shoal_tenant_breaker_trust((struct sockaddr *)&ss, delta);
        }
    }
}

/* ---- connections at first use (SHOAL_CONNECT=lazy) -------------------------------------- */
/* The handshake slots outlive connect_all: progress() accepts (the listener stays open until
 * fini), starts the connections of endpoints with queued requests and drives every handshake
 * one non-blocking step at a time. Either side connects a socket; the race of both at once is
 * settled in shoal_tcp_hs_got_hello. A failed handshake fails its endpoint only (its queued
 * requests, with the cause), never the context. */

static shoal_status_t shoal_tcp_lazy_start(shoal_tl_ctx_t *ctx)
{
    shoal_tcp_conn_t *conn = calloc(1, sizeof(*conn));
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ctx->listen_fd}; /* level-triggered */
    int nsocks = 0;

    if (conn == NULL) {
        shoal_error(TCP, "out of memory for the lazy connection state");
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int i = 0; i < ctx->neps; i++) {
        nsocks += ctx->eps[i].nsocks;
    }
    conn->ctx = ctx;
    conn->lazy = 1;
    conn->status = SHOAL_OK;
    conn->nslots = SHOAL_TCP_SPARE_SLOTS / 4;
    conn->maxslots = 2 * nsocks + SHOAL_TCP_SPARE_SLOTS;
    conn->read_ns = (uint64_t)(ctx->timeout_ms >= 0 ? ctx->timeout_ms
                                                   : SHOAL_TCP_READ_DEFAULT_MS) * 1000000ull;
    conn->hello_ns = shoal_tcp_config.hello_timeout_ms > 0
                         ? SHOAL_MIN((uint64_t)shoal_tcp_config.hello_timeout_ms * 1000000ull,
                                     conn->read_ns)
                         : conn->read_ns;
    conn->slots = calloc((size_t)conn->nslots, sizeof(*conn->slots));
    if (conn->slots == NULL) {
        free(conn);
        shoal_error(TCP, "out of memory allocating %d handshake slots", SHOAL_TCP_SPARE_SLOTS);
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int i = 0; i < conn->nslots; i++) {
        conn->slots[i].fd = -1;
        conn->slots[i].ep_idx = -1;
    }
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->listen_fd, &ev) != 0) {
        shoal_error(TCP, "epoll_ctl(ADD, listener fd %d) failed: %s", ctx->listen_fd,
                    strerror(errno));
        free(conn->slots);
        free(conn);
        return SHOAL_ERR_SYSTEM;
    }
    ctx->conn = conn;
    shoal_tcp_conn_trust(ctx, 1, 1); /* any peer may connect, until fini */
    return SHOAL_OK;
}

/* A handshake failed (conn->status, conn->why): its endpoint fails, with every connection
 * still under way to it, ours and the peer's past its hello. One of the peer's finished now
 * would give it a socket of a failed endpoint, on which no message ever comes; closed, it is
 * treated as one that comes after the failure (its hello is refused). */
static void shoal_tcp_lazy_failed(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs)
{
    shoal_status_t st = conn->status;
    char last[80], why[sizeof(conn->why) + sizeof(last)];
    int ep_idx = hs->ep_idx, culprit;
    shoal_ep_t *ep;

    if (ep_idx < 0 || !shoal_tcp_hs_connector(hs)) {
        shoal_tcp_hs_free(hs); /* an acceptor's internal error: forget the connection */
        return;
    }
    ep = &conn->ctx->eps[ep_idx];
    /* A peer that failed stops listening, so our connection of a socket it had not
     * connected yet is refused; its abort notice, naming the rank it blames, waits on a
     * socket that was established already. */
    culprit = shoal_tcp_ep_last_words(ep, last, sizeof(last));
    snprintf(why, sizeof(why), "%s%s", conn->why[0] != '\0' ? conn->why : shoal_strerror(st),
             last);
    for (int i = 0; i < conn->nslots; i++) {
        if (conn->slots[i].state != SHOAL_TCP_HS_FREE && conn->slots[i].ep_idx == ep_idx) {
            shoal_tcp_hs_free(&conn->slots[i]);
        }
    }
    (void)shoal_tcp_ep_fail(ep, culprit >= 0 ? SHOAL_ERR_PEER_FAILED : st, culprit, why);
}

/* Endpoint i has requests: connect each of its sockets that is neither established nor
 * under way in either direction. */
static void shoal_tcp_lazy_kick(shoal_tcp_conn_t *conn, int i, uint64_t now)
{
    shoal_ep_t *ep = &conn->ctx->eps[i];
    for (int s = 0; s < ep->nsocks; s++) {
        shoal_tcp_hs_t *hs;
        if (ep->fds[s] >= 0 || shoal_tcp_lazy_find(conn, i, s, -1, NULL) != NULL) {
            continue;
        }
        hs = shoal_tcp_conn_slot(conn);
        if (hs == NULL) {
            return; /* every slot busy with peers' handshakes: again at the next progress */
        }
        memset(hs, 0, sizeof(*hs));
        hs->fd = -1;
        hs->ep_idx = i;
        hs->sock_idx = s;
        hs->state = SHOAL_TCP_HS_RETRY;
        /* The higher rank connects at the first drive, the lower a little later: when both
         * need the socket, the higher's connection (the one that wins) is usually alone. */
        hs->time_ns = ep->peer < conn->ctx->rank
                          ? 0 : now + (uint64_t)SHOAL_TCP_LAZY_GRACE_MS * 1000000ull;
        hs->start_ns = now;
        conn->busy = 1;
    }
}

static void shoal_tcp_lazy_drive(shoal_tcp_conn_t *conn)
{
    shoal_tl_ctx_t *ctx = conn->ctx;
    uint64_t now = shoal_time_ns();
    uint64_t limit = ctx->timeout_ms >= 0 ? (uint64_t)ctx->timeout_ms * 1000000ull : 0;
    int busy = 0;

    for (int i = 0; i < conn->nslots; i++) {
        shoal_tcp_hs_t *hs = &conn->slots[i];
        if (hs->state == SHOAL_TCP_HS_FREE) {
            continue;
        }
        conn->status = SHOAL_OK;
        conn->why[0] = '\0';
        if (shoal_tcp_hs_connector(hs) && limit > 0 && now - hs->start_ns > limit) {
            shoal_ep_t *ep = &ctx->eps[hs->ep_idx];
            shoal_tcp_conn_fatal(conn, SHOAL_ERR_TIMEOUT, "rank %d: timed out after %d ms "
                                 "connecting to peer %d (%s), socket %d", ctx->rank,
                                 ctx->timeout_ms, ep->peer, ep->name, hs->sock_idx);
        } else {
            shoal_tcp_hs_drive(conn, hs, now);
        }
        if (conn->status != SHOAL_OK) {
            shoal_tcp_lazy_failed(conn, hs);
        }
    }
    conn->status = SHOAL_OK;
    for (int i = 0; i < conn->nslots; i++) {
        busy += conn->slots[i].state != SHOAL_TCP_HS_FREE;
    }
    conn->busy = busy;
}

int shoal_tcp_lazy_progress(shoal_tl_ctx_t *ctx)
{
    shoal_tcp_conn_t *conn = ctx->conn;
    int before = ctx->nconnected, listening = 0, k;

    if (conn == NULL) {
        return 0;
    }
    /* Idle (nothing queued, no handshake): a peer's connection waits in the backlog, and
     * keeps the epoll fd readable (the listener is level-triggered), until one call in 32. */
    if (ctx->npending == 0 && conn->busy == 0 && (++ctx->idle_polls & 31) != 0) {
        return 0;
    }
    ctx->idle_polls = 0;
    /* Drains the ready list as shoal_tcp_epoll_drain does (the caller then tries every
     * queued transfer), noting the listener. */
    do {
        k = epoll_wait(ctx->epfd, ctx->events, SHOAL_TCP_EVENTS, 0);
        for (int i = 0; i < k; i++) {
            listening |= ctx->listen_fd >= 0 && ctx->events[i].data.fd == ctx->listen_fd;
        }
    } while (k == SHOAL_TCP_EVENTS);
    if (listening && ctx->listen_fd >= 0) {
        shoal_tcp_conn_accept(conn);
        conn->busy = 1;
    }
    if (ctx->npending > 0 && ctx->nconnected < ctx->neps) {
        uint64_t now = shoal_time_ns();
        for (int i = 0; i < ctx->neps; i++) {
            shoal_ep_t *ep = &ctx->eps[i];
            if (ep->status == SHOAL_OK && ep->nestablished < ep->nsocks &&
                (ep->sq_head != NULL || ep->rq_head != NULL)) {
                shoal_tcp_lazy_kick(conn, i, now);
            }
        }
    }
    if (conn->busy) {
        shoal_tcp_lazy_drive(conn);
    }
    return ctx->nconnected - before;
}

int shoal_tcp_lazy_busy(shoal_tl_ctx_t *ctx)
{
    return ctx->conn != NULL && ctx->conn->busy;
}

void shoal_tcp_lazy_stop(shoal_tl_ctx_t *ctx)
{
    shoal_tcp_conn_t *conn = ctx->conn;
    if (conn == NULL) {
        return;
    }
    for (int i = 0; i < conn->nslots; i++) {
        shoal_tcp_hs_free(&conn->slots[i]);
    }
    conn->busy = 0;
}

void shoal_tcp_lazy_fini(shoal_tl_ctx_t *ctx)
{
    shoal_tcp_conn_t *conn = ctx->conn;
    if (conn == NULL) {
        return;
    }
    shoal_tcp_lazy_stop(ctx);
    shoal_tcp_conn_trust(ctx, -1, 1);
    free(conn->slots);
    free(conn);
    ctx->conn = NULL;
}

shoal_status_t shoal_tcp_connect_all(shoal_tl_ctx_t *ctx, const int *peers, int npeers,
                                     const void *const *addrs, const size_t *addr_lens,
                                     shoal_ep_t **eps_p)
{
    shoal_tcp_conn_t conn = {.ctx = ctx, .status = SHOAL_OK};
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ctx->listen_fd};
    int nconnect, naccept;
    shoal_status_t status;

    if (ctx->eps != NULL || ctx->listen_fd < 0) {
        shoal_error(TCP, "rank %d: connect_all called twice", ctx->rank);
        return SHOAL_ERR_INVALID_ARG;
    }
    SHOAL_CHECK_GOTO(shoal_tcp_conn_eps(ctx, peers, npeers, addrs, addr_lens, &nconnect,
                                        &naccept), status, err_eps);
    if (ctx->lazy) {
        SHOAL_CHECK_GOTO(shoal_tcp_lazy_start(ctx), status, err_eps);
        for (int i = 0; i < npeers; i++) {
            eps_p[i] = &ctx->eps[i];
        }
        shoal_info(TCP, "rank %d: %d peers, each connected at first use", ctx->rank, npeers);
        return SHOAL_OK;
    }
    conn.nneeded = nconnect + naccept;
    conn.nslots = nconnect + 2 * naccept + SHOAL_TCP_SPARE_SLOTS;
    conn.read_ns = (uint64_t)(ctx->timeout_ms >= 0 ? ctx->timeout_ms
                                                   : SHOAL_TCP_READ_DEFAULT_MS) * 1000000ull;
    conn.hello_ns = shoal_tcp_config.hello_timeout_ms > 0
                        ? SHOAL_MIN((uint64_t)shoal_tcp_config.hello_timeout_ms * 1000000ull,
                                    conn.read_ns)
                        : conn.read_ns;
    conn.slots = calloc((size_t)conn.nslots, sizeof(*conn.slots));
    if (conn.slots == NULL) {
        shoal_error(TCP, "out of memory allocating %d handshake slots", conn.nslots);
        status = SHOAL_ERR_NO_MEMORY;
        goto err_eps;
    }
    shoal_tcp_conn_start(&conn);
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->listen_fd, &ev) != 0) {
        shoal_error(TCP, "epoll_ctl(ADD, listener fd %d) failed: %s", ctx->listen_fd,
                    strerror(errno));
        status = SHOAL_ERR_SYSTEM;
        goto err_slots;
    }
    shoal_tcp_conn_trust(ctx, 1, 0);
    status = shoal_tcp_conn_loop(&conn);
    shoal_tcp_conn_trust(ctx, -1, 0);
    (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ctx->listen_fd, NULL);
    if (status != SHOAL_OK) {
        goto err_slots;
    }
    for (int i = 0; i < conn.nslots; i++) {
        shoal_tcp_hs_free(&conn.slots[i]); /* strangers still in their handshake */
    }
    free(conn.slots);
    shoal_tcp_epoll_drain(ctx);
    for (int i = 0; i < npeers; i++) {
        eps_p[i] = &ctx->eps[i];
    }
    shoal_info(TCP, "rank %d: connected to %d peers (%d sockets)", ctx->rank, npeers,
               conn.nneeded);
    return SHOAL_OK;

err_slots:
    for (int i = 0; i < conn.nslots; i++) {
        shoal_tcp_hs_free(&conn.slots[i]);
    }
    free(conn.slots);
err_eps:
    for (int i = 0; i < ctx->neps; i++) {
        shoal_tcp_ep_close(&ctx->eps[i]);
    }
    free(ctx->eps);
    ctx->eps = NULL;
    ctx->neps = 0;
    return status;
}
