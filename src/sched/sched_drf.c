/*
 * Weighted dominant-resource fairness (Ghodsi et al., NSDI 2011), progressive filling: the
 * tenant with the lowest dominant share divided by its weight starts its next task; GPUs, CPUs
 * and memory are the resources. A tenant whose next task cannot start now drops out of the
 * round (its place is not taken by its own later tasks: gangs are served in order). Past usage
 * (sched_usage.c), when given, is added to the dominant share before the division by the
 * weight: it changes who is served first, nothing else. The tenants wait in a heap on their
 * key, so a task costs O(log tenants) (a row that a try changes is keyed again).
 */
#include "sched/sched.h"

#include <stdlib.h>

double shoal_sched_drf_share(const double use[SHOAL_SCHED_RES],
                             const double total[SHOAL_SCHED_RES], double weight)
{
    double s = 0;
    for (int r = 0; r < SHOAL_SCHED_RES; r++) {
        double x = total[r] > 0 ? use[r] / total[r] : 0;
        s = x > s ? x : s;
    }
    return s / (weight > 0 ? weight : 1.0);
}

double shoal_sched_drf_key(const double use[SHOAL_SCHED_RES],
                           const double total[SHOAL_SCHED_RES], double weight, double past)
{
    return shoal_sched_drf_share(use, total, 1.0) / (weight > 0 ? weight : 1.0) +
           past / (weight > 0 ? weight : 1.0);
}

int shoal_sched_drf_fill(int ntenants, double (*use)[SHOAL_SCHED_RES], const double *weight,
                         const double total[SHOAL_SCHED_RES], shoal_sched_drf_next_cb_t next,
                         shoal_sched_drf_try_cb_t try_start, void *ctx)
{
    const shoal_sched_drf_cbs_t cb = {.next = next, .try_start = try_start};
    return shoal_sched_drf_fill_past(ntenants, use, weight, NULL, total, &cb, ctx);
}

/* The tenants still in the round, a binary min-heap on (key, tenant index): its top is the
 * tenant a scan for the lowest key keeping the first of equals picks. A scan of every tenant
 * per task made a round O(tenants^2): 20,000 tenants took seconds. */
typedef struct {
    int *heap;      /* tenant indices */
    int *pos;       /* per tenant: its index in heap, -1 once out of the round */
    double *key;    /* per tenant: its key, computed when its row changed */
    int n;
} shoal_sched_drf_heap_t;

static int shoal_sched_drf_before(const shoal_sched_drf_heap_t *h, int a, int b)
{
    return h->key[a] < h->key[b] || (h->key[a] == h->key[b] && a < b);
}

static void shoal_sched_drf_put(shoal_sched_drf_heap_t *h, int i, int t)
{
    h->heap[i] = t;
    h->pos[t] = i;
}

/* The tenant at heap index i down to where its key puts it, below tenants before it. */
static void shoal_sched_drf_down(shoal_sched_drf_heap_t *h, int i)
{
    int t = h->heap[i];

    for (;;) {
        int kid = 2 * i + 1;
        if (kid >= h->n) {
            break;
        }
        if (kid + 1 < h->n && shoal_sched_drf_before(h, h->heap[kid + 1], h->heap[kid])) {
            kid++;
        }
        if (!shoal_sched_drf_before(h, h->heap[kid], t)) {
            break;
        }
        shoal_sched_drf_put(h, i, h->heap[kid]);
        i = kid;
    }
    shoal_sched_drf_put(h, i, t);
}

/* The tenant at heap index i (its key changed) up or down to where its key puts it. Not for
 * building the heap: there a parent is not in order yet, and a move up breaks the order. */
