/*
 * Pairwise-exchange alltoall: n - 1 steps; in step k every rank swaps blocks with
 * peer = (k - rank) mod n (a perfect matching per step, so each sendrecv is symmetric; the
 * rank paired with itself copies its own block). Out of place, blocks go buffer to buffer in
 * one message each. In place (sendbuf == recvbuf), the swap goes through scratch in pieces:
 * send piece p of my block for the peer, receive the peer's piece p, then copy it in.
 */
#include "coll/coll.h"

#include <string.h>

static shoal_status_t shoal_pairwise_inplace(struct shoal_comm *comm, uint8_t *blk, size_t bytes,
                                             int peer, uint32_t seq, uint32_t step)
{
    size_t P = comm->coll->scratch_size;
    uint32_t piece = 0;

    for (size_t o = 0; o < bytes; o += P, piece++) {
        size_t l = SHOAL_MIN(P, bytes - o);
        SHOAL_CHECK(shoal_prim_sendrecv(comm, peer, blk + o, l, peer, comm->coll->scratch, l, seq,
                                        step, piece));
        memcpy(blk + o, comm->coll->scratch, l);
    }
    return SHOAL_OK;
}

shoal_status_t shoal_pairwise_alltoall(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                       uint32_t seq)
{
    int n = comm->nranks, rank = comm->rank;
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    const uint8_t *sbuf = a->sendbuf;
    uint8_t *rbuf = a->recvbuf;
    int inplace = a->sendbuf == a->recvbuf;

    for (int k = 0; k < n; k++) {
        int peer = shoal_mod(k - rank, n);
        size_t po = (size_t)peer * bytes;
        if (peer == rank) {
            if (!inplace) {
                memcpy(rbuf + po, sbuf + po, bytes);
            }
        } else if (inplace) {
            SHOAL_CHECK(shoal_pairwise_inplace(comm, rbuf + po, bytes, peer, seq, (uint32_t)k));
        } else {
            SHOAL_CHECK(shoal_prim_sendrecv(comm, peer, sbuf + po, bytes, peer, rbuf + po, bytes,
                                            seq, (uint32_t)k, 0));
        }
    }
    return SHOAL_OK;
}
