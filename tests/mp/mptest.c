/* Helpers of mp_coll: exact values, expected results, result groups. See mptest.h. */
#include "tests/mp/mptest.h"

#include "reduce/reduce.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MP_DIAG_PER_GROUP 4

typedef struct {
    char name[96];
    int cases;
    int fails;
} mp_group_t;

static mp_group_t mp_groups[MP_MAX_GROUPS];
static int mp_ngroups;

int mp_group(const char *fmt, ...)
{
    char name[96];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    for (int g = 0; g < mp_ngroups; g++) {
        if (strcmp(mp_groups[g].name, name) == 0) {
            return g;
        }
    }
    if (mp_ngroups == MP_MAX_GROUPS) {
        fprintf(stderr, "mp_coll: too many groups (%s)\n", name);
        exit(3);
    }
    snprintf(mp_groups[mp_ngroups].name, sizeof(mp_groups[mp_ngroups].name), "%s", name);
    return mp_ngroups++;
}

int mp_case(int g, int ok, int rank, const char *fmt, ...)
{
    mp_group_t *grp = &mp_groups[g];
    va_list ap;

    grp->cases++;
    if (ok) {
        return 1;
    }
    if (grp->fails++ < MP_DIAG_PER_GROUP) {
        char msg[512];
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "# rank %d: %s: %s\n", rank, grp->name, msg);
    } else if (grp->fails == MP_DIAG_PER_GROUP + 1) {
        fprintf(stderr, "# rank %d: %s: more failures not shown\n", rank, grp->name);
    }
    return 0;
}

static void mp_groups_print(const int32_t *fails, const char *note)
{
    int nfailed = 0;
    for (int g = 0; g < mp_ngroups; g++) {
        if (fails[g] == 0) {
            printf("ok %d - %s (%d cases)\n", g + 1, mp_groups[g].name, mp_groups[g].cases);
        } else {
            nfailed++;
            printf("not ok %d - %s (%d cases, %d failed%s)\n", g + 1, mp_groups[g].name,
                   mp_groups[g].cases, (int)fails[g], note);
        }
    }
    printf("1..%d\n", mp_ngroups);
    if (nfailed > 0) {
        printf("# %d of %d groups failed\n", nfailed, mp_ngroups);
    }
    fflush(stdout);
}

int mp_groups_report(const mp_ctx_t *ctx)
{
    int32_t n[2] = {mp_ngroups, -mp_ngroups}, fails[MP_MAX_GROUPS];
    shoal_status_t st;
    int nfailed = 0;

    for (int g = 0; g < mp_ngroups; g++) {
        fails[g] = mp_groups[g].fails;
    }
    st = shoal_allreduce(n, n, 2, SHOAL_INT32, SHOAL_MAX, ctx->comm, NULL);
    if (st == SHOAL_OK && (n[0] != mp_ngroups || -n[1] != mp_ngroups)) {
        fprintf(stderr, "# rank %d: ranks ran different numbers of groups (%d..%d, mine %d)\n",
                ctx->rank, -n[1], n[0], mp_ngroups);
        st = SHOAL_ERR_INTERNAL;
    }
    if (st == SHOAL_OK) {
        st = shoal_allreduce(fails, fails, (size_t)mp_ngroups, SHOAL_INT32, SHOAL_MAX, ctx->comm,
                             NULL);
    }
    if (st != SHOAL_OK) {
        fprintf(stderr, "# rank %d: combining the results failed: %s: %s\n", ctx->rank,
                shoal_status_name(st), shoal_comm_last_error(ctx->comm));
        if (ctx->rank == 0) {
            for (int g = 0; g < mp_ngroups; g++) {
                fails[g] = mp_groups[g].fails;
            }
            mp_groups_print(fails, ", rank 0 only: combining failed");
            printf("not ok %d - combining the results of all ranks\n", mp_ngroups + 1);
        }
        return -1;
    }
    for (int g = 0; g < mp_ngroups; g++) {
        nfailed += fails[g] != 0;
    }
    if (ctx->rank == 0) {
        mp_groups_print(fails, " on the worst rank");
    }
    return nfailed;
}

/* ---- values ------------------------------------------------------------------------------ */

int mp_dtype_signed(shoal_dtype_t dt)
{
    return dt != SHOAL_UINT8 && dt != SHOAL_UINT32 && dt != SHOAL_UINT64;
}

