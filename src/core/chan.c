/*
 * Channels and the progress engine: post framed sends and receives to a peer's transport,
 * and wait for them. A waiter spins a little (yielding: ranks outnumber cores), then sleeps
 * on the transports' fds / futexes; it always honours the deadline and the abort flag.
 */
#include "core/core.h"
#include "qos/pace.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>


static void shoal_chan_req_init(struct shoal_comm *comm, shoal_tl_req_t *req, void *buf,
                                size_t len, uint32_t seq, uint32_t step, uint32_t chunk)
{
    req->next = NULL;
    req->hdr = (shoal_wire_hdr_t){.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                                  .type = SHOAL_WIRE_DATA, .comm_id = comm->comm_id,
                                  .seq = seq, .step = step, .chunk = chunk, .length = len};
    req->buf = buf;
    req->off = 0;
    req->hdr_done = 0;
    req->done = 0;
    req->status = SHOAL_OK;
    req->culprit = -1;
    req->errbuf = comm->tl_err;
    req->errlen = sizeof(comm->tl_err);
}

/* Metering: the payload of a message the transport accepted, counted once (the wire header
 * is not payload). Counted at the post, not at completion: a request may be waited for more
 * than once, a post happens once; a call that fails may have counted messages that never
 * completed (the call then counts in errors and the communicator is dead). One writer (the
 * ticket holder): a relaxed load and store, no read-modify-write. */
static inline void shoal_chan_meter(uint64_t *ctr, size_t len)
{
    if (ctr != NULL) {
        __atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + len, __ATOMIC_RELAXED);
    }
}

/* The transport blamed this rank itself (a local device or registration error, ib): the
 * sentence must not say the peer failed. An abort notice naming this rank (a peer that
 * blamed us) stays PEER_FAILED and reads as before. */
static int shoal_chan_self_fault(const struct shoal_comm *comm, const shoal_tl_req_t *req,
                                 shoal_status_t st)
{
    return req->culprit == comm->rank && st != SHOAL_ERR_PEER_FAILED;
}

/* An authentication failure that no abort notice blamed on anyone: the other end of the
 * connection could not prove the communicator's key (a process posing as the peer, another
 * job's, or a peer that holds another secret; the transport cannot tell which). The sentence
 * says what was seen, not that the peer failed, and no gone process of this host is blamed
 * for it (shoal_comm_culprit); the peers are told it is about that peer. */
static int shoal_chan_auth_fault(const shoal_tl_req_t *req, shoal_status_t st)
{
    return st == SHOAL_ERR_AUTH && req->culprit < 0;
}

static shoal_status_t shoal_chan_post_failed(struct shoal_comm *comm, int peer,
                                             const shoal_tl_req_t *req, shoal_status_t st,
                                             const char *what)
{
    if (shoal_chan_auth_fault(req, st)) {
        return shoal_comm_set_failed(comm, st, peer, "%s peer %d (%s): the connection to it "
                                     "failed authentication: %s", what, peer,
                                     shoal_comm_peer_host(comm, peer),
                                     comm->tl_err[0] != '\0' ? comm->tl_err
                                                             : shoal_strerror(st));
    }
    if (shoal_chan_self_fault(comm, req, st)) {
        return shoal_comm_set_failed(comm, st, comm->rank, "%s peer %d (%s) failed on this "
                                     "rank: %s", what, peer, shoal_comm_peer_host(comm, peer),
                                     comm->tl_err[0] != '\0' ? comm->tl_err
                                                             : shoal_strerror(st));
    }
    return shoal_comm_set_failed(comm, st, shoal_comm_culprit(comm, req->culprit, peer),
                                 "%s peer %d (%s) failed: %s", what, peer,
                                 shoal_comm_peer_host(comm, peer),
                                 comm->tl_err[0] != '\0' ? comm->tl_err : shoal_strerror(st));
}

