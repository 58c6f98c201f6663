/* Collective algorithms. They use channel primitives (core/chan.c), never transports. */
#ifndef SHOAL_COLL_H
#define SHOAL_COLL_H

#include "core/call.h"
#include "core/core.h"
#include "reduce/reduce.h"
#include "topo/topo.h"
#include "tune/tune.h"

typedef enum {
    SHOAL_ALGO_AUTO = 0,
    SHOAL_ALGO_RING,
    SHOAL_ALGO_RD,       /* recursive doubling */
    SHOAL_ALGO_SHM,      /* intra-node direct path through shared areas */
    SHOAL_ALGO_TREE,     /* binomial tree (broadcast, reduce) */
    SHOAL_ALGO_DBTREE,   /* double binary tree AllReduce (tree.c) */
    SHOAL_ALGO_RAB,      /* Rabenseifner AllReduce, recursive-halving reduce-scatter (rab.c) */
    SHOAL_ALGO_HIER,     /* hierarchical AllReduce: intra-host, inter-host, intra-host (hier.c) */
    SHOAL_ALGO_BRUCK,    /* Bruck allgather for small messages (allgather2.c) */
    SHOAL_ALGO_PAIRWISE, /* pairwise-exchange alltoall (alltoall.c) */
    SHOAL_ALGO_PTREE,    /* pipelined binary-tree broadcast (bcast2.c) */
    SHOAL_ALGO_COUNT
} shoal_algo_t;


/* SHOAL_SHM_ONESHOT_MAX=0: one-shot up to these sizes, with a core per rank / ranks sharing
 * cores (perf/select_check.sh on 2 cores: two-shot wins from 4 KiB on 2 ranks, where a
 * flag costs a cache-line transfer; from 32 KiB on 3-4 ranks, where it costs a switch). */
#define SHOAL_SHM_ONESHOT_OWN_CORE ((size_t)2048)
#define SHOAL_SHM_ONESHOT_SHARED_CORE ((size_t)16384)

/* SHOAL_* variables of the algorithms (coll_config.c). */
typedef struct {
    int algo;              /* SHOAL_ALGO, shoal_algo_t */
    size_t chunk_size;     /* SHOAL_CHUNK_SIZE */
    size_t rd_max;         /* SHOAL_RD_MAX_BYTES */
    size_t shm_ll_max;     /* SHOAL_SHM_LL_MAX */
    size_t shm_oneshot_max;/* SHOAL_SHM_ONESHOT_MAX */
    size_t shm_window;     /* SHOAL_SHM_WINDOW */
    size_t hier_segment;   /* SHOAL_HIER_SEGMENT */
    size_t shm_direct_min;    /* SHOAL_SHM_DIRECT_MIN */
    int shm_prefetchw;     /* SHOAL_SHM_PREFETCHW */
    int check_args;        /* SHOAL_CHECK_ARGS */
} shoal_coll_config_t;
extern SHOAL_HIDDEN shoal_coll_config_t shoal_coll_config;
extern SHOAL_HIDDEN const char *const shoal_algo_names[];

/* What the cost model knows of a communicator (shape.c builds it at init from the topology,
 * src/topo's shoal_topo_comm_t; shoal_info -t from a topology file). It is identical on every
 * rank, so every rank picks the same algorithm. */
typedef struct {
    int nranks;
    int nhosts;
    int max_ppn;           /* most ranks on one host */
    int shm_direct;        /* the intra-node shared-memory path is available */
    double oversub;        /* ranks per core on the busiest host, >= 1 */
    shoal_link_t intra;    /* channels between ranks of one host */
    shoal_link_t inter;    /* channels between hosts (one rank pair alone on the NIC) */
    int ring_share;        /* ring edges leaving the busiest host (0: one host) */
    double rd_alpha_us;    /* recursive doubling: sum over its steps of the step latency */
    double rd_beta_us;     /* ... and of the per-byte time (NIC sharing included) */
    double reduce_beta;    /* us per byte of a two-input reduction */
    double copy_beta;      /* us per byte of a memory copy */
    size_t chunk;          /* pipeline chunk */
    size_t scratch;        /* scratch bytes (rd and bruck need the message to fit) */
    size_t shm_oneshot_max;
    size_t shm_window;     /* two-shot window the cost model assumes */
    size_t hier_segment;   /* largest pipeline segment of the hierarchical AllReduce */
} shoal_coll_shape_t;

