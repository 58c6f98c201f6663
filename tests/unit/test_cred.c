/* Provider-signed job credentials (src/tenant/cred.c): key derivation, the text form and its
 * strict parser, MAC and expiry, the credential as identity, SHOAL_CREDENTIAL(_FILE), and
 * that no log line ever shows a MAC. */
#include "shoal.h"
#include "tenant/tenant.h"
#include "tests/tap.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint8_t test_master[32];
static uint8_t test_key[SHOAL_HMAC_BYTES];  /* tenant "acme" */
static char test_log_path[256];

static int64_t test_now(void)
{
    return (int64_t)time(NULL);
}

static void test_cred_make(shoal_tenant_cred_t *c, const char *tenant, const char *job,
                           uint64_t epoch, int qos_class, int weight, int64_t expires)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->id.tenant, sizeof(c->id.tenant), "%s", tenant);
    snprintf(c->id.job, sizeof(c->id.job), "%s", job);
    c->id.epoch = epoch;
    c->id.qos_class = qos_class;
    c->id.qos_weight = weight;
    c->expires = expires;
}

static int test_cred_same(const shoal_tenant_cred_t *a, const shoal_tenant_cred_t *b)
{
    return strcmp(a->id.tenant, b->id.tenant) == 0 && strcmp(a->id.job, b->id.job) == 0 &&
           a->id.epoch == b->id.epoch && a->id.qos_class == b->id.qos_class &&
           a->id.qos_weight == b->id.qos_weight && a->expires == b->expires &&
           memcmp(a->mac, b->mac, sizeof(a->mac)) == 0;
}

/* A signed credential of tenant acme in text form. */
static void test_cred_text(char *buf, size_t len, int64_t expires)
{
    shoal_tenant_cred_t c;

    test_cred_make(&c, "acme", "train-42", 7, SHOAL_QOS_BURSTABLE, 2, expires);
    if (shoal_tenant_cred_sign(&c, test_key) != SHOAL_OK ||
        shoal_tenant_cred_format(&c, buf, len) != SHOAL_OK)
        tap_bail("cannot sign and format a credential");
}

static void test_keys(void)
{
    uint8_t k1[SHOAL_HMAC_BYTES], k2[SHOAL_HMAC_BYTES], k3[SHOAL_HMAC_BYTES];
    uint8_t other[32];

    memcpy(other, test_master, sizeof(other));
    other[0] ^= 1;
    tap_is_int(shoal_tenant_key_derive(test_master, 32, "acme", k1), SHOAL_OK, "derive acme");
    tap_is_int(shoal_tenant_key_derive(test_master, 32, "acme", k2), SHOAL_OK, "derive again");
    tap_ok(memcmp(k1, k2, sizeof(k1)) == 0, "a tenant's key is deterministic");
    tap_is_int(shoal_tenant_key_derive(test_master, 32, "acmf", k2), SHOAL_OK, "derive acmf");
    tap_is_int(shoal_tenant_key_derive(other, 32, "acme", k3), SHOAL_OK, "derive, other master");
    tap_ok(memcmp(k1, k2, sizeof(k1)) != 0 && memcmp(k1, k3, sizeof(k1)) != 0 &&
               memcmp(k1, test_master, sizeof(k1)) != 0,
           "keys differ per tenant and per master, and are not the master");
    tap_is_int(shoal_tenant_key_derive(test_master, 8, "acme", k2), SHOAL_ERR_INVALID_ARG,
               "an 8-byte master key is refused");
    tap_is_int(shoal_tenant_key_derive(test_master, 32, "", k2), SHOAL_ERR_INVALID_ARG,
               "an empty tenant name is refused");
    tap_is_int(shoal_tenant_key_derive(test_master, 32, "a;b", k2), SHOAL_ERR_INVALID_ARG,
               "a tenant name with ';' is refused");
}

