/* IB transport: context (device/port/GID choice, PD, completion channel, out-of-band
 * listener), address codecs, progress, sleeping, failure and the ops table. Connection setup
 * and the data path are in ib_ep.c. */
#include "transports/ib/ib_verbs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#define SHOAL_IB_CHECK_NS 1000000ull   /* peer liveness checks at most every 1 ms */

/* ---- codecs -------------------------------------------------------------------------------- */

void shoal_ib_addr_encode(const shoal_ib_addr_t *a, uint8_t *out)
{
    memset(out, 0, SHOAL_IB_ADDR_BYTES);
    shoal_put_le(out, SHOAL_IB_ADDR_MAGIC, 4);
    shoal_put_le(out + 4, SHOAL_IB_ADDR_VERSION, 2);
    out[6] = a->link_layer;
    out[7] = a->port;
    out[8] = a->mtu;
    out[9] = a->is_global;
    shoal_put_le(out + 10, a->lid, 2);
    memcpy(out + 12, a->gid, 16);
    shoal_oob_addr_encode(&a->oob, out + 28);
    shoal_put_le(out + 52, a->cm_port, 2);
}

int shoal_ib_addr_decode(const void *in, size_t len, shoal_ib_addr_t *a)
{
    const uint8_t *p = in;
    if (in == NULL || len != SHOAL_IB_ADDR_BYTES || shoal_get_le(p, 4) != SHOAL_IB_ADDR_MAGIC ||
        shoal_get_le(p + 4, 2) != SHOAL_IB_ADDR_VERSION) {
        return -1;
    }
    a->link_layer = p[6];
    a->port = p[7];
    a->mtu = p[8];
    a->is_global = p[9];
    a->lid = (uint16_t)shoal_get_le(p + 10, 2);
    memcpy(a->gid, p + 12, 16);
    a->cm_port = (uint16_t)shoal_get_le(p + 52, 2);
    return shoal_oob_addr_decode(p + 28, &a->oob);
}

void shoal_ib_pair_encode(const shoal_ib_pair_t *p, uint8_t *out)
{
    memset(out, 0, SHOAL_IB_PAIR_BYTES);
    shoal_put_le(out, p->qpn, 4);
    shoal_put_le(out + 4, p->psn, 4);
    shoal_put_le(out + 8, p->ring_addr, 8);
    shoal_put_le(out + 16, p->rkey, 4);
    shoal_put_le(out + 20, p->nslots, 4);
    shoal_put_le(out + 24, p->slot_size, 4);
}

void shoal_ib_pair_decode(const uint8_t *in, shoal_ib_pair_t *p)
{
    p->qpn = (uint32_t)shoal_get_le(in, 4);
    p->psn = (uint32_t)shoal_get_le(in + 4, 4);
    p->ring_addr = shoal_get_le(in + 8, 8);
    p->rkey = (uint32_t)shoal_get_le(in + 16, 4);
    p->nslots = (uint32_t)shoal_get_le(in + 20, 4);
    p->slot_size = (uint32_t)shoal_get_le(in + 24, 4);
}

static shoal_status_t shoal_ib_pair_mac(const shoal_tl_ctx_t *ctx, uint32_t from, uint32_t to,
                                        const uint8_t *pair, uint8_t mac[SHOAL_HMAC_BYTES])
{
    static const char label[] = "shoal-ib-pair";
    uint8_t msg[sizeof(label) - 1 + 12 + SHOAL_IB_PAIR_BYTES];
    size_t off = sizeof(label) - 1;
    memcpy(msg, label, off);
    shoal_put_le(msg + off, ctx->comm_id, 4);
    shoal_put_le(msg + off + 4, from, 4);
    shoal_put_le(msg + off + 8, to, 4);
    memcpy(msg + off + 12, pair, SHOAL_IB_PAIR_BYTES);
    return shoal_hmac(ctx->secret, SHOAL_SECRET_BYTES, msg, sizeof(msg), mac);
}

shoal_status_t shoal_ib_pair_seal(const shoal_tl_ctx_t *ctx, uint32_t to,
                                  const shoal_ib_pair_t *p, uint8_t *out)
{
    shoal_ib_pair_encode(p, out);
    return shoal_ib_pair_mac(ctx, (uint32_t)ctx->rank, to, out, out + SHOAL_IB_PAIR_BYTES);
}

