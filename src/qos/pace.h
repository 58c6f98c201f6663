/* In-library pacing (DESIGN.md section 7, QoS): a token bucket per communicator and process,
 * consulted by the data path before a chunk is handed to a transport, for the paths no kernel
 * or fabric hook limits (shared memory; TCP where tc cannot be set up) and for a provider's
 * hard cap.
 *
 * The hook (narrow, in the core): shoal_chan_isend paces every message a channel sends, on
 * every transport (shm rings, tcp, ucx, ib), and the intra-node direct AllReduce
 * (src/coll/shmdirect.c), which copies through shared areas without channel messages, paces
 * what its peers take from its area per window. Both pace exactly the payload bytes the meter
 * counts as sent (shoal_stats_t.bytes_sent), so the rate is checked against those counters.
 * Without a rate (neither SHOAL_QOS_RATE_MAX nor SHOAL_QOS_RATES), comm->pace is NULL and the
 * hook is one predictable branch; no lock anywhere (one writer: the ticket holder).
 *
 * Where the rate comes from: the hard cap SHOAL_QOS_RATE_MAX, and the rate the node agent
 * publishes in the rates page (pace_page.h, path SHOAL_QOS_RATES); the smaller non-zero one
 * applies. Both are a communicator's rate on one host: each of its ranks on the host gets an
 * equal part (rate / local ranks).
 *
 * Granularity (latency isolation): tokens are taken SHOAL_QOS_PACE_STEP (64 KiB) at a time, so
 * a paced bulk (spot) communicator hands at most one step more than its share to the
 * transports between two looks at the bucket; with its rate held to its share, the memory
 * bandwidth and CPU left to a guaranteed communicator's small messages is at least the rest,
 * and they never wait behind more than one 64 KiB step of the bulk job (a few microseconds of
 * copying on shared memory). The bucket holds at least two steps and 5 ms of the rate, so that
 * a sleep's overshoot or a preemption on a loaded host does not lose tokens (the rate would
 * fall short of its target: measured -1.3% at 128 MiB/s a rank with 1 ms on 2 loaded CPUs);
 * a job that was held up can then catch up by that much at full speed, no more.
 *
 * Cost (the 2% overhead of QoS on for a tenant alone): a take of at most one step that finds
 * the tokens in hand reads no clock; only every SHOAL_QOS_PACE_FAST-th take, or one that
 * runs out, reads it and refills for the whole time since the last read (a lazy bucket: the
 * same rate; a bucket that would have been full meanwhile lets through at most one bucket
 * more). The rates page is then looked at as before. A clock read is 10-70 ns here, one
 * quarter to one tenth of a 2-rank 8 B AllReduce on shared memory.
 *
 * Never a hang: a wait for tokens sleeps in steps of at most 1 ms, checks the communicator's
 * abort flag each step (SHOAL_ERR_ABORTED) and stops holding back at the deadline (a warning,
 * once); rates below SHOAL_QOS_PACE_RATE_MIN are raised to it (a 64 KiB step waits at most
 * 1 s). A dead agent (its page gone or no longer updated) leaves its last rate in force until
 * SHOAL_QOS_RATES_TIMEOUT, then full speed (the hard cap still applies).
 */
#ifndef SHOAL_QOS_PACE_H
#define SHOAL_QOS_PACE_H

#include "core/core.h"
#include "qos/pace_page.h"

/* SHOAL_* variables of the pacer (pace_config.c). */
typedef struct {
    size_t rate_max;           /* SHOAL_QOS_RATE_MAX, bytes/s, 0 = none */
    size_t burst;              /* SHOAL_QOS_BURST, bytes */
    const char *rates;         /* SHOAL_QOS_RATES: the rates page, NULL/none = none */
    int rates_timeout_ms;      /* SHOAL_QOS_RATES_TIMEOUT */
} shoal_qos_pace_config_t;
extern SHOAL_HIDDEN shoal_qos_pace_config_t shoal_qos_pace_config;

#define SHOAL_QOS_PACE_STEP (64u * 1024)          /* bytes through the bucket at a time */
#define SHOAL_QOS_PACE_RATE_MIN (64ull * 1024)    /* bytes/s: the slowest rate applied */
#define SHOAL_QOS_PACE_CHECK_NS 2000000ull        /* the rates page at most every 2 ms */
#define SHOAL_QOS_PACE_REOPEN_NS 1000000000ull    /* look for a (new) page once a second */
#define SHOAL_QOS_PACE_SLEEP_NS 1000000ull        /* longest sleep between two looks */
#define SHOAL_QOS_PACE_SLACK_NS 5000000ull        /* the bucket holds at least this much */
#define SHOAL_QOS_PACE_FAST 32                   /* takes at most between two clock reads */

typedef struct {
    uint64_t rate_max;         /* bytes/s of this pacer (already divided), 0 = none */
    uint64_t burst;            /* bytes, 0 = default */
    const char *rates_path;    /* rates page file, NULL = none (copied) */
    int rates_timeout_ms;      /* agent silent this long: full speed; < 0 = never */
    unsigned share_div;        /* the page's rate is divided by this (local ranks), >= 1 */
    const int *abort_flag;     /* read with acquire; NULL = none */
    int wait_timeout_ms;       /* take(deadline 0): the longest hold-back of one call; < 0 none */
} shoal_qos_pace_params_t;

