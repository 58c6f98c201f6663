/*
 * Preemption of spot jobs for a reserved job that does not fit otherwise.
 *
 * Victims: running spot jobs. Never a cycle: after the preemption, every victim tenant's
 * weighted dominant share stays strictly above the preemptor's (its share with the new job),
 * so the victim can never be the lower-share tenant that preempts the preemptor back. A
 * tenant's own spot jobs may always yield to its reserved ones. A job that breaks the rule
 * even with all the preemptor's own spot jobs gone (the preemptor's lowest share) and no
 * other job of its tenant taken is never a candidate: taking more only lowers its share.
 * Where the preemptor runs no spot job (none started before this round: there is nothing a
 * victim could preempt back), a victim tenant may also end below it, as long as its share
 * before the preemption was above the preemptor's after: else a tenant whose one spot job
 * held most of the cluster (or all of it) could never be preempted, since it keeps nothing.
 *
 * Smallest set: every set of 1, 2, 3, then 4 candidates is tried while the sets of the next
 * size fit in the budget (SHOAL_SCHED_EXACT_BUDGET); the first size that works is proven
 * minimal, and among its sets the fewest GPUs preempted, then the cheapest placement, win.
 * Past the budget: the largest candidates are freed until the job fits, then each victim
 * whose return still leaves room is spared (greedy, not proven minimal).
 */
#include "sched/sched.h"

#include <stdlib.h>
#include <string.h>

#define SHOAL_SCHED_EXACT_SIZE 4
/* The exhaustive search tries at most this many node visits' worth of sets (one placement
 * looks at every node): 160 sets on 1,250 hosts (a few ms), 25,000 on 8 hosts. A set that
 * cannot free enough GPUs is skipped without a placement (but counted). */
#define SHOAL_SCHED_EXACT_BUDGET 200000.0

typedef struct {
    shoal_sched_cluster_t *c;
    shoal_sched_queue_t *q;
    int ji;
    double dj[SHOAL_SCHED_RES];
    const int *pool; /* the jobs that may be candidates (NULL: every job), npool of them */
    int npool;
    int no_back;     /* the preemptor runs no spot job that a victim could preempt back */
    char *above;     /* per job (candidates only): its tenant's share before the preemption is
                      * above the preemptor's after (with no_back, such a victim may end lower) */
} shoal_sched_pre_ctx_t;

/* The no-cycle rule for the current state (victims released, ji not yet applied). */
static int shoal_sched_preempt_fair(shoal_sched_pre_ctx_t *x, const int *set, int n)
{
    shoal_sched_queue_t *q = x->q;
    int p = q->jobs[x->ji].tenant;
    double use[SHOAL_SCHED_RES], sp;

    for (int r = 0; r < SHOAL_SCHED_RES; r++) {
        use[r] = q->tenants[p].use[r] + x->dj[r];
    }
    sp = shoal_sched_drf_share(use, x->c->total, q->tenants[p].weight);
    for (int i = 0; i < n; i++) {
        const shoal_sched_tenant_t *v = &q->tenants[q->jobs[set[i]].tenant];
        if (q->jobs[set[i]].tenant != p &&
            !(shoal_sched_drf_share(v->use, x->c->total, v->weight) > sp) &&
            !(x->no_back && x->above[set[i]])) {
            return 0;
        }
    }
    return 1;
}

/* Frees the set, tries to place ji, puts the set back. 1: fits and fair (*cost set). */
static int shoal_sched_preempt_try(shoal_sched_pre_ctx_t *x, const int *set, int n,
                                   double *cost)
{
    shoal_sched_place_info_t info;
    int ok;

    for (int i = 0; i < n; i++) {
        shoal_sched_job_release(x->c, x->q, &x->q->jobs[set[i]]);
    }
    ok = shoal_sched_preempt_fair(x, set, n) &&
         shoal_sched_place(x->c, &x->q->jobs[x->ji], &info) == 1;
    for (int i = 0; i < n; i++) {
        shoal_sched_job_apply(x->c, x->q, &x->q->jobs[set[i]]);
    }
    *cost = ok ? info.cost : 0;
    return ok;
}