/* Per-communicator algorithm state: scratch allocated and faulted in once at init. */
#define SHOAL_SELECT_CACHE 64 /* entries of the per-communicator choice cache */
#define SHOAL_PLAN_POOL 8     /* free plan scratch buffers kept per communicator */

typedef struct shoal_coll_state {
    int algo;              /* forced algorithm or SHOAL_ALGO_AUTO: rank 0's */
    /* Settings of shoal_coll_config that decide what a call puts on the wire, rank 0's
     * (select.c's shoal_coll_agree), as src/tune's sizes are: SHOAL_RD_MAX_BYTES (scratch:
     * rd, Bruck, Rabenseifner and in-place alltoall pieces), SHOAL_HIER_SEGMENT,
     * SHOAL_SHM_DIRECT_MIN (the intra-node protocol). */
    size_t rd_max;
    size_t hier_segment;
    size_t shm_direct_min;
    int check_args;        /* SHOAL_CHECK_ARGS, rank 0's: calls compare their arguments */
    shoal_tune_t tune;     /* sizes and limits: rank 0's, the same on every rank (src/tune) */
    size_t chunk;          /* bytes per pipeline chunk, a multiple of 64 */
    uint8_t *scratch;      /* 4 * chunk, also >= rd_max */
    size_t scratch_size;
    /* shm direct path */
    int shm_ok;
    uint8_t **areas;       /* [local_size] shared areas */
    size_t area_size;
    size_t window;         /* two-shot window bytes */
    uint64_t gen;          /* shm direct generation */
    void **srcs;           /* [local_size] reduce sources, preallocated */
    void **srcs2;          /* [local_size] scratch pointers for shoal_reduce_n_pieces */
    int peer_mem;          /* the transport reaches peers' buffers (direct path) */
    int ll_prefetchw;      /* LL: prefetch the next call's lines for writing (SHOAL_SHM_PREFETCHW) */
    int shm_logged;        /* direct-path roads already logged (bit 0 mem, bit 1 cma) */
    uint8_t *cma_scratch;  /* single-copy chunks of the peers' inputs, on first use */
    size_t cma_scratch_size;
    uint64_t shm_issued;   /* nonblocking intra-node AllReduces built (their turns) ... */
    uint64_t shm_served;   /* ... and released: the one whose turn == shm_served may start */
    /* the cost model's view of comm->topo (src/topo: ring order, hosts, links) */
    shoal_coll_shape_t shape;
    uint64_t logged[SHOAL_COLL_TYPE_COUNT]; /* size buckets whose choice was logged */
    /* Choices already made, keyed by (collective, bytes): applicability depends only on
     * the communicator and the size, so a hit skips the cost table on the hot path, and the
     * table scan for the choice's row (select.c's shoal_coll_algo_row_t; NULL: none). */
    struct {
        size_t bytes;
        int8_t type;           /* -1: empty */
        uint8_t algo;
        const void *row;
    } sel_cache[SHOAL_SELECT_CACHE];
    struct shoal_hier_map *hier; /* hier.c: hosts and their ranks, built on first use */
    /* Scratch of plans in flight on the proxy (scratch_size bytes each, faulted in once),
     * taken and returned by the ticket holder only (plan.c). */
    uint8_t *pool[SHOAL_PLAN_POOL];
    int npool;
    /* The memory of a blocking call's plan, kept between calls (plan.c: glibc's calloc skips
     * its thread cache, about 450 instructions a call with the free); ticket holder only. */
    void *plan_mem;
    size_t plan_mem_size;
    int plan_mem_busy;
} shoal_coll_state_t;

