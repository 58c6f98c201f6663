/* shoald: the registered pages, their jobs, and the abuse counters. A page's counters are
 * read with the seqlock and clamped so that no counter ever goes backwards; a page whose rank
 * is gone is read one last time and stays until the ledger has billed it, then its final
 * counters fold into its job's totals (Prometheus counters never go backwards either). */
#include "agent/agent.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

uint64_t shoald_unix_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Names that become label values and ledger keys: printable ASCII, no spaces, ';' or '=',
 * NUL-terminated within max ('.' is allowed: job names such as "train.v2"). Label escaping
 * still applies on export. */
int shoald_name_ok(const char *s, size_t max)
{
    size_t i;

    for (i = 0; i < max && s[i] != '\0'; i++) {
        if (s[i] <= ' ' || s[i] > '~' || s[i] == ';' || s[i] == '=')
            return 0;
    }
    return i > 0 && i < max;
}

void shoald_host_key(shoald_t *a)
{
    size_t n = strlen(a->hostname);

    if (n <= 32)
        snprintf(a->host_key, sizeof(a->host_key), "%s", a->hostname);
    else
        snprintf(a->host_key, sizeof(a->host_key), "%.23s~%08x", a->hostname,
                 (unsigned)(shoal_hash64(a->hostname, n, 0) & 0xffffffffu));
}

/* Unix ns when pid started (from /proc), 0 if unknown. */
uint64_t shoald_proc_start_ns(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long long start_ticks = 0, btime = 0;
    long hz = sysconf(_SC_CLK_TCK);
    size_t n;
    FILE *fp;
    int i;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fp = fopen(path, "re");
    if (fp == NULL)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL)
        return 0;
    for (i = 2; i < 22 && p != NULL; i++) /* field 22: starttime */
        p = strchr(p + 1, ' ');
    if (p == NULL || sscanf(p + 1, "%llu", &start_ticks) != 1)
        return 0;
    fp = fopen("/proc/stat", "re");
    if (fp == NULL)
        return 0;
    while (fgets(buf, sizeof(buf), fp) != NULL) {
        if (sscanf(buf, "btime %llu", &btime) == 1)
            break;
    }
    fclose(fp);
    if (btime == 0 || hz <= 0)
        return 0;
    return btime * 1000000000ull + start_ticks * (1000000000ull / (unsigned long long)hz);
}

