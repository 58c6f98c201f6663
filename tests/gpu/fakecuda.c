/*
 * libfakecuda: a host emulation of the part of the CUDA driver API that libshoal uses, so that
 * the CUDA layer's own logic (pointer kinds, stream ordering, the staging pipeline, the IPC
 * AllReduce, groups) runs in `make check` on machines without a GPU. Loaded in place of
 * libcuda.so.1 with SHOAL_CUDA_LIBCUDA=.../libfakecuda.so (tests/gpu/run_gpu_emu.sh).
 *
 * It is strict where a real GPU would fail, so that it finds what the real one would:
 *  - device memory is a memfd mapped twice: the address handed out (the CUdeviceptr) is
 *    PROT_NONE, so host code that dereferences a device pointer faults at once; copies and
 *    kernels work on a second, private mapping of the same pages;
 *  - every copy, memset and kernel access is bounds-checked against its allocation (a kernel
 *    outside every allocation or the 16-byte vector path on a misaligned pointer sets the
 *    sticky CUDA_ERROR_ILLEGAL_ADDRESS / CUDA_ERROR_MISALIGNED_ADDRESS, as a GPU fault does);
 *  - every stream is a thread of its own: copies, kernels, value waits and writes, host
 *    functions and events complete asynchronously, in stream order, never before they are
 *    reached (reading a staging slot before its copy's event completed shows up as wrong data);
 *  - creation calls and cuCtxSynchronize need a current context (CUDA_ERROR_INVALID_CONTEXT);
 *  - cuMemFree, cuMemFreeHost, cuModuleUnload and cuIpcCloseMemHandle wait for every stream to
 *    drain, like the real driver's implicit synchronization (a free while some stream waits
 *    on a flag nobody sets hangs here as it does on a GPU);
 *  - IPC handles carry (pid, memfd): another process maps the same pages; opening a handle in
 *    the process that made it fails, as with the real driver;
 *  - an asynchronous copy from pageable host memory (not from cuMemHostAlloc) to the device
 *    reads its source when it is called, not when the stream reaches it: the driver stages
 *    such a copy at once (seen on an H200: a copy behind a stream wait carried the bytes of
 *    the time of the call).
 * Kernels: the reduce kernels of src/cuda/kernels.cu compiled for the host
 * (fakecuda_kern.cc), run block by block, thread by thread.
 * Not emulated: the legacy default stream's implicit synchronization with other blocking
 * streams (NULL is a stream of its own), graphs (a capture has its status only, and work
 * enqueued during it fails), peer access between several devices, timing.
 * Environment: FAKECUDA_DEVICES (1), FAKECUDA_SMS (4), FAKECUDA_MEMOPS (1: stream memory
 * operations supported), FAKECUDA_MEMOPS_V1 (0: what the attribute
 * CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 reports; 0 on an H200 with CUDA 13, whose
 * memops work), FAKECUDA_DRIVER_VERSION (CUDA_VERSION), FAKECUDA_KERNEL_DELAY_US (0: extra
 * time per kernel launch, to make overlap visible). Diagnostics go to stderr with the prefix
 * "fakecuda:".
 */
#include <cuda.h>

#ifdef FAKECUDA_OLD_NAMES
/* libfakecuda_old: a driver before CUDA 11.7, whose entry points are the first versions of
 * those cuda.h now maps to newer names: the stream memory operations without _v2 (11.7),
 * cuEventElapsedTime without _v2 (12.8). The same arguments. */
#undef cuStreamWaitValue32
#undef cuStreamWriteValue32
#undef cuEventElapsedTime
CUresult CUDAAPI cuStreamWaitValue32(CUstream s, CUdeviceptr addr, cuuint32_t v,
                                     unsigned int flags);
CUresult CUDAAPI cuStreamWriteValue32(CUstream s, CUdeviceptr addr, cuuint32_t v,
                                      unsigned int flags);
CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b);
#endif

#include "cuda/kern_abi.h"
#include "tests/gpu/fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAKECUDA_EXPORT __attribute__((visibility("default")))
#define FAKECUDA_MAX_DEVICES 8
#define FAKECUDA_IPC_MAGIC 0x66616b6563756461ULL /* "fakecuda" */

/* ---- state ------------------------------------------------------------------------------- */

typedef enum { FK_DEV, FK_HOST, FK_IPC } fk_kind_t;

typedef struct fk_region {
    struct fk_region *next;
    fk_kind_t kind;
    uintptr_t base;      /* the address the caller sees */
    uint8_t *back;       /* where the bytes are accessed (== base for host memory) */
    size_t size;
    int fd;              /* memfd of device memory, -1 for host memory */
    int ordinal;
} fk_region_t;

typedef enum { OP_COPY, OP_SET, OP_KERNEL, OP_WAITV, OP_WRITEV, OP_HOSTFN, OP_EVENT,
               OP_WAITEV, OP_KWAIT } fk_op_kind_t;

struct CUevent_st {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t recorded, completed;
    uint64_t stamp_ns;
};

struct CUfunc_st {
    const char *name;
    fakecuda_kern_fn fn;         /* a reduce kernel, or NULL for the stream-wait kernel */
    size_t esize;
};

struct CUmod_st {
    int ordinal;
};

typedef struct fk_op {
    struct fk_op *next;
    fk_op_kind_t kind;
    union {
        struct { uint8_t *dst; const uint8_t *src; size_t width, rows, dpitch, spitch;
                 uint8_t *own; /* the snapshot of a pageable source, freed with the op */ } copy;
        struct { uint8_t *dst; unsigned char v; size_t n; } set;
        struct { struct CUfunc_st *f; unsigned grid, block; uintptr_t dst;
                 shoal_cuda_srcs_t srcs; int nsrc; unsigned long long count; int div, vec; } k;
        struct { volatile uint32_t *addr; uint32_t value; unsigned flags; } val;
        struct { CUhostFn fn; void *arg; } host;
        struct { const unsigned int *word; unsigned int seq; unsigned long long timeout; } kw;
        struct { struct CUevent_st *e; uint64_t gen; } ev;
    } u;
} fk_op_t;

