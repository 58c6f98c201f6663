/* UCX transport: one UCP context and worker per shoal context, tag-matched messages.
 *
 * Tags (64 bits): kind (2 bits) | sender rank (22 bits) | key (40 bits). The key of the
 * direction a->b is the first 40 bits of HMAC(secret, "shoal-ucx-tag" | comm_id | a | b |
 * nonce_a | nonce_b), so a message only matches a posted receive when its sender knows the
 * job secret and both contexts' nonces; receives match one peer and one kind with a full mask,
 * and UCX matches same-tag messages from one endpoint in order: that is the FIFO of the
 * contract.
 *
 * Authentication: connect_all sends every peer an AUTH message (HMAC proof over both nonces)
 * and waits for the peer's; a receive of data from a peer is only ever posted after its proof
 * was checked. A wrong proof is SHOAL_ERR_AUTH.
 *
 * Connections at first use (params->lazy, SHOAL_TL_CAP_LAZY): connect_all validates and keeps
 * the peers' addresses, posts the receive of every peer's proof (a posted receive is no
 * connection: nothing is sent, no UCX endpoint exists) and returns. progress() opens the UCX
 * endpoint of a peer and sends our proof when a request is first posted to it, or when its
 * proof arrives (it connected to us first); both sides may start at once (each side has its
 * own endpoint, nothing to settle). Requests posted before the proofs are checked wait in the
 * endpoint's queues, in order. No proof within timeout_ms of opening: SHOAL_ERR_TIMEOUT, or
 * SHOAL_ERR_AUTH if only proofs under another key came claiming the peer's rank (from the peer
 * with another job's secret, or from a process posing as it: a tag cannot tell, and the error
 * does not say the peer sent them); a peer gone: SHOAL_ERR_PEER_FAILED. Only that endpoint
 * fails.
 *
 * Messages: a payload of at most inline_max bytes travels in one HDR message (eager) behind
 * a 12-byte short header: seq, step and chunk (SHOAL_UCX_SHORT_HDR_BYTES). The rest of the
 * 32-byte wire header would only repeat what the match already proved: the tag's key binds
 * the message to this communicator, direction and job secret, its kind tells data from abort
 * notices, and the length is the message's own. A larger payload is a 32-byte HDR message
 * (the wire header) followed by a DATA message with the payload straight from/to the caller's
 * buffer (UCX's rendezvous for large sizes). The receiver posts the HDR receive into a slot
 * buffer of its own, checks the header (shoal_ucx_hdr_check), and only then copies the inline
 * payload or posts the DATA receive on the caller's buffer with exactly the posted length
 * (more is truncation: SHOAL_ERR_PROTOCOL). The short header keeps a small message small in
 * UCX's shared-memory FIFO: with the 32-byte header, UCX's copy of an 8-byte AllReduce's
 * message out of the FIFO took 4.8% of the call's time, 0.2% with no header (perf, 2 ranks).
 *
 * Single copy on one host (CMA): between ranks of one host UCX 1.13 leaves its cma transport
 * out of endpoints with peer error handling, so a large payload would go through UCX's
 * shared-memory FIFO in fragments (two copies, and a fragment per receiver wakeup). Instead,
 * where the receiver showed at connect time that it can read the sender's memory (it reads
 * the sender's nonce at the address the sender published, with process_vm_readv, and compares:
 * that checks the ptrace permission and that the pid is the peer's process, not another one
 * in another pid namespace), a payload above inline_max (and SHOAL_UCX_CMA_MIN) travels as a
 * 48-byte HDR message: the header and a descriptor {SCMA magic, 0, address}. The receiver
 * checks it, reads the payload straight from the sender's buffer into the posted one with
 * process_vm_readv, then sends an 8-byte FIN (tag kind AUTH, unused after connect); the send
 * completes when the FIN arrives. A read that fails sends a FIN with its errno (the send fails
 * with it) and fails the endpoint. The receiver's verdict travels after the proofs as an 8-byte
 * HELLO (kind AUTH too: proof, HELLO, then FINs, in order on one tag) between same-host peers.
 *
 * Abort notices (fail()) have a tag kind of their own: they overtake the data in flight (a
 * peer stuck in a rendezvous with a failed sender still learns why), and progress() probes
 * for them every millisecond on endpoints with pending requests, and before failing an
 * endpoint whose peer is gone (so the error names the rank that started the failure).
 *
 * Quarantine: UCX cannot cancel a receive it has matched (a rendezvous in progress), and a
 * failed request must complete at once; so if an endpoint fails while such a payload receive
 * into a caller's buffer is outstanding, the context never progresses the worker again (not
 * even in fini): nothing can then write into a buffer its owner got back. Any failure is
 * communicator-fatal above, so only the teardown is left to do.
 *
 * Early messages: UCX keeps a message that arrives before a matching receive in its unexpected
 * queue, without limit, and one under a tag that no receive ever matches (a process outside
 * the job, another job's key) until the worker's destruction: anyone who can reach the worker
 * could make this rank allocate without bound. So progress() takes every unexpected message
 * out of that queue (ucp_tag_probe_nb, remove): one under a peer's key (only a rank of the job
 * knows it) is held in the endpoint's queue of its kind, oldest first, and the next receive of
 * that kind takes it (ucp_tag_msg_recv_nbx); any other one is received into a scratch buffer
 * (truncated) and dropped at once. A peer with more than SHOAL_UCX_UNEXPECTED_MAX messages
 * held, or the one with the most when all hold more than SHOAL_UCX_UNEXPECTED_TOTAL, fails
 * its endpoint with SHOAL_ERR_PROTOCOL, the peer named (and told, by an abort notice).
 *
 * Peer failure: endpoints use UCP_ERR_HANDLING_MODE_PEER; UCX's error callback, or the death
 * of a same-host peer's process (pidfd; also of a peer under another host id whose process
 * this machine runs: ucx_conn.c), marks the endpoint "gone": receives that UCX can
 * still satisfy from what already arrived complete, the rest fail with SHOAL_ERR_PEER_FAILED.
 */
