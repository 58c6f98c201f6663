/* Unit tests of the reduce module: every dtype x op against a scalar reference written
 * independently of the kernels (integers folded in uint64 and truncated, floats folded in
 * their own type in source order, fp16/bf16 widened and rounded by slow reference
 * conversions built on frexp/ldexp/nearbyint), over counts that straddle vector and block
 * sizes, unaligned pointers, in-place aliasing, AVG, wraparound, NaN/inf and every fp16/bf16
 * bit pattern. fp16/bf16 kernels run twice where the CPU has AVX2/F16C: SIMD and portable. */
#include "reduce/reduce_impl.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NDT SHOAL_DTYPE_COUNT
#define NOP SHOAL_OP_COUNT
#define MAXSRC 5
#define PAD 16

static const size_t test_counts[] = {0, 1, 7, 64, 1000, 4097};
#define NCOUNTS (sizeof(test_counts) / sizeof(test_counts[0]))

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int is_half(int dt)
{
    return dt == SHOAL_FLOAT16 || dt == SHOAL_BFLOAT16;
}

static int is_signed_int(int dt)
{
    return dt == SHOAL_INT8 || dt == SHOAL_INT32 || dt == SHOAL_INT64;
}

/* ---- reference conversions (slow, obviously right) -------------------------------------- */

static float ref_h2f(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 31) {
        v = m != 0 ? NAN : INFINITY;
    } else if (e == 0) {
        v = ldexpf((float)m, -24);
    } else {
        v = ldexpf((float)(m | 1024), e - 25);
    }
    return (h & 0x8000) != 0 ? -v : v;
}

/* Round |a| to a multiple of 2^q where q = exponent - mant_bits, not below 2^min_q (ties to
 * even through nearbyint under the default rounding mode). */
static double ref_round_abs(double a, int mant_bits, int min_q)
{
    int e;
    frexp(a, &e);
    int q = e - 1 - mant_bits;
    if (q < min_q) {
        q = min_q;
    }
    return ldexp(nearbyint(ldexp(a, -q)), q);
}

static uint16_t ref_f2h(float f)
{
    uint16_t s = signbit(f) ? 0x8000 : 0;
    if (isnan(f)) {
        return s | 0x7e00;
    }
    double v = ref_round_abs(fabs((double)f), 10, -24);
    if (v >= 65536.0) {
        return s | 0x7c00;
    }
    if (v < 0x1p-14) {
        return s | (uint16_t)(v * 0x1p24);
    }
    int e;
    double fr = frexp(v, &e);
    return s | (uint16_t)(((e - 1 + 15) << 10) | (int)((fr * 2 - 1) * 1024));
}

static float ref_bf2f(uint16_t b)
{
    int e = (b >> 7) & 255, m = b & 127;
    float v;
    if (e == 255) {
        v = m != 0 ? NAN : INFINITY;
    } else if (e == 0) {
        v = ldexpf((float)m, -133);
    } else {
        v = ldexpf((float)(m | 128), e - 134);
    }
    return (b & 0x8000) != 0 ? -v : v;
}

static uint16_t ref_f2bf(float f)
{
    uint16_t s = signbit(f) ? 0x8000 : 0;
    if (isnan(f)) {
        return s | 0x7fc0;
    }
    double v = ref_round_abs(fabs((double)f), 7, -133);
    if (v >= 0x1p128) {
        return s | 0x7f80;
    }
    return s | (uint16_t)(f32_bits((float)v) >> 16);
}

/* 1 if a and b are the same value: equal bits, or both NaN (payloads are checked apart). */
static int same_h(uint16_t a, uint16_t b, int bf)
{
    uint16_t em = bf ? 0x7f80 : 0x7c00, mm = bf ? 0x7f : 0x3ff;
    int na = (a & em) == em && (a & mm) != 0, nb = (b & em) == em && (b & mm) != 0;
    return a == b || (na && nb);
}

/* ---- reference reduction ---------------------------------------------------------------- */

static float ref_fmin(float x, float y)
{
    return isnan(x) ? x : isnan(y) ? y : x < y ? x : y;
}

static float ref_fmax(float x, float y)
{
    return isnan(x) ? x : isnan(y) ? y : x > y ? x : y;
}

static double ref_dmin(double x, double y)
{
    return isnan(x) ? x : isnan(y) ? y : x < y ? x : y;
}

static double ref_dmax(double x, double y)
{
    return isnan(x) ? x : isnan(y) ? y : x > y ? x : y;
}

static float ref_fop(int op, float x, float y)
{
    switch (op) {
    case SHOAL_PROD: return x * y;
    case SHOAL_MIN: return ref_fmin(x, y);
    case SHOAL_MAX: return ref_fmax(x, y);
    default: return x + y;
    }
}

static double ref_dop(int op, double x, double y)
{
    switch (op) {
    case SHOAL_PROD: return x * y;
    case SHOAL_MIN: return ref_dmin(x, y);
    case SHOAL_MAX: return ref_dmax(x, y);
    default: return x + y;
    }
}

static uint64_t load_u(const unsigned char *p, size_t sz)
{
    uint64_t v = 0;
    memcpy(&v, p, sz); /* little-endian */
    return v;
}

static int64_t sext(uint64_t v, size_t sz)
{
    unsigned sh = (unsigned)(64 - 8 * sz);
    return sh == 0 ? (int64_t)v : (int64_t)(v << sh) >> sh;
}

static uint64_t ref_iop(int dt, int op, uint64_t x, uint64_t y, size_t sz)
{
    int lt;
    switch (op) {
    case SHOAL_PROD: return x * y;
    case SHOAL_MIN:
    case SHOAL_MAX:
        lt = is_signed_int(dt) ? sext(x, sz) < sext(y, sz) : x < y;
        if (op == SHOAL_MIN) {
            return lt ? x : y;
        }
        return lt ? y : x;
    default: return x + y;
    }
}

