/* Host discovery: hwloc where built in, else sysfs/procfs; cached once per process. */
#include "topo/topo.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SHOAL_TOPO_SYS_CPU "/sys/devices/system/cpu"
#define SHOAL_TOPO_SYS_NODE "/sys/devices/system/node"
#define SHOAL_TOPO_SYS_NET "/sys/class/net"
#define SHOAL_TOPO_SYS_PCI "/sys/bus/pci/devices"
#define SHOAL_TOPO_MAX_CPUS 4096

static pthread_mutex_t shoal_topo_lock = PTHREAD_MUTEX_INITIALIZER;
static shoal_topo_summary_t shoal_topo_cached;
static int shoal_topo_cached_mode = -1;

/* First integer in a sysfs file; -1 if unreadable. */
static long shoal_topo_read_long(const char *path)
{
    FILE *fp = fopen(path, "r");
    long v = -1;
    if (fp != NULL) {
        if (fscanf(fp, "%li", &v) != 1) {
            v = -1;
        }
        fclose(fp);
    }
    return v;
}

static int shoal_topo_read_str(const char *path, char *buf, size_t len)
{
    FILE *fp = fopen(path, "r");
    int ok = 0;
    if (fp != NULL) {
        if (fgets(buf, (int)len, fp) != NULL) {
            buf[strcspn(buf, "\n")] = '\0';
            ok = 1;
        }
        fclose(fp);
    }
    return ok;
}

/* Package (socket) id of a CPU, -1 unknown. */
static int shoal_topo_sysfs_cpu_pkg_at(const char *root, int cpu)
{
    char path[512];
    snprintf(path, sizeof(path), "%.400s/cpu%d/topology/physical_package_id", root, cpu);
    return (int)shoal_topo_read_long(path);
}

static int shoal_topo_sysfs_cpu_pkg(int cpu)
{
    return shoal_topo_sysfs_cpu_pkg_at(SHOAL_TOPO_SYS_CPU, cpu);
}

/* Whether the CPU is there (online: its topology directory exists). Its package id alone
 * said so: a kernel that reports none (-1: some arm64 machines and VMs) had no CPU at all,
 * and discovery failed whole (caches unknown, every setting its fixed default). */
static int shoal_topo_sysfs_cpu_present(const char *root, int cpu)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof(path), "%.400s/cpu%d/topology", root, cpu);
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int shoal_topo_sysfs_cpu_node(int cpu)
{
    char path[128];
    struct dirent *e;
    DIR *d;
    int node = -1;

    snprintf(path, sizeof(path), SHOAL_TOPO_SYS_CPU "/cpu%d", cpu);
    d = opendir(path);
    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9') {
            node = atoi(e->d_name + 4);
            break;
        }
    }
    closedir(d);
    return node;
}

/* Sockets (distinct package ids), cores (distinct package/core pairs) and PUs from the cpu
 * directories under root. Package ids are not small: a seen-table of 256 left every CPU of a
 * package id of 256 or more uncounted ('sockets 0'). */
void shoal_topo_sysfs_cpus_at(const char *root, shoal_topo_summary_t *out)
{
    long *cores = calloc(SHOAL_TOPO_MAX_CPUS, sizeof(long));
    int *pkgs = calloc(SHOAL_TOPO_MAX_CPUS, sizeof(int));

    for (int cpu = 0; cpu < SHOAL_TOPO_MAX_CPUS && cores != NULL && pkgs != NULL; cpu++) {
        char path[512];
        int pkg, seen = 0;
        long core, key;
        if (!shoal_topo_sysfs_cpu_present(root, cpu)) {
            if (cpu > 0 && !shoal_topo_sysfs_cpu_present(root, cpu + 1)) {
                break;
            }
            continue;
        }
        /* -1: no package known, one */
        pkg = SHOAL_MAX(shoal_topo_sysfs_cpu_pkg_at(root, cpu), 0);
        out->npus++;
        for (int i = 0; i < out->nsockets; i++) {
            seen |= pkgs[i] == pkg;
        }
        if (!seen) {
            pkgs[out->nsockets++] = pkg;
        }
        snprintf(path, sizeof(path), "%.400s/cpu%d/topology/core_id", root, cpu);
        core = shoal_topo_read_long(path);
        key = ((long)pkg << 20) | (core & 0xfffff);
        seen = 0;
        for (int i = 0; i < out->ncores; i++) {
            seen |= cores[i] == key;
        }
        if (!seen) {
            cores[out->ncores++] = key;
        }
    }
    free(cores);
    free(pkgs);
}

