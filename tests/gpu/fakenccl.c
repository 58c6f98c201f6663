/*
 * libfakenccl: a host emulation of the five NCCL calls libshoal's delegate uses
 * (src/cuda/cuda_nccl.c: ncclGetUniqueId, ncclCommInitRank, ncclAllReduce, ncclCommDestroy,
 * ncclGetErrorString), so that SHOAL_CUDA_BACKEND=nccl runs in `make check` on machines
 * without a GPU or NCCL (tests/gpu/run_nccl_emu.sh). It is an emulation, like libfakecuda,
 * on whose device memory it works: no GPU, no NCCL code is involved.
 *
 * It does a real AllReduce between processes: the unique id names a POSIX shared-memory
 * segment (/fakenccl-<id>) that every rank of the communicator maps; it holds one slot per
 * rank and a progress word per rank. For each chunk of the buffer, every rank copies its input
 * from device memory into its slot through the emulated driver (cuMemcpyDtoHAsync on the
 * call's stream, then cuStreamSynchronize: the copy comes after the stream's earlier work),
 * waits for every rank's slot, reduces the slots in rank order (so every rank gets the same
 * bits), waits until every rank has read the slots, and copies the result to the output
 * (cuMemcpyHtoDAsync on the stream). The driver is the instance libshoal loaded
 * (SHOAL_CUDA_LIBCUDA, opened with RTLD_NOLOAD: one emulated device state per process).
 *
 * Stream semantics, as the emulated streams allow: the call runs the AllReduce before it
 * returns, after the stream's earlier work, so later work on the stream sees the result; a real
 * NCCL returns at once and runs on the device. Every wait has a timeout (FAKENCCL_TIMEOUT_MS,
 * default 60000): a peer that does not come fails the call with ncclSystemError (and the
 * communicator with it). Types: every nccl dtype shoal maps (int8 .. float64, float16,
 * bfloat16); ops sum, prod, min, max, avg. Diagnostics go to stderr, prefix "fakenccl:".
 * FAKENCCL_FAIL_UNIQUE_ID=1: ncclGetUniqueId fails (ncclSystemError), as a real NCCL's does where
 * it finds no interface for its bootstrap (NCCL_SOCKET_IFNAME matching none on that host).
 */
#include <cuda.h>
#include <nccl.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define FN_EXPORT __attribute__((visibility("default")))
#define FN_MAX_RANKS 64
#define FN_SLOT (1u << 20)             /* bytes of one rank's slot: the chunk of a step */
#define FN_STR_(x) #x
#define FN_STR(x) FN_STR_(x)           /* the driver's symbol, after cuda.h's _v2 renaming */

typedef struct {
    uint64_t progress[FN_MAX_RANKS];   /* rank r's last step reached (monotonic) */
} fn_shared_t;

struct ncclComm {
    int rank, nranks;
    fn_shared_t *sh;
    uint8_t *slots;                    /* nranks x FN_SLOT, after the header */
    size_t map_bytes;
    uint64_t step;                     /* this rank's steps so far */
    uint8_t *tmp;                      /* FN_SLOT bytes: the reduced chunk */
    int failed;
};

static struct {
    CUresult (*dtoh)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*htod)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*sync)(CUstream);
} fn_drv;

static void fn_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fn_log(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakenccl[%d]: %s\n", (int)getpid(), buf);
}

static uint64_t fn_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t fn_timeout_ms(void)
{
    const char *e = getenv("FAKENCCL_TIMEOUT_MS");
    return e != NULL && atoll(e) > 0 ? (uint64_t)atoll(e) : 60000;
}

/* The driver libshoal loaded (the same emulated device state). */
static ncclResult_t fn_driver(void)
{
    const char *path = getenv("SHOAL_CUDA_LIBCUDA");
    void *h;
    if (fn_drv.sync != NULL) {
        return ncclSuccess;
    }
    h = dlopen(path != NULL ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) {
        fn_log("the CUDA driver (%s) is not loaded in this process: %s",
               path != NULL ? path : "libcuda.so.1", dlerror());
        return ncclSystemError;
    }
    *(void **)&fn_drv.dtoh = dlsym(h, FN_STR(cuMemcpyDtoHAsync));
    *(void **)&fn_drv.htod = dlsym(h, FN_STR(cuMemcpyHtoDAsync));
    *(void **)&fn_drv.sync = dlsym(h, FN_STR(cuStreamSynchronize));
    dlclose(h); /* RTLD_NOLOAD took a reference: libshoal's stays */
    if (fn_drv.dtoh == NULL || fn_drv.htod == NULL || fn_drv.sync == NULL) {
        fn_log("the driver lacks a copy or synchronization call");
        fn_drv.sync = NULL;
        return ncclSystemError;
    }
    return ncclSuccess;
}

