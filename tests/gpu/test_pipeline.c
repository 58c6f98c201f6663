/*
 * CPU unit test of the CUDA layer's staging pipeline scheduler (src/cuda/pipe.c): stage order
 * per chunk, in-order completion per stage, bounded slots with exclusive ownership, overlap of
 * successive chunks (simulated time), receive-only / send-only pipelines, misuse rejected, and
 * the chunk geometry (bounded staging, the same cut on every rank). No GPU needed.
 */
#include "cuda/pipe.h"
#include "tests/tap.h"

#include <stdlib.h>
#include <string.h>

/* A simulated executor: D2H and H2D take d2h_t / h2d_t ticks on their own stream (one at a
 * time, in order), NET takes net_t ticks and blocks the executor. Returns the total time, or
 * -1 on any rule violation (described through tap_diag). */
typedef struct {
    unsigned d2h_t, net_t, h2d_t;
    unsigned seed;          /* != 0: random jitter of the copy times */
} sim_cfg_t;

typedef struct {
    uint32_t chunk;
    long end;               /* completion time */
} sim_inflight_t;

static unsigned sim_rand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

static int sim_fail(const char *what, uint32_t chunk)
{
    tap_diag("violation: %s (chunk %u)", what, chunk);
    return -1;
}

/* A copy of chunk finished (dir 0: D2H, 1: H2D): report it, check it was the oldest. */
static int sim_complete(shoal_pipe_t *p, uint32_t chunk, int dir, int64_t *owner, int *stage_of,
                        uint32_t nslots)
{
    shoal_pipe_op_t old;
    shoal_pipe_stage_t st = dir ? SHOAL_PIPE_H2D : SHOAL_PIPE_D2H;
    if (!shoal_pipe_oldest(p, st, &old) || old.chunk != chunk) {
        return sim_fail("oldest in-flight chunk mismatch", chunk);
    }
    if (shoal_pipe_complete(p, st, chunk) != SHOAL_OK) {
        return -1;
    }
    stage_of[chunk] = dir ? 3 : 1;
    if (dir) {
        owner[chunk % nslots] = -1;
    }
    return 0;
}

