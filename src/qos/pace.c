/*
 * Token-bucket pacing where no kernel hook exists (pace.h), and the reading side of the
 * node agent's rates page (pace_page.h).
 */
#include "qos/pace.h"
#include "meter/meter.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The pacer's clock in ns: the meter's TSC where it is invariant (a clock_gettime costs 2-3
 * times as much), chosen once per pacer so that its times never mix two clocks. */
static inline uint64_t shoal_qos_pace_now(shoal_qos_pacer_t *p)
{
    p->clock_reads++;
    return p->tsc ? shoal_meter_ticks_ns(shoal_meter_ticks()) : shoal_time_ns();
}

/* ns from t to now; 0 if t is later (the TSC's rate is refined while the job runs, so two
 * readings may step back a little). */
static inline uint64_t shoal_qos_pace_since(uint64_t now, uint64_t t)
{
    return now > t ? now - t : 0;
}

/* A look at the rates page is due: SHOAL_QOS_PACE_CHECK_NS since the last, or the clock is
 * earlier than the last look (the unsigned difference wraps): a step back of the clock never
 * postpones the look at the page (an agent's new rate, its death) by the step. */
static inline int shoal_qos_pace_due(const shoal_qos_pacer_t *p, uint64_t now)
{
    return now - p->checked_ns >= SHOAL_QOS_PACE_CHECK_NS;
}

/* ---- the rates page -------------------------------------------------------------------- */

static void shoal_qos_pace_page_close(shoal_qos_pacer_t *p)
{
    if (p->page_fd >= 0) {
        close(p->page_fd);
        p->page_fd = -1;
    }
}

/* n bytes of the page at off into buf: 1 when all of them were there. The page is read with
 * pread, never through a mapping: a load from a mapping of a file that was truncated under it
 * (an agent rewriting its page in place, an operator's "> page") is SIGBUS, which killed the
 * job; a short read here is a silent agent, which the timeout handles. */
static int shoal_qos_pace_page_pread(const shoal_qos_pacer_t *p, void *buf, size_t n, off_t off)
{
    return pread(p->page_fd, buf, n, off) == (ssize_t)n;
}

/* Opens the page at p->path if it is there and new (another inode than the one open). */
static void shoal_qos_pace_page_open(shoal_qos_pacer_t *p, uint64_t now)
{
    shoal_qos_rates_page_t pg;
    struct stat sb;
    int fd;

    p->next_open_ns = now + SHOAL_QOS_PACE_REOPEN_NS;
    /* O_NONBLOCK: an open of a FIFO for reading waits for a writer, and one planted at the
     * path (a directory others may write to) hung the job before the checks below could
     * refuse it; a regular file's reads are the same with it. */
    fd = open(p->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        /* no agent (yet), or gone: the timeout decides. Anything else (a symbolic link, not
         * followed; no permission) is said, once per cause: it was as silent, and the job ran
         * unpaced for its life. */
        if (errno != ENOENT && errno != p->open_errno) {
            p->open_errno = errno;
            shoal_warn(QOS, "cannot open the rates page %s: %s%s: the agent's rate does not "
                       "apply", p->path, strerror(errno), errno == ELOOP ? " (a symbolic "
                       "link, not followed)" : "");
        }
        return;
    }
    p->open_errno = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_size < (off_t)sizeof(shoal_qos_rates_page_t) ||
        (p->page_fd >= 0 && (uint64_t)sb.st_ino == p->page_ino &&
         (uint64_t)sb.st_dev == p->page_dev)) {
        close(fd);
        return;
    }
    /* another tenant could hold this job back by planting or rewriting its page */
    const char *why = shoal_provider_file_untrusted(p->path, &sb);
    if (why != NULL) {
        if ((uint64_t)sb.st_ino != p->refused_ino) { /* once per file, not once a second */
            p->refused_ino = (uint64_t)sb.st_ino;
            shoal_warn(QOS, "rates page %s ignored: %s (owner uid %u, mode %04o)", p->path,
                       why, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777));
        }
        close(fd);
        return;
    }
    if (pread(fd, &pg, sizeof(pg), 0) != (ssize_t)sizeof(pg)) {
        close(fd); /* shrunk since the fstat: the next look */
        return;
    }
    if (pg.magic != SHOAL_QOS_RATES_MAGIC || pg.version != SHOAL_QOS_RATES_VERSION) {
        /* once per file, as a refused one: the path is looked at again every second while
         * there is no page, and the same file was a warning a second for the job's life */
        if ((uint64_t)sb.st_ino != p->refused_ino) {
            p->refused_ino = (uint64_t)sb.st_ino;
            shoal_warn(QOS, "%s is not a rates page (magic %08x version %u): ignored",
                       p->path, pg.magic, pg.version);
        }
        close(fd);
        return;
    }
    shoal_qos_pace_page_close(p);
    p->page_fd = fd;
    p->page_ino = (uint64_t)sb.st_ino;
    p->page_dev = (uint64_t)sb.st_dev;
    p->page_gen = UINT64_MAX; /* read it now */
    p->page_seen_ns = now;
    shoal_info(QOS, "rates page %s opened", p->path);
}

