/*
 * Shared driver of the perf tools: nccl-tests' command line, size sweep, timing, data check
 * and output table. Sections:
 *   1. check data (exact small integers in every dtype, fp16/bf16 conversion)
 *   2. command line
 *   3. backend: shoal, or MPI with -DSHOAL_PERF_MPI (the only part the MPI twins swap)
 *   4. the measurement loop and the table
 */
#include "perf/common.h"
#include "perf/perf_args.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef SHOAL_PERF_MPI
#include <mpi.h>
#endif

#define PERF_POISON 0xa5
#define PERF_ALIGN  4096

/* ========================================================================================
 * 1. Check data
 * ======================================================================================== */

static uint16_t perf_f32_to_f16(float f)
{
    uint32_t x, sign, mant;
    int exp;

    memcpy(&x, &f, sizeof(x));
    sign = (x >> 16) & 0x8000u;
    exp = (int)((x >> 23) & 0xff) - 127 + 15;
    mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) { /* inf, nan */
        return (uint16_t)(sign | 0x7c00u | (mant != 0 ? 0x200u : 0));
    }
    if (exp >= 31) {
        return (uint16_t)(sign | 0x7c00u);
    }
    if (exp <= 0) { /* subnormal or zero */
        if (exp < -10) {
            return (uint16_t)sign;
        }
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);

        h += (rem > half || (rem == half && (h & 1u) != 0)) ? 1u : 0u;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;

    h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0)) ? 1u : 0u;
    return (uint16_t)(sign | h);
}

static float perf_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t x;
    float f;

    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign != 0 ? -f : f;
    }
    if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    memcpy(&f, &x, sizeof(f));
    return f;
}

static uint16_t perf_f32_to_bf16(float f)
{
    uint32_t x;

    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    }
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(x >> 16);
}

static float perf_bf16_to_f32(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;

    memcpy(&f, &x, sizeof(f));
    return f;
}

static size_t perf_dtype_size(shoal_dtype_t dtype)
{
    static const size_t sizes[SHOAL_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};

    return sizes[dtype];
}

static int perf_dtype_is_float(shoal_dtype_t dtype)
{
    return dtype >= SHOAL_FLOAT16;
}

/* Largest integer up to which every partial result stays exact in dtype. */
static long perf_data_limit(shoal_dtype_t dtype)
{
    switch (dtype) {
    case SHOAL_INT8: return 127;
    case SHOAL_UINT8: return 255;
    case SHOAL_FLOAT16: return 2048;
    case SHOAL_BFLOAT16: return 256;
    case SHOAL_FLOAT32: return 1L << 24;
    default: return 1L << 30;
    }
}

long perf_data_value(const perf_test_t *t, int rank, size_t idx)
{
    long n = t->nranks, lim = perf_data_limit(t->dtype), i = (long)(idx % 1000003u);

    switch (t->op) {
    case SHOAL_SUM: {
        long vmax = lim / n < 3 ? lim / n : 3;

        return vmax >= 1 ? (rank + i) % (vmax + 1) : (rank == i % n);
    }
    case SHOAL_PROD: /* at most five 2s per element: products up to 32 */
        return (rank < 10 && ((rank + i) & 1) == 0) ? 2 : 1;
    case SHOAL_MIN:
    case SHOAL_MAX:
        return (rank + 3 * i) % 7;
    case SHOAL_AVG: { /* a + c_rank with sum(c) = 0: the average is exactly a */
        long amax = (lim - 1) / n < 3 ? (lim - 1) / n : 3;
        long c = (n % 2 == 1 && rank == n - 1) ? 0 : (rank % 2 == 0 ? 1 : -1);

        return amax >= 1 ? 1 + i % amax + c : 0;
    }
    default: /* no reduction: any pattern that tells ranks and indices apart */
        return (rank * 13 + i * 7) % 97;
    }
}

long perf_data_expected(const perf_test_t *t, size_t idx)
{
    long acc = perf_data_value(t, 0, idx);

    for (int r = 1; r < t->nranks; r++) {
        long v = perf_data_value(t, r, idx);

        switch (t->op) {
        case SHOAL_PROD: acc *= v; break;
        case SHOAL_MIN: acc = v < acc ? v : acc; break;
        case SHOAL_MAX: acc = v > acc ? v : acc; break;
        default: acc += v; break; /* SUM, AVG */
        }
    }
    return t->op == SHOAL_AVG ? acc / t->nranks : acc;
}

