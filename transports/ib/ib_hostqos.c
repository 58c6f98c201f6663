/* IB transport: the host's RoCE QoS configuration (trust mode, DSCP-to-priority map, PFC) and
 * whether a communicator's traffic class lands in a lossless queue (ib.h explains the model).
 * Parsers take text and a sysfs root so tests feed fixture trees; the netlink decoder takes the
 * reply's bytes. Nothing here fails a job: an unreadable host is a debug line. */
#include "transports/ib/ib.h"

#include <ctype.h>
#include <errno.h>
#include <linux/dcbnl.h>
#include <net/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define SHOAL_IB_HQ_TEXT_MAX 4096 /* mlnx_qos's dscp2prio is ~1 KiB */

static void shoal_ib_hq_reset(shoal_ib_hostqos_t *hq)
{
    memset(hq, 0, sizeof(*hq));
    memset(hq->dscp2prio, -1, sizeof(hq->dscp2prio));
    hq->forced_tc = -1;
}

/* ---- text parsers ------------------------------------------------------------------------- */

int shoal_ib_hostqos_parse_trust(const char *text)
{
    /* "dscp" does not contain "pcp". A file listing both choices marks the current one
     * ("pcp [dscp]"); naming both without a mark is not an answer. */
    const char *d = strstr(text, "dscp"), *p = strstr(text, "pcp");
    if (strstr(text, "[dscp]") != NULL) {
        return SHOAL_IB_TRUST_DSCP;
    }
    if (strstr(text, "[pcp]") != NULL) {
        return SHOAL_IB_TRUST_PCP;
    }
    if ((d == NULL) == (p == NULL)) {
        return SHOAL_IB_TRUST_UNKNOWN;
    }
    return d != NULL ? SHOAL_IB_TRUST_DSCP : SHOAL_IB_TRUST_PCP;
}

/* A decimal 0..max at *s; advances *s. -1 if none or out of range. */
static int shoal_ib_hq_num(const char **s, int max)
{
    char *end;
    long v;
    if (!isdigit((unsigned char)**s)) {
        return -1;
    }
    v = strtol(*s, &end, 10);
    *s = end;
    return v <= max ? (int)v : -1;
}

/* One mlnx_qos line "prio:P dscp:a,b,c," into map; count of entries or -1. */
static int shoal_ib_hq_prio_line(const char *s, int8_t map[64])
{
    int prio, n = 0, d;
    s += strlen("prio:");
    if ((prio = shoal_ib_hq_num(&s, SHOAL_IB_NPRIO - 1)) < 0) {
        return -1;
    }
    s += strspn(s, " \t");
    if (strncmp(s, "dscp:", 5) != 0) {
        return -1;
    }
    s += 5;
    while (*s != '\0' && *s != '\n') {
        s += strspn(s, " \t,");
        if (*s == '\0' || *s == '\n') {
            break;
        }
        if ((d = shoal_ib_hq_num(&s, 63)) < 0) {
            return -1;
        }
        map[d] = (int8_t)prio;
        n++;
    }
    return n;
}

int shoal_ib_hostqos_parse_dscp2prio(const char *text, int8_t map[64])
{
    int8_t tmp[64];
    int n = 0;
    memcpy(tmp, map, sizeof(tmp));
    for (const char *s = text; *s != '\0';) {
        size_t w;
        s += strspn(s, " \t\r\n");
        w = strcspn(s, " \t\r\n");
        if (w == 0) {
            break;
        }
        if (strncmp(s, "prio:", 5) == 0) {
            int k = shoal_ib_hq_prio_line(s, tmp);
            if (k < 0) {
                return -1;
            }
            n += k;
            s += strcspn(s, "\n");
            continue;
        }
        if (isdigit((unsigned char)*s)) { /* "dscp:prio" */
            const char *p = s;
            int d = shoal_ib_hq_num(&p, 63), pr = -1;
            if (d >= 0 && *p == ':') {
                p++;
                pr = shoal_ib_hq_num(&p, SHOAL_IB_NPRIO - 1);
            }
            if (pr < 0 || p != s + w) {
                return -1;
            }
            tmp[d] = (int8_t)pr;
            n++;
        }
        /* other words ("dscp2prio", "mapping:", "dscp-prio") are labels */
        s += w;
    }
    memcpy(map, tmp, sizeof(tmp));
    return n;
}

