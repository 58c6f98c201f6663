/* Algorithm choice per call and the dispatch that runs it. */
#include "coll/coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- the algorithm table: one row per (algorithm, collective) --------------------------
 * cost_us(shape, bytes) is the modelled time of one call (negative: cannot run it); bytes is
 * the whole message for allreduce/broadcast/reduce and one rank's block for allgather and
 * reduce_scatter. applicable(comm, a), where set, adds the checks only a communicator can
 * answer. A row has either plan, the builder of the step-wise plan that the progress engine
 * advances beside other calls (a blocking call drives the same plan on the calling thread:
 * shoal_coll_plan_run), or run, which executes the call whole on the calling thread (as a
 * nonblocking call it then runs alone on its communicator), or both: run is then the blocking
 * call's own driver of the same plan (the intra-node AllReduce: its idle step sleeps on the
 * shared areas' futex, not on the transports). Selection takes the cheapest
 * applicable row; SHOAL_ALGO forces a row; shoal_info -t prints this table. Adding an
 * algorithm: its file (cost, plan builder) and one row here. */
typedef double (*shoal_coll_cost_fn_t)(const shoal_coll_shape_t *s, size_t bytes);
typedef int (*shoal_coll_applicable_fn_t)(struct shoal_comm *comm, const shoal_coll_args_t *a);

typedef struct {
    shoal_algo_t algo;
    shoal_coll_type_t coll;
    shoal_coll_cost_fn_t cost_us;
    shoal_coll_applicable_fn_t applicable;
    shoal_coll_run_fn_t run;
    shoal_coll_plan_build_t plan;
} shoal_coll_algo_row_t;

/* Entry points whose signature differs from shoal_coll_run_fn_t. */
static shoal_status_t shoal_coll_run_shm_ar(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                            uint32_t seq)
{
    (void)seq;
    return shoal_shmdirect_allreduce(comm, a);
}

static const char *const shoal_coll_type_names[SHOAL_COLL_TYPE_COUNT] = {
    [SHOAL_COLL_ALLREDUCE] = "allreduce", [SHOAL_COLL_BROADCAST] = "broadcast",
    [SHOAL_COLL_REDUCE] = "reduce", [SHOAL_COLL_ALLGATHER] = "allgather",
    [SHOAL_COLL_REDUCE_SCATTER] = "reduce_scatter", [SHOAL_COLL_BARRIER] = "barrier",
    [SHOAL_COLL_SEND] = "send", [SHOAL_COLL_RECV] = "recv", [SHOAL_COLL_ALLTOALL] = "alltoall",
};

static int shoal_coll_log2_ceil(int n)
{
    int l = 0;
    while ((1 << l) < n) {
        l++;
    }
    return l;
}

/* Time of the ring's per-step transfer: the slowest edge (the NIC shared by the ring edges
 * leaving the busiest host). */
static void shoal_coll_ring_link(const shoal_coll_shape_t *s, double *alpha, double *beta)
{
    if (s->nhosts > 1) {
        *alpha = SHOAL_MAX(s->inter.alpha_us, s->intra.alpha_us);
        *beta = SHOAL_MAX(s->inter.beta_us * SHOAL_MAX(s->ring_share, 1), s->intra.beta_us);
    } else {
        *alpha = s->intra.alpha_us;
        *beta = s->intra.beta_us;
    }
}

static double shoal_coll_cost_ring_ar(const shoal_coll_shape_t *s, size_t bytes)
{
    double n = s->nranks, m = (double)bytes, alpha, beta, sent = 2 * (n - 1) / n * m;
    double groups = SHOAL_MAX(1.0, (double)((bytes + 2 * s->nranks * s->chunk - 1) /
                                           (2 * s->nranks * s->chunk)));
    double reduce = shoal_coll_reduce_us(s, (n - 1) / n * m, bytes);
    shoal_coll_ring_link(s, &alpha, &beta);
    /* The chunks' reductions overlap the next transfers: half of it shows; not through the
     * shm transport's rings, where the core that reduces also copies every transfer into and
     * out of them. */
    return 2 * (n - 1) * groups * shoal_coll_step_us(s, alpha) +
           shoal_coll_xfer_us(s, sent * beta, 2 * sent, bytes) +
           (s->shm_direct ? 1.0 : 0.5) * reduce;
}

static double shoal_coll_cost_rd_ar(const shoal_coll_shape_t *s, size_t bytes)
{
    int l = shoal_coll_log2_ceil(s->nranks);
    if (bytes > s->scratch) {
        return -1;
    }
    /* every step sends and receives the whole message */
    return shoal_coll_step_us(s, s->rd_alpha_us) +
           shoal_coll_xfer_us(s, (double)bytes * s->rd_beta_us, 2.0 * l * (double)bytes, bytes) +
           shoal_coll_reduce_us(s, l * (double)bytes, bytes);
}

/* The intra-node AllReduce (shmdirect.c) reads the peers' shared areas in place: no
 * messages, no transport rings; its memory work counts with the same rates as the channel
 * algorithms' copies (shoal_coll_xfer_us) and reductions. The staged roads are modelled; the
 * direct ones (shoal_mem_alloc buffers, single copies) copy less. */
