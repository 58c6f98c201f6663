/* The metering page: a communicator's exact counters, written by the library alone, read by
 * shoal_comm_stats() and, through a shared memfd, by the node agent shoald (DESIGN.md section
 * 7). This header is the contract between the two: plain C, no library internals, so the
 * agent (src/agent) includes it without linking libshoal.
 *
 * Writer: the thread running the communicator's current collective (calls are serialised by
 * the communicator's tickets, so there is one writer at a time). Every counter is a u64 that
 * only grows, stored with a relaxed atomic store (no read-modify-write atomics on the hot
 * path: the writer owns the line). Readers load each counter with a relaxed atomic load; a
 * reader that needs one consistent snapshot of all counters uses the seqlock `seq` (odd while
 * the writer is between updates of one call). Deltas between two reads are exact.
 *
 * Registration with the agent (UNIX stream socket, SHOAL_AGENT, default
 * /run/shoal/shoald.sock): the library sends one shoal_meter_reg_t with the memfd holding the
 * page attached as SCM_RIGHTS; the agent answers one shoal_meter_reg_reply_t. The agent takes
 * the process's identity from SO_PEERCRED, never from the message, and checks the tenant claim
 * against the credential (src/tenant/cred.c) before it accepts the page.
 */
#ifndef SHOAL_METER_PAGE_H
#define SHOAL_METER_PAGE_H

#include <stdint.h>

#define SHOAL_METER_MAGIC 0x52544d53u /* "SMTR" */
/* 2: time inside collectives in ticks (coll_ticks and its conversion, below; coll_ns stays 0
 * from such a library). Readers accept 1 and 2: the fields of version 2 are 0 in a page of
 * version 1 (they were spare), where shoal_meter_page_coll_ns gives coll_ns. */
#define SHOAL_METER_VERSION 2
#define SHOAL_METER_VERSION_MIN 1
#define SHOAL_METER_PAGE_BYTES 4096
#define SHOAL_METER_NAME_MAX 64       /* = SHOAL_TENANT_NAME_MAX */
#define SHOAL_METER_MAX_GPUS 16
/* ngpus counts every GPU the rank declared (count:N, or a list of CUDA_VISIBLE_DEVICES
 * entries, MIG instances included), gpus[] names the first SHOAL_METER_MAX_GPUS: a count is
 * at most this. */
#define SHOAL_METER_NGPUS_MAX 4096

/* Collectives counted (same order as src/coll's shoal_coll_type_t). */
enum {
    SHOAL_METER_ALLREDUCE = 0,
    SHOAL_METER_BROADCAST,
    SHOAL_METER_REDUCE,
    SHOAL_METER_ALLGATHER,
    SHOAL_METER_REDUCE_SCATTER,
    SHOAL_METER_BARRIER,
    SHOAL_METER_SEND,
    SHOAL_METER_RECV,
    SHOAL_METER_ALLTOALL,
    SHOAL_METER_NCOLL
};

/* Transports (registry names) and localities counted in bytes_sent / bytes_recv. CUDA IPC
 * (device to device on one host) has its own pair of counters, after the abuse signals:
 * readers report it as transport SHOAL_METER_TL_CUDA_IPC, same host. So has the NCCL
 * delegate (nccl_sent / nccl_recv, out of spare): transport SHOAL_METER_TL_NCCL, same host. */
enum { SHOAL_METER_TL_SHM = 0, SHOAL_METER_TL_TCP, SHOAL_METER_TL_UCX, SHOAL_METER_TL_IB,
       SHOAL_METER_NTL };
#define SHOAL_METER_TL_CUDA_IPC SHOAL_METER_NTL
#define SHOAL_METER_TL_NCCL (SHOAL_METER_NTL + 1)
enum { SHOAL_METER_SAME_HOST = 0, SHOAL_METER_OTHER_HOST, SHOAL_METER_NLOC };

/* Page states (field state). */
enum { SHOAL_METER_LIVE = 1, SHOAL_METER_CLOSED = 2 /* shoal_comm_destroy ran */ };