struct CUstream_st {
    struct CUstream_st *next;      /* in fk.streams */
    pthread_mutex_t lock;
    pthread_cond_t cond;           /* work queued, or the stream went idle */
    fk_op_t *head, *tail;
    int busy;                      /* an op is executing */
    int destroyed;
    int capturing;                 /* between cuStreamBeginCapture and cuStreamEndCapture */
    int ordinal;
    pthread_t thread;
};

struct CUctx_st {
    int ordinal;
    int retained;
};

static struct {
    pthread_mutex_t lock;
    int inited;
    int ndev, nsm, memops, memops_v1;
    unsigned kernel_delay_us;
    unsigned hostfn_max_ms;        /* FAKECUDA_HOSTFN_MAX_MS: a longer host function faults */
    fk_region_t *regions;
    struct CUstream_st *streams;
    struct CUstream_st *null_stream[FAKECUDA_MAX_DEVICES];
    struct CUctx_st ctx[FAKECUDA_MAX_DEVICES];
    CUresult sticky;               /* a fault: every later call returns it */
} fk = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread struct CUctx_st *fk_current;

static void fk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fk_log(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakecuda[%d]: %s\n", (int)getpid(), buf);
}

static uint64_t fk_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fk_fault(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fk_fault(CUresult r, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fk_log("device fault (%s): %s", r == CUDA_ERROR_MISALIGNED_ADDRESS ? "misaligned address"
                                                                      : "illegal address", buf);
    pthread_mutex_lock(&fk.lock);
    if (fk.sticky == CUDA_SUCCESS) {
        fk.sticky = r;
    }
    pthread_mutex_unlock(&fk.lock);
}

static CUresult fk_sticky(void)
{
    CUresult r;
    pthread_mutex_lock(&fk.lock);
    r = fk.inited ? fk.sticky : CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_unlock(&fk.lock);
    return r;
}

#define FK_ENTER()                                                                          \
    do {                                                                                    \
        CUresult fk_r_ = fk_sticky();                                                       \
        if (fk_r_ != CUDA_SUCCESS) {                                                        \
            return fk_r_;                                                                   \
        }                                                                                   \
    } while (0)

#define FK_NEED_CTX()                                                                       \
    do {                                                                                    \
        FK_ENTER();                                                                         \
        if (fk_current == NULL) {                                                           \
            return CUDA_ERROR_INVALID_CONTEXT;                                              \
        }                                                                                   \
    } while (0)

/* ---- memory ------------------------------------------------------------------------------- */

/* The region holding [p, p+len) (len 0: just p), under fk.lock. */
static fk_region_t *fk_region_find_locked(uintptr_t p, size_t len)
{
    for (fk_region_t *r = fk.regions; r != NULL; r = r->next) {
        if (p >= r->base && p < r->base + r->size) {
            return (len <= r->size - (p - r->base)) ? r : NULL;
        }
    }
    return NULL;
}

/* Where the device accesses [p, p+len): NULL if that is not inside one allocation (device,
 * opened IPC or host-mapped). */
static uint8_t *fk_dev_access(uintptr_t p, size_t len)
{
    fk_region_t *r;
    uint8_t *q = NULL;
    pthread_mutex_lock(&fk.lock);
    r = fk_region_find_locked(p, len);
    if (r != NULL) {
        q = r->back + (p - r->base);
    }
    pthread_mutex_unlock(&fk.lock);
    return q;
}

/* Host side of a copy: device addresses are translated, others are host memory. */
static uint8_t *fk_any_access(uintptr_t p, size_t len, int *is_dev_p)
{
    fk_region_t *r;
    uint8_t *q = (uint8_t *)p;
    pthread_mutex_lock(&fk.lock);
    r = fk_region_find_locked(p, 0);
    *is_dev_p = r != NULL && r->kind != FK_HOST;
    if (r != NULL) {
        q = len <= r->size - (p - r->base) ? r->back + (p - r->base) : NULL;
    }
    pthread_mutex_unlock(&fk.lock);
    return q;
}

/* Whether [p, p+len) lies in pinned host memory (cuMemHostAlloc). */
static int fk_host_registered(uintptr_t p, size_t len)
{
    fk_region_t *r;
    int yes;
    pthread_mutex_lock(&fk.lock);
    r = fk_region_find_locked(p, len);
    yes = r != NULL && r->kind == FK_HOST;
    pthread_mutex_unlock(&fk.lock);
    return yes;
}

static void fk_region_add(fk_region_t *r)
{
    pthread_mutex_lock(&fk.lock);
    r->next = fk.regions;
    fk.regions = r;
    pthread_mutex_unlock(&fk.lock);
}

static fk_region_t *fk_region_take(uintptr_t base, fk_kind_t kind)
{
    fk_region_t **pp, *r = NULL;
    pthread_mutex_lock(&fk.lock);
    for (pp = &fk.regions; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->base == base && (*pp)->kind == kind) {
            r = *pp;
            *pp = r->next;
            break;
        }
    }
    pthread_mutex_unlock(&fk.lock);
    return r;
}

