/* UCX transport: context (UCP context and worker, published address), progress, liveness of
 * same-host peers, sleeping on the worker's event fd, failure, fini and the ops table.
 * Connection setup is in ucx_conn.c, the data path in ucx_ep.c. */
#include "transports/ucx/ucx.h"
#include "transports/ucx/ucx_query.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sched.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define SHOAL_UCX_LIVE_PERIOD_NS (1000ull * 1000) /* liveness check of local peers: 1 ms */
/* progress() reads the clock for that check every this many calls, and on the first call
 * after a sleep (wait_fd). A waiter that spins calls it every 50-100 ns, and the read (an
 * rdtsc: 7-8 ns in a VM) took about 2.4% of a 2-rank 8-byte AllReduce's time when every
 * call read it (perf). Waiters that do not spin sleep through wait_fd, or for at most 1 ms
 * on a futex of their own (an intra-node plan), so the check runs at least every 16 ms. */
#define SHOAL_UCX_CLOCK_POLLS 16u

const char *shoal_ucx_strerror(ucs_status_t st)
{
    return ucs_status_string(st);
}

void shoal_ucx_kick(shoal_tl_ctx_t *ctx)
{
    uint64_t one = 1;
    ctx->dirty = 1;
    if (!ctx->kicked && ctx->kick_fd >= 0) {
        ctx->kicked = 1;
        if (write(ctx->kick_fd, &one, sizeof(one)) != (ssize_t)sizeof(one)) {
            shoal_trace(UCX, "write(kick eventfd): %s", strerror(errno));
        }
    }
}

