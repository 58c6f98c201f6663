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
 * busy. A plan the progress engine advances step by step (the blocking call drives the same
 * plan): every call of its progress first advances the inter-host rings, then the intra-host
 * phase it is at, whose waits are tests. Messages to one peer leave in one
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

/* What one call in flight needs besides the map: the requests of its intra-host phase and of
 * its rings, their cursors, and its receive slots. The map keeps one set between calls; a
 * call that finds it taken (another hierarchical AllReduce of the communicator in flight)
 * allocates its own. */
typedef struct shoal_hier_bufs {
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
} shoal_hier_bufs_t;

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
    shoal_hier_bufs_t bufs; /* kept between calls */
    int bufs_busy;         /* a call in flight holds bufs */
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

static void shoal_hier_bufs_free(shoal_hier_bufs_t *hb)
{
    free(hb->ireq);
    free(hb->ireqp);
    free(hb->ipeer);
    free(hb->sreq);
    free(hb->rreq);
    free(hb->sposted);
    free(hb->rposted);
    free(hb->snext);
    free(hb->rnext);
    free(hb->scratch);
    memset(hb, 0, sizeof(*hb));
}

/* The request arrays of one call (the receive slots come with the call: they depend on its
 * size). */
static shoal_status_t shoal_hier_bufs_alloc(const shoal_hier_map_t *m, shoal_hier_bufs_t *hb)
{
    size_t nx = (size_t)SHOAL_HIER_DEPTH * (size_t)m->nb;
    hb->ireq = calloc((size_t)m->lmax * (size_t)m->L, sizeof(*hb->ireq));
    hb->ireqp = calloc((size_t)m->lmax * (size_t)m->L, sizeof(*hb->ireqp));
    hb->ipeer = calloc((size_t)m->lmax * (size_t)m->L, sizeof(int));
    if (m->nsteps > 0) {
        hb->sreq = calloc(nx * (size_t)m->nsteps, sizeof(*hb->sreq));
        hb->rreq = calloc(nx * (size_t)m->nsteps, sizeof(*hb->rreq));
    }
    hb->sposted = calloc(nx, sizeof(int));
    hb->rposted = calloc(nx, sizeof(int));
    hb->snext = calloc(nx, sizeof(int));
    hb->rnext = calloc(nx, sizeof(int));
    if (hb->ireq == NULL || hb->ireqp == NULL || hb->ipeer == NULL ||
        (m->nsteps > 0 && (hb->sreq == NULL || hb->rreq == NULL)) || hb->snext == NULL ||
        hb->rnext == NULL || hb->sposted == NULL || hb->rposted == NULL) {
        shoal_hier_bufs_free(hb);
        return SHOAL_ERR_NO_MEMORY;
    }
    return SHOAL_OK;
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
    if (m->blk == NULL || m->next == NULL || m->prev == NULL) {
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
    return shoal_hier_bufs_alloc(m, &m->bufs);
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
        shoal_hier_bufs_free(&m->bufs);
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


/* The plan of one call. Its phases, in the order of the blocking loop it replaces:
 * reduce-scatter of segments 0 .. DEPTH - 1, then per segment s its allgather (once its rings
 * are done) and the reduce-scatter of segment s + DEPTH. Every wait is a test; every call of
 * progress first advances the rings (shoal_hier_pump). */
typedef enum {
    SHOAL_HIER_RS_POST,    /* post segment rs_s's intra-host reduce-scatter */
    SHOAL_HIER_RS_WAIT,    /* ... its requests, then reduce my blocks */
    SHOAL_HIER_AG_RING,    /* segment ag_s's rings */
    SHOAL_HIER_AG_WAIT,    /* its intra-host allgather's requests */
    SHOAL_HIER_DONE
} shoal_hier_phase_t;

typedef struct {
    shoal_coll_plan_t cp;
    const shoal_coll_args_t *a; /* &cp.a */
    shoal_hier_map_t *m;
    shoal_hier_bufs_t *hb; /* the map's (own_bufs 0) or this call's */
    shoal_hier_bufs_t own;
    int own_bufs;
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
    shoal_hier_phase_t phase;
    size_t rs_s, ag_s;     /* the next segment to reduce-scatter, to allgather */
    int nreq;              /* intra-host requests posted (hb->ireqp[0 .. nreq)) */
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
static shoal_status_t shoal_hier_failed(struct shoal_comm *comm, shoal_tl_req_t *req, int peer)
{
    shoal_tl_req_t *r = req;
    int done;
    return shoal_chan_test(comm, &r, &peer, 1, &done);
}

/* Advances the inter-host rings: reduces what arrived, posts what may go. *moved_p counts
 * what happened. */
static shoal_status_t shoal_hier_pump(struct shoal_comm *comm, shoal_hier_t *h, int *moved_p)
{
    shoal_hier_map_t *m = h->m;
    shoal_hier_bufs_t *hb = h->hb;
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
            shoal_tl_req_t *sr = hb->sreq + x * (size_t)m->nsteps;
            shoal_tl_req_t *rr = hb->rreq + x * (size_t)m->nsteps;
            while (hb->snext[x] < hb->sposted[x] &&
                   __atomic_load_n(&sr[hb->snext[x]].done, __ATOMIC_ACQUIRE)) {
                if (sr[hb->snext[x]].status != SHOAL_OK) {
                    return shoal_hier_failed(comm, &sr[hb->snext[x]], m->next[b]);
                }
                hb->snext[x]++;
                ++*moved_p;
            }
            while ((k = hb->rnext[x]) < hb->rposted[x] &&
                   __atomic_load_n(&rr[k].done, __ATOMIC_ACQUIRE)) {
                if (rr[k].status != SHOAL_OK) {
                    return shoal_hier_failed(comm, &rr[k], m->prev[b]);
                }
                shoal_hier_step(h, s, b, k, &so, &sl, &ro, &rl, &rs);
                if (rs) {
                    shoal_reduce2(buf + ro * ds, buf + ro * ds, shoal_hier_rslot(h, s, b, k), rl,
                                  a->dtype, a->op);
                    if (k == h->g - 2) {
                        shoal_reduce_avg_finalize(buf + ro * ds, rl, a->dtype, a->op,
                                                  comm->nranks);
                    }
                }
                hb->rnext[x]++;
                ++*moved_p;
            }
        }
    }
    /* receives in the canonical order, as soon as their segment has started */
    while (shoal_hier_item(h, h->rround, h->ridx, &s, &k, &b) && s < h->nstarted) {
        shoal_tl_req_t *rr = hb->rreq + shoal_hier_ix(h, s, b) * (size_t)m->nsteps + k;
        shoal_hier_step(h, s, b, k, &so, &sl, &ro, &rl, &rs);
        SHOAL_CHECK(shoal_chan_irecv(comm, m->prev[b],
                                     rs ? shoal_hier_rslot(h, s, b, k) : buf + ro * ds, rl * ds,
                                     h->seq, SHOAL_HIER_STEP_AR + (uint32_t)k,
                                     shoal_hier_tag(h, s, m->blk[b]), rr));
        hb->rposted[shoal_hier_ix(h, s, b)]++;
        shoal_hier_cursor_next(h, &h->rround, &h->ridx);
        ++*moved_p;
    }
    /* sends in the canonical order, each once the step before it is received and reduced */
    while (shoal_hier_item(h, h->sround, h->sidx, &s, &k, &b) && s < h->nstarted &&
           hb->rnext[shoal_hier_ix(h, s, b)] >= k) {
        shoal_tl_req_t *sr = hb->sreq + shoal_hier_ix(h, s, b) * (size_t)m->nsteps + k;
        shoal_hier_step(h, s, b, k, &so, &sl, &ro, &rl, &rs);
        SHOAL_CHECK(shoal_chan_isend(comm, m->next[b], buf + so * ds, sl * ds, h->seq,
                                     SHOAL_HIER_STEP_AR + (uint32_t)k,
                                     shoal_hier_tag(h, s, m->blk[b]), sr));
        hb->sposted[shoal_hier_ix(h, s, b)]++;
        shoal_hier_cursor_next(h, &h->sround, &h->sidx);
        ++*moved_p;
    }
    return SHOAL_OK;
}

static int shoal_hier_seg_done(const shoal_hier_t *h, size_t s)
{
    for (int b = 0; b < h->m->nb; b++) {
        size_t x = shoal_hier_ix(h, s, b);
        if (h->hb->snext[x] < h->m->nsteps || h->hb->rnext[x] < h->m->nsteps) {
            return 0;
        }
    }
    return 1;
}

/* Tests the nreq intra-host requests: SHOAL_OK once all are done, SHOAL_IN_PROGRESS (wait_peer
 * set), or the failure. */
static shoal_status_t shoal_hier_test(struct shoal_comm *comm, shoal_hier_t *h)
{
    shoal_hier_bufs_t *hb = h->hb;
    int pending = -1;
    for (int i = 0; i < h->nreq; i++) {
        if (hb->ireqp[i] == NULL) {
            continue;
        }
        if (!__atomic_load_n(&hb->ireqp[i]->done, __ATOMIC_ACQUIRE)) {
            pending = pending < 0 ? i : pending;
        } else if (hb->ireqp[i]->status != SHOAL_OK) {
            return shoal_hier_failed(comm, hb->ireqp[i], hb->ipeer[i]);
        } else {
            hb->ireqp[i] = NULL;
        }
    }
    if (pending >= 0) {
        h->cp.base.wait_peer = hb->ipeer[pending];
        return SHOAL_IN_PROGRESS;
    }
    return SHOAL_OK;
}

/* Phase 1 of segment s, posting: send my pieces of the others' blocks, receive the others'
 * pieces of mine. */
static shoal_status_t shoal_hier_rs_post(struct shoal_comm *comm, shoal_hier_t *h, size_t s)
{
    shoal_hier_map_t *m = h->m;
    shoal_hier_bufs_t *hb = h->hb;
    const uint8_t *sbuf = h->a->sendbuf;
    size_t off, len, ds = h->ds;
    int n = 0, b = 0;

    h->nreq = 0;
    for (int j = 0; j < m->lmax && m->L > 1; j++) {
        int o = j % m->L;
        shoal_hier_block(h, s, j, &off, &len);
        if (o != m->li) {
            hb->ipeer[n] = m->loc[o];
            hb->ireqp[n] = &hb->ireq[n];
            h->nreq = n + 1;
            SHOAL_CHECK(shoal_chan_isend(comm, m->loc[o], sbuf + off * ds, len * ds, h->seq,
                                         SHOAL_HIER_STEP_RS, shoal_hier_tag(h, s, j),
                                         &hb->ireq[n]));
            n++;
            continue;
        }
        for (int q = 0; q < m->L; q++) {
            if (q == m->li) {
                continue;
            }
            hb->ipeer[n] = m->loc[q];
            hb->ireqp[n] = &hb->ireq[n];
            h->nreq = n + 1;
            SHOAL_CHECK(shoal_chan_irecv(comm, m->loc[q],
                                         h->islot + ((size_t)b * (size_t)m->L + (size_t)q) *
                                                        h->bmax * ds,
                                         len * ds, h->seq, SHOAL_HIER_STEP_RS,
                                         shoal_hier_tag(h, s, j), &hb->ireq[n]));
            n++;
        }
        b++;
    }
    return SHOAL_OK;
}

/* Phase 1 of segment s, once its requests are done: reduce my blocks; then its rings may
 * start. */
static void shoal_hier_rs_reduce(struct shoal_comm *comm, shoal_hier_t *h, size_t s)
{
    shoal_hier_map_t *m = h->m;
    shoal_hier_bufs_t *hb = h->hb;
    const shoal_coll_args_t *a = h->a;
    const uint8_t *sbuf = a->sendbuf;
    uint8_t *rbuf = a->recvbuf;
    const void *srcs[SHOAL_HIER_MAX_LOCAL];
    size_t off, len, ds = h->ds;

    for (int b = 0; b < m->nb; b++) {
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
            shoal_reduce_avg_finalize(rbuf + off * ds, len, a->dtype, a->op, comm->nranks);
        }
        hb->snext[shoal_hier_ix(h, s, b)] = hb->rnext[shoal_hier_ix(h, s, b)] = 0;
        hb->sposted[shoal_hier_ix(h, s, b)] = hb->rposted[shoal_hier_ix(h, s, b)] = 0;
    }
    h->nstarted = s + 1;
}

