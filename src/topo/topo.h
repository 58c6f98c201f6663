/*
 * Topology: what a host has (hwloc, or sysfs where hwloc is absent), a synthetic cluster
 * description (SHOAL_TOPO_FILE), the host-aware ring order, and the alpha-beta link model
 * the algorithm selection uses. Everything here is plain data and pure functions except
 * discovery (reads the machine) and topo_comm.c (exchanges summaries over a communicator).
 */
#ifndef SHOAL_TOPO_H
#define SHOAL_TOPO_H

#include "util/util.h"

#include <stdio.h>

#define SHOAL_TOPO_DEV_MAX 4
#define SHOAL_TOPO_DEVNAME_MAX 24

/* A NIC (network OS device) or GPU (PCI class display/3D) with its locality. */
typedef struct {
    char name[SHOAL_TOPO_DEVNAME_MAX]; /* eth0, mlx5_0; GPUs: PCI bus id */
    int16_t numa;                      /* NUMA node of its PCI locality, -1 unknown */
    int16_t socket;                    /* package, -1 unknown */
    uint32_t speed_mbps;               /* link speed where known, else 0 */
} shoal_topo_dev_t;

enum { SHOAL_TOPO_SRC_NONE = 0, SHOAL_TOPO_SRC_SYSFS = 1, SHOAL_TOPO_SRC_HWLOC = 2 };

/* Fixed-size summary of one rank's host, exchanged as plain bytes at communicator init. */
typedef struct {
    uint64_t host_id;
    int32_t source;        /* SHOAL_TOPO_SRC_* */
    int32_t nsockets;
    int32_t nnuma;
    int32_t ncores;
    int32_t npus;
    uint32_t l1d_kb, l2_kb, l3_kb; /* sizes of the caches above PU 0 */
    int32_t nnics;         /* found; only the first SHOAL_TOPO_DEV_MAX are listed */
    int32_t ngpus;
    int32_t cpu;           /* this rank's CPU at init (sched_getcpu), -1 unknown */
    int32_t socket;        /* its package (logical index), -1 unknown */
    int32_t numa;          /* its NUMA node (os index), -1 unknown */
    shoal_topo_dev_t nics[SHOAL_TOPO_DEV_MAX];
    shoal_topo_dev_t gpus[SHOAL_TOPO_DEV_MAX];
} shoal_topo_summary_t;

/* Discovery mode: SHOAL_TOPO_DISCOVERY. */
enum { SHOAL_TOPO_DISC_AUTO = 0, SHOAL_TOPO_DISC_HWLOC, SHOAL_TOPO_DISC_SYSFS,
       SHOAL_TOPO_DISC_NONE };

/* The calling process's host summary; the host part is discovered once per process and
 * cached, cpu/socket/numa are read at each call. Never fails: unknown fields are 0 or -1. */
SHOAL_HIDDEN void shoal_topo_discover(int mode, shoal_topo_summary_t *out);
SHOAL_HIDDEN int shoal_topo_discover_hwloc(shoal_topo_summary_t *out); /* 0: ok */
SHOAL_HIDDEN int shoal_topo_discover_sysfs(shoal_topo_summary_t *out); /* 0: ok */
/* The sockets, cores and PUs of the cpu directories under root (/sys/devices/system/cpu)
 * added to out (a test gives it another root). */
SHOAL_HIDDEN void shoal_topo_sysfs_cpus_at(const char *root, shoal_topo_summary_t *out);
SHOAL_HIDDEN void shoal_topo_summary_print(const shoal_topo_summary_t *s, FILE *fp);

/* ---- link model ---------------------------------------------------------------------- */

/* Channel kinds, named like their transports. */
typedef enum {
    SHOAL_LINK_SHM = 0,
    SHOAL_LINK_TCP,
    SHOAL_LINK_UCX,
    SHOAL_LINK_IB,
    SHOAL_LINK_KINDS
} shoal_link_kind_t;
extern SHOAL_HIDDEN const char *const shoal_link_kind_names[];
SHOAL_HIDDEN int shoal_link_kind_from_name(const char *tl_name); /* -1 if unknown */

/* alpha: microseconds per message (half a round trip); beta: microseconds per byte
 * (1 / bandwidth); send / recv: microseconds a sender / receiver is busy per small message
 * (LogP's o: what limits messages issued back to back; 0 = unknown, taken as alpha). */