/* One seqlocked read of the page: 1 when gen moved (rate/burst read), 0 otherwise. Three
 * reads, in the seqlock's order (a system call is a full barrier): magic, version and gen,
 * rate and burst, gen. The magic and version are read again each time, in the same read as
 * gen: the file may be rewritten in place (pace_page.h), and one rewritten with something
 * else (an operator's "cp notes.txt page", a page of another version) had its bytes 8-31
 * taken as gen, rate and burst, a rate of the garbage's choosing (as low as 64 KiB/s)
 * until the timeout. Not a page now: a silent agent, as a truncated one. */
static int shoal_qos_pace_page_read(shoal_qos_pacer_t *p, uint64_t *rate_p, uint64_t *burst_p)
{
    uint64_t g, g2, rb[2];
    struct {
        uint32_t magic, version;
        uint64_t gen;
    } hd;
    _Static_assert(offsetof(shoal_qos_rates_page_t, magic) == 0 &&
                   offsetof(shoal_qos_rates_page_t, version) == 4 &&
                   offsetof(shoal_qos_rates_page_t, gen) == 8 && sizeof(hd) == 16,
                   "magic, version and gen are read at once");
    if (!shoal_qos_pace_page_pread(p, &hd, sizeof(hd), 0) ||
        hd.magic != SHOAL_QOS_RATES_MAGIC || hd.version != SHOAL_QOS_RATES_VERSION) {
        return 0;
    }
    g = hd.gen;
    if (g == p->page_gen || (g & 1) != 0) {
        return 0;
    }
    _Static_assert(offsetof(shoal_qos_rates_page_t, burst) ==
                   offsetof(shoal_qos_rates_page_t, rate) + sizeof(uint64_t),
                   "rate and burst are read at once");
    if (!shoal_qos_pace_page_pread(p, rb, sizeof(rb), offsetof(shoal_qos_rates_page_t, rate)) ||
        !shoal_qos_pace_page_pread(p, &g2, sizeof(g2), offsetof(shoal_qos_rates_page_t, gen)) ||
        g2 != g) {
        return 0; /* the writer is at it (or the page shrank): next look */
    }
    p->page_gen = g;
    *rate_p = rb[0];
    *burst_p = rb[1];
    return 1;
}

static void shoal_qos_pace_apply(shoal_qos_pacer_t *p)
{
    uint64_t r = p->rate_max, a = p->rate_agent;
    double burst;
    if (a != 0 && (r == 0 || a < r)) {
        r = a;
    }
    if (r != 0 && r < SHOAL_QOS_PACE_RATE_MIN) {
        r = SHOAL_QOS_PACE_RATE_MIN;
    }
    /* At least two steps and SHOAL_QOS_PACE_SLACK_NS of the rate (see pace.h), at least what
     * was asked. */
    burst = SHOAL_MAX((double)p->burst_cfg, 2.0 * SHOAL_QOS_PACE_STEP);
    burst = SHOAL_MAX(burst, (double)r * 1e-9 * (double)SHOAL_QOS_PACE_SLACK_NS);
    if (r != p->rate) {
        shoal_info(QOS, "pacing rate now %llu bytes/s (cap %llu, agent %llu), bucket %.0f "
                   "bytes", (unsigned long long)r, (unsigned long long)p->rate_max,
                   (unsigned long long)p->rate_agent, burst);
    }
    p->rate = r;
    p->burst = burst;
    if (p->tokens > burst) {
        p->tokens = burst;
    }
    if (p->rate_ctr != NULL) {
        __atomic_store_n(p->rate_ctr, r, __ATOMIC_RELAXED);
    }
}

