/*
 * Bootstrap. The root (started by shoal_get_unique_id(), in shoalrun or in the rank that
 * created the id) accepts one connection per rank, authenticates it with an HMAC
 * challenge-response over the job secret, and then serves allgather rounds of equal-sized
 * blobs until every rank says goodbye. Strangers and garbage cost it a refusal, nothing more.
 */
#include "core/core.h"
#include "core/boot_proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- uid ------------------------------------------------------------------------------ */

/* Layout: magic u32 | version u16 | family u16 | port u16 (network order) | pad u16 |
 * addr[16] | secret[32] | zero. */
void shoal_boot_uid_encode(const shoal_boot_uid_t *u, shoal_uid_t *uid)
{
    uint8_t *p = (uint8_t *)uid->internal;
    uint32_t magic = SHOAL_UID_MAGIC;
    uint16_t version = 1, family = u->root.ss_family, port;

    memset(uid, 0, sizeof(*uid));
    memcpy(p, &magic, 4);
    memcpy(p + 4, &version, 2);
    memcpy(p + 6, &family, 2);
    if (family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&u->root;
        port = s6->sin6_port;
        memcpy(p + 12, &s6->sin6_addr, 16);
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&u->root;
        port = s4->sin_port;
        memcpy(p + 12, &s4->sin_addr, 4);
    }
    memcpy(p + 8, &port, 2);
    memcpy(p + 28, u->secret, SHOAL_SECRET_BYTES);
}

shoal_status_t shoal_boot_uid_decode(const shoal_uid_t *uid, shoal_boot_uid_t *u)
{
    const uint8_t *p = (const uint8_t *)uid->internal;
    uint32_t magic;
    uint16_t version, family, port;

    memcpy(&magic, p, 4);
    memcpy(&version, p + 4, 2);
    memcpy(&family, p + 6, 2);
    memcpy(&port, p + 8, 2);
    if (magic != SHOAL_UID_MAGIC || version != 1 || (family != AF_INET && family != AF_INET6)) {
        shoal_error(BOOT, "unique id is not a shoal id (magic 0x%08x, version %u)", magic,
                    version);
        return SHOAL_ERR_INVALID_ARG;
    }
    memset(u, 0, sizeof(*u));
    if (family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&u->root;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = port;
        memcpy(&s6->sin6_addr, p + 12, 16);
        u->root_len = sizeof(*s6);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&u->root;
        s4->sin_family = AF_INET;
        s4->sin_port = port;
        memcpy(&s4->sin_addr, p + 12, 4);
        u->root_len = sizeof(*s4);
    }
    memcpy(u->secret, p + 28, SHOAL_SECRET_BYTES);
    return SHOAL_OK;
}

static int shoal_boot_hexval(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

shoal_status_t shoal_boot_uid_from_hex(const char *hex, shoal_uid_t *uid)
{
    if (hex == NULL || strlen(hex) != 2 * SHOAL_UID_BYTES) {
        shoal_error(BOOT, "SHOAL_UID must be %d hex characters", 2 * SHOAL_UID_BYTES);
        return SHOAL_ERR_INVALID_ARG;
    }
    for (int i = 0; i < SHOAL_UID_BYTES; i++) {
        int hi = shoal_boot_hexval(hex[2 * i]), lo = shoal_boot_hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            shoal_error(BOOT, "SHOAL_UID has a non-hex character at position %d", 2 * i);
            return SHOAL_ERR_INVALID_ARG;
        }
        uid->internal[i] = (char)(hi << 4 | lo);
    }
    return SHOAL_OK;
}

/* ---- sockets -------------------------------------------------------------------------- */

void shoal_sockaddr_str(const struct sockaddr_storage *ss, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        port = ntohs(s6->sin6_port);
        snprintf(buf, len, "[%s]:%d", ip, port);
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        port = ntohs(s4->sin_port);
        snprintf(buf, len, "%s:%d", ip, port);
    }
}

