/*
 * libfakecuda, the host emulation of the CUDA driver that run_gpu_emu.sh runs the GPU tests
 * on, is only worth its passes if it fails where a GPU fails. This checks that it does, and
 * how libshoal reports it: a host read of a device pointer crashes; work behind a stream wait
 * does not run before the wait is released (copies, events); a kernel outside every
 * allocation, or on the vector path with a misaligned pointer, is a sticky device fault, and a
 * shoal call after it returns SHOAL_ERR_SYSTEM instead of hanging; IPC handles map the same
 * memory in another process and not in their own; a blocking call while a stream of the
 * job's is held times out. One process per case that leaves the emulated device faulted
 * (fork).
 */
#include "cuda/cuda_int.h"
#include "tests/tap.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static CUcontext ctx;
static CUmodule mod;

#define OK(call) (shoal_cuda_drv.call == CUDA_SUCCESS)

static int setup(void)
{
    CUdevice dev;
    return OK(cuDeviceGet(&dev, 0)) && OK(cuDevicePrimaryCtxRetain(&ctx, dev)) &&
           OK(cuCtxSetCurrent(ctx)) && OK(cuModuleLoadData(&mod, shoal_cuda_fatbin));
}

/* Runs fn in a child; returns its wait status (the child exits with fn's value). */
static int in_child(int (*fn)(void))
{
    int status = 0;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        _exit(fn());
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        return -1;
    }
    return status;
}

/* Runs fn in a child: the case passes when the child exits 0 (its code, or minus its signal,
 * in the line). */
static void child_ok(int (*fn)(void), const char *what)
{
    int status = in_child(fn);
    tap_ok(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s (child exit %d)",
           what, WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
}

static int host_reads_device(void)
{
    CUdeviceptr d;
    if (!OK(cuMemAlloc(&d, 4096))) {
        return 3;
    }
    volatile const char *p = (const char *)(uintptr_t)d;
    printf("# child read %d: the emulated device memory is readable from the host\n", p[0]);
    return 0;
}

static CUresult launch(CUstream s, const char *name, CUdeviceptr dst, CUdeviceptr src,
                       unsigned long long count, int vec)
{
    CUfunction fn;
    shoal_cuda_srcs_t srcs = {{(void *)(uintptr_t)src, (void *)(uintptr_t)src}};
    int nsrc = 2, div = 0;
    void *params[] = {&dst, &srcs, &nsrc, &count, &div, &vec};
    CUresult r = shoal_cuda_drv.cuModuleGetFunction(&fn, mod, name);
    return r != CUDA_SUCCESS ? r
                             : shoal_cuda_drv.cuLaunchKernel(fn, 2, 1, 1, SHOAL_CUDA_THREADS, 1, 1,
                                                             0, s, params, NULL);
}

/* A kernel past the end of its buffers: a sticky fault; then libshoal on device buffers. */
static int fault_then_shoal(void)
{
    CUstream s;
    CUdeviceptr a, b;
    shoal_comm_t comm;
    shoal_uid_t uid;
    shoal_status_t st;
    CUresult r;
    if (!OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) || !OK(cuMemAlloc(&a, 4096)) ||
        !OK(cuMemAlloc(&b, 4096)) || shoal_get_unique_id(&uid) != SHOAL_OK ||
        shoal_comm_init(&comm, 1, 0, &uid, NULL) != SHOAL_OK) {
        return 3;
    }
    /* a working call first: the communicator's CUDA state exists before the fault */
    if (shoal_allreduce((void *)a, (void *)b, 1024, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL) !=
        SHOAL_OK) {
        return 4;
    }
    if (launch(s, "shoal_reduce_f32_sum", a, b, 1025, 1) != CUDA_SUCCESS) {
        return 5; /* the launch itself is accepted; the fault comes when it runs */
    }
    r = shoal_cuda_drv.cuStreamSynchronize(s);
    if (r != CUDA_ERROR_ILLEGAL_ADDRESS) {
        printf("# stream sync after an out-of-bounds kernel: %d\n", (int)r);
        return 6;
    }
    st = shoal_allreduce((void *)a, (void *)b, 1024, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL);
    if (st != SHOAL_ERR_SYSTEM) {
        printf("# blocking allreduce after the fault: %s\n", shoal_status_name(st));
        return 7;
    }
    st = shoal_allreduce((void *)a, (void *)b, 1024, SHOAL_FLOAT32, SHOAL_SUM, comm, s);
    if (st == SHOAL_OK) {
        printf("# stream-ordered allreduce after the fault succeeded\n");
        return 8;
    }
    shoal_comm_abort(comm);
    return 0;
}

