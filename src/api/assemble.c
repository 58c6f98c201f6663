/*
 * The assembly of a communicator: what a communicator carries above core is set up here,
 * the one place above core, topo, coll and cuda, in layer order: first the topology (src/topo:
 * hosts, sockets, ring order, links; owned by the communicator as comm->topo), then the
 * algorithms' state (src/coll: scratch, shared areas, the cost model's shape of comm->topo).
 * Before the bootstrap, each rank's transport sizes come from src/tune (tl_sizes).
 * Core reaches this only through shoal_comm_assembly (core.h). The CUDA layer keeps its
 * per-communicator state in the proxy's extension slot, made on first use, and runs calls
 * on host memory through coll's algorithms by shoal_cuda_host (cuda.h), defined here.
 */
#include "api/api.h"
#include "coll/coll.h"
#include "cuda/cuda.h"
#include "topo/topo.h"
#include "tune/tune.h"

static shoal_status_t shoal_assemble_init(struct shoal_comm *comm)
{
    SHOAL_CHECK(shoal_topo_comm_init(comm, &comm->topo));
    return shoal_coll_comm_init(comm);
}

static void shoal_assemble_fini(struct shoal_comm *comm)
{
    shoal_api_group_forget(comm); /* the thread's open group must not run on it */
    shoal_cuda_group_forget(comm);
    shoal_coll_comm_fini(comm);
    shoal_topo_comm_free(comm->topo);
    comm->topo = NULL;
}

const shoal_comm_assembly_t shoal_comm_assembly = {
    .tl_sizes = shoal_tune_tl_sizes,
    .link_sizes = shoal_tune_link_sizes,
    .init = shoal_assemble_init,
    .fini = shoal_assemble_fini,
};

const shoal_cuda_host_t shoal_cuda_host = {
    .run = shoal_coll_run,
};
