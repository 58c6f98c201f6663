/* Env-var config table of the IB verbs transport. */
#include "transports/ib/ib.h"

#include <stddef.h>

shoal_ib_config_t shoal_ib_config = {
    .gid_index = -1,
    .family = SHOAL_IB_FAMILY_INET,
    .timeout = 18,
    .retry_cnt = 7,
    .rnr_retry = 7,
    .tc = 0,
    .sl = 0,
    .nslots = 64,
    .slot_size = 64 * 1024,
    .send_slots = 16,
    .reg_cache = 0,
    .reg_cache_max = 64u << 20,
    .max_inline = 128,
    .soft_device = -1,
};

static const char *const shoal_ib_family_names[] = {
    [SHOAL_IB_FAMILY_INET] = "AF_INET",
    [SHOAL_IB_FAMILY_INET6] = "AF_INET6",
    NULL,
};

#define SHOAL_IB_FIELD(n, d, t, f, text)                                                   \
    {.name = n, .dflt = d, .doc = text, .offset = offsetof(shoal_ib_config_t, f), .type = t}
/* Unset, derived from the port (src/tune's rule, shoal_info -t). */
#define SHOAL_IB_FIELD_DERIVED(n, d, t, f, text)                                           \
    {.name = n, .dflt = d, .doc = text, .offset = offsetof(shoal_ib_config_t, f), .type = t, \
     .flags = SHOAL_CFG_F_DERIVED}

