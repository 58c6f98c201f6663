/*
 * Compute/communication overlap on one GPU: a compute kernel on one stream, an AllReduce of
 * device buffers on another (stream-ordered shoal_allreduce), both at once.
 * Prints the time of each alone and of both together; overlap efficiency =
 * both / max(compute, allreduce): 1.0 is perfect overlap, 2.0 none.
 *
 *   shoalrun -n 2 ./examples/cuda_overlap [MiB]     (default 64 MiB of float32)
 *
 * Every rank uses GPU (local rank % device count). The compute kernel is PTX text loaded with
 * cudaLibraryLoadData, so this example is plain C built by the C compiler.
 */
#include <shoal.h>

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char spin_ptx[] =
    ".version 7.5\n.target sm_75\n.address_size 64\n"
    ".visible .entry spin(.param .u64 p0, .param .u32 p1)\n{\n"
    "  .reg .pred %p<3>;\n  .reg .f32 %f<4>;\n  .reg .b32 %r<8>;\n  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p0];\n  ld.param.u32 %r1, [p1];\n  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mov.u32 %r2, %ntid.x;\n  mov.u32 %r3, %ctaid.x;\n  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r3, %r2, %r4;\n  mul.wide.s32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n  ld.global.f32 %f1, [%rd4];\n  mov.u32 %r6, 0;\n"
    "  setp.lt.s32 %p1, %r1, 1;\n  @%p1 bra DONE;\n"
    "LOOP:\n  fma.rn.f32 %f1, %f1, 0f3F7FFFF0, 0f3A83126F;\n  add.s32 %r6, %r6, 1;\n"
    "  setp.lt.s32 %p2, %r6, %r1;\n  @%p2 bra LOOP;\n"
    "DONE:\n  st.global.f32 [%rd4], %f1;\n  ret;\n}\n";

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                 \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef struct {
    shoal_comm_t comm;
    cudaStream_t sk, sc;
    cudaKernel_t spin;
    float *work, *grad;
    size_t count;
    int iters, reps, blocks;
} overlap_t;

/* what: 1 compute, 2 allreduce, 3 both. Returns ms (every rank starts together). */
static double run(overlap_t *o, int what)
{
    void *args[] = {&o->work, &o->iters};
    double t0;
    shoal_barrier(o->comm, NULL);
    t0 = now_ms();
    if (what & 1) {
        dim3 grid = {(unsigned)o->blocks, 1, 1}, block = {256, 1, 1};
        cudaLaunchKernel((const void *)o->spin, grid, block, args, 0, o->sk);
    }
    for (int r = 0; (what & 2) && r < o->reps; r++) {
        shoal_allreduce(o->grad, o->grad, o->count, SHOAL_FLOAT32, SHOAL_SUM, o->comm, o->sc);
    }
    cudaStreamSynchronize(o->sk);
    cudaStreamSynchronize(o->sc);
    return now_ms() - t0;
}

int main(int argc, char **argv)
{
    overlap_t o = {.reps = 5, .blocks = 1024};
    cudaLibrary_t lib;
    int rank, n, ndev = 1;
    double t_comp, t_comm, t_both, eff;
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 64;

    if (shoal_comm_init_env(&o.comm, NULL) != SHOAL_OK) {
        fprintf(stderr, "shoal_comm_init_env failed\n");
        return 1;
    }
    shoal_comm_rank(o.comm, &rank);
    shoal_comm_size(o.comm, &n);
    CK(cudaGetDeviceCount(&ndev));
    CK(cudaSetDevice(rank % ndev));
    CK(cudaStreamCreateWithFlags(&o.sk, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&o.sc, cudaStreamNonBlocking));
    CK(cudaLibraryLoadData(&lib, spin_ptx, NULL, NULL, 0, NULL, NULL, 0));
    CK(cudaLibraryGetKernel(&o.spin, lib, "spin"));
    o.count = (mib << 20) / sizeof(float);
    CK(cudaMalloc((void **)&o.grad, o.count * sizeof(float)));
    CK(cudaMalloc((void **)&o.work, (size_t)o.blocks * 256 * sizeof(float)));
    CK(cudaMemset(o.grad, 0, o.count * sizeof(float)));
    CK(cudaMemset(o.work, 0, (size_t)o.blocks * 256 * sizeof(float)));

    /* Warm up both, then size the compute to last as long as the AllReduce. */
    o.iters = 1000;
    run(&o, 3);
    t_comm = run(&o, 2);
    t_comp = run(&o, 1);
    o.iters = (int)(o.iters * t_comm / (t_comp > 0.01 ? t_comp : 0.01));
    if (o.iters < 1) {
        o.iters = 1;
    }
    /* every rank must use the same iteration count: rank 0's */
    shoal_broadcast(&o.iters, &o.iters, 1, SHOAL_INT32, 0, o.comm, NULL);
    t_comp = run(&o, 1);
    t_comm = run(&o, 2);
    t_both = run(&o, 3);
    eff = t_both / (t_comp > t_comm ? t_comp : t_comm);
    if (rank == 0) {
        printf("cuda_overlap: %d ranks, %zu MiB x %d AllReduce: compute %.2f ms, allreduce %.2f ms,"
               " both %.2f ms, overlap efficiency %.3f\n", n, mib, o.reps, t_comp, t_comm,
               t_both, eff);
    }
    cudaFree(o.grad);
    cudaFree(o.work);
    cudaLibraryUnload(lib);
    shoal_comm_destroy(o.comm);
    return 0;
}
