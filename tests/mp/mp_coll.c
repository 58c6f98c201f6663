/*
 * mp_coll: one rank of the multi-process collective test, run under shoalrun
 * (shoal_comm_init_env). Sweeps every collective with inputs whose results are exact in every
 * dtype, compares against results computed locally, counts failures per group, and combines
 * the groups across ranks: rank 0 prints one TAP line per group on stdout. A failing case
 * prints "# rank R: <group>: ..." with expected vs got on stderr. Exit status 1 if anything
 * failed.
 *
 *   shoalrun -n 4 ./tests/mp/mp_coll [section...]   (sections: see mp_sections below)
 */
#include "tests/mp/mptest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MP_CMAX ((size_t)65537)
#define MP_BIG ((size_t)1048576 + 3)
#define MP_BCAST_BIG ((size_t)4 * 1048576 + 3)
#define MP_BUF_BYTES ((size_t)8 * 1048576 + 65536)
#define MP_GUARD 64
#define MP_FILL 0xA5

static const size_t mp_counts[] = {0, 1, 2, 3, 7, 13, 61, 1021, 65537};
#define MP_NCOUNTS (sizeof(mp_counts) / sizeof(mp_counts[0]))

static uint8_t *mp_sb, *mp_rb, *mp_tmpl, *mp_ex;

static const char *mp_dn(shoal_dtype_t dt)
{
    return shoal_dtype_name(dt);
}

static int mp_guard_ok(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (p[i] != MP_FILL) {
            return 0;
        }
    }
    return 1;
}

/* Compares count elements of got against want; writes a sentence into why on mismatch. */
static int mp_check(shoal_dtype_t dt, const void *got, const void *want, size_t count,
                    char *why, size_t len)
{
    size_t d = mp_first_diff(got, want, count, shoal_dtype_size(dt));
    char a[64], b[64];
    if (d == count) {
        return 1;
    }
    snprintf(why, len, "element %zu of %zu: expected %s got %s", d, count,
             mp_fmt(dt, want, d, a, sizeof(a)), mp_fmt(dt, got, d, b, sizeof(b)));
    return 0;
}

/* ---- allreduce ------------------------------------------------------------------------- */

static void mp_ar_case(const mp_ctx_t *c, int g, shoal_dtype_t dt, shoal_op_t op, size_t count,
                       int inplace, int soff, int roff)
{
    size_t ds = shoal_dtype_size(dt), bytes = count * ds;
    uint8_t *s = mp_sb + soff, *r = inplace ? s : mp_rb + roff;
    char why[256] = "";
    shoal_status_t st;
    int ok;

    memset(mp_sb, MP_FILL, (size_t)soff + bytes + MP_GUARD);
    memcpy(s, mp_tmpl, bytes);
    if (!inplace) {
        memset(mp_rb, MP_FILL, (size_t)roff + bytes + MP_GUARD);
    }
    st = shoal_allreduce(s, r, count, dt, op, c->comm, NULL);
    ok = st == SHOAL_OK;
    if (!ok) {
        snprintf(why, sizeof(why), "status %s: %s", shoal_status_name(st),
                 shoal_comm_last_error(c->comm));
    } else if (!mp_check(dt, r, mp_ex, count, why, sizeof(why))) {
        ok = 0;
    } else if (!mp_guard_ok(r + bytes, MP_GUARD) || (!inplace && !mp_guard_ok(mp_rb, roff))) {
        ok = 0;
        snprintf(why, sizeof(why), "wrote outside the receive buffer");
    } else if (!inplace && memcmp(s, mp_tmpl, bytes) != 0) {
        ok = 0;
        snprintf(why, sizeof(why), "modified the send buffer");
    }
    mp_case(g, ok, c->rank, "count %zu %s soff %d roff %d: %s", count,
            inplace ? "in-place" : "out-of-place", soff, roff, why);
}