static void test_round_trip(void)
{
    shoal_tenant_cred_t c, p;
    char text[SHOAL_TENANT_CRED_TEXT_MAX], text2[SHOAL_TENANT_CRED_TEXT_MAX];
    int64_t exp = test_now() + 3600;
    char want[200];

    test_cred_make(&c, "acme", "train-42", 7, SHOAL_QOS_BURSTABLE, 2, exp);
    tap_is_int(shoal_tenant_cred_sign(&c, test_key), SHOAL_OK, "sign");
    tap_is_int(shoal_tenant_cred_format(&c, text, sizeof(text)), SHOAL_OK, "format");
    snprintf(want, sizeof(want),
             "shoal-cred-v1:tenant=acme;job=train-42;epoch=7;class=burstable;weight=2;"
             "expires=%" PRId64 ";mac=", exp);
    tap_ok(strncmp(text, want, strlen(want)) == 0 && strlen(text) == strlen(want) + 64,
           "text form: %s<64 hex>", want);
    tap_is_int(shoal_tenant_cred_parse(text, &p), SHOAL_OK, "parse");
    tap_ok(test_cred_same(&c, &p), "parse gives back every field and the mac");
    tap_is_int(shoal_tenant_cred_verify(&p, test_key, test_now()), SHOAL_OK, "verify");
    tap_is_int(shoal_tenant_cred_format(&p, text2, sizeof(text2)), SHOAL_OK, "format again");
    tap_is_str(text2, text, "one credential, one text");
    tap_is_int(shoal_tenant_cred_format(&p, text2, 100), SHOAL_ERR_INVALID_ARG,
               "a buffer too small is an error");

    /* expires 0 = never; guaranteed and spot classes; the largest epoch and weight */
    test_cred_make(&c, "t", "j", UINT64_MAX, SHOAL_QOS_GUARANTEED, SHOAL_TENANT_WEIGHT_MAX, 0);
    tap_ok(shoal_tenant_cred_sign(&c, test_key) == SHOAL_OK &&
               shoal_tenant_cred_format(&c, text, sizeof(text)) == SHOAL_OK &&
               shoal_tenant_cred_parse(text, &p) == SHOAL_OK && test_cred_same(&c, &p) &&
               shoal_tenant_cred_verify(&p, test_key, INT64_MAX) == SHOAL_OK,
           "epoch 2^64-1, weight max, guaranteed, never expires: round trip and valid");
    test_cred_make(&c, "t", "j", 0, SHOAL_QOS_SPOT, 1, INT64_MAX);
    tap_ok(shoal_tenant_cred_sign(&c, test_key) == SHOAL_OK &&
               shoal_tenant_cred_format(&c, text, sizeof(text)) == SHOAL_OK &&
               shoal_tenant_cred_parse(text, &p) == SHOAL_OK && test_cred_same(&c, &p),
           "spot, expires 2^63-1: round trip");
    test_cred_make(&c, "acme", "", 0, SHOAL_QOS_SPOT, 1, 0);
    tap_is_int(shoal_tenant_cred_sign(&c, test_key), SHOAL_ERR_INVALID_ARG,
               "a credential without a job cannot be signed");
    test_cred_make(&c, "acme", "j", 0, SHOAL_QOS_DEFAULT, 1, 0);
    tap_is_int(shoal_tenant_cred_sign(&c, test_key), SHOAL_ERR_INVALID_ARG,
               "a credential must name a class");
}

