/*
 * Fault test rank program, run under shoalrun by run_kill.sh.
 *
 *   kill kill  [MiB]  ranks loop over large AllReduces; the last rank SIGKILLs itself from a
 *                     helper thread while inside one. Every survivor must get
 *                     SHOAL_ERR_PEER_FAILED naming the victim; it prints
 *                     "survivor R: status NAME after X ms: <sentence>" and exits 0 if the
 *                     status is right and the sentence names the victim.
 *   kill abort [MiB]  rank 0 blocks in an AllReduce that rank 1.. never join (they sleep);
 *                     a second thread calls shoal_comm_abort after 200 ms. The call must
 *                     return SHOAL_ERR_ABORTED within 1 s of the abort: rank 0 prints
 *                     "aborted 0: status NAME after X ms since abort: <sentence>". The others
 *                     then call AllReduces and must get an error by the third:
 *                     "late R: status NAME after X ms (N calls completed before): ...".
 *   kill idle [MiB]   shoal_comm_get_async_error: SHOAL_OK on a healthy communicator,
 *                     SHOAL_ERR_INVALID_ARG for NULL arguments, SHOAL_ERR_ABORTED on an aborted
 *                     split; then, all ranks idle after an AllReduce, the last rank SIGKILLs
 *                     itself and the survivors poll it without a collective: it must become
 *                     SHOAL_ERR_PEER_FAILED naming the victim ("idle R: status NAME after X ms
 *                     since the last call: <sentence>").
 *   kill idleabort    rank 0 aborts the communicator between calls (none in flight), makes
 *                     one more call ("idleabort 0: later call NAME") and lives on for 3 s; the
 *                     others' next call (200 ms later) must fail at once, told by rank 0:
 *                     "idleabort R: status NAME after X ms: <sentence>".
 *   kill leader       the last rank's main thread starts a worker and calls pthread_exit (its
 *                     process lives on, its main thread a zombie); the others poll
 *                     shoal_comm_get_async_error for 600 ms (SHOAL_OK: the rank is alive),
 *                     then every rank, the last from its worker, calls an AllReduce:
 *                     "leader R: async NAME, allreduce NAME, sum N".
 *   kill loop [MiB]   every rank loops over AllReduces (printing "looping" once the first
 *                     completed) until one fails or 60 s pass, then prints "survivor R:
 *                     status NAME after X ms: <sentence>"; exits 0 if an AllReduce failed.
 *                     For faults made from outside (tests/vm: a port taken down).
 *   kill steady [MiB] every rank loops over AllReduces for 2 s (by rank 0's clock) after
 *                     its first; rank 0 then creates the file $KILL_MARK (if set: every
 *                     endpoint is set up), for a wrapper to make its fault; prints "steady R:
 *                     status NAME after N calls" and exits 0 if every call succeeded.
 * Every rank gives up on its own after a bounded time (never hangs).
 */
#include <shoal.h>
#include "tests/tap.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KILL_LOOP_LIMIT_MS 60000.0
#define KILL_ABORT_DELAY_MS 200

typedef struct {
    shoal_comm_t comm;
    int rank;
    int nranks;
    /* written by the main thread, read by the victim's helper thread: atomic accesses */
    int in_call;            /* main thread is inside shoal_allreduce */
    int calls;              /* calls completed */
    double abort_at;        /* when shoal_comm_abort was called */
} kill_ctx_t;

static double kill_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void kill_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The victim's helper: wait until the main thread is well into the loop, then die while it is
 * inside an AllReduce. */
static void *kill_victim_thread(void *arg)
{
    kill_ctx_t *k = arg;
    double give_up = kill_now_ms() + 20000;
    while (__atomic_load_n(&k->calls, __ATOMIC_RELAXED) < 3 && kill_now_ms() < give_up) {
        kill_sleep_ms(5);
    }
    kill_sleep_ms(50 + (int)(getpid() % 100));
    while (!__atomic_load_n(&k->in_call, __ATOMIC_RELAXED) && kill_now_ms() < give_up) {
        sched_yield();
    }
    kill(getpid(), SIGKILL);
    return NULL;
}

