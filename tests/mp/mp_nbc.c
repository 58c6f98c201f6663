/*
 * mp_nbc: one rank of the nonblocking-collective test, run under shoalrun by run_nbc.sh.
 *
 *   mp_nbc ok    several shoal_i* calls of every kind (allreduce, allgather, broadcast,
 *                reduce-scatter, alltoall, barrier, reduce) in flight at once, on the world, on a
 *                copy of it (split, one color) and on halves (split by parity); waited for in
 *                issue order, in reverse, in a shuffled order, and polled with shoal_test;
 *                every result exact. Rank 0 prints one TAP line per group (mptest.c).
 *   mp_nbc overlap  two intra-node AllReduces in flight at once (on two communicators; an
 *                AllReduce and a broadcast on one), the last rank late: the call that does not
 *                need it completes first (nbc_mode_overlap).
 *   mp_nbc mem KIND...  8 nonblocking calls of 4 MiB of each KIND (allreduce, broadcast,
 *                allgather) in flight on a fresh communicator: the process grows by less
 *                than 16 MiB. run_nbc.sh forces algorithms that use no scratch, so that no
 *                pool scratch may be taken for them.
 *   mp_nbc kill  the last rank posts one iallreduce and SIGKILLs itself; every survivor has
 *                four calls in flight on two communicators, and each must complete with an
 *                error naming the victim within the deadline (or with the exact result: only
 *                the AllReduce the victim joined, and the broadcast, where it only receives). Each survivor prints "survivor R: ..." lines for run_nbc.sh.
 *   mp_nbc destroy  rank 0 posts an iallreduce that no other rank joins (they sleep 8 s) and
 *                destroys the communicator: the destroy fails the call at once with
 *                SHOAL_ERR_ABORTED (nbc_mode_destroy), under SHOAL_CHECK_ARGS=1 too.
 */
#include "tests/mp/mptest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBC_CALLS 15

typedef enum { NBC_AR, NBC_AG, NBC_BC, NBC_RS, NBC_A2A, NBC_BAR, NBC_RED } nbc_kind_t;

typedef struct {
    nbc_kind_t kind;
    const char *comm_name;
    shoal_comm_t comm;
    int rank, n;           /* in comm */
    size_t count;
    shoal_dtype_t dt;      /* INT32, INT64 or FLOAT32 */
    shoal_op_t op;         /* SUM or MAX */
    int root;
    int inplace;
    void *s, *r;
    shoal_request_t req;
    shoal_status_t st;
    int done;
} nbc_call_t;

static const char *nbc_kind_name(nbc_kind_t k)
{
    static const char *const names[] = {"iallreduce", "iallgather", "ibroadcast",
                                        "ireduce_scatter", "ialltoall", "ibarrier", "ireduce"};
    return names[k];
}

/* Input element i of rank r (exact in every dtype used). */
static int64_t nbc_in(const nbc_call_t *c, int r, size_t i)
{
    switch (c->kind) {
    case NBC_AR:
    case NBC_RED:
        return c->op == SHOAL_SUM ? r * 7 + (int64_t)(i % 13) : r * 2 + (int64_t)(i % 3);
    case NBC_AG:
        return r * 100000 + (int64_t)(i % 99991);
    case NBC_BC:
        return r == c->root ? (int64_t)(i % 1000003) * 3 + 5 : -1;
    case NBC_RS: /* i runs over n * count */
        return r + (int64_t)(i / c->count) + (int64_t)(i % 5);
    case NBC_A2A: /* i runs over n * count: block i / count goes to that rank */
        return ((int64_t)r * 131 + (int64_t)i * 7) % 1000003;
    case NBC_BAR:
        return 0;
    }
    return 0;
}

static int64_t nbc_want(const nbc_call_t *c, size_t i)
{
    int n = c->n;
    switch (c->kind) {
    case NBC_AR:
    case NBC_RED:
        if (c->op == SHOAL_SUM) {
            return (int64_t)n * (int64_t)(i % 13) + 7LL * n * (n - 1) / 2;
        }
        return (int64_t)(n - 1) * 2 + (int64_t)(i % 3);
    case NBC_AG:
        return (int64_t)(i / c->count) * 100000 + (int64_t)((i % c->count) % 99991);
    case NBC_BC:
        return (int64_t)(i % 1000003) * 3 + 5;
    case NBC_RS: {
        size_t j = (size_t)c->rank * c->count + i;
        return (int64_t)n * (n - 1) / 2 + (int64_t)n * ((int64_t)(j / c->count) + (int64_t)(j % 5));
    }
    case NBC_A2A: /* block i / count came from that rank: its block for me */
        return nbc_in(c, (int)(i / c->count), (size_t)c->rank * c->count + i % c->count);
    case NBC_BAR:
        return 0;
    }
    return 0;
}

