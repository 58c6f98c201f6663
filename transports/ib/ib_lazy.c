/* IB transport: connections at first use (SHOAL_CONNECT=lazy, core/tl.h SHOAL_TL_CAP_LAZY).
 *
 * connect_all keeps every peer's address and allocates (without touching) the rings and send
 * areas of the layout; no protection domain, registration or queue pair yet. A peer's
 * connection starts at the first isend/irecv toward it, or when the peer dials us, and runs
 * from the progress path without blocking:
 *   DIAL  our non-blocking TCP connect and the connector's side of the out-of-band handshake
 *         (transports/common/oob.h: mutual HMAC over the communicator key, both nonces; the
 *         same proofs as the eager exchange);
 *   XCHG  on the authenticated socket (ours or the one our acceptor handed over): the peer's
 *         protection domain, registrations and QP in INIT, then both send a kind byte and their
 *         shoal_ib_pair_t, move the QP to RTR/RTS, and swap the sync byte: no write reaches a
 *         QP that is not ready. The socket then stays open as the eager one does (EOF: the
 *         peer is gone; abort notices).
 * Both ends may dial at once: an acceptor takes a peer's dial when it is not dialing itself,
 * or when the peer's rank is higher (the higher rank's dial wins on both sides); the lower
 * rank's own dial is refused or dropped, and it waits for the winner. A dial closed before
 * the handshake ended is retried after 20 ms (growing); one closed right after our proof
 * SHOAL_OOB_AUTH_TRIES times is SHOAL_ERR_AUTH, as is a wrong proof of the acceptor; a refused
 * connect (no listener: the process is gone, or its communicator failed and closed it) twice
 * is SHOAL_ERR_PEER_FAILED; no connection within the communicator's timeout from the first
 * request is SHOAL_ERR_TIMEOUT; the abort flag is SHOAL_ERR_ABORTED. Requests wait in order on
 * their queues and are posted once the QP is in RTS. A failing rank answers an exchange under
 * way with an ABORT kind byte and its abort header (where its pair or its sync byte is due;
 * after its sync byte, the header alone: shoal_ib_lz_notice), then closes its listener.
 *
 * SHOAL_IB_USE_RDMACM=1 connects eagerly even with SHOAL_CONNECT=lazy (ib_ctx.c): the
 * connection manager's setup in ib_cm.c waits on its events. */
#include "transports/ib/ib_verbs.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define SHOAL_IB_LZ_RETRY_MS 20        /* first pause before dialing again */
#define SHOAL_IB_LZ_POLL_NS 200000ull  /* the listener, while nothing connects: every 200 us */
#define SHOAL_IB_LZ_SYNC 0x5a
#define SHOAL_IB_LZ_PROOF_TRIES 3      /* closes right after our proof before SHOAL_ERR_AUTH */

static const char *shoal_ib_lz_name(int state)
{
    switch (state) {
    case SHOAL_IB_LZ_IDLE: return "not started";
    case SHOAL_IB_LZ_DIAL: return "dialing";
    case SHOAL_IB_LZ_WAIT: return "waiting to dial again";
    case SHOAL_IB_LZ_XCHG: return "exchanging queue pair numbers";
    default: return "connected";
    }
}

static int shoal_ib_lz_is_busy(int state)
{
    return state == SHOAL_IB_LZ_DIAL || state == SHOAL_IB_LZ_WAIT || state == SHOAL_IB_LZ_XCHG;
}

static void shoal_ib_lz_set(shoal_ep_t *ep, int state)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    ctx->lz_busy += shoal_ib_lz_is_busy(state) - shoal_ib_lz_is_busy(ep->lz_state);
    if (ep->lz_state != SHOAL_IB_LZ_READY && state == SHOAL_IB_LZ_READY) {
        ctx->lz_open--;
    }
    ep->lz_state = state;
}

void shoal_ib_lazy_close(shoal_ep_t *ep)
{
    if (ep->dial.fd >= 0) {
        shoal_oob_dial_close(&ep->dial);
    }
    if (ep->lz_fd >= 0) {
        close(ep->lz_fd);
        ep->lz_fd = -1;
    }
}

