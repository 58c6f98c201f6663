/* Unit tests of the RoCE host QoS check (transports/ib/ib_hostqos.c), no RDMA device needed:
 * fixture sysfs trees in mlnx_qos's formats (trust dscp with the class on a PFC priority and
 * on a lossy one, trust pcp, a device-wide forced traffic class, missing files, garbage),
 * DCB netlink replies built byte by byte (PFC + DSCP app table, an error reply, truncated
 * ones), the kernel's real answer for a device without DCB (loopback), and the warning itself
 * (once per traffic class, naming device, class, DSCP, priority and the fix).
 *     test_ib_hostqos           TAP */
#include "transports/ib/ib.h"
#include "tests/tap.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/dcbnl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

/* mlnx_qos --dscp2prio output: DSCP 8p..8p+7 on priority p, except AF41 (34) and EF (46) on
 * priority 3, the usual lossless RoCE priority. */
static void write_mlnx_map(const char *ndev)
{
    char rel[128], text[2048];
    size_t n = (size_t)snprintf(text, sizeof(text), "dscp2prio mapping:\n");
    for (int p = 0; p < 8; p++) {
        n += (size_t)snprintf(text + n, sizeof(text) - n, "\tprio:%d dscp:", p);
        for (int d = 63; d >= 0; d--) {
            int dp = d == 34 || d == 46 ? 3 : d >> 3;
            if (dp == p) {
                n += (size_t)snprintf(text + n, sizeof(text) - n, "%02d,", d);
            }
        }
        n += (size_t)snprintf(text + n, sizeof(text) - n, "\n");
    }
    snprintf(rel, sizeof(rel), "class/net/%s/qos/dscp2prio", ndev);
    put(rel, text);
}

#define PFC3 "PFC configuration:\n\tpriority    0   1   2   3   4   5   6   7\n" \
             "\tenabled     0   0   0   1   0   0   0   0\n"

static void test_parsers(void)
{
    int8_t map[64];
    uint8_t en = 0;
    memset(map, -1, sizeof(map));
    tap_is_int(shoal_ib_hostqos_parse_trust("Priority trust state: dscp\n"), SHOAL_IB_TRUST_DSCP,
               "trust: mlnx_qos sentence, dscp");
    tap_is_int(shoal_ib_hostqos_parse_trust("pcp\n"), SHOAL_IB_TRUST_PCP, "trust: bare pcp");
    tap_is_int(shoal_ib_hostqos_parse_trust("pcp [dscp]\n"), SHOAL_IB_TRUST_DSCP,
               "trust: the bracketed choice wins");
    tap_is_int(shoal_ib_hostqos_parse_trust("pcp dscp"), SHOAL_IB_TRUST_UNKNOWN,
               "trust: both without a mark is no answer");
    tap_is_int(shoal_ib_hostqos_parse_trust("\x01\xff garbage"), SHOAL_IB_TRUST_UNKNOWN,
               "trust: garbage is unknown");
    tap_is_int(shoal_ib_hostqos_parse_dscp2prio("dscp-prio 26:3 46:5 0:0", map), 3,
               "dscp2prio: dcb's d:p pairs");
    tap_ok(map[26] == 3 && map[46] == 5 && map[0] == 0 && map[1] == -1,
           "dscp2prio: pairs land in the map, others untouched");
    tap_is_int(shoal_ib_hostqos_parse_dscp2prio("prio:2 dscp:17,16,", map), 2,
               "dscp2prio: an mlnx_qos line");
    tap_ok(map[16] == 2 && map[17] == 2 && map[26] == 3, "dscp2prio: line merged into the map");
    tap_is_int(shoal_ib_hostqos_parse_dscp2prio("prio:9 dscp:1,", map), -1,
               "dscp2prio: priority 9 refused");
    tap_is_int(shoal_ib_hostqos_parse_dscp2prio("26:3 64:1", map), -1,
               "dscp2prio: DSCP 64 refused");
    tap_is_int(shoal_ib_hostqos_parse_dscp2prio("26:3 27:x", map), -1,
               "dscp2prio: a bad pair refuses the whole text");
    tap_ok(map[26] == 3 && map[27] == -1, "dscp2prio: a refused text leaves the map as it was");
    tap_is_int(shoal_ib_hostqos_parse_pfc(PFC3, &en), 0, "pfc: mlnx_qos table");
    tap_is_int(en, 0x08, "pfc: only priority 3 enabled");
    tap_is_int(shoal_ib_hostqos_parse_pfc("prio-pfc 0:off 1:off 2:off 3:on 4:on 5:off 6:off "
                                          "7:off", &en), 0, "pfc: dcb's p:on|off pairs");
    tap_is_int(en, 0x18, "pfc: priorities 3 and 4");
    tap_is_int(shoal_ib_hostqos_parse_pfc("0,0,0,0,0,0,1,0\n", &en), 0, "pfc: a bare list");
    tap_is_int(en, 0x40, "pfc: priority 6");
    en = 0x77;
    tap_is_int(shoal_ib_hostqos_parse_pfc("0 0 1", &en), -1, "pfc: three values refused");
    tap_is_int(shoal_ib_hostqos_parse_pfc("\tenabled 0 0 0 1\n\tbuffer 0 0 0 0\n", &en), -1,
               "pfc: a short enabled line is not completed from the next line");
    tap_is_int(shoal_ib_hostqos_parse_pfc("enabled 0 0 0 2 0 0 0 0", &en), -1,
               "pfc: a 2 refused");
    tap_is_int(shoal_ib_hostqos_parse_pfc("3:maybe 0 0 0 0 0 0 0", &en), -1,
               "pfc: bad p:state refused");
    tap_is_int(en, 0x77, "pfc: refused text leaves the bits alone");
    tap_is_int(shoal_ib_hostqos_parse_tclass("Global tclass=106\n"), 106, "tclass: MLNX_OFED");
    tap_is_int(shoal_ib_hostqos_parse_tclass("96\n"), 96, "tclass: a number");
    tap_is_int(shoal_ib_hostqos_parse_tclass(""), -1, "tclass: empty is none");
    tap_is_int(shoal_ib_hostqos_parse_tclass("tclass=300"), -1, "tclass: 300 refused");
    tap_is_int(shoal_ib_hostqos_parse_tclass("12abc"), -1, "tclass: garbage refused");
}