int shoal_ib_hostqos_parse_pfc(const char *text, uint8_t *en_p)
{
    const char *line = strstr(text, "enabled");
    uint8_t en = 0;
    int n = 0;
    const char *s = line != NULL ? line + strlen("enabled") : text;
    while (*s != '\0' && n < SHOAL_IB_NPRIO && (line == NULL || *s != '\n')) {
        const char *p;
        int v;
        s += strspn(s, line != NULL ? " \t,:\r" : " \t,:\r\n"); /* the line ends the table */
        if (*s == '\0' || *s == '\n') {
            break;
        }
        if (strncmp(s, "prio-pfc", 8) == 0) {
            s += 8;
            continue;
        }
        p = s;
        v = shoal_ib_hq_num(&p, 7);
        if (v >= 0 && *p == ':') { /* "3:on" */
            p++;
            if (strncmp(p, "on", 2) == 0) {
                en |= (uint8_t)(1u << v);
                p += 2;
            } else if (strncmp(p, "off", 3) == 0) {
                p += 3;
            } else {
                return -1;
            }
            n++;
        } else if (v == 0 || v == 1) { /* positional */
            en |= (uint8_t)(v << n);
            n++;
        } else {
            return -1;
        }
        s = p;
    }
    if (n != SHOAL_IB_NPRIO) {
        return -1;
    }
    *en_p = en;
    return 0;
}

int shoal_ib_hostqos_parse_tclass(const char *text)
{
    const char *s = strstr(text, "tclass=");
    int v;
    s = s != NULL ? s + strlen("tclass=") : text + strspn(text, " \t");
    v = shoal_ib_hq_num(&s, 255);
    return v >= 0 && (*s == '\0' || isspace((unsigned char)*s)) ? v : -1;
}

/* ---- sysfs -------------------------------------------------------------------------------- */

/* The file's text (at most SHOAL_IB_HQ_TEXT_MAX - 1 bytes, NUL-terminated); 0 or -1. */
static int shoal_ib_hq_slurp(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    size_t n;
    if (f == NULL) {
        return -1;
    }
    n = fread(buf, 1, len - 1, f);
    if (ferror(f)) {
        fclose(f);
        return -1;
    }
    fclose(f);
    buf[n] = '\0';
    return memchr(buf, '\0', n) == NULL ? 0 : -1; /* binary garbage */
}

static void shoal_ib_hq_note(shoal_ib_hostqos_t *hq, const char *what)
{
    size_t l = strlen(hq->source), n;
    if (l > 0 && l + 2 < sizeof(hq->source)) {
        memcpy(hq->source + l, ", ", 2);
        l += 2;
    }
    n = strnlen(what, sizeof(hq->source) - 1 - l);
    memcpy(hq->source + l, what, n);
    hq->source[l + n] = '\0';
}

int shoal_ib_hostqos_read_sysfs(const char *root, const char *ndev, const char *dev, int port,
                                shoal_ib_hostqos_t *hq)
{
    const char *r = root != NULL && root[0] != '\0' ? root : "/sys";
    char path[512], *text = malloc(SHOAL_IB_HQ_TEXT_MAX);
    int found = 0;
    shoal_ib_hq_reset(hq);
    if (text == NULL) {
        return 0;
    }
    if (ndev != NULL && ndev[0] != '\0') {
        snprintf(path, sizeof(path), "%s/class/net/%s/qos/trust", r, ndev);
        if (shoal_ib_hq_slurp(path, text, SHOAL_IB_HQ_TEXT_MAX) == 0 &&
            (hq->trust = shoal_ib_hostqos_parse_trust(text)) != SHOAL_IB_TRUST_UNKNOWN) {
            found = 1;
        }
        snprintf(path, sizeof(path), "%s/class/net/%s/qos/dscp2prio", r, ndev);
        if (shoal_ib_hq_slurp(path, text, SHOAL_IB_HQ_TEXT_MAX) == 0 &&
            shoal_ib_hostqos_parse_dscp2prio(text, hq->dscp2prio) > 0) {
            found = 1;
        }
        snprintf(path, sizeof(path), "%s/class/net/%s/qos/pfc", r, ndev);
        if (shoal_ib_hq_slurp(path, text, SHOAL_IB_HQ_TEXT_MAX) == 0 &&
            shoal_ib_hostqos_parse_pfc(text, &hq->pfc_en) == 0) {
            hq->pfc_known = 1;
            found = 1;
        }
        if (found) {
            snprintf(path, sizeof(path), "%s/class/net/%s/qos", r, ndev);
            shoal_ib_hq_note(hq, path);
        }
    }
    if (dev != NULL && dev[0] != '\0') {
        snprintf(path, sizeof(path), "%s/class/infiniband/%s/tc/%d/traffic_class", r, dev, port);
        if (shoal_ib_hq_slurp(path, text, SHOAL_IB_HQ_TEXT_MAX) == 0 &&
            (hq->forced_tc = shoal_ib_hostqos_parse_tclass(text)) >= 0) {
            shoal_ib_hq_note(hq, path);
        }
    }
    free(text);
    return found;
}

