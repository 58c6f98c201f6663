/*
 * Intra-node AllReduce straight through the shared areas of the shm transport, for a
 * communicator whose ranks all share a host. Three protocols, by size:
 *  - LL (up to SHOAL_SHM_LL_MAX, at most 4 KiB): every rank writes its input into its own
 *    area as 64-byte lines of 56 data bytes + an 8-byte generation flag; a peer's last flag
 *    says all its lines are there, and every rank reduces all inputs. Data and flag travel in
 *    one cache line: a single-line message costs one transfer, no separate "ready" flag.
 *  - one-shot (up to SHOAL_SHM_ONESHOT_MAX): stage the input, publish "ready", reduce all.
 *  - two-shot: window by window (cache-sized): stage the peers' segments of my input,
 *    reduce my segment across all ranks into my output and my stage in one pass, publish
 *    "reduced", stage the next window, then copy the other segments out (overlapped: one wait
 *    per phase, mostly satisfied already; see shoal_shmd_twoshot).
 *  - direct (from SHOAL_SHM_DIRECT_MIN): every rank first publishes its buffers; if all are
 *    shoal_mem_alloc buffers, each rank reduces its segment out of every rank's send buffer
 *    into every rank's receive buffer (no staging, one pass); else, if every rank can make
 *    single copies through the kernel (process_vm_readv/writev), each reads its segment of
 *    the peers' inputs and writes its result into theirs; else the staged two-shot.
 * Every rank reduces in rank order, so all ranks get the same bits.
 *
 * Mismatched calls: every generation's signature (count, dtype, op) is published next to the
 * ready flag (and in the LL flags). A rank whose peer published another signature for the
 * same generation returns SHOAL_ERR_INVALID_ARG, after every peer reached that generation;
 * all ranks do, at the same generation, so the next matching call works.
 *
 * Buffer reuse needs no "done" flags: each generation g uses buffer set g & 1, and a rank
 * only reaches generation g after it saw every peer at generation g - 1 (it waited for their
 * data), and a peer only starts g - 1 after it finished reading everything of g - 2.
 *
 * A plan (see "the call as a plan" below): every wait is a state whose step tests the flags
 * once; the proxy advances it beside other plans, a blocking call drives it on its thread.
 *
 * Waiting (the blocking driver's idle step): poll, then yield, then sleep on a futex in our
 * own control block; a writer that published something looks (after a fence) at each peer's
 * "sleeping" word and wakes only those that sleep. The sleeper re-checks its condition after
 * announcing itself, so no wakeup is lost; sleeps are capped at 1 ms so that abort, deadlines
 * and peer death are seen (the proxy's idle step is its own, capped at 1 ms too).
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
#define SHOAL_SHMD_LL_PREFETCH_LINES 2 /* LL calls whose next lines are prefetched (see below) */

/* What a rank's call is, published for every generation before its data: peers compare it
 * with their own call (count, dtype, op), and the direct path learns the peer's buffers. */
enum {
    SHOAL_SHMD_CAP_CMA = 1,     /* this rank can single-copy with every local peer */
    SHOAL_SHMD_CAP_SMEM = 2,    /* send buffer is a shoal_mem_alloc buffer: send_mem */
    SHOAL_SHMD_CAP_RMEM = 4,    /* receive buffer is one: recv_mem */
};

/* The direct path's buffers (two lines), published before the call's signature. */
typedef struct {
    uint32_t caps;              /* SHOAL_SHMD_CAP_* */
    uint32_t pad;
    uint64_t send_va;           /* the buffers in the owner's address space */
    uint64_t recv_va;
    uint8_t pad1[SHOAL_CACHELINE - 24];
    shoal_tl_mem_t send_mem;
    shoal_tl_mem_t recv_mem;
} __attribute__((aligned(SHOAL_CACHELINE))) shoal_shmd_desc_t;

/* A call's signature, in the line of the ready flag that peers poll anyway: checking it
 * costs no extra transfer. */
typedef struct {
    volatile uint64_t gen;      /* written last, with release */
    uint64_t count;
    uint32_t dtype;
    uint32_t op;
} shoal_shmd_sig_t;

