/* Entry points of the reduce module: pick the kernel for (dtype, op) from a table once per
 * call, pick its aliasing variant, and run it over the whole buffer (reduce2) or over
 * cache-sized blocks (reduce_n: the dst block stays in L1 while every source streams through
 * once). Kernels are in reduce_kern.c (native dtypes), reduce_half.c and reduce_x86.c
 * (fp16, bf16).
 *
 * Semantics worth knowing:
 * - integer SUM and PROD wrap modulo 2^bits (two's complement for signed types);
 * - float MIN/MAX propagate NaN (see SHOAL_REDUCE_OP_MIN in reduce_impl.h); for +0 vs -0 the
 *   later operand wins;
 * - float SUM/PROD/AVG of two NaNs give the earlier operand's NaN (quieted), in every kernel
 *   and aliasing variant, so in-place and out-of-place calls give the same bits;
 * - fp16/bf16: exact widening to fp32, fp32 arithmetic in source order, one round to nearest
 *   even per call; NaN stays NaN (quiet), overflow gives inf;
 * - dst may equal a and/or b (reduce2) or srcs[0] (reduce_n); partial overlap is not allowed;
 * - invalid dtype/op: nothing is written (callers validate with shoal_reduce_valid). */
#include "reduce/reduce_impl.h"

/* Bytes of dst per block in reduce_n; for fp16/bf16 the fp32 block is twice this. */
#define SHOAL_REDUCE_BLOCK_BYTES 4096
#define SHOAL_REDUCE_HBLOCK (SHOAL_REDUCE_BLOCK_BYTES / 2)
#define SHOAL_REDUCE_MULTI_MAX_SRC 256

static const size_t shoal_reduce_dtype_size[SHOAL_DTYPE_COUNT] = {
    [SHOAL_INT8] = 1,    [SHOAL_UINT8] = 1,    [SHOAL_INT32] = 4,   [SHOAL_UINT32] = 4,
    [SHOAL_INT64] = 8,   [SHOAL_UINT64] = 8,   [SHOAL_FLOAT16] = 2, [SHOAL_BFLOAT16] = 2,
    [SHOAL_FLOAT32] = 4, [SHOAL_FLOAT64] = 8,
};

int shoal_reduce_valid(shoal_dtype_t dtype, shoal_op_t op)
{
    return (unsigned)dtype < SHOAL_DTYPE_COUNT && (unsigned)op < SHOAL_OP_COUNT;
}

static inline const shoal_reduce_kern_t *shoal_reduce_kern_get(shoal_dtype_t dtype,
                                                               shoal_op_t op)
{
    if (dtype == SHOAL_FLOAT16 || dtype == SHOAL_BFLOAT16) {
        return &shoal_reduce_half_kern(dtype)->two[op];
    }
    return &shoal_reduce_kern_table[dtype][op];
}

static inline void shoal_reduce_kern_run(const shoal_reduce_kern_t *k, void *dst, const void *a,
                                         const void *b, size_t count)
{
    if (dst != a && dst != b) {
        k->k2(dst, a, b, count);
    } else if (dst != b) {
        k->acc(dst, b, count);
    } else if (dst != a) {
        k->racc(dst, a, count);
    } else {
        k->any(dst, a, b, count);
    }
}

void shoal_reduce2(void *dst, const void *a, const void *b, size_t count, shoal_dtype_t dtype,
                   shoal_op_t op)
{
    if (count == 0 || !shoal_reduce_valid(dtype, op)) {
        return;
    }
    if (op == SHOAL_AVG) {
        op = SHOAL_SUM;
    }
    shoal_reduce_kern_run(shoal_reduce_kern_get(dtype, op), dst, a, b, count);
}

/* fp16/bf16: per block, widen srcs[0] into fp32, fold every other source in, round once. */
static void shoal_reduce_n_half(void *dst, const void *const *srcs, int nsrc, size_t count,
                                shoal_dtype_t dtype, shoal_op_t op)
{
    const shoal_reduce_half_kern_t *hk = shoal_reduce_half_kern(dtype);
    shoal_reduce_hacc_fn_t acc_fn = hk->acc[op];
    float acc[SHOAL_REDUCE_HBLOCK];

    for (size_t off = 0; off < count; off += SHOAL_REDUCE_HBLOCK) {
        size_t n = SHOAL_MIN(count - off, (size_t)SHOAL_REDUCE_HBLOCK);
        size_t boff = off * 2;
        hk->load(acc, (const char *)srcs[0] + boff, n);
        for (int s = 1; s < nsrc; s++) {
            acc_fn(acc, (const char *)srcs[s] + boff, n);
        }
        hk->store((char *)dst + boff, acc, n);
    }
}