/* ---- DCB netlink -------------------------------------------------------------------------- */

static void shoal_ib_hq_ieee(const struct nlattr *nest, shoal_ib_hostqos_t *hq)
{
    int rem = (int)nest->nla_len - NLA_HDRLEN;
    int dscp_apps = 0;
    for (const struct nlattr *a = (const void *)((const char *)nest + NLA_HDRLEN);
         rem >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= rem;
         rem -= NLA_ALIGN(a->nla_len),
         a = (const void *)((const char *)a + NLA_ALIGN(a->nla_len))) {
        int type = a->nla_type & NLA_TYPE_MASK;
        const char *pl = (const char *)a + NLA_HDRLEN;
        int plen = a->nla_len - NLA_HDRLEN;
        if (type == DCB_ATTR_IEEE_PFC && plen >= (int)sizeof(struct ieee_pfc)) {
            struct ieee_pfc pfc;
            memcpy(&pfc, pl, sizeof(pfc));
            hq->pfc_en = pfc.pfc_en;
            hq->pfc_known = 1;
        } else if (type == DCB_ATTR_IEEE_APP_TABLE) {
            int r2 = plen;
            for (const struct nlattr *b = (const void *)pl;
                 r2 >= NLA_HDRLEN && b->nla_len >= NLA_HDRLEN && b->nla_len <= r2;
                 r2 -= NLA_ALIGN(b->nla_len),
                 b = (const void *)((const char *)b + NLA_ALIGN(b->nla_len))) {
                struct dcb_app app;
                if ((b->nla_type & NLA_TYPE_MASK) != DCB_ATTR_IEEE_APP ||
                    b->nla_len - NLA_HDRLEN < (int)sizeof(app)) {
                    continue;
                }
                memcpy(&app, (const char *)b + NLA_HDRLEN, sizeof(app));
                if (app.selector == IEEE_8021QAZ_APP_SEL_DSCP && app.protocol < 64 &&
                    app.priority < SHOAL_IB_NPRIO) {
                    hq->dscp2prio[app.protocol] = (int8_t)app.priority;
                    dscp_apps++;
                }
            }
        }
    }
    /* mlx5 (and dsa) trust DSCP exactly when the app table holds DSCP entries. */
    hq->trust = dscp_apps > 0 ? SHOAL_IB_TRUST_DSCP : SHOAL_IB_TRUST_PCP;
}

int shoal_ib_hostqos_parse_dcbnl(const void *buf, size_t len, shoal_ib_hostqos_t *hq,
                                 int *errno_p)
{
    const struct nlmsghdr *nh = buf;
    const struct nlattr *a;
    int rem;
    if (len < NLMSG_HDRLEN || nh->nlmsg_len < NLMSG_HDRLEN || nh->nlmsg_len > len) {
        return -1;
    }
    if (nh->nlmsg_type == NLMSG_ERROR) {
        struct nlmsgerr e;
        if (nh->nlmsg_len < NLMSG_LENGTH(sizeof(e))) {
            return -1;
        }
        memcpy(&e, NLMSG_DATA(nh), sizeof(e));
        *errno_p = e.error < 0 ? -e.error : EPROTO;
        return 0;
    }
    if (nh->nlmsg_type != RTM_GETDCB ||
        nh->nlmsg_len < NLMSG_LENGTH(sizeof(struct dcbmsg))) {
        return -1;
    }
    rem = (int)nh->nlmsg_len - (int)NLMSG_LENGTH(sizeof(struct dcbmsg));
    a = (const void *)((const char *)NLMSG_DATA(nh) + NLMSG_ALIGN(sizeof(struct dcbmsg)));
    for (; rem >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= rem;
         rem -= NLA_ALIGN(a->nla_len),
         a = (const void *)((const char *)a + NLA_ALIGN(a->nla_len))) {
        if ((a->nla_type & NLA_TYPE_MASK) == DCB_ATTR_IEEE) {
            shoal_ib_hq_ieee(a, hq);
            return 1;
        }
    }
    return -1;
}

