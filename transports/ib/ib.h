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
 *
 * Data path (chosen: eager through the ring, no rendezvous):
 *   Every message goes through the receiver's ring of nslots slots of slot_size bytes. The
 *   sender RDMA-writes-with-immediate chunk k of a message into the next slot; the first chunk
 *   starts with the 32-byte wire header. The immediate carries (kind, first, last, slot, credits
 *   returned). The sender reads its payload in place (registration cache; small chunks inline),
 *   the receiver copies each slot into the posted buffer once the header has been validated,
 *   then returns the slot as a credit (piggybacked on reverse traffic or, past a threshold, in
 *   a zero-byte write with immediate). Large messages are pipelined through the ring in
 *   slot_size chunks. A rendezvous (receiver posts its destination's addr/rkey) would save the
 *   receiver's copy; it is not implemented. */
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
    size_t reg_cache_max;     /* SHOAL_IB_REG_CACHE_MAX bytes, 0 = register per message */
    unsigned max_inline;      /* SHOAL_IB_MAX_INLINE */
    const char *oob_ifname;   /* SHOAL_IB_OOB_IFNAME */
    int use_rdmacm;           /* SHOAL_IB_USE_RDMACM */
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
 * GIDs never. gid_index >= 0 forces that index. SHOAL_OK, or SHOAL_ERR_TRANSPORT with a
 * sentence in why (GID table missing, no RoCE v2 GID of that family, index empty). */
SHOAL_HIDDEN shoal_status_t shoal_ib_gid_select(const char *root, const char *dev, int port,
                                                int family, int gid_index, shoal_ib_gid_t *out,
                                                char *why, size_t len);
/* "fe80:0000:...:0001" -> 16 bytes; 0 or -1. */
SHOAL_HIDDEN int shoal_ib_gid_parse(const char *text, uint8_t raw[16]);
SHOAL_HIDDEN void shoal_ib_gid_str(const uint8_t raw[16], char *buf, size_t len);

/* ---- MTU (ib_gid.c): verbs enum values 1 (256) .. 5 (4096) ------------------------------ */

SHOAL_HIDDEN int shoal_ib_mtu_bytes(int mtu_enum);         /* 0 if invalid */
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

/* ---- registration cache (ib_logic.c) ---------------------------------------------------- */

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
} shoal_ib_regcache_t;

SHOAL_HIDDEN shoal_status_t shoal_ib_regcache_init(shoal_ib_regcache_t *rc,
                                                   const shoal_ib_reg_ops_t *ops, int max_ents,
                                                   size_t max_bytes);
/* An entry covering [addr, addr + len), with one more reference: the key (start) of the
 * entry in *key_p and its lkey in *lkey_p. */
SHOAL_HIDDEN shoal_status_t shoal_ib_regcache_get(shoal_ib_regcache_t *rc, const void *addr,
                                                  size_t len, uintptr_t *key_p,
                                                  uint32_t *lkey_p);
/* Drops the reference taken by get (key from get, addr inside the entry). */
SHOAL_HIDDEN void shoal_ib_regcache_put(shoal_ib_regcache_t *rc, uintptr_t key,
                                        const void *addr);
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
 * (IBV_QP_*), or -1 for an unknown step. */
SHOAL_HIDDEN int shoal_ib_qp_step(int step, const shoal_ib_qp_plan_t *p, struct ibv_qp_attr *a);
SHOAL_HIDDEN const char *shoal_ib_qp_step_name(int step);

#endif /* SHOAL_IB_H */
