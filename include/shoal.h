/*
 * shoal: collective communication for shared, multi-tenant GPU clusters.
 * The one public header. See README.md for a tour, the API table and every variable.
 */
#ifndef SHOAL_H
#define SHOAL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SHOAL_EXPORT __attribute__((visibility("default")))
#else
#define SHOAL_EXPORT
#endif

#define SHOAL_VERSION_MAJOR 0
#define SHOAL_VERSION_MINOR 1
#define SHOAL_VERSION_PATCH 0

/* One map generates the enum, shoal_strerror() and shoal_status_name().
 * Ranges: -1..-39 call errors, -40..-59 communicator fatal, -60..-79 tenancy. */
#define SHOAL_STATUS_MAP(X)                                                     \
    X(OK,               0, "success")                                           \
    X(IN_PROGRESS,      1, "operation in progress")                             \
    X(ERR_INVALID_ARG, -1, "invalid argument")                                  \
    X(ERR_NO_MEMORY,   -2, "out of memory")                                     \
    X(ERR_SYSTEM,      -3, "system call failed")                                \
    X(ERR_UNSUPPORTED, -4, "operation not supported")                           \
    X(ERR_INTERNAL,    -5, "internal error")                                    \
    X(ERR_TIMEOUT,    -20, "timed out")                                         \
    X(ERR_TRANSPORT,  -40, "transport failure")                                 \
    X(ERR_PROTOCOL,   -41, "protocol violation")                                \
    X(ERR_PEER_FAILED,-42, "peer process failed")                               \
    X(ERR_ABORTED,    -43, "communicator aborted")                              \
    X(ERR_AUTH,       -60, "authentication failed")                             \
    X(ERR_PERMISSION, -61, "permission denied")

typedef enum {
#define SHOAL_STATUS_ENUM_(name, val, str) SHOAL_##name = (val),
    SHOAL_STATUS_MAP(SHOAL_STATUS_ENUM_)
#undef SHOAL_STATUS_ENUM_
} shoal_status_t;

/* Data types. Keep the order: tools and tests index tables by it. */
typedef enum {
    SHOAL_INT8 = 0,
    SHOAL_UINT8,
    SHOAL_INT32,
    SHOAL_UINT32,
    SHOAL_INT64,
    SHOAL_UINT64,
    SHOAL_FLOAT16,
    SHOAL_BFLOAT16,
    SHOAL_FLOAT32,
    SHOAL_FLOAT64,
    SHOAL_DTYPE_COUNT
} shoal_dtype_t;

/* Reduction ops. Integer SUM and PROD wrap; AVG is the SUM divided once by the rank count:
 * that sum wraps (integers) or rounds to inf (fp16/bf16) before the divide, and integers are
 * truncated toward zero. */
typedef enum {
    SHOAL_SUM = 0,
    SHOAL_PROD,
    SHOAL_MIN,
    SHOAL_MAX,
    SHOAL_AVG,
    SHOAL_OP_COUNT
} shoal_op_t;

/* Opaque 128-byte rendezvous blob: root address and a random 256-bit job secret. */
#define SHOAL_UID_BYTES 128
typedef struct {
    char internal[SHOAL_UID_BYTES];
} shoal_uid_t;

typedef struct shoal_comm *shoal_comm_t;
typedef struct shoal_request *shoal_request_t;

typedef enum {
    SHOAL_QOS_DEFAULT = 0,
    SHOAL_QOS_GUARANTEED,
    SHOAL_QOS_BURSTABLE,
    SHOAL_QOS_SPOT
} shoal_qos_class_t;

/* Caller's configuration. Initialise with SHOAL_CONFIG_INIT; a field left at its initial value
 * (0 / NULL) means "not set": the environment or the built-in default decides. */