static int shoal_ucx_epoll_add(shoal_tl_ctx_t *ctx, int fd, const char *what)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        shoal_error(UCX, "epoll_ctl(add %s fd %d): %s", what, fd, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- fini ----------------------------------------------------------------------------------- */

/* Closes every endpoint (flushing the healthy ones), waits a bounded time for the closes.
 *
 * A context that gave its address out but whose connect_all did not complete (it failed, was
 * aborted, or was never called: a peer's setup may still be going on; lazily, one with an
 * endpoint opened whose proofs were not both checked) lingers, progressing
 * its worker for SHOAL_UCX_LINGER_MS even when nothing of ours is left, so that UCX's setup
 * messages (wireup REQ and REP, to and from peers that are in their own fini) leave its
 * endpoints' queues: UCX 1.13 (fixed in 1.14, openucx/ucx#8175) asserts, and aborts the
 * process, when the worker's destruction or a forced close purges a REQ or REP still
 * queued on an endpoint that carries them itself (a ud lane: keepalive or the active message
 * lane), which is where they wait until the peer's ud answers. Seen in tests/vm (ucxtl
 * section): the conformance suite's "connect" group, whose absent rank destroyed its worker
 * at once with replies queued, and whose connecting ranks destroyed theirs with requests
 * queued to it. A peer that never answers (dead, or gone before we linger) still leaves them
 * queued: that is out of our hands on UCX 1.13. */
static void shoal_ucx_close_all(shoal_tl_ctx_t *ctx)
{
    int close_ms = ctx->timeout_ms >= 0 ? SHOAL_MIN(ctx->timeout_ms, SHOAL_UCX_CLOSE_MS) :
                                          SHOAL_UCX_CLOSE_MS;
    int linger = ctx->addr_given && !ctx->connected;
    if (ctx->lazy && ctx->addr_given) {
        /* lazy: connect_all returns before any setup; what may be under way is an endpoint
         * opened whose proofs were not both checked */
        linger = 0;
        for (int i = 0; i < ctx->neps; i++) {
            linger |= ctx->eps[i].lazy_state == SHOAL_UCX_LAZY_OPEN;
        }
    }
    uint64_t deadline = shoal_deadline_ns(linger ? SHOAL_MAX(close_ms, SHOAL_UCX_LINGER_MS) :
                                                   close_ms);
    int left;
    if (linger) {
        shoal_info(UCX, "rank %d: connection setup did not complete: progressing the worker "
                   "for %d ms before its destruction", ctx->rank, SHOAL_UCX_LINGER_MS);
    }
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->auth_rreq != NULL) {
            ucp_request_cancel(ctx->worker, ep->auth_rreq);
        }
        if (ep->hello_rreq != NULL) {
            ucp_request_cancel(ctx->worker, ep->hello_rreq);
        }
        shoal_ucx_ep_cancel_reqs(ep);
        /* Transfers still in flight (a caller that tears down without waiting for them) are
         * purged: a rendezvous that the peer never completes cannot be flushed (a send the
         * peer never receives; a receive already matched, which the cancel did not end,
         * whose sender never sends the data), and UCX 1.13 asserts (aborts the process) when
         * the worker's destruction finds it on the endpoint after the close's deadline. */
        shoal_ucx_ep_close(ep, ep->status != SHOAL_OK || ep->gone || ep->npending > 0);
    }
    do {
        left = 0;
        shoal_ucx_drain(ctx);
        for (int i = 0; i < ctx->neps; i++) {
            shoal_ep_t *ep = &ctx->eps[i];
            if (ep->close_req != NULL && ucp_request_check_status(ep->close_req) !=
                                             UCS_INPROGRESS) {
                ucp_request_free(ep->close_req);
                ep->close_req = NULL;
            }
            left += ep->close_req != NULL || ep->auth_rreq != NULL || ep->auth_sreq != NULL ||
                    ep->hello_rreq != NULL || ep->hello_sreq != NULL;
        }
        if ((left > 0 || linger) && ucp_worker_arm(ctx->worker) == UCS_OK) {
            struct pollfd pfd = {.fd = ctx->epfd, .events = POLLIN};
            (void)poll(&pfd, 1, left > 0 ? 1 : shoal_deadline_left_ms(deadline, 10));
        }
    } while ((left > 0 || linger) && !shoal_deadline_passed(deadline));
    if (left > 0) {
        shoal_warn(UCX, "rank %d: %d endpoint(s) did not close within %d ms", ctx->rank, left,
                   linger ? SHOAL_MAX(close_ms, SHOAL_UCX_LINGER_MS) : close_ms);
    }
    /* A close still in progress is released now (UCX frees it when it ends): the worker's
     * destruction asserts on one that was not (seen with ud_verbs on Soft-RoCE, tests/vm,
     * where the close handshake outlasts SHOAL_UCX_CLOSE_MS). */
    for (int i = 0; i < ctx->neps; i++) {
        if (ctx->eps[i].close_req != NULL) {
            ucp_request_free(ctx->eps[i].close_req);
            ctx->eps[i].close_req = NULL;
        }
    }
}

static void shoal_ucx_fini(shoal_tl_ctx_t *ctx)
{
    if (ctx == NULL) {
        return;
    }
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ucx_unexp_release(&ctx->eps[i]); /* received (and freed) by the closes' drain */
    }
    while (ctx->unexp_free != NULL) {
        shoal_ucx_unexp_t *u = ctx->unexp_free;
        ctx->unexp_free = u->next;
        free(u);
    }
    if (ctx->worker != NULL && !ctx->quarantined) {
        shoal_ucx_close_all(ctx);
    } else {
        /* Quarantined (never progressed again): what is outstanding is cancelled (a receive
         * not matched ends at once) and every request released, as close_all does; one left
         * unreleased makes ucp_worker_destroy warn, and assert with ud_verbs. */
        for (int i = 0; i < ctx->neps; i++) {
            shoal_ep_t *ep = &ctx->eps[i];
            void **reqs[] = {&ep->auth_rreq, &ep->hello_rreq, &ep->auth_sreq, &ep->hello_sreq};
            if (ctx->worker != NULL) {
                shoal_ucx_ep_cancel_reqs(ep);
                for (size_t k = 0; k < SHOAL_ARRAY_SIZE(reqs); k++) {
                    if (*reqs[k] != NULL) {
                        ucp_request_cancel(ctx->worker, *reqs[k]);
                    }
                }
            }
            shoal_ucx_ep_close(ep, 1);
            if (ep->close_req != NULL) {
                ucp_request_free(ep->close_req);
                ep->close_req = NULL;
            }
        }
    }
    for (int i = 0; i < ctx->neps; i++) {
        if (ctx->eps[i].pidfd >= 0) {
            close(ctx->eps[i].pidfd);
        }
    }
    if (ctx->waddr != NULL) {
        ucp_worker_release_address(ctx->worker, ctx->waddr);
    }
    if (ctx->worker != NULL) {
        ucp_worker_destroy(ctx->worker);
    }
    if (ctx->uctx != NULL) {
        ucp_cleanup(ctx->uctx);
    }
    if (ctx->epfd >= 0) {
        close(ctx->epfd);
    }
    if (ctx->kick_fd >= 0) {
        close(ctx->kick_fd);
    }
    free(ctx->eps);
    free(ctx->live_pfds);
    free(ctx->slot_mem);
    free(ctx->lazy_q);
    free(ctx->peer_workers);
    free(ctx->by_rank);
    shoal_secret_wipe(ctx->secret, sizeof(ctx->secret)); /* not elided before the free */
    free(ctx);
}

