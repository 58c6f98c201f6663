/*
 * The shape the cost model reads (coll.h): built from the topology of a communicator
 * (src/topo's shoal_topo_comm_t) or, for shoal_info -t and the tests, from a host layout
 * alone; identical on every rank, so every rank picks the same algorithm.
 */
#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>

/* Partner of rank r in recursive doubling (rd.c) at exchange mask, or in the fold (mask 0:
 * ranks below 2*extra pair up); -1 when r sits the step out. */
static int shoal_coll_rd_peer(int r, int extra, int mask)
{
    if (mask == 0) {
        return r < 2 * extra ? (r % 2 == 0 ? r + 1 : r - 1) : -1;
    }
    if (r < 2 * extra && r % 2 == 1) {
        return -1;
    }
    return shoal_rd_real_rank((r < 2 * extra ? r / 2 : r - extra) ^ mask, extra);
}

/* Recursive doubling over rank order: per step, the ranks of the busiest host that talk to
 * another host share its NIC. Sums each step's latency and per-byte time (the fold counts
 * twice: there and back). */
static void shoal_coll_shape_rd(shoal_coll_shape_t *s, int n, const int *host_of)
{
    int p = 1, extra, *cross = calloc((size_t)n, sizeof(int));

    while (p * 2 <= n) {
        p *= 2;
    }
    extra = n - p;
    s->rd_alpha_us = 0;
    s->rd_beta_us = 0;
    for (int mask = extra > 0 ? 0 : 1; mask < p; mask = mask == 0 ? 1 : mask << 1) {
        int share = 0, w = mask == 0 ? 2 : 1;
        shoal_link_t l;
        for (int r = 0; cross != NULL && r < n; r++) {
            cross[r] = 0;
        }
        for (int r = 0; cross != NULL && r < n; r++) {
            int peer = shoal_coll_rd_peer(r, extra, mask);
            if (peer >= 0 && host_of[peer] != host_of[r]) {
                cross[host_of[r]]++;
                share = SHOAL_MAX(share, cross[host_of[r]]);
            }
        }
        l = share > 0 ? s->inter : s->intra;
        s->rd_alpha_us += w * l.alpha_us;
        s->rd_beta_us += w * l.beta_us * SHOAL_MAX(share, 1);
    }
    free(cross);
}

void shoal_coll_shape_build(shoal_coll_shape_t *s, int n, const int *host_of,
                            const int *ring_order, const shoal_link_t *intra,
                            const shoal_link_t *inter, int shm_direct, int ncores)
{
    int *cnt = calloc((size_t)n, sizeof(int));
    size_t chunk = SHOAL_MAX(SHOAL_ALIGN_UP(shoal_coll_config.chunk_size, 64), 4096);

    memset(s, 0, sizeof(*s));
    s->nranks = n;
    for (int r = 0; r < n; r++) {
        s->nhosts = SHOAL_MAX(s->nhosts, host_of[r] + 1);
        if (cnt != NULL) {
            cnt[host_of[r]]++;
            s->max_ppn = SHOAL_MAX(s->max_ppn, cnt[host_of[r]]);
        }
    }
    free(cnt);
    s->shm_direct = shm_direct && s->nhosts == 1;
    s->oversub = ncores > 0 && s->max_ppn > ncores ? (double)s->max_ppn / ncores : 1.0;
    s->intra = intra->beta_us > 0 ? *intra : shoal_link_default(SHOAL_LINK_SHM);
    s->inter = inter->beta_us > 0 ? *inter : shoal_link_default(SHOAL_LINK_TCP);
    s->ring_share = n > 1 ? shoal_topo_ring_share(n, host_of, ring_order) : 0;
    s->reduce_beta = shoal_gbs_to_beta(4.0);
    s->copy_beta = shoal_gbs_to_beta(8.0);
    s->chunk = chunk;
    s->scratch = SHOAL_MAX(4 * chunk, SHOAL_ALIGN_UP(shoal_coll_config.rd_max, 64));
    s->shm_oneshot_max = shoal_coll_config.shm_oneshot_max != 0 ? shoal_coll_config.shm_oneshot_max
                         : s->oversub > 1                         ? SHOAL_SHM_ONESHOT_SHARED_CORE
                                                                  : SHOAL_SHM_ONESHOT_OWN_CORE;
    s->shm_window = shoal_coll_config.shm_window;
    s->hier_segment = shoal_coll_config.hier_segment;
    shoal_coll_shape_rd(s, n, host_of);
}

void shoal_coll_shape_topo(shoal_coll_shape_t *s, const shoal_topo_comm_t *tc, int shm_direct)
{
    shoal_coll_shape_build(s, tc->nranks, tc->host_of, tc->ring_order, &tc->intra, &tc->inter,
                           shm_direct, tc->ncores);
    /* local memory rates of rank 0's tuning file (src/tune's settings may override them) */
    if (tc->reduce_gbs > 0) {
        s->reduce_beta = shoal_gbs_to_beta(tc->reduce_gbs);
    }
    if (tc->copy_gbs > 0) {
        s->copy_beta = shoal_gbs_to_beta(tc->copy_gbs);
    }
}
