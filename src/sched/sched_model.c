/* The cluster tree, free capacity, allocation of a job, the cost of a placement. */
#include "sched/sched.h"

#include <stdlib.h>
#include <string.h>

#define SHOAL_SCHED_UPLINK_COST_DEFAULT 4.0

static size_t shoal_sched_name_hash(const char *name)
{
    return (size_t)shoal_hash64(name, strlen(name), 0x6e6f6465ULL);
}

int shoal_sched_index_find(const shoal_sched_index_t *ix, const char *name,
                           shoal_sched_name_fn fn, const void *base)
{
    if (ix->nslots == 0) {
        return -1;
    }
    for (size_t i = shoal_sched_name_hash(name) & (size_t)(ix->nslots - 1);;
         i = (i + 1) & (size_t)(ix->nslots - 1)) {
        int n = ix->slot[i] - 1;
        if (n < 0 || strcmp(fn(base, n), name) == 0) {
            return n;
        }
    }
}

static void shoal_sched_index_put(shoal_sched_index_t *ix, const char *name, int item)
{
    size_t i = shoal_sched_name_hash(name) & (size_t)(ix->nslots - 1);
    while (ix->slot[i] != 0) {
        i = (i + 1) & (size_t)(ix->nslots - 1);
    }
    ix->slot[i] = item + 1;
}

