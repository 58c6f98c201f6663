/* UCX transport: the data path of an endpoint (see ucx.h for the message layout). Every
 * shoal request owns a slot of the endpoint's ring for its direction while it is in flight;
 * slots complete strictly in posting order, requests beyond the ring wait in a queue. UCX
 * callbacks only record outcomes in slots; progress() checks headers, posts payload receives
 * and completes requests. */
#include "transports/ucx/ucx.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define SHOAL_UCX_GONE_GRACE_NS (200ull * 1000 * 1000)
/* A single-copy read that failed: how long to wait for the sender's exit to show */
#define SHOAL_UCX_CMA_EXIT_MS 100

static void shoal_ucx_req_complete(shoal_tl_req_t *req, shoal_status_t status, int culprit,
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

static void shoal_ucx_queue_push(shoal_tl_req_t **head_p, shoal_tl_req_t **tail_p,
                                 shoal_tl_req_t *req)
{
    req->next = NULL;
    if (*tail_p != NULL) {
        (*tail_p)->next = req;
    } else {
        *head_p = req;
    }
    *tail_p = req;
}

static shoal_tl_req_t *shoal_ucx_queue_pop(shoal_tl_req_t **head_p, shoal_tl_req_t **tail_p)
{
    shoal_tl_req_t *req = *head_p;
    if (req != NULL) {
        *head_p = req->next;
        if (*head_p == NULL) {
            *tail_p = NULL;
        }
        req->next = NULL;
    }
    return req;
}

/* One request of the endpoint is over. */
static void shoal_ucx_ep_retire(shoal_ep_t *ep, shoal_tl_req_t *req, shoal_status_t status,
                                const char *why)
{
    ep->npending--;
    ep->ctx->npending--;
    shoal_ucx_req_complete(req, status, status != SHOAL_OK ? ep->culprit : -1, why);
}

void shoal_ucx_ctl_encode(uint8_t out[SHOAL_UCX_CTL_BYTES], uint32_t magic, uint32_t value)
{
    shoal_put_le(out, magic, 4);
    shoal_put_le(out + 4, value, 4);
}

int shoal_ucx_ctl_decode(const uint8_t *in, size_t rlen, uint32_t magic, uint32_t *value_p)
{
    if (rlen != SHOAL_UCX_CTL_BYTES || shoal_get_le(in, 4) != magic) {
        return -1;
    }
    *value_p = (uint32_t)shoal_get_le(in + 4, 4);
    return 0;
}

/* ---- UCX callbacks: record only ------------------------------------------------------------ */

static void shoal_ucx_tx_cb(void *request, ucs_status_t st, void *user_data)
{
    shoal_ucx_slot_t *s = user_data;
    if (st != UCS_OK && s->ucs == UCS_OK) {
        s->ucs = st;
    }
    if (--s->nout == 0) {
        s->state = SHOAL_UCX_SLOT_DONE;
    }
    s->ep->ctx->nevents++;
    ucp_request_free(request);
}

/* A CMA send's FIN: the receiver has read the payload. */
static void shoal_ucx_fin_cb(void *request, ucs_status_t st, const ucp_tag_recv_info_t *info,
                             void *user_data)
{
    shoal_ucx_slot_t *s = user_data;
    uint32_t v;
    s->ucx_req = NULL;
    s->fin_wait = 0;
    if (st != UCS_OK && s->ucs == UCS_OK) {
        s->ucs = st;
    } else if (st == UCS_OK) {
        if (shoal_ucx_ctl_decode(s->fin, info->length, SHOAL_UCX_FIN_MAGIC, &v) != 0 ||
            v > 4095) {
            s->fin_err = -1;
        } else {
            s->fin_err = (int)v;
        }
    }
    if (--s->nout == 0) {
        s->state = SHOAL_UCX_SLOT_DONE;
    }
    s->ep->ctx->nevents++;
    ucp_request_free(request);
}

static void shoal_ucx_rx_cb(void *request, ucs_status_t st, const ucp_tag_recv_info_t *info,
                            void *user_data)
{
    shoal_ucx_slot_t *s = user_data;
    s->ucx_req = NULL;
    s->ucs = st;
    s->rlen = st == UCS_OK ? info->length : 0;
    s->state = s->state == SHOAL_UCX_SLOT_HDR ? SHOAL_UCX_SLOT_HDR_DONE : SHOAL_UCX_SLOT_DONE;
    s->ep->ctx->nevents++;
    ucp_request_free(request);
}

/* ---- early messages: held ones (see ucx.h) --------------------------------------------------- */

/* Receives a message taken out of UCX's queue into the scratch buffer and forgets it: a
 * message taken out must be received, else UCX keeps its descriptor until the worker's
 * destruction, and the sender of one above the rendezvous threshold waits for an answer (a
 * longer one is truncated, UCX answers the sender all the same). */
static void shoal_ucx_msg_discard(shoal_tl_ctx_t *ctx, ucp_tag_message_h msg)
{
    ucp_request_param_t p = {.op_attr_mask = 0};
    void *r = ucp_tag_msg_recv_nbx(ctx->worker, ctx->discard, sizeof(ctx->discard), msg, &p);
    if (UCS_PTR_IS_PTR(r)) {
        ucp_request_free(r); /* UCX frees it when done */
    }
}

/* The oldest early message of kind held for ep's peer, or NULL; give the entry back with
 * shoal_ucx_unexp_put. */
static shoal_ucx_unexp_t *shoal_ucx_unexp_pop(shoal_ep_t *ep, int kind)
{
    shoal_ucx_unexp_t *u = ep->uq_head[kind];
    if (u != NULL) {
        ep->uq_head[kind] = u->next;
        if (u->next == NULL) {
            ep->uq_tail[kind] = NULL;
        }
        ep->nunexp--;
        ep->ctx->nunexp--;
    }
    return u;
}

static void shoal_ucx_unexp_put(shoal_tl_ctx_t *ctx, shoal_ucx_unexp_t *u)
{
    u->next = ctx->unexp_free;
    ctx->unexp_free = u;
}

void *shoal_ucx_tag_recv(shoal_ep_t *ep, void *buf, size_t count, shoal_ucx_kind_t kind,
                         const ucp_request_param_t *p)
{
    shoal_ucx_unexp_t *u = ep->uq_head[kind] != NULL ? shoal_ucx_unexp_pop(ep, kind) : NULL;
    if (u != NULL) {
        /* older than anything of that tag still in UCX's queues: taken first */
        ucp_tag_message_h msg = u->msg;
        shoal_ucx_unexp_put(ep->ctx, u);
        return ucp_tag_msg_recv_nbx(ep->ctx->worker, buf, count, msg, p);
    }
    return ucp_tag_recv_nbx(ep->ctx->worker, buf, count, shoal_ucx_tag(ep->rx_tag, kind),
                            (ucp_tag_t)-1, p);
}

void shoal_ucx_unexp_release(shoal_ep_t *ep)
{
    for (int k = 0; k < 4; k++) {
        shoal_ucx_unexp_t *u;
        while ((u = shoal_ucx_unexp_pop(ep, k)) != NULL) {
            shoal_ucx_msg_discard(ep->ctx, u->msg);
            shoal_ucx_unexp_put(ep->ctx, u);
        }
    }
}

/* ---- posting -------------------------------------------------------------------------------- */

static void shoal_ucx_send(shoal_ep_t *ep, shoal_ucx_slot_t *s, const void *buf, size_t len,
                           shoal_ucx_kind_t kind)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = shoal_ucx_tx_cb,
        .user_data = s,
    };
    void *r;
    if (ep->fast_cmpl) {
        p.op_attr_mask |= UCP_OP_ATTR_FLAG_FAST_CMPL; /* see SHOAL_UCX_FAST_CMPL */
    }
    if (buf == s->iov) { /* len is then the iov's 2 entries (shoal_ucx_slot_iov) */
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        p.datatype = ucp_dt_make_iov();
    }
    r = ucp_tag_send_nbx(ep->uep, buf, len, shoal_ucx_tag(ep->tx_tag, kind), &p);
    if (UCS_PTR_IS_ERR(r)) {
        if (s->ucs == UCS_OK) {
            s->ucs = UCS_PTR_STATUS(r);
        }
    } else if (r != NULL) {
        s->nout++;
    }
}

