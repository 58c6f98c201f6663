/* shoal_info: what was built in, what is usable now, and every SHOAL_* variable.
 *   -v  version           -b  built-in components (transports, optional dependencies)
 *   -c  config variables  -m  with -c: the Markdown table for the README
 *   -t  topology: this host (or SHOAL_TOPO_FILE), the settings that follow the machine
 *       (src/tune), ring order, trees, allreduce choice per size
 *       (-n N ranks, --ppn P ranks per host)
 *   -q  QoS: this process's effective class and weight, and the marks of every class
 *   -h, --help  help
 * A tool, not the library: it prints to stdout. */
#include "coll/coll.h"
#include "qos/qos.h"
#include "qos/pace.h"
#include "tenant/tenant.h"
#include "core/core.h"
#include "core/tl.h"
#if SHOAL_HAVE_VERBS
#include "transports/ib/ib.h"
#include <dirent.h>
#endif
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sys/mman.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOAL_INFO_VALUE_MAX 512
/* -n and --ppn at most: the layout of -t scans ranks x hosts (src/topo), a few seconds at
 * 65536 ranks on as many hosts; minutes beyond */
#define SHOAL_INFO_RANKS_MAX 65536

static void shoal_info_usage(FILE *fp)
{
    fprintf(fp,
            "usage: shoal_info [-v] [-b] [-c [-m]] [-t [-n N] [--ppn P]] [-q] [-h|--help]\n"
            "  -v  print the version\n"
            "  -b  print built-in components: transports (and whether usable now),\n"
            "      optional dependencies\n"
            "  -c  print every SHOAL_* variable: value, default, source and meaning\n"
            "      (a valid SHOAL_CONF_FILE: only the variables set in the environment or a\n"
            "      file are assignments; defaults, derived values and secrets are comments)\n"
            "  -m  with -c: print a Markdown table (Variable | Default | Meaning)\n"
            "  -t  print the topology: this host (hwloc or sysfs), the settings derived from\n"
            "      its caches and memory rates (chunk, window, one-shot and LL limits, model\n"
            "      rates; each with its source: default, derived, env or file, and why), the\n"
            "      hosts and sockets of N ranks (SHOAL_TOPO_FILE, or --ppn P ranks per host\n"
            "      in blocks), the ring order, the double binary trees, and the AllReduce\n"
            "      algorithm chosen per size by the cost model (links: SHOAL_TOPO_FILE,\n"
            "      SHOAL_TUNING_FILE or defaults, of SHOAL_TRANSPORT's kind where set)\n"
            "  -n N      with -t: number of ranks, 1..%d (default: the topology file's,\n"
            "            else the number of PUs of this host, at least 2)\n"
            "  --ppn P   with -t: ranks per host, 1..%d (default: all on one host)\n"
            "  -q  print QoS: the class and weight this process's communicators get (the\n"
            "      credential's, lowered by SHOAL_QOS_CLASS/_WEIGHT; without one at most\n"
            "      SHOAL_QOS_CLASS_MAX) and the marks of every class (DSCP, SO_PRIORITY,\n"
            "      IB traffic class and service level, rate cap)\n"
            "  -h, --help  print this help\n"
            "With no option, -v is assumed.\n", SHOAL_INFO_RANKS_MAX, SHOAL_INFO_RANKS_MAX);
}

static void shoal_info_print_version(void)
{
    printf("# %s (API %d.%d.%d, transport ABI %d)\n", shoal_version_string(), SHOAL_VERSION_MAJOR,
           SHOAL_VERSION_MINOR, SHOAL_VERSION_PATCH, SHOAL_TL_ABI_VERSION);
}

