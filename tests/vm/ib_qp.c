/* ib_qp: what the verbs transport asked of the device, read back from the device.
 *
 *     ib_qp DEV0 DEV1
 *
 * Two ranks (forked), rank r on device DEVr (SHOAL_IB_HCA), every other knob from the
 * environment (SHOAL_IB_ADDR_FAMILY, SHOAL_IB_GID_INDEX, SHOAL_IB_MTU, SHOAL_IB_TC,
 * SHOAL_IB_SL). Each rank connects, exchanges 1 MiB both ways, then queries its queue pair
 * (ibv_query_qp) and checks, against the real sysfs GID table and ports:
 *   - the source GID index is the one chosen, its type is "RoCE v2", its address is of
 *     SHOAL_IB_ADDR_FAMILY (IPv4-mapped for AF_INET; for AF_INET6 not IPv4-mapped, and not
 *     link-local when the table has a global IPv6 GID), or the forced SHOAL_IB_GID_INDEX;
 *   - the destination GID is the peer's published GID;
 *   - the path MTU is min(both ports' active MTU, SHOAL_IB_MTU);
 *   - the GRH traffic class and the service level are SHOAL_IB_TC and SHOAL_IB_SL.
 * Prints TAP (one line per rank and check) and "# rank R: ..." facts. */
#include "core/tl.h"
#include "tests/tap.h"
#include "transports/ib/ib_verbs.h"

#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define QP_NCHECK 6
#define QP_BYTES (1u << 20)

typedef struct {
    pthread_barrier_t bar;
    size_t addr_len[2];
    uint8_t addr[2][SHOAL_TL_ADDR_MAX];
    int active_mtu[2];
    int ok[2][QP_NCHECK];
    char msg[2][QP_NCHECK][240];
} qp_shared_t;

static const char *const qp_checks[QP_NCHECK] = {
    "connects and moves 1 MiB both ways", "source GID: the chosen index, RoCE v2, family",
    "destination GID: the peer's", "path MTU", "traffic class", "service level",
};

static const uint8_t qp_secret[SHOAL_SECRET_BYTES] = "ib-qp-attribute-test-secret-32by";

static void qp_rec(qp_shared_t *sh, int rank, int k, int ok, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void qp_rec(qp_shared_t *sh, int rank, int k, int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sh->msg[rank][k], sizeof(sh->msg[rank][k]), fmt, ap);
    va_end(ap);
    sh->ok[rank][k] = ok ? 1 : -1;
}

static double qp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Sends 1 MiB to the peer and receives its 1 MiB; 0 if both arrived intact. */
static int qp_traffic(const shoal_tl_ops_t *ops, shoal_tl_ctx_t *ctx, shoal_ep_t *ep, int rank,
                      char *why, size_t len)
{
    uint8_t *s = malloc(QP_BYTES), *r = malloc(QP_BYTES);
    shoal_tl_req_t sr = {0}, rr = {0};
    double deadline = qp_now_ms() + 60000;
    int ret = -1;
    if (s == NULL || r == NULL) {
        snprintf(why, len, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < QP_BYTES; i++) {
        s[i] = (uint8_t)(i * 7 + (size_t)rank);
    }
    sr.hdr = (shoal_wire_hdr_t){.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                                .type = SHOAL_WIRE_DATA, .comm_id = 0x9b000001u,
                                .seq = 1, .length = QP_BYTES};
    rr.hdr = sr.hdr;
    sr.buf = s;
    rr.buf = r;
    if (ops->irecv(ep, &rr) != SHOAL_OK || ops->isend(ep, &sr) != SHOAL_OK) {
        snprintf(why, len, "isend/irecv refused");
        goto out;
    }
    while ((!sr.done || !rr.done) && qp_now_ms() < deadline) {
        if (ops->progress(ctx) == 0) {
            struct pollfd p = {.fd = ops->wait_fd(ctx), .events = POLLIN};
            (void)poll(&p, 1, 10);
        }
    }
    if (!sr.done || !rr.done) {
        snprintf(why, len, "not done after 60 s (send %d, receive %d)", sr.done, rr.done);
    } else if (sr.status != SHOAL_OK || rr.status != SHOAL_OK) {
        snprintf(why, len, "send %s, receive %s", shoal_status_name(sr.status),
                 shoal_status_name(rr.status));
    } else {
        ret = 0;
        for (size_t i = 0; i < QP_BYTES && ret == 0; i++) {
            if (r[i] != (uint8_t)(i * 7 + (size_t)(1 - rank))) {
                snprintf(why, len, "byte %zu of the peer's message is wrong", i);
                ret = -1;
            }
        }
    }
out:
    free(s);
    free(r);
    return ret;
}

static int qp_is_v4mapped(const uint8_t *g)
{
    static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g, pre, 12) == 0;
}