static void fn_shm_name(const ncclUniqueId *id, char name[64])
{
    static const char hex[] = "0123456789abcdef";
    int k = snprintf(name, 64, "/fakenccl-");
    for (int i = 0; i < 16; i++) {
        name[k++] = hex[(unsigned char)id->internal[i] >> 4];
        name[k++] = hex[(unsigned char)id->internal[i] & 15];
    }
    name[k] = '\0';
}

FN_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (id == NULL) {
        return ncclInvalidArgument;
    }
    memset(id, 0, sizeof(*id));
    if (getenv("FAKENCCL_FAIL_UNIQUE_ID") != NULL && atoi(getenv("FAKENCCL_FAIL_UNIQUE_ID"))) {
        fn_log("ncclGetUniqueId: failing (FAKENCCL_FAIL_UNIQUE_ID)");
        return ncclSystemError;
    }
    if (getrandom(id->internal, 16, 0) != 16) {
        fn_log("getrandom: %s", strerror(errno));
        return ncclSystemError;
    }
    return ncclSuccess;
}

/* Rank c->rank reached step s; waits (timeout) until every rank has. */
static ncclResult_t fn_step(struct ncclComm *c, const char *what)
{
    uint64_t s = ++c->step, deadline = fn_now_ms() + fn_timeout_ms();
    struct timespec nap = {0, 20000};
    int spins = 0;

    __atomic_store_n(&c->sh->progress[c->rank], s, __ATOMIC_RELEASE);
    for (int q = 0; q < c->nranks; q++) {
        while (__atomic_load_n(&c->sh->progress[q], __ATOMIC_ACQUIRE) < s) {
            if (++spins < 64) {
                sched_yield();
                continue;
            }
            if (fn_now_ms() > deadline) {
                fn_log("rank %d: rank %d did not reach %s (step %llu) within %llu ms", c->rank, q,
                       what, (unsigned long long)s, (unsigned long long)fn_timeout_ms());
                c->failed = 1;
                return ncclSystemError;
            }
            nanosleep(&nap, NULL);
        }
    }
    return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    struct ncclComm *c;
    char name[64];
    int fd;
    ncclResult_t r;

    if (comm == NULL || nranks < 1 || nranks > FN_MAX_RANKS || rank < 0 || rank >= nranks) {
        fn_log("ncclCommInitRank: bad arguments (nranks %d, rank %d; at most %d ranks)", nranks,
               rank, FN_MAX_RANKS);
        return ncclInvalidArgument;
    }
    if ((r = fn_driver()) != ncclSuccess) {
        return r;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL || (c->tmp = malloc(FN_SLOT)) == NULL) {
        free(c);
        return ncclSystemError;
    }
    c->rank = rank;
    c->nranks = nranks;
    c->map_bytes = sizeof(fn_shared_t) + (size_t)nranks * FN_SLOT;
    fn_shm_name(&id, name);
    fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)c->map_bytes) != 0) {
        fn_log("%s: %s", name, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        free(c->tmp);
        free(c);
        return ncclSystemError;
    }
    c->sh = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (c->sh == MAP_FAILED) {
        fn_log("mmap %s: %s", name, strerror(errno));
        free(c->tmp);
        free(c);
        return ncclSystemError;
    }
    c->slots = (uint8_t *)(c->sh + 1);
    /* every rank created or opened the same segment: step 1 says so; then it can go */
    r = fn_step(c, "ncclCommInitRank");
    if (rank == 0) {
        shm_unlink(name);
    }
    if (r != ncclSuccess) {
        munmap(c->sh, c->map_bytes);
        free(c->tmp);
        free(c);
        return r;
    }
    *comm = c;
    return ncclSuccess;
}

static uint16_t fn_f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static float fn_bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Integers: FN_OP_0. Floating types: FN_OP_1, min and max as a real NCCL's (fminf, fmaxf,
 * __hmin, __hmax): a NaN operand gives the other one. */
#define FN_OP_0(a, b, op)                                                                   \
    ((op) == ncclProd ? (a) * (b) : (op) == ncclMin ? ((b) < (a) ? (b) : (a))                \
     : (op) == ncclMax ? ((b) > (a) ? (b) : (a)) : (a) + (b))
#define FN_OP_1(a, b, op) ((op) == ncclProd ? (a) * (b) : (op) == ncclMin ? fn_fmin(a, b) \
                           : (op) == ncclMax ? -fn_fmin(-(a), -(b)) : (a) + (b))

static double fn_fmin(double a, double b)
{
    return a != a ? b : b != b ? a : b < a ? b : a;
}

/* out[i] = op over ranks of slot[r][i], in rank order. avg as a real NCCL computes it:
 * integers divide the sum by n; floating types (FLT) are ncclPreMulSum with 1/n, every input
 * multiplied by 1/n in its type before the sum (so an fp16 sum past the largest finite value
 * still averages to a finite number there). */
