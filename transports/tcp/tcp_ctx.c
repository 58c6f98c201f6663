/* TCP transport: context (interface choice, listener, epoll), address codecs, progress,
 * sleeping, failure and the ops table. Connection setup is in tcp_conn.c, the data path in
 * tcp_ep.c. */
#include "transports/tcp/tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <ifaddrs.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define SHOAL_TCP_BACKLOG 4096

/* ---- codecs ------------------------------------------------------------------------------ */

void shoal_tcp_addr_encode(const shoal_tcp_addr_t *a, uint8_t *out)
{
    memset(out, 0, SHOAL_TCP_ADDR_BYTES);
    shoal_put_le(out + 0, SHOAL_TCP_ADDR_MAGIC, 4);
    shoal_put_le(out + 4, a->family, 2);
    shoal_put_le(out + 6, a->port, 2);
    shoal_put_le(out + 8, a->scope_id, 4);
    memcpy(out + 12, a->ip, 16);
    shoal_put_le(out + 28, a->nsocks, 4);
    shoal_put_le(out + 32, a->min_split, 8);
    shoal_put_le(out + 40, a->pid, 4);
}

int shoal_tcp_addr_decode(const void *in, size_t len, shoal_tcp_addr_t *a)
{
    const uint8_t *p = in;
    if (in == NULL || len != SHOAL_TCP_ADDR_BYTES ||
        shoal_get_le(p, 4) != SHOAL_TCP_ADDR_MAGIC) {
        return -1;
    }
    a->family = (uint16_t)shoal_get_le(p + 4, 2);
    a->port = (uint16_t)shoal_get_le(p + 6, 2);
    a->scope_id = (uint32_t)shoal_get_le(p + 8, 4);
    memcpy(a->ip, p + 12, 16);
    a->nsocks = (uint32_t)shoal_get_le(p + 28, 4);
    a->min_split = shoal_get_le(p + 32, 8);
    a->pid = (uint32_t)shoal_get_le(p + 40, 4);
    if ((a->family != AF_INET && a->family != AF_INET6) || a->port == 0 || a->nsocks == 0 ||
        a->nsocks > SHOAL_TCP_MAX_SOCKS) {
        return -1;
    }
    return 0;
}

void shoal_tcp_addr_sockaddr(const shoal_tcp_addr_t *a, struct sockaddr_storage *ss,
                             socklen_t *len_p)
{
    memset(ss, 0, sizeof(*ss));
    if (a->family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(a->port);
        memcpy(&sin->sin_addr, a->ip, 4);
        *len_p = sizeof(*sin);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(a->port);
        sin6->sin6_scope_id = a->scope_id;
        memcpy(&sin6->sin6_addr, a->ip, 16);
        *len_p = sizeof(*sin6);
    }
}

void shoal_tcp_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, ntohs(sin->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof(ip));
        snprintf(buf, len, "[%s]:%u", ip, ntohs(sin6->sin6_port));
    } else {
        snprintf(buf, len, "(family %d)", sa->sa_family);
    }
}

void shoal_tcp_hello_encode(const shoal_tcp_hello_t *h, uint8_t out[SHOAL_TCP_HELLO_BYTES])
{
    shoal_put_le(out + 0, h->magic, 4);
    shoal_put_le(out + 4, h->version, 2);
    shoal_put_le(out + 6, h->length, 2);
    shoal_put_le(out + 8, h->comm_id, 4);
    shoal_put_le(out + 12, h->rank, 4);
    shoal_put_le(out + 16, h->sock_idx, 4);
    shoal_put_le(out + 20, h->nsocks, 4);
    memcpy(out + 24, h->nonce, SHOAL_TCP_NONCE_BYTES);
}

