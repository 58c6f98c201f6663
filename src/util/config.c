/* Env-var config tables: parsers, SHOAL_CONF_FILE, the one getenv of the library. */
#include "util/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHOAL_CFG_PREFIX "SHOAL_"
#define SHOAL_CFG_PREFIX_LEN 6
#define SHOAL_CFG_NAME_MAX 128

extern char **environ;

/* Variables that are not in a table: set by launchers (shoalrun) or read by the config
 * module itself. Known, so not warned about. */
static const char *const shoal_cfg_extra_names[] = {
    "CONF_FILE", "UID", "RANK", "NRANKS", "ROOT", "LOCAL_RANK", "LOCAL_SIZE",
};

/* Where each field's value came from; bad_* records a rejected value, warned about once
 * after the logger is set up (so SHOAL_DEBUG and SHOAL_DEBUG_FILE apply to the warning). */
typedef struct {
    const shoal_cfg_field_t *field;
    const void *dst;          /* the field in its module's struct */
    const char *source;       /* "default", "file", "env" */
    const char *bad_source;   /* NULL, "file" or "env" */
    const char *bad_text;
} shoal_cfg_origin_t;

typedef struct {
    const char *name;         /* without the prefix */
    const char *value;
    int line;
} shoal_cfg_file_entry_t;

/* A string kept for the life of the process: reachable from shoal_cfg_pool, never freed. */
typedef struct shoal_cfg_str {
    struct shoal_cfg_str *next;
    char text[];
} shoal_cfg_str_t;

static pthread_once_t shoal_cfg_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t shoal_cfg_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static shoal_cfg_str_t *shoal_cfg_pool;
static shoal_cfg_origin_t *shoal_cfg_origins;
static size_t shoal_cfg_norigins;
static shoal_cfg_file_entry_t *shoal_cfg_file_entries;
static size_t shoal_cfg_file_nentries;
static const char *shoal_cfg_file_path;
static int shoal_cfg_file_errno;     /* open() failed with this errno */
static int shoal_cfg_file_bad_line;  /* first malformed line, 0 if none */
static const char *shoal_cfg_file_why; /* opened but not read: why, for the warning */

/* A configuration file is a few hundred lines: larger is a mistake (SHOAL_CONF_FILE=/dev/zero
 * grew one getline line until the memory ran out). */
#define SHOAL_CFG_FILE_MAX (1 << 20)

/* ---- secret strings -----------------------------------------------------------------
 *
 * The values of rows flagged SHOAL_CFG_F_SECRET (SHOAL_UID, SHOAL_SECRET, ...) are kept out
 * of the pool: each lives in its own anonymous mapping, left out of core dumps
 * (MADV_DONTDUMP) and locked in memory when RLIMIT_MEMLOCK allows (never swapped; a failed
 * mlock is ignored). A value replaced while the tables are parsed (the conf file's, then the
 * environment's) is wiped and unmapped at once. The value in force stays for the life of the
 * process, because shoal_comm_init_env may be called again (a second communicator of the
 * job); the library registers no exit handler to wipe it (a library must not), the process's
 * exit returns the pages to the kernel, which clears them before reuse. A child forked
 * (without exec) keeps a copy of the page like the rest of its parent's memory; a child
 * exec'ed does not see the value at all (shoal_cfg_secret_scrub_env). */
typedef struct {
    size_t map_len;
    char text[];
} shoal_cfg_secret_t;

static const char *shoal_cfg_secret_strdup(const char *s, size_t len)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t map_len = SHOAL_ALIGN_UP(sizeof(shoal_cfg_secret_t) + len + 1,
                                    (size_t)(page > 0 ? page : 4096));
    shoal_cfg_secret_t *node;

    node = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (node == MAP_FAILED)
        return NULL;
#ifdef MADV_DONTDUMP
    (void)madvise(node, map_len, MADV_DONTDUMP);
#endif
    (void)mlock(node, map_len);
    node->map_len = map_len;
    memcpy(node->text, s, len);
    node->text[len] = '\0';
    return node->text;
}