static void shoal_info_print_transports(void)
{
    size_t i, n = shoal_tl_count();
    const char *name = shoal_core_config.transport;
    int forced = -1;
    char across[640];

    /* first, as a job's init does: the libraries this loads are those a job loads */
    shoal_config_global_init();
    for (i = 0; name != NULL && name[0] != '\0' && i < n; i++) {
        forced = strcmp(shoal_tl_get(i)->name, name) == 0 ? (int)i : forced;
    }
    (void)shoal_tl_query_mask_why(forced, across, sizeof(across));
    printf("# transports, in order of preference\n");
    for (i = 0; i < n; i++) {
        const shoal_tl_ops_t *tl = shoal_tl_get(i);
        const char *usable = tl->query == NULL ? "unknown" : (tl->query() ? "yes" : "no");
        const shoal_tl_lib_t *lib = shoal_tl_lib(i);

        printf("#   %-6s usable: %-7s scope: %s%s\n", tl->name, usable,
               tl->intra_node_only ? "same host" : "any host",
               (tl->caps & SHOAL_TL_CAP_SHARED_AREA) != 0 ? ", shared area" : "");
        /* query() above loaded it: a job loads it only when it uses the transport */
        if (lib != NULL) {
            printf("#   %-6s library: %s (a job loads it only when SHOAL_TRANSPORT=%s, or to "
                   "query it across hosts)\n", tl->name, lib->why, tl->name);
        }
    }
    printf("# across hosts (this host's side): %s\n", across);
}

static void shoal_info_print_built(void)
{
    /* found: configure found the dependency; used_by: the layer of shoal that uses it, or
     * NULL while that layer is not written yet (then nothing of it is in this build). */
    static const struct {
        const char *name;
        int found;
        const char *used_by;
    } deps[] = {
        {.name = "hwloc", .found = SHOAL_HAVE_HWLOC, .used_by = "topology discovery"},
        {.name = "ucx", .found = SHOAL_HAVE_UCX, .used_by = "transport ucx (libucp loaded at first use)"},
        {.name = "verbs", .found = SHOAL_HAVE_VERBS, .used_by = "transport ib (libibverbs loaded at first use)"},
        {.name = "pmix", .found = SHOAL_HAVE_PMIX, .used_by = "shoal_comm_init_env under mpirun/srun"},
        {.name = "cuda", .found = SHOAL_HAVE_CUDA, .used_by = "stream-ordered collectives (libcuda loaded at first use)"},
        {.name = "nccl", .found = SHOAL_HAVE_NCCL && SHOAL_HAVE_CUDA, .used_by = "SHOAL_CUDA_BACKEND=nccl (loaded at first use)"},
        {.name = "mpi", .found = SHOAL_HAVE_MPI, .used_by = "libshoal_mpi, *_perf_mpi"},
    };
    static const char *const levels[] = {"none", "version", "warn", "info", "trace"};
    size_t i;

    shoal_info_print_transports();
    printf("# optional dependencies (found by configure, and what of shoal uses them)\n");
    for (i = 0; i < SHOAL_ARRAY_SIZE(deps); i++)
        printf("#   %-6s found: %-3s built in: %s\n", deps[i].name, deps[i].found ? "yes" : "no",
               deps[i].found ? deps[i].used_by : "no");
    printf("# build\n");
    printf("#   logging up to: %s\n", levels[SHOAL_LOG_MAX_LEVEL]);
#ifdef SHOAL_DEBUG_BUILD
    printf("#   debug build: yes\n");
#else
    printf("#   debug build: no\n");
#endif
}

static const void *shoal_info_field_src(const shoal_cfg_table_t *t, const shoal_cfg_field_t *f)
{
    return (const char *)t->dst + f->offset;
}