/* Between chunks, at most every SHOAL_QOS_PACE_CHECK_NS: the agent's rate, its heartbeat. */
static void shoal_qos_pace_check(shoal_qos_pacer_t *p, uint64_t now)
{
    uint64_t rate, burst;
    p->checked_ns = now;
    if (p->path == NULL) {
        return;
    }
    if (p->page_fd >= 0 && shoal_qos_pace_page_read(p, &rate, &burst)) {
        p->page_seen_ns = now;
        if (p->agent_dead) {
            shoal_info(QOS, "the rates page %s is updated again", p->path);
            p->agent_dead = 0;
        }
        p->rate_agent = rate == 0 ? 0 : SHOAL_MAX(rate / p->share_div, 1);
        p->burst_cfg = burst != 0 ? burst : shoal_qos_pace_config.burst;
        shoal_qos_pace_apply(p);
        return;
    }
    /* The clock stepped back (a refined TSC rate: microseconds): the silence and the next
     * open count from now, not from a time still ahead. */
    if (now < p->page_seen_ns) {
        p->page_seen_ns = now;
    }
    if (p->next_open_ns > now + SHOAL_QOS_PACE_REOPEN_NS) {
        p->next_open_ns = now;
    }
    /* Silent (or no page): an agent may have started or restarted with a new page. */
    if (now >= p->next_open_ns && (p->page_fd < 0 ||
                                   shoal_qos_pace_since(now, p->page_seen_ns) >
                                       SHOAL_QOS_PACE_REOPEN_NS)) {
        shoal_qos_pace_page_open(p, now);
        if (p->page_fd >= 0 && p->page_gen == UINT64_MAX) {
            shoal_qos_pace_check(p, now);
            return;
        }
    }
    if (p->rate_agent != 0 && !p->agent_dead && p->timeout_ms >= 0 &&
        shoal_qos_pace_since(now, p->page_seen_ns) > (uint64_t)p->timeout_ms * 1000000ull) {
        shoal_warn(QOS, "the rates page %s was not updated for %d ms (agent gone?): its rate "
                   "no longer applies", p->path, p->timeout_ms);
        p->agent_dead = 1;
        p->rate_agent = 0;
        shoal_qos_pace_apply(p);
    }
}

/* ---- the bucket ------------------------------------------------------------------------ */

shoal_status_t shoal_qos_pace_create(const shoal_qos_pace_params_t *params,
                                     shoal_qos_pacer_t **pacer_p)
{
    shoal_qos_pacer_t *p = calloc(1, sizeof(*p));
    uint64_t now;
    if (p == NULL) {
        shoal_error(QOS, "out of memory for a pacer");
        return SHOAL_ERR_NO_MEMORY;
    }
    p->page_fd = -1;
    if (params->rates_path != NULL) {
        p->path = strdup(params->rates_path);
        if (p->path == NULL) {
            free(p);
            shoal_error(QOS, "out of memory for a pacer");
            return SHOAL_ERR_NO_MEMORY;
        }
    }
    p->rate_max = params->rate_max;
    p->burst_cfg = params->burst;
    p->timeout_ms = params->rates_timeout_ms;
    p->share_div = SHOAL_MAX(params->share_div, 1u);
    p->abort_flag = params->abort_flag;
    p->wait_timeout_ms = params->wait_timeout_ms;
    p->tsc = __atomic_load_n(&shoal_meter_clock.tsc, __ATOMIC_ACQUIRE);
    now = shoal_qos_pace_now(p);
    p->paced_ctr = &p->paced_own;
    p->page_seen_ns = now;
    p->last_ns = now;
    shoal_qos_pace_apply(p);
    p->tokens = p->burst; /* a full bucket: the first burst goes at once */
    shoal_qos_pace_check(p, now);
    *pacer_p = p;
    return SHOAL_OK;
}

void shoal_qos_pace_destroy(shoal_qos_pacer_t *p)
{
    if (p != NULL) {
        shoal_qos_pace_page_close(p);
        free(p->path);
        free(p);
    }
}

uint64_t shoal_qos_pace_rate(shoal_qos_pacer_t *p)
{
    shoal_qos_pace_check(p, shoal_qos_pace_now(p));
    return p->rate;
}