typedef struct shoal_qos_pacer {
    uint64_t rate;             /* in force, bytes/s; 0 = not paced */
    uint64_t rate_max;         /* hard cap, 0 = none */
    uint64_t rate_agent;       /* from the rates page (divided), 0 = none */
    uint64_t burst_cfg;
    double burst;              /* bucket size in force, bytes */
    double tokens;             /* bytes available */
    uint64_t last_ns;          /* tokens are as of this time (less the fast takes since) */
    unsigned fast_left;        /* takes left before the next clock read */
    uint64_t checked_ns;       /* last look at the rates page (a later time than now: the
                                * clock stepped back; look again) */
    /* the rates page */
    char *path;
    int page_fd;               /* the page, open read-only (read with pread), or -1 */
    uint64_t page_ino, page_dev;
    uint64_t refused_ino;      /* the last page refused as untrusted or as no rates page
                                * (warned once) */
    int open_errno;            /* the last open's error other than ENOENT (warned once) */
    uint64_t page_gen;         /* last gen seen */
    uint64_t page_seen_ns;     /* when gen last moved (or the page was opened) */
    uint64_t next_open_ns;     /* next attempt to (re)open the path */
    int timeout_ms;
    unsigned share_div;
    int agent_dead;            /* the timeout passed: agent's rate dropped */
    int warned_deadline;
    uint64_t call;             /* the call of the last take_call, and ... */
    uint64_t call_deadline;    /* ... the end of its hold-back (0: it has not waited yet) */
    const int *abort_flag;
    int wait_timeout_ms;
    int tsc;                   /* its clock: the meter's TSC (1) or CLOCK_MONOTONIC (0) */
    uint64_t clock_reads;      /* how often it read its clock (the Cost above, for the tests) */
    /* time held back, ns: *paced_ctr (the meter page's paced_ns, or own) */
    uint64_t paced_own;
    uint64_t *paced_ctr;
    uint64_t *rate_ctr;        /* the meter page's pace_rate, or NULL */
} shoal_qos_pacer_t;

/* A pacer; SHOAL_ERR_NO_MEMORY. The rates page need not exist yet. */
SHOAL_HIDDEN shoal_status_t shoal_qos_pace_create(const shoal_qos_pace_params_t *params,
                                                  shoal_qos_pacer_t **pacer_p);
SHOAL_HIDDEN void shoal_qos_pace_destroy(shoal_qos_pacer_t *p);
/* The fast path of a take (see Cost above): 1 when bytes went without a clock read. */
static inline int shoal_qos_pace_fast(shoal_qos_pacer_t *p, size_t bytes)
{
    if (SHOAL_LIKELY(p->fast_left > 0 && bytes <= SHOAL_QOS_PACE_STEP &&
                     (p->rate == 0 || p->tokens >= (double)bytes))) {
        p->fast_left--;
        if (p->rate != 0) {
            p->tokens -= (double)bytes;
        }
        return 1;
    }
    return 0;
}
/* Waits until bytes may go (in steps of SHOAL_QOS_PACE_STEP). SHOAL_OK, or
 * SHOAL_ERR_ABORTED when the abort flag was set while waiting. Past deadline_ns
 * (CLOCK_MONOTONIC as shoal_deadline_ns; UINT64_MAX: none; 0: wait_timeout_ms after the
 * wait began, so that a call that need not wait reads no clock for it) it stops holding back
 * (never a hang). Without a wait: one clock read (the TSC where the meter has it) and a few
 * flops. */
SHOAL_HIDDEN shoal_status_t shoal_qos_pace_take(shoal_qos_pacer_t *p, size_t bytes,
                                                uint64_t deadline_ns);
/* The same for one of the takes of a call (call: its identity): the hold-back of all of the
 * call's takes ends wait_timeout_ms after its first wait; after that its takes wait no more. */
SHOAL_HIDDEN shoal_status_t shoal_qos_pace_take_call(shoal_qos_pacer_t *p, size_t bytes,
                                                     uint64_t call);
/* The rate in force now (bytes/s, 0 = none), after a look at the rates page. */
SHOAL_HIDDEN uint64_t shoal_qos_pace_rate(shoal_qos_pacer_t *p);
static inline uint64_t shoal_qos_pace_held_ns(const shoal_qos_pacer_t *p)
{
    return __atomic_load_n(p->paced_ctr, __ATOMIC_RELAXED);
}

/* ---- the communicator's pacer (comm->pace) ---- */
/* After the meter's init: comm->pace = a pacer when a rate is configured, else NULL. */
SHOAL_HIDDEN shoal_status_t shoal_qos_pace_comm_init(struct shoal_comm *comm);
SHOAL_HIDDEN void shoal_qos_pace_comm_fini(struct shoal_comm *comm);
/* The data path's hook: call only when comm->pace != NULL. Fails the communicator on abort.
 * The fast path is inline: a few instructions on the data path, no call. */
SHOAL_HIDDEN shoal_status_t shoal_qos_pace_comm_take_slow(struct shoal_comm *comm, size_t bytes);
static inline shoal_status_t shoal_qos_pace_comm_take(struct shoal_comm *comm, size_t bytes)
{
    if (SHOAL_LIKELY(shoal_qos_pace_fast(comm->pace, bytes))) {
        return SHOAL_OK;
    }
    return shoal_qos_pace_comm_take_slow(comm, bytes);
}

#endif
