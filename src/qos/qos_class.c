/* QoS classes and marks: the effective class and weight of a communicator and what they map
 * to on each transport (DESIGN.md section 7). The class comes from comm->ident (a credential's,
 * which a configured class may only lower: tenant/cred.c; without one at most
 * SHOAL_QOS_CLASS_MAX: shoal_qos_uncredentialed below, called by tenant/ident.c). */
#include "qos/qos.h"
#include "core/core.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const shoal_qos_names[SHOAL_QOS_NCLASSES] = {"default", "guaranteed",
                                                                 "burstable", "spot"};

/* Built-in lists, the rows' defaults (cfg NULL, and the tests). */
#define SHOAL_QOS_DSCP_DFLT "guaranteed=AF41,burstable=AF21,spot=CS1"
#define SHOAL_QOS_PRIO_DFLT "guaranteed=6,burstable=4,spot=1"

const char *shoal_qos_class_name(int qos_class)
{
    return qos_class >= 0 && qos_class < SHOAL_QOS_NCLASSES ? shoal_qos_names[qos_class] : "?";
}

/* Rank of a class, higher = more service: guaranteed > burstable > default > spot. The
 * default class marks nothing (best effort), which sits between burstable and spot. */
static int shoal_qos_class_rank(int qos_class)
{
    static const int rank[SHOAL_QOS_NCLASSES] = {1, 3, 2, 0};
    return qos_class >= 0 && qos_class < SHOAL_QOS_NCLASSES ? rank[qos_class] : 0;
}

/* DSCP code points by name (RFC 2474, 2597, 3246, 8622). */
static int shoal_qos_dscp_name(const char *s, size_t n)
{
    char b[8];
    if (n == 0 || n >= sizeof(b)) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        b[i] = (char)toupper((unsigned char)s[i]);
    }
    b[n] = '\0';
    if (strcmp(b, "EF") == 0) {
        return 46;
    }
    if (strcmp(b, "LE") == 0) {
        return 1;
    }
    if (n == 3 && b[0] == 'C' && b[1] == 'S' && b[2] >= '0' && b[2] <= '7') {
        return (b[2] - '0') << 3;
    }
    if (n == 4 && b[0] == 'A' && b[1] == 'F' && b[2] >= '1' && b[2] <= '4' && b[3] >= '1' &&
        b[3] <= '3') {
        return ((b[2] - '0') << 3) | ((b[3] - '0') << 1);
    }
    return -1;
}

static int shoal_qos_value(const char *s, size_t n, int max, int dscp, int *v_p)
{
    char b[16];
    char *end;
    long v;

    if (n == 4 && strncasecmp(s, "none", 4) == 0) {
        *v_p = -1;
        return 0;
    }
    if (dscp && (v = shoal_qos_dscp_name(s, n)) >= 0) {
        *v_p = (int)v;
        return 0;
    }
    if (n == 0 || n >= sizeof(b) || !isdigit((unsigned char)s[0])) {
        return -1;
    }
    memcpy(b, s, n);
    b[n] = '\0';
    v = strtol(b, &end, 10);
    if (*end != '\0' || v < 0 || v > max) {
        return -1;
    }
    *v_p = (int)v;
    return 0;
}

shoal_status_t shoal_qos_list_parse(const char *spec, int max, int dscp,
                                    int vals[SHOAL_QOS_NCLASSES])
{
    int out[SHOAL_QOS_NCLASSES];
    const char *p = spec != NULL ? spec : "";

    memcpy(out, vals, sizeof(out));
    while (*p != '\0') {
        const char *comma = strchr(p, ','), *eq;
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        int c = -1;

        eq = memchr(p, '=', len);
        if (eq == NULL) {
            return SHOAL_ERR_INVALID_ARG;
        }
        for (int i = 0; i < SHOAL_QOS_NCLASSES; i++) {
            if ((size_t)(eq - p) == strlen(shoal_qos_names[i]) &&
                strncasecmp(p, shoal_qos_names[i], (size_t)(eq - p)) == 0) {
                c = i;
            }
        }
        if (c < 0 || shoal_qos_value(eq + 1, len - (size_t)(eq + 1 - p), max, dscp, &out[c]) != 0) {
            return SHOAL_ERR_INVALID_ARG;
        }
        p += len;
        if (*p == ',') {
            p++;
        }
    }
    memcpy(vals, out, sizeof(out));
    return SHOAL_OK;
}