static void nbc_set(shoal_dtype_t dt, void *buf, size_t i, int64_t v)
{
    if (dt == SHOAL_INT32) {
        ((int32_t *)buf)[i] = (int32_t)v;
    } else if (dt == SHOAL_INT64) {
        ((int64_t *)buf)[i] = v;
    } else {
        ((float *)buf)[i] = (float)v;
    }
}

static int64_t nbc_get(shoal_dtype_t dt, const void *buf, size_t i)
{
    if (dt == SHOAL_INT32) {
        return ((const int32_t *)buf)[i];
    }
    if (dt == SHOAL_INT64) {
        return ((const int64_t *)buf)[i];
    }
    return (int64_t)((const float *)buf)[i];
}

static int nbc_rank(shoal_comm_t c)
{
    int r = -1;
    (void)shoal_comm_rank(c, &r);
    return r;
}

static int nbc_size(shoal_comm_t c)
{
    int n = 0;
    (void)shoal_comm_size(c, &n);
    return n;
}

static size_t nbc_max1(size_t n)
{
    return n > 0 ? n : 1;
}

static size_t nbc_in_count(const nbc_call_t *c)
{
    if (c->kind == NBC_BAR) {
        return 0;
    }
    return c->kind == NBC_RS || c->kind == NBC_A2A ? c->count * (size_t)c->n : c->count;
}

static size_t nbc_out_count(const nbc_call_t *c)
{
    if (c->kind == NBC_BAR || (c->kind == NBC_RED && c->rank != c->root)) {
        return 0; /* a reduce's result is significant at the root only */
    }
    return c->kind == NBC_AG || c->kind == NBC_A2A ? c->count * (size_t)c->n : c->count;
}

static void nbc_setup(nbc_call_t *c)
{
    size_t ds = shoal_dtype_size(c->dt), in = nbc_in_count(c), out = nbc_out_count(c);
    c->s = mp_alloc(nbc_max1(in) * ds);
    c->r = c->inplace && c->kind != NBC_AG && c->kind != NBC_RS ? c->s
                                                                : mp_alloc(nbc_max1(out) * ds);
    for (size_t i = 0; i < in; i++) {
        nbc_set(c->dt, c->s, i, nbc_in(c, c->rank, i));
    }
    if (c->r != c->s) {
        memset(c->r, 0x5a, out * ds);
    }
    c->req = NULL;
    c->done = 0;
    c->st = SHOAL_ERR_INTERNAL;
}

static shoal_status_t nbc_post(nbc_call_t *c)
{
    switch (c->kind) {
    case NBC_AR:
        return shoal_iallreduce(c->s, c->r, c->count, c->dt, c->op, c->comm, &c->req);
    case NBC_AG:
        return shoal_iallgather(c->s, c->r, c->count, c->dt, c->comm, &c->req);
    case NBC_BC:
        return shoal_ibroadcast(c->s, c->r, c->count, c->dt, c->root, c->comm, &c->req);
    case NBC_RS:
        return shoal_ireduce_scatter(c->s, c->r, c->count, c->dt, c->op, c->comm, &c->req);
    case NBC_A2A:
        return shoal_ialltoall(c->s, c->r, c->count, c->dt, c->comm, &c->req);
    case NBC_BAR:
        return shoal_ibarrier(c->comm, &c->req);
    case NBC_RED:
        return shoal_ireduce(c->s, c->r, c->count, c->dt, c->op, c->root, c->comm, &c->req);
    }
    return SHOAL_ERR_INVALID_ARG;
}

/* Index of the first wrong element, or -1. */
static long nbc_verify(const nbc_call_t *c)
{
    for (size_t i = 0; i < nbc_out_count(c); i++) {
        if (nbc_get(c->dt, c->r, i) != nbc_want(c, i)) {
            return (long)i;
        }
    }
    return -1;
}

