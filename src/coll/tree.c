/*
 * Double binary tree AllReduce (as in NCCL): two binary trees over the ranks, each carrying
 * half of the data; a rank that is interior in one is (mostly) a leaf in the other, so both
 * halves keep every link busy. Per tree: a pipelined reduce to the root, chunk by chunk
 * (each rank adds its children's partials to its own data in a fixed order, into its receive
 * buffer, and sends the sum up), the root scales AVG once, then a pipelined broadcast of the
 * result back down. Receives are posted one chunk ahead into scratch slots
 * [tree][child][parity]; both trees advance together in (chunk, tree) order, which is the
 * order on both sides of every pair.
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

typedef struct {
    struct shoal_comm *comm;
    const shoal_coll_args_t *a;
    uint32_t seq;
    size_t dsize;
    size_t celems;         /* elements per chunk */
    size_t base[2], len[2];/* element range of each tree */
    size_t nch[2];         /* chunks of each tree */
    size_t K;              /* max(nch) */
    shoal_tree_node_t t[2];
    shoal_tl_req_t rreq[2][2][2]; /* [tree][child or parent][parity] */
    shoal_tl_req_t sreq[2][2][2]; /* [tree][child or parent][parity] */
    shoal_tl_req_t *spend[2][2][2]; /* pending sends */
    int speer[2][2][2];    /* their peers */
} shoal_dbt_t;

static void shoal_dbt_range(const shoal_dbt_t *d, int t, size_t c, size_t *off_p, size_t *len_p)
{
    size_t o = c * d->celems;
    *off_p = d->base[t] + o;
    *len_p = SHOAL_MIN(d->celems, d->len[t] - o);
}

static uint8_t *shoal_dbt_slot(shoal_dbt_t *d, int t, int j, size_t c)
{
    size_t idx = (size_t)((t * 2 + j) * 2) + (c & 1);
    return d->comm->coll->scratch + idx * d->celems * d->dsize;
}

/* Wait for the send in slot [t][j][c&1] if one is pending (before reusing it). */
static shoal_status_t shoal_dbt_wait_send(shoal_dbt_t *d, int t, int j, size_t c)
{
    shoal_tl_req_t **sp = &d->spend[t][j][c & 1];
    shoal_status_t st = SHOAL_OK;
    if (*sp != NULL) {
        st = shoal_chan_waitall(d->comm, sp, &d->speer[t][j][c & 1], 1);
        *sp = NULL;
    }
    return st;
}

static shoal_status_t shoal_dbt_isend(shoal_dbt_t *d, int t, int j, size_t c, int peer,
                                      const void *buf, size_t len, uint32_t step)
{
    SHOAL_CHECK(shoal_dbt_wait_send(d, t, j, c));
    SHOAL_CHECK(shoal_chan_isend(d->comm, peer, buf, len, d->seq, step, (uint32_t)c,
                                 &d->sreq[t][j][c & 1]));
    d->spend[t][j][c & 1] = &d->sreq[t][j][c & 1];
    d->speer[t][j][c & 1] = peer;
    return SHOAL_OK;
}

static shoal_status_t shoal_dbt_drain(shoal_dbt_t *d)
{
    for (int t = 0; t < 2; t++) {
        for (int j = 0; j < 2; j++) {
            for (int p = 0; p < 2; p++) {
                SHOAL_CHECK(shoal_dbt_wait_send(d, t, j, (size_t)p));
            }
        }
    }
    return SHOAL_OK;
}

