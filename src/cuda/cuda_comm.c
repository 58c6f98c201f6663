/*
 * Per-communicator CUDA state: the device's primary context, the kernel module (embedded
 * fatbin), internal streams and events, pinned staging and the host-mapped stream flags.
 * Created at a communicator's first device call, kept in the proxy's extension slot and
 * freed when the communicator is destroyed. Also the small helpers every executor uses.
 */
#include "cuda/cuda_int.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t shoal_cuda_comm_lock = PTHREAD_MUTEX_INITIALIZER;

shoal_status_t shoal_cuda_ptr_kind(const void *p, shoal_cuda_ptr_t *kind_p)
{
    unsigned int mtype = 0;
    int ordinal = -1;
    CUresult r;

    *kind_p = (shoal_cuda_ptr_t){.dev = 0, .ordinal = -1};
    if (p == NULL || !shoal_cuda_drv_present() || shoal_cuda_drv_load() != SHOAL_OK) {
        return SHOAL_OK;
    }
    r = shoal_cuda_drv.cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                             (CUdeviceptr)(uintptr_t)p);
    if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_INITIALIZED ||
        r == CUDA_ERROR_INVALID_CONTEXT) {
        return SHOAL_OK; /* memory the driver does not know: host */
    }
    if (r != CUDA_SUCCESS) {
        return SHOAL_CU(cuPointerGetAttribute, (&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                 (CUdeviceptr)(uintptr_t)p));
    }
    if (mtype != CU_MEMORYTYPE_DEVICE) {
        return SHOAL_OK; /* pinned / registered host memory */
    }
    SHOAL_CHECK(SHOAL_CU(cuPointerGetAttribute, (&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                  (CUdeviceptr)(uintptr_t)p)));
    *kind_p = (shoal_cuda_ptr_t){.dev = 1, .ordinal = ordinal};
    return SHOAL_OK;
}

shoal_status_t shoal_cuda_ctx_enter(shoal_cuda_comm_t *cc)
{
    return SHOAL_CU(cuCtxSetCurrent, (cc->ctx));
}

CUcontext shoal_cuda_ctx_save(void)
{
    CUcontext c = NULL;
    return shoal_cuda_drv.cuCtxGetCurrent(&c) == CUDA_SUCCESS ? c : NULL;
}

void shoal_cuda_ctx_restore(CUcontext saved)
{
    CUcontext cur = NULL;
    if (shoal_cuda_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != saved &&
        shoal_cuda_drv.cuCtxSetCurrent(saved) != CUDA_SUCCESS) {
        shoal_warn_once(CUDA, "the calling thread's CUDA context could not be made current again");
    }
}

static shoal_status_t shoal_cuda_comm_kernels(shoal_cuda_comm_t *cc)
{
    static const char *const dt[] = SHOAL_CUDA_DTYPE_NAMES;
    static const char *const op[] = SHOAL_CUDA_OP_NAMES;
    char name[64];

    SHOAL_CHECK(SHOAL_CU(cuModuleLoadData, (&cc->module, shoal_cuda_fatbin)));
    for (int d = 0; d < SHOAL_DTYPE_COUNT; d++) {
        for (int o = 0; o < 4; o++) {
            snprintf(name, sizeof(name), "shoal_reduce_%s_%s", dt[d], op[o]);
            SHOAL_CHECK(SHOAL_CU(cuModuleGetFunction, (&cc->fns[d][o], cc->module, name)));
        }
    }
    return SHOAL_CU(cuModuleGetFunction, (&cc->wait_fn, cc->module, SHOAL_CUDA_WAIT_KERNEL));
}