/* Every set of size k from cand (index combination idx); keeps the best in out. */
static int shoal_sched_preempt_exact(shoal_sched_pre_ctx_t *x, const int *cand, int nc, int k,
                                     shoal_sched_preempt_t *out)
{
    int idx[SHOAL_SCHED_EXACT_SIZE], set[SHOAL_SCHED_EXACT_SIZE], found = 0, best_gpus = 0;
    double best_cost = 0;

    for (int i = 0; i < k; i++) {
        idx[i] = i;
    }
    while (k <= nc) {
        int gpus = 0;
        double cost;
        for (int i = 0; i < k; i++) {
            set[i] = cand[idx[i]];
            gpus += x->q->jobs[set[i]].ranks;
        }
        if (k == 1 && found && gpus > best_gpus) {
            break; /* candidates are sorted by GPUs: no single one ahead can be better */
        }
        if (x->c->free_gpus + gpus >= x->q->jobs[x->ji].ranks &&
            (!found || gpus <= best_gpus) && shoal_sched_preempt_try(x, set, k, &cost) &&
            (!found || gpus < best_gpus || cost < best_cost)) {
            found = 1;
            best_gpus = gpus;
            best_cost = cost;
            out->nvictims = k;
            memcpy(out->victims, set, sizeof(int) * (size_t)k);
        }
        /* next combination */
        int i = k - 1;
        while (i >= 0 && idx[i] == nc - k + i) {
            i--;
        }
        if (i < 0) {
            break;
        }
        idx[i]++;
        for (int m = i + 1; m < k; m++) {
            idx[m] = idx[m - 1] + 1;
        }
    }
    return found;
}

static int shoal_sched_gpus_asc(const void *pa, const void *pb, void *ctx)
{
    const shoal_sched_queue_t *q = ctx;
    int a = q->jobs[*(const int *)pa].ranks, b = q->jobs[*(const int *)pb].ranks;
    if (a != b) {
        return a < b ? -1 : 1;
    }
    return *(const int *)pa - *(const int *)pb;
}

static int shoal_sched_gpus_desc(const void *pa, const void *pb, void *ctx)
{
    const shoal_sched_queue_t *q = ctx;
    int a = q->jobs[*(const int *)pa].ranks, b = q->jobs[*(const int *)pb].ranks;
    if (a != b) {
        return a > b ? -1 : 1;
    }
    return *(const int *)pa - *(const int *)pb;
}

/* The no-cycle rule for a whole set (released for the check, then put back). */
static int shoal_sched_preempt_set_fair(shoal_sched_pre_ctx_t *x, const int *set, int n)
{
    int fair;
    for (int i = 0; i < n; i++) {
        shoal_sched_job_release(x->c, x->q, &x->q->jobs[set[i]]);
    }
    fair = shoal_sched_preempt_fair(x, set, n);
    for (int i = 0; i < n; i++) {
        shoal_sched_job_apply(x->c, x->q, &x->q->jobs[set[i]]);
    }
    return fair;
}

/* Largest first until it fits, then spare whoever can be spared (smallest first). */
static int shoal_sched_preempt_greedy(shoal_sched_pre_ctx_t *x, int *cand, int nc,
                                      shoal_sched_preempt_t *out)
{
    int n = 0, fits = 0;
    double cost;

    qsort_r(cand, (size_t)nc, sizeof(int), shoal_sched_gpus_desc, x->q);
    for (int i = 0; i < nc && !fits; i++) {
        out->victims[n++] = cand[i];
        if (!shoal_sched_preempt_set_fair(x, out->victims, n)) {
            n--; /* unfair together with the others: spared */
            continue;
        }
        fits = shoal_sched_preempt_try(x, out->victims, n, &cost);
    }
    if (!fits) {
        return 0;
    }
    for (int i = n - 1; i >= 0; i--) {
        int save = out->victims[i];
        out->victims[i] = out->victims[n - 1];
        if (n > 1 && shoal_sched_preempt_try(x, out->victims, n - 1, &cost)) {
            n--;
        } else {
            out->victims[i] = save;
        }
    }
    out->nvictims = n;
    return 1;
}

/* The candidates: running spot jobs (not started this round) whose tenant keeps a share above
 * the preemptor's even at its lowest (all the preemptor's own spot jobs gone); none at all
 * when even all of them together would not make room. */