#define FN_REDUCE(T, ACC, LOAD, STORE, FLT)                                                 \
    do {                                                                                    \
        int premul = (FLT) && op == ncclAvg;                                                \
        ACC scale = (ACC)(1.0 / c->nranks);                                                 \
        for (size_t i = 0; i < cnt; i++) {                                                  \
            ACC v = LOAD(((const T *)c->slots)[i]);                                         \
            v = premul ? (ACC)(v * scale) : v;                                              \
            for (int r = 1; r < c->nranks; r++) {                                           \
                ACC w = LOAD(((const T *)(c->slots + (size_t)r * FN_SLOT))[i]);             \
                w = premul ? (ACC)(w * scale) : w;                                          \
                v = (ACC)FN_OP_##FLT(v, w, op);                                             \
            }                                                                               \
            if (op == ncclAvg && !(FLT)) {                                                  \
                v = (ACC)(v / (ACC)c->nranks);                                              \
            }                                                                               \
            ((T *)c->tmp)[i] = STORE(v);                                                    \
        }                                                                                   \
    } while (0)
#define FN_ID(x) (x)

static ncclResult_t fn_reduce(struct ncclComm *c, size_t cnt, ncclDataType_t dt, ncclRedOp_t op)
{
    switch (dt) {
    case ncclInt8: FN_REDUCE(int8_t, int8_t, FN_ID, FN_ID, 0); break;
    case ncclUint8: FN_REDUCE(uint8_t, uint8_t, FN_ID, FN_ID, 0); break;
    case ncclInt32: FN_REDUCE(int32_t, int32_t, FN_ID, FN_ID, 0); break;
    case ncclUint32: FN_REDUCE(uint32_t, uint32_t, FN_ID, FN_ID, 0); break;
    case ncclInt64: FN_REDUCE(int64_t, int64_t, FN_ID, FN_ID, 0); break;
    case ncclUint64: FN_REDUCE(uint64_t, uint64_t, FN_ID, FN_ID, 0); break;
    case ncclFloat16: FN_REDUCE(_Float16, _Float16, FN_ID, FN_ID, 1); break;
    case ncclFloat32: FN_REDUCE(float, float, FN_ID, FN_ID, 1); break;
    case ncclFloat64: FN_REDUCE(double, double, FN_ID, FN_ID, 1); break;
    case ncclBfloat16: FN_REDUCE(uint16_t, float, fn_bf2f, fn_f2bf, 1); break;
    default:
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static size_t fn_dtype_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

FN_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream)
{
    struct ncclComm *c = comm;
    size_t es = fn_dtype_size(datatype), per = es != 0 ? FN_SLOT / es : 0;
    CUstream s = (CUstream)stream;
    ncclResult_t r;

    if (c == NULL || es == 0 || (int)op < (int)ncclSum || (int)op > (int)ncclAvg) {
        return ncclInvalidArgument;
    }
    if (c->failed) {
        return ncclSystemError; /* a peer was lost: the communicator is unusable */
    }
    for (size_t off = 0; off < count; off += per) {
        size_t cnt = count - off < per ? count - off : per;
        CUdeviceptr in = (CUdeviceptr)(uintptr_t)sendbuff + off * es;
        CUdeviceptr out = (CUdeviceptr)(uintptr_t)recvbuff + off * es;
        if (fn_drv.dtoh(c->slots + (size_t)c->rank * FN_SLOT, in, cnt * es, s) != CUDA_SUCCESS ||
            fn_drv.sync(s) != CUDA_SUCCESS) {
            fn_log("rank %d: copying the input from the device failed", c->rank);
            return ncclUnhandledCudaError;
        }
        if ((r = fn_step(c, "the inputs")) != ncclSuccess) {
            return r;
        }
        if ((r = fn_reduce(c, cnt, datatype, op)) != ncclSuccess) {
            return r;
        }
        if ((r = fn_step(c, "the reduction")) != ncclSuccess) {
            return r;
        }
        if (fn_drv.htod(out, c->tmp, cnt * es, s) != CUDA_SUCCESS ||
            fn_drv.sync(s) != CUDA_SUCCESS) {
            fn_log("rank %d: copying the result to the device failed", c->rank);
            return ncclUnhandledCudaError;
        }
    }
    return ncclSuccess;
}

FN_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    struct ncclComm *c = comm;
    if (c == NULL) {
        return ncclInvalidArgument;
    }
    munmap(c->sh, c->map_bytes);
    free(c->tmp);
    free(c);
    return ncclSuccess;
}

FN_EXPORT const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (fakenccl: emulated driver)";
    case ncclSystemError: return "unhandled system error (fakenccl: see its stderr line)";
    case ncclInternalError: return "internal error (fakenccl)";
    case ncclInvalidArgument: return "invalid argument (fakenccl)";
    case ncclInvalidUsage: return "invalid usage (fakenccl)";
    default: return "unknown result (fakenccl)";
    }
}
