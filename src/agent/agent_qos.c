/* shoald's QoS arbiter (DESIGN.md section 7, issue 12): divides the host's capacity among the
 * tenants that are active on it, by weight, and tells each tenant's communicators their rate
 * through the rates page the library reads (src/qos/pace_page.h).
 *
 * Every qos_period (100 ms):
 *  - demand: each live page's payload bytes sent since the last run, split by resource: same
 *    host (shared memory, loopback: the host's memory bandwidth, qos_capacity_shm) and other
 *    host (the NICs, qos_capacity_net: arbitrated only where tc is not set up, the pacing
 *    fallback; with tc the kernel's htb divides the link and the agent leaves it alone). A
 *    tenant that used at least 90% of the rate it was given (or had none) is greedy (demand
 *    unlimited); one that used less asks for 1.5 times what it used (it may grow by half
 *    a period, and becomes greedy as soon as it fills that); one that sent nothing is idle.
 *    An active guaranteed tenant counts as greedy whatever it used: its weight's share is
 *    kept for it (the others, spot first, get less while it sends anything), so that a
 *    latency-sensitive job that steps up is never paced below its share, and the bulk
 *    jobs' copies leave it the memory bandwidth. When every active tenant is modest, what
 *    is left of the capacity goes to them by weight too.
 *  - shares: weighted max-min (share.c, work-conserving: an idle or modest tenant's part goes to
 *    the others by weight), per resource, with the weights of the tenants' credentials.
 *  - publication: a tenant's rate is the sum of its shares; each of its communicators on this
 *    host gets an equal part (the library divides it again among its local ranks). An idle
 *    tenant's page holds the share it would get on arrival, so a tenant that starts never
 *    takes more than its part for the one period the agent needs to see it.
 *  - arrivals and leaves do not wait for the period: a tenant's first registration divides
 *    again at once with it greedy (before the reply), and it stays greedy until it has sent
 *    for a whole period (the first runs measure a job still starting); a tenant's last
 *    communicator ending divides again at once without it; another communicator of an active
 *    tenant starting or ending splits its rate again at once. The libraries read their pages
 *    every 2 ms, so the shares move within a few ms of the event. A tenant that also
 *    sends on a resource the agent does not divide (the NICs under tc, or a capacity of 0) is
 *    not limited by the agent (rate 0): one token bucket covers all of a communicator's
 *    traffic, and the kernel already divides that resource.
 *  - heartbeat: every page's gen moves every run, and at least every SHOALD_QOS_BEAT_NS between
 *    runs (pace_page.h: at least once a second, whatever qos_period is), so the library takes
 *    a page whose gen stood still for SHOAL_QOS_RATES_TIMEOUT as a dead agent and runs at full
 *    speed. (The gen moved once a period: with qos_period above the timeout, 10 s by default,
 *    every job took the live agent for dead for part of each period and ran unpaced.)
 *
 * The pages are files DIR/TENANT.rate (qos_rates_dir, 0644, owned by the agent: a job reads its
 * tenant's page with SHOAL_QOS_RATES=DIR/%t.rate; a rate is no secret). A page is
 * made when a tenant first registers and stays until the agent stops; at a clean stop the
 * agent lifts every rate (0) and removes the pages, so jobs run at full speed at once.
 *
 * tc (qos_tc, qos_tc_dev): at start the agent runs scripts/shoal-tc.sh setup on each interface
 * with one htb class per configured tenant that names a classifier (tenant.NAME.dscp or
 * tenant.NAME.tc_mark), rate = the link's part by tenant.NAME.tc_weight (spot tenants: a
 * token 1%, they live on what others leave), ceil = the link; at stop it removes the tree. A
 * host where tc cannot be configured (the script's exit 3: no CAP_NET_ADMIN, no tc, no such
 * interface, a classifier the kernel lacks) falls back to pacing the NICs' traffic with
 * qos_capacity_net, said once.
 */
#include "agent/agent.h"
#include "qos/pace_page.h"
#include "qos/share.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { SHOALD_QOS_SAME = 0, SHOALD_QOS_NIC, SHOALD_QOS_NRES };
static const char *const shoald_qos_res_names[SHOALD_QOS_NRES] = {"same_host", "other_host"};
static const char *const shoald_qos_class_names[] = {"default", "guaranteed", "burstable",
                                                     "spot"};

#define SHOALD_QOS_GREEDY 0.9      /* used this much of its rate: wants more */
#define SHOALD_QOS_GROWTH 1.5      /* a modest tenant asks for this much of what it used */
#define SHOALD_QOS_IDLE_BYTES 4096 /* less than this in a period: idle */
#define SHOALD_QOS_TC_TIMEOUT_MS 10000
#define SHOALD_QOS_ARRIVAL_NS 500000000ull /* an arriving tenant is greedy at most this long */
#define SHOALD_QOS_BEAT_NS 500000000ull   /* the pages' gen moves at least this often */

typedef struct shoald_qos_tenant {
    struct shoald_qos_tenant *next;
    char name[SHOALD_NAME_MAX];
    char path[4096];
    shoal_qos_rates_page_t *page;          /* mapped read-write, NULL if it could not be made */
    int page_failed;                       /* page could not be made: tried again (quietly) at
                                            * each registration and run */
    int weight, qos_class;                 /* of its live pages: the largest, the best */
    unsigned comms, ranks;                 /* live on this host */
    double used[SHOALD_QOS_NRES];          /* bytes/s in the last period */
    double given[SHOALD_QOS_NRES];         /* bytes/s the last run gave it, 0 = none */
    int unarbitrated;                      /* sent where the agent does not divide */
    double demand[SHOALD_QOS_NRES];        /* the last run's: -1 greedy, 0 idle, else bytes/s */
    int fresh;                             /* arrived: a page of its first communicator has
                                            * not sent for a full period yet (greedy) */
    uint64_t rate;                         /* tenant's rate on this host, bytes/s, 0 = none */
    uint64_t comm_rate;                    /* published: rate / comms */
    uint64_t paced_ns;                     /* held back by pacing, all its ranks (counter) */
} shoald_qos_tenant_t;