static void shoal_info_print_config(void)
{
    char value[SHOAL_INFO_VALUE_MAX];
    size_t t, i;

    for (t = 0; t < shoal_cfg_ntables; t++) {
        const shoal_cfg_table_t *tab = shoal_cfg_tables[t];

        printf("#\n# module %s\n#\n", tab->module);
        for (i = 0; i < tab->nfields; i++) {
            const shoal_cfg_field_t *f = &tab->fields[i];

            const char *src = shoal_cfg_source(f);
            /* Fed back as SHOAL_CONF_FILE, a default or derived value as an assignment would
             * pin it (no more derivation from the machine), and a secret's "<set>" would be
             * taken as its value: those are comments. */
            int live = !(f->flags & SHOAL_CFG_F_SECRET) && strcmp(src, "default") != 0 &&
                       strcmp(src, "derived") != 0;

            shoal_cfg_format_value(f, shoal_info_field_src(tab, f), value, sizeof(value));
            printf("# %s\n# default: %s'%s', set by: %s\n%sSHOAL_%s=%s\n", f->doc,
                   (f->flags & SHOAL_CFG_F_DERIVED) ? "derived (see shoal_info -t), else " : "",
                   f->dflt, src, live ? "" : "# ", f->name, value);
        }
    }
}

/* A Markdown table cell: '|' escaped, newlines flattened. */
static void shoal_info_md_cell(const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '|')
            fputs("\\|", stdout);
        else if (*s == '\n')
            fputc(' ', stdout);
        else
            fputc(*s, stdout);
    }
}

static void shoal_info_print_config_md(void)
{
    size_t t, i;

    printf("| Variable | Default | Meaning |\n");
    printf("|---|---|---|\n");
    for (t = 0; t < shoal_cfg_ntables; t++) {
        const shoal_cfg_table_t *tab = shoal_cfg_tables[t];

        for (i = 0; i < tab->nfields; i++) {
            const shoal_cfg_field_t *f = &tab->fields[i];

            printf("| `SHOAL_%s` | ", f->name);
            if (f->flags & SHOAL_CFG_F_DERIVED) {
                printf("derived (see `shoal_info -t`), else `");
                shoal_info_md_cell(f->dflt);
                printf("`");
            } else if (f->dflt[0] == '\0') {
                printf("*unset*");
            } else {
                printf("`");
                shoal_info_md_cell(f->dflt);
                printf("`");
            }
            printf(" | ");
            shoal_info_md_cell(f->doc);
            printf(" |\n");
        }
    }
}

/* ---- -t: topology, ring, trees, choice per size ---------------------------------------- */

typedef struct {
    int n;
    int *host_of;
    int *socket_of;
    int *order;
    shoal_link_t intra, inter;
    int tuning_bad; /* SHOAL_TUNING_FILE is there but unusable (said on stderr) */
} shoal_info_topo_t;

/* The link kind of every channel that SHOAL_TRANSPORT forces (a job's init uses it between
 * the ranks of a host too), or -1. */
static int shoal_info_forced_kind(void)
{
    const char *name = shoal_core_config.transport;
    return name != NULL && name[0] != '\0' ? shoal_link_kind_from_name(name) : -1;
}

/* Ranks on hosts: SHOAL_TOPO_FILE, else blocks of ppn. Links: file, tuning file, defaults, of
 * the kinds a job uses: shm within a host and tcp across, or SHOAL_TRANSPORT's. */