/* shoal_comm_destroy while the user's stream has not reached a stream-ordered call (held by
 * a gate of the job's): the destroy returns within the timeout (no cuCtxSynchronize forever),
 * and the stream, released later, passes the call's signals without a fault (their memory
 * was kept). Then the ordinary case: destroy after the stream passed. */
static int destroy_while_held(void)
{
    CUstream s;
    CUdeviceptr a, b, dgate;
    volatile uint32_t *gate;
    shoal_comm_t comm;
    shoal_uid_t uid;
    double t0, t1;
    if (!OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) || !OK(cuMemAlloc(&a, 4096)) ||
        !OK(cuMemAlloc(&b, 4096)) ||
        !OK(cuMemHostAlloc((void **)&gate, 64, CU_MEMHOSTALLOC_DEVICEMAP)) ||
        !OK(cuMemHostGetDevicePointer(&dgate, (void *)gate, 0))) {
        return 3;
    }
    for (int held = 1; held >= 0; held--) {
        *gate = 0;
        if (shoal_get_unique_id(&uid) != SHOAL_OK ||
            shoal_comm_init(&comm, 1, 0, &uid, NULL) != SHOAL_OK ||
            !OK(cuStreamWaitValue32(s, dgate, 1, CU_STREAM_WAIT_VALUE_GEQ)) ||
            shoal_allreduce((void *)a, (void *)b, 1024, SHOAL_FLOAT32, SHOAL_SUM, comm, s) !=
                SHOAL_OK) {
            return 4;
        }
        if (!held) {
            __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
            if (!OK(cuStreamSynchronize(s))) {
                return 5;
            }
        }
        t0 = shoal_time_ns() / 1e6;
        shoal_comm_destroy(comm);
        t1 = shoal_time_ns() / 1e6;
        printf("# %s: destroy took %.0f ms\n", held ? "held stream" : "passed stream", t1 - t0);
        fflush(stdout);
        if (t1 - t0 > 5000) {
            return 6;
        }
        __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
        if (!OK(cuStreamSynchronize(s))) {
            return 7;
        }
    }
    return 0;
}

/* A 1-rank communicator, two device buffers of 4 KiB and a stream held at a gate (a host word
 * the stream waits for, 0 until the test opens it); 0, or the child's exit code for a failed
 * step (3: setup, 4: the wait). */
static int held_stream(CUstream *s, CUdeviceptr *a, CUdeviceptr *b, volatile uint32_t **gate,
                       shoal_comm_t *comm)
{
    CUdeviceptr dgate;
    shoal_uid_t uid;

    alarm(20); /* a hang ends the child well before in_child's alarm */
    if (!OK(cuStreamCreate(s, CU_STREAM_NON_BLOCKING)) || !OK(cuMemAlloc(a, 4096)) ||
        !OK(cuMemAlloc(b, 4096)) ||
        !OK(cuMemHostAlloc((void **)gate, 64, CU_MEMHOSTALLOC_DEVICEMAP)) ||
        !OK(cuMemHostGetDevicePointer(&dgate, (void *)*gate, 0)) ||
        shoal_get_unique_id(&uid) != SHOAL_OK ||
        shoal_comm_init(comm, 1, 0, &uid, NULL) != SHOAL_OK) {
        return 3;
    }
    **gate = 0;
    return OK(cuStreamWaitValue32(*s, dgate, 1, CU_STREAM_WAIT_VALUE_GEQ)) ? 0 : 4;
}