static int kill_mode_kill(kill_ctx_t *k, size_t count)
{
    int victim = k->nranks - 1;
    float *s = malloc(count * sizeof(float)), *r = malloc(count * sizeof(float));
    double start = kill_now_ms(), t0 = start, ms;
    shoal_status_t st = SHOAL_OK;
    const char *why;
    pthread_t tid;
    int ok;

    if (s == NULL || r == NULL) {
        fprintf(stderr, "kill: out of memory\n");
        return 2;
    }
    for (size_t i = 0; i < count; i++) {
        s[i] = (float)(i % 7);
        r[i] = 0;
    }
    if (k->rank == victim && pthread_create(&tid, NULL, kill_victim_thread, k) != 0) {
        fprintf(stderr, "kill: pthread_create failed\n");
        return 2;
    }
    while (st == SHOAL_OK && kill_now_ms() - start < KILL_LOOP_LIMIT_MS) {
        t0 = kill_now_ms();
        __atomic_store_n(&k->in_call, 1, __ATOMIC_RELAXED);
        st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
        __atomic_store_n(&k->in_call, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&k->calls, k->calls + 1, __ATOMIC_RELAXED);
    }
    ms = kill_now_ms() - t0;
    why = shoal_comm_last_error(k->comm);
    ok = st == SHOAL_ERR_PEER_FAILED && tap_names_rank(why, victim);
    printf("survivor %d: status %s after %.0f ms: %s\n", k->rank, shoal_status_name(st), ms,
           st == SHOAL_OK ? "no error (the victim never died?)" : why);
    if (!ok) {
        fprintf(stderr, "# survivor %d: expected SHOAL_ERR_PEER_FAILED naming rank %d\n",
                k->rank, victim);
    }
    fflush(stdout);
    free(s);
    free(r);
    return ok ? 0 : 1;
}

static void *kill_abort_thread(void *arg)
{
    kill_ctx_t *k = arg;
    kill_sleep_ms(KILL_ABORT_DELAY_MS);
    k->abort_at = kill_now_ms();
    shoal_comm_abort(k->comm);
    return NULL;
}

static int kill_mode_abort(kill_ctx_t *k, size_t count)
{
    float *s = calloc(count, sizeof(float)), *r = calloc(count, sizeof(float));
    shoal_status_t st;
    pthread_t tid;
    double t0, ms;
    int ok;

    if (s == NULL || r == NULL) {
        return 2;
    }
    if (k->rank != 0) {
        /* Arrive long after rank 0 gave up. A small first call may still complete (rank 0
         * had sent its whole part before it aborted), but rank 0 is gone: a later call at
         * the latest must fail. */
        int calls = 0;
        kill_sleep_ms(KILL_ABORT_DELAY_MS + 1500);
        do {
            t0 = kill_now_ms();
            st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
            ms = kill_now_ms() - t0;
        } while (st == SHOAL_OK && ++calls < 3);
        printf("late %d: status %s after %.0f ms (%d calls completed before): %s\n", k->rank,
               shoal_status_name(st), ms, calls, shoal_comm_last_error(k->comm));
        ok = st != SHOAL_OK;
    } else {
        if (pthread_create(&tid, NULL, kill_abort_thread, k) != 0) {
            return 2;
        }
        st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
        ms = kill_now_ms() - k->abort_at;
        pthread_join(tid, NULL);
        printf("aborted %d: status %s after %.0f ms since abort: %s\n", k->rank,
               shoal_status_name(st), ms, shoal_comm_last_error(k->comm));
        ok = st == SHOAL_ERR_ABORTED && ms < 1000;
        /* Later calls fail at once too. */
        st = shoal_barrier(k->comm, NULL);
        printf("after abort %d: barrier status %s\n", k->rank, shoal_status_name(st));
        ok = ok && st == SHOAL_ERR_ABORTED;
    }
    fflush(stdout);
    free(s);
    free(r);
    return ok ? 0 : 1;
}

/* idle: a healthy communicator answers SHOAL_OK, bad arguments SHOAL_ERR_INVALID_ARG, an
 * aborted one (a split, so the others stay usable) SHOAL_ERR_ABORTED. Then every rank idles
 * after a last AllReduce and the last rank SIGKILLs itself: the survivors, calling no
 * collective, poll shoal_comm_get_async_error until it is not SHOAL_OK and print
 * "idle R: status NAME after X ms since the last call: <sentence>". */
