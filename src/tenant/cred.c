/* Provider-signed job credentials (DESIGN.md section 7): the text form, the MAC over the
 * canonical fields, expiry, the per-tenant key, and how a credential becomes a rank's identity.
 *
 * The provider holds a master key; the tenant key is KDF(master, "tenant", tenant name); a
 * credential is its fields plus HMAC-SHA256(tenant key, canonical encoding of the fields). A
 * job holds only the credential (a bearer token bound to tenant, job, epoch and expiry), never
 * a key: the library parses and applies it, the node agent (which holds the tenant or master
 * key) verifies it. No log line prints a MAC or a key. */
#include "tenant/tenant.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHOAL_TENANT_CRED_PREFIX "shoal-cred-v1:"
/* Domain of the MAC: a message MACed with a tenant key for another purpose never starts so. */
#define SHOAL_TENANT_CRED_DOMAIN "shoal-cred-v1"
#define SHOAL_TENANT_CRED_ENC_MAX 256

typedef enum {
    SHOAL_TENANT_CRED_F_TENANT,
    SHOAL_TENANT_CRED_F_JOB,
    SHOAL_TENANT_CRED_F_EPOCH,
    SHOAL_TENANT_CRED_F_CLASS,
    SHOAL_TENANT_CRED_F_WEIGHT,
    SHOAL_TENANT_CRED_F_EXPIRES,
    SHOAL_TENANT_CRED_F_MAC,
    SHOAL_TENANT_CRED_NFIELDS
} shoal_tenant_cred_field_t;

/* The fixed order of the text form. */
static const char *const shoal_tenant_cred_fields[SHOAL_TENANT_CRED_NFIELDS] = {
    [SHOAL_TENANT_CRED_F_TENANT] = "tenant",   [SHOAL_TENANT_CRED_F_JOB] = "job",
    [SHOAL_TENANT_CRED_F_EPOCH] = "epoch",     [SHOAL_TENANT_CRED_F_CLASS] = "class",
    [SHOAL_TENANT_CRED_F_WEIGHT] = "weight",   [SHOAL_TENANT_CRED_F_EXPIRES] = "expires",
    [SHOAL_TENANT_CRED_F_MAC] = "mac",
};

static const char *const shoal_tenant_cred_classes[] = {
    [SHOAL_QOS_DEFAULT] = "default",
    [SHOAL_QOS_GUARANTEED] = "guaranteed",
    [SHOAL_QOS_BURSTABLE] = "burstable",
    [SHOAL_QOS_SPOT] = "spot",
};

static const char *shoal_tenant_cred_class_name(int c)
{
    return c >= SHOAL_QOS_DEFAULT && c <= SHOAL_QOS_SPOT ? shoal_tenant_cred_classes[c] : "?";
}

static int64_t shoal_tenant_cred_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

