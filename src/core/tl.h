/* The transport interface (DESIGN.md section 4). A transport moves framed messages
 * (wire header + payload) between two processes; it knows nothing of collectives. */
#ifndef SHOAL_TL_H
#define SHOAL_TL_H

#include "core/wire.h"

#include <pthread.h>

#define SHOAL_TL_ABI_VERSION 2 /* 2: requests carry the culprit rank, peer_check returns it */
/* Bytes of a transport address in the bootstrap table. 1024: a UCX worker address with tcp on
 * a few interfaces plus shared memory is ~220 bytes here, several HCAs take it past 256. */
#define SHOAL_TL_ADDR_MAX 1024
#define SHOAL_SECRET_BYTES 32

typedef struct shoal_tl_ctx shoal_tl_ctx_t; /* defined by each transport */
typedef struct shoal_ep shoal_ep_t;         /* defined by each transport */

/* Sizes derived from this machine (src/tune) for the transports, resolved before they start:
 * explicit settings (SHOAL_* variables, SHOAL_CONF_FILE, SHOAL_TUNING_FILE) already applied.
 * 0: none derived, the transport keeps its own variable. Same on every rank of a host for the
 * shm fields (core takes the lowest local rank's). Plain integers: part of round 0's record. */
typedef struct {
    uint64_t shm_slot_size;       /* SHOAL_SHM_SLOT_SIZE */
    uint64_t tcp_min_split;       /* SHOAL_TCP_MIN_SPLIT */
    uint32_t shm_nslots;          /* SHOAL_SHM_NSLOTS */
    uint32_t ucx_inline_max;      /* SHOAL_UCX_INLINE_MAX */
    uint64_t ucx_cma_min;         /* SHOAL_UCX_CMA_MIN (0: from the inline limit) */
} shoal_tl_sizes_t;

/* A network port as a transport found it when it opened its device: what sizes that follow
 * the link are derived from (src/tune's rule, reached through params->link_sizes). */
typedef struct {
    uint32_t mtu;                 /* active MTU, bytes; 0 unknown */
    uint32_t rate_mbps;           /* data rate (lane speed x width), Mbit/s; 0 unknown */
    uint32_t rtt_us;              /* configured round trip (SHOAL_IB_RTT_US), us; 0: none */
    uint32_t soft;                /* 1: a software device (this host's CPUs move the data) */
} shoal_tl_link_t;

/* The ring geometry of a transport that writes into its peers' receive rings (ib), explicit
 * settings applied. */
typedef struct {
    uint64_t slot_size;           /* payload bytes per ring slot (SHOAL_IB_SLOT_SIZE) */
    uint32_t nslots;              /* receive ring slots per peer (SHOAL_IB_RING_SLOTS) */
    uint32_t send_slots;          /* bounce slots per peer (SHOAL_IB_SEND_SLOTS) */
    char why[320];                /* each value's source and reason, for the log */
} shoal_tl_link_sizes_t;

/* Handed to init. */
typedef struct {
    int rank;
    int nranks;
    int local_rank;               /* rank among the ranks on this host */
    int local_size;
    uint32_t comm_id;
    const uint8_t *secret;        /* SHOAL_SECRET_BYTES communicator key (derived from the job
                                   * secret and the identity): authenticate peers */
    int timeout_ms;               /* connect/handshake deadline; < 0 infinite */
    const volatile int *abort_flag; /* nonzero: stop waiting, fail with SHOAL_ERR_ABORTED;
                                     * read it with shoal_aborted (util.h) */
    /* QoS marks of the communicator (src/qos resolves them from its class); -1: leave the
     * socket's / the transport's own default. A mark the kernel refuses is a warning. All of
     * them are ignored while qos_valid is 0 (callers that build params themselves). */
    int qos_valid;
    int qos_priority;             /* SO_PRIORITY of every data socket */
    int qos_dscp;                 /* DSCP: IP_TOS / IPV6_TCLASS = qos_dscp << 2 */
    int qos_ib_tc;                /* GRH traffic class (IB, RoCE; UCX IB_TRAFFIC_CLASS) */
    int qos_ib_sl;                /* IB service level */
    uint64_t qos_rate_max;        /* bytes/s per peer connection, 0 = none */
    const char *qos_class_name;   /* the class, for messages ("guaranteed"); NULL: unknown */
    /* 1 (only for a transport with SHOAL_TL_CAP_LAZY): connect_all connects nothing; each
     * endpoint connects at its first isend/irecv, driven by progress(), or when the peer
     * connects to it. The transport keeps its listener / names until fini. */
    int lazy;
    /* Derived sizes (see shoal_tl_sizes_t); NULL: the transport's variables only (callers
     * that build params themselves). */
    const shoal_tl_sizes_t *sizes;
    /* The sizes that follow a port (src/tune's rule, from the assembly): called by a transport
     * once it has opened its device; NULL: the transport's variables only. */
    void (*link_sizes)(const shoal_tl_link_t *link, shoal_tl_link_sizes_t *sizes_p);
} shoal_tl_params_t;

