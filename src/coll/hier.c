/*
 * Hierarchical AllReduce for communicators spread over several hosts, any number of ranks per
 * host. The buffer is cut into B = (most ranks on one host) blocks; on a host of L ranks,
 * local rank i owns the blocks j with j % L == i.
 *   1. intra-host reduce-scatter: in rounds of L blocks, every rank sends its pieces of the
 *      round's blocks to their owners, and each owner reduces its block in local-rank order;
 *   2. inter-host AllReduce of block j among its owners (one per host, in host order), a ring
 *      over the inter-host channels; the owner of each ring segment scales AVG once;
 *   3. intra-host allgather: owners send their blocks to the other ranks of their host.
 * Intra-host traffic goes over the channels to local peers (shm when there), inter-host over
 * the others (tcp, ucx). The host grouping (shoal_hier_map_build) takes the topology's
 * host_of[] where there is one, else peers[].host_id.
 */
#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>

#define SHOAL_HIER_STEP_RS 0x100u
#define SHOAL_HIER_STEP_AR 0x200u
#define SHOAL_HIER_STEP_AG 0x300u

typedef struct shoal_hier_map {
    int nhosts;
    int myhost;
    int lmax;              /* most ranks on one host: the number of blocks */
    int *first;            /* [nhosts + 1]: host h's ranks are ranks[first[h] .. first[h+1]) */
    int *ranks;            /* [nranks], grouped by host (hosts by lowest rank), ascending */
    int *grp;              /* [nhosts]: one inter-host group */
} shoal_hier_map_t;

/* Host of rank r: the topology's grouping (virtual hosts of SHOAL_TOPO_FILE included) when
 * the communicator has one, else the host id each rank announced. */
static uint64_t shoal_hier_host_key(struct shoal_comm *comm, int r)
{
    if (comm->coll->host_of != NULL) {
        return (uint64_t)comm->coll->host_of[r];
    }
    return comm->peers[r].host_id;
}