static void mp_test_allreduce(const mp_ctx_t *c)
{
    for (int dt = 0; dt < SHOAL_DTYPE_COUNT; dt++) {
        for (int op = 0; op < SHOAL_OP_COUNT; op++) {
            int g = mp_group("allreduce %s %s", mp_dn(dt), shoal_op_name(op));
            mp_fill(dt, op, c->rank, c->nranks, mp_tmpl, MP_CMAX, 0);
            mp_expect(dt, op, c->nranks, mp_ex, MP_CMAX, 0);
            for (size_t k = 0; k < MP_NCOUNTS; k++) {
                mp_ar_case(c, g, dt, op, mp_counts[k], 0, 0, 0);
                mp_ar_case(c, g, dt, op, mp_counts[k], 1, 0, 0);
            }
            /* Unaligned buffers. */
            mp_ar_case(c, g, dt, op, 13, 0, 1 + dt % 3, 1 + (dt + 1) % 3);
            mp_ar_case(c, g, dt, op, 13, 1, 1 + op % 3, 0);
            mp_ar_case(c, g, dt, op, 1021, 0, 1 + op % 3, 1 + (op + 2) % 3);
            mp_ar_case(c, g, dt, op, 1021, 1, 1 + (dt + op) % 3, 0);
            mp_ar_case(c, g, dt, op, MP_CMAX, 0, 3, 1);
        }
    }
}

static void mp_test_allreduce_big(const mp_ctx_t *c)
{
    static const struct {
        shoal_dtype_t dt;
        shoal_op_t op;
    } big[] = {{SHOAL_FLOAT32, SHOAL_SUM}, {SHOAL_BFLOAT16, SHOAL_SUM}, {SHOAL_INT64, SHOAL_MAX}};
    for (size_t k = 0; k < sizeof(big) / sizeof(big[0]); k++) {
        int g = mp_group("allreduce %s %s", mp_dn(big[k].dt), shoal_op_name(big[k].op));
        mp_fill(big[k].dt, big[k].op, c->rank, c->nranks, mp_tmpl, MP_BIG, 0);
        mp_expect(big[k].dt, big[k].op, c->nranks, mp_ex, MP_BIG, 0);
        mp_ar_case(c, g, big[k].dt, big[k].op, MP_BIG, 0, 0, 0);
        mp_ar_case(c, g, big[k].dt, big[k].op, MP_BIG, 1, 1 + (int)k, 0);
    }
}

/* ---- reduce ---------------------------------------------------------------------------- */

static void mp_reduce_case(const mp_ctx_t *c, int g, shoal_dtype_t dt, shoal_op_t op,
                           size_t count, int ci)
{
    size_t bytes = count * shoal_dtype_size(dt);
    int root = ci % c->nranks, me = c->rank == root, inplace = me && ci % 3 == 1;
    uint8_t *r = inplace ? mp_sb : (me || ci % 2 == 1) ? mp_rb : NULL;
    char why[256] = "";
    shoal_status_t st;
    int ok;

    memcpy(mp_sb, mp_tmpl, bytes);
    memset(mp_sb + bytes, MP_FILL, MP_GUARD);
    memset(mp_rb, MP_FILL, bytes + MP_GUARD);
    st = shoal_reduce(mp_sb, r, count, dt, op, root, c->comm, NULL);
    ok = st == SHOAL_OK;
    if (!ok) {
        snprintf(why, sizeof(why), "status %s: %s", shoal_status_name(st),
                 shoal_comm_last_error(c->comm));
    } else if (me && !mp_check(dt, r, mp_ex, count, why, sizeof(why))) {
        ok = 0;
    } else if (me && !mp_guard_ok(r + bytes, MP_GUARD)) {
        ok = 0;
        snprintf(why, sizeof(why), "wrote outside the receive buffer");
    } else if (!inplace && memcmp(mp_sb, mp_tmpl, bytes) != 0) {
        ok = 0;
        snprintf(why, sizeof(why), "modified the send buffer");
    }
    mp_case(g, ok, c->rank, "%s count %zu root %d%s: %s", shoal_op_name(op), count, root,
            inplace ? " in-place" : r == NULL ? " recvbuf NULL" : "", why);
}

