/* mp_coll sections beyond the data sweeps: barrier, send/recv, non-blocking calls, split,
 * invalid arguments, determinism. */
#include "tests/mp/mptest.h"

#include "reduce/reduce.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void mp_test_barrier(const mp_ctx_t *c, uint8_t *buf);
void mp_test_sendrecv(const mp_ctx_t *c, uint8_t *sbuf, uint8_t *rbuf);
void mp_test_nonblocking(const mp_ctx_t *c);
void mp_test_split(const mp_ctx_t *c);
void mp_test_invalid(const mp_ctx_t *c);
void mp_test_determinism(const mp_ctx_t *c, uint8_t *a, uint8_t *b, uint8_t *in);
void mp_test_mismatch(const mp_ctx_t *c);
void mp_test_p2pfail(const mp_ctx_t *c);
void mp_test_argcheck(const mp_ctx_t *c);

#define MP_ERR(st, comm) shoal_status_name(st), shoal_comm_last_error(comm)

/* mp_coll links with -Wl,--wrap=malloc: the library's malloc calls come here. A thread that
 * sets mp_malloc_fail to a size gets NULL from its next malloc of that size (the split's
 * table of colours), every other allocation is malloc's. */
void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
static __thread size_t mp_malloc_fail;

void *__wrap_malloc(size_t n)
{
    if (n != 0 && n == mp_malloc_fail) {
        mp_malloc_fail = 0;
        return NULL;
    }
    return __real_malloc(n);
}

static int64_t mp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- barrier ------------------------------------------------------------------------------ */

/* Ranks arrive staggered; nobody may leave before the last one arrived (one host: one
 * CLOCK_MONOTONIC for all ranks). */
static void mp_barrier_order(const mp_ctx_t *c, int g, int reverse, int64_t *enters)
{
    int slot = reverse ? c->nranks - 1 - c->rank : c->rank;
    int64_t enter, leave, last = 0;
    shoal_status_t st;

    usleep((useconds_t)slot * 15000);
    enter = mp_now_ns();
    st = shoal_barrier(c->comm, NULL);
    leave = mp_now_ns();
    if (st != SHOAL_OK) {
        mp_case(g, 0, c->rank, "ordered barrier: %s: %s", MP_ERR(st, c->comm));
        return;
    }
    st = shoal_allgather(&enter, enters, 1, SHOAL_INT64, c->comm, NULL);
    for (int q = 0; st == SHOAL_OK && q < c->nranks; q++) {
        last = enters[q] > last ? enters[q] : last;
    }
    mp_case(g, st == SHOAL_OK && leave >= last, c->rank,
            "left the barrier %.3f ms before the last rank arrived (status %s)",
            (double)(last - leave) / 1e6, shoal_status_name(st));
}

void mp_test_barrier(const mp_ctx_t *c, uint8_t *buf)
{
    int g = mp_group("barrier");
    for (int k = 0; k < 5; k++) {
        shoal_status_t st = shoal_barrier(c->comm, NULL);
        mp_case(g, st == SHOAL_OK, c->rank, "barrier %d: %s: %s", k, MP_ERR(st, c->comm));
    }
    mp_barrier_order(c, g, 0, (int64_t *)buf);
    mp_barrier_order(c, g, 1, (int64_t *)buf);
}

/* ---- send/recv ---------------------------------------------------------------------------- */

static void mp_ring_exchange(const mp_ctx_t *c, int g, shoal_dtype_t dt, size_t count,
                             uint8_t *sbuf, uint8_t *rbuf, uint8_t *want)
{
    int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
    size_t bytes = count * shoal_dtype_size(dt);
    shoal_status_t st1, st2;
    char why[256] = "";
    int ok;

    mp_fill(dt, SHOAL_MAX, c->rank, c->nranks, sbuf, count, 0);
    mp_fill(dt, SHOAL_MAX, prev, c->nranks, want, count, 0);
    memset(rbuf, 0xA5, bytes + 64);
    if (c->rank % 2 == 0) {
        st1 = shoal_send(sbuf, count, dt, next, c->comm, NULL);
        st2 = shoal_recv(rbuf, count, dt, prev, c->comm, NULL);
    } else {
        st2 = shoal_recv(rbuf, count, dt, prev, c->comm, NULL);
        st1 = shoal_send(sbuf, count, dt, next, c->comm, NULL);
    }
    ok = st1 == SHOAL_OK && st2 == SHOAL_OK;
    if (!ok) {
        snprintf(why, sizeof(why), "send %s, recv %s: %s", shoal_status_name(st1),
                 shoal_status_name(st2), shoal_comm_last_error(c->comm));
    } else {
        size_t d = mp_first_diff(rbuf, want, count, shoal_dtype_size(dt));
        char a[64], b[64];
        if (d < count) {
            ok = 0;
            snprintf(why, sizeof(why), "element %zu: expected %s got %s", d,
                     mp_fmt(dt, want, d, a, sizeof(a)), mp_fmt(dt, rbuf, d, b, sizeof(b)));
        } else if (rbuf[bytes] != 0xA5) {
            ok = 0;
            snprintf(why, sizeof(why), "wrote past the receive buffer");
        }
    }
    mp_case(g, ok, c->rank, "ring %s count %zu from %d: %s", shoal_dtype_name(dt), count, prev,
            why);
}

/* Everyone sends to rank 0, which receives in rank order. */
static void mp_fan_in(const mp_ctx_t *c, int g, uint8_t *sbuf, uint8_t *rbuf)
{
    const size_t count = 1021;
    shoal_status_t st = SHOAL_OK;

    if (c->rank != 0) {
        mp_fill(SHOAL_INT32, SHOAL_MIN, c->rank, c->nranks, sbuf, count, 0);
        st = shoal_send(sbuf, count, SHOAL_INT32, 0, c->comm, NULL);
        mp_case(g, st == SHOAL_OK, c->rank, "fan-in send: %s: %s", MP_ERR(st, c->comm));
        return;
    }
    for (int q = 1; q < c->nranks; q++) {
        int ok;
        st = shoal_recv(rbuf, count, SHOAL_INT32, q, c->comm, NULL);
        mp_fill(SHOAL_INT32, SHOAL_MIN, q, c->nranks, sbuf, count, 0);
        ok = st == SHOAL_OK && memcmp(rbuf, sbuf, count * 4) == 0;
        mp_case(g, ok, c->rank, "fan-in from %d: %s, data %s", q, shoal_status_name(st),
                st == SHOAL_OK && !ok ? "wrong" : "-");
    }
}

/* Inside a group every rank sends 4 MiB to both neighbours before it receives from them
 * (a torch batch_isend_irecv): the sends are larger than the transports' buffers, so the
 * group's end must post the receives with the sends; run one after the other, every rank sat
 * in its first send until the timeout. With mix, a host allreduce sits between the sends and
 * the receives (it runs at once) and the receives are in a nested group. */
static void mp_group_exchange(const mp_ctx_t *c, int g, int mix)
{
    const size_t count = (size_t)1048576; /* float32: 4 MiB */
    const size_t bytes = count * 4;
    int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
    uint8_t *s_next = mp_alloc(bytes), *s_prev = mp_alloc(bytes), *r_next = mp_alloc(bytes);
    uint8_t *r_prev = mp_alloc(bytes), *want = mp_alloc(bytes);
    shoal_status_t st = SHOAL_OK, st2;
    int32_t one = 1;
    char why[256] = "";
    int ok;

    /* Towards next: elements 0..count of the rank's input; towards prev: count..2 count. */
    mp_fill(SHOAL_FLOAT32, SHOAL_MAX, c->rank, c->nranks, s_next, count, 0);
    mp_fill(SHOAL_FLOAT32, SHOAL_MAX, c->rank, c->nranks, s_prev, count, count);
    memset(r_next, 0xA5, bytes);
    memset(r_prev, 0xA5, bytes);
    st2 = shoal_group_start();
    st = st2 != SHOAL_OK ? st2 : st;
    st2 = shoal_send(s_next, count, SHOAL_FLOAT32, next, c->comm, NULL);
    st = st2 != SHOAL_OK ? st2 : st;
    st2 = shoal_send(s_prev, count, SHOAL_FLOAT32, prev, c->comm, NULL);
    st = st2 != SHOAL_OK ? st2 : st;
    if (mix) {
        st2 = shoal_allreduce(&one, &one, 1, SHOAL_INT32, SHOAL_SUM, c->comm, NULL);
        st = st2 != SHOAL_OK ? st2 : (one != c->nranks ? SHOAL_ERR_INTERNAL : st);
        (void)shoal_group_start();
    }
    st2 = shoal_recv(r_prev, count, SHOAL_FLOAT32, prev, c->comm, NULL);
    st = st2 != SHOAL_OK ? st2 : st;
    st2 = shoal_recv(r_next, count, SHOAL_FLOAT32, next, c->comm, NULL);
    st = st2 != SHOAL_OK ? st2 : st;
    if (mix) {
        st2 = shoal_group_end();
        st = st2 != SHOAL_OK ? st2 : st;
    }
    st2 = shoal_group_end();
    st = st2 != SHOAL_OK ? st2 : st;
    ok = st == SHOAL_OK;
    if (!ok) {
        snprintf(why, sizeof(why), "%s: %s", MP_ERR(st, c->comm));
    }
    /* prev's first message to this rank is its send towards its next; next's is towards its
     * prev (with 2 ranks both come from one peer, in that order on both sides). */
    mp_fill(SHOAL_FLOAT32, SHOAL_MAX, prev, c->nranks, want, count, 0);
    if (ok && mp_first_diff(r_prev, want, count, 4) < count) {
        ok = 0;
        snprintf(why, sizeof(why), "wrong data from rank %d (prev)", prev);
    }
    mp_fill(SHOAL_FLOAT32, SHOAL_MAX, next, c->nranks, want, count, count);
    if (ok && mp_first_diff(r_next, want, count, 4) < count) {
        ok = 0;
        snprintf(why, sizeof(why), "wrong data from rank %d (next)", next);
    }
    mp_case(g, ok, c->rank, "group%s: 4 MiB to both neighbours, sends first: %s",
            mix ? " with an allreduce and a nested group" : "", why);
    free(s_next);
    free(s_prev);
    free(r_next);
    free(r_prev);
    free(want);
}

/* One group over two communicators (two splits of the job's): every rank sends 4 MiB to the
 * next rank and receives from the previous one on each, even ranks recording communicator A's
 * calls first, odd ranks B's. A group runs as one, whichever communicator its calls are on
 * (as NCCL's): the end ran one communicator's calls after the other's, in the order of their
 * first call, and a rank that waited on A's send while its peer waited on B's receive waited
 * until the timeout. */
