/* The staging pipeline scheduler and chunk geometry (pure logic; see pipe.h). */
#include "cuda/pipe.h"

static shoal_pipe_stage_t shoal_pipe_first(const shoal_pipe_t *p)
{
    return (p->flags & SHOAL_PIPE_HAS_D2H) != 0 ? SHOAL_PIPE_D2H : SHOAL_PIPE_NET;
}

static shoal_pipe_stage_t shoal_pipe_last(const shoal_pipe_t *p)
{
    return (p->flags & SHOAL_PIPE_HAS_H2D) != 0 ? SHOAL_PIPE_H2D : SHOAL_PIPE_NET;
}

static int shoal_pipe_has(const shoal_pipe_t *p, shoal_pipe_stage_t stage)
{
    switch (stage) {
    case SHOAL_PIPE_D2H:
        return (p->flags & SHOAL_PIPE_HAS_D2H) != 0;
    case SHOAL_PIPE_H2D:
        return (p->flags & SHOAL_PIPE_HAS_H2D) != 0;
    case SHOAL_PIPE_NET:
        return 1;
    default:
        return 0;
    }
}

shoal_status_t shoal_pipe_init(shoal_pipe_t *p, uint32_t nchunks, uint32_t nslots, unsigned flags)
{
    if (p == NULL || nslots == 0 || (flags & ~(SHOAL_PIPE_HAS_D2H | SHOAL_PIPE_HAS_H2D)) != 0) {
        return SHOAL_ERR_INVALID_ARG;
    }
    *p = (shoal_pipe_t){.nchunks = nchunks, .nslots = nslots, .flags = flags};
    return SHOAL_OK;
}

uint32_t shoal_pipe_slots_busy(const shoal_pipe_t *p)
{
    return p->issued[shoal_pipe_first(p)] - p->done[shoal_pipe_last(p)];
}

static void shoal_pipe_op_set(const shoal_pipe_t *p, shoal_pipe_stage_t stage, uint32_t chunk,
                              shoal_pipe_op_t *op_p)
{
    *op_p = (shoal_pipe_op_t){.stage = stage, .chunk = chunk, .slot = chunk % p->nslots};
}

shoal_pipe_next_t shoal_pipe_next(shoal_pipe_t *p, shoal_pipe_op_t *op_p)
{
    uint32_t c;

    if (p->done[shoal_pipe_last(p)] == p->nchunks) {
        return SHOAL_PIPE_DONE;
    }
    /* H2D first: it frees a slot. */
    c = p->issued[SHOAL_PIPE_H2D];
    if (shoal_pipe_has(p, SHOAL_PIPE_H2D) && c < p->done[SHOAL_PIPE_NET]) {
        shoal_pipe_op_set(p, SHOAL_PIPE_H2D, c, op_p);
        p->issued[SHOAL_PIPE_H2D]++;
        return SHOAL_PIPE_ISSUE;
    }
    /* D2H next, while a slot is free. */
    c = p->issued[SHOAL_PIPE_D2H];
    if (shoal_pipe_has(p, SHOAL_PIPE_D2H) && c < p->nchunks &&
        shoal_pipe_slots_busy(p) < p->nslots) {
        shoal_pipe_op_set(p, SHOAL_PIPE_D2H, c, op_p);
        p->issued[SHOAL_PIPE_D2H]++;
        return SHOAL_PIPE_ISSUE;
    }
    /* NET: one at a time, in order, once the chunk is staged (or holds a slot). */
    c = p->issued[SHOAL_PIPE_NET];
    if (c < p->nchunks && p->done[SHOAL_PIPE_NET] == c) {
        int ready = shoal_pipe_has(p, SHOAL_PIPE_D2H) ? p->done[SHOAL_PIPE_D2H] > c
                                                      : shoal_pipe_slots_busy(p) < p->nslots;
        if (ready) {
            shoal_pipe_op_set(p, SHOAL_PIPE_NET, c, op_p);
            p->issued[SHOAL_PIPE_NET]++;
            return SHOAL_PIPE_ISSUE;
        }
    }
    return SHOAL_PIPE_WAIT;
}

int shoal_pipe_oldest(const shoal_pipe_t *p, shoal_pipe_stage_t stage, shoal_pipe_op_t *op_p)
{
    if ((unsigned)stage >= SHOAL_PIPE_NSTAGES || p->done[stage] >= p->issued[stage]) {
        return 0;
    }
    shoal_pipe_op_set(p, stage, p->done[stage], op_p);
    return 1;
}