#ifndef SHOAL_UCX_H
#define SHOAL_UCX_H

#include "core/tl.h"

#include <poll.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#define SHOAL_UCX_ADDR_MAGIC 0x58435553u   /* "SUCX" */
#define SHOAL_UCX_ADDR_VERSION 4        /* 2: the CMA probe address at byte 48; 3: the short
                                         * header of inline payloads; 4: the pid namespace
                                         * at byte 56 */
#define SHOAL_UCX_ADDR_HDR_BYTES 64
#define SHOAL_UCX_NONCE_BYTES 16
#define SHOAL_UCX_SLOTS 16                 /* in-flight messages per endpoint and direction */
#define SHOAL_UCX_INLINE_CAP ((size_t)1 << 20) /* SHOAL_UCX_INLINE_MAX at most (1 MiB) */
#define SHOAL_UCX_RANK_BITS 22
#define SHOAL_UCX_KEY_BITS 40
#define SHOAL_UCX_DRAIN_CALLS 256          /* shoal_ucx_drain: most progress calls */
#define SHOAL_UCX_CLOSE_MS 1000            /* fini: longest wait for graceful closes */
#define SHOAL_UCX_LINGER_MS 1000           /* fini without a completed connect_all: see there */
#define SHOAL_UCX_NOTICE_MS 200            /* fail: longest wait for abort notices' delivery */
#define SHOAL_UCX_CMA_MAGIC 0x414d4353u    /* "SCMA": descriptor after a HDR's header */
#define SHOAL_UCX_CMA_DESC_BYTES 16        /* magic (4), zero (4), sender's address (8) */
#define SHOAL_UCX_FIN_MAGIC 0x4e494653u    /* "SFIN": the receiver has read the payload */
#define SHOAL_UCX_HELLO_MAGIC 0x484d4353u  /* "SCMH": after the proof, same-host peers only */
#define SHOAL_UCX_CTL_BYTES 8              /* FIN and HELLO: magic (4), value (4) */
#define SHOAL_UCX_SHORT_HDR_BYTES 12       /* inline payloads: seq, step, chunk (4 each) */

