/*
 * tl_perf: point-to-point latency and bandwidth of one transport, under the collectives (in
 * the spirit of ib_write_lat / ib_write_bw and ucx_perftest), so that a fabric can be checked
 * before the algorithms are blamed.
 *
 *     shoalrun -n 2 ./tl_perf -t shm|tcp|ucx|ib [-b 8] [-e 64M] [-f 2] [-n 1000] [-w 100]
 *
 * Rank 0 and rank 1 talk through the channel primitives of the core (shoal_chan_isend/irecv,
 * shoal_chan_waitall) over the forced transport. Latency: ping-pong, half the round trip.
 * Bandwidth: rank 0 streams a window of outstanding sends, rank 1 acknowledges each window
 * with a 0-byte message. Every size gets the same warm-up (-w) on every transport.
 */
#include "core/core.h"

#include "perf/perf_args.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TL_PERF_SEQ 0x71000000u

typedef struct {
    const char *tl;
    size_t minb, maxb;
    double factor;
    int iters, warmup, window, check;
} tl_perf_opts_t;

typedef struct {
    struct shoal_comm *comm;
    int rank, peer;
    uint8_t *sbuf, *rbuf;
    shoal_tl_req_t *reqs;      /* window + 1 */
    shoal_tl_req_t **ptrs;
    int *peers;
    uint32_t seq;              /* advances identically on both ranks */
} tl_perf_t;

static double tl_perf_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void tl_perf_usage(void)
{
    fprintf(stderr,
            "usage: shoalrun -n 2 tl_perf -t shm|tcp|ucx|ib [options]\n"
            "  -t, --transport TL    transport to measure (required)\n"
            "  -b, --minbytes SIZE   smallest message (K/M/G suffixes; default 8)\n"
            "  -e, --maxbytes SIZE   largest message (default 64M)\n"
            "  -f, --stepfactor F    multiply sizes by F (default 2)\n"
            "  -n, --iters N         timed iterations per size up to 1 MiB, fewer above\n"
            "                        (N * 1M / size, at least 5; default 1000)\n"
            "  -w, --warmup_iters N  untimed iterations per size, the same for every\n"
            "                        transport (default 100; UCX needs ~100)\n"
            "  -W, --window N        outstanding sends of the bandwidth test (default 32;\n"
            "                        at most 64 MiB in flight)\n"
            "  -c, --check 0|1       check the bytes of each size once (default 1)\n");
}

