/*
 * libshoal_mpi under mpirun (run by tests/mpi/test_mpirun.sh): argument errors, a shoal
 * communicator over MPI_COMM_WORLD and one over each half of an MPI_Comm_split, each checked
 * against MPI_Allreduce of the same data. Every check is agreed over all ranks; rank 0 prints
 * one line per check, "ok - ..." or "not ok - ...", and the exit status is 1 if any failed.
 * "test_shoal_mpi late" (under SHOAL_TIMEOUT_MS=1000) runs only the check of a late rank;
 * "test_shoal_mpi env" only shoal_comm_init_env (PMIx) with cfg's identity.
 */
#include <shoal_mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TEST_COUNT 100003 /* odd, not a multiple of anything shoal chunks by */

static int test_failed;

/* Agreed verdict: fails on every rank if it failed on one. */
static void test_check(int ok, const char *what, MPI_Comm comm)
{
    int bad = !ok, any = 0, rank = 0;

    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (any) {
        test_failed = 1;
    }
    if (rank == 0) {
        printf("%s - %s\n", any ? "not ok" : "ok", what);
        fflush(stdout);
    }
}

/* shoal_allreduce (int32 sum and float max) over scomm equals MPI_Allreduce over mcomm. */
static int test_allreduce_vs_mpi(shoal_comm_t scomm, MPI_Comm mcomm)
{
    int32_t *a = malloc(TEST_COUNT * sizeof(*a)), *b = malloc(TEST_COUNT * sizeof(*b));
    float *fa = malloc(TEST_COUNT * sizeof(*fa)), *fb = malloc(TEST_COUNT * sizeof(*fb));
    int rank, ok = a != NULL && b != NULL && fa != NULL && fb != NULL;

    MPI_Comm_rank(MPI_COMM_WORLD, &rank); /* world rank: the data differ between subgroups */
    for (int i = 0; ok && i < TEST_COUNT; i++) {
        a[i] = (rank + 1) * (i % 1009) - 7 * rank;
        fa[i] = (float)((rank * 31 + i) % 113);
    }
    ok = ok && shoal_allreduce(a, b, TEST_COUNT, SHOAL_INT32, SHOAL_SUM, scomm, NULL) == SHOAL_OK;
    ok = ok && MPI_Allreduce(MPI_IN_PLACE, a, TEST_COUNT, MPI_INT32_T, MPI_SUM, mcomm) ==
                   MPI_SUCCESS;
    ok = ok && shoal_allreduce(fa, fb, TEST_COUNT, SHOAL_FLOAT32, SHOAL_MAX, scomm, NULL) ==
                   SHOAL_OK;
    ok = ok && MPI_Allreduce(MPI_IN_PLACE, fa, TEST_COUNT, MPI_FLOAT, MPI_MAX, mcomm) ==
                   MPI_SUCCESS;
    for (int i = 0; ok && i < TEST_COUNT; i++) {
        ok = a[i] == b[i] && fa[i] == fb[i];
    }
    free(a);
    free(b);
    free(fa);
    free(fb);
    return ok;
}

static void test_comm(MPI_Comm mcomm, const char *name)
{
    shoal_comm_t scomm = NULL;
    int mrank, msize, srank = -1, ssize = -1;
    char what[128];

    MPI_Comm_rank(mcomm, &mrank);
    MPI_Comm_size(mcomm, &msize);
    snprintf(what, sizeof(what), "shoal_mpi_comm_init over %s", name);
    test_check(shoal_mpi_comm_init(&scomm, mcomm, NULL) == SHOAL_OK, what, MPI_COMM_WORLD);
    if (scomm == NULL) {
        return;
    }
    shoal_comm_rank(scomm, &srank);
    shoal_comm_size(scomm, &ssize);
    snprintf(what, sizeof(what), "%s: shoal rank and size are the MPI ones", name);
    test_check(srank == mrank && ssize == msize, what, MPI_COMM_WORLD);
    snprintf(what, sizeof(what), "%s: shoal_allreduce int32 sum, float max == MPI_Allreduce",
             name);
    test_check(test_allreduce_vs_mpi(scomm, mcomm), what, MPI_COMM_WORLD);
    test_check(shoal_comm_destroy(scomm) == SHOAL_OK, "shoal_comm_destroy", MPI_COMM_WORLD);
}

/* An intercommunicator between the even and the odd world ranks is refused at once on every
 * rank (its MPI_Bcast with root 0 used to leave every process waiting for the other group). */
static void test_intercomm(int rank, int size)
{
    MPI_Comm half, inter;
    shoal_comm_t c = NULL;
    int ok = 1;

    if (size >= 2) {
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
        MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 7, &inter);
        ok = shoal_mpi_comm_init(&c, inter, NULL) == SHOAL_ERR_INVALID_ARG && c == NULL;
        MPI_Comm_free(&inter);
        MPI_Comm_free(&half);
    }
    test_check(ok, "an intercommunicator: invalid argument at once, *comm_p untouched",
               MPI_COMM_WORLD);
}

/* Rank 0 does not call (stuck elsewhere): the others get SHOAL_ERR_TIMEOUT at the deadline of
 * cfg instead of waiting in MPI_Bcast forever; rank 0 then calls late and fails at its own join
 * (nobody comes), which also completes the others' broadcasts, freed by their next call. */