static void shoal_cfg_secret_free(const char *text)
{
    shoal_cfg_secret_t *node;
    size_t map_len;

    if (text == NULL)
        return;
    node = (shoal_cfg_secret_t *)(void *)((char *)(uintptr_t)text -
                                          offsetof(shoal_cfg_secret_t, text));
    map_len = node->map_len;
    shoal_secret_wipe(node, map_len);
    (void)munlock(node, map_len);
    munmap(node, map_len);
}

/* ---- string pool -------------------------------------------------------------------- */

static const char *shoal_cfg_strdup(const char *s, size_t len)
{
    shoal_cfg_str_t *node = malloc(sizeof(*node) + len + 1);

    if (node == NULL)
        return NULL;
    memcpy(node->text, s, len);
    node->text[len] = '\0';
    pthread_mutex_lock(&shoal_cfg_pool_lock);
    node->next = shoal_cfg_pool;
    shoal_cfg_pool = node;
    pthread_mutex_unlock(&shoal_cfg_pool_lock);
    return node->text;
}

/* ---- parsers ------------------------------------------------------------------------ */

/* text without its leading and trailing blanks: the start, and its length in *len_p. */
static const char *shoal_cfg_span(const char *text, size_t *len_p)
{
    size_t len;

    while (isspace((unsigned char)*text))
        text++;
    len = strlen(text);
    while (len > 0 && isspace((unsigned char)text[len - 1]))
        len--;
    *len_p = len;
    return text;
}

/* Copies text without leading/trailing blanks into buf; 0 if it does not fit. */
static int shoal_cfg_trim(const char *text, char *buf, size_t size)
{
    size_t len;

    text = shoal_cfg_span(text, &len);
    if (len >= size)
        return 0;
    memcpy(buf, text, len);
    buf[len] = '\0';
    return 1;
}

