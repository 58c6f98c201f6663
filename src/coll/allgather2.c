/*
 * Bruck allgather for small messages: ceil(log2 n) steps for any n. Blocks are kept rotated
 * in scratch (slot i holds rank (rank + i) mod n's block); step d = 1, 2, 4, ... sends the
 * first min(d, n - d) slots to rank - d and receives as many from rank + d into slots d.. .
 * A final copy puts them in rank order. Needs nranks * count * dsize <= scratch_size
 * (shoal_bruck_applicable); larger calls use the ring.
 */
#include "coll/coll.h"

#include <string.h>

int shoal_bruck_applicable(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    return bytes <= comm->coll->scratch_size / (size_t)comm->nranks;
}

shoal_status_t shoal_bruck_allgather(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                     uint32_t seq)
{
    int n = comm->nranks, rank = comm->rank;
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    uint8_t *tmp = comm->coll->scratch, *rbuf = a->recvbuf;
    uint32_t step = 0;

    if (!shoal_bruck_applicable(comm, a)) {
        return shoal_ring_allgather(comm, a, seq);
    }
    memcpy(tmp, a->sendbuf, bytes);
    for (int d = 1; d < n; d <<= 1, step++) {
        size_t cnt = (size_t)SHOAL_MIN(d, n - d);
        SHOAL_CHECK(shoal_prim_sendrecv(comm, shoal_mod(rank - d, n), tmp, cnt * bytes,
                                        (rank + d) % n, tmp + (size_t)d * bytes, cnt * bytes,
                                        seq, step, 0));
    }
    /* slot i -> block (rank + i) mod n: two contiguous copies. */
    memcpy(rbuf + (size_t)rank * bytes, tmp, (size_t)(n - rank) * bytes);
    memcpy(rbuf, tmp + (size_t)(n - rank) * bytes, (size_t)rank * bytes);
    return SHOAL_OK;
}
