/* Shared-memory transport (same host).
 *
 * Each rank creates one POSIX shm segment at init, under an unguessable name, mode 0600:
 *
 *   [control block][ring from local peer a][ring from local peer b]...[shared area]
 *
 * A ring is an SPSC queue of nslots slots of slot_size bytes that one local peer produces
 * into and the owner consumes from. Slot headers (one cache line each) carry a sequence
 * number in the style of a bounded Vyukov queue: slot i starts at seq i; the producer at
 * position p waits for seq == p, writes data and length, then release-stores seq = p + 1;
 * the consumer at position c waits for seq == c + 1, copies out, then release-stores
 * seq = c + nslots. Producer and consumer positions live in each side's private memory, so
 * nothing is shared but the slot headers and data.
 *
 * A message is the 32-byte wire header followed by its payload, streamed slot by slot from a
 * fresh slot: the first slot carries the header and the first slot_size - 32 payload bytes.
 *
 * Sleeping: the owner's control block holds a futex doorbell and a sleeping flag. wait()
 * sets the flag, fences, and sleeps on the doorbell value read by the last progress() call
 * unless its rings show work (has_work: data for a queued receive, a free slot for a queued
 * send, a failed peer). A peer that produced into its ring or freed a slot of its own fences
 * and rings (increments the doorbell, FUTEX_WAKE) only if the flag is set: either the
 * sleeper's last look sees the slot, or the peer sees the flag (shoal_shm_ctrl_ring_sleeper).
 * notify() (abort, a dead peer) and a failure ring always, so that a waiter whose condition
 * is not in its rings returns at once from a wait() after the progress() that preceded its
 * own check: such callers call progress() before checking, then wait().
 */
#ifndef SHOAL_SHM_H
#define SHOAL_SHM_H

#include "core/tl.h"

#include <sys/types.h>

#define SHOAL_SHM_MAGIC 0x53484f414c53484dull /* "MHSLAOHS" */
/* 2: the owner holds an OFD write lock on its segment while the segment's name exists
 * (shoal_shm_sweep tells a dead owner's segment by the lock's absence). */
#define SHOAL_SHM_VERSION 2
#define SHOAL_SHM_ADDR_MAGIC 0x6d687373u
#define SHOAL_SHM_NAME_MAX 48
#define SHOAL_SHM_NAME_PREFIX "/shoal-"
/* A segment with no lock is taken for a dead process's only once it is this old: its owner
 * takes the lock by the system call after the one that creates the file, so a younger
 * unlocked file may be one being made (shoal_shm_sweep). */
#define SHOAL_SHM_SWEEP_AGE_S 60
/* Longest futex sleep while a request is pending: a dead peer never rings the doorbell. */
#define SHOAL_SHM_PENDING_SLEEP_US 2000
/* Longest futex sleep when wait() is given a negative (infinite) timeout. */
#define SHOAL_SHM_MAX_SLEEP_US 100000
/* Peer liveness is checked at most this often while a request to/from it is pending. */
#define SHOAL_SHM_CHECK_NS 1000000ull

typedef struct {
    size_t slot_size;   /* SHOAL_SHM_SLOT_SIZE */
    unsigned nslots;    /* SHOAL_SHM_NSLOTS */
    size_t area_size;   /* SHOAL_SHM_AREA_SIZE */
    const char *dir;    /* SHOAL_SHM_DIR */
    int disable;        /* SHOAL_SHM_DISABLE */
    int cma;            /* SHOAL_SHM_CMA: single copies (process_vm_readv/writev) allowed */
} shoal_shm_config_t;

extern SHOAL_HIDDEN shoal_shm_config_t shoal_shm_config;
extern SHOAL_HIDDEN const shoal_cfg_table_t shoal_shm_cfg_table;