static int shoal_info_topo_layout(shoal_info_topo_t *t, int n, int ppn)
{
    const char *path = shoal_topo_config.topo_file, *tpath = shoal_topo_config.tuning_file;
    shoal_topo_file_t tf;
    shoal_tuning_t tun;
    int tl = tpath != NULL && tpath[0] != '\0' ? shoal_tuning_load(tpath, &tun) : 0;
    int have_tun = tl == 1;
    int fk = shoal_info_forced_kind();
    int ki = fk >= 0 ? fk : SHOAL_LINK_SHM, ke = fk >= 0 ? fk : SHOAL_LINK_TCP;

    memset(&tf, 0, sizeof(tf));
    t->tuning_bad = tl < 0;
    t->intra = have_tun && tun.have[ki] ? tun.link[ki] : shoal_link_default(ki);
    t->inter = have_tun && tun.have[ke] ? tun.link[ke] : shoal_link_default(ke);
    t->n = n;
    t->host_of = calloc((size_t)n, sizeof(int));
    t->socket_of = calloc((size_t)n, sizeof(int));
    t->order = calloc((size_t)n, sizeof(int));
    if (t->host_of == NULL || t->socket_of == NULL || t->order == NULL) {
        return -1;
    }
    if (path != NULL && path[0] != '\0') {
        if (shoal_topo_file_load(path, n, &tf) != SHOAL_OK) {
            return -1;
        }
        memcpy(t->host_of, tf.host_of, sizeof(int) * (size_t)n);
        memcpy(t->socket_of, tf.socket_of, sizeof(int) * (size_t)n);
        t->intra = shoal_topo_file_link_over(t->intra, &tf.intra, tf.have_intra);
        t->inter = shoal_topo_file_link_over(t->inter, &tf.inter, tf.have_inter);
        shoal_topo_file_free(&tf);
    } else {
        for (int r = 0; r < n; r++) {
            t->host_of[r] = r / ppn;
        }
    }
    uint64_t *ids = malloc(sizeof(uint64_t) * (size_t)n);
    char (*names)[SHOAL_TOPO_HOSTNAME_MAX] = malloc(sizeof(*names) * (size_t)n);
    const char **np = malloc(sizeof(*np) * (size_t)n);
    if (ids == NULL || names == NULL || np == NULL) {
        free(ids);
        free(names);
        free(np);
        return -1;
    }
    for (int r = 0; r < n; r++) {
        ids[r] = (uint64_t)t->host_of[r];
        /* the virtual hosts' names, as the communicator gives them (SHOAL_RING_HOSTS) */
        snprintf(names[r], sizeof(names[r]), "host%d", t->host_of[r]);
        np[r] = names[r];
    }
    shoal_topo_host_index(n, ids, t->host_of);
    free(ids);
    if (shoal_topo_config.ring_order == 0) {
        shoal_topo_ring_hosts_t rh;
        shoal_topo_ring_order(n, t->host_of, t->socket_of, t->order);
        if (shoal_topo_ring_hosts_load(shoal_topo_config.ring_hosts,
                                       shoal_topo_config.ring_hosts_file, &rh) != SHOAL_OK) {
            shoal_warn(TOPO, "SHOAL_RING_HOSTS: malformed: the usual ring order");
        } else if (rh.n > 0) {
            int rc = shoal_topo_ring_order_hosts(n, t->socket_of, np, &rh, t->order);
            if (rc > 0) {
                shoal_warn(TOPO, "SHOAL_RING_HOSTS: rank %d's host %s is not in the list: the "
                           "usual ring order", rc - 1, np[rc - 1]);
            }
        }
        shoal_topo_ring_hosts_free(&rh);
        free(names);
        free(np);
    } else {
        free(names);
        free(np);
        for (int r = 0; r < n; r++) {
            t->order[r] = r;
        }
    }
    return 0;
}

static void shoal_info_print_trees(int n)
{
    shoal_tree_node_t t[2];
    printf("# double binary trees (rank: parent/children in tree 0 | tree 1)\n");
    for (int r = 0; r < n && r < 64; r++) {
        shoal_dbtree_build(n, r, t);
        printf("#   %3d: %3d / %3d %3d | %3d / %3d %3d\n", r, t[0].parent, t[0].child[0],
               t[0].child[1], t[1].parent, t[1].child[0], t[1].child[1]);
    }
}

/* Every collective of the algorithm table (src/coll/select.c), one column per row: the
 * modelled time per size and the choice; '*' marks a row with a step-wise plan (a
 * nonblocking call of it progresses beside others; the other rows run whole). */