void shoal_reduce_n(void *dst, const void *const *srcs, int nsrc, size_t count,
                    shoal_dtype_t dtype, shoal_op_t op)
{
    if (count == 0 || nsrc < 1 || !shoal_reduce_valid(dtype, op)) {
        return;
    }
    size_t esize = shoal_reduce_dtype_size[dtype];
    if (nsrc == 1) {
        if (dst != srcs[0]) {
            memcpy(dst, srcs[0], count * esize);
        }
        return;
    }
    if (op == SHOAL_AVG) {
        op = SHOAL_SUM;
    }
    if (nsrc > 2 && (dtype == SHOAL_FLOAT16 || dtype == SHOAL_BFLOAT16)) {
        shoal_reduce_n_half(dst, srcs, nsrc, count, dtype, op);
        return;
    }
    const shoal_reduce_kern_t *k = shoal_reduce_kern_get(dtype, op);
    if (nsrc == 2) {
        shoal_reduce_kern_run(k, dst, srcs[0], srcs[1], count);
        return;
    }
    size_t blk = SHOAL_REDUCE_BLOCK_BYTES / esize;
    for (size_t off = 0; off < count; off += blk) {
        size_t n = SHOAL_MIN(count - off, blk);
        size_t boff = off * esize;
        char *d = (char *)dst + boff;
        shoal_reduce_kern_run(k, d, (const char *)srcs[0] + boff, (const char *)srcs[1] + boff,
                              n);
        for (int s = 2; s < nsrc; s++) {
            shoal_reduce_kern_run(k, d, d, (const char *)srcs[s] + boff, n);
        }
    }
}

/* shoal_reduce_n_pieces past its checks (count > 0, dtype and op valid, op not AVG), more than
 * one piece or other than two sources: out of line, so that the small call's path below
 * saves no registers for it. */
static __attribute__((noinline)) void
shoal_reduce_n_pieces_loop(void *dst, const void *const *srcs, const void **tmp, int nsrc,
                           size_t count, shoal_dtype_t dtype, shoal_op_t op, size_t piece_bytes,
                           size_t src_stride)
{
    const shoal_reduce_kern_t *k;
    size_t esize = shoal_reduce_dtype_size[dtype], per, bytes = count * esize;

    per = piece_bytes / esize;
    if (per == 0) {
        return;
    }
    if (nsrc > 2 && (dtype == SHOAL_FLOAT16 || dtype == SHOAL_BFLOAT16)) {
        /* per piece, reduce_n's fp32 accumulation (rounded once) */
        for (size_t off = 0, p = 0; off < bytes; off += piece_bytes, p++) {
            for (int s = 0; s < nsrc; s++) {
                tmp[s] = (const char *)srcs[s] + p * src_stride;
            }
            shoal_reduce_n((char *)dst + off, tmp, nsrc, SHOAL_MIN(per, (bytes - off) / esize),
                           dtype, op);
        }
        return;
    }
    k = shoal_reduce_kern_get(dtype, op);
    for (size_t off = 0, p = 0; off < bytes; off += piece_bytes, p++) {
        size_t n = SHOAL_MIN(per, (bytes - off) / esize), soff = p * src_stride;
        char *d = (char *)dst + off;
        if (nsrc == 1) {
            memcpy(d, (const char *)srcs[0] + soff, n * esize);
            continue;
        }
        shoal_reduce_kern_run(k, d, (const char *)srcs[0] + soff, (const char *)srcs[1] + soff, n);
        for (int s = 2; s < nsrc; s++) {
            shoal_reduce_kern_run(k, d, d, (const char *)srcs[s] + soff, n);
        }
    }
}

void shoal_reduce_n_pieces(void *dst, const void *const *srcs, const void **tmp, int nsrc,
                           size_t count, shoal_dtype_t dtype, shoal_op_t op, size_t piece_bytes,
                           size_t src_stride)
{
    if (count == 0 || nsrc < 1 || !shoal_reduce_valid(dtype, op)) {
        return;
    }
    if (op == SHOAL_AVG) {
        op = SHOAL_SUM;
    }
    if (nsrc == 2 && count * shoal_reduce_dtype_size[dtype] <= piece_bytes) {
        /* one piece of two sources (a small call of 2 ranks): the loop's only step */
        shoal_reduce_kern_run(shoal_reduce_kern_get(dtype, op), dst, srcs[0], srcs[1], count);
        return;
    }
    shoal_reduce_n_pieces_loop(dst, srcs, tmp, nsrc, count, dtype, op, piece_bytes, src_stride);
}

#define SHOAL_REDUCE_MULTI_BLOCK 8192 /* bytes reduced before they are copied on */

