/* Broadcast (binomial tree / pipelined chain), reduce (chunked binomial tree), barrier
 * (dissemination) and point-to-point. The broadcasts, the reduce and the barrier are step-wise
 * plans. */
#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>

#define SHOAL_CHAIN_DEPTH 4

/* Binomial tree rooted at root over virtual ranks v = rank - root: receive from the parent,
 * then post every send to the children and wait for them together (one blocking send after
 * the other made the root pay a full wait per child: 2-3x slower on TCP at 3-4 ranks). */
#define SHOAL_TREE_MAX_CHILDREN 32
typedef struct {
    shoal_coll_plan_t cp;
    int parent;            /* -1 at the root */
    int nchildren;
    int children[SHOAL_TREE_MAX_CHILDREN];
    int state;             /* 0 post the receive, 1 receiving, 2 sending */
    shoal_tl_req_t rreq, sreq[SHOAL_TREE_MAX_CHILDREN];
} shoal_tree_bcast_plan_t;

static shoal_status_t shoal_tree_bcast_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_tree_bcast_plan_t *p = (shoal_tree_bcast_plan_t *)plan;
    size_t bytes = p->cp.a.count * p->cp.dsize;
    uint8_t *buf = p->cp.a.recvbuf;
    shoal_tl_req_t *rp[SHOAL_TREE_MAX_CHILDREN];
    int done;

    if (p->state == 0) {
        if (p->parent >= 0) {
            SHOAL_CHECK(shoal_chan_irecv(comm, p->parent, buf, bytes, p->cp.seq, 0, 0, &p->rreq));
        }
        p->state = 1;
    }
    if (p->state == 1) {
        if (p->parent >= 0) {
            shoal_tl_req_t *r = &p->rreq;
            SHOAL_CHECK(shoal_chan_test(comm, &r, &p->parent, 1, &done));
            if (!done) {
                p->cp.base.wait_peer = p->parent;
                shoal_plan_wait_on(&p->cp.base, r);
                return SHOAL_IN_PROGRESS;
            }
        }
        for (int i = 0; i < p->nchildren; i++) {
            SHOAL_CHECK(shoal_chan_isend(comm, p->children[i], buf, bytes, p->cp.seq, 0, 0,
                                         &p->sreq[i]));
        }
        p->state = 2;
    }
    for (int i = 0; i < p->nchildren; i++) {
        rp[i] = &p->sreq[i];
    }
    SHOAL_CHECK(shoal_chan_test(comm, rp, p->children, p->nchildren, &done));
    if (!done) {
        p->cp.base.wait_peer = p->children[0];
        return SHOAL_IN_PROGRESS;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_tree_bcast_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                     const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_tree_bcast_plan_t *p;
    int n = comm->nranks, v = shoal_mod(comm->rank - a->root, n), mask = 1;
    /* no scratch (it receives straight into the buffer): the communicator's, never touched */
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), 1, (shoal_coll_plan_t **)&p));
    (void)exclusive;
    p->cp.base.progress = shoal_tree_bcast_progress;
    p->parent = -1;
    while (mask < n) {
        if (v & mask) {
            p->parent = shoal_mod(v - mask + a->root, n);
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (v + mask < n) {
            p->children[p->nchildren++] = shoal_mod(v + mask + a->root, n);
        }
    }
    if (p->nchildren + 1 <= SHOAL_PLAN_PEERS) {
        if (p->parent >= 0) {
            p->cp.base.peers[p->cp.base.npeers++] = p->parent;
        }
        for (int i = 0; i < p->nchildren; i++) {
            p->cp.base.peers[p->cp.base.npeers++] = p->children[i];
        }
    } else {
        p->cp.base.npeers = -1; /* more channels than a plan lists: it runs alone */
    }
    if (comm->rank == a->root && a->sendbuf != a->recvbuf) {
        memcpy(a->recvbuf, a->sendbuf, a->count * p->cp.dsize);
    }
    *cp_p = &p->cp;
    return SHOAL_OK;
}

/* Chain root -> root+1 -> ... in chunks; each rank forwards chunk c while chunks c+1.. are
 * still arriving (up to SHOAL_CHAIN_DEPTH receives posted ahead). */