/* ---- init ------------------------------------------------------------------------------------ */

/* UCX's own messages (its warnings, its errors: "shmat(...) failed" when a peer is gone),
 * which UCX prints to stdout unless UCX_LOG_FILE says otherwise: shoal's log instead, stderr or
 * SHOAL_DEBUG_FILE (the library never writes to the application's stdout). UCX_LOG_LEVEL
 * still decides which are passed on. */
static ucs_log_func_rc_t shoal_ucx_log_cb(const char *file, unsigned line, const char *function,
                                          ucs_log_level_t level,
                                          const ucs_log_component_config_t *comp_conf,
                                          const char *fmt, va_list ap)
{
    const char *base = strrchr(file, '/');
    const char *tag = level <= UCS_LOG_LEVEL_ERROR  ? "ERROR" :
                      level == UCS_LOG_LEVEL_WARN   ? "WARN" :
                      level <= UCS_LOG_LEVEL_INFO   ? "INFO" : "TRACE";
    char msg[400];
    va_list aq;

    (void)function;
    (void)comp_conf;
    va_copy(aq, ap);
    vsnprintf(msg, sizeof(msg), fmt, aq);
    va_end(aq);
    shoal_log_emit(level <= UCS_LOG_LEVEL_WARN ? SHOAL_LOG_WARN : SHOAL_LOG_INFO, tag,
                   SHOAL_SUBSYS_BIT_UCX, __FILE__, __LINE__, "ucx %s:%u: %s",
                   base != NULL ? base + 1 : file, line, msg);
    return UCS_LOG_FUNC_RC_STOP;
}

/* UCX's handler stack with ours on top, once pushed: 0 if it was not */
static unsigned shoal_ucx_log_depth;

static void shoal_ucx_log_push(void)
{
    if (shoal_cfg_getenv_raw("UCX_LOG_FILE") == NULL) {
        unsigned before = ucs_log_num_handlers();
        ucs_log_push_handler(shoal_ucx_log_cb);
        if (ucs_log_num_handlers() == before + 1) {
            shoal_ucx_log_depth = before + 1;
        }
    }
}

/* libshoal unloaded (dlclose), or the process exiting: libucp stays loaded (never dlclosed,
 * and another user of UCX in the process may hold it), so UCX's next message would call our
 * handler in unmapped code (SIGSEGV). Popped only while it is still on top: UCX can remove
 * nothing else, and a handler pushed after ours must not be popped instead (a handler left
 * below another one that stops every message is never called). */
__attribute__((destructor)) static void shoal_ucx_log_unload(void)
{
    if (shoal_ucx_log_depth != 0 && ucs_log_num_handlers() == shoal_ucx_log_depth) {
        ucs_log_pop_handler();
    }
    shoal_ucx_log_depth = 0;
}

void shoal_ucx_log_redirect(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, shoal_ucx_log_push);
}

