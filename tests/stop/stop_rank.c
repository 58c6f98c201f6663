/*
 * One rank of a training-like loop, run under shoalrun by run_stop.sh:
 *
 *   stop_rank DIR HANDLER [API_RANK API_STEP | DIE_RANK DIE_STEP] [MAX_STEPS]
 *
 * Every step: an AllReduce (SUM of 256 int32 whose exact result depends on the step, so ranks
 * at different steps fail it), a millisecond of "compute", then shoal_comm_should_stop. When
 * it says stop the rank writes its checkpoint DIR/ckpt.R ("step S ns T": the step and
 * CLOCK_REALTIME when the answer came), destroys the communicator and exits 0.
 *
 * HANDLER says who turns a SIGUSR1 into a request:
 *   lib      the library (the harness sets SHOAL_STOP_SIGNALS=USR1)
 *   app      the program's own handler, calling shoal_request_stop()
 *   appcomm  the program's own handler, calling shoal_comm_request_stop(comm)
 *   api      no signal: rank API_RANK calls shoal_comm_request_stop before the agreement of
 *            step API_STEP, so every rank must stop at exactly API_STEP
 *   file     no signal: the harness creates SHOAL_STOP_FILE
 *   none     no request at all: the loop runs MAX_STEPS steps, every answer must be 0; the
 *            checkpoint then says "done S"
 *   die      rank DIE_RANK SIGKILLs itself at step DIE_STEP; every other rank must get an
 *            error (not a hang, not a stop): the checkpoint says "error NAME ms T"
 * DIR/ready.R (the pid) is written once the communicator is up and the handler in place.
 * Exit codes: 0 stopped (or done), 3 wrong result or error, 4 no stop by MAX_STEPS (default
 * 100000) or 60 s.
 */
#include <shoal.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STOP_COUNT 256
#define STOP_LIMIT_S 60.0

static shoal_comm_t stop_comm; /* read by the appcomm handler */

static void stop_on_usr1_process(int sig)
{
    (void)sig;
    shoal_request_stop();
}

/* The main thread clears stop_comm before it destroys the communicator, so a late signal finds
 * NULL (a harmless SHOAL_ERR_INVALID_ARG). This program has no thread of its own and makes no
 * shoal_i* call (no proxy thread): the handler runs on the main thread, between its steps. */
static void stop_on_usr1_comm(int sig)
{
    (void)sig;
    shoal_comm_request_stop(__atomic_load_n(&stop_comm, __ATOMIC_ACQUIRE));
}

static double stop_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long long stop_real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Writes DIR/NAME.R atomically (a temporary file renamed). */
static void stop_write(const char *dir, const char *name, int rank, const char *text)
{
    char path[4096], tmp[4096];
    FILE *f;
    snprintf(path, sizeof(path), "%s/%s.%d", dir, name, rank);
    snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", dir, name, rank);
    f = fopen(tmp, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "rank %d: writing %s: %s\n", rank, path, strerror(errno));
        exit(3);
    }
}

static void stop_compute(void)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int stop_fail(const char *dir, int rank, shoal_comm_t comm, shoal_status_t st,
                     double t0)
{
    char text[1024];
    snprintf(text, sizeof(text), "error %s ms %.0f %s\n", shoal_status_name(st),
             (stop_mono_s() - t0) * 1e3, shoal_comm_last_error(comm));
    stop_write(dir, "ckpt", rank, text);
    fprintf(stderr, "rank %d: %s", rank, text);
    return 3;
}