static double shoal_coll_cost_shm_ar(const shoal_coll_shape_t *s, size_t bytes)
{
    /* A flag store and poll in shared memory: far below a channel message's latency. */
    double n = s->nranks, m = (double)bytes, sync = 0.1 * n * s->oversub;
    if (!s->shm_direct) {
        return -1;
    }
    if (bytes <= s->shm_oneshot_max) {
        /* stage, then every rank reduces all n inputs in one pass */
        return 2 * sync + shoal_coll_copy_us(s, m, bytes) + shoal_coll_reduce_n_us(s, n, m, bytes);
    }
    /* per window: stage the input, reduce my 1/n across the n inputs, copy the other
     * segments out */
    return 3 * sync * SHOAL_MAX(1.0, m / (double)SHOAL_MAX(s->shm_window, 4096)) +
           shoal_coll_copy_us(s, (2 * n - 1) / n * m, bytes) +
           shoal_coll_reduce_n_us(s, n, m / n, bytes);
}

static double shoal_coll_cost_tree_reduce(const shoal_coll_shape_t *s, size_t bytes)
{
    shoal_link_t l = s->nhosts > 1 ? s->inter : s->intra;
    return shoal_coll_log2_ceil(s->nranks) *
           (shoal_link_time(&l, (double)bytes) + (double)bytes * s->reduce_beta);
}

static double shoal_coll_cost_ring_ag(const shoal_coll_shape_t *s, size_t bytes)
{
    double alpha, beta;
    shoal_coll_ring_link(s, &alpha, &beta);
    return (s->nranks - 1) * (shoal_coll_step_us(s, alpha) + (double)bytes * beta);
}

static double shoal_coll_cost_ring_rs(const shoal_coll_shape_t *s, size_t bytes)
{
    double alpha, beta, chunks = SHOAL_MAX(1.0, (double)((bytes + s->chunk - 1) / s->chunk));
    double n = s->nranks;
    shoal_coll_ring_link(s, &alpha, &beta);
    return (n - 1) * (chunks * shoal_coll_step_us(s, alpha) + (double)bytes * beta) +
           shoal_coll_reduce_us(s, (n - 1) * (double)bytes, (size_t)n * bytes);
}

static const shoal_coll_algo_row_t shoal_coll_algo_table[] = {
    {.algo = SHOAL_ALGO_SHM, .coll = SHOAL_COLL_ALLREDUCE, .cost_us = shoal_coll_cost_shm_ar,
     .run = shoal_coll_run_shm_ar, .plan = shoal_shmdirect_allreduce_plan},
    {.algo = SHOAL_ALGO_RD, .coll = SHOAL_COLL_ALLREDUCE, .cost_us = shoal_coll_cost_rd_ar,
     .plan = shoal_rd_allreduce_plan},
    {.algo = SHOAL_ALGO_RING, .coll = SHOAL_COLL_ALLREDUCE, .cost_us = shoal_coll_cost_ring_ar,
     .plan = shoal_ring_allreduce_plan},
    {.algo = SHOAL_ALGO_TREE, .coll = SHOAL_COLL_BROADCAST, .cost_us = shoal_tree_bcast_cost,
     .plan = shoal_tree_bcast_plan},
    {.algo = SHOAL_ALGO_RING, .coll = SHOAL_COLL_BROADCAST, .cost_us = shoal_chain_bcast_cost,
     .plan = shoal_chain_bcast_plan},
    {.algo = SHOAL_ALGO_TREE, .coll = SHOAL_COLL_REDUCE, .cost_us = shoal_coll_cost_tree_reduce,
     .plan = shoal_tree_reduce_plan},
    {.algo = SHOAL_ALGO_RING, .coll = SHOAL_COLL_ALLGATHER, .cost_us = shoal_coll_cost_ring_ag,
     .plan = shoal_ring_allgather_plan},
    {.algo = SHOAL_ALGO_RING, .coll = SHOAL_COLL_REDUCE_SCATTER,
     .cost_us = shoal_coll_cost_ring_rs, .plan = shoal_ring_reduce_scatter_plan},
    /* algorithms of tree.c, rab.c, hier.c, bcast2.c, allgather2.c, rs2.c, alltoall.c */
    {.algo = SHOAL_ALGO_DBTREE, .coll = SHOAL_COLL_ALLREDUCE, .cost_us = shoal_dbtree_ar_cost,
     .plan = shoal_dbtree_allreduce_plan},
    {.algo = SHOAL_ALGO_RAB, .coll = SHOAL_COLL_ALLREDUCE, .cost_us = shoal_rab_ar_cost,
     .plan = shoal_rab_allreduce_plan},
    {.algo = SHOAL_ALGO_HIER, .coll = SHOAL_COLL_ALLREDUCE, .cost_us = shoal_hier_ar_cost,
     .applicable = shoal_hier_applicable, .plan = shoal_hier_allreduce_plan},
    {.algo = SHOAL_ALGO_PTREE, .coll = SHOAL_COLL_BROADCAST, .cost_us = shoal_ptree_bcast_cost,
     .plan = shoal_ptree_bcast_plan},
    {.algo = SHOAL_ALGO_BRUCK, .coll = SHOAL_COLL_ALLGATHER, .cost_us = shoal_bruck_ag_cost,
     .applicable = shoal_bruck_applicable, .plan = shoal_bruck_allgather_plan},
    {.algo = SHOAL_ALGO_RAB, .coll = SHOAL_COLL_REDUCE_SCATTER, .cost_us = shoal_rh_rs_cost,
     .applicable = shoal_rh_reduce_scatter_applicable, .plan = shoal_rh_reduce_scatter_plan},
    {.algo = SHOAL_ALGO_PAIRWISE, .coll = SHOAL_COLL_ALLTOALL,
     .cost_us = shoal_pairwise_a2a_cost, .plan = shoal_pairwise_alltoall_plan},
};