static void nbc_free(nbc_call_t *c)
{
    if (c->r != c->s) {
        free(c->r);
    }
    free(c->s);
}

static shoal_status_t nbc_split(shoal_comm_t world, int color, int key, shoal_comm_t *out)
{
    return shoal_comm_split(world, color, key, out);
}

/* The calls of one round: every kind, on three communicators, mixed sizes (the large ones
 * take many pipeline steps with SHOAL_CHUNK_SIZE small). */
static int nbc_round_calls(nbc_call_t *calls, shoal_comm_t w, shoal_comm_t d, shoal_comm_t h,
                           int round)
{
    int nw = nbc_size(w), nh = nbc_size(h);
    size_t big = 65537 + (size_t)round * 1000;
    nbc_call_t tmpl[NBC_CALLS] = {
        {NBC_AR, "world", w, 0, 0, big, SHOAL_INT32, SHOAL_SUM, 0, 0},
        {NBC_AG, "copy", d, 0, 0, 4099, SHOAL_INT32, SHOAL_SUM, 0, 0},
        {NBC_BC, "world", w, 0, 0, big * 2, SHOAL_INT64, SHOAL_SUM, 1 % nw, 0},
        {NBC_RS, "copy", d, 0, 0, 8191, SHOAL_INT32, SHOAL_SUM, 0, 0},
        {NBC_AR, "half", h, 0, 0, 30011, SHOAL_FLOAT32, SHOAL_MAX, 0, 0},
        {NBC_AR, "world", w, 0, 0, 1021, SHOAL_INT32, SHOAL_SUM, 0, 1},
        {NBC_BC, "copy", d, 0, 0, 13, SHOAL_INT32, SHOAL_SUM, nw - 1, 1},
        {NBC_AG, "world", w, 0, 0, 7, SHOAL_INT64, SHOAL_SUM, 0, 0},
        {NBC_RS, "half", h, 0, 0, 3, SHOAL_INT64, SHOAL_SUM, 0, 0},
        {NBC_A2A, "world", w, 0, 0, 5003 + (size_t)round, SHOAL_INT32, SHOAL_SUM, 0, 0},
        {NBC_BAR, "copy", d, 0, 0, 0, SHOAL_INT32, SHOAL_SUM, 0, 0},
        {NBC_A2A, "half", h, 0, 0, 17, SHOAL_INT64, SHOAL_SUM, 0, 1},
        {NBC_BAR, "world", w, 0, 0, 0, SHOAL_INT32, SHOAL_SUM, 0, 0},
        {NBC_RED, "copy", d, 0, 0, big, SHOAL_INT64, SHOAL_SUM, nw - 1, 0},
        {NBC_RED, "half", h, 0, 0, 301, SHOAL_FLOAT32, SHOAL_MAX, 1, 1},
    };
    (void)nh;
    for (int k = 0; k < NBC_CALLS; k++) {
        calls[k] = tmpl[k];
        calls[k].rank = nbc_rank(calls[k].comm);
        calls[k].n = nbc_size(calls[k].comm);
        if ((calls[k].kind == NBC_BC || calls[k].kind == NBC_RED) &&
            calls[k].root >= calls[k].n) {
            calls[k].root = calls[k].n - 1;
        }
        nbc_setup(&calls[k]);
    }
    return NBC_CALLS;
}

static void nbc_check(const mp_ctx_t *ctx, int g, const nbc_call_t *c, int k, const char *how)
{
    long bad = c->st == SHOAL_OK ? nbc_verify(c) : -1;
    mp_case(g, c->st == SHOAL_OK && bad < 0, ctx->rank,
            "%s: call %d (%s on %s, %zu elements): %s%s, element %ld: got %lld want %lld", how, k,
            nbc_kind_name(c->kind), c->comm_name, c->count, shoal_status_name(c->st),
            c->st != SHOAL_OK ? shoal_comm_last_error(c->comm) : "", bad,
            bad >= 0 ? (long long)nbc_get(c->dt, c->r, (size_t)bad) : 0LL,
            bad >= 0 ? (long long)nbc_want(c, (size_t)bad) : 0LL);
}

