/* Out-of-band TCP helper: listener, deadline-bounded connect/accept/transfer, and the mutual
 * HMAC challenge-response (see oob.h). */
#include "transports/common/oob.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SHOAL_OOB_MAGIC 0x424f4853u  /* "SHOB" */
#define SHOAL_OOB_VERSION 1
#define SHOAL_OOB_HELLO_BYTES 20
#define SHOAL_OOB_SLICE_MS 10        /* the abort flag is looked at this often */

void shoal_oob_addr_encode(const shoal_oob_addr_t *a, uint8_t out[SHOAL_OOB_ADDR_BYTES])
{
    shoal_put_le(out, a->family, 2);
    shoal_put_le(out + 2, a->port, 2);
    shoal_put_le(out + 4, a->scope_id, 4);
    memcpy(out + 8, a->ip, 16);
}

int shoal_oob_addr_decode(const uint8_t in[SHOAL_OOB_ADDR_BYTES], shoal_oob_addr_t *a)
{
    a->family = (uint16_t)shoal_get_le(in, 2);
    a->port = (uint16_t)shoal_get_le(in + 2, 2);
    a->scope_id = (uint32_t)shoal_get_le(in + 4, 4);
    memcpy(a->ip, in + 8, 16);
    return (a->family == AF_INET || a->family == AF_INET6) && a->port != 0 ? 0 : -1;
}

static socklen_t shoal_oob_sockaddr(const shoal_oob_addr_t *a, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (a->family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(a->port);
        memcpy(&sin->sin_addr, a->ip, 4);
        return sizeof(*sin);
    }
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(a->port);
    sin6->sin6_scope_id = a->scope_id;
    memcpy(&sin6->sin6_addr, a->ip, 16);
    return sizeof(*sin6);
}

void shoal_oob_addr_str(const shoal_oob_addr_t *a, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    inet_ntop(a->family == AF_INET ? AF_INET : AF_INET6, a->ip, ip, sizeof(ip));
    snprintf(buf, len, a->family == AF_INET ? "%s:%u" : "[%s]:%u", ip, a->port);
}

/* pass 0: non-loopback, 1: loopback (only without a spec). */
static int shoal_oob_pick(struct ifaddrs *list, const char *spec, int pass,
                          struct sockaddr_storage *ss, char *ifname, size_t iflen)
{
    for (int fam = 0; fam < 2; fam++) {
        int family = fam == 0 ? AF_INET : AF_INET6;
        for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
            int loop;
            if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != family ||
                (ifa->ifa_flags & IFF_UP) == 0 ||
                (family == AF_INET6 &&
                 IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr))) {
                continue;
            }
            loop = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
            if (spec != NULL ? !shoal_ifname_match(spec, ifa->ifa_name)
                             : (pass == 0) == loop) {
                continue;
            }
            memcpy(ss, ifa->ifa_addr, family == AF_INET ? sizeof(struct sockaddr_in)
                                                        : sizeof(struct sockaddr_in6));
            snprintf(ifname, iflen, "%s", ifa->ifa_name);
            return 1;
        }
    }
    return 0;
}

static shoal_status_t shoal_oob_bind(int fd, struct sockaddr_storage *ss, shoal_oob_addr_t *a)
{
    socklen_t slen = ss->ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                              : sizeof(struct sockaddr_in6);
    ((struct sockaddr_in *)ss)->sin_port = 0; /* same offset in sockaddr_in6 */
    if (bind(fd, (struct sockaddr *)ss, slen) != 0 || listen(fd, 1024) != 0 ||
        getsockname(fd, (struct sockaddr *)ss, &slen) != 0) {
        return SHOAL_ERR_TRANSPORT;
    }
    memset(a, 0, sizeof(*a));
    a->family = ss->ss_family;
    if (ss->ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)ss;
        a->port = ntohs(sin->sin_port);
        memcpy(a->ip, &sin->sin_addr, 4);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
        a->port = ntohs(sin6->sin6_port);
        a->scope_id = sin6->sin6_scope_id;
        memcpy(a->ip, &sin6->sin6_addr, 16);
    }
    return SHOAL_OK;
}