/* out = src[0][i] op ... op src[nsrc-1][i] */
static void ref_elem(int dt, int op, const unsigned char *const *src, int nsrc, size_t i,
                     unsigned char *out)
{
    size_t sz = shoal_dtype_size(dt);
    if (dt == SHOAL_FLOAT32 || is_half(dt)) {
        float acc = 0;
        for (int s = 0; s < nsrc; s++) {
            uint64_t raw = load_u(src[s] + i * sz, sz);
            float v = dt == SHOAL_FLOAT32    ? f32_of((uint32_t)raw)
                      : dt == SHOAL_FLOAT16 ? ref_h2f((uint16_t)raw)
                                             : ref_bf2f((uint16_t)raw);
            acc = s == 0 ? v : ref_fop(op, acc, v);
        }
        if (dt == SHOAL_FLOAT32) {
            memcpy(out, &acc, 4);
        } else {
            uint16_t h = dt == SHOAL_FLOAT16 ? ref_f2h(acc) : ref_f2bf(acc);
            memcpy(out, &h, 2);
        }
    } else if (dt == SHOAL_FLOAT64) {
        double acc = 0, v;
        for (int s = 0; s < nsrc; s++) {
            memcpy(&v, src[s] + i * sz, 8);
            acc = s == 0 ? v : ref_dop(op, acc, v);
        }
        memcpy(out, &acc, 8);
    } else {
        uint64_t acc = 0;
        for (int s = 0; s < nsrc; s++) {
            uint64_t v = load_u(src[s] + i * sz, sz);
            acc = s == 0 ? v : ref_iop(dt, op, acc, v, sz);
        }
        memcpy(out, &acc, sz);
    }
}

/* 1 if element i of got equals want (floats: NaN matches any NaN). */
static int elem_same(int dt, const unsigned char *got, const unsigned char *want)
{
    size_t sz = shoal_dtype_size(dt);
    if (memcmp(got, want, sz) == 0) {
        return 1;
    }
    if (is_half(dt)) {
        return same_h((uint16_t)load_u(got, 2), (uint16_t)load_u(want, 2),
                      dt == SHOAL_BFLOAT16);
    }
    if (dt == SHOAL_FLOAT32) {
        float a, b;
        memcpy(&a, got, 4);
        memcpy(&b, want, 4);
        return isnan(a) && isnan(b);
    }
    if (dt == SHOAL_FLOAT64) {
        double a, b;
        memcpy(&a, got, 8);
        memcpy(&b, want, 8);
        return isnan(a) && isnan(b);
    }
    return 0;
}

/* ---- input generation ------------------------------------------------------------------- */

/* Moderate magnitudes (sums and products of 5 stay mostly finite), plus 1 in 64 special
 * values: zeros, inf, NaN, subnormals, the largest finite. Integers: any bits (wraparound). */
static void gen_elem(int dt, unsigned char *p)
{
    uint64_t r = rng_next();
    int special = (r >> 58) == 0;
    unsigned pick = (unsigned)(r >> 40) & 7;
    size_t sz = shoal_dtype_size(dt);
    uint64_t sign = (r >> 39) & 1;
    uint64_t v;
    switch (dt) {
    case SHOAL_FLOAT16: {
        static const uint16_t sp[8] = {0, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x0001, 0x03ff, 0x7bff};
        v = special ? sp[pick] : (sign << 15) | ((uint64_t)(11 + r % 9) << 10) | ((r >> 8) & 1023);
        break;
    }
    case SHOAL_BFLOAT16: {
        static const uint16_t sp[8] = {0, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x0001, 0x007f, 0x7f7f};
        v = special ? sp[pick] : (sign << 15) | ((uint64_t)(123 + r % 9) << 7) | ((r >> 8) & 127);
        break;
    }
    case SHOAL_FLOAT32: {
        static const uint32_t sp[8] = {0, 0x80000000u, 0x7f800000u, 0xff800000u,
                                       0x7fc00000u, 1, 0x007fffffu, 0x7f7fffffu};
        v = special ? sp[pick]
                    : (sign << 31) | ((uint64_t)(123 + r % 9) << 23) | ((r >> 8) & 0x7fffff);
        break;
    }
    case SHOAL_FLOAT64: {
        static const uint64_t sp[8] = {0, 1ull << 63, 0x7ffull << 52, 0xfffull << 52,
                                       0x7ff8ull << 48, 1, (1ull << 52) - 1,
                                       0x7fefffffffffffffull};
        v = special ? sp[pick]
                    : (sign << 63) | ((uint64_t)(1019 + r % 9) << 52) | ((r >> 8) & ((1ull << 52) - 1));
        break;
    }
    default:
        v = rng_next();
        break;
    }
    memcpy(p, &v, sz);
}

static unsigned char *alloc_buf(size_t bytes)
{
    unsigned char *p = malloc(bytes + 2 * PAD);
    if (p == NULL) {
        tap_bail("out of memory");
    }
    return p;
}

/* ---- matrix ----------------------------------------------------------------------------- */

typedef struct {
    size_t bad;
    char first[200];
} fail_t;

static void fail_note(fail_t *f, const char *what, size_t count, size_t i)
{
    if (f->bad++ == 0) {
        snprintf(f->first, sizeof(f->first), "%s count %zu: first mismatch at %zu", what,
                 count, i);
    }
}

/* Checks dst (count elements) against the reference of srcs, and the 8 guard bytes after. */
static void check_result(int dt, int op, const unsigned char *dst, const unsigned char *const *src,
                         int nsrc, size_t count, fail_t *f, const char *what)
{
    size_t sz = shoal_dtype_size(dt);
    unsigned char want[8];
    for (size_t i = 0; i < count; i++) {
        ref_elem(dt, op, src, nsrc, i, want);
        if (!elem_same(dt, dst + i * sz, want)) {
            fail_note(f, what, count, i);
            return;
        }
    }
    for (size_t i = 0; i < 8; i++) {
        if (dst[count * sz + i] != 0xa5) {
            fail_note(f, "guard bytes overwritten", count, count);
            return;
        }
    }
}

