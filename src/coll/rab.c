/*
 * Rabenseifner AllReduce: recursive-halving reduce-scatter, then recursive-doubling allgather,
 * over p = the largest power of two <= n. Non-power-of-two: the first 2*(n-p) ranks pair up,
 * odd ones hand their input to the even ones and sit out, then get the result back (the
 * usual fold). Blocks are the p ranges of shoal_block_range(count, p, b); after halving,
 * virtual rank v owns block v, scales it once for AVG, and the doubling spreads it.
 * Halving exchanges go through scratch in pieces (two alternate, so a piece's reduction
 * overlaps the next piece's transfer); the doubling moves whole ranges buffer to buffer.
 * Each exchange reduces the lower rank's data first. A plan the progress engine advances step
 * by step (the blocking call drives the same plan).
 */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_RAB_UNFOLD_STEP 0x7fffu

/* One piece-wise exchange with peer (see shoal_rab_xchg_start), advanced without blocking. */
typedef struct {
    int peer;
    const uint8_t *src;
    size_t so, sl, ko, kl;
    uint32_t step;
    size_t np, i;          /* pieces, the current one */
    int sub;               /* within piece i: 0 post, 1 reduce piece i - 1 */
    shoal_tl_req_t sreq[2], rreq[2];
    int spend[2];          /* slot's send in flight */
} shoal_rab_xchg_t;

typedef enum {
    SHOAL_RAB_FOLD,
    SHOAL_RAB_HALVE,
    SHOAL_RAB_DOUBLE,
    SHOAL_RAB_UNFOLD,
    SHOAL_RAB_DONE
} shoal_rab_phase_t;

typedef struct {
    shoal_coll_plan_t cp;
    size_t piece;          /* elements per scratch piece (two pieces in scratch) */
    int p, extra, vrank, lo, mask;
    uint32_t step;
    const uint8_t *src;    /* this rank's data: the send buffer, then the receive buffer */
    shoal_rab_phase_t phase;
    int started;           /* the current exchange is set up */
    shoal_rab_xchg_t x;
    shoal_coll_xchg_t y;   /* whole-range exchanges (doubling, unfold) */
} shoal_rab_plan_t;

static size_t shoal_rab_off(size_t count, int p, int b)
{
    return count * (size_t)b / (size_t)p;
}

/*
 * Exchange with peer: send elements [so, so+sl) of src, receive the peer's copy of
 * [ko, ko+kl) and reduce it into the receive buffer (kept: buf[ko..] = low op high where the
 * local data comes from src). Both sides cut their messages into the same pieces (sl here is
 * kl there); two scratch slots alternate, so a piece's reduction overlaps the next one's
 * transfer.
 */
static void shoal_rab_xchg_start(shoal_rab_plan_t *r, int peer, const uint8_t *src, size_t so,
                                 size_t sl, size_t ko, size_t kl, uint32_t step)
{
    size_t P = r->piece;
    r->x = (shoal_rab_xchg_t){.peer = peer, .src = src, .so = so, .sl = sl, .ko = ko, .kl = kl,
                              .step = step};
    r->x.np = SHOAL_MAX(sl > 0 ? (sl + P - 1) / P : 0, kl > 0 ? (kl + P - 1) / P : 0);
    r->started = 1;
}

