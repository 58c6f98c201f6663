/* Internals of the reduce module: kernel tables, element types that tolerate any alignment,
 * the per-op expressions and the portable fp16/bf16 conversions. Included by the reduce
 * sources and by tests/unit/test_reduce.c (which checks the portable and x86 SIMD paths
 * against each other). */
#ifndef SHOAL_REDUCE_IMPL_H
#define SHOAL_REDUCE_IMPL_H

#include "reduce/reduce.h"

#include <string.h>

/* Element types for buffer access: alignment 1 (callers may pass any byte offset; UBSan checks
 * alignment) and may_alias (buffers are untyped memory). GCC vectorises loops over them with
 * unaligned vector loads. */
typedef int8_t shoal_i8u_t;
typedef uint8_t shoal_u8u_t;
typedef int32_t __attribute__((aligned(1), may_alias)) shoal_i32u_t;
typedef uint32_t __attribute__((aligned(1), may_alias)) shoal_u32u_t;
typedef int64_t __attribute__((aligned(1), may_alias)) shoal_i64u_t;
typedef uint64_t __attribute__((aligned(1), may_alias)) shoal_u64u_t;
typedef uint16_t __attribute__((aligned(1), may_alias)) shoal_u16u_t;
typedef float __attribute__((aligned(1), may_alias)) shoal_f32u_t;
typedef double __attribute__((aligned(1), may_alias)) shoal_f64u_t;

/* x86-64: one AVX2 clone of every generic kernel besides the baseline one, picked by the
 * loader (ifunc), so a generic build still runs 256-bit vectors where the CPU has them.
 * -DSHOAL_REDUCE_NO_SIMD builds what other architectures get (portable C only), and so does a
 * ThreadSanitizer build: the ifunc resolvers run during relocation, before the sanitizer's
 * runtime is up, and their instrumented entry crashes the process (GCC 12). */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute) && \
    !defined(SHOAL_REDUCE_NO_SIMD) && !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define SHOAL_REDUCE_CLONES __attribute__((target_clones("avx2", "default")))
#define SHOAL_REDUCE_HAVE_X86 1
#endif
#endif
#ifndef SHOAL_REDUCE_CLONES
#define SHOAL_REDUCE_CLONES
#define SHOAL_REDUCE_HAVE_X86 0
#endif

/* The ops on values (VT: value type, UT: type the arithmetic runs in). Integer SUM/PROD run in
 * the unsigned type, so they wrap without undefined behaviour. Float SUM/PROD of two NaNs give
 * x's NaN, quieted (y is replaced by 0 where x is NaN): the hardware returns its first source
 * operand's NaN, and the compiler takes x + y and y + x for the same expression (it swapped
 * them in some kernels and scalar tails but not in others), so the payload would depend on
 * the aliasing variant and the count, and in-place and out-of-place collectives would differ.
 * For integers x != x is 0 and folds away. Float MIN/MAX propagate NaN: when x is NaN the
 * result is x, else when y is NaN the result is y; when x and y compare equal (+0 and -0)
 * the result is y. '|' instead of '||' keeps the expressions branch-free,
 * so they vectorise as compare + blend (x86 MINPS/MAXPS return the second operand too). */
#define SHOAL_REDUCE_OP_SUM(VT, UT, x, y)                                                      \
    ((VT)((UT)(x) + (UT)((x) != (x) ? 0 : (y))))
#define SHOAL_REDUCE_OP_PROD(VT, UT, x, y)                                                     \
    ((VT)((UT)(x) * (UT)((x) != (x) ? 0 : (y))))
#define SHOAL_REDUCE_OP_MIN(VT, UT, x, y) ((((x) != (x)) | ((x) < (y))) ? (x) : (y))
#define SHOAL_REDUCE_OP_MAX(VT, UT, x, y) ((((x) != (x)) | ((x) > (y))) ? (x) : (y))

/* Kernels. n is an element count; dst, a and b point at elements of the kernel's dtype. */
typedef void (*shoal_reduce_k2_fn_t)(void *dst, const void *a, const void *b, size_t n);
typedef void (*shoal_reduce_kacc_fn_t)(void *dst, const void *b, size_t n);

typedef struct {
    shoal_reduce_k2_fn_t k2;     /* dst = a op b; dst overlaps neither (a == b is fine) */
    shoal_reduce_kacc_fn_t acc;  /* acc(dst, b): dst = dst op b; b does not overlap dst */
    shoal_reduce_kacc_fn_t racc; /* racc(dst, a): dst = a op dst; a does not overlap dst */
    shoal_reduce_k2_fn_t any;    /* dst = a op b; dst may equal a, b or both (plain loop) */
} shoal_reduce_kern_t;