typedef struct shoald_qos {
    shoald_qos_tenant_t *tenants;
    double capacity[SHOALD_QOS_NRES];      /* bytes/s, 0 = not divided by the agent */
    uint64_t next_ns, last_ns;             /* monotonic */
    uint64_t beat_ns;                      /* next heartbeat between two runs, monotonic */
    uint64_t runs;
    int tc_devs;                           /* interfaces tc was set up on */
    int tc_failed_warned;
    int spot_cpu_warned;
} shoald_qos_t;

static uint64_t shoald_qos_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- tc ---------------------------------------------------------------------------------- */

/* Runs argv (the tc script) with a deadline; its exit status, or -1. Its output goes to the
 * agent's stderr (the journal). Its signals as a program expects them: none blocked, the
 * defaults (it inherited the agent's SIGTERM and SIGINT blocked for the signalfd and SIGPIPE
 * ignored: neither it nor its tc could be ended by a kill, a timeout(1) or the unit's stop). */
static int shoald_qos_run(char *const argv[])
{
    uint64_t deadline = shoald_qos_now() + SHOALD_QOS_TC_TIMEOUT_MS * 1000000ull;
    posix_spawnattr_t attr;
    sigset_t none, dflt;
    pid_t pid;
    int status, err;

    sigemptyset(&none);
    sigemptyset(&dflt);
    sigaddset(&dflt, SIGTERM);
    sigaddset(&dflt, SIGINT);
    sigaddset(&dflt, SIGPIPE);
    err = posix_spawnattr_init(&attr);
    if (err == 0) {
        posix_spawnattr_setsigmask(&attr, &none);
        posix_spawnattr_setsigdefault(&attr, &dflt);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
        err = posix_spawn(&pid, argv[0], NULL, &attr, argv, environ);
        posix_spawnattr_destroy(&attr);
    }
    if (err != 0) {
        shoal_warn(METER, "cannot run %s: %s", argv[0], strerror(err));
        return -1;
    }
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (w < 0 && errno != EINTR)
            return -1;
        if (shoald_qos_now() > deadline) {
            shoal_warn(METER, "%s did not finish within %d ms: killed", argv[0],
                       SHOALD_QOS_TC_TIMEOUT_MS);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(10000);
    }
}

/* tc rate string -> bits/s, 0 if malformed: the units shoal-tc.sh takes, as tc does in any
 * case (bit kbit mbit gbit, powers of 1000; bps = bytes/s). "1Gbit" and "125000000bps" were
 * refused here while the script and tc take them: tc was never set up. */
static double shoald_qos_tc_bits(const char *s)
{
    char *end;
    double v = strtod(s, &end);

    if (end == s || !(v > 0) || !isfinite(v))
        return 0;
    if (strcasecmp(end, "gbit") == 0)
        return v * 1e9;
    if (strcasecmp(end, "mbit") == 0)
        return v * 1e6;
    if (strcasecmp(end, "kbit") == 0)
        return v * 1e3;
    if (strcasecmp(end, "bps") == 0)
        return v * 8;
    if (strcasecmp(end, "bit") == 0 || *end == '\0')
        return v;
    return 0;
}

/* The htb tree on every qos_tc_dev: 1 when at least one interface has it. */
static int shoald_qos_tc_setup(shoald_t *a)
{
    const shoald_config_t *cfg = a->cfg;
    double link = shoald_qos_tc_bits(cfg->qos_tc_link_rate), wsum = 0;
    char specs[64][160], devs[1024], *save = NULL, *dev;
    char *argv[4 + 64 + 1];
    const shoald_tenant_t *t;
    int n = 0, ok = 0, nspot = 0, nall = 0, rc;

    if (link <= 0) {
        shoal_warn(METER, "qos_tc_link_rate=%s is not a tc rate (e.g. 1gbit): tc not set up",
                   cfg->qos_tc_link_rate);
        return 0;
    }
    /* the shares among the tenants that get a class: the first 64 (the weights of the others
     * took part of the reserved tenants' 97% that no class had) */
    for (t = cfg->tenants; t != NULL; t = t->next) {
        if (t->tc_dscp < 0 && t->tc_mark < 0)
            continue;
        if (nall++ >= 64)
            continue;
        if (strcmp(t->class_name, "spot") == 0)
            nspot++;
        else
            wsum += t->tc_weight;
    }
    if (nall > 64)
        shoal_warn(METER, "qos_tc: %d tenants name a classifier, tc takes 64: the other %d "
                   "share the default class (the agent's own and foreign traffic)", nall,
                   nall - 64);
    /* 97% of the link by weight to the reserved tenants, 1% among the spot ones: what is
     * left (at least 1%) is the default class's (the agent's own and foreign traffic). */
    for (t = cfg->tenants; t != NULL && n < 64; t = t->next) {
        double r;
        if (t->tc_dscp < 0 && t->tc_mark < 0)
            continue;
        r = strcmp(t->class_name, "spot") == 0 ? link * 0.01 / nspot
                                              : link * 0.97 * t->tc_weight / wsum;
        snprintf(specs[n], sizeof(specs[n]), "%s,rate=%.0fbit,%s=%d", t->name, r,
                 t->tc_dscp >= 0 ? "dscp" : "mark", t->tc_dscp >= 0 ? t->tc_dscp : t->tc_mark);
        n++;
    }
    if (n == 0) {
        shoal_warn(METER, "qos_tc is set but no tenant names a classifier (tenant.NAME.dscp or "
                   "tenant.NAME.tc_mark): tc not set up");
        return 0;
    }
    snprintf(devs, sizeof(devs), "%s", cfg->qos_tc_dev);
    for (dev = strtok_r(devs, ", ", &save); dev != NULL; dev = strtok_r(NULL, ", ", &save)) {
        argv[0] = (char *)cfg->qos_tc;
        argv[1] = (char *)"setup";
        argv[2] = dev;
        argv[3] = (char *)cfg->qos_tc_link_rate;
        for (int i = 0; i < n; i++)
            argv[4 + i] = specs[i];
        argv[4 + n] = NULL;
        rc = shoald_qos_run(argv);
        if (rc == 0) {
            shoal_info(METER, "tc: htb with %d tenant classes on %s (%s)", n, dev,
                       cfg->qos_tc_link_rate);
            ok++;
        } else {
            shoal_warn(METER, "tc cannot be configured on %s (%s exit %d%s): its tenants' "
                       "traffic is paced by the library instead (qos_capacity_net)", dev,
                       cfg->qos_tc, rc, rc == 3 ? ": no CAP_NET_ADMIN, or the kernel lacks "
                       "what it needs" : "");
        }
    }
    return ok;
}

