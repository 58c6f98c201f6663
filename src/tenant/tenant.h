/* Tenancy: who a communicator belongs to (DESIGN.md section 7). The identity is part of every
 * join proof and of every key a communicator derives, so ranks of different tenants, jobs or
 * epochs never form one communicator, even when handed the same job secret.
 *
 * Two sources, one result:
 *  - ident.c: the identity a rank is configured with (shoal_config_t.tenant/job_name, else
 *    SHOAL_TENANT / SHOAL_JOB / SHOAL_EPOCH, else defaults);
 *  - cred.c: a provider-signed credential (SHOAL_CREDENTIAL) naming tenant, job, epoch, class
 *    and weight. When present it is the identity; a configured tenant or job that differs is
 *    a SHOAL_ERR_PERMISSION, and a configured QoS class may only lower the credential's.
 */
#ifndef SHOAL_TENANT_H
#define SHOAL_TENANT_H

#include "util/util.h"

#define SHOAL_TENANT_NAME_MAX 64 /* bytes of a tenant or job name, NUL included */

typedef struct {
    char tenant[SHOAL_TENANT_NAME_MAX]; /* "" when the job names none */
    char job[SHOAL_TENANT_NAME_MAX];
    uint64_t epoch;                     /* restart count of the job: old ranks cannot rejoin */
    int qos_class;                      /* shoal_qos_class_t */
    int qos_weight;
    int from_credential;                /* 1: tenant/job/epoch/class come from a credential */
} shoal_tenant_id_t;

/* SHOAL_* variables of the tenant module (table in tenant_config.c). */
typedef struct {
    const char *tenant;                 /* SHOAL_TENANT */
    const char *job;                    /* SHOAL_JOB */
    unsigned epoch;                     /* SHOAL_EPOCH */
} shoal_tenant_config_t;
extern SHOAL_HIDDEN shoal_tenant_config_t shoal_tenant_config;

/* ---- ident.c ---- */
struct shoal_tenant_cred; /* shoal_tenant_cred_t, below */
/* The identity this rank is configured with (cfg may be NULL) and holds the credential cred
 * for (shoal_tenant_cred_load; NULL: none). Names are checked: printable ASCII without
 * spaces, shorter than SHOAL_TENANT_NAME_MAX; else SHOAL_ERR_INVALID_ARG. */
SHOAL_HIDDEN shoal_status_t shoal_tenant_id_resolve(const shoal_config_t *cfg,
                                                    const struct shoal_tenant_cred *cred,
                                                    shoal_tenant_id_t *id);
/* The same from the credential read now (for tools: an init reads it once, then resolves). */
SHOAL_HIDDEN shoal_status_t shoal_tenant_id_current(const shoal_config_t *cfg,
                                                    shoal_tenant_id_t *id);
/* Canonical bytes of the identity (length-prefixed fields), for MACs and key derivation.
 * Returns the length (at most SHOAL_TENANT_ID_ENC_MAX), or 0 if buf is too small. */
#define SHOAL_TENANT_ID_ENC_MAX (16 + 2 * SHOAL_TENANT_NAME_MAX + 8)
SHOAL_HIDDEN size_t shoal_tenant_id_encode(const shoal_tenant_id_t *id, uint8_t *buf,
                                           size_t len);

/* ---- cred.c ---- */
/* Text form: "shoal-cred-v1:tenant=T;job=J;epoch=E;class=C;weight=W;expires=X;mac=<64 hex>",
 * fields in this order, each once; names non-empty printable ASCII without ';' '=' or spaces;
 * epoch, weight and expires decimal without leading zeros; class guaranteed|burstable|spot;
 * weight 1..SHOAL_TENANT_WEIGHT_MAX; expires 0 (never) or unix seconds. Nothing else, no
 * trailing newline (SHOAL_CREDENTIAL or its file may end in one). */
#define SHOAL_TENANT_CRED_TEXT_MAX 512 /* bytes of the text form, NUL included */
#define SHOAL_TENANT_WEIGHT_MAX 1000000
#define SHOAL_TENANT_MASTER_MIN 16     /* bytes of a provider master key, at least */

typedef struct shoal_tenant_cred {
    shoal_tenant_id_t id;
    int64_t expires;                    /* unix seconds; 0 = never */
    uint8_t mac[SHOAL_HMAC_BYTES];      /* HMAC(tenant key, canonical fields) */
} shoal_tenant_cred_t;