/* A blocking call (stream NULL) on device buffers waits for the device's earlier work; with
 * a stream of the job's held at a gate that nobody opens in time, the call returns
 * SHOAL_ERR_TIMEOUT within the communicator's timeout instead of waiting in cuCtxSynchronize
 * for ever; the stream, released later, drains. */
static int blocking_call_held_device(void)
{
    CUstream s;
    CUdeviceptr a, b;
    volatile uint32_t *gate;
    shoal_comm_t comm;
    shoal_status_t st;
    double t0, t1;
    int rc = held_stream(&s, &a, &b, &gate, &comm);
    if (rc != 0) {
        return rc;
    }
    t0 = shoal_time_ns() / 1e6;
    st = shoal_allreduce((void *)a, (void *)b, 1024, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL);
    t1 = shoal_time_ns() / 1e6;
    printf("# blocking call with a held stream: %s after %.0f ms\n", shoal_status_name(st),
           t1 - t0);
    fflush(stdout);
    if (st != SHOAL_ERR_TIMEOUT || t1 - t0 > 5000) {
        return 5;
    }
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    if (!OK(cuStreamSynchronize(s))) {
        return 6;
    }
    shoal_comm_abort(comm);
    return 0;
}

/* A stream-ordered call the driver refuses (a destroyed stream) returns its error and loses
 * nothing: the next call, on a good stream, completes at once, under each way of handing the
 * call to the proxy (a refused host function left its flag slot busy: the next call waited
 * the whole timeout for it, and so did every later one). */
static int refused_stream_call(void)
{
    CUstream s, dead;
    CUdeviceptr a, b;
    shoal_comm_t comm;
    shoal_uid_t uid;
    shoal_status_t st;
    double t0, t1;
    alarm(20);
    for (int sync = SHOAL_CUDA_SYNC_MEMOPS; sync <= SHOAL_CUDA_SYNC_HOSTFN; sync++) {
        shoal_cuda_config.sync = sync; /* read at the communicator's first device call */
        if (!OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) ||
            !OK(cuStreamCreate(&dead, CU_STREAM_NON_BLOCKING)) || !OK(cuStreamDestroy(dead)) ||
            !OK(cuMemAlloc(&a, 4096)) || !OK(cuMemAlloc(&b, 4096)) ||
            shoal_get_unique_id(&uid) != SHOAL_OK ||
            shoal_comm_init(&comm, 1, 0, &uid, NULL) != SHOAL_OK) {
            return 3;
        }
        st = shoal_allreduce((void *)a, (void *)b, 1024, SHOAL_FLOAT32, SHOAL_SUM, comm, dead);
        if (st == SHOAL_OK) {
            return 4;
        }
        t0 = shoal_time_ns() / 1e6;
        st = shoal_allreduce((void *)a, (void *)b, 1024, SHOAL_FLOAT32, SHOAL_SUM, comm, s);
        t1 = shoal_time_ns() / 1e6;
        printf("# %s: the call after a refused one: %s after %.0f ms\n",
               sync == SHOAL_CUDA_SYNC_MEMOPS ? "memops" : "hostfn", shoal_status_name(st),
               t1 - t0);
        fflush(stdout);
        if (st != SHOAL_OK || t1 - t0 > 500 || !OK(cuStreamSynchronize(s))) {
            return 5;
        }
        shoal_comm_destroy(comm);
        shoal_cuda_drv.cuStreamDestroy(s);
        shoal_cuda_drv.cuMemFree(a);
        shoal_cuda_drv.cuMemFree(b);
    }
    return 0;
}

/* Stream-ordered calls queued behind one that fails (the communicator aborted while the
 * stream was held): the first fails, and the ones behind it, which the proxy refuses without
 * running, must still release the stream: it drains once the gate opens (it waited for
 * their done words for ever, until shoal_comm_destroy). */
