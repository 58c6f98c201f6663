/* Derivation of the settings from a machine profile, explicit overrides, printing. */
#include "tune/tune.h"

#include "topo/topo.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/*
 * Reference machine: the one the old constants were fitted on (perf/select_check.sh and the
 * SHOAL_SHM_WINDOW sweep: AMD EPYC VM, 2 vCPUs, 1 MiB L2 per core, 32 MiB L3), as
 * shoal_tune_measure reports it there (medians of runs on the loaded VM: in L2 51-58 GB/s,
 * from memory 11.4-12.2, reduce 11.7-13.1). The limits that trade a synchronisation (a
 * flag's cache-line transfer, a context switch) against bytes moved scale with the copy rate:
 * twice the rate moves twice the bytes in the time of one flag. The cost model's memory
 * rates were fitted there too, and scale with the measured rates.
 */
#define SHOAL_TUNE_REF_COPY_CACHE_MBS 55000u
#define SHOAL_TUNE_REF_COPY_MEM_MBS 12000u
#define SHOAL_TUNE_REF_REDUCE_MEM_MBS 12500u

/* Defaults: the constants as they were. */
#define SHOAL_TUNE_DFLT_CHUNK ((uint64_t)512 << 10)
#define SHOAL_TUNE_DFLT_WINDOW ((uint64_t)512 << 10)
#define SHOAL_TUNE_DFLT_ONESHOT_OWN 2048u
#define SHOAL_TUNE_DFLT_ONESHOT_SHARED 16384u
#define SHOAL_TUNE_DFLT_LL 64u
#define SHOAL_TUNE_DFLT_COPY_MBS 8000u
#define SHOAL_TUNE_DFLT_REDUCE_MBS 4000u
#define SHOAL_TUNE_DFLT_SHM_SLOT ((uint64_t)64 << 10)
#define SHOAL_TUNE_DFLT_SHM_NSLOTS 8u
#define SHOAL_TUNE_DFLT_TCP_SPLIT ((uint64_t)256 << 10)
#define SHOAL_TUNE_DFLT_UCX_INLINE 8192u

/*
 * Transport sizes. tl_perf on the CI-kind machine (2 MiB L2, 2 vCPUs shared, load 6 to 21),
 * alternating runs: shm rings of 32k..512k slots x 4..16 slots all streamed 17-18 GB/s up to
 * 1 MiB and 13-14 GB/s at 4-16 MiB in the quietest round, 16k x 8 about 10 GB/s below 1 MiB;
 * the tcp split at 64k..never was within the noise. The rules give the old constants there:
 * - shm slot: one slot's copy in L2 takes about 1 us, ten times a flag's handoff between
 *   cores (~0.1 us), so the handoffs cost ~10% at most: slot = copy rate in L2 x 1 us.
 * - shm ring (slot x nslots): covers a peer that reacts late (a wakeup after a futex sleep,
 *   tens of us): copy rate from memory x 50 us, and stays in cache: at most half the L2.
 * - tcp split: a message up to twice a socket's initial receive buffer is in flight on one
 *   socket within about a window's round; striping pays only beyond it.
 * - ucx inline: the payload is copied into the header's message rather than sent as a second
 *   one; the bytes a copy moves in the time of a message scale with the copy rate in L2.
 * - ucx single copy (process_vm_readv) between ranks of a host, against UCX's shared-memory
 *   FIFO, which copies twice: the kernel's copy pins every page and ran at 10-18 GB/s on the
 *   CI-kind machine (2 MiB L2) where memcpy ran at 28-35 (perf/results/ucx-cma-2026-12-03.txt),
 *   so while a message's copies stay in the L2 one kernel copy costs about what two
 *   memcpys do, and the single copy adds a system call and the FIN message; it saves a
 *   pass over memory once the message's buffers leave the cache. Measured there, 2 ranks,
 *   alternating launches: UCX's path was as fast or faster up to 64 KiB (in place 23-24
 *   against 30-35 us at 64 KiB), the two tied at 128 KiB, and the single copy was 1.5x
 *   faster out of place from 256 KiB: the threshold is L2 / 16.
 */
#define SHOAL_TUNE_SHM_SLOT_NS 1000u
#define SHOAL_TUNE_SHM_RING_US 50u

/*
 * ib sizes, from the port the transport opened (shoal_tl_link_t). The old constants (64k
 * slots, 64 of them per peer, 16 bounce slots) were sized for a 100 Gbit/s port; the rules
 * give 64k slots there too:
 * - slot: every chunk costs a work request, a completion and the receiver's copy-out
 *   bookkeeping (about a microsecond of CPU at each end): a slot carries 5 us of the link's
 *   wire time, so that cost stays a fraction of it; and at least 16 MTUs, so that a chunk is
 *   many packets (the NIC's per-message overhead) even on slow links. Within 16k..1m. On a
 *   software device the kernel handles every work request and completion, tens of us each:
 *   50 us there (Soft-RoCE in the VM, 2 ranks, tl_perf over ib at 4 MiB: 16k slots moved
 *   3.3 MB/s, 64k slots 12.1).
 * - ring (credits): a slot comes back to the sender one round trip after its write plus the
 *   receiver's reaction (a wakeup after a sleep, 50 us as for shm), and credits return in
 *   batches of a quarter ring, so the ring holds twice rate x (RTT + reaction): the sender
 *   never stops for a credit on a link it could fill. Within 4..4096 slots and 4 MiB per peer
 *   (the old ring's bytes: a ring per peer is registered memory, many peers multiply it).
 * - bounce slots: one is free again when its write is acknowledged (one round trip, no
 *   receiver involved): twice rate x RTT, within 4..ring slots.
 * The round trip: SHOAL_IB_RTT_US, else 10 us on a hardware port (a few us of wire and
 *   switches within a rack, doubled for the completion handling) and 100 us on a software
 *   one (Soft-RoCE: the kernel makes and parses every packet at both ends).
 */
#define SHOAL_TUNE_IB_CHUNK_NS 5000u
#define SHOAL_TUNE_IB_CHUNK_SOFT_NS 50000u
#define SHOAL_TUNE_IB_MIN_MTUS 16u
#define SHOAL_TUNE_IB_REACT_US 50u
#define SHOAL_TUNE_IB_RTT_HW_US 10u
#define SHOAL_TUNE_IB_RTT_SOFT_US 100u
#define SHOAL_TUNE_IB_RING_MAX ((uint64_t)4 << 20)
#define SHOAL_TUNE_DFLT_IB_SLOT ((uint64_t)64 << 10)
#define SHOAL_TUNE_DFLT_IB_NSLOTS 64u
#define SHOAL_TUNE_DFLT_IB_SEND_SLOTS 16u

const char *const shoal_tune_knob_names[SHOAL_TUNE_NKNOBS] = {
    [SHOAL_TUNE_CHUNK] = "chunk_size",
    [SHOAL_TUNE_SHM_WINDOW] = "shm_window",
    [SHOAL_TUNE_SHM_ONESHOT_OWN] = "shm_oneshot_max",
    [SHOAL_TUNE_SHM_ONESHOT_SHARED] = "shm_oneshot_max_shared",
    [SHOAL_TUNE_SHM_LL_MAX] = "shm_ll_max",
    [SHOAL_TUNE_COPY_MBS] = "model_copy_rate",
    [SHOAL_TUNE_REDUCE_MBS] = "model_reduce_rate",
    [SHOAL_TUNE_SHM_SLOT_SIZE] = "shm_slot_size",
    [SHOAL_TUNE_SHM_NSLOTS] = "shm_nslots",
    [SHOAL_TUNE_TCP_MIN_SPLIT] = "tcp_min_split",
    [SHOAL_TUNE_UCX_INLINE_MAX] = "ucx_inline_max",
    [SHOAL_TUNE_UCX_CMA_MIN] = "ucx_cma_min",
    [SHOAL_TUNE_IB_SLOT_SIZE] = "ib_slot_size",
    [SHOAL_TUNE_IB_NSLOTS] = "ib_ring_slots",
    [SHOAL_TUNE_IB_SEND_SLOTS] = "ib_send_slots",
};

const char *const shoal_tune_knob_vars[SHOAL_TUNE_NKNOBS] = {
    [SHOAL_TUNE_CHUNK] = "CHUNK_SIZE",
    [SHOAL_TUNE_SHM_WINDOW] = "SHM_WINDOW",
    [SHOAL_TUNE_SHM_ONESHOT_OWN] = "SHM_ONESHOT_MAX",
    [SHOAL_TUNE_SHM_ONESHOT_SHARED] = "SHM_ONESHOT_MAX",
    [SHOAL_TUNE_SHM_LL_MAX] = "SHM_LL_MAX",
    [SHOAL_TUNE_COPY_MBS] = NULL,
    [SHOAL_TUNE_REDUCE_MBS] = NULL,
    [SHOAL_TUNE_SHM_SLOT_SIZE] = "SHM_SLOT_SIZE",
    [SHOAL_TUNE_SHM_NSLOTS] = "SHM_NSLOTS",
    [SHOAL_TUNE_TCP_MIN_SPLIT] = "TCP_MIN_SPLIT",
    [SHOAL_TUNE_UCX_INLINE_MAX] = "UCX_INLINE_MAX",
    [SHOAL_TUNE_UCX_CMA_MIN] = "UCX_CMA_MIN",
    [SHOAL_TUNE_IB_SLOT_SIZE] = "IB_SLOT_SIZE",
    [SHOAL_TUNE_IB_NSLOTS] = "IB_RING_SLOTS",
    [SHOAL_TUNE_IB_SEND_SLOTS] = "IB_SEND_SLOTS",
};

const char *shoal_tune_src_name(int src)
{
    static const char *const names[] = {"default", "derived", "env", "file"};
    return src >= 0 && src < (int)SHOAL_ARRAY_SIZE(names) ? names[src] : "?";
}

static int shoal_tune_is_rate(int k)
{
    return k == SHOAL_TUNE_COPY_MBS || k == SHOAL_TUNE_REDUCE_MBS;
}

/* A count, not bytes (printed without k/m). */
static int shoal_tune_is_count(int k)
{
    return k == SHOAL_TUNE_SHM_NSLOTS || k == SHOAL_TUNE_IB_NSLOTS ||
           k == SHOAL_TUNE_IB_SEND_SLOTS;
}

/* Largest power of two <= v (v >= 1). */
static uint64_t shoal_tune_pow2_floor(uint64_t v)
{
    uint64_t p = 1;
    while (p <= v / 2) {
        p *= 2;
    }
    return p;
}

/* Power of two nearest to v on a log scale (v > 0). */
static uint64_t shoal_tune_pow2_near(double v)
{
    uint64_t p = 1;
    while (p < ((uint64_t)1 << 40) && (double)p * 1.4142135623730951 <= v) {
        p *= 2;
    }
    return p;
}

/* Smallest power of two >= v. */
static uint64_t shoal_tune_pow2_ceil(double v)
{
    uint64_t p = 1;
    while (p < ((uint64_t)1 << 40) && (double)p < v) {
        p *= 2;
    }
    return p;
}

static uint64_t shoal_tune_clamp(uint64_t v, uint64_t lo, uint64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static void shoal_tune_set(shoal_tune_t *t, int k, uint64_t v, int src, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void shoal_tune_set(shoal_tune_t *t, int k, uint64_t v, int src, const char *fmt, ...)
{
    va_list ap;
    t->value[k] = SHOAL_MIN(v, (uint64_t)1 << 40);
    t->src[k] = (uint8_t)src;
    va_start(ap, fmt);
    vsnprintf(t->why[k], sizeof(t->why[k]), fmt, ap);
    va_end(ap);
}

static void shoal_tune_derive_l2(const shoal_tune_machine_t *m, shoal_tune_t *t)
{
    uint64_t l2 = (uint64_t)m->l2_kb << 10;

    if (m->l2_kb == 0) {
        shoal_tune_set(t, SHOAL_TUNE_CHUNK, SHOAL_TUNE_DFLT_CHUNK, SHOAL_TUNE_SRC_DEFAULT,
                       "L2 size unknown");
        shoal_tune_set(t, SHOAL_TUNE_SHM_WINDOW, SHOAL_TUNE_DFLT_WINDOW, SHOAL_TUNE_SRC_DEFAULT,
                       "L2 size unknown");
        return;
    }
    /* Half the L2: a window in place of 1 MiB halved busbw on 1 MiB L2 cores, half of it
     * was the best of the sweep; the ring reduces a chunk against scratch the same way. */
    shoal_tune_set(t, SHOAL_TUNE_SHM_WINDOW,
                   shoal_tune_clamp(shoal_tune_pow2_floor(l2 / 2), 64 << 10, 4 << 20),
                   SHOAL_TUNE_SRC_DERIVED, "L2 %u KiB / 2, within 64k..4m", m->l2_kb);
    shoal_tune_set(t, SHOAL_TUNE_CHUNK,
                   shoal_tune_clamp(shoal_tune_pow2_floor(l2 / 2), 128 << 10, 1 << 20),
                   SHOAL_TUNE_SRC_DERIVED, "L2 %u KiB / 2, within 128k..1m", m->l2_kb);
}

static void shoal_tune_derive_copy(const shoal_tune_machine_t *m, shoal_tune_t *t)
{
    static const struct {
        int knob;
        uint64_t ref, lo, hi;
    } lim[] = {
        {SHOAL_TUNE_SHM_ONESHOT_OWN, SHOAL_TUNE_DFLT_ONESHOT_OWN, 1024, 32768},
        {SHOAL_TUNE_SHM_ONESHOT_SHARED, SHOAL_TUNE_DFLT_ONESHOT_SHARED, 4096, 131072},
        {SHOAL_TUNE_SHM_LL_MAX, SHOAL_TUNE_DFLT_LL, 64, 4096},
    };
    double r = (double)m->copy_cache_mbs / SHOAL_TUNE_REF_COPY_CACHE_MBS;

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(lim); i++) {
        if (m->copy_cache_mbs == 0) {
            shoal_tune_set(t, lim[i].knob, lim[i].ref, SHOAL_TUNE_SRC_DEFAULT,
                           "copy rate unknown");
        } else {
            shoal_tune_set(t, lim[i].knob,
                           shoal_tune_clamp(shoal_tune_pow2_near((double)lim[i].ref * r),
                                            lim[i].lo, lim[i].hi),
                           SHOAL_TUNE_SRC_DERIVED, "%llu x copy in L2 %.1f / %.1f GB/s",
                           (unsigned long long)lim[i].ref, m->copy_cache_mbs / 1e3,
                           SHOAL_TUNE_REF_COPY_CACHE_MBS / 1e3);
        }
    }
}

/* The shm ring's slot count, if DERIVED: its ring divided by the slot size in force. An
 * explicit slot size (SHOAL_SHM_SLOT_SIZE, a 'set' line) was applied after the count was
 * made for the derived slot: 1m slots x 8, 8 MiB a direction where the ring is L2 / 2. */
static void shoal_tune_shm_count(shoal_tune_t *t)
{
    const shoal_tune_machine_t *m = &t->machine;
    uint64_t slot = SHOAL_MAX(t->value[SHOAL_TUNE_SHM_SLOT_SIZE], (uint64_t)1), ring, cap;

    if (t->src[SHOAL_TUNE_SHM_NSLOTS] != SHOAL_TUNE_SRC_DERIVED || m->copy_mem_mbs == 0) {
        return;
    }
    ring = shoal_tune_pow2_near((double)m->copy_mem_mbs * SHOAL_TUNE_SHM_RING_US);
    cap = m->l2_kb > 0 ? shoal_tune_pow2_floor(((uint64_t)m->l2_kb << 10) / 2) : ring;
    ring = SHOAL_MIN(ring, cap);
    shoal_tune_set(t, SHOAL_TUNE_SHM_NSLOTS, shoal_tune_clamp(ring / slot, 2, 64),
                   SHOAL_TUNE_SRC_DERIVED, "ring copy %.1f GB/s x %u us%s / slot, within 2..64",
                   m->copy_mem_mbs / 1e3, SHOAL_TUNE_SHM_RING_US,
                   m->l2_kb > 0 ? " <= L2 / 2" : "");
}

static void shoal_tune_derive_shm_ring(const shoal_tune_machine_t *m, shoal_tune_t *t)
{
    uint64_t slot;

    if (m->copy_cache_mbs == 0 || m->copy_mem_mbs == 0) {
        shoal_tune_set(t, SHOAL_TUNE_SHM_SLOT_SIZE, SHOAL_TUNE_DFLT_SHM_SLOT,
                       SHOAL_TUNE_SRC_DEFAULT, "copy rates unknown");
        shoal_tune_set(t, SHOAL_TUNE_SHM_NSLOTS, SHOAL_TUNE_DFLT_SHM_NSLOTS,
                       SHOAL_TUNE_SRC_DEFAULT, "copy rates unknown");
        return;
    }
    /* MB/s x ns / 1000 = bytes */
    slot = shoal_tune_clamp(shoal_tune_pow2_near((double)m->copy_cache_mbs *
                                                 SHOAL_TUNE_SHM_SLOT_NS / 1e3),
                            16 << 10, 1 << 20);
    shoal_tune_set(t, SHOAL_TUNE_SHM_SLOT_SIZE, slot, SHOAL_TUNE_SRC_DERIVED,
                   "copy in L2 %.1f GB/s x %u ns, within 16k..1m", m->copy_cache_mbs / 1e3,
                   SHOAL_TUNE_SHM_SLOT_NS);
    t->src[SHOAL_TUNE_SHM_NSLOTS] = SHOAL_TUNE_SRC_DERIVED;
    shoal_tune_shm_count(t);
}

static void shoal_tune_derive_net(const shoal_tune_machine_t *m, shoal_tune_t *t)
{
    if (m->tcp_rbuf_kb == 0) {
        shoal_tune_set(t, SHOAL_TUNE_TCP_MIN_SPLIT, SHOAL_TUNE_DFLT_TCP_SPLIT,
                       SHOAL_TUNE_SRC_DEFAULT, "tcp receive buffer unknown");
    } else {
        shoal_tune_set(t, SHOAL_TUNE_TCP_MIN_SPLIT,
                       shoal_tune_clamp(shoal_tune_pow2_near(2.0 * m->tcp_rbuf_kb * 1024),
                                        64 << 10, 4 << 20),
                       SHOAL_TUNE_SRC_DERIVED, "2 x tcp receive buffer %u KiB, within 64k..4m",
                       m->tcp_rbuf_kb);
    }
    if (m->copy_cache_mbs == 0) {
        shoal_tune_set(t, SHOAL_TUNE_UCX_INLINE_MAX, SHOAL_TUNE_DFLT_UCX_INLINE,
                       SHOAL_TUNE_SRC_DEFAULT, "copy rate unknown");
    } else {
        shoal_tune_set(t, SHOAL_TUNE_UCX_INLINE_MAX,
                       shoal_tune_clamp(shoal_tune_pow2_near((double)SHOAL_TUNE_DFLT_UCX_INLINE *
                                                             m->copy_cache_mbs /
                                                             SHOAL_TUNE_REF_COPY_CACHE_MBS),
                                        2048, 65536),
                       SHOAL_TUNE_SRC_DERIVED, "%u x copy in L2 %.1f / %.1f GB/s, within 2k..64k",
                       SHOAL_TUNE_DFLT_UCX_INLINE, m->copy_cache_mbs / 1e3,
                       SHOAL_TUNE_REF_COPY_CACHE_MBS / 1e3);
    }
    if (m->l2_kb == 0) {
        shoal_tune_set(t, SHOAL_TUNE_UCX_CMA_MIN, 0, SHOAL_TUNE_SRC_DEFAULT,
                       "L2 size unknown: from the inline limit");
    } else {
        shoal_tune_set(t, SHOAL_TUNE_UCX_CMA_MIN,
                       shoal_tune_clamp(shoal_tune_pow2_floor(((uint64_t)m->l2_kb << 10) / 16),
                                        16 << 10, 1 << 20),
                       SHOAL_TUNE_SRC_DERIVED, "L2 %u KiB / 16, within 16k..1m", m->l2_kb);
    }
}

static void shoal_tune_link_defaults(shoal_tune_t *t, const char *why)
{
    shoal_tune_set(t, SHOAL_TUNE_IB_SLOT_SIZE, SHOAL_TUNE_DFLT_IB_SLOT, SHOAL_TUNE_SRC_DEFAULT,
                   "%s", why);
    shoal_tune_set(t, SHOAL_TUNE_IB_NSLOTS, SHOAL_TUNE_DFLT_IB_NSLOTS, SHOAL_TUNE_SRC_DEFAULT,
                   "%s", why);
    shoal_tune_set(t, SHOAL_TUNE_IB_SEND_SLOTS, SHOAL_TUNE_DFLT_IB_SEND_SLOTS,
                   SHOAL_TUNE_SRC_DEFAULT, "%s", why);
}

/* The ib ring and bounce slot counts that are DERIVED, from t->link and the slot size and
 * ring in force: explicit settings applied after the derivation (a slot size, a ring) left
 * them sized for the port's own slot (SHOAL_IB_SLOT_SIZE=1m: 64 times the ring's 4 MiB) and
 * the bounce slots over an explicit ring (doc: 4..SHOAL_IB_RING_SLOTS). */
static void shoal_tune_link_counts(shoal_tune_t *t)
{
    const shoal_tl_link_t *l = &t->link;
    double rate = (double)l->rate_mbps * 125000.0; /* bytes/s */
    double rtt_us = l->rtt_us != 0 ? l->rtt_us
                    : l->soft       ? SHOAL_TUNE_IB_RTT_SOFT_US
                                    : SHOAL_TUNE_IB_RTT_HW_US;
    uint64_t slot = SHOAL_MAX(t->value[SHOAL_TUNE_IB_SLOT_SIZE], (uint64_t)1);
    uint64_t cap = SHOAL_MAX(SHOAL_TUNE_IB_RING_MAX / slot, 4);
    double bytes;

    if (l->rate_mbps == 0) {
        return;
    }
    if (t->src[SHOAL_TUNE_IB_NSLOTS] == SHOAL_TUNE_SRC_DERIVED) {
        bytes = 2.0 * rate * (rtt_us + SHOAL_TUNE_IB_REACT_US) / 1e6;
        shoal_tune_set(t, SHOAL_TUNE_IB_NSLOTS,
                       shoal_tune_clamp(shoal_tune_pow2_ceil(bytes / (double)slot), 4,
                                        SHOAL_MIN(cap, 4096)),
                       SHOAL_TUNE_SRC_DERIVED,
                       "2 x %.1f Gb/s x (rtt %.0f%s + %u us) / slot, within 4..4096, <= 4m",
                       l->rate_mbps / 1e3, rtt_us,
                       l->rtt_us != 0 ? " us given" : " us assumed", SHOAL_TUNE_IB_REACT_US);
    }
    if (t->src[SHOAL_TUNE_IB_SEND_SLOTS] == SHOAL_TUNE_SRC_DERIVED) {
        bytes = 2.0 * rate * rtt_us / 1e6;
        shoal_tune_set(t, SHOAL_TUNE_IB_SEND_SLOTS,
                       shoal_tune_clamp(shoal_tune_pow2_ceil(bytes / (double)slot), 4,
                                        SHOAL_MAX(t->value[SHOAL_TUNE_IB_NSLOTS], 4)),
                       SHOAL_TUNE_SRC_DERIVED,
                       "2 x %.1f Gb/s x rtt %.0f us / slot, within 4..ring slots",
                       l->rate_mbps / 1e3, rtt_us);
    }
}

void shoal_tune_derive_link(const shoal_tl_link_t *l, shoal_tune_t *t)
{
    double rate;
    uint64_t slot, floor_b;
    unsigned chunk_ns = l->soft ? SHOAL_TUNE_IB_CHUNK_SOFT_NS : SHOAL_TUNE_IB_CHUNK_NS;

    t->link = *l;
    if (l->rate_mbps == 0) {
        shoal_tune_link_defaults(t, "link rate unknown");
        return;
    }
    rate = (double)l->rate_mbps * 125000.0; /* bytes/s */
    floor_b = (uint64_t)l->mtu * SHOAL_TUNE_IB_MIN_MTUS;
    slot = shoal_tune_pow2_near(rate * chunk_ns / 1e9);
    slot = shoal_tune_clamp(SHOAL_MAX(slot, shoal_tune_pow2_ceil((double)floor_b)), 16 << 10,
                            1 << 20);
    shoal_tune_set(t, SHOAL_TUNE_IB_SLOT_SIZE, slot, SHOAL_TUNE_SRC_DERIVED,
                   "%.1f Gb/s x %u us%s, >= %u x MTU %u, within 16k..1m", l->rate_mbps / 1e3,
                   chunk_ns / 1000, l->soft ? " (software)" : "", SHOAL_TUNE_IB_MIN_MTUS,
                   l->mtu);
    t->src[SHOAL_TUNE_IB_NSLOTS] = t->src[SHOAL_TUNE_IB_SEND_SLOTS] = SHOAL_TUNE_SRC_DERIVED;
    shoal_tune_link_counts(t);
}

void shoal_tune_derive(const shoal_tune_machine_t *m, shoal_tune_t *t)
{
    memset(t, 0, sizeof(*t));
    t->machine = *m;
    shoal_tune_link_defaults(t, "no RDMA port opened");
    shoal_tune_derive_l2(m, t);
    shoal_tune_derive_copy(m, t);
    shoal_tune_derive_shm_ring(m, t);
    shoal_tune_derive_net(m, t);
    if (m->copy_mem_mbs > 0) {
        shoal_tune_set(t, SHOAL_TUNE_COPY_MBS,
                       SHOAL_MAX((uint64_t)SHOAL_TUNE_DFLT_COPY_MBS * m->copy_mem_mbs /
                                     SHOAL_TUNE_REF_COPY_MEM_MBS, 1),
                       SHOAL_TUNE_SRC_DERIVED, "%u x copy from memory %.1f / %.1f GB/s",
                       SHOAL_TUNE_DFLT_COPY_MBS, m->copy_mem_mbs / 1e3,
                       SHOAL_TUNE_REF_COPY_MEM_MBS / 1e3);
    } else {
        shoal_tune_set(t, SHOAL_TUNE_COPY_MBS, SHOAL_TUNE_DFLT_COPY_MBS, SHOAL_TUNE_SRC_DEFAULT,
                       "not measured");
    }
    if (m->reduce_mem_mbs > 0) {
        shoal_tune_set(t, SHOAL_TUNE_REDUCE_MBS,
                       SHOAL_MAX((uint64_t)SHOAL_TUNE_DFLT_REDUCE_MBS * m->reduce_mem_mbs /
                                     SHOAL_TUNE_REF_REDUCE_MEM_MBS, 1),
                       SHOAL_TUNE_SRC_DERIVED, "%u x reduce from memory %.1f / %.1f GB/s",
                       SHOAL_TUNE_DFLT_REDUCE_MBS, m->reduce_mem_mbs / 1e3,
                       SHOAL_TUNE_REF_REDUCE_MEM_MBS / 1e3);
    } else {
        shoal_tune_set(t, SHOAL_TUNE_REDUCE_MBS, SHOAL_TUNE_DFLT_REDUCE_MBS,
                       SHOAL_TUNE_SRC_DEFAULT, "not measured");
    }
}

/* ---- explicit settings --------------------------------------------------------------- */

const shoal_cfg_field_t *shoal_tune_cfg_find(const char *name, void **dst_p)
{
    for (size_t i = 0; i < shoal_cfg_ntables; i++) {
        const shoal_cfg_table_t *tb = shoal_cfg_tables[i];
        for (size_t j = 0; j < tb->nfields; j++) {
            if (strcmp(tb->fields[j].name, name) == 0) {
                *dst_p = (char *)tb->dst + tb->fields[j].offset;
                return &tb->fields[j];
            }
        }
    }
    return NULL;
}

/* SHOAL_SHM_ONESHOT_MAX=0 means "automatic": not an explicit setting. */
static int shoal_tune_explicit_zero_is_auto(int k)
{
    return k == SHOAL_TUNE_SHM_ONESHOT_OWN || k == SHOAL_TUNE_SHM_ONESHOT_SHARED;
}

static void shoal_tune_override_vars(shoal_tune_t *t)
{
    shoal_config_global_init();
    for (int k = 0; k < SHOAL_TUNE_NKNOBS; k++) {
        void *dst = NULL;
        const shoal_cfg_field_t *f =
            shoal_tune_knob_vars[k] != NULL ? shoal_tune_cfg_find(shoal_tune_knob_vars[k], &dst)
                                            : NULL;
        const char *src = f != NULL ? shoal_cfg_source(f) : NULL;
        uint64_t v;
        if (src == NULL || strcmp(src, "default") == 0 ||
            (f->type != SHOAL_CFG_SIZE && f->type != SHOAL_CFG_UINT)) {
            continue;
        }
        v = f->type == SHOAL_CFG_SIZE ? *(const size_t *)dst : *(const unsigned *)dst;
        if (v == 0 && shoal_tune_explicit_zero_is_auto(k)) {
            continue;
        }
        shoal_tune_set(t, k, v, strcmp(src, "env") == 0 ? SHOAL_TUNE_SRC_ENV : SHOAL_TUNE_SRC_FILE,
                       "SHOAL_%s%s", shoal_tune_knob_vars[k],
                       strcmp(src, "env") == 0 ? "" : " in SHOAL_CONF_FILE");
    }
}

/* One line of the tuning text: 1 applied, 0 not ours, -1 malformed 'set'. Knobs in
 * explicit (bits) were set by a variable, which wins; a knob set by an earlier line of the
 * text is set again: the last line wins, as a repeated link line of the same file does
 * (src/topo/topo_model.c). */
static int shoal_tune_override_line(shoal_tune_t *t, char *line, uint32_t explicit)
{
    char name[64], val[64];
    double bw;
    int n = 0;

    if (sscanf(line, "set %63s %63s %n", name, val, &n) == 2 && line[n] == '\0') {
        const char *nm = strncmp(name, "SHOAL_", 6) == 0 ? name + 6 : name;
        int hit = 0;
        for (int k = 0; k < SHOAL_TUNE_NKNOBS; k++) {
            void *dst;
            const shoal_cfg_field_t *f;
            union {
                size_t z;
                unsigned u;
            } pv;
            uint64_t v;
            if (shoal_tune_knob_vars[k] == NULL || strcmp(shoal_tune_knob_vars[k], nm) != 0) {
                continue;
            }
            f = shoal_tune_cfg_find(nm, &dst);
            if (f == NULL || (f->type != SHOAL_CFG_SIZE && f->type != SHOAL_CFG_UINT) ||
                shoal_cfg_parse_value(f, val, &pv) != 0) {
                return -1;
            }
            v = f->type == SHOAL_CFG_SIZE ? pv.z : pv.u;
            if (v == 0 && shoal_tune_is_count(k)) {
                return -1; /* no ring has 0 slots: it was shown, and the default used */
            }
            hit = 1;
            if ((explicit & (1u << k)) == 0 && !(v == 0 && shoal_tune_explicit_zero_is_auto(k))) {
                shoal_tune_set(t, k, v, SHOAL_TUNE_SRC_FILE, "set %s in SHOAL_TUNING_FILE", nm);
            }
        }
        return hit ? 1 : -1;
    }
    if (strncmp(line, "set", 3) == 0 && (line[3] == ' ' || line[3] == '\t' || line[3] == 0)) {
        return -1;
    }
    for (int k = SHOAL_TUNE_COPY_MBS; k <= SHOAL_TUNE_REDUCE_MBS; k++) {
        const char *what = k == SHOAL_TUNE_COPY_MBS ? "copy" : "reduce";
        size_t wl = strlen(what);
        if (strncmp(line, what, wl) == 0 && (line[wl] == ' ' || line[wl] == '\t')) {
            /* By the link profile's rules: a line src/topo refused (the profile 'ignored')
             * still set the rate here ('copy bw 2', 'bw 3.5 GB/s'), and 'bw 0' was dropped
             * without a word. */
            shoal_tuning_t tt;
            memset(&tt, 0, sizeof(tt));
            if (shoal_tuning_parse_line(line, &tt) != 0) {
                return -1;
            }
            bw = k == SHOAL_TUNE_COPY_MBS ? tt.copy_gbs : tt.reduce_gbs;
            if (bw * 1e3 < 1) {
                return -1; /* under 1 MB/s, as SHOAL_TUNE_MACHINE refuses: it became 1 MB/s */
            }
            shoal_tune_set(t, k, (uint64_t)(bw * 1e3 + 0.5), SHOAL_TUNE_SRC_FILE,
                           "'%s' line of SHOAL_TUNING_FILE", what);
            return 1;
        }
    }
    return 0;
}

/* The last tuning text warned about (its hash, never 0). */
static uint64_t shoal_tune_warned_hash;

shoal_status_t shoal_tune_override(shoal_tune_t *t, const char *tuning_text)
{
    shoal_status_t st = SHOAL_OK;
    char *copy, *line, *next;
    uint32_t explicit = 0;
    uint64_t hash;
    int lineno = 0, quiet;

    shoal_tune_override_vars(t);
    if (tuning_text == NULL) {
        shoal_tune_shm_count(t);
        shoal_tune_link_counts(t);
        return SHOAL_OK;
    }
    _Static_assert(SHOAL_TUNE_NKNOBS <= 32, "a bit per knob");
    for (int k = 0; k < SHOAL_TUNE_NKNOBS; k++) {
        if (t->src[k] == SHOAL_TUNE_SRC_ENV || t->src[k] == SHOAL_TUNE_SRC_FILE) {
            explicit |= 1u << k; /* SHOAL_<NAME> in the environment or SHOAL_CONF_FILE */
        }
    }
    copy = strdup(tuning_text);
    if (copy == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    /* The settings are resolved several times in one init (the transports' sizes, the
     * agreement): a bad line is warned about once per process and text, traced after. */
    hash = shoal_hash64(tuning_text, strlen(tuning_text), 0) | 1;
    quiet = __atomic_exchange_n(&shoal_tune_warned_hash, hash, __ATOMIC_RELAXED) == hash;
    /* Line by line, empty ones counted too: a warning names the line's number. */
    for (line = copy; line != NULL; line = next) {
        char *hash;
        size_t len;
        next = strchr(line, '\n');
        if (next != NULL) {
            *next++ = '\0';
        }
        lineno++;
        hash = strchr(line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        line += strspn(line, " \t\r");
        len = strlen(line);
        while (len > 0 && strchr(" \t\r", line[len - 1]) != NULL) {
            line[--len] = '\0';
        }
        if (line[0] != '\0' && shoal_tune_override_line(t, line, explicit) < 0) {
            char msg[512];
            snprintf(msg, sizeof(msg), "SHOAL_TUNING_FILE line %d: cannot use '%.160s' (want "
                     "'set <NAME> <size>', NAME one of CHUNK_SIZE SHM_WINDOW SHM_ONESHOT_MAX "
                     "SHM_LL_MAX SHM_SLOT_SIZE SHM_NSLOTS TCP_MIN_SPLIT UCX_INLINE_MAX "
                     "UCX_CMA_MIN IB_SLOT_SIZE IB_RING_SLOTS IB_SEND_SLOTS; slot counts above 0; "
                     "or 'copy|reduce lat <us> bw <GB/s>')",
                     lineno, line);
            if (quiet) {
                shoal_trace(COLL, "%s", msg);
            } else {
                shoal_warn(COLL, "%s", msg);
            }
            st = SHOAL_ERR_INVALID_ARG;
        }
    }
    free(copy);
    shoal_tune_shm_count(t);
    shoal_tune_link_counts(t);
    return st;
}

/* ---- printing ------------------------------------------------------------------------- */

static void shoal_tune_fmt(int k, uint64_t v, char *buf, size_t len)
{
    if (shoal_tune_is_rate(k)) {
        /* MB/s: under 10, two decimals of GB/s printed 1 MB/s as 0.00 (no rate at all) */
        snprintf(buf, len, v < 10 ? "%.3fGB/s" : "%.2fGB/s", (double)v / 1e3);
    } else if (shoal_tune_is_count(k)) {
        snprintf(buf, len, "%llu", (unsigned long long)v);
    } else if (v >= (1u << 20) && v % (1u << 20) == 0) {
        snprintf(buf, len, "%llum", (unsigned long long)(v >> 20));
    } else if (v >= 1024 && v % 1024 == 0) {
        snprintf(buf, len, "%lluk", (unsigned long long)(v >> 10));
    } else {
        snprintf(buf, len, "%llu", (unsigned long long)v);
    }
}

void shoal_tune_print(const shoal_tune_t *t, FILE *fp)
{
    static const char *const csrc[] = {"unknown", "sysfs", "hwloc", "SHOAL_TUNE_MACHINE"};
    static const char *const bsrc[] = {"not measured", "measured now",
                                       "measured earlier, per-host cache file",
                                       "SHOAL_TUNE_MACHINE",
                                       ("measured now, each rate the best of this and the "
                                        "per-host cache file's samples"),
                                       "SHOAL_TUNE_MACHINE where it gives them, else measured"};
    const shoal_tune_machine_t *m = &t->machine;

    fprintf(fp, "# settings that follow the machine (SHOAL_TUNE=%d)\n", shoal_tune_config.enable);
    fprintf(fp, "#   caches (%s): L1d %u KiB, L2 %u KiB, L3 %u KiB; %d cores\n",
            csrc[m->cache_src >= 0 && m->cache_src <= 3 ? m->cache_src : 0], m->l1d_kb,
            m->l2_kb, m->l3_kb, m->ncores);
    fprintf(fp, "#   memory (%s): copy in L2 %.2f GB/s, copy from memory %.2f GB/s, reduce "
            "from memory %.2f GB/s\n", bsrc[m->bw_src >= 0 && m->bw_src <= 5 ? m->bw_src : 0],
            m->copy_cache_mbs / 1e3, m->copy_mem_mbs / 1e3, m->reduce_mem_mbs / 1e3);
    fprintf(fp, "#   tcp receive buffer at start: %u KiB\n", m->tcp_rbuf_kb);
    if (t->link.rate_mbps != 0 || t->link.mtu != 0) {
        fprintf(fp, "#   RDMA port: MTU %u, %.1f Gb/s, %s device, round trip %s%u us\n",
                t->link.mtu, t->link.rate_mbps / 1e3, t->link.soft ? "software" : "hardware",
                t->link.rtt_us != 0 ? "" : "assumed ",
                t->link.rtt_us != 0 ? t->link.rtt_us
                : t->link.soft     ? SHOAL_TUNE_IB_RTT_SOFT_US
                                   : SHOAL_TUNE_IB_RTT_HW_US);
    } else {
        fprintf(fp, "#   RDMA port: none opened\n");
    }
    fprintf(fp, "#   %-24s %10s  %-8s %s\n", "setting", "value", "source", "why");
    for (int k = 0; k < SHOAL_TUNE_NKNOBS; k++) {
        char v[32];
        shoal_tune_fmt(k, t->value[k], v, sizeof(v));
        fprintf(fp, "#   %-24s %10s  %-8s %s\n", shoal_tune_knob_names[k], v,
                shoal_tune_src_name(t->src[k]), t->why[k]);
    }
}