static void shoal_info_print_choice(const shoal_coll_shape_t *s)
{
    for (int t = 0; t < SHOAL_COLL_TYPE_COUNT; t++) {
        shoal_algo_t algos[32], algo;
        shoal_coll_type_t coll;
        int stepwise, na = 0;
        char name[24];
        for (size_t i = 0; shoal_coll_table_row(i, &algo, &coll, &stepwise) && na < 32; i++) {
            if ((int)coll == t) {
                algos[na++] = algo;
            }
        }
        if (na == 0) {
            continue;
        }
        printf("# %s: modelled time (us) per algorithm ('*': step-wise plan), '-' = not "
               "applicable\n#   %10s", shoal_coll_type_name((shoal_coll_type_t)t), "bytes");
        for (int i = 0; i < na; i++) {
            for (size_t j = 0; shoal_coll_table_row(j, &algo, &coll, &stepwise); j++) {
                if ((int)coll == t && algo == algos[i]) {
                    break;
                }
            }
            snprintf(name, sizeof(name), "%s%s", shoal_algo_names[algos[i]], stepwise ? "*" : "");
            printf(" %9s", name);
        }
        printf("  choice\n");
        for (size_t b = 8; b <= ((size_t)256 << 20); b *= 4) {
            shoal_algo_t a = shoal_coll_select_shape(s, (shoal_coll_type_t)t, b,
                                                     shoal_coll_config.algo, NULL);
            printf("#   %10zu", b);
            for (int i = 0; i < na; i++) {
                double c = shoal_coll_cost(s, (shoal_coll_type_t)t, algos[i], b);
                if (c < 0) {
                    printf(" %9s", "-");
                } else {
                    printf(" %9.1f", c);
                }
            }
            printf("  %s\n", shoal_algo_names[a]);
        }
    }
}

/* The port of the first built transport that derives sizes from one (ib), if it has one. */
static int shoal_info_link(shoal_tl_link_t *link)
{
    for (size_t i = 0; i < shoal_tl_count(); i++) {
        const shoal_tl_ops_t *ops = shoal_tl_get(i);
        memset(link, 0, sizeof(*link));
        if (ops->link != NULL && ops->link(link)) {
            return 1;
        }
    }
    return 0;
}

static int shoal_info_print_topo(int n, int ppn)
{
    shoal_topo_summary_t sum;
    shoal_info_topo_t t;
    shoal_coll_shape_t shape;
    shoal_tune_t tune;
    shoal_tl_link_t link;
    const char *path = shoal_topo_config.topo_file;
    int ok;

    memset(&t, 0, sizeof(t));
    shoal_topo_discover(shoal_topo_config.topo_discovery, &sum);
    printf("# this host (%s)\n", shoal_hostname());
    shoal_topo_summary_print(&sum, stdout);
    ok = 1;
    if (n <= 0 && path != NULL && path[0] != '\0') {
        /* the ranks the file describes, as the usage says (this host's PUs were taken: 'hosts
         * 4, ppn 8' printed 2 ranks on one host) */
        shoal_topo_file_t tf;
        ok = shoal_topo_file_load(path, 1, &tf) == SHOAL_OK;
        n = ok ? SHOAL_MIN(tf.described, SHOAL_INFO_RANKS_MAX) : 0;
        if (ok) {
            shoal_topo_file_free(&tf);
        }
    }
    if (n <= 0) {
        n = SHOAL_MAX(sum.npus, 2);
    }
    if (ppn <= 0) {
        ppn = n;
    }
    ok = ok && shoal_info_topo_layout(&t, n, ppn) == 0;
    shoal_tune_resolve(shoal_topo_config.topo_discovery, shoal_info_link(&link) ? &link : NULL,
                       &tune);
    shoal_tune_print(&tune, stdout);
    if (ok) {
        /* The intra-node path needs the shm transport: a job with SHOAL_TRANSPORT=tcp on one
         * host runs rd or ring where this printed shm. */
        int fk = shoal_info_forced_kind();
        shoal_coll_shape_build(&shape, n, t.host_of, t.order, &t.intra, &t.inter,
                               (path == NULL || path[0] == '\0') &&
                                   (fk < 0 || fk == SHOAL_LINK_SHM),
                               sum.ncores);
        shoal_coll_shape_tune(&shape, &tune);
        printf("# %d ranks on %d host(s)%s%s; links: intra %.2f us %.2f GB/s (send %.2f, recv "
               "%.2f us), inter %.2f us %.3f GB/s (send %.2f, recv %.2f us)\n", n, shape.nhosts,
               path != NULL && path[0] != '\0' ? " from " : "", path != NULL ? path : "",
               t.intra.alpha_us, shoal_beta_to_gbs(t.intra.beta_us),
               shoal_link_send_us(&t.intra), shoal_link_recv_us(&t.intra), t.inter.alpha_us,
               shoal_beta_to_gbs(t.inter.beta_us), shoal_link_send_us(&t.inter),
               shoal_link_recv_us(&t.inter));
        printf("# rank: host socket\n");
        for (int r = 0; r < n && r < 64; r++) {
            printf("#   %3d: %3d %3d\n", r, t.host_of[r], t.socket_of[r]);
        }
        printf("# ring order (SHOAL_RING_ORDER=%s), crossings per host and direction %d:\n#  ",
               shoal_topo_config.ring_order == 0 ? "topo" : "rank", shape.ring_share);
        for (int i = 0; i < n && i < 64; i++) {
            printf(" %d", t.order[i]);
        }
        printf("\n");
        shoal_info_print_trees(n);
        shoal_info_print_choice(&shape);
    }
    free(t.host_of);
    free(t.socket_of);
    free(t.order);
    /* an unusable tuning file fails -t as an unusable topology file does: the job runs
     * without its figures (it said why on stderr, and exited 0) */
    return ok && !t.tuning_bad ? 0 : 1;
}

