/* fp16 and bf16 kernels: every value is widened to fp32, reduced in fp32 and rounded to nearest
 * even once. Portable kernels use the bit-manipulation conversions of reduce_impl.h; on x86-64
 * the FLOAT16 kernels also exist in an AVX2+F16C version (VCVTPH2PS / VCVTPS2PH), chosen at
 * run time. Both give the same bits (tests/unit/test_reduce.c checks it). */
#include "reduce/reduce_impl.h"

#if SHOAL_REDUCE_HAVE_F16C
#include <immintrin.h>
#endif

/* ---- portable kernels ------------------------------------------------------------------- */

#define SHOAL_REDUCE_DEF_HKERN(NAME, TOF, FROMF, OPM)                                         \
    static SHOAL_REDUCE_CLONES void shoal_reduce_k2_##NAME(void *dst, const void *a,           \
                                                           const void *b, size_t n)            \
    {                                                                                          \
        shoal_u16u_t *restrict d = dst;                                                        \
        const shoal_u16u_t *restrict x = a;                                                    \
        const shoal_u16u_t *restrict y = b;                                                    \
        for (size_t i = 0; i < n; i++) {                                                       \
            float xv = TOF(x[i]), yv = TOF(y[i]);                                              \
            d[i] = FROMF(OPM(float, float, xv, yv));                                           \
        }                                                                                      \
    }                                                                                          \
    static SHOAL_REDUCE_CLONES void shoal_reduce_acc_##NAME(void *dst, const void *b, size_t n) \
    {                                                                                          \
        shoal_u16u_t *restrict d = dst;                                                        \
        const shoal_u16u_t *restrict y = b;                                                    \
        for (size_t i = 0; i < n; i++) {                                                       \
            float xv = TOF(d[i]), yv = TOF(y[i]);                                              \
            d[i] = FROMF(OPM(float, float, xv, yv));                                           \
        }                                                                                      \
    }                                                                                          \
    static SHOAL_REDUCE_CLONES void shoal_reduce_racc_##NAME(void *dst, const void *a, size_t n) \
    {                                                                                          \
        shoal_u16u_t *restrict d = dst;                                                        \
        const shoal_u16u_t *restrict x = a;                                                    \
        for (size_t i = 0; i < n; i++) {                                                       \
            float xv = TOF(x[i]), yv = TOF(d[i]);                                              \
            d[i] = FROMF(OPM(float, float, xv, yv));                                           \
        }                                                                                      \
    }                                                                                          \
    static void shoal_reduce_any_##NAME(void *dst, const void *a, const void *b, size_t n)    \
    {                                                                                          \
        shoal_u16u_t *d = dst;                                                                 \
        const shoal_u16u_t *x = a;                                                             \
        const shoal_u16u_t *y = b;                                                             \
        for (size_t i = 0; i < n; i++) {                                                       \
            float xv = TOF(x[i]), yv = TOF(y[i]);                                              \
            d[i] = FROMF(OPM(float, float, xv, yv));                                           \
        }                                                                                      \
    }                                                                                          \
    static SHOAL_REDUCE_CLONES void shoal_reduce_hacc_##NAME(float *acc, const void *src,      \
                                                             size_t n)                         \
    {                                                                                          \
        float *restrict d = acc;                                                               \
        const shoal_u16u_t *restrict y = src;                                                  \
        for (size_t i = 0; i < n; i++) {                                                       \
            float xv = d[i], yv = TOF(y[i]);                                                   \
            d[i] = OPM(float, float, xv, yv);                                                  \
        }                                                                                      \
    }