void shoal_tcp_hello_decode(const uint8_t in[SHOAL_TCP_HELLO_BYTES], shoal_tcp_hello_t *h)
{
    h->magic = (uint32_t)shoal_get_le(in + 0, 4);
    h->version = (uint16_t)shoal_get_le(in + 4, 2);
    h->length = (uint16_t)shoal_get_le(in + 6, 2);
    h->comm_id = (uint32_t)shoal_get_le(in + 8, 4);
    h->rank = (uint32_t)shoal_get_le(in + 12, 4);
    h->sock_idx = (uint32_t)shoal_get_le(in + 16, 4);
    h->nsocks = (uint32_t)shoal_get_le(in + 20, 4);
    memcpy(h->nonce, in + 24, SHOAL_TCP_NONCE_BYTES);
}

shoal_status_t shoal_tcp_proof(const uint8_t *secret, const char *label,
                               const shoal_tcp_transcript_t *t, uint8_t out[SHOAL_HMAC_BYTES])
{
    uint8_t msg[32 + 1 + 4 + 2 * SHOAL_TCP_NONCE_BYTES + 16];
    size_t llen = strnlen(label, 32);
    size_t off = llen;

    memcpy(msg, label, llen);
    msg[off++] = 0; /* the label ends here: no label is a prefix of another's message */
    shoal_put_le(msg + off, t->comm_id, 4);
    off += 4;
    memcpy(msg + off, t->nonce_c, SHOAL_TCP_NONCE_BYTES);
    off += SHOAL_TCP_NONCE_BYTES;
    memcpy(msg + off, t->nonce_a, SHOAL_TCP_NONCE_BYTES);
    off += SHOAL_TCP_NONCE_BYTES;
    shoal_put_le(msg + off, t->from, 4);
    shoal_put_le(msg + off + 4, t->to, 4);
    shoal_put_le(msg + off + 8, t->sock_idx, 4);
    shoal_put_le(msg + off + 12, t->nsocks, 4);
    off += 16;
    return shoal_hmac(secret, SHOAL_SECRET_BYTES, msg, off, out);
}

/* ---- interface choice (NCCL's SOCKET_IFNAME semantics) ---------------------------------- */

/* Scans the interfaces once for one family; pass 0 wants non-loopback non-docker, 1 docker,
 * 2 loopback (only when no spec is given). */
static int shoal_tcp_scan(struct ifaddrs *list, const char *spec, int family, int pass,
                          struct sockaddr_storage *ss, char *ifname, size_t iflen)
{
    for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != family ||
            (ifa->ifa_flags & IFF_UP) == 0) {
            continue;
        }
        if (family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr)) {
            continue;
        }
        int loop = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
        int docker = strncmp(ifa->ifa_name, "docker", 6) == 0;
        if (spec != NULL) {
            if (!shoal_ifname_match(spec, ifa->ifa_name)) {
                continue;
            }
        } else if ((pass == 0 && (loop || docker)) || (pass == 1 && (loop || !docker)) ||
                   (pass == 2 && !loop)) {
            continue;
        }
        memcpy(ss, ifa->ifa_addr,
               family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
        snprintf(ifname, iflen, "%s", ifa->ifa_name);
        return 1;
    }
    return 0;
}

