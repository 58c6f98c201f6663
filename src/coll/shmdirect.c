/*
 * Intra-node AllReduce straight through the shared areas of the shm transport, for a
 * communicator whose ranks all share a host. One-shot for small messages: every rank stages
 * its input, then every rank reduces all inputs (same order everywhere, same bits). Two-shot
 * for large ones, window by window (cache-sized): stage the input window, reduce my segment
 * of it across all ranks, publish it, copy the other segments out. Windows alternate between
 * two buffers; a rank reuses a buffer only after every peer has finished reading it.
 */
#include "coll/coll.h"

#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define SHOAL_SHMD_CTRL 4096 /* control block; the two window buffers follow */

typedef struct {
    volatile uint64_t ready;   /* generation whose input is staged */
    uint8_t pad0[SHOAL_CACHELINE - 8];
    volatile uint64_t reduced; /* generation whose own segment is reduced and published */
    uint8_t pad1[SHOAL_CACHELINE - 8];
    volatile uint64_t done;    /* generation this rank has finished reading */
    uint8_t pad2[SHOAL_CACHELINE - 8];
} shoal_shmd_ctrl_t;

enum { SHOAL_SHMD_READY, SHOAL_SHMD_REDUCED, SHOAL_SHMD_DONE };
static const char *const shoal_shmd_what[] = {"staged its input", "reduced its segment",
                                              "finished reading"};

static inline shoal_shmd_ctrl_t *shoal_shmd_ctrl(shoal_coll_state_t *cs, int q)
{
    return (shoal_shmd_ctrl_t *)cs->areas[q];
}

static inline uint8_t *shoal_shmd_buf(shoal_coll_state_t *cs, int q, uint64_t g)
{
    return cs->areas[q] + SHOAL_SHMD_CTRL + (g & 1) * cs->window;
}

static inline volatile uint64_t *shoal_shmd_field(shoal_coll_state_t *cs, int q, int which)
{
    shoal_shmd_ctrl_t *c = shoal_shmd_ctrl(cs, q);
    return which == SHOAL_SHMD_READY ? &c->ready : which == SHOAL_SHMD_REDUCED ? &c->reduced
                                                                               : &c->done;
}

shoal_status_t shoal_shmdirect_init(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    size_t len = 0, w;

    if (!comm->all_local || comm->shm == NULL || comm->nranks < 2 ||
        comm->shm->ops->shared_area == NULL) {
        return SHOAL_OK;
    }
    cs->areas = calloc((size_t)comm->local_size, sizeof(*cs->areas));
    cs->srcs = calloc((size_t)comm->local_size, sizeof(*cs->srcs));
    if (cs->areas == NULL || cs->srcs == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int q = 0; q < comm->local_size; q++) {
        size_t l = 0;
        cs->areas[q] = comm->shm->ops->shared_area(comm->shm->ctx, q, &l);
        if (cs->areas[q] == NULL) {
            shoal_warn(COLL, "no shared area for local rank %d: intra-node path disabled", q);
            return SHOAL_OK;
        }
        len = q == 0 ? l : SHOAL_MIN(len, l);
    }
    if (len < SHOAL_SHMD_CTRL + 2 * 4096) {
        shoal_warn(COLL, "shared area of %zu bytes is too small: intra-node path disabled", len);
        return SHOAL_OK;
    }
    w = SHOAL_MIN(shoal_coll_config.shm_window, (len - SHOAL_SHMD_CTRL) / 2);
    cs->window = SHOAL_MAX(w / 4096 * 4096, 4096);
    cs->area_size = len;
    cs->shm_ok = 1;
    shoal_info(COLL, "intra-node path: %d ranks, window %zu bytes, one-shot up to %zu bytes",
               comm->local_size, cs->window, SHOAL_MIN(shoal_coll_config.shm_oneshot_max,
                                                       cs->window));
    return SHOAL_OK;
}

static void shoal_shmd_publish(struct shoal_comm *comm, int which, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    __atomic_store_n(shoal_shmd_field(cs, comm->local_rank, which), g, __ATOMIC_RELEASE);
    for (int q = 0; q < comm->local_size; q++) {
        if (q != comm->local_rank) {
            comm->shm->ops->notify(comm->shm->ctx, q);
        }
    }
}

