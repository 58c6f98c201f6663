/*
 * This machine's profile: caches from discovery (hwloc, else sysfs), memory rates from a
 * short measurement, cached per host and user in a file so that the ranks of a node and
 * later jobs do not measure again.
 */
#include "tune/tune.h"

#include "reduce/reduce.h"
#include "topo/topo.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHOAL_TUNE_FILE_MAGIC "shoal-tune 2"
#define SHOAL_TUNE_LOCK_WAIT_MS 5000   /* another process measuring: wait at most this */
#define SHOAL_TUNE_MAX_MBS 10000000u   /* 10 TB/s: anything above is not a measurement */
#define SHOAL_TUNE_FILE_MAX_AGE_S (7 * 86400) /* a record's life: then it starts again */
#define SHOAL_TUNE_FILE_REFRESH_S 3600        /* measured again, best kept, this often */
#define SHOAL_TUNE_FILE_SKEW_S 300            /* a time this far ahead of the clock is its own */

/* ---- SHOAL_TUNE_MACHINE ---------------------------------------------------------------- */

static int shoal_tune_parse_kb(const char *s, uint32_t *kb_p)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = 1;

    if (end == s) {
        return -1;
    }
    if (*end == 'k' || *end == 'K') {
        mul = 1ull << 10;
        end++;
    } else if (*end == 'm' || *end == 'M') {
        mul = 1ull << 20;
        end++;
    } else if (*end == 'g' || *end == 'G') {
        mul = 1ull << 30;
        end++;
    }
    /* a size that rounds to 0 KiB would be given as 'unknown' (nothing derived from it) */
    if (*end != '\0' || v > (1ull << 40) / mul || (v > 0 && v * mul < 1024)) {
        return -1;
    }
    *kb_p = (uint32_t)SHOAL_MIN(v * mul / 1024, (unsigned long long)UINT32_MAX);
    return 0;
}

static int shoal_tune_parse_mbs(const char *s, uint32_t *mbs_p)
{
    char *end;
    double gbs = strtod(s, &end);
    /* at least 1 MB/s: below, the rate rounded to 0 (unknown), given yet not measured */
    if (end == s || *end != '\0' || !(gbs >= 1e-3) || gbs * 1e3 > SHOAL_TUNE_MAX_MBS) {
        return -1;
    }
    *mbs_p = (uint32_t)(gbs * 1e3 + 0.5);
    return 0;
}

int shoal_tune_machine_parse(const char *text, shoal_tune_machine_t *m)
{
    char buf[256], *save = NULL, *tok;
    int mask = 0;

    if (snprintf(buf, sizeof(buf), "%s", text) >= (int)sizeof(buf)) {
        return -1;
    }
    for (tok = strtok_r(buf, " ,\t", &save); tok != NULL; tok = strtok_r(NULL, " ,\t", &save)) {
        char *eq = strchr(tok, '=');
        const char *v;
        int rc = -1;
        if (eq == NULL) {
            return -1;
        }
        *eq = '\0';
        v = eq + 1;
        if (strcmp(tok, "l1d") == 0) {
            rc = shoal_tune_parse_kb(v, &m->l1d_kb), mask |= 1;
        } else if (strcmp(tok, "l2") == 0) {
            rc = shoal_tune_parse_kb(v, &m->l2_kb), mask |= 1;
        } else if (strcmp(tok, "l3") == 0) {
            rc = shoal_tune_parse_kb(v, &m->l3_kb), mask |= 1;
        } else if (strcmp(tok, "copy_cache") == 0) {
            rc = shoal_tune_parse_mbs(v, &m->copy_cache_mbs), mask |= 2;
        } else if (strcmp(tok, "copy") == 0) {
            rc = shoal_tune_parse_mbs(v, &m->copy_mem_mbs), mask |= 2;
        } else if (strcmp(tok, "reduce") == 0) {
            rc = shoal_tune_parse_mbs(v, &m->reduce_mem_mbs), mask |= 2;
        } else if (strcmp(tok, "tcp_rbuf") == 0) {
            rc = shoal_tune_parse_kb(v, &m->tcp_rbuf_kb), mask |= 4;
        }
        if (rc != 0) {
            return -1;
        }
    }
    return mask;
}

/* ---- the measurement ------------------------------------------------------------------- */