static shoal_status_t shoal_qos_list(const char *what, const char *spec, int max, int dscp,
                                     int vals[SHOAL_QOS_NCLASSES])
{
    if (shoal_qos_list_parse(spec, max, dscp, vals) != SHOAL_OK) {
        shoal_error(QOS, "SHOAL_QOS_%s=\"%s\" is not a list of class=value (classes default, "
                    "guaranteed, burstable, spot; values 0..%d%s or none)", what, spec, max,
                    dscp ? ", CS0..CS7, AF11..AF43, EF, LE" : "");
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_qos_marks_resolve(int qos_class, const shoal_qos_class_config_t *cfg,
                                       int ib_tc_fixed, int ib_sl_fixed,
                                       shoal_qos_marks_t *marks_p)
{
    int dscp[SHOAL_QOS_NCLASSES] = {-1, -1, -1, -1}, prio[SHOAL_QOS_NCLASSES] = {-1, -1, -1, -1};
    int tc[SHOAL_QOS_NCLASSES] = {-2, -2, -2, -2}, sl[SHOAL_QOS_NCLASSES] = {-1, -1, -1, -1};
    shoal_qos_marks_t m = {.dscp = -1, .priority = -1, .ib_tc = -1, .ib_sl = -1};

    if (qos_class < 0 || qos_class >= SHOAL_QOS_NCLASSES) {
        shoal_error(QOS, "QoS class %d out of range", qos_class);
        return SHOAL_ERR_INVALID_ARG;
    }
    SHOAL_CHECK(shoal_qos_list("DSCP", SHOAL_QOS_DSCP_DFLT, 63, 1, dscp));
    SHOAL_CHECK(shoal_qos_list("PRIORITY", SHOAL_QOS_PRIO_DFLT, 15, 0, prio));
    if (cfg != NULL) {
        SHOAL_CHECK(shoal_qos_list("DSCP", cfg->dscp, 63, 1, dscp));
        SHOAL_CHECK(shoal_qos_list("PRIORITY", cfg->priority, 15, 0, prio));
        SHOAL_CHECK(shoal_qos_list("IB_TC", cfg->ib_tc, 255, 0, tc));
        SHOAL_CHECK(shoal_qos_list("IB_SL", cfg->ib_sl, 15, 0, sl));
    }
    if (qos_class != SHOAL_QOS_DEFAULT) {
        m.dscp = dscp[qos_class];
        m.priority = prio[qos_class];
        /* Unlisted: the DSCP in the upper six bits, ECN bits clear (NCCL_IB_TC convention). */
        m.ib_tc = tc[qos_class] != -2 ? tc[qos_class] : (m.dscp >= 0 ? m.dscp << 2 : -1);
        m.ib_sl = sl[qos_class];
    }
    if (ib_tc_fixed) {
        m.ib_tc = -1;
    }
    if (ib_sl_fixed) {
        m.ib_sl = -1;
    }
    *marks_p = m;
    return SHOAL_OK;
}

shoal_status_t shoal_qos_requested(const shoal_config_t *cfg, int *class_p, int *weight_p)
{
    shoal_config_global_init();
    if (cfg != NULL && (cfg->qos_class < SHOAL_QOS_DEFAULT || cfg->qos_class > SHOAL_QOS_SPOT)) {
        shoal_error(QOS, "shoal_config_t.qos_class %d is not a shoal_qos_class_t (%d..%d)",
                    cfg->qos_class, (int)SHOAL_QOS_DEFAULT, (int)SHOAL_QOS_SPOT);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (cfg != NULL && cfg->qos_weight < 0) {
        shoal_error(QOS, "shoal_config_t.qos_weight %d is negative (0: SHOAL_QOS_WEIGHT)",
                    cfg->qos_weight);
        return SHOAL_ERR_INVALID_ARG;
    }
    /* The variable as the field: a negative SHOAL_QOS_WEIGHT was taken as 0 (unset), so a job
     * that asked for less than its credential's weight got all of it. */
    if ((cfg == NULL || cfg->qos_weight == 0) && shoal_qos_class_config.weight < 0) {
        shoal_error(QOS, "SHOAL_QOS_WEIGHT=%d is negative (0: the credential's, else 1)",
                    shoal_qos_class_config.weight);
        return SHOAL_ERR_INVALID_ARG;
    }
    *class_p = cfg != NULL && cfg->qos_class != SHOAL_QOS_DEFAULT
                   ? cfg->qos_class : shoal_qos_class_config.qos_class;
    *weight_p = cfg != NULL && cfg->qos_weight > 0 ? cfg->qos_weight
                                                   : shoal_qos_class_config.weight;
    return SHOAL_OK;
}

void shoal_qos_uncredentialed(int req_class, int req_weight, const shoal_qos_class_config_t *cfg,
                              int *class_p, int *weight_p)
{
    int cmax = cfg != NULL ? cfg->class_max : SHOAL_QOS_BURSTABLE;
    int wmax = cfg != NULL ? SHOAL_MAX(cfg->weight_max, 1) : 1;
    int c = req_class, w = req_weight;

    if (c < SHOAL_QOS_DEFAULT || c > SHOAL_QOS_SPOT) {
        c = SHOAL_QOS_DEFAULT;
    }
    if (shoal_qos_class_rank(c) > shoal_qos_class_rank(cmax) && c == SHOAL_QOS_DEFAULT) {
        /* nothing asked for (SHOAL_QOS_CLASS_MAX=spot): the ceiling, no warning about a
         * class the job did not ask for */
        c = cmax;
    } else if (shoal_qos_class_rank(c) > shoal_qos_class_rank(cmax)) {
        shoal_warn_once(QOS, "QoS class %s asked for without a credential: using %s "
                        "(SHOAL_QOS_CLASS_MAX; a class above it takes a provider-signed "
                        "SHOAL_CREDENTIAL)", shoal_qos_class_name(c), shoal_qos_class_name(cmax));
        c = cmax;
    }
    if (w > wmax) {
        shoal_warn_once(QOS, "QoS weight %d asked for without a credential: using %d "
                        "(SHOAL_QOS_WEIGHT_MAX)", w, wmax);
        w = wmax;
    }
    *class_p = c;
    *weight_p = w;
}

shoal_status_t shoal_qos_comm_init(struct shoal_comm *comm)
{
    shoal_qos_comm_t *q = &comm->qos;

    q->qos_class = comm->ident.qos_class;
    q->weight = comm->ident.qos_weight > 0 ? comm->ident.qos_weight : 1;
    q->rate_max = shoal_qos_class_config.rate_max;
    SHOAL_CHECK(shoal_qos_marks_resolve(q->qos_class, &shoal_qos_class_config,
                                        shoal_cfg_getenv("IB_TC") != NULL,
                                        shoal_cfg_getenv("IB_SL") != NULL, &q->marks));
    shoal_info(QOS, "rank %d: class %s weight %d%s: DSCP %d, SO_PRIORITY %d, IB TC %d, IB SL "
               "%d (-1: unset), rate cap %" PRIu64 " B/s per peer", comm->rank,
               shoal_qos_class_name(q->qos_class), q->weight,
               comm->ident.from_credential ? " (credential)" : "", q->marks.dscp,
               q->marks.priority, q->marks.ib_tc, q->marks.ib_sl, q->rate_max);
    return SHOAL_OK;
}