typedef struct {
    shoal_coll_plan_t cp;
    int v, prev, next;
    size_t chunk, nchunks;
    size_t c;              /* chunk being forwarded */
    size_t posted;         /* receives posted */
    int sent;              /* chunk c's send posted */
    shoal_tl_req_t rreq[SHOAL_CHAIN_DEPTH], sreq[SHOAL_CHAIN_DEPTH];
} shoal_chain_plan_t;

static shoal_status_t shoal_chain_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_chain_plan_t *p = (shoal_chain_plan_t *)plan;
    int n = comm->nranks, done;
    size_t bytes = p->cp.a.count * p->cp.dsize, chunk = p->chunk;
    uint8_t *buf = p->cp.a.recvbuf;

    while (p->c < p->nchunks) {
        size_t c = p->c, off = c * chunk, len = SHOAL_MIN(chunk, bytes - off);
        int slot = (int)(c % SHOAL_CHAIN_DEPTH);
        if (p->v != 0) {
            while (p->posted < p->nchunks && p->posted < c + SHOAL_CHAIN_DEPTH) {
                size_t po = p->posted * chunk;
                SHOAL_CHECK(shoal_chan_irecv(comm, p->prev, buf + po,
                                             SHOAL_MIN(chunk, bytes - po), p->cp.seq, 0,
                                             (uint32_t)p->posted,
                                             &p->rreq[p->posted % SHOAL_CHAIN_DEPTH]));
                p->posted++;
            }
            shoal_tl_req_t *r = &p->rreq[slot];
            SHOAL_CHECK(shoal_chan_test(comm, &r, &p->prev, 1, &done));
            if (!done) {
                p->cp.base.wait_peer = p->prev;
                shoal_plan_wait_on(&p->cp.base, r);
                return SHOAL_IN_PROGRESS;
            }
        }
        if (p->v != n - 1) {
            if (c >= SHOAL_CHAIN_DEPTH) {
                shoal_tl_req_t *r = &p->sreq[slot];
                SHOAL_CHECK(shoal_chan_test(comm, &r, &p->next, 1, &done));
                if (!done) {
                    p->cp.base.wait_peer = p->next;
                    shoal_plan_wait_on(&p->cp.base, r);
                    return SHOAL_IN_PROGRESS;
                }
            }
            SHOAL_CHECK(shoal_chan_isend(comm, p->next, buf + off, len, p->cp.seq, 0,
                                         (uint32_t)c, &p->sreq[slot]));
        }
        p->c++;
    }
    if (p->v != n - 1) {
        shoal_tl_req_t *reqs[SHOAL_CHAIN_DEPTH];
        int peers[SHOAL_CHAIN_DEPTH], k = 0;
        for (size_t c = p->nchunks > SHOAL_CHAIN_DEPTH ? p->nchunks - SHOAL_CHAIN_DEPTH : 0;
             c < p->nchunks; c++, k++) {
            reqs[k] = &p->sreq[c % SHOAL_CHAIN_DEPTH];
            peers[k] = p->next;
        }
        SHOAL_CHECK(shoal_chan_test(comm, reqs, peers, k, &done));
        if (!done) {
            p->cp.base.wait_peer = p->next;
            return SHOAL_IN_PROGRESS;
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_chain_bcast_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                      const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_chain_plan_t *p;
    int n = comm->nranks;
    /* no scratch (it receives straight into the buffer): the communicator's, never touched */
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), 1, (shoal_coll_plan_t **)&p));
    (void)exclusive;
    p->cp.base.progress = shoal_chain_progress;
    p->v = shoal_mod(comm->rank - a->root, n);
    p->prev = shoal_mod(comm->rank - 1, n);
    p->next = shoal_mod(comm->rank + 1, n);
    p->cp.base.npeers = 2;
    p->cp.base.peers[0] = p->prev;
    p->cp.base.peers[1] = p->next;
    p->chunk = comm->coll->chunk;
    p->nchunks = (a->count * p->cp.dsize + p->chunk - 1) / p->chunk;
    if (comm->rank == a->root && a->sendbuf != a->recvbuf) {
        memcpy(a->recvbuf, a->sendbuf, a->count * p->cp.dsize);
    }
    *cp_p = &p->cp;
    return SHOAL_OK;
}

/* Binomial tree reduce, chunk by chunk, as a plan. Children are combined in a fixed order, so
 * the result is deterministic. Non-roots accumulate in scratch: their recvbuf is not
 * significant. Scratch: the receive slot, then the accumulator (chunk bytes each). */