static shoal_status_t shoal_tcp_pick_addr(struct sockaddr_storage *ss, char *ifname,
                                          size_t iflen)
{
    const char *spec = shoal_tcp_config.ifname;
    int fams[2], nfam = 0;
    struct ifaddrs *list;

    if (spec != NULL && spec[0] == '\0') {
        spec = NULL;
    }
    if (shoal_tcp_config.family != SHOAL_TCP_FAMILY_INET6) {
        fams[nfam++] = AF_INET;
    }
    if (shoal_tcp_config.family != SHOAL_TCP_FAMILY_INET) {
        fams[nfam++] = AF_INET6;
    }
    if (getifaddrs(&list) != 0) {
        shoal_error(TCP, "getifaddrs() failed: %s", strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    int found = 0;
    for (int pass = 0; pass < (spec != NULL ? 1 : 3) && !found; pass++) {
        for (int f = 0; f < nfam && !found; f++) {
            found = shoal_tcp_scan(list, spec, fams[f], pass, ss, ifname, iflen);
        }
    }
    freeifaddrs(list);
    if (!found) {
        /* The family by the name the user sets: its enum index read as AF_INET's 2 for
         * AF_INET6. */
        shoal_error(TCP, "no usable interface (SHOAL_SOCKET_IFNAME=\"%s\", "
                    "SHOAL_SOCKET_FAMILY=%s): none is up with an address of that family",
                    spec != NULL ? spec : "",
                    shoal_tcp_config.family == SHOAL_TCP_FAMILY_INET    ? "AF_INET"
                    : shoal_tcp_config.family == SHOAL_TCP_FAMILY_INET6 ? "AF_INET6"
                                                                        : "any");
        return SHOAL_ERR_TRANSPORT;
    }
    return SHOAL_OK;
}

/* ---- context ----------------------------------------------------------------------------- */

shoal_status_t shoal_tcp_socket_setopts(shoal_tl_ctx_t *ctx, int fd, int data)
{
    int one = 1;
    if (ctx->sndbuf != 0) {
        int v = (int)SHOAL_MIN(ctx->sndbuf, (size_t)1 << 30);
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v)) != 0) {
            shoal_warn(TCP, "setsockopt(fd %d, SO_SNDBUF, %d): %s", fd, v, strerror(errno));
        }
    }
    if (ctx->rcvbuf != 0) {
        int v = (int)SHOAL_MIN(ctx->rcvbuf, (size_t)1 << 30);
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)) != 0) {
            shoal_warn(TCP, "setsockopt(fd %d, SO_RCVBUF, %d): %s", fd, v, strerror(errno));
        }
    }
    if (data && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        shoal_error(TCP, "setsockopt(fd %d, TCP_NODELAY): %s", fd, strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    /* From the first packet on (SYN, handshake): the marks; the pacing rate once the
     * endpoint's socket count is known (shoal_tcp_hs_establish). */
    shoal_tcp_socket_qos(ctx, fd, 0);
    return SHOAL_OK;
}

void shoal_tcp_socket_qos(shoal_tl_ctx_t *ctx, int fd, uint64_t rate)
{
    int family = AF_INET;
    socklen_t flen = sizeof(family);

    if (ctx->qos_dscp >= 0) {
        int tos = ctx->qos_dscp << 2;
        (void)getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &flen);
        if ((family == AF_INET6
                 ? setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof(tos))
                 : setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos))) != 0) {
            shoal_warn_once(TCP, "setsockopt(fd %d, %s, 0x%x): %s; the sockets keep their DSCP",
                            fd, family == AF_INET6 ? "IPV6_TCLASS" : "IP_TOS", tos,
                            strerror(errno));
        }
    }
    /* After IP_TOS: setting the TOS resets the priority (rt_tos2priority). */
    if (ctx->qos_priority >= 0 &&
        setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &ctx->qos_priority, sizeof(int)) != 0) {
        shoal_warn_once(TCP, "setsockopt(fd %d, SO_PRIORITY, %d): %s; the sockets keep their "
                        "priority (above 6 needs CAP_NET_ADMIN: SHOAL_QOS_PRIORITY)", fd,
                        ctx->qos_priority, strerror(errno));
    }
    if (rate > 0) {
        /* The kernel's field is 64 bits since 4.20; a 32-bit value caps at ~4 GB/s. */
        uint64_t r = rate;
        if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &r, sizeof(r)) != 0) {
            unsigned r32 = (unsigned)SHOAL_MIN(rate, (uint64_t)UINT32_MAX - 1);
            if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &r32, sizeof(r32)) != 0) {
                shoal_warn_once(TCP, "setsockopt(fd %d, SO_MAX_PACING_RATE, %" PRIu64 "): %s; "
                                "no rate cap on these sockets", fd, rate, strerror(errno));
            }
        }
    }
}

