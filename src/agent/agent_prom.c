/* shoald: the Prometheus text exposition (format 0.0.4) of /metrics. Conventions: prefix
 * shoal_, base units (bytes, seconds), _total on counters, # HELP and # TYPE for every family,
 * label values escaped (backslash, double quote, newline). Cardinality is bounded: labels are
 * tenant, shoal_job, collective, transport, locality, direction and the refusal reason; rank only
 * with export_ranks; claimed tenants that are not configured are folded into "_unknown".
 *
 * A job's counters are the sum of its live pages' current values and the final values of its
 * gone ranks, so they never go backwards while the agent runs. The tenant view (tenant != NULL)
 * carries that tenant's jobs only, and none of the agent's own series. */
#include "agent/agent.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const shoald_coll_names[SHOAL_METER_NCOLL] = {
    "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "barrier", "send",
    "recv", "alltoall"};
static const char *const shoald_tl_names[SHOALD_NTL] = {"shm", "tcp", "ucx", "ib", "cuda_ipc",
                                                         "nccl"};
static const char *const shoald_loc_names[SHOAL_METER_NLOC] = {"same_host", "other_host"};

static void shoald_text_reserve(shoald_text_t *t, size_t more)
{
    size_t cap;
    char *b;

    if (t->oom || t->len + more + 1 <= t->cap)
        return;
    cap = t->cap == 0 ? 16384 : t->cap;
    while (cap < t->len + more + 1)
        cap *= 2;
    b = realloc(t->buf, cap);
    if (b == NULL) {
        t->oom = 1;
        return;
    }
    t->buf = b;
    t->cap = cap;
}