shoal_status_t shoal_sched_index_add(shoal_sched_index_t *ix, shoal_sched_name_fn fn,
                                     const void *base)
{
    if (2 * (ix->n + 1) > ix->nslots) {
        int slots = ix->nslots == 0 ? 16 : 2 * ix->nslots;
        int *slot = calloc((size_t)slots, sizeof(int));
        if (slot == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
        free(ix->slot);
        ix->slot = slot;
        ix->nslots = slots;
        for (int k = 0; k < ix->n; k++) {
            shoal_sched_index_put(ix, fn(base, k), k);
        }
    }
    shoal_sched_index_put(ix, fn(base, ix->n), ix->n);
    ix->n++;
    return SHOAL_OK;
}

void shoal_sched_index_free(shoal_sched_index_t *ix)
{
    free(ix->slot);
    memset(ix, 0, sizeof(*ix));
}

static const char *shoal_sched_node_name(const void *base, int i)
{
    return ((const shoal_sched_node_t *)base)[i].name;
}

static const char *shoal_sched_switch_name(const void *base, int i)
{
    return ((const shoal_sched_switch_t *)base)[i].name;
}

static const char *shoal_sched_tenant_name(const void *base, int i)
{
    return ((const shoal_sched_tenant_t *)base)[i].name;
}

int shoal_sched_node_find(const shoal_sched_cluster_t *c, const char *name)
{
    return shoal_sched_index_find(&c->node_ix, name, shoal_sched_node_name, c->nodes);
}

shoal_status_t shoal_sched_node_add(shoal_sched_cluster_t *c, const char *name, int cpus,
                                    long mem_mb, int gpus)
{
    if (strlen(name) >= SHOAL_SCHED_NAME_MAX || gpus < 0 || gpus > SHOAL_SCHED_GPU_MAX ||
        cpus < 0 || mem_mb < 0) {
        shoal_error(SCHED, "node %s: name longer than %d, or GPUs outside 0..%d", name,
                    SHOAL_SCHED_NAME_MAX - 1, SHOAL_SCHED_GPU_MAX);
        return SHOAL_ERR_INVALID_ARG;
    }
    int at = shoal_sched_node_find(c, name);
    if (at < 0) {
        if (c->nnodes >= SHOAL_SCHED_NODES_MAX) {
            shoal_error(SCHED, "node %s: more than %d nodes in the cluster", name,
                        SHOAL_SCHED_NODES_MAX);
            return SHOAL_ERR_INVALID_ARG;
        }
        if (c->nnodes == c->nodes_cap) {
            int cap = c->nodes_cap == 0 ? 16 : 2 * c->nodes_cap;
            shoal_sched_node_t *n = realloc(c->nodes, sizeof(*n) * (size_t)cap);
            if (n == NULL) {
                return SHOAL_ERR_NO_MEMORY;
            }
            c->nodes = n;
            c->nodes_cap = cap;
        }
        at = c->nnodes;
        memset(&c->nodes[at], 0, sizeof(c->nodes[at]));
        strcpy(c->nodes[at].name, name);
        SHOAL_CHECK(shoal_sched_index_add(&c->node_ix, shoal_sched_node_name, c->nodes));
        c->nnodes++;
    }
    shoal_sched_node_t *n = &c->nodes[at];
    memset(n, 0, sizeof(*n));
    strcpy(n->name, name);
    n->cpus = cpus;
    n->gpus = gpus;
    n->mem_mb = mem_mb;
    n->leaf = -1;
    return SHOAL_OK;
}

int shoal_sched_switch_find(const shoal_sched_cluster_t *c, const char *name)
{
    return shoal_sched_index_find(&c->sw_ix, name, shoal_sched_switch_name, c->sw);
}

int shoal_sched_switch_add(shoal_sched_cluster_t *c, const char *name)
{
    int at = shoal_sched_switch_find(c, name);
    if (at >= 0) {
        return at;
    }
    if (strlen(name) >= SHOAL_SCHED_NAME_MAX) {
        shoal_error(SCHED, "switch name '%s' longer than %d", name, SHOAL_SCHED_NAME_MAX - 1);
        return -1;
    }
    if (c->nsw == c->sw_cap) {
        int cap = c->sw_cap == 0 ? 8 : 2 * c->sw_cap;
        shoal_sched_switch_t *s = realloc(c->sw, sizeof(*s) * (size_t)cap);
        if (s == NULL) {
            return -1;
        }
        c->sw = s;
        c->sw_cap = cap;
    }
    shoal_sched_switch_t *s = &c->sw[c->nsw];
    memset(s, 0, sizeof(*s));
    strcpy(s->name, name);
    s->parent = -1;
    if (shoal_sched_index_add(&c->sw_ix, shoal_sched_switch_name, c->sw) != SHOAL_OK) {
        return -1;
    }
    return c->nsw++;
}

/* Appends v; the capacity is implied by *n (the next power of two, at least 4), so the array
 * grows geometrically: growing by one per add copied 7 GB for a 60k-node partition. */
int shoal_sched_list_add(int **arr, int *n, int v)
{
    if (*n < 4 ? *n == 0 : (*n & (*n - 1)) == 0) {
        int *a = realloc(*arr, sizeof(int) * (size_t)(*n < 4 ? 4 : 2 * *n));
        if (a == NULL) {
            return -1;
        }
        *arr = a;
    }
    (*arr)[(*n)++] = v;
    return 0;
}

/* Levels bottom-up and the depth-first order of the nodes; -1 on a cycle. */
static int shoal_sched_tree_walk(shoal_sched_cluster_t *c, int s, int depth, int *order)
{
    shoal_sched_switch_t *sw = &c->sw[s];
    int level = 1;

    if (depth > c->nsw) {
        return -1;
    }
    for (int i = 0; i < sw->nnodes; i++) {
        c->nodes[sw->nodes[i]].order = (*order)++;
    }
    for (int i = 0; i < sw->nkids; i++) {
        int l = shoal_sched_tree_walk(c, sw->kids[i], depth + 1, order);
        if (l < 0) {
            return -1;
        }
        level = SHOAL_MAX(level, l + 1);
    }
    sw->level = level;
    return level;
}

/* Refuses cycles; hangs nodes no switch lists under a made-up leaf, and several trees under
 * a made-up root. */
static shoal_status_t shoal_sched_tree_link(shoal_sched_cluster_t *c)
{
    int unlisted = -1, nroots = 0;

    /* Each switch's depth, each walk up stopping at a switch already known: walking every
     * switch up to its root cost switches x depth (a topology.conf of 65,536 switches in a
     * chain took over a minute), and the recursions over the tree (tree_walk, the room, the
     * placement) went as deep as the chain (a stack overflow). */
    int *depth = calloc((size_t)c->nsw + 1, sizeof(int)); /* 0 unknown, -1 on this walk */
    if (depth == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int s = 0; s < c->nsw; s++) {
        int up = s, d;
        while (up >= 0 && depth[up] == 0) {
            depth[up] = -1;
            up = c->sw[up].parent;
        }
        if (up >= 0 && depth[up] < 0) {
            shoal_error(SCHED, "topology: switch %s is its own ancestor (a cycle)", c->sw[up].name);
            free(depth);
            return SHOAL_ERR_INVALID_ARG;
        }
        d = up >= 0 ? depth[up] : 0;
        /* the walk's switches from the top down: their count is known only at its end */
        int n = 0;
        for (int x = s; x != up; x = c->sw[x].parent) {
            n++;
        }
        for (int x = s, i = 0; x != up; x = c->sw[x].parent, i++) {
            depth[x] = d + n - i;
        }
        if (depth[s] >= SHOAL_SCHED_LEVELS_MAX) { /* one level kept for a made-up root */
            shoal_error(SCHED, "topology: switch %s is %d switches deep (its root's level "
                        "counted): at most %d", c->sw[s].name, depth[s],
                        SHOAL_SCHED_LEVELS_MAX - 1);
            free(depth);
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    free(depth);
    for (int i = 0; i < c->nnodes; i++) {
        if (c->nodes[i].leaf < 0) {
            if (unlisted < 0) {
                unlisted = shoal_sched_switch_add(c, c->nsw == 0 ? "(all)" : "(unlisted)");
                if (unlisted < 0) {
                    return SHOAL_ERR_NO_MEMORY;
                }
                c->sw[unlisted].virt = 1;
            }
            c->nodes[i].leaf = unlisted;
            if (shoal_sched_list_add(&c->sw[unlisted].nodes, &c->sw[unlisted].nnodes, i) != 0) {
                return SHOAL_ERR_NO_MEMORY;
            }
        }
    }
    for (int s = 0; s < c->nsw; s++) {
        nroots += c->sw[s].parent < 0;
    }
    if (nroots == 1) {
        for (int s = 0; s < c->nsw; s++) {
            c->root = c->sw[s].parent < 0 ? s : c->root;
        }
    } else {
        /* several trees: one made-up root above the tops */
        int r = shoal_sched_switch_add(c, "(root)");
        if (r < 0) {
            return SHOAL_ERR_NO_MEMORY;
        }
        c->sw[r].virt = 1;
        for (int s = 0; s < c->nsw; s++) {
            if (s != r && c->sw[s].parent < 0) {
                c->sw[s].parent = r;
                if (shoal_sched_list_add(&c->sw[r].kids, &c->sw[r].nkids, s) != 0) {
                    return SHOAL_ERR_NO_MEMORY;
                }
            }
        }
        c->root = r;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_sched_cluster_finish(shoal_sched_cluster_t *c)
{
    int order = 0;

    if (c->nnodes == 0) {
        shoal_error(SCHED, "no nodes (slurm.conf has no NodeName line, or State=FUTURE ones "
                    "only)");
        return SHOAL_ERR_INVALID_ARG;
    }
    SHOAL_CHECK(shoal_sched_tree_link(c));
    c->maxlevel = shoal_sched_tree_walk(c, c->root, 0, &order);
    if (c->maxlevel < 0 || order != c->nnodes) {
        shoal_error(SCHED, "topology: the switches form a cycle or a node hangs below no root");
        return SHOAL_ERR_INVALID_ARG;
    }
    memset(c->total, 0, sizeof(c->total));
    c->free_gpus = 0;
    for (int i = 0; i < c->nnodes; i++) {
        c->nodes[i].gpus_busy = __builtin_popcountll(c->nodes[i].gpu_used);
        c->free_gpus += c->nodes[i].gpus - c->nodes[i].gpus_busy;
        c->total[SHOAL_SCHED_GPU] += c->nodes[i].gpus;
        c->total[SHOAL_SCHED_CPU] += c->nodes[i].cpus;
        c->total[SHOAL_SCHED_MEM] += (double)c->nodes[i].mem_mb;
    }
    for (int r = 0; r < SHOAL_SCHED_RES; r++) {
        c->total[r] = c->total[r] > 0 ? c->total[r] : 1;
    }
    if (c->uplink_cost <= 0) {
        c->uplink_cost = SHOAL_SCHED_UPLINK_COST_DEFAULT;
    }
    free(c->cap);
    free(c->take);
    shoal_sched_room_free(c);
    c->cap = calloc((size_t)(c->nnodes + c->nsw), sizeof(int));
    c->take = calloc((size_t)c->nnodes, sizeof(int));
    if (c->cap == NULL || c->take == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    return shoal_sched_room_alloc(c);
}

shoal_status_t shoal_sched_room_alloc(shoal_sched_cluster_t *c)
{
    size_t nsw = (size_t)c->nsw, per;

    c->room.gpus_max = 0;
    for (int i = 0; i < c->nnodes; i++) {
        c->room.gpus_max = SHOAL_MAX(c->room.gpus_max, c->nodes[i].gpus);
    }
    per = nsw * (size_t)(c->room.gpus_max + 1);
    c->room.node_max = calloc(nsw, sizeof(int));
    c->room.dirty = calloc((size_t)c->nnodes, sizeof(int));
    c->room.is_dirty = calloc((size_t)c->nnodes, 1);
    c->room.ver = calloc(nsw, sizeof(unsigned));
    c->room.one_node = calloc(per, sizeof(int));
    c->room.one_ver = calloc(per, sizeof(unsigned));
    c->room.one_epoch = calloc(per, sizeof(unsigned));
    c->room.top = calloc(nsw * SHOAL_SCHED_TOP_WAYS, sizeof(*c->room.top));
    c->room.buf = malloc(sizeof(int) * 6 * ((size_t)c->nnodes + 1));
    c->room.leaf_buf = malloc(2 * (nsw + 1));
    c->room.valid = 0;
    c->room.ndirty = 0;
    c->room.epoch = 1; /* a zeroed one_epoch is never valid */
    if (c->room.node_max == NULL || c->room.dirty == NULL || c->room.is_dirty == NULL ||
        c->room.ver == NULL || c->room.one_node == NULL || c->room.one_ver == NULL ||
        c->room.one_epoch == NULL || c->room.top == NULL || c->room.buf == NULL ||
        c->room.leaf_buf == NULL) {
        shoal_sched_room_free(c);
        return SHOAL_ERR_NO_MEMORY;
    }
    return SHOAL_OK;
}

void shoal_sched_room_free(shoal_sched_cluster_t *c)
{
    free(c->room.node_max);
    free(c->room.dirty);
    free(c->room.is_dirty);
    free(c->room.ver);
    free(c->room.one_node);
    free(c->room.one_ver);
    free(c->room.one_epoch);
    free(c->room.top);
    free(c->room.buf);
    free(c->room.leaf_buf);
    memset(&c->room, 0, sizeof(c->room));
}

void shoal_sched_cluster_free(shoal_sched_cluster_t *c)
{
    for (int s = 0; s < c->nsw; s++) {
        free(c->sw[s].kids);
        free(c->sw[s].nodes);
    }
    free(c->sw);
    free(c->nodes);
    shoal_sched_index_free(&c->node_ix);
    shoal_sched_index_free(&c->sw_ix);
    free(c->cap);
    free(c->take);
    shoal_sched_room_free(c);
    memset(c, 0, sizeof(*c));
}

int shoal_sched_tenant_find(const shoal_sched_queue_t *q, const char *name)
{
    return shoal_sched_index_find(&q->tenant_ix, name, shoal_sched_tenant_name, q->tenants);
}

int shoal_sched_tenant_get(shoal_sched_queue_t *q, const char *name)
{
    int at = shoal_sched_tenant_find(q, name);
    if (at >= 0) {
        return at;
    }
    if (strlen(name) >= SHOAL_SCHED_NAME_MAX || name[0] == '\0') {
        shoal_error(SCHED, "tenant name '%s' empty or longer than %d", name,
                    SHOAL_SCHED_NAME_MAX - 1);
        return -1;
    }
    if (q->ntenants == q->tenants_cap) {
        int cap = q->tenants_cap == 0 ? 8 : 2 * q->tenants_cap;
        shoal_sched_tenant_t *t = realloc(q->tenants, sizeof(*t) * (size_t)cap);
        if (t == NULL) {
            return -1;
        }
        q->tenants = t;
        q->tenants_cap = cap;
    }
    shoal_sched_tenant_t *t = &q->tenants[q->ntenants];
    memset(t, 0, sizeof(*t));
    strcpy(t->name, name);
    t->weight = 0; /* unset: 1 unless a line gives one */
    if (shoal_sched_index_add(&q->tenant_ix, shoal_sched_tenant_name, q->tenants) != SHOAL_OK) {
        return -1;
    }
    return q->ntenants++;
}

shoal_sched_job_t *shoal_sched_job_new(shoal_sched_queue_t *q)
{
    if (q->njobs == q->jobs_cap) {
        int cap = q->jobs_cap == 0 ? 16 : 2 * q->jobs_cap;
        shoal_sched_job_t *j = realloc(q->jobs, sizeof(*j) * (size_t)cap);
        if (j == NULL) {
            return NULL;
        }
        q->jobs = j;
        q->jobs_cap = cap;
    }
    shoal_sched_job_t *j = &q->jobs[q->njobs];
    memset(j, 0, sizeof(*j));
    j->seq = q->njobs++;
    j->grace_s = 120;
    strcpy(j->signal, "USR1");
    return j;
}

void shoal_sched_queue_free(shoal_sched_queue_t *q)
{
    for (int i = 0; i < q->njobs; i++) {
        free(q->jobs[i].node_of);
        free(q->jobs[i].gpu_of);
    }
    free(q->jobs);
    free(q->tenants);
    shoal_sched_index_free(&q->tenant_ix);
    memset(q, 0, sizeof(*q));
}

static int shoal_sched_depth(const shoal_sched_cluster_t *c, int s)
{
    int d = 0;
    while (c->sw[s].parent >= 0) {
        s = c->sw[s].parent;
        d++;
    }
    return d;
}

int shoal_sched_lca_level(const shoal_sched_cluster_t *c, int a, int b)
{
    int sa, sb, da, db;

    if (a == b) {
        return 0;
    }
    sa = c->nodes[a].leaf;
    sb = c->nodes[b].leaf;
    da = shoal_sched_depth(c, sa);
    db = shoal_sched_depth(c, sb);
    while (da > db) {
        sa = c->sw[sa].parent;
        da--;
    }
    while (db > da) {
        sb = c->sw[sb].parent;
        db--;
    }
    while (sa != sb) {
        sa = c->sw[sa].parent;
        sb = c->sw[sb].parent;
    }
    return c->sw[sa].level;
}

static int shoal_sched_order_cmp(const void *pa, const void *pb, void *ctx)
{
    const shoal_sched_cluster_t *c = ctx;
    int a = c->nodes[*(const int *)pa].order, b = c->nodes[*(const int *)pb].order;
    return a < b ? -1 : a > b;
}

double shoal_sched_ring_cost(const shoal_sched_cluster_t *c, int *nodes, int n)
{
    double cost = 0;

    if (n <= 1) {
        return 0;
    }
    qsort_r(nodes, (size_t)n, sizeof(int), shoal_sched_order_cmp, (void *)c);
    for (int i = 0; i < n; i++) {
        int l = shoal_sched_lca_level(c, nodes[i], nodes[(i + 1) % n]);
        cost += l <= 1 ? (double)l : 1.0 + 2.0 * (l - 1) * c->uplink_cost;
    }
    return cost;
}

void shoal_sched_node_gpu_set(shoal_sched_cluster_t *c, int n, int g, int busy)
{
    shoal_sched_node_t *node = &c->nodes[n];
    uint64_t bit = 1ULL << g;
    int was = (node->gpu_used & bit) != 0;

    /* the node's room changes now, or with its CPUs and memory next to this call */
    if (c->room.is_dirty != NULL && !c->room.is_dirty[n]) {
        c->room.is_dirty[n] = 1;
        c->room.dirty[c->room.ndirty++] = n;
    }
    if (busy && !was) {
        node->gpu_used |= bit;
        node->gpus_busy++;
        c->free_gpus--;
    } else if (!busy && was) {
        node->gpu_used &= ~bit;
        node->gpus_busy--;
        c->free_gpus++;
    }
}

int shoal_sched_node_cap(const shoal_sched_cluster_t *c, int node, int cpus, long mem_mb)
{
    return c->nodes[node].down ? 0 : shoal_sched_node_room(c, node, cpus, mem_mb);
}

int shoal_sched_node_room(const shoal_sched_cluster_t *c, int node, int cpus, long mem_mb)
{
    const shoal_sched_node_t *n = &c->nodes[node];
    int cap = n->gpus - n->gpus_busy;

    if (cpus > 0) {
        cap = SHOAL_MIN(cap, (n->cpus - n->cpus_used) / cpus);
    }
    if (mem_mb > 0) {
        /* compared in long: RealMemory goes to 2^40 MB, and a quotient past 2^31 cast to
         * int first came out 0 or negative (a node with room for none) */
        long by_mem = (n->mem_mb - n->mem_used) / mem_mb;
        cap = by_mem < cap ? (int)by_mem : cap;
    }
    return SHOAL_MAX(cap, 0);
}

void shoal_sched_job_demand(const shoal_sched_job_t *j, double d[SHOAL_SCHED_RES])
{
    d[SHOAL_SCHED_GPU] = j->ranks;
    d[SHOAL_SCHED_CPU] = (double)j->ranks * j->cpus;
    d[SHOAL_SCHED_MEM] = (double)j->ranks * (double)j->mem_mb;
}

void shoal_sched_job_apply(shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                           shoal_sched_job_t *j)
{
    double d[SHOAL_SCHED_RES];

    for (int r = 0; r < j->ranks; r++) {
        shoal_sched_node_t *n = &c->nodes[j->node_of[r]];
        shoal_sched_node_gpu_set(c, j->node_of[r], j->gpu_of[r], 1);
        n->cpus_used += j->cpus;
        n->mem_used += j->mem_mb;
    }
    shoal_sched_job_demand(j, d);
    for (int k = 0; k < SHOAL_SCHED_RES; k++) {
        q->tenants[j->tenant].use[k] += d[k];
    }
    j->state = SHOAL_SCHED_RUNNING;
}

void shoal_sched_job_release(shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                             shoal_sched_job_t *j)
{
    double d[SHOAL_SCHED_RES];

    for (int r = 0; r < j->ranks; r++) {
        shoal_sched_node_t *n = &c->nodes[j->node_of[r]];
        shoal_sched_node_gpu_set(c, j->node_of[r], j->gpu_of[r], 0);
        n->cpus_used -= j->cpus;
        n->mem_used -= j->mem_mb;
    }
    shoal_sched_job_demand(j, d);
    for (int k = 0; k < SHOAL_SCHED_RES; k++) {
        q->tenants[j->tenant].use[k] -= d[k];
        if (q->tenants[j->tenant].use[k] < 1e-9) {
            q->tenants[j->tenant].use[k] = 0;
        }
    }
    j->state = SHOAL_SCHED_QUEUED;
}