/* alias: 0 none, 1 dst==a, 2 dst==b, 3 dst==a==b, 4 a==b (dst separate) */
static void run_reduce2_one(int dt, int op, size_t count, int alias, const size_t off[3],
                            fail_t *f)
{
    size_t sz = shoal_dtype_size(dt), bytes = count * sz;
    unsigned char *ba = alloc_buf(bytes), *bb = alloc_buf(bytes), *bd = alloc_buf(bytes);
    unsigned char *ca = alloc_buf(bytes), *cb = alloc_buf(bytes);
    unsigned char *a = ba + off[0], *b = bb + off[1], *d = bd + off[2];
    for (size_t i = 0; i < count; i++) {
        gen_elem(dt, a + i * sz);
        gen_elem(dt, b + i * sz);
    }
    if (alias == 3 || alias == 4) {
        b = a;
    }
    if (alias == 1 || alias == 3) {
        d = a;
    } else if (alias == 2) {
        d = b;
    }
    memset(d + bytes, 0xa5, 8);
    memcpy(ca, a, bytes);
    memcpy(cb, b, bytes);
    shoal_reduce2(d, a, b, count, dt, op);
    const unsigned char *src[2] = {ca, cb};
    char what[64];
    snprintf(what, sizeof(what), "alias %d off %zu/%zu/%zu", alias, off[0], off[1], off[2]);
    check_result(dt, op, d, src, 2, count, f, what);
    free(ba), free(bb), free(bd), free(ca), free(cb);
}

static void test_reduce2(int dt, int op, const char *tag)
{
    static const size_t offs[3][3] = {{0, 0, 0}, {1, 3, 5}, {7, 2, 4}};
    fail_t f = {0};
    for (size_t c = 0; c < NCOUNTS; c++) {
        for (int o = 0; o < 3; o++) {
            for (int alias = 0; alias < 5; alias++) {
                run_reduce2_one(dt, op, test_counts[c], alias, offs[o], &f);
            }
        }
    }
    tap_ok(f.bad == 0, "reduce2 %s %s%s%s%s", shoal_dtype_name(dt), shoal_op_name(op), tag,
           f.bad != 0 ? ": " : "", f.first);
}

static void run_reduce_n_one(int dt, int op, size_t count, int nsrc, int inplace, size_t off,
                             fail_t *f)
{
    size_t sz = shoal_dtype_size(dt), bytes = count * sz;
    unsigned char *buf[MAXSRC], *copy[MAXSRC], *bd = alloc_buf(bytes);
    const void *srcs[MAXSRC];
    for (int s = 0; s < nsrc; s++) {
        buf[s] = alloc_buf(bytes);
        copy[s] = alloc_buf(bytes);
        unsigned char *p = buf[s] + (off + (size_t)s * 3) % 8;
        for (size_t i = 0; i < count; i++) {
            gen_elem(dt, p + i * sz);
        }
        memcpy(copy[s], p, bytes);
        srcs[s] = p;
    }
    unsigned char *d = inplace ? (unsigned char *)srcs[0] : bd + off;
    memset(d + bytes, 0xa5, 8);
    shoal_reduce_n(d, srcs, nsrc, count, dt, op);
    char what[64];
    snprintf(what, sizeof(what), "nsrc %d inplace %d off %zu", nsrc, inplace, off);
    check_result(dt, op, d, (const unsigned char *const *)copy, nsrc, count, f, what);
    for (int s = 0; s < nsrc; s++) {
        free(buf[s]), free(copy[s]);
    }
    free(bd);
}

static void test_reduce_n(int dt, int op, const char *tag)
{
    fail_t f = {0};
    for (size_t c = 0; c < NCOUNTS; c++) {
        for (int nsrc = 1; nsrc <= MAXSRC; nsrc++) {
            run_reduce_n_one(dt, op, test_counts[c], nsrc, 0, 0, &f);
            run_reduce_n_one(dt, op, test_counts[c], nsrc, 0, 5, &f);
            run_reduce_n_one(dt, op, test_counts[c], nsrc, 1, 3, &f);
        }
    }
    tap_ok(f.bad == 0, "reduce_n %s %s%s%s%s", shoal_dtype_name(dt), shoal_op_name(op), tag,
           f.bad != 0 ? ": " : "", f.first);
}

/* reduce_n_pieces gives reduce_n's bits on data laid out in pieces (the intra-node LL lines:
 * 56 bytes every 64), for every source count, and writes nothing past dst. */
static void test_reduce_n_pieces(int dt, int op, const char *tag)
{
    static const size_t piece = 56, stride = 64;
    size_t sz = shoal_dtype_size(dt);
    int ok = 1;
    for (size_t c = 0; c < NCOUNTS && ok; c++) {
        size_t count = test_counts[c], bytes = count * sz, npieces = (bytes + piece - 1) / piece;
        for (int nsrc = 1; nsrc <= MAXSRC && ok; nsrc++) {
            unsigned char *flat[MAXSRC], *lines[MAXSRC];
            const void *fs[MAXSRC], *ls[MAXSRC], *tmp[MAXSRC];
            unsigned char *want = alloc_buf(bytes + 8), *got = alloc_buf(bytes + 8);
            for (int s = 0; s < nsrc; s++) {
                flat[s] = alloc_buf(bytes + 1);
                lines[s] = alloc_buf(npieces * stride + 1);
                memset(lines[s], 0x5a, npieces * stride + 1);
                for (size_t i = 0; i < count; i++) {
                    gen_elem(dt, flat[s] + i * sz);
                }
                for (size_t p = 0; p < npieces; p++) {
                    size_t len = bytes - p * piece < piece ? bytes - p * piece : piece;
                    memcpy(lines[s] + p * stride, flat[s] + p * piece, len);
                }
                fs[s] = flat[s];
                ls[s] = lines[s];
            }
            memset(got + bytes, 0xa5, 8);
            shoal_reduce_n(want, fs, nsrc, count, dt, op);
            shoal_reduce_n_pieces(got, ls, tmp, nsrc, count, dt, op, piece, stride);
            ok = memcmp(want, got, bytes) == 0;
            for (int k = 0; k < 8; k++) {
                ok &= got[bytes + (size_t)k] == 0xa5;
            }
            if (!ok) {
                tap_diag("%s %s: count %zu nsrc %d differs", shoal_dtype_name(dt),
                         shoal_op_name(op), count, nsrc);
            }
            for (int s = 0; s < nsrc; s++) {
                free(flat[s]), free(lines[s]);
            }
            free(want), free(got);
        }
    }
    tap_ok(ok, "reduce_n_pieces %s %s%s matches reduce_n", shoal_dtype_name(dt),
           shoal_op_name(op), tag);
}

