/* IB transport: objects that hold verbs resources (ib_ctx.c, ib_ep.c). */
#ifndef SHOAL_IB_VERBS_H
#define SHOAL_IB_VERBS_H

#include "transports/common/oob.h"
#include "transports/ib/ib.h"

#include <infiniband/verbs.h>
#include <sys/epoll.h>

#define SHOAL_IB_WC_BATCH 32
#define SHOAL_IB_EVENTS 16
#define SHOAL_IB_SEND_BIT (1ull << 63)   /* wr_id of send work requests */

/* What address() publishes (SHOAL_IB_ADDR_BYTES, little-endian). */
typedef struct {
    uint8_t link_layer;       /* IBV_LINK_LAYER_* */
    uint8_t port;
    uint8_t mtu;              /* active MTU enum, already capped by SHOAL_IB_MTU */
    uint8_t is_global;
    uint16_t lid;
    uint8_t gid[16];
    shoal_oob_addr_t oob;     /* where our context accepts the per-pair exchange */
    uint16_t cm_port;         /* SHOAL_IB_USE_RDMACM=1: our rdma_cm listener's port, else 0 */
} shoal_ib_addr_t;

#define SHOAL_IB_CM_TOKEN_BYTES 16
/* The pair message on the out-of-band socket: shoal_ib_pair_t and its proof (ib_ctx.c) */
#define SHOAL_IB_PAIR_MSG_BYTES (SHOAL_IB_PAIR_BYTES + SHOAL_HMAC_BYTES)
/* Lazy connections (ib_lazy.c): states of an endpoint, and the exchange's message: a kind byte
 * (GO: our pair follows; ABORT: a wire abort header follows, the sender's communicator failed)
 * and 40 bytes. */
enum {
    SHOAL_IB_LZ_READY = 0,    /* connected (and every eager endpoint) */
    SHOAL_IB_LZ_IDLE,         /* nothing yet: the peer's address is kept */
    SHOAL_IB_LZ_DIAL,         /* our non-blocking dial and handshake */
    SHOAL_IB_LZ_WAIT,         /* our dial was closed early: dial again at lz_retry_ns */
    SHOAL_IB_LZ_XCHG,         /* authenticated: queue pair numbers and rings, sync byte */
};
#define SHOAL_IB_LZ_GO 0x47u
#define SHOAL_IB_LZ_ABORT 0x41u
#define SHOAL_IB_LZ_MSG_BYTES (1 + SHOAL_IB_PAIR_MSG_BYTES)

/* oob_eof that is no errno: the peer closed the socket (its process is gone), or it carried
 * bytes that are not an abort notice of this communicator (which say nothing of the process) */
#define SHOAL_IB_OOB_EOF (-1)
#define SHOAL_IB_OOB_JUNK (-2)

struct rdma_cm_id;
struct rdma_event_channel;

typedef struct {
    shoal_tl_req_t *req;      /* its last chunk, or NULL (credit/abort/middle chunk) */
    uintptr_t reg_key;        /* registration to release on completion */
    uint32_t reg_lkey;
    int has_reg;
    int has_bounce;           /* took a bounce slot: returned on completion */
} shoal_ib_wr_t;

