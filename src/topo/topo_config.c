/* SHOAL_* variables of the topology: discovery, the synthetic topology file, the ring order,
 * the link profile and its measurement. */
#include "topo/topo.h"

#include <stddef.h>

shoal_topo_config_t shoal_topo_config;

static const char *const shoal_topo_ring_orders[] = {"topo", "rank", NULL};
static const char *const shoal_topo_disc_names[] = {"auto", "hwloc", "sysfs", "none", NULL};

static const shoal_cfg_field_t shoal_topo_cfg_fields[] = {
    {.name = "RING_ORDER", .dflt = "topo", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_topo_ring_orders, .offset = offsetof(shoal_topo_config_t, ring_order),
     .doc = "order of the ring algorithms: topo (all ranks of a host, socket by socket, before "
            "the next host: one crossing per host boundary and direction) or rank (as given)"},
    {.name = "RING_HOSTS", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_topo_config_t, ring_hosts),
     .doc = "hosts in the order the ring visits them (names separated by commas or spaces, "
            "e.g. shoal-place's ring output; a host is its SHOAL_HOSTID if set, else its short "
            "host name): with SHOAL_RING_ORDER=topo, ranks are grouped by host in this order; "
            "a malformed list, a host missing from it or different lists on different ranks "
            "is a warning and the usual order"},
    {.name = "RING_HOSTS_FILE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_topo_config_t, ring_hosts_file),
     .doc = "file with the ring's hosts, one a line ('#' comments; shoal-place --out writes "
            "<job>.ring); SHOAL_RING_HOSTS wins when both are set"},
    {.name = "TOPO_FILE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_topo_config_t, topo_file),
     .doc = "synthetic topology: assigns ranks to virtual hosts and sockets and gives link "
            "latency/bandwidth to the cost model (format: README, src/topo/topo.h)"},
    {.name = "TOPO_DISCOVERY", .dflt = "auto", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_topo_disc_names,
     .offset = offsetof(shoal_topo_config_t, topo_discovery),
     .doc = "host discovery: auto (hwloc if built in, else sysfs), hwloc (sysfs, with a "
            "warning, where hwloc is not built in or fails), sysfs or none"},
    {.name = "TUNING_FILE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_topo_config_t, tuning_file),
     .doc = "cached link profile ('<kind> lat <us> bw <GB/s> [send <us> [recv <us>]]' lines: "
            "latency, bandwidth, busy time per message of a sender and a receiver; 'reduce' "
            "and 'copy' lines give local memory rates): read at init instead of measuring "
            "those kinds; written by rank 0 after measuring when the file is absent"},
    {.name = "TOPO_MEASURE", .dflt = "1", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoal_topo_config_t, topo_measure),
     .doc = "measure links at init between neighbour ranks: latency and bandwidth by "
            "ping-pongs, a sender's and a receiver's busy time per message by bursts (about "
            "3 ms; each pair of neighbours on different hosts sends about 0.8 MB each way, 3 "
            "round trips of 256 KiB, which the meter does not count: its counters start after "
            "init, at the first call; a pair whose figures give over 1 TB/s, as on a loaded "
            "machine, is not used); 0 = tuning file or defaults only"},
};

const shoal_cfg_table_t shoal_topo_cfg_table = {
    .module = "topo",
    .fields = shoal_topo_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_topo_cfg_fields),
    .dst = &shoal_topo_config,
};
