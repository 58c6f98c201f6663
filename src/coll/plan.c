/* Plans of the algorithms: allocation, scratch pool, release (coll.h). */
#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>

/* A scratch buffer for a plan that may run beside others: from the pool, or a new one
 * (faulted in here, before any of it is on the data path). Ticket holder only. */
static uint8_t *shoal_coll_pool_get(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    uint8_t *buf;
    if (cs->npool > 0) {
        return cs->pool[--cs->npool];
    }
    buf = aligned_alloc(4096, SHOAL_ALIGN_UP(cs->scratch_size, 4096));
    if (buf != NULL) {
        memset(buf, 0, cs->scratch_size);
    }
    return buf;
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
    free(cs->plan_spare);
    cs->plan_spare = NULL;
    cs->plan_spare_size = 0;
}

shoal_status_t shoal_coll_plan_alloc(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                     uint32_t seq, size_t size, int exclusive,
                                     shoal_coll_plan_t **cp_p)
{
    shoal_coll_state_t *cs = comm->coll;
    size_t mem_size = size;
    shoal_coll_plan_t *cp = NULL;

    /* A blocking call allocates and frees a plan every time: calloc (which glibc serves
     * without its thread cache, and which GCC makes of malloc + memset) and the free behind
     * it were about 500 instructions of an 8-byte AllReduce's 3500 (callgrind). A blocking
     * call's plan reuses the last one's memory instead (on the thread that holds the ticket,
     * with no other plan in flight). */
    if (exclusive == SHOAL_COLL_PLAN_BLOCKING && cs->plan_spare != NULL &&
        cs->plan_spare_size >= size) {
        cp = cs->plan_spare;
        mem_size = cs->plan_spare_size;
        cs->plan_spare = NULL;
        memset(cp, 0, size);
    } else {
        cp = calloc(1, size);
        if (cp == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
    }
    cp->mem_size = mem_size;
    cp->blocking = exclusive == SHOAL_COLL_PLAN_BLOCKING;
    cp->base.release = shoal_coll_plan_release;
    cp->base.wait_peer = -1;
    cp->a = *a;
    cp->seq = seq;
    cp->dsize = shoal_dtype_size(a->dtype);
    if (exclusive) {
        cp->scratch = comm->coll->scratch;
    } else {
        cp->scratch = shoal_coll_pool_get(comm);
        cp->own_scratch = 1;
        if (cp->scratch == NULL) {
            shoal_error(COLL, "cannot allocate %zu bytes of scratch for a collective in flight",
                        comm->coll->scratch_size);
            free(cp);
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
    if (cp->blocking && (comm->coll->plan_spare == NULL ||
                         comm->coll->plan_spare_size < cp->mem_size)) {
        free(comm->coll->plan_spare); /* the larger one is kept */
        comm->coll->plan_spare = cp;
        comm->coll->plan_spare_size = cp->mem_size;
        return;
    }
    free(cp);
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
        if (from >= 0) {
            SHOAL_CHECK(shoal_chan_irecv(comm, from, rbuf, rlen, cp->seq, step, chunk, &x->rreq));
        }
        if (to >= 0) {
            SHOAL_CHECK(shoal_chan_isend(comm, to, sbuf, slen, cp->seq, step, chunk, &x->sreq));
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
        cp->base.chan_wait = 1;
        return SHOAL_IN_PROGRESS;
    }
    x->posted = 0;
    return SHOAL_OK;
}

shoal_status_t shoal_coll_plan_run(struct shoal_comm *comm, shoal_coll_plan_build_t build,
                                   const shoal_coll_args_t *a, uint32_t seq)
{
    shoal_coll_plan_t *cp;
    SHOAL_CHECK(build(comm, &cp, a, seq, SHOAL_COLL_PLAN_BLOCKING));
    return shoal_plan_drive(comm, &cp->base);
}
