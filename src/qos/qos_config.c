/* SHOAL_QOS_* variables of the class part of src/qos (the pacer has its own table). */
#include "qos/qos.h"

#include <stddef.h>

shoal_qos_class_config_t shoal_qos_class_config;

static const char *const shoal_qos_class_names[] = {"default", "guaranteed", "burstable", "spot",
                                                    NULL};

static const shoal_cfg_field_t shoal_qos_class_cfg_fields[] = {
    {.name = "QOS_CLASS", .dflt = "default", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_qos_class_names,
     .offset = offsetof(shoal_qos_class_config_t, qos_class),
     .doc = "QoS class of this job's communicators when shoal_config_t.qos_class is not set: "
            "default (no marks), guaranteed, burstable or spot. It may only lower a class: with "
            "a credential (SHOAL_CREDENTIAL) a higher one is ignored with a warning, without one "
            "the class is at most SHOAL_QOS_CLASS_MAX"},
    {.name = "QOS_WEIGHT", .dflt = "0", .type = SHOAL_CFG_INT,
     .offset = offsetof(shoal_qos_class_config_t, weight),
     .doc = "QoS weight (share of a contended link or host among tenants) when "
            "shoal_config_t.qos_weight is not set; 0 = the credential's, else 1. Like the class "
            "it may only lower: at most the credential's, without one at most "
            "SHOAL_QOS_WEIGHT_MAX"},
    {.name = "QOS_CLASS_MAX", .dflt = "burstable", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_qos_class_names,
     .offset = offsetof(shoal_qos_class_config_t, class_max),
     .doc = "highest class a job without a credential gets (a provider default, e.g. in "
            "SHOAL_CONF_FILE: without a signed credential nothing proves the job's claim, and "
            "the node agent treats it so too); a higher request is lowered with a warning. "
            "default here: no job without a credential is marked above best effort (one may "
            "still ask for spot, which marks it lower)"},
    {.name = "QOS_WEIGHT_MAX", .dflt = "1", .type = SHOAL_CFG_INT,
     .offset = offsetof(shoal_qos_class_config_t, weight_max),
     .doc = "highest weight a job without a credential gets (a higher request is lowered with "
            "a warning)"},
    {.name = "QOS_DSCP", .dflt = "guaranteed=AF41,burstable=AF21,spot=CS1", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_qos_class_config_t, dscp),
     .doc = "DSCP of each class on TCP sockets (IP_TOS / IPV6_TCLASS = DSCP << 2): a list "
            "class=value, value 0..63, a name (CS0..CS7, AF11..AF43, EF, LE) or none (leave the "
            "socket's); unlisted classes keep their default, the default class marks nothing"},
    {.name = "QOS_PRIORITY", .dflt = "guaranteed=6,burstable=4,spot=1", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_qos_class_config_t, priority),
     .doc = "SO_PRIORITY of each class on TCP sockets (class=value list, 0..15 or none; above "
            "6 needs CAP_NET_ADMIN, a refusal is one warning). pfifo_fast maps 6 to its first "
            "band, 1 (filler) to its last; an htb/prio qdisc or a VLAN egress map can use it"},
    {.name = "QOS_IB_TC", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_qos_class_config_t, ib_tc),
     .doc = "GRH traffic class of each class on IB / RoCE queue pairs and UCX workers "
            "(class=value list, 0..255 or none); an unlisted class uses its DSCP << 2. An "
            "explicit SHOAL_IB_TC (or UCX_IB_TRAFFIC_CLASS) overrides every class"},
    {.name = "QOS_IB_SL", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_qos_class_config_t, ib_sl),
     .doc = "InfiniBand service level of each class (class=value list, 0..15 or none; "
            "unlisted: SHOAL_IB_SL). Match the subnet manager's SL-to-VL map. An explicit "
            "SHOAL_IB_SL overrides every class"},
    {.name = "QOS_LINK_RATE_MAX", .dflt = "0", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_qos_class_config_t, rate_max),
     .doc = "rate cap the kernel and fabric enforce, in bytes/s (k/m/g) per peer connection "
            "of a communicator (SHOAL_QOS_RATE_MAX is the library's own pacer), 0 = none: "
            "TCP spreads it over the connection's sockets (SO_MAX_PACING_RATE, needs the fq "
            "qdisc or TCP internal pacing; a message below SHOAL_TCP_MIN_SPLIT travels on one "
            "socket, at its share), IB sets it on the queue pair where the device "
            "supports it (ibv_modify_qp_rate_limit)"},
};

const shoal_cfg_table_t shoal_qos_class_cfg_table = {
    .module = "qos",
    .fields = shoal_qos_class_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_qos_class_cfg_fields),
    .dst = &shoal_qos_class_config,
};
