/* SHOAL_* variables of the settings that follow the machine (src/tune). */
#include "tune/tune.h"

#include <stddef.h>

shoal_tune_config_t shoal_tune_config = {.enable = 1};

static const shoal_cfg_field_t shoal_tune_cfg_fields[] = {
    {.name = "TUNE", .dflt = "1", .type = SHOAL_CFG_BOOL,
     .offset = offsetof(shoal_tune_config_t, enable),
     .doc = "derive the pipeline chunk, the intra-node window, one-shot and LL limits and the "
            "cost model's memory rates from this machine's caches and a memory measurement "
            "(rank 0's, sent to every rank; shoal_info -t shows them), and the transport sizes "
            "(shm ring slot and slots, tcp striping threshold, ucx inline limit and single-copy "
            "threshold: each host's lowest rank's); 0 = the fixed defaults. Explicit settings "
            "(SHOAL_CHUNK_SIZE, SHOAL_SHM_WINDOW, SHOAL_SHM_ONESHOT_MAX, SHOAL_SHM_LL_MAX, "
            "SHOAL_SHM_SLOT_SIZE, SHOAL_SHM_NSLOTS, SHOAL_TCP_MIN_SPLIT, SHOAL_UCX_INLINE_MAX, "
            "SHOAL_UCX_CMA_MIN, 'set' lines of SHOAL_TUNING_FILE) always win"},
    {.name = "TUNE_MACHINE", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_tune_config_t, machine),
     .doc = "this process's machine profile instead of discovering or measuring it, any of "
            "'l1d=32k l2=1m l3=32m copy_cache=40 copy=9.5 reduce=8 tcp_rbuf=128k' (sizes; rates "
            "in GB/s: memcpy in L2, memcpy from memory, float sum from memory; tcp_rbuf: a TCP "
            "socket's initial receive buffer); what it does not give is discovered or measured as "
            "without it"},
    {.name = "TUNE_CACHE_DIR", .dflt = "", .type = SHOAL_CFG_STRING,
     .offset = offsetof(shoal_tune_config_t, cache_dir),
     .doc = "where the per-host memory measurement is cached (file shoal-tune-<uid>-<hostid>, "
            "-asan/-tsan/-O0 appended for such builds); measured again when an hour old, the "
            "best rates kept, restarted after 7 days; empty = $XDG_RUNTIME_DIR where it is a "
            "directory, else /tmp (also for a relative path, with a warning; a lock file of "
            "another user there is warned about: nothing is cached)"},
};

const shoal_cfg_table_t shoal_tune_cfg_table = {
    .module = "tune",
    .fields = shoal_tune_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_tune_cfg_fields),
    .dst = &shoal_tune_config,
};
