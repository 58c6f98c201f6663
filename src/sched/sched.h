/*
 * src/sched: placement of tenants' jobs on a GPU cluster (DESIGN.md section 7), the library
 * behind shoal-place. Plain data and pure functions: it reads the cluster as Slurm describes it
 * (slurm.conf node lines, topology.conf tree, hostlist expressions), the running allocations
 * and the queue, and decides where each queued job's ranks go, which spot jobs are preempted,
 * and the ring order; it moves no bytes of a job and links nothing of the communicator.
 *
 *   hostlist.c        Slurm hostlist expressions (expand, ranged string)
 *   sched_parse.c     slurm.conf, topology.conf, the jobs file
 *   sched_model.c     the cluster tree, free capacity, the cost of a placement
 *   sched_drf.c       weighted dominant-resource fairness (which tenant is served next)
 *   sched_place.c     gang placement on the tree (fewest switch levels, then best fit)
 *   sched_preempt.c   the smallest set of spot victims, never a cycle
 *   sched_plan.c      one planning round: DRF order, place, preempt, explain
 *   sched_output.c    what launchers take: node list, SLURM_HOSTFILE, Open MPI files, ...
 *   sched_sim.c       shoal-place simulate: a seeded trace replayed against three policies
 *   sched_hwloc.c     one host's CPUs, memory, GPUs and NICs from hwloc XML (with hwloc)
 *   sched_usage.c     past usage from the metering ledger (shoal-bill usage --csv), decayed
 */
#ifndef SHOAL_SCHED_H
#define SHOAL_SCHED_H

#include "util/util.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* ---- hostlist (hostlist.c) ------------------------------------------------------------- */

#define SHOAL_HOSTLIST_MAX (1 << 20)

typedef struct {
    char *prefix;
    unsigned long lo, hi; /* numbers, when !single */
    int width;            /* zero padding */
    int single;           /* a name without a number: prefix is the name */
} shoal_hostrange_t;

typedef struct {
    shoal_hostrange_t *ranges;
    int nranges, cap;
    size_t nhosts;
    /* shoal_hostlist_nth's cursor: range it_range starts at host it_base (ranges are only
     * appended, so it stays true); walking the list in order costs O(hosts), not O(hosts x
     * ranges) (a fuzzer found "a[1-216]b[1-316]c[1-3]" taking minutes) */
    int it_range;
    size_t it_base;
} shoal_hostlist_t;

/* Appends the hosts of expr to hl (zero-initialised before the first call). On a malformed
 * expression logs it and returns SHOAL_ERR_INVALID_ARG (hl may hold the hosts before it). */
SHOAL_HIDDEN shoal_status_t shoal_hostlist_parse(const char *expr, shoal_hostlist_t *hl);
SHOAL_HIDDEN shoal_status_t shoal_hostlist_push_host(shoal_hostlist_t *hl, const char *host);
/* The n-th host into buf; its length, or -1 when n is past the end or buf too small. */
SHOAL_HIDDEN int shoal_hostlist_nth(const shoal_hostlist_t *hl, size_t n, char *buf,
                                    size_t size);
/* Slurm's ranged string (malloc'd; NULL when out of memory). */
SHOAL_HIDDEN char *shoal_hostlist_ranged(const shoal_hostlist_t *hl);
SHOAL_HIDDEN void shoal_hostlist_free(shoal_hostlist_t *hl);

/* ---- the cluster (sched_model.c) --------------------------------------------------------- */

#define SHOAL_SCHED_NAME_MAX 64
#define SHOAL_SCHED_GPU_MAX 64 /* GPUs per node (a bit mask) */
#define SHOAL_SCHED_NODES_MAX (1 << 16) /* nodes per cluster: above the largest Slurm clusters */
#define SHOAL_SCHED_LEVELS_MAX 64 /* switch levels, a made-up root included: real trees
                                  * have a handful */
#define SHOAL_SCHED_RES 3      /* resources: GPUs, CPUs, memory */
enum { SHOAL_SCHED_GPU = 0, SHOAL_SCHED_CPU = 1, SHOAL_SCHED_MEM = 2 };

