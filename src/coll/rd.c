/*
 * Recursive doubling AllReduce for small messages: log2(p) exchanges of the whole buffer.
 * Non-power-of-two: the first 2*(n-p) ranks pair up, odd ones hand their data to the even
 * ones and sit out, then get the result back. Each exchange reduces lower-rank data first,
 * so both partners compute the same bits.
 */
#include "coll/coll.h"

#include <string.h>

/* One recursive-doubling pass over count elements at buf (already holding this rank's input);
 * steps are numbered from step0 so that passes over successive pieces never look alike. */
static shoal_status_t shoal_rd_pass(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                    uint8_t *buf, size_t count, uint32_t seq, uint32_t step0)
{
    int n = comm->nranks, rank = comm->rank, p = 1, extra, vrank;
    size_t bytes = count * shoal_dtype_size(a->dtype);
    uint8_t *tmp = comm->coll->scratch;
    uint32_t step = step0;

    while (p * 2 <= n) {
        p *= 2;
    }
    extra = n - p;
    /* Fold: among ranks < 2*extra, odd ranks send to rank-1 and wait for the result. */
    if (rank < 2 * extra) {
        if (rank % 2 == 1) {
            SHOAL_CHECK(shoal_prim_send(comm, rank - 1, buf, bytes, seq, step, 0));
            return shoal_prim_recv(comm, rank - 1, buf, bytes, seq, step0 + 63, 0);
        }
        SHOAL_CHECK(shoal_prim_recv(comm, rank + 1, tmp, bytes, seq, step, 0));
        shoal_reduce2(buf, buf, tmp, count, a->dtype, a->op);
        vrank = rank / 2;
    } else {
        vrank = rank - extra;
    }
    step++;
    for (int mask = 1; mask < p; mask <<= 1, step++) {
        int vpeer = vrank ^ mask;
        int peer = vpeer < extra ? vpeer * 2 : vpeer + extra;
        SHOAL_CHECK(shoal_prim_sendrecv(comm, peer, buf, bytes, peer, tmp, bytes, seq, step, 0));
        if (peer < rank) {
            shoal_reduce2(buf, tmp, buf, count, a->dtype, a->op);
        } else {
            shoal_reduce2(buf, buf, tmp, count, a->dtype, a->op);
        }
    }
    shoal_reduce_avg_finalize(buf, count, a->dtype, a->op, n);
    if (rank < 2 * extra) {
        SHOAL_CHECK(shoal_prim_send(comm, rank + 1, buf, bytes, seq, step0 + 63, 0));
    }
    return SHOAL_OK;
}

/* Messages larger than the scratch buffer (possible when SHOAL_ALGO=rd is forced) go in
 * scratch-sized pieces, each a full recursive doubling of its own. */
shoal_status_t shoal_rd_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                  uint32_t seq)
{
    size_t dsize = shoal_dtype_size(a->dtype);
    size_t piece = SHOAL_MAX(comm->coll->scratch_size / dsize, 1);
    uint8_t *buf = a->recvbuf;
    uint32_t step0 = 0;

    if (a->sendbuf != a->recvbuf) {
        memcpy(buf, a->sendbuf, a->count * dsize);
    }
    for (size_t off = 0; off < a->count; off += piece, step0 += 64) {
        SHOAL_CHECK(shoal_rd_pass(comm, a, buf + off * dsize, SHOAL_MIN(piece, a->count - off),
                                  seq, step0));
    }
    return SHOAL_OK;
}
