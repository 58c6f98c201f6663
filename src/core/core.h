/* Core: communicator, bootstrap, channels, progress, proxy thread. */
#ifndef SHOAL_CORE_H
#define SHOAL_CORE_H

#include "core/boot.h"
#include "core/tl.h"
#include "qos/qos.h"
#include "stop/stop.h"
#include "tenant/tenant.h"

#include <pthread.h>
#include <sys/socket.h>

#define SHOAL_TL_MAX 4
#define SHOAL_HOSTNAME_MAX 64
#define SHOAL_ERRMSG_MAX 512

/* SHOAL_* variables of the core (table in core_config.c). */
typedef struct {
    int timeout_ms;            /* SHOAL_TIMEOUT_MS */
    const char *transport;     /* SHOAL_TRANSPORT */
    const char *transport_exclude; /* SHOAL_TRANSPORT_EXCLUDE: names, comma-separated */
    unsigned spin_count;       /* SHOAL_SPIN_COUNT */
    unsigned spin_pause;       /* SHOAL_SPIN_PAUSE */
    int spin_adapt;            /* SHOAL_SPIN_ADAPT */
    const char *uid;           /* SHOAL_UID (hex, set by shoalrun) */
    int rank;                  /* SHOAL_RANK */
    int nranks;                /* SHOAL_NRANKS */
    const char *root;          /* SHOAL_ROOT host:port */
    const char *secret;        /* SHOAL_SECRET (hex) for SHOAL_ROOT */
    int boot_bind;             /* SHOAL_BOOT_BIND: shoal_boot_bind_t */
    int boot_exchange;         /* SHOAL_BOOT_EXCHANGE: shoal_boot_exchange_t */
    int connect;               /* SHOAL_CONNECT: shoal_connect_mode_t */
    int connect_lazy_ranks;    /* SHOAL_CONNECT_LAZY_RANKS */
} shoal_core_config_t;
typedef enum {
    SHOAL_CONNECT_AUTO = 0,    /* lazy from connect_lazy_ranks ranks on */
    SHOAL_CONNECT_EAGER,       /* every channel at init */
    SHOAL_CONNECT_LAZY         /* a channel at first use (transports with SHOAL_TL_CAP_LAZY) */
} shoal_connect_mode_t;
typedef enum {
    SHOAL_BOOT_BIND_AUTO = 0,  /* the address shoal_boot_pick_addr chooses */
    SHOAL_BOOT_BIND_LOOPBACK,  /* 127.0.0.1: every rank on this host (shoalrun) */
    SHOAL_BOOT_BIND_ANY        /* every interface (NAT, several addresses) */
} shoal_boot_bind_t;
typedef enum {
    SHOAL_BOOT_EXCHANGE_RING = 0, /* the root relays ring neighbours; ranks pass records on */
    SHOAL_BOOT_EXCHANGE_ROOT      /* every record through the root, which sends every table */
} shoal_boot_exchange_t;
extern SHOAL_HIDDEN shoal_core_config_t shoal_core_config;
SHOAL_HIDDEN const char *const *shoal_core_launcher_env(int *rank_p, int *nranks_p);
SHOAL_HIDDEN int shoal_core_launcher_partial(const char **set_p, const char **unset_p);

/* What every rank tells the others at init (round 0 of the bootstrap allgather). */
typedef struct {
    uint64_t host_id;
    int32_t rank;
    int32_t pid;
    char host[SHOAL_HOSTNAME_MAX];
    uint32_t tl_mask;          /* bit i: registry transport i usable on this rank */
    int32_t pinned_cpu;        /* 1 + the CPU this rank is bound to, 0: several CPUs allowed */
    int32_t lazy;              /* SHOAL_CONNECT resolved: must be the same on every rank */
    uint32_t pid_ns;           /* inode of this rank's pid namespace (0: unknown): its pid
                                * names a process only in a namespace with the same inode */
    shoal_tl_sizes_t tl_sizes; /* this rank's derived transport sizes (the assembly's) */
} shoal_peer_info_t;

/* A transport instance of one communicator. */
typedef struct {
    const shoal_tl_ops_t *ops;
    shoal_tl_ctx_t *ctx;
    int npeers;                /* peers whose channel uses it */
    int lazy;                  /* its channels connect at first use */
} shoal_tl_inst_t;

