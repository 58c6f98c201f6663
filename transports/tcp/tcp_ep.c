/* TCP transport: the data path of an endpoint. Messages below the split size travel on
 * socket 0 as header + payload; larger ones send the header on socket 0 and the payload in
 * nsocks contiguous stripes, one per socket, moved concurrently. The receiver reads a header
 * only once a receive is posted, validates it before touching any payload, then reads exactly
 * the posted length. */
#include "transports/tcp/tcp.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define SHOAL_TCP_IO_FLAGS (MSG_NOSIGNAL | MSG_DONTWAIT)

static int shoal_tcp_ep_nstripes(const shoal_ep_t *ep, uint64_t len)
{
    return len >= ep->min_split ? ep->nsocks : 1;
}

/* Stripe i of n of a len-byte payload: [start, start + size), a deterministic split. */
static void shoal_tcp_stripe(uint64_t len, int n, int i, uint64_t *start_p, uint64_t *size_p)
{
    uint64_t q = len / (uint64_t)n, r = len % (uint64_t)n;
    uint64_t start = q * (uint64_t)i + r * (uint64_t)i / (uint64_t)n;
    uint64_t end = q * (uint64_t)(i + 1) + r * (uint64_t)(i + 1) / (uint64_t)n;
    *start_p = start;
    *size_p = end - start;
}