typedef struct {
    char name[SHOAL_SCHED_NAME_MAX];
    int cpus, gpus;
    long mem_mb;
    int leaf;          /* switch index of its leaf */
    int order;         /* position in the tree's depth-first order (the ring order) */
    uint64_t gpu_used; /* bit g: GPU g is allocated (change it with shoal_sched_node_gpu_set) */
    int gpus_busy;     /* bits set in gpu_used */
    int cpus_used;
    long mem_used;
    int down;          /* slurm.conf: DOWN, DRAIN, FAIL or FAILING: no new job goes there */
} shoal_sched_node_t;

typedef struct {
    char name[SHOAL_SCHED_NAME_MAX];
    int parent;   /* -1: the root */
    int level;    /* 1: has nodes only; a parent is one above its highest child */
    int *kids;    /* child switches */
    int nkids;
    int *nodes;   /* nodes attached directly */
    int nnodes;
    int virt;     /* made up: a root above several trees, or a leaf for unlisted nodes */
} shoal_sched_switch_t;

/* An index of the names of an append-only array (nodes, switches, tenants, jobs): open
 * addressing, item + 1 per slot (0 empty); the names stay in the array, read through
 * name(base, i), since the array moves when it grows. Lookups by a linear scan made a 16k-switch
 * topology.conf take seconds and a 50k-job file minutes. */
typedef const char *(*shoal_sched_name_fn)(const void *base, int i);
typedef struct {
    int *slot;
    int nslots;        /* a power of two, at least twice n */
    int n;             /* items 0..n-1 are indexed */
} shoal_sched_index_t;

#define SHOAL_SCHED_TOP_WAYS 8
struct shoal_sched_top_memo {
    unsigned epoch, ver;
    int k, level;
    int top;          /* switch, or -1: none at that level has room */
    int order;        /* of its placement's first host */
    double cost;      /* of its placement's ring */
};

typedef struct {
    shoal_sched_node_t *nodes;
    int nnodes, nodes_cap;
    shoal_sched_index_t node_ix;
    shoal_sched_switch_t *sw;
    int nsw, sw_cap;
    shoal_sched_index_t sw_ix;
    int root;
    int maxlevel;
    double total[SHOAL_SCHED_RES]; /* capacity per resource */
    double uplink_cost;            /* cost of a hop above the leaf level (leaf hop: 1) */
    int free_gpus;                 /* GPUs not allocated, the whole cluster */
    /* scratch for placement, sized to the tree */
    int *cap;      /* ranks a node (index < nnodes) or switch (nnodes + s) could take */
    int *take;     /* ranks taken per node by the placement being built */
    /* Kept between jobs (sched_place.c), so that a job costs the nodes that changed since the
     * last one, not the whole cluster: cap[] (and the largest room of one node under each
     * switch) hold what they held for the last job's per-rank CPUs and memory; the nodes
     * shoal_sched_node_gpu_set touched since are in dirty[] (every change to a node's GPUs,
     * CPUs or memory goes with a call of it). Per switch and k <= gpus_max, the host a job
     * of k ranks that fits one host would take under it, valid while ver and epoch hold. */
    struct {
        int valid, cpus;
        long mem_mb;
        int *node_max;      /* per switch: at least the largest cap[] of a node under it */
        int *dirty, ndirty;
        char *is_dirty;
        unsigned *ver;      /* per switch: bumped when a cap[] under it changes */
        unsigned epoch;     /* bumped when cap[] is computed whole */
        int gpus_max;       /* GPUs of the largest node */
        int *one_node;      /* [s * (gpus_max + 1) + k]: the host, or -1 */
        unsigned *one_ver, *one_epoch;
        /* per switch, a few (k, level) pairs: the best top at that level under it */
        struct shoal_sched_top_memo *top;
        int *buf;           /* two best-so-far placements: 3 x nnodes each */
        char *leaf_buf;     /* and their leaf marks: nsw + 1 each */
        int exhaustive;     /* tests: every host and switch is tried, as before the memos */
    } room;
} shoal_sched_cluster_t;