static void mp_group_two_comms(const mp_ctx_t *c, int g)
{
    const size_t count = (size_t)1048576; /* float32: 4 MiB */
    const size_t bytes = count * 4;
    int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
    shoal_comm_t sub[2] = {NULL, NULL};
    uint8_t *sb[2], *rb[2], *want = mp_alloc(bytes);
    shoal_status_t st = SHOAL_OK, st2;
    char why[256] = "";
    int ok;

    for (int k = 0; k < 2; k++) {
        sb[k] = mp_alloc(bytes);
        rb[k] = mp_alloc(bytes);
        mp_fill(SHOAL_FLOAT32, SHOAL_MAX, c->rank, c->nranks, sb[k], count, (size_t)k * count);
        memset(rb[k], 0xA5, bytes);
        st2 = shoal_comm_split(c->comm, 0, c->rank, &sub[k]);
        st = st2 != SHOAL_OK ? st2 : st;
    }
    if (st == SHOAL_OK) {
        int64_t t0 = mp_now_ns();
        (void)shoal_group_start();
        for (int i = 0; i < 2; i++) {
            int k = (c->rank + i) % 2; /* even ranks: A first; odd ranks: B first */
            st2 = shoal_send(sb[k], count, SHOAL_FLOAT32, next, sub[k], NULL);
            st = st2 != SHOAL_OK ? st2 : st;
            st2 = shoal_recv(rb[k], count, SHOAL_FLOAT32, prev, sub[k], NULL);
            st = st2 != SHOAL_OK ? st2 : st;
        }
        st2 = shoal_group_end();
        st = st2 != SHOAL_OK ? st2 : st;
        if (st != SHOAL_OK) {
            snprintf(why, sizeof(why), "%s after %.0f ms: %s / %s", shoal_status_name(st),
                     (double)(mp_now_ns() - t0) / 1e6, shoal_comm_last_error(sub[0]),
                     shoal_comm_last_error(sub[1]));
        }
    } else {
        snprintf(why, sizeof(why), "split: %s", shoal_status_name(st));
    }
    ok = st == SHOAL_OK;
    for (int k = 0; k < 2 && ok; k++) {
        mp_fill(SHOAL_FLOAT32, SHOAL_MAX, prev, c->nranks, want, count, (size_t)k * count);
        if (mp_first_diff(rb[k], want, count, 4) < count) {
            ok = 0;
            snprintf(why, sizeof(why), "wrong data from rank %d on communicator %c", prev,
                     'A' + k);
        }
    }
    mp_case(g, ok, c->rank, "a group over two communicators, recorded in opposite orders: %s",
            why);
    for (int k = 0; k < 2; k++) {
        if (sub[k] != NULL) {
            (void)shoal_comm_destroy(sub[k]);
        }
        free(sb[k]);
        free(rb[k]);
    }
    free(want);
}

void mp_test_sendrecv(const mp_ctx_t *c, uint8_t *sbuf, uint8_t *rbuf)
{
    int g = mp_group("send/recv");
    uint8_t *want;

    if (c->nranks < 2) {
        return;
    }
    want = mp_alloc((size_t)4 * 1048576 + 64);
    mp_ring_exchange(c, g, SHOAL_UINT8, 0, sbuf, rbuf, want);
    mp_ring_exchange(c, g, SHOAL_UINT8, 1, sbuf, rbuf, want);
    mp_ring_exchange(c, g, SHOAL_INT32, 1, sbuf, rbuf, want);
    mp_ring_exchange(c, g, SHOAL_FLOAT64, 1021, sbuf, rbuf, want);
    mp_ring_exchange(c, g, SHOAL_UINT8, (size_t)4 * 1048576, sbuf, rbuf, want);
    mp_ring_exchange(c, g, SHOAL_INT32, 1048576, sbuf, rbuf, want);
    mp_fan_in(c, g, sbuf, rbuf);
    mp_ring_exchange(c, g, SHOAL_UINT8, 0, sbuf, rbuf, want);
    mp_group_exchange(c, g, 0);
    mp_group_exchange(c, g, 1);
    mp_group_two_comms(c, g);
    mp_ring_exchange(c, g, SHOAL_INT32, 1021, sbuf, rbuf, want); /* the channels still match */
    free(want);
}

/* A communicator of ranks 0 and 1 (2 s timeout) in *sub_p (NULL on the other ranks); on a
 * failure, a failed case of group g and not SHOAL_OK. */
static shoal_status_t mp_sub01(const mp_ctx_t *c, int g, shoal_comm_t *sub_p)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_status_t st, st2;
    shoal_uid_t uid;

    *sub_p = NULL;
    memset(&uid, 0, sizeof(uid));
    st = c->rank == 0 ? shoal_get_unique_id(&uid) : SHOAL_OK;
    st2 = shoal_broadcast(&uid, &uid, sizeof(uid), SHOAL_UINT8, 0, c->comm, NULL);
    st = st != SHOAL_OK ? st : st2;
    cfg.timeout_ms = 2000;
    if (st == SHOAL_OK && c->rank < 2) {
        st = shoal_comm_init(sub_p, 2, c->rank, &uid, &cfg);
    }
    memset(&uid, 0, sizeof(uid)); /* it holds the job secret */
    if (st != SHOAL_OK) {
        mp_case(g, 0, c->rank, "a communicator of ranks 0 and 1: %s", shoal_status_name(st));
    }
    return st;
}

typedef struct {
    shoal_comm_t comm;
    shoal_status_t st;
} mp_destroyer_t;

static void *mp_destroyer_main(void *arg)
{
    mp_destroyer_t *d = arg;
    d->st = shoal_comm_destroy(d->comm);
    return NULL;
}

/* A communicator destroyed inside a group after a send on it was recorded: the group's end
 * ran that send on the freed communicator (a use after free: a crash, or a wait on garbage).
 * Now the destroy drops what the thread's group recorded on it, and the end says so
 * (SHOAL_ERR_INVALID_ARG) without touching it; the next group is clean. other: the destroy
 * comes from another thread (the application serializes its calls on the communicator, not
 * its groups): it dropped only its own thread's calls, and the group's end ran the send on
 * the freed communicator (ASan: heap-use-after-free in shoal_api_group_flush). */
static void mp_group_destroyed(const mp_ctx_t *c, int other)
{
    int g = mp_group("a communicator destroyed inside a group%s: its end refuses its calls",
                     other ? " by another thread" : "");
    const size_t count = (size_t)1048576;
    shoal_comm_t sub = NULL;
    shoal_status_t st, st2, st3;
    float *buf;

    if (mp_sub01(c, g, &sub) != SHOAL_OK) {
        return;
    }
    if (c->rank != 0) {
        if (sub != NULL) {
            (void)shoal_comm_destroy(sub);
        }
        return;
    }
    buf = mp_alloc(count * 4);
    (void)shoal_group_start();
    st = shoal_send(buf, count, SHOAL_FLOAT32, 1, sub, NULL);
    if (other) {
        mp_destroyer_t d = {.comm = sub, .st = SHOAL_ERR_INTERNAL};
        pthread_t th;
        if (pthread_create(&th, NULL, mp_destroyer_main, &d) == 0) {
            (void)pthread_join(th, NULL);
        }
        st2 = d.st;
    } else {
        st2 = shoal_comm_destroy(sub);
    }
    st3 = shoal_group_end();
    mp_case(g, st == SHOAL_OK && st2 == SHOAL_OK && st3 == SHOAL_ERR_INVALID_ARG, c->rank,
            "send %s, destroy %s, group end %s", shoal_status_name(st),
            shoal_status_name(st2), shoal_status_name(st3));
    (void)shoal_group_start();
    st = shoal_group_end();
    mp_case(g, st == SHOAL_OK, c->rank, "the next (empty) group: %s", shoal_status_name(st));
    free(buf);
}

/* A group over two communicators where one peer never posts on the first (ranks 0 and 1, a
 * 2 s timeout): rank 0's end fails on it within its timeout, naming peer 1, while its send on
 * the job's communicator, which rank 1 receives, completes with the right bytes; the job's
 * communicator works on. */
static void mp_group_two_comms_fail(const mp_ctx_t *c)
{
    int g = mp_group("a group over two communicators, one peer silent on one of them");
    const size_t count = (size_t)1048576;
    shoal_comm_t sub = NULL;
    shoal_status_t st;
    float *buf, *want;

    if (mp_sub01(c, g, &sub) != SHOAL_OK) {
        return;
    }
    buf = mp_alloc(count * 4);
    want = mp_alloc(count * 4);
    mp_fill(SHOAL_FLOAT32, SHOAL_MAX, 0, c->nranks, want, count, 0);
    if (c->rank == 0) {
        int64_t t0 = mp_now_ns();
        const char *le;
        double ms;
        (void)shoal_group_start();
        (void)shoal_recv(buf, count, SHOAL_FLOAT32, 1, sub, NULL);
        (void)shoal_send(want, count, SHOAL_FLOAT32, 1, c->comm, NULL);
        st = shoal_group_end();
        ms = (double)(mp_now_ns() - t0) / 1e6;
        le = shoal_comm_last_error(sub);
        mp_case(g, st == SHOAL_ERR_TIMEOUT && ms < 10000 && strstr(le, "peer 1") != NULL,
                c->rank, "group end: %s after %.0f ms: %s", shoal_status_name(st), ms, le);
    } else if (c->rank == 1) {
        memset(buf, 0xA5, count * 4);
        st = shoal_recv(buf, count, SHOAL_FLOAT32, 0, c->comm, NULL); /* never posts on sub */
        mp_case(g, st == SHOAL_OK && mp_first_diff(buf, want, count, 4) == count, c->rank,
                "the send on the job's communicator: %s: %s", MP_ERR(st, c->comm));
    }
    st = shoal_barrier(c->comm, NULL);
    mp_case(g, st == SHOAL_OK, c->rank, "the job's communicator after: %s: %s",
            MP_ERR(st, c->comm));
    if (sub != NULL) {
        (void)shoal_comm_destroy(sub);
    }
    free(buf);
    free(want);
}

typedef struct {
    shoal_comm_t comm;
    const float *buf;
    shoal_status_t st;
} mp_leaver_t;

/* Records 4096 sends to rank 1 in a group and exits without its end. */
static void *mp_leaver_main(void *arg)
{
    mp_leaver_t *l = arg;
    l->st = shoal_group_start();
    for (int i = 0; i < 4096 && l->st == SHOAL_OK; i++) {
        l->st = shoal_send(l->buf, 1, SHOAL_FLOAT32, 1, l->comm, NULL);
    }
    return NULL;
}

/* Threads that exit inside a group (shoal_group_start without shoal_group_end): each left
 * its recorded calls (4096 here, 224 KiB) allocated for ever, 3.5 MiB over 16 threads. Now a
 * thread's exit frees its group: the heap (glibc's count; ASan's heap is not in it) grows
 * by less than 1 MiB. The recorded sends never run: rank 1 posts nothing. */
