/* Unit tests of the IB transport's pure logic (no RDMA device needed): HCA list parsing, GID
 * choice over fake sysfs trees, MTU negotiation, credits and ring (with wraparound and a
 * randomized sender/receiver model), chunk plan, immediate codec, QP transition table,
 * registration cache, address codecs and the shared out-of-band handshake; RDMA scoping:
 * the per-peer layout, keys and access flags checked against a model of the HCA's protection
 * check, and the send path's staging run over a buffer that is unmapped (or freed) and
 * replaced at the same address, against a model of pinned pages.
 *     test_ib_logic             TAP
 *     test_ib_logic --devices   prints the number of RDMA devices (for run_tl_ib.sh) */
#include "transports/ib/ib_verbs.h"
#include "tests/tap.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void put_file(const char *path, const char *text)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", path);
    for (char *p = dir + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdir(dir, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fprintf(f, "%s\n", text);
        fclose(f);
    }
}

static void gid(const char *dev, int port, int idx, const char *g, const char *type,
                const char *ndev)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports/%d/gids/%d", root, dev, port, idx);
    put_file(path, g);
    if (type != NULL) {
        snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports/%d/gid_attrs/types/%d", root,
                 dev, port, idx);
        put_file(path, type);
    }
    if (ndev != NULL) {
        snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports/%d/gid_attrs/ndevs/%d", root,
                 dev, port, idx);
        put_file(path, ndev);
    }
}

#define Z "0000:0000:0000:0000:0000:0000:0000:0000"
#define LL "fe80:0000:0000:0000:0202:c9ff:fe00:0001"
#define V4 "0000:0000:0000:0000:0000:ffff:c0a8:0105"
#define V6 "2001:0db8:0000:0000:0000:0000:0000:0005"

static void test_hca(void)
{
    shoal_ib_hca_spec_t s;
    char why[160];
    tap_is_int(shoal_ib_hca_parse("mlx5_0:1,mlx5_1", &s, why, sizeof(why)), 0, "hca: parse list");
    tap_is_int(s.n, 2, "hca: two entries");
    tap_ok(shoal_ib_hca_match(&s, "mlx5_0", 1) && !shoal_ib_hca_match(&s, "mlx5_0", 2),
           "hca: mlx5_0:1 allows port 1 only");
    tap_ok(shoal_ib_hca_match(&s, "mlx5_1", 2), "hca: mlx5_1 allows any port");
    tap_ok(shoal_ib_hca_match(&s, "mlx5_10", 1), "hca: names are prefixes (mlx5_1 ~ mlx5_10)");
    tap_ok(!shoal_ib_hca_match(&s, "mlx4_0", 1), "hca: other devices refused");
    shoal_ib_hca_parse("=mlx5_1", &s, why, sizeof(why));
    tap_ok(s.exact && shoal_ib_hca_match(&s, "mlx5_1", 1) && !shoal_ib_hca_match(&s, "mlx5_10", 1),
           "hca: = means exact names");
    shoal_ib_hca_parse("^mlx5_2", &s, why, sizeof(why));
    tap_ok(s.exclude && !shoal_ib_hca_match(&s, "mlx5_2", 1) && shoal_ib_hca_match(&s, "mlx5_0", 1),
           "hca: ^ excludes");
    shoal_ib_hca_parse("^=mlx5_2:2", &s, why, sizeof(why));
    tap_ok(shoal_ib_hca_match(&s, "mlx5_2", 1) && !shoal_ib_hca_match(&s, "mlx5_2", 2),
           "hca: ^= with a port excludes just that port");
    shoal_ib_hca_parse("", &s, why, sizeof(why));
    tap_ok(s.n == 0 && shoal_ib_hca_match(&s, "anything", 3), "hca: empty allows everything");
    tap_is_int(shoal_ib_hca_parse("mlx5_0:x", &s, why, sizeof(why)), -1, "hca: bad port refused");
    tap_ok(strstr(why, "bad port") != NULL, "hca: the error says why (%s)", why);
    tap_is_int(shoal_ib_hca_parse("^", &s, why, sizeof(why)), -1, "hca: bare ^ refused");
    tap_is_int(shoal_ib_hca_parse(":1", &s, why, sizeof(why)), -1, "hca: empty name refused");
    tap_ok(shoal_ib_hca_parse("mlx5_0, mlx5_1:1 ", &s, why, sizeof(why)) == 0 && s.n == 2 &&
               shoal_ib_hca_match(&s, "mlx5_1", 1) && !shoal_ib_hca_match(&s, "mlx5_1", 2),
           "hca: blanks around a list's entries are not part of the names");
}

static void test_gid(void)
{
    shoal_ib_gid_t g;
    char why[256];
    shoal_status_t st;

    /* IB port: only IB/RoCE v1 GIDs (an IB port uses its LID, the caller never asks) */
    gid("ibdev", 1, 0, LL, "IB/RoCE v1", NULL);
    st = shoal_ib_gid_select(root, "ibdev", 1, SHOAL_IB_FAMILY_INET, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_TRANSPORT && strstr(why, "no RoCE v2 GID") != NULL,
           "gid: IB-type table has no RoCE v2 GID (%s)", why);
    /* RoCE v1 only */
    gid("v1dev", 1, 0, LL, "IB/RoCE v1", "eth0");
    gid("v1dev", 1, 1, V4, "IB/RoCE v1", "eth0");
    st = shoal_ib_gid_select(root, "v1dev", 1, SHOAL_IB_FAMILY_INET, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_TRANSPORT && strstr(why, "2 RoCE v1") != NULL,
           "gid: RoCE v1 only is refused, counting them (%s)", why);
    /* RoCE v2 with both families */
    gid("mlx5_0", 1, 0, LL, "IB/RoCE v1", "eth0");
    gid("mlx5_0", 1, 1, LL, "RoCE v2", "eth0");
    gid("mlx5_0", 1, 2, V4, "IB/RoCE v1", "eth0");
    gid("mlx5_0", 1, 3, V4, "RoCE v2", "eth0");
    gid("mlx5_0", 1, 4, V6, "RoCE v2", "eth0");
    gid("mlx5_0", 1, 5, Z, "RoCE v2", "eth0");
    st = shoal_ib_gid_select(root, "mlx5_0", 1, SHOAL_IB_FAMILY_INET, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_OK && g.index == 3 && g.type == SHOAL_IB_GID_ROCE_V2,
           "gid: AF_INET picks the RoCE v2 IPv4-mapped GID (index %d)", g.index);
    tap_is_str(g.ndev, "eth0", "gid: net device read");
    tap_ok(g.raw[10] == 0xff && g.raw[12] == 192 && g.raw[15] == 5, "gid: address bytes");
    st = shoal_ib_gid_select(root, "mlx5_0", 1, SHOAL_IB_FAMILY_INET6, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_OK && g.index == 4, "gid: AF_INET6 picks the global IPv6 GID (index %d)",
           g.index);
    /* IPv6: only link-local left -> last resort */
    gid("mlx5_1", 1, 0, LL, "RoCE v2", "eth1");
    gid("mlx5_1", 1, 1, V4, "RoCE v2", "eth1");
    st = shoal_ib_gid_select(root, "mlx5_1", 1, SHOAL_IB_FAMILY_INET6, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_OK && g.index == 0, "gid: AF_INET6 falls back to link-local");
    /* v2 with IPv6 only, asked for IPv4 */
    gid("mlx5_2", 1, 0, V6, "RoCE v2", "eth2");
    st = shoal_ib_gid_select(root, "mlx5_2", 1, SHOAL_IB_FAMILY_INET, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_TRANSPORT && strstr(why, "IPv4") != NULL,
           "gid: no IPv4 RoCE v2 GID is a clear error (%s)", why);
    /* sparse table: index 0 absent, 1 unreadable type, 3 good */
    gid("mlx5_3", 1, 0, Z, NULL, NULL);
    gid("mlx5_3", 1, 3, V4, "RoCE v2", "eth3");
    st = shoal_ib_gid_select(root, "mlx5_3", 1, SHOAL_IB_FAMILY_INET, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_OK && g.index == 3, "gid: sparse table scanned past gaps");
    /* missing table */
    st = shoal_ib_gid_select(root, "nodev", 1, SHOAL_IB_FAMILY_INET, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_TRANSPORT && strstr(why, "missing") != NULL,
           "gid: missing gid dir is a clear error (%s)", why);
    /* index override */
    st = shoal_ib_gid_select(root, "mlx5_0", 1, SHOAL_IB_FAMILY_INET, 2, &g, why, sizeof(why));
    tap_ok(st == SHOAL_OK && g.index == 2 && g.type == SHOAL_IB_GID_IB,
           "gid: SHOAL_IB_GID_INDEX overrides the type choice");
    st = shoal_ib_gid_select(root, "mlx5_0", 1, SHOAL_IB_FAMILY_INET, 5, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_TRANSPORT && strstr(why, "GID_INDEX=5") != NULL,
           "gid: override to a zero GID refused (%s)", why);
    st = shoal_ib_gid_select(root, "mlx5_0", 1, SHOAL_IB_FAMILY_INET, 9, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_TRANSPORT, "gid: override to an absent index refused");
    /* A queue pair names its source GID in 8 bits (ibv_global_route.sgid_index): a GID at
     * index 300 (Soft-RoCE tables hold 1024) was chosen, and the queue pair then sent from
     * index 44 (300 & 0xff), another address. Neither the scan nor SHOAL_IB_GID_INDEX may
     * pick one above 255. */
    for (int i = 0; i < 300; i++) {
        gid("bigtab", 1, i, V4, "IB/RoCE v1", "eth4");
    }
    gid("bigtab", 1, 300, V4, "RoCE v2", "eth4");
    st = shoal_ib_gid_select(root, "bigtab", 1, SHOAL_IB_FAMILY_INET, -1, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_TRANSPORT && strstr(why, "255") != NULL,
           "gid: a RoCE v2 GID above index 255 is not chosen (%s, index %d: %s)",
           shoal_status_name(st), st == SHOAL_OK ? g.index : -1, why);
    st = shoal_ib_gid_select(root, "bigtab", 1, SHOAL_IB_FAMILY_INET, 300, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_INVALID_ARG && strstr(why, "GID_INDEX=300") != NULL,
           "gid: SHOAL_IB_GID_INDEX=300 refused (%s: %s)", shoal_status_name(st), why);
    st = shoal_ib_gid_select(root, "bigtab", 1, SHOAL_IB_FAMILY_INET, 255, &g, why, sizeof(why));
    tap_ok(st == SHOAL_OK && g.index == 255, "gid: SHOAL_IB_GID_INDEX=255 still allowed");
    st = shoal_ib_gid_select(root, "mlx5_0", 1, SHOAL_IB_FAMILY_INET, -2, &g, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_INVALID_ARG && strstr(why, "GID_INDEX=-2") != NULL,
           "gid: SHOAL_IB_GID_INDEX=-2 refused, not taken as automatic (%s: %s)",
           shoal_status_name(st), why);
    uint8_t raw[16];
    tap_is_int(shoal_ib_gid_parse("fe80::1", raw), -1, "gid: parser wants the sysfs form");
    tap_is_int(shoal_ib_gid_parse(V6, raw), 0, "gid: parser reads the sysfs form");
}

/* stat() of this program (the library's objects are linked in): records the last path while
 * stat_seen is set, then does what libc's does. */
static char stat_seen[512];
static int stat_record;

int stat(const char *path, struct stat *st)
{
    if (stat_record) {
        snprintf(stat_seen, sizeof(stat_seen), "%s", path);
    }
    return fstatat(AT_FDCWD, path, st, 0);
}