static int nbc_mode_ok(const mp_ctx_t *ctx)
{
    static const char *const orders[] = {"wait in issue order", "wait in reverse order",
                                         "wait in a shuffled order", "poll with shoal_test",
                                         "a blocking call behind them, then wait"};
    shoal_comm_t d = NULL, h = NULL;
    nbc_call_t calls[NBC_CALLS];
    int g_split = mp_group("split into a copy and halves");
    shoal_status_t st = nbc_split(ctx->comm, 0, ctx->rank, &d);
    shoal_status_t st2 = nbc_split(ctx->comm, ctx->rank % 2, ctx->rank, &h);

    mp_case(g_split, st == SHOAL_OK && st2 == SHOAL_OK, ctx->rank, "split: %s, %s",
            shoal_status_name(st), shoal_status_name(st2));
    if (st != SHOAL_OK || st2 != SHOAL_OK) {
        return mp_groups_report(ctx) != 0;
    }
    for (int round = 0; round < (int)(sizeof(orders) / sizeof(orders[0])); round++) {
        int g = mp_group("%d calls in flight on 3 communicators (every kind), %s", NBC_CALLS,
                         orders[round]);
        int n = nbc_round_calls(calls, ctx->comm, d, h, round);
        int perm[NBC_CALLS];
        for (int k = 0; k < n; k++) {
            st = nbc_post(&calls[k]);
            mp_case(g, st == SHOAL_OK && calls[k].req != NULL, ctx->rank, "post %d (%s): %s", k,
                    nbc_kind_name(calls[k].kind), shoal_status_name(st));
        }
        for (int k = 0; k < n; k++) {
            perm[k] = round == 1 ? n - 1 - k : k;
        }
        if (round == 2) {
            unsigned x = 12345u + (unsigned)ctx->rank * 77u; /* ranks wait in different orders */
            for (int k = n - 1; k > 0; k--) {
                int j;
                x = x * 1103515245u + 12345u;
                j = (int)((x >> 16) % (unsigned)(k + 1));
                int t = perm[k];
                perm[k] = perm[j];
                perm[j] = t;
            }
        }
        if (round == 4) {
            /* A blocking call on the world runs after every call issued before it. */
            int32_t v = ctx->rank, sum = 0;
            st = shoal_allreduce(&v, &sum, 1, SHOAL_INT32, SHOAL_SUM, ctx->comm, NULL);
            mp_case(g, st == SHOAL_OK && sum == ctx->nranks * (ctx->nranks - 1) / 2, ctx->rank,
                    "blocking allreduce behind the calls in flight: %s, sum %d",
                    shoal_status_name(st), (int)sum);
        }
        if (round == 3) {
            double t0 = mp_now_ms();
            int left = n;
            while (left > 0 && mp_now_ms() - t0 < 120000) {
                for (int k = 0; k < n; k++) {
                    if (!calls[k].done) {
                        int done = 0;
                        calls[k].st = shoal_test(&calls[k].req, &done);
                        if (done || calls[k].st != SHOAL_OK) {
                            calls[k].done = 1;
                            left--;
                        }
                    }
                }
                usleep(100);
            }
            for (int k = 0; k < n; k++) {
                if (!calls[k].done) {
                    calls[k].st = SHOAL_ERR_TIMEOUT; /* never completed: reported below */
                }
            }
        } else {
            for (int k = 0; k < n; k++) {
                nbc_call_t *c = &calls[perm[k]];
                c->st = shoal_wait(&c->req);
                mp_case(g, c->req == NULL, ctx->rank, "shoal_wait left the handle set");
            }
        }
        for (int k = 0; k < n; k++) {
            nbc_check(ctx, g, &calls[k], k, orders[round]);
            nbc_free(&calls[k]);
        }
    }
    shoal_comm_destroy(h);
    shoal_comm_destroy(d);
    return mp_groups_report(ctx) != 0;
}

/* max(1 s, 5x the slowest rank's time for one blocking AllReduce of count int32 on c), the
 * same on every rank. */
static double nbc_overlap_delay(const mp_ctx_t *ctx, shoal_comm_t c, size_t count)
{
    int32_t *buf = calloc(count, sizeof(*buf));
    double t, t_max = 0;

    if (buf == NULL) {
        return 1000;
    }
    (void)shoal_barrier(ctx->comm, NULL);
    t = mp_now_ms();
    (void)shoal_allreduce(buf, buf, count, SHOAL_INT32, SHOAL_SUM, c, NULL);
    t = mp_now_ms() - t;
    free(buf);
    if (shoal_allreduce(&t, &t_max, 1, SHOAL_FLOAT64, SHOAL_MAX, ctx->comm, NULL) != SHOAL_OK) {
        t_max = t;
    }
    return t_max * 5 > 1000 ? t_max * 5 : 1000;
}