static shoald_job_t *shoald_job_get(shoald_t *a, const char *tenant, const char *job,
                                    const char *class_name)
{
    shoald_job_t *j;

    for (j = a->jobs; j != NULL; j = j->next) {
        if (strcmp(j->tenant, tenant) != 0 || strcmp(j->job, job) != 0)
            continue;
        /* A job kept for its series only (no page, nothing left to bill) run again: its
         * minutes are billed in the class of this run, not of the one before (spot then
         * reserved, within job_retention, was billed spot). */
        if (j->pages == NULL && j->failed_platform == 0 && j->failed_tenant == 0)
            snprintf(j->class_name, sizeof(j->class_name), "%s", class_name);
        return j;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    snprintf(j->tenant, sizeof(j->tenant), "%s", tenant);
    snprintf(j->job, sizeof(j->job), "%s", job);
    snprintf(j->class_name, sizeof(j->class_name), "%s", class_name);
    j->last_minute = -1;
    j->next = a->jobs;
    a->jobs = j;
    return j;
}

/* A transport whose bytes the page keeps in two fields of their own, same host only
 * (cuda_ipc, nccl): its other-host counters are 0. */
static void shoald_page_same_host_only(uint64_t c[SHOALD_NCTR], int tl, const uint64_t *sent,
                                       const uint64_t *recv)
{
    int base = tl * SHOAL_METER_NLOC;
    c[SHOALD_CTR_SENT + base + SHOAL_METER_SAME_HOST] = __atomic_load_n(sent, __ATOMIC_RELAXED);
    c[SHOALD_CTR_RECV + base + SHOAL_METER_SAME_HOST] = __atomic_load_n(recv, __ATOMIC_RELAXED);
    c[SHOALD_CTR_SENT + base + SHOAL_METER_OTHER_HOST] = 0;
    c[SHOALD_CTR_RECV + base + SHOAL_METER_OTHER_HOST] = 0;
}

/* The page's counters in page order, one relaxed load each. */
static void shoald_page_load(const volatile shoal_meter_page_t *m, uint64_t c[SHOALD_NCTR])
{
    const shoal_meter_page_t *pg = (const shoal_meter_page_t *)m;
    int i, l;

    for (i = 0; i < SHOAL_METER_NCOLL; i++)
        c[SHOALD_CTR_OPS + i] = __atomic_load_n(&pg->ops[i], __ATOMIC_RELAXED);
    for (i = 0; i < SHOAL_METER_NTL; i++) {
        for (l = 0; l < SHOAL_METER_NLOC; l++) {
            c[SHOALD_CTR_SENT + i * SHOAL_METER_NLOC + l] =
                __atomic_load_n(&pg->bytes_sent[i][l], __ATOMIC_RELAXED);
            c[SHOALD_CTR_RECV + i * SHOAL_METER_NLOC + l] =
                __atomic_load_n(&pg->bytes_recv[i][l], __ATOMIC_RELAXED);
        }
    }
    shoald_page_same_host_only(c, SHOAL_METER_TL_CUDA_IPC, &pg->cuda_ipc_sent,
                               &pg->cuda_ipc_recv);
    shoald_page_same_host_only(c, SHOAL_METER_TL_NCCL, &pg->nccl_sent, &pg->nccl_recv);
    c[SHOALD_CTR_COLL_NS] = shoal_meter_page_coll_ns(pg); /* coll_ns or coll_ticks in ns */
    c[SHOALD_CTR_ERRORS] = __atomic_load_n(&pg->errors, __ATOMIC_RELAXED);
    c[SHOALD_CTR_PEER_FAILURES] = __atomic_load_n(&pg->peer_failures, __ATOMIC_RELAXED);
    c[SHOALD_CTR_ABORTS] = __atomic_load_n(&pg->aborts, __ATOMIC_RELAXED);
}

/* A consistent snapshot when the writer lets us (a few tries of the seqlock); otherwise the
 * values as they are: each counter is monotonic on its own, so deltas stay exact, and a rank
 * killed in the middle of a call leaves seq odd forever. */
void shoald_page_read(shoald_page_t *p)
{
    const shoal_meter_page_t *pg = (const shoal_meter_page_t *)p->map;
    uint64_t c[SHOALD_NCTR], s1, s2;
    int tries, i;

    for (tries = 0; tries < 64; tries++) {
        s1 = __atomic_load_n(&pg->seq, __ATOMIC_ACQUIRE);
        shoald_page_load(p->map, c);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        s2 = __atomic_load_n(&pg->seq, __ATOMIC_RELAXED);
        if (s1 == s2 && (s1 & 1) == 0)
            break;
    }
    for (i = 0; i < SHOALD_NCTR; i++) {
        if (c[i] > p->ctr[i])
            p->ctr[i] = c[i];
    }
    if (p->proc != NULL) {
        uint64_t v[SHOALD_NABUSE] = {
            [SHOALD_ABUSE_AUTH_FAILED] = __atomic_load_n(&pg->auth_failed, __ATOMIC_RELAXED),
            [SHOALD_ABUSE_AUTH_REFUSED] = __atomic_load_n(&pg->auth_refused, __ATOMIC_RELAXED),
            [SHOALD_ABUSE_BREAKER_OPENED] =
                __atomic_load_n(&pg->breaker_opened, __ATOMIC_RELAXED)};

        for (i = 0; i < SHOALD_NABUSE; i++)
            p->proc->v[i] = SHOAL_MAX(p->proc->v[i], v[i]);
    }
}

/* The job's entry of process (pid, start), made on first use; NULL when out of memory (the
 * page's abuse signals are then not exported, its counters still are). */
static shoald_proc_t *shoald_proc_get(shoald_job_t *j, pid_t pid, uint64_t start_ns)
{
    shoald_proc_t *pr;

    for (pr = j->procs; pr != NULL; pr = pr->next) {
        if (pr->pid == pid && pr->start_ns == start_ns)
            return pr;
    }
    pr = calloc(1, sizeof(*pr));
    if (pr == NULL)
        return NULL;
    pr->pid = pid;
    pr->start_ns = start_ns;
    pr->next = j->procs;
    j->procs = pr;
    return pr;
}

/* Drops the entries of processes that are gone and that no page of the job points to, their
 * signals kept in the job's gone_abuse (the exported sums stay monotonic). Kept, every process
 * that ever registered in a job stayed listed while the job lived: a job never without a live
 * rank (a long service, a job name reused by many runs) grew by one entry per process. A
 * process that lives keeps its entry: its next page's signals are the same process-wide
 * counters, which would be counted twice. */
static void shoald_procs_drop_gone(shoald_job_t *j)
{
    shoald_proc_t **pp, *pr;
    int i;

    for (pp = &j->procs; (pr = *pp) != NULL;) {
        if (pr->npages != 0 || ((kill(pr->pid, 0) == 0 || errno != ESRCH) &&
                                shoald_proc_start_ns(pr->pid) == pr->start_ns)) {
            pp = &pr->next;
            continue;
        }
        for (i = 0; i < SHOALD_NABUSE; i++)
            j->gone_abuse[i] += pr->v[i];
        *pp = pr->next;
        free(pr);
    }
}

static void shoald_procs_free(shoald_job_t *j)
{
    shoald_proc_t *pr;

    while ((pr = j->procs) != NULL) {
        j->procs = pr->next;
        free(pr);
    }
}

void shoald_pages_read(shoald_t *a)
{
    shoald_job_t *j;
    shoald_page_t *p;

    for (j = a->jobs; j != NULL; j = j->next) {
        for (p = j->pages; p != NULL; p = p->next) {
            if (p->end_ns == 0)
                shoald_page_read(p);
        }
    }
}

/* The same page (same process, communicator, rank, creation) registered again with this
 * agent (the library reconnected before the agent saw the old connection end): the new
 * registration carries on where the old one was, counters and billing included; the old one
 * is closed and dropped without being counted again (it is freed by the next collect, not
 * now: an event of this loop turn may still point at it). */
static void shoald_page_supersede(shoald_t *a, shoald_job_t *j, shoald_page_t *p)
{
    shoald_page_t *q;
    int i;

    for (q = j->pages; q != NULL; q = q->next) {
        if (q->superseded || strcmp(q->key, p->key) != 0)
            continue;
        memcpy(p->billed, q->billed, sizeof(p->billed));
        memcpy(p->legacy_key, q->legacy_key, sizeof(p->legacy_key));
        p->failure_counted = q->failure_counted;
        for (i = 0; i < SHOALD_NCTR; i++)
            p->ctr[i] = SHOAL_MAX(p->ctr[i], q->ctr[i]);
        p->created_ns = q->created_ns;
        p->cursor_known = q->cursor_known;
        q->superseded = 1;
        if (q->end_ns == 0)
            q->end_ns = shoald_unix_ns();
        shoald_close_later(a, q->conn_fd);
        if (q->pidfd >= 0)
            close(q->pidfd);
        q->conn_fd = -1;
        q->pidfd = -1;
        shoal_info(METER, "page %s registered again: it carries on", p->key);
    }
}

shoal_status_t shoald_page_add(shoald_t *a, const shoal_meter_page_t *snap,
                               const volatile shoal_meter_page_t *map, int conn_fd, int pidfd,
                               pid_t pid, uid_t uid, gid_t gid, const char *class_name,
                               shoald_page_t **page_p)
{
    uint64_t now = shoald_unix_ns(), start = shoald_proc_start_ns(pid);
    const char *tenant = snap->tenant;
    char uid_tenant[SHOALD_NAME_MAX];
    shoald_page_t *p;
    shoald_job_t *j;

    if (tenant[0] == '\0') {
        /* An uncredentialed page (allow_uncredentialed) is metered and billed as tenant
         * "uid=N": the ledger needs a name (a record of tenant "" was refused, and held every
         * later minute back), and no configured tenant can be called so ('=' is not allowed
         * in one). */
        snprintf(uid_tenant, sizeof(uid_tenant), "uid=%u", (unsigned)uid);
        tenant = uid_tenant;
    }
    j = shoald_job_get(a, tenant, snap->job, class_name);
    p = calloc(1, sizeof(*p));
    if (j == NULL || p == NULL) {
        free(p);
        shoal_error(METER, "out of memory registering a page of pid %d", (int)pid);
        return SHOAL_ERR_NO_MEMORY;
    }
    p->job = j;
    p->map = map;
    p->conn_fd = conn_fd;
    p->pidfd = pidfd;
    p->pid = pid;
    p->uid = uid;
    p->gid = gid;
    p->rank = snap->rank;
    p->nranks = snap->nranks;
    p->ngpus = snap->ngpus < 0 ? 0 : SHOAL_MIN(snap->ngpus, SHOAL_METER_NGPUS_MAX);
    p->comm_id = snap->comm_id;
    /* The job says when the communicator was made; it cannot be before the process started
     * nor after it registered. */
    p->created_ns = snap->created_unix_ns;
    if (p->created_ns < start)
        p->created_ns = start;
    if (p->created_ns > now || p->created_ns == 0)
        p->created_ns = now;
    snprintf(p->key, sizeof(p->key), "%s:%d:%u:%d:%llu", a->host_key, (int)pid,
             (unsigned)snap->comm_id, (int)snap->rank,
             (unsigned long long)snap->created_unix_ns);
    p->billed[SHOALD_CUR_BILLED_NS] = p->created_ns;
    p->proc = shoald_proc_get(j, pid, start);
    if (p->proc != NULL) {
        p->proc->npages++;
        if (p->proc->nranks == 0 || p->nranks > p->proc->nranks) {
            p->proc->rank = p->rank; /* the world's rank, not a split communicator's */
            p->proc->nranks = p->nranks;
        }
    }
    shoald_page_read(p);
    shoald_page_supersede(a, j, p);
    shoald_page_cursor(a, p);
    p->tag_conn = (shoald_tag_t){.kind = SHOALD_TAG_PAGE_CONN, .obj = p};
    p->tag_pid = (shoald_tag_t){.kind = SHOALD_TAG_PAGE_PID, .obj = p};
    p->next = j->pages;
    j->pages = p;
    j->empty_since_ns = 0;
    a->npages++;
    shoald_gpus_sample(a, p);
    *page_p = p;
    return SHOAL_OK;
}

/* 1 when the page can never be registered again: its communicator was destroyed (the library
 * marks the page CLOSED before it closes the connection) or its process is gone. A connection
 * that closed while the page is LIVE is a registration the library gave up on (its deadline
 * passed); it registers the same page again later. */
static int shoald_page_final(const shoald_page_t *p)
{
    const shoal_meter_page_t *pg = (const shoal_meter_page_t *)p->map;
    struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};

    if (__atomic_load_n(&pg->state, __ATOMIC_ACQUIRE) == SHOAL_METER_CLOSED)
        return 1;
    if (p->pidfd < 0) {
        /* No pidfd (a kernel without them): the pid may run another process by now. */
        if (kill(p->pid, 0) != 0 && errno == ESRCH)
            return 1;
        return p->proc != NULL && p->proc->start_ns != 0 &&
               shoald_proc_start_ns(p->pid) != p->proc->start_ns;
    }
    return poll(&pf, 1, 0) > 0 && (pf.revents & POLLIN) != 0;
}