static void *shoal_tune_map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* One timed operation: memcpy (kind 0) or a float32 sum into dst (kind 1); ns. */
static uint64_t shoal_tune_time_op(uint8_t *dst, const uint8_t *src, size_t len, int kind)
{
    uint64_t t0 = shoal_time_ns();
    if (kind == 0) {
        memcpy(dst, src, len);
    } else {
        shoal_reduce2(dst, dst, src, len / 4, SHOAL_FLOAT32, SHOAL_SUM);
    }
    __asm__ __volatile__("" : : "r"(dst) : "memory");
    return SHOAL_MAX(shoal_time_ns() - t0, (uint64_t)1);
}

/*
 * Best rate (MB/s of bytes copied or reduced) over short timed pieces: the best piece is the
 * one no other process interrupted, so a loaded host still measures its memory, not its load.
 * In cache: piece = the whole block, repeated. From memory: the buffers (each the L3's size)
 * are walked piece by piece; only passes after the first count, when a piece was last
 * touched a whole walk of both buffers (twice the L3) ago and must come from memory.
 */
static uint32_t shoal_tune_rate(uint8_t *dst, const uint8_t *src, size_t len, size_t piece,
                                int passes, int kind)
{
    uint64_t best = UINT64_MAX;

    for (int p = 0; p < passes; p++) {
        for (size_t off = 0; off + piece <= len; off += piece) {
            uint64_t ns = shoal_tune_time_op(dst + off, src + off, piece, kind);
            if (p > 0 || piece == len) {
                best = SHOAL_MIN(best, ns);
            }
        }
    }
    return (uint32_t)SHOAL_MIN((double)piece * 1e3 / (double)best, (double)SHOAL_TUNE_MAX_MBS);
}

int shoal_tune_measure(const shoal_tune_machine_t *caches, shoal_tune_machine_t *m)
{
    size_t l2 = caches->l2_kb > 0 ? (size_t)caches->l2_kb << 10 : (size_t)1 << 20;
    size_t l3 = (size_t)caches->l3_kb << 10;
    size_t blk = SHOAL_MAX(SHOAL_MIN(l2 / 4, (size_t)512 << 10), (size_t)16 << 10);
    size_t big = SHOAL_MAX(SHOAL_MIN(l3, (size_t)32 << 20), (size_t)8 << 20);
    uint8_t *a = shoal_tune_map(big), *b = shoal_tune_map(big);
    uint64_t t0 = shoal_time_ns();

    if (a == NULL || b == NULL) {
        shoal_warn(COLL, "tune: cannot map 2 x %zu bytes to measure memory: %s", big,
                   strerror(errno));
        if (a != NULL) {
            munmap(a, big);
        }
        if (b != NULL) {
            munmap(b, big);
        }
        return -1;
    }
    memset(a, 0, big);
    /* in cache: a block a quarter of the L2, copied again and again */
    memcpy(b, a, blk);
    m->copy_cache_mbs = shoal_tune_rate(b, a, blk, blk, 32, 0);
    /* from memory: two buffers of the L3's size each (8..32 MiB), 1 MiB pieces */
    m->copy_mem_mbs = shoal_tune_rate(b, a, big, (size_t)1 << 20, 3, 0);
    m->reduce_mem_mbs = shoal_tune_rate(b, a, big, (size_t)1 << 20, 3, 1);
    munmap(a, big);
    munmap(b, big);
    shoal_info(COLL, "tune: measured copy in L2 %.2f GB/s, copy from memory %.2f GB/s, reduce "
               "%.2f GB/s in %.1f ms", m->copy_cache_mbs / 1e3, m->copy_mem_mbs / 1e3,
               m->reduce_mem_mbs / 1e3, (double)(shoal_time_ns() - t0) / 1e6);
    return m->copy_cache_mbs > 0 && m->copy_mem_mbs > 0 && m->reduce_mem_mbs > 0 ? 0 : -1;
}

/* ---- per-host cache file --------------------------------------------------------------- */

/* Set once each warning about the cache's place was given: once per process. */
static int shoal_tune_dir_warned, shoal_tune_lock_warned, shoal_tune_open_warned;