static inline void shoal_qos_pace_refill(shoal_qos_pacer_t *p, uint64_t now)
{
    if (now > p->last_ns) {
        p->tokens += (double)(now - p->last_ns) * (double)p->rate * 1e-9;
        if (p->tokens > p->burst) {
            p->tokens = p->burst;
        }
    }
    p->last_ns = now;
}

static void shoal_qos_pace_doze(uint64_t ns)
{
    if (ns < 20000) {
        sched_yield(); /* a sleep would overshoot by more than it waits */
        return;
    }
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)SHOAL_MIN(ns, SHOAL_QOS_PACE_SLEEP_NS)};
    nanosleep(&ts, NULL);
}

/* Waits until tokens >= step; returns the time now. *deadline_p 0: set here, at the first
 * wait, to wait_timeout_ms from now (and kept by the caller for the rest of its hold-back). */
static shoal_status_t shoal_qos_pace_wait(shoal_qos_pacer_t *p, double step,
                                          uint64_t *deadline_p, uint64_t *now_p)
{
    uint64_t now = *now_p, t0 = now, deadline;
    shoal_status_t st = SHOAL_OK;
    if (*deadline_p == 0) {
        *deadline_p = shoal_deadline_ns(p->wait_timeout_ms);
    }
    deadline = *deadline_p;
    while (p->rate != 0 && p->tokens < step) {
        if (shoal_aborted(p->abort_flag)) {
            st = SHOAL_ERR_ABORTED;
            break;
        }
        if (shoal_deadline_passed(deadline)) {
            if (!p->warned_deadline) {
                shoal_warn(QOS, "pacing at %llu bytes/s reached the call's deadline: no longer "
                           "holding back this call", (unsigned long long)p->rate);
                p->warned_deadline = 1;
            }
            p->tokens = step;
            break;
        }
        shoal_qos_pace_doze((uint64_t)((step - p->tokens) * 1e9 / (double)p->rate));
        now = shoal_qos_pace_now(p);
        shoal_qos_pace_refill(p, now);
        if (shoal_qos_pace_due(p, now)) {
            shoal_qos_pace_check(p, now);
        }
    }
    __atomic_store_n(p->paced_ctr, __atomic_load_n(p->paced_ctr, __ATOMIC_RELAXED) +
                     shoal_qos_pace_since(now, t0), __ATOMIC_RELAXED);
    *now_p = now;
    return st;
}

