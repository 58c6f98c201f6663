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
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- uid ------------------------------------------------------------------------------ */

void shoal_boot_uid_encode(const shoal_boot_uid_t *u, shoal_uid_t *uid)
{
    uint8_t *p = (uint8_t *)uid->internal;
    uint32_t magic = SHOAL_UID_MAGIC;
    uint16_t version = SHOAL_UID_VERSION, family = u->root.ss_family, port;

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
    shoal_put_le(p + 60, u->ident.epoch, 8);
    memcpy(p + 68, u->ident.tenant, SHOAL_BOOT_DIGEST);
    memcpy(p + 84, u->ident.job, SHOAL_BOOT_DIGEST);
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
    if (magic != SHOAL_UID_MAGIC || version != SHOAL_UID_VERSION ||
        (family != AF_INET && family != AF_INET6)) {
        shoal_error(BOOT, "unique id is not a shoal id of this version (magic 0x%08x, version "
                    "%u, expected version %d)", magic, version, SHOAL_UID_VERSION);
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
    u->ident.epoch = shoal_get_le(p + 60, 8);
    memcpy(u->ident.tenant, p + 68, SHOAL_BOOT_DIGEST);
    memcpy(u->ident.job, p + 84, SHOAL_BOOT_DIGEST);
    return SHOAL_OK;
}

/* ---- identity ------------------------------------------------------------------------- */

/* A name's digest: HMAC-SHA256 under a public label (a hash; names are not secret, but do
 * not fit an id), truncated. */
static shoal_status_t shoal_boot_name_digest(const char *label, const char *name, uint8_t *out)
{
    uint8_t full[SHOAL_HMAC_BYTES];
    SHOAL_CHECK(shoal_hmac((const uint8_t *)label, strlen(label), name,
                           strnlen(name, SHOAL_TENANT_NAME_MAX), full));
    memcpy(out, full, SHOAL_BOOT_DIGEST);
    return SHOAL_OK;
}

shoal_status_t shoal_boot_ident_make(const shoal_tenant_id_t *id, shoal_boot_ident_t *out)
{
    memset(out, 0, sizeof(*out));
    SHOAL_CHECK(shoal_boot_name_digest("shoal-ident-tenant", id->tenant, out->tenant));
    SHOAL_CHECK(shoal_boot_name_digest("shoal-ident-job", id->job, out->job));
    out->epoch = id->epoch;
    return SHOAL_OK;
}

shoal_status_t shoal_boot_ident_check(const shoal_boot_ident_t *want,
                                      const shoal_boot_ident_t *mine,
                                      const shoal_tenant_id_t *id, char *why, size_t len)
{
    if (!shoal_memeq_ct(want->tenant, mine->tenant, SHOAL_BOOT_DIGEST)) {
        snprintf(why, len, "this rank is configured for tenant \"%s\" (shoal_config_t.tenant "
                 "or SHOAL_TENANT), but the unique id was made for another tenant", id->tenant);
    } else if (!shoal_memeq_ct(want->job, mine->job, SHOAL_BOOT_DIGEST)) {
        snprintf(why, len, "this rank is configured for job \"%s\" (shoal_config_t.job_name, "
                 "SHOAL_JOB or SLURM_JOB_ID), but the unique id was made for another job",
                 id->job);
    } else if (want->epoch != mine->epoch) {
        snprintf(why, len, "this rank is of epoch %llu (SHOAL_EPOCH or SLURM_RESTART_COUNT), "
                 "but the unique id was made for epoch %llu",
                 (unsigned long long)mine->epoch, (unsigned long long)want->epoch);
    } else {
        return SHOAL_OK;
    }
    return SHOAL_ERR_PERMISSION;
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

shoal_status_t shoal_boot_hex_decode(const char *hex, uint8_t *out, size_t len)
{
    if (hex == NULL || strlen(hex) != 2 * len) {
        return SHOAL_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < len; i++) {
        int hi = shoal_boot_hexval(hex[2 * i]), lo = shoal_boot_hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return SHOAL_ERR_INVALID_ARG;
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return SHOAL_OK;
}

shoal_status_t shoal_boot_uid_from_hex(const char *hex, shoal_uid_t *uid)
{
    uint8_t raw[SHOAL_UID_BYTES];
    if (shoal_boot_hex_decode(hex, raw, sizeof(raw)) != SHOAL_OK) {
        shoal_secret_wipe(raw, sizeof(raw));
        /* Never echo the text: it holds the job secret. */
        shoal_error(BOOT, "SHOAL_UID must be exactly %d hex characters", 2 * SHOAL_UID_BYTES);
        return SHOAL_ERR_INVALID_ARG;
    }
    memcpy(uid->internal, raw, sizeof(raw));
    shoal_secret_wipe(raw, sizeof(raw));
    return SHOAL_OK;
}

shoal_status_t shoal_boot_root_split(const char *spec, char *host, size_t hostlen,
                                     uint16_t *port_p)
{
    const char *colon, *h = spec, *hend;
    char *end;
    unsigned long port;

    if (spec == NULL || host == NULL || hostlen == 0) {
        return SHOAL_ERR_INVALID_ARG;
    }
    colon = strrchr(spec, ':');
    if (colon == NULL || colon == spec) {
        return SHOAL_ERR_INVALID_ARG;
    }
    hend = colon;
    if (spec[0] == '[') { /* [IPv6]:port */
        if (colon[-1] != ']' || colon - spec < 3) {
            return SHOAL_ERR_INVALID_ARG;
        }
        h = spec + 1;
        hend = colon - 1;
    } else if (memchr(spec, ':', (size_t)(colon - spec)) != NULL) {
        return SHOAL_ERR_INVALID_ARG; /* a bare IPv6 address needs brackets */
    }
    if ((size_t)(hend - h) >= hostlen || hend == h) {
        return SHOAL_ERR_INVALID_ARG;
    }
    for (const char *c = h; c < hend; c++) {
        if (*c <= ' ' || *c > '~' || *c == '[' || *c == ']' || *c == '/') {
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    if (colon[1] < '1' || colon[1] > '9') { /* digits only, no sign, no leading zero */
        return SHOAL_ERR_INVALID_ARG;
    }
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || port == 0 || port > 65535 || end - (colon + 1) > 5) {
        return SHOAL_ERR_INVALID_ARG;
    }
    memcpy(host, h, (size_t)(hend - h));
    host[hend - h] = '\0';
    *port_p = (uint16_t)port;
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

shoal_status_t shoal_sock_poll(int fd, short events, uint64_t deadline_ns,
                               const volatile int *abort_flag)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int ret;
        if (shoal_aborted(abort_flag)) {
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

/* First address of one family on an interface that fits: pass 0 wants non-loopback,
 * non-docker interfaces, 1 docker bridges, 2 loopback; with a spec, any interface it names. */
static int shoal_boot_scan(struct ifaddrs *list, const char *spec, int family, int pass,
                           struct sockaddr_storage *ss, socklen_t *len_p)
{
    for (struct ifaddrs *it = list; it != NULL; it = it->ifa_next) {
        int loop, docker;
        if (it->ifa_addr == NULL || it->ifa_addr->sa_family != family ||
            (it->ifa_flags & IFF_UP) == 0) {
            continue;
        }
        if (family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)it->ifa_addr)->sin6_addr)) {
            continue;
        }
        loop = (it->ifa_flags & IFF_LOOPBACK) != 0;
        docker = strncmp(it->ifa_name, "docker", 6) == 0;
        if (spec != NULL ? !shoal_ifname_match(spec, it->ifa_name)
                         : (pass == 0 && (loop || docker)) || (pass == 1 && (loop || !docker)) ||
                               (pass == 2 && !loop)) {
            continue;
        }
        *len_p = family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
        memset(ss, 0, sizeof(*ss));
        memcpy(ss, it->ifa_addr, *len_p);
        return 1;
    }
    return 0;
}

/* The address published in the unique id (and listened on): SHOAL_SOCKET_IFNAME's first
 * interface, IPv4 before IPv6, as the tcp transport chooses; without it the first IPv4
 * interface that is up and not loopback (reachable from other hosts and network namespaces),
 * docker bridges last, else 127.0.0.1. */
shoal_status_t shoal_boot_pick_addr(struct sockaddr_storage *ss, socklen_t *len_p)
{
    const char *spec = shoal_cfg_getenv("SOCKET_IFNAME");
    struct ifaddrs *ifs = NULL;
    struct sockaddr_in *out = (struct sockaddr_in *)ss;
    int found = 0;

    if (spec != NULL && spec[0] == '\0') {
        spec = NULL;
    }
    memset(ss, 0, sizeof(*ss));
    out->sin_family = AF_INET;
    out->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *len_p = sizeof(*out);
    if (getifaddrs(&ifs) != 0) {
        shoal_warn(BOOT, "getifaddrs failed: %s; using loopback", strerror(errno));
        return SHOAL_OK;
    }
    for (int pass = 0; pass < (spec != NULL ? 1 : 3) && !found; pass++) {
        found = shoal_boot_scan(ifs, spec, AF_INET, pass, ss, len_p) ||
                (spec != NULL && shoal_boot_scan(ifs, spec, AF_INET6, pass, ss, len_p));
    }
    freeifaddrs(ifs);
    if (!found && spec != NULL) {
        shoal_error(BOOT, "SHOAL_SOCKET_IFNAME=%s: no interface of that name is up with an "
                    "address", spec);
        return SHOAL_ERR_TRANSPORT;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_boot_listen_addr(int local_only, struct sockaddr_storage *ss,
                                      socklen_t *len_p, int *bind_any_p)
{
    int mode = shoal_core_config.boot_bind;
    *bind_any_p = 0;
    if (mode == SHOAL_BOOT_BIND_LOOPBACK || (local_only && mode != SHOAL_BOOT_BIND_ANY)) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        memset(ss, 0, sizeof(*ss));
        s4->sin_family = AF_INET;
        s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        *len_p = sizeof(*s4);
        return SHOAL_OK;
    }
    SHOAL_CHECK(shoal_boot_pick_addr(ss, len_p));
    *bind_any_p = mode == SHOAL_BOOT_BIND_ANY;
    return SHOAL_OK;
}

/* ---- authentication ----------------------------------------------------------------- */

/* Canonical bytes of what a hello claims (rank, nranks, client nonce, identity). */
static size_t shoal_boot_hello_claim(const shoal_boot_hello_t *h, uint8_t *p)
{
    size_t off = 0;
    shoal_put_le(p + off, (uint32_t)h->rank, 4);
    off += 4;
    shoal_put_le(p + off, (uint32_t)h->nranks, 4);
    off += 4;
    memcpy(p + off, h->nonce, SHOAL_BOOT_NONCE);
    off += SHOAL_BOOT_NONCE;
    memcpy(p + off, h->ident.tenant, SHOAL_BOOT_DIGEST);
    off += SHOAL_BOOT_DIGEST;
    memcpy(p + off, h->ident.job, SHOAL_BOOT_DIGEST);
    off += SHOAL_BOOT_DIGEST;
    shoal_put_le(p + off, h->ident.epoch, 8);
    return off + 8;
}

#define SHOAL_BOOT_CLAIM_MAX (8 + SHOAL_BOOT_NONCE + 2 * SHOAL_BOOT_DIGEST + 8)

/* HMAC(secret, label(16) | root nonce | claim). */
static void shoal_boot_proof(const uint8_t *secret, const char *label, const uint8_t *root_nonce,
                             const shoal_boot_hello_t *h, uint8_t *mac)
{
    uint8_t msg[16 + SHOAL_BOOT_NONCE + SHOAL_BOOT_CLAIM_MAX];
    size_t n;
    memcpy(msg, label, 16);
    memcpy(msg + 16, root_nonce, SHOAL_BOOT_NONCE);
    n = 16 + SHOAL_BOOT_NONCE + shoal_boot_hello_claim(h, msg + 16 + SHOAL_BOOT_NONCE);
    if (shoal_hmac(secret, SHOAL_SECRET_BYTES, msg, n, mac) != SHOAL_OK) {
        /* Can never match a real proof: the two labels fill with different bytes. */
        memset(mac, label[11] == 'h' ? 0 : 0xff, SHOAL_HMAC_BYTES);
    }
}

void shoal_boot_hello_mac(const uint8_t *secret, const uint8_t *root_nonce,
                          const shoal_boot_hello_t *h, uint8_t *mac)
{
    shoal_boot_proof(secret, "shoal-boot-hello", root_nonce, h, mac);
}

void shoal_boot_welcome_mac(const uint8_t *secret, const uint8_t *root_nonce,
                            const shoal_boot_hello_t *h, uint8_t *mac)
{
    shoal_boot_proof(secret, "shoal-boot-welco", root_nonce, h, mac);
}

void shoal_boot_peer_hello_mac(const uint8_t *secret, const uint8_t *lnonce,
                               const shoal_boot_hello_t *h, uint8_t *mac)
{
    shoal_boot_proof(secret, "shoal-peer-hello", lnonce, h, mac);
}

void shoal_boot_peer_welcome_mac(const uint8_t *secret, const uint8_t *lnonce,
                                 const shoal_boot_hello_t *h, uint8_t *mac)
{
    shoal_boot_proof(secret, "shoal-peer-welco", lnonce, h, mac);
}

static void shoal_boot_derive_key(const uint8_t *secret, const char *label,
                                  const uint8_t *nonce, const shoal_boot_hello_t *h,
                                  uint8_t key[SHOAL_HMAC_BYTES])
{
    uint8_t ctx[SHOAL_BOOT_NONCE + SHOAL_BOOT_CLAIM_MAX];
    size_t n;
    memcpy(ctx, nonce, SHOAL_BOOT_NONCE);
    n = SHOAL_BOOT_NONCE + shoal_boot_hello_claim(h, ctx + SHOAL_BOOT_NONCE);
    if (shoal_kdf(secret, SHOAL_SECRET_BYTES, label, ctx, n, key) != SHOAL_OK) {
        /* Unusable key: every frame MAC then fails, the bootstrap with it. */
        (void)shoal_random_bytes(key, SHOAL_HMAC_BYTES);
    }
}

void shoal_boot_peer_session_key(const uint8_t *secret, const uint8_t *lnonce,
                                 const shoal_boot_hello_t *h, uint8_t key[SHOAL_HMAC_BYTES])
{
    shoal_boot_derive_key(secret, "boot-peer", lnonce, h, key);
}

void shoal_boot_session_key(const uint8_t *secret, const uint8_t *root_nonce,
                            const shoal_boot_hello_t *h, uint8_t key[SHOAL_HMAC_BYTES])
{
    shoal_boot_derive_key(secret, "boot-session", root_nonce, h, key);
}

void shoal_boot_payload_digest(const void *payload, size_t len,
                               uint8_t digest[SHOAL_HMAC_BYTES])
{
    static const uint8_t label[] = "shoal-boot-payload";
    if (shoal_hmac(label, sizeof(label) - 1, len > 0 ? payload : label, len, digest) !=
        SHOAL_OK) {
        memset(digest, 0, SHOAL_HMAC_BYTES);
    }
}

void shoal_boot_frame_mac(const uint8_t key[SHOAL_HMAC_BYTES], int dir, uint64_t seq,
                          const shoal_boot_frame_t *f, const uint8_t digest[SHOAL_HMAC_BYTES],
                          uint8_t mac[SHOAL_BOOT_MAC])
{
    uint8_t msg[16 + 1 + 8 + 16 + SHOAL_HMAC_BYTES];
    size_t off = 0;
    memcpy(msg, "shoal-boot-frame", 16);
    off += 16;
    msg[off++] = (uint8_t)dir;
    shoal_put_le(msg + off, seq, 8);
    off += 8;
    shoal_put_le(msg + off, f->magic, 4);
    shoal_put_le(msg + off + 4, f->type, 4);
    shoal_put_le(msg + off + 8, f->len, 4);
    shoal_put_le(msg + off + 12, f->round, 4);
    off += 16;
    memcpy(msg + off, digest, SHOAL_HMAC_BYTES);
    off += SHOAL_HMAC_BYTES;
    if (shoal_hmac(key, SHOAL_HMAC_BYTES, msg, off, mac) != SHOAL_OK) {
        /* Sender and receiver then disagree: the frame is refused. */
        (void)shoal_random_bytes(mac, SHOAL_BOOT_MAC);
    }
}

/* ---- client ------------------------------------------------------------------------- */

const char *shoal_boot_error(shoal_boot_t *boot)
{
    return boot->error;
}

shoal_status_t shoal_boot_fail(shoal_boot_t *b, shoal_status_t st, const char *what)
{
    snprintf(b->error, sizeof(b->error), "bootstrap with root %s: %s: %s", b->root_str, what,
             shoal_strerror(st));
    shoal_error(BOOT, "rank %d: %s", b->rank, b->error);
    return st;
}

/* Connects, retrying while the root is not listening yet (it may start a little later).
 * Non-blocking: a root whose backlog is full, or an address that drops SYNs, would otherwise
 * hold the caller in the kernel's SYN retries (about 2 minutes) past SHOAL_TIMEOUT_MS and
 * shoal_comm_abort. */
/* Every attempt until the deadline was refused: nothing listens there, and without a word
 * more the user saw only a timeout. */
static void shoal_boot_dial_refused(const shoal_boot_t *b)
{
    shoal_error(BOOT, "rank %d: nothing listens at the root's address %s (every connection "
                "refused for %d ms): the root's process is gone or never started; a SHOAL_UID "
                "left in the environment from an earlier job, or (SHOAL_ROOT) rank 0 not "
                "running?", b->rank, b->root_str, b->timeout_ms);
}

/* The dial's deadline passed: says why. last_err: the error of the last attempt that failed
 * otherwise than refused (no route to the root's host, its SYNs unanswered), 0 if none.
 * Before, such attempts left no word of their cause: "did not complete within the timeout",
 * or nothing at all, where the kernel had answered "No route to host" every time. */
static void shoal_boot_dial_timeout(const shoal_boot_t *b, int refused, int other, int last_err)
{
    if (refused > 0 && other == 0) {
        shoal_boot_dial_refused(b);
    } else if (last_err != 0) {
        shoal_error(BOOT, "rank %d: cannot connect to the root's address %s: %s (%d failed "
                    "attempt%s in %d ms, %d refused)", b->rank, b->root_str, strerror(last_err),
                    refused + other, refused + other == 1 ? "" : "s", b->timeout_ms, refused);
    } else {
        shoal_error(BOOT, "connect(%s) did not complete within the timeout", b->root_str);
    }
}

static shoal_status_t shoal_boot_dial(shoal_boot_t *b, const shoal_boot_uid_t *u,
                                      uint64_t deadline)
{
    unsigned backoff_us = 1000;
    int refused = 0, other = 0, last_err = 0; /* attempts that ended refused, or otherwise */
    for (;;) {
        int fd = socket(u->root.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1, err = 0;
        socklen_t elen = sizeof(err);
        shoal_status_t st;
        if (fd < 0) {
            shoal_error(BOOT, "socket() failed: %s", strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
        if (connect(fd, (const struct sockaddr *)&u->root, u->root_len) != 0) {
            err = errno;
        }
        if (err == EINPROGRESS) {
            st = shoal_sock_poll(fd, POLLOUT, deadline, b->abort_flag);
            if (st != SHOAL_OK) {
                close(fd);
                if (st == SHOAL_ERR_TIMEOUT) {
                    shoal_boot_dial_timeout(b, refused, other, last_err);
                }
                return st;
            }
            err = 0;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
                err = errno;
            }
        }
        if (err == 0) {
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            b->fd = fd;
            return SHOAL_OK;
        }
        close(fd);
        refused += err == ECONNREFUSED;
        other += err != ECONNREFUSED;
        last_err = err != ECONNREFUSED ? err : last_err;
        if (err != ECONNREFUSED && err != ETIMEDOUT && err != EINTR && err != ENETUNREACH &&
            err != EHOSTUNREACH) {
            shoal_error(BOOT, "connect(%s) failed: %s", b->root_str, strerror(err));
            return SHOAL_ERR_TRANSPORT;
        }
        if (shoal_aborted(b->abort_flag)) {
            return SHOAL_ERR_ABORTED;
        }
        if (shoal_deadline_passed(deadline)) {
            shoal_boot_dial_timeout(b, refused, other, last_err);
            return SHOAL_ERR_TIMEOUT;
        }
        shoal_sleep_us(backoff_us);
        backoff_us = SHOAL_MIN(backoff_us * 2, 100000);
    }
}

/* The status a root's refusal or failure notice carries, as this rank reports it. */
static shoal_status_t shoal_boot_notice_status(uint32_t round)
{
    shoal_status_t why = (shoal_status_t)(int32_t)round;
    switch (why) {
    case SHOAL_ERR_AUTH:
    case SHOAL_ERR_PERMISSION:
    case SHOAL_ERR_INVALID_ARG:
    case SHOAL_ERR_PROTOCOL:
    case SHOAL_ERR_TIMEOUT:
    case SHOAL_ERR_PEER_FAILED:
    case SHOAL_ERR_NO_MEMORY:
        return why;
    default:
        return SHOAL_ERR_PROTOCOL;
    }
}

/* The root's notice that the job's bootstrap failed. INVALID_ARG is a launch error of the
 * job (a rank joined twice, or with a rank count or number that does not fit): said so, as
 * the rank refused for it is told. */
static shoal_status_t shoal_boot_failed_notice(shoal_boot_t *b, uint32_t round)
{
    shoal_status_t st = shoal_boot_notice_status(round);
    return shoal_boot_fail(b, st, st == SHOAL_ERR_INVALID_ARG
                                      ? "the bootstrap of the job failed at the root: a rank "
                                        "joined twice or with another rank count (every rank "
                                        "needs the same SHOAL_NRANKS or launcher size and its "
                                        "own SHOAL_RANK)"
                                      : "the bootstrap of the job failed at the root");
}

/* Reads and checks the MAC trailer of a frame whose payload is in memory. */
static shoal_status_t shoal_boot_read_mac(shoal_boot_t *b, const shoal_boot_frame_t *f,
                                          const void *payload, uint64_t deadline)
{
    uint8_t mac[SHOAL_BOOT_MAC], want[SHOAL_BOOT_MAC], digest[SHOAL_HMAC_BYTES];
    shoal_status_t st = shoal_sock_read_all(b->fd, mac, sizeof(mac), deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "truncated frame from the root");
    }
    shoal_boot_payload_digest(payload, f->len, digest);
    shoal_boot_frame_mac(b->key, SHOAL_BOOT_DIR_DOWN, b->rx_seq, f, digest, want);
    if (!shoal_memeq_ct(mac, want, sizeof(mac))) {
        b->final = 1;
        return shoal_boot_fail(b, SHOAL_ERR_AUTH, "a frame from the root fails its MAC "
                               "(tampered, replayed or reordered on the way)");
    }
    b->rx_seq++;
    return SHOAL_OK;
}

/* Reads one frame of the given type and length; macd: a frame after the welcome, with a MAC
 * trailer that is checked before SHOAL_OK (nothing in payload may be used otherwise). */
shoal_status_t shoal_boot_read_frame(shoal_boot_t *b, int macd, uint32_t type, void *payload,
                                     uint32_t len, uint64_t deadline)
{
    shoal_boot_frame_t f;
    shoal_status_t st = shoal_sock_read_all(b->fd, &f, sizeof(f), deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "no answer from the root");
    }
    if (f.magic == SHOAL_BOOT_FRAME_MAGIC && f.type == SHOAL_BOOT_REFUSED && !macd &&
        f.len == 0) {
        st = shoal_boot_notice_status(f.round);
        /* A wrong secret, identity or rank is final; an eviction (TIMEOUT: the pending
         * slot went to a newcomer, or no hello in time) is worth another try, and is no
         * error: many ranks joining at once on a loaded host (info only). */
        b->final = st == SHOAL_ERR_AUTH || st == SHOAL_ERR_PERMISSION ||
                   st == SHOAL_ERR_INVALID_ARG;
        b->evicted = st == SHOAL_ERR_TIMEOUT;
        if (b->evicted) {
            snprintf(b->error, sizeof(b->error), "bootstrap with root %s: the root evicted "
                     "this rank's pending connection", b->root_str);
            shoal_info(BOOT, "rank %d: %s; redialing", b->rank, b->error);
            return st;
        }
        return shoal_boot_fail(b, st, st == SHOAL_ERR_PERMISSION
                                          ? "the root refused this rank (configured for "
                                            "another tenant, job or epoch than the job)"
                                      : st == SHOAL_ERR_AUTH
                                          ? "the root refused this rank's proof of the job "
                                            "secret (an id of another job, or ranks that do "
                                            "not all hold the same job credential)"
                                      : st == SHOAL_ERR_INVALID_ARG
                                          ? "the root refused this rank (its rank or rank "
                                            "count does not fit the job's: every rank needs "
                                            "the same SHOAL_NRANKS or launcher size, and a "
                                            "SHOAL_RANK of its own below it)"
                                          : "the root refused this rank");
    }
    if (f.magic == SHOAL_BOOT_FRAME_MAGIC && f.type == SHOAL_BOOT_FAILED && b->keyed &&
        f.len == 0) {
        SHOAL_CHECK(shoal_boot_read_mac(b, &f, NULL, deadline));
        b->final = 1;
        return shoal_boot_failed_notice(b, f.round);
    }
    if (f.magic != SHOAL_BOOT_FRAME_MAGIC || f.type != type || f.len != len) {
        /* Final: a root says only what this rank expects. Something else at the root's
         * address (another service on the port of a stale SHOAL_UID) was redialed for the
         * whole timeout, two log lines each time. */
        b->final = 1;
        return shoal_boot_fail(b, SHOAL_ERR_PROTOCOL, f.magic != SHOAL_BOOT_FRAME_MAGIC
                                                          ? "what answers at the root's address "
                                                            "is no shoal bootstrap root (a "
                                                            "SHOAL_UID or SHOAL_ROOT of a job "
                                                            "that is over?)"
                                                          : "unexpected frame from the root");
    }
    st = shoal_sock_read_all(b->fd, payload, len, deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "truncated frame from the root");
    }
    return macd ? shoal_boot_read_mac(b, &f, payload, deadline) : SHOAL_OK;
}

/* Sends header | payload | MAC in one write. */
shoal_status_t shoal_boot_send_frame(shoal_boot_t *b, uint32_t type, const void *payload,
                                     uint32_t len, uint64_t deadline)
{
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = type, .len = len,
                            .round = b->round};
    uint8_t digest[SHOAL_HMAC_BYTES], small[sizeof(f) + 4096 + SHOAL_BOOT_MAC];
    uint8_t *buf = sizeof(f) + (size_t)len + SHOAL_BOOT_MAC <= sizeof(small)
                       ? small
                       : malloc(sizeof(f) + (size_t)len + SHOAL_BOOT_MAC);
    shoal_status_t st;

    if (buf == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    shoal_boot_payload_digest(payload, len, digest);
    memcpy(buf, &f, sizeof(f));
    if (len > 0) {
        memcpy(buf + sizeof(f), payload, len);
    }
    shoal_boot_frame_mac(b->key, SHOAL_BOOT_DIR_UP, b->tx_seq++, &f, digest,
                         buf + sizeof(f) + len);
    st = shoal_sock_write_all(b->fd, buf, sizeof(f) + (size_t)len + SHOAL_BOOT_MAC, deadline,
                              b->abort_flag);
    if (buf != small) {
        free(buf);
    }
    return st;
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

    b->keyed = 0;
    b->tx_seq = 0;
    b->rx_seq = 0;
    SHOAL_CHECK(shoal_boot_read_frame(b, 0, SHOAL_BOOT_CHALLENGE, root_nonce,
                                      sizeof(root_nonce), deadline));
    memset(&msg, 0, sizeof(msg));
    msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                 .len = sizeof(msg.h)};
    msg.h.rank = b->rank;
    msg.h.nranks = b->nranks;
    msg.h.ident = u->ident;
    SHOAL_CHECK(shoal_random_bytes(msg.h.nonce, sizeof(msg.h.nonce)));
    shoal_boot_hello_mac(u->secret, root_nonce, &msg.h, msg.h.mac);
    st = shoal_sock_write_all(b->fd, &msg, sizeof(msg), deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "sending hello");
    }
    shoal_boot_session_key(u->secret, root_nonce, &msg.h, b->key);
    b->keyed = 1;
    SHOAL_CHECK(shoal_boot_read_frame(b, 0, SHOAL_BOOT_WELCOME, mac, sizeof(mac), deadline));
    shoal_boot_welcome_mac(u->secret, root_nonce, &msg.h, want);
    if (!shoal_memeq_ct(mac, want, sizeof(mac))) {
        b->final = 1;
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
    b->exchange = nranks > 1 ? shoal_core_config.boot_exchange : SHOAL_BOOT_EXCHANGE_ROOT;
    memcpy(b->secret, u->secret, sizeof(b->secret));
    b->ident = u->ident;
    shoal_sockaddr_str(&u->root, b->root_str, sizeof(b->root_str));
    for (unsigned backoff_us = 1000;; backoff_us = SHOAL_MIN(backoff_us * 2, 100000)) {
        st = shoal_boot_dial(b, u, deadline);
        if (st != SHOAL_OK) {
            shoal_boot_fail(b, st, "cannot reach the root");
            goto err;
        }
        st = shoal_boot_handshake(b, u, deadline);
        /* An explicit refusal (wrong secret, identity or rank) or a failed job is final; a
         * connection the root dropped (evicted under a flood of strangers) is worth another
         * try. */
        if (st == SHOAL_OK || b->final || st == SHOAL_ERR_ABORTED ||
            shoal_deadline_passed(deadline)) {
            break;
        }
        if (!b->evicted) {
            shoal_warn(BOOT, "rank %d: root %s dropped the connection before the handshake "
                       "finished; redialing", rank, b->root_str);
        }
        b->evicted = 0;
        close(b->fd);
        b->fd = -1;
        shoal_sleep_us(backoff_us);
    }
    if (st != SHOAL_OK) {
        if (b->evicted) { /* only told at INFO so far: the give-up is an error */
            shoal_boot_fail(b, st, "the root kept evicting this rank's pending connection");
        }
        goto err;
    }
    shoal_trace(BOOT, "rank %d of %d joined root %s", rank, nranks, b->root_str);
    *boot_p = b;
    return SHOAL_OK;
err:
    if (b->fd >= 0) {
        close(b->fd);
    }
    shoal_secret_wipe(b->key, sizeof(b->key));
    shoal_secret_wipe(b->secret, sizeof(b->secret));
    free(b);
    return st;
}

/* An allgather of equal-length blobs through the root (the barrier, and every round of
 * SHOAL_BOOT_EXCHANGE=root). */
static shoal_status_t shoal_boot_root_allgather(shoal_boot_t *b, const void *in, size_t len,
                                                void *out)
{
    uint64_t deadline = shoal_deadline_ns(b->timeout_ms);
    shoal_status_t st;

    if (len > SHOAL_BOOT_MAX_BLOB || (size_t)b->nranks * len > UINT32_MAX) {
        return shoal_boot_fail(b, SHOAL_ERR_INVALID_ARG, "allgather blob too large");
    }
    st = shoal_boot_send_frame(b, SHOAL_BOOT_AG, in, (uint32_t)len, deadline);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "sending to the root");
    }
    SHOAL_CHECK(shoal_boot_read_frame(b, 1, SHOAL_BOOT_AG, out,
                                      (uint32_t)(len * (size_t)b->nranks), deadline));
    b->round++;
    return SHOAL_OK;
}