void perf_data_store(shoal_dtype_t dtype, void *buf, size_t i, long v)
{
    switch (dtype) {
    case SHOAL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case SHOAL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case SHOAL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case SHOAL_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case SHOAL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case SHOAL_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case SHOAL_FLOAT16: ((uint16_t *)buf)[i] = perf_f32_to_f16((float)v); break;
    case SHOAL_BFLOAT16: ((uint16_t *)buf)[i] = perf_f32_to_bf16((float)v); break;
    case SHOAL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = (double)v; break;
    }
}

static int64_t perf_data_load_int(shoal_dtype_t dtype, const void *buf, size_t i)
{
    switch (dtype) {
    case SHOAL_INT8: return ((const int8_t *)buf)[i];
    case SHOAL_UINT8: return ((const uint8_t *)buf)[i];
    case SHOAL_INT32: return ((const int32_t *)buf)[i];
    case SHOAL_UINT32: return ((const uint32_t *)buf)[i];
    case SHOAL_INT64: return ((const int64_t *)buf)[i];
    default: return (int64_t)((const uint64_t *)buf)[i]; /* UINT64 */
    }
}

static double perf_data_load_float(shoal_dtype_t dtype, const void *buf, size_t i)
{
    switch (dtype) {
    case SHOAL_FLOAT16: return perf_f16_to_f32(((const uint16_t *)buf)[i]);
    case SHOAL_BFLOAT16: return perf_bf16_to_f32(((const uint16_t *)buf)[i]);
    case SHOAL_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

int perf_data_ok(const perf_test_t *t, const void *buf, size_t i, long want)
{
    static const double ulp[SHOAL_DTYPE_COUNT] = {
        [SHOAL_FLOAT16] = 0x1p-10, [SHOAL_BFLOAT16] = 0x1p-7,
        [SHOAL_FLOAT32] = 0x1p-23, [SHOAL_FLOAT64] = 0x1p-52,
    };
    double got;

    if (!perf_dtype_is_float(t->dtype)) {
        return perf_data_load_int(t->dtype, buf, i) == (int64_t)want;
    }
    got = perf_data_load_float(t->dtype, buf, i);
    if (t->op == SHOAL_AVG) { /* the division may round: allow one ulp */
        return fabs(got - (double)want) <= fabs((double)want) * ulp[t->dtype];
    }
    return got == (double)want;
}

/* ========================================================================================
 * 2. Command line
 * ======================================================================================== */

typedef struct {
    size_t min_bytes;
    size_t max_bytes;
    size_t step_bytes;
    double step_factor;
    int iters;
    int warmup;
    int check;
    int root;
    int average;        /* -a: 0 rank 0, 1 average, 2 min, 3 max */
    shoal_dtype_t dtypes[SHOAL_DTYPE_COUNT];
    int ndtypes;
    shoal_op_t ops[SHOAL_OP_COUNT];
    int nops;
} perf_opts_t;

static const char *const perf_dtype_names[SHOAL_DTYPE_COUNT] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "bfloat16", "float", "double",
};
static const char *const perf_op_names[SHOAL_OP_COUNT + 1] = {
    "sum", "prod", "min", "max", "avg", "none",
};

static const char *perf_prog = "perf";
static const char *perf_transport; /* -t: shoal_config_t.transport, NULL = automatic */
static int perf_memalloc;          /* -m 1: buffers from shoal_mem_alloc (shoal only) */

static void perf_usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]   (run under shoalrun, mpirun or srun)\n"
            "  -b, --minbytes SIZE    smallest size (K/M/G suffixes; default 32M)\n"
            "  -e, --maxbytes SIZE    largest size (default 32M)\n"
            "  -i, --stepbytes SIZE   increment between sizes (default 1M)\n"
            "  -f, --stepfactor F     multiply sizes by F instead (F > 1)\n"
            "  -n, --iters N          timed iterations per size (default 20)\n"
            "  -w, --warmup_iters N   untimed iterations before each size (default 5)\n"
            "  -c, --check 0|1        check the results, count #wrong (default 1)\n"
            "  -d, --datatype T       int8 uint8 int32 uint32 int64 uint64 half bfloat16\n"
            "                         float double, or all (default float)\n"
            "  -o, --op OP            sum prod min max avg, or all (default sum)\n"
            "  -r, --root R           root rank (default 0)\n"
            "  -a, --average 0..3     time reported: rank 0, average, min, max (default 1)\n"
            "  -z, --blocking 0|1     accepted for nccl-tests compatibility (calls block)\n"
            "  -t, --transport TL     shoal only: shm, tcp, ucx or ib for every peer (as\n"
            "                         SHOAL_TRANSPORT; default: automatic choice)\n"
            "  -m, --memalloc 0|1     shoal only: buffers from shoal_mem_alloc (default 0)\n"
            "  -h, --help             this help\n",
            perf_prog);
}

