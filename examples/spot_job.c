/*
 * A preemptible ("spot") training loop: every step ends with shoal_comm_should_stop, so that
 * when any rank is told to stop (SIGUSR1 or SIGTERM here; Slurm's --signal, Kubernetes) every
 * rank stops at the same step, saves that step and exits 0. Started again (a requeued job), it
 * resumes from the saved step.
 *
 *   shoalrun -n 4 ./examples/spot_job [STEPS] [DIR]     then: kill -USR1 <pid of any rank>
 *
 * The checkpoint is DIR/spot_job.ckpt.RANK (default DIR: the current directory): the step to
 * resume at and the "model" (here one number every rank agrees on).
 */
#include <shoal.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void on_preempt(int sig)
{
    (void)sig;
    shoal_request_stop(); /* async-signal-safe: one atomic store; the next agreement decides */
}

static int load(const char *path, long *step, double *model)
{
    FILE *f = fopen(path, "r");
    int ok = f != NULL && fscanf(f, "%ld %lf", step, model) == 2;
    if (f != NULL) {
        fclose(f);
    }
    return ok;
}

static int save(const char *path, long step, double model)
{
    FILE *f = fopen(path, "w");
    int ok = f != NULL && fprintf(f, "%ld %.17g\n", step, model) > 0;
    return (f != NULL && fclose(f) == 0) && ok;
}

int main(int argc, char **argv)
{
    long steps = argc > 1 ? atol(argv[1]) : 1000000, step = 0;
    const char *dir = argc > 2 ? argv[2] : ".";
    struct sigaction sa = {.sa_handler = on_preempt, .sa_flags = SA_RESTART};
    struct timespec compute = {.tv_sec = 0, .tv_nsec = 1000000};
    double model = 0, grad;
    shoal_comm_t comm;
    shoal_status_t st;
    char path[4096];
    int rank, stop = 0;

    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL); /* Slurm: sbatch --signal=USR1@120 */
    sigaction(SIGTERM, &sa, NULL); /* Kubernetes; Slurm's preemption with a GraceTime */
    st = shoal_comm_init_env(&comm, NULL);
    if (st != SHOAL_OK) {
        fprintf(stderr, "spot_job: init: %s\n", shoal_strerror(st));
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    snprintf(path, sizeof(path), "%s/spot_job.ckpt.%d", dir, rank);
    if (load(path, &step, &model)) {
        printf("rank %d: resuming at step %ld\n", rank, step);
    }
    for (; step < steps; step++) {
        grad = (double)(rank + 1) * 1e-3; /* the step's "backward pass" */
        nanosleep(&compute, NULL);
        st = shoal_allreduce(&grad, &grad, 1, SHOAL_FLOAT64, SHOAL_SUM, comm, NULL);
        if (st == SHOAL_OK) {
            model += grad;
            st = shoal_comm_should_stop(comm, &stop); /* the same answer on every rank */
        }
        if (st != SHOAL_OK) { /* a rank died or hung: restart from the last checkpoint */
            fprintf(stderr, "rank %d: step %ld: %s\n", rank, step, shoal_comm_last_error(comm));
            shoal_comm_destroy(comm);
            return 1;
        }
        if (stop) {
            break;
        }
    }
    /* Every rank is here after the same step: the checkpoints form one state. */
    if (!save(path, step + (step < steps), model)) {
        fprintf(stderr, "rank %d: cannot write %s\n", rank, path);
        shoal_comm_destroy(comm);
        return 1;
    }
    printf("rank %d: %s after step %ld, model %.6f\n", rank, stop ? "stopped" : "done",
           step, model);
    shoal_comm_destroy(comm);
    return 0;
}
