/*
 * Topology of a communicator, built at init over its own channels (core's primitives: topo
 * calls nothing above it) into its own result, shoal_topo_comm_t (topo.h), which the
 * communicator owns and the layers above read:
 *  1. every rank discovers its host (cached per process) and lists the link kinds of its
 *     channels to ranks of its own host and of other hosts; one ring allgather in rank order
 *     spreads these records (rank 0's tuning file rides along, so all use the same one);
 *  2. ranks are grouped by host (host id, or virtual hosts from SHOAL_TOPO_FILE) and socket,
 *     and the ring order is computed (the same on every rank);
 *  3. unless every link kind is known, neighbour pairs (0-1, 2-3, ... then 1-2, 3-4, ...)
 *     time a few ping-pongs, and a second allgather spreads the results;
 *  4. the links of the cost model (the slowest kind within and between hosts) and the
 *     local memory rates of rank 0's tuning file are derived, identically on every rank.
 */
#include "topo/topo.h"

#include "core/core.h"

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
    int32_t tuning_loaded; /* rank 0: shoal_tuning_load's answer (1: the tuning file below is
                            * valid, 0: there is none, negative: it is unusable) */
    int32_t ring_bad;      /* this rank's ring host list is malformed */
    uint64_t ring_hash;    /* fingerprint of its ring host list, 0 none */
    uint64_t layout_hash;  /* fingerprint of its SHOAL_RING_ORDER, SHOAL_TOPO_MEASURE and
                            * SHOAL_TOPO_FILE (shoal_topo_layout_hash) */
    char host[SHOAL_TOPO_HOSTNAME_MAX]; /* short host name */
    shoal_tuning_t tuning;
} shoal_topo_rec_t;

/* Round 2 record: what this rank measured as the leader of a pair (kind -1: nothing; tried:
 * the kind the pair timed, believable or not, -1 none). */