static shoal_status_t shoal_cuda_comm_memory(shoal_cuda_comm_t *cc)
{
    void *p;
    size_t flags_bytes = (size_t)(1 + SHOAL_CUDA_FLAG_SLOTS) * SHOAL_CUDA_FLAG_STRIDE * 4;

    cc->staging_size = SHOAL_MAX(shoal_cuda_config.staging_size, (size_t)65536);
    SHOAL_CHECK(SHOAL_CU(cuMemHostAlloc, (&p, cc->staging_size, CU_MEMHOSTALLOC_PORTABLE)));
    cc->staging = p;
    memset(cc->staging, 0, cc->staging_size); /* fault the pages in now */
    SHOAL_CHECK(SHOAL_CU(cuMemHostAlloc, (&p, flags_bytes, CU_MEMHOSTALLOC_DEVICEMAP |
                                                                CU_MEMHOSTALLOC_PORTABLE)));
    memset(p, 0, flags_bytes);
    cc->flags = p;
    SHOAL_CHECK(SHOAL_CU(cuMemHostGetDevicePointer, (&cc->dflags, p, 0)));
    for (int d = 0; d < 2; d++) {
        for (int s = 0; s < SHOAL_PIPE_MAX_SLOTS; s++) {
            SHOAL_CHECK(SHOAL_CU(cuEventCreate, (&cc->ev[d][s], CU_EVENT_DISABLE_TIMING)));
        }
    }
    SHOAL_CHECK(SHOAL_CU(cuEventCreate, (&cc->host_ev, CU_EVENT_DISABLE_TIMING)));
    SHOAL_CHECK(SHOAL_CU(cuStreamCreate, (&cc->d2h, CU_STREAM_NON_BLOCKING)));
    SHOAL_CHECK(SHOAL_CU(cuStreamCreate, (&cc->h2d, CU_STREAM_NON_BLOCKING)));
    return SHOAL_CU(cuStreamCreate, (&cc->kern, CU_STREAM_NON_BLOCKING));
}

/* Communicators whose user streams had not passed their last task at destroy: everything of
 * theirs stays allocated for the life of the process (a stream that reaches the task later
 * still writes and reads the flags). Reachable from here. */
static shoal_cuda_comm_t *shoal_cuda_comm_kept;

/* 1 once the user streams went past the signals of every task issued (the last SLOTS can be
 * outstanding): the start flag carries the task's number (memops), or its start host function
 * ran (hostfn). The wait behind either ends at once: the drain stored done = issued. */
static int shoal_cuda_comm_streams_passed(shoal_cuda_comm_t *cc)
{
    uint64_t first =
        cc->issued > SHOAL_CUDA_FLAG_SLOTS ? cc->issued - SHOAL_CUDA_FLAG_SLOTS + 1 : 1;
    for (uint64_t seq = first; seq <= cc->issued; seq++) {
        size_t slot = seq % SHOAL_CUDA_FLAG_SLOTS;
        if (cc->hslots != NULL && cc->hslots[slot].seq == seq) {
            if (__atomic_load_n(&cc->hslots[slot].busy, __ATOMIC_ACQUIRE)) {
                return 0;
            }
        } else if (cc->memops &&
                   __atomic_load_n(&cc->flags[(1 + slot) * SHOAL_CUDA_FLAG_STRIDE],
                                   __ATOMIC_ACQUIRE) != (uint32_t)seq) {
            return 0;
        }
    }
    return 1;
}

/* Releases every stream waiting for a task the destroy cancelled and waits, up to the
 * communicator's timeout, for the internal streams to drain and the user streams to pass.
 * Never cuCtxSynchronize: a user stream held by something else (an event of the job's, a
 * gate) would block the destroy forever. Returns 1 if the internal streams drained and the
 * user streams passed. */
