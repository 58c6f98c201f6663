/* CPU reduction kernels, one per dtype x op, vectorised by the compiler (-O3, restrict,
 * simple loops over aligned-or-not data). fp16/bf16 are widened to fp32, reduced, and
 * rounded to nearest-even once per call. Results are bitwise deterministic for given inputs. */
#ifndef SHOAL_REDUCE_H
#define SHOAL_REDUCE_H

#include "util/util.h"

/* dst[i] = a[i] op b[i] for i < count. dst may alias a or b. SHOAL_AVG reduces as SUM;
 * the caller divides once at the end with shoal_reduce_avg_finalize(). */
SHOAL_HIDDEN void shoal_reduce2(void *dst, const void *a, const void *b, size_t count,
                                shoal_dtype_t dtype, shoal_op_t op);
/* dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], in that order; nsrc >= 1.
 * fp16/bf16 accumulate all nsrc inputs in fp32 and round once. dst may alias srcs[0]. */
SHOAL_HIDDEN void shoal_reduce_n(void *dst, const void *const *srcs, int nsrc, size_t count,
                                 shoal_dtype_t dtype, shoal_op_t op);
/* shoal_reduce_n writing its result to ndst places in one pass over memory: block by block
 * (a few KiB, L1-resident), the block is reduced into dsts[0], divided by avg_div for
 * SHOAL_AVG (avg_div > 1; other ops ignore it), and copied from L1 to dsts[1..ndst). Same bits
 * as shoal_reduce_n + shoal_reduce_avg_finalize. dsts[0] may alias srcs[0] only; every other
 * dst may also equal any src exactly (same addresses: each block is read before it is
 * written), which an in-place reduction into the sources' own buffers needs. */
SHOAL_HIDDEN void shoal_reduce_n_multi(void *const *dsts, int ndst, const void *const *srcs,
                                       int nsrc, size_t count, shoal_dtype_t dtype,
                                       shoal_op_t op, int avg_div);
/* shoal_reduce_n over pieces, same bits: sources hold their data in pieces of piece_bytes (a
 * multiple of the dtype size) every src_stride bytes, dst is contiguous (count elements). The
 * kernel is chosen once for all pieces (the intra-node LL lines: 56 data bytes per 64-byte
 * line). tmp: room for nsrc pointers. */
SHOAL_HIDDEN void shoal_reduce_n_pieces(void *dst, const void *const *srcs, const void **tmp,
                                        int nsrc, size_t count, shoal_dtype_t dtype,
                                        shoal_op_t op, size_t piece_bytes, size_t src_stride);
/* For SHOAL_AVG: buf[i] /= nranks (integers: truncating division; floats: true division,
 * fp16/bf16 through fp32). No-op for other ops (tested here, without a call). */
SHOAL_HIDDEN void shoal_reduce_avg_div(void *buf, size_t count, shoal_dtype_t dtype, int nranks);

static inline void shoal_reduce_avg_finalize(void *buf, size_t count, shoal_dtype_t dtype,
                                             shoal_op_t op, int nranks)
{
    if (op == SHOAL_AVG) {
        shoal_reduce_avg_div(buf, count, dtype, nranks);
    }
}
/* 1 if dtype and op are in range. */
SHOAL_HIDDEN int shoal_reduce_valid(shoal_dtype_t dtype, shoal_op_t op);

/* fp16 / bf16 conversions (round to nearest even, NaN preserved), also used by tests/perf. */
SHOAL_HIDDEN float shoal_half_to_float(uint16_t h);
SHOAL_HIDDEN uint16_t shoal_float_to_half(float f);
SHOAL_HIDDEN float shoal_bf16_to_float(uint16_t b);
SHOAL_HIDDEN uint16_t shoal_float_to_bf16(float f);

#endif
