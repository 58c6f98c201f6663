/*
 * membw: memory copy bandwidth, the physical bound of a shared-memory collective.
 *
 * Each of T threads copies its own SIZE-byte buffer into another with memcpy (both buffers
 * allocated once and faulted in before timing); the aggregate bandwidth is T * SIZE / (last
 * copy's end - first copy's start, as the threads time themselves), best of REPS repetitions. "Copy bandwidth" counts each byte once (it is
 * read once and written once), like STREAM's "Copy" and like a bus-bandwidth figure.
 *
 * usage: membw [-s SIZE] [-t T1,T2,...] [-r REPS]   (defaults: 64M, 1,2, 10)
 * Prints one line per thread count: "membw threads T copy_GBps X size SIZE".
 */
#include "perf/perf_args.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MEMBW_MAX_THREADS 256

/* Held by every thread until all of them exist: go, or quit if one could not be created (the
 * barriers count every thread, so the started ones would wait there for ever). */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int state; /* 0: wait, 1: go, -1: quit */
} membw_gate_t;

typedef struct {
    membw_gate_t *gate;
    pthread_barrier_t *start;
    pthread_barrier_t *done;
    char *src;
    char *dst;
    size_t size;
    int reps;
    double t0;          /* this rep's copy, timed by the thread itself */
    double t1;
} membw_thread_t;

static double membw_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *membw_thread_main(void *arg)
{
    membw_thread_t *t = arg;
    int state;

    pthread_mutex_lock(&t->gate->lock);
    while ((state = t->gate->state) == 0) {
        pthread_cond_wait(&t->gate->cond, &t->gate->lock);
    }
    pthread_mutex_unlock(&t->gate->lock);
    if (state < 0) {
        return NULL;
    }
    for (int r = 0; r < t->reps; r++) {
        pthread_barrier_wait(t->start);
        t->t0 = membw_now();
        memcpy(t->dst, t->src, t->size);
        t->t1 = membw_now();
        pthread_barrier_wait(t->done);
    }
    return NULL;
}

/* Aggregate copy bandwidth of nthreads threads in GB/s; < 0 on failure. */
static double membw_measure(int nthreads, size_t size, int reps)
{
    pthread_barrier_t start, done;
    membw_gate_t gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    membw_thread_t th[MEMBW_MAX_THREADS];
    pthread_t tid[MEMBW_MAX_THREADS];
    double best = 0;
    int ok = 1, started = 0;

    memset(th, 0, sizeof(th));
    pthread_barrier_init(&start, NULL, (unsigned)nthreads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)nthreads + 1);
    for (int i = 0; i < nthreads && ok; i++) {
        th[i] = (membw_thread_t){.gate = &gate, .start = &start, .done = &done, .size = size, .reps = reps,
                                 .src = aligned_alloc(4096, size), .dst = aligned_alloc(4096, size)};
        ok = th[i].src != NULL && th[i].dst != NULL;
        if (ok) {
            memset(th[i].src, 1 + i, size); /* fault in both buffers before timing */
            memset(th[i].dst, 0, size);
        }
    }
    for (int i = 0; i < nthreads && ok; i++) {
        ok = pthread_create(&tid[i], NULL, membw_thread_main, &th[i]) == 0;
        started += ok;
    }
    pthread_mutex_lock(&gate.lock);
    gate.state = ok ? 1 : -1;
    pthread_cond_broadcast(&gate.cond);
    pthread_mutex_unlock(&gate.lock);
    for (int r = 0; r < reps && ok; r++) {
        double t0, t1, t;

        pthread_barrier_wait(&start);
        pthread_barrier_wait(&done);
        /* From the first copy's start to the last one's end: a thread preempted before it
         * starts only lengthens the window. */
        t0 = th[0].t0;
        t1 = th[0].t1;
        for (int i = 1; i < nthreads; i++) {
            t0 = th[i].t0 < t0 ? th[i].t0 : t0;
            t1 = th[i].t1 > t1 ? th[i].t1 : t1;
        }
        t = t1 - t0;
        if (t > 0 && (double)size * nthreads / t / 1e9 > best) {
            best = (double)size * nthreads / t / 1e9;
        }
    }
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
    }
    for (int i = 0; i < nthreads; i++) {
        free(th[i].src);
        free(th[i].dst);
    }
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&done);
    return ok ? best : -1;
}

int main(int argc, char **argv)
{
    size_t size = 64u << 20;
    const char *tlist = "1,2";
    int reps = 10, c;

    while ((c = getopt(argc, argv, "s:t:r:h")) != -1) {
        switch (c) {
        case 's':
            if (perf_arg_size(optarg, &size) != 0 || size == 0) {
                fprintf(stderr, "membw: bad size '%s'\n", optarg);
                return 2;
            }
            break;
        case 't': tlist = optarg; break;
        case 'r':
            if (perf_arg_int(optarg, 1, 1000000, &reps) != 0) {
                fprintf(stderr, "membw: bad repetition count '%s'\n", optarg);
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: membw [-s SIZE] [-t T1,T2,...] [-r REPS]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    for (const char *p = tlist; *p != '\0';) {
        char *end = NULL;
        long t = strtol(p, &end, 10);
        double bw;

        if (end == p || t < 1 || t > MEMBW_MAX_THREADS) {
            fprintf(stderr, "membw: bad thread list '%s'\n", tlist);
            return 2;
        }
        bw = membw_measure((int)t, size, reps);
        if (bw < 0) {
            fprintf(stderr, "membw: cannot allocate or start %ld threads of 2 x %zu bytes\n", t,
                    size);
            return 1;
        }
        printf("membw threads %ld copy_GBps %.2f size %zu\n", t, bw, size);
        fflush(stdout);
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}
