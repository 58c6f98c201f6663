/*
 * Alpha-beta cost hints of the algorithms of tree.c, rab.c, hier.c, allgather2.c, alltoall.c,
 * bcast2.c and rs2.c, for the selection table (select.c). Same conventions as the table:
 * modelled microseconds of one call, negative when the algorithm cannot run the call;
 * bytes is the whole message (allreduce, broadcast) or one rank's block (allgather,
 * reduce_scatter, alltoall).
 */
#include "coll/coll.h"

static double shoal_cost_log2(int n)
{
    int l = 0;
    while ((1 << l) < n) {
        l++;
    }
    return l;
}

/* The link an algorithm over all ranks waits on: across hosts when there are several. */
static shoal_link_t shoal_cost_link(const shoal_coll_shape_t *s)
{
    return s->nhosts > 1 ? s->inter : s->intra;
}

double shoal_dbtree_ar_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    shoal_link_t l = shoal_cost_link(s);
    double half = (double)bytes / 2, c = SHOAL_MIN(half, (double)s->chunk);
    double K = c > 0 ? half / c : 1, depth = shoal_cost_log2(s->nranks + 1);
    /* Up then down, each a pipeline of K chunks over depth hops; an interior rank moves
     * two children's chunks per step: 3 m through the rank interior in one tree, m through
     * it as a leaf of the other. */
    return 2 * (K + depth - 1) * shoal_coll_step_us(s, l.alpha_us) +
           shoal_coll_xfer_us(s, 2 * (K + depth - 1) * 2 * c * l.beta_us, 4 * (double)bytes,
                              bytes) +
           shoal_coll_reduce_us(s, (double)bytes, bytes);
}

double shoal_rab_ar_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    shoal_link_t l = shoal_cost_link(s);
    int p = 1;
    double m = (double)bytes, pieces, fold = 0;
    while (p * 2 <= s->nranks) {
        p *= 2;
    }
    if (p != s->nranks) {
        fold = 2 * shoal_coll_step_us(s, l.alpha_us) +
               shoal_coll_xfer_us(s, 2 * m * l.beta_us, 2 * m, bytes) +
               shoal_coll_reduce_us(s, m, bytes);
    }
    /* pieces of scratch / 2: each exchanged, then reduced (no overlap) */
    pieces = SHOAL_MAX(1.0, m / 2 / (double)SHOAL_MAX(s->scratch / 2, 1));
    return fold + (2 * shoal_cost_log2(p) + pieces) * shoal_coll_step_us(s, l.alpha_us) +
           shoal_coll_xfer_us(s, 2 * (p - 1) / (double)p * m * l.beta_us,
                              4 * (p - 1) / (double)p * m, bytes) +
           shoal_coll_reduce_us(s, (p - 1) / (double)p * m, bytes);
}

/* Hierarchical AllReduce (hier.c): the buffer flows in k = m / S segments of S bytes
 * (shoal_hier_seg_bytes) through three phases: intra-host reduce-scatter, a ring across the
 * hosts per block, intra-host allgather. A rank's core runs the two intra-host phases of its
 * segments one after the other (hier.c's loop) while the host's link carries the rings of the
 * segments in between: a pipeline of two stages, the core and the link. With L ranks on the
 * busiest host and H hosts, per segment:
 *   core bytes  2 (L - 1) / L S over the intra-host links, the reduction of L inputs of S / L
 *               bytes and of the ring's (H - 1) / H S / L;
 *   link bytes  2 (H - 1) / H S over the link (the L rings of a host share it);
 *   messages    2 (L - 1) sent and as many received on the core, 2 (H - 1) each way on the
 *               ring: each costs its sender's and receiver's busy time (LogP's o);
 *   latency     2 step latencies inside a host (each intra phase posts all its messages at
 *               once) and 2 (H - 1) across hosts (a segment's chain of ring steps).
 *   cost = latency + core bytes + link bytes              (the first segment, phase by phase)
 *        + (k - 1) max(core bytes + core messages, link bytes + link messages)
 * i.e. the latency terms of each phase, the slowest stage's time for every further segment,
 * the other stage once (filling and draining the pipeline) and the per-segment messages; one
 * segment is the plain sum of the phases. */
double shoal_hier_ar_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    double L = SHOAL_MAX(s->max_ppn, 1), H = s->nhosts, m = (double)bytes, S, k;
    double lat, core, link, core_msg = 0, link_msg;
    if (s->nhosts < 2 || s->max_ppn > SHOAL_HIER_MAX_LOCAL) {
        return -1;
    }
    S = SHOAL_MIN(m, (double)shoal_hier_seg_bytes(bytes, s->hier_segment));
    k = S > 0 ? m / S : 1;
    lat = 2 * (H - 1) * shoal_coll_step_us(s, s->inter.alpha_us);
    core = shoal_coll_reduce_us(s, ((L - 1) / L + (H - 1) / H / L) * S, bytes);
    if (L > 1) {
        lat += 2 * shoal_coll_step_us(s, s->intra.alpha_us);
        core += 2 * (L - 1) / L * S * s->intra.beta_us;
        core_msg = 2 * (L - 1) * (shoal_link_send_us(&s->intra) + shoal_link_recv_us(&s->intra));
    }
    link = 2 * (H - 1) / H * S * s->inter.beta_us;
    link_msg = 2 * (H - 1) * (shoal_link_send_us(&s->inter) + shoal_link_recv_us(&s->inter));
    return lat + core + link + (k - 1) * SHOAL_MAX(core + core_msg, link + link_msg);
}