shoal_status_t shoal_ib_pair_open(const shoal_tl_ctx_t *ctx, uint32_t from, const uint8_t *in,
                                  shoal_ib_pair_t *p)
{
    uint8_t want[SHOAL_HMAC_BYTES];
    SHOAL_CHECK(shoal_ib_pair_mac(ctx, from, (uint32_t)ctx->rank, in, want));
    if (!shoal_memeq_ct(want, in + SHOAL_IB_PAIR_BYTES, SHOAL_HMAC_BYTES)) {
        return SHOAL_ERR_AUTH;
    }
    shoal_ib_pair_decode(in, p);
    return SHOAL_OK;
}

/* ---- device and port choice ---------------------------------------------------------------- */

typedef struct {
    struct ibv_context *dev;
    char name[SHOAL_IB_NAME_MAX];
    int port;
    struct ibv_port_attr attr;
} shoal_ib_pick_t;

/* The first ACTIVE port allowed by SHOAL_IB_HCA. quiet: no log (query). */
static shoal_status_t shoal_ib_pick_port(shoal_ib_pick_t *pk, int quiet)
{
    shoal_ib_hca_spec_t spec;
    char why[200] = "", down[200] = "";
    int ndev = 0;
    struct ibv_device **list;

    if (shoal_ib_hca_parse(shoal_ib_config.hca, &spec, why, sizeof(why)) != 0) {
        if (!quiet) {
            shoal_error(IB, "%s", why);
        }
        return SHOAL_ERR_INVALID_ARG;
    }
    list = ibv_get_device_list(&ndev);
    if (list == NULL || ndev == 0) {
        if (!quiet) {
            shoal_error(IB, "no RDMA device (ibv_get_device_list found none)");
        }
        if (list != NULL) {
            ibv_free_device_list(list);
        }
        return SHOAL_ERR_TRANSPORT;
    }
    for (int d = 0; d < ndev && pk->dev == NULL; d++) {
        const char *name = ibv_get_device_name(list[d]);
        struct ibv_context *dev = ibv_open_device(list[d]);
        struct ibv_device_attr da;
        if (dev == NULL || ibv_query_device(dev, &da) != 0) {
            if (dev != NULL) {
                ibv_close_device(dev);
            }
            continue;
        }
        for (int p = 1; p <= da.phys_port_cnt && pk->dev == NULL; p++) {
            struct ibv_port_attr pa;
            if (!shoal_ib_hca_match(&spec, name, p) || ibv_query_port(dev, (uint8_t)p, &pa)) {
                continue;
            }
            if (pa.state != IBV_PORT_ACTIVE) {
                if (down[0] == '\0') {
                    snprintf(down, sizeof(down), "%s port %d is %s, not ACTIVE", name, p,
                             ibv_port_state_str(pa.state));
                }
                continue;
            }
            pk->dev = dev;
            pk->port = p;
            pk->attr = pa;
            snprintf(pk->name, sizeof(pk->name), "%s", name);
        }
        if (pk->dev == NULL) {
            ibv_close_device(dev);
        }
    }
    ibv_free_device_list(list);
    if (pk->dev == NULL) {
        if (!quiet) {
            shoal_error(IB, "no usable RDMA port (SHOAL_IB_HCA=\"%s\", %d devices): %s",
                        shoal_ib_config.hca != NULL ? shoal_ib_config.hca : "", ndev,
                        down[0] != '\0' ? down : "no device/port matches");
        }
        return SHOAL_ERR_TRANSPORT;
    }
    return SHOAL_OK;
}