/* ---- jobs and tenants -------------------------------------------------------------------- */

enum { SHOAL_SCHED_RESERVED = 0, SHOAL_SCHED_SPOT = 1 };
enum { SHOAL_SCHED_QUEUED = 0, SHOAL_SCHED_RUNNING = 1 };

typedef struct {
    char name[SHOAL_SCHED_NAME_MAX];
    int tenant;            /* index into the tenants */
    int ranks;             /* one GPU each */
    int cpus;              /* per rank */
    long mem_mb;           /* per rank */
    int cls;               /* SHOAL_SCHED_RESERVED / SPOT */
    int state;             /* SHOAL_SCHED_QUEUED / RUNNING */
    char signal[16];       /* checkpoint signal a preempted job gets (USR1) */
    int grace_s;           /* seconds between the signal and the kill */
    int seq;               /* input order */
    int fresh;             /* started in the current round: not a preemption victim */
    /* the allocation (running jobs): per rank, node and GPU; ranks in ring order */
    int *node_of;
    int *gpu_of;
    /* simulation */
    double submit, duration, start, done_work;
} shoal_sched_job_t;

typedef struct {
    char name[SHOAL_SCHED_NAME_MAX];
    double weight;
    double use[SHOAL_SCHED_RES];
    /* past usage (sched_usage.c): decayed GPU-seconds from the ledger, and the same as a share
     * of the cluster's GPU-time over one half-life, added to the dominant share in the order
     * of service only (never to the hard state, never to preemption's no-cycle rule) */
    double past_gpu_s;
    double past;
} shoal_sched_tenant_t;

typedef struct {
    shoal_sched_job_t *jobs;
    int njobs, jobs_cap;
    shoal_sched_tenant_t *tenants;
    int ntenants, tenants_cap;
    shoal_sched_index_t tenant_ix;
} shoal_sched_queue_t;

/* ---- parsing (sched_parse.c) ------------------------------------------------------------
 * Errors name the source and line ("slurm.conf:12: ...") and return SHOAL_ERR_INVALID_ARG. */
SHOAL_HIDDEN shoal_status_t shoal_sched_slurm_conf_parse(const char *text, const char *src,
                                                         shoal_sched_cluster_t *c);
SHOAL_HIDDEN shoal_status_t shoal_sched_topology_parse(const char *text, const char *src,
                                                       shoal_sched_cluster_t *c);
/* The jobs file (README "Running shoal for tenants"): one job or tenant per line. */
SHOAL_HIDDEN shoal_status_t shoal_sched_jobs_parse(const char *text, const char *src,
                                                   shoal_sched_cluster_t *c,
                                                   shoal_sched_queue_t *q);
SHOAL_HIDDEN shoal_status_t shoal_sched_read_file(const char *path, char **text_p);

/* One host from an hwloc XML file (sched_hwloc.c, built with hwloc): adds the node NAME, or
 * replaces what slurm.conf said of it, with the file's PUs, memory and GPUs; summary (if set)
 * gets a line naming the GPUs and NICs found. */
SHOAL_HIDDEN shoal_status_t shoal_sched_hwloc_node(shoal_sched_cluster_t *c, const char *name,
                                                   const char *path, char *summary,
                                                   size_t size);

/* ---- model (sched_model.c) --------------------------------------------------------------- */
/* The item named name, or -1. */
SHOAL_HIDDEN int shoal_sched_index_find(const shoal_sched_index_t *ix, const char *name,
                                        shoal_sched_name_fn fn, const void *base);
/* Indexes item ix->n (its name already in the array). */
SHOAL_HIDDEN shoal_status_t shoal_sched_index_add(shoal_sched_index_t *ix, shoal_sched_name_fn fn,
                                                  const void *base);
SHOAL_HIDDEN void shoal_sched_index_free(shoal_sched_index_t *ix);
SHOAL_HIDDEN int shoal_sched_node_find(const shoal_sched_cluster_t *c, const char *name);
SHOAL_HIDDEN shoal_status_t shoal_sched_node_add(shoal_sched_cluster_t *c, const char *name,
                                                 int cpus, long mem_mb, int gpus);