/* Maps fd twice: the caller's view (no access) and the device's (read/write). */
static CUresult fk_map_device(int fd, size_t size, fk_kind_t kind, int ordinal, uintptr_t *base_p)
{
    fk_region_t *r = calloc(1, sizeof(*r));
    void *view, *back;
    if (r == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    view = mmap(NULL, size, PROT_NONE, MAP_SHARED, fd, 0);
    back = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (view == MAP_FAILED || back == MAP_FAILED) {
        if (view != MAP_FAILED) {
            munmap(view, size);
        }
        if (back != MAP_FAILED) {
            munmap(back, size);
        }
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *r = (fk_region_t){.kind = kind, .base = (uintptr_t)view, .back = back, .size = size,
                       .fd = fd, .ordinal = ordinal};
    fk_region_add(r);
    *base_p = r->base;
    return CUDA_SUCCESS;
}

static void fk_region_free(fk_region_t *r)
{
    if (r->kind == FK_HOST) {
        munmap((void *)r->base, r->size);
    } else {
        munmap((void *)r->base, r->size);
        munmap(r->back, r->size);
        close(r->fd);
    }
    free(r);
}

/* ---- streams ----------------------------------------------------------------------------- */

static int fk_wait_value_met(uint32_t cur, uint32_t v, unsigned flags)
{
    switch (flags & 0xf) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        return (int32_t)(cur - v) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
        return cur == v;
    case CU_STREAM_WAIT_VALUE_AND:
        return (cur & v) != 0;
    case CU_STREAM_WAIT_VALUE_NOR:
        return ~(cur | v) != 0;
    default:
        return 1;
    }
}

static void fk_run_kernel(fk_op_t *op)
{
    struct CUfunc_st *f = op->u.k.f;
    size_t bytes = (size_t)op->u.k.count * f->esize;
    shoal_cuda_srcs_t srcs = {{0}};
    uint8_t *dst;

    if (op->u.k.count == 0) {
        return;
    }
    if (op->u.k.nsrc < 1 || op->u.k.nsrc > SHOAL_CUDA_MAX_SRCS) {
        fk_fault(CUDA_ERROR_ILLEGAL_ADDRESS, "%s: nsrc %d", f->name, op->u.k.nsrc);
        return;
    }
    dst = fk_dev_access(op->u.k.dst, bytes);
    if (dst == NULL) {
        fk_fault(CUDA_ERROR_ILLEGAL_ADDRESS, "%s: dst 0x%lx + %zu bytes is outside every "
                 "allocation", f->name, (unsigned long)op->u.k.dst, bytes);
        return;
    }
    if (op->u.k.vec && op->u.k.dst % 16 != 0) {
        fk_fault(CUDA_ERROR_MISALIGNED_ADDRESS, "%s: 16-byte stores to dst 0x%lx", f->name,
                 (unsigned long)op->u.k.dst);
        return;
    }
    for (int s = 0; s < op->u.k.nsrc; s++) {
        uintptr_t p = (uintptr_t)op->u.k.srcs.p[s];
        srcs.p[s] = fk_dev_access(p, bytes);
        if (srcs.p[s] == NULL) {
            fk_fault(CUDA_ERROR_ILLEGAL_ADDRESS, "%s: source %d 0x%lx + %zu bytes is outside "
                     "every allocation", f->name, s, (unsigned long)p, bytes);
            return;
        }
        if (op->u.k.vec && p % 16 != 0) {
            fk_fault(CUDA_ERROR_MISALIGNED_ADDRESS, "%s: 16-byte loads from source %d 0x%lx",
                     f->name, s, (unsigned long)p);
            return;
        }
    }
    fakecuda_kern_run(f->fn, op->u.k.grid, op->u.k.block, dst, srcs, op->u.k.nsrc,
                      op->u.k.count, op->u.k.div, op->u.k.vec);
    if (fk.kernel_delay_us > 0) {
        usleep(fk.kernel_delay_us);
    }
}

static void fk_event_complete(struct CUevent_st *e, uint64_t gen)
{
    pthread_mutex_lock(&e->lock);
    if (gen > e->completed) {
        e->completed = gen;
        e->stamp_ns = fk_now_ns();
    }
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->lock);
}

static void fk_run_op(fk_op_t *op)
{
    switch (op->kind) {
    case OP_COPY:
        for (size_t r = 0; r < op->u.copy.rows; r++) {
            memmove(op->u.copy.dst + r * op->u.copy.dpitch, op->u.copy.src + r * op->u.copy.spitch,
                    op->u.copy.width);
        }
        break;
    case OP_SET:
        memset(op->u.set.dst, op->u.set.v, op->u.set.n);
        break;
    case OP_KERNEL:
        fk_run_kernel(op);
        break;
    case OP_WAITV: {
        unsigned spins = 0;
        while (!fk_wait_value_met(__atomic_load_n(op->u.val.addr, __ATOMIC_ACQUIRE),
                                  op->u.val.value, op->u.val.flags)) {
            if (++spins > 32) {
                usleep(20);
            } else {
                sched_yield();
            }
        }
        break;
    }
    case OP_WRITEV:
        __atomic_store_n(op->u.val.addr, op->u.val.value, __ATOMIC_RELEASE);
        break;
    case OP_HOSTFN: {
        uint64_t t0 = fk_now_ns(), ms;
        op->u.host.fn(op->u.host.arg);
        ms = (fk_now_ns() - t0) / 1000000;
        if (fk.hostfn_max_ms > 0 && ms > fk.hostfn_max_ms) {
            /* A host function holds the driver's callback thread: the host functions of
             * every stream wait behind it. */
            fk_log("a host function ran %llu ms (FAKECUDA_HOSTFN_MAX_MS=%u)",
                   (unsigned long long)ms, fk.hostfn_max_ms);
            pthread_mutex_lock(&fk.lock);
            if (fk.sticky == CUDA_SUCCESS) {
                fk.sticky = CUDA_ERROR_LAUNCH_TIMEOUT;
            }
            pthread_mutex_unlock(&fk.lock);
        }
        break;
    }
    case OP_KWAIT:
        fakecuda_kern_wait(op->u.kw.word, op->u.kw.seq, op->u.kw.timeout);
        break;
    case OP_EVENT:
        break; /* completed by the stream thread once the op left the queue */
    case OP_WAITEV:
        pthread_mutex_lock(&op->u.ev.e->lock);
        while (op->u.ev.e->completed < op->u.ev.gen) {
            pthread_cond_wait(&op->u.ev.e->cond, &op->u.ev.e->lock);
        }
        pthread_mutex_unlock(&op->u.ev.e->lock);
        break;
    }
}

