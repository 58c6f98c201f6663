/*
 * Recursive doubling AllReduce for small messages: log2(p) exchanges of the whole buffer, as
 * a plan the progress engine advances step by step (the blocking call drives the same plan).
 * Non-power-of-two: the first 2*(n-p) ranks pair up, odd ones hand their data to the even
 * ones and sit out, then get the result back. Each exchange reduces lower-rank data first,
 * so both partners compute the same bits. The plan goes in scratch-sized passes, each a full
 * recursive doubling of its own, its steps numbered from 64 * pass so that passes never look
 * alike; selection gives rd only messages that fit the scratch buffer (its cost is -1 past
 * it, and a forced SHOAL_ALGO=rd falls back to the model there), so that is one pass today.
 */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_RD_UNFOLD_STEP 63u

typedef enum {
    SHOAL_RD_START,        /* a pass begins: pick this rank's role */
    SHOAL_RD_FOLD_SEND,    /* odd rank < 2*extra: hand the data to rank - 1 */
    SHOAL_RD_FOLD_WAIT,    /* ... and wait for the result */
    SHOAL_RD_FOLD_RECV,    /* even rank < 2*extra: take rank + 1's data */
    SHOAL_RD_XCHG,         /* exchange at mask with the partner, then reduce */
    SHOAL_RD_UNFOLD,       /* even rank < 2*extra: the result back to rank + 1 */
    SHOAL_RD_NEXT          /* the pass is over */
} shoal_rd_phase_t;

typedef struct {
    shoal_coll_plan_t cp;
    int p, extra, vrank;
    size_t piece;          /* elements per pass (scratch-sized) */
    size_t off, len;       /* the current pass's elements */
    uint32_t step0;
    shoal_rd_phase_t phase;
    int mask;
    shoal_coll_xchg_t x;
} shoal_rd_plan_t;

static int shoal_rd_peer(const shoal_rd_plan_t *p, int mask)
{
    return shoal_rd_real_rank(p->vrank ^ mask, p->extra);
}

static shoal_status_t shoal_rd_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_rd_plan_t *p = (shoal_rd_plan_t *)plan;
    const shoal_coll_args_t *a = &p->cp.a;
    int rank = comm->rank;
    size_t ds = p->cp.dsize;

    for (;;) {
        uint8_t *buf = (uint8_t *)a->recvbuf + p->off * ds, *tmp = p->cp.scratch;
        size_t bytes = p->len * ds;
        switch (p->phase) {
        case SHOAL_RD_START:
            if (p->off >= a->count) {
                return SHOAL_OK;
            }
            p->len = SHOAL_MIN(p->piece, a->count - p->off);
            p->mask = 1;
            if (rank < 2 * p->extra) {
                p->phase = rank % 2 == 1 ? SHOAL_RD_FOLD_SEND : SHOAL_RD_FOLD_RECV;
            } else {
                p->phase = SHOAL_RD_XCHG;
            }
            break;
        case SHOAL_RD_FOLD_SEND:
            SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, rank - 1, buf, bytes, -1, NULL, 0,
                                        p->step0, 0));
            p->phase = SHOAL_RD_FOLD_WAIT;
            break;
        case SHOAL_RD_FOLD_WAIT:
            SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, -1, NULL, 0, rank - 1, buf, bytes,
                                        p->step0 + SHOAL_RD_UNFOLD_STEP, 0));
            p->phase = SHOAL_RD_NEXT;
            break;
        case SHOAL_RD_FOLD_RECV:
            SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, -1, NULL, 0, rank + 1, tmp, bytes,
                                        p->step0, 0));
            shoal_reduce2(buf, buf, tmp, p->len, a->dtype, a->op);
            p->phase = SHOAL_RD_XCHG;
            break;
        case SHOAL_RD_XCHG:
            if (p->mask < p->p) {
                int peer = shoal_rd_peer(p, p->mask);
                uint32_t step = p->step0 + 1 + (uint32_t)__builtin_ctz((unsigned)p->mask);
                SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, peer, buf, bytes, peer, tmp,
                                            bytes, step, 0));
                if (peer < rank) {
                    /* The partner's call, roles and all (dst = its data, b = the other's):
                     * reduce2 into buf (dst = b) took another kernel variant, which picks the
                     * other operand's NaN payload (the compiler commutes float sums), so each
                     * rank of a pair kept its own NaN. */
                    shoal_reduce2(tmp, tmp, buf, p->len, a->dtype, a->op);
                    memcpy(buf, tmp, bytes);
                } else {
                    shoal_reduce2(buf, buf, tmp, p->len, a->dtype, a->op);
                }
                p->mask <<= 1;
                break;
            }
            shoal_reduce_avg_finalize(buf, p->len, a->dtype, a->op, comm->nranks);
            p->phase = rank < 2 * p->extra ? SHOAL_RD_UNFOLD : SHOAL_RD_NEXT;
            break;
        case SHOAL_RD_UNFOLD:
            SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, rank + 1, buf, bytes, -1, NULL, 0,
                                        p->step0 + SHOAL_RD_UNFOLD_STEP, 0));
            p->phase = SHOAL_RD_NEXT;
            break;
        case SHOAL_RD_NEXT:
            p->off += p->len;
            p->step0 += 64;
            p->phase = SHOAL_RD_START;
            break;
        }
    }
}

shoal_status_t shoal_rd_allreduce_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                       const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_rd_plan_t *p;
    int n = comm->nranks, rank = comm->rank;

    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), exclusive,
                                      (shoal_coll_plan_t **)&p));
    p->cp.base.progress = shoal_rd_progress;
    p->piece = SHOAL_MAX(comm->coll->scratch_size / p->cp.dsize, 1);
    p->p = 1;
    while (p->p * 2 <= n) {
        p->p *= 2;
    }
    p->extra = n - p->p;
    p->vrank = rank < 2 * p->extra ? rank / 2 : rank - p->extra;
    /* The channels it uses: the fold partner, then every exchange's (the even ranks of the
     * fold and the ranks above it). */
    if (rank < 2 * p->extra) {
        shoal_coll_plan_peer(&p->cp, rank % 2 == 1 ? rank - 1 : rank + 1);
    }
    if (rank >= 2 * p->extra || rank % 2 == 0) {
        for (int mask = 1; mask < p->p; mask <<= 1) {
            shoal_coll_plan_peer(&p->cp, shoal_rd_peer(p, mask));
        }
    }
    if (a->sendbuf != a->recvbuf) {
        memcpy(a->recvbuf, a->sendbuf, a->count * p->cp.dsize);
    }
    *cp_p = &p->cp;
    return SHOAL_OK;
}
