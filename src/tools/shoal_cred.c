/* shoal-cred: the provider's tool for job credentials (DESIGN.md section 7).
 *   keygen      -o FILE                     a new master key (32 random bytes, mode 0600)
 *   issue       -k MASTER --tenant T --job J [--epoch N] [--class C] [--weight W]
 *               [--expires SECONDS|@UNIXTIME|never]   prints the credential line
 *   verify      (-k MASTER | -K TENANTKEY) [CRED|-]     checks MAC and expiry (exit 0 or 1)
 *   tenant-key  -k MASTER --tenant T -o FILE            the per-tenant key, for a node agent
 * Keys are raw 32-byte files, written 0600 and never over an existing file, read with a size
 * check (and a warning when group or others may read them), wiped after use, never printed.
 * A tool, not the library: it prints to stdout. Exit 0 ok, 1 rejected or failed, 2 usage. */
#include "tenant/tenant.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHOAL_CRED_KEY_BYTES 32
#define SHOAL_CRED_DEFAULT_LIFETIME (7 * 86400)

static void shoal_cred_usage(FILE *fp)
{
    fprintf(fp,
            "usage: shoal-cred keygen -o MASTER_KEY_FILE\n"
            "       shoal-cred issue -k MASTER_KEY_FILE --tenant T --job J [--epoch N]\n"
            "                  [--class guaranteed|burstable|spot] [--weight W]\n"
            "                  [--expires SECONDS|@UNIXTIME|never]\n"
            "       shoal-cred verify (-k MASTER_KEY_FILE | -K TENANT_KEY_FILE) [CREDENTIAL|-]\n"
            "       shoal-cred tenant-key -k MASTER_KEY_FILE --tenant T -o TENANT_KEY_FILE\n"
            "keygen      writes a new provider master key (32 random bytes, mode 0600); it never\n"
            "            overwrites a file\n"
            "issue       prints a job credential signed with the tenant's key (derived from\n"
            "            the master key); give it to the job as SHOAL_CREDENTIAL or in the file\n"
            "            named by SHOAL_CREDENTIAL_FILE. Defaults: epoch 0, class burstable,\n"
            "            weight 1, expires in 7 days (SECONDS from now, @UNIXTIME, or never)\n"
            "verify      checks a credential's MAC and expiry (the credential from the\n"
            "            argument, or from stdin with - or none: prefer stdin, arguments are\n"
            "            visible in ps);\n"
            "            exit 0 valid, 1 rejected\n"
            "tenant-key  writes the key of one tenant (for a node agent that serves only it:\n"
            "            verify -K accepts it)\n");
}

/* ---- key files ----------------------------------------------------------------------------- */

static int shoal_cred_key_read(const char *path, uint8_t key[SHOAL_CRED_KEY_BYTES])
{
    char why[512];
    size_t len;
    int loose;

    if (shoal_secret_file_read(path, key, SHOAL_CRED_KEY_BYTES, SHOAL_CRED_KEY_BYTES, &len,
                               &loose, why, sizeof(why)) != SHOAL_OK) {
        fprintf(stderr, "shoal-cred: key file %s\n", why);
        return -1;
    }
    if (loose)
        fprintf(stderr, "shoal-cred: warning: key file %s may be read by group or others: "
                "chmod 600 it\n", path);
    return 0;
}

/* A new file of mode 0600; an existing file (or link) at path is an error, never replaced. */
static int shoal_cred_key_write(const char *path, const uint8_t key[SHOAL_CRED_KEY_BYTES])
{
    size_t n = 0;
    ssize_t ret;
    int fd;

    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "shoal-cred: %s %s: %s\n",
                errno == EEXIST ? "refusing to overwrite" : "cannot create", path,
                strerror(errno));
        return -1;
    }
    if (fchmod(fd, 0600) != 0)
        goto err;
    while (n < SHOAL_CRED_KEY_BYTES) {
        ret = write(fd, key + n, SHOAL_CRED_KEY_BYTES - n);
        if (ret < 0 && errno == EINTR)
            continue;
        if (ret < 0)
            goto err;
        n += (size_t)ret;
    }
    if (fsync(fd) != 0)
        goto err;
    if (close(fd) != 0) {
        fd = -1;
        goto err;
    }
    return 0;