/* Channel to one peer: the transport chosen once for the pair. */
typedef struct {
    shoal_tl_inst_t *tl;
    shoal_ep_t *ep;
    uint32_t p2p_send_seq;     /* shoal_send/shoal_recv sequence numbers per direction */
    uint32_t p2p_recv_seq;
    /* Metering (src/meter): the page's payload byte counters of this channel's (transport,
     * locality) pair, or NULL when not metered. Single writer: the ticket holder. */
    uint64_t *meter_sent;
    uint64_t *meter_recv;
} shoal_chan_t;

struct shoal_coll_state;       /* src/coll: algorithm scratch, shm direct path */
struct shoal_topo_comm;        /* src/topo: hosts, sockets, ring order, links */
struct shoal_meter;            /* src/meter: the counter page, agent registration */
struct shoal_qos_pacer;        /* src/qos: the token bucket of paced communicators */
struct shoal_proxy;

struct shoal_comm {
    int rank;
    int nranks;
    int local_rank;            /* among ranks with the same host id, by rank */
    int local_size;
    int *local_ranks;          /* global rank of each local rank */
    int all_local;             /* every rank on this host */
    int lazy;                  /* SHOAL_CONNECT resolved: channels connect at first use */
    uint32_t comm_id;          /* from a key derivation: reveals nothing of the secret */
    uint8_t secret[SHOAL_SECRET_BYTES]; /* the communicator's key, derived from the job secret */
    shoal_tenant_id_t ident;   /* tenant, job, epoch: part of every key derived below */
    const struct shoal_tenant_cred *init_cred; /* during the init only: the credential it
                                                * read (NULL: none), for the meter */
    shoal_boot_root_key_t boot_root; /* the bootstrap root (one this process may run:
                                      * destroy waits for its thread) */
    uint32_t split_seq;        /* splits of this communicator so far (same on every rank) */
    shoal_config_t cfg;        /* caller's config, strings copied */
    int timeout_ms;
    unsigned spin_count;
    unsigned pause_spins;      /* pure polls before yielding: 0 when ranks outnumber cores */
    /* Adaptive spinning (SHOAL_SPIN_ADAPT, shoal_chan_idle); touched only by the thread that
     * progresses the communicator (the ticket's holder). */
    int spin_adapt;            /* SHOAL_SPIN_ADAPT and a transport across hosts in use */
    uint64_t wait_t0_ns;       /* the current wait's clock at its 16th idle call */
    int wait_phase;            /* 0: before it, 1: timed, 2: past SHORT_NS, 3: past LONG_NS */
    int wait_short;            /* waits past SHORT_NS sleep (their share past LONG_NS is high) */
    unsigned wait_score;       /* moving share, 0..256, of the waits past SHORT_NS that went
                                * on past LONG_NS */
    shoal_peer_info_t *peers;  /* [nranks] */
    shoal_tl_inst_t tls[SHOAL_TL_MAX];
    int ntls;
    shoal_tl_inst_t *shm;      /* the instance offering a shared area, or NULL */
    shoal_tl_sizes_t tl_sizes; /* handed to the transports: the lowest local rank's */
    shoal_chan_t *chans;       /* [nranks], self unused */
    uint32_t seq;              /* collective sequence number */
    int abort_efd;             /* eventfd: wakes pollers on abort */
    /* Read by any thread: only through shoal_comm_aborted() / shoal_comm_fatal() (acquire).
     * fatal is stored once, with release, after last_error is written (under err_lock). */
    int aborted;               /* shoal_comm_abort() was called */
    shoal_status_t fatal;      /* first communicator-fatal error, or SHOAL_OK */
    /* The abort flag the bootstrap obeys: &aborted, but a split's child's is its parent's
     * (nobody holds the child yet: the parent's abort ended its wait for a member that never
     * came only at the timeout); &aborted again once the bootstrap is over */
    const volatile int *boot_abort;
    /* shoal_fork_gen when it was made: another value is a process forked from its maker,
     * where it is the parent's (its sockets, segments, threads and peers), never its own;
     * beside fatal, which every call reads with it */
    uint32_t fork_gen;
    char last_error[SHOAL_ERRMSG_MAX];
    char tl_err[256];          /* transports write a failed request's cause here */
    pthread_mutex_t err_lock;
    /* issue-order execution of blocking calls and proxy-run requests */
    pthread_mutex_t exec_lock;
    pthread_cond_t exec_cond;
    uint64_t ticket_next;
    uint64_t ticket_serving;
    int ticket_waiters;        /* threads blocked in shoal_comm_ticket_wait (atomic) */
    pthread_mutex_t proxy_lock; /* starts the proxy once (proxy.c) */
    struct shoal_proxy *proxy; /* set once with release under proxy_lock, read with acquire */
    struct shoal_coll_state *coll;
    struct shoal_topo_comm *topo; /* set and freed by the assembly (src/api); read-only after */
    struct shoal_meter *meter; /* NULL with SHOAL_METER=0 (its first member is the page) */
    shoal_qos_comm_t qos;      /* src/qos: effective class, weight, marks (before the transports) */
    struct shoal_qos_pacer *pace; /* NULL when no rate applies (src/qos/pace.h) */
    shoal_stop_comm_t stop;    /* src/stop: stop requests and their agreement */
    uint64_t async_probe_ns;   /* last look at the peers (shoal_comm_get_async_error), atomic */
    /* A local peer shoal_comm_get_async_error found gone while another thread drove the
     * transports: its rank + 1 (0: none), atomic; that driver fails the communicator
     * (shoal_chan_idle), as it does on an abort: only the driver may touch the transports.
     * -1 while the first finder writes dead_why (shoal_comm_last_error's sentence until then),
     * which a reader that sees a rank (acquire) sees complete. */
    int dead_peer;
    char dead_why[160];
    /* The driver's one more pass after it first sees dead_peer (shoal_chan_idle): what the
     * peer wrote before it went (a finished job's last message) is delivered first. Only the
     * ticket holder touches it. */
    int dead_grace;
    int32_t pid;               /* the process that made it (messages) */
};

