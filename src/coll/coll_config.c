/* SHOAL_* variables of the algorithms. */
#include "coll/coll.h"

#include <stddef.h>

shoal_coll_config_t shoal_coll_config;

const char *const shoal_algo_names[] = {"auto", "ring", "rd", "shm", "tree", "dbtree", "rab",
                                        "hier", "bruck", "pairwise", "ptree", NULL};

static const shoal_cfg_field_t shoal_coll_cfg_fields[] = {
    {.name = "ALGO", .dflt = "auto", .type = SHOAL_CFG_ENUM, .enum_names = shoal_algo_names,
     .offset = offsetof(shoal_coll_config_t, algo),
     .doc = "force an algorithm where it applies: ring, rd (recursive doubling), shm (the "
            "intra-node shared-memory path), tree (broadcast/reduce), dbtree (double binary "
            "tree), rab (Rabenseifner), hier (hierarchical: intra-host, inter-host, intra-host), "
            "bruck (allgather), pairwise (alltoall), ptree (pipelined tree broadcast); auto = "
            "choose per call"},
    {.name = "CHUNK_SIZE", .dflt = "512k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, chunk_size),
     .doc = "pipeline chunk of the ring and tree algorithms (per block per step); scratch is "
            "4 chunks per communicator; unset: half the L2 within 128k..1m (SHOAL_TUNE; the "
            "default where the L2 is unknown)"},
    /* The cost model picks every call's algorithm (select.c): this only bounds the messages
     * recursive doubling can take, through the scratch it sizes. The size thresholds that once
     * chose rd and the broadcast tree (SHOAL_TREE_MAX_BYTES, read and never used) are gone. */
    {.name = "RD_MAX_BYTES", .dflt = "32k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, rd_max),
     .doc = "smallest scratch per communicator and per nonblocking call in flight (it is 4 x "
            "SHOAL_CHUNK_SIZE or this, whichever is larger); recursive doubling AllReduce and "
            "Bruck allgather only run calls that fit it, and among the algorithms that can run "
            "a call the cost model picks"},
    {.name = "SHM_LL_MAX", .dflt = "64", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, shm_ll_max),
     .doc = "intra-node AllReduce up to this size (at most 4k) sends data and flag together in "
            "cache lines (one transfer per line); larger is one-shot; unset: 64 scaled by the "
            "measured copy rate (SHOAL_TUNE)"},
    {.name = "SHM_ONESHOT_MAX", .dflt = "0", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, shm_oneshot_max),
     .doc = "intra-node AllReduce up to this size is one-shot (every rank reduces everything); "
            "larger is two-shot (reduce-scatter + allgather through shared memory); 0 = 2k "
            "when the host has a core per rank, 16k when its ranks outnumber its cores, both "
            "scaled by the measured copy rate (SHOAL_TUNE)"},
    {.name = "SHM_WINDOW", .dflt = "512k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, shm_window),
     .doc = "bytes per rank staged per round of the intra-node path: the window, its staged "
            "copy and a peer's segment should fit in L2 (1m in place halved busbw on 1 MiB L2 "
            "cores); capped by SHOAL_SHM_AREA_SIZE / 2; unset: half the L2 within 64k..4m "
            "(SHOAL_TUNE)"},
    {.name = "HIER_SEGMENT", .dflt = "1m", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, hier_segment),
     .doc = "largest pipeline segment of the hierarchical AllReduce (intra-host "
            "reduce-scatter, inter-host ring and intra-host allgather of one segment overlap "
            "the other segments'); smaller buffers are cut into 8 segments of at least 64k"},
    {.name = "SHM_DIRECT_MIN", .dflt = "64k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, shm_direct_min),
     .doc = "intra-node AllReduce from this size first publishes every rank's buffers, then "
            "reduces in place when all are shoal_mem_alloc buffers, else by single copies "
            "through the kernel where every rank can (SHOAL_SHM_CMA), else staged two-shot"},
    {.name = "SHM_PREFETCHW", .dflt = "1", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoal_coll_config_t, shm_prefetchw),
     .doc = "an intra-node AllReduce of one or two cache lines (the LL protocol), once every "
            "peer's data is read, asks for this rank's lines of the next call in the exclusive "
            "state (x86 PREFETCHW where the CPU has it, aarch64 PRFM), so that the next call's "
            "stores need not wait for the peers' copies to be invalidated (2 ranks, 8 B: "
            "about 40 ns less per call on a 2.6 GHz Xeon VM); 0 = not"},
    /* Off by default: it costs a round of messages per call, and a broadcast cannot find out
     * otherwise (its root receives nothing). */
    {.name = "CHECK_ARGS", .dflt = "0", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoal_coll_config_t, check_args),
     .doc = "1 = before every collective the ranks compare its collective, count, dtype, op "
            "and root (one exchange of 80 bytes per log2(ranks) steps; nonblocking ones then "
            "run one at a time): any difference returns SHOAL_ERR_INVALID_ARG on every rank, "
            "naming it, and the communicator stays usable; 0 = not checked (only the "
            "intra-node AllReduce checks count, dtype and op; otherwise a difference fails "
            "the communicator, waits out its timeout, or goes unnoticed: an op, a dtype of the "
            "same size, or a broadcast's root give SHOAL_OK with wrong or no data); rank 0's "
            "applies"},
};

const shoal_cfg_table_t shoal_coll_cfg_table = {
    .module = "coll",
    .fields = shoal_coll_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_coll_cfg_fields),
    .dst = &shoal_coll_config,
};