shoal_status_t shoal_oob_listen(const char *ifspec, int *fd_p, shoal_oob_addr_t *a)
{
    struct ifaddrs *list;
    struct sockaddr_storage ss;
    char ifname[IFNAMSIZ + 1] = "";
    int found = 0, fd;

    if (ifspec != NULL && ifspec[0] == '\0') {
        ifspec = NULL;
    }
    if (getifaddrs(&list) != 0) {
        shoal_error(IB, "getifaddrs() failed: %s", strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    for (int pass = 0; pass < (ifspec != NULL ? 1 : 2) && !found; pass++) {
        found = shoal_oob_pick(list, ifspec, pass, &ss, ifname, sizeof(ifname));
    }
    freeifaddrs(list);
    if (!found) {
        shoal_error(IB, "no interface for the out-of-band connection (\"%s\")",
                    ifspec != NULL ? ifspec : "");
        return SHOAL_ERR_TRANSPORT;
    }
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || shoal_oob_bind(fd, &ss, a) != SHOAL_OK) {
        shoal_error(IB, "out-of-band listener on %s failed: %s", ifname, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return SHOAL_ERR_TRANSPORT;
    }
    *fd_p = fd;
    return SHOAL_OK;
}

/* Waits for events on fd in short slices; SHOAL_OK when ready. */
static shoal_status_t shoal_oob_wait(int fd, short events, uint64_t deadline_ns,
                                     const volatile int *abort_flag)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int r;
        if (abort_flag != NULL && *abort_flag != 0) {
            return SHOAL_ERR_ABORTED;
        }
        if (shoal_deadline_passed(deadline_ns)) {
            return SHOAL_ERR_TIMEOUT;
        }
        r = poll(&p, 1, shoal_deadline_left_ms(deadline_ns, SHOAL_OOB_SLICE_MS));
        if (r > 0) {
            return SHOAL_OK;
        }
        if (r < 0 && errno != EINTR) {
            return SHOAL_ERR_SYSTEM;
        }
    }
}

shoal_status_t shoal_oob_connect(const shoal_oob_addr_t *a, uint64_t deadline_ns,
                                 const volatile int *abort_flag, int *fd_p)
{
    struct sockaddr_storage ss;
    socklen_t slen = shoal_oob_sockaddr(a, &ss);
    unsigned tries = 0;

    for (;;) {
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), err = 0;
        socklen_t elen = sizeof(err);
        shoal_status_t st;
        if (fd < 0) {
            return SHOAL_ERR_SYSTEM;
        }
        if (connect(fd, (struct sockaddr *)&ss, slen) != 0 && errno != EINPROGRESS) {
            err = errno;
        } else {
            st = shoal_oob_wait(fd, POLLOUT, deadline_ns, abort_flag);
            if (st != SHOAL_OK) {
                close(fd);
                return st;
            }
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
                err = errno;
            }
        }
        if (err == 0) {
            int one = 1;
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            *fd_p = fd;
            return SHOAL_OK;
        }
        close(fd);
        if (err != ECONNREFUSED && err != ETIMEDOUT && err != EAGAIN && err != ECONNRESET &&
            err != ENETUNREACH && err != EHOSTUNREACH) {
            errno = err;
            return SHOAL_ERR_TRANSPORT;
        }
        if (shoal_deadline_passed(deadline_ns)) {
            return SHOAL_ERR_TIMEOUT;
        }
        if (abort_flag != NULL && *abort_flag != 0) {
            return SHOAL_ERR_ABORTED;
        }
        shoal_sleep_us(1000u * SHOAL_MIN(++tries, 20u));
    }
}

shoal_status_t shoal_oob_accept(int lfd, uint64_t deadline_ns, const volatile int *abort_flag,
                                int *fd_p)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            int one = 1;
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            *fd_p = fd;
            return SHOAL_OK;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
            errno != ECONNABORTED) {
            return SHOAL_ERR_SYSTEM;
        }
        SHOAL_CHECK(shoal_oob_wait(lfd, POLLIN, deadline_ns, abort_flag));
    }
}

