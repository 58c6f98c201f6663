/* Env-var config table of the ucx transport. UCX's own variables (UCX_TLS, UCX_NET_DEVICES,
 * UCX_RNDV_THRESH, ...) are read by UCX itself and pass through unchanged. */
#include "transports/ucx/ucx.h"

#include <stddef.h>

shoal_ucx_config_t shoal_ucx_config = {
    .inline_max = 8192,
    .cma = 1,
    .fast_cmpl = 1,
    .unexp_max = 1024,
    .unexp_total = 65536,
};

static const shoal_cfg_field_t shoal_ucx_cfg_fields[] = {
    {
        .name = "UCX_INLINE_MAX",
        .dflt = "8k",
        .doc = "ucx messages with at most this many payload bytes travel in one eager message "
               "behind a 12-byte header (copied once on each side); larger ones send the payload "
               "from the caller's buffer as a second message (eager or rendezvous, as UCX "
               "chooses; between ranks of one host one message with the header, or a single "
               "copy: SHOAL_UCX_FAST_CMPL, SHOAL_UCX_CMA); both sides use the smaller of their "
               "values; at most 1m (a larger value is taken as 1m, with a warning). Each peer "
               "holds 32 buffers of 32 + this many bytes, all written at init (1000 peers at "
               "8k: about 250 MiB a rank; SHOAL_CONNECT=lazy: only those of the peers used "
               "are touched); unset: 8k x the copy rate in L2 / 55 GB/s, a power of two "
               "within 2k..64k (SHOAL_TUNE)",
        .offset = offsetof(shoal_ucx_config_t, inline_max),
        .type = SHOAL_CFG_SIZE,
        .flags = SHOAL_CFG_F_DERIVED,
    },
    {
        .name = "UCX_CMA",
        .dflt = "y",
        .doc = "between ranks of one host, a ucx payload above the inline limit is read by the "
               "receiver straight from the sender's buffer with process_vm_readv (one copy; "
               "UCX 1.13 leaves its own cma out of endpoints with error handling, and its "
               "shared-memory FIFO copies twice, in fragments). Used toward a peer only where "
               "that peer proved at connect time that it can read this rank (ptrace "
               "permission, same pid namespace); n = never (both directions)",
        .offset = offsetof(shoal_ucx_config_t, cma),
        .type = SHOAL_CFG_BOOL,
    },
    {
        .name = "UCX_CMA_MIN",
        .dflt = "0",
        .doc = "smallest ucx payload sent by single copy (SHOAL_UCX_CMA); smaller ones above "
               "the inline limit go through UCX (its shared-memory FIFO); payloads of at most "
               "SHOAL_UCX_INLINE_MAX bytes always travel inline; 0 = every payload above the "
               "inline limit; unset: the L2 size / 16, a power of two within 16k..1m (the "
               "kernel's copy pins pages and copies at about half memcpy's rate, so it pays "
               "only once a message leaves the cache; SHOAL_TUNE)",
        .offset = offsetof(shoal_ucx_config_t, cma_min),
        .type = SHOAL_CFG_SIZE,
        .flags = SHOAL_CFG_F_DERIVED,
    },
    {
        .name = "UCX_FAST_CMPL",
        .dflt = "y",
        .doc = "toward a rank of this host, ucx sends ask UCX for fast local completion "
               "(UCP_OP_ATTR_FLAG_FAST_CMPL, as Open MPI's pml ucx does for a blocking "
               "MPI_Send): UCX then copies a payload eagerly through its shared-memory FIFO up "
               "to UCX_RNDV_SEND_NBR_THRESH (256k unless set) instead of starting a rendezvous "
               "above about 8 KiB, whose request and reply travel through the same FIFO before "
               "the data (these endpoints have no zero-copy lane); and a payload above "
               "SHOAL_UCX_INLINE_MAX travels in one message with its header, gathered from both "
               "buffers (the receiver scatters it into its header slot and the caller's "
               "buffer, then checks the header). Payloads of at least SHOAL_UCX_CMA_MIN are "
               "read by single copy either way; n = UCX's default thresholds, header and "
               "payload apart",
        .offset = offsetof(shoal_ucx_config_t, fast_cmpl),
        .type = SHOAL_CFG_BOOL,
    },
    {
        .name = "UCX_UNEXPECTED_MAX",
        .dflt = "1024",
        .doc = "most ucx messages of one peer held before their receives are posted (UCX "
               "would queue them without limit); one more fails the connection to that peer "
               "with SHOAL_ERR_PROTOCOL, the peer named and told. Messages under no key of the "
               "communicator (a process outside the job) are never held: dropped on arrival; "
               "0 = no limit",
        .offset = offsetof(shoal_ucx_config_t, unexp_max),
        .type = SHOAL_CFG_UINT,
    },
    {
        .name = "UCX_UNEXPECTED_TOTAL",
        .dflt = "65536",
        .doc = "most ucx messages of all peers of a communicator held before their receives "
               "are posted; one more fails the connection to the peer that holds the most "
               "(SHOAL_ERR_PROTOCOL, named and told); 0 = no limit",
        .offset = offsetof(shoal_ucx_config_t, unexp_total),
        .type = SHOAL_CFG_UINT,
    },
    {
        .name = "UCX_LIBRARY",
        .dflt = "libucp.so.0",
        .doc = "the UCX library the ucx transport loads when it is first used (SHOAL_TRANSPORT="
               "ucx, or across hosts where an RDMA port is ACTIVE and ib is not chosen: "
               "SHOAL_UCX_SYSFS_ROOT); libshoal does not link UCX, so a job on shm or tcp never "
               "loads it nor gets its signal handlers. A file name is looked up by the dynamic loader, then "
               "where configure found UCX; a path is used as it is. UCX's SIGSEGV/SIGBUS/"
               "SIGILL/SIGFPE handlers are removed again unless UCX_HANDLE_ERRORS is set, its SIGHUP "
               "handler (UCX's debug signal) unless UCX_DEBUG_SIGNO is set",
        .offset = offsetof(shoal_ucx_config_t, library),
        .type = SHOAL_CFG_STRING,
    },
    {
        .name = "UCX_SYSFS_ROOT",
        .dflt = "/sys",
        .doc = "root of the sysfs tree where the ucx transport looks for an RDMA device with an "
               "ACTIVE port before it loads UCX to be chosen across hosts (none: tcp, and UCX "
               "is not loaded; tests)",
        .offset = offsetof(shoal_ucx_config_t, sysfs_root),
        .type = SHOAL_CFG_STRING,
    },
};

const shoal_cfg_table_t shoal_ucx_cfg_table = {
    .module = "ucx",
    .fields = shoal_ucx_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_ucx_cfg_fields),
    .dst = &shoal_ucx_config,
};
