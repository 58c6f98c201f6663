/*
 * Rabenseifner AllReduce: recursive-halving reduce-scatter, then recursive-doubling allgather,
 * over p = the largest power of two <= n. Non-power-of-two: the first 2*(n-p) ranks pair up,
 * odd ones hand their input to the even ones and sit out, then get the result back (the
 * usual fold). Blocks are the p ranges of shoal_block_range(count, p, b); after halving,
 * virtual rank v owns block v, scales it once for AVG, and the doubling spreads it.
 * Halving exchanges go through scratch in pieces (two alternate, so a piece's reduction
 * overlaps the next piece's transfer); the doubling moves whole ranges buffer to buffer.
 * Each exchange reduces the lower rank's data first.
 */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_RAB_UNFOLD_STEP 0x7fffu

typedef struct {
    struct shoal_comm *comm;
    const shoal_coll_args_t *a;
    uint32_t seq;
    size_t dsize;
    size_t piece;          /* elements per scratch piece (two pieces in scratch) */
    uint8_t *buf;
} shoal_rab_t;

static size_t shoal_rab_off(size_t count, int p, int b)
{
    return count * (size_t)b / (size_t)p;
}

static size_t shoal_rab_npieces(size_t len, size_t piece)
{
    return (len + piece - 1) / piece;
}

/*
 * Exchange with peer: send elements [so, so+sl) of src, receive the peer's copy of
 * [ko, ko+kl) and reduce it into buf (kept: buf[ko..] = low op high where the local data
 * comes from src). Both sides cut their messages into the same pieces (sl here is kl there).
 */
static shoal_status_t shoal_rab_xchg(shoal_rab_t *r, int peer, const uint8_t *src, size_t so,
                                     size_t sl, size_t ko, size_t kl, uint32_t step)
{
    struct shoal_comm *comm = r->comm;
    const shoal_coll_args_t *a = r->a;
    size_t P = r->piece, ds = r->dsize;
    size_t np = SHOAL_MAX(sl > 0 ? shoal_rab_npieces(sl, P) : 0,
                          kl > 0 ? shoal_rab_npieces(kl, P) : 0);
    shoal_tl_req_t sreq[2], rreq[2];
    shoal_tl_req_t *sp[2] = {NULL, NULL}, *reqs[2];
    int peers[2] = {peer, peer}, low_first = comm->rank > peer;

    for (size_t i = 0; i <= np; i++) {
        int s = (int)(i & 1);
        if (i < np && kl > 0) { /* post piece i */
            size_t o = SHOAL_MIN(i * P, kl), l = SHOAL_MIN(P, kl - o);
            SHOAL_CHECK(shoal_chan_irecv(comm, peer, comm->coll->scratch + (size_t)s * P * ds,
                                         l * ds, r->seq, step, (uint32_t)i, &rreq[s]));
        }
        if (i < np && sl > 0) {
            size_t o = SHOAL_MIN(i * P, sl), l = SHOAL_MIN(P, sl - o);
            if (sp[s] != NULL) {
                reqs[0] = sp[s];
                SHOAL_CHECK(shoal_chan_waitall(comm, reqs, peers, 1));
            }
            SHOAL_CHECK(shoal_chan_isend(comm, peer, src + (so + o) * ds, l * ds, r->seq, step,
                                         (uint32_t)i, &sreq[s]));
            sp[s] = &sreq[s];
        }
        if (i > 0 && kl > 0) { /* reduce piece i-1 */
            int t = (int)((i - 1) & 1);
            size_t o = SHOAL_MIN((i - 1) * P, kl), l = SHOAL_MIN(P, kl - o);
            const uint8_t *tmp = comm->coll->scratch + (size_t)t * P * ds;
            const uint8_t *mine = src + (ko + o) * ds;
            reqs[0] = &rreq[t];
            SHOAL_CHECK(shoal_chan_waitall(comm, reqs, peers, 1));
            shoal_reduce2(r->buf + (ko + o) * ds, low_first ? tmp : mine,
                          low_first ? mine : tmp, l, a->dtype, a->op);
        }
    }
    return shoal_chan_waitall(comm, sp, peers, 2);
}

