/* IB verbs transport (InfiniBand and RoCE): one RC queue pair per peer, RDMA write with
 * immediate into a registered receive ring of the peer, credit-based flow control.
 *
 * Layout of the module:
 *   ib_config.c  config table (SHOAL_IB_*)
 *   ib_gid.c     pure: HCA list parsing, GID choice over a sysfs tree, MTU negotiation
 *   ib_logic.c   pure: credits, chunk plan, immediate codec, QP transition table,
 *                registration cache (verbs calls behind callbacks)
 *   ib_ctx.c     device/port/GID choice, PD/CQ/channel, progress, sleeping, ops table
 *   ib_ep.c      connection setup (out-of-band TCP, authenticated) and the data path
 *   ib_lazy.c    connections at first use (SHOAL_CONNECT=lazy): the same exchange, non-blocking,
 *                from the progress path
 *
 * Data path (chosen: eager through the ring, no rendezvous):
 *   Every message goes through the receiver's ring of nslots slots of slot_size bytes. The
 *   sender RDMA-writes-with-immediate chunk k of a message into the next slot; the first chunk
 *   starts with the 32-byte wire header. The immediate carries (kind, first, last, slot, credits
 *   returned). The sender copies each chunk into one of its own registered bounce slots (small
 *   chunks go inline; with SHOAL_IB_REG_CACHE=1 the user's buffer is registered and read in
 *   place instead), the receiver copies each slot into the posted buffer once the header has
 *   been validated,
 *   then returns the slot as a credit (piggybacked on reverse traffic or, past a threshold, in
 *   a zero-byte write with immediate). Large messages are pipelined through the ring in
 *   slot_size chunks. A rendezvous (receiver posts its destination's addr/rkey) would save the
 *   receiver's copy; it is not implemented.
 *
 * Memory and keys (least privilege): every peer has its own protection domain holding its
 * queue pair, its receive ring (the only remote-writable registration, and the only address
 * range and rkey that peer is told) and its send area (bounce slots and staged headers, no
 * remote access). An rkey is valid only on queue pairs of its own protection domain, so a peer
 * that guesses another peer's rkey still cannot write into that peer's ring. Everything is
 * deregistered (and so invalidated) at destroy. Type 2 memory windows bound to the queue pair
 * would give the same guarantee with a single protection domain (and allow revoking a window
 * without tearing down the QP), but not every device supports them; per-peer protection
 * domains and registrations work on every device. */
#ifndef SHOAL_IB_H
#define SHOAL_IB_H

#include "core/tl.h"

#include <stddef.h>
#include <stdint.h>

#define SHOAL_IB_NAME_MAX 64
#define SHOAL_IB_HCA_MAX 32
#define SHOAL_IB_ADDR_MAGIC 0x42494853u /* "SHIB" */
#define SHOAL_IB_ADDR_VERSION 1
#define SHOAL_IB_ADDR_BYTES 64
#define SHOAL_IB_PAIR_BYTES 40
#define SHOAL_IB_SLOTS_MAX 4096         /* 12 bits of the immediate */
#define SHOAL_IB_SLOT_MAX (16u << 20)   /* largest SHOAL_IB_SLOT_SIZE */
/* A ring slot (and a bounce slot) holds SHOAL_IB_SLOT_SIZE payload bytes plus the 32-byte wire
 * header, padded to 64: a message of exactly SHOAL_IB_SLOT_SIZE bytes (the common power of
 * two) is one RDMA write, not a full one and a 32-byte one. */
#define SHOAL_IB_SLOT_ROOM 64u
#define SHOAL_IB_CREDITS_MAX 0xffffu    /* 16 bits of the immediate */

/* ---- config (ib_config.c) --------------------------------------------------------------- */

typedef enum {
    SHOAL_IB_FAMILY_INET = 0,
    SHOAL_IB_FAMILY_INET6,
} shoal_ib_family_t;

