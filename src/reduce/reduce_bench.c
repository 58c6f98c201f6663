/* reduce_bench: bandwidth of the CPU reduction kernels on large buffers, against memcpy of the
 * same size. Not a test; run by hand: ./reduce_bench [MiB per buffer] [iterations].
 * GB/s counts the bytes the call moves: reduce2 reads a and b and writes dst (3 x size),
 * memcpy reads and writes (2 x size). Buffers are faulted in before timing. Prints to stdout
 * (this is a tool, not the library). */
#include "reduce/reduce_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    shoal_dtype_t dtype;
    shoal_op_t op;
    int nsrc;    /* 0: memcpy; 2: reduce2; more: reduce_n */
    int inplace; /* dst == srcs[0] */
} shoal_bench_case_t;

static double shoal_bench_run(const shoal_bench_case_t *c, unsigned char *const *buf,
                              size_t bytes, int iters)
{
    size_t count = c->dtype == SHOAL_DTYPE_COUNT ? bytes : bytes / shoal_dtype_size(c->dtype);
    unsigned char *dst = c->inplace ? buf[0] : buf[7];
    const void *srcs[6] = {buf[0], buf[1], buf[2], buf[3], buf[4], buf[5]};
    double best = 0;
    for (int it = 0; it < iters; it++) {
        uint64_t t0 = shoal_time_ns();
        if (c->nsrc == 0) {
            memcpy(dst, buf[1], bytes);
        } else if (c->nsrc == 2) {
            shoal_reduce2(dst, buf[0], buf[1], count, c->dtype, c->op);
        } else {
            shoal_reduce_n(dst, srcs, c->nsrc, count, c->dtype, c->op);
        }
        double s = (double)(shoal_time_ns() - t0) / 1e9;
        double moved = (double)bytes * (c->nsrc == 0 ? 2 : c->nsrc + 1);
        double gbs = moved / s / 1e9;
        best = gbs > best ? gbs : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 64;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    size_t bytes = mib << 20;
    unsigned char *buf[8];
    if (mib == 0 || iters <= 0) {
        fprintf(stderr, "usage: %s [MiB per buffer] [iterations]\n", argv[0]);
        return 2;
    }
    for (int i = 0; i < 8; i++) {
        buf[i] = aligned_alloc(4096, bytes);
        if (buf[i] == NULL) {
            fprintf(stderr, "reduce_bench: cannot allocate %zu MiB\n", mib);
            return 1;
        }
        for (size_t j = 0; j < bytes; j++) {
            buf[i][j] = (unsigned char)(j * 7 + (size_t)i); /* faults in; small finite values */
        }
        for (size_t j = 1; j < bytes; j += 2) {
            buf[i][j] &= 0x3f; /* fp16/bf16 high bytes: keep exponents away from inf/NaN */
        }
    }
    static const shoal_bench_case_t cases[] = {
        {.name = "memcpy", .dtype = SHOAL_DTYPE_COUNT, .nsrc = 0},
        {.name = "reduce2 float32 sum", .dtype = SHOAL_FLOAT32, .op = SHOAL_SUM, .nsrc = 2},
        {.name = "reduce2 float32 sum in-place", .dtype = SHOAL_FLOAT32, .op = SHOAL_SUM,
         .nsrc = 2, .inplace = 1},
        {.name = "reduce2 bfloat16 sum", .dtype = SHOAL_BFLOAT16, .op = SHOAL_SUM, .nsrc = 2},
        {.name = "reduce2 bfloat16 sum in-place", .dtype = SHOAL_BFLOAT16, .op = SHOAL_SUM,
         .nsrc = 2, .inplace = 1},
        {.name = "reduce2 float16 sum", .dtype = SHOAL_FLOAT16, .op = SHOAL_SUM, .nsrc = 2},
        {.name = "reduce2 float32 max", .dtype = SHOAL_FLOAT32, .op = SHOAL_MAX, .nsrc = 2},
        {.name = "reduce2 int32 sum", .dtype = SHOAL_INT32, .op = SHOAL_SUM, .nsrc = 2},
        {.name = "reduce_n(6) float32 sum", .dtype = SHOAL_FLOAT32, .op = SHOAL_SUM, .nsrc = 6},
        {.name = "reduce_n(6) bfloat16 sum", .dtype = SHOAL_BFLOAT16, .op = SHOAL_SUM,
         .nsrc = 6},
    };
    printf("# %zu MiB per buffer, best of %d; GB/s = bytes read + written per second\n", mib,
           iters);
    printf("# fp16/bf16 kernels: %s\n", shoal_reduce_half_use_simd(1) ? "x86 SIMD" : "portable");
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(cases); i++) {
        printf("%-32s %8.2f GB/s\n", cases[i].name, shoal_bench_run(&cases[i], buf, bytes, iters));
    }
    shoal_reduce_half_use_simd(0);
    printf("%-32s %8.2f GB/s\n", "reduce2 bfloat16 sum (portable)",
           shoal_bench_run(&cases[3], buf, bytes, iters));
    printf("%-32s %8.2f GB/s\n", "reduce2 float16 sum (portable)",
           shoal_bench_run(&cases[5], buf, bytes, iters));
    for (int i = 0; i < 8; i++) {
        free(buf[i]);
    }
    return 0;
}