/* A UCX shared-memory setting of ours, unless the user set it (for mm, sysv or posix). */
static void shoal_ucx_config_mm(ucp_config_t *cfg, const char *name, const char *value)
{
    static const char *const pfx[] = {"UCX_MM_", "UCX_SYSV_", "UCX_POSIX_"};
    char var[64];
    ucs_status_t st;

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(pfx); i++) {
        snprintf(var, sizeof(var), "%s%s", pfx[i], name);
        if (shoal_cfg_getenv_raw(var) != NULL) {
            return;
        }
    }
    snprintf(var, sizeof(var), "MM_%s", name);
    st = ucp_config_modify(cfg, var, value);
    if (st != UCS_OK) {
        shoal_info(UCX, "UCX_%s=%s not accepted (%s): UCX keeps its own", var, value,
                   shoal_ucx_strerror(st));
    }
}

/* UCX's shared-memory transports, unless the user chose, or chose UCX_TLS without shared
 * memory (UCX warns about a setting of an unused transport; a list of exclusions, "^tcp",
 * leaves shared memory in unless it names it):
 *  - UCX leaves them out of endpoints with peer error handling unless MM_ERROR_HANDLING is
 *    set: turn it on;
 *  - a message that fits a receive FIFO element travels in it (UCX's short protocol); a
 *    larger one takes a separate buffer and descriptor (bcopy). With UCX's 128-byte elements
 *    a 64 B payload behind shoal's header (32 bytes then, 12 now) no longer fitted, where
 *    Open MPI's (tag only) did: 2-rank 8 B-512 B AllReduce took 1.4-2.0 us from 64 B up
 *    against 1.1-1.5 with 2 KiB elements, and 8-32 B were unchanged (5 alternating runs,
 *    perf/results/ucx-fifo-2026-12-03.txt). 2 KiB elements hold payloads up to about
 *    1.9 KiB; the FIFO's 64 elements then take 128 KiB per worker. */
static void shoal_ucx_config_tune(ucp_config_t *cfg)
{
    static const char *const shm_names[] = {"sysv", "posix", "mm", "sm", "shm", "all"};
    const char *tls = shoal_cfg_getenv_raw("UCX_TLS");
    int shm = tls == NULL;

    if (tls != NULL && tls[0] == '^') {
        /* a list of exclusions ("^tcp"): shared memory is used unless it excludes all of it
         * (sm, shm, mm, or both sysv and posix) */
        shm = strstr(tls, "sm") == NULL && strstr(tls, "mm") == NULL &&
              (strstr(tls, "sysv") == NULL || strstr(tls, "posix") == NULL);
    } else {
        for (size_t i = 0; tls != NULL && i < SHOAL_ARRAY_SIZE(shm_names) && !shm; i++) {
            shm = strstr(tls, shm_names[i]) != NULL;
        }
    }
    if (shm) {
        shoal_ucx_config_mm(cfg, "ERROR_HANDLING", "y");
        shoal_ucx_config_mm(cfg, "FIFO_ELEM_SIZE", "2048");
    }
}

static int shoal_ucx_have_rdma(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    struct dirent *e;
    int n = 0;

    while (d != NULL && (e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    if (d != NULL) {
        closedir(d);
    }
    return n > 0;
}

/* The communicator's QoS class as UCX's traffic class on IB / RoCE (per context and worker,
 * so per communicator); an explicit UCX_IB_TRAFFIC_CLASS wins. */
static void shoal_ucx_config_qos(shoal_tl_ctx_t *ctx, ucp_config_t *cfg)
{
    char v[16];
    ucs_status_t st;

    if (ctx->qos_ib_tc < 0 || shoal_cfg_getenv_raw("UCX_IB_TRAFFIC_CLASS") != NULL ||
        !shoal_ucx_have_rdma()) {
        return; /* without an RDMA device UCX warns that the key is unused */
    }
    snprintf(v, sizeof(v), "%d", ctx->qos_ib_tc);
    st = ucp_config_modify(cfg, "IB_TRAFFIC_CLASS", v);
    if (st != UCS_OK) {
        shoal_warn_once(UCX, "UCX_IB_TRAFFIC_CLASS=%s not accepted (%s): UCX keeps its own "
                        "traffic class", v, shoal_ucx_strerror(st));
    }
}

static shoal_status_t shoal_ucx_ctx_ucp(shoal_tl_ctx_t *ctx, int nranks)
{
    ucp_config_t *cfg;
    ucp_params_t up = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
        .estimated_num_eps = (size_t)nranks,
        .mt_workers_shared = 0,
    };
    /* One thread at a time, not always the same one (the core's proxy thread). */
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);

    if (st != UCS_OK) {
        shoal_error(UCX, "ucp_config_read failed: %s", shoal_ucx_strerror(st));
        return SHOAL_ERR_TRANSPORT;
    }
    shoal_ucx_config_tune(cfg);
    shoal_ucx_config_qos(ctx, cfg);
    st = ucp_init(&up, cfg, &ctx->uctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        ctx->uctx = NULL;
        shoal_error(UCX, "ucp_init failed: %s", shoal_ucx_strerror(st));
        return SHOAL_ERR_TRANSPORT;
    }
    st = ucp_worker_create(ctx->uctx, &wp, &ctx->worker);
    if (st != UCS_OK) {
        ctx->worker = NULL;
        shoal_error(UCX, "ucp_worker_create failed: %s", shoal_ucx_strerror(st));
        return SHOAL_ERR_TRANSPORT;
    }
    return SHOAL_OK;
}

