/* Algorithm choice per call and the dispatch that runs it. */
#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>

shoal_algo_t shoal_coll_select(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    shoal_coll_state_t *cs = comm->coll;
    size_t bytes = a->count * shoal_dtype_size(a->dtype);

    switch (a->type) {
    case SHOAL_COLL_ALLREDUCE:
        if (cs->algo == SHOAL_ALGO_RING || cs->algo == SHOAL_ALGO_RD) {
            return (shoal_algo_t)cs->algo;
        }
        if (cs->shm_ok && (cs->algo == SHOAL_ALGO_SHM || cs->algo == SHOAL_ALGO_AUTO)) {
            return SHOAL_ALGO_SHM;
        }
        return bytes <= shoal_coll_config.rd_max ? SHOAL_ALGO_RD : SHOAL_ALGO_RING;
    case SHOAL_COLL_BROADCAST:
        if (cs->algo == SHOAL_ALGO_TREE || cs->algo == SHOAL_ALGO_RING) {
            return (shoal_algo_t)cs->algo;
        }
        return bytes <= shoal_coll_config.tree_max ? SHOAL_ALGO_TREE : SHOAL_ALGO_RING;
    case SHOAL_COLL_REDUCE:
        return SHOAL_ALGO_TREE;
    default:
        return SHOAL_ALGO_RING;
    }
}

static shoal_status_t shoal_coll_local(const shoal_coll_args_t *a)
{
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    if (a->sendbuf != a->recvbuf && a->recvbuf != NULL && bytes > 0) {
        memmove(a->recvbuf, a->sendbuf, bytes);
    }
    if (a->type == SHOAL_COLL_ALLREDUCE || a->type == SHOAL_COLL_REDUCE ||
        a->type == SHOAL_COLL_REDUCE_SCATTER) {
        shoal_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, a->op, 1);
    }
    return SHOAL_OK;
}

shoal_status_t shoal_coll_run(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    shoal_algo_t algo;
    uint32_t seq;

    if (a->type == SHOAL_COLL_SEND || a->type == SHOAL_COLL_RECV) {
        return shoal_p2p_run(comm, a);
    }
    seq = comm->seq++;
    if (comm->nranks == 1) {
        return a->type == SHOAL_COLL_BARRIER ? SHOAL_OK : shoal_coll_local(a);
    }
    if (a->count == 0 && a->type != SHOAL_COLL_BARRIER) {
        return SHOAL_OK;
    }
    algo = shoal_coll_select(comm, a);
    shoal_trace(COLL, "rank %d: seq %u type %d count %zu algo %s", comm->rank, seq, a->type,
                a->count, shoal_algo_names[algo]);
    switch (a->type) {
    case SHOAL_COLL_ALLREDUCE:
        if (algo == SHOAL_ALGO_SHM) {
            return shoal_shmdirect_allreduce(comm, a);
        }
        return algo == SHOAL_ALGO_RD ? shoal_rd_allreduce(comm, a, seq)
                                     : shoal_ring_allreduce(comm, a, seq);
    case SHOAL_COLL_BROADCAST:
        return shoal_bcast_run(comm, a, seq, algo);
    case SHOAL_COLL_REDUCE:
        return shoal_tree_reduce(comm, a, seq);
    case SHOAL_COLL_ALLGATHER:
        return shoal_ring_allgather(comm, a, seq);
    case SHOAL_COLL_REDUCE_SCATTER:
        return shoal_ring_reduce_scatter(comm, a, seq);
    case SHOAL_COLL_BARRIER:
        return shoal_barrier_run(comm, seq);
    default:
        return SHOAL_ERR_INTERNAL;
    }
}

shoal_status_t shoal_coll_comm_init(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = calloc(1, sizeof(*cs));
    const char *forced = comm->cfg.algorithm;

    if (cs == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    comm->coll = cs;
    cs->algo = shoal_coll_config.algo;
    if (forced != NULL && forced[0] != '\0') {
        cs->algo = -1;
        for (int i = 0; shoal_algo_names[i] != NULL; i++) {
            if (strcmp(shoal_algo_names[i], forced) == 0) {
                cs->algo = i;
            }
        }
        if (cs->algo < 0) {
            shoal_error(COLL, "unknown algorithm '%s' in shoal_config_t.algorithm", forced);
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    cs->chunk = SHOAL_MAX(SHOAL_ALIGN_UP(shoal_coll_config.chunk_size, 64), 4096);
    cs->scratch_size = SHOAL_MAX(4 * cs->chunk, SHOAL_ALIGN_UP(shoal_coll_config.rd_max, 64));
    if (comm->nranks > 1) {
        cs->scratch = aligned_alloc(4096, SHOAL_ALIGN_UP(cs->scratch_size, 4096));
        if (cs->scratch == NULL) {
            shoal_error(COLL, "cannot allocate %zu bytes of scratch", cs->scratch_size);
            return SHOAL_ERR_NO_MEMORY;
        }
        /* Fault the pages in now, never on the data path. */
        memset(cs->scratch, 0, cs->scratch_size);
    }
    SHOAL_CHECK(shoal_shmdirect_init(comm));
    if (cs->algo == SHOAL_ALGO_SHM && !cs->shm_ok) {
        shoal_warn(COLL, "SHOAL_ALGO=shm needs every rank on one host with the shm transport; "
                   "using the automatic choice");
    }
    return SHOAL_OK;
}

void shoal_coll_comm_fini(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    if (cs == NULL) {
        return;
    }
    free(cs->scratch);
    free(cs->areas);
    free(cs->srcs);
    free(cs);
    comm->coll = NULL;
}