static int kill_mode_idle(kill_ctx_t *k, size_t count)
{
    int victim = k->nranks - 1, ok = 1;
    float *s = calloc(count, sizeof(float)), *r = calloc(count, sizeof(float));
    shoal_status_t st, async = SHOAL_ERR_INTERNAL, split_st = SHOAL_ERR_INTERNAL;
    shoal_comm_t sub = NULL;
    int split_null = 0;
    double t0;

    if (s == NULL || r == NULL) {
        return 2;
    }
    st = shoal_comm_get_async_error(k->comm, &async);
    printf("healthy %d: %s %s\n", k->rank, shoal_status_name(st), shoal_status_name(async));
    ok = ok && st == SHOAL_OK && async == SHOAL_OK;
    st = shoal_comm_get_async_error(NULL, &async);
    printf("null comm %d: %s\n", k->rank, shoal_status_name(st));
    ok = ok && st == SHOAL_ERR_INVALID_ARG;
    st = shoal_comm_get_async_error(k->comm, NULL);
    printf("null out %d: %s\n", k->rank, shoal_status_name(st));
    ok = ok && st == SHOAL_ERR_INVALID_ARG;
    st = shoal_comm_split(k->comm, 0, k->rank, &sub);
    if (st == SHOAL_OK) {
        /* a split of the aborted one fails and leaves no handle behind (it left the caller's
         * old value there, which a cleanup that destroys a non-NULL result then freed) */
        shoal_comm_t subsub = sub;
        shoal_comm_abort(sub);
        st = shoal_comm_get_async_error(sub, &async);
        split_st = shoal_comm_split(sub, 0, k->rank, &subsub);
        split_null = subsub == NULL;
        shoal_comm_destroy(sub);
    }
    printf("aborted split %d: %s %s, its split %s%s\n", k->rank, shoal_status_name(st),
           shoal_status_name(async), shoal_status_name(split_st),
           split_null ? "" : " left a handle");
    ok = ok && st == SHOAL_OK && async == SHOAL_ERR_ABORTED && split_st == SHOAL_ERR_ABORTED &&
         split_null;
    st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
    t0 = kill_now_ms();
    if (k->rank == victim) {
        fflush(stdout);
        kill_sleep_ms(300);
        kill(getpid(), SIGKILL);
    }
    async = SHOAL_OK;
    while (st == SHOAL_OK && async == SHOAL_OK && kill_now_ms() - t0 < 20000) {
        st = shoal_comm_get_async_error(k->comm, &async);
        if (async == SHOAL_OK) {
            kill_sleep_ms(1);
        }
    }
    printf("idle %d: status %s after %.0f ms since the last call: %s\n", k->rank,
           shoal_status_name(st != SHOAL_OK ? st : async), kill_now_ms() - t0,
           shoal_comm_last_error(k->comm));
    ok = ok && st == SHOAL_OK && async == SHOAL_ERR_PEER_FAILED &&
         tap_names_rank(shoal_comm_last_error(k->comm), victim);
    fflush(stdout);
    kill_sleep_ms(500); /* a survivor's exit must not look like the first death to the others */
    free(s);
    free(r);
    return ok ? 0 : 1;
}

/* leader: the last rank's main thread exits (pthread_exit) and its worker goes on; the others,
 * idle, must not take the rank for dead (/proc/PID/stat shows the main thread: a zombie,
 * exiting, while the process runs), and an AllReduce with the worker must then succeed. */
typedef struct {
    kill_ctx_t *k;
    int rc;
} kill_leader_t;

