/* IB transport: connection setup and the data path.
 *
 * connect_all: per-peer resources (a protection domain holding the peer's ring and send area
 * registrations and its RC QP, in INIT with its receives posted; see ib.h), then the
 * per-pair exchange over out-of-band TCP authenticated with the job secret
 * (transports/common/oob.c). Every rank first connects to its lower peers in ascending order,
 * then accepts its higher peers in arrival order: rank 0 only accepts, and by induction every
 * rank reaches its accept phase, so the sequence cannot deadlock. Per pair: handshake, both
 * send their shoal_ib_pair_t, both move the QP INIT->RTR->RTS, both send one sync byte and
 * wait for the other's, so no write can reach a QP that is not ready. The oob socket stays
 * open: its EOF tells us the peer process died. With SHOAL_CONNECT=lazy, connect_all only
 * allocates and each pair runs the same exchange at first use, without blocking (ib_lazy.c).
 *
 * Data path: see ib.h. Completion of a send request comes with the send completion of its
 * last chunk (RC completes in order); a receive completes when its last chunk is copied. */
#include "transports/ib/ib_verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- failure ------------------------------------------------------------------------------- */

static void shoal_ib_req_complete(shoal_tl_req_t *req, shoal_status_t status, int culprit,
                                  const char *why)
{
    req->next = NULL;
    req->status = status;
    req->culprit = culprit;
    if (status != SHOAL_OK && req->errbuf != NULL && req->errlen > 0) {
        snprintf(req->errbuf, req->errlen, "%s", why);
    }
    __atomic_store_n(&req->done, 1, __ATOMIC_RELEASE);
}

static int shoal_ib_queue_fail(shoal_tl_req_t **head_p, shoal_tl_req_t **tail_p,
                               shoal_status_t status, int culprit, const char *why)
{
    int n = 0;
    shoal_tl_req_t *req = *head_p;
    while (req != NULL) {
        shoal_tl_req_t *next = req->next;
        shoal_ib_req_complete(req, status, culprit, why);
        req = next;
        n++;
    }
    *head_p = *tail_p = NULL;
    return n;
}

int shoal_ib_ep_fail(shoal_ep_t *ep, shoal_status_t status, int culprit, const char *why)
{
    int n;
    if (ep->status != SHOAL_OK) {
        return 0;
    }
    ep->status = status;
    ep->culprit = culprit;
    snprintf(ep->why, sizeof(ep->why), "%s", why);
    if (ep->cur_reg) {
        shoal_ib_regcache_put(&ep->rc, ep->cur_key, ep->cur_lkey);
        ep->cur_reg = 0;
    }
    /* In-flight work requests keep their wrs[] entries (released by their flush
     * completions); the requests themselves complete now. */
    for (uint32_t i = ep->sq_done; i != ep->sq_posted; i++) {
        ep->wrs[i % ep->sq_depth].req = NULL;
    }
    ep->sq_post = NULL;
    n = shoal_ib_queue_fail(&ep->sq_head, &ep->sq_tail, status, culprit, ep->why);
    n += shoal_ib_queue_fail(&ep->rq_head, &ep->rq_tail, status, culprit, ep->why);
    ep->ctx->npending -= n;
    if (ep->oob_fd >= 0) {
        (void)epoll_ctl(ep->ctx->epfd, EPOLL_CTL_DEL, ep->oob_fd, NULL);
    }
    return n;
}

/* Reads the oob socket without blocking. It carries nothing after the connection but the
 * peer's abort notice (shoal_ib_ep_send_abort): sets oob_abort (culprit + 1) when one came,
 * oob_eof on EOF (SHOAL_IB_OOB_EOF), an error (its errno) or anything else
 * (SHOAL_IB_OOB_JUNK). 1 if either is set now, else 0. */
int shoal_ib_ep_oob_read(shoal_ep_t *ep)
{
    uint8_t b[SHOAL_WIRE_HDR_BYTES];
    ssize_t r;
    if (ep->oob_fd < 0 || ep->oob_eof || ep->oob_abort) {
        return ep->oob_eof || ep->oob_abort;
    }
    r = recv(ep->oob_fd, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT);
    if (r == (ssize_t)sizeof(b) && recv(ep->oob_fd, b, sizeof(b), MSG_DONTWAIT) == r) {
        shoal_wire_hdr_t h;
        int culprit;
        shoal_wire_decode(b, &h);
        culprit = shoal_wire_culprit(&h);
        /* no rank is INT_MAX (ranks are below an int count); kept as culprit + 1, it
         * overflowed */
        if (culprit >= 0 && culprit < INT_MAX && h.comm_id == ep->ctx->comm_id) {
            ep->oob_abort = culprit + 1;
        } else {
            ep->oob_eof = SHOAL_IB_OOB_JUNK; /* not a notice: nothing more is read from it */
        }
        return 1;
    }
    if (r > 0) {
        /* Part of a notice: the rest follows, unless the peer closed after it. A peek returns
         * these bytes at every call, never the EOF behind them: that end went unseen, and the
         * socket stayed readable in the wait set. */
        struct pollfd p = {.fd = ep->oob_fd, .events = POLLIN | POLLRDHUP};
        if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
            ep->oob_eof = SHOAL_IB_OOB_EOF;
            return 1;
        }
        return 0;
    }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        ep->oob_eof = r == 0 ? SHOAL_IB_OOB_EOF : errno;
        return 1;
    }
    return 0;
}

/* ep's out-of-band socket ended (oob_eof set by shoal_ib_ep_oob_read): its queued requests
 * fail with what happened. The number completed. */
int shoal_ib_ep_oob_gone(shoal_ep_t *ep)
{
    if (ep->oob_eof == SHOAL_IB_OOB_JUNK) {
        /* garbled, or not the peer's: its process may well be alive (it was reported as
         * "closed its out-of-band connection (Protocol error): the process is gone") */
        return shoal_ib_ep_error(ep, SHOAL_ERR_PROTOCOL, "peer %d: its out-of-band connection "
                                 "carried bytes that are not an abort notice of this "
                                 "communicator; it is no longer read", ep->peer);
    }
    return shoal_ib_ep_error(ep, SHOAL_ERR_PEER_FAILED, "peer %d closed its out-of-band "
                             "connection (%s): the process is gone", ep->peer,
                             ep->oob_eof < 0 ? "EOF" : strerror(ep->oob_eof));
}

int shoal_ib_ep_error(shoal_ep_t *ep, shoal_status_t status, const char *fmt, ...)
{
    char why[192];
    va_list ap;
    if (ep->status != SHOAL_OK) {
        return 0;
    }
    /* A peer that failed because of another rank told us so before going away: a completion
     * error or EOF that its exit caused is blamed on that rank, not on the peer. */
    (void)shoal_ib_ep_oob_read(ep);
    if (ep->oob_abort != 0) {
        return shoal_ib_ep_abort_notice(ep, ep->oob_abort - 1);
    }
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    shoal_error(IB, "rank %d: %s", ep->ctx->rank, why);
    return shoal_ib_ep_fail(ep, status, -1, why);
}