SHOAL_HIDDEN int shoal_sched_switch_find(const shoal_sched_cluster_t *c, const char *name);
SHOAL_HIDDEN int shoal_sched_switch_add(shoal_sched_cluster_t *c, const char *name);
/* Appends v to the int array *arr of *n entries (grown geometrically); -1 without memory. */
SHOAL_HIDDEN int shoal_sched_list_add(int **arr, int *n, int v);
/* After parsing: links the tree (a virtual root above several trees, a virtual leaf for
 * nodes no switch lists), levels, depth-first order, totals, scratch. */
SHOAL_HIDDEN shoal_status_t shoal_sched_cluster_finish(shoal_sched_cluster_t *c);
SHOAL_HIDDEN void shoal_sched_cluster_free(shoal_sched_cluster_t *c);
/* Placement's kept view of room (c->room), sized to the tree; called by cluster_finish. */
SHOAL_HIDDEN shoal_status_t shoal_sched_room_alloc(shoal_sched_cluster_t *c);
SHOAL_HIDDEN void shoal_sched_room_free(shoal_sched_cluster_t *c);
SHOAL_HIDDEN void shoal_sched_queue_free(shoal_sched_queue_t *q);
SHOAL_HIDDEN int shoal_sched_tenant_get(shoal_sched_queue_t *q, const char *name);
/* The tenant named name, or -1 (none is added). */
SHOAL_HIDDEN int shoal_sched_tenant_find(const shoal_sched_queue_t *q, const char *name);
SHOAL_HIDDEN shoal_sched_job_t *shoal_sched_job_new(shoal_sched_queue_t *q);

/* Level of the lowest switch above both nodes (0: the same node). */
SHOAL_HIDDEN int shoal_sched_lca_level(const shoal_sched_cluster_t *c, int a, int b);
/* Cost of a ring over these nodes (distinct, any order; sorted here into tree order): per
 * ring edge, 1 inside a leaf, 1 + 2 (L - 1) uplink_cost through a switch of level L. */
SHOAL_HIDDEN double shoal_sched_ring_cost(const shoal_sched_cluster_t *c, int *nodes, int n);
/* Marks GPU g of node n busy or free, keeping the counters. */
SHOAL_HIDDEN void shoal_sched_node_gpu_set(shoal_sched_cluster_t *c, int n, int g, int busy);
/* Ranks a node could still take for this per-rank demand (0 on a node that is down). */
SHOAL_HIDDEN int shoal_sched_node_cap(const shoal_sched_cluster_t *c, int node, int cpus,
                                      long mem_mb);
/* The same, down or not: the room a running job of the jobs file takes there. */
SHOAL_HIDDEN int shoal_sched_node_room(const shoal_sched_cluster_t *c, int node, int cpus,
                                       long mem_mb);
/* Allocate / release a job's resources (node_of and gpu_of of all ranks set). */
SHOAL_HIDDEN void shoal_sched_job_apply(shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                                        shoal_sched_job_t *j);
SHOAL_HIDDEN void shoal_sched_job_release(shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                                          shoal_sched_job_t *j);
/* A job's demand vector (all ranks). */
SHOAL_HIDDEN void shoal_sched_job_demand(const shoal_sched_job_t *j, double d[SHOAL_SCHED_RES]);

/* ---- weighted DRF (sched_drf.c) ----------------------------------------------------------- */
/* max over resources of use / total, divided by the weight. */
SHOAL_HIDDEN double shoal_sched_drf_share(const double use[SHOAL_SCHED_RES],
                                          const double total[SHOAL_SCHED_RES], double weight);
/* Progressive filling: serves tenants in order of lowest weighted dominant share (use[t] /
 * total, over weight[t]). next(ctx, t): 1 if tenant t has a task waiting; try(ctx, t): 1 if
 * that task was started, 0 if it cannot run now (the tenant is done for this round). try adds
 * the task's demand to use[t] (and any other change it made, e.g. a preemption, to the other
 * rows, which moved then names). Ties go to the lower tenant index. Returns the number of
 * tasks started, -1 when out of memory. */