static void test_rank0_absent(int rank)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t c = NULL;
    MPI_Comm dup;
    double t0, secs;
    int ok = 1;

    cfg.timeout_ms = 2000;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup); /* the late broadcast stays off MPI_COMM_WORLD */
    if (rank != 0) {
        t0 = MPI_Wtime();
        ok = shoal_mpi_comm_init(&c, dup, &cfg) == SHOAL_ERR_TIMEOUT && c == NULL;
        secs = MPI_Wtime() - t0;
        ok = ok && secs >= 1.5 && secs < 30;
    }
    test_check(ok, "rank 0 never calls: SHOAL_ERR_TIMEOUT at the timeout on the others",
               MPI_COMM_WORLD);
    if (rank == 0) {
        ok = shoal_mpi_comm_init(&c, dup, &cfg) != SHOAL_OK && c == NULL;
    }
    test_check(ok, "rank 0 calls late: it fails too", MPI_COMM_WORLD);
    MPI_Comm_free(&dup);
}

/* cfg's tenant and job name are the communicator's identity: rank 0's unique id is made for
 * them, so the ranks' join (which checks the id's identity against cfg's) succeeds. The id
 * was made for the environment's identity only, and every rank failed with
 * SHOAL_ERR_PERMISSION ("the unique id was made for another tenant"). */
static void test_cfg_identity(void)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t c = NULL;
    shoal_status_t st;

    cfg.tenant = "mpi-tenant";
    cfg.job_name = "mpi-job";
    st = shoal_mpi_comm_init(&c, MPI_COMM_WORLD, &cfg);
    test_check(st == SHOAL_OK && c != NULL, "cfg.tenant and cfg.job_name set: init succeeds "
               "(the id is made for cfg's identity)", MPI_COMM_WORLD);
    if (c != NULL) {
        shoal_comm_destroy(c);
    }
}

/* "env" mode: shoal_comm_init_env under mpirun (the unique id through PMIx) with cfg's tenant
 * and job name. Rank 0's id was made for the environment's identity, and every rank failed
 * its join with SHOAL_ERR_PERMISSION. */
static void test_env_cfg_identity(void)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t c = NULL;

    cfg.tenant = "env-tenant";
    cfg.job_name = "env-job";
    test_check(shoal_comm_init_env(&c, &cfg) == SHOAL_OK && c != NULL, "shoal_comm_init_env "
               "through PMIx, cfg.tenant and cfg.job_name set: init succeeds", MPI_COMM_WORLD);
    if (c != NULL) {
        shoal_comm_destroy(c);
    }
}

/* Run with SHOAL_TIMEOUT_MS=1000 ("late" mode): cfg's timeout (20 s) is the deadline of the
 * whole init, rank 0's root included. The last rank calls 3 s late, past the environment's
 * timeout but well within cfg's: every rank still gets its communicator. The root used to
 * wait SHOAL_TIMEOUT_MS only (shoal_get_unique_id knows no cfg): it gave up after 1 s without
 * a join, and every rank failed although cfg allowed 20 s. */
static void test_late_rank_within_cfg_timeout(int rank, int size)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    shoal_comm_t c = NULL;
    int ok;

    cfg.timeout_ms = 20000;
    if (rank == size - 1) {
        sleep(3);
    }
    ok = shoal_mpi_comm_init(&c, MPI_COMM_WORLD, &cfg) == SHOAL_OK && c != NULL;
    test_check(ok, "a rank 3 s late, SHOAL_TIMEOUT_MS=1000 but cfg.timeout_ms 20000: init "
               "succeeds (the root waits cfg's timeout)", MPI_COMM_WORLD);
    if (c != NULL) {
        test_check(shoal_comm_destroy(c) == SHOAL_OK, "shoal_comm_destroy", MPI_COMM_WORLD);
    }
}

int main(int argc, char **argv)
{
    shoal_comm_t c = NULL;
    MPI_Comm half;
    int rank, size;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 1 && strcmp(argv[1], "late") == 0) {
        test_late_rank_within_cfg_timeout(rank, size);
        MPI_Finalize();
        return test_failed;
    }
    if (argc > 1 && strcmp(argv[1], "env") == 0) {
        test_env_cfg_identity();
        MPI_Finalize();
        return test_failed;
    }
    test_check(shoal_mpi_comm_init(NULL, MPI_COMM_WORLD, NULL) == SHOAL_ERR_INVALID_ARG,
               "NULL comm_p: invalid argument", MPI_COMM_WORLD);
    test_check(shoal_mpi_comm_init(&c, MPI_COMM_NULL, NULL) == SHOAL_ERR_INVALID_ARG && c == NULL,
               "MPI_COMM_NULL: invalid argument, *comm_p untouched", MPI_COMM_WORLD);
    test_intercomm(rank, size);
    test_rank0_absent(rank);
    test_cfg_identity();
    test_comm(MPI_COMM_WORLD, "MPI_COMM_WORLD");
    /* Odd and even world ranks, in reverse order: shoal ranks follow the MPI ones. */
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, size - rank, &half);
    test_comm(half, "each half of an MPI_Comm_split (reversed keys)");
    MPI_Comm_free(&half);
    MPI_Finalize();
    return test_failed;
}