/* 1 if the port's GID table (sysfs) has a RoCE v2 GID with a global IPv6 address. */
static int qp_has_global_v6(const char *dev, int port)
{
    for (int i = 0; i < 256; i++) {
        char path[256], text[64], type[32] = "";
        uint8_t raw[16];
        FILE *f;
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
                 dev, port, i);
        if ((f = fopen(path, "r")) == NULL) {
            break;
        }
        if (fgets(type, sizeof(type), f) == NULL) {
            type[0] = '\0';
        }
        fclose(f);
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gids/%d", dev, port, i);
        if ((f = fopen(path, "r")) == NULL || fgets(text, sizeof(text), f) == NULL) {
            if (f != NULL) {
                fclose(f);
            }
            continue;
        }
        fclose(f);
        text[strcspn(text, "\n")] = '\0';
        if (strncmp(type, "RoCE v2", 7) == 0 && shoal_ib_gid_parse(text, raw) == 0 &&
            !qp_is_v4mapped(raw) && !(raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80) &&
            memcmp(raw, (uint8_t[16]){0}, 16) != 0) {
            return 1;
        }
    }
    return 0;
}

static void qp_check_gid(qp_shared_t *sh, shoal_tl_ctx_t *ctx, const struct ibv_qp_attr *a)
{
    int r = ctx->rank, idx = a->ah_attr.grh.sgid_index, v4;
    char text[64], path[256], type[32] = "";
    union ibv_gid g;
    FILE *f;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
             ctx->devname, ctx->addr.port, idx);
    if ((f = fopen(path, "r")) != NULL) {
        if (fgets(type, sizeof(type), f) == NULL) {
            type[0] = '\0';
        }
        fclose(f);
    }
    type[strcspn(type, "\n")] = '\0';
    if (ibv_query_gid(ctx->dev, ctx->addr.port, idx, &g) != 0) {
        qp_rec(sh, r, 1, 0, "ibv_query_gid(%d) failed", idx);
        return;
    }
    shoal_ib_gid_str(g.raw, text, sizeof(text));
    v4 = qp_is_v4mapped(g.raw);
    printf("# rank %d: %s port %d: QP source GID index %d %s (%s)\n", r, ctx->devname,
           ctx->addr.port, idx, text, type);
    if (idx != ctx->gid.index || memcmp(g.raw, ctx->addr.gid, 16) != 0) {
        qp_rec(sh, r, 1, 0, "QP source GID index %d, the transport chose %d", idx,
               ctx->gid.index);
    } else if (shoal_ib_config.gid_index >= 0) {
        qp_rec(sh, r, 1, idx == shoal_ib_config.gid_index, "index %d %s, forced %d", idx,
               text, shoal_ib_config.gid_index);
    } else if (strcmp(type, "RoCE v2") != 0) {
        qp_rec(sh, r, 1, 0, "GID %d %s is of type \"%s\", not RoCE v2", idx, text, type);
    } else if (shoal_ib_config.family == SHOAL_IB_FAMILY_INET) {
        qp_rec(sh, r, 1, v4, "AF_INET: GID %d %s %s IPv4-mapped", idx, text, v4 ? "is" : "is not");
    } else {
        int ll = g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80;
        int global = qp_has_global_v6(ctx->devname, ctx->addr.port);
        qp_rec(sh, r, 1, !v4 && !(ll && global), "AF_INET6: GID %d %s (%s%s)", idx, text,
               v4 ? "IPv4-mapped" : ll ? "link-local" : "global",
               ll && global ? " although the table has a global one" : "");
    }
}