/* slot_owner[s]: chunk that holds slot s or -1; stage_of[c]: last stage done for chunk c. */
static long sim_run(uint32_t nchunks, uint32_t nslots, unsigned flags, const sim_cfg_t *cfg,
                    uint32_t *max_busy_p)
{
    shoal_pipe_t p;
    shoal_pipe_op_t op;
    long now = 0, stream_free[2] = {0, 0};
    int64_t *owner = malloc(nslots * sizeof(*owner));
    int *stage_of = calloc(nchunks + 1, sizeof(*stage_of));
    sim_inflight_t *q[2];
    uint32_t qh[2] = {0, 0}, qt[2] = {0, 0}, max_busy = 0;
    unsigned seed = cfg->seed;
    int has_d2h = (flags & SHOAL_PIPE_HAS_D2H) != 0, has_h2d = (flags & SHOAL_PIPE_HAS_H2D) != 0;
    long ret = -1;

    q[0] = calloc(nchunks + 1, sizeof(sim_inflight_t));
    q[1] = calloc(nchunks + 1, sizeof(sim_inflight_t));
    for (uint32_t s = 0; s < nslots; s++) {
        owner[s] = -1;
    }
    if (shoal_pipe_init(&p, nchunks, nslots, flags) != SHOAL_OK) {
        goto out;
    }
    for (;;) {
        shoal_pipe_next_t nx;
        /* Like the executor: report every copy already finished before asking. */
        for (int d = 0; d < 2; d++) {
            while (qh[d] < qt[d] && q[d][qh[d]].end <= now) {
                if (sim_complete(&p, q[d][qh[d]++].chunk, d, owner, stage_of, nslots) != 0) {
                    goto out;
                }
            }
        }
        nx = shoal_pipe_next(&p, &op);
        if (nx == SHOAL_PIPE_DONE) {
            break;
        }
        if (nx == SHOAL_PIPE_ISSUE) {
            int copy = op.stage != SHOAL_PIPE_NET;
            int dir = op.stage == SHOAL_PIPE_H2D;
            int first = op.stage == (has_d2h ? SHOAL_PIPE_D2H : SHOAL_PIPE_NET);
            if (op.slot != op.chunk % nslots || op.chunk >= nchunks) {
                sim_fail("bad slot or chunk", op.chunk);
                goto out;
            }
            if (first) {
                if (owner[op.slot] != -1) {
                    sim_fail("slot still owned by another chunk", op.chunk);
                    goto out;
                }
                owner[op.slot] = op.chunk;
            } else if (owner[op.slot] != (int64_t)op.chunk) {
                sim_fail("stage runs on a slot the chunk does not own", op.chunk);
                goto out;
            }
            /* stage order: D2H(1) -> NET(2) -> H2D(3) */
            if ((op.stage == SHOAL_PIPE_NET && has_d2h && stage_of[op.chunk] != 1) ||
                (op.stage == SHOAL_PIPE_H2D && stage_of[op.chunk] != 2) ||
                (op.stage == SHOAL_PIPE_D2H && stage_of[op.chunk] != 0)) {
                sim_fail("stage issued before the previous stage completed", op.chunk);
                goto out;
            }
            if (copy) {
                unsigned t = dir ? cfg->h2d_t : cfg->d2h_t;
                long start = SHOAL_MAX(now, stream_free[dir]);
                if (cfg->seed != 0) {
                    t += sim_rand(&seed) % (t + 1);
                }
                stream_free[dir] = start + t;
                q[dir][qt[dir]++] = (sim_inflight_t){.chunk = op.chunk, .end = start + t};
            } else {
                now += cfg->net_t; /* blocking host collective */
                stage_of[op.chunk] = 2;
                if (shoal_pipe_complete(&p, SHOAL_PIPE_NET, op.chunk) != SHOAL_OK) {
                    goto out;
                }
                if (!has_h2d) {
                    owner[op.slot] = -1;
                }
            }
            max_busy = SHOAL_MAX(max_busy, shoal_pipe_slots_busy(&p));
            continue;
        }
        /* WAIT: advance time to the earliest copy completion and report it. */
        {
            int dir = -1;
            for (int d = 0; d < 2; d++) {
                if (qh[d] < qt[d] && (dir < 0 || q[d][qh[d]].end < q[dir][qh[dir]].end)) {
                    dir = d;
                }
            }
            if (dir < 0) {
                sim_fail("scheduler waits with nothing in flight", 0);
                goto out;
            }
            sim_inflight_t *f = &q[dir][qh[dir]++];
            now = SHOAL_MAX(now, f->end);
            if (sim_complete(&p, f->chunk, dir, owner, stage_of, nslots) != 0) {
                goto out;
            }
        }
    }
    for (uint32_t c = 0; c < nchunks; c++) {
        if (stage_of[c] != (has_h2d ? 3 : 2)) {
            sim_fail("chunk did not go through every stage", c);
            goto out;
        }
    }
    if (shoal_pipe_slots_busy(&p) != 0) {
        sim_fail("slots still busy at the end", 0);
        goto out;
    }
    ret = now;
out:
    *max_busy_p = max_busy;
    free(owner);
    free(stage_of);
    free(q[0]);
    free(q[1]);
    return ret;
}

static void test_order_and_bounds(void)
{
    static const uint32_t nchunks[] = {0, 1, 2, 3, 7, 64, 257};
    static const uint32_t nslots[] = {1, 2, 3, 4, 8};
    static const unsigned flags[] = {SHOAL_PIPE_HAS_D2H | SHOAL_PIPE_HAS_H2D, SHOAL_PIPE_HAS_D2H,
                                     SHOAL_PIPE_HAS_H2D, 0};
    int bad = 0, bound_bad = 0, n = 0;
    for (size_t a = 0; a < SHOAL_ARRAY_SIZE(nchunks); a++) {
        for (size_t b = 0; b < SHOAL_ARRAY_SIZE(nslots); b++) {
            for (size_t f = 0; f < SHOAL_ARRAY_SIZE(flags); f++) {
                for (unsigned seed = 0; seed < 4; seed++) {
                    sim_cfg_t cfg = {.d2h_t = 3, .net_t = 5, .h2d_t = 2, .seed = seed};
                    uint32_t busy;
                    long t = sim_run(nchunks[a], nslots[b], flags[f], &cfg, &busy);
                    n++;
                    if (t < 0) {
                        tap_diag("nchunks %u nslots %u flags %u seed %u failed", nchunks[a],
                                 nslots[b], flags[f], seed);
                        bad++;
                    }
                    if (busy > nslots[b]) {
                        bound_bad++;
                    }
                }
            }
        }
    }
    tap_is_int(bad, 0, "stage order, in-order completion, slot ownership (%d runs)", n);
    tap_is_int(bound_bad, 0, "never more chunks in staging than slots");
}

