/*
 * ns_coll: one rank of the multi-host check run by tests/netns/netns.sh, started by hand in
 * a network namespace with SHOAL_UID, SHOAL_RANK, SHOAL_NRANKS and SHOAL_HOSTID set.
 *
 * It checks that every channel uses the transport the host layout calls for (shm to a peer
 * with the same host id, tcp to any other; SHOAL_TRANSPORT, when set, wins), then runs
 * allreduce, broadcast, allgather and reduce_scatter at several counts with data whose exact
 * result is known, and sums the wrong elements over all ranks. Rank 0 prints TAP (one line per
 * check, plan last); every rank exits 0 only when every check passed everywhere.
 * NS_MAX_COUNT=N skips the counts above N elements.
 */
#include "core/core.h"

#include <shoal.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    shoal_comm_t comm;
    int rank;
    int nranks;
    int ntap;
    int nfail;
    void *a;          /* buffers of the largest test, allocated once */
    void *b;
    size_t cap;       /* bytes in each */
} ns_ctx_t;

static const size_t ns_counts[] = {1, 7, 1000, 65539, 1u << 20};
#define NS_NCOUNTS (sizeof(ns_counts) / sizeof(ns_counts[0]))

/* Sums wrong over ranks and reports it on rank 0 as one TAP line. */
static void ns_report(ns_ctx_t *ctx, int64_t wrong, shoal_status_t st, const char *what,
                      size_t count)
{
    int64_t total = st == SHOAL_OK ? wrong : INT64_C(1) << 40;
    shoal_status_t st2 = shoal_allreduce(&total, &total, 1, SHOAL_INT64, SHOAL_SUM, ctx->comm,
                                         NULL);

    ctx->ntap++;
    if (st2 != SHOAL_OK) {
        total = -1;
    }
    if (total != 0) {
        ctx->nfail++;
    }
    if (st != SHOAL_OK || wrong != 0) {
        fprintf(stderr, "rank %d: %s count %zu: %s, %lld wrong\n", ctx->rank, what, count,
                shoal_strerror(st), (long long)wrong);
    }
    if (ctx->rank == 0) {
        printf("%s %d - %s count %zu: %s\n", total == 0 ? "ok" : "not ok", ctx->ntap, what,
               count, total == 0 ? "all elements right on every rank" :
               total < 0 ? "could not collect the result" : "wrong elements (see stderr)");
        fflush(stdout);
    }
}

static void ns_check_channels(ns_ctx_t *ctx)
{
    struct shoal_comm *c = ctx->comm;
    const char *forced = getenv("SHOAL_TRANSPORT");
    int64_t bad = 0, nshm = 0, ntcp = 0;

    for (int p = 0; p < c->nranks; p++) {
        const char *want, *got;

        if (p == c->rank) {
            continue;
        }
        want = forced != NULL && forced[0] != '\0' ? forced :
               c->peers[p].host_id == c->peers[c->rank].host_id ? "shm" : "tcp";
        got = c->chans[p].tl != NULL ? c->chans[p].tl->ops->name : "(none)";
        nshm += strcmp(got, "shm") == 0;
        ntcp += strcmp(got, "tcp") == 0;
        if (strcmp(want, got) != 0) {
            fprintf(stderr, "rank %d: channel to rank %d (%s) uses %s, want %s\n", c->rank, p,
                    c->peers[p].host, got, want);
            bad++;
        }
    }
    if (ctx->rank == 0) {
        printf("# rank 0: %d local ranks; channels: %lld shm, %lld tcp\n", c->local_size,
               (long long)nshm, (long long)ntcp);
    }
    ns_report(ctx, bad, SHOAL_OK, "channel transports match the hosts", (size_t)c->nranks);
}

static void ns_allreduce(ns_ctx_t *ctx, size_t n, int in_place)
{
    float *in = ctx->a, *out = in_place ? ctx->a : ctx->b;
    long nr = ctx->nranks;
    int64_t wrong = 0;
    shoal_status_t st;

    for (size_t i = 0; i < n; i++) {
        in[i] = (float)(ctx->rank + 1 + (long)(i % 7));
        if (!in_place) {
            out[i] = -1.0f;
        }
    }
    st = shoal_allreduce(in, out, n, SHOAL_FLOAT32, SHOAL_SUM, ctx->comm, NULL);
    for (size_t i = 0; st == SHOAL_OK && i < n; i++) {
        wrong += out[i] != (float)(nr * (nr + 1) / 2 + nr * (long)(i % 7));
    }
    ns_report(ctx, wrong, st, in_place ? "allreduce float sum in place" :
              "allreduce float sum", n);
}

static void ns_allreduce_max(ns_ctx_t *ctx, size_t n)
{
    int32_t *in = ctx->a, *out = ctx->b;
    int64_t wrong = 0;
    shoal_status_t st;

    for (size_t i = 0; i < n; i++) {
        in[i] = (int32_t)((ctx->rank * 31 + (long)i) % 101);
        out[i] = -1;
    }
    st = shoal_allreduce(in, out, n, SHOAL_INT32, SHOAL_MAX, ctx->comm, NULL);
    for (size_t i = 0; st == SHOAL_OK && i < n; i++) {
        int32_t want = 0;

        for (int r = 0; r < ctx->nranks; r++) {
            int32_t v = (int32_t)((r * 31 + (long)i) % 101);

            want = v > want ? v : want;
        }
        wrong += out[i] != want;
    }
    ns_report(ctx, wrong, st, "allreduce int32 max", n);
}