/* Posts the receive of a CMA send's FIN (FINs come in the order of the sends). */
static void shoal_ucx_fin_recv(shoal_ep_t *ep, shoal_ucx_slot_t *s)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = shoal_ucx_fin_cb,
        .user_data = s,
    };
    void *r;

    s->nout++; /* the callback may run within ucp_tag_recv_nbx */
    s->fin_wait = 1;
    r = shoal_ucx_tag_recv(ep, s->fin, sizeof(s->fin), SHOAL_UCX_TAG_AUTH, &p);
    if (UCS_PTR_IS_ERR(r)) {
        s->nout--;
        s->fin_wait = 0;
        if (s->ucs == UCS_OK) {
            s->ucs = UCS_PTR_STATUS(r);
        }
    } else if (s->fin_wait) {
        s->ucx_req = r; /* else the callback ran already and released it */
    }
}

/* A payload of len bytes above the inline limit may travel in one message with its header,
 * and every receive of one is posted for that (an iov: the header into the slot, the payload
 * into the caller's buffer). The receiver tells the three kinds of message apart by their
 * length: the header alone (the payload follows as DATA), the header and a single-copy
 * descriptor (which lands in the caller's buffer), the header and the payload. So the
 * caller's buffer must be longer than a descriptor; shorter payloads go as DATA. */
static int shoal_ucx_whole_len(const shoal_ep_t *ep, uint64_t len)
{
    return len > ep->inline_max && len > SHOAL_UCX_CMA_DESC_BYTES;
}

/* The slot's iov: its header buffer, then len bytes at buf (the caller's). */
static ucp_dt_iov_t *shoal_ucx_slot_iov(shoal_ucx_slot_t *s, void *buf, size_t len)
{
    s->iov[0] = (ucp_dt_iov_t){.buffer = s->buf, .length = SHOAL_WIRE_HDR_BYTES};
    s->iov[1] = (ucp_dt_iov_t){.buffer = buf, .length = len};
    return s->iov;
}

static void shoal_ucx_tx_start(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    shoal_ucx_slot_t *s = &ep->tx[(ep->tx_head + ep->tx_count) % SHOAL_UCX_SLOTS];
    uint64_t len = req->hdr.length;

    ep->ctx->dirty = 1; /* it may be done at once, without a callback */
    ep->tx_count++;
    s->req = req;
    s->nout = 0;
    s->ucs = UCS_OK;
    s->state = SHOAL_UCX_SLOT_DATA;
    s->fin_err = 0;
    s->cancelled = 0;
    s->ucx_req = NULL;
    if (len <= ep->inline_max) {
        shoal_put_le(s->buf, req->hdr.seq, 4);
        shoal_put_le(s->buf + 4, req->hdr.step, 4);
        shoal_put_le(s->buf + 8, req->hdr.chunk, 4);
        if (len > 0) {
            memcpy(s->buf + SHOAL_UCX_SHORT_HDR_BYTES, req->buf, len);
        }
        shoal_ucx_send(ep, s, s->buf, SHOAL_UCX_SHORT_HDR_BYTES + len, SHOAL_UCX_TAG_HDR);
        goto sent;
    }
    shoal_wire_encode(&req->hdr, s->buf);
    if (ep->cma_tx && len >= ep->ctx->cma_min) {
        /* single copy: the receiver reads req->buf, then sends a FIN */
        uint8_t *d = s->buf + SHOAL_WIRE_HDR_BYTES;
        shoal_put_le(d, SHOAL_UCX_CMA_MAGIC, 4);
        shoal_put_le(d + 4, 0, 4);
        shoal_put_le(d + 8, (uint64_t)(uintptr_t)req->buf, 8);
        shoal_ucx_send(ep, s, s->buf, SHOAL_WIRE_HDR_BYTES + SHOAL_UCX_CMA_DESC_BYTES,
                       SHOAL_UCX_TAG_HDR);
        if (s->ucs == UCS_OK) {
            shoal_ucx_fin_recv(ep, s);
        }
    } else if (ep->fast_cmpl && shoal_ucx_whole_len(ep, len)) {
        /* one message, gathered from the header and the caller's buffer (see below) */
        shoal_ucx_send(ep, s, shoal_ucx_slot_iov(s, req->buf, len), 2, SHOAL_UCX_TAG_HDR);
    } else {
        shoal_ucx_send(ep, s, s->buf, SHOAL_WIRE_HDR_BYTES, SHOAL_UCX_TAG_HDR);
        if (s->ucs == UCS_OK) {
            shoal_ucx_send(ep, s, req->buf, len, SHOAL_UCX_TAG_DATA);
        }
    }
sent:
    if (s->nout == 0) {
        s->state = SHOAL_UCX_SLOT_DONE;
    }
}

/* Posts a receive of kind into buf for slot s (state HDR or DATA set by the caller). UCX
 * 1.13 does not fill recv_info on immediate completion, so immediate completion is denied:
 * the callback then reports the length, possibly from within ucp_tag_recv_nbx itself (the
 * state has moved on then, and the request is already released). */
static void shoal_ucx_recv(shoal_ep_t *ep, shoal_ucx_slot_t *s, void *buf, size_t len,
                           shoal_ucx_kind_t kind)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = shoal_ucx_rx_cb,
        .user_data = s,
    };
    int posted = s->state;
    void *r;

    s->ucx_req = NULL;
    s->cancelled = 0;
    s->ucs = UCS_OK;
    if (buf == s->iov) { /* len is then the iov's 2 entries (shoal_ucx_slot_iov) */
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        p.datatype = ucp_dt_make_iov();
    }
    r = shoal_ucx_tag_recv(ep, buf, len, kind, &p);
    if (UCS_PTR_IS_ERR(r)) {
        s->ucs = UCS_PTR_STATUS(r);
        s->rlen = 0;
        s->state = posted == SHOAL_UCX_SLOT_HDR ? SHOAL_UCX_SLOT_HDR_DONE : SHOAL_UCX_SLOT_DONE;
    } else if (r != NULL && s->state == posted) {
        s->ucx_req = r;
    }
}

