/*
 * Topology of a communicator, built at init over its own channels (core's primitives: topo
 * calls nothing of coll; it still fills the coll state's ring and shape fields, see coll.h):
 *  1. every rank discovers its host (cached per process) and lists the link kinds of its
 *     channels to ranks of its own host and of other hosts; one ring allgather in rank order
 *     spreads these records (rank 0's tuning file rides along, so all use the same one);
 *  2. ranks are grouped by host (host id, or virtual hosts from SHOAL_TOPO_FILE) and socket,
 *     and the ring order is computed (the same on every rank);
 *  3. unless every link kind is known, neighbour pairs (0-1, 2-3, ... then 1-2, 3-4, ...)
 *     time a few ping-pongs, and a second allgather spreads the results;
 *  4. the shape for the cost model is derived from all of it, identically on every rank.
 */
#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOAL_TOPO_PP_SMALL_ITERS 5
#define SHOAL_TOPO_PP_LARGE_ITERS 3
#define SHOAL_TOPO_PP_LARGE (256 * 1024)
#define SHOAL_TOPO_PP_STEP 0x70000000u
#define SHOAL_TOPO_BURST 8        /* sends per burst: within the shm ring's default 8 slots */
#define SHOAL_TOPO_BURST_ITERS 4
#define SHOAL_TOPO_BURST_WAIT_US 200

/* Round 1 record: one per rank. */
typedef struct {
    shoal_topo_summary_t sum;
    uint32_t kinds_intra;  /* bit k: a channel of kind k to a rank of my host */
    uint32_t kinds_inter;  /* ... to a rank of another host */
    int32_t tuning_loaded; /* rank 0: the tuning file below is valid */
    int32_t ring_bad;      /* this rank's ring host list is malformed */
    uint64_t ring_hash;    /* fingerprint of its ring host list, 0 none */
    char host[SHOAL_TOPO_HOSTNAME_MAX]; /* short host name */
    shoal_tuning_t tuning;
} shoal_topo_rec_t;

/* Round 2 record: what this rank measured as the leader of a pair (kind -1: nothing). */
typedef struct {
    int32_t kind[2];
    double alpha_us[2];
    double beta_us[2];
    double send_us[2];
    double recv_us[2];
} shoal_topo_meas_t;

/* Messages of the topology exchange: core's channel primitives, never coll's algorithms
 * (topo sits below coll). to/from < 0: that side is absent. */
static shoal_status_t shoal_topo_send(struct shoal_comm *comm, int to, const void *buf,
                                      size_t len, uint32_t seq, uint32_t step)
{
    return shoal_chan_sendrecv(comm, to, buf, -1, NULL, len, seq, step);
}

static shoal_status_t shoal_topo_recv(struct shoal_comm *comm, int from, void *buf, size_t len,
                                      uint32_t seq, uint32_t step)
{
    return shoal_chan_sendrecv(comm, -1, NULL, from, buf, len, seq, step);
}

/* A ring allgather of fixed-size records over the current ring order: at ring position p,
 * step j passes on the record of the rank at position p-j. */
static shoal_status_t shoal_topo_allgather(struct shoal_comm *comm, const void *mine, size_t len,
                                           void *all)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->nranks, pos = cs->ring_pos;
    uint8_t *rbuf = all;
    uint32_t seq = comm->seq++;

    memmove(rbuf + (size_t)comm->rank * len, mine, len);
    for (int j = 0; j < n - 1; j++) {
        int sblk = cs->ring_order[((pos - j) % n + n) % n];
        int rblk = cs->ring_order[((pos - j - 1) % n + n) % n];
        SHOAL_CHECK(shoal_chan_sendrecv(comm, cs->ring_next, rbuf + (size_t)sblk * len,
                                    cs->ring_prev, rbuf + (size_t)rblk * len, len, seq,
                                    (uint32_t)j));
    }
    return SHOAL_OK;
}

static void shoal_topo_set_ring(shoal_coll_state_t *cs, int n, int rank)
{
    for (int i = 0; i < n; i++) {
        if (cs->ring_order[i] == rank) {
            cs->ring_pos = i;
        }
    }
    cs->ring_next = cs->ring_order[(cs->ring_pos + 1) % n];
    cs->ring_prev = cs->ring_order[(cs->ring_pos + n - 1) % n];
}