static void mp_group_thread_exit(const mp_ctx_t *c)
{
    int g = mp_group("threads that exit inside a group leave no memory behind");
    static const float buf[1];
    struct mallinfo2 m0, m1;
    shoal_status_t st = SHOAL_OK;
    long long grown;

    if (c->rank != 0) {
        return;
    }
    m0 = mallinfo2();
    for (int t = 0; t < 16 && st == SHOAL_OK; t++) {
        mp_leaver_t l = {.comm = c->comm, .buf = buf, .st = SHOAL_ERR_INTERNAL};
        pthread_t th;
        if (pthread_create(&th, NULL, mp_leaver_main, &l) == 0) {
            (void)pthread_join(th, NULL);
        }
        st = l.st;
    }
    m1 = mallinfo2();
    grown = (long long)(m1.uordblks + m1.hblkhd) - (long long)(m0.uordblks + m0.hblkhd);
    mp_case(g, st == SHOAL_OK && grown < 1048576, c->rank,
            "16 threads recorded 4096 sends each (%s) and exited: the heap grew by %lld bytes",
            shoal_status_name(st), grown);
}

/* A group that keeps making progress outlives the timeout: rank 0 receives 5 messages in one
 * group on a communicator with a 2 s timeout, and rank 1 sends them one at a time, 700 ms
 * apart (3.5 s in all). The group's wait measured the timeout from its post, not from its
 * last progress as a collective's does, and failed a healthy exchange after 2 s. */
static void mp_group_slow_progress(const mp_ctx_t *c)
{
    int g = mp_group("a group that makes progress slower than the timeout allows in all");
    shoal_comm_t sub = NULL;
    shoal_status_t st = SHOAL_OK;
    int32_t v[5] = {0};
    double ms;
    int64_t t0;

    if (c->nranks < 2 || mp_sub01(c, g, &sub) != SHOAL_OK) {
        return;
    }
    t0 = mp_now_ns();
    if (c->rank == 0) {
        (void)shoal_group_start();
        for (int i = 0; i < 5 && st == SHOAL_OK; i++) {
            st = shoal_recv(&v[i], 1, SHOAL_INT32, 1, sub, NULL);
        }
        st = st != SHOAL_OK ? st : shoal_group_end();
        ms = (double)(mp_now_ns() - t0) / 1e6;
        mp_case(g, st == SHOAL_OK && v[0] == 1 && v[4] == 5, c->rank,
                "5 receives in one group, their sends 700 ms apart, timeout 2 s: %s after "
                "%.0f ms, last %d: %s", shoal_status_name(st), ms, (int)v[4],
                shoal_comm_last_error(sub));
    } else if (c->rank == 1) {
        for (int i = 0; i < 5 && st == SHOAL_OK; i++) {
            int32_t x = i + 1;
            usleep(700 * 1000);
            st = shoal_send(&x, 1, SHOAL_INT32, 0, sub, NULL);
        }
        mp_case(g, st == SHOAL_OK, c->rank, "the 5 sends: %s", shoal_status_name(st));
    }
    if (sub != NULL) {
        (void)shoal_comm_destroy(sub);
    }
}

/* A group whose peer never posts its side: rank 0's group end fails within the timeout
 * (2 s, on a communicator of ranks 0 and 1 made for it), naming peer 1, and leaves nothing
 * behind; rank 1 waits on the main communicator until rank 0 is through. */
void mp_test_p2pfail(const mp_ctx_t *c)
{
    int g = mp_group("a group whose peer never posts: its end fails within the timeout");
    const size_t count = (size_t)1048576;
    shoal_comm_t sub = NULL;
    shoal_status_t st, st2;
    int32_t done = 0;
    float *buf;

    if (c->nranks < 2) {
        return;
    }
    if (mp_sub01(c, g, &sub) != SHOAL_OK) {
        return;
    }
    buf = mp_alloc(count * 4);
    if (c->rank == 0) {
        int64_t t0 = mp_now_ns();
        const char *le;
        double ms;
        (void)shoal_group_start();
        (void)shoal_send(buf, count, SHOAL_FLOAT32, 1, sub, NULL);
        (void)shoal_recv(buf, count, SHOAL_FLOAT32, 1, sub, NULL);
        st = shoal_group_end();
        ms = (double)(mp_now_ns() - t0) / 1e6;
        le = shoal_comm_last_error(sub);
        mp_case(g, st != SHOAL_OK && ms < 10000 && strstr(le, "peer 1") != NULL, c->rank,
                "group end: %s after %.0f ms: %s", shoal_status_name(st), ms, le);
        /* The next group's call is refused at once, and nothing of the failed group is left
         * for its end to run. */
        (void)shoal_group_start();
        st2 = shoal_recv(buf, count, SHOAL_FLOAT32, 1, sub, NULL);
        st = shoal_group_end();
        mp_case(g, st2 != SHOAL_OK && st == SHOAL_OK, c->rank,
                "a group on the failed communicator: recv %s, end %s",
                shoal_status_name(st2), shoal_status_name(st));
        done = 1;
        st = shoal_send(&done, 1, SHOAL_INT32, 1, c->comm, NULL);
        mp_case(g, st == SHOAL_OK, c->rank, "the main communicator: %s: %s", MP_ERR(st, c->comm));
    } else if (c->rank == 1) {
        st = shoal_recv(&done, 1, SHOAL_INT32, 0, c->comm, NULL); /* never posts on sub */
        mp_case(g, st == SHOAL_OK && done == 1, c->rank, "rank 0 is through: %s: %s",
                MP_ERR(st, c->comm));
    }
    free(buf);
    if (sub != NULL) {
        (void)shoal_comm_destroy(sub);
    }
    mp_group_destroyed(c, 0);
    mp_group_destroyed(c, 1);
    mp_group_two_comms_fail(c);
    mp_group_thread_exit(c);
    mp_group_slow_progress(c);
}

/* A process forked from a rank (a worker that exits through its atexit handlers, or calls the
 * library by mistake) holds a copy of the rank's communicator: its sockets, segments and
 * peers are the parent's, its threads are not there. Its destroy waited for the proxy and
 * root threads it does not have (rank 0 over tcp hung until killed), a call would talk on
 * the parent's connections, an abort would fail the parent's job. All are refused at once,
 * touching nothing, and the parent's communicator works on. The meter page is shared with
 * the child (MAP_SHARED): the child's refused calls counted in the parent's errors, which the
 * node agent bills and reports as the parent's. A stop request on the copy (a worker asking
 * the job to stop) was accepted with SHOAL_OK and lost: the flag it set is the child's own,
 * which no agreement of the parent reads. A split took a ticket before it looked: with a call
 * of the parent's in flight at the fork, whose ticket nobody serves in the child, it waited
 * forever; so did the end of a group the parent had open at the fork, which otherwise counted
 * its sends and receives in the parent's errors. shoal_comm_get_async_error answered SHOAL_OK
 * there, where shoal.h says every call but rank, size and last_error is refused. */
void mp_test_forked(const mp_ctx_t *c)
{
    int g = mp_group("a forked process cannot use, abort or destroy its parent's communicator");
    int32_t x = 1, y = 0;
    shoal_stats_t s0 = SHOAL_STATS_INIT, s1 = SHOAL_STATS_INIT;
    shoal_status_t st, st0 = shoal_comm_stats(c->comm, &s0);
    int32_t ix = 1, iy = 0, gs = c->rank, gr = -1;
    shoal_request_t ireq = NULL, ireq2 = NULL;
    int status = -1;
    pid_t pid;

    /* Rank 0's non-blocking call is in flight at the fork (its peers post theirs once their
     * child is done): its ticket is taken, and in the child nobody serves it. */
    if (c->rank == 0) {
        st = shoal_iallreduce(&ix, &iy, 1, SHOAL_INT32, SHOAL_SUM, c->comm, &ireq);
        st = st != SHOAL_OK ? st : shoal_ibarrier(c->comm, &ireq2);
        mp_case(g, st == SHOAL_OK, c->rank, "iallreduce and ibarrier before the fork: %s",
                shoal_status_name(st));
    }
    /* A group open at the fork: a send to the next rank and a receive from the previous one,
     * recorded by this thread, which the child inherits. */
    if (c->nranks > 1) {
        shoal_group_start();
        st = shoal_send(&gs, 1, SHOAL_INT32, (c->rank + 1) % c->nranks, c->comm, NULL);
        st = st != SHOAL_OK ? st
                            : shoal_recv(&gr, 1, SHOAL_INT32, (c->rank + c->nranks - 1) % c->nranks,
                                         c->comm, NULL);
        mp_case(g, st == SHOAL_OK, c->rank, "a send and a receive recorded in a group: %s",
                shoal_status_name(st));
    }
    pid = fork();
    if (pid == 0) {
        shoal_status_t a, b, d, r, sp, ge = SHOAL_ERR_INVALID_ARG, ae = SHOAL_OK, ga;
        shoal_status_t tt = SHOAL_ERR_INVALID_ARG, tw = SHOAL_ERR_INVALID_ARG;
        shoal_comm_t nc = c->comm;
        int tdone = 0;

        alarm(20);
        a = shoal_allreduce(&x, &y, 1, SHOAL_INT32, SHOAL_SUM, c->comm, NULL);
        if (a == SHOAL_ERR_INVALID_ARG) {
            shoal_request_t req = NULL;
            a = shoal_ibarrier(c->comm, &req) == SHOAL_ERR_INVALID_ARG ? a : SHOAL_OK;
        }
        r = shoal_comm_request_stop(c->comm);
        /* it answered SHOAL_OK, with SHOAL_ERR_INVALID_ARG as the async error */
        ga = shoal_comm_get_async_error(c->comm, &ae);
        b = shoal_comm_abort(c->comm);
        d = shoal_comm_destroy(c->comm);
        /* it took a ticket and waited for the parent's call in flight to end: forever */
        sp = shoal_comm_split(c->comm, 0, 0, &nc);
        /* the end of the inherited group: the same wait (nothing may go out on the parent's
         * channels) */
        if (c->nranks > 1) {
            ge = shoal_group_end();
        }
        /* rank 0's requests, in flight at the fork: no proxy thread here completes them (the
         * test said not done forever, the wait waited forever); done before the fork (a
         * late fork), they answer as in the parent */
        if (c->rank == 0) {
            tt = shoal_test(&ireq2, &tdone);
            tt = tdone == 1 && ireq2 == NULL && tt == SHOAL_OK ? SHOAL_ERR_INVALID_ARG
                 : tdone == 1 && ireq2 == NULL                ? tt
                                                              : SHOAL_OK;
            tw = shoal_wait(&ireq);
            tw = ireq == NULL && tw == SHOAL_OK && iy == c->nranks ? SHOAL_ERR_INVALID_ARG
                 : ireq == NULL                                    ? tw
                                                                   : SHOAL_OK;
        }
        _exit(a != SHOAL_ERR_INVALID_ARG || b != SHOAL_ERR_INVALID_ARG ||
                      d != SHOAL_ERR_INVALID_ARG ? 1
              : r != SHOAL_ERR_INVALID_ARG        ? 2
              : sp != SHOAL_ERR_INVALID_ARG || nc != NULL ? 3
              : ge != SHOAL_ERR_INVALID_ARG       ? 4
              : ga != SHOAL_ERR_INVALID_ARG       ? 5
              : tt != SHOAL_ERR_INVALID_ARG || tw != SHOAL_ERR_INVALID_ARG ? 6
                                                  : 0);
    }
    if (pid > 0) {
        (void)waitpid(pid, &status, 0);
    }
    if (c->rank != 0) {
        st = shoal_iallreduce(&ix, &iy, 1, SHOAL_INT32, SHOAL_SUM, c->comm, &ireq);
        st = st != SHOAL_OK ? st : shoal_ibarrier(c->comm, &ireq2);
    }
    st = shoal_wait(&ireq);
    st = st != SHOAL_OK ? st : shoal_wait(&ireq2);
    mp_case(g, st == SHOAL_OK && iy == c->nranks, c->rank, "the parent's iallreduce over the "
            "fork: %s, %d: %s", shoal_status_name(st), (int)iy, shoal_comm_last_error(c->comm));
    if (c->nranks > 1) {
        st = shoal_group_end();
        mp_case(g, st == SHOAL_OK && gr == (c->rank + c->nranks - 1) % c->nranks, c->rank,
                "the parent's group over the fork: %s, got %d: %s", shoal_status_name(st),
                (int)gr, shoal_comm_last_error(c->comm));
    }
    mp_case(g, pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) != 1, c->rank,
            "the child's allreduce, abort and destroy are refused at once (wait status %#x)",
            (unsigned)status);
    mp_case(g, pid > 0 && WIFEXITED(status) && (WEXITSTATUS(status) == 0 ||
                                                WEXITSTATUS(status) >= 3), c->rank,
            "the child's shoal_comm_request_stop is refused, not accepted and lost (wait "
            "status %#x)", (unsigned)status);
    mp_case(g, pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) != 3, c->rank,
            "the child's shoal_comm_split is refused at once, with a call of the parent's in "
            "flight (wait status %#x)", (unsigned)status);
    mp_case(g, pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) != 4, c->rank,
            "the child's end of the group it inherited is refused at once, posting nothing "
            "(wait status %#x)", (unsigned)status);
    mp_case(g, pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) != 5, c->rank,
            "the child's shoal_comm_get_async_error is refused like every call there (wait "
            "status %#x)", (unsigned)status);
    mp_case(g, pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, c->rank,
            "the child's shoal_test and shoal_wait of the parent's request in flight at the "
            "fork are refused at once (wait status %#x)", (unsigned)status);
    st = shoal_comm_stats(c->comm, &s1);
    mp_case(g, st0 == SHOAL_OK && st == SHOAL_OK && s1.errors == s0.errors, c->rank,
            "the child's refused calls are not counted in the parent's meter: errors +%llu",
            (unsigned long long)(s1.errors - s0.errors));
    st = shoal_allreduce(&x, &y, 1, SHOAL_INT32, SHOAL_SUM, c->comm, NULL);
    mp_case(g, st == SHOAL_OK && y == c->nranks, c->rank, "the parent's communicator works "
            "on: %s: %s", MP_ERR(st, c->comm));
}

