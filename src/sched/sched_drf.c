/*
 * Weighted dominant-resource fairness (Ghodsi et al., NSDI 2011), progressive filling: the
 * tenant with the lowest dominant share divided by its weight starts its next task; GPUs, CPUs
 * and memory are the resources. A tenant whose next task cannot start now drops out of the
 * round (its place is not taken by its own later tasks: gangs are served in order). Past usage
 * (sched_usage.c), when given, is added to the dominant share before the division by the
 * weight: it changes who is served first, nothing else.
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
    return shoal_sched_drf_fill_past(ntenants, use, weight, NULL, total, next, try_start, ctx);
}

int shoal_sched_drf_fill_past(int ntenants, double (*use)[SHOAL_SCHED_RES], const double *weight,
                              const double *past, const double total[SHOAL_SCHED_RES],
                              shoal_sched_drf_next_cb_t next,
                              shoal_sched_drf_try_cb_t try_start, void *ctx)
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
            double s = past != NULL ? shoal_sched_drf_key(use[t], total, weight[t], past[t])
                                    : shoal_sched_drf_share(use[t], total, weight[t]);
            if (best < 0 || s < best_s) {
                best = t;
                best_s = s;
            }
        }
        if (!next(ctx, best) || !try_start(ctx, best)) {
            active[best] = 0;
            left--;
            continue;
        }
        started++;
    }
    free(active);
    return started;
}
