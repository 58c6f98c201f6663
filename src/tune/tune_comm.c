/* Resolution on one process, and agreement on rank 0's values within a communicator. */
#include "tune/tune.h"

#include "core/core.h"
#include "topo/topo.h"

#include <stdlib.h>
#include <string.h>

#define SHOAL_TUNE_STEP 0x71000000u /* channel step of the agreement messages */

/* SHOAL_TUNING_FILE's text, or NULL (absent, unreadable, too large: rank 0's
 * shoal_tuning_load says so). */
static char *shoal_tune_file_text(void)
{
    const char *path = shoal_topo_config.tuning_file;
    char *buf = NULL, why[256];

    /* A larger file is ignored whole, as shoal_tuning_load reports it ('is larger than 65536
     * bytes: ignored'). Cut at the limit, its 'set' lines before the cut still applied, the
     * last one parsed half ('set CHUNK_SIZE 262144' as 2621). So is one another user could
     * have left (shoal_tuning_read): its 'set' lines set this job's sizes. */
    if (path == NULL || path[0] == '\0' || shoal_tuning_read(path, &buf, why, sizeof(why)) != 0) {
        return NULL;
    }
    return buf;
}

/* SHOAL_TOPO_DISCOVERY (topo's table): the discovery the topology uses. */
static int shoal_tune_disc_mode(void)
{
    return shoal_topo_config.topo_discovery;
}

void shoal_tune_resolve(int mode, const shoal_tl_link_t *link, shoal_tune_t *t)
{
    shoal_tune_machine_t m;
    char *text;

    shoal_config_global_init();
    shoal_tune_machine_local(mode, &m);
    if (shoal_tune_config.enable) {
        shoal_tune_derive(&m, t);
        if (link != NULL) {
            shoal_tune_derive_link(link, t);
        }
    } else {
        shoal_tune_machine_t none = {0};
        shoal_tune_derive(&none, t);
        t->machine = m;
        if (link != NULL) {
            t->link = *link;
        }
        for (int k = 0; k < SHOAL_TUNE_NKNOBS; k++) {
            snprintf(t->why[k], sizeof(t->why[k]), "SHOAL_TUNE=0");
        }
    }
    text = shoal_tune_file_text();
    (void)shoal_tune_override(t, text); /* a bad line is warned about and skipped */
    free(text);
}

void shoal_tune_resolve_local(int mode, shoal_tune_t *t)
{
    shoal_tune_resolve(mode, NULL, t);
}

void shoal_tune_link_sizes(const shoal_tl_link_t *link, shoal_tl_link_sizes_t *z)
{
    static const int knobs[] = {SHOAL_TUNE_IB_SLOT_SIZE, SHOAL_TUNE_IB_NSLOTS,
                                SHOAL_TUNE_IB_SEND_SLOTS};
    shoal_tune_t t;
    size_t off = 0;

    shoal_tune_resolve(shoal_tune_disc_mode(), link, &t);
    memset(z, 0, sizeof(*z));
    z->slot_size = t.value[SHOAL_TUNE_IB_SLOT_SIZE];
    z->nslots = (uint32_t)SHOAL_MIN(t.value[SHOAL_TUNE_IB_NSLOTS], (uint64_t)UINT32_MAX);
    z->send_slots = (uint32_t)SHOAL_MIN(t.value[SHOAL_TUNE_IB_SEND_SLOTS], (uint64_t)UINT32_MAX);
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(knobs) && off < sizeof(z->why); i++) {
        int k = knobs[i];
        int w = snprintf(z->why + off, sizeof(z->why) - off, "%s%s %s (%s)", i > 0 ? "; " : "",
                         shoal_tune_knob_names[k], shoal_tune_src_name(t.src[k]), t.why[k]);
        off += w > 0 ? (size_t)w : 0;
    }
}

void shoal_tune_tl_sizes_of(const shoal_tune_t *t, shoal_tl_sizes_t *s)
{
    memset(s, 0, sizeof(*s));
    s->shm_slot_size = t->value[SHOAL_TUNE_SHM_SLOT_SIZE];
    s->shm_nslots = (uint32_t)SHOAL_MIN(t->value[SHOAL_TUNE_SHM_NSLOTS], (uint64_t)UINT32_MAX);
    s->tcp_min_split = t->value[SHOAL_TUNE_TCP_MIN_SPLIT];
    s->ucx_inline_max =
        (uint32_t)SHOAL_MIN(t->value[SHOAL_TUNE_UCX_INLINE_MAX], (uint64_t)UINT32_MAX);
    s->ucx_cma_min = t->value[SHOAL_TUNE_UCX_CMA_MIN];
}

