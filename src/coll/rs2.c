/*
 * Recursive-halving reduce-scatter for a power-of-two number of ranks: log2(n) exchanges.
 * Elements are processed in slices [e0, e0 + m) of every block (m sized so that scratch holds
 * an accumulator of n/2 block slices and two staging areas of n/2); step mask = n/2 .. 1 keeps
 * the half of the block range that holds my rank, sends the other half and reduces the
 * partner's copy of mine, lower rank's data first. Rank r ends with block r, scaled once for
 * AVG. A plan the progress engine advances step by step (the blocking call drives the same
 * plan): every exchange is a shoal_coll_xchg that resumes where it left off.
 */
#include "coll/coll.h"

#include <string.h>

int shoal_rh_reduce_scatter_applicable(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    int n = comm->nranks;
    (void)a;
    /* a slice of n/2 blocks in a third of scratch, as the plan cuts it (and the cost model,
     * shoal_rh_rs_cost, asks): with n the runtime refused where shoal_info -t chose it */
    return (n & (n - 1)) == 0 &&
           comm->coll->scratch_size / 3 / (size_t)SHOAL_MAX(n / 2, 1) >= 64;
}

typedef struct {
    shoal_coll_plan_t cp;
    size_t m, mmax, e0;    /* the slice [e0, e0 + m) of every block, at most mmax */
    uint8_t *acc, *tmps, *tmpr;
    uint32_t slice, step;
    int mask, lo;          /* the current halving step over blocks [lo, lo + 2*mask) */
    int packed;            /* the first step's half is packed into tmps */
    shoal_coll_xchg_t x;
} shoal_rh_plan_t;

/* One halving step over the blocks [lo, lo + 2*mask); acc holds them (after the first step). */
static shoal_status_t shoal_rh_step(struct shoal_comm *comm, shoal_rh_plan_t *h, int n)
{
    const shoal_coll_args_t *a = &h->cp.a;
    int rank = comm->rank, mask = h->mask, lo = h->lo, peer = rank ^ mask;
    int keep = (rank & mask) ? lo + mask : lo, send = (rank & mask) ? lo : lo + mask;
    int first = mask == n / 2, low_first = rank < peer;
    size_t ds = h->cp.dsize, bm = h->m * ds, half = (size_t)mask * bm;
    const uint8_t *sb = a->sendbuf;
    const uint8_t *sptr = h->acc + (size_t)(send - lo) * bm;

    if (first) { /* pack the half to send from the send buffer */
        if (!h->packed) {
            for (int b = 0; b < mask; b++) {
                memcpy(h->tmps + (size_t)b * bm,
                       sb + ((size_t)(send + b) * a->count + h->e0) * ds, bm);
            }
            h->packed = 1;
        }
        sptr = h->tmps;
    }
    SHOAL_CHECK(shoal_coll_xchg(comm, &h->cp, &h->x, peer, sptr, half, peer, h->tmpr, half,
                                h->step, h->slice));
    h->packed = 0;
    for (int b = 0; b < mask; b++) {
        const uint8_t *mine = first ? sb + ((size_t)(keep + b) * a->count + h->e0) * ds
                                    : h->acc + (size_t)(keep - lo + b) * bm;
        const uint8_t *theirs = h->tmpr + (size_t)b * bm;
        shoal_reduce2(h->acc + (size_t)b * bm, low_first ? mine : theirs,
                      low_first ? theirs : mine, h->m, a->dtype, a->op);
    }
    h->lo = keep;
    return SHOAL_OK;
}

static shoal_status_t shoal_rh_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_rh_plan_t *h = (shoal_rh_plan_t *)plan;
    const shoal_coll_args_t *a = &h->cp.a;
    int n = comm->nranks;
    size_t ds = h->cp.dsize;

    while (h->e0 < a->count) {
        uint8_t *out = (uint8_t *)a->recvbuf + h->e0 * ds;
        h->m = SHOAL_MIN(h->mmax, a->count - h->e0);
        for (; h->mask > 0; h->mask >>= 1, h->step++) {
            SHOAL_CHECK(shoal_rh_step(comm, h, n));
        }
        memcpy(out, h->acc, h->m * ds);
        shoal_reduce_avg_finalize(out, h->m, a->dtype, a->op, n);
        h->e0 += h->mmax;
        h->slice++;
        h->mask = n / 2;
        h->lo = 0;
        h->step = 0;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_rh_reduce_scatter_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                            const shoal_coll_args_t *a, uint32_t seq,
                                            int exclusive)
{
    shoal_rh_plan_t *h;
    int n = comm->nranks;
    size_t third = comm->coll->scratch_size / 3 / 64 * 64;

    if (!shoal_rh_reduce_scatter_applicable(comm, a)) {
        return shoal_ring_reduce_scatter_plan(comm, cp_p, a, seq, exclusive);
    }
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*h), exclusive,
                                      (shoal_coll_plan_t **)&h));
    h->cp.base.progress = shoal_rh_progress;
    h->mmax = SHOAL_MAX(third / (size_t)(n / 2) / h->cp.dsize, 1);
    h->acc = h->cp.scratch;
    h->tmps = h->acc + third;
    h->tmpr = h->tmps + third;
    h->mask = n / 2;
    for (int mask = n / 2; mask > 0; mask >>= 1) {
        shoal_coll_plan_peer(&h->cp, comm->rank ^ mask);
    }
    *cp_p = &h->cp;
    return SHOAL_OK;
}