/* Two AllReduces in flight at once, on one host (the intra-node AllReduce's plans): the last
 * rank posts its call on A (and, in the second part, everything) a delay after the others.
 *  - two communicators: every other rank's AllReduce on B must complete while the one on A
 *    still waits for the late rank (before that rank posts it);
 *  - one communicator: an AllReduce, then a small broadcast from rank 0: the broadcast must
 *    complete on the ranks that only need rank 0 while the AllReduce before it still waits
 *    (its plan uses no channel, so the broadcast's plan moves meanwhile).
 * Sizes: LL (8 B), one-shot (32 KiB), two-shot or direct (4 MiB). Results exact. */
static int nbc_mode_overlap(const mp_ctx_t *ctx)
{
    static const size_t counts[] = {2, 8192, (size_t)1 << 20};
    double delay_ms = 1000;
    int late = ctx->nranks - 1;
    shoal_comm_t a = NULL, b = NULL;
    int g_split = mp_group("two copies of the world");
    shoal_status_t st = nbc_split(ctx->comm, 0, ctx->rank, &a);
    shoal_status_t st2 = nbc_split(ctx->comm, 0, ctx->rank, &b);

    mp_case(g_split, st == SHOAL_OK && st2 == SHOAL_OK, ctx->rank, "split: %s, %s",
            shoal_status_name(st), shoal_status_name(st2));
    if (st != SHOAL_OK || st2 != SHOAL_OK) {
        return mp_groups_report(ctx) != 0;
    }
    for (size_t s = 0; s < sizeof(counts) / sizeof(counts[0]); s++) {
        size_t count = counts[s];
        int g2 = mp_group("iallreduce %zu B on A and on B, rank %d late on A: B done first",
                          count * 4, late);
        int g1 = mp_group("iallreduce %zu B, ibroadcast on one comm, rank %d late: bcast first",
                          count * 4, late);
        nbc_call_t ca = {NBC_AR, "A", a, 0, 0, count, SHOAL_INT32, SHOAL_SUM, 0, 0};
        nbc_call_t cb = {NBC_AR, "B", b, 0, 0, count, SHOAL_INT32, SHOAL_SUM, 0, 0};
        nbc_call_t cc = {NBC_BC, "A", a, 0, 0, 16, SHOAL_INT32, SHOAL_SUM, 0, 0};
        nbc_call_t *calls[3] = {&ca, &cb, &cc};
        double t0, t_first;
        int done = 0;

        for (int k = 0; k < 3; k++) {
            calls[k]->rank = nbc_rank(calls[k]->comm);
            calls[k]->n = nbc_size(calls[k]->comm);
            nbc_setup(calls[k]);
        }
        /* The late rank's delay: at least 1 s and 5x one such AllReduce on this build (a
         * sanitizer build runs 5-15x slower: a fixed second failed under TSan). */
        delay_ms = nbc_overlap_delay(ctx, b, count);
        /* part 1: A and B */
        (void)shoal_barrier(ctx->comm, NULL);
        t0 = mp_now_ms();
        if (ctx->rank == late) {
            st = nbc_post(&cb);
            usleep((useconds_t)(delay_ms * 1000));
            st2 = nbc_post(&ca);
        } else {
            st2 = nbc_post(&ca);
            st = nbc_post(&cb);
        }
        mp_case(g2, st == SHOAL_OK && st2 == SHOAL_OK, ctx->rank, "post: %s, %s",
                shoal_status_name(st), shoal_status_name(st2));
        cb.st = shoal_wait(&cb.req);
        t_first = mp_now_ms() - t0;
        if (ctx->rank != late) {
            ca.st = shoal_test(&ca.req, &done);
            mp_case(g2, ca.st == SHOAL_OK && !done && t_first < delay_ms, ctx->rank,
                    "B took %.0f ms (the late rank posts A after %.0f ms), A %s", t_first,
                    delay_ms, done ? "already done" : "still in flight");
        }
        if (ca.req != NULL) {
            ca.st = shoal_wait(&ca.req);
        }
        nbc_check(ctx, g2, &ca, 0, "A");
        nbc_check(ctx, g2, &cb, 1, "B");
        if (ctx->rank == 0) {
            printf("# %zu B: B done after %.1f ms on rank 0, A after the late rank's %.0f ms\n",
                   count * 4, t_first, delay_ms);
        }
        /* part 2: an AllReduce, then a broadcast, on A */
        nbc_free(&ca);
        nbc_setup(&ca);
        (void)shoal_barrier(ctx->comm, NULL);
        t0 = mp_now_ms();
        if (ctx->rank == late) {
            usleep((useconds_t)(delay_ms * 1000));
        }
        st = nbc_post(&ca);
        st2 = nbc_post(&cc);
        mp_case(g1, st == SHOAL_OK && st2 == SHOAL_OK, ctx->rank, "post: %s, %s",
                shoal_status_name(st), shoal_status_name(st2));
        cc.st = shoal_wait(&cc.req);
        t_first = mp_now_ms() - t0;
        if (ctx->rank != late) {
            done = 0;
            ca.st = shoal_test(&ca.req, &done);
            mp_case(g1, ca.st == SHOAL_OK && !done && t_first < delay_ms, ctx->rank,
                    "the broadcast took %.0f ms (the late rank posts after %.0f ms), the "
                    "AllReduce %s", t_first, delay_ms, done ? "already done" : "in flight");
        }
        if (ca.req != NULL) {
            ca.st = shoal_wait(&ca.req);
        }
        nbc_check(ctx, g1, &ca, 0, "AllReduce");
        nbc_check(ctx, g1, &cc, 1, "broadcast");
        if (ctx->rank == 0) {
            printf("# %zu B: the broadcast behind it done after %.1f ms on rank 0\n",
                   count * 4, t_first);
        }
        for (int k = 0; k < 3; k++) {
            nbc_free(calls[k]);
        }
    }
    shoal_comm_destroy(b);
    shoal_comm_destroy(a);
    return mp_groups_report(ctx) != 0;
}