static int shoal_cuda_comm_drain(shoal_cuda_comm_t *cc)
{
    /* no waiting forever even where SHOAL_TIMEOUT_MS < 0: keeping the memory is safe */
    int ms = cc->comm->timeout_ms < 0 ? 10000 : cc->comm->timeout_ms;
    uint64_t deadline = shoal_deadline_ns(ms);
    CUstream streams[3] = {cc->d2h, cc->h2d, cc->kern};
    int passed, idle = 1;

    __atomic_store_n(&cc->flags[0], (uint32_t)cc->issued, __ATOMIC_RELEASE);
    __atomic_store_n(&cc->done, cc->issued, __ATOMIC_RELEASE);
    for (int i = 0; i < 3; i++) {
        while (streams[i] != NULL &&
               shoal_cuda_drv.cuStreamQuery(streams[i]) == CUDA_ERROR_NOT_READY &&
               !shoal_deadline_passed(deadline)) {
            shoal_sleep_us(100);
        }
        idle &= streams[i] == NULL ||
                shoal_cuda_drv.cuStreamQuery(streams[i]) != CUDA_ERROR_NOT_READY;
    }
    while (!(passed = shoal_cuda_comm_streams_passed(cc)) && !shoal_deadline_passed(deadline)) {
        shoal_sleep_us(200);
    }
    if (passed && cc->memops && cc->issued > 0) {
        shoal_sleep_us(1000); /* the wait after the last start signal reads the done word */
    }
    return passed && idle; /* else the staging may still be in use: keep it */
}

static void shoal_cuda_comm_free(struct shoal_comm *comm, void *ext)
{
    shoal_cuda_comm_t *cc = ext;
    CUcontext saved;
    if (cc == NULL) {
        return;
    }
    saved = shoal_cuda_ctx_save(); /* the destroying thread's, put back below */
    if (cc->ctx != NULL && shoal_cuda_ctx_enter(cc) == SHOAL_OK) {
        if (cc->flags != NULL && !shoal_cuda_comm_drain(cc)) {
            /* Keep everything: the stream still has to write and read the flags, and the
             * driver's frees synchronize with the device, which would wait for that stream
             * (held by something of the job's) without end. */
            pthread_mutex_lock(&shoal_cuda_comm_lock);
            cc->kept_next = shoal_cuda_comm_kept;
            shoal_cuda_comm_kept = cc;
            pthread_mutex_unlock(&shoal_cuda_comm_lock);
            shoal_warn(CUDA, "rank %d: communicator destroyed while a stream has not reached "
                       "its stream-ordered call within the timeout: its CUDA resources (%zu "
                       "bytes pinned, %zu on the device) are kept for the life of the process "
                       "so that the stream can pass it", comm->rank,
                       cc->staging_size +
                           (size_t)(1 + SHOAL_CUDA_FLAG_SLOTS) * SHOAL_CUDA_FLAG_STRIDE * 4,
                       cc->ipc_buf != 0 ? cc->ipc_size : 0);
            cc->comm = NULL; /* the stream's host functions read only cc's own fields */
            shoal_cuda_ctx_restore(saved);
            return;
        }
        shoal_cuda_nccl_fini(cc);
        shoal_cuda_ipc_fini(cc);
        for (int d = 0; d < 2; d++) {
            for (int s = 0; s < SHOAL_PIPE_MAX_SLOTS; s++) {
                if (cc->ev[d][s] != NULL) {
                    shoal_cuda_drv.cuEventDestroy(cc->ev[d][s]);
                }
            }
        }
        if (cc->host_ev != NULL) {
            shoal_cuda_drv.cuEventDestroy(cc->host_ev);
        }
        CUstream streams[3] = {cc->d2h, cc->h2d, cc->kern};
        for (int i = 0; i < 3; i++) {
            if (streams[i] != NULL) {
                shoal_cuda_drv.cuStreamDestroy(streams[i]);
            }
        }
        if (cc->module != NULL) {
            shoal_cuda_drv.cuModuleUnload(cc->module);
        }
        if (cc->staging != NULL) {
            shoal_cuda_drv.cuMemFreeHost(cc->staging);
        }
        if (cc->flags != NULL) {
            shoal_cuda_drv.cuMemFreeHost((void *)cc->flags);
        }
        shoal_cuda_drv.cuDevicePrimaryCtxRelease(cc->dev);
    }
    shoal_cuda_ctx_restore(saved);
    free(cc->hslots);
    pthread_mutex_destroy(&cc->issue_lock);
    free(cc);
}