static int shoal_topo_chan_kind(struct shoal_comm *comm, int p)
{
    int k;
    if (comm->chans[p].tl == NULL || comm->chans[p].tl->ops == NULL) {
        return SHOAL_LINK_TCP;
    }
    k = shoal_link_kind_from_name(comm->chans[p].tl->ops->name);
    return k < 0 ? SHOAL_LINK_TCP : k;
}

/* Hosts: virtual ones from SHOAL_TOPO_FILE, else the host ids of the bootstrap. */
static shoal_status_t shoal_topo_hosts(struct shoal_comm *comm, shoal_topo_file_t *tf)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->nranks;
    const char *path = shoal_coll_config.topo_file;

    if (path != NULL && path[0] != '\0') {
        SHOAL_CHECK(shoal_topo_file_load(path, n, tf));
        memcpy(cs->host_of, tf->host_of, sizeof(int) * (size_t)n);
        cs->nhosts = 0;
        /* Renumber by first appearance, like host ids. */
        uint64_t *ids = malloc(sizeof(uint64_t) * (size_t)n);
        if (ids == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
        for (int r = 0; r < n; r++) {
            ids[r] = (uint64_t)tf->host_of[r];
        }
        cs->nhosts = shoal_topo_host_index(n, ids, cs->host_of);
        free(ids);
        return SHOAL_OK;
    }
    uint64_t *ids = malloc(sizeof(uint64_t) * (size_t)n);
    if (ids == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int r = 0; r < n; r++) {
        ids[r] = comm->peers[r].host_id;
    }
    cs->nhosts = shoal_topo_host_index(n, ids, cs->host_of);
    free(ids);
    return SHOAL_OK;
}

/* Leader side times round trips of len bytes; returns the best one-way time in us. */
static shoal_status_t shoal_topo_pingpong(struct shoal_comm *comm, int peer, int lead,
                                          size_t len, int iters, uint32_t *step,
                                          double *oneway_p)
{
    uint8_t *buf = comm->coll->scratch;
    uint32_t seq = comm->seq;
    double best = 1e30;

    for (int i = 0; i < iters; i++) {
        uint64_t t0 = shoal_time_ns();
        if (lead) {
            SHOAL_CHECK(shoal_topo_send(comm, peer, buf, len, seq, (*step)++));
            SHOAL_CHECK(shoal_topo_recv(comm, peer, buf, len, seq, (*step)++));
        } else {
            SHOAL_CHECK(shoal_topo_recv(comm, peer, buf, len, seq, (*step)++));
            SHOAL_CHECK(shoal_topo_send(comm, peer, buf, len, seq, (*step)++));
        }
        double us = (double)(shoal_time_ns() - t0) / 2000.0;
        /* The first round trip warms the path up: not counted. */
        if (i > 0 && us < best) {
            best = us;
        }
    }
    *oneway_p = best;
    return SHOAL_OK;
}

/* Busy time per small message of a sender and of a receiver. Sender: the leader posts
 * SHOAL_TOPO_BURST sends at once and times until all completed (handed to the transport:
 * copied into a ring or a socket). Receiver: the other side lets the burst arrive
 * (SHOAL_TOPO_BURST_WAIT_US), then times posting and completing the receives (copying them
 * out); an answer closes the round. Best of SHOAL_TOPO_BURST_ITERS after a warm-up. */
static shoal_status_t shoal_topo_burst(struct shoal_comm *comm, int peer, int lead,
                                       uint32_t *step, double *send_p, double *recv_p)
{
    shoal_tl_req_t reqs[SHOAL_TOPO_BURST], *rp[SHOAL_TOPO_BURST];
    int peers[SHOAL_TOPO_BURST];
    uint8_t *buf = comm->coll->scratch;
    uint32_t seq = comm->seq;
    double best = 1e30;

    for (int it = 0; it <= SHOAL_TOPO_BURST_ITERS; it++) {
        uint32_t ack = *step + SHOAL_TOPO_BURST;
        uint64_t t0;
        double us;
        if (!lead) {
            shoal_sleep_us(SHOAL_TOPO_BURST_WAIT_US);
        }
        t0 = shoal_time_ns();
        for (int i = 0; i < SHOAL_TOPO_BURST; i++) {
            peers[i] = peer;
            rp[i] = &reqs[i];
            if (lead) {
                SHOAL_CHECK(shoal_chan_isend(comm, peer, buf + 64 * i, 8, seq, *step + i, 0,
                                             &reqs[i]));
            } else {
                SHOAL_CHECK(shoal_chan_irecv(comm, peer, buf + 64 * i, 8, seq, *step + i, 0,
                                             &reqs[i]));
            }
        }
        SHOAL_CHECK(shoal_chan_waitall(comm, rp, peers, SHOAL_TOPO_BURST));
        us = (double)(shoal_time_ns() - t0) / 1000.0 / SHOAL_TOPO_BURST;
        best = it > 0 && us < best ? us : best;
        if (lead) {
            SHOAL_CHECK(shoal_topo_recv(comm, peer, buf, 1, seq, ack));
        } else {
            SHOAL_CHECK(shoal_topo_send(comm, peer, buf, 1, seq, ack));
        }
        *step = ack + 1;
    }
    *(lead ? send_p : recv_p) = best;
    return SHOAL_OK;
}