/* A send counted in ctr (NULL: not metered). */
static inline shoal_status_t shoal_chan_isend_ctr(struct shoal_comm *comm, int peer,
                                                  const void *buf, size_t len, uint32_t seq,
                                                  uint32_t step, uint32_t chunk,
                                                  shoal_tl_req_t *req, uint64_t *ctr)
{
    shoal_chan_t *ch = &comm->chans[peer];
    shoal_status_t st;
    if (SHOAL_UNLIKELY(comm->pace != NULL)) {
        /* QoS pacing (src/qos/pace.h) before the transport sees the message. */
        st = shoal_qos_pace_comm_take(comm, len);
        if (st != SHOAL_OK) {
            return st;
        }
    }
    shoal_chan_req_init(comm, req, (void *)buf, len, seq, step, chunk);
    st = ch->tl->ops->isend(ch->ep, req);
    if (SHOAL_UNLIKELY(st != SHOAL_OK)) {
        return shoal_chan_post_failed(comm, peer, req, st, "send to");
    }
    shoal_chan_meter(ctr, len);
    return SHOAL_OK;
}

shoal_status_t shoal_chan_isend(struct shoal_comm *comm, int peer, const void *buf, size_t len,
                                uint32_t seq, uint32_t step, uint32_t chunk, shoal_tl_req_t *req)
{
    return shoal_chan_isend_ctr(comm, peer, buf, len, seq, step, chunk, req,
                                comm->chans[peer].meter_sent);
}

static inline shoal_status_t shoal_chan_irecv_ctr(struct shoal_comm *comm, int peer, void *buf,
                                                  size_t len, uint32_t seq, uint32_t step,
                                                  uint32_t chunk, shoal_tl_req_t *req,
                                                  uint64_t *ctr)
{
    shoal_chan_t *ch = &comm->chans[peer];
    shoal_status_t st;
    shoal_chan_req_init(comm, req, buf, len, seq, step, chunk);
    st = ch->tl->ops->irecv(ch->ep, req);
    if (SHOAL_UNLIKELY(st != SHOAL_OK)) {
        return shoal_chan_post_failed(comm, peer, req, st, "receive from");
    }
    shoal_chan_meter(ctr, len);
    return SHOAL_OK;
}

shoal_status_t shoal_chan_irecv(struct shoal_comm *comm, int peer, void *buf, size_t len,
                                uint32_t seq, uint32_t step, uint32_t chunk, shoal_tl_req_t *req)
{
    return shoal_chan_irecv_ctr(comm, peer, buf, len, seq, step, chunk, req,
                                comm->chans[peer].meter_recv);
}

int shoal_chan_progress(struct shoal_comm *comm)
{
    int n = 0;
    for (int t = 0; t < comm->ntls; t++) {
        if (comm->tls[t].ctx != NULL) {
            n += comm->tls[t].ops->progress(comm->tls[t].ctx);
        }
    }
    return n;
}

/* Sleep up to us microseconds or until a transport or abort wakes us. */
static void shoal_chan_sleep(struct shoal_comm *comm, int us)
{
    struct pollfd pfds[SHOAL_TL_MAX + 1];
    shoal_tl_inst_t *waiter = NULL;
    nfds_t n = 0;

    pfds[n++] = (struct pollfd){.fd = comm->abort_efd, .events = POLLIN};
    for (int t = 0; t < comm->ntls; t++) {
        shoal_tl_inst_t *tl = &comm->tls[t];
        int fd;
        if (tl->ctx == NULL) {
            continue;
        }
        fd = tl->ops->wait_fd != NULL ? tl->ops->wait_fd(tl->ctx) : -1;
        if (fd >= 0) {
            pfds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
        } else if (tl->ops->wait != NULL) {
            waiter = tl;
        }
    }
    if (waiter != NULL && n == 1) {
        waiter->ops->wait(waiter->ctx, us); /* abort rings our own doorbell */
    } else if (waiter != NULL) {
        /* Both kinds: look at the fds, then doze on the futex for a fraction. */
        if (poll(pfds, n, 0) == 0) {
            waiter->ops->wait(waiter->ctx, SHOAL_MAX(us / 8, 50));
        }
    } else {
        (void)poll(pfds, n, SHOAL_MAX(us / 1000, 1));
    }
}