/* Control block at the start of every segment; each group on its own cache line. */
typedef struct {
    /* written once by the owner at init */
    uint64_t magic;
    uint32_t version;
    int32_t pid;
    uint32_t comm_id;
    uint32_t local_rank;
    uint32_t local_size;
    uint32_t nslots;
    uint64_t slot_size;
    uint64_t area_size;
    uint64_t total_size;
    uint64_t self_va;   /* the segment's address in the owner (single-copy probe) */
    /* set by the owner's fail(): culprit first, then failed (release) */
    uint32_t failed __attribute__((aligned(SHOAL_CACHELINE)));
    int32_t culprit;
    /* lazy contexts: local peers that mapped this segment; the one that completes the count
     * unlinks its name */
    uint32_t mapped;
    /* futex word, incremented by anyone who has news for the owner */
    uint32_t doorbell __attribute__((aligned(SHOAL_CACHELINE)));
    /* 1 while the owner sleeps (or is about to) on the doorbell */
    uint32_t sleeping __attribute__((aligned(SHOAL_CACHELINE)));
} __attribute__((aligned(SHOAL_CACHELINE))) shoal_shm_ctrl_t;

typedef struct {
    uint64_t seq;       /* see the protocol above */
    uint32_t len;       /* bytes of data in the slot */
} __attribute__((aligned(SHOAL_CACHELINE))) shoal_shm_slot_hdr_t;

/* Geometry of a segment, the same function of the sizes in every process. */
typedef struct {
    size_t slot_stride;   /* slot_size rounded to a cache line */
    size_t ring_bytes;    /* headers (page-aligned) + slots, page-aligned */
    size_t hdrs_bytes;
    size_t rings_off;
    size_t area_off;
    size_t total;
    unsigned nrings;
} shoal_shm_layout_t;

/* Address published through the bootstrap. */
typedef struct {
    uint32_t magic;
    uint32_t version;
    char name[SHOAL_SHM_NAME_MAX];
    int32_t pid;
    int32_t local_rank;
    uint32_t local_size;
    uint32_t nslots;
    uint64_t slot_size;
    uint64_t area_size;
    uint32_t comm_id;
    uint32_t pid_ns;          /* inode of the publisher's /proc/self/ns/pid; 0 if unknown */
    uint64_t dir_dev;         /* its segment directory's device and inode; 0 if unknown */
    uint64_t dir_ino;
} shoal_shm_addr_t;

/* A ring as seen from one process. */
/* A local peer's shoal_mem_alloc buffer mapped here (shm_mem.c). */
typedef struct {
    int local_rank;
    uint64_t id;
    void *base;               /* header page */
    size_t total;
    uint64_t used;            /* pmap_clock of the last use */
} shoal_shm_pmap_t;

typedef struct {
    shoal_shm_slot_hdr_t *hdrs;
    uint8_t *data;
} shoal_shm_ring_t;

struct shoal_ep {
    struct shoal_tl_ctx *ctx;
    int rank;                 /* global rank of the peer */
    int local_rank;
    pid_t pid;
    unsigned long long starttime; /* from /proc/<pid>/stat at connect; 0 if unknown */
    int pidfd;                /* the peer's process, held while single copies are on; -1 */
    int pid_foreign;          /* the peer is in another pid namespace: its pid names nobody
                               * here (or another process); liveness by seg_fd's lock */
    int seg_fd;               /* pid_foreign: the peer's segment, open to test its lock; -1 */
    void *peer_base;          /* the peer's whole segment, mapped here */
    size_t peer_len;
    shoal_shm_ctrl_t *peer_ctrl;
    shoal_shm_addr_t addr;    /* as published (checked); mapped at connect, or lazily at the
                               * first use (peer_base NULL until then) */
    shoal_shm_ring_t tx;      /* in the peer's segment: we produce */
    shoal_shm_ring_t rx;      /* in our segment: the peer produces */
    int tx_reserved;          /* tx's data pages are allocated (at the first send) */
    uint64_t tx_pos;          /* producer position (private) */
    uint64_t rx_pos;          /* consumer position (private) */
    shoal_tl_req_t *sq_head, *sq_tail;
    shoal_tl_req_t *rq_head, *rq_tail;
    shoal_status_t status;    /* != SHOAL_OK once the endpoint failed */
    uint64_t last_check_ns;   /* peer_check() rate limit */
    int peer_gone;            /* the liveness check failed once: gone_why says why */
    int gone_culprit;         /* with peer_gone: the rank the peer blamed, -1 if it died */
    char gone_why[160];
    int culprit;              /* with status: the rank the failure is blamed on, or -1 */
    char why[192];            /* the failure sentence */
};