static const shoal_coll_algo_row_t *shoal_coll_row(shoal_coll_type_t type, shoal_algo_t algo)
{
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_coll_algo_table); i++) {
        const shoal_coll_algo_row_t *row = &shoal_coll_algo_table[i];
        if (row->coll == type && row->algo == algo) {
            return row;
        }
    }
    return NULL;
}

/* What runs when no row applies (or the collective has none). */
static shoal_algo_t shoal_coll_default_algo(shoal_coll_type_t type)
{
    if (type == SHOAL_COLL_ALLTOALL) {
        return SHOAL_ALGO_PAIRWISE;
    }
    return type == SHOAL_COLL_BROADCAST || type == SHOAL_COLL_REDUCE ? SHOAL_ALGO_TREE
                                                                     : SHOAL_ALGO_RING;
}

int shoal_coll_table_row(size_t i, shoal_algo_t *algo_p, shoal_coll_type_t *coll_p,
                         int *stepwise_p)
{
    if (i >= SHOAL_ARRAY_SIZE(shoal_coll_algo_table)) {
        return 0;
    }
    *algo_p = shoal_coll_algo_table[i].algo;
    *coll_p = shoal_coll_algo_table[i].coll;
    *stepwise_p = shoal_coll_algo_table[i].plan != NULL;
    return 1;
}

const char *shoal_coll_type_name(shoal_coll_type_t type)
{
    return (unsigned)type < SHOAL_COLL_TYPE_COUNT ? shoal_coll_type_names[type] : "?";
}

double shoal_coll_cost(const shoal_coll_shape_t *s, shoal_coll_type_t type, shoal_algo_t algo,
                       size_t bytes)
{
    const shoal_coll_algo_row_t *row = shoal_coll_row(type, algo);
    return row != NULL ? row->cost_us(s, bytes) : -1;
}

/* The cheapest row (or the forced one) whose cost is known and, given comm, applicable. */
static shoal_algo_t shoal_coll_pick(const shoal_coll_shape_t *s, struct shoal_comm *comm,
                                    const shoal_coll_args_t *a, shoal_coll_type_t type,
                                    size_t bytes, int forced, double *cost_p)
{
    shoal_algo_t best = shoal_coll_default_algo(type);
    double best_cost = -1;

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_coll_algo_table); i++) {
        const shoal_coll_algo_row_t *row = &shoal_coll_algo_table[i];
        double c;
        if (row->coll != type || (c = row->cost_us(s, bytes)) < 0 ||
            (comm != NULL && row->applicable != NULL && !row->applicable(comm, a))) {
            continue;
        }
        if ((int)row->algo == forced) {
            best = row->algo;
            best_cost = c;
            break;
        }
        if (best_cost < 0 || c < best_cost) {
            best = row->algo;
            best_cost = c;
        }
    }
    /* One host, an AllReduce: the shared-memory path at every size, whatever the model says
     * of the channels (SHOAL_ALGO may name another). It does strictly less than an algorithm
     * over channel messages, which go through the same memory with headers and a copy more;
     * the model compares its estimates with the link costs measured at init, which on a
     * loaded host came out below them (8 bytes on 2 ranks: rd 0.3 us, shm 0.4 us). Ranks
     * with counts that differ then took rd, or one rd and one shm (a crossover between their
     * sizes), and failed the communicator with a protocol error, where this path refuses the
     * call on every rank and the communicator lives on (README; run_shmcopy.sh's and
     * test_errors.py's mismatch cases failed on a loaded host). */
    if (type == SHOAL_COLL_ALLREDUCE && forced == SHOAL_ALGO_AUTO && best != SHOAL_ALGO_SHM &&
        shoal_coll_cost_shm_ar(s, bytes) >= 0) {
        best = SHOAL_ALGO_SHM;
        best_cost = shoal_coll_cost_shm_ar(s, bytes);
    }
    if (cost_p != NULL) {
        *cost_p = best_cost;
    }
    return best;
}