/* GID (RoCE) or LID (IB) of the chosen port into ctx->addr. */
static shoal_status_t shoal_ib_ctx_gid(shoal_tl_ctx_t *ctx, const shoal_ib_pick_t *pk)
{
    char why[256], text[64];
    union ibv_gid g;
    shoal_status_t st;

    ctx->addr.link_layer = pk->attr.link_layer;
    ctx->addr.port = (uint8_t)pk->port;
    ctx->addr.lid = pk->attr.lid;
    if (pk->attr.link_layer != IBV_LINK_LAYER_ETHERNET) {
        if (pk->attr.lid == 0) {
            shoal_error(IB, "%s port %d has no LID: is a subnet manager running?", pk->name,
                        pk->port);
            return SHOAL_ERR_TRANSPORT;
        }
        ctx->gid.index = 0;
        ctx->addr.is_global = 0;
        return SHOAL_OK;
    }
    st = shoal_ib_gid_select(shoal_ib_config.sysfs_root, pk->name, pk->port,
                             shoal_ib_config.family, shoal_ib_config.gid_index, &ctx->gid, why,
                             sizeof(why));
    if (st != SHOAL_OK) {
        shoal_error(IB, "%s", why);
        return st; /* SHOAL_ERR_INVALID_ARG: SHOAL_IB_GID_INDEX out of range */
    }
    if (ibv_query_gid(ctx->dev, (uint8_t)pk->port, ctx->gid.index, &g) != 0 ||
        memcmp(g.raw, ctx->gid.raw, 16) != 0) {
        shoal_error(IB, "GID %d of %s port %d: sysfs and ibv_query_gid disagree (table "
                    "changing?)", ctx->gid.index, pk->name, pk->port);
        return SHOAL_ERR_TRANSPORT;
    }
    memcpy(ctx->addr.gid, ctx->gid.raw, 16);
    ctx->addr.is_global = 1;
    shoal_ib_gid_str(ctx->gid.raw, text, sizeof(text));
    shoal_info(IB, "rank %d: %s port %d RoCE GID %d %s (%s)", ctx->rank, pk->name, pk->port,
               ctx->gid.index, text, ctx->gid.ndev);
    return SHOAL_OK;
}

/* The port as src/tune's rule sees it. */
static void shoal_ib_link_of(const shoal_ib_pick_t *pk, int soft, shoal_tl_link_t *l)
{
    l->mtu = (uint32_t)shoal_ib_mtu_bytes(pk->attr.active_mtu);
    l->rate_mbps = shoal_ib_rate_mbps(pk->attr.active_speed, pk->attr.active_width);
    l->rtt_us = shoal_ib_config.rtt_us;
    l->soft = soft != 0;
}

/* Ring slot size and counts: derived from the port (params->link_sizes, explicit settings
 * applied there), else SHOAL_IB_* as set. */
static void shoal_ib_ctx_ring_sizes(shoal_tl_ctx_t *ctx, const shoal_ib_pick_t *pk,
                                    const shoal_tl_params_t *params, size_t *slot_p)
{
    shoal_tl_link_sizes_t z;
    shoal_tl_link_t l;

    *slot_p = shoal_ib_config.slot_size;
    ctx->nslots = shoal_ib_config.nslots;
    ctx->nbounce = shoal_ib_config.send_slots;
    if (params->link_sizes == NULL) {
        return;
    }
    shoal_ib_link_of(pk, ctx->soft, &l);
    params->link_sizes(&l, &z);
    *slot_p = (size_t)SHOAL_MIN(z.slot_size, (uint64_t)SIZE_MAX);
    ctx->nslots = z.nslots;
    ctx->nbounce = z.send_slots;
    if (ctx->rank == 0) {
        shoal_info(IB, "%s port %d (MTU %u, %.1f Gb/s): %s", pk->name, pk->port, l.mtu,
                   l.rate_mbps / 1e3, z.why);
    } else {
        shoal_trace(IB, "rank %d: %s port %d (MTU %u, %.1f Gb/s): %s", ctx->rank, pk->name,
                    pk->port, l.mtu, l.rate_mbps / 1e3, z.why);
    }
}

