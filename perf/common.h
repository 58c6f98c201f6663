/*
 * Shared driver of the perf tools (allreduce_perf and friends): nccl-tests' flags, size sweep,
 * timing, data check and table. Each tool only describes its collective with a perf_coll_t:
 * which call, how many elements, the bus-bandwidth factor, how to fill and check the data.
 *
 * The communication backend (shoal, or MPI when compiled with -DSHOAL_PERF_MPI for the MPI
 * twins) is one section of common.c; everything else is shared, so both print the same table
 * from the same measurement loop.
 */
#ifndef SHOAL_PERF_COMMON_H
#define SHOAL_PERF_COMMON_H

#include <shoal.h>

#include <stddef.h>

/* The collective's "op" when it takes none: prints as "none". */
#define PERF_OP_NONE SHOAL_OP_COUNT

typedef enum {
    PERF_COLL_ALLREDUCE,
    PERF_COLL_BROADCAST,
    PERF_COLL_ALLGATHER,
    PERF_COLL_REDUCE_SCATTER,
} perf_coll_kind_t;

/* Element counts of one call (nccl-tests' getCollByteCount). In-place, the call gets
 * sendbuf = buf + rank * send_ip_off and recvbuf = buf + rank * recv_ip_off, elements. */
typedef struct {
    size_t send;        /* elements in the send buffer */
    size_t recv;        /* elements in the receive buffer */
    size_t param;       /* the count argument of the call */
    size_t send_ip_off;
    size_t recv_ip_off;
} perf_counts_t;

/* One configuration being measured or checked. */
typedef struct {
    shoal_dtype_t dtype;
    shoal_op_t op;      /* PERF_OP_NONE for collectives without one */
    int root;           /* -1 for collectives without one */
    int rank;
    int nranks;
    perf_counts_t counts;
    int in_place;
} perf_test_t;

/* What a tool tells the driver about its collective. */
typedef struct {
    const char *name;          /* "allreduce": used in messages */
    perf_coll_kind_t kind;     /* which backend call */
    int has_op;                /* takes a reduction op (-o) */
    int has_root;              /* takes a root (-r) */
    /* count = size / dtype size (the elements the size column stands for) */
    void (*counts)(size_t count, int nranks, perf_counts_t *c_p);
    double (*bus_factor)(int nranks);   /* busbw = algbw * factor */
    /* Writes this rank's input for the check run into send (which, in place, lies inside
     * recv; recv has been filled with a poison pattern). */
    void (*fill)(const perf_test_t *t, void *send);
    /* Number of wrong elements in this rank's result. */
    size_t (*check)(const perf_test_t *t, const void *recv);
} perf_coll_t;

/* Runs the perf tool for coll: parses argv, prints the table on rank 0.
 * Returns the process exit status (0: every result checked right, no call failed). */
int perf_main(const perf_coll_t *coll, int argc, char **argv);

/* ---- Check-data helpers for the tools' fill and check functions ---- */

/* The value (a small integer, exact in every dtype) that rank puts at index idx, chosen so
 * that the reduction over t->nranks ranks with t->op is exact in t->dtype. */
long perf_data_value(const perf_test_t *t, int rank, size_t idx);
/* The exact reduction of perf_data_value over all ranks at idx (t->op must not be NONE). */
long perf_data_expected(const perf_test_t *t, size_t idx);
void perf_data_store(shoal_dtype_t dtype, void *buf, size_t i, long v);
/* 1 when buf[i] holds want (AVG on floating types: within one unit in the last place). */
int perf_data_ok(const perf_test_t *t, const void *buf, size_t i, long want);

#endif /* SHOAL_PERF_COMMON_H */