static void shoal_tcp_req_complete(shoal_tl_req_t *req, shoal_status_t status, int culprit,
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

static int shoal_tcp_queue_fail(shoal_tl_req_t **head_p, shoal_tl_req_t **tail_p,
                                shoal_status_t status, int culprit, const char *why)
{
    int n = 0;
    shoal_tl_req_t *req = *head_p;
    while (req != NULL) {
        shoal_tl_req_t *next = req->next;
        shoal_tcp_req_complete(req, status, culprit, why);
        req = next;
        n++;
    }
    *head_p = *tail_p = NULL;
    return n;
}

int shoal_tcp_ep_fail(shoal_ep_t *ep, shoal_status_t status, int culprit, const char *why)
{
    int n;
    if (ep->status != SHOAL_OK) {
        return 0;
    }
    ep->status = status;
    ep->culprit = culprit;
    snprintf(ep->why, sizeof(ep->why), "%s", why);
    n = shoal_tcp_queue_fail(&ep->sq_head, &ep->sq_tail, status, culprit, ep->why);
    n += shoal_tcp_queue_fail(&ep->rq_head, &ep->rq_tail, status, culprit, ep->why);
    ep->ctx->npending -= n;
    /* A failed endpoint must not wake sleepers any more. */
    for (int i = 0; i < ep->nsocks; i++) {
        if (ep->fds[i] >= 0) {
            (void)epoll_ctl(ep->ctx->epfd, EPOLL_CTL_DEL, ep->fds[i], NULL);
        }
    }
    return n;
}

/* A frame that fails the check (another call's, another count: SHOAL_ERR_PROTOCOL) fails the
 * endpoint here, and the peer, which sent it and waits for our part, must learn it too. No
 * abort notice can follow (a send of ours may have stopped in the middle of a message), so
 * each socket is shut for writing: what we sent arrives, then the end of the stream, and the
 * peer fails at once ("closed the connection"). It waited for its whole timeout, or for our
 * destroy. The sockets stay open for reading until destroy, as every failed endpoint's. */
static void shoal_tcp_ep_hang_up(shoal_ep_t *ep)
{
    for (int i = 0; i < ep->nsocks; i++) {
        if (ep->fds[i] >= 0) {
            (void)shutdown(ep->fds[i], SHUT_WR);
        }
    }
}

/* Detected here: log once with the peer, then fail the endpoint. */
static int shoal_tcp_ep_error(shoal_ep_t *ep, shoal_status_t status, int culprit,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int shoal_tcp_ep_error(shoal_ep_t *ep, shoal_status_t status, int culprit,
                              const char *fmt, ...)
{
    char why[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    shoal_error(TCP, "%s", why);
    return shoal_tcp_ep_fail(ep, status, culprit, why);
}

int shoal_tcp_ep_last_words(shoal_ep_t *ep, char *buf, size_t len)
{
    uint8_t raw[SHOAL_WIRE_HDR_BYTES];
    shoal_wire_hdr_t h;
    int culprit;

    buf[0] = '\0';
    if (ep->fds[0] < 0 || ep->rhdr_off != 0 || (ep->rq_head != NULL && ep->rq_head->hdr_done) ||
        recv(ep->fds[0], raw, sizeof(raw), MSG_DONTWAIT | MSG_PEEK) != (ssize_t)sizeof(raw)) {
        return -1;
    }
    shoal_wire_decode(raw, &h);
    culprit = shoal_wire_culprit(&h);
    if (culprit < 0 || h.comm_id != ep->ctx->comm_id) {
        return -1;
    }
    snprintf(buf, len, "; its communicator failed because of rank %d", culprit);
    return culprit;
}

static int shoal_tcp_ep_progress_recv(shoal_ep_t *ep);

/* A failed send/recv (ret 0 from recv is EOF). Returns the completions of the failure.
 * A send that failed because the peer went away (it reset the connection on exit): what it
 * wrote before it went is still in our receive buffer (a reset does not drop it), such as the
 * rest of a message we are reading and then its abort notice. The posted receives take it
 * first, as they would have, so that the notice names the rank the peer blamed (seen:
 * run_nbc.sh's "kill hosts 2x2 hier", a survivor blaming another survivor's exit). */
static int shoal_tcp_ep_io_error(shoal_ep_t *ep, const char *op, int sock, int err)
{
    char last[80];
    int culprit, n = 0;

    if (op[0] == 's' && err != 0 && ep->rq_head != NULL) {
        n = shoal_tcp_ep_progress_recv(ep);
        if (ep->status != SHOAL_OK) {
            return n; /* the receives found the notice (or the end): failed with its culprit */
        }
    }
    culprit = shoal_tcp_ep_last_words(ep, last, sizeof(last));
    if (err == 0) {
        return n + shoal_tcp_ep_error(ep, SHOAL_ERR_PEER_FAILED, culprit,
                                      "peer %d (%s) closed the connection%s", ep->peer,
                                      ep->name, last);
    }
    if (err == ECONNRESET || err == EPIPE || err == ECONNABORTED || err == ETIMEDOUT ||
        err == EHOSTUNREACH || err == ENETUNREACH) {
        return n + shoal_tcp_ep_error(ep, SHOAL_ERR_PEER_FAILED, culprit,
                                      "peer %d (%s): %s on socket %d: %s%s", ep->peer, ep->name,
                                      op, sock, strerror(err), last);
    }
    return n + shoal_tcp_ep_error(ep, SHOAL_ERR_TRANSPORT, -1,
                                  "peer %d (%s): %s(fd %d) failed: %s", ep->peer, ep->name, op,
                                  ep->fds[sock], strerror(err));
}

#define SHOAL_TCP_AGAIN(e) ((e) == EAGAIN || (e) == EWOULDBLOCK)

/* Sends what the sockets take of the head send. 1 done, 0 would block, -1 failed (the
 * completions of the failure are added to *n_p). */
static int shoal_tcp_ep_push(shoal_ep_t *ep, shoal_tl_req_t *req, int *n_p)
{
    uint64_t len = req->hdr.length;
    int ns = shoal_tcp_ep_nstripes(ep, len);
    int complete = 1;

    for (int i = 0; i < ns; i++) {
        uint64_t start, size;
        shoal_tcp_stripe(len, ns, i, &start, &size);
        while (ep->soff[i] < size || (i == 0 && ep->shdr_off < SHOAL_WIRE_HDR_BYTES)) {
            uint8_t *p = (uint8_t *)req->buf + start + ep->soff[i];
            ssize_t r;
            if (i == 0 && ep->shdr_off < SHOAL_WIRE_HDR_BYTES) {
                struct iovec iov[2] = {
                    {.iov_base = ep->shdr + ep->shdr_off,
                     .iov_len = SHOAL_WIRE_HDR_BYTES - ep->shdr_off},
                    {.iov_base = p, .iov_len = size - ep->soff[0]},
                };
                struct msghdr mh = {.msg_iov = iov, .msg_iovlen = size > ep->soff[0] ? 2 : 1};
                r = sendmsg(ep->fds[0], &mh, SHOAL_TCP_IO_FLAGS);
                if (r > 0) {
                    size_t h = SHOAL_MIN((size_t)r, SHOAL_WIRE_HDR_BYTES - ep->shdr_off);
                    ep->shdr_off += h;
                    ep->soff[0] += (size_t)r - h;
                    req->off += (size_t)r - h;
                }
            } else {
                r = send(ep->fds[i], p, size - ep->soff[i], SHOAL_TCP_IO_FLAGS);
                if (r > 0) {
                    ep->soff[i] += (size_t)r;
                    req->off += (size_t)r;
                }
            }
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r < 0 && SHOAL_TCP_AGAIN(errno)) {
                complete = 0;
                break;
            }
            if (r <= 0) {
                *n_p += shoal_tcp_ep_io_error(ep, "send", i, r < 0 ? errno : EPIPE);
                return -1;
            }
        }
    }
    return complete;
}

/* Reads the header of the head receive and checks it. 1 checked, 0 would block, -1 failed.
 * A payload of at most SHOAL_TCP_RX_STAGE bytes comes with its header in one recvmsg (the
 * expected length is known and the check requires it equal, so the read never reaches into
 * the next message), into the context's stage: the user's buffer receives it only once the
 * header passed the check, so a refused frame writes nothing there. A small message costs
 * one system call to receive, as it costs one to send. */
static int shoal_tcp_ep_pull_hdr(shoal_ep_t *ep, shoal_tl_req_t *req, int *n_p)
{
    uint64_t len = req->hdr.length, start, size0;
    size_t staged, got_payload;
    shoal_wire_hdr_t got;
    char why[160];
    shoal_status_t st;

    /* socket 0's stripe (the whole payload unless it is split), which starts at 0 */
    shoal_tcp_stripe(len, shoal_tcp_ep_nstripes(ep, len), 0, &start, &size0);
    staged = size0 <= SHOAL_TCP_RX_STAGE ? (size_t)size0 : 0;
    if (ep->rhdr_off == 0) {
        memset(ep->roff, 0, sizeof(ep->roff));
    }
    while (ep->rhdr_off < SHOAL_WIRE_HDR_BYTES) {
        struct iovec iov[2] = {
            {.iov_base = ep->rhdr + ep->rhdr_off,
             .iov_len = SHOAL_WIRE_HDR_BYTES - ep->rhdr_off},
            {.iov_base = ep->ctx->rstage, .iov_len = staged},
        };
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = staged > 0 ? 2 : 1};
        ssize_t r = recvmsg(ep->fds[0], &mh, MSG_DONTWAIT);
        if (r > 0) {
            size_t h = SHOAL_MIN((size_t)r, SHOAL_WIRE_HDR_BYTES - ep->rhdr_off);
            ep->rhdr_off += h;
            ep->roff[0] += (size_t)r - h;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else if (r < 0 && SHOAL_TCP_AGAIN(errno)) {
            return 0;
        } else {
            *n_p += shoal_tcp_ep_io_error(ep, "recv", 0, r < 0 ? errno : 0);
            return -1;
        }
    }
    shoal_wire_decode(ep->rhdr, &got);
    st = shoal_wire_check(&req->hdr, &got, why, sizeof(why));
    if (st != SHOAL_OK) {
        *n_p += shoal_tcp_ep_error(ep, st, shoal_wire_culprit(&got), "peer %d (%s): %s",
                                   ep->peer, ep->name, why);
        if (st != SHOAL_ERR_PEER_FAILED && st != SHOAL_ERR_ABORTED) {
            shoal_tcp_ep_hang_up(ep);
        }
        return -1;
    }
    got_payload = ep->roff[0];
    if (got_payload > 0) { /* staged: the start of socket 0's stripe */
        memcpy((uint8_t *)req->buf + start, ep->ctx->rstage, got_payload);
        req->off += got_payload;
    }
    ep->rhdr_off = 0;
    req->hdr_done = 1;
    return 1;
}

/* Reads the payload stripes of the head receive. 1 done, 0 would block, -1 failed. */
static int shoal_tcp_ep_pull(shoal_ep_t *ep, shoal_tl_req_t *req, int *n_p)
{
    uint64_t len = req->hdr.length;
    int ns = shoal_tcp_ep_nstripes(ep, len);
    int complete = 1;

    for (int i = 0; i < ns; i++) {
        uint64_t start, size;
        shoal_tcp_stripe(len, ns, i, &start, &size);
        while (ep->roff[i] < size) {
            ssize_t r = recv(ep->fds[i], (uint8_t *)req->buf + start + ep->roff[i],
                             size - ep->roff[i], MSG_DONTWAIT);
            if (r > 0) {
                ep->roff[i] += (size_t)r;
                req->off += (size_t)r;
            } else if (r < 0 && errno == EINTR) {
                continue;
            } else if (r < 0 && SHOAL_TCP_AGAIN(errno)) {
                complete = 0;
                break;
            } else {
                *n_p += shoal_tcp_ep_io_error(ep, "recv", i, r < 0 ? errno : 0);
                return -1;
            }
        }
    }
    return complete;
}

static int shoal_tcp_ep_progress_send(shoal_ep_t *ep)
{
    int n = 0;
    shoal_tl_req_t *req;
    while ((req = ep->sq_head) != NULL) {
        if (!req->hdr_done) {
            shoal_wire_encode(&req->hdr, ep->shdr);
            ep->shdr_off = 0;
            memset(ep->soff, 0, sizeof(ep->soff));
            req->hdr_done = 1;
        }
        int r = shoal_tcp_ep_push(ep, req, &n);
        if (r <= 0) {
            break;
        }
        ep->sq_head = req->next;
        if (ep->sq_head == NULL) {
            ep->sq_tail = NULL;
        }
        ep->ctx->npending--;
        shoal_tcp_req_complete(req, SHOAL_OK, -1, NULL);
        n++;
    }
    return n;
}

static int shoal_tcp_ep_progress_recv(shoal_ep_t *ep)
{
    int n = 0;
    shoal_tl_req_t *req;
    while ((req = ep->rq_head) != NULL) {
        if (!req->hdr_done && shoal_tcp_ep_pull_hdr(ep, req, &n) <= 0) {
            break;
        }
        if (shoal_tcp_ep_pull(ep, req, &n) <= 0) {
            break;
        }
        ep->rq_head = req->next;
        if (ep->rq_head == NULL) {
            ep->rq_tail = NULL;
        }
        ep->ctx->npending--;
        shoal_tcp_req_complete(req, SHOAL_OK, -1, NULL);
        n++;
    }
    return n;
}

int shoal_tcp_ep_progress(shoal_ep_t *ep)
{
    int n = 0;
    if (ep->sq_head != NULL) {
        n += shoal_tcp_ep_progress_send(ep);
    }
    if (ep->rq_head != NULL) {
        n += shoal_tcp_ep_progress_recv(ep);
    }
    return n;
}

static shoal_status_t shoal_tcp_ep_post(shoal_ep_t *ep, shoal_tl_req_t *req,
                                        shoal_tl_req_t **head_p, shoal_tl_req_t **tail_p)
{
    if (ep->status != SHOAL_OK) {
        req->culprit = ep->culprit;
        return ep->status;
    }
    if (req->buf == NULL && req->hdr.length > 0) {
        shoal_error(TCP, "peer %d: request of %llu bytes without a buffer", ep->peer,
                    (unsigned long long)req->hdr.length);
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_tl_req_start(req);
    if (*tail_p != NULL) {
        (*tail_p)->next = req;
    } else {
        *head_p = req;
    }
    *tail_p = req;
    ep->ctx->npending++;
    return SHOAL_OK;
}

shoal_status_t shoal_tcp_ep_isend(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    return shoal_tcp_ep_post(ep, req, &ep->sq_head, &ep->sq_tail);
}

shoal_status_t shoal_tcp_ep_irecv(shoal_ep_t *ep, shoal_tl_req_t *req)
{
    return shoal_tcp_ep_post(ep, req, &ep->rq_head, &ep->rq_tail);
}

/* Best effort: only at a message boundary of socket 0's stream. A message under way is first
 * finished from its buffer, which is still the caller's (the endpoint's requests are retired
 * after this), until deadline (shoal_time_ns; the caller's, shared by all its endpoints):
 * without it the peer reads the end of the stream in the middle of a message and can only
 * blame this rank, not the one that failed first (seen: run_nbc.sh's kill case, a survivor
 * naming another survivor that had exited). Never waits longer. */
void shoal_tcp_ep_send_abort(shoal_ep_t *ep, int culprit, uint64_t deadline)
{
    uint8_t buf[SHOAL_WIRE_HDR_BYTES];
    shoal_wire_hdr_t h = {
        .magic = SHOAL_WIRE_MAGIC,
        .version = SHOAL_WIRE_VERSION,
        .type = SHOAL_WIRE_ABORT,
        .comm_id = ep->ctx->comm_id,
        .chunk = (uint32_t)culprit,
        .length = 0,
    };
    if (ep->status != SHOAL_OK || ep->fds[0] < 0) {
        return;
    }
    if (ep->sq_head != NULL && ep->sq_head->hdr_done) {
        int n = 0, r;
        while ((r = shoal_tcp_ep_push(ep, ep->sq_head, &n)) == 0 &&
               shoal_time_ns() < deadline) {
            struct pollfd pfd = {.fd = ep->fds[0], .events = POLLOUT};
            (void)poll(&pfd, 1, 1);
        }
        if (r != 1) {
            shoal_trace(TCP, "peer %d (%s): abort notice not sent (a message under way)",
                        ep->peer, ep->name);
            return;
        }
        /* whole on the wire; the request stays queued and fails with the endpoint */
    }
    shoal_wire_encode(&h, buf);
    /* Whole or not at all, in the same deadline: one send into a nearly full buffer put part
     * of the header on the wire, and the peer read a broken header, then the end. */
    size_t sent = 0;
    while (sent < sizeof(buf)) {
        ssize_t r = send(ep->fds[0], buf + sent, sizeof(buf) - sent, SHOAL_TCP_IO_FLAGS);
        if (r > 0) {
            sent += (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) &&
                   shoal_time_ns() < deadline) {
            struct pollfd pfd = {.fd = ep->fds[0], .events = POLLOUT};
            (void)poll(&pfd, 1, 1);
        } else {
            break;
        }
    }
    if (sent != sizeof(buf)) {
        shoal_trace(TCP, "peer %d (%s): abort notice not sent (%zu of %zu bytes)", ep->peer,
                    ep->name, sent, sizeof(buf));
    } else {
        shoal_trace(TCP, "peer %d (%s): abort notice sent (rank %d)", ep->peer, ep->name,
                    culprit);
    }
}

void shoal_tcp_ep_close(shoal_ep_t *ep)
{
    for (int i = 0; i < SHOAL_TCP_MAX_SOCKS; i++) {
        if (ep->fds[i] >= 0) {
            close(ep->fds[i]);
            ep->fds[i] = -1;
        }
    }
}