/* Software devices: rxe and siw by their vendor ids, others by the missing bus device. */
static void test_soft_device(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/class/infiniband/mlx5_0/device/vendor", root);
    put_file(path, "0x15b3");
    snprintf(path, sizeof(path), "%s/class/infiniband/rxe0/parent", root); /* as rdma_rxe's */
    put_file(path, "veth0");
    tap_is_int(shoal_ib_soft_device(root, "mlx5_0", 0x02c9), 0,
               "soft device: a device with a bus device behind it is hardware");
    tap_is_int(shoal_ib_soft_device(root, "rxe0", 0x02c9), 1,
               "soft device: no bus device in sysfs (rdma_rxe's layout) is software");
    tap_is_int(shoal_ib_soft_device(root, "mlx5_0", SHOAL_IB_VENDOR_RXE), 1,
               "soft device: rxe's vendor id is software");
    tap_is_int(shoal_ib_soft_device(root, "mlx5_0", SHOAL_IB_VENDOR_SIW), 1,
               "soft device: siw's vendor id is software");
    tap_is_int(shoal_ib_soft_device(root, "absent", 0x02c9), 0,
               "soft device: without sysfs, a hardware device is assumed");
    /* An empty SHOAL_IB_SYSFS_ROOT is /sys, as for the GID choice and the device probe: it
     * looked under /class/infiniband. */
    stat_record = 1;
    stat_seen[0] = '\0';
    (void)shoal_ib_soft_device("", "mlx5_0", 0x02c9);
    stat_record = 0;
    tap_ok(strncmp(stat_seen, "/sys/class/infiniband/mlx5_0", 28) == 0,
           "soft device: an empty sysfs root is /sys (looked at '%s')", stat_seen);
}

/* SHOAL_IB_USE_RDMACM's doc said only SHOAL_IB_MTU does not apply under rdma_cm; the
 * service level and the partition key are the connection manager's too (ib_cm.c sets
 * neither), so SHOAL_IB_SL and SHOAL_IB_PKEY were silently ignored. */
extern const shoal_cfg_table_t shoal_ib_cfg_table;

static void test_rdmacm_doc(void)
{
    const char *doc = NULL;

    for (size_t i = 0; i < shoal_ib_cfg_table.nfields; i++) {
        if (strcmp(shoal_ib_cfg_table.fields[i].name, "IB_USE_RDMACM") == 0) {
            doc = shoal_ib_cfg_table.fields[i].doc;
        }
    }
    tap_ok(doc != NULL &&
               strstr(doc, "SHOAL_IB_MTU, SHOAL_IB_SL and SHOAL_IB_PKEY do not apply") != NULL,
           "SHOAL_IB_USE_RDMACM's doc names SHOAL_IB_MTU, SHOAL_IB_SL and SHOAL_IB_PKEY as not "
           "applying");
}

static void test_mtu(void)
{
    char why[160];
    tap_is_int(shoal_ib_mtu_bytes(5), 4096, "mtu: enum 5 is 4096");
    tap_is_int(shoal_ib_mtu_enum(1024), 3, "mtu: 1024 is enum 3");
    tap_is_int(shoal_ib_mtu_enum(1000), 0, "mtu: 1000 is not an MTU");
    tap_is_int(shoal_ib_mtu_negotiate(5, 3, 0, why, sizeof(why)), 3, "mtu: min of both ports");
    tap_ok(strstr(why, "mismatch") != NULL, "mtu: a mismatch is reported (%s)", why);
    tap_is_int(shoal_ib_mtu_negotiate(5, 5, 1024, why, sizeof(why)), 3, "mtu: SHOAL_IB_MTU caps");
    tap_ok(why[0] == '\0', "mtu: equal ports: no message");
    tap_is_int(shoal_ib_mtu_negotiate(5, 5, 1000, why, sizeof(why)), 0, "mtu: bad cap refused");
    tap_ok(strstr(why, "SHOAL_IB_MTU") != NULL, "mtu: error names the knob");
    tap_is_int(shoal_ib_mtu_negotiate(0, 5, 0, why, sizeof(why)), 0, "mtu: invalid port MTU");
}

/* ibv_port_attr's active_speed x active_width -> the data rate src/tune derives sizes from */
static void test_rate(void)
{
    tap_is_int(shoal_ib_rate_mbps(32, 2), 100000, "rate: EDR 4X is 100 Gb/s");
    tap_is_int(shoal_ib_rate_mbps(64, 2), 200000, "rate: HDR 4X is 200 Gb/s");
    tap_is_int(shoal_ib_rate_mbps(128, 2), 400000, "rate: NDR 4X is 400 Gb/s");
    tap_is_int(shoal_ib_rate_mbps(4, 8), 96000, "rate: QDR 12X is 96 Gb/s");
    tap_is_int(shoal_ib_rate_mbps(16, 2), 54544, "rate: FDR 4X is 54.5 Gb/s (64b/66b)");
    tap_is_int(shoal_ib_rate_mbps(1, 1), 2000, "rate: SDR 1X (rxe over a netdev of unknown "
               "speed) is 2 Gb/s (8b/10b)");
    tap_is_int(shoal_ib_rate_mbps(64, 16), 100000, "rate: HDR 2X is 100 Gb/s");
    tap_is_int(shoal_ib_rate_mbps(3, 2), 0, "rate: an unknown speed is 0");
    tap_is_int(shoal_ib_rate_mbps(32, 3), 0, "rate: an unknown width is 0");
}

static void test_credits(void)
{
    shoal_ib_credit_t c;
    shoal_ib_ring_t r;
    int ok = 1;

    shoal_ib_credit_init(&c, 4);
    for (int i = 0; i < 4; i++) {
        ok &= shoal_ib_credit_take(&c) == i;
    }
    tap_ok(ok, "credit: slots handed out in order");
    tap_is_int(shoal_ib_credit_take(&c), -1, "credit: none left -> -1, never negative");
    tap_is_int(c.avail, 0, "credit: avail stays 0");
    tap_is_int(shoal_ib_credit_grant(&c, 5), -1, "credit: grant above the ring refused");
    tap_is_int(c.avail, 0, "credit: refused grant changes nothing");
    tap_is_int(shoal_ib_credit_grant(&c, 2), 0, "credit: grant 2");
    tap_is_int(shoal_ib_credit_take(&c), 0, "credit: wraps around to slot 0");
    tap_is_int(shoal_ib_credit_grant(&c, 4), -1, "credit: cannot exceed the 3 slots in use");

    shoal_ib_ring_init(&r, 4);
    tap_is_int(shoal_ib_ring_arrive(&r, 1), -1, "ring: out-of-order slot refused");
    for (uint32_t i = 0; i < 4; i++) {
        ok &= shoal_ib_ring_arrive(&r, i) == 0;
    }
    tap_ok(ok, "ring: four arrivals");
    tap_is_int(shoal_ib_ring_arrive(&r, 0), -1, "ring: overfull refused");
    shoal_ib_ring_consume(&r);
    tap_is_int(shoal_ib_ring_arrive(&r, 0), -1, "ring: consumed but unreturned slot not writable");
    tap_is_int((int)shoal_ib_ring_take_owed(&r, 10), 1, "ring: one credit owed");
    tap_is_int(shoal_ib_ring_arrive(&r, 0), 0, "ring: returned slot written again (wrap)");
    r.filled = 0;
    tap_is_int(shoal_ib_ring_consume(&r), -1, "ring: consume of an empty ring refused");
    r.owed = 70000;
    tap_is_int((int)shoal_ib_ring_take_owed(&r, SHOAL_IB_CREDITS_MAX), 65535,
               "ring: credits capped to what fits in the immediate");
}

/* Model: a sender streams random messages through the chunk plan, credits and ring; the
 * receiver consumes at random times and returns credits at a threshold. */
static void test_model(void)
{
    shoal_ib_credit_t tx;
    shoal_ib_ring_t rx;
    const uint32_t nslots = 7;
    const size_t slot = 4096;
    uint32_t lens[7], flags[7];
    uint64_t seed = 42, sent_msgs = 0, got_msgs = 0, len = 0, off = 0, roff = 0;
    int first = 1, rfirst = 1, ok = 1, inflight_max = 0;

    shoal_ib_credit_init(&tx, nslots);
    shoal_ib_ring_init(&rx, nslots);
    for (int step = 0; step < 200000 && ok; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        if ((seed >> 33) % 3 != 0) { /* sender */
            if (first && off == 0 && len == 0) {
                len = (seed >> 40) % 20000;
            }
            if (tx.avail > 0) {
                size_t n;
                unsigned f = shoal_ib_chunk_next(len, off, first, slot, &n);
                int s = shoal_ib_credit_take(&tx);
                ok &= shoal_ib_ring_arrive(&rx, (uint32_t)s) == 0;
                lens[s] = (uint32_t)(n + (first ? SHOAL_WIRE_HDR_BYTES : 0));
                flags[s] = f;
                off += n;
                first = 0;
                if (f & SHOAL_IB_CHUNK_LAST) {
                    ok &= off == len;
                    sent_msgs++;
                    first = 1;
                    off = len = 0;
                }
            }
        } else if (rx.filled > 0) { /* receiver */
            uint32_t s = rx.head, l = lens[s];
            ok &= ((flags[s] & SHOAL_IB_CHUNK_FIRST) != 0) == rfirst;
            if (rfirst) {
                l -= SHOAL_WIRE_HDR_BYTES;
            }
            roff += l;
            rfirst = 0;
            if (flags[s] & SHOAL_IB_CHUNK_LAST) {
                ok &= roff < 20000; /* no message is longer than the sender draws */
                got_msgs++;
                rfirst = 1;
                roff = 0;
            }
            shoal_ib_ring_consume(&rx);
            if (rx.owed >= 2 || (seed & 1)) {
                ok &= shoal_ib_credit_grant(&tx, shoal_ib_ring_take_owed(&rx, 0xffff)) == 0;
            }
        }
        ok &= tx.avail <= nslots && rx.filled + rx.owed <= nslots;
        inflight_max = SHOAL_MAX(inflight_max, (int)rx.filled);
    }
    tap_ok(ok, "model: 200000 steps, credits never negative nor above the ring");
    tap_ok(got_msgs > 1000 && got_msgs + nslots >= sent_msgs,
           "model: %llu messages sent, %llu reassembled", (unsigned long long)sent_msgs,
           (unsigned long long)got_msgs);
    tap_is_int(inflight_max, nslots, "model: the ring filled up completely at times");
}