typedef struct {
    volatile uint64_t ready;    /* generation whose input is staged (one-shot, two-shot) */
    shoal_shmd_sig_t sig[2];    /* the call of generation g in sig[g & 1] */
    uint8_t pad0[SHOAL_CACHELINE - 8 - 2 * sizeof(shoal_shmd_sig_t)];
    volatile uint64_t reduced;  /* generation whose own segment is published (two-shot) */
    uint8_t pad1[SHOAL_CACHELINE - 8];
    volatile uint32_t sleeping; /* written by the owner only */
    uint8_t pad2[SHOAL_CACHELINE - 4];
    volatile uint32_t bell;     /* futex word: bumped by whoever wakes the owner */
    uint8_t pad3[SHOAL_CACHELINE - 4];
    shoal_shmd_desc_t desc[2];  /* the direct path's buffers of generation g: desc[g & 1] */
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

static inline shoal_shmd_desc_t *shoal_shmd_desc(shoal_coll_state_t *cs, int q, uint64_t g)
{
    return &shoal_shmd_ctrl(cs, q)->desc[g & 1];
}

static inline shoal_shmd_sig_t *shoal_shmd_sig(shoal_coll_state_t *cs, int q, uint64_t g)
{
    return &shoal_shmd_ctrl(cs, q)->sig[g & 1];
}

/* Publishes this rank's call for generation g (the caller's own stores follow, with release). */
static void shoal_shmd_desc_put(struct shoal_comm *comm, const shoal_coll_args_t *a, uint64_t g)
{
    shoal_shmd_sig_t *d = shoal_shmd_sig(comm->coll, comm->local_rank, g);
    d->count = a->count;
    d->dtype = (uint32_t)a->dtype;
    d->op = (uint32_t)a->op;
    __atomic_store_n(&d->gen, g, __ATOMIC_RELEASE);
}

/* 1 when local rank q published generation g with another call than ours. */
static int shoal_shmd_desc_differs(struct shoal_comm *comm, int q, uint64_t g)
{
    const shoal_shmd_sig_t *d = shoal_shmd_sig(comm->coll, q, g), *m;
    if (__atomic_load_n(&d->gen, __ATOMIC_ACQUIRE) != g) {
        return 0;
    }
    m = shoal_shmd_sig(comm->coll, comm->local_rank, g);
    return d->count != m->count || d->dtype != m->dtype || d->op != m->op;
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
    cs->peer_mem = (comm->shm->ops->caps & SHOAL_TL_CAP_PEER_MEM) != 0 &&
                   comm->shm->ops->mem_query != NULL && comm->shm->ops->mem_map != NULL &&
                   comm->shm->ops->peer_copy_ok != NULL && comm->shm->ops->peer_copy != NULL;
    cs->ll_prefetchw = shoal_coll_config.shm_prefetchw && shoal_cpu_prefetchw();
    cs->shm_ok = 1;
    return SHOAL_OK;
}

void shoal_shmdirect_log(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    if (cs->shm_ok) {
        shoal_info(COLL, "intra-node path: %d ranks, LL up to %zu bytes (next lines prefetched "
                   "for writing: %s), one-shot up to %zu bytes, window %zu bytes",
                   comm->local_size,
                   SHOAL_MIN(cs->tune.value[SHOAL_TUNE_SHM_LL_MAX], (size_t)SHOAL_SHMD_LL_MAX),
                   cs->ll_prefetchw ? "yes"
                   : shoal_coll_config.shm_prefetchw ? "no, the CPU has no such prefetch"
                                                     : "no, SHOAL_SHM_PREFETCHW=0",
                   SHOAL_MIN(cs->shape.shm_oneshot_max, cs->window), cs->window);
        shoal_info(COLL, "intra-node path: from %zu bytes, buffers published first: in place "
                   "in shoal_mem_alloc buffers, single copies %s", cs->shm_direct_min,
                   cs->peer_mem && comm->shm->ops->peer_copy_ok(comm->shm->ctx)
                       ? "possible here" : "off here");
    }
}

/* After publishing: wake the peers that announced they sleep. The fence orders our data
 * stores before the loads of their "sleeping" words (the sleeper fences the other way). */
static inline void shoal_shmd_wake(struct shoal_comm *comm)
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

/* ---- the call as a plan ------------------------------------------------------------------
 * Every wait of a protocol is a state: a step tests the flags it waits for once and returns
 * SHOAL_IN_PROGRESS when one is not there yet, saying which (w*: the blocking driver's idle
 * step polls that flag, then yields, then sleeps on our futex). The proxy advances the same
 * steps beside its other plans (shoal_shmdirect_allreduce_plan). */
enum {
    SHOAL_SHMD_S_START,
    SHOAL_SHMD_S_LL,         /* LL: every peer's last line of generation g */
    SHOAL_SHMD_S_ONESHOT,    /* one-shot: every peer staged g */
    SHOAL_SHMD_S_WINDOW,     /* two-shot: window w starts */
    SHOAL_SHMD_S_TS_READY,   /* two-shot: every peer staged window w */
    SHOAL_SHMD_S_TS_REDUCED, /* two-shot: every peer reduced its segment of window w */
    SHOAL_SHMD_S_DESC,       /* direct: every peer described its buffers of g */
    SHOAL_SHMD_S_DIRECT_END, /* direct: every peer finished its part (ready g + 1) */
    SHOAL_SHMD_S_MISMATCH,   /* arguments differ: every peer reached g, then the error */
};

typedef struct {
    const shoal_coll_args_t *a;
    int state;
    int q;                   /* the next local rank the current wait tests */
    uint64_t g;              /* generation of the current state */
    uint64_t flag;           /* LL: our lines' flag */
    size_t bytes, dsize, nlines;
    size_t welems, nwin, w;  /* two-shot: elements per window, windows, the current one */
    uint64_t g0;             /* two-shot: generation of window 0 */
    int staged;              /* two-shot: window w is staged already */
    uint32_t all;            /* direct: the capabilities every rank described so far */
    int proxied;             /* advanced by the proxy: a step looks for peer death itself */
    int slow;                /* blocking: a wait went past its polls (a differing call is
                              * looked for from then on: the first polls need not) */
    unsigned polls;          /* proxied: steps that found a flag missing */
    /* the flag the current state waits for: local rank wq's *wflag == wval (wexact, LL) or
     * >= wval; wsig: a signature of generation wg other than ours ends the wait too */
    const volatile uint64_t *wflag;
    uint64_t wval, wg;
    int wexact, wsig, wq;
    const char *what;        /* "for peer %d to say it <what>" */
} shoal_shmd_run_t;

static inline int shoal_shmd_waited(const shoal_shmd_run_t *r)
{
    uint64_t x = __atomic_load_n(r->wflag, __ATOMIC_ACQUIRE);
    return r->wexact ? x == r->wval : x >= r->wval;
}

/* Tests local rank q's flag f once; when it is not there, records the wait in r. */
static inline int shoal_shmd_test(shoal_shmd_run_t *r, int q, const volatile uint64_t *f,
                                  uint64_t v, int exact, int sig, uint64_t g, const char *what)
{
    uint64_t x = __atomic_load_n(f, __ATOMIC_ACQUIRE);
    if (exact ? x == v : x >= v) {
        return 1;
    }
    r->wflag = f;
    r->wval = v;
    r->wexact = exact;
    r->wsig = sig;
    r->wg = g;
    r->wq = q;
    r->what = what;
    return 0;
}

static shoal_status_t shoal_shmd_mismatch_poll(struct shoal_comm *comm, shoal_shmd_run_t *r);

/* A peer's call differs from ours: every rank finds it in the same generation (each waits for
 * every peer's data of it), returns this error, and the next matching call works. */
static shoal_status_t shoal_shmd_mismatch(struct shoal_comm *comm, shoal_shmd_run_t *r, int q,
                                          uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    const shoal_shmd_sig_t *d = shoal_shmd_sig(cs, q, g);
    const shoal_shmd_sig_t *m = shoal_shmd_sig(cs, comm->local_rank, g);
    shoal_error(COLL, "rank %d: AllReduce arguments differ across ranks: this rank passed count "
                "%llu %s %s, rank %d passed count %llu %s %s", comm->rank,
                (unsigned long long)m->count, shoal_dtype_name((shoal_dtype_t)m->dtype),
                shoal_op_name((shoal_op_t)m->op), comm->local_ranks[q],
                (unsigned long long)d->count, shoal_dtype_name((shoal_dtype_t)d->dtype),
                shoal_op_name((shoal_op_t)d->op));
    r->state = SHOAL_SHMD_S_MISMATCH;
    r->g = g;
    r->q = 0;
    return shoal_shmd_mismatch_poll(comm, r);
}

/* Only one peer had to reach g for us to see the difference; a slower one may still be
 * reading our data of g - 1, which our next call would overwrite: wait until every peer
 * published g (it finished g - 1 then), and they all fail g in turn. */
static shoal_status_t shoal_shmd_mismatch_poll(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    for (; r->q < comm->local_size; r->q++) {
        if (r->q != comm->local_rank &&
            !shoal_shmd_test(r, r->q, &shoal_shmd_sig(comm->coll, r->q, r->g)->gen, r->g, 0, 0,
                             r->g, "reached the mismatched AllReduce")) {
            return SHOAL_IN_PROGRESS;
        }
    }
    return SHOAL_ERR_INVALID_ARG;
}

/* The flag r waits for (local rank q's) is not there: a differing call ends the wait; a step
 * of the proxy also looks for the peer's death now and then (the blocking driver does in its
 * idle step). */
static shoal_status_t shoal_shmd_pending(struct shoal_comm *comm, shoal_shmd_run_t *r, int q)
{
    if (r->wsig && (r->proxied || r->slow) && shoal_shmd_desc_differs(comm, q, r->wg)) {
        return shoal_shmd_mismatch(comm, r, q, r->wg);
    }
    if (r->proxied && (++r->polls & 63) == 0 && comm->shm->ops->peer_check != NULL) {
        char why[160];
        int blamed = -1, peer = comm->local_ranks[q];
        if (comm->shm->ops->peer_check(comm->shm->ctx, q, why, sizeof(why), &blamed) !=
                SHOAL_OK &&
            !shoal_shmd_waited(r)) { /* what it wrote before it went is whole */
            return shoal_comm_set_failed(comm, SHOAL_ERR_PEER_FAILED,
                                         shoal_comm_culprit(comm, blamed, peer),
                                         "peer %d (%s) failed: %s", peer,
                                         shoal_comm_peer_host(comm, peer), why);
        }
    }
    return SHOAL_IN_PROGRESS;
}

/* Every peer's field `which` reached g (tested from local rank r->q on); a peer's staged
 * input also says its call, which must be ours. SHOAL_OK when all did. */
static shoal_status_t shoal_shmd_poll_field(struct shoal_comm *comm, shoal_shmd_run_t *r,
                                            int which, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    int ready = which == SHOAL_SHMD_READY;
    for (; r->q < comm->local_size; r->q++) {
        int q = r->q;
        if (q == comm->local_rank) {
            continue;
        }
        if (!shoal_shmd_test(r, q, shoal_shmd_field(cs, q, which), g, 0, ready, g,
                             shoal_shmd_what[which])) {
            return shoal_shmd_pending(comm, r, q);
        }
        if (ready && SHOAL_UNLIKELY(shoal_shmd_desc_differs(comm, q, g))) {
            return shoal_shmd_mismatch(comm, r, q, g);
        }
    }
    r->q = 0;
    return SHOAL_OK;
}

/* The blocking driver's sleep: on our futex, unless the flag came after we said we sleep. */
static void shoal_shmd_sleep(struct shoal_comm *comm, const shoal_shmd_run_t *r)
{
    shoal_shmd_ctrl_t *me = shoal_shmd_ctrl(comm->coll, comm->local_rank);
    uint32_t bell = __atomic_load_n(&me->bell, __ATOMIC_ACQUIRE);
    struct timespec ts = {.tv_sec = 0, .tv_nsec = SHOAL_SHMD_SLEEP_NS};

    __atomic_store_n(&me->sleeping, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!shoal_shmd_waited(r) && !shoal_comm_aborted(comm)) {
        syscall(SYS_futex, &me->bell, FUTEX_WAIT, bell, &ts, NULL, 0);
    }
    __atomic_store_n(&me->sleeping, 0, __ATOMIC_RELAXED);
}

/* The blocking driver's idle step past the first polls: yield, then sleep, until the flag r
 * waits for is there (or a differing call ends the wait: the next step fails it); abort,
 * deadline and peer death end it with an error. */
static shoal_status_t shoal_shmd_wait_slow(struct shoal_comm *comm, const shoal_shmd_run_t *r)
{
    uint64_t deadline = shoal_deadline_ns(comm->timeout_ms);
    unsigned spins = 0;
    int q = r->wq, peer = comm->local_ranks[q];

    while (!shoal_shmd_waited(r)) {
        char why[160];
        int blamed = -1;
        if (r->wsig && shoal_shmd_desc_differs(comm, q, r->wg)) {
            break; /* it waits for something else: the step reports it */
        }
        if ((spins & 63) == 63 && comm->shm->ops->peer_check != NULL &&
            comm->shm->ops->peer_check(comm->shm->ctx, q, why, sizeof(why), &blamed) !=
                SHOAL_OK) {
            if (shoal_shmd_waited(r)) {
                break; /* it said so before it went: what it wrote is whole */
            }
            return shoal_comm_set_failed(comm, SHOAL_ERR_PEER_FAILED,
                                         shoal_comm_culprit(comm, blamed, peer),
                                         "peer %d (%s) failed: %s", peer,
                                         shoal_comm_peer_host(comm, peer), why);
        }
        int stopping = shoal_comm_aborted(comm) || shoal_comm_fatal(comm) != SHOAL_OK ||
                       shoal_comm_dead_peer(comm) >= 0;
        if (spins + 1 < comm->spin_count || stopping) {
            /* The sentence is only needed when this idle step may fail (deadline checks come
             * every 256 steps); formatting it on every step would cost more than the wait. */
            char msg[160];
            const char *m = "waiting in the intra-node path";
            if (((spins + 1) & 255) == 0 || stopping) {
                snprintf(msg, sizeof(msg), "waiting for peer %d (%s) to say it %s", peer,
                         shoal_comm_peer_host(comm, peer), r->what);
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
                                         shoal_comm_peer_host(comm, peer), r->what);
        }
        shoal_shmd_sleep(comm, r);
    }
    return SHOAL_OK;
}

/* An LL line's flag: the generation and the call's signature, exactly (LL counts have at most
 * 13 bits), so a line of a peer whose call differs never matches: the wait goes on into the
 * slow path, which finds the difference in the peer's signature. No extra transfer. */
static inline uint64_t shoal_shmd_ll_flag(uint64_t g, const shoal_coll_args_t *a)
{
    return g << 24 | (uint64_t)(a->count & 0x3fff) << 7 | (uint64_t)(a->dtype & 15) << 3 |
           (uint64_t)(a->op & 7);
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

/* LL: write the lines (one call's flag each), then every peer's last line. */
static shoal_status_t shoal_shmd_ll_poll(struct shoal_comm *comm, shoal_shmd_run_t *r);

static shoal_status_t shoal_shmd_ll_start(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    shoal_coll_state_t *cs = comm->coll;
    const shoal_coll_args_t *a = r->a;
    uint64_t g = ++cs->gen;
    size_t bytes = r->bytes, nlines = (bytes + SHOAL_SHMD_LL_DATA - 1) / SHOAL_SHMD_LL_DATA;
    shoal_shmd_line_t *mine = shoal_shmd_lines(cs, comm->local_rank, g);
    const uint8_t *in = a->sendbuf;
    uint64_t flag = shoal_shmd_ll_flag(g, a);

    r->g = g;
    r->nlines = nlines;
    r->flag = flag;
    SHOAL_CHECK(shoal_shmd_pace(comm, (uint64_t)(comm->local_size - 1) * bytes));
    shoal_shmd_desc_put(comm, a, g);
    for (size_t i = 0; i < nlines; i++) {
        size_t off = i * SHOAL_SHMD_LL_DATA, len = SHOAL_MIN(SHOAL_SHMD_LL_DATA, bytes - off);
        if ((len & 7) == 0) {
            /* whole words (an 8 B call: one move, no call to memcpy) */
            for (size_t w = 0; w < len; w += 8) {
                memcpy(mine[i].data + w, in + off + w, 8);
            }
        } else {
            memcpy(mine[i].data, in + off, len);
        }
        __atomic_store_n(&mine[i].flag, flag, __ATOMIC_RELEASE);
    }
    shoal_shmd_wake(comm);
    r->state = SHOAL_SHMD_S_LL;
    return shoal_shmd_ll_poll(comm, r);
}

/* The next call's LL lines of this rank (the other parity), asked for in the exclusive state
 * once every peer's line of generation g is read. Each peer read them in generation g - 1 and
 * is done with them now (it wrote its lines of g after reading ours of g - 1), so the stores
 * of the next call find them here and need not first invalidate the peers' copies, a round
 * trip between cores on the next call's critical path; the prefetch overlaps that trip with
 * the return and whatever the caller does between calls. Only for calls of up to
 * SHOAL_SHMD_LL_PREFETCH_LINES lines: 2 ranks on a 2.6 GHz Xeon VM, one line (8 B): 35-49 ns
 * less per call (of 232-298), two lines (64-112 B): 9-94 ns less (the spread is the
 * launches'); three or more lines: no difference within +-5 ns (the first lines' transfers
 * overlap the others'), nor at 512 B or 4 KiB (perf/shm_ll_bench,
 * perf/results/shm-ll-prefetchw-2026-12-05.txt). The next call is taken to be as long as this one (a training
 * loop's calls usually are); one of another length only loses part of the hint. */
static void shoal_shmd_ll_prefetch(struct shoal_comm *comm, const shoal_shmd_run_t *r)
{
    shoal_shmd_line_t *next = shoal_shmd_lines(comm->coll, comm->local_rank, r->g + 1);
    for (size_t i = 0; i < r->nlines; i++) {
        shoal_prefetch_write(&next[i]);
    }
}

/* A peer's lines are stored in order, each flag with release: once its last flag reads ours
 * (acquire), every line before it is there too; one test per peer, then one pass of the
 * reduction over all lines. */
static shoal_status_t shoal_shmd_ll_poll(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    shoal_coll_state_t *cs = comm->coll;
    const shoal_coll_args_t *a = r->a;
    int n = comm->local_size;
    const void **srcs = (const void **)cs->srcs;

    /* srcs: the communicator's, kept between steps (one intra-node call at a time) */
    for (; r->q < n; r->q++) {
        int q = r->q;
        shoal_shmd_line_t *l = shoal_shmd_lines(cs, q, r->g);
        if (q != comm->local_rank &&
            !shoal_shmd_test(r, q, &l[r->nlines - 1].flag, r->flag, 1, 1, r->g,
                             "wrote its input")) {
            return shoal_shmd_pending(comm, r, q);
        }
        srcs[q] = l[0].data;
    }
    if (n == 2 && r->nlines == 1) {
        /* the small call of 2 ranks: one line each, reduce_n_pieces' only step */
        shoal_reduce2(a->recvbuf, srcs[0], srcs[1], a->count, a->dtype, a->op);
    } else {
        shoal_reduce_n_pieces(a->recvbuf, srcs, (const void **)cs->srcs2, n, a->count,
                              a->dtype, a->op, SHOAL_SHMD_LL_DATA, sizeof(shoal_shmd_line_t));
    }
    shoal_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, a->op, comm->nranks);
    shoal_meter_add_shm(comm->meter, (uint64_t)(n - 1) * r->bytes, (uint64_t)(n - 1) * r->bytes);
    if (cs->ll_prefetchw && r->nlines <= SHOAL_SHMD_LL_PREFETCH_LINES) {
        shoal_shmd_ll_prefetch(comm, r);
    }
    return SHOAL_OK;
}

/* One-shot: stage, publish "ready", then (every peer staged) reduce all. */
static shoal_status_t shoal_shmd_oneshot_poll(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    shoal_coll_state_t *cs = comm->coll;
    const shoal_coll_args_t *a = r->a;
    const void **srcs = (const void **)cs->srcs;
    uint64_t moved = (uint64_t)(comm->local_size - 1) * r->bytes;

    SHOAL_CHECK(shoal_shmd_poll_field(comm, r, SHOAL_SHMD_READY, r->g));
    for (int q = 0; q < comm->local_size; q++) {
        srcs[q] = shoal_shmd_buf(cs, q, r->g);
    }
    shoal_reduce_n(a->recvbuf, srcs, comm->local_size, a->count, a->dtype, a->op);
    shoal_reduce_avg_finalize(a->recvbuf, a->count, a->dtype, a->op, comm->nranks);
    shoal_meter_add_shm(comm->meter, moved, moved);
    return SHOAL_OK;
}

static shoal_status_t shoal_shmd_oneshot_start(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    shoal_coll_state_t *cs = comm->coll;
    uint64_t g = ++cs->gen;

    r->g = g;
    SHOAL_CHECK(shoal_shmd_pace(comm, (uint64_t)(comm->local_size - 1) * r->bytes));
    shoal_shmd_desc_put(comm, r->a, g);
    memcpy(shoal_shmd_buf(cs, comm->local_rank, g), r->a->sendbuf, r->bytes);
    shoal_shmd_publish(comm, SHOAL_SHMD_READY, g);
    r->state = SHOAL_SHMD_S_ONESHOT;
    return shoal_shmd_oneshot_poll(comm, r);
}

/* Stages the peers' segments of window [e0, e0 + m) (my own one is reduced straight out of the
 * send buffer, in place too: see shoal_shmd_window_reduce) and publishes it as generation g. */
static void shoal_shmd_window_stage(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                    size_t e0, size_t m, size_t dsize, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    const uint8_t *in = (const uint8_t *)a->sendbuf + e0 * dsize;
    uint8_t *stage = shoal_shmd_buf(cs, comm->local_rank, g);
    size_t so, sl;

    shoal_block_range(m, comm->local_size, comm->local_rank, &so, &sl);
    shoal_shmd_desc_put(comm, a, g);
    memcpy(stage, in, so * dsize);
    memcpy(stage + (so + sl) * dsize, in + (so + sl) * dsize, (m - so - sl) * dsize);
    shoal_shmd_publish(comm, SHOAL_SHMD_READY, g);
}

/* Reduces my segment of window g across all ranks, writing the result to the receive buffer
 * and to my stage (where the peers copy it from) in one pass. In place, the send buffer's
 * segment is still my input: dsts[0] is the stage (it aliases no source), and the receive
 * buffer (equal to my source) is written block by block after the block was read. */
static void shoal_shmd_window_reduce(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                     size_t e0, size_t m, size_t dsize, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->local_size, me = comm->local_rank;
    const void **srcs = (const void **)cs->srcs;
    void *dsts[2];
    size_t so, sl;

    shoal_block_range(m, n, me, &so, &sl);
    for (int q = 0; q < n; q++) {
        srcs[q] = shoal_shmd_buf(cs, q, g) + so * dsize;
    }
    srcs[me] = (const uint8_t *)a->sendbuf + (e0 + so) * dsize;
    dsts[0] = shoal_shmd_buf(cs, me, g) + so * dsize;
    dsts[1] = (uint8_t *)a->recvbuf + (e0 + so) * dsize;
    shoal_reduce_n_multi(dsts, 2, srcs, n, sl, a->dtype, a->op, comm->nranks);
}

static void shoal_shmd_window_copyout(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                      size_t e0, size_t m, size_t dsize, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    uint8_t *out = (uint8_t *)a->recvbuf + e0 * dsize;

    for (int q = 0; q < comm->local_size; q++) {
        size_t qo, ql;
        if (q == comm->local_rank) {
            continue;
        }
        shoal_block_range(m, comm->local_size, q, &qo, &ql);
        memcpy(out + qo * dsize, shoal_shmd_buf(cs, q, g) + qo * dsize, ql * dsize);
    }
}

/* Two-shot, window after window, overlapped: once my segment of window w is reduced and
 * published, I stage window w + 1 before waiting for the peers' segments of w, so a peer that
 * is behind finds w + 1 ready when it gets there; one wait per window and phase, mostly
 * already satisfied.
 *
 * Buffer reuse: staging w + 1 writes buffer set (w + 1) & 1, where peers may still copy my
 * reduced segment of w - 1 out. It writes only the peers' segments of the window, disjoint
 * from mine when both windows have the same size; a shorter last window is staged only after
 * every peer said it reduced w, which it does after its copy-out of w - 1. My own segment of
 * that set is written by the reduction of w + 1, after every peer staged w + 1, which each
 * does after its copy-out of w - 1. The first window of a call starts after the previous call
 * waited for every peer's last "reduced", published after its copy-outs. */
static shoal_status_t shoal_shmd_twoshot(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    shoal_coll_state_t *cs = comm->coll;
    const shoal_coll_args_t *a = r->a;
    int n = comm->local_size;
    size_t dsize = r->dsize, welems = r->welems;

    for (;;) {
        size_t e0 = r->w * welems, m = SHOAL_MIN(welems, a->count - e0), so, sl;
        uint64_t g = r->g0 + r->w;
        uint64_t moved;

        shoal_block_range(m, n, comm->local_rank, &so, &sl);
        /* Phase 1: my segment of each peer's input in, the peers' segments of mine out;
         * phase 2: their reduced segments in, mine out. Both directions: (n - 1) sl + m - sl. */
        moved = ((uint64_t)(n - 1) * sl + (m - sl)) * dsize;
        switch (r->state) {
        case SHOAL_SHMD_S_WINDOW:
            /* one generation at a time: a call that fails (mismatched arguments are found in
             * its first window) leaves every rank at the same generation */
            cs->gen = g;
            r->g = g;
            SHOAL_CHECK(shoal_shmd_pace(comm, moved));
            if (!r->staged) {
                shoal_shmd_window_stage(comm, a, e0, m, dsize, g);
            }
            r->state = SHOAL_SHMD_S_TS_READY;
            r->q = 0;
            /* fall through */
        case SHOAL_SHMD_S_TS_READY:
            SHOAL_CHECK(shoal_shmd_poll_field(comm, r, SHOAL_SHMD_READY, g));
            shoal_shmd_window_reduce(comm, a, e0, m, dsize, g);
            shoal_shmd_publish(comm, SHOAL_SHMD_REDUCED, g);
            r->staged = 0;
            if (r->w + 1 < r->nwin && SHOAL_MIN(welems, a->count - e0 - m) == m) {
                shoal_shmd_window_stage(comm, a, e0 + m, m, dsize, g + 1);
                r->staged = 1;
            }
            r->state = SHOAL_SHMD_S_TS_REDUCED;
            /* fall through */
        case SHOAL_SHMD_S_TS_REDUCED:
            SHOAL_CHECK(shoal_shmd_poll_field(comm, r, SHOAL_SHMD_REDUCED, g));
            shoal_shmd_window_copyout(comm, a, e0, m, dsize, g);
            shoal_meter_add_shm(comm->meter, moved, moved);
            break;
        default:
            return SHOAL_ERR_INTERNAL;
        }
        if (++r->w == r->nwin) {
            return SHOAL_OK;
        }
        r->state = SHOAL_SHMD_S_WINDOW;
    }
}

static shoal_status_t shoal_shmd_twoshot_start(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    r->welems = comm->coll->window / r->dsize;
    r->nwin = (r->a->count + r->welems - 1) / r->welems;
    r->w = 0;
    r->g0 = comm->coll->gen + 1;
    r->staged = 0;
    r->q = 0;
    r->state = SHOAL_SHMD_S_WINDOW;
    return shoal_shmd_twoshot(comm, r);
}

/* ---- the direct path: peers' buffers read and written in place --------------------------- */

/* The peer's buffer va (count bytes) inside its allocation m, mapped here; NULL if not. */
static uint8_t *shoal_shmd_peer_buf(struct shoal_comm *comm, int q, const shoal_tl_mem_t *m,
                                    uint64_t va, size_t bytes)
{
    uint8_t *base;
    if (va < m->base || va - m->base > m->size || bytes > m->size - (va - m->base)) {
        shoal_error(COLL, "local rank %d described a buffer outside its allocation", q);
        return NULL;
    }
    base = comm->shm->ops->mem_map(comm->shm->ctx, q, m);
    return base == NULL ? NULL : base + (va - m->base);
}

/* Every rank's buffers are shoal_mem_alloc buffers, mapped here: I reduce my segment out of
 * every rank's send buffer into every rank's receive buffer in one pass and say so (ready
 * g + 1); the call ends when every rank did (its writes into my receive buffer are done, and
 * it no longer reads mine): SHOAL_SHMD_S_DIRECT_END. */
static shoal_status_t shoal_shmd_direct_mem(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                            size_t dsize, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    int n = comm->local_size, me = comm->local_rank;
    size_t bytes = a->count * dsize, so, sl;
    const void **srcs = (const void **)cs->srcs;
    void **dsts = cs->srcs2;

    shoal_block_range(a->count, n, me, &so, &sl);
    for (int q = 0; q < n; q++) {
        const shoal_shmd_desc_t *d = shoal_shmd_desc(cs, q, g);
        uint8_t *sb = (uint8_t *)a->sendbuf, *rb = a->recvbuf;
        if (q != me) {
            sb = shoal_shmd_peer_buf(comm, q, &d->send_mem, d->send_va, bytes);
            rb = shoal_shmd_peer_buf(comm, q, &d->recv_mem, d->recv_va, bytes);
            if (sb == NULL || rb == NULL) {
                return shoal_comm_set_failed(comm, SHOAL_ERR_TRANSPORT, comm->local_ranks[q],
                                             "cannot map the shoal_mem_alloc buffers of peer "
                                             "%d (%s)", comm->local_ranks[q],
                                             shoal_comm_peer_host(comm, comm->local_ranks[q]));
            }
        }
        srcs[q] = sb + so * dsize;
        dsts[q] = rb + so * dsize;
    }
    /* dsts[0] is rank 0's receive buffer: it aliases srcs[0] only (in place); the others
     * equal their sources exactly (in place) or nothing. */
    shoal_reduce_n_multi(dsts, n, srcs, n, sl, a->dtype, a->op, comm->nranks);
    shoal_shmd_publish(comm, SHOAL_SHMD_READY, g + 1);
    return SHOAL_OK;
}

/* st: what the transport's peer_copy said; a dead peer is SHOAL_ERR_PEER_FAILED, named as
 * every other path names it. */
static shoal_status_t shoal_shmd_cma_failed(struct shoal_comm *comm, int q, shoal_status_t st)
{
    int peer = comm->local_ranks[q], blamed = -1;
    char why[256];
    /* A peer that failed first (its communicator saw another rank die) left the call and may
     * have freed the buffer the copy went to: its notice names the rank to blame. */
    if (comm->shm->ops->peer_check != NULL &&
        comm->shm->ops->peer_check(comm->shm->ctx, q, why, sizeof(why), &blamed) != SHOAL_OK) {
        return shoal_comm_set_failed(comm, SHOAL_ERR_PEER_FAILED,
                                     shoal_comm_culprit(comm, blamed, peer),
                                     "peer %d (%s) failed: %s", peer,
                                     shoal_comm_peer_host(comm, peer), why);
    }
    if (st == SHOAL_ERR_PEER_FAILED) {
        return shoal_comm_set_failed(comm, st, peer, "peer %d (%s) died (its process is gone)",
                                     peer, shoal_comm_peer_host(comm, peer));
    }
    return shoal_comm_set_failed(comm, SHOAL_ERR_TRANSPORT, peer, "single copy with peer %d "
                                 "(%s) failed (the transport's log line says why)", peer,
                                 shoal_comm_peer_host(comm, peer));
}

/* Ordinary buffers, single copies through the kernel: chunk by chunk of my segment, read the
 * peers' inputs into scratch, reduce, write the result into every peer's receive buffer. In
 * place this is safe: the peers' chunks I overwrite are the ones only I read, and I read them
 * first. Then ready g + 1, and the call ends when every rank said it (DIRECT_END). */
static shoal_status_t shoal_shmd_direct_cma(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                            size_t dsize, uint64_t g)
{
    shoal_coll_state_t *cs = comm->coll;
    const shoal_tl_ops_t *ops = comm->shm->ops;
    int n = comm->local_size, me = comm->local_rank;
    size_t so, sl, chunk = SHOAL_MAX(cs->window / (size_t)n / dsize, (size_t)4096 / dsize);
    const void **srcs = (const void **)cs->srcs;
    int inplace = a->sendbuf == a->recvbuf;

    if (cs->cma_scratch == NULL) {
        cs->cma_scratch_size = (size_t)n * chunk * dsize;
        cs->cma_scratch = aligned_alloc(4096, SHOAL_ALIGN_UP(cs->cma_scratch_size, 4096));
        if (cs->cma_scratch == NULL) {
            shoal_error(COLL, "cannot allocate %zu bytes of single-copy scratch",
                        cs->cma_scratch_size);
            return SHOAL_ERR_NO_MEMORY;
        }
    } else if (cs->cma_scratch_size < (size_t)n * chunk * dsize) {
        chunk = cs->cma_scratch_size / (size_t)n / dsize;
    }
    shoal_block_range(a->count, n, me, &so, &sl);
    for (size_t off = 0; off < sl; off += chunk) {
        size_t c = SHOAL_MIN(chunk, sl - off), boff = (so + off) * dsize;
        uint8_t *mine = (uint8_t *)a->recvbuf + boff;
        void *dsts[2] = {mine, NULL};
        int ndst = 1;
        for (int q = 0; q < n; q++) {
            const shoal_shmd_desc_t *d = shoal_shmd_desc(cs, q, g);
            uint8_t *tmp = cs->cma_scratch + (size_t)q * chunk * dsize;
            if (q == me) {
                srcs[q] = (const uint8_t *)a->sendbuf + boff;
                continue;
            }
            shoal_status_t st = ops->peer_copy(comm->shm->ctx, q, 0, tmp, d->send_va + boff,
                                               c * dsize);
            if (st != SHOAL_OK) {
                return shoal_shmd_cma_failed(comm, q, st);
            }
            srcs[q] = tmp;
        }
        if (inplace && me >= 2) {
            /* my receive chunk is my source: reduce into rank 0's scratch copy first. Local
             * rank 1 needs no copy: reduce_n's first pass reads sources 0 and 1 of a block
             * before it writes the block (reduce2 allows dst == b; fp16/bf16 with more
             * sources load every source of the block before the store), and later passes
             * read only the other sources; for rank 2 on, the first pass would overwrite my
             * input before it is read. */
            dsts[0] = (void *)srcs[0];
            dsts[1] = mine;
            ndst = 2;
        }
        shoal_reduce_n_multi(dsts, ndst, srcs, n, c, a->dtype, a->op, comm->nranks);
        for (int q = 0; q < n; q++) {
            shoal_status_t st = q == me ? SHOAL_OK
                                        : ops->peer_copy(comm->shm->ctx, q, 1, mine,
                                                         shoal_shmd_desc(cs, q, g)->recv_va + boff,
                                                         c * dsize);
            if (st != SHOAL_OK) {
                return shoal_shmd_cma_failed(comm, q, st);
            }
        }
    }
    shoal_shmd_publish(comm, SHOAL_SHMD_READY, g + 1);
    return SHOAL_OK;
}

/* Large calls (from SHOAL_SHM_DIRECT_MIN, shoal_shmd_step): every rank publishes its buffers
 * (generation g), then all take the same road from the same descriptions: in place in
 * shoal_mem_alloc buffers when every rank's are, single copies when every rank can make them
 * (SHOAL_SHM_CMA, and the transport's probe), the staged two-shot otherwise. */
static shoal_status_t shoal_shmd_direct(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    shoal_coll_state_t *cs = comm->coll;
    const shoal_coll_args_t *a = r->a;
    size_t bytes = r->bytes, dsize = r->dsize, so, sl;
    int n = comm->local_size;
    uint64_t g = r->g, moved;

    if (r->state == SHOAL_SHMD_S_DESC) {
        /* every peer's description (gen >= g: its ready field is not involved) */
        for (; r->q < n; r->q++) {
            int q = r->q;
            if (q != comm->local_rank) {
                if (!shoal_shmd_test(r, q, &shoal_shmd_sig(cs, q, g)->gen, g, 0, 1, g,
                                     "described its buffers")) {
                    return shoal_shmd_pending(comm, r, q);
                }
                if (SHOAL_UNLIKELY(shoal_shmd_desc_differs(comm, q, g))) {
                    return shoal_shmd_mismatch(comm, r, q, g);
                }
            }
            r->all &= shoal_shmd_desc(cs, q, g)->caps;
        }
        r->q = 0;
        cs->gen++; /* g + 1: the end of the direct path (or unused) */
        SHOAL_CHECK(shoal_shmd_pace(comm, 2 * (bytes - bytes / (size_t)n)));
        if ((r->all & (SHOAL_SHMD_CAP_SMEM | SHOAL_SHMD_CAP_RMEM)) ==
            (SHOAL_SHMD_CAP_SMEM | SHOAL_SHMD_CAP_RMEM)) {
            if (!(cs->shm_logged & 1)) {
                cs->shm_logged |= 1;
                shoal_info(COLL, "rank %d: intra-node AllReduce of %zu bytes in place in "
                           "shoal_mem_alloc buffers (no staging)", comm->rank, bytes);
            }
            SHOAL_CHECK(shoal_shmd_direct_mem(comm, a, dsize, g));
        } else if (r->all & SHOAL_SHMD_CAP_CMA) {
            if (!(cs->shm_logged & 2)) {
                cs->shm_logged |= 2;
                shoal_info(COLL, "rank %d: intra-node AllReduce of %zu bytes by single copies "
                           "(process_vm_readv/writev)", comm->rank, bytes);
            }
            SHOAL_CHECK(shoal_shmd_direct_cma(comm, a, dsize, g));
        } else {
            return shoal_shmd_twoshot_start(comm, r); /* staged, from generation g + 2 */
        }
        r->state = SHOAL_SHMD_S_DIRECT_END;
    }
    SHOAL_CHECK(shoal_shmd_poll_field(comm, r, SHOAL_SHMD_READY, g + 1));
    shoal_block_range(a->count, n, comm->local_rank, &so, &sl);
    moved = ((uint64_t)(n - 1) * sl + (a->count - sl)) * dsize;
    shoal_meter_add_shm(comm->meter, moved, moved);
    return SHOAL_OK;
}

static shoal_status_t shoal_shmd_direct_start(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    shoal_coll_state_t *cs = comm->coll;
    const shoal_tl_ops_t *ops = comm->shm->ops;
    const shoal_coll_args_t *a = r->a;
    uint64_t g = ++cs->gen;
    shoal_shmd_desc_t *d = shoal_shmd_desc(cs, comm->local_rank, g);

    d->caps = 0;
    d->send_va = (uint64_t)(uintptr_t)a->sendbuf;
    d->recv_va = (uint64_t)(uintptr_t)a->recvbuf;
    if (ops->peer_copy_ok(comm->shm->ctx)) {
        d->caps |= SHOAL_SHMD_CAP_CMA;
    }
    /* Shared buffers count only where this rank can map every peer's: the path is taken
     * when every rank's description has both bits, so one that cannot withholds them (else it
     * failed the call, and the communicator, at its first mapping). */
    int reach = ops->mem_reach_ok == NULL || ops->mem_reach_ok(comm->shm->ctx);
    if (reach && ops->mem_query(a->sendbuf, r->bytes, &d->send_mem)) {
        d->caps |= SHOAL_SHMD_CAP_SMEM;
    }
    if (reach && ops->mem_query(a->recvbuf, r->bytes, &d->recv_mem)) {
        d->caps |= SHOAL_SHMD_CAP_RMEM;
    }
    shoal_shmd_desc_put(comm, a, g);
    shoal_shmd_wake(comm);
    r->g = g;
    r->all = ~0u;
    r->state = SHOAL_SHMD_S_DESC;
    return shoal_shmd_direct(comm, r);
}

/* One step of the call: its first, or the one after the state's last test failed. */
static shoal_status_t shoal_shmd_step(struct shoal_comm *comm, shoal_shmd_run_t *r)
{
    shoal_coll_state_t *cs = comm->coll;

    switch (r->state) {
    case SHOAL_SHMD_S_START:
        r->dsize = shoal_dtype_esize(r->a->dtype);
        r->bytes = r->a->count * r->dsize;
        r->q = 0;
        if (r->bytes <= SHOAL_MIN(cs->tune.value[SHOAL_TUNE_SHM_LL_MAX], SHOAL_SHMD_LL_MAX)) {
            return shoal_shmd_ll_start(comm, r);
        }
        if (r->bytes <= SHOAL_MIN(cs->shape.shm_oneshot_max, cs->window)) {
            return shoal_shmd_oneshot_start(comm, r);
        }
        if (cs->peer_mem && r->bytes >= cs->shm_direct_min) {
            return shoal_shmd_direct_start(comm, r);
        }
        return shoal_shmd_twoshot_start(comm, r);
    case SHOAL_SHMD_S_LL:
        return shoal_shmd_ll_poll(comm, r);
    case SHOAL_SHMD_S_ONESHOT:
        return shoal_shmd_oneshot_poll(comm, r);
    case SHOAL_SHMD_S_WINDOW:
    case SHOAL_SHMD_S_TS_READY:
    case SHOAL_SHMD_S_TS_REDUCED:
        return shoal_shmd_twoshot(comm, r);
    case SHOAL_SHMD_S_DESC:
    case SHOAL_SHMD_S_DIRECT_END:
        return shoal_shmd_direct(comm, r);
    case SHOAL_SHMD_S_MISMATCH:
        return shoal_shmd_mismatch_poll(comm, r);
    default:
        return SHOAL_ERR_INTERNAL;
    }
}

/* A blocking call drives the plan's steps on its own thread; its idle step polls the flag
 * the step said it waits for, then yields, then sleeps on our futex (shoal_shmd_wait_slow).
 * The plan lives on the stack: a small call whose peers are there ends in the first step. */
shoal_status_t shoal_shmdirect_allreduce(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    shoal_shmd_run_t r;

    r.a = a;
    r.state = SHOAL_SHMD_S_START;
    r.proxied = 0;
    r.slow = 0;
    for (;;) {
        shoal_status_t st = shoal_shmd_step(comm, &r);
        if (SHOAL_LIKELY(st != SHOAL_IN_PROGRESS)) {
            return st;
        }
        for (unsigned i = 0; !shoal_shmd_waited(&r); i++) {
            if (i >= comm->pause_spins) {
                r.slow = 1;
                SHOAL_CHECK(shoal_shmd_wait_slow(comm, &r));
                break;
            }
            shoal_cpu_relax();
        }
    }
}

/* ---- the nonblocking call: the same steps, advanced by the proxy beside other plans -----
 * The plan uses no channel (npeers 0): plans of other collectives of the communicator move
 * meanwhile. Intra-node AllReduces of one communicator share its areas and generations: each
 * takes a turn at its build (issue order) and starts when every earlier one was released. */
typedef struct {
    shoal_coll_plan_t cp;
    shoal_shmd_run_t r;
    uint64_t turn;
} shoal_shmd_plan_t;

static shoal_status_t shoal_shmd_plan_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_shmd_plan_t *p = (shoal_shmd_plan_t *)plan;
    shoal_status_t st;

    if (p->r.state == SHOAL_SHMD_S_START && p->turn != comm->coll->shm_served) {
        return SHOAL_IN_PROGRESS; /* an earlier one is in flight */
    }
    st = shoal_shmd_step(comm, &p->r);
    if (st == SHOAL_IN_PROGRESS) {
        p->cp.base.wait_peer = comm->local_ranks[p->r.wq];
    }
    return st;
}