static void shoal_info_print_mark(int v)
{
    if (v < 0) {
        printf(" %8s", "-");
    } else {
        printf(" %8d", v);
    }
}

/* The pacing this process's communicators get: the hard cap and the node agent's rates page
 * for its tenant (SHOAL_QOS_RATES, %t = the tenant), with the page's rate and heartbeat. */
static void shoal_info_print_pacing(const shoal_tenant_id_t *id)
{
    const char *rates = shoal_qos_pace_config.rates, *t = id->tenant[0] ? id->tenant : "default";
    char path[512];
    size_t n = 0;
    int fd;

    printf("# pacing: cap SHOAL_QOS_RATE_MAX %zu B/s per host%s, agent rates page ",
           shoal_qos_pace_config.rate_max, shoal_qos_pace_config.rate_max ? "" : " (none)");
    if (rates == NULL || rates[0] == '\0' || strcmp(rates, "none") == 0) {
        printf("none (SHOAL_QOS_RATES)\n");
        return;
    }
    for (; *rates != '\0' && n + 1 < sizeof(path); rates++) {
        if (rates[0] == '%' && rates[1] == 't') {
            n += (size_t)snprintf(path + n, sizeof(path) - n, "%s", t);
            n = n < sizeof(path) ? n : sizeof(path) - 1;
            rates++;
        } else {
            path[n++] = *rates;
        }
    }
    path[n] = '\0';
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    void *map = fd >= 0 ? mmap(NULL, SHOAL_QOS_RATES_PAGE_BYTES, PROT_READ, MAP_SHARED, fd, 0)
                        : MAP_FAILED;
    if (fd >= 0) {
        close(fd);
    }
    if (map == MAP_FAILED) {
        printf("%s: absent (no agent: not paced by one)\n", path);
        return;
    }
    const shoal_qos_rates_page_t *pg = map;
    if (pg->magic != SHOAL_QOS_RATES_MAGIC) {
        printf("%s: not a rates page\n", path);
    } else {
        struct timespec now;
        uint64_t hb = __atomic_load_n(&pg->heartbeat_ns, __ATOMIC_ACQUIRE);
        clock_gettime(CLOCK_REALTIME, &now);
        uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
        printf("%s: %llu B/s per communicator on this host%s, updated %.1f s ago "
               "(SHOAL_QOS_RATES_TIMEOUT %d ms)\n", path,
               (unsigned long long)__atomic_load_n(&pg->rate, __ATOMIC_ACQUIRE),
               pg->rate == 0 ? " (no limit)" : "",
               hb != 0 && now_ns > hb ? (double)(now_ns - hb) * 1e-9 : 0.0,
               shoal_qos_pace_config.rates_timeout_ms);
    }
    munmap(map, SHOAL_QOS_RATES_PAGE_BYTES);
}

