/*
 * Ring algorithms, as plans the progress engine advances step by step (the blocking calls
 * drive the same plans). AllReduce = reduce-scatter + allgather around the ring, over slices of
 * n * chunk bytes; two slices move at once so that one slice's reduction overlaps the other's
 * transfer. Both sides post in the same order (slice-major within a step), which is what the
 * channels' FIFO matching needs. No initial copy: the first reduction of a block reads the
 * send buffer, later steps read the receive buffer.
 */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_RING_SLICES 2

/* The ring neighbours of a plan (host-aware unless SHOAL_RING_ORDER=rank). Blocks follow ring
 * positions: the formulas below use pos where a rank-ordered ring uses rank. */
static void shoal_ring_peers(struct shoal_comm *comm, shoal_coll_plan_t *cp, int *pos_p)
{
    *pos_p = comm->topo->ring_pos;
    cp->base.npeers = 2;
    cp->base.peers[0] = comm->topo->ring_next;
    cp->base.peers[1] = comm->topo->ring_prev;
}

/* Tests one request: 1 done, 0 pending (the plan waits for peer), or an error. */
static inline shoal_status_t shoal_ring_test(struct shoal_comm *comm, shoal_coll_plan_t *cp,
                                             shoal_tl_req_t *req, int peer, int *done_p)
{
    shoal_status_t st = shoal_chan_test(comm, &req, &peer, 1, done_p);
    if (!*done_p) {
        cp->base.wait_peer = peer;
        shoal_plan_wait_on(&cp->base, req);
    }
    return st;
}

/* ---- AllReduce ------------------------------------------------------------------------- */

typedef struct {
    shoal_coll_plan_t cp;
    int pos, next, prev;
    size_t slice_elems;
    size_t base;           /* first element of the current group of slices */
    size_t s0[SHOAL_RING_SLICES], m[SHOAL_RING_SLICES];
    int nsl;               /* slices of the group; 0: group not set up */
    uint32_t slice;        /* index of the group's first slice */
    int k;                 /* step within the group, 0 .. 2(n-1) */
    int posted;            /* step k posted */
    int consumed;          /* slices of step k whose receive was consumed */
    shoal_tl_req_t sreq[SHOAL_RING_SLICES], rreq[SHOAL_RING_SLICES];
} shoal_ring_ar_plan_t;

/* Step k of the group: post every slice's receive and send. */
static shoal_status_t shoal_ring_ar_post(struct shoal_comm *comm, shoal_ring_ar_plan_t *p)
{
    const shoal_coll_args_t *a = &p->cp.a;
    int n = comm->nranks, pos = p->pos, k = p->k, rs = k < n - 1;
    size_t ds = p->cp.dsize;
    uint8_t *rbuf = a->recvbuf;
    const uint8_t *sbuf = a->sendbuf;
    int sblk = rs ? shoal_mod(pos - k, n) : shoal_mod(pos + 1 - (k - (n - 1)), n);
    int rblk = rs ? shoal_mod(pos - k - 1, n) : shoal_mod(pos - (k - (n - 1)), n);

    for (int i = 0; i < p->nsl; i++) {
        size_t soff, slen, roff, rlen;
        uint8_t *rdst;
        shoal_block_range(p->m[i], n, sblk, &soff, &slen);
        shoal_block_range(p->m[i], n, rblk, &roff, &rlen);
        rdst = rs ? p->cp.scratch + (size_t)i * comm->coll->chunk
                  : rbuf + (p->s0[i] + roff) * ds;
        SHOAL_CHECK(shoal_chan_irecv(comm, p->prev, rdst, rlen * ds, p->cp.seq, (uint32_t)k,
                                     p->slice + (uint32_t)i, &p->rreq[i]));
        SHOAL_CHECK(shoal_chan_isend(comm, p->next,
                                     (k == 0 ? sbuf : rbuf) + (p->s0[i] + soff) * ds, slen * ds,
                                     p->cp.seq, (uint32_t)k, p->slice + (uint32_t)i,
                                     &p->sreq[i]));
    }
    p->posted = 1;
    p->consumed = 0;
    return SHOAL_OK;
}

/* Reduce-scatter steps reduce each slice as its data arrives (one slice's reduction overlaps
 * the other's transfer); a step ends when its sends are done too. */
