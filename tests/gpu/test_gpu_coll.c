/*
 * Collectives on device buffers, one rank per process under shoalrun (run_gpu_coll.sh), every
 * rank on the first GPU (ranks share it): every collective x dtype x op x count, stream-
 * ordered and blocking; stream ordering (the call returns while the stream is held, a kernel
 * enqueued after the collective sees its result); a group of calls with send/recv pairs.
 * Results are exact: inputs are small integers. Failure counts are combined over the ranks
 * (host AllReduce MAX); rank 0 prints one TAP line per group. "--probe" prints a TAP skip
 * and exits 0 when no driver or GPU can be used. "--nccl" (SHOAL_CUDA_BACKEND=nccl, one device
 * per rank): the AllReduce sweep and the metering phases only, which must go through the NCCL
 * delegate; the metering checks its ring-equivalent bytes exactly.
 */
#include "cuda/cuda_int.h"
#include "reduce/reduce.h"
#include "tests/tap.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NGROUPS 96
static const char *group_names[NGROUPS];
static int32_t group_fail[NGROUPS];
static int ngroups;

static int group(const char *name)
{
    for (int g = 0; g < ngroups; g++) {
        if (strcmp(group_names[g], name) == 0) {
            return g;
        }
    }
    if (ngroups == NGROUPS) {
        fprintf(stderr, "# more than %d test groups: raise NGROUPS\n", NGROUPS);
        return NGROUPS - 1;
    }
    group_names[ngroups] = strdup(name);
    return ngroups++;
}

typedef struct {
    shoal_comm_t comm;
    int rank, n;
    CUstream s;
    CUmodule mod;
    uint8_t *h_in, *h_out, *h_exp, *h_tmp; /* pinned host */
    CUdeviceptr d_in, d_out;
    size_t cap;                            /* bytes of every buffer */
} ctx_t;

