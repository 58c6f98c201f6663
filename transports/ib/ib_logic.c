/* IB transport, pure logic: credit accounting, ring bookkeeping, chunk plan and staging,
 * per-peer memory layout and access flags, immediate codec, the registration cache (verbs
 * behind callbacks) and the QP transition table. */
#include "transports/ib/ib.h"

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- credits (sender) ---------------------------------------------------------------------- */

void shoal_ib_credit_init(shoal_ib_credit_t *c, uint32_t nslots)
{
    c->nslots = nslots;
    c->avail = nslots;
    c->tail = 0;
}

int shoal_ib_credit_take(shoal_ib_credit_t *c)
{
    int slot;
    if (c->avail == 0) {
        return -1;
    }
    slot = (int)c->tail;
    c->avail--;
    c->tail = c->tail + 1 == c->nslots ? 0 : c->tail + 1;
    return slot;
}

int shoal_ib_credit_grant(shoal_ib_credit_t *c, uint32_t n)
{
    if (n > c->nslots - c->avail) {
        return -1;
    }
    c->avail += n;
    return 0;
}

/* ---- ring (receiver) ----------------------------------------------------------------------- */

void shoal_ib_ring_init(shoal_ib_ring_t *r, uint32_t nslots)
{
    memset(r, 0, sizeof(*r));
    r->nslots = nslots;
}

int shoal_ib_ring_arrive(shoal_ib_ring_t *r, uint32_t slot)
{
    uint32_t want;
    /* owed slots are free here but still count against the sender until returned */
    if (r->filled + r->owed >= r->nslots) {
        return -1;
    }
    want = (r->head + r->filled) % r->nslots;
    if (slot != want) {
        return -1;
    }
    r->filled++;
    return 0;
}

int shoal_ib_ring_consume(shoal_ib_ring_t *r)
{
    if (r->filled == 0) {
        return -1;
    }
    r->filled--;
    r->owed++;
    r->head = r->head + 1 == r->nslots ? 0 : r->head + 1;
    return 0;
}

uint32_t shoal_ib_ring_take_owed(shoal_ib_ring_t *r, uint32_t max)
{
    uint32_t n = SHOAL_MIN(r->owed, max);
    r->owed -= n;
    return n;
}

/* ---- chunks -------------------------------------------------------------------------------- */

uint64_t shoal_ib_chunk_count(uint64_t len, size_t slot_size)
{
    uint64_t first = slot_size - SHOAL_WIRE_HDR_BYTES;
    if (len <= first) {
        return 1;
    }
    return 1 + (len - first + slot_size - 1) / slot_size;
}

unsigned shoal_ib_chunk_next(uint64_t len, uint64_t off, int first, size_t slot_size,
                             size_t *n_p)
{
    uint64_t room = first ? slot_size - SHOAL_WIRE_HDR_BYTES : slot_size;
    uint64_t left = len > off ? len - off : 0;
    uint64_t n = SHOAL_MIN(left, room);
    *n_p = (size_t)n;
    return (first ? SHOAL_IB_CHUNK_FIRST : 0u) | (off + n == len ? SHOAL_IB_CHUNK_LAST : 0u);
}

/* ---- building a chunk ---------------------------------------------------------------------- */

int shoal_ib_chunk_build(const shoal_ib_chunk_src_t *s, const void *buf, uint64_t len,
                         uint64_t off, int first, shoal_ib_chunk_t *c)
{
    size_t n, h = first ? SHOAL_WIRE_HDR_BYTES : 0;
    const uint8_t *p = (const uint8_t *)buf + off;

    memset(c, 0, sizeof(*c));
    c->flags = shoal_ib_chunk_next(len, off, first, s->slot_size, &n);
    c->n = n;
    c->bytes = h + n;
    if (c->bytes <= s->max_inline) {
        c->src = SHOAL_IB_SRC_INLINE; /* the CPU copies the bytes at post time */
    } else if (n == 0) {
        c->src = SHOAL_IB_SRC_HDR;
    } else if (s->zcopy) {
        c->src = SHOAL_IB_SRC_ZCOPY;
    } else {
        /* the bytes of the buffer as they are now, into memory shoal owns and registered */
        if (s->bounce == NULL) {
            return -1;
        }
        c->src = SHOAL_IB_SRC_BOUNCE;
        if (h > 0) {
            memcpy(s->bounce, s->hdr, SHOAL_WIRE_HDR_BYTES);
        }
        memcpy(s->bounce + h, p, n);
        c->sge[c->nsge++] = (shoal_ib_sge_t){.addr = (uintptr_t)s->bounce,
                                             .length = (uint32_t)c->bytes,
                                             .lkey = s->send_lkey};
        return 0;
    }
    if (h > 0) {
        c->sge[c->nsge++] = (shoal_ib_sge_t){.addr = (uintptr_t)s->hdr,
                                             .length = SHOAL_WIRE_HDR_BYTES,
                                             .lkey = s->send_lkey};
    }
    if (n > 0) {
        c->sge[c->nsge++] = (shoal_ib_sge_t){
            .addr = (uintptr_t)p, .length = (uint32_t)n,
            .lkey = c->src == SHOAL_IB_SRC_ZCOPY ? s->buf_lkey : 0};
    }
    return 0;
}

