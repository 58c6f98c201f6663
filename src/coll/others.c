/* Broadcast (binomial tree / pipelined chain), reduce (chunked binomial tree), barrier
 * (dissemination) and point-to-point. */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_CHAIN_DEPTH 4

/* Binomial tree rooted at root over virtual ranks v = rank - root. The sends to the children
 * are all posted, then waited for together (one blocking send after the other made the root
 * pay a full wait per child: 2-3x slower on TCP at 3-4 ranks). */
static shoal_status_t shoal_bcast_tree(struct shoal_comm *comm, uint8_t *buf, size_t bytes,
                                       int root, uint32_t seq)
{
    int n = comm->nranks, v = shoal_mod(comm->rank - root, n), mask = 1, k = 0;
    shoal_tl_req_t reqs[32], *rp[32];
    int peers[32];

    while (mask < n) {
        if (v & mask) {
            SHOAL_CHECK(shoal_prim_recv(comm, shoal_mod(v - mask + root, n), buf, bytes, seq, 0,
                                        0));
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (v + mask < n) {
            peers[k] = shoal_mod(v + mask + root, n);
            rp[k] = &reqs[k];
            SHOAL_CHECK(shoal_chan_isend(comm, peers[k], buf, bytes, seq, 0, 0, &reqs[k]));
            k++;
        }
    }
    return k > 0 ? shoal_chan_waitall(comm, rp, peers, k) : SHOAL_OK;
}

/* Chain root -> root+1 -> ... in chunks; each rank forwards chunk c while chunks c+1.. are
 * still arriving (up to SHOAL_CHAIN_DEPTH receives posted ahead). */
static shoal_status_t shoal_bcast_chain(struct shoal_comm *comm, uint8_t *buf, size_t bytes,
                                        int root, uint32_t seq)
{
    int n = comm->nranks, v = shoal_mod(comm->rank - root, n);
    int prev = shoal_mod(comm->rank - 1, n), next = shoal_mod(comm->rank + 1, n);
    size_t chunk = comm->coll->chunk, nchunks = (bytes + chunk - 1) / chunk;
    shoal_tl_req_t rreq[SHOAL_CHAIN_DEPTH], sreq[SHOAL_CHAIN_DEPTH];
    size_t posted = 0;

    for (size_t c = 0; c < nchunks; c++) {
        size_t off = c * chunk, len = SHOAL_MIN(chunk, bytes - off);
        shoal_tl_req_t *reqs[1];
        int slot = (int)(c % SHOAL_CHAIN_DEPTH);
        if (v != 0) {
            while (posted < nchunks && posted < c + SHOAL_CHAIN_DEPTH) {
                size_t po = posted * chunk;
                SHOAL_CHECK(shoal_chan_irecv(comm, prev, buf + po, SHOAL_MIN(chunk, bytes - po),
                                             seq, 0, (uint32_t)posted,
                                             &rreq[posted % SHOAL_CHAIN_DEPTH]));
                posted++;
            }
            reqs[0] = &rreq[slot];
            SHOAL_CHECK(shoal_chan_waitall(comm, reqs, &prev, 1));
        }
        if (v != n - 1) {
            if (c >= SHOAL_CHAIN_DEPTH) {
                reqs[0] = &sreq[slot];
                SHOAL_CHECK(shoal_chan_waitall(comm, reqs, &next, 1));
            }
            SHOAL_CHECK(shoal_chan_isend(comm, next, buf + off, len, seq, 0, (uint32_t)c,
                                         &sreq[slot]));
        }
    }
    if (v != n - 1) {
        shoal_tl_req_t *reqs[SHOAL_CHAIN_DEPTH];
        int peers[SHOAL_CHAIN_DEPTH], k = 0;
        for (size_t c = nchunks > SHOAL_CHAIN_DEPTH ? nchunks - SHOAL_CHAIN_DEPTH : 0;
             c < nchunks; c++, k++) {
            reqs[k] = &sreq[c % SHOAL_CHAIN_DEPTH];
            peers[k] = next;
        }
        SHOAL_CHECK(shoal_chan_waitall(comm, reqs, peers, k));
    }
    return SHOAL_OK;
}

shoal_status_t shoal_bcast_run(struct shoal_comm *comm, const shoal_coll_args_t *a, uint32_t seq,
                               shoal_algo_t algo)
{
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    if (comm->rank == a->root && a->sendbuf != a->recvbuf) {
        memcpy(a->recvbuf, a->sendbuf, bytes);
    }
    if (algo == SHOAL_ALGO_TREE) {
        return shoal_bcast_tree(comm, a->recvbuf, bytes, a->root, seq);
    }
    return shoal_bcast_chain(comm, a->recvbuf, bytes, a->root, seq);
}

/* Binomial tree reduce, chunk by chunk. Children are combined in a fixed order, so the result
 * is deterministic. Non-roots accumulate in scratch: their recvbuf is not significant. */
shoal_status_t shoal_tree_reduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                 uint32_t seq)
{
    int n = comm->nranks, v = shoal_mod(comm->rank - a->root, n), parent = -1;
    size_t dsize = shoal_dtype_size(a->dtype);
    size_t celems = SHOAL_MAX(comm->coll->chunk / dsize, 1);
    uint8_t *tmp = comm->coll->scratch, *accbuf = comm->coll->scratch + comm->coll->chunk;
    int top = 1;

    while (top < n && (v & top) == 0) {
        top <<= 1;
    }
    if (v != 0) {
        parent = shoal_mod(v - top + a->root, n);
    }
    uint32_t c = 0;
    for (size_t off = 0; off < a->count; off += celems, c++) {
        size_t len = SHOAL_MIN(celems, a->count - off), bytes = len * dsize;
        uint8_t *acc = v == 0 ? (uint8_t *)a->recvbuf + off * dsize : accbuf;
        const uint8_t *first = (const uint8_t *)a->sendbuf + off * dsize;
        for (int mask = 1; mask < top || (v == 0 && mask < n); mask <<= 1) {
            if (v + mask >= n) {
                break;
            }
            SHOAL_CHECK(shoal_prim_recv(comm, shoal_mod(v + mask + a->root, n), tmp, bytes, seq,
                                        0, c));
            shoal_reduce2(acc, first, tmp, len, a->dtype, a->op);
            first = acc;
        }
        if (first != acc) {
            memmove(acc, first, bytes);
        }
        if (v == 0) {
            shoal_reduce_avg_finalize(acc, len, a->dtype, a->op, n);
        } else {
            SHOAL_CHECK(shoal_prim_send(comm, parent, acc, bytes, seq, 0, c));
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_barrier_run(struct shoal_comm *comm, uint32_t seq)
{
    int n = comm->nranks;
    uint8_t dummy = 0;
    uint32_t step = 0;
    for (int d = 1; d < n; d <<= 1, step++) {
        SHOAL_CHECK(shoal_prim_sendrecv(comm, (comm->rank + d) % n, &dummy, 0,
                                        shoal_mod(comm->rank - d, n), &dummy, 0, seq, step, 0));
    }
    return SHOAL_OK;
}

shoal_status_t shoal_p2p_run(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    shoal_chan_t *ch = &comm->chans[a->root];
    if (a->type == SHOAL_COLL_SEND) {
        return shoal_prim_send(comm, a->root, a->sendbuf, bytes, ch->p2p_send_seq++,
                               SHOAL_P2P_STEP, 0);
    }
    return shoal_prim_recv(comm, a->root, a->recvbuf, bytes, ch->p2p_recv_seq++, SHOAL_P2P_STEP,
                           0);
}