static void mp_test_reduce(const mp_ctx_t *c)
{
    static const size_t counts[] = {0, 1, 61, 65537};
    int ci = 0;
    for (int dt = 0; dt < SHOAL_DTYPE_COUNT; dt++) {
        int g = mp_group("reduce %s", mp_dn(dt));
        for (int op = 0; op < SHOAL_OP_COUNT; op++) {
            mp_fill(dt, op, c->rank, c->nranks, mp_tmpl, MP_CMAX, 0);
            mp_expect(dt, op, c->nranks, mp_ex, MP_CMAX, 0);
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
                mp_reduce_case(c, g, dt, op, counts[k], ci++);
            }
        }
    }
}

/* ---- broadcast ------------------------------------------------------------------------- */

static void mp_bcast_case(const mp_ctx_t *c, int g, shoal_dtype_t dt, size_t count, int ci)
{
    size_t bytes = count * shoal_dtype_size(dt);
    int root = (ci * 3 + 1) % c->nranks, me = c->rank == root, inplace = me && ci % 2 == 1;
    char why[256] = "";
    shoal_status_t st;
    int ok;

    mp_fill(dt, SHOAL_MAX, root, c->nranks, mp_tmpl, count, 0);
    memset(mp_rb, MP_FILL, bytes + MP_GUARD);
    if (me) {
        memcpy(inplace ? mp_rb : mp_sb, mp_tmpl, bytes);
    }
    st = shoal_broadcast(me ? (inplace ? mp_rb : mp_sb) : NULL, mp_rb, count, dt, root, c->comm,
                         NULL);
    ok = st == SHOAL_OK;
    if (!ok) {
        snprintf(why, sizeof(why), "status %s: %s", shoal_status_name(st),
                 shoal_comm_last_error(c->comm));
    } else if (!mp_check(dt, mp_rb, mp_tmpl, count, why, sizeof(why))) {
        ok = 0;
    } else if (!mp_guard_ok(mp_rb + bytes, MP_GUARD)) {
        ok = 0;
        snprintf(why, sizeof(why), "wrote outside the receive buffer");
    }
    mp_case(g, ok, c->rank, "count %zu root %d%s: %s", count, root, inplace ? " in-place" : "",
            why);
}

static void mp_test_broadcast(const mp_ctx_t *c)
{
    static const shoal_dtype_t dts[] = {SHOAL_UINT8, SHOAL_INT32, SHOAL_FLOAT16, SHOAL_FLOAT64};
    static const size_t counts[] = {0, 1, 7, 1021, 65537, 300001};
    int ci = 0;
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        int g = mp_group("broadcast %s", mp_dn(dts[d]));
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            mp_bcast_case(c, g, dts[d], counts[k], ci++);
            mp_bcast_case(c, g, dts[d], counts[k], ci++);
        }
        if (dts[d] == SHOAL_UINT8) {
            mp_bcast_case(c, g, dts[d], MP_BCAST_BIG, ci++);
        } else if (dts[d] == SHOAL_FLOAT64) {
            mp_bcast_case(c, g, dts[d], MP_BIG, ci++);
            mp_bcast_case(c, g, dts[d], MP_BIG, ci++);
        }
    }
}

static const char *mp_inplace_name(int inplace)
{
    return inplace == 2 ? " in-place (sendbuf == recvbuf)" : inplace ? " in-place" : "";
}

/* ---- allgather ------------------------------------------------------------------------- */