static shoal_status_t shoal_ib_ctx_sizes(shoal_tl_ctx_t *ctx, const shoal_ib_pick_t *pk,
                                         const shoal_tl_params_t *params)
{
    char why[200];
    size_t slot;
    int mtu = shoal_ib_mtu_negotiate(pk->attr.active_mtu, pk->attr.active_mtu,
                                     shoal_ib_config.mtu, why, sizeof(why));
    if (mtu == 0) {
        shoal_error(IB, "%s port %d: %s", pk->name, pk->port, why);
        return SHOAL_ERR_INVALID_ARG;
    }
    ctx->addr.mtu = (uint8_t)mtu;
    shoal_ib_ctx_ring_sizes(ctx, pk, params, &slot);
    ctx->reg_cache = shoal_ib_config.reg_cache;
    ctx->reg_cache_max = shoal_ib_config.reg_cache_max;
    if (ctx->reg_cache && ctx->reg_cache_max > 0) {
        /* Registrations kept past their message are safe only while we learn of every
         * release of the memory behind them (ib_memhook.c); without that, per message. */
        const char *hwhy;
        if (shoal_ib_memhook_install(&hwhy) != 0) {
            shoal_warn_once(IB, "SHOAL_IB_REG_CACHE_MAX=%zu: memory release hooks unavailable "
                            "(%s): user buffers are registered per message instead",
                            ctx->reg_cache_max, hwhy);
            ctx->reg_cache_max = 0;
        }
    }
    if (ctx->nslots < 2 || ctx->nslots > SHOAL_IB_SLOTS_MAX || slot < 4096 ||
        slot > SHOAL_IB_SLOT_MAX || ctx->nbounce < 1 || ctx->nbounce > SHOAL_IB_SLOTS_MAX) {
        shoal_error(IB, "SHOAL_IB_RING_SLOTS=%u (2..%d), SHOAL_IB_SEND_SLOTS=%u (1..%d) or "
                    "SHOAL_IB_SLOT_SIZE=%zu (4k..16m) out of range", ctx->nslots,
                    SHOAL_IB_SLOTS_MAX, ctx->nbounce, SHOAL_IB_SLOTS_MAX, slot);
        return SHOAL_ERR_INVALID_ARG;
    }
    ctx->slot_size = (uint32_t)slot + SHOAL_IB_SLOT_ROOM;
    if (shoal_ib_config.timeout < 1 || shoal_ib_config.timeout > 31 ||
        shoal_ib_config.retry_cnt > 7 || shoal_ib_config.rnr_retry > 7 ||
        shoal_ib_config.tc > 255 || shoal_ib_config.sl > 15) {
        shoal_error(IB, "SHOAL_IB_TIMEOUT (1..31), RETRY_CNT (0..7), RNR_RETRY (0..7), TC "
                    "(0..255) or SL (0..15) out of range");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (!shoal_ib_config.use_rdmacm && pk->attr.pkey_tbl_len > 0 &&
        shoal_ib_config.pkey_index >= pk->attr.pkey_tbl_len) {
        /* at init, naming the setting, not as EINVAL at the first RESET->INIT */
        shoal_error(IB, "SHOAL_IB_PKEY=%u: %s port %d has %u partition keys (0..%u)",
                    shoal_ib_config.pkey_index, pk->name, pk->port, pk->attr.pkey_tbl_len,
                    pk->attr.pkey_tbl_len - 1u);
        return SHOAL_ERR_INVALID_ARG;
    }
    ctx->credit_thresh = SHOAL_MAX(1u, ctx->nslots / 4);
    ctx->max_inline = shoal_ib_config.max_inline;
    return SHOAL_OK;
}

static void shoal_ib_fini(shoal_tl_ctx_t *ctx)
{
    if (ctx == NULL) {
        return;
    }
    shoal_ib_conn_free(ctx);
    shoal_ib_lazy_fini(ctx);
    if (ctx->chan != NULL) {
        ibv_destroy_comp_channel(ctx->chan);
    }
    if (ctx->dev != NULL && ctx->cm_devs == NULL) {
        ibv_close_device(ctx->dev);
    }
    shoal_ib_cm_fini(ctx); /* the device context too, when it is librdmacm's */
    if (ctx->listen_fd >= 0) {
        close(ctx->listen_fd);
    }
    if (ctx->evfd >= 0) {
        close(ctx->evfd);
    }
    if (ctx->epfd >= 0) {
        close(ctx->epfd);
    }
    shoal_secret_wipe(ctx->secret, sizeof(ctx->secret)); /* not elided before the free */
    free(ctx);
}

static shoal_status_t shoal_ib_ctx_wait_setup(shoal_tl_ctx_t *ctx)
{
    struct epoll_event ev = {.events = EPOLLIN};
    int fl = fcntl(ctx->chan->fd, F_GETFL);
    if (fl < 0 || fcntl(ctx->chan->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        shoal_error(IB, "fcntl(completion channel fd, O_NONBLOCK): %s", strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->epfd < 0 || ctx->evfd < 0) {
        shoal_error(IB, "epoll_create1/eventfd: %s", strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    ev.data.fd = ctx->chan->fd;
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->chan->fd, &ev) != 0) {
        return SHOAL_ERR_SYSTEM;
    }
    ev.data.fd = ctx->evfd;
    return epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->evfd, &ev) == 0 ? SHOAL_OK
                                                                   : SHOAL_ERR_SYSTEM;
}

static shoal_status_t shoal_ib_init(const shoal_tl_params_t *params, shoal_tl_ctx_t **ctx_p)
{
    shoal_tl_ctx_t *ctx = calloc(1, sizeof(*ctx));
    shoal_ib_pick_t pk = {0};
    shoal_status_t status;

    if (ctx == NULL) {
        shoal_error(IB, "out of memory allocating the ib context");
        return SHOAL_ERR_NO_MEMORY;
    }
    ctx->listen_fd = ctx->epfd = ctx->evfd = -1;
    ctx->rank = params->rank;
    ctx->comm_id = params->comm_id;
    memcpy(ctx->secret, params->secret, SHOAL_SECRET_BYTES);
    ctx->timeout_ms = params->timeout_ms;
    ctx->abort_flag = params->abort_flag;
    /* rdma_cm's connection setup waits on its events: eager then (every rank has the same
     * SHOAL_IB_USE_RDMACM, checked at connect_all, so every rank decides the same) */
    ctx->lazy = params->lazy && !shoal_ib_config.use_rdmacm;
    if (params->lazy && shoal_ib_config.use_rdmacm && params->rank == 0) {
        shoal_info(IB, "SHOAL_IB_USE_RDMACM=1: queue pairs connect at init, not at first use");
    }
    shoal_ib_qos_pick(shoal_ib_config.tc, shoal_ib_config.sl,
                      params->qos_valid ? params->qos_ib_tc : -1,
                      params->qos_valid ? params->qos_ib_sl : -1,
                      params->qos_valid ? params->qos_rate_max : 0, &ctx->qos);
    if (shoal_tl_lib_load(&shoal_ib_lib) != SHOAL_OK) {
        shoal_error(IB, "the ib transport is unusable: %s", shoal_ib_lib.why);
        status = SHOAL_ERR_UNSUPPORTED;
        goto err;
    }
    SHOAL_CHECK_GOTO(shoal_ib_pick_port(&pk, 0), status, err);
    ctx->dev = pk.dev;
    if (shoal_ib_config.use_rdmacm) {
        /* queue pairs on rdma_cm identifiers live in librdmacm's context of the device */
        ctx->use_cm = 1;
        ctx->dev = NULL;
        status = shoal_ib_cm_open(ctx, pk.name, &ctx->dev);
        ibv_close_device(pk.dev);
        pk.dev = ctx->dev;
        if (status != SHOAL_OK) {
            goto err;
        }
    }
    snprintf(ctx->devname, sizeof(ctx->devname), "%s", pk.name);
    ctx->soft = shoal_ib_config.soft_device;
    if (ctx->soft < 0) {
        struct ibv_device_attr da;
        ctx->soft = shoal_ib_soft_device(shoal_ib_config.sysfs_root, ctx->devname,
                                         ibv_query_device(ctx->dev, &da) == 0 ? da.vendor_id
                                                                               : 0);
    }
    SHOAL_CHECK_GOTO(shoal_ib_ctx_gid(ctx, &pk), status, err);
    SHOAL_CHECK_GOTO(shoal_ib_ctx_sizes(ctx, &pk, params), status, err);
    if (pk.attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        /* RoCE: would this class run lossless here? (a warning, never a failure) */
        shoal_ib_hostqos_check(shoal_ib_config.sysfs_root, ctx->devname, pk.port,
                               ctx->gid.ndev,
                               params->qos_valid ? params->qos_class_name : NULL,
                               ctx->qos.tc, ctx->qos.sl, NULL);
    }
    ctx->chan = ibv_create_comp_channel(ctx->dev); /* protection domains are per peer */
    if (ctx->chan == NULL) {
        shoal_error(IB, "%s: ibv_create_comp_channel failed: %s", ctx->devname,
                    strerror(errno));
        status = SHOAL_ERR_TRANSPORT;
        goto err;
    }
    SHOAL_CHECK_GOTO(shoal_ib_ctx_wait_setup(ctx), status, err);
    SHOAL_CHECK_GOTO(shoal_oob_listen(shoal_ib_config.oob_ifname, &ctx->listen_fd,
                                      &ctx->addr.oob), status, err);
    if (ctx->use_cm) {
        SHOAL_CHECK_GOTO(shoal_ib_cm_listen(ctx), status, err);
    }
    shoal_info(IB, "rank %d: %s port %d, %s%s, MTU %d, %u slots of %u bytes per peer, %s",
               ctx->rank, ctx->devname, pk.port,
               pk.attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
               ctx->soft ? " (a software device)" : "",
               shoal_ib_mtu_bytes(ctx->addr.mtu), ctx->nslots, ctx->slot_size,
               ctx->reg_cache ? "sends from registered user buffers (SHOAL_IB_REG_CACHE=1)"
                              : "sends through bounce slots");
    *ctx_p = ctx;
    return SHOAL_OK;
err:
    shoal_ib_fini(ctx);
    return status;
}

static shoal_status_t shoal_ib_address(shoal_tl_ctx_t *ctx, void *addr, size_t *len_p)
{
    if (*len_p < SHOAL_IB_ADDR_BYTES) {
        shoal_error(IB, "address buffer of %zu bytes, need %d", *len_p, SHOAL_IB_ADDR_BYTES);
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_ib_addr_encode(&ctx->addr, addr);
    *len_p = SHOAL_IB_ADDR_BYTES;
    return SHOAL_OK;
}

static shoal_status_t shoal_ib_ready(shoal_tl_ctx_t *ctx)
{
    if (ctx->listen_fd >= 0 && !ctx->lazy) { /* lazily: until fini (or fail) */
        close(ctx->listen_fd);
        ctx->listen_fd = -1;
    }
    return SHOAL_OK;
}

/* ---- progress and sleeping ----------------------------------------------------------------- */

/* Consumes completion events and eventfd wakeups; the CQ must be re-armed after an event. */
static void shoal_ib_drain_events(shoal_tl_ctx_t *ctx)
{
    struct ibv_cq *cq;
    void *cq_ctx;
    unsigned n = 0;
    uint64_t v;
    while (ibv_get_cq_event(ctx->chan, &cq, &cq_ctx) == 0) {
        n++;
    }
    if (n > 0) {
        ibv_ack_cq_events(ctx->cq, n);
        ctx->armed = 0;
    }
    while (read(ctx->evfd, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
    }
}

/* The oob socket of a peer: EOF (or reset) means its process is gone. */
static void shoal_ib_peer_check(shoal_tl_ctx_t *ctx, shoal_ep_t *ep)
{
    if (ep->oob_fd < 0 || ep->oob_eof || ep->oob_abort || ep->status != SHOAL_OK) {
        return;
    }
    if (shoal_ib_ep_oob_read(ep) != 0) {
        (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ep->oob_fd, NULL);
    }
}

static int shoal_ib_poll_cq(shoal_tl_ctx_t *ctx)
{
    int done = 0, n;
    for (int i = 0; i < ctx->nstash; i++) {
        done += shoal_ib_handle_wc(ctx, &ctx->stash[i]);
    }
    ctx->nstash = 0;
    do {
        n = ibv_poll_cq(ctx->cq, SHOAL_IB_WC_BATCH, ctx->wc);
        for (int i = 0; i < n; i++) {
            done += shoal_ib_handle_wc(ctx, &ctx->wc[i]);
        }
    } while (n == SHOAL_IB_WC_BATCH);
    if (n < 0) {
        /* The device cannot report completions: nothing posted on it will ever complete.
         * Every endpoint fails now, as this rank's own (local) failure, instead of leaving
         * its requests to the communicator's timeout ("timed out"). */
        char why[192];
        snprintf(why, sizeof(why), "ibv_poll_cq on %s failed (%d): this rank's device cannot "
                 "report completions, a local error", ctx->devname, n);
        shoal_error(IB, "rank %d: %s", ctx->rank, why);
        for (int i = 0; i < ctx->neps; i++) {
            done += shoal_ib_ep_fail(&ctx->eps[i], SHOAL_ERR_TRANSPORT, ctx->rank, why);
        }
    }
    return done;
}

static int shoal_ib_progress(shoal_tl_ctx_t *ctx)
{
    int n, check = 0;
    uint64_t now;
    if (ctx->npending == 0 && !(ctx->lazy && ctx->lz_open > 0)) {
        return 0;
    }
    n = shoal_ib_lazy_progress(ctx);
    if (ctx->npending == 0) {
        return n;
    }
    now = shoal_time_ns();
    if (now - ctx->check_ns >= SHOAL_IB_CHECK_NS) {
        ctx->check_ns = now;
        check = 1;
        for (int i = 0; i < ctx->neps; i++) {
            if (ctx->eps[i].sq_head != NULL || ctx->eps[i].rq_head != NULL) {
                shoal_ib_peer_check(ctx, &ctx->eps[i]);
            }
        }
    }
    shoal_ib_drain_events(ctx);
    n += shoal_ib_poll_cq(ctx);
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->status != SHOAL_OK || ep->lz_state != SHOAL_IB_LZ_READY) {
            continue; /* lazily: requests wait in order until the QP is in RTS */
        }
        n += shoal_ib_ep_progress(ep);
        if (ep->oob_abort != 0 && ep->status == SHOAL_OK) {
            n += shoal_ib_ep_abort_notice(ep, ep->oob_abort - 1);
        } else if (check && ep->oob_eof != 0 && (ep->sq_head != NULL || ep->rq_head != NULL)) {
            n += shoal_ib_ep_oob_gone(ep);
        }
    }
    return n;
}

static int shoal_ib_wait_fd(shoal_tl_ctx_t *ctx)
{
    int n;
    if (ctx->cq == NULL) {
        return ctx->epfd;
    }
    if (shoal_ib_lazy_busy(ctx) && shoal_ib_lazy_watch(ctx) != 0) {
        /* a handshake socket could not join epfd: no sleep */
        uint64_t one = 1;
        (void)write(ctx->evfd, &one, sizeof(one));
        return ctx->epfd;
    }
    /* Peers whose oob socket hit EOF leave the set (it would stay readable forever), also
     * while nothing is pending here: a peer that ended (a job's end) kept the fd readable, and
     * a rank waiting on its other transports never slept. The EOF is kept for the next request
     * to that peer (shoal_ib_progress). */
    n = epoll_wait(ctx->epfd, ctx->events, SHOAL_IB_EVENTS, 0);
    for (int i = 0; i < n; i++) {
        int fd = ctx->events[i].data.fd;
        for (int e = 0; e < ctx->neps && fd != ctx->chan->fd && fd != ctx->evfd; e++) {
            if (ctx->eps[e].oob_fd == fd) {
                shoal_ib_peer_check(ctx, &ctx->eps[e]);
            }
        }
    }
    if (ctx->npending == 0) {
        shoal_ib_drain_events(ctx); /* nothing to miss: stay quiet */
        return ctx->epfd;
    }
    if (!ctx->armed) {
        if (ibv_req_notify_cq(ctx->cq, 0) != 0) {
            uint64_t one = 1;
            (void)write(ctx->evfd, &one, sizeof(one)); /* cannot sleep: make poll return */
            return ctx->epfd;
        }
        ctx->armed = 1;
    }
    /* Completions that landed before the arm raise no event: stash them and wake. */
    if (ctx->nstash < SHOAL_IB_WC_BATCH) {
        int k = ibv_poll_cq(ctx->cq, SHOAL_IB_WC_BATCH - ctx->nstash, ctx->stash + ctx->nstash);
        if (k > 0) {
            uint64_t one = 1;
            ctx->nstash += k;
            (void)write(ctx->evfd, &one, sizeof(one));
        }
    }
    return ctx->epfd;
}

static void shoal_ib_fail(shoal_tl_ctx_t *ctx, int culprit, shoal_status_t status)
{
    char why[128];
    snprintf(why, sizeof(why), "communicator failed because of rank %d", culprit);
    shoal_ib_lazy_fail(ctx, culprit); /* peers not connected yet: ABORT, listener closed */
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->status == SHOAL_OK) {
            shoal_ib_ep_send_abort(ep, culprit);
            (void)shoal_ib_ep_fail(ep, status, culprit, why);
        }
    }
}