typedef struct {
    double alpha_us;
    double beta_us;
    double send_us;
    double recv_us;
} shoal_link_t;

/* The sender's and receiver's busy time per message (alpha where unknown). */
static inline double shoal_link_send_us(const shoal_link_t *l)
{
    return l->send_us > 0 ? SHOAL_MIN(l->send_us, l->alpha_us) : l->alpha_us;
}
static inline double shoal_link_recv_us(const shoal_link_t *l)
{
    return l->recv_us > 0 ? SHOAL_MIN(l->recv_us, l->alpha_us) : l->alpha_us;
}

static inline double shoal_link_time(const shoal_link_t *l, double bytes)
{
    return l->alpha_us + bytes * l->beta_us;
}
static inline double shoal_gbs_to_beta(double gbs) { return gbs > 0 ? 1e-3 / gbs : 0; }
static inline double shoal_beta_to_gbs(double beta) { return beta > 0 ? 1e-3 / beta : 0; }

/* Whether a link measurement is believable: the large ping-pong's extra time over the small
 * one gives a bandwidth under 1 TB/s (more than any link or memory of today). On a loaded
 * machine the small one can take as long as the large one; the floor of the difference then
 * gave tens of TB/s, which rank 0 wrote to SHOAL_TUNING_FILE for every later job. */
SHOAL_HIDDEN int shoal_link_meas_plausible(double small_us, double large_us, size_t large_bytes);

/* Defaults per kind (used when neither a measurement nor a tuning file gives a value). */
SHOAL_HIDDEN shoal_link_t shoal_link_default(shoal_link_kind_t kind);

/* Cached profile (SHOAL_TUNING_FILE): lines "<kind> lat <us> bw <GB/s>", kind one of the
 * link kinds or "reduce" / "copy" (local memory rates, lat ignored); '#' comments. Lines
 * "set <NAME> <value>" are settings (src/tune reads them; skipped here). */
typedef struct {
    shoal_link_t link[SHOAL_LINK_KINDS];
    int have[SHOAL_LINK_KINDS];
    double reduce_gbs, copy_gbs; /* 0 when absent */
} shoal_tuning_t;
SHOAL_HIDDEN shoal_status_t shoal_tuning_parse(const char *text, shoal_tuning_t *t);
/* One line (no comment, no leading blanks) into t: 0, or -1 malformed (nothing logged). src/tune
 * reads the 'copy' and 'reduce' lines by it, so that both take and refuse the same lines. */
SHOAL_HIDDEN int shoal_tuning_parse_line(char *line, shoal_tuning_t *t);
/* 1 loaded, 0 no such file, negative status on a file that is there but unusable (malformed,
 * too large, unreadable). */
SHOAL_HIDDEN int shoal_tuning_load(const char *path, shoal_tuning_t *t);
/* The tuning file's text, whole (at most 64 KiB; src/tune reads its 'set' lines by it): 0 and
 * *text_p (malloc'ed), else an errno and why (shoal_text_file_read's; EPERM: a file or link
 * another local user could have left or changed, see topo_model.c). */
SHOAL_HIDDEN int shoal_tuning_read(const char *path, char **text_p, char *why, size_t whylen);
SHOAL_HIDDEN shoal_status_t shoal_tuning_save(const char *path, const shoal_tuning_t *t);
/* The profile rank 0 saves to an absent SHOAL_TUNING_FILE after measuring (bit k of measured:
 * some pair measured kind k believably, links[k] its figures; of tried: some pair timed it):
 * 1 and *t, or 0 where nothing was measured or a kind timed was not believable anywhere (a
 * loaded machine). The file is not written then: written without that kind, it would exist,
 * so no later job would write it, and every one would measure that kind again. */
SHOAL_HIDDEN int shoal_topo_profile(uint32_t measured, uint32_t tried, const shoal_link_t *links,
                                    shoal_tuning_t *t);