typedef struct {
    const char *hca;          /* SHOAL_IB_HCA */
    int gid_index;            /* SHOAL_IB_GID_INDEX, -1 = automatic */
    int family;               /* shoal_ib_family_t, SHOAL_IB_ADDR_FAMILY */
    unsigned mtu;             /* SHOAL_IB_MTU in bytes, 0 = no cap */
    unsigned timeout;         /* SHOAL_IB_TIMEOUT (4.096 us * 2^timeout) */
    unsigned retry_cnt;       /* SHOAL_IB_RETRY_CNT */
    unsigned rnr_retry;       /* SHOAL_IB_RNR_RETRY */
    unsigned tc;              /* SHOAL_IB_TC */
    unsigned sl;              /* SHOAL_IB_SL */
    unsigned pkey_index;      /* SHOAL_IB_PKEY */
    unsigned nslots;          /* SHOAL_IB_RING_SLOTS */
    size_t slot_size;         /* SHOAL_IB_SLOT_SIZE */
    unsigned send_slots;      /* SHOAL_IB_SEND_SLOTS: bounce slots per peer */
    unsigned rtt_us;          /* SHOAL_IB_RTT_US: round trip the sizes cover, 0 = assumed */
    int reg_cache;            /* SHOAL_IB_REG_CACHE: send from registered user buffers */
    size_t reg_cache_max;     /* SHOAL_IB_REG_CACHE_MAX bytes per peer, 0 = per message */
    unsigned max_inline;      /* SHOAL_IB_MAX_INLINE */
    const char *oob_ifname;   /* SHOAL_IB_OOB_IFNAME */
    int use_rdmacm;           /* SHOAL_IB_USE_RDMACM */
    int soft_device;          /* SHOAL_IB_SOFT_DEVICE: -1 detect, 0, 1 */
    const char *sysfs_root;   /* SHOAL_IB_SYSFS_ROOT */
} shoal_ib_config_t;

extern SHOAL_HIDDEN shoal_ib_config_t shoal_ib_config;
extern const shoal_cfg_table_t shoal_ib_cfg_table;

/* ---- HCA list (ib_gid.c): NCCL's NCCL_IB_HCA syntax ------------------------------------- */

typedef struct {
    char dev[SHOAL_IB_NAME_MAX];
    int port;                 /* 0 = any port */
} shoal_ib_hca_item_t;

typedef struct {
    int exclude;              /* "^..." */
    int exact;                /* "=..." (after ^ if both) */
    int n;
    shoal_ib_hca_item_t items[SHOAL_IB_HCA_MAX];
} shoal_ib_hca_spec_t;

/* "mlx5_0:1,mlx5_1", "^mlx5_2", "=mlx5_0", "" (everything). 0, or -1 with a sentence. */
SHOAL_HIDDEN int shoal_ib_hca_parse(const char *spec, shoal_ib_hca_spec_t *out, char *why,
                                    size_t len);
/* 1 if device dev, port port is allowed by the spec (prefix match unless exact). */
SHOAL_HIDDEN int shoal_ib_hca_match(const shoal_ib_hca_spec_t *s, const char *dev, int port);

/* ---- GID choice over sysfs (ib_gid.c) --------------------------------------------------- */

typedef enum {
    SHOAL_IB_GID_IB = 0,      /* "IB/RoCE v1" */
    SHOAL_IB_GID_ROCE_V2,     /* "RoCE v2" */
    SHOAL_IB_GID_UNKNOWN,
} shoal_ib_gid_type_t;

typedef struct {
    int index;
    uint8_t raw[16];
    int type;                 /* shoal_ib_gid_type_t */
    char ndev[32];            /* net device of the GID ("" if unknown) */
} shoal_ib_gid_t;

/* Picks the GID of an Ethernet (RoCE) port from <root>/class/infiniband/<dev>/ports/<port>/
 * {gids,gid_attrs/types,gid_attrs/ndevs}/N: a RoCE v2 GID whose address is IPv4-mapped
 * (family AF_INET) or a global IPv6 one (AF_INET6, link-local only as a last resort); zero
 * GIDs never, nor one above index 255 (a queue pair names its source GID in 8 bits).
 * gid_index >= 0 forces that index. SHOAL_OK, or SHOAL_ERR_TRANSPORT with a sentence in why
 * (GID table missing, no RoCE v2 GID of that family, index empty), SHOAL_ERR_INVALID_ARG for a
 * gid_index other than -1 and 0..255. */
