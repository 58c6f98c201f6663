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
}

shoal_status_t shoal_coll_plan_alloc(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                     uint32_t seq, size_t size, int exclusive,
                                     shoal_coll_plan_t **cp_p)
{
    shoal_coll_plan_t *cp = calloc(1, size);
    if (cp == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
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
    free(cp);
}