void shoal_reduce_n_multi(void *const *dsts, int ndst, const void *const *srcs, int nsrc,
                          size_t count, shoal_dtype_t dtype, shoal_op_t op, int avg_div)
{
    const void *bs[SHOAL_REDUCE_MULTI_MAX_SRC];
    size_t esize, blk;

    if (count == 0 || nsrc < 1 || ndst < 1 || !shoal_reduce_valid(dtype, op)) {
        return;
    }
    esize = shoal_reduce_dtype_size[dtype];
    if (nsrc > SHOAL_REDUCE_MULTI_MAX_SRC) {
        /* more sources than the block's pointer table: reduce whole, then copy */
        shoal_reduce_n(dsts[0], srcs, nsrc, count, dtype, op);
        shoal_reduce_avg_finalize(dsts[0], count, dtype, op, avg_div);
        for (int d = 1; d < ndst; d++) {
            memcpy(dsts[d], dsts[0], count * esize);
        }
        return;
    }
    blk = SHOAL_REDUCE_MULTI_BLOCK / esize;
    for (size_t off = 0; off < count; off += blk) {
        size_t n = SHOAL_MIN(count - off, blk), boff = off * esize;
        char *d0 = (char *)dsts[0] + boff;
        for (int s = 0; s < nsrc; s++) {
            bs[s] = (const char *)srcs[s] + boff;
        }
        shoal_reduce_n(d0, bs, nsrc, n, dtype, op);
        shoal_reduce_avg_finalize(d0, n, dtype, op, avg_div);
        for (int d = 1; d < ndst; d++) {
            if ((char *)dsts[d] + boff != d0) {
                memcpy((char *)dsts[d] + boff, d0, n * esize);
            }
        }
    }
}

/* ---- AVG ------------------------------------------------------------------------------- */

#define SHOAL_REDUCE_DEF_DIV(NAME, ET, VT, DT)                                                 \
    static void shoal_reduce_div_##NAME(void *buf, size_t count, int nranks)                   \
    {                                                                                          \
        ET *p = buf;                                                                           \
        DT div = (DT)nranks;                                                                   \
        for (size_t i = 0; i < count; i++) {                                                   \
            p[i] = (VT)(p[i] / div);                                                           \
        }                                                                                      \
    }

/* Integers divide in a type wide enough for both operands (truncation toward zero). */
SHOAL_REDUCE_DEF_DIV(i8, shoal_i8u_t, int8_t, int)
SHOAL_REDUCE_DEF_DIV(u8, shoal_u8u_t, uint8_t, int)
SHOAL_REDUCE_DEF_DIV(i32, shoal_i32u_t, int32_t, int32_t)
SHOAL_REDUCE_DEF_DIV(u32, shoal_u32u_t, uint32_t, uint32_t)
SHOAL_REDUCE_DEF_DIV(i64, shoal_i64u_t, int64_t, int64_t)
SHOAL_REDUCE_DEF_DIV(u64, shoal_u64u_t, uint64_t, uint64_t)
SHOAL_REDUCE_DEF_DIV(f32, shoal_f32u_t, float, float)
SHOAL_REDUCE_DEF_DIV(f64, shoal_f64u_t, double, double)

#define SHOAL_REDUCE_DEF_HDIV(NAME, TOF, FROMF)                                                \
    static void shoal_reduce_div_##NAME(void *buf, size_t count, int nranks)                   \
    {                                                                                          \
        shoal_u16u_t *p = buf;                                                                 \
        float div = (float)nranks;                                                             \
        for (size_t i = 0; i < count; i++) {                                                   \
            p[i] = FROMF(TOF(p[i]) / div);                                                     \
        }                                                                                      \
    }

SHOAL_REDUCE_DEF_HDIV(fp16, shoal_reduce_fp16_to_f32, shoal_reduce_f32_to_fp16)
SHOAL_REDUCE_DEF_HDIV(bf16, shoal_reduce_bf16_to_f32, shoal_reduce_f32_to_bf16)

typedef void (*shoal_reduce_div_fn_t)(void *buf, size_t count, int nranks);

static const shoal_reduce_div_fn_t shoal_reduce_div_table[SHOAL_DTYPE_COUNT] = {
    [SHOAL_INT8] = shoal_reduce_div_i8,       [SHOAL_UINT8] = shoal_reduce_div_u8,
    [SHOAL_INT32] = shoal_reduce_div_i32,     [SHOAL_UINT32] = shoal_reduce_div_u32,
    [SHOAL_INT64] = shoal_reduce_div_i64,     [SHOAL_UINT64] = shoal_reduce_div_u64,
    [SHOAL_FLOAT16] = shoal_reduce_div_fp16,  [SHOAL_BFLOAT16] = shoal_reduce_div_bf16,
    [SHOAL_FLOAT32] = shoal_reduce_div_f32,   [SHOAL_FLOAT64] = shoal_reduce_div_f64,
};

void shoal_reduce_avg_div(void *buf, size_t count, shoal_dtype_t dtype, int nranks)
{
    if (nranks <= 1 || count == 0 || !shoal_reduce_valid(dtype, SHOAL_AVG)) {
        return;
    }
    shoal_reduce_div_table[dtype](buf, count, nranks);
}

/* ---- conversions ------------------------------------------------------------------------ */

float shoal_half_to_float(uint16_t h)
{
    return shoal_reduce_fp16_to_f32(h);
}

uint16_t shoal_float_to_half(float f)
{
    return shoal_reduce_f32_to_fp16(f);
}

float shoal_bf16_to_float(uint16_t b)
{
    return shoal_reduce_bf16_to_f32(b);
}

uint16_t shoal_float_to_bf16(float f)
{
    return shoal_reduce_f32_to_bf16(f);
}
