/* The CUDA driver API resolved at run time (see cuda_drv.h). */
#include "cuda/cuda_int.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

shoal_cuda_drv_t shoal_cuda_drv;
int shoal_cuda_drv_version;

static pthread_once_t shoal_cuda_drv_once = PTHREAD_ONCE_INIT;
static shoal_status_t shoal_cuda_drv_status = SHOAL_ERR_UNSUPPORTED;
static char shoal_cuda_drv_why[256] = "not loaded";
static void *shoal_cuda_drv_handle;
static int shoal_cuda_drv_mapped; /* libcuda seen in the process */

#define SHOAL_CUDA_XSTR_(x) #x
#define SHOAL_CUDA_XSTR(x) SHOAL_CUDA_XSTR_(x)

/* dlsym, and for the entry points that cuda.h maps to a version newer drivers added with the
 * same arguments, the first version where the driver lacks it: the stream memory operations'
 * _v2 came with CUDA 11.7 (before, the v1 functions work where the device attribute says so,
 * which cuda_comm.c asks), cuEventElapsedTime_v2 with 12.8. Every older driver failed to
 * load ("lacks cuStreamWriteValue32_v2"), and with 12.8 headers every driver before 12.8. */
static void *shoal_cuda_drv_sym(void *h, const char *name)
{
    static const char *const first[] = {"cuStreamWriteValue32_v2", "cuStreamWaitValue32_v2",
                                        "cuEventElapsedTime_v2"};
    char v1[32];
    void *p = dlsym(h, name);

    for (size_t i = 0; p == NULL && i < SHOAL_ARRAY_SIZE(first); i++) {
        if (strcmp(name, first[i]) == 0) {
            snprintf(v1, sizeof(v1), "%.*s", (int)(strlen(name) - 3), name); /* no "_v2" */
            p = dlsym(h, v1);
        }
    }
    return p;
}

static int shoal_cuda_drv_resolve(void *h)
{
#define SHOAL_CUDA_DRV_SYM_(name)                                                         \
    *(void **)&shoal_cuda_drv.name = shoal_cuda_drv_sym(h, SHOAL_CUDA_XSTR(name));          \
    if (shoal_cuda_drv.name == NULL) {                                                    \
        snprintf(shoal_cuda_drv_why, sizeof(shoal_cuda_drv_why),                          \
                 "the CUDA driver lacks %s (too old?)", SHOAL_CUDA_XSTR(name));           \
        return -1;                                                                        \
    }
    SHOAL_CUDA_DRV_MAP(SHOAL_CUDA_DRV_SYM_)
#undef SHOAL_CUDA_DRV_SYM_
    return 0;
}

static void shoal_cuda_drv_load_once(void)
{
    const char *path;
    CUresult r;
    int count = 0;
    char err[128];

    shoal_cuda_config_load();
    path = shoal_cuda_config.libcuda != NULL ? shoal_cuda_config.libcuda : "libcuda.so.1";
    shoal_cuda_drv_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (shoal_cuda_drv_handle == NULL) {
        snprintf(shoal_cuda_drv_why, sizeof(shoal_cuda_drv_why), "no CUDA driver: %s",
                 dlerror());
        goto fail;
    }
    if (shoal_cuda_drv_resolve(shoal_cuda_drv_handle) != 0) {
        goto fail;
    }
    r = shoal_cuda_drv.cuInit(0);
    if (r != CUDA_SUCCESS) {
        snprintf(shoal_cuda_drv_why, sizeof(shoal_cuda_drv_why), "cuInit failed: %s",
                 shoal_cuda_drv_strerror(r, err, sizeof(err)));
        goto fail;
    }
    r = shoal_cuda_drv.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count == 0) {
        snprintf(shoal_cuda_drv_why, sizeof(shoal_cuda_drv_why), "no CUDA device (%s)",
                 r != CUDA_SUCCESS ? shoal_cuda_drv_strerror(r, err, sizeof(err)) : "count 0");
        goto fail;
    }
    if (shoal_cuda_drv.cuDriverGetVersion(&shoal_cuda_drv_version) != CUDA_SUCCESS) {
        shoal_cuda_drv_version = 0;
    }
    shoal_info(CUDA, "CUDA driver %d.%d from %s, %d device(s)", shoal_cuda_drv_version / 1000,
               shoal_cuda_drv_version % 1000 / 10, path, count);
    shoal_cuda_drv_status = SHOAL_OK;
    snprintf(shoal_cuda_drv_why, sizeof(shoal_cuda_drv_why), "loaded");
    return;