err:
    fprintf(stderr, "shoal-cred: cannot write %s: %s\n", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    unlink(path);
    return -1;
}

/* ---- argument parsing ---------------------------------------------------------------------- */

typedef struct {
    const char *master;     /* -k */
    const char *tenant_key; /* -K */
    const char *out;        /* -o */
    const char *tenant;
    const char *job;
    const char *epoch;
    const char *qos_class;
    const char *weight;
    const char *expires;
} shoal_cred_args_t;

static int shoal_cred_parse_args(int argc, char **argv, shoal_cred_args_t *a)
{
    static const struct option opts[] = {
        {"key", required_argument, NULL, 'k'},   {"tenant-key", required_argument, NULL, 'K'},
        {"output", required_argument, NULL, 'o'}, {"tenant", required_argument, NULL, 't'},
        {"job", required_argument, NULL, 'j'},   {"epoch", required_argument, NULL, 'e'},
        {"class", required_argument, NULL, 'c'}, {"weight", required_argument, NULL, 'w'},
        {"expires", required_argument, NULL, 'x'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;

    memset(a, 0, sizeof(*a));
    optind = 1;
    while ((c = getopt_long(argc, argv, "k:K:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'k': a->master = optarg; break;
        case 'K': a->tenant_key = optarg; break;
        case 'o': a->out = optarg; break;
        case 't': a->tenant = optarg; break;
        case 'j': a->job = optarg; break;
        case 'e': a->epoch = optarg; break;
        case 'c': a->qos_class = optarg; break;
        case 'w': a->weight = optarg; break;
        case 'x': a->expires = optarg; break;
        case 'h': shoal_cred_usage(stdout); exit(0);
        default: return -1;
        }
    }
    return 0;
}

static int shoal_cred_parse_class(const char *s, int *out)
{
    if (s == NULL || strcmp(s, "burstable") == 0)
        *out = SHOAL_QOS_BURSTABLE;
    else if (strcmp(s, "guaranteed") == 0)
        *out = SHOAL_QOS_GUARANTEED;
    else if (strcmp(s, "spot") == 0)
        *out = SHOAL_QOS_SPOT;
    else
        return -1;
    return 0;
}

/* SECONDS from now, @UNIXTIME, or never (0). */
static int shoal_cred_parse_expires(const char *s, int64_t now, int64_t *out)
{
    uint64_t v;

    if (s == NULL) {
        *out = now + SHOAL_CRED_DEFAULT_LIFETIME;
        return 0;
    }
    if (strcmp(s, "never") == 0) {
        *out = 0;
        return 0;
    }
    if (s[0] == '@') {
        if (shoal_parse_u64(s + 1, INT64_MAX, &v, NULL) != 0 || v == 0)
            return -1;
        *out = (int64_t)v;
        return 0;
    }
    if (shoal_parse_u64(s, (uint64_t)(INT64_MAX - now), &v, NULL) != 0 || v == 0)
        return -1;
    *out = now + (int64_t)v;
    return 0;
}

static int shoal_cred_name_copy(const char *what, const char *s, char dst[SHOAL_TENANT_NAME_MAX])
{
    if (s == NULL || s[0] == '\0' || strlen(s) >= SHOAL_TENANT_NAME_MAX) {
        fprintf(stderr, "shoal-cred: --%s needs a name of 1 to %d bytes\n", what,
                SHOAL_TENANT_NAME_MAX - 1);
        return -1;
    }
    strcpy(dst, s);
    return 0;
}

/* A name a credential can hold (as src/tenant/cred.c takes it): 0, else -1 and the reason on
 * stderr. Through the library's log alone (the key's derivation, the signature) the reason went
 * to SHOAL_DEBUG_FILE or nowhere (SHOAL_DEBUG=NONE), and the command exited 1 without a word. */
static int shoal_cred_name_ok(const char *what, const char *s)
{
    size_t i, n = strlen(s);

    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c >= 0x7f || c == ';' || c == '=')
            break;
    }
    if (n == 0 || n >= SHOAL_TENANT_NAME_MAX || i < n) {
        fprintf(stderr, "shoal-cred: --%s takes 1 to %d bytes of printable ASCII without spaces, "
                "';' or '='%s\n", what, SHOAL_TENANT_NAME_MAX - 1,
                n > 0 && n < SHOAL_TENANT_NAME_MAX ? " (a byte that is not)" : "");
        return -1;
    }
    return 0;
}

/* ---- commands ------------------------------------------------------------------------------ */

/* What a command printed reached stdout, else says so: 0 or 1. A full disk or a closed pipe
 * exited 1 without a word (verify's 1 read as 'rejected' for a valid credential). */
static int shoal_cred_flush(const char *what)
{
    int err;

    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return 0;
    err = errno;
    fprintf(stderr, "shoal-cred: %s: %s\n", what, err != 0 ? strerror(err) : "write error");
    return 1;
}

static int shoal_cred_cmd_keygen(const shoal_cred_args_t *a)
{
    uint8_t key[SHOAL_CRED_KEY_BYTES];
    int rc;

    if (a->out == NULL) {
        fprintf(stderr, "shoal-cred keygen: -o FILE is required\n");
        return 2;
    }
    if (shoal_random_bytes(key, sizeof(key)) != SHOAL_OK)
        return 1;
    rc = shoal_cred_key_write(a->out, key);
    shoal_secret_wipe(key, sizeof(key));
    if (rc != 0)
        return 1;
    fprintf(stderr, "shoal-cred: wrote a new master key to %s (mode 0600)\n", a->out);
    return 0;
}

static int shoal_cred_cmd_tenant_key(const shoal_cred_args_t *a)
{
    uint8_t master[SHOAL_CRED_KEY_BYTES], key[SHOAL_HMAC_BYTES];
    int rc = 1;

    if (a->master == NULL || a->tenant == NULL || a->out == NULL) {
        fprintf(stderr, "shoal-cred tenant-key: -k MASTER_KEY_FILE, --tenant T and -o FILE are "
                "required\n");
        return 2;
    }
    if (shoal_cred_name_ok("tenant", a->tenant) != 0 ||
        shoal_cred_key_read(a->master, master) != 0)
        return 1;
    if (shoal_tenant_key_derive(master, sizeof(master), a->tenant, key) == SHOAL_OK &&
        shoal_cred_key_write(a->out, key) == 0) {
        fprintf(stderr, "shoal-cred: wrote the key of tenant '%s' to %s (mode 0600)\n",
                a->tenant, a->out);
        rc = 0;
    }
    shoal_secret_wipe(master, sizeof(master));
    shoal_secret_wipe(key, sizeof(key));
    return rc;
}

static int shoal_cred_cmd_issue(const shoal_cred_args_t *a)
{
    uint8_t master[SHOAL_CRED_KEY_BYTES], key[SHOAL_HMAC_BYTES];
    shoal_tenant_cred_t cred;
    char text[SHOAL_TENANT_CRED_TEXT_MAX];
    uint64_t epoch = 0, weight = 1;
    int rc = 1;

    memset(&cred, 0, sizeof(cred));
    if (a->master == NULL || a->tenant == NULL || a->job == NULL) {
        fprintf(stderr, "shoal-cred issue: -k MASTER_KEY_FILE, --tenant T and --job J are "
                "required\n");
        return 2;
    }
    if (shoal_cred_name_copy("tenant", a->tenant, cred.id.tenant) != 0 ||
        shoal_cred_name_copy("job", a->job, cred.id.job) != 0)
        return 2;
    if (shoal_cred_name_ok("tenant", a->tenant) != 0 || shoal_cred_name_ok("job", a->job) != 0)
        return 1;
    if ((a->epoch != NULL && shoal_parse_u64(a->epoch, UINT64_MAX, &epoch, NULL) != 0) ||
        (a->weight != NULL &&
         (shoal_parse_u64(a->weight, SHOAL_TENANT_WEIGHT_MAX, &weight, NULL) != 0 ||
          weight == 0)) ||
        shoal_cred_parse_class(a->qos_class, &cred.id.qos_class) != 0 ||
        shoal_cred_parse_expires(a->expires, (int64_t)time(NULL), &cred.expires) != 0) {
        fprintf(stderr, "shoal-cred issue: --epoch takes 0..2^64-1, --weight 1..%d, --class "
                "guaranteed|burstable|spot, --expires SECONDS (> 0), @UNIXTIME or never\n",
                SHOAL_TENANT_WEIGHT_MAX);
        return 2;
    }
    if (cred.expires != 0 && cred.expires <= (int64_t)time(NULL)) {
        /* Kept (a test of the expiry needs such a credential), but never silently: every
         * rank given it would be refused at once. */
        fprintf(stderr, "shoal-cred issue: warning: --expires %s is already past: every rank "
                "given this credential is refused as expired\n", a->expires);
    }
    cred.id.epoch = epoch;
    cred.id.qos_weight = (int)weight;
    if (shoal_cred_key_read(a->master, master) != 0)
        return 1;
    if (shoal_tenant_key_derive(master, sizeof(master), cred.id.tenant, key) == SHOAL_OK &&
        shoal_tenant_cred_sign(&cred, key) == SHOAL_OK &&
        shoal_tenant_cred_format(&cred, text, sizeof(text)) == SHOAL_OK) {
        printf("%s\n", text);
        rc = shoal_cred_flush("cannot write the credential to stdout");
    }
    shoal_secret_wipe(master, sizeof(master));
    shoal_secret_wipe(key, sizeof(key));
    shoal_secret_wipe(&cred, sizeof(cred));
    shoal_secret_wipe(text, sizeof(text));
    return rc;
}

/* The credential from the argument, or one line from stdin ("-" or no argument). Stdin must
 * hold that line only, as SHOAL_CREDENTIAL_FILE must (src/tenant/cred.c): verify said "valid"
 * for input whose first line was a credential, followed by more lines or a NUL and anything,
 * which the library refuses. A terminal is read up to its first line only. */
static int shoal_cred_read_text(const char *arg, char text[SHOAL_TENANT_CRED_TEXT_MAX + 2])
{
    size_t n;
    int c = EOF;

    if (arg != NULL && strcmp(arg, "-") != 0) {
        n = strlen(arg);
        if (n >= SHOAL_TENANT_CRED_TEXT_MAX + 1) {
            fprintf(stderr, "shoal-cred verify: the credential is too long\n");
            return -1;
        }
        strcpy(text, arg);
        /* one trailing newline, as the library drops it from SHOAL_CREDENTIAL */
        if (n > 0 && text[n - 1] == '\n')
            text[n - 1] = '\0';
        return 0;
    }
    for (n = 0; n < SHOAL_TENANT_CRED_TEXT_MAX && (c = getc(stdin)) != EOF && c != '\n'; n++)
        text[n] = (char)c;
    text[n] = '\0';
    if (n == 0 && c == EOF) {
        fprintf(stderr, "shoal-cred verify: no credential on stdin\n");
        return -1;
    }
    if (n >= SHOAL_TENANT_CRED_TEXT_MAX || memchr(text, '\0', n) != NULL ||
        (!isatty(STDIN_FILENO) && c != EOF && getc(stdin) != EOF)) {
        fprintf(stderr, "shoal-cred verify: stdin does not hold one credential line\n");
        return -1;
    }
    return 0;
}

static int shoal_cred_cmd_verify(const shoal_cred_args_t *a, const char *arg)
{
    uint8_t master[SHOAL_CRED_KEY_BYTES], key[SHOAL_HMAC_BYTES];
    char text[SHOAL_TENANT_CRED_TEXT_MAX + 2], when[64], why[SHOAL_TENANT_CRED_WHY_MAX] = "";
    static const char *const classes[] = {"default", "guaranteed", "burstable", "spot"};
    shoal_tenant_cred_t cred;
    shoal_status_t st = SHOAL_ERR_INVALID_ARG;
    int have_key = 0;

    if ((a->master == NULL) == (a->tenant_key == NULL)) {
        fprintf(stderr, "shoal-cred verify: give one of -k MASTER_KEY_FILE or -K "
                "TENANT_KEY_FILE\n");
        return 2;
    }
    if (shoal_cred_read_text(arg, text) != 0)
        return 1;
    /* The quiet variants, the reason printed here: through the library's log it went to
     * SHOAL_DEBUG_FILE when set, or nowhere under SHOAL_DEBUG=NONE, and the verdict said only
     * 'permission denied' or 'not a credential'. */
    if (shoal_tenant_cred_parse_quiet(text, &cred, why, sizeof(why)) == SHOAL_OK) {
        if (a->master != NULL) {
            if (shoal_cred_key_read(a->master, master) == 0) {
                have_key = shoal_tenant_key_derive(master, sizeof(master), cred.id.tenant,
                                                   key) == SHOAL_OK;
                shoal_secret_wipe(master, sizeof(master));
            }
        } else {
            have_key = shoal_cred_key_read(a->tenant_key, key) == 0;
        }
        if (have_key)
            st = shoal_tenant_cred_verify_quiet(&cred, key, (int64_t)time(NULL), why,
                                                sizeof(why));
    }
    shoal_secret_wipe(key, sizeof(key));
    shoal_secret_wipe(text, sizeof(text));
    if (st != SHOAL_OK) {
        fprintf(stderr, "shoal-cred: credential rejected: %s\n",
                why[0] != '\0' ? why : have_key ? shoal_strerror(st) : "no usable key");
        shoal_secret_wipe(&cred, sizeof(cred));
        return 1;
    }
    if (cred.expires == 0) {
        snprintf(when, sizeof(when), "never");
    } else {
        time_t t = (time_t)cred.expires;
        struct tm tm;
        if (gmtime_r(&t, &tm) == NULL || strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ",
                                                  &tm) == 0)
            snprintf(when, sizeof(when), "@%" PRId64, cred.expires);
    }
    printf("valid: tenant %s job %s epoch %" PRIu64 " class %s weight %d expires %s\n",
           cred.id.tenant, cred.id.job, cred.id.epoch, classes[cred.id.qos_class],
           cred.id.qos_weight, when);
    shoal_secret_wipe(&cred, sizeof(cred));
    return shoal_cred_flush("the credential is valid, but cannot write to stdout");
}