SHOAL_HIDDEN shoal_status_t shoal_ib_gid_select(const char *root, const char *dev, int port,
                                                int family, int gid_index, shoal_ib_gid_t *out,
                                                char *why, size_t len);
/* "fe80:0000:...:0001" -> 16 bytes; 0 or -1. */
SHOAL_HIDDEN int shoal_ib_gid_parse(const char *text, uint8_t raw[16]);
SHOAL_HIDDEN void shoal_ib_gid_str(const uint8_t raw[16], char *buf, size_t len);

/* ---- software devices (ib_gid.c) -------------------------------------------------------- */
/* A device whose packets the kernel makes and takes apart on this host's CPUs (Soft-RoCE
 * rdma_rxe, Soft-iWARP siw): by its vendor id (the drivers' own constants) or, for others,
 * by having no bus device in <root>/class/infiniband/<dev>/device. 1 or 0. */
#define SHOAL_IB_VENDOR_RXE 0xffffffu
#define SHOAL_IB_VENDOR_SIW 0x626d74u
SHOAL_HIDDEN int shoal_ib_soft_device(const char *root, const char *dev, uint32_t vendor_id);

/* ---- MTU (ib_gid.c): verbs enum values 1 (256) .. 5 (4096) ------------------------------ */

SHOAL_HIDDEN int shoal_ib_mtu_bytes(int mtu_enum);         /* 0 if invalid */
/* A port's data rate in Mbit/s from ibv_port_attr's active_speed (1 SDR .. 128 NDR, 256 XDR)
 * and active_width (1 1X, 2 4X, 4 8X, 8 12X, 16 2X): lanes x the lane's data rate after its
 * line code (SDR 2, DDR 4, QDR 8, FDR10 10, FDR 13.64, EDR 25, HDR 50, NDR 100, XDR 200
 * Gbit/s); 0 if either is not a known value. */
SHOAL_HIDDEN uint32_t shoal_ib_rate_mbps(unsigned speed, unsigned width);
SHOAL_HIDDEN int shoal_ib_mtu_enum(unsigned bytes);        /* 0 if not a valid MTU */
/* min(local, remote) capped at cap_bytes (0 = none): the enum, or 0 with a sentence. */
SHOAL_HIDDEN int shoal_ib_mtu_negotiate(int local, int remote, unsigned cap_bytes, char *why,
                                        size_t len);

/* ---- credits and ring (ib_logic.c) ------------------------------------------------------ */

/* Sender's view of the peer's ring. */
typedef struct {
    uint32_t nslots;
    uint32_t avail;           /* slots we may write now */
    uint32_t tail;            /* next slot to write */
} shoal_ib_credit_t;

SHOAL_HIDDEN void shoal_ib_credit_init(shoal_ib_credit_t *c, uint32_t nslots);
/* The next slot (and one credit less), or -1 if none is free. */
SHOAL_HIDDEN int shoal_ib_credit_take(shoal_ib_credit_t *c);
/* n credits come back; -1 (and no change) if that would exceed the ring. */
SHOAL_HIDDEN int shoal_ib_credit_grant(shoal_ib_credit_t *c, uint32_t n);

/* Receiver's view of its own ring. */
typedef struct {
    uint32_t nslots;
    uint32_t head;            /* oldest filled slot */
    uint32_t filled;          /* slots written by the peer, not yet consumed */
    uint32_t owed;            /* consumed slots not yet returned as credits */
} shoal_ib_ring_t;

SHOAL_HIDDEN void shoal_ib_ring_init(shoal_ib_ring_t *r, uint32_t nslots);
/* A write landed in slot; 0 if it is the expected next slot and the ring is not full. */
SHOAL_HIDDEN int shoal_ib_ring_arrive(shoal_ib_ring_t *r, uint32_t slot);
/* Frees the head slot; -1 if nothing is filled. */
SHOAL_HIDDEN int shoal_ib_ring_consume(shoal_ib_ring_t *r);
/* Credits to return now (at most max), removed from owed. */
SHOAL_HIDDEN uint32_t shoal_ib_ring_take_owed(shoal_ib_ring_t *r, uint32_t max);