static void mp_allgather_case(const mp_ctx_t *c, int g, shoal_dtype_t dt, size_t count,
                              int inplace)
{
    size_t bytes = count * shoal_dtype_size(dt), total = bytes * (size_t)c->nranks;
    /* inplace 1: sendbuf at this rank's block of recvbuf; 2: sendbuf == recvbuf */
    uint8_t *s = inplace == 2 ? mp_rb : inplace ? mp_rb + (size_t)c->rank * bytes : mp_sb;
    char why[256] = "";
    shoal_status_t st;
    int ok;

    for (int q = 0; q < c->nranks; q++) {
        mp_fill(dt, SHOAL_MAX, q, c->nranks, mp_ex + (size_t)q * bytes, count, 0);
    }
    memset(mp_rb, MP_FILL, total + MP_GUARD);
    memcpy(s, mp_ex + (size_t)c->rank * bytes, bytes);
    st = shoal_allgather(s, mp_rb, count, dt, c->comm, NULL);
    ok = st == SHOAL_OK;
    if (!ok) {
        snprintf(why, sizeof(why), "status %s: %s", shoal_status_name(st),
                 shoal_comm_last_error(c->comm));
    } else if (!mp_check(dt, mp_rb, mp_ex, count * (size_t)c->nranks, why, sizeof(why))) {
        ok = 0;
    } else if (!mp_guard_ok(mp_rb + total, MP_GUARD)) {
        ok = 0;
        snprintf(why, sizeof(why), "wrote outside the receive buffer");
    }
    mp_case(g, ok, c->rank, "count %zu%s: %s", count, mp_inplace_name(inplace), why);
}

static void mp_test_allgather(const mp_ctx_t *c)
{
    static const shoal_dtype_t dts[] = {SHOAL_INT8, SHOAL_UINT32, SHOAL_BFLOAT16, SHOAL_FLOAT32,
                                        SHOAL_INT64};
    static const size_t counts[] = {0, 1, 3, 1021, 65537};
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        int g = mp_group("allgather %s", mp_dn(dts[d]));
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            mp_allgather_case(c, g, dts[d], counts[k], 0);
            mp_allgather_case(c, g, dts[d], counts[k], 1);
            mp_allgather_case(c, g, dts[d], counts[k], 2);
        }
    }
}

/* ---- reduce_scatter -------------------------------------------------------------------- */

static void mp_rs_case(const mp_ctx_t *c, int g, shoal_dtype_t dt, shoal_op_t op, size_t count,
                       int inplace)
{
    size_t ds = shoal_dtype_size(dt), bytes = count * ds, all = count * (size_t)c->nranks;
    /* inplace 1: recvbuf at this rank's block of sendbuf; 2: recvbuf == sendbuf */
    uint8_t *r = inplace == 2 ? mp_sb : inplace ? mp_sb + (size_t)c->rank * bytes : mp_rb;
    char why[256] = "";
    shoal_status_t st;
    int ok;

    mp_fill(dt, op, c->rank, c->nranks, mp_sb, all, 0);
    memset(mp_sb + all * ds, MP_FILL, MP_GUARD);
    memcpy(mp_tmpl, mp_sb, all * ds);
    mp_expect(dt, op, c->nranks, mp_ex, count, (size_t)c->rank * count);
    memset(mp_rb, MP_FILL, bytes + MP_GUARD);
    st = shoal_reduce_scatter(mp_sb, r, count, dt, op, c->comm, NULL);
    ok = st == SHOAL_OK;
    if (!ok) {
        snprintf(why, sizeof(why), "status %s: %s", shoal_status_name(st),
                 shoal_comm_last_error(c->comm));
    } else if (!mp_check(dt, r, mp_ex, count, why, sizeof(why))) {
        ok = 0;
    } else if (!mp_guard_ok(inplace ? mp_sb + all * ds : mp_rb + bytes, MP_GUARD)) {
        ok = 0;
        snprintf(why, sizeof(why), "wrote outside the receive buffer");
    } else if (!inplace && memcmp(mp_sb, mp_tmpl, all * ds) != 0) {
        ok = 0;
        snprintf(why, sizeof(why), "modified the send buffer");
    }
    mp_case(g, ok, c->rank, "%s count %zu%s: %s", shoal_op_name(op), count,
            mp_inplace_name(inplace), why);
}