static void ns_broadcast(ns_ctx_t *ctx, size_t n, int root)
{
    int32_t *buf = ctx->a;
    int64_t wrong = 0;
    shoal_status_t st;

    for (size_t i = 0; i < n; i++) {
        buf[i] = ctx->rank == root ? (int32_t)(root * 7 + (long)(i % 251)) : -1;
    }
    st = shoal_broadcast(buf, buf, n, SHOAL_INT32, root, ctx->comm, NULL);
    for (size_t i = 0; st == SHOAL_OK && i < n; i++) {
        wrong += buf[i] != (int32_t)(root * 7 + (long)(i % 251));
    }
    ns_report(ctx, wrong, st, root == 0 ? "broadcast int32 root 0" :
              "broadcast int32 root n-1", n);
}

static void ns_allgather(ns_ctx_t *ctx, size_t n)
{
    int32_t *send = ctx->a, *recv = ctx->b;
    size_t total = n * (size_t)ctx->nranks;
    int64_t wrong = 0;
    shoal_status_t st;

    for (size_t i = 0; i < n; i++) {
        send[i] = (int32_t)(ctx->rank * 1000 + (long)(i % 997));
    }
    for (size_t i = 0; i < total; i++) {
        recv[i] = -1;
    }
    st = shoal_allgather(send, recv, n, SHOAL_INT32, ctx->comm, NULL);
    for (size_t i = 0; st == SHOAL_OK && i < total; i++) {
        wrong += recv[i] != (int32_t)((long)(i / n) * 1000 + (long)(i % n % 997));
    }
    ns_report(ctx, wrong, st, "allgather int32", n);
}

static void ns_reduce_scatter(ns_ctx_t *ctx, size_t n)
{
    int32_t *send = ctx->a, *recv = ctx->b;
    size_t total = n * (size_t)ctx->nranks;
    long nr = ctx->nranks;
    int64_t wrong = 0;
    shoal_status_t st;

    for (size_t j = 0; j < total; j++) {
        send[j] = (int32_t)(ctx->rank + (long)(j % 13));
    }
    for (size_t i = 0; i < n; i++) {
        recv[i] = -1;
    }
    st = shoal_reduce_scatter(send, recv, n, SHOAL_INT32, SHOAL_SUM, ctx->comm, NULL);
    for (size_t i = 0; st == SHOAL_OK && i < n; i++) {
        size_t j = (size_t)ctx->rank * n + i;

        wrong += recv[i] != (int32_t)(nr * (nr - 1) / 2 + nr * (long)(j % 13));
    }
    ns_report(ctx, wrong, st, "reduce_scatter int32 sum", n);
}

static int ns_setup(ns_ctx_t *ctx)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_status_t st = shoal_comm_init_env(&ctx->comm, &cfg);
    size_t maxn = ns_counts[NS_NCOUNTS - 1];

    if (st != SHOAL_OK) {
        fprintf(stderr, "ns_coll: shoal_comm_init_env failed: %s\n", shoal_strerror(st));
        printf("Bail out! shoal_comm_init_env failed: %s\n", shoal_strerror(st));
        return -1;
    }
    shoal_comm_rank(ctx->comm, &ctx->rank);
    shoal_comm_size(ctx->comm, &ctx->nranks);
    ctx->cap = maxn * (size_t)ctx->nranks * sizeof(int32_t);
    ctx->a = malloc(ctx->cap);
    ctx->b = malloc(ctx->cap);
    if (ctx->a == NULL || ctx->b == NULL) {
        fprintf(stderr, "ns_coll: out of memory\n");
        return -1;
    }
    memset(ctx->a, 0, ctx->cap);
    memset(ctx->b, 0, ctx->cap);
    return 0;
}

int main(void)
{
    const char *max_count = getenv("NS_MAX_COUNT"); /* skip larger counts */
    ns_ctx_t ctx = {0};
    int rc = 1;

    if (ns_setup(&ctx) != 0) {
        goto out;
    }
    ns_check_channels(&ctx);
    for (size_t k = 0; k < NS_NCOUNTS; k++) {
        size_t n = ns_counts[k];

        if (max_count != NULL && n > (size_t)strtoull(max_count, NULL, 10)) {
            continue;
        }

        ns_allreduce(&ctx, n, 0);
        ns_allreduce(&ctx, n, 1);
        ns_allreduce_max(&ctx, n);
        ns_broadcast(&ctx, n, 0);
        ns_broadcast(&ctx, n, ctx.nranks - 1);
        ns_allgather(&ctx, n);
        ns_reduce_scatter(&ctx, n);
    }
    if (ctx.rank == 0) {
        printf("1..%d\n", ctx.ntap);
    }
    rc = ctx.nfail == 0 ? 0 : 1;
out:
    if (ctx.comm != NULL) {
        if (rc != 0) {
            shoal_comm_abort(ctx.comm);
        }
        shoal_comm_destroy(ctx.comm);
    }
    free(ctx.a);
    free(ctx.b);
    return rc;
}