/* The peer's abort notice: it failed because of rank culprit. */
int shoal_ib_ep_abort_notice(shoal_ep_t *ep, int culprit)
{
    char why[192];
    if (ep->status != SHOAL_OK) {
        return 0;
    }
    snprintf(why, sizeof(why), "peer %d: its communicator failed because of rank %d", ep->peer,
             culprit);
    shoal_error(IB, "rank %d: %s", ep->ctx->rank, why);
    return shoal_ib_ep_fail(ep, SHOAL_ERR_PEER_FAILED, culprit, why);
}

/* ---- posting ------------------------------------------------------------------------------- */

static shoal_status_t shoal_ib_post_recv(shoal_ep_t *ep)
{
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)ep->idx, .num_sge = 0}, *bad;
    return ibv_post_recv(ep->qp, &wr, &bad) == 0 ? SHOAL_OK : SHOAL_ERR_TRANSPORT;
}

/* Posts one RDMA write with immediate (inl: IBV_SEND_INLINE); the caller checked the send
 * queue has room. */
static int shoal_ib_post_write(shoal_ep_t *ep, const shoal_ib_sge_t *sg, int nsge, int inl,
                               int slot, const shoal_ib_imm_t *imm)
{
    struct ibv_send_wr wr = {0}, *bad;
    struct ibv_sge sge[2];
    uint32_t v;
    if (shoal_ib_imm_encode(imm, &v) != 0 || nsge > 2) {
        return -1;
    }
    for (int i = 0; i < nsge; i++) {
        sge[i] = (struct ibv_sge){.addr = sg[i].addr, .length = sg[i].length,
                                  .lkey = sg[i].lkey};
    }
    wr.wr_id = SHOAL_IB_SEND_BIT | (uint64_t)ep->idx << 32 | (ep->sq_posted % ep->sq_depth);
    wr.sg_list = nsge > 0 ? sge : NULL;
    wr.num_sge = nsge;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0);
    wr.imm_data = htonl(v);
    wr.wr.rdma.remote_addr = ep->rring + (uint64_t)(slot < 0 ? 0 : slot) * ep->rslot_size;
    wr.wr.rdma.rkey = ep->rkey;
    if (ibv_post_send(ep->qp, &wr, &bad) != 0) {
        return -1;
    }
    ep->sq_posted++;
    return 0;
}

static int shoal_ib_sq_room(const shoal_ep_t *ep)
{
    return ep->sq_posted - ep->sq_done < ep->sq_depth;
}

/* A zero-byte write carrying credits when enough are owed. */
static int shoal_ib_ep_credits(shoal_ep_t *ep)
{
    shoal_ib_imm_t imm = {.kind = SHOAL_IB_IMM_CREDIT};
    shoal_ib_wr_t *w;
    if (ep->rx.owed < ep->ctx->credit_thresh || !shoal_ib_sq_room(ep)) {
        return 0;
    }
    w = &ep->wrs[ep->sq_posted % ep->sq_depth];
    *w = (shoal_ib_wr_t){0};
    imm.credits = shoal_ib_ring_take_owed(&ep->rx, SHOAL_IB_CREDITS_MAX);
    if (shoal_ib_post_write(ep, NULL, 0, 1, -1, &imm) != 0) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_TRANSPORT, "peer %d: ibv_post_send (credits) "
                                 "failed: %s", ep->peer, strerror(errno));
    }
    return 0;
}

/* SHOAL_IB_REG_CACHE=1: the registration of a message's buffer, taken at its first chunk. A
 * buffer that cannot be registered is a valid one all the same (read-only memory: user
 * buffers are registered with LOCAL_WRITE, see shoal_ib_region_access; the locked memory
 * limit reached): its message goes through the bounce slots, as without the cache. */
static void shoal_ib_ep_reg_buf(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    shoal_status_t st = shoal_ib_regcache_get(&ep->rc, req->buf, req->hdr.length,
                                              &ep->cur_key, &ep->cur_lkey);
    if (st != SHOAL_OK) {
        shoal_warn_once(IB, "rank %d: SHOAL_IB_REG_CACHE=1: a %llu-byte send buffer for peer "
                        "%d cannot be registered (%s): such buffers are copied through the "
                        "bounce slots", ep->ctx->rank, (unsigned long long)req->hdr.length,
                        ep->peer, st == SHOAL_ERR_TRANSPORT ? strerror(errno)
                                                            : shoal_strerror(st));
        ep->noreg = req; /* not tried again while it waits for a bounce slot */
        return;
    }
    ep->cur_reg = 1;
}

/* Posts the next chunk of ep->sq_post; 1 if one was posted, 0 if it must wait, -1 failed. */
static int shoal_ib_ep_post_chunk(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    shoal_tl_req_t *req = ep->sq_post;
    int first = !req->hdr_done, slot;
    uint32_t sidx = ep->sq_posted % ep->sq_depth;
    uint8_t *hdr = ep->hdrs + (size_t)sidx * SHOAL_WIRE_HDR_BYTES;
    shoal_ib_chunk_src_t src;
    shoal_ib_chunk_t c;
    shoal_ib_imm_t imm = {.kind = SHOAL_IB_IMM_DATA};

    if (!shoal_ib_sq_room(ep) || ep->tx.avail == 0) {
        return 0;
    }
    if (first && ctx->reg_cache && !ep->cur_reg && ep->noreg != req && req->hdr.length > 0 &&
        req->hdr.length + SHOAL_WIRE_HDR_BYTES > ctx->max_inline) {
        shoal_ib_ep_reg_buf(ep, req);
    }
    if (first) {
        shoal_wire_encode(&req->hdr, hdr);
    }
    src = (shoal_ib_chunk_src_t){
        .slot_size = ep->chunk_size, .max_inline = ctx->max_inline, .hdr = hdr,
        .send_lkey = ep->send_mr->lkey,
        .bounce = ep->bq.avail > 0 ? ep->bounce + (size_t)ep->bq.tail * ctx->slot_size : NULL,
        .zcopy = ep->cur_reg, .buf_lkey = ep->cur_lkey,
    };
    if (shoal_ib_chunk_build(&src, req->buf, req->hdr.length, req->off, first, &c) != 0) {
        return 0; /* every bounce slot is in flight: the next send completion frees one */
    }
    slot = shoal_ib_credit_take(&ep->tx);
    if (c.src == SHOAL_IB_SRC_BOUNCE) {
        (void)shoal_ib_credit_take(&ep->bq);
    }
    imm.flags = c.flags;
    imm.slot = (uint32_t)slot;
    imm.credits = shoal_ib_ring_take_owed(&ep->rx, SHOAL_IB_CREDITS_MAX);
    ep->wrs[sidx] = (shoal_ib_wr_t){
        .req = (c.flags & SHOAL_IB_CHUNK_LAST) ? req : NULL,
        .reg_key = ep->cur_key,
        .reg_lkey = ep->cur_lkey,
        .has_reg = (c.flags & SHOAL_IB_CHUNK_LAST) && ep->cur_reg,
        .has_bounce = c.src == SHOAL_IB_SRC_BOUNCE,
    };
    if (shoal_ib_post_write(ep, c.sge, c.nsge, c.src == SHOAL_IB_SRC_INLINE, slot, &imm) != 0) {
        ep->wrs[sidx] = (shoal_ib_wr_t){0};
        return shoal_ib_ep_error(ep, SHOAL_ERR_TRANSPORT, "peer %d: ibv_post_send failed: %s",
                                 ep->peer, strerror(errno)), -1;
    }
    req->hdr_done = 1;
    req->off += c.n;
    if (c.flags & SHOAL_IB_CHUNK_LAST) {
        ep->sq_post = req->next;
        ep->cur_reg = 0;
        ep->noreg = NULL; /* a request reused for the next message tries again */
    }
    return 1;
}

