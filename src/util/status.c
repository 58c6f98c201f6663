/* Status codes, version, dtype and op names: generated from the maps in include/shoal.h. */
#include "util/util.h"

const char *shoal_strerror(shoal_status_t status)
{
    switch (status) {
#define SHOAL_STATUS_STR_(name, val, str) \
    case SHOAL_##name:                    \
        return str;
        SHOAL_STATUS_MAP(SHOAL_STATUS_STR_)
#undef SHOAL_STATUS_STR_
    }
    return "unknown status";
}

const char *shoal_status_name(shoal_status_t status)
{
    switch (status) {
#define SHOAL_STATUS_NAME_(name, val, str) \
    case SHOAL_##name:                     \
        return "SHOAL_" #name;
        SHOAL_STATUS_MAP(SHOAL_STATUS_NAME_)
#undef SHOAL_STATUS_NAME_
    }
    return "unknown status";
}

const char *shoal_version_string(void)
{
    return "shoal " PACKAGE_VERSION;
}

static const char *const shoal_status_dtypes[SHOAL_DTYPE_COUNT] = {
    [SHOAL_INT8] = "int8",       [SHOAL_UINT8] = "uint8",        [SHOAL_INT32] = "int32",
    [SHOAL_UINT32] = "uint32",   [SHOAL_INT64] = "int64",        [SHOAL_UINT64] = "uint64",
    [SHOAL_FLOAT16] = "half",    [SHOAL_BFLOAT16] = "bfloat16",  [SHOAL_FLOAT32] = "float",
    [SHOAL_FLOAT64] = "double",
};

const uint8_t shoal_dtype_sizes[SHOAL_DTYPE_COUNT] = {
    [SHOAL_INT8] = 1,    [SHOAL_UINT8] = 1,    [SHOAL_INT32] = 4,   [SHOAL_UINT32] = 4,
    [SHOAL_INT64] = 8,   [SHOAL_UINT64] = 8,   [SHOAL_FLOAT16] = 2, [SHOAL_BFLOAT16] = 2,
    [SHOAL_FLOAT32] = 4, [SHOAL_FLOAT64] = 8,
};

static const char *const shoal_status_ops[SHOAL_OP_COUNT] = {
    [SHOAL_SUM] = "sum", [SHOAL_PROD] = "prod", [SHOAL_MIN] = "min",
    [SHOAL_MAX] = "max", [SHOAL_AVG] = "avg",
};

size_t shoal_dtype_size(shoal_dtype_t dtype)
{
    return shoal_dtype_esize(dtype);
}

const char *shoal_dtype_name(shoal_dtype_t dtype)
{
    if ((unsigned)dtype >= SHOAL_DTYPE_COUNT)
        return "unknown";
    return shoal_status_dtypes[dtype];
}

const char *shoal_op_name(shoal_op_t op)
{
    if ((unsigned)op >= SHOAL_OP_COUNT)
        return "unknown";
    return shoal_status_ops[op];
}