/* ---- chunks and immediates (ib_logic.c) ------------------------------------------------- */

#define SHOAL_IB_CHUNK_FIRST 1u
#define SHOAL_IB_CHUNK_LAST 2u

/* Chunks of a len-byte payload through slot_size-byte slots (the first carries the header). */
SHOAL_HIDDEN uint64_t shoal_ib_chunk_count(uint64_t len, size_t slot_size);
/* The next chunk after off payload bytes (first: the header is not sent yet): its payload
 * bytes in *n_p, returns FIRST/LAST flags. */
SHOAL_HIDDEN unsigned shoal_ib_chunk_next(uint64_t len, uint64_t off, int first,
                                          size_t slot_size, size_t *n_p);

typedef enum {
    SHOAL_IB_IMM_DATA = 0,    /* a chunk in a slot */
    SHOAL_IB_IMM_CREDIT = 1,  /* zero-byte write: credits only */
} shoal_ib_imm_kind_t;

typedef struct {
    unsigned kind;
    unsigned flags;           /* SHOAL_IB_CHUNK_* */
    uint32_t slot;
    uint32_t credits;
} shoal_ib_imm_t;

/* Host order; the caller converts with htonl/ntohl. -1 if a field does not fit. */
SHOAL_HIDDEN int shoal_ib_imm_encode(const shoal_ib_imm_t *imm, uint32_t *out);
SHOAL_HIDDEN void shoal_ib_imm_decode(uint32_t v, shoal_ib_imm_t *imm);

/* ---- per-peer memory (ib_logic.c) -------------------------------------------------------
 * Two allocations: the receive rings of all peers, and the send areas of all peers, each peer's
 * part starting on its own page. Peer idx's ring is registered on its own (remote write), its
 * send area on its own (local only); user buffers registered in SHOAL_IB_REG_CACHE mode are
 * local only too. */

typedef enum {
    SHOAL_IB_REGION_RING = 0, /* a peer's receive ring: the peer writes it remotely */
    SHOAL_IB_REGION_SEND,     /* a peer's bounce slots and staged headers: gather source */
    SHOAL_IB_REGION_USER,     /* a user send buffer (SHOAL_IB_REG_CACHE=1): gather source */
} shoal_ib_region_kind_t;

typedef struct {
    size_t page;
    uint32_t nslots, slot_size; /* our rings */
    uint32_t nbounce, sq_depth; /* bounce slots (slot_size each) and staged headers per peer */
    int npeers;
    size_t ring_len, ring_stride; /* one peer's ring; page-aligned distance between two */
    size_t send_len, send_stride; /* one peer's send area; page-aligned distance between two */
    size_t hdr_off;               /* staged headers inside a send area (after the bounces) */
    size_t ring_total, send_total;
} shoal_ib_layout_t;

/* SHOAL_OK, or SHOAL_ERR_INVALID_ARG if a size overflows or a count is zero. */
SHOAL_HIDDEN shoal_status_t shoal_ib_layout_init(shoal_ib_layout_t *l, int npeers,
                                                 uint32_t nslots, uint32_t slot_size,
                                                 uint32_t nbounce, uint32_t sq_depth,
                                                 size_t page);

typedef struct {
    size_t off;               /* from the start of its allocation (rings or send areas) */
    size_t len;
    int access;               /* IBV_ACCESS_* to register it with */
} shoal_ib_region_t;

/* The least access flags a region kind needs (IBV_ACCESS_*). */
SHOAL_HIDDEN int shoal_ib_region_access(int kind);
/* Peer idx's region of a kind (RING or SEND). */
SHOAL_HIDDEN void shoal_ib_region_get(const shoal_ib_layout_t *l, int idx, int kind,
                                      shoal_ib_region_t *r);

/* Exchanged per pair over the out-of-band connection (SHOAL_IB_PAIR_BYTES). */
typedef struct {
    uint32_t qpn, psn;
    uint64_t ring_addr;
    uint32_t rkey;
    uint32_t nslots;
    uint32_t slot_size;
} shoal_ib_pair_t;

