/*
 * Pairwise-exchange alltoall: n - 1 steps; in step k every rank swaps blocks with
 * peer = (k - rank) mod n (a perfect matching per step, so each exchange is symmetric; the
 * rank paired with itself copies its own block). Out of place, blocks go buffer to buffer in
 * one message each. In place (sendbuf == recvbuf), the swap goes through scratch in pieces:
 * send piece p of my block for the peer, receive the peer's piece p, then copy it in. A plan
 * the progress engine advances step by step (the blocking call drives the same plan).
 */
#include "coll/coll.h"

#include <string.h>

typedef struct {
    shoal_coll_plan_t cp;
    int k;                 /* step: 0 .. n-1 */
    size_t o;              /* in place: offset of the piece being swapped */
    uint32_t piece;
    shoal_coll_xchg_t x;
} shoal_a2a_plan_t;

static shoal_status_t shoal_a2a_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_a2a_plan_t *p = (shoal_a2a_plan_t *)plan;
    const shoal_coll_args_t *a = &p->cp.a;
    int n = comm->nranks, rank = comm->rank;
    size_t bytes = a->count * p->cp.dsize, P = comm->coll->scratch_size;
    const uint8_t *sbuf = a->sendbuf;
    uint8_t *rbuf = a->recvbuf;
    int inplace = a->sendbuf == a->recvbuf;

    for (; p->k < n; p->k++, p->o = 0, p->piece = 0) {
        int peer = shoal_mod(p->k - rank, n);
        size_t po = (size_t)peer * bytes;
        if (peer == rank) {
            if (!inplace) {
                memcpy(rbuf + po, sbuf + po, bytes);
            }
            continue;
        }
        if (!inplace) {
            SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, peer, sbuf + po, bytes, peer,
                                        rbuf + po, bytes, (uint32_t)p->k, 0));
            continue;
        }
        for (; p->o < bytes; p->o += P, p->piece++) {
            size_t l = SHOAL_MIN(P, bytes - p->o);
            SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, peer, rbuf + po + p->o, l, peer,
                                        p->cp.scratch, l, (uint32_t)p->k, p->piece));
            memcpy(rbuf + po + p->o, p->cp.scratch, l);
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_pairwise_alltoall_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                            const shoal_coll_args_t *a, uint32_t seq,
                                            int exclusive)
{
    shoal_a2a_plan_t *p;
    /* Out of place it needs no scratch: the communicator's pointer, never touched (no pool
     * buffer taken for it). */
    int no_scratch = a->sendbuf != a->recvbuf;
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), exclusive || no_scratch,
                                      (shoal_coll_plan_t **)&p));
    p->cp.base.progress = shoal_a2a_progress;
    for (int r = 0; r < comm->nranks; r++) {
        if (r != comm->rank) {
            shoal_coll_plan_peer(&p->cp, r);
        }
    }
    *cp_p = &p->cp;
    return SHOAL_OK;
}