/* Phase ph (0: pairs 0-1, 2-3...; 1: pairs 1-2, 3-4...) for kinds not in known. */
static shoal_status_t shoal_topo_measure_phase(struct shoal_comm *comm, int ph, uint32_t known,
                                               shoal_topo_meas_t *m)
{
    int rank = comm->rank, peer = ((rank + ph) % 2 == 0) ? rank + 1 : rank - 1;
    size_t large = SHOAL_MIN((size_t)SHOAL_TOPO_PP_LARGE, comm->coll->scratch_size);
    uint32_t step = SHOAL_TOPO_PP_STEP;
    double small_us, large_us, send_us = 0, recv_us = 0, peer_recv_us = 0;
    int kind;

    m->kind[ph] = -1;
    if (peer < 0 || peer >= comm->nranks) {
        return SHOAL_OK;
    }
    kind = shoal_topo_chan_kind(comm, peer);
    if ((known & (1u << kind)) != 0) {
        return SHOAL_OK; /* both sides see the same kind and the same known mask */
    }
    SHOAL_CHECK(shoal_topo_pingpong(comm, peer, rank < peer, 8, SHOAL_TOPO_PP_SMALL_ITERS,
                                    &step, &small_us));
    SHOAL_CHECK(shoal_topo_pingpong(comm, peer, rank < peer, large, SHOAL_TOPO_PP_LARGE_ITERS,
                                    &step, &large_us));
    SHOAL_CHECK(shoal_topo_burst(comm, peer, rank < peer, &step, &send_us, &recv_us));
    /* the receiver's figure travels to the leader, which reports the pair */
    if (rank < peer) {
        SHOAL_CHECK(shoal_topo_recv(comm, peer, &peer_recv_us, sizeof(double), comm->seq,
                                    step));
        m->kind[ph] = kind;
        m->alpha_us[ph] = small_us;
        m->beta_us[ph] = SHOAL_MAX(large_us - small_us, 0.01) / (double)large;
        m->send_us[ph] = SHOAL_MIN(send_us, small_us);
        m->recv_us[ph] = SHOAL_MIN(peer_recv_us, small_us);
    } else {
        SHOAL_CHECK(shoal_topo_send(comm, peer, &recv_us, sizeof(double), comm->seq, step));
    }
    return SHOAL_OK;
}

/* Per kind: the mean of the measurements (summed in rank order: same bits everywhere), else
 * rank 0's tuning file, else the default. */
static void shoal_topo_link_table(int n, const shoal_topo_meas_t *all, const shoal_tuning_t *t,
                                  shoal_link_t *links)
{
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        double a = 0, b = 0, o = 0, orcv = 0;
        int cnt = 0;
        for (int r = 0; all != NULL && r < n; r++) {
            for (int ph = 0; ph < 2; ph++) {
                if (all[r].kind[ph] == k) {
                    a += all[r].alpha_us[ph];
                    b += all[r].beta_us[ph];
                    o += all[r].send_us[ph];
                    orcv += all[r].recv_us[ph];
                    cnt++;
                }
            }
        }
        if (cnt > 0) {
            links[k] = (shoal_link_t){.alpha_us = a / cnt, .beta_us = b / cnt,
                                      .send_us = o / cnt, .recv_us = orcv / cnt};
        } else if (t != NULL && t->have[k]) {
            links[k] = t->link[k];
        } else {
            links[k] = shoal_link_default((shoal_link_kind_t)k);
        }
    }
}