/* Phase 3 of segment s, once its rings are done: owners send their blocks to the others. */
static shoal_status_t shoal_hier_ag_post(struct shoal_comm *comm, shoal_hier_t *h, size_t s)
{
    shoal_hier_map_t *m = h->m;
    shoal_hier_bufs_t *hb = h->hb;
    uint8_t *rbuf = h->a->recvbuf;
    size_t off, len, ds = h->ds;
    int n = 0;

    h->nreq = 0;
    for (int j = 0; j < m->lmax && m->L > 1; j++) {
        int o = j % m->L;
        shoal_hier_block(h, s, j, &off, &len);
        for (int q = 0; q < m->L; q++) {
            if (q == o || (o != m->li && q != m->li)) {
                continue;
            }
            hb->ipeer[n] = m->loc[o == m->li ? q : o];
            hb->ireqp[n] = &hb->ireq[n];
            h->nreq = n + 1;
            if (o == m->li) {
                SHOAL_CHECK(shoal_chan_isend(comm, hb->ipeer[n], rbuf + off * ds, len * ds,
                                             h->seq, SHOAL_HIER_STEP_AG, shoal_hier_tag(h, s, j),
                                             &hb->ireq[n]));
            } else {
                SHOAL_CHECK(shoal_chan_irecv(comm, hb->ipeer[n], rbuf + off * ds, len * ds,
                                             h->seq, SHOAL_HIER_STEP_AG, shoal_hier_tag(h, s, j),
                                             &hb->ireq[n]));
            }
            n++;
        }
    }
    return SHOAL_OK;
}

