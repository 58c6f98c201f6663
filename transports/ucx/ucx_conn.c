/* UCX transport: the published address, tag keys and proofs, endpoint creation and the
 * authenticated connect_all. */
#include "transports/ucx/ucx.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- codecs ------------------------------------------------------------------------------ */

size_t shoal_ucx_addr_encode(const shoal_tl_ctx_t *ctx, uint8_t *out, size_t room)
{
    size_t len = SHOAL_UCX_ADDR_HDR_BYTES + ctx->waddr_len;
    if (room < len) {
        return 0;
    }
    memset(out, 0, SHOAL_UCX_ADDR_HDR_BYTES);
    shoal_put_le(out + 0, SHOAL_UCX_ADDR_MAGIC, 4);
    shoal_put_le(out + 4, SHOAL_UCX_ADDR_VERSION, 2);
    shoal_put_le(out + 6, (uint64_t)ctx->waddr_net_only, 2);
    shoal_put_le(out + 8, (uint64_t)ctx->rank, 4);
    shoal_put_le(out + 12, (uint64_t)getpid(), 4);
    shoal_put_le(out + 16, shoal_host_id(), 8);
    shoal_put_le(out + 24, ctx->inline_max, 4);
    shoal_put_le(out + 28, ctx->waddr_len, 4);
    memcpy(out + 32, ctx->nonce, SHOAL_UCX_NONCE_BYTES);
    /* where a same-host peer finds our nonce to check that it can read us (CMA) */
    shoal_put_le(out + 48, shoal_ucx_config.cma ? (uint64_t)(uintptr_t)ctx->nonce : 0, 8);
    shoal_put_le(out + 56, shoal_pid_ns(), 4);
    memcpy(out + SHOAL_UCX_ADDR_HDR_BYTES, ctx->waddr, ctx->waddr_len);
    return len;
}

int shoal_ucx_addr_decode(const void *in, size_t len, shoal_ucx_addr_t *a)
{
    const uint8_t *p = in;
    if (in == NULL || len < SHOAL_UCX_ADDR_HDR_BYTES ||
        shoal_get_le(p, 4) != SHOAL_UCX_ADDR_MAGIC ||
        shoal_get_le(p + 4, 2) != SHOAL_UCX_ADDR_VERSION) {
        return -1;
    }
    a->rank = (uint32_t)shoal_get_le(p + 8, 4);
    a->pid = (uint32_t)shoal_get_le(p + 12, 4);
    a->host_id = shoal_get_le(p + 16, 8);
    a->inline_max = (uint32_t)shoal_get_le(p + 24, 4);
    a->worker_len = (uint32_t)shoal_get_le(p + 28, 4);
    memcpy(a->nonce, p + 32, SHOAL_UCX_NONCE_BYTES);
    a->cma_addr = shoal_get_le(p + 48, 8);
    a->pid_ns = (uint32_t)shoal_get_le(p + 56, 4);
    a->worker = p + SHOAL_UCX_ADDR_HDR_BYTES;
    if (a->worker_len == 0 || a->worker_len != len - SHOAL_UCX_ADDR_HDR_BYTES) {
        return -1;
    }
    return 0;
}

/* HMAC-SHA256(secret, label | comm_id | from | to | nonce_from | nonce_to). */
static shoal_status_t shoal_ucx_mac(const shoal_tl_ctx_t *ctx, const char *label, int from,
                                    int to, const uint8_t *nonce_from, const uint8_t *nonce_to,
                                    uint8_t out[SHOAL_HMAC_BYTES])
{
    uint8_t msg[32 + 12 + 2 * SHOAL_UCX_NONCE_BYTES];
    size_t off = strlen(label);

    memcpy(msg, label, off);
    shoal_put_le(msg + off, ctx->comm_id, 4);
    shoal_put_le(msg + off + 4, (uint64_t)from, 4);
    shoal_put_le(msg + off + 8, (uint64_t)to, 4);
    off += 12;
    memcpy(msg + off, nonce_from, SHOAL_UCX_NONCE_BYTES);
    memcpy(msg + off + SHOAL_UCX_NONCE_BYTES, nonce_to, SHOAL_UCX_NONCE_BYTES);
    off += 2 * SHOAL_UCX_NONCE_BYTES;
    return shoal_hmac(ctx->secret, SHOAL_SECRET_BYTES, msg, off, out);
}

shoal_status_t shoal_ucx_proof(const shoal_tl_ctx_t *ctx, int from, int to,
                               const uint8_t *nonce_from, const uint8_t *nonce_to,
                               uint8_t out[SHOAL_HMAC_BYTES])
{
    return shoal_ucx_mac(ctx, "shoal-ucx-auth", from, to, nonce_from, nonce_to, out);
}

/* Tag of the direction from -> to, without the kind bits: rank | 40-bit key. */
shoal_status_t shoal_ucx_tag_key(const shoal_tl_ctx_t *ctx, int from, int to,
                                 const uint8_t *nonce_from, const uint8_t *nonce_to,
                                 ucp_tag_t *key_p)
{
    uint8_t mac[SHOAL_HMAC_BYTES];
    SHOAL_CHECK(shoal_ucx_mac(ctx, "shoal-ucx-tag", from, to, nonce_from, nonce_to, mac));
    *key_p = (shoal_get_le(mac, 8) & ((1ull << SHOAL_UCX_KEY_BITS) - 1)) |
             ((ucp_tag_t)from << SHOAL_UCX_KEY_BITS);
    return SHOAL_OK;
}

/* ---- endpoints ---------------------------------------------------------------------------- */