/* The slowest of the kinds in mask (dflt when the mask is empty). */
static shoal_link_t shoal_topo_worst(uint32_t mask, const shoal_link_t *links, int dflt)
{
    shoal_link_t w = links[dflt];
    int any = 0;
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        if ((mask & (1u << k)) != 0) {
            w = any ? (shoal_link_t){.alpha_us = SHOAL_MAX(w.alpha_us, links[k].alpha_us),
                                     .beta_us = SHOAL_MAX(w.beta_us, links[k].beta_us),
                                     .send_us = SHOAL_MAX(w.send_us, links[k].send_us),
                                     .recv_us = SHOAL_MAX(w.recv_us, links[k].recv_us)}
                    : links[k];
            any = 1;
        }
    }
    return w;
}

static void shoal_topo_log(struct shoal_comm *comm, const shoal_link_t *links, uint32_t used)
{
    shoal_coll_state_t *cs = comm->coll;
    if (comm->rank != 0 || !shoal_log_enabled(SHOAL_LOG_INFO, TOPO)) {
        return;
    }
    shoal_info(TOPO, "%d ranks on %d host(s), ring order %s, ring crossings per host %d",
               comm->nranks, cs->nhosts, shoal_coll_config.ring_order == 0 ? "topo" : "rank",
               cs->shape.ring_share);
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        if ((used & (1u << k)) != 0) {
            shoal_info(TOPO, "link %s: %.2f us, %.3f GB/s, send %.2f us, recv %.2f us",
                       shoal_link_kind_names[k], links[k].alpha_us,
                       shoal_beta_to_gbs(links[k].beta_us), links[k].send_us, links[k].recv_us);
        }
    }
    shoal_info(TOPO, "memory: reduce %.2f GB/s, copy %.2f GB/s (model)",
               shoal_beta_to_gbs(cs->shape.reduce_beta), shoal_beta_to_gbs(cs->shape.copy_beta));
}

static shoal_status_t shoal_topo_alloc(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->nranks;
    cs->ring_order = malloc(sizeof(int) * (size_t)n);
    cs->host_of = calloc((size_t)n, sizeof(int));
    cs->socket_of = calloc((size_t)n, sizeof(int));
    if (cs->ring_order == NULL || cs->host_of == NULL || cs->socket_of == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int i = 0; i < n; i++) {
        cs->ring_order[i] = i;
    }
    shoal_topo_set_ring(cs, n, comm->rank);
    return SHOAL_OK;
}

/* Round 1: my record, everyone's records. */
static shoal_status_t shoal_topo_round1(struct shoal_comm *comm, shoal_topo_rec_t *all,
                                        const shoal_topo_ring_hosts_t *rh, int ring_bad)
{
    shoal_coll_state_t *cs = comm->coll;
    shoal_topo_rec_t *me = calloc(1, sizeof(*me));
    const char *tpath = shoal_coll_config.tuning_file;
    shoal_status_t st;

    if (me == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    shoal_topo_discover(shoal_coll_config.topo_discovery, &me->sum);
    for (int p = 0; p < comm->nranks; p++) {
        if (p != comm->rank) {
            uint32_t bit = 1u << shoal_topo_chan_kind(comm, p);
            if (cs->host_of[p] == cs->host_of[comm->rank]) {
                me->kinds_intra |= bit;
            } else {
                me->kinds_inter |= bit;
            }
        }
    }
    if (comm->rank == 0 && tpath != NULL && tpath[0] != '\0') {
        me->tuning_loaded = shoal_tuning_load(tpath, &me->tuning) == 1;
    }
    me->ring_bad = ring_bad;
    me->ring_hash = rh->n > 0 ? rh->hash : 0;
    /* the name SHOAL_RING_HOSTS lists: SHOAL_HOSTID where the provider set one */
    snprintf(me->host, sizeof(me->host), "%s",
             shoal_util_config.hostid != NULL && shoal_util_config.hostid[0] != '\0'
                 ? shoal_util_config.hostid : shoal_hostname());
    st = shoal_topo_allgather(comm, me, sizeof(*me), all);
    free(me);
    return st;
}

/* The ring order a placement asked for, where every rank was given the same valid list that
 * names every rank's host (SHOAL_TOPO_FILE's virtual hosts are "host<N>"). */
static void shoal_topo_ring_hosts_apply(struct shoal_comm *comm, const shoal_topo_rec_t *all,
                                        const shoal_topo_file_t *tf,
                                        const shoal_topo_ring_hosts_t *rh)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->nranks, any = 0, same = 1, rc;
    char (*virt)[SHOAL_TOPO_HOSTNAME_MAX] = NULL;
    const char **names;

    for (int r = 0; r < n; r++) {
        any |= all[r].ring_hash != 0 || all[r].ring_bad;
        same &= !all[r].ring_bad && all[r].ring_hash == all[0].ring_hash;
    }
    if (!any) {
        return;
    }
    if (!same) {
        if (comm->rank == 0) {
            shoal_warn(TOPO, "SHOAL_RING_HOSTS: malformed or not the same on every rank: the "
                       "ring keeps its usual order");
        }
        return;
    }
    names = malloc(sizeof(*names) * (size_t)n);
    virt = tf->host_of != NULL ? malloc(sizeof(*virt) * (size_t)n) : NULL;
    if (names == NULL || (tf->host_of != NULL && virt == NULL)) {
        free(names);
        free(virt);
        return;
    }
    for (int r = 0; r < n; r++) {
        if (virt != NULL) {
            snprintf(virt[r], sizeof(virt[r]), "host%d", tf->host_of[r]);
        }
        names[r] = virt != NULL ? virt[r] : all[r].host;
    }
    rc = shoal_topo_ring_order_hosts(n, cs->socket_of, names, rh, cs->ring_order);
    if (rc > 0 && comm->rank == 0) {
        shoal_warn(TOPO, "SHOAL_RING_HOSTS: rank %d's host %s is not in the list (%d hosts): "
                   "the ring keeps its usual order", rc - 1, names[rc - 1], rh->n);
    } else if (rc == 0 && comm->rank == 0 && shoal_log_enabled(SHOAL_LOG_INFO, TOPO)) {
        char buf[128];
        size_t len = 0;
        for (int i = 0; i < n && len + 12 < sizeof(buf); i++) {
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, " %d", cs->ring_order[i]);
        }
        shoal_info(TOPO, "ring order from SHOAL_RING_HOSTS (%d hosts listed), first host %s, "
                   "ranks%s%s", rh->n, names[cs->ring_order[0]], buf, n > 10 ? " ..." : "");
    }
    free(names);
    free(virt);
}

