/*
 * ucx_floor: the floor under a 2-rank small-message AllReduce over UCX on this host. Two
 * processes (a fork) each post a tagged receive, send the same number of bytes to the other
 * and progress the worker until both are done: one exchange, what a 2-rank recursive
 * doubling does per call, with nothing of shoal or MPI around it. The time per exchange is
 * what any library over UCX pays at least; shoal's and Open MPI's 8 B AllReduce times minus
 * it are their own per-call costs.
 *
 *     ucx_floor [-s BYTES] [-n ITERS] [-w WARMUP] [-r REPS] [--plain]
 *
 * By default UCX is set up as shoal's ucx transport sets it up (transports/ucx/ucx_ctx.c):
 * features TAG and WAKEUP, endpoints with peer error handling, UCX_MM_ERROR_HANDLING=y and
 * 2 KiB FIFO elements; receives with a callback and no immediate completion. --plain: UCX's
 * defaults and no error handling (as Open MPI's pml ucx 4.1 sets it up). -s 20 is an 8-byte
 * payload behind shoal's 12-byte short header. Prints the median and the minimum of REPS
 * timed runs in ns per exchange. Every wait is bounded (alarm).
 */
#include "perf/perf_args.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define UF_ADDR_MAX 4096
#define UF_MAX_BYTES 4096
#define UF_MAX_REPS 64

typedef struct {
    volatile int ready[2];
    size_t len[2];
    unsigned char addr[2][UF_ADDR_MAX];
} uf_shared_t;

static void uf_done_cb(void *req, ucs_status_t st, void *user)
{
    *(volatile int *)user = st == UCS_OK ? 1 : -1;
    ucp_request_free(req);
}

static void uf_recv_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user)
{
    (void)info;
    uf_done_cb(req, st, user);
}

static double uf_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int uf_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One exchange; 0, or -1 on a UCX error. */
static int uf_exchange(ucp_worker_h wk, ucp_ep_h ep, void *sbuf, void *rbuf, size_t len)
{
    volatile int rdone = 0, sdone = 0;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                              .cb.recv = uf_recv_cb, .user_data = (void *)&rdone};
    ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                              UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.send = uf_done_cb, .user_data = (void *)&sdone};
    void *r = ucp_tag_recv_nbx(wk, rbuf, len, 1, (ucp_tag_t)-1, &rp);
    void *s = ucp_tag_send_nbx(ep, sbuf, len, 1, &sp);

    if (UCS_PTR_IS_ERR(r) || UCS_PTR_IS_ERR(s)) {
        return -1;
    }
    if (s == NULL) {
        sdone = 1;
    }
    while (rdone == 0 || sdone == 0) {
        ucp_worker_progress(wk);
    }
    return rdone < 0 || sdone < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    size_t len = 20;
    int iters = 200000, warmup = 5000, reps = 5, plain = 0, rank, c, bad;
    static const struct option opts[] = {{"plain", no_argument, NULL, 'p'}, {NULL, 0, NULL, 0}};
    unsigned char sbuf[UF_MAX_BYTES], rbuf[UF_MAX_BYTES];
    double t[UF_MAX_REPS];
    ucp_config_t *cfg;
    ucp_context_h uctx;
    ucp_worker_h wk;
    ucp_ep_h ep;
    ucp_address_t *addr;
    size_t alen;
    uf_shared_t *sh;
    pid_t child;

    while ((c = getopt_long(argc, argv, "s:n:w:r:", opts, NULL)) != -1) {
        switch (c) {
        case 's': bad = perf_arg_size(optarg, &len); break;
        case 'n': bad = perf_arg_int(optarg, 1, 1 << 30, &iters); break;
        case 'w': bad = perf_arg_int(optarg, 0, 1 << 30, &warmup); break;
        case 'r': bad = perf_arg_int(optarg, 1, UF_MAX_REPS, &reps); break;
        case 'p': plain = 1; break;
        default: bad = -1; break;
        }
        if (bad != 0) {
            fprintf(stderr, "usage: ucx_floor [-s BYTES] [-n ITERS] [-w WARMUP] [-r REPS] "
                            "[--plain]\n");
            return 2;
        }
    }
    if (len == 0 || len > UF_MAX_BYTES || iters < 1 || warmup < 0 || reps < 1 ||
        reps > UF_MAX_REPS) {
        fprintf(stderr, "ucx_floor: 1 <= BYTES <= %d, ITERS >= 1, 1 <= REPS <= %d\n",
                UF_MAX_BYTES, UF_MAX_REPS);
        return 2;
    }
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("ucx_floor: mmap");
        return 1;
    }
    fflush(stdout);
    child = fork();
    if (child < 0) {
        perror("ucx_floor: fork");
        return 1;
    }
    rank = child == 0;
    alarm(120); /* a peer that died leaves the other spinning: bounded */

    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) {
        fprintf(stderr, "ucx_floor: ucp_config_read failed\n");
        return 1;
    }
    if (!plain && (ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y") != UCS_OK ||
                   ucp_config_modify(cfg, "MM_FIFO_ELEM_SIZE", "2048") != UCS_OK)) {
        fprintf(stderr, "ucx_floor: rank %d: UCX refused shoal's shared-memory settings\n",
                rank);
        return 1;
    }
    ucp_params_t up = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                       .features = UCP_FEATURE_TAG | (plain ? 0 : UCP_FEATURE_WAKEUP)};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED};
    if (ucp_init(&up, cfg, &uctx) != UCS_OK || ucp_worker_create(uctx, &wp, &wk) != UCS_OK ||
        ucp_worker_get_address(wk, &addr, &alen) != UCS_OK || alen > UF_ADDR_MAX) {
        fprintf(stderr, "ucx_floor: rank %d: UCX init failed\n", rank);
        return 1;
    }
    ucp_config_release(cfg);
    memcpy(sh->addr[rank], addr, alen);
    sh->len[rank] = alen;
    __atomic_store_n(&sh->ready[rank], 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&sh->ready[!rank], __ATOMIC_ACQUIRE)) {
        usleep(100);
    }
    ucp_ep_params_t epp = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      (plain ? 0 : UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE),
        .address = (const ucp_address_t *)sh->addr[!rank],
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
    };
    if (ucp_ep_create(wk, &epp, &ep) != UCS_OK) {
        fprintf(stderr, "ucx_floor: rank %d: ucp_ep_create failed\n", rank);
        return 1;
    }
    memset(sbuf, 0x40 + rank, sizeof(sbuf));
    for (int r = 0; r < reps; r++) {
        double t0 = 0;
        for (int i = 0; i < warmup + iters; i++) {
            if (i == warmup) {
                t0 = uf_now_ns();
            }
            if (uf_exchange(wk, ep, sbuf, rbuf, len) != 0 || rbuf[0] != 0x40 + !rank) {
                fprintf(stderr, "ucx_floor: rank %d: exchange %d failed\n", rank, i);
                return 1;
            }
        }
        t[r] = (uf_now_ns() - t0) / iters;
    }
    if (rank == 0) {
        int st = 1;
        qsort(t, (size_t)reps, sizeof(t[0]), uf_cmp);
        printf("ucx_floor: %zu B exchange, %s setup: median %.1f ns, min %.1f ns (%d runs of "
               "%d)\n", len, plain ? "plain UCX" : "shoal's", t[reps / 2], t[0], reps, iters);
        fflush(stdout);
        if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "ucx_floor: the other rank failed\n");
            return 1;
        }
    }
    /* no teardown handshake: the peer may have exited; the process exit releases UCX */
    return 0;
}