int shoal_tune_cache_file(char *buf, size_t len)
{
    const char *dir = shoal_tune_config.cache_dir;
    struct stat st;
    if (dir == NULL || dir[0] == '\0') {
        /* set but not there (inherited through su, or into a container): nothing was cached
         * there, every init measured again; /tmp as when it is unset */
        dir = shoal_cfg_getenv_raw("XDG_RUNTIME_DIR");
        dir = dir != NULL && stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? dir : NULL;
    } else if (dir[0] != '/' &&
               !__atomic_exchange_n(&shoal_tune_dir_warned, 1, __ATOMIC_RELAXED)) {
        shoal_warn(COLL, "tune: SHOAL_TUNE_CACHE_DIR '%s' is not an absolute path: /tmp is "
                   "used", dir);
    }
    if (dir == NULL || dir[0] != '/') {
        dir = "/tmp";
    }
    return snprintf(buf, len, "%s/shoal-tune-%u-%016llx%s", dir, (unsigned)getuid(),
                    (unsigned long long)shoal_host_id(), SHOAL_TUNE_BUILD_TAG) < (int)len
               ? 0 : -1;
}

/* Ours, a regular file, writable by nobody else: otherwise not trusted. */
static int shoal_tune_fd_trusted(int fd, struct stat *st)
{
    return fstat(fd, st) == 0 && S_ISREG(st->st_mode) && st->st_uid == getuid() &&
           (st->st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

/* The file's record: 0 when it is trusted, well formed and its caches match m's; then r holds
 * its rates and sampling times, *age_s the seconds since it was last written. */
static int shoal_tune_cache_read(const char *path, const shoal_tune_machine_t *m,
                                 shoal_tune_record_t *r, long *age_s)
{
    char buf[256];
    unsigned l1, l2, l3;
    long long since;
    int ncores, fd;
    struct stat st;
    ssize_t n;

    /* O_NONBLOCK: the name is known, and anyone can make a FIFO of it in /tmp before the job;
     * opened for reading it waited for a writer, and init with it, for ever. A regular file
     * reads as ever; anything else is not trusted below. */
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return -1;
    }
    n = shoal_tune_fd_trusted(fd, &st) ? read(fd, buf, sizeof(buf) - 1) : -1;
    close(fd);
    if (n <= 0) {
        return -1;
    }
    buf[n] = '\0';
    if (sscanf(buf, SHOAL_TUNE_FILE_MAGIC " l1d %u l2 %u l3 %u cores %d copy_cache %u copy %u "
               "reduce %u since %lld samples %u", &l1, &l2, &l3, &ncores, &r->copy_cache_mbs,
               &r->copy_mem_mbs, &r->reduce_mem_mbs, &since, &r->samples) != 9 ||
        l1 != m->l1d_kb || l2 != m->l2_kb || l3 != m->l3_kb || ncores != m->ncores ||
        r->copy_cache_mbs == 0 || r->copy_mem_mbs == 0 || r->reduce_mem_mbs == 0 ||
        r->copy_cache_mbs > SHOAL_TUNE_MAX_MBS || r->copy_mem_mbs > SHOAL_TUNE_MAX_MBS ||
        r->reduce_mem_mbs > SHOAL_TUNE_MAX_MBS || r->samples == 0 || since <= 0) {
        return -1;
    }
    r->since = (time_t)since;
    *age_s = (long)(time(NULL) - st.st_mtime);
    return 0;
}

static void shoal_tune_cache_write(const char *path, const shoal_tune_machine_t *m,
                                   const shoal_tune_record_t *r)
{
    char tmp[4200], buf[256];
    int fd, len, ok;

    /* A name of its own, made new (O_EXCL, 0600): path.<pid>.tmp, left by a process of the
     * same pid killed before its rename (a container's pids repeat job after job), made every
     * later write fail, and every init measure again and warn. */
    if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX.tmp", path) >= (int)sizeof(tmp)) {
        return;
    }
    len = snprintf(buf, sizeof(buf), SHOAL_TUNE_FILE_MAGIC " l1d %u l2 %u l3 %u cores %d "
                   "copy_cache %u copy %u reduce %u since %lld samples %u\n", m->l1d_kb,
                   m->l2_kb, m->l3_kb, m->ncores, r->copy_cache_mbs, r->copy_mem_mbs,
                   r->reduce_mem_mbs, (long long)r->since, r->samples);
    fd = mkostemps(tmp, 4, O_CLOEXEC);
    if (fd < 0) {
        shoal_warn(COLL, "tune: cannot create %s: %s", tmp, strerror(errno));
        return;
    }
    ok = write(fd, buf, (size_t)len) == len;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        shoal_warn(COLL, "tune: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
}

/* Exclusive lock on path.lock, within the deadline if wait (else only if free at once); the
 * fd, or -1. */
static int shoal_tune_lock(const char *path, int wait)
{
    char lpath[4200];
    struct stat st;
    uint64_t deadline = shoal_time_ns() + (uint64_t)SHOAL_TUNE_LOCK_WAIT_MS * 1000000;
    int fd;

    if (snprintf(lpath, sizeof(lpath), "%s.lock", path) >= (int)sizeof(lpath)) {
        return -1;
    }
    fd = open(lpath, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != ELOOP) {
        /* a directory that is not there or not ours to write (a typo in
         * SHOAL_TUNE_CACHE_DIR): every init measured again, without a word */
        if (!__atomic_exchange_n(&shoal_tune_open_warned, 1, __ATOMIC_RELAXED)) {
            shoal_warn(COLL, "tune: cannot create %s: %s: the per-host measurement is not "
                       "cached (SHOAL_TUNE_CACHE_DIR)", lpath, strerror(errno));
        }
        return -1;
    }
    if (fd < 0 || !shoal_tune_fd_trusted(fd, &st)) {
        /* Another user's file or link at the name (anyone may make one in /tmp before the
         * job): nothing is cached, and every init measures again. Said once, not silently. */
        if ((fd >= 0 || errno == ELOOP) &&
            !__atomic_exchange_n(&shoal_tune_lock_warned, 1, __ATOMIC_RELAXED)) {
            shoal_warn(COLL, "tune: %s is not this user's own file (another user's, or a "
                       "link): the per-host measurement is not cached; remove it", lpath);
        }
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 2000000};
        if (errno != EWOULDBLOCK && errno != EINTR) {
            close(fd);
            return -1;
        }
        if (!wait) {
            close(fd);
            return -1;
        }
        if (shoal_time_ns() >= deadline) {
            shoal_warn(COLL, "tune: %s held for %d ms: measuring without it", lpath,
                       SHOAL_TUNE_LOCK_WAIT_MS);
            close(fd);
            return -1;
        }
        nanosleep(&ts, NULL);
    }
    return fd;
}

