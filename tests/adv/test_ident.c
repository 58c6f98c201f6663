/*
 * The tenant identity (src/tenant/ident.c) and the unique id that carries it: where the names
 * come from (config field > SHOAL_TENANT/SHOAL_JOB/SHOAL_EPOCH > Slurm's variables), which
 * names are refused, the canonical encoding, the version 2 id, and the sentence a rank of
 * another tenant, job or epoch gets. TAP on stdout.
 */
#include "core/boot.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char ti_log_path[64]; /* the errors logged, for the sentences a refused rank gets */

static void ti_env(void)
{
    /* Before the first shoal call: the tables are parsed once per process. */
    setenv("SHOAL_TENANT", "acme", 1);
    unsetenv("SHOAL_JOB");
    unsetenv("SHOAL_EPOCH");
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("SLURM_RESTART_COUNT", "5", 1);
    snprintf(ti_log_path, sizeof(ti_log_path), "/tmp/test_ident_log.%d", (int)getpid());
    unlink(ti_log_path);
    setenv("SHOAL_DEBUG_FILE", ti_log_path, 1);
    setenv("SHOAL_DEBUG", "ERROR", 1);
    shoal_config_global_init();
}

/* The last line logged (up to 1 KiB), "" if none. */
static const char *ti_last_log(char *buf, size_t len)
{
    FILE *fp = fopen(ti_log_path, "r");

    buf[0] = '\0';
    while (fp != NULL && fgets(buf, (int)len, fp) != NULL) {
    }
    if (fp != NULL)
        fclose(fp);
    return buf;
}

static void ti_resolve(void)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_tenant_id_t id;
    char longname[80], line[1024];

    tap_is_int(shoal_tenant_id_current(NULL, &id), SHOAL_OK, "resolve from the environment");
    tap_is_str(id.tenant, "acme", "tenant from SHOAL_TENANT");
    tap_is_str(id.job, "4242", "job from SLURM_JOB_ID when SHOAL_JOB is unset");
    tap_is_int(id.epoch, 5, "epoch from SLURM_RESTART_COUNT when SHOAL_EPOCH is unset");
    /* strtoull skips white space and takes a sign: " -1" was epoch 2^64 - 1 */
    setenv("SLURM_RESTART_COUNT", " -1", 1);
    tap_is_int(shoal_tenant_id_current(NULL, &id), SHOAL_ERR_INVALID_ARG,
               "SLURM_RESTART_COUNT=' -1' is refused, not epoch 2^64 - 1");
    setenv("SLURM_RESTART_COUNT", "5", 1);
    /* A SHOAL_EPOCH that is not a count was a warning, and the rank ran as epoch 0 (neither
     * the epoch asked for nor SLURM_RESTART_COUNT's): it joined the first run's ranks. */
    setenv("SHOAL_EPOCH", "3x", 1);
    tap_is_int(shoal_tenant_id_current(NULL, &id), SHOAL_ERR_INVALID_ARG,
               "SHOAL_EPOCH=3x is refused, not epoch 0");
    ti_last_log(line, sizeof(line));
    tap_ok(strstr(line, "SHOAL_EPOCH=3x is not a count") != NULL, "... and the error says so");
    setenv("SHOAL_EPOCH", "4294967296", 1);
    tap_is_int(shoal_tenant_id_current(NULL, &id), SHOAL_ERR_INVALID_ARG,
               "SHOAL_EPOCH=4294967296 (above SHOAL_EPOCH's range) is refused, not epoch 0");
    setenv("SHOAL_EPOCH", " 7 ", 1); /* as the config table takes it */
    tap_ok(shoal_tenant_id_current(NULL, &id) == SHOAL_OK && id.epoch == 7,
           "SHOAL_EPOCH=' 7 ' is epoch 7");
    unsetenv("SHOAL_EPOCH");
    cfg.tenant = "globex";
    cfg.job_name = "train-7";
    tap_is_int(shoal_tenant_id_current(&cfg, &id), SHOAL_OK, "resolve with config fields");
    tap_ok(strcmp(id.tenant, "globex") == 0 && strcmp(id.job, "train-7") == 0,
           "shoal_config_t.tenant and job_name win over the environment");
    cfg.tenant = "two words";
    tap_is_int(shoal_tenant_id_current(&cfg, &id), SHOAL_ERR_INVALID_ARG,
               "a tenant name with a space is refused");
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    cfg.tenant = longname;
    tap_is_int(shoal_tenant_id_current(&cfg, &id), SHOAL_ERR_INVALID_ARG,
               "a tenant name of %zu bytes is refused", strlen(longname));
    cfg.tenant = "t\x01";
    tap_is_int(shoal_tenant_id_current(&cfg, &id), SHOAL_ERR_INVALID_ARG,
               "a tenant name with a control character is refused");
}