typedef struct {
    shoal_coll_plan_t cp;
    int v, parent, top;
    size_t celems, off;
    uint32_t c;
    int mask;              /* the next child's distance; 0: the chunk has not started */
    int sending;           /* the chunk is reduced: sending it to the parent */
    const uint8_t *first;  /* what the next reduction adds to */
    shoal_coll_xchg_t x;
} shoal_tree_reduce_plan_t;

static shoal_status_t shoal_tree_reduce_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_tree_reduce_plan_t *p = (shoal_tree_reduce_plan_t *)plan;
    const shoal_coll_args_t *a = &p->cp.a;
    int n = comm->nranks, v = p->v;
    size_t ds = p->cp.dsize;
    uint8_t *tmp = p->cp.scratch, *accbuf = p->cp.scratch + comm->coll->chunk;

    while (p->off < a->count) {
        size_t len = SHOAL_MIN(p->celems, a->count - p->off), bytes = len * ds;
        uint8_t *acc = v == 0 ? (uint8_t *)a->recvbuf + p->off * ds : accbuf;
        if (!p->sending) {
            if (p->mask == 0) {
                p->mask = 1;
                p->first = (const uint8_t *)a->sendbuf + p->off * ds;
            }
            for (; (p->mask < p->top || (v == 0 && p->mask < n)) && v + p->mask < n;
                 p->mask <<= 1) {
                SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, -1, NULL, 0,
                                            shoal_mod(v + p->mask + a->root, n), tmp, bytes,
                                            0, p->c));
                shoal_reduce2(acc, p->first, tmp, len, a->dtype, a->op);
                p->first = acc;
            }
            if (p->first != acc) {
                memmove(acc, p->first, bytes);
            }
            if (v == 0) {
                shoal_reduce_avg_finalize(acc, len, a->dtype, a->op, n);
            }
            p->sending = v != 0;
        }
        if (p->sending) {
            SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, p->parent, acc, bytes, -1, NULL, 0,
                                        0, p->c));
            p->sending = 0;
        }
        p->off += p->celems;
        p->c++;
        p->mask = 0;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_tree_reduce_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                      const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_tree_reduce_plan_t *p;
    int n = comm->nranks;

    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), exclusive,
                                      (shoal_coll_plan_t **)&p));
    p->cp.base.progress = shoal_tree_reduce_progress;
    p->v = shoal_mod(comm->rank - a->root, n);
    p->parent = -1;
    p->top = 1;
    while (p->top < n && (p->v & p->top) == 0) {
        p->top <<= 1;
    }
    if (p->v != 0) {
        p->parent = shoal_mod(p->v - p->top + a->root, n);
        shoal_coll_plan_peer(&p->cp, p->parent);
    }
    for (int mask = 1; (mask < p->top || (p->v == 0 && mask < n)) && p->v + mask < n;
         mask <<= 1) {
        shoal_coll_plan_peer(&p->cp, shoal_mod(p->v + mask + a->root, n));
    }
    p->celems = SHOAL_MAX(comm->coll->chunk / p->cp.dsize, 1);
    *cp_p = &p->cp;
    return SHOAL_OK;
}

/* Dissemination barrier: step d = 1, 2, 4, ... sends an empty message to rank + d and waits
 * for one from rank - d; ceil(log2 n) steps, as a plan. */
typedef struct {
    shoal_coll_plan_t cp;
    int d;
    uint8_t dummy[2];      /* what the empty messages point at */
    shoal_coll_xchg_t x;
} shoal_barrier_plan_t;

static shoal_status_t shoal_barrier_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_barrier_plan_t *p = (shoal_barrier_plan_t *)plan;
    int n = comm->nranks;
    for (; p->d < n; p->d <<= 1) {
        SHOAL_CHECK(shoal_coll_xchg(comm, &p->cp, &p->x, (comm->rank + p->d) % n, &p->dummy[0],
                                    0, shoal_mod(comm->rank - p->d, n), &p->dummy[1], 0,
                                    (uint32_t)__builtin_ctz((unsigned)p->d), 0));
    }
    return SHOAL_OK;
}

