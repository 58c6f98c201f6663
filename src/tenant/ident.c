/*
 * The identity a rank is configured with: tenant, job and epoch (DESIGN.md section 7). It is
 * part of the unique id, of every join proof and of every key a communicator derives, so
 * ranks configured for different tenants, jobs or epochs never form one communicator.
 */
#include "qos/qos.h"
#include "tenant/tenant.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Printable ASCII without spaces, shorter than SHOAL_TENANT_NAME_MAX. */
static shoal_status_t shoal_tenant_name_set(const char *what, const char *src, char *dst)
{
    size_t n = src != NULL ? strlen(src) : 0;
    if (n >= SHOAL_TENANT_NAME_MAX) {
        shoal_error(TENANT, "%s name is %zu bytes long; at most %d", what, n,
                    SHOAL_TENANT_NAME_MAX - 1);
        return SHOAL_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++) {
        if (src[i] <= ' ' || src[i] > '~') {
            shoal_error(TENANT, "%s name has a space or a non-printable character at byte %zu",
                        what, i);
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    if (n > 0) {
        memcpy(dst, src, n);
    }
    dst[n] = '\0';
    return SHOAL_OK;
}

/* An explicit SHOAL_EPOCH (environment or conf file): *claimed_p = 1 and its value, which
 * must be a count of its row's range. One that is not was a warning of the config tables and
 * the rank ran as epoch 0 (not SLURM_RESTART_COUNT's either), with the first run's ranks. */
static shoal_status_t shoal_tenant_epoch_claim(int *claimed_p, uint64_t *epoch_p)
{
    /* the row's parser: what the table takes (blanks around the number) is taken here */
    static const shoal_cfg_field_t row = {.name = "EPOCH", .type = SHOAL_CFG_UINT};
    const char *text = shoal_cfg_getenv("EPOCH");
    unsigned v;

    *claimed_p = text != NULL;
    if (text == NULL) {
        return SHOAL_OK;
    }
    if (shoal_cfg_parse_value(&row, text, &v) != 0) {
        shoal_error(TENANT, "SHOAL_EPOCH=%s is not a count from 0 to %u", text, UINT_MAX);
        return SHOAL_ERR_INVALID_ARG;
    }
    *epoch_p = v;
    return SHOAL_OK;
}

/* SHOAL_EPOCH when set, else Slurm's restart count, else 0. */
static shoal_status_t shoal_tenant_epoch(uint64_t *epoch_p)
{
    const char *slurm;
    uint64_t v;
    int claimed;

    SHOAL_CHECK(shoal_tenant_epoch_claim(&claimed, epoch_p));
    if (claimed) {
        return SHOAL_OK;
    }
    slurm = shoal_cfg_getenv_raw("SLURM_RESTART_COUNT");
    if (slurm == NULL || slurm[0] == '\0') {
        *epoch_p = 0;
        return SHOAL_OK;
    }
    if (shoal_parse_u64(slurm, UINT64_MAX, &v, NULL) != 0) {
        shoal_error(TENANT, "SLURM_RESTART_COUNT=%s is not a count", slurm);
        return SHOAL_ERR_INVALID_ARG;
    }
    *epoch_p = v;
    return SHOAL_OK;
}

shoal_status_t shoal_tenant_id_resolve(const shoal_config_t *cfg,
                                       const struct shoal_tenant_cred *cred,
                                       shoal_tenant_id_t *id)
{
    const char *tenant = cfg != NULL ? cfg->tenant : NULL;
    const char *job = cfg != NULL ? cfg->job_name : NULL;
    shoal_tenant_id_t out;
    shoal_status_t st;
    int found = cred != NULL, claimed = 0;
    uint64_t claimed_epoch = 0;

    shoal_config_global_init();
    memset(&out, 0, sizeof(out));
    /* Explicit config field > SHOAL_* variable > the credential > the launcher's (Slurm) >
     * empty. */
    if (tenant == NULL || tenant[0] == '\0') {
        tenant = shoal_tenant_config.tenant;
    }
    if (job == NULL || job[0] == '\0') {
        job = shoal_tenant_config.job;
    }
    if (!found && (job == NULL || job[0] == '\0')) {
        job = shoal_cfg_getenv_raw("SLURM_JOB_ID");
    }
    if ((st = shoal_tenant_name_set("tenant", tenant, out.tenant)) != SHOAL_OK ||
        (st = shoal_tenant_name_set("job", job, out.job)) != SHOAL_OK) {
        return st;
    }
    if (found) {
        /* Only an explicit SHOAL_EPOCH is a claim the credential must match. */
        if ((st = shoal_tenant_epoch_claim(&claimed, &out.epoch)) != SHOAL_OK) {
            return st;
        }
        claimed_epoch = out.epoch;
    } else if ((st = shoal_tenant_epoch(&out.epoch)) != SHOAL_OK) {
        return st;
    }
    /* Explicit field > SHOAL_QOS_CLASS / SHOAL_QOS_WEIGHT; either may only lower: below the
     * credential's (shoal_tenant_cred_apply), else at most SHOAL_QOS_CLASS_MAX / _WEIGHT_MAX. */
    if ((st = shoal_qos_requested(cfg, &out.qos_class, &out.qos_weight)) != SHOAL_OK) {
        return st;
    }
    if (!found) {
        shoal_qos_uncredentialed(out.qos_class, out.qos_weight, &shoal_qos_class_config,
                                 &out.qos_class, &out.qos_weight);
    }
    out.from_credential = 0;

    /* A credential is the identity: a configured tenant, job or epoch that differs is refused
     * (SHOAL_ERR_PERMISSION), a configured class or weight may only lower the credential's. */
    if (found && (st = shoal_tenant_cred_apply(cred, &out)) != SHOAL_OK) {
        return st;
    }
    /* An explicit SHOAL_EPOCH=0 is a claim too, but shoal_tenant_cred_apply takes an epoch of
     * 0 for none: checked here, or a rank told it runs epoch 0 joined with the credential of a
     * later run. After apply, which refuses a credential of another tenant or job first:
     * checked before, a rank of another job was told of the epoch only, under the
     * credential's job name as if it were its own. */
    if (found && claimed && claimed_epoch == 0 && cred->id.epoch != 0) {
        shoal_error(TENANT, "this rank is configured for epoch 0 of job '%s' but its "
                    "credential names epoch %" PRIu64 " (a credential of another run)",
                    cred->id.job, cred->id.epoch);
        return SHOAL_ERR_PERMISSION;
    }
    *id = out;
    return SHOAL_OK;
}

shoal_status_t shoal_tenant_id_current(const shoal_config_t *cfg, shoal_tenant_id_t *id)
{
    shoal_tenant_cred_t cred;
    int found = 0;
    shoal_status_t st;

    memset(&cred, 0, sizeof(cred));
    st = shoal_tenant_cred_load(&cred, &found);
    if (st == SHOAL_OK) {
        st = shoal_tenant_id_resolve(cfg, found ? &cred : NULL, id);
    }
    shoal_secret_wipe(&cred, sizeof(cred)); /* its MAC is a bearer token */
    return st;
}

size_t shoal_tenant_id_encode(const shoal_tenant_id_t *id, uint8_t *buf, size_t len)
{
    static const char tag[16] = "shoal-tenant-v1";
    size_t tl = strnlen(id->tenant, SHOAL_TENANT_NAME_MAX - 1);
    size_t jl = strnlen(id->job, SHOAL_TENANT_NAME_MAX - 1);
    size_t need = sizeof(tag) + 1 + tl + 1 + jl + 8, off = 0;

    if (buf == NULL || len < need) {
        return 0;
    }
    memcpy(buf, tag, sizeof(tag));
    off += sizeof(tag);
    buf[off++] = (uint8_t)tl;
    memcpy(buf + off, id->tenant, tl);
    off += tl;
    buf[off++] = (uint8_t)jl;
    memcpy(buf + off, id->job, jl);
    off += jl;
    shoal_put_le(buf + off, id->epoch, 8);
    off += 8;
    return off;
}