static int shoal_cfg_parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"y", "yes", "1", "true", "on"};
    static const char *const no[] = {"n", "no", "0", "false", "off"};
    size_t i;

    for (i = 0; i < SHOAL_ARRAY_SIZE(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

static int shoal_cfg_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    long long v;

    if (*s == '\0')
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Unsigned decimal prefix of s; end_p points past the digits. */
static int shoal_cfg_parse_digits(const char *s, unsigned long long *out, const char **end_p)
{
    unsigned long long v = 0;
    const char *p = s;

    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned long long d = (unsigned long long)(*p - '0');

        if (v > (ULLONG_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    *end_p = p;
    return 0;
}

int shoal_parse_u64(const char *s, uint64_t max, uint64_t *out, const char **end_p)
{
    unsigned long long v;
    const char *end;

    if (s == NULL || shoal_cfg_parse_digits(s, &v, &end) != 0 || v > max)
        return -1;
    if (end_p != NULL)
        *end_p = end;
    else if (*end != '\0')
        return -1;
    *out = v;
    return 0;
}

/* "4096", "64k", "4m", "1g" (powers of 1024; "kb"/"kib" spellings accepted). */
static int shoal_cfg_parse_size(const char *s, size_t *out)
{
    unsigned long long v, mult = 1;
    const char *p;

    if (shoal_cfg_parse_digits(s, &v, &p) != 0)
        return -1;
    switch (tolower((unsigned char)*p)) {
    case 'k': mult = 1ull << 10; p++; break;
    case 'm': mult = 1ull << 20; p++; break;
    case 'g': mult = 1ull << 30; p++; break;
    default: break;
    }
    if (mult != 1 && strcasecmp(p, "b") != 0 && strcasecmp(p, "ib") != 0 && *p != '\0')
        return -1;
    if (mult == 1 && strcasecmp(p, "b") != 0 && *p != '\0')
        return -1;
    if (v > SIZE_MAX / mult)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

/* "100ms", "5s", "2m", "250" (ms), "inf" or a negative number (infinite: -1). */
static int shoal_cfg_parse_time(const char *s, int *out)
{
    unsigned long long v, mult;
    const char *p;
    long long neg;

    if (strcasecmp(s, "inf") == 0 || strcasecmp(s, "infinity") == 0) {
        *out = -1;
        return 0;
    }
    if (s[0] == '-') {
        if (shoal_cfg_parse_int(s, LLONG_MIN, -1, &neg) != 0)
            return -1;
        *out = -1;
        return 0;
    }
    if (shoal_cfg_parse_digits(s, &v, &p) != 0)
        return -1;
    if (*p == '\0' || strcasecmp(p, "ms") == 0)
        mult = 1;
    else if (strcasecmp(p, "s") == 0)
        mult = 1000;
    else if (strcasecmp(p, "m") == 0 || strcasecmp(p, "min") == 0)
        mult = 60000;
    else
        return -1;
    if (v > (unsigned long long)INT_MAX / mult)
        return -1;
    *out = (int)(v * mult);
    return 0;
}

static int shoal_cfg_parse_enum(const char *s, const char *const *names, int *out)
{
    int i;

    if (names == NULL)
        return -1;
    for (i = 0; names[i] != NULL; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return -1;
}

static int shoal_cfg_parse_string(const shoal_cfg_field_t *f, const char *text, void *dst)
{
    const char *copy = NULL;
    size_t len;

    /* trimmed, as a value of the conf file is (SHOAL_SOCKET_IFNAME="eth0 " named no
     * interface) */
    text = shoal_cfg_span(text, &len);
    if (len > 0) {
        copy = (f->flags & SHOAL_CFG_F_SECRET) ? shoal_cfg_secret_strdup(text, len)
                                               : shoal_cfg_strdup(text, len);
        if (copy == NULL)
            return -1;
    }
    *(const char **)dst = copy;
    return 0;
}

int shoal_cfg_parse_value(const shoal_cfg_field_t *f, const char *text, void *dst)
{
    char s[SHOAL_CFG_NAME_MAX];
    long long ll;
    size_t z;
    int i;

    if (f == NULL || text == NULL || dst == NULL)
        return -1;
    if (f->type == SHOAL_CFG_STRING)
        return shoal_cfg_parse_string(f, text, dst);
    if (!shoal_cfg_trim(text, s, sizeof(s)))
        return -1;
    switch (f->type) {
    case SHOAL_CFG_BOOL:
    case SHOAL_CFG_TIME:
    case SHOAL_CFG_ENUM:
        if ((f->type == SHOAL_CFG_BOOL && shoal_cfg_parse_bool(s, &i) != 0) ||
            (f->type == SHOAL_CFG_TIME && shoal_cfg_parse_time(s, &i) != 0) ||
            (f->type == SHOAL_CFG_ENUM && shoal_cfg_parse_enum(s, f->enum_names, &i) != 0))
            return -1;
        *(int *)dst = i;
        return 0;
    case SHOAL_CFG_INT:
        if (shoal_cfg_parse_int(s, INT_MIN, INT_MAX, &ll) != 0)
            return -1;
        *(int *)dst = (int)ll;
        return 0;
    case SHOAL_CFG_UINT:
        if (s[0] == '-' || shoal_cfg_parse_int(s, 0, UINT_MAX, &ll) != 0)
            return -1;
        *(unsigned *)dst = (unsigned)ll;
        return 0;
    case SHOAL_CFG_SIZE:
        if (shoal_cfg_parse_size(s, &z) != 0)
            return -1;
        *(size_t *)dst = z;
        return 0;
    default:
        return -1;
    }
}

/* ---- formatting --------------------------------------------------------------------- */

static void shoal_cfg_format_size(size_t v, char *buf, size_t len)
{
    if (v != 0 && v % (1ull << 30) == 0)
        snprintf(buf, len, "%zug", v >> 30);
    else if (v != 0 && v % (1ull << 20) == 0)
        snprintf(buf, len, "%zum", v >> 20);
    else if (v != 0 && v % (1ull << 10) == 0)
        snprintf(buf, len, "%zuk", v >> 10);
    else
        snprintf(buf, len, "%zu", v);
}

static void shoal_cfg_format_time(int ms, char *buf, size_t len)
{
    if (ms < 0)
        snprintf(buf, len, "inf");
    else if (ms != 0 && ms % 60000 == 0)
        snprintf(buf, len, "%dm", ms / 60000);
    else if (ms != 0 && ms % 1000 == 0)
        snprintf(buf, len, "%ds", ms / 1000);
    else
        snprintf(buf, len, "%dms", ms);
}

static const char *shoal_cfg_enum_name(const shoal_cfg_field_t *f, int v)
{
    int i;

    for (i = 0; f->enum_names != NULL && f->enum_names[i] != NULL; i++) {
        if (i == v)
            return f->enum_names[i];
    }
    return "?";
}

void shoal_cfg_format_value(const shoal_cfg_field_t *f, const void *src, char *buf, size_t len)
{
    const char *s;

    if (len == 0)
        return;
    if (f->flags & SHOAL_CFG_F_SECRET) {
        /* Never the value itself: whether it is set, nothing more. */
        if (f->type == SHOAL_CFG_STRING) {
            s = *(const char *const *)src;
            snprintf(buf, len, "%s", s != NULL && s[0] != '\0' ? "<set>" : "<unset>");
        } else {
            snprintf(buf, len, "<redacted>");
        }
        return;
    }
    switch (f->type) {
    case SHOAL_CFG_BOOL:
        snprintf(buf, len, "%s", *(const int *)src ? "yes" : "no");
        break;
    case SHOAL_CFG_INT:
        snprintf(buf, len, "%d", *(const int *)src);
        break;
    case SHOAL_CFG_UINT:
        snprintf(buf, len, "%u", *(const unsigned *)src);
        break;
    case SHOAL_CFG_SIZE:
        shoal_cfg_format_size(*(const size_t *)src, buf, len);
        break;
    case SHOAL_CFG_TIME:
        shoal_cfg_format_time(*(const int *)src, buf, len);
        break;
    case SHOAL_CFG_STRING:
        s = *(const char *const *)src;
        snprintf(buf, len, "%s", s != NULL ? s : "");
        break;
    case SHOAL_CFG_ENUM:
        snprintf(buf, len, "%s", shoal_cfg_enum_name(f, *(const int *)src));
        break;
    default:
        snprintf(buf, len, "?");
        break;
    }
}

/* ---- SHOAL_CONF_FILE ---------------------------------------------------------------- */

static int shoal_cfg_file_add(const char *name, size_t name_len, const char *value, int line)
{
    shoal_cfg_file_entry_t *entries;
    const char *n, *v;

    entries = realloc(shoal_cfg_file_entries,
                      (shoal_cfg_file_nentries + 1) * sizeof(*shoal_cfg_file_entries));
    if (entries == NULL)
        return -1;
    shoal_cfg_file_entries = entries;
    n = shoal_cfg_strdup(name, name_len);
    v = shoal_cfg_strdup(value, strlen(value));
    if (n == NULL || v == NULL)
        return -1;
    entries[shoal_cfg_file_nentries++] = (shoal_cfg_file_entry_t){
        .name = n, .value = v, .line = line};
    return 0;
}

int shoal_cfg_line_parse(char *line, const char **name_p, size_t *name_len_p,
                         const char **value_p)
{
    char *p = line, *eq, *name_end, *value;
    size_t len;

    while (isspace((unsigned char)*p))
        p++;
    if (*p == '\0' || *p == '#')
        return 0;
    eq = strchr(p, '=');
    if (eq == NULL || strncmp(p, SHOAL_CFG_PREFIX, SHOAL_CFG_PREFIX_LEN) != 0)
        return -1;
    name_end = eq;
    while (name_end > p && isspace((unsigned char)name_end[-1]))
        name_end--;
    p += SHOAL_CFG_PREFIX_LEN;
    if (name_end <= p)
        return -1;
    value = eq + 1;
    while (isspace((unsigned char)*value))
        value++;
    len = strlen(value);
    while (len > 0 && isspace((unsigned char)value[len - 1]))
        value[--len] = '\0';
    *name_p = p;
    *name_len_p = (size_t)(name_end - p);
    *value_p = value;
    return 1;
}

/* One line of the file; comments and blank lines are skipped. -1 on a malformed line. */
static int shoal_cfg_file_line(char *line, int lineno)
{
    const char *name, *value;
    size_t name_len;
    int ret = shoal_cfg_line_parse(line, &name, &name_len, &value);

    if (ret <= 0)
        return ret;
    return shoal_cfg_file_add(name, name_len, value, lineno);
}

static void shoal_cfg_file_load(void)
{
    const char *path = getenv("SHOAL_CONF_FILE");
    char *line = NULL, iobuf[4096];
    size_t cap = 0, total = 0;
    ssize_t n;
    int lineno = 0, fd;
    struct stat sb = {0};
    FILE *fp;

    if (path == NULL || path[0] == '\0')
        return;
    shoal_cfg_file_path = shoal_cfg_strdup(path, strlen(path));
    /* O_NONBLOCK: a FIFO at the path held the first call into the library in open() until a
     * writer came, for ever; it opens at once now and is refused as not a regular file. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        shoal_cfg_file_errno = errno;
        return;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > SHOAL_CFG_FILE_MAX) {
        shoal_cfg_file_why = S_ISREG(sb.st_mode) ? "is larger than 1 MiB: ignored"
                                                 : "is not a regular file (a FIFO, a directory, "
                                                   "a device): ignored";
        close(fd);
        return;
    }
    fp = fdopen(fd, "r");
    if (fp == NULL) {
        shoal_cfg_file_errno = errno;
        close(fd);
        return;
    }
    /* The stream reads into our buffer, wiped after: stdio's own would be freed with the
     * file's bytes (secrets included) still in it. */
    setvbuf(fp, iobuf, _IOFBF, sizeof(iobuf));
    while ((n = getline(&line, &cap, fp)) >= 0) {
        total += (size_t)n;
        if (total > SHOAL_CFG_FILE_MAX) {
            shoal_cfg_file_why = "grew past 1 MiB while it was read: the rest ignored";
            shoal_secret_wipe(line, cap);
            break;
        }
        lineno++;
        if (shoal_cfg_file_line(line, lineno) != 0 && shoal_cfg_file_bad_line == 0)
            shoal_cfg_file_bad_line = lineno;
        shoal_secret_wipe(line, cap); /* a line may hold a secret; getline may move it */
    }
    free(line);
    fclose(fp);
    shoal_secret_wipe(iobuf, sizeof(iobuf));
}

static const char *shoal_cfg_file_lookup(const char *name)
{
    size_t i;

    /* The last assignment wins, as in a shell script. */
    for (i = shoal_cfg_file_nentries; i > 0; i--) {
        if (strcmp(shoal_cfg_file_entries[i - 1].name, name) == 0)
            return shoal_cfg_file_entries[i - 1].value; /* NULL: a secret, wiped */
    }
    return NULL;
}

static const char *shoal_cfg_env_lookup(const char *name)
{
    char full[SHOAL_CFG_NAME_MAX];
    int n;

    n = snprintf(full, sizeof(full), SHOAL_CFG_PREFIX "%s", name);
    if (n < 0 || (size_t)n >= sizeof(full))
        return NULL;
    return getenv(full);
}

/* ---- global init -------------------------------------------------------------------- */

static shoal_cfg_origin_t *shoal_cfg_origin_find(const shoal_cfg_field_t *f)
{
    size_t i;

    for (i = 0; i < shoal_cfg_norigins; i++) {
        if (shoal_cfg_origins[i].field == f)
            return &shoal_cfg_origins[i];
    }
    return NULL;
}

/* Removes a secret variable from the environment once its value is read: the bytes of the
 * value are overwritten where they are (getenv points into the environment block itself, so
 * /proc/<pid>/environ no longer shows them either), then the variable is unset, so a child
 * the process starts (data-loader workers, system()) does not inherit it. Like every change
 * of the environment, this is not safe against another thread calling getenv or setenv at the
 * same time: it runs once, in the first shoal call that reads the configuration. */
/* Whether [lo, hi) lies in one readable and writable mapping (the block is on the stack,
 * unless a program moved it with prctl: then it is left alone rather than written blind). */
static int shoal_cfg_range_writable(unsigned long long lo, unsigned long long hi)
{
    FILE *fp = fopen("/proc/self/maps", "re");
    char line[512], perms[8];
    unsigned long long a, b;
    int ok = 0;

    if (fp == NULL)
        return 0;
    while (!ok && fgets(line, sizeof(line), fp) != NULL) {
        ok = sscanf(line, "%llx-%llx %7s", &a, &b, perms) == 3 && a <= lo && hi <= b &&
             perms[0] == 'r' && perms[1] == 'w';
    }
    fclose(fp);
    return ok;
}

/* The block the process was started with ([env_start, env_end) of /proc/self/stat, what
 * /proc/PID/environ shows): 0 if it cannot be read. */
static int shoal_cfg_env_block(char **start_p, char **end_p)
{
    unsigned long long v[2] = {0, 0};
    char buf[2048], *p;
    ssize_t len;
    int fd, field;

    fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return 0;
    buf[len] = '\0';
    p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL)
        return 0;
    p++;
    /* fields from 3 (state) on: env_start and env_end are the 50th and 51st */
    for (field = 3; field <= 51 && p != NULL; field++) {
        p += strspn(p, " ");
        if (field >= 50)
            v[field - 50] = strtoull(p, NULL, 10);
        p = strchr(p, ' ');
    }
    if (v[0] == 0 || v[1] <= v[0] || !shoal_cfg_range_writable(v[0], v[1]))
        return 0;
    *start_p = (char *)(uintptr_t)v[0];
    *end_p = (char *)(uintptr_t)v[1];
    return 1;
}

static void shoal_cfg_secret_scrub_env(const char *name)
{
    char full[SHOAL_CFG_NAME_MAX];
    char **env, *start, *end, *p;
    int n;

    n = snprintf(full, sizeof(full), SHOAL_CFG_PREFIX "%s=", name);
    if (n < 0 || (size_t)n >= sizeof(full))
        return;
    /* Every entry of the name, not only the one getenv finds: a block holding it twice
     * (env X=a X=b, a launcher that appends) kept the second value readable in
     * /proc/PID/environ, and unsetenv drops both entries from environ, so after it the
     * second's bytes could no longer be reached to wipe them. */
    for (env = environ; env != NULL && *env != NULL; env++) {
        if (strncmp(*env, full, (size_t)n) == 0)
            shoal_secret_wipe(*env + n, strlen(*env + n));
    }
    /* An entry the program set again (setenv, os.environ[...] =) points at a copy: the
     * launcher's stays in the block /proc/PID/environ shows, wiped there too. */
    if (shoal_cfg_env_block(&start, &end)) {
        for (p = start; p < end; p += strnlen(p, (size_t)(end - p)) + 1) {
            if ((size_t)(end - p) > (size_t)n && strncmp(p, full, (size_t)n) == 0)
                shoal_secret_wipe(p + n, strnlen(p + n, (size_t)(end - p) - (size_t)n));
        }
    }
    full[n - 1] = '\0';
    unsetenv(full);
}

/* A secret's earlier value in dst (default or conf file) is wiped once a later one wins. */
static int shoal_cfg_field_parse(const shoal_cfg_field_t *f, const char *text, void *dst)
{
    const char *before = f->type == SHOAL_CFG_STRING ? *(const char **)dst : NULL;

    if (shoal_cfg_parse_value(f, text, dst) != 0)
        return -1;
    if ((f->flags & SHOAL_CFG_F_SECRET) && before != NULL && before != *(const char **)dst)
        shoal_cfg_secret_free(before);
    return 0;
}

/* Default, then the conf file, then the environment; a bad value keeps the one before. The
 * text of a bad secret is never kept (the warning names the variable only). */
static void shoal_cfg_field_load(const shoal_cfg_table_t *t, const shoal_cfg_field_t *f,
                                 shoal_cfg_origin_t *o)
{
    void *dst = (char *)t->dst + f->offset;
    int secret = (f->flags & SHOAL_CFG_F_SECRET) != 0;
    const char *text;

    o->field = f;
    o->dst = dst;
    o->source = "default";
    if (shoal_cfg_parse_value(f, f->dflt, dst) != 0) {
        o->bad_source = "default";
        o->bad_text = f->dflt;
    }
    text = shoal_cfg_file_lookup(f->name);
    if (text != NULL) {
        if (shoal_cfg_field_parse(f, text, dst) == 0) {
            o->source = "file";
        } else {
            o->bad_source = "conf file";
            o->bad_text = secret ? NULL : text;
        }
    }
    text = shoal_cfg_env_lookup(f->name);
    if (text != NULL) {
        if (shoal_cfg_field_parse(f, text, dst) == 0) {
            o->source = "env";
        } else {
            o->bad_source = "environment";
            o->bad_text = secret ? NULL : shoal_cfg_strdup(text, strlen(text));
        }
        if (secret)
            shoal_cfg_secret_scrub_env(f->name);
    }
}

/* The conf file's copies of secret values, once every table has taken its own. */
static void shoal_cfg_file_wipe_secrets(void)
{
    size_t t, i, e;

    for (t = 0; t < shoal_cfg_ntables; t++) {
        const shoal_cfg_table_t *tab = shoal_cfg_tables[t];
        for (i = 0; i < tab->nfields; i++) {
            if (!(tab->fields[i].flags & SHOAL_CFG_F_SECRET))
                continue;
            for (e = 0; e < shoal_cfg_file_nentries; e++) {
                shoal_cfg_file_entry_t *ent = &shoal_cfg_file_entries[e];
                if (ent->value != NULL && strcmp(ent->name, tab->fields[i].name) == 0) {
                    shoal_secret_wipe((char *)(uintptr_t)ent->value, strlen(ent->value));
                    ent->value = NULL;
                }
            }
        }
    }
}

static int shoal_cfg_name_known(const char *name, size_t len)
{
    size_t i;

    for (i = 0; i < shoal_cfg_norigins; i++) {
        if (strlen(shoal_cfg_origins[i].field->name) == len &&
            strncmp(shoal_cfg_origins[i].field->name, name, len) == 0)
            return 1;
    }
    for (i = 0; i < SHOAL_ARRAY_SIZE(shoal_cfg_extra_names); i++) {
        if (strlen(shoal_cfg_extra_names[i]) == len &&
            strncmp(shoal_cfg_extra_names[i], name, len) == 0)
            return 1;
    }
    return 0;
}

static void shoal_cfg_report_bad(const shoal_cfg_origin_t *o)
{
    char cur[SHOAL_CFG_NAME_MAX];

    if (o->bad_source == NULL)
        return;
    if (strcmp(o->bad_source, "default") == 0) {
        shoal_warn(CONFIG, "built-in default of SHOAL_%s ('%s') does not parse", o->field->name,
                   o->bad_text);
        return;
    }
    shoal_cfg_format_value(o->field, o->dst, cur, sizeof(cur));
    if (o->bad_text == NULL) {
        /* A secret: its text is not repeated, even when it is wrong. */
        shoal_warn(CONFIG, "SHOAL_%s (from the %s) is not valid; keeping the value from the %s",
                   o->field->name, o->bad_source,
                   strcmp(o->source, "env") == 0 ? "environment" : o->source);
        return;
    }
    shoal_warn(CONFIG, "SHOAL_%s=%s (from the %s) is not valid; keeping '%s' (from the %s)",
               o->field->name, o->bad_text, o->bad_source, cur,
               strcmp(o->source, "env") == 0 ? "environment" : o->source);
}

/* Warnings, after the logger is set up: rejected values, unknown names, conf file trouble. */
static void shoal_cfg_report(void)
{
    const char *eq;
    size_t i;
    char **env;

    if (shoal_cfg_file_errno != 0) {
        shoal_warn(CONFIG, "cannot read SHOAL_CONF_FILE %s: %s", shoal_cfg_file_path,
                   strerror(shoal_cfg_file_errno));
    }
    if (shoal_cfg_file_why != NULL) {
        shoal_warn(CONFIG, "SHOAL_CONF_FILE %s %s", shoal_cfg_file_path, shoal_cfg_file_why);
    }
    if (shoal_cfg_file_bad_line != 0) {
        shoal_warn(CONFIG, "%s:%d: expected SHOAL_NAME=value; line ignored", shoal_cfg_file_path,
                   shoal_cfg_file_bad_line);
    }
    for (i = 0; i < shoal_cfg_norigins; i++)
        shoal_cfg_report_bad(&shoal_cfg_origins[i]);
    for (i = 0; i < shoal_cfg_file_nentries; i++) {
        const shoal_cfg_file_entry_t *e = &shoal_cfg_file_entries[i];
        if (!shoal_cfg_name_known(e->name, strlen(e->name)))
            shoal_warn(CONFIG, "%s:%d: unknown variable SHOAL_%s", shoal_cfg_file_path, e->line,
                       e->name);
    }
    for (env = environ; env != NULL && *env != NULL; env++) {
        if (strncmp(*env, SHOAL_CFG_PREFIX, SHOAL_CFG_PREFIX_LEN) != 0)
            continue;
        eq = strchr(*env, '=');
        if (eq == NULL)
            continue;
        if (!shoal_cfg_name_known(*env + SHOAL_CFG_PREFIX_LEN,
                                  (size_t)(eq - *env) - SHOAL_CFG_PREFIX_LEN))
            shoal_warn(CONFIG, "unknown environment variable %.*s (see shoal_info -c)",
                       (int)(eq - *env), *env);
    }
}

static void shoal_cfg_global_init_once(void)
{
    size_t t, i, n = 0;

    for (t = 0; t < shoal_cfg_ntables; t++)
        n += shoal_cfg_tables[t]->nfields;
    shoal_cfg_origins = calloc(n > 0 ? n : 1, sizeof(*shoal_cfg_origins));
    shoal_cfg_file_load();
    for (t = 0; t < shoal_cfg_ntables; t++) {
        const shoal_cfg_table_t *tab = shoal_cfg_tables[t];
        for (i = 0; i < tab->nfields; i++) {
            shoal_cfg_origin_t scratch = {.field = NULL};
            shoal_cfg_origin_t *o =
                shoal_cfg_origins != NULL ? &shoal_cfg_origins[shoal_cfg_norigins] : &scratch;
            shoal_cfg_field_load(tab, &tab->fields[i], o);
            if (shoal_cfg_origins != NULL)
                shoal_cfg_norigins++;
        }
    }
    shoal_cfg_file_wipe_secrets();
    shoal_log_init();
    shoal_cfg_report();
}

void shoal_config_global_init(void)
{
    pthread_once(&shoal_cfg_once, shoal_cfg_global_init_once);
}

const char *shoal_cfg_source(const shoal_cfg_field_t *f)
{
    const shoal_cfg_origin_t *o;

    shoal_config_global_init();
    o = shoal_cfg_origin_find(f);
    return o != NULL ? o->source : "default";
}

const char *shoal_cfg_getenv(const char *name)
{
    const char *v;

    if (name == NULL)
        return NULL;
    shoal_config_global_init();
    v = shoal_cfg_env_lookup(name);
    return v != NULL ? v : shoal_cfg_file_lookup(name);
}

const char *shoal_cfg_getenv_raw(const char *full_name)
{
    return full_name != NULL ? getenv(full_name) : NULL;
}