typedef struct {
    size_t size;             /* sizeof(shoal_config_t), filled by SHOAL_CONFIG_INIT */
    const char *tenant;      /* tenant id */
    const char *job_name;    /* job name for metering and logs */
    int qos_class;           /* shoal_qos_class_t */
    int qos_weight;          /* > 0 */
    int timeout_ms;          /* every wait's deadline; < 0 means infinite */
    const char *transport;   /* "shm", "tcp", or NULL for automatic */
    const char *algorithm;   /* "ring", "rd", ... (SHOAL_ALGO's names) or NULL for automatic;
                              * rank 0's is every rank's: an unknown name there fails every
                              * rank's init (SHOAL_ERR_INVALID_ARG), elsewhere it is ignored */
} shoal_config_t;

#define SHOAL_CONFIG_INIT                                                       \
    { sizeof(shoal_config_t), NULL, NULL, SHOAL_QOS_DEFAULT, 0, 0, NULL, NULL }

/* Status */
SHOAL_EXPORT const char *shoal_strerror(shoal_status_t status);
SHOAL_EXPORT const char *shoal_status_name(shoal_status_t status);
SHOAL_EXPORT const char *shoal_version_string(void);
SHOAL_EXPORT size_t shoal_dtype_size(shoal_dtype_t dtype);
SHOAL_EXPORT const char *shoal_dtype_name(shoal_dtype_t dtype);
SHOAL_EXPORT const char *shoal_op_name(shoal_op_t op);

/* Bootstrap and lifecycle */
SHOAL_EXPORT shoal_status_t shoal_get_unique_id(shoal_uid_t *uid);
SHOAL_EXPORT shoal_status_t shoal_comm_init(shoal_comm_t *comm_p, int nranks, int rank,
                                            const shoal_uid_t *uid, const shoal_config_t *cfg);
SHOAL_EXPORT shoal_status_t shoal_comm_init_env(shoal_comm_t *comm_p, const shoal_config_t *cfg);
/* A communicator belongs to the process that made it: in a process forked from it, every call
 * on it (destroy, abort and stop requests included) is SHOAL_ERR_INVALID_ARG and touches
 * nothing; only the queries shoal_comm_rank, shoal_comm_size and shoal_comm_last_error
 * answer, from the copy. */
SHOAL_EXPORT shoal_status_t shoal_comm_destroy(shoal_comm_t comm);
SHOAL_EXPORT shoal_status_t shoal_comm_abort(shoal_comm_t comm);
SHOAL_EXPORT shoal_status_t shoal_comm_split(shoal_comm_t comm, int color, int key,
                                             shoal_comm_t *newcomm_p);
SHOAL_EXPORT shoal_status_t shoal_comm_rank(shoal_comm_t comm, int *rank_p);
SHOAL_EXPORT shoal_status_t shoal_comm_size(shoal_comm_t comm, int *size_p);
SHOAL_EXPORT const char *shoal_comm_last_error(shoal_comm_t comm);
/* Whether comm has failed, asked without a collective and without blocking (as NCCL's
 * ncclCommGetAsyncError): *async_error is SHOAL_OK while comm is usable, otherwise the status
 * every later call returns (SHOAL_ERR_PEER_FAILED: a peer died or failed; SHOAL_ERR_TIMEOUT:
 * no progress within the timeout; SHOAL_ERR_ABORTED: shoal_comm_abort, or the communicator
 * was failed with calls in flight), with shoal_comm_last_error's sentence naming the rank.
 * A call in flight (blocking, or shoal_i* requests on the proxy thread) detects failures
 * itself; on an idle communicator this call looks at the peers of this host (their processes,
 * and whether they failed their own communicator; at most every 2 ms) and fails comm when one
 * is gone; peers on other hosts are seen failed by the next call that talks to them. A stop
 * request is not a failure (comm stays usable for shoal_comm_should_stop). Safe from any
 * thread while others use comm. SHOAL_ERR_INVALID_ARG for a NULL comm or async_error. */
SHOAL_EXPORT shoal_status_t shoal_comm_get_async_error(shoal_comm_t comm,
                                                       shoal_status_t *async_error);
#define SHOAL_SPLIT_NOCOLOR (-1)