static int perf_parse_dtype(perf_opts_t *o, const char *s)
{
    static const struct { const char *alias; shoal_dtype_t dtype; } aliases[] = {
        {"char", SHOAL_INT8}, {"int", SHOAL_INT32}, {"float16", SHOAL_FLOAT16},
        {"fp16", SHOAL_FLOAT16}, {"bf16", SHOAL_BFLOAT16}, {"float32", SHOAL_FLOAT32},
        {"fp32", SHOAL_FLOAT32}, {"float64", SHOAL_FLOAT64}, {"fp64", SHOAL_FLOAT64},
    };

    o->ndtypes = 0;
    for (int d = 0; d < SHOAL_DTYPE_COUNT; d++) {
        if (strcmp(s, "all") == 0 || strcmp(s, perf_dtype_names[d]) == 0) {
            o->dtypes[o->ndtypes++] = (shoal_dtype_t)d;
        }
    }
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]) && o->ndtypes == 0; i++) {
        if (strcmp(s, aliases[i].alias) == 0) {
            o->dtypes[o->ndtypes++] = aliases[i].dtype;
        }
    }
    return o->ndtypes > 0 ? 0 : -1;
}

static int perf_parse_op(perf_opts_t *o, const char *s)
{
    o->nops = 0;
    for (int op = 0; op < SHOAL_OP_COUNT; op++) {
        if (strcmp(s, "all") == 0 || strcmp(s, perf_op_names[op]) == 0) {
            o->ops[o->nops++] = (shoal_op_t)op;
        }
    }
    return o->nops > 0 ? 0 : -1;
}

static int perf_opt_apply(perf_opts_t *o, int c, const char *arg)
{
    int ignored;

    switch (c) {
    case 'b': return perf_arg_size(arg, &o->min_bytes);
    case 'e': return perf_arg_size(arg, &o->max_bytes);
    case 'i': return perf_arg_size(arg, &o->step_bytes);
    case 'f': {
        char *end = NULL;

        o->step_factor = strtod(arg, &end);
        return (end == arg || *end != '\0' || !(o->step_factor >= 1.0)) ? -1 : 0;
    }
    case 'n': return perf_arg_int(arg, 1, 1 << 30, &o->iters);
    case 'w': return perf_arg_int(arg, 0, 1 << 30, &o->warmup);
    case 'c': return perf_arg_int(arg, 0, 1, &o->check);
    case 'r': return perf_arg_int(arg, 0, 1 << 30, &o->root);
    case 'a': return perf_arg_int(arg, 0, 3, &o->average);
    case 'z': return perf_arg_int(arg, 0, 1, &ignored);
    case 't': perf_transport = arg; return 0;
    case 'm': return perf_arg_int(arg, 0, 1, &perf_memalloc);
    case 'd': return perf_parse_dtype(o, arg);
    case 'o': return perf_parse_op(o, arg);
    default: return -1;
    }
}

/* Returns 0 to run, 1 for --help, -1 on a usage error. */
static int perf_opts_parse(perf_opts_t *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {.name = "minbytes", .has_arg = required_argument, .val = 'b'},
        {.name = "maxbytes", .has_arg = required_argument, .val = 'e'},
        {.name = "stepbytes", .has_arg = required_argument, .val = 'i'},
        {.name = "stepfactor", .has_arg = required_argument, .val = 'f'},
        {.name = "iters", .has_arg = required_argument, .val = 'n'},
        {.name = "warmup_iters", .has_arg = required_argument, .val = 'w'},
        {.name = "check", .has_arg = required_argument, .val = 'c'},
        {.name = "datatype", .has_arg = required_argument, .val = 'd'},
        {.name = "op", .has_arg = required_argument, .val = 'o'},
        {.name = "root", .has_arg = required_argument, .val = 'r'},
        {.name = "average", .has_arg = required_argument, .val = 'a'},
        {.name = "blocking", .has_arg = required_argument, .val = 'z'},
        {.name = "transport", .has_arg = required_argument, .val = 't'},
        {.name = "memalloc", .has_arg = required_argument, .val = 'm'},
        {.name = "help", .has_arg = no_argument, .val = 'h'},
        {0},
    };
    int c;

    *o = (perf_opts_t){.min_bytes = 32u << 20, .max_bytes = 32u << 20, .step_bytes = 1u << 20,
                       .step_factor = 1.0, .iters = 20, .warmup = 5, .check = 1, .root = 0,
                       .average = 1, .dtypes = {SHOAL_FLOAT32}, .ndtypes = 1,
                       .ops = {SHOAL_SUM}, .nops = 1};
    while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:d:o:r:a:z:t:m:h", longopts, NULL)) != -1) {
        if (c == 'h') {
            return 1;
        }
        if (c == '?' || perf_opt_apply(o, c, optarg) != 0) {
            if (c != '?') {
                fprintf(stderr, "%s: invalid argument '%s' for -%c\n", perf_prog, optarg, c);
            }
            return -1;
        }
    }
    if (optind < argc || o->min_bytes > o->max_bytes) {
        fprintf(stderr, "%s: %s\n", perf_prog,
                optind < argc ? "unexpected argument" : "minbytes > maxbytes");
        return -1;
    }
    return 0;
}

