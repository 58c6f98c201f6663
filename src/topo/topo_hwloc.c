/* Host discovery through hwloc: packages, NUMA nodes, caches, network and GPU devices. */
#include "topo/topo.h"

#include <hwloc.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

static int shoal_topo_hwloc_count(hwloc_topology_t t, hwloc_obj_type_t type)
{
    int n = hwloc_get_nbobjs_by_type(t, type);
    return n < 0 ? 0 : n;
}

static uint32_t shoal_topo_hwloc_cache_kb(hwloc_topology_t t, hwloc_obj_type_t type)
{
    hwloc_obj_t o = hwloc_get_obj_by_type(t, type, 0);
    return o != NULL && o->attr != NULL ? (uint32_t)(o->attr->cache.size / 1024) : 0;
}

/* NUMA node and package of the closest non-I/O ancestor of an I/O object. */
static void shoal_topo_hwloc_locality(hwloc_topology_t t, hwloc_obj_t io, shoal_topo_dev_t *d)
{
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, io);
    hwloc_obj_t pkg;

    d->numa = -1;
    d->socket = -1;
    if (anc == NULL) {
        return;
    }
    if (anc->nodeset != NULL && hwloc_bitmap_weight(anc->nodeset) == 1) {
        d->numa = (int16_t)hwloc_bitmap_first(anc->nodeset);
    }
    pkg = anc->type == HWLOC_OBJ_PACKAGE ? anc
                                         : hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE,
                                                                          anc);
    if (pkg != NULL) {
        d->socket = (int16_t)pkg->logical_index;
    }
}

static void shoal_topo_hwloc_devices(hwloc_topology_t t, shoal_topo_summary_t *out)
{
    hwloc_obj_t o;

    for (o = hwloc_get_next_osdev(t, NULL); o != NULL; o = hwloc_get_next_osdev(t, o)) {
        shoal_topo_dev_t *d;
        if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK &&
            o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS) {
            continue;
        }
        if (out->nnics++ >= SHOAL_TOPO_DEV_MAX) {
            continue;
        }
        d = &out->nics[out->nnics - 1];
        snprintf(d->name, sizeof(d->name), "%s", o->name != NULL ? o->name : "?");
        shoal_topo_hwloc_locality(t, o, d);
    }
    for (o = hwloc_get_next_pcidev(t, NULL); o != NULL; o = hwloc_get_next_pcidev(t, o)) {
        shoal_topo_dev_t *d;
        /* PCI class 0x03xx: display controllers (VGA, 3D) */
        if ((o->attr->pcidev.class_id >> 8) != 0x03) {
            continue;
        }
        if (out->ngpus++ >= SHOAL_TOPO_DEV_MAX) {
            continue;
        }
        d = &out->gpus[out->ngpus - 1];
        snprintf(d->name, sizeof(d->name), "%04x:%02x:%02x.%x", o->attr->pcidev.domain,
                 o->attr->pcidev.bus, o->attr->pcidev.dev, o->attr->pcidev.func);
        shoal_topo_hwloc_locality(t, o, d);
    }
}

static void shoal_topo_hwloc_self(hwloc_topology_t t, shoal_topo_summary_t *out)
{
    int cpu = sched_getcpu();
    hwloc_obj_t pu, pkg;

    out->cpu = cpu;
    out->socket = -1;
    out->numa = -1;
    if (cpu < 0 || (pu = hwloc_get_pu_obj_by_os_index(t, (unsigned)cpu)) == NULL) {
        return;
    }
    pkg = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, pu);
    out->socket = pkg != NULL ? (int32_t)pkg->logical_index : 0;
    if (pu->nodeset != NULL && !hwloc_bitmap_iszero(pu->nodeset)) {
        out->numa = hwloc_bitmap_first(pu->nodeset);
    }
}

int shoal_topo_discover_hwloc(shoal_topo_summary_t *out)
{
    hwloc_topology_t t;

    if (hwloc_topology_init(&t) != 0) {
        return -1;
    }
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
#if HWLOC_API_VERSION >= 0x00020100
    /* The pci component (libpciaccess) leaks its tables at every load (LeakSanitizer sees
     * it in every rank): network devices come from the linux component anyway, GPUs are
     * then read from sysfs (topo_discover.c). */
    hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
#endif
    if (hwloc_topology_load(t) != 0) {
        shoal_warn(TOPO, "hwloc_topology_load failed: falling back to sysfs");
        hwloc_topology_destroy(t);
        return -1;
    }
    out->source = SHOAL_TOPO_SRC_HWLOC;
    out->nsockets = shoal_topo_hwloc_count(t, HWLOC_OBJ_PACKAGE);
    out->nnuma = shoal_topo_hwloc_count(t, HWLOC_OBJ_NUMANODE);
    out->ncores = shoal_topo_hwloc_count(t, HWLOC_OBJ_CORE);
    out->npus = shoal_topo_hwloc_count(t, HWLOC_OBJ_PU);
    out->l1d_kb = shoal_topo_hwloc_cache_kb(t, HWLOC_OBJ_L1CACHE);
    out->l2_kb = shoal_topo_hwloc_cache_kb(t, HWLOC_OBJ_L2CACHE);
    out->l3_kb = shoal_topo_hwloc_cache_kb(t, HWLOC_OBJ_L3CACHE);
    shoal_topo_hwloc_devices(t, out);
    shoal_topo_hwloc_self(t, out);
    hwloc_topology_destroy(t);
    return 0;
}
