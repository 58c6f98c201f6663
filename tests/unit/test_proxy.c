/*
 * The proxy thread under concurrent first use: many threads make their first non-blocking
 * call on a fresh communicator at the same moment, many times over. Exactly one proxy may
 * start (a second one leaked a thread that outlived shoal_comm_destroy, or hung later calls),
 * every result is right, and nothing hangs (a watchdog fails the test instead). Also run
 * under ThreadSanitizer in CI (.ci/run), where the unlocked start was a reported race.
 * And the proxy's deadline across an idle spell between calls (test_idle_gap), and the memory
 * of many small calls in flight (test_many_small).
 */
#include "tests/tap.h"

#include <shoal.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NTHREADS 8
#define COUNT 257

typedef struct {
    shoal_comm_t comm;
    int rank;
    int nranks;
    pthread_barrier_t *go;
    int bad;                   /* first wrong element + 1, or a status below 0 */
} caller_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

/* Threads of the process settle (a root thread ending) within a second; a leaked proxy never
 * does. */
static int threads_back_to(int base)
{
    double end = now_s() + 2.0;
    int n;
    while ((n = thread_count()) > base && now_s() < end) {
        usleep(1000);
    }
    return n;
}

/* One caller: its first iallreduce on the communicator races the others'. Every rank's
 * callers contribute the same values, so any pairing of the ranks' calls gives the sum. */
static void *caller_main(void *arg)
{
    caller_t *c = arg;
    int32_t in[COUNT], out[COUNT];
    shoal_request_t req = NULL;
    shoal_status_t st;

    for (int i = 0; i < COUNT; i++) {
        in[i] = (c->rank + 1) * (i + 1);
        out[i] = -1;
    }
    pthread_barrier_wait(c->go);
    st = shoal_iallreduce(in, out, COUNT, SHOAL_INT32, SHOAL_SUM, c->comm, &req);
    if (st == SHOAL_OK) {
        st = shoal_wait(&req);
    }
    if (st != SHOAL_OK) {
        c->bad = (int)st;
        return NULL;
    }
    for (int i = 0; i < COUNT; i++) {
        if (out[i] != c->nranks * (c->nranks + 1) / 2 * (i + 1)) {
            c->bad = i + 1;
            break;
        }
    }
    return NULL;
}

typedef struct {
    const shoal_uid_t *uid;
    int rank;
    int nranks;
    int nthreads;
    shoal_status_t st;         /* init or destroy status */
    int bad;                   /* a caller's bad, 0 if all fine */
} rank_t;

/* One rank: init, NTHREADS callers released at once, destroy. */
static void *rank_main(void *arg)
{
    rank_t *r = arg;
    shoal_comm_t comm = NULL;
    caller_t callers[NTHREADS];
    pthread_t th[NTHREADS];
    pthread_barrier_t go;

    r->bad = 0;
    r->st = shoal_comm_init(&comm, r->nranks, r->rank, r->uid, NULL);
    if (r->st != SHOAL_OK) {
        return NULL;
    }
    pthread_barrier_init(&go, NULL, (unsigned)r->nthreads);
    for (int t = 0; t < r->nthreads; t++) {
        callers[t] = (caller_t){.comm = comm, .rank = r->rank, .nranks = r->nranks, .go = &go};
        pthread_create(&th[t], NULL, caller_main, &callers[t]);
    }
    for (int t = 0; t < r->nthreads; t++) {
        pthread_join(th[t], NULL);
        if (r->bad == 0) {
            r->bad = callers[t].bad;
        }
    }
    pthread_barrier_destroy(&go);
    r->st = shoal_comm_destroy(comm);
    return NULL;
}

