/* Logging: "host:pid:tid shoal LEVEL [SUBSYS] msg", one write() per line. */
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SHOAL_LOG_LINE_MAX 1024
#define SHOAL_LOG_PATH_MAX 4096
#define SHOAL_LOG_SUBSYS_ALL ((1u << SHOAL_SUBSYS_COUNT) - 1u)

int shoal_log_level_cur = SHOAL_LOG_WARN;
unsigned shoal_log_subsys_mask = SHOAL_LOG_SUBSYS_ALL;

static int shoal_log_fd = STDERR_FILENO;
static pthread_once_t shoal_log_once = PTHREAD_ONCE_INIT;

static const char *const shoal_log_subsys_names[SHOAL_SUBSYS_COUNT] = {
#define SHOAL_SUBSYS_NAME_(n) [SHOAL_SUBSYS_BIT_##n] = #n,
    SHOAL_SUBSYS_MAP(SHOAL_SUBSYS_NAME_)
#undef SHOAL_SUBSYS_NAME_
};

const char *shoal_log_subsys_name(unsigned subsys_bit)
{
    if (subsys_bit >= SHOAL_SUBSYS_COUNT)
        return "?";
    return shoal_log_subsys_names[subsys_bit];
}

/* Mask for one token (trimmed of blanks); 0 if unknown. */
static unsigned shoal_log_subsys_token(const char *tok, size_t len)
{
    unsigned i;

    while (len > 0 && (*tok == ' ' || *tok == '\t')) {
        tok++;
        len--;
    }
    while (len > 0 && (tok[len - 1] == ' ' || tok[len - 1] == '\t'))
        len--;
    if (len == 3 && strncasecmp(tok, "ALL", 3) == 0)
        return SHOAL_LOG_SUBSYS_ALL;
    for (i = 0; i < SHOAL_SUBSYS_COUNT; i++) {
        if (strlen(shoal_log_subsys_names[i]) == len &&
            strncasecmp(tok, shoal_log_subsys_names[i], len) == 0)
            return 1u << i;
    }
    return 0;
}

int shoal_log_parse_subsys(const char *spec, unsigned *mask_p)
{
    unsigned mask = 0, bits;
    int exclude = 0;
    const char *p, *end;

    if (spec == NULL || spec[0] == '\0') {
        *mask_p = SHOAL_LOG_SUBSYS_ALL;
        return 1;
    }
    if (spec[0] == '^') {
        exclude = 1;
        mask = SHOAL_LOG_SUBSYS_ALL;
        spec++;
    }
    for (p = spec;; p = end + 1) {
        end = strchr(p, ',');
        if (end == NULL)
            end = p + strlen(p);
        bits = shoal_log_subsys_token(p, (size_t)(end - p));
        if (bits == 0)
            return 0;
        mask = exclude ? (mask & ~bits) : (mask | bits);
        if (*end == '\0')
            break;
    }
    *mask_p = mask;
    return 1;
}

/* Expands %h (host) and %p (pid) and %% in a SHOAL_DEBUG_FILE path; 0 if it does not fit. */
static int shoal_log_expand_path(const char *tmpl, char *out, size_t size)
{
    size_t n = 0;
    int w;

    for (; *tmpl != '\0'; tmpl++) {
        if (tmpl[0] == '%' && tmpl[1] == 'h') {
            w = snprintf(out + n, size - n, "%s", shoal_hostname());
            tmpl++;
        } else if (tmpl[0] == '%' && tmpl[1] == 'p') {
            w = snprintf(out + n, size - n, "%d", (int)getpid());
            tmpl++;
        } else if (tmpl[0] == '%' && tmpl[1] == '%') {
            w = snprintf(out + n, size - n, "%%");
            tmpl++;
        } else {
            w = snprintf(out + n, size - n, "%c", *tmpl);
        }
        if (w < 0 || (size_t)w >= size - n)
            return 0;
        n += (size_t)w;
    }
    out[n] = '\0';
    return 1;
}

/* A file at SHOAL_DEBUG_FILE that another user made, in a directory anyone may write to
 * (SHOAL_DEBUG_FILE=/tmp/shoal.log): made first, mode 0666, it let that user read every line
 * the job logged. Root's files and this user's are taken; other files where only their owner
 * could have put them (a shared log in a directory of its own) too. 1 if refused (warned). */
static int shoal_log_file_foreign(int fd, const char *path)
{
    char dir[SHOAL_LOG_PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t len = slash == NULL ? 1 : slash == path ? 1 : (size_t)(slash - path);
    struct stat sb, dsb;

    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid == geteuid() ||
        sb.st_uid == 0)
        return 0;
    memcpy(dir, slash == NULL ? "." : path, len);
    dir[len] = '\0';
    if (stat(dir, &dsb) != 0 || (dsb.st_mode & (S_IWGRP | S_IWOTH)) == 0)
        return 0;
    shoal_warn(CONFIG, "SHOAL_DEBUG_FILE %s belongs to uid %u, in a directory others may "
               "write to: another user could have made it to read this log; logging to stderr",
               path, (unsigned)sb.st_uid);
    return 1;
}

/* 1 if path is a symbolic link of this user's or root's. */
static int shoal_log_link_ours(const char *path)
{
    struct stat sb;

    return lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode) &&
           (sb.st_uid == geteuid() || sb.st_uid == 0);
}

