/* x86-64 kernels for FLOAT16 (AVX2 + F16C: VCVTPH2PS / VCVTPS2PH) and BFLOAT16 (AVX2: shifts
 * and a round-to-nearest-even add), selected at run time by reduce_half.c when the CPU has the
 * features. They give exactly the bits of the portable kernels, NaN payloads included: the
 * scalar tails use the same conversions and the vector ops have the same semantics. */
#include "reduce/reduce_impl.h"

#if SHOAL_REDUCE_HAVE_X86

#include <cpuid.h>
#include <immintrin.h>

#define SHOAL_X86_TGT_fp16 __attribute__((target("avx2,f16c")))
#define SHOAL_X86_TGT_bf16 __attribute__((target("avx2")))

/* Same semantics as SHOAL_REDUCE_OP_*: MINPS(x, y) is x < y ? x : y; a NaN x is put back.
 * SUM/PROD: where x is NaN, y is replaced by 0, so x's NaN is the result (the compiler may
 * swap the operands of _mm256_add_ps, and a NaN y's payload would win where both are NaN). */
#define SHOAL_X86_NANX(x, y) _mm256_andnot_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), y)
#define SHOAL_X86_SUM(x, y) _mm256_add_ps(x, SHOAL_X86_NANX(x, y))
#define SHOAL_X86_PROD(x, y) _mm256_mul_ps(x, SHOAL_X86_NANX(x, y))
#define SHOAL_X86_MIN(x, y)                                                                    \
    _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
#define SHOAL_X86_MAX(x, y)                                                                    \
    _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))

/* ---- fp16: 8 lanes per VCVTPH2PS -------------------------------------------------------- */

static inline SHOAL_X86_TGT_fp16 __m256 shoal_x86_fp16_load8(const unsigned char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

static inline SHOAL_X86_TGT_fp16 void shoal_x86_fp16_store8(unsigned char *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

/* 16 elements as two vectors, in whatever lane order store16 undoes. */
static inline SHOAL_X86_TGT_fp16 void shoal_x86_fp16_load16(const unsigned char *p, __m256 *lo,
                                                            __m256 *hi)
{
    *lo = shoal_x86_fp16_load8(p);
    *hi = shoal_x86_fp16_load8(p + 16);
}

static inline SHOAL_X86_TGT_fp16 void shoal_x86_fp16_store16(unsigned char *p, __m256 lo,
                                                             __m256 hi)
{
    shoal_x86_fp16_store8(p, lo);
    shoal_x86_fp16_store8(p + 16, hi);
}

/* ---- bf16: widening is a 16-bit shift, rounding an integer add ---------------------------- */

/* fp32 lanes -> bf16 in the low 16 bits of each 32-bit lane (shoal_reduce_f32_to_bf16). */
static inline SHOAL_X86_TGT_bf16 __m256i shoal_x86_bf16_round(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
    return _mm256_srli_epi32(r, 16);
}

static inline SHOAL_X86_TGT_bf16 __m256 shoal_x86_bf16_load8(const unsigned char *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static inline SHOAL_X86_TGT_bf16 void shoal_x86_bf16_store8(unsigned char *p, __m256 v)
{
    __m256i r = shoal_x86_bf16_round(v);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(packed));
}

/* unpack puts each bf16 in the top half of a 32-bit lane (within 128-bit halves); packus
 * of the two rounded halves restores the original order. */
static inline SHOAL_X86_TGT_bf16 void shoal_x86_bf16_load16(const unsigned char *p, __m256 *lo,
                                                            __m256 *hi)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)p);
    __m256i z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}

static inline SHOAL_X86_TGT_bf16 void shoal_x86_bf16_store16(unsigned char *p, __m256 lo,
                                                             __m256 hi)
{
    __m256i r = _mm256_packus_epi32(shoal_x86_bf16_round(lo), shoal_x86_bf16_round(hi));
    _mm256_storeu_si256((__m256i *)(void *)p, r);
}

/* ---- kernels ---------------------------------------------------------------------------- */

/* Each vector step loads both inputs before storing, so k2 is safe for any aliasing of dst
 * with a and/or b; it also serves as acc, racc and any. */
