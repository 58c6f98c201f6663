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

/* n p2p items at once, each one message of its whole length: the host path sends and
 * receives them so (src/coll/others.c, shoal_p2p_run), and a host buffer on one side must
 * match a device buffer on the other (cut into SHOAL_CUDA_CHUNK_SIZE messages here, a send
 * larger than a chunk from host memory into device memory, or the reverse, failed both ranks'
 * communicators with "message of N bytes, expected M"). A device buffer goes through the
 * staging where the batch still fits it, else through a host buffer of its own (so every
 * message of a group is posted at once, whatever its size); a host buffer is sent from or
 * received into directly. D2H of the sends, post every receive and send, wait, H2D of the
 * receives. */
shoal_status_t shoal_cuda_stage_p2p(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *items, int n)
{
    shoal_tl_req_t *reqs = calloc((size_t)n, sizeof(*reqs));
    shoal_tl_req_t **rp = calloc((size_t)n, sizeof(*rp));
    uint8_t **bufs = calloc((size_t)n, sizeof(*bufs)), **own = calloc((size_t)n, sizeof(*own));
    int *peers = calloc((size_t)n, sizeof(*peers)), nreq = 0, copying = 0;
    size_t used = 0;
    shoal_status_t st = SHOAL_OK, st2;

    if (reqs == NULL || rp == NULL || bufs == NULL || own == NULL || peers == NULL) {
        st = SHOAL_ERR_NO_MEMORY;
    }
    for (int i = 0; i < n && st == SHOAL_OK; i++) {
        const shoal_coll_args_t *a = &items[i].a;
        size_t bytes = a->count * shoal_dtype_size(a->dtype);
        int send = a->type == SHOAL_COLL_SEND;
        if (!(send ? items[i].in.dev : items[i].out.dev)) {
            bufs[i] = send ? (uint8_t *)(uintptr_t)a->sendbuf : (uint8_t *)a->recvbuf;
        } else if (bytes <= cc->staging_size - used) {
            bufs[i] = cc->staging + used;
            used += SHOAL_MIN(SHOAL_ALIGN_UP(bytes, 16), cc->staging_size - used);
        } else if ((own[i] = bufs[i] = malloc(bytes)) == NULL) {
            shoal_error(CUDA, "rank %d: no memory for a host copy of a %zu-byte %s", cc->comm->rank,
                        bytes, send ? "send" : "receive");
            st = SHOAL_ERR_NO_MEMORY;
        }
        if (st == SHOAL_OK && send && items[i].in.dev) {
            copying = 1;
            st = shoal_cuda_copy_rows(cc->d2h, bufs[i], 0, 0, a->sendbuf, 1, 0, bytes, 1);
        }
    }
    if (st == SHOAL_OK && copying) {
        st = shoal_cuda_stream_wait(cc, cc->d2h, "send staging");
        copying = st != SHOAL_OK;
    }
    for (int i = 0; i < n && st == SHOAL_OK; i++) {
        const shoal_coll_args_t *a = &items[i].a;
        size_t bytes = a->count * shoal_dtype_size(a->dtype);
        shoal_chan_t *ch = &cc->comm->chans[a->root];
        if (a->type == SHOAL_COLL_RECV) {
            st = shoal_chan_irecv(cc->comm, a->root, bufs[i], bytes, ch->p2p_recv_seq++,
                                  SHOAL_P2P_STEP, 0, &reqs[nreq]);
        } else {
            st = shoal_chan_isend(cc->comm, a->root, bufs[i], bytes, ch->p2p_send_seq++,
                                  SHOAL_P2P_STEP, 0, &reqs[nreq]);
        }
        if (st == SHOAL_OK) {
            peers[nreq] = a->root;
            rp[nreq] = &reqs[nreq];
            nreq++;
        }
    }
    /* what was posted is waited for even after a failed post (that failed the communicator,
     * which completes them at once), before its buffers go */
    st2 = nreq > 0 ? shoal_chan_waitall(cc->comm, rp, peers, nreq) : SHOAL_OK;
    st = st != SHOAL_OK ? st : st2;
    for (int i = 0; i < n && st == SHOAL_OK; i++) {
        const shoal_coll_args_t *a = &items[i].a;
        if (a->type == SHOAL_COLL_RECV && items[i].out.dev) {
            copying = 1;
            st = shoal_cuda_copy_rows(cc->h2d, a->recvbuf, 1, 0, bufs[i], 0, 0,
                                      a->count * shoal_dtype_size(a->dtype), 1);
        }
    }
    if (st == SHOAL_OK && copying) {
        st = shoal_cuda_stream_wait(cc, cc->h2d, "receive staging");
        copying = st != SHOAL_OK;
    }
    /* a copy that was not seen to end (a failed wait: the communicator failed) may still use
     * the host copies: they are kept then */
    for (int i = 0; i < n && own != NULL && !copying; i++) {
        free(own[i]);
    }
    free(reqs);
    free(rp);
    free(bufs);
    free(own);
    free(peers);
    return st;
}