/* SHOAL_IN_PROGRESS from a wait once neither the rings nor the transports moved: as long as
 * they move, progress goes on (the pump's work is progress too: returning after it would
 * make the driver idle while the rings still have work to do). */
static shoal_status_t shoal_hier_wait_or_go(struct shoal_comm *comm, int moved)
{
    return moved > 0 || shoal_chan_progress(comm) > 0 ? SHOAL_OK : SHOAL_IN_PROGRESS;
}

static shoal_status_t shoal_hier_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_hier_t *h = (shoal_hier_t *)plan;
    shoal_status_t st;

    h->cp.base.wait_peer = -1;
    for (;;) {
        int moved = 0;
        SHOAL_CHECK(shoal_hier_pump(comm, h, &moved));
        switch (h->phase) {
        case SHOAL_HIER_RS_POST:
            SHOAL_CHECK(shoal_hier_rs_post(comm, h, h->rs_s));
            h->phase = SHOAL_HIER_RS_WAIT;
            break;
        case SHOAL_HIER_RS_WAIT:
            if ((st = shoal_hier_test(comm, h)) == SHOAL_IN_PROGRESS) {
                SHOAL_CHECK(shoal_hier_wait_or_go(comm, moved));
                break;
            }
            SHOAL_CHECK(st);
            shoal_hier_rs_reduce(comm, h, h->rs_s);
            h->rs_s++;
            /* the first DEPTH segments one after the other, then one per allgather */
            h->phase = h->rs_s < SHOAL_MIN(h->nseg, (size_t)SHOAL_HIER_DEPTH)
                           ? SHOAL_HIER_RS_POST
                           : SHOAL_HIER_AG_RING;
            break;
        case SHOAL_HIER_AG_RING:
            if (!shoal_hier_seg_done(h, h->ag_s)) {
                h->cp.base.wait_peer = h->m->nb > 0 ? h->m->prev[0] : -1; /* the ring */
                SHOAL_CHECK(shoal_hier_wait_or_go(comm, moved));
                break;
            }
            SHOAL_CHECK(shoal_hier_ag_post(comm, h, h->ag_s));
            h->phase = SHOAL_HIER_AG_WAIT;
            break;
        case SHOAL_HIER_AG_WAIT:
            if ((st = shoal_hier_test(comm, h)) == SHOAL_IN_PROGRESS) {
                SHOAL_CHECK(shoal_hier_wait_or_go(comm, moved));
                break;
            }
            SHOAL_CHECK(st);
            h->ag_s++;
            h->phase = h->rs_s < h->nseg   ? SHOAL_HIER_RS_POST
                       : h->ag_s < h->nseg ? SHOAL_HIER_AG_RING
                                           : SHOAL_HIER_DONE;
            break;
        case SHOAL_HIER_DONE:
            return SHOAL_OK;
        }
    }
}

