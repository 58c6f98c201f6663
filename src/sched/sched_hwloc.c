/*
 * One host's CPUs, memory, GPUs and NICs from an hwloc XML file (lstopo --of xml, or
 * hwloc-gather-topology on the host), for shoal-place --hwloc NAME=FILE: the node NAME gets
 * the PUs, the memory and the GPUs the file shows, whatever slurm.conf said. A GPU is a PCI
 * 3D controller (class 0x0302), or a VGA controller (0x0300) of NVIDIA or AMD (a BMC's VGA
 * is not one); a NIC is a PCI network (0x02xx) device; their OS devices name them.
 */
#include "sched/sched.h"

#include <errno.h>
#include <hwloc.h>
#include <string.h>
#include <unistd.h>

#define SHOAL_SCHED_PCI_NVIDIA 0x10de
#define SHOAL_SCHED_PCI_AMD 0x1002

static int shoal_sched_hwloc_is_gpu(hwloc_obj_t o)
{
    unsigned cls = o->attr->pcidev.class_id, vendor = o->attr->pcidev.vendor_id;
    return cls == 0x0302 ||
           (cls == 0x0300 && (vendor == SHOAL_SCHED_PCI_NVIDIA || vendor == SHOAL_SCHED_PCI_AMD));
}

/* "name, name" of the OS devices under a PCI device into buf. */
static void shoal_sched_hwloc_names(hwloc_obj_t o, char *buf, size_t size)
{
    size_t len = strlen(buf);
    for (hwloc_obj_t k = o->io_first_child; k != NULL; k = k->next_sibling) {
        if (k->type == HWLOC_OBJ_OS_DEVICE && k->name != NULL && len + 2 < size) {
            len += (size_t)snprintf(buf + len, size - len, "%s%s", len > 0 ? " " : "", k->name);
        }
    }
}

shoal_status_t shoal_sched_hwloc_node(shoal_sched_cluster_t *c, const char *name,
                                      const char *path, char *summary, size_t size)
{
    hwloc_topology_t t;
    hwloc_obj_t o = NULL;
    int gpus = 0, nics = 0, pus;
    long mem_mb;
    char gpu_names[256] = "", nic_names[256] = "";
    shoal_status_t st;

    /* hwloc says only that it could not load the file: a missing or unreadable one read as
     * "not an hwloc XML topology" */
    if (access(path, R_OK) != 0) {
        shoal_error(SCHED, "%s: cannot read it: %s", path, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    if (hwloc_topology_init(&t) != 0) {
        return SHOAL_ERR_NO_MEMORY;
    }
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_set_xml(t, path) != 0 || hwloc_topology_load(t) != 0) {
        shoal_error(SCHED, "%s: not an hwloc XML topology (hwloc could not load it)", path);
        hwloc_topology_destroy(t);
        return SHOAL_ERR_INVALID_ARG;
    }
    pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
    mem_mb = (long)(hwloc_get_root_obj(t)->total_memory >> 20);
    while ((o = hwloc_get_next_pcidev(t, o)) != NULL) {
        if (shoal_sched_hwloc_is_gpu(o)) {
            gpus++;
            shoal_sched_hwloc_names(o, gpu_names, sizeof(gpu_names));
        } else if ((o->attr->pcidev.class_id >> 8) == 0x02) {
            nics++;
            shoal_sched_hwloc_names(o, nic_names, sizeof(nic_names));
        }
    }
    hwloc_topology_destroy(t);
    if (pus <= 0 || gpus > SHOAL_SCHED_GPU_MAX) {
        shoal_error(SCHED, "%s: %d PUs and %d GPUs (at most %d)", path, pus, gpus,
                    SHOAL_SCHED_GPU_MAX);
        return SHOAL_ERR_INVALID_ARG;
    }
    int at = shoal_sched_node_find(c, name);
    int leaf = at >= 0 ? c->nodes[at].leaf : -1, down = at >= 0 ? c->nodes[at].down : 0;
    st = shoal_sched_node_add(c, name, pus, mem_mb, gpus);
    if (st == SHOAL_OK && at >= 0) {
        c->nodes[at].leaf = leaf; /* a topology.conf read before keeps its switch */
        c->nodes[at].down = down; /* and slurm.conf's DOWN or DRAIN holds */
    }
    if (st == SHOAL_OK && summary != NULL) {
        snprintf(summary, size, "%s: %d CPUs, %ld MB, %d GPU(s) [%s], %d NIC(s) [%s]", name, pus,
                 mem_mb, gpus, gpu_names, nics, nic_names);
    }
    return st;
}
