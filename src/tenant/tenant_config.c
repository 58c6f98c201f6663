/* SHOAL_* variables of the tenant module: the identity a rank is configured with. */
#include "tenant/tenant.h"

#include <stddef.h>

shoal_tenant_config_t shoal_tenant_config;

static const shoal_cfg_field_t shoal_tenant_cfg_fields[] = {
    {.name = "TENANT", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_tenant_config_t, tenant),
     .doc = "tenant this job belongs to (shoal_config_t.tenant wins); part of every join proof "
            "and key, so ranks of different tenants never form one communicator"},
    {.name = "JOB", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_tenant_config_t, job),
     .doc = "job name (shoal_config_t.job_name wins); part of every join proof and key; empty = "
            "SLURM_JOB_ID when set"},
    {.name = "EPOCH", .dflt = "0", .type = SHOAL_CFG_UINT,
     .offset = offsetof(shoal_tenant_config_t, epoch),
     .doc = "restart count of the job: ranks of an earlier epoch cannot join; unset = "
            "SLURM_RESTART_COUNT when set, else 0"},
};

const shoal_cfg_table_t shoal_tenant_cfg_table = {
    .module = "tenant",
    .fields = shoal_tenant_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_tenant_cfg_fields),
    .dst = &shoal_tenant_config,
};
