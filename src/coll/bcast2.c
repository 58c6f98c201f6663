/*
 * Pipelined binary-tree broadcast: the in-order binary tree of shoal_dbtree_build over
 * virtual ranks (rank - root) mod n, chunks of comm->coll->chunk; each rank posts receives
 * SHOAL_PTREE_DEPTH chunks ahead straight into the buffer and forwards every chunk to its
 * (up to two) children as soon as it arrives. Depth log2(n) instead of the chain's n - 1,
 * at twice the send volume on interior ranks.
 */
#include "coll/coll.h"

#include <string.h>

#define SHOAL_PTREE_DEPTH 4

typedef struct {
    struct shoal_comm *comm;
    uint8_t *buf;
    size_t bytes, chunk, nchunks;
    uint32_t seq;
    int parent, child[2];
    shoal_tl_req_t rreq[SHOAL_PTREE_DEPTH], sreq[2][SHOAL_PTREE_DEPTH];
    shoal_tl_req_t *spend[2][SHOAL_PTREE_DEPTH];
} shoal_ptree_t;

static shoal_status_t shoal_ptree_wait_sends(shoal_ptree_t *b, int slot)
{
    for (int j = 0; j < 2; j++) {
        if (b->spend[j][slot] != NULL) {
            SHOAL_CHECK(shoal_chan_waitall(b->comm, &b->spend[j][slot], &b->child[j], 1));
            b->spend[j][slot] = NULL;
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_ptree_chunk(shoal_ptree_t *b, size_t c, size_t *posted_p)
{
    size_t off = c * b->chunk, len = SHOAL_MIN(b->chunk, b->bytes - off);
    int slot = (int)(c % SHOAL_PTREE_DEPTH);

    if (b->parent >= 0) {
        shoal_tl_req_t *reqs[1] = {&b->rreq[slot]};
        while (*posted_p < b->nchunks && *posted_p < c + SHOAL_PTREE_DEPTH) {
            size_t po = *posted_p * b->chunk;
            SHOAL_CHECK(shoal_chan_irecv(b->comm, b->parent, b->buf + po,
                                         SHOAL_MIN(b->chunk, b->bytes - po), b->seq, 0,
                                         (uint32_t)*posted_p,
                                         &b->rreq[*posted_p % SHOAL_PTREE_DEPTH]));
            ++*posted_p;
        }
        SHOAL_CHECK(shoal_chan_waitall(b->comm, reqs, &b->parent, 1));
    }
    SHOAL_CHECK(shoal_ptree_wait_sends(b, slot));
    for (int j = 0; j < 2; j++) {
        if (b->child[j] >= 0) {
            SHOAL_CHECK(shoal_chan_isend(b->comm, b->child[j], b->buf + off, len, b->seq, 0,
                                         (uint32_t)c, &b->sreq[j][slot]));
            b->spend[j][slot] = &b->sreq[j][slot];
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_ptree_bcast(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                 uint32_t seq)
{
    int n = comm->nranks, v = shoal_mod(comm->rank - a->root, n);
    shoal_tree_node_t t[2];
    shoal_ptree_t b = {.comm = comm, .buf = a->recvbuf, .seq = seq,
                       .bytes = a->count * shoal_dtype_size(a->dtype), .chunk = comm->coll->chunk};
    size_t posted = 0;

    if (comm->rank == a->root && a->sendbuf != a->recvbuf) {
        memcpy(a->recvbuf, a->sendbuf, b.bytes);
    }
    memset(b.spend, 0, sizeof(b.spend));
    shoal_dbtree_build(n, v, t);
    b.parent = t[0].parent < 0 ? -1 : (t[0].parent + a->root) % n;
    for (int j = 0; j < 2; j++) {
        b.child[j] = t[0].child[j] < 0 ? -1 : (t[0].child[j] + a->root) % n;
    }
    b.nchunks = (b.bytes + b.chunk - 1) / b.chunk;
    for (size_t c = 0; c < b.nchunks; c++) {
        SHOAL_CHECK(shoal_ptree_chunk(&b, c, &posted));
    }
    for (int s = 0; s < SHOAL_PTREE_DEPTH; s++) {
        SHOAL_CHECK(shoal_ptree_wait_sends(&b, s));
    }
    return SHOAL_OK;
}
