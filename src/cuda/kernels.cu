/*
 * GPU reduce kernels of the CUDA layer: dst[i] = srcs[0][i] op ... op srcs[nsrc-1][i] for
 * every dtype x op, the semantics of src/reduce (integer SUM/PROD wrap; float MIN/MAX
 * propagate NaN; fp16/bf16 accumulate in fp32 and round once), AVG = SUM then a division by
 * avg_div (integers truncate). 16-byte vector loads and stores when every pointer is 16-byte
 * aligned (vec != 0), a scalar tail, grid-stride loops (the host sizes the grid from the SM
 * count). Compiled by nvcc into a fatbin that libshoal embeds and loads with
 * cuModuleLoadData (src/cuda/Makefile.inc); launched through cuLaunchKernel by name
 * "shoal_reduce_<dtype>_<op>" (cuda_kern.c). No runtime API, no host code. Also the
 * stream-side wait of SHOAL_CUDA_SYNC=hostfn (shoal_stream_wait, at the end).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/kern_abi.h"

template <typename T> struct shoal_acc {
    typedef T type;
    static __device__ __forceinline__ T in(T x) { return x; }
    static __device__ __forceinline__ T out(T x) { return x; }
};
template <> struct shoal_acc<__half> {
    typedef float type;
    static __device__ __forceinline__ float in(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half out(float x) { return __float2half_rn(x); }
};
template <> struct shoal_acc<__nv_bfloat16> {
    typedef float type;
    static __device__ __forceinline__ float in(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 out(float x) { return __float2bfloat16_rn(x); }
};

struct shoal_op_sum {
    template <typename A> static __device__ __forceinline__ A f(A x, A y) { return x + y; }
};
struct shoal_op_prod {
    template <typename A> static __device__ __forceinline__ A f(A x, A y) { return x * y; }
};
struct shoal_op_min {
    template <typename A> static __device__ __forceinline__ A f(A x, A y)
    {
        return ((x != x) | (x < y)) ? x : y;
    }
};
struct shoal_op_max {
    template <typename A> static __device__ __forceinline__ A f(A x, A y)
    {
        return ((x != x) | (x > y)) ? x : y;
    }
};

/* Integer sum/product wrap: compute them on the unsigned type of the same width. */
template <typename T> struct shoal_wrap { typedef T type; };
template <> struct shoal_wrap<int8_t> { typedef uint8_t type; };
template <> struct shoal_wrap<int32_t> { typedef uint32_t type; };
template <> struct shoal_wrap<int64_t> { typedef uint64_t type; };

template <typename Op, typename A> struct shoal_apply {
    static __device__ __forceinline__ A f(A x, A y) { return Op::f(x, y); }
};
template <typename A> struct shoal_apply<shoal_op_sum, A> {
    static __device__ __forceinline__ A f(A x, A y)
    {
        typedef typename shoal_wrap<A>::type W;
        return (A)shoal_op_sum::f((W)x, (W)y);
    }
};
template <typename A> struct shoal_apply<shoal_op_prod, A> {
    static __device__ __forceinline__ A f(A x, A y)
    {
        typedef typename shoal_wrap<A>::type W;
        return (A)shoal_op_prod::f((W)x, (W)y);
    }
};

/* AVG's result from the accumulated sum: the sum is rounded to T first (fp16/bf16: to inf past
 * the largest finite value, as shoal.h documents), then divided and rounded again: the bits of
 * src/reduce (shoal_reduce_n, then shoal_reduce_avg_div), which the staging path gives. Dividing
 * the fp32 sum made two ranks of 40000 in fp16 average to 40000 instead of inf. */
template <typename T> static __device__ __forceinline__ T
shoal_avg_out(typename shoal_acc<T>::type x, int div)
{
    typedef shoal_acc<T> C;
    typedef typename C::type A;
    return C::out(C::in(C::out(x)) / (A)div);
}

/* U vectors of 16 bytes at v, v + stride, ...: every source's U loads are issued before
 * the arithmetic that needs them, so that a thread keeps U loads in flight (bf16 and fp16,
 * whose conversions cost more, reached 86% of the copy bandwidth with one on an H200). */
template <typename T, typename Op, int U>
static __device__ __forceinline__ void shoal_reduce_vecs(T *__restrict__ dst,
                                                         const shoal_cuda_srcs_t &srcs, int nsrc,
                                                         uint64_t v, uint64_t stride, int avg_div)
{
    typedef shoal_acc<T> C;
    typedef typename C::type A;
    const int V = 16 / sizeof(T);
    A acc[U][V];
    uint4 w[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        w[u] = __ldg(reinterpret_cast<const uint4 *>(srcs.p[0]) + v + u * stride);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const T *t = reinterpret_cast<const T *>(&w[u]);
#pragma unroll
        for (int k = 0; k < V; k++) {
            acc[u][k] = C::in(t[k]);
        }
    }
    for (int s = 1; s < nsrc; s++) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            w[u] = __ldg(reinterpret_cast<const uint4 *>(srcs.p[s]) + v + u * stride);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const T *t = reinterpret_cast<const T *>(&w[u]);
#pragma unroll
            for (int k = 0; k < V; k++) {
                acc[u][k] = shoal_apply<Op, A>::f(acc[u][k], C::in(t[k]));
            }
        }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        uint4 o;
        T *ot = reinterpret_cast<T *>(&o);