static shoal_status_t shoal_tcp_ctx_listen(shoal_tl_ctx_t *ctx)
{
    struct sockaddr_storage ss;
    socklen_t slen;
    char ifname[IFNAMSIZ + 1];

    SHOAL_CHECK(shoal_tcp_pick_addr(&ss, ifname, sizeof(ifname)));
    slen = ss.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    ((struct sockaddr_in *)&ss)->sin_port = 0; /* same offset in sockaddr_in6 */
    ctx->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ctx->listen_fd < 0) {
        shoal_error(TCP, "socket(family %d) failed: %s", ss.ss_family, strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    (void)shoal_tcp_socket_setopts(ctx, ctx->listen_fd, 0);
    shoal_tcp_sockaddr_str((struct sockaddr *)&ss, ctx->name, sizeof(ctx->name));
    if (bind(ctx->listen_fd, (struct sockaddr *)&ss, slen) != 0 ||
        listen(ctx->listen_fd, SHOAL_TCP_BACKLOG) != 0 ||
        getsockname(ctx->listen_fd, (struct sockaddr *)&ss, &slen) != 0) {
        shoal_error(TCP, "bind/listen on %s (%s) failed: %s", ctx->name, ifname,
                    strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    shoal_tcp_sockaddr_str((struct sockaddr *)&ss, ctx->name, sizeof(ctx->name));
    ctx->addr.family = ss.ss_family;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        ctx->addr.port = ntohs(sin->sin_port);
        memcpy(ctx->addr.ip, &sin->sin_addr, 4);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
        ctx->addr.port = ntohs(sin6->sin6_port);
        ctx->addr.scope_id = sin6->sin6_scope_id;
        memcpy(ctx->addr.ip, &sin6->sin6_addr, 16);
    }
    ctx->addr.nsocks = ctx->nsocks;
    ctx->addr.min_split = ctx->min_split;
    ctx->addr.pid = (uint32_t)getpid();
    shoal_info(TCP, "rank %d listens on %s (%s), %u sockets per peer", ctx->rank, ctx->name,
               ifname, ctx->nsocks);
    return SHOAL_OK;
}

/* The longest a failed communicator's close waits for its peers to take what it sent. */
#define SHOAL_TCP_LINGER_NS (200ull * 1000 * 1000)

/* 1 while fd's connection is up and the peer has not yet acknowledged all we sent. */
static int shoal_tcp_sock_unacked(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    int outq = 0;
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        ti.tcpi_state != TCP_ESTABLISHED || ioctl(fd, SIOCOUTQ, &outq) != 0) {
        return 0;
    }
    return outq > 0;
}

/* 1 while a failed endpoint's peer has not acknowledged all we sent it. */
static int shoal_tcp_failed_unacked(const shoal_tl_ctx_t *ctx)
{
    for (int i = 0; i < ctx->neps; i++) {
        const shoal_ep_t *ep = &ctx->eps[i];
        for (int k = 0; ep->status != SHOAL_OK && k < SHOAL_TCP_MAX_SOCKS; k++) {
            if (shoal_tcp_sock_unacked(ep->fds[k])) {
                return 1;
            }
        }
    }
    return 0;
}

/* A failed endpoint's abort notice may still sit in our send queue when the communicator is
 * destroyed, behind a bulk message the peer has not taken yet. A close with unread data in
 * our receive queue sends a reset, and a reset discards the send queue: the notice never
 * arrives, and the peer blames this rank for the reset instead of the rank that failed
 * (seen: run_nbc.sh's "kill hosts 2x2 hier", 1 run in 60-90 beside two busy loops, a
 * survivor naming another survivor that had exited; 0 in 1068 with this wait). So a failed
 * endpoint's sockets get until SHOAL_TCP_LINGER_NS, for all endpoints together, for the peer
 * to acknowledge what was sent; a peer that is gone (its connection reset or closed) ends the
 * wait at once, and healthy endpoints (a normal destroy: nothing in flight) do not wait. */
static void shoal_tcp_linger(shoal_tl_ctx_t *ctx)
{
    uint64_t deadline = 0; /* read the clock only when there is something to wait for */
    while (shoal_tcp_failed_unacked(ctx)) {
        if (deadline == 0) {
            deadline = shoal_time_ns() + SHOAL_TCP_LINGER_NS;
        } else if (shoal_time_ns() >= deadline) {
            shoal_trace(TCP, "rank %d: peers did not take all that was sent within %llu ms",
                        ctx->rank, (unsigned long long)(SHOAL_TCP_LINGER_NS / 1000000));
            return;
        }
        (void)poll(NULL, 0, 1);
    }
}

static void shoal_tcp_fini(shoal_tl_ctx_t *ctx)
{
    if (ctx == NULL) {
        return;
    }
    shoal_tcp_lazy_fini(ctx);
    shoal_tcp_linger(ctx);
    for (int i = 0; i < ctx->neps; i++) {
        shoal_tcp_ep_close(&ctx->eps[i]);
    }
    free(ctx->eps);
    if (ctx->listen_fd >= 0) {
        close(ctx->listen_fd);
    }
    if (ctx->epfd >= 0) {
        close(ctx->epfd);
    }
    shoal_secret_wipe(ctx->secret, sizeof(ctx->secret)); /* not elided before the free */
    free(ctx);
}

static shoal_status_t shoal_tcp_init(const shoal_tl_params_t *params, shoal_tl_ctx_t **ctx_p)
{
    shoal_tl_ctx_t *ctx = calloc(1, sizeof(*ctx));
    shoal_status_t status;

    if (ctx == NULL) {
        shoal_error(TCP, "out of memory allocating the tcp context");
        return SHOAL_ERR_NO_MEMORY;
    }
    ctx->listen_fd = -1;
    ctx->rank = params->rank;
    ctx->comm_id = params->comm_id;
    memcpy(ctx->secret, params->secret, SHOAL_SECRET_BYTES);
    ctx->timeout_ms = params->timeout_ms;
    ctx->abort_flag = params->abort_flag;
    ctx->lazy = params->lazy;
    ctx->qos_priority = params->qos_valid ? params->qos_priority : -1;
    ctx->qos_dscp = params->qos_valid ? params->qos_dscp : -1;
    ctx->qos_rate_max = params->qos_valid ? params->qos_rate_max : 0;
    ctx->nsocks = shoal_tcp_config.nsocks;
    if (ctx->nsocks < 1 || ctx->nsocks > SHOAL_TCP_MAX_SOCKS) {
        shoal_warn_once(TCP, "SHOAL_SOCKET_NSOCKS=%u out of range 1..%d, clamped",
                        ctx->nsocks, SHOAL_TCP_MAX_SOCKS);
        ctx->nsocks = ctx->nsocks < 1 ? 1 : SHOAL_TCP_MAX_SOCKS;
    }
    /* derived (src/tune through core, explicit settings applied), else the variable */
    ctx->min_split = params->sizes != NULL && params->sizes->tcp_min_split != 0
                         ? (size_t)params->sizes->tcp_min_split : shoal_tcp_config.min_split;
    ctx->sndbuf = shoal_tcp_config.sndbuf;
    ctx->rcvbuf = shoal_tcp_config.rcvbuf;
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ctx->epfd < 0) {
        shoal_error(TCP, "epoll_create1() failed: %s", strerror(errno));
        status = SHOAL_ERR_SYSTEM;
        goto err_free;
    }
    SHOAL_CHECK_GOTO(shoal_tcp_ctx_listen(ctx), status, err_free);
    *ctx_p = ctx;
    return SHOAL_OK;

err_free:
    shoal_tcp_fini(ctx);
    return status;
}

