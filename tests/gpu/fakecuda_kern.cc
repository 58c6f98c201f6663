/*
 * The reduce kernels of src/cuda/kernels.cu compiled for the host, for libfakecuda: the same
 * source, with the CUDA built-ins a host compiler lacks supplied here (the thread indices of
 * the emulated launch, __ldg as a plain load, the launch qualifiers as nothing). The kernels
 * read 16-byte vectors through pointers of the element type, which C++ aliasing rules do not
 * allow on the host: this file is built with -fno-strict-aliasing (tests/gpu/Makefile.inc).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/gpu/fakecuda.h"

/* What the stream-wait kernel takes from the device (globaltimer, __nanosleep, a load of
 * host-mapped memory), on the host. */
extern "C" unsigned long long fakecuda_kern_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

extern "C" void fakecuda_kern_pause(void)
{
    usleep(2);
}

extern "C" unsigned int fakecuda_kern_load(const unsigned int *word)
{
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

namespace {
struct fakecuda_dim {
    unsigned x, y, z;
};
thread_local fakecuda_dim threadIdx, blockIdx, blockDim, gridDim;
template <typename T> inline T fakecuda_ldg(const T *p)
{
    return *p;
}
} // namespace

#define __ldg fakecuda_ldg
#undef __launch_bounds__
#define __launch_bounds__(threads, blocks)
#undef __grid_constant__
#define __grid_constant__
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline

#include "cuda/kernels.cu"

namespace {
struct fakecuda_kern {
    const char *name;
    fakecuda_kern_fn fn;
    size_t esize;
};

#define FAKECUDA_K(t, T, o) {"shoal_reduce_" #t "_" #o, shoal_reduce_##t##_##o, sizeof(T)},
#define FAKECUDA_KS(t, T) FAKECUDA_K(t, T, sum) FAKECUDA_K(t, T, prod) FAKECUDA_K(t, T, min) \
    FAKECUDA_K(t, T, max)
const fakecuda_kern fakecuda_kerns[] = {
    FAKECUDA_KS(i8, int8_t) FAKECUDA_KS(u8, uint8_t) FAKECUDA_KS(i32, int32_t)
    FAKECUDA_KS(u32, uint32_t) FAKECUDA_KS(i64, int64_t) FAKECUDA_KS(u64, uint64_t)
    FAKECUDA_KS(f16, __half) FAKECUDA_KS(bf16, __nv_bfloat16) FAKECUDA_KS(f32, float)
    FAKECUDA_KS(f64, double)
};
} // namespace

extern "C" fakecuda_kern_fn fakecuda_kern_find(const char *name, size_t *esize_p)
{
    for (const fakecuda_kern &k : fakecuda_kerns) {
        if (strcmp(k.name, name) == 0) {
            *esize_p = k.esize;
            return k.fn;
        }
    }
    return nullptr;
}

extern "C" void fakecuda_kern_wait(const unsigned int *word, unsigned int seq,
                                   unsigned long long timeout_ns)
{
    gridDim = blockDim = {1, 1, 1};
    blockIdx = threadIdx = {0, 0, 0};
    shoal_stream_wait(word, seq, timeout_ns);
}

extern "C" void fakecuda_kern_run(fakecuda_kern_fn fn, unsigned grid, unsigned block, void *dst,
                                  shoal_cuda_srcs_t srcs, int nsrc, unsigned long long count,
                                  int avg_div, int vec)
{
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b, 0, 0};
        for (unsigned t = 0; t < block; t++) {
            threadIdx = {t, 0, 0};
            fn(dst, srcs, nsrc, count, avg_div, vec);
        }
    }
}
