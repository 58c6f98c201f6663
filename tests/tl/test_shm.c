/* Shared-memory transport specifics (the generic conformance suite is tests/tl/test_tl.c):
 * segment naming/mode/unlink, a 64 MiB stream through 8 x 64 KiB slots, ring wraparound with
 * many small messages all ways, shared areas + notify, futex wakeup latency and idle CPU, a
 * message waking a sleeping owner (the ring of a sleeper only),
 * peer death by SIGKILL, a live peer whose main thread left (a zombie in /proc), fail()
 * propagation, corrupted ring contents, a lazy peer that finalized before the receiver's
 * first use of the endpoint, a peer in another pid namespace (busy, and idle and lazy), and a
 * shoal_mem_alloc buffer freed in a process forked from its owner.
 *
 * Each case forks its ranks; children record their checks in a MAP_SHARED table which the
 * parent prints as TAP once they are gone. Every child runs under alarm(), and the parent
 * SIGKILLs whatever is left at the deadline: the test never hangs. */
#include "tests/tap.h"
#include "transports/shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXR 4
#define MAXCHECKS 48
#define BIG (64u << 20)

typedef struct {
    int ok;
    char msg[200];
} check_t;

typedef struct {
    pthread_barrier_t bar;
    int nprocs;
    int variant;
    size_t addr_len[MAXR];
    uint8_t addr[MAXR][SHOAL_TL_ADDR_MAX];
    uint64_t stamp[MAXR];
    shoal_tl_mem_t mem;       /* case mem_fork: rank 0's shoal_mem_alloc buffer */
    int nchecks[MAXR];
    check_t checks[MAXR][MAXCHECKS];
} shared_t;

typedef struct {
    int rank;
    int nprocs;
    shoal_tl_ctx_t *ctx;
    shoal_ep_t *eps[MAXR]; /* by rank; NULL for self */
} env_t;

static shared_t *sh;
static const shoal_tl_ops_t *tl = &shoal_tl_shm_ops;
static int my_rank;
static const volatile int no_abort;
static const uint8_t secret[SHOAL_SECRET_BYTES];

static void check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int cond, const char *fmt, ...)
{
    int i = sh->nchecks[my_rank];
    if (i >= MAXCHECKS) {
        return;
    }
    check_t *c = &sh->checks[my_rank][i];
    va_list ap;
    int off = snprintf(c->msg, sizeof(c->msg), "rank %d: ", my_rank);
    va_start(ap, fmt);
    vsnprintf(c->msg + off, sizeof(c->msg) - off, fmt, ap);
    va_end(ap);
    c->ok = cond;
    __atomic_store_n(&sh->nchecks[my_rank], i + 1, __ATOMIC_RELEASE);
}

static void barrier(void)
{
    pthread_barrier_wait(&sh->bar);
}

static shoal_wire_hdr_t hdr_make(uint32_t seq, uint32_t chunk, uint64_t len)
{
    return (shoal_wire_hdr_t){
        .magic = SHOAL_WIRE_MAGIC,
        .version = SHOAL_WIRE_VERSION,
        .type = SHOAL_WIRE_DATA,
        .comm_id = 0x5eed0000u,
        .seq = seq,
        .step = 0,
        .chunk = chunk,
        .length = len,
    };
}

/* Progress until every request is done or timeout_ms passes; spins briefly, then sleeps. */
static int wait_reqs(env_t *e, shoal_tl_req_t **reqs, int n, int timeout_ms)
{
    uint64_t deadline = shoal_time_ns() + (uint64_t)timeout_ms * 1000000ull;
    int idle = 0;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            left += reqs[i]->done == 0;
        }
        if (left == 0) {
            return 0;
        }
        if (shoal_time_ns() > deadline) {
            return -1;
        }
        if (tl->progress(e->ctx) > 0) {
            idle = 0;
        } else if (++idle < 64) {
            sched_yield();
        } else {
            tl->wait(e->ctx, 100000);
        }
    }
}

static int wait_one(env_t *e, shoal_tl_req_t *req, int timeout_ms)
{
    return wait_reqs(e, &req, 1, timeout_ms);
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
}

static size_t fill_big(uint8_t *buf, size_t len, int verify)
{
    uint64_t *w = (uint64_t *)buf;
    size_t bad = 0;
    for (size_t i = 0; i < len / 8; i++) {
        uint64_t v = (i + 1) * 0x9e3779b97f4a7c15ull;
        if (verify) {
            bad += w[i] != v;
        } else {
            w[i] = v;
        }
    }
    return bad;
}

/* ---- cases ------------------------------------------------------------------------------- */

static void case_segment_pre_ready(env_t *e)
{
    const shoal_shm_addr_t *a = (const shoal_shm_addr_t *)sh->addr[e->rank];
    char path[128];
    struct stat sb;
    snprintf(path, sizeof(path), "/dev/shm%s", a->name);
    int r = stat(path, &sb);
    check(r == 0 && S_ISREG(sb.st_mode) && (sb.st_mode & 07777) == 0600,
          "segment %s exists with mode 0600 before ready (mode %o)", a->name,
          r == 0 ? (unsigned)(sb.st_mode & 07777) : 0u);
    check(strlen(a->name) == strlen(SHOAL_SHM_NAME_PREFIX) + 32 &&
              strspn(a->name + strlen(SHOAL_SHM_NAME_PREFIX), "0123456789abcdef") == 32,
          "segment name has 32 random hex characters");
}

static void case_segment(env_t *e)
{
    const shoal_shm_addr_t *a = (const shoal_shm_addr_t *)sh->addr[e->rank];
    char path[128];
    struct stat sb;
    snprintf(path, sizeof(path), "/dev/shm%s", a->name);
    int r = stat(path, &sb);
    check(r != 0 && errno == ENOENT, "segment gone from /dev/shm after ready()");
    /* still works once unlinked: 0 bytes each way */
    int peer = 1 - e->rank;
    shoal_tl_req_t s = {.hdr = hdr_make(1, 0, 0)}, rr = {.hdr = hdr_make(1, 0, 0)};
    shoal_tl_req_t *reqs[2] = {&s, &rr};
    tl->isend(e->eps[peer], &s);
    tl->irecv(e->eps[peer], &rr);
    check(wait_reqs(e, reqs, 2, 5000) == 0 && s.status == SHOAL_OK && rr.status == SHOAL_OK,
          "0-byte message each way after unlink");
}

static void case_big(env_t *e)
{
    size_t cap = e->ctx->slot_size;
    size_t sizes[] = {0, 1, cap - 32, cap - 31, cap, cap + 1, 3 * cap - 32, 3 * cap};
    size_t maxs = 3 * cap;
    uint8_t *small = malloc(maxs), *buf = malloc(BIG);
    if (small == NULL || buf == NULL) {
        check(0, "malloc");
        goto out;
    }
    int ok = 1;
    for (size_t k = 0; k < SHOAL_ARRAY_SIZE(sizes); k++) {
        shoal_tl_req_t r = {.hdr = hdr_make(10, (uint32_t)k, sizes[k]), .buf = small};
        if (e->rank == 0) {
            fill(small, sizes[k], k);
            tl->isend(e->eps[1], &r);
            ok &= wait_one(e, &r, 5000) == 0 && r.status == SHOAL_OK;
        } else {
            uint8_t want[3 * 65536 + 64];
            memset(small, 0xee, maxs);
            tl->irecv(e->eps[0], &r);
            ok &= wait_one(e, &r, 5000) == 0 && r.status == SHOAL_OK;
            if (sizes[k] <= sizeof(want)) {
                fill(want, sizes[k], k);
                ok &= memcmp(small, want, sizes[k]) == 0;
            }
        }
    }
    check(ok, "slot-boundary sizes (0, 1, cap-32 .. 3 cap) intact");
    shoal_tl_req_t r = {.hdr = hdr_make(11, 0, BIG), .buf = buf};
    if (e->rank == 0) {
        fill_big(buf, BIG, 0);
    } else {
        memset(buf, 0, BIG);
    }
    barrier();
    uint64_t t0 = shoal_time_ns();
    if (e->rank == 0) {
        tl->isend(e->eps[1], &r);
    } else {
        tl->irecv(e->eps[0], &r);
    }
    int w = wait_one(e, &r, 20000);
    double s = (shoal_time_ns() - t0) / 1e9;
    check(w == 0 && r.status == SHOAL_OK, "64 MiB %s completes (%.1f ms, %.2f GB/s)",
          e->rank == 0 ? "send" : "recv", s * 1e3, BIG / s / 1e9);
    if (e->rank == 1) {
        check(fill_big(buf, BIG, 1) == 0, "64 MiB pattern intact");
    }
out:
    free(small);
    free(buf);
}

