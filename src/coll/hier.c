/*
 * Hierarchical AllReduce for communicators spread over several hosts, any number of ranks per
 * host. The buffer is cut into segments (SHOAL_HIER_SEGMENT at most, at least 8 segments of
 * 64 KiB or more when the buffer allows), each segment into B = (most ranks on one host)
 * blocks; on a host of L ranks, local rank i owns the blocks j with j % L == i. Per segment:
 *   1. intra-host reduce-scatter: every rank sends its piece of each block to the block's
 *      owner, which reduces them in local-rank order;
 *   2. inter-host AllReduce of block j among its owners (one per host, in host order), a ring
 *      over the inter-host channels; the owner of each ring chunk scales AVG once;
 *   3. intra-host allgather: owners send their blocks to the other ranks of their host.
 * The segments form a pipeline: the intra-host phases of segments s + 1 .. s + DEPTH - 1 and
 * s - 1 run while segment s crosses the hosts, so the inter-host links (the bottleneck) stay
 * busy. Every wait here also advances the inter-host ring. Messages to one peer leave in one
 * canonical order that sender and receiver both follow (the transports match in order):
 * round r holds the first ring step of segment r and then the other steps of segment r - 1,
 * so a send queue always holds the next segment's first step while a step waits for its
 * reduction. Intra-host traffic goes over the channels to local peers (shm when there),
 * inter-host over the others (tcp, ucx). The host grouping (shoal_hier_map_build) takes the
 * topology's host_of[] where there is one, else peers[].host_id.
 */
#include "coll/coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHOAL_HIER_STEP_RS 0x100u
#define SHOAL_HIER_STEP_AR 0x200u  /* + ring step */
#define SHOAL_HIER_STEP_AG 0x300u
/* Segments whose intra-host reduce-scatter may be done before the oldest one's allgather:
 * at least 2 (the canonical order puts segment s + 1's first ring step before segment s's
 * second), 3 so that a send queue never runs dry while a segment's allgather runs. */
#define SHOAL_HIER_DEPTH 3

typedef struct shoal_hier_map {
    int nhosts;
    int myhost;
    int lmax;              /* most ranks on one host: the number of blocks */
    int *first;            /* [nhosts + 1]: host h's ranks are ranks[first[h] .. first[h+1]) */
    int *ranks;            /* [nranks], grouped by host (hosts by lowest rank), ascending */
    /* this rank's part */
    int L, li;             /* ranks on my host, my index among them */
    const int *loc;        /* global ranks of my host */
    int nb;                /* blocks I own, blk[0 .. nb) ascending */
    int *blk;              /* [lmax] */
    int *next, *prev;      /* [lmax] my neighbours in the inter-host ring of blk[b] */
    int nsteps;            /* ring steps: 2 (nhosts - 1) */
    /* requests: one intra-host phase, and the ring's per pipeline slot, block and step */
    shoal_tl_req_t *ireq;  /* [lmax * L] */
    shoal_tl_req_t **ireqp;
    int *ipeer;
    shoal_tl_req_t *sreq;  /* [DEPTH * nb * nsteps] */
    shoal_tl_req_t *rreq;
    int *sposted, *rposted; /* [DEPTH * nb]: steps of the slot's block posted */
    int *snext;            /* [DEPTH * nb]: sends of the slot's block completed, in step order */
    int *rnext;            /* [DEPTH * nb]: receives completed (and reduced), in step order */
    uint8_t *scratch;      /* receive slots, grown on demand */
    size_t scratch_size;
} shoal_hier_map_t;

/* Host of rank r: the topology's grouping (virtual hosts of SHOAL_TOPO_FILE included) when
 * the communicator has one, else the host id each rank announced. */
static uint64_t shoal_hier_host_key(struct shoal_comm *comm, int r)
{
    if (comm->topo != NULL) {
        return (uint64_t)comm->topo->host_of[r];
    }
    return comm->peers[r].host_id;
}

