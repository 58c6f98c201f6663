/* Plans of the algorithms: allocation, scratch pool, release (coll.h). */
#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>

/* A scratch buffer for a plan that may run beside others: from the pool, or a new one. Of a
 * new one, the bytes the call can use (its message, at most the scratch) are faulted in here,
 * before any of them is on the data path; the rest is left untouched. Faulting the whole
 * scratch (4 chunks, 4 MiB with 1 MiB chunks) for every call in flight beyond the pool made
 * 200 nonblocking 32-byte AllReduces on 2 ranks take 1.6 GB and 3 ms a call over tcp: every
 * queued call gets its plan, and so its scratch, when it starts. Ticket holder only. */
static uint8_t *shoal_coll_pool_get(struct shoal_comm *comm, size_t touch)
{
    shoal_coll_state_t *cs = comm->coll;
    uint8_t *buf;
    if (cs->npool > 0) {
        return cs->pool[--cs->npool];
    }
    buf = aligned_alloc(4096, SHOAL_ALIGN_UP(cs->scratch_size, 4096));
    if (buf != NULL) {
        memset(buf, 0, SHOAL_MIN(touch, cs->scratch_size));
    }
    return buf;
}

/* The bytes a call moves: its message, or every rank's block where count is one block. */
static size_t shoal_coll_plan_bytes(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    if (a->type == SHOAL_COLL_ALLGATHER || a->type == SHOAL_COLL_REDUCE_SCATTER ||
        a->type == SHOAL_COLL_ALLTOALL) {
        bytes *= (size_t)comm->nranks; /* no overflow: shoal_api_check_args */
    }
    return bytes;
}

static void shoal_coll_pool_put(struct shoal_comm *comm, uint8_t *buf)
{
    shoal_coll_state_t *cs = comm->coll;
    if (cs->npool < SHOAL_PLAN_POOL) {
        cs->pool[cs->npool++] = buf;
    } else {
        free(buf);
    }
}

void shoal_coll_pool_fini(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    while (cs->npool > 0) {
        free(cs->pool[--cs->npool]);
    }
    free(cs->plan_mem);
    cs->plan_mem = NULL;
    cs->plan_mem_size = 0;
}

static void shoal_coll_plan_free(struct shoal_comm *comm, shoal_coll_plan_t *cp)
{
    shoal_coll_state_t *cs = comm->coll;
    if ((void *)cp == cs->plan_mem) {
        cs->plan_mem_busy = 0;
    } else {
        free(cp);
    }
}

shoal_status_t shoal_coll_plan_alloc(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                     uint32_t seq, size_t size, int exclusive,
                                     shoal_coll_plan_t **cp_p)
{
    shoal_coll_state_t *cs = comm->coll;
    shoal_coll_plan_t *cp;
    if (exclusive && !cs->plan_mem_busy) {
        if (cs->plan_mem_size < size) {
            void *mem = malloc(size);
            if (mem == NULL) {
                return SHOAL_ERR_NO_MEMORY;
            }
            free(cs->plan_mem);
            cs->plan_mem = mem;
            cs->plan_mem_size = size;
        }
        cp = cs->plan_mem;
        cs->plan_mem_busy = 1;
    } else if ((cp = malloc(size)) == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    memset(cp, 0, size);
    cp->base.release = shoal_coll_plan_release;
    cp->base.wait_peer = -1;
    cp->a = *a;
    cp->seq = seq;
    cp->dsize = shoal_dtype_size(a->dtype);
    if (exclusive) {
        cp->scratch = comm->coll->scratch;
    } else {
        cp->scratch = shoal_coll_pool_get(comm, shoal_coll_plan_bytes(comm, a));
        cp->own_scratch = 1;
        if (cp->scratch == NULL) {
            shoal_error(COLL, "cannot allocate %zu bytes of scratch for a collective in flight",
                        comm->coll->scratch_size);
            shoal_coll_plan_free(comm, cp);
            return SHOAL_ERR_NO_MEMORY;
        }
    }
    *cp_p = cp;
    return SHOAL_OK;
}

void shoal_coll_plan_release(struct shoal_comm *comm, shoal_plan_t *plan, shoal_status_t st)
{
    shoal_coll_plan_t *cp = (shoal_coll_plan_t *)plan;
    if (cp->on_done != NULL) {
        cp->on_done(comm, cp, st);
    }
    if (cp->own_scratch) {
        shoal_coll_pool_put(comm, cp->scratch);
    }
    shoal_coll_plan_free(comm, cp);
}

void shoal_coll_plan_peer(shoal_coll_plan_t *cp, int peer)
{
    shoal_plan_t *b = &cp->base;
    if (peer < 0 || b->npeers < 0) {
        return;
    }
    for (int i = 0; i < b->npeers; i++) {
        if (b->peers[i] == peer) {
            return;
        }
    }
    if (b->npeers == SHOAL_PLAN_PEERS) {
        b->npeers = -1; /* more channels than a plan lists: it advances alone */
        return;
    }
    b->peers[b->npeers++] = peer;
}

shoal_status_t shoal_coll_xchg(struct shoal_comm *comm, shoal_coll_plan_t *cp,
                               shoal_coll_xchg_t *x, int to, const void *sbuf, size_t slen,
                               int from, void *rbuf, size_t rlen, uint32_t step, uint32_t chunk)
{
    shoal_tl_req_t *reqs[2] = {NULL, NULL};
    int peers[2] = {from, to}, done;

    if (!x->posted) {
        /* The send first: the peer waits for it, while posting our receive costs nothing the
         * peer waits for (its message travels meanwhile; one that comes before the receive
         * waits in the transport, as one from a peer that runs ahead always could). 2-rank
         * 8 B AllReduce over ucx: 0.43-0.44 -> 0.40-0.41 us
         * (perf/results/ucx-small-2026-12-05.txt). */
        if (to >= 0) {
            SHOAL_CHECK(shoal_chan_isend(comm, to, sbuf, slen, cp->seq, step, chunk, &x->sreq));
        }
        if (from >= 0) {
            SHOAL_CHECK(shoal_chan_irecv(comm, from, rbuf, rlen, cp->seq, step, chunk, &x->rreq));
        }
        x->posted = 1;
    }
    if (from >= 0) {
        reqs[0] = &x->rreq;
    }
    if (to >= 0) {
        reqs[1] = &x->sreq;
    }
    SHOAL_CHECK(shoal_chan_test(comm, reqs, peers, 2, &done));
    if (!done) {
        cp->base.wait_peer = from >= 0 ? from : to;
        for (int i = 0; i < 2; i++) {
            if (reqs[i] != NULL && !__atomic_load_n(&reqs[i]->done, __ATOMIC_ACQUIRE)) {
                shoal_plan_wait_on(&cp->base, reqs[i]);
            }
        }
        return SHOAL_IN_PROGRESS;
    }
    x->posted = 0;
    return SHOAL_OK;
}

shoal_status_t shoal_coll_plan_run(struct shoal_comm *comm, shoal_coll_plan_build_t build,
                                   const shoal_coll_args_t *a, uint32_t seq)
{
    shoal_coll_plan_t *cp;
    SHOAL_CHECK(build(comm, &cp, a, seq, 1));
    return shoal_plan_drive(comm, &cp->base);
}
