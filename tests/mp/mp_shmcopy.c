/*
 * mp_shmcopy: one rank of the test of the intra-node AllReduce's copy-saving roads, run under
 * shoalrun by run_shmcopy.sh (every rank on this host, transport shm):
 *  - shoal_mem_alloc buffers on every rank (reduced in place, no staging), every dtype and op,
 *    odd counts, in place and out of place, an offset into the allocation;
 *  - ordinary buffers at the same sizes (single copies where the kernel allows, the staged
 *    two-shot with SHOAL_SHM_CMA=0), and mixed (one rank's buffers shared, the others' not);
 *  - a count, dtype or op that differs across ranks: every rank gets SHOAL_ERR_INVALID_ARG
 *    quickly (not at the timeout), and the next matching call works;
 *  - shoal_mem_alloc / shoal_mem_free argument checks, and a size larger than the host;
 *  - buffers allocated, reduced and freed 80 times: the peers' mappings of freed buffers go;
 *  - "nan": NaNs with each rank's payload, ordinary and shared buffers: in place, out of
 *    place and every rank get the same bits;
 *  - "nodump" (first, before the others): rank 1 is not dumpable and rank 0 drops
 *    CAP_SYS_PTRACE, so rank 0 cannot take rank 1's descriptors: shared buffers are staged.
 * Rank 0 prints one TAP line per group; exit status 1 if anything failed.
 *
 *   shoalrun -n 3 ./tests/mp/mp_shmcopy
 */
#include "tests/mp/mptest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MC_MAX ((size_t)262147)            /* elements of the sweeps (odd) */
#define MC_BUF (MC_MAX * 8 + 4096)
#define MC_FILL 0x5a

static uint8_t *mc_tmpl, *mc_ex;

/* shoal_mem_alloc of more memory than the host has (64 TiB, the largest size it takes) must
 * say SHOAL_ERR_NO_MEMORY: it once reserved the pages of its memfd until memory ran out and
 * the OOM killer struck. Run in a child that offers itself to the OOM killer first, so that a
 * regression kills it, not the test's neighbours: 0 if refused, 1 another status, -1 killed. */
static int mc_alloc_huge(void)
{
    int ws = 0;
    pid_t pid = fork();
    if (pid == 0) {
        void *p = NULL;
        FILE *f = fopen("/proc/self/oom_score_adj", "w");
        if (f != NULL) {
            fputs("1000", f);
            fclose(f);
        }
        alarm(60);
        _exit(shoal_mem_alloc((size_t)1 << 46, &p) == SHOAL_ERR_NO_MEMORY ? 0 : 1);
    }
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) {
        return 1;
    }
    return WIFEXITED(ws) ? WEXITSTATUS(ws) != 0 : -1;
}

static int mc_check(shoal_dtype_t dt, const void *got, size_t count, char *why, size_t len)
{
    size_t d = mp_first_diff(got, mc_ex, count, shoal_dtype_size(dt));
    char a[64], b[64];
    if (d == count) {
        return 1;
    }
    snprintf(why, len, "element %zu of %zu: expected %s got %s", d, count,
             mp_fmt(dt, mc_ex, d, a, sizeof(a)), mp_fmt(dt, got, d, b, sizeof(b)));
    return 0;
}

/* One AllReduce of count elements from s into r (r == s: in place); checks the result, the
 * guard bytes after it and that an out-of-place send buffer is unchanged. */
static void mc_case(const mp_ctx_t *c, int g, shoal_dtype_t dt, shoal_op_t op, size_t count,
                    uint8_t *s, uint8_t *r, const char *what)
{
    size_t bytes = count * shoal_dtype_size(dt);
    char why[256] = "";
    shoal_status_t st;
    int ok;

    memcpy(s, mc_tmpl, bytes);
    memset(s + bytes, MC_FILL, 64);
    if (r != s) {
        memset(r, MC_FILL, bytes + 64);
    }
    st = shoal_allreduce(s, r, count, dt, op, c->comm, NULL);
    ok = st == SHOAL_OK;
    if (!ok) {
        snprintf(why, sizeof(why), "status %s: %s", shoal_status_name(st),
                 shoal_comm_last_error(c->comm));
    } else if (!mc_check(dt, r, count, why, sizeof(why))) {
        ok = 0;
    } else if (r[bytes] != MC_FILL || r[bytes + 63] != MC_FILL) {
        ok = 0;
        snprintf(why, sizeof(why), "wrote past the receive buffer");
    } else if (r != s && memcmp(s, mc_tmpl, bytes) != 0) {
        ok = 0;
        snprintf(why, sizeof(why), "modified the send buffer");
    }
    mp_case(g, ok, c->rank, "%s count %zu %s: %s", what, count,
            r == s ? "in place" : "out of place", why);
}

