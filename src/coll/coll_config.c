/* SHOAL_* variables of the algorithms. */
#include "coll/coll.h"

#include <stddef.h>

shoal_coll_config_t shoal_coll_config;

const char *const shoal_algo_names[] = {"auto", "ring", "rd", "shm", "tree", NULL};

static const shoal_cfg_field_t shoal_coll_cfg_fields[] = {
    {.name = "ALGO", .dflt = "auto", .type = SHOAL_CFG_ENUM, .enum_names = shoal_algo_names,
     .offset = offsetof(shoal_coll_config_t, algo),
     .doc = "force an algorithm where it applies: ring, rd (recursive doubling), shm (the "
            "intra-node shared-memory path), tree (broadcast/reduce); auto = choose per call"},
    {.name = "CHUNK_SIZE", .dflt = "512k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, chunk_size),
     .doc = "pipeline chunk of the ring and tree algorithms (per block per step); scratch is "
            "4 chunks per communicator"},
    {.name = "RD_MAX_BYTES", .dflt = "32k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, rd_max),
     .doc = "AllReduce messages up to this size use recursive doubling across channels "
            "(latency-bound), larger ones the ring"},
    {.name = "TREE_MAX_BYTES", .dflt = "64k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, tree_max),
     .doc = "broadcasts up to this size use a binomial tree, larger ones a pipelined chain"},
    {.name = "SHM_ONESHOT_MAX", .dflt = "64k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, shm_oneshot_max),
     .doc = "intra-node AllReduce up to this size is one-shot (every rank reduces everything); "
            "larger is two-shot (reduce-scatter + allgather through shared memory)"},
    {.name = "SHM_WINDOW", .dflt = "1m", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, shm_window),
     .doc = "bytes per rank staged per round of the intra-node path (kept cache-sized; capped "
            "by SHOAL_SHM_AREA_SIZE / 2)"},
};

const shoal_cfg_table_t shoal_coll_cfg_table = {
    .module = "coll",
    .fields = shoal_coll_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_coll_cfg_fields),
    .dst = &shoal_coll_config,
};
