/*
 * shoal inside an MPI program: MPI starts the processes and introduces them to each other
 * once; shoal then does the AllReduce on its own transports (shared memory on one host, TCP
 * across hosts), so an MPI application can switch its heavy collectives to shoal without
 * changing how it is launched.
 *
 * Build (installed shoal):   mpicc allreduce_mpi.c $(pkg-config --cflags --libs shoal_mpi) \
 *                                -o allreduce_mpi
 * Run 4 ranks:               mpirun -np 4 ./allreduce_mpi
 *   (as root add --allow-run-as-root; with more ranks than cores add --oversubscribe)
 * Expected output (rank 0):  allreduce_mpi: 4 ranks, 1048576 floats each: correct on every rank
 */
#include <shoal_mpi.h>

#include <stdio.h>
#include <stdlib.h>

#define COUNT (1024 * 1024) /* elements per rank */

/* Prints what went wrong, with the communicator's own account of it when there is one. */
static void report(int rank, const char *call, shoal_status_t status, shoal_comm_t comm)
{
    const char *why = comm != NULL ? shoal_comm_last_error(comm) : NULL;

    fprintf(stderr, "rank %d: %s failed: %s%s%s\n", rank, call, shoal_strerror(status),
            why != NULL && why[0] != '\0' ? ": " : "", why != NULL ? why : "");
}

int main(int argc, char **argv)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT; /* defaults; SHOAL_* variables may tune them */
    shoal_comm_t comm = NULL;
    shoal_status_t status;
    int rank, nranks, wrong = 0, wrong_total = 0;
    float *data;

    /* 1. MPI as usual. Its processes are the ranks; MPI_COMM_WORLD is the group. */
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    /* 2. A shoal communicator over the same processes, same ranks. Collective: rank 0 makes
     *    the unique id and MPI_Bcasts it; every rank then joins. Any MPI communicator works
     *    (a split of MPI_COMM_WORLD gives a shoal communicator over that subgroup). */
    status = shoal_mpi_comm_init(&comm, MPI_COMM_WORLD, &cfg);
    if (status != SHOAL_OK) {
        report(rank, "shoal_mpi_comm_init", status, NULL);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    /* 3. Each rank's input: element i of rank r holds r + i % 7 (small integers, so the
     *    float sum is exact and easy to check). */
    data = malloc(COUNT * sizeof(*data));
    if (data == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < COUNT; i++) {
        data[i] = (float)(rank + (int)(i % 7));
    }

    /* 4. Sum across ranks through shoal, in place (sendbuf == recvbuf); stream == NULL: the
     *    call blocks until the result is in data. */
    status = shoal_allreduce(data, data, COUNT, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL);
    if (status != SHOAL_OK) {
        report(rank, "shoal_allreduce", status, comm);
        shoal_comm_abort(comm); /* do not wait for peers in destroy after a failure */
        shoal_comm_destroy(comm);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    /* 5. Check: sum over r of (r + i % 7) = n(n-1)/2 + n * (i % 7). MPI, still usable beside
     *    shoal, adds up the wrong elements of every rank for the verdict. */
    for (size_t i = 0; i < COUNT; i++) {
        float want = (float)(nranks * (nranks - 1) / 2 + nranks * (int)(i % 7));

        wrong += data[i] != want;
    }
    MPI_Allreduce(&wrong, &wrong_total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("allreduce_mpi: %d ranks, %d floats each: ", nranks, COUNT);
        if (wrong_total == 0) {
            printf("correct on every rank\n");
        } else {
            printf("WRONG (%d wrong elements in all)\n", wrong_total);
        }
    }

    /* 6. Destroy the shoal communicator before MPI_Finalize. */
    shoal_comm_destroy(comm);
    free(data);
    MPI_Finalize();
    return wrong_total == 0 ? 0 : 1;
}
