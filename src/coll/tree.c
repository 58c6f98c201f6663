/*
 * Double binary tree AllReduce (as in NCCL): two binary trees over the ranks, each carrying
 * half of the data; a rank that is interior in one is (mostly) a leaf in the other, so both
 * halves keep every link busy. Per tree: a pipelined reduce to the root, chunk by chunk
 * (each rank adds its children's partials to its own data in a fixed order, into its receive
 * buffer, and sends the sum up), the root scales AVG once, then a pipelined broadcast of the
 * result back down. Receives are posted one chunk ahead into scratch slots
 * [tree][child][parity]; both trees advance together in (chunk, tree) order, which is the
 * order on both sides of every pair. A plan the progress engine advances step by step (the
 * blocking call drives the same plan).
 */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_DBT_UP 0u
#define SHOAL_DBT_DOWN 2u

/* One binary tree rooted at 0 (NCCL's ncclGetBtree). */
static void shoal_btree(int n, int rank, shoal_tree_node_t *t)
{
    int bit, lowbit, up, d1;

    for (bit = 1; bit < n; bit <<= 1) {
        if (bit & rank) {
            break;
        }
    }
    if (rank == 0) {
        *t = (shoal_tree_node_t){.parent = -1, .child = {-1, n > 1 ? bit >> 1 : -1}};
        return;
    }
    up = (rank ^ bit) | (bit << 1);
    if (up >= n) {
        up = rank ^ bit;
    }
    lowbit = bit >> 1;
    d1 = lowbit == 0 ? -1 : rank + lowbit;
    while (d1 >= n) {
        lowbit >>= 1;
        d1 = lowbit == 0 ? -1 : rank + lowbit;
    }
    *t = (shoal_tree_node_t){.parent = up, .child = {bit >> 1 == 0 ? -1 : rank - (bit >> 1), d1}};
}

static int shoal_btree_map(int x, int n, int mirror)
{
    if (x < 0) {
        return -1;
    }
    return mirror ? n - 1 - x : (x + 1) % n;
}

void shoal_dbtree_build(int n, int rank, shoal_tree_node_t t[2])
{
    int mirror = n % 2 == 0;
    shoal_tree_node_t u;

    shoal_btree(n, rank, &t[0]);
    shoal_btree(n, mirror ? n - 1 - rank : shoal_mod(rank - 1, n), &u);
    t[1] = (shoal_tree_node_t){.parent = shoal_btree_map(u.parent, n, mirror),
                               .child = {shoal_btree_map(u.child[0], n, mirror),
                                         shoal_btree_map(u.child[1], n, mirror)}};
}

/* The plan: both trees advance together in (chunk, tree) order, up then down; every wait of
 * the algorithm is a test that returns SHOAL_IN_PROGRESS and resumes at the same point. */
typedef enum {
    SHOAL_DBT_UP_START,
    SHOAL_DBT_UP_RUN,
    SHOAL_DBT_UP_DRAIN,    /* partials sent up live in the receive buffer: the down phase
                            * overwrites it only once they are gone */
    SHOAL_DBT_DOWN_RUN,
    SHOAL_DBT_DOWN_DRAIN
} shoal_dbt_phase_t;

typedef struct {
    shoal_coll_plan_t cp;
    size_t celems;         /* elements per chunk */
    size_t base[2], len[2];/* element range of each tree */
    size_t nch[2];         /* chunks of each tree */
    size_t K;              /* max(nch) */
    shoal_tree_node_t t[2];
    shoal_dbt_phase_t phase;
    size_t c;              /* chunk */
    int tr;                /* tree within the chunk */
    int posted;            /* chunk c + 1's receives posted */
    int stage;             /* within (c, tr): 0 wait the receives, 1.. the sends */
    shoal_tl_req_t rreq[2][2][2]; /* [tree][child or parent][parity] */
    shoal_tl_req_t sreq[2][2][2]; /* [tree][child or parent][parity] */
    shoal_tl_req_t *spend[2][2][2]; /* pending sends */
    int speer[2][2][2];    /* their peers */
} shoal_dbt_plan_t;