static void shoald_qos_tc_remove(shoald_t *a)
{
    char devs[1024], *save = NULL, *dev, *argv[4];

    snprintf(devs, sizeof(devs), "%s", a->cfg->qos_tc_dev);
    for (dev = strtok_r(devs, ", ", &save); dev != NULL; dev = strtok_r(NULL, ", ", &save)) {
        argv[0] = (char *)a->cfg->qos_tc;
        argv[1] = (char *)"remove";
        argv[2] = dev;
        argv[3] = NULL;
        if (shoald_qos_run(argv) != 0)
            shoal_warn(METER, "tc: removing the htb tree of %s failed", dev);
    }
}

/* ---- rates pages ------------------------------------------------------------------------- */

static void shoald_qos_publish(shoal_qos_rates_page_t *pg, uint64_t rate)
{
    uint64_t g = __atomic_load_n(&pg->gen, __ATOMIC_RELAXED);

    __atomic_store_n(&pg->gen, g + 1, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&pg->rate, rate, __ATOMIC_RELAXED);
    __atomic_store_n(&pg->burst, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pg->heartbeat_ns, shoald_unix_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(&pg->gen, g + 2, __ATOMIC_RELEASE);
}

/* Makes DIR/NAME.rate (a new file renamed into place, so a reader never maps a half-made
 * page); NULL when it cannot (said once per tenant: the tenant then runs unarbitrated). */
static shoal_qos_rates_page_t *shoald_qos_page_make(const char *dir, const char *name,
                                                    char *path, size_t len, int say)
{
    char tmp[4200];
    void *map;
    int fd;

    snprintf(path, len, "%s/%s.rate", dir, name);
    snprintf(tmp, sizeof(tmp), "%s/.%s.rate.tmp", dir, name);
    unlink(tmp);
    fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 || fchmod(fd, 0644) != 0 || ftruncate(fd, SHOAL_QOS_RATES_PAGE_BYTES) != 0) {
        if (say)
            shoal_warn(METER, "cannot make the rates page %s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    map = mmap(NULL, SHOAL_QOS_RATES_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        if (say)
            shoal_warn(METER, "cannot map the rates page %s: %s", tmp, strerror(errno));
        unlink(tmp);
        return NULL;
    }
    shoal_qos_rates_page_t *pg = map;
    pg->magic = SHOAL_QOS_RATES_MAGIC;
    pg->version = SHOAL_QOS_RATES_VERSION;
    shoald_qos_publish(pg, 0);
    if (rename(tmp, path) != 0) {
        if (say)
            shoal_warn(METER, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        munmap(map, SHOAL_QOS_RATES_PAGE_BYTES);
        unlink(tmp);
        return NULL;
    }
    return pg;
}

static shoald_qos_tenant_t *shoald_qos_tenant(shoald_t *a, const char *name)
{
    shoald_qos_t *q = a->qos;
    shoald_qos_tenant_t *t;

    for (t = q->tenants; t != NULL; t = t->next) {
        if (strcmp(t->name, name) != 0)
            continue;
        /* A page that could not be made (the directory removed, the disk full) is made when
         * it can: it was never tried again, the tenant ran unpaced for as long as the agent
         * ran. */
        if (t->page == NULL && t->page_failed) {
            t->page = shoald_qos_page_make(a->cfg->qos_rates_dir, name, t->path,
                                           sizeof(t->path), 0);
            t->page_failed = t->page == NULL;
            if (t->page != NULL)
                shoal_info(METER, "qos: rates page %s for tenant %s (made now)", t->path,
                           name);
        }
        return t;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    snprintf(t->name, sizeof(t->name), "%s", name);
    /* the library's %t: a job without tenant is "uid=N" on both sides (shoald_page_add). The
     * names it takes are the library's (shoal_provider_name_ok; '.'-first names such as ".x"
     * were refused here: such a tenant ran unpaced and still took a share from the others) */
    if (name[0] != '\0' && shoal_provider_name_ok(name)) {
        t->page = shoald_qos_page_make(a->cfg->qos_rates_dir, name, t->path, sizeof(t->path),
                                       1);
        t->page_failed = t->page == NULL;
    }
    if (t->page != NULL)
        shoal_info(METER, "qos: rates page %s for tenant %s", t->path, name);
    t->next = q->tenants;
    q->tenants = t;
    return t;
}

/* ---- the arbiter -------------------------------------------------------------------------- */

/* a + b, at most UINT64_MAX */
static uint64_t shoald_qos_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* A page's payload bytes sent so far, same host and other host (p->ctr as last read). The
 * sums saturate: the counters are the rank's to write, and a wrapped sum was a huge 'used'
 * (in /metrics, and the tenant greedy) the run after. */
static void shoald_qos_page_bytes(const shoald_page_t *p, uint64_t now[SHOALD_QOS_NRES])
{
    now[SHOALD_QOS_SAME] = now[SHOALD_QOS_NIC] = 0;
    for (int tl = 0; tl < SHOAL_METER_NTL; tl++) {
        now[SHOALD_QOS_SAME] = shoald_qos_add(now[SHOALD_QOS_SAME],
            p->ctr[SHOALD_CTR_SENT + tl * SHOAL_METER_NLOC + SHOAL_METER_SAME_HOST]);
        now[SHOALD_QOS_NIC] = shoald_qos_add(now[SHOALD_QOS_NIC],
            p->ctr[SHOALD_CTR_SENT + tl * SHOAL_METER_NLOC + SHOAL_METER_OTHER_HOST]);
    }
}

/* Weighted max-min shares of each resource from the tenants' demands (t->demand, t->weight,
 * t->comms), and every rates page written. */
static void shoald_qos_divide(shoald_qos_t *q)
{
    shoald_qos_tenant_t *t;
    int n = 0, i, r;

    for (t = q->tenants; t != NULL; t = t->next)
        n++;
    if (n == 0)
        return;
    double w[n], d[n], out[n], arrive[n];
    shoald_qos_tenant_t *ts[n];
    i = 0;
    for (t = q->tenants; t != NULL; t = t->next) {
        ts[i++] = t;
        t->rate = 0;
    }
    for (r = 0; r < SHOALD_QOS_NRES; r++) {
        /* A tenant without a page runs unpaced whatever it is given: it takes no share
         * (its weight's part was taken from the others, for nothing). */
        for (i = 0; i < n; i++) {
            int in = ts[i]->comms > 0 && ts[i]->page != NULL;

            w[i] = in ? ts[i]->weight : 0;
            d[i] = in ? ts[i]->demand[r] : 0;
        }
        if (q->capacity[r] <= 0) {
            memset(out, 0, sizeof(out));
        } else {
            double left = q->capacity[r] - shoal_qos_share(w, d, n, q->capacity[r], out), ws = 0;
            /* Every active tenant modest (no greedy one took the rest): what is left goes to
             * them by weight too, so that one that steps up (a job going from small messages
             * to large ones) is not held at 1.5 times its past use until the next run. */
            for (i = 0; i < n; i++)
                ws += d[i] != 0 ? w[i] : 0;
            for (i = 0; i < n && left > q->capacity[r] * 1e-9 && ws > 0; i++)
                out[i] += d[i] != 0 ? left * w[i] / ws : 0;
        }
        for (i = 0; i < n; i++) {
            ts[i]->given[r] = d[i] != 0 ? out[i] : 0;
            arrive[i] = 0;
        }
        /* Resource r's arrival share of each tenant idle on it (same host only: a tenant's
         * first traffic is not known to be on the NICs). */
        if (r == SHOALD_QOS_SAME && q->capacity[r] > 0) {
            for (i = 0; i < n; i++) {
                if (d[i] != 0 || w[i] <= 0)
                    continue;
                double dd[n], oo[n];
                memcpy(dd, d, sizeof(dd));
                dd[i] = -1;
                shoal_qos_share(w, dd, n, q->capacity[r], oo);
                arrive[i] = oo[i];
            }
        }
        /* A share under 1 B/s (weights 1000000 to 1 of a small capacity) counts as 1: cut to
         * 0, it was no limit at all on the tenant's page, the lightest tenant unpaced. */
        for (i = 0; i < n; i++) {
            double g = ts[i]->given[r] > 0 ? ts[i]->given[r] : arrive[i];
            uint64_t v;

            if (!(g > 0))
                continue;
            /* Saturated: a share of 2^64 (a capacity near it) cast to uint64_t was undefined,
             * 0 on x86 (the page said 1 B/s), and the two resources' sum could wrap. */
            v = g >= 0x1p64 ? UINT64_MAX : SHOAL_MAX((uint64_t)g, 1ull);
            ts[i]->rate = shoald_qos_add(ts[i]->rate, v);
        }
    }
    for (i = 0; i < n; i++) {
        t = ts[i];
        if (t->unarbitrated || t->comms == 0)
            t->rate = 0;
        /* the same for each communicator's part (as the library's division of it) */
        t->comm_rate = t->rate == 0 ? 0 : SHOAL_MAX(t->rate / SHOAL_MAX(t->comms, 1u), 1ull);
        if (t->page != NULL)
            shoald_qos_publish(t->page, t->comm_rate);
    }
}

/* 1 when the page's process has exited: its pid may run another process by now (another
 * tenant's). The pidfd tells it; without one, the start time (a pid without a process, or
 * another process's start). */
static int shoald_qos_proc_gone(const shoald_page_t *p)
{
    struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};

    if (p->end_ns != 0)
        return 1;
    if (p->pidfd >= 0)
        return poll(&pf, 1, 0) != 0; /* exited (POLLIN), or the pidfd unusable */
    if (p->proc == NULL || p->proc->start_ns == 0)
        return kill(p->pid, 0) != 0 && errno == ESRCH;
    return shoald_proc_start_ns(p->pid) != p->proc->start_ns;
}

/* A spot communicator's process (qos_spot_cpu): every thread it has now to SCHED_IDLE or
 * nice 19 (threads it makes later inherit it from their creator). On a host with fewer CPUs
 * than busy ranks, a spot job's ranks spin-waiting for each other take CPU time from the
 * other tenants' ranks, and a guaranteed job's small messages wait for a time slice (ms);
 * idle, they run only on what the others leave. */
static void shoald_qos_spot_cpu(shoald_t *a, const shoald_page_t *p)
{
    const char *how = a->cfg->qos_spot_cpu != NULL ? a->cfg->qos_spot_cpu : "none";
    int idle = strcmp(how, "idle") == 0, nice19 = strcmp(how, "nice") == 0, n = 0, err = 0;
    char dir[64];
    struct dirent *e;
    DIR *d;

    if (!idle && !nice19)
        return;
    /* Looked up by pid: a process gone by now (its pid reused) was set to SCHED_IDLE or
     * nice 19 in its place, whoever's it was. */
    if (shoald_qos_proc_gone(p)) {
        shoal_info(METER, "qos: spot pid %d (%s/%s) is gone: no CPU priority to lower",
                   (int)p->pid, p->job->tenant, p->job->job);
        return;
    }
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)p->pid);
    d = opendir(dir);
    if (d == NULL) {
        err = errno;
    } else {
        while ((e = readdir(d)) != NULL) {
            char *end;
            long tid = strtol(e->d_name, &end, 10);
            int rc;
            if (*end != '\0' || tid <= 0)
                continue;
            if (idle) {
                struct sched_param sp = {.sched_priority = 0};
                rc = sched_setscheduler((pid_t)tid, SCHED_IDLE, &sp);
            } else {
                rc = setpriority(PRIO_PROCESS, (id_t)tid, 19);
            }
            if (rc == 0)
                n++;
            else
                err = errno;
        }
        closedir(d);
    }
    if (n == 0) {
        if (!a->qos->spot_cpu_warned)
            shoal_warn(METER, "qos: cannot lower the CPU priority of spot pid %d (%s/%s): %s "
                       "(qos_spot_cpu=%s needs the same uid or CAP_SYS_NICE)", (int)p->pid,
                       p->job->tenant, p->job->job, strerror(err), how);
        a->qos->spot_cpu_warned = 1;
        return;
    }
    shoal_info(METER, "qos: spot cpu of pid %d (%s/%s): %s on %d thread(s)", (int)p->pid,
               p->job->tenant, p->job->job, idle ? "SCHED_IDLE" : "nice 19", n);
}