int64_t mp_val(shoal_op_t op, int sgn, int r, int n, size_t i)
{
    int64_t c;
    switch (op) {
    case SHOAL_SUM:
    case SHOAL_AVG:
        return (int64_t)(((size_t)r + i) % 3) - (sgn ? 1 : 0);
    case SHOAL_PROD:
        c = 1;
        if ((size_t)r == i % (size_t)n) {
            c *= 2;
        }
        if (n > 1 && (size_t)r == (i + 3) % (size_t)n) {
            c *= 2;
        }
        if (sgn && i % 4 == 0 && (size_t)r == (i / 4) % (size_t)n) {
            c = -c;
        }
        return c;
    default:
        return (int64_t)(((size_t)r * 7 + i * 3) % 11) - (sgn ? 5 : 0);
    }
}

int64_t mp_offset(shoal_dtype_t dt, shoal_op_t op, size_t i)
{
    if (op != SHOAL_MIN && op != SHOAL_MAX) {
        return 0;
    }
    switch (dt) {
    case SHOAL_INT8:
        return i % 3 == 0 ? -120 : i % 3 == 1 ? 120 : 0;
    case SHOAL_UINT8:
        return i % 2 ? 240 : 0;
    case SHOAL_INT32:
        return i % 3 == 0 ? -(INT32_MAX - 10) : i % 3 == 1 ? INT32_MAX - 10 : 0;
    case SHOAL_UINT32:
        return i % 2 ? (int64_t)UINT32_MAX - 20 : 0;
    case SHOAL_INT64:
        return i % 3 == 0 ? -(INT64_MAX - 10) : i % 3 == 1 ? INT64_MAX - 10 : 0;
    case SHOAL_UINT64:
        return i % 2 ? (int64_t)(UINT64_MAX - 20) : 0; /* wraps: v + off is near the top */
    case SHOAL_FLOAT16:
        return i % 2 ? 1024 : 0;
    case SHOAL_BFLOAT16:
        return i % 2 ? 128 : 0;
    case SHOAL_FLOAT32:
        return i % 2 ? 1000000 : 0;
    case SHOAL_FLOAT64:
        return i % 2 ? INT64_C(1000000000000000) : 0;
    default:
        return 0;
    }
}

void mp_store(shoal_dtype_t dt, void *buf, size_t i, int64_t v, int64_t off)
{
    uint64_t w = (uint64_t)v + (uint64_t)off;
    switch (dt) {
    case SHOAL_INT8:
        ((int8_t *)buf)[i] = (int8_t)w;
        break;
    case SHOAL_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)w;
        break;
    case SHOAL_INT32:
        ((int32_t *)buf)[i] = (int32_t)w;
        break;
    case SHOAL_UINT32:
        ((uint32_t *)buf)[i] = (uint32_t)w;
        break;
    case SHOAL_INT64:
        ((int64_t *)buf)[i] = (int64_t)w;
        break;
    case SHOAL_UINT64:
        ((uint64_t *)buf)[i] = w;
        break;
    case SHOAL_FLOAT16:
        ((uint16_t *)buf)[i] = shoal_float_to_half((float)(v + off));
        break;
    case SHOAL_BFLOAT16:
        ((uint16_t *)buf)[i] = shoal_float_to_bf16((float)(v + off));
        break;
    case SHOAL_FLOAT32:
        ((float *)buf)[i] = (float)(v + off);
        break;
    case SHOAL_FLOAT64:
        ((double *)buf)[i] = (double)(v + off);
        break;
    default:
        break;
    }
}

void mp_store_avg(shoal_dtype_t dt, void *buf, size_t i, int64_t sum, int n)
{
    switch (dt) {
    case SHOAL_FLOAT16:
        ((uint16_t *)buf)[i] = shoal_float_to_half((float)sum / (float)n);
        break;
    case SHOAL_BFLOAT16:
        ((uint16_t *)buf)[i] = shoal_float_to_bf16((float)sum / (float)n);
        break;
    case SHOAL_FLOAT32:
        ((float *)buf)[i] = (float)sum / (float)n;
        break;
    case SHOAL_FLOAT64:
        ((double *)buf)[i] = (double)sum / (double)n;
        break;
    default:
        mp_store(dt, buf, i, sum / n, 0); /* integers: truncating division */
        break;
    }
}

void mp_fill(shoal_dtype_t dt, shoal_op_t op, int r, int n, void *buf, size_t count, size_t i0)
{
    int sgn = mp_dtype_signed(dt);
    for (size_t k = 0; k < count; k++) {
        mp_store(dt, buf, k, mp_val(op, sgn, r, n, i0 + k), mp_offset(dt, op, i0 + k));
    }
}