/* What we tell peer idx: its own ring (inside rings, our ring allocation) and the rkey of that
 * ring's registration, nothing else. */
SHOAL_HIDDEN void shoal_ib_pair_local(const shoal_ib_layout_t *l, const uint8_t *rings, int idx,
                                      uint32_t qpn, uint32_t psn, uint32_t ring_rkey,
                                      shoal_ib_pair_t *p);

/* ---- building a chunk (ib_logic.c) ------------------------------------------------------ */

typedef enum {
    SHOAL_IB_SRC_INLINE = 0,  /* header and payload copied into the work request at post */
    SHOAL_IB_SRC_HDR,         /* an empty message: its staged header alone */
    SHOAL_IB_SRC_BOUNCE,      /* copied now into a bounce slot of the send area */
    SHOAL_IB_SRC_ZCOPY,       /* read in place from the registered user buffer */
} shoal_ib_src_t;

typedef struct {
    uint64_t addr;
    uint32_t length, lkey;
} shoal_ib_sge_t;

/* Where the next chunk's bytes may come from. */
typedef struct {
    size_t slot_size;         /* the peer's */
    unsigned max_inline;
    uint8_t *hdr;             /* this work request's staged header (encoded when first) */
    uint32_t send_lkey;       /* lkey of the send area (staged headers and bounce slots) */
    uint8_t *bounce;          /* a free bounce slot (slot_size bytes), NULL if none is free */
    int zcopy;                /* the buffer is registered (SHOAL_IB_REG_CACHE=1) */
    uint32_t buf_lkey;
} shoal_ib_chunk_src_t;

typedef struct {
    shoal_ib_sge_t sge[2];
    int nsge;
    size_t n;                 /* payload bytes */
    size_t bytes;             /* bytes written into the slot, header included */
    unsigned flags;           /* SHOAL_IB_CHUNK_* */
    int src;                  /* shoal_ib_src_t */
} shoal_ib_chunk_t;

/* The next chunk of the len-byte message in buf after off payload bytes (first: the header is
 * not sent yet): its gather list, staging it into s->bounce when it is too large to go inline
 * and the buffer is not registered. 0, or -1 (nothing staged) when it needs a bounce slot and
 * none is free. */
SHOAL_HIDDEN int shoal_ib_chunk_build(const shoal_ib_chunk_src_t *s, const void *buf,
                                      uint64_t len, uint64_t off, int first,
                                      shoal_ib_chunk_t *c);

/* ---- registration cache (ib_logic.c), used only with SHOAL_IB_REG_CACHE=1 ----------------
 * Keyed by address: when the application frees (munmap, free() of a large block, a heap trim)
 * and gets new memory at the same address, an entry covering it would still pin the old
 * pages and RDMA would send stale bytes (tests/vm/ib_remap shows it on Soft-RoCE). A cache
 * that follows memory events (shoal_ib_regcache_follow, with the hooks of ib_memhook.c
 * installed) invalidates every entry overlapping a released range at its next lookup; one
 * that does not must keep no entry past its message (SHOAL_IB_REG_CACHE_MAX=0). */

/* ---- memory events (ib_memhook.c) ---------------------------------------------------------
 * Hooks patched into libc's munmap, mremap, madvise (the page-dropping advice), mmap
 * (MAP_FIXED), brk (shrinking) and shmdt record each range before it is released, in a global
 * lock-free ring of SHOAL_IB_MEMEV_N events. */
#define SHOAL_IB_MEMEV_N 1024

/* Installs the hooks once per process; 0, or -1 with the reason in *why_p (not x86-64, not
 * glibc, a function too short to patch, mprotect refused). */
SHOAL_HIDDEN int shoal_ib_memhook_install(const char **why_p);
/* Events recorded so far (a sequence number). */
SHOAL_HIDDEN uint64_t shoal_ib_memhook_seq(void);
/* Calls fn for every range released since *seen_p and advances it; 1 (fn not called for the
 * rest) if some were lost: more than SHOAL_IB_MEMEV_N behind, or a writer not done. */