fail:
    /* Not a warning: a host call loads the driver too where the process mapped libcuda (to
     * classify its buffers), and a host-only job there (a driver, no GPU) needs none; a call
     * that needs CUDA logs this reason as its error (shoal_cuda_call). */
    shoal_info(CUDA, "stream-ordered and device-buffer collectives are unavailable: %s",
               shoal_cuda_drv_why);
    if (shoal_cuda_drv_handle != NULL) {
        dlclose(shoal_cuda_drv_handle);
        shoal_cuda_drv_handle = NULL;
    }
    /* the functions looked up so far point into the library just closed */
    memset(&shoal_cuda_drv, 0, sizeof(shoal_cuda_drv));
    shoal_cuda_drv_status = SHOAL_ERR_UNSUPPORTED;
}

shoal_status_t shoal_cuda_drv_load(void)
{
    pthread_once(&shoal_cuda_drv_once, shoal_cuda_drv_load_once);
    return shoal_cuda_drv_status;
}

const char *shoal_cuda_drv_reason(void)
{
    return shoal_cuda_drv_why;
}

static int shoal_cuda_drv_adds_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    *(unsigned long long *)data = info->dlpi_adds;
    return 1; /* the counter is global: the first object is enough */
}

int shoal_cuda_drv_present_at(uint64_t *now_ticks)
{
    static unsigned long long adds_checked = ~0ULL;
    static uint64_t asked;
    unsigned long long adds = 0;
    uint64_t now;
    void *h;
    if (__atomic_load_n(&shoal_cuda_drv_mapped, __ATOMIC_ACQUIRE)) {
        return 1;
    }
    /* Device memory exists only in a process that loaded the driver (the runtime does).
     * dlopen(RTLD_NOLOAD) searches the library path (tens of microseconds), so ask again
     * only when the process has loaded some object since the last answer; and look at that
     * (dl_iterate_phdr takes the loader's lock) at most every 200 us: between loading
     * libcuda and holding a device pointer there is cuInit and a context, many milliseconds.
     * The clock is the call path's (shoal_ticks): the collective's entry read, no extra one. */
    if (*now_ticks == 0) {
        *now_ticks = shoal_ticks();
    }
    now = *now_ticks;
    if (now - __atomic_load_n(&asked, __ATOMIC_RELAXED) < shoal_tick_clock.ticks_per_sec / 5000) {
        return 0;
    }
    __atomic_store_n(&asked, now, __ATOMIC_RELAXED);
    dl_iterate_phdr(shoal_cuda_drv_adds_cb, &adds);
    if (adds == __atomic_load_n(&adds_checked, __ATOMIC_RELAXED)) {
        return 0;
    }
    shoal_cuda_config_load();
    h = dlopen(shoal_cuda_config.libcuda != NULL ? shoal_cuda_config.libcuda : "libcuda.so.1",
               RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) {
        __atomic_store_n(&adds_checked, adds, __ATOMIC_RELAXED);
        return 0;
    }
    dlclose(h);
    __atomic_store_n(&shoal_cuda_drv_mapped, 1, __ATOMIC_RELEASE);
    return 1;
}

const char *shoal_cuda_drv_strerror(CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *str = NULL;
    if (shoal_cuda_drv.cuGetErrorName != NULL) {
        shoal_cuda_drv.cuGetErrorName(r, &name);
        shoal_cuda_drv.cuGetErrorString(r, &str);
    }
    snprintf(buf, len, "%s (%s)", name != NULL ? name : "CUDA error",
             str != NULL ? str : "no description");
    if (name == NULL) {
        snprintf(buf, len, "CUDA error %d", (int)r);
    }
    return buf;
}

shoal_status_t shoal_cuda_drv_result(CUresult r, const char *call, const char *file, int line)
{
    char err[160];
    if (SHOAL_LIKELY(r == CUDA_SUCCESS)) {
        return SHOAL_OK;
    }
    shoal_error(CUDA, "%s failed: %s (%s:%d)", call, shoal_cuda_drv_strerror(r, err, sizeof(err)),
                file, line);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? SHOAL_ERR_NO_MEMORY : SHOAL_ERR_SYSTEM;
}