typedef int (*shoal_sched_drf_next_cb_t)(void *ctx, int tenant);
typedef int (*shoal_sched_drf_try_cb_t)(void *ctx, int tenant);
/* After a task of tenant t started: the rows other than t that its try changed (the tenants
 * of a preemption's victims), their count and the rows in *rows_p (duplicates allowed). A key
 * is computed again only for the rows named: a row changed and not named keeps its old place
 * in the order. */
typedef int (*shoal_sched_drf_moved_cb_t)(void *ctx, const int **rows_p);
typedef struct {
    shoal_sched_drf_next_cb_t next;
    shoal_sched_drf_try_cb_t try_start;
    shoal_sched_drf_moved_cb_t moved; /* NULL: try changes row t only */
    int scan; /* tests: every tenant's key scanned per task (O(tenants^2)), as before the heap */
} shoal_sched_drf_cbs_t;
SHOAL_HIDDEN int shoal_sched_drf_fill(int ntenants, double (*use)[SHOAL_SCHED_RES],
                                      const double *weight,
                                      const double total[SHOAL_SCHED_RES],
                                      shoal_sched_drf_next_cb_t next,
                                      shoal_sched_drf_try_cb_t try_start, void *ctx);
/* The same with past usage: tenant t is served in order of (dominant share + past[t]) over
 * its weight (past NULL: none); use[] is unchanged. O(log tenants) per task (a heap). */
SHOAL_HIDDEN double shoal_sched_drf_key(const double use[SHOAL_SCHED_RES],
                                        const double total[SHOAL_SCHED_RES], double weight,
                                        double past);
SHOAL_HIDDEN int shoal_sched_drf_fill_past(int ntenants, double (*use)[SHOAL_SCHED_RES],
                                           const double *weight, const double *past,
                                           const double total[SHOAL_SCHED_RES],
                                           const shoal_sched_drf_cbs_t *cb, void *ctx);

/* ---- past usage (sched_usage.c) ----------------------------------------------------------
 * The CSV that `shoal-bill usage --csv` prints (a header naming the columns; tenant and
 * gpu_seconds are used, the others ignored), or a plain one of `tenant,gpu_seconds`. An
 * optional column end (unix seconds, the end of the period the row covers) or age_seconds
 * decays the row by 2^(-age / half_life) (Slurm's PriorityDecayHalfLife); rows without one
 * count as they are. Each tenant's decayed GPU-seconds go to past_gpu_s, and past = past_gpu_s
 * / (cluster GPUs x half_life): the share of the cluster's GPU-time it used over one
 * half-life. Tenants the jobs file does not name are counted in unknown and named in note. */
#define SHOAL_SCHED_USAGE_HALF_LIFE_DEFAULT (7.0 * 86400.0)
typedef struct {
    double half_life;   /* seconds, > 0 */
    double now;         /* unix seconds, for the end column */
    int rows;           /* rows read */
    int decayed;        /* rows with a time column */
    int unknown;        /* rows of tenants not in the queue */
    char note[512];     /* the unknown tenants, for --explain */
} shoal_sched_usage_t;
/* 2^(-age / half_life); 1 for age <= 0. */
SHOAL_HIDDEN double shoal_sched_usage_decay(double age, double half_life);
SHOAL_HIDDEN shoal_status_t shoal_sched_usage_parse(const char *text, const char *src,
                                                    const shoal_sched_cluster_t *c,
                                                    shoal_sched_queue_t *q,
                                                    shoal_sched_usage_t *u);
/* --explain: each tenant's past usage and the order of service at the start of the round
 * with and without it (tenants with queued jobs). */
SHOAL_HIDDEN void shoal_sched_usage_explain(const shoal_sched_cluster_t *c,
                                            const shoal_sched_queue_t *q,
                                            const shoal_sched_usage_t *u, FILE *fp);