static shoal_status_t shoal_tcp_address(shoal_tl_ctx_t *ctx, void *addr, size_t *len_p)
{
    if (*len_p < SHOAL_TCP_ADDR_BYTES) {
        shoal_error(TCP, "address buffer of %zu bytes, need %d", *len_p, SHOAL_TCP_ADDR_BYTES);
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_tcp_addr_encode(&ctx->addr, addr);
    *len_p = SHOAL_TCP_ADDR_BYTES;
    return SHOAL_OK;
}

static shoal_status_t shoal_tcp_ready(shoal_tl_ctx_t *ctx)
{
    if (ctx->lazy) {
        return SHOAL_OK; /* peers connect until fini */
    }
    if (ctx->listen_fd >= 0) {
        close(ctx->listen_fd); /* also leaves the epoll set */
        ctx->listen_fd = -1;
    }
    return SHOAL_OK;
}

/* Empties the epoll ready list: every socket is registered edge-triggered, so this rearms
 * the epoll fd; the caller then tries every pending transfer directly. */
void shoal_tcp_epoll_drain(shoal_tl_ctx_t *ctx)
{
    while (epoll_wait(ctx->epfd, ctx->events, SHOAL_TCP_EVENTS, 0) == SHOAL_TCP_EVENTS) {
    }
}

static int shoal_tcp_progress(shoal_tl_ctx_t *ctx)
{
    int n = 0;
    if (ctx->lazy) {
        n = shoal_tcp_lazy_progress(ctx); /* drains the ready list too */
    }
    if (ctx->npending == 0) {
        return n;
    }
    /* Drain before trying I/O: an edge after this point wakes the next sleep. */
    if (!ctx->lazy) {
        shoal_tcp_epoll_drain(ctx);
    }
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->nestablished < ep->nsocks) {
            continue; /* lazy: still connecting (a failed one has no requests) */
        }
        if (ep->sq_head != NULL || ep->rq_head != NULL) {
            n += shoal_tcp_ep_progress(ep);
        }
    }
    return n;
}

