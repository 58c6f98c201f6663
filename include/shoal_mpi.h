/*
 * shoal for MPI programs: build a shoal communicator over the processes of an MPI
 * communicator, with MPI doing the rendezvous (no SHOAL_UID, SHOAL_ROOT or PMIx needed).
 *
 * Link with -lshoal_mpi -lshoal and your MPI (pkg-config shoal_mpi, or mpicc ... -lshoal_mpi
 * -lshoal). MPI must be initialised before the call and finalised after shoal_comm_destroy.
 */
#ifndef SHOAL_MPI_H
#define SHOAL_MPI_H

#include <mpi.h>
#include <shoal.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over mpi_comm: every process of mpi_comm calls it, and each gets a shoal
 * communicator whose rank and size are its rank and size in mpi_comm. Rank 0 of mpi_comm
 * creates the unique id (shoal_get_unique_id, for cfg's tenant and job name) and broadcasts
 * it (MPI_Ibcast); then every rank calls shoal_comm_init. cfg may be NULL (defaults).
 * mpi_comm must be an intracommunicator (MPI_Intercomm_merge an intercommunicator first).
 * Errors: SHOAL_ERR_INVALID_ARG (NULL comm_p, MPI_COMM_NULL, an intercommunicator, MPI not
 * initialised or already finalised), the
 * status of shoal_get_unique_id on rank 0 (returned on every rank), SHOAL_ERR_SYSTEM when an
 * MPI call returns an error (only under an error handler that returns),
 * SHOAL_ERR_TIMEOUT when the broadcast of the id did not complete within cfg's timeout
 * (SHOAL_TIMEOUT_MS by default: a rank of mpi_comm never called; the broadcast stays posted
 * on mpi_comm, so use it for no other collective), or that of shoal_comm_init.
 * *comm_p is set only on success. */
SHOAL_EXPORT shoal_status_t shoal_mpi_comm_init(shoal_comm_t *comm_p, MPI_Comm mpi_comm,
                                                const shoal_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif /* SHOAL_MPI_H */