double shoal_bruck_ag_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    shoal_link_t l = shoal_cost_link(s);
    double n = s->nranks;
    if ((double)bytes * n > (double)s->scratch) {
        return -1;
    }
    /* log2(n) steps, then the rotation out of scratch */
    return shoal_cost_log2(s->nranks) * shoal_coll_step_us(s, l.alpha_us) +
           (n - 1) * (double)bytes * l.beta_us + n * (double)bytes * s->copy_beta;
}

double shoal_pairwise_a2a_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    shoal_link_t l = shoal_cost_link(s);
    return (s->nranks - 1) * shoal_link_time(&l, (double)bytes) + (double)bytes * s->copy_beta;
}

/* ---- broadcast ----------------------------------------------------------------------------
 * Broadcast rows model calls issued back to back (what the perf tools time, and what a job's
 * stream of broadcasts sees): the work of the busiest core per call. Per message a sender is
 * busy send_us and a receiver recv_us (measured at init: LogP's o); per byte both copy inside
 * a host, while across hosts the NIC moves the bytes and only the sender's side counts. When
 * a host's ranks outnumber its cores, rank v shares core v mod C (shoalrun --bind-to core,
 * and roughly what the scheduler does), so ranks that share a core add up. Measured with
 * perf/select_check.sh -c broadcast: over loopback TCP a send keeps the sender busy 3.5 us
 * and a receive 1.4; on 3 ranks sharing 2 cores the binomial root's core does two sends and
 * a receive per call, the chain's cores one of each: the chain is 1.2-2x faster, on shm too. */
enum { SHOAL_BC_TREE, SHOAL_BC_CHAIN, SHOAL_BC_PTREE };
#define SHOAL_BC_MAX_CORES 64

/* Transfers of virtual rank v (0 = root) per call. */
static void shoal_bcast_transfers(int shape, int n, int v, int *sends_p, int *recvs_p)
{
    int sends = 0, recvs = v != 0;
    if (shape == SHOAL_BC_CHAIN) {
        sends = v < n - 1;
    } else if (shape == SHOAL_BC_TREE) {
        int mask = 1;
        while (mask < n && (v & mask) == 0) {
            mask <<= 1; /* the root's loop ends at the first power of two >= n */
        }
        for (mask >>= 1; mask > 0; mask >>= 1) {
            sends += v + mask < n;
        }
    } else {
        shoal_tree_node_t t[2];
        shoal_dbtree_build(n, v, t);
        recvs = t[0].parent >= 0;
        sends = (t[0].child[0] >= 0) + (t[0].child[1] >= 0);
    }
    *sends_p = sends;
    *recvs_p = recvs;
}

static double shoal_bcast_cost(const shoal_coll_shape_t *s, size_t bytes, int shape)
{
    shoal_link_t l = shoal_cost_link(s);
    double m = (double)bytes, K = 1, load[SHOAL_BC_MAX_CORES] = {0}, worst = 0;
    double recv_bytes = s->nhosts > 1 ? 0 : m * l.beta_us;
    int n = s->nranks, cores = n;

    if (shape != SHOAL_BC_TREE && bytes > s->chunk) {
        K = (double)((bytes + s->chunk - 1) / s->chunk); /* chunks: a message each */
    }
    if (s->nhosts == 1 && s->oversub > 1) {
        cores = SHOAL_MAX(1, (int)((double)n / s->oversub + 0.5));
    }
    for (int v = 0; v < n; v++) {
        int sends, recvs;
        double busy;
        shoal_bcast_transfers(shape, n, v, &sends, &recvs);
        busy = sends * (K * shoal_link_send_us(&l) + m * l.beta_us) +
               recvs * (K * shoal_link_recv_us(&l) + recv_bytes);
        if (cores < n && cores <= SHOAL_BC_MAX_CORES) {
            load[v % cores] += busy;
            busy = load[v % cores];
        }
        worst = SHOAL_MAX(worst, busy);
    }
    return worst;
}

double shoal_tree_bcast_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    return shoal_bcast_cost(s, bytes, SHOAL_BC_TREE);
}

double shoal_chain_bcast_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    return shoal_bcast_cost(s, bytes, SHOAL_BC_CHAIN);
}

double shoal_ptree_bcast_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    return shoal_bcast_cost(s, bytes, SHOAL_BC_PTREE);
}

double shoal_rh_rs_cost(const shoal_coll_shape_t *s, size_t bytes)
{
    shoal_link_t l = shoal_cost_link(s);
    double n = s->nranks, total = n * (double)bytes;
    double slice = (double)s->scratch / 3 / (n / 2), slices;
    if ((s->nranks & (s->nranks - 1)) != 0 || slice < 64) {
        return -1;
    }
    /* the same bytes reduced as the ring's, in log2(n) steps per slice, plus staging copies */
    slices = SHOAL_MAX(1.0, total / 2 / slice);
    return slices * shoal_cost_log2(s->nranks) * shoal_coll_step_us(s, l.alpha_us) +
           (n - 1) / n * total * l.beta_us +
           shoal_coll_reduce_us(s, (n - 1) / n * total, (size_t)total) +
           total / 2 * s->copy_beta;
}