/* Resident size of this process in KiB (VmRSS), -1 if unknown. */
static long nbc_rss_kib(void)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;

    if (fp == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    }
    fclose(fp);
    return kib;
}

/* NBC_MEM_CALLS calls of one kind in flight at once, 4 MiB each, after one call of the same
 * size alone (the algorithm's buffers kept between calls exist then): the process may not
 * grow by more than NBC_MEM_SLACK_KIB. A nonblocking call takes a scratch buffer from the
 * communicator's pool (4 x SHOAL_CHUNK_SIZE, faulted in up to the message size, kept in the
 * pool after the call): one whose algorithm never uses scratch held 8 of them for nothing
 * (28-35 MiB with SHOAL_CHUNK_SIZE=1m, as run_nbc.sh sets). The hierarchical AllReduce's
 * calls beside the first allocate receive slots of their own (6 MiB here, kept by malloc).
 * Every result exact. */
#define NBC_MEM_CALLS 8
#define NBC_MEM_SLACK_KIB (16 * 1024)

static int nbc_mode_mem(const mp_ctx_t *ctx, int nkinds, char **kind_names)
{
    for (int t = 0; t < nkinds; t++) {
        nbc_kind_t kind = strcmp(kind_names[t], "broadcast") == 0   ? NBC_BC
                          : strcmp(kind_names[t], "allgather") == 0 ? NBC_AG
                                                                    : NBC_AR;
        nbc_call_t calls[NBC_MEM_CALLS];
        int g = mp_group("%d %s of 4 MiB in flight: no scratch the algorithm never uses",
                         NBC_MEM_CALLS, nbc_kind_name(kind));
        size_t count = ((size_t)1 << 20) / (kind == NBC_AG ? (size_t)ctx->nranks : 1);
        shoal_comm_t c = NULL; /* a fresh communicator: its pool is empty */
        long rss0, rss1;
        shoal_status_t st = nbc_split(ctx->comm, 0, ctx->rank, &c);

        if (!mp_case(g, st == SHOAL_OK, ctx->rank, "split: %s", shoal_status_name(st))) {
            continue;
        }
        for (int k = 0; k < NBC_MEM_CALLS; k++) {
            nbc_call_t tmpl = {kind, "copy", c, ctx->rank, ctx->nranks, count,
                               SHOAL_INT32, SHOAL_SUM, 0, 1};
            calls[k] = tmpl;
            nbc_setup(&calls[k]);
        }
        /* one call alone first: the algorithm's buffers kept between calls are made now */
        st = nbc_post(&calls[0]);
        calls[0].st = st == SHOAL_OK ? shoal_wait(&calls[0].req) : st;
        nbc_check(ctx, g, &calls[0], 0, "alone");
        nbc_free(&calls[0]);
        nbc_setup(&calls[0]);
        (void)shoal_barrier(c, NULL);
        rss0 = nbc_rss_kib();
        for (int k = 0; k < NBC_MEM_CALLS; k++) {
            st = nbc_post(&calls[k]);
            mp_case(g, st == SHOAL_OK, ctx->rank, "post %d: %s", k, shoal_status_name(st));
        }
        for (int k = 0; k < NBC_MEM_CALLS; k++) {
            calls[k].st = calls[k].req != NULL ? shoal_wait(&calls[k].req) : SHOAL_ERR_INTERNAL;
            nbc_check(ctx, g, &calls[k], k, "in flight");
        }
        rss1 = nbc_rss_kib();
        mp_case(g, rss0 >= 0 && rss1 >= 0 && rss1 - rss0 < NBC_MEM_SLACK_KIB, ctx->rank,
                "grew by %ld KiB (%ld -> %ld; at most %d)", rss1 - rss0, rss0, rss1,
                NBC_MEM_SLACK_KIB);
        if (ctx->rank == 0) {
            printf("# %d %s: rank 0 grew by %ld KiB\n", NBC_MEM_CALLS, nbc_kind_name(kind),
                   rss1 - rss0);
        }
        for (int k = 0; k < NBC_MEM_CALLS; k++) {
            nbc_free(&calls[k]);
        }
        shoal_comm_destroy(c);
    }
    return mp_groups_report(ctx) != 0;
}

