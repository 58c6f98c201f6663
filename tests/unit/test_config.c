/* Config tables, parsers, logging subsystems, status names, HMAC and host identity. */
#include "core/tl.h"
#include "util/util.h"
#include "tests/tap.h"
#include "shoal.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>


extern const shoal_cfg_table_t shoal_util_cfg_table;

/* Big enough and aligned for any field type. */
typedef union {
    int i;
    unsigned u;
    size_t z;
    const char *s;
    long long pad[2];
} test_value_t;

static void test_tables(void)
{
    size_t t, i, t2, i2;
    int dups = 0, bad_default = 0, no_doc = 0, bad_name = 0, bad_enum = 0, bad_format = 0;

    tap_ok(shoal_cfg_ntables >= 1, "%zu config tables", shoal_cfg_ntables);
    for (t = 0; t < shoal_cfg_ntables; t++) {
        const shoal_cfg_table_t *tab = shoal_cfg_tables[t];
        for (i = 0; i < tab->nfields; i++) {
            const shoal_cfg_field_t *f = &tab->fields[i];
            test_value_t v = {.pad = {0}}, v2 = {.pad = {0}};
            char text[256];

            if (f->name == NULL || f->name[0] == '\0' || strncmp(f->name, "SHOAL_", 6) == 0 ||
                strspn(f->name, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != strlen(f->name)) {
                tap_diag("table %s: bad name '%s'", tab->module, f->name ? f->name : "(null)");
                bad_name++;
                continue;
            }
            if (f->doc == NULL || f->doc[0] == '\0') {
                tap_diag("SHOAL_%s has no doc", f->name);
                no_doc++;
            }
            if (f->type == SHOAL_CFG_ENUM && f->enum_names == NULL) {
                tap_diag("SHOAL_%s is an enum without names", f->name);
                bad_enum++;
            }
            if (f->dflt == NULL || shoal_cfg_parse_value(f, f->dflt, &v) != 0) {
                tap_diag("SHOAL_%s: default '%s' does not parse", f->name,
                         f->dflt ? f->dflt : "(null)");
                bad_default++;
                continue;
            }
            /* The formatted value parses back to the same value; a secret never shows its
             * value, only whether it is set (tests/secrets/test_secrets.c). */
            shoal_cfg_format_value(f, &v, text, sizeof(text));
            if (f->flags & SHOAL_CFG_F_SECRET) {
                if (strcmp(text, f->type != SHOAL_CFG_STRING ? "<redacted>"
                                 : v.s != NULL ? "<set>" : "<unset>") != 0) {
                    tap_diag("SHOAL_%s: a secret formats as '%s'", f->name, text);
                    bad_format++;
                }
            } else if (shoal_cfg_parse_value(f, text, &v2) != 0 ||
                (f->type == SHOAL_CFG_STRING
                     ? !((v.s == NULL && v2.s == NULL) ||
                         (v.s != NULL && v2.s != NULL && strcmp(v.s, v2.s) == 0))
                     : memcmp(&v, &v2, sizeof(v)) != 0)) {
                tap_diag("SHOAL_%s: default '%s' formats as '%s', which does not round-trip",
                         f->name, f->dflt, text);
                bad_format++;
            }
            for (t2 = 0; t2 < shoal_cfg_ntables; t2++) {
                for (i2 = 0; i2 < shoal_cfg_tables[t2]->nfields; i2++) {
                    const shoal_cfg_field_t *g = &shoal_cfg_tables[t2]->fields[i2];
                    if ((t2 > t || (t2 == t && i2 > i)) && g->name != NULL &&
                        strcmp(g->name, f->name) == 0) {
                        tap_diag("SHOAL_%s defined by %s and %s", f->name, tab->module,
                                 shoal_cfg_tables[t2]->module);
                        dups++;
                    }
                }
            }
        }
    }
    tap_is_int(bad_name, 0, "every name is SHOAL_-less upper case");
    tap_is_int(no_doc, 0, "every variable has a doc");
    tap_is_int(bad_enum, 0, "every enum lists its names");
    tap_is_int(bad_default, 0, "every default parses with its parser");
    tap_is_int(bad_format, 0, "every default formats and parses back (secrets: <set>/<unset>)");
    tap_is_int(dups, 0, "no variable name is defined twice");
}

static int test_parse(shoal_cfg_type_t type, const char *text, test_value_t *v)
{
    static const char *const names[] = {"NONE", "WARN", "INFO", NULL};
    const shoal_cfg_field_t f = {.name = "T", .dflt = "", .doc = "t", .type = type,
                                 .enum_names = names};

    memset(v, 0, sizeof(*v));
    return shoal_cfg_parse_value(&f, text, v);
}

#define TEST_OK(type, text, member, want)                                                   \
    do {                                                                                    \
        test_value_t v_;                                                                    \
        int rc_ = test_parse(type, text, &v_);                                              \
        tap_ok(rc_ == 0 && v_.member == (want), #type " '%s' -> %lld (got rc %d, %lld)",    \
               text, (long long)(want), rc_, (long long)v_.member);                         \
    } while (0)
#define TEST_BAD(type, text)                                                                \
    do {                                                                                    \
        test_value_t v_;                                                                    \
        tap_ok(test_parse(type, text, &v_) != 0, #type " '%s' rejected", text);             \
    } while (0)

static void test_parsers(void)
{
    test_value_t v;

    TEST_OK(SHOAL_CFG_SIZE, "4096", z, 4096);
    TEST_OK(SHOAL_CFG_SIZE, "64k", z, 65536);
    TEST_OK(SHOAL_CFG_SIZE, "4M", z, 4u << 20);
    TEST_OK(SHOAL_CFG_SIZE, "1g", z, 1u << 30);
    TEST_OK(SHOAL_CFG_SIZE, " 8kb ", z, 8192);
    TEST_OK(SHOAL_CFG_SIZE, "0", z, 0);
    TEST_BAD(SHOAL_CFG_SIZE, "");
    TEST_BAD(SHOAL_CFG_SIZE, "-1");
    TEST_BAD(SHOAL_CFG_SIZE, "12q");
    TEST_BAD(SHOAL_CFG_SIZE, "k");
    TEST_BAD(SHOAL_CFG_SIZE, "99999999999999999999999");
    TEST_BAD(SHOAL_CFG_SIZE, "1.5m");

    TEST_OK(SHOAL_CFG_TIME, "100ms", i, 100);
    TEST_OK(SHOAL_CFG_TIME, "5s", i, 5000);
    TEST_OK(SHOAL_CFG_TIME, "2m", i, 120000);
    TEST_OK(SHOAL_CFG_TIME, "250", i, 250);
    TEST_OK(SHOAL_CFG_TIME, "inf", i, -1);
    TEST_OK(SHOAL_CFG_TIME, "INF", i, -1);
    TEST_OK(SHOAL_CFG_TIME, "-1", i, -1);
    TEST_OK(SHOAL_CFG_TIME, "-30", i, -1);
    TEST_OK(SHOAL_CFG_TIME, "0", i, 0);
    TEST_BAD(SHOAL_CFG_TIME, "5h");
    TEST_BAD(SHOAL_CFG_TIME, "fast");
    TEST_BAD(SHOAL_CFG_TIME, "");
    TEST_BAD(SHOAL_CFG_TIME, "9999999999s");

    TEST_OK(SHOAL_CFG_BOOL, "yes", i, 1);
    TEST_OK(SHOAL_CFG_BOOL, "Y", i, 1);
    TEST_OK(SHOAL_CFG_BOOL, "1", i, 1);
    TEST_OK(SHOAL_CFG_BOOL, "true", i, 1);
    TEST_OK(SHOAL_CFG_BOOL, "on", i, 1);
    TEST_OK(SHOAL_CFG_BOOL, "no", i, 0);
    TEST_OK(SHOAL_CFG_BOOL, "0", i, 0);
    TEST_OK(SHOAL_CFG_BOOL, "FALSE", i, 0);
    TEST_OK(SHOAL_CFG_BOOL, "off", i, 0);
    TEST_BAD(SHOAL_CFG_BOOL, "maybe");
    TEST_BAD(SHOAL_CFG_BOOL, "2");

    TEST_OK(SHOAL_CFG_INT, "-42", i, -42);
    TEST_OK(SHOAL_CFG_INT, "2147483647", i, INT_MAX);
    TEST_BAD(SHOAL_CFG_INT, "2147483648");
    TEST_BAD(SHOAL_CFG_INT, "12abc");
    TEST_OK(SHOAL_CFG_UINT, "4294967295", u, UINT_MAX);
    TEST_BAD(SHOAL_CFG_UINT, "-1");
    TEST_BAD(SHOAL_CFG_UINT, "4294967296");

    TEST_OK(SHOAL_CFG_ENUM, "warn", i, 1);
    TEST_OK(SHOAL_CFG_ENUM, "INFO", i, 2);
    TEST_BAD(SHOAL_CFG_ENUM, "LOUD");
    TEST_BAD(SHOAL_CFG_ENUM, "");

    tap_ok(test_parse(SHOAL_CFG_STRING, "", &v) == 0 && v.s == NULL, "STRING '' -> NULL");
    tap_ok(test_parse(SHOAL_CFG_STRING, "eth0", &v) == 0 && v.s != NULL &&
               strcmp(v.s, "eth0") == 0, "STRING 'eth0' copied");
    /* A value from the environment kept its blanks (SHOAL_SOCKET_IFNAME="eth0 " named no
     * interface) while the same value in the conf file was trimmed. */
    tap_ok(test_parse(SHOAL_CFG_STRING, " eth0\t ", &v) == 0 && v.s != NULL &&
               strcmp(v.s, "eth0") == 0, "STRING ' eth0\\t ' trimmed to 'eth0'");
    tap_ok(test_parse(SHOAL_CFG_STRING, "  ", &v) == 0 && v.s == NULL, "STRING '  ' -> NULL");
}

static void test_subsys(void)
{
    unsigned all = (1u << SHOAL_SUBSYS_COUNT) - 1u, mask = 0;

    tap_ok(shoal_log_parse_subsys("ALL", &mask) && mask == all, "subsys ALL");
    tap_ok(shoal_log_parse_subsys("INIT,COLL", &mask) &&
               mask == (SHOAL_SUBSYS(INIT) | SHOAL_SUBSYS(COLL)), "subsys INIT,COLL");
    tap_ok(shoal_log_parse_subsys("^TCP", &mask) && mask == (all & ~SHOAL_SUBSYS(TCP)),
           "subsys ^TCP");
    tap_ok(shoal_log_parse_subsys("^TCP,shm", &mask) &&
               mask == (all & ~(SHOAL_SUBSYS(TCP) | SHOAL_SUBSYS(SHM))), "subsys ^TCP,shm");
    mask = 7;
    tap_ok(!shoal_log_parse_subsys("INIT,BOGUS", &mask) && mask == 7,
           "subsys INIT,BOGUS rejected, mask untouched");
    tap_is_str(shoal_log_subsys_name(SHOAL_SUBSYS_BIT_TENANT), "TENANT", "subsys name");
}

static void test_crypto(void)
{
    static const uint8_t want[SHOAL_HMAC_BYTES] = {
        0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
        0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
        0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
    const char *msg = "what do ya want for nothing?";
    uint8_t mac[SHOAL_HMAC_BYTES], r1[32], r2[32];

    tap_ok(shoal_hmac((const uint8_t *)"Jefe", 4, msg, strlen(msg), mac) == SHOAL_OK &&
               memcmp(mac, want, sizeof(want)) == 0, "HMAC-SHA256 RFC 4231 test case 2");
    tap_ok(shoal_memeq_ct(mac, want, sizeof(want)), "memeq_ct equal");
    mac[31] ^= 1;
    tap_ok(!shoal_memeq_ct(mac, want, sizeof(want)), "memeq_ct differs in the last byte");
    tap_ok(shoal_random_bytes(r1, sizeof(r1)) == SHOAL_OK &&
               shoal_random_bytes(r2, sizeof(r2)) == SHOAL_OK && memcmp(r1, r2, 32) != 0,
           "random bytes differ between draws");
    tap_is_int(shoal_hash64("", 0, 0), 0xcbf29ce484222325ull, "FNV-1a of nothing");
    tap_is_int(shoal_hash64("a", 1, 0), 0xaf63dc4c8601ec8cull, "FNV-1a of 'a'");
}

static void test_status(void)
{
    tap_is_str(shoal_strerror(SHOAL_ERR_TIMEOUT), "timed out", "strerror");
    tap_is_str(shoal_status_name(SHOAL_ERR_PEER_FAILED), "SHOAL_ERR_PEER_FAILED", "status name");
    tap_is_str(shoal_strerror((shoal_status_t)-999), "unknown status", "unknown status");
    tap_is_str(shoal_version_string(), "shoal " PACKAGE_VERSION, "version");
    tap_is_str(shoal_dtype_name(SHOAL_FLOAT16), "half", "dtype name half");
    tap_is_str(shoal_dtype_name(SHOAL_FLOAT32), "float", "dtype name float");
    tap_is_int(shoal_dtype_size(SHOAL_BFLOAT16), 2, "bfloat16 size");
    tap_is_int(shoal_dtype_size(SHOAL_FLOAT64), 8, "double size");
    tap_is_int(shoal_dtype_size(SHOAL_DTYPE_COUNT), 0, "bad dtype size 0");
    tap_is_str(shoal_op_name(SHOAL_AVG), "avg", "op name");
    tap_ok(shoal_status_is_fatal(SHOAL_ERR_PEER_FAILED) && !shoal_status_is_fatal(SHOAL_ERR_AUTH) &&
               !shoal_status_is_fatal(SHOAL_ERR_TIMEOUT), "fatal range");
}

static void test_time(void)
{
    uint64_t d = shoal_deadline_ns(50), t0 = shoal_time_ns();
    int left = shoal_deadline_left_ms(d, 1000);

    tap_ok(shoal_deadline_ns(-1) == UINT64_MAX && !shoal_deadline_passed(UINT64_MAX),
           "infinite deadline never passes");
    tap_ok(left > 0 && left <= 50, "left %d ms of 50", left);
    tap_is_int(shoal_deadline_left_ms(d, 10), 10, "left capped");
    shoal_sleep_us(2000);
    tap_ok(shoal_time_ns() - t0 >= 2000000ull, "slept 2 ms");
    tap_ok(shoal_deadline_passed(shoal_deadline_ns(0)), "zero deadline passed");
    tap_is_int(shoal_deadline_left_ms(shoal_deadline_ns(0), 100), 0, "nothing left");
}

static const shoal_cfg_field_t *test_util_field(const char *name)
{
    size_t i;

    for (i = 0; i < shoal_util_cfg_table.nfields; i++) {
        if (strcmp(shoal_util_cfg_table.fields[i].name, name) == 0)
            return &shoal_util_cfg_table.fields[i];
    }
    return NULL;
}

/* The logger's set-up in a fresh process (the configuration is read once per process: the
 * child is forked before this one reads it): the child sets the variables of env ("NAME=value",
 * NULL-terminated), reads the configuration, logs one warning and exits; its stderr goes to
 * err_path. 0 when it exited 0 within 10 s, -1 when it hung (then it is killed) or failed. */
static int test_log_child(const char *const *env, const char *err_path)
{
    uint64_t deadline = shoal_deadline_ns(10000);
    int wst = 0;
    pid_t pid = fork();

    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
            _exit(3);
        for (; *env != NULL; env++)
            putenv((char *)(uintptr_t)*env);
        shoal_config_global_init();
        shoal_warn(INIT, "child warning");
        _exit(0);
    }
    while (waitpid(pid, &wst, WNOHANG) == 0) {
        if (shoal_deadline_passed(deadline)) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        shoal_sleep_us(10000);
    }
    return WIFEXITED(wst) && WEXITSTATUS(wst) == 0 ? 0 : -1;
}

/* Reads a small file whole into buf (empty when it cannot). */
static const char *test_slurp(const char *path, char *buf, size_t size)
{
    FILE *fp = fopen(path, "r");
    size_t n = 0;

    if (fp != NULL) {
        n = fread(buf, 1, size - 1, fp);
        fclose(fp);
    }
    buf[n] = '\0';
    return buf;
}

/* SHOAL_DEBUG_FILE naming a FIFO that no one reads (anyone may leave one at a path in /tmp):
 * the first call into the library waited in open() for a reader, for ever. It must go on,
 * logging to stderr and saying why. */
static void test_log_file_fifo(void)
{
    char dir[] = "/tmp/shoal_test_logfifo.XXXXXX", fifo[96], err[96], env_file[128], text[4096];
    const char *env[] = {env_file, "SHOAL_DEBUG=WARN", NULL};

    if (mkdtemp(dir) == NULL) {
        tap_skip(1, "mkdtemp failed");
        return;
    }
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    snprintf(err, sizeof(err), "%s/stderr", dir);
    snprintf(env_file, sizeof(env_file), "SHOAL_DEBUG_FILE=%s", fifo);
    if (mkfifo(fifo, 0600) != 0) {
        tap_skip(1, "mkfifo failed");
    } else {
        int r = test_log_child(env, err);

        test_slurp(err, text, sizeof(text));
        tap_ok(r == 0 && strstr(text, "SHOAL_DEBUG_FILE") != NULL &&
                   strstr(text, "child warning") != NULL,
               "SHOAL_DEBUG_FILE on a FIFO without a reader: no hang, logs to stderr (%s)",
               r == 0 ? text : "hung or failed");
    }
    unlink(fifo);
    unlink(err);
    rmdir(dir);
}

/* SHOAL_DEBUG_FILE=/tmp/shoal.log (a fixed name in a directory anyone may write to): another
 * user who made that file first, mode 0666, read every line the job logged (host names,
 * addresses, tenants, jobs). A file of another user there is refused: the log goes to stderr,
 * with the reason. Needs root (to give the file to another user); skipped otherwise. */
static void test_log_file_foreign(void)
{
    char dir[] = "/tmp/shoal_test_logown.XXXXXX", logf[96], err[96], env_file[128];
    char text[4096], etext[4096];
    const char *env[] = {env_file, "SHOAL_DEBUG=WARN", NULL};
    int fd, r;

    if (geteuid() != 0) {
        tap_skip(1, "not root: cannot give a file to another user");
        return;
    }
    if (mkdtemp(dir) == NULL) {
        tap_skip(1, "mkdtemp failed");
        return;
    }
    snprintf(logf, sizeof(logf), "%s/shoal.log", dir);
    snprintf(err, sizeof(err), "%s/stderr", dir);
    snprintf(env_file, sizeof(env_file), "SHOAL_DEBUG_FILE=%s", logf);
    fd = open(logf, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (chmod(dir, 01777) != 0 || fd < 0 || fchown(fd, 65534, 65534) != 0 ||
        fchmod(fd, 0666) != 0) {
        tap_skip(1, "cannot set up another user's file");
    } else {
        r = test_log_child(env, err);
        test_slurp(logf, text, sizeof(text));
        test_slurp(err, etext, sizeof(etext));
        tap_ok(r == 0 && text[0] == '\0' && strstr(etext, "SHOAL_DEBUG_FILE") != NULL &&
                   strstr(etext, "child warning") != NULL,
               "SHOAL_DEBUG_FILE: another user's file in a directory anyone may write to is not "
               "written; the log goes to stderr (file '%s', stderr '%s')", text, etext);
    }
    if (fd >= 0)
        close(fd);
    unlink(logf);
    unlink(err);
    rmdir(dir);
}

/* SHOAL_DEBUG_FILE at a symbolic link (one another user left at the fixed name in /tmp,
 * pointing at a file of the user's own): every line the job logged was appended to the
 * link's target. Another user's link is refused: the log goes to stderr, with the reason.
 * The user's own link (or root's: /dev/stderr) is followed, as before. Needs root (to give
 * the link to another user); skipped otherwise. */
static void test_log_file_symlink(void)
{
    char dir[] = "/tmp/shoal_test_loglink.XXXXXX", link[96], target[96], err[96];
    char env_file[128], text[4096], etext[4096];
    const char *env[] = {env_file, "SHOAL_DEBUG=WARN", NULL};
    int fd, r;

    if (mkdtemp(dir) == NULL) {
        tap_skip(1, "mkdtemp failed");
        return;
    }
    snprintf(link, sizeof(link), "%s/shoal.log", dir);
    snprintf(target, sizeof(target), "%s/target", dir);
    snprintf(err, sizeof(err), "%s/stderr", dir);
    snprintf(env_file, sizeof(env_file), "SHOAL_DEBUG_FILE=%s", link);
    fd = open(target, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || symlink(target, link) != 0) {
        tap_skip(2, "cannot set up a link");
    } else {
        r = test_log_child(env, err);
        test_slurp(target, text, sizeof(text));
        tap_ok(r == 0 && strstr(text, "child warning") != NULL,
               "SHOAL_DEBUG_FILE at the user's own symbolic link: its target gets the log "
               "(target '%s')", text);
        unlink(err);
        if (geteuid() != 0 || lchown(link, 65534, 65534) != 0) {
            tap_skip(1, "not root: cannot give a link to another user");
        } else {
            if (ftruncate(fd, 0) != 0) {
                text[0] = 'x';
            }
            r = test_log_child(env, err);
            test_slurp(target, text, sizeof(text));
            test_slurp(err, etext, sizeof(etext));
            tap_ok(r == 0 && text[0] == '\0' && strstr(etext, "SHOAL_DEBUG_FILE") != NULL &&
                       strstr(etext, "child warning") != NULL,
                   "SHOAL_DEBUG_FILE at another user's symbolic link: its target is not "
                   "written; the log goes to stderr (target '%s', stderr '%s')", text, etext);
        }
    }
    if (fd >= 0)
        close(fd);
    unlink(link);
    unlink(target);
    unlink(err);
    rmdir(dir);
}

/* A process started with stderr closed (prog 2>&-, a daemon that closed 0-2): the next file
 * or socket it opened took fd 2, and every log line went into it (into a data file, or a
 * transport's byte stream as garbage for the peer). The lines are dropped instead. */
static void test_log_stderr_closed(void)
{
    char dir[] = "/tmp/shoal_test_logfd2.XXXXXX", data[96], text[4096];
    uint64_t deadline = shoal_deadline_ns(10000);
    int wst = -1;
    pid_t pid;

    if (mkdtemp(dir) == NULL) {
        tap_skip(1, "mkdtemp failed");
        return;
    }
    snprintf(data, sizeof(data), "%s/data", dir);
    pid = fork();
    if (pid == 0) {
        int fd;

        close(STDERR_FILENO);
        putenv("SHOAL_DEBUG=WARN");
        shoal_config_global_init();
        fd = open(data, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd != STDERR_FILENO)
            _exit(3);
        shoal_warn(INIT, "child warning");
        _exit(0);
    }
    while (pid > 0 && waitpid(pid, &wst, WNOHANG) == 0) {
        if (shoal_deadline_passed(deadline)) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            wst = -1;
            break;
        }
        shoal_sleep_us(10000);
    }
    test_slurp(data, text, sizeof(text));
    tap_ok(pid > 0 && wst == 0 && text[0] == '\0',
           "stderr closed at init: a log line does not go into the file that took fd 2 "
           "(status %d, file '%s')", wst, text);
    unlink(data);
    rmdir(dir);
}

/* The logger's own warnings (a bad SHOAL_DEBUG_SUBSYS) obey SHOAL_DEBUG_FILE and SHOAL_DEBUG
 * like every other: they were written to stderr before the file was opened and before the
 * level was set, so SHOAL_DEBUG=NONE still printed one, and the file never had it. */
static void test_log_init_warnings(void)
{
    char dir[] = "/tmp/shoal_test_loginit.XXXXXX", logf[96], err[96], env_file[128];
    char text[4096], etext[4096];
    const char *env_file_bad[] = {env_file, "SHOAL_DEBUG_SUBSYS=NOSUCH", NULL};
    const char *env_none_bad[] = {"SHOAL_DEBUG=NONE", "SHOAL_DEBUG_SUBSYS=NOSUCH", NULL};
    int r;

    if (mkdtemp(dir) == NULL) {
        tap_skip(2, "mkdtemp failed");
        return;
    }
    snprintf(logf, sizeof(logf), "%s/log", dir);
    snprintf(err, sizeof(err), "%s/stderr", dir);
    snprintf(env_file, sizeof(env_file), "SHOAL_DEBUG_FILE=%s", logf);
    r = test_log_child(env_file_bad, err);
    test_slurp(logf, text, sizeof(text));
    test_slurp(err, etext, sizeof(etext));
    tap_ok(r == 0 && strstr(text, "SHOAL_DEBUG_SUBSYS=NOSUCH") != NULL &&
               strstr(text, "child warning") != NULL && etext[0] == '\0',
           "a bad SHOAL_DEBUG_SUBSYS is warned about in SHOAL_DEBUG_FILE, nothing on stderr "
           "(file '%s', stderr '%s')", text, etext);
    r = test_log_child(env_none_bad, err);
    test_slurp(err, etext, sizeof(etext));
    tap_ok(r == 0 && etext[0] == '\0', "SHOAL_DEBUG=NONE: no warning at all (stderr '%s')",
           etext);
    unlink(logf);
    unlink(err);
    rmdir(dir);
}

/* Environment > conf file > default; warnings go to SHOAL_DEBUG_FILE. */
static void test_global_init(void)
{
    char dir[] = "/tmp/shoal_test_config.XXXXXX", conf[256], logpath[256], logtext[8192];
    char *expanded;
    FILE *fp;
    size_t n = 0;
    int loglen;

    if (mkdtemp(dir) == NULL) {
        tap_skip(11, "mkdtemp failed");
        return;
    }
    snprintf(conf, sizeof(conf), "%s/shoal.conf", dir);
    fp = fopen(conf, "w");
    fprintf(fp, "# comment\n\nSHOAL_HOSTID = node-a\nSHOAL_DEBUG_SUBSYS=INIT\n"
                "SHOAL_NOT_A_KNOB=1\ngarbage line\n");
    fclose(fp);
    snprintf(logpath, sizeof(logpath), "%s/log.%%h.%%p", dir);
    setenv("SHOAL_CONF_FILE", conf, 1);
    setenv("SHOAL_DEBUG_FILE", logpath, 1);
    setenv("SHOAL_DEBUG", "bogus", 1);
    setenv("SHOAL_DEBUG_SUBSYS", "^TCP", 1);
    setenv("SHOAL_TOTALLY_UNKNOWN", "x", 1);
    shoal_config_global_init();
    shoal_config_global_init();

    tap_is_int(shoal_util_config.level, SHOAL_LOG_WARN, "bad SHOAL_DEBUG keeps WARN");
    tap_is_str(shoal_util_config.subsys, "^TCP", "env beats the conf file");
    tap_is_str(shoal_cfg_source(test_util_field("DEBUG_SUBSYS")), "env", "source env");
    tap_is_str(shoal_util_config.hostid, "node-a", "conf file beats the default");
    tap_is_str(shoal_cfg_source(test_util_field("HOSTID")), "file", "source file");
    tap_is_str(shoal_cfg_source(test_util_field("DEBUG")), "default", "source default");
    tap_is_str(shoal_cfg_getenv("HOSTID"), "node-a", "getenv falls back to the conf file");
    tap_is_int(shoal_host_id(), shoal_hash64("node-a", 6, 0), "host id from SHOAL_HOSTID");

    snprintf(logpath, sizeof(logpath), "%s/log.%s.%d", dir, shoal_hostname(), (int)getpid());
    shoal_warn(INIT, "after init %d", 42);
    shoal_warn(TCP, "tcp is masked out");
    shoal_info(INIT, "info is above the level");
    fp = fopen(logpath, "r");
    if (fp != NULL) {
        n = fread(logtext, 1, sizeof(logtext) - 1, fp);
        fclose(fp);
    }
    logtext[n] = '\0';
    tap_ok(fp != NULL && strstr(logtext, "SHOAL_DEBUG=bogus") != NULL &&
               strstr(logtext, "SHOAL_TOTALLY_UNKNOWN") != NULL &&
               strstr(logtext, "SHOAL_NOT_A_KNOB") != NULL && strstr(logtext, ":6:") != NULL,
           "warnings name the bad value, unknown variables and the bad line");
    loglen = asprintf(&expanded, "%s:%d:", shoal_hostname(), (int)getpid());
    tap_ok(loglen > 0 && strstr(logtext, expanded) != NULL &&
               strstr(logtext, " shoal WARN [INIT] after init 42\n") != NULL &&
               strstr(logtext, "masked") == NULL && strstr(logtext, "above the level") == NULL,
           "log line format, level and subsystem mask");
    if (loglen > 0)
        free(expanded);
    if (getenv("TEST_CONFIG_VERBOSE") != NULL)
        tap_diag("log %s:\n%s", logpath, logtext);
    unlink(logpath);
    unlink(conf);
    rmdir(dir);
}

/* The tools' child runner (gnuplot): exit status, a program that is not there, the deadline
 * (a child that outlives it is killed, not waited for), the directory it runs in. */
static void test_child_run(void)
{
    char *ok_argv[] = {"true", NULL};
    char *fail_argv[] = {"false", NULL};
    char *none_argv[] = {"shoal-no-such-program-here", NULL};
    char *sleep_argv[] = {"sleep", "30", NULL};
    char *pwd_argv[] = {"sh", "-c", "test \"$(pwd)\" = /", NULL};
    /* a /dev/null above 2 that is not /dev/null in this process (sh's parent) came from the
     * runner */
    char *nofd_argv[] = {"sh", "-c", "for f in /proc/$$/fd/*; do n=${f##*/}; "
                         "[ \"$n\" -gt 2 ] && [ \"$(readlink $f)\" = /dev/null ] && "
                         "[ \"$(readlink /proc/$PPID/fd/$n)\" != /dev/null ] && exit 1; "
                         "done; exit 0", NULL};
    volatile sig_atomic_t pid = -1;
    char why[256] = "";
    uint64_t t0;
    int r;

    tap_is_int(shoal_child_run(ok_argv, NULL, 1, 5000, &pid, why, sizeof(why)), 0,
               "child run: true exits 0");
    tap_is_int(pid, 0, "child run: the pid slot is cleared after");
    r = shoal_child_run(fail_argv, NULL, 1, 5000, NULL, why, sizeof(why));
    tap_ok(r == -1 && strstr(why, "false failed") != NULL, "child run: false fails (%s)", why);
    r = shoal_child_run(none_argv, NULL, 1, 5000, NULL, why, sizeof(why));
    tap_ok(r == -1 && strstr(why, "cannot run shoal-no-such-program-here") != NULL,
           "child run: a missing program is named (%s)", why);
    t0 = shoal_time_ns();
    r = shoal_child_run(sleep_argv, NULL, 1, 300, NULL, why, sizeof(why));
    tap_ok(r == -1 && strstr(why, "killed") != NULL && shoal_time_ns() - t0 < 5000000000ull,
           "child run: killed at its deadline (%s, %.2f s)", why, (shoal_time_ns() - t0) / 1e9);
    tap_is_int(shoal_child_run(pwd_argv, "/", 1, 5000, NULL, why, sizeof(why)), 0,
               "child run: runs in the directory given");
    /* A directory it cannot enter is named as such: it was "cannot run true (not
     * installed?)", which sent the user after a program that was there. */
    r = shoal_child_run(ok_argv, "/nonexistent/shoal-test-dir", 1, 5000, NULL, why, sizeof(why));
    tap_ok(r == -1 && strstr(why, "/nonexistent/shoal-test-dir") != NULL &&
               strstr(why, "No such file") != NULL && strstr(why, "not installed") == NULL,
           "child run: a directory that is not there is named, not the program (%s)", why);
    /* The child's own /dev/null descriptor (opened for its stdout) went on into the program
     * it ran, an fd above 2 that it never asked for. */
    r = shoal_child_run(nofd_argv, NULL, 1, 5000, NULL, why, sizeof(why));
    tap_ok(r == 0, "child run: no /dev/null descriptor above 2 in the program run (%s)", why);
}

/* SHOAL_CONNECT's doc names every transport that connects lazily (SHOAL_TL_CAP_LAZY) and says
 * of none of them that it cannot: it said "ib, which cannot, stays eager" long after ib
 * connected its queue pairs at first use (transports/ib/ib_lazy.c). */
static void test_connect_doc(void)
{
    const char *doc = NULL;
    int wrong = 0;
    for (size_t t = 0; t < shoal_cfg_ntables; t++) {
        for (size_t i = 0; i < shoal_cfg_tables[t]->nfields; i++) {
            const shoal_cfg_field_t *f = &shoal_cfg_tables[t]->fields[i];
            if (f->name != NULL && strcmp(f->name, "CONNECT") == 0) {
                doc = f->doc;
            }
        }
    }
    for (size_t i = 0; doc != NULL && i < shoal_tl_count(); i++) {
        const shoal_tl_ops_t *ops = shoal_tl_get(i);
        char cannot[64];
        if ((ops->caps & SHOAL_TL_CAP_LAZY) == 0) {
            continue;
        }
        snprintf(cannot, sizeof(cannot), "%s, which cannot", ops->name);
        if (strstr(doc, ops->name) == NULL || strstr(doc, cannot) != NULL) {
            tap_diag("SHOAL_CONNECT's doc on %s, which connects lazily: \"%s\"", ops->name,
                     doc);
            wrong++;
        }
    }
    tap_ok(doc != NULL && wrong == 0, "SHOAL_CONNECT's doc names each of the %zu transports "
           "built here that connect at first use as one that does", shoal_tl_count());
}

/* shoal_config_t.algorithm takes the names SHOAL_ALGO takes, in any case, as SHOAL_ALGO does
 * ("RD" was refused with SHOAL_ERR_INVALID_ARG). */
static void test_config_algorithm(void)
{
    static const char *const names[] = {"RD", "Ring", "bogus"};
    static const shoal_status_t want[] = {SHOAL_OK, SHOAL_OK, SHOAL_ERR_INVALID_ARG};
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(names); i++) {
        shoal_config_t cfg = SHOAL_CONFIG_INIT;
        shoal_comm_t comm = NULL;
        shoal_uid_t uid;
        shoal_status_t st;
        cfg.algorithm = names[i];
        cfg.transport = "tcp";
        st = shoal_get_unique_id(&uid);
        if (st == SHOAL_OK) {
            st = shoal_comm_init(&comm, 1, 0, &uid, &cfg);
        }
        if (comm != NULL) {
            shoal_comm_destroy(comm);
        }
        tap_ok(st == want[i], "shoal_config_t.algorithm \"%s\": %s", names[i],
               shoal_status_name(st));
    }
}

/* A file the provider's side leaves (a stop file, a rates page) under a directory whose parent
 * others may write to without the sticky bit: they could move its directory away and put
 * their own in its place, a file of theirs in it (both passed the checks). */
static void test_provider_file(void)
{
    char base[] = "/tmp/shoal-prov-XXXXXX", open_dir[64], sub[80], file[96];
    struct stat sb;
    const char *why1 = "setup", *why2 = "setup";
    FILE *fp;

    if (mkdtemp(base) == NULL) {
        tap_skip(2, "mkdtemp failed");
        return;
    }
    snprintf(open_dir, sizeof(open_dir), "%s/open", base);
    snprintf(sub, sizeof(sub), "%s/jobs", open_dir);
    snprintf(file, sizeof(file), "%s/stop", sub);
    if (mkdir(open_dir, 0755) == 0 && chmod(open_dir, 0777) == 0 && mkdir(sub, 0755) == 0 &&
        (fp = fopen(file, "w")) != NULL && fclose(fp) == 0 && chmod(file, 0644) == 0 &&
        stat(file, &sb) == 0) {
        why1 = shoal_provider_file_untrusted(file, &sb);
        if (chmod(open_dir, 01777) == 0) {
            why2 = shoal_provider_file_untrusted(file, &sb);
        }
    }
    tap_ok(why1 != NULL && strstr(why1, "a directory above it") != NULL,
           "a provider file under a directory whose parent is mode 0777: untrusted (%s)",
           why1 != NULL ? why1 : "trusted");
    tap_ok(why2 == NULL, "... with the sticky bit (as /tmp): trusted (%s)",
           why2 != NULL ? why2 : "trusted");
    /* Another user made the directory under the sticky one before the provider did (anyone
     * may), and the file in it: it was trusted, and a stranger stopped the job. */
    if (geteuid() == 0) {
        const char *why3 = "setup";
        if (chown(sub, 65534, 65534) == 0 && chown(file, 65534, 65534) == 0 &&
            stat(file, &sb) == 0) {
            why3 = shoal_provider_file_untrusted(file, &sb);
        }
        tap_ok(why3 != NULL && strstr(why3, "belongs to another user") != NULL,
               "... a stranger's directory under the sticky one, their file in it: untrusted "
               "(%s)", why3 != NULL ? why3 : "trusted");
    } else {
        tap_skip(1, "not root: no stranger's directory to make");
    }
    unlink(file);
    rmdir(sub);
    rmdir(open_dir);
    rmdir(base);
}

/* The one strict decimal reader the ledger, shoal-cred, shoal-bill and the epoch use. */
static void test_parse_u64(void)
{
    static const char *bad[] = {"", " 1", "-1", "+1", "1 ", "0x10", "18446744073709551616",
                                "1e3", "one"};
    uint64_t v = 7;
    const char *end = NULL;
    int refused = 0;

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(bad); i++)
        refused += shoal_parse_u64(bad[i], UINT64_MAX, &v, NULL) != 0;
    tap_ok(refused == (int)SHOAL_ARRAY_SIZE(bad) && v == 7,
           "parse_u64 refuses white space, a sign, a base prefix, overflow and words (%d of %zu)",
           refused, SHOAL_ARRAY_SIZE(bad));
    tap_ok(shoal_parse_u64("18446744073709551615", UINT64_MAX, &v, NULL) == 0 &&
               v == UINT64_MAX && shoal_parse_u64("0", 0, &v, NULL) == 0 && v == 0,
           "parse_u64 takes 0 and 2^64 - 1");
    tap_ok(shoal_parse_u64("9223372036854775808", INT64_MAX, &v, NULL) != 0 &&
               shoal_parse_u64("9223372036854775807", INT64_MAX, &v, NULL) == 0,
           "parse_u64 holds to its bound");
    tap_ok(shoal_parse_u64("12,34", 100, &v, &end) == 0 && v == 12 && end != NULL &&
               *end == ',' && shoal_parse_u64("12,34", 100, &v, NULL) != 0,
           "parse_u64 with end_p stops after the digits; without, the text must end there");
}

int main(void)
{
    /* first: each forks a child that reads the configuration for the first time */
    test_log_file_fifo();
    test_log_file_foreign();
    test_log_file_symlink();
    test_log_stderr_closed();
    test_log_init_warnings();
    test_tables();
    test_parsers();
    test_subsys();
    test_crypto();
    test_status();
    test_time();
    test_global_init();
    test_child_run();
    test_connect_doc();
    test_config_algorithm();
    test_provider_file();
    test_parse_u64();
    return tap_done();
}