#define NSMALL 400
static void case_wrap(env_t *e)
{
    int n = e->nprocs, np = n - 1;
    shoal_tl_req_t *reqs = calloc((size_t)2 * np * NSMALL, sizeof(*reqs));
    shoal_tl_req_t **ptrs = calloc((size_t)2 * np * NSMALL, sizeof(*ptrs));
    uint8_t *sbuf = malloc((size_t)np * NSMALL * 256), *rbuf = malloc((size_t)np * NSMALL * 256);
    if (reqs == NULL || ptrs == NULL || sbuf == NULL || rbuf == NULL) {
        check(0, "malloc");
        goto out;
    }
    int k = 0, pi = 0;
    for (int p = 0; p < n; p++) {
        if (p == e->rank) {
            continue;
        }
        for (int i = 0; i < NSMALL; i++, k++) {
            size_t len = (size_t)(i * 37 + p * 11 + e->rank) % 200 + 1;
            shoal_tl_req_t *s = &reqs[2 * k], *r = &reqs[2 * k + 1];
            uint8_t *sb = sbuf + (size_t)k * 256, *rb = rbuf + (size_t)k * 256;
            size_t rlen = (size_t)(i * 37 + e->rank * 11 + p) % 200 + 1;
            fill(sb, len, (uint64_t)e->rank * 1000003 + p * 1009 + i);
            *s = (shoal_tl_req_t){.hdr = hdr_make((uint32_t)i, (uint32_t)e->rank, len), .buf = sb};
            *r = (shoal_tl_req_t){.hdr = hdr_make((uint32_t)i, (uint32_t)p, rlen), .buf = rb};
            tl->isend(e->eps[p], s);
            tl->irecv(e->eps[p], r);
            ptrs[pi++] = s;
            ptrs[pi++] = r;
        }
    }
    int w = wait_reqs(e, ptrs, pi, 20000);
    int bad = 0;
    k = 0;
    for (int p = 0; p < n; p++) {
        if (p == e->rank) {
            continue;
        }
        for (int i = 0; i < NSMALL; i++, k++) {
            uint8_t want[256];
            shoal_tl_req_t *r = &reqs[2 * k + 1];
            fill(want, r->hdr.length, (uint64_t)p * 1000003 + e->rank * 1009 + i);
            bad += reqs[2 * k].status != SHOAL_OK || r->status != SHOAL_OK ||
                   memcmp(r->buf, want, r->hdr.length) != 0;
        }
    }
    check(w == 0 && bad == 0, "%d small messages to and from each of %d peers at once "
          "(%d bad)", NSMALL, np, bad);
out:
    free(reqs);
    free(ptrs);
    free(sbuf);
    free(rbuf);
}