typedef enum {
    SHOAL_UCX_TAG_ABORT = 0,   /* overtakes data: found by probing, see ucx_ep.c */
    SHOAL_UCX_TAG_AUTH = 1,    /* the proof; then HELLO and FINs (see CMA above) */
    SHOAL_UCX_TAG_HDR = 2,
    SHOAL_UCX_TAG_DATA = 3,
} shoal_ucx_kind_t;

/* ---- config (ucx_config.c) -------------------------------------------------------------- */

typedef struct {
    size_t inline_max;     /* SHOAL_UCX_INLINE_MAX */
    const char *library;   /* SHOAL_UCX_LIBRARY: libucp, loaded at first use (ucx_dl.c) */
    int cma;               /* SHOAL_UCX_CMA: single-copy reads between same-host ranks */
    size_t cma_min;        /* SHOAL_UCX_CMA_MIN: smallest payload sent that way */
    int fast_cmpl;         /* SHOAL_UCX_FAST_CMPL: same-host sends complete locally, eagerly */
    const char *sysfs_root; /* SHOAL_UCX_SYSFS_ROOT: where present() looks for RDMA ports */
    unsigned unexp_max;    /* SHOAL_UCX_UNEXPECTED_MAX: early messages held per peer */
    unsigned unexp_total;  /* SHOAL_UCX_UNEXPECTED_TOTAL: early messages held in all */
} shoal_ucx_config_t;

extern SHOAL_HIDDEN shoal_ucx_config_t shoal_ucx_config;
extern const shoal_cfg_table_t shoal_ucx_cfg_table;

/* ---- address ------------------------------------------------------------------------------ */

typedef struct {
    uint32_t rank;
    uint32_t pid;
    uint32_t pid_ns;       /* inode of the rank's pid namespace (0: unknown): pid names it
                            * only in that namespace */
    uint64_t host_id;
    uint32_t inline_max;
    uint8_t nonce[SHOAL_UCX_NONCE_BYTES];
    uint64_t cma_addr;     /* where the nonce lies in the rank's memory; 0: no CMA offered */
    uint32_t worker_len;   /* bytes of the UCP worker address that follow */
    const uint8_t *worker; /* points into the decoded buffer */
} shoal_ucx_addr_t;

/* ---- objects ------------------------------------------------------------------------------- */

typedef enum {
    SHOAL_UCX_SLOT_FREE = 0,
    SHOAL_UCX_SLOT_HDR,        /* rx: HDR receive posted */
    SHOAL_UCX_SLOT_HDR_DONE,   /* rx: HDR arrived, not yet checked */
    SHOAL_UCX_SLOT_DATA,       /* rx: DATA receive posted; tx: sends in flight */
    SHOAL_UCX_SLOT_DONE,       /* transfer over (ucs holds the outcome) */
} shoal_ucx_slot_state_t;

/* A message taken out of UCX's unexpected queue before its receive was posted (see "Early
 * messages" above), held until a receive of its kind takes it. */
typedef struct shoal_ucx_unexp {
    struct shoal_ucx_unexp *next;
    ucp_tag_message_h msg;
    size_t len;
} shoal_ucx_unexp_t;

typedef struct shoal_ucx_slot {
    struct shoal_ep *ep;
    shoal_tl_req_t *req;       /* NULL once the request was failed with the endpoint */
    void *ucx_req;             /* rx: the outstanding UCX receive; tx: FIN receive; cancel */
    int state;                 /* shoal_ucx_slot_state_t */
    int nout;                  /* tx: UCX sends in flight */
    int cancelled;
    ucs_status_t ucs;          /* first UCX error of the transfer */
    size_t rlen;               /* rx: bytes the last receive got */
    int fin_wait;              /* tx: FIN receive posted, its callback not yet run */
    int fin_err;               /* tx: 0, the receiver's errno (it could not read the
                                * payload), or -1: the FIN was malformed */
    uint8_t fin[SHOAL_UCX_CTL_BYTES]; /* tx: FIN received; rx: FIN sent */
    uint8_t *buf;              /* SHOAL_WIRE_HDR_BYTES + max(inline_max, CMA descriptor) */
    int whole;                 /* rx: the HDR receive also takes the payload (iov) */
    ucp_dt_iov_t iov[2];       /* header in buf, payload in the caller's buffer */
} shoal_ucx_slot_t;