/* The tenant's live communicators on this host (distinct job and comm id among its live
 * pages), as shoald_qos_measure counts them. */
static unsigned shoald_qos_live_comms(const shoald_t *a, const char *tenant)
{
    const shoald_job_t *j;
    const shoald_page_t *p, *o;
    unsigned n = 0;

    for (j = a->jobs; j != NULL; j = j->next) {
        if (strcmp(j->tenant, tenant) != 0)
            continue;
        for (p = j->pages; p != NULL; p = p->next) {
            int first = 1;
            if (p->end_ns != 0 || p->superseded)
                continue;
            for (o = j->pages; o != p && first; o = o->next) {
                if (o->end_ns == 0 && !o->superseded && o->comm_id == p->comm_id)
                    first = 0;
            }
            n += (unsigned)first;
        }
    }
    return n;
}

void shoald_qos_page_register(shoald_t *a, shoald_page_t *p, const shoal_meter_page_t *snap,
                              int cred_class, int cred_weight)
{
    /* Service rank: guaranteed > burstable > default > spot (as src/qos/qos_class.c). */
    static const int rank[4] = {1, 3, 2, 0};
    int c = snap->qos_class >= 0 && snap->qos_class < 4 ? snap->qos_class : 0;
    int w = snap->qos_weight >= 1 ? snap->qos_weight : 1;
    int cmax = cred_class > 0 && cred_class < 4 ? cred_class : 2 /* burstable */;
    shoald_qos_t *q = a->qos;
    shoald_qos_tenant_t *t;

    if (rank[c] > rank[cmax])
        c = cmax;
    w = SHOAL_MIN(w, cred_class > 0 ? SHOAL_MAX(cred_weight, 1) : 1);
    p->qos_class = c;
    p->qos_weight = w;
    if (q == NULL)
        return;
    if (c == 3)
        shoald_qos_spot_cpu(a, p);
    if ((t = shoald_qos_tenant(a, p->job->tenant)) == NULL)
        return;
    /* The page's counters as of now (shoald_page_add read them): the next run counts what it
     * sends from here, not only from its second run. */
    shoald_qos_page_bytes(p, p->qos_prev);
    p->qos_paced_prev = __atomic_load_n(&((const shoal_meter_page_t *)p->map)->paced_ns,
                                        __ATOMIC_RELAXED);
    p->qos_seen = 1;
    /* A tenant that was not active arrives: before the reply (so that the rank's pacer finds
     * its page at init), every tenant's rate is divided again with it greedy (its weight
     * against the active tenants' demands of the last run), so that the others make room now,
     * not at the next run, up to qos_period away. It stays greedy until its page has sent for
     * a whole period (the runs before measure a job still starting), at most
     * SHOALD_QOS_ARRIVAL_NS. */
    if (t->comms == 0 && t->page != NULL &&
        (q->capacity[SHOALD_QOS_SAME] > 0 || q->capacity[SHOALD_QOS_NIC] > 0)) {
        p->qos_fresh_ns = shoald_qos_now() + SHOALD_QOS_ARRIVAL_NS;
        t->comms = 1;
        t->weight = w;
        t->qos_class = c;
        t->fresh = 1;
        t->unarbitrated = 0;
        t->demand[SHOALD_QOS_SAME] = -1;
        /* only the NICs divided (qos_capacity_shm 0): its share of them (there was no
         * division at all, its page said 0, unlimited, until the next run) */
        t->demand[SHOALD_QOS_NIC] = q->capacity[SHOALD_QOS_SAME] > 0 ? 0 : -1;
        shoald_qos_divide(q);
    } else if (t->comms > 0 && t->page != NULL) {
        /* Another communicator of an active tenant: the tenant's rate is split among its
         * communicators now (it kept the rate of one until the next run, up to qos_period
         * away: the tenant sent twice its share meanwhile). */
        unsigned n = shoald_qos_live_comms(a, t->name);
        if (n > t->comms) {
            t->comms = n;
            shoald_qos_divide(q);
        }
    }
}