/* Coordinated stop (preemption). A job told to stop (Slurm's --signal, SIGTERM from
 * Kubernetes) must stop on every rank at the same step, so that its checkpoint is one
 * consistent state, even when only some ranks got the signal (torchrun does not forward
 * SIGUSR1 to its workers; sbatch --signal=B:... signals only the batch shell).
 * - shoal_comm_request_stop(comm) asks comm to stop; shoal_request_stop() asks every
 *   communicator of the process, present and future (a handler rarely has a handle). Both are
 *   async-signal-safe (one lock-free atomic store: no allocation, lock or log), so they may be
 *   called from the application's signal handler or from any thread. A request is sticky.
 *   comm must stay valid while a handler may use it; shoal_request_stop needs none.
 * - shoal_comm_should_stop(comm, &stop) is a collective: every rank calls it at the same point
 *   of its loop (e.g. after each step). It agrees, with one AllReduce MAX of 4 bytes under the
 *   communicator's timeout and failure detection, whether any rank had a request when it
 *   entered the call, and sets *stop to that answer (0 or 1): the same on every rank for the
 *   same call. A request arriving during the agreement is answered by the next call. When a
 *   call that agrees returns (each one up to the first answer of 1), every rank has finished
 *   the calls it issued on comm before it (host calls and shoal_i* requests; synchronise a
 *   stream first). Once the answer was 1 it stays 1: later calls return 1 at once, without
 *   traffic, and say nothing of the other ranks' calls. A failed or aborted communicator
 *   returns its error and leaves *stop unchanged: a dead rank is an error within
 *   SHOAL_TIMEOUT_MS, never a hang.
 * - SHOAL_STOP_SIGNALS=USR1,TERM: the library installs a handler for those signals that calls
 *   shoal_request_stop (and then the application's previous handler, if it had one), at the
 *   first communicator's init, and restores the previous actions when the last communicator
 *   is destroyed, unless a stop is under way (one of the signals came, or an agreement said
 *   stop): then the handler stays, so that a late or repeated signal cannot kill the process
 *   while it checkpoints and exits. Unset (the default), the library changes no signal
 *   disposition. */
SHOAL_EXPORT shoal_status_t shoal_comm_request_stop(shoal_comm_t comm);
SHOAL_EXPORT shoal_status_t shoal_request_stop(void);
SHOAL_EXPORT shoal_status_t shoal_comm_should_stop(shoal_comm_t comm, int *stop_p);

/* Metering: a communicator's exact counters since shoal_comm_init (monotonic; deltas between
 * two reads are exact). Payload bytes only (no headers), counted once per message when the
 * transport accepts it; the intra-node direct AllReduce counts what a rank takes from peers'
 * shared areas as received and what peers take from its own area as sent. Initialise with
 * SHOAL_STATS_INIT: the library fills at most stats->size bytes, so the struct can grow at
 * its end. SHOAL_ERR_UNSUPPORTED with SHOAL_METER=0. Any thread; while a call runs on
 * another thread each counter is exact but the set may straddle that call. */
#define SHOAL_STATS_NCOLL 16 /* room for more collectives; unused entries are 0 */
#define SHOAL_STATS_NTL 8    /* room for more transports; unused entries are 0 */
enum {
    SHOAL_STATS_ALLREDUCE = 0, SHOAL_STATS_BROADCAST, SHOAL_STATS_REDUCE, SHOAL_STATS_ALLGATHER,
    SHOAL_STATS_REDUCE_SCATTER, SHOAL_STATS_BARRIER, SHOAL_STATS_SEND, SHOAL_STATS_RECV,
    SHOAL_STATS_ALLTOALL
};
/* SHOAL_STATS_TL_CUDA_IPC: device-to-device bytes between the GPUs of ranks on one host
 * (the CUDA layer's IPC path: what this rank's device read from peers' device buffers is
 * received, what peers' devices read from its buffer is sent); same host only.
 * SHOAL_STATS_TL_NCCL: AllReduces delegated to NCCL (SHOAL_CUDA_BACKEND=nccl), counted as
 * their ring-equivalent bytes, floor(2 (n - 1) S / n) sent and as many received per rank for
 * S bytes on n ranks (nccl-tests' busbw factor; NCCL does not report what it moved); same
 * host only. */
