/*
 * Recursive-halving reduce-scatter for a power-of-two number of ranks: log2(n) exchanges.
 * Elements are processed in slices [e0, e0 + m) of every block (m sized so that scratch holds
 * an accumulator of n/2 block slices and two staging areas of n/2); step mask = n/2 .. 1 keeps
 * the half of the block range that holds my rank, sends the other half and reduces the
 * partner's copy of mine, lower rank's data first. Rank r ends with block r, scaled once for
 * AVG.
 */
#include "coll/coll.h"

#include <string.h>

int shoal_rh_reduce_scatter_applicable(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    int n = comm->nranks;
    (void)a;
    return (n & (n - 1)) == 0 && comm->coll->scratch_size / 3 / (size_t)n >= 64;
}

typedef struct {
    struct shoal_comm *comm;
    const shoal_coll_args_t *a;
    uint32_t seq;
    size_t ds, m, e0;
    uint8_t *acc, *tmps, *tmpr;
} shoal_rh_t;

/* One halving step over the blocks [lo, lo + 2*mask); acc holds them (after the first step). */
static shoal_status_t shoal_rh_step(shoal_rh_t *h, int lo, int mask, int first, uint32_t step,
                                    uint32_t slice)
{
    struct shoal_comm *comm = h->comm;
    int rank = comm->rank, peer = rank ^ mask, keep = (rank & mask) ? lo + mask : lo;
    int send = (rank & mask) ? lo : lo + mask, low_first = rank < peer;
    size_t bm = h->m * h->ds, half = (size_t)mask * bm;
    const uint8_t *sb = h->a->sendbuf;
    const uint8_t *sptr = h->acc + (size_t)(send - lo) * bm;

    if (first) { /* pack the half to send from the send buffer */
        for (int b = 0; b < mask; b++) {
            memcpy(h->tmps + (size_t)b * bm, sb + ((size_t)(send + b) * h->a->count + h->e0) *
                                                    h->ds, bm);
        }
        sptr = h->tmps;
    }
    SHOAL_CHECK(shoal_prim_sendrecv(comm, peer, sptr, half, peer, h->tmpr, half, h->seq, step,
                                    slice));
    for (int b = 0; b < mask; b++) {
        const uint8_t *mine = first ? sb + ((size_t)(keep + b) * h->a->count + h->e0) * h->ds
                                    : h->acc + (size_t)(keep - lo + b) * bm;
        const uint8_t *theirs = h->tmpr + (size_t)b * bm;
        shoal_reduce2(h->acc + (size_t)b * bm, low_first ? mine : theirs,
                      low_first ? theirs : mine, h->m, h->a->dtype, h->a->op);
    }
    return SHOAL_OK;
}

shoal_status_t shoal_rh_reduce_scatter(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                       uint32_t seq)
{
    int n = comm->nranks;
    shoal_rh_t h = {.comm = comm, .a = a, .seq = seq, .ds = shoal_dtype_size(a->dtype)};
    size_t third = comm->coll->scratch_size / 3 / 64 * 64;
    size_t mmax = SHOAL_MAX(third / (size_t)(n / 2) / h.ds, 1);
    uint32_t slice = 0;

    if (!shoal_rh_reduce_scatter_applicable(comm, a)) {
        return shoal_ring_reduce_scatter(comm, a, seq);
    }
    h.acc = comm->coll->scratch;
    h.tmps = h.acc + third;
    h.tmpr = h.tmps + third;
    for (h.e0 = 0; h.e0 < a->count; h.e0 += mmax, slice++) {
        int lo = 0;
        uint32_t step = 0;
        h.m = SHOAL_MIN(mmax, a->count - h.e0);
        for (int mask = n / 2; mask > 0; mask >>= 1, step++) {
            SHOAL_CHECK(shoal_rh_step(&h, lo, mask, mask == n / 2, step, slice));
            lo = (comm->rank & mask) ? lo + mask : lo;
        }
        memcpy((uint8_t *)a->recvbuf + h.e0 * h.ds, h.acc, h.m * h.ds);
        shoal_reduce_avg_finalize((uint8_t *)a->recvbuf + h.e0 * h.ds, h.m, a->dtype, a->op, n);
    }
    return SHOAL_OK;
}