void shoald_qos_page_end(shoald_t *a, shoald_page_t *p)
{
    shoald_qos_t *q = a->qos;
    shoald_qos_tenant_t *t;
    unsigned n;

    if (q == NULL)
        return;
    for (t = q->tenants; t != NULL && strcmp(t->name, p->job->tenant) != 0; t = t->next) {
    }
    if (t == NULL || t->comms == 0)
        return;
    n = shoald_qos_live_comms(a, t->name);
    if (n > 0) {
        /* still active: the next run measures it; fewer communicators share its rate now */
        if (n < t->comms) {
            t->comms = n;
            shoald_qos_divide(q);
        }
        return;
    }
    /* Its last communicator on this host ended: the others get its part now. */
    t->comms = 0;
    t->fresh = 0;
    memset(t->demand, 0, sizeof(t->demand));
    shoald_qos_divide(q);
}

/* 1 when two live pages belong to one communicator (the same job and comm id). */
static int shoald_qos_same_comm(const shoald_page_t *x, const shoald_page_t *y)
{
    return x->job == y->job && x->comm_id == y->comm_id;
}

/* Reads the pages: per tenant the bytes/s of the last period per resource, its communicators,
 * weight and class, the time its ranks were held back, whether it is still arriving. */
static void shoald_qos_measure(shoald_t *a, double dt, uint64_t mono)
{
    shoald_qos_t *q = a->qos;
    shoald_qos_tenant_t *t;
    shoald_job_t *j;
    shoald_page_t *p, *o;

    for (t = q->tenants; t != NULL; t = t->next) {
        memset(t->used, 0, sizeof(t->used));
        t->comms = t->ranks = 0;
        t->weight = 1;
        t->qos_class = -1;
        t->unarbitrated = 0;
        t->fresh = 0;
    }
    shoald_pages_read(a);
    for (j = a->jobs; j != NULL; j = j->next) {
        t = NULL;
        for (p = j->pages; p != NULL; p = p->next) {
            const shoal_meter_page_t *pg = (const shoal_meter_page_t *)p->map;
            uint64_t now[SHOALD_QOS_NRES], paced, sent = 0;
            int first;

            if (p->end_ns != 0 || p->superseded)
                continue;
            if (t == NULL && (t = shoald_qos_tenant(a, j->tenant)) == NULL)
                break;
            shoald_qos_page_bytes(p, now);
            paced = __atomic_load_n(&pg->paced_ns, __ATOMIC_RELAXED);
            if (p->qos_seen) {
                for (int r = 0; r < SHOALD_QOS_NRES; r++) {
                    t->used[r] += (double)(now[r] - p->qos_prev[r]) / dt;
                    sent += now[r] - p->qos_prev[r];
                }
                if (paced > p->qos_paced_prev)
                    t->paced_ns += paced - p->qos_paced_prev;
            }
            if (p->qos_fresh_ns != 0) {
                /* Arriving: greedy for the run after the first in which it sent (that one
                 * measured part of a period), and never past its deadline. */
                if (p->qos_seen && sent >= SHOALD_QOS_IDLE_BYTES)
                    p->qos_fresh_ns = SHOAL_MIN(p->qos_fresh_ns,
                                                mono + (uint64_t)(dt * 1.5e9));
                if (mono >= p->qos_fresh_ns)
                    p->qos_fresh_ns = 0;
                else
                    t->fresh = 1;
            }
            if (!p->qos_seen || paced > p->qos_paced_prev)
                p->qos_paced_prev = paced;
            memcpy(p->qos_prev, now, sizeof(now));
            p->qos_seen = 1;
            t->ranks++;
            first = 1;
            for (o = j->pages; o != p; o = o->next) {
                if (o->end_ns == 0 && !o->superseded && shoald_qos_same_comm(o, p))
                    first = 0;
            }
            t->comms += (unsigned)first;
            t->weight = SHOAL_MAX(t->weight, p->qos_weight);
            if (t->qos_class < 0 || (p->qos_class == 1) ||
                (p->qos_class == 2 && t->qos_class != 1) ||
                (p->qos_class == 0 && t->qos_class == 3))
                t->qos_class = p->qos_class;
        }
    }
}