static void test_chunks(void)
{
    size_t n;
    const size_t s = 4096, first = s - SHOAL_WIRE_HDR_BYTES;
    tap_is_int((long long)shoal_ib_chunk_count(0, s), 1, "chunk: 0 B is one chunk");
    tap_is_int((long long)shoal_ib_chunk_count(first, s), 1, "chunk: fits the first slot");
    tap_is_int((long long)shoal_ib_chunk_count(first + 1, s), 2, "chunk: one byte over");
    tap_is_int((long long)shoal_ib_chunk_count(first + 3 * s, s), 4, "chunk: exact slots");
    /* the transport's slots have room for the header past SHOAL_IB_SLOT_SIZE */
    tap_is_int((long long)shoal_ib_chunk_count(65536, 65536 + SHOAL_IB_SLOT_ROOM), 1,
               "chunk: a SHOAL_IB_SLOT_SIZE-byte message is one write");
    tap_is_int((long long)shoal_ib_chunk_count(16 * 65536, 65536 + SHOAL_IB_SLOT_ROOM), 16,
               "chunk: 16 x SHOAL_IB_SLOT_SIZE bytes are 16 writes");
    tap_is_int(shoal_ib_chunk_next(0, 0, 1, s, &n), SHOAL_IB_CHUNK_FIRST | SHOAL_IB_CHUNK_LAST,
               "chunk: 0 B is first and last");
    tap_is_int((long long)n, 0, "chunk: no payload");
    tap_is_int(shoal_ib_chunk_next(10000, 0, 1, s, &n), SHOAL_IB_CHUNK_FIRST,
               "chunk: first of several");
    tap_is_int((long long)n, (long long)first, "chunk: first carries slot - header");
    tap_is_int(shoal_ib_chunk_next(10000, first, 0, s, &n), 0, "chunk: middle has no flags");
    tap_is_int(shoal_ib_chunk_next(10000, first + s, 0, s, &n), SHOAL_IB_CHUNK_LAST,
               "chunk: last flagged");
    tap_is_int((long long)n, (long long)(10000 - first - s), "chunk: last carries the rest");
    /* sum over the plan == length, chunk count agrees */
    int ok = 1;
    for (uint64_t len = 0; len < 3 * s; len += 97) {
        uint64_t off = 0, cnt = 0;
        unsigned f;
        int fst = 1;
        do {
            f = shoal_ib_chunk_next(len, off, fst, s, &n);
            off += n;
            fst = 0;
            cnt++;
        } while (!(f & SHOAL_IB_CHUNK_LAST) && cnt < 100);
        ok &= off == len && cnt == shoal_ib_chunk_count(len, s);
    }
    tap_ok(ok, "chunk: plan covers every length exactly, count agrees");
}

static void test_imm(void)
{
    shoal_ib_imm_t a = {.kind = SHOAL_IB_IMM_DATA, .flags = 3, .slot = 4095, .credits = 65535}, b;
    uint32_t v;
    tap_is_int(shoal_ib_imm_encode(&a, &v), 0, "imm: encode max fields");
    shoal_ib_imm_decode(v, &b);
    tap_ok(b.kind == a.kind && b.flags == a.flags && b.slot == a.slot && b.credits == a.credits,
           "imm: round trip");
    a = (shoal_ib_imm_t){.kind = SHOAL_IB_IMM_CREDIT, .credits = 17};
    shoal_ib_imm_encode(&a, &v);
    shoal_ib_imm_decode(v, &b);
    tap_ok(b.kind == SHOAL_IB_IMM_CREDIT && b.credits == 17 && b.slot == 0, "imm: credit kind");
    a.slot = 4096;
    tap_is_int(shoal_ib_imm_encode(&a, &v), -1, "imm: slot over 12 bits refused");
    a.slot = 0;
    a.credits = 65536;
    tap_is_int(shoal_ib_imm_encode(&a, &v), -1, "imm: credits over 16 bits refused");
}

/* SHOAL_IB_USE_RDMACM=1: the timeout of a connect's address and route resolution is what is
 * left of the deadline, at most 10 s. Without a deadline (SHOAL_TIMEOUT_MS=inf) it was 1 ms:
 * UINT64_MAX - now read as a negative count, so every connect whose peer's address was not in
 * the neighbour cache failed at once with RDMA_CM_EVENT_ADDR_ERROR. */
static void test_cm_resolve_ms(void)
{
    int ms = shoal_ib_cm_resolve_ms(UINT64_MAX);
    tap_is_int(ms, 10000, "rdma_cm: no deadline resolves for 10 s at a time (%d ms)", ms);
    ms = shoal_ib_cm_resolve_ms(shoal_time_ns() + 3000000000ull);
    tap_ok(ms > 2900 && ms <= 3000, "rdma_cm: 3 s left resolves for 3 s (%d ms)", ms);
    ms = shoal_ib_cm_resolve_ms(shoal_time_ns() + 60000000000ull);
    tap_is_int(ms, 10000, "rdma_cm: 60 s left resolves for 10 s at a time (%d ms)", ms);
    ms = shoal_ib_cm_resolve_ms(shoal_time_ns() - 1000000000ull);
    tap_is_int(ms, 1, "rdma_cm: a deadline passed still gives 1 ms (%d ms)", ms);
}

/* SHOAL_IB_USE_RDMACM=1: a connect rejected by the peer's own check (rdma_reject: not the rank
 * or token it issued) is an authentication failure; one rejected because nothing listens on
 * the peer's port any more (its communicator failed or timed out at init, or its process is
 * gone, after it sent the token) is the peer's failure. Both were SHOAL_ERR_AUTH, "the peer
 * refused our request" and "different job secret?": an init that failed on one rank read as a
 * key mismatch on the others. */
static void test_cm_rejected(void)
{
    shoal_status_t st = shoal_ib_cm_rejected(SHOAL_IB_CM_REJ_CONSUMER);
    tap_is_int(st, SHOAL_ERR_AUTH, "rdma_cm: the peer's reject of our request is %s",
               shoal_status_name(st));
    st = shoal_ib_cm_rejected(SHOAL_IB_CM_REJ_NO_LISTENER);
    tap_is_int(st, SHOAL_ERR_PEER_FAILED, "rdma_cm: no listener on the peer's port is %s",
               shoal_status_name(st));
    st = shoal_ib_cm_rejected(10); /* stale connection */
    tap_is_int(st, SHOAL_ERR_TRANSPORT, "rdma_cm: another reject reason is %s",
               shoal_status_name(st));
}

static void test_qp(void)
{
    shoal_ib_qp_plan_t p = {
        .port = 1, .pkey_index = 0, .mtu = IBV_MTU_4096, .remote_qpn = 0x1234,
        .remote_psn = 0xabc, .local_psn = 0xdef, .is_global = 1, .sgid_index = 3,
        .remote_lid = 0, .timeout = 14, .retry_cnt = 6, .rnr_retry = 7, .tc = 106, .sl = 3,
        .max_rd_atomic = 1,
    };
    struct ibv_qp_attr a;
    int m;
    p.remote_gid[15] = 9;
    m = shoal_ib_qp_step(0, &p, &a);
    tap_ok(a.qp_state == IBV_QPS_INIT && a.port_num == 1 &&
           (a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) &&
           m == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
           "qp: RESET->INIT sets port, pkey, remote write access");
    m = shoal_ib_qp_step(1, &p, &a);
    tap_ok(a.qp_state == IBV_QPS_RTR && a.path_mtu == IBV_MTU_4096 && a.dest_qp_num == 0x1234 &&
           a.rq_psn == 0xabc && (m & IBV_QP_AV) && (m & IBV_QP_PATH_MTU) &&
           (m & IBV_QP_DEST_QPN) && (m & IBV_QP_RQ_PSN) && (m & IBV_QP_MIN_RNR_TIMER),
           "qp: INIT->RTR sets MTU, remote QPN and PSN");
    tap_ok(a.ah_attr.is_global == 1 && a.ah_attr.grh.sgid_index == 3 &&
           a.ah_attr.grh.traffic_class == 106 && a.ah_attr.grh.dgid.raw[15] == 9 &&
           a.ah_attr.sl == 3, "qp: RoCE RTR has a GRH with SHOAL_IB_TC, GID index, SL");
    p.is_global = 0;
    p.remote_lid = 77;
    shoal_ib_qp_step(1, &p, &a);
    tap_ok(a.ah_attr.is_global == 0 && a.ah_attr.dlid == 77, "qp: IB RTR uses the LID, no GRH");
    m = shoal_ib_qp_step(2, &p, &a);
    tap_ok(a.qp_state == IBV_QPS_RTS && a.timeout == 14 && a.retry_cnt == 6 &&
           a.rnr_retry == 7 && a.sq_psn == 0xdef && (m & IBV_QP_TIMEOUT) &&
           (m & IBV_QP_RETRY_CNT) && (m & IBV_QP_SQ_PSN),
           "qp: RTR->RTS sets SHOAL_IB_TIMEOUT, RETRY_CNT, our PSN");
    tap_is_int(shoal_ib_qp_step(3, &p, &a), -1, "qp: unknown step refused");
    /* The partition key index is 16 bits: SHOAL_IB_PKEY=65537 was index 1, another partition
     * (another tenant's, where partitions keep tenants apart), silently. */
    p.pkey_index = 65537;
    m = shoal_ib_qp_step(0, &p, &a);
    tap_ok(m == -1, "qp: a partition key index above 65535 is refused, not wrapped (mask %d, "
           "index %u)", m, (unsigned)a.pkey_index);
    p.pkey_index = 65535;
    m = shoal_ib_qp_step(0, &p, &a);
    tap_ok(m > 0 && a.pkey_index == 65535, "qp: partition key index 65535 is kept");
}

/* ---- registration cache with a fake registrar ---- */

typedef struct {
    int regs, deregs, live;
    size_t last_len;
} fake_t;

static int fake_reg(void *arg, void *addr, size_t len, void **h, uint32_t *lkey)
{
    fake_t *f = arg;
    f->regs++;
    f->live++;
    f->last_len = len;
    *h = addr;
    *lkey = (uint32_t)f->regs;
    return 0;
}

static void fake_dereg(void *arg, void *h)
{
    fake_t *f = arg;
    (void)h;
    f->deregs++;
    f->live--;
}

static void test_regcache(void)
{
    fake_t f = {0};
    shoal_ib_reg_ops_t ops = {.reg = fake_reg, .dereg = fake_dereg, .arg = &f};
    shoal_ib_regcache_t rc;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *mem = aligned_alloc(pg, 16 * pg);
    uintptr_t k1, k2, k3, k4;
    uint32_t l1, l2, l3, l4;

    shoal_ib_regcache_init(&rc, &ops, 4, 6 * pg);
    shoal_ib_regcache_get(&rc, mem + 10, 2 * pg, &k1, &l1);
    tap_ok(f.regs == 1 && f.last_len == 3 * pg && k1 == (uintptr_t)mem,
           "regcache: miss registers the page range");
    shoal_ib_regcache_get(&rc, mem + 100, pg, &k2, &l2);
    tap_ok(f.regs == 1 && k2 == k1 && l2 == l1 && rc.hits == 1, "regcache: sub-range hits");
    shoal_ib_regcache_put(&rc, k1, l1);
    shoal_ib_regcache_put(&rc, k2, l2);
    shoal_ib_regcache_get(&rc, mem + 2 * pg, 2 * pg, &k3, &l3);
    tap_ok(f.regs == 2 && rc.n == 2, "regcache: overlapping but not covered -> new entry");
    shoal_ib_regcache_put(&rc, k3, l3);
    /* 3 + 2 pages cached; 4 more exceeds 6 pages: LRU (the first) goes */
    shoal_ib_regcache_get(&rc, mem + 8 * pg, 3 * pg, &k4, &l4);
    tap_ok(rc.evictions >= 1 && f.deregs >= 1 && rc.bytes <= 6 * pg,
           "regcache: over the byte cap evicts least recently used (%zu bytes)", rc.bytes);
    tap_ok(rc.evictions == 1 && f.deregs == 1 && rc.bytes == 5 * pg,
           "regcache: exactly the LRU entry went");
    /* 4 more pages: the idle entry goes, the busy one stays; still over the cap, so the new
     * registration is not kept (deregistered by its put) */
    shoal_ib_regcache_get(&rc, mem + 12 * pg, 4 * pg, &k1, &l1);
    tap_ok(f.deregs == 2 && f.live == 2 && rc.n == 2, "regcache: busy entries never evicted");
    shoal_ib_regcache_invalidate(&rc, mem + 9 * pg, 1);
    tap_is_int(f.deregs, 2, "regcache: invalidate of a busy range waits for its release");
    shoal_ib_regcache_put(&rc, k4, l4);
    tap_is_int(f.deregs, 3, "regcache: the last put deregisters an invalidated entry");
    shoal_ib_regcache_put(&rc, k1, l1);
    tap_is_int(f.deregs, 4, "regcache: an entry over the cap is dropped at its release");
    shoal_ib_regcache_get(&rc, mem, pg, &k1, &l1);
    shoal_ib_regcache_put(&rc, k1, l1);
    shoal_ib_regcache_invalidate(&rc, mem, 16 * pg);
    tap_is_int(rc.n, 0, "regcache: invalidate of idle entries deregisters them");
    tap_is_int(f.live, 0, "regcache: nothing left registered");
    shoal_ib_regcache_get(&rc, mem, pg, &k1, &l1);
    shoal_ib_regcache_put(&rc, k1, l1);
    shoal_ib_regcache_fini(&rc);
    tap_ok(f.live == 0 && f.regs == f.deregs, "regcache: fini deregisters everything");
    free(mem);
}