static shoal_status_t shoal_sock_poll(int fd, short events, uint64_t deadline_ns,
                                      const volatile int *abort_flag)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int ret;
        if (abort_flag != NULL && *abort_flag) {
            return SHOAL_ERR_ABORTED;
        }
        if (shoal_deadline_passed(deadline_ns)) {
            return SHOAL_ERR_TIMEOUT;
        }
        ret = poll(&pfd, 1, shoal_deadline_left_ms(deadline_ns, 100));
        if (ret > 0) {
            return SHOAL_OK;
        }
        if (ret < 0 && errno != EINTR) {
            shoal_error(BOOT, "poll(fd %d) failed: %s", fd, strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
    }
}

shoal_status_t shoal_sock_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns,
                                    const volatile int *abort_flag)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            shoal_status_t st = shoal_sock_poll(fd, POLLOUT, deadline_ns, abort_flag);
            if (st != SHOAL_OK) {
                return st;
            }
            continue;
        }
        return errno == EPIPE || errno == ECONNRESET ? SHOAL_ERR_PEER_FAILED
                                                      : SHOAL_ERR_TRANSPORT;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns,
                                   const volatile int *abort_flag)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) {
            return SHOAL_ERR_PEER_FAILED;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            shoal_status_t st = shoal_sock_poll(fd, POLLIN, deadline_ns, abort_flag);
            if (st != SHOAL_OK) {
                return st;
            }
            continue;
        }
        return errno == ECONNRESET ? SHOAL_ERR_PEER_FAILED : SHOAL_ERR_TRANSPORT;
    }
    return SHOAL_OK;
}

/* The address published in the unique id: the first IPv4 interface that is up and not
 * loopback (reachable from other hosts and network namespaces), else 127.0.0.1. */
shoal_status_t shoal_boot_pick_addr(struct sockaddr_storage *ss, socklen_t *len_p)
{
    struct ifaddrs *ifs = NULL, *it;
    struct sockaddr_in *out = (struct sockaddr_in *)ss;

    memset(ss, 0, sizeof(*ss));
    out->sin_family = AF_INET;
    out->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *len_p = sizeof(*out);
    if (getifaddrs(&ifs) != 0) {
        shoal_warn(BOOT, "getifaddrs failed: %s; using loopback", strerror(errno));
        return SHOAL_OK;
    }
    for (it = ifs; it != NULL; it = it->ifa_next) {
        if (it->ifa_addr == NULL || it->ifa_addr->sa_family != AF_INET ||
            (it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0) {
            continue;
        }
        out->sin_addr = ((struct sockaddr_in *)it->ifa_addr)->sin_addr;
        break;
    }
    freeifaddrs(ifs);
    return SHOAL_OK;
}

static int shoal_sock_nonblock_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        return -1;
    }
    return 0;
}

/* ---- authentication ----------------------------------------------------------------- */

void shoal_boot_hello_mac(const uint8_t *secret, const uint8_t *root_nonce,
                          const shoal_boot_hello_t *h, uint8_t *mac)
{
    uint8_t msg[16 + SHOAL_BOOT_NONCE + 8 + SHOAL_BOOT_NONCE];
    memcpy(msg, "shoal-boot-hello", 16);
    memcpy(msg + 16, root_nonce, SHOAL_BOOT_NONCE);
    memcpy(msg + 16 + SHOAL_BOOT_NONCE, &h->rank, 4);
    memcpy(msg + 20 + SHOAL_BOOT_NONCE, &h->nranks, 4);
    memcpy(msg + 24 + SHOAL_BOOT_NONCE, h->nonce, SHOAL_BOOT_NONCE);
    if (shoal_hmac(secret, SHOAL_SECRET_BYTES, msg, sizeof(msg), mac) != SHOAL_OK) {
        memset(mac, 0, SHOAL_HMAC_BYTES); /* can never match a real proof */
    }
}

void shoal_boot_welcome_mac(const uint8_t *secret, const uint8_t *client_nonce, int32_t rank,
                            uint8_t *mac)
{
    uint8_t msg[16 + SHOAL_BOOT_NONCE + 4];
    memcpy(msg, "shoal-boot-welco", 16);
    memcpy(msg + 16, client_nonce, SHOAL_BOOT_NONCE);
    memcpy(msg + 16 + SHOAL_BOOT_NONCE, &rank, 4);
    if (shoal_hmac(secret, SHOAL_SECRET_BYTES, msg, sizeof(msg), mac) != SHOAL_OK) {
        memset(mac, 0xff, SHOAL_HMAC_BYTES);
    }
}