static void qp_check(qp_shared_t *sh, shoal_tl_ctx_t *ctx, shoal_ep_t *ep)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    int r = ctx->rank, want_mtu, mtu;
    char text[64];
    if (ibv_query_qp(ep->qp, &a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV, &ia) != 0) {
        qp_rec(sh, r, 1, 0, "ibv_query_qp failed");
        return;
    }
    printf("# rank %d: QP state %d, path MTU %d, traffic class %u, SL %u, hop limit %u\n", r,
           a.qp_state, shoal_ib_mtu_bytes(a.path_mtu), a.ah_attr.grh.traffic_class,
           a.ah_attr.sl, a.ah_attr.grh.hop_limit);
    qp_check_gid(sh, ctx, &a);
    shoal_ib_gid_str(a.ah_attr.grh.dgid.raw, text, sizeof(text));
    qp_rec(sh, r, 2, memcmp(a.ah_attr.grh.dgid.raw, ep->raddr.gid, 16) == 0,
           "destination GID %s", text);
    want_mtu = SHOAL_MIN(sh->active_mtu[0], sh->active_mtu[1]);
    if (shoal_ib_config.mtu != 0 && shoal_ib_mtu_enum(shoal_ib_config.mtu) < want_mtu) {
        want_mtu = shoal_ib_mtu_enum(shoal_ib_config.mtu);
    }
    mtu = shoal_ib_mtu_bytes(a.path_mtu);
    qp_rec(sh, r, 3, (int)a.path_mtu == want_mtu, "path MTU %d, want %d (active %d and %d, "
           "SHOAL_IB_MTU %u)", mtu, shoal_ib_mtu_bytes(want_mtu),
           shoal_ib_mtu_bytes(sh->active_mtu[0]), shoal_ib_mtu_bytes(sh->active_mtu[1]),
           shoal_ib_config.mtu);
    qp_rec(sh, r, 4, a.ah_attr.grh.traffic_class == shoal_ib_config.tc,
           "traffic class %u, SHOAL_IB_TC %u", a.ah_attr.grh.traffic_class, shoal_ib_config.tc);
    if (a.ah_attr.sl != shoal_ib_config.sl && strncmp(ctx->devname, "rxe", 3) == 0) {
        /* rxe keeps only the GRH and the port of an address vector (rxe_av_from_attr):
         * the SL we set is not read back (RoCE carries it only as a VLAN priority) */
        qp_rec(sh, r, 5, 1, "SL %u, SHOAL_IB_SL %u # SKIP rxe does not store the SL",
               a.ah_attr.sl, shoal_ib_config.sl);
        return;
    }
    qp_rec(sh, r, 5, a.ah_attr.sl == shoal_ib_config.sl, "SL %u, SHOAL_IB_SL %u",
           a.ah_attr.sl, shoal_ib_config.sl);
}

static void qp_child(qp_shared_t *sh, int rank, const char *dev)
{
    const shoal_tl_ops_t *ops = &shoal_tl_ib_ops;
    volatile int abort_flag = 0;
    shoal_tl_params_t p = {.rank = rank, .nranks = 2, .local_rank = rank, .local_size = 1,
                           .comm_id = 0x9b000001u, .secret = qp_secret, .timeout_ms = 60000,
                           .abort_flag = &abort_flag};
    shoal_tl_ctx_t *ctx = NULL;
    shoal_ep_t *ep = NULL;
    size_t len = SHOAL_TL_ADDR_MAX;
    int peer = 1 - rank;
    const void *addr;
    char why[200] = "";
    shoal_status_t st;

    alarm(240);
    shoal_config_global_init();
    shoal_ib_config.hca = dev;
    st = ops->init(&p, &ctx);
    if (st == SHOAL_OK) {
        struct ibv_port_attr pa;
        st = ops->address(ctx, sh->addr[rank], &len);
        sh->addr_len[rank] = len;
        if (ibv_query_port(ctx->dev, ctx->addr.port, &pa) == 0) {
            sh->active_mtu[rank] = pa.active_mtu;
        }
    }
    pthread_barrier_wait(&sh->bar);
    addr = sh->addr[peer];
    if (st == SHOAL_OK) {
        st = ops->connect_all(ctx, &peer, 1, &addr, &sh->addr_len[peer], &ep);
    }
    if (st == SHOAL_OK && qp_traffic(ops, ctx, ep, rank, why, sizeof(why)) != 0) {
        st = SHOAL_ERR_INTERNAL;
    }
    qp_rec(sh, rank, 0, st == SHOAL_OK, "%s on %s: %s %s", st == SHOAL_OK ? "ok" : "failed",
           dev, shoal_status_name(st), why);
    if (st == SHOAL_OK) {
        qp_check(sh, ctx, ep);
    }
    fflush(stdout);
    pthread_barrier_wait(&sh->bar); /* the peer still needs our QP for its traffic */
    if (ctx != NULL) {
        ops->fini(ctx);
    }
    _exit(0);
}

int main(int argc, char **argv)
{
    pthread_barrierattr_t ba;
    qp_shared_t *sh;
    pid_t pids[2];
    int n = 0, failed = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEV0 DEV1\n", argv[0]);
        return 2;
    }
    shoal_config_global_init();
    if (!shoal_tl_ib_ops.query()) {
        tap_skip_all("no usable RDMA device");
        return 0;
    }
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        return 1;
    }
    memset(sh, 0, sizeof(*sh));
    pthread_barrierattr_init(&ba);
    pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sh->bar, &ba, 2);
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            qp_child(sh, r, argv[1 + r]);
        }
    }
    for (int r = 0; r < 2; r++) {
        int status;
        if (pids[r] > 0 && waitpid(pids[r], &status, 0) == pids[r] &&
            !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            printf("# rank %d exited abnormally (status %#x)\n", r, status);
        }
    }
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < QP_NCHECK; k++) {
            int ok = sh->ok[r][k] == 1;
            failed += !ok;
            printf("%s %d - rank %d (%s): %s: %s\n", ok ? "ok" : "not ok", ++n, r, argv[1 + r],
                   qp_checks[k], sh->ok[r][k] == 0 ? "not reached" : sh->msg[r][k]);
        }
    }
    printf("1..%d\n", n);
    return failed != 0;
}
