/* SHOAL_CUDA_* variables of the CUDA layer. */
#include "cuda/cuda_int.h"

#include <pthread.h>
#include <stddef.h>

shoal_cuda_config_t shoal_cuda_config;

static const char *const shoal_cuda_backend_names[] = {"auto", "staging", "ipc", "nccl", NULL};
static const char *const shoal_cuda_sync_names[] = {"auto", "memops", "hostfn", "host", NULL};

static const shoal_cfg_field_t shoal_cuda_cfg_fields[] = {
    {.name = "CUDA_LIBCUDA", .dflt = "libcuda.so.1", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_cuda_config_t, libcuda),
     .doc = "the CUDA driver library, loaded at the first call with a stream or device buffer"},
    {.name = "CUDA_STAGING_SIZE", .dflt = "64m", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_cuda_config_t, staging_size),
     .doc = "pinned host staging per communicator for device buffers (bounds the pipeline; "
            "it can shrink the chunks, so it must be the same on every rank; a send or "
            "receive that does not fit what is left of it goes through a host buffer of its "
            "own size)"},
    {.name = "CUDA_CHUNK_SIZE", .dflt = "4m", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_cuda_config_t, chunk_size),
     .doc = "bytes per row per pipeline chunk (device-to-host, network, host-to-device "
            "overlap); must be the same on every rank"},
    {.name = "CUDA_BACKEND", .dflt = "auto", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_cuda_backend_names, .offset = offsetof(shoal_cuda_config_t, backend),
     .doc = "device-buffer AllReduce: auto/ipc (GPU kernels over CUDA IPC on one host, else "
            "staging), staging (pinned host buffers + host algorithms), nccl (NCCL on one host "
            "with one GPU per rank, else auto; MIN/MAX of floats take auto's path: NCCL's "
            "drop NaN)"},
    {.name = "CUDA_IPC_SIZE", .dflt = "32m", .type = SHOAL_CFG_SIZE,
     .offset = offsetof(shoal_cuda_config_t, ipc_size),
     .doc = "device buffer per rank shared with the ranks of the host through CUDA IPC"},
    {.name = "CUDA_SYNC", .dflt = "auto", .type = SHOAL_CFG_ENUM,
     .enum_names = shoal_cuda_sync_names, .offset = offsetof(shoal_cuda_config_t, sync),
     .doc = "how a stream hands a collective to the proxy thread and waits for it: memops "
            "(stream write/wait on host-mapped flags), hostfn (host functions), auto (memops "
            "where the driver has them); host: no hand-over, the call waits on the host until "
            "its stream reaches it, runs, and returns with the result in place (the host "
            "blocks; for ranks that share a GPU without MPS, whose waits on the device cost "
            "the GPU's time slices: 0.8 ms against 11.6 ms per 1 MiB AllReduce of 2 ranks on "
            "an H200). Calls on the legacy default stream (cudaStreamLegacy, PyTorch's "
            "default) always run as host"},
    {.name = "CUDA_LIBNCCL", .dflt = "libnccl.so.2", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_cuda_config_t, libnccl),
     .doc = "the NCCL library for SHOAL_CUDA_BACKEND=nccl"},
};

const shoal_cfg_table_t shoal_cuda_cfg_table = {
    .module = "cuda",
    .fields = shoal_cuda_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_cuda_cfg_fields),
    .dst = &shoal_cuda_config,
};

/* The table is listed in src/util/config_tables.c and parsed with all the others. */
void shoal_cuda_config_load(void)
{
    shoal_config_global_init();
}