/* ========================================================================================
 * 3. Backend: every call into the communication library is in this section.
 * ======================================================================================== */

typedef struct {
    int rank;
    int nranks;
#ifdef SHOAL_PERF_MPI
    MPI_Comm comm;
#else
    shoal_comm_t comm;
#endif
} perf_backend_t;

#ifdef SHOAL_PERF_MPI

static MPI_Datatype perf_mpi_dtype(shoal_dtype_t dtype)
{
    static MPI_Datatype map[SHOAL_DTYPE_COUNT];

    map[SHOAL_INT8] = MPI_INT8_T;
    map[SHOAL_UINT8] = MPI_UINT8_T;
    map[SHOAL_INT32] = MPI_INT32_T;
    map[SHOAL_UINT32] = MPI_UINT32_T;
    map[SHOAL_INT64] = MPI_INT64_T;
    map[SHOAL_UINT64] = MPI_UINT64_T;
    map[SHOAL_FLOAT16] = MPI_DATATYPE_NULL;
    map[SHOAL_BFLOAT16] = MPI_DATATYPE_NULL;
    map[SHOAL_FLOAT32] = MPI_FLOAT;
    map[SHOAL_FLOAT64] = MPI_DOUBLE;
    return map[dtype];
}

static MPI_Op perf_mpi_op(shoal_op_t op)
{
    switch (op) {
    case SHOAL_PROD: return MPI_PROD;
    case SHOAL_MIN: return MPI_MIN;
    case SHOAL_MAX: return MPI_MAX;
    default: return MPI_SUM;
    }
}

static const char *perf_backend_name(void)
{
    static char name[MPI_MAX_LIBRARY_VERSION_STRING + 8];
    int len = 0;

    MPI_Get_library_version(name, &len);
    name[strcspn(name, "\n")] = '\0';
    return name;
}

static int perf_backend_supports(shoal_dtype_t dtype, shoal_op_t op)
{
    return perf_mpi_dtype(dtype) != MPI_DATATYPE_NULL && op != SHOAL_AVG;
}

static int perf_backend_check(perf_backend_t *be, int rc, const char *call)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;

    if (rc == MPI_SUCCESS) {
        return 0;
    }
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "%s: rank %d: %s failed: %s\n", perf_prog, be->rank, call, msg);
    return -1;
}

static int perf_backend_init(perf_backend_t *be, int *argc, char ***argv)
{
    MPI_Init(argc, argv);
    be->comm = MPI_COMM_WORLD;
    MPI_Comm_set_errhandler(be->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(be->comm, &be->rank);
    MPI_Comm_size(be->comm, &be->nranks);
    if (perf_transport != NULL && be->rank == 0) {
        fprintf(stderr, "%s: -t %s ignored: MPI chooses its transport (--mca pml/btl)\n",
                perf_prog, perf_transport);
    }
    return 0;
}

static void perf_backend_fini(perf_backend_t *be, int failed)
{
    if (failed) {
        MPI_Abort(be->comm, 1);
    }
    MPI_Finalize();
}

static int perf_backend_barrier(perf_backend_t *be)
{
    return perf_backend_check(be, MPI_Barrier(be->comm), "MPI_Barrier");
}

static int perf_backend_allreduce_double(perf_backend_t *be, double *v, shoal_op_t op)
{
    return perf_backend_check(be, MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, perf_mpi_op(op),
                                                be->comm), "MPI_Allreduce");
}

/* MPI 3's calls take an int count (Open MPI 4 has no MPI 4 large-count _c calls): a count
 * past INT_MAX was cut to (int), and the twin timed another size than the row it printed. */
static int perf_backend_count_ok(perf_backend_t *be, size_t count, const char *call)
{
    if (count <= (size_t)INT_MAX) {
        return 1;
    }
    fprintf(stderr, "%s: rank %d: %s: a count of %zu is more than MPI's int count takes "
            "(%d); use a smaller -e\n", perf_prog, be->rank, call, count, INT_MAX);
    return 0;
}