#define SHOAL_X86_DEF_OP(T, OP, VOP, OPM, TOF, FROMF)                                          \
    static SHOAL_X86_TGT_##T void shoal_x86_k2_##T##_##OP(void *dst, const void *a,            \
                                                          const void *b, size_t n)             \
    {                                                                                          \
        unsigned char *d = dst;                                                                \
        const unsigned char *x = a, *y = b;                                                    \
        size_t i = 0;                                                                          \
        for (; i + 16 <= n; i += 16) {                                                         \
            __m256 x0, x1, y0, y1;                                                             \
            shoal_x86_##T##_load16(x + 2 * i, &x0, &x1);                                       \
            shoal_x86_##T##_load16(y + 2 * i, &y0, &y1);                                       \
            shoal_x86_##T##_store16(d + 2 * i, VOP(x0, y0), VOP(x1, y1));                      \
        }                                                                                      \
        const shoal_u16u_t *xs = a, *ys = b;                                                   \
        shoal_u16u_t *ds = dst;                                                                \
        for (; i < n; i++) {                                                                   \
            float xv = TOF(xs[i]), yv = TOF(ys[i]);                                            \
            ds[i] = FROMF(OPM(float, float, xv, yv));                                          \
        }                                                                                      \
    }                                                                                          \
    static void shoal_x86_acc_##T##_##OP(void *dst, const void *b, size_t n)                   \
    {                                                                                          \
        shoal_x86_k2_##T##_##OP(dst, dst, b, n);                                               \
    }                                                                                          \
    static void shoal_x86_racc_##T##_##OP(void *dst, const void *a, size_t n)                  \
    {                                                                                          \
        shoal_x86_k2_##T##_##OP(dst, a, dst, n);                                               \
    }                                                                                          \
    static SHOAL_X86_TGT_##T void shoal_x86_hacc_##T##_##OP(float *acc, const void *src,       \
                                                            size_t n)                          \
    {                                                                                          \
        const unsigned char *y = src;                                                          \
        size_t i = 0;                                                                          \
        for (; i + 8 <= n; i += 8) {                                                           \
            __m256 v = VOP(_mm256_loadu_ps(acc + i), shoal_x86_##T##_load8(y + 2 * i));        \
            _mm256_storeu_ps(acc + i, v);                                                      \
        }                                                                                      \
        const shoal_u16u_t *ys = src;                                                          \
        for (; i < n; i++) {                                                                   \
            float xv = acc[i], yv = TOF(ys[i]);                                                \
            acc[i] = OPM(float, float, xv, yv);                                                \
        }                                                                                      \
    }

#define SHOAL_X86_DEF_TYPE(T, TOF, FROMF)                                                      \
    SHOAL_X86_DEF_OP(T, sum, SHOAL_X86_SUM, SHOAL_REDUCE_OP_SUM, TOF, FROMF)                  \
    SHOAL_X86_DEF_OP(T, prod, SHOAL_X86_PROD, SHOAL_REDUCE_OP_PROD, TOF, FROMF)               \
    SHOAL_X86_DEF_OP(T, min, SHOAL_X86_MIN, SHOAL_REDUCE_OP_MIN, TOF, FROMF)                  \
    SHOAL_X86_DEF_OP(T, max, SHOAL_X86_MAX, SHOAL_REDUCE_OP_MAX, TOF, FROMF)                  \
    static SHOAL_X86_TGT_##T void shoal_x86_hload_##T(float *acc, const void *src, size_t n)   \
    {                                                                                          \
        const unsigned char *x = src;                                                          \
        const shoal_u16u_t *xs = src;                                                          \
        size_t i = 0;                                                                          \
        for (; i + 8 <= n; i += 8) {                                                           \
            _mm256_storeu_ps(acc + i, shoal_x86_##T##_load8(x + 2 * i));                       \
        }                                                                                      \
        for (; i < n; i++) {                                                                   \
            acc[i] = TOF(xs[i]);                                                               \
        }                                                                                      \
    }                                                                                          \
    static SHOAL_X86_TGT_##T void shoal_x86_hstore_##T(void *dst, const float *acc, size_t n)  \
    {                                                                                          \
        unsigned char *d = dst;                                                                \
        shoal_u16u_t *ds = dst;                                                                \
        size_t i = 0;                                                                          \
        for (; i + 8 <= n; i += 8) {                                                           \
            shoal_x86_##T##_store8(d + 2 * i, _mm256_loadu_ps(acc + i));                       \
        }                                                                                      \
        for (; i < n; i++) {                                                                   \
            ds[i] = FROMF(acc[i]);                                                             \
        }                                                                                      \
    }

SHOAL_X86_DEF_TYPE(fp16, shoal_reduce_fp16_to_f32, shoal_reduce_f32_to_fp16)
SHOAL_X86_DEF_TYPE(bf16, shoal_reduce_bf16_to_f32, shoal_reduce_f32_to_bf16)

#define SHOAL_X86_KERN(T, OP)                                                                  \
    {                                                                                          \
        .k2 = shoal_x86_k2_##T##_##OP, .acc = shoal_x86_acc_##T##_##OP,                        \
        .racc = shoal_x86_racc_##T##_##OP, .any = shoal_x86_k2_##T##_##OP,                     \
    }

#define SHOAL_X86_ROW(T)                                                                       \
    {                                                                                          \
        .two = {                                                                               \
            [SHOAL_SUM] = SHOAL_X86_KERN(T, sum),                                              \
            [SHOAL_PROD] = SHOAL_X86_KERN(T, prod),                                            \
            [SHOAL_MIN] = SHOAL_X86_KERN(T, min),                                              \
            [SHOAL_MAX] = SHOAL_X86_KERN(T, max),                                              \
        },                                                                                     \
        .load = shoal_x86_hload_##T,                                                           \
        .acc = {                                                                               \
            [SHOAL_SUM] = shoal_x86_hacc_##T##_sum,                                            \
            [SHOAL_PROD] = shoal_x86_hacc_##T##_prod,                                          \
            [SHOAL_MIN] = shoal_x86_hacc_##T##_min,                                            \
            [SHOAL_MAX] = shoal_x86_hacc_##T##_max,                                            \
        },                                                                                     \
        .store = shoal_x86_hstore_##T,                                                         \
    }

const shoal_reduce_half_kern_t shoal_reduce_fp16_f16c = SHOAL_X86_ROW(fp16);
const shoal_reduce_half_kern_t shoal_reduce_bf16_avx2 = SHOAL_X86_ROW(bf16);

int shoal_reduce_cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}

/* F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know "f16c"). */
int shoal_reduce_cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C) != 0;
}

#else

int shoal_reduce_cpu_has_avx2(void)
{
    return 0;
}

int shoal_reduce_cpu_has_f16c(void)
{
    return 0;
}

#endif
