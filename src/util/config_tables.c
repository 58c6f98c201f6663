/* Every env-var config table of the library, in one list (no constructors). */
#include "util/util.h"

extern const shoal_cfg_table_t shoal_util_cfg_table;
extern const shoal_cfg_table_t shoal_core_cfg_table;
extern const shoal_cfg_table_t shoal_coll_cfg_table;
extern const shoal_cfg_table_t shoal_topo_cfg_table;
extern const shoal_cfg_table_t shoal_shm_cfg_table;
extern const shoal_cfg_table_t shoal_tcp_cfg_table;
extern const shoal_cfg_table_t shoal_tenant_cred_cfg_table;
extern const shoal_cfg_table_t shoal_tenant_breaker_cfg_table;
extern const shoal_cfg_table_t shoal_tenant_cfg_table;
extern const shoal_cfg_table_t shoal_meter_cfg_table;
extern const shoal_cfg_table_t shoal_qos_class_cfg_table;
extern const shoal_cfg_table_t shoal_qos_pace_cfg_table;
extern const shoal_cfg_table_t shoal_stop_cfg_table;
extern const shoal_cfg_table_t shoal_tune_cfg_table;
#if SHOAL_HAVE_VERBS
extern const shoal_cfg_table_t shoal_ib_cfg_table;
#endif
#if SHOAL_HAVE_UCX
extern const shoal_cfg_table_t shoal_ucx_cfg_table;
#endif
#if SHOAL_HAVE_CUDA
extern const shoal_cfg_table_t shoal_cuda_cfg_table;
#endif

const shoal_cfg_table_t *const shoal_cfg_tables[] = {
    &shoal_util_cfg_table,
    &shoal_core_cfg_table,
    &shoal_coll_cfg_table,
    &shoal_topo_cfg_table,
    &shoal_shm_cfg_table,
    &shoal_tcp_cfg_table,
    &shoal_tenant_cred_cfg_table,
    &shoal_tenant_breaker_cfg_table,
    &shoal_tenant_cfg_table,
    &shoal_meter_cfg_table,
    &shoal_qos_class_cfg_table,
    &shoal_qos_pace_cfg_table,
    &shoal_stop_cfg_table,
    &shoal_tune_cfg_table,
#if SHOAL_HAVE_VERBS
    &shoal_ib_cfg_table,
#endif
#if SHOAL_HAVE_UCX
    &shoal_ucx_cfg_table,
#endif
#if SHOAL_HAVE_CUDA
    &shoal_cuda_cfg_table,
#endif
};
const size_t shoal_cfg_ntables = SHOAL_ARRAY_SIZE(shoal_cfg_tables);