/* ---- an abort during a split -------------------------------------------------------------- */

typedef struct {
    shoal_comm_t world, sub;
} mp_aborter_t;

/* Aborts sub once rank 1 says (over world, which another thread may use meanwhile) that its
 * split is over: the leader is then past the exchange, in the child's bootstrap. */
static void *mp_aborter_main(void *arg)
{
    mp_aborter_t *ab = arg;
    int32_t over = 0;
    (void)shoal_recv(&over, 1, SHOAL_INT32, 1, ab->world, NULL);
    usleep(100 * 1000);
    (void)shoal_comm_abort(ab->sub);
    return NULL;
}

/* Rank 1 cannot make the child of a split (out of descriptors: its init fails before it joins
 * the child's root), so rank 0, the child's leader, waits in the child's bootstrap for it;
 * a second thread of rank 0 aborts the parent once rank 1's split is over. The split must
 * return then: it waited out the timeout (the child's bootstrap obeyed only the child's own
 * abort flag, which nobody can set). On a communicator split off for it (the abort fails
 * it); the others opt out. */
static void mp_test_split_leader_fails(const mp_ctx_t *c, int g);

void mp_test_splitabort(const mp_ctx_t *c)
{
    int g = mp_group("an abort of the parent ends a split waiting for a member's join");
    shoal_comm_t sub = NULL, nc = NULL;
    shoal_status_t st = shoal_comm_split(c->comm, 0, c->rank, &sub);
    struct rlimit rl0, rl;
    pthread_t th;
    mp_aborter_t ab = {.world = c->comm, .sub = sub};
    int32_t over = 1;
    int lowfd = -1, color = c->rank < 2 ? 0 : SHOAL_SPLIT_NOCOLOR, started = 0;
    double t0, ms;

    mp_case(g, st == SHOAL_OK && sub != NULL, c->rank, "split for the test: %s: %s",
            MP_ERR(st, c->comm));
    if (st != SHOAL_OK || c->nranks < 2) {
        shoal_comm_destroy(sub);
        return;
    }
    if (c->rank == 1 && getrlimit(RLIMIT_NOFILE, &rl0) == 0 &&
        (lowfd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) {
        close(lowfd); /* the lowest free descriptor: below it all are taken */
        rl = rl0;
        rl.rlim_cur = (rlim_t)lowfd;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            lowfd = -1;
        }
    }
    if (c->rank == 0) {
        started = pthread_create(&th, NULL, mp_aborter_main, &ab) == 0;
    }
    t0 = mp_now_ms();
    st = shoal_comm_split(sub, color, c->rank, &nc);
    ms = mp_now_ms() - t0;
    if (lowfd >= 0) {
        setrlimit(RLIMIT_NOFILE, &rl0);
    }
    if (c->rank == 1) {
        (void)shoal_send(&over, 1, SHOAL_INT32, 0, c->comm, NULL); /* rank 0 aborts now */
    }
    if (c->rank == 0) {
        if (started) {
            pthread_join(th, NULL);
        }
        mp_case(g, st == SHOAL_ERR_ABORTED && nc == NULL && ms < 5000, c->rank,
                "the leader's split, its parent aborted as it waits: %s after %.0f ms, comm %p "
                "(expected SHOAL_ERR_ABORTED within 5 s)", shoal_status_name(st), ms,
                (void *)nc);
    } else if (c->rank == 1) {
        /* SHOAL_ERR_SYSTEM, logged: it said SHOAL_ERR_NO_MEMORY (the eventfd's EMFILE), and
         * nothing in the log */
        mp_case(g, st == SHOAL_ERR_SYSTEM && nc == NULL, c->rank, "the split of the member out "
                "of descriptors: %s, comm %p (expected SHOAL_ERR_SYSTEM)", shoal_status_name(st),
                (void *)nc);
    }
    if (nc != NULL) {
        shoal_comm_destroy(nc);
    }
    shoal_comm_destroy(sub);
    mp_test_split_leader_fails(c, g);
}

/* The rlimit that leaves this process exactly n free descriptors, or 0. */
static rlim_t mp_fd_limit_for(int n)
{
    for (int fd = 0; fd < 65536; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && --n == 0) {
            return (rlim_t)fd + 1;
        }
    }
    return 0;
}

/* The leader (rank 0), left one free descriptor, starts the child's root, then cannot make
 * the child (out of descriptors before its bootstrap): rank 1, waiting at the root for the
 * leader's join, must be told at once. It waited out its timeout (the root, which the
 * leader's failed init did not fail, waited for the leader). */
static void mp_test_split_leader_fails(const mp_ctx_t *c, int g)
{
    shoal_comm_t sub = NULL, nc = NULL;
    shoal_status_t st = shoal_comm_split(c->comm, 0, c->rank, &sub);
    struct rlimit rl0, rl;
    int color = c->rank < 2 ? 0 : SHOAL_SPLIT_NOCOLOR, limited = 0;
    double t0, ms;

    if (st != SHOAL_OK || c->nranks < 2) {
        shoal_comm_destroy(sub);
        return;
    }
    /* the roots of the earlier splits close their descriptors as their threads end (1 s at
     * most after their last rank) */
    usleep(1500 * 1000);
    if (c->rank == 0 && getrlimit(RLIMIT_NOFILE, &rl0) == 0) {
        rl = rl0;
        rl.rlim_cur = mp_fd_limit_for(1);
        limited = rl.rlim_cur > 0 && setrlimit(RLIMIT_NOFILE, &rl) == 0;
    }
    t0 = mp_now_ms();
    st = shoal_comm_split(sub, color, c->rank, &nc);
    ms = mp_now_ms() - t0;
    if (limited) {
        setrlimit(RLIMIT_NOFILE, &rl0);
    }
    if (c->rank == 0) {
        mp_case(g, !limited || (st != SHOAL_OK && nc == NULL), c->rank, "the split of the "
                "leader out of descriptors: %s, comm %p (expected a failure)",
                shoal_status_name(st), (void *)nc);
    } else if (c->rank == 1) {
        mp_case(g, st != SHOAL_OK && nc == NULL && ms < 5000, c->rank, "a member of a split "
                "whose leader cannot make the child: %s after %.0f ms, comm %p (expected a "
                "failure within 5 s)", shoal_status_name(st), ms, (void *)nc);
    }
    if (nc != NULL) {
        shoal_comm_destroy(nc);
    }
    shoal_comm_destroy(sub);
}

/* ---- non-blocking ------------------------------------------------------------------------- */

typedef struct {
    shoal_dtype_t dt;
    shoal_op_t op;
    size_t count;
    int inplace;
    uint8_t *s, *r, *want;
    shoal_request_t req;
} mp_nb_t;

static void mp_nb_setup(const mp_ctx_t *c, mp_nb_t *nb)
{
    size_t bytes = nb->count * shoal_dtype_size(nb->dt);
    nb->s = mp_alloc(bytes + 64);
    nb->r = nb->inplace ? nb->s : mp_alloc(bytes + 64);
    nb->want = mp_alloc(bytes + 64);
    mp_fill(nb->dt, nb->op, c->rank, c->nranks, nb->s, nb->count, 0);
    mp_expect(nb->dt, nb->op, c->nranks, nb->want, nb->count, 0);
    nb->req = NULL;
}

