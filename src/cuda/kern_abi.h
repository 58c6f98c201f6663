/* What the host code and the kernels (kernels.cu) agree on: the source-pointer block passed
 * by value to every reduce kernel, the block size, the kernel names. Plain C, no CUDA. */
#ifndef SHOAL_CUDA_KERN_ABI_H
#define SHOAL_CUDA_KERN_ABI_H

/* Sources per launch; more are reduced in passes, and fp16/bf16 are rounded after each pass.
 * The IPC AllReduce (at most this many ranks) reduces in one pass: rounded once, as the host
 * kernels do (with 16, 17 ranks or more rounded the first 16's partial sum). 512 bytes of
 * kernel parameters, well under their 4 KiB limit. */
#define SHOAL_CUDA_MAX_SRCS 64
#define SHOAL_CUDA_THREADS 512    /* threads per block */
#define SHOAL_CUDA_BLOCKS_PER_SM 2 /* __launch_bounds__ minimum: <= 64 registers */

typedef struct {
    const void *p[SHOAL_CUDA_MAX_SRCS];
} shoal_cuda_srcs_t;

/* Kernel name parts, indexed by shoal_dtype_t and shoal_op_t (AVG runs the sum kernel with
 * avg_div = nranks). Kernel "shoal_reduce_<dtype>_<op>"; its parameters:
 * (void *dst, shoal_cuda_srcs_t srcs, int nsrc, unsigned long long count, int avg_div,
 *  int vec). */
#define SHOAL_CUDA_DTYPE_NAMES {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64"}
#define SHOAL_CUDA_OP_NAMES {"sum", "prod", "min", "max", "sum"}

/* The stream-side wait of SHOAL_CUDA_SYNC=hostfn (no stream memory operations): one thread
 * polls a host-mapped word until it reaches seq (cyclic 32-bit >=, as
 * CU_STREAM_WAIT_VALUE_GEQ) or timeout_ns passed (~0: never). Its parameters:
 * (const unsigned int *word, unsigned int seq, unsigned long long timeout_ns). */
#define SHOAL_CUDA_WAIT_KERNEL "shoal_stream_wait"

#endif