struct shoal_ep {
    shoal_tl_ctx_t *ctx;
    int peer;                          /* global rank */
    ucp_ep_h uep;                      /* NULL once closed */
    void *close_req;                   /* outstanding ucp_ep_close_nbx */
    int local;                         /* same host: pidfd watched */
    int same_host;                     /* host ids equal (both sides agree): HELLO exchanged */
    int fast_cmpl;                     /* same host and SHOAL_UCX_FAST_CMPL: sends ask UCX for
                                        * fast local completion (eager below its nbr limit) */
    int pidfd;                         /* -1: none (fallback kill(pid, 0)) */
    uint32_t pid;
    size_t inline_max;                 /* min of both sides */
    ucp_tag_t tx_tag, rx_tag;          /* key | rank bits, without the kind */
    uint8_t peer_nonce[SHOAL_UCX_NONCE_BYTES];
    shoal_status_t status;             /* SHOAL_OK until the endpoint fails */
    int gone;                          /* peer unreachable: fail what cannot complete */
    uint64_t gone_ns;
    int gone_fresh;                    /* gone, not yet looked for an abort notice */
    int post_failed;                   /* isend refused on a gone ep: fail in progress */
    int culprit;                       /* with status: the rank blamed, or -1 */
    char why[192];                     /* cause of the failure */
    int npending;
    /* connection setup */
    uint8_t auth_rx[SHOAL_HMAC_BYTES], auth_tx[SHOAL_HMAC_BYTES];
    void *auth_rreq, *auth_sreq;
    int auth_rdone, auth_sdone;
    ucs_status_t auth_ucs;
    size_t auth_rlen;
    int auth_ok;                       /* the peer's proof was checked */
    uint64_t peer_cma_addr;            /* the peer's probe address (its nonce), 0: none */
    uint8_t hello_rx[SHOAL_UCX_CTL_BYTES], hello_tx[SHOAL_UCX_CTL_BYTES];
    void *hello_rreq, *hello_sreq;
    int hello_rdone, hello_sdone, hello_sent;
    size_t hello_rlen;
    int cma_rx;                        /* we read the peer's payloads (probe passed) */
    int cma_tx;                        /* the peer reads ours (its HELLO said so) */
    /* lazy (SHOAL_UCX_LAZY_*): 0 for an eager endpoint and once the proofs are checked */
    int lazy_state;
    uint64_t lazy_start_ns;            /* lazy: when the UCX endpoint was opened */
    const uint8_t *peer_worker;        /* lazy: the peer's UCP worker address (ctx's copy) */
    size_t peer_worker_len;
    uint8_t abort_buf[SHOAL_WIRE_HDR_BYTES], abort_rx[SHOAL_WIRE_HDR_BYTES];
    void *abort_req;                   /* fail(): our abort notice still in flight */
    void *notice_flush;                /* fail(): the flush that waits for its delivery */
    int notice_posted;                 /* an abort notice was handed to UCX */
    /* send side: ring of slots, oldest first; sq_* waits for a free slot */
    shoal_ucx_slot_t tx[SHOAL_UCX_SLOTS];
    int tx_head, tx_count;
    shoal_tl_req_t *sq_head, *sq_tail;
    /* receive side; the first rx_checked slots from rx_head had their header checked */
    shoal_ucx_slot_t rx[SHOAL_UCX_SLOTS];
    int rx_head, rx_count, rx_checked;
    shoal_tl_req_t *rq_head, *rq_tail;
    /* early messages of the peer (under its key), oldest first, by kind */
    shoal_ucx_unexp_t *uq_head[4], *uq_tail[4];
    int nunexp;
    int foreign_auth;                  /* a proof under another key claimed the peer's rank */
};

