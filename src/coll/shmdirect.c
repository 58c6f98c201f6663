/*
 * Intra-node AllReduce straight through the shared areas of the shm transport, for a
 * communicator whose ranks all share a host. Three protocols, by size:
 *  - LL (up to SHOAL_SHM_LL_MAX, at most 4 KiB): every rank writes its input into its own
 *    area as 64-byte lines of 56 data bytes + an 8-byte generation flag; a peer's last flag
 *    says all its lines are there, and every rank reduces all inputs. Data and flag travel in
 *    one cache line: a single-line message costs one transfer, no separate "ready" flag.
 *  - one-shot (up to SHOAL_SHM_ONESHOT_MAX): stage the input, publish "ready", reduce all.
 *  - two-shot: window by window (cache-sized): stage, reduce my segment across all ranks,
 *    publish "reduced", copy the other segments out.
 * Every rank reduces in rank order, so all ranks get the same bits.
 *
 * Buffer reuse needs no "done" flags: each generation g uses buffer set g & 1, and a rank
 * only reaches generation g after it saw every peer at generation g - 1 (it waited for their
 * data), and a peer only starts g - 1 after it finished reading everything of g - 2.
 *
 * Waiting: poll, then yield, then sleep on a futex in our own control block; a writer that
 * published something looks (after a fence) at each peer's "sleeping" word and wakes only
 * those that sleep. The sleeper re-checks its condition after announcing itself, so no
 * wakeup is lost; sleeps are capped at 1 ms so that abort, deadlines and peer death are seen.
 *
 * Metering (src/meter, shm / same host): no channel messages here, so the path counts what
 * moves between processes itself. "Received" = payload bytes this rank takes from peers'
 * areas; "sent" = payload bytes peers take from this rank's area (its staged input, its
 * reduced segment). Copies within a rank's own memory and the flags are not counted. With n
 * local ranks and B bytes: LL and one-shot, sent = received = (n - 1) * B; two-shot, per
 * window of m elements and this rank's segment of s, sent = received = ((n - 1) * s + m - s)
 * elements, i.e. 2 (n - 1) / n * B when the windows divide evenly, like a ring. Every byte
 * one rank receives is sent by exactly one other, so the sums over ranks agree.
 */
#include "coll/coll.h"
#include "meter/meter.h"
#include "qos/pace.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHOAL_SHMD_CTRL 4096      /* control block at the start of each area */
#define SHOAL_SHMD_LL_DATA 56     /* data bytes per LL line; a multiple of every dtype size */
#define SHOAL_SHMD_LL_MAX 4096    /* largest message the LL lines hold (SHOAL_SHM_LL_MAX caps) */
#define SHOAL_SHMD_LL_LINES ((SHOAL_SHMD_LL_MAX + SHOAL_SHMD_LL_DATA - 1) / SHOAL_SHMD_LL_DATA)
#define SHOAL_SHMD_LL_BYTES SHOAL_ALIGN_UP(SHOAL_SHMD_LL_LINES * 64, 4096) /* per parity */
#define SHOAL_SHMD_SLEEP_NS 1000000 /* longest futex sleep */

typedef struct {
    volatile uint64_t ready;    /* generation whose input is staged (one-shot, two-shot) */
    uint8_t pad0[SHOAL_CACHELINE - 8];
    volatile uint64_t reduced;  /* generation whose own segment is published (two-shot) */
    uint8_t pad1[SHOAL_CACHELINE - 8];
    volatile uint32_t sleeping; /* written by the owner only */
    uint8_t pad2[SHOAL_CACHELINE - 4];
    volatile uint32_t bell;     /* futex word: bumped by whoever wakes the owner */
    uint8_t pad3[SHOAL_CACHELINE - 4];
} shoal_shmd_ctrl_t;

typedef struct {
    uint8_t data[SHOAL_SHMD_LL_DATA];
    volatile uint64_t flag;     /* generation of the data; written last, with release */
} shoal_shmd_line_t;

enum { SHOAL_SHMD_READY, SHOAL_SHMD_REDUCED };
static const char *const shoal_shmd_what[] = {"staged its input", "reduced its segment"};