static void mp_test_reduce_scatter(const mp_ctx_t *c)
{
    static const size_t counts[] = {0, 1, 7, 1021};
    for (int dt = 0; dt < SHOAL_DTYPE_COUNT; dt++) {
        int g = mp_group("reduce_scatter %s", mp_dn(dt));
        for (int op = 0; op < SHOAL_OP_COUNT; op++) {
            int all_ops = dt == SHOAL_INT32 || dt == SHOAL_FLOAT32 || dt == SHOAL_BFLOAT16;
            if (!all_ops && op != SHOAL_SUM && op != SHOAL_MAX && op != SHOAL_AVG) {
                continue;
            }
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
                mp_rs_case(c, g, dt, op, counts[k], 0);
                mp_rs_case(c, g, dt, op, counts[k], 1);
                mp_rs_case(c, g, dt, op, counts[k], 2);
            }
        }
        if (dt == SHOAL_FLOAT32) {
            mp_rs_case(c, g, dt, SHOAL_SUM, MP_CMAX, 0);
            mp_rs_case(c, g, dt, SHOAL_SUM, MP_CMAX, 1);
            mp_rs_case(c, g, dt, SHOAL_SUM, MP_CMAX, 2);
        }
    }
}

/* ---- quick: a few cases of every collective (the Soft-RoCE VM, tests/vm, where a transfer
 * runs 50-100x slower than natively): small, ragged and pipelined sizes, in place and not ---- */

static void mp_test_quick(const mp_ctx_t *c)
{
    static const struct {
        shoal_dtype_t dt;
        shoal_op_t op;
    } ar[] = {{SHOAL_FLOAT32, SHOAL_SUM}, {SHOAL_INT32, SHOAL_MAX}, {SHOAL_BFLOAT16, SHOAL_SUM}};
    static const size_t counts[] = {0, 1, 61, 65537};
    int ci = 0;
    for (size_t a = 0; a < sizeof(ar) / sizeof(ar[0]); a++) {
        int g = mp_group("quick allreduce %s %s", mp_dn(ar[a].dt), shoal_op_name(ar[a].op));
        mp_fill(ar[a].dt, ar[a].op, c->rank, c->nranks, mp_tmpl, MP_CMAX, 0);
        mp_expect(ar[a].dt, ar[a].op, c->nranks, mp_ex, MP_CMAX, 0);
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            mp_ar_case(c, g, ar[a].dt, ar[a].op, counts[k], 0, 0, 0);
            mp_ar_case(c, g, ar[a].dt, ar[a].op, counts[k], 1, 0, 0);
        }
        mp_ar_case(c, g, ar[a].dt, ar[a].op, 1021, 0, 1 + (int)a, 2);
        mp_reduce_case(c, g, ar[a].dt, ar[a].op, 65537, ci++);
        mp_reduce_case(c, g, ar[a].dt, ar[a].op, 61, ci++);
    }
    int g = mp_group("quick allreduce float32 sum %zu elements", MP_BIG);
    mp_fill(SHOAL_FLOAT32, SHOAL_SUM, c->rank, c->nranks, mp_tmpl, MP_BIG, 0);
    mp_expect(SHOAL_FLOAT32, SHOAL_SUM, c->nranks, mp_ex, MP_BIG, 0);
    mp_ar_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, MP_BIG, 0, 3, 1);
    g = mp_group("quick broadcast uint8");
    for (size_t k = 1; k < sizeof(counts) / sizeof(counts[0]); k++) {
        mp_bcast_case(c, g, SHOAL_UINT8, counts[k], ci++);
        mp_bcast_case(c, g, SHOAL_UINT8, counts[k], ci++);
    }
    g = mp_group("quick allgather float32");
    for (size_t k = 1; k < sizeof(counts) / sizeof(counts[0]); k++) {
        mp_allgather_case(c, g, SHOAL_FLOAT32, counts[k], 0);
        mp_allgather_case(c, g, SHOAL_FLOAT32, counts[k], 1);
    }
    g = mp_group("quick reduce_scatter");
    mp_rs_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, 1, 0);
    mp_rs_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, 1021, 1);
    mp_rs_case(c, g, SHOAL_INT32, SHOAL_MAX, 7, 1);
    mp_rs_case(c, g, SHOAL_INT32, SHOAL_MAX, 65537, 0);
}

/* ---- the rest lives in mp_coll_misc.c ------------------------------------------------------ */