static shoal_status_t shoal_hier_map_build(struct shoal_comm *comm, shoal_hier_map_t *m)
{
    int n = comm->nranks, *hostof = calloc((size_t)n, sizeof(int)), k = 0;

    m->first = calloc((size_t)n + 1, sizeof(int));
    m->ranks = calloc((size_t)n, sizeof(int));
    m->grp = calloc((size_t)n, sizeof(int));
    if (hostof == NULL || m->first == NULL || m->ranks == NULL || m->grp == NULL) {
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
        free(m->grp);
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
    size_t dsize;
    int L, li;             /* ranks on my host, my index among them */
    const int *loc;        /* global ranks of my host */
} shoal_hier_t;

static void shoal_hier_block(const shoal_hier_t *h, int j, size_t *off_p, size_t *len_p)
{
    shoal_block_range(h->a->count, h->m->lmax, j, off_p, len_p);
}

/* Phase 1, one piece of round [j0, j1): send my piece of each block to its owner, receive
 * the others' pieces of my block (jm, or -1), reduce in local-rank order. */
static shoal_status_t shoal_hier_rs_piece(shoal_hier_t *h, int j0, int j1, int jm, size_t i,
                                          size_t P)
{
    struct shoal_comm *comm = h->comm;
    shoal_tl_req_t req[2 * SHOAL_HIER_MAX_LOCAL];
    shoal_tl_req_t *reqs[2 * SHOAL_HIER_MAX_LOCAL];
    int peers[2 * SHOAL_HIER_MAX_LOCAL], nr = 0;
    const void *srcs[SHOAL_HIER_MAX_LOCAL];
    const uint8_t *sbuf = h->a->sendbuf;
    size_t off, len, po = 0, pl = 0;

    if (jm >= 0) {
        shoal_hier_block(h, jm, &off, &len);
        if (i * P >= len && i > 0) {
            jm = -1; /* my block has fewer pieces */
        } else {
            po = off + i * P;
            pl = SHOAL_MIN(P, len - i * P);
        }
    }
    for (int q = 0; q < h->L && jm >= 0; q++) {
        uint8_t *slot = comm->coll->scratch + (size_t)q * P * h->dsize;
        srcs[q] = slot;
        if (q == h->li) {
            srcs[q] = sbuf + po * h->dsize;
            if (q != 0 && h->a->sendbuf == h->a->recvbuf) { /* dst may alias srcs[0] only */
                memcpy(slot, srcs[q], pl * h->dsize);
                srcs[q] = slot;
            }
            continue;
        }
        peers[nr] = h->loc[q];
        reqs[nr] = &req[nr];
        SHOAL_CHECK(shoal_chan_irecv(comm, h->loc[q], slot, pl * h->dsize, h->seq,
                                     SHOAL_HIER_STEP_RS, (uint32_t)i, &req[nr]));
        nr++;
    }
    for (int j = j0; j < j1; j++) {
        int o = j % h->L;
        shoal_hier_block(h, j, &off, &len);
        if (o == h->li || (i * P >= len && i > 0)) {
            continue;
        }
        peers[nr] = h->loc[o];
        reqs[nr] = &req[nr];
        SHOAL_CHECK(shoal_chan_isend(comm, h->loc[o], sbuf + (off + i * P) * h->dsize,
                                     SHOAL_MIN(P, len - i * P) * h->dsize, h->seq,
                                     SHOAL_HIER_STEP_RS, (uint32_t)i, &req[nr]));
        nr++;
    }
    SHOAL_CHECK(shoal_chan_waitall(comm, reqs, peers, nr));
    if (jm >= 0) {
        shoal_reduce_n((uint8_t *)h->a->recvbuf + po * h->dsize, srcs, h->L, pl, h->a->dtype,
                       h->a->op);
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_hier_rs(shoal_hier_t *h)
{
    int L = h->L, B = h->m->lmax;
    size_t P = SHOAL_MAX(h->comm->coll->scratch_size / (size_t)L / h->dsize, 1);

    for (int j0 = 0; j0 < B; j0 += L) {
        int j1 = SHOAL_MIN(j0 + L, B), jm = j0 + h->li < j1 ? j0 + h->li : -1;
        size_t np = 1;
        for (int j = j0; j < j1; j++) {
            size_t off, len;
            shoal_hier_block(h, j, &off, &len);
            np = SHOAL_MAX(np, (len + P - 1) / P);
        }
        for (size_t i = 0; i < np; i++) {
            SHOAL_CHECK(shoal_hier_rs_piece(h, j0, j1, jm, i, P));
        }
    }
    return SHOAL_OK;
}

/* Phase 2: ring AllReduce of buf[0, m) among g ranks grp[], me = my index; slices of
 * g * piece elements through scratch. */
static shoal_status_t shoal_hier_ring(shoal_hier_t *h, const int *grp, int g, int me,
                                      uint8_t *buf, size_t m, uint32_t step0)
{
    struct shoal_comm *comm = h->comm;
    const shoal_coll_args_t *a = h->a;
    size_t ds = h->dsize, P = SHOAL_MAX(comm->coll->scratch_size / ds, 1);
    int next = grp[(me + 1) % g], prev = grp[shoal_mod(me - 1, g)];
    uint32_t slice = 0;

    if (g == 1) {
        shoal_reduce_avg_finalize(buf, m, a->dtype, a->op, comm->nranks);
        return SHOAL_OK;
    }
    for (size_t base = 0; base < m; base += (size_t)g * P, slice++) {
        size_t sm = SHOAL_MIN((size_t)g * P, m - base), so, sl, ro, rl;
        uint8_t *sb = buf + base * ds;
        for (int k = 0; k < 2 * (g - 1); k++) {
            int rs = k < g - 1, kk = rs ? k : k - (g - 1);
            int sblk = rs ? shoal_mod(me - kk, g) : shoal_mod(me + 1 - kk, g);
            int rblk = rs ? shoal_mod(me - kk - 1, g) : shoal_mod(me - kk, g);
            shoal_block_range(sm, g, sblk, &so, &sl);
            shoal_block_range(sm, g, rblk, &ro, &rl);
            SHOAL_CHECK(shoal_prim_sendrecv(comm, next, sb + so * ds, sl * ds, prev,
                                            rs ? comm->coll->scratch : sb + ro * ds, rl * ds,
                                            h->seq, step0 + (uint32_t)k, slice));
            if (rs) {
                shoal_reduce2(sb + ro * ds, sb + ro * ds, comm->coll->scratch, rl, a->dtype,
                              a->op);
                if (k == g - 2) {
                    shoal_reduce_avg_finalize(sb + ro * ds, rl, a->dtype, a->op, comm->nranks);
                }
            }
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_hier_inter(shoal_hier_t *h)
{
    shoal_hier_map_t *m = h->m;

    for (int j = h->li; j < m->lmax; j += h->L) {
        size_t off, len;
        for (int x = 0; x < m->nhosts; x++) {
            int lx = m->first[x + 1] - m->first[x];
            m->grp[x] = m->ranks[m->first[x] + j % lx];
        }
        shoal_hier_block(h, j, &off, &len);
        SHOAL_CHECK(shoal_hier_ring(h, m->grp, m->nhosts, m->myhost,
                                    (uint8_t *)h->a->recvbuf + off * h->dsize, len,
                                    SHOAL_HIER_STEP_AR));
    }
    return SHOAL_OK;
}

/* Phase 3: in rounds of L blocks, each owner sends its block to the other local ranks. */
static shoal_status_t shoal_hier_ag(shoal_hier_t *h)
{
    struct shoal_comm *comm = h->comm;
    int L = h->L, B = h->m->lmax;
    shoal_tl_req_t req[2 * SHOAL_HIER_MAX_LOCAL];
    shoal_tl_req_t *reqs[2 * SHOAL_HIER_MAX_LOCAL];
    int peers[2 * SHOAL_HIER_MAX_LOCAL];
    uint8_t *rbuf = h->a->recvbuf;

    for (int j0 = 0; j0 < B; j0 += L) {
        int nr = 0;
        for (int j = j0; j < SHOAL_MIN(j0 + L, B); j++) {
            int o = j % L;
            size_t off, len;
            shoal_hier_block(h, j, &off, &len);
            for (int q = 0; q < L; q++) {
                if (q == o || (o != h->li && q != h->li)) {
                    continue;
                }
                peers[nr] = h->loc[o == h->li ? q : o];
                reqs[nr] = &req[nr];
                if (o == h->li) {
                    SHOAL_CHECK(shoal_chan_isend(comm, peers[nr], rbuf + off * h->dsize,
                                                 len * h->dsize, h->seq, SHOAL_HIER_STEP_AG, 0,
                                                 &req[nr]));
                } else {
                    SHOAL_CHECK(shoal_chan_irecv(comm, peers[nr], rbuf + off * h->dsize,
                                                 len * h->dsize, h->seq, SHOAL_HIER_STEP_AG, 0,
                                                 &req[nr]));
                }
                nr++;
            }
        }
        SHOAL_CHECK(shoal_chan_waitall(comm, reqs, peers, nr));
    }
    return SHOAL_OK;
}

shoal_status_t shoal_hier_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                    uint32_t seq)
{
    shoal_hier_t h = {.comm = comm, .a = a, .seq = seq, .dsize = shoal_dtype_size(a->dtype)};

    if (!shoal_hier_applicable(comm, a)) {
        shoal_warn_once(COLL, "hierarchical AllReduce needs at most %d ranks per host: using "
                        "the ring", SHOAL_HIER_MAX_LOCAL);
        return shoal_ring_allreduce(comm, a, seq);
    }
    h.m = comm->coll->hier;
    h.loc = h.m->ranks + h.m->first[h.m->myhost];
    h.L = h.m->first[h.m->myhost + 1] - h.m->first[h.m->myhost];
    for (h.li = 0; h.loc[h.li] != comm->rank; h.li++) {
    }
    if (h.L > 1) {
        SHOAL_CHECK(shoal_hier_rs(&h));
    } else if (a->sendbuf != a->recvbuf) {
        memcpy(a->recvbuf, a->sendbuf, a->count * h.dsize);
    }
    SHOAL_CHECK(shoal_hier_inter(&h));
    return h.L > 1 ? shoal_hier_ag(&h) : SHOAL_OK;
}
