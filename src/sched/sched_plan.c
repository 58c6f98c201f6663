/*
 * One planning round. Each tenant's queued jobs wait in line (reserved before spot, then in
 * the order given); weighted DRF picks the tenant served next; its first job is placed as a
 * gang, or, for a reserved job that does not fit, placed by preempting spot jobs; a job that
 * can do neither stays pending and its tenant waits for the next round. Every decision keeps
 * the sentence that --explain prints.
 */
#include "sched/sched.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    shoal_sched_cluster_t *c;
    shoal_sched_queue_t *q;
    const shoal_sched_opts_t *o;
    shoal_sched_plan_t *plan;
    int **line;   /* per tenant: its queued jobs in order */
    int *nline, *head;
    double (*use)[SHOAL_SCHED_RES];
    int *moved, nmoved; /* the victims' tenants of the last job started (DRF's moved rows) */
    int *spot, nspot;   /* the spot jobs running as the round began: preemption's candidates */
    int waiting;  /* tenants with queued jobs */
    shoal_status_t st;
} shoal_sched_round_t;

static shoal_sched_decision_t *shoal_sched_decision_new(shoal_sched_plan_t *p, int job)
{
    if (p->n == p->cap) {
        int cap = p->cap == 0 ? 32 : 2 * p->cap;
        shoal_sched_decision_t *d = realloc(p->d, sizeof(*d) * (size_t)cap);
        if (d == NULL) {
            return NULL;
        }
        p->d = d;
        p->cap = cap;
    }
    shoal_sched_decision_t *d = &p->d[p->n++];
    memset(d, 0, sizeof(*d));
    d->job = job;
    d->preempted_by = -1;
    return d;
}

void shoal_sched_plan_free(shoal_sched_plan_t *plan)
{
    for (int i = 0; i < plan->n; i++) {
        shoal_sched_preempt_free(&plan->d[i].pre);
    }
    free(plan->d);
    memset(plan, 0, sizeof(*plan));
}

static void shoal_sched_round_sync(shoal_sched_round_t *r, int t)
{
    memcpy(r->use[t], r->q->tenants[t].use, sizeof(r->use[t]));
}

static int shoal_sched_round_moved(void *vr, const int **rows_p)
{
    shoal_sched_round_t *r = vr;
    *rows_p = r->moved;
    return r->nmoved;
}

static int shoal_sched_round_next(void *vr, int t)
{
    shoal_sched_round_t *r = vr;
    return r->head[t] < r->nline[t];
}

static double shoal_sched_tenant_share(const shoal_sched_round_t *r, int t)
{
    return shoal_sched_drf_share(r->q->tenants[t].use, r->c->total, r->q->tenants[t].weight);
}

static int shoal_sched_round_place(shoal_sched_round_t *r, shoal_sched_job_t *j,
                                   shoal_sched_place_info_t *info)
{
    int rc;

    memset(info, 0, sizeof(*info));
    switch (r->o->policy) {
    case SHOAL_SCHED_POLICY_FIRST_FIT:
        rc = shoal_sched_place_first_fit(r->c, j);
        break;
    case SHOAL_SCHED_POLICY_SLURM:
        rc = shoal_sched_place_slurm_tree(r->c, j);
        break;
    default:
        return shoal_sched_place(r->c, j, info);
    }
    /* the baselines set the hosts only: the plan said "level=0 cost=0" and --explain "on 0
     * host(s)" of a job spread over a leaf or the spine */
    return rc == 1 ? shoal_sched_place_describe(r->c, j, info) : rc;
}

/* The victims of the preemption decided in r->plan->d[di]: one decision each. By index, not
 * by pointer: a victim's decision may move the plan's array (realloc), and the preemptor's
 * decision read through a pointer kept across it was freed memory (its victims, its share). */