static shoal_status_t shoal_ring_ar_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_ring_ar_plan_t *p = (shoal_ring_ar_plan_t *)plan;
    const shoal_coll_args_t *a = &p->cp.a;
    int n = comm->nranks, done;
    size_t ds = p->cp.dsize;

    for (;;) {
        if (p->nsl == 0) {
            if (p->base >= a->count) {
                return SHOAL_OK;
            }
            for (int i = 0; i < SHOAL_RING_SLICES; i++) {
                size_t start = p->base + (size_t)i * p->slice_elems;
                if (start >= a->count) {
                    break;
                }
                p->s0[p->nsl] = start;
                p->m[p->nsl] = SHOAL_MIN(p->slice_elems, a->count - start);
                p->nsl++;
            }
            p->k = 0;
            p->posted = 0;
        }
        if (!p->posted) {
            SHOAL_CHECK(shoal_ring_ar_post(comm, p));
        }
        int k = p->k, rs = k < n - 1;
        int rblk = rs ? shoal_mod(p->pos - k - 1, n) : shoal_mod(p->pos - (k - (n - 1)), n);
        while (p->consumed < p->nsl) {
            int i = p->consumed;
            size_t roff, rlen;
            SHOAL_CHECK(shoal_ring_test(comm, &p->cp, &p->rreq[i], p->prev, &done));
            if (!done) {
                return SHOAL_IN_PROGRESS;
            }
            p->consumed++;
            if (!rs) {
                continue;
            }
            shoal_block_range(p->m[i], n, rblk, &roff, &rlen);
            uint8_t *dst = (uint8_t *)a->recvbuf + (p->s0[i] + roff) * ds;
            shoal_reduce2(dst, (const uint8_t *)a->sendbuf + (p->s0[i] + roff) * ds,
                          p->cp.scratch + (size_t)i * comm->coll->chunk, rlen, a->dtype, a->op);
            if (k == n - 2) {
                /* This rank owns the block now complete: scale it once for AVG. */
                shoal_reduce_avg_finalize(dst, rlen, a->dtype, a->op, n);
            }
        }
        for (int i = 0; i < p->nsl; i++) {
            SHOAL_CHECK(shoal_ring_test(comm, &p->cp, &p->sreq[i], p->next, &done));
            if (!done) {
                return SHOAL_IN_PROGRESS;
            }
        }
        p->posted = 0;
        if (++p->k == 2 * (n - 1)) {
            p->slice += (uint32_t)p->nsl;
            p->base += SHOAL_RING_SLICES * p->slice_elems;
            p->nsl = 0;
        }
    }
}

shoal_status_t shoal_ring_allreduce_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                         const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_ring_ar_plan_t *p;
    size_t dsize = shoal_dtype_size(a->dtype);
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), exclusive,
                                      (shoal_coll_plan_t **)&p));
    p->cp.base.progress = shoal_ring_ar_progress;
    shoal_ring_peers(comm, &p->cp, &p->pos);
    p->next = comm->topo->ring_next;
    p->prev = comm->topo->ring_prev;
    p->slice_elems = SHOAL_MAX(comm->coll->chunk / dsize, 1) * (size_t)comm->nranks;
    *cp_p = &p->cp;
    return SHOAL_OK;
}

/* ---- reduce-scatter -------------------------------------------------------------------- */

/* Rank r ends with block r. At ring position p, step k sends the partial of the block owned
 * by position p-k-1 and receives that of position p-k-2 (block = the owner's rank); the last
 * step reduces straight into the receive buffer. Chunked so scratch stays bounded: two
 * accumulators alternate, one being sent while the other fills. */
typedef struct {
    shoal_coll_plan_t cp;
    int pos, next, prev;
    size_t celems;
    size_t off;            /* current chunk's first element */
    uint32_t chunk;
    int k;
    int posted;
    const uint8_t *src;    /* what step k sends */
    shoal_tl_req_t sreq, rreq;
} shoal_ring_rs_plan_t;