#define SHOAL_REDUCE_DEF_HTYPE(T, TOF, FROMF)                                                  \
    SHOAL_REDUCE_DEF_HKERN(T##_sum, TOF, FROMF, SHOAL_REDUCE_OP_SUM)                          \
    SHOAL_REDUCE_DEF_HKERN(T##_prod, TOF, FROMF, SHOAL_REDUCE_OP_PROD)                        \
    SHOAL_REDUCE_DEF_HKERN(T##_min, TOF, FROMF, SHOAL_REDUCE_OP_MIN)                          \
    SHOAL_REDUCE_DEF_HKERN(T##_max, TOF, FROMF, SHOAL_REDUCE_OP_MAX)                          \
    static SHOAL_REDUCE_CLONES void shoal_reduce_hload_##T(float *acc, const void *src,        \
                                                           size_t n)                           \
    {                                                                                          \
        float *restrict d = acc;                                                               \
        const shoal_u16u_t *restrict x = src;                                                  \
        for (size_t i = 0; i < n; i++) {                                                       \
            d[i] = TOF(x[i]);                                                                  \
        }                                                                                      \
    }                                                                                          \
    static SHOAL_REDUCE_CLONES void shoal_reduce_hstore_##T(void *dst, const float *acc,       \
                                                            size_t n)                          \
    {                                                                                          \
        shoal_u16u_t *restrict d = dst;                                                        \
        const float *restrict x = acc;                                                         \
        for (size_t i = 0; i < n; i++) {                                                       \
            d[i] = FROMF(x[i]);                                                                \
        }                                                                                      \
    }

SHOAL_REDUCE_DEF_HTYPE(fp16, shoal_reduce_fp16_to_f32, shoal_reduce_f32_to_fp16)
SHOAL_REDUCE_DEF_HTYPE(bf16, shoal_reduce_bf16_to_f32, shoal_reduce_f32_to_bf16)

#define SHOAL_REDUCE_HKERN(NAME)                                                               \
    {                                                                                          \
        .k2 = shoal_reduce_k2_##NAME, .acc = shoal_reduce_acc_##NAME,                          \
        .racc = shoal_reduce_racc_##NAME, .any = shoal_reduce_any_##NAME,                      \
    }

#define SHOAL_REDUCE_HROW(T)                                                                   \
    {                                                                                          \
        .two = {                                                                               \
            [SHOAL_SUM] = SHOAL_REDUCE_HKERN(T##_sum),                                         \
            [SHOAL_PROD] = SHOAL_REDUCE_HKERN(T##_prod),                                       \
            [SHOAL_MIN] = SHOAL_REDUCE_HKERN(T##_min),                                         \
            [SHOAL_MAX] = SHOAL_REDUCE_HKERN(T##_max),                                         \
        },                                                                                     \
        .load = shoal_reduce_hload_##T,                                                        \
        .acc = {                                                                               \
            [SHOAL_SUM] = shoal_reduce_hacc_##T##_sum,                                         \
            [SHOAL_PROD] = shoal_reduce_hacc_##T##_prod,                                       \
            [SHOAL_MIN] = shoal_reduce_hacc_##T##_min,                                         \
            [SHOAL_MAX] = shoal_reduce_hacc_##T##_max,                                         \
        },                                                                                     \
        .store = shoal_reduce_hstore_##T,                                                      \
    }

const shoal_reduce_half_kern_t shoal_reduce_fp16_portable = SHOAL_REDUCE_HROW(fp16);
const shoal_reduce_half_kern_t shoal_reduce_bf16_portable = SHOAL_REDUCE_HROW(bf16);

/* ---- x86-64 AVX2 + F16C kernels for FLOAT16 --------------------------------------------- */

#if SHOAL_REDUCE_HAVE_F16C

#define SHOAL_F16C __attribute__((target("avx2,f16c")))
#define SHOAL_F16C_LOAD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define SHOAL_F16C_STORE(p, v)                                                                 \
    _mm_storeu_si128((__m128i *)(void *)(p), _mm256_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT))

/* Same semantics as SHOAL_REDUCE_OP_*: MINPS(x, y) is x < y ? x : y; NaN x is put back. */
#define SHOAL_F16C_SUM(x, y) _mm256_add_ps(x, y)
#define SHOAL_F16C_PROD(x, y) _mm256_mul_ps(x, y)
#define SHOAL_F16C_MIN(x, y)                                                                   \
    _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
#define SHOAL_F16C_MAX(x, y)                                                                   \
    _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))

/* Each vector step loads both inputs before storing, so these are safe for any aliasing of
 * dst with a and/or b; one function serves k2, acc, racc and any. */
#define SHOAL_F16C_DEF_OP(OP, VOP, OPM)                                                        \
    static SHOAL_F16C void shoal_reduce_f16c_k2_##OP(void *dst, const void *a, const void *b,  \
                                                     size_t n)                                 \
    {                                                                                          \
        uint16_t *d = dst;                                                                     \
        const uint16_t *x = a, *y = b;                                                         \
        size_t i = 0;                                                                          \
        for (; i + 16 <= n; i += 16) {                                                         \
            __m256 x0 = SHOAL_F16C_LOAD(x + i), x1 = SHOAL_F16C_LOAD(x + i + 8);               \
            __m256 y0 = SHOAL_F16C_LOAD(y + i), y1 = SHOAL_F16C_LOAD(y + i + 8);               \
            SHOAL_F16C_STORE(d + i, VOP(x0, y0));                                              \
            SHOAL_F16C_STORE(d + i + 8, VOP(x1, y1));                                          \
        }                                                                                      \
        for (; i < n; i++) {                                                                   \
            const shoal_u16u_t *xs = x, *ys = y;                                               \
            shoal_u16u_t *ds = d;                                                              \
            float xv = shoal_reduce_fp16_to_f32(xs[i]), yv = shoal_reduce_fp16_to_f32(ys[i]); \
            ds[i] = shoal_reduce_f32_to_fp16(OPM(float, float, xv, yv));                       \
        }                                                                                      \
    }                                                                                          \
    static void shoal_reduce_f16c_acc_##OP(void *dst, const void *b, size_t n)                 \
    {                                                                                          \
        shoal_reduce_f16c_k2_##OP(dst, dst, b, n);                                             \
    }                                                                                          \
    static void shoal_reduce_f16c_racc_##OP(void *dst, const void *a, size_t n)                \
    {                                                                                          \
        shoal_reduce_f16c_k2_##OP(dst, a, dst, n);                                             \
    }                                                                                          \
    static SHOAL_F16C void shoal_reduce_f16c_hacc_##OP(float *acc, const void *src, size_t n)  \
    {                                                                                          \
        const uint16_t *y = src;                                                               \
        size_t i = 0;                                                                          \
        for (; i + 8 <= n; i += 8) {                                                           \
            _mm256_storeu_ps(acc + i, VOP(_mm256_loadu_ps(acc + i), SHOAL_F16C_LOAD(y + i)));   \
        }                                                                                      \
        for (; i < n; i++) {                                                                   \
            const shoal_u16u_t *ys = y;                                                        \
            float xv = acc[i], yv = shoal_reduce_fp16_to_f32(ys[i]);                           \
            acc[i] = OPM(float, float, xv, yv);                                                \
        }                                                                                      \
    }

SHOAL_F16C_DEF_OP(sum, SHOAL_F16C_SUM, SHOAL_REDUCE_OP_SUM)
SHOAL_F16C_DEF_OP(prod, SHOAL_F16C_PROD, SHOAL_REDUCE_OP_PROD)
SHOAL_F16C_DEF_OP(min, SHOAL_F16C_MIN, SHOAL_REDUCE_OP_MIN)
SHOAL_F16C_DEF_OP(max, SHOAL_F16C_MAX, SHOAL_REDUCE_OP_MAX)

static SHOAL_F16C void shoal_reduce_f16c_hload(float *acc, const void *src, size_t n)
{
    const uint16_t *x = src;
    const shoal_u16u_t *xs = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(acc + i, SHOAL_F16C_LOAD(x + i));
    }
    for (; i < n; i++) {
        acc[i] = shoal_reduce_fp16_to_f32(xs[i]);
    }
}

static SHOAL_F16C void shoal_reduce_f16c_hstore(void *dst, const float *acc, size_t n)
{
    uint16_t *d = dst;
    shoal_u16u_t *ds = dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        SHOAL_F16C_STORE(d + i, _mm256_loadu_ps(acc + i));
    }
    for (; i < n; i++) {
        ds[i] = shoal_reduce_f32_to_fp16(acc[i]);
    }
}