static void shoal_sched_round_victims(shoal_sched_round_t *r, int ji, int di)
{
    for (int i = 0; i < r->plan->d[di].pre.nvictims; i++) {
        int vi = r->plan->d[di].pre.victims[i];
        shoal_sched_job_t *v = &r->q->jobs[vi];
        r->moved[r->nmoved++] = v->tenant;
        shoal_sched_decision_t *dv = shoal_sched_decision_new(r->plan, vi);
        if (dv == NULL) {
            r->st = SHOAL_ERR_NO_MEMORY;
            return;
        }
        const shoal_sched_decision_t *dj = &r->plan->d[di];
        const shoal_sched_tenant_t *vt = &r->q->tenants[v->tenant];
        dv->preempted_by = ji;
        dv->share_after = shoal_sched_tenant_share(r, v->tenant);
        if (v->tenant == r->q->jobs[ji].tenant) {
            /* no rule between a tenant and itself: its share is the preemptor's, and "keeps
             * 0.25, above 0.25" said what was not so */
            snprintf(dv->why, sizeof(dv->why),
                     "spot job preempted for reserved job %s of its own tenant %s (a tenant's "
                     "spot jobs yield to its reserved ones); SIG%s, then %d s to checkpoint",
                     r->q->jobs[ji].name, vt->name, v->signal, v->grace_s);
            continue;
        }
        if (!(dv->share_after > dj->share_after)) {
            /* below the preemptor now: it was above before, and the preemptor has no spot
             * job to lose back (sched_preempt.c) */
            double use[SHOAL_SCHED_RES], dem[SHOAL_SCHED_RES];
            memcpy(use, vt->use, sizeof(use));
            for (int k = 0; k < dj->pre.nvictims; k++) {
                const shoal_sched_job_t *o = &r->q->jobs[dj->pre.victims[k]];
                shoal_sched_job_demand(o, dem);
                for (int x = 0; x < SHOAL_SCHED_RES && o->tenant == v->tenant; x++) {
                    use[x] += dem[x];
                }
            }
            snprintf(dv->why, sizeof(dv->why),
                     "spot job preempted for reserved job %s of tenant %s: tenant %s had a "
                     "weighted share of %.4f, above %.4f, and keeps %.4f; tenant %s runs no spot "
                     "job for %s to preempt back (no cycle); SIG%s, then %d s to checkpoint",
                     r->q->jobs[ji].name, r->q->tenants[r->q->jobs[ji].tenant].name, vt->name,
                     shoal_sched_drf_share(use, r->c->total, vt->weight), dj->share_after,
                     dv->share_after, r->q->tenants[r->q->jobs[ji].tenant].name, vt->name,
                     v->signal, v->grace_s);
            continue;
        }
        snprintf(dv->why, sizeof(dv->why),
                 "spot job preempted for reserved job %s of tenant %s: tenant %s keeps a "
                 "weighted share of %.4f, above %.4f (no cycle); SIG%s, then %d s to checkpoint",
                 r->q->jobs[ji].name, r->q->tenants[r->q->jobs[ji].tenant].name, vt->name,
                 dv->share_after, dj->share_after, v->signal, v->grace_s);
    }
}

static int shoal_sched_round_try(void *vr, int t)
{
    shoal_sched_round_t *r = vr;
    int ji = r->line[t][r->head[t]];
    shoal_sched_job_t *j = &r->q->jobs[ji];
    shoal_sched_decision_t *d = shoal_sched_decision_new(r->plan, ji);
    int rc, preempt = j->cls == SHOAL_SCHED_RESERVED && r->o->preempt &&
                      r->o->policy == SHOAL_SCHED_POLICY_SHOAL;

    if (d == NULL) {
        r->st = SHOAL_ERR_NO_MEMORY;
        return 0;
    }
    d->share_before = shoal_sched_tenant_share(r, t);
    rc = shoal_sched_round_place(r, j, &d->info);
    if (rc == 1) {
        shoal_sched_job_apply(r->c, r->q, j);
    } else if (rc == 0 && preempt) {
        rc = r->o->scan_all ? shoal_sched_preempt(r->c, r->q, ji, &d->pre, &d->info)
                            : shoal_sched_preempt_among(r->c, r->q, ji, r->spot, r->nspot,
                                                        &d->pre, &d->info);
    }
    if (rc < 0) {
        r->st = (shoal_status_t)rc;
        return 0;
    }
    d->placed = rc == 1;
    j->fresh = rc == 1;
    d->share_after = shoal_sched_tenant_share(r, t);
    if (rc == 0) {
        /* the victims' search only where it ran: with preemption off, or under a baseline
         * policy, this said that no set of spot jobs kept to the no-cycle rule, where one
         * may well have (it was never looked for) */
        snprintf(d->why, sizeof(d->why),
                 "pending: no subtree has room for %d ranks of %d CPUs and %ld MB each%s; "
                 "tenant %s waits for the next round", j->ranks, j->cpus, j->mem_mb,
                 j->cls != SHOAL_SCHED_RESERVED ? ""
                 : preempt ? ", and no set of spot jobs makes room without a preemption cycle"
                 : r->o->policy == SHOAL_SCHED_POLICY_SHOAL
                     ? " (preemption is off: no spot job was looked at)"
                     : " (this policy never preempts: no spot job was looked at)",
                 r->q->tenants[t].name);
        return 0;
    }
    char past[160] = "";
    if (r->q->tenants[t].past > 0) {
        snprintf(past, sizeof(past), " plus %.4f for past usage (%.0f GPU-s decayed, over "
                 "weight %g)", r->q->tenants[t].past / r->q->tenants[t].weight,
                 r->q->tenants[t].past_gpu_s, r->q->tenants[t].weight);
    }
    /* free_under_top is the ranks of this job the subtree could take (its CPUs and memory
     * count), not its free GPUs, as this said: 8 free GPUs with room for 2 such ranks read
     * "2 GPUs free there" */
    snprintf(d->why, sizeof(d->why),
             "tenant %s had the lowest weighted dominant share (%.4f%s) of %d tenants waiting; "
             "%d ranks on %d host(s) under %s (switch level %d, ring cost %.0f), %s (room for "
             "%d ranks of this job there)%s", r->q->tenants[t].name, d->share_before, past,
             r->waiting, j->ranks, d->info.nhosts,
             d->info.level == 0 ? r->c->nodes[d->info.top].name : r->c->sw[d->info.top].name,
             d->info.level, d->info.cost,
             r->o->policy == SHOAL_SCHED_POLICY_FIRST_FIT ? "first fit in node order (baseline)"
             : r->o->policy == SHOAL_SCHED_POLICY_SLURM
                 ? "the lowest subtree with room, the one with least (baseline)"
                 : "the tightest such subtree",
             d->info.free_under_top,
             d->pre.nvictims > 0 ? "; after preempting spot jobs" : "");
    /* only the rows this job and its victims changed: a copy of every tenant's per job made
     * a round O(tenants x jobs) */
    r->nmoved = 0;
    shoal_sched_round_victims(r, ji, (int)(d - r->plan->d));
    r->head[t]++;
    shoal_sched_round_sync(r, t);
    for (int i = 0; i < r->nmoved; i++) {
        shoal_sched_round_sync(r, r->moved[i]);
    }
    return 1;
}