int shoal_ib_hostqos_read_dcbnl(const char *ndev, shoal_ib_hostqos_t *hq, char *why, size_t len)
{
    struct {
        struct nlmsghdr nh;
        struct dcbmsg dm;
        char attr[NLA_HDRLEN + NLA_ALIGN(IFNAMSIZ)];
    } req;
    struct nlattr *na = (struct nlattr *)req.attr;
    struct timeval tv = {.tv_sec = 1};
    char *buf;
    int fd, ret = 0, err = 0;
    ssize_t n;

    if (ndev == NULL || ndev[0] == '\0' || strlen(ndev) >= IFNAMSIZ) {
        snprintf(why, len, "no network device");
        return 0;
    }
    memset(&req, 0, sizeof(req));
    req.nh.nlmsg_len = sizeof(req);
    req.nh.nlmsg_type = RTM_GETDCB;
    req.nh.nlmsg_flags = NLM_F_REQUEST;
    req.nh.nlmsg_seq = 1;
    req.dm.dcb_family = AF_UNSPEC;
    req.dm.cmd = DCB_CMD_IEEE_GET;
    na->nla_type = DCB_ATTR_IFNAME;
    na->nla_len = (unsigned short)(NLA_HDRLEN + strlen(ndev) + 1);
    memcpy(req.attr + NLA_HDRLEN, ndev, strlen(ndev));
    fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) {
        snprintf(why, len, "netlink socket: %s", strerror(errno));
        return 0;
    }
    buf = malloc(16384);
    if (buf == NULL || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
        send(fd, &req, sizeof(req), 0) != (ssize_t)sizeof(req) ||
        (n = recv(fd, buf, 16384, 0)) <= 0) {
        snprintf(why, len, "DCB netlink request for %s: %s", ndev,
                 buf == NULL ? "out of memory" : strerror(errno));
    } else {
        shoal_ib_hq_reset(hq);
        ret = shoal_ib_hostqos_parse_dcbnl(buf, (size_t)n, hq, &err);
        if (ret == 1) {
            snprintf(hq->source, sizeof(hq->source), "DCB netlink (dcb app/pfc show dev %s)",
                     ndev);
        } else {
            snprintf(why, len, "DCB netlink for %s: %s", ndev,
                     ret == 0 ? strerror(err) : "malformed reply");
            ret = 0;
        }
    }
    free(buf);
    close(fd);
    return ret;
}

/* ---- the verdict -------------------------------------------------------------------------- */

void shoal_ib_hostqos_judge(const shoal_ib_hostqos_t *hq, unsigned tc, unsigned sl,
                            shoal_ib_qos_verdict_t *v)
{
    char how[200];
    v->tc = hq->forced_tc >= 0 ? hq->forced_tc : (int)(tc & 255);
    v->dscp = v->tc >> 2;
    v->prio = -1;
    v->lossless = -1;
    if (hq->trust == SHOAL_IB_TRUST_DSCP && hq->dscp2prio[v->dscp] >= 0) {
        v->prio = hq->dscp2prio[v->dscp];
        snprintf(how, sizeof(how), "trust dscp maps DSCP %d to priority %d", v->dscp, v->prio);
    } else if (hq->trust == SHOAL_IB_TRUST_DSCP) {
        snprintf(how, sizeof(how), "trust dscp, but DSCP %d is not in the map", v->dscp);
    } else if (hq->trust == SHOAL_IB_TRUST_PCP) {
        v->prio = (int)(sl & 7);
        snprintf(how, sizeof(how), "trust pcp: the priority is the VLAN PCP, i.e. service "
                 "level %u (untagged frames: priority 0)", sl);
    } else {
        snprintf(how, sizeof(how), "trust mode unknown");
    }
    if (hq->pfc_known && v->prio >= 0) {
        v->lossless = (hq->pfc_en >> v->prio) & 1;
    } else if (hq->pfc_known && (hq->pfc_en == 0 || hq->pfc_en == 0xff)) {
        v->lossless = hq->pfc_en != 0; /* the same on every priority */
    }
    snprintf(v->why, sizeof(v->why), "traffic class %d%s (DSCP %d): %s; PFC %s", v->tc,
             hq->forced_tc >= 0 && hq->forced_tc != (int)tc ? ", forced for the whole device"
                                                            : "",
             v->dscp, how, !hq->pfc_known ? "unknown"
                           : hq->pfc_en == 0 ? "off on every priority"
                           : v->lossless == 1 ? "on there (lossless)"
                           : v->lossless == 0 ? "off there (lossy)" : "on some priorities");
}