static void shoal_topo_sysfs_caches(shoal_topo_summary_t *out)
{
    for (int i = 0; i < 8; i++) {
        char path[128], type[32], size[32];
        long level;
        snprintf(path, sizeof(path), SHOAL_TOPO_SYS_CPU "/cpu0/cache/index%d/level", i);
        level = shoal_topo_read_long(path);
        if (level < 0) {
            break;
        }
        snprintf(path, sizeof(path), SHOAL_TOPO_SYS_CPU "/cpu0/cache/index%d/type", i);
        if (!shoal_topo_read_str(path, type, sizeof(type)) || strcmp(type, "Instruction") == 0) {
            continue;
        }
        snprintf(path, sizeof(path), SHOAL_TOPO_SYS_CPU "/cpu0/cache/index%d/size", i);
        if (!shoal_topo_read_str(path, size, sizeof(size))) {
            continue;
        }
        uint32_t kb = (uint32_t)strtoul(size, NULL, 10) * (strchr(size, 'M') != NULL ? 1024 : 1);
        if (level == 1) {
            out->l1d_kb = kb;
        } else if (level == 2) {
            out->l2_kb = kb;
        } else if (level == 3) {
            out->l3_kb = kb;
        }
    }
}

static void shoal_topo_sysfs_dev_locality(const char *devdir, shoal_topo_dev_t *d)
{
    char path[512];
    snprintf(path, sizeof(path), "%.400s/numa_node", devdir);
    d->numa = (int16_t)shoal_topo_read_long(path);
    d->socket = -1;
}

static void shoal_topo_sysfs_nics(shoal_topo_summary_t *out)
{
    DIR *d = opendir(SHOAL_TOPO_SYS_NET);
    struct dirent *e;

    while (d != NULL && (e = readdir(d)) != NULL) {
        char path[512];
        shoal_topo_dev_t *dev;
        long speed;
        if (e->d_name[0] == '.' || strcmp(e->d_name, "lo") == 0) {
            continue;
        }
        if (out->nnics++ >= SHOAL_TOPO_DEV_MAX) {
            continue;
        }
        dev = &out->nics[out->nnics - 1];
        snprintf(dev->name, sizeof(dev->name), "%.23s", e->d_name);
        snprintf(path, sizeof(path), SHOAL_TOPO_SYS_NET "/%.255s/device", e->d_name);
        shoal_topo_sysfs_dev_locality(path, dev);
        snprintf(path, sizeof(path), SHOAL_TOPO_SYS_NET "/%.255s/speed", e->d_name);
        speed = shoal_topo_read_long(path);
        dev->speed_mbps = speed > 0 ? (uint32_t)speed : 0;
    }
    if (d != NULL) {
        closedir(d);
    }
}

static void shoal_topo_sysfs_gpus(shoal_topo_summary_t *out)
{
    DIR *d = opendir(SHOAL_TOPO_SYS_PCI);
    struct dirent *e;

    while (d != NULL && (e = readdir(d)) != NULL) {
        char path[512];
        if (e->d_name[0] == '.') {
            continue;
        }
        snprintf(path, sizeof(path), SHOAL_TOPO_SYS_PCI "/%.255s/class", e->d_name);
        if (((shoal_topo_read_long(path) >> 16) & 0xff) != 0x03) {
            continue;
        }
        if (out->ngpus++ >= SHOAL_TOPO_DEV_MAX) {
            continue;
        }
        snprintf(out->gpus[out->ngpus - 1].name, SHOAL_TOPO_DEVNAME_MAX, "%.23s", e->d_name);
        snprintf(path, sizeof(path), SHOAL_TOPO_SYS_PCI "/%.255s", e->d_name);
        shoal_topo_sysfs_dev_locality(path, &out->gpus[out->ngpus - 1]);
    }
    if (d != NULL) {
        closedir(d);
    }
}