/* Wait until every peer's field has reached g. */
static shoal_status_t shoal_shmd_wait(struct shoal_comm *comm, int which, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    uint64_t deadline = 0;
    unsigned spins = 0;

    for (int q = 0; q < comm->local_size; q++) {
        if (q == comm->local_rank) {
            continue;
        }
        for (;;) {
            char why[160], what[128];
            shoal_status_t st;
            /* Before a possible sleep: progress() takes the doorbell snapshot that wait()
             * sleeps on, and it must precede the flag check, or a wakeup could be missed. */
            if (spins + 1 >= comm->spin_count) {
                shoal_chan_progress(comm);
            }
            if (__atomic_load_n(shoal_shmd_field(cs, q, which), __ATOMIC_ACQUIRE) >= g) {
                break;
            }
            if (deadline == 0) {
                deadline = shoal_deadline_ns(comm->timeout_ms);
            }
            if ((spins & 63) == 63 && comm->shm->ops->peer_check != NULL &&
                comm->shm->ops->peer_check(comm->shm->ctx, q, why, sizeof(why)) != SHOAL_OK) {
                int peer = comm->local_ranks[q];
                return shoal_comm_set_failed(comm, SHOAL_ERR_PEER_FAILED,
                                             shoal_comm_culprit(comm, why, peer),
                                             "peer %d (%s) failed: %s", peer,
                                             shoal_comm_peer_host(comm, peer), why);
            }
            snprintf(what, sizeof(what), "for peer %d (%s) to say it %s", comm->local_ranks[q],
                     shoal_comm_peer_host(comm, comm->local_ranks[q]), shoal_shmd_what[which]);
            st = shoal_chan_idle(comm, &spins, deadline, what);
            if (st != SHOAL_OK) {
                return st;
            }
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_shmd_oneshot(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                         size_t bytes)
{
    shoal_coll_state_t *cs = comm->coll;
    uint64_t g = ++cs->gen;
    const void **srcs = (const void **)comm->coll->srcs;

    if (g > 2) {
        SHOAL_CHECK(shoal_shmd_wait(comm, SHOAL_SHMD_DONE, g - 2));
    }
    memcpy(shoal_shmd_buf(cs, comm->local_rank, g), a->sendbuf, bytes);
    shoal_shmd_publish(comm, SHOAL_SHMD_READY, g);
    SHOAL_CHECK(shoal_shmd_wait(comm, SHOAL_SHMD_READY, g));
    for (int q = 0; q < comm->local_size; q++) {
        srcs[q] = shoal_shmd_buf(cs, q, g);
    }
    shoal_reduce_n(a->recvbuf, srcs, comm->local_size, a->count, a->dtype, a->op);
    shoal_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, a->op, comm->nranks);
    shoal_shmd_publish(comm, SHOAL_SHMD_DONE, g);
    return SHOAL_OK;
}

/* One two-shot window: elements [e0, e0 + m). */
static shoal_status_t shoal_shmd_window(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                        size_t e0, size_t m, size_t dsize)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->local_size, me = comm->local_rank;
    uint64_t g = ++cs->gen;
    const void **srcs = (const void **)cs->srcs;
    uint8_t *out = (uint8_t *)a->recvbuf + e0 * dsize;
    size_t so, sl;

    if (g > 2) {
        SHOAL_CHECK(shoal_shmd_wait(comm, SHOAL_SHMD_DONE, g - 2));
    }
    memcpy(shoal_shmd_buf(cs, me, g), (const uint8_t *)a->sendbuf + e0 * dsize, m * dsize);
    shoal_shmd_publish(comm, SHOAL_SHMD_READY, g);
    SHOAL_CHECK(shoal_shmd_wait(comm, SHOAL_SHMD_READY, g));
    shoal_block_range(m, n, me, &so, &sl);
    for (int q = 0; q < n; q++) {
        srcs[q] = shoal_shmd_buf(cs, q, g) + so * dsize;
    }
    shoal_reduce_n(out + so * dsize, srcs, n, sl, a->dtype, a->op);
    shoal_reduce_avg_finalize(out + so * dsize, sl, a->dtype, a->op, comm->nranks);
    memcpy(shoal_shmd_buf(cs, me, g) + so * dsize, out + so * dsize, sl * dsize);
    shoal_shmd_publish(comm, SHOAL_SHMD_REDUCED, g);
    SHOAL_CHECK(shoal_shmd_wait(comm, SHOAL_SHMD_REDUCED, g));
    for (int q = 0; q < n; q++) {
        size_t qo, ql;
        if (q == me) {
            continue;
        }
        shoal_block_range(m, n, q, &qo, &ql);
        memcpy(out + qo * dsize, shoal_shmd_buf(cs, q, g) + qo * dsize, ql * dsize);
    }
    shoal_shmd_publish(comm, SHOAL_SHMD_DONE, g);
    return SHOAL_OK;
}

shoal_status_t shoal_shmdirect_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    shoal_coll_state_t *cs = comm->coll;
    size_t dsize = shoal_dtype_size(a->dtype), bytes = a->count * dsize;
    size_t welems = cs->window / dsize;

    if (bytes <= SHOAL_MIN(shoal_coll_config.shm_oneshot_max, cs->window)) {
        return shoal_shmd_oneshot(comm, a, bytes);
    }
    for (size_t e0 = 0; e0 < a->count; e0 += welems) {
        SHOAL_CHECK(shoal_shmd_window(comm, a, e0, SHOAL_MIN(welems, a->count - e0), dsize));
    }
    return SHOAL_OK;
}