static void case_area(env_t *e)
{
    size_t len = 0, len2 = 0;
    uint8_t *mine = tl->shared_area(e->ctx, e->rank, &len);
    int zero = mine != NULL && len == e->ctx->area_size;
    for (size_t i = 0; zero && i < len; i += 4096) {
        zero = mine[i] == 0 && mine[len - 1 - i] == 0;
    }
    check(zero, "own shared area of %zu bytes, zeroed", len);
    if (mine == NULL || len < 4096) {
        return;
    }
    barrier();
    fill(mine + 64, len - 64, (uint64_t)e->rank + 77);
    __atomic_store_n((uint32_t *)mine, 1u, __ATOMIC_RELEASE);
    for (int p = 0; p < e->nprocs; p++) {
        if (p != e->rank) {
            tl->notify(e->ctx, p);
        }
    }
    int ok = 1;
    uint8_t *want = malloc(len);
    for (int p = 0; p < e->nprocs && want != NULL; p++) {
        if (p == e->rank) {
            continue;
        }
        uint8_t *a = tl->shared_area(e->ctx, p, &len2);
        uint64_t deadline = shoal_time_ns() + 5000000000ull;
        for (;;) {
            tl->progress(e->ctx); /* reads the doorbell before we look at the flag */
            if (__atomic_load_n((uint32_t *)a, __ATOMIC_ACQUIRE) == 1 ||
                shoal_time_ns() > deadline) {
                break;
            }
            tl->wait(e->ctx, 1000000);
        }
        fill(want, len - 64, (uint64_t)p + 77);
        ok &= a != NULL && len2 == len && *(uint32_t *)a == 1 &&
              memcmp(a + 64, want, len - 64) == 0;
    }
    free(want);
    check(ok, "peers' shared areas readable after notify, contents intact");
    barrier();
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* Milliseconds this thread has waited for a CPU (tap_run_delay_ns). The wake-up checks below
 * bound a latency less this: on a loaded machine (load 16 on 2 CPUs) a woken receiver waited
 * 50 to 114 ms for a CPU after a wake-up that came in time. */
static double run_delay_ms(void)
{
    return (double)tap_run_delay_ns() / 1e6;
}

static void case_futex(env_t *e)
{
    uint64_t v = 0;
    shoal_tl_req_t r = {.hdr = hdr_make(3, 0, sizeof(v)), .buf = &v};
    if (e->rank == 1) {
        barrier();
        shoal_sleep_us(200000);
        v = shoal_time_ns();
        tl->isend(e->eps[0], &r);
        wait_one(e, &r, 5000);
        barrier();
        shoal_sleep_us(150000);
        __atomic_store_n(&sh->stamp[1], shoal_time_ns(), __ATOMIC_RELEASE);
        tl->notify(e->ctx, 0);
        barrier();
        return;
    }
    tl->irecv(e->eps[1], &r);
    barrier();
    double c0 = cpu_s(), d0 = run_delay_ms();
    uint64_t t0 = shoal_time_ns();
    int w = wait_one(e, &r, 5000);
    uint64_t t1 = shoal_time_ns();
    double cpu = cpu_s() - c0, wall = (t1 - t0) / 1e9, d = run_delay_ms() - d0;
    double lat_ms = (t1 - v) / 1e6;
    check(w == 0 && r.status == SHOAL_OK && lat_ms - d < 50,
          "wakeup %.3f ms after the send with a recv pending (%.3f ms of it waiting for a CPU)",
          lat_ms, d);
    check(cpu < wall / 4, "waiting was not busy: %.1f ms CPU over %.1f ms", cpu * 1e3, wall * 1e3);
    /* no request pending: only the doorbell can wake us, before the 2 s timeout */
    barrier();
    tl->progress(e->ctx);
    c0 = cpu_s();
    d0 = run_delay_ms();
    t0 = shoal_time_ns();
    while (__atomic_load_n(&sh->stamp[1], __ATOMIC_ACQUIRE) == 0 &&
           shoal_time_ns() - t0 < 3000000000ull) {
        tl->wait(e->ctx, 2000000);
        tl->progress(e->ctx);
    }
    t1 = shoal_time_ns();
    uint64_t st = __atomic_load_n(&sh->stamp[1], __ATOMIC_ACQUIRE);
    lat_ms = st != 0 ? (t1 - st) / 1e6 : 1e9;
    d = run_delay_ms() - d0;
    check(lat_ms - d < 50, "notify() wakes an idle wait(): %.3f ms (%.3f ms of it waiting for a "
          "CPU)", lat_ms, d);
    check(cpu_s() - c0 < (t1 - t0) / 4e9, "idle wait slept (%.1f ms CPU over %.1f ms)",
          (cpu_s() - c0) * 1e3, (t1 - t0) / 1e6);
    barrier();
}

/* A message wakes a sleeping owner, every time: the producer rings only an owner whose
 * sleeping flag it sees (shm.h, "Sleeping"). The sender waits until it sees the flag set, then
 * sends; the receiver, with no receive posted (so that its wait() sleeps up to the full
 * 100 ms, not the 2 ms of a pending request), must be back long before that. 20 rounds.
 * Timed from the send (stamp[1]), less the receiver's own wait for a CPU: on a loaded machine
 * the sender itself saw the flag 50 ms late. A round whose send came after the wait had
 * ended (its 100 ms over) proves nothing either way and is only counted. */
static void case_sleeper(env_t *e)
{
    const int rounds = 20;
    int woken = 0, late = 0, bad = 0, seen_asleep = 0;
    double worst_ms = 0;
    for (int i = 0; i < rounds; i++) {
        uint64_t v = (uint64_t)i, got = ~0ull;
        shoal_tl_req_t r = {.hdr = hdr_make(40 + (uint32_t)i, 0, sizeof(v)), .buf = NULL};
        if (e->rank == 0) {
            __atomic_store_n(&sh->stamp[1], 0, __ATOMIC_RELEASE);
        }
        barrier();
        if (e->rank == 1) {
            const volatile uint32_t *sl = &e->eps[0]->peer_ctrl->sleeping;
            uint64_t t0 = shoal_time_ns();
            while (__atomic_load_n(sl, __ATOMIC_ACQUIRE) == 0 &&
                   shoal_time_ns() - t0 < 2000000000ull) {
                sched_yield();
            }
            seen_asleep += __atomic_load_n(sl, __ATOMIC_ACQUIRE) != 0;
            r.buf = &v;
            __atomic_store_n(&sh->stamp[1], shoal_time_ns(), __ATOMIC_RELEASE);
            tl->isend(e->eps[0], &r);
            wait_one(e, &r, 5000);
        } else {
            uint64_t t0, t1, sent;
            tl->progress(e->ctx);
            double d0 = run_delay_ms();
            t0 = shoal_time_ns();
            tl->wait(e->ctx, 100000); /* nothing pending: up to 100 ms */
            t1 = shoal_time_ns();
            sent = __atomic_load_n(&sh->stamp[1], __ATOMIC_ACQUIRE);
            if (sent == 0) {
                late++;
            } else {
                double ms = (t1 - SHOAL_MAX(sent, t0)) / 1e6 - (run_delay_ms() - d0);
                worst_ms = ms > worst_ms ? ms : worst_ms;
                woken += ms < 50;
            }
            r.buf = &got;
            tl->irecv(e->eps[1], &r);
            wait_one(e, &r, 5000);
            bad += r.status != SHOAL_OK || got != v;
        }
        barrier();
    }
    if (e->rank == 1) {
        check(seen_asleep == rounds, "saw the receiver asleep before %d of %d sends",
              seen_asleep, rounds);
    } else {
        check(woken == rounds - late && woken > 0 && bad == 0,
              "a message woke the sleeping receiver in %d of %d rounds (each within 50 ms of the "
              "send in its 100 ms sleep, less any wait for a CPU; worst %.3f ms; %d sent after "
              "the sleep), the data intact in all (%d not)", woken, rounds - late, worst_ms,
              late, bad);
    }
}

static void case_kill(env_t *e)
{
    uint64_t v = 0;
    char err[200] = "";
    shoal_tl_req_t r = {.hdr = hdr_make(4, 0, sizeof(v)), .buf = &v, .errbuf = err,
                        .errlen = sizeof(err)};
    if (e->rank == 1) {
        barrier();
        shoal_sleep_us(50000);
        __atomic_store_n(&sh->stamp[1], shoal_time_ns(), __ATOMIC_RELEASE);
        raise(SIGKILL);
        return;
    }
    tl->irecv(e->eps[1], &r);
    barrier();
    double d0 = run_delay_ms();
    int w = wait_one(e, &r, 5000);
    uint64_t t1 = shoal_time_ns();
    double d = run_delay_ms() - d0;
    double ms = (t1 - __atomic_load_n(&sh->stamp[1], __ATOMIC_ACQUIRE)) / 1e6 - d;
    check(w == 0 && r.status == SHOAL_ERR_PEER_FAILED, "recv from a SIGKILLed peer fails with "
          "ERR_PEER_FAILED (status %d)", r.status);
    check(w == 0 && ms < 100, "death noticed %.1f ms after the kill (less %.1f ms waiting for a "
          "CPU)", ms, d);
    check(strstr(err, "died") != NULL, "cause: '%s'", err);
    char why[160] = "";
    int blamed = 99;
    check(tl->peer_check(e->ctx, 1, why, sizeof(why), &blamed) == SHOAL_ERR_PEER_FAILED &&
              blamed == -1, "peer_check names it: '%s', blames no other rank (%d)", why, blamed);
    shoal_tl_req_t s = {.hdr = hdr_make(5, 0, 0)};
    check(tl->isend(e->eps[1], &s) == SHOAL_ERR_PEER_FAILED, "isend on the failed endpoint "
          "returns ERR_PEER_FAILED");
}

static void case_fail(env_t *e)
{
    uint64_t v = 0;
    char err[200] = "";
    int peer = e->rank == 1 ? 0 : 1;
    shoal_tl_req_t r = {.hdr = hdr_make(6, 0, sizeof(v)), .buf = &v, .errbuf = err,
                        .errlen = sizeof(err)};
    tl->irecv(e->eps[peer], &r);
    barrier();
    if (e->rank == 1) {
        tl->fail(e->ctx, 2, SHOAL_ERR_ABORTED);
        check(r.done && r.status == SHOAL_ERR_ABORTED, "fail() completes our own pending recv "
              "with its status (%d)", r.status);
        barrier();
        return;
    }
    int w = wait_one(e, &r, 5000);
    check(w == 0 && r.status == SHOAL_ERR_PEER_FAILED && strstr(err, "because of rank 2"),
          "pending recv fails with ERR_PEER_FAILED naming the culprit: '%s'", err);
    check(w == 0 && r.culprit == 2, "the request carries the culprit as data: %d", r.culprit);
    char why[160] = "";
    int blamed = -1;
    check(tl->peer_check(e->ctx, 1, why, sizeof(why), &blamed) == SHOAL_ERR_PEER_FAILED &&
              strstr(why, "rank 2") != NULL && blamed == 2, "peer_check: '%s', blames %d", why,
          blamed);
    barrier();
}

/* Rank 1 sends its last message and dies while rank 0 is descheduled with the recv posted: the
 * message was whole in the ring before the death, so it is delivered; only a recv for what can
 * never come fails. (Before the fix, the peer check after the sleep failed the first recv too:
 * a rank that finished its part and exited looked like a failure of its last message.) */
static void case_last_words(env_t *e)
{
    uint64_t v = 0, w2 = 0;
    char err[200] = "";
    shoal_tl_req_t r = {.hdr = hdr_make(8, 0, sizeof(v)), .buf = &v};
    shoal_tl_req_t r2 = {.hdr = hdr_make(9, 0, sizeof(w2)), .buf = &w2, .errbuf = err,
                         .errlen = sizeof(err)};
    if (e->rank == 1) {
        shoal_tl_req_t s = {.hdr = hdr_make(8, 0, sizeof(v)), .buf = &v};
        barrier();
        v = 0x1a57b0a7d5ULL;
        tl->isend(e->eps[0], &s);
        wait_one(e, &s, 5000);
        raise(SIGKILL);
        return;
    }
    tl->irecv(e->eps[1], &r);
    tl->progress(e->ctx); /* nothing yet: the engine would go to sleep now */
    barrier();
    shoal_sleep_us(300000); /* descheduled: the message lands and its sender dies meanwhile */
    tl->wait(e->ctx, 100000);
    int w = wait_one(e, &r, 5000);
    check(w == 0 && r.status == SHOAL_OK && v == 0x1a57b0a7d5ULL,
          "the dead peer's last message is delivered (status %d, value %llx)", r.status,
          (unsigned long long)v);
    tl->irecv(e->eps[1], &r2);
    w = wait_one(e, &r2, 5000);
    check(w == 0 && r2.status == SHOAL_ERR_PEER_FAILED && strstr(err, "died") != NULL,
          "a recv for what never comes fails: status %d, '%s'", r2.status, err);
}

/* Rank 1 writes straight into rank 0's ring instead of sending. */
static void case_corrupt(env_t *e)
{
    uint8_t buf[16 + 64];
    char err[200] = "";
    shoal_tl_req_t r = {.hdr = hdr_make(7, 0, 16), .buf = buf, .errbuf = err,
                        .errlen = sizeof(err)};
    int var = sh->variant;
    static const char *const names[] = {"bad magic", "length 1 GiB", "slot length 0xffffffff",
                                        "garbage slot sequence", "abort header"};
    if (e->rank == 1) {
        shoal_ep_t *ep = e->eps[0];
        shoal_wire_hdr_t h = hdr_make(7, 0, 16);
        uint32_t slot_len = 32 + 16;
        uint64_t seq = 1;
        if (var == 0) {
            h.magic = 0xdeadbeef;
        } else if (var == 1) {
            h.length = 1ull << 30;
            slot_len = (uint32_t)e->ctx->slot_size;
        } else if (var == 2) {
            slot_len = 0xffffffffu;
        } else if (var == 3) {
            seq = 12345;
        } else {
            h.type = SHOAL_WIRE_ABORT;
            h.chunk = 1;
            h.length = 0;
        }
        shoal_wire_encode(&h, ep->tx.data);
        memset(ep->tx.data + 32, 0xab, e->ctx->slot_size - 32);
        ep->tx.hdrs[0].len = slot_len;
        __atomic_store_n(&ep->tx.hdrs[0].seq, seq, __ATOMIC_RELEASE);
        tl->notify(e->ctx, 0);
        barrier();
        return;
    }
    memset(buf, 0x5a, sizeof(buf));
    tl->irecv(e->eps[1], &r);
    int w = wait_one(e, &r, 5000);
    shoal_status_t want = var == 4 ? SHOAL_ERR_PEER_FAILED : SHOAL_ERR_PROTOCOL;
    int canary = 1;
    for (size_t i = 16; i < sizeof(buf); i++) {
        canary &= buf[i] == 0x5a;
    }
    check(w == 0 && r.status == want, "%s: recv fails with %s (got %d): '%s'", names[var],
          var == 4 ? "ERR_PEER_FAILED" : "ERR_PROTOCOL", r.status, err);
    check(canary, "%s: nothing written past the posted buffer", names[var]);
    shoal_tl_req_t r2 = {.hdr = hdr_make(8, 0, 0)};
    check(tl->irecv(e->eps[1], &r2) == want, "%s: later irecv on the endpoint is refused",
          names[var]);
    barrier();
}

/* Makes /dev/shm<name> as user nobody (in a child that drops root): a file of mode 0666
 * (how 0), a symbolic link (1) or a directory (2). 1 if done. */
static int squat_as_nobody(const char *name, int how)
{
    int ws = 0;
    pid_t pid = fork();
    if (pid == 0) {
        char path[128];
        if (setgid(65534) != 0 || setuid(65534) != 0) {
            _exit(1);
        }
        snprintf(path, sizeof(path), "/dev/shm%s", name);
        if (how == 1) {
            _exit(symlink("/dev/null", path) == 0 ? 0 : 1);
        }
        if (how == 2) {
            _exit(mkdir(path, 0777) == 0 ? 0 : 1);
        }
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0666);
        _exit(fd >= 0 && fchmod(fd, 0666) == 0 ? 0 : 1);
    }
    return pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
}