/* Replaces the first "from" after the prefix by "to" in text (into out). */
static void test_replace(const char *text, const char *from, const char *to, char *out,
                         size_t len)
{
    const char *at = strstr(text, from);

    if (at == NULL)
        tap_bail("'%s' not in the credential", from);
    snprintf(out, len, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
}

static void test_tamper(void)
{
    static const char *const edits[][2] = {
        {"tenant=acme", "tenant=acmf"}, {"job=train-42", "job=train-43"},
        {"epoch=7", "epoch=8"},         {"class=burstable", "class=guaranteed"},
        {"weight=2", "weight=3"},       {"expires=", "expires=1"},
    };
    char text[SHOAL_TENANT_CRED_TEXT_MAX], bad[SHOAL_TENANT_CRED_TEXT_MAX];
    uint8_t other[SHOAL_HMAC_BYTES];
    shoal_tenant_cred_t c;
    size_t i, n;

    test_cred_text(text, sizeof(text), test_now() + 3600);
    for (i = 0; i < SHOAL_ARRAY_SIZE(edits); i++) {
        test_replace(text, edits[i][0], edits[i][1], bad, sizeof(bad));
        tap_ok(shoal_tenant_cred_parse(bad, &c) == SHOAL_OK &&
                   shoal_tenant_cred_verify(&c, test_key, test_now()) == SHOAL_ERR_AUTH,
               "altered %s: parses, fails the MAC (AUTH)", edits[i][0]);
    }
    /* one bit of the mac */
    n = strlen(text);
    snprintf(bad, sizeof(bad), "%s", text);
    bad[n - 1] = bad[n - 1] == '0' ? '1' : '0';
    tap_ok(shoal_tenant_cred_parse(bad, &c) == SHOAL_OK &&
               shoal_tenant_cred_verify(&c, test_key, test_now()) == SHOAL_ERR_AUTH,
           "altered mac: AUTH");
    /* an expired credential whose expiry was pushed out: a forgery, not an expiry */
    test_cred_text(text, sizeof(text), 1000);
    test_replace(text, "expires=1000", "expires=0", bad, sizeof(bad));
    tap_ok(shoal_tenant_cred_parse(bad, &c) == SHOAL_OK &&
               shoal_tenant_cred_verify(&c, test_key, test_now()) == SHOAL_ERR_AUTH,
           "an expired credential made to never expire: AUTH");

    test_cred_text(text, sizeof(text), 0);
    tap_is_int(shoal_tenant_cred_parse(text, &c), SHOAL_OK, "parse");
    shoal_tenant_key_derive(test_master, 32, "other", other);
    tap_is_int(shoal_tenant_cred_verify(&c, other, test_now()), SHOAL_ERR_AUTH,
               "another tenant's key: AUTH");
    memcpy(other, test_key, sizeof(other));
    other[31] ^= 0x80;
    tap_is_int(shoal_tenant_cred_verify(&c, other, test_now()), SHOAL_ERR_AUTH,
               "a key one bit off: AUTH");
    tap_is_int(shoal_tenant_cred_verify(&c, test_master, test_now()), SHOAL_ERR_AUTH,
               "the master key itself does not verify a credential: AUTH");
}

static void test_expiry(void)
{
    shoal_tenant_cred_t c;
    int64_t now = test_now();

    test_cred_make(&c, "acme", "train-42", 7, SHOAL_QOS_BURSTABLE, 2, now - 10);
    shoal_tenant_cred_sign(&c, test_key);
    tap_is_int(shoal_tenant_cred_verify(&c, test_key, now), SHOAL_ERR_PERMISSION,
               "expired 10 s ago: PERMISSION");
    c.expires = now + 100;
    shoal_tenant_cred_sign(&c, test_key);
    tap_is_int(shoal_tenant_cred_verify(&c, test_key, now + 100), SHOAL_OK,
               "valid up to its expiry second");
    tap_is_int(shoal_tenant_cred_verify(&c, test_key, now + 101), SHOAL_ERR_PERMISSION,
               "one second after: PERMISSION");
}

static void test_id_make(shoal_tenant_id_t *id, const char *tenant, const char *job,
                         uint64_t epoch, int qos_class, int weight)
{
    memset(id, 0, sizeof(*id));
    snprintf(id->tenant, sizeof(id->tenant), "%s", tenant);
    snprintf(id->job, sizeof(id->job), "%s", job);
    id->epoch = epoch;
    id->qos_class = qos_class;
    id->qos_weight = weight;
}

static void test_apply(void)
{
    shoal_tenant_cred_t c;
    shoal_tenant_id_t id, keep;

    test_cred_make(&c, "acme", "train-42", 7, SHOAL_QOS_BURSTABLE, 4, test_now() + 3600);
    shoal_tenant_cred_sign(&c, test_key);

    test_id_make(&id, "", "", 0, SHOAL_QOS_DEFAULT, 0);
    tap_is_int(shoal_tenant_cred_apply(&c, &id), SHOAL_OK, "apply to an unset identity");
    tap_ok(strcmp(id.tenant, "acme") == 0 && strcmp(id.job, "train-42") == 0 && id.epoch == 7 &&
               id.qos_class == SHOAL_QOS_BURSTABLE && id.qos_weight == 4 &&
               id.from_credential == 1,
           "the identity is the credential's (tenant, job, epoch, class, weight, from_credential)");

    test_id_make(&id, "acme", "train-42", 7, SHOAL_QOS_DEFAULT, 0);
    tap_is_int(shoal_tenant_cred_apply(&c, &id), SHOAL_OK, "the same tenant, job and epoch");

    test_id_make(&id, "globex", "", 0, SHOAL_QOS_DEFAULT, 0);
    keep = id;
    tap_is_int(shoal_tenant_cred_apply(&c, &id), SHOAL_ERR_PERMISSION,
               "configured for another tenant: PERMISSION");
    tap_ok(memcmp(&id, &keep, sizeof(id)) == 0, "the identity is untouched on failure");
    test_id_make(&id, "acme", "train-43", 0, SHOAL_QOS_DEFAULT, 0);
    tap_is_int(shoal_tenant_cred_apply(&c, &id), SHOAL_ERR_PERMISSION,
               "configured for another job: PERMISSION");
    test_id_make(&id, "", "train-43", 0, SHOAL_QOS_DEFAULT, 0);
    tap_is_int(shoal_tenant_cred_apply(&c, &id), SHOAL_ERR_PERMISSION,
               "another job, tenant unset: PERMISSION");
    test_id_make(&id, "acme", "train-42", 8, SHOAL_QOS_DEFAULT, 0);
    tap_is_int(shoal_tenant_cred_apply(&c, &id), SHOAL_ERR_PERMISSION,
               "configured for another epoch: PERMISSION");

    test_id_make(&id, "", "", 0, SHOAL_QOS_SPOT, 0);
    tap_ok(shoal_tenant_cred_apply(&c, &id) == SHOAL_OK && id.qos_class == SHOAL_QOS_SPOT,
           "a lower configured class (spot under burstable) is taken");
    test_id_make(&id, "", "", 0, SHOAL_QOS_BURSTABLE, 0);
    tap_ok(shoal_tenant_cred_apply(&c, &id) == SHOAL_OK && id.qos_class == SHOAL_QOS_BURSTABLE,
           "the same class is taken");
    test_id_make(&id, "", "", 0, SHOAL_QOS_GUARANTEED, 0);
    tap_ok(shoal_tenant_cred_apply(&c, &id) == SHOAL_OK && id.qos_class == SHOAL_QOS_BURSTABLE,
           "a higher configured class (guaranteed) is lowered to the credential's");
    test_id_make(&id, "", "", 0, SHOAL_QOS_DEFAULT, 2);
    tap_ok(shoal_tenant_cred_apply(&c, &id) == SHOAL_OK && id.qos_weight == 2,
           "a lower configured weight (2 under 4) is taken");
    test_id_make(&id, "", "", 0, SHOAL_QOS_DEFAULT, 9);
    tap_ok(shoal_tenant_cred_apply(&c, &id) == SHOAL_OK && id.qos_weight == 4,
           "a higher configured weight (9) is lowered to the credential's 4");

    c.expires = test_now() - 1;
    shoal_tenant_cred_sign(&c, test_key);
    test_id_make(&id, "acme", "train-42", 7, SHOAL_QOS_DEFAULT, 0);
    tap_is_int(shoal_tenant_cred_apply(&c, &id), SHOAL_ERR_PERMISSION,
               "an expired credential: PERMISSION");
}

static void test_malformed(void)
{
    char text[SHOAL_TENANT_CRED_TEXT_MAX], bad[2 * SHOAL_TENANT_CRED_TEXT_MAX], hex[65];
    shoal_tenant_cred_t c, keep;
    size_t n, i;
    int all = 1;
    static const char *const cases[][3] = {
        /* what, from, to */
        {"duplicate field", "job=train-42;", "job=train-42;job=train-42;"},
        {"duplicate tenant", "job=train-42;", "tenant=acme;"},
        {"fields out of order", "tenant=acme;job=train-42;", "job=train-42;tenant=acme;"},
        {"unknown field", "epoch=7;", "epoch=7;color=red;"},
        {"missing field", "weight=2;", ""},
        {"missing mac", ";mac=", ";"},
        {"empty mac", ";mac=", ";mac=;"},
        {"field without '='", "epoch=7", "epoch7"},
        {"empty tenant", "tenant=acme", "tenant="},
        {"overlong tenant (64)", "tenant=acme",
         "tenant=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
        {"overlong job (64)", "job=train-42",
         "job=jjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjj"},
        {"space in a name", "job=train-42", "job=train 42"},
        {"control byte in a name", "job=train-42", "job=train\00142"},
        {"non-ASCII name", "tenant=acme", "tenant=acm\303\251"},
        {"leading zero in epoch", "epoch=7", "epoch=07"},
        {"sign in epoch", "epoch=7", "epoch=+7"},
        {"epoch of 2^64", "epoch=7", "epoch=18446744073709551616"},
        {"class not known", "class=burstable", "class=gold"},
        {"class in upper case", "class=burstable", "class=Burstable"},
        {"class default", "class=burstable", "class=default"},
        {"weight 0", "weight=2", "weight=0"},
        {"weight above the maximum", "weight=2", "weight=1000001"},
        {"negative expiry", "expires=", "expires=-"},
        {"expiry of 2^63", "expires=", "expires=9223372036854775808;x"},
        {"another version", "shoal-cred-v1:", "shoal-cred-v2:"},
        {"no prefix", "shoal-cred-v1:", ""},
        {"space after the prefix", "shoal-cred-v1:", "shoal-cred-v1: "},
    };

    test_cred_text(text, sizeof(text), 1798761600);
    tap_is_int(shoal_tenant_cred_parse(text, &c), SHOAL_OK, "the good credential parses");
    keep = c;
    for (i = 0; i < SHOAL_ARRAY_SIZE(cases); i++) {
        test_replace(text, cases[i][1], cases[i][2], bad, sizeof(bad));
        tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "%s: INVALID_ARG",
                   cases[i][0]);
    }
    tap_ok(test_cred_same(&c, &keep), "the output is untouched by failed parses");

    /* the mac: 64 lowercase hex digits exactly */
    n = strlen(text);
    snprintf(hex, sizeof(hex), "%s", text + n - 64);
    snprintf(bad, sizeof(bad), "%.*sG%s", (int)(n - 64), text, hex + 1);
    tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "'G' in the mac");
    for (i = 0; i < 64 && (hex[i] < 'a' || hex[i] > 'f'); i++)
        ;
    snprintf(bad, sizeof(bad), "%s", text);
    if (i < 64)
        bad[n - 64 + i] = (char)(hex[i] - 'a' + 'A');
    tap_is_int(shoal_tenant_cred_parse(bad, &c), i < 64 ? SHOAL_ERR_INVALID_ARG : SHOAL_OK,
               "upper-case hex in the mac");
    snprintf(bad, sizeof(bad), "%.*s", (int)(n - 1), text);
    tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "63 hex digits");
    snprintf(bad, sizeof(bad), "%s0", text);
    tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "65 hex digits");

    /* trailing garbage */
    snprintf(bad, sizeof(bad), "%s\n", text);
    tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "a trailing newline");
    snprintf(bad, sizeof(bad), "%s;", text);
    tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "a trailing ';'");
    snprintf(bad, sizeof(bad), "%s;mac=%s", text, hex);
    tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "a second mac");
    snprintf(bad, sizeof(bad), " %s", text);
    tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "a leading space");

    /* every truncation */
    for (i = 0; i < n; i++) {
        snprintf(bad, sizeof(bad), "%.*s", (int)i, text);
        if (shoal_tenant_cred_parse(bad, &c) != SHOAL_ERR_INVALID_ARG) {
            tap_diag("the first %zu bytes parse", i);
            all = 0;
        }
    }
    tap_ok(all, "each of the %zu truncations is INVALID_ARG", n);

    /* overlong input (no NUL within the limit) */
    memset(bad, 'a', sizeof(bad) - 1);
    bad[sizeof(bad) - 1] = '\0';
    memcpy(bad, "shoal-cred-v1:", 14);
    tap_is_int(shoal_tenant_cred_parse(bad, &c), SHOAL_ERR_INVALID_ARG, "1023 bytes of input");
    tap_is_int(shoal_tenant_cred_parse(NULL, &c), SHOAL_ERR_INVALID_ARG, "NULL text");
    tap_is_int(shoal_tenant_cred_parse("", &c), SHOAL_ERR_INVALID_ARG, "empty text");
}