/* Adaptive spinning (SHOAL_SPIN_ADAPT). Spinning pays when the answer comes within about
 * what a sleep and its wake-up cost; a rank whose waits last hundreds of microseconds or more
 * (a bulk transfer over a slow or shaped link: each chunk's completion) gains nothing from
 * its polls, a system call or two each over tcp, and takes CPU from the processes with work
 * to do, among them the peers it waits for (4 MiB AllReduces of 2 tenants over a 1 Gbit/s
 * link on 2 vCPUs: the ranks polled about all of the time, 1 M epoll_wait calls a second).
 * So a wait spins at most SHOAL_SPIN_LONG_NS (it would otherwise spin SHOAL_SPIN_PAUSE and
 * SHOAL_SPIN_COUNT polls: milliseconds over tcp), then sleeps on the transports (woken by
 * their fds or futex); and each communicator keeps a moving share of its waits that, once
 * past SHOAL_SPIN_SHORT_NS, went on past LONG_NS: while that share is high (from a quarter
 * on, until it falls under a sixteenth: a rank that sleeps leaves its peers the CPU, so its
 * waits get shorter, and one threshold kept the share just below it), a wait sleeps from
 * SHORT_NS on. Waits that end before SHORT_NS (small messages over loopback or shm) neither
 * count nor change: their latency is unchanged. The clock is read every 16th idle call only,
 * from the 16th on: a wait shorter than that reads none. */
#define SHOAL_SPIN_SHORT_NS (20ull * 1000)
#define SHOAL_SPIN_LONG_NS (200ull * 1000)
#define SHOAL_SPIN_SCORE_MAX 256u

static void shoal_chan_spin_adapt(struct shoal_comm *comm, unsigned *spins_p)
{
    unsigned spins = *spins_p, sleep_at = SHOAL_MAX(comm->pause_spins, comm->spin_count);
    uint64_t now, d;
    if (spins == 1) { /* a new wait: the previous one, if past SHORT_NS only, was short */
        if (comm->wait_phase == 2) {
            comm->wait_score -= comm->wait_score / 8;
        }
        comm->wait_phase = 0;
        return;
    }
    if ((spins & 15) != 0) {
        return;
    }
    now = shoal_time_ns();
    if (comm->wait_phase == 0) {
        comm->wait_t0_ns = now;
        comm->wait_phase = 1;
        return;
    }
    d = now - comm->wait_t0_ns;
    if (comm->wait_phase == 1 && d >= SHOAL_SPIN_SHORT_NS) {
        comm->wait_phase = 2;
        if (comm->wait_score >= SHOAL_SPIN_SCORE_MAX / 4) {
            comm->wait_short = 1;
        } else if (comm->wait_score < SHOAL_SPIN_SCORE_MAX / 16) {
            comm->wait_short = 0;
        }
        if (comm->wait_short && spins < sleep_at) {
            *spins_p = sleep_at; /* sleep from now on */
        }
    }
    if (comm->wait_phase == 2 && d >= SHOAL_SPIN_LONG_NS) {
        comm->wait_phase = 3;
        comm->wait_score += (SHOAL_SPIN_SCORE_MAX - comm->wait_score) / 8;
        if (spins < sleep_at) {
            *spins_p = sleep_at; /* long already: likely much longer (see above) */
        }
    }
}