/* ---- placement (sched_place.c) ------------------------------------------------------------ */
typedef struct {
    int level;          /* switch level spanned (0: one node) */
    int top;            /* the switch (or node, level 0) it stays under */
    int nhosts;
    double cost;        /* shoal_sched_ring_cost of its hosts */
    int free_under_top; /* ranks the subtree could take before (best fit: smallest) */
} shoal_sched_place_info_t;

/* Places all ranks of j or none: sets j->node_of/gpu_of (not applied to the cluster).
 * 1 placed, 0 does not fit, negative status on error. */
SHOAL_HIDDEN int shoal_sched_place(shoal_sched_cluster_t *c, shoal_sched_job_t *j,
                                   shoal_sched_place_info_t *info);
/* The baselines of the simulation: first fit in node order, and Slurm-like tree best fit
 * (the lowest switch with enough free GPUs, the fullest nodes first under it). */
SHOAL_HIDDEN int shoal_sched_place_first_fit(shoal_sched_cluster_t *c, shoal_sched_job_t *j);
SHOAL_HIDDEN int shoal_sched_place_slurm_tree(shoal_sched_cluster_t *c, shoal_sched_job_t *j);
/* The info of j's placement by a baseline (node_of set, not applied yet: cap[] still as that
 * placement computed it): hosts, ring cost, the lowest switch above them (or the host) and the
 * ranks of j it could take. 1, or SHOAL_ERR_NO_MEMORY. */
SHOAL_HIDDEN int shoal_sched_place_describe(shoal_sched_cluster_t *c, const shoal_sched_job_t *j,
                                            shoal_sched_place_info_t *info);
/* Largest gang one leaf switch could still take (the fragmentation measure). */
SHOAL_HIDDEN int shoal_sched_largest_gang(shoal_sched_cluster_t *c);

/* ---- preemption (sched_preempt.c) --------------------------------------------------------- */
typedef struct {
    int nvictims;
    int *victims; /* job indices, malloc'd (shoal_sched_preempt_free; a plan's: plan_free): a
                   * fixed 64 left a reserved job that needed more spot jobs pending */
    int exact;    /* the count was proven minimal */
} shoal_sched_preempt_t;
/* For queued reserved job ji that does not fit: the smallest set of running spot jobs whose
 * removal lets it fit, such that each victim tenant's weighted dominant share after the
 * preemption stays above the preemptor's (or, where the preemptor runs no spot job that is
 * not fresh, was above it before). 1 found (victims released, ji placed and applied), 0
 * none. */
SHOAL_HIDDEN int shoal_sched_preempt(shoal_sched_cluster_t *c, shoal_sched_queue_t *q, int ji,
                                     shoal_sched_preempt_t *out,
                                     shoal_sched_place_info_t *info);
/* The same with the candidates drawn from the npool jobs of pool (indices) only: a planning
 * round passes the spot jobs running when it began, since the jobs it starts are fresh; a
 * look at every job of the queue per reserved job that did not fit made a round O(tenants x
 * jobs). */
SHOAL_HIDDEN int shoal_sched_preempt_among(shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                                           int ji, const int *pool, int npool,
                                           shoal_sched_preempt_t *out,
                                           shoal_sched_place_info_t *info);
SHOAL_HIDDEN void shoal_sched_preempt_free(shoal_sched_preempt_t *p);

/* ---- a planning round (sched_plan.c) ------------------------------------------------------ */
enum { SHOAL_SCHED_POLICY_SHOAL = 0, SHOAL_SCHED_POLICY_FIRST_FIT, SHOAL_SCHED_POLICY_SLURM };

typedef struct {
    int job;                  /* index */
    int placed;               /* 1 placed, 0 pending */
    int preempted_by;         /* for victims: the job index that preempted it, else -1 */
    shoal_sched_place_info_t info;
    shoal_sched_preempt_t pre;
    double share_before, share_after; /* the tenant's weighted dominant share */
    char why[640];
} shoal_sched_decision_t;

typedef struct {
    shoal_sched_decision_t *d;
    int n, cap;
} shoal_sched_plan_t;