static void test_load(void)
{
    char text[SHOAL_TENANT_CRED_TEXT_MAX], path[64], line[SHOAL_TENANT_CRED_TEXT_MAX + 8];
    shoal_tenant_cred_t c;
    int found = -1, fd;

    tap_ok(shoal_tenant_cred_load(&c, &found) == SHOAL_OK && found == 0,
           "no SHOAL_CREDENTIAL: found 0");
    test_cred_text(text, sizeof(text), 0);
    shoal_tenant_cred_config.credential = text;
    tap_ok(shoal_tenant_cred_load(&c, &found) == SHOAL_OK && found == 1 &&
               strcmp(c.id.tenant, "acme") == 0 &&
               shoal_tenant_cred_verify(&c, test_key, test_now()) == SHOAL_OK,
           "SHOAL_CREDENTIAL: loaded and valid");

    /* The line shoal-cred issue prints, newline included, as a launcher passes a file's
     * content (a Kubernetes secret from --from-file, an env file): a file may end in one, the
     * variable was refused ('field mac is not 64 lowercase hex digits') on every rank. */
    snprintf(line, sizeof(line), "%s\n", text);
    shoal_tenant_cred_config.credential = line;
    memset(&c, 0, sizeof(c));
    tap_ok(shoal_tenant_cred_load(&c, &found) == SHOAL_OK && found == 1 &&
               shoal_tenant_cred_verify(&c, test_key, test_now()) == SHOAL_OK,
           "SHOAL_CREDENTIAL ending in a newline: loaded and valid");
    snprintf(line, sizeof(line), "%s\n\n", text);
    tap_is_int(shoal_tenant_cred_load(&c, &found), SHOAL_ERR_INVALID_ARG,
               "SHOAL_CREDENTIAL ending in two newlines: INVALID_ARG");
    shoal_tenant_cred_config.credential = text;

    snprintf(path, sizeof(path), "/tmp/test_cred.%d", (int)getpid());
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    snprintf(line, sizeof(line), "%s\n", text);
    if (fd < 0 || write(fd, line, strlen(line)) != (ssize_t)strlen(line))
        tap_bail("cannot write %s", path);
    close(fd);
    shoal_tenant_cred_config.credential_file = path;
    tap_is_int(shoal_tenant_cred_load(&c, &found), SHOAL_ERR_INVALID_ARG,
               "SHOAL_CREDENTIAL and SHOAL_CREDENTIAL_FILE both set: INVALID_ARG");
    shoal_tenant_cred_config.credential = NULL;
    memset(&c, 0, sizeof(c));
    tap_ok(shoal_tenant_cred_load(&c, &found) == SHOAL_OK && found == 1 &&
               shoal_tenant_cred_verify(&c, test_key, test_now()) == SHOAL_OK,
           "SHOAL_CREDENTIAL_FILE (a line ending in a newline): loaded and valid");
    /* Another user's file (theirs to rewrite, or made by them where the provider's was
     * missing): it was loaded, their credential this rank's identity. */
    if (geteuid() == 0) {
        if (chown(path, 65534, 65534) != 0)
            tap_bail("cannot chown %s", path);
        tap_is_int(shoal_tenant_cred_load(&c, &found), SHOAL_ERR_PERMISSION,
                   "SHOAL_CREDENTIAL_FILE of another user (uid 65534): PERMISSION");
        if (chown(path, 0, 0) != 0)
            tap_bail("cannot chown %s back", path);
    } else {
        tap_skip(1, "not root: no file of another user to try");
    }
    /* One that others may write is the same: used, with a warning that it was readable. */
    if (chmod(path, 0602) != 0)
        tap_bail("cannot chmod %s", path);
    tap_is_int(shoal_tenant_cred_load(&c, &found), SHOAL_ERR_PERMISSION,
               "SHOAL_CREDENTIAL_FILE others may write (mode 0602): PERMISSION");
    if (chmod(path, 0600) != 0)
        tap_bail("cannot chmod %s back", path);

    fd = open(path, O_WRONLY | O_APPEND);
    if (fd < 0 || write(fd, line, strlen(line)) != (ssize_t)strlen(line))
        tap_bail("cannot append to %s", path);
    close(fd);
    tap_is_int(shoal_tenant_cred_load(&c, &found), SHOAL_ERR_INVALID_ARG,
               "a file of two lines: INVALID_ARG");
    unlink(path);
    tap_is_int(shoal_tenant_cred_load(&c, &found), SHOAL_ERR_INVALID_ARG,
               "a missing file: INVALID_ARG");
    /* A FIFO nobody writes: open() waited for a writer for ever. The alarm ends the test
     * (a failure) instead of hanging the suite should that come back. */
    if (mkfifo(path, 0600) != 0)
        tap_bail("cannot make the FIFO %s", path);
    alarm(10);
    tap_is_int(shoal_tenant_cred_load(&c, &found), SHOAL_ERR_INVALID_ARG,
               "a FIFO without a writer: INVALID_ARG at once, no wait");
    alarm(0);
    unlink(path);
    shoal_tenant_cred_config.credential_file = NULL;
}