static inline shoal_shmd_ctrl_t *shoal_shmd_ctrl(shoal_coll_state_t *cs, int q)
{
    return (shoal_shmd_ctrl_t *)cs->areas[q];
}

static inline shoal_shmd_line_t *shoal_shmd_lines(shoal_coll_state_t *cs, int q, uint64_t g)
{
    return (shoal_shmd_line_t *)(cs->areas[q] + SHOAL_SHMD_CTRL + (g & 1) * SHOAL_SHMD_LL_BYTES);
}

static inline uint8_t *shoal_shmd_buf(shoal_coll_state_t *cs, int q, uint64_t g)
{
    return cs->areas[q] + SHOAL_SHMD_CTRL + 2 * SHOAL_SHMD_LL_BYTES + (g & 1) * cs->window;
}

static inline volatile uint64_t *shoal_shmd_field(shoal_coll_state_t *cs, int q, int which)
{
    shoal_shmd_ctrl_t *c = shoal_shmd_ctrl(cs, q);
    return which == SHOAL_SHMD_READY ? &c->ready : &c->reduced;
}

shoal_status_t shoal_shmdirect_init(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    size_t len = 0, w, fixed = SHOAL_SHMD_CTRL + 2 * SHOAL_SHMD_LL_BYTES;

    if (!comm->all_local || comm->shm == NULL || comm->nranks < 2 ||
        comm->shm->ops->shared_area == NULL) {
        return SHOAL_OK;
    }
    cs->areas = calloc((size_t)comm->local_size, sizeof(*cs->areas));
    cs->srcs = calloc((size_t)comm->local_size, sizeof(*cs->srcs));
    cs->srcs2 = calloc((size_t)comm->local_size, sizeof(*cs->srcs2));
    if (cs->areas == NULL || cs->srcs == NULL || cs->srcs2 == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int q = 0; q < comm->local_size; q++) {
        size_t l = 0;
        cs->areas[q] = comm->shm->ops->shared_area(comm->shm->ctx, q, &l);
        if (cs->areas[q] == NULL) {
            shoal_warn(COLL, "no shared area for local rank %d: intra-node path disabled", q);
            return SHOAL_OK;
        }
        len = q == 0 ? l : SHOAL_MIN(len, l);
    }
    if (len < fixed + 2 * 4096) {
        shoal_warn(COLL, "shared area of %zu bytes is too small: intra-node path disabled", len);
        return SHOAL_OK;
    }
    w = SHOAL_MIN(cs->tune.value[SHOAL_TUNE_SHM_WINDOW], (len - fixed) / 2);
    cs->window = SHOAL_MAX(w / 4096 * 4096, 4096);
    cs->area_size = len;
    cs->shm_ok = 1;
    return SHOAL_OK;
}

void shoal_shmdirect_log(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    if (cs->shm_ok) {
        shoal_info(COLL, "intra-node path: %d ranks, LL up to %zu bytes, one-shot up to %zu "
                   "bytes, window %zu bytes", comm->local_size,
                   SHOAL_MIN(cs->tune.value[SHOAL_TUNE_SHM_LL_MAX], (size_t)SHOAL_SHMD_LL_MAX),
                   SHOAL_MIN(cs->shape.shm_oneshot_max, cs->window), cs->window);
    }
}

/* After publishing: wake the peers that announced they sleep. The fence orders our data
 * stores before the loads of their "sleeping" words (the sleeper fences the other way). */
