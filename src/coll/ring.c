/*
 * Ring algorithms. AllReduce = reduce-scatter + allgather around the ring, over slices of
 * n * chunk bytes; two slices move at once so that one slice's reduction overlaps the other's
 * transfer. Both sides post in the same order (slice-major within a step), which is what the
 * channels' FIFO matching needs. No initial copy: the first reduction of a block reads the
 * send buffer, later steps read the receive buffer.
 */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_RING_SLICES 2

typedef struct {
    struct shoal_comm *comm;
    const shoal_coll_args_t *a;
    uint32_t seq;
    size_t dsize;
    int pos;               /* this rank's ring position */
    int next;
    int prev;
} shoal_ring_t;

static void shoal_ring_setup(shoal_ring_t *r, struct shoal_comm *comm, const shoal_coll_args_t *a,
                             uint32_t seq)
{
    r->comm = comm;
    r->a = a;
    r->seq = seq;
    r->dsize = shoal_dtype_size(a->dtype);
    /* Neighbours in ring order (host-aware unless SHOAL_RING_ORDER=rank). Blocks follow ring
     * positions: the formulas below use pos where a rank-ordered ring uses rank. */
    r->pos = comm->coll->ring_pos;
    r->next = comm->coll->ring_next;
    r->prev = comm->coll->ring_prev;
}

/* One step k of slice [s0, s0+m) elements for every slice of the group: post all, then
 * reduce each slice as its data arrives. */
static shoal_status_t shoal_ring_ar_step(shoal_ring_t *r, const size_t *s0, const size_t *m,
                                         int nsl, int k, uint32_t slice0)
{
    struct shoal_comm *comm = r->comm;
    const shoal_coll_args_t *a = r->a;
    int n = comm->nranks, pos = r->pos, rs = k < n - 1;
    shoal_tl_req_t sreq[SHOAL_RING_SLICES], rreq[SHOAL_RING_SLICES];
    shoal_tl_req_t *reqs[2 * SHOAL_RING_SLICES];
    int peers[2 * SHOAL_RING_SLICES];
    uint8_t *rbuf = a->recvbuf;
    const uint8_t *sbuf = a->sendbuf;
    int sblk = rs ? shoal_mod(pos - k, n) : shoal_mod(pos + 1 - (k - (n - 1)), n);
    int rblk = rs ? shoal_mod(pos - k - 1, n) : shoal_mod(pos - (k - (n - 1)), n);

    for (int i = 0; i < nsl; i++) {
        size_t soff, slen, roff, rlen;
        uint8_t *rdst;
        shoal_block_range(m[i], n, sblk, &soff, &slen);
        shoal_block_range(m[i], n, rblk, &roff, &rlen);
        rdst = rs ? comm->coll->scratch + (size_t)i * comm->coll->chunk
                  : rbuf + (s0[i] + roff) * r->dsize;
        SHOAL_CHECK(shoal_chan_irecv(comm, r->prev, rdst, rlen * r->dsize, r->seq, (uint32_t)k,
                                     slice0 + (uint32_t)i, &rreq[i]));
        SHOAL_CHECK(shoal_chan_isend(comm, r->next,
                                     (k == 0 ? sbuf : rbuf) + (s0[i] + soff) * r->dsize,
                                     slen * r->dsize, r->seq, (uint32_t)k, slice0 + (uint32_t)i,
                                     &sreq[i]));
    }
    for (int i = 0; i < nsl; i++) {
        size_t roff, rlen;
        reqs[0] = &rreq[i];
        peers[0] = r->prev;
        SHOAL_CHECK(shoal_chan_waitall(comm, reqs, peers, 1));
        if (!rs) {
            continue;
        }
        shoal_block_range(m[i], n, rblk, &roff, &rlen);
        uint8_t *dst = rbuf + (s0[i] + roff) * r->dsize;
        shoal_reduce2(dst, sbuf + (s0[i] + roff) * r->dsize,
                      comm->coll->scratch + (size_t)i * comm->coll->chunk, rlen, a->dtype, a->op);
        if (k == n - 2) {
            /* This rank owns the block now complete: scale it once for AVG. */
            shoal_reduce_avg_finalize(dst, rlen, a->dtype, a->op, n);
        }
    }
    for (int i = 0; i < nsl; i++) {
        reqs[i] = &sreq[i];
        peers[i] = r->next;
    }
    return shoal_chan_waitall(comm, reqs, peers, nsl);
}

