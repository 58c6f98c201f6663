/*
 * Entry of the CUDA layer: which calls it takes, groups, and stream ordering.
 *
 * A stream-ordered call (stream != NULL) takes a task number seq and enqueues two things on
 * the caller's stream: a start signal (cuStreamWriteValue32 of seq into a host-mapped flag of
 * slot seq % SLOTS, or a host function that stores it and returns) and a wait
 * (cuStreamWaitValue32 until the host-mapped done word reaches seq, or the one-thread kernel
 * shoal_stream_wait polling that word; never a host function that blocks: it would hold the
 * driver's callback thread, and every host function of every stream behind it). It
 * then posts a detached proxy task, in ticket order with every other call of the
 * communicator, and returns. The proxy waits for the start flag (the stream reached the
 * call), runs the batch (staging pipeline, IPC kernels or NCCL on internal streams), waits for
 * those, and stores seq into the done word: the stream moves on. The host never blocks.
 * A failed task still releases the stream; the communicator then carries the error
 * (shoal_comm_last_error, and the next call returns it).
 * SHOAL_CUDA_SYNC=host gives that up for ranks sharing a GPU without MPS, whose device-side
 * waits cost the GPU's time slices: the call records an event on the stream, waits on the
 * host until it completes (deadline, abort), runs the batch on the caller's thread and
 * returns with the result in place; nothing waits on the device.
 * The legacy default stream (CU_STREAM_LEGACY: cudaStreamLegacy, PyTorch's default stream)
 * always takes that way: on an H200 (2026-12-04), PyTorch's CUDA tests hung at the first
 * collective there that moved device bytes, on 1 and on 2 ranks, while the library's own
 * tests, on created streams, pass. Either the legacy stream's implicit synchronization with
 * the rest of the context stalled the call's work on the internal streams, or the blocking
 * read that followed (t.cpu(), waiting behind the call's value wait) held the driver while
 * the proxy needed it; perf/gpu_share_probe.cu parts 4 and 6 tell these apart. The host
 * wait avoids both on that stream.
 *
 * Metering (src/meter/meter.h): each call of a task counts one op of its collective; the
 * task's time is measured in stream order, on the proxy thread (which holds the ticket, so it
 * is the page's single writer): from the moment the stream reached the call (the start flag
 * seen; or the proxy got to the task, if the stream was there first) to the release of the
 * stream, device work included. The stream's earlier work, and the time between the host's
 * enqueue and the stream's arrival, are not the collective's. A blocking device call counts
 * from holding its ticket and the device's earlier work done, to its return. Bytes: the
 * staging path moves them through the host transports (counted there), the IPC path counts
 * its device-to-device reads (cuda_ipc.c).
 */
#include "cuda/cuda_int.h"
#include "meter/meter.h"
#include "util/trec.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    shoal_cuda_comm_t *cc;
    uint64_t seq;               /* 0: blocking call (no stream) */
    int n;
    shoal_cuda_item_t items[];
} shoal_cuda_task_t;

/* ---- which calls ------------------------------------------------------------------------ */

int shoal_cuda_wants(const shoal_coll_args_t *a, void *stream, uint64_t *now_ticks)
{
    shoal_cuda_ptr_t k;
    if (stream != NULL) {
        return 1;
    }
    if (!shoal_cuda_drv_present_at(now_ticks)) {
        return 0; /* no driver in the process: no device memory either */
    }
    /* A pointer the driver cannot classify (it fails, e.g. with the sticky error of an
     * earlier device fault) goes to the CUDA path too: that call reports the error, where the
     * host path would dereference what may be device memory. */
    if (a->sendbuf != NULL && (shoal_cuda_ptr_kind(a->sendbuf, &k) != SHOAL_OK || k.dev)) {
        return 1;
    }
    return a->recvbuf != NULL && (shoal_cuda_ptr_kind(a->recvbuf, &k) != SHOAL_OK || k.dev);
}

static shoal_status_t shoal_cuda_item_make(const shoal_coll_args_t *a, shoal_cuda_item_t *it)
{
    *it = (shoal_cuda_item_t){.a = *a};
    SHOAL_CHECK(shoal_cuda_ptr_kind(a->sendbuf, &it->in));
    return shoal_cuda_ptr_kind(a->recvbuf, &it->out);
}