/* The connection of ep will not be: its sockets closed, its requests failed. */
static int shoal_ib_lz_fail(shoal_ep_t *ep, shoal_status_t status, int culprit,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int shoal_ib_lz_fail(shoal_ep_t *ep, shoal_status_t status, int culprit,
                            const char *fmt, ...)
{
    char why[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    shoal_ib_lazy_close(ep);
    shoal_ib_lz_set(ep, SHOAL_IB_LZ_READY); /* no longer open */
    ep->lz_state = SHOAL_IB_LZ_IDLE;        /* but never connected: nothing is posted */
    if (status != SHOAL_ERR_ABORTED) {
        shoal_error(IB, "rank %d: %s", ep->ctx->rank, why);
    }
    return shoal_ib_ep_fail(ep, status, culprit, why);
}

/* Our acceptor's question at the hello and again once the proof checked out. */
static int shoal_ib_lz_expect(void *arg, uint32_t rank)
{
    shoal_tl_ctx_t *ctx = arg;
    int i = shoal_ib_find_ep(ctx, rank);
    const shoal_ep_t *ep = i >= 0 ? &ctx->eps[i] : NULL;
    if (ep == NULL || ep->status != SHOAL_OK) {
        return 0;
    }
    switch (ep->lz_state) {
    case SHOAL_IB_LZ_IDLE:
    case SHOAL_IB_LZ_WAIT:
        return 1;
    case SHOAL_IB_LZ_DIAL:
        /* the higher rank's dial wins; the lower one's is closed quietly (no breaker count) */
        return rank > (uint32_t)ctx->rank ? 1 : SHOAL_OOB_EXPECT_LATER;
    default:
        return 0;
    }
}

shoal_status_t shoal_ib_lazy_start(shoal_tl_ctx_t *ctx, shoal_ep_t **eps_p)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ctx->listen_fd};
    ctx->auth = (shoal_oob_auth_t){.secret = ctx->secret, .label = "shoal-ib",
                                   .comm_id = ctx->comm_id, .self = (uint32_t)ctx->rank,
                                   .abort_flag = ctx->abort_flag};
    SHOAL_CHECK(shoal_oob_acceptor_create(ctx->listen_fd, &ctx->auth, shoal_ib_lz_expect, ctx,
                                          &ctx->acc));
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->listen_fd, &ev) != 0) {
        shoal_error(IB, "rank %d: epoll_ctl(listener): %s", ctx->rank, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        shoal_oob_acceptor_trust(ctx->acc, &ep->raddr.oob);
        ep->lz_state = SHOAL_IB_LZ_IDLE;
        eps_p[i] = ep;
    }
    ctx->lz_open = ctx->neps;
    shoal_info(IB, "rank %d: %d peers over %s, each connected at first use", ctx->rank,
               ctx->neps, ctx->devname);
    return SHOAL_OK;
}

void shoal_ib_lazy_want(shoal_ep_t *ep)
{
    if (ep->ctx->lazy && ep->lz_state == SHOAL_IB_LZ_IDLE && ep->status == SHOAL_OK) {
        ep->lz_deadline = shoal_deadline_ns(ep->ctx->timeout_ms);
        ep->lz_retry_ns = 0;
        shoal_ib_lz_set(ep, SHOAL_IB_LZ_WAIT); /* progress dials at once */
    }
}

/* Authenticated socket fd (dialed: ours): the peer's resources and QP (kept from an earlier
 * attempt: still in INIT), our message out. */
static int shoal_ib_lz_xchg(shoal_ep_t *ep, int fd, int dialed)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    shoal_ib_pair_t mine;
    shoal_status_t st;
    ep->lz_fd = fd;
    ep->lz_dialed = dialed;
    if (ep->lz_deadline == 0) {
        ep->lz_deadline = shoal_deadline_ns(ctx->timeout_ms); /* the peer asked first */
    }
    shoal_ib_lz_set(ep, SHOAL_IB_LZ_XCHG);
    st = ep->pd == NULL ? shoal_ib_ep_mem(ep) : SHOAL_OK;
    if (st == SHOAL_OK && ep->qp == NULL) {
        st = shoal_ib_ep_qp(ep);
    }
    if (st != SHOAL_OK) {
        return shoal_ib_lz_fail(ep, st, -1, "peer %d: its queue pair or registrations could "
                                "not be set up at first use: %s", ep->peer,
                                shoal_strerror(st));
    }
    shoal_ib_pair_local(&ctx->lay, ctx->ring_buf, ep->idx, ep->qp->qp_num, ep->psn,
                        ep->ring_mr->rkey, &mine);
    ep->lz_out[0] = SHOAL_IB_LZ_GO;
    st = shoal_ib_pair_seal(ctx, (uint32_t)ep->peer, &mine, ep->lz_out + 1);
    if (st != SHOAL_OK) {
        return shoal_ib_lz_fail(ep, st, -1, "peer %d: our queue pair message could not be "
                                "proven: %s", ep->peer, shoal_strerror(st));
    }
    ep->lz_phase = 0;
    ep->lz_off = 0;
    return 0;
}

