/* Out-of-band TCP helper: listener, deadline-bounded connect/accept/transfer, and the mutual
 * HMAC challenge-response (see oob.h). */
#include "transports/common/oob.h"
#include "tenant/breaker.h"
#include "transports/tcp/tcp.h" /* shoal_tcp_config.hello_timeout_ms */

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SHOAL_OOB_MAGIC 0x424f4853u  /* "SHOB" */
#define SHOAL_OOB_VERSION 2          /* 2: the acceptor verifies before it proves */
#define SHOAL_OOB_HELLO_BYTES 20
#define SHOAL_OOB_SLICE_MS 10        /* the abort flag is looked at this often */
#define SHOAL_OOB_AUTH_TRIES 3       /* closes right after our proof before SHOAL_ERR_AUTH */
#define SHOAL_OOB_RETRY_MS 20        /* first pause before reconnecting after an early close */
#define SHOAL_OOB_HANDSHAKE_MS 5000  /* a connection's whole handshake, hello included */

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

static void shoal_oob_sockaddr_str(const struct sockaddr_storage *ss, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, ntohs(sin->sin_port));
    } else {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof(ip));
        snprintf(buf, len, "[%s]:%u", ip, ntohs(sin6->sin6_port));
    }
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
        if (shoal_aborted(abort_flag)) {
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
        if (shoal_aborted(abort_flag)) {
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

static void shoal_oob_hello_make(const shoal_oob_auth_t *a, uint32_t peer, const uint8_t *nc,
                                 uint8_t hello[SHOAL_OOB_HELLO_BYTES + SHOAL_OOB_NONCE_BYTES])
{
    shoal_put_le(hello, SHOAL_OOB_MAGIC, 4);
    shoal_put_le(hello + 4, SHOAL_OOB_VERSION, 4);
    shoal_put_le(hello + 8, a->comm_id, 4);
    shoal_put_le(hello + 12, a->self, 4);
    shoal_put_le(hello + 16, peer, 4);
    memcpy(hello + SHOAL_OOB_HELLO_BYTES, nc, SHOAL_OOB_NONCE_BYTES);
}

/* The connector's side; *proved_p is set once our proof is sent (a close after that is a
 * refusal of the proof, before it rather an eviction). */
static shoal_status_t shoal_oob_auth_connect_at(int fd, const shoal_oob_auth_t *a,
                                                uint32_t peer, uint64_t deadline_ns,
                                                int *proved_p)
{
    uint8_t hello[SHOAL_OOB_HELLO_BYTES + SHOAL_OOB_NONCE_BYTES], nc[SHOAL_OOB_NONCE_BYTES];
    uint8_t na[SHOAL_OOB_NONCE_BYTES], proof[SHOAL_HMAC_BYTES], want[SHOAL_HMAC_BYTES];

    *proved_p = 0;
    SHOAL_CHECK(shoal_random_bytes(nc, sizeof(nc)));
    shoal_oob_hello_make(a, peer, nc, hello);
    SHOAL_CHECK(shoal_oob_send(fd, hello, sizeof(hello), deadline_ns, a->abort_flag));
    SHOAL_CHECK(shoal_oob_recv(fd, na, sizeof(na), deadline_ns, a->abort_flag));
    SHOAL_CHECK(shoal_oob_proof(a, "-con", nc, na, a->self, peer, proof));
    SHOAL_CHECK(shoal_oob_send(fd, proof, sizeof(proof), deadline_ns, a->abort_flag));
    *proved_p = 1;
    SHOAL_CHECK(shoal_oob_recv(fd, proof, sizeof(proof), deadline_ns, a->abort_flag));
    SHOAL_CHECK(shoal_oob_proof(a, "-acc", nc, na, a->self, peer, want));
    return shoal_memeq_ct(want, proof, SHOAL_HMAC_BYTES) ? SHOAL_OK : SHOAL_ERR_AUTH;
}

shoal_status_t shoal_oob_auth_connect(int fd, const shoal_oob_auth_t *a, uint32_t peer,
                                      uint64_t deadline_ns)
{
    int proved;
    return shoal_oob_auth_connect_at(fd, a, peer, deadline_ns, &proved);
}

shoal_status_t shoal_oob_connect_auth(const shoal_oob_addr_t *addr, const shoal_oob_auth_t *a,
                                      uint32_t peer, uint64_t deadline_ns, int *fd_p)
{
    int refusals = 0, closes = 0;
    for (;;) {
        int fd, proved;
        shoal_status_t st = shoal_oob_connect(addr, deadline_ns, a->abort_flag, &fd);
        if (st != SHOAL_OK) {
            return st;
        }
        st = shoal_oob_auth_connect_at(fd, a, peer, deadline_ns, &proved);
        if (st == SHOAL_OK) {
            *fd_p = fd;
            return SHOAL_OK;
        }
        close(fd);
        if (st != SHOAL_ERR_PEER_FAILED) {
            return st;
        }
        /* Closed early: evicted or timed out by a listener full of strangers, or (right after
         * our proof) our proof refused. Reconnect with a growing pause. */
        if (proved && ++refusals >= SHOAL_OOB_AUTH_TRIES) {
            return SHOAL_ERR_AUTH;
        }
        /* the pause ends at the deadline: the next connect then reports the timeout */
        shoal_sleep_us(1000u * (unsigned)shoal_deadline_left_ms(
                                   deadline_ns, SHOAL_OOB_RETRY_MS *
                                                    (int)SHOAL_MIN((unsigned)++closes, 10u)));
    }
}

/* The acceptor's checks of a hello; 1 if it may go on, 0 if not, SHOAL_OOB_EXPECT_LATER if
 * expect() said so (a known peer, not now: closed without counting against the source). */
static int shoal_oob_hello_ok(const shoal_oob_auth_t *a, const uint8_t *hello,
                              int (*expect)(void *arg, uint32_t rank), void *arg,
                              uint32_t *from_p, char *why, size_t len)
{
    uint32_t from = (uint32_t)shoal_get_le(hello + 12, 4);
    uint32_t to = (uint32_t)shoal_get_le(hello + 16, 4);
    int e = 0;
    if (shoal_get_le(hello, 4) != SHOAL_OOB_MAGIC ||
        shoal_get_le(hello + 4, 4) != SHOAL_OOB_VERSION ||
        shoal_get_le(hello + 8, 4) != a->comm_id || to != a->self ||
        (e = expect(arg, from)) != 1) {
        if (e == SHOAL_OOB_EXPECT_LATER) {
            snprintf(why, len, "rank %u dialed while we dial it and our dial wins", from);
            return SHOAL_OOB_EXPECT_LATER;
        }
        snprintf(why, len, "unexpected hello (from rank %u to rank %u, communicator %08x)",
                 from, to, (unsigned)shoal_get_le(hello + 8, 4));
        return 0;
    }
    *from_p = from;
    return 1;
}

shoal_status_t shoal_oob_auth_accept(int fd, const shoal_oob_auth_t *a,
                                     int (*expect)(void *arg, uint32_t rank), void *arg,
                                     uint32_t *peer_p, uint64_t deadline_ns, char *why,
                                     size_t len)
{
    uint8_t hello[SHOAL_OOB_HELLO_BYTES + SHOAL_OOB_NONCE_BYTES];
    uint8_t na[SHOAL_OOB_NONCE_BYTES], proof[SHOAL_HMAC_BYTES], want[SHOAL_HMAC_BYTES];
    uint32_t from;

    SHOAL_CHECK(shoal_oob_recv(fd, hello, sizeof(hello), deadline_ns, a->abort_flag));
    if (shoal_oob_hello_ok(a, hello, expect, arg, &from, why, len) != 1) {
        return SHOAL_ERR_PROTOCOL;
    }
    SHOAL_CHECK(shoal_random_bytes(na, sizeof(na)));
    SHOAL_CHECK(shoal_oob_send(fd, na, sizeof(na), deadline_ns, a->abort_flag));
    SHOAL_CHECK(shoal_oob_recv(fd, proof, sizeof(proof), deadline_ns, a->abort_flag));
    /* Verify first, then prove: a stranger never obtains a proof of ours. */
    SHOAL_CHECK(shoal_oob_proof(a, "-con", hello + SHOAL_OOB_HELLO_BYTES, na, from, a->self,
                                want));
    if (!shoal_memeq_ct(want, proof, SHOAL_HMAC_BYTES)) {
        snprintf(why, len, "rank %u failed to prove the job secret", from);
        return SHOAL_ERR_AUTH;
    }
    SHOAL_CHECK(shoal_oob_proof(a, "-acc", hello + SHOAL_OOB_HELLO_BYTES, na, from, a->self,
                                proof));
    SHOAL_CHECK(shoal_oob_send(fd, proof, sizeof(proof), deadline_ns, a->abort_flag));
    *peer_p = from;
    return SHOAL_OK;
}

/* ---- the concurrent acceptor --------------------------------------------------------------- */

enum {
    SHOAL_OOB_HS_FREE = 0,
    SHOAL_OOB_HS_HELLO,  /* reading hello + nonce_c */
    SHOAL_OOB_HS_NONCE,  /* sending nonce_a */
    SHOAL_OOB_HS_PROOF,  /* reading the connector's proof */
    SHOAL_OOB_HS_ACK,    /* sending ours */
};

typedef struct {
    int state;
    int fd;
    size_t off, len;
    uint8_t buf[SHOAL_OOB_HELLO_BYTES + SHOAL_OOB_NONCE_BYTES];
    uint8_t nc[SHOAL_OOB_NONCE_BYTES], na[SHOAL_OOB_NONCE_BYTES];
    uint32_t from;
    uint64_t start_ns, deadline_ns;
    struct sockaddr_storage src;
} shoal_oob_hs_t;

struct shoal_oob_acceptor {
    int lfd;
    shoal_oob_auth_t auth;
    int (*expect)(void *arg, uint32_t rank);
    void *arg;
    uint64_t hello_ns;                      /* a new connection's hello deadline */
    shoal_oob_hs_t slots[SHOAL_OOB_SLOTS];
    shoal_oob_addr_t *trusted;              /* the peer hosts told to the breaker */
    int ntrusted, trusted_cap;
    shoal_log_limit_t accept_warn;          /* accept()'s failures, logged once a second */
    shoal_log_limit_t stall_warn;           /* the stall's error, logged once a second */
    shoal_accept_stall_t accept_stall;      /* accept() failing for want of a resource */
};

shoal_status_t shoal_oob_acceptor_create(int lfd, const shoal_oob_auth_t *a,
                                         int (*expect)(void *arg, uint32_t rank), void *arg,
                                         shoal_oob_acceptor_t **acc_p)
{
    shoal_oob_acceptor_t *acc = calloc(1, sizeof(*acc));
    int hello_ms = shoal_tcp_config.hello_timeout_ms;
    if (acc == NULL) {
        shoal_error(IB, "out of memory allocating the out-of-band acceptor");
        return SHOAL_ERR_NO_MEMORY;
    }
    acc->lfd = lfd;
    acc->auth = *a;
    acc->expect = expect;
    acc->arg = arg;
    acc->hello_ns = (uint64_t)(hello_ms > 0 && hello_ms < SHOAL_OOB_HANDSHAKE_MS
                                   ? hello_ms : SHOAL_OOB_HANDSHAKE_MS) * 1000000ull;
    for (int i = 0; i < SHOAL_OOB_SLOTS; i++) {
        acc->slots[i].fd = -1;
    }
    *acc_p = acc;
    return SHOAL_OK;
}

void shoal_oob_acceptor_trust(shoal_oob_acceptor_t *acc, const shoal_oob_addr_t *addr)
{
    struct sockaddr_storage ss;
    const shoal_oob_addr_t *last = acc->ntrusted > 0 ? &acc->trusted[acc->ntrusted - 1] : NULL;
    /* Every peer, however many: kept up to 1024 addresses (one per rank), the hosts of the
     * peers past them could be refused like strangers. The breaker counts a host by its IP:
     * the ranks of one host, usually in a row, take one entry. */
    if (last != NULL && last->family == addr->family && memcmp(last->ip, addr->ip, 16) == 0) {
        return;
    }
    if (acc->ntrusted == acc->trusted_cap) {
        int cap = acc->trusted_cap > 0 ? 2 * acc->trusted_cap : 64;
        shoal_oob_addr_t *t = realloc(acc->trusted, (size_t)cap * sizeof(*t));
        if (t == NULL) {
            shoal_warn(IB, "out of memory: the circuit breaker may refuse the host of a peer "
                       "(%d hosts trusted)", acc->ntrusted);
            return;
        }
        acc->trusted = t;
        acc->trusted_cap = cap;
    }
    acc->trusted[acc->ntrusted++] = *addr;
    (void)shoal_oob_sockaddr(addr, &ss);
    shoal_tenant_breaker_trust((struct sockaddr *)&ss, 1);
}

static void shoal_oob_hs_close(shoal_oob_hs_t *hs)
{
    if (hs->fd >= 0) {
        close(hs->fd);
    }
    hs->fd = -1;
    hs->state = SHOAL_OOB_HS_FREE;
}

void shoal_oob_acceptor_destroy(shoal_oob_acceptor_t *acc)
{
    if (acc == NULL) {
        return;
    }
    for (int i = 0; i < SHOAL_OOB_SLOTS; i++) {
        shoal_oob_hs_close(&acc->slots[i]);
    }
    for (int i = 0; i < acc->ntrusted; i++) {
        struct sockaddr_storage ss;
        (void)shoal_oob_sockaddr(&acc->trusted[i], &ss);
        shoal_tenant_breaker_trust((struct sockaddr *)&ss, -1);
    }
    free(acc->trusted);
    shoal_secret_wipe(acc, sizeof(*acc));
    free(acc);
}

/* Refuse, count against the source, log in full once per source per minute, forget. */
static void shoal_oob_hs_refuse(shoal_oob_acceptor_t *acc, shoal_oob_hs_t *hs, const char *why)
{
    char from[SHOAL_OOB_NAME_MAX];
    shoal_oob_sockaddr_str(&hs->src, from, sizeof(from));
    if (shoal_tenant_breaker_note_fail((struct sockaddr *)&hs->src)) {
        shoal_error(IB, "rank %u: refused an out-of-band connection from %s: %s",
                    acc->auth.self, from, why);
    } else {
        shoal_trace(IB, "rank %u: refused an out-of-band connection from %s: %s",
                    acc->auth.self, from, why);
    }
    shoal_oob_hs_close(hs);
}

/* A free slot, else the oldest connection without a hello, else the oldest without a proof. */
static shoal_oob_hs_t *shoal_oob_acceptor_slot(shoal_oob_acceptor_t *acc)
{
    shoal_oob_hs_t *victim = NULL;
    for (int i = 0; i < SHOAL_OOB_SLOTS; i++) {
        if (acc->slots[i].state == SHOAL_OOB_HS_FREE) {
            return &acc->slots[i];
        }
    }
    for (int tier = 0; tier < 2 && victim == NULL; tier++) {
        for (int i = 0; i < SHOAL_OOB_SLOTS; i++) {
            shoal_oob_hs_t *hs = &acc->slots[i];
            int ok = tier == 0 ? hs->state == SHOAL_OOB_HS_HELLO
                               : hs->state != SHOAL_OOB_HS_ACK;
            if (ok && (victim == NULL || hs->start_ns < victim->start_ns)) {
                victim = hs;
            }
        }
    }
    if (victim != NULL) {
        shoal_oob_hs_refuse(acc, victim, "evicted: every handshake slot is taken and it has "
                            "not proved the job secret");
    }
    return victim;
}

int shoal_oob_acceptor_add(shoal_oob_acceptor_t *acc, int fd,
                           const struct sockaddr_storage *src)
{
    shoal_oob_hs_t *hs = shoal_oob_acceptor_slot(acc);
    int one = 1;
    if (hs == NULL) {
        return 0;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    memset(hs, 0, sizeof(*hs));
    hs->fd = fd;
    hs->state = SHOAL_OOB_HS_HELLO;
    hs->len = SHOAL_OOB_HELLO_BYTES + SHOAL_OOB_NONCE_BYTES;
    memcpy(&hs->src, src, sizeof(*src));
    hs->start_ns = shoal_time_ns();
    hs->deadline_ns = hs->start_ns + acc->hello_ns;
    return 1;
}

static void shoal_oob_acceptor_accept(shoal_oob_acceptor_t *acc)
{
    /* At most one slot set per pass: the caller then drives every slot once (a real
     * connector's hello, sent right after its connect, moves it past the first eviction tier)
     * and looks at its deadline and abort flag. Unbounded, a stranger connecting as fast as we
     * accept kept us here: each real connection was evicted before its hello was read, and
     * the deadline passed unseen. */
    for (int n = 0; n < SHOAL_OOB_SLOTS; n++) {
        struct sockaddr_storage ss;
        socklen_t slen = sizeof(ss);
        int fd = accept4(acc->lfd, (struct sockaddr *)&ss, &slen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            unsigned missed;
            if (err == EINTR || err == ECONNABORTED) {
                continue;
            }
            if (shoal_accept_stall_note(&acc->accept_stall, err) == 0 &&
                (err == EAGAIN || err == EWOULDBLOCK)) {
                return;
            }
            /* One that fails for want of a resource (EMFILE, ENFILE) fails again at every
             * call while the connection waits in the backlog, whose listener stays readable:
             * logged at most once a second (it was every call, tens of thousands a second). */
            if (shoal_log_limit_pass(&acc->accept_warn, 1000000000ull, &missed)) {
                shoal_warn(IB, "accept(fd %d) failed: %s (%u more failures not logged)",
                           acc->lfd, strerror(err), missed);
            }
            return;
        }
        (void)shoal_accept_stall_note(&acc->accept_stall, 0);
        if (!shoal_tenant_breaker_admit((struct sockaddr *)&ss)) {
            close(fd); /* logged by the breaker, once a minute */
            continue;
        }
        if (!shoal_oob_acceptor_add(acc, fd, &ss)) {
            close(fd);
        }
    }
}

/* Moves the slot's buffer. 1 complete, 0 would block, -1 closed or failed. */
static int shoal_oob_hs_io(shoal_oob_hs_t *hs)
{
    int sending = hs->state == SHOAL_OOB_HS_NONCE || hs->state == SHOAL_OOB_HS_ACK;
    return shoal_sock_step(hs->fd, hs->buf, &hs->off, hs->len, sending);
}

static void shoal_oob_hs_next(shoal_oob_hs_t *hs, int state, size_t len)
{
    hs->state = state;
    hs->off = 0;
    hs->len = len;
}

/* One completed transfer of hs. 1 when the connector is authenticated. */
static int shoal_oob_hs_step(shoal_oob_acceptor_t *acc, shoal_oob_hs_t *hs)
{
    char why[160];
    uint8_t want[SHOAL_HMAC_BYTES];

    switch (hs->state) {
    case SHOAL_OOB_HS_HELLO:
        switch (shoal_oob_hello_ok(&acc->auth, hs->buf, acc->expect, acc->arg, &hs->from, why,
                                   sizeof(why))) {
        case 1:
            break;
        case SHOAL_OOB_EXPECT_LATER:
            shoal_trace(IB, "rank %u: closed an out-of-band connection: %s", acc->auth.self,
                        why);
            shoal_oob_hs_close(hs);
            return 0;
        default:
            shoal_oob_hs_refuse(acc, hs, why);
            return 0;
        }
        memcpy(hs->nc, hs->buf + SHOAL_OOB_HELLO_BYTES, SHOAL_OOB_NONCE_BYTES);
        if (shoal_random_bytes(hs->na, sizeof(hs->na)) != SHOAL_OK) {
            shoal_oob_hs_refuse(acc, hs, "no random bytes for a nonce");
            return 0;
        }
        memcpy(hs->buf, hs->na, sizeof(hs->na));
        hs->deadline_ns = hs->start_ns + SHOAL_OOB_HANDSHAKE_MS * 1000000ull;
        shoal_oob_hs_next(hs, SHOAL_OOB_HS_NONCE, SHOAL_OOB_NONCE_BYTES);
        return 0;
    case SHOAL_OOB_HS_NONCE:
        shoal_oob_hs_next(hs, SHOAL_OOB_HS_PROOF, SHOAL_HMAC_BYTES);
        return 0;
    case SHOAL_OOB_HS_PROOF:
        /* Verify first, then prove. */
        if (shoal_oob_proof(&acc->auth, "-con", hs->nc, hs->na, hs->from, acc->auth.self,
                            want) != SHOAL_OK ||
            !shoal_memeq_ct(want, hs->buf, SHOAL_HMAC_BYTES)) {
            snprintf(why, sizeof(why), "rank %u failed to prove the job secret", hs->from);
            shoal_oob_hs_refuse(acc, hs, why);
            return 0;
        }
        if (shoal_oob_proof(&acc->auth, "-acc", hs->nc, hs->na, hs->from, acc->auth.self,
                            hs->buf) != SHOAL_OK) {
            shoal_oob_hs_refuse(acc, hs, "HMAC failed");
            return 0;
        }
        shoal_oob_hs_next(hs, SHOAL_OOB_HS_ACK, SHOAL_HMAC_BYTES);
        return 0;
    case SHOAL_OOB_HS_ACK:
        if (acc->expect(acc->arg, hs->from) == SHOAL_OOB_EXPECT_LATER) {
            shoal_trace(IB, "rank %u: closed an authenticated out-of-band connection of rank "
                        "%u: our own dial to it wins", acc->auth.self, hs->from);
            shoal_oob_hs_close(hs);
            return 0;
        }
        if (acc->expect(acc->arg, hs->from) != 1) {
            snprintf(why, sizeof(why), "rank %u is already connected", hs->from);
            shoal_oob_hs_refuse(acc, hs, why);
            return 0;
        }
        shoal_tenant_breaker_note_ok((struct sockaddr *)&hs->src);
        return 1;
    }
    return 0;
}

/* Drives hs as far as it goes now. 1 when authenticated. */
static int shoal_oob_hs_drive(shoal_oob_acceptor_t *acc, shoal_oob_hs_t *hs, uint64_t now)
{
    while (hs->state != SHOAL_OOB_HS_FREE) {
        int r = shoal_oob_hs_io(hs);
        if (r < 0) {
            shoal_oob_hs_refuse(acc, hs, "connection closed during the handshake");
            return 0;
        }
        if (r == 0) {
            if (now >= hs->deadline_ns) {
                shoal_oob_hs_refuse(acc, hs, hs->state == SHOAL_OOB_HS_HELLO
                                                 ? "no hello in time"
                                                 : "handshake not finished in time");
            }
            return 0;
        }
        if (shoal_oob_hs_step(acc, hs)) {
            return 1;
        }
    }
    return 0;
}

shoal_status_t shoal_oob_acceptor_next(shoal_oob_acceptor_t *acc, uint64_t deadline_ns,
                                       uint32_t *peer_p, int *fd_p)
{
    for (;;) {
        struct pollfd p[SHOAL_OOB_SLOTS + 1];
        int n = 0, stalled;
        uint64_t now = shoal_time_ns();
        char why[160];

        shoal_oob_acceptor_accept(acc);
        /* out of file descriptors: the ranks in the backlog can never be taken; said now,
         * not at the deadline */
        if (shoal_accept_stall_over(&acc->accept_stall, SHOAL_ACCEPT_STALL_NS, why,
                                    sizeof(why))) {
            unsigned missed;
            /* lazy ib's progress calls again at once, every call failing the same way: it
             * was logged at every one, thousands of lines a second */
            if (shoal_log_limit_pass(&acc->stall_warn, 1000000000ull, &missed)) {
                shoal_error(IB, "out-of-band listener (fd %d): %s (%u more calls failed so, "
                            "not logged)", acc->lfd, why, missed);
            }
            return SHOAL_ERR_SYSTEM;
        }
        for (int i = 0; i < SHOAL_OOB_SLOTS; i++) {
            shoal_oob_hs_t *hs = &acc->slots[i];
            if (hs->state != SHOAL_OOB_HS_FREE && shoal_oob_hs_drive(acc, hs, now)) {
                *peer_p = hs->from;
                *fd_p = hs->fd;
                hs->fd = -1;
                hs->state = SHOAL_OOB_HS_FREE;
                return SHOAL_OK;
            }
        }
        if (shoal_aborted(acc->auth.abort_flag)) {
            return SHOAL_ERR_ABORTED;
        }
        if (shoal_deadline_passed(deadline_ns)) {
            return SHOAL_ERR_TIMEOUT;
        }
        /* a stalled listener stays readable: left out, and the wait is short */
        stalled = acc->accept_stall.since_ns != 0;
        p[n++] = (struct pollfd){.fd = stalled ? -1 : acc->lfd, .events = POLLIN};
        n += shoal_oob_acceptor_pollfds(acc, p + 1, SHOAL_OOB_SLOTS);
        if (poll(p, (nfds_t)n, shoal_deadline_left_ms(deadline_ns,
                                                      stalled ? 1 : SHOAL_OOB_SLICE_MS)) < 0 &&
            errno != EINTR) {
            shoal_error(IB, "poll() of %d out-of-band sockets failed: %s", n, strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
    }
}

int shoal_oob_acceptor_pollfds(const shoal_oob_acceptor_t *acc, struct pollfd *p, int max)
{
    int n = 0;
    for (int i = 0; acc != NULL && i < SHOAL_OOB_SLOTS && n < max; i++) {
        const shoal_oob_hs_t *hs = &acc->slots[i];
        if (hs->state != SHOAL_OOB_HS_FREE) {
            int out = hs->state == SHOAL_OOB_HS_NONCE || hs->state == SHOAL_OOB_HS_ACK;
            p[n++] = (struct pollfd){.fd = hs->fd, .events = out ? POLLOUT : POLLIN};
        }
    }
    return n;
}

int shoal_oob_acceptor_busy(const shoal_oob_acceptor_t *acc)
{
    int n = 0;
    for (int i = 0; acc != NULL && i < SHOAL_OOB_SLOTS; i++) {
        n += acc->slots[i].state != SHOAL_OOB_HS_FREE;
    }
    return n;
}

/* ---- the non-blocking dial ------------------------------------------------------------------ */

enum {
    SHOAL_OOB_DIAL_CONNECT = 0, /* connect() under way */
    SHOAL_OOB_DIAL_HELLO,       /* sending hello + nonce_c */
    SHOAL_OOB_DIAL_NONCE,       /* reading nonce_a */
    SHOAL_OOB_DIAL_PROOF,       /* sending our proof */
    SHOAL_OOB_DIAL_ACK,         /* reading the acceptor's proof */
    SHOAL_OOB_DIAL_DONE,
};

void shoal_oob_dial_close(shoal_oob_dial_t *d)
{
    if (d->fd >= 0) {
        close(d->fd);
    }
    d->fd = -1;
    shoal_secret_wipe(d->nc, sizeof(d->nc));
    shoal_secret_wipe(d->na, sizeof(d->na));
}

shoal_status_t shoal_oob_dial_start(shoal_oob_dial_t *d, const shoal_oob_addr_t *addr,
                                    const shoal_oob_auth_t *a, uint32_t peer)
{
    struct sockaddr_storage ss;
    socklen_t slen = shoal_oob_sockaddr(addr, &ss);
    memset(d, 0, sizeof(*d));
    d->peer = peer;
    d->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (d->fd < 0) {
        return SHOAL_ERR_SYSTEM;
    }
    if (shoal_random_bytes(d->nc, sizeof(d->nc)) != SHOAL_OK) {
        close(d->fd); /* the caller closes only a dial that started */
        d->fd = -1;
        return SHOAL_ERR_SYSTEM;
    }
    shoal_oob_hello_make(a, peer, d->nc, d->buf);
    d->len = SHOAL_OOB_HELLO_BYTES + SHOAL_OOB_NONCE_BYTES;
    if (connect(d->fd, (struct sockaddr *)&ss, slen) == 0) {
        d->state = SHOAL_OOB_DIAL_HELLO;
    } else if (errno == EINPROGRESS) {
        d->state = SHOAL_OOB_DIAL_CONNECT;
    } else {
        d->refused = errno == ECONNREFUSED;
        d->state = SHOAL_OOB_DIAL_CONNECT; /* reported by the first step */
        d->err = errno;
    }
    return SHOAL_OK;
}

short shoal_oob_dial_events(const shoal_oob_dial_t *d)
{
    return d->state == SHOAL_OOB_DIAL_NONCE || d->state == SHOAL_OOB_DIAL_ACK ? POLLIN
                                                                            : POLLOUT;
}

static int shoal_oob_dial_fail(shoal_oob_dial_t *d, shoal_status_t st, shoal_status_t *st_p)
{
    *st_p = st;
    shoal_oob_dial_close(d);
    return -1;
}

int shoal_oob_dial_step(shoal_oob_dial_t *d, const shoal_oob_auth_t *a, shoal_status_t *st_p)
{
    uint8_t want[SHOAL_HMAC_BYTES];
    if (d->fd < 0) {
        *st_p = SHOAL_ERR_INTERNAL;
        return -1;
    }
    if (d->state == SHOAL_OOB_DIAL_CONNECT) {
        int err = d->err, one = 1;
        socklen_t elen = sizeof(err);
        if (err == 0) {
            struct pollfd p = {.fd = d->fd, .events = POLLOUT};
            if (poll(&p, 1, 0) <= 0) {
                return 0;
            }
            if (getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
                err = errno;
            }
        }
        if (err != 0) {
            d->refused = err == ECONNREFUSED || err == ECONNRESET;
            errno = err;
            return shoal_oob_dial_fail(d, d->refused || err == ETIMEDOUT || err == EHOSTUNREACH
                                              || err == ENETUNREACH ? SHOAL_ERR_PEER_FAILED
                                                                    : SHOAL_ERR_TRANSPORT,
                                       st_p);
        }
        (void)setsockopt(d->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        d->off = 0;
        d->state = SHOAL_OOB_DIAL_HELLO;
    }
    while (d->state != SHOAL_OOB_DIAL_DONE) {
        int sending = d->state == SHOAL_OOB_DIAL_HELLO || d->state == SHOAL_OOB_DIAL_PROOF;
        int r = shoal_sock_step(d->fd, d->buf, &d->off, d->len, sending);
        if (r < 0) {
            return shoal_oob_dial_fail(d, SHOAL_ERR_PEER_FAILED, st_p);
        }
        if (r == 0) {
            return 0;
        }
        d->off = 0;
        switch (d->state) {
        case SHOAL_OOB_DIAL_HELLO:
            d->state = SHOAL_OOB_DIAL_NONCE;
            d->len = SHOAL_OOB_NONCE_BYTES;
            break;
        case SHOAL_OOB_DIAL_NONCE:
            memcpy(d->na, d->buf, SHOAL_OOB_NONCE_BYTES);
            if (shoal_oob_proof(a, "-con", d->nc, d->na, a->self, d->peer, d->buf) != SHOAL_OK) {
                return shoal_oob_dial_fail(d, SHOAL_ERR_SYSTEM, st_p);
            }
            d->state = SHOAL_OOB_DIAL_PROOF;
            d->len = SHOAL_HMAC_BYTES;
            break;
        case SHOAL_OOB_DIAL_PROOF:
            d->proved = 1;
            d->state = SHOAL_OOB_DIAL_ACK;
            d->len = SHOAL_HMAC_BYTES;
            break;
        case SHOAL_OOB_DIAL_ACK:
            if (shoal_oob_proof(a, "-acc", d->nc, d->na, a->self, d->peer, want) != SHOAL_OK ||
                !shoal_memeq_ct(want, d->buf, SHOAL_HMAC_BYTES)) {
                return shoal_oob_dial_fail(d, SHOAL_ERR_AUTH, st_p);
            }
            d->state = SHOAL_OOB_DIAL_DONE;
            break;
        }
    }
    shoal_secret_wipe(d->nc, sizeof(d->nc));
    shoal_secret_wipe(d->na, sizeof(d->na));
    return 1;
}