/* ---- client ------------------------------------------------------------------------- */

struct shoal_boot {
    int fd;
    int rank;
    int nranks;
    int timeout_ms;
    const volatile int *abort_flag;
    uint32_t round;
    char root_str[80];
    char error[256];
};

const char *shoal_boot_error(shoal_boot_t *boot)
{
    return boot->error;
}

static shoal_status_t shoal_boot_fail(shoal_boot_t *b, shoal_status_t st, const char *what)
{
    snprintf(b->error, sizeof(b->error), "bootstrap with root %s: %s: %s", b->root_str, what,
             shoal_strerror(st));
    shoal_error(BOOT, "rank %d: %s", b->rank, b->error);
    return st;
}

/* Connects, retrying while the root is not listening yet (it may start a little later). */
static shoal_status_t shoal_boot_dial(shoal_boot_t *b, const shoal_boot_uid_t *u,
                                      uint64_t deadline)
{
    unsigned backoff_us = 1000;
    for (;;) {
        int fd = socket(u->root.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
        if (fd < 0) {
            shoal_error(BOOT, "socket() failed: %s", strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
        if (connect(fd, (const struct sockaddr *)&u->root, u->root_len) == 0) {
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            if (shoal_sock_nonblock_cloexec(fd) != 0) {
                close(fd);
                return SHOAL_ERR_SYSTEM;
            }
            b->fd = fd;
            return SHOAL_OK;
        }
        int err = errno;
        close(fd);
        if (err != ECONNREFUSED && err != ETIMEDOUT && err != EINTR && err != ENETUNREACH &&
            err != EHOSTUNREACH) {
            shoal_error(BOOT, "connect(%s) failed: %s", b->root_str, strerror(err));
            return SHOAL_ERR_TRANSPORT;
        }
        if (b->abort_flag != NULL && *b->abort_flag) {
            return SHOAL_ERR_ABORTED;
        }
        if (shoal_deadline_passed(deadline)) {
            return SHOAL_ERR_TIMEOUT;
        }
        shoal_sleep_us(backoff_us);
        backoff_us = SHOAL_MIN(backoff_us * 2, 100000);
    }
}

static shoal_status_t shoal_boot_read_frame(shoal_boot_t *b, uint32_t type, void *payload,
                                            uint32_t len, uint64_t deadline)
{
    shoal_boot_frame_t f;
    shoal_status_t st = shoal_sock_read_all(b->fd, &f, sizeof(f), deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "no answer from the root");
    }
    if (f.magic == SHOAL_BOOT_FRAME_MAGIC && f.type == SHOAL_BOOT_REFUSED) {
        shoal_status_t why = (shoal_status_t)(int32_t)f.round;
        if (why != SHOAL_ERR_AUTH && why != SHOAL_ERR_INVALID_ARG) {
            why = SHOAL_ERR_PROTOCOL;
        }
        return shoal_boot_fail(b, why, "the root refused this rank");
    }
    if (f.magic != SHOAL_BOOT_FRAME_MAGIC || f.type != type || f.len != len) {
        return shoal_boot_fail(b, SHOAL_ERR_PROTOCOL, "unexpected frame from the root");
    }
    st = shoal_sock_read_all(b->fd, payload, len, deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "truncated frame from the root");
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_boot_handshake(shoal_boot_t *b, const shoal_boot_uid_t *u,
                                           uint64_t deadline)
{
    uint8_t root_nonce[SHOAL_BOOT_NONCE], mac[SHOAL_HMAC_BYTES], want[SHOAL_HMAC_BYTES];
    struct {
        shoal_boot_frame_t f;
        shoal_boot_hello_t h;
    } msg;
    shoal_status_t st;

    SHOAL_CHECK(shoal_boot_read_frame(b, SHOAL_BOOT_CHALLENGE, root_nonce, sizeof(root_nonce),
                                      deadline));
    memset(&msg, 0, sizeof(msg));
    msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                 .len = sizeof(msg.h)};
    msg.h.rank = b->rank;
    msg.h.nranks = b->nranks;
    SHOAL_CHECK(shoal_random_bytes(msg.h.nonce, sizeof(msg.h.nonce)));
    shoal_boot_hello_mac(u->secret, root_nonce, &msg.h, msg.h.mac);
    st = shoal_sock_write_all(b->fd, &msg, sizeof(msg), deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "sending hello");
    }
    SHOAL_CHECK(shoal_boot_read_frame(b, SHOAL_BOOT_WELCOME, mac, sizeof(mac), deadline));
    shoal_boot_welcome_mac(u->secret, msg.h.nonce, b->rank, want);
    if (!shoal_memeq_ct(mac, want, sizeof(mac))) {
        return shoal_boot_fail(b, SHOAL_ERR_AUTH, "the root does not know the job secret");
    }
    return SHOAL_OK;
}

shoal_status_t shoal_boot_connect(const shoal_boot_uid_t *u, int rank, int nranks,
                                  int timeout_ms, const volatile int *abort_flag,
                                  shoal_boot_t **boot_p)
{
    shoal_boot_t *b = calloc(1, sizeof(*b));
    uint64_t deadline = shoal_deadline_ns(timeout_ms);
    shoal_status_t st;

    if (b == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    b->fd = -1;
    b->rank = rank;
    b->nranks = nranks;
    b->timeout_ms = timeout_ms;
    b->abort_flag = abort_flag;
    shoal_sockaddr_str(&u->root, b->root_str, sizeof(b->root_str));
    for (unsigned backoff_us = 1000;; backoff_us = SHOAL_MIN(backoff_us * 2, 100000)) {
        st = shoal_boot_dial(b, u, deadline);
        if (st != SHOAL_OK) {
            shoal_boot_fail(b, st, "cannot reach the root");
            goto err;
        }
        st = shoal_boot_handshake(b, u, deadline);
        /* An explicit refusal (wrong secret, bad rank) is final; a connection the root
         * dropped (evicted under a flood of strangers) is worth another try. */
        if (st == SHOAL_OK || st == SHOAL_ERR_AUTH || st == SHOAL_ERR_INVALID_ARG ||
            st == SHOAL_ERR_ABORTED || shoal_deadline_passed(deadline)) {
            break;
        }
        shoal_warn(BOOT, "rank %d: root %s dropped the connection before the handshake "
                   "finished; redialing", rank, b->root_str);
        close(b->fd);
        b->fd = -1;
        shoal_sleep_us(backoff_us);
    }
    if (st != SHOAL_OK) {
        goto err;
    }
    shoal_trace(BOOT, "rank %d of %d joined root %s", rank, nranks, b->root_str);
    *boot_p = b;
    return SHOAL_OK;
err:
    if (b->fd >= 0) {
        close(b->fd);
    }
    free(b);
    return st;
}

shoal_status_t shoal_boot_allgather(shoal_boot_t *b, const void *in, size_t len, void *out)
{
    uint64_t deadline = shoal_deadline_ns(b->timeout_ms);
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_AG,
                            .len = (uint32_t)len, .round = b->round};
    shoal_status_t st;

    if (len > SHOAL_BOOT_MAX_BLOB || (size_t)b->nranks * len > UINT32_MAX) {
        return shoal_boot_fail(b, SHOAL_ERR_INVALID_ARG, "allgather blob too large");
    }
    st = shoal_sock_write_all(b->fd, &f, sizeof(f), deadline, b->abort_flag);
    if (st == SHOAL_OK) {
        st = shoal_sock_write_all(b->fd, in, len, deadline, b->abort_flag);
    }
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "sending to the root");
    }
    SHOAL_CHECK(shoal_boot_read_frame(b, SHOAL_BOOT_AG, out, (uint32_t)(len * (size_t)b->nranks),
                                      deadline));
    b->round++;
    return SHOAL_OK;
}

shoal_status_t shoal_boot_barrier(shoal_boot_t *b)
{
    uint8_t dummy = 0;
    return shoal_boot_allgather(b, &dummy, 0, &dummy);
}

void shoal_boot_close(shoal_boot_t *b)
{
    if (b == NULL) {
        return;
    }
    if (b->fd >= 0) {
        shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_BYE};
        (void)shoal_sock_write_all(b->fd, &f, sizeof(f), shoal_deadline_ns(1000), NULL);
        close(b->fd);
    }
    free(b);
}
