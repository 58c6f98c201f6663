/* IB transport: connection setup through librdmacm (SHOAL_IB_USE_RDMACM=1).
 *
 * The queue pair of every peer is created on an rdma_cm identifier and connected by the
 * connection manager (REQ/REP/RTU on the fabric): the kernel resolves the route from the IP
 * address of the peer's RoCE GID, picks the source GID, path MTU and hop limit, and moves the
 * queue pair through its states (it grants remote write only: responder resources 0). What the
 * out-of-band exchange does otherwise (shoal_ib_ep_rts) is then the connection manager's job.
 *
 * Authentication stays where issue 10 put it: the out-of-band TCP handshake (mutual
 * HMAC-SHA256 over the job secret, both nonces, the circuit breaker) runs first, exactly as
 * without rdma_cm. Only then does the acceptor send the connector a fresh 16-byte token over
 * that authenticated connection; the connector's CM request carries its rank and the token
 * (and its ring's address and key), and the acceptor accepts a request only with the token
 * it issued for that rank (constant-time compare; anything else is rejected and forgotten).
 * A stranger who reaches the rdma_cm port gets a reject, never a queue pair in a peer's
 * protection domain, nor a ring key. The reply carries the acceptor's ring; both then swap
 * the sync byte over the out-of-band socket, which stays open as before (EOF = peer gone,
 * abort notices).
 *
 * librdmacm, like libibverbs, is loaded at first use (shoal_ib_cm_lib, forwarders below), and
 * only when SHOAL_IB_USE_RDMACM=1. The device context must be librdmacm's own (a queue pair
 * on an rdma_cm identifier uses its verbs context): in this mode the context, protection
 * domains and completion queue come from rdma_get_devices(). */
#include "transports/ib/ib_verbs.h"

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if SHOAL_HAVE_RDMACM
#include <rdma/rdma_cma.h>

#define SHOAL_IB_CM_MAGIC 0x4d434853u /* "SHCM" */
#define SHOAL_IB_CM_REQ_BYTES (8 + SHOAL_IB_CM_TOKEN_BYTES + 28) /* fits the 56 of a REQ */
#define SHOAL_IB_CM_REP_BYTES (4 + 28)

/* ---- librdmacm at first use ------------------------------------------------------------- */

#define SHOAL_IB_CM_MAP(X)                                                                     \
    X(rdma_create_event_channel) X(rdma_destroy_event_channel) X(rdma_create_id)                \
    X(rdma_destroy_id) X(rdma_bind_addr) X(rdma_listen) X(rdma_resolve_addr)                    \
    X(rdma_resolve_route) X(rdma_connect) X(rdma_accept) X(rdma_reject) X(rdma_get_cm_event)    \
    X(rdma_ack_cm_event) X(rdma_create_qp) X(rdma_destroy_qp) X(rdma_get_devices)               \
    X(rdma_free_devices) X(rdma_set_option) X(rdma_event_str) X(rdma_get_src_port)

static struct {
#define SHOAL_IB_CM_PTR(name) __typeof__(name) *name;
    SHOAL_IB_CM_MAP(SHOAL_IB_CM_PTR)
#undef SHOAL_IB_CM_PTR
} shoal_ib_cm_dl;

static const shoal_tl_sym_t shoal_ib_cm_syms[] = {
#define SHOAL_IB_CM_SYM(fn) {.name = #fn, .slot = (void **)&shoal_ib_cm_dl.fn},
    SHOAL_IB_CM_MAP(SHOAL_IB_CM_SYM)
#undef SHOAL_IB_CM_SYM
};

static const char *const shoal_ib_cm_path = "librdmacm.so.1";

static shoal_tl_lib_t shoal_ib_cm_lib = {
    .what = "librdmacm",
    .path_p = &shoal_ib_cm_path,
    .dflt = "librdmacm.so.1",
    .fallback_dir = SHOAL_VERBS_LIBDIR,
    .keep_signals_env = NULL,
    .syms = shoal_ib_cm_syms,
    .nsyms = SHOAL_ARRAY_SIZE(shoal_ib_cm_syms),
    .present = NULL,
    SHOAL_TL_LIB_STATE_INIT,
};