void shoald_text_printf(shoald_text_t *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    shoald_text_reserve(t, (size_t)n);
    if (t->oom)
        return;
    va_start(ap, fmt);
    vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

void shoald_text_label(shoald_text_t *t, const char *s)
{
    shoald_text_reserve(t, 2 * strlen(s) + 2);
    if (t->oom)
        return;
    t->buf[t->len++] = '"';
    for (; *s != '\0'; s++) {
        if (*s == '\\' || *s == '"') {
            t->buf[t->len++] = '\\';
            t->buf[t->len++] = *s;
        } else if (*s == '\n') {
            t->buf[t->len++] = '\\';
            t->buf[t->len++] = 'n';
        } else {
            t->buf[t->len++] = *s;
        }
    }
    t->buf[t->len++] = '"';
    t->buf[t->len] = '\0';
}

static void shoald_prom_family(shoald_text_t *t, const char *name, const char *type,
                               const char *help)
{
    shoald_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{tenant="..",shoal_job=".."  (the caller adds more labels and "} value"). The job's
 * label is shoal_job, not job: job and instance are the labels Prometheus gives every target,
 * a scraped "job" would be renamed exported_job (or, with honor_labels, would replace the
 * scrape job's name). */
static void shoald_prom_job_labels(shoald_text_t *t, const char *name, const shoald_job_t *j)
{
    shoald_text_printf(t, "%s{tenant=", name);
    shoald_text_label(t, j->tenant);
    shoald_text_printf(t, ",shoal_job=");
    shoald_text_label(t, j->job);
}

typedef struct {
    uint64_t c[SHOALD_NCTR];
    uint64_t abuse[SHOALD_NABUSE];
    unsigned ranks, gpus;
    double gpu_s;
} shoald_job_sum_t;

/* The GPUs of live page p's process, at its first live page in the job (every communicator
 * of a process declares the process's GPUs), 0 at its others. */
static int32_t shoald_prom_proc_gpus(const shoald_job_t *j, const shoald_page_t *p)
{
    const shoald_page_t *q;
    int32_t gpus = p->ngpus;
    int seen_p = 0;

    if (p->proc == NULL)
        return gpus;
    for (q = j->pages; q != NULL; q = q->next) {
        if (q == p) {
            seen_p = 1;
            continue;
        }
        if (q->proc != p->proc || q->superseded || q->end_ns != 0)
            continue;
        if (!seen_p)
            return 0; /* counted at q, the process's first live page */
        gpus = SHOAL_MAX(gpus, q->ngpus);
    }
    return gpus;
}

static void shoald_prom_job_sum(const shoald_job_t *j, uint64_t now_ns, shoald_job_sum_t *s)
{
    const shoald_page_t *p;
    const shoald_proc_t *pr;
    int i;

    memset(s, 0, sizeof(*s));
    memcpy(s->c, j->gone, sizeof(s->c));
    memcpy(s->abuse, j->gone_abuse, sizeof(s->abuse));
    for (pr = j->procs; pr != NULL; pr = pr->next) {
        for (i = 0; i < SHOALD_NABUSE; i++)
            s->abuse[i] += pr->v[i];
    }
    s->gpu_s = j->gone_gpu_s;
    for (p = j->pages; p != NULL; p = p->next) {
        if (p->superseded)
            continue;
        for (i = 0; i < SHOALD_NCTR; i++)
            s->c[i] += p->ctr[i];
        s->gpu_s += shoald_page_life_gpu_seconds(p, now_ns);
        if (p->end_ns == 0) {
            s->ranks++;
            s->gpus += (unsigned)shoald_prom_proc_gpus(j, p);
        }
    }
}

static int shoald_prom_job_visible(const shoald_job_t *j, const char *tenant)
{
    return tenant == NULL || strcmp(j->tenant, tenant) == 0;
}

static void shoald_prom_jobs(shoald_t *a, const char *tenant, shoald_text_t *t)
{
    uint64_t now = shoald_unix_ns();
    shoald_job_sum_t *sums;
    shoald_job_t *j;
    size_t n = 0, k;
    int i, l, d;

    for (j = a->jobs; j != NULL; j = j->next)
        n++;
    sums = calloc(n + 1, sizeof(*sums));
    if (sums == NULL) {
        t->oom = 1;
        return;
    }
    for (j = a->jobs, k = 0; j != NULL; j = j->next, k++)
        shoald_prom_job_sum(j, now, &sums[k]);

#define SHOALD_FOR_JOBS                                                         \
    for (j = a->jobs, k = 0; j != NULL; j = j->next, k++)                       \
        if (shoald_prom_job_visible(j, tenant))

    shoald_prom_family(t, "shoal_ranks", "gauge", "Ranks (registered communicators) alive.");
    SHOALD_FOR_JOBS {
        shoald_prom_job_labels(t, "shoal_ranks", j);
        shoald_text_printf(t, "} %u\n", sums[k].ranks);
    }
    shoald_prom_family(t, "shoal_gpus_allocated", "gauge",
                       "GPUs declared by the ranks alive (a process's once, however many "
                       "communicators it registered).");
    SHOALD_FOR_JOBS {
        shoald_prom_job_labels(t, "shoal_gpus_allocated", j);
        shoald_text_printf(t, "} %u\n", sums[k].gpus);
    }
    shoald_prom_family(t, "shoal_allocated_gpu_seconds_total", "counter",
                       "GPUs times the seconds their ranks lived (a process's GPUs once).");
    SHOALD_FOR_JOBS {
        shoald_prom_job_labels(t, "shoal_allocated_gpu_seconds_total", j);
        shoald_text_printf(t, "} %.3f\n", sums[k].gpu_s);
    }
    shoald_prom_family(t, "shoal_collective_ops_total", "counter",
                       "Collective and point-to-point calls completed.");
    SHOALD_FOR_JOBS {
        for (i = 0; i < SHOAL_METER_NCOLL; i++) {
            shoald_prom_job_labels(t, "shoal_collective_ops_total", j);
            shoald_text_printf(t, ",collective=\"%s\"} %llu\n", shoald_coll_names[i],
                               (unsigned long long)sums[k].c[SHOALD_CTR_OPS + i]);
        }
    }
    shoald_prom_family(t, "shoal_payload_bytes_total", "counter",
                       "Payload bytes moved (no headers), per transport, locality, direction.");
    SHOALD_FOR_JOBS {
        for (d = 0; d < 2; d++) {
            for (i = 0; i < SHOALD_NTL; i++) {
                for (l = 0; l < SHOAL_METER_NLOC; l++) {
                    if (i >= SHOAL_METER_TL_CUDA_IPC && l != SHOAL_METER_SAME_HOST)
                        continue; /* cuda_ipc, nccl: one host by construction */
                    shoald_prom_job_labels(t, "shoal_payload_bytes_total", j);
                    shoald_text_printf(t, ",transport=\"%s\",locality=\"%s\",direction=\"%s\"} "
                                       "%llu\n", shoald_tl_names[i], shoald_loc_names[l],
                                       d == 0 ? "sent" : "received",
                                       (unsigned long long)sums[k].c[(d == 0 ? SHOALD_CTR_SENT :
                                       SHOALD_CTR_RECV) + i * SHOAL_METER_NLOC + l]);
                }
            }
        }
    }
    shoald_prom_family(t, "shoal_collective_seconds_total", "counter",
                       "Time spent inside collective calls.");
    SHOALD_FOR_JOBS {
        shoald_prom_job_labels(t, "shoal_collective_seconds_total", j);
        shoald_text_printf(t, "} %.9f\n", (double)sums[k].c[SHOALD_CTR_COLL_NS] / 1e9);
    }
    shoald_prom_family(t, "shoal_errors_total", "counter", "Calls that returned an error.");
    SHOALD_FOR_JOBS {
        shoald_prom_job_labels(t, "shoal_errors_total", j);
        shoald_text_printf(t, "} %llu\n", (unsigned long long)sums[k].c[SHOALD_CTR_ERRORS]);
    }
    shoald_prom_family(t, "shoal_peer_failures_total", "counter",
                       "Calls that failed because a peer, the transport or a timeout failed.");
    SHOALD_FOR_JOBS {
        shoald_prom_job_labels(t, "shoal_peer_failures_total", j);
        shoald_text_printf(t, "} %llu\n",
                           (unsigned long long)sums[k].c[SHOALD_CTR_PEER_FAILURES]);
    }
    shoald_prom_family(t, "shoal_aborts_total", "counter",
                       "Communicators the application aborted.");
    SHOALD_FOR_JOBS {
        shoald_prom_job_labels(t, "shoal_aborts_total", j);
        shoald_text_printf(t, "} %llu\n", (unsigned long long)sums[k].c[SHOALD_CTR_ABORTS]);
    }
    shoald_prom_family(t, "shoal_rank_failures_total", "counter",
                       "Ranks that ended failed, by cause (platform: peer lost or timeout; "
                       "tenant: its own abort).");
    SHOALD_FOR_JOBS {
        shoald_prom_job_labels(t, "shoal_rank_failures_total", j);
        shoald_text_printf(t, ",cause=\"platform\"} %llu\n",
                           (unsigned long long)j->failures_platform_total);
        shoald_prom_job_labels(t, "shoal_rank_failures_total", j);
        shoald_text_printf(t, ",cause=\"tenant\"} %llu\n",
                           (unsigned long long)j->failures_tenant_total);
    }
    {
        static const struct {
            const char *name, *help;
        } ab[SHOALD_NABUSE] = {
            [SHOALD_ABUSE_AUTH_FAILED] = {"shoal_join_auth_failures_total",
                "Failed authentications on the join listeners of the job's processes (the "
                "library's circuit breaker; per process, summed over processes)."},
            [SHOALD_ABUSE_AUTH_REFUSED] = {"shoal_join_refused_total",
                "Connections to the job's join listeners refused while a breaker was open."},
            [SHOALD_ABUSE_BREAKER_OPENED] = {"shoal_join_breakers_opened_total",
                "Times a circuit breaker of the job's processes opened against a source."},
        };

        for (i = 0; i < SHOALD_NABUSE; i++) {
            shoald_prom_family(t, ab[i].name, "counter", ab[i].help);
            SHOALD_FOR_JOBS {
                shoald_prom_job_labels(t, ab[i].name, j);
                shoald_text_printf(t, "} %llu\n", (unsigned long long)sums[k].abuse[i]);
            }
        }
    }
#undef SHOALD_FOR_JOBS
    free(sums);
}

/* The per-rank sums of one job: one entry per process with a live communicator, labelled
 * with its rank in the largest communicator it registered, summing every page of it (live,
 * ended, and dropped: shoald_proc_t.gone). Keyed by a page's own rank, a split communicator's
 * rank 0 (another process) was merged into the world's rank 0, and a communicator that ended
 * took its counts out of a live rank's sum, which Prometheus reads as a counter reset. A page
 * without a process entry (out of memory) counts under its own rank. Entries of one label
 * (a job of several communicators of one size) are summed, so no series repeats. v: ops,
 * bytes sent, bytes received, collective ns. n entries in *out (malloc'ed), -1 out of memory. */
typedef struct {
    int32_t rank;
    uint64_t v[4];
} shoald_rank_sum_t;

static void shoald_rank_add(shoald_rank_sum_t *e, const uint64_t *ctr)
{
    int i;

    for (i = 0; i < SHOAL_METER_NCOLL; i++)
        e->v[0] += ctr[SHOALD_CTR_OPS + i];
    for (i = 0; i < SHOALD_NTL * SHOAL_METER_NLOC; i++) {
        e->v[1] += ctr[SHOALD_CTR_SENT + i];
        e->v[2] += ctr[SHOALD_CTR_RECV + i];
    }
    e->v[3] += ctr[SHOALD_CTR_COLL_NS];
}

static int shoald_rank_sums(const shoald_job_t *j, shoald_rank_sum_t **out)
{
    const shoald_page_t *p, *q;
    const shoald_proc_t *pr;
    shoald_rank_sum_t *e = NULL, one;
    int n = 0, cap = 0, k;

    for (p = j->pages; p != NULL; p = p->next) {
        if (p->end_ns != 0 || p->superseded)
            continue;
        pr = p->proc;
        if (pr != NULL) {
            for (q = j->pages; q != p; q = q->next) /* its first live page stands for it */
                if (q->proc == pr && q->end_ns == 0 && !q->superseded)
                    break;
            if (q != p)
                continue;
        }
        memset(&one, 0, sizeof(one));
        one.rank = pr != NULL ? pr->rank : p->rank;
        if (pr != NULL) {
            shoald_rank_add(&one, pr->gone);
            for (q = j->pages; q != NULL; q = q->next)
                if (q->proc == pr && !q->superseded)
                    shoald_rank_add(&one, q->ctr);
        } else {
            shoald_rank_add(&one, p->ctr);
        }
        for (k = 0; k < n && e[k].rank != one.rank; k++)
            ;
        if (k == n) {
            if (n == cap) {
                shoald_rank_sum_t *ne;
                cap = cap != 0 ? 2 * cap : 8;
                ne = realloc(e, sizeof(*e) * (size_t)cap);
                if (ne == NULL) {
                    free(e);
                    return -1;
                }
                e = ne;
            }
            e[n++] = one;
        } else {
            for (int i = 0; i < 4; i++)
                e[k].v[i] += one.v[i];
        }
    }
    *out = e;
    return n;
}

/* Per-rank series (export_ranks=yes): shoald_rank_sums' entries. */
static void shoald_prom_ranks(shoald_t *a, const char *tenant, shoald_text_t *t)
{
    static const struct {
        const char *name, *help;
    } fam[] = {
        {"shoal_rank_collective_ops_total", "Calls completed by a live rank (a process, by its "
         "rank in its largest communicator), over all its communicators."},
        {"shoal_rank_payload_bytes_total", "Payload bytes moved by a live rank, over all its "
         "communicators."},
        {"shoal_rank_collective_seconds_total", "Time a live rank spent in collective calls, "
         "over all its communicators."},
    };
    shoald_rank_sum_t *e;
    shoald_job_t *j;
    size_t f;
    int d, k, n;

    for (f = 0; f < SHOAL_ARRAY_SIZE(fam); f++) {
        shoald_prom_family(t, fam[f].name, "counter", fam[f].help);
        for (j = a->jobs; j != NULL; j = j->next) {
            if (!shoald_prom_job_visible(j, tenant))
                continue;
            n = shoald_rank_sums(j, &e);
            if (n < 0) {
                shoal_warn(METER, "out of memory for the per-rank series of job %s", j->job);
                continue;
            }
            for (k = 0; k < n; k++) {
                for (d = 0; d < (f == 1 ? 2 : 1); d++) {
                    shoald_prom_job_labels(t, fam[f].name, j);
                    shoald_text_printf(t, ",rank=\"%d\"", (int)e[k].rank);
                    if (f == 1)
                        shoald_text_printf(t, ",direction=\"%s\"", d == 0 ? "sent" : "received");
                    if (f == 2)
                        shoald_text_printf(t, "} %.9f\n", (double)e[k].v[3] / 1e9);
                    else
                        shoald_text_printf(t, "} %llu\n",
                                           (unsigned long long)e[k].v[f == 0 ? 0 : 1 + d]);
                }
            }
            free(e);
        }
    }
}

static void shoald_prom_agent(shoald_t *a, shoald_text_t *t)
{
    const shoald_abuse_t *b;
    int r, k;
    static const struct {
        const char *name, *type, *help;
    } abuse[] = {
        {"shoal_tenant_refusals_total", "counter",
         "Refused registrations by the tenant they claimed (unconfigured names: _unknown)."},
        {"shoal_auth_failures_total", "counter",
         "Registrations whose credential failed to verify, by the tenant it claimed."},
        {"shoal_abuse_flags_total", "counter",
         "Minutes in which the tenant was flagged by the abuse rule (abuse_max_refused)."},
        {"shoal_uid_refusals_total", "counter", "Refused registrations by the uid (SO_PEERCRED)."},
        {"shoal_uid_auth_failures_total", "counter",
         "Registrations whose credential failed to verify, by the uid (SO_PEERCRED)."},
        {"shoal_uid_abuse_flags_total", "counter",
         "Minutes in which the uid was flagged by the abuse rule (abuse_max_refused)."},
    };

    shoald_prom_family(t, "shoal_agent_build_info", "gauge", "Version of the shoald agent.");
    shoald_text_printf(t, "shoal_agent_build_info{version=\"%s\"} 1\n", PACKAGE_VERSION);
    shoald_prom_family(t, "shoal_agent_pages", "gauge",
                       "Metering pages the agent holds (live ranks and gone ranks not yet "
                       "billed).");
    shoald_text_printf(t, "shoal_agent_pages %u\n", a->npages);
    shoald_prom_family(t, "shoal_registrations_total", "counter", "Registrations accepted.");
    shoald_text_printf(t, "shoal_registrations_total %llu\n", (unsigned long long)a->accepted);
    shoald_prom_family(t, "shoal_registrations_refused_total", "counter",
                       "Registrations refused, by reason.");
    for (r = 0; r < SHOALD_NREFUSALS; r++)
        shoald_text_printf(t, "shoal_registrations_refused_total{reason=\"%s\"} %llu\n",
                           shoald_refusal_name(r), (unsigned long long)a->refused[r]);
    for (k = 0; k < (int)SHOAL_ARRAY_SIZE(abuse); k++) {
        shoald_prom_family(t, abuse[k].name, abuse[k].type, abuse[k].help);
        for (b = a->abuse; b != NULL; b = b->next) {
            if (b->is_uid != (k >= 3))
                continue;
            if (b->is_uid) {
                shoald_text_printf(t, "%s{uid=\"%u\"}", abuse[k].name, (unsigned)b->uid);
            } else {
                shoald_text_printf(t, "%s{tenant=", abuse[k].name);
                shoald_text_label(t, b->tenant);
                shoald_text_printf(t, "}");
            }
            shoald_text_printf(t, " %llu\n", (unsigned long long)(k % 3 == 0 ? b->refused :
                               k % 3 == 1 ? b->auth_failed : b->flags));
        }
    }
    shoald_prom_family(t, "shoal_ledger_pending_batches", "gauge",
                       "Billing minutes (one batch each) waiting for the ledger (database down), "
                       "those an earlier agent spooled at its stop included.");
    shoald_text_printf(t, "shoal_ledger_pending_batches %u\n", a->npending + a->nspooled);
    shoald_prom_family(t, "shoal_ledger_commit_failures_total", "counter",
                       "Failed attempts to write minutes to the ledger.");
    shoald_text_printf(t, "shoal_ledger_commit_failures_total %llu\n",
                       (unsigned long long)a->ledger_failures);
    shoald_prom_family(t, "shoal_ledger_records_total", "counter",
                       "Ledger records written.");
    shoald_text_printf(t, "shoal_ledger_records_total %llu\n",
                       (unsigned long long)a->ledger_records);
    shoald_prom_family(t, "shoal_ledger_dropped_total", "counter",
                       "Malformed records and cursors dropped instead of written (an agent "
                       "defect; each is logged in full).");
    shoald_text_printf(t, "shoal_ledger_dropped_total %llu\n",
                       (unsigned long long)a->ledger_dropped);
}

void shoald_prom_render(shoald_t *a, const char *tenant, shoald_text_t *t)
{
    shoald_pages_read(a);
    shoald_prom_jobs(a, tenant, t);
    if (a->cfg->export_ranks)
        shoald_prom_ranks(a, tenant, t);
    shoald_qos_prom(a, tenant, t);
    if (tenant == NULL)
        shoald_prom_agent(a, t);
}