/* shoal_comm_get_async_error looks at an idle communicator's local peers at most this often. */
#define SHOAL_ASYNC_PROBE_NS (2 * 1000 * 1000ull)

/* The sticky state any thread may read while another fails or aborts the communicator. A
 * fatal status seen here comes with its sentence in last_error. */
static inline shoal_status_t shoal_comm_fatal(const struct shoal_comm *comm)
{
    return __atomic_load_n(&comm->fatal, __ATOMIC_ACQUIRE);
}

static inline int shoal_comm_aborted(const struct shoal_comm *comm)
{
    return __atomic_load_n(&comm->aborted, __ATOMIC_ACQUIRE);
}

/* Children forked from this process since the library was loaded: a pthread_atfork child
 * handler (comm.c) adds one in each. */
extern SHOAL_HIDDEN uint32_t shoal_fork_gen;

/* The communicator was made by another process, which forked this one. */
static inline int shoal_comm_forked(const struct shoal_comm *comm)
{
    return SHOAL_UNLIKELY(comm->fork_gen != __atomic_load_n(&shoal_fork_gen, __ATOMIC_RELAXED));
}

/* The local peer shoal_comm_get_async_error found gone while a call was in flight (the
 * communicator is failed by that call's driver at its next idle step), or -1. */
static inline int shoal_comm_dead_peer(const struct shoal_comm *comm)
{
    int v = __atomic_load_n(&comm->dead_peer, __ATOMIC_ACQUIRE);
    return v > 0 ? v - 1 : -1;
}

/* ---- communicator internals (comm.c) ---- */
/* Records the first fatal error (sentence for shoal_comm_last_error), tells the transports
 * (so peers learn), wakes waiters. Returns status. */
