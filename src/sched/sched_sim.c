/*
 * shoal-place simulate: a seeded job trace replayed against three placement policies that
 * share the same weighted-DRF queue order: shoal (topology-aware best fit, preemption of spot
 * jobs), first fit in node order, and a Slurm-like tree best fit.
 *
 * The cluster: `leaves` leaf switches of `hosts_per_leaf` hosts under one spine. The trace:
 * Poisson arrivals at the rate that offers `load` of the GPU-hours; GPU counts powers of two
 * (1..32, small ones likelier); durations Pareto (alpha 1.5, from 0.2 h, capped at 48 h);
 * several tenants of weights 1, 1, 2, 1, 2, ...; 30% spot. A preempted job resumes from its
 * checkpoint (its remaining work) when placed again.
 *
 * Measured: job completion time (submit to end), utilization (busy GPU-hours over GPU-hours
 * until the last arrival: the drain at the end says nothing of packing), fragmentation (time
 * average of the largest gang one leaf could take),
 * cross-switch traffic (ring edges through the spine x hours: each edge carries the same
 * bytes per hour of a job's ring), fairness (time average of Jain's index over the weighted
 * dominant shares of the backlogged tenants).
 */
#include "sched/sched.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static shoal_status_t shoal_sched_sim_cluster(const shoal_sched_sim_opts_t *o,
                                              shoal_sched_cluster_t *c)
{
    int spine;

    memset(c, 0, sizeof(*c));
    spine = shoal_sched_switch_add(c, "spine");
    if (spine < 0) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int l = 0; l < o->leaves; l++) {
        char name[SHOAL_SCHED_NAME_MAX];
        snprintf(name, sizeof(name), "leaf%02d", l);
        int s = shoal_sched_switch_add(c, name);
        if (s < 0) {
            return SHOAL_ERR_NO_MEMORY;
        }
        c->sw[s].parent = spine;
        int *k = realloc(c->sw[spine].kids, sizeof(int) * (size_t)(c->sw[spine].nkids + 1));
        if (k == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
        k[c->sw[spine].nkids++] = s;
        c->sw[spine].kids = k;
        for (int h = 0; h < o->hosts_per_leaf; h++) {
            snprintf(name, sizeof(name), "n%04d", l * o->hosts_per_leaf + h);
            SHOAL_CHECK(shoal_sched_node_add(c, name, 8 * o->gpus_per_host, 64L * 1024 *
                                             o->gpus_per_host, o->gpus_per_host));
            int n = c->nnodes - 1;
            int *nn = realloc(c->sw[s].nodes, sizeof(int) * (size_t)(c->sw[s].nnodes + 1));
            if (nn == NULL) {
                return SHOAL_ERR_NO_MEMORY;
            }
            nn[c->sw[s].nnodes++] = n;
            c->sw[s].nodes = nn;
            c->nodes[n].leaf = s;
        }
    }
    return shoal_sched_cluster_finish(c);
}

