/* libibverbs loaded at first use (see "libraries loaded at first use" in core/tl.h): the verbs
 * functions the ib transport calls, as hidden forwarders through pointers that
 * shoal_tl_lib_load() resolves; libshoal does not link libibverbs. The data path's verbs
 * (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are inline calls through the
 * provider's ops and need nothing here. A verbs call added to the transport needs a line in
 * the map and a forwarder here: without them the link fails (undefined reference). */
#include "transports/ib/ib_verbs.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>

/* verbs.h wraps these in macros and inline functions that call the exported symbols; the
 * forwarders below are those exported symbols. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define SHOAL_IB_DL_MAP(X)                                                                     \
    X(ibv_ack_cq_events) X(ibv_alloc_pd) X(ibv_close_device) X(ibv_create_comp_channel)         \
    X(ibv_create_cq) X(ibv_create_qp) X(ibv_dealloc_pd) X(ibv_dereg_mr)                         \
    X(ibv_destroy_comp_channel) X(ibv_destroy_cq) X(ibv_destroy_qp) X(ibv_free_device_list)     \
    X(ibv_get_cq_event) X(ibv_get_device_list) X(ibv_get_device_name) X(ibv_modify_qp)          \
    X(ibv_open_device) X(ibv_port_state_str) X(ibv_query_device) X(ibv_query_gid)               \
    X(ibv_query_port) X(ibv_reg_mr) X(ibv_reg_mr_iova2) X(ibv_wc_status_str)

static struct {
#define SHOAL_IB_DL_PTR(name) __typeof__(name) *name;
    SHOAL_IB_DL_MAP(SHOAL_IB_DL_PTR)
#undef SHOAL_IB_DL_PTR
} shoal_ib_dl;

static const shoal_tl_sym_t shoal_ib_dl_syms[] = {
#define SHOAL_IB_DL_SYM(fn) {.name = #fn, .slot = (void **)&shoal_ib_dl.fn},
    SHOAL_IB_DL_MAP(SHOAL_IB_DL_SYM)
#undef SHOAL_IB_DL_SYM
};

static const char *const shoal_ib_dl_path = "libibverbs.so.1";

/* Without an RDMA device in sysfs (SHOAL_IB_SYSFS_ROOT/class/infiniband empty or absent)
 * libibverbs would find none either: an ib transport that is not forced is then not queried,
 * and libibverbs is not loaded into every job on such hosts. */
static int shoal_ib_dl_present(void)
{
    char path[PATH_MAX];
    struct dirent *de;
    DIR *d;
    int found = 0;
    const char *root = shoal_ib_config.sysfs_root;

    snprintf(path, sizeof(path), "%s/class/infiniband",
             root != NULL && root[0] != '\0' ? root : "/sys");
    d = opendir(path);
    if (d == NULL) {
        return 0;
    }
    while (!found && (de = readdir(d)) != NULL) {
        found = de->d_name[0] != '.';
    }
    closedir(d);
    return found;
}

shoal_tl_lib_t shoal_ib_lib = {
    .what = "libibverbs",
    .path_p = &shoal_ib_dl_path,
    .dflt = "libibverbs.so.1",
    .fallback_dir = SHOAL_VERBS_LIBDIR,
    .keep_signals_env = NULL,
    .syms = shoal_ib_dl_syms,
    .nsyms = SHOAL_ARRAY_SIZE(shoal_ib_dl_syms),
    .present = shoal_ib_dl_present,
    SHOAL_TL_LIB_STATE_INIT,
};

/* ---- forwarders: the prototypes of infiniband/verbs.h, checked by the compiler ---------- */

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    shoal_ib_dl.ibv_ack_cq_events(cq, nevents);
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    return shoal_ib_dl.ibv_alloc_pd(context);
}

int ibv_close_device(struct ibv_context *context)
{
    return shoal_ib_dl.ibv_close_device(context);
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
    return shoal_ib_dl.ibv_create_comp_channel(context);
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    return shoal_ib_dl.ibv_create_cq(context, cqe, cq_context, channel, comp_vector);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
    return shoal_ib_dl.ibv_create_qp(pd, qp_init_attr);
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    return shoal_ib_dl.ibv_dealloc_pd(pd);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    return shoal_ib_dl.ibv_dereg_mr(mr);
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    return shoal_ib_dl.ibv_destroy_comp_channel(channel);
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    return shoal_ib_dl.ibv_destroy_cq(cq);
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    return shoal_ib_dl.ibv_destroy_qp(qp);
}

void ibv_free_device_list(struct ibv_device **list)
{
    shoal_ib_dl.ibv_free_device_list(list);
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
    return shoal_ib_dl.ibv_get_cq_event(channel, cq, cq_context);
}

struct ibv_device **ibv_get_device_list(int *num_devices)
{
    return shoal_ib_dl.ibv_get_device_list(num_devices);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    return shoal_ib_dl.ibv_get_device_name(device);
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
    return shoal_ib_dl.ibv_modify_qp(qp, attr, attr_mask);
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    return shoal_ib_dl.ibv_open_device(device);
}

const char *ibv_port_state_str(enum ibv_port_state port_state)
{
    return shoal_ib_dl.ibv_port_state_str(port_state);
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
    return shoal_ib_dl.ibv_query_device(context, device_attr);
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
    return shoal_ib_dl.ibv_query_gid(context, port_num, index, gid);
}

int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                   struct _compat_ibv_port_attr *port_attr)
{
    return shoal_ib_dl.ibv_query_port(context, port_num, port_attr);
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return shoal_ib_dl.ibv_reg_mr(pd, addr, length, access);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                unsigned int access)
{
    return shoal_ib_dl.ibv_reg_mr_iova2(pd, addr, length, iova, access);
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    return shoal_ib_dl.ibv_wc_status_str(status);
}
