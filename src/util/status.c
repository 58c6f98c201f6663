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

static const struct {
    const char *name;
    size_t size;
} shoal_status_dtypes[SHOAL_DTYPE_COUNT] = {
    [SHOAL_INT8] = {.name = "int8", .size = 1},
    [SHOAL_UINT8] = {.name = "uint8", .size = 1},
    [SHOAL_INT32] = {.name = "int32", .size = 4},
    [SHOAL_UINT32] = {.name = "uint32", .size = 4},
    [SHOAL_INT64] = {.name = "int64", .size = 8},
    [SHOAL_UINT64] = {.name = "uint64", .size = 8},
    [SHOAL_FLOAT16] = {.name = "half", .size = 2},
    [SHOAL_BFLOAT16] = {.name = "bfloat16", .size = 2},
    [SHOAL_FLOAT32] = {.name = "float", .size = 4},
    [SHOAL_FLOAT64] = {.name = "double", .size = 8},
};

static const char *const shoal_status_ops[SHOAL_OP_COUNT] = {
    [SHOAL_SUM] = "sum", [SHOAL_PROD] = "prod", [SHOAL_MIN] = "min",
    [SHOAL_MAX] = "max", [SHOAL_AVG] = "avg",
};

size_t shoal_dtype_size(shoal_dtype_t dtype)
{
    if ((unsigned)dtype >= SHOAL_DTYPE_COUNT)
        return 0;
    return shoal_status_dtypes[dtype].size;
}

const char *shoal_dtype_name(shoal_dtype_t dtype)
{
    if ((unsigned)dtype >= SHOAL_DTYPE_COUNT)
        return "unknown";
    return shoal_status_dtypes[dtype].name;
}

const char *shoal_op_name(shoal_op_t op)
{
    if ((unsigned)op >= SHOAL_OP_COUNT)
        return "unknown";
    return shoal_status_ops[op];
}