/* ---- per-peer memory ----------------------------------------------------------------------- */

shoal_status_t shoal_ib_layout_init(shoal_ib_layout_t *l, int npeers, uint32_t nslots,
                                    uint32_t slot_size, uint32_t nbounce, uint32_t sq_depth,
                                    size_t page)
{
    size_t n = (size_t)(npeers > 0 ? npeers : 1);
    memset(l, 0, sizeof(*l));
    if (nslots == 0 || slot_size == 0 || nbounce == 0 || sq_depth == 0 || page == 0 ||
        (page & (page - 1)) != 0 || npeers < 0) {
        return SHOAL_ERR_INVALID_ARG;
    }
    l->page = page;
    l->npeers = npeers;
    l->nslots = nslots;
    l->slot_size = slot_size;
    l->nbounce = nbounce;
    l->sq_depth = sq_depth;
    /* 32-bit counts times 32-bit sizes fit 64 bits; their sums, the rounding up to a page and
     * the products over peers are checked */
    l->ring_len = (size_t)nslots * slot_size;
    l->hdr_off = (size_t)nbounce * slot_size;
    l->send_len = l->hdr_off + (size_t)sq_depth * SHOAL_WIRE_HDR_BYTES;
    if (l->send_len < l->hdr_off || l->ring_len > SIZE_MAX - (page - 1) ||
        l->send_len > SIZE_MAX - (page - 1)) {
        return SHOAL_ERR_INVALID_ARG;
    }
    l->ring_stride = SHOAL_ALIGN_UP(l->ring_len, page);
    l->send_stride = SHOAL_ALIGN_UP(l->send_len, page);
    if (l->ring_stride > SIZE_MAX / n || l->send_stride > SIZE_MAX / n) {
        return SHOAL_ERR_INVALID_ARG;
    }
    l->ring_total = l->ring_stride * n;
    l->send_total = l->send_stride * n;
    return SHOAL_OK;
}

int shoal_ib_region_access(int kind)
{
    switch (kind) {
    case SHOAL_IB_REGION_RING:
        /* the peer RDMA-writes its slots; verbs requires LOCAL_WRITE with REMOTE_WRITE */
        return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    case SHOAL_IB_REGION_SEND:
    case SHOAL_IB_REGION_USER:
        /* Only ever gathered from: no remote access at all. LOCAL_WRITE makes the kernel pin
         * the pages writable, which breaks copy-on-write at registration; a read-only pin of a
         * page shared with a forked child (data-loader workers) could otherwise keep the old
         * page while the CPU writes the new one, on kernels before the R/O pin fixes. */
        return IBV_ACCESS_LOCAL_WRITE;
    default:
        return 0;
    }
}

void shoal_ib_region_get(const shoal_ib_layout_t *l, int idx, int kind, shoal_ib_region_t *r)
{
    if (kind == SHOAL_IB_REGION_RING) {
        r->off = (size_t)idx * l->ring_stride;
        r->len = l->ring_len;
    } else {
        r->off = (size_t)idx * l->send_stride;
        r->len = l->send_len;
    }
    r->access = shoal_ib_region_access(kind);
}

void shoal_ib_pair_local(const shoal_ib_layout_t *l, const uint8_t *rings, int idx,
                         uint32_t qpn, uint32_t psn, uint32_t ring_rkey, shoal_ib_pair_t *p)
{
    shoal_ib_region_t r;
    shoal_ib_region_get(l, idx, SHOAL_IB_REGION_RING, &r);
    *p = (shoal_ib_pair_t){
        .qpn = qpn, .psn = psn, .ring_addr = (uintptr_t)(rings + r.off), .rkey = ring_rkey,
        .nslots = l->nslots, .slot_size = l->slot_size,
    };
}