/* The worker's address, or its network-only part when the whole does not fit. */
static shoal_status_t shoal_ucx_ctx_address(shoal_tl_ctx_t *ctx)
{
    size_t room = SHOAL_TL_ADDR_MAX - SHOAL_UCX_ADDR_HDR_BYTES;
    ucp_worker_attr_t attr = {
        .field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS,
        .address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY,
    };
    size_t full;
    ucs_status_t st = ucp_worker_get_address(ctx->worker, &ctx->waddr, &ctx->waddr_len);

    if (st != UCS_OK) {
        ctx->waddr = NULL;
        shoal_error(UCX, "ucp_worker_get_address failed: %s", shoal_ucx_strerror(st));
        return SHOAL_ERR_TRANSPORT;
    }
    if (ctx->waddr_len <= room) {
        return SHOAL_OK;
    }
    full = ctx->waddr_len;
    ucp_worker_release_address(ctx->worker, ctx->waddr);
    ctx->waddr = NULL;
    st = ucp_worker_query(ctx->worker, &attr);
    if (st != UCS_OK || attr.address_length > room) {
        if (st == UCS_OK) {
            ucp_worker_release_address(ctx->worker, attr.address);
        }
        shoal_error(UCX, "the UCX worker address has %zu bytes (%zu network only), more than "
                    "the %zu a transport address may have: restrict UCX_TLS / UCX_NET_DEVICES",
                    full, st == UCS_OK ? attr.address_length : (size_t)0, room);
        return SHOAL_ERR_UNSUPPORTED;
    }
    shoal_warn_once(UCX, "the UCX worker address (%zu bytes) exceeds %zu: publishing its "
                    "network part only (%zu bytes); UCX shared memory is not used",
                    full, room, attr.address_length);
    ctx->waddr = attr.address;
    ctx->waddr_len = attr.address_length;
    ctx->waddr_net_only = 1;
    return SHOAL_OK;
}