int main(int argc, char **argv)
{
    shoal_cred_args_t a;
    const char *cmd;

    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        shoal_cred_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    cmd = argv[1];
    /* The master or tenant key it reads stays out of a core dump (and out of another
     * process's ptrace of the same user) whatever the crash. */
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    shoal_config_global_init(); /* SHOAL_DEBUG for the library's log lines */
    if (shoal_cred_parse_args(argc - 1, argv + 1, &a) != 0) {
        shoal_cred_usage(stderr);
        return 2;
    }
    if (strcmp(cmd, "verify") == 0) {
        if (argc - 1 - optind > 1) {
            fprintf(stderr, "shoal-cred verify: one credential at a time\n");
            return 2;
        }
        return shoal_cred_cmd_verify(&a, optind < argc - 1 ? argv[1 + optind] : NULL);
    }
    if (optind != argc - 1) {
        fprintf(stderr, "shoal-cred %s: unexpected argument '%s'\n", cmd, argv[1 + optind]);
        return 2;
    }
    if (strcmp(cmd, "keygen") == 0)
        return shoal_cred_cmd_keygen(&a);
    if (strcmp(cmd, "issue") == 0)
        return shoal_cred_cmd_issue(&a);
    if (strcmp(cmd, "tenant-key") == 0)
        return shoal_cred_cmd_tenant_key(&a);
    fprintf(stderr, "shoal-cred: unknown command '%s'\n", cmd);
    shoal_cred_usage(stderr);
    return 2;
}