#if SHOAL_HAVE_VERBS
/* Per RoCE port of this host: where each class's traffic class lands (priority, lossless), from
 * the host's trust mode, DSCP map and PFC (transports/ib/ib_hostqos.c). Nothing without one. */
static void shoal_info_print_roce(int tc_fixed, int sl_fixed)
{
    const char *root = shoal_ib_config.sysfs_root;
    char dir[400], why[200];
    DIR *d;
    struct dirent *e;
    snprintf(dir, sizeof(dir), "%s/class/infiniband", root != NULL && root[0] ? root : "/sys");
    if ((d = opendir(dir)) == NULL) {
        printf("# RoCE QoS: no RDMA device (%s)\n", dir);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        shoal_ib_gid_t g;
        shoal_ib_hostqos_t hq;
        if (e->d_name[0] == '.' ||
            shoal_ib_gid_select(root, e->d_name, 1, shoal_ib_config.family,
                                shoal_ib_config.gid_index, &g, why, sizeof(why)) != SHOAL_OK) {
            continue; /* an InfiniBand port, or no RoCE v2 GID: nothing to say */
        }
        if (!shoal_ib_hostqos_read(root, e->d_name, 1, g.ndev, &hq, why, sizeof(why))) {
            printf("# RoCE QoS on %s port 1 (%s): not readable (%s)\n", e->d_name, g.ndev, why);
            continue;
        }
        printf("# RoCE QoS on %s port 1 (%s), from %s:\n", e->d_name, g.ndev, hq.source);
        for (int c = 0; c < SHOAL_QOS_NCLASSES; c++) {
            shoal_qos_marks_t m;
            shoal_ib_qos_verdict_t v;
            if (shoal_qos_marks_resolve(c, &shoal_qos_class_config, tc_fixed, sl_fixed, &m) !=
                SHOAL_OK) {
                return;
            }
            shoal_ib_hostqos_judge(&hq, m.ib_tc >= 0 ? (unsigned)m.ib_tc : shoal_ib_config.tc,
                                   m.ib_sl >= 0 ? (unsigned)m.ib_sl : shoal_ib_config.sl, &v);
            printf("#   %-10s %s\n", shoal_qos_class_name(c), v.why);
        }
    }
    closedir(d);
}
#endif

static int shoal_info_print_qos(void)
{
    shoal_tenant_id_t id;
    shoal_status_t st = shoal_tenant_id_current(NULL, &id);
    int tc_fixed = shoal_cfg_getenv("IB_TC") != NULL, sl_fixed = shoal_cfg_getenv("IB_SL") != NULL;

    if (st != SHOAL_OK) {
        printf("# QoS: the identity does not resolve: %s\n", shoal_strerror(st));
        return 1;
    }
    printf("# QoS: class %s, weight %d (%s), rate cap %zu B/s per peer connection%s\n",
           shoal_qos_class_name(id.qos_class), id.qos_weight > 0 ? id.qos_weight : 1,
           id.from_credential ? "from the credential" : "no credential: at most "
           "SHOAL_QOS_CLASS_MAX / SHOAL_QOS_WEIGHT_MAX", shoal_qos_class_config.rate_max,
           shoal_qos_class_config.rate_max == 0 ? " (none)" : "");
    printf("# %-11s %8s %8s %8s %8s %8s\n", "class", "DSCP", "IP_TOS", "SO_PRIO", "IB_TC",
           "IB_SL");
    for (int c = 0; c < SHOAL_QOS_NCLASSES; c++) {
        shoal_qos_marks_t m;
        if (shoal_qos_marks_resolve(c, &shoal_qos_class_config, tc_fixed, sl_fixed, &m) !=
            SHOAL_OK) {
            return 1;
        }
        printf("# %c%-10s", c == id.qos_class ? '*' : ' ', shoal_qos_class_name(c));
        shoal_info_print_mark(m.dscp);
        shoal_info_print_mark(m.dscp >= 0 ? m.dscp << 2 : -1);
        shoal_info_print_mark(m.priority);
        shoal_info_print_mark(m.ib_tc);
        shoal_info_print_mark(m.ib_sl);
        printf("\n");
    }
    printf("# (-: left alone; IB_TC/IB_SL -: SHOAL_IB_TC=%s / SHOAL_IB_SL=%s apply)\n",
           tc_fixed ? shoal_cfg_getenv("IB_TC") : "default",
           sl_fixed ? shoal_cfg_getenv("IB_SL") : "default");
#if SHOAL_HAVE_VERBS
    shoal_info_print_roce(tc_fixed, sl_fixed);
#endif
    shoal_info_print_pacing(&id);
    return 0;
}