SHOAL_HIDDEN int shoal_ib_memhook_drain(uint64_t *seen_p,
                                        void (*fn)(void *arg, uintptr_t start, uintptr_t end),
                                        void *arg);
/* Records a release by hand (tests; memory freed behind libc's back). */
SHOAL_HIDDEN void shoal_ib_memhook_record(const void *addr, size_t len);

typedef struct {
    /* register [addr, addr + len): handle and lkey, or nonzero on failure */
    int (*reg)(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p);
    void (*dereg)(void *arg, void *handle);
    void *arg;
} shoal_ib_reg_ops_t;

typedef struct {
    uintptr_t start, end;     /* page-aligned [start, end) */
    void *handle;
    uint32_t lkey;
    uint32_t refs;            /* in-flight users */
    uint64_t last_use;
    int doomed;               /* deregister once refs drops to 0 */
} shoal_ib_reg_entry_t;

typedef struct {
    shoal_ib_reg_ops_t ops;
    shoal_ib_reg_entry_t *ents; /* sorted by start */
    int n, cap;
    size_t bytes, max_bytes;  /* registered bytes of cached entries, cap */
    uint64_t clock;
    size_t page;
    uint64_t hits, misses, evictions;
    int follow;               /* invalidates from memory events (shoal_ib_regcache_follow) */
    uint64_t ev_seen;         /* memory events already applied */
    uint64_t flushes;         /* times events were lost and everything was dropped */
} shoal_ib_regcache_t;

SHOAL_HIDDEN shoal_status_t shoal_ib_regcache_init(shoal_ib_regcache_t *rc,
                                                   const shoal_ib_reg_ops_t *ops, int max_ents,
                                                   size_t max_bytes);
/* An entry covering [addr, addr + len), with one more reference: the key (start) of the
 * entry in *key_p and its lkey in *lkey_p. */
SHOAL_HIDDEN shoal_status_t shoal_ib_regcache_get(shoal_ib_regcache_t *rc, const void *addr,
                                                  size_t len, uintptr_t *key_p,
                                                  uint32_t *lkey_p);
/* Drops the reference taken by get (its key and lkey: entries may share a start, and the
 * lkey tells which of them the reference is on). */
SHOAL_HIDDEN void shoal_ib_regcache_put(shoal_ib_regcache_t *rc, uintptr_t key, uint32_t lkey);
/* From now on, every lookup first applies the memory events recorded since (the hooks must
 * be installed, see shoal_ib_memhook_install). */
SHOAL_HIDDEN void shoal_ib_regcache_follow(shoal_ib_regcache_t *rc);
/* Applies the memory events recorded since the last call (get does it itself). */
SHOAL_HIDDEN void shoal_ib_regcache_sync(shoal_ib_regcache_t *rc);
/* Deregisters every entry overlapping [addr, addr + len) (busy ones once released). */
SHOAL_HIDDEN void shoal_ib_regcache_invalidate(shoal_ib_regcache_t *rc, const void *addr,
                                               size_t len);
SHOAL_HIDDEN void shoal_ib_regcache_fini(shoal_ib_regcache_t *rc);

/* ---- QP transitions (ib_logic.c, verbs structs but no verbs calls) ----------------------- */

typedef struct {
    int port;
    int pkey_index;
    int mtu;                  /* negotiated enum */
    uint32_t remote_qpn, remote_psn, local_psn;
    int is_global;            /* RoCE or routed IB: GRH */
    uint8_t remote_gid[16];
    int sgid_index;
    uint16_t remote_lid;
    unsigned timeout, retry_cnt, rnr_retry, tc, sl;
    int max_rd_atomic;
} shoal_ib_qp_plan_t;

struct ibv_qp_attr;
/* Step 0: RESET->INIT, 1: INIT->RTR, 2: RTR->RTS. Fills attr, returns the attribute mask
 * (IBV_QP_*), or -1 for an unknown step or a pkey_index outside 0..65535. */
