// perf/gpu_share_probe.cu: two mechanisms under the stream-ordered collectives of
// src/cuda/cuda_api.c, measured on the GPU (built and run by perf/gpu_share.sh):
//  1. the round trip of stream memory operations in one process: the host stores done = k
//     in a host-mapped word, the stream (waiting on done >= k) then writes ack = k, the host
//     sees it (a stream-ordered call's end and the next call's start signal);
//  2. what another process's work on the same GPU costs this one: process B times an empty
//     kernel launch + stream synchronize while process A is idle, while A's stream is blocked
//     on cuStreamWaitValue32 (a stream-ordered call in flight), and while A runs a kernel
//     polling a host word (SHOAL_CUDA_SYNC=hostfn's wait);
//  3. the hand-over pattern of a collective between two processes on one GPU: A runs an empty
//     kernel on a work stream and polls it done, then B does, 200 times (a round = both),
//     with each process's other stream idle, then blocked on cuStreamWaitValue32 the whole
//     time (what a stream-ordered call's user stream does while the collective runs);
//  4. (legacy) what a stream held in cuStreamWaitValue32 stalls in its own process: the holder
//     is the legacy default stream (PyTorch's), a created blocking stream or a non-blocking
//     one, or the legacy stream waiting on an event behind a held stream (PyTorch's
//     work.wait()); then one operation on another, non-blocking stream (an empty kernel, a
//     device-to-device copy, a copy from pinned memory, a memset, a cuMemAlloc) and whether
//     it completes while the holder is held. A thread releases the holder after 1 s, so
//     "held=1 us=~1000000" means the operation waited for the holder. A stream-ordered
//     collective on the legacy stream hung on this GPU with PyTorch (2026-12-04);
//  5. (handover) a stream-ordered collective's hand-overs between two processes on one GPU, as
//     src/cuda/cuda_api.c does them: each process's stream holds, per call k, a write of
//     start = k and a wait for done >= k, all queued first; each host loop waits for start k,
//     meets the other process (shared memory), runs an empty kernel on a work stream and
//     polls it done, meets again, stores done = k. Per call: the median of the time between
//     two starts seen. The host's store of done rings no doorbell: if the context waiting
//     for it is not the one on the GPU, it may wait for the other's time slice to end (the
//     suspected 11.6 ms per stream-ordered AllReduce of 2 ranks without MPS). So three ways
//     after the store: nothing, a stream write on the work stream, an empty kernel on it
//     (a "kick": new work for this context).
//  6. (lock) whether another thread's blocking CUDA call, waiting behind a held stream, blocks
//     this thread's driver calls (a lock held in the driver while it waits). A stream-ordered
//     call's proxy thread must issue device work (copies, kernels) while the caller's stream
//     holds the call's cuStreamWaitValue32; PyTorch's user then typically reads the result,
//     t.cpu(): a copy to pageable memory on that stream, which blocks its thread until the
//     stream gets there. The 2026-12-04 hangs had that shape, and part 4 (one
//     thread) cannot see such a lock. Per case: the holder (legacy or a non-blocking stream)
//     waits on a host word; a "user" thread enters one blocking call behind it (a copy to
//     pageable memory on the holder, a copy to pinned memory and a stream synchronize, a
//     stream synchronize, a context synchronize, an event synchronize); 50 ms later this
//     thread issues one operation on a non-blocking stream (a device copy, an empty kernel)
//     and polls it. A release thread stores the word after 500 ms. issue_us ~ 450000 means the
//     driver call itself waited for the user's call (a lock); done_while_held=0 with a short
//     issue_us means the GPU ran it only after the holder.
// Output: "probe what=... median_us=... p90_us=..." lines. Not part of the library's build.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                               \
    do {                                                                                    \
        CUresult r_ = (x);                                                                  \
        if (r_ != CUDA_SUCCESS) {                                                           \
            const char *s_;                                                                 \
            cuGetErrorString(r_, &s_);                                                      \
            printf("probe what=error call=%s msg=\"%s\"\n", #x, s_);                        \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, int n)
{
    qsort(v, n, sizeof(*v), cmp);
    printf("probe what=%s median_us=%.1f p90_us=%.1f max_us=%.1f\n", what, v[n / 2],
           v[n * 9 / 10], v[n - 1]);
    fflush(stdout);
}

__global__ void empty(void) {}

__global__ void poll_host(const volatile unsigned *word)
{
    while (*word == 0) {
        __nanosleep(1000);
    }
}

static CUstream setup(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

static volatile unsigned *host_word(CUdeviceptr *d)
{
    volatile unsigned *w;
    CK(cuMemHostAlloc((void **)&w, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    memset((void *)w, 0, 64);
    CK(cuMemHostGetDevicePointer(d, (void *)w, 0));
    return w;
}

enum { N = 200 };

static void roundtrip(void)
{
    CUstream s = setup();
    CUdeviceptr dd, da;
    volatile unsigned *done = host_word(&dd), *ack = host_word(&da);
    double v[N];
    for (unsigned k = 1; k <= N; k++) {
        CK(cuStreamWaitValue32(s, dd, k, CU_STREAM_WAIT_VALUE_GEQ));
        CK(cuStreamWriteValue32(s, da, k, CU_STREAM_WRITE_VALUE_DEFAULT));
    }
    usleep(100000);
    for (unsigned k = 1; k <= N; k++) {
        double t0 = now_us();
        __atomic_store_n(done, k, __ATOMIC_RELEASE);
        while (__atomic_load_n(ack, __ATOMIC_ACQUIRE) != k) {
            if (now_us() - t0 > 1e6) {
                printf("probe what=error msg=\"no ack within 1 s\"\n");
                exit(1);
            }
        }
        v[k - 1] = now_us() - t0;
    }
    CK(cuStreamSynchronize(s));
    report("memops_roundtrip", v, N);
}

// B: N times an empty kernel and a synchronize, after a byte on cmd; the median back on res.
static void other_b(int cmd, int res)
{
    CUstream s = setup();
    char c;
    empty<<<1, 1, 0, s>>>();
    CK(cuStreamSynchronize(s));
    while (read(cmd, &c, 1) == 1) {
        double v[N];
        for (int i = 0; i < N; i++) {
            double t0 = now_us();
            empty<<<1, 1, 0, s>>>();
            CK(cuStreamSynchronize(s));
            v[i] = now_us() - t0;
        }
        if (write(res, v, sizeof(v)) != (ssize_t)sizeof(v)) {
            exit(1);
        }
    }
    exit(0);
}

static void other_ctx(void)
{
    int cmd[2], res[2];
    if (pipe(cmd) || pipe(res)) {
        exit(1);
    }
    pid_t pid = fork(); // before any CUDA call in this process
    if (pid == 0) {
        close(cmd[1]);
        close(res[0]);
        other_b(cmd[0], res[1]);
    }
    close(cmd[0]);
    close(res[1]);
    CUstream s = setup();
    CUdeviceptr dw;
    volatile unsigned *w = host_word(&dw);
    static const char *const names[] = {"other_ctx_idle", "other_ctx_stream_waitvalue",
                                        "other_ctx_polling_kernel"};
    for (int cond = 0; cond < 3; cond++) {
        double v[N];
        char c = 1;
        *w = 0;
        if (cond == 1) {
            CK(cuStreamWaitValue32(s, dw, 1, CU_STREAM_WAIT_VALUE_GEQ));
        } else if (cond == 2) {
            poll_host<<<1, 1, 0, s>>>((const volatile unsigned *)dw);
        }
        usleep(50000);
        if (write(cmd[1], &c, 1) != 1) {
            exit(1);
        }
        for (size_t got = 0; got < sizeof(v);) {
            ssize_t r = read(res[0], (char *)v + got, sizeof(v) - got);
            if (r <= 0) {
                exit(1);
            }
            got += (size_t)r;
        }
        __atomic_store_n(w, 1, __ATOMIC_RELEASE);
        CK(cuStreamSynchronize(s));
        report(names[cond], v, N);
    }
    close(cmd[1]);
    waitpid(pid, NULL, 0);
}

// Waits (bounded: 5 s) until *word == want; 0, or -1 on timeout.
static int spin_until(volatile int *word, int want)
{
    double t0 = now_us();
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) != want) {
        if (now_us() - t0 > 5e6) {
            return -1;
        }
    }
    return 0;
}

// A zeroed page shared with a child forked before any CUDA call; *me_p: 1 in the child (B).
static volatile int *fork_shared(pid_t *pid_p, int *me_p)
{
    volatile int *sh = (volatile int *)mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        exit(1);
    }
    memset((void *)sh, 0, 4096);
    *pid_p = fork();
    *me_p = *pid_p == 0;
    return sh;
}

static void pingpong(void)
{
    // shared between the two processes: whose turn, and how many are ready per condition
    pid_t pid;
    int me;
    volatile int *sh = fork_shared(&pid, &me);
    CUstream k = setup(), u;
    CUdeviceptr dw;
    volatile unsigned *w = host_word(&dw);
    CK(cuStreamCreate(&u, CU_STREAM_NON_BLOCKING));
    empty<<<1, 1, 0, k>>>();
    CK(cuStreamSynchronize(k));
    static const char *const names[] = {"pingpong_other_stream_idle",
                                        "pingpong_other_stream_waitvalue"};
    for (int cond = 0; cond < 2; cond++) {
        double v[N];
        *w = 0;
        if (cond == 1) {
            CK(cuStreamWaitValue32(u, dw, 1, CU_STREAM_WAIT_VALUE_GEQ));
        }
        __atomic_add_fetch(&sh[1 + cond], 1, __ATOMIC_ACQ_REL); // both ready
        if (spin_until(&sh[1 + cond], 2) != 0) {
            printf("probe what=error msg=\"peer not ready\"\n");
            exit(1);
        }
        for (int i = 0; i < N; i++) {
            double t0 = now_us();
            for (int turn = 0; turn < 2; turn++) {
                if (turn == me) {
                    empty<<<1, 1, 0, k>>>();
                    CUresult r;
                    double tq = now_us();
                    while ((r = cuStreamQuery(k)) == CUDA_ERROR_NOT_READY) {
                        if (now_us() - tq > 5e6) {
                            printf("probe what=error msg=\"kernel not done within 5 s\"\n");
                            exit(1);
                        }
                    }
                    CK(r);
                    __atomic_store_n(&sh[0], 1 - me, __ATOMIC_RELEASE);
                } else if (spin_until(&sh[0], me) != 0) {
                    printf("probe what=error msg=\"no hand-over within 5 s\"\n");
                    exit(1);
                }
            }
            v[i] = now_us() - t0;
        }
        __atomic_store_n(w, 1, __ATOMIC_RELEASE);
        CK(cuStreamSynchronize(u));
        if (me == 0) {
            report(names[cond], v, N);
        }
        __atomic_store_n(&sh[0], 0, __ATOMIC_RELEASE); // A starts the next condition
    }
    if (me == 1) {
        exit(0);
    }
    waitpid(pid, NULL, 0);
}

// ---- 4. legacy ----

static volatile unsigned *legacy_word;
static unsigned legacy_k;

// Stores legacy_k into the held word after arg microseconds (the holder's release).
static void *legacy_release(void *arg)
{
    uintptr_t us = (uintptr_t)arg;
    struct timespec t = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&t, NULL);
    __atomic_store_n(legacy_word, legacy_k, __ATOMIC_RELEASE);
    return NULL;
}

// holder: 0 legacy, 1 created blocking, 2 created non-blocking, 3 legacy waiting on an event
// of a held non-blocking stream. op: 0 kernel, 1 dtod, 2 htod pinned, 3 memset, 4 alloc.
static void legacy_case(CUstream w, CUdeviceptr dw, int holder, int op, CUdeviceptr a,
                        CUdeviceptr b, void *pinned)
{
    static const char *const hn[] = {"legacy", "blocking", "nonblocking", "legacy_on_event"};
    static const char *const on[] = {"kernel", "dtod", "htod_pinned", "memset", "alloc"};
    const size_t bytes = 1 << 20;
    CUstream h = CU_STREAM_LEGACY, extra = NULL;
    CUevent ev = NULL;
    CUdeviceptr got = 0;
    pthread_t th;
    legacy_k++;
    if (holder == 1 || holder == 2) {
        CK(cuStreamCreate(&h, holder == 1 ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING));
    }
    if (holder == 3) {
        CK(cuStreamCreate(&extra, CU_STREAM_NON_BLOCKING));
        CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        CK(cuStreamWaitValue32(extra, dw, legacy_k, CU_STREAM_WAIT_VALUE_GEQ));
        CK(cuEventRecord(ev, extra));
        CK(cuStreamWaitEvent(CU_STREAM_LEGACY, ev, 0));
    } else {
        CK(cuStreamWaitValue32(h, dw, legacy_k, CU_STREAM_WAIT_VALUE_GEQ));
    }
    usleep(10000);
    pthread_create(&th, NULL, legacy_release, (void *)(uintptr_t)1000000);
    double t0 = now_us();
    switch (op) {
    case 0: empty<<<1, 1, 0, w>>>(); break;
    case 1: CK(cuMemcpyDtoDAsync(b, a, bytes, w)); break;
    case 2: CK(cuMemcpyHtoDAsync(a, pinned, bytes, w)); break;
    case 3: CK(cuMemsetD32Async(b, 7, bytes / 4, w)); break;
    default: CK(cuMemAlloc(&got, bytes)); break;
    }
    while (cuStreamQuery(w) == CUDA_ERROR_NOT_READY && now_us() - t0 < 5e6) {
        usleep(50);
    }
    double us = now_us() - t0; // 5 s: not even after the release (printed as such)
    pthread_join(th, NULL);
    CK(cuCtxSynchronize());
    printf("probe what=legacy_hold holder=%s op=%s done_while_held=%d us=%.1f%s\n", hn[holder],
           on[op], us < 900000.0, us, us >= 5e6 ? " stuck=1" : "");
    fflush(stdout);
    if (us >= 5e6) {
        exit(1); // the context cannot be trusted for the next cases
    }
    if (got != 0) {
        CK(cuMemFree(got));
    }
    if (holder == 1 || holder == 2) {
        CK(cuStreamDestroy(h));
    }
    if (extra != NULL) {
        CK(cuEventDestroy(ev));
        CK(cuStreamDestroy(extra));
    }
}

static void legacy(void)
{
    CUstream w = setup();
    CUdeviceptr dw, a, b;
    void *pinned;
    legacy_word = host_word(&dw);
    CK(cuMemAlloc(&a, 1 << 20));
    CK(cuMemAlloc(&b, 1 << 20));
    CK(cuMemHostAlloc(&pinned, 1 << 20, 0));
    for (int holder = 0; holder < 4; holder++) {
        for (int op = 0; op < 5; op++) {
            legacy_case(w, dw, holder, op, a, b, pinned);
        }
    }
}

// ---- 5. handover ----

static void handover(void)
{
    enum { M = 40 };
    pid_t pid;
    int me;
    volatile int *sh = fork_shared(&pid, &me);
    CUstream w = setup(), u;
    CUdeviceptr dstart, ddone, dkick;
    volatile unsigned *start = host_word(&dstart), *done = host_word(&ddone);
    host_word(&dkick);
    CK(cuStreamCreate(&u, CU_STREAM_NON_BLOCKING));
    empty<<<1, 1, 0, w>>>();
    CK(cuStreamSynchronize(w));
    static const char *const names[] = {"handover_no_kick", "handover_kick_write",
                                        "handover_kick_kernel"};
    volatile int *meet = sh + 16; // [cond][2 meetings][2 processes], ints
    for (int cond = 0; cond < 3; cond++) {
        double v[M], t_prev = 0;
        unsigned base = (unsigned)cond * 1000u;
        for (unsigned k = 1; k <= M; k++) {
            CK(cuStreamWriteValue32(u, dstart, base + k, CU_STREAM_WRITE_VALUE_DEFAULT));
            CK(cuStreamWaitValue32(u, ddone, base + k, CU_STREAM_WAIT_VALUE_GEQ));
        }
        __atomic_add_fetch(&sh[1 + cond], 1, __ATOMIC_ACQ_REL); // both ready
        if (spin_until(&sh[1 + cond], 2) != 0) {
            printf("probe what=error msg=\"peer not ready\"\n");
            exit(1);
        }
        for (int k = 1; k <= M; k++) {
            double t0 = now_us();
            while (__atomic_load_n(start, __ATOMIC_ACQUIRE) != base + (unsigned)k) {
                if (now_us() - t0 > 5e6) {
                    printf("probe what=error msg=\"start %d not seen within 5 s\"\n", k);
                    exit(1);
                }
            }
            double t = now_us();
            if (k > 1) {
                v[k - 2] = t - t_prev;
            }
            t_prev = t;
            for (int m = 0; m < 2; m++) {
                volatile int *mine = meet + (cond * 2 + m) * 2;
                __atomic_store_n(&mine[me], k, __ATOMIC_RELEASE);
                double tm = now_us();
                while (__atomic_load_n(&mine[1 - me], __ATOMIC_ACQUIRE) < k) {
                    if (now_us() - tm > 5e6) {
                        printf("probe what=error msg=\"no meeting within 5 s\"\n");
                        exit(1);
                    }
                }
                if (m == 0) { // the collective's device work
                    empty<<<1, 1, 0, w>>>();
                    while (cuStreamQuery(w) == CUDA_ERROR_NOT_READY) {
                    }
                }
            }
            __atomic_store_n(done, base + (unsigned)k, __ATOMIC_RELEASE);
            if (cond == 1) {
                CK(cuStreamWriteValue32(w, dkick, (unsigned)k, CU_STREAM_WRITE_VALUE_DEFAULT));
            } else if (cond == 2) {
                empty<<<1, 1, 0, w>>>();
            }
        }
        CK(cuStreamSynchronize(u));
        CK(cuStreamSynchronize(w));
        if (me == 0) {
            report(names[cond], v, M - 1);
        }
    }
    if (me == 1) {
        exit(0);
    }
    waitpid(pid, NULL, 0);
}

// ---- 6. lock ----

typedef struct {
    CUcontext ctx;
    CUstream holder;
    int blocker;
    CUdeviceptr src;
    void *pageable, *pinned;
    CUevent ev;
    double done_us; // when the user's call returned (now_us)
} lock_user_t;

static void *lock_user(void *arg)
{
    lock_user_t *u = (lock_user_t *)arg;
    const size_t bytes = 1 << 20;
    CK(cuCtxSetCurrent(u->ctx));
    switch (u->blocker) {
    case 0: CK(cuMemcpyDtoHAsync(u->pageable, u->src, bytes, u->holder)); break;
    case 1:
        CK(cuMemcpyDtoHAsync(u->pinned, u->src, bytes, u->holder));
        CK(cuStreamSynchronize(u->holder));
        break;
    case 2: CK(cuStreamSynchronize(u->holder)); break;
    case 3: CK(cuCtxSynchronize()); break;
    default:
        CK(cuEventRecord(u->ev, u->holder));
        CK(cuEventSynchronize(u->ev));
        break;
    }
    u->done_us = now_us();
    return NULL;
}

static void lock(void)
{
    static const char *const hn[] = {"legacy", "nonblocking"};
    static const char *const bn[] = {"dtoh_pageable", "dtoh_pinned_sync", "stream_sync",
                                     "ctx_sync", "event_sync"};
    static const char *const on[] = {"dtod", "kernel"};
    const size_t bytes = 1 << 20;
    CUstream w = setup();
    CUdeviceptr dw, a, b;
    lock_user_t u;
    memset(&u, 0, sizeof(u));
    legacy_word = host_word(&dw);
    CK(cuCtxGetCurrent(&u.ctx));
    CK(cuMemAlloc(&a, bytes));
    CK(cuMemAlloc(&b, bytes));
    CK(cuMemHostAlloc(&u.pinned, bytes, 0));
    u.pageable = malloc(bytes);
    memset(u.pageable, 0, bytes);
    CK(cuEventCreate(&u.ev, CU_EVENT_DISABLE_TIMING));
    u.src = a;
    for (int holder = 0; holder < 2; holder++) {
        CUstream h = CU_STREAM_LEGACY;
        if (holder == 1) {
            CK(cuStreamCreate(&h, CU_STREAM_NON_BLOCKING));
        }
        for (int blocker = 0; blocker < 5; blocker++) {
            for (int op = 0; op < 2; op++) {
                pthread_t tu, tr;
                legacy_k++;
                CK(cuStreamWaitValue32(h, dw, legacy_k, CU_STREAM_WAIT_VALUE_GEQ));
                u.holder = h;
                u.blocker = blocker;
                u.done_us = 0;
                double t0 = now_us();
                pthread_create(&tr, NULL, legacy_release, (void *)(uintptr_t)500000);
                pthread_create(&tu, NULL, lock_user, &u);
                usleep(50 * 1000); // the user thread is inside its call
                double t1 = now_us();
                if (op == 0) {
                    CK(cuMemcpyDtoDAsync(b, a, bytes, w));
                } else {
                    empty<<<1, 1, 0, w>>>();
                }
                double t2 = now_us();
                while (cuStreamQuery(w) == CUDA_ERROR_NOT_READY && now_us() - t1 < 5e6) {
                    usleep(50);
                }
                double t3 = now_us();
                pthread_join(tr, NULL);
                pthread_join(tu, NULL);
                CK(cuCtxSynchronize());
                printf("probe what=lock holder=%s blocker=%s op=%s issue_us=%.1f done_us=%.1f "
                       "done_while_held=%d user_returned_us=%.1f%s\n",
                       hn[holder], bn[blocker], on[op], t2 - t1, t3 - t1, t3 < t0 + 450000.0,
                       u.done_us - t0, t3 - t1 >= 5e6 ? " stuck=1" : "");
                fflush(stdout);
                if (t3 - t1 >= 5e6) {
                    exit(1); // the context cannot be trusted for the next cases
                }
            }
        }
        if (holder == 1) {
            CK(cuStreamDestroy(h));
        }
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "roundtrip") == 0) {
        roundtrip();
    } else if (argc > 1 && strcmp(argv[1], "other") == 0) {
        other_ctx();
    } else if (argc > 1 && strcmp(argv[1], "pingpong") == 0) {
        pingpong();
    } else if (argc > 1 && strcmp(argv[1], "legacy") == 0) {
        legacy();
    } else if (argc > 1 && strcmp(argv[1], "handover") == 0) {
        handover();
    } else if (argc > 1 && strcmp(argv[1], "lock") == 0) {
        lock();
    } else {
        fprintf(stderr, "usage: gpu_share_probe roundtrip|other|pingpong|legacy|handover|lock\n");
        return 2;
    }
    return 0;
}
