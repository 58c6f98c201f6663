/*
 * Bruck allgather for small messages: ceil(log2 n) steps for any n, as a plan the progress
 * engine advances step by step (the blocking call drives the same plan). Blocks are kept
 * rotated in scratch (slot i holds rank (rank + i) mod n's block); step d = 1, 2, 4, ...
 * sends the first min(d, n - d) slots to rank - d and receives as many from rank + d into
 * slots d.. . A final copy puts them in rank order. Needs nranks * count * dsize <=
 * scratch_size (shoal_bruck_applicable; a plan's scratch, its own or the communicator's, has
 * that size); larger calls use the ring.
 */
#include "coll/coll.h"

#include <string.h>

int shoal_bruck_applicable(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    return bytes <= comm->coll->scratch_size / (size_t)comm->nranks;
}

typedef struct {
    shoal_coll_plan_t cp;
    int d;                 /* the step's distance: 1, 2, 4, ... */
    shoal_coll_xchg_t x;
} shoal_bruck_plan_t;

static shoal_status_t shoal_bruck_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_bruck_plan_t *p = (shoal_bruck_plan_t *)plan;
    const shoal_coll_args_t *a = &p->cp.a;
    int n = comm->nranks, rank = comm->rank;
    size_t bytes = a->count * p->cp.dsize;
    uint8_t *tmp = p->cp.scratch, *rbuf = a->recvbuf;

    for (; p->d < n; p->d <<= 1) {
        size_t cnt = (size_t)SHOAL_MIN(p->d, n - p->d);
        SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, shoal_mod(rank - p->d, n), tmp,
                                    cnt * bytes, (rank + p->d) % n, tmp + (size_t)p->d * bytes,
                                    cnt * bytes, (uint32_t)__builtin_ctz((unsigned)p->d), 0));
    }
    /* slot i -> block (rank + i) mod n: two contiguous copies. */
    memcpy(rbuf + (size_t)rank * bytes, tmp, (size_t)(n - rank) * bytes);
    memcpy(rbuf, tmp + (size_t)(n - rank) * bytes, (size_t)rank * bytes);
    return SHOAL_OK;
}

shoal_status_t shoal_bruck_allgather_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                          const shoal_coll_args_t *a, uint32_t seq,
                                          int exclusive)
{
    shoal_bruck_plan_t *p;
    int n = comm->nranks;

    if (!shoal_bruck_applicable(comm, a)) {
        return shoal_ring_allgather_plan(comm, cp_p, a, seq, exclusive);
    }
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), exclusive,
                                      (shoal_coll_plan_t **)&p));
    p->cp.base.progress = shoal_bruck_progress;
    p->d = 1;
    for (int d = 1; d < n; d <<= 1) {
        shoal_coll_plan_peer(&p->cp, shoal_mod(comm->rank - d, n));
        shoal_coll_plan_peer(&p->cp, (comm->rank + d) % n);
    }
    memcpy(p->cp.scratch, a->sendbuf, a->count * p->cp.dsize);
    *cp_p = &p->cp;
    return SHOAL_OK;
}