shoal_status_t shoal_chan_idle(struct shoal_comm *comm, unsigned *spins_p, uint64_t deadline_ns,
                               const char *what)
{
    unsigned spins = ++*spins_p;
    if (comm->spin_adapt) {
        shoal_chan_spin_adapt(comm, spins_p);
        spins = *spins_p;
    }
    shoal_status_t fatal = shoal_comm_fatal(comm);
    if (SHOAL_UNLIKELY(fatal != SHOAL_OK)) {
        return fatal;
    }
    if (SHOAL_UNLIKELY(shoal_comm_aborted(comm))) {
        return shoal_comm_set_failed(comm, SHOAL_ERR_ABORTED, comm->rank,
                                     "aborted by the application while %s", what);
    }
    if (SHOAL_UNLIKELY(shoal_proxy_stopping(comm))) {
        /* the proxy runs a call whole and the destroy waits for it: fail it as the proxy
         * fails its plans in flight (proxy.c) */
        return shoal_comm_set_failed(comm, SHOAL_ERR_ABORTED, comm->rank,
                                     "communicator destroyed with collectives in flight");
    }
    if (SHOAL_UNLIKELY(shoal_comm_dead_peer(comm) >= 0)) {
        int r = shoal_comm_dead_peer(comm);
        if (!comm->dead_grace) {
            /* The caller progresses once more before it comes back here: a peer that wrote its
             * last message and exited (a job's end) completes this call instead of failing it;
             * everything it wrote is visible now that its process is gone. */
            comm->dead_grace = 1;
            return SHOAL_OK;
        }
        return shoal_comm_set_failed(comm, SHOAL_ERR_PEER_FAILED, r,
                                     "peer %d (%s) died (its process is gone) while %s", r,
                                     shoal_comm_peer_host(comm, r), what);
    }
    if (spins < comm->pause_spins) {
        /* A few microseconds of pure polling first: a yield is a system call, and on an idle
         * core the answer usually arrives within that time. */
        shoal_cpu_relax();
        return SHOAL_OK;
    }
    if (spins < comm->spin_count) {
        if ((spins & 255) == 0 && shoal_deadline_passed(deadline_ns)) {
            goto timeout;
        }
        sched_yield();
        return SHOAL_OK;
    }
    if (shoal_deadline_passed(deadline_ns)) {
        goto timeout;
    }
    shoal_chan_sleep(comm, 1000);
    return SHOAL_OK;
timeout:
    return shoal_comm_set_failed(comm, SHOAL_ERR_TIMEOUT, -1, "timed out after %d ms %s",
                                 comm->timeout_ms, what);
}

static shoal_status_t shoal_chan_req_failed(struct shoal_comm *comm, shoal_tl_req_t *req,
                                            int peer)
{
    const char *why = comm->tl_err[0] != '\0' ? comm->tl_err : shoal_strerror(req->status);
    int culprit = shoal_comm_culprit(comm, req->culprit, peer);
    if (shoal_chan_auth_fault(req, req->status)) {
        return shoal_comm_set_failed(comm, req->status, peer, "the connection to peer %d (%s) "
                                     "failed authentication: %s", peer,
                                     shoal_comm_peer_host(comm, peer), why);
    }
    if (shoal_chan_self_fault(comm, req, req->status)) {
        return shoal_comm_set_failed(comm, req->status, culprit, "the connection to peer %d "
                                     "(%s) failed on this rank: %s", peer,
                                     shoal_comm_peer_host(comm, peer), why);
    }
    if (culprit != peer && req->culprit < 0) { /* not blamed by a notice: a gone process */
        return shoal_comm_set_failed(comm, req->status, culprit,
                                     "peer %d (%s) failed: %s; the failure started at rank %d "
                                     "(%s), whose process is gone", peer,
                                     shoal_comm_peer_host(comm, peer), why, culprit,
                                     shoal_comm_peer_host(comm, culprit));
    }
    return shoal_comm_set_failed(comm, req->status, culprit, "peer %d (%s) failed: %s", peer,
                                 shoal_comm_peer_host(comm, peer), why);
}

/* Scans reqs: returns the number still pending, or -1 with *failed_p set on an error. */
static int shoal_chan_scan(shoal_tl_req_t **reqs, int n, int *failed_p, int *first_pending_p,
                           int *live_p)
{
    int pending = 0;
    *first_pending_p = -1;
    *live_p = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i] == NULL) {
            continue;
        }
        ++*live_p;
        if (!__atomic_load_n(&reqs[i]->done, __ATOMIC_ACQUIRE)) {
            if (pending++ == 0) {
                *first_pending_p = i;
            }
        } else if (reqs[i]->status != SHOAL_OK) {
            *failed_p = i;
            return -1;
        }
    }
    return pending;
}

