/*
 * One rank of a shoal job launched by Slurm (tests/slurm/test_slurm.sh): it joins with
 * shoal_comm_init_env (the unique id through srun's PMIx server) and prints, as TAP-free lines
 * the harness greps, the identity the communicator was built with (job and epoch come from
 * SLURM_JOB_ID and SLURM_RESTART_COUNT unless SHOAL_JOB/SHOAL_EPOCH say otherwise).
 *
 *   slurm_rank check ITERS COUNT   ITERS allreduces of COUNT int32 checked on every rank
 *   slurm_rank loop SECONDS DIR    allreduces until a signal (SIGUSR1 from sbatch --signal,
 *                                  SIGTERM from a preemption) reaches any rank; every rank
 *                                  then stops at the same step, writes DIR/ckpt.RANK and
 *                                  exits 0; exits 3 when no signal came within SECONDS
 *
 * SLURM_RANK_TIMEOUT_MS, when set, is the shoal_config_t's timeout_ms (the communicator's, as a
 * program sets it, rather than SHOAL_TIMEOUT_MS).
 *
 * Output lines (one per rank unless said):
 *   ident rank=R nranks=N job=J epoch=E tenant=T host=H   (H: the short host name)
 *   check rank=R wrong=W                      (check)
 *   check: N ranks, ITERS allreduces: correct on every rank   (rank 0, check)
 *   loop rank=R ready pid=P                   (loop: the handlers are in place)
 *   stop rank=R step=S signal=NAME|none       (loop; NAME: the signal this rank got)
 */
#include "core/core.h"

#include <shoal.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t slurm_rank_signal; /* the last signal this rank got, or 0 */

static void slurm_rank_on_signal(int sig)
{
    slurm_rank_signal = sig;
    /* The library's coordinated stop: async-signal-safe, for every communicator of the
     * process (also one still joining); shoal_comm_should_stop() below makes every rank
     * agree on the step. */
    shoal_request_stop();
}

static int slurm_rank_fail(const char *call, shoal_status_t st, shoal_comm_t comm, int rank)
{
    const char *why = comm != NULL ? shoal_comm_last_error(comm) : NULL;

    fprintf(stderr, "slurm_rank %d: %s: %s%s%s\n", rank, call, shoal_strerror(st),
            why != NULL && why[0] != '\0' ? ": " : "", why != NULL ? why : "");
    return 1;
}

static const char *slurm_rank_signame(int sig)
{
    return sig == SIGUSR1 ? "USR1" : sig == SIGTERM ? "TERM" : sig == SIGUSR2 ? "USR2"
           : sig == 0 ? "none" : "other";
}

/* Every rank's answer to "stop now?", the same on every rank at the same step, from the
 * library's agreement (src/stop): the collective before it completed everywhere. */
static shoal_status_t slurm_rank_should_stop(shoal_comm_t comm, int *stop)
{
    return shoal_comm_should_stop(comm, stop);
}

/* ITERS allreduces: element i of rank r at iteration it holds (r + 1) * (it + 1) + i % 13. */
static int slurm_rank_check(shoal_comm_t comm, int rank, int nranks, long iters, size_t count)
{
    int32_t *buf = malloc(count * sizeof(*buf)), wrong = 0;
    int64_t tri = (int64_t)nranks * (nranks + 1) / 2;
    shoal_status_t st;

    if (buf == NULL) {
        fprintf(stderr, "slurm_rank %d: out of memory\n", rank);
        return 1;
    }
    for (long it = 0; it < iters; it++) {
        for (size_t i = 0; i < count; i++) {
            buf[i] = (int32_t)((rank + 1) * (it + 1) + (long)(i % 13));
        }
        st = shoal_allreduce(buf, buf, count, SHOAL_INT32, SHOAL_SUM, comm, NULL);
        if (st != SHOAL_OK) {
            free(buf);
            return slurm_rank_fail("shoal_allreduce", st, comm, rank);
        }
        for (size_t i = 0; i < count; i++) {
            if (buf[i] != (int32_t)(tri * (it + 1) + (int64_t)nranks * (long)(i % 13))) {
                wrong++;
            }
        }
    }
    free(buf);
    printf("check rank=%d wrong=%d\n", rank, (int)wrong);
    fflush(stdout);
    st = shoal_allreduce(&wrong, &wrong, 1, SHOAL_INT32, SHOAL_SUM, comm, NULL);
    if (st != SHOAL_OK) {
        return slurm_rank_fail("shoal_allreduce", st, comm, rank);
    }
    if (rank == 0 && wrong == 0) {
        printf("check: %d ranks, %ld allreduces: correct on every rank\n", nranks, iters);
    }
    return wrong != 0;
}