static void shoal_sched_drf_sift(shoal_sched_drf_heap_t *h, int i)
{
    int t = h->heap[i];

    while (i > 0 && shoal_sched_drf_before(h, t, h->heap[(i - 1) / 2])) {
        shoal_sched_drf_put(h, i, h->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    shoal_sched_drf_put(h, i, t);
    shoal_sched_drf_down(h, i);
}

static double shoal_sched_drf_row_key(double (*use)[SHOAL_SCHED_RES], const double *weight,
                                      const double *past, const double total[SHOAL_SCHED_RES],
                                      int t)
{
    return past != NULL ? shoal_sched_drf_key(use[t], total, weight[t], past[t])
                        : shoal_sched_drf_share(use[t], total, weight[t]);
}

/* The key of row t again (its use changed); nothing once t is out of the round. */
static void shoal_sched_drf_rekey(shoal_sched_drf_heap_t *h, double (*use)[SHOAL_SCHED_RES],
                                  const double *weight, const double *past,
                                  const double total[SHOAL_SCHED_RES], int t)
{
    if (h->pos[t] >= 0) {
        h->key[t] = shoal_sched_drf_row_key(use, weight, past, total, t);
        shoal_sched_drf_sift(h, h->pos[t]);
    }
}

/* A scan of every tenant per task, as before the heap: kept for the tests (cb->scan), which
 * compare the two. */
static int shoal_sched_drf_fill_scan(int ntenants, double (*use)[SHOAL_SCHED_RES],
                                     const double *weight, const double *past,
                                     const double total[SHOAL_SCHED_RES],
                                     const shoal_sched_drf_cbs_t *cb, void *ctx)
{
    char *active = malloc((size_t)(ntenants > 0 ? ntenants : 1));
    int started = 0, left = ntenants;

    if (active == NULL) {
        return -1;
    }
    for (int t = 0; t < ntenants; t++) {
        active[t] = 1;
    }
    while (left > 0) {
        int best = -1;
        double best_s = 0;
        for (int t = 0; t < ntenants; t++) {
            if (!active[t]) {
                continue;
            }
            double s = shoal_sched_drf_row_key(use, weight, past, total, t);
            if (best < 0 || s < best_s) {
                best = t;
                best_s = s;
            }
        }
        if (!cb->next(ctx, best) || !cb->try_start(ctx, best)) {
            active[best] = 0;
            left--;
            continue;
        }
        started++;
    }
    free(active);
    return started;
}

int shoal_sched_drf_fill_past(int ntenants, double (*use)[SHOAL_SCHED_RES], const double *weight,
                              const double *past, const double total[SHOAL_SCHED_RES],
                              const shoal_sched_drf_cbs_t *cb, void *ctx)
{
    size_t n = (size_t)(ntenants > 0 ? ntenants : 1);
    shoal_sched_drf_heap_t h = {.heap = malloc(sizeof(int) * n), .pos = malloc(sizeof(int) * n),
                                .key = malloc(sizeof(double) * n), .n = ntenants};
    int started = 0;

    if (cb->scan) {
        free(h.heap);
        free(h.pos);
        free(h.key);
        return shoal_sched_drf_fill_scan(ntenants, use, weight, past, total, cb, ctx);
    }
    if (h.heap == NULL || h.pos == NULL || h.key == NULL) {
        started = -1;
        goto out;
    }
    for (int t = 0; t < ntenants; t++) {
        h.key[t] = shoal_sched_drf_row_key(use, weight, past, total, t);
        shoal_sched_drf_put(&h, t, t);
    }
    for (int i = ntenants / 2 - 1; i >= 0; i--) {
        shoal_sched_drf_down(&h, i);
    }
    while (h.n > 0) {
        int best = h.heap[0];
        if (!cb->next(ctx, best) || !cb->try_start(ctx, best)) {
            /* out of the round: the last tenant of the heap takes its place */
            h.pos[best] = -1;
            if (--h.n > 0) {
                shoal_sched_drf_put(&h, 0, h.heap[h.n]);
                shoal_sched_drf_down(&h, 0);
            }
            continue;
        }
        started++;
        shoal_sched_drf_rekey(&h, use, weight, past, total, best);
        if (cb->moved != NULL) {
            const int *rows = NULL;
            int nrows = cb->moved(ctx, &rows);
            for (int i = 0; i < nrows; i++) {
                shoal_sched_drf_rekey(&h, use, weight, past, total, rows[i]);
            }
        }
    }
out:
    free(h.heap);
    free(h.pos);
    free(h.key);
    return started;
}