/* Two cached registrations that start on the same page (a 1-page and a 2-page message from
 * one buffer), both in flight with the shorter one's get last: the release of the first
 * message must drop its own entry's reference, not the other one's, or the entry still in
 * use is idle and an eviction deregisters it under its work request. */
static void test_regcache_same_start(void)
{
    fake_t f = {0};
    shoal_ib_reg_ops_t ops = {.reg = fake_reg, .dereg = fake_dereg, .arg = &f};
    shoal_ib_regcache_t rc;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *mem = aligned_alloc(pg, 16 * pg);
    uintptr_t ks, kl, k;
    uint32_t ls, ll, l;

    shoal_ib_regcache_init(&rc, &ops, 8, 8 * pg);
    shoal_ib_regcache_get(&rc, mem, pg, &ks, &ls);      /* [mem, +1 page) */
    shoal_ib_regcache_put(&rc, ks, ls);
    shoal_ib_regcache_get(&rc, mem, 2 * pg, &kl, &ll);  /* [mem, +2 pages): a new entry */
    shoal_ib_regcache_put(&rc, kl, ll);
    tap_ok(rc.n == 2 && f.regs == 2 && kl == ks, "regcache: two entries with one start");
    shoal_ib_regcache_get(&rc, mem, 2 * pg, &kl, &ll);  /* message A: the 2-page entry */
    shoal_ib_regcache_get(&rc, mem, pg, &ks, &ls);      /* message B: the 1-page entry */
    tap_ok(ll != ls, "regcache: the two messages hold different registrations");
    shoal_ib_regcache_put(&rc, kl, ll);                 /* A completes, B is in flight */
    /* 7 more pages fit only if idle entries go: B's must not be one of them */
    shoal_ib_regcache_get(&rc, mem + 8 * pg, 7 * pg, &k, &l);
    shoal_ib_regcache_put(&rc, k, l);
    shoal_ib_regcache_get(&rc, mem, pg, &k, &l);
    tap_ok(l == ls && rc.evictions == 1,
           "regcache: the entry of the message in flight stays registered (lkey %u, B's %u)",
           l, ls);
    shoal_ib_regcache_put(&rc, k, l);
    shoal_ib_regcache_put(&rc, ks, ls);
    shoal_ib_regcache_fini(&rc);
    tap_ok(f.live == 0 && f.regs == f.deregs, "regcache: same-start entries all released");
    free(mem);
}

/* One message larger than the whole cap (SHOAL_IB_REG_CACHE_MAX) is registered for itself
 * and dropped at its release; the entries the job reuses stay. It evicted every idle entry
 * first, for a range that could never be kept anyway. */
static void test_regcache_oversize(void)
{
    fake_t f = {0};
    shoal_ib_reg_ops_t ops = {.reg = fake_reg, .dereg = fake_dereg, .arg = &f};
    shoal_ib_regcache_t rc;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *mem = aligned_alloc(pg, 32 * pg);
    uintptr_t k1, k2, k;
    uint32_t l1, l2, l;

    shoal_ib_regcache_init(&rc, &ops, 8, 4 * pg);
    shoal_ib_regcache_get(&rc, mem, pg, &k1, &l1);
    shoal_ib_regcache_put(&rc, k1, l1);
    shoal_ib_regcache_get(&rc, mem + 2 * pg, pg, &k2, &l2);
    shoal_ib_regcache_put(&rc, k2, l2);
    shoal_ib_regcache_get(&rc, mem + 8 * pg, 16 * pg, &k, &l); /* 16 pages, cap 4 */
    tap_ok(rc.evictions == 0 && f.live == 3,
           "regcache: a range over the whole cap evicts nothing (%llu evictions)",
           (unsigned long long)rc.evictions);
    shoal_ib_regcache_put(&rc, k, l);
    tap_ok(f.live == 2 && rc.bytes == 2 * pg, "regcache: it is deregistered at its release");
    shoal_ib_regcache_get(&rc, mem, pg, &k, &l);
    tap_ok(l == l1 && f.regs == 3, "regcache: the reused buffer still hits (lkey %u, was %u)",
           l, l1);
    shoal_ib_regcache_put(&rc, k, l);
    shoal_ib_regcache_fini(&rc);
    tap_ok(f.live == 0 && f.regs == f.deregs, "regcache: oversize case all released");
    free(mem);
}

/* ---- RDMA scoping: per-peer regions, keys, access flags ---- */

#define REMOTE_ANY (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static void test_layout(void)
{
    shoal_ib_layout_t l;
    shoal_ib_region_t r, q;
    shoal_status_t st;
    int ok = 1;

    tap_is_int(shoal_ib_layout_init(&l, 3, 5, 5000, 3, 13, 4096), SHOAL_OK, "layout: init");
    tap_ok(l.ring_len == 25000 && l.ring_stride == 28672 && l.ring_total == 3 * 28672,
           "layout: a ring is nslots x slot_size, peers a page-aligned stride apart");
    tap_ok(l.hdr_off == 15000 && l.send_len == 15000 + 13 * SHOAL_WIRE_HDR_BYTES &&
           l.send_stride == 16384 && l.send_total == 3 * 16384,
           "layout: a send area is the bounce slots, then the staged headers");
    for (int i = 0; i < 3; i++) {
        for (int kind = SHOAL_IB_REGION_RING; kind <= SHOAL_IB_REGION_SEND; kind++) {
            size_t total = kind == SHOAL_IB_REGION_RING ? l.ring_total : l.send_total;
            shoal_ib_region_get(&l, i, kind, &r);
            ok &= r.off % 4096 == 0 && r.off + r.len <= total;
            for (int j = 0; j < 3; j++) {
                shoal_ib_region_get(&l, j, kind, &q);
                ok &= j == i || r.off + r.len <= q.off || q.off + q.len <= r.off;
            }
        }
    }
    tap_ok(ok, "layout: every peer's ring and send area starts on its own page, none overlap");
    tap_is_int(shoal_ib_layout_init(&l, 0x7fffffff, 4096, 16u << 20, 4096, 4104, 4096),
               SHOAL_ERR_INVALID_ARG, "layout: sizes that overflow are refused");
    tap_is_int(shoal_ib_layout_init(&l, 2, 64, 65536, 0, 72, 4096), SHOAL_ERR_INVALID_ARG,
               "layout: zero bounce slots refused");
    /* One peer's send area: its bounce slots plus its staged headers past 2^64 bytes wrapped
     * to 128 GiB, the headers 16 EiB in, and it was SHOAL_OK. */
    st = shoal_ib_layout_init(&l, 1, 2, UINT32_MAX, UINT32_MAX, UINT32_MAX, 4096);
    tap_is_int(st, SHOAL_ERR_INVALID_ARG, "layout: a send area past 2^64 bytes is refused "
               "(send area %zu bytes, headers at %zu)", l.send_len, l.hdr_off);

    tap_is_int(shoal_ib_region_access(SHOAL_IB_REGION_RING),
               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
               "access: a ring is remote-writable (and local write, as verbs requires), no "
               "remote read or atomics");
    tap_ok((shoal_ib_region_access(SHOAL_IB_REGION_SEND) & (REMOTE_ANY | IBV_ACCESS_MW_BIND)) ==
           0, "access: send areas (bounce slots, headers) have no remote access");
    tap_ok((shoal_ib_region_access(SHOAL_IB_REGION_USER) & (REMOTE_ANY | IBV_ACCESS_MW_BIND)) ==
           0, "access: user buffers (SHOAL_IB_REG_CACHE=1) have no remote access");
}

/* A model of the HCA's check on an incoming RDMA write: the rkey names a registration in the
 * protection domain of the queue pair it arrives on, with remote write, covering the range. */
typedef struct {
    int pd;
    uintptr_t start;
    size_t len;
    int access;
    uint32_t rkey;
} model_mr_t;

static int model_write_ok(const model_mr_t *mrs, int n, int qp_pd, uint32_t rkey, uintptr_t addr,
                          size_t len)
{
    for (int i = 0; i < n; i++) {
        if (mrs[i].rkey == rkey) {
            return mrs[i].pd == qp_pd && (mrs[i].access & IBV_ACCESS_REMOTE_WRITE) &&
                   addr >= mrs[i].start && addr + len <= mrs[i].start + mrs[i].len;
        }
    }
    return 0;
}

static void test_scoping(void)
{
    enum { NP = 4, NS = 4, SLOT = 4096 };
    shoal_ib_layout_t l;
    shoal_ib_pair_t pairs[NP];
    model_mr_t mrs[2 * NP];
    uint8_t *rings, *sends;
    int n = 0, ok = 1, disjoint = 1, own = 0, others = 0;

    shoal_ib_layout_init(&l, NP, NS, SLOT, 2, NS + 8, 4096);
    rings = aligned_alloc(4096, l.ring_total);
    sends = aligned_alloc(4096, l.send_total);
    /* what ib_ep.c registers: per peer, in the peer's own protection domain, its ring and its
     * send area, at the regions of the layout, with the regions' access flags */
    for (int i = 0; i < NP; i++) {
        shoal_ib_region_t r;
        shoal_ib_region_get(&l, i, SHOAL_IB_REGION_RING, &r);
        mrs[n++] = (model_mr_t){.pd = i, .start = (uintptr_t)rings + r.off, .len = r.len,
                                .access = r.access, .rkey = 0x1100u + (uint32_t)i};
        shoal_ib_region_get(&l, i, SHOAL_IB_REGION_SEND, &r);
        mrs[n++] = (model_mr_t){.pd = i, .start = (uintptr_t)sends + r.off, .len = r.len,
                                .access = r.access, .rkey = 0x2200u + (uint32_t)i};
        shoal_ib_pair_local(&l, rings, i, 100 + (uint32_t)i, 7, mrs[n - 2].rkey, &pairs[i]);
    }
    for (int i = 0; i < NP; i++) {
        ok &= pairs[i].rkey == 0x1100u + (uint32_t)i && pairs[i].nslots == NS &&
              pairs[i].slot_size == SLOT &&
              pairs[i].ring_addr == (uint64_t)(uintptr_t)rings + (uint64_t)i * l.ring_stride;
        for (int j = 0; j < NP; j++) {
            uint64_t a = pairs[i].ring_addr, b = pairs[j].ring_addr;
            disjoint &= i == j || a + (uint64_t)NS * SLOT <= b || b + (uint64_t)NS * SLOT <= a;
        }
    }
    tap_ok(ok, "scoping: each peer is told its own ring's address and its ring's own rkey");
    tap_ok(disjoint, "scoping: the ranges told to different peers are disjoint");
    /* Peer j may present any rkey (told, guessed) at any address on its queue pair (in
     * protection domain j): only its own ring accepts the write. */
    for (int j = 0; j < NP; j++) {
        for (int k = 0; k < n; k++) {
            for (size_t off = 0; off < l.ring_total; off += SLOT) {
                int w = model_write_ok(mrs, n, j, mrs[k].rkey, (uintptr_t)rings + off, SLOT);
                int mine = off >= (size_t)j * l.ring_stride &&
                           off + SLOT <= (size_t)j * l.ring_stride + l.ring_len;
                own += w && mine;
                others += w && !mine;
            }
            for (size_t off = 0; off < l.send_total; off += 64) {
                others += model_write_ok(mrs, n, j, mrs[k].rkey, (uintptr_t)sends + off, 32);
            }
        }
        others += model_write_ok(mrs, n, j, pairs[j].rkey, pairs[j].ring_addr + NS * SLOT - 8,
                                 16); /* straddling the end of its own ring */
    }
    tap_is_int(own, NP * NS, "scoping: every peer may write every slot of its own ring");
    tap_is_int(others, 0, "scoping: no peer may write another peer's ring, any send area or "
               "past its ring, whatever rkey it presents");
    free(rings);
    free(sends);
}