/* ---- running a batch -------------------------------------------------------------------- */

/* The batch's n calls ran as one, from t0 with status st: an op each, the time once. A task
 * on the proxy thread (plan: 1) ends as a plan, beside others in flight (meter.h). */
static void shoal_cuda_meter_end(struct shoal_meter *m, const shoal_cuda_item_t *items, int n,
                                 shoal_status_t st, uint64_t t0, int plan)
{
    for (int i = 1; i < n; i++) {
        shoal_meter_add(&m->page->ops[items[i].a.type], 1);
    }
    if (plan) {
        shoal_meter_plan_end(m, (int)items[0].a.type, st, t0);
    } else {
        shoal_meter_call_end(m, (int)items[0].a.type, st, t0);
    }
}

static int shoal_cuda_item_p2p(const shoal_cuda_item_t *it)
{
    return it->a.type == SHOAL_COLL_SEND || it->a.type == SHOAL_COLL_RECV;
}

/* One rank: every collective of the table below is a copy of the input to the output (or
 * nothing in place), one device copy instead of the staging pipeline's trip through the host
 * (an H200 took 5.7 ms for 256 MiB that way, 47 GB/s). */
static shoal_status_t shoal_cuda_run_self(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *it)
{
    const shoal_coll_args_t *a = &it->a;
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    if (a->sendbuf == NULL || a->recvbuf == NULL || a->sendbuf == a->recvbuf || bytes == 0) {
        return SHOAL_OK;
    }
    SHOAL_CHECK(shoal_cuda_copy_rows(cc->kern, a->recvbuf, it->out.dev, 0, a->sendbuf,
                                     it->in.dev, 0, bytes, 1));
    return shoal_cuda_stream_wait(cc, cc->kern, "one rank's copy");
}

static int shoal_cuda_is_copy_alone(shoal_coll_type_t type)
{
    switch (type) {
    case SHOAL_COLL_ALLREDUCE:
    case SHOAL_COLL_BROADCAST:
    case SHOAL_COLL_REDUCE:
    case SHOAL_COLL_ALLGATHER:
    case SHOAL_COLL_REDUCE_SCATTER:
    case SHOAL_COLL_ALLTOALL:
        return 1;
    default:
        return 0;
    }
}

static shoal_status_t shoal_cuda_run_one(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *it)
{
    const shoal_coll_args_t *a = &it->a;
    if (!it->in.dev && !it->out.dev) {
        return shoal_cuda_host.run(cc->comm, a); /* host buffers, stream-ordered */
    }
    if (cc->comm->nranks == 1 && shoal_cuda_is_copy_alone(a->type)) {
        return shoal_cuda_run_self(cc, it);
    }
    /* Each rank chooses from its own buffers, so the choice must not depend on which of them
     * is on the device: a rank whose input was in host memory staged while the others waited
     * for it in the IPC path's setup, until the timeout. */
    if (a->type == SHOAL_COLL_ALLREDUCE && cc->comm->nranks > 1) {
        if (shoal_cuda_config.backend == SHOAL_CUDA_BACKEND_NCCL && shoal_cuda_nccl_same_op(a) &&
            shoal_cuda_nccl_usable(cc)) {
            return shoal_cuda_nccl_allreduce(cc, it);
        }
        if (shoal_cuda_config.backend != SHOAL_CUDA_BACKEND_STAGING && shoal_cuda_ipc_usable(cc)) {
            return shoal_cuda_ipc_allreduce(cc, it);
        }
    }
    return shoal_cuda_stage_coll(cc, it);
}

/* Every send and receive of a batch (a group) is posted at once, where its first one was
 * issued: a collective between a send and its matching receive (on every rank) must not
 * split them into parts that wait for each other. */