/* reps rounds of nranks ranks (threads of this process) x nthreads callers. */
static void run_rounds(int nranks, int nthreads, int reps)
{
    int base = thread_count(), bad = 0, leaked = 0, round = -1, threads = base;
    shoal_status_t st = SHOAL_OK;
    double t0 = now_s();

    for (int k = 0; k < reps && bad == 0 && st == SHOAL_OK && !leaked; k++) {
        shoal_uid_t uid;
        rank_t ranks[4];
        pthread_t th[4];

        round = k;
        st = shoal_get_unique_id(&uid);
        if (st != SHOAL_OK) {
            break;
        }
        for (int r = 0; r < nranks; r++) {
            ranks[r] = (rank_t){.uid = &uid, .rank = r, .nranks = nranks, .nthreads = nthreads};
            pthread_create(&th[r], NULL, rank_main, &ranks[r]);
        }
        for (int r = 0; r < nranks; r++) {
            pthread_join(th[r], NULL);
            if (st == SHOAL_OK) {
                st = ranks[r].st;
            }
            if (bad == 0) {
                bad = ranks[r].bad;
            }
        }
        threads = threads_back_to(base);
        leaked = threads > base;
    }
    tap_ok(st == SHOAL_OK && bad == 0, "%d rank(s) x %d threads, first iallreduce at once, "
           "%d rounds: %s, %s (round %d)", nranks, nthreads, reps, shoal_status_name(st),
           bad == 0 ? "results right" : bad < 0 ? shoal_status_name((shoal_status_t)bad)
                                               : "wrong result", round);
    tap_ok(!leaked, "%d rank(s) x %d threads: no thread left after destroy (%d threads, %d "
           "before; a second proxy leaks one) (round %d)", nranks, nthreads, threads, base,
           round);
    tap_diag("%d rounds in %.2f s", round + 1, now_s() - t0);
}

/* One rank of idle_gap: call 1 with the last rank 50 ms late (the proxy of rank 0 idles into
 * its sleeping phase), an idle spell longer than the timeout, then call 2 with the last rank
 * 20 ms late. */
typedef struct {
    const shoal_uid_t *uid;
    const char *transport;
    int rank;
    shoal_status_t st[2];
} gap_rank_t;

#define GAP_TIMEOUT_MS 300

static void *gap_rank_main(void *arg)
{
    gap_rank_t *g = arg;
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t comm = NULL;
    int32_t in[64] = {0}, out[64];

    cfg.timeout_ms = GAP_TIMEOUT_MS;
    cfg.transport = g->transport;
    g->st[0] = g->st[1] = shoal_comm_init(&comm, 2, g->rank, g->uid, &cfg);
    if (g->st[0] != SHOAL_OK) {
        return NULL;
    }
    for (int call = 0; call < 2; call++) {
        shoal_request_t req = NULL;
        if (g->rank == 1) {
            usleep(call == 0 ? 50000 : 20000);
        }
        g->st[call] = shoal_iallreduce(in, out, 64, SHOAL_INT32, SHOAL_SUM, comm, &req);
        if (g->st[call] == SHOAL_OK) {
            g->st[call] = shoal_wait(&req);
        }
        if (call == 0) {
            usleep(2 * GAP_TIMEOUT_MS * 1000);
        }
    }
    shoal_comm_destroy(comm);
    return NULL;
}

/* The proxy's deadline counts from the last progress of the calls in flight; an idle spell
 * between calls is no wait. The first call after a spell longer than the timeout failed the
 * communicator at once ("timed out after 300 ms") when the call before it had waited long
 * enough to reach the sleeping phase. */
static void test_idle_gap(const char *transport)
{
    shoal_uid_t uid;
    gap_rank_t g[2];
    pthread_t th[2];

    if (shoal_get_unique_id(&uid) != SHOAL_OK) {
        tap_ok(0, "%s: idle gap: shoal_get_unique_id", transport);
        return;
    }
    for (int r = 0; r < 2; r++) {
        g[r] = (gap_rank_t){.uid = &uid, .transport = transport, .rank = r};
        pthread_create(&th[r], NULL, gap_rank_main, &g[r]);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
    }
    tap_ok(g[0].st[0] == SHOAL_OK && g[1].st[0] == SHOAL_OK && g[0].st[1] == SHOAL_OK &&
           g[1].st[1] == SHOAL_OK, "%s: an iallreduce after %d ms idle (timeout %d ms) "
           "completes: call 1 %s/%s, call 2 %s/%s", transport, 2 * GAP_TIMEOUT_MS, GAP_TIMEOUT_MS,
           shoal_status_name(g[0].st[0]), shoal_status_name(g[1].st[0]),
           shoal_status_name(g[0].st[1]), shoal_status_name(g[1].st[1]));
}

/* Peak resident size of the process in KiB (VmHWM), -1 if unknown. */
static long peak_rss_kb(void)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    if (fp == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            kb = atol(line + 6);
        }
    }
    fclose(fp);
    return kb;
}

