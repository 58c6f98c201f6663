/* Internals of the CUDA layer: knobs, the per-communicator state, the executors. */
#ifndef SHOAL_CUDA_INT_H
#define SHOAL_CUDA_INT_H

#include "cuda/cuda.h"
#include "cuda/cuda_drv.h"
#include "cuda/kern_abi.h"
#include "cuda/pipe.h"

typedef enum {
    SHOAL_CUDA_BACKEND_AUTO = 0, /* ipc on one host where every rank can map the others, else staging */
    SHOAL_CUDA_BACKEND_STAGING,  /* always pinned host staging + host algorithms */
    SHOAL_CUDA_BACKEND_IPC,      /* like auto (ipc where possible) */
    SHOAL_CUDA_BACKEND_NCCL      /* AllReduce on one host with one GPU per rank: NCCL */
} shoal_cuda_backend_t;

typedef enum {
    SHOAL_CUDA_SYNC_AUTO = 0,    /* memops where the device supports them, else hostfn */
    SHOAL_CUDA_SYNC_MEMOPS,      /* cuStreamWriteValue32 / cuStreamWaitValue32 on host flags */
    SHOAL_CUDA_SYNC_HOSTFN,      /* a host function signals the start, a kernel waits */
    SHOAL_CUDA_SYNC_HOST         /* the call waits on the host for its stream, then runs */
} shoal_cuda_sync_t;

typedef struct {
    const char *libcuda;         /* SHOAL_CUDA_LIBCUDA */
    size_t staging_size;         /* SHOAL_CUDA_STAGING_SIZE */
    size_t chunk_size;           /* SHOAL_CUDA_CHUNK_SIZE */
    int backend;                 /* SHOAL_CUDA_BACKEND */
    size_t ipc_size;             /* SHOAL_CUDA_IPC_SIZE */
    int sync;                    /* SHOAL_CUDA_SYNC */
    const char *libnccl;         /* SHOAL_CUDA_LIBNCCL */
} shoal_cuda_config_t;
extern SHOAL_HIDDEN shoal_cuda_config_t shoal_cuda_config;
/* Parses the table once unless src/util/config_tables.c lists it (then the global init did). */
SHOAL_HIDDEN void shoal_cuda_config_load(void);

#define SHOAL_CUDA_FLAG_SLOTS 256   /* stream tasks in flight per communicator */
#define SHOAL_CUDA_FLAG_STRIDE 16   /* uint32 words: one 64-byte line per flag */
#define SHOAL_CUDA_KICK_WORD 8      /* flags[8], in done's line: the target of the kick */

/* Kind of one buffer. */
typedef struct {
    int dev;                     /* 1: device (or managed) memory */
    int ordinal;                 /* its device, or -1 */
} shoal_cuda_ptr_t;

struct shoal_cuda_comm;

/* The argument of the host function that signals a stream task's start
 * (SHOAL_CUDA_SYNC=hostfn; the kernel shoal_stream_wait then waits for its end). */
struct shoal_cuda_hostfn_slot {
    struct shoal_cuda_comm *cc; /* only its flags are written (it may outlive its
                                 * communicator: cuda_comm.c keeps it then) */
    uint64_t seq;
    int busy;                   /* the start host function of seq has not run yet */
};

typedef struct shoal_cuda_comm {
    struct shoal_comm *comm;
    CUdevice dev;
    int ordinal;
    CUcontext ctx;               /* the device's primary context (the runtime's) */
    int nsm;
    int memops;                  /* stream memory operations in use */
    int sync_host;               /* SHOAL_CUDA_SYNC=host: stream calls run on the caller */
    int legacy_said;             /* the legacy stream's host wait was logged */
    int kick;                    /* ranks share the GPU without MPS: submit after releasing */
    CUevent host_ev;             /* host waits: marks where the caller's stream is */
    char busid[32];
    CUmodule module;
    CUfunction fns[SHOAL_DTYPE_COUNT][4];
    CUfunction wait_fn;          /* shoal_stream_wait (SHOAL_CUDA_SYNC=hostfn) */
    CUstream d2h, h2d, kern;     /* internal non-blocking streams */
    CUevent ev[2][SHOAL_PIPE_MAX_SLOTS];
    uint8_t *staging;            /* pinned, staging_size bytes */
    size_t staging_size;
    /* stream ordering: flags[0] = done, flags[(1 + s) * STRIDE] = start of slot s */
    volatile uint32_t *flags;
    CUdeviceptr dflags;
    struct shoal_cuda_hostfn_slot *hslots;
    pthread_mutex_t issue_lock;
    uint64_t issued;             /* stream tasks issued (under issue_lock) */
    uint64_t done;               /* completed, written by the proxy (atomic) */
    /* same-host direct path (cuda_ipc.c): 0 not tried, 1 usable, -1 not usable */
    int ipc_state;
    CUdeviceptr ipc_buf;
    size_t ipc_size;
    size_t ipc_chunk_bytes;      /* the smallest ipc_size of the ranks: bytes per chunk */
    CUdeviceptr *ipc_peer;       /* [nranks]; own entry = ipc_buf */
    /* NCCL delegate (cuda_nccl.c) */
    int nccl_state;
    void *nccl_comm;
    /* device copy of a host input or output for NCCL, grown by doubling; the smaller ones it
     * replaced are freed with it at the destroy (a free in between waits for the device,
     * whose user streams may wait for the call that frees) */
    CUdeviceptr nccl_tmp, nccl_old[48];
    size_t nccl_tmp_size;
    int nccl_nold;
    struct shoal_cuda_comm *kept_next; /* kept past its destroy (cuda_comm.c) */
} shoal_cuda_comm_t;