static shoal_status_t shoal_sched_sim_trace(const shoal_sched_sim_opts_t *o,
                                            const shoal_sched_cluster_t *c,
                                            shoal_sched_queue_t *q)
{
    static const int sizes[] = {1, 2, 4, 8, 16, 32};
    static const double prob[] = {0.25, 0.2, 0.2, 0.2, 0.1, 0.05};
    uint64_t s = o->seed;
    double t = 0, mean_gpuh = 0, rate;

    memset(q, 0, sizeof(*q));
    for (int i = 0; i < o->ntenants; i++) {
        char name[SHOAL_SCHED_NAME_MAX];
        snprintf(name, sizeof(name), "t%d", i);
        int ti = shoal_sched_tenant_get(q, name);
        if (ti < 0) {
            return SHOAL_ERR_NO_MEMORY;
        }
        q->tenants[ti].weight = i % 3 == 2 ? 2.0 : 1.0;
    }
    /* mean GPU-hours per job: E[size] x E[duration] (Pareto 1.5 from 0.2 h: 0.6 h, capped);
     * sizes as the jobs get them, at most one leaf: with the sizes asked for, leaves of fewer
     * than 32 GPUs were offered less than --load (1 leaf of 8 GPUs at 0.5 ran at 0.31) */
    for (int k = 0; k < 6; k++) {
        mean_gpuh += prob[k] * SHOAL_MIN(sizes[k], o->hosts_per_leaf * o->gpus_per_host);
    }
    mean_gpuh *= 0.6;
    rate = o->load * c->total[SHOAL_SCHED_GPU] / mean_gpuh; /* jobs per hour */
    for (int i = 0; i < o->njobs; i++) {
        shoal_sched_job_t *j = shoal_sched_job_new(q);
        double u = shoal_sched_rand01(&s), acc = 0;
        if (j == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
        snprintf(j->name, sizeof(j->name), "j%05d", i);
        j->ranks = sizes[5];
        for (int k = 0; k < 6; k++) {
            acc += prob[k];
            if (u < acc) {
                j->ranks = sizes[k];
                break;
            }
        }
        j->ranks = SHOAL_MIN(j->ranks, o->hosts_per_leaf * o->gpus_per_host);
        j->cpus = 4;
        j->mem_mb = 16 * 1024;
        j->tenant = (int)(shoal_sched_rand(&s) % (uint64_t)o->ntenants);
        j->cls = shoal_sched_rand01(&s) < 0.3 ? SHOAL_SCHED_SPOT : SHOAL_SCHED_RESERVED;
        t += -log(1.0 - shoal_sched_rand01(&s)) / rate;
        j->submit = t;
        j->duration = SHOAL_MIN(0.2 / pow(1.0 - shoal_sched_rand01(&s), 1.0 / 1.5), 48.0);
        j->state = -1; /* not yet submitted */
    }
    return SHOAL_OK;
}

/* Ring edges through the spine (level >= 2) of a running job, ranks in their order. */
static int shoal_sched_sim_cross(const shoal_sched_cluster_t *c, const shoal_sched_job_t *j)
{
    int hosts[256], nh = 0, cross = 0;
    for (int r = 0; r < j->ranks && nh < 256; r++) {
        if (r == 0 || j->node_of[r] != j->node_of[r - 1]) {
            hosts[nh++] = j->node_of[r];
        }
    }
    for (int i = 0; nh > 1 && i < nh; i++) {
        cross += shoal_sched_lca_level(c, hosts[i], hosts[(i + 1) % nh]) >= 2;
    }
    return cross;
}

static double shoal_sched_sim_jain(const shoal_sched_cluster_t *c, const shoal_sched_queue_t *q,
                                   const char *backlogged)
{
    double sum = 0, sq = 0;
    int n = 0;
    for (int t = 0; t < q->ntenants; t++) {
        if (backlogged[t]) {
            double x = shoal_sched_drf_share(q->tenants[t].use, c->total, q->tenants[t].weight);
            sum += x;
            sq += x * x;
            n++;
        }
    }
    return n < 2 || sq == 0 ? 1.0 : sum * sum / (n * sq);
}

/* A job of the trace that ran to its end (besides SHOAL_SCHED_QUEUED and _RUNNING, and -1
 * before it is submitted): the planner passes over it. */
#define SHOAL_SCHED_SIM_DONE 2

typedef struct {
    double busy, cross, frag, fair, fair_time, last;
    double busy_until; /* busy GPU-hours are counted until the last arrival */
} shoal_sched_sim_acc_t;

/* Accumulates the state between last and now. */
static void shoal_sched_sim_account(shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                                    shoal_sched_sim_acc_t *a, double now, char *backlogged,
                                    FILE *series, int policy)
{
    double dt = now - a->last;
    int busy = 0, cross = 0, anyq = 0, gang;

    memset(backlogged, 0, (size_t)q->ntenants);
    for (int i = 0; i < q->njobs; i++) {
        const shoal_sched_job_t *j = &q->jobs[i];
        if (j->state == SHOAL_SCHED_RUNNING) {
            busy += j->ranks;
            cross += shoal_sched_sim_cross(c, j);
        } else if (j->state == SHOAL_SCHED_QUEUED) {
            backlogged[j->tenant] = 1;
            anyq = 1;
        }
    }
    gang = shoal_sched_largest_gang(c);
    if (dt > 0) {
        a->busy += busy * SHOAL_MAX(0.0, SHOAL_MIN(now, a->busy_until) - a->last);
        a->cross += cross * dt;
        a->frag += gang * dt;
        if (anyq) {
            a->fair += shoal_sched_sim_jain(c, q, backlogged) * dt;
            a->fair_time += dt;
        }
    }
    if (series != NULL) {
        fprintf(series, "%d %.4f %.4f %d %d\n", policy, now, busy / c->total[SHOAL_SCHED_GPU],
                gang, cross);
    }
    a->last = now;
}

static int shoal_sched_dbl_cmp(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

/* One planning round at time now: starts and preemptions. */
static shoal_status_t shoal_sched_sim_round(shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                                            const shoal_sched_opts_t *po, double now,
                                            double *end, shoal_sched_sim_result_t *res)
{
    shoal_sched_plan_t plan = {0};
    shoal_status_t st = shoal_sched_plan_round(c, q, po, &plan);

    for (int i = 0; i < plan.n && st == SHOAL_OK; i++) {
        shoal_sched_decision_t *d = &plan.d[i];
        shoal_sched_job_t *j = &q->jobs[d->job];
        if (d->preempted_by >= 0) {
            j->done_work += now - j->start; /* resumes from its checkpoint */
            res->preemptions++;
        } else if (d->placed) {
            j->start = now;
            end[d->job] = now + (j->duration - j->done_work);
        }
    }
    shoal_sched_plan_free(&plan);
    return st;
}

static void shoal_sched_sim_results(const shoal_sched_cluster_t *c,
                                    const shoal_sched_sim_acc_t *acc, double *jct, int done,
                                    double now, shoal_sched_sim_result_t *res)
{
    qsort(jct, (size_t)done, sizeof(double), shoal_sched_dbl_cmp);
    for (int i = 0; i < done; i++) {
        res->mean_jct += jct[i] / done;
    }
    res->p95_jct = done > 0 ? jct[(int)(0.95 * (done - 1))] : 0;
    res->makespan = now;
    res->utilization = acc->busy_until > 0
                           ? acc->busy / (c->total[SHOAL_SCHED_GPU] * acc->busy_until) : 0;
    res->mean_largest_gang = now > 0 ? acc->frag / now : 0;
    res->cross_traffic = acc->cross;
    res->fairness = acc->fair_time > 0 ? acc->fair / acc->fair_time : 1.0;
}

/* Moves the done jobs of jobs[lo, next) before the others, which keep their order (the
 * planner breaks ties by position), with their end times. Returns the new lo: the first job
 * not done. The done jobs stay in the array, for shoal_sched_queue_free. */
static int shoal_sched_sim_compact(shoal_sched_job_t *jobs, double *end, int lo, int next,
                                   shoal_sched_job_t *tmp_job, double *tmp_end)
{
    int d = lo, n = 0;
    for (int i = lo; i < next; i++) {
        if (jobs[i].state == SHOAL_SCHED_SIM_DONE) {
            jobs[d] = jobs[i]; /* d <= i: nothing not yet read is overwritten */
            end[d++] = end[i];
        } else {
            tmp_job[n] = jobs[i];
            tmp_end[n++] = end[i];
        }
    }
    memcpy(jobs + d, tmp_job, (size_t)n * sizeof(*jobs));
    memcpy(end + d, tmp_end, (size_t)n * sizeof(*end));
    return d;
}

shoal_status_t shoal_sched_simulate(const shoal_sched_sim_opts_t *o, int policy,
                                    shoal_sched_sim_result_t *res, FILE *series)
{
    shoal_sched_cluster_t c;
    shoal_sched_queue_t q;
    shoal_sched_opts_t po = {.policy = policy,
                             .preempt = policy == SHOAL_SCHED_POLICY_SHOAL && !o->no_preempt};
    shoal_sched_sim_acc_t acc = {0};
    shoal_status_t st;
    double now = 0, *jct = NULL, *end = NULL, *tmp_end = NULL;
    shoal_sched_job_t *tmp_job = NULL;
    char *backlogged = NULL;
    int next = 0, done = 0, lo = 0, ndone = 0;

    memset(res, 0, sizeof(*res));
    st = shoal_sched_sim_cluster(o, &c);
    if (st == SHOAL_OK) {
        st = shoal_sched_sim_trace(o, &c, &q);
    }
    if (st != SHOAL_OK) {
        shoal_sched_cluster_free(&c);
        return st;
    }
    jct = calloc((size_t)q.njobs + 1, sizeof(double));
    end = calloc((size_t)q.njobs + 1, sizeof(double));
    backlogged = calloc((size_t)q.ntenants + 1, 1);
    tmp_job = malloc(((size_t)q.njobs + 1) * sizeof(*tmp_job));
    tmp_end = malloc(((size_t)q.njobs + 1) * sizeof(*tmp_end));
    if (jct == NULL || end == NULL || backlogged == NULL || tmp_job == NULL || tmp_end == NULL) {
        st = SHOAL_ERR_NO_MEMORY;
        goto out;
    }
    acc.busy_until = q.njobs > 0 ? q.jobs[q.njobs - 1].submit : 0;
    while (done < q.njobs && st == SHOAL_OK) {
        /* The planner and the accounting see the window of jobs that arrived and are not
         * done (q.jobs[lo, next), with the done ones not moved out yet): each event went
         * over every job of the trace, and 16,000 jobs took 10 s. */
        shoal_sched_queue_t v = q;
        v.jobs = q.jobs + lo;
        v.njobs = next - lo;
        /* the next event: an arrival or the earliest end */
        double t = next < q.njobs ? q.jobs[next].submit : INFINITY;
        for (int i = lo; i < next; i++) {
            if (q.jobs[i].state == SHOAL_SCHED_RUNNING) {
                t = SHOAL_MIN(t, end[i]);
            }
        }
        if (isinf(t)) {
            break; /* nothing runs, nothing arrives: what waits can never start */
        }
        shoal_sched_sim_account(&c, &v, &acc, t, backlogged, series, policy);
        now = t;
        for (int i = lo; i < next; i++) {
            if (q.jobs[i].state == SHOAL_SCHED_RUNNING && end[i] <= now) {
                shoal_sched_job_release(&c, &q, &q.jobs[i]);
                q.jobs[i].state = SHOAL_SCHED_SIM_DONE;
                jct[done++] = now - q.jobs[i].submit;
                ndone++;
            }
        }
        if (2 * ndone > next - lo) {
            lo = shoal_sched_sim_compact(q.jobs, end, lo, next, tmp_job, tmp_end);
            ndone = 0;
        }
        while (next < q.njobs && q.jobs[next].submit <= now) {
            q.jobs[next++].state = SHOAL_SCHED_QUEUED;
        }
        v.jobs = q.jobs + lo;
        v.njobs = next - lo;
        st = shoal_sched_sim_round(&c, &v, &po, now, end + lo, res);
    }
    shoal_sched_sim_results(&c, &acc, jct, done, now, res);
out:
    free(jct);
    free(end);
    free(tmp_job);
    free(tmp_end);
    free(backlogged);
    shoal_sched_queue_free(&q);
    shoal_sched_cluster_free(&c);
    return st;
}

static const char *const shoal_sched_policy_names[] = {"shoal", "first-fit", "slurm-tree"};

#define SHOAL_SCHED_SIM_PLOT_TIMEOUT_MS 60000

/* gnuplot on a script written into dir, run in dir by fork and exec, not by a shell: the
 * directory is the user's --out, and a quote in its name used to break the command line (no
 * plots) or run what followed the quote; and under a deadline, as every wait. */
static void shoal_sched_sim_plot(const char *dir)
{
    static const char script[] =
        "set terminal png size 1000,420; set key outside; set xlabel 'hours'\n"
        "set output 'utilization.png'; set ylabel 'GPUs busy (fraction)'\n"
        "plot for [p=0:2] 'series.dat' using ($1==p?$2:1/0):3 with lines "
        "title word('shoal first-fit slurm-tree', p+1)\n"
        "set output 'fragmentation.png'; set ylabel 'largest gang in one leaf (GPUs)'\n"
        "plot for [p=0:2] 'series.dat' using ($1==p?$2:1/0):4 with lines "
        "title word('shoal first-fit slurm-tree', p+1)\n"
        "set output 'cross_switch.png'; set ylabel 'ring edges through the spine'\n"
        "plot for [p=0:2] 'series.dat' using ($1==p?$2:1/0):5 with lines "
        "title word('shoal first-fit slurm-tree', p+1)\n";
    char *argv[] = {"gnuplot", "plots.gp", NULL};
    char path[4096], why[256];
    FILE *fp;
    int bad = 1;

    snprintf(path, sizeof(path), "%s/plots.gp", dir);
    fp = fopen(path, "w");
    if (fp != NULL) {
        bad = fputs(script, fp) == EOF;
        bad |= fclose(fp) != 0;
    }
    if (bad) {
        shoal_warn(SCHED, "cannot write %s: %s: no PNG plots", path, strerror(errno));
        unlink(path);
        return;
    }
    if (shoal_child_run(argv, dir, 1, SHOAL_SCHED_SIM_PLOT_TIMEOUT_MS, NULL, why,
                        sizeof(why)) != 0) {
        shoal_warn(SCHED, "%s: no PNG plots in %s", why, dir);
    }
    unlink(path);
}

shoal_status_t shoal_sched_simulate_all(const shoal_sched_sim_opts_t *o, FILE *out)
{
    shoal_sched_sim_result_t r[3];
    FILE *series = NULL;
    char path[4096];

    if (o->outdir != NULL) {
        snprintf(path, sizeof(path), "%s/series.dat", o->outdir);
        series = fopen(path, "w");
        if (series == NULL) {
            shoal_error(SCHED, "fopen(%s) failed: %s", path, strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
        fprintf(series, "# policy(0 shoal,1 first-fit,2 slurm-tree) hour busy_fraction "
                        "largest_leaf_gang spine_edges\n");
    }
    for (int p = 0; p < 3; p++) {
        shoal_status_t st = shoal_sched_simulate(o, p, &r[p], series);
        if (st != SHOAL_OK) {
            if (series != NULL) {
                fclose(series);
            }
            return st;
        }
    }
    fprintf(out, "# shoal-place simulate: seed %llu, %d jobs, %d tenants, %d leaves x %d hosts "
                 "x %d GPUs, load %.2f\n", (unsigned long long)o->seed, o->njobs, o->ntenants,
            o->leaves, o->hosts_per_leaf, o->gpus_per_host, o->load);
    fprintf(out, "%-11s %9s %9s %7s %9s %12s %8s %7s %9s\n", "policy", "jct_mean", "jct_p95",
            "util", "frag_gang", "spine_edge_h", "fairness", "preempt", "makespan");
    for (int p = 0; p < 3; p++) {
        fprintf(out, "%-11s %9.2f %9.2f %7.3f %9.1f %12.1f %8.3f %7d %9.1f\n",
                shoal_sched_policy_names[p], r[p].mean_jct, r[p].p95_jct, r[p].utilization,
                r[p].mean_largest_gang, r[p].cross_traffic, r[p].fairness, r[p].preemptions,
                r[p].makespan);
    }
    fprintf(out, "# cross-switch traffic vs first-fit: %.1f%% less; utilization %.3f vs %.3f\n",
            r[1].cross_traffic > 0 ? 100.0 * (1 - r[0].cross_traffic / r[1].cross_traffic) : 0,
            r[0].utilization, r[1].utilization);
    if (series != NULL) {
        /* a full disk cut the data short and the simulation still exited 0; and gnuplot
         * was left to plot what was there */
        int bad = ferror(series);
        int err = fclose(series) != 0 ? errno : 0; /* the failed write's, tried again */
        if (bad || err != 0) {
            shoal_error(SCHED, "writing %s failed: %s", path, strerror(err != 0 ? err : EIO));
            return SHOAL_ERR_SYSTEM;
        }
        shoal_sched_sim_plot(o->outdir);
    }
    return SHOAL_OK;
}