SHOAL_HIDDEN int shoal_ib_qp_step(int step, const shoal_ib_qp_plan_t *p, struct ibv_qp_attr *a);
SHOAL_HIDDEN const char *shoal_ib_qp_step_name(int step);
/* 1 if a completion's error status (enum ibv_wc_status) is of this side's own making (its
 * queue pair, registrations or device: the peer did nothing wrong), 0 if the peer or the path
 * to it caused it or it cannot tell (a flush). send: a send completion; on a receive, a local
 * access or length error is what the peer's write did to our ring. */
SHOAL_HIDDEN int shoal_ib_wc_local(int status, int send);
/* The communicator's QoS on its queue pairs: traffic class and service level (qos_tc / qos_sl
 * from the class, -1: SHOAL_IB_TC / SHOAL_IB_SL, cfg_tc / cfg_sl) and the rate limit in kbps
 * for ibv_modify_qp_rate_limit (rate_Bps bytes/s per peer, 0: none; at least 1 kbps). */
typedef struct {
    unsigned tc, sl;
    uint32_t rate_kbps;
} shoal_ib_qos_t;
SHOAL_HIDDEN void shoal_ib_qos_pick(unsigned cfg_tc, unsigned cfg_sl, int qos_tc, int qos_sl,
                                    uint64_t rate_Bps, shoal_ib_qos_t *out);
/* SHOAL_IB_USE_RDMACM=1: the timeout in ms of one resolution step of a connect (address, then
 * route) with deadline_ns ahead (UINT64_MAX: none, SHOAL_TIMEOUT_MS=inf): what is left of it,
 * 1..10000. */
SHOAL_HIDDEN int shoal_ib_cm_resolve_ms(uint64_t deadline_ns);
/* A connect's RDMA_CM_EVENT_REJECTED with status (the IBTA reason of the CM's REJ): SHOAL_ERR_AUTH
 * for the peer's own reject (consumer defined: our request's rank or token was not the one it
 * issued), SHOAL_ERR_PEER_FAILED for no listener on the port (invalid service ID: the peer's
 * process is gone, or its communicator failed and closed it), else SHOAL_ERR_TRANSPORT. */
#define SHOAL_IB_CM_REJ_NO_LISTENER 8  /* IB_CM_REJ_INVALID_SERVICE_ID */
#define SHOAL_IB_CM_REJ_CONSUMER 28    /* IB_CM_REJ_CONSUMER_DEFINED: rdma_reject() */
SHOAL_HIDDEN shoal_status_t shoal_ib_cm_rejected(int status);

/* ---- the host's RoCE QoS configuration (ib_hostqos.c) ------------------------------------ */
/* On RoCE the NIC, not the queue pair, decides whether a packet is lossless: it maps the packet
 * to a priority (by its DSCP under trust dscp, by its VLAN PCP = the service level under trust
 * pcp) and only priorities with PFC on are lossless. A class whose traffic class lands on a
 * priority without PFC runs lossy (drops, go-back-N retransmissions): worth a warning at init.
 * Sources, first that answers: the MLNX_OFED sysfs files <root>/class/net/<ndev>/qos/{trust,
 * dscp2prio,pfc} (mlnx_qos's formats), then DCB netlink (RTM_GETDCB, what `dcb app|pfc show`
 * reads: trust dscp is an app table with DSCP entries, as mlx5 does it); and MLNX_OFED's
 * device-wide override <root>/class/infiniband/<dev>/tc/<port>/traffic_class. */
#define SHOAL_IB_NPRIO 8

typedef enum {
    SHOAL_IB_TRUST_UNKNOWN = 0,
    SHOAL_IB_TRUST_PCP,
    SHOAL_IB_TRUST_DSCP,
} shoal_ib_trust_t;

typedef struct {
    int trust;                /* shoal_ib_trust_t */
    int8_t dscp2prio[64];     /* priority of each DSCP, -1: not known */
    int pfc_known;
    uint8_t pfc_en;           /* bit p set: PFC on for priority p (lossless) */
    int forced_tc;            /* device-wide RoCE traffic class overriding the QPs', -1: none */
    char source[160];         /* where it was read ("" if nowhere) */
} shoal_ib_hostqos_t;