static shoal_status_t shoal_ucx_ctx_fds(shoal_tl_ctx_t *ctx)
{
    ucs_status_t st = ucp_worker_get_efd(ctx->worker, &ctx->ucx_efd);
    if (st != UCS_OK) {
        shoal_error(UCX, "ucp_worker_get_efd failed: %s", shoal_ucx_strerror(st));
        return SHOAL_ERR_TRANSPORT;
    }
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->epfd < 0 || ctx->kick_fd < 0) {
        shoal_error(UCX, "epoll_create1/eventfd failed: %s", strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    if (shoal_ucx_epoll_add(ctx, ctx->ucx_efd, "ucx worker") != 0 ||
        shoal_ucx_epoll_add(ctx, ctx->kick_fd, "kick") != 0) {
        return SHOAL_ERR_SYSTEM;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_ucx_init(const shoal_tl_params_t *params, shoal_tl_ctx_t **ctx_p)
{
    shoal_tl_ctx_t *ctx;
    shoal_status_t status;

    if (shoal_tl_lib_load(&shoal_ucx_lib) != SHOAL_OK) {
        shoal_error(UCX, "the ucx transport is unusable: %s", shoal_ucx_lib.why);
        return SHOAL_ERR_UNSUPPORTED;
    }
    shoal_ucx_log_redirect();
    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        shoal_error(UCX, "out of memory allocating the ucx context");
        return SHOAL_ERR_NO_MEMORY;
    }
    ctx->epfd = ctx->kick_fd = ctx->ucx_efd = -1;
    ctx->notice_culprit = ctx->first_gone = -1;
    ctx->rank = params->rank;
    ctx->nranks = params->nranks;
    ctx->comm_id = params->comm_id;
    memcpy(ctx->secret, params->secret, SHOAL_SECRET_BYTES);
    ctx->timeout_ms = params->timeout_ms;
    ctx->qos_ib_tc = params->qos_valid ? params->qos_ib_tc : -1;
    ctx->abort_flag = params->abort_flag;
    ctx->lazy = params->lazy;
    /* derived (src/tune through core, explicit settings applied), else the variable */
    ctx->inline_max = params->sizes != NULL && params->sizes->ucx_inline_max != 0
                          ? (size_t)params->sizes->ucx_inline_max : shoal_ucx_config.inline_max;
    if (ctx->inline_max > SHOAL_UCX_INLINE_CAP) {
        /* each of an endpoint's 32 slots holds one inline message */
        shoal_warn(UCX, "SHOAL_UCX_INLINE_MAX=%zu is above the ucx transport's limit: payloads "
                   "of up to 1 MiB travel inline", ctx->inline_max);
        ctx->inline_max = SHOAL_UCX_INLINE_CAP;
    }
    ctx->cma_min = params->sizes != NULL && params->sizes->ucx_cma_min != 0
                       ? (size_t)params->sizes->ucx_cma_min : shoal_ucx_config.cma_min;
    if (params->nranks > (1 << SHOAL_UCX_RANK_BITS)) {
        shoal_error(UCX, "%d ranks: the ucx transport's tags hold at most %d", params->nranks,
                    1 << SHOAL_UCX_RANK_BITS);
        status = SHOAL_ERR_UNSUPPORTED;
        goto err_free;
    }
    SHOAL_CHECK_GOTO(shoal_random_bytes(ctx->nonce, sizeof(ctx->nonce)), status, err_free);
    SHOAL_CHECK_GOTO(shoal_ucx_ctx_ucp(ctx, params->nranks), status, err_free);
    SHOAL_CHECK_GOTO(shoal_ucx_ctx_address(ctx), status, err_free);
    SHOAL_CHECK_GOTO(shoal_ucx_ctx_fds(ctx), status, err_free);
    shoal_info(UCX, "rank %d: ucx worker ready, address %zu bytes%s, inline up to %zu bytes, "
               "single copies to same-host peers %s %zu bytes", ctx->rank, ctx->waddr_len,
               ctx->waddr_net_only ? " (network only)" : "", ctx->inline_max,
               shoal_ucx_config.cma ? "from" : "never (SHOAL_UCX_CMA=n), else from",
               SHOAL_MAX(ctx->cma_min, ctx->inline_max + 1));
    *ctx_p = ctx;
    return SHOAL_OK;

err_free:
    shoal_ucx_fini(ctx);
    return status;
}

static shoal_status_t shoal_ucx_address(shoal_tl_ctx_t *ctx, void *addr, size_t *len_p)
{
    size_t len = shoal_ucx_addr_encode(ctx, addr, *len_p);
    if (len == 0) {
        shoal_error(UCX, "address buffer of %zu bytes, need %zu", *len_p,
                    SHOAL_UCX_ADDR_HDR_BYTES + ctx->waddr_len);
        return SHOAL_ERR_INVALID_ARG;
    }
    *len_p = len;
    ctx->addr_given = 1;
    return SHOAL_OK;
}

/* ---- progress, liveness, sleeping ------------------------------------------------------------ */

void shoal_ucx_drain(shoal_tl_ctx_t *ctx)
{
    for (int i = 0; i < SHOAL_UCX_DRAIN_CALLS && ucp_worker_progress(ctx->worker) != 0; i++) {
    }
}

void shoal_ucx_ep_log_gone(const shoal_ep_t *ep, const char *why)
{
    if (ep->npending > 0) {
        shoal_error(UCX, "%s", why);
    } else {
        /* A peer that finished its last call before this rank and left: not an error unless
         * a request needs it, which then fails with this cause (the failure is logged). */
        shoal_info(UCX, "%s (no request pending on it)", why);
    }
}

int shoal_ucx_ep_peer_exited(const shoal_ep_t *ep)
{
    if (ep->pidfd >= 0) {
        struct pollfd p = {.fd = ep->pidfd, .events = POLLIN};
        return poll(&p, 1, 0) > 0;
    }
    return kill((pid_t)ep->pid, 0) != 0 && errno == ESRCH;
}

/* Same-host peer ep's process has exited: stop watching it. Its pidfd is readable for good
 * now: out of the sleepers' epoll set (else every sleep would end at once) and the liveness
 * poll. */
static void shoal_ucx_ep_unwatch(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    if (ep->pidfd >= 0) {
        (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ep->pidfd, NULL);
        ctx->live_pfds[ep - ctx->eps].fd = -1;
    }
    ep->local = 0;
}

void shoal_ucx_ep_set_exited(shoal_ep_t *ep, uint64_t pass_ns)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    char why[192];

    shoal_ucx_drain(ctx);
    snprintf(why, sizeof(why), "peer %d (pid %u) exited", ep->peer, ep->pid);
    if (ep->status == SHOAL_OK) {
        shoal_ucx_ep_log_gone(ep, why);
    }
    shoal_ucx_ep_unwatch(ep);
    shoal_ucx_ep_set_gone(ep, why);
    ep->gone_ns = pass_ns;
    if (ctx->first_gone == ep->peer) {
        ctx->first_gone_ns = pass_ns;
    }
}

/* Same-host peers whose process exited are gone (after draining what they sent us). */
static void shoal_ucx_check_live(shoal_tl_ctx_t *ctx)
{
    uint64_t pass_ns = shoal_time_ns(); /* peers found gone in one pass: no order among them */
    int dead = 0;
    if (poll(ctx->live_pfds, (nfds_t)ctx->neps, 0) > 0) {
        dead = 1;
    }
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        int gone = 0;
        /* a peer seen gone otherwise first (UCX's error callback: over tcp, a killed peer is
         * an "Endpoint timeout") is still watched until its exit shows */
        if (!ep->local || (ep->gone && ep->pidfd < 0)) {
            continue;
        }
        if (ep->pidfd >= 0) {
            gone = dead && (ctx->live_pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
        } else {
            gone = shoal_ucx_ep_peer_exited(ep); /* no pidfd: kill(pid, 0) */
        }
        if (gone && ep->gone) {
            shoal_ucx_ep_unwatch(ep);
        } else if (gone) {
            shoal_ucx_ep_set_exited(ep, pass_ns);
        }
    }
}

static int shoal_ucx_progress(shoal_tl_ctx_t *ctx)
{
    int n = 0, tick = 0;
    unsigned got;
    if (ctx->kicked) {
        uint64_t v;
        ctx->kicked = 0;
        (void)read(ctx->kick_fd, &v, sizeof(v));
    }
    if (SHOAL_UNLIKELY(ctx->quarantined)) {
        /* fail every endpoint still open: nothing can complete any more */
        for (int i = 0; i < ctx->neps; i++) {
            n += shoal_ucx_ep_fail(&ctx->eps[i], SHOAL_ERR_TRANSPORT, -1,
                                   "the ucx context failed earlier");
        }
        return n;
    }
    /* Once per call, as Open MPI's pml ucx: a call that found events would be followed by
     * one that finds none, on the path from an arrival to its completion (UCX polls several
     * FIFO entries per call; what is left is found by the next call). */
    got = ucp_worker_progress(ctx->worker);
    if (ctx->nevents != 0) {
        ctx->dirty = 1;
        ctx->nevents = 0;
    }
    if (ctx->neps > 0 && ++ctx->clock_polls >= SHOAL_UCX_CLOCK_POLLS) {
        /* the call path's clock (one rdtsc, half a clock_gettime in a VM); only compared with
         * itself, a jump back ticks at once */
        uint64_t now = shoal_ticks_ns(shoal_ticks());
        ctx->clock_polls = 0;
        if (now >= ctx->next_live_ns || ctx->next_live_ns - now > SHOAL_UCX_LIVE_PERIOD_NS) {
            /* every ms: liveness of same-host peers, abort notices */
            ctx->next_live_ns = now + SHOAL_UCX_LIVE_PERIOD_NS;
            tick = 1;
            shoal_ucx_check_live(ctx);
        }
    }
    if (got != 0 || tick) {
        /* messages that found no receive: held for it, or dropped (see ucx.h); also those
         * that came within other progress calls (the tick) */
        n += shoal_ucx_unexp_drain(ctx);
    }
    if (ctx->lazy_want || ctx->lazy_nq > 0) {
        n += shoal_ucx_lazy_progress(ctx); /* connections at first use */
        ctx->dirty = 1;
    }
    if (!ctx->dirty && !tick) {
        return n; /* no completion, nothing posted: no endpoint has anything to do */
    }
    ctx->dirty = 0;
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->npending > 0 || ep->post_failed || ep->gone_fresh) {
            n += shoal_ucx_ep_progress(ep, tick);
        }
    }
    return n;
}