/* A software device's packets are made and taken apart by this host's CPUs. */
static int shoal_ib_host_cpu(shoal_tl_ctx_t *ctx)
{
    return ctx->soft;
}

/* 1 if init would find its port: an ACTIVE one allowed by SHOAL_IB_HCA (the one init picks)
 * and, on RoCE, a GID there as SHOAL_IB_ADDR_FAMILY / SHOAL_IB_GID_INDEX ask. An ACTIVE RoCE
 * port whose interface has no address of that family fails init, and the automatic choice,
 * which takes ib across hosts when this says yes, would fail the job where tcp works; the
 * reason goes into the library's note (the registry prints it). Loads libibverbs (first
 * call): only asked when the ib transport may be used (tl_registry.c). */
static int shoal_ib_query(void)
{
    shoal_ib_pick_t pk = {0};
    shoal_ib_gid_t gid;
    char why[sizeof(shoal_ib_lib.note)] = "";
    int ok = 1;
    if (shoal_tl_lib_load(&shoal_ib_lib) != SHOAL_OK || shoal_ib_pick_port(&pk, 1) != SHOAL_OK) {
        return 0;
    }
    if (pk.attr.link_layer == IBV_LINK_LAYER_ETHERNET &&
        shoal_ib_gid_select(shoal_ib_config.sysfs_root, pk.name, pk.port,
                            shoal_ib_config.family, shoal_ib_config.gid_index, &gid, why,
                            sizeof(why)) != SHOAL_OK) {
        ok = 0;
    }
    ibv_close_device(pk.dev);
    pthread_mutex_lock(&shoal_ib_lib.lock);
    snprintf(shoal_ib_lib.note, sizeof(shoal_ib_lib.note), "%s", ok ? "" : why);
    pthread_mutex_unlock(&shoal_ib_lib.lock);
    return ok;
}