/* why names rank as "peer R" or "rank R" (not followed by another digit). */
static int nbc_names_rank(const char *why, int rank)
{
    static const char *const words[] = {"peer ", "rank "};
    char num[16];
    size_t len = (size_t)snprintf(num, sizeof(num), "%d", rank);
    for (int w = 0; w < 2; w++) {
        for (const char *p = strstr(why, words[w]); p != NULL; p = strstr(p + 1, words[w])) {
            const char *q = p + strlen(words[w]);
            if (strncmp(q, num, len) == 0 && (q[len] < '0' || q[len] > '9')) {
                return 1;
            }
        }
    }
    return 0;
}

static int nbc_mode_kill(const mp_ctx_t *ctx)
{
    int victim = ctx->nranks - 1, fails = 0;
    shoal_comm_t d = NULL;
    nbc_call_t calls[4];
    shoal_status_t st = nbc_split(ctx->comm, 0, ctx->rank, &d);
    size_t big = (size_t)2 << 20;

    if (st != SHOAL_OK || shoal_barrier(ctx->comm, NULL) != SHOAL_OK) {
        printf("survivor %d: setup failed: %s\n", ctx->rank, shoal_status_name(st));
        return 1;
    }
    nbc_call_t tmpl[4] = {
        {NBC_AR, "world", ctx->comm, 0, 0, big, SHOAL_FLOAT32, SHOAL_SUM, 0, 0},
        {NBC_AG, "copy", d, 0, 0, big / 8, SHOAL_INT32, SHOAL_SUM, 0, 0},
        {NBC_BC, "world", ctx->comm, 0, 0, big / 4, SHOAL_INT64, SHOAL_SUM, 0, 0},
        {NBC_RS, "copy", d, 0, 0, big / 8, SHOAL_INT32, SHOAL_SUM, 0, 0},
    };
    for (int k = 0; k < 4; k++) {
        calls[k] = tmpl[k];
        calls[k].rank = nbc_rank(calls[k].comm);
        calls[k].n = nbc_size(calls[k].comm);
        nbc_setup(&calls[k]);
    }
    if (ctx->rank == victim) {
        st = nbc_post(&calls[0]);
        usleep(20000);
        kill(getpid(), SIGKILL);
        return 1;
    }
    double t0 = mp_now_ms();
    for (int k = 0; k < 4; k++) {
        st = nbc_post(&calls[k]);
        if (st != SHOAL_OK) {
            calls[k].st = st; /* the communicator may already be failed: a refused post */
            calls[k].done = 1;
        }
    }
    for (int k = 3; k >= 0; k--) {
        nbc_call_t *c = &calls[k];
        const char *why;
        int ok;
        if (!c->done) {
            c->st = shoal_wait(&c->req);
        }
        why = shoal_comm_last_error(c->comm);
        if (c->st == SHOAL_OK) {
            /* Only a call that needs nothing from the victim may finish: the AllReduce it
             * joined, or the broadcast, where it only receives (sends to it can complete
             * into a transport's buffer before its death is known). The allgather and the
             * reduce-scatter need its data, so they must fail. */
            ok = (k == 0 || c->kind == NBC_BC) && nbc_verify(c) < 0;
        } else {
            ok = (c->st == SHOAL_ERR_PEER_FAILED || c->st == SHOAL_ERR_TRANSPORT) &&
                 nbc_names_rank(why, victim);
        }
        printf("survivor %d: call %d %s on %s: %s %s after %.0f ms: %s\n", ctx->rank, k,
               nbc_kind_name(c->kind), c->comm_name, ok ? "ok" : "FAIL",
               shoal_status_name(c->st), mp_now_ms() - t0, c->st == SHOAL_OK ? "result exact" : why);
        fails += !ok;
    }
    fflush(stdout);
    for (int k = 0; k < 4; k++) {
        nbc_free(&calls[k]);
    }
    shoal_comm_destroy(d);
    return fails != 0;
}