static void test_sysfs(void)
{
    shoal_ib_hostqos_t hq;
    shoal_ib_qos_verdict_t v;

    /* trust dscp, AF41 on priority 3 with PFC: the guaranteed class (TC 136 = AF41 << 2) is
     * lossless, burstable (AF21 = 18 -> priority 2) is lossy */
    put("class/net/ens1/qos/trust", "Priority trust state: dscp\n");
    write_mlnx_map("ens1");
    put("class/net/ens1/qos/pfc", PFC3);
    tap_is_int(shoal_ib_hostqos_read_sysfs(root, "ens1", "mlx5_0", 1, &hq), 1,
               "sysfs: mlnx tree read");
    tap_ok(hq.trust == SHOAL_IB_TRUST_DSCP && hq.pfc_known && hq.pfc_en == 0x08 &&
           hq.dscp2prio[34] == 3 && hq.dscp2prio[18] == 2 && hq.forced_tc == -1,
           "sysfs: trust, map and PFC as written");
    shoal_ib_hostqos_judge(&hq, 34 << 2, 0, &v);
    tap_ok(v.dscp == 34 && v.prio == 3 && v.lossless == 1, "judge: AF41 lands on PFC priority 3 "
           "(%s)", v.why);
    shoal_ib_hostqos_judge(&hq, (18 << 2) | 1, 0, &v);
    tap_ok(v.dscp == 18 && v.prio == 2 && v.lossless == 0 && strstr(v.why, "lossy") != NULL,
           "judge: AF21 (ECN bit set) lands on lossy priority 2 (%s)", v.why);

    /* trust pcp: the service level is the priority */
    put("class/net/ens2/qos/trust", "pcp\n");
    put("class/net/ens2/qos/pfc", PFC3);
    tap_is_int(shoal_ib_hostqos_read_sysfs(root, "ens2", "mlx5_1", 1, &hq), 1,
               "sysfs: pcp tree read");
    shoal_ib_hostqos_judge(&hq, 34 << 2, 3, &v);
    tap_ok(v.prio == 3 && v.lossless == 1, "judge pcp: SL 3 is lossless whatever the DSCP");
    shoal_ib_hostqos_judge(&hq, 34 << 2, 0, &v);
    tap_ok(v.prio == 0 && v.lossless == 0 && strstr(v.why, "service level 0") != NULL,
           "judge pcp: SL 0 is lossy (%s)", v.why);

    /* a device-wide forced traffic class overrides the queue pair's */
    put("class/infiniband/mlx5_1/tc/1/traffic_class", "Global tclass=0\n");
    put("class/net/ens2/qos/trust", "dscp\n");
    write_mlnx_map("ens2");
    tap_is_int(shoal_ib_hostqos_read_sysfs(root, "ens2", "mlx5_1", 1, &hq), 1, "sysfs: forced");
    tap_is_int(hq.forced_tc, 0, "sysfs: forced traffic class read");
    shoal_ib_hostqos_judge(&hq, 34 << 2, 0, &v);
    tap_ok(v.tc == 0 && v.prio == 0 && v.lossless == 0 && strstr(v.why, "forced") != NULL,
           "judge: the forced class, not the QP's, decides (%s)", v.why);

    /* nothing there */
    tap_is_int(shoal_ib_hostqos_read_sysfs(root, "nonet", "nodev", 1, &hq), 0,
               "sysfs: missing files: nothing found");
    shoal_ib_hostqos_judge(&hq, 34 << 2, 0, &v);
    tap_ok(v.prio == -1 && v.lossless == -1, "judge: nothing known, no verdict");

    /* garbage: unreadable parts stay unknown, the rest still counts */
    put("class/net/junk/qos/trust", "\x7f\x01 ???\n");
    put("class/net/junk/qos/dscp2prio", "prio:banana dscp:1,2\n");
    put("class/net/junk/qos/pfc", "enabled 1 1\n");
    tap_is_int(shoal_ib_hostqos_read_sysfs(root, "junk", "mlx5_9", 1, &hq), 0,
               "sysfs: garbage everywhere reads as nothing");
    tap_ok(hq.trust == SHOAL_IB_TRUST_UNKNOWN && !hq.pfc_known && hq.dscp2prio[1] == -1,
           "sysfs: nothing taken from garbage");
    put("class/net/junk/qos/pfc", "0 0 0 0 0 0 0 0\n");
    tap_is_int(shoal_ib_hostqos_read_sysfs(root, "junk", "mlx5_9", 1, &hq), 1,
               "sysfs: a good PFC file beside garbage is read");
    shoal_ib_hostqos_judge(&hq, 34 << 2, 0, &v);
    tap_ok(v.lossless == 0 && strstr(v.why, "every priority") != NULL,
           "judge: PFC off everywhere is lossy without knowing the trust mode (%s)", v.why);
}

