/* QoS (DESIGN.md section 7, issue 12): per-communicator classes, weights and the marks the
 * kernel and the fabric enforce. Two parts, one header:
 *  - classes and marks (qos_class.c, qos_config.c): the effective class and weight of a
 *    communicator (a credential's, which a variable may only lower; without one at most
 *    SHOAL_QOS_CLASS_MAX) and the marks it maps to: SO_PRIORITY and DSCP for TCP, traffic
 *    class and service level for IB / RoCE and UCX, a rate cap. Resolved once per
 *    communicator at init and handed to the transports in shoal_tl_params_t; transports never
 *    include this header.
 *  - the in-library pacer (pace*.c): its own block below.
 */
#ifndef SHOAL_QOS_H
#define SHOAL_QOS_H

#include "util/util.h"

#include <stdint.h>

struct shoal_comm;

/* ==== classes and marks (qos_class.c, qos_config.c) ========================================= */

#define SHOAL_QOS_NCLASSES 4 /* shoal_qos_class_t: default, guaranteed, burstable, spot */

/* SHOAL_QOS_* variables of the class part (table shoal_qos_class_cfg_table, qos_config.c). */
typedef struct {
    int qos_class;          /* SHOAL_QOS_CLASS: shoal_qos_class_t, 0 = default (unset) */
    int weight;             /* SHOAL_QOS_WEIGHT: 0 = unset */
    int class_max;          /* SHOAL_QOS_CLASS_MAX: highest class without a credential */
    int weight_max;         /* SHOAL_QOS_WEIGHT_MAX: highest weight without a credential */
    const char *dscp;       /* SHOAL_QOS_DSCP: per-class list, "guaranteed=AF41,..." */
    const char *priority;   /* SHOAL_QOS_PRIORITY: per-class SO_PRIORITY list */
    const char *ib_tc;      /* SHOAL_QOS_IB_TC: per-class GRH traffic class; unlisted: DSCP<<2 */
    const char *ib_sl;      /* SHOAL_QOS_IB_SL: per-class service level */
    size_t rate_max;        /* SHOAL_QOS_LINK_RATE_MAX: the kernel's and fabric's cap, bytes/s per
                             * peer connection, 0 = none (SHOAL_QOS_RATE_MAX is the pacer's) */
} shoal_qos_class_config_t;
extern SHOAL_HIDDEN shoal_qos_class_config_t shoal_qos_class_config;

/* What a class maps to; -1 in any field: leave it alone (the kernel's or the transport's own
 * default, e.g. SHOAL_IB_TC). */
typedef struct {
    int dscp;               /* 0..63; IP_TOS / IPV6_TCLASS = dscp << 2 */
    int priority;           /* SO_PRIORITY 0..6 without CAP_NET_ADMIN, up to 15 with it */
    int ib_tc;              /* GRH traffic class 0..255 (RoCE: DSCP << 2 | ECN) */
    int ib_sl;              /* service level 0..15 */
} shoal_qos_marks_t;

/* A communicator's QoS state (comm->qos). */
typedef struct {
    int qos_class;          /* effective shoal_qos_class_t (from comm->ident) */
    int weight;             /* effective weight, >= 1 */
    shoal_qos_marks_t marks;
    uint64_t rate_max;      /* bytes/s per peer connection, 0 = none */
} shoal_qos_comm_t;

SHOAL_HIDDEN const char *shoal_qos_class_name(int qos_class);
/* Parses a per-class list "name=value,..." (names default|guaranteed|burstable|spot, values
 * decimal 0..max, "none" = -1, and with dscp != 0 the DSCP names CS0-CS7, AF11-AF43, EF, LE)
 * into vals[SHOAL_QOS_NCLASSES]; classes not listed keep their value. SHOAL_ERR_INVALID_ARG
 * on a malformed list (vals unchanged). */
SHOAL_HIDDEN shoal_status_t shoal_qos_list_parse(const char *spec, int max, int dscp,
                                                 int vals[SHOAL_QOS_NCLASSES]);
/* The marks of a class from the lists in cfg (NULL: the built-in defaults). The default class
 * (0) marks nothing. ib_tc_fixed / ib_sl_fixed: SHOAL_IB_TC / SHOAL_IB_SL were set explicitly,
 * and they win (ib_tc / ib_sl -1). SHOAL_ERR_INVALID_ARG on a malformed list. */
SHOAL_HIDDEN shoal_status_t shoal_qos_marks_resolve(int qos_class,
                                                    const shoal_qos_class_config_t *cfg,
                                                    int ib_tc_fixed, int ib_sl_fixed,
                                                    shoal_qos_marks_t *marks_p);
/* The class and weight of a job without a credential: requested (explicit config field, else
 * SHOAL_QOS_CLASS / SHOAL_QOS_WEIGHT) and capped at SHOAL_QOS_CLASS_MAX / SHOAL_QOS_WEIGHT_MAX
 * (cfg NULL: the built-in ceilings). Lowered means a warning once. Pure but for the warning. */
SHOAL_HIDDEN void shoal_qos_uncredentialed(int req_class, int req_weight,
                                           const shoal_qos_class_config_t *cfg, int *class_p,
                                           int *weight_p);
/* The class a configuration asks for: the explicit field, else SHOAL_QOS_CLASS; same for the
 * weight (0: unset). SHOAL_ERR_INVALID_ARG (logged) for a field outside shoal_qos_class_t or
 * a negative weight. */
SHOAL_HIDDEN shoal_status_t shoal_qos_requested(const shoal_config_t *cfg, int *class_p,
                                                int *weight_p);
/* Resolves comm->qos from comm->ident once, before the transports start. */
SHOAL_HIDDEN shoal_status_t shoal_qos_comm_init(struct shoal_comm *comm);

/* ==== pacer (pace*.c) ======================================================================= */
/* (the pacer's declarations go here) */

#endif