static int queued_calls_released(void)
{
    CUstream s;
    CUdeviceptr a, b;
    volatile uint32_t *gate;
    shoal_comm_t comm;
    double deadline;
    int rc = held_stream(&s, &a, &b, &gate, &comm);
    if (rc != 0) {
        return rc;
    }
    for (int i = 0; i < 4; i++) {
        if (shoal_allreduce((void *)a, (void *)b, 1024, SHOAL_FLOAT32, SHOAL_SUM, comm, s) !=
            SHOAL_OK) {
            return 5;
        }
    }
    shoal_comm_abort(comm);
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    deadline = shoal_time_ns() / 1e6 + 5000;
    while (shoal_cuda_drv.cuStreamQuery(s) == CUDA_ERROR_NOT_READY &&
           shoal_time_ns() / 1e6 < deadline) {
        shoal_sleep_us(1000);
    }
    if (shoal_cuda_drv.cuStreamQuery(s) == CUDA_ERROR_NOT_READY) {
        printf("# the stream is still held 5 s after the abort and the gate\n");
        fflush(stdout);
        return 6;
    }
    shoal_comm_destroy(comm);
    return 0;
}

static int misaligned_vector(void)
{
    CUstream s;
    CUdeviceptr a;
    if (!OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) || !OK(cuMemAlloc(&a, 4096))) {
        return 3;
    }
    if (launch(s, "shoal_reduce_f32_sum", a + 4, a + 4, 16, 1) != CUDA_SUCCESS) {
        return 4;
    }
    return shoal_cuda_drv.cuStreamSynchronize(s) == CUDA_ERROR_MISALIGNED_ADDRESS ? 0 : 5;
}

/* Work behind a wait on a host-mapped flag: nothing runs before the flag is set. */
static void stream_waits(void)
{
    CUstream s;
    CUevent ev;
    CUdeviceptr d, dflag;
    volatile uint32_t *flag;
    uint32_t *h;
    int ok = OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) && OK(cuMemAlloc(&d, 1 << 20)) &&
             OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING)) &&
             OK(cuMemHostAlloc((void **)&flag, 64, CU_MEMHOSTALLOC_DEVICEMAP)) &&
             OK(cuMemHostAlloc((void **)&h, 1 << 20, 0));
    if (!ok) {
        tap_ok(0, "stream waits: setup");
        return;
    }
    *flag = 0;
    ok = OK(cuMemHostGetDevicePointer(&dflag, (void *)flag, 0));
    memset(h, 0x11, 1 << 20);
    ok = ok && OK(cuMemcpyHtoDAsync(d, h, 1 << 20, s)) && OK(cuStreamSynchronize(s));
    ok = ok && OK(cuStreamWaitValue32(s, dflag, 7, CU_STREAM_WAIT_VALUE_GEQ)) &&
         OK(cuMemsetD8Async(d, 0x22, 1 << 20, s)) && OK(cuMemcpyDtoHAsync(h, d, 1 << 20, s)) &&
         OK(cuEventRecord(ev, s));
    shoal_sleep_us(20000);
    tap_ok(ok && shoal_cuda_drv.cuStreamQuery(s) == CUDA_ERROR_NOT_READY &&
           shoal_cuda_drv.cuEventQuery(ev) == CUDA_ERROR_NOT_READY && h[0] == 0x11111111u,
           "work behind an unreleased wait does not run (stream and event not ready, data old)");
    __atomic_store_n(flag, 6, __ATOMIC_RELAXED);
    shoal_sleep_us(5000);
    tap_ok(shoal_cuda_drv.cuStreamQuery(s) == CUDA_ERROR_NOT_READY,
           "a flag below the GEQ value keeps the stream waiting");
    __atomic_store_n(flag, 7, __ATOMIC_RELEASE);
    tap_ok(OK(cuEventSynchronize(ev)) && OK(cuStreamQuery(s)) && h[0] == 0x22222222u &&
           h[(1 << 18) - 1] == 0x22222222u, "released: the work ran in stream order");
    shoal_cuda_drv.cuMemFree(d);
    shoal_cuda_drv.cuMemFreeHost(h);
    shoal_cuda_drv.cuMemFreeHost((void *)flag);
    shoal_cuda_drv.cuEventDestroy(ev);
    shoal_cuda_drv.cuStreamDestroy(s);
}

