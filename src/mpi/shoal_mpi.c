/*
 * libshoal_mpi: a shoal communicator over an MPI communicator. MPI is only the rendezvous:
 * one MPI_Bcast of the unique id; after that shoal moves all data on its own transports.
 * This library sees only libshoal's public API, so it reports through status codes.
 */
#include <shoal_mpi.h>

#include <stdint.h>
#include <string.h>

/* What rank 0 broadcasts: its shoal_get_unique_id status, then the id. */
typedef struct {
    int32_t status;
    shoal_uid_t uid;
} shoal_mpi_uid_msg_t;

static shoal_status_t shoal_mpi_check(int rc)
{
    return rc == MPI_SUCCESS ? SHOAL_OK : SHOAL_ERR_SYSTEM;
}

shoal_status_t shoal_mpi_comm_init(shoal_comm_t *comm_p, MPI_Comm mpi_comm,
                                   const shoal_config_t *cfg)
{
    shoal_config_t dflt = SHOAL_CONFIG_INIT;
    shoal_mpi_uid_msg_t msg;
    shoal_status_t status;
    int initialized = 0, finalized = 0, inter = 0, rank = -1, nranks = 0;

    if (comm_p == NULL || mpi_comm == MPI_COMM_NULL) {
        return SHOAL_ERR_INVALID_ARG;
    }
    if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized ||
        MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) {
        return SHOAL_ERR_INVALID_ARG;
    }
    /* An intercommunicator's MPI_Bcast with root 0 makes every process a receiver from the
     * other group's rank 0: all of them would wait forever. Refused before any call. */
    if (MPI_Comm_test_inter(mpi_comm, &inter) != MPI_SUCCESS || inter) {
        return SHOAL_ERR_INVALID_ARG;
    }
    status = shoal_mpi_check(MPI_Comm_rank(mpi_comm, &rank));
    if (status == SHOAL_OK) {
        status = shoal_mpi_check(MPI_Comm_size(mpi_comm, &nranks));
    }
    if (status != SHOAL_OK) {
        return status;
    }
    memset(&msg, 0, sizeof(msg));
    if (rank == 0) {
        msg.status = shoal_get_unique_id(&msg.uid);
    }
    /* Every rank takes part even when rank 0 failed: the status travels with the id. */
    status = shoal_mpi_check(MPI_Bcast(&msg, (int)sizeof(msg), MPI_BYTE, 0, mpi_comm));
    if (status == SHOAL_OK && msg.status != SHOAL_OK) {
        status = (shoal_status_t)msg.status;
    }
    if (status == SHOAL_OK) {
        status = shoal_comm_init(comm_p, nranks, rank, &msg.uid, cfg != NULL ? cfg : &dflt);
    }
    explicit_bzero(&msg, sizeof(msg)); /* the id holds the job secret */
    return status;
}