/* Abort header into the next slot, best effort. */
void shoal_ib_ep_send_abort(shoal_ep_t *ep, int culprit)
{
    shoal_wire_hdr_t h = {
        .magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION, .type = SHOAL_WIRE_ABORT,
        .comm_id = ep->ctx->comm_id, .chunk = (uint32_t)culprit, .length = 0,
    };
    uint32_t sidx = ep->sq_posted % ep->sq_depth;
    uint8_t *hdr = ep->hdrs + (size_t)sidx * SHOAL_WIRE_HDR_BYTES;
    shoal_ib_sge_t sge = {.addr = (uintptr_t)hdr, .length = SHOAL_WIRE_HDR_BYTES};
    shoal_ib_imm_t imm = {.kind = SHOAL_IB_IMM_DATA,
                          .flags = SHOAL_IB_CHUNK_FIRST | SHOAL_IB_CHUNK_LAST};
    uint8_t oob[SHOAL_WIRE_HDR_BYTES];
    int slot;
    /* Also on the oob socket, which carries nothing else after the connection: the kernel
     * delivers it even when this process exits at once, and mid-message (when the ring path
     * below cannot) the peer then blames culprit, not us (tests/vm: a rank killed mid-
     * AllReduce on Soft-RoCE; without it a survivor blamed the neighbour that exited). */
    shoal_wire_encode(&h, oob);
    if (ep->oob_fd >= 0) {
        (void)send(ep->oob_fd, oob, sizeof(oob), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (ep->qp == NULL || ep->send_mr == NULL || !shoal_ib_sq_room(ep) || ep->tx.avail == 0 ||
        ep->sq_post != NULL) {
        return; /* mid-message or no room: the peer reads the notice from its oob socket */
    }
    shoal_wire_encode(&h, hdr);
    sge.lkey = ep->send_mr->lkey;
    slot = shoal_ib_credit_take(&ep->tx);
    imm.slot = (uint32_t)slot;
    ep->wrs[sidx] = (shoal_ib_wr_t){0};
    (void)shoal_ib_post_write(ep, &sge, 1, SHOAL_WIRE_HDR_BYTES <= ep->ctx->max_inline, slot,
                              &imm);
}

/* ---- completions --------------------------------------------------------------------------- */

/* A completion error of this side's own making (shoal_ib_wc_local): the peer did nothing
 * wrong, so the failure is this rank's (culprit, and in the peers' abort notices) and a
 * transport failure, not SHOAL_ERR_PEER_FAILED; an abort notice of the peer does not change
 * that. */
static int shoal_ib_ep_local_error(shoal_ep_t *ep, const struct ibv_wc *wc, const char *what)
{
    char why[192];
    if (ep->status != SHOAL_OK) {
        return 0;
    }
    snprintf(why, sizeof(why), "%s on this rank's queue pair to peer %d failed: %s (vendor "
             "error %#x), a local error: this rank's device, queue pair or registrations",
             what, ep->peer, ibv_wc_status_str(wc->status), wc->vendor_err);
    shoal_error(IB, "rank %d: %s", ep->ctx->rank, why);
    return shoal_ib_ep_fail(ep, SHOAL_ERR_TRANSPORT, ep->ctx->rank, why);
}

static int shoal_ib_wc_send(shoal_tl_ctx_t *ctx, shoal_ep_t *ep, const struct ibv_wc *wc)
{
    shoal_ib_wr_t *w = &ep->wrs[(uint32_t)wc->wr_id % ep->sq_depth];
    shoal_tl_req_t *req = w->req;
    int n = 0;
    ep->sq_done++;
    if (w->has_reg) {
        shoal_ib_regcache_put(&ep->rc, w->reg_key, w->reg_lkey);
    }
    if (w->has_bounce) {
        (void)shoal_ib_credit_grant(&ep->bq, 1); /* completions come in posting order */
    }
    *w = (shoal_ib_wr_t){0};
    if (wc->status != IBV_WC_SUCCESS && shoal_ib_wc_local((int)wc->status, 1)) {
        return shoal_ib_ep_local_error(ep, wc, "RDMA write");
    }
    if (wc->status != IBV_WC_SUCCESS) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_PEER_FAILED, "peer %d: RDMA write failed: %s "
                                 "(vendor error %#x)%s", ep->peer,
                                 ibv_wc_status_str(wc->status), wc->vendor_err,
                                 wc->status == IBV_WC_RETRY_EXC_ERR
                                     ? ": the peer is dead or unreachable" : "");
    }
    if (req != NULL && ep->status == SHOAL_OK) {
        if (req != ep->sq_head) {
            return shoal_ib_ep_error(ep, SHOAL_ERR_INTERNAL, "peer %d: send completions out "
                                     "of order", ep->peer);
        }
        ep->sq_head = req->next;
        if (ep->sq_head == NULL) {
            ep->sq_tail = NULL;
        }
        ctx->npending--;
        shoal_ib_req_complete(req, SHOAL_OK, -1, NULL);
        n = 1;
    }
    return n;
}

static int shoal_ib_wc_recv(shoal_ep_t *ep, const struct ibv_wc *wc)
{
    shoal_ib_imm_t imm;
    if (wc->status != IBV_WC_SUCCESS && shoal_ib_wc_local((int)wc->status, 0)) {
        return shoal_ib_ep_local_error(ep, wc, "receive");
    }
    if (wc->status != IBV_WC_SUCCESS) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_PEER_FAILED, "peer %d: receive failed: %s",
                                 ep->peer, ibv_wc_status_str(wc->status));
    }
    if (ep->status != SHOAL_OK) {
        return 0;
    }
    if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc->wc_flags & IBV_WC_WITH_IMM)) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_PROTOCOL, "peer %d: unexpected receive "
                                 "completion (opcode %d)", ep->peer, wc->opcode);
    }
    if (shoal_ib_post_recv(ep) != SHOAL_OK) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_TRANSPORT, "peer %d: ibv_post_recv failed",
                                 ep->peer);
    }
    shoal_ib_imm_decode(ntohl(wc->imm_data), &imm);
    if (shoal_ib_credit_grant(&ep->tx, imm.credits) != 0) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_PROTOCOL, "peer %d returned %u credits, more "
                                 "than the %u slots we used", ep->peer, imm.credits,
                                 ep->tx.nslots - ep->tx.avail);
    }
    if (imm.kind == SHOAL_IB_IMM_CREDIT) {
        return 0;
    }
    if (imm.kind != SHOAL_IB_IMM_DATA || wc->byte_len > ep->ctx->slot_size ||
        shoal_ib_ring_arrive(&ep->rx, imm.slot) != 0) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_PROTOCOL, "peer %d: write into slot %u (%u "
                                 "bytes, kind %u) not allowed by the credits we granted",
                                 ep->peer, imm.slot, wc->byte_len, imm.kind);
    }
    ep->slot_len[imm.slot] = wc->byte_len;
    ep->slot_flags[imm.slot] = (uint8_t)imm.flags;
    if ((imm.flags & SHOAL_IB_CHUNK_FIRST) && wc->byte_len >= SHOAL_WIRE_HDR_BYTES) {
        shoal_wire_hdr_t h;
        shoal_wire_decode(ep->ring + (size_t)imm.slot * ep->ctx->slot_size, &h);
        if (shoal_wire_culprit(&h) >= 0 && h.comm_id == ep->ctx->comm_id) {
            return shoal_ib_ep_abort_notice(ep, shoal_wire_culprit(&h));
        }
    }
    return 0;
}