struct shoal_tl_ctx {
    int rank;
    int local_rank;
    int local_size;
    uint32_t comm_id;
    size_t slot_size;
    unsigned nslots;
    size_t area_size;
    shoal_shm_layout_t layout;
    char name[SHOAL_SHM_NAME_MAX];
    uint64_t dir_dev, dir_ino;  /* the directory the segment is in; 0 if stat failed */
    int unlinked;
    int lock_fd;                /* our segment's fd, holding its lock until fini (the sweep
                                 * while the name exists; liveness for peers in another pid
                                 * namespace after); closed in forked children */
    struct shoal_tl_ctx *fork_next; /* the contexts with a lock_fd (shm_ctx.c's fork list) */
    void *base;                 /* our segment */
    shoal_shm_ctrl_t *ctrl;
    uint32_t bell_seen;         /* doorbell value read by the last progress() */
    uint64_t npending;          /* queued requests over all endpoints */
    uint64_t last_check_ns;     /* progress()/wait() liveness rate limit */
    int failed;                 /* fail() was called */
    const volatile int *abort_flag;
    struct shoal_ep *eps;       /* npeers endpoints */
    int npeers;
    struct shoal_ep **ep_by_local; /* local_size entries; NULL for self and unconnected */
    int cma_ok;                 /* single copies work with every local peer (probed) */
    int cma_checked;            /* the probe ran (lazy: at the first peer_copy_ok) */
    int mem_ok;                 /* mem_map can take every local peer's descriptors (probed) */
    int mem_checked;            /* that probe ran (at the first mem_reach_ok) */
    int lazy;                   /* peers' segments mapped at first use, names kept till then */
    shoal_shm_pmap_t *pmaps;    /* peers' shoal_mem_alloc buffers mapped here */
    int npmaps;
    int pmaps_cap;
    uint64_t pmap_clock;
};

typedef struct shoal_tl_ctx shoal_shm_ctx_t;
typedef struct shoal_ep shoal_shm_ep_t;

SHOAL_HIDDEN void shoal_shm_layout_compute(size_t slot_size, unsigned nslots, size_t area_size,
                                           unsigned local_size, shoal_shm_layout_t *l_p);
/* The ring of a segment owned by local rank 'owner' that local rank 'sender' produces into. */
SHOAL_HIDDEN shoal_shm_ring_t shoal_shm_ring_at(void *base, const shoal_shm_layout_t *l,
                                                int owner, int sender);

/* shm_ctx.c: allocates the pages of the ring we produce into (first send to the peer);
 * SHOAL_ERR_NO_MEMORY when the file system is full. */
SHOAL_HIDDEN shoal_status_t shoal_shm_ep_reserve_tx(shoal_ep_t *ep);
/* Maps the peer's segment if not yet (a lazy context's endpoints, at their first use). */
SHOAL_HIDDEN shoal_status_t shoal_shm_ep_attach(shoal_ep_t *ep);
/* The same for a receive, which reads only our own segment: a lazy peer that sent its last
 * messages and finalized (its name gone with it) before our first use of the endpoint left
 * them whole in our ring, so a name that is gone leaves the endpoint unmapped (peer_ctrl
 * NULL: nobody to wake, liveness by pid; a peer in another pid namespace is gone) and is no
 * error. */
SHOAL_HIDDEN shoal_status_t shoal_shm_ep_attach_rx(shoal_ep_t *ep);
/* Probes single copies with every local peer once (mapping them all), sets cma_ok. */
SHOAL_HIDDEN void shoal_shm_cma_check(shoal_tl_ctx_t *ctx);