/* A request: embedded by the caller, completed by the transport only inside progress(). */
typedef struct shoal_tl_req {
    struct shoal_tl_req *next;    /* transport's queue link */
    shoal_wire_hdr_t hdr;         /* send: header to send; recv: header expected */
    void *buf;                    /* payload; hdr.length bytes */
    size_t off;                   /* transport bookkeeping: bytes moved so far */
    int hdr_done;                 /* transport bookkeeping */
    volatile int done;            /* set to 1 by the transport on completion */
    shoal_status_t status;        /* valid once done */
    int culprit;                  /* failed: the rank that started the communicator's failure,
                                   * as the transport learnt it (an abort notice), or -1 */
    char *errbuf;                 /* optional: the transport writes the cause here on error */
    size_t errlen;
} shoal_tl_req_t;

/* A transport accepting a request resets its bookkeeping: not done, nothing moved yet. */
static inline void shoal_tl_req_start(shoal_tl_req_t *req)
{
    req->next = NULL;
    req->off = 0;
    req->hdr_done = 0;
    req->status = SHOAL_IN_PROGRESS;
    req->culprit = -1;
    req->done = 0;
}

/* Capability flags */
#define SHOAL_TL_CAP_SHARED_AREA (1u << 0) /* shared_area(): peers' memory mapped directly */
#define SHOAL_TL_CAP_PEER_MEM (1u << 1) /* mem_query/mem_map/peer_copy: peers' buffers */
/* Connects on first use when params->lazy: connect_all returns endpoints at once, without
 * waiting for any peer; progress() runs the handshakes (both sides may start one: the
 * transport resolves the race the same way on both), listeners stay open until fini. An
 * endpoint that cannot connect fails its requests (SHOAL_ERR_PEER_FAILED, SHOAL_ERR_AUTH,
 * SHOAL_ERR_TIMEOUT after timeout_ms), never blocks. */
#define SHOAL_TL_CAP_LAZY (1u << 2)
#define SHOAL_TL_CAP_HOST_CPU (1u << 3) /* host_cpu(): whether this host's CPUs move the data */

/* A shoal_mem_alloc buffer as its owner describes it to local peers (transports/shm). */
typedef struct {
    uint64_t id;       /* unique per allocation and process, never 0 */
    uint64_t base;     /* the allocation's first user byte in the owner's address space */
    uint64_t size;     /* user bytes */
    int32_t fd;        /* the owner's descriptor of the segment */
    uint32_t pad;
} shoal_tl_mem_t;