shoal_status_t shoal_cuda_run_items(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *items, int n)
{
    shoal_cuda_item_t *p2p = NULL;
    int first = -1, last = -1, np = 0;
    shoal_status_t st = SHOAL_OK;

    SHOAL_CHECK(shoal_cuda_ctx_enter(cc));
    for (int i = 0; i < n; i++) {
        if (shoal_cuda_item_p2p(&items[i])) {
            first = first < 0 ? i : first;
            last = i;
            np++;
        }
    }
    if (np > 0 && last - first + 1 != np) { /* not contiguous: gather them */
        p2p = malloc((size_t)np * sizeof(*p2p));
        if (p2p == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
        for (int i = first, k = 0; i <= last; i++) {
            if (shoal_cuda_item_p2p(&items[i])) {
                p2p[k++] = items[i];
            }
        }
    }
    for (int i = 0; i < n && st == SHOAL_OK; i++) {
        if (i == first) {
            st = shoal_cuda_stage_p2p(cc, p2p != NULL ? p2p : &items[first], np);
        } else if (!shoal_cuda_item_p2p(&items[i])) {
            st = shoal_cuda_run_one(cc, &items[i]);
        }
    }
    free(p2p);
    return st;
}

/* ---- stream ordering ---------------------------------------------------------------------- */

static volatile uint32_t *shoal_cuda_start_flag(shoal_cuda_comm_t *cc, uint64_t seq)
{
    return cc->flags + (1 + seq % SHOAL_CUDA_FLAG_SLOTS) * SHOAL_CUDA_FLAG_STRIDE;
}

/* Never blocks: stores the start flag; the slot is free again once it returned. */
static void CUDA_CB shoal_cuda_hostfn_start(void *arg)
{
    struct shoal_cuda_hostfn_slot *s = arg;
    __atomic_store_n(shoal_cuda_start_flag(s->cc, s->seq), (uint32_t)s->seq, __ATOMIC_RELEASE);
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE);
}

/* The wait of task seq without stream memory operations: shoal_stream_wait on the done word,
 * bounded by the communicator's timeout. */