#define SHOAL_F16C_KERN(OP)                                                                    \
    {                                                                                          \
        .k2 = shoal_reduce_f16c_k2_##OP, .acc = shoal_reduce_f16c_acc_##OP,                    \
        .racc = shoal_reduce_f16c_racc_##OP, .any = shoal_reduce_f16c_k2_##OP,                 \
    }

const shoal_reduce_half_kern_t shoal_reduce_fp16_f16c = {
    .two = {
        [SHOAL_SUM] = SHOAL_F16C_KERN(sum),
        [SHOAL_PROD] = SHOAL_F16C_KERN(prod),
        [SHOAL_MIN] = SHOAL_F16C_KERN(min),
        [SHOAL_MAX] = SHOAL_F16C_KERN(max),
    },
    .load = shoal_reduce_f16c_hload,
    .acc = {
        [SHOAL_SUM] = shoal_reduce_f16c_hacc_sum,
        [SHOAL_PROD] = shoal_reduce_f16c_hacc_prod,
        [SHOAL_MIN] = shoal_reduce_f16c_hacc_min,
        [SHOAL_MAX] = shoal_reduce_f16c_hacc_max,
    },
    .store = shoal_reduce_f16c_hstore,
};

int shoal_reduce_cpu_has_f16c(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

#else

int shoal_reduce_cpu_has_f16c(void)
{
    return 0;
}

#endif

/* The FLOAT16 kernel set, chosen on first use. The pointer is read and written atomically;
 * two threads racing on the first call store the same value. */
static const shoal_reduce_half_kern_t *shoal_reduce_fp16_cur;

int shoal_reduce_fp16_use_f16c(int enable)
{
    const shoal_reduce_half_kern_t *k = &shoal_reduce_fp16_portable;
#if SHOAL_REDUCE_HAVE_F16C
    if (enable && shoal_reduce_cpu_has_f16c()) {
        k = &shoal_reduce_fp16_f16c;
    }
#endif
    __atomic_store_n(&shoal_reduce_fp16_cur, k, __ATOMIC_RELEASE);
    return k != &shoal_reduce_fp16_portable;
}

const shoal_reduce_half_kern_t *shoal_reduce_fp16_kern(void)
{
    const shoal_reduce_half_kern_t *k = __atomic_load_n(&shoal_reduce_fp16_cur, __ATOMIC_ACQUIRE);
    if (SHOAL_UNLIKELY(k == NULL)) {
        shoal_reduce_fp16_use_f16c(1);
        k = __atomic_load_n(&shoal_reduce_fp16_cur, __ATOMIC_ACQUIRE);
    }
    return k;
}