/* Selection (select.c): minimum of the cost table's cost_us for the call's collective and
 * size; SHOAL_ALGO forces where it applies. */
SHOAL_HIDDEN shoal_algo_t shoal_coll_select(struct shoal_comm *comm, const shoal_coll_args_t *a);
/* The same choice from a shape alone (shoal_info -t); cost_p, if not NULL, gets its cost. */
SHOAL_HIDDEN shoal_algo_t shoal_coll_select_shape(const shoal_coll_shape_t *s,
                                                  shoal_coll_type_t type, size_t bytes,
                                                  int forced, double *cost_p);
/* Row i of the algorithm table (shoal_info -t): its algorithm, collective and whether it has
 * a step-wise plan; 0 past the end. */
SHOAL_HIDDEN int shoal_coll_table_row(size_t i, shoal_algo_t *algo_p, shoal_coll_type_t *coll_p,
                                      int *stepwise_p);
SHOAL_HIDDEN const char *shoal_coll_type_name(shoal_coll_type_t type);
/* Model cost of one algorithm (negative: not applicable). */
SHOAL_HIDDEN double shoal_coll_cost(const shoal_coll_shape_t *s, shoal_coll_type_t type,
                                    shoal_algo_t algo, size_t bytes);
/* Shape from a host layout alone (shoal_info -t, tests; shape.c): links intra/inter (zero
 * beta: the defaults), the settings of coll's config table. */
SHOAL_HIDDEN void shoal_coll_shape_build(shoal_coll_shape_t *s, int n, const int *host_of,
                                         const int *ring_order, const shoal_link_t *intra,
                                         const shoal_link_t *inter, int shm_direct,
                                         int ncores);
/* Shape of a communicator's topology (comm->topo), plus its tuning file's memory rates. */
SHOAL_HIDDEN void shoal_coll_shape_topo(shoal_coll_shape_t *s, const shoal_topo_comm_t *tc,
                                        int shm_direct);
/* The shape's sizes, limits and memory rates from the communicator's settings (src/tune). */
SHOAL_HIDDEN void shoal_coll_shape_tune(shoal_coll_shape_t *s, const shoal_tune_t *t);
SHOAL_HIDDEN shoal_status_t shoal_coll_run(struct shoal_comm *comm, const shoal_coll_args_t *a);
/* A communicator's algorithm state (scratch, shm direct path, the cost model's shape of
 * comm->topo, which must be set); called by the assembly (src/api/assemble.c) after
 * shoal_topo_comm_init. fini is safe after a failed or partial init. */
SHOAL_HIDDEN shoal_status_t shoal_coll_comm_init(struct shoal_comm *comm);
SHOAL_HIDDEN void shoal_coll_comm_fini(struct shoal_comm *comm);

/* ---- plans (plan.c): collectives the progress engine advances step by step ----
 * A row of the table (select.c) has a plan builder (core.h's plans: the proxy advances
 * several at a time, a blocking call drives one on its thread: shoal_coll_plan_run) or,
 * for the algorithms not yet converted, a blocking run. A plan owns a copy of the arguments
 * and its scratch: several plans of one communicator may be in flight. */
typedef struct shoal_coll_plan shoal_coll_plan_t;
struct shoal_coll_plan {
    shoal_plan_t base;     /* progress: the algorithm's; release: shoal_coll_plan_release */
    shoal_coll_args_t a;
    uint32_t seq;
    size_t dsize;
    uint8_t *scratch;      /* comm->coll->scratch (blocking) or a pool buffer (own_scratch) */
    int own_scratch;
    /* api.c: called once with the outcome before the plan is freed (metering), or NULL */
    void (*on_done)(struct shoal_comm *comm, shoal_coll_plan_t *cp, shoal_status_t st);
    uint64_t t0;
};
/* Builds the plan of one algorithm: *cp_p is allocated zeroed, size bytes (>= sizeof
 * shoal_coll_plan_t) and filled in except base.progress and base.peers, which the builder
 * sets. Scratch: the communicator's when exclusive (the caller holds the ticket and no other
 * plan is in flight), else one from the pool. A plan that never touches scratch passes
 * exclusive 1 whatever the call (the communicator's pointer, no pool buffer taken). */