static void mp_nb_check(const mp_ctx_t *c, int g, mp_nb_t *nb, shoal_status_t st,
                        const char *how)
{
    size_t d = st == SHOAL_OK ? mp_first_diff(nb->r, nb->want, nb->count,
                                               shoal_dtype_size(nb->dt))
                              : 0;
    char a[64], b[64];
    if (st != SHOAL_OK) {
        mp_case(g, 0, c->rank, "%s %s %s count %zu: %s: %s", how, shoal_dtype_name(nb->dt),
                shoal_op_name(nb->op), nb->count, MP_ERR(st, c->comm));
    } else {
        mp_case(g, d == nb->count, c->rank, "%s %s %s count %zu: element %zu expected %s got %s",
                how, shoal_dtype_name(nb->dt), shoal_op_name(nb->op), nb->count, d,
                d < nb->count ? mp_fmt(nb->dt, nb->want, d, a, sizeof(a)) : "-",
                d < nb->count ? mp_fmt(nb->dt, nb->r, d, b, sizeof(b)) : "-");
    }
    if (!nb->inplace) {
        free(nb->r);
    }
    free(nb->s);
    free(nb->want);
}

static shoal_status_t mp_nb_poll(shoal_request_t *req)
{
    double deadline = mp_now_ms() + 60000;
    int done = 0;
    shoal_status_t st;
    for (;;) {
        st = shoal_test(req, &done);
        if (done || (st != SHOAL_OK && st != SHOAL_IN_PROGRESS)) {
            return st;
        }
        if (mp_now_ms() > deadline) {
            (void)shoal_wait(req); /* the request must be freed; report the slowness */
            return SHOAL_ERR_TIMEOUT;
        }
        usleep(100);
    }
}

static void mp_nb_post(const mp_ctx_t *c, int g, mp_nb_t *nbs, int n);

/* The call that completes a request frees it and clears the handle: a second wait or test
 * on it is a completed request (before the handle was cleared, it was a use after free). */
static void mp_nb_twice(const mp_ctx_t *c, int g, mp_nb_t *nb)
{
    shoal_status_t st, st2, st3;
    int done = 0;

    mp_nb_post(c, g, nb, 1);
    st = shoal_wait(&nb->req);
    mp_case(g, nb->req == NULL, c->rank, "shoal_wait left the handle set (%p)", (void *)nb->req);
    st2 = shoal_wait(&nb->req);
    st3 = shoal_test(&nb->req, &done);
    mp_case(g, st2 == SHOAL_OK && st3 == SHOAL_OK && done == 1, c->rank,
            "second wait %s, then test %s done %d on a completed request: expected SUCCESS "
            "done 1", shoal_status_name(st2), shoal_status_name(st3), done);
    mp_nb_check(c, g, nb, st, "wait, then wait and test again:");

    mp_nb_post(c, g, nb, 1);
    st = mp_nb_poll(&nb->req);
    mp_case(g, nb->req == NULL, c->rank, "shoal_test done left the handle set (%p)",
            (void *)nb->req);
    done = 0;
    st2 = shoal_test(&nb->req, &done);
    st3 = shoal_wait(&nb->req);
    mp_case(g, st2 == SHOAL_OK && done == 1 && st3 == SHOAL_OK, c->rank,
            "test %s done %d, then wait %s after a completing test: expected SUCCESS done 1",
            shoal_status_name(st2), done, shoal_status_name(st3));
    mp_nb_check(c, g, nb, st, "test until done, then test and wait again:");
}

static void mp_nb_post(const mp_ctx_t *c, int g, mp_nb_t *nbs, int n)
{
    for (int k = 0; k < n; k++) {
        shoal_status_t st;
        mp_nb_setup(c, &nbs[k]);
        st = shoal_iallreduce(nbs[k].s, nbs[k].r, nbs[k].count, nbs[k].dt, nbs[k].op, c->comm,
                              &nbs[k].req);
        mp_case(g, st == SHOAL_OK && nbs[k].req != NULL, c->rank, "iallreduce post %d: %s", k,
                shoal_status_name(st));
    }
}

void mp_test_nonblocking(const mp_ctx_t *c)
{
    int g = mp_group("iallreduce/test/wait");
    mp_nb_t nbs[4] = {
        {.dt = SHOAL_FLOAT32, .op = SHOAL_SUM, .count = 1021},
        {.dt = SHOAL_INT32, .op = SHOAL_MAX, .count = 65537},
        {.dt = SHOAL_BFLOAT16, .op = SHOAL_AVG, .count = 13, .inplace = 1},
        {.dt = SHOAL_UINT8, .op = SHOAL_SUM, .count = 0},
    };
    mp_nb_t blk = {.dt = SHOAL_INT64, .op = SHOAL_SUM, .count = 7};

    /* Several outstanding, a blocking call behind them, then test-poll one and wait the rest. */
    mp_nb_post(c, g, nbs, 4);
    mp_nb_setup(c, &blk);
    mp_nb_check(c, g, &blk,
                shoal_allreduce(blk.s, blk.r, blk.count, blk.dt, blk.op, c->comm, NULL),
                "blocking call behind 4 requests:");
    mp_nb_check(c, g, &nbs[0], mp_nb_poll(&nbs[0].req), "shoal_test polling:");
    for (int k = 1; k < 4; k++) {
        mp_nb_check(c, g, &nbs[k], shoal_wait(&nbs[k].req), "shoal_wait:");
    }
    /* Waited in reverse order. */
    mp_nb_post(c, g, nbs, 3);
    for (int k = 2; k >= 0; k--) {
        mp_nb_check(c, g, &nbs[k], shoal_wait(&nbs[k].req), "shoal_wait in reverse order:");
    }
    /* Polled in reverse order, all of them. */
    mp_nb_post(c, g, nbs, 4);
    for (int k = 3; k >= 0; k--) {
        mp_nb_check(c, g, &nbs[k], mp_nb_poll(&nbs[k].req), "shoal_test in reverse order:");
    }
    mp_nb_twice(c, g, &nbs[0]);
}

/* ---- split -------------------------------------------------------------------------------- */

static void mp_split_check(const mp_ctx_t *c, int g, int color, int key, int want_size,
                           int want_rank, int want_sum, int want_root_parent)
{
    shoal_comm_t nc = NULL;
    shoal_status_t st = shoal_comm_split(c->comm, color, key, &nc);
    int32_t v[2] = {c->rank, 0};
    int32_t root_parent = c->rank;
    int r = -1, s = -1;

    if (color == SHOAL_SPLIT_NOCOLOR) {
        mp_case(g, st == SHOAL_OK && nc == NULL, c->rank, "split NOCOLOR: %s, comm %p",
                shoal_status_name(st), (void *)nc);
        return;
    }
    if (st != SHOAL_OK || nc == NULL) {
        mp_case(g, 0, c->rank, "split color %d key %d: %s: %s", color, key, MP_ERR(st, c->comm));
        return;
    }
    shoal_comm_rank(nc, &r);
    shoal_comm_size(nc, &s);
    mp_case(g, r == want_rank && s == want_size, c->rank,
            "color %d key %d: new rank %d of %d, expected %d of %d", color, key, r, s, want_rank,
            want_size);
    v[1] = r;
    st = shoal_allreduce(v, v, 2, SHOAL_INT32, SHOAL_SUM, nc, NULL);
    mp_case(g, st == SHOAL_OK && v[0] == want_sum && v[1] == want_size * (want_size - 1) / 2,
            c->rank, "allreduce on the split comm: %s, sum of parent ranks %d (expected %d), "
            "of new ranks %d", shoal_status_name(st), v[0], want_sum, v[1]);
    st = shoal_broadcast(&root_parent, &root_parent, 1, SHOAL_INT32, 0, nc, NULL);
    mp_case(g, st == SHOAL_OK && root_parent == want_root_parent, c->rank,
            "broadcast from new rank 0: %s, got parent rank %d, expected %d",
            shoal_status_name(st), root_parent, want_root_parent);
    st = shoal_comm_destroy(nc);
    mp_case(g, st == SHOAL_OK, c->rank, "destroy split comm: %s", shoal_status_name(st));
}

void mp_test_split(const mp_ctx_t *c)
{
    int g = mp_group("comm_split");
    int color = c->rank % 2, size = 0, newrank = 0, sum = 0, top = -1;
    shoal_status_t st;
    int32_t x;

    for (int q = 0; q < c->nranks; q++) {
        if (q % 2 == color) {
            size++;
            sum += q;
            newrank += q > c->rank;
            top = q;
        }
    }
    /* key = -rank: the highest parent rank of each color becomes new rank 0. */
    mp_split_check(c, g, color, -c->rank, size, newrank, sum, top);
    /* The parent still works. */
    x = 1;
    st = shoal_allreduce(&x, &x, 1, SHOAL_INT32, SHOAL_SUM, c->comm, NULL);
    mp_case(g, st == SHOAL_OK && x == c->nranks, c->rank, "parent after split: %s, %d",
            shoal_status_name(st), (int)x);
    if (c->nranks >= 2) {
        /* Rank 0 opts out; the rest keep their order (equal keys: parent order). */
        int n1 = c->nranks - 1;
        mp_split_check(c, g, c->rank == 0 ? SHOAL_SPLIT_NOCOLOR : 7, 0, n1, c->rank - 1,
                       c->nranks * n1 / 2, 1);
        /* The last rank passes an invalid colour: every rank fails the split at once (the
         * others waited out their timeout, 300 s by default), and the parent still works. */
        shoal_comm_t nc = c->comm;
        double t0 = mp_now_ms();
        st = shoal_comm_split(c->comm, c->rank == c->nranks - 1 ? -3 : 5, 0, &nc);
        double ms = mp_now_ms() - t0;
        mp_case(g, st == SHOAL_ERR_INVALID_ARG && nc == NULL && ms < 5000, c->rank,
                "split where rank %d passed colour -3: %s in %.0f ms, comm %p (expected "
                "invalid argument on every rank at once, no comm)", c->nranks - 1,
                shoal_status_name(st), ms, (void *)nc);
        x = 1;
        st = shoal_allreduce(&x, &x, 1, SHOAL_INT32, SHOAL_SUM, c->comm, NULL);
        mp_case(g, st == SHOAL_OK && x == c->nranks, c->rank, "parent after the failed split: "
                "%s, %d", shoal_status_name(st), (int)x);
        /* The last rank's malloc of the split's table (a colour and a key per rank) fails: it
         * returned at once, the others waited out their timeout for it and failed the parent,
         * and its split counter fell behind theirs. Now every rank fails the split at once,
         * the parent works on, and the next split agrees on the child's key. */
        nc = c->comm;
        if (c->rank == c->nranks - 1) {
            mp_malloc_fail = 2 * sizeof(int64_t) * (size_t)c->nranks;
        }
        t0 = mp_now_ms();
        st = shoal_comm_split(c->comm, 5, 0, &nc);
        ms = mp_now_ms() - t0;
        mp_malloc_fail = 0;
        mp_case(g, st == SHOAL_ERR_NO_MEMORY && nc == NULL && ms < 5000, c->rank,
                "split where rank %d had no memory for its table: %s in %.0f ms, comm %p "
                "(expected no memory on every rank at once, no comm): %s", c->nranks - 1,
                shoal_status_name(st), ms, (void *)nc, shoal_comm_last_error(c->comm));
        x = 1;
        st = shoal_allreduce(&x, &x, 1, SHOAL_INT32, SHOAL_SUM, c->comm, NULL);
        mp_case(g, st == SHOAL_OK && x == c->nranks, c->rank, "parent after the split without "
                "memory: %s, %d: %s", shoal_status_name(st), (int)x,
                shoal_comm_last_error(c->comm));
        mp_split_check(c, g, color, -c->rank, size, newrank, sum, top);
        /* The leader (rank 0: key 0 everywhere, first in parent order) cannot start the
         * child's root: it is out of descriptors. The members said SHOAL_ERR_PEER_FAILED of
         * a healthy parent; every rank now says what failed on the leader. */
        struct rlimit rl0, rl;
        int lowfd = -1;
        if (c->rank == 0 && getrlimit(RLIMIT_NOFILE, &rl0) == 0 &&
            (lowfd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) {
            close(lowfd); /* the lowest free descriptor: below it all are taken */
            rl = rl0;
            rl.rlim_cur = (rlim_t)lowfd;
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
                lowfd = -1;
            }
        }
        nc = c->comm;
        t0 = mp_now_ms();
        st = shoal_comm_split(c->comm, 5, 0, &nc);
        ms = mp_now_ms() - t0;
        if (c->rank == 0 && lowfd >= 0) {
            (void)setrlimit(RLIMIT_NOFILE, &rl0);
        }
        mp_case(g, st == SHOAL_ERR_SYSTEM && nc == NULL && ms < 5000, c->rank,
                "split whose leader could not start the child's root (no descriptors): %s in "
                "%.0f ms, comm %p (expected its system error on every rank at once): %s",
                shoal_status_name(st), ms, (void *)nc, shoal_comm_last_error(c->comm));
        x = 1;
        st = shoal_allreduce(&x, &x, 1, SHOAL_INT32, SHOAL_SUM, c->comm, NULL);
        mp_case(g, st == SHOAL_OK && x == c->nranks, c->rank, "parent after the split without "
                "a root: %s, %d: %s", shoal_status_name(st), (int)x,
                shoal_comm_last_error(c->comm));
    }
}

