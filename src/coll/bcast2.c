/*
 * Pipelined binary-tree broadcast: the in-order binary tree of shoal_dbtree_build over
 * virtual ranks (rank - root) mod n, chunks of comm->coll->chunk; each rank posts receives
 * SHOAL_PTREE_DEPTH chunks ahead straight into the buffer and forwards every chunk to its
 * (up to two) children as soon as it arrives. Depth log2(n) instead of the chain's n - 1,
 * at twice the send volume on interior ranks. A plan the progress engine advances step by
 * step (the blocking call drives the same plan).
 */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_PTREE_DEPTH 4

typedef struct {
    shoal_coll_plan_t cp;
    size_t bytes, chunk, nchunks;
    int parent, child[2];
    size_t c;              /* chunk being forwarded */
    size_t posted;         /* receives posted */
    int stage;             /* within chunk c: 0 wait its receive, 1 free the send slot */
    shoal_tl_req_t rreq[SHOAL_PTREE_DEPTH], sreq[2][SHOAL_PTREE_DEPTH];
    int spend[2][SHOAL_PTREE_DEPTH]; /* the slot's send to child j is in flight */
} shoal_ptree_plan_t;

static shoal_status_t shoal_ptree_test(struct shoal_comm *comm, shoal_ptree_plan_t *b,
                                       shoal_tl_req_t *req, int peer)
{
    int done;
    SHOAL_CHECK(shoal_chan_test(comm, &req, &peer, 1, &done));
    if (!done) {
        b->cp.base.wait_peer = peer;
        shoal_plan_wait_on(&b->cp.base, req);
        return SHOAL_IN_PROGRESS;
    }
    return SHOAL_OK;
}

/* The sends of slot (chunk slot - DEPTH's) are done. */
static shoal_status_t shoal_ptree_slot_free(struct shoal_comm *comm, shoal_ptree_plan_t *b,
                                            int slot)
{
    for (int j = 0; j < 2; j++) {
        if (b->spend[j][slot]) {
            SHOAL_CHECK(shoal_ptree_test(comm, b, &b->sreq[j][slot], b->child[j]));
            b->spend[j][slot] = 0;
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_ptree_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_ptree_plan_t *b = (shoal_ptree_plan_t *)plan;
    uint8_t *buf = b->cp.a.recvbuf;

    for (; b->c < b->nchunks; b->c++, b->stage = 0) {
        size_t c = b->c, off = c * b->chunk, len = SHOAL_MIN(b->chunk, b->bytes - off);
        int slot = (int)(c % SHOAL_PTREE_DEPTH);
        if (b->stage == 0) {
            if (b->parent >= 0) {
                while (b->posted < b->nchunks && b->posted < c + SHOAL_PTREE_DEPTH) {
                    size_t po = b->posted * b->chunk;
                    SHOAL_CHECK(shoal_chan_irecv(comm, b->parent, buf + po,
                                                 SHOAL_MIN(b->chunk, b->bytes - po), b->cp.seq,
                                                 0, (uint32_t)b->posted,
                                                 &b->rreq[b->posted % SHOAL_PTREE_DEPTH]));
                    b->posted++;
                }
                SHOAL_CHECK(shoal_ptree_test(comm, b, &b->rreq[slot], b->parent));
            }
            b->stage = 1;
        }
        SHOAL_CHECK(shoal_ptree_slot_free(comm, b, slot));
        for (int j = 0; j < 2; j++) {
            if (b->child[j] >= 0) {
                SHOAL_CHECK(shoal_chan_isend(comm, b->child[j], buf + off, len, b->cp.seq, 0,
                                             (uint32_t)c, &b->sreq[j][slot]));
                b->spend[j][slot] = 1;
            }
        }
    }
    for (int s = 0; s < SHOAL_PTREE_DEPTH; s++) {
        SHOAL_CHECK(shoal_ptree_slot_free(comm, b, s));
    }
    return SHOAL_OK;
}

shoal_status_t shoal_ptree_bcast_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                      const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    int n = comm->nranks, v = shoal_mod(comm->rank - a->root, n);
    shoal_tree_node_t t[2];
    shoal_ptree_plan_t *b;

    /* no scratch (it receives straight into the buffer): the communicator's, never touched */
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*b), 1, (shoal_coll_plan_t **)&b));
    (void)exclusive;
    b->cp.base.progress = shoal_ptree_progress;
    b->bytes = a->count * b->cp.dsize;
    b->chunk = comm->coll->chunk;
    b->nchunks = (b->bytes + b->chunk - 1) / b->chunk;
    shoal_dbtree_build(n, v, t);
    b->parent = t[0].parent < 0 ? -1 : (t[0].parent + a->root) % n;
    for (int j = 0; j < 2; j++) {
        b->child[j] = t[0].child[j] < 0 ? -1 : (t[0].child[j] + a->root) % n;
    }
    shoal_coll_plan_peer(&b->cp, b->parent);
    shoal_coll_plan_peer(&b->cp, b->child[0]);
    shoal_coll_plan_peer(&b->cp, b->child[1]);
    if (comm->rank == a->root && a->sendbuf != a->recvbuf) {
        memcpy(a->recvbuf, a->sendbuf, b->bytes);
    }
    *cp_p = &b->cp;
    return SHOAL_OK;
}