/* Lazy contexts: rank 0 sends its message and finalizes (its segment's name goes with it)
 * before rank 1, which never mapped it, posts the receive. The message is whole in rank 1's
 * own segment: it is delivered; a receive for what never comes fails as from a dead peer, and
 * so does a send tried first. (Before the fix, that send failed with ERR_TRANSPORT, "opening
 * its segment ... failed: No such file or directory", where tcp says ERR_PEER_FAILED.)
 * Variant 1: the sender is rank 1, in a pid namespace of its own, whose death rank 0 tells by
 * its segment's lock, never opened here. (Before the fix, rank 0 never saw it gone: the
 * second receive waited for the timeout.) Variant 2: another user makes a file by the gone
 * segment's name before rank 1's first receive (/dev/shm is everyone's). (Before the fix, that
 * file was taken for the peer's segment: the irecv failed with ERR_PERMISSION and the message
 * in rank 1's own ring was never delivered.) Variants 3 and 4: a symbolic link, a directory by
 * that name. (Before the fix, opening it failed with ELOOP or EISDIR, taken for an error of
 * the peer's segment: the irecv failed with ERR_TRANSPORT, the message never delivered.) */
static void case_lazy_gone(env_t *e)
{
    uint64_t v = 0, v2 = 0;
    char err[200] = "";
    int snd = sh->variant == 1, rcv = 1 - snd;
    if (snd == 1 && __atomic_load_n(&sh->stamp[0], __ATOMIC_ACQUIRE) != 0) {
        check(1, "# SKIP cannot make a pid namespace (not root?)");
        return;
    }
    if (e->rank == snd) {
        shoal_tl_req_t s = {.hdr = hdr_make(11, 0, sizeof(v)), .buf = &v};
        v = 0x1a2b0a7d5ULL;
        shoal_status_t st = tl->isend(e->eps[rcv], &s);
        int w = st == SHOAL_OK ? wait_one(e, &s, 5000) : -1;
        check(w == 0 && s.status == SHOAL_OK, "lazy send completes (%s, status %d)",
              shoal_strerror(st), s.status);
        tl->fini(e->ctx);
        __atomic_store_n(&sh->stamp[2], 1, __ATOMIC_RELEASE);
        exit(0);
    }
    while (__atomic_load_n(&sh->stamp[2], __ATOMIC_ACQUIRE) == 0) {
        shoal_sleep_us(1000);
    }
    const char *name = ((const shoal_shm_addr_t *)sh->addr[snd])->name;
    if (sh->variant >= 2 && !squat_as_nobody(name, sh->variant - 2)) {
        check(1, "# SKIP cannot make a file as another user (not root?)");
        return;
    }
    shoal_tl_req_t r = {.hdr = hdr_make(11, 0, sizeof(v)), .buf = &v};
    shoal_status_t st;
    if (sh->variant < 2) {
        /* A send first: the peer's segment, never mapped here, is gone with its name. */
        uint64_t nothing = 0;
        shoal_tl_req_t s = {.hdr = hdr_make(13, 0, sizeof(nothing)), .buf = &nothing};
        st = tl->isend(e->eps[snd], &s);
        check(st == SHOAL_ERR_PEER_FAILED, "a first send to the peer that finalized fails as "
              "to a gone peer: %s", shoal_strerror(st));
    }
    st = tl->irecv(e->eps[snd], &r);
    int w = st == SHOAL_OK ? wait_one(e, &r, 5000) : -1;
    check(st == SHOAL_OK && w == 0 && r.status == SHOAL_OK && v == 0x1a2b0a7d5ULL,
          "the message of a peer that finalized before the first use is delivered (irecv %s, "
          "status %d, value %llx)", shoal_strerror(st), r.status, (unsigned long long)v);
    shoal_tl_req_t r2 = {.hdr = hdr_make(12, 0, sizeof(v2)), .buf = &v2, .errbuf = err,
                         .errlen = sizeof(err)};
    uint64_t t0 = shoal_time_ns();
    st = tl->irecv(e->eps[snd], &r2);
    w = st == SHOAL_OK ? wait_one(e, &r2, 5000) : -1;
    check(w == 0 && r2.status == SHOAL_ERR_PEER_FAILED, "then a recv for what never comes "
          "fails in %.0f ms: irecv %s, status %d, '%s'", (shoal_time_ns() - t0) / 1e6,
          shoal_strerror(st), r2.status, err);
    if (sh->variant >= 2) {
        char path[128];
        snprintf(path, sizeof(path), "/dev/shm%s", name);
        if (sh->variant == 4 ? rmdir(path) : unlink(path)) {
            check(0, "removing the squatter's %s failed: %s", path, strerror(errno));
        }
    }
}

/* Rank 0 allocates a shoal_mem_alloc buffer and forks a process (a data loader's worker)
 * that frees its copy of it (an inherited object's destructor); rank 1 then maps rank 0's
 * buffer, which rank 0 never freed. (Before the fix, the child's free cleared the magic in
 * the shared header page, as the owner's does: rank 1 refused the buffer, "shared buffer fd
 * N is not the one it described", and the intra-node AllReduce failed the communicator;
 * peers that had it mapped already dropped their mapping at their next miss.) */
static void case_mem_fork(env_t *e)
{
    void *buf = NULL;
    if (e->rank == 0) {
        shoal_status_t st = shoal_mem_alloc(8192, &buf);
        check(st == SHOAL_OK, "shoal_mem_alloc: %s", shoal_strerror(st));
        if (st == SHOAL_OK) {
            fill(buf, 8192, 4242);
            check(shoal_shm_mem_query(buf, 8192, &sh->mem), "the buffer is described");
            pid_t pid = fork();
            if (pid == 0) {
                _exit(shoal_mem_free(buf) == SHOAL_OK ? 0 : 1);
            }
            int ws = -1, waited = pid > 0 && waitpid(pid, &ws, 0) == pid;
            check(waited && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "a forked child frees its "
                  "copy (wait status 0x%x)", ws);
        }
    }
    barrier();
    if (e->rank == 1 && sh->mem.id != 0) {
        if (!shoal_shm_mem_reach_ok(e->ctx)) {
            check(1, "# SKIP this process may not take its peer's descriptors");
        } else {
            uint8_t want[8192];
            const uint8_t *q = tl->mem_map(e->ctx, 0, &sh->mem);
            fill(want, sizeof(want), 4242);
            check(q != NULL && memcmp(q, want, sizeof(want)) == 0, "rank 0's buffer, freed "
                  "only in a process it forked, is mapped here whole (%s)",
                  q == NULL ? "refused" : "mapped");
        }
    }
    barrier();
    if (buf != NULL) {
        check(shoal_mem_free(buf) == SHOAL_OK, "the owner frees the buffer");
    }
}

/* Rank 1's main thread leaves with pthread_exit while another of its threads goes on talking
 * (a program whose main thread only starts its workers): /proc shows the process as a zombie
 * ('Z') until its last thread is gone. Rank 0 must not take it for dead. (Before the fix, the
 * first liveness check failed the pending recv: "peer 1 (pid ...) died".) */
static void *leader_exit_worker(void *arg)
{
    env_t *e = arg;
    uint64_t v = 0x1eade7ULL;
    shoal_tl_req_t s = {.hdr = hdr_make(13, 0, sizeof(v)), .buf = &v};
    while (__atomic_load_n(&sh->stamp[1], __ATOMIC_ACQUIRE) == 0) {
        shoal_sleep_us(1000); /* till rank 0 has checked on us for a while */
    }
    shoal_status_t st = tl->isend(e->eps[0], &s);
    int w = st == SHOAL_OK ? wait_one(e, &s, 5000) : -1;
    check(w == 0 && s.status == SHOAL_OK, "a thread of a process whose main thread left sends "
          "(isend %s, status %d)", shoal_strerror(st), s.status);
    barrier();
    tl->fini(e->ctx);
    exit(0);
}