/* ---- DCB netlink replies ------------------------------------------------------------------ */

static size_t attr(char *p, int type, const void *data, size_t len)
{
    struct nlattr a = {.nla_len = (unsigned short)(NLA_HDRLEN + len),
                       .nla_type = (unsigned short)type};
    memcpy(p, &a, sizeof(a));
    if (len > 0) {
        memcpy(p + NLA_HDRLEN, data, len);
    }
    return NLA_ALIGN(NLA_HDRLEN + len);
}

/* A DCB_CMD_IEEE_GET reply: PFC bits pfc_en, the DSCP app entries given (dscp, prio pairs,
 * npairs of them) and one PCP-selector entry that must be ignored. */
static size_t dcb_reply(char *buf, uint8_t pfc_en, const int *pairs, int npairs)
{
    struct nlmsghdr nh = {.nlmsg_type = RTM_GETDCB};
    struct dcbmsg dm = {.dcb_family = AF_UNSPEC, .cmd = DCB_CMD_IEEE_GET};
    struct ieee_pfc pfc = {.pfc_cap = 8, .pfc_en = pfc_en};
    char apps[1024], ieee[2048];
    size_t na = 0, ni = 0, n = NLMSG_HDRLEN;
    struct dcb_app pcp = {.selector = 1, .priority = 3, .protocol = 0x8915};
    for (int i = 0; i < npairs; i++) {
        struct dcb_app a = {.selector = IEEE_8021QAZ_APP_SEL_DSCP,
                            .priority = (uint8_t)pairs[2 * i + 1],
                            .protocol = (uint16_t)pairs[2 * i]};
        na += attr(apps + na, DCB_ATTR_IEEE_APP, &a, sizeof(a));
    }
    na += attr(apps + na, DCB_ATTR_IEEE_APP, &pcp, sizeof(pcp));
    ni += attr(ieee + ni, DCB_ATTR_IEEE_PFC, &pfc, sizeof(pfc));
    ni += attr(ieee + ni, DCB_ATTR_IEEE_APP_TABLE, apps, na);
    memcpy(buf + n, &dm, sizeof(dm));
    n += NLMSG_ALIGN(sizeof(dm));
    n += attr(buf + n, DCB_ATTR_IFNAME, "ens1", 5);
    n += attr(buf + n, DCB_ATTR_IEEE | NLA_F_NESTED, ieee, ni);
    nh.nlmsg_len = (uint32_t)n;
    memcpy(buf, &nh, sizeof(nh));
    return n;
}