static void shoal_dbt_range(const shoal_dbt_plan_t *d, int t, size_t c, size_t *off_p,
                            size_t *len_p)
{
    size_t o = c * d->celems;
    *off_p = d->base[t] + o;
    *len_p = SHOAL_MIN(d->celems, d->len[t] - o);
}

static uint8_t *shoal_dbt_slot(shoal_dbt_plan_t *d, int t, int j, size_t c)
{
    size_t idx = (size_t)((t * 2 + j) * 2) + (c & 1);
    return d->cp.scratch + idx * d->celems * d->cp.dsize;
}

/* Tests requests (NULL entries ignored); IN_PROGRESS with wait_peer set while one is not
 * done. */
static shoal_status_t shoal_dbt_test(struct shoal_comm *comm, shoal_dbt_plan_t *d,
                                     shoal_tl_req_t **reqs, int *peers, int n)
{
    int done;
    SHOAL_CHECK(shoal_chan_test(comm, reqs, peers, n, &done));
    if (!done) {
        for (int i = 0; i < n; i++) {
            if (reqs[i] != NULL && !__atomic_load_n(&reqs[i]->done, __ATOMIC_ACQUIRE)) {
                d->cp.base.wait_peer = peers[i];
                shoal_plan_wait_on(&d->cp.base, reqs[i]);
                break;
            }
        }
        return SHOAL_IN_PROGRESS;
    }
    return SHOAL_OK;
}

