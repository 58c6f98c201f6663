#include "tap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static int tap_n;
static int tap_failed;
static int tap_planned = -1;

void tap_plan(int n)
{
    tap_planned = n;
    printf("1..%d\n", n);
    fflush(stdout);
}

static void tap_vline(int cond, const char *fmt, va_list ap)
{
    tap_n++;
    if (!cond) {
        tap_failed++;
    }
    printf("%s %d - ", cond ? "ok" : "not ok", tap_n);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
}

int tap_ok_at(int cond, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tap_vline(cond, fmt, ap);
    va_end(ap);
    if (!cond) {
        printf("# failed at %s:%d\n", file, line);
    }
    return cond;
}

int tap_is_int_at(long long got, long long want, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    int cond = got == want;
    va_start(ap, fmt);
    tap_vline(cond, fmt, ap);
    va_end(ap);
    if (!cond) {
        printf("# %s:%d: got %lld, want %lld\n", file, line, got, want);
    }
    return cond;
}

int tap_is_str_at(const char *got, const char *want, const char *file, int line,
                  const char *fmt, ...)
{
    va_list ap;
    int cond = got != NULL && want != NULL ? strcmp(got, want) == 0 : got == want;
    va_start(ap, fmt);
    tap_vline(cond, fmt, ap);
    va_end(ap);
    if (!cond) {
        printf("# %s:%d: got '%s', want '%s'\n", file, line, got ? got : "(null)",
               want ? want : "(null)");
    }
    return cond;
}

void tap_skip(int n, const char *reason)
{
    for (int i = 0; i < n; i++) {
        printf("ok %d # SKIP %s\n", ++tap_n, reason);
    }
    fflush(stdout);
}

void tap_skip_all(const char *reason)
{
    printf("1..0 # SKIP %s\n", reason);
    fflush(stdout);
    tap_planned = 0;
}

void tap_diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

void tap_bail(const char *fmt, ...)
{
    va_list ap;
    printf("Bail out! ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

int tap_done(void)
{
    if (tap_planned < 0) {
        printf("1..%d\n", tap_n);
    } else if (tap_planned != tap_n && tap_planned != 0) {
        printf("# planned %d tests but ran %d\n", tap_planned, tap_n);
        tap_failed++;
    }
    fflush(stdout);
    return tap_failed != 0;
}

int tap_names_rank(const char *text, int r)
{
    static const char *const words[] = {"peer ", "rank "};
    char pat[32];
    for (int w = 0; w < 2 && text != NULL; w++) {
        const char *p = text;
        snprintf(pat, sizeof(pat), "%s%d", words[w], r);
        while ((p = strstr(p, pat)) != NULL) {
            p += strlen(pat);
            if (*p < '0' || *p > '9') {
                return 1;
            }
        }
    }
    return 0;
}

int tap_read_n(int fd, void *buf, size_t len, int ms)
{
    size_t off = 0;
    while (off < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ssize_t r;
        if (poll(&pfd, 1, ms) != 1) {
            return -1;
        }
        r = recv(fd, (char *)buf + off, len - off, 0);
        if (r <= 0) {
            return -1;
        }
        off += (size_t)r;
    }
    return 0;
}

void tap_fill(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x1234567;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
}

int tap_check_fill(const uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x1234567;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (buf[i] != (uint8_t)x) {
            return 0;
        }
    }
    return 1;
}

uint64_t tap_run_delay_ns(void)
{
    unsigned long long on_cpu, waited = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (f == NULL) {
        return 0;
    }
    if (fscanf(f, "%llu %llu", &on_cpu, &waited) != 2) {
        waited = 0;
    }
    fclose(f);
    return waited;
}

int tap_fds_exhaust(tap_fds_t *f)
{
    struct rlimit rl;
    int fd;

    f->n = 0;
    f->lowered = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 256) {
        f->soft = (unsigned long long)rl.rlim_cur;
        rl.rlim_cur = 256;
        f->lowered = setrlimit(RLIMIT_NOFILE, &rl) == 0;
    }
    fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && f->n < (int)(sizeof(f->fds) / sizeof(f->fds[0]))) {
        f->fds[f->n++] = fd;
        fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    }
    if (fd >= 0) {
        close(fd); /* the array is full: not out of them after all */
        return 0;
    }
    return errno == EMFILE;
}

void tap_fds_restore(tap_fds_t *f)
{
    struct rlimit rl;

    while (f->n > 0) {
        close(f->fds[--f->n]);
    }
    if (f->lowered && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = (rlim_t)f->soft;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    f->lowered = 0;
}

int tap_log_begin(tap_log_t *c)
{
    c->log = tmpfile();
    c->saved = c->log != NULL ? dup(2) : -1;
    if (c->saved < 0) {
        if (c->log != NULL) {
            fclose(c->log);
            c->log = NULL;
        }
        return -1;
    }
    fflush(stderr);
    dup2(fileno(c->log), 2);
    return 0;
}

void tap_log_end(tap_log_t *c)
{
    if (c->saved >= 0) {
        fflush(stderr);
        dup2(c->saved, 2);
        close(c->saved);
        c->saved = -1;
    }
}

int tap_log_count(tap_log_t *c, const char *needle, const char *needle2)
{
    char line[512];
    int n = 0;

    if (c->log == NULL) {
        return 0;
    }
    rewind(c->log);
    while (fgets(line, sizeof(line), c->log) != NULL) {
        n += strstr(line, needle) != NULL && (needle2 == NULL || strstr(line, needle2) != NULL);
    }
    return n;
}

void tap_log_close(tap_log_t *c)
{
    tap_log_end(c);
    if (c->log != NULL) {
        fclose(c->log);
        c->log = NULL;
    }
}

const char *tap_stderr_of(void (*fn)(const char *), const char *arg)
{
    static char buf[4096];
    char path[] = "/tmp/test_log.XXXXXX";
    int fd = mkstemp(path), saved;
    ssize_t n;

    buf[0] = '\0';
    if (fd < 0) {
        return buf;
    }
    fflush(stderr);
    saved = dup(2);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    n = pread(fd, buf, sizeof(buf) - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return buf;
}