void shoald_page_end(shoald_t *a, shoald_page_t *p, const char *why)
{
    if (p->end_ns != 0 || p->superseded)
        return;
    shoald_page_read(p);
    p->final = shoald_page_final(p);
    p->end_ns = shoald_unix_ns();
    if (p->end_ns < p->created_ns)
        p->end_ns = p->created_ns;
    if (p->ctr[SHOALD_CTR_ABORTS] > 0)
        p->failed = 2;
    else if (p->ctr[SHOALD_CTR_PEER_FAILURES] > 0)
        p->failed = 1;
    if (p->failed != 0 && !p->failure_counted) {
        /* once per page: the same page registered again, ended again, is one failure */
        p->failure_counted = 1;
        if (p->failed == 2) {
            p->job->failed_tenant++;
            p->job->failures_tenant_total++;
        } else {
            p->job->failed_platform++;
            p->job->failures_platform_total++;
        }
    }
    shoald_close_later(a, p->conn_fd);
    if (p->pidfd >= 0)
        close(p->pidfd);
    p->conn_fd = -1;
    p->pidfd = -1;
    shoal_info(METER, "rank %d of %s/%s (pid %d) %s%s", (int)p->rank, p->job->tenant,
               p->job->job, (int)p->pid, why,
               p->failed == 2 ? ", aborted" : p->failed == 1 ? ", after peer failures" : "");
    shoald_qos_page_end(a, p);
}