/* reduce_n_multi: every destination gets reduce_n's bits (AVG: divided by nsrc, as
 * avg_finalize does), across its 8 KiB blocks; in place, every destination is its own
 * source (the intra-node direct path's shared buffers); nothing is written past the end. */
static void test_reduce_n_multi(int dt, int op, const char *tag)
{
    static const size_t counts[] = {1, 7, 2049, 5003, 20011};
    size_t sz = shoal_dtype_size(dt);
    int ok = 1;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && ok; c++) {
        size_t count = counts[c], bytes = count * sz;
        for (int nsrc = 1; nsrc <= 4 && ok; nsrc++) {
            for (int inplace = 0; inplace < 2 && ok; inplace++) {
                unsigned char *src[4], *dst[4];
                const void *ss[4];
                void *ds[4];
                unsigned char *want = alloc_buf(bytes + 8);
                int ndst = inplace ? nsrc : 3;
                for (int s = 0; s < nsrc; s++) {
                    src[s] = alloc_buf(bytes + 8);
                    for (size_t i = 0; i < count; i++) {
                        gen_elem(dt, src[s] + i * sz);
                    }
                    ss[s] = src[s];
                }
                shoal_reduce_n(want, ss, nsrc, count, dt, op);
                shoal_reduce_avg_finalize(want, count, dt, op, nsrc);
                for (int d = 0; d < ndst; d++) {
                    dst[d] = inplace ? src[d] : alloc_buf(bytes + 8);
                    memset(dst[d] + bytes, 0xa5, 8);
                    ds[d] = dst[d];
                }
                shoal_reduce_n_multi(ds, ndst, ss, nsrc, count, dt, op, nsrc);
                for (int d = 0; d < ndst; d++) {
                    ok &= memcmp(want, dst[d], bytes) == 0;
                    for (int k = 0; k < 8; k++) {
                        ok &= dst[d][bytes + (size_t)k] == 0xa5;
                    }
                }
                if (!ok) {
                    tap_diag("%s %s: count %zu nsrc %d %s differs", shoal_dtype_name(dt),
                             shoal_op_name(op), count, nsrc, inplace ? "in place" : "3 dsts");
                }
                for (int s = 0; s < nsrc; s++) {
                    free(src[s]);
                }
                for (int d = 0; d < ndst && !inplace; d++) {
                    free(dst[d]);
                }
                free(want);
            }
        }
    }
    tap_ok(ok, "reduce_n_multi %s %s%s matches reduce_n in every destination",
           shoal_dtype_name(dt), shoal_op_name(op), tag);
}

/* ---- AVG -------------------------------------------------------------------------------- */

static void ref_div(int dt, unsigned char *p, int nranks)
{
    size_t sz = shoal_dtype_size(dt);
    uint64_t raw = load_u(p, sz);
    if (dt == SHOAL_FLOAT16 || dt == SHOAL_BFLOAT16) {
        int bf = dt == SHOAL_BFLOAT16;
        float v = (bf ? ref_bf2f((uint16_t)raw) : ref_h2f((uint16_t)raw)) / (float)nranks;
        uint16_t h = bf ? ref_f2bf(v) : ref_f2h(v);
        memcpy(p, &h, 2);
    } else if (dt == SHOAL_FLOAT32) {
        float v = f32_of((uint32_t)raw) / (float)nranks;
        memcpy(p, &v, 4);
    } else if (dt == SHOAL_FLOAT64) {
        double v;
        memcpy(&v, p, 8);
        v /= nranks;
        memcpy(p, &v, 8);
    } else if (is_signed_int(dt)) {
        int64_t v = sext(raw, sz) / nranks;
        memcpy(p, &v, sz);
    } else {
        uint64_t v = raw / (uint64_t)nranks;
        memcpy(p, &v, sz);
    }
}

static void test_avg(int dt)
{
    fail_t f = {0};
    size_t count = 1000, sz = shoal_dtype_size(dt), bytes = count * sz;
    for (int nranks = 1; nranks <= MAXSRC; nranks++) {
        unsigned char *buf[MAXSRC], *want = alloc_buf(bytes), *bd = alloc_buf(bytes);
        unsigned char *d = bd + 1;
        const void *srcs[MAXSRC];
        for (int s = 0; s < nranks; s++) {
            buf[s] = alloc_buf(bytes);
            for (size_t i = 0; i < count; i++) {
                gen_elem(dt, buf[s] + i * sz);
            }
            srcs[s] = buf[s];
        }
        for (size_t i = 0; i < count; i++) {
            ref_elem(dt, SHOAL_SUM, (const unsigned char *const *)buf, nranks, i, want + i * sz);
            ref_div(dt, want + i * sz, nranks);
        }
        shoal_reduce_n(d, srcs, nranks, count, dt, SHOAL_AVG);
        shoal_reduce_avg_finalize(d, count, dt, SHOAL_AVG, nranks);
        for (size_t i = 0; i < count; i++) {
            if (!elem_same(dt, d + i * sz, want + i * sz)) {
                fail_note(&f, "avg", count, i);
                break;
            }
        }
        /* Finalize with another op is a no-op. */
        memcpy(want, d, bytes);
        shoal_reduce_avg_finalize(d, count, dt, SHOAL_SUM, nranks);
        if (memcmp(want, d, bytes) != 0) {
            fail_note(&f, "finalize(SUM) changed the buffer", count, 0);
        }
        for (int s = 0; s < nranks; s++) {
            free(buf[s]);
        }
        free(want), free(bd);
    }
    tap_ok(f.bad == 0, "avg finalize %s%s%s", shoal_dtype_name(dt), f.bad != 0 ? ": " : "",
           f.first);
}