/* Within SHOAL_UCX_EXIT_SHOW_MS, 1 if same-host peer ep's process has exited. A killed
 * process closes its sockets (UCX over tcp fails the endpoint) before its pidfd becomes
 * readable, and on a loaded host its exit took more than 20 ms (tests/fault/run_kill.sh
 * over tcp, 2 CPUs): a bounded wait, once per endpoint, on a failure path (no UCX call:
 * safe within a UCX callback). */
#define SHOAL_UCX_EXIT_SHOW_MS 100
static int shoal_ucx_ep_exit_shows(const shoal_ep_t *ep)
{
    if (ep->pidfd >= 0) {
        struct pollfd p = {.fd = ep->pidfd, .events = POLLIN};
        return poll(&p, 1, SHOAL_UCX_EXIT_SHOW_MS) > 0;
    }
    return shoal_ucx_ep_peer_exited(ep);
}

static void shoal_ucx_ep_err_cb(void *arg, ucp_ep_h uep, ucs_status_t st)
{
    shoal_ep_t *ep = arg;
    char why[192];
    (void)uep;
    /* Only for UCX's "Endpoint timeout": a peer that closed its worker and lives on (a
     * communicator destroyed first on its side) must not cost each endpoint the wait. */
    if (st == UCS_ERR_ENDPOINT_TIMEOUT && ep->local && !ep->gone && ep->status == SHOAL_OK &&
        shoal_ucx_ep_exit_shows(ep)) {
        /* UCX over tcp calls a same-host peer that exited (or was killed) a moment ago an
         * "Endpoint timeout", before the liveness check sees the exit: say what happened.
         * The check still takes its pidfd out of the sleepers' set. */
        snprintf(why, sizeof(why), "peer %d (pid %u) exited", ep->peer, ep->pid);
    } else {
        snprintf(why, sizeof(why), "peer %d: connection failed: %s", ep->peer,
                 shoal_ucx_strerror(st));
    }
    if (!ep->gone && ep->status == SHOAL_OK) {
        shoal_ucx_ep_log_gone(ep, why);
    }
    shoal_ucx_ep_set_gone(ep, why);
}

static void shoal_ucx_auth_rx_cb(void *request, ucs_status_t st,
                                 const ucp_tag_recv_info_t *info, void *user_data)
{
    shoal_ep_t *ep = user_data;
    ep->auth_rreq = NULL;
    ep->auth_rdone = 1;
    if (ep->lazy_state == SHOAL_UCX_LAZY_IDLE) {
        ep->ctx->lazy_want = 1; /* the peer connected to us first: answer */
    }
    ep->auth_rlen = st == UCS_OK ? info->length : 0;
    if (st != UCS_OK && ep->auth_ucs == UCS_OK) {
        ep->auth_ucs = st;
    }
    ep->ctx->nevents++;
    ucp_request_free(request);
}

static void shoal_ucx_auth_tx_cb(void *request, ucs_status_t st, void *user_data)
{
    shoal_ep_t *ep = user_data;
    ep->auth_sreq = NULL;
    ep->auth_sdone = 1;
    if (st != UCS_OK && ep->auth_ucs == UCS_OK) {
        ep->auth_ucs = st;
    }
    ep->ctx->nevents++;
    ucp_request_free(request);
}

static void shoal_ucx_hello_rx_cb(void *request, ucs_status_t st,
                                  const ucp_tag_recv_info_t *info, void *user_data)
{
    shoal_ep_t *ep = user_data;
    ep->hello_rreq = NULL;
    ep->hello_rdone = 1;
    ep->hello_rlen = st == UCS_OK ? info->length : 0;
    if (st != UCS_OK && ep->auth_ucs == UCS_OK) {
        ep->auth_ucs = st;
    }
    ep->ctx->nevents++;
    ucp_request_free(request);
}

static void shoal_ucx_hello_tx_cb(void *request, ucs_status_t st, void *user_data)
{
    shoal_ep_t *ep = user_data;
    ep->hello_sreq = NULL;
    ep->hello_sdone = 1;
    if (st != UCS_OK && ep->auth_ucs == UCS_OK) {
        ep->auth_ucs = st;
    }
    ep->ctx->nevents++;
    ucp_request_free(request);
}

/* After the peer's proof: can we read its memory? Reads its nonce where it said it lies; the
 * read fails without the ptrace permission (Yama, another user, a non-dumpable process), and
 * finds other bytes if the pid names another process (another pid namespace). */
static void shoal_ucx_cma_probe(shoal_ep_t *ep)
{
    uint8_t got[SHOAL_UCX_NONCE_BYTES];
    struct iovec l = {.iov_base = got, .iov_len = sizeof(got)};
    struct iovec r = {.iov_base = (void *)(uintptr_t)ep->peer_cma_addr, .iov_len = sizeof(got)};
    ssize_t n;

    if (!shoal_ucx_config.cma || ep->peer_cma_addr == 0 || !ep->local) {
        return;
    }
    n = process_vm_readv((pid_t)ep->pid, &l, 1, &r, 1, 0);
    if (n == (ssize_t)sizeof(got) && shoal_memeq_ct(got, ep->peer_nonce, sizeof(got))) {
        ep->cma_rx = 1;
        return;
    }
    shoal_info(UCX, "peer %d: single-copy reads from pid %u unavailable (%s): its large "
               "payloads come through UCX", ep->peer, ep->pid,
               n < 0 ? strerror(errno) : "another process answers to that pid");
}