void shoal_tune_tl_sizes(shoal_tl_sizes_t *s)
{
    shoal_tune_t t;

    shoal_tune_resolve_local(shoal_tune_disc_mode(), &t);
    shoal_tune_tl_sizes_of(&t, s);
    shoal_trace(INIT, "transport sizes: shm slot %llu x %u (%s), tcp split %llu (%s), ucx "
                "inline %u (%s), ucx single copy from %llu (%s)",
                (unsigned long long)s->shm_slot_size, s->shm_nslots, shoal_tune_src_name(t.src[SHOAL_TUNE_SHM_SLOT_SIZE]),
                (unsigned long long)s->tcp_min_split,
                shoal_tune_src_name(t.src[SHOAL_TUNE_TCP_MIN_SPLIT]), s->ucx_inline_max,
                shoal_tune_src_name(t.src[SHOAL_TUNE_UCX_INLINE_MAX]),
                (unsigned long long)s->ucx_cma_min,
                shoal_tune_src_name(t.src[SHOAL_TUNE_UCX_CMA_MIN]));
}

/* Rank 0's record, as received: sane before anyone uses it. Sizes may be 0 (an explicit
 * SHOAL_CHUNK_SIZE=0: the users clamp them); a rate of 0 would be an infinitely fast memory. */
int shoal_tune_record_check(const shoal_tune_t *t)
{
    for (int k = 0; k < SHOAL_TUNE_NKNOBS; k++) {
        int rate = k == SHOAL_TUNE_COPY_MBS || k == SHOAL_TUNE_REDUCE_MBS;
        if (t->src[k] > SHOAL_TUNE_SRC_FILE ||
            memchr(t->why[k], '\0', sizeof(t->why[k])) == NULL || (rate && t->value[k] == 0) ||
            t->value[k] > ((uint64_t)1 << 40)) {
            return 0;
        }
    }
    return 1;
}

/* A rank whose own explicit setting lost to rank 0's says so once. */
static void shoal_tune_warn_mismatch(struct shoal_comm *comm, const shoal_tune_t *t)
{
    static int warned;
    shoal_tune_machine_t none = {0};
    shoal_tune_t mine;
    char *text = shoal_tune_file_text();

    /* its own tuning file's 'set' lines too: they lost to rank 0's without a word */
    shoal_tune_derive(&none, &mine);
    (void)shoal_tune_override(&mine, text); /* a bad line was warned about at resolution */
    free(text);
    for (int k = 0; k < SHOAL_TUNE_SHM_SLOT_SIZE; k++) { /* transport sizes: core's round 0 */
        if ((mine.src[k] == SHOAL_TUNE_SRC_ENV || mine.src[k] == SHOAL_TUNE_SRC_FILE) &&
            mine.value[k] != t->value[k] && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
            shoal_warn(COLL, "rank %d: %s = %llu is not rank 0's %llu (%s): every rank uses "
                       "rank 0's settings", comm->rank, mine.why[k],
                       (unsigned long long)mine.value[k], (unsigned long long)t->value[k],
                       shoal_tune_src_name(t->src[k]));
        }
    }
}

shoal_status_t shoal_tune_comm_agree(struct shoal_comm *comm, shoal_tune_t *t)
{
    uint32_t seq = comm->seq++;

    memset(t, 0, sizeof(*t));
    if (comm->rank == 0) {
        shoal_tune_resolve_local(shoal_tune_disc_mode(), t);
    }
    if (comm->nranks > 1) {
        SHOAL_CHECK(shoal_chan_bcast_small(comm, t, sizeof(*t), seq, SHOAL_TUNE_STEP));
    }
    if (!shoal_tune_record_check(t)) {
        return shoal_comm_set_failed(comm, SHOAL_ERR_PROTOCOL, 0, "rank 0 (%s) sent settings "
                                     "that make no sense", shoal_comm_peer_host(comm, 0));
    }
    if (comm->rank != 0) {
        shoal_tune_warn_mismatch(comm, t);
    } else if (shoal_log_enabled(SHOAL_LOG_INFO, COLL)) {
        for (int k = 0; k < SHOAL_TUNE_NKNOBS; k++) {
            shoal_info(COLL, "tune: %s = %llu (%s: %s)", shoal_tune_knob_names[k],
                       (unsigned long long)t->value[k], shoal_tune_src_name(t->src[k]),
                       t->why[k]);
        }
    }
    return SHOAL_OK;
}