static size_t ti_enc(const char *t, const char *j, uint64_t e, uint8_t *buf)
{
    shoal_tenant_id_t id;
    memset(&id, 0, sizeof(id));
    strcpy(id.tenant, t);
    strcpy(id.job, j);
    id.epoch = e;
    return shoal_tenant_id_encode(&id, buf, SHOAL_TENANT_ID_ENC_MAX);
}

static void ti_encode(void)
{
    uint8_t a[SHOAL_TENANT_ID_ENC_MAX], b[SHOAL_TENANT_ID_ENC_MAX];
    size_t la = ti_enc("ab", "c", 1, a), lb = ti_enc("a", "bc", 1, b);
    shoal_tenant_id_t id;

    tap_ok(la > 0 && lb > 0 && (la != lb || memcmp(a, b, la) != 0),
           "encoding is length-prefixed: (ab, c) and (a, bc) differ");
    lb = ti_enc("ab", "c", 2, b);
    tap_ok(la == lb && memcmp(a, b, la) != 0, "the epoch is part of the encoding");
    lb = ti_enc("ab", "c", 1, b);
    tap_ok(la == lb && memcmp(a, b, la) == 0, "the encoding is canonical (same input, bytes)");
    memset(&id, 0, sizeof(id));
    tap_is_int(shoal_tenant_id_encode(&id, a, 8), 0, "a buffer too small gives 0");
}

static void ti_uid(void)
{
    shoal_boot_uid_t u, v;
    shoal_tenant_id_t id, other;
    shoal_uid_t uid;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&u.root;
    char why[256];
    uint16_t version = 1;

    memset(&u, 0, sizeof(u));
    s4->sin_family = AF_INET;
    s4->sin_port = htons(4242);
    s4->sin_addr.s_addr = htonl(0x7f000001);
    u.root_len = sizeof(*s4);
    memset(u.secret, 0x33, sizeof(u.secret));
    memset(&id, 0, sizeof(id));
    strcpy(id.tenant, "acme");
    strcpy(id.job, "train-7");
    id.epoch = 3;
    shoal_boot_ident_make(&id, &u.ident);
    shoal_boot_uid_encode(&u, &uid);
    tap_is_int(shoal_boot_uid_decode(&uid, &v), SHOAL_OK, "a version 2 id decodes");
    tap_ok(memcmp(&u.ident, &v.ident, sizeof(u.ident)) == 0 &&
               memcmp(u.secret, v.secret, sizeof(u.secret)) == 0,
           "the id carries tenant, job and epoch (digests) and the secret");
    tap_is_int(shoal_boot_ident_check(&v.ident, &u.ident, &id, why, sizeof(why)), SHOAL_OK,
               "the same identity passes");
    other = id;
    strcpy(other.tenant, "globex");
    shoal_boot_ident_make(&other, &v.ident);
    tap_is_int(shoal_boot_ident_check(&u.ident, &v.ident, &other, why, sizeof(why)),
               SHOAL_ERR_PERMISSION, "another tenant: SHOAL_ERR_PERMISSION");
    tap_ok(strstr(why, "tenant \"globex\"") != NULL && strstr(why, "3333") == NULL,
           "the sentence names the tenant, never the secret: %s", why);
    other = id;
    other.epoch = 2;
    shoal_boot_ident_make(&other, &v.ident);
    tap_is_int(shoal_boot_ident_check(&u.ident, &v.ident, &other, why, sizeof(why)),
               SHOAL_ERR_PERMISSION, "a rank of epoch 2 and an id of epoch 3");
    tap_ok(strstr(why, "epoch 2") != NULL && strstr(why, "epoch 3") != NULL,
           "the sentence names both epochs: %s", why);
    memcpy(uid.internal + 4, &version, 2);
    tap_is_int(shoal_boot_uid_decode(&uid, &v), SHOAL_ERR_INVALID_ARG,
               "a version 1 id (no identity) is refused");
}

/* SHOAL_SECRET is exactly 64 hex digits (sscanf("%2x") took " f", "+f" and "-1" for digits,
 * so several texts gave one secret); SHOAL_ROOT is host:port or [ipv6]:port. */