/* Every dtype and op over a few odd sizes (LL, one-shot, two-shot, direct), with the buffers
 * sb/rb (in place: sb); what names them in the group. */
static void mc_sweep(const mp_ctx_t *c, uint8_t *sb, uint8_t *rb, const char *what)
{
    static const size_t counts[] = {1, 7, 1021, 65537, MC_MAX};
    for (int dt = 0; dt < SHOAL_DTYPE_COUNT; dt++) {
        for (int op = 0; op < SHOAL_OP_COUNT; op++) {
            int g = mp_group("%s: allreduce %s %s", what, shoal_dtype_name(dt),
                             shoal_op_name(op));
            mp_fill(dt, op, c->rank, c->nranks, mc_tmpl, MC_MAX, 0);
            mp_expect(dt, op, c->nranks, mc_ex, MC_MAX, 0);
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
                /* the large sizes for a few combinations only: the sweep stays short */
                if (counts[k] > 1021 && (dt + op) % 3 != 0 && counts[k] != 65537) {
                    continue;
                }
                mc_case(c, g, dt, op, counts[k], sb, rb, what);
                mc_case(c, g, dt, op, counts[k], sb, sb, what);
            }
        }
    }
}

static void mc_test_mem(const mp_ctx_t *c)
{
    void *a = NULL, *b = NULL;
    int g = mp_group("shoal_mem_alloc buffers");
    shoal_status_t st1 = shoal_mem_alloc(MC_BUF, &a), st2 = shoal_mem_alloc(MC_BUF + 1, &b);

    if (!mp_case(g, st1 == SHOAL_OK && st2 == SHOAL_OK && ((uintptr_t)a & 4095) == 0, c->rank,
                 "shoal_mem_alloc: %s %s", shoal_status_name(st1), shoal_status_name(st2))) {
        return;
    }
    mc_sweep(c, a, b, "shared buffers");
    /* an offset into the allocation, odd, both directions */
    g = mp_group("shared buffers at an offset");
    mp_fill(SHOAL_FLOAT32, SHOAL_SUM, c->rank, c->nranks, mc_tmpl, MC_MAX, 0);
    mp_expect(SHOAL_FLOAT32, SHOAL_SUM, c->nranks, mc_ex, MC_MAX, 0);
    mc_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, 100003, (uint8_t *)a + 12, (uint8_t *)b + 4,
            "offset");
    mc_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, 100003, (uint8_t *)a + 12, (uint8_t *)a + 12,
            "offset");
    /* mixed: rank 0 passes shared buffers, the others ordinary ones */
    g = mp_group("mixed shared and ordinary buffers");
    {
        uint8_t *s = c->rank == 0 ? a : mp_alloc(MC_BUF), *r = c->rank == 0 ? b : mp_alloc(MC_BUF);
        mc_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, MC_MAX, s, r, "mixed");
        mc_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, MC_MAX, s, s, "mixed");
        if (c->rank != 0) {
            free(s);
            free(r);
        }
    }
    /* a fresh buffer of the same size after a free: peers map the new one */
    g = mp_group("shared buffers reallocated");
    st1 = shoal_mem_free(b);
    st2 = shoal_mem_alloc(MC_BUF, &b);
    if (mp_case(g, st1 == SHOAL_OK && st2 == SHOAL_OK, c->rank, "free + alloc: %s %s",
                shoal_status_name(st1), shoal_status_name(st2))) {
        mc_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, MC_MAX, a, b, "reallocated");
    }
    g = mp_group("shoal_mem_alloc / shoal_mem_free arguments");
    {
        void *p = NULL;
        int x;
        mp_case(g, shoal_mem_alloc(0, &p) == SHOAL_ERR_INVALID_ARG, c->rank, "size 0");
        mp_case(g, shoal_mem_alloc(64, NULL) == SHOAL_ERR_INVALID_ARG, c->rank, "NULL");
        /* Past the 64 TiB cap: refused before any allocation, as more than the host's memory
         * (shoal.h), like 64 TiB itself below (it was SHOAL_ERR_INVALID_ARG). */
        st1 = shoal_mem_alloc(((size_t)1 << 46) + 1, &p);
        st2 = shoal_mem_alloc(SIZE_MAX, &p);
        mp_case(g, st1 == SHOAL_ERR_NO_MEMORY && st2 == SHOAL_ERR_NO_MEMORY, c->rank,
                "64 TiB + 1: %s, SIZE_MAX: %s (expected SHOAL_ERR_NO_MEMORY)",
                shoal_status_name(st1), shoal_status_name(st2));
        mp_case(g, shoal_mem_free(NULL) == SHOAL_OK, c->rank, "free(NULL)");
        mp_case(g, shoal_mem_free(&x) == SHOAL_ERR_INVALID_ARG, c->rank, "free(stack)");
        mp_case(g, shoal_mem_free((uint8_t *)a + 64) == SHOAL_ERR_INVALID_ARG, c->rank,
                "free(inside)");
        int huge = mc_alloc_huge();
        mp_case(g, c->rank != 0 || huge == 0, c->rank, "64 TiB: %s",
                huge == 0 ? "SHOAL_ERR_NO_MEMORY" : huge > 0 ? "another status"
                                                             : "the process was killed");
    }
    shoal_mem_free(a);
    shoal_mem_free(b);
}