typedef shoal_status_t (*shoal_coll_run_fn_t)(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                              uint32_t seq);
SHOAL_HIDDEN shoal_status_t shoal_coll_plan_alloc(struct shoal_comm *comm,
                                                  const shoal_coll_args_t *a, uint32_t seq,
                                                  size_t size, int exclusive,
                                                  shoal_coll_plan_t **cp_p);
SHOAL_HIDDEN void shoal_coll_plan_release(struct shoal_comm *comm, shoal_plan_t *plan,
                                          shoal_status_t st);
SHOAL_HIDDEN void shoal_coll_pool_fini(struct shoal_comm *comm);
/* The plan of a call (issue order: takes the sequence number): selects the algorithm from
 * the table; one without a plan builder becomes a plan that runs it whole, alone on the
 * communicator. *cp_p NULL: nothing left to do (one rank, count 0), status returned. */
SHOAL_HIDDEN shoal_status_t shoal_coll_plan(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                            int exclusive, shoal_coll_plan_t **cp_p);
/* Step-wise plan builders (ring.c, rd.c, tree.c, rab.c, allgather2.c, alltoall.c, others.c). */
SHOAL_HIDDEN shoal_status_t shoal_ring_allreduce_plan(struct shoal_comm *comm,
                                                      shoal_coll_plan_t **cp_p,
                                                      const shoal_coll_args_t *a, uint32_t seq,
                                                      int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_ring_reduce_scatter_plan(struct shoal_comm *comm,
                                                           shoal_coll_plan_t **cp_p,
                                                           const shoal_coll_args_t *a,
                                                           uint32_t seq, int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_ring_allgather_plan(struct shoal_comm *comm,
                                                      shoal_coll_plan_t **cp_p,
                                                      const shoal_coll_args_t *a, uint32_t seq,
                                                      int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_rd_allreduce_plan(struct shoal_comm *comm,
                                                    shoal_coll_plan_t **cp_p,
                                                    const shoal_coll_args_t *a, uint32_t seq,
                                                    int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_bruck_allgather_plan(struct shoal_comm *comm,
                                                       shoal_coll_plan_t **cp_p,
                                                       const shoal_coll_args_t *a, uint32_t seq,
                                                       int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_tree_reduce_plan(struct shoal_comm *comm,
                                                   shoal_coll_plan_t **cp_p,
                                                   const shoal_coll_args_t *a, uint32_t seq,
                                                   int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_dbtree_allreduce_plan(struct shoal_comm *comm,
                                                        shoal_coll_plan_t **cp_p,
                                                        const shoal_coll_args_t *a,
                                                        uint32_t seq, int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_rab_allreduce_plan(struct shoal_comm *comm,
                                                     shoal_coll_plan_t **cp_p,
                                                     const shoal_coll_args_t *a, uint32_t seq,
                                                     int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_barrier_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                               const shoal_coll_args_t *a, uint32_t seq,
                                               int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_pairwise_alltoall_plan(struct shoal_comm *comm,
                                                         shoal_coll_plan_t **cp_p,
                                                         const shoal_coll_args_t *a,
                                                         uint32_t seq, int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_chain_bcast_plan(struct shoal_comm *comm,
                                                   shoal_coll_plan_t **cp_p,
                                                   const shoal_coll_args_t *a, uint32_t seq,
                                                   int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_tree_bcast_plan(struct shoal_comm *comm,
                                                  shoal_coll_plan_t **cp_p,
                                                  const shoal_coll_args_t *a, uint32_t seq,
                                                  int exclusive);
typedef shoal_status_t (*shoal_coll_plan_build_t)(struct shoal_comm *comm,
                                                  shoal_coll_plan_t **cp_p,
                                                  const shoal_coll_args_t *a, uint32_t seq,
                                                  int exclusive);
/* Runs an algorithm's plan on the calling thread (a blocking call): built with the
 * communicator's scratch, driven to completion, released. */
SHOAL_HIDDEN shoal_status_t shoal_coll_plan_run(struct shoal_comm *comm,
                                                shoal_coll_plan_build_t build,
                                                const shoal_coll_args_t *a, uint32_t seq);
/* Adds peer to the channels the plan lists (base.peers, once each); past SHOAL_PLAN_PEERS
 * the plan lists none (npeers -1): it still advances step by step, but alone. */
SHOAL_HIDDEN void shoal_coll_plan_peer(shoal_coll_plan_t *cp, int peer);
/* One exchange step of a plan: the send to `to` and the receive from `from` (either absent
 * when < 0) are posted on the first call, then tested without blocking: SHOAL_OK once both
 * are done (the next call posts a new exchange), SHOAL_IN_PROGRESS (wait_peer set), or the
 * error that failed the communicator. */
typedef struct {
    int posted;
    shoal_tl_req_t sreq, rreq;
} shoal_coll_xchg_t;
SHOAL_HIDDEN shoal_status_t shoal_coll_xchg(struct shoal_comm *comm, shoal_coll_plan_t *cp,
                                            shoal_coll_xchg_t *x, int to, const void *sbuf,
                                            size_t slen, int from, void *rbuf, size_t rlen,
                                            uint32_t step, uint32_t chunk);

/* Blocking entry points (on the calling thread): the intra-node shm path (a row with both: its
 * blocking run drives its plan's steps), point-to-point. */
SHOAL_HIDDEN shoal_status_t shoal_shmdirect_init(struct shoal_comm *comm);
SHOAL_HIDDEN void shoal_shmdirect_log(struct shoal_comm *comm); /* INFO: its limits */
SHOAL_HIDDEN void shoal_shmdirect_fini(struct shoal_comm *comm);
SHOAL_HIDDEN shoal_status_t shoal_shmdirect_allreduce(struct shoal_comm *comm,
                                                      const shoal_coll_args_t *a);
/* The same call as a step-wise plan (nonblocking calls; the blocking entry above drives the
 * same steps with a futex sleep as its idle step). */
SHOAL_HIDDEN shoal_status_t shoal_shmdirect_allreduce_plan(struct shoal_comm *comm,
                                                           shoal_coll_plan_t **cp_p,
                                                           const shoal_coll_args_t *a,
                                                           uint32_t seq, int exclusive);
SHOAL_HIDDEN shoal_status_t shoal_p2p_run(struct shoal_comm *comm, const shoal_coll_args_t *a);
/* One communicator's host sends and receives of a group (ops[i].type SEND or RECV,
 * ops[i].root the peer); status is set by shoal_p2p_run_batches. */
typedef struct {
    struct shoal_comm *comm;
    const shoal_coll_args_t *ops;
    int n;
    shoal_status_t status;
} shoal_p2p_batch_t;
/* Runs nb batches as one: every message of every batch is posted before any wait, and the
 * wait progresses every communicator until each batch is done or its communicator failed
 * (its own timeout, abort, peers), so the messages may come in any order on either side and
 * across the communicators (a rank may post communicator A's first, its peer B's). The caller
 * holds each communicator's ticket, as for shoal_p2p_run. Returns the first failure. */
SHOAL_HIDDEN shoal_status_t shoal_p2p_run_batches(shoal_p2p_batch_t *b, int nb);

/* Algorithms of tree.c, rab.c, hier.c, alltoall.c, allgather2.c, bcast2.c, rs2.c. Each
 * *_applicable(comm, a) says whether the algorithm can run this call (1) or not (0: the
 * dispatcher must pick another one); all are deterministic and handle any rank count. */
typedef struct {
    int parent;            /* -1 at the root */
    int child[2];          /* -1 where absent */
} shoal_tree_node_t;
/* NCCL-style double binary tree: t[0] is an in-order binary tree rooted at rank 0, t[1] its
 * mirror (even n) or shift by one (odd n), so that most interior nodes of one are leaves of
 * the other. */
SHOAL_HIDDEN void shoal_dbtree_build(int n, int rank, shoal_tree_node_t t[2]);
/* Hierarchical AllReduce: any host layout (uneven ranks per host included); applicable
 * while a host holds at most SHOAL_HIER_MAX_LOCAL ranks. */
#define SHOAL_HIER_MAX_LOCAL 64
/* Bytes per pipeline segment of a hierarchical AllReduce of total bytes (hier.c, and its
 * cost in algos_cost.c): at most cap (SHOAL_HIER_SEGMENT, 4 KiB or more), else an eighth of
 * the buffer (a pipeline of 8) but not under 64 KiB; a multiple of 64. */
static inline size_t shoal_hier_seg_bytes(size_t total, size_t cap)
{
    size_t seg = SHOAL_MIN(SHOAL_MAX(cap, 4096), SHOAL_MAX(total / 8, (size_t)64 * 1024));
    return SHOAL_ALIGN_UP(seg, 64);
}
SHOAL_HIDDEN int shoal_hier_applicable(struct shoal_comm *comm, const shoal_coll_args_t *a);
/* As a plan (the ring's plan where it does not apply). */
SHOAL_HIDDEN shoal_status_t shoal_hier_allreduce_plan(struct shoal_comm *comm,
                                                      shoal_coll_plan_t **cp_p,
                                                      const shoal_coll_args_t *a, uint32_t seq,
                                                      int exclusive);
SHOAL_HIDDEN void shoal_hier_fini(struct shoal_comm *comm);
/* Bruck allgather: needs nranks * count * dsize <= scratch_size. */
SHOAL_HIDDEN int shoal_bruck_applicable(struct shoal_comm *comm, const shoal_coll_args_t *a);
/* Pipelined binary-tree broadcast (chunks of comm->coll->chunk), as a plan (bcast2.c). */
SHOAL_HIDDEN shoal_status_t shoal_ptree_bcast_plan(struct shoal_comm *comm,
                                                   shoal_coll_plan_t **cp_p,
                                                   const shoal_coll_args_t *a, uint32_t seq,
                                                   int exclusive);
/* Recursive-halving reduce-scatter: power-of-two nranks only; as a plan (rs2.c: the ring's
 * plan where it does not apply). */
SHOAL_HIDDEN int shoal_rh_reduce_scatter_applicable(struct shoal_comm *comm,
                                                    const shoal_coll_args_t *a);
SHOAL_HIDDEN shoal_status_t shoal_rh_reduce_scatter_plan(struct shoal_comm *comm,
                                                         shoal_coll_plan_t **cp_p,
                                                         const shoal_coll_args_t *a,
                                                         uint32_t seq, int exclusive);
/* Cost hints for the selection table (algos_cost.c): modelled us, negative = cannot run. */
SHOAL_HIDDEN double shoal_dbtree_ar_cost(const shoal_coll_shape_t *s, size_t bytes);
SHOAL_HIDDEN double shoal_rab_ar_cost(const shoal_coll_shape_t *s, size_t bytes);
SHOAL_HIDDEN double shoal_hier_ar_cost(const shoal_coll_shape_t *s, size_t bytes);
SHOAL_HIDDEN double shoal_bruck_ag_cost(const shoal_coll_shape_t *s, size_t bytes);
SHOAL_HIDDEN double shoal_pairwise_a2a_cost(const shoal_coll_shape_t *s, size_t bytes);
SHOAL_HIDDEN double shoal_tree_bcast_cost(const shoal_coll_shape_t *s, size_t bytes);
SHOAL_HIDDEN double shoal_chain_bcast_cost(const shoal_coll_shape_t *s, size_t bytes);
SHOAL_HIDDEN double shoal_ptree_bcast_cost(const shoal_coll_shape_t *s, size_t bytes);
SHOAL_HIDDEN double shoal_rh_rs_cost(const shoal_coll_shape_t *s, size_t bytes);

/* Primitive helpers (prims.c). */
/* One send and one receive at once, wait for both. */
SHOAL_HIDDEN shoal_status_t shoal_prim_sendrecv(struct shoal_comm *comm, int to, const void *sbuf,
                                                size_t slen, int from, void *rbuf, size_t rlen,
                                                uint32_t seq, uint32_t step, uint32_t chunk);
SHOAL_HIDDEN shoal_status_t shoal_prim_send(struct shoal_comm *comm, int to, const void *buf,
                                            size_t len, uint32_t seq, uint32_t step,
                                            uint32_t chunk);
SHOAL_HIDDEN shoal_status_t shoal_prim_recv(struct shoal_comm *comm, int from, void *buf,
                                            size_t len, uint32_t seq, uint32_t step,
                                            uint32_t chunk);
static inline int shoal_mod(int a, int n)
{
    int m = a % n;
    return m < 0 ? m + n : m;
}
/* Recursive doubling / halving on n = p + extra ranks (p a power of two): the ranks below
 * 2*extra fold in pairs and the even one of each pair takes part as virtual rank r/2, the
 * ranks from 2*extra on as r - extra. The real rank of virtual rank v (rd.c, rab.c, shape.c). */
static inline int shoal_rd_real_rank(int v, int extra)
{
    return v < extra ? v * 2 : v + extra;
}

/* Cost-model terms shared by the AllReduce rows (select.c, algos_cost.c), measured with
 * perf/select_check.sh on a 2-core VM:
 * - a step of an algorithm (send, receive, wake the peer) costs 1.5 ping-pong latencies, and
 *   when ranks outnumber cores every step also waits for the ranks to be scheduled in turn:
 *   about one more latency per rank per core (ring at 3 and 4 ranks on 2 cores);
 * - the reduction kernels run ~40 GB/s on cache-resident messages, ~8 GB/s from memory, where
 *   s->reduce_beta is the 4 GB/s conservative figure; cores are shared when oversubscribed. */
static inline double shoal_coll_step_us(const shoal_coll_shape_t *s, double alpha)
{
    return alpha * (1.5 + (s->oversub > 1 ? s->oversub : 0));
}

static inline double shoal_coll_reduce_us(const shoal_coll_shape_t *s, double bytes, size_t msg)
{
    return bytes * s->reduce_beta * (msg <= ((size_t)1 << 20) ? 0.1 : 0.5) * s->oversub;
}

/* One pass reducing k inputs of bytes each into one output (shoal_reduce_n): the kernels
 * are bound by memory traffic, k reads and a write against the two-input kernel's three
 * (src/reduce/reduce_bench: reduce_n of 6 inputs moves 31 GB/s, reduce2 36 GB/s). */
static inline double shoal_coll_reduce_n_us(const shoal_coll_shape_t *s, double k, double bytes,
                                            size_t msg)
{
    return shoal_coll_reduce_us(s, (k + 1) / 3 * bytes, msg);
}

/* Memory copies of a core, with the same cache-resident / from-memory factors. */
static inline double shoal_coll_copy_us(const shoal_coll_shape_t *s, double bytes, size_t msg)
{
    return bytes * s->copy_beta * (msg <= ((size_t)1 << 20) ? 0.1 : 0.5) * s->oversub;
}

/* The per-byte time of a channel algorithm whose busiest rank moves `moved` bytes through
 * the channels (sent plus received), link_us being what the links alone would take. Across
 * hosts (or on one host over another transport) the links. On one host with the shm
 * transport (shm_direct) the channels are its rings: every byte sent is copied into a ring
 * by the sender's core and out of it by the receiver's, so the rank's own core copies
 * `moved` bytes (while the intra-node AllReduce reads the peers' areas in place:
 * shoal_coll_cost_shm_ar), and the link's measured rate bounds it too. */
static inline double shoal_coll_xfer_us(const shoal_coll_shape_t *s, double link_us, double moved,
                                        size_t msg)
{
    if (!s->shm_direct) {
        return link_us;
    }
    return SHOAL_MAX(link_us, shoal_coll_copy_us(s, moved, msg));
}

#endif
