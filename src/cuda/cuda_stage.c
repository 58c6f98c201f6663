/*
 * The staging executor: one collective on device buffers through pinned host slots and the
 * host algorithms, driven by the pipeline scheduler (pipe.c). D2H copies run on one internal
 * stream, H2D copies on another (both copy engines), the host collective of chunk c runs on
 * the proxy thread meanwhile. Each slot has one event per direction; completions are polled
 * in chunk order. Every rank cuts a call into the same chunks (the geometry depends only on
 * the call's shape and the SHOAL_CUDA_* sizes, which must match across ranks).
 */
#include "cuda/cuda_int.h"

#include <sched.h>

typedef struct {
    shoal_cuda_comm_t *cc;
    const shoal_cuda_item_t *it;
    shoal_pipe_shape_t shape;
    shoal_pipe_geom_t g;
    shoal_pipe_t p;
    size_t in_pitch, out_pitch;   /* bytes between rows in the user buffers */
} shoal_cuda_stage_t;

/* Rows of the collective's input and output (rank-independent shape) and which stages this
 * rank runs. */
static shoal_status_t shoal_cuda_stage_shape(shoal_cuda_stage_t *s, unsigned *flags_p)
{
    const shoal_coll_args_t *a = &s->it->a;
    struct shoal_comm *comm = s->cc->comm;
    uint32_t n = (uint32_t)comm->nranks;
    size_t es = shoal_dtype_size(a->dtype);
    int root = comm->rank == a->root;

    s->shape = (shoal_pipe_shape_t){.count = a->count, .esize = es, .in_rows = 1,
                                    .out_rows = 1, .inplace = 1};
    s->in_pitch = s->out_pitch = a->count * es;
    *flags_p = SHOAL_PIPE_HAS_D2H | SHOAL_PIPE_HAS_H2D;
    switch (a->type) {
    case SHOAL_COLL_ALLREDUCE:
        break;
    case SHOAL_COLL_BROADCAST:
        *flags_p = root ? *flags_p : SHOAL_PIPE_HAS_H2D;
        break;
    case SHOAL_COLL_REDUCE:
        s->shape.inplace = 0;
        *flags_p = root ? *flags_p : SHOAL_PIPE_HAS_D2H;
        break;
    case SHOAL_COLL_ALLGATHER:
        s->shape.inplace = 0;
        s->shape.out_rows = n;
        break;
    case SHOAL_COLL_REDUCE_SCATTER:
        s->shape.inplace = 0;
        s->shape.in_rows = n;
        break;
    case SHOAL_COLL_ALLTOALL:
        /* row j goes to rank j, row j of the output came from rank j: a chunk takes the same
         * element range of every row, and the host alltoall of that chunk moves it */
        s->shape.inplace = 0;
        s->shape.in_rows = n;
        s->shape.out_rows = n;
        break;
    default:
        shoal_error(CUDA, "collective type %d is not supported on device buffers yet", a->type);
        return SHOAL_ERR_UNSUPPORTED;
    }
    if (a->recvbuf == NULL) {
        *flags_p &= ~SHOAL_PIPE_HAS_H2D;
    }
    if (a->sendbuf == NULL) {
        *flags_p &= ~SHOAL_PIPE_HAS_D2H;
    }
    return SHOAL_OK;
}

static uint8_t *shoal_cuda_slot_in(const shoal_cuda_stage_t *s, uint32_t slot)
{
    return s->cc->staging + (size_t)slot * s->g.slot_bytes;
}

static uint8_t *shoal_cuda_slot_out(const shoal_cuda_stage_t *s, uint32_t slot)
{
    return shoal_cuda_slot_in(s, slot) + s->g.out_offset;
}

