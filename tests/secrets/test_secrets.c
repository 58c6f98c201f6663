/*
 * Secret config rows (SHOAL_CFG_F_SECRET: SHOAL_UID, SHOAL_SECRET): redacted by the
 * formatting function, removed from the environment (and from /proc/self/environ) once
 * read, not inherited by a child, not in the log, kept in a mapping left out of core dumps.
 * The test re-executes itself so that the secrets are in its initial environment block, as
 * they are in a rank started by a launcher.
 */
#include "util/util.h"
#include "core/core.h"
#include "tests/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define TS_SECRET "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e7a11a"
/* A second SHOAL_SECRET, and two SHOAL_CREDENTIALs, in the same environment block. */
#define TS_DUP_SECRET "d0b1ed0b1ed0b1ed0b1ed0b1ed0b1ed0b1ed0b1ed0b1ed0b1ed0b1ed0b1e2222"
#define TS_CRED1 "cred1c0ffee1c0ffee1c0ffee1c0ffee"
#define TS_CRED2 "cred2beefed2beefed2beefed2beefed"
#define TS_FILE_SECRET "f11e5ec2f11e5ec2f11e5ec2f11e5ec2f11e5ec2f11e5ec2f11e5ec2f11eb0b0"
#define TS_UID "0123456789abcdef" "fedcba9876543210" "0123456789abcdef" "fedcba9876543210" \
               "0123456789abcdef" "fedcba9876543210" "0123456789abcdef" "fedcba9876543210" \
               "0123456789abcdef" "fedcba9876543210" "0123456789abcdef" "fedcba9876543210" \
               "0123456789abcdef" "fedcba9876543210" "0123456789abcdef" "77aa77aa55bb55bb"

/* Reads a whole file (NUL bytes kept); *len_p its length. NULL if it cannot be read. */
static char *ts_slurp(const char *path, size_t *len_p)
{
    FILE *fp = fopen(path, "r");
    size_t cap = 1 << 16, n = 0, got;
    char *buf;

    if (fp == NULL)
        return NULL;
    buf = malloc(cap + 1);
    while (buf != NULL && (got = fread(buf + n, 1, cap - n, fp)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(fp);
    if (buf != NULL)
        buf[n] = '\0';
    *len_p = n;
    return buf;
}

static int ts_contains(const char *buf, size_t len, const char *needle)
{
    return memmem(buf, len, needle, strlen(needle)) != NULL;
}

/* "NAME=" followed by anything but NUL (a value still there) in an environ block. */
static int ts_env_has_value(const char *buf, size_t len, const char *name_eq)
{
    size_t nl = strlen(name_eq);

    for (size_t i = 0; i < len; i += strlen(buf + i) + 1) {
        if (strncmp(buf + i, name_eq, nl) == 0 && buf[i + nl] != '\0')
            return 1;
    }
    return 0;
}

static const shoal_cfg_field_t *ts_core_field(const char *name)
{
    extern const shoal_cfg_table_t shoal_core_cfg_table;

    for (size_t i = 0; i < shoal_core_cfg_table.nfields; i++) {
        if (strcmp(shoal_core_cfg_table.fields[i].name, name) == 0)
            return &shoal_core_cfg_table.fields[i];
    }
    return NULL;
}

/* The formatting function never returns a secret row's value. */
static void ts_format(void)
{
    const char *val = TS_SECRET, *none = NULL;
    shoal_cfg_field_t synthetic = {.name = "X", .type = SHOAL_CFG_INT,
                                   .flags = SHOAL_CFG_F_SECRET};
    int nsecret = 0, leaked = 0, wrong = 0, v = 424242;
    char buf[512];

    for (size_t t = 0; t < shoal_cfg_ntables; t++) {
        for (size_t i = 0; i < shoal_cfg_tables[t]->nfields; i++) {
            const shoal_cfg_field_t *f = &shoal_cfg_tables[t]->fields[i];
            if (!(f->flags & SHOAL_CFG_F_SECRET) || f->type != SHOAL_CFG_STRING)
                continue;
            nsecret++;
            shoal_cfg_format_value(f, &val, buf, sizeof(buf));
            leaked += strstr(buf, "5ec2e7") != NULL;
            wrong += strcmp(buf, "<set>") != 0;
            shoal_cfg_format_value(f, &none, buf, sizeof(buf));
            wrong += strcmp(buf, "<unset>") != 0;
        }
    }
    tap_ok(ts_core_field("UID") != NULL && (ts_core_field("UID")->flags & SHOAL_CFG_F_SECRET) &&
               ts_core_field("SECRET") != NULL &&
               (ts_core_field("SECRET")->flags & SHOAL_CFG_F_SECRET),
           "SHOAL_UID and SHOAL_SECRET are secret rows (%d secret string rows)", nsecret);
    tap_is_int(leaked, 0, "no secret row formats its value");
    tap_is_int(wrong, 0, "secret rows format as <set> or <unset>");
    shoal_cfg_format_value(&synthetic, &v, buf, sizeof(buf));
    tap_is_str(buf, "<redacted>", "a secret row of another type formats as <redacted>");
}

/* Flags of the mapping that holds addr, from /proc/self/smaps ("" if not found). */
static void ts_vmflags(const void *addr, char *out, size_t len)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    char line[512];
    int inside = 0;

    snprintf(out, len, "%s", "");
    if (fp == NULL)
        return;
    while (fgets(line, sizeof(line), fp) != NULL) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(out, len, "%s", line + 8);
            break;
        }
    }
    fclose(fp);
}