static void shoal_shmd_wake(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (int q = 0; q < comm->local_size; q++) {
        shoal_shmd_ctrl_t *c = shoal_shmd_ctrl(cs, q);
        if (q != comm->local_rank && __atomic_load_n(&c->sleeping, __ATOMIC_RELAXED) != 0) {
            __atomic_fetch_add(&c->bell, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &c->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        }
    }
}

static void shoal_shmd_publish(struct shoal_comm *comm, int which, uint64_t g)
{
    __atomic_store_n(shoal_shmd_field(comm->coll, comm->local_rank, which), g,
                     __ATOMIC_RELEASE);
    shoal_shmd_wake(comm);
}

typedef int (*shoal_shmd_cond_fn_t)(shoal_coll_state_t *cs, int q, const void *arg);

typedef struct {
    int which;
    uint64_t g;
} shoal_shmd_field_arg_t;

static int shoal_shmd_field_reached(shoal_coll_state_t *cs, int q, const void *arg)
{
    const shoal_shmd_field_arg_t *f = arg;
    return __atomic_load_n(shoal_shmd_field(cs, q, f->which), __ATOMIC_ACQUIRE) >= f->g;
}

typedef struct {
    const volatile uint64_t *flag;
    uint64_t g;
} shoal_shmd_line_arg_t;

static int shoal_shmd_line_reached(shoal_coll_state_t *cs, int q, const void *arg)
{
    const shoal_shmd_line_arg_t *l = arg;
    return __atomic_load_n(l->flag, __ATOMIC_ACQUIRE) >= l->g;
}

/* Sleep on our futex unless cond(q) became true after we said we sleep. */
static void shoal_shmd_sleep(struct shoal_comm *comm, shoal_shmd_cond_fn_t cond, int q,
                             const void *arg)
{
    shoal_shmd_ctrl_t *me = shoal_shmd_ctrl(comm->coll, comm->local_rank);
    uint32_t bell = __atomic_load_n(&me->bell, __ATOMIC_ACQUIRE);
    struct timespec ts = {.tv_sec = 0, .tv_nsec = SHOAL_SHMD_SLEEP_NS};

    __atomic_store_n(&me->sleeping, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!cond(comm->coll, q, arg) && !shoal_comm_aborted(comm)) {
        syscall(SYS_futex, &me->bell, FUTEX_WAIT, bell, &ts, NULL, 0);
    }
    __atomic_store_n(&me->sleeping, 0, __ATOMIC_RELAXED);
}

/* The slow path of a wait for local rank q: yield, then sleep; abort, deadline and peer death
 * end it with an error. */
static shoal_status_t shoal_shmd_wait_slow(struct shoal_comm *comm, shoal_shmd_cond_fn_t cond,
                                           int q, const void *arg, const char *what)
{
    uint64_t deadline = shoal_deadline_ns(comm->timeout_ms);
    unsigned spins = 0;
    int peer = comm->local_ranks[q];

    while (!cond(comm->coll, q, arg)) {
        char why[160];
        int blamed = -1;
        if ((spins & 63) == 63 && comm->shm->ops->peer_check != NULL &&
            comm->shm->ops->peer_check(comm->shm->ctx, q, why, sizeof(why), &blamed) !=
                SHOAL_OK) {
            return shoal_comm_set_failed(comm, SHOAL_ERR_PEER_FAILED,
                                         shoal_comm_culprit(comm, blamed, peer),
                                         "peer %d (%s) failed: %s", peer,
                                         shoal_comm_peer_host(comm, peer), why);
        }
        int stopping = shoal_comm_aborted(comm) || shoal_comm_fatal(comm) != SHOAL_OK;
        if (spins + 1 < comm->spin_count || stopping) {
            /* The sentence is only needed when this idle step may fail (deadline checks come
             * every 256 steps); formatting it on every step would cost more than the wait. */
            char msg[160];
            const char *m = "waiting in the intra-node path";
            if (((spins + 1) & 255) == 0 || stopping) {
                snprintf(msg, sizeof(msg), "for peer %d (%s) to say it %s", peer,
                         shoal_comm_peer_host(comm, peer), what);
                m = msg;
            }
            SHOAL_CHECK(shoal_chan_idle(comm, &spins, deadline, m));
            continue;
        }
        spins++;
        if (shoal_deadline_passed(deadline)) {
            return shoal_comm_set_failed(comm, SHOAL_ERR_TIMEOUT, -1,
                                         "timed out after %d ms waiting for peer %d (%s) to say "
                                         "it %s", comm->timeout_ms, peer,
                                         shoal_comm_peer_host(comm, peer), what);
        }
        shoal_shmd_sleep(comm, cond, q, arg);
    }
    return SHOAL_OK;
}

/* Wait until every peer's field has reached g. */
static shoal_status_t shoal_shmd_wait(struct shoal_comm *comm, int which, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    shoal_shmd_field_arg_t arg = {.which = which, .g = g};

    for (int q = 0; q < comm->local_size; q++) {
        if (q == comm->local_rank) {
            continue;
        }
        for (unsigned i = 0; !shoal_shmd_field_reached(cs, q, &arg); i++) {
            if (i >= comm->pause_spins) {
                SHOAL_CHECK(shoal_shmd_wait_slow(comm, shoal_shmd_field_reached, q, &arg,
                                                 shoal_shmd_what[which]));
                break;
            }
            shoal_cpu_relax();
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_shmd_wait_line(struct shoal_comm *comm, int q,
                                           const shoal_shmd_line_t *line, uint64_t g)
{
    shoal_shmd_line_arg_t arg = {.flag = &line->flag, .g = g};
    for (unsigned i = 0; __atomic_load_n(&line->flag, __ATOMIC_ACQUIRE) < g; i++) {
        if (i >= comm->pause_spins) {
            return shoal_shmd_wait_slow(comm, shoal_shmd_line_reached, q, &arg,
                                        "wrote its input");
        }
        shoal_cpu_relax();
    }
    return SHOAL_OK;
}

/* QoS pacing (src/qos/pace.h): no channel sends here, so each path takes from the bucket what
 * the meter counts as sent (what peers take from this rank's area), before offering it. */
static inline shoal_status_t shoal_shmd_pace(struct shoal_comm *comm, uint64_t sent)
{
    if (SHOAL_UNLIKELY(comm->pace != NULL)) {
        return shoal_qos_pace_comm_take(comm, sent);
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_shmd_ll(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                    size_t bytes)
{
    shoal_coll_state_t *cs = comm->coll;
    uint64_t g = ++cs->gen;
    int n = comm->local_size;
    size_t nlines = (bytes + SHOAL_SHMD_LL_DATA - 1) / SHOAL_SHMD_LL_DATA;
    shoal_shmd_line_t *mine = shoal_shmd_lines(cs, comm->local_rank, g);
    const void **srcs = (const void **)cs->srcs;
    const uint8_t *in = a->sendbuf;

    SHOAL_CHECK(shoal_shmd_pace(comm, (uint64_t)(n - 1) * bytes));
    for (size_t i = 0; i < nlines; i++) {
        size_t off = i * SHOAL_SHMD_LL_DATA, len = SHOAL_MIN(SHOAL_SHMD_LL_DATA, bytes - off);
        memcpy(mine[i].data, in + off, len);
        __atomic_store_n(&mine[i].flag, g, __ATOMIC_RELEASE);
    }
    shoal_shmd_wake(comm);
    /* A peer's lines are stored in order, each flag with release: once its last flag reads g
     * (acquire), every line before it is there too; one wait per peer, then one pass of the
     * reduction over all lines. */
    for (int q = 0; q < n; q++) {
        shoal_shmd_line_t *l = shoal_shmd_lines(cs, q, g);
        if (q != comm->local_rank) {
            SHOAL_CHECK(shoal_shmd_wait_line(comm, q, &l[nlines - 1], g));
        }
        srcs[q] = l[0].data;
    }
    shoal_reduce_n_pieces(a->recvbuf, srcs, (const void **)cs->srcs2, n, a->count, a->dtype,
                          a->op, SHOAL_SHMD_LL_DATA, sizeof(shoal_shmd_line_t));
    shoal_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, a->op, comm->nranks);
    shoal_meter_add_shm(comm->meter, (uint64_t)(n - 1) * bytes, (uint64_t)(n - 1) * bytes);
    return SHOAL_OK;
}

static shoal_status_t shoal_shmd_oneshot(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                         size_t bytes)
{
    shoal_coll_state_t *cs = comm->coll;
    uint64_t g = ++cs->gen;
    const void **srcs = (const void **)cs->srcs;

    SHOAL_CHECK(shoal_shmd_pace(comm, (uint64_t)(comm->local_size - 1) * bytes));
    memcpy(shoal_shmd_buf(cs, comm->local_rank, g), a->sendbuf, bytes);
    shoal_shmd_publish(comm, SHOAL_SHMD_READY, g);
    SHOAL_CHECK(shoal_shmd_wait(comm, SHOAL_SHMD_READY, g));
    for (int q = 0; q < comm->local_size; q++) {
        srcs[q] = shoal_shmd_buf(cs, q, g);
    }
    shoal_reduce_n(a->recvbuf, srcs, comm->local_size, a->count, a->dtype, a->op);
    shoal_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, a->op, comm->nranks);
    shoal_meter_add_shm(comm->meter, (uint64_t)(comm->local_size - 1) * bytes,
                        (uint64_t)(comm->local_size - 1) * bytes);
    return SHOAL_OK;
}

/* One two-shot window: elements [e0, e0 + m). */
static shoal_status_t shoal_shmd_window(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                        size_t e0, size_t m, size_t dsize)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->local_size, me = comm->local_rank;
    uint64_t g = ++cs->gen;
    const void **srcs = (const void **)cs->srcs;
    uint8_t *out = (uint8_t *)a->recvbuf + e0 * dsize;
    size_t so, sl;

    const uint8_t *in = (const uint8_t *)a->sendbuf + e0 * dsize;
    uint8_t *stage = shoal_shmd_buf(cs, me, g);
    /* Peers read only their own segments of my input: stage those. My segment is read
     * straight from the send buffer, unless the call is in place (the result overwrites it,
     * and the reduction may alias its destination with its first source only). */
    shoal_block_range(m, n, me, &so, &sl);
    SHOAL_CHECK(shoal_shmd_pace(comm, ((uint64_t)(n - 1) * sl + (m - sl)) * dsize));
    if (a->sendbuf == a->recvbuf) {
        memcpy(stage, in, m * dsize);
    } else {
        memcpy(stage, in, so * dsize);
        memcpy(stage + (so + sl) * dsize, in + (so + sl) * dsize, (m - so - sl) * dsize);
    }
    shoal_shmd_publish(comm, SHOAL_SHMD_READY, g);
    SHOAL_CHECK(shoal_shmd_wait(comm, SHOAL_SHMD_READY, g));
    for (int q = 0; q < n; q++) {
        srcs[q] = shoal_shmd_buf(cs, q, g) + so * dsize;
    }
    if (a->sendbuf != a->recvbuf) {
        srcs[me] = in + so * dsize;
    }
    shoal_reduce_n(out + so * dsize, srcs, n, sl, a->dtype, a->op);
    shoal_reduce_avg_finalize(out + so * dsize, sl, a->dtype, a->op, comm->nranks);
    memcpy(shoal_shmd_buf(cs, me, g) + so * dsize, out + so * dsize, sl * dsize);
    shoal_shmd_publish(comm, SHOAL_SHMD_REDUCED, g);
    SHOAL_CHECK(shoal_shmd_wait(comm, SHOAL_SHMD_REDUCED, g));
    for (int q = 0; q < n; q++) {
        size_t qo, ql;
        if (q == me) {
            continue;
        }
        shoal_block_range(m, n, q, &qo, &ql);
        memcpy(out + qo * dsize, shoal_shmd_buf(cs, q, g) + qo * dsize, ql * dsize);
    }
    /* Phase 1: my segment of each peer's input in, the peers' segments of mine out; phase 2:
     * their reduced segments in, mine out. Both directions: (n - 1) * sl + (m - sl). */
    shoal_meter_add_shm(comm->meter, ((uint64_t)(n - 1) * sl + (m - sl)) * dsize,
                        ((uint64_t)(n - 1) * sl + (m - sl)) * dsize);
    return SHOAL_OK;
}

shoal_status_t shoal_shmdirect_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    shoal_coll_state_t *cs = comm->coll;
    size_t dsize = shoal_dtype_size(a->dtype), bytes = a->count * dsize;
    size_t welems = cs->window / dsize;

    if (bytes <= SHOAL_MIN(cs->tune.value[SHOAL_TUNE_SHM_LL_MAX], SHOAL_SHMD_LL_MAX)) {
        return shoal_shmd_ll(comm, a, bytes);
    }
    if (bytes <= SHOAL_MIN(cs->shape.shm_oneshot_max, cs->window)) {
        return shoal_shmd_oneshot(comm, a, bytes);
    }
    for (size_t e0 = 0; e0 < a->count; e0 += welems) {
        SHOAL_CHECK(shoal_shmd_window(comm, a, e0, SHOAL_MIN(welems, a->count - e0), dsize));
    }
    return SHOAL_OK;
}