/* Rounds 1 and 2 done: grouping, order, links, shape. */
static void shoal_topo_finish(struct shoal_comm *comm, const shoal_topo_rec_t *all,
                              const shoal_topo_file_t *tf, const shoal_topo_meas_t *meas,
                              const shoal_topo_ring_hosts_t *rh)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->nranks, ncores = 0;
    uint32_t ki = 0, ke = 0;
    shoal_link_t links[SHOAL_LINK_KINDS], intra, inter;

    for (int r = 0; r < n; r++) {
        cs->socket_of[r] = tf->host_of != NULL ? tf->socket_of[r] : all[r].sum.socket;
        ki |= all[r].kinds_intra;
        ke |= all[r].kinds_inter;
        if (ncores == 0 || (all[r].sum.ncores > 0 && all[r].sum.ncores < ncores)) {
            ncores = all[r].sum.ncores;
        }
    }
    if (shoal_coll_config.ring_order == 0) {
        shoal_topo_ring_order(n, cs->host_of, cs->socket_of, cs->ring_order);
        shoal_topo_ring_hosts_apply(comm, all, tf, rh);
    }
    shoal_topo_set_ring(cs, n, comm->rank);
    shoal_topo_link_table(n, meas, all[0].tuning_loaded ? &all[0].tuning : NULL, links);
    intra = tf->have_intra ? tf->intra : shoal_topo_worst(ki, links, SHOAL_LINK_SHM);
    inter = tf->have_inter ? tf->inter : shoal_topo_worst(ke, links, SHOAL_LINK_TCP);
    shoal_topo_shape_build(&cs->shape, n, cs->host_of, cs->ring_order, &intra, &inter,
                           cs->shm_ok, ncores);
    if (all[0].tuning_loaded) {
        /* local memory rates of the tuning file (rank 0's copy: every rank builds one shape) */
        if (all[0].tuning.reduce_gbs > 0) {
            cs->shape.reduce_beta = shoal_gbs_to_beta(all[0].tuning.reduce_gbs);
        }
        if (all[0].tuning.copy_gbs > 0) {
            cs->shape.copy_beta = shoal_gbs_to_beta(all[0].tuning.copy_gbs);
        }
    }
    shoal_topo_log(comm, links, ki | ke);
}