/* ---- building chunks ---- */

static void test_chunk_build(void)
{
    enum { SLOT = 4096 };
    static uint8_t buf[3 * SLOT + 100], bounce[SLOT], hdr[SHOAL_WIRE_HDR_BYTES];
    shoal_ib_chunk_src_t s = {.slot_size = SLOT, .max_inline = 128, .hdr = hdr, .send_lkey = 0x55,
                              .bounce = bounce};
    shoal_ib_chunk_t c;
    size_t first = SLOT - SHOAL_WIRE_HDR_BYTES;

    for (size_t i = 0; i < sizeof(buf); i++) {
        buf[i] = (uint8_t)(i * 7 + 1);
    }
    memset(hdr, 0xab, sizeof(hdr));
    tap_is_int(shoal_ib_chunk_build(&s, buf, 50, 0, 1, &c), 0, "build: small message");
    tap_ok(c.src == SHOAL_IB_SRC_INLINE && c.nsge == 2 && c.bytes == 82 && c.n == 50 &&
           c.sge[0].addr == (uintptr_t)hdr && c.sge[1].addr == (uintptr_t)buf &&
           c.flags == (SHOAL_IB_CHUNK_FIRST | SHOAL_IB_CHUNK_LAST),
           "build: up to SHOAL_IB_MAX_INLINE bytes go inline (header and buffer gathered)");
    memset(bounce, 0, sizeof(bounce));
    shoal_ib_chunk_build(&s, buf, sizeof(buf), 0, 1, &c);
    tap_ok(c.src == SHOAL_IB_SRC_BOUNCE && c.nsge == 1 && c.sge[0].addr == (uintptr_t)bounce &&
           c.sge[0].lkey == 0x55 && c.sge[0].length == SLOT && c.n == first &&
           c.flags == SHOAL_IB_CHUNK_FIRST,
           "build: a large first chunk is one gather from the bounce slot, send-area lkey");
    tap_ok(memcmp(bounce, hdr, sizeof(hdr)) == 0 &&
           memcmp(bounce + SHOAL_WIRE_HDR_BYTES, buf, first) == 0,
           "build: the bounce slot holds the header, then the first payload bytes");
    shoal_ib_chunk_build(&s, buf, sizeof(buf), first, 0, &c);
    tap_ok(c.src == SHOAL_IB_SRC_BOUNCE && c.bytes == SLOT && c.flags == 0 &&
           memcmp(bounce, buf + first, SLOT) == 0,
           "build: a middle chunk fills a whole bounce slot with payload");
    shoal_ib_chunk_build(&s, buf, sizeof(buf), sizeof(buf) - 60, 0, &c);
    tap_ok(c.src == SHOAL_IB_SRC_INLINE && c.n == 60 && c.flags == SHOAL_IB_CHUNK_LAST,
           "build: a short last chunk goes inline, no bounce slot");
    s.bounce = NULL;
    memset(&c, 0x5a, sizeof(c));
    tap_is_int(shoal_ib_chunk_build(&s, buf, sizeof(buf), first, 0, &c), -1,
               "build: no free bounce slot: the chunk waits");
    s.zcopy = 1;
    s.buf_lkey = 0x77;
    shoal_ib_chunk_build(&s, buf, sizeof(buf), 0, 1, &c);
    tap_ok(c.src == SHOAL_IB_SRC_ZCOPY && c.nsge == 2 && c.sge[0].lkey == 0x55 &&
           c.sge[1].addr == (uintptr_t)buf && c.sge[1].lkey == 0x77 && c.sge[1].length == first,
           "build: SHOAL_IB_REG_CACHE=1 reads the registered buffer in place");
    s.zcopy = 0;
    s.max_inline = 0;
    shoal_ib_chunk_build(&s, buf, 0, 0, 1, &c);
    tap_ok(c.src == SHOAL_IB_SRC_HDR && c.nsge == 1 && c.sge[0].addr == (uintptr_t)hdr &&
           c.sge[0].lkey == 0x55, "build: an empty message is its staged header alone");
}

/* ---- free + malloc (unmap + map) at the same address: which bytes go out ----
 * A model of pinned memory: a registration holds the pages mapped at registration time; once
 * the range is unmapped, the HCA still reads those old pages (snapshot taken at unmap), while
 * the CPU sees whatever is mapped there now. The HCA gathers when the write completes. */

typedef struct {
    uintptr_t start, end;
    uint32_t lkey;
    int live;
    uint8_t *old;             /* the pinned pages' bytes once the range was unmapped */
} pin_t;

static pin_t pins[32];
static int npins;

static int pin_reg(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p)
{
    (void)arg;
    if (npins == 32) {
        return -1;
    }
    pins[npins] = (pin_t){.start = (uintptr_t)addr, .end = (uintptr_t)addr + len,
                          .lkey = 0x9000u + (uint32_t)npins, .live = 1};
    *handle_p = &pins[npins];
    *lkey_p = pins[npins].lkey;
    npins++;
    return 0;
}

static void pin_dereg(void *arg, void *handle)
{
    pin_t *p = handle;
    (void)arg;
    p->live = 0;
    free(p->old);
    p->old = NULL;
}

/* The application is about to unmap [a, a + len): registrations keep the old pages. */
static void pin_unmap(void *a, size_t len)
{
    for (int i = 0; i < npins; i++) {
        pin_t *p = &pins[i];
        if (p->live && p->old == NULL && p->start < (uintptr_t)a + len &&
            (uintptr_t)a < p->end) {
            p->old = malloc(p->end - p->start);
            memcpy(p->old, (void *)p->start, p->end - p->start);
        }
    }
}

/* What the HCA reads for one gather entry; -1 if no live registration covers it. */
static int hca_read(const shoal_ib_sge_t *g, int inl, uint8_t *out)
{
    if (inl) {
        memcpy(out, (const void *)(uintptr_t)g->addr, g->length);
        return 0;
    }
    for (int i = 0; i < npins; i++) {
        pin_t *p = &pins[i];
        if (p->live && p->lkey == g->lkey && g->addr >= p->start &&
            g->addr + g->length <= p->end) {
            memcpy(out, p->old != NULL ? p->old + (g->addr - p->start)
                                       : (const uint8_t *)(uintptr_t)g->addr, g->length);
            return 0;
        }
    }
    return -1;
}

enum { SIM_SLOT = 4096, SIM_BOUNCE = 3, SIM_INLINE = 64 };

typedef struct {
    uint8_t *area;            /* bounce slots then one staged header */
    uint32_t lkey;
    shoal_ib_regcache_t *rc;  /* SHOAL_IB_REG_CACHE=1, else NULL */
} sim_t;

/* Sends len bytes of buf the way shoal_ib_ep_post_chunk does (bounce slots taken from a
 * credit ring, returned at completion; or the buffer through the registration cache) and
 * returns in out what the receiver's ring got, payload only. 0, or -1 on a bad gather. */
static int sim_send(sim_t *sim, const uint8_t *buf, size_t len, uint8_t *out)
{
    shoal_ib_credit_t bq;
    shoal_ib_chunk_t q[SIM_BOUNCE + 1];
    uint8_t *hdr = sim->area + SIM_BOUNCE * SIM_SLOT, wire[SIM_SLOT];
    uint64_t off = 0, got = 0;
    int first = 1, nq = 0, bad = 0, last = 0;
    uintptr_t key = 0;
    uint32_t lkey = 0;

    shoal_ib_credit_init(&bq, SIM_BOUNCE);
    memset(hdr, 0xee, SHOAL_WIRE_HDR_BYTES);
    if (sim->rc != NULL && shoal_ib_regcache_get(sim->rc, buf, len, &key, &lkey) != SHOAL_OK) {
        return -1;
    }
    while (!last || nq > 0) {
        shoal_ib_chunk_src_t s = {
            .slot_size = SIM_SLOT, .max_inline = SIM_INLINE, .hdr = hdr, .send_lkey = sim->lkey,
            .bounce = bq.avail > 0 ? sim->area + (size_t)bq.tail * SIM_SLOT : NULL,
            .zcopy = sim->rc != NULL, .buf_lkey = lkey,
        };
        if (!last && nq <= SIM_BOUNCE && /* the send queue's depth */
            shoal_ib_chunk_build(&s, buf, len, off, first, &q[nq]) == 0) {
            if (q[nq].src == SHOAL_IB_SRC_BOUNCE) {
                (void)shoal_ib_credit_take(&bq);
            }
            off += q[nq].n;
            first = 0;
            last = (q[nq].flags & SHOAL_IB_CHUNK_LAST) != 0;
            nq++;
            continue;
        }
        /* the oldest write completes: the HCA gathers it, its bounce slot comes back */
        size_t pos = 0;
        for (int k = 0; k < q[0].nsge; k++) {
            bad |= hca_read(&q[0].sge[k], q[0].src == SHOAL_IB_SRC_INLINE, wire + pos);
            pos += q[0].sge[k].length;
        }
        size_t h = got == 0 && (q[0].flags & SHOAL_IB_CHUNK_FIRST) ? SHOAL_WIRE_HDR_BYTES : 0;
        memcpy(out + got, wire + h, pos - h);
        got += pos - h;
        if (q[0].src == SHOAL_IB_SRC_BOUNCE) {
            (void)shoal_ib_credit_grant(&bq, 1);
        }
        memmove(&q[0], &q[1], (size_t)--nq * sizeof(q[0]));
    }
    if (sim->rc != NULL) {
        shoal_ib_regcache_put(sim->rc, key, lkey);
    }
    return bad || got != len ? -1 : 0;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)(seed + i * 13 + (i >> 8));
    }
}