int shoal_ib_handle_wc(shoal_tl_ctx_t *ctx, const struct ibv_wc *wc)
{
    int send = (wc->wr_id & SHOAL_IB_SEND_BIT) != 0;
    uint32_t idx = send ? (uint32_t)((wc->wr_id & ~SHOAL_IB_SEND_BIT) >> 32)
                        : (uint32_t)wc->wr_id;
    if (idx >= (uint32_t)ctx->neps) {
        shoal_warn_once(IB, "completion for an unknown endpoint %u", idx);
        return 0;
    }
    return send ? shoal_ib_wc_send(ctx, &ctx->eps[idx], wc)
                : shoal_ib_wc_recv(&ctx->eps[idx], wc);
}

/* ---- matching ------------------------------------------------------------------------------ */

/* Moves the ring's head slot into the head receive; 1 if a request completed, -1 on error. */
static int shoal_ib_ep_take_slot(shoal_ep_t *ep)
{
    shoal_tl_req_t *req = ep->rq_head;
    uint32_t slot = ep->rx.head, len = ep->slot_len[slot];
    unsigned flags = ep->slot_flags[slot];
    const uint8_t *p = ep->ring + (size_t)slot * ep->ctx->slot_size;
    char why[160];

    if (!req->hdr_done) {
        shoal_wire_hdr_t got;
        shoal_status_t st;
        if (!(flags & SHOAL_IB_CHUNK_FIRST) || len < SHOAL_WIRE_HDR_BYTES) {
            return shoal_ib_ep_error(ep, SHOAL_ERR_PROTOCOL, "peer %d: message chunk without "
                                     "a header (%u bytes)", ep->peer, len), -1;
        }
        shoal_wire_decode(p, &got);
        st = shoal_wire_check(&req->hdr, &got, why, sizeof(why));
        if (st == SHOAL_ERR_PEER_FAILED && shoal_wire_culprit(&got) >= 0) {
            return shoal_ib_ep_abort_notice(ep, shoal_wire_culprit(&got)), -1;
        }
        if (st != SHOAL_OK) {
            return shoal_ib_ep_error(ep, st, "peer %d: %s", ep->peer, why), -1;
        }
        req->hdr_done = 1;
        p += SHOAL_WIRE_HDR_BYTES;
        len -= SHOAL_WIRE_HDR_BYTES;
    } else if (flags & SHOAL_IB_CHUNK_FIRST) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_PROTOCOL, "peer %d: new message after %llu of "
                                 "%llu bytes", ep->peer, (unsigned long long)req->off,
                                 (unsigned long long)req->hdr.length), -1;
    }
    if (len > req->hdr.length - req->off ||
        ((flags & SHOAL_IB_CHUNK_LAST) != 0) != (req->off + len == req->hdr.length)) {
        return shoal_ib_ep_error(ep, SHOAL_ERR_PROTOCOL, "peer %d: chunk of %u bytes at %llu "
                                 "of a %llu-byte message (flags %u)", ep->peer, len,
                                 (unsigned long long)req->off,
                                 (unsigned long long)req->hdr.length, flags), -1;
    }
    if (len > 0) {
        memcpy((uint8_t *)req->buf + req->off, p, len);
    }
    req->off += len;
    (void)shoal_ib_ring_consume(&ep->rx);
    if (!(flags & SHOAL_IB_CHUNK_LAST)) {
        return 0;
    }
    ep->rq_head = req->next;
    if (ep->rq_head == NULL) {
        ep->rq_tail = NULL;
    }
    ep->ctx->npending--;
    shoal_ib_req_complete(req, SHOAL_OK, -1, NULL);
    return 1;
}

int shoal_ib_ep_progress(shoal_ep_t *ep)
{
    int n = 0, r;
    while (ep->status == SHOAL_OK && ep->rq_head != NULL && ep->rx.filled > 0) {
        r = shoal_ib_ep_take_slot(ep);
        if (r < 0) {
            return n;
        }
        n += r;
    }
    while (ep->status == SHOAL_OK && ep->sq_post != NULL && shoal_ib_ep_post_chunk(ep) > 0) {
    }
    if (ep->status == SHOAL_OK) {
        (void)shoal_ib_ep_credits(ep);
    }
    return n;
}

shoal_status_t shoal_ib_ep_isend(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    if (ep->status != SHOAL_OK) {
        req->culprit = ep->culprit;
        if (req->errbuf != NULL && req->errlen > 0) {
            snprintf(req->errbuf, req->errlen, "%s", ep->why); /* whom the failure blames */
        }
        return ep->status;
    }
    shoal_tl_req_start(req);
    if (ep->sq_tail != NULL) {
        ep->sq_tail->next = req;
    } else {
        ep->sq_head = req;
    }
    ep->sq_tail = req;
    if (ep->sq_post == NULL) {
        ep->sq_post = req;
    }
    ep->ctx->npending++;
    shoal_ib_lazy_want(ep);
    return SHOAL_OK;
}

shoal_status_t shoal_ib_ep_irecv(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    if (ep->status != SHOAL_OK) {
        req->culprit = ep->culprit;
        if (req->errbuf != NULL && req->errlen > 0) {
            snprintf(req->errbuf, req->errlen, "%s", ep->why); /* whom the failure blames */
        }
        return ep->status;
    }
    shoal_tl_req_start(req);
    if (ep->rq_tail != NULL) {
        ep->rq_tail->next = req;
    } else {
        ep->rq_head = req;
    }
    ep->rq_tail = req;
    ep->ctx->npending++;
    shoal_ib_lazy_want(ep);
    return SHOAL_OK;
}

/* ---- resources ----------------------------------------------------------------------------- */

