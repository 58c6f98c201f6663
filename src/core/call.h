/* A collective call as the layers that carry one see it: the public API builds it (src/api),
 * the CUDA layer stages it (src/cuda), the algorithms run it (src/coll). Plain data, below
 * all three so that none of them needs another's header for it. */
#ifndef SHOAL_CALL_H
#define SHOAL_CALL_H

#include "shoal.h"

#include <stddef.h>

typedef enum {
    SHOAL_COLL_ALLREDUCE = 0,
    SHOAL_COLL_BROADCAST,
    SHOAL_COLL_REDUCE,
    SHOAL_COLL_ALLGATHER,
    SHOAL_COLL_REDUCE_SCATTER,
    SHOAL_COLL_BARRIER,
    SHOAL_COLL_SEND,
    SHOAL_COLL_RECV,
    SHOAL_COLL_ALLTOALL,   /* count elements per peer block */
    SHOAL_COLL_TYPE_COUNT
} shoal_coll_type_t;

typedef struct {
    shoal_coll_type_t type;
    const void *sendbuf;
    void *recvbuf;
    size_t count;          /* elements (per rank for allgather/reduce_scatter) */
    shoal_dtype_t dtype;
    shoal_op_t op;
    int root;              /* broadcast/reduce root, send/recv peer */
} shoal_coll_args_t;

/* The step of a point-to-point call's messages (send/recv and the CUDA layer's staged
 * ones): the channel matches them by (seq, step, chunk) like an algorithm's steps. */
#define SHOAL_P2P_STEP 0xffffffffu

/* Element range [off, off+len) of block b when n elements are cut into nblocks. */
static inline void shoal_block_range(size_t n, int nblocks, int b, size_t *off_p, size_t *len_p)
{
    size_t lo = n * (size_t)b / (size_t)nblocks, hi = n * (size_t)(b + 1) / (size_t)nblocks;
    *off_p = lo;
    *len_p = hi - lo;
}

#endif