typedef struct shoal_tl_ops {
    int abi_version;
    const char *name;             /* "shm", "tcp" */
    unsigned caps;
    int intra_node_only;          /* 1: only for peers with the same host id */
    /* 1 if usable on this machine now */
    int (*query)(void);
    shoal_status_t (*init)(const shoal_tl_params_t *params, shoal_tl_ctx_t **ctx_p);
    /* Opaque address for the bootstrap table, at most SHOAL_TL_ADDR_MAX bytes. */
    shoal_status_t (*address)(shoal_tl_ctx_t *ctx, void *addr, size_t *len_p);
    /* Connect to every peer in peers[0..npeers) (ascending ranks); addrs[i] is peer i's
     * address. Blocks until all are established or the deadline passes; the caller calls
     * it on every rank with symmetric lists. eps_p[i] receives the endpoint of peers[i]. */
    shoal_status_t (*connect_all)(shoal_tl_ctx_t *ctx, const int *peers, int npeers,
                                  const void *const *addrs, const size_t *addr_lens,
                                  shoal_ep_t **eps_p);
    /* Optional: every rank has connected (after a bootstrap barrier): drop names, listeners
     * (a lazy context keeps them until fini). */
    shoal_status_t (*ready)(shoal_tl_ctx_t *ctx);
    shoal_status_t (*isend)(shoal_ep_t *ep, shoal_tl_req_t *req);
    shoal_status_t (*irecv)(shoal_ep_t *ep, shoal_tl_req_t *req);
    /* Makes progress on every endpoint; returns the number of completions. */
    int (*progress)(shoal_tl_ctx_t *ctx);
    /* fd to sleep on with poll/epoll (readable when progress may be possible), or -1. */
    int (*wait_fd)(shoal_tl_ctx_t *ctx);
    /* Optional: sleep up to timeout_us while nothing can progress (used if wait_fd is -1). */
    void (*wait)(shoal_tl_ctx_t *ctx, int timeout_us);
    /* Optional: tell every peer this communicator failed because of 'culprit' (best effort,
     * never blocks), then fail every pending request with status. */
    void (*fail)(shoal_tl_ctx_t *ctx, int culprit, shoal_status_t status);
    /* Optional (SHOAL_TL_CAP_SHARED_AREA): the shared area of the local peer with this local
     * rank (own one included), mapped in this process, faulted in, zeroed at init. */
    void *(*shared_area)(shoal_tl_ctx_t *ctx, int local_rank, size_t *len_p);
    /* Optional: wake the local peer if it sleeps in wait() (after writing its shared area). */
    void (*notify)(shoal_tl_ctx_t *ctx, int local_rank);
    /* Optional: 0 if the local peer process is alive and has not failed its communicator;
     * otherwise SHOAL_ERR_PEER_FAILED, a sentence in why and in *culprit_p the rank that peer
     * blamed (-1: none, it died). Cheap (may be rate limited). */
    shoal_status_t (*peer_check)(shoal_tl_ctx_t *ctx, int local_rank, char *why, size_t len,
                                 int *culprit_p);
    void (*fini)(shoal_tl_ctx_t *ctx);
    /* Optional (SHOAL_TL_CAP_PEER_MEM), after fini so that older plugins keep their layout.
     * mem_query: 1 and the handle in *m_p if [ptr, ptr + len) lies in one shoal_mem_alloc
     * buffer of this process, else 0. */
    int (*mem_query)(const void *ptr, size_t len, shoal_tl_mem_t *m_p);
    /* Maps local peer local_rank's allocation m here (once: cached until fini, checked by
     * owner, mode, size and header); the address of m->base here, or NULL (logged). */
    void *(*mem_map)(shoal_tl_ctx_t *ctx, int local_rank, const shoal_tl_mem_t *m);
    /* 1 if single copies to and from every local peer's memory work (probed at connect). */
    int (*peer_copy_ok)(shoal_tl_ctx_t *ctx);
    /* One copy between local memory and local peer local_rank's address 'remote' (write: to
     * the peer); all len bytes or an error (logged, the peer named). */
    shoal_status_t (*peer_copy)(shoal_tl_ctx_t *ctx, int local_rank, int write, void *local,
                                uint64_t remote, size_t len);
    /* Optional (SHOAL_TL_CAP_HOST_CPU), after peer_copy for the same reason: 1 if this
     * context's device moves the data with this host's CPUs (a software RDMA device: the
     * kernel's packet processing), so that a waiter spinning on a CPU the device needs delays
     * the very transfer it waits for; else 0. */
    int (*host_cpu)(shoal_tl_ctx_t *ctx);
    /* Optional, after host_cpu: 1 and the port init would use in *link_p (opened and closed
     * quietly: shoal_info -t), else 0. */
    int (*link)(shoal_tl_link_t *link_p);
    /* Optional (SHOAL_TL_CAP_PEER_MEM), after link: 1 if mem_map can reach every local peer's
     * buffers (the kernel lets this process take their descriptors; probed once), else 0;
     * NULL: as if 1. */
    int (*mem_reach_ok)(shoal_tl_ctx_t *ctx);
} shoal_tl_ops_t;

/* ---- libraries loaded at first use ---------------------------------------------------------
 * libshoal never links an optional transport's library (UCX, verbs): loading one runs its
 * constructors in every process (UCX's installs SIGSEGV/SIGBUS/SIGILL/SIGFPE handlers), so a
 * job that uses only shm and tcp must not have it mapped at all. Such a transport keeps its
 * code in libshoal and calls the library through forwarders of the same names (ucx_dl.c,
 * ib_dl.c): hidden functions that jump through pointers resolved by shoal_tl_lib_load() when
 * the transport is first queried or initialised. The registry queries it only when it may be
 * used (shoal_tl_query_mask). A symbol the transport calls and the forwarder file lacks is an
 * undefined reference at link time, never a silent dependency. */
typedef struct {
    const char *name;             /* symbol in the library */
    void **slot;                  /* receives its address */
} shoal_tl_sym_t;

