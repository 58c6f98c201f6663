/* Env-var config table of the util module: logging and host identity. */
#include "util/util.h"

#include <stddef.h>

shoal_util_config_t shoal_util_config = {
    .level = SHOAL_LOG_WARN,
};

static const char *const shoal_util_debug_levels[] = {
    [SHOAL_LOG_NONE] = "NONE",   [SHOAL_LOG_VERSION] = "VERSION", [SHOAL_LOG_WARN] = "WARN",
    [SHOAL_LOG_INFO] = "INFO",   [SHOAL_LOG_TRACE] = "TRACE",     NULL,
};

static const shoal_cfg_field_t shoal_util_cfg_fields[] = {
    {
        .name = "DEBUG",
        .dflt = "WARN",
        .doc = "log level: NONE, VERSION, WARN, INFO or TRACE",
        .offset = offsetof(shoal_util_config_t, level),
        .type = SHOAL_CFG_ENUM,
        .enum_names = shoal_util_debug_levels,
    },
    {
        .name = "DEBUG_SUBSYS",
        .dflt = "ALL",
        .doc = "subsystems to log: ALL, a list such as INIT,COLL,TCP, or ^TCP,SHM to exclude",
        .offset = offsetof(shoal_util_config_t, subsys),
        .type = SHOAL_CFG_STRING,
    },
    {
        .name = "DEBUG_FILE",
        .dflt = "",
        .doc = "log to this file instead of stderr; %h is the host name, %p the pid "
               "(another user's symbolic link, or another user's file in a directory others "
               "may write to, is refused: stderr)",
        .offset = offsetof(shoal_util_config_t, file),
        .type = SHOAL_CFG_STRING,
    },
    {
        .name = "HOSTID",
        .dflt = "",
        .doc = "override the host identity (ranks with equal values share a host: tests, netns)",
        .offset = offsetof(shoal_util_config_t, hostid),
        .type = SHOAL_CFG_STRING,
    },
};

const shoal_cfg_table_t shoal_util_cfg_table = {
    .module = "util",
    .fields = shoal_util_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_util_cfg_fields),
    .dst = &shoal_util_config,
};