int main(int argc, char **argv)
{
    const char *dir, *handler;
    int rank, nranks, who = -1, at = -1, stop = 0;
    long max_steps = 100000;
    int32_t in[STOP_COUNT], out[STOP_COUNT];
    shoal_comm_t comm;
    shoal_status_t st;
    char text[256];
    double t0, last_err = 0;
    long step;

    if (argc < 3) {
        fprintf(stderr, "usage: stop_rank DIR lib|app|appcomm|api|file|none|die [RANK STEP] "
                "[MAX]\n");
        return 2;
    }
    dir = argv[1];
    handler = argv[2];
    if (strcmp(handler, "api") == 0 || strcmp(handler, "die") == 0) {
        if (argc < 5) {
            fprintf(stderr, "stop_rank: %s needs RANK STEP\n", handler);
            return 2;
        }
        who = atoi(argv[3]);
        at = atoi(argv[4]);
        if (argc > 5) {
            max_steps = atol(argv[5]);
        }
    } else if (argc > 3) {
        max_steps = atol(argv[3]);
    }
    if (strcmp(handler, "app") == 0 || strcmp(handler, "appcomm") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = strcmp(handler, "app") == 0 ? stop_on_usr1_process : stop_on_usr1_comm;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (strcmp(handler, "appcomm") == 0) {
            /* No handle yet: hold the signal until there is one. */
            sigset_t set;
            sigemptyset(&set);
            sigaddset(&set, SIGUSR1);
            sigprocmask(SIG_BLOCK, &set, NULL);
        }
        sigaction(SIGUSR1, &sa, NULL);
    }
    st = shoal_comm_init_env(&comm, NULL);
    if (st != SHOAL_OK) {
        fprintf(stderr, "stop_rank: init: %s\n", shoal_status_name(st));
        return 3;
    }
    __atomic_store_n(&stop_comm, comm, __ATOMIC_RELEASE);
    if (strcmp(handler, "appcomm") == 0) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &nranks);
    snprintf(text, sizeof(text), "%d\n", (int)getpid());
    stop_write(dir, "ready", rank, text);

    t0 = stop_mono_s();
    for (step = 0; step < max_steps && stop_mono_s() - t0 < STOP_LIMIT_S; step++) {
        for (int i = 0; i < STOP_COUNT; i++) {
            in[i] = (int32_t)((rank + 1) * (step + 1) + i);
        }
        if (strcmp(handler, "die") == 0 && rank == who && step == at) {
            kill(getpid(), SIGKILL);
        }
        last_err = stop_mono_s();
        st = shoal_allreduce(in, out, STOP_COUNT, SHOAL_INT32, SHOAL_SUM, comm, NULL);
        if (st != SHOAL_OK) {
            return stop_fail(dir, rank, comm, st, last_err);
        }
        for (int i = 0; i < STOP_COUNT; i++) {
            int32_t want = (int32_t)(nranks * (nranks + 1) / 2 * (step + 1) + nranks * i);
            if (out[i] != want) {
                fprintf(stderr, "rank %d: step %ld: element %d is %d, expected %d\n", rank,
                        step, i, (int)out[i], (int)want);
                return 3;
            }
        }
        stop_compute();
        if (strcmp(handler, "api") == 0 && rank == who && step == at) {
            shoal_comm_request_stop(comm);
        }
        last_err = stop_mono_s();
        st = shoal_comm_should_stop(comm, &stop);
        if (st != SHOAL_OK) {
            return stop_fail(dir, rank, comm, st, last_err);
        }
        if (stop) {
            snprintf(text, sizeof(text), "step %ld ns %lld\n", step, stop_real_ns());
            stop_write(dir, "ckpt", rank, text); /* the checkpoint: this step's state */
            /* A late signal must not reach a destroyed communicator through the handler. */
            __atomic_store_n(&stop_comm, NULL, __ATOMIC_RELEASE);
            st = shoal_comm_destroy(comm);
            return st == SHOAL_OK ? 0 : 3;
        }
    }
    if (strcmp(handler, "none") == 0 && step == max_steps) {
        snprintf(text, sizeof(text), "done %ld\n", step);
        stop_write(dir, "ckpt", rank, text);
        return shoal_comm_destroy(comm) == SHOAL_OK ? 0 : 3;
    }
    fprintf(stderr, "rank %d: no stop after %ld steps\n", rank, step);
    shoal_comm_destroy(comm);
    return 4;
}