/* forwarders: the prototypes of rdma/rdma_cma.h, checked by the compiler */
struct rdma_event_channel *rdma_create_event_channel(void)
{
    return shoal_ib_cm_dl.rdma_create_event_channel();
}
void rdma_destroy_event_channel(struct rdma_event_channel *c)
{
    shoal_ib_cm_dl.rdma_destroy_event_channel(c);
}
int rdma_create_id(struct rdma_event_channel *c, struct rdma_cm_id **id, void *ctx,
                   enum rdma_port_space ps)
{
    return shoal_ib_cm_dl.rdma_create_id(c, id, ctx, ps);
}
int rdma_destroy_id(struct rdma_cm_id *id)
{
    return shoal_ib_cm_dl.rdma_destroy_id(id);
}
int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *a)
{
    return shoal_ib_cm_dl.rdma_bind_addr(id, a);
}
int rdma_listen(struct rdma_cm_id *id, int backlog)
{
    return shoal_ib_cm_dl.rdma_listen(id, backlog);
}
int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst,
                      int ms)
{
    return shoal_ib_cm_dl.rdma_resolve_addr(id, src, dst, ms);
}
int rdma_resolve_route(struct rdma_cm_id *id, int ms)
{
    return shoal_ib_cm_dl.rdma_resolve_route(id, ms);
}
int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
    return shoal_ib_cm_dl.rdma_connect(id, p);
}
int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
    return shoal_ib_cm_dl.rdma_accept(id, p);
}
int rdma_reject(struct rdma_cm_id *id, const void *data, uint8_t len)
{
    return shoal_ib_cm_dl.rdma_reject(id, data, len);
}
int rdma_get_cm_event(struct rdma_event_channel *c, struct rdma_cm_event **ev)
{
    return shoal_ib_cm_dl.rdma_get_cm_event(c, ev);
}
int rdma_ack_cm_event(struct rdma_cm_event *ev)
{
    return shoal_ib_cm_dl.rdma_ack_cm_event(ev);
}
int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    return shoal_ib_cm_dl.rdma_create_qp(id, pd, a);
}
void rdma_destroy_qp(struct rdma_cm_id *id)
{
    shoal_ib_cm_dl.rdma_destroy_qp(id);
}
struct ibv_context **rdma_get_devices(int *n)
{
    return shoal_ib_cm_dl.rdma_get_devices(n);
}
void rdma_free_devices(struct ibv_context **list)
{
    shoal_ib_cm_dl.rdma_free_devices(list);
}
int rdma_set_option(struct rdma_cm_id *id, int level, int name, void *val, size_t len)
{
    return shoal_ib_cm_dl.rdma_set_option(id, level, name, val, len);
}
const char *rdma_event_str(enum rdma_cm_event_type ev)
{
    return shoal_ib_cm_dl.rdma_event_str(ev);
}
__be16 rdma_get_src_port(struct rdma_cm_id *id)
{
    return shoal_ib_cm_dl.rdma_get_src_port(id);
}

/* ---- device and listener ----------------------------------------------------------------- */

shoal_status_t shoal_ib_cm_open(shoal_tl_ctx_t *ctx, const char *devname,
                                struct ibv_context **dev_p)
{
    int n = 0;
    if (shoal_tl_lib_load(&shoal_ib_cm_lib) != SHOAL_OK) {
        shoal_error(IB, "SHOAL_IB_USE_RDMACM=1 but %s", shoal_ib_cm_lib.why);
        return SHOAL_ERR_UNSUPPORTED;
    }
    ctx->cm_devs = rdma_get_devices(&n);
    for (int i = 0; ctx->cm_devs != NULL && i < n; i++) {
        if (strcmp(ibv_get_device_name(ctx->cm_devs[i]->device), devname) == 0) {
            *dev_p = ctx->cm_devs[i];
            return SHOAL_OK;
        }
    }
    shoal_error(IB, "rdma_cm does not know %s (rdma_get_devices: %d devices; is the rdma_ucm "
                "module loaded?)", devname, n);
    return SHOAL_ERR_TRANSPORT;
}

/* The IP address of a RoCE GID: IPv4-mapped, else IPv6 (link-local: scoped to ndev). */
static void shoal_ib_cm_sockaddr(const uint8_t gid[16], const char *ndev, uint16_t port,
                                 struct sockaddr_storage *ss)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(ss, 0, sizeof(*ss));
    if (memcmp(gid, v4mapped, 12) == 0) {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
        memcpy(&in->sin_addr, gid + 12, 4);
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(port);
        memcpy(&in6->sin6_addr, gid, 16);
        if (gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80 && ndev != NULL && ndev[0] != '\0') {
            in6->sin6_scope_id = if_nametoindex(ndev);
        }
    }
}