/* The record at path for m: 1 usable as it is, 0 usable but due a refresh (last written
 * SHOAL_TUNE_FILE_REFRESH_S ago, or later than now), -1 none (absent, untrusted, malformed,
 * other caches, begun more than SHOAL_TUNE_FILE_MAX_AGE_S ago or in the future). A record
 * written while the clock was ahead (then set back) was used as it was, never refreshed, and
 * expired that much later: a month ahead, a month of one measurement under load. Its start is
 * this host's clock: in the future, it starts again; its write time may be a file server's
 * (a little ahead): refreshed only past SHOAL_TUNE_FILE_SKEW_S. */
static int shoal_tune_cache_state(const char *path, const shoal_tune_machine_t *m,
                                  shoal_tune_record_t *r)
{
    long age_s;
    time_t now = time(NULL);

    if (shoal_tune_cache_read(path, m, r, &age_s) != 0 ||
        now - r->since > SHOAL_TUNE_FILE_MAX_AGE_S || r->since - now > SHOAL_TUNE_FILE_SKEW_S) {
        return -1;
    }
    return age_s < SHOAL_TUNE_FILE_REFRESH_S && age_s > -SHOAL_TUNE_FILE_SKEW_S ? 1 : 0;
}

/* The rates of this machine for m, from the cache file at path; measured when the file has
 * no usable record or is due a refresh, and saved. A measurement can only come out low
 * (another process took the core or the memory), so a refresh keeps the best rate of each
 * kind since the record began: a file written under load heals with the next quiet
 * measurement. A record begun SHOAL_TUNE_FILE_MAX_AGE_S ago starts again from one
 * measurement (the machine may have changed: a VM moved, memory throttled). One process
 * measures at a time (path.lock): a refresh does not wait for another one, it uses the file's
 * rates; without a record it waits (SHOAL_TUNE_LOCK_WAIT_MS), then reads what the other
 * wrote. */