static const shoal_cfg_field_t shoal_ib_cfg_fields[] = {
    SHOAL_IB_FIELD("IB_HCA", "", SHOAL_CFG_STRING, hca,
                   "RDMA devices and ports to use, as NCCL_IB_HCA: \"mlx5_0:1,mlx5_1\" (name "
                   "prefixes, optional :port), \"^mlx5_2\" excludes, \"=mlx5_0\" exact names; "
                   "empty: the first active port of the first device"),
    SHOAL_IB_FIELD("IB_GID_INDEX", "-1", SHOAL_CFG_INT, gid_index,
                   "RoCE GID table index to use (0..255: a queue pair names its source GID "
                   "in 8 bits); -1 picks a RoCE v2 GID of SHOAL_IB_ADDR_FAMILY from sysfs, "
                   "among indexes up to 255"),
    {
        .name = "IB_ADDR_FAMILY",
        .dflt = "AF_INET",
        .doc = "address family of the RoCE v2 GID to pick: AF_INET (IPv4-mapped) or AF_INET6",
        .offset = offsetof(shoal_ib_config_t, family),
        .type = SHOAL_CFG_ENUM,
        .enum_names = shoal_ib_family_names,
    },
    SHOAL_IB_FIELD("IB_MTU", "0", SHOAL_CFG_UINT, mtu,
                   "cap on the path MTU in bytes (256..4096); 0: the smaller active MTU of "
                   "both ports"),
    SHOAL_IB_FIELD("IB_TIMEOUT", "18", SHOAL_CFG_UINT, timeout,
                   "RC local ACK timeout exponent: 4.096 us * 2^value (1..31; 18 is ~1 s)"),
    SHOAL_IB_FIELD("IB_RETRY_CNT", "7", SHOAL_CFG_UINT, retry_cnt,
                   "RC transport retries before a send fails (0..7)"),
    SHOAL_IB_FIELD("IB_RNR_RETRY", "7", SHOAL_CFG_UINT, rnr_retry,
                   "RC receiver-not-ready retries (0..7; 7 is infinite)"),
    SHOAL_IB_FIELD("IB_TC", "0", SHOAL_CFG_UINT, tc,
                   "traffic class in the GRH (RoCE DSCP << 2 | ECN; 0..255)"),
    SHOAL_IB_FIELD("IB_SL", "0", SHOAL_CFG_UINT, sl, "InfiniBand service level (0..15)"),
    SHOAL_IB_FIELD("IB_PKEY", "0", SHOAL_CFG_UINT, pkey_index,
                   "partition key table index (below the port's table length, checked at "
                   "init)"),
    SHOAL_IB_FIELD_DERIVED("IB_RING_SLOTS", "64", SHOAL_CFG_UINT, nslots,
                           "receive ring slots per peer (2..4096): the credits a sender "
                           "starts with. Derived: twice the port's rate x (round trip + 50 us) "
                           "in slots, 4..4096, at most 4 MiB per peer"),
    SHOAL_IB_FIELD_DERIVED("IB_SLOT_SIZE", "64k", SHOAL_CFG_SIZE, slot_size,
                           "payload bytes per ring slot (4k..16m; each slot also has room for "
                           "the message header); larger messages are pipelined in chunks of "
                           "this size. Derived: 5 us of the port's rate (50 on a software "
                           "device), at least 16 active MTUs, 16k..1m"),
    SHOAL_IB_FIELD_DERIVED("IB_SEND_SLOTS", "16", SHOAL_CFG_UINT, send_slots,
                           "bounce slots per peer (1..4096, SHOAL_IB_SLOT_SIZE bytes each, "
                           "registered once): each chunk of a send is copied into one and "
                           "written from there, so this many chunks of a large message are in "
                           "flight at once. Derived: twice the port's rate x round trip in "
                           "slots, 4..SHOAL_IB_RING_SLOTS"),
    SHOAL_IB_FIELD("IB_RTT_US", "0", SHOAL_CFG_UINT, rtt_us,
                   "round trip in microseconds that the derived SHOAL_IB_RING_SLOTS and "
                   "SHOAL_IB_SEND_SLOTS cover (a measured ib_send_lat/ping figure of the "
                   "fabric); 0: assumed, 10 on a hardware port, 100 on a software device"),
    SHOAL_IB_FIELD("IB_REG_CACHE", "0", SHOAL_CFG_BOOL, reg_cache,
                   "1: send large messages from the user's buffer in place, registering it "
                   "for the message (no copy; see SHOAL_IB_REG_CACHE_MAX; a buffer that cannot "
                   "be registered, such as read-only memory, is copied as with 0). 0: only "
                   "memory shoal owns is registered"),
    SHOAL_IB_FIELD("IB_REG_CACHE_MAX", "64m", SHOAL_CFG_SIZE, reg_cache_max,
                   "with SHOAL_IB_REG_CACHE=1: bytes of user send buffers kept registered per "
                   "peer between messages (0: registered and deregistered per message). A "
                   "kept registration is dropped when the memory behind it is released: "
                   "libc's munmap, mremap, madvise, mmap, brk and shmdt are patched to report "
                   "it (x86-64 glibc; elsewhere, or if patching fails, 0 with a warning). "
                   "Memory released by raw system calls is not seen"),
    SHOAL_IB_FIELD("IB_MAX_INLINE", "128", SHOAL_CFG_UINT, max_inline,
                   "chunks up to this many bytes (header included) are sent inline: copied "
                   "into the work request, neither staged nor registered; a device that "
                   "refuses that much inline data gets queue pairs without it (one warning)"),
    SHOAL_IB_FIELD("IB_OOB_IFNAME", "", SHOAL_CFG_STRING, oob_ifname,
                   "interface for the out-of-band TCP connection that exchanges queue pair "
                   "numbers (NCCL prefix syntax); empty: the first non-loopback interface "
                   "that is up, else lo"),
    SHOAL_IB_FIELD("IB_USE_RDMACM", "0", SHOAL_CFG_BOOL, use_rdmacm,
                   "1: connect every queue pair through librdmacm (the connection manager "
                   "resolves the route from the IP address of the peer's RoCE GID, chooses the "
                   "path MTU, service level and partition key and moves the queue pair "
                   "through its states; SHOAL_IB_MTU, SHOAL_IB_SL and SHOAL_IB_PKEY do not "
                   "apply), after the same authenticated out-of-band handshake, which "
                   "issues the token the rdma_cm request must carry. The same on every rank; "
                   "0: the out-of-band queue pair exchange"),
    SHOAL_IB_FIELD("IB_SOFT_DEVICE", "-1", SHOAL_CFG_INT, soft_device,
                   "1: the device is a software one whose packets this host's CPUs process "
                   "(Soft-RoCE, Soft-iWARP), so where the host's ranks leave no CPU free for "
                   "that work, waiters neither pause-spin nor yield long but sleep until the "
                   "completion; 0: a hardware device (waiters spin); -1: detect (the rxe and "
                   "siw vendor ids, or no bus device in sysfs)"),
    SHOAL_IB_FIELD("IB_SYSFS_ROOT", "/sys", SHOAL_CFG_STRING, sysfs_root,
                   "root of the sysfs tree read for RoCE GID types and the host's RoCE QoS "
                   "configuration (tests)"),
};

const shoal_cfg_table_t shoal_ib_cfg_table = {
    .module = "ib",
    .fields = shoal_ib_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_ib_cfg_fields),
    .dst = &shoal_ib_config,
};
