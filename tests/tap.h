/* A small TAP producer for the test suite (automake's tap-driver.sh counts the cases). */
#ifndef SHOAL_TAP_H
#define SHOAL_TAP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

void tap_plan(int n);                 /* "1..n"; call once, first (or tap_done at the end) */
int tap_ok_at(int cond, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int tap_is_int_at(long long got, long long want, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int tap_is_str_at(const char *got, const char *want, const char *file, int line,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void tap_skip(int n, const char *reason); /* n cases "ok N # SKIP reason" */
void tap_skip_all(const char *reason);    /* "1..0 # SKIP reason" and nothing else */
void tap_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tap_bail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int tap_done(void);
/* Uses up the process's file descriptors, as a process out of them is: the soft limit goes
 * down to 256 first (a limit of a million would take a million dups), then /dev/null is
 * opened and dup'ed until that fails (fd 0 may be closed under a harness). Returns 1 when the
 * process is out of them (EMFILE); tap_fds_restore closes them and puts the limit back. */
typedef struct {
    int fds[256];
    int n;
    unsigned long long soft; /* the saved soft limit */
    int lowered;
} tap_fds_t;
/* Runs fn(arg) with stderr (the library's log) sent to a file; returns what it wrote there
 * (a static buffer, cut at 4 KiB). */
const char *tap_stderr_of(void (*fn)(const char *), const char *arg);
int tap_fds_exhaust(tap_fds_t *f);
void tap_fds_restore(tap_fds_t *f);
/* stderr (the library's log) goes to a temporary file from tap_log_begin (0, or -1 when no
 * file could be had) to tap_log_end; tap_log_count then counts the lines of it that hold
 * needle (and needle2 when not NULL), and tap_log_close drops it. */
typedef struct {
    FILE *log;
    int saved;
} tap_log_t;
int tap_log_begin(tap_log_t *c);
void tap_log_end(tap_log_t *c);
int tap_log_count(tap_log_t *c, const char *needle, const char *needle2);
void tap_log_close(tap_log_t *c);
/* 1 if text (an error message) names rank r: "peer r" or "rank r", not followed by a digit. */
int tap_names_rank(const char *text, int r);  /* prints the plan if none was given; returns exit code (0 all passed) */

#define tap_ok(cond, ...) tap_ok_at(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define tap_is_int(got, want, ...) \
    tap_is_int_at((long long)(got), (long long)(want), __FILE__, __LINE__, __VA_ARGS__)
#define tap_is_str(got, want, ...) tap_is_str_at((got), (want), __FILE__, __LINE__, __VA_ARGS__)

/* Tests that speak a wire protocol by hand: reads exactly len bytes from fd, waiting at most
 * ms for each piece; 0, or -1 on timeout, EOF or error. */
int tap_read_n(int fd, void *buf, size_t len, int ms);

/* A reproducible byte pattern (xorshift from seed) for payload checks: tap_fill writes it,
 * tap_check_fill answers 1 if buf holds exactly it. */
void tap_fill(uint8_t *buf, size_t len, uint64_t seed);
int tap_check_fill(const uint8_t *buf, size_t len, uint64_t seed);

/* Nanoseconds this thread has waited for a CPU, runnable but not running
 * (/proc/thread-self/schedstat, second field; 0 where the kernel does not say): timed checks
 * bound a span less this, the part of it the code under test did not decide (on a machine at
 * load 16 on 2 CPUs it was 50-114 ms of a wake-up, 80% of a pacing span). */
uint64_t tap_run_delay_ns(void);

#endif