/* ---- invalid arguments -------------------------------------------------------------------- */

#define MP_EXPECT_ST(g, call, want)                                                            \
    do {                                                                                       \
        shoal_status_t st_ = (call);                                                           \
        mp_case((g), st_ == (want), c->rank, "%s returned %s, expected %s", #call,             \
                shoal_status_name(st_), shoal_status_name(want));                              \
    } while (0)

static void mp_invalid_colls(const mp_ctx_t *c, int g)
{
    shoal_comm_t comm = c->comm;
    int32_t x[4] = {0};
    int n = c->nranks, me = c->rank;
    void *strm = (void *)x;

    MP_EXPECT_ST(g, shoal_allreduce(x, x, 1, SHOAL_INT32, SHOAL_SUM, NULL, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_allreduce(x, x, 1, SHOAL_DTYPE_COUNT, SHOAL_SUM, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_allreduce(x, x, 1, (shoal_dtype_t)-1, SHOAL_SUM, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_allreduce(x, x, 1, SHOAL_INT32, SHOAL_OP_COUNT, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_allreduce(NULL, x, 4, SHOAL_INT32, SHOAL_SUM, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_allreduce(x, NULL, 4, SHOAL_INT32, SHOAL_SUM, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_allreduce(x, x, SIZE_MAX, SHOAL_INT32, SHOAL_SUM, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_broadcast(x, x, 1, SHOAL_INT32, n, comm, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_broadcast(x, x, 1, SHOAL_INT32, -1, comm, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_reduce(x, x, 1, SHOAL_INT32, SHOAL_SUM, n, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_allgather(x, x, 1, SHOAL_DTYPE_COUNT, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_reduce_scatter(x, x, 1, SHOAL_INT32, SHOAL_OP_COUNT, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_send(x, 1, SHOAL_INT32, me, comm, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_recv(x, 1, SHOAL_INT32, me, comm, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_send(x, 1, SHOAL_INT32, n, comm, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_recv(x, 1, SHOAL_INT32, -1, comm, NULL), SHOAL_ERR_INVALID_ARG);
    /* Buffers that overlap other than in place are refused (they gave wrong sums with
     * SHOAL_OK from 2 ranks on); big holds recvbuf for 8 ranks of 2 elements, never touched. */
    int32_t big[2 * 8 + 2] = {0};
    MP_EXPECT_ST(g, shoal_allreduce(x, x + 1, 2, SHOAL_INT32, SHOAL_SUM, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_allreduce(x + 1, x, 2, SHOAL_INT32, SHOAL_SUM, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    if (n <= 8) {
        MP_EXPECT_ST(g, shoal_allgather(big + 1, big, 2, SHOAL_INT32, comm, NULL),
                     SHOAL_ERR_INVALID_ARG);
        MP_EXPECT_ST(g, shoal_reduce_scatter(big, big + 1, 2, SHOAL_INT32, SHOAL_SUM, comm, NULL),
                     SHOAL_ERR_INVALID_ARG);
        MP_EXPECT_ST(g, shoal_alltoall(big, big + 1, 2, SHOAL_INT32, comm, NULL),
                     SHOAL_ERR_INVALID_ARG);
    }
    MP_EXPECT_ST(g, shoal_allreduce(x, x, 1, SHOAL_INT32, SHOAL_SUM, comm, strm),
                 SHOAL_ERR_UNSUPPORTED);
    MP_EXPECT_ST(g, shoal_broadcast(x, x, 1, SHOAL_INT32, 0, comm, strm), SHOAL_ERR_UNSUPPORTED);
    MP_EXPECT_ST(g, shoal_barrier(comm, strm), SHOAL_ERR_UNSUPPORTED);
    if (n > 1) {
        MP_EXPECT_ST(g, shoal_send(x, 1, SHOAL_INT32, (me + 1) % n, comm, strm),
                     SHOAL_ERR_UNSUPPORTED);
    }
}

static void mp_invalid_misc(const mp_ctx_t *c, int g)
{
    shoal_comm_t comm = c->comm, nc = NULL;
    shoal_request_t req = NULL;
    shoal_uid_t uid;
    int32_t x[4] = {0};
    int r, done;

    memset(&uid, 0, sizeof(uid));
    MP_EXPECT_ST(g, shoal_iallreduce(x, x, 1, SHOAL_INT32, SHOAL_SUM, comm, NULL),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_iallreduce(x, x, 1, SHOAL_INT32, SHOAL_SUM, NULL, &req),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_iallreduce(x, x, 1, SHOAL_BFLOAT16, SHOAL_OP_COUNT, comm, &req),
                 SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_iallreduce(x, x + 1, 2, SHOAL_INT32, SHOAL_SUM, comm, &req),
                 SHOAL_ERR_INVALID_ARG);
    /* a refused call leaves a completed request, whatever the variable held */
    req = (shoal_request_t)(uintptr_t)0x5a5a;
    MP_EXPECT_ST(g, shoal_ibarrier(NULL, &req), SHOAL_ERR_INVALID_ARG);
    mp_case(g, req == NULL, c->rank, "a refused shoal_ibarrier sets the request to NULL (%p)",
            (void *)req);
    req = NULL;
    MP_EXPECT_ST(g, shoal_test(NULL, &done), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_test(&req, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_wait(NULL), SHOAL_ERR_INVALID_ARG);
    req = NULL;
    done = 0;
    MP_EXPECT_ST(g, shoal_test(&req, &done), SHOAL_OK);
    mp_case(g, done == 1, c->rank, "shoal_test of a NULL request: done %d, expected 1", done);
    MP_EXPECT_ST(g, shoal_wait(&req), SHOAL_OK);
    MP_EXPECT_ST(g, shoal_comm_rank(NULL, &r), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_size(comm, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_split(comm, -5, 0, &nc), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_split(NULL, 0, 0, &nc), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_init(&nc, 0, 0, &uid, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_init(&nc, 2, 2, &uid, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_init(NULL, 2, 0, &uid, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_init(&nc, 2, 0, NULL, NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_destroy(NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_comm_abort(NULL), SHOAL_ERR_INVALID_ARG);
    MP_EXPECT_ST(g, shoal_get_unique_id(NULL), SHOAL_ERR_INVALID_ARG);
}

/* shoal_config_t.algorithm naming no algorithm: rank 0's setting is every rank's. Unknown on
 * another rank, it is ignored (that rank's init failed alone, and the others' first call
 * waited for it until the timeout); unknown on rank 0, every rank's init fails at once. */
static void mp_invalid_algorithm(const mp_ctx_t *c)
{
    int g = mp_group("an unknown shoal_config_t.algorithm: rank 0's fails every init, another's "
                     "is ignored");

    /* the last rank first (not with one rank), then rank 0 */
    for (int i = c->nranks > 1 ? 0 : 1; i < 2; i++) {
        int bad_rank = i == 0 ? c->nranks - 1 : 0;
        shoal_config_t cfg = SHOAL_CONFIG_INIT;
        shoal_comm_t nc = NULL;
        shoal_status_t st = SHOAL_OK, want = bad_rank == 0 ? SHOAL_ERR_INVALID_ARG : SHOAL_OK;
        shoal_uid_t uid;
        double t0;

        memset(&uid, 0, sizeof(uid));
        if (c->rank == 0) {
            st = shoal_get_unique_id(&uid);
        }
        if (shoal_broadcast(&uid, &uid, sizeof(uid), SHOAL_UINT8, 0, c->comm, NULL) != SHOAL_OK ||
            st != SHOAL_OK) {
            mp_case(g, 0, c->rank, "the id of a new communicator: %s", shoal_status_name(st));
            return;
        }
        cfg.timeout_ms = 8000;
        cfg.algorithm = c->rank == bad_rank ? "bogus" : NULL;
        t0 = mp_now_ms();
        st = shoal_comm_init(&nc, c->nranks, c->rank, &uid, &cfg);
        memset(&uid, 0, sizeof(uid));
        mp_case(g, st == want && mp_now_ms() - t0 < 4000, c->rank,
                "'bogus' on rank %d: init %s after %.0f ms, expected %s before the 8000 ms "
                "timeout", bad_rank, shoal_status_name(st), mp_now_ms() - t0,
                shoal_status_name(want));
        if (st == SHOAL_OK) {
            int32_t x = c->rank + 1, sum = 0;
            st = shoal_allreduce(&x, &sum, 1, SHOAL_INT32, SHOAL_SUM, nc, NULL);
            mp_case(g, st == SHOAL_OK && sum == c->nranks * (c->nranks + 1) / 2, c->rank,
                    "'bogus' on rank %d: an allreduce then gives %d (%s)", bad_rank, (int)sum,
                    shoal_status_name(st));
            shoal_comm_destroy(nc);
        }
    }
}

/* The library's log of one refused call (its stderr, fd 2, into a file meanwhile): the line
 * that says why, in want. */
static void mp_invalid_said(const mp_ctx_t *c, int g, const char *what, shoal_status_t (*fn)(void),
                            const char *want)
{
    char text[4096] = "";
    FILE *f = tmpfile();
    int saved = dup(STDERR_FILENO);
    shoal_status_t st = SHOAL_OK;

    if (f != NULL && saved >= 0 && dup2(fileno(f), STDERR_FILENO) >= 0) {
        st = fn();
        dup2(saved, STDERR_FILENO);
        rewind(f);
        text[fread(text, 1, sizeof(text) - 1, f)] = '\0';
    }
    if (saved >= 0) {
        close(saved);
    }
    if (f != NULL) {
        fclose(f);
    }
    mp_case(g, st == SHOAL_ERR_INVALID_ARG && strstr(text, want) != NULL, c->rank,
            "%s: %s, the log says why ('%s' expected): '%.200s'", what, shoal_status_name(st),
            want, text);
}

static shoal_status_t mp_inv_init_rank(void)
{
    shoal_comm_t nc = NULL;
    shoal_uid_t uid;
    memset(&uid, 0, sizeof(uid));
    return shoal_comm_init(&nc, 2, 2, &uid, NULL);
}

static shoal_status_t mp_inv_init_huge(void)
{
    shoal_comm_t nc = NULL;
    shoal_uid_t uid;
    shoal_get_unique_id(&uid);
    return shoal_comm_init(&nc, INT_MAX, 0, &uid, NULL);
}

static shoal_status_t mp_inv_init_null(void)
{
    shoal_comm_t nc = NULL;
    return shoal_comm_init(&nc, 2, 0, NULL, NULL);
}

static shoal_status_t mp_inv_init_env_null(void)
{
    return shoal_comm_init_env(NULL, NULL);
}

static shoal_status_t mp_inv_allreduce(void)
{
    int32_t x = 0;
    return shoal_allreduce(&x, &x, 1, SHOAL_INT32, SHOAL_SUM, NULL, NULL);
}

static shoal_status_t mp_inv_ibarrier(void)
{
    shoal_request_t req = NULL;
    return shoal_ibarrier(NULL, &req);
}

static shoal_status_t mp_inv_wait(void)
{
    return shoal_wait(NULL);
}

static shoal_status_t mp_inv_test(void)
{
    int done = 0;
    return shoal_test(NULL, &done);
}

static shoal_status_t mp_inv_split(void)
{
    shoal_comm_t nc = NULL;
    return shoal_comm_split(NULL, 0, 0, &nc);
}

static shoal_status_t mp_inv_destroy(void)
{
    return shoal_comm_destroy(NULL);
}

static shoal_status_t mp_inv_abort(void)
{
    return shoal_comm_abort(NULL);
}

static shoal_status_t mp_inv_rank(void)
{
    int r = 0;
    return shoal_comm_rank(NULL, &r);
}

static shoal_status_t mp_inv_size(void)
{
    int n = 0;
    return shoal_comm_size(NULL, &n);
}

static shoal_status_t mp_inv_async(void)
{
    shoal_status_t a = SHOAL_OK;
    return shoal_comm_get_async_error(NULL, &a);
}

/* Each refusal of a bad argument has its line in the log: these returned
 * SHOAL_ERR_INVALID_ARG with nothing said (a rank off by one in shoal_comm_init, a NULL
 * communicator). */
static void mp_invalid_logged(const mp_ctx_t *c, int g)
{
    mp_invalid_said(c, g, "shoal_comm_init rank 2 of 2", mp_inv_init_rank, "rank 2 of 2");
    mp_invalid_said(c, g, "shoal_comm_init NULL uid", mp_inv_init_null, "uid is NULL");
    /* it said SHOAL_ERR_NO_MEMORY, with nothing in the log (a table of INT_MAX peers) */
    mp_invalid_said(c, g, "shoal_comm_init INT_MAX ranks", mp_inv_init_huge,
                    "rank 0 of 2147483647");
    /* it said SHOAL_ERR_INVALID_ARG with nothing in the log */
    mp_invalid_said(c, g, "shoal_comm_init_env NULL comm_p", mp_inv_init_env_null,
                    "shoal_comm_init_env: comm_p is NULL");
    mp_invalid_said(c, g, "shoal_allreduce NULL comm", mp_inv_allreduce,
                    "shoal_allreduce: NULL communicator");
    mp_invalid_said(c, g, "shoal_ibarrier NULL comm", mp_inv_ibarrier,
                    "shoal_ibarrier: NULL communicator");
    mp_invalid_said(c, g, "shoal_wait NULL", mp_inv_wait, "shoal_wait: NULL request pointer");
    mp_invalid_said(c, g, "shoal_test NULL", mp_inv_test, "shoal_test: NULL request pointer");
    mp_invalid_said(c, g, "shoal_comm_split NULL comm", mp_inv_split,
                    "shoal_comm_split: NULL communicator");
    mp_invalid_said(c, g, "shoal_comm_destroy NULL", mp_inv_destroy,
                    "shoal_comm_destroy: NULL communicator");
    mp_invalid_said(c, g, "shoal_comm_abort NULL", mp_inv_abort,
                    "shoal_comm_abort: NULL communicator");
    mp_invalid_said(c, g, "shoal_comm_rank NULL", mp_inv_rank,
                    "shoal_comm_rank: NULL communicator");
    mp_invalid_said(c, g, "shoal_comm_size NULL", mp_inv_size,
                    "shoal_comm_size: NULL communicator");
    mp_invalid_said(c, g, "shoal_comm_get_async_error NULL", mp_inv_async,
                    "shoal_comm_get_async_error: NULL communicator");
}

void mp_test_invalid(const mp_ctx_t *c)
{
    int g = mp_group("invalid arguments");
    int32_t x[4];
    shoal_status_t st;
    const char *le;

    mp_invalid_colls(c, g);
    mp_invalid_misc(c, g);
    mp_invalid_algorithm(c);
    mp_invalid_logged(c, g);
    /* The communicator is unharmed. */
    le = shoal_comm_last_error(c->comm);
    mp_case(g, strcmp(le, "no error") == 0, c->rank, "last error after invalid calls: '%s'", le);
    for (int k = 0; k < 4; k++) {
        x[k] = c->rank + k;
    }
    st = shoal_allreduce(x, x, 4, SHOAL_INT32, SHOAL_SUM, c->comm, NULL);
    mp_case(g, st == SHOAL_OK && x[3] == c->nranks * (c->nranks - 1) / 2 + 3 * c->nranks,
            c->rank, "allreduce after invalid calls: %s: %s, x[3] = %d", MP_ERR(st, c->comm),
            (int)x[3]);
}

/* ---- determinism -------------------------------------------------------------------------- */

static void mp_det_fill(shoal_dtype_t dt, int rank, uint8_t *in, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        double v = sin((double)rank * 7919.0 + (double)i * 0.37) * 1000.0 / 3.0;
        switch (dt) {
        case SHOAL_FLOAT16:
            ((uint16_t *)in)[i] = shoal_float_to_half((float)v);
            break;
        case SHOAL_BFLOAT16:
            ((uint16_t *)in)[i] = shoal_float_to_bf16((float)v);
            break;
        case SHOAL_FLOAT32:
            ((float *)in)[i] = (float)v;
            break;
        default:
            ((double *)in)[i] = v;
            break;
        }
    }
}

static void mp_det_case(const mp_ctx_t *c, int g, shoal_dtype_t dt, shoal_op_t op, size_t count,
                        uint8_t *a, uint8_t *b, uint8_t *in)
{
    size_t bytes = count * shoal_dtype_size(dt);
    shoal_status_t st1, st2, st3, st4;
    uint64_t h, *all = calloc((size_t)c->nranks, sizeof(uint64_t));
    int same_runs, same_inplace, same_ranks = 1;

    mp_det_fill(dt, c->rank, in, count);
    st1 = shoal_allreduce(in, a, count, dt, op, c->comm, NULL);
    st2 = shoal_allreduce(in, b, count, dt, op, c->comm, NULL);
    same_runs = memcmp(a, b, bytes) == 0;
    memcpy(b, in, bytes);
    st3 = shoal_allreduce(b, b, count, dt, op, c->comm, NULL);
    same_inplace = memcmp(a, b, bytes) == 0;
    h = mp_hash(a, bytes);
    st4 = all == NULL ? SHOAL_ERR_NO_MEMORY
                      : shoal_allgather(&h, all, 1, SHOAL_UINT64, c->comm, NULL);
    for (int q = 0; st4 == SHOAL_OK && q < c->nranks; q++) {
        same_ranks &= all[q] == h;
    }
    mp_case(g, st1 == SHOAL_OK && st2 == SHOAL_OK && st3 == SHOAL_OK && st4 == SHOAL_OK &&
                   same_runs && same_inplace && same_ranks,
            c->rank, "%s %s count %zu: status %s/%s/%s/%s, same bits: twice %d, in-place %d, "
            "across ranks %d", shoal_dtype_name(dt), shoal_op_name(op), count,
            shoal_status_name(st1), shoal_status_name(st2), shoal_status_name(st3),
            shoal_status_name(st4), same_runs, same_inplace, same_ranks);
    free(all);
}

/* Sums of NaNs whose payloads differ per rank (every even element a quiet NaN carrying the
 * rank, the odd ones finite): IEEE leaves the payload of a NaN sum to the hardware, which takes
 * it from one operand, so which one depends on how the algorithm calls the kernels; every rank
 * must still get the same bits. Recursive doubling gave each rank its own NaN (each partner
 * reduced through another kernel variant). */
static void mp_det_nan_case(const mp_ctx_t *c, int g, size_t count, uint8_t *a, uint8_t *in)
{
    size_t bytes = count * sizeof(uint32_t);
    shoal_status_t st1, st2;
    uint64_t h, *all = calloc((size_t)c->nranks, sizeof(uint64_t));
    int same_ranks = 1;

    for (size_t i = 0; i < count; i++) {
        float f = 1.0f + (float)c->rank;
        uint32_t v = 0x7fc00000u | (uint32_t)(c->rank + 1) << 8 | (uint32_t)(i & 0xff);
        if (i % 2 == 1) {
            memcpy(&v, &f, sizeof(v));
        }
        memcpy(in + i * sizeof(v), &v, sizeof(v));
    }
    st1 = shoal_allreduce(in, a, count, SHOAL_FLOAT32, SHOAL_SUM, c->comm, NULL);
    h = mp_hash(a, bytes);
    st2 = all == NULL ? SHOAL_ERR_NO_MEMORY
                      : shoal_allgather(&h, all, 1, SHOAL_UINT64, c->comm, NULL);
    for (int q = 0; st2 == SHOAL_OK && q < c->nranks; q++) {
        same_ranks &= all[q] == h;
    }
    mp_case(g, st1 == SHOAL_OK && st2 == SHOAL_OK && same_ranks, c->rank,
            "float32 sum of NaNs count %zu: status %s/%s, same bits across ranks %d", count,
            shoal_status_name(st1), shoal_status_name(st2), same_ranks);
    free(all);
}

void mp_test_determinism(const mp_ctx_t *c, uint8_t *a, uint8_t *b, uint8_t *in)
{
    static const shoal_dtype_t dts[] = {SHOAL_FLOAT32, SHOAL_FLOAT64, SHOAL_BFLOAT16,
                                        SHOAL_FLOAT16};
    static const size_t counts[] = {1021, 65537, 300001};
    static const size_t nan_counts[] = {1, 2, 61, 1021};
    int gn = mp_group("determinism of NaN payloads");
    for (size_t k = 0; k < sizeof(nan_counts) / sizeof(nan_counts[0]); k++) {
        mp_det_nan_case(c, gn, nan_counts[k], a, in);
    }
    int g = mp_group("determinism");
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            mp_det_case(c, g, dts[d], SHOAL_SUM, counts[k], a, b, in);
        }
    }
    mp_det_case(c, g, SHOAL_FLOAT32, SHOAL_AVG, 65537, a, b, in);
    mp_det_case(c, g, SHOAL_FLOAT64, SHOAL_PROD, 1021, a, b, in);
}

/* ---- mismatched calls over the channels ----------------------------------------------------- */

/* Rank 1 passes one element more than the others to a small AllReduce: over a channel
 * transport the message lengths disagree with what the receivers posted (for ucx: the short
 * header's payload), which fails the call on every rank, at once rather than at the
 * timeout (mp_job sets 30 s), and rank 0, which talks to rank 1, names it. It runs on a
 * communicator split off for it, which it leaves failed; the job's own communicator reports
 * the results. Named only (run_mp.sh: tcp, ucx, and ib in the VM); the shared-memory path
 * catches such a mismatch before any data moves (SHOAL_ERR_INVALID_ARG, run_shmcopy.sh). */
void mp_test_mismatch(const mp_ctx_t *c)
{
    int g = mp_group("a count that differs across ranks: every rank fails, at once");
    float x[4] = {1, 2, 3, 4};
    shoal_comm_t sub = NULL;
    const char *le;
    shoal_status_t st;
    int64_t t0;
    double ms;

    if (c->nranks < 2) {
        return;
    }
    st = shoal_comm_split(c->comm, 0, c->rank, &sub);
    if (st != SHOAL_OK) {
        mp_case(g, 0, c->rank, "comm_split: %s: %s", MP_ERR(st, c->comm));
        return;
    }
    t0 = mp_now_ns();
    st = shoal_allreduce(x, x, c->rank == 1 ? 3 : 2, SHOAL_FLOAT32, SHOAL_SUM, sub, NULL);
    ms = (double)(mp_now_ns() - t0) / 1e6;
    le = shoal_comm_last_error(sub);
    mp_case(g, st != SHOAL_OK && ms < 10000, c->rank, "status %s after %.0f ms: %s",
            shoal_status_name(st), ms, le);
    /* Rank 0 exchanges with rank 1 first (recursive doubling, or its fold for 3 ranks) and
     * names it: the protocol error when rank 0 checked rank 1's message first, rank 1's
     * failure when rank 1 checked first and left (over ib in the VM: peer 1 closed its
     * connection). */
    if (c->rank == 0) {
        mp_case(g, (st == SHOAL_ERR_PROTOCOL || st == SHOAL_ERR_PEER_FAILED) &&
                       strstr(le, "peer 1") != NULL,
                c->rank, "rank 0 names peer 1: %s: %s", shoal_status_name(st), le);
    }
    (void)shoal_comm_destroy(sub);
}

/* ---- SHOAL_CHECK_ARGS: arguments that differ across ranks ------------------------------- */

/* One mismatched call on sub (what differs): every rank gets SHOAL_ERR_INVALID_ARG at once,
 * the communicator did not fail, and a matching AllGather of the ranks' numbers works. */
static void mp_argcheck_case(const mp_ctx_t *c, shoal_comm_t sub, int g, shoal_status_t st,
                             double ms, const char *what)
{
    const char *le = shoal_comm_last_error(sub);
    int32_t me = c->rank * 7 + 1, all[64] = {0};
    int ok = 1;

    mp_case(g, st == SHOAL_ERR_INVALID_ARG && ms < 10000 && strcmp(le, "no error") == 0,
            c->rank, "%s differs: status %s after %.0f ms, want INVALID_ARG at once; last "
            "error: %s", what, shoal_status_name(st), ms, le);
    st = shoal_allgather(&me, all, 1, SHOAL_INT32, sub, NULL);
    for (int r = 0; r < c->nranks && r < 64; r++) {
        ok = ok && all[r] == r * 7 + 1;
    }
    mp_case(g, st == SHOAL_OK && ok, c->rank, "the matching AllGather after it: %s: %s",
            MP_ERR(st, sub));
}

/* Run with SHOAL_CHECK_ARGS=1 (run_mp.sh, shm and tcp, 2-4 ranks): a broadcast whose ranks
 * name different roots returned SHOAL_OK on every rank and moved no data (2 ranks: each sent
 * its buffer to the other and received nothing); a count that differs failed the
 * communicator for good (a protocol error) or, where one rank passed 0 and returned at once,
 * its peers waited out the timeout. Named only, on a communicator split off for it. */
void mp_test_argcheck(const mp_ctx_t *c)
{
    int g = mp_group("SHOAL_CHECK_ARGS: differing arguments fail every rank, the comm lives on");
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8 * 64];
    int32_t b[4];
    shoal_comm_t sub = NULL;
    shoal_status_t st;
    int64_t t0;

    if (c->nranks < 2 || c->nranks > 64) {
        return;
    }
    st = shoal_comm_split(c->comm, 0, c->rank, &sub);
    if (st != SHOAL_OK) {
        mp_case(g, 0, c->rank, "comm_split: %s: %s", MP_ERR(st, c->comm));
        return;
    }
    for (int i = 0; i < 4; i++) {
        b[i] = c->rank * 100 + i;
    }
    t0 = mp_now_ns();
    st = shoal_broadcast(b, b, 4, SHOAL_INT32, c->rank, sub, NULL); /* every rank its own */
    mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "root");
    st = shoal_broadcast(b, b, 4, SHOAL_INT32, c->nranks - 1, sub, NULL);
    mp_case(g, st == SHOAL_OK && b[0] == (c->nranks - 1) * 100 && b[3] == b[0] + 3, c->rank,
            "matching broadcast: %s: %s, got %d %d", MP_ERR(st, sub), (int)b[0], (int)b[3]);
    t0 = mp_now_ns();
    st = shoal_broadcast(x, x, c->rank == 1 ? 3 : 2, SHOAL_FLOAT32, 0, sub, NULL);
    mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "count");
    t0 = mp_now_ns();
    st = shoal_allgather(x, y, c->rank == 1 ? 3 : 2, SHOAL_FLOAT32, sub, NULL);
    mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "count");
    t0 = mp_now_ns();
    st = shoal_reduce_scatter(y, x, c->rank == 1 ? 3 : 2, SHOAL_FLOAT32, SHOAL_SUM, sub, NULL);
    mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "count");
    t0 = mp_now_ns();
    st = shoal_allreduce(x, y, c->rank == 1 ? 0 : 2, SHOAL_FLOAT32, SHOAL_SUM, sub, NULL);
    mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "count");
    t0 = mp_now_ns();
    st = shoal_allreduce(x, y, 2, SHOAL_FLOAT32, c->rank == 0 ? SHOAL_MAX : SHOAL_SUM, sub, NULL);
    mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "op");
    t0 = mp_now_ns(); /* same size: the messages alone could not tell */
    st = shoal_allreduce(x, y, 2, c->rank == 0 ? SHOAL_INT32 : SHOAL_FLOAT32, SHOAL_SUM, sub,
                         NULL);
    mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "dtype");
    t0 = mp_now_ns();
    st = shoal_reduce(x, y, 2, SHOAL_FLOAT32, SHOAL_SUM, c->rank == 0 ? 1 : 0, sub, NULL);
    mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "root");
    /* The nonblocking calls too: two in flight, the first mismatched (roots), the second a
     * matching AllReduce that must still add up. */
    {
        shoal_request_t r1 = NULL, r2 = NULL;
        float one = 1, sum = 0;
        t0 = mp_now_ns();
        st = shoal_ibroadcast(b, b, 4, SHOAL_INT32, c->rank, sub, &r1);
        if (st == SHOAL_OK) {
            st = shoal_iallreduce(&one, &sum, 1, SHOAL_FLOAT32, SHOAL_SUM, sub, &r2);
            if (st == SHOAL_OK) {
                st = shoal_wait(&r2); /* before sum is read: not in mp_case's arguments */
            }
            mp_case(g, st == SHOAL_OK && sum == c->nranks, c->rank,
                    "iallreduce behind a mismatched ibroadcast: %s, sum %g",
                    shoal_status_name(st), (double)sum);
            st = shoal_wait(&r1);
        }
        mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6, "root (nonblocking)");
    }
    /* One call, blocking on rank 0 and nonblocking on the others, its count mismatched: a
     * refused blocking call took the check's sequence number only, a nonblocking one both
     * (the check's and the call's), and the next call on the communicator timed out. */
    {
        shoal_request_t r = NULL;
        size_t cnt = c->rank == 1 ? 3 : 2;
        t0 = mp_now_ns();
        if (c->rank == 0) {
            st = shoal_allreduce(x, y, cnt, SHOAL_FLOAT32, SHOAL_SUM, sub, NULL);
        } else if ((st = shoal_iallreduce(x, y, cnt, SHOAL_FLOAT32, SHOAL_SUM, sub, &r)) ==
                   SHOAL_OK) {
            st = shoal_wait(&r);
        }
        mp_argcheck_case(c, sub, g, st, (double)(mp_now_ns() - t0) / 1e6,
                         "count (blocking on rank 0, nonblocking elsewhere)");
    }
    (void)shoal_comm_destroy(sub);
}