/* SHOAL_IB_REG_CACHE=1: user send buffers, registered in the peer's protection domain. */
static int shoal_ib_rc_reg(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p)
{
    shoal_ep_t *ep = arg;
    struct ibv_mr *mr = ibv_reg_mr(ep->pd, addr, len,
                                   shoal_ib_region_access(SHOAL_IB_REGION_USER));
    if (mr == NULL) {
        int err = errno;
        /* not an error: the message is copied instead (shoal_ib_ep_reg_buf) */
        shoal_trace(IB, "rank %d: ibv_reg_mr(%p, %zu) for peer %d failed: %s", ep->ctx->rank,
                    addr, len, ep->peer, strerror(err));
        errno = err;
        return -1;
    }
    *handle_p = mr;
    *lkey_p = mr->lkey;
    return 0;
}

static void shoal_ib_rc_dereg(void *arg, void *handle)
{
    (void)arg;
    (void)ibv_dereg_mr(handle);
}

void shoal_ib_ep_close(shoal_ep_t *ep)
{
    shoal_ib_lazy_close(ep);
    shoal_ib_cm_close(ep); /* rdma_cm: the queue pair and its identifier */
    if (ep->qp != NULL) {
        (void)ibv_destroy_qp(ep->qp);
        ep->qp = NULL;
    }
    if (ep->oob_fd >= 0) {
        close(ep->oob_fd);
        ep->oob_fd = -1;
    }
}

/* Deregisters (so invalidates: the peer's rkey stops working) and frees the peer's protection
 * domain; its QP is gone already. */
static void shoal_ib_ep_mem_free(shoal_ep_t *ep)
{
    if (ep->rc_ready) {
        shoal_ib_regcache_fini(&ep->rc);
        ep->rc_ready = 0;
    }
    if (ep->ring_mr != NULL) {
        (void)ibv_dereg_mr(ep->ring_mr);
        ep->ring_mr = NULL;
    }
    if (ep->send_mr != NULL) {
        (void)ibv_dereg_mr(ep->send_mr);
        ep->send_mr = NULL;
    }
    if (ep->pd != NULL) {
        (void)ibv_dealloc_pd(ep->pd);
        ep->pd = NULL;
    }
}

void shoal_ib_conn_free(shoal_tl_ctx_t *ctx)
{
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ib_ep_close(&ctx->eps[i]);
        shoal_ib_ep_mem_free(&ctx->eps[i]);
    }
    if (ctx->cq != NULL) {
        (void)ibv_destroy_cq(ctx->cq);
    }
    free(ctx->ring_buf);
    free(ctx->send_buf);
    free(ctx->slot_len);
    free(ctx->slot_flags);
    free(ctx->wrs);
    free(ctx->eps);
    ctx->cq = NULL;
    ctx->ring_buf = ctx->send_buf = NULL;
    ctx->slot_len = NULL;
    ctx->slot_flags = NULL;
    ctx->wrs = NULL;
    ctx->eps = NULL;
    ctx->neps = 0;
}

/* Peer ep's protection domain and registrations: its ring (remote write, the only key it
 * gets) and its send area (local only), at their places in the layout. */