struct shoal_ep {
    shoal_tl_ctx_t *ctx;
    int idx, peer;
    int oob_fd;                   /* kept open: EOF means the peer process is gone */
    int oob_eof;                  /* an errno, SHOAL_IB_OOB_EOF or SHOAL_IB_OOB_JUNK, or 0 */
    int oob_abort;                /* culprit + 1 of an abort notice read from oob_fd, or 0 */
    /* this peer's protection domain: its QP and registrations only (see ib.h) */
    struct ibv_pd *pd;
    struct ibv_qp *qp;
    struct ibv_mr *ring_mr;       /* our ring for this peer: remote write, rkey told to it */
    struct ibv_mr *send_mr;       /* bounce slots and staged headers: local only */
    uint32_t psn;
    shoal_ib_addr_t raddr;        /* peer's published address */
    shoal_status_t status;
    int culprit;                  /* with status: the rank blamed (abort notice; this rank
                                   * for a local completion error), or -1 */
    char why[192];
    /* the peer's ring */
    uint64_t rring;
    uint32_t rkey, rslot_size;
    uint32_t chunk_size;          /* min(its slot size, ours: our bounce slots) */
    shoal_ib_credit_t tx;
    /* our ring for this peer */
    uint8_t *ring;
    shoal_ib_ring_t rx;
    uint32_t *slot_len;
    uint8_t *slot_flags;
    uint32_t rx_depth;
    /* sends: sq_head..: queued; sq_post: the first with chunks left to post */
    shoal_tl_req_t *sq_head, *sq_tail, *sq_post;
    shoal_ib_wr_t *wrs;           /* sq_depth, indexed by posting count */
    uint32_t sq_depth, sq_posted, sq_done;
    uint8_t *hdrs;                /* sq_depth staged headers, in send_mr */
    uint8_t *bounce;              /* nbounce bounce slots of slot_size bytes, in send_mr */
    shoal_ib_credit_t bq;         /* bounce slots: taken at post, returned at completion */
    shoal_ib_regcache_t rc;       /* SHOAL_IB_REG_CACHE=1: user buffers in this pd */
    int rc_ready;
    uintptr_t cur_key;            /* registration of sq_post's buffer */
    uint32_t cur_lkey;
    const shoal_tl_req_t *noreg;  /* its buffer could not be registered: bounce slots */
    int cur_reg;
    /* receives */
    shoal_tl_req_t *rq_head, *rq_tail;
    /* SHOAL_IB_USE_RDMACM=1: the queue pair's rdma_cm identifier (and, connecting, its
     * event channel) */
    struct rdma_cm_id *cm_id;
    struct rdma_event_channel *cm_chan;
    /* SHOAL_CONNECT=lazy (ib_lazy.c): where this peer's connection stands */
    int lz_state;                 /* SHOAL_IB_LZ_*; READY (0) once connected, and eagerly */
    uint64_t lz_deadline;         /* the connection is due by then (0: nobody asked yet) */
    uint64_t lz_retry_ns;         /* WAIT: dial again from then on */
    int lz_refused, lz_closes, lz_proof_closes;
    shoal_oob_dial_t dial;        /* DIAL: our dial */
    int lz_fd;                    /* XCHG: the authenticated socket (ours or the peer's) */
    int lz_dialed;                /* XCHG: lz_fd is our dial's (else our acceptor's) */
    int lz_phase;                 /* XCHG: 0 send ours, 1 read theirs, 2 send sync, 3 read it,
                                   * 4 read the rest of an ABORT that came instead */
    size_t lz_off;
    uint8_t lz_out[SHOAL_IB_LZ_MSG_BYTES], lz_in[SHOAL_IB_LZ_MSG_BYTES];
};

struct shoal_tl_ctx {
    int rank;
    uint32_t comm_id;
    uint8_t secret[SHOAL_SECRET_BYTES];
    int timeout_ms;
    const volatile int *abort_flag;
    shoal_ib_qos_t qos;           /* traffic class, service level, rate limit of every QP */
    /* device */
    struct ibv_context *dev;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    char devname[SHOAL_IB_NAME_MAX];
    shoal_ib_gid_t gid;
    shoal_ib_addr_t addr;         /* ours */
    uint32_t nslots, slot_size, max_inline, credit_thresh, nbounce;
    int reg_cache;                /* SHOAL_IB_REG_CACHE */
    int soft;                     /* a software device: this host's CPUs move the data */
    size_t reg_cache_max;         /* SHOAL_IB_REG_CACHE_MAX, 0 where the hooks are missing */
    /* out of band */
    int listen_fd;
    /* SHOAL_IB_USE_RDMACM=1 (ib_cm.c): librdmacm's device contexts (dev is one of them), the
     * listener and its event channel */
    int use_cm;
    struct ibv_context **cm_devs;
    struct rdma_cm_id *cm_listen;
    struct rdma_event_channel *cm_chan;
    /* sleeping: epoll over the completion channel, an eventfd and the oob sockets */
    int epfd, evfd, armed;
    struct epoll_event events[SHOAL_IB_EVENTS];
    /* memory: the rings and the send areas of all peers (layout in ib.h) */
    shoal_ib_layout_t lay;
    uint8_t *ring_buf;
    uint8_t *send_buf;
    uint32_t *slot_len;
    uint8_t *slot_flags;
    shoal_ib_wr_t *wrs;
    shoal_ep_t *eps;
    int neps;
    int npending;
    uint64_t check_ns;            /* last peer check */
    /* SHOAL_CONNECT=lazy (ib_lazy.c; not with SHOAL_IB_USE_RDMACM=1: eager then) */
    int lazy;
    shoal_oob_auth_t auth;        /* the out-of-band handshake's, kept for the dials */
    shoal_oob_acceptor_t *acc;    /* on listen_fd, which stays open until fini or fail */
    int lz_open;                  /* endpoints neither connected nor failed */
    int lz_busy;                  /* endpoints in DIAL, WAIT or XCHG */
    int lz_qps;                   /* queue pairs connected at first use */
    uint64_t lz_poll_ns;          /* last look at the listener while nothing connects */
    int nstash;
    struct ibv_wc stash[SHOAL_IB_WC_BATCH];
    struct ibv_wc wc[SHOAL_IB_WC_BATCH];
};

