/* SHOAL_* variables of the coordinated stop (src/stop). */
#include "stop/stop.h"

#include <stddef.h>

shoal_stop_config_t shoal_stop_config;

static const shoal_cfg_field_t shoal_stop_cfg_fields[] = {
    {.name = "STOP_SIGNALS", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_stop_config_t, signals),
     .doc = "signals that ask the job to stop (e.g. USR1,TERM): the first communicator "
            "installs a handler for them that only flags a stop request, which the next "
            "shoal_comm_should_stop agrees on across ranks (the application's own handler "
            "still runs; its actions are restored when the last communicator is destroyed, "
            "unless a stop is under way: one of the signals came or an agreement said stop, "
            "and then the handler stays); HUP INT QUIT ALRM TERM USR1 USR2 XCPU PWR RTMIN+n; "
            "empty = the library installs no handler"},
    {.name = "STOP_FILE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_stop_config_t, file),
     .doc = "a path whose existence asks the job to stop (%t the tenant, uid=N without one; "
            "%j the job, default without one): every "
            "shoal_comm_should_stop looks for it (one lstat() call) until a stop is "
            "requested; for the node agent or a Kubernetes preStop hook; put it in a "
            "directory only the provider can write: a symbolic link, a file group or others "
            "may write, a stranger's file or directory in a directory others may write "
            "to, or one under a directory others may write to without the sticky bit is "
            "ignored with a warning; a tenant or job name that holds a '/' or is '.' or "
            "'..' (not one file name) fails shoal_comm_init with SHOAL_ERR_INVALID_ARG; "
            "empty = none"},
};

const shoal_cfg_table_t shoal_stop_cfg_table = {
    .module = "stop",
    .fields = shoal_stop_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_stop_cfg_fields),
    .dst = &shoal_stop_config,
};