/* ---- targeted cases --------------------------------------------------------------------- */

/* AVG as documented in shoal.h and the README: the sum as SUM makes it (wrapped, or inf for
 * fp16), then one divide truncating integers toward zero. */
static void test_avg_documented(void)
{
    int8_t i8a[2] = {100, -2}, i8b[2] = {100, -1}, i8d[2];
    shoal_reduce2(i8d, i8a, i8b, 2, SHOAL_INT8, SHOAL_AVG);
    shoal_reduce_avg_finalize(i8d, 2, SHOAL_INT8, SHOAL_AVG, 2);
    tap_ok(i8d[0] == -28 && i8d[1] == -1, "int8 avg: 100, 100 wraps to -28; -2, -1 truncates to "
           "-1 (got %d, %d)", i8d[0], i8d[1]);
    uint16_t h = shoal_float_to_half(40000.0f), hd;
    shoal_reduce2(&hd, &h, &h, 1, SHOAL_FLOAT16, SHOAL_AVG);
    shoal_reduce_avg_finalize(&hd, 1, SHOAL_FLOAT16, SHOAL_AVG, 2);
    tap_ok(shoal_half_to_float(hd) == INFINITY, "fp16 avg of 40000, 40000 is inf (sum overflows)");
}

static void test_wraparound(void)
{
    int8_t i8a[3] = {127, -128, -128}, i8b[3] = {1, -1, -1}, i8d[3];
    shoal_reduce2(i8d, i8a, i8b, 3, SHOAL_INT8, SHOAL_SUM);
    tap_ok(i8d[0] == -128 && i8d[1] == 127 && i8d[2] == 127, "int8 sum wraps");
    int8_t i8p[3] = {64, -128, 16}, i8q[3] = {4, -1, 9};
    shoal_reduce2(i8d, i8p, i8q, 3, SHOAL_INT8, SHOAL_PROD);
    tap_ok(i8d[0] == 0 && i8d[1] == -128 && i8d[2] == -112, "int8 prod wraps (-128 * -1 = -128)");
    uint8_t u8a[2] = {255, 16}, u8b[2] = {1, 16}, u8d[2];
    shoal_reduce2(u8d, u8a, u8b, 2, SHOAL_UINT8, SHOAL_SUM);
    tap_ok(u8d[0] == 0 && u8d[1] == 32, "uint8 sum wraps");
    shoal_reduce2(u8d, u8a, u8b, 2, SHOAL_UINT8, SHOAL_PROD);
    tap_ok(u8d[0] == 255 && u8d[1] == 0, "uint8 prod wraps");
    int32_t i32a[9], i32b[9], i32d[9];
    for (int i = 0; i < 9; i++) {
        i32a[i] = INT32_MAX;
        i32b[i] = 1;
    }
    shoal_reduce2(i32d, i32a, i32b, 9, SHOAL_INT32, SHOAL_SUM);
    tap_ok(i32d[0] == INT32_MIN && i32d[8] == INT32_MIN, "int32 INT32_MAX + 1 = INT32_MIN");
    shoal_reduce2(i32d, i32a, i32a, 9, SHOAL_INT32, SHOAL_PROD);
    tap_ok(i32d[0] == 1 && i32d[8] == 1, "int32 INT32_MAX^2 wraps to 1");
    int64_t i64a[5], i64b[5], i64d[5];
    for (int i = 0; i < 5; i++) {
        i64a[i] = INT64_MIN;
        i64b[i] = -1;
    }
    shoal_reduce2(i64d, i64a, i64b, 5, SHOAL_INT64, SHOAL_PROD);
    tap_ok(i64d[0] == INT64_MIN && i64d[4] == INT64_MIN, "int64 INT64_MIN * -1 = INT64_MIN");
    shoal_reduce2(i64d, i64a, i64b, 5, SHOAL_INT64, SHOAL_SUM);
    tap_ok(i64d[0] == INT64_MAX, "int64 INT64_MIN - 1 = INT64_MAX");
    uint64_t u64a[5], u64d[5];
    for (int i = 0; i < 5; i++) {
        u64a[i] = UINT64_MAX;
    }
    shoal_reduce2(u64d, u64a, u64a, 5, SHOAL_UINT64, SHOAL_PROD);
    tap_ok(u64d[0] == 1 && u64d[4] == 1, "uint64 max * max = 1");
    uint32_t u32a[5] = {0, 1, 2, 3, 0xffffffffu}, u32b[5] = {0xffffffffu, 4, 1, 3, 0}, u32d[5];
    shoal_reduce2(u32d, u32a, u32b, 5, SHOAL_UINT32, SHOAL_MIN);
    tap_ok(u32d[0] == 0 && u32d[1] == 1 && u32d[4] == 0, "uint32 min is unsigned");
    int32_t s32a[2] = {-1, 5}, s32b[2] = {1, -7};
    shoal_reduce2(i32d, s32a, s32b, 2, SHOAL_INT32, SHOAL_MAX);
    tap_ok(i32d[0] == 1 && i32d[1] == 5, "int32 max is signed");
}