shoal_status_t shoal_boot_allgather(shoal_boot_t *b, const void *in, size_t len, void *out)
{
    if (b->exchange == SHOAL_BOOT_EXCHANGE_RING) {
        return shoal_boot_ring_allgather(b, in, len, out);
    }
    return shoal_boot_root_allgather(b, in, len, out);
}

/* The table of a variable-length round: at most nranks * (4 + SHOAL_BOOT_MAX_BLOB) bytes,
 * never more than a frame can say. */
static size_t shoal_boot_table_v_max(int nranks)
{
    return SHOAL_MIN((size_t)nranks * (4 + (size_t)SHOAL_BOOT_MAX_BLOB), (size_t)UINT32_MAX);
}

shoal_status_t shoal_boot_table_v_parse(const uint8_t *table, size_t len, int nranks,
                                        const uint8_t **ents, uint32_t *lens)
{
    size_t off = 0;
    for (int k = 0; k < nranks; k++) {
        uint32_t n;
        if (len - off < 4) {
            return SHOAL_ERR_PROTOCOL;
        }
        n = (uint32_t)shoal_get_le(table + off, 4);
        off += 4;
        if (n > SHOAL_BOOT_MAX_BLOB || n > len - off) {
            return SHOAL_ERR_PROTOCOL;
        }
        ents[k] = table + off;
        lens[k] = n;
        off += n;
    }
    return off == len ? SHOAL_OK : SHOAL_ERR_PROTOCOL;
}