/* More ranks on this host than devices: some share one. Without MPS the GPU runs their
 * contexts in time slices, and a stream-ordered call, whose ranks' streams wait on the device
 * while the collective's work of every rank must run, takes whole slices (perf/gpu_share.sh on
 * an H200: 11.6 ms per 1 MiB AllReduce of 2 ranks; 73 us under MPS; 0.8 ms with
 * SHOAL_CUDA_SYNC=host or without a stream). Said once, by the host's first rank: a warning
 * where every rank sees the same devices (CUDA_VISIBLE_DEVICES unset), where sharing is
 * certain; at INFO where CUDA_VISIBLE_DEVICES is set, since each rank may see a GPU of its
 * own then (a scheduler's per-task GPUs, src/sched's placement output). Sets cc->kick. */
static void shoal_cuda_comm_shared_gpu(shoal_cuda_comm_t *cc)
{
    struct shoal_comm *comm = cc->comm;
    int ndev = 0, mps = 0;
    if (cc->sync_host || comm->local_size < 2 ||
        shoal_cuda_drv.cuDeviceGetCount(&ndev) != CUDA_SUCCESS || ndev >= comm->local_size) {
        return;
    }
    if (shoal_cuda_drv.cuDeviceGetAttribute(&mps, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, cc->dev) ==
            CUDA_SUCCESS && mps) {
        return;
    }
    /* The store that releases a stream (the done word) rings no doorbell: a context whose
     * stream waits for it while another rank's context has the GPU may wait for that slice to
     * end. Work submitted right after the store tells the GPU this context has some (perf/
     * gpu_share_probe.cu part 5 measures whether that helps; at worst it costs the proxy one
     * stream write per call, after the stream was released). */
    cc->kick = cc->memops;
    if (comm->local_ranks[0] != comm->rank) {
        return;
    }
    const char *visible = shoal_cfg_getenv_raw("CUDA_VISIBLE_DEVICES");
    if (visible != NULL && visible[0] != '\0') {
        shoal_info(CUDA, "%d ranks on this host, %d GPU(s) visible to this one "
                   "(CUDA_VISIBLE_DEVICES is set): where ranks share a GPU without MPS, "
                   "stream-ordered collectives wait for its time slices (about 10 ms per call; "
                   "MPS or SHOAL_CUDA_SYNC=host avoid that)", comm->local_size, ndev);
        return;
    }
    shoal_warn(CUDA, "%d ranks on this host share %d GPU(s) without MPS: stream-ordered "
               "collectives wait for the GPU's time slices (about 10 ms per call); start the "
               "MPS server (nvidia-cuda-mps-control -d) or set SHOAL_CUDA_SYNC=host",
               comm->local_size, ndev);
}