/* ---- synthetic topology (SHOAL_TOPO_FILE) ---------------------------------------------
 *   # comment                      anything after '#' is ignored
 *   hosts 2                        number of hosts (without ppn, block: every host gets
 *                                  ranks, the first ones one more where they do not divide)
 *   ppn 2                          ranks per host; a list (ppn 3 1) gives each host's count
 *   layout block                   block (host of rank r: 0 0 1 1) or cyclic (0 1 0 1)
 *   host 1 ranks 0 2 5             explicit placement of these ranks (overrides layout)
 *   sockets 2                      sockets per host: a host's ranks, in rank order, are cut
 *                                  into this many contiguous groups
 *   link intra lat 0.5 bw 10       same host: latency in us, bandwidth in GB/s
 *   link inter lat 30 bw 0.125     between hosts (per host: the NIC is shared)
 * Host lines place only the ranks they name and do not repeat; every other rank follows the
 * layout, which wraps around past the ranks it describes (with ppn, rank r is placed like
 * r mod hosts x ppn, or mod the ppn list's sum; cyclic: r mod hosts, or over a ppn list one
 * rank per host in turn, each host left out once it has its count: ppn 3 1 gives 0 1 0 0).
 */
typedef struct {
    int nhosts;
    int nranks;         /* ranks the arrays describe */
    int described;      /* ranks the file places before wrapping around (hosts x ppn, the ppn
                         * list's sum, the host lines' highest + 1); 0: it does not say */
    int sockets;        /* per host, >= 1 */
    int *host_of;       /* [nranks] */
    int *socket_of;     /* [nranks] */
    shoal_link_t intra, inter;
    int have_intra, have_inter; /* SHOAL_TOPO_LINK_* bits: the parts the link lines give */
} shoal_topo_file_t;
enum { SHOAL_TOPO_LINK_LAT = 1, SHOAL_TOPO_LINK_BW = 2, SHOAL_TOPO_LINK_SEND = 4,
       SHOAL_TOPO_LINK_RECV = 8 };
/* base with the parts of l that have names in place of its own: a line that leaves a part out
 * keeps the usual value of it (measured, tuning file or default), not 0 ('link inter lat 100'
 * alone had a bandwidth of 0, and the cost model then dropped the whole link for its default). */
SHOAL_HIDDEN shoal_link_t shoal_topo_file_link_over(shoal_link_t base, const shoal_link_t *l,
                                                    int have);

/* Parse text for a communicator of nranks ranks. On error logs the line and returns
 * SHOAL_ERR_INVALID_ARG; tf is then empty. */
SHOAL_HIDDEN shoal_status_t shoal_topo_file_parse(const char *text, int nranks,
                                                  shoal_topo_file_t *tf);
SHOAL_HIDDEN shoal_status_t shoal_topo_file_load(const char *path, int nranks,
                                                 shoal_topo_file_t *tf);
SHOAL_HIDDEN void shoal_topo_file_free(shoal_topo_file_t *tf);

/* ---- grouping and ring order --------------------------------------------------------- */

static inline int shoal_mod_int(int a, int n)
{
    int m = a % n;
    return m < 0 ? m + n : m;
}

/* Dense host indices in order of first appearance by rank; returns the number of hosts. */
SHOAL_HIDDEN int shoal_topo_host_index(int n, const uint64_t *host_ids, int *host_of);
/* order[pos] = rank: hosts in order of their lowest rank; within a host, sockets ascending
 * (by socket id, -1 first), then ranks ascending. The ring crosses each host boundary once per
 * direction. Deterministic: the same inputs give the same order on every rank. */
SHOAL_HIDDEN void shoal_topo_ring_order(int n, const int *host_of, const int *socket_of,
                                        int *order);
/* Largest number of ring edges (order[i] -> order[i+1]) leaving any one host: 1 for a
 * host-grouped ring over several hosts, 0 on one host. */
SHOAL_HIDDEN int shoal_topo_ring_share(int n, const int *host_of, const int *order);

/* The order of hosts a placement asks for (shoal-place's ring output): SHOAL_RING_HOSTS (names
 * separated by commas, spaces or newlines) or SHOAL_RING_HOSTS_FILE (the same, '#' comments).
 * A name: letters, digits, '.', '_', '-', fewer than SHOAL_TOPO_HOSTNAME_MAX characters; a
 * host is matched by SHOAL_HOSTID where set, else its short host name (with SHOAL_TOPO_FILE:
 * "host<N>", N its number in the file). A malformed list, a host of the communicator missing from it, or different lists on
 * different ranks: a warning, and the usual order. */