shoal_algo_t shoal_coll_select_shape(const shoal_coll_shape_t *s, shoal_coll_type_t type,
                                     size_t bytes, int forced, double *cost_p)
{
    return shoal_coll_pick(s, NULL, NULL, type, bytes, forced, cost_p);
}

/* INFO [COLL] once per (collective, power-of-two size bucket): the choice and every cost. */
static void shoal_coll_log_choice(struct shoal_comm *comm, shoal_coll_type_t type, size_t bytes,
                                  shoal_algo_t algo)
{
    shoal_coll_state_t *cs = comm->coll;
    int bucket = bytes == 0 ? 0 : 63 - __builtin_clzll((unsigned long long)bytes);
    char costs[256], forced[64];
    size_t len = 0;

    if ((cs->logged[type] & (1ull << bucket)) != 0) {
        return;
    }
    cs->logged[type] |= 1ull << bucket;
    costs[0] = '\0';
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_coll_algo_table) && len < sizeof(costs); i++) {
        const shoal_coll_algo_row_t *row = &shoal_coll_algo_table[i];
        if (row->coll == type) {
            double c = row->cost_us(&cs->shape, bytes);
            len += (size_t)snprintf(costs + len, sizeof(costs) - len, " %s=%.1f",
                                    shoal_algo_names[row->algo], c);
        }
    }
    /* A forced algorithm applies only where its row serves the call: elsewhere the model
     * chose, which the line says (it said '(SHOAL_ALGO)' after the model's choice too). */
    if (cs->algo == SHOAL_ALGO_AUTO) {
        forced[0] = '\0';
    } else if ((int)algo == cs->algo) {
        snprintf(forced, sizeof(forced), " (SHOAL_ALGO)");
    } else {
        snprintf(forced, sizeof(forced), " (SHOAL_ALGO=%s does not apply here)",
                 shoal_algo_names[cs->algo]);
    }
    shoal_info(COLL, "rank %d: %s of %zu bytes (bucket 2^%d): %s%s; model us:%s", comm->rank,
               shoal_coll_type_names[type], bytes, bucket, shoal_algo_names[algo], forced, costs);
}

/* The choice cache's slot of (type, bytes). */
static inline size_t shoal_coll_sel_slot(shoal_coll_type_t type, size_t bytes)
{
    return ((bytes * 0x9e3779b97f4a7c15ull >> 58) ^ (size_t)type) & (SHOAL_SELECT_CACHE - 1);
}

shoal_algo_t shoal_coll_select(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    shoal_coll_state_t *cs = comm->coll;
    size_t bytes = a->count * shoal_dtype_esize(a->dtype);
    shoal_algo_t algo;

    if (a->type >= SHOAL_COLL_TYPE_COUNT || a->type == SHOAL_COLL_BARRIER ||
        a->type == SHOAL_COLL_SEND || a->type == SHOAL_COLL_RECV) {
        return shoal_coll_default_algo(a->type);
    }
    size_t slot = shoal_coll_sel_slot(a->type, bytes);
    if (cs->sel_cache[slot].type == (int8_t)a->type && cs->sel_cache[slot].bytes == bytes) {
        return (shoal_algo_t)cs->sel_cache[slot].algo;
    }
    algo = shoal_coll_pick(&cs->shape, comm, a, a->type, bytes, cs->algo, NULL);
    if (shoal_log_enabled(SHOAL_LOG_INFO, COLL)) {
        shoal_coll_log_choice(comm, a->type, bytes, algo);
    }
    cs->sel_cache[slot].bytes = bytes;
    cs->sel_cache[slot].type = (int8_t)a->type;
    cs->sel_cache[slot].algo = (uint8_t)algo;
    cs->sel_cache[slot].row = shoal_coll_row(a->type, algo);
    return algo;
}

static shoal_status_t shoal_coll_local(const shoal_coll_args_t *a)
{
    size_t bytes = a->count * shoal_dtype_esize(a->dtype);
    if (a->sendbuf != a->recvbuf && a->recvbuf != NULL && bytes > 0) {
        memmove(a->recvbuf, a->sendbuf, bytes);
    }
    if (a->type == SHOAL_COLL_ALLREDUCE || a->type == SHOAL_COLL_REDUCE ||
        a->type == SHOAL_COLL_REDUCE_SCATTER) {
        shoal_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, a->op, 1);
    }
    return SHOAL_OK;
}

/* shoal_coll_row_for without a cached row: the choice (cost table on a miss), its row. */
static const shoal_coll_algo_row_t *shoal_coll_row_pick(struct shoal_comm *comm,
                                                        const shoal_coll_args_t *a, uint32_t seq)
{
    shoal_algo_t algo = shoal_coll_select(comm, a);
    const shoal_coll_algo_row_t *row = shoal_coll_row(a->type, algo);
    shoal_trace(COLL, "rank %d: seq %u type %d count %zu algo %s", comm->rank, seq, a->type,
                a->count, shoal_algo_names[algo]);
    if (row == NULL) {
        shoal_error(COLL, "no algorithm %s for collective %s", shoal_algo_names[algo],
                    shoal_coll_type_names[a->type]);
    }
    return row;
}

