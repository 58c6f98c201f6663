/*
 * AllReduce between the ranks of one host on device buffers, through CUDA IPC: every rank
 * owns a device buffer (SHOAL_CUDA_IPC_SIZE) whose handle the others open at the first such
 * call (a collective step: every rank decides the same). Per chunk: copy the input into the
 * own buffer; barrier; reduce slice r of the chunk from every rank's buffer into the own
 * buffer (GPU kernel reading the peers directly); barrier; copy every rank's reduced slice into
 * the output; barrier (the buffers may be reused). Each slice is reduced by one rank, so every
 * rank gets the same bits. Ranks may share one GPU (IPC works between processes on one device).
 *
 * Metering: per chunk, this rank's device reads slice me of every peer's buffer (reduce) and
 * every peer's reduced slice (gather): received; the peers' devices read the same amounts from
 * its buffer: sent (transport cuda_ipc, same host). Counted once the chunk's last barrier says
 * every read is done. The copy into the own buffer stays on the device: not counted.
 */
#include "cuda/cuda_int.h"
#include "meter/meter.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t ok;
    int32_t pad;
    char busid[32];
    CUipcMemHandle handle;
    uint64_t size; /* of the buffer (SHOAL_CUDA_IPC_SIZE, which each rank reads itself) */
} shoal_cuda_ipc_info_t;