static int slurm_rank_loop(shoal_comm_t comm, int rank, int nranks, long seconds,
                           const char *dir)
{
    struct timespec nap = {0, 20 * 1000 * 1000};
    time_t end = time(NULL) + seconds;
    int32_t v[64];
    int stop = 0;
    long step;
    shoal_status_t st;

    /* Ready: the harness waits for every rank's line before it makes Slurm signal the job. */
    printf("loop rank=%d ready pid=%ld\n", rank, (long)getpid());
    fflush(stdout);
    for (step = 0; time(NULL) < end; step++) {
        for (int i = 0; i < 64; i++) {
            v[i] = (int32_t)(rank + step + i);
        }
        st = shoal_allreduce(v, v, 64, SHOAL_INT32, SHOAL_SUM, comm, NULL);
        if (st != SHOAL_OK) {
            return slurm_rank_fail("shoal_allreduce", st, comm, rank);
        }
        for (int i = 0; i < 64; i++) {
            if (v[i] != (int32_t)((int64_t)nranks * (nranks - 1) / 2 + nranks * (step + i))) {
                fprintf(stderr, "slurm_rank %d: step %ld: wrong sum\n", rank, step);
                return 1;
            }
        }
        st = slurm_rank_should_stop(comm, &stop);
        if (st != SHOAL_OK) {
            return slurm_rank_fail("should_stop", st, comm, rank);
        }
        if (stop) {
            break;
        }
        nanosleep(&nap, NULL);
    }
    if (!stop) {
        fprintf(stderr, "slurm_rank %d: no stop signal within %ld s (step %ld)\n", rank,
                seconds, step);
        return 3;
    }
    /* The checkpoint: the step every rank agreed on. */
    char path[4096];
    FILE *f;
    snprintf(path, sizeof(path), "%s/ckpt.%d", dir, rank);
    f = fopen(path, "w");
    if (f == NULL || fprintf(f, "step=%ld job=%s epoch=%llu\n", step, comm->ident.job,
                             (unsigned long long)comm->ident.epoch) < 0 || fclose(f) != 0) {
        fprintf(stderr, "slurm_rank %d: cannot write %s: %s\n", rank, path, strerror(errno));
        return 1;
    }
    printf("stop rank=%d step=%ld signal=%s\n", rank, step,
           slurm_rank_signame(slurm_rank_signal));
    return 0;
}

int main(int argc, char **argv)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t comm = NULL;
    shoal_status_t st;
    int rank = -1, nranks = 0, rc;
    char host[256] = "?";

    if (argc != 4 || (strcmp(argv[1], "check") != 0 && strcmp(argv[1], "loop") != 0)) {
        fprintf(stderr, "usage: slurm_rank check ITERS COUNT | loop SECONDS DIR\n");
        return 2;
    }
    if (strcmp(argv[1], "loop") == 0) {
        /* Before joining: a signal that comes early is remembered, not fatal. */
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = slurm_rank_on_signal;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR1, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    if (getenv("SLURM_RANK_TIMEOUT_MS") != NULL) {
        cfg.timeout_ms = atoi(getenv("SLURM_RANK_TIMEOUT_MS"));
    }
    st = shoal_comm_init_env(&comm, &cfg);
    if (st != SHOAL_OK) {
        return slurm_rank_fail("shoal_comm_init_env", st, NULL, rank);
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &nranks);
    gethostname(host, sizeof(host) - 1);
    host[strcspn(host, ".")] = '\0'; /* the short name, as Slurm's node names */
    printf("ident rank=%d nranks=%d job=%s epoch=%llu tenant=%s host=%s\n", rank, nranks,
           comm->ident.job, (unsigned long long)comm->ident.epoch, comm->ident.tenant, host);
    fflush(stdout);
    if (strcmp(argv[1], "check") == 0) {
        rc = slurm_rank_check(comm, rank, nranks, atol(argv[2]), (size_t)atol(argv[3]));
    } else {
        rc = slurm_rank_loop(comm, rank, nranks, atol(argv[2]), argv[3]);
    }
    st = shoal_comm_destroy(comm);
    if (st != SHOAL_OK && rc == 0) {
        rc = slurm_rank_fail("shoal_comm_destroy", st, NULL, rank);
    }
    fflush(stdout);
    return rc;
}
