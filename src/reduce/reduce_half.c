/* fp16 and bf16 kernels: every value is widened to fp32, reduced in fp32 and rounded to nearest
 * even once. The portable kernels here use the bit-manipulation conversions of reduce_impl.h;
 * on x86-64, reduce_x86.c has AVX2 (+F16C) versions giving the same bits, chosen at run time
 * (tests/unit/test_reduce.c checks both). */
#include "reduce/reduce_impl.h"

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

/* The kernel sets in use, chosen on first use. The pointers are read and written atomically;
 * two threads racing on the first call store the same values. */
static const shoal_reduce_half_kern_t *shoal_reduce_fp16_cur;
static const shoal_reduce_half_kern_t *shoal_reduce_bf16_cur;

int shoal_reduce_half_use_simd(int enable)
{
    const shoal_reduce_half_kern_t *h = &shoal_reduce_fp16_portable;
    const shoal_reduce_half_kern_t *b = &shoal_reduce_bf16_portable;
#if SHOAL_REDUCE_HAVE_X86
    if (enable && shoal_reduce_cpu_has_avx2()) {
        b = &shoal_reduce_bf16_avx2;
        if (shoal_reduce_cpu_has_f16c()) {
            h = &shoal_reduce_fp16_f16c;
        }
    }
#endif
    __atomic_store_n(&shoal_reduce_fp16_cur, h, __ATOMIC_RELEASE);
    __atomic_store_n(&shoal_reduce_bf16_cur, b, __ATOMIC_RELEASE);
    return b != &shoal_reduce_bf16_portable;
}

const shoal_reduce_half_kern_t *shoal_reduce_half_kern(shoal_dtype_t dtype)
{
    const shoal_reduce_half_kern_t **cur =
        dtype == SHOAL_FLOAT16 ? &shoal_reduce_fp16_cur : &shoal_reduce_bf16_cur;
    const shoal_reduce_half_kern_t *k = __atomic_load_n(cur, __ATOMIC_ACQUIRE);
    if (SHOAL_UNLIKELY(k == NULL)) {
        shoal_reduce_half_use_simd(1);
        k = __atomic_load_n(cur, __ATOMIC_ACQUIRE);
    }
    return k;
}