void shoal_tune_rates_at(const char *path, shoal_tune_machine_t *m)
{
    shoal_tune_record_t r = {0}, cur;
    int state = shoal_tune_cache_state(path, m, &r), lock;

    if (state == 1) {
        goto cached;
    }
    lock = shoal_tune_lock(path, state < 0);
    if (lock < 0 && state == 0) {
        goto cached; /* another process refreshes it */
    }
    if (lock >= 0) {
        /* the record as it is now: another process may have written it meanwhile */
        shoal_tune_record_t now = {0};
        state = shoal_tune_cache_state(path, m, &now);
        r = now;
        if (state == 1) {
            close(lock);
            goto cached;
        }
    }
    if (shoal_tune_measure(m, m) != 0) {
        if (lock >= 0) {
            close(lock);
        }
        if (state == 0) {
            goto cached;
        }
        m->copy_cache_mbs = m->copy_mem_mbs = m->reduce_mem_mbs = 0;
        return;
    }
    cur.copy_cache_mbs = m->copy_cache_mbs;
    cur.copy_mem_mbs = m->copy_mem_mbs;
    cur.reduce_mem_mbs = m->reduce_mem_mbs;
    cur.since = time(NULL);
    cur.samples = 1;
    if (state == 0) {
        cur.copy_cache_mbs = SHOAL_MAX(cur.copy_cache_mbs, r.copy_cache_mbs);
        cur.copy_mem_mbs = SHOAL_MAX(cur.copy_mem_mbs, r.copy_mem_mbs);
        cur.reduce_mem_mbs = SHOAL_MAX(cur.reduce_mem_mbs, r.reduce_mem_mbs);
        cur.since = r.since;
        cur.samples = r.samples + 1;
        shoal_info(COLL, "tune: refreshed %s (sample %u since %lld): best copy in L2 %.2f, copy "
                   "%.2f, reduce %.2f GB/s", path, cur.samples, (long long)cur.since,
                   cur.copy_cache_mbs / 1e3, cur.copy_mem_mbs / 1e3, cur.reduce_mem_mbs / 1e3);
    }
    if (lock >= 0) {
        shoal_tune_cache_write(path, m, &cur);
        close(lock); /* releases the flock */
    }
    m->copy_cache_mbs = cur.copy_cache_mbs;
    m->copy_mem_mbs = cur.copy_mem_mbs;
    m->reduce_mem_mbs = cur.reduce_mem_mbs;
    /* a refresh's rates are the best since the record began, not all of this measurement:
     * shoal_info -t said 'measured now' of rates another process measured days ago */
    m->bw_src = state == 0 ? SHOAL_TUNE_BW_REFRESHED : SHOAL_TUNE_BW_MEASURED;
    return;
cached:
    m->copy_cache_mbs = r.copy_cache_mbs;
    m->copy_mem_mbs = r.copy_mem_mbs;
    m->reduce_mem_mbs = r.reduce_mem_mbs;
    m->bw_src = SHOAL_TUNE_BW_CACHED;
}

/* Rates: the per-host cache file, else measured. */
static void shoal_tune_rates(shoal_tune_machine_t *m)
{
    char path[4096];

    if (shoal_tune_cache_file(path, sizeof(path)) != 0) {
        if (shoal_tune_measure(m, m) == 0) {
            m->bw_src = SHOAL_TUNE_BW_MEASURED;
        }
        return;
    }
    shoal_tune_rates_at(path, m);
}

/* The receive buffer a TCP data socket starts with: SHOAL_TCP_RCVBUF if set (the tcp
 * transport's table), else the kernel's default, the middle value of tcp_rmem; KiB, 0 unknown. */
static uint32_t shoal_tune_tcp_rbuf_kb(void)
{
    void *dst = NULL;
    const shoal_cfg_field_t *f = shoal_tune_cfg_find("TCP_RCVBUF", &dst);
    unsigned long lo, mid, hi;
    FILE *fp;
    int n;

    if (f != NULL && f->type == SHOAL_CFG_SIZE && *(const size_t *)dst > 0) {
        return (uint32_t)SHOAL_MIN(*(const size_t *)dst >> 10, (size_t)UINT32_MAX);
    }
    fp = fopen("/proc/sys/net/ipv4/tcp_rmem", "r");
    if (fp == NULL) {
        return 0;
    }
    n = fscanf(fp, "%lu %lu %lu", &lo, &mid, &hi);
    fclose(fp);
    return n == 3 && mid < (1ul << 40) ? (uint32_t)(mid >> 10) : 0;
}

