/*
 * The CUDA driver API, resolved at run time: libshoal never links libcuda/libcudart, so it
 * loads and serves host buffers on machines without a GPU or a driver. The first call that
 * needs CUDA dlopens libcuda.so.1 (SHOAL_CUDA_LIBCUDA overrides the path), resolves the
 * entry points below by their versioned names (the macros of cuda.h, e.g. cuMemAlloc ->
 * "cuMemAlloc_v2", are expanded before stringification) and calls cuInit. The driver API is
 * the stable ABI: a newer driver serves an older toolkit's names.
 */
#ifndef SHOAL_CUDA_DRV_H
#define SHOAL_CUDA_DRV_H

#include "util/util.h"

#include <cuda.h>

/* X(name): every driver entry point the layer uses. */
#define SHOAL_CUDA_DRV_MAP(X)                                                           \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorString) X(cuGetErrorName)               \
    X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDeviceGetPCIBusId)   \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent)         \
    X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuPointerGetAttribute)                     \
    X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery)        \
    X(cuStreamGetCtx) X(cuStreamWriteValue32) X(cuStreamWaitValue32) X(cuLaunchHostFunc) \
    X(cuStreamIsCapturing)                                                              \
    X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery)              \
    X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy) X(cuMemAlloc)         \
    X(cuMemFree) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostGetDevicePointer)        \
    X(cuMemcpyDtoHAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoDAsync) X(cuMemcpy2DAsync)   \
    X(cuMemsetD8Async) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)     \
    X(cuLaunchKernel) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)

typedef struct {
#define SHOAL_CUDA_DRV_FIELD_(name) __typeof__(&name) name;
    SHOAL_CUDA_DRV_MAP(SHOAL_CUDA_DRV_FIELD_)
#undef SHOAL_CUDA_DRV_FIELD_
} shoal_cuda_drv_t;

/* The table, valid once shoal_cuda_drv_load() returned SHOAL_OK. */
extern SHOAL_HIDDEN shoal_cuda_drv_t shoal_cuda_drv;
/* cuDriverGetVersion's answer at the load (e.g. 13000), 0 if it failed. */
extern SHOAL_HIDDEN int shoal_cuda_drv_version;

/* Loads the driver once (thread-safe). SHOAL_OK, or SHOAL_ERR_UNSUPPORTED with the reason
 * logged once and kept for shoal_cuda_drv_reason(). */
SHOAL_HIDDEN shoal_status_t shoal_cuda_drv_load(void);
SHOAL_HIDDEN const char *shoal_cuda_drv_reason(void);
/* 1 if libcuda is already mapped into this process (then device pointers may exist);
 * cheap, loads nothing. Until it is, it looks at most every 200 us, by the call path's clock:
 * *now_ticks if it is not 0 (the caller's read of shoal_ticks()), else it reads the clock and
 * leaves the time there for the caller (src/coll/api.c shares one read with the meter). */
SHOAL_HIDDEN int shoal_cuda_drv_present_at(uint64_t *now_ticks);
static inline int shoal_cuda_drv_present(void)
{
    uint64_t now = 0;
    return shoal_cuda_drv_present_at(&now);
}
/* "CUDA_ERROR_INVALID_VALUE (invalid argument)" for r. */
SHOAL_HIDDEN const char *shoal_cuda_drv_strerror(CUresult r, char *buf, size_t len);

/* Calls a driver function; on failure logs "<call> failed: <error>" once here and yields
 * SHOAL_ERR_SYSTEM. Used as: SHOAL_CHECK(SHOAL_CU(cuMemAlloc, (&p, n))). */
SHOAL_HIDDEN shoal_status_t shoal_cuda_drv_result(CUresult r, const char *call, const char *file,
                                                  int line);
#define SHOAL_CU(fn, args) shoal_cuda_drv_result(shoal_cuda_drv.fn args, #fn, __FILE__, __LINE__)

#endif