static void case_leader_exit(env_t *e)
{
    if (e->rank == 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, leader_exit_worker, e) != 0) {
            check(0, "pthread_create");
            barrier();
            return;
        }
        pthread_exit(NULL);
    }
    uint64_t v = 0;
    char err[200] = "", why[160] = "", state = 0;
    unsigned long long start;
    int blamed = -1;
    shoal_tl_req_t r = {.hdr = hdr_make(13, 0, sizeof(v)), .buf = &v, .errbuf = err,
                        .errlen = sizeof(err)};
    tl->irecv(e->eps[1], &r);
    uint64_t deadline = shoal_time_ns() + 5000000000ull;
    while (shoal_shm_proc_stat(e->eps[1]->pid, &state, &start) == 0 && state != 'Z' &&
           shoal_time_ns() < deadline) {
        tl->progress(e->ctx);
        shoal_sleep_us(1000);
    }
    check(state == 'Z', "/proc shows rank 1 as a zombie once its main thread left (%c)", state);
    for (int i = 0; i < 50; i++) { /* some 50 liveness checks */
        tl->progress(e->ctx);
        shoal_sleep_us(1000);
    }
    check(!r.done, "the recv from it is still pending after 50 ms (status %d, '%s')", r.status,
          err);
    check(tl->peer_check(e->ctx, 1, why, sizeof(why), &blamed) == SHOAL_OK,
          "peer_check takes it for alive ('%s')", why);
    __atomic_store_n(&sh->stamp[1], 1, __ATOMIC_RELEASE);
    int w = wait_one(e, &r, 5000);
    check(w == 0 && r.status == SHOAL_OK && v == 0x1eade7ULL, "its message arrives (status %d, "
          "'%s', value %llx)", r.status, err, (unsigned long long)v);
    barrier();
}

/* A word at the same address in rank 0 and in every process forked from it. */
static volatile uint64_t recycled_word = 0x0dd0c0ffeeULL;

/* Forks a process that gets pid 'want' (ns_last_pid, root only): it sets recycled_word to
 * 0x57a4e, says so in stamp[2], and lives until stamp[3] is set; it then reports its word in
 * stamp[2]. The child's pid, or -1. */
static pid_t fork_as(pid_t want)
{
    for (int attempt = 0; attempt < 20; attempt++) {
        FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
        if (f == NULL) {
            return -1;
        }
        fprintf(f, "%d", (int)want - 1);
        if (fclose(f) != 0) {
            return -1;
        }
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20);
            recycled_word = 0x57a4eULL;
            __atomic_store_n(&sh->stamp[2], recycled_word, __ATOMIC_RELEASE);
            while (__atomic_load_n(&sh->stamp[3], __ATOMIC_ACQUIRE) == 0) {
                shoal_sleep_us(1000);
            }
            __atomic_store_n(&sh->stamp[2], recycled_word, __ATOMIC_RELEASE);
            _exit(0);
        }
        if (pid == want || pid < 0) {
            return pid;
        }
        __atomic_store_n(&sh->stamp[3], 1, __ATOMIC_RELEASE);
        waitpid(pid, NULL, 0);
        __atomic_store_n(&sh->stamp[3], 0, __ATOMIC_RELEASE);
        __atomic_store_n(&sh->stamp[2], 0, __ATOMIC_RELEASE);
    }
    return -1;
}

/* Rank 1 dies and another process of the same user takes its pid: single copies with rank 1
 * must fail as with a dead peer, never read or write the newcomer's memory. */
static void case_cma_recycled(env_t *e)
{
    if (e->rank == 1) {
        barrier();
        raise(SIGKILL);
        return;
    }
    int ok = tl->peer_copy_ok(e->ctx);
    check(ok, "single copies work with the live peer");
    barrier();
    pid_t old = e->eps[1]->pid;
    while (kill(old, 0) == 0 || errno != ESRCH) {
        shoal_sleep_us(1000); /* the parent reaps it */
    }
    pid_t np = fork_as(old);
    if (np != old) {
        check(1, "# SKIP cannot give a new process pid %d (not root?)", (int)old);
        return;
    }
    while (__atomic_load_n(&sh->stamp[2], __ATOMIC_ACQUIRE) == 0) {
        shoal_sleep_us(1000);
    }
    uint64_t got = 0, mine = 0xbadULL;
    shoal_status_t rd = tl->peer_copy(e->ctx, 1, 0, &got, (uint64_t)(uintptr_t)&recycled_word,
                                      sizeof(got));
    shoal_status_t wr = tl->peer_copy(e->ctx, 1, 1, &mine, (uint64_t)(uintptr_t)&recycled_word,
                                      sizeof(mine));
    __atomic_store_n(&sh->stamp[3], 1, __ATOMIC_RELEASE);
    waitpid(np, NULL, 0);
    uint64_t theirs = __atomic_load_n(&sh->stamp[2], __ATOMIC_ACQUIRE);
    check(rd == SHOAL_ERR_PEER_FAILED && got != 0x57a4eULL, "a read from the dead peer's "
          "recycled pid fails with ERR_PEER_FAILED (%s) and reads nothing of the newcomer's "
          "(0x%llx)", shoal_strerror(rd), (unsigned long long)got);
    check(wr == SHOAL_ERR_PEER_FAILED && theirs == 0x57a4eULL, "a write to it fails with "
          "ERR_PEER_FAILED (%s) and leaves the newcomer's memory alone (0x%llx)",
          shoal_strerror(wr), (unsigned long long)theirs);
}

/* Rank 1 runs in a pid namespace of its own (containers that share /dev/shm): the pid each
 * side published names nobody, or another process, on the other side. They must connect and
 * talk, make no single copies (rank 1's pid 1 is another process for rank 0), and rank 0 must
 * see rank 1's death (by its segment's lock) well before its timeout. */
static void case_pidns(env_t *e)
{
    if (__atomic_load_n(&sh->stamp[0], __ATOMIC_ACQUIRE) != 0) {
        check(1, "# SKIP cannot make a pid namespace (not root?)");
        return;
    }
    uint64_t v = 0x9e70ULL + (uint64_t)e->rank, got = 0, got2 = 0;
    int peer = 1 - e->rank;
    char err[200] = "";
    shoal_tl_req_t s = {.hdr = hdr_make(10, 0, sizeof(v)), .buf = &v};
    shoal_tl_req_t r = {.hdr = hdr_make(10, 0, sizeof(got)), .buf = &got, .errbuf = err,
                        .errlen = sizeof(err)};
    check(!tl->peer_copy_ok(e->ctx), "no single copies with a peer in another pid namespace");
    tl->irecv(e->eps[peer], &r);
    tl->isend(e->eps[peer], &s);
    shoal_tl_req_t *both[2] = {&s, &r};
    int w = wait_reqs(e, both, 2, 5000);
    check(w == 0 && s.status == SHOAL_OK && r.status == SHOAL_OK && got == 0x9e70ULL + peer,
          "a message each way (send %d, recv %d '%s', value %llx)", s.status, r.status, err,
          (unsigned long long)got);
    barrier();
    if (e->rank == 1) {
        _exit(0); /* pid 1 of its namespace ignores a SIGKILL of its own */
    }
    shoal_tl_req_t r2 = {.hdr = hdr_make(11, 0, sizeof(got2)), .buf = &got2, .errbuf = err,
                         .errlen = sizeof(err)};
    uint64_t t0 = shoal_time_ns();
    tl->irecv(e->eps[1], &r2);
    w = wait_one(e, &r2, 5000);
    check(w == 0 && r2.status == SHOAL_ERR_PEER_FAILED, "its death is seen in %.0f ms (status "
          "%d, '%s')", (shoal_time_ns() - t0) / 1e6, r2.status, err);
    /* its pid 1 is another process here (init): the sentence must not say so */
    check(strstr(err, "pid 1 in its pid namespace") != NULL, "the sentence places its pid in "
          "its pid namespace: '%s'", err);
}

/* Lazy contexts, rank 1 in a pid namespace of its own, nothing ever sent either way: rank 1
 * leaves without finalizing (its segment's name stays, its lock goes with it). Rank 0's
 * peer_check (what shoal_comm_get_async_error asks on an idle communicator) must see it gone.
 * (Before the fix, a peer in another pid namespace whose segment was never mapped here was
 * judged by the lock of a descriptor never opened: alive for ever.) */
static void case_pidns_idle(env_t *e)
{
    if (__atomic_load_n(&sh->stamp[0], __ATOMIC_ACQUIRE) != 0) {
        check(1, "# SKIP cannot make a pid namespace (not root?)");
        return;
    }
    if (e->rank == 1) {
        _exit(0); /* no fini: the name stays in the directory, the lock goes */
    }
    char why[200] = "";
    int culprit = 7;
    shoal_status_t st = SHOAL_OK;
    uint64_t t0 = shoal_time_ns();
    while (st == SHOAL_OK && shoal_time_ns() - t0 < 3000000000ull) {
        shoal_sleep_us(2000);
        st = tl->peer_check(e->ctx, 1, why, sizeof(why), &culprit);
    }
    check(st == SHOAL_ERR_PEER_FAILED && culprit == -1, "an idle peer in another pid namespace "
          "that left is seen gone in %.0f ms (%s, culprit %d, '%s')",
          (shoal_time_ns() - t0) / 1e6, shoal_strerror(st), culprit, why);
    shm_unlink(((const shoal_shm_addr_t *)sh->addr[1])->name); /* if still there */
}

/* Makes this process (rank 1 of case pidns) pid 1 of a new pid namespace: a child of it goes
 * on, this one waits and exits as the child did. Root only: else stamp[0] says skip. */
static void child_enter_pidns(void)
{
    int ws = 0;
    if (unshare(CLONE_NEWPID) != 0) {
        __atomic_store_n(&sh->stamp[0], 1, __ATOMIC_RELEASE);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* the parent's deadline kill reaches it too */
        return;
    }
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) {
        _exit(1);
    }
    _exit(WIFEXITED(ws) ? WEXITSTATUS(ws) : 1);
}