shoal_status_t shoal_barrier_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                  const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_barrier_plan_t *p;
    int n = comm->nranks;
    /* no scratch: the communicator's, whoever holds the ticket never touches it */
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), 1, (shoal_coll_plan_t **)&p));
    (void)exclusive;
    p->cp.base.progress = shoal_barrier_progress;
    p->d = 1;
    for (int d = 1; d < n; d <<= 1) {
        shoal_coll_plan_peer(&p->cp, (comm->rank + d) % n);
        shoal_coll_plan_peer(&p->cp, shoal_mod(comm->rank - d, n));
    }
    *cp_p = &p->cp;
    return SHOAL_OK;
}

shoal_status_t shoal_p2p_run(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    shoal_chan_t *ch = &comm->chans[a->root];
    if (a->type == SHOAL_COLL_SEND) {
        return shoal_prim_send(comm, a->root, a->sendbuf, bytes, ch->p2p_send_seq++,
                               SHOAL_P2P_STEP, 0);
    }
    return shoal_prim_recv(comm, a->root, a->recvbuf, bytes, ch->p2p_recv_seq++, SHOAL_P2P_STEP,
                           0);
}

/* Posts batch b's messages into reqs/rp/peers (b->n each); returns how many were posted (all
 * unless one failed: that failed the communicator, and b->status says why). Sequence numbers
 * are taken in the calls' order, as one call after the other would take them. */
static int shoal_p2p_post_batch(shoal_p2p_batch_t *b, shoal_tl_req_t *reqs, shoal_tl_req_t **rp,
                                int *peers)
{
    struct shoal_comm *comm = b->comm;
    int posted = 0;

    for (int i = 0; i < b->n; i++) {
        const shoal_coll_args_t *a = &b->ops[i];
        size_t bytes = a->count * shoal_dtype_size(a->dtype);
        shoal_chan_t *ch = &comm->chans[a->root];
        if (a->type == SHOAL_COLL_SEND) {
            b->status = shoal_chan_isend(comm, a->root, a->sendbuf, bytes, ch->p2p_send_seq++,
                                         SHOAL_P2P_STEP, 0, &reqs[i]);
        } else {
            b->status = shoal_chan_irecv(comm, a->root, a->recvbuf, bytes, ch->p2p_recv_seq++,
                                         SHOAL_P2P_STEP, 0, &reqs[i]);
        }
        if (b->status != SHOAL_OK) {
            break;
        }
        rp[i] = &reqs[i];
        peers[i] = a->root;
        posted++;
    }
    return posted;
}

/* The requests of rp[0..n) not done yet. */
static int shoal_p2p_npending(shoal_tl_req_t **rp, int n)
{
    int pending = 0;
    for (int i = 0; i < n; i++) {
        pending += rp[i] != NULL && !__atomic_load_n(&rp[i]->done, __ATOMIC_ACQUIRE);
    }
    return pending;
}

/* The peer of the first request of rp[0..n) not done yet (-1: none). */
static int shoal_p2p_first_pending(shoal_tl_req_t **rp, const int *peers, int n)
{
    for (int i = 0; i < n; i++) {
        if (rp[i] != NULL && !__atomic_load_n(&rp[i]->done, __ATOMIC_ACQUIRE)) {
            return peers[i];
        }
    }
    return -1;
}

/* The wait of several batches: each round progresses every communicator that still has
 * messages and tests them; a round without progress idles on each of them (their abort, dead
 * peers and deadline are checked there; a sleep lasts at most 1 ms per communicator). A
 * failed request fails its communicator, which failed its every pending request, so that
 * batch is over; the others go on: their peers wait for them. */