/* The peer's ABORT message, if one came: fails ep naming its culprit. 1 if so. */
static int shoal_ib_lz_abort_msg(shoal_ep_t *ep, int *n_p)
{
    shoal_wire_hdr_t h;
    if (ep->lz_in[0] != SHOAL_IB_LZ_ABORT) {
        return 0;
    }
    shoal_wire_decode(ep->lz_in + 1, &h);
    shoal_ib_lazy_close(ep);
    shoal_ib_lz_set(ep, SHOAL_IB_LZ_READY);
    ep->lz_state = SHOAL_IB_LZ_IDLE;
    *n_p += shoal_wire_culprit(&h) >= 0 && h.comm_id == ep->ctx->comm_id
                ? shoal_ib_ep_abort_notice(ep, shoal_wire_culprit(&h))
                : shoal_ib_ep_fail(ep, SHOAL_ERR_PROTOCOL, -1, "peer's exchange message is "
                                   "not a valid abort notice");
    return 1;
}

/* Our dial's connection closed before the peer sent anything: dial again later. */
static void shoal_ib_lz_redial(shoal_ep_t *ep)
{
    close(ep->lz_fd);
    ep->lz_fd = -1;
    ep->lz_closes++;
    ep->lz_retry_ns = shoal_time_ns() + 1000000ull * SHOAL_IB_LZ_RETRY_MS *
                                            (uint64_t)SHOAL_MIN(ep->lz_closes, 10);
    shoal_ib_lz_set(ep, SHOAL_IB_LZ_WAIT);
}