static shoal_status_t shoal_cuda_comm_setup(shoal_cuda_comm_t *cc, int ordinal)
{
    int memops = 0;
    CUcontext cur = NULL;

    if (ordinal < 0) {
        /* No device buffer: the calling thread's device (the runtime's current context). */
        CUdevice d = 0;
        if (shoal_cuda_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL &&
            shoal_cuda_drv.cuCtxGetDevice(&d) == CUDA_SUCCESS) {
            ordinal = (int)d;
        } else {
            ordinal = 0;
        }
    }
    cc->ordinal = ordinal;
    SHOAL_CHECK(SHOAL_CU(cuDeviceGet, (&cc->dev, ordinal)));
    SHOAL_CHECK(SHOAL_CU(cuDevicePrimaryCtxRetain, (&cc->ctx, cc->dev)));
    SHOAL_CHECK(shoal_cuda_ctx_enter(cc));
    SHOAL_CHECK(SHOAL_CU(cuDeviceGetAttribute, (&cc->nsm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                                 cc->dev)));
    /* Stream memory operations: the v2 API (what cuda.h maps cuStreamWaitValue32 to, and so
     * what cuda_drv.c loads) is there on every platform from CUDA 11.7; the attribute only
     * says whether the old v1 API is enabled (NVreg_EnableStreamMemOPs=1). An H200 with CUDA
     * 13 reports 0 there while the memops work: choosing the hostfn fallback for it made a
     * polling kernel hold the GPU for whole time slices when ranks shared it (17 ms per
     * 1 MiB AllReduce of 2 ranks, against 0.75 ms; perf/gpu_share.sh). */
    if (shoal_cuda_drv_version >= 11070) {
        memops = 1;
    } else {
        shoal_cuda_drv.cuDeviceGetAttribute(&memops,
                                            CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1,
                                            cc->dev);
    }
    SHOAL_CHECK(SHOAL_CU(cuDeviceGetPCIBusId, (cc->busid, sizeof(cc->busid), cc->dev)));
    cc->memops = shoal_cuda_config.sync == SHOAL_CUDA_SYNC_MEMOPS ||
                 (shoal_cuda_config.sync == SHOAL_CUDA_SYNC_AUTO && memops != 0);
    cc->sync_host = shoal_cuda_config.sync == SHOAL_CUDA_SYNC_HOST;
    shoal_cuda_comm_shared_gpu(cc);
    if (shoal_cuda_config.sync == SHOAL_CUDA_SYNC_MEMOPS && memops == 0) {
        shoal_warn(CUDA, "SHOAL_CUDA_SYNC=memops but device %d reports no stream memory "
                   "operations; trying anyway", ordinal);
    }
    SHOAL_CHECK(shoal_cuda_comm_kernels(cc));
    SHOAL_CHECK(shoal_cuda_comm_memory(cc));
    shoal_info(CUDA, "rank %d: device %d (%s), %d SMs, stream sync by %s, staging %zu bytes",
               cc->comm->rank, ordinal, cc->busid, cc->nsm,
               cc->sync_host ? "the host" : cc->memops ? "memops" : "hostfn",
               cc->staging_size);
    return SHOAL_OK;
}

shoal_status_t shoal_cuda_comm_get(struct shoal_comm *comm, int ordinal, shoal_cuda_comm_t **cc_p)
{
    shoal_cuda_comm_t *cc;
    void *ext = NULL;
    shoal_status_t st;

    SHOAL_CHECK(shoal_cuda_drv_load());
    pthread_mutex_lock(&shoal_cuda_comm_lock);
    st = shoal_proxy_ext_get(comm, &ext);
    if (st != SHOAL_OK || ext != NULL) {
        pthread_mutex_unlock(&shoal_cuda_comm_lock);
        *cc_p = ext;
        return st;
    }
    cc = calloc(1, sizeof(*cc));
    if (cc == NULL) {
        pthread_mutex_unlock(&shoal_cuda_comm_lock);
        return SHOAL_ERR_NO_MEMORY;
    }
    cc->comm = comm;
    pthread_mutex_init(&cc->issue_lock, NULL);
    st = shoal_cuda_comm_setup(cc, ordinal);
    if (st != SHOAL_OK) {
        shoal_cuda_comm_free(comm, cc);
        pthread_mutex_unlock(&shoal_cuda_comm_lock);
        return st;
    }
    shoal_proxy_ext_set(comm, cc, shoal_cuda_comm_free);
    pthread_mutex_unlock(&shoal_cuda_comm_lock);
    *cc_p = cc;
    return SHOAL_OK;
}

/* ---- helpers ---------------------------------------------------------------------------- */