double shoald_page_gpu_seconds(const shoald_page_t *p, uint64_t from_ns, uint64_t to_ns)
{
    uint64_t s = SHOAL_MAX(from_ns, p->created_ns);
    uint64_t e = p->end_ns != 0 ? SHOAL_MIN(to_ns, p->end_ns) : to_ns;

    if (e <= s)
        return 0.0;
    return (double)p->ngpus * (double)(e - s) / 1e9;
}

typedef struct {
    uint64_t s, e;
} shoald_span_t;

/* The GPUs page q counts: what it declares, or (seen) the most of that and what its process
 * was seen holding open over the minute being billed. */
static int32_t shoald_page_gpus(const shoald_page_t *q, int seen)
{
    if (!seen || q->proc == NULL)
        return q->ngpus;
    return SHOAL_MAX(q->ngpus, q->proc->gpus_seen);
}

/* GPU-seconds of the pages of process pr in job j over their spans (span()), but skip: the
 * union of the spans times the most GPUs one of those pages declares. */
static double shoald_proc_union(const shoald_job_t *j, const shoald_proc_t *pr,
                                const shoald_page_t *skip, shoald_span_fn span, void *arg,
                                int seen)
{
    shoald_span_t buf[16], *v = buf, *more, t;
    const shoald_page_t *q;
    size_t n = 0, cap = SHOAL_ARRAY_SIZE(buf), i, k;
    uint64_t s, e, len = 0, end = 0;
    int32_t gpus = 0;
    double sum = 0.0;
    int oom = 0;

    for (q = j->pages; q != NULL; q = q->next) {
        if (q == skip || q->proc != pr || !span(q, arg, &s, &e))
            continue;
        sum += (double)shoald_page_gpus(q, seen) * (double)(e - s) / 1e9;
        gpus = SHOAL_MAX(gpus, shoald_page_gpus(q, seen));
        if (oom)
            continue;
        if (n == cap) {
            more = realloc(v == buf ? NULL : v, 2 * cap * sizeof(*v));
            if (more == NULL) {
                oom = 1;
                continue;
            }
            if (v == buf)
                memcpy(more, buf, sizeof(buf));
            v = more;
            cap *= 2;
        }
        v[n++] = (shoald_span_t){s, e};
    }
    if (oom) {
        if (v != buf)
            free(v);
        return sum; /* out of memory: each page counted (the old overcount, nothing lost) */
    }
    for (i = 1; i < n; i++) { /* by start (a process has a few communicators) */
        t = v[i];
        for (k = i; k > 0 && v[k - 1].s > t.s; k--)
            v[k] = v[k - 1];
        v[k] = t;
    }
    for (i = 0; i < n; i++) {
        s = SHOAL_MAX(v[i].s, end);
        if (v[i].e > s)
            len += v[i].e - s;
        end = SHOAL_MAX(end, v[i].e);
    }
    if (v != buf)
        free(v);
    return (double)gpus * (double)len / 1e9;
}