/* A buffer unmapped and mapped again at the same address, with new bytes. */
static uint8_t *remap_same(uint8_t *old, size_t len)
{
    void *p;
    pin_unmap(old, len);
    munmap(old, len);
    p = mmap(old, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void test_stale(void)
{
    const size_t len = 10 * SIM_SLOT + 123; /* 11 chunks through 3 bounce slots */
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), area_len = SIM_BOUNCE * SIM_SLOT + pg;
    uint8_t *area = aligned_alloc(pg, area_len), *want = malloc(len), *out = malloc(len);
    uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint32_t lkey;
    void *h;
    sim_t sim = {.area = area};
    shoal_ib_regcache_t rc;
    shoal_ib_reg_ops_t ops = {.reg = pin_reg, .dereg = pin_dereg};
    int regs;

    pin_reg(NULL, area, area_len, &h, &lkey); /* the send area, registered once */
    sim.lkey = lkey;
    regs = npins;
    /* default: only the send area is registered, chunks are staged through bounce slots */
    fill(buf, len, 1);
    memcpy(want, buf, len);
    tap_is_int(sim_send(&sim, buf, len, out), 0, "stale: a message through 3 bounce slots");
    tap_ok(memcmp(out, want, len) == 0, "stale: the receiver gets the buffer's bytes");
    buf = remap_same(buf, len);
    tap_ok(buf != NULL, "stale: buffer unmapped and mapped again at the same address");
    fill(buf, len, 2);
    memcpy(want, buf, len);
    memset(out, 0, len);
    tap_is_int(sim_send(&sim, buf, len, out), 0, "stale: the same address sent again");
    tap_ok(memcmp(out, want, len) == 0, "stale: default path sends the new bytes after unmap + "
           "map at the same address");
    tap_is_int(npins, regs, "stale: default path registered no user memory");
    {
        uint8_t *p = malloc(len), *r;
        uintptr_t pa = (uintptr_t)p;
        fill(p, len, 3);
        sim_send(&sim, p, len, out);
        free(p);
        r = malloc(len);
        if ((uintptr_t)r == pa) {
            fill(r, len, 4);
            memcpy(want, r, len);
            sim_send(&sim, r, len, out);
            tap_ok(memcmp(out, want, len) == 0,
                   "stale: free + malloc at the same address: the new bytes are sent");
        } else {
            tap_skip(1, "malloc did not return the freed address (sanitizer quarantine?); the "
                     "unmap + map case above covers it");
        }
        free(r);
    }
    /* SHOAL_IB_REG_CACHE=1: zero copy from a cached registration */
    shoal_ib_regcache_init(&rc, &ops, 8, 1u << 30);
    sim.rc = &rc;
    fill(buf, len, 5);
    memcpy(want, buf, len);
    tap_is_int(sim_send(&sim, buf, len, out), 0, "cache: zero-copy send");
    tap_ok(memcmp(out, want, len) == 0 && rc.misses == 1,
           "cache: the registered buffer's bytes arrive");
    buf = remap_same(buf, len);
    fill(buf, len, 6);
    tap_is_int(sim_send(&sim, buf, len, out), 0, "cache: the same address sent again");
    tap_ok(rc.hits == 1 && memcmp(out, want, len) == 0,
           "cache: a cache hit sends the old pages after unmap + map (why the cache is off by "
           "default)");
    memcpy(want, buf, len);
    shoal_ib_regcache_invalidate(&rc, buf, len);
    tap_ok(rc.n == 0 && !pins[regs].live, "cache: invalidate drops and deregisters the entry");
    tap_is_int(sim_send(&sim, buf, len, out), 0, "cache: sent after invalidation");
    tap_ok(rc.misses == 2 && memcmp(out, want, len) == 0,
           "cache: after invalidation the new bytes are sent");
    shoal_ib_regcache_fini(&rc);
    pin_dereg(NULL, h);
    for (int i = 0; i < npins; i++) {
        free(pins[i].old);
    }
    munmap(buf, len);
    free(area);
    free(want);
    free(out);
}

static void test_codecs(void)
{
    shoal_ib_addr_t a = {.link_layer = 2, .port = 1, .mtu = 5, .is_global = 1, .lid = 7}, b;
    shoal_ib_pair_t p = {.qpn = 0xabcdef, .psn = 0x123456, .ring_addr = 0x7fff12345678ull,
                         .rkey = 0xdeadbeef, .nslots = 64, .slot_size = 65536}, q;
    uint8_t buf[SHOAL_IB_ADDR_BYTES], pb[SHOAL_IB_PAIR_BYTES];
    a.gid[15] = 3;
    a.oob.family = AF_INET;
    a.oob.port = 4242;
    a.oob.ip[0] = 127;
    a.oob.ip[3] = 1;
    shoal_ib_addr_encode(&a, buf);
    tap_ok(shoal_ib_addr_decode(buf, sizeof(buf), &b) == 0 && b.mtu == 5 && b.lid == 7 &&
           b.gid[15] == 3 && b.oob.port == 4242 && b.oob.ip[3] == 1, "codec: address round trip");
    tap_ok(shoal_ib_addr_decode(buf, sizeof(buf) - 1, &b) != 0, "codec: short address refused");
    buf[0] ^= 1;
    tap_ok(shoal_ib_addr_decode(buf, sizeof(buf), &b) != 0, "codec: bad magic refused");
    shoal_ib_pair_encode(&p, pb);
    shoal_ib_pair_decode(pb, &q);
    tap_ok(q.qpn == p.qpn && q.psn == p.psn && q.ring_addr == p.ring_addr && q.rkey == p.rkey &&
           q.nslots == 64 && q.slot_size == 65536, "codec: pair info round trip");
}

/* ---- the shared oob handshake over a socketpair ---- */

typedef struct {
    int fd;
    const uint8_t *secret;
    shoal_status_t st;
} side_t;

static void *connector(void *arg)
{
    side_t *s = arg;
    shoal_oob_auth_t a = {.secret = s->secret, .label = "shoal-ib", .comm_id = 9, .self = 3};
    s->st = shoal_oob_auth_connect(s->fd, &a, 1, shoal_deadline_ns(5000));
    if (s->st != SHOAL_OK) {
        close(s->fd); /* like a refused peer: the other side sees EOF */
    }
    return NULL;
}

static int expect_3(void *arg, uint32_t r)
{
    (void)arg;
    return r == 3;
}

static shoal_status_t handshake(const uint8_t *k1, const uint8_t *k2, uint32_t *peer)
{
    int sv[2];
    pthread_t t;
    char why[160] = "";
    side_t c;
    shoal_oob_auth_t a = {.secret = k2, .label = "shoal-ib", .comm_id = 9, .self = 1};
    shoal_status_t st;
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    c = (side_t){.fd = sv[0], .secret = k1};
    pthread_create(&t, NULL, connector, &c);
    st = shoal_oob_auth_accept(sv[1], &a, expect_3, NULL, peer, shoal_deadline_ns(5000), why,
                               sizeof(why));
    if (st != SHOAL_OK) {
        close(sv[1]);
    }
    pthread_join(t, NULL);
    if (st == SHOAL_OK) {
        close(sv[1]);
    }
    if (c.st == SHOAL_OK) {
        close(sv[0]);
    }
    return st != SHOAL_OK ? st : c.st;
}

static void test_oob(void)
{
    static const uint8_t k1[SHOAL_SECRET_BYTES] = "the-right-secret-32-bytes-long!";
    static const uint8_t k2[SHOAL_SECRET_BYTES] = "the-wrong-secret-32-bytes-long!";
    uint32_t peer = 0;
    tap_is_int(handshake(k1, k1, &peer), SHOAL_OK, "oob: same secret authenticates");
    tap_is_int(peer, 3, "oob: acceptor learns the connector's rank");
    tap_ok(handshake(k1, k2, &peer) != SHOAL_OK, "oob: different secret refused");
    tap_ok(shoal_ifname_match("=lo", "lo") && !shoal_ifname_match("=lo", "lo0") &&
           shoal_ifname_match("^docker", "eth0"), "oob: interface spec syntax");
    /* blanks after a comma were part of the next name: "eth0, ib0" matched no ib0 */
    tap_ok(shoal_ifname_match("eth0, ib0", "ib0") && shoal_ifname_match("=eth0 ,\tib0 ", "ib0") &&
           shoal_ifname_match("=eth0 , ib0", "eth0") && !shoal_ifname_match("=eth0, ib0", "ib") &&
           !shoal_ifname_match("^eth0, ib0", "ib0") && !shoal_ifname_match(" , ", "eth0"),
           "oob: blanks around the names of an interface list are not part of them");
}

#ifdef SHOAL_HAVE_RDMACM
#include <rdma/rdma_cma.h>
#include <sys/eventfd.h>
#include <fcntl.h>

/* rdma_cm: an endpoint whose connect got its event channel but no identifier (rdma_create_id
 * failed) closes the channel with the endpoint (its fd stayed open). librdmacm is loaded by
 * shoal_ib_cm_open even where it knows no device; the channel is one as librdmacm makes it
 * (rdma_destroy_event_channel closes its fd and frees it). */
static void test_cm_close(void)
{
    shoal_tl_ctx_t ctx;
    shoal_ep_t ep;
    struct ibv_context *dev = NULL;
    struct rdma_event_channel *ch;
    int fd, loaded;

    memset(&ctx, 0, sizeof(ctx));
    memset(&ep, 0, sizeof(ep));
    loaded = shoal_ib_cm_open(&ctx, "shoal-no-such-hca", &dev) != SHOAL_ERR_UNSUPPORTED;
    shoal_ib_cm_fini(&ctx);
    if (!loaded) {
        tap_skip(1, "librdmacm cannot be loaded");
        return;
    }
    ch = malloc(sizeof(*ch));
    fd = eventfd(0, EFD_CLOEXEC);
    if (ch == NULL || fd < 0) {
        tap_bail("malloc/eventfd failed");
        return;
    }
    ch->fd = fd;
    ep.cm_chan = ch;
    ep.oob_fd = -1;
    shoal_ib_cm_close(&ep);
    tap_ok(ep.cm_chan == NULL && fcntl(fd, F_GETFD) < 0,
           "rdma_cm: an endpoint with a channel and no identifier closes the channel");
}
#else
static void test_cm_close(void)
{
    tap_skip(1, "built without librdmacm");
}
#endif

/* connect_all refusing a bad peer address closes the endpoints it made, and only their
 * sockets: those past the bad one held 0 (calloc's), so the application's fd 0 was closed. */
static void test_connect_bad_addr(void)
{
    shoal_tl_ctx_t ctx;
    shoal_ep_t *eps = NULL;
    int peers[3] = {1, 2, 3}, p[2], saved0 = dup(0);
    const void *addrs[3] = {"", "", ""};
    size_t lens[3] = {0, 0, 0};
    shoal_status_t st;

    memset(&ctx, 0, sizeof(ctx));
    ctx.rank = 0;
    ctx.listen_fd = 1000; /* only looked at: "not listening" would refuse earlier */
    if (saved0 < 0 || pipe(p) != 0 || dup2(p[0], 0) < 0) {
        tap_bail("pipe/dup2 failed");
        return;
    }
    close(p[0]);
    st = shoal_ib_connect_all(&ctx, peers, 3, addrs, lens, &eps);
    tap_ok(st == SHOAL_ERR_INVALID_ARG && fcntl(0, F_GETFD) >= 0,
           "connect_all with a bad address fails (%s) and leaves fd 0 open",
           shoal_status_name(st));
    dup2(saved0, 0);
    close(saved0);
    close(p[1]);
}

/* A send completion's error status decides whom the endpoint blames: a local one (this
 * rank's queue pair, registrations or device: local protection, local QP operation, local
 * length) is this rank's own failure, SHOAL_ERR_TRANSPORT naming this rank; a remote one
 * (retries exhausted, remote access) is the peer's, SHOAL_ERR_PEER_FAILED. The local ones
 * were reported as "peer 1: RDMA write failed" with PEER_FAILED, and peer 1 was blamed. */
static void wc_case(enum ibv_wc_status wst, int send, shoal_status_t want, int want_culprit,
                    const char *what)
{
    shoal_tl_ctx_t ctx;
    shoal_ep_t ep;
    shoal_ib_wr_t wrs[4];
    shoal_tl_req_t req;
    struct ibv_wc wc;
    char err[256] = "";

    memset(&ctx, 0, sizeof(ctx));
    memset(&ep, 0, sizeof(ep));
    memset(wrs, 0, sizeof(wrs));
    memset(&req, 0, sizeof(req));
    memset(&wc, 0, sizeof(wc));
    ctx.rank = 0;
    ctx.epfd = -1;
    ctx.eps = &ep;
    ctx.neps = 1;
    ctx.npending = 1;
    ep.ctx = &ctx;
    ep.idx = 0;
    ep.peer = 1;
    ep.oob_fd = -1;
    ep.lz_fd = -1;
    ep.status = SHOAL_OK;
    ep.culprit = -1;
    ep.wrs = wrs;
    ep.sq_depth = 4;
    shoal_tl_req_start(&req);
    req.errbuf = err;
    req.errlen = sizeof(err);
    if (send) {
        ep.sq_head = ep.sq_tail = &req;
        ep.sq_posted = 1;
        wrs[0].req = &req;
        wc.wr_id = SHOAL_IB_SEND_BIT;
    } else {
        ep.rq_head = ep.rq_tail = &req;
        wc.wr_id = 0;
    }
    wc.status = wst;
    wc.opcode = send ? IBV_WC_RDMA_WRITE : IBV_WC_RECV_RDMA_WITH_IMM;
    (void)shoal_ib_handle_wc(&ctx, &wc);
    tap_ok(req.done && req.status == want && req.culprit == want_culprit &&
               ep.culprit == want_culprit && ctx.npending == 0 &&
               (want_culprit != 0 || strstr(err, "local") != NULL),
           "%s completion %s: %s, culprit %d (%s)", send ? "send" : "receive", what,
           shoal_status_name(req.status), req.culprit, err);
}

static void test_wc_blame(void)
{
    if (shoal_tl_lib_load(&shoal_ib_lib) != SHOAL_OK) {
        tap_skip(6, "libibverbs cannot be loaded");
        return;
    }
    wc_case(IBV_WC_LOC_PROT_ERR, 1, SHOAL_ERR_TRANSPORT, 0, "local protection error");
    wc_case(IBV_WC_LOC_QP_OP_ERR, 1, SHOAL_ERR_TRANSPORT, 0, "local QP operation error");
    wc_case(IBV_WC_LOC_LEN_ERR, 1, SHOAL_ERR_TRANSPORT, 0, "local length error");
    wc_case(IBV_WC_RETRY_EXC_ERR, 1, SHOAL_ERR_PEER_FAILED, -1, "retries exhausted");
    wc_case(IBV_WC_REM_ACCESS_ERR, 1, SHOAL_ERR_PEER_FAILED, -1, "remote access error");
    /* on a receive, a local access or length error is what the peer's write did to us */
    wc_case(IBV_WC_LOC_ACCESS_ERR, 0, SHOAL_ERR_PEER_FAILED, -1, "local access error");
}

/* After the connection, a peer's out-of-band socket carries nothing but its abort notice
 * (shoal_ib_ep_send_abort). Bytes from it are read (shoal_ib_ep_oob_read) and, when they end
 * the socket's use, fail the endpoint's queued requests (shoal_ib_ep_oob_gone) with what
 * happened: EOF is the peer's process gone (PEER_FAILED); 32 bytes that are not an abort
 * notice of this communicator say nothing of the process, which may be alive (PROTOCOL: they
 * were reported as "closed its out-of-band connection (Protocol error): the process is
 * gone"). */
static void oob_case(const uint8_t *bytes, size_t n, int close_after, shoal_status_t want,
                     const char *want_why, const char *what)
{
    shoal_tl_ctx_t ctx;
    shoal_ep_t ep;
    shoal_tl_req_t req;
    char err[256] = "";
    int sv[2], r, done = 0;

    memset(&ctx, 0, sizeof(ctx));
    memset(&ep, 0, sizeof(ep));
    memset(&req, 0, sizeof(req));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        tap_bail("socketpair failed");
        return;
    }
    ctx.rank = 0;
    ctx.epfd = -1;
    ctx.comm_id = 0x51ab0007u;
    ctx.eps = &ep;
    ctx.neps = 1;
    ctx.npending = 1;
    ep.ctx = &ctx;
    ep.peer = 1;
    ep.oob_fd = sv[0];
    ep.lz_fd = -1;
    ep.dial.fd = -1;
    ep.status = SHOAL_OK;
    ep.culprit = -1;
    shoal_tl_req_start(&req);
    req.errbuf = err;
    req.errlen = sizeof(err);
    ep.rq_head = ep.rq_tail = &req;
    if (n > 0 && write(sv[1], bytes, n) != (ssize_t)n) {
        tap_bail("write failed");
    }
    if (close_after) {
        close(sv[1]);
        sv[1] = -1;
    }
    r = shoal_ib_ep_oob_read(&ep);
    if (r == 1 && ep.oob_eof != 0) {
        done = shoal_ib_ep_oob_gone(&ep);
    }
    tap_ok(r == 1 && done == 1 && req.done && req.status == want && req.culprit == -1 &&
               ctx.npending == 0 && strstr(err, want_why) != NULL,
           "oob socket, %s: %s (%s)", what, shoal_status_name(req.status), err);
    close(sv[0]);
    if (sv[1] >= 0) {
        close(sv[1]);
    }
}