static void ipc(void)
{
    CUdeviceptr d, o;
    CUipcMemHandle h;
    int fds[2], status = 0;
    pid_t pid;
    uint32_t v = 0;
    int ok = OK(cuMemAlloc(&d, 8192)) && OK(cuIpcGetMemHandle(&h, d));
    tap_ok(ok && shoal_cuda_drv.cuIpcOpenMemHandle(&o, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) !=
                     CUDA_SUCCESS, "an IPC handle cannot be opened by the process that made it");
    if (!ok || pipe(fds) != 0) {
        tap_ok(0, "IPC across processes: setup");
        return;
    }
    pid = fork();
    if (pid == 0) {
        /* the child writes through the handle it got; the parent reads its own allocation */
        CUstream s;
        uint32_t x = 0xabcd1234u;
        char c = 0;
        alarm(60);
        int good = OK(cuCtxSetCurrent(ctx)) && OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        good = good && OK(cuIpcOpenMemHandle(&o, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        good = good && OK(cuMemcpyHtoDAsync(o + 4096, &x, 4, s)) && OK(cuStreamSynchronize(s)) &&
               OK(cuIpcCloseMemHandle(o));
        c = good ? 'y' : 'n';
        if (write(fds[1], &c, 1) != 1) {
            _exit(2);
        }
        _exit(good ? 0 : 1);
    }
    close(fds[1]);
    {
        char c = 0;
        CUstream s;
        ok = read(fds[0], &c, 1) == 1 && c == 'y' && waitpid(pid, &status, 0) == pid &&
             WIFEXITED(status) && WEXITSTATUS(status) == 0;
        ok = ok && OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) &&
             OK(cuMemcpyDtoHAsync(&v, d + 4096, 4, s)) && OK(cuStreamSynchronize(s));
        close(fds[0]);
        tap_ok(ok && v == 0xabcd1234u, "another process writes through an opened IPC handle "
               "(read back 0x%08x)", v);
    }
    shoal_cuda_drv.cuMemFree(d);
}

int main(void)
{
    int status;
#ifdef FAKECUDA_PATH
    setenv("SHOAL_CUDA_LIBCUDA", FAKECUDA_PATH, 1);
#endif
    if (access(getenv("SHOAL_CUDA_LIBCUDA") ? getenv("SHOAL_CUDA_LIBCUDA") : "", R_OK) != 0) {
        tap_skip_all("libfakecuda not built");
        return 0;
    }
    setenv("SHOAL_TIMEOUT_MS", "1000", 1); /* the destroy case waits this long */
    shoal_config_global_init();
    if (shoal_cuda_drv_load() != SHOAL_OK || !setup()) {
        tap_bail("the emulated driver does not load: %s", shoal_cuda_drv_reason());
        return 1;
    }
    tap_diag("the child of the next case crashes on purpose (a sanitizer may report it)");
    status = in_child(host_reads_device);
    tap_ok(status != -1 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0),
           "a host read of a device pointer crashes (wait status 0x%x)", status);
    stream_waits();
    child_ok(fault_then_shoal, "an out-of-bounds kernel is a sticky illegal-address fault; "
             "shoal calls then fail with SHOAL_ERR_SYSTEM, no hang");
    child_ok(destroy_while_held, "destroy while a stream has not reached its call: returns "
             "within the timeout, the stream passes later without a fault");
    child_ok(blocking_call_held_device, "a blocking call while a stream of the job's is held: "
             "SHOAL_ERR_TIMEOUT within the timeout, no wait for ever in cuCtxSynchronize");
    child_ok(refused_stream_call, "a stream-ordered call on a destroyed stream fails and loses "
             "nothing: the next one completes at once, memops and hostfn");
    child_ok(queued_calls_released,
             "stream-ordered calls queued behind a failed one release their stream");
    child_ok(misaligned_vector,
             "16-byte vector access on a misaligned pointer is a misaligned-address fault");
    ipc();
    return tap_done();
}