/* Sends our HELLO: whether we read the peer's payloads (1) or not (0). */
static shoal_status_t shoal_ucx_hello_send(shoal_ep_t *ep)
{
    ucp_request_param_t sp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.send = shoal_ucx_hello_tx_cb,
        .user_data = ep,
    };
    void *r;

    shoal_ucx_cma_probe(ep);
    shoal_ucx_ctl_encode(ep->hello_tx, SHOAL_UCX_HELLO_MAGIC, (uint32_t)ep->cma_rx);
    ep->hello_sent = 1;
    r = ucp_tag_send_nbx(ep->uep, ep->hello_tx, sizeof(ep->hello_tx),
                         shoal_ucx_tag(ep->tx_tag, SHOAL_UCX_TAG_AUTH), &sp);
    if (UCS_PTR_IS_ERR(r)) {
        shoal_error(UCX, "peer %d: sending HELLO failed: %s", ep->peer,
                    shoal_ucx_strerror(UCS_PTR_STATUS(r)));
        return SHOAL_ERR_PEER_FAILED;
    }
    if (!ep->hello_sdone) {
        ep->hello_sreq = r;
    }
    return SHOAL_OK;
}

/* Watches a same-host peer's process through a pidfd (readable once it exits). */
static void shoal_ucx_ep_watch(shoal_ep_t *ep, int idx)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    ctx->live_pfds[idx] = (struct pollfd){.fd = -1, .events = POLLIN};
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)ep->pid, 0);
    if (fd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            shoal_warn(UCX, "epoll_ctl(add pidfd of peer %d): %s", ep->peer, strerror(errno));
        }
        ep->pidfd = fd;
        ctx->live_pfds[idx].fd = fd;
        return;
    }
    if (errno == ESRCH) {
        /* not in our pid namespace: leave it to UCX's error handling */
        ep->local = 0;
        return;
    }
#endif
    /* no pidfd (old kernel): progress falls back to kill(pid, 0) */
}

/* An authenticated peer of another host id may still be a process of this machine (virtual
 * hosts: SHOAL_HOSTID, tests/mp/hostid_wrap.sh). UCX then carries its messages through shared
 * memory, which tells nobody of the peer's death: a survivor waited for its timeout
 * (SHOAL_ERR_TIMEOUT, naming nobody) where UCX over tcp fails the endpoint at once. If the
 * process that the peer's pid names here holds the peer's nonce where the peer said it lies,
 * it is the peer: watch it as a same-host peer's (its exit fails the endpoint within a
 * liveness period, naming it). A peer that published no probe address, another pid namespace
 * or no ptrace permission: UCX's error handling alone, as before. */