static shoal_status_t shoal_hier_map_build(struct shoal_comm *comm, shoal_hier_map_t *m)
{
    int n = comm->nranks, *hostof = calloc((size_t)n, sizeof(int)), k = 0;

    m->first = calloc((size_t)n + 1, sizeof(int));
    m->ranks = calloc((size_t)n, sizeof(int));
    if (hostof == NULL || m->first == NULL || m->ranks == NULL) {
        free(hostof);
        return SHOAL_ERR_NO_MEMORY;
    }
    m->nhosts = 0;
    for (int r = 0; r < n; r++) {
        int h = 0;
        while (h < r && shoal_hier_host_key(comm, h) != shoal_hier_host_key(comm, r)) {
            h++;
        }
        hostof[r] = h == r ? m->nhosts++ : hostof[h];
    }
    m->lmax = 0;
    for (int h = 0; h < m->nhosts; h++) {
        m->first[h] = k;
        for (int r = 0; r < n; r++) {
            if (hostof[r] == h) {
                m->ranks[k++] = r;
            }
        }
        m->lmax = SHOAL_MAX(m->lmax, k - m->first[h]);
    }
    m->first[m->nhosts] = k;
    m->myhost = hostof[comm->rank];
    free(hostof);
    m->loc = m->ranks + m->first[m->myhost];
    m->L = m->first[m->myhost + 1] - m->first[m->myhost];
    for (m->li = 0; m->loc[m->li] != comm->rank; m->li++) {
    }
    if (m->lmax > SHOAL_HIER_MAX_LOCAL) {
        return SHOAL_OK; /* not applicable: nothing more to build */
    }
    m->nsteps = 2 * (m->nhosts - 1);
    m->blk = calloc((size_t)m->lmax, sizeof(int));
    m->next = calloc((size_t)m->lmax, sizeof(int));
    m->prev = calloc((size_t)m->lmax, sizeof(int));
    m->ireq = calloc((size_t)m->lmax * (size_t)m->L, sizeof(*m->ireq));
    m->ireqp = calloc((size_t)m->lmax * (size_t)m->L, sizeof(*m->ireqp));
    m->ipeer = calloc((size_t)m->lmax * (size_t)m->L, sizeof(int));
    if (m->blk == NULL || m->next == NULL || m->prev == NULL || m->ireq == NULL ||
        m->ireqp == NULL || m->ipeer == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    m->nb = 0;
    for (int j = m->li; j < m->lmax; j += m->L) {
        /* block j's owner on host x: its local rank j % (ranks on x) */
        int x = shoal_mod(m->myhost + 1, m->nhosts), lx = m->first[x + 1] - m->first[x];
        m->next[m->nb] = m->ranks[m->first[x] + j % lx];
        x = shoal_mod(m->myhost - 1, m->nhosts);
        lx = m->first[x + 1] - m->first[x];
        m->prev[m->nb] = m->ranks[m->first[x] + j % lx];
        m->blk[m->nb++] = j;
    }
    if (m->nsteps > 0) {
        size_t nr = (size_t)SHOAL_HIER_DEPTH * (size_t)m->nb * (size_t)m->nsteps;
        m->sreq = calloc(nr, sizeof(*m->sreq));
        m->rreq = calloc(nr, sizeof(*m->rreq));
    }
    m->sposted = calloc((size_t)SHOAL_HIER_DEPTH * (size_t)m->nb, sizeof(int));
    m->rposted = calloc((size_t)SHOAL_HIER_DEPTH * (size_t)m->nb, sizeof(int));
    m->snext = calloc((size_t)SHOAL_HIER_DEPTH * (size_t)m->nb, sizeof(int));
    m->rnext = calloc((size_t)SHOAL_HIER_DEPTH * (size_t)m->nb, sizeof(int));
    if ((m->nsteps > 0 && (m->sreq == NULL || m->rreq == NULL)) || m->snext == NULL ||
        m->rnext == NULL || m->sposted == NULL || m->rposted == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    return SHOAL_OK;
}

static shoal_hier_map_t *shoal_hier_map(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    if (cs->hier == NULL) {
        cs->hier = calloc(1, sizeof(*cs->hier));
        if (cs->hier == NULL || shoal_hier_map_build(comm, cs->hier) != SHOAL_OK) {
            shoal_hier_fini(comm);
            return NULL;
        }
    }
    return cs->hier;
}

void shoal_hier_fini(struct shoal_comm *comm)
{
    shoal_hier_map_t *m = comm->coll != NULL ? comm->coll->hier : NULL;
    if (m != NULL) {
        free(m->first);
        free(m->ranks);
        free(m->blk);
        free(m->next);
        free(m->prev);
        free(m->ireq);
        free(m->ireqp);
        free(m->ipeer);
        free(m->sreq);
        free(m->rreq);
        free(m->sposted);
        free(m->rposted);
        free(m->snext);
        free(m->rnext);
        free(m->scratch);
        free(m);
        comm->coll->hier = NULL;
    }
}

int shoal_hier_applicable(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    shoal_hier_map_t *m = shoal_hier_map(comm);
    (void)a;
    return m != NULL && m->lmax <= SHOAL_HIER_MAX_LOCAL;
}


typedef struct {
    struct shoal_comm *comm;
    const shoal_coll_args_t *a;
    shoal_hier_map_t *m;
    uint32_t seq;
    size_t ds;             /* element size */
    int g, me;             /* hosts, my host: my position in every inter-host ring */
    size_t segc, nseg;     /* elements per segment, segments */
    size_t bmax, cmax;     /* most elements of a block of a segment, of a ring chunk */
    uint8_t *islot;        /* [nb][L][bmax] intra-host receive slots */
    uint8_t *rslot;        /* [DEPTH][nb][g - 1][cmax] ring receive slots */
    size_t nstarted;       /* segments whose reduce-scatter is done (ring may run) */
    size_t sround, sidx;   /* send cursor in the canonical order: round, item */
    size_t rround, ridx;   /* receive cursor */
} shoal_hier_t;

/* Block j of segment s: element offset in the buffer and length. */
static void shoal_hier_block(const shoal_hier_t *h, size_t s, int j, size_t *off_p,
                             size_t *len_p)
{
    size_t base = s * h->segc, n = SHOAL_MIN(h->segc, h->a->count - base);
    shoal_block_range(n, h->m->lmax, j, off_p, len_p);
    *off_p += base;
}

/* Ring step k of my block b of segment s: what I send (offset and length in the buffer) and
 * the chunk I receive (offset and length); rs: k is a reduce-scatter step. */
static void shoal_hier_step(const shoal_hier_t *h, size_t s, int b, int k, size_t *so,
                            size_t *sl, size_t *ro, size_t *rl, int *rs)
{
    size_t off, len;
    int g = h->g, kk;
    *rs = k < g - 1;
    kk = *rs ? k : k - (g - 1);
    shoal_hier_block(h, s, h->m->blk[b], &off, &len);
    shoal_block_range(len, g, *rs ? shoal_mod(h->me - kk, g) : shoal_mod(h->me + 1 - kk, g),
                      so, sl);
    shoal_block_range(len, g, *rs ? shoal_mod(h->me - kk - 1, g) : shoal_mod(h->me - kk, g),
                      ro, rl);
    *so += off;
    *ro += off;
}

static size_t shoal_hier_ix(const shoal_hier_t *h, size_t s, int b)
{
    return (s % SHOAL_HIER_DEPTH) * (size_t)h->m->nb + (size_t)b;
}

static uint8_t *shoal_hier_rslot(const shoal_hier_t *h, size_t s, int b, int k)
{
    return h->rslot + (shoal_hier_ix(h, s, b) * (size_t)(h->g - 1) + (size_t)k) * h->cmax * h->ds;
}

/* Item i of round r of the canonical order: (segment, step, block); 0 past the round's end.
 * Round r: step 0 of segment r (every block), then steps 1 .. nsteps - 1 of segment r - 1
 * (step by step, every block). Keys depend only on (segment, step, block), so any two ranks
 * enumerate the messages between them in the same order. */
static int shoal_hier_item(const shoal_hier_t *h, size_t r, size_t i, size_t *s, int *k, int *b)
{
    size_t nb = (size_t)h->m->nb;
    if (r > h->nseg || h->m->nsteps == 0) {
        return 0;
    }
    if (r < h->nseg) {
        if (i < nb) {
            *s = r;
            *k = 0;
            *b = (int)i;
            return 1;
        }
        i -= nb;
    }
    if (r >= 1 && i < nb * (size_t)(h->m->nsteps - 1)) {
        *s = r - 1;
        *k = 1 + (int)(i / nb);
        *b = (int)(i % nb);
        return 1;
    }
    return 0;
}

static void shoal_hier_cursor_next(const shoal_hier_t *h, size_t *r, size_t *i)
{
    size_t s;
    int k, b;
    ++*i;
    while (*r <= h->nseg && !shoal_hier_item(h, *r, *i, &s, &k, &b)) {
        ++*r;
        *i = 0;
    }
}

static uint32_t shoal_hier_tag(const shoal_hier_t *h, size_t s, int j)
{
    return (uint32_t)(s * (size_t)h->m->lmax + (size_t)j);
}

/* A request that completed with an error: the channel layer's failure (names the peer). */
static shoal_status_t shoal_hier_failed(shoal_hier_t *h, shoal_tl_req_t *req, int peer)
{
    shoal_tl_req_t *r = req;
    return shoal_chan_waitall(h->comm, &r, &peer, 1);
}

/* Advances the inter-host rings: reduces what arrived, posts what may go. *moved_p counts
 * what happened. */
static shoal_status_t shoal_hier_pump(shoal_hier_t *h, int *moved_p)
{
    shoal_hier_map_t *m = h->m;
    const shoal_coll_args_t *a = h->a;
    uint8_t *buf = a->recvbuf;
    size_t ds = h->ds, s, so, sl, ro, rl;
    int k, b, rs;

    if (m->nsteps == 0) {
        return SHOAL_OK;
    }
    /* completions of the segments in flight, in step order per block */
    for (s = h->nstarted > SHOAL_HIER_DEPTH ? h->nstarted - SHOAL_HIER_DEPTH : 0;
         s < h->nstarted; s++) {
        for (b = 0; b < m->nb; b++) {
            size_t x = shoal_hier_ix(h, s, b);
            shoal_tl_req_t *sr = m->sreq + x * (size_t)m->nsteps;
            shoal_tl_req_t *rr = m->rreq + x * (size_t)m->nsteps;
            while (m->snext[x] < m->sposted[x] &&
                   __atomic_load_n(&sr[m->snext[x]].done, __ATOMIC_ACQUIRE)) {
                if (sr[m->snext[x]].status != SHOAL_OK) {
                    return shoal_hier_failed(h, &sr[m->snext[x]], m->next[b]);
                }
                m->snext[x]++;
                ++*moved_p;
            }
            while ((k = m->rnext[x]) < m->rposted[x] &&
                   __atomic_load_n(&rr[k].done, __ATOMIC_ACQUIRE)) {
                if (rr[k].status != SHOAL_OK) {
                    return shoal_hier_failed(h, &rr[k], m->prev[b]);
                }
                shoal_hier_step(h, s, b, k, &so, &sl, &ro, &rl, &rs);
                if (rs) {
                    shoal_reduce2(buf + ro * ds, buf + ro * ds, shoal_hier_rslot(h, s, b, k), rl,
                                  a->dtype, a->op);
                    if (k == h->g - 2) {
                        shoal_reduce_avg_finalize(buf + ro * ds, rl, a->dtype, a->op,
                                                  h->comm->nranks);
                    }
                }
                m->rnext[x]++;
                ++*moved_p;
            }
        }
    }
    /* receives in the canonical order, as soon as their segment has started */
    while (shoal_hier_item(h, h->rround, h->ridx, &s, &k, &b) && s < h->nstarted) {
        shoal_tl_req_t *rr = m->rreq + shoal_hier_ix(h, s, b) * (size_t)m->nsteps + k;
        shoal_hier_step(h, s, b, k, &so, &sl, &ro, &rl, &rs);
        SHOAL_CHECK(shoal_chan_irecv(h->comm, m->prev[b],
                                     rs ? shoal_hier_rslot(h, s, b, k) : buf + ro * ds, rl * ds,
                                     h->seq, SHOAL_HIER_STEP_AR + (uint32_t)k,
                                     shoal_hier_tag(h, s, m->blk[b]), rr));
        m->rposted[shoal_hier_ix(h, s, b)]++;
        shoal_hier_cursor_next(h, &h->rround, &h->ridx);
        ++*moved_p;
    }
    /* sends in the canonical order, each once the step before it is received and reduced */
    while (shoal_hier_item(h, h->sround, h->sidx, &s, &k, &b) && s < h->nstarted &&
           m->rnext[shoal_hier_ix(h, s, b)] >= k) {
        shoal_tl_req_t *sr = m->sreq + shoal_hier_ix(h, s, b) * (size_t)m->nsteps + k;
        shoal_hier_step(h, s, b, k, &so, &sl, &ro, &rl, &rs);
        SHOAL_CHECK(shoal_chan_isend(h->comm, m->next[b], buf + so * ds, sl * ds, h->seq,
                                     SHOAL_HIER_STEP_AR + (uint32_t)k,
                                     shoal_hier_tag(h, s, m->blk[b]), sr));
        m->sposted[shoal_hier_ix(h, s, b)]++;
        shoal_hier_cursor_next(h, &h->sround, &h->sidx);
        ++*moved_p;
    }
    return SHOAL_OK;
}

static int shoal_hier_seg_done(const shoal_hier_t *h, size_t s)
{
    for (int b = 0; b < h->m->nb; b++) {
        size_t x = shoal_hier_ix(h, s, b);
        if (h->m->snext[x] < h->m->nsteps || h->m->rnext[x] < h->m->nsteps) {
            return 0;
        }
    }
    return 1;
}

/* Waits for the n intra-host requests of m->ireqp and, when wait_seg < nseg, for segment
 * wait_seg's rings; advances the rings all along. */
static shoal_status_t shoal_hier_wait(shoal_hier_t *h, int n, size_t wait_seg)
{
    struct shoal_comm *comm = h->comm;
    shoal_hier_map_t *m = h->m;
    uint64_t deadline = shoal_deadline_ns(comm->timeout_ms);
    unsigned spins = 0;

    for (;;) {
        int moved = shoal_chan_progress(comm), pending = -1;
        SHOAL_CHECK(shoal_hier_pump(h, &moved));
        for (int i = 0; i < n; i++) {
            if (m->ireqp[i] == NULL) {
                continue;
            }
            if (!__atomic_load_n(&m->ireqp[i]->done, __ATOMIC_ACQUIRE)) {
                pending = pending < 0 ? i : pending;
            } else if (m->ireqp[i]->status != SHOAL_OK) {
                return shoal_hier_failed(h, m->ireqp[i], m->ipeer[i]);
            } else {
                m->ireqp[i] = NULL;
            }
        }
        if (pending < 0 && (wait_seg >= h->nseg || shoal_hier_seg_done(h, wait_seg))) {
            return SHOAL_OK;
        }
        if (moved > 0) {
            spins = 0;
            continue;
        }
        if (!shoal_chan_idle_may_fail(comm, spins, deadline)) {
            SHOAL_CHECK(shoal_chan_idle(comm, &spins, deadline, "waiting"));
        } else if (pending >= 0) {
            char what[96];
            snprintf(what, sizeof(what), "waiting for peer %d (%s)", m->ipeer[pending],
                     shoal_comm_peer_host(comm, m->ipeer[pending]));
            SHOAL_CHECK(shoal_chan_idle(comm, &spins, deadline, what));
        } else {
            SHOAL_CHECK(shoal_chan_idle(comm, &spins, deadline,
                                        "waiting for the inter-host ring of the hierarchical "
                                        "AllReduce"));
        }
    }
}

/* Phase 1 of segment s: send my pieces of the others' blocks, reduce mine; then its rings
 * may start. */
static shoal_status_t shoal_hier_rs(shoal_hier_t *h, size_t s)
{
    shoal_hier_map_t *m = h->m;
    const shoal_coll_args_t *a = h->a;
    const uint8_t *sbuf = a->sendbuf;
    uint8_t *rbuf = a->recvbuf;
    const void *srcs[SHOAL_HIER_MAX_LOCAL];
    size_t off, len, ds = h->ds;
    int n = 0, b = 0;

    for (int j = 0; j < m->lmax && m->L > 1; j++) {
        int o = j % m->L;
        shoal_hier_block(h, s, j, &off, &len);
        if (o != m->li) {
            m->ipeer[n] = m->loc[o];
            m->ireqp[n] = &m->ireq[n];
            SHOAL_CHECK(shoal_chan_isend(h->comm, m->loc[o], sbuf + off * ds, len * ds, h->seq,
                                         SHOAL_HIER_STEP_RS, shoal_hier_tag(h, s, j),
                                         &m->ireq[n]));
            n++;
            continue;
        }
        for (int q = 0; q < m->L; q++) {
            if (q == m->li) {
                continue;
            }
            m->ipeer[n] = m->loc[q];
            m->ireqp[n] = &m->ireq[n];
            SHOAL_CHECK(shoal_chan_irecv(h->comm, m->loc[q],
                                         h->islot + ((size_t)b * (size_t)m->L + (size_t)q) *
                                                        h->bmax * ds,
                                         len * ds, h->seq, SHOAL_HIER_STEP_RS,
                                         shoal_hier_tag(h, s, j), &m->ireq[n]));
            n++;
        }
        b++;
    }
    SHOAL_CHECK(shoal_hier_wait(h, n, h->nseg));
    for (b = 0; b < m->nb; b++) {
        uint8_t *slots = h->islot + (size_t)b * (size_t)m->L * h->bmax * ds;
        shoal_hier_block(h, s, m->blk[b], &off, &len);
        if (m->L == 1) {
            if (sbuf != rbuf) {
                memcpy(rbuf + off * ds, sbuf + off * ds, len * ds);
            }
        } else {
            for (int q = 0; q < m->L; q++) {
                srcs[q] = slots + (size_t)q * h->bmax * ds;
            }
            srcs[m->li] = sbuf + off * ds;
            if (m->li != 0 && sbuf == rbuf) { /* dst may alias srcs[0] only */
                memcpy(slots + (size_t)m->li * h->bmax * ds, sbuf + off * ds, len * ds);
                srcs[m->li] = slots + (size_t)m->li * h->bmax * ds;
            }
            shoal_reduce_n(rbuf + off * ds, srcs, m->L, len, a->dtype, a->op);
        }
        if (m->nsteps == 0) { /* one host: no ring, the sum is complete */
            shoal_reduce_avg_finalize(rbuf + off * ds, len, a->dtype, a->op, h->comm->nranks);
        }
        m->snext[shoal_hier_ix(h, s, b)] = m->rnext[shoal_hier_ix(h, s, b)] = 0;
        m->sposted[shoal_hier_ix(h, s, b)] = m->rposted[shoal_hier_ix(h, s, b)] = 0;
    }
    h->nstarted = s + 1;
    return SHOAL_OK;
}

/* Phase 3 of segment s, once its rings are done: owners send their blocks to the others. */
static shoal_status_t shoal_hier_ag(shoal_hier_t *h, size_t s)
{
    shoal_hier_map_t *m = h->m;
    uint8_t *rbuf = h->a->recvbuf;
    size_t off, len, ds = h->ds;
    int n = 0;

    SHOAL_CHECK(shoal_hier_wait(h, 0, s));
    for (int j = 0; j < m->lmax && m->L > 1; j++) {
        int o = j % m->L;
        shoal_hier_block(h, s, j, &off, &len);
        for (int q = 0; q < m->L; q++) {
            if (q == o || (o != m->li && q != m->li)) {
                continue;
            }
            m->ipeer[n] = m->loc[o == m->li ? q : o];
            m->ireqp[n] = &m->ireq[n];
            if (o == m->li) {
                SHOAL_CHECK(shoal_chan_isend(h->comm, m->ipeer[n], rbuf + off * ds, len * ds,
                                             h->seq, SHOAL_HIER_STEP_AG, shoal_hier_tag(h, s, j),
                                             &m->ireq[n]));
            } else {
                SHOAL_CHECK(shoal_chan_irecv(h->comm, m->ipeer[n], rbuf + off * ds, len * ds,
                                             h->seq, SHOAL_HIER_STEP_AG, shoal_hier_tag(h, s, j),
                                             &m->ireq[n]));
            }
            n++;
        }
    }
    return shoal_hier_wait(h, n, h->nseg);
}

/* Segment size in elements (shoal_hier_seg_bytes): identical on every rank. */
static size_t shoal_hier_segc(size_t count, size_t ds)
{
    return shoal_hier_seg_bytes(count * ds, shoal_coll_config.hier_segment) / ds;
}

shoal_status_t shoal_hier_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                    uint32_t seq)
{
    shoal_hier_t h = {.comm = comm, .a = a, .seq = seq, .ds = shoal_dtype_size(a->dtype)};
    shoal_hier_map_t *m;
    size_t need;

    if (!shoal_hier_applicable(comm, a)) {
        shoal_warn_once(COLL, "hierarchical AllReduce needs at most %d ranks per host: using "
                        "the ring", SHOAL_HIER_MAX_LOCAL);
        return shoal_ring_allreduce(comm, a, seq);
    }
    if (a->count == 0) {
        return SHOAL_OK;
    }
    m = h.m = comm->coll->hier;
    h.g = m->nhosts;
    h.me = m->myhost;
    h.segc = shoal_hier_segc(a->count, h.ds);
    h.nseg = (a->count + h.segc - 1) / h.segc;
    h.bmax = (h.segc + (size_t)m->lmax - 1) / (size_t)m->lmax;
    h.cmax = (h.bmax + (size_t)h.g - 1) / (size_t)h.g;
    need = (size_t)m->nb * (size_t)m->L * h.bmax * h.ds +
           (size_t)SHOAL_HIER_DEPTH * (size_t)m->nb * (size_t)(h.g - 1) * h.cmax * h.ds;
    need = SHOAL_ALIGN_UP(need, 4096);
    if (need > m->scratch_size) {
        free(m->scratch);
        m->scratch_size = 0;
        m->scratch = aligned_alloc(4096, need);
        if (m->scratch == NULL) {
            shoal_error(COLL, "cannot allocate %zu bytes for the hierarchical AllReduce", need);
            return SHOAL_ERR_NO_MEMORY;
        }
        memset(m->scratch, 0, need); /* fault the pages in before the data path */
        m->scratch_size = need;
    }
    h.islot = m->scratch;
    h.rslot = m->scratch + (size_t)m->nb * (size_t)m->L * h.bmax * h.ds;
    /* the cursors start at the first item of round 0 */
    h.sidx = h.ridx = (size_t)-1;
    shoal_hier_cursor_next(&h, &h.sround, &h.sidx);
    shoal_hier_cursor_next(&h, &h.rround, &h.ridx);
    for (size_t s = 0; s < SHOAL_MIN(h.nseg, (size_t)SHOAL_HIER_DEPTH); s++) {
        SHOAL_CHECK(shoal_hier_rs(&h, s));
    }
    for (size_t s = 0; s < h.nseg; s++) {
        SHOAL_CHECK(shoal_hier_ag(&h, s));
        if (s + SHOAL_HIER_DEPTH < h.nseg) {
            SHOAL_CHECK(shoal_hier_rs(&h, s + SHOAL_HIER_DEPTH));
        }
    }
    return SHOAL_OK;
}