/* Fold for non-power-of-two n; returns the virtual rank, or -1 for a rank that sat out. */
static shoal_status_t shoal_rab_fold(shoal_rab_t *r, int extra, const uint8_t **src_p,
                                     int *vrank_p)
{
    int rank = r->comm->rank;
    size_t count = r->a->count;

    if (rank >= 2 * extra) {
        *vrank_p = rank - extra;
        return SHOAL_OK;
    }
    if (rank % 2 == 1) {
        *vrank_p = -1;
        return shoal_rab_xchg(r, rank - 1, *src_p, 0, count, 0, 0, 0);
    }
    *vrank_p = rank / 2;
    SHOAL_CHECK(shoal_rab_xchg(r, rank + 1, *src_p, 0, 0, 0, count, 0));
    *src_p = r->buf;
    return SHOAL_OK;
}

shoal_status_t shoal_rab_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                   uint32_t seq)
{
    int n = comm->nranks, p = 1, extra, vrank, lo = 0;
    const uint8_t *src = a->sendbuf;
    size_t count = a->count;
    uint32_t step = 1;
    shoal_rab_t r = {.comm = comm, .a = a, .seq = seq, .dsize = shoal_dtype_size(a->dtype),
                     .buf = a->recvbuf};

    r.piece = SHOAL_MAX(comm->coll->scratch_size / 2 / r.dsize, 1);
    while (p * 2 <= n) {
        p *= 2;
    }
    extra = n - p;
    SHOAL_CHECK(shoal_rab_fold(&r, extra, &src, &vrank));
    if (vrank >= 0) {
        /* Halving: keep the half of [lo, lo + 2*mask) that holds vrank. */
        for (int mask = p / 2; mask > 0; mask >>= 1, step++) {
            int vpeer = vrank ^ mask, peer = vpeer < extra ? vpeer * 2 : vpeer + extra;
            int klo = (vrank & mask) ? lo + mask : lo, slo = (vrank & mask) ? lo : lo + mask;
            size_t ko = shoal_rab_off(count, p, klo), so = shoal_rab_off(count, p, slo);
            SHOAL_CHECK(shoal_rab_xchg(&r, peer, src, so, shoal_rab_off(count, p, slo + mask) - so,
                                       ko, shoal_rab_off(count, p, klo + mask) - ko, step));
            src = r.buf;
            lo = klo;
        }
        size_t bo = shoal_rab_off(count, p, vrank);
        shoal_reduce_avg_finalize(r.buf + bo * r.dsize, shoal_rab_off(count, p, vrank + 1) - bo,
                                  a->dtype, a->op, n);
        /* Doubling: my range [lo, lo + mask) and the peer's swap. */
        for (int mask = 1; mask < p; mask <<= 1, step++) {
            int vpeer = vrank ^ mask, peer = vpeer < extra ? vpeer * 2 : vpeer + extra;
            int mlo = vrank & ~(mask - 1), plo = vpeer & ~(mask - 1);
            size_t mo = shoal_rab_off(count, p, mlo), po = shoal_rab_off(count, p, plo);
            SHOAL_CHECK(shoal_prim_sendrecv(
                comm, peer, r.buf + mo * r.dsize,
                (shoal_rab_off(count, p, mlo + mask) - mo) * r.dsize, peer, r.buf + po * r.dsize,
                (shoal_rab_off(count, p, plo + mask) - po) * r.dsize, seq, step, 0));
        }
    }
    if (comm->rank < 2 * extra) {
        size_t bytes = count * r.dsize;
        if (comm->rank % 2 == 1) {
            return shoal_prim_recv(comm, comm->rank - 1, r.buf, bytes, seq,
                                   SHOAL_RAB_UNFOLD_STEP, 0);
        }
        return shoal_prim_send(comm, comm->rank + 1, r.buf, bytes, seq, SHOAL_RAB_UNFOLD_STEP, 0);
    }
    return SHOAL_OK;
}