/* ---- runner ------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    int nprocs;
    void (*fn)(env_t *);
    void (*pre_ready)(env_t *);
    int killed_rank; /* rank expected to die of SIGKILL, or -1 */
    int variant;
    int lazy;        /* the context maps its peers' segments at first use */
    int pidns;       /* rank 1 in a pid namespace of its own */
} case_t;

static void child_run(const case_t *c, int rank)
{
    env_t e = {.rank = rank, .nprocs = c->nprocs};
    shoal_tl_params_t params = {
        .rank = rank,
        .nranks = c->nprocs,
        .local_rank = rank,
        .local_size = c->nprocs,
        .comm_id = 0x5eed0000u,
        .secret = secret,
        .timeout_ms = 5000,
        .abort_flag = &no_abort,
        .lazy = c->lazy,
    };
    my_rank = rank;
    alarm(30);
    if (c->pidns && rank == 1) {
        child_enter_pidns();
    }
    shoal_status_t st = tl->init(&params, &e.ctx);
    check(st == SHOAL_OK, "init: %s", shoal_strerror(st));
    if (st != SHOAL_OK) {
        _exit(1); /* the others time out at the barrier: the parent reports it */
    }
    tl->address(e.ctx, sh->addr[rank], &sh->addr_len[rank]);
    barrier();
    int peers[MAXR], np = 0;
    const void *addrs[MAXR];
    size_t lens[MAXR];
    shoal_ep_t *eps[MAXR];
    for (int p = 0; p < c->nprocs; p++) {
        if (p != rank) {
            addrs[np] = sh->addr[p];
            lens[np] = sh->addr_len[p];
            peers[np++] = p;
        }
    }
    st = tl->connect_all(e.ctx, peers, np, addrs, lens, eps);
    if (st == SHOAL_OK) {
        for (int i = 0; i < np; i++) {
            e.eps[peers[i]] = eps[i];
        }
    }
    barrier();
    if (c->pre_ready != NULL) {
        c->pre_ready(&e);
    }
    barrier();
    tl->ready(e.ctx);
    barrier();
    if (st == SHOAL_OK) {
        c->fn(&e);
    } else {
        check(0, "connect_all: %s", shoal_strerror(st));
    }
    tl->fini(e.ctx);
    exit(0); /* not _exit: lets LeakSanitizer look (stdio was flushed before the fork) */
}

static void run_case(const case_t *c)
{
    pid_t pids[MAXR];
    memset(sh, 0, sizeof(*sh));
    pthread_barrierattr_t ba;
    pthread_barrierattr_init(&ba);
    pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sh->bar, &ba, (unsigned)c->nprocs);
    sh->nprocs = c->nprocs;
    sh->variant = c->variant;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < c->nprocs; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            child_run(c, r);
        }
    }
    int status[MAXR], left = c->nprocs;
    uint64_t deadline = shoal_time_ns() + 40000000000ull;
    for (int r = 0; r < c->nprocs; r++) {
        status[r] = -1;
    }
    while (left > 0) {
        for (int r = 0; r < c->nprocs; r++) {
            if (status[r] == -1 && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) {
                left--;
            }
        }
        if (left > 0 && shoal_time_ns() > deadline) {
            for (int r = 0; r < c->nprocs; r++) {
                if (status[r] == -1) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], &status[r], 0);
                    tap_diag("%s: rank %d killed at the deadline", c->name, r);
                }
            }
            break;
        }
        shoal_sleep_us(2000);
    }
    for (int r = 0; r < c->nprocs; r++) {
        for (int i = 0; i < sh->nchecks[r]; i++) {
            tap_ok(sh->checks[r][i].ok, "%s: %s", c->name, sh->checks[r][i].msg);
        }
        int want_kill = r == c->killed_rank;
        int ok = want_kill ? WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL
                           : WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0;
        tap_ok(ok, "%s: rank %d %s (wait status 0x%x)", c->name, r,
               want_kill ? "died of SIGKILL" : "exited cleanly", status[r]);
    }
    pthread_barrier_destroy(&sh->bar);
}

/* In the parent: config table, SHM_DISABLE, and refusal of a segment that is not 0600. */
static void test_local(void)
{
    const shoal_cfg_table_t *t = &shoal_shm_cfg_table;
    int docs = t->nfields == 6 && strcmp(t->module, "shm") == 0;
    for (size_t i = 0; i < t->nfields; i++) {
        shoal_shm_config_t tmp;
        docs &= t->fields[i].doc != NULL && t->fields[i].doc[0] != '\0' &&
                shoal_cfg_parse_value(&t->fields[i], t->fields[i].dflt,
                                      (char *)&tmp + t->fields[i].offset) == 0;
    }
    tap_ok(docs, "config table: 6 documented rows whose defaults parse");
    shoal_shm_config.disable = 1;
    tap_ok(tl->query() == 0, "SHM_DISABLE makes query() report not usable");
    shoal_shm_config.disable = 0;

    shoal_tl_params_t params = {.rank = 0, .nranks = 2, .local_rank = 0, .local_size = 2,
                                .comm_id = 0x5eed0000u, .secret = secret, .timeout_ms = 1000,
                                .abort_flag = &no_abort};
    shoal_tl_ctx_t *ctx = NULL;
    if (tl->init(&params, &ctx) != SHOAL_OK) {
        tap_ok(0, "init in the parent");
        return;
    }
    shoal_shm_addr_t a;
    size_t alen;
    tl->address(ctx, &a, &alen);
    /* a look-alike segment of a fake local rank 1, but group/other readable */
    a.local_rank = 1;
    a.name[strlen(a.name) - 1] = a.name[strlen(a.name) - 1] == '0' ? '1' : '0';
    int fd = shm_open(a.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    int made = fd >= 0 && fchmod(fd, 0644) == 0 && ftruncate(fd, (off_t)ctx->layout.total) == 0;
    if (fd >= 0) {
        close(fd);
    }
    int peers[1] = {1};
    const void *addrs[1] = {&a};
    shoal_ep_t *eps[1];
    shoal_status_t st = made ? tl->connect_all(ctx, peers, 1, addrs, &alen, eps) : SHOAL_OK;
    tap_ok(made && st == SHOAL_ERR_PERMISSION, "a peer segment with mode 0644 is refused (%s)",
           shoal_strerror(st));
    shm_unlink(a.name);
    alen = 7;
    st = tl->connect_all(ctx, peers, 1, addrs, &alen, eps);
    tap_ok(st == SHOAL_ERR_PROTOCOL, "a short address is refused (%s)", shoal_strerror(st));
    tl->fini(ctx);
}

/* A file named like a segment in dir, of size len, optionally with a header; its mtime set
 * age seconds back. 0 on success. */
static int sweep_file(const char *dir, const char *name, int age, uint32_t version)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, 8192) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    shoal_shm_ctrl_t c = {.magic = SHOAL_SHM_MAGIC, .version = version};
    int ok = version == 0 || pwrite(fd, &c, sizeof(c), 0) == (ssize_t)sizeof(c);
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = time(NULL) - age}};
    ok &= futimens(fd, ts) == 0;
    close(fd);
    return ok ? 0 : -1;
}

static int sweep_exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static int sweep_age(const char *dir, const char *name, int age)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = time(NULL) - age}};
    return utimensat(AT_FDCWD, path, ts, 0);
}

/* shoal_shm_sweep removes the segments of dead owners only: a rank killed between making its
 * segment and removing its name left it in the directory for good (9.4 MB for 3 ranks). The
 * owner of a live segment holds its OFD lock, a forked child's kill -9 releases it. */