static void test_dcbnl(void)
{
    static char buf[4096];
    shoal_ib_hostqos_t hq;
    shoal_ib_qos_verdict_t v;
    int err = 0;
    const int pairs[] = {34, 3, 18, 2};
    size_t n = dcb_reply(buf, 0x08, pairs, 2);
    char why[200];

    memset(&hq, 0, sizeof(hq));
    memset(hq.dscp2prio, -1, sizeof(hq.dscp2prio));
    hq.forced_tc = -1;
    tap_is_int(shoal_ib_hostqos_parse_dcbnl(buf, n, &hq, &err), 1, "dcbnl: reply decoded");
    tap_ok(hq.trust == SHOAL_IB_TRUST_DSCP && hq.pfc_known && hq.pfc_en == 0x08 &&
           hq.dscp2prio[34] == 3 && hq.dscp2prio[18] == 2 && hq.dscp2prio[0] == -1,
           "dcbnl: DSCP apps make trust dscp, PFC bits, the PCP app ignored");
    shoal_ib_hostqos_judge(&hq, 34 << 2, 0, &v);
    tap_ok(v.prio == 3 && v.lossless == 1, "dcbnl judge: AF41 lossless");
    shoal_ib_hostqos_judge(&hq, 18 << 2, 0, &v);
    tap_ok(v.prio == 2 && v.lossless == 0, "dcbnl judge: AF21 lossy");

    memset(hq.dscp2prio, -1, sizeof(hq.dscp2prio));
    n = dcb_reply(buf, 0x08, NULL, 0);
    tap_is_int(shoal_ib_hostqos_parse_dcbnl(buf, n, &hq, &err), 1, "dcbnl: no DSCP apps");
    tap_is_int(hq.trust, SHOAL_IB_TRUST_PCP, "dcbnl: no DSCP apps means trust pcp");

    /* truncated replies (the header claiming the full length, or just what is left) never
     * decode and never read past the end (the copy is exactly cut bytes: ASan checks) */
    int decoded = 0;
    for (size_t cut = 0; cut < n; cut++) {
        for (int honest = 0; honest < 2; honest++) {
            uint32_t len32 = honest ? (uint32_t)cut : (uint32_t)n;
            char *copy = malloc(cut > 0 ? cut : 1);
            memcpy(copy, buf, cut);
            if (cut >= sizeof(len32)) {
                memcpy(copy, &len32, sizeof(len32));
            }
            decoded += shoal_ib_hostqos_parse_dcbnl(copy, cut, &hq, &err) == 1;
            free(copy);
        }
    }
    tap_is_int(decoded, 0, "dcbnl: no truncated reply decodes");
    {
        struct nlmsghdr nh = {.nlmsg_type = NLMSG_ERROR,
                              .nlmsg_len = NLMSG_LENGTH(sizeof(struct nlmsgerr))};
        struct nlmsgerr e = {.error = -EOPNOTSUPP};
        memcpy(buf, &nh, sizeof(nh));
        memcpy(buf + NLMSG_HDRLEN, &e, sizeof(e));
        tap_is_int(shoal_ib_hostqos_parse_dcbnl(buf, nh.nlmsg_len, &hq, &err), 0,
                   "dcbnl: error reply");
        tap_is_int(err, EOPNOTSUPP, "dcbnl: its errno");
    }
    /* the real kernel: loopback has no DCB ops */
    tap_is_int(shoal_ib_hostqos_read_dcbnl("lo", &hq, why, sizeof(why)), 0,
               "dcbnl: lo has no DCB (%s)", why);
    tap_ok(strstr(why, "lo") != NULL, "dcbnl: the reason names the device");
    tap_is_int(shoal_ib_hostqos_read_dcbnl("", &hq, why, sizeof(why)), 0,
               "dcbnl: no net device, no request");
}

