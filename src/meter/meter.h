/* Metering (DESIGN.md section 7): a communicator's exact counters in a page the library can
 * share with the node agent (meter_page.h is the contract), shoal_comm_stats, and the
 * registration with the agent.
 *
 * How the data path reaches the counters (the narrow hook of the core):
 *  - each channel carries two counter pointers (shoal_chan_t.meter_sent / meter_recv) into the
 *    page, for its (transport, locality) pair; shoal_chan_isend / shoal_chan_irecv add the
 *    payload length of every message the transport accepted, once, without the wire header;
 *  - the intra-node direct path (src/coll/shmdirect.c), which moves data through shared areas
 *    without channel messages, adds to the shm / same-host pair what it takes from peers'
 *    areas (received) and what peers take from its own area (sent), see shmdirect.c;
 *  - the API layer (src/coll/api.c) brackets every call that ran: seqlock, ops, coll_ticks,
 *    errors, peer failures; the time is two reads of the call path's clock (shoal_ticks, the
 *    TSC): the call's entry read, which the CUDA layer's driver check shares, and one at the
 *    end; their difference is added in ticks (readers convert to ns with the rate the page
 *    publishes, meter_page.h: no multiply per call); shoal_comm_abort counts aborts;
 *  - the CUDA layer (src/cuda) brackets a stream-ordered call's task on the proxy thread from
 *    the moment the stream reached it to the moment it released the stream (stream order),
 *    and a blocking device call like a host one; its device-to-device copies through CUDA IPC
 *    count as transport cuda_ipc, same host (shoal_meter_add_cuda_ipc).
 * One writer at a time (the thread holding the communicator's ticket): plain relaxed atomic
 * stores, no read-modify-write, no lock. The rare counters written from outside the ticket
 * (errors of calls refused before they ran, aborts) use atomic adds, on every writer.
 */
#ifndef SHOAL_METER_H
#define SHOAL_METER_H

#include "core/core.h"
#include "meter/meter_page.h"

/* SHOAL_* variables of the metering module (meter_config.c). */
typedef struct {
    int enabled;               /* SHOAL_METER */
    const char *gpus;          /* SHOAL_METER_GPUS */
    const char *agent;         /* SHOAL_AGENT */
    int agent_required;        /* SHOAL_AGENT_REQUIRED */
    int agent_uid;             /* SHOAL_AGENT_UID, -1 none */
} shoal_meter_config_t;
extern SHOAL_HIDDEN shoal_meter_config_t shoal_meter_config;

#define SHOAL_METER_CRED_MAX 512   /* = SHOAL_TENANT_CRED_TEXT_MAX */
#define SHOAL_METER_AGENT_MS 200   /* the longest a registration may take */

/* The meter's clock is the call path's (src/util/util.h, shoal_ticks: the TSC where it is
 * invariant, one rdtsc), so that one read at a call's entry serves the CUDA layer's check and
 * the meter (src/coll/api.c). The names below are kept for src/qos/pace.c. */
#define shoal_meter_clock shoal_tick_clock
static inline uint64_t shoal_meter_ticks(void)
{
    return shoal_ticks();
}

static inline uint64_t shoal_meter_ticks_ns(uint64_t ticks)
{
    return shoal_ticks_ns(ticks);
}

struct shoal_meter {
    shoal_meter_page_t *page;  /* first: the counters */
    uint64_t next_check;       /* meter clock ticks of the next check (clock, agent) */
    uint32_t depth;            /* the proxy's metered calls begun and not ended (writer only;
                                * shoal_meter_plan_begin) */
    int memfd;                 /* the page's memfd, -1 if the page is anonymous */
    int sock;                  /* connection to the agent, -1 when none */
    int agent_state;           /* SHOAL_METER_AGENT_* */
    int agent_fails;           /* registrations in a row that an agent did not answer */
    uint64_t agent_retry;      /* meter clock ticks: after such failures, no try before */
    size_t cred_len;
    char cred[SHOAL_METER_CRED_MAX]; /* credential text sent at registration (a secret; wiped
                                      * once none can send it, meter_agent.c) */
};

enum {
    SHOAL_METER_AGENT_NONE = 0,   /* no agent (yet): look for one at the next check */
    SHOAL_METER_AGENT_REGISTERED, /* the agent accepted the page */
    SHOAL_METER_AGENT_REFUSED,    /* the agent refused it: never asked again */
    SHOAL_METER_AGENT_OFF         /* SHOAL_AGENT=none */
};