static void shoal_ucx_ep_watch_machine(shoal_ep_t *ep)
{
    uint8_t got[SHOAL_UCX_NONCE_BYTES];
    struct iovec l = {.iov_base = got, .iov_len = sizeof(got)};
    struct iovec r = {.iov_base = (void *)(uintptr_t)ep->peer_cma_addr, .iov_len = sizeof(got)};

    if (ep->local || ep->gone || ep->peer_cma_addr == 0 ||
        process_vm_readv((pid_t)ep->pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof(got) ||
        !shoal_memeq_ct(got, ep->peer_nonce, sizeof(got))) {
        return;
    }
    ep->local = 1;
    shoal_ucx_ep_watch(ep, (int)(ep - ep->ctx->eps));
    if (ep->local) {
        shoal_trace(UCX, "peer %d: another host id, but pid %u of this machine: its exit is "
                    "watched", ep->peer, ep->pid);
    }
}

/* Everything of endpoint idx but its UCX endpoint: state, slots, tags, the peer's pidfd. */
static shoal_status_t shoal_ucx_ep_setup(shoal_tl_ctx_t *ctx, int idx, int peer,
                                         const shoal_ucx_addr_t *a)
{
    shoal_ep_t *ep = &ctx->eps[idx];
    size_t slot_bytes = ctx->slot_bytes;
    uint8_t *mem = ctx->slot_mem + (size_t)idx * 2 * SHOAL_UCX_SLOTS * slot_bytes;

    ep->ctx = ctx;
    ep->peer = peer;
    ep->pidfd = -1;
    ep->pid = a->pid;
    ep->local = a->host_id == shoal_host_id();
    ep->same_host = ep->local;
    if (ep->local && a->pid_ns != 0 && a->pid_ns != shoal_pid_ns() && shoal_pid_ns() != 0) {
        /* Its pid names it only in its own pid namespace (a container sharing our host id):
         * here it is nobody or another process, whose exit would fail the endpoint of a live
         * peer. UCX's error handling alone, as for a peer whose pid is not found. */
        shoal_trace(UCX, "peer %d: another pid namespace: its pid %u is not watched", peer,
                    a->pid);
        ep->local = 0;
    }
    ep->fast_cmpl = ep->same_host && shoal_ucx_config.fast_cmpl;
    ep->peer_cma_addr = a->cma_addr;
    ep->status = SHOAL_OK;
    ep->inline_max = SHOAL_MIN(ctx->inline_max, (size_t)a->inline_max);
    memcpy(ep->peer_nonce, a->nonce, SHOAL_UCX_NONCE_BYTES);
    for (int i = 0; i < SHOAL_UCX_SLOTS; i++) {
        ep->tx[i] = (shoal_ucx_slot_t){.ep = ep, .buf = mem + (size_t)i * slot_bytes};
        ep->rx[i] = (shoal_ucx_slot_t){
            .ep = ep, .buf = mem + (size_t)(SHOAL_UCX_SLOTS + i) * slot_bytes};
    }
    SHOAL_CHECK(shoal_ucx_tag_key(ctx, ctx->rank, peer, ctx->nonce, a->nonce, &ep->tx_tag));
    SHOAL_CHECK(shoal_ucx_tag_key(ctx, peer, ctx->rank, a->nonce, ctx->nonce, &ep->rx_tag));
    if (ep->local) {
        shoal_ucx_ep_watch(ep, idx);
    } else {
        ctx->live_pfds[idx] = (struct pollfd){.fd = -1};
    }
    return SHOAL_OK;
}

/* SHOAL_DEBUG=trace: the endpoint's lanes and protocol thresholds as UCX reports them
 * (ucp_ep_print_info: which transport carries what, up to which size the short protocol
 * goes), one log line each. */
static void shoal_ucx_ep_log_protocols(shoal_ep_t *ep)
{
    char *text = NULL, *save = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(ep->uep, f);
    if (fclose(f) == 0 && text != NULL) {
        for (char *line = strtok_r(text, "\n", &save); line != NULL;
             line = strtok_r(NULL, "\n", &save)) {
            while (*line == '#' || *line == ' ') {
                line++;
            }
            if (*line != '\0') {
                shoal_trace(UCX, "rank %d: ucx endpoint to peer %d: %s", ep->ctx->rank, ep->peer,
                            line);
            }
        }
    }
    free(text);
}

/* The UCX endpoint to the peer's worker address (non-blocking: UCX wires it up as it goes). */
static shoal_status_t shoal_ucx_ep_create(shoal_ep_t *ep, const void *worker)
{
    ucp_ep_params_t p = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)worker,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = shoal_ucx_ep_err_cb, .arg = ep},
    };
    ucs_status_t ust = ucp_ep_create(ep->ctx->worker, &p, &ep->uep);
    if (ust != UCS_OK) {
        ep->uep = NULL;
        shoal_error(UCX, "peer %d: ucp_ep_create failed: %s", ep->peer,
                    shoal_ucx_strerror(ust));
        return SHOAL_ERR_TRANSPORT;
    }
    if (shoal_log_enabled(SHOAL_LOG_TRACE, UCX)) {
        shoal_ucx_ep_log_protocols(ep);
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_ucx_ep_open(shoal_tl_ctx_t *ctx, int idx, int peer,
                                        const shoal_ucx_addr_t *a)
{
    SHOAL_CHECK(shoal_ucx_ep_setup(ctx, idx, peer, a));
    return shoal_ucx_ep_create(&ctx->eps[idx], a->worker);
}

/* Posts the receives of the peer's proof (and HELLO). */
static shoal_status_t shoal_ucx_ep_auth_post(shoal_ep_t *ep)
{
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = shoal_ucx_auth_rx_cb,
        .user_data = ep,
    };
    void *r;

    r = shoal_ucx_tag_recv(ep, ep->auth_rx, sizeof(ep->auth_rx), SHOAL_UCX_TAG_AUTH, &rp);
    if (UCS_PTR_IS_ERR(r)) {
        shoal_error(UCX, "peer %d: posting the proof receive failed: %s", ep->peer,
                    shoal_ucx_strerror(UCS_PTR_STATUS(r)));
        return SHOAL_ERR_TRANSPORT;
    }
    if (!ep->auth_rdone) {
        ep->auth_rreq = r; /* else the callback ran already and released it */
    }
    if (ep->same_host) {
        /* the peer's HELLO, the second message of this kind (after its proof) */
        rp.cb.recv = shoal_ucx_hello_rx_cb;
        r = shoal_ucx_tag_recv(ep, ep->hello_rx, sizeof(ep->hello_rx), SHOAL_UCX_TAG_AUTH,
                               &rp);
        if (UCS_PTR_IS_ERR(r)) {
            shoal_error(UCX, "peer %d: posting the HELLO receive failed: %s", ep->peer,
                        shoal_ucx_strerror(UCS_PTR_STATUS(r)));
            return SHOAL_ERR_TRANSPORT;
        }
        if (!ep->hello_rdone) {
            ep->hello_rreq = r;
        }
    }
    return SHOAL_OK;
}

/* Sends our proof (the peer's receives are posted: shoal_ucx_ep_auth_post). */
static shoal_status_t shoal_ucx_ep_auth_send(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    ucp_request_param_t sp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.send = shoal_ucx_auth_tx_cb,
        .user_data = ep,
    };
    void *r;

    SHOAL_CHECK(shoal_ucx_proof(ctx, ctx->rank, ep->peer, ctx->nonce, ep->peer_nonce,
                                ep->auth_tx));
    r = ucp_tag_send_nbx(ep->uep, ep->auth_tx, sizeof(ep->auth_tx),
                         shoal_ucx_tag(ep->tx_tag, SHOAL_UCX_TAG_AUTH), &sp);
    if (UCS_PTR_IS_ERR(r)) {
        shoal_error(UCX, "peer %d: sending our proof failed: %s", ep->peer,
                    shoal_ucx_strerror(UCS_PTR_STATUS(r)));
        return SHOAL_ERR_PEER_FAILED;
    }
    if (!ep->auth_sdone) {
        ep->auth_sreq = r;
    }
    return SHOAL_OK;
}

/* Posts the receive of the peer's proof and sends ours. */
static shoal_status_t shoal_ucx_ep_auth_start(shoal_ep_t *ep)
{
    SHOAL_CHECK(shoal_ucx_ep_auth_post(ep));
    return shoal_ucx_ep_auth_send(ep);
}