static void test_sweep(void)
{
    char dir[] = "/dev/shm/shoal_sweep_XXXXXX";
    if (mkdtemp(dir) == NULL) {
        tap_ok(0, "sweep: mkdtemp: %s", strerror(errno));
        return;
    }
    const char *saved = shoal_shm_config.dir;
    shoal_shm_config.dir = dir;
    const char *dead = "shoal-0123456789abcdef0123456789abcdef";
    const char *young = "shoal-00000000000000000000000000000001";
    const char *v1 = "shoal-00000000000000000000000000000002";
    const char *blank = "shoal-00000000000000000000000000000003";
    const char *other = "shoal-notours";
    int made = sweep_file(dir, dead, 120, SHOAL_SHM_VERSION) == 0 &&
               sweep_file(dir, young, 5, SHOAL_SHM_VERSION) == 0 &&
               sweep_file(dir, v1, 120, 1) == 0 && sweep_file(dir, blank, 120, 0) == 0 &&
               sweep_file(dir, other, 120, SHOAL_SHM_VERSION) == 0;

    /* a live owner in another process: a forked child's own segment */
    int pfd[2] = {-1, -1};
    char live[SHOAL_SHM_NAME_MAX] = "";
    pid_t pid = made && pipe(pfd) == 0 ? fork() : -1;
    if (pid == 0) {
        alarm(30);
        close(pfd[0]);
        shoal_tl_params_t params = {.rank = 0, .nranks = 1, .local_rank = 0, .local_size = 1,
                                    .comm_id = 0x5eed0002u, .secret = secret,
                                    .timeout_ms = 1000, .abort_flag = &no_abort};
        shoal_tl_ctx_t *ctx = NULL;
        if (tl->init(&params, &ctx) == SHOAL_OK &&
            write(pfd[1], ctx->name, sizeof(ctx->name)) == (ssize_t)sizeof(ctx->name)) {
            pause(); /* till the parent's SIGKILL */
        }
        _exit(1);
    }
    if (pfd[1] >= 0) {
        close(pfd[1]);
    }
    int got = pid > 0 && read(pfd[0], live, sizeof(live)) == (ssize_t)sizeof(live) &&
              live[0] == '/' && sweep_age(dir, live + 1, 120) == 0;
    if (pfd[0] >= 0) {
        close(pfd[0]);
    }
    unsigned n1 = got ? shoal_shm_sweep(SHOAL_SHM_SWEEP_AGE_S) : 0;
    tap_ok(made && got && n1 == 2 && !sweep_exists(dir, dead) && !sweep_exists(dir, blank),
           "sweep: a 2-minute-old unlocked segment and an unformatted one go (%u removed)", n1);
    tap_ok(got && sweep_exists(dir, live + 1), "sweep: a live process's segment stays (its lock "
           "is held), however old");
    tap_ok(made && sweep_exists(dir, young) && sweep_exists(dir, v1) &&
               sweep_exists(dir, other), "sweep: a young file, another shm version's segment "
           "and a name not ours stay");
    int status = 0;
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    /* its mtime moved again when its owner wrote the header: older once more */
    unsigned n2 = got && sweep_age(dir, live + 1, 120) == 0 ? shoal_shm_sweep(60) : 0;
    tap_ok(got && n2 == 1 && !sweep_exists(dir, live + 1), "sweep: the same segment goes once "
           "its owner was killed (%u removed)", n2);

    const char *names[] = {dead, young, v1, blank, other, live[0] ? live + 1 : NULL};
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(names); i++) {
        char path[512];
        if (names[i] != NULL) {
            snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
            unlink(path);
        }
    }
    rmdir(dir);
    shoal_shm_config.dir = saved;
}

/* A process forked from a rank (a data loader's worker) inherited the descriptor of the rank's
 * segment, and with it the segment's OFD lock: once the rank was killed, its segment still
 * looked alive for as long as that process lived (the sweep left it; a peer in another pid
 * namespace, which judges liveness by the lock, took the rank for alive). The forked copy is
 * closed in the child. */
static void test_sweep_fork(void)
{
    char dir[] = "/dev/shm/shoal_sweepf_XXXXXX";
    if (mkdtemp(dir) == NULL) {
        tap_ok(0, "sweep after fork: mkdtemp: %s", strerror(errno));
        return;
    }
    const char *saved = shoal_shm_config.dir;
    shoal_shm_config.dir = dir;
    int pfd[2] = {-1, -1};
    char name[SHOAL_SHM_NAME_MAX] = "";
    pid_t worker = -1;
    pid_t pid = pipe(pfd) == 0 ? fork() : -1;
    if (pid == 0) {
        alarm(30);
        close(pfd[0]);
        shoal_tl_params_t params = {.rank = 0, .nranks = 1, .local_rank = 0, .local_size = 1,
                                    .comm_id = 0x5eed0003u, .secret = secret,
                                    .timeout_ms = 1000, .abort_flag = &no_abort};
        shoal_tl_ctx_t *ctx = NULL;
        if (tl->init(&params, &ctx) != SHOAL_OK) {
            _exit(1);
        }
        /* The rank's worker outlives it. The worker writes the name and its pid itself: its
         * fork() has returned, so the child handler that closes its copy of the lock has run
         * (the rank's writing them raced the worker's first time on a CPU: under TSan the
         * sweep ran before the worker had closed its copy). */
        pid_t w = fork();
        if (w == 0) {
            alarm(30);
            pid_t me = getpid();
            if (write(pfd[1], ctx->name, sizeof(ctx->name)) == (ssize_t)sizeof(ctx->name) &&
                write(pfd[1], &me, sizeof(me)) == (ssize_t)sizeof(me)) {
                pause(); /* till the parent's SIGKILL */
            }
            _exit(1);
        }
        if (w > 0) {
            pause(); /* till the parent's SIGKILL */
        }
        _exit(1);
    }
    if (pfd[1] >= 0) {
        close(pfd[1]);
    }
    int got = pid > 0 && read(pfd[0], name, sizeof(name)) == (ssize_t)sizeof(name) &&
              read(pfd[0], &worker, sizeof(worker)) == (ssize_t)sizeof(worker) &&
              name[0] == '/' && worker > 0;
    if (pfd[0] >= 0) {
        close(pfd[0]);
    }
    if (pid > 0) {
        int status = 0;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    int alive = got && kill(worker, 0) == 0;
    unsigned n = got && sweep_age(dir, name + 1, 120) == 0 ? shoal_shm_sweep(60) : 0;
    tap_ok(got && alive && n == 1 && !sweep_exists(dir, name + 1),
           "sweep: a killed rank's segment goes while a process it forked lives (%u removed, "
           "worker %s)", n, alive ? "alive" : "not alive");
    if (worker > 0) {
        kill(worker, SIGKILL); /* not our child: its new parent reaps it */
    }
    if (name[0] == '/') {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, name + 1);
        unlink(path);
    }
    rmdir(dir);
    shoal_shm_config.dir = saved;
}

/* Ranks of one host id whose segment directories differ: two containers with the same host
 * name and boot id (host network) and a /dev/shm each, or SHOAL_SHM_DIR set differently. No
 * rank can open another's segment. (Before the fix, eager init failed with
 * SHOAL_ERR_PEER_FAILED, "opening its segment ... failed: No such file or directory (the peer
 * finalized or died)", of a peer that was alive; lazy init succeeded and the first send
 * failed so, mid-run.) Now connect refuses the peer's address at once, naming the cause. */
static void test_dir_differs(void)
{
    char dir[] = "/tmp/shoal_shmdir_XXXXXX";
    if (mkdtemp(dir) == NULL) {
        tap_ok(0, "segment directories differ: mkdtemp: %s", strerror(errno));
        return;
    }
    const char *saved = shoal_shm_config.dir;
    for (int lazy = 0; lazy < 2; lazy++) {
        shoal_tl_ctx_t *ctx[2] = {NULL, NULL};
        shoal_shm_addr_t a;
        size_t alen;
        int ok = 1;
        for (int r = 0; r < 2; r++) {
            shoal_tl_params_t params = {.rank = r, .nranks = 2, .local_rank = r, .local_size = 2,
                                        .comm_id = 0x5eed0007u, .secret = secret,
                                        .timeout_ms = 1000, .abort_flag = &no_abort,
                                        .lazy = lazy};
            shoal_shm_config.dir = r == 0 ? saved : dir;
            ok &= tl->init(&params, &ctx[r]) == SHOAL_OK;
        }
        shoal_shm_config.dir = saved;
        shoal_status_t st = SHOAL_OK;
        if (ok) {
            int peer = 1;
            const void *addrs[1] = {&a};
            shoal_ep_t *eps[1];
            tl->address(ctx[1], &a, &alen);
            st = tl->connect_all(ctx[0], &peer, 1, addrs, &alen, eps);
            if (st == SHOAL_OK) { /* lazy: the first send opens the segment */
                uint64_t v = 1;
                shoal_tl_req_t s = {.hdr = hdr_make(1, 0, sizeof(v)), .buf = &v};
                st = tl->isend(eps[0], &s);
                if (st == SHOAL_OK) {
                    tl->fail(ctx[0], 0, SHOAL_ERR_ABORTED); /* completes it */
                }
            }
        }
        tap_is_int(st, SHOAL_ERR_INVALID_ARG, "%s: a peer whose segment directory is another "
                   "is refused at connect as a configuration error", lazy ? "lazy" : "eager");
        shoal_shm_config.dir = dir;
        if (ctx[1] != NULL) {
            tl->fini(ctx[1]);
        }
        shoal_shm_config.dir = saved;
        if (ctx[0] != NULL) {
            tl->fini(ctx[0]);
        }
    }
    rmdir(dir);
}

/* A process that leaves by exit() without finalizing its contexts (a program that returns
 * from main without shoal_comm_destroy, a Python script that ends on an exception): a lazy
 * context keeps its segment's name until every local peer mapped it, and an eager one until
 * ready(). Before the fix, both names stayed in /dev/shm after the exit, each with its
 * fallocated pages (8 MiB of shared area by default), until a later shm init of the same user
 * swept them once they were a minute old; now an exit handler removes them. */