static int perf_backend_allgather_bytes(perf_backend_t *be, const void *send, void *recv,
                                        size_t n)
{
    if (!perf_backend_count_ok(be, n, "MPI_Allgather")) {
        return -1;
    }
    return perf_backend_check(be, MPI_Allgather(send, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE,
                                                be->comm), "MPI_Allgather");
}

static int perf_backend_coll(perf_backend_t *be, perf_coll_kind_t kind, const void *send,
                             void *recv, size_t count, shoal_dtype_t dtype, shoal_op_t op,
                             int root)
{
    MPI_Datatype dt = perf_mpi_dtype(dtype);
    int n = (int)count, rc;

    if (!perf_backend_count_ok(be, count, "MPI collective")) {
        return -1;
    }
    switch (kind) {
    case PERF_COLL_ALLREDUCE:
        rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, dt, perf_mpi_op(op),
                           be->comm);
        return perf_backend_check(be, rc, "MPI_Allreduce");
    case PERF_COLL_BROADCAST:
        if (be->rank == root && send != recv) {
            memcpy(recv, send, count * perf_dtype_size(dtype));
        }
        return perf_backend_check(be, MPI_Bcast(recv, n, dt, root, be->comm), "MPI_Bcast");
    case PERF_COLL_ALLGATHER:
        rc = MPI_Allgather(send == (char *)recv + (size_t)be->rank * count *
                                  perf_dtype_size(dtype) ? MPI_IN_PLACE : send,
                           n, dt, recv, n, dt, be->comm);
        return perf_backend_check(be, rc, "MPI_Allgather");
    default:
        if ((const char *)send + (size_t)be->rank * count * perf_dtype_size(dtype) != recv) {
            rc = MPI_Reduce_scatter_block(send, recv, n, dt, perf_mpi_op(op), be->comm);
            return perf_backend_check(be, rc, "MPI_Reduce_scatter_block");
        }
        /* In place, MPI leaves block r at the start of the buffer, not at block r (where
         * shoal and NCCL leave it): move it there, inside the timed call. */
        rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, (void *)send, n, dt, perf_mpi_op(op),
                                      be->comm);
        if (rc == MPI_SUCCESS && send != recv) {
            memmove(recv, send, count * perf_dtype_size(dtype));
        }
        return perf_backend_check(be, rc, "MPI_Reduce_scatter_block");
    }
}

#else /* shoal */

static const char *perf_backend_name(void)
{
    static char name[64];

    const char *v = shoal_version_string();

    snprintf(name, sizeof(name), "%s%s", strncmp(v, "shoal", 5) == 0 ? "" : "shoal ", v);
    return name;
}

static int perf_backend_supports(shoal_dtype_t dtype, shoal_op_t op)
{
    return 1;
}

static int perf_backend_check(perf_backend_t *be, shoal_status_t st, const char *call)
{
    const char *why;

    if (st == SHOAL_OK) {
        return 0;
    }
    why = be->comm != NULL ? shoal_comm_last_error(be->comm) : NULL;
    fprintf(stderr, "%s: rank %d: %s failed: %s%s%s\n", perf_prog, be->rank, call,
            shoal_strerror(st), why != NULL && why[0] != '\0' ? ": " : "",
            why != NULL ? why : "");
    return -1;
}

static int perf_backend_init(perf_backend_t *be, int *argc, char ***argv)
{
    shoal_config_t cfg = SHOAL_CONFIG_INIT;

    cfg.transport = perf_transport;
    be->comm = NULL;
    be->rank = -1;
    if (perf_backend_check(be, shoal_comm_init_env(&be->comm, &cfg), "shoal_comm_init_env") != 0 ||
        perf_backend_check(be, shoal_comm_rank(be->comm, &be->rank), "shoal_comm_rank") != 0 ||
        perf_backend_check(be, shoal_comm_size(be->comm, &be->nranks), "shoal_comm_size") != 0) {
        return -1;
    }
    return 0;
}

static void perf_backend_fini(perf_backend_t *be, int failed)
{
    if (be->comm == NULL) {
        return;
    }
    if (failed) {
        shoal_comm_abort(be->comm);
    }
    shoal_comm_destroy(be->comm);
    be->comm = NULL;
}

static int perf_backend_barrier(perf_backend_t *be)
{
    return perf_backend_check(be, shoal_barrier(be->comm, NULL), "shoal_barrier");
}

static int perf_backend_allreduce_double(perf_backend_t *be, double *v, shoal_op_t op)
{
    return perf_backend_check(be, shoal_allreduce(v, v, 1, SHOAL_FLOAT64, op, be->comm, NULL),
                              "shoal_allreduce");
}