#define INFLIGHT 64

typedef struct {
    const shoal_uid_t *uid;
    int rank;
    pthread_barrier_t *go;
    shoal_status_t st;
    int bad;
} many_rank_t;

/* INFLIGHT 8-byte AllReduces posted at once, then waited for. */
static void *many_rank_main(void *arg)
{
    many_rank_t *m = arg;
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t comm = NULL;
    shoal_request_t req[INFLIGHT];
    int32_t in[2] = {1, 2}, out[INFLIGHT][2];

    cfg.transport = "tcp";
    m->st = shoal_comm_init(&comm, 2, m->rank, m->uid, &cfg);
    pthread_barrier_wait(m->go); /* both inits done: the baseline is read */
    pthread_barrier_wait(m->go);
    if (m->st != SHOAL_OK) {
        return NULL;
    }
    for (int i = 0; i < INFLIGHT && m->st == SHOAL_OK; i++) {
        m->st = shoal_iallreduce(in, out[i], 2, SHOAL_INT32, SHOAL_SUM, comm, &req[i]);
    }
    for (int i = 0; i < INFLIGHT && m->st == SHOAL_OK; i++) {
        m->st = shoal_wait(&req[i]);
        m->bad += out[i][0] != 2 || out[i][1] != 4;
    }
    shoal_comm_destroy(comm);
    return NULL;
}

/* Every call in flight gets its plan, and its scratch (4 chunks: 4 MiB here), when it starts;
 * faulting all of it in for an 8-byte call made 64 calls on 2 ranks take 512 MiB (+494 MiB
 * measured); without it they take a few pages each. */
static void test_many_small(void)
{
    shoal_uid_t uid;
    many_rank_t m[2];
    pthread_t th[2];
    pthread_barrier_t go;
    long before, after;

    if (shoal_get_unique_id(&uid) != SHOAL_OK) {
        tap_ok(0, "many small: shoal_get_unique_id");
        return;
    }
    pthread_barrier_init(&go, NULL, 3);
    for (int r = 0; r < 2; r++) {
        m[r] = (many_rank_t){.uid = &uid, .rank = r, .go = &go};
        pthread_create(&th[r], NULL, many_rank_main, &m[r]);
    }
    pthread_barrier_wait(&go);
    before = peak_rss_kb();
    pthread_barrier_wait(&go);
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
    }
    after = peak_rss_kb();
    pthread_barrier_destroy(&go);
    tap_ok(m[0].st == SHOAL_OK && m[1].st == SHOAL_OK && m[0].bad == 0 && m[1].bad == 0 &&
           before > 0 && after - before < 256 * 1024, "2 ranks x %d 8-byte iallreduces in flight "
           "(tcp, 1 MiB chunks): %s/%s, %d/%d wrong, peak memory +%ld MiB (limit 256: a "
           "sanitizer's shadow of the freed buffers counts too)", INFLIGHT,
           shoal_status_name(m[0].st), shoal_status_name(m[1].st), m[0].bad, m[1].bad,
           (after - before) / 1024);
}

static void watchdog(int sig)
{
    static const char msg[] = "not ok - test_proxy hung: watchdog fired\n";
    (void)sig;
    (void)!write(1, msg, sizeof(msg) - 1);
    _exit(1);
}

static void *nothing(void *arg)
{
    return arg;
}

int main(void)
{
    int reps = getenv("TEST_PROXY_REPS") != NULL ? atoi(getenv("TEST_PROXY_REPS")) : 100;
    pthread_t th;

    /* A sanitizer's runtime starts its own thread at the first pthread_create: before the
     * baseline count. */
    pthread_create(&th, NULL, nothing, NULL);
    pthread_join(th, NULL);

    signal(SIGALRM, watchdog);
    alarm(240);
    setenv("SHOAL_TIMEOUT_MS", "60000", 0);
    /* 4 MiB of scratch per call in flight (test_many_small), on any machine */
    setenv("SHOAL_CHUNK_SIZE", "1m", 1);
    tap_plan(7);
    run_rounds(1, NTHREADS, reps);
    run_rounds(2, NTHREADS / 2, reps / 4 > 0 ? reps / 4 : 1);
    test_idle_gap("tcp");
    test_idle_gap("shm");
    test_many_small();
    return tap_done();
}