/* The reason of a failure, for the caller to log (or not): why may be NULL. */
static void shoal_tenant_cred_why(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void shoal_tenant_cred_why(char *why, size_t why_len, const char *fmt, ...)
{
    va_list ap;

    if (why == NULL || why_len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

/* A tenant or job name: 1..SHOAL_TENANT_NAME_MAX-1 bytes of printable ASCII, no space, ';'
 * or '=' (the separators of the text form). */
static int shoal_tenant_cred_name_ok(const char *s, size_t len)
{
    size_t i;

    if (len == 0 || len >= SHOAL_TENANT_NAME_MAX)
        return 0;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c >= 0x7f || c == ';' || c == '=')
            return 0;
    }
    return 1;
}

static int shoal_tenant_cred_name_field_ok(const char name[SHOAL_TENANT_NAME_MAX])
{
    return shoal_tenant_cred_name_ok(name, strnlen(name, SHOAL_TENANT_NAME_MAX));
}

/* What is wrong with the fields of a credential built in memory, NULL when nothing. */
static const char *shoal_tenant_cred_check_why(const shoal_tenant_cred_t *c)
{
    const char *bad = NULL;

    if (c == NULL)
        bad = "no credential";
    else if (!shoal_tenant_cred_name_field_ok(c->id.tenant))
        bad = "the tenant name is empty, too long or not printable ASCII without ' ;='";
    else if (!shoal_tenant_cred_name_field_ok(c->id.job))
        bad = "the job name is empty, too long or not printable ASCII without ' ;='";
    else if (c->id.qos_class < SHOAL_QOS_GUARANTEED || c->id.qos_class > SHOAL_QOS_SPOT)
        bad = "the class is not guaranteed, burstable or spot";
    else if (c->id.qos_weight < 1 || c->id.qos_weight > SHOAL_TENANT_WEIGHT_MAX)
        bad = "the weight is out of range";
    else if (c->expires < 0)
        bad = "the expiry is negative";
    return bad;
}

/* Checks the fields of a credential built in memory (format, sign, verify, apply). */
static shoal_status_t shoal_tenant_cred_check(const shoal_tenant_cred_t *c, const char *what)
{
    const char *bad = shoal_tenant_cred_check_why(c);

    if (bad != NULL) {
        shoal_error(TENANT, "cannot %s the credential: %s", what, bad);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

/* Canonical bytes of every field but the MAC: domain | len tenant | tenant | len job | job |
 * epoch (8 LE) | class (1) | weight (4 LE) | expires (8 LE). Lengths make it unambiguous. */
static size_t shoal_tenant_cred_encode(const shoal_tenant_cred_t *c,
                                       uint8_t buf[SHOAL_TENANT_CRED_ENC_MAX])
{
    size_t dlen = strlen(SHOAL_TENANT_CRED_DOMAIN);
    size_t tlen = strnlen(c->id.tenant, SHOAL_TENANT_NAME_MAX);
    size_t jlen = strnlen(c->id.job, SHOAL_TENANT_NAME_MAX);
    size_t n = 0;

    buf[n++] = (uint8_t)dlen;
    memcpy(buf + n, SHOAL_TENANT_CRED_DOMAIN, dlen);
    n += dlen;
    buf[n++] = (uint8_t)tlen;
    memcpy(buf + n, c->id.tenant, tlen);
    n += tlen;
    buf[n++] = (uint8_t)jlen;
    memcpy(buf + n, c->id.job, jlen);
    n += jlen;
    shoal_put_le(buf + n, c->id.epoch, 8);
    n += 8;
    buf[n++] = (uint8_t)c->id.qos_class;
    shoal_put_le(buf + n, (uint64_t)(uint32_t)c->id.qos_weight, 4);
    n += 4;
    shoal_put_le(buf + n, (uint64_t)c->expires, 8);
    n += 8;
    return n;
}

static shoal_status_t shoal_tenant_cred_mac(const shoal_tenant_cred_t *c,
                                            const uint8_t key[SHOAL_HMAC_BYTES],
                                            uint8_t out[SHOAL_HMAC_BYTES])
{
    uint8_t enc[SHOAL_TENANT_CRED_ENC_MAX];
    size_t n = shoal_tenant_cred_encode(c, enc);

    return shoal_hmac(key, SHOAL_HMAC_BYTES, enc, n, out);
}

/* ---- text form ---------------------------------------------------------------------------- */

/* Decimal without sign or leading zeros, at most max. */
static int shoal_tenant_cred_parse_uint(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    size_t i;

    if (len == 0 || len > 20 || (len > 1 && s[0] == '0'))
        return -1;
    for (i = 0; i < len; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9 || v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int shoal_tenant_cred_parse_hex(const char *s, size_t len, uint8_t out[SHOAL_HMAC_BYTES])
{
    size_t i;

    if (len != 2 * SHOAL_HMAC_BYTES)
        return -1;
    for (i = 0; i < len; i++) {
        char ch = s[i];
        unsigned v;
        if (ch >= '0' && ch <= '9')
            v = (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            v = (unsigned)(ch - 'a' + 10);
        else
            return -1;
        if (i % 2 == 0)
            out[i / 2] = (uint8_t)(v << 4);
        else
            out[i / 2] |= (uint8_t)v;
    }
    return 0;
}

/* One field's value into c; 0 or -1 with *why set. */
static int shoal_tenant_cred_parse_field(shoal_tenant_cred_field_t k, const char *v, size_t len,
                                         shoal_tenant_cred_t *c, const char **why)
{
    uint64_t u;
    int i;

    switch (k) {
    case SHOAL_TENANT_CRED_F_TENANT:
    case SHOAL_TENANT_CRED_F_JOB:
        *why = "not 1 to 63 bytes of printable ASCII without ' ;='";
        if (!shoal_tenant_cred_name_ok(v, len))
            return -1;
        memcpy(k == SHOAL_TENANT_CRED_F_TENANT ? c->id.tenant : c->id.job, v, len);
        return 0;
    case SHOAL_TENANT_CRED_F_EPOCH:
        *why = "not a decimal number without leading zeros below 2^64";
        if (shoal_tenant_cred_parse_uint(v, len, UINT64_MAX, &u) != 0)
            return -1;
        c->id.epoch = u;
        return 0;
    case SHOAL_TENANT_CRED_F_CLASS:
        *why = "not guaranteed, burstable or spot";
        for (i = SHOAL_QOS_GUARANTEED; i <= SHOAL_QOS_SPOT; i++) {
            if (strlen(shoal_tenant_cred_classes[i]) == len &&
                memcmp(shoal_tenant_cred_classes[i], v, len) == 0) {
                c->id.qos_class = i;
                return 0;
            }
        }
        return -1;
    case SHOAL_TENANT_CRED_F_WEIGHT:
        *why = "not a decimal number from 1 to 1000000 without leading zeros";
        if (shoal_tenant_cred_parse_uint(v, len, SHOAL_TENANT_WEIGHT_MAX, &u) != 0 || u == 0)
            return -1;
        c->id.qos_weight = (int)u;
        return 0;
    case SHOAL_TENANT_CRED_F_EXPIRES:
        *why = "not 0 (never) or unix seconds without leading zeros";
        if (shoal_tenant_cred_parse_uint(v, len, INT64_MAX, &u) != 0)
            return -1;
        c->expires = (int64_t)u;
        return 0;
    case SHOAL_TENANT_CRED_F_MAC:
        *why = "not 64 lowercase hex digits";
        return shoal_tenant_cred_parse_hex(v, len, c->mac);
    default:
        *why = "unknown";
        return -1;
    }
}

static int shoal_tenant_cred_field_lookup(const char *key, size_t len)
{
    int k;

    for (k = 0; k < SHOAL_TENANT_CRED_NFIELDS; k++) {
        if (strlen(shoal_tenant_cred_fields[k]) == len &&
            memcmp(shoal_tenant_cred_fields[k], key, len) == 0)
            return k;
    }
    return -1;
}

/* Reasons name fields and positions, never values: the text holds a MAC (a bearer token). */
shoal_status_t shoal_tenant_cred_parse_quiet(const char *text, shoal_tenant_cred_t *cred,
                                             char *why, size_t why_len)
{
    const size_t plen = strlen(SHOAL_TENANT_CRED_PREFIX);
    shoal_tenant_cred_t c;
    const char *p, *end, *sep, *eq, *fwhy = NULL;
    size_t len;
    int i, k;

    if (text == NULL || cred == NULL) {
        shoal_tenant_cred_why(why, why_len, "nothing to parse");
        return SHOAL_ERR_INVALID_ARG;
    }
    len = strnlen(text, SHOAL_TENANT_CRED_TEXT_MAX);
    if (len >= SHOAL_TENANT_CRED_TEXT_MAX) {
        shoal_tenant_cred_why(why, why_len, "longer than %d bytes",
                              SHOAL_TENANT_CRED_TEXT_MAX - 1);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (len < plen || memcmp(text, SHOAL_TENANT_CRED_PREFIX, plen) != 0) {
        shoal_tenant_cred_why(why, why_len,
                              "does not start with '%s' (not a credential, or another version)",
                              SHOAL_TENANT_CRED_PREFIX);
        return SHOAL_ERR_INVALID_ARG;
    }
    memset(&c, 0, sizeof(c));
    p = text + plen;
    end = text + len;
    for (i = 0; i < SHOAL_TENANT_CRED_NFIELDS; i++) {
        const char *want = shoal_tenant_cred_fields[i];

        sep = memchr(p, ';', (size_t)(end - p));
        if (sep == NULL)
            sep = end;
        eq = memchr(p, '=', (size_t)(sep - p));
        k = eq != NULL ? shoal_tenant_cred_field_lookup(p, (size_t)(eq - p)) : -1;
        if (k < 0) {
            shoal_tenant_cred_why(why, why_len, "field %d is not a known 'name=value' "
                                  "(expected '%s=')", i + 1, want);
            goto err;
        }
        if (k < i) {
            shoal_tenant_cred_why(why, why_len, "field '%s' appears twice",
                                  shoal_tenant_cred_fields[k]);
            goto err;
        }
        if (k > i) {
            shoal_tenant_cred_why(why, why_len, "field '%s' is missing or out of order "
                                  "(found '%s' in its place)", want, shoal_tenant_cred_fields[k]);
            goto err;
        }
        if (shoal_tenant_cred_parse_field(k, eq + 1, (size_t)(sep - eq - 1), &c, &fwhy) != 0) {
            shoal_tenant_cred_why(why, why_len, "field '%s' is %s", want, fwhy);
            goto err;
        }
        if (i == SHOAL_TENANT_CRED_NFIELDS - 1) {
            if (sep != end) {
                shoal_tenant_cred_why(why, why_len, "%zu bytes of trailing data after the mac",
                                      (size_t)(end - sep));
                goto err;
            }
        } else if (sep == end) {
            shoal_tenant_cred_why(why, why_len, "truncated after field '%s' ('%s' and later "
                                  "fields are missing)", want, shoal_tenant_cred_fields[i + 1]);
            goto err;
        } else {
            p = sep + 1;
        }
    }
    *cred = c;
    shoal_secret_wipe(&c, sizeof(c));
    return SHOAL_OK;

err:
    shoal_secret_wipe(&c, sizeof(c));
    return SHOAL_ERR_INVALID_ARG;
}

shoal_status_t shoal_tenant_cred_parse(const char *text, shoal_tenant_cred_t *cred)
{
    char why[SHOAL_TENANT_CRED_WHY_MAX];
    shoal_status_t st = shoal_tenant_cred_parse_quiet(text, cred, why, sizeof(why));

    if (st != SHOAL_OK)
        shoal_error(TENANT, "credential: %s", why);
    return st;
}

shoal_status_t shoal_tenant_cred_format(const shoal_tenant_cred_t *cred, char *buf, size_t len)
{
    char hex[2 * SHOAL_HMAC_BYTES + 1];
    int n, i;

    SHOAL_CHECK(shoal_tenant_cred_check(cred, "format"));
    if (buf == NULL) {
        shoal_error(TENANT, "cannot format the credential: no buffer");
        return SHOAL_ERR_INVALID_ARG;
    }
    for (i = 0; i < SHOAL_HMAC_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", cred->mac[i]);
    n = snprintf(buf, len,
                 "%stenant=%s;job=%s;epoch=%" PRIu64 ";class=%s;weight=%d;expires=%" PRId64
                 ";mac=%s", SHOAL_TENANT_CRED_PREFIX, cred->id.tenant, cred->id.job,
                 cred->id.epoch, shoal_tenant_cred_classes[cred->id.qos_class],
                 cred->id.qos_weight, cred->expires, hex);
    shoal_secret_wipe(hex, sizeof(hex));
    if (n < 0 || (size_t)n >= len) {
        if (len > 0)
            shoal_secret_wipe(buf, len);
        shoal_error(TENANT, "cannot format the credential: %d bytes do not fit in %zu", n, len);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

/* ---- keys, MAC, expiry --------------------------------------------------------------------- */

shoal_status_t shoal_tenant_key_derive(const uint8_t *master, size_t master_len,
                                       const char *tenant, uint8_t key[SHOAL_HMAC_BYTES])
{
    size_t tlen = tenant != NULL ? strnlen(tenant, SHOAL_TENANT_NAME_MAX) : 0;

    if (master == NULL || master_len < SHOAL_TENANT_MASTER_MIN || key == NULL) {
        shoal_error(TENANT, "cannot derive a tenant key: master key of %zu bytes (at least %d "
                    "needed)", master != NULL ? master_len : 0, SHOAL_TENANT_MASTER_MIN);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (!shoal_tenant_cred_name_ok(tenant, tlen)) {
        shoal_error(TENANT, "cannot derive a tenant key: the tenant name is empty, too long or "
                    "not printable ASCII without ' ;='");
        return SHOAL_ERR_INVALID_ARG;
    }
    return shoal_kdf(master, master_len, "tenant", tenant, tlen, key);
}

shoal_status_t shoal_tenant_cred_sign(shoal_tenant_cred_t *cred,
                                      const uint8_t key[SHOAL_HMAC_BYTES])
{
    uint8_t mac[SHOAL_HMAC_BYTES];
    shoal_status_t st;

    SHOAL_CHECK(shoal_tenant_cred_check(cred, "sign"));
    if (key == NULL) {
        shoal_error(TENANT, "cannot sign the credential: no key");
        return SHOAL_ERR_INVALID_ARG;
    }
    st = shoal_tenant_cred_mac(cred, key, mac);
    if (st == SHOAL_OK)
        memcpy(cred->mac, mac, sizeof(mac));
    shoal_secret_wipe(mac, sizeof(mac));
    return st;
}

shoal_status_t shoal_tenant_cred_verify_quiet(const shoal_tenant_cred_t *cred,
                                              const uint8_t key[SHOAL_HMAC_BYTES], int64_t now,
                                              char *why, size_t why_len)
{
    const char *bad = shoal_tenant_cred_check_why(cred);
    uint8_t mac[SHOAL_HMAC_BYTES];
    shoal_status_t st;
    int same;

    if (bad != NULL || key == NULL) {
        shoal_tenant_cred_why(why, why_len, "cannot verify the credential: %s",
                              bad != NULL ? bad : "no key");
        return SHOAL_ERR_INVALID_ARG;
    }
    st = shoal_tenant_cred_mac(cred, key, mac);
    if (st != SHOAL_OK) {
        shoal_tenant_cred_why(why, why_len,
                              "cannot verify the credential: its MAC cannot be computed");
        return st;
    }
    same = shoal_memeq_ct(mac, cred->mac, sizeof(mac));
    shoal_secret_wipe(mac, sizeof(mac));
    /* The MAC first: an altered expiry is a forgery, not an expired credential. */
    if (!same) {
        shoal_tenant_cred_why(why, why_len,
                              "credential of tenant '%s' job '%s' epoch %" PRIu64 ": the MAC "
                              "does not match (fields altered, or signed with another key)",
                              cred->id.tenant, cred->id.job, cred->id.epoch);
        return SHOAL_ERR_AUTH;
    }
    if (cred->expires != 0 && now > cred->expires) {
        shoal_tenant_cred_why(why, why_len,
                              "credential of tenant '%s' job '%s' epoch %" PRIu64
                              " expired at %" PRId64 " (%" PRId64 " s ago)",
                              cred->id.tenant, cred->id.job, cred->id.epoch, cred->expires,
                              now - cred->expires);
        return SHOAL_ERR_PERMISSION;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_tenant_cred_verify(const shoal_tenant_cred_t *cred,
                                        const uint8_t key[SHOAL_HMAC_BYTES], int64_t now)
{
    char why[SHOAL_TENANT_CRED_WHY_MAX];
    shoal_status_t st = shoal_tenant_cred_verify_quiet(cred, key, now, why, sizeof(why));

    /* a failure of libcrypto was logged where it was detected (shoal_hmac) */
    if (st == SHOAL_ERR_INVALID_ARG || st == SHOAL_ERR_AUTH || st == SHOAL_ERR_PERMISSION)
        shoal_error(TENANT, "%s", why);
    return st;
}

/* ---- the credential as identity ------------------------------------------------------------ */

shoal_status_t shoal_tenant_cred_apply(const shoal_tenant_cred_t *cred, shoal_tenant_id_t *id)
{
    shoal_tenant_id_t out;
    int64_t now = shoal_tenant_cred_now();

    SHOAL_CHECK(shoal_tenant_cred_check(cred, "apply"));
    if (id == NULL || id->qos_class < SHOAL_QOS_DEFAULT || id->qos_class > SHOAL_QOS_SPOT) {
        shoal_error(TENANT, "cannot apply the credential: no identity, or a configured class "
                    "out of range");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (id->tenant[0] != '\0' && strncmp(id->tenant, cred->id.tenant, SHOAL_TENANT_NAME_MAX) != 0) {
        shoal_error(TENANT, "this rank is configured for tenant '%.*s' but its credential names "
                    "tenant '%s'", SHOAL_TENANT_NAME_MAX - 1, id->tenant, cred->id.tenant);
        return SHOAL_ERR_PERMISSION;
    }
    if (id->job[0] != '\0' && strncmp(id->job, cred->id.job, SHOAL_TENANT_NAME_MAX) != 0) {
        shoal_error(TENANT, "this rank is configured for job '%.*s' but its credential (tenant "
                    "'%s') names job '%s'", SHOAL_TENANT_NAME_MAX - 1, id->job, cred->id.tenant,
                    cred->id.job);
        return SHOAL_ERR_PERMISSION;
    }
    if (id->epoch != 0 && id->epoch != cred->id.epoch) {
        shoal_error(TENANT, "this rank is configured for epoch %" PRIu64 " of job '%s' but its "
                    "credential names epoch %" PRIu64 " (a credential of another run)", id->epoch,
                    cred->id.job, cred->id.epoch);
        return SHOAL_ERR_PERMISSION;
    }
    if (cred->expires != 0 && now > cred->expires) {
        shoal_error(TENANT, "the credential of tenant '%s' job '%s' expired at %" PRId64 " (%"
                    PRId64 " s ago)", cred->id.tenant, cred->id.job, cred->expires,
                    now - cred->expires);
        return SHOAL_ERR_PERMISSION;
    }
    out = cred->id;
    /* A configured class or weight may only lower what the provider granted. */
    if (id->qos_class != SHOAL_QOS_DEFAULT && id->qos_class < cred->id.qos_class)
        shoal_warn(TENANT, "configured QoS class %s is above the credential's %s: using %s",
                   shoal_tenant_cred_class_name(id->qos_class),
                   shoal_tenant_cred_class_name(cred->id.qos_class),
                   shoal_tenant_cred_class_name(cred->id.qos_class));
    else if (id->qos_class != SHOAL_QOS_DEFAULT)
        out.qos_class = id->qos_class;
    if (id->qos_weight > cred->id.qos_weight)
        shoal_warn(TENANT, "configured QoS weight %d is above the credential's %d: using %d",
                   id->qos_weight, cred->id.qos_weight, cred->id.qos_weight);
    else if (id->qos_weight > 0)
        out.qos_weight = id->qos_weight;
    out.from_credential = 1;
    *id = out;
    shoal_info(TENANT, "identity from the credential: tenant '%s' job '%s' epoch %" PRIu64
               " class %s weight %d", out.tenant, out.job, out.epoch,
               shoal_tenant_cred_class_name(out.qos_class), out.qos_weight);
    return SHOAL_OK;
}

/* ---- SHOAL_CREDENTIAL / SHOAL_CREDENTIAL_FILE ---------------------------------------------- */

/* Reads one line (an optional trailing newline is dropped) of at most
 * SHOAL_TENANT_CRED_TEXT_MAX - 1 bytes into buf. */
static shoal_status_t shoal_tenant_cred_read_file(const char *path,
                                                  char buf[SHOAL_TENANT_CRED_TEXT_MAX + 2])
{
    struct stat st;
    size_t n = 0;
    ssize_t ret;
    int fd;

    /* O_NONBLOCK: a FIFO without a writer held shoal_comm_init in open() for ever; it opens at
     * once now and is refused below as not a regular file (O_NOCTTY: nor may a tty become the
     * process's controlling terminal). Reads of a regular file ignore the flag. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        shoal_error(TENANT, "open(SHOAL_CREDENTIAL_FILE %s) failed: %s", path, strerror(errno));
        return SHOAL_ERR_INVALID_ARG;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        shoal_error(TENANT, "SHOAL_CREDENTIAL_FILE %s is not a regular file", path);
        close(fd);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (st.st_uid != 0 && st.st_uid != geteuid()) {
        /* Another user's file: theirs to rewrite, or made by them where the provider's file
         * was missing (a stale path in /tmp). With their credential in it this rank took
         * their identity, and they, holding the credential its join secret is bound to,
         * could join the job with its unique id. Root's or this user's only. */
        shoal_error(TENANT, "SHOAL_CREDENTIAL_FILE %s belongs to uid %u, neither root nor this "
                    "user (uid %u)", path, (unsigned)st.st_uid, (unsigned)geteuid());
        close(fd);
        return SHOAL_ERR_PERMISSION;
    }
    if ((st.st_mode & 002) != 0) {
        /* the same as another user's file: anyone may put their own credential in it (a mode
         * of 0602 was used, with a warning that it was readable). Group write stays a
         * warning: a umask of 002 (a user's private group) makes 0664 of '> cred'. */
        shoal_error(TENANT, "SHOAL_CREDENTIAL_FILE %s may be written by others (mode %04o): "
                    "chmod 600 it", path, (unsigned)(st.st_mode & 07777));
        close(fd);
        return SHOAL_ERR_PERMISSION;
    }
    if ((st.st_mode & 077) != 0)
        shoal_warn_once(TENANT, "SHOAL_CREDENTIAL_FILE %s is open to group or others (mode "
                        "%04o; chmod 600 it): the credential is a bearer token", path,
                        (unsigned)(st.st_mode & 07777));
    while (n < SHOAL_TENANT_CRED_TEXT_MAX + 1) {
        ret = read(fd, buf + n, SHOAL_TENANT_CRED_TEXT_MAX + 1 - n);
        if (ret < 0 && errno == EINTR)
            continue;
        if (ret < 0) {
            shoal_error(TENANT, "read(SHOAL_CREDENTIAL_FILE %s) failed: %s", path,
                        strerror(errno));
            close(fd);
            return SHOAL_ERR_INVALID_ARG;
        }
        if (ret == 0)
            break;
        n += (size_t)ret;
    }
    close(fd);
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n >= SHOAL_TENANT_CRED_TEXT_MAX || memchr(buf, '\0', n) != NULL ||
        memchr(buf, '\n', n) != NULL) {
        shoal_error(TENANT, "SHOAL_CREDENTIAL_FILE %s does not hold one credential line", path);
        return SHOAL_ERR_INVALID_ARG;
    }
    buf[n] = '\0';
    return SHOAL_OK;
}

shoal_status_t shoal_tenant_secret_bind(const shoal_tenant_cred_t *cred, uint8_t *secret,
                                        size_t len)
{
    uint8_t out[SHOAL_HMAC_BYTES];
    shoal_status_t st;

    if (len != sizeof(out))
        return SHOAL_ERR_INVALID_ARG;
    if (cred == NULL)
        return SHOAL_OK;
    st = shoal_kdf(cred->mac, sizeof(cred->mac), "job secret", secret, len, out);
    if (st == SHOAL_OK)
        memcpy(secret, out, len);
    shoal_secret_wipe(out, sizeof(out));
    return st;
}

shoal_status_t shoal_tenant_cred_load(shoal_tenant_cred_t *cred, int *found_p)
{
    const shoal_tenant_cred_config_t *cfg = &shoal_tenant_cred_config;
    int have_text, have_file;
    char buf[SHOAL_TENANT_CRED_TEXT_MAX + 2];
    shoal_status_t st;

    shoal_config_global_init();
    have_text = cfg->credential != NULL && cfg->credential[0] != '\0';
    have_file = cfg->credential_file != NULL && cfg->credential_file[0] != '\0';
    if (have_text && have_file) {
        shoal_error(TENANT, "SHOAL_CREDENTIAL and SHOAL_CREDENTIAL_FILE are both set: set one");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (!have_text && !have_file) {
        *found_p = 0;
        return SHOAL_OK;
    }
    if (have_text) {
        /* One trailing newline dropped, as from a file: the line shoal-cred issue prints,
         * passed whole (a Kubernetes secret made --from-file, an env file), was refused on
         * every rank as 'field mac is not 64 lowercase hex digits'. */
        size_t tl = strnlen(cfg->credential, SHOAL_TENANT_CRED_TEXT_MAX + 1);
        if (tl <= SHOAL_TENANT_CRED_TEXT_MAX && cfg->credential[tl - 1] == '\n') {
            memcpy(buf, cfg->credential, tl - 1);
            buf[tl - 1] = '\0';
            st = shoal_tenant_cred_parse(buf, cred);
        } else {
            st = shoal_tenant_cred_parse(cfg->credential, cred);
        }
    } else {
        st = shoal_tenant_cred_read_file(cfg->credential_file, buf);
        if (st == SHOAL_OK)
            st = shoal_tenant_cred_parse(buf, cred);
    }
    shoal_secret_wipe(buf, sizeof(buf));
    if (st == SHOAL_OK)
        *found_p = 1;
    return st;
}
