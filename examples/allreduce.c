/*
 * A complete shoal program: every rank contributes a vector of floats, and every rank gets
 * their element-wise sum back.
 *
 * Build (installed shoal):   cc allreduce.c $(pkg-config --cflags --libs shoal) -o allreduce
 * Run 4 ranks on this host:  shoalrun -n 4 ./allreduce
 * Under mpirun or srun --mpi=pmix (shoal built with PMIx) it needs nothing more: rank 0's
 * unique id travels through the launcher's PMIx server. Without PMIx, give every rank the
 * same SHOAL_ROOT=host:port (rank 0 listens there) and SHOAL_SECRET (64 hex characters); the
 * rank comes from the launcher.
 */
#include <shoal.h>

#include <stdio.h>
#include <stdlib.h>

#define COUNT (1024 * 1024) /* elements per rank */

/* Prints what went wrong, with the communicator's own account of it when there is one. */
static int report(const char *call, shoal_status_t status, shoal_comm_t comm)
{
    fprintf(stderr, "%s failed: %s", call, shoal_strerror(status));
    if (comm != NULL && shoal_comm_last_error(comm) != NULL) {
        fprintf(stderr, " (%s)", shoal_comm_last_error(comm));
    }
    fprintf(stderr, "\n");
    return 1;
}

int main(void)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT; /* defaults; environment variables may tune them */
    shoal_comm_t comm = NULL;
    shoal_status_t status;
    int rank, nranks, wrong = 0;
    float *data;

    /* 1. Join the job. shoalrun (or mpirun/srun) set the variables that say who we are and
     *    where to meet the other ranks; this blocks until all of them have arrived. */
    status = shoal_comm_init_env(&comm, &cfg);
    if (status != SHOAL_OK) {
        return report("shoal_comm_init_env", status, NULL);
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &nranks);

    /* 2. Each rank's input: element i of rank r holds r + i % 7 (small integers, so the
     *    float sum is exact and easy to check). */
    data = malloc(COUNT * sizeof(*data));
    if (data == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        shoal_comm_destroy(comm);
        return 1;
    }
    for (size_t i = 0; i < COUNT; i++) {
        data[i] = (float)(rank + (int)(i % 7));
    }

    /* 3. Sum across ranks, in place (sendbuf == recvbuf). stream == NULL: the call blocks
     *    this thread until the result is in data. With a cudaStream_t and device buffers, it
     *    would be queued on the stream instead. */
    status = shoal_allreduce(data, data, COUNT, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL);
    if (status != SHOAL_OK) {
        report("shoal_allreduce", status, comm);
        shoal_comm_abort(comm); /* do not wait for peers in destroy after a failure */
        shoal_comm_destroy(comm);
        free(data);
        return 1;
    }

    /* 4. Check: sum over r of (r + i % 7) = n(n-1)/2 + n * (i % 7). */
    for (size_t i = 0; i < COUNT; i++) {
        float want = (float)(nranks * (nranks - 1) / 2 + nranks * (int)(i % 7));

        wrong += data[i] != want;
    }
    printf("rank %d of %d: allreduce of %d floats %s\n", rank, nranks, COUNT,
           wrong == 0 ? "correct" : "WRONG");

    /* 5. Leave the job and release everything the communicator holds. */
    shoal_comm_destroy(comm);
    free(data);
    return wrong == 0 ? 0 : 1;
}