shoal_status_t shoal_boot_allgatherv(shoal_boot_t *b, const void *in, size_t len,
                                     uint8_t **table_p, const uint8_t **ents, uint32_t *lens)
{
    uint64_t deadline = shoal_deadline_ns(b->timeout_ms);
    shoal_boot_frame_t f;
    uint8_t *table = NULL;
    shoal_status_t st;

    *table_p = NULL;
    if (len > SHOAL_BOOT_MAX_BLOB) {
        return shoal_boot_fail(b, SHOAL_ERR_INVALID_ARG, "allgather record too large");
    }
    if (b->exchange == SHOAL_BOOT_EXCHANGE_RING) {
        return shoal_boot_ring_allgatherv(b, in, len, table_p, ents, lens);
    }
    st = shoal_boot_send_frame(b, SHOAL_BOOT_AGV, in, (uint32_t)len, deadline);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "sending to the root");
    }
    st = shoal_sock_read_all(b->fd, &f, sizeof(f), deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        return shoal_boot_fail(b, st, "no answer from the root");
    }
    if (f.magic == SHOAL_BOOT_FRAME_MAGIC && f.type == SHOAL_BOOT_FAILED && f.len == 0) {
        SHOAL_CHECK(shoal_boot_read_mac(b, &f, NULL, deadline));
        b->final = 1;
        return shoal_boot_failed_notice(b, f.round);
    }
    /* The length is the root's word until the MAC says otherwise: bounded before any
     * allocation, parsed only after the MAC checked out. */
    if (f.magic != SHOAL_BOOT_FRAME_MAGIC || f.type != SHOAL_BOOT_AGV ||
        f.len < 4 * (size_t)b->nranks || f.len > shoal_boot_table_v_max(b->nranks)) {
        b->final = 1;
        return shoal_boot_fail(b, SHOAL_ERR_PROTOCOL, "unexpected frame from the root");
    }
    table = malloc(f.len);
    if (table == NULL) {
        return shoal_boot_fail(b, SHOAL_ERR_NO_MEMORY, "allocating the round's table");
    }
    st = shoal_sock_read_all(b->fd, table, f.len, deadline, b->abort_flag);
    if (st != SHOAL_OK) {
        free(table);
        return shoal_boot_fail(b, st, "truncated frame from the root");
    }
    st = shoal_boot_read_mac(b, &f, table, deadline);
    if (st == SHOAL_OK && shoal_boot_table_v_parse(table, f.len, b->nranks, ents, lens) !=
                              SHOAL_OK) {
        st = shoal_boot_fail(b, SHOAL_ERR_PROTOCOL, "malformed table from the root");
    }
    if (st != SHOAL_OK) {
        free(table);
        return st;
    }
    b->round++;
    *table_p = table;
    return SHOAL_OK;
}

shoal_status_t shoal_boot_barrier(shoal_boot_t *b)
{
    uint8_t dummy = 0;
    /* Always through the root: O(n) frames of no payload. */
    return shoal_boot_root_allgather(b, &dummy, 0, &dummy);
}

void shoal_boot_close(shoal_boot_t *b)
{
    if (b == NULL) {
        return;
    }
    shoal_boot_ring_close(b);
    if (b->fd >= 0) {
        /* After a failed ring round no bye: the root takes the closed connection for a rank
         * that left, and tells every other rank at once. */
        if (!b->ring_failed) {
            (void)shoal_boot_send_frame(b, SHOAL_BOOT_BYE, NULL, 0, shoal_deadline_ns(1000));
        }
        close(b->fd);
    }
    shoal_secret_wipe(b->key, sizeof(b->key));
    shoal_secret_wipe(b->secret, sizeof(b->secret));
    free(b);
}