static void *fk_stream_main(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        fk_op_t *op;
        while (s->head == NULL && !s->destroyed) {
            pthread_cond_wait(&s->cond, &s->lock);
        }
        if (s->head == NULL) {
            break; /* destroyed and drained */
        }
        op = s->head;
        s->busy = 1;
        pthread_mutex_unlock(&s->lock);
        fk_run_op(op);
        pthread_mutex_lock(&s->lock);
        s->head = op->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        s->busy = 0;
        pthread_cond_broadcast(&s->cond);
        if (op->kind == OP_EVENT) {
            /* after the queue moved on: whoever sees the event complete sees the stream
             * past it (idle if it was the last op), as on a GPU */
            pthread_mutex_unlock(&s->lock);
            fk_event_complete(op->u.ev.e, op->u.ev.gen);
            pthread_mutex_lock(&s->lock);
        }
        if (op->kind == OP_COPY) {
            free(op->u.copy.own);
        }
        free(op);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static CUresult fk_stream_new(int ordinal, struct CUstream_st **s_p)
{
    struct CUstream_st *s = calloc(1, sizeof(*s));
    pthread_attr_t attr;
    if (s == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->ordinal = ordinal;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    if (pthread_create(&s->thread, &attr, fk_stream_main, s) != 0) {
        pthread_attr_destroy(&attr);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_attr_destroy(&attr);
    pthread_mutex_lock(&fk.lock);
    s->next = fk.streams;
    fk.streams = s;
    pthread_mutex_unlock(&fk.lock);
    *s_p = s;
    return CUDA_SUCCESS;
}

/* The stream behind a handle (NULL and the special handles: the device's default stream). */
static CUresult fk_stream_get(CUstream h, struct CUstream_st **s_p)
{
    int ordinal = fk_current != NULL ? fk_current->ordinal : 0;
    CUresult r = CUDA_SUCCESS;
    if (h != NULL && h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD) {
        *s_p = h;
        return h->destroyed ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    }
    if (fk_current == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    pthread_mutex_lock(&fk.lock);
    *s_p = fk.null_stream[ordinal];
    pthread_mutex_unlock(&fk.lock);
    if (*s_p == NULL) {
        struct CUstream_st *s;
        r = fk_stream_new(ordinal, &s);
        if (r == CUDA_SUCCESS) {
            pthread_mutex_lock(&fk.lock);
            if (fk.null_stream[ordinal] == NULL) {
                fk.null_stream[ordinal] = s;
            }
            *s_p = fk.null_stream[ordinal];
            pthread_mutex_unlock(&fk.lock);
        }
    }
    return r;
}

static CUresult fk_enqueue(CUstream h, const fk_op_t *tmpl)
{
    struct CUstream_st *s;
    fk_op_t *op;
    CUresult r;
    FK_ENTER();
    if ((r = fk_stream_get(h, &s)) != CUDA_SUCCESS) {
        return r;
    }
    if (__atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE)) {
        /* graphs are not emulated: work enqueued during a capture fails loudly, where the
         * real driver would record it */
        fprintf(stderr, "fakecuda: work enqueued on a stream being captured (not emulated)\n");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    op = malloc(sizeof(*op));
    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *op = *tmpl;
    op->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail != NULL) {
        s->tail->next = op;
    } else {
        s->head = op;
    }
    s->tail = op;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return CUDA_SUCCESS;
}

static int fk_stream_idle_locked(struct CUstream_st *s)
{
    return s->head == NULL && !s->busy;
}

static void fk_stream_drain(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->lock);
    while (!fk_stream_idle_locked(s)) {
        pthread_cond_wait(&s->cond, &s->lock);
    }
    pthread_mutex_unlock(&s->lock);
}

static void fk_drain_all(void)
{
    struct CUstream_st *list[256];
    int n = 0;
    pthread_mutex_lock(&fk.lock);
    for (struct CUstream_st *s = fk.streams; s != NULL && n < 256; s = s->next) {
        if (!s->destroyed) {
            list[n++] = s;
        }
    }
    pthread_mutex_unlock(&fk.lock);
    for (int i = 0; i < n; i++) {
        fk_stream_drain(list[i]);
    }
}

/* The frees: like the real driver's, they synchronize with the device first (no kernel or
 * copy may still use the memory); p must be the start of an allocation of that kind. */
static CUresult fk_release(uintptr_t p, fk_kind_t kind, const char *what)
{
    fk_region_t *r;
    FK_ENTER();
    fk_drain_all();
    r = fk_region_take(p, kind);
    if (r == NULL) {
        fk_log("%s(0x%lx): not the start of such an allocation", what, (unsigned long)p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fk_region_free(r);
    return CUDA_SUCCESS;
}

/* ---- initialization, devices, contexts ---------------------------------------------------- */

static int fk_env_int(const char *name, int def, int lo, int hi)
{
    const char *v = getenv(name);
    long x;
    char *end;
    if (v == NULL || *v == '\0') {
        return def;
    }
    x = strtol(v, &end, 10);
    if (*end != '\0' || x < lo || x > hi) {
        fk_log("%s=%s is not an integer in [%d, %d]; using %d", name, v, lo, hi, def);
        return def;
    }
    return (int)x;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuInit(unsigned int flags)
{
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fk.lock);
    if (!fk.inited) {
        fk.ndev = fk_env_int("FAKECUDA_DEVICES", 1, 0, FAKECUDA_MAX_DEVICES);
        fk.nsm = fk_env_int("FAKECUDA_SMS", 4, 1, 1024);
        fk.memops = fk_env_int("FAKECUDA_MEMOPS", 1, 0, 1);
        fk.memops_v1 = fk_env_int("FAKECUDA_MEMOPS_V1", 0, 0, 1);
        fk.kernel_delay_us = (unsigned)fk_env_int("FAKECUDA_KERNEL_DELAY_US", 0, 0, 10000000);
        fk.hostfn_max_ms = (unsigned)fk_env_int("FAKECUDA_HOSTFN_MAX_MS", 0, 0, 10000000);
        for (int d = 0; d < FAKECUDA_MAX_DEVICES; d++) {
            fk.ctx[d].ordinal = d;
        }
        fk.inited = 1;
    }
    pthread_mutex_unlock(&fk.lock);
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDriverGetVersion(int *v)
{
    if (v == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *v = fk_env_int("FAKECUDA_DRIVER_VERSION", CUDA_VERSION, 1000, 99999);
    return CUDA_SUCCESS;
}

static const struct {
    CUresult r;
    const char *name, *str;
} fk_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

FAKECUDA_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult r, const char **s)
{
    for (size_t i = 0; i < sizeof(fk_errors) / sizeof(fk_errors[0]); i++) {
        if (fk_errors[i].r == r) {
            *s = fk_errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult r, const char **s)
{
    for (size_t i = 0; i < sizeof(fk_errors) / sizeof(fk_errors[0]); i++) {
        if (fk_errors[i].r == r) {
            *s = fk_errors[i].str;
            return CUDA_SUCCESS;
        }
    }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceGetCount(int *n)
{
    FK_ENTER();
    *n = fk.ndev;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice *d, int ordinal)
{
    FK_ENTER();
    if (ordinal < 0 || ordinal >= fk.ndev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *d = ordinal;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    FK_ENTER();
    if (d < 0 || d >= fk.ndev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = fk.nsm;
        break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1:
        *v = fk.memops_v1;
        break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *v = 1024;
        break;
    default:
        *v = 0;
        break;
    }
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDeviceGetPCIBusId(char *buf, int len, CUdevice d)
{
    FK_ENTER();
    if (d < 0 || d >= fk.ndev || buf == NULL || len < 13) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(buf, (size_t)len, "00000000:%02x:00.0", 0x40 + d);
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    FK_ENTER();
    if (d < 0 || d >= fk.ndev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    pthread_mutex_lock(&fk.lock);
    fk.ctx[d].retained++;
    pthread_mutex_unlock(&fk.lock);
    *c = &fk.ctx[d];
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice d)
{
    CUresult r = CUDA_SUCCESS;
    if (d < 0 || d >= fk.ndev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    pthread_mutex_lock(&fk.lock);
    if (fk.ctx[d].retained == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        fk_log("cuDevicePrimaryCtxRelease(%d) without a retain", (int)d);
    } else {
        fk.ctx[d].retained--;
    }
    pthread_mutex_unlock(&fk.lock);
    return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext c)
{
    FK_ENTER();
    if (c != NULL && (c < &fk.ctx[0] || c >= &fk.ctx[fk.ndev] || c->retained == 0)) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    fk_current = c;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext *c)
{
    FK_ENTER();
    *c = fk_current;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice *d)
{
    FK_NEED_CTX();
    *d = fk_current->ordinal;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuCtxSynchronize(void)
{
    FK_NEED_CTX();
    fk_drain_all();
    return fk_sticky();
}

/* ---- pointers and memory ------------------------------------------------------------------- */

FAKECUDA_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute a,
                                                       CUdeviceptr p)
{
    fk_region_t *r;
    int kind, ordinal;
    FK_ENTER();
    pthread_mutex_lock(&fk.lock);
    r = fk_region_find_locked((uintptr_t)p, 0);
    kind = r != NULL ? (int)r->kind : -1;
    ordinal = r != NULL ? r->ordinal : -1;
    pthread_mutex_unlock(&fk.lock);
    if (kind < 0) {
        return CUDA_ERROR_INVALID_VALUE; /* memory the driver does not know */
    }
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = kind == FK_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = ordinal;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr *p, size_t bytes)
{
    size_t size;
    int fd;
    uintptr_t base;
    CUresult r;
    FK_NEED_CTX();
    if (p == NULL || bytes == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size = (bytes + 4095) & ~(size_t)4095;
    fd = memfd_create("fakecuda", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r = fk_map_device(fd, size, FK_DEV, fk_current->ordinal, &base);
    if (r != CUDA_SUCCESS) {
        close(fd);
        return r;
    }
    *p = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr p)
{
    return p == 0 ? fk_sticky() : fk_release((uintptr_t)p, FK_DEV, "cuMemFree");
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags)
{
    fk_region_t *r;
    void *p;
    FK_NEED_CTX();
    if (pp == NULL || bytes == 0 ||
        (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                             CU_MEMHOSTALLOC_WRITECOMBINED)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    r = calloc(1, sizeof(*r));
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == NULL || p == MAP_FAILED) {
        free(r);
        if (p != MAP_FAILED) {
            munmap(p, bytes);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *r = (fk_region_t){.kind = FK_HOST, .base = (uintptr_t)p, .back = p, .size = bytes,
                       .fd = -1, .ordinal = fk_current->ordinal};
    fk_region_add(r);
    *pp = p;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
    return fk_release((uintptr_t)p, FK_HOST, "cuMemFreeHost");
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *d, void *p,
                                                           unsigned int flags)
{
    fk_region_t *r;
    FK_ENTER();
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fk.lock);
    r = fk_region_find_locked((uintptr_t)p, 0);
    pthread_mutex_unlock(&fk.lock);
    if (r == NULL || r->kind != FK_HOST) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

/* ---- copies ---------------------------------------------------------------------------------- */

static CUresult fk_copy(CUstream s, uintptr_t dst, int dst_dev, size_t dpitch, uintptr_t src,
                        int src_dev, size_t spitch, size_t width, size_t rows, const char *what)
{
    fk_op_t op = {.kind = OP_COPY};
    size_t dspan = rows == 0 ? 0 : (rows - 1) * dpitch + width;
    size_t sspan = rows == 0 ? 0 : (rows - 1) * spitch + width;
    int is_dev = 0, is_src_dev = 0;
    if (width == 0 || rows == 0) {
        return fk_sticky();
    }
    op.u.copy.dst = dst_dev ? fk_dev_access(dst, dspan) : fk_any_access(dst, dspan, &is_dev);
    op.u.copy.src = src_dev ? fk_dev_access(src, sspan)
                            : fk_any_access(src, sspan, &is_src_dev);
    if (op.u.copy.dst == NULL || op.u.copy.src == NULL) {
        fk_log("%s: %s 0x%lx + %zu bytes is not inside one allocation", what,
               op.u.copy.dst == NULL ? "destination" : "source",
               (unsigned long)(op.u.copy.dst == NULL ? dst : src),
               op.u.copy.dst == NULL ? dspan : sspan);
        return CUDA_ERROR_INVALID_VALUE;
    }
    op.u.copy.width = width;
    op.u.copy.rows = rows;
    op.u.copy.dpitch = dpitch;
    op.u.copy.spitch = spitch;
    if (!src_dev && !is_src_dev && (dst_dev || is_dev) && !fk_host_registered(src, sspan)) {
        /* pageable to device: read now (see the top of this file) */
        op.u.copy.own = malloc(sspan);
        if (op.u.copy.own == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(op.u.copy.own, op.u.copy.src, sspan);
        op.u.copy.src = op.u.copy.own;
    }
    CUresult r = fk_enqueue(s, &op);
    if (r != CUDA_SUCCESS) {
        free(op.u.copy.own); /* not queued: nobody else frees it */
    }
    return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n,
                                                   CUstream s)
{
    return fk_copy(s, (uintptr_t)dst, 0, n, (uintptr_t)src, 1, n, n, 1, "cuMemcpyDtoHAsync");
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n,
                                                   CUstream s)
{
    return fk_copy(s, (uintptr_t)dst, 1, n, (uintptr_t)src, 0, n, n, 1, "cuMemcpyHtoDAsync");
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                                   CUstream s)
{
    return fk_copy(s, (uintptr_t)dst, 1, n, (uintptr_t)src, 1, n, n, 1, "cuMemcpyDtoDAsync");
}

static int fk_2d_side(CUmemorytype t, const void *host, CUdeviceptr dev, size_t x, size_t y,
                      size_t pitch, uintptr_t *p_p, int *dev_p)
{
    switch (t) {
    case CU_MEMORYTYPE_HOST:
        *p_p = (uintptr_t)host + y * pitch + x;
        *dev_p = 0;
        return 0;
    case CU_MEMORYTYPE_DEVICE:
        *p_p = (uintptr_t)dev + y * pitch + x;
        *dev_p = 1;
        return 0;
    case CU_MEMORYTYPE_UNIFIED:
        *p_p = (uintptr_t)dev + y * pitch + x;
        *dev_p = 0; /* either: fk_any_access decides */
        return 0;
    default:
        return -1;
    }
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemcpy2DAsync(const CUDA_MEMCPY2D *m, CUstream s)
{
    uintptr_t d, sp;
    int dd, sd;
    if (m == NULL ||
        fk_2d_side(m->srcMemoryType, m->srcHost, m->srcDevice, m->srcXInBytes, m->srcY,
                   m->srcPitch, &sp, &sd) != 0 ||
        fk_2d_side(m->dstMemoryType, m->dstHost, m->dstDevice, m->dstXInBytes, m->dstY,
                   m->dstPitch, &d, &dd) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The real limits: a pitch at least the width (more than one row) and below 2^31. */
    if (m->Height > 1 && (m->srcPitch < m->WidthInBytes || m->dstPitch < m->WidthInBytes)) {
        fk_log("cuMemcpy2DAsync: pitch %zu/%zu below the width %zu", m->srcPitch, m->dstPitch,
               m->WidthInBytes);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (m->srcPitch >= ((size_t)1 << 31) || m->dstPitch >= ((size_t)1 << 31)) {
        fk_log("cuMemcpy2DAsync: pitch %zu/%zu over the device's limit", m->srcPitch,
               m->dstPitch);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return fk_copy(s, d, dd, m->dstPitch, sp, sd, m->srcPitch, m->WidthInBytes, m->Height,
                   "cuMemcpy2DAsync");
}

FAKECUDA_EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n,
                                                 CUstream s)
{
    fk_op_t op = {.kind = OP_SET};
    if (n == 0) {
        return fk_sticky();
    }
    op.u.set.dst = fk_dev_access((uintptr_t)dst, n);
    if (op.u.set.dst == NULL) {
        fk_log("cuMemsetD8Async: 0x%lx + %zu bytes is not inside one allocation",
               (unsigned long)dst, n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    op.u.set.v = v;
    op.u.set.n = n;
    return fk_enqueue(s, &op);
}

/* ---- streams and events ------------------------------------------------------------------- */

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *s, unsigned int flags)
{
    FK_NEED_CTX();
    if (s == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return fk_stream_new(fk_current->ordinal, s);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    /* As the real one: returns at once, the stream's work completes first. The thread exits
     * when drained; the record stays in the list (its handle must stay invalid, not reused). */
    pthread_mutex_lock(&h->lock);
    if (h->destroyed) {
        pthread_mutex_unlock(&h->lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    h->destroyed = 1;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    pthread_detach(h->thread);
    return CUDA_SUCCESS;
}

/* Stream capture: only its status (cuStreamIsCapturing); what a real capture records fails
 * here (fk_enqueue), and the graph is NULL. */
FAKECUDA_EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream h, CUstreamCaptureMode mode)
{
    (void)mode;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (h->destroyed || __atomic_exchange_n(&h->capturing, 1, __ATOMIC_ACQ_REL)) {
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream h, CUgraph *g)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD ||
        !__atomic_exchange_n(&h->capturing, 0, __ATOMIC_ACQ_REL)) {
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    *g = NULL;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st)
{
    struct CUstream_st *s;
    CUresult r;
    FK_ENTER();
    if ((r = fk_stream_get(h, &s)) != CUDA_SUCCESS) {
        return r;
    }
    *st = __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE) ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                                           : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream h)
{
    struct CUstream_st *s;
    CUresult r;
    FK_ENTER();
    if ((r = fk_stream_get(h, &s)) != CUDA_SUCCESS) {
        return r;
    }
    pthread_mutex_lock(&s->lock);
    r = fk_stream_idle_locked(s) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&s->lock);
    return r == CUDA_SUCCESS ? fk_sticky() : r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream h)
{
    struct CUstream_st *s;
    CUresult r;
    FK_ENTER();
    if ((r = fk_stream_get(h, &s)) != CUDA_SUCCESS) {
        return r;
    }
    fk_stream_drain(s);
    return fk_sticky();
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamGetCtx(CUstream h, CUcontext *c)
{
    struct CUstream_st *s;
    CUresult r;
    FK_ENTER();
    if ((r = fk_stream_get(h, &s)) != CUDA_SUCCESS) {
        return r;
    }
    *c = &fk.ctx[s->ordinal];
    return CUDA_SUCCESS;
}

static CUresult fk_value_op(CUstream s, CUdeviceptr addr, uint32_t v, unsigned flags,
                            fk_op_kind_t kind)
{
    fk_op_t op = {.kind = kind};
    FK_ENTER();
    if (!fk.memops) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (addr % 4 != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    op.u.val.addr = (volatile uint32_t *)fk_dev_access((uintptr_t)addr, 4);
    if (op.u.val.addr == NULL) {
        fk_log("stream memory operation on 0x%lx: not device or host-mapped memory",
               (unsigned long)addr);
        return CUDA_ERROR_INVALID_VALUE;
    }
    op.u.val.value = v;
    op.u.val.flags = flags;
    return fk_enqueue(s, &op);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamWaitValue32(CUstream s, CUdeviceptr addr, cuuint32_t v,
                                                     unsigned int flags)
{
    return fk_value_op(s, addr, v, flags, OP_WAITV);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamWriteValue32(CUstream s, CUdeviceptr addr, cuuint32_t v,
                                                      unsigned int flags)
{
    return fk_value_op(s, addr, v, flags, OP_WRITEV);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream s, CUhostFn fn, void *arg)
{
    fk_op_t op = {.kind = OP_HOSTFN};
    if (fn == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    op.u.host.fn = fn;
    op.u.host.arg = arg;
    return fk_enqueue(s, &op);
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventCreate(CUevent *e, unsigned int flags)
{
    struct CUevent_st *ev;
    FK_NEED_CTX();
    (void)flags;
    ev = calloc(1, sizeof(*ev));
    if (ev == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_init(&ev->lock, NULL);
    pthread_cond_init(&ev->cond, NULL);
    *e = ev;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent e)
{
    if (e == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    /* Real drivers return at once and release the event when its recorded work completed;
     * here a record still queued holds a pointer to it: wait for that one event only. */
    pthread_mutex_lock(&e->lock);
    while (e->completed < e->recorded) {
        pthread_cond_wait(&e->cond, &e->lock);
    }
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->cond);
    free(e);
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventRecord(CUevent e, CUstream s)
{
    fk_op_t op = {.kind = OP_EVENT};
    CUresult r;
    if (e == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&e->lock);
    op.u.ev.e = e;
    op.u.ev.gen = ++e->recorded;
    r = fk_enqueue(s, &op);
    if (r != CUDA_SUCCESS) {
        e->recorded--;
    }
    pthread_mutex_unlock(&e->lock);
    return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventQuery(CUevent e)
{
    CUresult r;
    FK_ENTER();
    pthread_mutex_lock(&e->lock);
    r = e->completed >= e->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&e->lock);
    return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent e)
{
    FK_ENTER();
    pthread_mutex_lock(&e->lock);
    while (e->completed < e->recorded) {
        pthread_cond_wait(&e->cond, &e->lock);
    }
    pthread_mutex_unlock(&e->lock);
    return fk_sticky();
}

FAKECUDA_EXPORT CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    FK_ENTER();
    if (a->completed == 0 || b->completed == 0) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *ms = (float)((double)((int64_t)(b->stamp_ns - a->stamp_ns)) / 1e6);
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    fk_op_t op = {.kind = OP_WAITEV};
    if (e == NULL || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&e->lock);
    op.u.ev.e = e;
    op.u.ev.gen = e->recorded;
    pthread_mutex_unlock(&e->lock);
    return fk_enqueue(s, &op);
}

/* ---- modules and kernels ------------------------------------------------------------------- */

FAKECUDA_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule *m, const void *image)
{
    uint32_t magic;
    struct CUmod_st *mod;
    FK_NEED_CTX();
    if (image == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(&magic, image, 4);
    if (magic != 0xBA55ED50u) { /* an nvcc -fatbin image starts with the fatbin magic */
        fk_log("cuModuleLoadData: image magic 0x%08x is not a fatbin", magic);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    mod = calloc(1, sizeof(*mod));
    if (mod == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mod->ordinal = fk_current->ordinal;
    *m = mod;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule m)
{
    if (m == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    fk_drain_all();
    free(m);
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    static struct CUfunc_st funcs[64];
    static int nfuncs;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    fakecuda_kern_fn fn;
    size_t es;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    FK_ENTER();
    if (m == NULL || name == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    fn = fakecuda_kern_find(name, &es);
    if (fn == NULL && strcmp(name, SHOAL_CUDA_WAIT_KERNEL) != 0) {
        return CUDA_ERROR_NOT_FOUND;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nfuncs; i++) {
        if (funcs[i].fn == fn && strcmp(funcs[i].name, name) == 0) {
            *f = &funcs[i];
            r = CUDA_SUCCESS;
        }
    }
    if (r != CUDA_SUCCESS && nfuncs < 64) {
        funcs[nfuncs] = (struct CUfunc_st){.name = strdup(name), .fn = fn, .esize = es};
        *f = &funcs[nfuncs++];
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                                unsigned int gz, unsigned int bx, unsigned int by,
                                                unsigned int bz, unsigned int shmem, CUstream s,
                                                void **params, void **extra)
{
    fk_op_t op = {.kind = OP_KERNEL};
    FK_ENTER();
    if (f == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (params == NULL || extra != NULL || gx == 0 || gy != 1 || gz != 1 || by != 1 || bz != 1) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (bx == 0 || bx > SHOAL_CUDA_THREADS || shmem > 0) {
        /* __launch_bounds__(SHOAL_CUDA_THREADS): more threads per block cannot launch */
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    }
    if (f->fn == NULL) {
        /* the stream wait: (const unsigned int *word, unsigned int seq, u64 timeout_ns) */
        CUdeviceptr word = *(CUdeviceptr *)params[0];
        if (gx != 1 || bx != 1) {
            return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES; /* __launch_bounds__(1, 1) */
        }
        op.kind = OP_KWAIT;
        op.u.kw.word = (const unsigned int *)fk_dev_access((uintptr_t)word, 4);
        if (op.u.kw.word == NULL || word % 4 != 0) {
            fk_log("%s: word 0x%lx is not device or host-mapped memory", f->name,
                   (unsigned long)word);
            return CUDA_ERROR_INVALID_VALUE;
        }
        op.u.kw.seq = *(unsigned int *)params[1];
        op.u.kw.timeout = *(unsigned long long *)params[2];
        return fk_enqueue(s, &op);
    }
    /* The parameters are copied at launch, as the driver does (shoal_reduce_* signature). */
    op.u.k.f = f;
    op.u.k.grid = gx;
    op.u.k.block = bx;
    op.u.k.dst = (uintptr_t) * (void **)params[0];
    op.u.k.srcs = *(shoal_cuda_srcs_t *)params[1];
    op.u.k.nsrc = *(int *)params[2];
    op.u.k.count = *(unsigned long long *)params[3];
    op.u.k.div = *(int *)params[4];
    op.u.k.vec = *(int *)params[5];
    return fk_enqueue(s, &op);
}

/* ---- IPC ---------------------------------------------------------------------------------- */

typedef struct {
    uint64_t magic;
    int64_t pid;
    int64_t fd;
    uint64_t size;
    int64_t ordinal;
} fk_ipc_t;

FAKECUDA_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    fk_region_t *r;
    fk_ipc_t x;
    FK_ENTER();
    pthread_mutex_lock(&fk.lock);
    r = fk_region_find_locked((uintptr_t)p, 0);
    if (r == NULL || r->kind != FK_DEV || r->base != (uintptr_t)p) {
        pthread_mutex_unlock(&fk.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    x = (fk_ipc_t){.magic = FAKECUDA_IPC_MAGIC, .pid = getpid(), .fd = r->fd, .size = r->size,
                   .ordinal = r->ordinal};
    pthread_mutex_unlock(&fk.lock);
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &x, sizeof(x));
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h,
                                                    unsigned int flags)
{
    fk_ipc_t x;
    char path[64];
    int fd;
    uintptr_t base;
    CUresult r;
    FK_NEED_CTX();
    (void)flags;
    memcpy(&x, h.reserved, sizeof(x));
    if (x.magic != FAKECUDA_IPC_MAGIC || x.size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (x.pid == getpid()) {
        return CUDA_ERROR_INVALID_CONTEXT; /* the real driver refuses its own handles too */
    }
    if (x.ordinal != fk_current->ordinal) {
        return CUDA_ERROR_INVALID_DEVICE; /* no peer access between emulated devices */
    }
    snprintf(path, sizeof(path), "/proc/%lld/fd/%lld", (long long)x.pid, (long long)x.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        fk_log("cuIpcOpenMemHandle: %s: %s", path, strerror(errno));
        return CUDA_ERROR_INVALID_HANDLE;
    }
    r = fk_map_device(fd, x.size, FK_IPC, (int)x.ordinal, &base);
    if (r != CUDA_SUCCESS) {
        close(fd);
        return r;
    }
    *p = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr p)
{
    return fk_release((uintptr_t)p, FK_IPC, "cuIpcCloseMemHandle");
}