static void shoal_log_open_file(const char *tmpl)
{
    char path[SHOAL_LOG_PATH_MAX];
    int fd, flags;

    if (!shoal_log_expand_path(tmpl, path, sizeof(path))) {
        shoal_warn(CONFIG, "SHOAL_DEBUG_FILE=%s is too long; logging to stderr", tmpl);
        return;
    }
    /* O_NONBLOCK: a FIFO at the path (anyone may leave one in /tmp) that no one reads held
     * the first call into the library in open() until a reader came, for ever; it fails at
     * once now (ENXIO). Cleared once open: a line to a reader that lags waits, as on stderr,
     * rather than being cut. A regular file ignores the flag. */
    /* O_NOFOLLOW: a link at the path (another user's, in /tmp) had the lines appended to its
     * target, a file of the user's own the foreign-owner check below let through. A link of
     * the user's own or root's (/dev/stderr) is followed: no one else can replace it in a
     * sticky directory, and what it points at passes the same checks. */
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOCTTY |
                        O_NOFOLLOW, 0640);
    if (fd < 0 && errno == ELOOP && shoal_log_link_ours(path)) {
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOCTTY,
                  0640);
    }
    if (fd < 0) {
        shoal_warn(CONFIG, "open(SHOAL_DEBUG_FILE %s) failed: %s%s; logging to stderr", path,
                   strerror(errno), errno == ENXIO   ? " (a FIFO that no one reads)"
                                    : errno == ELOOP ? " (another user's symbolic link: not "
                                                       "followed)"
                                                     : "");
        return;
    }
    if (shoal_log_file_foreign(fd, path)) {
        close(fd);
        return;
    }
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        shoal_warn(CONFIG, "fcntl(SHOAL_DEBUG_FILE %s) failed: %s; logging to stderr", path,
                   strerror(errno));
        close(fd);
        return;
    }
    shoal_log_fd = fd;
}

static void shoal_log_init_once(void)
{
    const shoal_util_config_t *cfg = &shoal_util_config;
    unsigned mask;

    /* The level first and the file next, so that the logger's own warnings (the file cannot
     * be opened, a bad subsystem) obey SHOAL_DEBUG and go to SHOAL_DEBUG_FILE as every other
     * line does: written before, SHOAL_DEBUG=NONE still printed them, and only on stderr. */
    shoal_log_level_cur = cfg->level;
    /* stderr closed (prog 2>&-, a daemon that closed 0-2): the next file or socket opened
     * takes fd 2, and the lines went into it (a data file, a transport's byte stream). They
     * are dropped; SHOAL_DEBUG_FILE still works. */
    if (fcntl(STDERR_FILENO, F_GETFD) < 0 && errno == EBADF)
        shoal_log_fd = -1;
    if (cfg->file != NULL && cfg->file[0] != '\0')
        shoal_log_open_file(cfg->file);
    if (!shoal_log_parse_subsys(cfg->subsys, &mask)) {
        mask = SHOAL_LOG_SUBSYS_ALL; /* the mask in force until now: the warning is shown */
        shoal_warn(CONFIG, "SHOAL_DEBUG_SUBSYS=%s names an unknown subsystem; using ALL",
                   cfg->subsys);
    }
    shoal_log_subsys_mask = mask;
    if (cfg->level == SHOAL_LOG_VERSION || cfg->level >= SHOAL_LOG_INFO) {
        shoal_log_emit(SHOAL_LOG_VERSION, "VERSION", SHOAL_SUBSYS_BIT_INIT, __FILE__, __LINE__,
                       "%s", shoal_version_string());
    }
}

void shoal_log_init(void)
{
    pthread_once(&shoal_log_once, shoal_log_init_once);
}

static void shoal_log_write_all(const char *buf, size_t len)
{
    ssize_t ret;

    if (shoal_log_fd < 0)
        return;
    while (len > 0) {
        ret = write(shoal_log_fd, buf, len);
        if (ret < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        buf += ret;
        len -= (size_t)ret;
    }
}

void shoal_log_emit(int level, const char *tag, unsigned subsys_bit, const char *file, int line,
                    const char *fmt, ...)
{
    char buf[SHOAL_LOG_LINE_MAX];
    int saved_errno = errno;
    size_t n;
    va_list ap;
    int w;

    (void)level;
    (void)file;
    (void)line;
    w = snprintf(buf, sizeof(buf), "%s:%d:%d shoal %s [%s] ", shoal_hostname(), (int)getpid(),
                 (int)syscall(SYS_gettid), tag, shoal_log_subsys_name(subsys_bit));
    n = (w < 0) ? 0 : SHOAL_MIN((size_t)w, sizeof(buf) - 1);
    va_start(ap, fmt);
    w = vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
    va_end(ap);
    if (w < 0)
        w = 0; /* bad format: keep the prefix */
    if ((size_t)w < sizeof(buf) - n - 1) {
        n += (size_t)w;
    } else {
        /* Truncated: mark it and leave room for the newline. */
        n = sizeof(buf) - 5;
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n++] = '\n';
    shoal_log_write_all(buf, n);
    errno = saved_errno;
}