/* The proxy's sleep while this plan alone is in flight: on our futex, which the peers ring
 * when they publish (the transports' sleep would not hear them: up to 1 ms late). Only when
 * the step recorded a flag not there yet. */
static int shoal_shmd_plan_sleep(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_shmd_plan_t *p = (shoal_shmd_plan_t *)plan;
    if (p->r.state == SHOAL_SHMD_S_START || p->r.wflag == NULL || shoal_shmd_waited(&p->r)) {
        return 0;
    }
    shoal_shmd_sleep(comm, &p->r);
    return 1;
}

static void shoal_shmd_plan_release(struct shoal_comm *comm, shoal_plan_t *plan,
                                    shoal_status_t st)
{
    comm->coll->shm_served++;
    shoal_coll_plan_release(comm, plan, st);
}

shoal_status_t shoal_shmdirect_allreduce_plan(struct shoal_comm *comm, shoal_coll_plan_t **cp_p,
                                              const shoal_coll_args_t *a, uint32_t seq,
                                              int exclusive)
{
    shoal_shmd_plan_t *p;
    (void)exclusive; /* no scratch: the shared areas */
    SHOAL_CHECK(shoal_coll_plan_alloc(comm, a, seq, sizeof(*p), 1, (shoal_coll_plan_t **)&p));
    p->cp.base.progress = shoal_shmd_plan_progress;
    p->cp.base.release = shoal_shmd_plan_release;
    p->cp.base.sleep = shoal_shmd_plan_sleep;
    p->cp.base.npeers = 0;
    p->r.a = &p->cp.a;
    p->r.state = SHOAL_SHMD_S_START;
    p->r.proxied = 1;
    p->turn = comm->coll->shm_issued++;
    *cp_p = &p->cp;
    return SHOAL_OK;
}

void shoal_shmdirect_fini(struct shoal_comm *comm)
{
    shoal_coll_state_t *cs = comm->coll;
    free(cs->cma_scratch);
    cs->cma_scratch = NULL;
}