/* One recorded call of a batch. */
typedef struct {
    shoal_coll_args_t a;
    shoal_cuda_ptr_t in, out;
} shoal_cuda_item_t;

/* The kernels (kernels.cu) as an nvcc fatbin, embedded by the build (kernels_fatbin.c). */
extern SHOAL_HIDDEN const unsigned char shoal_cuda_fatbin[];
extern SHOAL_HIDDEN const size_t shoal_cuda_fatbin_size;

/* cuda_comm.c */
SHOAL_HIDDEN shoal_status_t shoal_cuda_ptr_kind(const void *p, shoal_cuda_ptr_t *kind_p);
SHOAL_HIDDEN shoal_status_t shoal_cuda_comm_get(struct shoal_comm *comm, int ordinal,
                                                shoal_cuda_comm_t **cc_p);
SHOAL_HIDDEN shoal_status_t shoal_cuda_ctx_enter(shoal_cuda_comm_t *cc);
/* The calling thread's current context (NULL: none), and making it current again. */
SHOAL_HIDDEN CUcontext shoal_cuda_ctx_save(void);
SHOAL_HIDDEN void shoal_cuda_ctx_restore(CUcontext saved);
/* dst = srcs[0] op ... op srcs[nsrc-1] on stream (any nsrc >= 1, passes of MAX_SRCS: fp16/bf16
 * are rounded once up to MAX_SRCS sources, once per pass beyond); avg_div > 1 divides the
 * result (AVG). */
SHOAL_HIDDEN shoal_status_t shoal_cuda_reduce_launch(shoal_cuda_comm_t *cc, CUstream stream,
                                                     CUdeviceptr dst, const CUdeviceptr *srcs,
                                                     int nsrc, size_t count, shoal_dtype_t dtype,
                                                     shoal_op_t op, int avg_div);
/* Waits (polling, deadline, abort) until the stream is idle. */
SHOAL_HIDDEN shoal_status_t shoal_cuda_stream_wait(shoal_cuda_comm_t *cc, CUstream stream,
                                                   const char *what);
/* Copies rows x width bytes between host or device memory (pitches in bytes) on stream;
 * host-to-host copies run at once. */
SHOAL_HIDDEN shoal_status_t shoal_cuda_copy_rows(CUstream stream, void *dst, int dst_dev,
                                                 size_t dst_pitch, const void *src, int src_dev,
                                                 size_t src_pitch, size_t width, size_t rows);

/* cuda_stage.c: one call through pinned staging and the host algorithms */
SHOAL_HIDDEN shoal_status_t shoal_cuda_stage_coll(shoal_cuda_comm_t *cc,
                                                  const shoal_cuda_item_t *it);
/* Consecutive send/recv items, all posted at once (chunk by chunk). */
SHOAL_HIDDEN shoal_status_t shoal_cuda_stage_p2p(shoal_cuda_comm_t *cc,
                                                 const shoal_cuda_item_t *items, int n);
SHOAL_HIDDEN shoal_status_t shoal_cuda_run_items(shoal_cuda_comm_t *cc,
                                                 const shoal_cuda_item_t *items, int n);

/* cuda_ipc.c: AllReduce on one host reading the peers' device buffers */
SHOAL_HIDDEN int shoal_cuda_ipc_usable(shoal_cuda_comm_t *cc); /* collective on first use */
SHOAL_HIDDEN shoal_status_t shoal_cuda_ipc_allreduce(shoal_cuda_comm_t *cc,
                                                     const shoal_cuda_item_t *it);
SHOAL_HIDDEN void shoal_cuda_ipc_fini(shoal_cuda_comm_t *cc);

/* cuda_nccl.c: SHOAL_CUDA_BACKEND=nccl */
SHOAL_HIDDEN int shoal_cuda_nccl_usable(shoal_cuda_comm_t *cc); /* collective on first use */
SHOAL_HIDDEN shoal_status_t shoal_cuda_nccl_allreduce(shoal_cuda_comm_t *cc,
                                                      const shoal_cuda_item_t *it);
SHOAL_HIDDEN void shoal_cuda_nccl_fini(shoal_cuda_comm_t *cc);
/* 1 if NCCL computes a's op as shoal does: not MIN/MAX of a floating type, where NCCL's
 * fminf/fmaxf (__hmin/__hmax) return the other operand of a NaN and shoal propagates the NaN.
 * Depends on the call alone: the same answer on every rank. */
static inline int shoal_cuda_nccl_same_op(const shoal_coll_args_t *a)
{
    int fp = a->dtype == SHOAL_FLOAT16 || a->dtype == SHOAL_BFLOAT16 ||
             a->dtype == SHOAL_FLOAT32 || a->dtype == SHOAL_FLOAT64;
    return !(fp && (a->op == SHOAL_MIN || a->op == SHOAL_MAX));
}

/* Host collective on host buffers inside the layer (ticket already held). */
static inline shoal_status_t shoal_cuda_host_coll(shoal_cuda_comm_t *cc, shoal_coll_type_t type,
                                                  const void *in, void *out, size_t count,
                                                  shoal_dtype_t dtype, shoal_op_t op, int root)
{
    shoal_coll_args_t a = {.type = type, .sendbuf = in, .recvbuf = out, .count = count,
                           .dtype = dtype, .op = op, .root = root};
    return shoal_cuda_host.run(cc->comm, &a);
}

#endif