/* fp32 NaN/inf semantics, on 19 elements so vector and scalar code both run. */
static void test_float_specials(void)
{
    enum { N = 19 };
    float a[N], b[N], d[N];
    int ok = 1;
    for (int op = SHOAL_MIN; op <= SHOAL_MAX; op++) {
        for (int i = 0; i < N; i++) {
            a[i] = i % 2 == 0 ? NAN : 1.0f;
            b[i] = i % 2 == 0 ? 2.0f : NAN;
        }
        shoal_reduce2(d, a, b, N, SHOAL_FLOAT32, op);
        for (int i = 0; i < N; i++) {
            ok &= isnan(d[i]);
        }
        shoal_reduce2(d, b, a, N, SHOAL_FLOAT32, op);
        for (int i = 0; i < N; i++) {
            ok &= isnan(d[i]);
        }
    }
    tap_ok(ok, "fp32 min/max propagate NaN from either operand");
    double da[N], db[N], dd[N];
    ok = 1;
    for (int i = 0; i < N; i++) {
        da[i] = i % 3 == 0 ? NAN : -1.0;
        db[i] = i % 3 == 1 ? NAN : -2.0;
    }
    shoal_reduce2(dd, da, db, N, SHOAL_FLOAT64, SHOAL_MAX);
    for (int i = 0; i < N; i++) {
        ok &= i % 3 == 2 ? dd[i] == -1.0 : isnan(dd[i]);
    }
    tap_ok(ok, "fp64 max propagates NaN, else max");
    for (int i = 0; i < N; i++) {
        a[i] = INFINITY;
        b[i] = i % 2 == 0 ? -INFINITY : 1.0f;
    }
    shoal_reduce2(d, a, b, N, SHOAL_FLOAT32, SHOAL_SUM);
    tap_ok(isnan(d[0]) && d[1] == INFINITY && isnan(d[18]), "fp32 inf + -inf = NaN, inf + 1 = inf");
}

static void test_half_specials(int dt)
{
    enum { N = 21 };
    int bf = dt == SHOAL_BFLOAT16;
    uint16_t (*to)(float) = bf ? shoal_float_to_bf16 : shoal_float_to_half;
    float (*from)(uint16_t) = bf ? shoal_bf16_to_float : shoal_half_to_float;
    uint16_t a[N], b[N], d[N];
    const char *name = shoal_dtype_name(dt);
    int ok = 1;
    for (int op = SHOAL_SUM; op <= SHOAL_MAX; op++) {
        for (int i = 0; i < N; i++) {
            a[i] = to(i % 2 == 0 ? NAN : 1.5f);
            b[i] = to(i % 2 == 0 ? -3.0f : NAN);
        }
        shoal_reduce2(d, a, b, N, dt, op);
        for (int i = 0; i < N; i++) {
            ok &= isnan(from(d[i]));
        }
    }
    tap_ok(ok, "%s every op propagates NaN", name);
    float big = bf ? 0x1.fep127f : 60000.0f;
    for (int i = 0; i < N; i++) {
        a[i] = to(big);
        b[i] = to(i % 2 == 0 ? big : -INFINITY);
    }
    shoal_reduce2(d, a, b, N, dt, SHOAL_SUM);
    tap_ok(from(d[0]) == INFINITY && from(d[1]) == -INFINITY && from(d[20]) == INFINITY,
           "%s sum overflows to inf, big + -inf = -inf", name);
    /* One rounding per call: 1 + u/2 + u/2 (u = ulp(1)) is 1 + u in fp32, but 1 when each
     * partial sum is rounded (ties to even). */
    float ulp = bf ? 0x1p-7f : 0x1p-10f;
    uint16_t s0[N], s1[N], s2[N];
    for (int i = 0; i < N; i++) {
        s0[i] = to(1.0f);
        s1[i] = s2[i] = to(ulp / 2);
    }
    const void *srcs[3] = {s0, s1, s2};
    shoal_reduce_n(d, srcs, 3, N, dt, SHOAL_SUM);
    tap_ok(from(d[0]) == 1.0f + ulp && from(d[N - 1]) == 1.0f + ulp,
           "%s reduce_n rounds once (1 + u/2 + u/2 = 1 + u)", name);
}

/* ---- conversions ------------------------------------------------------------------------ */

static void test_conv_roundtrip(void)
{
    size_t bad_h = 0, bad_b = 0, bad_hw = 0, bad_bw = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = shoal_half_to_float(h), r = ref_h2f(h);
        int nan = isnan(r);
        bad_hw += nan ? !isnan(f) : f32_bits(f) != f32_bits(r);
        bad_h += nan ? !isnan(shoal_half_to_float(shoal_float_to_half(f)))
                     : shoal_float_to_half(f) != h;
        float g = shoal_bf16_to_float(h), rg = ref_bf2f(h);
        nan = isnan(rg);
        bad_bw += nan ? !isnan(g) : f32_bits(g) != f32_bits(rg);
        bad_b += nan ? !isnan(shoal_bf16_to_float(shoal_float_to_bf16(g)))
                     : shoal_float_to_bf16(g) != h;
    }
    tap_ok(bad_hw == 0, "fp16 -> fp32 exact for all 65536 patterns (%zu bad)", bad_hw);
    tap_ok(bad_h == 0, "fp16 round trip exact for all non-NaN, NaN stays NaN (%zu bad)", bad_h);
    tap_ok(bad_bw == 0, "bf16 -> fp32 exact for all 65536 patterns (%zu bad)", bad_bw);
    tap_ok(bad_b == 0, "bf16 round trip exact for all non-NaN, NaN stays NaN (%zu bad)", bad_b);
}

/* Floats that probe rounding: every fp16/bf16 value, the midpoints between neighbours, one
 * fp32 ulp either side of them; then random bit patterns. */
static size_t probe_floats(float *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t i = 0; i < 65536 && n + 8 <= cap; i++) {
        float lo = ref_h2f((uint16_t)i), hi = ref_h2f((uint16_t)(i + 1));
        float blo = ref_bf2f((uint16_t)i), bhi = ref_bf2f((uint16_t)(i + 1));
        if (isfinite(lo) && isfinite(hi) && (i & 0x7fff) != 0x7fff) {
            float mid = (float)(((double)lo + hi) / 2);
            out[n++] = mid;
            out[n++] = nextafterf(mid, INFINITY);
            out[n++] = nextafterf(mid, -INFINITY);
        }
        if (isfinite(blo) && isfinite(bhi) && (i & 0x7fff) != 0x7fff) {
            float mid = (float)(((double)blo + bhi) / 2);
            out[n++] = mid;
            out[n++] = nextafterf(mid, INFINITY);
            out[n++] = nextafterf(mid, -INFINITY);
        }
        out[n++] = lo;
        out[n++] = blo;
    }
    while (n < cap) {
        out[n++] = f32_of((uint32_t)rng_next());
    }
    return n;
}