static void shoal_hier_release(struct shoal_comm *comm, shoal_plan_t *plan, shoal_status_t st)
{
    shoal_hier_t *h = (shoal_hier_t *)plan;
    if (h->own_bufs) {
        shoal_hier_bufs_free(&h->own);
    } else if (h->hb != NULL) {
        h->m->bufs_busy = 0;
    }
    shoal_coll_plan_release(comm, plan, st);
}

/* Segment size in elements (shoal_hier_seg_bytes): identical on every rank (the segment
 * setting is rank 0's). */
static size_t shoal_hier_segc(struct shoal_comm *comm, size_t count, size_t ds)
{
    return shoal_hier_seg_bytes(count * ds, comm->coll->hier_segment) / ds;
}

/* The receive slots of a call: grown in hb (kept with the map's set), faulted in before the
 * data path. */
static shoal_status_t shoal_hier_slots(shoal_hier_bufs_t *hb, size_t need)
{
    need = SHOAL_ALIGN_UP(need, 4096);
    if (need > hb->scratch_size) {
        free(hb->scratch);
        hb->scratch_size = 0;
        hb->scratch = aligned_alloc(4096, need);
        if (hb->scratch == NULL) {
            shoal_error(COLL, "cannot allocate %zu bytes for the hierarchical AllReduce", need);
            return SHOAL_ERR_NO_MEMORY;
        }
        memset(hb->scratch, 0, need);
        hb->scratch_size = need;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_hier_allreduce_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                         const shoal_coll_args_t *a, uint32_t seq, int exclusive)
{
    shoal_hier_t *h;
    shoal_hier_map_t *m;
    shoal_status_t st;

    if (!shoal_hier_applicable(comm, a)) {
        if (shoal_hier_map(comm) == NULL) { /* the other ranks may not fall back: say why */
            shoal_warn_once(COLL, "hierarchical AllReduce: no memory for its host map on rank "
                            "%d: using the ring", comm->rank);
        } else {
            shoal_warn_once(COLL, "hierarchical AllReduce needs at most %d ranks per host: "
                            "using the ring", SHOAL_HIER_MAX_LOCAL);
        }
        return shoal_ring_allreduce_plan(comm, cp_p, a, seq, exclusive);
    }
    m = comm->coll->hier;
    /* No pool scratch (it receives into the map's slots or its own): the communicator's
     * pointer, never touched. A nonblocking call took a pool buffer, faulted in up to its
     * message size and kept in the pool, for nothing. */
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*h), 1, (shoal_coll_plan_t **)&h));
    h->cp.base.progress = shoal_hier_progress;
    h->cp.base.release = shoal_hier_release;
    h->a = &h->cp.a;
    h->m = m;
    h->seq = seq;
    h->ds = h->cp.dsize;
    h->g = m->nhosts;
    h->me = m->myhost;
    h->segc = shoal_hier_segc(comm, a->count, h->ds);
    h->nseg = (a->count + h->segc - 1) / h->segc;
    h->bmax = (h->segc + (size_t)m->lmax - 1) / (size_t)m->lmax;
    h->cmax = (h->bmax + (size_t)h->g - 1) / (size_t)h->g;
    if (!m->bufs_busy) {
        h->hb = &m->bufs;
        m->bufs_busy = 1;
    } else {
        st = shoal_hier_bufs_alloc(m, &h->own);
        if (st != SHOAL_OK) {
            shoal_coll_plan_release(comm, &h->cp.base, st);
            return st;
        }
        h->hb = &h->own;
        h->own_bufs = 1;
    }
    st = shoal_hier_slots(h->hb, (size_t)m->nb * (size_t)m->L * h->bmax * h->ds +
                                     (size_t)SHOAL_HIER_DEPTH * (size_t)m->nb *
                                         (size_t)(h->g - 1) * h->cmax * h->ds);
    if (st != SHOAL_OK) {
        shoal_hier_release(comm, &h->cp.base, st);
        return st;
    }
    memset(h->hb->ireqp, 0, (size_t)m->lmax * (size_t)m->L * sizeof(*h->hb->ireqp));
    h->islot = h->hb->scratch;
    h->rslot = h->hb->scratch + (size_t)m->nb * (size_t)m->L * h->bmax * h->ds;
    /* the cursors start at the first item of round 0 */
    h->sidx = h->ridx = (size_t)-1;
    shoal_hier_cursor_next(h, &h->sround, &h->sidx);
    shoal_hier_cursor_next(h, &h->rround, &h->ridx);
    /* Channels: my host's ranks and my rings' neighbours; a plan lists at most
     * SHOAL_PLAN_PEERS, past that it advances alone (shoal_coll_plan_peer). */
    for (int q = 0; q < m->L; q++) {
        if (q != m->li) {
            shoal_coll_plan_peer(&h->cp, m->loc[q]);
        }
    }
    for (int b = 0; m->nsteps > 0 && b < m->nb; b++) {
        shoal_coll_plan_peer(&h->cp, m->next[b]);
        shoal_coll_plan_peer(&h->cp, m->prev[b]);
    }
    *cp_p = &h->cp;
    return SHOAL_OK;
}