struct shoal_tl_ctx {
    int rank;
    int nranks;
    uint32_t comm_id;
    uint8_t secret[SHOAL_SECRET_BYTES];
    uint8_t nonce[SHOAL_UCX_NONCE_BYTES];
    int timeout_ms;
    const volatile int *abort_flag;
    int qos_ib_tc;                     /* the class's IB_TRAFFIC_CLASS, -1: UCX's own */
    size_t inline_max;
    size_t cma_min;                    /* smallest payload this rank sends by single copy */
    ucp_context_h uctx;
    ucp_worker_h worker;
    ucp_address_t *waddr;
    size_t waddr_len;
    int waddr_net_only;                /* waddr came from ucp_worker_query, free differently */
    int ucx_efd;
    int epfd;                          /* ucx_efd, pidfds and kick_fd */
    int kick_fd;                       /* eventfd: readable when progress is due now */
    int kicked;
    int quarantined;                   /* a failed receive may still be written: no progress */
    int addr_given;                    /* address() handed our worker's address out */
    int connected;                     /* connect_all returned SHOAL_OK */
    unsigned nevents;                  /* UCX completions since the last progress() */
    /* Set where an endpoint's slots or queues change outside a UCX callback (a request
     * posted or started, a kick): progress() scans the endpoints only then, after a UCX
     * completion (nevents) or on the liveness tick, so an idle poll costs no walk over the
     * endpoints */
    int dirty;
    shoal_ep_t *eps;
    int neps;
    int npending;
    uint64_t next_live_ns;             /* next liveness check of same-host peers */
    unsigned clock_polls;              /* progress() calls since the clock was last read */
    struct pollfd *live_pfds;          /* [neps] pidfds of local peers (fd -1 otherwise) */
    uint8_t *slot_mem;                 /* all slot buffers of all endpoints */
    size_t slot_bytes;                 /* bytes of one slot buffer */
    uint64_t cma_reads, cma_bytes;     /* payloads read from peers (tests, tracing) */
    uint64_t whole_rx;                 /* payloads that came in one message with their header */
    /* Who failed first, as far as this rank saw (-1: nobody yet): the culprit named by the
     * first abort notice, else the first same-host peer seen gone. A peer that exited
     * without a notice reaching us is reported with it: it most likely exited because of
     * that failure (a cascade), and survivors must name the rank that started it. */
    int notice_culprit;
    int first_gone;
    uint64_t first_gone_ns;            /* when first_gone was seen gone */
    /* connections at first use (params->lazy) */
    int lazy;
    int lazy_want;                     /* an idle endpoint got a request or the peer's proof */
    int lazy_idle;                     /* endpoints not yet opened (healthy or not) */
    int *lazy_q;                       /* [neps] indices of endpoints authenticating */
    int lazy_nq;
    uint8_t *peer_workers;             /* every peer's worker address, kept until fini */
    int lazy_nup;                      /* endpoints authenticated at first use (tests) */
    /* early messages (see "Early messages" above) */
    uint64_t *by_rank;                 /* [neps] peer rank << 32 | endpoint index, sorted */
    int nunexp;                        /* held by all endpoints */
    shoal_ucx_unexp_t *unexp_free;     /* entries for reuse */
    uint64_t nforeign;                 /* messages under no key of ours, discarded (tests) */
    uint8_t discard[SHOAL_WIRE_HDR_BYTES]; /* where they are received (truncated) */
};

enum {
    SHOAL_UCX_LAZY_UP = 0,             /* eager, or authenticated */
    SHOAL_UCX_LAZY_IDLE = 1,           /* proof receive posted, no UCX endpoint */
    SHOAL_UCX_LAZY_OPEN = 2,           /* UCX endpoint opened, proofs being exchanged */
};