static int kill_leader_step(kill_ctx_t *k)
{
    shoal_status_t st = SHOAL_OK, async = SHOAL_OK;
    double t0 = kill_now_ms();
    float s = 1.0f, r = 0.0f;

    if (k->rank != k->nranks - 1) {
        while (st == SHOAL_OK && async == SHOAL_OK && kill_now_ms() - t0 < 600) {
            st = shoal_comm_get_async_error(k->comm, &async);
            kill_sleep_ms(5);
        }
    } else {
        kill_sleep_ms(300); /* the others poll while the main thread is gone */
    }
    if (st == SHOAL_OK) {
        st = async;
    }
    shoal_status_t ar = shoal_allreduce(&s, &r, 1, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
    printf("leader %d: async %s, allreduce %s, sum %.0f%s%s\n", k->rank, shoal_status_name(st),
           shoal_status_name(ar), (double)r, st != SHOAL_OK || ar != SHOAL_OK ? ": " : "",
           st != SHOAL_OK || ar != SHOAL_OK ? shoal_comm_last_error(k->comm) : "");
    fflush(stdout);
    return st == SHOAL_OK && ar == SHOAL_OK && r == (float)k->nranks ? 0 : 1;
}

static void *kill_leader_worker(void *arg)
{
    kill_leader_t *w = arg;
    int rc = kill_leader_step(w->k);
    shoal_comm_destroy(w->k->comm);
    exit(rc); /* the process's last thread: its status is the test's */
}

static int kill_mode_leader(kill_ctx_t *k)
{
    static kill_leader_t w;
    static kill_ctx_t kw; /* main's frame goes with pthread_exit */
    pthread_t tid;

    if (k->rank != k->nranks - 1) {
        return kill_leader_step(k);
    }
    kw = *k;
    w.k = &kw;
    if (pthread_create(&tid, NULL, kill_leader_worker, &w) != 0) {
        return 2;
    }
    pthread_exit(NULL);
}

static int kill_mode_steady(kill_ctx_t *k, size_t count)
{
    float *s = calloc(count, sizeof(float)), *r = calloc(count, sizeof(float));
    const char *mark = getenv("KILL_MARK");
    shoal_status_t st;
    double start;
    long calls = 0;

    if (s == NULL || r == NULL) {
        return 2;
    }
    st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
    if (st == SHOAL_OK && k->rank == 0 && mark != NULL) {
        FILE *f = fopen(mark, "w");
        if (f != NULL) {
            fclose(f);
        }
    }
    /* rank 0's clock decides for all (its "go" is the sum's first element): ranks that each
     * watched their own clock made different numbers of calls, and the last call of one
     * waited for its timeout on a peer that had stopped */
    start = kill_now_ms();
    while (st == SHOAL_OK) {
        s[0] = k->rank == 0 && kill_now_ms() - start < 2000 ? 1.0f : 0.0f;
        st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
        calls++;
        if (st != SHOAL_OK || r[0] == 0.0f) {
            break;
        }
        kill_sleep_ms(1);
    }
    printf("steady %d: status %s after %ld calls%s%s\n", k->rank, shoal_status_name(st), calls,
           st != SHOAL_OK ? ": " : "", st != SHOAL_OK ? shoal_comm_last_error(k->comm) : "");
    fflush(stdout);
    free(s);
    free(r);
    return st == SHOAL_OK ? 0 : 1;
}

static int kill_mode_idleabort(kill_ctx_t *k, size_t count)
{
    float *s = calloc(count, sizeof(float)), *r = calloc(count, sizeof(float));
    shoal_status_t st;
    double t0;

    if (s == NULL || r == NULL) {
        return 2;
    }
    st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
    if (k->rank == 0) {
        shoal_comm_abort(k->comm);
        st = shoal_barrier(k->comm, NULL);
        printf("idleabort 0: later call %s\n", shoal_status_name(st));
        fflush(stdout);
        kill_sleep_ms(3000); /* alive: the others must learn of the abort, not of an exit */
    } else if (st == SHOAL_OK) {
        kill_sleep_ms(KILL_ABORT_DELAY_MS);
        t0 = kill_now_ms();
        st = shoal_barrier(k->comm, NULL);
        printf("idleabort %d: status %s after %.0f ms: %s\n", k->rank, shoal_status_name(st),
               kill_now_ms() - t0, st == SHOAL_OK ? "no error" : shoal_comm_last_error(k->comm));
        fflush(stdout);
    }
    free(s);
    free(r);
    return 0;
}

static int kill_mode_loop(kill_ctx_t *k, size_t count)
{
    float *s = calloc(count, sizeof(float)), *r = calloc(count, sizeof(float));
    shoal_status_t st = SHOAL_OK;
    double start = kill_now_ms(), t0 = start;
    long calls = 0;

    if (s == NULL || r == NULL) {
        return 2;
    }
    while (st == SHOAL_OK && kill_now_ms() - start < KILL_LOOP_LIMIT_MS) {
        t0 = kill_now_ms();
        st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, k->comm, NULL);
        if (++calls == 1 && k->rank == 0) {
            printf("looping\n");
            fflush(stdout);
        }
    }
    printf("survivor %d: status %s after %.0f ms (%ld calls): %s\n", k->rank,
           shoal_status_name(st), kill_now_ms() - t0, calls,
           st == SHOAL_OK ? "no error" : shoal_comm_last_error(k->comm));
    fflush(stdout);
    free(s);
    free(r);
    return st != SHOAL_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    kill_ctx_t k = {0};
    const char *mode = argc > 1 ? argv[1] : "kill";
    size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 8;
    size_t count = mib > 0 ? mib * 1048576 / sizeof(float) : 1021;
    shoal_status_t st;
    int rc;

    alarm(120); /* last resort: never outlive a broken test by much */
    st = shoal_comm_init_env(&k.comm, NULL);
    if (st != SHOAL_OK) {
        printf("init failed: %s\n", shoal_status_name(st));
        return 2;
    }
    shoal_comm_rank(k.comm, &k.rank);
    shoal_comm_size(k.comm, &k.nranks);
    if (strcmp(mode, "kill") == 0) {
        rc = kill_mode_kill(&k, count);
    } else if (strcmp(mode, "abort") == 0) {
        rc = kill_mode_abort(&k, count);
    } else if (strcmp(mode, "idle") == 0) {
        rc = kill_mode_idle(&k, count);
    } else if (strcmp(mode, "idleabort") == 0) {
        rc = kill_mode_idleabort(&k, count);
    } else if (strcmp(mode, "leader") == 0) {
        rc = kill_mode_leader(&k);
    } else if (strcmp(mode, "loop") == 0) {
        rc = kill_mode_loop(&k, count);
    } else if (strcmp(mode, "steady") == 0) {
        rc = kill_mode_steady(&k, count);
    } else {
        fprintf(stderr, "usage: kill kill|abort|idle|idleabort|leader|loop|steady [MiB]\n");
        rc = 2;
    }
    shoal_comm_destroy(k.comm);
    return rc;
}