typedef struct {
    int policy;      /* SHOAL_SCHED_POLICY_* */
    int preempt;     /* allow preemption of spot jobs */
    int scan_all;    /* tests: the round as before its indexes: DRF scans every tenant per
                      * job (shoal_sched_drf_cbs_t), preemption looks at every job */
} shoal_sched_opts_t;

/* One round over the queue: every queued job either placed (applied to the cluster, state
 * RUNNING) or left pending with the reason; victims are released and become QUEUED again. */
SHOAL_HIDDEN shoal_status_t shoal_sched_plan_round(shoal_sched_cluster_t *c,
                                                   shoal_sched_queue_t *q,
                                                   const shoal_sched_opts_t *o,
                                                   shoal_sched_plan_t *plan);
SHOAL_HIDDEN void shoal_sched_plan_free(shoal_sched_plan_t *plan);

/* ---- output (sched_output.c) --------------------------------------------------------------- */
enum {
    SHOAL_SCHED_OUT_NODELIST = 0, /* hostlist form, for sbatch/srun --nodelist */
    SHOAL_SCHED_OUT_SLURM_HOSTFILE, /* one host per task, for srun -m arbitrary */
    SHOAL_SCHED_OUT_OMPI_HOSTFILE,  /* host slots=N */
    SHOAL_SCHED_OUT_RANKFILE,       /* rank R=host slot=A-B */
    SHOAL_SCHED_OUT_GPUS,           /* rank host CUDA_VISIBLE_DEVICES=g */
    SHOAL_SCHED_OUT_RING,           /* hosts in ring order, one a line (SHOAL_RING_HOSTS_FILE) */
    SHOAL_SCHED_OUT_KINDS
};
extern SHOAL_HIDDEN const char *const shoal_sched_out_names[];
SHOAL_HIDDEN int shoal_sched_out_kind(const char *name);
SHOAL_HIDDEN shoal_status_t shoal_sched_output(const shoal_sched_cluster_t *c,
                                               const shoal_sched_job_t *j, int kind, FILE *fp);
/* Writes DIR/<job>.<kind> for every kind. */
SHOAL_HIDDEN shoal_status_t shoal_sched_output_dir(const shoal_sched_cluster_t *c,
                                                   const shoal_sched_job_t *j, const char *dir);
SHOAL_HIDDEN void shoal_sched_plan_print(const shoal_sched_cluster_t *c,
                                         const shoal_sched_queue_t *q,
                                         const shoal_sched_plan_t *p, int explain, FILE *fp);

/* ---- simulation (sched_sim.c) -------------------------------------------------------------- */
typedef struct {
    uint64_t seed;
    int njobs;
    int ntenants;
    int leaves, hosts_per_leaf, gpus_per_host;
    double load;         /* offered load: GPU-hours asked / GPU-hours available */
    int no_preempt;      /* shoal's policy without preemption */
    const char *outdir;  /* table, data and PNG plots; NULL: table to stdout only */
} shoal_sched_sim_opts_t;

typedef struct {
    double mean_jct, p95_jct;      /* job completion time (submit to end), hours */
    double utilization;            /* busy GPU-hours / available, until the last arrival */
    double mean_largest_gang;      /* fragmentation: largest gang one leaf could take */
    double cross_traffic;          /* ring edges through the spine x hours */
    double fairness;               /* mean Jain index of backlogged tenants' weighted shares */
    double makespan;
    int preemptions;
} shoal_sched_sim_result_t;

SHOAL_HIDDEN shoal_status_t shoal_sched_simulate(const shoal_sched_sim_opts_t *o, int policy,
                                                 shoal_sched_sim_result_t *r, FILE *series);
SHOAL_HIDDEN shoal_status_t shoal_sched_simulate_all(const shoal_sched_sim_opts_t *o, FILE *out);

/* A small deterministic generator (splitmix64), shared by the simulation and the tests. */
static inline uint64_t shoal_sched_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static inline double shoal_sched_rand01(uint64_t *s)
{
    return (double)(shoal_sched_rand(s) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