/* -n N, --ppn P: 1..SHOAL_INFO_RANKS_MAX; -1 (said why) otherwise. */
static int shoal_info_parse_ranks(const char *s, const char *what, int *out_p)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 1 || v > SHOAL_INFO_RANKS_MAX) {
        fprintf(stderr, "shoal_info: %s takes 1..%d, not '%s'\n", what, SHOAL_INFO_RANKS_MAX,
                s);
        return -1;
    }
    *out_p = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {.name = "ppn", .has_arg = required_argument, .val = 'p'},
        {.name = "help", .has_arg = no_argument, .val = 'h'},
        {.name = NULL},
    };
    int opt, version = 0, built = 0, config = 0, markdown = 0, topo = 0, nranks = 0, ppn = 0;
    int qos = 0, bad = 0;

    /* getopt says what is wrong with an option, in its own words and the option's text */
    while ((opt = getopt_long(argc, argv, "vbcmhqtn:p:", longopts, NULL)) != -1) {
        switch (opt) {
        case 't': topo = 1; break;
        case 'q': qos = 1; break;
        case 'n': bad = shoal_info_parse_ranks(optarg, "-n", &nranks); break;
        case 'p': bad = shoal_info_parse_ranks(optarg, "--ppn", &ppn); break;
        case 'v': version = 1; break;
        case 'b': built = 1; break;
        case 'c': config = 1; break;
        case 'm': markdown = 1; break;
        case 'h':
            shoal_info_usage(stdout);
            return 0;
        default: bad = -1; break;
        }
        if (bad != 0) {
            shoal_info_usage(stderr);
            return 2;
        }
    }
    if (optind < argc || (markdown && !config) || ((nranks != 0 || ppn != 0) && !topo)) {
        fprintf(stderr, "shoal_info: %s\n",
                optind < argc        ? "unexpected argument"
                : markdown && !config ? "-m goes with -c"
                                      : "-n and --ppn go with -t");
        shoal_info_usage(stderr);
        return 2;
    }
    if (!version && !built && !config && !topo && !qos)
        version = 1;
    shoal_config_global_init();
    if (version)
        shoal_info_print_version();
    if (built)
        shoal_info_print_built();
    if (config && markdown)
        shoal_info_print_config_md();
    else if (config)
        shoal_info_print_config();
    if (topo && shoal_info_print_topo(nranks, ppn) != 0)
        return 1;
    if (qos && shoal_info_print_qos() != 0)
        return 1;
    /* ferror too: output larger than stdio's buffer (-c, 34 kB) went out in earlier writes,
     * whose failure (a full disk, /dev/full) left nothing for fflush to fail on: exit 0 */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "shoal_info: writing to stdout failed\n");
        return 1;
    }
    return 0;
}