enum { SHOAL_STATS_TL_SHM = 0, SHOAL_STATS_TL_TCP, SHOAL_STATS_TL_UCX, SHOAL_STATS_TL_IB,
       SHOAL_STATS_TL_CUDA_IPC, SHOAL_STATS_TL_NCCL };
enum { SHOAL_STATS_SAME_HOST = 0, SHOAL_STATS_OTHER_HOST };

typedef struct {
    size_t size;                      /* sizeof(shoal_stats_t), filled by SHOAL_STATS_INIT */
    uint64_t ops_total;               /* calls that ran (successfully or not) */
    uint64_t ops[SHOAL_STATS_NCOLL];  /* per collective, SHOAL_STATS_ALLREDUCE... */
    uint64_t bytes_sent;              /* payload bytes, all transports and localities */
    uint64_t bytes_recv;
    uint64_t bytes_sent_same_host;    /* to peers with this rank's host id */
    uint64_t bytes_sent_other_host;
    uint64_t bytes_recv_same_host;
    uint64_t bytes_recv_other_host;
    uint64_t bytes_sent_by[SHOAL_STATS_NTL][2]; /* [SHOAL_STATS_TL_*][SHOAL_STATS_*_HOST] */
    uint64_t bytes_recv_by[SHOAL_STATS_NTL][2];
    uint64_t coll_ns;                 /* time inside calls (host side, entry to return; TSC;
                                       * a stream-ordered call: from the stream reaching it
                                       * to its release of the stream) */
    uint64_t errors;                  /* calls that returned an error */
    uint64_t peer_failures;           /* calls that found a peer failed, lost or timed out */
    uint64_t aborts;                  /* shoal_comm_abort calls */
    /* QoS (src/qos): the communicator's effective class and weight (a credential's, which a
     * variable may only lower) and the marks it carries; -1: that mark is left alone. */
    int32_t qos_class;                /* shoal_qos_class_t */
    int32_t qos_weight;
    int32_t qos_dscp;                 /* TCP sockets: IP_TOS / IPV6_TCLASS = dscp << 2 */
    int32_t qos_priority;             /* TCP sockets: SO_PRIORITY */
    int32_t qos_ib_tc;                /* IB / RoCE / UCX traffic class; -1: SHOAL_IB_TC */
    int32_t qos_ib_sl;                /* IB service level; -1: SHOAL_IB_SL */
    uint64_t qos_rate_max;            /* SHOAL_QOS_LINK_RATE_MAX: bytes/s per peer connection */
    uint64_t paced_ns;                /* time this rank's sends were held back by QoS pacing */
    uint64_t pace_rate;               /* this rank's pacing rate now, bytes/s; 0 = not paced */
} shoal_stats_t;

#define SHOAL_STATS_INIT { sizeof(shoal_stats_t) }

SHOAL_EXPORT shoal_status_t shoal_comm_stats(shoal_comm_t comm, shoal_stats_t *stats);

/* Host buffers that the local ranks of a communicator read and write in place (like
 * ncclMemAlloc): an AllReduce on one host whose every rank passes such buffers (send and
 * receive; in place too) reduces straight out of the peers' inputs into every rank's output,
 * with no staging copy. Each buffer is a shared-memory segment (memfd, mode 0600) of this
 * process, not tied to a communicator; a local peer maps it the first time a collective uses
 * it (only processes of the same user that may inspect this one can), until that
 * communicator is destroyed. Any other use is that of ordinary memory. size > 0; *ptr_p is
 * page-aligned; more than the host's available memory (or the memory cgroup's limit) is
 * SHOAL_ERR_NO_MEMORY. shoal_mem_free(NULL) is a no-op; another pointer is SHOAL_ERR_INVALID_ARG.
 * Free a buffer only when no collective uses it. */
SHOAL_EXPORT shoal_status_t shoal_mem_alloc(size_t size, void **ptr_p);
SHOAL_EXPORT shoal_status_t shoal_mem_free(void *ptr);