static shoal_status_t shoal_cuda_stream_wait_kernel(shoal_cuda_comm_t *cc, CUstream stream,
                                                    uint64_t seq)
{
    CUdeviceptr word = cc->dflags;
    unsigned int seq32 = (unsigned int)seq;
    unsigned long long timeout_ns =
        cc->comm->timeout_ms < 0 ? ~0ull : (unsigned long long)cc->comm->timeout_ms * 1000000ull;
    void *params[] = {&word, &seq32, &timeout_ns};
    return SHOAL_CU(cuLaunchKernel, (cc->wait_fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
}

/* Enqueues the start signal and the completion wait of task seq on stream. *started_p: the
 * start signal is on the stream (the stream will mark seq started, even where the wait after
 * it failed: seq must not be used again). */
static shoal_status_t shoal_cuda_stream_enqueue(shoal_cuda_comm_t *cc, CUstream stream,
                                                uint64_t seq, int *started_p)
{
    size_t slot = seq % SHOAL_CUDA_FLAG_SLOTS;
    shoal_status_t st;
    *started_p = 0;
    if (cc->memops) {
        CUdeviceptr start = cc->dflags + (1 + slot) * SHOAL_CUDA_FLAG_STRIDE * 4;
        SHOAL_CHECK(SHOAL_CU(cuStreamWriteValue32, (stream, start, (uint32_t)seq,
                                                     CU_STREAM_WRITE_VALUE_DEFAULT)));
        *started_p = 1;
        return SHOAL_CU(cuStreamWaitValue32, (stream, cc->dflags, (uint32_t)seq,
                                               CU_STREAM_WAIT_VALUE_GEQ));
    }
    if (cc->hslots == NULL) {
        cc->hslots = calloc(SHOAL_CUDA_FLAG_SLOTS, sizeof(*cc->hslots));
        if (cc->hslots == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
    }
    cc->hslots[slot] = (struct shoal_cuda_hostfn_slot){.cc = cc, .seq = seq, .busy = 1};
    st = SHOAL_CU(cuLaunchHostFunc, (stream, shoal_cuda_hostfn_start, &cc->hslots[slot]));
    if (st != SHOAL_OK) {
        /* nothing will run it: the slot would stay busy, and every later call wait for it */
        __atomic_store_n(&cc->hslots[slot].busy, 0, __ATOMIC_RELEASE);
        return st;
    }
    *started_p = 1;
    return shoal_cuda_stream_wait_kernel(cc, stream, seq);
}

/* Waits until the flag slot of seq is free (the task SLOTS before it completed). */
static shoal_status_t shoal_cuda_slot_wait(shoal_cuda_comm_t *cc, uint64_t seq)
{
    uint64_t deadline = shoal_deadline_ns(cc->comm->timeout_ms);
    size_t slot = seq % SHOAL_CUDA_FLAG_SLOTS;
    unsigned spins = 0;
    while (!shoal_pipe_flag_slot_free(seq, __atomic_load_n(&cc->done, __ATOMIC_ACQUIRE),
                                      SHOAL_CUDA_FLAG_SLOTS) ||
           (cc->hslots != NULL && __atomic_load_n(&cc->hslots[slot].busy, __ATOMIC_ACQUIRE))) {
        if (shoal_deadline_passed(deadline)) {
            shoal_error(CUDA, "rank %d: %d stream-ordered calls in flight and none completes",
                        cc->comm->rank, SHOAL_CUDA_FLAG_SLOTS);
            return SHOAL_ERR_TIMEOUT;
        }
        if (++spins > 64) {
            shoal_sleep_us(50);
        }
    }
    return SHOAL_OK;
}

/* Proxy side: wait until the stream reached task seq. */
static shoal_status_t shoal_cuda_start_wait(shoal_cuda_comm_t *cc, uint64_t seq)
{
    volatile uint32_t *flag = shoal_cuda_start_flag(cc, seq);
    uint64_t deadline = shoal_deadline_ns(cc->comm->timeout_ms);
    unsigned spins = 0;
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != (uint32_t)seq) {
        SHOAL_CHECK(shoal_chan_idle(cc->comm, &spins, deadline,
                                    "waiting for the stream to reach the collective"));
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_cuda_task_run(struct shoal_comm *comm, void *arg)
{
    shoal_cuda_task_t *t = arg;
    shoal_cuda_comm_t *cc = t->cc;
    shoal_status_t st = shoal_cuda_ctx_enter(cc);

    if (st == SHOAL_OK) {
        st = shoal_cuda_start_wait(cc, t->seq);
    }
    if (st == SHOAL_OK) {
        struct shoal_meter *m = comm->meter;
        uint64_t t0 = m != NULL ? shoal_meter_plan_begin(m) : 0; /* the stream is here */
        st = shoal_cuda_run_items(cc, t->items, t->n);
        if (m != NULL) {
            shoal_cuda_meter_end(m, t->items, t->n, st, t0, 1); /* the stream goes on below */
        }
    } else {
        shoal_meter_count_refused(comm->meter); /* never ran: the stream did not come */
    }
    if (st != SHOAL_OK && shoal_comm_fatal(comm) == SHOAL_OK) {
        shoal_comm_set_failed(comm, shoal_status_is_fatal(st) ? st : SHOAL_ERR_ABORTED,
                              comm->rank, "rank %d: a stream-ordered collective failed: %s "
                              "(its stream was released with undefined results)", comm->rank,
                              shoal_strerror(st));
    }
    __atomic_store_n(&cc->flags[0], (uint32_t)t->seq, __ATOMIC_RELEASE);
    __atomic_store_n(&cc->done, t->seq, __ATOMIC_RELEASE);
    if (cc->kick) {
        /* new work for this context: the GPU may switch to it and see the store above
         * (shoal_cuda_comm_shared_gpu); a word of done's line that nothing reads */
        if (shoal_cuda_drv.cuStreamWriteValue32(cc->kern, cc->dflags + SHOAL_CUDA_KICK_WORD * 4,
                                                (uint32_t)t->seq,
                                                CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
            /* best effort: the stream is released already; the next call reports the cause */
            shoal_warn_once(CUDA, "rank %d: the stream write after a release failed",
                            comm->rank);
        }
    }
    return st;
}

/* The proxy refused task seq without running it (the communicator failed or was destroyed
 * before its turn): its stream, which waits for seq's done word, is released all the same
 * (undefined results, as after a failed task); it waited until shoal_comm_destroy. */
static void shoal_cuda_task_cancel(struct shoal_comm *comm, void *arg)
{
    shoal_cuda_task_t *t = arg;
    shoal_cuda_comm_t *cc = t->cc;
    (void)comm;
    if (__atomic_load_n(&cc->done, __ATOMIC_ACQUIRE) < t->seq) {
        __atomic_store_n(&cc->flags[0], (uint32_t)t->seq, __ATOMIC_RELEASE);
        __atomic_store_n(&cc->done, t->seq, __ATOMIC_RELEASE);
    }
}

/* ---- submission ---------------------------------------------------------------------------- */

/* SHOAL_CUDA_SYNC=host: waits (deadline, abort, dead peers) until stream reached this point. */
static shoal_status_t shoal_cuda_host_wait(shoal_cuda_comm_t *cc, CUstream stream)
{
    uint64_t deadline = shoal_deadline_ns(cc->comm->timeout_ms);
    unsigned spins = 0;
    CUresult r;
    SHOAL_CHECK(SHOAL_CU(cuEventRecord, (cc->host_ev, stream)));
    while ((r = shoal_cuda_drv.cuEventQuery(cc->host_ev)) == CUDA_ERROR_NOT_READY) {
        SHOAL_CHECK(shoal_chan_idle(cc->comm, &spins, deadline,
                                    "waiting for the stream to reach the collective"));
    }
    return r == CUDA_SUCCESS ? SHOAL_OK : SHOAL_CU(cuEventQuery, (cc->host_ev));
}

/* cuCtxSynchronize of a stream-NULL call, run on a helper thread: the driver's call has no
 * timeout, and a stream of the job's held at a gate (a value wait, an event of another
 * process) kept the caller in it for ever. The caller waits for the helper with the
 * communicator's deadline, abort and dead-peer checks; on a timeout it returns and the helper,
 * detached, ends (and frees the state) when the device drains. */
struct shoal_cuda_ctx_sync {
    CUcontext ctx;
    CUresult r;
    int done;                   /* the helper stored r (atomic) */
    int refs;                   /* caller and helper (atomic): the last one frees */
};

static void shoal_cuda_ctx_sync_put(struct shoal_cuda_ctx_sync *s)
{
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        free(s);
    }
}

static void *shoal_cuda_ctx_sync_main(void *arg)
{
    struct shoal_cuda_ctx_sync *s = arg;
    CUresult r = shoal_cuda_drv.cuCtxSetCurrent(s->ctx);
    if (r == CUDA_SUCCESS) {
        r = shoal_cuda_drv.cuCtxSynchronize();
    }
    s->r = r;
    __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
    shoal_cuda_ctx_sync_put(s);
    return NULL;
}

static shoal_status_t shoal_cuda_ctx_sync(shoal_cuda_comm_t *cc)
{
    uint64_t deadline = shoal_deadline_ns(cc->comm->timeout_ms);
    struct shoal_cuda_ctx_sync *s = calloc(1, sizeof(*s));
    pthread_attr_t attr;
    pthread_t tid;
    unsigned spins = 0;
    shoal_status_t st = SHOAL_OK;
    int ret;

    if (s == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    s->ctx = cc->ctx;
    s->refs = 2;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    ret = pthread_create(&tid, &attr, shoal_cuda_ctx_sync_main, s);
    pthread_attr_destroy(&attr);
    if (ret != 0) {
        shoal_error(CUDA, "rank %d: pthread_create for the device synchronization failed: %s",
                    cc->comm->rank, strerror(ret));
        free(s);
        return SHOAL_ERR_SYSTEM;
    }
    while (!__atomic_load_n(&s->done, __ATOMIC_ACQUIRE) && st == SHOAL_OK) {
        st = shoal_chan_idle(cc->comm, &spins, deadline,
                             "waiting for the device's earlier work (stream NULL)");
    }
    if (st == SHOAL_OK) {
        st = shoal_cuda_drv_result(s->r, "cuCtxSynchronize", __FILE__, __LINE__);
    }
    shoal_cuda_ctx_sync_put(s);
    return st;
}

/* A call that returns with its result in place: stream NULL (the device's earlier work first,
 * like cudaMemcpy), or a stream under SHOAL_CUDA_SYNC=host or the legacy default stream (that
 * stream's earlier work). */
static shoal_status_t shoal_cuda_submit_blocking(shoal_cuda_comm_t *cc, CUstream stream,
                                                 const shoal_cuda_item_t *items, int n)
{
    struct shoal_comm *comm = cc->comm;
    uint64_t ticket = shoal_comm_ticket_take(comm);
    shoal_status_t st = shoal_comm_ticket_wait(comm, ticket);
    if (st == SHOAL_OK) {
        st = shoal_cuda_ctx_enter(cc);
        if (st == SHOAL_OK) {
            st = stream != NULL ? shoal_cuda_host_wait(cc, stream) : shoal_cuda_ctx_sync(cc);
        }
        if (st == SHOAL_OK) {
            struct shoal_meter *m = comm->meter;
            uint64_t t0 = m != NULL ? shoal_meter_call_begin(m) : 0;
            st = shoal_cuda_run_items(cc, items, n);
            if (m != NULL) {
                shoal_cuda_meter_end(m, items, n, st, t0, 0);
            }
        } else {
            shoal_meter_count_refused(comm->meter);
        }
    } else {
        shoal_meter_count_refused(comm->meter);
    }
    shoal_comm_ticket_release(comm);
    return st;
}

/* A call refused before it was submitted: it returns st and counts in the meter's errors
 * (the blocking submission and the task count their own outcome). */
static shoal_status_t shoal_cuda_refused(struct shoal_comm *comm, shoal_status_t st)
{
    shoal_meter_count_refused(comm->meter);
    return st;
}

static shoal_status_t shoal_cuda_submit_in(struct shoal_comm *comm, void *stream,
                                           const shoal_cuda_item_t *items, int n)
{
    shoal_cuda_comm_t *cc;
    shoal_cuda_task_t *t;
    size_t len = sizeof(*t) + (size_t)n * sizeof(*items);
    int ordinal = -1, started = 0;
    shoal_status_t st;

    /* every device buffer, input and output, on the communicator's one device */
    for (int i = 0; i < 2 * n; i++) {
        const shoal_cuda_ptr_t *k = i % 2 == 0 ? &items[i / 2].in : &items[i / 2].out;
        int o = k->dev ? k->ordinal : -1;
        if (o >= 0 && ordinal >= 0 && o != ordinal) {
            shoal_error(CUDA, "buffers of devices %d and %d in one call or group", ordinal, o);
            return shoal_cuda_refused(comm, SHOAL_ERR_INVALID_ARG);
        }
        ordinal = o >= 0 ? o : ordinal;
    }
    st = shoal_cuda_comm_get(comm, ordinal, &cc);
    if (st != SHOAL_OK) {
        return shoal_cuda_refused(comm, st);
    }
    if (ordinal >= 0 && ordinal != cc->ordinal) {
        shoal_error(CUDA, "buffer on device %d, but this communicator uses device %d", ordinal,
                    cc->ordinal);
        return shoal_cuda_refused(comm, SHOAL_ERR_INVALID_ARG);
    }
    if (stream != NULL && stream != (void *)CU_STREAM_LEGACY) {
        /* A stream being captured into a CUDA graph records the call's stream operations
         * without running them, while its proxy task would run once, now: the task waited
         * SHOAL_TIMEOUT_MS for a start that only a launch of the graph gives, failed the
         * communicator, and every launch then passed the wait without the collective. */
        CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
        if (shoal_cuda_drv.cuStreamIsCapturing((CUstream)stream, &cs) == CUDA_SUCCESS &&
            cs != CU_STREAM_CAPTURE_STATUS_NONE) {
            shoal_error(CUDA, "rank %d: the stream is being captured into a CUDA graph: shoal "
                        "calls cannot be captured (their host side would not be in the "
                        "graph); make the call outside the capture", comm->rank);
            return shoal_cuda_refused(comm, SHOAL_ERR_UNSUPPORTED);
        }
    }
    if (stream == (void *)CU_STREAM_LEGACY && !cc->sync_host &&
        !__atomic_exchange_n(&cc->legacy_said, 1, __ATOMIC_RELAXED)) {
        shoal_info(CUDA, "rank %d: calls on the legacy default stream wait on the host until "
                   "the stream reaches them and return with the result in place (a device-side "
                   "wait there stalls the call's own device work); on another stream they "
                   "return at once", comm->rank);
    }
    if (stream == NULL || cc->sync_host || stream == (void *)CU_STREAM_LEGACY) {
        return shoal_cuda_submit_blocking(cc, (CUstream)stream, items, n);
    }
    t = malloc(len);
    if (t == NULL) {
        return shoal_cuda_refused(comm, SHOAL_ERR_NO_MEMORY);
    }
    t->cc = cc;
    t->n = n;
    memcpy(t->items, items, (size_t)n * sizeof(*items));
    pthread_mutex_lock(&cc->issue_lock);
    t->seq = cc->issued + 1;
    st = shoal_cuda_slot_wait(cc, t->seq);
    if (st == SHOAL_OK) {
        st = shoal_cuda_ctx_enter(cc);
    }
    if (st == SHOAL_OK) {
        st = shoal_cuda_stream_enqueue(cc, (CUstream)stream, t->seq, &started);
        if (st != SHOAL_OK && started) {
            /* The stream will still store seq into its start flag: a task that reused seq
             * would see it and start before its own stream got there. seq is spent without
             * a task (done moves past it with the next task's). */
            cc->issued = t->seq;
        }
    }
    if (st == SHOAL_OK) {
        /* From here the stream waits for seq: the task must run or the destroy releases it. */
        cc->issued = t->seq;
        st = shoal_proxy_post_detached(comm, shoal_cuda_task_run, shoal_cuda_task_cancel, t,
                                       len);
        if (st != SHOAL_OK) {
            __atomic_store_n(&cc->flags[0], (uint32_t)t->seq, __ATOMIC_RELEASE);
            __atomic_store_n(&cc->done, t->seq, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&cc->issue_lock);
    free(t);
    return st == SHOAL_OK ? st : shoal_cuda_refused(comm, st); /* no task: nothing ran */
}

/* Submits on the caller's thread, which keeps its current context: the layer makes the
 * communicator's device current for its driver calls, and the application's runtime follows
 * the thread's current context (a cudaMalloc after the call would land on that device). */
static shoal_status_t shoal_cuda_submit(struct shoal_comm *comm, void *stream,
                                        const shoal_cuda_item_t *items, int n)
{
    CUcontext saved = shoal_cuda_ctx_save();
    shoal_status_t st = shoal_cuda_submit_in(comm, stream, items, n);
    shoal_cuda_ctx_restore(saved);
    return st;
}

/* ---- groups ------------------------------------------------------------------------------- */

typedef struct {
    struct shoal_comm *comm;   /* first (util/trec.h): NULL once dropped or taken */
    void *stream;
    shoal_cuda_item_t item;
} shoal_cuda_gitem_t;

/* Every thread's recorded calls (util/trec.h): a destroy on any thread drops them, a thread
 * that exits inside a group leaves nothing behind. */
static shoal_trec_list_t shoal_cuda_group_recs = SHOAL_TREC_LIST_INIT(shoal_cuda_gitem_t);

/* The library unloaded (dlclose): no later thread exit may call into it. */
__attribute__((destructor)) static void shoal_cuda_group_unload(void)
{
    shoal_trec_unload(&shoal_cuda_group_recs);
}

static shoal_status_t shoal_cuda_group_add(struct shoal_comm *comm, void *stream,
                                           const shoal_cuda_item_t *it)
{
    shoal_cuda_gitem_t g = {.comm = comm, .stream = stream, .item = *it};
    return shoal_trec_add(&shoal_cuda_group_recs, &g);
}

void shoal_cuda_group_forget(struct shoal_comm *comm)
{
    int dropped = shoal_trec_forget(&shoal_cuda_group_recs, comm);

    if (dropped > 0) {
        shoal_error(CUDA, "rank %d: communicator %08x destroyed inside a group: its %d "
                    "stream-ordered or device call(s) recorded since shoal_group_start are "
                    "dropped, and shoal_group_end fails", comm->rank, comm->comm_id, dropped);
    }
}

/* One task per (communicator, stream), in the order of their first call. Every one is
 * submitted even after another failed (a communicator aborted inside the group): the peers
 * of the others wait for their calls. The first failure is returned. */
shoal_status_t shoal_cuda_group_flush(void)
{
    int n, dropped;
    shoal_cuda_gitem_t *g = shoal_trec_take(&shoal_cuda_group_recs, &n, &dropped);
    shoal_cuda_item_t *batch = n > 0 ? malloc((size_t)n * sizeof(*batch)) : NULL;
    shoal_status_t st = SHOAL_OK, st2;

    if (n > 0 && batch == NULL) {
        shoal_error(CUDA, "no memory to submit a group of %d calls", n);
        st = SHOAL_ERR_NO_MEMORY;
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        struct shoal_comm *comm = g[i].comm;
        void *stream = g[i].stream;
        int k = 0;
        if (comm == NULL) {
            continue;
        }
        for (int j = i; j < n; j++) {
            if (g[j].comm == comm && g[j].stream == stream) {
                batch[k++] = g[j].item;
                g[j].comm = NULL;
            }
        }
        st2 = shoal_comm_check_usable(comm);
        st2 = st2 != SHOAL_OK ? st2 : shoal_cuda_submit(comm, stream, batch, k);
        st = st != SHOAL_OK ? st : st2;
    }
    free(batch);
    free(g);
    if (dropped > 0) {
        /* calls the application was told were recorded never ran */
        shoal_error(CUDA, "shoal_group_end: %d call(s) of this group were on a communicator "
                    "destroyed before the end", dropped);
        st = st != SHOAL_OK ? st : SHOAL_ERR_INVALID_ARG;
    }
    return st;
}

shoal_status_t shoal_cuda_p2p_batch(struct shoal_comm *comm, const shoal_coll_args_t *ops, int n)
{
    shoal_cuda_item_t *items = malloc((size_t)n * sizeof(*items));
    shoal_status_t st = items == NULL ? SHOAL_ERR_NO_MEMORY : shoal_cuda_drv_load();

    if (st == SHOAL_ERR_UNSUPPORTED) {
        shoal_error(CUDA, "a device buffer was passed, but CUDA is unavailable: %s",
                    shoal_cuda_drv_reason());
    }
    for (int i = 0; i < n && st == SHOAL_OK; i++) {
        st = shoal_cuda_item_make(&ops[i], &items[i]);
    }
    st = st != SHOAL_OK ? st : shoal_comm_check_usable(comm);
    if (st == SHOAL_OK) {
        st = shoal_cuda_submit(comm, NULL, items, n);
    } else {
        for (int i = 0; i < n; i++) {
            shoal_meter_count_refused(comm->meter); /* as each blocking call would be */
        }
    }
    free(items);
    return st;
}

shoal_status_t shoal_cuda_call(struct shoal_comm *comm, const shoal_coll_args_t *a, void *stream)
{
    shoal_cuda_item_t it;
    shoal_status_t st = shoal_cuda_drv_load();

    if (st != SHOAL_OK) {
        shoal_error(CUDA, "a stream or device buffer was passed, but CUDA is unavailable: %s",
                    shoal_cuda_drv_reason());
        return shoal_cuda_refused(comm, st);
    }
    st = shoal_cuda_item_make(a, &it);
    if (st == SHOAL_OK && shoal_group_depth() > 0) {
        st = shoal_cuda_group_add(comm, stream, &it);
        return st == SHOAL_OK ? st : shoal_cuda_refused(comm, st);
    }
    if (st != SHOAL_OK) {
        return shoal_cuda_refused(comm, st);
    }
    return shoal_cuda_submit(comm, stream, &it, 1);
}
