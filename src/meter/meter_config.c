/* SHOAL_* variables of the metering module (src/meter). */
#include "meter/meter.h"

#include <stddef.h>

shoal_meter_config_t shoal_meter_config;

static const shoal_cfg_field_t shoal_meter_cfg_fields[] = {
    {.name = "METER", .dflt = "1", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoal_meter_config_t, enabled),
     .doc = "keep the per-communicator counters (shoal_comm_stats, the node agent); 0 only to "
            "measure their cost (perf/meter_overhead.sh): no counting, no page, no agent "
            "registration (refused when SHOAL_AGENT_REQUIRED=1)"},
    {.name = "METER_GPUS", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_meter_config_t, gpus),
     .doc = "GPUs this rank occupies, for billing: a list of CUDA ordinals (0,1,3), count:N "
            "(N GPUs, ordinals unknown) or none; empty = the entries of CUDA_VISIBLE_DEVICES if "
            "it is set, else none; a list ends, as CUDA's does, at an entry that is neither an "
            "ordinal nor a GPU-/MIG- UUID"},
    {.name = "AGENT", .dflt = "/run/shoal/shoald.sock", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_meter_config_t, agent),
     .doc = "UNIX socket of the node agent shoald: each communicator registers its counter "
            "page there at init if the socket exists (200 ms at most) and again after the agent "
            "restarted (one that did not answer: after 2, 4, ... 64 s); none = never"},
    {.name = "AGENT_REQUIRED", .dflt = "0", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoal_meter_config_t, agent_required),
     .doc = "1: shoal_comm_init fails when the node agent is absent or refuses the "
            "communicator (SHOAL_ERR_PERMISSION for a refused tenant, or a listener not trusted "
            "with the credential: SHOAL_AGENT_UID); 0: the job runs and a refusal is a warning"},
    {.name = "AGENT_UID", .dflt = "-1", .type = SHOAL_CFG_INT,
     .offset = offsetof(shoal_meter_config_t, agent_uid),
     .doc = "uid the node agent runs as, when the rule that finds it does not (the job "
            "credential goes only to a listener whose uid is 0, this process's, this one, or "
            "the owner of the socket's directory and each one above it up to one of root's, "
            "none writable by group or others); -1 = none"},
};

const shoal_cfg_table_t shoal_meter_cfg_table = {
    .module = "meter",
    .fields = shoal_meter_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_meter_cfg_fields),
    .dst = &shoal_meter_config,
};