shoal_status_t shoal_ring_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                    uint32_t seq)
{
    shoal_ring_t r;
    int n = comm->nranks;
    size_t dsize = shoal_dtype_size(a->dtype);
    size_t blk_elems = SHOAL_MAX(comm->coll->chunk / dsize, 1);
    size_t slice_elems = blk_elems * (size_t)n;
    uint32_t slice = 0;

    shoal_ring_setup(&r, comm, a, seq);
    for (size_t base = 0; base < a->count; base += SHOAL_RING_SLICES * slice_elems) {
        size_t s0[SHOAL_RING_SLICES], m[SHOAL_RING_SLICES];
        int nsl = 0;
        for (int i = 0; i < SHOAL_RING_SLICES; i++) {
            size_t start = base + (size_t)i * slice_elems;
            if (start >= a->count) {
                break;
            }
            s0[nsl] = start;
            m[nsl] = SHOAL_MIN(slice_elems, a->count - start);
            nsl++;
        }
        for (int k = 0; k < 2 * (n - 1); k++) {
            SHOAL_CHECK(shoal_ring_ar_step(&r, s0, m, nsl, k, slice));
        }
        slice += (uint32_t)nsl;
    }
    return SHOAL_OK;
}

/* Reduce-scatter: rank r ends with block r. At ring position p, step k sends the partial of
 * the block owned by position p-k-1 and receives that of position p-k-2 (block = the owner's
 * rank); the last step reduces straight into the receive buffer. Chunked so scratch stays
 * bounded: two accumulators alternate, one being sent while the other fills. */
shoal_status_t shoal_ring_reduce_scatter(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                         uint32_t seq)
{
    shoal_ring_t r;
    int n = comm->nranks;
    const int *order = comm->coll->ring_order;
    size_t dsize = shoal_dtype_size(a->dtype);
    size_t celems = SHOAL_MAX(comm->coll->chunk / dsize, 1);
    const uint8_t *sbuf = a->sendbuf;
    uint8_t *tmp = comm->coll->scratch;
    uint8_t *acc[2] = {comm->coll->scratch + comm->coll->chunk,
                       comm->coll->scratch + 2 * comm->coll->chunk};
    uint32_t chunk = 0;

    shoal_ring_setup(&r, comm, a, seq);
    for (size_t off = 0; off < a->count; off += celems, chunk++) {
        size_t len = SHOAL_MIN(celems, a->count - off), bytes = len * dsize;
        const uint8_t *src =
            sbuf + ((size_t)order[shoal_mod(r.pos - 1, n)] * a->count + off) * dsize;
        for (int k = 0; k < n - 1; k++) {
            int rblk = order[shoal_mod(r.pos - k - 2, n)];
            uint8_t *dst = k == n - 2 ? (uint8_t *)a->recvbuf + off * dsize : acc[k & 1];
            SHOAL_CHECK(shoal_prim_sendrecv(comm, r.next, src, bytes, r.prev, tmp, bytes, seq,
                                            (uint32_t)k, chunk));
            shoal_reduce2(dst, sbuf + ((size_t)rblk * a->count + off) * dsize, tmp, len,
                          a->dtype, a->op);
            src = dst;
        }
        shoal_reduce_avg_finalize((uint8_t *)a->recvbuf + off * dsize, len, a->dtype, a->op, n);
    }
    return SHOAL_OK;
}

/* Allgather: blocks of count elements; at ring position p, step j passes on the block of the
 * rank at position p-j. */
shoal_status_t shoal_ring_allgather(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                    uint32_t seq)
{
    shoal_ring_t r;
    int n = comm->nranks, rank = comm->rank;
    const int *order = comm->coll->ring_order;
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    uint8_t *rbuf = a->recvbuf;

    shoal_ring_setup(&r, comm, a, seq);
    if (a->sendbuf != rbuf + (size_t)rank * bytes) {
        memmove(rbuf + (size_t)rank * bytes, a->sendbuf, bytes);
    }
    for (int j = 0; j < n - 1; j++) {
        int sblk = order[shoal_mod(r.pos - j, n)], rblk = order[shoal_mod(r.pos - j - 1, n)];
        SHOAL_CHECK(shoal_prim_sendrecv(comm, r.next, rbuf + (size_t)sblk * bytes, bytes, r.prev,
                                        rbuf + (size_t)rblk * bytes, bytes, seq, (uint32_t)j, 0));
    }
    return SHOAL_OK;
}