/* Each tenant's demand per resource from what it used in the last period (see the top). */
static void shoald_qos_demand(shoald_qos_t *q, double dt)
{
    shoald_qos_tenant_t *t;

    for (t = q->tenants; t != NULL; t = t->next) {
        for (int r = 0; r < SHOALD_QOS_NRES; r++) {
            double *d = &t->demand[r];
            if (t->comms == 0) {
                *d = 0;
            } else if (q->capacity[r] <= 0) {
                if (t->used[r] > 0)
                    t->unarbitrated = 1;
                *d = 0;
            } else if (r == SHOALD_QOS_SAME && t->fresh) {
                *d = -1; /* arriving: its first periods measure a job still starting */
            } else if (t->used[r] * dt < SHOALD_QOS_IDLE_BYTES) {
                *d = 0; /* idle here */
            } else if (t->qos_class == SHOAL_QOS_GUARANTEED) {
                *d = -1; /* active guaranteed: its weight's share is kept for it */
            } else if (t->given[r] <= 0 || t->used[r] >= SHOALD_QOS_GREEDY * t->given[r]) {
                *d = -1; /* greedy */
            } else {
                *d = t->used[r] * SHOALD_QOS_GROWTH;
            }
        }
    }
}

static void shoald_qos_run_once(shoald_t *a, double dt, uint64_t mono)
{
    shoald_qos_measure(a, dt, mono);
    shoald_qos_demand(a->qos, dt);
    shoald_qos_divide(a->qos);
}