/* Rank 0 destroys the communicator with a call in flight that its peers never join; they
 * stay alive meanwhile. Under SHOAL_CHECK_ARGS=1 the call ran whole on the proxy thread,
 * inside the blocking exchange of its arguments, which the destroy did not stop: it waited
 * until the peers exited (8 s here) or SHOAL_TIMEOUT_MS, and the call failed naming a peer. */
static int nbc_mode_destroy(mp_ctx_t *ctx)
{
    float x = 1, y = 0;
    shoal_request_t req = NULL;
    shoal_status_t st, wst;
    double t0, ms;
    int ok;

    /* the communicator in use before, as an application's would be */
    st = shoal_barrier(ctx->comm, NULL);
    if (st != SHOAL_OK) {
        printf("not ok 1 - barrier: %s\n1..1\n", shoal_status_name(st));
        return 1;
    }
    if (ctx->rank != 0) {
        sleep(8);
        return 0;
    }
    st = shoal_iallreduce(&x, &y, 1, SHOAL_FLOAT32, SHOAL_SUM, ctx->comm, &req);
    usleep(100000); /* the proxy is inside the call */
    t0 = mp_now_ms();
    shoal_comm_destroy(ctx->comm);
    ms = mp_now_ms() - t0;
    ctx->comm = NULL;
    wst = st == SHOAL_OK ? shoal_wait(&req) : st;
    ok = st == SHOAL_OK && wst == SHOAL_ERR_ABORTED && ms < 4000;
    printf("%s 1 - destroy with an iallreduce in flight that no peer joins: %.0f ms, the call "
           "%s (expected SHOAL_ERR_ABORTED within 4000 ms)\n1..1\n", ok ? "ok" : "not ok", ms,
           shoal_status_name(wst));
    return !ok;
}

int main(int argc, char **argv)
{
    mp_ctx_t ctx = {0};
    shoal_status_t st = shoal_comm_init_env(&ctx.comm, NULL);
    int rc;
    if (st != SHOAL_OK) {
        printf("Bail out! shoal_comm_init_env: %s\n", shoal_status_name(st));
        return 1;
    }
    ctx.rank = nbc_rank(ctx.comm);
    ctx.nranks = nbc_size(ctx.comm);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "kill") == 0) {
        rc = nbc_mode_kill(&ctx);
    } else if (argc > 1 && strcmp(argv[1], "overlap") == 0) {
        rc = nbc_mode_overlap(&ctx);
    } else if (argc > 1 && strcmp(argv[1], "mem") == 0) {
        rc = nbc_mode_mem(&ctx, argc - 2, argv + 2);
    } else if (argc > 1 && strcmp(argv[1], "destroy") == 0) {
        rc = nbc_mode_destroy(&ctx);
    } else {
        rc = nbc_mode_ok(&ctx);
    }
    if (ctx.comm != NULL) {
        shoal_comm_destroy(ctx.comm);
    }
    return rc;
}