/* shm_ep.c */
SHOAL_HIDDEN shoal_status_t shoal_shm_ep_isend(shoal_ep_t *ep, shoal_tl_req_t *req);
SHOAL_HIDDEN shoal_status_t shoal_shm_ep_irecv(shoal_ep_t *ep, shoal_tl_req_t *req);
SHOAL_HIDDEN int shoal_shm_ctx_progress(shoal_tl_ctx_t *ctx);
SHOAL_HIDDEN int shoal_shm_ctx_has_work(shoal_tl_ctx_t *ctx);
/* Fails the endpoint (first failure wins) and completes its requests; returns how many.
 * culprit: the rank the failure is blamed on (an abort notice), or -1. */
SHOAL_HIDDEN int shoal_shm_ep_fail(shoal_ep_t *ep, shoal_status_t status, int culprit,
                                   const char *why);
/* Is the peer alive and its communicator not failed? Sentence in why and the rank the peer
 * blamed in *culprit_p (-1: none) otherwise. */
SHOAL_HIDDEN shoal_status_t shoal_shm_ep_check_peer(shoal_ep_t *ep, char *why, size_t len,
                                                    int *culprit_p);
/* Liveness of every peer with pending requests, at most every SHOAL_SHM_CHECK_NS. */
SHOAL_HIDDEN int shoal_shm_ctx_check_peers(shoal_tl_ctx_t *ctx, uint64_t now_ns);
/* Bump a control block's doorbell and wake its owner if it sleeps. */
SHOAL_HIDDEN void shoal_shm_ctrl_ring(shoal_shm_ctrl_t *ctrl);
/* 1 if the peer's process is gone: kill() says so, its /proc start time changed (the pid
 * went to another process), or it is a zombie with no thread left (a main thread that called
 * pthread_exit is a zombie while the others run). */
SHOAL_HIDDEN int shoal_shm_pid_dead(shoal_ep_t *ep);
/* 1 if a peer in another pid namespace is gone: its segment's lock went with its process. */
SHOAL_HIDDEN int shoal_shm_ep_owner_gone(shoal_ep_t *ep);
/* /proc/<pid>/stat: state char and start time; 0 on success. */
SHOAL_HIDDEN int shoal_shm_proc_stat(pid_t pid, char *state_p, unsigned long long *start_p);

/* shm_mem.c: shoal_mem_alloc buffers and single copies (see there). */
SHOAL_HIDDEN int shoal_shm_mem_query(const void *ptr, size_t len, shoal_tl_mem_t *m_p);
SHOAL_HIDDEN void *shoal_shm_mem_map(shoal_tl_ctx_t *ctx, int local_rank,
                                     const shoal_tl_mem_t *m);
SHOAL_HIDDEN void shoal_shm_mem_unmap_all(shoal_tl_ctx_t *ctx);
/* 1 if this process may take every local peer's descriptors (probed once), else 0. */
SHOAL_HIDDEN int shoal_shm_mem_reach_ok(shoal_tl_ctx_t *ctx);
/* 0 if a process_vm_readv of the peer's control block works, else the errno. */
SHOAL_HIDDEN int shoal_shm_cma_probe(shoal_ep_t *ep);
/* Removes the segments in SHOAL_SHM_DIR that this user's dead processes left: named like
 * ours, owned by the effective uid, unmodified for min_age_s seconds, their lock not held,
 * not of another shm version. Returns how many went. */
SHOAL_HIDDEN unsigned shoal_shm_sweep(unsigned min_age_s);
SHOAL_HIDDEN int shoal_shm_peer_copy_ok(shoal_tl_ctx_t *ctx);
SHOAL_HIDDEN shoal_status_t shoal_shm_peer_copy(shoal_tl_ctx_t *ctx, int local_rank, int write,
                                                void *local, uint64_t remote, size_t len);

#endif