/* One step of the exchange on lz_fd; the number of requests completed (failed). */
static int shoal_ib_lz_xchg_step(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    int n = 0;
    for (;;) {
        int sending = ep->lz_phase == 0 || ep->lz_phase == 2;
        /* phase 4: the rest of an ABORT message that came where the sync byte was due */
        size_t len = ep->lz_phase < 2 || ep->lz_phase == 4 ? SHOAL_IB_LZ_MSG_BYTES : 1;
        uint8_t *buf = sending ? ep->lz_out : ep->lz_in;
        int r = shoal_sock_step(ep->lz_fd, buf, &ep->lz_off, len, sending);
        if (r < 0) {
            if (ep->lz_phase == 0 || ep->lz_phase == 2) {
                /* A peer that failed may have answered with its ABORT and closed: where our
                 * pair is due (phase 0; after its own pair, when it had sent that already) or
                 * where our sync byte is (2), see shoal_ib_lz_notice. What it sent is still
                 * read after the reset that made our send fail. */
                size_t off = 0;
                int got = shoal_sock_step(ep->lz_fd, ep->lz_in, &off, SHOAL_IB_LZ_MSG_BYTES, 0);
                if (got == 1 && ep->lz_phase == 0 && ep->lz_in[0] == SHOAL_IB_LZ_GO) {
                    off = 0;
                    got = shoal_sock_step(ep->lz_fd, ep->lz_in, &off, SHOAL_IB_LZ_MSG_BYTES, 0);
                }
                if (got == 1 && shoal_ib_lz_abort_msg(ep, &n)) {
                    return n;
                }
            }
            if (ep->lz_dialed && ep->lz_phase <= 1 && (ep->lz_phase == 0 || ep->lz_off == 0)) {
                /* The acceptor looks at us again after sending its proof: a peer that started
                 * dialing us meanwhile (and wins, as the higher rank) closes ours then. Its
                 * dial comes; a dead peer refuses the next one. */
                shoal_ib_lz_redial(ep);
                return n;
            }
            return shoal_ib_lz_fail(ep, SHOAL_ERR_PEER_FAILED, -1, "peer %d closed the "
                                    "out-of-band connection while exchanging queue pair "
                                    "numbers: the process is gone", ep->peer);
        }
        if (r == 0) {
            return n;
        }
        ep->lz_off = 0;
        if (ep->lz_phase == 3 && ep->lz_in[0] == SHOAL_IB_LZ_ABORT) {
            /* the peer failed after it sent its pair: its abort header follows */
            ep->lz_phase = 4;
            ep->lz_off = 1;
            continue;
        }
        if (ep->lz_phase == 4) {
            (void)shoal_ib_lz_abort_msg(ep, &n);
            return n;
        }
        if (ep->lz_phase == 1) {
            shoal_ib_pair_t theirs;
            shoal_status_t st;
            if (shoal_ib_lz_abort_msg(ep, &n)) {
                return n;
            }
            if (ep->lz_in[0] != SHOAL_IB_LZ_GO) {
                return shoal_ib_lz_fail(ep, SHOAL_ERR_PROTOCOL, -1, "peer %d: unexpected "
                                        "exchange message (kind %#x)", ep->peer,
                                        ep->lz_in[0]);
            }
            if (shoal_ib_pair_open(ctx, (uint32_t)ep->peer, ep->lz_in + 1, &theirs) !=
                SHOAL_OK) {
                /* the handshake proved the key, this message does not */
                return shoal_ib_lz_fail(ep, SHOAL_ERR_AUTH, -1, "peer %d's queue pair message "
                                        "does not carry the proof of the communicator's key: "
                                        "refused", ep->peer);
            }
            st = shoal_ib_ep_rts(ep, &theirs);
            if (st != SHOAL_OK) {
                return shoal_ib_lz_fail(ep, st, -1, "peer %d: its queue pair could not be "
                                        "connected at first use: %s", ep->peer,
                                        shoal_strerror(st));
            }
            ep->lz_out[0] = SHOAL_IB_LZ_SYNC;
        } else if (ep->lz_phase == 3) {
            struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = ep->lz_fd};
            if (ep->lz_in[0] != SHOAL_IB_LZ_SYNC) {
                return shoal_ib_lz_fail(ep, SHOAL_ERR_PROTOCOL, -1, "peer %d: bad sync byte "
                                        "%#x", ep->peer, ep->lz_in[0]);
            }
            ep->oob_fd = ep->lz_fd; /* kept, as an eager connection's: EOF, abort notices */
            ep->lz_fd = -1;
            /* (already in the set when a waiter slept on it: shoal_ib_lazy_watch) */
            if (epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, ep->oob_fd, &ev) != 0) {
                (void)epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ep->oob_fd, &ev);
            }
            shoal_ib_lz_set(ep, SHOAL_IB_LZ_READY);
            ctx->lz_qps++;
            shoal_trace(IB, "rank %d: ib queue pair %u to peer %d connected at first use (%d "
                        "peers so far)", ctx->rank, ep->qp->qp_num, ep->peer, ctx->lz_qps);
            return n;
        }
        ep->lz_phase++;
    }
}