/* 1: established; 0: not yet; else the failure status (logged). */
static int shoal_ucx_ep_auth_check(shoal_ep_t *ep, shoal_status_t *st_p)
{
    uint8_t want[SHOAL_HMAC_BYTES];
    shoal_tl_ctx_t *ctx = ep->ctx;
    uint32_t v;

    if (ep->status != SHOAL_OK) {
        /* Failed while its proofs were under way (connect_all's pass over early messages: a
         * peer over SHOAL_UCX_UNEXPECTED_MAX), its UCX endpoint closed: nothing more is sent
         * on it (a HELLO sent there crashed in UCX), and the failure is connect_all's. */
        shoal_error(UCX, "peer %d: connection setup failed: %s", ep->peer, ep->why);
        *st_p = ep->status;
        return -1;
    }
    if (!ep->gone && ep->auth_ucs == UCS_ERR_MESSAGE_TRUNCATED) {
        /* a proof or HELLO longer than its buffer: not a failed peer, a malformed message */
        shoal_error(UCX, "peer %d: connection setup failed: its proof or HELLO is longer "
                    "than the protocol's (a malformed message): refused", ep->peer);
        *st_p = SHOAL_ERR_PROTOCOL;
        return -1;
    }
    if (ep->gone || ep->auth_ucs != UCS_OK) {
        shoal_error(UCX, "peer %d: connection setup failed: %s", ep->peer,
                    ep->gone ? ep->why : shoal_ucx_strerror(ep->auth_ucs));
        *st_p = SHOAL_ERR_PEER_FAILED;
        return -1;
    }
    if (!ep->auth_ok) {
        if (!ep->auth_rdone || !ep->auth_sdone) {
            return 0;
        }
        *st_p = shoal_ucx_proof(ctx, ep->peer, ctx->rank, ep->peer_nonce, ctx->nonce, want);
        if (*st_p != SHOAL_OK) {
            return -1;
        }
        if (ep->auth_rlen != sizeof(want) || !shoal_memeq_ct(want, ep->auth_rx, sizeof(want))) {
            shoal_error(UCX, "peer %d: wrong authentication proof (%zu bytes): refused", ep->peer,
                        ep->auth_rlen);
            *st_p = SHOAL_ERR_AUTH;
            return -1;
        }
        ep->auth_ok = 1;
        /* an authenticated peer: only now look at its memory */
        if (!ep->same_host) {
            shoal_ucx_ep_watch_machine(ep);
        }
        if (ep->same_host && (*st_p = shoal_ucx_hello_send(ep)) != SHOAL_OK) {
            return -1;
        }
    }
    if (!ep->same_host) {
        return 1;
    }
    if (!ep->hello_rdone || !ep->hello_sdone) {
        return 0;
    }
    if (shoal_ucx_ctl_decode(ep->hello_rx, ep->hello_rlen, SHOAL_UCX_HELLO_MAGIC, &v) != 0 ||
        v > 1) {
        shoal_error(UCX, "peer %d: malformed HELLO (%zu bytes): refused", ep->peer,
                    ep->hello_rlen);
        *st_p = SHOAL_ERR_PROTOCOL;
        return -1;
    }
    ep->cma_tx = v == 1 && shoal_ucx_config.cma;
    return 1;
}

/* 1 if the peer's rank sent us a proof under another key (it holds another secret, or another
 * nonce of ours: another job, another communicator): dropped when progress() took it out of
 * UCX's unexpected queue (foreign_auth), or still there, never matched by any receive of
 * ours. */
static int shoal_ucx_lazy_refused(shoal_ep_t *ep)
{
    const ucp_tag_t rank_mask = (((ucp_tag_t)1 << SHOAL_UCX_RANK_BITS) - 1) << SHOAL_UCX_KEY_BITS;
    ucp_tag_recv_info_t info;
    ucp_tag_t tag = shoal_ucx_tag((ucp_tag_t)ep->peer << SHOAL_UCX_KEY_BITS, SHOAL_UCX_TAG_AUTH);
    return ep->foreign_auth ||
           ucp_tag_probe_nb(ep->ctx->worker, tag, rank_mask | ((ucp_tag_t)3 << 62), 0, &info) !=
               NULL;
}

/* Waits until every endpoint has exchanged proofs, or the deadline / abort. */
static shoal_status_t shoal_ucx_connect_wait(shoal_tl_ctx_t *ctx)
{
    uint64_t deadline = shoal_deadline_ns(ctx->timeout_ms);
    shoal_status_t st = SHOAL_OK;
    int first = 0;

    for (;;) {
        shoal_ucx_drain(ctx);
        (void)shoal_ucx_unexp_drain(ctx); /* what ranks that are done with theirs send */
        /* every endpoint moves on (proof checked, HELLO sent) while an earlier one waits */
        for (int i = first, pending = 0; i < ctx->neps; i++) {
            int r = shoal_ucx_ep_auth_check(&ctx->eps[i], &st);
            if (r < 0) {
                return st;
            }
            pending += r == 0;
            if (pending == 0) {
                first = i + 1;
            }
        }
        if (first == ctx->neps) {
            return SHOAL_OK;
        }
        if (shoal_aborted(ctx->abort_flag)) {
            shoal_warn(UCX, "rank %d: connection setup aborted while waiting for peer %d",
                       ctx->rank, ctx->eps[first].peer);
            return SHOAL_ERR_ABORTED;
        }
        if (shoal_deadline_passed(deadline)) {
            /* a pending peer whose rank only sent proofs under another key: refused, as
             * lazily (shoal_ucx_lazy_step), not a silent peer */
            for (int i = first; i < ctx->neps; i++) {
                if (!ctx->eps[i].auth_ok && shoal_ucx_lazy_refused(&ctx->eps[i])) {
                    shoal_error(UCX, "rank %d: no proof from peer %d within %d ms, only proofs "
                                "under another key claiming its rank (another job's, or a "
                                "process posing as it): refused", ctx->rank, ctx->eps[i].peer,
                                ctx->timeout_ms);
                    return SHOAL_ERR_AUTH;
                }
            }
            shoal_error(UCX, "rank %d: no proof from peer %d within %d ms", ctx->rank,
                        ctx->eps[first].peer, ctx->timeout_ms);
            return SHOAL_ERR_TIMEOUT;
        }
        if (ucp_worker_arm(ctx->worker) == UCS_OK) {
            struct pollfd pfd = {.fd = ctx->epfd, .events = POLLIN};
            (void)poll(&pfd, 1, shoal_deadline_left_ms(deadline, 10));
        }
    }
}