/* ucx_ctx.c */
SHOAL_HIDDEN const char *shoal_ucx_strerror(ucs_status_t st);
/* Once per process, UCX loaded: UCX's log messages to shoal's log, not stdout (unless
 * UCX_LOG_FILE is set), until libshoal is unloaded or the process exits. */
SHOAL_HIDDEN void shoal_ucx_log_redirect(void);
SHOAL_HIDDEN void shoal_ucx_kick(shoal_tl_ctx_t *ctx);
/* Progresses the worker until a call finds nothing: what has arrived is handled (at most
 * SHOAL_UCX_DRAIN_CALLS calls: peers that keep sending cannot hold the caller). */
SHOAL_HIDDEN void shoal_ucx_drain(shoal_tl_ctx_t *ctx);
/* 1 if the process of same-host peer ep has exited (its pidfd, else kill(pid, 0)). */
SHOAL_HIDDEN int shoal_ucx_ep_peer_exited(const shoal_ep_t *ep);
/* The peer of healthy endpoint ep is gone (why): an error if requests wait on it, else INFO
 * (a peer that is done and left before this rank). */
SHOAL_HIDDEN void shoal_ucx_ep_log_gone(const shoal_ep_t *ep, const char *why);
/* Same-host peer ep's process has exited (seen in the check at pass_ns): logs it, stops
 * watching the process and marks the endpoint gone. */
SHOAL_HIDDEN void shoal_ucx_ep_set_exited(shoal_ep_t *ep, uint64_t pass_ns);

/* ucx_conn.c: address, keys and proofs, endpoints and connect_all with the AUTH exchange */
SHOAL_HIDDEN shoal_status_t shoal_ucx_tag_key(const shoal_tl_ctx_t *ctx, int from, int to,
                                              const uint8_t *nonce_from,
                                              const uint8_t *nonce_to, ucp_tag_t *key_p);
SHOAL_HIDDEN shoal_status_t shoal_ucx_proof(const shoal_tl_ctx_t *ctx, int from, int to,
                                            const uint8_t *nonce_from, const uint8_t *nonce_to,
                                            uint8_t out[SHOAL_HMAC_BYTES]);

SHOAL_HIDDEN int shoal_ucx_addr_decode(const void *in, size_t len, shoal_ucx_addr_t *a);
SHOAL_HIDDEN size_t shoal_ucx_addr_encode(const shoal_tl_ctx_t *ctx, uint8_t *out,
                                          size_t room);
SHOAL_HIDDEN shoal_status_t shoal_ucx_connect_all(shoal_tl_ctx_t *ctx, const int *peers,
                                                  int npeers, const void *const *addrs,
                                                  const size_t *addr_lens, shoal_ep_t **eps_p);

/* Lazy contexts: opens the endpoints that are needed, drives their proof exchanges and fails
 * those that time out; the number of requests completed (failed). */
SHOAL_HIDDEN int shoal_ucx_lazy_progress(shoal_tl_ctx_t *ctx);
/* Lazy, fail(): every peer whose proof came to an endpoint not yet opened gets an abort
 * notice (best effort, at most ~1 ms); later ones get theirs from progress(). */
SHOAL_HIDDEN void shoal_ucx_lazy_fail(shoal_tl_ctx_t *ctx);
/* Lazy: a request was queued on an endpoint not yet authenticated: connect it. */
SHOAL_HIDDEN void shoal_ucx_lazy_want(shoal_ep_t *ep);

/* ucx_ep.c: data path */
/* Checks an arrived HDR message (rlen bytes in buf) against the posted receive's header.
 * At most inline_max bytes expected: the short header (seq, step, chunk) followed by exactly
 * the payload. Above: a valid wire header, followed by nothing (a DATA message follows), or,
 * only when cma_ok, by a CMA descriptor whose address goes to *cma_addr_p (else 0). SHOAL_OK,
 * or the status with a sentence in why and in *culprit_p the rank an abort notice blames
 * (-1: none). */