static shoal_status_t shoal_qos_pace_take_until(shoal_qos_pacer_t *p, size_t bytes,
                                                uint64_t *deadline_p)
{
    p->fast_left = SHOAL_QOS_PACE_FAST;
    uint64_t now = shoal_qos_pace_now(p);
    if (shoal_qos_pace_due(p, now)) {
        shoal_qos_pace_check(p, now);
    }
    if (p->rate == 0) {
        return SHOAL_OK;
    }
    shoal_qos_pace_refill(p, now);
    while (bytes > 0 && p->rate != 0) {
        double step = (double)SHOAL_MIN(bytes, (size_t)SHOAL_QOS_PACE_STEP);
        if (p->tokens < step) {
            SHOAL_CHECK(shoal_qos_pace_wait(p, step, deadline_p, &now));
        }
        p->tokens -= step;
        bytes -= (size_t)step;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_qos_pace_take(shoal_qos_pacer_t *p, size_t bytes, uint64_t deadline_ns)
{
    uint64_t deadline = deadline_ns; /* 0: set at the first wait, then kept for every step */
    if (shoal_qos_pace_fast(p, bytes)) {
        return SHOAL_OK;
    }
    return shoal_qos_pace_take_until(p, bytes, &deadline);
}

shoal_status_t shoal_qos_pace_take_call(shoal_qos_pacer_t *p, size_t bytes, uint64_t call)
{
    if (shoal_qos_pace_fast(p, bytes)) {
        return SHOAL_OK;
    }
    if (call != p->call) {
        p->call = call;
        p->call_deadline = 0; /* set at this call's first wait */
    }
    return shoal_qos_pace_take_until(p, bytes, &p->call_deadline);
}

/* ---- the communicator's pacer ---------------------------------------------------------- */

shoal_status_t shoal_qos_pace_comm_init(struct shoal_comm *comm)
{
    const char *rates = shoal_qos_pace_config.rates;
    unsigned div = (unsigned)SHOAL_MAX(comm->local_size, 1);
    char path[512];
    shoal_qos_pace_params_t params = {
        .rate_max = shoal_qos_pace_config.rate_max / div,
        .burst = shoal_qos_pace_config.burst,
        .rates_timeout_ms = shoal_qos_pace_config.rates_timeout_ms,
        .share_div = div,
        .abort_flag = &comm->aborted,
        .wait_timeout_ms = comm->timeout_ms,
    };
    shoal_qos_pacer_t *p;

    comm->pace = NULL;
    if (rates != NULL && (rates[0] == '\0' || strcmp(rates, "none") == 0)) {
        rates = NULL;
    }
    if (params.rate_max == 0 && shoal_qos_pace_config.rate_max != 0) {
        params.rate_max = 1; /* raised to the minimum rate */
    }
    if (params.rate_max != 0 && params.rate_max < SHOAL_QOS_PACE_RATE_MIN) {
        /* a hard cap the ranks exceed: said, not silent */
        shoal_warn_once(QOS, "SHOAL_QOS_RATE_MAX=%zu bytes/s over %u local ranks is %llu a "
                        "rank, below the pacer's minimum of %llu: each rank is paced at the "
                        "minimum (%llu bytes/s on this host together)",
                        shoal_qos_pace_config.rate_max, div,
                        (unsigned long long)params.rate_max, SHOAL_QOS_PACE_RATE_MIN,
                        SHOAL_QOS_PACE_RATE_MIN * div);
    }
    if (params.rate_max == 0 && rates == NULL) {
        return SHOAL_OK; /* nothing to pace: the hook is one branch */
    }
    if (rates != NULL) {
        /* %t the tenant ("uid=N", the effective uid, for a job without one: the name the
         * node agent meters, bills and arbitrates it under; no tenant can be called so, '=' is
         * not allowed in one), %j the job. The same expansion as SHOAL_STOP_FILE's, which
         * refuses a name that is not one file name: "/run/shoal/qos/%t.rate" with the tenant
         * "x/../../../tmp/me" was a page of the job's own choosing, and so its own rate. */
        char why[160];
        if (shoal_provider_path_expand(rates, comm->ident.tenant, comm->ident.job, path,
                                       sizeof(path), why, sizeof(why)) != SHOAL_OK) {
            shoal_error(QOS, "SHOAL_QOS_RATES=%s: %s", rates, why);
            return SHOAL_ERR_INVALID_ARG;
        }
        params.rates_path = path;
        /* The agent's heartbeat is at least once a second (pace_page.h): a shorter timeout
         * took a live agent for dead between two beats (0 and 100ms: its rate dropped most of
         * the time, and a warning several times a second on every rank). */
        if (params.rates_timeout_ms >= 0 && params.rates_timeout_ms < 1000) {
            shoal_error(QOS, "SHOAL_QOS_RATES_TIMEOUT=%d ms is shorter than the agent's "
                        "heartbeat (its rates page moves at least once a second): use 1s or "
                        "more, or inf", params.rates_timeout_ms);
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    SHOAL_CHECK(shoal_qos_pace_create(&params, &p));
    if (comm->meter != NULL) {
        p->paced_ctr = &comm->meter->page->paced_ns;
        p->rate_ctr = &comm->meter->page->pace_rate;
        __atomic_store_n(p->rate_ctr, p->rate, __ATOMIC_RELAXED);
    }
    comm->pace = p;
    shoal_info(QOS, "comm %08x paced: cap %zu bytes/s on this host (%u local ranks), rates "
               "page %s", comm->comm_id, shoal_qos_pace_config.rate_max, div,
               rates != NULL ? path : "none");
    return SHOAL_OK;
}

void shoal_qos_pace_comm_fini(struct shoal_comm *comm)
{
    shoal_qos_pace_destroy(comm->pace);
    comm->pace = NULL;
}

shoal_status_t shoal_qos_pace_comm_take_slow(struct shoal_comm *comm, size_t bytes)
{
    /* The call in progress: the ticket being served (a blocking call's, or the proxy's while
     * its plans run), so that the hold-back ends at the call's deadline, not at each
     * message's. */
    shoal_status_t st = shoal_qos_pace_take_call(
        comm->pace, bytes, __atomic_load_n(&comm->ticket_serving, __ATOMIC_RELAXED));
    if (SHOAL_UNLIKELY(st != SHOAL_OK)) {
        return shoal_comm_set_failed(comm, st, comm->rank,
                                     "aborted by the application while paced");
    }
    return SHOAL_OK;
}