/* shoal_info -t: the port init would pick, as the sizes rule sees it. */
static int shoal_ib_link(shoal_tl_link_t *l)
{
    shoal_ib_pick_t pk = {0};
    struct ibv_device_attr da;
    int soft = shoal_ib_config.soft_device;

    if (shoal_tl_lib_load(&shoal_ib_lib) != SHOAL_OK || shoal_ib_pick_port(&pk, 1) != SHOAL_OK) {
        return 0;
    }
    if (soft < 0) {
        soft = shoal_ib_soft_device(shoal_ib_config.sysfs_root, pk.name,
                                    ibv_query_device(pk.dev, &da) == 0 ? da.vendor_id : 0);
    }
    shoal_ib_link_of(&pk, soft, l);
    ibv_close_device(pk.dev);
    return 1;
}

const shoal_tl_ops_t shoal_tl_ib_ops = {
    .abi_version = SHOAL_TL_ABI_VERSION,
    .name = "ib",
    .caps = SHOAL_TL_CAP_HOST_CPU | SHOAL_TL_CAP_LAZY,
    .intra_node_only = 0,
    .query = shoal_ib_query,
    .init = shoal_ib_init,
    .address = shoal_ib_address,
    .connect_all = shoal_ib_connect_all,
    .ready = shoal_ib_ready,
    .isend = shoal_ib_ep_isend,
    .irecv = shoal_ib_ep_irecv,
    .progress = shoal_ib_progress,
    .wait_fd = shoal_ib_wait_fd,
    .wait = NULL,
    .fail = shoal_ib_fail,
    .fini = shoal_ib_fini,
    .host_cpu = shoal_ib_host_cpu,
    .link = shoal_ib_link,
};
