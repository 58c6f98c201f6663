/* IB transport, pure logic: HCA list parsing (NCCL_IB_HCA syntax), RoCE GID choice over a
 * sysfs tree given by its root (tests build fake trees), MTU negotiation. No verbs calls. */
#include "transports/ib/ib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#define SHOAL_IB_GID_SCAN_MAX 1024  /* never look past this many table entries */
/* The largest index a queue pair can name: ibv_global_route.sgid_index is 8 bits, so a GID
 * above it (Soft-RoCE's tables hold 1024) would be sent from index & 0xff, another address. */
#define SHOAL_IB_GID_INDEX_MAX 255

static void shoal_ib_why(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void shoal_ib_why(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    if (why == NULL || len == 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

/* ---- HCA list ------------------------------------------------------------------------------ */

static int shoal_ib_hca_item(const char *s, size_t n, shoal_ib_hca_item_t *it, char *why,
                             size_t len)
{
    const char *colon;
    size_t dn;

    /* "mlx5_0, mlx5_1" as people write lists: the blank is not part of the name (it never
     * matched the second device) */
    while (n > 0 && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) {
        n--;
    }
    colon = memchr(s, ':', n);
    dn = colon != NULL ? (size_t)(colon - s) : n;
    if (dn == 0 || dn >= sizeof(it->dev)) {
        shoal_ib_why(why, len, "SHOAL_IB_HCA: bad device name in \"%.*s\"", (int)n, s);
        return -1;
    }
    memcpy(it->dev, s, dn);
    it->dev[dn] = '\0';
    it->port = 0;
    if (colon != NULL) {
        char num[16];
        size_t pn = n - dn - 1;
        char *end;
        long v;
        if (pn == 0 || pn >= sizeof(num)) {
            shoal_ib_why(why, len, "SHOAL_IB_HCA: bad port in \"%.*s\"", (int)n, s);
            return -1;
        }
        memcpy(num, colon + 1, pn);
        num[pn] = '\0';
        v = strtol(num, &end, 10);
        if (*end != '\0' || v < 1 || v > 255) {
            shoal_ib_why(why, len, "SHOAL_IB_HCA: bad port in \"%.*s\" (1..255)", (int)n, s);
            return -1;
        }
        it->port = (int)v;
    }
    return 0;
}

int shoal_ib_hca_parse(const char *spec, shoal_ib_hca_spec_t *out, char *why, size_t len)
{
    memset(out, 0, sizeof(*out));
    if (spec == NULL) {
        return 0;
    }
    if (*spec == '^') {
        out->exclude = 1;
        spec++;
    }
    if (*spec == '=') {
        out->exact = 1;
        spec++;
    }
    while (*spec != '\0') {
        size_t n = strcspn(spec, ",");
        if (n > 0) {
            if (out->n == SHOAL_IB_HCA_MAX) {
                shoal_ib_why(why, len, "SHOAL_IB_HCA: more than %d entries", SHOAL_IB_HCA_MAX);
                return -1;
            }
            if (shoal_ib_hca_item(spec, n, &out->items[out->n], why, len) != 0) {
                return -1;
            }
            out->n++;
        }
        spec += n;
        if (*spec == ',') {
            spec++;
        }
    }
    if ((out->exclude || out->exact) && out->n == 0) {
        shoal_ib_why(why, len, "SHOAL_IB_HCA: \"^\" or \"=\" without device names");
        return -1;
    }
    return 0;
}

int shoal_ib_hca_match(const shoal_ib_hca_spec_t *s, const char *dev, int port)
{
    int hit = 0;
    if (s->n == 0) {
        return 1;
    }
    for (int i = 0; i < s->n && !hit; i++) {
        const shoal_ib_hca_item_t *it = &s->items[i];
        int name = s->exact ? strcmp(dev, it->dev) == 0
                            : strncmp(dev, it->dev, strlen(it->dev)) == 0;
        hit = name && (it->port == 0 || it->port == port);
    }
    return s->exclude ? !hit : hit;
}

/* ---- GIDs ---------------------------------------------------------------------------------- */

int shoal_ib_gid_parse(const char *text, uint8_t raw[16])
{
    const char *p = text;
    for (int g = 0; g < 8; g++) {
        char *end;
        unsigned long v;
        if (g > 0) {
            if (*p != ':') {
                return -1;
            }
            p++;
        }
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F'))) {
            return -1;
        }
        v = strtoul(p, &end, 16);
        if (end - p > 4 || v > 0xffff) {
            return -1;
        }
        raw[2 * g] = (uint8_t)(v >> 8);
        raw[2 * g + 1] = (uint8_t)v;
        p = end;
    }
    while (*p == '\n' || *p == ' ') {
        p++;
    }
    return *p == '\0' ? 0 : -1;
}

void shoal_ib_gid_str(const uint8_t raw[16], char *buf, size_t len)
{
    if (inet_ntop(AF_INET6, raw, buf, (socklen_t)len) == NULL && len > 0) {
        buf[0] = '\0';
    }
}

/* Reads a small sysfs file into buf without the trailing newline; 0 or -1 (errno). */
static int shoal_ib_read_small(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    size_t n;
    if (f == NULL) {
        return -1;
    }
    n = fread(buf, 1, len - 1, f);
    if (ferror(f)) {
        int e = errno;
        fclose(f);
        errno = e != 0 ? e : EIO;
        return -1;
    }
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) {
        buf[--n] = '\0';
    }
    return 0;
}

static int shoal_ib_gid_is_zero(const uint8_t raw[16])
{
    static const uint8_t zero[16];
    return memcmp(raw, zero, 16) == 0;
}

static int shoal_ib_gid_is_v4mapped(const uint8_t raw[16])
{
    static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(raw, pfx, 12) == 0;
}

static int shoal_ib_gid_is_linklocal(const uint8_t raw[16])
{
    return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
}

/* Preference of a RoCE v2 GID for the family: 0 unusable, higher is better. */
static int shoal_ib_gid_score(const shoal_ib_gid_t *g, int family)
{
    if (g->type != SHOAL_IB_GID_ROCE_V2 || shoal_ib_gid_is_zero(g->raw)) {
        return 0;
    }
    if (family == SHOAL_IB_FAMILY_INET) {
        return shoal_ib_gid_is_v4mapped(g->raw) ? 2 : 0;
    }
    if (shoal_ib_gid_is_v4mapped(g->raw)) {
        return 0;
    }
    return shoal_ib_gid_is_linklocal(g->raw) ? 1 : 2;
}

/* Entry idx of the table: 1 read, 0 absent or empty (unpopulated entries fail to read). */
static int shoal_ib_gid_read(const char *base, int idx, shoal_ib_gid_t *g)
{
    char path[512], text[96];
    memset(g, 0, sizeof(*g));
    g->index = idx;
    snprintf(path, sizeof(path), "%s/gids/%d", base, idx);
    if (shoal_ib_read_small(path, text, sizeof(text)) != 0 ||
        shoal_ib_gid_parse(text, g->raw) != 0) {
        return 0;
    }
    snprintf(path, sizeof(path), "%s/gid_attrs/types/%d", base, idx);
    if (shoal_ib_read_small(path, text, sizeof(text)) != 0) {
        g->type = SHOAL_IB_GID_UNKNOWN;
    } else if (strcasecmp(text, "RoCE v2") == 0) {
        g->type = SHOAL_IB_GID_ROCE_V2;
    } else if (strcasecmp(text, "IB/RoCE v1") == 0 || strcasecmp(text, "RoCE v1") == 0) {
        g->type = SHOAL_IB_GID_IB;
    } else {
        g->type = SHOAL_IB_GID_UNKNOWN;
    }
    snprintf(path, sizeof(path), "%s/gid_attrs/ndevs/%d", base, idx);
    if (shoal_ib_read_small(path, text, sizeof(text)) == 0) {
        snprintf(g->ndev, sizeof(g->ndev), "%.31s", text);
    }
    return 1;
}

static shoal_status_t shoal_ib_gid_forced(const char *base, const char *dev, int port, int idx,
                                          shoal_ib_gid_t *out, char *why, size_t len)
{
    if (!shoal_ib_gid_read(base, idx, out) || shoal_ib_gid_is_zero(out->raw)) {
        shoal_ib_why(why, len, "SHOAL_IB_GID_INDEX=%d: GID %d of %s port %d is missing or "
                     "empty (%s/gids/%d)", idx, idx, dev, port, base, idx);
        return SHOAL_ERR_TRANSPORT;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_ib_gid_select(const char *root, const char *dev, int port, int family,
                                   int gid_index, shoal_ib_gid_t *out, char *why, size_t len)
{
    char base[400], path[512];
    int best = 0, nv1 = 0, nv2 = 0, nread = 0, misses = 0, nhigh = 0;
    FILE *probe;

    if (gid_index < -1 || gid_index > SHOAL_IB_GID_INDEX_MAX) {
        shoal_ib_why(why, len, "SHOAL_IB_GID_INDEX=%d: -1 (automatic) or 0..%d (a queue pair "
                     "names its source GID in 8 bits)", gid_index, SHOAL_IB_GID_INDEX_MAX);
        return SHOAL_ERR_INVALID_ARG;
    }
    snprintf(base, sizeof(base), "%s/class/infiniband/%s/ports/%d",
             root != NULL && root[0] != '\0' ? root : "/sys", dev, port);
    snprintf(path, sizeof(path), "%s/gids/0", base);
    probe = fopen(path, "re");
    if (probe == NULL && errno == ENOENT) {
        shoal_ib_why(why, len, "GID table of %s port %d is missing (%s/gids: %s)", dev, port,
                     base, strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    if (probe != NULL) {
        fclose(probe);
    }
    if (gid_index >= 0) {
        return shoal_ib_gid_forced(base, dev, port, gid_index, out, why, len);
    }
    /* Entries may be sparse (an unpopulated index reads EINVAL); stop after a long run of
     * absent ones. */
    for (int i = 0; i < SHOAL_IB_GID_SCAN_MAX && misses < 64; i++) {
        shoal_ib_gid_t g;
        int score;
        if (!shoal_ib_gid_read(base, i, &g)) {
            misses++;
            continue;
        }
        misses = 0;
        if (shoal_ib_gid_is_zero(g.raw)) {
            continue;
        }
        nread++;
        nv1 += g.type == SHOAL_IB_GID_IB;
        nv2 += g.type == SHOAL_IB_GID_ROCE_V2;
        score = shoal_ib_gid_score(&g, family);
        if (score > 0 && i > SHOAL_IB_GID_INDEX_MAX) {
            nhigh++; /* usable, but no queue pair can name it */
            continue;
        }
        if (score > best) {
            best = score;
            *out = g;
        }
    }
    if (best > 0) {
        return SHOAL_OK;
    }
    if (nhigh > 0) {
        shoal_ib_why(why, len, "no RoCE v2 GID with an %s address on %s port %d at an index "
                     "up to %d (%d above it, which a queue pair cannot name: fewer addresses "
                     "on the interface)", family == SHOAL_IB_FAMILY_INET ? "IPv4" : "IPv6",
                     dev, port, SHOAL_IB_GID_INDEX_MAX, nhigh);
    } else if (nv2 == 0) {
        shoal_ib_why(why, len, "no RoCE v2 GID on %s port %d (%d GIDs, %d RoCE v1): is the "
                     "network interface up with an address? SHOAL_IB_GID_INDEX forces one",
                     dev, port, nread, nv1);
    } else {
        shoal_ib_why(why, len, "no RoCE v2 GID with an %s address on %s port %d (%d RoCE v2 "
                     "GIDs of the other family); set SHOAL_IB_ADDR_FAMILY or SHOAL_IB_GID_INDEX",
                     family == SHOAL_IB_FAMILY_INET ? "IPv4" : "IPv6", dev, port, nv2);
    }
    return SHOAL_ERR_TRANSPORT;
}

/* ---- software devices ---------------------------------------------------------------------- */

int shoal_ib_soft_device(const char *root, const char *dev, uint32_t vendor_id)
{
    char path[512];
    struct stat st;
    if (vendor_id == SHOAL_IB_VENDOR_RXE || vendor_id == SHOAL_IB_VENDOR_SIW) {
        return 1;
    }
    /* empty is /sys, as for the GID choice and the device probe */
    root = root != NULL && root[0] != '\0' ? root : "/sys";
    /* a device of the class with no bus device behind it is the kernel's own */
    snprintf(path, sizeof(path), "%s/class/infiniband/%s", root, dev);
    if (stat(path, &st) != 0) {
        return 0; /* no sysfs: not known, a hardware device is the safer guess */
    }
    snprintf(path, sizeof(path), "%s/class/infiniband/%s/device", root, dev);
    return stat(path, &st) != 0;
}

/* ---- MTU ----------------------------------------------------------------------------------- */

int shoal_ib_mtu_bytes(int mtu_enum)
{
    return mtu_enum >= 1 && mtu_enum <= 5 ? 128 << mtu_enum : 0;
}

uint32_t shoal_ib_rate_mbps(unsigned speed, unsigned width)
{
    static const struct {
        unsigned v;
        uint32_t mbps;
    } speeds[] = {{1, 2000},   {2, 4000},   {4, 8000},    {8, 10000},  {16, 13636},
                  {32, 25000}, {64, 50000}, {128, 100000}, {256, 200000}};
    static const struct {
        unsigned v, lanes;
    } widths[] = {{1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}};
    uint32_t lane = 0, lanes = 0;

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(speeds); i++) {
        lane = speeds[i].v == speed ? speeds[i].mbps : lane;
    }
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(widths); i++) {
        lanes = widths[i].v == width ? widths[i].lanes : lanes;
    }
    return lane * lanes;
}

int shoal_ib_mtu_enum(unsigned bytes)
{
    for (int e = 1; e <= 5; e++) {
        if ((unsigned)shoal_ib_mtu_bytes(e) == bytes) {
            return e;
        }
    }
    return 0;
}

int shoal_ib_mtu_negotiate(int local, int remote, unsigned cap_bytes, char *why, size_t len)
{
    int m;
    if (shoal_ib_mtu_bytes(local) == 0 || shoal_ib_mtu_bytes(remote) == 0) {
        shoal_ib_why(why, len, "MTU mismatch: invalid active MTU (ours %d, peer's %d; valid "
                     "1..5 = 256..4096 bytes)", local, remote);
        return 0;
    }
    m = SHOAL_MIN(local, remote);
    if (cap_bytes != 0) {
        int cap = shoal_ib_mtu_enum(cap_bytes);
        if (cap == 0) {
            shoal_ib_why(why, len, "SHOAL_IB_MTU=%u is not an IB MTU (256, 512, 1024, 2048 "
                         "or 4096)", cap_bytes);
            return 0;
        }
        m = SHOAL_MIN(m, cap);
    }
    if (why != NULL && len > 0) {
        if (local != remote) {
            shoal_ib_why(why, len, "MTU mismatch: ours %d bytes, peer's %d: using %d",
                         shoal_ib_mtu_bytes(local), shoal_ib_mtu_bytes(remote),
                         shoal_ib_mtu_bytes(m));
        } else {
            why[0] = '\0';
        }
    }
    return m;
}