#define SHOAL_TOPO_HOSTNAME_MAX 64
#define SHOAL_TOPO_RING_HOSTS_MAX 65536
#define SHOAL_TOPO_RING_FILE_MAX (4 << 20)
typedef struct {
    char (*names)[SHOAL_TOPO_HOSTNAME_MAX];
    int n, cap;
    uint64_t hash; /* over the names in order; equal lists, equal hashes */
} shoal_topo_ring_hosts_t;
SHOAL_HIDDEN shoal_status_t shoal_topo_ring_hosts_parse(const char *text,
                                                        shoal_topo_ring_hosts_t *rh);
/* inline_list if set, else the file at path if set, else an empty list (n == 0). */
SHOAL_HIDDEN shoal_status_t shoal_topo_ring_hosts_load(const char *inline_list, const char *path,
                                                       shoal_topo_ring_hosts_t *rh);
SHOAL_HIDDEN void shoal_topo_ring_hosts_free(shoal_topo_ring_hosts_t *rh);
/* order[pos] = rank: hosts in list order, within a host sockets then ranks ascending. 0 done;
 * r + 1 (order untouched) when rank r's host is the first not in the list; -1 no memory. */
SHOAL_HIDDEN int shoal_topo_ring_order_hosts(int n, const int *socket_of,
                                             const char *const *host_name,
                                             const shoal_topo_ring_hosts_t *rh, int *order);

/* ---- settings (topo_config.c) -------------------------------------------------------- */

/* SHOAL_* variables of the topology. */
typedef struct {
    int ring_order;              /* SHOAL_RING_ORDER: 0 topo, 1 rank */
    const char *ring_hosts;      /* SHOAL_RING_HOSTS */
    const char *ring_hosts_file; /* SHOAL_RING_HOSTS_FILE */
    const char *topo_file;       /* SHOAL_TOPO_FILE */
    int topo_discovery;          /* SHOAL_TOPO_DISCOVERY: SHOAL_TOPO_DISC_* */
    const char *tuning_file;     /* SHOAL_TUNING_FILE */
    int topo_measure;            /* SHOAL_TOPO_MEASURE: ping-pongs at init */
} shoal_topo_config_t;
extern SHOAL_HIDDEN shoal_topo_config_t shoal_topo_config;

/* ---- the topology of a communicator (topo_comm.c) -------------------------------------
 * Built at communicator init over the communicator's channels (core's primitives) and owned
 * by the communicator (comm->topo, set by the assembly in src/api); identical on every rank.
 * The layers above read it: the ring algorithms their order and neighbours, the
 * hierarchical ones the host grouping, the cost model (src/coll) the links and the layout. */
struct shoal_comm;
typedef struct shoal_topo_comm {
    int nranks;
    int *ring_order;       /* [nranks] ring position -> rank (SHOAL_RING_ORDER, _RING_HOSTS) */
    int ring_pos;          /* this rank's position; ring_next/prev are ranks */
    int ring_next;
    int ring_prev;
    int ring_share;        /* ring edges leaving the busiest host (0: one host) */
    int nhosts;            /* hosts (virtual ones with SHOAL_TOPO_FILE) */
    int *host_of;          /* [nranks] host index, by first appearance in rank order */
    int *socket_of;        /* [nranks] socket of each rank (-1 unknown) */
    int ncores;            /* fewest cores of any rank's host (0: unknown) */
    shoal_link_t intra;    /* the slowest link kind between ranks of one host */
    shoal_link_t inter;    /* ... between hosts (one rank pair alone on the NIC) */
    double reduce_gbs;     /* local memory rates of rank 0's tuning file, 0 when absent */
    double copy_gbs;
} shoal_topo_comm_t;

/* Exchanges the summaries, orders the ring, measures the links (unless known) and returns
 * the result in *tc_p (freed with shoal_topo_comm_free). Collective over comm: every rank
 * calls it at the same point of its init. */
SHOAL_HIDDEN shoal_status_t shoal_topo_comm_init(struct shoal_comm *comm,
                                                 shoal_topo_comm_t **tc_p);
SHOAL_HIDDEN void shoal_topo_comm_free(shoal_topo_comm_t *tc);

#endif