/* The x86 kernels' conversions (VCVTPS2PH, VCVTPH2PS, the AVX2 bf16 rounding) against the
 * portable ones, bit for bit, NaN payloads included. */
static void test_conv_simd(const float *f, size_t n)
{
#if SHOAL_REDUCE_HAVE_X86
    uint16_t *out = malloc(n * sizeof(uint16_t)), *all = malloc(65536 * sizeof(uint16_t));
    float *w = malloc(65536 * sizeof(float));
    size_t bad_h = 0, bad_w = 0, bad_b = 0, bad_bw = 0;
    if (out == NULL || all == NULL || w == NULL) {
        tap_bail("out of memory");
    }
    for (uint32_t i = 0; i < 65536; i++) {
        all[i] = (uint16_t)i;
    }
    if (shoal_reduce_cpu_has_f16c()) {
        shoal_reduce_fp16_f16c.store(out, f, n);
        for (size_t i = 0; i < n; i++) {
            bad_h += out[i] != shoal_float_to_half(f[i]);
        }
        shoal_reduce_fp16_f16c.load(w, all, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            bad_w += f32_bits(w[i]) != f32_bits(shoal_half_to_float((uint16_t)i));
        }
        tap_ok(bad_h == 0, "fp32 -> fp16 bit-identical to F16C (%zu bad)", bad_h);
        tap_ok(bad_w == 0, "fp16 -> fp32 bit-identical to F16C, all 65536 (%zu bad)", bad_w);
    } else {
        tap_skip(2, "CPU has no F16C");
    }
    if (shoal_reduce_cpu_has_avx2()) {
        shoal_reduce_bf16_avx2.store(out, f, n);
        for (size_t i = 0; i < n; i++) {
            bad_b += out[i] != shoal_float_to_bf16(f[i]);
        }
        shoal_reduce_bf16_avx2.load(w, all, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            bad_bw += f32_bits(w[i]) != f32_bits(shoal_bf16_to_float((uint16_t)i));
        }
        tap_ok(bad_b == 0, "fp32 -> bf16 bit-identical in AVX2 kernels (%zu bad)", bad_b);
        tap_ok(bad_bw == 0, "bf16 -> fp32 bit-identical in AVX2 kernels (%zu bad)", bad_bw);
    } else {
        tap_skip(2, "CPU has no AVX2");
    }
    free(out), free(all), free(w);
#else
    (void)f, (void)n;
    tap_skip(4, "x86 SIMD kernels not built");
#endif
}

static void test_conv_rounding(void)
{
    size_t cap = 1u << 20;
    float *f = malloc(cap * sizeof(float));
    if (f == NULL) {
        tap_bail("out of memory");
    }
    size_t n = probe_floats(f, cap), bad_h = 0, bad_b = 0;
    for (size_t i = 0; i < n; i++) {
        bad_h += !same_h(shoal_float_to_half(f[i]), ref_f2h(f[i]), 0);
        bad_b += !same_h(shoal_float_to_bf16(f[i]), ref_f2bf(f[i]), 1);
    }
    tap_ok(bad_h == 0, "fp32 -> fp16 matches reference RNE on %zu probes (%zu bad)", n, bad_h);
    tap_ok(bad_b == 0, "fp32 -> bf16 matches reference RNE on %zu probes (%zu bad)", n, bad_b);
    test_conv_simd(f, n);
    free(f);
}