static int tl_perf_args(int argc, char **argv, tl_perf_opts_t *o)
{
    static const struct option longopts[] = {
        {"transport", required_argument, NULL, 't'}, {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'}, {"stepfactor", required_argument, NULL, 'f'},
        {"iters", required_argument, NULL, 'n'}, {"warmup_iters", required_argument, NULL, 'w'},
        {"window", required_argument, NULL, 'W'}, {"check", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    int c;
    *o = (tl_perf_opts_t){.minb = 8, .maxb = 64u << 20, .factor = 2, .iters = 1000,
                          .warmup = 100, .window = 32, .check = 1};
    while ((c = getopt_long(argc, argv, "t:b:e:f:n:w:W:c:h", longopts, NULL)) != -1) {
        switch (c) {
        case 't': o->tl = optarg; break;
        case 'b': if (perf_arg_size(optarg, &o->minb) != 0) return -1; break;
        case 'e': if (perf_arg_size(optarg, &o->maxb) != 0) return -1; break;
        case 'f': o->factor = atof(optarg); break;
        case 'n': if (perf_arg_int(optarg, 1, 1 << 30, &o->iters) != 0) return -1; break;
        case 'w': if (perf_arg_int(optarg, 0, 1 << 30, &o->warmup) != 0) return -1; break;
        case 'W': if (perf_arg_int(optarg, 1, 1 << 20, &o->window) != 0) return -1; break;
        case 'c': if (perf_arg_int(optarg, 0, 1, &o->check) != 0) return -1; break;
        default: return -1;
        }
    }
    if (o->tl == NULL || o->factor <= 1 || o->iters < 1 || o->warmup < 0 || o->window < 1 ||
        o->minb > o->maxb) {
        return -1;
    }
    return 0;
}

/* Posts and waits n requests (send: to peer) built by the caller in p->reqs[0..n). */
static shoal_status_t tl_perf_wait(tl_perf_t *p, int n)
{
    for (int i = 0; i < n; i++) {
        p->ptrs[i] = &p->reqs[i];
        p->peers[i] = p->peer;
    }
    return shoal_chan_waitall(p->comm, p->ptrs, p->peers, n);
}

/* One ping-pong of size bytes. */
static shoal_status_t tl_perf_pingpong(tl_perf_t *p, size_t size)
{
    uint32_t seq = p->seq++;
    if (p->rank == 0) {
        SHOAL_CHECK(shoal_chan_irecv(p->comm, p->peer, p->rbuf, size, seq, 1, 0, &p->reqs[0]));
        SHOAL_CHECK(shoal_chan_isend(p->comm, p->peer, p->sbuf, size, seq, 0, 0, &p->reqs[1]));
        return tl_perf_wait(p, 2);
    }
    SHOAL_CHECK(shoal_chan_irecv(p->comm, p->peer, p->rbuf, size, seq, 0, 0, &p->reqs[0]));
    SHOAL_CHECK(tl_perf_wait(p, 1));
    SHOAL_CHECK(shoal_chan_isend(p->comm, p->peer, p->sbuf, size, seq, 1, 0, &p->reqs[0]));
    return tl_perf_wait(p, 1);
}

/* One window: rank 0 sends win messages, rank 1 receives them and acknowledges. */
static shoal_status_t tl_perf_stream(tl_perf_t *p, size_t size, int win)
{
    uint32_t seq = p->seq++;
    for (int k = 0; k < win; k++) {
        if (p->rank == 0) {
            SHOAL_CHECK(shoal_chan_isend(p->comm, p->peer, p->sbuf, size, seq, 2, (uint32_t)k,
                                         &p->reqs[k]));
        } else {
            SHOAL_CHECK(shoal_chan_irecv(p->comm, p->peer, p->rbuf, size, seq, 2, (uint32_t)k,
                                         &p->reqs[k]));
        }
    }
    if (p->rank == 0) {
        SHOAL_CHECK(shoal_chan_irecv(p->comm, p->peer, NULL, 0, seq, 3, 0, &p->reqs[win]));
        return tl_perf_wait(p, win + 1);
    }
    SHOAL_CHECK(tl_perf_wait(p, win));
    SHOAL_CHECK(shoal_chan_isend(p->comm, p->peer, NULL, 0, seq, 3, 0, &p->reqs[0]));
    return tl_perf_wait(p, 1);
}

static uint8_t tl_perf_pattern(size_t i, size_t size)
{
    return (uint8_t)(i * 31 + size * 7 + 1);
}

/* One checked ping-pong: both sides send the pattern of this size, each checks what came. */
static shoal_status_t tl_perf_check(tl_perf_t *p, size_t size, long *wrong_p)
{
    long wrong = 0;
    for (size_t i = 0; i < size; i++) {
        p->sbuf[i] = tl_perf_pattern(i, size);
    }
    memset(p->rbuf, 0, size);
    SHOAL_CHECK(tl_perf_pingpong(p, size));
    for (size_t i = 0; i < size; i++) {
        wrong += p->rbuf[i] != tl_perf_pattern(i, size);
    }
    *wrong_p = wrong;
    return SHOAL_OK;
}

static shoal_status_t tl_perf_size(tl_perf_t *p, const tl_perf_opts_t *o, size_t size)
{
    int iters = size <= (1u << 20) ? o->iters
                                   : (int)SHOAL_MAX(5, (long)o->iters * (1l << 20) / (long)size);
    size_t fit = SHOAL_MAX((size_t)1, ((size_t)64 << 20) / SHOAL_MAX(size, (size_t)1));
    int win = (int)SHOAL_MIN((size_t)o->window, fit);
    long wrong = 0;
    double t0, lat, bw, us;

    if (o->check) {
        SHOAL_CHECK(tl_perf_check(p, size, &wrong));
    }
    for (int i = 0; i < o->warmup; i++) {
        SHOAL_CHECK(tl_perf_pingpong(p, size));
    }
    t0 = tl_perf_now_us();
    for (int i = 0; i < iters; i++) {
        SHOAL_CHECK(tl_perf_pingpong(p, size));
    }
    lat = (tl_perf_now_us() - t0) / iters / 2;
    for (int i = 0; i < SHOAL_MIN(o->warmup, 10); i++) {
        SHOAL_CHECK(tl_perf_stream(p, size, win));
    }
    int biters = SHOAL_MAX(3, iters / win);
    t0 = tl_perf_now_us();
    for (int i = 0; i < biters; i++) {
        SHOAL_CHECK(tl_perf_stream(p, size, win));
    }
    us = tl_perf_now_us() - t0;
    bw = (double)size * win * biters / (us * 1e3); /* GB/s */
    if (p->rank == 0) {
        printf("%12zu %8d %10.2f %10.4f %10.3f %6d %8ld\n", size, iters, lat, bw,
               (double)win * biters / us, win, wrong);
        fflush(stdout);
    }
    return SHOAL_OK;
}

static shoal_status_t tl_perf_run(tl_perf_t *p, const tl_perf_opts_t *o)
{
    shoal_status_t st = SHOAL_OK;
    if (p->rank == 0) {
        printf("# tl_perf: transport %s, rank 0 on %s <-> rank 1 on %s\n", o->tl,
               shoal_comm_peer_host(p->comm, 0), shoal_comm_peer_host(p->comm, 1));
        printf("# warmup %d per size, latency = half round trip, bandwidth = %d-deep stream of "
               "sends acknowledged per window (1 GB/s = 1e9 B/s)\n", o->warmup, o->window);
        printf("#%11s %8s %10s %10s %10s %6s %8s\n", "size(B)", "iters", "lat(us)", "bw(GB/s)",
               "Mmsg/s", "window", "#wrong");
    }
    for (size_t size = o->minb; size <= o->maxb && st == SHOAL_OK;) {
        st = tl_perf_size(p, o, size);
        size_t next = (size_t)((double)SHOAL_MAX(size, 1) * o->factor);
        size = next > size ? next : size + 1;
    }
    return st;
}

int main(int argc, char **argv)
{
    tl_perf_opts_t o;
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t comm = NULL;
    tl_perf_t p = {.seq = TL_PERF_SEQ};
    shoal_status_t st;
    int rc = 1;

    if (tl_perf_args(argc, argv, &o) != 0) {
        tl_perf_usage();
        return 2;
    }
    cfg.transport = o.tl;
    st = shoal_comm_init_env(&comm, &cfg);
    if (st != SHOAL_OK) {
        fprintf(stderr, "tl_perf: shoal_comm_init_env (transport %s): %s\n", o.tl,
                shoal_strerror(st));
        return 1;
    }
    int nranks = 0;
    p.comm = comm;
    (void)shoal_comm_rank(comm, &p.rank);
    (void)shoal_comm_size(comm, &nranks);
    p.peer = 1 - p.rank;
    p.sbuf = malloc(SHOAL_MAX(o.maxb, 1));
    p.rbuf = malloc(SHOAL_MAX(o.maxb, 1));
    p.reqs = calloc((size_t)o.window + 1, sizeof(*p.reqs));
    p.ptrs = calloc((size_t)o.window + 1, sizeof(*p.ptrs));
    p.peers = calloc((size_t)o.window + 1, sizeof(*p.peers));
    if (nranks != 2) {
        fprintf(stderr, "tl_perf: run it with 2 ranks (shoalrun -n 2), not %d\n", nranks);
    } else if (p.sbuf == NULL || p.rbuf == NULL || p.reqs == NULL || p.ptrs == NULL ||
               p.peers == NULL) {
        fprintf(stderr, "tl_perf: out of memory for %zu-byte buffers\n", o.maxb);
    } else {
        memset(p.sbuf, 1, SHOAL_MAX(o.maxb, 1)); /* fault the pages in once */
        memset(p.rbuf, 0, SHOAL_MAX(o.maxb, 1));
        st = shoal_barrier(comm, NULL);
        if (st == SHOAL_OK) {
            st = tl_perf_run(&p, &o);
        }
        if (st != SHOAL_OK) {
            fprintf(stderr, "tl_perf: rank %d: %s: %s\n", p.rank, shoal_strerror(st),
                    shoal_comm_last_error(comm));
        } else {
            rc = 0;
        }
    }
    free(p.sbuf);
    free(p.rbuf);
    free(p.reqs);
    free(p.ptrs);
    free(p.peers);
    shoal_comm_destroy(comm);
    return rc;
}
