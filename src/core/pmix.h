/* Unique-id exchange through PMIx, for shoal_comm_init_env under mpirun/srun without MPI. */
#ifndef SHOAL_CORE_PMIX_H
#define SHOAL_CORE_PMIX_H

#include "core/core.h"

/* Collective over the PMIx job: rank 0 creates the unique id for cfg (NULL: defaults) and runs
 * its root, publishes it with PMIx_Put + PMIx_Commit + PMIx_Fence; every other rank reads it
 * with PMIx_Get. The id carries cfg's tenant and job name, which every rank's join checks
 * against its own cfg (made for the environment's, a cfg with a tenant failed every rank with
 * SHOAL_ERR_PERMISSION), and its root waits cfg's timeout.
 * rank/nranks must be this process's PMIx rank and the job size; timeout_ms (< 0: none) bounds
 * each step, the communicator's timeout (cfg.timeout_ms, else SHOAL_TIMEOUT_MS).
 * Returns SHOAL_ERR_UNSUPPORTED, having logged nothing worse than an info line, when no PMIx
 * server is reachable (no PMIX_NAMESPACE in the environment, or PMIx_Init fails): the caller
 * then reports that no rendezvous was found. Other errors are logged here. */
SHOAL_HIDDEN shoal_status_t shoal_pmix_exchange_uid(int rank, int nranks,
                                                    const shoal_config_t *cfg, int timeout_ms,
                                                    shoal_uid_t *uid);
/* shoal_get_unique_id for cfg (comm.c; exported for libshoal_mpi). */
SHOAL_EXPORT shoal_status_t shoal__get_unique_id_cfg(shoal_uid_t *uid, const shoal_config_t *cfg);

#endif
