/* libucp loaded at first use (see "libraries loaded at first use" in core/tl.h): the UCP
 * functions the ucx transport calls, as hidden forwarders through pointers that
 * shoal_tl_lib_load() resolves. libshoal does not link libucp, so UCX's constructors (its
 * signal handlers, its memory hooks) run only in a process that uses the ucx transport. A
 * UCP call added to the transport needs a line in the map and a forwarder here: without them
 * the link fails (undefined reference), it never silently links libucp again. */
#include "transports/ucx/ucx.h"
#include "transports/ucx/ucx_query.h"

#include <uct/api/uct.h>

/* uct_*: the resource query of ucx_query.c (libuct, which libucp needs: found through the
 * handle of libucp) */
#define SHOAL_UCX_DL_MAP(X)                                                                    \
    X(ucp_cleanup) X(ucp_config_modify) X(ucp_config_read) X(ucp_config_release)                \
    X(ucp_ep_close_nbx) X(ucp_ep_create) X(ucp_ep_flush_nbx) X(ucp_ep_print_info)               \
    X(ucp_init_version)                                                                         \
    X(ucp_request_cancel) X(ucp_request_check_status) X(ucp_request_free)                       \
    X(ucp_tag_msg_recv_nbx) X(ucp_tag_probe_nb)                                                 \
    X(ucp_tag_recv_nbx) X(ucp_tag_send_nbx) X(ucp_worker_arm) X(ucp_worker_create)              \
    X(ucp_worker_destroy) X(ucp_worker_get_address) X(ucp_worker_get_efd)                       \
    X(ucp_worker_progress) X(ucp_worker_query) X(ucp_worker_release_address)                    \
    X(ucs_log_num_handlers) X(ucs_log_pop_handler) X(ucs_log_push_handler)                      \
    X(ucs_status_string)                                                                        \
    X(uct_component_query) X(uct_config_release) X(uct_md_close)                                \
    X(uct_md_config_read) X(uct_md_open) X(uct_md_query_tl_resources) X(uct_query_components)  \
    X(uct_release_component_list) X(uct_release_tl_resource_list)

static struct {
#define SHOAL_UCX_DL_PTR(name) __typeof__(name) *name;
    SHOAL_UCX_DL_MAP(SHOAL_UCX_DL_PTR)
#undef SHOAL_UCX_DL_PTR
} shoal_ucx_dl;

static const shoal_tl_sym_t shoal_ucx_dl_syms[] = {
#define SHOAL_UCX_DL_SYM(fn) {.name = #fn, .slot = (void **)&shoal_ucx_dl.fn},
    SHOAL_UCX_DL_MAP(SHOAL_UCX_DL_SYM)
#undef SHOAL_UCX_DL_SYM
};

shoal_tl_lib_t shoal_ucx_lib = {
    .what = "UCX",
    .path_p = &shoal_ucx_config.library,
    .dflt = "libucp.so.0",
    .fallback_dir = SHOAL_UCX_LIBDIR,
    .keep_signals_env = "UCX_HANDLE_ERRORS",
    .keep_hup_env = "UCX_DEBUG_SIGNO",
    .syms = shoal_ucx_dl_syms,
    .nsyms = SHOAL_ARRAY_SIZE(shoal_ucx_dl_syms),
    .present = shoal_ucx_present,
    .auto_ok = shoal_ucx_auto_ok,
    SHOAL_TL_LIB_STATE_INIT,
};

/* ---- forwarders: the prototypes of ucp/api/ucp.h, checked by the compiler --------------- */

void ucp_cleanup(ucp_context_h context_p)
{
    shoal_ucx_dl.ucp_cleanup(context_p);
}

ucs_status_t ucp_config_modify(ucp_config_t *config, const char *name, const char *value)
{
    return shoal_ucx_dl.ucp_config_modify(config, name, value);
}

ucs_status_t ucp_config_read(const char *env_prefix, const char *filename,
                             ucp_config_t **config_p)
{
    return shoal_ucx_dl.ucp_config_read(env_prefix, filename, config_p);
}

void ucp_config_release(ucp_config_t *config)
{
    shoal_ucx_dl.ucp_config_release(config);
}

ucs_status_ptr_t ucp_ep_close_nbx(ucp_ep_h ep, const ucp_request_param_t *param)
{
    return shoal_ucx_dl.ucp_ep_close_nbx(ep, param);
}

ucs_status_ptr_t ucp_ep_flush_nbx(ucp_ep_h ep, const ucp_request_param_t *param)
{
    return shoal_ucx_dl.ucp_ep_flush_nbx(ep, param);
}

ucs_status_t ucp_ep_create(ucp_worker_h worker, const ucp_ep_params_t *params, ucp_ep_h *ep_p)
{
    return shoal_ucx_dl.ucp_ep_create(worker, params, ep_p);
}

void ucp_ep_print_info(ucp_ep_h ep, FILE *stream)
{
    shoal_ucx_dl.ucp_ep_print_info(ep, stream);
}

ucs_status_t ucp_init_version(unsigned api_major_version, unsigned api_minor_version,
                              const ucp_params_t *params, const ucp_config_t *config,
                              ucp_context_h *context_p)
{
    return shoal_ucx_dl.ucp_init_version(api_major_version, api_minor_version, params, config,
                                         context_p);
}