typedef struct {
    /* ---- header and identity: written once at init, before the page is shared ---- */
    uint32_t magic;                      /* SHOAL_METER_MAGIC */
    uint32_t version;                    /* SHOAL_METER_VERSION */
    uint32_t size;                       /* sizeof(shoal_meter_page_t) */
    uint32_t state;                      /* SHOAL_METER_LIVE / CLOSED (atomic) */
    char tenant[SHOAL_METER_NAME_MAX];   /* as the job claims it; the agent checks it */
    char job[SHOAL_METER_NAME_MAX];
    uint64_t epoch;
    uint32_t comm_id;
    int32_t rank;
    int32_t nranks;
    int32_t qos_class;                   /* shoal_qos_class_t */
    int32_t qos_weight;
    int32_t ngpus;                       /* GPUs this rank declared or uses, at most
                                          * SHOAL_METER_NGPUS_MAX */
    int32_t gpus[SHOAL_METER_MAX_GPUS];  /* their indices (CUDA ordinal), -1 unused */
    int32_t pid;
    uint32_t pad0;
    uint64_t created_unix_ns;            /* CLOCK_REALTIME at init */
    uint64_t pad1[4];
    /* ---- counters: monotonic, single writer ---- */
    uint64_t seq;                        /* seqlock: odd while a call's counters change */
    uint64_t ops[SHOAL_METER_NCOLL];     /* calls completed (successfully or not) */
    uint64_t bytes_sent[SHOAL_METER_NTL][SHOAL_METER_NLOC]; /* payload bytes, no headers */
    uint64_t bytes_recv[SHOAL_METER_NTL][SHOAL_METER_NLOC];
    uint64_t coll_ns;                    /* time inside collective calls (host side), ns, from
                                          * a library of version 1 (0 from version 2, which
                                          * counts coll_ticks): read shoal_meter_page_coll_ns */
    uint64_t errors;                     /* calls that returned an error */
    uint64_t peer_failures;              /* SHOAL_ERR_PEER_FAILED / TRANSPORT / TIMEOUT */
    uint64_t aborts;                     /* the application called shoal_comm_abort */
    uint64_t paced_ns;                   /* time held back by QoS pacing (src/qos/pace.c) */
    uint64_t pace_rate;                  /* pacing rate in force, bytes/s of this rank, 0 none
                                          * (a gauge, not a counter) */
    /* ---- abuse signals of the process (src/tenant/breaker.h: one table per process, shared
     * by its communicators): the same values in every page of the process, so a reader takes
     * the largest over a process's pages, never their sum. Monotonic, relaxed stores, written
     * outside the seqlock at init, at the once-a-second check of a call and at destroy (not
     * per call). 0 from a library that predates them (they were spare). ---- */
    uint64_t auth_failed;                /* failed authentications on the join listeners */
    uint64_t auth_refused;               /* connections refused while a breaker was open */
    uint64_t breaker_opened;             /* times a breaker opened against a source */
    /* ---- device-to-device payload bytes between the GPUs of ranks on one host through CUDA
     * IPC (src/cuda/cuda_ipc.c; transport "cuda_ipc", locality same host by construction):
     * what this rank's device read from peers' device buffers (recv) and what peers' devices
     * read from its own (sent). Single writer, like bytes_sent. 0 from a library that
     * predates them (they were spare). ---- */
    uint64_t cuda_ipc_sent;
    uint64_t cuda_ipc_recv;
    /* ---- time inside collective calls (host side) in ticks of the library's call path
     * clock (the invariant TSC, else ns), version 2: the hot path adds ticks, no conversion;
     * readers convert with shoal_meter_page_coll_ns. The conversion is piecewise linear and
     * continuous: tick_conv[tick_slot] = {ticks0, ns0, mult} gives ns0 + (coll_ticks - ticks0)
     * * mult / 2^32 (mult: ns per tick << 32). About once a second the writer refines the rate:
     * it writes the other slot with ticks0 = coll_ticks now, ns0 = the value now (the same
     * formula, so the value does not jump) and the new mult, then release-stores tick_slot
     * (atomic) one higher: tick_slot counts the rebases, the slot in force is its low bit
     * (a library before this wrote 0 or 1). A reader takes the slot and coll_ticks again if
     * tick_slot moved meanwhile (a seqlock of its own: the slot it read may have been
     * rewritten, or coll_ticks have passed the next rebase). So the value only grows, and a
     * writer killed at any point leaves a whole slot in force. ---- */
    uint64_t coll_ticks;                 /* monotonic, single writer */
    uint64_t tick_slot;                  /* rebases so far: slot tick_slot & 1 is in force */
    struct {
        uint64_t ticks0, ns0, mult;
    } tick_conv[2];
    /* ---- payload bytes of the AllReduces delegated to NCCL (src/cuda/cuda_nccl.c,
     * SHOAL_CUDA_BACKEND=nccl; transport "nccl", locality same host: the delegate runs only
     * when every rank is on this host). NCCL does not say what it moved, so the figure is the
     * ring-equivalent one, nccl-tests' busbw factor: an AllReduce of S bytes on n ranks adds
     * floor(2 (n - 1) S / n) to both nccl_sent and nccl_recv of every rank (0 for n = 1),
     * counted when the call completed without error. Single writer, like bytes_sent. 0 from a
     * library that predates them (they were spare: no new version). ---- */
    uint64_t nccl_sent;
    uint64_t nccl_recv;
    uint64_t spare[15];                  /* room to grow without a new version */
} shoal_meter_page_t;