static struct rdma_event_channel *shoal_ib_cm_channel(void)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    int fl;
    if (ch != NULL && ((fl = fcntl(ch->fd, F_GETFL)) < 0 ||
                       fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) != 0)) {
        rdma_destroy_event_channel(ch);
        ch = NULL;
    }
    return ch;
}

shoal_status_t shoal_ib_cm_listen(shoal_tl_ctx_t *ctx)
{
    struct sockaddr_storage ss;
    char text[64];
    if (ctx->addr.link_layer != IBV_LINK_LAYER_ETHERNET) {
        shoal_error(IB, "rank %d: SHOAL_IB_USE_RDMACM=1 is implemented for RoCE ports (the "
                    "address is the GID's); %s is InfiniBand", ctx->rank, ctx->devname);
        return SHOAL_ERR_UNSUPPORTED;
    }
    shoal_ib_cm_sockaddr(ctx->addr.gid, ctx->gid.ndev, 0, &ss);
    shoal_ib_gid_str(ctx->addr.gid, text, sizeof(text));
    ctx->cm_chan = shoal_ib_cm_channel();
    if (ctx->cm_chan == NULL ||
        rdma_create_id(ctx->cm_chan, &ctx->cm_listen, ctx, RDMA_PS_TCP) != 0 ||
        rdma_bind_addr(ctx->cm_listen, (struct sockaddr *)&ss) != 0 ||
        rdma_listen(ctx->cm_listen, 64) != 0) {
        shoal_error(IB, "rank %d: rdma_cm listener on the address of GID %s (%s) failed: %s",
                    ctx->rank, text, ctx->gid.ndev, strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    ctx->addr.cm_port = ntohs(rdma_get_src_port(ctx->cm_listen));
    shoal_info(IB, "rank %d: rdma_cm listens on port %u of %s", ctx->rank, ctx->addr.cm_port,
               text);
    return SHOAL_OK;
}

void shoal_ib_cm_fini(shoal_tl_ctx_t *ctx)
{
    if (ctx->cm_listen != NULL) {
        rdma_destroy_id(ctx->cm_listen);
        ctx->cm_listen = NULL;
    }
    if (ctx->cm_chan != NULL) {
        rdma_destroy_event_channel(ctx->cm_chan);
        ctx->cm_chan = NULL;
    }
    if (ctx->cm_devs != NULL) {
        rdma_free_devices(ctx->cm_devs);
        ctx->cm_devs = NULL;
    }
}

void shoal_ib_cm_close(shoal_ep_t *ep)
{
    if (ep->cm_id != NULL) {
        if (ep->qp != NULL) {
            rdma_destroy_qp(ep->cm_id);
            ep->qp = NULL;
        }
        rdma_destroy_id(ep->cm_id);
        ep->cm_id = NULL;
    }
    /* also without an identifier: a connect whose rdma_create_id failed has its channel (an
     * fd on /dev/infiniband/rdma_cm), which stayed open for the life of the process */
    if (ep->cm_chan != NULL) {
        rdma_destroy_event_channel(ep->cm_chan);
        ep->cm_chan = NULL;
    }
}

/* ---- events ------------------------------------------------------------------------------- */

/* The next event on ch within the deadline (the caller acks it). */
static shoal_status_t shoal_ib_cm_next(shoal_tl_ctx_t *ctx, struct rdma_event_channel *ch,
                                       uint64_t deadline, struct rdma_cm_event **ev_p)
{
    for (;;) {
        struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
        uint64_t now;
        if (rdma_get_cm_event(ch, ev_p) == 0) {
            return SHOAL_OK;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            shoal_error(IB, "rank %d: rdma_get_cm_event: %s", ctx->rank, strerror(errno));
            return SHOAL_ERR_TRANSPORT;
        }
        if (shoal_aborted(ctx->abort_flag)) {
            return SHOAL_ERR_ABORTED;
        }
        now = shoal_time_ns();
        if (now >= deadline) {
            return SHOAL_ERR_TIMEOUT;
        }
        (void)poll(&pfd, 1, (int)SHOAL_MIN((deadline - now) / 1000000 + 1, 100));
    }
}

/* Waits for event want on id (the connector's own channel): its private data, if any, into
 * data (len bytes). */
static shoal_status_t shoal_ib_cm_expect(shoal_ep_t *ep, enum rdma_cm_event_type want,
                                         uint64_t deadline, uint8_t *data, size_t len)
{
    struct rdma_cm_event *ev;
    enum rdma_cm_event_type got;
    int status;
    SHOAL_CHECK(shoal_ib_cm_next(ep->ctx, ep->cm_chan, deadline, &ev));
    got = ev->event;
    status = ev->status;
    if (got == want && data != NULL) {
        if (ev->param.conn.private_data == NULL || ev->param.conn.private_data_len < len) {
            got = RDMA_CM_EVENT_CONNECT_ERROR; /* a reply without our data */
        } else {
            memcpy(data, ev->param.conn.private_data, len);
        }
    }
    rdma_ack_cm_event(ev);
    if (got != want) {
        /* a reject is the peer's check only when it says so: nothing listening is a peer
         * that failed (or whose communicator did) after it sent the token */
        shoal_status_t st = got == RDMA_CM_EVENT_REJECTED ? shoal_ib_cm_rejected(status)
                                                          : SHOAL_ERR_TRANSPORT;
        shoal_error(IB, "rank %d: rdma_cm connecting to peer %d: %s (status %d) while waiting "
                    "for %s%s", ep->ctx->rank, ep->peer, rdma_event_str(got), status,
                    rdma_event_str(want),
                    st == SHOAL_ERR_AUTH ? ": the peer refused our request"
                    : st == SHOAL_ERR_PEER_FAILED ? ": nothing listens on the peer's rdma_cm "
                                                    "port (its process or communicator ended)"
                                                  : "");
        return st;
    }
    return SHOAL_OK;
}

/* The queue pair on the identifier (in ep's protection domain), its receives posted, and the
 * options every queue pair gets (ACK timeout; the traffic class is set before the route). */
static shoal_status_t shoal_ib_cm_qp(shoal_ep_t *ep, struct rdma_cm_id *id)
{
    struct ibv_qp_init_attr ia;
    uint8_t t = (uint8_t)shoal_ib_config.timeout;
    shoal_ib_ep_qp_attr(ep, &ia);
    while (rdma_create_qp(id, ep->pd, &ia) != 0) {
        int err = errno;
        if (!shoal_ib_ep_qp_retry(ep, &ia, "rdma_create_qp", err)) {
            return SHOAL_ERR_TRANSPORT;
        }
    }
    ep->qp = id->qp;
    if (ia.cap.max_inline_data < ep->ctx->max_inline) {
        ep->ctx->max_inline = ia.cap.max_inline_data;
    }
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t)) != 0) {
        shoal_warn_once(IB, "rdma_set_option(ACK_TIMEOUT %u): %s; the connection manager's "
                        "default applies", t, strerror(errno));
    }
    return shoal_ib_ep_post_recvs(ep);
}