/* The process's mappings of shoal_mem_alloc buffers (its own and its peers'). */
static int mc_mem_mappings(void)
{
    FILE *fp = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;

    if (fp == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), fp) != NULL) {
        n += strstr(line, "/memfd:shoal-mem") != NULL;
    }
    fclose(fp);
    return n;
}

/* A buffer per step, reduced, then freed (an allocator's churn): the peers kept their
 * mappings of freed buffers, up to 64 per process (16 MiB buffers: 1 GiB held). At most the
 * last one of each peer may be left (dropped at the next new buffer). */
static void mc_test_churn(const mp_ctx_t *c)
{
    int g = mp_group("freed shoal_mem_alloc buffers are unmapped by the peers"), bad = 0;
    const size_t count = 1 << 16; /* 256 KiB: the in-place road */
    int n;

    for (int i = 0; i < 80 && !bad; i++) {
        void *v = NULL;
        shoal_status_t st = shoal_mem_alloc(count * sizeof(float), &v);
        float *p = v;
        if (st == SHOAL_OK) {
            for (size_t k = 0; k < count; k++) {
                p[k] = 1.0f;
            }
            st = shoal_allreduce(p, p, count, SHOAL_FLOAT32, SHOAL_SUM, c->comm, NULL);
            bad = st != SHOAL_OK || p[count - 1] != (float)c->nranks;
            shoal_mem_free(p);
        }
        if (!mp_case(g, st == SHOAL_OK && !bad, c->rank, "step %d: %s", i,
                     shoal_status_name(st))) {
            return;
        }
    }
    shoal_barrier(c->comm, NULL);
    n = mc_mem_mappings();
    mp_case(g, n >= 0 && n <= c->nranks - 1, c->rank,
            "%d mappings of shoal_mem_alloc buffers left (at most %d)", n, c->nranks - 1);
}

static void mc_test_plain(const mp_ctx_t *c)
{
    uint8_t *sb = mp_alloc(MC_BUF), *rb = mp_alloc(MC_BUF);
    mc_sweep(c, sb, rb, "ordinary buffers");
    free(sb);
    free(rb);
}

/* A quiet NaN of dtype dt whose sign and payload say which rank sent it. */
static void mc_nan(shoal_dtype_t dt, int rank, void *out)
{
    uint64_t sign = rank & 1, pl = (uint64_t)rank + 1;
    uint16_t h;
    uint32_t f;
    uint64_t d;
    switch (dt) {
    case SHOAL_FLOAT16:
        h = (uint16_t)(sign << 15 | 0x7e00u | (pl & 0x1ff));
        memcpy(out, &h, 2);
        break;
    case SHOAL_BFLOAT16:
        h = (uint16_t)(sign << 15 | 0x7fc0u | (pl & 0x3f));
        memcpy(out, &h, 2);
        break;
    case SHOAL_FLOAT32:
        f = (uint32_t)(sign << 31 | 0x7fc00000u | pl);
        memcpy(out, &f, 4);
        break;
    default:
        d = sign << 63 | 0x7ff8000000000000ull | pl;
        memcpy(out, &d, 8);
        break;
    }
}

