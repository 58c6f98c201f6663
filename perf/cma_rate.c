/*
 * cma_rate: what a single copy through the kernel (process_vm_readv, the single-copy path of
 * the ucx transport and of the intra-node AllReduce) costs against memcpy, by size: the input
 * of SHOAL_UCX_CMA_MIN's rule (src/tune/tune.c).
 *
 * A forked child owns the source buffer (written once, then it sleeps); the parent reads it
 * with process_vm_readv into its own buffer, REPS x ITER times per size, and copies the same
 * sizes with memcpy between two of its own buffers. Best of REPS, per call. Both buffers are
 * allocated once and faulted in before timing. Needs ptrace permission on the child (same
 * user; Yama ptrace_scope 0 or 1: the child is a descendant).
 *
 * usage: cma_rate [-b MIN] [-e MAX] [-r REPS]   (defaults: 4k, 4m, 5)
 * Prints one line per size: "size S cma_ns X cma_GBps Y memcpy_ns Z memcpy_GBps W".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "perf/perf_args.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    size_t lo = 4096, hi = 4 << 20;
    int reps = 5, opt, bad;
    char *src, *dst, *dst2;
    pid_t child;

    while ((opt = getopt(argc, argv, "b:e:r:")) != -1) {
        switch (opt) {
        case 'b': bad = perf_arg_size(optarg, &lo); break;
        case 'e': bad = perf_arg_size(optarg, &hi); break;
        case 'r': bad = perf_arg_int(optarg, 1, 1000000, &reps); break;
        default: bad = -1; break;
        }
        if (bad != 0) {
            fprintf(stderr, "usage: cma_rate [-b MIN] [-e MAX] [-r REPS]\n");
            return 2;
        }
    }
    if (lo == 0 || hi < lo || reps < 1) {
        fprintf(stderr, "cma_rate: bad sizes or repetitions\n");
        return 2;
    }
    src = aligned_alloc(4096, (hi + 4095) & ~(size_t)4095);
    dst = aligned_alloc(4096, (hi + 4095) & ~(size_t)4095);
    dst2 = aligned_alloc(4096, (hi + 4095) & ~(size_t)4095);
    if (src == NULL || dst == NULL || dst2 == NULL) {
        fprintf(stderr, "cma_rate: out of memory\n");
        return 1;
    }
    memset(src, 1, hi);
    memset(dst, 0, hi);
    memset(dst2, 0, hi);
    child = fork();
    if (child < 0) {
        perror("cma_rate: fork");
        return 1;
    }
    if (child == 0) {
        alarm(600); /* never outlives a parent that could not kill it */
        for (;;) {
            pause();
        }
    }
    for (size_t s = lo; s <= hi; s *= 2) {
        int iter = (int)(8192 * 4096 / s) + 20;
        double best_cma = 1e30, best_cpy = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now_ns();
            for (int i = 0; i < iter; i++) {
                struct iovec l = {dst, s}, rm = {src, s};
                if (process_vm_readv(child, &l, 1, &rm, 1, 0) != (ssize_t)s) {
                    fprintf(stderr, "cma_rate: process_vm_readv: %s\n", strerror(errno));
                    kill(child, SIGKILL);
                    waitpid(child, NULL, 0);
                    return 1;
                }
            }
            double t = (now_ns() - t0) / iter;
            best_cma = t < best_cma ? t : best_cma;
            t0 = now_ns();
            for (int i = 0; i < iter; i++) {
                memcpy(dst2, dst, s);
                __asm__ volatile("" : : "r"(dst2) : "memory");
            }
            t = (now_ns() - t0) / iter;
            best_cpy = t < best_cpy ? t : best_cpy;
        }
        printf("size %zu cma_ns %.0f cma_GBps %.2f memcpy_ns %.0f memcpy_GBps %.2f\n", s, best_cma,
               (double)s / best_cma, best_cpy, (double)s / best_cpy);
        fflush(stdout);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    free(src);
    free(dst);
    free(dst2);
    return 0;
}