static shoal_status_t shoal_chan_wait(struct shoal_comm *comm, shoal_tl_req_t **reqs,
                                      const int *peers, int n, int want_all)
{
    uint64_t deadline = shoal_deadline_ns(comm->timeout_ms);
    unsigned spins = 0;
    int last_pending = n + 1;
    for (;;) {
        int failed = -1, first = -1, live;
        int pending = shoal_chan_scan(reqs, n, &failed, &first, &live);
        char what[96];
        shoal_status_t st;

        if (pending < 0) {
            return shoal_chan_req_failed(comm, reqs[failed], peers[failed]);
        }
        if (pending == 0 || (!want_all && pending < live)) {
            return SHOAL_OK;
        }
        /* The timeout runs from the last request done, as a collective's from its last
         * progress: a group of many messages that arrive one by one, each in time, failed
         * once all of them together took longer. */
        if (pending < last_pending) {
            last_pending = pending;
            deadline = shoal_deadline_ns(comm->timeout_ms);
        }
        if (shoal_chan_progress(comm) > 0) {
            spins = 0;
            continue;
        }
        if (!shoal_chan_idle_may_fail(comm, spins, deadline)) {
            st = shoal_chan_idle(comm, &spins, deadline, "waiting");
        } else {
            snprintf(what, sizeof(what), "waiting for peer %d (%s)", peers[first],
                     shoal_comm_peer_host(comm, peers[first]));
            st = shoal_chan_idle(comm, &spins, deadline, what);
        }
        if (st != SHOAL_OK) {
            return st;
        }
    }
}

shoal_status_t shoal_chan_test(struct shoal_comm *comm, shoal_tl_req_t **reqs, const int *peers,
                               int n, int *done_p)
{
    int failed = -1, first, live;
    int pending = shoal_chan_scan(reqs, n, &failed, &first, &live);
    if (pending < 0) {
        *done_p = 0;
        return shoal_chan_req_failed(comm, reqs[failed], peers[failed]);
    }
    *done_p = pending == 0;
    return SHOAL_OK;
}

shoal_status_t shoal_chan_waitall(struct shoal_comm *comm, shoal_tl_req_t **reqs,
                                  const int *peers, int n)
{
    return shoal_chan_wait(comm, reqs, peers, n, 1);
}

static shoal_status_t shoal_chan_sendrecv_m(struct shoal_comm *comm, int to, const void *sbuf,
                                            int from, void *rbuf, size_t len, uint32_t seq,
                                            uint32_t step, int metered)
{
    shoal_tl_req_t sreq, rreq;
    shoal_tl_req_t *reqs[2] = {NULL, NULL};
    int peers[2] = {from, to};
    if (from >= 0) {
        SHOAL_CHECK(shoal_chan_irecv_ctr(comm, from, rbuf, len, seq, step, 0, &rreq,
                                         metered ? comm->chans[from].meter_recv : NULL));
        reqs[0] = &rreq;
    }
    if (to >= 0) {
        SHOAL_CHECK(shoal_chan_isend_ctr(comm, to, sbuf, len, seq, step, 0, &sreq,
                                         metered ? comm->chans[to].meter_sent : NULL));
        reqs[1] = &sreq;
    }
    return shoal_chan_waitall(comm, reqs, peers, 2);
}

shoal_status_t shoal_chan_sendrecv(struct shoal_comm *comm, int to, const void *sbuf,
                                   int from, void *rbuf, size_t len, uint32_t seq,
                                   uint32_t step)
{
    return shoal_chan_sendrecv_m(comm, to, sbuf, from, rbuf, len, seq, step, 1);
}

shoal_status_t shoal_chan_sendrecv_ctl(struct shoal_comm *comm, int to, const void *sbuf,
                                       int from, void *rbuf, size_t len, uint32_t seq,
                                       uint32_t step)
{
    return shoal_chan_sendrecv_m(comm, to, sbuf, from, rbuf, len, seq, step, 0);
}

shoal_status_t shoal_chan_bcast_small(struct shoal_comm *comm, void *buf, size_t len,
                                      uint32_t seq, uint32_t step)
{
    int n = comm->nranks, r = comm->rank;

    for (int m = 1; m < n; m *= 2) { /* round m: ranks below m send to rank + m */
        if (r < m && r + m < n) {
            SHOAL_CHECK(shoal_chan_sendrecv(comm, r + m, buf, -1, NULL, len, seq, step));
        } else if (r >= m && r < 2 * m) {
            SHOAL_CHECK(shoal_chan_sendrecv(comm, -1, NULL, r - m, buf, len, seq, step));
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_chan_waitany(struct shoal_comm *comm, shoal_tl_req_t **reqs,
                                  const int *peers, int n)
{
    return shoal_chan_wait(comm, reqs, peers, n, 0);
}