static int shoal_tcp_wait_fd(shoal_tl_ctx_t *ctx)
{
    /* Nothing pending: nothing to miss, and stale edges must not keep the fd readable. */
    if (ctx->npending == 0 && !shoal_tcp_lazy_busy(ctx)) {
        shoal_tcp_epoll_drain(ctx);
    }
    return ctx->epfd;
}

/* How long a failing communicator may spend finishing the messages under way before its
 * abort notices (shoal_tcp_ep_send_abort), all endpoints together. 2 ms per endpoint was less
 * than one scheduling quantum: with more ranks than cores the reader often did not run in
 * time, and a survivor blamed the messenger (run_nbc.sh's "kill hosts 2x2 hier", 1 in 4 full
 * runs). */
#define SHOAL_TCP_ABORT_FINISH_NS (20ull * 1000 * 1000)

static void shoal_tcp_fail(shoal_tl_ctx_t *ctx, int culprit, shoal_status_t status)
{
    uint64_t deadline = shoal_time_ns() + SHOAL_TCP_ABORT_FINISH_NS;
    char why[128];
    snprintf(why, sizeof(why), "communicator failed because of rank %d", culprit);
    if (ctx->lazy && ctx->listen_fd >= 0) {
        /* A failed communicator connects nobody any more: a peer that connects to it now is
         * refused by the kernel and fails at once (SHOAL_ERR_PEER_FAILED), instead of
         * retrying until its timeout. */
        close(ctx->listen_fd); /* also leaves the epoll set */
        ctx->listen_fd = -1;
    }
    /* Nor does it finish a connection under way (its send started it, or the peer's): the
     * peer would wait on it for our messages until its timeout. */
    shoal_tcp_lazy_stop(ctx);
    shoal_trace(TCP, "rank %d: failing because of rank %d: abort notices to the peers",
                ctx->rank, culprit);
    for (int i = 0; i < ctx->neps; i++) {
        shoal_ep_t *ep = &ctx->eps[i];
        if (ep->status == SHOAL_OK) {
            shoal_tcp_ep_send_abort(ep, culprit, deadline);
            (void)shoal_tcp_ep_fail(ep, status, culprit, why);
        }
    }
}

static int shoal_tcp_query(void)
{
    return 1;
}

const shoal_tl_ops_t shoal_tl_tcp_ops = {
    .abi_version = SHOAL_TL_ABI_VERSION,
    .name = "tcp",
    .caps = SHOAL_TL_CAP_LAZY,
    .intra_node_only = 0,
    .query = shoal_tcp_query,
    .init = shoal_tcp_init,
    .address = shoal_tcp_address,
    .connect_all = shoal_tcp_connect_all,
    .ready = shoal_tcp_ready,
    .isend = shoal_tcp_ep_isend,
    .irecv = shoal_tcp_ep_irecv,
    .progress = shoal_tcp_progress,
    .wait_fd = shoal_tcp_wait_fd,
    .wait = NULL,
    .fail = shoal_tcp_fail,
    .fini = shoal_tcp_fini,
};