/* ib_ctx.c */
SHOAL_HIDDEN void shoal_ib_addr_encode(const shoal_ib_addr_t *a, uint8_t *out);
SHOAL_HIDDEN int shoal_ib_addr_decode(const void *in, size_t len, shoal_ib_addr_t *a);
SHOAL_HIDDEN void shoal_ib_pair_encode(const shoal_ib_pair_t *p, uint8_t *out);
SHOAL_HIDDEN void shoal_ib_pair_decode(const uint8_t *in, shoal_ib_pair_t *p);
/* The pair message to peer `to` (SHOAL_IB_PAIR_MSG_BYTES): the pair, then HMAC(communicator
 * key, "shoal-ib-pair" | comm_id | from | to | pair). The handshake before it proves the key,
 * but not what follows on the socket: the proof binds our queue pair number, PSN, ring and
 * rkey to this communicator and this pair of ranks, so that nobody who relays the handshake
 * can put its own queue pair in their place. SHOAL_OK or the HMAC's failure. */
SHOAL_HIDDEN shoal_status_t shoal_ib_pair_seal(const shoal_tl_ctx_t *ctx, uint32_t to,
                                               const shoal_ib_pair_t *p, uint8_t *out);
/* Peer `from`'s pair message: its pair into *p if the proof is right (constant-time), else
 * SHOAL_ERR_AUTH (*p untouched). */
SHOAL_HIDDEN shoal_status_t shoal_ib_pair_open(const shoal_tl_ctx_t *ctx, uint32_t from,
                                               const uint8_t *in, shoal_ib_pair_t *p);

/* ib_ep.c */
SHOAL_HIDDEN shoal_status_t shoal_ib_connect_all(shoal_tl_ctx_t *ctx, const int *peers,
                                                 int npeers, const void *const *addrs,
                                                 const size_t *addr_lens, shoal_ep_t **eps_p);
SHOAL_HIDDEN shoal_status_t shoal_ib_ep_isend(shoal_ep_t *ep, shoal_tl_req_t *req);
SHOAL_HIDDEN shoal_status_t shoal_ib_ep_irecv(shoal_ep_t *ep, shoal_tl_req_t *req);
/* culprit: the rank the failure is blamed on (an abort notice), or -1. */
SHOAL_HIDDEN int shoal_ib_ep_fail(shoal_ep_t *ep, shoal_status_t status, int culprit,
                                  const char *why);