/* One step of ep's connection. */
static int shoal_ib_lz_step(shoal_ep_t *ep, uint64_t now)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    shoal_status_t st;
    int r;

    if (shoal_aborted(ctx->abort_flag)) {
        return shoal_ib_lz_fail(ep, SHOAL_ERR_ABORTED, -1, "aborted while connecting to peer %d",
                                ep->peer);
    }
    if (ep->lz_deadline != UINT64_MAX && now >= ep->lz_deadline) {
        return shoal_ib_lz_fail(ep, SHOAL_ERR_TIMEOUT, -1, "peer %d: no connection within %d "
                                "ms (%s)", ep->peer, ctx->timeout_ms,
                                shoal_ib_lz_name(ep->lz_state));
    }
    switch (ep->lz_state) {
    case SHOAL_IB_LZ_WAIT:
        if (now < ep->lz_retry_ns) {
            return 0;
        }
        st = shoal_oob_dial_start(&ep->dial, &ep->raddr.oob, &ctx->auth, (uint32_t)ep->peer);
        if (st != SHOAL_OK) {
            return shoal_ib_lz_fail(ep, st, -1, "peer %d: cannot dial its out-of-band "
                                    "address: %s", ep->peer, strerror(errno));
        }
        shoal_ib_lz_set(ep, SHOAL_IB_LZ_DIAL);
        /* fall through */
    case SHOAL_IB_LZ_DIAL:
        r = shoal_oob_dial_step(&ep->dial, &ctx->auth, &st);
        if (r > 0) {
            int fd = ep->dial.fd;
            ep->dial.fd = -1;
            return shoal_ib_lz_xchg(ep, fd, 1) + shoal_ib_lz_xchg_step(ep);
        }
        if (r == 0) {
            return 0;
        }
        if (st == SHOAL_ERR_AUTH) {
            return shoal_ib_lz_fail(ep, SHOAL_ERR_AUTH, -1, "peer %d's out-of-band proof is "
                                    "wrong (a different job secret?)", ep->peer);
        }
        if (st != SHOAL_ERR_PEER_FAILED) {
            return shoal_ib_lz_fail(ep, st, -1, "peer %d: dialing its out-of-band address "
                                    "failed: %s", ep->peer, strerror(errno));
        }
        if (ep->dial.refused && ++ep->lz_refused >= 2) {
            return shoal_ib_lz_fail(ep, SHOAL_ERR_PEER_FAILED, -1, "peer %d refuses "
                                    "connections: its process is gone or its communicator "
                                    "failed", ep->peer);
        }
        if (ep->dial.proved && ++ep->lz_proof_closes >= SHOAL_IB_LZ_PROOF_TRIES) {
            return shoal_ib_lz_fail(ep, SHOAL_ERR_AUTH, -1, "peer %d closed the connection "
                                    "after our proof %d times (a different job secret?)",
                                    ep->peer, ep->lz_proof_closes);
        }
        /* refused, closed early (the peer's own dial wins, or its acceptor was full): again */
        ep->lz_closes++;
        ep->lz_retry_ns = now + 1000000ull * SHOAL_IB_LZ_RETRY_MS *
                                    (uint64_t)SHOAL_MIN(ep->lz_closes, 10);
        shoal_ib_lz_set(ep, SHOAL_IB_LZ_WAIT);
        return 0;
    case SHOAL_IB_LZ_XCHG:
        return shoal_ib_lz_xchg_step(ep);
    default:
        return 0;
    }
}

int shoal_ib_lazy_progress(shoal_tl_ctx_t *ctx)
{
    uint64_t now;
    int n = 0;
    if (!ctx->lazy || (ctx->lz_open == 0 && ctx->acc == NULL)) {
        return 0;
    }
    if (ctx->lz_open == 0) {
        /* every peer is connected: nobody needs the listener (a stranger's connection would
         * keep it readable in epfd) */
        shoal_ib_lazy_fini(ctx);
        (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ctx->listen_fd, NULL);
        close(ctx->listen_fd);
        ctx->listen_fd = -1;
        return 0;
    }
    now = shoal_time_ns();
    if (ctx->acc != NULL && (ctx->lz_busy > 0 || shoal_oob_acceptor_busy(ctx->acc) ||
                             now - ctx->lz_poll_ns >= SHOAL_IB_LZ_POLL_NS)) {
        uint32_t peer;
        int fd;
        ctx->lz_poll_ns = now;
        while (ctx->acc != NULL &&
               shoal_oob_acceptor_next(ctx->acc, now, &peer, &fd) == SHOAL_OK) {
            /* expect() said yes: IDLE, WAIT, or DIAL toward a lower rank (ours loses) */
            shoal_ep_t *ep = &ctx->eps[shoal_ib_find_ep(ctx, peer)];
            shoal_ib_lazy_close(ep);
            n += shoal_ib_lz_xchg(ep, fd, 0);
            if (ep->status == SHOAL_OK) {
                n += shoal_ib_lz_xchg_step(ep);
            }
        }
    }
    for (int i = 0; i < ctx->neps && ctx->lz_busy > 0; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->status == SHOAL_OK && shoal_ib_lz_is_busy(ep->lz_state)) {
            n += shoal_ib_lz_step(ep, now);
        }
    }
    return n;
}

int shoal_ib_lazy_busy(shoal_tl_ctx_t *ctx)
{
    return ctx->lazy && (ctx->lz_busy > 0 || shoal_oob_acceptor_busy(ctx->acc) > 0);
}

/* fd in the wait set, waiting for events (poll's POLLIN or POLLOUT); 0 or -1. */
static int shoal_ib_lz_watch_fd(shoal_tl_ctx_t *ctx, int fd, short events)
{
    struct epoll_event ev = {.events = (events & POLLOUT) != 0 ? EPOLLOUT : EPOLLIN,
                             .data.fd = fd};
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, fd, &ev) == 0) {
        return 0;
    }
    return errno == ENOENT && epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : -1;
}