/* The row that runs a call of more than one rank and count > 0: a cached choice with its row
 * looks at neither the cost table nor the row table. */
static inline const shoal_coll_algo_row_t *shoal_coll_row_for(struct shoal_comm *comm,
                                                              const shoal_coll_args_t *a,
                                                              uint32_t seq)
{
    shoal_coll_state_t *cs = comm->coll;
    size_t bytes = a->count * shoal_dtype_esize(a->dtype);
    size_t slot = shoal_coll_sel_slot(a->type, bytes);
    const shoal_coll_algo_row_t *row = cs->sel_cache[slot].row;

    if (SHOAL_LIKELY(row != NULL && cs->sel_cache[slot].type == (int8_t)a->type &&
                     cs->sel_cache[slot].bytes == bytes)) {
        shoal_trace(COLL, "rank %d: seq %u type %d count %zu algo %s", comm->rank, seq, a->type,
                    a->count, shoal_algo_names[row->algo]);
        return row;
    }
    return shoal_coll_row_pick(comm, a, seq);
}

/* ---- SHOAL_CHECK_ARGS: the ranks compare a call's arguments before it runs ----------------
 * Without it nothing compares them: the algorithms cut the call by their own arguments, so a
 * count that differs fails the communicator with a protocol error (a message of another
 * length) or waits out the timeout (a rank that passed 0 returned at once), and a broadcast
 * whose ranks name different roots may return SHOAL_OK everywhere, no data moved (2 ranks,
 * each its own root: both send, neither receives). A broadcast's root receives nothing, so
 * no message of the call can tell it: the check is an exchange of its own, a dissemination
 * (as the barrier: rank + d, rank - d, d = 1, 2, 4, ...) of the smallest and largest value
 * of each argument that the rank has seen. Every rank sends and receives the same fixed
 * size whatever it passed, so all finish it, all see the same extremes, and all refuse a
 * call whose arguments differ without a message of the call itself on the wire: the
 * communicator stays usable. */
#define SHOAL_COLL_CHECK_STEP 0x73000000u /* channel step of the exchange (+ round) */

enum { SHOAL_SIG_TYPE, SHOAL_SIG_COUNT, SHOAL_SIG_DTYPE, SHOAL_SIG_OP, SHOAL_SIG_ROOT,
       SHOAL_SIG_N };
static const char *const shoal_sig_names[SHOAL_SIG_N] = {"collective", "count", "dtype", "op",
                                                         "root"};

static shoal_status_t shoal_coll_check_args(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                            uint32_t seq)
{
    /* [0]: smallest, [1]: largest; the api zeroes what a collective does not take (the op of
     * a broadcast, the root of an AllReduce), so those compare equal */
    uint64_t mm[2][SHOAL_SIG_N], in[2][SHOAL_SIG_N];
    int n = comm->nranks, r = comm->rank, k = 0;
    char why[256];
    size_t len = 0;

    mm[0][SHOAL_SIG_TYPE] = (uint64_t)a->type;
    mm[0][SHOAL_SIG_COUNT] = (uint64_t)a->count;
    mm[0][SHOAL_SIG_DTYPE] = (uint64_t)a->dtype;
    mm[0][SHOAL_SIG_OP] = (uint64_t)a->op;
    mm[0][SHOAL_SIG_ROOT] = (uint64_t)(uint32_t)a->root;
    memcpy(mm[1], mm[0], sizeof(mm[0]));
    for (int d = 1; d < n; d <<= 1, k++) {
        /* not metered: a check of the library's, not the tenant's payload */
        SHOAL_CHECK(shoal_chan_sendrecv_ctl(comm, (r + d) % n, mm, shoal_mod(r - d, n), in,
                                            sizeof(mm), seq,
                                            SHOAL_COLL_CHECK_STEP + (uint32_t)k));
        for (int i = 0; i < SHOAL_SIG_N; i++) {
            mm[0][i] = SHOAL_MIN(mm[0][i], in[0][i]);
            mm[1][i] = SHOAL_MAX(mm[1][i], in[1][i]);
        }
    }
    why[0] = '\0';
    for (int i = 0; i < SHOAL_SIG_N && len < sizeof(why); i++) {
        if (mm[0][i] != mm[1][i]) {
            len += (size_t)snprintf(why + len, sizeof(why) - len, "%s%s %llu..%llu",
                                    len > 0 ? ", " : "", shoal_sig_names[i],
                                    (unsigned long long)mm[0][i], (unsigned long long)mm[1][i]);
        }
    }
    if (SHOAL_LIKELY(why[0] == '\0')) {
        return SHOAL_OK;
    }
    shoal_error(COLL, "rank %d: %s arguments differ across ranks (SHOAL_CHECK_ARGS): %s (this "
                "rank: count %zu, dtype %s, op %s, root %d); the call did nothing", r,
                shoal_coll_type_name(a->type), why, a->count, shoal_dtype_name(a->dtype),
                shoal_op_name(a->op), a->root);
    return SHOAL_ERR_INVALID_ARG;
}