static shoal_status_t shoal_ring_rs_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_ring_rs_plan_t *p = (shoal_ring_rs_plan_t *)plan;
    const shoal_coll_args_t *a = &p->cp.a;
    int n = comm->nranks, done;
    const int *order = comm->topo->ring_order;
    size_t ds = p->cp.dsize, chunk = comm->coll->chunk;
    const uint8_t *sbuf = a->sendbuf;
    uint8_t *tmp = p->cp.scratch;

    while (p->off < a->count) {
        size_t len = SHOAL_MIN(p->celems, a->count - p->off), bytes = len * ds;
        if (!p->posted) {
            if (p->k == 0) {
                p->src = sbuf + ((size_t)order[shoal_mod(p->pos - 1, n)] * a->count + p->off) * ds;
            }
            SHOAL_CHECK(shoal_chan_irecv(comm, p->prev, tmp, bytes, p->cp.seq, (uint32_t)p->k,
                                         p->chunk, &p->rreq));
            SHOAL_CHECK(shoal_chan_isend(comm, p->next, p->src, bytes, p->cp.seq,
                                         (uint32_t)p->k, p->chunk, &p->sreq));
            p->posted = 1;
        }
        SHOAL_CHECK(shoal_ring_test(comm, &p->cp, &p->rreq, p->prev, &done));
        if (!done) {
            return SHOAL_IN_PROGRESS;
        }
        SHOAL_CHECK(shoal_ring_test(comm, &p->cp, &p->sreq, p->next, &done));
        if (!done) {
            return SHOAL_IN_PROGRESS;
        }
        int rblk = order[shoal_mod(p->pos - p->k - 2, n)];
        uint8_t *dst = p->k == n - 2 ? (uint8_t *)a->recvbuf + p->off * ds
                                     : p->cp.scratch + (size_t)(1 + (p->k & 1)) * chunk;
        shoal_reduce2(dst, sbuf + ((size_t)rblk * a->count + p->off) * ds, tmp, len, a->dtype,
                      a->op);
        p->src = dst;
        p->posted = 0;
        if (++p->k == n - 1) {
            shoal_reduce_avg_finalize((uint8_t *)a->recvbuf + p->off * ds, len, a->dtype, a->op,
                                      n);
            p->k = 0;
            p->off += p->celems;
            p->chunk++;
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_ring_reduce_scatter_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                              const shoal_coll_args_t *a, uint32_t seq,
                                              int exclusive)
{
    shoal_ring_rs_plan_t *p;
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), exclusive,
                                      (shoal_coll_plan_t **)&p));
    p->cp.base.progress = shoal_ring_rs_progress;
    shoal_ring_peers(comm, &p->cp, &p->pos);
    p->next = comm->topo->ring_next;
    p->prev = comm->topo->ring_prev;
    p->celems = SHOAL_MAX(comm->coll->chunk / p->cp.dsize, 1);
    *cp_p = &p->cp;
    return SHOAL_OK;
}

/* ---- allgather ------------------------------------------------------------------------- */

/* Blocks of count elements; at ring position p, step j passes on the block of the rank at
 * position p-j. */
typedef struct {
    shoal_coll_plan_t cp;
    int pos, next, prev;
    int j;
    int posted;
    shoal_tl_req_t sreq, rreq;
} shoal_ring_ag_plan_t;

static shoal_status_t shoal_ring_ag_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_ring_ag_plan_t *p = (shoal_ring_ag_plan_t *)plan;
    const shoal_coll_args_t *a = &p->cp.a;
    int n = comm->nranks, done;
    const int *order = comm->topo->ring_order;
    size_t bytes = a->count * p->cp.dsize;
    uint8_t *rbuf = a->recvbuf;

    while (p->j < n - 1) {
        if (!p->posted) {
            int sblk = order[shoal_mod(p->pos - p->j, n)];
            int rblk = order[shoal_mod(p->pos - p->j - 1, n)];
            SHOAL_CHECK(shoal_chan_irecv(comm, p->prev, rbuf + (size_t)rblk * bytes, bytes,
                                         p->cp.seq, (uint32_t)p->j, 0, &p->rreq));
            SHOAL_CHECK(shoal_chan_isend(comm, p->next, rbuf + (size_t)sblk * bytes, bytes,
                                         p->cp.seq, (uint32_t)p->j, 0, &p->sreq));
            p->posted = 1;
        }
        SHOAL_CHECK(shoal_ring_test(comm, &p->cp, &p->rreq, p->prev, &done));
        if (!done) {
            return SHOAL_IN_PROGRESS;
        }
        SHOAL_CHECK(shoal_ring_test(comm, &p->cp, &p->sreq, p->next, &done));
        if (!done) {
            return SHOAL_IN_PROGRESS;
        }
        p->posted = 0;
        p->j++;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_ring_allgather_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                         const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_ring_ag_plan_t *p;
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    uint8_t *rbuf = a->recvbuf;
    /* no scratch (it receives straight into the buffer): the communicator's, never touched */
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), 1, (shoal_coll_plan_t **)&p));
    (void)exclusive;
    p->cp.base.progress = shoal_ring_ag_progress;
    shoal_ring_peers(comm, &p->cp, &p->pos);
    p->next = comm->topo->ring_next;
    p->prev = comm->topo->ring_prev;
    if (a->sendbuf != rbuf + (size_t)comm->rank * bytes) {
        memmove(rbuf + (size_t)comm->rank * bytes, a->sendbuf, bytes);
    }
    *cp_p = &p->cp;
    return SHOAL_OK;
}