static int perf_backend_allgather_bytes(perf_backend_t *be, const void *send, void *recv,
                                        size_t n)
{
    return perf_backend_check(be, shoal_allgather(send, recv, n, SHOAL_UINT8, be->comm, NULL),
                              "shoal_allgather");
}

static int perf_backend_coll(perf_backend_t *be, perf_coll_kind_t kind, const void *send,
                             void *recv, size_t count, shoal_dtype_t dtype, shoal_op_t op,
                             int root)
{
    switch (kind) {
    case PERF_COLL_ALLREDUCE:
        return perf_backend_check(
            be, shoal_allreduce(send, recv, count, dtype, op, be->comm, NULL), "shoal_allreduce");
    case PERF_COLL_BROADCAST:
        return perf_backend_check(
            be, shoal_broadcast(send, recv, count, dtype, root, be->comm, NULL),
            "shoal_broadcast");
    case PERF_COLL_ALLGATHER:
        return perf_backend_check(
            be, shoal_allgather(send, recv, count, dtype, be->comm, NULL), "shoal_allgather");
    default:
        return perf_backend_check(
            be, shoal_reduce_scatter(send, recv, count, dtype, op, be->comm, NULL),
            "shoal_reduce_scatter");
    }
}

#endif /* SHOAL_PERF_MPI */

/* ========================================================================================
 * 4. Measurement loop and table
 * ======================================================================================== */

typedef struct {
    const perf_coll_t *coll;
    perf_opts_t opts;
    perf_backend_t be;
    char *sendbuf;
    char *recvbuf;
    size_t buf_bytes;   /* each buffer */
    double bw_sum;
    int bw_count;
    int nwrong_results; /* results with #wrong > 0 */
} perf_ctx_t;

static double perf_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int perf_is_root(const perf_ctx_t *ctx)
{
    return ctx->be.rank == 0;
}

/* Allocates both buffers for the largest size once and touches every page (-m 1, shoal only:
 * with shoal_mem_alloc, so that the intra-node path reduces in place without staging). */
static int perf_buffers_alloc(perf_ctx_t *ctx)
{
    size_t bytes = ctx->opts.max_bytes + PERF_ALIGN;
    void *s = NULL, *r = NULL;

    bytes = (bytes + PERF_ALIGN - 1) / PERF_ALIGN * PERF_ALIGN;
#ifndef SHOAL_PERF_MPI
    if (perf_memalloc) {
        if (shoal_mem_alloc(bytes, &s) != SHOAL_OK || shoal_mem_alloc(bytes, &r) != SHOAL_OK) {
            fprintf(stderr, "%s: rank %d: shoal_mem_alloc of 2 x %zu bytes failed\n", perf_prog,
                    ctx->be.rank, bytes);
            shoal_mem_free(s); /* NULL if the first one failed */
            return -1;
        }
        memset(s, 0, bytes);
        memset(r, 0, bytes);
        ctx->sendbuf = s;
        ctx->recvbuf = r;
        ctx->buf_bytes = bytes;
        return 0;
    }
#endif
    if (posix_memalign(&s, PERF_ALIGN, bytes) != 0 || posix_memalign(&r, PERF_ALIGN, bytes) != 0) {
        fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", perf_prog, ctx->be.rank,
                bytes);
        free(s);
        return -1;
    }
    memset(s, 0, bytes);
    memset(r, 0, bytes);
    ctx->sendbuf = s;
    ctx->recvbuf = r;
    ctx->buf_bytes = bytes;
    return 0;
}

static void perf_test_buffers(const perf_ctx_t *ctx, const perf_test_t *t, const void **send_p,
                              void **recv_p)
{
    size_t esz = perf_dtype_size(t->dtype), r = (size_t)t->rank;

    if (t->in_place) {
        *send_p = ctx->recvbuf + r * t->counts.send_ip_off * esz;
        *recv_p = ctx->recvbuf + r * t->counts.recv_ip_off * esz;
    } else {
        *send_p = ctx->sendbuf;
        *recv_p = ctx->recvbuf;
    }
}

static int perf_run_once(perf_ctx_t *ctx, const perf_test_t *t, const void *send, void *recv)
{
    return perf_backend_coll(&ctx->be, ctx->coll->kind, send, recv, t->counts.param, t->dtype,
                             t->op, t->root);
}