static void test_exit_unlink(void)
{
    int pfd[2] = {-1, -1};
    char names[3][SHOAL_SHM_NAME_MAX];
    memset(names, 0, sizeof(names));
    pid_t pid = pipe(pfd) == 0 ? fork() : -1;
    if (pid == 0) {
        alarm(30);
        close(pfd[0]);
        shoal_tl_ctx_t *ctx[3] = {NULL, NULL, NULL};
        shoal_shm_addr_t a[2];
        size_t alen[2];
        for (int r = 0; r < 3; r++) {
            shoal_tl_params_t params = {.rank = r % 2, .nranks = 2, .local_rank = r % 2,
                                        .local_size = 2, .comm_id = 0x5eed0005u + (r == 2),
                                        .secret = secret, .timeout_ms = 1000,
                                        .abort_flag = &no_abort, .lazy = r < 2};
            if (tl->init(&params, &ctx[r]) != SHOAL_OK) {
                _exit(1);
            }
            memcpy(names[r], ctx[r]->name, sizeof(names[r]));
            if (r < 2) {
                tl->address(ctx[r], &a[r], &alen[r]);
            }
        }
        /* two lazy contexts connected to each other, ready, never used; an eager one that
         * never got to ready() */
        for (int r = 0; r < 2; r++) {
            int peer = 1 - r;
            const void *addrs[1] = {&a[peer]};
            shoal_ep_t *eps[1];
            if (tl->connect_all(ctx[r], &peer, 1, addrs, &alen[peer], eps) != SHOAL_OK ||
                tl->ready(ctx[r]) != SHOAL_OK) {
                _exit(1);
            }
        }
        if (write(pfd[1], names, sizeof(names)) != (ssize_t)sizeof(names)) {
            _exit(1);
        }
        exit(0); /* no fini */
    }
    if (pfd[1] >= 0) {
        close(pfd[1]);
    }
    int got = pid > 0 && read(pfd[0], names, sizeof(names)) == (ssize_t)sizeof(names);
    if (pfd[0] >= 0) {
        close(pfd[0]);
    }
    int ws = 0;
    if (pid > 0) {
        waitpid(pid, &ws, 0);
    }
    got &= WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
    for (int r = 0; r < 3; r++) {
        char path[192];
        snprintf(path, sizeof(path), "/dev/shm%s", names[r]);
        int left = got && names[r][0] == '/' && access(path, F_OK) == 0;
        tap_ok(got && !left, "a %s context's segment is removed when its process exits without "
               "fini (%s)", r < 2 ? "lazy" : "not ready", left ? "left behind" : "gone");
        if (left) {
            unlink(path);
        }
    }
}

/* A umask without the owner's write bit (0277) made the segment 0400: init opened it again
 * for its lock before setting its mode, which failed for anyone but root ("opening segment
 * ... again failed: Permission denied"). Run as user nobody where we are root. */
static void test_umask(void)
{
    int ws = 0;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) {
            _exit(2);
        }
        umask(0277);
        shoal_tl_params_t params = {.rank = 0, .nranks = 1, .local_rank = 0, .local_size = 1,
                                    .comm_id = 0x5eed0004u, .secret = secret,
                                    .timeout_ms = 1000, .abort_flag = &no_abort};
        shoal_tl_ctx_t *ctx = NULL;
        shoal_status_t st = tl->init(&params, &ctx);
        if (st == SHOAL_OK) {
            tl->fini(ctx);
        }
        _exit(st == SHOAL_OK ? 0 : 1);
    }
    if (pid < 0 || waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws) || WEXITSTATUS(ws) == 2) {
        tap_skip(1, "cannot run init as user nobody");
        return;
    }
    tap_ok(WEXITSTATUS(ws) == 0, "init works under umask 0277 (child exit %d)",
           WEXITSTATUS(ws));
}

/* Sizes derived by src/tune (params->sizes) set the ring; zeros leave the variables'; a
 * derived value out of range is refused like the variable would be. */
static void test_sizes(void)
{
    shoal_tl_sizes_t z = {.shm_slot_size = 16 << 10, .shm_nslots = 32};
    shoal_tl_params_t params = {.rank = 0, .nranks = 1, .local_rank = 0, .local_size = 1,
                                .comm_id = 0x5eed0001u, .secret = secret, .timeout_ms = 1000,
                                .abort_flag = &no_abort, .sizes = &z};
    shoal_tl_ctx_t *ctx = NULL;
    shoal_shm_addr_t a;
    size_t alen;

    if (tl->init(&params, &ctx) != SHOAL_OK) {
        tap_ok(0, "init with derived sizes");
        return;
    }
    tl->address(ctx, &a, &alen);
    tap_ok(a.slot_size == 16 << 10 && a.nslots == 32, "derived sizes make the ring: %llu x %u",
           (unsigned long long)a.slot_size, a.nslots);
    tl->fini(ctx);
    z = (shoal_tl_sizes_t){0};
    if (tl->init(&params, &ctx) != SHOAL_OK) {
        tap_ok(0, "init without derived sizes");
        return;
    }
    tl->address(ctx, &a, &alen);
    tap_ok(a.slot_size == shoal_shm_config.slot_size && a.nslots == shoal_shm_config.nslots,
           "no derived sizes: the variables' ring (%llu x %u)", (unsigned long long)a.slot_size,
           a.nslots);
    tl->fini(ctx);
    z.shm_nslots = 1;
    ctx = NULL;
    tap_is_int(tl->init(&params, &ctx), SHOAL_ERR_INVALID_ARG, "a derived slot count of 1 is "
               "refused");
    z = (shoal_tl_sizes_t){.shm_slot_size = 64};
    tap_is_int(tl->init(&params, &ctx), SHOAL_ERR_INVALID_ARG, "a derived 64 B slot is refused");
}

int main(void)
{
    shoal_config_global_init();
    if (!tl->query()) {
        tap_skip_all("shm transport not usable here");
        return 0;
    }
    /* the geometry the 64 MiB case is about, whatever the environment says */
    shoal_shm_config.slot_size = 64 * 1024;
    shoal_shm_config.nslots = 8;
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        tap_bail("mmap: %s", strerror(errno));
        return 1;
    }
    test_local();
    test_sizes();
    test_umask();
    test_sweep();
    test_sweep_fork();
    test_exit_unlink();
    test_dir_differs();
    const case_t cases[] = {
        {.name = "segment", .nprocs = 2, .fn = case_segment, .pre_ready = case_segment_pre_ready,
         .killed_rank = -1},
        {.name = "big", .nprocs = 2, .fn = case_big, .killed_rank = -1},
        {.name = "wrap", .nprocs = 2, .fn = case_wrap, .killed_rank = -1},
        {.name = "wrap4", .nprocs = 4, .fn = case_wrap, .killed_rank = -1},
        {.name = "area", .nprocs = 3, .fn = case_area, .killed_rank = -1},
        {.name = "futex", .nprocs = 2, .fn = case_futex, .killed_rank = -1},
        {.name = "sleeper", .nprocs = 2, .fn = case_sleeper, .killed_rank = -1},
        {.name = "kill", .nprocs = 2, .fn = case_kill, .killed_rank = 1},
        {.name = "leader_exit", .nprocs = 2, .fn = case_leader_exit, .killed_rank = -1},
        {.name = "fail", .nprocs = 3, .fn = case_fail, .killed_rank = -1},
        {.name = "last_words", .nprocs = 2, .fn = case_last_words, .killed_rank = 1},
        {.name = "corrupt0", .nprocs = 2, .fn = case_corrupt, .killed_rank = -1, .variant = 0},
        {.name = "corrupt1", .nprocs = 2, .fn = case_corrupt, .killed_rank = -1, .variant = 1},
        {.name = "corrupt2", .nprocs = 2, .fn = case_corrupt, .killed_rank = -1, .variant = 2},
        {.name = "corrupt3", .nprocs = 2, .fn = case_corrupt, .killed_rank = -1, .variant = 3},
        {.name = "corrupt4", .nprocs = 2, .fn = case_corrupt, .killed_rank = -1, .variant = 4},
        {.name = "cma_recycled", .nprocs = 2, .fn = case_cma_recycled, .killed_rank = 1},
        {.name = "lazy_gone", .nprocs = 2, .fn = case_lazy_gone, .killed_rank = -1, .lazy = 1},
        {.name = "lazy_gone_pidns", .nprocs = 2, .fn = case_lazy_gone, .killed_rank = -1,
         .variant = 1, .lazy = 1, .pidns = 1},
        {.name = "lazy_gone_squat", .nprocs = 2, .fn = case_lazy_gone, .killed_rank = -1,
         .variant = 2, .lazy = 1},
        {.name = "lazy_gone_symlink", .nprocs = 2, .fn = case_lazy_gone, .killed_rank = -1,
         .variant = 3, .lazy = 1},
        {.name = "lazy_gone_dir", .nprocs = 2, .fn = case_lazy_gone, .killed_rank = -1,
         .variant = 4, .lazy = 1},
        {.name = "pidns", .nprocs = 2, .fn = case_pidns, .killed_rank = -1, .pidns = 1},
        {.name = "mem_fork", .nprocs = 2, .fn = case_mem_fork, .killed_rank = -1},
        {.name = "pidns_idle", .nprocs = 2, .fn = case_pidns_idle, .killed_rank = -1,
         .lazy = 1, .pidns = 1},
    };
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(cases); i++) {
        run_case(&cases[i]);
    }
    munmap(sh, sizeof(*sh));
    return tap_done();
}