/* ---- the warning -------------------------------------------------------------------------- */

/* Runs the check with stderr captured; returns the verdict, text in out. */
static int check_captured(const char *ndev, const char *dev, const char *cls, unsigned tc,
                          unsigned sl, char *out, size_t len)
{
    char path[300];
    int fd, saved, lossless;
    ssize_t n;
    snprintf(path, sizeof(path), "%s/stderr", root);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    fflush(stderr);
    saved = dup(2);
    dup2(fd, 2);
    lossless = shoal_ib_hostqos_check(root, dev, 1, ndev, cls, tc, sl, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    n = pread(fd, out, len - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    return lossless;
}

static void test_warning(void)
{
    char out[4096];
    /* ens1 (trust dscp, PFC on 3) from test_sysfs */
    tap_is_int(check_captured("ens1", "mlx5_0", "guaranteed", 34 << 2, 0, out, sizeof(out)), 1,
               "check: guaranteed is lossless");
    tap_ok(strstr(out, "WARN") == NULL, "check: no warning for a lossless class");
    tap_is_int(check_captured("ens1", "mlx5_0", "burstable", 18 << 2, 0, out, sizeof(out)), 0,
               "check: burstable is lossy");
    tap_ok(strstr(out, "WARN") != NULL && strstr(out, "mlx5_0") != NULL &&
           strstr(out, "class burstable") != NULL && strstr(out, "DSCP 18") != NULL &&
           strstr(out, "priority 2") != NULL && strstr(out, "prio-pfc 2:on") != NULL,
           "check: the warning names device, class, DSCP, priority and the fix: %s", out);
    check_captured("ens1", "mlx5_0", "burstable", 18 << 2, 0, out, sizeof(out));
    tap_ok(strstr(out, "WARN") == NULL, "check: warned once per traffic class");
    check_captured("nonet", "nodev", "spot", 8 << 2, 0, out, sizeof(out));
    tap_ok(strstr(out, "WARN") == NULL, "check: nothing readable is not a warning");
    /* PFC off everywhere and the class's DSCP not in the map: lossy, on no known priority;
     * the advice must not name priority -1 */
    put("class/net/ens3/qos/trust", "dscp\n");
    put("class/net/ens3/qos/dscp2prio", "26:3\n");
    put("class/net/ens3/qos/pfc", "0 0 0 0 0 0 0 0\n");
    tap_is_int(check_captured("ens3", "mlx5_0", "besteffort", 10 << 2, 0, out, sizeof(out)), 0,
               "check: unmapped DSCP, PFC off: lossy");
    tap_ok(strstr(out, "WARN") != NULL && strstr(out, "DSCP 10") != NULL &&
           strstr(out, "-1") == NULL,
           "check: the advice names no priority -1: %s", out);
}

int main(void)
{
    shoal_config_global_init();
    snprintf(root, sizeof(root), "/tmp/shoal_hostqos.XXXXXX");
    if (mkdtemp(root) == NULL) {
        tap_bail("mkdtemp failed");
        return 1;
    }
    test_parsers();
    test_sysfs();
    test_dcbnl();
    test_warning();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0) {
        tap_diag("could not remove %s", root);
    }
    return tap_done();
}