void mp_test_barrier(const mp_ctx_t *c, uint8_t *buf);
void mp_test_sendrecv(const mp_ctx_t *c, uint8_t *sbuf, uint8_t *rbuf);
void mp_test_nonblocking(const mp_ctx_t *c);
void mp_test_split(const mp_ctx_t *c);
void mp_test_invalid(const mp_ctx_t *c);
void mp_test_determinism(const mp_ctx_t *c, uint8_t *a, uint8_t *b, uint8_t *in);
void mp_test_mismatch(const mp_ctx_t *c);
void mp_test_p2pfail(const mp_ctx_t *c);
void mp_test_argcheck(const mp_ctx_t *c);
void mp_test_forked(const mp_ctx_t *c);
void mp_test_splitabort(const mp_ctx_t *c);

static void mp_run_barrier(const mp_ctx_t *c) { mp_test_barrier(c, mp_sb); }
static void mp_run_sendrecv(const mp_ctx_t *c) { mp_test_sendrecv(c, mp_sb, mp_rb); }
static void mp_run_determinism(const mp_ctx_t *c) { mp_test_determinism(c, mp_sb, mp_rb, mp_tmpl); }

static const struct {
    const char *name;
    void (*fn)(const mp_ctx_t *c);
    int named_only; /* run only when named on the command line */
} mp_sections[] = {
    {"invalid", mp_test_invalid},
    {"allreduce", mp_test_allreduce},
    {"allreduce_big", mp_test_allreduce_big},
    {"reduce", mp_test_reduce},
    {"broadcast", mp_test_broadcast},
    {"allgather", mp_test_allgather},
    {"reduce_scatter", mp_test_reduce_scatter},
    {"barrier", mp_run_barrier},
    {"sendrecv", mp_run_sendrecv},
    {"nonblocking", mp_test_nonblocking},
    {"split", mp_test_split},
    {"determinism", mp_run_determinism},
    {"quick", mp_test_quick, 1},
    {"mismatch", mp_test_mismatch, 1},
    {"p2pfail", mp_test_p2pfail, 1},
    {"argcheck", mp_test_argcheck, 1},
    {"forked", mp_test_forked, 1},
    {"splitabort", mp_test_splitabort, 1},
};

static int mp_selected(int argc, char **argv, const char *name)
{
    if (argc <= 1) {
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], name) == 0) {
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    mp_ctx_t c = {0};
    size_t bufsize;
    int failed;

    if (mp_init(&c) != 0) {
        return 1;
    }
    /* The allgather and reduce-scatter cases hold nranks blocks of up to MP_CMAX 8-byte
     * elements (plus offsets and guards): a fixed 8 MiB overran the buffers from 17 ranks on
     * (the API refused the overlapping buffers, then the test's memset crashed). */
    bufsize = (size_t)c.nranks * MP_CMAX * 8 + 65536;
    bufsize = bufsize > MP_BUF_BYTES ? bufsize : MP_BUF_BYTES;
    mp_sb = mp_alloc(bufsize);
    mp_rb = mp_alloc(bufsize);
    mp_tmpl = mp_alloc(bufsize);
    mp_ex = mp_alloc(bufsize);
    for (size_t s = 0; s < sizeof(mp_sections) / sizeof(mp_sections[0]); s++) {
        double t0 = mp_now_ms();
        if (!mp_selected(argc, argv, mp_sections[s].name)) {
            continue;
        }
        if (mp_sections[s].named_only && argc <= 1) {
            continue; /* a subset of the others */
        }
        mp_sections[s].fn(&c);
        if (c.rank == 0 && getenv("MP_TIMING") != NULL) {
            fprintf(stderr, "# %s: %.0f ms\n", mp_sections[s].name, mp_now_ms() - t0);
        }
    }
    failed = mp_groups_report(&c);
    shoal_comm_destroy(c.comm);
    free(mp_sb);
    free(mp_rb);
    free(mp_tmpl);
    free(mp_ex);
    return failed != 0 ? 1 : 0;
}