/* One warning per traffic class and process: every communicator of a class finds the same. */
static uint8_t shoal_ib_hq_warned[256 / 8];

int shoal_ib_hostqos_read(const char *root, const char *dev, int port, const char *ndev,
                          shoal_ib_hostqos_t *hq, char *why, size_t len)
{
    int found = shoal_ib_hostqos_read_sysfs(root, ndev, dev, port, hq);
    if (!found) {
        shoal_ib_hostqos_t nl;
        found = shoal_ib_hostqos_read_dcbnl(ndev, &nl, why, len);
        if (found) {
            nl.forced_tc = hq->forced_tc; /* the device's override still applies */
            if (hq->source[0] != '\0') {
                shoal_ib_hq_note(&nl, hq->source);
            }
            *hq = nl;
        }
    }
    return found || hq->forced_tc >= 0;
}

int shoal_ib_hostqos_check(const char *root, const char *dev, int port, const char *ndev,
                           const char *class_name, unsigned tc, unsigned sl,
                           shoal_ib_qos_verdict_t *v_p)
{
    shoal_ib_hostqos_t hq;
    shoal_ib_qos_verdict_t v;
    char why[200] = "";
    int found = shoal_ib_hostqos_read(root, dev, port, ndev, &hq, why, sizeof(why));
    int forced = hq.forced_tc;
    const char *cls = class_name != NULL ? class_name : "default";

    shoal_ib_hostqos_judge(&hq, tc, sl, &v);
    if (v_p != NULL) {
        *v_p = v;
    }
    if (!found) {
        shoal_trace(IB, "%s port %d (%s): no RoCE QoS configuration readable (no %s/class/net/"
                    "%s/qos, %s); cannot tell whether class %s's traffic class %u is lossless",
                    dev, port, ndev != NULL && ndev[0] != '\0' ? ndev : "no net device",
                    root != NULL && root[0] != '\0' ? root : "/sys", ndev != NULL ? ndev : "",
                    why, cls, tc);
        return v.lossless;
    }
    if (v.lossless != 0 && (forced < 0 || forced == (int)tc)) {
        shoal_info(IB, "%s port %d (%s): class %s, %s [%s]", dev, port, ndev, cls, v.why,
                   hq.source);
        return v.lossless;
    }
    if ((__atomic_fetch_or(&shoal_ib_hq_warned[v.tc / 8], (uint8_t)(1u << (v.tc % 8)),
                           __ATOMIC_RELAXED) & (1u << (v.tc % 8))) == 0) {
        if (v.lossless == 0 && v.prio < 0) {
            /* lossy on every priority (PFC off everywhere) while the class's priority is not
             * known (its DSCP not in the map, or no trust mode): no priority to name */
            shoal_warn(IB, "%s port %d (%s): class %s would run in a lossy queue: %s [%s]. "
                       "Map DSCP %d to a priority (mlnx_qos --dscp2prio / dcb app add dev %s "
                       "dscp-prio %d:P) and enable PFC on it (mlnx_qos -i %s --pfc / dcb pfc "
                       "set dev %s prio-pfc P:on), or pick the class's traffic class with "
                       "SHOAL_QOS_IB_TC", dev, port, ndev, cls, v.why, hq.source, v.dscp, ndev,
                       v.dscp, ndev, ndev);
        } else if (v.lossless == 0) {
            shoal_warn(IB, "%s port %d (%s): class %s would run in a lossy queue: %s [%s]. "
                       "Enable PFC on priority %d (mlnx_qos -i %s --pfc / dcb pfc set dev %s "
                       "prio-pfc %d:on), map DSCP %d to a PFC priority (mlnx_qos --dscp2prio "
                       "/ dcb app add dev %s dscp-prio %d:P), or pick the class's traffic "
                       "class with SHOAL_QOS_IB_TC", dev, port, ndev, cls, v.why, hq.source,
                       v.prio, ndev, ndev, v.prio, v.dscp, ndev, v.dscp);
        } else {
            shoal_warn(IB, "%s port %d: the device sends every RoCE packet with traffic class "
                       "%d (%s), not class %s's %u; clear it (echo 0 > .../tc/%d/"
                       "traffic_class) for per-class marks", dev, port, forced, hq.source, cls,
                       tc, port);
        }
    }
    return v.lossless;
}