static double shoald_proc_gpu_seconds_of(const shoald_page_t *p, shoald_span_fn span,
                                         void *arg, int seen)
{
    const shoald_page_t *q;
    uint64_t s, e;

    if (!span(p, arg, &s, &e))
        return 0.0;
    if (p->proc == NULL)
        return (double)p->ngpus * (double)(e - s) / 1e9;
    for (q = p->job->pages; q != p; q = q->next) {
        if (q->proc == p->proc && span(q, arg, &s, &e))
            return 0.0; /* counted at q, the process's first page with a span */
    }
    return shoald_proc_union(p->job, p->proc, NULL, span, arg, seen);
}

double shoald_proc_gpu_seconds(const shoald_page_t *p, shoald_span_fn span, void *arg)
{
    return shoald_proc_gpu_seconds_of(p, span, arg, 0);
}

double shoald_proc_billed_gpu_seconds(const shoald_page_t *p, shoald_span_fn span, void *arg)
{
    return shoald_proc_gpu_seconds_of(p, span, arg, 1);
}

int shoald_proc_gpus_open(pid_t pid, const char *prefix)
{
    char dir[64], target[PATH_MAX];
    uint64_t bits[4] = {0}; /* device numbers 0..255 (the driver's minors) */
    size_t plen = strlen(prefix);
    unsigned long num;
    struct dirent *d;
    ssize_t len;
    int nfds = 0, count = 0;
    char *end;
    DIR *dp;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    dp = opendir(dir);
    if (dp == NULL)
        return -1;
    while (nfds < SHOALD_GPU_SCAN_FDS && (d = readdir(dp)) != NULL) {
        if (d->d_name[0] == '.')
            continue;
        nfds++;
        len = readlinkat(dirfd(dp), d->d_name, target, sizeof(target) - 1);
        if (len <= (ssize_t)plen)
            continue; /* closed meanwhile, or too short to be PREFIX<N> */
        target[len] = '\0';
        if (strncmp(target, prefix, plen) != 0 || target[plen] < '0' || target[plen] > '9')
            continue;
        errno = 0;
        num = strtoul(target + plen, &end, 10);
        if (*end != '\0' || errno != 0 || num >= 64 * SHOAL_ARRAY_SIZE(bits))
            continue; /* nvidiactl, nvidia-uvm, nvidia0-foo, or out of range */
        if ((bits[num / 64] & (1ull << (num % 64))) == 0) {
            bits[num / 64] |= 1ull << (num % 64);
            count++;
        }
    }
    closedir(dp);
    return count;
}