/* Collectives. stream is a cudaStream_t or NULL.
 * - stream == NULL, host buffers: a blocking host call.
 * - stream == NULL, device buffers (CUDA builds): blocking; like cudaMemcpy it first waits for
 *   the device's earlier work and returns with the result in place.
 * - stream != NULL (CUDA builds): stream-ordered. The call returns at once; the collective
 *   starts when the work enqueued on stream before it is done, and the work enqueued after it
 *   waits for it (the host is never blocked). Buffers may be device or host memory and must
 *   stay valid until the stream passed the call. For the legacy default stream pass
 *   cudaStreamLegacy ((void *)1), for the per-thread one cudaStreamPerThread ((void *)2).
 *   An error found later (peer failure) releases the stream with undefined results and makes
 *   the communicator fail: shoal_comm_last_error() says why, the next call returns it.
 * sendbuf == recvbuf is in place (AllGather: also sendbuf at recvbuf's block of this rank;
 * ReduceScatter: also recvbuf at sendbuf's block of this rank); buffers that overlap in any
 * other way are SHOAL_ERR_INVALID_ARG.
 * Every rank passes the same kind of buffers (all device or all host) to one collective.
 * Every rank passes the same count, dtype, op and root to one collective. Only the intra-node
 * AllReduce compares them by itself (SHOAL_ERR_INVALID_ARG on every rank); elsewhere a
 * difference fails the communicator, waits out its timeout, or goes unnoticed: an op, a
 * dtype of the same size, or a broadcast's root (ranks that name different roots may all
 * return SHOAL_OK with no data moved) give wrong results. SHOAL_CHECK_ARGS=1 compares
 * them before every call (one small exchange; nonblocking calls then run one at a time):
 * SHOAL_ERR_INVALID_ARG on every rank, the communicator stays usable.
 * Without CUDA (no CUDA build, or no driver / GPU at run time) a stream or a device buffer is
 * SHOAL_ERR_UNSUPPORTED; host buffers work everywhere. */
SHOAL_EXPORT shoal_status_t shoal_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                            shoal_dtype_t dtype, shoal_op_t op,
                                            shoal_comm_t comm, void *stream);
SHOAL_EXPORT shoal_status_t shoal_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                                            shoal_dtype_t dtype, int root, shoal_comm_t comm,
                                            void *stream);
SHOAL_EXPORT shoal_status_t shoal_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                         shoal_dtype_t dtype, shoal_op_t op, int root,
                                         shoal_comm_t comm, void *stream);
/* sendcount elements from each rank; recvbuf holds nranks * sendcount. */
SHOAL_EXPORT shoal_status_t shoal_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                            shoal_dtype_t dtype, shoal_comm_t comm, void *stream);
/* sendbuf holds nranks * recvcount; rank r receives block r reduced. */
SHOAL_EXPORT shoal_status_t shoal_reduce_scatter(const void *sendbuf, void *recvbuf,
                                                 size_t recvcount, shoal_dtype_t dtype,
                                                 shoal_op_t op, shoal_comm_t comm, void *stream);
/* count elements to each rank: sendbuf holds nranks blocks of count (block r goes to rank r),
 * recvbuf receives nranks blocks (block r from rank r). sendbuf == recvbuf is in place. */
SHOAL_EXPORT shoal_status_t shoal_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                                           shoal_dtype_t dtype, shoal_comm_t comm, void *stream);
SHOAL_EXPORT shoal_status_t shoal_barrier(shoal_comm_t comm, void *stream);
SHOAL_EXPORT shoal_status_t shoal_send(const void *sendbuf, size_t count, shoal_dtype_t dtype,
                                       int peer, shoal_comm_t comm, void *stream);
SHOAL_EXPORT shoal_status_t shoal_recv(void *recvbuf, size_t count, shoal_dtype_t dtype,
                                       int peer, shoal_comm_t comm, void *stream);

