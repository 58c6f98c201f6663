/* libfakecuda (tests/gpu/fakecuda.c): the host build of the reduce kernels, shared by the C
 * driver emulation and fakecuda_kern.cc. */
#ifndef SHOAL_TESTS_FAKECUDA_H
#define SHOAL_TESTS_FAKECUDA_H

#include "cuda/kern_abi.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A shoal_reduce_<dtype>_<op> kernel compiled for the host. */
typedef void (*fakecuda_kern_fn)(void *dst, shoal_cuda_srcs_t srcs, int nsrc,
                                 unsigned long long count, int avg_div, int vec);

/* The kernel named name (its element size in *esize_p), or NULL. */
fakecuda_kern_fn fakecuda_kern_find(const char *name, size_t *esize_p);

/* Runs fn as a grid x block launch: every block, every thread, one after the other (the
 * kernels have no shared memory and no barriers, so any order is a valid schedule). */
void fakecuda_kern_run(fakecuda_kern_fn fn, unsigned grid, unsigned block, void *dst,
                       shoal_cuda_srcs_t srcs, int nsrc, unsigned long long count, int avg_div,
                       int vec);

/* Runs the stream-wait kernel (SHOAL_CUDA_WAIT_KERNEL) on the calling stream thread. */
void fakecuda_kern_wait(const unsigned int *word, unsigned int seq,
                        unsigned long long timeout_ns);

#ifdef __cplusplus
}
#endif

#endif