shoal_status_t shoal_ib_ep_mem(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    shoal_ib_region_t ring, send;
    shoal_ib_reg_ops_t ops = {.reg = shoal_ib_rc_reg, .dereg = shoal_ib_rc_dereg, .arg = ep};

    shoal_ib_region_get(&ctx->lay, ep->idx, SHOAL_IB_REGION_RING, &ring);
    shoal_ib_region_get(&ctx->lay, ep->idx, SHOAL_IB_REGION_SEND, &send);
    ep->ring = ctx->ring_buf + ring.off;
    ep->bounce = ctx->send_buf + send.off;
    ep->hdrs = ep->bounce + ctx->lay.hdr_off;
    if (ctx->lazy) {
        /* connect_all left the peers' parts untouched: only the peers in use get pages */
        memset(ep->ring, 0, ring.len);
        memset(ep->bounce, 0, send.len);
    }
    shoal_ib_credit_init(&ep->bq, ctx->nbounce);
    ep->pd = ibv_alloc_pd(ctx->dev);
    if (ep->pd == NULL) {
        shoal_error(IB, "rank %d: %s: ibv_alloc_pd for peer %d failed: %s", ctx->rank,
                    ctx->devname, ep->peer, strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    ep->ring_mr = ibv_reg_mr(ep->pd, ep->ring, ring.len, ring.access);
    ep->send_mr = ep->ring_mr != NULL ? ibv_reg_mr(ep->pd, ep->bounce, send.len, send.access)
                                      : NULL;
    if (ep->send_mr == NULL) {
        shoal_error(IB, "rank %d: %s: registering the %zu-byte ring or %zu-byte send area of "
                    "peer %d failed: %s (locked memory limit? ulimit -l)", ctx->rank,
                    ctx->devname, ring.len, send.len, ep->peer, strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    if (ctx->reg_cache) {
        SHOAL_CHECK(shoal_ib_regcache_init(&ep->rc, &ops, 256, ctx->reg_cache_max));
        ep->rc_ready = 1;
        if (ctx->reg_cache_max > 0) {
            shoal_ib_regcache_follow(&ep->rc); /* the hooks are in (shoal_ib_ctx_sizes) */
        }
    }
    return SHOAL_OK;
}

/* Rings, send areas and CQ for n peers, then each peer's protection domain and registrations. */
static shoal_status_t shoal_ib_conn_mem(shoal_tl_ctx_t *ctx, int n)
{
    size_t nn = (size_t)(n > 0 ? n : 1);
    uint32_t sq_depth = ctx->nslots + 8, rx_depth = 2 * ctx->nslots + 4;
    long page = sysconf(_SC_PAGESIZE);
    shoal_ib_layout_t *l = &ctx->lay;

    if (shoal_ib_layout_init(l, n, ctx->nslots, ctx->slot_size, ctx->nbounce, sq_depth,
                             page > 0 ? (size_t)page : 4096) != SHOAL_OK) {
        shoal_error(IB, "rank %d: rings of %u x %u bytes for %d peers do not fit the address "
                    "space", ctx->rank, ctx->nslots, ctx->slot_size, n);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (posix_memalign((void **)&ctx->ring_buf, l->page, l->ring_total) != 0 ||
        posix_memalign((void **)&ctx->send_buf, l->page, l->send_total) != 0 ||
        (ctx->slot_len = calloc(nn * ctx->nslots, sizeof(uint32_t))) == NULL ||
        (ctx->slot_flags = calloc(nn * ctx->nslots, 1)) == NULL ||
        (ctx->wrs = calloc(nn * sq_depth, sizeof(*ctx->wrs))) == NULL) {
        shoal_error(IB, "out of memory for the rings and send areas of %d peers (%zu + %zu "
                    "bytes)", n, l->ring_total, l->send_total);
        return SHOAL_ERR_NO_MEMORY;
    }
    if (!ctx->lazy) {
        memset(ctx->ring_buf, 0, l->ring_total); /* fault in now, not on the data path */
        memset(ctx->send_buf, 0, l->send_total);
    }
    ctx->cq = ibv_create_cq(ctx->dev, (int)(nn * (sq_depth + rx_depth) + 16), ctx, ctx->chan,
                            0);
    if (ctx->cq == NULL) {
        shoal_error(IB, "rank %d: %s: ibv_create_cq failed: %s", ctx->rank, ctx->devname,
                    strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    for (int i = 0; i < n; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        ep->sq_depth = sq_depth;
        ep->rx_depth = rx_depth;
        ep->slot_len = ctx->slot_len + (size_t)i * ctx->nslots;
        ep->slot_flags = ctx->slot_flags + (size_t)i * ctx->nslots;
        ep->wrs = ctx->wrs + (size_t)i * sq_depth;
        shoal_ib_ring_init(&ep->rx, ctx->nslots);
        if (!ctx->lazy) {
            SHOAL_CHECK(shoal_ib_ep_mem(ep)); /* lazily: when the peer connects */
        }
    }
    return SHOAL_OK;
}

void shoal_ib_ep_qp_attr(shoal_ep_t *ep, struct ibv_qp_init_attr *ia)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    *ia = (struct ibv_qp_init_attr){
        .send_cq = ctx->cq, .recv_cq = ctx->cq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = ep->sq_depth, .max_recv_wr = ep->rx_depth, .max_send_sge = 2,
                .max_recv_sge = 1, .max_inline_data = ctx->max_inline},
    };
}

shoal_status_t shoal_ib_ep_post_recvs(shoal_ep_t *ep)
{
    for (uint32_t i = 0; i < ep->rx_depth; i++) {
        if (shoal_ib_post_recv(ep) != SHOAL_OK) {
            shoal_error(IB, "rank %d: ibv_post_recv for peer %d failed", ep->ctx->rank,
                        ep->peer);
            return SHOAL_ERR_TRANSPORT;
        }
    }
    return SHOAL_OK;
}

/* The device refused a queue pair of attributes ia (errno err). With inline data asked for,
 * 1: ia without it, to try again (a device's inline limit is not in ibv_query_device, and some
 * take none: SHOAL_IB_MAX_INLINE above it failed every connection with EINVAL, naming no
 * setting). Else 0, after an error that names the attributes and their settings. */
int shoal_ib_ep_qp_retry(shoal_ep_t *ep, struct ibv_qp_init_attr *ia, const char *call, int err)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    if (ia->cap.max_inline_data > 0) {
        shoal_warn_once(IB, "rank %d: %s refused a queue pair with %u bytes of inline data "
                        "(SHOAL_IB_MAX_INLINE): %s; queue pairs go without inline data",
                        ctx->rank, call, ia->cap.max_inline_data, strerror(err));
        ia->cap.max_inline_data = 0;
        ctx->max_inline = 0;
        return 1;
    }
    shoal_error(IB, "rank %d: %s for peer %d failed: %s (%u send and %u receive work requests, "
                "from SHOAL_IB_RING_SLOTS; no inline data)", ctx->rank, call, ep->peer,
                strerror(err), ia->cap.max_send_wr, ia->cap.max_recv_wr);
    return 0;
}

/* RC QP in INIT with its receives posted. */
shoal_status_t shoal_ib_ep_qp(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    struct ibv_qp_init_attr ia;
    shoal_ib_qp_plan_t plan = {.port = ctx->addr.port,
                               .pkey_index = (int)shoal_ib_config.pkey_index};
    struct ibv_qp_attr a;
    int mask;
    uint8_t r[4];

    shoal_ib_ep_qp_attr(ep, &ia);
    while ((ep->qp = ibv_create_qp(ep->pd, &ia)) == NULL) {
        int err = errno;
        if (!shoal_ib_ep_qp_retry(ep, &ia, "ibv_create_qp", err)) {
            return SHOAL_ERR_TRANSPORT;
        }
    }
    if (ia.cap.max_inline_data < ctx->max_inline) {
        ctx->max_inline = ia.cap.max_inline_data;
    }
    shoal_trace(IB, "rank %d: ib queue pair %u created for peer %d", ctx->rank, ep->qp->qp_num,
                ep->peer);
    SHOAL_CHECK(shoal_random_bytes(r, sizeof(r)));
    ep->psn = (r[0] | (uint32_t)r[1] << 8 | (uint32_t)r[2] << 16) & 0xffffffu;
    mask = shoal_ib_qp_step(0, &plan, &a);
    if (mask < 0) {
        shoal_error(IB, "rank %d: SHOAL_IB_PKEY=%u is not a partition key table index "
                    "(0..65535)", ctx->rank, shoal_ib_config.pkey_index);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (ibv_modify_qp(ep->qp, &a, mask) != 0) {
        shoal_error(IB, "rank %d: QP to peer %d: %s failed: %s", ctx->rank, ep->peer,
                    shoal_ib_qp_step_name(0), strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    return shoal_ib_ep_post_recvs(ep);
}

/* The peer's ring from its pair info, once its queue pair is connected. */
static shoal_status_t shoal_ib_ep_remote(shoal_ep_t *ep, const shoal_ib_pair_t *rp)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    if (ep->raddr.link_layer != ctx->addr.link_layer || rp->nslots < 2 ||
        rp->nslots > SHOAL_IB_SLOTS_MAX || rp->slot_size < 4096 ||
        rp->slot_size > SHOAL_IB_SLOT_MAX + SHOAL_IB_SLOT_ROOM) {
        shoal_error(IB, "rank %d: peer %d: incompatible port (link layer %u vs ours %u) or "
                    "ring (%u slots of %u bytes)", ctx->rank, ep->peer, ep->raddr.link_layer,
                    ctx->addr.link_layer, rp->nslots, rp->slot_size);
        return SHOAL_ERR_TRANSPORT;
    }
    if (ctx->qos.rate_kbps > 0) {
        /* In RTS; devices without packet pacing refuse it (EOPNOTSUPP): one warning. */
        struct ibv_qp_rate_limit_attr rl = {.rate_limit = ctx->qos.rate_kbps};
        int err = ibv_modify_qp_rate_limit(ep->qp, &rl);
        if (err != 0) {
            shoal_warn_once(IB, "rank %d: ibv_modify_qp_rate_limit(QP to peer %d, %u kbps): "
                            "%s; no rate cap on this device (SHOAL_QOS_RATE_MAX)", ctx->rank,
                            ep->peer, ctx->qos.rate_kbps, strerror(err));
        }
    }
    ep->rring = rp->ring_addr;
    ep->rkey = rp->rkey;
    ep->rslot_size = rp->slot_size;
    ep->chunk_size = SHOAL_MIN(rp->slot_size, ctx->slot_size); /* its slots, our bounces */
    shoal_ib_credit_init(&ep->tx, rp->nslots);
    return SHOAL_OK;
}

/* INIT -> RTR -> RTS from the peer's pair info. */
shoal_status_t shoal_ib_ep_rts(shoal_ep_t *ep, const shoal_ib_pair_t *rp)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    char why[200];
    int mtu = shoal_ib_mtu_negotiate(ctx->addr.mtu, ep->raddr.mtu, shoal_ib_config.mtu, why,
                                     sizeof(why));
    shoal_ib_qp_plan_t plan = {
        .port = ctx->addr.port, .mtu = mtu, .remote_qpn = rp->qpn, .remote_psn = rp->psn,
        .local_psn = ep->psn, .is_global = ctx->addr.is_global, .sgid_index = ctx->gid.index,
        .remote_lid = ep->raddr.lid, .timeout = shoal_ib_config.timeout,
        .retry_cnt = shoal_ib_config.retry_cnt, .rnr_retry = shoal_ib_config.rnr_retry,
        .tc = ctx->qos.tc, .sl = ctx->qos.sl, .max_rd_atomic = 1,
        .pkey_index = (int)shoal_ib_config.pkey_index,
    };
    if (mtu == 0) {
        shoal_error(IB, "rank %d: peer %d: %s", ctx->rank, ep->peer, why);
        return SHOAL_ERR_TRANSPORT;
    }
    if (why[0] != '\0') {
        shoal_warn(IB, "rank %d: peer %d: %s", ctx->rank, ep->peer, why);
    }
    if (ep->raddr.link_layer != ctx->addr.link_layer) {
        return shoal_ib_ep_remote(ep, rp); /* says why */
    }
    memcpy(plan.remote_gid, ep->raddr.gid, 16);
    for (int step = 1; step <= 2; step++) {
        struct ibv_qp_attr a;
        int mask = shoal_ib_qp_step(step, &plan, &a);
        if (ibv_modify_qp(ep->qp, &a, mask) != 0) {
            shoal_error(IB, "rank %d: QP to peer %d: %s failed: %s (MTU %d, GID index %d, "
                        "TC %u, SL %u)", ctx->rank, ep->peer, shoal_ib_qp_step_name(step),
                        strerror(errno), shoal_ib_mtu_bytes(mtu), ctx->gid.index,
                        ctx->qos.tc, ctx->qos.sl);
            return SHOAL_ERR_TRANSPORT;
        }
    }
    return shoal_ib_ep_remote(ep, rp);
}

/* ---- the out-of-band exchange -------------------------------------------------------------- */

int shoal_ib_find_ep(shoal_tl_ctx_t *ctx, uint32_t rank)
{
    for (int i = 0; i < ctx->neps; i++) {
        if ((uint32_t)ctx->eps[i].peer == rank) {
            return i;
        }
    }
    return -1;
}

static int shoal_ib_expect(void *arg, uint32_t rank)
{
    shoal_tl_ctx_t *ctx = arg;
    int i = shoal_ib_find_ep(ctx, rank);
    return i >= 0 && rank > (uint32_t)ctx->rank && ctx->eps[i].oob_fd < 0;
}

/* SHOAL_IB_USE_RDMACM=1, after the authenticated handshake on ep->oob_fd: the acceptor issues
 * a token over it, the connector presents it in its rdma_cm request (ib_cm.c). */
static shoal_status_t shoal_ib_pair_cm(shoal_ep_t *ep, int connector, uint64_t deadline)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    uint8_t token[SHOAL_IB_CM_TOKEN_BYTES];
    shoal_ib_pair_t mine, theirs;
    /* this peer learns its own ring and the key of that ring's registration, nothing else */
    shoal_ib_pair_local(&ctx->lay, ctx->ring_buf, ep->idx, 0, 0, ep->ring_mr->rkey, &mine);
    if (connector) {
        SHOAL_CHECK(shoal_oob_recv(ep->oob_fd, token, sizeof(token), deadline,
                                   ctx->abort_flag));
        SHOAL_CHECK(shoal_ib_cm_connect(ep, token, &mine, &theirs, deadline));
    } else {
        SHOAL_CHECK(shoal_random_bytes(token, sizeof(token)));
        SHOAL_CHECK(shoal_oob_send(ep->oob_fd, token, sizeof(token), deadline,
                                   ctx->abort_flag));
        SHOAL_CHECK(shoal_ib_cm_accept(ep, token, &mine, &theirs, deadline));
    }
    return shoal_ib_ep_remote(ep, &theirs);
}

/* Both sides: pair info out and in, RTR/RTS (or the rdma_cm connection), sync byte out and
 * in. */
static shoal_status_t shoal_ib_pair_exchange(shoal_ep_t *ep, int connector, uint64_t deadline)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    uint8_t out[SHOAL_IB_PAIR_MSG_BYTES], in[SHOAL_IB_PAIR_MSG_BYTES], sync = 0x5a;
    shoal_ib_pair_t mine, theirs;
    if (ctx->use_cm) {
        SHOAL_CHECK(shoal_ib_pair_cm(ep, connector, deadline));
        SHOAL_CHECK(shoal_oob_send(ep->oob_fd, &sync, 1, deadline, ctx->abort_flag));
        SHOAL_CHECK(shoal_oob_recv(ep->oob_fd, &sync, 1, deadline, ctx->abort_flag));
        return sync == 0x5a ? SHOAL_OK : SHOAL_ERR_PROTOCOL;
    }
    /* this peer learns its own ring and the key of that ring's registration, nothing else */
    shoal_ib_pair_local(&ctx->lay, ctx->ring_buf, ep->idx, ep->qp->qp_num, ep->psn,
                        ep->ring_mr->rkey, &mine);
    SHOAL_CHECK(shoal_ib_pair_seal(ctx, (uint32_t)ep->peer, &mine, out));
    SHOAL_CHECK(shoal_oob_send(ep->oob_fd, out, sizeof(out), deadline, ctx->abort_flag));
    SHOAL_CHECK(shoal_oob_recv(ep->oob_fd, in, sizeof(in), deadline, ctx->abort_flag));
    if (shoal_ib_pair_open(ctx, (uint32_t)ep->peer, in, &theirs) != SHOAL_OK) {
        /* the handshake proved the key, this message does not: not the peer's queue pair */
        shoal_error(IB, "rank %d: peer %d's queue pair message does not carry the proof of the "
                    "communicator's key: refused", ctx->rank, ep->peer);
        return SHOAL_ERR_AUTH;
    }
    SHOAL_CHECK(shoal_ib_ep_rts(ep, &theirs));
    SHOAL_CHECK(shoal_oob_send(ep->oob_fd, &sync, 1, deadline, ctx->abort_flag));
    SHOAL_CHECK(shoal_oob_recv(ep->oob_fd, &sync, 1, deadline, ctx->abort_flag));
    return sync == 0x5a ? SHOAL_OK : SHOAL_ERR_PROTOCOL;
}

static shoal_status_t shoal_ib_connect_one(shoal_ep_t *ep, const shoal_oob_auth_t *auth,
                                           uint64_t deadline)
{
    char name[SHOAL_OOB_NAME_MAX];
    shoal_status_t st = shoal_oob_connect_auth(&ep->raddr.oob, auth, (uint32_t)ep->peer,
                                               deadline, &ep->oob_fd);
    if (st == SHOAL_OK) {
        st = shoal_ib_pair_exchange(ep, 1, deadline);
    }
    if (st != SHOAL_OK && st != SHOAL_ERR_ABORTED) {
        shoal_oob_addr_str(&ep->raddr.oob, name, sizeof(name));
        shoal_error(IB, "rank %d: connecting to peer %d (out of band %s) failed: %s%s",
                    ep->ctx->rank, ep->peer, name, shoal_strerror(st),
                    st == SHOAL_ERR_AUTH ? " (different job secret?)" : "");
    }
    return st;
}

static shoal_status_t shoal_ib_accept_loop(shoal_tl_ctx_t *ctx, shoal_oob_acceptor_t *acc,
                                           int nhigher, uint64_t deadline)
{
    while (nhigher > 0) {
        int fd, i;
        uint32_t peer;
        shoal_status_t st = shoal_oob_acceptor_next(acc, deadline, &peer, &fd);
        if (st == SHOAL_ERR_TIMEOUT) {
            for (int k = 0, logged = 0; k < ctx->neps && logged < 4; k++) {
                if (ctx->eps[k].peer > ctx->rank && ctx->eps[k].oob_fd < 0) {
                    shoal_error(IB, "rank %d: timed out after %d ms waiting for peer %d to "
                                "connect", ctx->rank, ctx->timeout_ms, ctx->eps[k].peer);
                    logged++;
                }
            }
        }
        if (st != SHOAL_OK) {
            return st;
        }
        i = shoal_ib_find_ep(ctx, peer);
        ctx->eps[i].oob_fd = fd;
        st = shoal_ib_pair_exchange(&ctx->eps[i], 0, deadline);
        if (st != SHOAL_OK) {
            if (st != SHOAL_ERR_ABORTED) {
                shoal_error(IB, "rank %d: queue pair exchange with peer %d failed: %s",
                            ctx->rank, peer, shoal_strerror(st));
            }
            return st;
        }
        nhigher--;
    }
    return SHOAL_OK;
}

/* Accepts until every higher peer is connected; strangers are refused and forgotten (the
 * acceptor serves several handshakes at once, see transports/common/oob.h). */
static shoal_status_t shoal_ib_accept_all(shoal_tl_ctx_t *ctx, const shoal_oob_auth_t *auth,
                                          int nhigher, uint64_t deadline)
{
    shoal_oob_acceptor_t *acc;
    shoal_status_t st = nhigher > 0 ? shoal_oob_acceptor_create(ctx->listen_fd, auth,
                                                                 shoal_ib_expect, ctx, &acc)
                                    : SHOAL_OK;
    if (st != SHOAL_OK || nhigher == 0) {
        return st;
    }
    for (int k = 0; k < ctx->neps; k++) {
        if (ctx->eps[k].peer > ctx->rank) {
            shoal_oob_acceptor_trust(acc, &ctx->eps[k].raddr.oob);
        }
    }
    st = shoal_ib_accept_loop(ctx, acc, nhigher, deadline);
    shoal_oob_acceptor_destroy(acc);
    return st;
}

static shoal_status_t shoal_ib_conn_eps(shoal_tl_ctx_t *ctx, const int *peers, int npeers,
                                        const void *const *addrs, const size_t *addr_lens)
{
    ctx->eps = calloc((size_t)(npeers > 0 ? npeers : 1), sizeof(*ctx->eps));
    if (ctx->eps == NULL) {
        shoal_error(IB, "out of memory allocating %d endpoints", npeers);
        return SHOAL_ERR_NO_MEMORY;
    }
    ctx->neps = npeers;
    /* every endpoint's sockets "none" before any address is checked: the error path closes
     * them all, and those past a bad address held calloc's 0, the application's stdin */
    for (int i = 0; i < npeers; i++) {
        ctx->eps[i].oob_fd = ctx->eps[i].lz_fd = ctx->eps[i].dial.fd = -1;
    }
    for (int i = 0; i < npeers; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        ep->ctx = ctx;
        ep->idx = i;
        ep->peer = peers[i];
        ep->status = SHOAL_OK;
        if (peers[i] == ctx->rank || (i > 0 && peers[i] <= peers[i - 1]) ||
            shoal_ib_addr_decode(addrs[i], addr_lens[i], &ep->raddr) != 0) {
            shoal_error(IB, "rank %d: bad peer list or address at index %d (peer %d)",
                        ctx->rank, i, peers[i]);
            return SHOAL_ERR_INVALID_ARG;
        }
        if ((ep->raddr.cm_port != 0) != (ctx->use_cm != 0)) {
            /* found now, not as a stalled exchange at the timeout */
            shoal_error(IB, "rank %d: SHOAL_IB_USE_RDMACM is %d here and %d on peer %d: it "
                        "must be the same on every rank", ctx->rank, ctx->use_cm,
                        ep->raddr.cm_port != 0, ep->peer);
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_ib_connect_all(shoal_tl_ctx_t *ctx, const int *peers, int npeers,
                                    const void *const *addrs, const size_t *addr_lens,
                                    shoal_ep_t **eps_p)
{
    shoal_oob_auth_t auth = {.secret = ctx->secret, .label = "shoal-ib",
                             .comm_id = ctx->comm_id, .self = (uint32_t)ctx->rank,
                             .abort_flag = ctx->abort_flag};
    uint64_t deadline = shoal_deadline_ns(ctx->timeout_ms);
    shoal_status_t st;
    int nhigher = 0;

    if (ctx->eps != NULL || ctx->listen_fd < 0) {
        shoal_error(IB, "rank %d: connect_all called twice", ctx->rank);
        return SHOAL_ERR_INVALID_ARG;
    }
    SHOAL_CHECK_GOTO(shoal_ib_conn_eps(ctx, peers, npeers, addrs, addr_lens), st, err);
    SHOAL_CHECK_GOTO(shoal_ib_conn_mem(ctx, npeers), st, err);
    if (ctx->lazy) {
        SHOAL_CHECK_GOTO(shoal_ib_lazy_start(ctx, eps_p), st, err);
        return SHOAL_OK;
    }
    for (int i = 0; i < npeers && !ctx->use_cm; i++) {
        /* with rdma_cm, the queue pair is created on its identifier when it connects */
        SHOAL_CHECK_GOTO(shoal_ib_ep_qp(&ctx->eps[i]), st, err);
    }
    for (int i = 0; i < npeers; i++) {
        if (peers[i] < ctx->rank) {
            SHOAL_CHECK_GOTO(shoal_ib_connect_one(&ctx->eps[i], &auth, deadline), st, err);
        } else {
            nhigher++;
        }
    }
    SHOAL_CHECK_GOTO(shoal_ib_accept_all(ctx, &auth, nhigher, deadline), st, err);
    for (int i = 0; i < npeers; i++) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = ctx->eps[i].oob_fd};
        (void)epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->eps[i].oob_fd, &ev);
        eps_p[i] = &ctx->eps[i];
    }
    shoal_info(IB, "rank %d: connected to %d peers over %s%s", ctx->rank, npeers, ctx->devname,
               ctx->use_cm ? " through rdma_cm" : "");
    return SHOAL_OK;
err:
    if (st == SHOAL_ERR_TIMEOUT) {
        shoal_error(IB, "rank %d: connect_all timed out after %d ms", ctx->rank,
                    ctx->timeout_ms);
    } else if (st == SHOAL_ERR_ABORTED) {
        shoal_info(IB, "rank %d: connect_all aborted", ctx->rank);
    }
    shoal_ib_conn_free(ctx);
    return st;
}