/* Samples the process of page p (once per round). */
static void shoald_gpus_sample_page(shoald_t *a, shoald_page_t *p, uint64_t round)
{
    shoald_proc_t *pr = p->proc;
    const shoald_page_t *q;
    int32_t declared = 0;
    int n;

    if (pr == NULL || pr->gpus_round == round || p->end_ns != 0 || p->superseded)
        return;
    pr->gpus_round = round;
    /* the pid may be another process's by now: only while it is the one that registered */
    if (pr->start_ns != 0 && shoald_proc_start_ns(pr->pid) != pr->start_ns)
        return;
    n = shoald_proc_gpus_open(pr->pid, a->cfg->gpu_device_prefix);
    if (n < 0)
        return; /* gone or not readable: what it declared (and was seen with) stands */
    pr->gpus_last = n;
    pr->gpus_seen = SHOAL_MAX(pr->gpus_seen, n);
    for (q = p->job->pages; q != NULL; q = q->next) {
        if (q->proc == pr)
            declared = SHOAL_MAX(declared, q->ngpus);
    }
    if (n > declared && !p->job->gpus_warned) {
        p->job->gpus_warned = 1;
        shoal_warn(METER, "%s/%s: rank %d (pid %d) holds %d GPU device files (%s<N>) open but "
                   "declares %d GPUs: billed for %d", p->job->tenant, p->job->job,
                   (int)p->rank, (int)pr->pid, n, a->cfg->gpu_device_prefix, (int)declared, n);
    }
}

void shoald_gpus_sample(shoald_t *a, shoald_page_t *page)
{
    uint64_t round;
    shoald_job_t *j;
    shoald_page_t *p;

    if (a->cfg->gpu_device_prefix == NULL || a->cfg->gpu_device_prefix[0] != '/')
        return; /* none */
    round = ++a->gpus_round;
    if (page != NULL) {
        shoald_gpus_sample_page(a, page, round);
        return;
    }
    for (j = a->jobs; j != NULL; j = j->next) {
        for (p = j->pages; p != NULL; p = p->next)
            shoald_gpus_sample_page(a, p, round);
    }
}

static int shoald_gpus_period_ms(const shoald_t *a)
{
    return SHOAL_MAX(a->cfg->minute_seconds, 1) * 1000 / 6;
}

void shoald_gpus_tick(shoald_t *a)
{
    if (shoald_gpus_wait_ms(a) != 0)
        return;
    shoald_gpus_sample(a, NULL);
    a->gpus_next_ns = shoal_deadline_ns(shoald_gpus_period_ms(a));
}

int shoald_gpus_wait_ms(shoald_t *a)
{
    if (a->cfg->gpu_device_prefix == NULL || a->cfg->gpu_device_prefix[0] != '/')
        return -1;
    if (a->gpus_next_ns == 0 || shoal_deadline_passed(a->gpus_next_ns))
        return 0;
    return shoal_deadline_left_ms(a->gpus_next_ns, shoald_gpus_period_ms(a)) + 1;
}

void shoald_gpus_minute_done(shoald_t *a)
{
    shoald_job_t *j;
    shoald_proc_t *pr;

    for (j = a->jobs; j != NULL; j = j->next) {
        for (pr = j->procs; pr != NULL; pr = pr->next)
            pr->gpus_seen = pr->gpus_last;
    }
}

/* A page's life up to now (arg: unix ns), not superseded (its successor counts it). */
static int shoald_page_life_span(const shoald_page_t *q, void *arg, uint64_t *s, uint64_t *e)
{
    uint64_t now = *(const uint64_t *)arg;

    *s = q->created_ns;
    *e = q->end_ns != 0 ? SHOAL_MIN(q->end_ns, now) : now;
    return !q->superseded && *e > *s;
}

double shoald_page_life_gpu_seconds(const shoald_page_t *p, uint64_t now_ns)
{
    return shoald_proc_gpu_seconds(p, shoald_page_life_span, &now_ns);
}

static int shoald_page_billed(const shoald_t *a, const shoald_page_t *p)
{
    int i;

    if (a->cfg->ledger_url == NULL)
        return 1; /* no ledger: nothing to wait for */
    if (p->billed[SHOALD_CUR_BILLED_NS] < p->end_ns)
        return 0;
    for (i = 0; i < SHOALD_NCTR; i++) {
        if (p->billed[i] != p->ctr[i])
            return 0;
    }
    return 1;
}