static void test_overlap(void)
{
    sim_cfg_t cfg = {.d2h_t = 10, .net_t = 10, .h2d_t = 10};
    uint32_t busy;
    long serial = 64L * 30;
    long t3 = sim_run(64, 3, SHOAL_PIPE_HAS_D2H | SHOAL_PIPE_HAS_H2D, &cfg, &busy);
    long t1 = sim_run(64, 1, SHOAL_PIPE_HAS_D2H | SHOAL_PIPE_HAS_H2D, &cfg, &busy);
    /* With 3 slots the three stages of successive chunks overlap: ~ (64 + 2) * 10. */
    tap_ok(t3 > 0 && t3 <= 66 * 10 + 10, "3 slots: 64 chunks take %ld ticks (overlapped ~660)",
           t3);
    tap_is_int(t1, serial, "1 slot: no overlap, 64 x 30 ticks");
    tap_ok(busy <= 1, "1 slot: one chunk in staging at a time");
    cfg = (sim_cfg_t){.d2h_t = 4, .net_t = 20, .h2d_t = 4};
    t3 = sim_run(32, 4, SHOAL_PIPE_HAS_D2H | SHOAL_PIPE_HAS_H2D, &cfg, &busy);
    tap_ok(t3 > 0 && t3 <= 32 * 20 + 4 + 4 + 4, "network-bound: copies hidden (%ld ticks)", t3);
}

static void test_misuse(void)
{
    shoal_pipe_t p;
    shoal_pipe_op_t op;
    tap_is_int(shoal_pipe_init(&p, 4, 0, 0), SHOAL_ERR_INVALID_ARG, "0 slots rejected");
    tap_is_int(shoal_pipe_init(&p, 4, 2, 8u), SHOAL_ERR_INVALID_ARG, "unknown flag rejected");
    shoal_pipe_init(&p, 4, 2, SHOAL_PIPE_HAS_D2H | SHOAL_PIPE_HAS_H2D);
    tap_is_int(shoal_pipe_complete(&p, SHOAL_PIPE_D2H, 0), SHOAL_ERR_INTERNAL,
               "completion of a stage never issued is rejected");
    tap_is_int(shoal_pipe_next(&p, &op), SHOAL_PIPE_ISSUE, "first op issued");
    tap_ok(op.stage == SHOAL_PIPE_D2H && op.chunk == 0 && op.slot == 0, "it is D2H of chunk 0");
    shoal_pipe_next(&p, &op);
    tap_ok(op.stage == SHOAL_PIPE_D2H && op.chunk == 1 && op.slot == 1, "then D2H of chunk 1");
    tap_is_int(shoal_pipe_next(&p, &op), SHOAL_PIPE_WAIT, "2 slots busy, chunk 0 not staged: wait");
    tap_is_int(shoal_pipe_complete(&p, SHOAL_PIPE_D2H, 1), SHOAL_ERR_INTERNAL,
               "out-of-order completion rejected");
    tap_is_int(shoal_pipe_complete(&p, SHOAL_PIPE_NET, 0), SHOAL_ERR_INTERNAL,
               "completion of an unissued NET rejected");
    tap_is_int(shoal_pipe_complete(&p, SHOAL_PIPE_D2H, 0), SHOAL_OK, "in-order completion");
    tap_is_int(shoal_pipe_next(&p, &op), SHOAL_PIPE_ISSUE, "NET of chunk 0 ready");
    tap_ok(op.stage == SHOAL_PIPE_NET && op.chunk == 0, "it is NET of chunk 0");
    tap_is_int(shoal_pipe_next(&p, &op), SHOAL_PIPE_WAIT, "one NET at a time");
    shoal_pipe_complete(&p, SHOAL_PIPE_NET, 0);
    shoal_pipe_next(&p, &op);
    tap_ok(op.stage == SHOAL_PIPE_H2D && op.chunk == 0, "H2D before anything else");
    tap_is_int(shoal_pipe_next(&p, &op), SHOAL_PIPE_WAIT,
               "D2H of chunk 2 waits for slot 0 (H2D of chunk 0 in flight)");
    shoal_pipe_complete(&p, SHOAL_PIPE_H2D, 0);
    shoal_pipe_next(&p, &op);
    tap_ok(op.stage == SHOAL_PIPE_D2H && op.chunk == 2 && op.slot == 0,
           "slot 0 reused by chunk 2 once chunk 0 left it");
    shoal_pipe_init(&p, 0, 1, SHOAL_PIPE_HAS_D2H);
    tap_is_int(shoal_pipe_next(&p, &op), SHOAL_PIPE_DONE, "0 chunks: done at once");
}