/* Creates the page (memfd, sealed, mapped, faulted in), fills the identity, sets every
 * channel's counter pointers and registers with the agent. Called by comm.c once the
 * communicator works (after the init traffic of the topology). With SHOAL_METER=0 it leaves
 * comm->meter NULL. Fails only when SHOAL_AGENT_REQUIRED=1 and the agent is absent or refuses
 * (or memory is short). */
SHOAL_HIDDEN shoal_status_t shoal_meter_comm_init(struct shoal_comm *comm);
/* The page's state becomes CLOSED, then the agent connection closes (the agent's sign that
 * the communicator ended), then the page goes. */
SHOAL_HIDDEN void shoal_meter_comm_fini(struct shoal_comm *comm);
/* At init (meter_agent.c): register the page if an agent listens at SHOAL_AGENT (at most
 * SHOAL_METER_AGENT_MS). SHOAL_OK unless SHOAL_AGENT_REQUIRED=1 and the agent is absent
 * (SHOAL_ERR_SYSTEM), silent (SHOAL_ERR_TIMEOUT), its socket not this process's to connect to
 * (SHOAL_ERR_PERMISSION) or it refuses (the status it answered). */
SHOAL_HIDDEN shoal_status_t shoal_meter_agent_register_init(struct shoal_meter *m);
/* Out of line, at most once a second from shoal_meter_call_end: refine the clock rate,
 * re-register with an agent that restarted (or appeared). */
SHOAL_HIDDEN void shoal_meter_check(struct shoal_meter *m, uint64_t now_ticks);
/* The page's tick conversion follows the rate nmult (ns per tick << 32; meter_page.h,
 * coll_ticks): the slot not in force gets the value now as its start and the new rate, then
 * becomes the one in force; nothing if the rate in force is nmult. The writer alone calls it
 * (shoal_meter_check, in the call that holds the ticket, at its end; a test between calls). */
SHOAL_HIDDEN void shoal_meter_tick_rebase(shoal_meter_page_t *p, uint64_t nmult);
SHOAL_HIDDEN void shoal_meter_agent_check(struct shoal_meter *m);
/* GPUs of SHOAL_METER_GPUS / CUDA_VISIBLE_DEVICES: count, ordinals in gpus[] (-1 unknown);
 * -1 for a count:N whose N is not a number. */
SHOAL_HIDDEN int shoal_meter_gpus_parse(const char *text, int32_t *gpus, int max);

/* ---- hot path helpers ---------------------------------------------------------------- */

/* The single writer's increment: a relaxed load and store, no read-modify-write. */
static inline void shoal_meter_add(uint64_t *ctr, uint64_t n)
{
    __atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}

/* A call that holds its ticket starts: seq becomes odd. Its entry time is the call path's
 * clock read at the call's entry (src/coll/api.c), which the CUDA layer's check shares: the
 * meter adds one clock read per call (at the end), not two. */
static inline void shoal_meter_call_enter(struct shoal_meter *m)
{
    shoal_meter_page_t *p = m->page;
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

/* The same with its own clock read (the proxy thread, the CUDA layer's tasks): returns the
 * entry time. */
static inline uint64_t shoal_meter_call_begin(struct shoal_meter *m)
{
    shoal_meter_call_enter(m);
    return shoal_ticks();
}

static inline int shoal_meter_is_peer_failure(shoal_status_t st)
{
    return st == SHOAL_ERR_PEER_FAILED || st == SHOAL_ERR_TRANSPORT || st == SHOAL_ERR_TIMEOUT;
}

/* The call ends with st: ops, time, errors; seq becomes even again.
 * Its cost is one clock read (rdtsc: 7.5-8.4 ns back to back on a 2.6 GHz Xeon, about 7 ns
 * after a wait, where a call ends) and 24 instructions (perf/meter_overhead.sh). The time
 * goes into the page in ticks: readers convert (meter_page.h); the multiply per call of page
 * version 1 took 5 instructions and about 1 ns more back to back.
 * The read stays on the critical path on purpose: a read inside the last wait (overlapping
 * the peer's cache line) would miss the work after it (the reduction of the last lines, the
 * return; more for larger payloads), a systematic undercount; an entry read after the rank
 * published its input would miss the call's setup and copy-in. Exact per-call time needs a
 * read before the call's first step and one after its last. */
static inline uint64_t shoal_meter_call_count(struct shoal_meter *m, int type, shoal_status_t st,
                                              uint64_t t0)
{
    shoal_meter_page_t *p = m->page;
    uint64_t now = shoal_ticks();
    shoal_meter_add(&p->ops[type], 1);
    shoal_meter_add(&p->coll_ticks, now - t0); /* ticks: readers convert (meter_page.h) */
    if (SHOAL_UNLIKELY(st != SHOAL_OK)) {
        __atomic_fetch_add(&p->errors, 1, __ATOMIC_RELAXED);
        if (shoal_meter_is_peer_failure(st)) {
            shoal_meter_add(&p->peer_failures, 1);
        }
    }
    return now;
}

static inline void shoal_meter_call_end(struct shoal_meter *m, int type, shoal_status_t st,
                                        uint64_t t0)
{
    shoal_meter_page_t *p = m->page;
    uint64_t now = shoal_meter_call_count(m, type, st, t0);
    __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELEASE);
    if (SHOAL_UNLIKELY(now >= m->next_check)) {
        shoal_meter_check(m, now);
    }
}