/* A collective call (not send / receive) of sequence number seq on the calling thread. */
static inline shoal_status_t shoal_coll_run_seq(struct shoal_comm *comm,
                                                const shoal_coll_args_t *a, uint32_t seq)
{
    const shoal_coll_algo_row_t *row;

    if (comm->nranks == 1) {
        return a->type == SHOAL_COLL_BARRIER ? SHOAL_OK : shoal_coll_local(a);
    }
    if (a->type == SHOAL_COLL_BARRIER) {
        return shoal_coll_plan_run(comm, shoal_barrier_plan, a, seq);
    }
    if (a->count == 0) {
        return SHOAL_OK;
    }
    row = shoal_coll_row_for(comm, a, seq);
    if (row == NULL) {
        return SHOAL_ERR_INTERNAL;
    }
    return row->run != NULL ? row->run(comm, a, seq)
                            : shoal_coll_plan_run(comm, row->plan, a, seq);
}

shoal_status_t shoal_coll_run(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    if (a->type == SHOAL_COLL_SEND || a->type == SHOAL_COLL_RECV) {
        return shoal_p2p_run(comm, a);
    }
    if (SHOAL_UNLIKELY(comm->coll->check_args) && comm->nranks > 1) {
        /* both numbers taken whatever the check says, as a nonblocking call takes them
         * (shoal_coll_plan): a refused call took one here, and a rank that made the same
         * call nonblocking was one ahead for good (the next call a protocol error) */
        uint32_t cseq = comm->seq++, seq = comm->seq++;
        SHOAL_CHECK(shoal_coll_check_args(comm, a, cseq));
        return shoal_coll_run_seq(comm, a, seq);
    }
    return shoal_coll_run_seq(comm, a, comm->seq++);
}

/* A nonblocking call under SHOAL_CHECK_ARGS: the check (sequence number seq - 1), then the
 * call, whole, on the proxy (shoal_coll_plan). */
static shoal_status_t shoal_coll_run_checked(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                             uint32_t seq)
{
    SHOAL_CHECK(shoal_coll_check_args(comm, a, seq - 1));
    return shoal_coll_run_seq(comm, a, seq);
}

/* A row without a plan, run whole on the proxy: alone on its communicator (npeers -1). */
typedef struct {
    shoal_coll_plan_t cp;
    shoal_coll_run_fn_t run;
} shoal_coll_whole_plan_t;

static shoal_status_t shoal_coll_whole_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_coll_whole_plan_t *p = (shoal_coll_whole_plan_t *)plan;
    return p->run(comm, &p->cp.a, p->cp.seq);
}

static shoal_status_t shoal_coll_p2p_whole(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                           uint32_t seq)
{
    (void)seq;
    return shoal_p2p_run(comm, a);
}

shoal_status_t shoal_coll_plan(struct shoal_comm *comm, const shoal_coll_args_t *a, int exclusive,
                               shoal_coll_plan_t **cp_p)
{
    const shoal_coll_algo_row_t *row = NULL;
    shoal_coll_run_fn_t run;
    shoal_coll_whole_plan_t *wp;
    uint32_t seq = 0;

    *cp_p = NULL;
    if (a->type == SHOAL_COLL_SEND || a->type == SHOAL_COLL_RECV) {
        run = shoal_coll_p2p_whole;
    } else if (SHOAL_UNLIKELY(comm->coll->check_args) && comm->nranks > 1) {
        /* The check's exchange and the call, one after the other, alone on the channels: the
         * transports match messages in order, so no other plan may use a channel meanwhile
         * (npeers -1 below); calls that overlapped run one at a time while the knob is on. */
        comm->seq++; /* the check's, as in shoal_coll_run */
        seq = comm->seq++;
        run = shoal_coll_run_checked;
    } else {
        seq = comm->seq++;
        if (comm->nranks == 1) {
            return a->type == SHOAL_COLL_BARRIER ? SHOAL_OK : shoal_coll_local(a);
        }
        if (a->type == SHOAL_COLL_BARRIER) {
            return shoal_barrier_plan(comm, cp_p, a, seq, exclusive);
        } else if (a->count == 0) {
            return SHOAL_OK;
        } else if ((row = shoal_coll_row_for(comm, a, seq)) == NULL) {
            return SHOAL_ERR_INTERNAL;
        } else if (row->plan != NULL) {
            return row->plan(comm, cp_p, a, seq, exclusive);
        } else {
            run = row->run;
        }
    }
    /* The whole call at once: it has the communicator (and its scratch) to itself. */
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*wp), 1, (shoal_coll_plan_t **)&wp));
    wp->cp.base.progress = shoal_coll_whole_progress;
    wp->cp.base.npeers = -1;
    wp->run = run;
    *cp_p = &wp->cp;
    return SHOAL_OK;
}