/* fp16/bf16 reduce_n: the sources are widened into a float block, reduced there, rounded once. */
typedef void (*shoal_reduce_hload_fn_t)(float *acc, const void *src, size_t n);
typedef void (*shoal_reduce_hacc_fn_t)(float *acc, const void *src, size_t n);
typedef void (*shoal_reduce_hstore_fn_t)(void *dst, const float *acc, size_t n);

typedef struct {
    shoal_reduce_kern_t two[SHOAL_AVG]; /* by op; AVG uses SUM */
    shoal_reduce_hload_fn_t load;
    shoal_reduce_hacc_fn_t acc[SHOAL_AVG];
    shoal_reduce_hstore_fn_t store;
} shoal_reduce_half_kern_t;

/* reduce_kern.c: the native dtypes (all but FLOAT16 and BFLOAT16, whose rows are empty). */
extern SHOAL_HIDDEN const shoal_reduce_kern_t shoal_reduce_kern_table[SHOAL_DTYPE_COUNT][SHOAL_AVG];
/* reduce_half.c: portable kernels. reduce_x86.c: AVX2+F16C (fp16) and AVX2 (bf16) kernels. */
extern SHOAL_HIDDEN const shoal_reduce_half_kern_t shoal_reduce_fp16_portable;
extern SHOAL_HIDDEN const shoal_reduce_half_kern_t shoal_reduce_bf16_portable;
#if SHOAL_REDUCE_HAVE_X86
extern SHOAL_HIDDEN const shoal_reduce_half_kern_t shoal_reduce_fp16_f16c;
extern SHOAL_HIDDEN const shoal_reduce_half_kern_t shoal_reduce_bf16_avx2;
#endif
/* 1 if this CPU runs the AVX2 kernels; the fp16 ones also need F16C. */
SHOAL_HIDDEN int shoal_reduce_cpu_has_avx2(void);
SHOAL_HIDDEN int shoal_reduce_cpu_has_f16c(void);
/* The FLOAT16 or BFLOAT16 kernel set in use (the best the CPU runs, chosen on first use). */
SHOAL_HIDDEN const shoal_reduce_half_kern_t *shoal_reduce_half_kern(shoal_dtype_t dtype);
/* Tests and benchmarks: 0 forces the portable kernels, 1 selects the x86 ones where the CPU
 * has them. Returns 1 if the x86 bf16 kernels are now in use (fp16 ones too if F16C). */
SHOAL_HIDDEN int shoal_reduce_half_use_simd(int enable);

/* ---- portable conversions (bit manipulation, branch-free) ------------------------------- */

static inline uint32_t shoal_reduce_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float shoal_reduce_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* bf16 is the top half of a float: widening is exact for every pattern, NaN included. */
static inline float shoal_reduce_bf16_to_f32(uint16_t b)
{
    return shoal_reduce_f32_from_bits((uint32_t)b << 16);
}

/* Round to nearest even on the 16 low bits; finite values past the largest bf16 become inf.
 * NaN stays NaN (quiet bit set, top payload bits kept). */
static inline uint16_t shoal_reduce_f32_to_bf16(float f)
{
    uint32_t u = shoal_reduce_f32_bits(f);
    uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    uint32_t quiet = u | 0x00400000u;
    int32_t mag = (int32_t)(u & 0x7fffffffu); /* signed compare: one instruction in AVX2 */
    return (uint16_t)((mag > 0x7f800000 ? quiet : rounded) >> 16);
}

/* fp16 -> fp32, exact. Normal numbers: move exponent and mantissa into place and rescale by
 * 2^-112 (inf stays inf, NaN stays NaN and is quieted with its payload, like VCVTPH2PS).
 * Subnormals: the mantissa placed under the exponent of 0.5, minus 0.5, gives m * 2^-24. */
static inline float shoal_reduce_fp16_to_f32(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w;
    float normal = shoal_reduce_f32_from_bits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
    float subnormal = shoal_reduce_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    uint32_t bits = two_w < (1u << 27) ? shoal_reduce_f32_bits(subnormal)
                                       : shoal_reduce_f32_bits(normal);
    return shoal_reduce_f32_from_bits(sign | bits);
}

/* fp32 -> fp16, round to nearest even (under the default rounding mode), overflow to inf,
 * gradual underflow to subnormals and zero. The float add does the rounding: |f| (scaled by
 * 4, or to inf past the fp16 range) is added to a power of two chosen from f's exponent so
 * that the sum keeps exactly fp16's mantissa bits; its low bits then hold the fp16 pattern.
 * NaN: sign | 0x7e00 | top 9 payload bits, bit-identical to VCVTPS2PH. */
static inline uint16_t shoal_reduce_f32_to_fp16(float f)
{
    uint32_t w = shoal_reduce_f32_bits(f);
    uint32_t shl1_w = w + w;
    uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xff000000u;
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = shoal_reduce_f32_from_bits((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = shoal_reduce_f32_bits(base);
    uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    uint32_t nan = 0x7e00u | ((w >> 13) & 0x3ffu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xff000000u ? nan : nonsign));
}

#endif