/* Up phase: post the children's chunk c of both trees. */
static shoal_status_t shoal_dbt_up_post(shoal_dbt_t *d, size_t c)
{
    for (int t = 0; t < 2; t++) {
        size_t off, len;
        if (c >= d->nch[t]) {
            continue;
        }
        shoal_dbt_range(d, t, c, &off, &len);
        for (int j = 0; j < 2; j++) {
            if (d->t[t].child[j] >= 0) {
                SHOAL_CHECK(shoal_chan_irecv(d->comm, d->t[t].child[j], shoal_dbt_slot(d, t, j, c),
                                             len * d->dsize, d->seq, SHOAL_DBT_UP + (uint32_t)t,
                                             (uint32_t)c, &d->rreq[t][j][c & 1]));
            }
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_dbt_up_chunk(shoal_dbt_t *d, int t, size_t c)
{
    const shoal_coll_args_t *a = d->a;
    const void *srcs[3];
    shoal_tl_req_t *reqs[2] = {NULL, NULL};
    int peers[2] = {d->t[t].child[0], d->t[t].child[1]}, ns = 1;
    size_t off, len;
    uint8_t *acc;

    shoal_dbt_range(d, t, c, &off, &len);
    acc = (uint8_t *)a->recvbuf + off * d->dsize;
    srcs[0] = (const uint8_t *)a->sendbuf + off * d->dsize;
    for (int j = 0; j < 2; j++) {
        if (peers[j] >= 0) {
            reqs[j] = &d->rreq[t][j][c & 1];
            srcs[ns++] = shoal_dbt_slot(d, t, j, c);
        }
    }
    SHOAL_CHECK(shoal_chan_waitall(d->comm, reqs, peers, 2));
    if (ns == 1 && d->t[t].parent >= 0) { /* a leaf sends its input as it is */
        return shoal_dbt_isend(d, t, 0, c, d->t[t].parent, srcs[0], len * d->dsize,
                               SHOAL_DBT_UP + (uint32_t)t);
    }
    if (ns > 1 || acc != srcs[0]) {
        shoal_reduce_n(acc, srcs, ns, len, a->dtype, a->op);
    }
    if (d->t[t].parent < 0) {
        shoal_reduce_avg_finalize(acc, len, a->dtype, a->op, d->comm->nranks);
        return SHOAL_OK;
    }
    return shoal_dbt_isend(d, t, 0, c, d->t[t].parent, acc, len * d->dsize,
                           SHOAL_DBT_UP + (uint32_t)t);
}

/* Down phase: post the parent's chunk c of both trees straight into the receive buffer. */
static shoal_status_t shoal_dbt_down_post(shoal_dbt_t *d, size_t c)
{
    for (int t = 0; t < 2; t++) {
        size_t off, len;
        if (c >= d->nch[t] || d->t[t].parent < 0) {
            continue;
        }
        shoal_dbt_range(d, t, c, &off, &len);
        SHOAL_CHECK(shoal_chan_irecv(d->comm, d->t[t].parent,
                                     (uint8_t *)d->a->recvbuf + off * d->dsize, len * d->dsize,
                                     d->seq, SHOAL_DBT_DOWN + (uint32_t)t, (uint32_t)c,
                                     &d->rreq[t][0][c & 1]));
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_dbt_down_chunk(shoal_dbt_t *d, int t, size_t c)
{
    size_t off, len;
    uint8_t *buf;

    shoal_dbt_range(d, t, c, &off, &len);
    buf = (uint8_t *)d->a->recvbuf + off * d->dsize;
    if (d->t[t].parent >= 0) {
        shoal_tl_req_t *reqs[1] = {&d->rreq[t][0][c & 1]};
        SHOAL_CHECK(shoal_chan_waitall(d->comm, reqs, &d->t[t].parent, 1));
    }
    for (int j = 0; j < 2; j++) {
        if (d->t[t].child[j] >= 0) {
            SHOAL_CHECK(shoal_dbt_isend(d, t, j, c, d->t[t].child[j], buf, len * d->dsize,
                                        SHOAL_DBT_DOWN + (uint32_t)t));
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_dbtree_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                      uint32_t seq)
{
    shoal_dbt_t d = {.comm = comm, .a = a, .seq = seq, .dsize = shoal_dtype_size(a->dtype)};
    size_t half = a->count / 2;

    memset(d.spend, 0, sizeof(d.spend));
    /* Scratch holds 8 receive slots: [tree][child][parity]. */
    d.celems = SHOAL_MAX(SHOAL_MIN(comm->coll->chunk, comm->coll->scratch_size / 8) / d.dsize,
                         1);
    d.base[0] = 0;
    d.len[0] = a->count - half;
    d.base[1] = d.len[0];
    d.len[1] = half;
    for (int t = 0; t < 2; t++) {
        d.nch[t] = (d.len[t] + d.celems - 1) / d.celems;
    }
    d.K = SHOAL_MAX(d.nch[0], d.nch[1]);
    shoal_dbtree_build(comm->nranks, comm->rank, d.t);

    SHOAL_CHECK(shoal_dbt_up_post(&d, 0));
    for (size_t c = 0; c < d.K; c++) {
        SHOAL_CHECK(shoal_dbt_up_post(&d, c + 1));
        for (int t = 0; t < 2; t++) {
            if (c < d.nch[t]) {
                SHOAL_CHECK(shoal_dbt_up_chunk(&d, t, c));
            }
        }
    }
    /* Partials sent up live in the receive buffer, which the down phase overwrites. */
    SHOAL_CHECK(shoal_dbt_drain(&d));
    SHOAL_CHECK(shoal_dbt_down_post(&d, 0));
    for (size_t c = 0; c < d.K; c++) {
        SHOAL_CHECK(shoal_dbt_down_post(&d, c + 1));
        for (int t = 0; t < 2; t++) {
            if (c < d.nch[t]) {
                SHOAL_CHECK(shoal_dbt_down_chunk(&d, t, c));
            }
        }
    }
    return shoal_dbt_drain(&d);
}