/* Text form (one line, for SHOAL_CREDENTIAL and files). */
SHOAL_HIDDEN shoal_status_t shoal_tenant_cred_parse(const char *text, shoal_tenant_cred_t *cred);
/* As shoal_tenant_cred_parse, but it logs nothing: the reason of a failure goes to why (may
 * be NULL; SHOAL_TENANT_CRED_WHY_MAX holds any), for a caller that logs at its own rate (the
 * node agent, which any local user can send credentials). Reasons never quote the text. */
#define SHOAL_TENANT_CRED_WHY_MAX 256
SHOAL_HIDDEN shoal_status_t shoal_tenant_cred_parse_quiet(const char *text,
                                                          shoal_tenant_cred_t *cred, char *why,
                                                          size_t why_len);
SHOAL_HIDDEN shoal_status_t shoal_tenant_cred_format(const shoal_tenant_cred_t *cred, char *buf,
                                                     size_t len);
/* The per-tenant key the provider derives from its master key; jobs never hold either. */
SHOAL_HIDDEN shoal_status_t shoal_tenant_key_derive(const uint8_t *master, size_t master_len,
                                                    const char *tenant,
                                                    uint8_t key[SHOAL_HMAC_BYTES]);
SHOAL_HIDDEN shoal_status_t shoal_tenant_cred_sign(shoal_tenant_cred_t *cred,
                                                   const uint8_t key[SHOAL_HMAC_BYTES]);
/* SHOAL_OK, SHOAL_ERR_AUTH (bad MAC) or SHOAL_ERR_PERMISSION (expired at now). */
SHOAL_HIDDEN shoal_status_t shoal_tenant_cred_verify(const shoal_tenant_cred_t *cred,
                                                     const uint8_t key[SHOAL_HMAC_BYTES],
                                                     int64_t now);
/* As shoal_tenant_cred_verify, logging nothing (a failure of libcrypto aside): the reason
 * goes to why (may be NULL). */
SHOAL_HIDDEN shoal_status_t shoal_tenant_cred_verify_quiet(const shoal_tenant_cred_t *cred,
                                                           const uint8_t key[SHOAL_HMAC_BYTES],
                                                           int64_t now, char *why,
                                                           size_t why_len);
/* Makes the credential the identity: SHOAL_ERR_PERMISSION when the configured identity names
 * another tenant or job, or the credential has expired; a configured class may only lower. */
SHOAL_HIDDEN shoal_status_t shoal_tenant_cred_apply(const shoal_tenant_cred_t *cred,
                                                    shoal_tenant_id_t *id);

/* SHOAL_CREDENTIAL / SHOAL_CREDENTIAL_FILE (src/tenant/tenant_config.c). */
typedef struct {
    const char *credential;      /* the text form (a secret: a bearer token) */
    const char *credential_file; /* path of a file holding it */
} shoal_tenant_cred_config_t;
extern SHOAL_HIDDEN shoal_tenant_cred_config_t shoal_tenant_cred_config;

/* The credential this process was given (SHOAL_CREDENTIAL or SHOAL_CREDENTIAL_FILE, not
 * both), parsed: *found_p = 0 and SHOAL_OK when neither is set. The MAC is not verified here
 * (a job holds no key); the node agent that holds the tenant key verifies it. An init reads
 * it once and gives that copy to everything that needs it (the identity, the secret's
 * binding, the meter's registration): a file the provider rewrites meanwhile (a restart's
 * new epoch) must not give them two different ones. Wipe it after use. */
SHOAL_HIDDEN shoal_status_t shoal_tenant_cred_load(shoal_tenant_cred_t *cred, int *found_p);
/* With a credential (cred, from shoal_tenant_cred_load; NULL: none), the job secret a rank
 * joins with is bound to it:
 * secret becomes KDF(the credential's MAC, "job secret", secret). The unique id carries the
 * secret unbound, so an id read from a channel that others can read (torch's TCPStore, an
 * environment dump) lets nobody join who does not hold the job's credential; every rank of
 * the job must hold the same one. Without a credential secret is left as it is. len must be
 * SHOAL_HMAC_BYTES. */
SHOAL_HIDDEN shoal_status_t shoal_tenant_secret_bind(const shoal_tenant_cred_t *cred,
                                                     uint8_t *secret, size_t len);

#endif