/* Every rank sends NaNs with its own payload (and a few numbers): the result's bits must not
 * depend on whether the call is in place, nor on the rank. The kernels differ by aliasing
 * (in place, local rank 1 reduces into its own input), and the compiler put the operands of
 * a float add in either order, so a NaN + NaN took the other rank's payload in some of them. */
static void mc_test_nan_in(const mp_ctx_t *c, uint8_t *s, uint8_t *r, const char *what)
{
    static const shoal_dtype_t dts[] = {SHOAL_FLOAT32, SHOAL_FLOAT64, SHOAL_FLOAT16,
                                        SHOAL_BFLOAT16};
    static const size_t counts[] = {7, 1021, 65537, MC_MAX};
    uint8_t *root = mp_alloc(MC_BUF);
    for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++) {
        shoal_dtype_t dt = dts[t];
        size_t ds = shoal_dtype_size(dt);
        for (int op = SHOAL_SUM; op <= SHOAL_PROD; op++) {
            int g = mp_group("%s: NaN payloads, in place = out of place = rank 0's, %s %s",
                             what, shoal_dtype_name(dt), shoal_op_name(op));
            for (size_t i = 0; i < MC_MAX; i++) {
                if (i % 5 == 4) {
                    mp_store(dt, mc_tmpl, i, c->rank + 1, 0);
                } else {
                    mc_nan(dt, c->rank, mc_tmpl + i * ds);
                }
            }
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
                size_t n = counts[k], bytes = n * ds, d;
                shoal_status_t st1, st2, st3;
                memcpy(s, mc_tmpl, bytes);
                st1 = shoal_allreduce(s, r, n, dt, op, c->comm, NULL);
                memcpy(mc_ex, r, bytes);
                memcpy(s, mc_tmpl, bytes);
                st2 = shoal_allreduce(s, s, n, dt, op, c->comm, NULL);
                st3 = shoal_broadcast(mc_ex, root, n, dt, 0, c->comm, NULL);
                if (!mp_case(g, st1 == SHOAL_OK && st2 == SHOAL_OK && st3 == SHOAL_OK, c->rank,
                             "count %zu: %s %s %s", n, shoal_status_name(st1),
                             shoal_status_name(st2), shoal_status_name(st3))) {
                    continue;
                }
                d = mp_first_diff(s, mc_ex, n, ds);
                mp_case(g, d == n, c->rank, "count %zu: element %zu in place differs", n, d);
                d = mp_first_diff(mc_ex, root, n, ds);
                mp_case(g, d == n, c->rank, "count %zu: element %zu differs from rank 0's", n,
                        d);
            }
        }
    }
    free(root);
}

static void mc_test_nan(const mp_ctx_t *c)
{
    uint8_t *sb = mp_alloc(MC_BUF), *rb = mp_alloc(MC_BUF);
    void *a = NULL, *b = NULL;
    mc_test_nan_in(c, sb, rb, "ordinary buffers");
    free(sb);
    free(rb);
    if (shoal_mem_alloc(MC_BUF, &a) == SHOAL_OK && shoal_mem_alloc(MC_BUF, &b) == SHOAL_OK) {
        mc_test_nan_in(c, a, b, "shared buffers");
    }
    shoal_mem_free(a);
    shoal_mem_free(b);
}

/* Rank 1 passes another count / dtype / op than the others: SHOAL_ERR_INVALID_ARG on every
 * rank, well before the timeout; then a matching call is right. */