static void shoal_ucx_rx_start(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    shoal_ucx_slot_t *s = &ep->rx[(ep->rx_head + ep->rx_count) % SHOAL_UCX_SLOTS];
    ep->ctx->dirty = 1;
    ep->rx_count++;
    s->req = req;
    s->state = SHOAL_UCX_SLOT_HDR;
    s->whole = shoal_ucx_whole_len(ep, req->hdr.length);
    if (s->whole) {
        shoal_ucx_recv(ep, s, shoal_ucx_slot_iov(s, req->buf, req->hdr.length), 2,
                       SHOAL_UCX_TAG_HDR);
        return;
    }
    shoal_ucx_recv(ep, s, s->buf, ep->ctx->slot_bytes, SHOAL_UCX_TAG_HDR);
}

static shoal_status_t shoal_ucx_ep_post_check(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    if (ep->status != SHOAL_OK) {
        if (req->errbuf != NULL && req->errlen > 0) {
            snprintf(req->errbuf, req->errlen, "%s", ep->why);
        }
        req->culprit = ep->culprit;
        return ep->status;
    }
    if (req->buf == NULL && req->hdr.length > 0) {
        shoal_error(UCX, "peer %d: request of %llu bytes without a buffer", ep->peer,
                    (unsigned long long)req->hdr.length);
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_tl_req_start(req);
    return SHOAL_OK;
}

shoal_status_t shoal_ucx_ep_isend(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    shoal_status_t st = shoal_ucx_ep_post_check(ep, req);
    if (st != SHOAL_OK) {
        return st;
    }
    ep->npending++;
    ep->ctx->npending++;
    ep->ctx->dirty = 1;
    if (SHOAL_UNLIKELY(ep->lazy_state != SHOAL_UCX_LAZY_UP)) {
        /* not authenticated yet: waits, in order, until it is (or the endpoint fails) */
        shoal_ucx_queue_push(&ep->sq_head, &ep->sq_tail, req);
        shoal_ucx_lazy_want(ep);
        return SHOAL_OK;
    }
    if (ep->gone || ep->uep == NULL) {
        /* Nothing can reach the peer any more: the send waits, unsent, for the endpoint to
         * fail (after the grace period, or at once with the cause an abort notice gives). */
        shoal_ucx_queue_push(&ep->sq_head, &ep->sq_tail, req);
        ep->post_failed = ep->uep == NULL && !ep->gone;
        shoal_ucx_kick(ep->ctx);
        return SHOAL_OK;
    }
    if (ep->tx_count < SHOAL_UCX_SLOTS && ep->sq_head == NULL) {
        shoal_ucx_tx_start(ep, req);
    } else {
        shoal_ucx_queue_push(&ep->sq_head, &ep->sq_tail, req);
    }
    return SHOAL_OK;
}

shoal_status_t shoal_ucx_ep_irecv(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    shoal_status_t st = shoal_ucx_ep_post_check(ep, req);
    if (st != SHOAL_OK) {
        return st;
    }
    /* Posted even on a gone endpoint: UCX may hold the message already. */
    ep->npending++;
    ep->ctx->npending++;
    ep->ctx->dirty = 1;
    if (SHOAL_UNLIKELY(ep->lazy_state != SHOAL_UCX_LAZY_UP)) {
        /* nothing from a peer is received before its proof was checked */
        shoal_ucx_queue_push(&ep->rq_head, &ep->rq_tail, req);
        shoal_ucx_lazy_want(ep);
        return SHOAL_OK;
    }
    if (ep->rx_count < SHOAL_UCX_SLOTS && ep->rq_head == NULL) {
        shoal_ucx_rx_start(ep, req);
    } else {
        shoal_ucx_queue_push(&ep->rq_head, &ep->rq_tail, req);
    }
    return SHOAL_OK;
}

/* ---- failure --------------------------------------------------------------------------------- */

void shoal_ucx_ep_close(shoal_ep_t *ep, int force)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    void *r;
    if (ep->uep == NULL) {
        return;
    }
    r = ucp_ep_close_nbx(ep->uep, &p);
    ep->uep = NULL;
    if (UCS_PTR_IS_PTR(r)) {
        ep->close_req = r;
    }
}

/* Cancels the endpoint's outstanding receives, payloads and FINs (UCX completes them with
 * UCS_ERR_CANCELED; a receive already matched is not affected and completes or fails on its
 * own). */
void shoal_ucx_ep_cancel_reqs(shoal_ep_t *ep)
{
    for (int i = 0; i < ep->rx_count + ep->tx_count; i++) {
        shoal_ucx_slot_t *s = i < ep->rx_count ?
                              &ep->rx[(ep->rx_head + i) % SHOAL_UCX_SLOTS] :
                              &ep->tx[(ep->tx_head + i - ep->rx_count) % SHOAL_UCX_SLOTS];
        if (s->ucx_req != NULL && !s->cancelled) {
            s->cancelled = 1;
            ucp_request_cancel(ep->ctx->worker, s->ucx_req);
        }
    }
}

static int shoal_ucx_ep_fail_slots(shoal_ep_t *ep, shoal_ucx_slot_t *ring, int head, int count,
                                   shoal_status_t status)
{
    int n = 0;
    for (int i = 0; i < count; i++) {
        shoal_ucx_slot_t *s = &ring[(head + i) % SHOAL_UCX_SLOTS];
        if (s->req != NULL) {
            shoal_ucx_ep_retire(ep, s->req, status, ep->why);
            s->req = NULL;
            n++;
        }
    }
    return n;
}

int shoal_ucx_ep_fail(shoal_ep_t *ep, shoal_status_t status, int culprit, const char *why)
{
    shoal_tl_req_t *req;
    int n;
    if (ep->status != SHOAL_OK) {
        return 0;
    }
    ep->status = status;
    ep->culprit = culprit;
    if (why != ep->why) {
        snprintf(ep->why, sizeof(ep->why), "%s", why);
    }
    /* Stop UCX from touching the callers' buffers: purge sends, cancel receives. The slots
     * stay owned by UCX until their callbacks; a failed endpoint never reuses them. */
    shoal_ucx_ep_close(ep, 1);
    shoal_ucx_ep_cancel_reqs(ep);
    shoal_ucx_unexp_release(ep); /* nothing will receive them now */
    for (int i = 0; i < ep->rx_count && !ep->ctx->quarantined; i++) {
        shoal_ucx_slot_t *s = &ep->rx[(ep->rx_head + i) % SHOAL_UCX_SLOTS];
        /* A receive into the caller's buffer that the cancel did not end (its callback runs
         * at once for one still waiting to be matched) is matched, and UCX may still write. */
        if (s->ucx_req != NULL &&
            (s->state == SHOAL_UCX_SLOT_DATA || (s->state == SHOAL_UCX_SLOT_HDR && s->whole))) {
            shoal_warn(UCX, "peer %d: a matched %llu-byte receive cannot be cancelled: "
                       "the ucx context stops progressing", ep->peer,
                       s->req != NULL ? (unsigned long long)s->req->hdr.length : 0ull);
            ep->ctx->quarantined = 1;
        }
    }
    n = shoal_ucx_ep_fail_slots(ep, ep->tx, ep->tx_head, ep->tx_count, status);
    n += shoal_ucx_ep_fail_slots(ep, ep->rx, ep->rx_head, ep->rx_count, status);
    while ((req = shoal_ucx_queue_pop(&ep->sq_head, &ep->sq_tail)) != NULL) {
        shoal_ucx_ep_retire(ep, req, status, ep->why);
        n++;
    }
    while ((req = shoal_ucx_queue_pop(&ep->rq_head, &ep->rq_tail)) != NULL) {
        shoal_ucx_ep_retire(ep, req, status, ep->why);
        n++;
    }
    return n;
}