int shoal_ib_lazy_watch(shoal_tl_ctx_t *ctx)
{
    struct pollfd p[SHOAL_OOB_SLOTS];
    int n, bad = 0;

    for (int i = 0; i < ctx->neps && ctx->lz_busy > 0; i++) {
        const shoal_ep_t *ep = &ctx->eps[i];
        if (ep->status != SHOAL_OK) {
            continue;
        }
        if (ep->lz_state == SHOAL_IB_LZ_DIAL && ep->dial.fd >= 0) {
            bad |= shoal_ib_lz_watch_fd(ctx, ep->dial.fd, shoal_oob_dial_events(&ep->dial));
        } else if (ep->lz_state == SHOAL_IB_LZ_XCHG && ep->lz_fd >= 0) {
            int sending = ep->lz_phase == 0 || ep->lz_phase == 2;
            bad |= shoal_ib_lz_watch_fd(ctx, ep->lz_fd, sending ? POLLOUT : POLLIN);
        }
        /* WAIT: a timer of 20 ms and more; the waiter's poll wakes every millisecond */
    }
    n = shoal_oob_acceptor_pollfds(ctx->acc, p, SHOAL_OOB_SLOTS);
    for (int i = 0; i < n; i++) {
        bad |= shoal_ib_lz_watch_fd(ctx, p[i].fd, p[i].events);
    }
    if (bad != 0) {
        shoal_warn_once(IB, "rank %d: epoll_ctl of an out-of-band socket failed (%s): waiters "
                        "poll while connections are being made", ctx->rank, strerror(errno));
    }
    return bad;
}

/* Our communicator failed (abort header h) while the exchange with ep was under way: what the
 * peer reads next names the culprit, wherever the exchange stands. Before any byte of our
 * pair: an ABORT message where the peer expects the pair. After part of our pair (a short
 * send), all of it, or our pair and no sync byte yet: the rest of the pair, then an ABORT
 * message where the peer expects the sync byte. After our sync byte the peer is connected, or
 * will be once it reads it, and takes the bare header as a connected peer's notice. (Only the
 * first case was told: in the others the peer read EOF and reported "the process is gone",
 * blaming this live rank.) Best effort, without blocking: the socket carried nothing else,
 * so these few bytes fit. */
static void shoal_ib_lz_notice(shoal_ep_t *ep, const shoal_wire_hdr_t *h)
{
    uint8_t msg[SHOAL_IB_LZ_MSG_BYTES] = {SHOAL_IB_LZ_ABORT};
    size_t off = ep->lz_off;
    shoal_wire_encode(h, msg + 1);
    if (ep->lz_phase == 3) {
        (void)send(ep->lz_fd, msg + 1, SHOAL_WIRE_HDR_BYTES, MSG_DONTWAIT | MSG_NOSIGNAL);
        return;
    }
    if (ep->lz_phase == 0 && off > 0 &&
        shoal_sock_step(ep->lz_fd, ep->lz_out, &off, SHOAL_IB_LZ_MSG_BYTES, 1) != 1) {
        return; /* the pair cannot be completed: nothing after it would be read right */
    }
    (void)send(ep->lz_fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void shoal_ib_lazy_fail(shoal_tl_ctx_t *ctx, int culprit)
{
    shoal_wire_hdr_t h = {
        .magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION, .type = SHOAL_WIRE_ABORT,
        .comm_id = ctx->comm_id, .chunk = (uint32_t)culprit, .length = 0,
    };
    if (!ctx->lazy) {
        return;
    }
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->status != SHOAL_OK || ep->lz_state == SHOAL_IB_LZ_READY) {
            continue;
        }
        if (ep->lz_state == SHOAL_IB_LZ_XCHG) {
            shoal_ib_lz_notice(ep, &h); /* the peer then blames culprit, not us */
        }
        shoal_ib_lazy_close(ep);
        shoal_ib_lz_set(ep, SHOAL_IB_LZ_READY);
        ep->lz_state = SHOAL_IB_LZ_IDLE;
    }
    /* peers that dial from now on are refused at once (PEER_FAILED), not left to time out */
    shoal_ib_lazy_fini(ctx);
    if (ctx->listen_fd >= 0) {
        (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ctx->listen_fd, NULL);
        close(ctx->listen_fd);
        ctx->listen_fd = -1;
    }
}

void shoal_ib_lazy_fini(shoal_tl_ctx_t *ctx)
{
    if (ctx->acc != NULL) {
        shoal_oob_acceptor_destroy(ctx->acc);
        ctx->acc = NULL;
    }
}
