/*
 * Helpers of the multi-process collective test (mp_coll): exact test values per dtype, the
 * locally computed expected results, and result groups (one TAP line each, combined across
 * ranks with an AllReduce MAX).
 */
#ifndef SHOAL_TESTS_MP_MPTEST_H
#define SHOAL_TESTS_MP_MPTEST_H

#include <shoal.h>

#include <stddef.h>
#include <stdint.h>

#define MP_MAX_GROUPS 256

typedef struct {
    shoal_comm_t comm;
    int rank;
    int nranks;
} mp_ctx_t;

/* ---- groups --------------------------------------------------------------------------- */

/* Returns the index of the group named by fmt (created on first use, same order on every
 * rank because every rank runs the same sequence of cases). */
int mp_group(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Counts one case of group g; a failed case prints "# rank R: <group>: <msg>" on stderr
 * (at most a few per group). Returns ok. */
int mp_case(int g, int ok, int rank, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Combines the failure counts of every rank (INT32 MAX), prints one TAP line per group on
 * rank 0 and the plan; returns the number of failed groups (same on every rank), or -1 when
 * the combining AllReduce itself failed (then the local results are printed). */
int mp_groups_report(const mp_ctx_t *ctx);

/* ---- values --------------------------------------------------------------------------- */

int mp_dtype_signed(shoal_dtype_t dt);
/* Contribution of rank r to element i for op: small integers so that every result is exact
 * in every dtype (SUM/AVG: -1..1 or 0..2; PROD: 1 with at most two factors 2 and a sign;
 * MIN/MAX: -5..5 or 0..10, plus a per-element offset common to all ranks, see mp_offset). */
int64_t mp_val(shoal_op_t op, int sgn, int r, int n, size_t i);
/* Offset added to element i for MIN/MAX (stresses the full width and the sign). */
int64_t mp_offset(shoal_dtype_t dt, shoal_op_t op, size_t i);
/* buf[i] = v + off converted to dt (wrapping for integers; exact for the values used). */
void mp_store(shoal_dtype_t dt, void *buf, size_t i, int64_t v, int64_t off);
/* buf[i] = the library's AVG of an exact sum over n ranks (sum, then divide once). */
void mp_store_avg(shoal_dtype_t dt, void *buf, size_t i, int64_t sum, int n);
/* Fills buf[0..count) with rank r's input for op. */
void mp_fill(shoal_dtype_t dt, shoal_op_t op, int r, int n, void *buf, size_t count, size_t i0);
/* Fills buf[0..count) with the expected result of op over n ranks (elements i0..). */
void mp_expect(shoal_dtype_t dt, shoal_op_t op, int n, void *buf, size_t count, size_t i0);
/* Index of the first element that differs, or count if none. */
size_t mp_first_diff(const void *a, const void *b, size_t count, size_t dsize);
/* Formats element i of buf ("12 (0x0c)", "1.5 (0x3e00)"). */
const char *mp_fmt(shoal_dtype_t dt, const void *buf, size_t i, char *out, size_t len);

/* ---- misc ----------------------------------------------------------------------------- */

/* shoal_comm_init_env, rank and size into ctx; on failure a TAP "not ok" from rank 0, the
 * status on stderr, and -1. */
int mp_init(mp_ctx_t *ctx);
void *mp_alloc(size_t bytes);   /* page-aligned, touched; exits on failure */
uint64_t mp_hash(const void *buf, size_t len);
double mp_now_ms(void);

#endif
