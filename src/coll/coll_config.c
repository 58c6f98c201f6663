/* SHOAL_* variables of the algorithms. */
#include "coll/coll.h"

#include <stddef.h>

shoal_coll_config_t shoal_coll_config;

const char *const shoal_algo_names[] = {"auto", "ring", "rd", "shm", "tree", "dbtree", "rab",
                                        "hier", "bruck", "pairwise", "ptree", NULL};

static const char *const shoal_coll_ring_orders[] = {"topo", "rank", NULL};
static const char *const shoal_coll_topo_disc[] = {"auto", "hwloc", "sysfs", "none", NULL};

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
    {.name = "RD_MAX_BYTES", .dflt = "32k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, rd_max),
     .doc = "AllReduce messages up to this size use recursive doubling across channels "
            "(latency-bound), larger ones the ring"},
    {.name = "TREE_MAX_BYTES", .dflt = "64k", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_coll_config_t, tree_max),
     .doc = "broadcasts up to this size use a binomial tree, larger ones a pipelined chain"},
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
    {.name = "RING_ORDER", .dflt = "topo", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_coll_ring_orders, .offset = offsetof(shoal_coll_config_t, ring_order),
     .doc = "order of the ring algorithms: topo (all ranks of a host, socket by socket, before "
            "the next host: one crossing per host boundary and direction) or rank (as given)"},
    {.name = "RING_HOSTS", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_coll_config_t, ring_hosts),
     .doc = "hosts in the order the ring visits them (names separated by commas or spaces, "
            "e.g. shoal-place's ring output; a host is its SHOAL_HOSTID if set, else its short "
            "host name): with SHOAL_RING_ORDER=topo, ranks are grouped by host in this order; "
            "a malformed list, a host missing from it or different lists on different ranks "
            "is a warning and the usual order"},
    {.name = "RING_HOSTS_FILE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_coll_config_t, ring_hosts_file),
     .doc = "file with the ring's hosts, one a line ('#' comments; shoal-place --out writes "
            "<job>.ring); SHOAL_RING_HOSTS wins when both are set"},
    {.name = "TOPO_FILE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_coll_config_t, topo_file),
     .doc = "synthetic topology: assigns ranks to virtual hosts and sockets and gives link "
            "latency/bandwidth to the cost model (format: README, src/topo/topo.h)"},
    {.name = "TOPO_DISCOVERY", .dflt = "auto", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_coll_topo_disc, .offset = offsetof(shoal_coll_config_t, topo_discovery),
     .doc = "host discovery: auto (hwloc if built in, else sysfs), hwloc, sysfs or none"},
    {.name = "TUNING_FILE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_coll_config_t, tuning_file),
     .doc = "cached link profile ('<kind> lat <us> bw <GB/s> [send <us> [recv <us>]]' lines: "
            "latency, bandwidth, busy time per message of a sender and a receiver; 'reduce' "
            "and 'copy' lines give local memory rates): read at init instead of measuring "
            "those kinds; written by rank 0 after measuring when the file is absent"},
    {.name = "TOPO_MEASURE", .dflt = "1", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoal_coll_config_t, topo_measure),
     .doc = "measure links at init between neighbour ranks: latency and bandwidth by "
            "ping-pongs, a sender's and a receiver's busy time per message by bursts (about "
            "3 ms); 0 = tuning file or defaults only"},
};

const shoal_cfg_table_t shoal_coll_cfg_table = {
    .module = "coll",
    .fields = shoal_coll_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_coll_cfg_fields),
    .dst = &shoal_coll_config,
};