/* The peer sent what this rank refuses (a protocol error): tell it with an abort notice that
 * blames it, before the endpoint closes. Else nothing would: the communicator's fail() sends
 * notices only over endpoints still open, so a sender whose message was refused, waiting for
 * an answer that no longer comes (the odd rank of recursive doubling's fold), waited for its
 * own timeout (tests/mp/mp_coll_misc.c, mismatch: 30 s, now milliseconds). Best effort, at
 * most SHOAL_UCX_NOTICE_MS (shoal_ucx_notices_deliver). */
static void shoal_ucx_ep_notify_refused(shoal_ep_t *ep)
{
    if (ep->ctx->quarantined) {
        return;
    }
    shoal_ucx_ep_send_abort(ep, ep->peer);
    shoal_ucx_notices_deliver(ep->ctx, ep);
}

/* Detected here: log once with the peer, then fail the endpoint. */
static int shoal_ucx_ep_error(shoal_ep_t *ep, shoal_status_t status, int culprit,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int shoal_ucx_ep_error(shoal_ep_t *ep, shoal_status_t status, int culprit,
                              const char *fmt, ...)
{
    char why[192];
    va_list ap;
    if (ep->status != SHOAL_OK) {
        return 0;
    }
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    shoal_error(UCX, "%s", why);
    if (status == SHOAL_ERR_PROTOCOL) {
        shoal_ucx_ep_notify_refused(ep);
    }
    return shoal_ucx_ep_fail(ep, status, culprit, why);
}

/* A transfer of the endpoint ended with UCX status st. */
static int shoal_ucx_ep_ucs_error(shoal_ep_t *ep, const char *what, ucs_status_t st)
{
    int n = 0;
    if (!ep->gone && st != UCS_ERR_CANCELED && st != UCS_ERR_MESSAGE_TRUNCATED &&
        !ep->ctx->quarantined) {
        /* A transfer that fails by itself is often the first sign that the peer left: a send
         * to a same-host peer whose process exited can fail at once (UCX: "Shared memory
         * error", where it needs a segment of the peer's that is gone), before the liveness
         * check or UCX's error callback sees the exit. The exit, or the abort notice the
         * peer sent before it left, says what happened (else: SHOAL_ERR_TRANSPORT, blaming
         * nobody). */
        if (ep->local && shoal_ucx_ep_peer_exited(ep)) {
            shoal_ucx_ep_set_exited(ep, shoal_time_ns());
        } else {
            shoal_ucx_drain(ep->ctx);
            if (shoal_ucx_ep_probe_abort(ep, &n)) {
                return n;
            }
        }
    }
    if (ep->gone || st == UCS_ERR_CANCELED) {
        /* the peer is gone (the cause was logged when that was detected) */
        return shoal_ucx_ep_fail_gone(ep);
    }
    if (st == UCS_ERR_MESSAGE_TRUNCATED) {
        return shoal_ucx_ep_error(ep, SHOAL_ERR_PROTOCOL, -1,
                                  "peer %d: %s: message longer than the posted receive",
                                  ep->peer, what);
    }
    if (st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT ||
        st == UCS_ERR_UNREACHABLE || st == UCS_ERR_REJECTED) {
        return shoal_ucx_ep_error(ep, SHOAL_ERR_PEER_FAILED, -1, "peer %d: %s: %s", ep->peer, what,
                                  shoal_ucx_strerror(st));
    }
    return shoal_ucx_ep_error(ep, SHOAL_ERR_TRANSPORT, -1, "peer %d: %s failed: %s", ep->peer, what,
                              shoal_ucx_strerror(st));
}

void shoal_ucx_ep_set_gone(shoal_ep_t *ep, const char *why)
{
    if (ep->gone || ep->status != SHOAL_OK) {
        return;
    }
    ep->gone = 1;
    ep->gone_fresh = 1;
    ep->gone_ns = shoal_time_ns();
    snprintf(ep->why, sizeof(ep->why), "%s", why);
    if (ep->ctx->first_gone < 0) {
        ep->ctx->first_gone = ep->peer;
        ep->ctx->first_gone_ns = ep->gone_ns;
    }
    shoal_ucx_kick(ep->ctx);
}

int shoal_ucx_ep_probe_abort(shoal_ep_t *ep, int *n_p)
{
    ucp_worker_h worker = ep->ctx->worker;
    ucp_request_param_t p = {.op_attr_mask = 0};
    shoal_wire_hdr_t expect = {.comm_id = ep->ctx->comm_id, .type = SHOAL_WIRE_DATA}, got;
    ucp_tag_recv_info_t info;
    shoal_ucx_unexp_t *u = shoal_ucx_unexp_pop(ep, SHOAL_UCX_TAG_ABORT);
    ucp_tag_message_h msg;
    shoal_status_t st;
    char why[160];
    int culprit = -1;
    void *r;

    if (u != NULL) { /* taken out of UCX's queue already (shoal_ucx_unexp_drain) */
        msg = u->msg;
        info.length = u->len;
        shoal_ucx_unexp_put(ep->ctx, u);
    } else {
        msg = ucp_tag_probe_nb(worker, shoal_ucx_tag(ep->rx_tag, SHOAL_UCX_TAG_ABORT),
                               (ucp_tag_t)-1, 1, &info);
    }
    if (msg == NULL) {
        return 0;
    }
    memset(ep->abort_rx, 0, sizeof(ep->abort_rx));
    /* Received whatever its length (a longer one is truncated): a probed message that was
     * removed must be received, else UCX keeps its descriptor until the worker's destruction
     * ("not returned to mpool"), and the sender of one above the rendezvous threshold waits
     * for an answer that never comes. */
    r = ucp_tag_msg_recv_nbx(worker, ep->abort_rx, sizeof(ep->abort_rx), msg, &p);
    for (int i = 0; UCS_PTR_IS_PTR(r) && i < 1000 &&
                    ucp_request_check_status(r) == UCS_INPROGRESS; i++) {
        ucp_worker_progress(worker); /* 32 bytes that have arrived: at once in practice */
    }
    if (UCS_PTR_IS_PTR(r)) {
        ucp_request_free(r);
    }
    shoal_wire_decode(ep->abort_rx, &got);
    st = shoal_wire_check(&expect, &got, why, sizeof(why));
    if (st == SHOAL_OK || got.type != SHOAL_WIRE_ABORT || info.length != sizeof(ep->abort_rx)) {
        st = SHOAL_ERR_PROTOCOL;
        snprintf(why, sizeof(why), "malformed abort notice of %zu bytes", info.length);
    } else if (shoal_wire_culprit(&got) < ep->ctx->nranks) {
        culprit = shoal_wire_culprit(&got);
        if (ep->ctx->notice_culprit < 0) {
            ep->ctx->notice_culprit = culprit;
        }
    }
    *n_p += shoal_ucx_ep_error(ep, st, culprit, "peer %d: %s", ep->peer, why);
    return 1;
}

/* Fails a gone endpoint; when this rank saw another rank fail first (a notice naming it, or an
 * earlier death), the cause names that rank too. An abort notice the peer sent before it went
 * decides instead: it may still sit in our FIFO, under the arrival that showed the peer gone
 * (a single-copy read that found the sender exited: run_kill.sh's survivors named the rank
 * that exited after telling them whom to blame). */
int shoal_ucx_ep_fail_gone(shoal_ep_t *ep)
{
    const shoal_tl_ctx_t *ctx = ep->ctx;
    char why[sizeof(ep->why)];
    int first, n = 0;

    if (!ctx->quarantined) { /* a quarantined worker is never progressed again */
        shoal_ucx_drain(ep->ctx);
        if (shoal_ucx_ep_probe_abort(ep, &n)) {
            return n;
        }
    }
    first = ctx->notice_culprit;
    /* a death seen in an earlier liveness check than this one's (same check: no order) */
    if (first < 0 && ctx->first_gone >= 0 && ctx->first_gone_ns < ep->gone_ns) {
        first = ctx->first_gone;
    }
    if (first < 0 || first == ep->peer) {
        return shoal_ucx_ep_fail(ep, SHOAL_ERR_PEER_FAILED, first,
                                 ep->why[0] != '\0' ? ep->why : "peer failed");
    }
    snprintf(why, sizeof(why), "%.100s, after the communicator failed because of rank %d",
             ep->why[0] != '\0' ? ep->why : "peer failed", first);
    return shoal_ucx_ep_fail(ep, SHOAL_ERR_PEER_FAILED, first, why);
}

/* The peer is unreachable: close the endpoint (purges sends), cancel receives that UCX has
 * not matched to an arrived message, fail what is left after a grace period. */
static int shoal_ucx_ep_progress_gone(shoal_ep_t *ep)
{
    int n = 0;
    ep->gone_fresh = 0;
    if (shoal_ucx_ep_probe_abort(ep, &n)) {
        return n;
    }
    shoal_ucx_ep_close(ep, 1);
    shoal_ucx_ep_cancel_reqs(ep);
    if (ep->post_failed || (ep->npending > 0 &&
                            shoal_time_ns() - ep->gone_ns > SHOAL_UCX_GONE_GRACE_NS)) {
        return shoal_ucx_ep_fail_gone(ep);
    }
    return 0;
}

/* ---- progress -------------------------------------------------------------------------------- */

static int shoal_ucx_ep_progress_tx(shoal_ep_t *ep)
{
    int n = 0;
    shoal_tl_req_t *req;
    while (ep->tx_count > 0) {
        shoal_ucx_slot_t *s = &ep->tx[ep->tx_head];
        if (s->state != SHOAL_UCX_SLOT_DONE) {
            break;
        }
        if (s->ucs != UCS_OK) {
            return n + shoal_ucx_ep_ucs_error(ep, "send", s->ucs);
        }
        if (s->fin_err != 0) {
            return n + shoal_ucx_ep_error(ep, SHOAL_ERR_PROTOCOL, -1, "peer %d %s%s", ep->peer,
                                          s->fin_err < 0 ? "sent a malformed FIN" :
                                          "could not read the payload of a single-copy send: ",
                                          s->fin_err < 0 ? "" : strerror(s->fin_err));
        }
        req = s->req;
        s->req = NULL;
        s->state = SHOAL_UCX_SLOT_FREE;
        ep->tx_head = (ep->tx_head + 1) % SHOAL_UCX_SLOTS;
        ep->tx_count--;
        shoal_ucx_ep_retire(ep, req, SHOAL_OK, NULL);
        n++;
    }
    /* Nothing more is sent to a peer that is gone, as in isend: its queued sends wait for the
     * endpoint to fail. Once progress_gone has closed the endpoint (uep NULL), a send started
     * here crashed in UCX (SIGSEGV), after the ring's last sends completed. */
    while (ep->tx_count < SHOAL_UCX_SLOTS && ep->sq_head != NULL && !ep->gone &&
           ep->uep != NULL) {
        shoal_ucx_tx_start(ep, shoal_ucx_queue_pop(&ep->sq_head, &ep->sq_tail));
    }
    return n;
}

shoal_status_t shoal_ucx_hdr_check(const shoal_wire_hdr_t *expect, const uint8_t *buf,
                                   size_t rlen, size_t inline_max, int cma_ok,
                                   uint64_t *cma_addr_p, char *why, size_t whylen,
                                   int *culprit_p)
{
    uint64_t len = expect->length;
    shoal_wire_hdr_t got;
    shoal_status_t st;

    *culprit_p = -1;
    *cma_addr_p = 0;
    if (len <= inline_max) {
        uint32_t seq, step, chunk;
        if (rlen != SHOAL_UCX_SHORT_HDR_BYTES + len) {
            snprintf(why, whylen, "%zu bytes carry a %llu-byte message (%d-byte header)", rlen,
                     (unsigned long long)len, SHOAL_UCX_SHORT_HDR_BYTES);
            return SHOAL_ERR_PROTOCOL;
        }
        seq = (uint32_t)shoal_get_le(buf, 4);
        step = (uint32_t)shoal_get_le(buf + 4, 4);
        chunk = (uint32_t)shoal_get_le(buf + 8, 4);
        if (seq != expect->seq || step != expect->step || chunk != expect->chunk) {
            snprintf(why, whylen, "message (seq %u, step %u, chunk %u), expected (seq %u, "
                     "step %u, chunk %u)", seq, step, chunk, expect->seq, expect->step,
                     expect->chunk);
            return SHOAL_ERR_PROTOCOL;
        }
        return SHOAL_OK;
    }
    if (rlen < SHOAL_WIRE_HDR_BYTES) {
        snprintf(why, whylen, "%zu-byte message, shorter than a header", rlen);
        return SHOAL_ERR_PROTOCOL;
    }
    shoal_wire_decode(buf, &got);
    st = shoal_wire_check(expect, &got, why, whylen);
    if (st != SHOAL_OK) {
        *culprit_p = shoal_wire_culprit(&got); /* an abort notice names who failed first */
        return st;
    }
    if (cma_ok && rlen == SHOAL_WIRE_HDR_BYTES + SHOAL_UCX_CMA_DESC_BYTES) {
        const uint8_t *d = buf + SHOAL_WIRE_HDR_BYTES;
        uint64_t addr = shoal_get_le(d + 8, 8);
        if (shoal_get_le(d, 4) != SHOAL_UCX_CMA_MAGIC || shoal_get_le(d + 4, 4) != 0 ||
            addr == 0 || addr + len < addr) {
            snprintf(why, whylen, "malformed single-copy descriptor for a %llu-byte message",
                     (unsigned long long)len);
            return SHOAL_ERR_PROTOCOL;
        }
        *cma_addr_p = addr;
        return SHOAL_OK;
    }
    if (rlen != SHOAL_WIRE_HDR_BYTES) {
        snprintf(why, whylen, "%zu bytes carry the header of a %llu-byte message", rlen,
                 (unsigned long long)len);
        return SHOAL_ERR_PROTOCOL;
    }
    return SHOAL_OK;
}

/* A single-copy read failed (not ESRCH): a sender that failed its communicator and returned,
 * or is exiting, no longer has the buffer (EFAULT while its address space is torn down),
 * which is its failure, not a protocol error. 1 (the endpoint failed, completions in *n_p)
 * when its abort notice is there or its process exits within SHOAL_UCX_CMA_EXIT_MS. */
static int shoal_ucx_ep_cma_sender_left(shoal_ep_t *ep, int *n_p)
{
    uint64_t deadline = shoal_deadline_ns(SHOAL_UCX_CMA_EXIT_MS);
    int exited = 0;
    char why[96];

    do {
        (void)ucp_worker_progress(ep->ctx->worker);
        if (shoal_ucx_ep_probe_abort(ep, n_p)) {
            return 1;
        }
        if (ep->pidfd >= 0) {
            struct pollfd pfd = {.fd = ep->pidfd, .events = POLLIN};
            exited = poll(&pfd, 1, 1) > 0;
        } else {
            exited = kill((pid_t)ep->pid, 0) != 0 && errno == ESRCH;
            if (!exited) {
                shoal_sleep_us(1000);
            }
        }
    } while (!exited && !shoal_deadline_passed(deadline));
    if (!exited) {
        return 0;
    }
    snprintf(why, sizeof(why), "peer %d (pid %u) exited", ep->peer, ep->pid);
    shoal_ucx_ep_set_gone(ep, why);
    *n_p += shoal_ucx_ep_fail_gone(ep);
    return 1;
}

/* A single-copy payload: reads it from the sender's buffer at addr into the posted one, then
 * sends the FIN (the slot is done when UCX has taken it). Returns the completions of a
 * failure, with *failed_p set. */
static int shoal_ucx_ep_cma_read(shoal_ep_t *ep, shoal_ucx_slot_t *s, uint64_t addr,
                                 int *failed_p)
{
    shoal_tl_req_t *req = s->req;
    size_t len = req->hdr.length, done = 0;
    int n = 0;

    s->nout = 0;
    s->ucs = UCS_OK;
    while (done < len) {
        struct iovec l = {.iov_base = (uint8_t *)req->buf + done, .iov_len = len - done};
        struct iovec r = {.iov_base = (void *)(uintptr_t)(addr + done), .iov_len = len - done};
        ssize_t got = process_vm_readv((pid_t)ep->pid, &l, 1, &r, 1, 0);
        if (got > 0) {
            done += (size_t)got;
        } else if (got < 0 && errno == EINTR) {
            continue;
        } else if (got < 0 && errno == ESRCH) {
            char why[96];
            snprintf(why, sizeof(why), "peer %d (pid %u) exited", ep->peer, ep->pid);
            shoal_ucx_ep_set_gone(ep, why);
            return shoal_ucx_ep_fail_gone(ep);
        } else {
            int err = got < 0 ? errno : EIO;
            if (shoal_ucx_ep_cma_sender_left(ep, &n)) {
                return n;
            }
            /* tell the sender, whose send waits for this FIN (best effort: the endpoint
             * fails now) */
            if (ep->uep != NULL) {
                shoal_ucx_ctl_encode(s->fin, SHOAL_UCX_FIN_MAGIC, (uint32_t)err);
                shoal_ucx_send(ep, s, s->fin, sizeof(s->fin), SHOAL_UCX_TAG_AUTH);
            }
            return shoal_ucx_ep_error(ep, SHOAL_ERR_PROTOCOL, -1, "peer %d: single-copy read "
                                      "of %zu bytes at 0x%llx failed after %zu: %s", ep->peer,
                                      len, (unsigned long long)addr, done, strerror(err));
        }
    }
    /* A sender that failed sent its abort notice before its caller could reuse the buffer:
     * if one came, what we read may be stale. */
    (void)ucp_worker_progress(ep->ctx->worker);
    if (shoal_ucx_ep_probe_abort(ep, &n)) {
        return n;
    }
    *failed_p = 0;
    ep->ctx->cma_reads++;
    ep->ctx->cma_bytes += len;
    s->state = SHOAL_UCX_SLOT_DATA;
    s->rlen = len;
    if (ep->uep != NULL) {
        shoal_ucx_ctl_encode(s->fin, SHOAL_UCX_FIN_MAGIC, 0);
        shoal_ucx_send(ep, s, s->fin, sizeof(s->fin), SHOAL_UCX_TAG_AUTH);
    }
    if (s->nout == 0) {
        s->state = SHOAL_UCX_SLOT_DONE;
    }
    return 0;
}

/* Checks an arrived header; then copies the inline payload or posts the payload receive.
 * Returns the completions of a failure, with *failed_p set. */
static int shoal_ucx_ep_check_hdr(shoal_ep_t *ep, shoal_ucx_slot_t *s, int *failed_p)
{
    shoal_tl_req_t *req = s->req;
    uint64_t len = req->hdr.length;
    uint64_t cma_addr;
    size_t rlen = s->rlen;
    shoal_status_t st;
    char why[160];
    int culprit, whole = 0;

    *failed_p = 1;
    if (s->ucs != UCS_OK) {
        return shoal_ucx_ep_ucs_error(ep, "receive", s->ucs);
    }
    if (s->whole) {
        /* The receive put the header in the slot and what followed it in the caller's
         * buffer: the payload (one message), nothing (the payload follows as DATA), or a
         * single-copy descriptor, which goes back behind the header to be checked. */
        if (rlen == SHOAL_WIRE_HDR_BYTES + len) {
            rlen = SHOAL_WIRE_HDR_BYTES;
            whole = 1;
        } else if (rlen == SHOAL_WIRE_HDR_BYTES + SHOAL_UCX_CMA_DESC_BYTES) {
            memcpy(s->buf + SHOAL_WIRE_HDR_BYTES, req->buf, SHOAL_UCX_CMA_DESC_BYTES);
        }
    }
    st = shoal_ucx_hdr_check(&req->hdr, s->buf, rlen, ep->inline_max, ep->cma_rx, &cma_addr,
                             why, sizeof(why), &culprit);
    if (st != SHOAL_OK) {
        return shoal_ucx_ep_error(ep, st, culprit, "peer %d: %s", ep->peer, why);
    }
    if (cma_addr != 0) {
        return shoal_ucx_ep_cma_read(ep, s, cma_addr, failed_p);
    }
    *failed_p = 0;
    if (len <= ep->inline_max) {
        if (len > 0) {
            memcpy(req->buf, s->buf + SHOAL_UCX_SHORT_HDR_BYTES, len);
        }
        s->state = SHOAL_UCX_SLOT_DONE;
        s->rlen = len;
    } else if (whole) {
        ep->ctx->whole_rx++;
        s->state = SHOAL_UCX_SLOT_DONE;
        s->rlen = len;
    } else {
        s->state = SHOAL_UCX_SLOT_DATA;
        shoal_ucx_recv(ep, s, req->buf, len, SHOAL_UCX_TAG_DATA);
    }
    return 0;
}

static int shoal_ucx_ep_progress_rx(shoal_ep_t *ep)
{
    int n = 0, failed = 0;
    shoal_tl_req_t *req;
    /* Headers arrive in order: check them as they come, payload receives follow in order. */
    while (ep->rx_checked < ep->rx_count) {
        shoal_ucx_slot_t *s = &ep->rx[(ep->rx_head + ep->rx_checked) % SHOAL_UCX_SLOTS];
        if (s->state != SHOAL_UCX_SLOT_HDR_DONE) {
            break;
        }
        n += shoal_ucx_ep_check_hdr(ep, s, &failed);
        if (failed) {
            return n;
        }
        ep->rx_checked++;
    }
    while (ep->rx_checked > 0) {
        shoal_ucx_slot_t *s = &ep->rx[ep->rx_head];
        if (s->state != SHOAL_UCX_SLOT_DONE) {
            break;
        }
        if (s->ucs != UCS_OK) {
            return n + shoal_ucx_ep_ucs_error(ep, "receive", s->ucs);
        }
        req = s->req;
        if (s->rlen != req->hdr.length) {
            return n + shoal_ucx_ep_error(ep, SHOAL_ERR_PROTOCOL, -1, "peer %d: %zu payload bytes "
                                          "for a %llu-byte message", ep->peer, s->rlen,
                                          (unsigned long long)req->hdr.length);
        }
        s->req = NULL;
        s->state = SHOAL_UCX_SLOT_FREE;
        ep->rx_head = (ep->rx_head + 1) % SHOAL_UCX_SLOTS;
        ep->rx_count--;
        ep->rx_checked--;
        shoal_ucx_ep_retire(ep, req, SHOAL_OK, NULL);
        n++;
    }
    while (ep->rx_count < SHOAL_UCX_SLOTS && ep->rq_head != NULL) {
        shoal_ucx_rx_start(ep, shoal_ucx_queue_pop(&ep->rq_head, &ep->rq_tail));
    }
    return n;
}

void shoal_ucx_ep_start_queued(shoal_ep_t *ep)
{
    while (ep->status == SHOAL_OK && ep->tx_count < SHOAL_UCX_SLOTS && ep->sq_head != NULL) {
        shoal_ucx_tx_start(ep, shoal_ucx_queue_pop(&ep->sq_head, &ep->sq_tail));
    }
    while (ep->status == SHOAL_OK && ep->rx_count < SHOAL_UCX_SLOTS && ep->rq_head != NULL) {
        shoal_ucx_rx_start(ep, shoal_ucx_queue_pop(&ep->rq_head, &ep->rq_tail));
    }
}

int shoal_ucx_ep_progress(shoal_ep_t *ep, int tick)
{
    int n = 0;
    if (ep->status != SHOAL_OK || (tick && shoal_ucx_ep_probe_abort(ep, &n))) {
        return n;
    }
    if (ep->tx_count > 0) {
        n += shoal_ucx_ep_progress_tx(ep);
    }
    if (ep->status == SHOAL_OK && ep->rx_count > 0) {
        n += shoal_ucx_ep_progress_rx(ep);
    }
    if (ep->status == SHOAL_OK && (ep->gone || ep->post_failed)) {
        n += shoal_ucx_ep_progress_gone(ep);
    }
    return n;
}

/* Best effort, never blocks: an ABORT header with the abort tag. */
void shoal_ucx_ep_send_abort(shoal_ep_t *ep, int culprit)
{
    shoal_wire_hdr_t h = {
        .magic = SHOAL_WIRE_MAGIC,
        .version = SHOAL_WIRE_VERSION,
        .type = SHOAL_WIRE_ABORT,
        .comm_id = ep->ctx->comm_id,
        .chunk = (uint32_t)culprit,
        .length = 0,
    };
    ucp_request_param_t p = {.op_attr_mask = 0};
    void *r;
    if (ep->status != SHOAL_OK || ep->gone || ep->uep == NULL) {
        return;
    }
    shoal_wire_encode(&h, ep->abort_buf);
    r = ucp_tag_send_nbx(ep->uep, ep->abort_buf, sizeof(ep->abort_buf),
                         shoal_ucx_tag(ep->tx_tag, SHOAL_UCX_TAG_ABORT), &p);
    if (UCS_PTR_IS_ERR(r)) {
        shoal_trace(UCX, "peer %d: abort notice not sent: %s", ep->peer,
                    shoal_ucx_strerror(UCS_PTR_STATUS(r)));
        return;
    }
    ep->abort_req = r; /* NULL: done at once; shoal_ucx_notices_deliver releases it */
    ep->notice_posted = 1;
}

static int shoal_ucx_req_busy(void *r)
{
    return r != NULL && ucp_request_check_status(r) == UCS_INPROGRESS;
}

/* Gives the abort notices posted on ctx's endpoints (only on 'only' if not NULL) up to
 * SHOAL_UCX_NOTICE_MS, or the communicator's timeout if shorter, to reach their peers, then
 * releases their requests. A notice whose send completed has not necessarily arrived: over
 * ud, a send completes once it is posted, and the forced close that fails the endpoint next
 * (shoal_ucx_ep_fail) purges whatever the peer has not acknowledged, retransmissions
 * included. So each endpoint is flushed, which ends when UCX knows that what it sent was
 * delivered (ud: acknowledged; rc: by the peer's adapter; tcp, shared memory: written).
 * Without it, a notice lost once on Soft-RoCE left a peer waiting for its whole timeout
 * (tests/vm, mp ucx ud_verbs, mismatch). The flush may also wait for the failed call's own
 * sends, and a peer that closed its side already never acknowledges: either costs at most the
 * bound, once per failure. */
void shoal_ucx_notices_deliver(shoal_tl_ctx_t *ctx, shoal_ep_t *only)
{
    ucp_request_param_t p = {.op_attr_mask = 0};
    int ms = ctx->timeout_ms >= 0 ? SHOAL_MIN(ctx->timeout_ms, SHOAL_UCX_NOTICE_MS) :
                                    SHOAL_UCX_NOTICE_MS;
    uint64_t deadline = shoal_deadline_ns(ms);
    int first = only != NULL ? (int)(only - ctx->eps) : 0;
    int end = only != NULL ? first + 1 : ctx->neps;
    int left = 0;

    for (int i = first; i < end && !ctx->quarantined; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        void *r;
        if (!ep->notice_posted || ep->uep == NULL) {
            continue;
        }
        r = ucp_ep_flush_nbx(ep->uep, &p);
        if (UCS_PTR_IS_ERR(r)) {
            shoal_trace(UCX, "peer %d: abort notice not flushed: %s", ep->peer,
                        shoal_ucx_strerror(UCS_PTR_STATUS(r)));
        } else {
            ep->notice_flush = r;
        }
        left += shoal_ucx_req_busy(ep->abort_req) || shoal_ucx_req_busy(ep->notice_flush);
    }
    while (left > 0 && !shoal_deadline_passed(deadline)) {
        if (ucp_worker_progress(ctx->worker) == 0 && ucp_worker_arm(ctx->worker) == UCS_OK) {
            /* a sleep of at most 1 ms: ud's retransmissions run from progress calls */
            struct pollfd pfd = {.fd = ctx->epfd, .events = POLLIN};
            (void)poll(&pfd, 1, 1);
        }
        left = 0;
        for (int i = first; i < end; i++) {
            left += shoal_ucx_req_busy(ctx->eps[i].abort_req) ||
                    shoal_ucx_req_busy(ctx->eps[i].notice_flush);
        }
    }
    if (left > 0) {
        shoal_info(UCX, "rank %d: %d abort notice(s) not known delivered after %d ms",
                   ctx->rank, left, ms);
    }
    for (int i = first; i < end; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        /* released now, freed by UCX when done or purged by the close */
        if (ep->abort_req != NULL) {
            ucp_request_free(ep->abort_req);
            ep->abort_req = NULL;
        }
        if (ep->notice_flush != NULL) {
            ucp_request_free(ep->notice_flush);
            ep->notice_flush = NULL;
        }
        ep->notice_posted = 0;
    }
}

/* ---- early messages: taking them out of UCX (see ucx.h) ------------------------------------- */

#define SHOAL_UCX_UNEXP_BATCH 4096     /* shoal_ucx_unexp_drain: most messages per call */

static int shoal_ucx_by_rank_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

shoal_status_t shoal_ucx_by_rank_build(shoal_tl_ctx_t *ctx)
{
    ctx->by_rank = malloc((size_t)SHOAL_MAX(ctx->neps, 1) * sizeof(*ctx->by_rank));
    if (ctx->by_rank == NULL) {
        shoal_error(UCX, "out of memory for the index of %d endpoints", ctx->neps);
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int i = 0; i < ctx->neps; i++) {
        ctx->by_rank[i] = (uint64_t)(uint32_t)ctx->eps[i].peer << 32 | (uint32_t)i;
    }
    qsort(ctx->by_rank, (size_t)ctx->neps, sizeof(*ctx->by_rank), shoal_ucx_by_rank_cmp);
    return SHOAL_OK;
}

/* The endpoint of the peer of global rank, or NULL. */
static shoal_ep_t *shoal_ucx_ep_of_rank(shoal_tl_ctx_t *ctx, uint32_t rank)
{
    int lo = 0, hi = ctx->neps - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        uint32_t r = (uint32_t)(ctx->by_rank[mid] >> 32);
        if (r == rank) {
            return &ctx->eps[(uint32_t)ctx->by_rank[mid]];
        }
        if (r < rank) {
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return NULL;
}

/* A message was held for ep's peer: over a limit, its endpoint (or that of the peer that holds
 * the most) fails; the completions. */
static int shoal_ucx_unexp_check(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    unsigned max = shoal_ucx_config.unexp_max, total = shoal_ucx_config.unexp_total;
    shoal_ep_t *most = ep;

    if (max != 0 && (unsigned)ep->nunexp > max) {
        return shoal_ucx_ep_error(ep, SHOAL_ERR_PROTOCOL, -1, "peer %d: more than %u messages "
                                  "arrived before their receives were posted "
                                  "(SHOAL_UCX_UNEXPECTED_MAX): refused", ep->peer, max);
    }
    if (total == 0 || (unsigned)ctx->nunexp <= total) {
        return 0;
    }
    for (int i = 0; i < ctx->neps; i++) {
        if (ctx->eps[i].nunexp > most->nunexp) {
            most = &ctx->eps[i];
        }
    }
    return shoal_ucx_ep_error(most, SHOAL_ERR_PROTOCOL, -1, "peer %d: the most (%d) of the %d "
                              "messages of all peers that arrived before their receives were "
                              "posted, more than %u (SHOAL_UCX_UNEXPECTED_TOTAL): refused",
                              most->peer, most->nunexp, ctx->nunexp, total);
}

/* One message taken out of UCX's unexpected queue: held for its peer, or dropped. */
static int shoal_ucx_unexp_take(shoal_tl_ctx_t *ctx, ucp_tag_message_h msg,
                                const ucp_tag_recv_info_t *info)
{
    const ucp_tag_t kind_mask = (ucp_tag_t)3 << 62;
    int kind = (int)(info->sender_tag >> 62);
    uint32_t rank = (uint32_t)(info->sender_tag >> SHOAL_UCX_KEY_BITS) &
                    ((1u << SHOAL_UCX_RANK_BITS) - 1);
    shoal_ep_t *ep = shoal_ucx_ep_of_rank(ctx, rank);
    shoal_ucx_unexp_t *u;

    if (ep == NULL || (info->sender_tag & ~kind_mask) != ep->rx_tag) {
        /* Under no key of ours (only the job's ranks know them): no receive will ever take
         * it, and who sent it is unknown (the rank bits are the sender's claim). Never
         * counted against the rank it claims. */
        if (ep != NULL && kind == SHOAL_UCX_TAG_AUTH) {
            ep->foreign_auth = 1; /* see shoal_ucx_lazy_refused */
        }
        if (ctx->nforeign++ == 0) {
            shoal_warn(UCX, "rank %d: a %zu-byte message claiming rank %u, under no key of "
                       "this communicator (another job, or a process outside it): dropped, "
                       "as later ones will be", ctx->rank, info->length, rank);
        }
        shoal_ucx_msg_discard(ctx, msg);
        return 0;
    }
    if (ep->status != SHOAL_OK) {
        shoal_ucx_msg_discard(ctx, msg); /* its requests failed: nothing will take it */
        return 0;
    }
    u = ctx->unexp_free;
    if (u != NULL) {
        ctx->unexp_free = u->next;
    } else if ((u = malloc(sizeof(*u))) == NULL) {
        shoal_ucx_msg_discard(ctx, msg);
        return shoal_ucx_ep_error(ep, SHOAL_ERR_NO_MEMORY, -1, "peer %d: out of memory "
                                  "holding a message that arrived before its receive",
                                  ep->peer);
    }
    *u = (shoal_ucx_unexp_t){.msg = msg, .len = info->length};
    if (ep->uq_tail[kind] != NULL) {
        ep->uq_tail[kind]->next = u;
    } else {
        ep->uq_head[kind] = u;
    }
    ep->uq_tail[kind] = u;
    ep->nunexp++;
    ctx->nunexp++;
    return shoal_ucx_unexp_check(ep);
}

int shoal_ucx_unexp_drain(shoal_tl_ctx_t *ctx)
{
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg;
    int n = 0;

    /* oldest first, whatever the tag (a mask of 0 searches UCX's list of all of them) */
    for (int i = 0; i < SHOAL_UCX_UNEXP_BATCH && ctx->by_rank != NULL && !ctx->quarantined &&
                    (msg = ucp_tag_probe_nb(ctx->worker, 0, 0, 1, &info)) != NULL; i++) {
        n += shoal_ucx_unexp_take(ctx, msg, &info);
    }
    return n;
}