/* The opens of the file watched by inotify fd ifd since the last call. */
static int test_opens(int ifd)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int opens = 0;
    ssize_t n;

    while ((n = read(ifd, buf, sizeof(buf))) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            opens += (ev->mask & IN_OPEN) != 0;
            p += sizeof(*ev) + ev->len;
        }
    }
    return opens;
}

/* An id and an init read SHOAL_CREDENTIAL_FILE once each: the identity, the secret's binding
 * and the meter's registration take that reading. Each read it on its own (two opens for the
 * id, three for an init): a file the provider rewrote between them (a restart's new epoch)
 * gave a rank an identity of one credential and a secret bound to the other. */
static void test_read_once(void)
{
    char text[SHOAL_TENANT_CRED_TEXT_MAX], path[64], line[SHOAL_TENANT_CRED_TEXT_MAX + 8];
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t comm = NULL;
    shoal_uid_t uid;
    shoal_status_t st, st2 = SHOAL_ERR_INTERNAL;
    int fd, ifd, o1, o2;

    test_cred_text(text, sizeof(text), 0);
    snprintf(path, sizeof(path), "/tmp/test_cred_once.%d", (int)getpid());
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    snprintf(line, sizeof(line), "%s\n", text);
    if (fd < 0 || write(fd, line, strlen(line)) != (ssize_t)strlen(line))
        tap_bail("cannot write %s", path);
    close(fd);
    ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    /* with the closes: inotify merges an event into the same one still unread */
    if (ifd < 0 || inotify_add_watch(ifd, path, IN_OPEN | IN_CLOSE) < 0)
        tap_bail("inotify on %s: %s", path, strerror(errno));
    shoal_tenant_cred_config.credential_file = path;
    st = shoal_get_unique_id(&uid);
    o1 = test_opens(ifd);
    cfg.timeout_ms = 10000;
    if (st == SHOAL_OK) {
        st2 = shoal_comm_init(&comm, 1, 0, &uid, &cfg);
    }
    o2 = test_opens(ifd);
    tap_ok(st == SHOAL_OK && st2 == SHOAL_OK && o1 == 1 && o2 == 1,
           "the id (%s) and the init (%s) read the credential file once each: %d and %d "
           "opens", shoal_status_name(st), shoal_status_name(st2), o1, o2);
    if (comm != NULL)
        (void)shoal_comm_destroy(comm);
    memset(&uid, 0, sizeof(uid));
    close(ifd);
    unlink(path);
    shoal_tenant_cred_config.credential_file = NULL;
}