typedef struct shoal_tl_lib {
    const char *what;             /* "UCX": for messages */
    const char *const *path_p;    /* config value: file name (dynamic loader's search) or path */
    const char *dflt;             /* file name if the config value is empty */
    const char *fallback_dir;     /* where configure found it ("" if in the default path) */
    const char *keep_signals_env; /* set in the environment: keep the library's signal handlers */
    /* set in the environment: keep the library's SIGHUP handler (UCX's debug signal, which it
     * takes whatever UCX_HANDLE_ERRORS says; SIGHUP then no longer ends the process) */
    const char *keep_hup_env;
    const shoal_tl_sym_t *syms;
    size_t nsyms;
    /* NULL, or 0 when this machine surely has nothing the library could drive (no device in
     * sysfs): a transport that is not forced is then not queried, its library not loaded */
    int (*present)(void);
    /* NULL, or asked after query() said yes, unless the transport is forced: 0 when it can run
     * but is not worth choosing automatically across hosts (ucx where UCX has no RDMA
     * transport: UCX over tcp is slower than the tcp transport); the library is loaded then */
    int (*auto_ok)(void);
    /* state, under lock; loaded once, never unloaded */
    pthread_mutex_t lock;
    int tried;
    shoal_status_t status;
    void *handle;
    char why[640];                /* "loaded from PATH" or why it is unavailable */
    /* Left by present() and query() (optional): what they found, or why not, for the sentence
     * that says which transport carries the channels across hosts ("" if nothing to add) */
    char note[200];
} shoal_tl_lib_t;

#define SHOAL_TL_LIB_STATE_INIT                                                                \
    .lock = PTHREAD_MUTEX_INITIALIZER, .tried = 0, .status = SHOAL_ERR_UNSUPPORTED,           \
    .handle = NULL, .why = "not loaded", .note = ""

/* Loads the library and resolves every symbol (first call; later calls return the outcome).
 * Restores the application's handlers of fatal signals (and SIGHUP) that the library's
 * constructors replaced, unless keep_signals_env (keep_hup_env for SIGHUP) is set. SHOAL_OK, or SHOAL_ERR_UNSUPPORTED with the
 * sentence in lib->why (logged at INFO: a transport that is not used may well be absent). */
SHOAL_HIDDEN shoal_status_t shoal_tl_lib_load(shoal_tl_lib_t *lib);

/* Registry in preference order (src/core/tl_registry.c). */
SHOAL_HIDDEN const shoal_tl_ops_t *shoal_tl_find(const char *name);
SHOAL_HIDDEN size_t shoal_tl_count(void);
SHOAL_HIDDEN const shoal_tl_ops_t *shoal_tl_get(size_t i);
/* The library transport i loads at first use, or NULL (built in, nothing to load). */
SHOAL_HIDDEN shoal_tl_lib_t *shoal_tl_lib(size_t i);
/* Bit i set: transport i is usable here. A transport with a library is queried (and its
 * library loaded) only if it is forced (index forced, -1: none), or if no transport before it
 * can reach other hosts and its lib's present() does not say the machine has no device; so a
 * job on shm/tcp never loads UCX, nor verbs on a host without an RDMA device. The transports
 * named in SHOAL_TRANSPORT_EXCLUDE are never queried. Logs (INFO) which transport carries
 * the channels to other hosts, and why. */
SHOAL_HIDDEN unsigned shoal_tl_query_mask(int forced);

/* The same on any table (unit tests give fake ones): entries in preference order; exclude:
 * bit i set, entry i is not queried; forced: -1 or an index. *across_p (if not NULL): the
 * index of the first usable transport that reaches other hosts, -1 if none; why (if not
 * NULL): a sentence naming it and why each one before it was not taken. */
typedef struct {
    const shoal_tl_ops_t *ops;
    shoal_tl_lib_t *lib;          /* loaded at first use, or NULL */
} shoal_tl_entry_t;
SHOAL_HIDDEN unsigned shoal_tl_query_table(const shoal_tl_entry_t *tab, size_t n, int forced,
                                           unsigned exclude, int *across_p, char *why,
                                           size_t len);
/* shoal_tl_query_mask without the log line: its sentence in why (shoal_info -b). */
SHOAL_HIDDEN unsigned shoal_tl_query_mask_why(int forced, char *why, size_t len);
/* SHOAL_TRANSPORT_EXCLUDE as a mask of registry indexes (unknown names warned about). */
SHOAL_HIDDEN unsigned shoal_tl_exclude_mask(void);

extern SHOAL_HIDDEN const shoal_tl_ops_t shoal_tl_shm_ops;
extern SHOAL_HIDDEN const shoal_tl_ops_t shoal_tl_tcp_ops;
#if SHOAL_HAVE_VERBS
extern SHOAL_HIDDEN const shoal_tl_ops_t shoal_tl_ib_ops;
extern SHOAL_HIDDEN shoal_tl_lib_t shoal_ib_lib;       /* libibverbs (transports/ib/ib_dl.c) */
#endif
#if SHOAL_HAVE_UCX
extern SHOAL_HIDDEN const shoal_tl_ops_t shoal_tl_ucx_ops;
extern SHOAL_HIDDEN shoal_tl_lib_t shoal_ucx_lib;      /* libucp (transports/ucx/ucx_dl.c) */
#endif

#endif