/* Groups: the stream-ordered / device-buffer calls between shoal_group_start and the outermost
 * shoal_group_end are submitted together at the end, one proxy task per (communicator,
 * stream); the sends and receives of a group are posted at once, so a group may hold matching
 * send/recv pairs in any order. On device buffers that holds while the group's messages, each
 * counted up to SHOAL_CUDA_CHUNK_SIZE, fit SHOAL_CUDA_STAGING_SIZE together (64 messages at
 * most); a larger group runs in parts, in order, and a part must not wait for a later one.
 * Blocking host sends and receives (host buffers, stream NULL) inside a group return
 * SHOAL_OK at once (or refuse bad arguments at once); the outermost shoal_group_end posts them
 * all on their communicator's channels, in issue order with the other calls on it, and waits
 * for them together, those of every communicator of the group at once, each under its
 * communicator's timeout, so they too may come in any order on either side and across the
 * communicators; their buffers must stay valid until then. The end returns the first failure
 * (that communicator is failed, shoal_comm_last_error names the peer; the other
 * communicators' messages still complete). A communicator destroyed before the end
 * drops what this thread's group recorded on it, and the end returns SHOAL_ERR_INVALID_ARG.
 * Other host calls on host buffers inside a group run at once. Groups nest and are per
 * thread. */
SHOAL_EXPORT shoal_status_t shoal_group_start(void);
SHOAL_EXPORT shoal_status_t shoal_group_end(void);

/* Non-blocking host calls, progressed by the communicator's proxy thread: the same arguments
 * as the blocking calls (host buffers only), plus the request. They start in issue order with
 * the blocking calls of the communicator, and several in flight progress together (those of
 * one communicator that share a channel run one after the other, in issue order). The
 * buffers must stay untouched until the request completes. A failure (a peer lost, the
 * deadline SHOAL_TIMEOUT_MS without progress, shoal_comm_abort) completes every request in
 * flight with the error; shoal_comm_last_error names the rank. A call that is refused
 * (an error status) sets *req_p to NULL, a completed request. */
SHOAL_EXPORT shoal_status_t shoal_iallreduce(const void *sendbuf, void *recvbuf, size_t count,
                                             shoal_dtype_t dtype, shoal_op_t op,
                                             shoal_comm_t comm, shoal_request_t *req_p);
SHOAL_EXPORT shoal_status_t shoal_ibroadcast(const void *sendbuf, void *recvbuf, size_t count,
                                             shoal_dtype_t dtype, int root, shoal_comm_t comm,
                                             shoal_request_t *req_p);
SHOAL_EXPORT shoal_status_t shoal_iallgather(const void *sendbuf, void *recvbuf,
                                             size_t sendcount, shoal_dtype_t dtype,
                                             shoal_comm_t comm, shoal_request_t *req_p);
SHOAL_EXPORT shoal_status_t shoal_ireduce_scatter(const void *sendbuf, void *recvbuf,
                                                  size_t recvcount, shoal_dtype_t dtype,
                                                  shoal_op_t op, shoal_comm_t comm,
                                                  shoal_request_t *req_p);
SHOAL_EXPORT shoal_status_t shoal_ialltoall(const void *sendbuf, void *recvbuf, size_t count,
                                            shoal_dtype_t dtype, shoal_comm_t comm,
                                            shoal_request_t *req_p);
SHOAL_EXPORT shoal_status_t shoal_ireduce(const void *sendbuf, void *recvbuf, size_t count,
                                          shoal_dtype_t dtype, shoal_op_t op, int root,
                                          shoal_comm_t comm, shoal_request_t *req_p);
SHOAL_EXPORT shoal_status_t shoal_ibarrier(shoal_comm_t comm, shoal_request_t *req_p);
/* Test or wait for *req_p. The call that finds the request complete frees it, sets *req_p to
 * NULL and returns its status (*done_p = 1); a NULL *req_p is a completed request (done,
 * SHOAL_OK), so a second test or wait is harmless. req_p == NULL: SHOAL_ERR_INVALID_ARG. In a
 * process forked from the one that made it, a request in flight at the fork never completes:
 * SHOAL_ERR_INVALID_ARG at once (done, *req_p = NULL), as every call on the parent's
 * communicator there. */
SHOAL_EXPORT shoal_status_t shoal_test(shoal_request_t *req_p, int *done_p);
SHOAL_EXPORT shoal_status_t shoal_wait(shoal_request_t *req_p);

#ifdef __cplusplus
}
#endif
#endif /* SHOAL_H */