static int shoal_sched_seq_cmp(const void *pa, const void *pb, void *ctx)
{
    const shoal_sched_queue_t *q = ctx;
    const shoal_sched_job_t *a = &q->jobs[*(const int *)pa], *b = &q->jobs[*(const int *)pb];
    if (a->cls != b->cls) {
        return a->cls < b->cls ? -1 : 1;
    }
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

shoal_status_t shoal_sched_plan_round(shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                                      const shoal_sched_opts_t *o, shoal_sched_plan_t *plan)
{
    int nt = q->ntenants > 0 ? q->ntenants : 1;
    shoal_sched_round_t r = {.c = c, .q = q, .o = o, .plan = plan, .st = SHOAL_OK};
    double *weight = malloc(sizeof(double) * (size_t)nt);
    double *past = malloc(sizeof(double) * (size_t)nt);
    int *all = malloc(sizeof(int) * (size_t)(q->njobs + 1));

    r.line = calloc((size_t)nt, sizeof(int *));
    r.nline = calloc((size_t)nt, sizeof(int));
    r.head = calloc((size_t)nt, sizeof(int));
    r.use = calloc((size_t)nt, sizeof(*r.use));
    r.moved = malloc(sizeof(int) * (size_t)(q->njobs + 1));
    r.spot = malloc(sizeof(int) * (size_t)(q->njobs + 1));
    if (weight == NULL || past == NULL || all == NULL || r.line == NULL || r.nline == NULL || r.head == NULL ||
        r.use == NULL || r.moved == NULL || r.spot == NULL) {
        r.st = SHOAL_ERR_NO_MEMORY;
        goto out;
    }
    for (int i = 0; i < q->njobs; i++) {
        r.nline[q->jobs[i].tenant] += q->jobs[i].state == SHOAL_SCHED_QUEUED;
        q->jobs[i].fresh = 0;
        if (q->jobs[i].state == SHOAL_SCHED_RUNNING && q->jobs[i].cls == SHOAL_SCHED_SPOT) {
            r.spot[r.nspot++] = i;
        }
    }
    for (int t = 0, off = 0; t < q->ntenants; t++) {
        r.line[t] = all + off;
        off += r.nline[t];
        r.waiting += r.nline[t] > 0;
        r.nline[t] = 0;
        weight[t] = q->tenants[t].weight;
        past[t] = q->tenants[t].past;
    }
    for (int i = 0; i < q->njobs; i++) {
        int t = q->jobs[i].tenant;
        if (q->jobs[i].state == SHOAL_SCHED_QUEUED) {
            r.line[t][r.nline[t]++] = i;
        }
    }
    for (int t = 0; t < q->ntenants; t++) {
        qsort_r(r.line[t], (size_t)r.nline[t], sizeof(int), shoal_sched_seq_cmp, q);
    }
    for (int t = 0; t < q->ntenants; t++) {
        shoal_sched_round_sync(&r, t);
    }
    const shoal_sched_drf_cbs_t cb = {.next = shoal_sched_round_next,
                                      .try_start = shoal_sched_round_try,
                                      .moved = shoal_sched_round_moved, .scan = o->scan_all};
    if (shoal_sched_drf_fill_past(q->ntenants, r.use, weight, past, c->total, &cb, &r) < 0 &&
        r.st == SHOAL_OK) {
        r.st = SHOAL_ERR_NO_MEMORY;
    }
out:
    free(weight);
    free(past);
    free(all);
    free(r.line);
    free(r.nline);
    free(r.head);
    free(r.use);
    free(r.moved);
    free(r.spot);
    return r.st;
}