/* A job kept only for its series (no page, nothing left to bill: what job_retention keeps)
 * costs a few KiB a scrape. A job's name is the client's own when it has no credential
 * (allow_uncredentialed), so a uid that registered and ended pages under new names kept
 * max_pages_per_uid more jobs each minute for job_retention: some 60000 an hour, a /metrics
 * of 250 MB. A tenant keeps at most SHOALD_EMPTY_JOBS_PER_TENANT of them: beyond, the one gone
 * longest goes (the one made first among those gone as long). Dropped by the order of the
 * list (the newest made first), a long job that had just ended among a tenant's short ones
 * lost its series at once, while jobs gone for an hour stayed. */
#define SHOALD_EMPTY_JOBS_PER_TENANT 256

static int shoald_job_empty(const shoald_job_t *j)
{
    return j->pages == NULL && j->failed_platform == 0 && j->failed_tenant == 0;
}

/* Drops tenant's empty job gone longest (ties: the last in the list, made first). */
static void shoald_jobs_drop_oldest(shoald_t *a, const char *tenant)
{
    shoald_job_t **jp, **oldest = NULL, *j;

    for (jp = &a->jobs; (j = *jp) != NULL; jp = &j->next) {
        if (shoald_job_empty(j) && strcmp(j->tenant, tenant) == 0 &&
            (oldest == NULL || j->empty_since_ns <= (*oldest)->empty_since_ns))
            oldest = jp;
    }
    if (oldest == NULL)
        return;
    j = *oldest;
    *oldest = j->next;
    shoald_procs_free(j);
    free(j);
}

static void shoald_jobs_trim(shoald_t *a)
{
    struct {
        char tenant[SHOALD_NAME_MAX];
        unsigned n;
    } *seen = NULL;
    size_t nseen = 0, cap = 0, i;
    shoald_job_t *j;

    for (j = a->jobs; j != NULL; j = j->next) {
        if (!shoald_job_empty(j))
            continue;
        for (i = 0; i < nseen && strcmp(seen[i].tenant, j->tenant) != 0; i++)
            ;
        if (i == nseen) {
            if (nseen == cap) {
                void *more = realloc(seen, (cap = cap * 2 + 8) * sizeof(*seen));

                if (more == NULL)
                    break; /* out of memory: trimmed at the next collect */
                seen = more;
            }
            snprintf(seen[nseen].tenant, sizeof(seen[nseen].tenant), "%s", j->tenant);
            seen[nseen++].n = 0;
        }
        seen[i].n++;
    }
    for (i = 0; i < nseen; i++) {
        for (; seen[i].n > SHOALD_EMPTY_JOBS_PER_TENANT; seen[i].n--)
            shoald_jobs_drop_oldest(a, seen[i].tenant);
    }
    free(seen);
}

/* A page whose connection closed while its process lives (not final) registers again, with
 * its counters from zero of the communicator: it stays in its job (billed to its end, its
 * counters in the job's totals) until it does, superseded then, or until its process is gone
 * (the pid runs no process, or one started at another time). Collected before, its counters
 * went into the job's gone totals and came again with the new registration: /metrics
 * counted them twice. */
static int shoald_page_may_return(const shoald_page_t *p)
{
    uint64_t start;

    if (p->final)
        return 0;
    if (kill(p->pid, 0) != 0 && errno == ESRCH)
        return 0;
    start = shoald_proc_start_ns(p->pid);
    return start != 0 && (p->proc == NULL || p->proc->start_ns == 0 ||
                          p->proc->start_ns == start);
}

