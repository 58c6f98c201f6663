/* The agent's arbiter (DESIGN.md section 7, QoS): how a host's capacity is divided among the
 * active tenants. Plain C, no library internals: the node agent compiles share.c itself. */
#ifndef SHOAL_QOS_SHARE_H
#define SHOAL_QOS_SHARE_H

/* Weighted max-min fair, work-conserving shares of capacity (water filling): rates[i] <=
 * demands[i] (a negative demand = unlimited); a tenant whose demand is below its weighted
 * share gets its demand and the rest goes to the others in proportion to their weights; an
 * idle tenant (demand 0 or NaN) gets nothing. Weights <= 0, NaN or infinite get nothing; only
 * the ratios of the others matter (1e308:1e308 divides as 1:1 does). When every demand is met,
 * capacity may be left over (rates are not raised above demands). Returns the capacity handed
 * out. n <= 0 or capacity <= 0: every rate 0. */
double shoal_qos_share(const double *weights, const double *demands, int n, double capacity,
                       double *rates);

/* Jain's fairness index of x[0..n) (1 = equal): (sum x)^2 / (n sum x^2); 0 for n <= 0. */
double shoal_qos_jain(const double *x, int n);

#endif