static void ti_env_parsers(void)
{
    static const char *const bad_secret[] = {
        " f112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        "+f112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        "-1112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        "0x112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeef",
    };
    static const char *const bad_root[] = {"host", ":80", "host:", "host:0", "host:65536",
                                           "host:+80", "host: 80", "host:080", "::1:80", "[::1]80",
                                           "[]:80", "a b:80", "host:80x"};
    uint8_t s[SHOAL_SECRET_BYTES];
    char host[64];
    uint16_t port = 0;
    int bad = 0;

    tap_is_int(shoal_boot_hex_decode("00112233445566778899aabbccddeeff00112233445566778899AABBCC"
                                     "DDEEFF", s, sizeof(s)), SHOAL_OK,
               "SHOAL_SECRET: 64 hex digits (either case) are a secret");
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(bad_secret); i++) {
        bad += shoal_boot_hex_decode(bad_secret[i], s, sizeof(s)) == SHOAL_ERR_INVALID_ARG;
    }
    tap_is_int(bad, (int)SHOAL_ARRAY_SIZE(bad_secret),
               "SHOAL_SECRET with a space, a sign, 0x or 63 digits is refused");
    tap_ok(shoal_boot_root_split("node01:29500", host, sizeof(host), &port) == SHOAL_OK &&
               strcmp(host, "node01") == 0 && port == 29500 &&
               shoal_boot_root_split("[fe80::1]:7", host, sizeof(host), &port) == SHOAL_OK &&
               strcmp(host, "fe80::1") == 0 && port == 7,
           "SHOAL_ROOT: host:port and [ipv6]:port");
    bad = 0;
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(bad_root); i++) {
        bad += shoal_boot_root_split(bad_root[i], host, sizeof(host), &port) ==
               SHOAL_ERR_INVALID_ARG;
    }
    tap_is_int(bad, (int)SHOAL_ARRAY_SIZE(bad_root),
               "SHOAL_ROOT without a host or a port 1..65535, or a bare IPv6 address, is refused");
}

/* A credential of epoch 5 and an explicit SHOAL_EPOCH: any other epoch is refused, 0
 * included (it was taken for no claim, and the rank joined with the later run's credential). */
static void ti_cred_epoch(void)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_tenant_cred_t cred;
    shoal_tenant_id_t id;
    uint8_t master[32], key[SHOAL_HMAC_BYTES];
    char text[SHOAL_TENANT_CRED_TEXT_MAX], line[1024];

    memset(&cred, 0, sizeof(cred));
    memset(master, 0x5a, sizeof(master));
    strcpy(cred.id.tenant, "acme");
    strcpy(cred.id.job, "train-7");
    cred.id.epoch = 5;
    cred.id.qos_class = SHOAL_QOS_BURSTABLE;
    cred.id.qos_weight = 1;
    if (shoal_tenant_key_derive(master, sizeof(master), "acme", key) != SHOAL_OK ||
        shoal_tenant_cred_sign(&cred, key) != SHOAL_OK ||
        shoal_tenant_cred_format(&cred, text, sizeof(text)) != SHOAL_OK)
        tap_bail("cannot make a credential");
    shoal_tenant_cred_config.credential = text;
    unsetenv("SHOAL_EPOCH");
    tap_ok(shoal_tenant_id_current(NULL, &id) == SHOAL_OK && id.epoch == 5,
           "with a credential and no SHOAL_EPOCH: the credential's epoch");
    setenv("SHOAL_EPOCH", "5", 1);
    shoal_tenant_config.epoch = 5;
    tap_is_int(shoal_tenant_id_current(NULL, &id), SHOAL_OK, "SHOAL_EPOCH=5, credential 5: ok");
    setenv("SHOAL_EPOCH", "4", 1);
    shoal_tenant_config.epoch = 4;
    tap_is_int(shoal_tenant_id_current(NULL, &id), SHOAL_ERR_PERMISSION,
               "SHOAL_EPOCH=4, credential 5: SHOAL_ERR_PERMISSION");
    setenv("SHOAL_EPOCH", "0", 1);
    shoal_tenant_config.epoch = 0;
    tap_is_int(shoal_tenant_id_current(NULL, &id), SHOAL_ERR_PERMISSION,
               "SHOAL_EPOCH=0, credential 5: SHOAL_ERR_PERMISSION");
    /* A rank of another job holding this credential is told so. The epoch was checked first:
     * it was told 'configured for epoch 0 of job train-7' (the credential's job, not its own)
     * and nothing of the job. */
    cfg.job_name = "train-8";
    tap_is_int(shoal_tenant_id_current(&cfg, &id), SHOAL_ERR_PERMISSION,
               "SHOAL_EPOCH=0, job train-8, credential of job train-7 epoch 5: refused");
    ti_last_log(line, sizeof(line));
    tap_ok(strstr(line, "configured for job 'train-8'") != NULL &&
               strstr(line, "names job 'train-7'") != NULL,
           "... the error names the rank's job and the credential's");
    unsetenv("SHOAL_EPOCH");
    shoal_tenant_cred_config.credential = NULL;
}

int main(void)
{
    ti_env();
    ti_resolve();
    ti_encode();
    ti_uid();
    ti_env_parsers();
    ti_cred_epoch();
    unlink(ti_log_path);
    return tap_done();
}
