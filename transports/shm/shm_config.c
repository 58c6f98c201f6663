/* Env-var config table of the shared-memory transport. */
#include "transports/shm/shm.h"

#include <stddef.h>

shoal_shm_config_t shoal_shm_config = {
    .slot_size = 64 * 1024,
    .nslots = 8,
    .area_size = 8 * 1024 * 1024,
    .dir = "/dev/shm",
    .disable = 0,
    .cma = 1,
};

static const shoal_cfg_field_t shoal_shm_cfg_fields[] = {
    {
        .name = "SHM_SLOT_SIZE",
        .dflt = "64k",
        .doc = "bytes per ring slot of the shm transport (at least 256; messages stream "
               "through the ring slot by slot); unset: the copy rate in L2 x 1 us (a slot's "
               "copy takes ten flag handoffs), a power of two within 16k..1m (SHOAL_TUNE); "
               "every rank of a host uses its lowest rank's",
        .offset = offsetof(shoal_shm_config_t, slot_size),
        .type = SHOAL_CFG_SIZE,
        .flags = SHOAL_CFG_F_DERIVED,
    },
    {
        .name = "SHM_NSLOTS",
        .dflt = "8",
        .doc = "ring slots per direction per local peer of the shm transport (at least 2); "
               "unset: a ring of the copy rate from memory x 50 us (a late peer's reaction), at "
               "most half the L2, divided by the slot size, within 2..64 (SHOAL_TUNE); every "
               "rank of a host uses its lowest rank's",
        .offset = offsetof(shoal_shm_config_t, nslots),
        .type = SHOAL_CFG_UINT,
        .flags = SHOAL_CFG_F_DERIVED,
    },
    {
        .name = "SHM_AREA_SIZE",
        .dflt = "8m",
        .doc = "bytes of shared area per rank for the intra-node direct collective path",
        .offset = offsetof(shoal_shm_config_t, area_size),
        .type = SHOAL_CFG_SIZE,
    },
    {
        .name = "SHM_DIR",
        .dflt = "/dev/shm",
        .doc = "where the shm transport makes its segments (checked for write access and free "
               "space): another directory, e.g. a larger tmpfs where a container's /dev/shm is "
               "small, must be the same for every rank of a host; segments that dead "
               "processes of the same user left there are removed (see Transports)",
        .offset = offsetof(shoal_shm_config_t, dir),
        .type = SHOAL_CFG_STRING,
    },
    {
        .name = "SHM_DISABLE",
        .dflt = "no",
        .doc = "disable the shared-memory transport (same-host peers then use the next one)",
        .offset = offsetof(shoal_shm_config_t, disable),
        .type = SHOAL_CFG_BOOL,
    },
    {
        .name = "SHM_CMA",
        .dflt = "yes",
        .doc = "single-copy transfers between local ranks through the kernel "
               "(process_vm_readv/writev, like Open MPI's CMA) for large intra-node AllReduce "
               "on ordinary buffers; used only where every local peer is in this pid namespace "
               "and a probe read of each at init works (same user, ptrace allowed: Yama "
               "ptrace_scope 0); no = always stage "
               "through shared memory",
        .offset = offsetof(shoal_shm_config_t, cma),
        .type = SHOAL_CFG_BOOL,
    },
};

const shoal_cfg_table_t shoal_shm_cfg_table = {
    .module = "shm",
    .fields = shoal_shm_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_shm_cfg_fields),
    .dst = &shoal_shm_config,
};
