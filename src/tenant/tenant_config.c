/* SHOAL_* variables of the tenant module: the identity a rank is configured with, and the
 * provider-signed job credential. */
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

shoal_tenant_cred_config_t shoal_tenant_cred_config;

static const shoal_cfg_field_t shoal_tenant_cred_cfg_fields[] = {
    {.name = "CREDENTIAL", .dflt = "", .type = SHOAL_CFG_STRING, .flags = SHOAL_CFG_F_SECRET,
     .offset = offsetof(shoal_tenant_cred_config_t, credential),
     .doc = "provider-signed job credential (from shoal-cred issue) naming tenant, job, epoch, "
            "QoS class and weight; it is the job's identity: a configured tenant or job must "
            "match it, a configured class or weight may only lower it"},
    {.name = "CREDENTIAL_FILE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_tenant_cred_config_t, credential_file),
     .doc = "file holding the job credential (one line), instead of SHOAL_CREDENTIAL; it must "
            "belong to root or the job's user and not be writable by others (else "
            "SHOAL_ERR_PERMISSION)"},
};

const shoal_cfg_table_t shoal_tenant_cred_cfg_table = {
    .module = "tenant",
    .fields = shoal_tenant_cred_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_tenant_cred_cfg_fields),
    .dst = &shoal_tenant_cred_config,
};