/* ---- connections at first use (params->lazy) ----------------------------------------------- */

/* connect_all of a lazy context: validates and keeps every address, posts the receive of every
 * peer's proof; opens no UCX endpoint and waits for nobody. */
static shoal_status_t shoal_ucx_lazy_connect(shoal_tl_ctx_t *ctx, const int *peers, int npeers,
                                             const void *const *addrs,
                                             const size_t *addr_lens, shoal_ep_t **eps_p)
{
    shoal_ucx_addr_t *as = calloc((size_t)SHOAL_MAX(npeers, 1), sizeof(*as));
    size_t total = 0, off = 0;
    shoal_status_t st = SHOAL_OK;

    ctx->lazy_q = calloc((size_t)SHOAL_MAX(npeers, 1), sizeof(*ctx->lazy_q));
    if (as == NULL || ctx->lazy_q == NULL) {
        free(as);
        shoal_error(UCX, "out of memory for %d lazy endpoints", npeers);
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int i = 0; i < npeers; i++) {
        if (shoal_ucx_addr_decode(addrs[i], addr_lens[i], &as[i]) != 0 ||
            as[i].rank != (uint32_t)peers[i]) {
            shoal_error(UCX, "peer %d published an invalid ucx address (%zu bytes)", peers[i],
                        addr_lens[i]);
            free(as);
            return SHOAL_ERR_PROTOCOL;
        }
        total += as[i].worker_len;
    }
    /* the caller's table goes after connect_all: keep the worker addresses */
    ctx->peer_workers = malloc(SHOAL_MAX(total, (size_t)1));
    if (ctx->peer_workers == NULL) {
        free(as);
        shoal_error(UCX, "out of memory for %d peers' worker addresses", npeers);
        return SHOAL_ERR_NO_MEMORY;
    }
    /* The slot buffers are not faulted in here: an endpoint's pages at its first use. */
    for (int i = 0; i < npeers && st == SHOAL_OK; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        ctx->neps = i + 1;
        st = shoal_ucx_ep_setup(ctx, i, peers[i], &as[i]);
        if (st != SHOAL_OK) {
            break;
        }
        memcpy(ctx->peer_workers + off, as[i].worker, as[i].worker_len);
        ep->peer_worker = ctx->peer_workers + off;
        ep->peer_worker_len = as[i].worker_len;
        off += as[i].worker_len;
        ep->lazy_state = SHOAL_UCX_LAZY_IDLE;
        ctx->lazy_idle++;
        st = shoal_ucx_ep_auth_post(ep);
    }
    free(as);
    if (st == SHOAL_OK) {
        st = shoal_ucx_by_rank_build(ctx);
    }
    if (st != SHOAL_OK) {
        return st;
    }
    for (int i = 0; i < npeers; i++) {
        eps_p[i] = &ctx->eps[i];
    }
    shoal_info(UCX, "rank %d: %d ucx peers, each connected at first use", ctx->rank, npeers);
    return SHOAL_OK;
}

void shoal_ucx_lazy_want(shoal_ep_t *ep)
{
    if (ep->lazy_state == SHOAL_UCX_LAZY_IDLE) {
        ep->ctx->lazy_want = 1;
        shoal_ucx_kick(ep->ctx);
    }
}

/* A same-host peer about to be opened, or whose open failed, has exited: 1, the endpoint
 * failed with that cause (completions in *n_p), whether or not a liveness check saw the exit
 * before. Checked before the open too: the exited peer left no FIFO to attach to, and UCX 1.13
 * leaks what it allocated for a failed attach (LeakSanitizer, 100 bytes in libuct). */
static int shoal_ucx_lazy_exited(shoal_ep_t *ep, int *n_p)
{
    if (!ep->local || ep->gone || !shoal_ucx_ep_peer_exited(ep)) {
        return 0;
    }
    shoal_ucx_ep_set_exited(ep, shoal_time_ns());
    *n_p = shoal_ucx_ep_fail_gone(ep);
    return 1;
}

/* Opens the UCX endpoint of an idle endpoint and sends our proof; the completions of a
 * failure. */