/* ---- immediate: kind:2 | first:1 | last:1 | slot:12 | credits:16 --------------------------- */

int shoal_ib_imm_encode(const shoal_ib_imm_t *imm, uint32_t *out)
{
    if (imm->kind > 3 || imm->flags > 3 || imm->slot >= SHOAL_IB_SLOTS_MAX ||
        imm->credits > SHOAL_IB_CREDITS_MAX) {
        return -1;
    }
    *out = (uint32_t)imm->kind << 30 | (uint32_t)imm->flags << 28 | imm->slot << 16 |
           imm->credits;
    return 0;
}

void shoal_ib_imm_decode(uint32_t v, shoal_ib_imm_t *imm)
{
    imm->kind = v >> 30;
    imm->flags = (v >> 28) & 3u;
    imm->slot = (v >> 16) & 0xfffu;
    imm->credits = v & 0xffffu;
}

/* ---- registration cache -------------------------------------------------------------------
 * A sorted array of page ranges, each one registration. get() returns a covering entry
 * (hit) or registers the page range of the request (miss), first evicting least recently
 * used idle entries while the cache is over its entry or byte cap. Entries in use are never
 * deregistered; an entry that must go while in use (invalidate, or a miss that cannot fit)
 * is doomed and deregistered by its last put(). */

shoal_status_t shoal_ib_regcache_init(shoal_ib_regcache_t *rc, const shoal_ib_reg_ops_t *ops,
                                      int max_ents, size_t max_bytes)
{
    long page = sysconf(_SC_PAGESIZE);
    memset(rc, 0, sizeof(*rc));
    rc->ops = *ops;
    rc->cap = max_ents > 0 ? max_ents : 1;
    rc->max_bytes = max_bytes;
    rc->page = page > 0 ? (size_t)page : 4096;
    rc->ents = calloc((size_t)rc->cap, sizeof(*rc->ents));
    if (rc->ents == NULL) {
        shoal_error(IB, "out of memory allocating the registration cache (%d entries)", rc->cap);
        return SHOAL_ERR_NO_MEMORY;
    }
    return SHOAL_OK;
}

static void shoal_ib_regcache_remove(shoal_ib_regcache_t *rc, int i)
{
    shoal_ib_reg_entry_t *e = &rc->ents[i];
    rc->ops.dereg(rc->ops.arg, e->handle);
    if (!e->doomed) {
        rc->bytes -= e->end - e->start;
    }
    memmove(e, e + 1, (size_t)(rc->n - i - 1) * sizeof(*e));
    rc->n--;
}

/* Evicts the least recently used idle entry; 0 if there was none. */
static int shoal_ib_regcache_evict_one(shoal_ib_regcache_t *rc)
{
    int victim = -1;
    for (int i = 0; i < rc->n; i++) {
        if (rc->ents[i].refs == 0 &&
            (victim < 0 || rc->ents[i].last_use < rc->ents[victim].last_use)) {
            victim = i;
        }
    }
    if (victim < 0) {
        return 0;
    }
    shoal_ib_regcache_remove(rc, victim);
    rc->evictions++;
    return 1;
}

static int shoal_ib_regcache_find(shoal_ib_regcache_t *rc, uintptr_t a, uintptr_t b)
{
    for (int i = 0; i < rc->n && rc->ents[i].start <= a; i++) {
        if (!rc->ents[i].doomed && rc->ents[i].end >= b) {
            return i;
        }
    }
    return -1;
}