#define CK(call)                                                                         \
    do {                                                                                 \
        if (shoal_cuda_drv_result(shoal_cuda_drv.call, #call, __FILE__, __LINE__)) {    \
            fprintf(stderr, "# rank %d: %s failed\n", x->rank, #call);                  \
            exit(2);                                                                     \
        }                                                                                \
    } while (0)

/* Rank r's input element i for op, stored as dtype. */
static int64_t val(shoal_op_t op, int r, size_t i, int sgn)
{
    switch (op) {
    case SHOAL_PROD:
        return ((i + (size_t)r) % 5 == 0) ? 2 : ((sgn && (i + (size_t)r) % 7 == 0) ? -1 : 1);
    case SHOAL_MIN:
    case SHOAL_MAX:
        return sgn ? (int64_t)((i * 13 + (size_t)r * 7) % 11) - 5 : (int64_t)((i * 13 + r * 7) % 11);
    default:
        return (int64_t)((i + (size_t)r) % 3) - (sgn ? 1 : 0);
    }
}

static int dt_signed(shoal_dtype_t dt)
{
    return dt != SHOAL_UINT8 && dt != SHOAL_UINT32 && dt != SHOAL_UINT64;
}

static void store(shoal_dtype_t dt, void *buf, size_t i, int64_t v)
{
    switch (dt) {
    case SHOAL_INT8: case SHOAL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case SHOAL_INT32: case SHOAL_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case SHOAL_INT64: case SHOAL_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case SHOAL_FLOAT16: ((uint16_t *)buf)[i] = shoal_float_to_half((float)v); break;
    case SHOAL_BFLOAT16: ((uint16_t *)buf)[i] = shoal_float_to_bf16((float)v); break;
    case SHOAL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case SHOAL_FLOAT64: ((double *)buf)[i] = (double)v; break;
    default: break;
    }
}

/* Element i of a floating-point buffer as a double (NaN stays NaN). */
static double load(shoal_dtype_t dt, const void *buf, size_t i)
{
    switch (dt) {
    case SHOAL_FLOAT16: return shoal_half_to_float(((const uint16_t *)buf)[i]);
    case SHOAL_BFLOAT16: return shoal_bf16_to_float(((const uint16_t *)buf)[i]);
    case SHOAL_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

static void fill(shoal_dtype_t dt, shoal_op_t op, int r, void *buf, size_t count, size_t i0)
{
    for (size_t i = 0; i < count; i++) {
        store(dt, buf, i, val(op, r, i0 + i, dt_signed(dt)));
    }
}

/* Expected reduction of count elements (indices i0..) over n ranks into out, with the
 * library's own CPU kernels. */
static void expect_reduce(shoal_dtype_t dt, shoal_op_t op, int n, void *out, size_t count,
                          size_t i0, uint8_t *tmp)
{
    size_t es = shoal_dtype_size(dt);
    const void *srcs[64];
    for (int r = 0; r < n; r++) {
        fill(dt, op, r, tmp + (size_t)r * count * es, count, i0);
        srcs[r] = tmp + (size_t)r * count * es;
    }
    shoal_reduce_n(out, srcs, n, count, dt, op);
    shoal_reduce_avg_finalize(out, count, dt, op, n);
}

static const size_t counts[] = {1, 7, 1000, 65539, (1u << 20) + 5};

static void d2h(ctx_t *x, void *h, CUdeviceptr d, size_t bytes)
{
    if (bytes > 0) {
        CK(cuMemcpyDtoHAsync(h, d, bytes, x->s));
    }
    CK(cuStreamSynchronize(x->s));
}

static void h2d(ctx_t *x, CUdeviceptr d, const void *h, size_t bytes)
{
    if (bytes > 0) {
        CK(cuMemcpyHtoDAsync(d, h, bytes, x->s));
    }
    CK(cuStreamSynchronize(x->s));
}

/* One collective case; returns 1 if the result is wrong (or the call failed). */
static int one_case(ctx_t *x, shoal_coll_type_t type, shoal_dtype_t dt, shoal_op_t op,
                    size_t count, int blocking)
{
    size_t es = shoal_dtype_size(dt), n = (size_t)x->n, in_n = count, out_n = count;
    void *stream = blocking ? NULL : (void *)x->s;
    int root = x->n > 1 ? 1 : 0;
    shoal_status_t st;

    in_n = type == SHOAL_COLL_REDUCE_SCATTER || type == SHOAL_COLL_ALLTOALL ? count * n : count;
    out_n = type == SHOAL_COLL_ALLGATHER || type == SHOAL_COLL_ALLTOALL ? count * n : count;
    if ((in_n + out_n) * es > x->cap || (n + 1) * count * es > x->cap) {
        return 0;
    }
    if (type == SHOAL_COLL_REDUCE_SCATTER || type == SHOAL_COLL_ALLTOALL) {
        for (size_t b = 0; b < n; b++) {
            fill(dt, type == SHOAL_COLL_ALLTOALL ? SHOAL_SUM : op, x->rank,
                 x->h_in + b * count * es, count, b * count);
        }
    } else {
        fill(dt, type == SHOAL_COLL_ALLGATHER || type == SHOAL_COLL_BROADCAST ? SHOAL_SUM : op,
             x->rank, x->h_in, count, 0);
    }
    h2d(x, x->d_in, x->h_in, in_n * es);
    CK(cuMemsetD8Async(x->d_out, 0xee, out_n * es, x->s));
    switch (type) {
    case SHOAL_COLL_ALLREDUCE:
        st = shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, dt, op, x->comm, stream);
        break;
    case SHOAL_COLL_REDUCE:
        st = shoal_reduce((void *)x->d_in, (void *)x->d_out, count, dt, op, root, x->comm, stream);
        break;
    case SHOAL_COLL_BROADCAST:
        st = shoal_broadcast((void *)x->d_in, (void *)x->d_out, count, dt, root, x->comm, stream);
        break;
    case SHOAL_COLL_ALLGATHER:
        st = shoal_allgather((void *)x->d_in, (void *)x->d_out, count, dt, x->comm, stream);
        break;
    case SHOAL_COLL_ALLTOALL:
        st = shoal_alltoall((void *)x->d_in, (void *)x->d_out, count, dt, x->comm, stream);
        break;
    default:
        st = shoal_reduce_scatter((void *)x->d_in, (void *)x->d_out, count, dt, op, x->comm,
                                  stream);
        break;
    }
    if (st != SHOAL_OK) {
        fprintf(stderr, "# rank %d: type %d %s count %zu: %s\n", x->rank, type,
                shoal_dtype_name(dt), count, shoal_status_name(st));
        return 1;
    }
    d2h(x, x->h_out, x->d_out, out_n * es);
    /* expected */
    if (type == SHOAL_COLL_ALLREDUCE || (type == SHOAL_COLL_REDUCE && x->rank == root)) {
        expect_reduce(dt, op, x->n, x->h_exp, count, 0, x->h_tmp);
    } else if (type == SHOAL_COLL_REDUCE) {
        return 0; /* non-root output is not defined */
    } else if (type == SHOAL_COLL_REDUCE_SCATTER) {
        expect_reduce(dt, op, x->n, x->h_exp, count, (size_t)x->rank * count, x->h_tmp);
    } else if (type == SHOAL_COLL_BROADCAST) {
        fill(dt, SHOAL_SUM, root, x->h_exp, count, 0);
    } else if (type == SHOAL_COLL_ALLTOALL) {
        for (size_t b = 0; b < n; b++) {
            fill(dt, SHOAL_SUM, (int)b, x->h_exp + b * count * es, count,
                 (size_t)x->rank * count);
        }
    } else {
        for (size_t b = 0; b < n; b++) {
            fill(dt, SHOAL_SUM, (int)b, x->h_exp + b * count * es, count, 0);
        }
    }
    if (memcmp(x->h_out, x->h_exp, out_n * es) != 0) {
        size_t i = 0;
        while (i < out_n * es && x->h_out[i] == x->h_exp[i]) {
            i++;
        }
        fprintf(stderr, "# rank %d: type %d %s op %d count %zu %s: first wrong byte %zu "
                "(0x%02x, want 0x%02x)\n", x->rank, type, shoal_dtype_name(dt), op, count,
                blocking ? "blocking" : "stream", i, x->h_out[i], x->h_exp[i]);
        return 1;
    }
    return 0;
}

/* --nccl (run_gpu_emu.sh on libfakenccl): SHOAL_CUDA_BACKEND=nccl, one device per rank; the
 * sweep's AllReduces and the metering calls must go through the NCCL delegate. */
static int nccl_mode;

static void sweep(ctx_t *x)
{
    static const shoal_coll_type_t types[] = {SHOAL_COLL_ALLREDUCE, SHOAL_COLL_REDUCE,
                                              SHOAL_COLL_BROADCAST, SHOAL_COLL_ALLGATHER,
                                              SHOAL_COLL_REDUCE_SCATTER, SHOAL_COLL_ALLTOALL};
    static const char *const tnames[] = {"allreduce", "reduce", "broadcast", "allgather",
                                         "reduce_scatter", "alltoall"};
    char name[96];
    for (size_t t = 0; t < SHOAL_ARRAY_SIZE(types); t++) {
        if (nccl_mode && types[t] != SHOAL_COLL_ALLREDUCE) {
            continue; /* only AllReduce is delegated */
        }
        for (int dt = 0; dt < SHOAL_DTYPE_COUNT; dt++) {
            int reduces = types[t] != SHOAL_COLL_BROADCAST && types[t] != SHOAL_COLL_ALLGATHER &&
                          types[t] != SHOAL_COLL_ALLTOALL;
            snprintf(name, sizeof(name), "%s %s: every op and count, stream and blocking",
                     tnames[t], shoal_dtype_name((shoal_dtype_t)dt));
            int g = group(name);
            for (int op = 0; op < (reduces ? SHOAL_OP_COUNT : 1); op++) {
                for (size_t c = 0; c < SHOAL_ARRAY_SIZE(counts); c++) {
                    /* the largest count only for a few dtypes: time on the device is short */
                    if (c == SHOAL_ARRAY_SIZE(counts) - 1 && dt != SHOAL_FLOAT32 &&
                        dt != SHOAL_BFLOAT16 && dt != SHOAL_INT8) {
                        continue;
                    }
                    group_fail[g] += one_case(x, types[t], (shoal_dtype_t)dt, (shoal_op_t)op,
                                              counts[c], (int)(c % 2));
                }
            }
        }
    }
}

/* The stream is held by a gate, the input is copied in behind it; the call must return at
 * once and nothing may run; a kernel after the collective (the library's f32 sum kernel:
 * out2 = out + out) must see its result. */
static void stream_order(ctx_t *x)
{
    int g = group("stream order: host not blocked, later kernel sees the result");
    size_t count = 1 << 20, es = 4;
    volatile uint32_t *gate;
    CUdeviceptr dgate, out2 = x->d_in + count * es;
    CUfunction fn;
    double t0, t1;
    int bad = 0;

    CK(cuMemHostAlloc((void **)&gate, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    *gate = 0;
    CK(cuMemHostGetDevicePointer(&dgate, (void *)gate, 0));
    CK(cuModuleGetFunction(&fn, x->mod, "shoal_reduce_f32_sum"));
    fill(SHOAL_FLOAT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    CK(cuMemsetD8Async(x->d_in, 0xee, count * es, x->s));
    CK(cuStreamSynchronize(x->s));
    /* the input arrives behind the gate: a collective that starts before the stream reaches
     * it reduces the old bytes */
    CK(cuStreamWaitValue32(x->s, dgate, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuMemcpyHtoDAsync(x->d_in, x->h_in, count * es, x->s));
    t0 = shoal_time_ns() / 1e6;
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                           x->comm, x->s) != SHOAL_OK;
    t1 = shoal_time_ns() / 1e6;
    {
        shoal_cuda_srcs_t srcs = {{(void *)x->d_out, (void *)x->d_out}};
        int nsrc = 2, div = 0, vec = 1;
        unsigned long long cnt = count;
        void *params[] = {&out2, &srcs, &nsrc, &cnt, &div, &vec};
        CK(cuLaunchKernel(fn, 64, 1, 1, SHOAL_CUDA_THREADS, 1, 1, 0, x->s, params, NULL));
    }
    CK(cuMemcpyDtoHAsync(x->h_out, out2, count * es, x->s));
    shoal_sleep_us(20000);
    bad |= (shoal_cuda_drv.cuStreamQuery(x->s) != CUDA_ERROR_NOT_READY) << 1;
    /* returns at once: 5 ms, or GPU_CALL_MAX_MS (a ThreadSanitizer build is ~10x slower) */
    bad |= (t1 - t0 > (getenv("GPU_CALL_MAX_MS") != NULL ? atof(getenv("GPU_CALL_MAX_MS"))
                                                         : 5.0)) << 2;
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE); /* the stream (a thread here) polls it */
    CK(cuStreamSynchronize(x->s));
    expect_reduce(SHOAL_FLOAT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
    for (size_t i = 0; i < count; i++) {
        if (((float *)x->h_out)[i] != 2 * ((float *)x->h_exp)[i]) {
            bad |= 8;
            break;
        }
    }
    if (bad) {
        fprintf(stderr, "# rank %d: stream order bad 0x%x (call took %.3f ms)\n", x->rank, bad,
                t1 - t0);
    }
    group_fail[g] += bad != 0;
    shoal_cuda_drv.cuMemFreeHost((void *)gate);
}

/* A late peer: rank 0's stream reaches the collective ~800 ms before the others call it, and
 * waits for it on the device (memory operation or the wait kernel), never in a host function
 * (the emulation runs with FAKECUDA_HOSTFN_MAX_MS, 500: a host function that long faults it;
 * the margin is for a loaded machine, where a 40 ms host function was seen to take 158). */
static void late_peer(ctx_t *x)
{
    int g = group("a late peer: the stream waits, no host function blocks, the result is right");
    size_t count = 4099;
    int bad = 0;

    fill(SHOAL_FLOAT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, x->d_in, x->h_in, count * 4);
    if (x->rank != 0) {
        shoal_sleep_us(800000);
    }
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                           x->comm, x->s) != SHOAL_OK;
    CK(cuMemcpyDtoHAsync(x->h_out, x->d_out, count * 4, x->s));
    bad |= (shoal_cuda_drv.cuStreamSynchronize(x->s) != CUDA_SUCCESS) << 1;
    expect_reduce(SHOAL_FLOAT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
    bad |= (memcmp(x->h_out, x->h_exp, count * 4) != 0) << 2;
    bad |= (shoal_barrier(x->comm, NULL) != SHOAL_OK) << 3; /* and the driver is fine */
    if (bad) {
        fprintf(stderr, "# rank %d: late peer: bad 0x%x\n", x->rank, bad);
    }
    group_fail[g] += bad != 0;
}

/* Host buffers on a stream: the call is stream-ordered all the same (it runs when the
 * stream reaches it, behind a gate here) and the stream's later work sees the result. The
 * output is pageable (malloc) and then pinned: only from pinned memory does the stream's later
 * copy read it in stream order; the driver reads a pageable source when the copy is called
 * (seen on an H200: the copy carried the zeros of the time of the call, although the
 * collective had written its result before the stream reached the copy). */
static void host_on_stream(ctx_t *x)
{
    int g = group("host buffers on a stream: ordered, result visible to later stream work");
    size_t count = 100003;
    int32_t *in = malloc(count * 4), *pageable = malloc(count * 4), *pinned = NULL;
    volatile uint32_t *gate;
    CUdeviceptr dgate;
    int bad = in == NULL || pageable == NULL;

    CK(cuMemHostAlloc((void **)&gate, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    CK(cuMemHostAlloc((void **)&pinned, count * 4, 0));
    for (int kind = 0; kind < 2 && !bad; kind++) {
        int32_t *out = kind == 0 ? pageable : pinned;
        *gate = 0;
        CK(cuMemHostGetDevicePointer(&dgate, (void *)gate, 0));
        fill(SHOAL_INT32, SHOAL_SUM, x->rank, in, count, 0);
        memset(out, 0, count * 4);
        CK(cuStreamWaitValue32(x->s, dgate, 1, CU_STREAM_WAIT_VALUE_GEQ));
        bad |= shoal_allreduce(in, out, count, SHOAL_INT32, SHOAL_SUM, x->comm, x->s) != SHOAL_OK;
        if (kind == 1) {
            /* later stream work: the result goes to the device and back */
            CK(cuMemcpyHtoDAsync(x->d_out, out, count * 4, x->s));
            CK(cuMemcpyDtoHAsync(x->h_out, x->d_out, count * 4, x->s));
        }
        shoal_sleep_us(10000);
        bad |= (out[0] != 0 || out[count - 1] != 0) << 1; /* nothing ran behind the gate */
        __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
        CK(cuStreamSynchronize(x->s));
        expect_reduce(SHOAL_INT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
        bad |= (memcmp(out, x->h_exp, count * 4) != 0) << (2 + 2 * kind);
        if (kind == 1) {
            bad |= (memcmp(x->h_out, x->h_exp, count * 4) != 0) << 3;
        }
    }
    if (bad) {
        fprintf(stderr, "# rank %d: host buffers on a stream: bad 0x%x\n", x->rank, bad);
    }
    group_fail[g] += bad != 0;
    free(in);
    free(pageable);
    shoal_cuda_drv.cuMemFreeHost(pinned);
    shoal_cuda_drv.cuMemFreeHost((void *)gate);
}

/* (a host function may not run long: FAKECUDA_HOSTFN_MAX_MS, as a GPU's watchdog; a hold of
 * 100 ms overslept to 156 ms on a loaded 2-core machine, over the limit of then, 150 ms) */
static void CUDA_CB hold_40ms(void *arg)
{
    (void)arg;
    usleep(40 * 1000);
}

/* The legacy default stream (cudaStreamLegacy, PyTorch's default stream): the call waits on
 * the host for it and returns with the result in place, which another stream reads at once
 * (the stream is held 40 ms before each call). Runs first, so that the communicator's first
 * device call (the IPC setup on 2+ ranks) is on it, as in a PyTorch job: stream-ordered,
 * that hung on an H200. */
static void legacy_stream(ctx_t *x)
{
    int g = group("legacy default stream: result in place on return (first call included)");
    size_t count = 65539, es = 4, n = (size_t)x->n;
    CUstream other;
    int bad = 0;

    CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    fill(SHOAL_INT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, x->d_in, x->h_in, count * es);
    for (int type = 0; type < 2; type++) {
        memset(x->h_out, 0xee, n * count * es);
        h2d(x, x->d_out, x->h_out, n * count * es);
        /* the stream is busy for 40 ms: a call that returned before it passed would leave
         * the old bytes for the other stream to read */
        CK(cuLaunchHostFunc(CU_STREAM_LEGACY, hold_40ms, NULL));
        if (type == 0) {
            bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_INT32,
                                   SHOAL_SUM, x->comm, (void *)CU_STREAM_LEGACY) != SHOAL_OK;
            expect_reduce(SHOAL_INT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
        } else {
            bad |= shoal_allgather((void *)x->d_in, (void *)x->d_out, count, SHOAL_INT32,
                                   x->comm, (void *)CU_STREAM_LEGACY) != SHOAL_OK;
            for (int r = 0; r < x->n; r++) {
                fill(SHOAL_INT32, SHOAL_SUM, r, x->h_exp + (size_t)r * count * es, count, 0);
            }
        }
        size_t bytes = (type == 0 ? 1 : n) * count * es;
        CK(cuMemcpyDtoHAsync(x->h_out, x->d_out, bytes, other));
        CK(cuStreamSynchronize(other));
        if (memcmp(x->h_out, x->h_exp, bytes) != 0) {
            fprintf(stderr, "# rank %d: legacy stream: %s result not in place on return "
                    "(first words 0x%x 0x%x, want 0x%x 0x%x)\n", x->rank,
                    type == 0 ? "allreduce" : "allgather", ((uint32_t *)x->h_out)[0],
                    ((uint32_t *)x->h_out)[1], ((uint32_t *)x->h_exp)[0],
                    ((uint32_t *)x->h_exp)[1]);
            bad = 1;
        }
    }
    CK(cuStreamSynchronize(CU_STREAM_LEGACY));
    CK(cuStreamDestroy(other));
    group_fail[g] += bad;
}

/* GPU_EXPECT_SYNC=memops|hostfn|host: the stream-ordering mechanism the layer chose (an H200
 * with CUDA 13 reports no v1 stream memory operations but runs the v2 ones: memops there). */
static void sync_choice(ctx_t *x)
{
    const char *want = getenv("GPU_EXPECT_SYNC");
    shoal_cuda_comm_t *cc;
    if (want == NULL) {
        return;
    }
    int g = group("stream ordering by the expected mechanism (GPU_EXPECT_SYNC)");
    const char *got = shoal_cuda_comm_get(x->comm, -1, &cc) != SHOAL_OK ? "?"
                      : cc->sync_host                                   ? "host"
                      : cc->memops                                      ? "memops"
                                                                        : "hostfn";
    int bad = strcmp(got, want) != 0;
    if (bad) {
        fprintf(stderr, "# rank %d: stream ordering by %s, expected %s\n", x->rank, got, want);
    }
    group_fail[g] += bad;
}

/* SHOAL_CUDA_SYNC=host: a stream-ordered call returns with its result in place: another
 * stream, which does not wait for the call's stream, reads it at once. */
static void host_in_place(ctx_t *x)
{
    int g = group("host sync: the result is in place when the call returns");
    size_t count = 300007;
    CUstream other;
    int bad = 0;

    fill(SHOAL_INT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, x->d_in, x->h_in, count * 4);
    CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_INT32, SHOAL_SUM,
                           x->comm, x->s) != SHOAL_OK;
    CK(cuMemcpyDtoHAsync(x->h_out, x->d_out, count * 4, other));
    CK(cuStreamSynchronize(other));
    expect_reduce(SHOAL_INT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
    bad |= memcmp(x->h_out, x->h_exp, count * 4) != 0;
    CK(cuStreamDestroy(other));
    if (bad) {
        fprintf(stderr, "# rank %d: host sync: the result was not in place on return\n", x->rank);
    }
    group_fail[g] += bad;
}

/* The calling thread's current context is its own: the layer makes the communicator's device
 * current for its calls and must put the thread's back (the runtime's current device follows
 * it). Here the thread has none: it must have none after a blocking and a stream-ordered call
 * (and, by the same path, keep another device's context where it had one). */
static void keeps_context(ctx_t *x)
{
    int g = group("the calling thread's current CUDA context is left as it was");
    CUcontext mine = NULL, after = (CUcontext)1, after_stream = (CUcontext)1;
    size_t count = 1000;
    int bad = 0;

    CK(cuCtxGetCurrent(&mine));
    CK(cuCtxSetCurrent(NULL));
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_INT32, SHOAL_SUM,
                           x->comm, NULL) != SHOAL_OK;
    CK(cuCtxGetCurrent(&after));
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_INT32, SHOAL_SUM,
                           x->comm, x->s) != SHOAL_OK;
    CK(cuCtxGetCurrent(&after_stream));
    CK(cuCtxSetCurrent(mine));
    CK(cuStreamSynchronize(x->s));
    if (after != NULL || after_stream != NULL) {
        fprintf(stderr, "# rank %d: a context is current after a blocking (%p) or stream-ordered "
                "(%p) call, none was before\n", x->rank, (void *)after, (void *)after_stream);
        bad = 1;
    }
    group_fail[g] += bad;
}

/* A group: allreduce + broadcast + a ring of send/recv pairs, one proxy task. */
static void group_case(ctx_t *x)
{
    int g = group("group: allreduce + broadcast + send/recv ring in one task");
    size_t count = 300007, es = 4;
    CUdeviceptr a = x->d_in, b = x->d_in + count * es, sb = x->d_out, rb = x->d_out + count * es;
    int next = (x->rank + 1) % x->n, prev = (x->rank + x->n - 1) % x->n, bad = 0;

    fill(SHOAL_INT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, a, x->h_in, count * es);
    h2d(x, b, x->h_in, count * es);
    h2d(x, sb, x->h_in, count * es);
    shoal_group_start();
    bad |= shoal_allreduce((void *)a, (void *)a, count, SHOAL_INT32, SHOAL_SUM, x->comm, x->s);
    bad |= shoal_broadcast((void *)b, (void *)b, count, SHOAL_INT32, 0, x->comm, x->s);
    if (x->n > 1) {
        bad |= shoal_recv((void *)rb, count, SHOAL_INT32, prev, x->comm, x->s);
        bad |= shoal_send((void *)sb, count, SHOAL_INT32, next, x->comm, x->s);
    }
    bad |= shoal_group_end();
    CK(cuStreamSynchronize(x->s));
    expect_reduce(SHOAL_INT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
    d2h(x, x->h_out, a, count * es);
    bad |= memcmp(x->h_out, x->h_exp, count * es) != 0;
    fill(SHOAL_INT32, SHOAL_SUM, 0, x->h_exp, count, 0);
    d2h(x, x->h_out, b, count * es);
    bad |= memcmp(x->h_out, x->h_exp, count * es) != 0;
    if (x->n > 1) {
        fill(SHOAL_INT32, SHOAL_SUM, prev, x->h_exp, count, 0);
        d2h(x, x->h_out, rb, count * es);
        bad |= memcmp(x->h_out, x->h_exp, count * es) != 0;
    }
    group_fail[g] += bad != 0;
}

/* A group of a send to the next rank, an AllReduce, then the receive from the previous rank
 * (1 MiB each way): the send and its matching receive are posted at once, the collective in
 * between does not split them. */
static void group_p2p_around_coll(ctx_t *x)
{
    size_t count = (1u << 20) / 4, es = 4, bytes = count * es;
    CUdeviceptr sb = x->d_in, ab = x->d_in + bytes, rb = x->d_out;
    int next = (x->rank + 1) % x->n, prev = (x->rank + x->n - 1) % x->n, bad = 0;

    if (x->n < 2) {
        return;
    }
    int g = group("group: send, allreduce, then the matching receive");
    fill(SHOAL_INT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, sb, x->h_in, bytes);
    h2d(x, ab, x->h_in, bytes);
    shoal_group_start();
    bad |= shoal_send((void *)sb, count, SHOAL_INT32, next, x->comm, x->s);
    bad |= shoal_allreduce((void *)ab, (void *)ab, count, SHOAL_INT32, SHOAL_SUM, x->comm, x->s);
    bad |= shoal_recv((void *)rb, count, SHOAL_INT32, prev, x->comm, x->s);
    bad |= shoal_group_end();
    CK(cuStreamSynchronize(x->s));
    fill(SHOAL_INT32, SHOAL_SUM, prev, x->h_exp, count, 0);
    d2h(x, x->h_out, rb, bytes);
    bad |= memcmp(x->h_out, x->h_exp, bytes) != 0;
    expect_reduce(SHOAL_INT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
    d2h(x, x->h_out, ab, bytes);
    bad |= memcmp(x->h_out, x->h_exp, bytes) != 0;
    if (bad) {
        fprintf(stderr, "# rank %d: group {send, allreduce, recv} failed: %s\n", x->rank,
                shoal_comm_last_error(x->comm));
    }
    group_fail[g] += bad != 0;
}

/* A blocking group (stream NULL) that mixes host and device buffers: every rank sends a host
 * buffer, then a device one, to the next rank and receives from the previous one into a device
 * buffer, then a host one. The host sends and receives were posted apart from the device ones,
 * after them: every rank waited in its device receive for the peer's host send until the
 * timeout. Messages match in the order of the calls, whatever their buffers. */
static void group_host_device_p2p(ctx_t *x)
{
    size_t count = 70001, bytes = count * 4;
    int next = (x->rank + 1) % x->n, prev = (x->rank + x->n - 1) % x->n, bad = 0;
    shoal_status_t st;

    if (x->n < 2) {
        return;
    }
    int g = group("blocking group of host and device sends and receives, in call order");
    fill(SHOAL_INT32, SHOAL_SUM, x->rank, x->h_in, 2 * count, 0);
    h2d(x, x->d_in, x->h_in, 2 * bytes);
    memset(x->h_out, 0xee, 2 * bytes);
    h2d(x, x->d_out, x->h_out, bytes);
    shoal_group_start();
    bad |= shoal_send(x->h_in, count, SHOAL_INT32, next, x->comm, NULL) != SHOAL_OK;
    bad |= shoal_send((void *)(x->d_in + bytes), count, SHOAL_INT32, next, x->comm, NULL) !=
           SHOAL_OK;
    bad |= shoal_recv((void *)x->d_out, count, SHOAL_INT32, prev, x->comm, NULL) != SHOAL_OK;
    bad |= shoal_recv(x->h_out + bytes, count, SHOAL_INT32, prev, x->comm, NULL) != SHOAL_OK;
    st = shoal_group_end();
    d2h(x, x->h_out, x->d_out, bytes);
    fill(SHOAL_INT32, SHOAL_SUM, prev, x->h_exp, 2 * count, 0);
    if (bad || st != SHOAL_OK || memcmp(x->h_out, x->h_exp, 2 * bytes) != 0) {
        fprintf(stderr, "# rank %d: group of host and device sends and receives: %s, words %d "
                "%d (want %d %d): %s\n", x->rank, shoal_status_name(st), ((int32_t *)x->h_out)[0],
                ((int32_t *)x->h_out)[count], ((int32_t *)x->h_exp)[0],
                ((int32_t *)x->h_exp)[count], shoal_comm_last_error(x->comm));
        bad = 1;
    }
    group_fail[g] += bad;
}

static void *destroy_thread(void *arg)
{
    return (void *)(intptr_t)shoal_comm_destroy((shoal_comm_t)arg);
}

/* Inside a group: a call on communicator A, one on B, one on the test's communicator, one on
 * C; then A is destroyed, C is destroyed on another thread, and B aborted before the end. The
 * end fails (A's and C's calls were dropped, B is aborted), touches none of them (A's memory
 * was gone: the end read it and crashed; C's records were dropped only by a destroy on the
 * group's own thread), and still submits the test communicator's call, which its peers wait
 * for (the end stopped at B's failure: that call never ran, its output stayed unwritten). */

static void group_lost_comm(ctx_t *x)
{
    int g = group("group: communicators destroyed (here, on another thread), one aborted "
                  "inside it; the other call runs");
    size_t count = 40961, es = 4, bytes = count * es;
    shoal_comm_t gone = NULL, gone_t = NULL, aborted = NULL;
    shoal_status_t st = SHOAL_OK;
    pthread_t th;
    void *ret = NULL;
    int bad = 0;

    bad |= shoal_comm_split(x->comm, 0, x->rank, &gone) != SHOAL_OK;
    bad |= (shoal_comm_split(x->comm, 0, x->rank, &aborted) != SHOAL_OK) << 1;
    bad |= (shoal_comm_split(x->comm, 0, x->rank, &gone_t) != SHOAL_OK) << 8;
    if (bad) {
        group_fail[g]++;
        return;
    }
    fill(SHOAL_INT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, x->d_in, x->h_in, bytes);
    memset(x->h_out, 0xee, bytes);
    h2d(x, x->d_out + 2 * bytes, x->h_out, bytes);
    shoal_group_start();
    bad |= (shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_INT32, SHOAL_SUM,
                            gone, x->s) != SHOAL_OK) << 2;
    bad |= (shoal_allreduce((void *)x->d_in, (void *)(x->d_out + bytes), count, SHOAL_INT32,
                            SHOAL_SUM, aborted, x->s) != SHOAL_OK) << 3;
    bad |= (shoal_allreduce((void *)x->d_in, (void *)(x->d_out + 2 * bytes), count, SHOAL_INT32,
                            SHOAL_SUM, x->comm, x->s) != SHOAL_OK) << 4;
    bad |= (shoal_allreduce((void *)x->d_in, (void *)(x->d_out + 3 * bytes), count, SHOAL_INT32,
                            SHOAL_SUM, gone_t, x->s) != SHOAL_OK) << 9;
    shoal_comm_destroy(gone);
    /* a thread's records were dropped only by a destroy on the same thread */
    bad |= (pthread_create(&th, NULL, destroy_thread, gone_t) != 0 ||
            pthread_join(th, &ret) != 0 || ret != (void *)(intptr_t)SHOAL_OK) << 10;
    shoal_comm_abort(aborted);
    st = shoal_group_end();
    bad |= (st == SHOAL_OK) << 5;
    CK(cuStreamSynchronize(x->s));
    expect_reduce(SHOAL_INT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
    d2h(x, x->h_out, x->d_out + 2 * bytes, bytes);
    bad |= (memcmp(x->h_out, x->h_exp, bytes) != 0) << 6;
    shoal_comm_destroy(aborted);
    bad |= (shoal_barrier(x->comm, NULL) != SHOAL_OK) << 7;
    if (bad) {
        fprintf(stderr, "# rank %d: group with a lost communicator: bad 0x%x, end %s, "
                "first word %d (want %d): %s\n", x->rank, bad, shoal_status_name(st),
                ((int32_t *)x->h_out)[0], ((int32_t *)x->h_exp)[0],
                shoal_comm_last_error(x->comm));
    }
    group_fail[g] += bad != 0;
}

/* Where the process sees several devices: an input on the communicator's device and an output
 * on another is refused (SHOAL_ERR_INVALID_ARG), and the communicator stays usable. */
/* Ranks that mix host and device buffers differently in one AllReduce: rank 0's input is
 * in host memory, every other rank's on the device. Each rank chose its path (IPC, NCCL or
 * staging) from its own buffers, so rank 0 staged while the others waited in the IPC setup:
 * the call timed out. Blocking and stream-ordered; the result must be exact on every rank. */
static void mixed_host_device(ctx_t *x)
{
    int g = group("AllReduce with a host input on rank 0, device inputs elsewhere");
    size_t count = 70001;
    int bad = 0;

    if (x->n < 2) {
        return;
    }
    fill(SHOAL_INT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, x->d_in, x->h_in, count * 4);
    expect_reduce(SHOAL_INT32, SHOAL_SUM, x->n, x->h_exp, count, 0, x->h_tmp);
    for (int blocking = 1; blocking >= 0; blocking--) {
        const void *in = x->rank == 0 ? (const void *)x->h_in : (const void *)x->d_in;
        shoal_status_t st;
        memset(x->h_out, 0xee, count * 4);
        h2d(x, x->d_out, x->h_out, count * 4);
        st = shoal_allreduce(in, (void *)x->d_out, count, SHOAL_INT32, SHOAL_SUM, x->comm,
                             blocking ? NULL : (void *)x->s);
        d2h(x, x->h_out, x->d_out, count * 4);
        if (st != SHOAL_OK || memcmp(x->h_out, x->h_exp, count * 4) != 0) {
            fprintf(stderr, "# rank %d: mixed host/device AllReduce (%s): %s, first word %d "
                    "(want %d)\n", x->rank, blocking ? "blocking" : "stream-ordered",
                    shoal_status_name(st), ((int32_t *)x->h_out)[0], ((int32_t *)x->h_exp)[0]);
            bad = 1;
        }
    }
    group_fail[g] += bad;
}

/* AVG of fp16/bf16 on device buffers: as on the host and as the README says, the sum is
 * rounded to the dtype (to inf past its largest finite value) before the one divide. The IPC
 * kernels divided the unrounded fp32 sum: two ranks of 40000 in fp16 averaged to 40000 there,
 * and rank 0's largest finite value plus 1.5 half-ulps from the others to a finite number,
 * while the staging path (the host kernels) gave inf; the NCCL delegate passed ncclAvg on
 * (floats: every input premultiplied by 1/n), finite there too. Even elements take those
 * sums, odd ones ordinary values; every element must have the host's bits, blocking and
 * stream-ordered, on every backend. */
static void avg_half_rounds_sum(ctx_t *x)
{
    size_t count = 4099;
    int g, bad = 0;

    g = group("AllReduce AVG fp16/bf16: the sum is rounded (to inf) before the divide");
    for (int dt = SHOAL_FLOAT16; dt <= SHOAL_BFLOAT16; dt++) {
        int bf = dt == SHOAL_BFLOAT16;
        /* largest finite value and half its ulp: the sum rounds to inf from max + half */
        float max = bf ? 0x1.fep127f : 65504.0f, half = bf ? 0x1p119f : 16.0f;
        const void *srcs[64];
        for (int r = 0; r < x->n; r++) {
            uint16_t *p = (uint16_t *)(x->h_tmp + (size_t)r * count * 2);
            for (size_t i = 0; i < count; i++) {
                float v = (float)((i + (size_t)r) % 9) * 0.375f - 1.0f;
                if (i % 2 == 0 && x->n > 1) {
                    v = r == 0 ? max : 1.5f * half / (float)(x->n - 1);
                }
                if (i % 4 == 0) {
                    v = 40000.0f; /* the README's example: inf in fp16, exact in bf16 */
                }
                p[i] = bf ? shoal_float_to_bf16(v) : shoal_float_to_half(v);
            }
            srcs[r] = p;
        }
        memcpy(x->h_in, x->h_tmp + (size_t)x->rank * count * 2, count * 2);
        shoal_reduce_n(x->h_exp, srcs, x->n, count, (shoal_dtype_t)dt, SHOAL_AVG);
        shoal_reduce_avg_finalize(x->h_exp, count, (shoal_dtype_t)dt, SHOAL_AVG, x->n);
        if (x->n > 1 && (((uint16_t *)x->h_exp)[2] & 0x7fff) != (bf ? 0x7f80 : 0x7c00)) {
            fprintf(stderr, "# rank %d: the host's %s AVG of max + half is 0x%04x, not inf\n",
                    x->rank, shoal_dtype_name((shoal_dtype_t)dt), ((uint16_t *)x->h_exp)[2]);
            bad = 1;
        }
        h2d(x, x->d_in, x->h_in, count * 2);
        for (int blocking = 1; blocking >= 0; blocking--) {
            shoal_status_t st;
            CK(cuMemsetD8Async(x->d_out, 0xee, count * 2, x->s));
            st = shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, (shoal_dtype_t)dt,
                                 SHOAL_AVG, x->comm, blocking ? NULL : (void *)x->s);
            d2h(x, x->h_out, x->d_out, count * 2);
            if (st != SHOAL_OK || memcmp(x->h_out, x->h_exp, count * 2) != 0) {
                size_t i = 0;
                while (st == SHOAL_OK && i + 1 < count &&
                       ((uint16_t *)x->h_out)[i] == ((uint16_t *)x->h_exp)[i]) {
                    i++;
                }
                fprintf(stderr, "# rank %d: %s AVG (%s): %s, element %zu 0x%04x (want 0x%04x)\n",
                        x->rank, shoal_dtype_name((shoal_dtype_t)dt),
                        blocking ? "blocking" : "stream-ordered", shoal_status_name(st), i,
                        ((uint16_t *)x->h_out)[i], ((uint16_t *)x->h_exp)[i]);
                bad = 1;
            }
        }
    }
    group_fail[g] += bad;
}

/* MIN/MAX of floats on device buffers propagate NaN as on the host (shoal.h, README): a NaN
 * of any rank gives NaN, the other elements the host's bits. The NCCL delegate took ncclMin
 * and ncclMax, whose fminf/fmaxf (__hmin/__hmax) return the other operand: the NaN was lost.
 * NaN at element i on rank i % (n + 1); none where that is n. */
static void minmax_nan(ctx_t *x)
{
    static const shoal_dtype_t dts[] = {SHOAL_FLOAT16, SHOAL_BFLOAT16, SHOAL_FLOAT32,
                                        SHOAL_FLOAT64};
    size_t count = 1027;
    int g = group("AllReduce MIN/MAX of floats: a NaN of any rank gives NaN"), bad = 0;

    for (size_t d = 0; d < SHOAL_ARRAY_SIZE(dts); d++) {
        shoal_dtype_t dt = dts[d];
        size_t es = shoal_dtype_size(dt);
        const void *srcs[64];
        for (int r = 0; r < x->n; r++) {
            uint8_t *p = x->h_tmp + (size_t)r * count * es;
            for (size_t i = 0; i < count; i++) {
                store(dt, p, i, (int64_t)((i + (size_t)r) % 7) - 3);
                if (i % (size_t)(x->n + 1) == (size_t)r) {
                    uint64_t nan = dt == SHOAL_FLOAT16    ? 0x7e00
                                   : dt == SHOAL_BFLOAT16 ? 0x7fc0
                                   : dt == SHOAL_FLOAT32  ? 0x7fc00000u
                                                          : 0x7ff8000000000000ull;
                    memcpy(p + i * es, &nan, es); /* little-endian: the low es bytes */
                }
            }
            srcs[r] = p;
        }
        memcpy(x->h_in, x->h_tmp + (size_t)x->rank * count * es, count * es);
        h2d(x, x->d_in, x->h_in, count * es);
        for (int op = SHOAL_MIN; op <= SHOAL_MAX; op++) {
            shoal_status_t st;
            size_t i;
            shoal_reduce_n(x->h_exp, srcs, x->n, count, dt, (shoal_op_t)op);
            CK(cuMemsetD8Async(x->d_out, 0xee, count * es, x->s));
            st = shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, dt, (shoal_op_t)op,
                                 x->comm, (void *)x->s);
            d2h(x, x->h_out, x->d_out, count * es);
            for (i = 0; st == SHOAL_OK && i < count; i++) {
                double got = load(dt, x->h_out, i), want = load(dt, x->h_exp, i);
                if (isnan(got) != isnan(want) ||
                    (!isnan(want) && memcmp(x->h_out + i * es, x->h_exp + i * es, es) != 0)) {
                    break;
                }
            }
            if (st != SHOAL_OK || i < count) {
                fprintf(stderr, "# rank %d: %s %s: %s, element %zu is %g (want %g)\n",
                        x->rank, shoal_dtype_name(dt), shoal_op_name((shoal_op_t)op),
                        shoal_status_name(st), i, i < count ? load(dt, x->h_out, i) : 0.0,
                        i < count ? load(dt, x->h_exp, i) : 0.0);
                bad = 1;
            }
        }
    }
    group_fail[g] += bad;
}

/* The reduce kernels over more sources than 16, as the IPC AllReduce launches them for more
 * than 16 ranks on one host (up to 64 share its GPUs): fp16/bf16 must still accumulate every
 * source in fp32 and round once (README: once per reduction step), reduce_n's bits. Launches
 * took 16 sources, and the partial result of the first 16 was rounded to the dtype before the
 * next pass added the rest. 40 sources of values with 10 (fp16) or 7 (bf16) fraction bits:
 * their partial sums are not exact in the dtype. SUM and AVG, vector path and tail. */
static void many_sources(ctx_t *x)
{
    static const char *const dtn[] = SHOAL_CUDA_DTYPE_NAMES;
    enum { NS = 40 };
    size_t count = 1003, pitch = SHOAL_ALIGN_UP(count * 2, 16);
    shoal_cuda_comm_t cc = {.nsm = 2};
    CUdeviceptr srcs[NS];
    const void *hs[NS];
    int g = group("reduce kernels over 40 sources: fp16/bf16 rounded once (reduce_n's bits)");
    int bad = 0;

    for (int dt = SHOAL_FLOAT16; dt <= SHOAL_BFLOAT16; dt++) {
        int bf = dt == SHOAL_BFLOAT16;
        char name[64];
        snprintf(name, sizeof(name), "shoal_reduce_%s_sum", dtn[dt]);
        CK(cuModuleGetFunction(&cc.fns[dt][SHOAL_SUM], x->mod, name));
        for (int s = 0; s < NS; s++) {
            uint16_t *p = (uint16_t *)(x->h_tmp + (size_t)s * pitch);
            for (size_t i = 0; i < count; i++) {
                int k = (int)((i * 7 + (size_t)s * 13) % (bf ? 127 : 1021));
                float v = 1.0f + (float)k / (bf ? 128.0f : 1024.0f);
                p[i] = bf ? shoal_float_to_bf16(v) : shoal_float_to_half(v);
            }
            hs[s] = p;
            srcs[s] = x->d_in + (CUdeviceptr)((size_t)s * pitch);
        }
        h2d(x, x->d_in, x->h_tmp, NS * pitch);
        for (int op = SHOAL_SUM; op <= SHOAL_AVG; op += SHOAL_AVG - SHOAL_SUM) {
            shoal_status_t st;
            shoal_reduce_n(x->h_exp, hs, NS, count, (shoal_dtype_t)dt, (shoal_op_t)op);
            shoal_reduce_avg_finalize(x->h_exp, count, (shoal_dtype_t)dt, (shoal_op_t)op, NS);
            CK(cuMemsetD8Async(x->d_out, 0xee, count * 2, x->s));
            st = shoal_cuda_reduce_launch(&cc, x->s, x->d_out, srcs, NS, count,
                                          (shoal_dtype_t)dt, (shoal_op_t)op, NS);
            d2h(x, x->h_out, x->d_out, count * 2);
            if (st != SHOAL_OK || memcmp(x->h_out, x->h_exp, count * 2) != 0) {
                size_t i = 0;
                while (i + 1 < count && ((uint16_t *)x->h_out)[i] == ((uint16_t *)x->h_exp)[i]) {
                    i++;
                }
                fprintf(stderr, "# rank %d: %s %s of %d sources: %s, element %zu 0x%04x (want "
                        "0x%04x)\n", x->rank, shoal_dtype_name((shoal_dtype_t)dt),
                        shoal_op_name((shoal_op_t)op), NS, shoal_status_name(st), i,
                        ((uint16_t *)x->h_out)[i], ((uint16_t *)x->h_exp)[i]);
                bad = 1;
            }
        }
    }
    group_fail[g] += bad;
}

/* A send from a host buffer into a device buffer of the peer, and from a device buffer into a
 * host one, each longer than SHOAL_CUDA_CHUNK_SIZE: the device side cut the message into chunks
 * while the host side sent or expected it whole, and both communicators failed ("message of N
 * bytes, expected M"). Rank 0 sends first, the others receive first (a chain around the ring),
 * blocking and stream-ordered. */
static void p2p_host_device(ctx_t *x)
{
    size_t count = shoal_cuda_config.chunk_size / 4 + 1001, bytes = count * 4;
    int next = (x->rank + 1) % x->n, prev = (x->rank + x->n - 1) % x->n, bad = 0;

    if (x->n < 2 || 2 * bytes > x->cap) {
        return;
    }
    int g = group("send/recv longer than a CUDA chunk between host and device buffers");
    for (int dev_send = 0; dev_send < 2; dev_send++) {
        for (int blocking = 1; blocking >= 0; blocking--) {
            void *stream = blocking ? NULL : (void *)x->s;
            const void *in = dev_send ? (const void *)x->d_in : (const void *)x->h_in;
            void *out = dev_send ? (void *)x->h_out : (void *)x->d_out;
            shoal_status_t st = SHOAL_OK, st2 = SHOAL_OK;
            fill(SHOAL_INT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
            h2d(x, x->d_in, x->h_in, bytes);
            memset(x->h_out, 0xee, bytes);
            h2d(x, x->d_out, x->h_out, bytes);
            if (x->rank == 0) {
                st = shoal_send(in, count, SHOAL_INT32, next, x->comm, stream);
            }
            st2 = shoal_recv(out, count, SHOAL_INT32, prev, x->comm, stream);
            if (x->rank != 0) {
                st = shoal_send(in, count, SHOAL_INT32, next, x->comm, stream);
            }
            CK(cuStreamSynchronize(x->s));
            if (!dev_send) {
                d2h(x, x->h_out, x->d_out, bytes);
            }
            fill(SHOAL_INT32, SHOAL_SUM, prev, x->h_exp, count, 0);
            if (st != SHOAL_OK || st2 != SHOAL_OK || memcmp(x->h_out, x->h_exp, bytes) != 0) {
                fprintf(stderr, "# rank %d: %s send into a %s receive (%s): %s/%s, first word %d "
                        "(want %d): %s\n", x->rank, dev_send ? "device" : "host",
                        dev_send ? "host" : "device", blocking ? "blocking" : "stream-ordered",
                        shoal_status_name(st), shoal_status_name(st2), ((int32_t *)x->h_out)[0],
                        ((int32_t *)x->h_exp)[0], shoal_comm_last_error(x->comm));
                bad = 1;
            }
        }
    }
    group_fail[g] += bad;
}

static void other_device_output(ctx_t *x)
{
    CUcontext mine, other_ctx;
    CUdevice other;
    CUdeviceptr out;
    int ndev = 0, cur = 0, bad = 0;
    shoal_status_t st;

    CK(cuDeviceGetCount(&ndev));
    if (ndev < 2) {
        return;
    }
    int g = group("an output on another device than the input is refused");
    CK(cuCtxGetCurrent(&mine));
    CK(cuCtxGetDevice(&cur));
    CK(cuDeviceGet(&other, (cur + 1) % ndev));
    CK(cuDevicePrimaryCtxRetain(&other_ctx, other));
    CK(cuCtxSetCurrent(other_ctx));
    CK(cuMemAlloc(&out, 4096));
    CK(cuCtxSetCurrent(mine));
    st = shoal_allreduce((void *)x->d_in, (void *)out, 1000, SHOAL_INT32, SHOAL_SUM, x->comm,
                         NULL);
    bad |= st != SHOAL_ERR_INVALID_ARG;
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, 1000, SHOAL_INT32, SHOAL_SUM,
                           x->comm, NULL) != SHOAL_OK;
    if (bad) {
        fprintf(stderr, "# rank %d: output on device %d, input on %d: %s\n", x->rank,
                (cur + 1) % ndev, cur, shoal_status_name(st));
    }
    CK(cuMemFree(out));
    CK(cuDevicePrimaryCtxRelease(other));
    group_fail[g] += bad;
}

/* A group of 9 sends to the next rank, then 9 receives from the previous one, 1 MiB each: 18
 * messages that the staging holds at once (18 MiB of 64) though not as 18 chunks of 4 MiB. The
 * API posts a group's sends and receives at once, so their order does not matter; in two parts
 * (the sends, then the receives) every rank would wait in its sends for receives not posted. */
static void group_many_p2p(ctx_t *x)
{
    enum { K = 9 };
    size_t count = (1u << 20) / 4, es = 4, bytes = count * es;
    int next = (x->rank + 1) % x->n, prev = (x->rank + x->n - 1) % x->n, bad = 0;

    if (x->n < 2 || 2 * K * SHOAL_MIN(shoal_cuda_config.chunk_size, bytes) >
                        shoal_cuda_config.staging_size) {
        return; /* a staging smaller than one round of the group (run_gpu_coll's variants) */
    }
    int g = group("group: 9 sends then 9 receives of 1 MiB, posted at once");
    for (int i = 0; i < K; i++) {
        fill(SHOAL_INT32, SHOAL_SUM, x->rank + i, x->h_in + i * bytes, count, 0);
    }
    h2d(x, x->d_in, x->h_in, K * bytes);
    shoal_group_start();
    for (int i = 0; i < K; i++) {
        bad |= shoal_send((void *)(x->d_in + i * bytes), count, SHOAL_INT32, next, x->comm, x->s);
    }
    for (int i = 0; i < K; i++) {
        bad |= shoal_recv((void *)(x->d_out + i * bytes), count, SHOAL_INT32, prev, x->comm,
                          x->s);
    }
    bad |= shoal_group_end();
    CK(cuStreamSynchronize(x->s));
    d2h(x, x->h_out, x->d_out, K * bytes);
    for (int i = 0; i < K; i++) {
        fill(SHOAL_INT32, SHOAL_SUM, prev + i, x->h_exp, count, 0);
        bad |= memcmp(x->h_out + i * bytes, x->h_exp, bytes) != 0;
    }
    if (bad) {
        fprintf(stderr, "# rank %d: a group of %d sends then %d receives failed: %s\n", x->rank,
                K, K, shoal_comm_last_error(x->comm));
    }
    group_fail[g] += bad != 0;
}

/* CUDA IPC bytes one AllReduce of count elements of es bytes moves for rank me (what
 * cuda_ipc.c reads from peers: slice me of n - 1 peers and the other slices once), 0 when the
 * IPC path is not in use. */
static uint64_t ipc_expected(ctx_t *x, size_t count, size_t es)
{
    shoal_cuda_comm_t *cc;
    uint64_t moved = 0;
    size_t chunk, v = 16 / es;

    /* the delegate takes the f32 SUM of the metering (the IPC path may be set up for others) */
    if (x->n < 2 || shoal_cuda_comm_get(x->comm, -1, &cc) != SHOAL_OK || cc->ipc_state <= 0 ||
        cc->nccl_state > 0) {
        return 0;
    }
    chunk = cc->ipc_chunk_bytes / 16 * 16 / es;
    for (size_t off = 0; off < count; off += chunk) {
        size_t len = SHOAL_MIN(chunk, count - off), units = (len + v - 1) / v, lo, ulen, cnt;
        shoal_block_range(units, x->n, x->rank, &lo, &ulen);
        cnt = SHOAL_MIN((lo + ulen) * v, len) - SHOAL_MIN(lo * v, len);
        moved += ((uint64_t)(x->n - 1) * cnt + (len - cnt)) * es;
    }
    return moved;
}

/* NCCL delegate bytes of one AllReduce of count elements of es bytes for each rank: the
 * ring-equivalent figure (meter_page.h, nccl_sent), floor(2 (n - 1) S / n), computed here on
 * its own; 0 when the delegate is not in use. */
static uint64_t nccl_expected(ctx_t *x, size_t count, size_t es)
{
    shoal_cuda_comm_t *cc;
    uint64_t bytes = (uint64_t)count * es;

    if (x->n < 2 || shoal_cuda_comm_get(x->comm, -1, &cc) != SHOAL_OK || cc->nccl_state <= 0) {
        return 0;
    }
    return bytes * 2 * (uint64_t)(x->n - 1) / (uint64_t)x->n;
}

static int meter_stats(ctx_t *x, shoal_stats_t *s)
{
    *s = (shoal_stats_t)SHOAL_STATS_INIT;
    return shoal_comm_stats(x->comm, s) != SHOAL_OK;
}

/* The deltas of one phase: ops of allreduce and broadcast, no other op, the cuda_ipc bytes
 * and the NCCL delegate's (sent = received = expected, nothing cross-host), bit b of the
 * result per failure. */
static int meter_check(ctx_t *x, const char *phase, const shoal_stats_t *a,
                       const shoal_stats_t *b, uint64_t ar, uint64_t bc, uint64_t ipc,
                       uint64_t nccl)
{
    const int T = SHOAL_STATS_TL_CUDA_IPC, S = SHOAL_STATS_SAME_HOST, O = SHOAL_STATS_OTHER_HOST;
    const int N = SHOAL_STATS_TL_NCCL;
    uint64_t others = (b->ops_total - a->ops_total) - (b->ops[SHOAL_STATS_ALLREDUCE] -
                                                       a->ops[SHOAL_STATS_ALLREDUCE]) -
                      (b->ops[SHOAL_STATS_BROADCAST] - a->ops[SHOAL_STATS_BROADCAST]);
    int bad = 0;
    bad |= (b->ops[SHOAL_STATS_ALLREDUCE] - a->ops[SHOAL_STATS_ALLREDUCE] != ar) << 0;
    bad |= (b->ops[SHOAL_STATS_BROADCAST] - a->ops[SHOAL_STATS_BROADCAST] != bc) << 1;
    bad |= (others != 0) << 2;
    bad |= (b->bytes_sent_by[T][S] - a->bytes_sent_by[T][S] != ipc) << 3;
    bad |= (b->bytes_recv_by[T][S] - a->bytes_recv_by[T][S] != ipc) << 4;
    bad |= (b->bytes_sent_by[T][O] != 0 || b->bytes_recv_by[T][O] != 0) << 5;
    bad |= (b->coll_ns <= a->coll_ns) << 6;
    bad |= (b->errors != a->errors) << 7;
    bad |= (b->bytes_sent_by[N][S] - a->bytes_sent_by[N][S] != nccl) << 8;
    bad |= (b->bytes_recv_by[N][S] - a->bytes_recv_by[N][S] != nccl) << 9;
    bad |= (b->bytes_sent_by[N][O] != 0 || b->bytes_recv_by[N][O] != 0) << 13;
    if (bad) {
        fprintf(stderr, "# rank %d: metering, %s: bad 0x%x: allreduce +%llu (want %llu), "
                "broadcast +%llu (want %llu), others +%llu, cuda_ipc sent +%llu recv +%llu (want "
                "%llu), nccl sent +%llu recv +%llu (want %llu), coll_ns +%llu\n", x->rank, phase,
                bad,
                (unsigned long long)(b->ops[0] - a->ops[0]), (unsigned long long)ar,
                (unsigned long long)(b->ops[1] - a->ops[1]), (unsigned long long)bc,
                (unsigned long long)others,
                (unsigned long long)(b->bytes_sent_by[T][S] - a->bytes_sent_by[T][S]),
                (unsigned long long)(b->bytes_recv_by[T][S] - a->bytes_recv_by[T][S]),
                (unsigned long long)ipc,
                (unsigned long long)(b->bytes_sent_by[N][S] - a->bytes_sent_by[N][S]),
                (unsigned long long)(b->bytes_recv_by[N][S] - a->bytes_recv_by[N][S]),
                (unsigned long long)nccl, (unsigned long long)(b->coll_ns - a->coll_ns));
    }
    return bad;
}

/* Metering of device calls (src/cuda/cuda_api.c, cuda_ipc.c): every stream-ordered, blocking
 * and grouped call counts its ops; the IPC path's device bytes count as cuda_ipc, same host,
 * exactly; the time is the stream's: (a) a stream held 200 ms by a gate before the call does
 * not count those 200 ms (at most the time from the gate's opening to the stream's end);
 * (b) a stream that reaches the call 300 ms before the peers do waits inside it: rank 0
 * counts at least 250 ms although its call returned at once. The sums over ranks of cuda_ipc
 * sent and received agree. */
static void metering(ctx_t *x)
{
    int g = group(nccl_mode ? "metering: NCCL delegate's calls counted (ops, nccl ring bytes), "
                              "time in stream order"
                            : "metering: device calls counted (ops, cuda_ipc bytes), time in "
                              "stream order");
    size_t count = 300007, es = 4;
    shoal_stats_t a, b;
    volatile uint32_t *gate;
    CUdeviceptr dgate;
    uint64_t ipc, nccl, sums[4], t_open, t_done, held_ns;
    int bad = 0;

    CK(cuMemHostAlloc((void **)&gate, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    *gate = 0;
    CK(cuMemHostGetDevicePointer(&dgate, (void *)gate, 0));
    fill(SHOAL_FLOAT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, x->d_in, x->h_in, count * es);

    /* (a) behind a gate. The IPC path's state is read after a host call of this thread (its
     * ticket comes after the proxy's last task: the proxy's writes are visible) */
    bad |= shoal_barrier(x->comm, NULL) != SHOAL_OK;
    ipc = ipc_expected(x, count, es);
    nccl = nccl_expected(x, count, es);
    if (nccl_mode && x->n > 1 && nccl == 0) {
        fprintf(stderr, "# rank %d: metering: the NCCL delegate is not in use\n", x->rank);
        bad |= 1 << 20;
    }
    bad |= meter_stats(x, &a);
    CK(cuStreamWaitValue32(x->s, dgate, 1, CU_STREAM_WAIT_VALUE_GEQ));
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                           x->comm, x->s) != SHOAL_OK;
    shoal_sleep_us(200000);
    t_open = shoal_time_ns();
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    CK(cuStreamSynchronize(x->s));
    t_done = shoal_time_ns();
    bad |= meter_stats(x, &b);
    bad |= meter_check(x, "gated stream", &a, &b, 1, 0, ipc, nccl) << 1;
    held_ns = b.coll_ns - a.coll_ns;
    if (held_ns > (t_done - t_open) + (t_done - t_open) / 100 + 2000000) {
        fprintf(stderr, "# rank %d: metering: %.3f ms counted for a call the stream reached "
                "%.3f ms before it was done (the gate's 200 ms counted?)\n", x->rank,
                held_ns / 1e6, (t_done - t_open) / 1e6);
        bad |= 1 << 10;
    }

    /* (b) the peers come 300 ms late: rank 0's stream waits inside the collective */
    bad |= shoal_barrier(x->comm, NULL) != SHOAL_OK;
    bad |= meter_stats(x, &a);
    if (x->rank != 0) {
        shoal_sleep_us(300000);
    }
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                           x->comm, x->s) != SHOAL_OK;
    CK(cuStreamSynchronize(x->s));
    bad |= meter_stats(x, &b);
    bad |= meter_check(x, "late peers", &a, &b, 1, 0, ipc, nccl) << 1;
    if (x->rank == 0 && x->n > 1 && b.coll_ns - a.coll_ns < 250000000ull) {
        fprintf(stderr, "# rank 0: metering: %.3f ms counted while the stream waited ~300 ms "
                "for the peers inside the collective\n", (b.coll_ns - a.coll_ns) / 1e6);
        bad |= 1 << 11;
    }

    /* (c) blocking device call, (d) a group on a stream: allreduce + broadcast, one task */
    bad |= shoal_barrier(x->comm, NULL) != SHOAL_OK;
    bad |= meter_stats(x, &a);
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                           x->comm, NULL) != SHOAL_OK;
    bad |= meter_stats(x, &b);
    bad |= meter_check(x, "blocking", &a, &b, 1, 0, ipc, nccl) << 1;
    bad |= shoal_barrier(x->comm, NULL) != SHOAL_OK;
    bad |= meter_stats(x, &a);
    shoal_group_start();
    bad |= shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                           x->comm, x->s) != SHOAL_OK;
    bad |= shoal_broadcast((void *)x->d_in, (void *)x->d_in, count, SHOAL_FLOAT32, 0, x->comm,
                           x->s) != SHOAL_OK;
    bad |= shoal_group_end() != SHOAL_OK;
    CK(cuStreamSynchronize(x->s));
    bad |= meter_stats(x, &b);
    bad |= meter_check(x, "group", &a, &b, 1, 1, ipc, nccl) << 1;

    /* every byte one rank's device read from a peer is one the peer counted as sent */
    sums[0] = b.bytes_sent_by[SHOAL_STATS_TL_CUDA_IPC][SHOAL_STATS_SAME_HOST];
    sums[1] = b.bytes_recv_by[SHOAL_STATS_TL_CUDA_IPC][SHOAL_STATS_SAME_HOST];
    sums[2] = b.bytes_sent_by[SHOAL_STATS_TL_NCCL][SHOAL_STATS_SAME_HOST];
    sums[3] = b.bytes_recv_by[SHOAL_STATS_TL_NCCL][SHOAL_STATS_SAME_HOST];
    bad |= shoal_allreduce(sums, sums, 4, SHOAL_UINT64, SHOAL_SUM, x->comm, NULL) != SHOAL_OK;
    bad |= (sums[0] != sums[1] || sums[2] != sums[3]) << 12;
    if (x->rank == 0) {
        printf("# metering: cuda_ipc %llu, nccl %llu bytes per AllReduce of %zu B on rank 0, "
               "sums over ranks: cuda_ipc sent %llu recv %llu, nccl sent %llu recv %llu; gated "
               "call counted %.3f ms of %.3f ms after the gate\n", (unsigned long long)ipc,
               (unsigned long long)nccl, count * es, (unsigned long long)sums[0],
               (unsigned long long)sums[1], (unsigned long long)sums[2],
               (unsigned long long)sums[3], held_ns / 1e6, (t_done - t_open) / 1e6);
    }
    if (bad) {
        fprintf(stderr, "# rank %d: metering: bad 0x%x\n", x->rank, bad);
    }
    group_fail[g] += bad != 0;
    shoal_cuda_drv.cuMemFreeHost((void *)gate);
}

/* "--kill": every rank loops stream-ordered device AllReduces; the last rank SIGKILLs itself
 * right after issuing its fourth. A survivor's stream must be released (no hang) and the
 * communicator must fail with SHOAL_ERR_PEER_FAILED naming the victim. Prints
 * "survivor R: status S after MS ms: WHY" (run_gpu_emu.sh checks it). */
static int kill_mode(ctx_t *x)
{
    size_t count = 2u << 20;
    int victim = x->n - 1, calls = 0, released = 1;
    shoal_status_t st = SHOAL_OK;
    double start = shoal_time_ns() / 1e6, t0 = start, t_prev = start;
    const char *why;

    fill(SHOAL_FLOAT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, x->d_in, x->h_in, count * 4);
    while (st == SHOAL_OK && shoal_time_ns() / 1e6 - start < 30000) {
        double deadline;
        t_prev = t0; /* the verdict's delay counts from the call before the failing one */
        t0 = shoal_time_ns() / 1e6;
        st = shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                             x->comm, x->s);
        if (x->rank == victim && ++calls == 4) {
            kill(getpid(), SIGKILL);
        }
        deadline = shoal_time_ns() / 1e6 + 20000;
        while (shoal_cuda_drv.cuStreamQuery(x->s) == CUDA_ERROR_NOT_READY &&
               shoal_time_ns() / 1e6 < deadline) {
            shoal_sleep_us(1000);
        }
        released = shoal_cuda_drv.cuStreamQuery(x->s) != CUDA_ERROR_NOT_READY;
        if (!released) {
            break;
        }
    }
    if (st == SHOAL_OK && released) {
        /* the failure was found by the last task: the next call reports it */
        t_prev = t0;
        st = shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                             x->comm, x->s);
    }
    why = shoal_comm_last_error(x->comm);
    printf("survivor %d: status %s after %.0f ms: %s%s\n", x->rank,
           released ? shoal_status_name(st) : "STREAM_NOT_RELEASED",
           shoal_time_ns() / 1e6 - t_prev,
           why != NULL ? why : "(no message)",
           tap_names_rank(why, victim) ? "" : " [victim not named]");
    fflush(stdout);
    return !(released && st == SHOAL_ERR_PEER_FAILED && tap_names_rank(why, victim));
}

static int setup(ctx_t *x)
{
    CUdevice dev;
    CUcontext ctx;
    x->cap = 40u << 20;
    int ndev = 1;
    CK(cuDeviceGetCount(&ndev));
    /* GPU_DEVICE_PER_RANK=1: rank r on device r % count (default: every rank on the first) */
    CK(cuDeviceGet(&dev, getenv("GPU_DEVICE_PER_RANK") != NULL &&
                                 atoi(getenv("GPU_DEVICE_PER_RANK")) ? x->rank % ndev : 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&x->s, CU_STREAM_NON_BLOCKING));
    CK(cuModuleLoadData(&x->mod, shoal_cuda_fatbin));
    CK(cuMemAlloc(&x->d_in, x->cap));
    CK(cuMemAlloc(&x->d_out, x->cap));
    CK(cuMemHostAlloc((void **)&x->h_in, x->cap, 0));
    CK(cuMemHostAlloc((void **)&x->h_out, x->cap, 0));
    CK(cuMemHostAlloc((void **)&x->h_exp, x->cap, 0));
    x->h_tmp = malloc(x->cap * (size_t)SHOAL_MAX(x->n, 1));
    return x->h_tmp != NULL;
}

static void teardown(ctx_t *x)
{
    shoal_comm_destroy(x->comm);
    shoal_cuda_drv.cuStreamDestroy(x->s);
    shoal_cuda_drv.cuModuleUnload(x->mod);
    shoal_cuda_drv.cuMemFree(x->d_in);
    shoal_cuda_drv.cuMemFree(x->d_out);
    shoal_cuda_drv.cuMemFreeHost(x->h_in);
    shoal_cuda_drv.cuMemFreeHost(x->h_out);
    shoal_cuda_drv.cuMemFreeHost(x->h_exp);
    free(x->h_tmp);
    for (int g = 0; g < ngroups; g++) {
        free((void *)group_names[g]);
    }
}

/* A stream being captured into a CUDA graph: the call is refused at once on every rank (it
 * waited SHOAL_TIMEOUT_MS for a start only a graph launch gives, failed the communicator, and
 * launches of the graph skipped the collective), and the communicator works after. The
 * capture calls come from the driver shoal loaded (the emulation's or libcuda's). */
static void graph_capture(ctx_t *x)
{
    int g = group("graph capture: refused at once, the communicator works after");
    const char *path = getenv("SHOAL_CUDA_LIBCUDA");
    void *h = dlopen(path != NULL && path[0] != '\0' ? path : "libcuda.so.1",
                     RTLD_NOW | RTLD_NOLOAD);
    CUresult (*begin)(CUstream, CUstreamCaptureMode) =
        h != NULL ? (CUresult(*)(CUstream, CUstreamCaptureMode))dlsym(h, "cuStreamBeginCapture_v2")
                  : NULL;
    CUresult (*end)(CUstream, CUgraph *) =
        h != NULL ? (CUresult(*)(CUstream, CUgraph *))dlsym(h, "cuStreamEndCapture") : NULL;
    CUresult (*destroy)(CUgraph) =
        h != NULL ? (CUresult(*)(CUgraph))dlsym(h, "cuGraphDestroy") : NULL;
    size_t count = 1024;
    CUgraph graph = NULL;
    uint64_t t0;
    int bad = 0;
    shoal_status_t st;

    if (begin == NULL || end == NULL) {
        fprintf(stderr, "# rank %d: graph capture: the driver has no capture calls\n", x->rank);
        group_fail[g]++;
        if (h != NULL) {
            dlclose(h);
        }
        return;
    }
    fill(SHOAL_FLOAT32, SHOAL_SUM, x->rank, x->h_in, count, 0);
    h2d(x, x->d_in, x->h_in, count * 4);
    CK(cuStreamSynchronize(x->s));
    bad |= begin(x->s, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS;
    t0 = shoal_time_ns();
    st = shoal_allreduce((void *)x->d_in, (void *)x->d_out, count, SHOAL_FLOAT32, SHOAL_SUM,
                         x->comm, x->s);
    bad |= end(x->s, &graph) != CUDA_SUCCESS;
    if (graph != NULL && destroy != NULL) {
        destroy(graph);
    }
    if (st != SHOAL_ERR_UNSUPPORTED || shoal_time_ns() - t0 > 2000000000ull) {
        fprintf(stderr, "# rank %d: graph capture: the call returned %s after %.2f s (want "
                "SHOAL_ERR_UNSUPPORTED at once)\n", x->rank, shoal_status_name(st),
                (shoal_time_ns() - t0) / 1e9);
        bad = 1;
    }
    /* the communicator is fine: the same AllReduce outside the capture */
    bad |= one_case(x, SHOAL_COLL_ALLREDUCE, SHOAL_FLOAT32, SHOAL_SUM, count, 0);
    dlclose(h);
    group_fail[g] += bad;
}

int main(int argc, char **argv)
{
    ctx_t ctx = {0}, *x = &ctx;
    int failed = 0;

    /* GPU_RANK0_IPC_SIZE: rank 0's SHOAL_CUDA_IPC_SIZE differs from the others' (a knob each
     * rank reads itself): the IPC AllReduce must still be right on every rank */
    if (getenv("GPU_RANK0_IPC_SIZE") != NULL && getenv("SHOAL_RANK") != NULL &&
        strcmp(getenv("SHOAL_RANK"), "0") == 0) {
        setenv("SHOAL_CUDA_IPC_SIZE", getenv("GPU_RANK0_IPC_SIZE"), 1);
    }
    shoal_config_global_init();
    if (shoal_cuda_drv_load() != SHOAL_OK) {
        if (getenv("GPU_REQUIRE_DRIVER") != NULL) { /* a driver that must load */
            printf("Bail out! the CUDA driver did not load: %s\n", shoal_cuda_drv_reason());
            return 1;
        }
        printf("1..0 # SKIP no CUDA driver/GPU (%s)\n", shoal_cuda_drv_reason());
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--probe") == 0) {
        printf("# CUDA usable: %s\n", shoal_cuda_drv_reason());
        return 0;
    }
    if (shoal_comm_init_env(&x->comm, NULL) != SHOAL_OK) {
        printf("Bail out! shoal_comm_init_env failed\n");
        return 1;
    }
    shoal_comm_rank(x->comm, &x->rank);
    shoal_comm_size(x->comm, &x->n);
    if (!setup(x)) {
        printf("Bail out! setup failed\n");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "--kill") == 0) {
        failed = kill_mode(x);
        teardown(x);
        return failed;
    }
    nccl_mode = argc > 1 && strcmp(argv[1], "--nccl") == 0;
    /* SHOAL_CUDA_SYNC=host waits on the host for the stream: the cases that hold a stream at
     * a gate this thread opens after the call (stream order, late peers, metering) would
     * time out there by design; the sweep and the group run as stream-ordered calls */
    const char *sync = getenv("SHOAL_CUDA_SYNC");
    int host_sync = sync != NULL && strcmp(sync, "host") == 0;
    if (!nccl_mode) {
        legacy_stream(x);
    }
    sweep(x);
    minmax_nan(x);
    if (!nccl_mode) {
        if (!host_sync) {
            stream_order(x);
            host_on_stream(x);
            late_peer(x);
        } else {
            host_in_place(x);
        }
        group_case(x);
        group_many_p2p(x);
        group_p2p_around_coll(x);
        group_host_device_p2p(x);
        group_lost_comm(x);
        other_device_output(x);
        mixed_host_device(x);
        avg_half_rounds_sum(x);
        many_sources(x);
        p2p_host_device(x);
        sync_choice(x);
        keeps_context(x);
        graph_capture(x);
    }
    if (!host_sync) {
        metering(x);
    }
    /* combine over ranks */
    if (shoal_allreduce(group_fail, group_fail, (size_t)ngroups, SHOAL_INT32, SHOAL_MAX, x->comm,
                        NULL) != SHOAL_OK) {
        printf("Bail out! combining the results failed\n");
        return 1;
    }
    for (int g = 0; g < ngroups; g++) {
        failed += group_fail[g] != 0;
        if (x->rank == 0) {
            tap_ok(group_fail[g] == 0, "%s (%d ranks)", group_names[g], x->n);
        }
    }
    teardown(x);
    if (x->rank == 0) {
        tap_done();
    }
    return failed != 0;
}