void shoal_coll_shape_tune(shoal_coll_shape_t *s, const shoal_tune_t *t)
{
    s->chunk = SHOAL_MAX(SHOAL_ALIGN_UP(t->value[SHOAL_TUNE_CHUNK], 64), 4096);
    s->scratch = SHOAL_MAX(4 * s->chunk, SHOAL_ALIGN_UP(shoal_coll_config.rd_max, 64));
    s->shm_oneshot_max = t->value[s->oversub > 1 ? SHOAL_TUNE_SHM_ONESHOT_SHARED
                                                 : SHOAL_TUNE_SHM_ONESHOT_OWN];
    s->shm_window = t->value[SHOAL_TUNE_SHM_WINDOW];
    s->copy_beta = shoal_gbs_to_beta((double)t->value[SHOAL_TUNE_COPY_MBS] / 1e3);
    s->reduce_beta = shoal_gbs_to_beta((double)t->value[SHOAL_TUNE_REDUCE_MBS] / 1e3);
}

#define SHOAL_COLL_AGREE_STEP 0x72000000u /* channel step of the agreement messages */
#define SHOAL_COLL_ALGO_UNKNOWN (-2)      /* rank 0's shoal_config_t.algorithm names none */

typedef struct {
    int64_t algo;
    uint64_t rd_max, hier_segment, shm_direct_min;
    uint64_t check_args; /* the exchange before every call: on all ranks or none */
} shoal_coll_agreed_t;

/* Before a failure that every rank decides alone from the agreement (rank 0's unknown
 * algorithm), every rank waits until all have it: acknowledgements up the agreement's
 * binomial tree to rank 0, then rank 0's release down it. A rank that failed at once sent
 * its peers its failure notice (shoal_comm_set_failed), and a peer that had not taken the
 * agreement yet failed with SHOAL_ERR_PEER_FAILED instead of SHOAL_ERR_INVALID_ARG (the CI's
 * ucx n=8 lazy run: rank 4, the last that rank 0 sends to). Whatever fails here, the caller
 * fails the same way, so errors are only logged. */
static void shoal_coll_agree_settle(struct shoal_comm *comm, uint32_t seq)
{
    int n = comm->nranks, r = comm->rank, top = 1;
    shoal_status_t st = SHOAL_OK;
    uint8_t b = 1;

    while (top < n) {
        top *= 2;
    }
    for (int m = top / 2; m >= 1 && st == SHOAL_OK; m /= 2) { /* the tree's rounds reversed */
        if (r < m && r + m < n) {
            st = shoal_chan_sendrecv(comm, -1, NULL, r + m, &b, 1, seq, SHOAL_COLL_AGREE_STEP + 1);
        } else if (r >= m && r < 2 * m) {
            st = shoal_chan_sendrecv(comm, r - m, &b, -1, NULL, 1, seq, SHOAL_COLL_AGREE_STEP + 1);
        }
    }
    if (st == SHOAL_OK) {
        st = shoal_chan_bcast_small(comm, &b, 1, seq, SHOAL_COLL_AGREE_STEP + 2);
    }
    if (st != SHOAL_OK) {
        shoal_info(COLL, "rank %d: the agreement's settling round: %s", r,
                    shoal_status_name(st));
    }
}

/* Every rank takes rank 0's forced algorithm and the settings of shoal_coll_state_t that
 * decide what a call puts on the wire, down a binomial tree from rank 0 (as src/tune's
 * agreement): set on one rank only (its environment or conf file), they made ranks cut the
 * same call differently (SHOAL_RD_MAX_BYTES: an in-place alltoall's pieces, a protocol
 * error; SHOAL_SHM_DIRECT_MIN: the direct road on one rank, two-shot on the other, both
 * timed out). A rank whose own setting loses says so once. Every size is valid; the
 * algorithm indexes tables, so it is checked. */
static shoal_status_t shoal_coll_agree(struct shoal_comm *comm, shoal_coll_agreed_t *g)
{
    static int warned;
    shoal_coll_agreed_t mine = *g;
    uint32_t seq = comm->seq++;

    SHOAL_CHECK(shoal_chan_bcast_small(comm, g, sizeof(*g), seq, SHOAL_COLL_AGREE_STEP));
    if (g->algo == SHOAL_COLL_ALGO_UNKNOWN) {
        shoal_coll_agree_settle(comm, seq);
        return shoal_comm_set_failed(comm, SHOAL_ERR_INVALID_ARG, 0, "rank 0's "
                                     "shoal_config_t.algorithm names no algorithm (its log says "
                                     "which): every rank's init fails");
    }
    if (g->algo < 0 || g->algo >= SHOAL_ALGO_COUNT) {
        return shoal_comm_set_failed(comm, SHOAL_ERR_PROTOCOL, 0, "rank 0 (%s) sent algorithm "
                                     "%lld, which does not exist", shoal_comm_peer_host(comm, 0),
                                     (long long)g->algo);
    }
    if (memcmp(&mine, g, sizeof(mine)) != 0 &&
        !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
        shoal_warn(COLL, "rank %d: its algorithm settings (SHOAL_ALGO %s, SHOAL_RD_MAX_BYTES %llu, "
                   "SHOAL_HIER_SEGMENT %llu, SHOAL_SHM_DIRECT_MIN %llu, SHOAL_CHECK_ARGS %llu) "
                   "are not rank 0's (%s, %llu, %llu, %llu, %llu): every rank uses rank 0's",
                   comm->rank, shoal_algo_names[mine.algo], (unsigned long long)mine.rd_max,
                   (unsigned long long)mine.hier_segment, (unsigned long long)mine.shm_direct_min,
                   (unsigned long long)mine.check_args, shoal_algo_names[g->algo],
                   (unsigned long long)g->rd_max, (unsigned long long)g->hier_segment,
                   (unsigned long long)g->shm_direct_min, (unsigned long long)g->check_args);
    }
    return SHOAL_OK;
}