static shoal_status_t shoal_rab_test(struct shoal_comm *comm, shoal_rab_plan_t *r,
                                     shoal_tl_req_t *req, int peer)
{
    int done;
    SHOAL_CHECK(shoal_chan_test(comm, &req, &peer, 1, &done));
    if (!done) {
        r->cp.base.wait_peer = peer;
        shoal_plan_wait_on(&r->cp.base, req);
        return SHOAL_IN_PROGRESS;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_rab_xchg(struct shoal_comm *comm, shoal_rab_plan_t *r)
{
    shoal_rab_xchg_t *x = &r->x;
    const shoal_coll_args_t *a = &r->cp.a;
    size_t P = r->piece, ds = r->cp.dsize;
    int low_first = comm->rank > x->peer;

    for (; x->i <= x->np; x->i++, x->sub = 0) {
        int s = (int)(x->i & 1);
        if (x->sub == 0) {
            if (x->i < x->np && x->sl > 0 && x->spend[s]) { /* the slot's last send */
                SHOAL_CHECK(shoal_rab_test(comm, r, &x->sreq[s], x->peer));
                x->spend[s] = 0;
            }
            if (x->i < x->np && x->kl > 0) { /* post piece i */
                size_t o = SHOAL_MIN(x->i * P, x->kl), l = SHOAL_MIN(P, x->kl - o);
                SHOAL_CHECK(shoal_chan_irecv(comm, x->peer, r->cp.scratch + (size_t)s * P * ds,
                                             l * ds, r->cp.seq, x->step, (uint32_t)x->i,
                                             &x->rreq[s]));
            }
            if (x->i < x->np && x->sl > 0) {
                size_t o = SHOAL_MIN(x->i * P, x->sl), l = SHOAL_MIN(P, x->sl - o);
                SHOAL_CHECK(shoal_chan_isend(comm, x->peer, x->src + (x->so + o) * ds, l * ds,
                                             r->cp.seq, x->step, (uint32_t)x->i, &x->sreq[s]));
                x->spend[s] = 1;
            }
            x->sub = 1;
        }
        if (x->i > 0 && x->kl > 0) { /* reduce piece i-1 */
            int t = (int)((x->i - 1) & 1);
            size_t o = SHOAL_MIN((x->i - 1) * P, x->kl), l = SHOAL_MIN(P, x->kl - o);
            const uint8_t *tmp = r->cp.scratch + (size_t)t * P * ds;
            const uint8_t *mine = x->src + (x->ko + o) * ds;
            SHOAL_CHECK(shoal_rab_test(comm, r, &x->rreq[t], x->peer));
            shoal_reduce2((uint8_t *)a->recvbuf + (x->ko + o) * ds, low_first ? tmp : mine,
                          low_first ? mine : tmp, l, a->dtype, a->op);
        }
    }
    for (int s = 0; s < 2; s++) {
        if (x->spend[s]) {
            SHOAL_CHECK(shoal_rab_test(comm, r, &x->sreq[s], x->peer));
            x->spend[s] = 0;
        }
    }
    r->started = 0;
    return SHOAL_OK;
}

static int shoal_rab_peer(const shoal_rab_plan_t *r, int mask)
{
    return shoal_rd_real_rank(r->vrank ^ mask, r->extra);
}

static shoal_status_t shoal_rab_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_rab_plan_t *r = (shoal_rab_plan_t *)plan;
    const shoal_coll_args_t *a = &r->cp.a;
    int rank = comm->rank, p = r->p;
    size_t count = a->count, ds = r->cp.dsize;
    uint8_t *buf = a->recvbuf;

    for (;;) {
        switch (r->phase) {
        case SHOAL_RAB_FOLD:
            /* Fold for non-power-of-two n: odd ranks below 2*extra hand their input over and
             * sit out (vrank -1). */
            if (rank < 2 * r->extra) {
                if (!r->started) {
                    if (rank % 2 == 1) {
                        shoal_rab_xchg_start(r, rank - 1, r->src, 0, count, 0, 0, 0);
                    } else {
                        shoal_rab_xchg_start(r, rank + 1, r->src, 0, 0, 0, count, 0);
                    }
                }
                SHOAL_CHECK(shoal_rab_xchg(comm, r));
                if (rank % 2 == 0) {
                    r->src = buf;
                }
            }
            r->mask = p / 2;
            r->phase = r->vrank >= 0 ? SHOAL_RAB_HALVE : SHOAL_RAB_UNFOLD;
            break;
        case SHOAL_RAB_HALVE:
            /* Keep the half of [lo, lo + 2*mask) that holds vrank. */
            if (r->mask > 0) {
                int m = r->mask, peer = shoal_rab_peer(r, m);
                int klo = (r->vrank & m) ? r->lo + m : r->lo;
                int slo = (r->vrank & m) ? r->lo : r->lo + m;
                if (!r->started) {
                    size_t ko = shoal_rab_off(count, p, klo), so = shoal_rab_off(count, p, slo);
                    shoal_rab_xchg_start(r, peer, r->src, so,
                                         shoal_rab_off(count, p, slo + m) - so, ko,
                                         shoal_rab_off(count, p, klo + m) - ko, r->step);
                }
                SHOAL_CHECK(shoal_rab_xchg(comm, r));
                r->src = buf;
                r->lo = klo;
                r->mask >>= 1;
                r->step++;
                break;
            }
            {
                size_t bo = shoal_rab_off(count, p, r->vrank);
                shoal_reduce_avg_finalize(buf + bo * ds, shoal_rab_off(count, p, r->vrank + 1) - bo,
                                          a->dtype, a->op, comm->nranks);
            }
            r->mask = 1;
            r->phase = SHOAL_RAB_DOUBLE;
            break;
        case SHOAL_RAB_DOUBLE:
            /* My range [lo, lo + mask) and the peer's swap. */
            if (r->mask < p) {
                int m = r->mask, peer = shoal_rab_peer(r, m), vpeer = r->vrank ^ m;
                int mlo = r->vrank & ~(m - 1), plo = vpeer & ~(m - 1);
                size_t mo = shoal_rab_off(count, p, mlo), po = shoal_rab_off(count, p, plo);
                SHOAL_CHECK(shoal_coll_xchg(comm, &r->cp, &r->y, peer, buf + mo * ds,
                                            (shoal_rab_off(count, p, mlo + m) - mo) * ds, peer,
                                            buf + po * ds,
                                            (shoal_rab_off(count, p, plo + m) - po) * ds, r->step,
                                            0));
                r->mask <<= 1;
                r->step++;
                break;
            }
            r->phase = SHOAL_RAB_UNFOLD;
            break;
        case SHOAL_RAB_UNFOLD:
            if (rank < 2 * r->extra) {
                int odd = rank % 2 == 1;
                SHOAL_CHECK(shoal_coll_xchg(comm, &r->cp, &r->y, odd ? -1 : rank + 1, buf,
                                            count * ds, odd ? rank - 1 : -1, buf, count * ds,
                                            SHOAL_RAB_UNFOLD_STEP, 0));
            }
            r->phase = SHOAL_RAB_DONE;
            break;
        case SHOAL_RAB_DONE:
            return SHOAL_OK;
        }
    }
}

shoal_status_t shoal_rab_allreduce_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                        const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_rab_plan_t *r;
    int n = comm->nranks, rank = comm->rank;

    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*r), exclusive,
                                      (shoal_coll_plan_t **)&r));
    r->cp.base.progress = shoal_rab_progress;
    r->piece = SHOAL_MAX(comm->coll->scratch_size / 2 / r->cp.dsize, 1);
    r->p = 1;
    while (r->p * 2 <= n) {
        r->p *= 2;
    }
    r->extra = n - r->p;
    r->vrank = rank >= 2 * r->extra ? rank - r->extra : rank % 2 == 0 ? rank / 2 : -1;
    r->src = a->sendbuf;
    r->step = 1;
    if (rank < 2 * r->extra) {
        shoal_coll_plan_peer(&r->cp, rank % 2 == 1 ? rank - 1 : rank + 1);
    }
    for (int mask = 1; r->vrank >= 0 && mask < r->p; mask <<= 1) {
        shoal_coll_plan_peer(&r->cp, shoal_rab_peer(r, mask));
    }
    *cp_p = &r->cp;
    return SHOAL_OK;
}