static shoal_status_t shoal_cuda_ipc_open(shoal_cuda_comm_t *cc, const shoal_cuda_ipc_info_t *all,
                                          int *ok_p)
{
    struct shoal_comm *comm = cc->comm;
    cc->ipc_peer = calloc((size_t)comm->nranks, sizeof(*cc->ipc_peer));
    if (cc->ipc_peer == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int r = 0; r < comm->nranks && *ok_p; r++) {
        CUresult res;
        char err[128];
        if (r == comm->rank) {
            cc->ipc_peer[r] = cc->ipc_buf;
            continue;
        }
        res = shoal_cuda_drv.cuIpcOpenMemHandle(&cc->ipc_peer[r], all[r].handle,
                                                CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (res != CUDA_SUCCESS) {
            shoal_info(CUDA, "rank %d: cannot open the IPC buffer of rank %d (%s): %s", comm->rank,
                       r, all[r].busid, shoal_cuda_drv_strerror(res, err, sizeof(err)));
            cc->ipc_peer[r] = 0;
            *ok_p = 0;
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_cuda_ipc_setup(shoal_cuda_comm_t *cc)
{
    struct shoal_comm *comm = cc->comm;
    shoal_cuda_ipc_info_t me = {.ok = comm->all_local};
    shoal_cuda_ipc_info_t *all = calloc((size_t)comm->nranks, sizeof(*all));
    int32_t ok, ok_all;
    shoal_status_t st;

    if (all == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    memcpy(me.busid, cc->busid, sizeof(me.busid));
    cc->ipc_size = SHOAL_MAX(SHOAL_ALIGN_UP(shoal_cuda_config.ipc_size, 4096), (size_t)65536);
    me.size = cc->ipc_size;
    if (me.ok && (shoal_cuda_drv.cuMemAlloc(&cc->ipc_buf, cc->ipc_size) != CUDA_SUCCESS ||
                  shoal_cuda_drv.cuIpcGetMemHandle(&me.handle, cc->ipc_buf) != CUDA_SUCCESS)) {
        me.ok = 0;
    }
    st = shoal_cuda_host_coll(cc, SHOAL_COLL_ALLGATHER, &me, all, sizeof(me), SHOAL_UINT8,
                              SHOAL_SUM, 0);
    ok = st == SHOAL_OK;
    /* Chunks are cut by the smallest buffer of all: a rank's kernel reads its slice of every
     * chunk from each peer's buffer, which a larger chunk than that peer's would overrun. */
    cc->ipc_chunk_bytes = cc->ipc_size;
    for (int r = 0; r < comm->nranks && ok; r++) {
        ok = all[r].ok;
        cc->ipc_chunk_bytes = SHOAL_MIN(cc->ipc_chunk_bytes, (size_t)all[r].size);
    }
    if (ok && st == SHOAL_OK) {
        st = shoal_cuda_ipc_open(cc, all, &ok);
    }
    if (st == SHOAL_OK) {
        st = shoal_cuda_host_coll(cc, SHOAL_COLL_ALLREDUCE, &ok, &ok_all, 1, SHOAL_INT32,
                                  SHOAL_MIN, 0);
    }
    free(all);
    SHOAL_CHECK(st);
    cc->ipc_state = ok_all ? 1 : -1;
    shoal_info(CUDA, "rank %d: same-host IPC path %s", comm->rank,
               ok_all ? "in use" : "not usable on every rank; staging instead");
    return SHOAL_OK;
}

int shoal_cuda_ipc_usable(shoal_cuda_comm_t *cc)
{
    if (cc->ipc_state == 0) {
        if (!cc->comm->all_local || cc->comm->nranks > SHOAL_CUDA_MAX_SRCS) {
            cc->ipc_state = -1; /* the same answer on every rank, no exchange needed */
        } else if (shoal_cuda_ipc_setup(cc) != SHOAL_OK) {
            cc->ipc_state = -1;
        }
    }
    return cc->ipc_state > 0;
}

/* Slice r of a chunk of len elements, cut at 16-byte boundaries. */
static void shoal_cuda_ipc_slice(size_t len, size_t es, int n, int r, size_t *off_p,
                                 size_t *cnt_p)
{
    size_t v = 16 / es, units = (len + v - 1) / v, lo, ulen;
    shoal_block_range(units, n, r, &lo, &ulen);
    *off_p = SHOAL_MIN(lo * v, len);
    *cnt_p = SHOAL_MIN((lo + ulen) * v, len) - *off_p;
}

static shoal_status_t shoal_cuda_ipc_barrier(shoal_cuda_comm_t *cc)
{
    return shoal_cuda_host_coll(cc, SHOAL_COLL_BARRIER, NULL, NULL, 0, SHOAL_UINT8, SHOAL_SUM, 0);
}

/* The input or the output may be host memory (the other is on the device): every rank of the
 * call must take this path, and each one decides from its own buffers (cuda_api.c). */
static shoal_status_t shoal_cuda_ipc_chunk(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *it,
                                           size_t off, size_t len, CUdeviceptr *srcs)
{
    struct shoal_comm *comm = cc->comm;
    const shoal_coll_args_t *a = &it->a;
    size_t es = shoal_dtype_size(a->dtype), soff, scnt;
    const char *in = (const char *)a->sendbuf + off * es;
    char *out = (char *)a->recvbuf + off * es;
    int me = comm->rank, n = comm->nranks, k = 0;

    SHOAL_CHECK(shoal_cuda_copy_rows(cc->kern, (void *)(uintptr_t)cc->ipc_buf, 1, 0, in,
                                     it->in.dev, 0, len * es, 1));
    SHOAL_CHECK(shoal_cuda_stream_wait(cc, cc->kern, "IPC copy-in"));
    SHOAL_CHECK(shoal_cuda_ipc_barrier(cc));
    shoal_cuda_ipc_slice(len, es, n, me, &soff, &scnt);
    srcs[k++] = cc->ipc_buf + soff * es; /* own first: dst aliases it */
    for (int r = 0; r < n; r++) {
        if (r != me) {
            srcs[k++] = cc->ipc_peer[r] + soff * es;
        }
    }
    SHOAL_CHECK(shoal_cuda_reduce_launch(cc, cc->kern, cc->ipc_buf + soff * es, srcs, n, scnt,
                                         a->dtype, a->op, n));
    SHOAL_CHECK(shoal_cuda_stream_wait(cc, cc->kern, "IPC reduce"));
    SHOAL_CHECK(shoal_cuda_ipc_barrier(cc));
    for (int r = 0; r < n; r++) {
        shoal_cuda_ipc_slice(len, es, n, r, &soff, &scnt);
        if (scnt > 0) {
            SHOAL_CHECK(shoal_cuda_copy_rows(cc->kern, out + soff * es, it->out.dev, 0,
                                             (const void *)(uintptr_t)(cc->ipc_peer[r] +
                                                                       soff * es),
                                             1, 0, scnt * es, 1));
        }
    }
    SHOAL_CHECK(shoal_cuda_stream_wait(cc, cc->kern, "IPC gather"));
    SHOAL_CHECK(shoal_cuda_ipc_barrier(cc));
    /* slice me from n - 1 peers, and the other slices (len minus ours) from their owners;
     * the peers read as much from our buffer */
    shoal_cuda_ipc_slice(len, es, n, me, &soff, &scnt);
    {
        uint64_t moved = ((uint64_t)(n - 1) * scnt + (len - scnt)) * es;
        shoal_meter_add_cuda_ipc(comm->meter, moved, moved);
    }
    return SHOAL_OK;
}

shoal_status_t shoal_cuda_ipc_allreduce(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *it)
{
    const shoal_coll_args_t *a = &it->a;
    size_t es = shoal_dtype_size(a->dtype);
    size_t chunk = cc->ipc_chunk_bytes / 16 * 16 / es;
    CUdeviceptr *srcs = calloc((size_t)cc->comm->nranks, sizeof(*srcs));
    shoal_status_t st = srcs == NULL ? SHOAL_ERR_NO_MEMORY : SHOAL_OK;

    for (size_t off = 0; off < a->count && st == SHOAL_OK; off += chunk) {
        st = shoal_cuda_ipc_chunk(cc, it, off, SHOAL_MIN(chunk, a->count - off), srcs);
    }
    free(srcs);
    return st;
}

void shoal_cuda_ipc_fini(shoal_cuda_comm_t *cc)
{
    if (cc->ipc_peer != NULL) {
        for (int r = 0; r < cc->comm->nranks; r++) {
            if (r != cc->comm->rank && cc->ipc_peer[r] != 0) {
                shoal_cuda_drv.cuIpcCloseMemHandle(cc->ipc_peer[r]);
            }
        }
        free(cc->ipc_peer);
        cc->ipc_peer = NULL;
    }
    if (cc->ipc_buf != 0) {
        shoal_cuda_drv.cuMemFree(cc->ipc_buf);
        cc->ipc_buf = 0;
    }
}