shoal_status_t shoal_coll_comm_init(struct shoal_comm *comm)
{
    shoal_coll_agreed_t agreed;
    shoal_coll_state_t *cs = calloc(1, sizeof(*cs));
    const char *forced = comm->cfg.algorithm;

    if (cs == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    comm->coll = cs;
    for (size_t i = 0; i < SHOAL_SELECT_CACHE; i++) {
        cs->sel_cache[i].type = -1;
    }
    cs->algo = shoal_coll_config.algo;
    if (forced != NULL && forced[0] != '\0') {
        cs->algo = -1;
        for (int i = 0; shoal_algo_names[i] != NULL; i++) {
            if (strcasecmp(shoal_algo_names[i], forced) == 0) { /* as SHOAL_ALGO */
                cs->algo = i;
            }
        }
        /* Rank 0's setting is every rank's: an unknown name elsewhere is ignored, and one on
         * rank 0 fails every rank's init through the agreement. A rank that returned here
         * alone left the others an init that succeeded and a first call that waited for it
         * until the timeout. */
        if (cs->algo < 0 && comm->rank != 0) {
            shoal_warn(COLL, "rank %d: unknown algorithm '%s' in shoal_config_t.algorithm: "
                       "ignored, every rank uses rank 0's", comm->rank, forced);
            cs->algo = shoal_coll_config.algo;
        } else if (cs->algo < 0) {
            shoal_error(COLL, "unknown algorithm '%s' in shoal_config_t.algorithm (one of "
                        "SHOAL_ALGO's names): every rank's init fails", forced);
            cs->algo = SHOAL_COLL_ALGO_UNKNOWN;
        }
    }
    SHOAL_CHECK(shoal_tune_comm_agree(comm, &cs->tune));
    agreed = (shoal_coll_agreed_t){.algo = cs->algo, .rd_max = shoal_coll_config.rd_max,
                                   .hier_segment = shoal_coll_config.hier_segment,
                                   .shm_direct_min = shoal_coll_config.shm_direct_min,
                                   .check_args = shoal_coll_config.check_args != 0};
    SHOAL_CHECK(shoal_coll_agree(comm, &agreed));
    cs->algo = (int)agreed.algo;
    cs->rd_max = (size_t)agreed.rd_max;
    cs->hier_segment = (size_t)agreed.hier_segment;
    cs->shm_direct_min = (size_t)agreed.shm_direct_min;
    cs->check_args = agreed.check_args != 0;
    cs->chunk = SHOAL_MAX(SHOAL_ALIGN_UP(cs->tune.value[SHOAL_TUNE_CHUNK], 64), 4096);
    cs->scratch_size = SHOAL_MAX(4 * cs->chunk, SHOAL_ALIGN_UP(cs->rd_max, 64));
    if (comm->nranks > 1) {
        cs->scratch = aligned_alloc(4096, SHOAL_ALIGN_UP(cs->scratch_size, 4096));
        if (cs->scratch == NULL) {
            shoal_error(COLL, "cannot allocate %zu bytes of scratch", cs->scratch_size);
            return SHOAL_ERR_NO_MEMORY;
        }
        /* Fault the pages in now, never on the data path. */
        memset(cs->scratch, 0, cs->scratch_size);
    }
    SHOAL_CHECK(shoal_shmdirect_init(comm));
    shoal_coll_shape_topo(&cs->shape, comm->topo, cs->shm_ok);
    shoal_coll_shape_tune(&cs->shape, &cs->tune);
    /* the model's view of rank 0's settings, not this process's */
    cs->shape.scratch = cs->scratch_size;
    cs->shape.hier_segment = cs->hier_segment;
    shoal_shmdirect_log(comm);
    if (cs->algo == SHOAL_ALGO_SHM && !cs->shm_ok) {
        shoal_warn(COLL, "SHOAL_ALGO=shm needs every rank on one host with the shm transport; "
                   "using the automatic choice");
    }
    return SHOAL_OK;
}

void shoal_coll_comm_fini(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    if (cs == NULL) {
        return;
    }
    shoal_hier_fini(comm);
    shoal_coll_pool_fini(comm);
    shoal_shmdirect_fini(comm);
    free(cs->scratch);
    free(cs->areas);
    free(cs->srcs);
    free(cs->srcs2);
    free(cs);
    comm->coll = NULL;
}
