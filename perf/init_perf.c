/*
 * Init time: how long a rank takes from the start of main() to the end of its first barrier
 * (shoal_comm_init_env + shoal_barrier, or with -DSHOAL_PERF_MPI MPI_Init + MPI_Barrier), and
 * then to the end of one 8-byte AllReduce (the first collective, which with connections opened
 * on first use pays for them). Every rank prints one line:
 *   INIT rank <r> nranks <n> init_us <t> first_us <t>
 * perf/init_scale.sh runs it at many counts and keeps the slowest rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef SHOAL_PERF_MPI
#include <mpi.h>
#else
#include <shoal.h>
#endif

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    double t0 = now_us(), t_init, t_first, in = 1.0, out = 0.0;
    int rank = -1, nranks = 0;
#ifdef SHOAL_PERF_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    MPI_Barrier(MPI_COMM_WORLD);
    t_init = now_us();
    MPI_Allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    t_first = now_us();
#else
    shoal_comm_t comm;
    shoal_status_t st = shoal_comm_init_env(&comm, NULL);
    (void)argc;
    (void)argv;
    if (st == SHOAL_OK) {
        st = shoal_barrier(comm, NULL);
    }
    t_init = now_us();
    if (st == SHOAL_OK) {
        st = shoal_allreduce(&in, &out, 1, SHOAL_FLOAT64, SHOAL_SUM, comm, NULL);
    }
    t_first = now_us();
    if (st != SHOAL_OK) {
        fprintf(stderr, "init_perf: %s\n", shoal_strerror(st));
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &nranks);
#endif
    if (out != (double)nranks) {
        fprintf(stderr, "init_perf: rank %d: AllReduce gave %g, expected %d\n", rank, out,
                nranks);
        return 1;
    }
    printf("INIT rank %d nranks %d init_us %.0f first_us %.0f\n", rank, nranks, t_init - t0,
           t_first - t0);
    fflush(stdout);
#ifdef SHOAL_PERF_MPI
    MPI_Finalize();
#else
    shoal_comm_destroy(comm);
#endif
    return 0;
}
