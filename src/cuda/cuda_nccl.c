/*
 * SHOAL_CUDA_BACKEND=nccl: AllReduce on device buffers delegated to NCCL when every rank of
 * the communicator is on this host with a GPU of its own (NCCL refuses ranks sharing a GPU;
 * then the IPC path serves them). libnccl is loaded at run time like the driver. Set up at
 * the first such call, a collective step: the ranks agree through host collectives, rank 0's
 * ncclUniqueId is broadcast, every rank calls ncclCommInitRank.
 */
#include "cuda/cuda_int.h"
#include "meter/meter.h"

#if SHOAL_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#define SHOAL_NCCL_MAP(X)                                                                 \
    X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclAllReduce) X(ncclCommDestroy)            \
    X(ncclGetErrorString)

static struct {
#define SHOAL_NCCL_FIELD_(name) __typeof__(&name) name;
    SHOAL_NCCL_MAP(SHOAL_NCCL_FIELD_)
#undef SHOAL_NCCL_FIELD_
} shoal_nccl;
static void *shoal_nccl_handle;
static pthread_once_t shoal_nccl_once = PTHREAD_ONCE_INIT;
static int shoal_nccl_ok;

static void shoal_cuda_nccl_load_once(void)
{
    const char *path = shoal_cuda_config.libnccl != NULL ? shoal_cuda_config.libnccl
                                                         : "libnccl.so.2";
    shoal_nccl_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (shoal_nccl_handle == NULL) {
        shoal_warn(CUDA, "SHOAL_CUDA_BACKEND=nccl: cannot load %s: %s", path, dlerror());
        return;
    }
#define SHOAL_NCCL_SYM_(name)                                                             \
    *(void **)&shoal_nccl.name = dlsym(shoal_nccl_handle, #name);                           \
    if (shoal_nccl.name == NULL) {                                                        \
        shoal_warn(CUDA, "SHOAL_CUDA_BACKEND=nccl: %s lacks %s", path, #name);             \
        return;                                                                           \
    }
    SHOAL_NCCL_MAP(SHOAL_NCCL_SYM_)
#undef SHOAL_NCCL_SYM_
    shoal_nccl_ok = 1;
}

static const ncclDataType_t shoal_nccl_types[SHOAL_DTYPE_COUNT] = {
    ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
    ncclFloat16, ncclBfloat16, ncclFloat32, ncclFloat64};
/* AVG is NCCL's sum, divided by shoal's kernel: ncclAvg premultiplies every floating input
 * by 1/n, while shoal rounds the sum to the dtype (fp16: to inf past 65504) and divides once,
 * on every path (shoal.h); two ranks of 40000 in fp16 averaged to 40000 here, inf elsewhere. */
static const ncclRedOp_t shoal_nccl_ops[SHOAL_OP_COUNT] = {ncclSum, ncclProd, ncclMin, ncclMax,
                                                           ncclSum};

/* 1 if every rank is local with a distinct GPU and loaded NCCL (same answer everywhere). */
static shoal_status_t shoal_cuda_nccl_agree(shoal_cuda_comm_t *cc, int *ok_p)
{
    struct shoal_comm *comm = cc->comm;
    char(*ids)[32] = calloc((size_t)comm->nranks, 32);
    int32_t ok, ok_all = 0;
    shoal_status_t st;

    if (ids == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    pthread_once(&shoal_nccl_once, shoal_cuda_nccl_load_once);
    st = shoal_cuda_host_coll(cc, SHOAL_COLL_ALLGATHER, cc->busid, ids, 32, SHOAL_UINT8,
                              SHOAL_SUM, 0);
    ok = shoal_nccl_ok;
    for (int r = 0; r < comm->nranks && st == SHOAL_OK; r++) {
        for (int q = 0; q < r; q++) {
            ok &= strncmp(ids[r], ids[q], 32) != 0;
        }
    }
    if (st == SHOAL_OK) {
        st = shoal_cuda_host_coll(cc, SHOAL_COLL_ALLREDUCE, &ok, &ok_all, 1, SHOAL_INT32,
                                  SHOAL_MIN, 0);
    }
    free(ids);
    *ok_p = ok_all;
    return st;
}

static shoal_status_t shoal_cuda_nccl_setup(shoal_cuda_comm_t *cc)
{
    struct shoal_comm *comm = cc->comm;
    struct {
        int32_t ok; /* rank 0 has an id: every rank learns it with the id */
        int32_t pad;
        ncclUniqueId id;
    } root;
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclSuccess;
    int ok;

    SHOAL_CHECK(shoal_cuda_nccl_agree(cc, &ok));
    if (!ok) {
        shoal_info(CUDA, "rank %d: NCCL not used (needs one host, one GPU per rank, libnccl on "
                   "every rank)", comm->rank);
        return SHOAL_ERR_UNSUPPORTED;
    }
    memset(&root, 0, sizeof(root));
    if (comm->rank == 0) {
        r = shoal_nccl.ncclGetUniqueId(&root.id);
        root.ok = r == ncclSuccess;
    }
    SHOAL_CHECK(shoal_cuda_host_coll(cc, SHOAL_COLL_BROADCAST, &root, &root, sizeof(root),
                                     SHOAL_UINT8, SHOAL_SUM, 0));
    if (!root.ok) {
        /* Every rank falls back together; the others must not wait in ncclCommInitRank for a
         * bootstrap that does not exist while rank 0 goes on without NCCL. */
        shoal_warn(CUDA, "rank %d: NCCL not used: ncclGetUniqueId failed on rank 0%s%s",
                   comm->rank, comm->rank == 0 ? ": " : "",
                   comm->rank == 0 ? shoal_nccl.ncclGetErrorString(r) : "");
        return SHOAL_ERR_UNSUPPORTED;
    }
    r = shoal_nccl.ncclCommInitRank(&nc, comm->nranks, root.id, comm->rank);
    if (r != ncclSuccess) {
        shoal_error(CUDA, "rank %d: NCCL initialisation failed: %s", comm->rank,
                    shoal_nccl.ncclGetErrorString(r));
        return SHOAL_ERR_SYSTEM;
    }
    cc->nccl_comm = nc;
    shoal_info(CUDA, "rank %d: AllReduce on device buffers delegated to NCCL", comm->rank);
    return SHOAL_OK;
}

int shoal_cuda_nccl_usable(shoal_cuda_comm_t *cc)
{
    if (cc->nccl_state == 0) {
        cc->nccl_state = (cc->comm->all_local && shoal_cuda_nccl_setup(cc) == SHOAL_OK) ? 1 : -1;
    }
    return cc->nccl_state > 0;
}

/* cc->nccl_tmp, at least bytes large. */
static shoal_status_t shoal_cuda_nccl_tmp(shoal_cuda_comm_t *cc, size_t bytes)
{
    size_t size = SHOAL_MAX(bytes, cc->nccl_tmp_size * 2);
    CUdeviceptr p;
    if (bytes <= cc->nccl_tmp_size) {
        return SHOAL_OK;
    }
    if (cc->nccl_nold == (int)SHOAL_ARRAY_SIZE(cc->nccl_old)) {
        return SHOAL_ERR_NO_MEMORY; /* not reached: sizes double */
    }
    SHOAL_CHECK(SHOAL_CU(cuMemAlloc, (&p, size)));
    if (cc->nccl_tmp != 0) {
        cc->nccl_old[cc->nccl_nold++] = cc->nccl_tmp;
    }
    cc->nccl_tmp = p;
    cc->nccl_tmp_size = size;
    return SHOAL_OK;
}

/* A host input or output (the peers' may be on the device: every rank takes this path when
 * NCCL is in use, whatever its own buffers, cuda_api.c) goes through a device buffer of the
 * communicator's (cc->nccl_tmp): NCCL reads and writes device memory only. */
shoal_status_t shoal_cuda_nccl_allreduce(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *it)
{
    const shoal_coll_args_t *a = &it->a;
    size_t bytes = a->count * shoal_dtype_size(a->dtype);
    const void *in = a->sendbuf;
    void *out = a->recvbuf;
    CUdeviceptr tmp = 0;
    shoal_status_t st = SHOAL_OK;
    ncclResult_t r;

    if ((!it->in.dev || !it->out.dev) && bytes > 0) {
        SHOAL_CHECK(shoal_cuda_nccl_tmp(cc, bytes));
        tmp = cc->nccl_tmp;
        in = out = (void *)(uintptr_t)tmp;
        st = shoal_cuda_copy_rows(cc->kern, out, 1, 0, a->sendbuf, it->in.dev, 0, bytes, 1);
    }
    if (st == SHOAL_OK) {
        r = shoal_nccl.ncclAllReduce(in, out, a->count, shoal_nccl_types[a->dtype],
                                     shoal_nccl_ops[a->op], cc->nccl_comm,
                                     (cudaStream_t)cc->kern);
        if (r != ncclSuccess) {
            shoal_error(CUDA, "rank %d: ncclAllReduce failed: %s", cc->comm->rank,
                        shoal_nccl.ncclGetErrorString(r));
            st = SHOAL_ERR_SYSTEM;
        }
    }
    if (st == SHOAL_OK && a->op == SHOAL_AVG && cc->comm->nranks > 1) {
        CUdeviceptr o = (CUdeviceptr)(uintptr_t)out;
        st = shoal_cuda_reduce_launch(cc, cc->kern, o, &o, 1, a->count, a->dtype, SHOAL_AVG,
                                      cc->comm->nranks);
    }
    if (st == SHOAL_OK && tmp != 0) {
        st = shoal_cuda_copy_rows(cc->kern, a->recvbuf, it->out.dev, 0, out, 1, 0, bytes, 1);
    }
    SHOAL_CHECK(st != SHOAL_OK ? st : shoal_cuda_stream_wait(cc, cc->kern, "NCCL AllReduce"));
    /* NCCL does not say what it moved: the ring-equivalent bytes (meter_page.h, nccl_sent) */
    {
        uint64_t ring = shoal_meter_ring_bytes((uint64_t)a->count * shoal_dtype_size(a->dtype),
                                               cc->comm->nranks);
        shoal_meter_add_nccl(cc->comm->meter, ring, ring);
    }
    return SHOAL_OK;
}

void shoal_cuda_nccl_fini(shoal_cuda_comm_t *cc)
{
    if (cc->nccl_comm != NULL) {
        shoal_nccl.ncclCommDestroy(cc->nccl_comm);
        cc->nccl_comm = NULL;
    }
    for (int i = 0; i < cc->nccl_nold; i++) {
        shoal_cuda_drv.cuMemFree(cc->nccl_old[i]);
    }
    cc->nccl_nold = 0;
    if (cc->nccl_tmp != 0) {
        shoal_cuda_drv.cuMemFree(cc->nccl_tmp);
        cc->nccl_tmp = 0;
    }
}

#else /* !SHOAL_HAVE_NCCL */

int shoal_cuda_nccl_usable(shoal_cuda_comm_t *cc)
{
    (void)cc;
    shoal_warn_once(CUDA, "SHOAL_CUDA_BACKEND=nccl, but this build has no NCCL support");
    return 0;
}

shoal_status_t shoal_cuda_nccl_allreduce(shoal_cuda_comm_t *cc, const shoal_cuda_item_t *it)
{
    (void)cc;
    (void)it;
    return SHOAL_ERR_UNSUPPORTED;
}

void shoal_cuda_nccl_fini(shoal_cuda_comm_t *cc)
{
    (void)cc;
}
#endif