#pragma unroll
        for (int k = 0; k < V; k++) {
            ot[k] = avg_div > 1 ? shoal_avg_out<T>(acc[u][k], avg_div) : C::out(acc[u][k]);
        }
        reinterpret_cast<uint4 *>(dst)[v + u * stride] = o;
    }
}

template <typename T, typename Op>
static __device__ __forceinline__ void shoal_reduce_body(T *__restrict__ dst,
                                                         const shoal_cuda_srcs_t &srcs, int nsrc,
                                                         uint64_t count, int avg_div, int vec)
{
    typedef shoal_acc<T> C;
    typedef typename C::type A;
    const int V = 16 / sizeof(T);
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t nvec = vec ? count / V : 0;
    uint64_t v = tid;
    for (; v + stride < nvec; v += 2 * stride) {
        shoal_reduce_vecs<T, Op, 2>(dst, srcs, nsrc, v, stride, avg_div);
    }
    if (v < nvec) {
        shoal_reduce_vecs<T, Op, 1>(dst, srcs, nsrc, v, stride, avg_div);
    }
    for (uint64_t i = nvec * V + tid; i < count; i += stride) {
        A acc = C::in(reinterpret_cast<const T *>(srcs.p[0])[i]);
        for (int s = 1; s < nsrc; s++) {
            acc = shoal_apply<Op, A>::f(acc, C::in(reinterpret_cast<const T *>(srcs.p[s])[i]));
        }
        dst[i] = avg_div > 1 ? shoal_avg_out<T>(acc, avg_div) : C::out(acc);
    }
}

#define SHOAL_KERNEL(tname, T, oname, Op)                                                  \
    extern "C" __global__ void __launch_bounds__(SHOAL_CUDA_THREADS, SHOAL_CUDA_BLOCKS_PER_SM) \
        shoal_reduce_##tname##_##oname(void *dst, const __grid_constant__ shoal_cuda_srcs_t  \
                                       srcs, int nsrc, unsigned long long count,           \
                                       int avg_div, int vec)                               \
    {                                                                                      \
        shoal_reduce_body<T, Op>(static_cast<T *>(dst), srcs, nsrc, count, avg_div, vec);  \
    }

#define SHOAL_KERNELS_OF(tname, T)                                                         \
    SHOAL_KERNEL(tname, T, sum, shoal_op_sum)                                              \
    SHOAL_KERNEL(tname, T, prod, shoal_op_prod)                                            \
    SHOAL_KERNEL(tname, T, min, shoal_op_min)                                              \
    SHOAL_KERNEL(tname, T, max, shoal_op_max)

SHOAL_KERNELS_OF(i8, int8_t)
SHOAL_KERNELS_OF(u8, uint8_t)
SHOAL_KERNELS_OF(i32, int32_t)
SHOAL_KERNELS_OF(u32, uint32_t)
SHOAL_KERNELS_OF(i64, int64_t)
SHOAL_KERNELS_OF(u64, uint64_t)
SHOAL_KERNELS_OF(f16, __half)
SHOAL_KERNELS_OF(bf16, __nv_bfloat16)
SHOAL_KERNELS_OF(f32, float)
SHOAL_KERNELS_OF(f64, double)

/* ---- the stream-side wait (SHOAL_CUDA_SYNC=hostfn) ---------------------------------------- */

/* tests/gpu/fakecuda_kern.cc compiles this file for the host (no __CUDA_ARCH__): the clock,
 * the pause and the load come from the emulation there. */
#ifndef __CUDA_ARCH__
extern "C" unsigned long long fakecuda_kern_now_ns(void);
extern "C" void fakecuda_kern_pause(void);
extern "C" unsigned int fakecuda_kern_load(const unsigned int *word);
#endif

static __device__ __forceinline__ unsigned long long shoal_kern_now_ns()
{
#ifdef __CUDA_ARCH__
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return fakecuda_kern_now_ns();
#endif
}

static __device__ __forceinline__ unsigned int shoal_kern_load(const unsigned int *word)
{
#ifdef __CUDA_ARCH__
    return *(const volatile unsigned int *)word; /* host-mapped: every read goes to the host */
#else
    return fakecuda_kern_load(word);
#endif
}

static __device__ __forceinline__ void shoal_kern_pause()
{
#ifdef __CUDA_ARCH__
#if __CUDA_ARCH__ >= 700
    __nanosleep(1000);
#endif
#else
    fakecuda_kern_pause();
#endif
}

/* Holds its stream (one thread of one block, sleeping between polls) until the proxy stored
 * seq into the done word, or the communicator's timeout passed: the stream is then released
 * with undefined results, as with the stream memory operations. The host function launched
 * before it only stores the start flag: no host function ever waits (a blocked host function
 * holds the driver's callback thread, and every stream's host functions behind it). */
extern "C" __global__ void __launch_bounds__(1, 1)
    shoal_stream_wait(const unsigned int *word, unsigned int seq, unsigned long long timeout_ns)
{
    const unsigned long long t0 = shoal_kern_now_ns();
    while ((int)(shoal_kern_load(word) - seq) < 0) {
        if (timeout_ns != ~0ull && shoal_kern_now_ns() - t0 > timeout_ns) {
            break;
        }
        shoal_kern_pause();
    }
}