/* Nothing above may have logged a MAC (or the first 16 hex digits of one). */
static void test_log_has_no_mac(void)
{
    char text[SHOAL_TENANT_CRED_TEXT_MAX], log[1 << 16];
    FILE *fp;
    size_t n, lines = 0, i;

    test_cred_text(text, sizeof(text), 1798761600);
    fp = fopen(test_log_path, "r");
    n = fp != NULL ? fread(log, 1, sizeof(log) - 1, fp) : 0;
    if (fp != NULL)
        fclose(fp);
    log[n] = '\0';
    for (i = 0; i < n; i++)
        lines += log[i] == '\n';
    tap_ok(lines >= 40, "the failures above logged %zu lines", lines);
    text[strlen(text) - 48] = '\0';
    tap_ok(strstr(log, text + strlen(text) - 16) == NULL, "no log line shows a mac");
    unlink(test_log_path);
}

int main(void)
{
    size_t i;

    snprintf(test_log_path, sizeof(test_log_path), "/tmp/test_cred_log.%d", (int)getpid());
    setenv("SHOAL_DEBUG_FILE", test_log_path, 1);
    setenv("SHOAL_DEBUG", "INFO", 1);
    unsetenv("SHOAL_CREDENTIAL");
    unsetenv("SHOAL_CREDENTIAL_FILE");
    shoal_config_global_init();
    for (i = 0; i < sizeof(test_master); i++)
        test_master[i] = (uint8_t)(0x5a ^ (i * 7));
    if (shoal_tenant_key_derive(test_master, sizeof(test_master), "acme", test_key) != SHOAL_OK)
        tap_bail("cannot derive the tenant key");

    test_keys();
    test_round_trip();
    test_tamper();
    test_expiry();
    test_apply();
    test_malformed();
    test_load();
    test_read_once();
    test_log_has_no_mac();
    return tap_done();
}