int shoal_topo_discover_sysfs(shoal_topo_summary_t *out)
{
    DIR *d;
    struct dirent *e;

    shoal_topo_sysfs_cpus_at(SHOAL_TOPO_SYS_CPU, out);
    if (out->npus == 0) {
        return -1;
    }
    out->source = SHOAL_TOPO_SRC_SYSFS;
    d = opendir(SHOAL_TOPO_SYS_NODE);
    while (d != NULL && (e = readdir(d)) != NULL) {
        out->nnuma += strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' &&
                      e->d_name[4] <= '9';
    }
    if (d != NULL) {
        closedir(d);
    }
    out->nnuma = SHOAL_MAX(out->nnuma, 1);
    shoal_topo_sysfs_caches(out);
    shoal_topo_sysfs_nics(out);
    shoal_topo_sysfs_gpus(out);
    return 0;
}

#if !SHOAL_HAVE_HWLOC
int shoal_topo_discover_hwloc(shoal_topo_summary_t *out)
{
    (void)out;
    return -1;
}
#endif

void shoal_topo_discover(int mode, shoal_topo_summary_t *out)
{
    pthread_mutex_lock(&shoal_topo_lock);
    if (shoal_topo_cached_mode != mode) {
        shoal_topo_summary_t s;
        memset(&s, 0, sizeof(s));
        if (mode == SHOAL_TOPO_DISC_AUTO || mode == SHOAL_TOPO_DISC_HWLOC) {
#if !SHOAL_HAVE_HWLOC
            if (mode == SHOAL_TOPO_DISC_HWLOC) { /* a load that fails says so itself */
                shoal_warn(TOPO, "SHOAL_TOPO_DISCOVERY=hwloc: this library was built without "
                           "hwloc: discovering by sysfs");
            }
#endif
            if (shoal_topo_discover_hwloc(&s) != 0) {
                memset(&s, 0, sizeof(s));
            } else if (s.ngpus == 0) {
                shoal_topo_sysfs_gpus(&s);
            }
        }
        if (s.source == SHOAL_TOPO_SRC_NONE && mode != SHOAL_TOPO_DISC_NONE) {
            if (shoal_topo_discover_sysfs(&s) != 0) {
                memset(&s, 0, sizeof(s));
            }
        }
        shoal_topo_cached = s;
        shoal_topo_cached_mode = mode;
    }
    *out = shoal_topo_cached;
    pthread_mutex_unlock(&shoal_topo_lock);
    out->host_id = shoal_host_id();
    out->cpu = sched_getcpu();
    out->socket = out->cpu >= 0 && out->source != SHOAL_TOPO_SRC_NONE
                      ? shoal_topo_sysfs_cpu_pkg(out->cpu) : -1;
    out->numa = out->cpu >= 0 && out->source != SHOAL_TOPO_SRC_NONE
                    ? shoal_topo_sysfs_cpu_node(out->cpu) : -1;
}

static void shoal_topo_dev_print(const char *what, const shoal_topo_dev_t *d, FILE *fp)
{
    fprintf(fp, "#     %-4s %-16s numa %d socket %d", what, d->name, d->numa, d->socket);
    if (d->speed_mbps > 0) {
        fprintf(fp, " speed %u Mb/s", d->speed_mbps);
    }
    fputc('\n', fp);
}

void shoal_topo_summary_print(const shoal_topo_summary_t *s, FILE *fp)
{
    static const char *const src[] = {"none", "sysfs", "hwloc"};
    fprintf(fp, "#   discovered by: %s\n", src[s->source]);
    fprintf(fp, "#   sockets %d, NUMA nodes %d, cores %d, PUs %d\n", s->nsockets, s->nnuma,
            s->ncores, s->npus);
    fprintf(fp, "#   caches: L1d %u KiB, L2 %u KiB, L3 %u KiB\n", s->l1d_kb, s->l2_kb, s->l3_kb);
    fprintf(fp, "#   this process: cpu %d, socket %d, NUMA node %d\n", s->cpu, s->socket,
            s->numa);
    fprintf(fp, "#   NICs %d, GPUs %d\n", s->nnics, s->ngpus);
    for (int i = 0; i < SHOAL_MIN(s->nnics, SHOAL_TOPO_DEV_MAX); i++) {
        shoal_topo_dev_print("nic", &s->nics[i], fp);
    }
    for (int i = 0; i < SHOAL_MIN(s->ngpus, SHOAL_TOPO_DEV_MAX); i++) {
        shoal_topo_dev_print("gpu", &s->gpus[i], fp);
    }
}