/* Part of a notice with the socket still open: the rest may follow, nothing fails. */
static void oob_part(void)
{
    shoal_tl_ctx_t ctx;
    shoal_ep_t ep;
    uint8_t b[5] = {0};
    int sv[2], r;

    memset(&ctx, 0, sizeof(ctx));
    memset(&ep, 0, sizeof(ep));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 ||
        write(sv[1], b, sizeof(b)) != (ssize_t)sizeof(b)) {
        tap_bail("socketpair/write failed");
        return;
    }
    ctx.epfd = -1;
    ctx.comm_id = 0x51ab0007u;
    ep.ctx = &ctx;
    ep.peer = 1;
    ep.oob_fd = sv[0];
    ep.status = SHOAL_OK;
    r = shoal_ib_ep_oob_read(&ep);
    tap_ok(r == 0 && ep.oob_eof == 0 && ep.oob_abort == 0,
           "oob socket, 5 bytes of a notice, still open: not an end yet (%d, eof %d)", r,
           ep.oob_eof);
    close(sv[0]);
    close(sv[1]);
}

static void test_oob_gone(void)
{
    shoal_wire_hdr_t h = {.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                          .type = SHOAL_WIRE_ABORT, .comm_id = 0x51ab0008u, .chunk = 2};
    uint8_t b[SHOAL_WIRE_HDR_BYTES];

    oob_case(NULL, 0, 1, SHOAL_ERR_PEER_FAILED, "the process is gone", "EOF");
    shoal_wire_encode(&h, b); /* another communicator's notice */
    oob_case(b, sizeof(b), 0, SHOAL_ERR_PROTOCOL, "not an abort notice", "another "
             "communicator's notice");
    /* no rank is INT32_MAX (ranks are below an int's count): its culprit + 1 overflowed */
    h.comm_id = 0x51ab0007u;
    h.chunk = 0x7fffffffu;
    shoal_wire_encode(&h, b);
    oob_case(b, sizeof(b), 0, SHOAL_ERR_PROTOCOL, "not an abort notice", "a notice naming "
             "rank 2^31 - 1");
    memset(b, 0x5a, sizeof(b));
    oob_case(b, sizeof(b), 0, SHOAL_ERR_PROTOCOL, "not an abort notice", "32 bytes of garbage");
    /* Part of a notice, then EOF: a peek returns those bytes at every call and never the EOF
     * behind them, so the process's end went unseen (the socket stayed readable in the wait
     * set: waiters spun, and a posted receive waited for the communicator's timeout). */
    oob_case(b, 5, 1, SHOAL_ERR_PEER_FAILED, "the process is gone", "5 bytes, then EOF");
    oob_part();
}

/* ---- a failing rank's notice in the middle of a lazy exchange ----------------------------
 * With SHOAL_CONNECT=lazy, a rank whose communicator fails (because of rank 2) while it is
 * exchanging queue pair numbers with a peer tells that peer, wherever the exchange stands
 * (shoal_ib_lz_notice): the peer's requests then fail with PEER_FAILED naming rank 2. Only an
 * exchange not yet started was told; otherwise the failing rank closed the socket and the peer
 * reported "the process is gone" (a live one) and blamed it. Endpoints in the exchange's
 * phases, on the two ends of a socketpair, without verbs: the peer's phases past its own
 * RTR/RTS (2: its sync byte out, 3: the failing rank's sync byte in). */
static struct ibv_qp lz_qp; /* the trace of a connection names its number */

static void lz_setup(shoal_tl_ctx_t *ctx, shoal_ep_t *ep, int fd, int phase, size_t off)
{
    memset(ctx, 0, sizeof(*ctx));
    memset(ep, 0, sizeof(*ep));
    ctx->epfd = ctx->listen_fd = -1;
    ctx->comm_id = 0x51ab0009u;
    ctx->lazy = 1;
    ctx->eps = ep;
    ctx->neps = 1;
    ctx->lz_open = ctx->lz_busy = 1;
    ep->ctx = ctx;
    ep->oob_fd = ep->dial.fd = -1;
    ep->lz_fd = fd;
    ep->qp = &lz_qp;
    ep->status = SHOAL_OK;
    ep->culprit = -1;
    ep->lz_state = SHOAL_IB_LZ_XCHG;
    ep->lz_phase = phase;
    ep->lz_off = off;
    ep->lz_deadline = UINT64_MAX;
    memset(ep->lz_out, 0x33, sizeof(ep->lz_out));
    ep->lz_out[0] = phase < 2 ? SHOAL_IB_LZ_GO : 0x5a; /* the pair, or the sync byte */
}

static void lz_pair(int a_phase, int b_phase, const char *what)
{
    shoal_tl_ctx_t ca, cb;
    shoal_ep_t a, b;
    uint8_t sync = 0x5a;
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        tap_bail("socketpair failed");
        return;
    }
    lz_setup(&ca, &a, sv[0], a_phase, 0);
    ca.rank = 0;
    a.peer = 1;
    lz_setup(&cb, &b, sv[1], b_phase, 0);
    cb.rank = 1;
    b.peer = 0;
    /* what is on the wire already: the failing rank's sync byte, the peer's (unread) */
    if ((a_phase == 3 && write(sv[0], &sync, 1) != 1) ||
        (b_phase == 3 && write(sv[1], &sync, 1) != 1)) {
        tap_bail("write failed");
    }
    shoal_ib_lazy_fail(&ca, 2); /* closes sv[0] */
    for (int i = 0; i < 10 && b.status == SHOAL_OK; i++) {
        (void)shoal_ib_lazy_progress(&cb);
        if (b.status == SHOAL_OK && b.lz_state == SHOAL_IB_LZ_READY) {
            /* connected: the socket is the peer's oob socket now (shoal_ib_peer_check) */
            if (shoal_ib_ep_oob_read(&b) != 0 && b.oob_abort != 0) {
                (void)shoal_ib_ep_abort_notice(&b, b.oob_abort - 1);
            } else if (b.oob_eof != 0) {
                (void)shoal_ib_ep_oob_gone(&b);
            }
        }
    }
    tap_ok(b.status == SHOAL_ERR_PEER_FAILED && b.culprit == 2,
           "lazy exchange, failing rank in phase %d, peer in phase %d (%s): the peer blames "
           "rank 2 (%s, culprit %d: %s)", a_phase, b_phase, what, shoal_status_name(b.status),
           b.culprit, b.why);
    if (b.lz_fd >= 0) {
        close(b.lz_fd);
    }
    if (b.oob_fd >= 0) {
        close(b.oob_fd);
    }
}

/* A short send of the pair (never seen on an empty socket, but handled): the rest of the pair,
 * then the ABORT message where the sync byte is due. */