static void test_geometry(void)
{
    static const size_t counts[] = {0, 1, 3, 17, 1000, 65536, 1000003, (size_t)1 << 28};
    static const size_t esizes[] = {1, 2, 4, 8};
    static const size_t stagings[] = {256, 4096, 1 << 20, 32 << 20};
    static const size_t chunks[] = {16, 4096, 1 << 20};
    static const shoal_pipe_shape_t shapes[] = {
        {.in_rows = 1, .out_rows = 1, .inplace = 1},    /* allreduce, broadcast */
        {.in_rows = 1, .out_rows = 1},                  /* reduce */
        {.in_rows = 1, .out_rows = 8},                  /* allgather, 8 ranks */
        {.in_rows = 8, .out_rows = 1},                  /* reduce-scatter, 8 ranks */
        {.in_rows = 8, .out_rows = 8},                  /* alltoall, 8 ranks */
    };
    int bad = 0, n = 0, cover_bad = 0;
    for (size_t a = 0; a < SHOAL_ARRAY_SIZE(counts); a++)
        for (size_t b = 0; b < SHOAL_ARRAY_SIZE(esizes); b++)
            for (size_t c = 0; c < SHOAL_ARRAY_SIZE(stagings); c++)
                for (size_t d = 0; d < SHOAL_ARRAY_SIZE(chunks); d++)
                    for (size_t e = 0; e < SHOAL_ARRAY_SIZE(shapes); e++) {
                        shoal_pipe_shape_t sh = shapes[e];
                        shoal_pipe_geom_t g, g2;
                        uint32_t rows = sh.inplace ? sh.in_rows : sh.in_rows + sh.out_rows;
                        sh.count = counts[a];
                        sh.esize = esizes[b];
                        n++;
                        if (shoal_pipe_geometry(&sh, stagings[c], chunks[d], &g) != SHOAL_OK) {
                            /* only when one element per row cannot fit */
                            bad += stagings[c] / rows >= sh.esize;
                            continue;
                        }
                        if ((size_t)g.nslots * g.slot_bytes > stagings[c] || g.nslots < 1 ||
                            g.nslots > SHOAL_PIPE_MAX_SLOTS ||
                            g.chunk_elems * sh.esize * rows > g.slot_bytes ||
                            (g.nchunks > 1 && g.chunk_elems * sh.esize > chunks[d] &&
                             g.chunk_elems * sh.esize > 16) ||
                            (g.nchunks > 1 && stagings[c] / rows >= 32 &&
                             (g.chunk_elems * sh.esize) % 16 != 0) ||
                            (g.nchunks > 1 && g.nslots < 2 && stagings[c] / rows >= 32) ||
                            g.out_offset + (sh.inplace ? 0 : g.chunk_elems * sh.esize *
                                                                 sh.out_rows) > g.slot_bytes) {
                            tap_diag("count %zu esize %zu staging %zu chunk %zu shape %zu: elems "
                                     "%zu nchunks %u nslots %u slot %zu", sh.count, sh.esize,
                                     stagings[c], chunks[d], e, g.chunk_elems, g.nchunks,
                                     g.nslots, g.slot_bytes);
                            bad++;
                        }
                        /* chunks cover [0, count) exactly */
                        size_t off, len, sum = 0;
                        for (uint32_t k = 0; k < g.nchunks && k < 4; k++) {
                            shoal_pipe_chunk_range(&g, sh.count, k, &off, &len);
                            cover_bad += off != (size_t)k * g.chunk_elems || len == 0;
                        }
                        if (g.nchunks > 0) {
                            shoal_pipe_chunk_range(&g, sh.count, g.nchunks - 1, &off, &len);
                            sum = off + len;
                        }
                        cover_bad += sum != sh.count;
                        /* deterministic: every rank computes the same cut */
                        shoal_pipe_geometry(&sh, stagings[c], chunks[d], &g2);
                        bad += memcmp(&g, &g2, sizeof(g)) != 0;
                    }
    tap_is_int(bad, 0, "geometry: staging bounded, 16-byte chunks, >= 2 slots (%d shapes)", n);
    tap_is_int(cover_bad, 0, "geometry: chunks cover every element once");
    shoal_pipe_shape_t bad_shape = {.count = 10, .esize = 4, .in_rows = 1, .out_rows = 2,
                                    .inplace = 1};
    shoal_pipe_geom_t g;
    tap_is_int(shoal_pipe_geometry(&bad_shape, 4096, 4096, &g), SHOAL_ERR_INVALID_ARG,
               "in-place with different row counts rejected");
}

static void test_flag_slots(void)
{
    tap_ok(shoal_pipe_flag_slot_free(0, 0, 4), "flag slot: first task");
    tap_ok(shoal_pipe_flag_slot_free(3, 0, 4), "flag slot: 4 tasks in flight fit 4 slots");
    tap_ok(!shoal_pipe_flag_slot_free(4, 0, 4), "flag slot: the 5th waits for the 1st");
    tap_ok(shoal_pipe_flag_slot_free(4, 1, 4), "flag slot: free once the 1st completed");
}

int main(void)
{
    test_order_and_bounds();
    test_overlap();
    test_misuse();
    test_geometry();
    test_flag_slots();
    return tap_done();
}