/* The send slot [t][j][c&1] is free once its pending send (chunk c - 2's) is done. */
static shoal_status_t shoal_dbt_slot_free(struct shoal_comm *comm, shoal_dbt_plan_t *d, int t,
                                          int j, size_t c)
{
    shoal_tl_req_t **sp = &d->spend[t][j][c & 1];
    if (*sp != NULL) {
        SHOAL_CHECK(shoal_dbt_test(comm, d, sp, &d->speer[t][j][c & 1], 1));
        *sp = NULL;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_dbt_isend(struct shoal_comm *comm, shoal_dbt_plan_t *d, int t, int j,
                                      size_t c, int peer, const void *buf, size_t len,
                                      uint32_t step)
{
    SHOAL_CHECK(shoal_chan_isend(comm, peer, buf, len, d->cp.seq, step, (uint32_t)c,
                                 &d->sreq[t][j][c & 1]));
    d->spend[t][j][c & 1] = &d->sreq[t][j][c & 1];
    d->speer[t][j][c & 1] = peer;
    return SHOAL_OK;
}

static shoal_status_t shoal_dbt_drain(struct shoal_comm *comm, shoal_dbt_plan_t *d)
{
    for (int t = 0; t < 2; t++) {
        for (int j = 0; j < 2; j++) {
            for (int p = 0; p < 2; p++) {
                SHOAL_CHECK(shoal_dbt_slot_free(comm, d, t, j, (size_t)p));
            }
        }
    }
    return SHOAL_OK;
}

/* Up phase: post the children's chunk c of both trees. */
static shoal_status_t shoal_dbt_up_post(struct shoal_comm *comm, shoal_dbt_plan_t *d, size_t c)
{
    for (int t = 0; t < 2; t++) {
        size_t off, len;
        if (c >= d->nch[t]) {
            continue;
        }
        shoal_dbt_range(d, t, c, &off, &len);
        for (int j = 0; j < 2; j++) {
            if (d->t[t].child[j] >= 0) {
                SHOAL_CHECK(shoal_chan_irecv(comm, d->t[t].child[j], shoal_dbt_slot(d, t, j, c),
                                             len * d->cp.dsize, d->cp.seq,
                                             SHOAL_DBT_UP + (uint32_t)t, (uint32_t)c,
                                             &d->rreq[t][j][c & 1]));
            }
        }
    }
    return SHOAL_OK;
}

/* Stage 0: the children's chunk arrived, reduce it (with mine) into the receive buffer;
 * stage 1: send the sum (a leaf: its input) to the parent once the slot is free. */
static shoal_status_t shoal_dbt_up_chunk(struct shoal_comm *comm, shoal_dbt_plan_t *d, int t,
                                         size_t c)
{
    const shoal_coll_args_t *a = &d->cp.a;
    const void *srcs[3];
    int ns = 1;
    size_t off, len, ds = d->cp.dsize;
    uint8_t *acc;

    shoal_dbt_range(d, t, c, &off, &len);
    acc = (uint8_t *)a->recvbuf + off * ds;
    srcs[0] = (const uint8_t *)a->sendbuf + off * ds;
    if (d->stage == 0) {
        shoal_tl_req_t *reqs[2] = {NULL, NULL};
        int peers[2] = {d->t[t].child[0], d->t[t].child[1]};
        for (int j = 0; j < 2; j++) {
            if (peers[j] >= 0) {
                reqs[j] = &d->rreq[t][j][c & 1];
                srcs[ns++] = shoal_dbt_slot(d, t, j, c);
            }
        }
        SHOAL_CHECK(shoal_dbt_test(comm, d, reqs, peers, 2));
        if (ns > 1 || (acc != srcs[0] && d->t[t].parent < 0)) {
            shoal_reduce_n(acc, srcs, ns, len, a->dtype, a->op);
        }
        if (d->t[t].parent < 0) {
            shoal_reduce_avg_finalize(acc, len, a->dtype, a->op, comm->nranks);
            return SHOAL_OK;
        }
        d->stage = 1;
    }
    /* a leaf sends its input as it is */
    SHOAL_CHECK(shoal_dbt_slot_free(comm, d, t, 0, c));
    return shoal_dbt_isend(comm, d, t, 0, c, d->t[t].parent,
                           d->t[t].child[0] < 0 && d->t[t].child[1] < 0 ? srcs[0] : acc,
                           len * ds, SHOAL_DBT_UP + (uint32_t)t);
}

/* Down phase: post the parent's chunk c of both trees straight into the receive buffer. */
static shoal_status_t shoal_dbt_down_post(struct shoal_comm *comm, shoal_dbt_plan_t *d, size_t c)
{
    for (int t = 0; t < 2; t++) {
        size_t off, len;
        if (c >= d->nch[t] || d->t[t].parent < 0) {
            continue;
        }
        shoal_dbt_range(d, t, c, &off, &len);
        SHOAL_CHECK(shoal_chan_irecv(comm, d->t[t].parent,
                                     (uint8_t *)d->cp.a.recvbuf + off * d->cp.dsize,
                                     len * d->cp.dsize, d->cp.seq, SHOAL_DBT_DOWN + (uint32_t)t,
                                     (uint32_t)c, &d->rreq[t][0][c & 1]));
    }
    return SHOAL_OK;
}

/* Stage 0: the parent's chunk arrived; stages 1 and 2: forward it to child 0 and 1. */
static shoal_status_t shoal_dbt_down_chunk(struct shoal_comm *comm, shoal_dbt_plan_t *d, int t,
                                           size_t c)
{
    size_t off, len;
    uint8_t *buf;

    shoal_dbt_range(d, t, c, &off, &len);
    buf = (uint8_t *)d->cp.a.recvbuf + off * d->cp.dsize;
    if (d->stage == 0) {
        if (d->t[t].parent >= 0) {
            shoal_tl_req_t *reqs[1] = {&d->rreq[t][0][c & 1]};
            SHOAL_CHECK(shoal_dbt_test(comm, d, reqs, &d->t[t].parent, 1));
        }
        d->stage = 1;
    }
    for (; d->stage <= 2; d->stage++) {
        int j = d->stage - 1;
        if (d->t[t].child[j] >= 0) {
            SHOAL_CHECK(shoal_dbt_slot_free(comm, d, t, j, c));
            SHOAL_CHECK(shoal_dbt_isend(comm, d, t, j, c, d->t[t].child[j], buf,
                                        len * d->cp.dsize, SHOAL_DBT_DOWN + (uint32_t)t));
        }
    }
    return SHOAL_OK;
}

/* One phase's chunks in (chunk, tree) order, the next chunk's receives posted ahead. */
static shoal_status_t shoal_dbt_run(struct shoal_comm *comm, shoal_dbt_plan_t *d, int up)
{
    for (; d->c < d->K; d->c++, d->tr = 0, d->posted = 0) {
        if (!d->posted) {
            SHOAL_CHECK(up ? shoal_dbt_up_post(comm, d, d->c + 1)
                           : shoal_dbt_down_post(comm, d, d->c + 1));
            d->posted = 1;
        }
        for (; d->tr < 2; d->tr++, d->stage = 0) {
            if (d->c < d->nch[d->tr]) {
                SHOAL_CHECK(up ? shoal_dbt_up_chunk(comm, d, d->tr, d->c)
                               : shoal_dbt_down_chunk(comm, d, d->tr, d->c));
            }
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_dbt_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_dbt_plan_t *d = (shoal_dbt_plan_t *)plan;
    switch (d->phase) {
    case SHOAL_DBT_UP_START:
        SHOAL_CHECK(shoal_dbt_up_post(comm, d, 0));
        d->phase = SHOAL_DBT_UP_RUN;
        /* fall through */
    case SHOAL_DBT_UP_RUN:
        SHOAL_CHECK(shoal_dbt_run(comm, d, 1));
        d->phase = SHOAL_DBT_UP_DRAIN;
        /* fall through */
    case SHOAL_DBT_UP_DRAIN:
        SHOAL_CHECK(shoal_dbt_drain(comm, d));
        SHOAL_CHECK(shoal_dbt_down_post(comm, d, 0));
        d->c = 0;
        d->tr = 0;
        d->posted = 0;
        d->stage = 0;
        d->phase = SHOAL_DBT_DOWN_RUN;
        /* fall through */
    case SHOAL_DBT_DOWN_RUN:
        SHOAL_CHECK(shoal_dbt_run(comm, d, 0));
        d->phase = SHOAL_DBT_DOWN_DRAIN;
        /* fall through */
    case SHOAL_DBT_DOWN_DRAIN:
        break;
    }
    return shoal_dbt_drain(comm, d);
}

shoal_status_t shoal_dbtree_allreduce_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                           const shoal_coll_args_t *a, uint32_t seq,
                                           int exclusive)
{
    shoal_dbt_plan_t *d;
    size_t half = a->count / 2;

    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*d), exclusive,
                                      (shoal_coll_plan_t **)&d));
    d->cp.base.progress = shoal_dbt_progress;
    /* Scratch holds 8 receive slots: [tree][child][parity]. */
    d->celems = SHOAL_MAX(SHOAL_MIN(comm->coll->chunk, comm->coll->scratch_size / 8) /
                              d->cp.dsize,
                          1);
    d->base[0] = 0;
    d->len[0] = a->count - half;
    d->base[1] = d->len[0];
    d->len[1] = half;
    for (int t = 0; t < 2; t++) {
        d->nch[t] = (d->len[t] + d->celems - 1) / d->celems;
    }
    d->K = SHOAL_MAX(d->nch[0], d->nch[1]);
    shoal_dbtree_build(comm->nranks, comm->rank, d->t);
    for (int t = 0; t < 2; t++) {
        shoal_coll_plan_peer(&d->cp, d->t[t].parent);
        shoal_coll_plan_peer(&d->cp, d->t[t].child[0]);
        shoal_coll_plan_peer(&d->cp, d->t[t].child[1]);
    }
    *cp_p = &d->cp;
    return SHOAL_OK;
}
