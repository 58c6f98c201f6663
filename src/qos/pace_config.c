/* SHOAL_QOS_* variables of the pacer (src/qos/pace.c). */
#include "qos/pace.h"

#include <stddef.h>

shoal_qos_pace_config_t shoal_qos_pace_config;

static const shoal_cfg_field_t shoal_qos_pace_cfg_fields[] = {
    {.name = "QOS_RATE_MAX", .dflt = "0", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_qos_pace_config_t, rate_max),
     .doc = "hard cap on the payload bytes per second a communicator's ranks on one host send "
            "together, on every transport (the provider's limit; k m g = 1024 powers); each "
            "rank is paced at its equal part, at least 64k (a smaller part is raised to it, "
            "with a warning); 0 = none"},
    {.name = "QOS_BURST", .dflt = "256k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_qos_pace_config_t, burst),
     .doc = "token bucket size of a paced rank, bytes (at least 128k and 5 ms of its rate); "
            "the rates page may set another"},
    {.name = "QOS_RATES", .dflt = "none", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_qos_pace_config_t, rates),
     .doc = "the node agent's rates page for this job (%t = the tenant, uid=N (the effective "
            "uid) for a job without one, as the agent meters and bills it; %j = the job, "
            "default without one; e.g. /run/shoal/qos/%t.rate): its rate applies like "
            "QOS_RATE_MAX (the smaller one), read between chunks every 2 ms; it need not "
            "exist yet; a tenant or job name that holds a '/' or is '.' or '..' (not one file "
            "name) fails shoal_comm_init with SHOAL_ERR_INVALID_ARG; none = no agent rates"},
    {.name = "QOS_RATES_TIMEOUT", .dflt = "10s", .type = SHOAL_CFG_TIME,
     .offset = offsetof(shoal_qos_pace_config_t, rates_timeout_ms),
     .doc = "a rates page not updated for this long (agent gone) no longer limits: the last "
            "rate holds until then, full speed after (QOS_RATE_MAX still applies); at least "
            "1s (the agent beats once a second; less fails shoal_comm_init with "
            "SHOAL_ERR_INVALID_ARG); inf = keep the last rate"},
};

const shoal_cfg_table_t shoal_qos_pace_cfg_table = {
    .module = "qos",
    .fields = shoal_qos_pace_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_qos_pace_cfg_fields),
    .dst = &shoal_qos_pace_config,
};