static int shoal_ucx_lazy_open(shoal_ep_t *ep, uint64_t now)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    shoal_status_t st;
    char why[160];
    int n = 0;

    ep->lazy_state = SHOAL_UCX_LAZY_OPEN;
    ep->lazy_start_ns = now;
    ctx->lazy_idle--;
    ctx->lazy_q[ctx->lazy_nq++] = (int)(ep - ctx->eps);
    if (shoal_ucx_lazy_exited(ep, &n)) {
        return n;
    }
    st = shoal_ucx_ep_create(ep, ep->peer_worker);
    if (st == SHOAL_OK) {
        st = shoal_ucx_ep_auth_send(ep);
    }
    if (st == SHOAL_OK) {
        return 0;
    }
    if (shoal_ucx_lazy_exited(ep, &n)) {
        return n;
    }
    snprintf(why, sizeof(why), "rank %d: connecting to peer %d failed: %s", ctx->rank, ep->peer,
             shoal_strerror(st));
    return shoal_ucx_ep_fail(ep, st, -1, why);
}

/* Our communicator failed, and the peer, which had no endpoint of ours, sent its proof (now, or
 * before the failure): if the proof is right, tell it why with an abort notice (best effort,
 * never waits), so that it fails now rather than at its timeout. */
static void shoal_ucx_lazy_notify_failed(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    uint8_t want[SHOAL_HMAC_BYTES];
    shoal_wire_hdr_t h = {
        .magic = SHOAL_WIRE_MAGIC,
        .version = SHOAL_WIRE_VERSION,
        .type = SHOAL_WIRE_ABORT,
        .comm_id = ctx->comm_id,
        .chunk = (uint32_t)(ep->culprit >= 0 ? ep->culprit : ctx->rank),
        .length = 0,
    };
    ucp_request_param_t p = {.op_attr_mask = 0};
    void *r;

    ep->lazy_state = SHOAL_UCX_LAZY_OPEN; /* once */
    ctx->lazy_idle--;
    if (ep->gone || ep->auth_ucs != UCS_OK || ep->auth_rlen != sizeof(want) ||
        shoal_ucx_proof(ctx, ep->peer, ctx->rank, ep->peer_nonce, ctx->nonce, want) !=
            SHOAL_OK ||
        !shoal_memeq_ct(want, ep->auth_rx, sizeof(want)) ||
        shoal_ucx_ep_create(ep, ep->peer_worker) != SHOAL_OK) {
        return;
    }
    shoal_wire_encode(&h, ep->abort_buf);
    r = ucp_tag_send_nbx(ep->uep, ep->abort_buf, sizeof(ep->abort_buf),
                         shoal_ucx_tag(ep->tx_tag, SHOAL_UCX_TAG_ABORT), &p);
    if (UCS_PTR_IS_PTR(r)) {
        ucp_request_free(r); /* UCX releases it when done, or when fini purges it */
    }
    shoal_trace(UCX, "rank %d: peer %d connects to a failed communicator: abort notice sent",
                ctx->rank, ep->peer);
}

void shoal_ucx_lazy_fail(shoal_tl_ctx_t *ctx)
{
    uint64_t deadline = shoal_time_ns() + 1000 * 1000;
    int sent = 0;
    for (int i = 0; i < ctx->neps && ctx->lazy_idle > 0; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->lazy_state == SHOAL_UCX_LAZY_IDLE && ep->auth_rdone) {
            shoal_ucx_lazy_notify_failed(ep);
            sent++;
        }
    }
    while (sent > 0 && shoal_time_ns() < deadline && ucp_worker_progress(ctx->worker) != 0) {
    }
}

/* Endpoint ep, opened: 1 when it is done with (authenticated or failed), else 0; the
 * completions of a failure in *n_p. */
static int shoal_ucx_lazy_step(shoal_ep_t *ep, uint64_t now, int aborted, int *n_p)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    shoal_status_t st = SHOAL_OK;
    char why[192];
    int r;

    if (ep->status != SHOAL_OK) {
        return 1;
    }
    if (ep->gone) {
        /* with requests: failed by shoal_ucx_ep_progress after its grace period; without:
         * now; either way the culprit named (an abort notice the peer sent before it went) */
        if (ep->npending == 0) {
            *n_p += shoal_ucx_ep_fail_gone(ep);
        }
        return ep->status != SHOAL_OK;
    }
    r = shoal_ucx_ep_auth_check(ep, &st);
    if (r == 1) {
        ep->lazy_state = SHOAL_UCX_LAZY_UP;
        ctx->lazy_nup++;
        shoal_trace(UCX, "rank %d: ucx endpoint to peer %d authenticated at first use after "
                    "%.1f ms (%d so far)", ctx->rank, ep->peer,
                    (double)(now - ep->lazy_start_ns) / 1e6, ctx->lazy_nup);
        shoal_ucx_ep_start_queued(ep);
        return 1;
    }
    if (r < 0) {
        snprintf(why, sizeof(why), "rank %d: authenticating peer %d failed: %s", ctx->rank,
                 ep->peer, shoal_strerror(st));
        *n_p += shoal_ucx_ep_fail(ep, st, -1, why);
        return 1;
    }
    if (aborted) {
        snprintf(why, sizeof(why), "rank %d: connection to peer %d aborted", ctx->rank,
                 ep->peer);
        shoal_warn(UCX, "%s", why);
        *n_p += shoal_ucx_ep_fail(ep, SHOAL_ERR_ABORTED, -1, why);
        return 1;
    }
    if (ctx->timeout_ms >= 0 && now - ep->lazy_start_ns > (uint64_t)ctx->timeout_ms * 1000000ull) {
        /* a peer that failed before it answered (and lives on) may have said why: its abort
         * notice decides (probed every ms only while requests wait on the endpoint) */
        if (shoal_ucx_ep_probe_abort(ep, n_p)) {
            return 1;
        }
        if (shoal_ucx_lazy_refused(ep)) {
            st = SHOAL_ERR_AUTH;
            /* Who sent it is unknown: a tag's rank bits are the sender's claim, and anyone
             * who reaches our worker can claim any rank. Say what was seen, not that the
             * peer (which may just be silent) holds another secret. */
            snprintf(why, sizeof(why), "rank %d: no proof from peer %d within %d ms, only "
                     "proofs under another key claiming its rank (another job's, or a process "
                     "posing as it): refused", ctx->rank, ep->peer, ctx->timeout_ms);
        } else {
            st = SHOAL_ERR_TIMEOUT;
            snprintf(why, sizeof(why), "rank %d: no proof from peer %d within %d ms", ctx->rank,
                     ep->peer, ctx->timeout_ms);
        }
        shoal_error(UCX, "%s", why);
        *n_p += shoal_ucx_ep_fail(ep, st, -1, why);
        return 1;
    }
    return 0;
}