/* mkdir -p, mode 0755 (the pages are for every local job to read), whatever the umask: made
 * 0700 under umask 077, every other uid's job could not open its page and ran unpaced. */
static int shoald_qos_mkdir(const char *dir)
{
    char buf[4096];
    size_t i, n = strlen(dir);

    if (n == 0 || n >= sizeof(buf)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        buf[i] = '\0';
        if (mkdir(buf, 0755) == 0) {
            if (chmod(buf, 0755) != 0)
                return -1;
        } else if (errno != EEXIST) {
            return -1;
        }
        buf[i] = i < n ? '/' : '\0';
    }
    return 0;
}

shoal_status_t shoald_qos_start(shoald_t *a)
{
    const shoald_config_t *cfg = a->cfg;
    shoald_qos_t *q;

    if (cfg->qos_rates_dir == NULL || strcmp(cfg->qos_rates_dir, "none") == 0 ||
        cfg->qos_rates_dir[0] == '\0')
        return SHOAL_OK;
    if (cfg->qos_capacity_shm == 0 && cfg->qos_capacity_net == 0 &&
        (cfg->qos_tc == NULL || strcmp(cfg->qos_tc, "none") == 0))
        return SHOAL_OK; /* nothing to divide: no arbiter, no pages */
    q = calloc(1, sizeof(*q));
    if (q == NULL)
        return SHOAL_ERR_NO_MEMORY;
    if (shoald_qos_mkdir(cfg->qos_rates_dir) != 0) {
        /* Metering and billing do not depend on it: the agent serves without an arbiter. */
        shoal_warn(METER, "cannot make the rates directory %s: %s: no QoS arbiter (jobs run "
                   "without the agent's rates)", cfg->qos_rates_dir, strerror(errno));
        free(q);
        return SHOAL_OK;
    }
    a->qos = q;
    q->capacity[SHOALD_QOS_SAME] = (double)cfg->qos_capacity_shm;
    q->capacity[SHOALD_QOS_NIC] = (double)cfg->qos_capacity_net;
    if (cfg->qos_tc != NULL && strcmp(cfg->qos_tc, "none") != 0 && cfg->qos_tc_dev != NULL &&
        cfg->qos_tc_dev[0] != '\0') {
        q->tc_devs = shoald_qos_tc_setup(a);
        if (q->tc_devs > 0)
            q->capacity[SHOALD_QOS_NIC] = 0; /* the kernel divides the link */
    }
    if (q->tc_devs == 0 && q->capacity[SHOALD_QOS_NIC] <= 0)
        shoal_info(METER, "qos: the NICs' traffic is not divided (no tc, qos_capacity_net=0)");
    q->last_ns = shoald_qos_now();
    q->next_ns = q->last_ns + (uint64_t)cfg->qos_period_ms * 1000000ull;
    q->beat_ns = q->last_ns + SHOALD_QOS_BEAT_NS;
    shoal_info(METER, "qos: arbiter every %d ms, rates pages in %s, capacity same host %.0f "
               "bytes/s, other host %s%.0f bytes/s", cfg->qos_period_ms, cfg->qos_rates_dir,
               q->capacity[SHOALD_QOS_SAME], q->tc_devs > 0 ? "tc, pacing " : "",
               q->capacity[SHOALD_QOS_NIC]);
    return SHOAL_OK;
}

void shoald_qos_tick(shoald_t *a)
{
    shoald_qos_t *q = a->qos;
    uint64_t now;

    if (q == NULL)
        return;
    now = shoald_qos_now();
    if (now < q->next_ns) {
        if (now >= q->beat_ns) {
            /* A long period: the pages' heartbeat, their rates as they are. */
            for (shoald_qos_tenant_t *t = q->tenants; t != NULL; t = t->next) {
                if (t->page != NULL)
                    shoald_qos_publish(t->page, t->comm_rate);
            }
            q->beat_ns = now + SHOALD_QOS_BEAT_NS;
        }
        return;
    }
    shoald_qos_run_once(a, (double)(now - q->last_ns) * 1e-9, now);
    q->runs++;
    q->last_ns = now;
    q->next_ns = now + (uint64_t)a->cfg->qos_period_ms * 1000000ull;
    q->beat_ns = now + SHOALD_QOS_BEAT_NS;
}

int shoald_qos_wait_ms(shoald_t *a)
{
    uint64_t now, next;

    if (a->qos == NULL)
        return -1;
    now = shoald_qos_now();
    next = SHOAL_MIN(a->qos->next_ns, a->qos->beat_ns);
    return now >= next ? 0 : (int)((next - now + 999999) / 1000000);
}

