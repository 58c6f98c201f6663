/* Unit tests of the IB transport's pure logic (no RDMA device needed): HCA list parsing, GID
 * choice over fake sysfs trees, MTU negotiation, credits and ring (with wraparound and a
 * randomized sender/receiver model), chunk plan, immediate codec, QP transition table,
 * registration cache, address codecs and the shared out-of-band handshake.
 *     test_ib_logic             TAP
 *     test_ib_logic --devices   prints the number of RDMA devices (for run_tl_ib.sh) */
#include "transports/ib/ib_verbs.h"
#include "tests/tap.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    uint8_t raw[16];
    tap_is_int(shoal_ib_gid_parse("fe80::1", raw), -1, "gid: parser wants the sysfs form");
    tap_is_int(shoal_ib_gid_parse(V6, raw), 0, "gid: parser reads the sysfs form");
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
    shoal_ib_regcache_put(&rc, k1, mem + 10);
    shoal_ib_regcache_put(&rc, k2, mem + 100);
    shoal_ib_regcache_get(&rc, mem + 2 * pg, 2 * pg, &k3, &l3);
    tap_ok(f.regs == 2 && rc.n == 2, "regcache: overlapping but not covered -> new entry");
    shoal_ib_regcache_put(&rc, k3, mem + 2 * pg);
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
    shoal_ib_regcache_put(&rc, k4, mem + 8 * pg);
    tap_is_int(f.deregs, 3, "regcache: the last put deregisters an invalidated entry");
    shoal_ib_regcache_put(&rc, k1, mem + 12 * pg);
    tap_is_int(f.deregs, 4, "regcache: an entry over the cap is dropped at its release");
    shoal_ib_regcache_get(&rc, mem, pg, &k1, &l1);
    shoal_ib_regcache_put(&rc, k1, mem);
    shoal_ib_regcache_invalidate(&rc, mem, 16 * pg);
    tap_is_int(rc.n, 0, "regcache: invalidate of idle entries deregisters them");
    tap_is_int(f.live, 0, "regcache: nothing left registered");
    shoal_ib_regcache_get(&rc, mem, pg, &k1, &l1);
    shoal_ib_regcache_put(&rc, k1, mem);
    shoal_ib_regcache_fini(&rc);
    tap_ok(f.live == 0 && f.regs == f.deregs, "regcache: fini deregisters everything");
    free(mem);
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
    test_mtu();
    test_credits();
    test_model();
    test_chunks();
    test_imm();
    test_qp();
    test_regcache();
    test_codecs();
    test_oob();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0) {
        tap_diag("could not remove %s", root);
    }
    return tap_done();
}
