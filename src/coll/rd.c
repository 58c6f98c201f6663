/*
 * Recursive doubling AllReduce for small messages: log2(p) exchanges of the whole buffer.
 * Non-power-of-two: the first 2*(n-p) ranks pair up, odd ones hand their data to the even
 * ones and sit out, then get the result back. Each exchange reduces lower-rank data first,
 * so both partners compute the same bits.
 */
#include "coll/coll.h"

#include <string.h>

shoal_status_t shoal_rd_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                  uint32_t seq)
{
    int n = comm->nranks, rank = comm->rank, p = 1, extra, vrank;
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    uint8_t *buf = a->recvbuf, *tmp = comm->coll->scratch;
    uint32_t step = 0;

    while (p * 2 <= n) {
        p *= 2;
    }
    extra = n - p;
    if (a->sendbuf != a->recvbuf) {
        memcpy(buf, a->sendbuf, bytes);
    }
    /* Fold: among ranks < 2*extra, odd ranks send to rank-1 and wait for the result. */
    if (rank < 2 * extra) {
        if (rank % 2 == 1) {
            SHOAL_CHECK(shoal_prim_send(comm, rank - 1, buf, bytes, seq, step, 0));
            return shoal_prim_recv(comm, rank - 1, buf, bytes, seq, 1000, 0);
        }
        SHOAL_CHECK(shoal_prim_recv(comm, rank + 1, tmp, bytes, seq, step, 0));
        shoal_reduce2(buf, buf, tmp, a->count, a->dtype, a->op);
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
            shoal_reduce2(buf, tmp, buf, a->count, a->dtype, a->op);
        } else {
            shoal_reduce2(buf, buf, tmp, a->count, a->dtype, a->op);
        }
    }
    shoal_reduce_avg_finalize(buf, a->count, a->dtype, a->op, n);
    if (rank < 2 * extra) {
        SHOAL_CHECK(shoal_prim_send(comm, rank + 1, buf, bytes, seq, 1000, 0));
    }
    return SHOAL_OK;
}