static void ts_after_init(const char *dir)
{
    char path[512], cmd[1024], flags[256];
    const shoal_cfg_field_t *fsec = ts_core_field("SECRET"), *fuid = ts_core_field("UID");
    char *buf;
    size_t len = 0;
    int rc;

    /* The program sets SHOAL_UID again, its own value (os.environ["SHOAL_UID"] = ..., a
     * wrapper that exports what it was given): environ now points at a copy, and the
     * launcher's entry stays in the block /proc/PID/environ shows. */
    setenv("SHOAL_UID", TS_UID, 1);
    shoal_config_global_init();
    tap_is_str(shoal_core_config.secret, TS_SECRET, "the library keeps its copy of SHOAL_SECRET");
    tap_is_str(shoal_core_config.uid, TS_UID, "the library keeps its copy of SHOAL_UID");
    tap_is_str(fsec != NULL ? shoal_cfg_source(fsec) : NULL, "env",
               "SHOAL_SECRET came from the environment (over the conf file)");
    tap_ok(getenv("SHOAL_SECRET") == NULL && getenv("SHOAL_UID") == NULL,
           "SHOAL_SECRET and SHOAL_UID are gone from the environment");
    tap_ok(shoal_cfg_getenv("SECRET") == NULL,
           "the conf file's copy of SHOAL_SECRET is wiped (reads as unset)");

    buf = ts_slurp("/proc/self/environ", &len);
    tap_ok(buf != NULL && len > 0 && !ts_contains(buf, len, TS_SECRET) &&
               !ts_contains(buf, len, TS_UID) &&
               !ts_env_has_value(buf, len, "SHOAL_SECRET=") &&
               !ts_env_has_value(buf, len, "SHOAL_UID="),
           "/proc/self/environ no longer shows either value");
    free(buf);

    /* A variable present twice in the block (env A=1 A=2, a launcher that appends): getenv
     * finds the first, unsetenv drops both from environ, but the second's bytes stayed in the
     * block, readable in /proc/PID/environ. */
    buf = ts_slurp("/proc/self/environ", &len);
    tap_ok(buf != NULL && len > 0 && !ts_contains(buf, len, TS_DUP_SECRET) &&
               !ts_contains(buf, len, TS_CRED1) && !ts_contains(buf, len, TS_CRED2) &&
               !ts_env_has_value(buf, len, "SHOAL_CREDENTIAL="),
           "a secret variable given twice: /proc/self/environ shows neither value");
    free(buf);

    buf = ts_slurp("/proc/self/environ", &len);
    tap_ok(buf != NULL && len > 0 && !ts_contains(buf, len, "77aa77aa55bb55bb"),
           "SHOAL_UID set again by the program: the launcher's value is gone from "
           "/proc/self/environ too");
    free(buf);

    /* A child (a data-loader worker, system()) does not inherit them. */
    snprintf(path, sizeof(path), "%s/child.env", dir);
    snprintf(cmd, sizeof(cmd), "env > '%s'", path);
    rc = system(cmd);
    buf = ts_slurp(path, &len);
    tap_ok(rc == 0 && buf != NULL && len > 0 && strstr(buf, "SHOAL_SECRET") == NULL &&
               strstr(buf, "SHOAL_UID") == NULL && strstr(buf, "5ec2e7") == NULL &&
               strstr(buf, "77aa77aa55bb55bb") == NULL && strstr(buf, "SHOAL_DEBUG=") != NULL,
           "a child started with system() sees neither variable (it sees the others)");
    free(buf);
    unlink(path);

    ts_vmflags(shoal_core_config.secret, flags, sizeof(flags));
    tap_ok(strstr(flags, " dd") != NULL, "the secret's page is left out of core dumps (VmFlags:%s)",
           flags[0] != '\0' ? flags : " none\n");

    shoal_cfg_format_value(fuid, &shoal_core_config.uid, cmd, sizeof(cmd));
    tap_is_str(cmd, "<set>", "the value in force formats as <set>");
    shoal_trace(CONFIG, "trace after init, uid %s", cmd);
    shoal_warn(CONFIG, "warn after init");

    snprintf(path, sizeof(path), "%s/log", dir);
    buf = ts_slurp(path, &len);
    tap_ok(buf != NULL && strstr(buf, "warn after init") != NULL &&
               strstr(buf, "unknown environment variable SHOAL_NOT_A_KNOB") != NULL,
           "the TRACE log was written");
    tap_ok(buf != NULL && strstr(buf, "5ec2e7") == NULL && strstr(buf, "f11e5ec2") == NULL &&
               strstr(buf, "0123456789abcdef") == NULL && strstr(buf, "77aa77aa") == NULL,
           "the log has no secret value (environment or conf file)");
    if (buf != NULL && getenv("TEST_SECRETS_VERBOSE") != NULL)
        tap_diag("log:\n%s", buf);
    free(buf);
    unlink(path);
    snprintf(path, sizeof(path), "%s/shoal.conf", dir);
    unlink(path);
    rmdir(dir);
}

