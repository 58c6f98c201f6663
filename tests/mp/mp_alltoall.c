/*
 * mp_alltoall: one rank of the shoal_alltoall test, run under shoalrun (tests/mp/run_algos.sh).
 * Block b of rank r's send buffer holds value(r, b, i); after the call, block s of the receive
 * buffer must hold value(s, r, i). Counts 0, 1, odd and large (more than scratch, so the
 * in-place path takes several pieces), int32 and double, in place and out of place, unaligned
 * buffers with guard bytes. The failures are summed over the ranks; rank 0 prints TAP.
 *
 *   shoalrun -n 5 ./tests/mp/mp_alltoall
 */
#include <shoal.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define A2A_GUARD 64
#define A2A_FILL 0x5A

static const size_t a2a_counts[] = {0, 1, 3, 61, 1021, 300007};

static double a2a_value(int from, int to, size_t i)
{
    return (double)((from * 7919 + to * 104729 + (int)(i % 100003)) % 1000003);
}

static void a2a_put(shoal_dtype_t dt, uint8_t *p, size_t i, double v)
{
    if (dt == SHOAL_INT32) {
        int32_t x = (int32_t)v;
        memcpy(p + i * 4, &x, 4);
    } else {
        memcpy(p + i * 8, &v, 8);
    }
}

static double a2a_get(shoal_dtype_t dt, const uint8_t *p, size_t i)
{
    if (dt == SHOAL_INT32) {
        int32_t x;
        memcpy(&x, p + i * 4, 4);
        return x;
    }
    double v;
    memcpy(&v, p + i * 8, 8);
    return v;
}

/* One case; returns 0 if it passed, else prints why on stderr and returns 1. */
static int a2a_case(shoal_comm_t comm, int rank, int n, uint8_t *sb, uint8_t *rb,
                    shoal_dtype_t dt, size_t count, int inplace, int off)
{
    size_t ds = shoal_dtype_size(dt), total = (size_t)n * count;
    uint8_t *s = sb + off, *r = inplace ? s : rb + off + 1;
    shoal_status_t st;

    memset(sb, A2A_FILL, total * ds + 2 * A2A_GUARD);
    memset(rb, A2A_FILL, total * ds + 2 * A2A_GUARD);
    for (int b = 0; b < n; b++) {
        for (size_t i = 0; i < count; i++) {
            a2a_put(dt, s, (size_t)b * count + i, a2a_value(rank, b, i));
        }
    }
    st = shoal_alltoall(s, r, count, dt, comm, NULL);
    if (st != SHOAL_OK) {
        fprintf(stderr, "# rank %d: alltoall %s count %zu %s: %s (%s)\n", rank,
                shoal_dtype_name(dt), count, inplace ? "in place" : "out of place",
                shoal_status_name(st), shoal_comm_last_error(comm));
        return 1;
    }
    for (int b = 0; b < n; b++) {
        for (size_t i = 0; i < count; i++) {
            double got = a2a_get(dt, r, (size_t)b * count + i), want = a2a_value(b, rank, i);
            if (got != want) {
                fprintf(stderr, "# rank %d: alltoall %s count %zu %s: block %d element %zu: "
                        "expected %g got %g\n", rank, shoal_dtype_name(dt), count,
                        inplace ? "in place" : "out of place", b, i, want, got);
                return 1;
            }
        }
    }
    for (size_t i = total * ds; i < total * ds + A2A_GUARD; i++) {
        if (r[i] != A2A_FILL) {
            fprintf(stderr, "# rank %d: alltoall %s count %zu: wrote past the end\n", rank,
                    shoal_dtype_name(dt), count);
            return 1;
        }
    }
    return 0;
}

int main(void)
{
    shoal_comm_t comm;
    int rank, n, tap = 0, status = 0;
    size_t maxb;
    uint8_t *sb, *rb;
    const shoal_dtype_t dts[] = {SHOAL_INT32, SHOAL_FLOAT64};

    if (shoal_comm_init_env(&comm, NULL) != SHOAL_OK) {
        printf("not ok 1 - shoal_comm_init_env\n1..1\n");
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &n);
    maxb = (size_t)n * a2a_counts[sizeof(a2a_counts) / sizeof(a2a_counts[0]) - 1] * 8;
    sb = malloc(maxb + 2 * A2A_GUARD);
    rb = malloc(maxb + 2 * A2A_GUARD);
    if (sb == NULL || rb == NULL) {
        return 1;
    }
    for (size_t d = 0; d < 2; d++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            int32_t bad = 0, sum = 0;
            for (size_t c = 0; c < sizeof(a2a_counts) / sizeof(a2a_counts[0]); c++) {
                bad += a2a_case(comm, rank, n, sb, rb, dts[d], a2a_counts[c], inplace,
                                (int)(c % 3) * 4 + 1);
            }
            if (shoal_allreduce(&bad, &sum, 1, SHOAL_INT32, SHOAL_SUM, comm, NULL) != SHOAL_OK) {
                sum = 1;
            }
            status |= sum != 0;
            if (rank == 0) {
                printf("%s %d - alltoall %s %s (%zu counts, %d failures over the ranks)\n",
                       sum == 0 ? "ok" : "not ok", ++tap, shoal_dtype_name(dts[d]),
                       inplace ? "in place" : "out of place",
                       sizeof(a2a_counts) / sizeof(a2a_counts[0]), (int)sum);
            }
        }
    }
    if (rank == 0) {
        printf("1..%d\n", tap);
    }
    shoal_comm_destroy(comm);
    free(sb);
    free(rb);
    return status;
}