void shoald_pages_collect(shoald_t *a)
{
    uint64_t now = shoal_time_ns(), unow = shoald_unix_ns();
    shoald_job_t **jp, *j;
    shoald_page_t **pp, *p;
    int i;

    for (jp = &a->jobs; (j = *jp) != NULL;) {
        for (pp = &j->pages; (p = *pp) != NULL;) {
            if (!p->superseded && (p->end_ns == 0 || !shoald_page_billed(a, p) ||
                                   shoald_page_may_return(p))) {
                pp = &p->next;
                continue;
            }
            for (i = 0; i < SHOALD_NCTR && !p->superseded; i++) {
                j->gone[i] += p->ctr[i];
                if (p->proc != NULL)
                    p->proc->gone[i] += p->ctr[i];
            }
            if (!p->superseded && p->proc == NULL) {
                j->gone_gpu_s += shoald_page_gpu_seconds(p, 0, p->end_ns);
            } else if (!p->superseded) {
                /* what only p covers of its process's time: the rest stays counted by the
                 * process's pages that remain (shoald_page_life_gpu_seconds), so the sum
                 * neither drops nor counts the process's GPUs twice */
                j->gone_gpu_s += shoald_proc_union(j, p->proc, NULL, shoald_page_life_span,
                                                   &unow, 0) -
                                 shoald_proc_union(j, p->proc, p, shoald_page_life_span,
                                                   &unow, 0);
            }
            *pp = p->next;
            if (p->proc != NULL)
                p->proc->npages--;
            munmap((void *)p->map, SHOAL_METER_PAGE_BYTES);
            free(p);
            a->npages--;
        }
        shoald_procs_drop_gone(j);
        if (j->pages == NULL && j->empty_since_ns == 0)
            j->empty_since_ns = now;
        if (j->pages == NULL && j->failed_platform == 0 && j->failed_tenant == 0 &&
            now - j->empty_since_ns >= (uint64_t)a->cfg->job_retention_s * 1000000ull) {
            *jp = j->next;
            shoald_procs_free(j);
            free(j);
            continue;
        }
        jp = &j->next;
    }
    shoald_jobs_trim(a);
}

/* ---- abuse signals ------------------------------------------------------------------ */

static shoald_abuse_t *shoald_abuse_get(shoald_t *a, int is_uid, const char *tenant, uid_t uid)
{
    shoald_abuse_t *b;

    for (b = a->abuse; b != NULL; b = b->next) {
        if (b->is_uid == is_uid && (is_uid ? b->uid == uid : strcmp(b->tenant, tenant) == 0))
            return b;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->is_uid = is_uid;
    b->uid = uid;
    snprintf(b->tenant, sizeof(b->tenant), "%s", is_uid ? "" : tenant);
    b->next = a->abuse;
    a->abuse = b;
    return b;
}

/* The window of the rule opens at a refusal and lasts one minute (minute_seconds). */
static void shoald_abuse_count(shoald_t *a, shoald_abuse_t *b, int auth_failure)
{
    uint64_t now = shoal_time_ns();

    uint64_t len = (uint64_t)a->cfg->minute_seconds * 1000000000ull;

    if (b->window_ns == 0 || now - b->window_ns >= len) {
        b->window_ns = now;
        b->this_minute = 0;
        b->flagged = 0;
    }
    b->refused++;
    b->this_minute++;
    if (auth_failure)
        b->auth_failed++;
    if (a->cfg->abuse_max_refused > 0 && b->this_minute > a->cfg->abuse_max_refused &&
        !b->flagged) {
        b->flagged = 1;
        b->flags++;
        if (b->is_uid)
            shoal_warn(METER, "abuse: uid %u flagged: %u refused registrations within this "
                       "minute (limit %u)", (unsigned)b->uid, b->this_minute,
                       a->cfg->abuse_max_refused);
        else
            shoal_warn(METER, "abuse: tenant %s flagged: %u refused registrations claiming it "
                       "within this minute (limit %u)", b->tenant, b->this_minute,
                       a->cfg->abuse_max_refused);
    }
}

/* Claimed tenants become labels: only configured names, others as "_unknown", so a stranger
 * cannot grow the agent's series by inventing names. */
void shoald_abuse_note(shoald_t *a, const char *claimed, uid_t uid, int auth_failure)
{
    const char *t = "_unknown";
    shoald_abuse_t *b;

    if (claimed != NULL && shoald_config_tenant(a->cfg, claimed) != NULL)
        t = claimed;
    b = shoald_abuse_get(a, 0, t, 0);
    if (b != NULL)
        shoald_abuse_count(a, b, auth_failure);
    b = shoald_abuse_get(a, 1, NULL, uid);
    if (b != NULL)
        shoald_abuse_count(a, b, auth_failure);
}


/* At the agent's stop: every page unmapped, every descriptor closed, nothing billed. */
void shoald_pages_free(shoald_t *a)
{
    shoald_abuse_t *b;
    shoald_page_t *p;
    shoald_job_t *j;

    while ((j = a->jobs) != NULL) {
        while ((p = j->pages) != NULL) {
            j->pages = p->next;
            if (p->conn_fd >= 0)
                close(p->conn_fd);
            if (p->pidfd >= 0)
                close(p->pidfd);
            munmap((void *)p->map, SHOAL_METER_PAGE_BYTES);
            free(p);
        }
        a->jobs = j->next;
        shoald_procs_free(j);
        free(j);
    }
    while ((b = a->abuse) != NULL) {
        a->abuse = b->next;
        free(b);
    }
    a->npages = 0;
}