static shoal_status_t shoal_oob_xfer(int fd, void *buf, size_t len, int sending,
                                     uint64_t deadline_ns, const volatile int *abort_flag)
{
    size_t off = 0;
    while (off < len) {
        ssize_t r = sending ? send(fd, (char *)buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, (char *)buf + off, len - off, MSG_DONTWAIT);
        if (r > 0) {
            off += (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            SHOAL_CHECK(shoal_oob_wait(fd, sending ? POLLOUT : POLLIN, deadline_ns,
                                       abort_flag));
        } else {
            if (r == 0) {
                errno = ECONNRESET;
            }
            return SHOAL_ERR_PEER_FAILED;
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_oob_send(int fd, const void *buf, size_t len, uint64_t deadline_ns,
                              const volatile int *abort_flag)
{
    return shoal_oob_xfer(fd, (void *)buf, len, 1, deadline_ns, abort_flag);
}

shoal_status_t shoal_oob_recv(int fd, void *buf, size_t len, uint64_t deadline_ns,
                              const volatile int *abort_flag)
{
    return shoal_oob_xfer(fd, buf, len, 0, deadline_ns, abort_flag);
}

/* HMAC(secret, label suffix | comm | nonce_c | nonce_a | from | to). */
static shoal_status_t shoal_oob_proof(const shoal_oob_auth_t *a, const char *suffix,
                                      const uint8_t *nc, const uint8_t *na, uint32_t from,
                                      uint32_t to, uint8_t out[SHOAL_HMAC_BYTES])
{
    uint8_t msg[64 + 4 + 2 * SHOAL_OOB_NONCE_BYTES + 8];
    int n = snprintf((char *)msg, 64, "%s%s", a->label, suffix);
    size_t off = (size_t)SHOAL_MIN(n, 63);
    shoal_put_le(msg + off, a->comm_id, 4);
    off += 4;
    memcpy(msg + off, nc, SHOAL_OOB_NONCE_BYTES);
    off += SHOAL_OOB_NONCE_BYTES;
    memcpy(msg + off, na, SHOAL_OOB_NONCE_BYTES);
    off += SHOAL_OOB_NONCE_BYTES;
    shoal_put_le(msg + off, from, 4);
    shoal_put_le(msg + off + 4, to, 4);
    return shoal_hmac(a->secret, SHOAL_SECRET_BYTES, msg, off + 8, out);
}

shoal_status_t shoal_oob_auth_connect(int fd, const shoal_oob_auth_t *a, uint32_t peer,
                                      uint64_t deadline_ns)
{
    uint8_t hello[SHOAL_OOB_HELLO_BYTES + SHOAL_OOB_NONCE_BYTES];
    uint8_t reply[SHOAL_OOB_NONCE_BYTES + SHOAL_HMAC_BYTES], want[SHOAL_HMAC_BYTES];
    uint8_t *nc = hello + SHOAL_OOB_HELLO_BYTES;

    shoal_put_le(hello, SHOAL_OOB_MAGIC, 4);
    shoal_put_le(hello + 4, SHOAL_OOB_VERSION, 4);
    shoal_put_le(hello + 8, a->comm_id, 4);
    shoal_put_le(hello + 12, a->self, 4);
    shoal_put_le(hello + 16, peer, 4);
    SHOAL_CHECK(shoal_random_bytes(nc, SHOAL_OOB_NONCE_BYTES));
    SHOAL_CHECK(shoal_oob_send(fd, hello, sizeof(hello), deadline_ns, a->abort_flag));
    SHOAL_CHECK(shoal_oob_recv(fd, reply, sizeof(reply), deadline_ns, a->abort_flag));
    SHOAL_CHECK(shoal_oob_proof(a, "-acc", nc, reply, a->self, peer, want));
    if (!shoal_memeq_ct(want, reply + SHOAL_OOB_NONCE_BYTES, SHOAL_HMAC_BYTES)) {
        return SHOAL_ERR_AUTH;
    }
    SHOAL_CHECK(shoal_oob_proof(a, "-con", nc, reply, a->self, peer, want));
    return shoal_oob_send(fd, want, sizeof(want), deadline_ns, a->abort_flag);
}

shoal_status_t shoal_oob_auth_accept(int fd, const shoal_oob_auth_t *a,
                                     int (*expect)(void *arg, uint32_t rank), void *arg,
                                     uint32_t *peer_p, uint64_t deadline_ns, char *why,
                                     size_t len)
{
    uint8_t hello[SHOAL_OOB_HELLO_BYTES + SHOAL_OOB_NONCE_BYTES];
    uint8_t reply[SHOAL_OOB_NONCE_BYTES + SHOAL_HMAC_BYTES], proof[SHOAL_HMAC_BYTES];
    uint8_t want[SHOAL_HMAC_BYTES];
    uint32_t from, to;

    SHOAL_CHECK(shoal_oob_recv(fd, hello, sizeof(hello), deadline_ns, a->abort_flag));
    from = (uint32_t)shoal_get_le(hello + 12, 4);
    to = (uint32_t)shoal_get_le(hello + 16, 4);
    if (shoal_get_le(hello, 4) != SHOAL_OOB_MAGIC ||
        shoal_get_le(hello + 4, 4) != SHOAL_OOB_VERSION ||
        shoal_get_le(hello + 8, 4) != a->comm_id || to != a->self || !expect(arg, from)) {
        snprintf(why, len, "unexpected hello (from rank %u to rank %u, communicator %08x)",
                 from, to, (unsigned)shoal_get_le(hello + 8, 4));
        return SHOAL_ERR_PROTOCOL;
    }
    SHOAL_CHECK(shoal_random_bytes(reply, SHOAL_OOB_NONCE_BYTES));
    SHOAL_CHECK(shoal_oob_proof(a, "-acc", hello + SHOAL_OOB_HELLO_BYTES, reply, from, a->self,
                                reply + SHOAL_OOB_NONCE_BYTES));
    SHOAL_CHECK(shoal_oob_send(fd, reply, sizeof(reply), deadline_ns, a->abort_flag));
    SHOAL_CHECK(shoal_oob_recv(fd, proof, sizeof(proof), deadline_ns, a->abort_flag));
    SHOAL_CHECK(shoal_oob_proof(a, "-con", hello + SHOAL_OOB_HELLO_BYTES, reply, from, a->self,
                                want));
    if (!shoal_memeq_ct(want, proof, SHOAL_HMAC_BYTES)) {
        snprintf(why, len, "rank %u failed to prove the job secret", from);
        return SHOAL_ERR_AUTH;
    }
    *peer_p = from;
    return SHOAL_OK;
}