static pthread_mutex_t shoal_tune_lock_mu = PTHREAD_MUTEX_INITIALIZER;
static shoal_tune_machine_t shoal_tune_cached;
static int shoal_tune_cached_mode = -1;

static void shoal_tune_machine_build(int mode, shoal_tune_machine_t *m)
{
    shoal_topo_summary_t sum;
    int given = 0;

    memset(m, 0, sizeof(*m));
    shoal_topo_discover(mode, &sum);
    m->l1d_kb = sum.l1d_kb;
    m->l2_kb = sum.l2_kb;
    m->l3_kb = sum.l3_kb;
    m->ncores = sum.ncores;
    m->cache_src = sum.source;
    m->tcp_rbuf_kb = shoal_tune_tcp_rbuf_kb();
    if (shoal_tune_config.machine != NULL && shoal_tune_config.machine[0] != '\0') {
        shoal_tune_machine_t g = *m;
        g.copy_cache_mbs = g.copy_mem_mbs = g.reduce_mem_mbs = 0;
        given = shoal_tune_machine_parse(shoal_tune_config.machine, &g);
        if (given < 0) {
            shoal_warn(COLL, "SHOAL_TUNE_MACHINE='%s' is malformed (want e.g. 'l2=1m l3=32m "
                       "copy=9.5 copy_cache=40 reduce=8 tcp_rbuf=128k'): ignored",
                       shoal_tune_config.machine);
            given = 0;
        } else {
            if ((given & 1) != 0) {
                m->l1d_kb = g.l1d_kb, m->l2_kb = g.l2_kb, m->l3_kb = g.l3_kb;
                m->cache_src = SHOAL_TUNE_CACHE_GIVEN;
            }
            if ((given & 4) != 0) {
                m->tcp_rbuf_kb = g.tcp_rbuf_kb;
            }
            if ((given & 2) != 0) {
                m->copy_cache_mbs = g.copy_cache_mbs;
                m->copy_mem_mbs = g.copy_mem_mbs;
                m->reduce_mem_mbs = g.reduce_mem_mbs;
                m->bw_src = SHOAL_TUNE_BW_GIVEN;
            }
        }
    }
    /* The rates not given are measured (or read from the per-host cache file), as the caches
     * not given are discovered: 'copy=9.5' alone left the copy in L2 and the reduction at 0
     * (unknown), and with them the slot, one-shot, LL and inline limits at their fixed
     * defaults and the model's reduction rate 'not measured'. */
    if (shoal_tune_config.enable &&
        (m->copy_cache_mbs == 0 || m->copy_mem_mbs == 0 || m->reduce_mem_mbs == 0)) {
        shoal_tune_machine_t meas = *m;
        meas.copy_cache_mbs = meas.copy_mem_mbs = meas.reduce_mem_mbs = 0;
        shoal_tune_rates(&meas);
        m->copy_cache_mbs = m->copy_cache_mbs != 0 ? m->copy_cache_mbs : meas.copy_cache_mbs;
        m->copy_mem_mbs = m->copy_mem_mbs != 0 ? m->copy_mem_mbs : meas.copy_mem_mbs;
        m->reduce_mem_mbs = m->reduce_mem_mbs != 0 ? m->reduce_mem_mbs : meas.reduce_mem_mbs;
        m->bw_src = (given & 2) == 0 ? meas.bw_src
                     : meas.bw_src != SHOAL_TUNE_BW_NONE ? SHOAL_TUNE_BW_GIVEN_SOME
                                                         : SHOAL_TUNE_BW_GIVEN;
    }
}

void shoal_tune_machine_local(int mode, shoal_tune_machine_t *m)
{
    pthread_mutex_lock(&shoal_tune_lock_mu);
    if (shoal_tune_cached_mode != mode) {
        shoal_tune_machine_build(mode, &shoal_tune_cached);
        shoal_tune_cached_mode = mode;
    }
    *m = shoal_tune_cached;
    pthread_mutex_unlock(&shoal_tune_lock_mu);
}