static shoal_status_t shoal_ib_regcache_insert(shoal_ib_regcache_t *rc, uintptr_t start,
                                               uintptr_t end, int *idx_p)
{
    size_t size = end - start;
    void *handle;
    uint32_t lkey;
    int doomed, pos = 0, fits = size <= rc->max_bytes;

    /* A range larger than the whole cap is never kept: evicting for it emptied the cache,
     * and every buffer the job reuses was registered again after one large message. */
    while ((rc->n == rc->cap || (fits && rc->bytes + size > rc->max_bytes)) &&
           shoal_ib_regcache_evict_one(rc)) {
    }
    if (rc->n == rc->cap) {
        /* the caller sends that buffer through its bounce slots instead */
        shoal_trace(IB, "registration cache: all %d entries are in use", rc->cap);
        return SHOAL_ERR_NO_MEMORY;
    }
    if (rc->ops.reg(rc->ops.arg, (void *)start, size, &handle, &lkey) != 0) {
        return SHOAL_ERR_TRANSPORT;
    }
    doomed = !fits || rc->bytes + size > rc->max_bytes; /* over the cap even now: not kept */
    while (pos < rc->n && rc->ents[pos].start <= start) {
        pos++;
    }
    memmove(&rc->ents[pos + 1], &rc->ents[pos], (size_t)(rc->n - pos) * sizeof(*rc->ents));
    rc->ents[pos] = (shoal_ib_reg_entry_t){
        .start = start, .end = end, .handle = handle, .lkey = lkey, .doomed = doomed,
    };
    rc->n++;
    if (!doomed) {
        rc->bytes += size;
    }
    *idx_p = pos;
    return SHOAL_OK;
}

static void shoal_ib_regcache_released(void *arg, uintptr_t start, uintptr_t end)
{
    shoal_ib_regcache_invalidate(arg, (const void *)start, end - start);
}

void shoal_ib_regcache_follow(shoal_ib_regcache_t *rc)
{
    rc->follow = 1;
    rc->ev_seen = shoal_ib_memhook_seq();
}

void shoal_ib_regcache_sync(shoal_ib_regcache_t *rc)
{
    if (!rc->follow) {
        return;
    }
    if (rc->n == 0) {
        rc->ev_seen = shoal_ib_memhook_seq(); /* nothing to invalidate */
        return;
    }
    if (shoal_ib_memhook_drain(&rc->ev_seen, shoal_ib_regcache_released, rc) != 0) {
        rc->flushes++; /* events were lost: nothing cached can be trusted */
        shoal_ib_regcache_invalidate(rc, NULL, UINTPTR_MAX);
    }
}

shoal_status_t shoal_ib_regcache_get(shoal_ib_regcache_t *rc, const void *addr, size_t len,
                                     uintptr_t *key_p, uint32_t *lkey_p)
{
    uintptr_t a = (uintptr_t)addr / rc->page * rc->page;
    uintptr_t b = SHOAL_ALIGN_UP((uintptr_t)addr + (len > 0 ? len : 1), rc->page);
    int i;

    shoal_ib_regcache_sync(rc); /* memory released since the last lookup */
    i = shoal_ib_regcache_find(rc, a, b);

    if (i >= 0) {
        rc->hits++;
    } else {
        rc->misses++;
        SHOAL_CHECK(shoal_ib_regcache_insert(rc, a, b, &i));
    }
    rc->ents[i].refs++;
    rc->ents[i].last_use = ++rc->clock;
    *key_p = rc->ents[i].start;
    *lkey_p = rc->ents[i].lkey;
    return SHOAL_OK;
}

void shoal_ib_regcache_put(shoal_ib_regcache_t *rc, uintptr_t key, uint32_t lkey)
{
    for (int i = 0; i < rc->n && rc->ents[i].start <= key; i++) {
        shoal_ib_reg_entry_t *e = &rc->ents[i];
        /* by lkey too: a longer range from the same page is another entry with this start,
         * and dropping its reference instead would leave ours idle (evictable) in flight */
        if (e->start == key && e->lkey == lkey && e->refs > 0) {
            e->refs--;
            if (e->refs == 0 && e->doomed) {
                shoal_ib_regcache_remove(rc, i);
            }
            return;
        }
    }
    shoal_warn(IB, "registration cache: release of an unknown entry %#lx", (unsigned long)key);
}

void shoal_ib_regcache_invalidate(shoal_ib_regcache_t *rc, const void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr, b = a + len;
    for (int i = 0; i < rc->n;) {
        shoal_ib_reg_entry_t *e = &rc->ents[i];
        if (e->start < b && a < e->end) {
            if (e->refs == 0) {
                shoal_ib_regcache_remove(rc, i);
                continue;
            }
            if (!e->doomed) {
                rc->bytes -= e->end - e->start;
                e->doomed = 1;
            }
        }
        i++;
    }
}

