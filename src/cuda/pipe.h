/*
 * The staging pipeline of the CUDA layer as pure logic, without a CUDA call: chunks of a
 * device-buffer collective flow device-to-host (D2H) -> network/reduce (NET) -> host-to-device
 * (H2D) through a bounded ring of pinned staging slots, the stages of successive chunks
 * overlapping. The executor (cuda_stage.c) asks shoal_pipe_next() what to issue, issues it
 * (async copies on the copy streams, the blocking host collective for NET) and reports each
 * completion with shoal_pipe_complete(). tests/gpu/test_pipeline.c drives it on the CPU.
 *
 * Rules the scheduler enforces:
 * - chunk c uses slot c % nslots; a slot is owned by one chunk from its D2H issue (or NET
 *   issue, without D2H) until its H2D completes (or NET, without H2D): at most nslots chunks
 *   hold staging memory at once;
 * - per stage, chunks are issued and complete in chunk order (one copy stream per direction,
 *   the host collectives in the same order on every rank);
 * - NET(c) after D2H(c) completed and after NET(c-1) completed; H2D(c) after NET(c);
 * - priority: H2D (frees a slot) > D2H (fills the pipe) > NET.
 */
#ifndef SHOAL_CUDA_PIPE_H
#define SHOAL_CUDA_PIPE_H

#include "util/util.h"

typedef enum {
    SHOAL_PIPE_D2H = 0,
    SHOAL_PIPE_NET,
    SHOAL_PIPE_H2D,
    SHOAL_PIPE_NSTAGES
} shoal_pipe_stage_t;

typedef enum {
    SHOAL_PIPE_ISSUE = 0, /* *op_p says what to issue */
    SHOAL_PIPE_WAIT,      /* nothing can be issued until an issued stage completes */
    SHOAL_PIPE_DONE       /* every chunk went through every stage */
} shoal_pipe_next_t;

#define SHOAL_PIPE_HAS_D2H 1u
#define SHOAL_PIPE_HAS_H2D 2u

typedef struct {
    shoal_pipe_stage_t stage;
    uint32_t chunk;
    uint32_t slot;
} shoal_pipe_op_t;

typedef struct {
    uint32_t nchunks;
    uint32_t nslots;
    unsigned flags;                        /* SHOAL_PIPE_HAS_* */
    uint32_t issued[SHOAL_PIPE_NSTAGES];   /* chunks issued per stage (a prefix) */
    uint32_t done[SHOAL_PIPE_NSTAGES];     /* chunks completed per stage (a prefix) */
} shoal_pipe_t;

/* nchunks >= 0, nslots >= 1. A stage absent from flags counts as completed at once. */
SHOAL_HIDDEN shoal_status_t shoal_pipe_init(shoal_pipe_t *p, uint32_t nchunks, uint32_t nslots,
                                            unsigned flags);
SHOAL_HIDDEN shoal_pipe_next_t shoal_pipe_next(shoal_pipe_t *p, shoal_pipe_op_t *op_p);
/* The oldest issued, not completed chunk of stage; 0 if there is none (then *op_p unset). */
SHOAL_HIDDEN int shoal_pipe_oldest(const shoal_pipe_t *p, shoal_pipe_stage_t stage,
                                   shoal_pipe_op_t *op_p);
/* Stage of chunk completed. ERR_INTERNAL if not the oldest in-flight chunk of that stage. */
SHOAL_HIDDEN shoal_status_t shoal_pipe_complete(shoal_pipe_t *p, shoal_pipe_stage_t stage,
                                                uint32_t chunk);
/* Chunks holding a staging slot now. */
SHOAL_HIDDEN uint32_t shoal_pipe_slots_busy(const shoal_pipe_t *p);
SHOAL_HIDDEN const char *shoal_pipe_stage_name(shoal_pipe_stage_t stage);

/* Chunk geometry of one collective on staging memory. A chunk covers elems elements of each
 * of in_rows input rows (gathered contiguously into the slot) and produces out_rows rows;
 * inplace: the output rows overwrite the input rows in the slot (same count). */
typedef struct {
    size_t count;          /* elements per row */
    size_t esize;          /* bytes per element */
    uint32_t in_rows;      /* 0: no D2H (receive-only, broadcast non-root) */
    uint32_t out_rows;     /* 0: no H2D (send-only, reduce non-root) */
    int inplace;
} shoal_pipe_shape_t;

typedef struct {
    size_t chunk_elems;    /* elements per row per chunk (the last chunk may be shorter) */
    uint32_t nchunks;
    uint32_t nslots;
    size_t slot_bytes;     /* bytes per slot: input region then output region */
    size_t out_offset;     /* offset of the output region in a slot (0 when inplace) */
} shoal_pipe_geom_t;

#define SHOAL_PIPE_MAX_SLOTS 64

/* Cuts shape into chunks: chunk_bytes per row at most (rounded down to 16-byte multiples of
 * whole elements), nslots * slot_bytes <= staging_bytes with 2 <= nslots <= MAX_SLOTS where
 * the staging allows (chunks shrink to keep 2 slots; 1 slot only when a single 16-byte chunk
 * does not fit twice). ERR_INVALID_ARG when not even one element per row fits. */
SHOAL_HIDDEN shoal_status_t shoal_pipe_geometry(const shoal_pipe_shape_t *shape,
                                                size_t staging_bytes, size_t chunk_bytes,
                                                shoal_pipe_geom_t *geom_p);
/* Element range of chunk c: [*off_p, *off_p + *len_p). */
SHOAL_HIDDEN void shoal_pipe_chunk_range(const shoal_pipe_geom_t *g, size_t count, uint32_t c,
                                         size_t *off_p, size_t *len_p);

/* Stream-task flag slots: task seq uses slot seq % nslots; it may be issued only once the
 * task nslots before it completed (done_seq counts completed tasks, in order). */
static inline int shoal_pipe_flag_slot_free(uint64_t seq, uint64_t done_seq, uint32_t nslots)
{
    return seq < done_seq + nslots;
}

#endif