void mp_expect(shoal_dtype_t dt, shoal_op_t op, int n, void *buf, size_t count, size_t i0)
{
    int sgn = mp_dtype_signed(dt);
    for (size_t k = 0; k < count; k++) {
        size_t i = i0 + k;
        int64_t acc = mp_val(op, sgn, 0, n, i);
        for (int r = 1; r < n; r++) {
            int64_t v = mp_val(op, sgn, r, n, i);
            switch (op) {
            case SHOAL_SUM:
            case SHOAL_AVG:
                acc += v;
                break;
            case SHOAL_PROD:
                acc *= v;
                break;
            case SHOAL_MIN:
                acc = v < acc ? v : acc;
                break;
            default:
                acc = v > acc ? v : acc;
                break;
            }
        }
        if (op == SHOAL_AVG) {
            mp_store_avg(dt, buf, k, acc, n);
        } else {
            mp_store(dt, buf, k, acc, mp_offset(dt, op, i));
        }
    }
}

size_t mp_first_diff(const void *a, const void *b, size_t count, size_t dsize)
{
    const uint8_t *pa = a, *pb = b;
    if (memcmp(a, b, count * dsize) == 0) {
        return count;
    }
    for (size_t i = 0; i < count; i++) {
        if (memcmp(pa + i * dsize, pb + i * dsize, dsize) != 0) {
            return i;
        }
    }
    return count;
}

const char *mp_fmt(shoal_dtype_t dt, const void *buf, size_t i, char *out, size_t len)
{
    const uint8_t *p = (const uint8_t *)buf + i * shoal_dtype_size(dt);
    union {
        int8_t i8; uint8_t u8; int32_t i32; uint32_t u32; int64_t i64; uint64_t u64;
        uint16_t h; float f; double d;
    } v;
    memcpy(&v, p, shoal_dtype_size(dt));
    switch (dt) {
    case SHOAL_INT8: snprintf(out, len, "%d", v.i8); break;
    case SHOAL_UINT8: snprintf(out, len, "%u", v.u8); break;
    case SHOAL_INT32: snprintf(out, len, "%" PRId32, v.i32); break;
    case SHOAL_UINT32: snprintf(out, len, "%" PRIu32, v.u32); break;
    case SHOAL_INT64: snprintf(out, len, "%" PRId64, v.i64); break;
    case SHOAL_UINT64: snprintf(out, len, "%" PRIu64, v.u64); break;
    case SHOAL_FLOAT16:
        snprintf(out, len, "%.9g (0x%04x)", (double)shoal_half_to_float(v.h), v.h);
        break;
    case SHOAL_BFLOAT16:
        snprintf(out, len, "%.9g (0x%04x)", (double)shoal_bf16_to_float(v.h), v.h);
        break;
    case SHOAL_FLOAT32: snprintf(out, len, "%.9g (0x%08" PRIx32 ")", (double)v.f, v.u32); break;
    case SHOAL_FLOAT64: snprintf(out, len, "%.17g (0x%016" PRIx64 ")", v.d, v.u64); break;
    default: snprintf(out, len, "?"); break;
    }
    return out;
}

/* ---- misc -------------------------------------------------------------------------------- */

void *mp_alloc(size_t bytes)
{
    size_t len = (bytes + 4095) / 4096 * 4096;
    void *p = aligned_alloc(4096, len > 0 ? len : 4096);
    if (p == NULL) {
        fprintf(stderr, "mp_coll: out of memory (%zu bytes)\n", bytes);
        exit(3);
    }
    memset(p, 0, len > 0 ? len : 4096);
    return p;
}

uint64_t mp_hash(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ p[i]) * 1099511628211ull;
    }
    return h;
}

double mp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int mp_init(mp_ctx_t *ctx)
{
    shoal_status_t st = shoal_comm_init_env(&ctx->comm, NULL);
    if (st != SHOAL_OK) {
        const char *r = getenv("SHOAL_RANK");
        fprintf(stderr, "# rank %s: shoal_comm_init_env failed: %s\n", r ? r : "?",
                shoal_status_name(st));
        if (r == NULL || strcmp(r, "0") == 0) {
            printf("not ok 1 - shoal_comm_init_env: %s\n1..1\n", shoal_status_name(st));
        }
        return -1;
    }
    shoal_comm_rank(ctx->comm, &ctx->rank);
    shoal_comm_size(ctx->comm, &ctx->nranks);
    return 0;
}