/* What a traffic class gets on this host. */
typedef struct {
    int tc;                   /* the traffic class the NIC sends (forced_tc if set) */
    int dscp;                 /* tc >> 2 */
    int prio;                 /* priority 0..7, -1: not known */
    int lossless;             /* 1 PFC on, 0 lossy, -1 not known */
    char why[400];            /* one sentence: how prio and lossless were found */
} shoal_ib_qos_verdict_t;

/* Parsers of one file's text (never fail hard: garbage reads as "not known").
 * trust: "dscp", "pcp" (also inside mlnx_qos's "Priority trust state: dscp").
 * dscp2prio: mlnx_qos lines "prio:3 dscp:31,30,...," or "dscp:prio" pairs ("26:3", as `dcb app
 *   show` prints them); fills map (entries not named stay as they are), returns how many were
 *   read, -1 on a malformed entry (map unchanged).
 * pfc: mlnx_qos's "enabled 0 0 0 1 0 0 0 0" line, "prio:on|off" pairs (`dcb pfc show`), or
 *   eight 0/1 separated by spaces or commas; 0 and *en_p, or -1.
 * tclass: "Global tclass=106" (MLNX_OFED) or "106"; the class, or -1 (empty, garbage). */
SHOAL_HIDDEN int shoal_ib_hostqos_parse_trust(const char *text);
SHOAL_HIDDEN int shoal_ib_hostqos_parse_dscp2prio(const char *text, int8_t map[64]);
SHOAL_HIDDEN int shoal_ib_hostqos_parse_pfc(const char *text, uint8_t *en_p);
SHOAL_HIDDEN int shoal_ib_hostqos_parse_tclass(const char *text);
/* Reads the sysfs sources under root ("" or NULL: /sys) for net device ndev ("" : skipped) and
 * RDMA device dev port port into *hq (reset first); 1 if the net device's trust, map or PFC
 * was found, else 0 (the forced class may still be set). */
SHOAL_HIDDEN int shoal_ib_hostqos_read_sysfs(const char *root, const char *ndev,
                                             const char *dev, int port,
                                             shoal_ib_hostqos_t *hq);
/* Decodes a DCB netlink reply to DCB_CMD_IEEE_GET (one message, as received) into *hq: PFC
 * bits, DSCP app entries (trust dscp iff there is one, else pcp). 1 decoded, 0 an error reply
 * (errno_p set: EOPNOTSUPP for a device without DCB), -1 malformed. */
SHOAL_HIDDEN int shoal_ib_hostqos_parse_dcbnl(const void *buf, size_t len,
                                              shoal_ib_hostqos_t *hq, int *errno_p);
/* Asks the kernel (DCB netlink, 1 s deadline) for ndev's IEEE DCB state; 1 read, 0 not
 * available (why says why). */
SHOAL_HIDDEN int shoal_ib_hostqos_read_dcbnl(const char *ndev, shoal_ib_hostqos_t *hq,
                                             char *why, size_t len);
/* Both sources in order (sysfs, then netlink) into *hq; 1 if anything is known (why: what
 * netlink said when nothing is). */
SHOAL_HIDDEN int shoal_ib_hostqos_read(const char *root, const char *dev, int port,
                                       const char *ndev, shoal_ib_hostqos_t *hq, char *why,
                                       size_t len);
/* Where traffic class tc (and service level sl, which is the PCP under trust pcp) lands. */
SHOAL_HIDDEN void shoal_ib_hostqos_judge(const shoal_ib_hostqos_t *hq, unsigned tc, unsigned sl,
                                         shoal_ib_qos_verdict_t *v);
/* At init of a RoCE port: reads the host's configuration (sysfs, then netlink) and warns once
 * per traffic class when the class would run lossy; debug (trace) only when nothing is
 * readable. Returns the verdict's lossless (-1, 0, 1) for callers and shoal_info. */
SHOAL_HIDDEN int shoal_ib_hostqos_check(const char *root, const char *dev, int port,
                                        const char *ndev, const char *class_name, unsigned tc,
                                        unsigned sl, shoal_ib_qos_verdict_t *v_p);

#endif /* SHOAL_IB_H */