/* Time per iteration in microseconds, combined over ranks as -a says. */
static int perf_time(perf_ctx_t *ctx, const perf_test_t *t, double *usec_p)
{
    static const shoal_op_t combine[4] = {SHOAL_SUM, SHOAL_SUM, SHOAL_MIN, SHOAL_MAX};
    const void *send;
    void *recv;
    double t0, usec;

    perf_test_buffers(ctx, t, &send, &recv);
    for (int i = 0; i < ctx->opts.warmup; i++) {
        if (perf_run_once(ctx, t, send, recv) != 0) {
            return -1;
        }
    }
    if (perf_backend_barrier(&ctx->be) != 0) {
        return -1;
    }
    t0 = perf_now();
    for (int i = 0; i < ctx->opts.iters; i++) {
        if (perf_run_once(ctx, t, send, recv) != 0) {
            return -1;
        }
    }
    usec = (perf_now() - t0) * 1e6 / ctx->opts.iters;
    if (ctx->opts.average == 0 && t->rank != 0) {
        usec = 0;
    }
    if (perf_backend_allreduce_double(&ctx->be, &usec, combine[ctx->opts.average]) != 0) {
        return -1;
    }
    *usec_p = ctx->opts.average == 1 ? usec / t->nranks : usec;
    return 0;
}

/* One checked run with known inputs; *wrong_p: wrong elements summed over ranks. */
static int perf_check(perf_ctx_t *ctx, const perf_test_t *t, double *wrong_p)
{
    size_t esz = perf_dtype_size(t->dtype);
    const void *send;
    void *recv;
    double wrong;

    perf_test_buffers(ctx, t, &send, &recv);
    memset(ctx->recvbuf, PERF_POISON, (t->counts.send > t->counts.recv ? t->counts.send :
                                       t->counts.recv) * esz);
    if (!t->in_place) {
        memset(ctx->sendbuf, PERF_POISON, t->counts.send * esz);
    }
    ctx->coll->fill(t, (void *)send);
    if (perf_run_once(ctx, t, send, recv) != 0) {
        return -1;
    }
    wrong = (double)ctx->coll->check(t, recv);
    if (perf_backend_allreduce_double(&ctx->be, &wrong, SHOAL_SUM) != 0) {
        return -1;
    }
    *wrong_p = wrong;
    return 0;
}

static void perf_format_time(double usec, char *buf, size_t len)
{
    snprintf(buf, len, usec >= 10000.0 ? "%7.0f" : usec >= 100.0 ? "%7.1f" : "%7.2f", usec);
}

/* Times and checks one placement; prints its columns on rank 0. */
static int perf_test_place(perf_ctx_t *ctx, perf_test_t *t, size_t bytes)
{
    double usec = 0, wrong = 0, algbw, busbw;
    char tbuf[32];

    if (perf_time(ctx, t, &usec) != 0 || (ctx->opts.check && perf_check(ctx, t, &wrong) != 0)) {
        return -1;
    }
    algbw = usec > 0 ? (double)bytes / 1e3 / usec : 0; /* GB/s */
    busbw = algbw * ctx->coll->bus_factor(t->nranks);
    ctx->bw_sum += busbw;
    ctx->bw_count++;
    ctx->nwrong_results += wrong > 0;
    if (perf_is_root(ctx)) {
        perf_format_time(usec, tbuf, sizeof(tbuf));
        if (ctx->opts.check) {
            printf("  %7s  %6.2f  %6.2f  %5g", tbuf, algbw, busbw, wrong);
        } else {
            printf("  %7s  %6.2f  %6.2f  %5s", tbuf, algbw, busbw, "N/A");
        }
    }
    return 0;
}

static int perf_test_size(perf_ctx_t *ctx, shoal_dtype_t dtype, shoal_op_t op, size_t size)
{
    size_t esz = perf_dtype_size(dtype), bytes;
    perf_test_t t = {.dtype = dtype, .op = op, .root = ctx->coll->has_root ? ctx->opts.root : -1,
                     .rank = ctx->be.rank, .nranks = ctx->be.nranks};

    ctx->coll->counts(size / esz, t.nranks, &t.counts);
    bytes = (t.counts.send > t.counts.recv ? t.counts.send : t.counts.recv) * esz;
    if (perf_is_root(ctx)) {
        printf("%12zu  %12zu  %8s  %6s  %6d", bytes, t.counts.param, perf_dtype_names[dtype],
               perf_op_names[op], t.root);
    }
    for (t.in_place = 0; t.in_place <= 1; t.in_place++) {
        if (perf_test_place(ctx, &t, bytes) != 0) {
            if (perf_is_root(ctx)) {
                printf("\n");
                fflush(stdout);
            }
            return -1;
        }
    }
    if (perf_is_root(ctx)) {
        printf("\n");
        fflush(stdout);
    }
    return 0;
}