static void mc_test_mismatch(const mp_ctx_t *c)
{
    static const struct {
        const char *what;
        size_t count;       /* rank 1: count + dcount */
        size_t dcount;
        shoal_dtype_t dt1;  /* rank 1's dtype */
        shoal_op_t op1;     /* rank 1's op */
    } cases[] = {
        {"count (LL)", 2, 1, SHOAL_FLOAT32, SHOAL_SUM},
        {"count (LL vs one-shot)", 2, 300, SHOAL_FLOAT32, SHOAL_SUM},
        {"count (one-shot)", 300, 1, SHOAL_FLOAT32, SHOAL_SUM},
        {"count (two-shot vs direct)", 9000, 100000, SHOAL_FLOAT32, SHOAL_SUM},
        {"count (direct)", 100000, 1, SHOAL_FLOAT32, SHOAL_SUM},
        {"count (two-shot windows)", 200000, 100000, SHOAL_FLOAT32, SHOAL_SUM},
        {"dtype", 5000, 0, SHOAL_INT32, SHOAL_SUM},
        {"op", 100000, 0, SHOAL_FLOAT32, SHOAL_MAX},
        {"op (LL)", 3, 0, SHOAL_FLOAT32, SHOAL_MIN},
    };
    uint8_t *sb = mp_alloc(MC_BUF * 2), *rb = mp_alloc(MC_BUF * 2);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int g = mp_group("mismatched %s", cases[k].what);
        int one = c->rank == 1;
        size_t count = cases[k].count + (one ? cases[k].dcount : 0);
        shoal_dtype_t dt = one ? cases[k].dt1 : SHOAL_FLOAT32;
        shoal_op_t op = one ? cases[k].op1 : SHOAL_SUM;
        double t0 = mp_now_ms(), ms;
        shoal_status_t st;

        memset(sb, 0, count * 4);
        st = shoal_allreduce(sb, rb, count, dt, op, c->comm, NULL);
        ms = mp_now_ms() - t0;
        mp_case(g, st == SHOAL_ERR_INVALID_ARG && ms < 5000, c->rank,
                "status %s after %.0f ms (expected SHOAL_ERR_INVALID_ARG, quickly)",
                shoal_status_name(st), ms);
        /* the communicator still works */
        mp_fill(SHOAL_FLOAT32, SHOAL_SUM, c->rank, c->nranks, mc_tmpl, MC_MAX, 0);
        mp_expect(SHOAL_FLOAT32, SHOAL_SUM, c->nranks, mc_ex, MC_MAX, 0);
        mc_case(c, g, SHOAL_FLOAT32, SHOAL_SUM, cases[k].count, sb, rb, "after the mismatch");
    }
    free(sb);
    free(rb);
}

/* Before init: rank 1 (SHOAL_RANK) is made not dumpable, and rank 0 gives up CAP_SYS_PTRACE
 * (as root it would reach rank 1 anyway): rank 0 may then neither ptrace rank 1 nor take its
 * descriptors, as with a peer that is not dumpable (credentials changed, a hardened
 * process) or Yama's ptrace_scope 1. */
static void mc_nodump(void)
{
    const char *r = getenv("SHOAL_RANK");
    if (r != NULL && strcmp(r, "1") == 0) {
        prctl(PR_SET_DUMPABLE, 0);
    } else if (r != NULL && strcmp(r, "0") == 0) {
        struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
        struct __user_cap_data_struct d[2];
        if (syscall(SYS_capget, &h, d) == 0) {
            d[0].effective &= ~(1u << CAP_SYS_PTRACE);
            d[0].permitted &= ~(1u << CAP_SYS_PTRACE);
            syscall(SYS_capset, &h, d);
        }
    }
}

int main(int argc, char **argv)
{
    mp_ctx_t c = {0};
    int failed;

    if (argc > 1 && strcmp(argv[1], "nodump") == 0) {
        mc_nodump();
    }
    if (mp_init(&c) != 0) {
        return 1;
    }
    mc_tmpl = mp_alloc(MC_BUF);
    mc_ex = mp_alloc(MC_BUF);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "mem") == 0) {
            mc_test_mem(&c);
        } else if (strcmp(argv[i], "churn") == 0) {
            mc_test_churn(&c);
        } else if (strcmp(argv[i], "plain") == 0) {
            mc_test_plain(&c);
        } else if (strcmp(argv[i], "nan") == 0) {
            mc_test_nan(&c);
        } else if (strcmp(argv[i], "mismatch") == 0 && c.nranks > 1) {
            mc_test_mismatch(&c);
        }
    }
    failed = mp_groups_report(&c);
    shoal_comm_destroy(c.comm);
    free(mc_tmpl);
    free(mc_ex);
    (void)argv;
    return failed != 0 ? 1 : 0;
}