static void shoal_topo_save_tuning(struct shoal_comm *comm, const shoal_topo_rec_t *all,
                                   const shoal_topo_meas_t *meas)
{
    const char *tpath = shoal_coll_config.tuning_file;
    shoal_tuning_t t;
    shoal_link_t links[SHOAL_LINK_KINDS];

    if (comm->rank != 0 || tpath == NULL || tpath[0] == '\0' || all[0].tuning_loaded ||
        meas == NULL) {
        return;
    }
    memset(&t, 0, sizeof(t));
    shoal_topo_link_table(comm->nranks, meas, NULL, links);
    for (int r = 0; r < comm->nranks; r++) {
        for (int ph = 0; ph < 2; ph++) {
            int k = meas[r].kind[ph];
            if (k >= 0 && k < SHOAL_LINK_KINDS) {
                t.have[k] = 1;
                t.link[k] = links[k];
            }
        }
    }
    if (shoal_tuning_save(tpath, &t) == SHOAL_OK) {
        shoal_info(TOPO, "wrote the measured link profile to %s", tpath);
    }
}

shoal_status_t shoal_topo_comm_init(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->nranks;
    shoal_topo_file_t tf;
    shoal_topo_rec_t *all = NULL;
    shoal_topo_meas_t *meas = NULL, mine = {.kind = {-1, -1}};
    shoal_topo_ring_hosts_t rh = {0};
    uint32_t known = 0;
    int ring_bad;
    shoal_status_t st;

    memset(&tf, 0, sizeof(tf));
    SHOAL_CHECK(shoal_topo_alloc(comm));
    SHOAL_CHECK(shoal_topo_hosts(comm, &tf));
    if (n == 1) {
        shoal_topo_shape_build(&cs->shape, 1, cs->host_of, cs->ring_order, &tf.intra, &tf.inter,
                               0, 1);
        shoal_topo_file_free(&tf);
        return SHOAL_OK;
    }
    ring_bad = shoal_topo_ring_hosts_load(shoal_coll_config.ring_hosts,
                                          shoal_coll_config.ring_hosts_file, &rh) != SHOAL_OK;
    all = calloc((size_t)n, sizeof(*all));
    st = all == NULL ? SHOAL_ERR_NO_MEMORY : SHOAL_OK;
    SHOAL_CHECK_GOTO(st, st, out);
    SHOAL_CHECK_GOTO(shoal_topo_round1(comm, all, &rh, ring_bad), st, out);
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        known |= all[0].tuning_loaded && all[0].tuning.have[k] ? 1u << k : 0;
    }
    if (shoal_coll_config.topo_measure) {
        meas = calloc((size_t)n, sizeof(*meas));
        st = meas == NULL ? SHOAL_ERR_NO_MEMORY : SHOAL_OK;
        SHOAL_CHECK_GOTO(st, st, out);
        SHOAL_CHECK_GOTO(shoal_topo_measure_phase(comm, 0, known, &mine), st, out);
        SHOAL_CHECK_GOTO(shoal_topo_measure_phase(comm, 1, known, &mine), st, out);
        comm->seq++;
        SHOAL_CHECK_GOTO(shoal_topo_allgather(comm, &mine, sizeof(mine), meas), st, out);
    }
    shoal_topo_finish(comm, all, &tf, meas, &rh);
    shoal_topo_save_tuning(comm, all, meas);
out:
    free(all);
    free(meas);
    shoal_topo_ring_hosts_free(&rh);
    shoal_topo_file_free(&tf);
    return st;
}

void shoal_topo_comm_fini(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    free(cs->ring_order);
    free(cs->host_of);
    free(cs->socket_of);
    cs->ring_order = cs->host_of = cs->socket_of = NULL;
}

/* Partner of rank r in recursive doubling (rd.c) at exchange mask, or in the fold (mask 0:
 * ranks below 2*extra pair up); -1 when r sits the step out. */
static int shoal_topo_rd_peer(int r, int extra, int mask)
{
    int v, vp;
    if (mask == 0) {
        return r < 2 * extra ? (r % 2 == 0 ? r + 1 : r - 1) : -1;
    }
    if (r < 2 * extra && r % 2 == 1) {
        return -1;
    }
    v = r < 2 * extra ? r / 2 : r - extra;
    vp = v ^ mask;
    return vp < extra ? vp * 2 : vp + extra;
}

/* Recursive doubling over rank order: per step, the ranks of the busiest host that talk to
 * another host share its NIC. Sums each step's latency and per-byte time (the fold counts
 * twice: there and back). */
static void shoal_topo_shape_rd(shoal_coll_shape_t *s, int n, const int *host_of)
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
            int peer = shoal_topo_rd_peer(r, extra, mask);
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

void shoal_topo_shape_build(shoal_coll_shape_t *s, int n, const int *host_of,
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
    shoal_topo_shape_rd(s, n, host_of);
}
