/* Weighted max-min shares for the node agent (share.h). */
#include "qos/share.h"

#include <math.h>

/* Demand d asks for something: negative (unlimited) or positive. A NaN demand asks for nothing,
 * as a NaN weight gets nothing: it took a full part at every round without being counted in the
 * round's sum of weights, and the rates handed out passed the capacity. */
static int shoal_qos_share_wants(double d)
{
    return d < 0 || d > 0;
}

/* Weight w scaled by wmax, the largest weight that counts (> 0 and finite; an infinite one
 * counts as none, as a NaN one: it took part as NaN); 0 for one that does not. Only the
 * weights' ratios matter, and scaled into (0, 1] their sum neither overflows (weights of
 * 1e308 summed to inf: every part 0, nothing handed out) nor is so small that the part of a
 * unit of weight is infinite (weights of 1e-320 were handed out inf each). */
static double shoal_qos_share_weight(double w, double wmax)
{
    return w > 0 && isfinite(w) ? w / wmax : 0;
}

double shoal_qos_share(const double *weights, const double *demands, int n, double capacity,
                       double *rates)
{
    double left = capacity, given = 0, wmax = 0;
    int active = 0;

    for (int i = 0; i < n; i++) {
        if (weights[i] > wmax && isfinite(weights[i])) {
            wmax = weights[i];
        }
    }
    for (int i = 0; i < n; i++) {
        rates[i] = 0;
        if (shoal_qos_share_weight(weights[i], wmax) > 0 && shoal_qos_share_wants(demands[i])) {
            active++;
        }
    }
    if (n <= 0 || !(capacity > 0)) {
        return 0;
    }
    /* Water filling: each round hands every unsatisfied tenant its weighted part of what is
     * left; those whose demand is met drop out and their excess is shared in the next round.
     * At most n rounds: each one either satisfies a tenant or ends. */
    while (active > 0 && left > capacity * 1e-12) {
        double wsum = 0;
        int satisfied = 0;
        for (int i = 0; i < n; i++) {
            double w = shoal_qos_share_weight(weights[i], wmax);
            if (w > 0 && shoal_qos_share_wants(demands[i]) &&
                (demands[i] < 0 || rates[i] < demands[i])) {
                wsum += w;
            }
        }
        if (!(wsum > 0)) {
            break;
        }
        double unit = left / wsum, used = 0;
        for (int i = 0; i < n; i++) {
            double w = shoal_qos_share_weight(weights[i], wmax);
            if (!(w > 0) || !shoal_qos_share_wants(demands[i]) ||
                (demands[i] >= 0 && rates[i] >= demands[i])) {
                continue;
            }
            double want = unit * w;
            if (demands[i] >= 0 && rates[i] + want >= demands[i]) {
                want = demands[i] - rates[i];
                satisfied++;
            }
            rates[i] += want;
            used += want;
        }
        left -= used;
        if (satisfied == 0) {
            break; /* everyone took a full part: nothing left to redistribute */
        }
    }
    for (int i = 0; i < n; i++) {
        given += rates[i];
    }
    return given;
}

double shoal_qos_jain(const double *x, int n)
{
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        s += x[i];
        s2 += x[i] * x[i];
    }
    return n > 0 && s2 > 0 ? s * s / (n * s2) : 0;
}
