/*
 * The assembly of a communicator: what a communicator carries above core (the algorithms'
 * scratch and shared areas, the topology, the ring order, the cost model's shape) is set up
 * here, the one place above core, topo, coll and cuda; core reaches it only through
 * shoal_comm_assembly (core.h). The CUDA layer keeps its per-communicator state in the
 * proxy's extension slot, made on first use.
 */
#include "coll/coll.h"

static shoal_status_t shoal_assemble_init(struct shoal_comm *comm)
{
    return shoal_coll_comm_init(comm); /* scratch, shm direct path, then topo_comm_init */
}

static void shoal_assemble_fini(struct shoal_comm *comm)
{
    shoal_coll_comm_fini(comm);
}

const shoal_comm_assembly_t shoal_comm_assembly = {
    .init = shoal_assemble_init,
    .fini = shoal_assemble_fini,
};