static shoal_status_t shoal_cuda_stage_issue(shoal_cuda_stage_t *s, const shoal_pipe_op_t *op)
{
    const shoal_coll_args_t *a = &s->it->a;
    size_t es = s->shape.esize, off, len;
    int dir = op->stage == SHOAL_PIPE_H2D;
    CUstream stream = dir ? s->cc->h2d : s->cc->d2h;

    shoal_pipe_chunk_range(&s->g, a->count, op->chunk, &off, &len);
    if (op->stage == SHOAL_PIPE_NET) {
        shoal_coll_args_t b = *a;
        b.sendbuf = shoal_cuda_slot_in(s, op->slot);
        b.recvbuf = shoal_cuda_slot_out(s, op->slot);
        b.count = len;
        SHOAL_CHECK(shoal_cuda_host.run(s->cc->comm, &b));
        return shoal_pipe_complete(&s->p, SHOAL_PIPE_NET, op->chunk);
    }
    if (dir) {
        SHOAL_CHECK(shoal_cuda_copy_rows(stream, (uint8_t *)a->recvbuf + off * es,
                                         s->it->out.dev, s->out_pitch,
                                         shoal_cuda_slot_out(s, op->slot), 0, len * es, len * es,
                                         s->shape.out_rows));
    } else {
        SHOAL_CHECK(shoal_cuda_copy_rows(stream, shoal_cuda_slot_in(s, op->slot), 0, len * es,
                                         (const uint8_t *)a->sendbuf + off * es, s->it->in.dev,
                                         s->in_pitch, len * es, s->shape.in_rows));
    }
    return SHOAL_CU(cuEventRecord, (s->cc->ev[dir][op->slot], stream));
}