static void shoal_ib_cm_param(struct rdma_conn_param *cp, const uint8_t *data, size_t len)
{
    memset(cp, 0, sizeof(*cp));
    cp->private_data = data;
    cp->private_data_len = (uint8_t)len;
    cp->responder_resources = 0; /* no remote reads or atomics: remote write only */
    cp->initiator_depth = 0;
    cp->retry_count = (uint8_t)shoal_ib_config.retry_cnt;
    cp->rnr_retry_count = (uint8_t)shoal_ib_config.rnr_retry;
}

/* ---- the two sides -------------------------------------------------------------------------- */

shoal_status_t shoal_ib_cm_connect(shoal_ep_t *ep, const uint8_t token[SHOAL_IB_CM_TOKEN_BYTES],
                                   const shoal_ib_pair_t *mine, shoal_ib_pair_t *theirs,
                                   uint64_t deadline)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    struct sockaddr_storage src, dst;
    struct rdma_conn_param cp;
    uint8_t req[SHOAL_IB_CM_REQ_BYTES], rep[SHOAL_IB_CM_REP_BYTES], pair[SHOAL_IB_PAIR_BYTES];
    uint8_t tos = (uint8_t)ctx->qos.tc;
    int ms = shoal_ib_cm_resolve_ms(deadline);

    if (ep->raddr.cm_port == 0) {
        shoal_error(IB, "rank %d: peer %d does not listen for rdma_cm connections: "
                    "SHOAL_IB_USE_RDMACM must be the same on every rank", ctx->rank, ep->peer);
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_ib_cm_sockaddr(ctx->addr.gid, ctx->gid.ndev, 0, &src);
    shoal_ib_cm_sockaddr(ep->raddr.gid, ctx->gid.ndev, ep->raddr.cm_port, &dst);
    ep->cm_chan = shoal_ib_cm_channel();
    if (ep->cm_chan == NULL || rdma_create_id(ep->cm_chan, &ep->cm_id, ep, RDMA_PS_TCP) != 0) {
        shoal_error(IB, "rank %d: rdma_create_id for peer %d: %s", ctx->rank, ep->peer,
                    strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    if (rdma_set_option(ep->cm_id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)) != 0) {
        shoal_warn_once(IB, "rdma_set_option(TOS %u): %s", tos, strerror(errno));
    }
    if (rdma_resolve_addr(ep->cm_id, (struct sockaddr *)&src, (struct sockaddr *)&dst, ms) != 0) {
        shoal_error(IB, "rank %d: rdma_resolve_addr for peer %d: %s", ctx->rank, ep->peer,
                    strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    SHOAL_CHECK(shoal_ib_cm_expect(ep, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, NULL, 0));
    if (ep->cm_id->verbs != ctx->dev) {
        shoal_error(IB, "rank %d: rdma_cm routes peer %d through %s, not %s", ctx->rank,
                    ep->peer, ibv_get_device_name(ep->cm_id->verbs->device), ctx->devname);
        return SHOAL_ERR_TRANSPORT;
    }
    if (rdma_resolve_route(ep->cm_id, ms) != 0) {
        shoal_error(IB, "rank %d: rdma_resolve_route for peer %d: %s", ctx->rank, ep->peer,
                    strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    SHOAL_CHECK(shoal_ib_cm_expect(ep, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, NULL, 0));
    SHOAL_CHECK(shoal_ib_cm_qp(ep, ep->cm_id));
    shoal_put_le(req, SHOAL_IB_CM_MAGIC, 4);
    shoal_put_le(req + 4, (uint32_t)ctx->rank, 4);
    memcpy(req + 8, token, SHOAL_IB_CM_TOKEN_BYTES);
    shoal_ib_pair_encode(mine, pair);
    memcpy(req + 8 + SHOAL_IB_CM_TOKEN_BYTES, pair, 28);
    shoal_ib_cm_param(&cp, req, sizeof(req));
    if (rdma_connect(ep->cm_id, &cp) != 0) {
        shoal_error(IB, "rank %d: rdma_connect to peer %d: %s", ctx->rank, ep->peer,
                    strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    SHOAL_CHECK(shoal_ib_cm_expect(ep, RDMA_CM_EVENT_ESTABLISHED, deadline, rep, sizeof(rep)));
    if (shoal_get_le(rep, 4) != SHOAL_IB_CM_MAGIC) {
        shoal_error(IB, "rank %d: peer %d's rdma_cm reply is not ours", ctx->rank, ep->peer);
        return SHOAL_ERR_PROTOCOL;
    }
    memset(pair, 0, sizeof(pair));
    memcpy(pair, rep + 4, 28);
    shoal_ib_pair_decode(pair, theirs);
    return SHOAL_OK;
}

/* A connection request: 1 if it is peer ep's with the token we issued it. */
static int shoal_ib_cm_req_ok(const shoal_ep_t *ep, const struct rdma_cm_event *ev,
                              const uint8_t token[SHOAL_IB_CM_TOKEN_BYTES])
{
    const uint8_t *d = ev->param.conn.private_data;
    return d != NULL && ev->param.conn.private_data_len >= SHOAL_IB_CM_REQ_BYTES &&
           shoal_get_le(d, 4) == SHOAL_IB_CM_MAGIC &&
           shoal_get_le(d + 4, 4) == (uint64_t)(uint32_t)ep->peer &&
           shoal_memeq_ct(d + 8, token, SHOAL_IB_CM_TOKEN_BYTES);
}

shoal_status_t shoal_ib_cm_accept(shoal_ep_t *ep, const uint8_t token[SHOAL_IB_CM_TOKEN_BYTES],
                                  const shoal_ib_pair_t *mine, shoal_ib_pair_t *theirs,
                                  uint64_t deadline)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    uint8_t rep[SHOAL_IB_CM_REP_BYTES], pair[SHOAL_IB_PAIR_BYTES];
    struct rdma_conn_param cp;
    struct rdma_cm_event *ev;

    /* the request first: anything else on the listener is refused and forgotten */
    while (ep->cm_id == NULL) {
        SHOAL_CHECK(shoal_ib_cm_next(ctx, ctx->cm_chan, deadline, &ev));
        if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
            rdma_ack_cm_event(ev);
            continue;
        }
        if (!shoal_ib_cm_req_ok(ep, ev, token)) {
            struct rdma_cm_id *id = ev->id;
            shoal_warn(IB, "rank %d: refused an rdma_cm connection request that is not peer "
                       "%d's with the token it was given", ctx->rank, ep->peer);
            rdma_reject(id, NULL, 0);
            rdma_ack_cm_event(ev);
            rdma_destroy_id(id);
            continue;
        }
        ep->cm_id = ev->id;
        memset(pair, 0, sizeof(pair));
        memcpy(pair, ev->param.conn.private_data + 8 + SHOAL_IB_CM_TOKEN_BYTES, 28);
        rdma_ack_cm_event(ev);
    }
    shoal_ib_pair_decode(pair, theirs);
    if (ep->cm_id->verbs != ctx->dev) {
        shoal_error(IB, "rank %d: peer %d's rdma_cm request came in on another device",
                    ctx->rank, ep->peer);
        return SHOAL_ERR_TRANSPORT;
    }
    SHOAL_CHECK(shoal_ib_cm_qp(ep, ep->cm_id));
    shoal_put_le(rep, SHOAL_IB_CM_MAGIC, 4);
    shoal_ib_pair_encode(mine, pair);
    memcpy(rep + 4, pair, 28);
    shoal_ib_cm_param(&cp, rep, sizeof(rep));
    if (rdma_accept(ep->cm_id, &cp) != 0) {
        shoal_error(IB, "rank %d: rdma_accept of peer %d: %s", ctx->rank, ep->peer,
                    strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    /* ESTABLISHED of this identifier; other requests meanwhile are refused */
    for (;;) {
        SHOAL_CHECK(shoal_ib_cm_next(ctx, ctx->cm_chan, deadline, &ev));
        if (ev->id == ep->cm_id) {
            enum rdma_cm_event_type got = ev->event;
            rdma_ack_cm_event(ev);
            if (got == RDMA_CM_EVENT_ESTABLISHED) {
                return SHOAL_OK;
            }
            shoal_error(IB, "rank %d: rdma_cm accepting peer %d: %s", ctx->rank, ep->peer,
                        rdma_event_str(got));
            return SHOAL_ERR_TRANSPORT;
        }
        if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
            struct rdma_cm_id *id = ev->id;
            rdma_reject(id, NULL, 0);
            rdma_ack_cm_event(ev);
            rdma_destroy_id(id);
            continue;
        }
        rdma_ack_cm_event(ev);
    }
}

#else /* !SHOAL_HAVE_RDMACM */

shoal_status_t shoal_ib_cm_open(shoal_tl_ctx_t *ctx, const char *devname,
                                struct ibv_context **dev_p)
{
    (void)ctx;
    (void)devname;
    (void)dev_p;
    shoal_error(IB, "SHOAL_IB_USE_RDMACM=1: this build has no librdmacm support (configure "
                "found no rdma/rdma_cma.h)");
    return SHOAL_ERR_UNSUPPORTED;
}

shoal_status_t shoal_ib_cm_listen(shoal_tl_ctx_t *ctx)
{
    (void)ctx;
    return SHOAL_ERR_UNSUPPORTED;
}

void shoal_ib_cm_fini(shoal_tl_ctx_t *ctx)
{
    (void)ctx;
}

void shoal_ib_cm_close(shoal_ep_t *ep)
{
    (void)ep;
}

shoal_status_t shoal_ib_cm_connect(shoal_ep_t *ep, const uint8_t token[SHOAL_IB_CM_TOKEN_BYTES],
                                   const shoal_ib_pair_t *mine, shoal_ib_pair_t *theirs,
                                   uint64_t deadline)
{
    (void)ep;
    (void)token;
    (void)mine;
    (void)theirs;
    (void)deadline;
    return SHOAL_ERR_UNSUPPORTED;
}

shoal_status_t shoal_ib_cm_accept(shoal_ep_t *ep, const uint8_t token[SHOAL_IB_CM_TOKEN_BYTES],
                                  const shoal_ib_pair_t *mine, shoal_ib_pair_t *theirs,
                                  uint64_t deadline)
{
    return shoal_ib_cm_connect(ep, token, mine, theirs, deadline);
}
#endif