SHOAL_HIDDEN int shoal_ib_ep_error(shoal_ep_t *ep, shoal_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
SHOAL_HIDDEN int shoal_ib_ep_progress(shoal_ep_t *ep);
SHOAL_HIDDEN int shoal_ib_handle_wc(shoal_tl_ctx_t *ctx, const struct ibv_wc *wc);
SHOAL_HIDDEN void shoal_ib_ep_send_abort(shoal_ep_t *ep, int culprit);
SHOAL_HIDDEN int shoal_ib_ep_abort_notice(shoal_ep_t *ep, int culprit);
SHOAL_HIDDEN int shoal_ib_ep_oob_read(shoal_ep_t *ep);
SHOAL_HIDDEN int shoal_ib_ep_oob_gone(shoal_ep_t *ep);
SHOAL_HIDDEN void shoal_ib_ep_close(shoal_ep_t *ep);
SHOAL_HIDDEN void shoal_ib_conn_free(shoal_tl_ctx_t *ctx);
/* The attributes of a peer's RC queue pair; its receives posted. */
SHOAL_HIDDEN void shoal_ib_ep_qp_attr(shoal_ep_t *ep, struct ibv_qp_init_attr *ia);
SHOAL_HIDDEN int shoal_ib_ep_qp_retry(shoal_ep_t *ep, struct ibv_qp_init_attr *ia,
                                      const char *call, int err);
SHOAL_HIDDEN shoal_status_t shoal_ib_ep_post_recvs(shoal_ep_t *ep);

SHOAL_HIDDEN int shoal_ib_find_ep(shoal_tl_ctx_t *ctx, uint32_t rank);
/* A peer's protection domain and registrations; its QP in INIT with receives posted; the QP
 * to RTS from the peer's pair info (and its ring taken). */
SHOAL_HIDDEN shoal_status_t shoal_ib_ep_mem(shoal_ep_t *ep);
SHOAL_HIDDEN shoal_status_t shoal_ib_ep_qp(shoal_ep_t *ep);
SHOAL_HIDDEN shoal_status_t shoal_ib_ep_rts(shoal_ep_t *ep, const shoal_ib_pair_t *rp);

/* ib_lazy.c (SHOAL_CONNECT=lazy) */
/* connect_all, lazily: every endpoint IDLE, the acceptor on the listener, eps_p filled. */
SHOAL_HIDDEN shoal_status_t shoal_ib_lazy_start(shoal_tl_ctx_t *ctx, shoal_ep_t **eps_p);
/* A request was queued on ep: an IDLE endpoint starts its connection (deadline from now). */
SHOAL_HIDDEN void shoal_ib_lazy_want(shoal_ep_t *ep);
/* From progress: accepts, dials, exchanges; the number of requests completed (failed). */
SHOAL_HIDDEN int shoal_ib_lazy_progress(shoal_tl_ctx_t *ctx);
/* 1 if a handshake or exchange is under way (the caller must not sleep on epfd alone). */
SHOAL_HIDDEN int shoal_ib_lazy_busy(shoal_tl_ctx_t *ctx);
/* While connections are being made: their sockets (our dials, the exchanges, the acceptor's
 * handshakes) in the context's wait set, each for what it waits for, so that a waiter sleeps
 * until one can move. 0, or -1 if one could not be added (the waiter must not sleep). */
SHOAL_HIDDEN int shoal_ib_lazy_watch(shoal_tl_ctx_t *ctx);
/* fail(): endpoints under way tell the peer (ABORT) and fail; the listener closes. */
SHOAL_HIDDEN void shoal_ib_lazy_fail(shoal_tl_ctx_t *ctx, int culprit);
SHOAL_HIDDEN void shoal_ib_lazy_close(shoal_ep_t *ep);
SHOAL_HIDDEN void shoal_ib_lazy_fini(shoal_tl_ctx_t *ctx);

/* ib_cm.c (SHOAL_IB_USE_RDMACM=1; without librdmacm at build time: UNSUPPORTED) */
/* librdmacm's context of device devname into *dev_p (kept in ctx->cm_devs). */
SHOAL_HIDDEN shoal_status_t shoal_ib_cm_open(shoal_tl_ctx_t *ctx, const char *devname,
                                             struct ibv_context **dev_p);
/* Listens on the IP address of our GID; sets ctx->addr.cm_port. */
SHOAL_HIDDEN shoal_status_t shoal_ib_cm_listen(shoal_tl_ctx_t *ctx);
SHOAL_HIDDEN void shoal_ib_cm_fini(shoal_tl_ctx_t *ctx);
/* Destroys ep's queue pair and identifier. */
SHOAL_HIDDEN void shoal_ib_cm_close(shoal_ep_t *ep);
/* After the out-of-band handshake: connects ep's queue pair through rdma_cm with the token
 * the acceptor sent over it, mine out, theirs in. */
SHOAL_HIDDEN shoal_status_t shoal_ib_cm_connect(shoal_ep_t *ep,
                                                const uint8_t token[SHOAL_IB_CM_TOKEN_BYTES],
                                                const shoal_ib_pair_t *mine,
                                                shoal_ib_pair_t *theirs, uint64_t deadline);
/* Accepts peer ep's request carrying token (others are rejected). */
SHOAL_HIDDEN shoal_status_t shoal_ib_cm_accept(shoal_ep_t *ep,
                                               const uint8_t token[SHOAL_IB_CM_TOKEN_BYTES],
                                               const shoal_ib_pair_t *mine,
                                               shoal_ib_pair_t *theirs, uint64_t deadline);

#endif