static int perf_sweep(perf_ctx_t *ctx, shoal_dtype_t dtype, shoal_op_t op)
{
    const perf_opts_t *o = &ctx->opts;

    for (size_t size = o->min_bytes; size <= o->max_bytes;) {
        size_t next;

        if (perf_test_size(ctx, dtype, op, size) != 0) {
            return -1;
        }
        if (o->step_factor > 1.0) {
            next = (size_t)((double)size * o->step_factor);
            next = next > size ? next : size + 1;
        } else if (o->step_bytes > 0) {
            next = size + o->step_bytes;
        } else {
            break;
        }
        if (next < size) {
            break; /* wrapped around */
        }
        size = next;
    }
    return 0;
}

typedef struct {
    int pid;
    char host[60];
} perf_rank_info_t;

static int perf_print_header(perf_ctx_t *ctx)
{
    const perf_opts_t *o = &ctx->opts;
    perf_rank_info_t me = {.pid = (int)getpid()}, *all;

    all = calloc((size_t)ctx->be.nranks, sizeof(*all));
    if (all == NULL) {
        fprintf(stderr, "%s: out of memory\n", perf_prog);
        return -1;
    }
    gethostname(me.host, sizeof(me.host) - 1);
    if (perf_backend_allgather_bytes(&ctx->be, &me, all, sizeof(me)) != 0) {
        free(all);
        return -1;
    }
    if (perf_is_root(ctx)) {
        printf("# %s: %s, %d ranks\n", perf_prog, perf_backend_name(), ctx->be.nranks);
        printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %g(factor) %zu(bytes) "
               "warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0\n",
               o->min_bytes, o->max_bytes, o->step_factor, o->step_bytes, o->warmup, o->iters,
               o->check);
        printf("#\n# Using devices\n");
        for (int r = 0; r < ctx->be.nranks; r++) {
            printf("#  Rank %2d Group  0 Pid %6d on %10s device  - [host] cpu memory\n", r,
                   all[r].pid, all[r].host);
        }
        printf("#\n");
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
               "          \n", "", "", "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size",
               "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
               "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
               "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
               "(GB/s)", "");
        fflush(stdout);
    }
    free(all);
    return 0;
}

static int perf_run_all(perf_ctx_t *ctx)
{
    const perf_opts_t *o = &ctx->opts;
    int nops = ctx->coll->has_op ? o->nops : 1;

    if (ctx->coll->has_root && o->root >= ctx->be.nranks) {
        fprintf(stderr, "%s: root %d out of range (%d ranks)\n", perf_prog, o->root,
                ctx->be.nranks);
        return -1;
    }
    if (perf_buffers_alloc(ctx) != 0 || perf_print_header(ctx) != 0) {
        return -1;
    }
    for (int d = 0; d < o->ndtypes; d++) {
        for (int k = 0; k < nops; k++) {
            shoal_op_t op = ctx->coll->has_op ? o->ops[k] : PERF_OP_NONE;

            if (!perf_backend_supports(o->dtypes[d], op)) {
                if (perf_is_root(ctx)) {
                    printf("# %s %s: not supported by %s, skipped\n",
                           perf_dtype_names[o->dtypes[d]], perf_op_names[op],
                           perf_backend_name());
                }
                continue;
            }
            if (perf_sweep(ctx, o->dtypes[d], op) != 0) {
                return -1;
            }
        }
    }
    if (perf_is_root(ctx)) {
        printf("# Out of bounds values : %d %s\n", ctx->nwrong_results,
               ctx->nwrong_results != 0 ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n",
               ctx->bw_count > 0 ? ctx->bw_sum / ctx->bw_count : 0.0);
        fflush(stdout);
    }
    return 0;
}

int perf_main(const perf_coll_t *coll, int argc, char **argv)
{
    perf_ctx_t ctx = {.coll = coll};
    const char *slash = strrchr(argv[0], '/');
    int rc, failed;

    perf_prog = slash != NULL ? slash + 1 : argv[0];
    rc = perf_opts_parse(&ctx.opts, argc, argv);
    if (rc != 0) {
        perf_usage(rc > 0 ? stdout : stderr);
        return rc > 0 ? 0 : 2;
    }
    if (perf_backend_init(&ctx.be, &argc, &argv) != 0) {
        perf_backend_fini(&ctx.be, 1);
        return 1;
    }
    failed = perf_run_all(&ctx) != 0;
    perf_backend_fini(&ctx.be, failed);
#ifndef SHOAL_PERF_MPI
    if (perf_memalloc) {
        shoal_mem_free(ctx.sendbuf);
        shoal_mem_free(ctx.recvbuf);
        ctx.sendbuf = ctx.recvbuf = NULL;
    }
#endif
    free(ctx.sendbuf);
    free(ctx.recvbuf);
    if (failed) {
        return 1;
    }
    return ctx.nwrong_results != 0 ? 1 : 0;
}
