/*
 * GPU measurements for perf/gpu_check.sh (not a test; needs a GPU).
 *   gpu_bench kernel [MiB]   one process: device-to-device copy bandwidth vs the library's
 *                            reduce kernels (f32 and bf16 sum, 2 sources), bytes read+written
 *                            per second, at MiB (default 256) per buffer.
 *   gpu_bench allreduce [MiB...]   under shoalrun: AllReduce of f32 device buffers on a stream,
 *                            busbw = bytes / time * 2 (n - 1) / n, rank 0 prints one line per
 *                            size.
 * Output lines start with "result" and are key=value pairs, easy to grep.
 */
#include "cuda/cuda_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                         \
    do {                                                                                 \
        if (shoal_cuda_drv_result(shoal_cuda_drv.call, #call, __FILE__, __LINE__)) {    \
            exit(2);                                                                     \
        }                                                                                \
    } while (0)

static CUstream bench_ctx(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

static float bench_elapsed(CUevent a, CUevent b)
{
    float ms = 0;
    CK(cuEventSynchronize(b));
    CK(cuEventElapsedTime(&ms, a, b));
    return ms;
}

static int bench_kernel(size_t mib)
{
    CUstream s = bench_ctx();
    size_t bytes = mib << 20;
    CUdeviceptr a, b, c;
    CUevent e0, e1;
    CUmodule mod;
    CUdevice dev;
    int nsm, iters = 20;
    static const char *const names[] = {"shoal_reduce_f32_sum", "shoal_reduce_bf16_sum"};
    static const size_t esz[] = {4, 2};

    CK(cuCtxGetDevice(&dev));
    CK(cuDeviceGetAttribute(&nsm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CK(cuMemAlloc(&a, bytes));
    CK(cuMemAlloc(&b, bytes));
    CK(cuMemAlloc(&c, bytes));
    CK(cuMemsetD8Async(a, 1, bytes, s));
    CK(cuMemsetD8Async(b, 2, bytes, s));
    CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    CK(cuModuleLoadData(&mod, shoal_cuda_fatbin));
    CK(cuMemcpyDtoDAsync(c, a, bytes, s)); /* warm-up */
    CK(cuEventRecord(e0, s));
    for (int i = 0; i < iters; i++) {
        CK(cuMemcpyDtoDAsync(c, a, bytes, s));
    }
    CK(cuEventRecord(e1, s));
    double copy = 2.0 * bytes * iters / (bench_elapsed(e0, e1) * 1e-3) / 1e9;
    printf("result what=copy bytes=%zu GBps=%.1f\n", bytes, copy);
    for (int k = 0; k < 2; k++) {
        CUfunction fn;
        shoal_cuda_srcs_t srcs = {{(void *)a, (void *)b}};
        int nsrc = 2, div = 0, vec = 1;
        unsigned long long cnt = bytes / esz[k];
        size_t work = cnt / (16 / esz[k]);
        unsigned blocks = (unsigned)SHOAL_MIN((work + SHOAL_CUDA_THREADS - 1) / SHOAL_CUDA_THREADS,
                                              (size_t)nsm * SHOAL_CUDA_BLOCKS_PER_SM);
        void *params[] = {&c, &srcs, &nsrc, &cnt, &div, &vec};
        CK(cuModuleGetFunction(&fn, mod, names[k]));
        CK(cuLaunchKernel(fn, blocks, 1, 1, SHOAL_CUDA_THREADS, 1, 1, 0, s, params, NULL));
        CK(cuEventRecord(e0, s));
        for (int i = 0; i < iters; i++) {
            CK(cuLaunchKernel(fn, blocks, 1, 1, SHOAL_CUDA_THREADS, 1, 1, 0, s, params, NULL));
        }
        CK(cuEventRecord(e1, s));
        double red = 3.0 * bytes * iters / (bench_elapsed(e0, e1) * 1e-3) / 1e9;
        printf("result what=%s bytes=%zu GBps=%.1f vs_copy=%.3f blocks=%u sms=%d\n", names[k],
               bytes, red, red / copy, blocks, nsm);
    }
    return 0;
}

static int bench_allreduce(int argc, char **argv)
{
    shoal_comm_t comm;
    CUstream s;
    CUdeviceptr buf;
    int rank, n, iters;
    size_t max = 0;
    shoal_status_t st = SHOAL_OK;

    if (shoal_comm_init_env(&comm, NULL) != SHOAL_OK) {
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &n);
    s = bench_ctx();
    /* GPU_BENCH_BLOCKING=1: calls without a stream (each returns with its result in place);
     * otherwise stream-ordered on s. */
    const char *blocking = getenv("GPU_BENCH_BLOCKING");
    CUstream cs = blocking != NULL && atoi(blocking) ? NULL : s;
    for (int i = 0; i < argc; i++) {
        max = SHOAL_MAX(max, (size_t)atoi(argv[i]) << 20);
    }
    CK(cuMemAlloc(&buf, SHOAL_MAX(max, (size_t)4096)));
    CK(cuMemsetD8Async(buf, 0, max, s));
    for (int i = 0; i < argc; i++) {
        size_t bytes = (size_t)atoi(argv[i]) << 20, count = bytes / 4;
        iters = bytes >= (64u << 20) ? 5 : 20;
        /* warm-up (IPC / NCCL setup happens on the first call) */
        st = shoal_allreduce((void *)buf, (void *)buf, count, SHOAL_FLOAT32, SHOAL_SUM, comm, cs);
        CK(cuStreamSynchronize(s));
        if (st == SHOAL_OK) {
            st = shoal_barrier(comm, NULL);
        }
        uint64_t t0 = shoal_time_ns();
        for (int k = 0; k < iters && st == SHOAL_OK; k++) {
            st = shoal_allreduce((void *)buf, (void *)buf, count, SHOAL_FLOAT32, SHOAL_SUM, comm,
                                 cs);
        }
        CK(cuStreamSynchronize(s));
        if (st == SHOAL_OK) {
            /* a stream-ordered call's failure shows in the communicator, not in its return */
            st = shoal_barrier(comm, NULL);
        }
        if (st != SHOAL_OK) {
            printf("result what=error status=%s msg=\"%s\"\n", shoal_status_name(st),
                   shoal_comm_last_error(comm));
            shoal_comm_destroy(comm);
            return 1;
        }
        double sec = (shoal_time_ns() - t0) / 1e9 / iters;
        double algbw = bytes / sec / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
        if (rank == 0) {
            printf("result what=allreduce_dev nranks=%d stream=%d bytes=%zu time_us=%.1f "
                   "algbw=%.2f busbw=%.2f\n", n, cs != NULL, bytes, sec * 1e6, algbw, busbw);
            fflush(stdout);
        }
    }
    shoal_comm_destroy(comm);
    return 0;
}

int main(int argc, char **argv)
{
    shoal_config_global_init();
    if (shoal_cuda_drv_load() != SHOAL_OK) {
        printf("result what=skip reason=\"%s\"\n", shoal_cuda_drv_reason());
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "kernel") == 0) {
        return bench_kernel(argc > 2 ? (size_t)atoi(argv[2]) : 256);
    }
    if (argc > 1 && strcmp(argv[1], "allreduce") == 0) {
        return bench_allreduce(argc - 2, argv + 2);
    }
    fprintf(stderr, "usage: gpu_bench kernel [MiB] | allreduce MiB...\n");
    return 1;
}