/* Rereads of the tick conversion while its writer rebases (a page's writer may be hostile to
 * the agent: a bounded number, then the last read as it is). */
#define SHOAL_METER_TICK_TRIES 16

/* Time inside collective calls of a page in ns (any version): coll_ns plus coll_ticks
 * converted by the slot in force. Loads are relaxed but for tick_slot (acquire, so that the
 * slot and a coll_ticks at least its ticks0 are seen). The slot and coll_ticks are read again
 * when tick_slot moved meanwhile: read once, two rebases during the read rewrote the slot
 * under it (its ticks0 of one rebase, ns0 of another: off by up to the time between them),
 * and a coll_ticks past the next rebase went through the old rate. */
static inline uint64_t shoal_meter_page_coll_ns(const shoal_meter_page_t *p)
{
    uint64_t t0, n0, mult, t, ns;
    for (int tries = 1;; tries++) {
        uint64_t g = __atomic_load_n(&p->tick_slot, __ATOMIC_ACQUIRE), i = g & 1;
        t0 = __atomic_load_n(&p->tick_conv[i].ticks0, __ATOMIC_RELAXED);
        n0 = __atomic_load_n(&p->tick_conv[i].ns0, __ATOMIC_RELAXED);
        mult = __atomic_load_n(&p->tick_conv[i].mult, __ATOMIC_RELAXED);
        t = __atomic_load_n(&p->coll_ticks, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&p->tick_slot, __ATOMIC_RELAXED) == g ||
            tries == SHOAL_METER_TICK_TRIES) {
            break;
        }
    }
    ns = __atomic_load_n(&p->coll_ns, __ATOMIC_RELAXED) + n0;
    if (t > t0) {
        ns += (uint64_t)(((unsigned __int128)(t - t0) * mult) >> 32);
    }
    return ns;
}

_Static_assert(sizeof(shoal_meter_page_t) <= SHOAL_METER_PAGE_BYTES, "meter page too large");

/* ---- agent registration (library -> shoald), little-endian host order ---- */
#define SHOAL_METER_REG_MAGIC 0x47524d53u /* "SMRG" */
typedef struct {
    uint32_t magic;                      /* SHOAL_METER_REG_MAGIC */
    uint32_t version;                    /* SHOAL_METER_VERSION */
    uint32_t page_bytes;                 /* size of the memfd sent alongside */
    uint32_t cred_len;                   /* bytes of credential text that follow (0: none) */
    /* followed by cred_len bytes: the job's credential (src/tenant text form) */
} shoal_meter_reg_t;

typedef struct {
    uint32_t magic;                      /* SHOAL_METER_REG_MAGIC */
    int32_t status;                      /* shoal_status_t: OK, ERR_PERMISSION, ERR_AUTH... */
    char reason[120];                    /* a sentence when refused */
} shoal_meter_reg_reply_t;

#endif