int shoal_ucx_lazy_progress(shoal_tl_ctx_t *ctx)
{
    uint64_t now = shoal_time_ns();
    int n = 0;
    int aborted = shoal_aborted(ctx->abort_flag);

    if (ctx->lazy_want) {
        ctx->lazy_want = 0;
        for (int i = 0; i < ctx->neps && ctx->lazy_idle > 0; i++) {
            shoal_ep_t *ep = &ctx->eps[i];
            if (ep->lazy_state != SHOAL_UCX_LAZY_IDLE) {
                continue;
            }
            if (ep->status == SHOAL_OK && !ep->gone && aborted &&
                (ep->sq_head != NULL || ep->rq_head != NULL)) {
                char why[96];
                snprintf(why, sizeof(why), "rank %d: connection to peer %d aborted", ctx->rank,
                         ep->peer);
                n += shoal_ucx_ep_fail(ep, SHOAL_ERR_ABORTED, -1, why);
            } else if (ep->status == SHOAL_OK && !ep->gone && !aborted &&
                       (ep->auth_rdone || ep->sq_head != NULL || ep->rq_head != NULL)) {
                n += shoal_ucx_lazy_open(ep, now);
            } else if (ep->status != SHOAL_OK && ep->auth_rdone) {
                shoal_ucx_lazy_notify_failed(ep);
            }
        }
    }
    for (int k = 0; k < ctx->lazy_nq;) {
        if (shoal_ucx_lazy_step(&ctx->eps[ctx->lazy_q[k]], now, aborted, &n)) {
            ctx->lazy_q[k] = ctx->lazy_q[--ctx->lazy_nq];
        } else {
            k++;
        }
    }
    return n;
}

shoal_status_t shoal_ucx_connect_all(shoal_tl_ctx_t *ctx, const int *peers, int npeers,
                                     const void *const *addrs, const size_t *addr_lens,
                                     shoal_ep_t **eps_p)
{
    size_t slot_bytes = SHOAL_WIRE_HDR_BYTES +
                        SHOAL_MAX(ctx->inline_max, (size_t)SHOAL_UCX_CMA_DESC_BYTES);
    size_t mem = (size_t)npeers * 2 * SHOAL_UCX_SLOTS * slot_bytes;
    int ncma_rx = 0, ncma_tx = 0;
    shoal_status_t st;

    if (ctx->eps != NULL) {
        shoal_error(UCX, "connect_all called twice");
        return SHOAL_ERR_INTERNAL;
    }
    ctx->slot_bytes = slot_bytes;
    ctx->eps = calloc((size_t)SHOAL_MAX(npeers, 1), sizeof(*ctx->eps));
    ctx->live_pfds = calloc((size_t)SHOAL_MAX(npeers, 1), sizeof(*ctx->live_pfds));
    ctx->slot_mem = mem > 0 ? malloc(mem) : NULL;
    if (ctx->eps == NULL || ctx->live_pfds == NULL || (mem > 0 && ctx->slot_mem == NULL)) {
        shoal_error(UCX, "out of memory for %d endpoints", npeers);
        return SHOAL_ERR_NO_MEMORY;
    }
    if (ctx->lazy) {
        return shoal_ucx_lazy_connect(ctx, peers, npeers, addrs, addr_lens, eps_p);
    }
    memset(ctx->slot_mem, 0, mem); /* fault the slot buffers in now */
    for (int i = 0; i < npeers; i++) {
        shoal_ucx_addr_t a;
        if (shoal_ucx_addr_decode(addrs[i], addr_lens[i], &a) != 0 ||
            a.rank != (uint32_t)peers[i]) {
            shoal_error(UCX, "peer %d published an invalid ucx address (%zu bytes)", peers[i],
                        addr_lens[i]);
            return SHOAL_ERR_PROTOCOL;
        }
        ctx->neps = i + 1;
        SHOAL_CHECK(shoal_ucx_ep_open(ctx, i, peers[i], &a));
    }
    SHOAL_CHECK(shoal_ucx_by_rank_build(ctx));
    for (int i = 0; i < npeers; i++) {
        SHOAL_CHECK(shoal_ucx_ep_auth_start(&ctx->eps[i]));
    }
    st = shoal_ucx_connect_wait(ctx);
    if (st != SHOAL_OK) {
        return st;
    }
    for (int i = 0; i < npeers; i++) {
        eps_p[i] = &ctx->eps[i];
        ncma_rx += ctx->eps[i].cma_rx;
        ncma_tx += ctx->eps[i].cma_tx;
    }
    ctx->connected = 1;
    shoal_info(UCX, "rank %d: %d ucx endpoints authenticated; single copy from %d and to %d "
               "same-host peers", ctx->rank, npeers, ncma_rx, ncma_tx);
    return SHOAL_OK;
}