shoal_status_t shoal_pipe_complete(shoal_pipe_t *p, shoal_pipe_stage_t stage, uint32_t chunk)
{
    if ((unsigned)stage >= SHOAL_PIPE_NSTAGES || !shoal_pipe_has(p, stage) ||
        p->done[stage] >= p->issued[stage] || chunk != p->done[stage]) {
        shoal_error(CUDA, "pipeline: completion of %s chunk %u out of order (issued %u, done %u)",
                    shoal_pipe_stage_name(stage), chunk,
                    (unsigned)stage < SHOAL_PIPE_NSTAGES ? p->issued[stage] : 0,
                    (unsigned)stage < SHOAL_PIPE_NSTAGES ? p->done[stage] : 0);
        return SHOAL_ERR_INTERNAL;
    }
    p->done[stage]++;
    return SHOAL_OK;
}

const char *shoal_pipe_stage_name(shoal_pipe_stage_t stage)
{
    static const char *const names[] = {"d2h", "net", "h2d"};
    return (unsigned)stage < SHOAL_PIPE_NSTAGES ? names[stage] : "?";
}

/* ---- geometry ------------------------------------------------------------------------- */

/* Elements per row per chunk for a footprint of rows rows: chunk_bytes, rounded down to a
 * multiple of 16 bytes, shrunk until two slots fit the staging. 0 if nothing fits. */
static size_t shoal_pipe_chunk_elems(size_t esize, uint32_t rows, size_t staging_bytes,
                                     size_t chunk_bytes)
{
    size_t row = chunk_bytes / 16 * 16;
    size_t per_slot_max = staging_bytes / 2 / rows;

    if (row > per_slot_max) {
        row = per_slot_max / 16 * 16;
    }
    if (row == 0) {
        /* One slot of one 16-byte (or element) row: no overlap, still bounded. */
        row = SHOAL_MIN(staging_bytes / rows / 16 * 16, (size_t)16);
    }
    if (row < esize) {
        row = staging_bytes / rows >= esize ? esize : 0;
    }
    return row / esize;
}

shoal_status_t shoal_pipe_geometry(const shoal_pipe_shape_t *shape, size_t staging_bytes,
                                   size_t chunk_bytes, shoal_pipe_geom_t *geom_p)
{
    uint32_t rows;
    size_t elems, slot, nslots;
    uint64_t nchunks;

    if (shape->esize == 0 || (shape->in_rows == 0 && shape->out_rows == 0) ||
        (shape->inplace && shape->in_rows != shape->out_rows)) {
        return SHOAL_ERR_INVALID_ARG;
    }
    rows = shape->inplace ? shape->in_rows : shape->in_rows + shape->out_rows;
    elems = shoal_pipe_chunk_elems(shape->esize, rows, staging_bytes, chunk_bytes);
    if (elems == 0) {
        shoal_error(CUDA, "staging of %zu bytes cannot hold one element of %u rows", staging_bytes,
                    rows);
        return SHOAL_ERR_INVALID_ARG;
    }
    nchunks = shape->count == 0 ? 0 : (shape->count + elems - 1) / elems;
    if (nchunks > UINT32_MAX) {
        return SHOAL_ERR_INVALID_ARG;
    }
    if (nchunks == 1) {
        elems = shape->count; /* one chunk: the slot needs only what the row holds */
    }
    slot = SHOAL_MAX(elems * shape->esize * rows, (size_t)1);
    nslots = SHOAL_MIN(staging_bytes / slot, (size_t)SHOAL_PIPE_MAX_SLOTS);
    nslots = SHOAL_MAX(SHOAL_MIN(nslots, (size_t)SHOAL_MAX(nchunks, 1)), (size_t)1);
    *geom_p = (shoal_pipe_geom_t){
        .chunk_elems = elems,
        .nchunks = (uint32_t)nchunks,
        .nslots = (uint32_t)nslots,
        .slot_bytes = slot,
        .out_offset = shape->inplace ? 0 : elems * shape->esize * shape->in_rows,
    };
    return SHOAL_OK;
}

void shoal_pipe_chunk_range(const shoal_pipe_geom_t *g, size_t count, uint32_t c, size_t *off_p,
                            size_t *len_p)
{
    size_t off = (size_t)c * g->chunk_elems;
    *off_p = off;
    *len_p = off >= count ? 0 : SHOAL_MIN(g->chunk_elems, count - off);
}