/* Reports every finished copy, oldest first; *progress_p = 1 if any. */
static shoal_status_t shoal_cuda_stage_poll(shoal_cuda_stage_t *s, int *progress_p)
{
    static const shoal_pipe_stage_t stages[2] = {SHOAL_PIPE_D2H, SHOAL_PIPE_H2D};
    shoal_pipe_op_t op;
    for (int d = 0; d < 2; d++) {
        while (shoal_pipe_oldest(&s->p, stages[d], &op)) {
            CUresult r = shoal_cuda_drv.cuEventQuery(s->cc->ev[d][op.slot]);
            if (r == CUDA_ERROR_NOT_READY) {
                break;
            }
            if (r != CUDA_SUCCESS) {
                return SHOAL_CU(cuEventQuery, (s->cc->ev[d][op.slot]));
            }
            SHOAL_CHECK(shoal_pipe_complete(&s->p, stages[d], op.chunk));
            *progress_p = 1;
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_cuda_stage_coll(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *it)
{
    shoal_cuda_stage_t s = {.cc = cc, .it = it};
    uint64_t deadline = shoal_deadline_ns(cc->comm->timeout_ms);
    unsigned flags, spins = 0;

    if (it->a.type == SHOAL_COLL_BARRIER) {
        return shoal_cuda_host.run(cc->comm, &it->a);
    }
    SHOAL_CHECK(shoal_cuda_stage_shape(&s, &flags));
    SHOAL_CHECK(shoal_pipe_geometry(&s.shape, cc->staging_size, shoal_cuda_config.chunk_size,
                                    &s.g));
    SHOAL_CHECK(shoal_pipe_init(&s.p, s.g.nchunks, s.g.nslots, flags));
    for (;;) {
        shoal_pipe_op_t op;
        int progress = 0;
        SHOAL_CHECK(shoal_cuda_stage_poll(&s, &progress));
        shoal_pipe_next_t nx = shoal_pipe_next(&s.p, &op);
        if (nx == SHOAL_PIPE_DONE) {
            return SHOAL_OK;
        }
        if (nx == SHOAL_PIPE_ISSUE) {
            SHOAL_CHECK(shoal_cuda_stage_issue(&s, &op));
            spins = 0;
            continue;
        }
        if (!progress) {
            SHOAL_CHECK(shoal_chan_idle(cc->comm, &spins, deadline, "staging copies"));
        }
    }
}

/* ---- send / recv ------------------------------------------------------------------------- */

/* Chunk k of n p2p items at once: D2H of the sends, post every receive and send, wait,
 * H2D of the receives. Chunk length = SHOAL_CUDA_CHUNK_SIZE bytes on both sides. */
static shoal_status_t shoal_cuda_p2p_round(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *items,
                                           int n, const uint32_t *seqs, const size_t *offs,
                                           size_t chunk, uint32_t k, shoal_tl_req_t *reqs,
                                           shoal_tl_req_t **rp, int *peers)
{
    int nreq = 0;
    for (int i = 0; i < n; i++) {
        const shoal_coll_args_t *a = &items[i].a;
        size_t bytes = a->count * shoal_dtype_size(a->dtype), off = (size_t)k * chunk;
        uint8_t *slot = cc->staging + offs[i];
        if (a->type == SHOAL_COLL_SEND && (off < bytes || (k == 0 && bytes == 0))) {
            SHOAL_CHECK(shoal_cuda_copy_rows(cc->d2h, slot, 0, 0, (const uint8_t *)a->sendbuf + off,
                                             items[i].in.dev, 0, SHOAL_MIN(chunk, bytes - off), 1));
        }
    }
    SHOAL_CHECK(shoal_cuda_stream_wait(cc, cc->d2h, "send staging"));
    for (int i = 0; i < n; i++) {
        const shoal_coll_args_t *a = &items[i].a;
        size_t bytes = a->count * shoal_dtype_size(a->dtype), off = (size_t)k * chunk;
        size_t len = off < bytes ? SHOAL_MIN(chunk, bytes - off) : 0;
        uint8_t *slot = cc->staging + offs[i];
        if (off >= bytes && !(k == 0 && bytes == 0)) {
            continue;
        }
        peers[nreq] = a->root;
        rp[nreq] = &reqs[nreq];
        if (a->type == SHOAL_COLL_RECV) {
            SHOAL_CHECK(shoal_chan_irecv(cc->comm, a->root, slot, len, seqs[i], SHOAL_P2P_STEP, k,
                                         &reqs[nreq]));
        } else {
            SHOAL_CHECK(shoal_chan_isend(cc->comm, a->root, slot, len, seqs[i], SHOAL_P2P_STEP, k,
                                         &reqs[nreq]));
        }
        nreq++;
    }
    SHOAL_CHECK(shoal_chan_waitall(cc->comm, rp, peers, nreq));
    for (int i = 0; i < n; i++) {
        const shoal_coll_args_t *a = &items[i].a;
        size_t bytes = a->count * shoal_dtype_size(a->dtype), off = (size_t)k * chunk;
        if (a->type == SHOAL_COLL_RECV && off < bytes) {
            SHOAL_CHECK(shoal_cuda_copy_rows(cc->h2d, (uint8_t *)a->recvbuf + off,
                                             items[i].out.dev, 0, cc->staging + offs[i],
                                             0, 0, SHOAL_MIN(chunk, bytes - off), 1));
        }
    }
    return shoal_cuda_stream_wait(cc, cc->h2d, "receive staging");
}

shoal_status_t shoal_cuda_stage_p2p(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *items, int n)
{
    size_t chunk = SHOAL_MAX(shoal_cuda_config.chunk_size / 16 * 16, (size_t)16);
    size_t offs[64], used = 0;
    uint32_t rounds = 1, seqs[64];
    shoal_tl_req_t reqs[64];
    shoal_tl_req_t *rp[64];
    int peers[64];

    /* At most 64 items per round set, each with a slot of the staging as large as its round's
     * bytes: a chunk, or the whole message where it is shorter (a group of many messages shorter
     * than a chunk is posted at once, as the API promises; the chunk itself must stay the same
     * on every rank, which cuts the messages the same way). */
    for (int i = 0; i < n && i < 64; i++) {
        const shoal_coll_args_t *a = &items[i].a;
        offs[i] = used;
        used += SHOAL_ALIGN_UP(SHOAL_MIN(chunk, a->count * shoal_dtype_size(a->dtype)), 16);
    }
    if (n > 64 || used > cc->staging_size) {
        int half = n / 2 > 0 ? n / 2 : 1;
        if (n == 1) {
            shoal_error(CUDA, "SHOAL_CUDA_CHUNK_SIZE %zu exceeds SHOAL_CUDA_STAGING_SIZE %zu",
                        chunk, cc->staging_size);
            return SHOAL_ERR_INVALID_ARG;
        }
        shoal_warn_once(CUDA, "a group of %d sends/receives does not fit the staging at once; "
                        "it runs in parts (a part must not depend on a later one)", n);
        SHOAL_CHECK(shoal_cuda_stage_p2p(cc, items, half));
        return shoal_cuda_stage_p2p(cc, items + half, n - half);
    }
    for (int i = 0; i < n; i++) {
        const shoal_coll_args_t *a = &items[i].a;
        size_t bytes = a->count * shoal_dtype_size(a->dtype);
        shoal_chan_t *ch = &cc->comm->chans[a->root];
        seqs[i] = a->type == SHOAL_COLL_SEND ? ch->p2p_send_seq++ : ch->p2p_recv_seq++;
        rounds = SHOAL_MAX(rounds, (uint32_t)((bytes + chunk - 1) / chunk));
    }
    for (uint32_t k = 0; k < rounds; k++) {
        SHOAL_CHECK(shoal_cuda_p2p_round(cc, items, n, seqs, offs, chunk, k, reqs, rp, peers));
    }
    return SHOAL_OK;
}