void shoald_qos_stop(shoald_t *a)
{
    shoald_qos_t *q = a->qos;
    shoald_qos_tenant_t *t;

    if (q == NULL)
        return;
    while ((t = q->tenants) != NULL) {
        q->tenants = t->next;
        if (t->page != NULL) {
            shoald_qos_publish(t->page, 0); /* full speed now, not after the timeout */
            munmap(t->page, SHOAL_QOS_RATES_PAGE_BYTES);
            unlink(t->path);
        }
        free(t);
    }
    if (q->tc_devs > 0)
        shoald_qos_tc_remove(a);
    free(q);
    a->qos = NULL;
}

/* ---- Prometheus ---------------------------------------------------------------------------- */

void shoald_qos_prom(shoald_t *a, const char *tenant, shoald_text_t *tx)
{
    shoald_qos_t *q = a->qos;
    const shoald_qos_tenant_t *t;
    int r;

    if (q == NULL)
        return;
#define SHOALD_QOS_EACH for (t = q->tenants; t != NULL; t = t->next) \
        if (tenant == NULL || strcmp(tenant, t->name) == 0)
#define SHOALD_QOS_LABEL(fam) do { shoald_text_printf(tx, "%s{tenant=", fam); \
        shoald_text_label(tx, t->name); } while (0)
    shoald_text_printf(tx, "# HELP shoal_qos_weight The tenant's QoS weight on this host (the "
                       "largest of its live communicators', from their credentials); the "
                       "class label is the best class among them\n"
                       "# TYPE shoal_qos_weight gauge\n");
    SHOALD_QOS_EACH {
        if (t->comms == 0)
            continue;
        SHOALD_QOS_LABEL("shoal_qos_weight");
        shoald_text_printf(tx, ",class=\"%s\"} %d\n",
                           t->qos_class >= 0 && t->qos_class < 4 ?
                           shoald_qos_class_names[t->qos_class] : "default", t->weight);
    }
    shoald_text_printf(tx, "# HELP shoal_qos_communicators The tenant's live communicators on "
                       "this host (each gets an equal part of the tenant's rate)\n"
                       "# TYPE shoal_qos_communicators gauge\n");
    SHOALD_QOS_EACH {
        SHOALD_QOS_LABEL("shoal_qos_communicators");
        shoald_text_printf(tx, "} %u\n", t->comms);
    }
    shoald_text_printf(tx, "# HELP shoal_qos_rate_bytes_per_second The rate the arbiter gives "
                       "the tenant on this host (0: not limited by the agent)\n"
                       "# TYPE shoal_qos_rate_bytes_per_second gauge\n");
    SHOALD_QOS_EACH {
        SHOALD_QOS_LABEL("shoal_qos_rate_bytes_per_second");
        shoald_text_printf(tx, "} %llu\n", (unsigned long long)t->rate);
    }
    shoald_text_printf(tx, "# HELP shoal_qos_comm_rate_bytes_per_second The rate each of the "
                       "tenant's communicators may send on this host (its rates page)\n"
                       "# TYPE shoal_qos_comm_rate_bytes_per_second gauge\n");
    SHOALD_QOS_EACH {
        SHOALD_QOS_LABEL("shoal_qos_comm_rate_bytes_per_second");
        shoald_text_printf(tx, "} %llu\n", (unsigned long long)t->comm_rate);
    }
    shoald_text_printf(tx, "# HELP shoal_qos_used_bytes_per_second Payload bytes per second "
                       "the tenant sent in the arbiter's last period, by resource\n"
                       "# TYPE shoal_qos_used_bytes_per_second gauge\n");
    SHOALD_QOS_EACH {
        for (r = 0; r < SHOALD_QOS_NRES; r++) {
            SHOALD_QOS_LABEL("shoal_qos_used_bytes_per_second");
            shoald_text_printf(tx, ",locality=\"%s\"} %.0f\n", shoald_qos_res_names[r],
                               t->used[r]);
        }
    }
    shoald_text_printf(tx, "# HELP shoal_qos_paced_seconds_total Time the tenant's ranks on "
                       "this host were held back by pacing (since the agent started)\n"
                       "# TYPE shoal_qos_paced_seconds_total counter\n");
    SHOALD_QOS_EACH {
        SHOALD_QOS_LABEL("shoal_qos_paced_seconds_total");
        shoald_text_printf(tx, "} %.6f\n", (double)t->paced_ns * 1e-9);
    }
    if (tenant == NULL) {
        shoald_text_printf(tx, "# HELP shoal_qos_capacity_bytes_per_second What the arbiter "
                           "divides, by resource (0: not divided by the agent)\n"
                           "# TYPE shoal_qos_capacity_bytes_per_second gauge\n");
        for (r = 0; r < SHOALD_QOS_NRES; r++)
            shoald_text_printf(tx, "shoal_qos_capacity_bytes_per_second{locality=\"%s\"} %.0f\n",
                               shoald_qos_res_names[r], q->capacity[r]);
        shoald_text_printf(tx, "# HELP shoal_qos_tc_interfaces Interfaces with shoal's htb tree "
                           "(0: tc could not be set up or is not configured)\n"
                           "# TYPE shoal_qos_tc_interfaces gauge\n"
                           "shoal_qos_tc_interfaces %d\n"
                           "# HELP shoal_qos_arbiter_runs_total Runs of the arbiter\n"
                           "# TYPE shoal_qos_arbiter_runs_total counter\n"
                           "shoal_qos_arbiter_runs_total %llu\n", q->tc_devs,
                           (unsigned long long)q->runs);
    }
#undef SHOALD_QOS_EACH
#undef SHOALD_QOS_LABEL
}