/* Arms the worker so that its event fd (inside our epoll fd) wakes a sleeper; if events are
 * already there, makes the epoll fd readable at once instead. */
static int shoal_ucx_wait_fd(shoal_tl_ctx_t *ctx)
{
    if (ctx->quarantined) {
        return -1;
    }
    ctx->clock_polls = SHOAL_UCX_CLOCK_POLLS; /* after the sleep: the clock at once */
    for (int i = 0; i < 4 && ctx->nevents == 0; i++) {
        ucs_status_t st = ucp_worker_arm(ctx->worker);
        if (st == UCS_OK) {
            return ctx->epfd;
        }
        if (st != UCS_ERR_BUSY) {
            shoal_warn_once(UCX, "ucp_worker_arm failed: %s", shoal_ucx_strerror(st));
            break;
        }
        (void)ucp_worker_progress(ctx->worker);
    }
    shoal_ucx_kick(ctx);
    return ctx->epfd;
}

/* Sends every peer an abort notice, gives them a bounded time to arrive
 * (shoal_ucx_notices_deliver), then fails every endpoint. */
static void shoal_ucx_fail(shoal_tl_ctx_t *ctx, int culprit, shoal_status_t status)
{
    char why[128];

    snprintf(why, sizeof(why), "communicator failed because of rank %d", culprit);
    for (int i = 0; i < ctx->neps && !ctx->quarantined; i++) {
        shoal_ucx_ep_send_abort(&ctx->eps[i], culprit);
    }
    shoal_ucx_notices_deliver(ctx, NULL);
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->status == SHOAL_OK) {
            (void)shoal_ucx_ep_fail(ep, status, culprit, why);
        }
    }
    if (ctx->lazy && !ctx->quarantined) {
        shoal_ucx_lazy_fail(ctx); /* peers that connected to us first */
    }
}

const shoal_tl_ops_t shoal_tl_ucx_ops = {
    .abi_version = SHOAL_TL_ABI_VERSION,
    .name = "ucx",
    .caps = SHOAL_TL_CAP_LAZY,
    .intra_node_only = 0,
    .query = shoal_ucx_query,
    .init = shoal_ucx_init,
    .address = shoal_ucx_address,
    .connect_all = shoal_ucx_connect_all,
    .ready = NULL,
    .isend = shoal_ucx_ep_isend,
    .irecv = shoal_ucx_ep_irecv,
    .progress = shoal_ucx_progress,
    .wait_fd = shoal_ucx_wait_fd,
    .wait = NULL,
    .fail = shoal_ucx_fail,
    .fini = shoal_ucx_fini,
};