typedef struct {
    int32_t kind[2];
    int32_t tried[2];
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
static shoal_status_t shoal_topo_allgather(struct shoal_comm *comm, const shoal_topo_comm_t *tc,
                                           const void *mine, size_t len, void *all)
{
    int n = comm->nranks, pos = tc->ring_pos;
    uint8_t *rbuf = all;
    uint32_t seq = comm->seq++;

    memmove(rbuf + (size_t)comm->rank * len, mine, len);
    for (int j = 0; j < n - 1; j++) {
        int sblk = tc->ring_order[((pos - j) % n + n) % n];
        int rblk = tc->ring_order[((pos - j - 1) % n + n) % n];
        SHOAL_CHECK(shoal_chan_sendrecv(comm, tc->ring_next, rbuf + (size_t)sblk * len,
                                        tc->ring_prev, rbuf + (size_t)rblk * len, len, seq,
                                        (uint32_t)j));
    }
    return SHOAL_OK;
}

static void shoal_topo_set_ring(shoal_topo_comm_t *tc, int n, int rank)
{
    for (int i = 0; i < n; i++) {
        if (tc->ring_order[i] == rank) {
            tc->ring_pos = i;
        }
    }
    tc->ring_next = tc->ring_order[(tc->ring_pos + 1) % n];
    tc->ring_prev = tc->ring_order[(tc->ring_pos + n - 1) % n];
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
static shoal_status_t shoal_topo_hosts(struct shoal_comm *comm, shoal_topo_comm_t *tc,
                                      shoal_topo_file_t *tf)
{
    int n = comm->nranks;
    const char *path = shoal_topo_config.topo_file;

    if (path != NULL && path[0] != '\0') {
        SHOAL_CHECK(shoal_topo_file_load(path, n, tf));
        memcpy(tc->host_of, tf->host_of, sizeof(int) * (size_t)n);
        tc->nhosts = 0;
        /* Renumber by first appearance, like host ids. */
        uint64_t *ids = malloc(sizeof(uint64_t) * (size_t)n);
        if (ids == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
        for (int r = 0; r < n; r++) {
            ids[r] = (uint64_t)tf->host_of[r];
        }
        tc->nhosts = shoal_topo_host_index(n, ids, tc->host_of);
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
    tc->nhosts = shoal_topo_host_index(n, ids, tc->host_of);
    free(ids);
    return SHOAL_OK;
}

/* Leader side times round trips of len bytes; returns the best one-way time in us. */
static shoal_status_t shoal_topo_pingpong(struct shoal_comm *comm, int peer, int lead,
                                          uint8_t *buf, size_t len, int iters, uint32_t *step,
                                          double *oneway_p)
{
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
static shoal_status_t shoal_topo_burst(struct shoal_comm *comm, int peer, int lead, uint8_t *buf,
                                       uint32_t *step, double *send_p, double *recv_p)
{
    shoal_tl_req_t reqs[SHOAL_TOPO_BURST], *rp[SHOAL_TOPO_BURST];
    int peers[SHOAL_TOPO_BURST];
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

int shoal_link_meas_plausible(double small_us, double large_us, size_t large_bytes)
{
    /* us per byte: 1e-6 is 1 TB/s */
    return large_bytes > 0 && large_us - small_us >= 1e-6 * (double)large_bytes;
}

/* Phase ph (0: pairs 0-1, 2-3...; 1: pairs 1-2, 3-4...) for kinds not in known; buf holds
 * SHOAL_TOPO_PP_LARGE bytes. */
static shoal_status_t shoal_topo_measure_phase(struct shoal_comm *comm, int ph, uint32_t known,
                                               uint8_t *buf, shoal_topo_meas_t *m)
{
    int rank = comm->rank, peer = ((rank + ph) % 2 == 0) ? rank + 1 : rank - 1;
    size_t large = SHOAL_TOPO_PP_LARGE;
    uint32_t step = SHOAL_TOPO_PP_STEP;
    double small_us, large_us, send_us = 0, recv_us = 0, peer_recv_us = 0;
    int kind;

    m->kind[ph] = -1;
    m->tried[ph] = -1;
    if (peer < 0 || peer >= comm->nranks) {
        return SHOAL_OK;
    }
    kind = shoal_topo_chan_kind(comm, peer);
    if ((known & (1u << kind)) != 0) {
        return SHOAL_OK; /* both sides see the same kind and the same known mask */
    }
    SHOAL_CHECK(shoal_topo_pingpong(comm, peer, rank < peer, buf, 8, SHOAL_TOPO_PP_SMALL_ITERS,
                                    &step, &small_us));
    SHOAL_CHECK(shoal_topo_pingpong(comm, peer, rank < peer, buf, large,
                                    SHOAL_TOPO_PP_LARGE_ITERS, &step, &large_us));
    SHOAL_CHECK(shoal_topo_burst(comm, peer, rank < peer, buf, &step, &send_us, &recv_us));
    /* the receiver's figure travels to the leader, which reports the pair */
    if (rank < peer) {
        SHOAL_CHECK(shoal_topo_recv(comm, peer, &peer_recv_us, sizeof(double), comm->seq,
                                    step));
        m->tried[ph] = kind;
        if (!shoal_link_meas_plausible(small_us, large_us, large)) {
            /* not reported (nor saved): the tuning file's or the default figures stand */
            shoal_info(TOPO, "rank %d: the %s link to rank %d measured %.2f us for 8 B and "
                       "%.2f us for %zu B: not believable (a loaded machine?), not used",
                       rank, shoal_link_kind_names[kind], peer, small_us, large_us, large);
            return SHOAL_OK;
        }
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

static void shoal_topo_log(struct shoal_comm *comm, const shoal_topo_comm_t *tc,
                           const shoal_link_t *links, uint32_t used)
{
    if (comm->rank != 0 || !shoal_log_enabled(SHOAL_LOG_INFO, TOPO)) {
        return;
    }
    shoal_info(TOPO, "%d ranks on %d host(s), ring order %s, ring crossings per host %d",
               comm->nranks, tc->nhosts, shoal_topo_config.ring_order == 0 ? "topo" : "rank",
               tc->ring_share);
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        if ((used & (1u << k)) != 0) {
            shoal_info(TOPO, "link %s: %.2f us, %.3f GB/s, send %.2f us, recv %.2f us",
                       shoal_link_kind_names[k], links[k].alpha_us,
                       shoal_beta_to_gbs(links[k].beta_us), links[k].send_us, links[k].recv_us);
        }
    }
    if (tc->reduce_gbs > 0 || tc->copy_gbs > 0) {
        shoal_info(TOPO, "memory: reduce %.2f GB/s, copy %.2f GB/s (tuning file; 0: not given, "
                   "the cost model keeps its own)", tc->reduce_gbs, tc->copy_gbs);
    }
}

static shoal_status_t shoal_topo_alloc(struct shoal_comm *comm, shoal_topo_comm_t *tc)
{
    int n = comm->nranks;
    tc->nranks = n;
    tc->ring_order = malloc(sizeof(int) * (size_t)n);
    tc->host_of = calloc((size_t)n, sizeof(int));
    tc->socket_of = calloc((size_t)n, sizeof(int));
    if (tc->ring_order == NULL || tc->host_of == NULL || tc->socket_of == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int i = 0; i < n; i++) {
        tc->ring_order[i] = i;
    }
    shoal_topo_set_ring(tc, n, comm->rank);
    return SHOAL_OK;
}

/* The settings each rank applies on its own that must be the same on every rank: the ring
 * order, whether pairs measure (both sides of a pair ping-pong), and the topology file as
 * parsed (the hosts, sockets and links). */
static uint64_t shoal_topo_layout_hash(int n, const shoal_topo_file_t *tf)
{
    int32_t set[2] = {shoal_topo_config.ring_order, shoal_topo_config.topo_measure};
    int32_t have[2] = {tf->have_intra, tf->have_inter};
    uint64_t h = shoal_hash64(set, sizeof(set), 0x544f504fULL);

    if (tf->host_of != NULL) {
        h = shoal_hash64(tf->host_of, sizeof(int) * (size_t)n, h);
        h = shoal_hash64(tf->socket_of, sizeof(int) * (size_t)n, h);
        h = shoal_hash64(&tf->intra, sizeof(tf->intra), h);
        h = shoal_hash64(&tf->inter, sizeof(tf->inter), h);
        h = shoal_hash64(have, sizeof(have), h);
    }
    return h;
}

/* Round 1: my record, everyone's records. */
static shoal_status_t shoal_topo_round1(struct shoal_comm *comm, const shoal_topo_comm_t *tc,
                                        shoal_topo_rec_t *all, const shoal_topo_file_t *tf,
                                        const shoal_topo_ring_hosts_t *rh, int ring_bad)
{
    shoal_topo_rec_t *me = calloc(1, sizeof(*me));
    const char *tpath = shoal_topo_config.tuning_file;
    shoal_status_t st;

    if (me == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    shoal_topo_discover(shoal_topo_config.topo_discovery, &me->sum);
    for (int p = 0; p < comm->nranks; p++) {
        if (p != comm->rank) {
            uint32_t bit = 1u << shoal_topo_chan_kind(comm, p);
            if (tc->host_of[p] == tc->host_of[comm->rank]) {
                me->kinds_intra |= bit;
            } else {
                me->kinds_inter |= bit;
            }
        }
    }
    if (comm->rank == 0 && tpath != NULL && tpath[0] != '\0') {
        me->tuning_loaded = shoal_tuning_load(tpath, &me->tuning);
    }
    me->ring_bad = ring_bad;
    me->ring_hash = rh->n > 0 ? rh->hash : 0;
    me->layout_hash = shoal_topo_layout_hash(comm->nranks, tf);
    /* the name SHOAL_RING_HOSTS lists: SHOAL_HOSTID where the provider set one */
    snprintf(me->host, sizeof(me->host), "%s",
             shoal_util_config.hostid != NULL && shoal_util_config.hostid[0] != '\0'
                 ? shoal_util_config.hostid : shoal_hostname());
    st = shoal_topo_allgather(comm, tc, me, sizeof(*me), all);
    free(me);
    return st;
}

/* The ring order a placement asked for, where every rank was given the same valid list that
 * names every rank's host (SHOAL_TOPO_FILE's virtual hosts are "host<N>"). */
static void shoal_topo_ring_hosts_apply(struct shoal_comm *comm, shoal_topo_comm_t *tc,
                                        const shoal_topo_rec_t *all, const shoal_topo_file_t *tf,
                                        const shoal_topo_ring_hosts_t *rh)
{
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
    rc = shoal_topo_ring_order_hosts(n, tc->socket_of, names, rh, tc->ring_order);
    if (rc > 0 && comm->rank == 0) {
        shoal_warn(TOPO, "SHOAL_RING_HOSTS: rank %d's host %s is not in the list (%d hosts): "
                   "the ring keeps its usual order", rc - 1, names[rc - 1], rh->n);
    } else if (rc == 0 && comm->rank == 0 && shoal_log_enabled(SHOAL_LOG_INFO, TOPO)) {
        char buf[128];
        size_t len = 0;
        for (int i = 0; i < n && len + 12 < sizeof(buf); i++) {
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, " %d", tc->ring_order[i]);
        }
        shoal_info(TOPO, "ring order from SHOAL_RING_HOSTS (%d hosts listed), first host %s, "
                   "ranks%s%s", rh->n, names[tc->ring_order[0]], buf, n > 10 ? " ..." : "");
    }
    free(names);
    free(virt);
}

/* Rounds 1 and 2 done: grouping, order, links. */
static void shoal_topo_finish(struct shoal_comm *comm, shoal_topo_comm_t *tc,
                              const shoal_topo_rec_t *all, const shoal_topo_file_t *tf,
                              const shoal_topo_meas_t *meas, const shoal_topo_ring_hosts_t *rh)
{
    int n = comm->nranks, ncores = 0;
    uint32_t ki = 0, ke = 0;
    shoal_link_t links[SHOAL_LINK_KINDS];

    for (int r = 0; r < n; r++) {
        tc->socket_of[r] = tf->host_of != NULL ? tf->socket_of[r] : all[r].sum.socket;
        ki |= all[r].kinds_intra;
        ke |= all[r].kinds_inter;
        if (ncores == 0 || (all[r].sum.ncores > 0 && all[r].sum.ncores < ncores)) {
            ncores = all[r].sum.ncores;
        }
    }
    if (shoal_topo_config.ring_order == 0) {
        shoal_topo_ring_order(n, tc->host_of, tc->socket_of, tc->ring_order);
        shoal_topo_ring_hosts_apply(comm, tc, all, tf, rh);
    }
    shoal_topo_set_ring(tc, n, comm->rank);
    tc->ring_share = shoal_topo_ring_share(n, tc->host_of, tc->ring_order);
    tc->ncores = ncores;
    shoal_topo_link_table(n, meas, all[0].tuning_loaded == 1 ? &all[0].tuning : NULL, links);
    tc->intra = shoal_topo_file_link_over(shoal_topo_worst(ki, links, SHOAL_LINK_SHM),
                                          &tf->intra, tf->have_intra);
    tc->inter = shoal_topo_file_link_over(shoal_topo_worst(ke, links, SHOAL_LINK_TCP),
                                          &tf->inter, tf->have_inter);
    if (all[0].tuning_loaded == 1) {
        /* local memory rates of the tuning file (rank 0's copy: the same on every rank) */
        tc->reduce_gbs = all[0].tuning.reduce_gbs;
        tc->copy_gbs = all[0].tuning.copy_gbs;
    }
    shoal_topo_log(comm, tc, links, ki | ke);
}

int shoal_topo_profile(uint32_t measured, uint32_t tried, const shoal_link_t *links,
                       shoal_tuning_t *t)
{
    memset(t, 0, sizeof(*t));
    if (measured == 0 || (tried & ~measured) != 0) {
        return 0;
    }
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        if ((measured & (1u << k)) != 0) {
            t->have[k] = 1;
            t->link[k] = links[k];
        }
    }
    return 1;
}

static void shoal_topo_save_tuning(struct shoal_comm *comm, const shoal_topo_rec_t *all,
                                   const shoal_topo_meas_t *meas)
{
    const char *tpath = shoal_topo_config.tuning_file;
    shoal_tuning_t t;
    shoal_link_t links[SHOAL_LINK_KINDS];
    uint32_t measured = 0, tried = 0;

    /* Only where there is no file: one that is there but unusable (a typo, too large) was
     * reported at load and is the user's to fix; writing over it would lose it. */
    if (comm->rank != 0 || tpath == NULL || tpath[0] == '\0' || all[0].tuning_loaded != 0 ||
        meas == NULL) {
        return;
    }
    shoal_topo_link_table(comm->nranks, meas, NULL, links);
    for (int r = 0; r < comm->nranks; r++) {
        for (int ph = 0; ph < 2; ph++) {
            int k = meas[r].kind[ph], kt = meas[r].tried[ph];
            measured |= k >= 0 && k < SHOAL_LINK_KINDS ? 1u << k : 0;
            tried |= kt >= 0 && kt < SHOAL_LINK_KINDS ? 1u << kt : 0;
        }
    }
    if (!shoal_topo_profile(measured, tried, links, &t)) {
        shoal_info(TOPO, "%s not written: a link kind was not measured believably (a loaded "
                   "machine?); the next job measures again", tpath);
        return;
    }
    if (shoal_tuning_save(tpath, &t) == SHOAL_OK) {
        shoal_info(TOPO, "wrote the measured link profile to %s", tpath);
    }
}

/* Rounds 1 and 2 over the communicator, into tc (its arrays allocated). */
static shoal_status_t shoal_topo_build(struct shoal_comm *comm, shoal_topo_comm_t *tc)
{
    int n = comm->nranks;
    shoal_topo_file_t tf;
    shoal_topo_rec_t *all = NULL;
    shoal_topo_meas_t *meas = NULL, mine = {.kind = {-1, -1}, .tried = {-1, -1}};
    shoal_topo_ring_hosts_t rh = {0};
    uint8_t *buf = NULL;
    uint32_t known = 0;
    int ring_bad;
    shoal_status_t st;

    memset(&tf, 0, sizeof(tf));
    SHOAL_CHECK(shoal_topo_alloc(comm, tc));
    SHOAL_CHECK(shoal_topo_hosts(comm, tc, &tf));
    if (n == 1) {
        tc->ncores = 1;
        tc->intra = tf.intra; /* zero unless the file gives them: the cost model's defaults */
        tc->inter = tf.inter;
        shoal_topo_file_free(&tf);
        return SHOAL_OK;
    }
    ring_bad = shoal_topo_ring_hosts_load(shoal_topo_config.ring_hosts,
                                          shoal_topo_config.ring_hosts_file, &rh) != SHOAL_OK;
    all = calloc((size_t)n, sizeof(*all));
    st = all == NULL ? SHOAL_ERR_NO_MEMORY : SHOAL_OK;
    SHOAL_CHECK_GOTO(st, st, out);
    SHOAL_CHECK_GOTO(shoal_topo_round1(comm, tc, all, &tf, &rh, ring_bad), st, out);
    for (int r = 0; r < n; r++) {
        all[r].host[sizeof(all[r].host) - 1] = '\0'; /* another rank's: used as a string */
    }
    /* Every rank decides on the same records: all fail, at once. A rank of another ring order
     * or topology file built another ring (and host grouping, and cost model), and the first
     * collective waited for a peer that sent elsewhere until SHOAL_TIMEOUT_MS, which then
     * blamed that peer; one that measures alone waited for its pair's ping-pong. */
    for (int r = 1; r < n; r++) {
        if (all[r].layout_hash != all[0].layout_hash) {
            shoal_error(TOPO, "rank %d (%s) has another SHOAL_RING_ORDER, SHOAL_TOPO_MEASURE or "
                        "SHOAL_TOPO_FILE than rank 0 (%s): they must be the same on every rank",
                        r, shoal_comm_peer_host(comm, r), shoal_comm_peer_host(comm, 0));
            st = SHOAL_ERR_INVALID_ARG;
            goto out;
        }
    }
    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        known |= all[0].tuning_loaded == 1 && all[0].tuning.have[k] ? 1u << k : 0;
    }
    if (shoal_topo_config.topo_measure) {
        meas = calloc((size_t)n, sizeof(*meas));
        buf = aligned_alloc(4096, SHOAL_TOPO_PP_LARGE);
        st = meas == NULL || buf == NULL ? SHOAL_ERR_NO_MEMORY : SHOAL_OK;
        SHOAL_CHECK_GOTO(st, st, out);
        memset(buf, 0, SHOAL_TOPO_PP_LARGE); /* faulted in before the timed round trips */
        SHOAL_CHECK_GOTO(shoal_topo_measure_phase(comm, 0, known, buf, &mine), st, out);
        SHOAL_CHECK_GOTO(shoal_topo_measure_phase(comm, 1, known, buf, &mine), st, out);
        comm->seq++;
        SHOAL_CHECK_GOTO(shoal_topo_allgather(comm, tc, &mine, sizeof(mine), meas), st, out);
    }
    shoal_topo_finish(comm, tc, all, &tf, meas, &rh);
    shoal_topo_save_tuning(comm, all, meas);
out:
    free(all);
    free(meas);
    free(buf);
    shoal_topo_ring_hosts_free(&rh);
    shoal_topo_file_free(&tf);
    return st;
}

shoal_status_t shoal_topo_comm_init(struct shoal_comm *comm, shoal_topo_comm_t **tc_p)
{
    shoal_topo_comm_t *tc = calloc(1, sizeof(*tc));
    shoal_status_t st;

    *tc_p = NULL;
    if (tc == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    st = shoal_topo_build(comm, tc);
    if (st != SHOAL_OK) {
        shoal_topo_comm_free(tc);
        return st;
    }
    *tc_p = tc;
    return SHOAL_OK;
}

void shoal_topo_comm_free(shoal_topo_comm_t *tc)
{
    if (tc != NULL) {
        free(tc->ring_order);
        free(tc->host_of);
        free(tc->socket_of);
        free(tc);
    }
}