void shoal_ib_regcache_fini(shoal_ib_regcache_t *rc)
{
    if (rc->ents == NULL) {
        return;
    }
    while (rc->n > 0) {
        shoal_ib_regcache_remove(rc, rc->n - 1);
    }
    free(rc->ents);
    rc->ents = NULL;
}

/* ---- QP transitions ------------------------------------------------------------------------ */

static const char *const shoal_ib_qp_step_names[] = {"RESET->INIT", "INIT->RTR", "RTR->RTS"};

const char *shoal_ib_qp_step_name(int step)
{
    return step >= 0 && step < 3 ? shoal_ib_qp_step_names[step] : "?";
}

int shoal_ib_wc_local(int status, int send)
{
    switch (status) {
    case IBV_WC_LOC_QP_OP_ERR:
    case IBV_WC_LOC_EEC_OP_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_MW_BIND_ERR:
    case IBV_WC_LOC_RDD_VIOL_ERR:
    case IBV_WC_FATAL_ERR:
        return 1;
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
        return send;
    default:
        return 0;
    }
}

int shoal_ib_qp_step(int step, const shoal_ib_qp_plan_t *p, struct ibv_qp_attr *a)
{
    memset(a, 0, sizeof(*a));
    switch (step) {
    case 0:
        if (p->pkey_index < 0 || p->pkey_index > UINT16_MAX) {
            return -1; /* 16 bits: wrapped, it would name another partition */
        }
        a->qp_state = IBV_QPS_INIT;
        a->pkey_index = (uint16_t)p->pkey_index;
        a->port_num = (uint8_t)p->port;
        a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    case 1:
        a->qp_state = IBV_QPS_RTR;
        a->path_mtu = (enum ibv_mtu)p->mtu;
        a->dest_qp_num = p->remote_qpn;
        a->rq_psn = p->remote_psn;
        a->max_dest_rd_atomic = (uint8_t)p->max_rd_atomic;
        a->min_rnr_timer = 12; /* 0.64 ms; we never post sends without a receive */
        a->ah_attr.port_num = (uint8_t)p->port;
        a->ah_attr.sl = (uint8_t)p->sl;
        a->ah_attr.dlid = p->remote_lid;
        if (p->is_global) {
            a->ah_attr.is_global = 1;
            memcpy(a->ah_attr.grh.dgid.raw, p->remote_gid, 16);
            a->ah_attr.grh.sgid_index = (uint8_t)p->sgid_index;
            a->ah_attr.grh.hop_limit = 255;
            a->ah_attr.grh.traffic_class = (uint8_t)p->tc;
        }
        return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    case 2:
        a->qp_state = IBV_QPS_RTS;
        a->sq_psn = p->local_psn;
        a->timeout = (uint8_t)p->timeout;
        a->retry_cnt = (uint8_t)p->retry_cnt;
        a->rnr_retry = (uint8_t)p->rnr_retry;
        a->max_rd_atomic = (uint8_t)p->max_rd_atomic;
        return IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
               IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    default:
        return -1;
    }
}

void shoal_ib_qos_pick(unsigned cfg_tc, unsigned cfg_sl, int qos_tc, int qos_sl,
                       uint64_t rate_Bps, shoal_ib_qos_t *out)
{
    uint64_t kbps = rate_Bps / 125; /* bytes/s * 8 / 1000 */

    out->tc = qos_tc >= 0 && qos_tc <= 255 ? (unsigned)qos_tc : cfg_tc;
    out->sl = qos_sl >= 0 && qos_sl <= 15 ? (unsigned)qos_sl : cfg_sl;
    out->rate_kbps = rate_Bps == 0 ? 0 : (uint32_t)SHOAL_MIN(SHOAL_MAX(kbps, 1), UINT32_MAX);
}

/* ---- rdma_cm ------------------------------------------------------------------------------ */

int shoal_ib_cm_resolve_ms(uint64_t deadline_ns)
{
    /* no deadline is the cap, not UINT64_MAX - now read as a negative count (1 ms) */
    return SHOAL_MAX(shoal_deadline_left_ms(deadline_ns, 10000), 1);
}

shoal_status_t shoal_ib_cm_rejected(int status)
{
    switch (status) {
    case SHOAL_IB_CM_REJ_CONSUMER:
        return SHOAL_ERR_AUTH;
    case SHOAL_IB_CM_REJ_NO_LISTENER:
        return SHOAL_ERR_PEER_FAILED;
    default:
        return SHOAL_ERR_TRANSPORT;
    }
}