static void lz_rest(void)
{
    shoal_tl_ctx_t c;
    shoal_ep_t ep;
    uint8_t got[4 * SHOAL_IB_LZ_MSG_BYTES];
    shoal_wire_hdr_t h;
    ssize_t n;
    int sv[2], ok;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        tap_bail("socketpair failed");
        return;
    }
    lz_setup(&c, &ep, sv[0], 0, 10);
    ep.peer = 1;
    shoal_ib_lazy_fail(&c, 2);
    n = read(sv[1], got, sizeof(got));
    shoal_wire_decode(got + SHOAL_IB_LZ_MSG_BYTES - 10 + 1, &h);
    ok = n == 2 * SHOAL_IB_LZ_MSG_BYTES - 10 &&
         memcmp(got, ep.lz_out + 10, SHOAL_IB_LZ_MSG_BYTES - 10) == 0 &&
         got[SHOAL_IB_LZ_MSG_BYTES - 10] == SHOAL_IB_LZ_ABORT && shoal_wire_culprit(&h) == 2;
    tap_ok(ok, "lazy exchange, failing after 10 bytes of its pair: the rest of the pair, then "
           "the ABORT naming rank 2 (%zd bytes)", n);
    close(sv[1]);
}

/* ---- the pair message's proof ------------------------------------------------------------
 * The out-of-band handshake proves the job's key; the queue pair number, PSN, ring address and
 * rkey that follow on the same socket were taken as they came. A co-tenant on the path (or on
 * the peer's host, where it shares the RoCE GID) that relays the handshake could replace them
 * with its own queue pair and receive what this rank sends. The pair message now carries an
 * HMAC under the communicator's key over both ranks and the pair: a replaced pair, or one made
 * for another pair of ranks, is SHOAL_ERR_AUTH before any queue pair is touched. The lazy
 * exchange's receiving phase (1), on a socketpair: a pair that passes its proof goes on to
 * RTR/RTS, which fails here (no device, MTU 0) with SHOAL_ERR_TRANSPORT. */
static void lz_forged(const uint8_t *msg, shoal_status_t want, const char *what)
{
    shoal_tl_ctx_t c;
    shoal_ep_t ep;
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 ||
        write(sv[0], msg, SHOAL_IB_LZ_MSG_BYTES) != SHOAL_IB_LZ_MSG_BYTES) {
        tap_bail("socketpair/write failed");
        return;
    }
    lz_setup(&c, &ep, sv[1], 1, 0);
    c.rank = 1;
    ep.peer = 0;
    memset(c.secret, 0x6b, sizeof(c.secret));
    (void)shoal_ib_lazy_progress(&c);
    tap_ok(ep.status == want, "lazy exchange, %s: %s (%s)", what, shoal_status_name(ep.status),
           ep.why);
    close(sv[0]);
    if (ep.lz_fd >= 0) {
        close(ep.lz_fd);
    }
}

static void test_pair_proof(void)
{
    shoal_ib_pair_t p = {.qpn = 0x666, .psn = 1, .ring_addr = 0x7f0000001000ull, .rkey = 0x99,
                         .nslots = 64, .slot_size = 65600};
    uint8_t msg[SHOAL_IB_LZ_MSG_BYTES] = {SHOAL_IB_LZ_GO};

    shoal_tl_ctx_t r0;

    /* a stranger's pair: no proof of the key (the MAC's bytes are whatever it sends) */
    shoal_ib_pair_encode(&p, msg + 1);
    lz_forged(msg, SHOAL_ERR_AUTH, "a pair without a proof (a co-tenant's queue pair)");
    /* rank 0's own message, with the key lz_forged gives rank 1: proven, on to RTR/RTS */
    memset(&r0, 0, sizeof(r0));
    r0.comm_id = 0x51ab0009u;
    memset(r0.secret, 0x6b, sizeof(r0.secret));
    if (shoal_ib_pair_seal(&r0, 1, &p, msg + 1) != SHOAL_OK) {
        tap_bail("shoal_ib_pair_seal failed");
    }
    lz_forged(msg, SHOAL_ERR_TRANSPORT, "rank 0's proven pair (RTR/RTS fails: no device)");
    msg[1] ^= 0x01; /* its queue pair number replaced */
    lz_forged(msg, SHOAL_ERR_AUTH, "rank 0's pair with another queue pair number spliced in");
    msg[1] ^= 0x01;
    (void)shoal_ib_pair_seal(&r0, 2, &p, msg + 1); /* made for rank 2 */
    lz_forged(msg, SHOAL_ERR_AUTH, "rank 0's pair for rank 2, replayed to rank 1");
    r0.secret[0] ^= 1; /* another job's key */
    (void)shoal_ib_pair_seal(&r0, 1, &p, msg + 1);
    lz_forged(msg, SHOAL_ERR_AUTH, "a pair proven with another key");
}

static void test_lazy_notice(void)
{
    lz_pair(0, 1, "nothing of its pair sent");
    lz_pair(1, 2, "its pair sent, the peer sends its sync byte");
    lz_pair(1, 3, "its pair sent, the peer waits for the sync byte");
    lz_pair(2, 3, "about to send its sync byte");
    lz_pair(3, 3, "its sync byte sent");
    lz_rest();
}

/* ---- sleeping while a peer's out-of-band socket has ended ----------------------------------
 * A peer whose process ended (a job's end: it destroyed its communicator) leaves its oob socket
 * at EOF, readable for ever in the context's wait set. wait_fd takes such sockets out of the
 * set, but did so only while this context had requests pending: a rank waiting on its other
 * transports (shm requests of the same communicator) polled a wait fd that was always
 * readable and never slept (each 1 ms sleep returned at once). A context with a completion
 * queue stand-in (wait_fd only arms it when requests are pending) and an empty completion
 * channel. */
static void test_wait_eof(void)
{
    shoal_tl_ctx_t ctx;
    shoal_ep_t ep;
    struct ibv_comp_channel chan;
    struct pollfd p;
    int sv[2], fd, r;

    if (shoal_tl_lib_load(&shoal_ib_lib) != SHOAL_OK) {
        tap_skip(2, "libibverbs cannot be loaded");
        return;
    }
    memset(&ctx, 0, sizeof(ctx));
    memset(&ep, 0, sizeof(ep));
    memset(&chan, 0, sizeof(chan));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        tap_bail("socketpair failed");
        return;
    }
    chan.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx.evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx.epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx.listen_fd = -1;
    ctx.chan = &chan;
    ctx.cq = (struct ibv_cq *)&chan; /* never dereferenced without pending requests */
    ctx.eps = &ep;
    ctx.neps = 1;
    ep.ctx = &ctx;
    ep.peer = 1;
    ep.oob_fd = sv[0];
    ep.lz_fd = ep.dial.fd = -1;
    ep.status = SHOAL_OK;
    ep.culprit = -1;
    {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = sv[0]};
        if (chan.fd < 0 || ctx.evfd < 0 || ctx.epfd < 0 ||
            epoll_ctl(ctx.epfd, EPOLL_CTL_ADD, sv[0], &ev) != 0) {
            tap_bail("eventfd/epoll failed");
            return;
        }
    }
    close(sv[1]); /* the peer's process ended */
    fd = shoal_tl_ib_ops.wait_fd(&ctx);
    p = (struct pollfd){.fd = fd, .events = POLLIN};
    r = poll(&p, 1, 0);
    tap_ok(fd == ctx.epfd && r == 0, "wait_fd with nothing pending, a peer's oob socket at EOF: "
           "the wait fd is not readable (poll %d): a waiter sleeps", r);
    tap_ok(ep.oob_eof == SHOAL_IB_OOB_EOF && ep.status == SHOAL_OK,
           "... the EOF is kept for the peer's next request (eof %d, %s)", ep.oob_eof,
           shoal_status_name(ep.status));
    close(sv[0]);
    close(chan.fd);
    close(ctx.evfd);
    close(ctx.epfd);
}

/* ---- a completion queue the device can no longer poll ---------------------------------------
 * ibv_poll_cq returning an error (a provider that meets a completion it cannot parse, a device
 * gone fatal) was only warned about: the requests pending on the context never completed and
 * the caller waited for the communicator's timeout, told "timed out". Now every endpoint fails
 * at once with SHOAL_ERR_TRANSPORT naming this rank (the fault is this side's device). A
 * completion queue stand-in whose poll fails, driven through the transport's progress. */
static int cq_broken(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    (void)cq;
    (void)n;
    (void)wc;
    return -1;
}

static void test_cq_error(void)
{
    shoal_tl_ctx_t ctx;
    shoal_ep_t ep;
    struct ibv_comp_channel chan;
    struct ibv_context dev;
    struct ibv_cq cq;
    shoal_tl_req_t req;
    char err[256] = "";
    int n;

    if (shoal_tl_lib_load(&shoal_ib_lib) != SHOAL_OK) {
        tap_skip(1, "libibverbs cannot be loaded");
        return;
    }
    memset(&ctx, 0, sizeof(ctx));
    memset(&ep, 0, sizeof(ep));
    memset(&chan, 0, sizeof(chan));
    memset(&dev, 0, sizeof(dev));
    memset(&cq, 0, sizeof(cq));
    memset(&req, 0, sizeof(req));
    dev.ops.poll_cq = cq_broken;
    cq.context = &dev;
    chan.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx.evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx.epfd = ctx.listen_fd = -1;
    ctx.chan = &chan;
    ctx.cq = &cq;
    ctx.rank = 0;
    snprintf(ctx.devname, sizeof(ctx.devname), "mlx5_7");
    ctx.eps = &ep;
    ctx.neps = 1;
    ctx.npending = 1;
    ep.ctx = &ctx;
    ep.peer = 1;
    ep.oob_fd = ep.lz_fd = ep.dial.fd = -1;
    ep.status = SHOAL_OK;
    ep.culprit = -1;
    shoal_tl_req_start(&req);
    req.errbuf = err;
    req.errlen = sizeof(err);
    ep.rq_head = ep.rq_tail = &req;
    n = shoal_tl_ib_ops.progress(&ctx);
    tap_ok(n == 1 && req.done && req.status == SHOAL_ERR_TRANSPORT && req.culprit == 0 &&
               ctx.npending == 0 && strstr(err, "mlx5_7") != NULL,
           "ibv_poll_cq fails: the pending receive fails at once (%d completed, %s, culprit %d: "
           "%s)", n, req.done ? shoal_status_name(req.status) : "still pending", req.culprit,
           err);
    close(chan.fd);
    close(ctx.evfd);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--devices") == 0) {
        int n = 0;
        /* libshoal loads libibverbs at the ib transport's first use */
        struct ibv_device **l = shoal_tl_lib_load(&shoal_ib_lib) == SHOAL_OK ?
                                ibv_get_device_list(&n) : NULL;
        if (l != NULL) {
            ibv_free_device_list(l);
        }
        printf("%d\n", n);
        return 0;
    }
    shoal_config_global_init();
    snprintf(root, sizeof(root), "/tmp/shoal_ib_sysfs.XXXXXX");
    if (mkdtemp(root) == NULL) {
        tap_bail("mkdtemp failed");
        return 1;
    }
    test_hca();
    test_gid();
    test_soft_device();
    test_rdmacm_doc();
    test_mtu();
    test_rate();
    test_credits();
    test_model();
    test_chunks();
    test_imm();
    test_cm_resolve_ms();
    test_cm_rejected();
    test_qp();
    test_regcache();
    test_regcache_same_start();
    test_regcache_oversize();
    test_layout();
    test_scoping();
    test_chunk_build();
    test_stale();
    test_codecs();
    test_oob();
    test_cm_close();
    test_connect_bad_addr();
    test_wc_blame();
    test_oob_gone();
    test_lazy_notice();
    test_pair_proof();
    test_wait_eof();
    test_cq_error();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0) {
        tap_diag("could not remove %s", root);
    }
    return tap_done();
}