/* The proxy thread's calls (plans, the CUDA layer's tasks) overlap: several have begun and
 * not ended. seq is odd from the first one's begin to the last one's end; begin and end per
 * call would leave it even while two are in flight, and a reader take bytes of a call without
 * its op for a consistent snapshot. A blocking call runs only when none is in flight (it
 * waits for the proxy's ticket): it keeps the plain enter / end above. */
static inline uint64_t shoal_meter_plan_begin(struct shoal_meter *m)
{
    if (m->depth++ == 0) {
        shoal_meter_call_enter(m);
    }
    return shoal_ticks();
}

static inline void shoal_meter_plan_end(struct shoal_meter *m, int type, shoal_status_t st,
                                        uint64_t t0)
{
    shoal_meter_page_t *p = m->page;
    uint64_t now = shoal_meter_call_count(m, type, st, t0);
    if (--m->depth == 0) {
        __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELEASE);
    }
    if (SHOAL_UNLIKELY(now >= m->next_check)) {
        shoal_meter_check(m, now);
    }
}

/* A call refused before it ran (invalid argument, unusable communicator): any thread. */
static inline void shoal_meter_count_refused(struct shoal_meter *m)
{
    if (m != NULL) {
        __atomic_fetch_add(&m->page->errors, 1, __ATOMIC_RELAXED);
    }
}

/* shoal_comm_abort (any thread). */
static inline void shoal_meter_count_abort(struct shoal_meter *m)
{
    if (m != NULL) {
        __atomic_fetch_add(&m->page->aborts, 1, __ATOMIC_RELAXED);
    }
}

/* The intra-node direct path moved bytes: shm, same host. */
static inline void shoal_meter_add_shm(struct shoal_meter *m, uint64_t sent, uint64_t recv)
{
    if (m != NULL) {
        shoal_meter_add(&m->page->bytes_sent[SHOAL_METER_TL_SHM][SHOAL_METER_SAME_HOST], sent);
        shoal_meter_add(&m->page->bytes_recv[SHOAL_METER_TL_SHM][SHOAL_METER_SAME_HOST], recv);
    }
}

/* The CUDA layer's IPC path moved device bytes between the GPUs of this host. */
static inline void shoal_meter_add_cuda_ipc(struct shoal_meter *m, uint64_t sent, uint64_t recv)
{
    if (m != NULL) {
        shoal_meter_add(&m->page->cuda_ipc_sent, sent);
        shoal_meter_add(&m->page->cuda_ipc_recv, recv);
    }
}

/* An AllReduce delegated to NCCL completed: its ring-equivalent bytes (meter_page.h). */
static inline void shoal_meter_add_nccl(struct shoal_meter *m, uint64_t sent, uint64_t recv)
{
    if (m != NULL) {
        shoal_meter_add(&m->page->nccl_sent, sent);
        shoal_meter_add(&m->page->nccl_recv, recv);
    }
}

/* The ring-equivalent bytes of an AllReduce of bytes on n ranks: floor(2 (n - 1) bytes / n),
 * what each rank counts as sent and as received (meter_page.h, nccl_sent). */
static inline uint64_t shoal_meter_ring_bytes(uint64_t bytes, int n)
{
    if (n < 2) {
        return 0;
    }
    return (uint64_t)((unsigned __int128)bytes * (unsigned)(2 * (n - 1)) / (unsigned)n);
}

#endif
