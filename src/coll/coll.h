/* Collective algorithms. They use channel primitives (core/chan.c), never transports. */
#ifndef SHOAL_COLL_H
#define SHOAL_COLL_H

#include "core/core.h"
#include "reduce/reduce.h"

typedef enum {
    SHOAL_COLL_ALLREDUCE = 0,
    SHOAL_COLL_BROADCAST,
    SHOAL_COLL_REDUCE,
    SHOAL_COLL_ALLGATHER,
    SHOAL_COLL_REDUCE_SCATTER,
    SHOAL_COLL_BARRIER,
    SHOAL_COLL_SEND,
    SHOAL_COLL_RECV,
    SHOAL_COLL_TYPE_COUNT
} shoal_coll_type_t;

typedef enum {
    SHOAL_ALGO_AUTO = 0,
    SHOAL_ALGO_RING,
    SHOAL_ALGO_RD,       /* recursive doubling */
    SHOAL_ALGO_SHM,      /* intra-node direct path through shared areas */
    SHOAL_ALGO_TREE,     /* binomial tree (broadcast, reduce) */
    SHOAL_ALGO_COUNT
} shoal_algo_t;

typedef struct {
    shoal_coll_type_t type;
    const void *sendbuf;
    void *recvbuf;
    size_t count;          /* elements (per rank for allgather/reduce_scatter) */
    shoal_dtype_t dtype;
    shoal_op_t op;
    int root;              /* broadcast/reduce root, send/recv peer */
} shoal_coll_args_t;

/* SHOAL_* variables of the algorithms (coll_config.c). */
typedef struct {
    int algo;              /* SHOAL_ALGO, shoal_algo_t */
    size_t chunk_size;     /* SHOAL_CHUNK_SIZE */
    size_t rd_max;         /* SHOAL_RD_MAX_BYTES */
    size_t tree_max;       /* SHOAL_TREE_MAX_BYTES */
    size_t shm_oneshot_max;/* SHOAL_SHM_ONESHOT_MAX */
    size_t shm_window;     /* SHOAL_SHM_WINDOW */
} shoal_coll_config_t;
extern SHOAL_HIDDEN shoal_coll_config_t shoal_coll_config;
extern SHOAL_HIDDEN const char *const shoal_algo_names[];

/* Per-communicator algorithm state: scratch allocated and faulted in once at init. */
typedef struct shoal_coll_state {
    int algo;              /* forced algorithm or SHOAL_ALGO_AUTO */
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
} shoal_coll_state_t;

#define SHOAL_P2P_STEP 0xffffffffu

/* Selection (select.c). */
SHOAL_HIDDEN shoal_algo_t shoal_coll_select(struct shoal_comm *comm, const shoal_coll_args_t *a);
SHOAL_HIDDEN shoal_status_t shoal_coll_run(struct shoal_comm *comm, const shoal_coll_args_t *a);

/* Algorithms: blocking on the calling thread; seq is the collective's sequence number. */
SHOAL_HIDDEN shoal_status_t shoal_ring_allreduce(struct shoal_comm *comm,
                                                 const shoal_coll_args_t *a, uint32_t seq);
SHOAL_HIDDEN shoal_status_t shoal_rd_allreduce(struct shoal_comm *comm,
                                               const shoal_coll_args_t *a, uint32_t seq);
SHOAL_HIDDEN shoal_status_t shoal_shmdirect_init(struct shoal_comm *comm);
SHOAL_HIDDEN shoal_status_t shoal_shmdirect_allreduce(struct shoal_comm *comm,
                                                      const shoal_coll_args_t *a);
SHOAL_HIDDEN shoal_status_t shoal_ring_reduce_scatter(struct shoal_comm *comm,
                                                      const shoal_coll_args_t *a, uint32_t seq);
SHOAL_HIDDEN shoal_status_t shoal_ring_allgather(struct shoal_comm *comm,
                                                 const shoal_coll_args_t *a, uint32_t seq);
SHOAL_HIDDEN shoal_status_t shoal_bcast_run(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                            uint32_t seq, shoal_algo_t algo);
SHOAL_HIDDEN shoal_status_t shoal_tree_reduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                              uint32_t seq);
SHOAL_HIDDEN shoal_status_t shoal_barrier_run(struct shoal_comm *comm, uint32_t seq);
SHOAL_HIDDEN shoal_status_t shoal_p2p_run(struct shoal_comm *comm, const shoal_coll_args_t *a);

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
/* Element range [off, off+len) of block b when n elements are cut into nblocks. */
static inline void shoal_block_range(size_t n, int nblocks, int b, size_t *off_p, size_t *len_p)
{
    size_t lo = n * (size_t)b / (size_t)nblocks, hi = n * (size_t)(b + 1) / (size_t)nblocks;
    *off_p = lo;
    *len_p = hi - lo;
}
static inline int shoal_mod(int a, int n)
{
    int m = a % n;
    return m < 0 ? m + n : m;
}

#endif