static int shoal_sched_preempt_candidates(shoal_sched_pre_ctx_t *x, int *cand)
{
    shoal_sched_cluster_t *c = x->c;
    shoal_sched_queue_t *q = x->q;
    shoal_sched_job_t *job = &q->jobs[x->ji];
    shoal_sched_place_info_t pi;
    double pu[SHOAL_SCHED_RES] = {0}; /* the preemptor's use with the job (no own spot job) */
    int nc = 0, nown = 0, room;

    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < x->npool; k++) {
            int i = x->pool != NULL ? x->pool[k] : k;
            shoal_sched_job_t *v = &q->jobs[i];
            if (i == x->ji || v->state != SHOAL_SCHED_RUNNING || v->cls != SHOAL_SCHED_SPOT ||
                v->fresh || (v->tenant == job->tenant) != (pass == 0)) {
                continue;
            }
            if (pass == 0) {
                cand[nc++] = i;
                continue;
            }
            if (x->no_back) {
                /* its tenant's share before the preemption: nothing of it released yet */
                const shoal_sched_tenant_t *vt = &q->tenants[v->tenant];
                x->above[i] = shoal_sched_drf_share(vt->use, c->total, vt->weight) >
                              shoal_sched_drf_share(pu, c->total, q->tenants[job->tenant].weight);
            }
            shoal_sched_job_release(c, q, v);
            int fair = shoal_sched_preempt_fair(x, &i, 1);
            shoal_sched_job_apply(c, q, v);
            if (fair) {
                cand[nc++] = i;
            }
        }
        if (pass == 0) {
            nown = nc;
            for (int i = 0; i < nown; i++) {
                shoal_sched_job_release(c, q, &q->jobs[cand[i]]);
            }
            x->no_back = nown == 0;
            for (int r = 0; r < SHOAL_SCHED_RES; r++) {
                pu[r] = q->tenants[job->tenant].use[r] + x->dj[r];
            }
        }
    }
    for (int i = 0; i < nown; i++) {
        shoal_sched_job_apply(c, q, &q->jobs[cand[i]]);
    }
    for (int i = 0; i < nc; i++) {
        shoal_sched_job_release(c, q, &q->jobs[cand[i]]);
    }
    room = nc > 0 && shoal_sched_place(c, job, &pi) == 1;
    for (int i = 0; i < nc; i++) {
        shoal_sched_job_apply(c, q, &q->jobs[cand[i]]);
    }
    return room ? nc : 0;
}

/* Exhaustive by size while the budget lasts, then greedy. 1 found (in out), 0 none. */
static int shoal_sched_preempt_search(shoal_sched_pre_ctx_t *x, int *cand, int nc,
                                      shoal_sched_preempt_t *out)
{
    double budget = SHOAL_SCHED_EXACT_BUDGET / (x->c->nnodes > 0 ? x->c->nnodes : 1);
    int found = 0;

    qsort_r(cand, (size_t)nc, sizeof(int), shoal_sched_gpus_asc, x->q);
    for (int k = 1; nc > 0 && k <= SHOAL_SCHED_EXACT_SIZE && k <= nc && !found; k++) {
        double sets = 1;
        for (int i = 1; i <= k; i++) {
            sets = sets * (nc - k + i) / i;
        }
        if (sets > budget) {
            break;
        }
        budget -= sets;
        found = shoal_sched_preempt_exact(x, cand, nc, k, out);
        out->exact = found;
    }
    if (!found && nc > 0) {
        found = shoal_sched_preempt_greedy(x, cand, nc, out);
    }
    return found;
}

int shoal_sched_preempt(shoal_sched_cluster_t *c, shoal_sched_queue_t *q, int ji,
                        shoal_sched_preempt_t *out, shoal_sched_place_info_t *info)
{
    return shoal_sched_preempt_among(c, q, ji, NULL, q->njobs, out, info);
}

int shoal_sched_preempt_among(shoal_sched_cluster_t *c, shoal_sched_queue_t *q, int ji,
                              const int *pool, int npool, shoal_sched_preempt_t *out,
                              shoal_sched_place_info_t *info)
{
    shoal_sched_pre_ctx_t x = {.c = c, .q = q, .ji = ji, .pool = pool, .npool = npool};
    shoal_sched_job_t *job = &q->jobs[ji];
    int *cand = malloc(sizeof(int) * (size_t)(npool + 1));
    int found;

    memset(out, 0, sizeof(*out));
    /* room for every candidate: the greedy search may need them all */
    out->victims = malloc(sizeof(int) * (size_t)(npool + 1));
    /* by job index, written for the candidates only (no pass over the queue) */
    x.above = malloc((size_t)q->njobs + 1);
    if (cand == NULL || out->victims == NULL || x.above == NULL) {
        free(cand);
        free(x.above);
        shoal_sched_preempt_free(out);
        return SHOAL_ERR_NO_MEMORY;
    }
    shoal_sched_job_demand(job, x.dj);
    found = shoal_sched_preempt_search(&x, cand, shoal_sched_preempt_candidates(&x, cand), out);
    free(cand);
    free(x.above);
    if (!found) {
        shoal_sched_preempt_free(out);
        return 0;
    }
    /* the plan keeps it: as long as the set, not the queue */
    int *v = realloc(out->victims, sizeof(int) * (size_t)out->nvictims);
    out->victims = v != NULL ? v : out->victims;
    for (int i = 0; i < out->nvictims; i++) {
        shoal_sched_job_release(c, q, &q->jobs[out->victims[i]]);
    }
    if (shoal_sched_place(c, job, info) != 1) {
        for (int i = 0; i < out->nvictims; i++) {
            shoal_sched_job_apply(c, q, &q->jobs[out->victims[i]]);
        }
        return SHOAL_ERR_INTERNAL;
    }
    shoal_sched_job_apply(c, q, job);
    return 1;
}

void shoal_sched_preempt_free(shoal_sched_preempt_t *p)
{
    free(p->victims);
    memset(p, 0, sizeof(*p));
}