SHOAL_HIDDEN shoal_status_t shoal_ucx_hdr_check(const shoal_wire_hdr_t *expect,
                                                const uint8_t *buf, size_t rlen,
                                                size_t inline_max, int cma_ok,
                                                uint64_t *cma_addr_p, char *why, size_t whylen,
                                                int *culprit_p);
static inline ucp_tag_t shoal_ucx_tag(ucp_tag_t base, shoal_ucx_kind_t kind)
{
    return base | ((ucp_tag_t)kind << 62);
}
SHOAL_HIDDEN shoal_status_t shoal_ucx_ep_isend(shoal_ep_t *ep, shoal_tl_req_t *req);
SHOAL_HIDDEN shoal_status_t shoal_ucx_ep_irecv(shoal_ep_t *ep, shoal_tl_req_t *req);
SHOAL_HIDDEN int shoal_ucx_ep_progress(shoal_ep_t *ep, int tick);
/* Lazy: the endpoint is authenticated: starts the requests queued until now, in order. */
SHOAL_HIDDEN void shoal_ucx_ep_start_queued(shoal_ep_t *ep);
/* Takes every message out of UCX's unexpected queue: one under a peer's key is held for its
 * receive (over the limits the endpoint fails), any other one is discarded; the completions
 * of failures. */
SHOAL_HIDDEN int shoal_ucx_unexp_drain(shoal_tl_ctx_t *ctx);
/* Posts a receive of kind from ep's peer into buf: its oldest early message of that kind if
 * one is held, else a tag receive (the request or error, as ucp_tag_recv_nbx). */
SHOAL_HIDDEN void *shoal_ucx_tag_recv(shoal_ep_t *ep, void *buf, size_t count,
                                      shoal_ucx_kind_t kind, const ucp_request_param_t *p);
/* Discards the endpoint's early messages (it failed, or the context ends). */
SHOAL_HIDDEN void shoal_ucx_unexp_release(shoal_ep_t *ep);
/* connect_all: the endpoints' index by peer rank, for shoal_ucx_unexp_drain. */
SHOAL_HIDDEN shoal_status_t shoal_ucx_by_rank_build(shoal_tl_ctx_t *ctx);
SHOAL_HIDDEN int shoal_ucx_ep_fail(shoal_ep_t *ep, shoal_status_t status, int culprit,
                                   const char *why);
SHOAL_HIDDEN void shoal_ucx_ep_set_gone(shoal_ep_t *ep, const char *why);
/* Looks for an abort notice from the peer; if there is one, fails the endpoint with its
 * cause. Returns 1 then (completions in *n_p). */
SHOAL_HIDDEN int shoal_ucx_ep_probe_abort(shoal_ep_t *ep, int *n_p);
/* Fails a gone endpoint with SHOAL_ERR_PEER_FAILED, blaming the rank whose failure came
 * first; the completions. */
SHOAL_HIDDEN int shoal_ucx_ep_fail_gone(shoal_ep_t *ep);
SHOAL_HIDDEN void shoal_ucx_ep_send_abort(shoal_ep_t *ep, int culprit);
SHOAL_HIDDEN void shoal_ucx_notices_deliver(shoal_tl_ctx_t *ctx, shoal_ep_t *only);
SHOAL_HIDDEN void shoal_ucx_ep_close(shoal_ep_t *ep, int force);
/* Cancels the endpoint's outstanding UCX receives (payloads and FINs). */
SHOAL_HIDDEN void shoal_ucx_ep_cancel_reqs(shoal_ep_t *ep);
/* FIN and HELLO messages: magic and value, little-endian. */
SHOAL_HIDDEN void shoal_ucx_ctl_encode(uint8_t out[SHOAL_UCX_CTL_BYTES], uint32_t magic,
                                       uint32_t value);
/* 0 and the value in *value_p if the rlen bytes at in are a control message with magic. */
SHOAL_HIDDEN int shoal_ucx_ctl_decode(const uint8_t *in, size_t rlen, uint32_t magic,
                                      uint32_t *value_p);

#endif