void ucp_request_cancel(ucp_worker_h worker, void *request)
{
    shoal_ucx_dl.ucp_request_cancel(worker, request);
}

ucs_status_t ucp_request_check_status(void *request)
{
    return shoal_ucx_dl.ucp_request_check_status(request);
}

void ucp_request_free(void *request)
{
    shoal_ucx_dl.ucp_request_free(request);
}

ucs_status_ptr_t ucp_tag_msg_recv_nbx(ucp_worker_h worker, void *buffer, size_t count,
                                      ucp_tag_message_h message,
                                      const ucp_request_param_t *param)
{
    return shoal_ucx_dl.ucp_tag_msg_recv_nbx(worker, buffer, count, message, param);
}

ucp_tag_message_h ucp_tag_probe_nb(ucp_worker_h worker, ucp_tag_t tag, ucp_tag_t tag_mask,
                                   int remove, ucp_tag_recv_info_t *info)
{
    return shoal_ucx_dl.ucp_tag_probe_nb(worker, tag, tag_mask, remove, info);
}

ucs_status_ptr_t ucp_tag_recv_nbx(ucp_worker_h worker, void *buffer, size_t count,
                                  ucp_tag_t tag, ucp_tag_t tag_mask,
                                  const ucp_request_param_t *param)
{
    return shoal_ucx_dl.ucp_tag_recv_nbx(worker, buffer, count, tag, tag_mask, param);
}

ucs_status_ptr_t ucp_tag_send_nbx(ucp_ep_h ep, const void *buffer, size_t count, ucp_tag_t tag,
                                  const ucp_request_param_t *param)
{
    return shoal_ucx_dl.ucp_tag_send_nbx(ep, buffer, count, tag, param);
}

ucs_status_t ucp_worker_arm(ucp_worker_h worker)
{
    return shoal_ucx_dl.ucp_worker_arm(worker);
}

ucs_status_t ucp_worker_create(ucp_context_h context, const ucp_worker_params_t *params,
                               ucp_worker_h *worker_p)
{
    return shoal_ucx_dl.ucp_worker_create(context, params, worker_p);
}

void ucp_worker_destroy(ucp_worker_h worker)
{
    shoal_ucx_dl.ucp_worker_destroy(worker);
}

ucs_status_t ucp_worker_get_address(ucp_worker_h worker, ucp_address_t **address_p,
                                    size_t *address_length_p)
{
    return shoal_ucx_dl.ucp_worker_get_address(worker, address_p, address_length_p);
}

ucs_status_t ucp_worker_get_efd(ucp_worker_h worker, int *fd)
{
    return shoal_ucx_dl.ucp_worker_get_efd(worker, fd);
}

unsigned ucp_worker_progress(ucp_worker_h worker)
{
    return shoal_ucx_dl.ucp_worker_progress(worker);
}

ucs_status_t ucp_worker_query(ucp_worker_h worker, ucp_worker_attr_t *attr)
{
    return shoal_ucx_dl.ucp_worker_query(worker, attr);
}

void ucp_worker_release_address(ucp_worker_h worker, ucp_address_t *address)
{
    shoal_ucx_dl.ucp_worker_release_address(worker, address);
}

unsigned ucs_log_num_handlers(void)
{
    return shoal_ucx_dl.ucs_log_num_handlers();
}

void ucs_log_pop_handler(void)
{
    shoal_ucx_dl.ucs_log_pop_handler();
}

void ucs_log_push_handler(ucs_log_func_t handler)
{
    shoal_ucx_dl.ucs_log_push_handler(handler);
}

const char *ucs_status_string(ucs_status_t status)
{
    return shoal_ucx_dl.ucs_status_string(status);
}

/* libuct (uct/api/uct.h) */
ucs_status_t uct_component_query(uct_component_h component, uct_component_attr_t *component_attr)
{
    return shoal_ucx_dl.uct_component_query(component, component_attr);
}

void uct_config_release(void *config)
{
    shoal_ucx_dl.uct_config_release(config);
}

void uct_md_close(uct_md_h md)
{
    shoal_ucx_dl.uct_md_close(md);
}

ucs_status_t uct_md_config_read(uct_component_h component, const char *env_prefix,
                                const char *filename, uct_md_config_t **config_p)
{
    return shoal_ucx_dl.uct_md_config_read(component, env_prefix, filename, config_p);
}

ucs_status_t uct_md_open(uct_component_h component, const char *md_name,
                         const uct_md_config_t *config, uct_md_h *md_p)
{
    return shoal_ucx_dl.uct_md_open(component, md_name, config, md_p);
}

ucs_status_t uct_md_query_tl_resources(uct_md_h md, uct_tl_resource_desc_t **resources_p,
                                       unsigned *num_resources_p)
{
    return shoal_ucx_dl.uct_md_query_tl_resources(md, resources_p, num_resources_p);
}

ucs_status_t uct_query_components(uct_component_h **components_p, unsigned *num_components_p)
{
    return shoal_ucx_dl.uct_query_components(components_p, num_components_p);
}

void uct_release_component_list(uct_component_h *components)
{
    shoal_ucx_dl.uct_release_component_list(components);
}

void uct_release_tl_resource_list(uct_tl_resource_desc_t *resources)
{
    shoal_ucx_dl.uct_release_tl_resource_list(resources);
}