SHOAL_HIDDEN shoal_status_t shoal_comm_set_failed(struct shoal_comm *comm, shoal_status_t status,
                                                  int culprit, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
SHOAL_HIDDEN const char *shoal_comm_peer_host(struct shoal_comm *comm, int rank);
/* The rank that started a failure: the rank the transport learnt from an abort notice
 * (blamed, a request's culprit or peer_check's), when it is one of ours; otherwise a gone
 * process of this host if the failed peer is alive; otherwise the peer that failed. */
SHOAL_HIDDEN int shoal_comm_culprit(struct shoal_comm *comm, int blamed, int peer);
/* Before any collective: SHOAL_OK or the sticky fatal / aborted status. */
SHOAL_HIDDEN shoal_status_t shoal_comm_check_usable(struct shoal_comm *comm);
/* Issue-order execution: take a ticket, wait for it to be served, run, release. */
SHOAL_HIDDEN uint64_t shoal_comm_ticket_take(struct shoal_comm *comm);
SHOAL_HIDDEN shoal_status_t shoal_comm_ticket_wait(struct shoal_comm *comm, uint64_t ticket);
SHOAL_HIDDEN void shoal_comm_ticket_release(struct shoal_comm *comm);

/* ---- channels and progress (chan.c) ---- */
SHOAL_HIDDEN shoal_status_t shoal_chan_isend(struct shoal_comm *comm, int peer, const void *buf,
                                             size_t len, uint32_t seq, uint32_t step,
                                             uint32_t chunk, shoal_tl_req_t *req);
SHOAL_HIDDEN shoal_status_t shoal_chan_irecv(struct shoal_comm *comm, int peer, void *buf,
                                             size_t len, uint32_t seq, uint32_t step,
                                             uint32_t chunk, shoal_tl_req_t *req);
/* Progress every transport once; returns completions. */
SHOAL_HIDDEN int shoal_chan_progress(struct shoal_comm *comm);
/* Wait until every non-NULL request in reqs[0..n) is done; spins briefly, then sleeps.
 * Fails the communicator (naming the peer) on a request error, timeout or abort. peers[i]
 * is the peer of reqs[i] (for the error sentence). */
SHOAL_HIDDEN shoal_status_t shoal_chan_waitall(struct shoal_comm *comm, shoal_tl_req_t **reqs,
                                               const int *peers, int n);
/* One blocking exchange on the channels: len bytes of sbuf to rank `to` and len bytes from
 * rank `from` into rbuf, both posted before the wait (to/from < 0: that side is absent).
 * For the few messages core and topo send themselves (split, topology exchange). */
SHOAL_HIDDEN shoal_status_t shoal_chan_sendrecv(struct shoal_comm *comm, int to,
                                                const void *sbuf, int from, void *rbuf,
                                                size_t len, uint32_t seq, uint32_t step);
/* As shoal_chan_sendrecv, for the library's own messages during a call (SHOAL_CHECK_ARGS's
 * exchange): paced, but not metered, since the meter's bytes are the payload of the
 * application's calls, which the provider bills to the tenant. */
SHOAL_HIDDEN shoal_status_t shoal_chan_sendrecv_ctl(struct shoal_comm *comm, int to,
                                                    const void *sbuf, int from, void *rbuf,
                                                    size_t len, uint32_t seq, uint32_t step);
/* Rank 0's len bytes of buf to every rank, down a binomial tree (log2 n rounds): the few
 * settings a communicator agrees on at init (src/tune, src/coll). */
SHOAL_HIDDEN shoal_status_t shoal_chan_bcast_small(struct shoal_comm *comm, void *buf,
                                                   size_t len, uint32_t seq, uint32_t step);
/* Without waiting: *done_p = 1 when every non-NULL request is done; a failed request fails
 * the communicator (naming the peer) and its status is returned. */
SHOAL_HIDDEN shoal_status_t shoal_chan_test(struct shoal_comm *comm, shoal_tl_req_t **reqs,
                                            const int *peers, int n, int *done_p);
/* Wait until at least one of reqs is done (same failure rules). */
SHOAL_HIDDEN shoal_status_t shoal_chan_waitany(struct shoal_comm *comm, shoal_tl_req_t **reqs,
                                               const int *peers, int n);
/* One idle step for a waiter that polls shared memory itself (shm direct path): spins,
 * yields, then sleeps briefly on the transports; checks abort and the deadline. *spins_p
 * counts idle iterations (reset it to 0 after progress). */
SHOAL_HIDDEN shoal_status_t shoal_chan_idle(struct shoal_comm *comm, unsigned *spins_p,
                                            uint64_t deadline_ns, const char *what);
/* Whether the next shoal_chan_idle(spins) may fail and so needs its 'what' (abort, a dead
 * peer, the deadline): callers format their message only then, not once per poll (a snprintf
 * per sleep was 4% of a rank's CPU while it waited on a slow link). */
static inline int shoal_chan_idle_may_fail(const struct shoal_comm *comm, unsigned spins,
                                           uint64_t deadline_ns)
{
    return shoal_comm_aborted(comm) || shoal_comm_dead_peer(comm) >= 0 ||
           ((spins + 1 >= comm->spin_count || ((spins + 1) & 255) == 0) &&
            shoal_deadline_passed(deadline_ns));
}

/* ---- bootstrap (boot.c, boot.h) ---- */
#include "core/boot.h"

/* ---- plans (proxy.c): a collective advanced step by step ----
 * An algorithm is a plan: progress() posts the sends and receives it can, consumes the
 * completions it finds (shoal_chan_test) and returns without blocking. The proxy thread
 * advances every plan of its communicator in turn, so several collectives move at once; a
 * blocking call drives its plan on the caller's thread (shoal_plan_drive). Plans of one
 * communicator that share a peer advance one after the other, in issue order: the channels
 * match messages first in, first out, so a channel carries one plan's messages at a time. */
#define SHOAL_PLAN_PEERS 4
#define SHOAL_PLAN_WAIT 2
typedef struct shoal_plan shoal_plan_t;
struct shoal_plan {
    /* SHOAL_IN_PROGRESS, SHOAL_OK (done) or an error (the communicator is failed with the
     * sentence naming the peer). Never blocks, except in a plan with npeers < 0, which may
     * run a whole algorithm in one call. */
    shoal_status_t (*progress)(struct shoal_comm *comm, shoal_plan_t *plan);
    /* Frees the plan once it is done, failed or cancelled; st is its outcome. */
    void (*release)(struct shoal_comm *comm, shoal_plan_t *plan, shoal_status_t st);
    /* Optional: the plan waits for something the transports' sleep does not hear (flags in
     * shared memory that peers signal on a futex of the plan's layer). The proxy's idle step
     * calls it instead of the transports' sleep while this plan is the only one in flight;
     * it sleeps at most 1 ms and returns 1, or returns 0 (nothing to sleep on: the transports'
     * sleep follows). */
    int (*sleep)(struct shoal_comm *comm, shoal_plan_t *plan);
    int npeers;                    /* < 0: any peer (runs alone) */
    int peers[SHOAL_PLAN_PEERS];   /* the channels it uses */
    int wait_peer;                 /* the peer progress waits for (timeout sentence), or -1 */
    /* Requests progress waits for when it returned SHOAL_IN_PROGRESS (shoal_plan_wait_on):
     * it cannot move before all of them are done, so the driver and the proxy call it again
     * only then, and poll the transports meanwhile (a re-entry costs more than a test). Reset
     * to none before every progress call; none listed: called again after any movement. */
    shoal_tl_req_t *wait_reqs[SHOAL_PLAN_WAIT];
    int nwait;
};

/* Called by progress before it returns SHOAL_IN_PROGRESS for want of req (a request in the
 * plan's own memory, pending): progress cannot move before req is done. */
static inline void shoal_plan_wait_on(shoal_plan_t *plan, shoal_tl_req_t *req)
{
    if (plan->nwait < SHOAL_PLAN_WAIT) {
        plan->wait_reqs[plan->nwait++] = req;
    }
}

/* Whether progress may move: every request it waits for is done (or failed). */
static inline int shoal_plan_ready(const shoal_plan_t *plan)
{
    for (int i = 0; i < plan->nwait; i++) {
        if (!__atomic_load_n(&plan->wait_reqs[i]->done, __ATOMIC_ACQUIRE)) {
            return 0;
        }
    }
    return 1;
}
/* Starts a call whose ticket is served (issue order: it may take the sequence number): a plan
 * in *plan_p, or the call's status with *plan_p NULL when nothing is left to do. */
typedef shoal_status_t (*shoal_plan_start_t)(struct shoal_comm *comm, void *arg,
                                             shoal_plan_t **plan_p);
/* Runs a plan to completion on the calling thread (blocking calls), with the communicator's
 * deadline counted from the last completion; releases it. */
SHOAL_HIDDEN shoal_status_t shoal_plan_drive(struct shoal_comm *comm, shoal_plan_t *plan);

/* ---- proxy thread (proxy.c) for shoal_i* calls ---- */
typedef shoal_status_t (*shoal_proxy_fn_t)(struct shoal_comm *comm, void *arg);
/* A call the proxy starts in issue order and then advances with the others in flight. */
SHOAL_HIDDEN shoal_status_t shoal_proxy_post_plan(struct shoal_comm *comm,
                                                  shoal_plan_start_t start, const void *arg,
                                                  size_t arglen, shoal_request_t *req_p);
/* A call run whole by fn (it has the communicator to itself meanwhile). */
SHOAL_HIDDEN shoal_status_t shoal_proxy_post(struct shoal_comm *comm, shoal_proxy_fn_t fn,
                                             void *arg, size_t arglen, shoal_request_t *req_p);
SHOAL_HIDDEN void shoal_proxy_stop(struct shoal_comm *comm);
/* 1 on comm's proxy thread once shoal_comm_destroy stops it: a call that runs whole on the
 * proxy (a nonblocking call under SHOAL_CHECK_ARGS, a CUDA task) waits in shoal_chan_idle,
 * which then fails the communicator as the proxy fails the plans in flight, instead of waiting
 * for peers that may never come (until SHOAL_TIMEOUT_MS). */
SHOAL_HIDDEN int shoal_proxy_stopping(const struct shoal_comm *comm);
/* For the CUDA layer (src/cuda): detached requests and one per-communicator extension slot
 * whose fini runs when the proxy stops (shoal_comm_destroy), after every queued request ran
 * or was cancelled. */
typedef void (*shoal_proxy_ext_fini_t)(struct shoal_comm *comm, void *ext);
/* Runs on the proxy thread instead of a detached request's fn when fn never runs: the
 * communicator failed or was destroyed before the request's turn. */
typedef void (*shoal_proxy_cancel_t)(struct shoal_comm *comm, void *arg);
/* Like shoal_proxy_post, but nobody waits: fn reports its own errors. A request refused or
 * failed before fn ran (the communicator failed, was aborted or destroyed) is freed after
 * cancel (if not NULL) ran instead. */
SHOAL_HIDDEN shoal_status_t shoal_proxy_post_detached(struct shoal_comm *comm,
                                                      shoal_proxy_fn_t fn,
                                                      shoal_proxy_cancel_t cancel,
                                                      const void *arg, size_t arglen);
/* Starts the proxy if needed; *ext_p = the slot's value (NULL until set). Not thread-safe
 * against itself: the caller serialises (src/cuda holds a lock). */
SHOAL_HIDDEN shoal_status_t shoal_proxy_ext_get(struct shoal_comm *comm, void **ext_p);
/* Only after shoal_proxy_ext_get succeeded. */
SHOAL_HIDDEN void shoal_proxy_ext_set(struct shoal_comm *comm, void *ext,
                                      shoal_proxy_ext_fini_t fini);

/* ---- the assembly hook ----
 * A communicator carries the state of layers above core (algorithms, topology, their
 * scratch). They are assembled in one place above core, topo, coll and cuda (src/api), which
 * defines this table; core calls the upper layers only through it, never by name. */
typedef struct {
    /* Before the bootstrap's round 0, on every rank without communication: the transport
     * sizes derived from this machine (src/tune), explicit settings applied. */
    void (*tl_sizes)(shoal_tl_sizes_t *sizes);
    /* Handed to the transports (shoal_tl_params_t.link_sizes): the sizes that follow a port
     * a transport opened (src/tune), explicit settings applied. */
    void (*link_sizes)(const shoal_tl_link_t *link, shoal_tl_link_sizes_t *sizes_p);
    /* After the bootstrap, before the meter and pacing: may exchange messages (issue order
     * is not yet in use: nothing else runs on the communicator). */
    shoal_status_t (*init)(struct shoal_comm *comm);
    /* After the proxy stopped, before the transports close; safe after a failed init. */
    void (*fini)(struct shoal_comm *comm);
} shoal_comm_assembly_t;
extern SHOAL_HIDDEN const shoal_comm_assembly_t shoal_comm_assembly;

#endif