/* Re-executes this program with the secrets in its initial environment block. */
static int ts_reexec(void)
{
    char dir[] = "/tmp/shoal_test_secrets.XXXXXX", conf[256], **env;
    size_t n = 0, k = 0;
    FILE *fp;

    if (mkdtemp(dir) == NULL) {
        tap_skip_all("mkdtemp failed");
        return 0;
    }
    snprintf(conf, sizeof(conf), "%s/shoal.conf", dir);
    fp = fopen(conf, "w");
    if (fp == NULL) {
        tap_skip_all("cannot write the conf file");
        return 0;
    }
    fprintf(fp, "SHOAL_SECRET=%s\nSHOAL_SPIN_COUNT=100\n", TS_FILE_SECRET);
    fclose(fp);
    while (environ[n] != NULL)
        n++;
    env = calloc(n + 16, sizeof(*env));
    for (size_t i = 0; i < n; i++) {
        if (strncmp(environ[i], "SHOAL_", 6) != 0)
            env[k++] = environ[i];
    }
    env[k++] = "SHOAL_SECRET=" TS_SECRET;
    env[k++] = "SHOAL_UID=" TS_UID;
    env[k++] = "SHOAL_CREDENTIAL=" TS_CRED1;
    env[k++] = "SHOAL_SECRET=" TS_DUP_SECRET;
    env[k++] = "SHOAL_CREDENTIAL=" TS_CRED2;
    env[k++] = "SHOAL_DEBUG=TRACE";
    env[k++] = "SHOAL_DEBUG_SUBSYS=ALL";
    env[k++] = "SHOAL_NOT_A_KNOB=1";
    if (asprintf(&env[k++], "SHOAL_DEBUG_FILE=%s/log", dir) < 0 ||
        asprintf(&env[k++], "SHOAL_CONF_FILE=%s", conf) < 0 ||
        asprintf(&env[k++], "TEST_SECRETS_DIR=%s", dir) < 0) {
        tap_bail("out of memory");
        return 1;
    }
    execve("/proc/self/exe", (char *[]){"test_secrets", NULL}, env);
    tap_bail("execve(/proc/self/exe) failed");
    return 1;
}

int main(void)
{
    const char *dir = getenv("TEST_SECRETS_DIR");

    if (dir == NULL)
        return ts_reexec();
    ts_format();
    ts_after_init(dir);
    return tap_done();
}