shoal_status_t shoal_cuda_reduce_launch(shoal_cuda_comm_t *cc, CUstream stream, CUdeviceptr dst,
                                        const CUdeviceptr *srcs, int nsrc, size_t count,
                                        shoal_dtype_t dtype, shoal_op_t op, int avg_div)
{
    size_t es = shoal_dtype_size(dtype), v = 16 / es;
    CUfunction fn = cc->fns[dtype][op == SHOAL_AVG ? 0 : op];
    int done = 0;

    while (done < nsrc) {
        shoal_cuda_srcs_t s = {{0}};
        int n = 0, vec = (dst % 16) == 0;
        int last;
        unsigned long long cnt = count;
        if (done > 0) {
            s.p[n++] = (const void *)(uintptr_t)dst; /* partial result of the previous pass */
        }
        while (n < SHOAL_CUDA_MAX_SRCS && done < nsrc) {
            vec &= (srcs[done] % 16) == 0;
            s.p[n++] = (const void *)(uintptr_t)srcs[done++];
        }
        last = done == nsrc;
        int div = (last && op == SHOAL_AVG) ? avg_div : 0;
        size_t work = vec ? (count + v - 1) / v : count;
        size_t blocks = SHOAL_MIN((work + SHOAL_CUDA_THREADS - 1) / SHOAL_CUDA_THREADS,
                                  (size_t)cc->nsm * SHOAL_CUDA_BLOCKS_PER_SM);
        void *params[] = {&dst, &s, &n, &cnt, &div, &vec};
        if (count == 0) {
            return SHOAL_OK;
        }
        SHOAL_CHECK(SHOAL_CU(cuLaunchKernel, (fn, (unsigned)SHOAL_MAX(blocks, (size_t)1), 1, 1,
                                               SHOAL_CUDA_THREADS, 1, 1, 0, stream, params,
                                               NULL)));
    }
    return SHOAL_OK;
}

shoal_status_t shoal_cuda_stream_wait(shoal_cuda_comm_t *cc, CUstream stream, const char *what)
{
    uint64_t deadline = shoal_deadline_ns(cc->comm->timeout_ms);
    unsigned spins = 0;
    for (;;) {
        CUresult r = shoal_cuda_drv.cuStreamQuery(stream);
        if (r == CUDA_SUCCESS) {
            return SHOAL_OK;
        }
        if (r != CUDA_ERROR_NOT_READY) {
            return SHOAL_CU(cuStreamQuery, (stream));
        }
        SHOAL_CHECK(shoal_chan_idle(cc->comm, &spins, deadline, what));
    }
}

shoal_status_t shoal_cuda_copy_rows(CUstream stream, void *dst, int dst_dev, size_t dst_pitch,
                                    const void *src, int src_dev, size_t src_pitch, size_t width,
                                    size_t rows)
{
    CUDA_MEMCPY2D m;
    if (width == 0 || rows == 0) {
        return SHOAL_OK;
    }
    if (!dst_dev && !src_dev) {
        for (size_t r = 0; r < rows; r++) {
            memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
        }
        return SHOAL_OK;
    }
    if (rows == 1 || dst_pitch >= ((size_t)1 << 30) || src_pitch >= ((size_t)1 << 30)) {
        for (size_t r = 1; r < rows; r++) {
            SHOAL_CHECK(shoal_cuda_copy_rows(stream, (char *)dst + r * dst_pitch, dst_dev, 0,
                                             (const char *)src + r * src_pitch, src_dev, 0,
                                             width, 1));
        }
        CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
        if (dst_dev && src_dev) {
            return SHOAL_CU(cuMemcpyDtoDAsync, (d, s, width, stream));
        }
        return dst_dev ? SHOAL_CU(cuMemcpyHtoDAsync, (d, src, width, stream))
                       : SHOAL_CU(cuMemcpyDtoHAsync, (dst, s, width, stream));
    }
    m = (CUDA_MEMCPY2D){
        .srcMemoryType = src_dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST,
        .srcHost = src_dev ? NULL : src,
        .srcDevice = src_dev ? (CUdeviceptr)(uintptr_t)src : 0,
        .srcPitch = src_pitch,
        .dstMemoryType = dst_dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST,
        .dstHost = dst_dev ? NULL : dst,
        .dstDevice = dst_dev ? (CUdeviceptr)(uintptr_t)dst : 0,
        .dstPitch = dst_pitch,
        .WidthInBytes = width,
        .Height = rows,
    };
    return SHOAL_CU(cuMemcpy2DAsync, (&m, stream));
}