static void test_conv_specials(void)
{
    tap_ok(shoal_float_to_half(65504.0f) == 0x7bff && shoal_float_to_half(65519.99f) == 0x7bff &&
               shoal_float_to_half(65520.0f) == 0x7c00 && shoal_float_to_half(1e10f) == 0x7c00 &&
               shoal_float_to_half(-INFINITY) == 0xfc00,
           "fp16 overflow: 65519.99 -> max, 65520 -> inf");
    tap_ok(shoal_float_to_half(0x1p-24f) == 0x0001 && shoal_float_to_half(0x1p-25f) == 0 &&
               shoal_float_to_half(0x1.000002p-25f) == 0x0001 &&
               shoal_float_to_half(0x1.8p-24f) == 0x0002 && shoal_float_to_half(-0.0f) == 0x8000,
           "fp16 subnormals and underflow round to nearest even");
    tap_ok(shoal_float_to_bf16(0x1.fep127f) == 0x7f7f && shoal_float_to_bf16(0x1.ffp127f) == 0x7f80 &&
               shoal_float_to_bf16(f32_of(0x00008000u)) == 0 &&
               shoal_float_to_bf16(f32_of(0x00018000u)) == 0x0002,
           "bf16 overflow to inf, subnormal ties to even");
    uint16_t hn = shoal_float_to_half(f32_of(0x7f800001u)), bn = shoal_float_to_bf16(f32_of(0xff800001u));
    tap_ok((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0 && (bn & 0x7f80) == 0x7f80 &&
               (bn & 0x7f) != 0 && (bn & 0x8000) != 0,
           "NaN with only low payload bits stays NaN (fp16 %#x, bf16 %#x)", hn, bn);
}

/* Two NaNs of different payloads: SUM and PROD (AVG reduces as SUM) give the first operand's
 * NaN, quieted, whichever kernel runs: out of place (k2), dst == a (acc), dst == b (racc),
 * reduce_n with dst == srcs[0] or not, and every count (vector body and scalar tail). The
 * collectives run the in-place and out-of-place calls through different kernels, so any
 * difference here is a difference between ranks' or between in-place and out-of-place
 * results. The patterns are quiet NaNs, so the first operand's bits come back exactly. */
static void test_nan_order(int dt, const char *tag)
{
    enum { N = 40 };
    size_t sz = shoal_dtype_size(dt);
    unsigned char first[8], second[8], a[N * 8], b[N * 8], c[N * 8], d[N * 8];
    size_t bad = 0, where = 0;
    const char *what = "";
    uint64_t p1, p2;

    switch (dt) {
    case SHOAL_FLOAT16: p1 = 0x7e11, p2 = 0xfe22; break;
    case SHOAL_BFLOAT16: p1 = 0x7fc1, p2 = 0xffc2; break;
    case SHOAL_FLOAT32: p1 = 0x7fc00011u, p2 = 0xffc00022u; break;
    default: p1 = 0x7ff8000000000011ull, p2 = 0xfff8000000000022ull; break;
    }
    memcpy(first, &p1, sz); /* little-endian: the low sz bytes */
    memcpy(second, &p2, sz);
    for (int op = SHOAL_SUM; op <= SHOAL_AVG; op++) {
        if (op == SHOAL_MIN || op == SHOAL_MAX) {
            continue;
        }
        for (size_t n = 1; n <= N; n++) {
            for (int mode = 0; mode < 5; mode++) {
                const void *srcs[3];
                unsigned char *out = d;
                for (size_t i = 0; i < n; i++) {
                    memcpy(a + i * sz, first, sz);
                    memcpy(b + i * sz, second, sz);
                    memcpy(c + i * sz, second, sz);
                }
                switch (mode) {
                case 0: shoal_reduce2(d, a, b, n, dt, op); break;
                case 1: shoal_reduce2(a, a, b, n, dt, op), out = a; break;
                case 2: shoal_reduce2(b, a, b, n, dt, op), out = b; break;
                case 3:
                    srcs[0] = a, srcs[1] = b, srcs[2] = c;
                    shoal_reduce_n(d, srcs, 3, n, dt, op);
                    break;
                default:
                    srcs[0] = a, srcs[1] = b, srcs[2] = c;
                    shoal_reduce_n(a, srcs, 3, n, dt, op), out = a;
                    break;
                }
                for (size_t i = 0; i < n; i++) {
                    if (memcmp(out + i * sz, first, sz) != 0 && bad++ == 0) {
                        static const char *const names[] = {"dst != a, b", "dst == a",
                                                            "dst == b", "reduce_n",
                                                            "reduce_n in place"};
                        what = names[mode], where = n * 1000 + i;
                    }
                }
            }
        }
    }
    if (!tap_ok(bad == 0, "%s%s NaN + NaN and NaN * NaN give the first operand's NaN in every "
                "kernel (%zu bad)", shoal_dtype_name(dt), tag, bad)) {
        tap_diag("first bad: %s, count %zu, element %zu", what, where / 1000, where % 1000);
    }
}

/* ---- misc ------------------------------------------------------------------------------- */

static void test_misc(void)
{
    tap_ok(shoal_reduce_valid(SHOAL_FLOAT32, SHOAL_AVG) && !shoal_reduce_valid(SHOAL_DTYPE_COUNT, SHOAL_SUM) &&
               !shoal_reduce_valid(SHOAL_INT8, SHOAL_OP_COUNT) && !shoal_reduce_valid((shoal_dtype_t)-1, SHOAL_SUM),
           "shoal_reduce_valid");
    int32_t x[4] = {1, 2, 3, 4}, y[4] = {5, 6, 7, 8}, d[4] = {9, 9, 9, 9};
    shoal_reduce2(d, x, y, 4, SHOAL_DTYPE_COUNT, SHOAL_SUM);
    shoal_reduce2(d, x, y, 4, SHOAL_INT32, SHOAL_OP_COUNT);
    tap_ok(d[0] == 9 && d[3] == 9, "invalid dtype/op writes nothing");
    /* Determinism: the same 64 Ki fp32/bf16 inputs give the same bits twice. */
    size_t n = 65536 + 3;
    int ok = 1;
    for (int dt = SHOAL_BFLOAT16; dt <= SHOAL_FLOAT32; dt++) {
        size_t bytes = n * shoal_dtype_size(dt);
        unsigned char *s[4], *d1 = alloc_buf(bytes), *d2 = alloc_buf(bytes);
        for (int k = 0; k < 4; k++) {
            s[k] = alloc_buf(bytes);
            for (size_t i = 0; i < n; i++) {
                gen_elem(dt, s[k] + i * shoal_dtype_size(dt));
            }
        }
        shoal_reduce_n(d1, (const void *const *)s, 4, n, dt, SHOAL_SUM);
        shoal_reduce_n(d2, (const void *const *)s, 4, n, dt, SHOAL_SUM);
        ok &= memcmp(d1, d2, bytes) == 0;
        for (int k = 0; k < 4; k++) {
            free(s[k]);
        }
        free(d1), free(d2);
    }
    tap_ok(ok, "reduce_n is deterministic (bf16, fp32, 64 Ki elements)");
}

static void test_matrix(int dt, const char *tag)
{
    for (int op = 0; op < NOP; op++) {
        test_reduce2(dt, op, tag);
        test_reduce_n(dt, op, tag);
        test_reduce_n_pieces(dt, op, tag);
        test_reduce_n_multi(dt, op, tag);
    }
}

int main(void)
{
    test_conv_roundtrip();
    test_conv_rounding();
    test_conv_specials();
    test_wraparound();
    test_avg_documented();
    test_float_specials();
    for (int dt = 0; dt < NDT; dt++) {
        int simd = is_half(dt) ? shoal_reduce_half_use_simd(1) : 0;
        test_matrix(dt, simd ? " (simd)" : "");
        if (is_half(dt)) {
            test_half_specials(dt);
        }
        if (is_half(dt) || dt == SHOAL_FLOAT32 || dt == SHOAL_FLOAT64) {
            test_nan_order(dt, simd ? " (simd)" : "");
        }
        if (simd) {
            shoal_reduce_half_use_simd(0);
            test_matrix(dt, " (portable)");
            test_half_specials(dt);
            test_nan_order(dt, " (portable)");
            shoal_reduce_half_use_simd(1);
        }
        test_avg(dt);
    }
    test_misc();
    return tap_done();
}