static void shoal_p2p_wait_batches(shoal_p2p_batch_t *b, int nb, shoal_tl_req_t **rp,
                                   int *peers, const int *off, const int *posted,
                                   uint64_t *deadline, int *npending, unsigned *spins,
                                   uint8_t *over)
{
    for (;;) {
        int left = 0, progressed = 0;
        for (int k = 0; k < nb; k++) {
            int done = 0;
            shoal_status_t st;
            if (over[k]) {
                continue;
            }
            progressed |= shoal_chan_progress(b[k].comm) > 0;
            st = shoal_chan_test(b[k].comm, rp + off[k], peers + off[k], posted[k], &done);
            if (st != SHOAL_OK || done) {
                b[k].status = b[k].status != SHOAL_OK ? b[k].status : st;
                over[k] = 1;
            } else {
                left++;
            }
        }
        if (left == 0) {
            return;
        }
        for (int k = 0; k < nb; k++) {
            shoal_status_t st;
            int pending;
            if (over[k]) {
                continue;
            }
            /* each batch's timeout runs from its last message done (shoal_chan_wait) */
            pending = shoal_p2p_npending(rp + off[k], posted[k]);
            if (pending < npending[k]) {
                npending[k] = pending;
                deadline[k] = shoal_deadline_ns(b[k].comm->timeout_ms);
            }
            if (progressed) {
                spins[k] = 0;
                continue;
            }
            if (!shoal_chan_idle_may_fail(b[k].comm, spins[k], deadline[k])) {
                st = shoal_chan_idle(b[k].comm, &spins[k], deadline[k], "waiting");
            } else {
                char what[128];
                int peer = shoal_p2p_first_pending(rp + off[k], peers + off[k], posted[k]);
                snprintf(what, sizeof(what), "waiting for peer %d (%s) in a group over %d "
                         "communicators", peer, shoal_comm_peer_host(b[k].comm, peer), nb);
                st = shoal_chan_idle(b[k].comm, &spins[k], deadline[k], what);
            }
            if (st != SHOAL_OK) {
                b[k].status = b[k].status != SHOAL_OK ? b[k].status : st;
                over[k] = 1;
            }
        }
    }
}

shoal_status_t shoal_p2p_run_batches(shoal_p2p_batch_t *b, int nb)
{
    int total = 0, *off = NULL, *posted = NULL, *peers = NULL;
    shoal_tl_req_t *reqs = NULL, **rp = NULL;
    uint64_t *deadline = NULL;
    int *npending = NULL;
    unsigned *spins = NULL;
    uint8_t *over = NULL;
    shoal_status_t st = SHOAL_OK;

    for (int k = 0; k < nb; k++) {
        b[k].status = SHOAL_OK;
        total += b[k].n;
    }
    reqs = calloc((size_t)total, sizeof(*reqs));
    rp = calloc((size_t)total, sizeof(*rp));
    peers = calloc((size_t)total, sizeof(*peers));
    off = calloc((size_t)nb, sizeof(*off));
    posted = calloc((size_t)nb, sizeof(*posted));
    deadline = calloc((size_t)nb, sizeof(*deadline));
    npending = calloc((size_t)nb, sizeof(*npending));
    spins = calloc((size_t)nb, sizeof(*spins));
    over = calloc((size_t)nb, sizeof(*over));
    if (reqs == NULL || rp == NULL || peers == NULL || off == NULL || posted == NULL ||
        deadline == NULL || npending == NULL || spins == NULL || over == NULL) {
        shoal_error(COLL, "no memory for a group of %d sends/receives", total);
        for (int k = 0; k < nb; k++) {
            b[k].status = SHOAL_ERR_NO_MEMORY;
        }
        st = SHOAL_ERR_NO_MEMORY;
        goto out;
    }
    /* Every message is posted before any wait: a send that completes only once the peer
     * receives it (a message larger than the transport's buffers) must not hold back the
     * receive its peer's matching send waits for, on this communicator or another. */
    for (int k = 0, o = 0; k < nb; o += b[k].n, k++) {
        off[k] = o;
        posted[k] = shoal_p2p_post_batch(&b[k], reqs + o, rp + o, peers + o);
        deadline[k] = shoal_deadline_ns(b[k].comm->timeout_ms);
        npending[k] = posted[k];
    }
    if (nb == 1) {
        /* The ones posted are waited for even after a failed post: that failed the
         * communicator, which failed every pending request (no transport holds one after),
         * and the wait returns at once. */
        if (posted[0] > 0) {
            shoal_status_t wst = shoal_chan_waitall(b[0].comm, rp, peers, posted[0]);
            b[0].status = b[0].status != SHOAL_OK ? b[0].status : wst;
        }
    } else {
        shoal_p2p_wait_batches(b, nb, rp, peers, off, posted, deadline, npending, spins,
                               over);
    }
    for (int k = 0; k < nb && st == SHOAL_OK; k++) {
        st = b[k].status;
    }
out:
    free(over);
    free(spins);
    free(deadline);
    free(npending);
    free(posted);
    free(off);
    free(peers);
    free(rp);
    free(reqs);
    return st;
}
