/*
 * Gang placement on the switch tree: all ranks of a job or none.
 *
 * For each subtree that could take the whole job (a node, then switches level by level), the
 * ranks are gathered in several shapes: with the fewest children at every level (children in
 * order of free room, the largest ones taken whole, the rest from the child that fits it most
 * tightly); with the fewest hosts anywhere under it; with the fewest hosts inside the leaves
 * the first shape chose; and, where there are few enough, inside every set of the fewest
 * child switches (and of one more) that can hold the job. A set of hosts is fitted tight: a
 * chosen host is swapped for a smaller one that still makes the job, so larger hosts stay
 * whole. The cheapest ring wins (shoal_sched_ring_cost: a hop through an upper switch costs
 * uplink_cost times a hop inside a leaf); ties go to the lower level, then best fit at every
 * level (the subtree whose highest ancestor below the root has the least free room, then the
 * next one down, ..., then the subtree itself: large blocks stay free at every level), then
 * the tree order. A higher level is not searched once its cheapest possible ring (two hosts
 * meeting at that level) costs more than the best found.
 *
 * The search does not visit every host and switch per job: per switch it keeps the host a job
 * of k ranks would take under it (shoal_sched_one_host) and the best top at each level under it
 * (shoal_sched_best_top), valid until room under that switch changes; room itself is updated
 * for the nodes changed since the last job (shoal_sched_caps). The answer is the same as the
 * search of every host and switch (c->room.exhaustive, which test_sched compares it with).
 */
#include "sched/sched.h"

#include <stdlib.h>
#include <string.h>

#define SHOAL_SCHED_CHAIN_MAX 16

static int shoal_sched_room_cmp(const int *a, int na, const int *b, int nb);

typedef struct {
    int id;  /* node index, or nnodes + switch index */
    int cap;
} shoal_sched_kid_t;

static int shoal_sched_kid_cmp(const void *pa, const void *pb)
{
    const shoal_sched_kid_t *a = pa, *b = pb;
    if (a->cap != b->cap) {
        return a->cap > b->cap ? -1 : 1;
    }
    return a->id < b->id ? -1 : a->id > b->id;
}

static int shoal_sched_sw_caps(shoal_sched_cluster_t *c, int s)
{
    const shoal_sched_switch_t *sw = &c->sw[s];
    int sum = 0, most = 0;
    for (int i = 0; i < sw->nnodes; i++) {
        sum += c->cap[sw->nodes[i]];
        most = SHOAL_MAX(most, c->cap[sw->nodes[i]]);
    }
    for (int i = 0; i < sw->nkids; i++) {
        sum += shoal_sched_sw_caps(c, sw->kids[i]);
        most = SHOAL_MAX(most, c->room.node_max[sw->kids[i]]);
    }
    c->cap[c->nnodes + s] = sum;
    c->room.node_max[s] = most;
    return sum;
}

/* Room per node and switch for ranks of this demand: whole when the demand differs from the
 * last job's, else only for the nodes changed since, up their paths to the root. */
static void shoal_sched_caps(shoal_sched_cluster_t *c, int cpus, long mem_mb)
{
    if (!c->room.valid || c->room.cpus != cpus || c->room.mem_mb != mem_mb) {
        for (int i = 0; i < c->nnodes; i++) {
            c->cap[i] = shoal_sched_node_cap(c, i, cpus, mem_mb);
        }
        shoal_sched_sw_caps(c, c->root);
        for (int i = 0; i < c->room.ndirty; i++) {
            c->room.is_dirty[c->room.dirty[i]] = 0;
        }
        c->room.ndirty = 0;
        c->room.epoch++;
        c->room.valid = 1;
        c->room.cpus = cpus;
        c->room.mem_mb = mem_mb;
        return;
    }
    for (int i = 0; i < c->room.ndirty; i++) {
        int n = c->room.dirty[i], now = shoal_sched_node_cap(c, n, cpus, mem_mb);
        int delta = now - c->cap[n];
        c->room.is_dirty[n] = 0;
        if (delta == 0) {
            continue;
        }
        c->cap[n] = now;
        for (int s = c->nodes[n].leaf; s >= 0; s = c->sw[s].parent) {
            c->cap[c->nnodes + s] += delta;
            /* a bound, not the maximum: finding a new maximum costs every child of every
             * switch on the path (hundreds of leaves under a spine), for every node a
             * preemption's trial releases; shoal_sched_one_host tightens it */
            c->room.node_max[s] = SHOAL_MAX(c->room.node_max[s], now);
            c->room.ver[s]++;
        }
    }
    c->room.ndirty = 0;
}

/* The single host a job of k ranks takes under switch s, as the search over every host with
 * room for k picks it (shoal_sched_consider: one host costs nothing, so the least room at
 * every level from the top down to the host's own, then the tree order); -1 if no host under
 * s has room for k. A switch's answer is kept until room under it changes, so a job looks at
 * the path that changed and the children along it, not at every host. */
static int shoal_sched_one_host(shoal_sched_cluster_t *c, int s, int k, int *chain, int *nchain)
{
    const shoal_sched_switch_t *sw = &c->sw[s];
    size_t m = (size_t)s * (size_t)(c->room.gpus_max + 1) + (size_t)k;
    int best = -1, bchain[SHOAL_SCHED_CHAIN_MAX], nb = 0, most = 0;

    if (c->room.one_epoch[m] == c->room.epoch && c->room.one_ver[m] == c->room.ver[s]) {
        best = c->room.one_node[m];
    } else {
        /* the nodes here first, then the child switches: tree order, so on a tie the one
         * found first stays */
        for (int i = 0; i < sw->nnodes; i++) {
            int n = sw->nodes[i];
            most = SHOAL_MAX(most, c->cap[n]);
            if (c->cap[n] >= k && (best < 0 || shoal_sched_room_cmp(&c->cap[n], 1, bchain,
                                                                    nb) < 0)) {
                best = n;
                bchain[0] = c->cap[n];
                nb = 1;
            }
        }
        for (int i = 0; i < sw->nkids; i++) {
            int t = sw->kids[i], tchain[SHOAL_SCHED_CHAIN_MAX], nt;
            most = SHOAL_MAX(most, c->room.node_max[t]);
            if (c->room.node_max[t] < k) {
                continue;
            }
            int n = shoal_sched_one_host(c, t, k, tchain + 1, &nt);
            tchain[0] = c->cap[c->nnodes + t];
            if (n >= 0 && (best < 0 || shoal_sched_room_cmp(tchain, nt + 1, bchain, nb) < 0)) {
                best = n;
                memcpy(bchain, tchain, sizeof(int) * (size_t)(nt + 1));
                nb = nt + 1;
            }
        }
        c->room.node_max[s] = most; /* the bound from the children's, tighter */
        c->room.one_node[m] = best;
        c->room.one_ver[m] = c->room.ver[s];
        c->room.one_epoch[m] = c->room.epoch;
    }
    /* the room chain below s, for the caller's comparison: rebuilt from the host up */
    *nchain = 0;
    if (best >= 0) {
        int tmp[SHOAL_SCHED_CHAIN_MAX], nt = 0;
        tmp[nt++] = c->cap[best];
        for (int x = c->nodes[best].leaf; x != s; x = c->sw[x].parent) {
            tmp[nt++] = c->cap[c->nnodes + x];
        }
        for (int i = 0; i < nt; i++) {
            chain[i] = tmp[nt - 1 - i];
        }
        *nchain = nt;
    }
    return best;
}

/* Which children give k ranks (kids sorted by room, largest first): the fewest of them, the
 * largest whole and the rest from the tightest that holds it; with tighten (children that
 * are hosts), each chosen one is then swapped for the smallest unchosen one that still makes
 * k, while that shrinks the room they hold together (the same number of hosts, fitted
 * tighter: larger hosts stay whole for later jobs). amount[i]: ranks from kids[i]. */
static int shoal_sched_pick(const shoal_sched_kid_t *kids, int n, int k, int tighten,
                            int *amount)
{
    int m, sum = 0, rest, held = 0;

    for (int i = 0; i < n; i++) {
        amount[i] = 0;
    }
    for (m = 0; m < n && sum + kids[m].cap < k; m++) {
        sum += kids[m].cap;
        amount[m] = 1; /* chosen */
    }
    rest = k - sum;
    if (rest > 0) {
        int best = -1;
        for (int i = m; i < n; i++) {
            if (kids[i].cap >= rest && (best < 0 || kids[i].cap < kids[best].cap)) {
                best = i; /* the smallest that holds it, the first of equals */
            }
        }
        if (best < 0) {
            return -1;
        }
        amount[best] = 1;
    }
    for (int i = 0; i < n; i++) {
        held += amount[i] ? kids[i].cap : 0;
    }
    for (int changed = tighten; changed;) {
        changed = 0;
        for (int i = 0; i < n; i++) {
            if (!amount[i]) {
                continue;
            }
            int need = k - (held - kids[i].cap), swap = -1;
            for (int q = 0; q < n; q++) {
                if (!amount[q] && kids[q].cap >= need && kids[q].cap < kids[i].cap &&
                    (swap < 0 || kids[q].cap < kids[swap].cap)) {
                    swap = q;
                }
            }
            if (swap >= 0) {
                amount[i] = 0;
                amount[swap] = 1;
                held += kids[swap].cap - kids[i].cap;
                changed = 1;
            }
        }
    }
    /* the chosen ones, largest first, whole until the last */
    for (int i = 0, left = k; i < n; i++) {
        if (amount[i]) {
            amount[i] = SHOAL_MIN(kids[i].cap, left);
            left -= amount[i];
        }
    }
    return 0;
}

/* Take k ranks (k <= cap) under x into c->take. */
static int shoal_sched_take(shoal_sched_cluster_t *c, int x, int k)
{
    if (x < c->nnodes) {
        c->take[x] += k;
        return 0;
    }
    const shoal_sched_switch_t *sw = &c->sw[x - c->nnodes];
    int n = 0;
    shoal_sched_kid_t *kids = malloc(sizeof(*kids) * (size_t)(sw->nnodes + sw->nkids + 1));

    if (kids == NULL) {
        return -1;
    }
    for (int i = 0; i < sw->nnodes; i++) {
        if (c->cap[sw->nodes[i]] > 0) {
            kids[n++] = (shoal_sched_kid_t){.id = sw->nodes[i], .cap = c->cap[sw->nodes[i]]};
        }
    }
    for (int i = 0; i < sw->nkids; i++) {
        int id = c->nnodes + sw->kids[i];
        if (c->cap[id] > 0) {
            kids[n++] = (shoal_sched_kid_t){.id = id, .cap = c->cap[id]};
        }
    }
    qsort(kids, (size_t)n, sizeof(*kids), shoal_sched_kid_cmp);
    int *amount = malloc(sizeof(int) * (size_t)(n + 1)), rc = -1;
    if (amount != NULL && shoal_sched_pick(kids, n, k, sw->nkids == 0, amount) == 0) {
        rc = 0;
        for (int i = 0; i < n && rc == 0; i++) {
            rc = amount[i] > 0 ? shoal_sched_take(c, kids[i].id, amount[i]) : 0;
        }
    }
    free(amount);
    free(kids);
    return rc;
}

/* Nodes of subtree x in tree order with a non-zero take into hosts; returns the count. */
static int shoal_sched_collect(const shoal_sched_cluster_t *c, int x, int *hosts, int n)
{
    if (x < c->nnodes) {
        if (c->take[x] > 0) {
            hosts[n++] = x;
        }
        return n;
    }
    const shoal_sched_switch_t *sw = &c->sw[x - c->nnodes];
    for (int i = 0; i < sw->nnodes; i++) {
        n = shoal_sched_collect(c, sw->nodes[i], hosts, n);
    }
    for (int i = 0; i < sw->nkids; i++) {
        n = shoal_sched_collect(c, c->nnodes + sw->kids[i], hosts, n);
    }
    return n;
}

/* Every node under x with room, in tree order. */
static int shoal_sched_subtree_nodes(const shoal_sched_cluster_t *c, int x, int *hosts, int n)
{
    if (x < c->nnodes) {
        if (c->cap[x] > 0) {
            hosts[n++] = x;
        }
        return n;
    }
    const shoal_sched_switch_t *sw = &c->sw[x - c->nnodes];
    for (int i = 0; i < sw->nnodes; i++) {
        n = shoal_sched_subtree_nodes(c, sw->nodes[i], hosts, n);
    }
    for (int i = 0; i < sw->nkids; i++) {
        n = shoal_sched_subtree_nodes(c, c->nnodes + sw->kids[i], hosts, n);
    }
    return n;
}

static void shoal_sched_take_clear(shoal_sched_cluster_t *c, const int *hosts, int n)
{
    for (int i = 0; i < n; i++) {
        c->take[hosts[i]] = 0;
    }
}

/* Ranks to the taken hosts (tree order), lowest free GPUs; clears the take. */
static int shoal_sched_assign(shoal_sched_cluster_t *c, shoal_sched_job_t *j, const int *hosts,
                              int nh)
{
    int r = 0;

    if (j->node_of == NULL) {
        j->node_of = malloc(sizeof(int) * (size_t)j->ranks);
        j->gpu_of = malloc(sizeof(int) * (size_t)j->ranks);
        if (j->node_of == NULL || j->gpu_of == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
    }
    for (int h = 0; h < nh; h++) {
        const shoal_sched_node_t *node = &c->nodes[hosts[h]];
        for (int g = 0; g < node->gpus && c->take[hosts[h]] > 0; g++) {
            if ((node->gpu_used & (1ULL << g)) == 0 && r < j->ranks) {
                j->node_of[r] = hosts[h];
                j->gpu_of[r++] = g;
                c->take[hosts[h]]--;
            }
        }
        c->take[hosts[h]] = 0;
    }
    return r == j->ranks ? 1 : SHOAL_ERR_INTERNAL;
}

/* The other shape: the fewest hosts anywhere under x (largest first, best fit for the rest),
 * which beats the fewest children per level when a child is made of many small pieces. */
static int shoal_sched_take_flat(shoal_sched_cluster_t *c, int x, int k, int *hosts,
                                 const char *leaf_ok)
{
    int n = 0;
    shoal_sched_kid_t *kids;

    int nh = shoal_sched_subtree_nodes(c, x, hosts, 0);
    kids = malloc(sizeof(*kids) * (size_t)(nh + 1));
    if (kids == NULL) {
        return -1;
    }
    for (int i = 0; i < nh; i++) {
        if (leaf_ok == NULL || leaf_ok[c->nodes[hosts[i]].leaf]) {
            kids[n++] = (shoal_sched_kid_t){.id = hosts[i], .cap = c->cap[hosts[i]]};
        }
    }
    qsort(kids, (size_t)n, sizeof(*kids), shoal_sched_kid_cmp);
    int *amount = malloc(sizeof(int) * (size_t)(n + 1)), rc = -1;
    if (amount != NULL && shoal_sched_pick(kids, n, k, 1, amount) == 0) {
        rc = 0;
        for (int i = 0; i < n; i++) {
            c->take[kids[i].id] += amount[i];
        }
    }
    free(amount);
    free(kids);
    return rc;
}

/* Shape 0: fewest children per level; 1: fewest hosts under x; 2: fewest hosts within the
 * leaves shape 0 chose. */
static int shoal_sched_take_shape(shoal_sched_cluster_t *c, int x, int k, int *hosts, int shape,
                                  char *leaf_ok)
{
    if (shape == 0) {
        return shoal_sched_take(c, x, k);
    }
    if (shape == 1) {
        return shoal_sched_take_flat(c, x, k, hosts, NULL);
    }
    if (shoal_sched_take(c, x, k) != 0) {
        return -1;
    }
    int nh = shoal_sched_collect(c, x, hosts, 0);
    memset(leaf_ok, 0, (size_t)c->nsw);
    for (int i = 0; i < nh; i++) {
        leaf_ok[c->nodes[hosts[i]].leaf] = 1;
    }
    shoal_sched_take_clear(c, hosts, nh);
    return shoal_sched_take_flat(c, x, k, hosts, leaf_ok);
}

static double shoal_sched_level_floor(const shoal_sched_cluster_t *c, int level)
{
    return level <= 1 ? 0 : 2.0 * (1.0 + 2.0 * (level - 1) * c->uplink_cost);
}

/* The best placement so far: its hosts and ranks per host (copied out of c->take). */
typedef struct {
    int *hosts, *take, *scratch;
    char *leaf_ok;
    int nh, top, level, cap, order, found;
    int chain[SHOAL_SCHED_CHAIN_MAX], nchain; /* room above and under top (best fit) */
    double cost;
} shoal_sched_best_t;

/* Free room of top's ancestors below the root, the highest first, then of top itself. */
static int shoal_sched_room_chain(const shoal_sched_cluster_t *c, int top, int *chain)
{
    int tmp[SHOAL_SCHED_CHAIN_MAX], n = 0;
    int s = top < c->nnodes ? c->nodes[top].leaf : c->sw[top - c->nnodes].parent;

    tmp[n++] = c->cap[top];
    while (s >= 0 && s != c->root && n < SHOAL_SCHED_CHAIN_MAX) {
        tmp[n++] = c->cap[c->nnodes + s];
        s = c->sw[s].parent;
    }
    for (int i = 0; i < n; i++) {
        chain[i] = tmp[n - 1 - i];
    }
    return n;
}

/* Best fit at every level: the tighter highest ancestor first, down to the tighter top. */
static int shoal_sched_room_cmp(const int *a, int na, const int *b, int nb)
{
    for (int i = 0; i < na && i < nb; i++) {
        if (a[i] != b[i]) {
            return a[i] < b[i] ? -1 : 1;
        }
    }
    return na < nb ? -1 : na > nb;
}

/* c->take holds a candidate under top (node or nnodes + switch): keep it if it is better
 * (cost, then level, then best fit at every level, then tree order); clears c->take. */
static void shoal_sched_consider(shoal_sched_cluster_t *c, shoal_sched_best_t *b, int top,
                                 int level)
{
    int nh = shoal_sched_collect(c, top, b->scratch, 0);
    double cost = shoal_sched_ring_cost(c, b->scratch, nh);
    int order = c->nodes[b->scratch[0]].order, cap = c->cap[top], chain[SHOAL_SCHED_CHAIN_MAX];
    int nchain = shoal_sched_room_chain(c, top, chain);
    int room = b->found ? shoal_sched_room_cmp(chain, nchain, b->chain, b->nchain) : 0;

    if (!b->found || cost < b->cost ||
        (cost == b->cost && (level < b->level || (level == b->level &&
                                                   (room < 0 ||
                                                    (room == 0 && order < b->order)))))) {
        memcpy(b->chain, chain, sizeof(int) * (size_t)nchain);
        b->nchain = nchain;
        b->found = 1;
        b->cost = cost;
        b->level = level;
        b->cap = cap;
        b->order = order;
        b->top = top;
        b->nh = nh;
        for (int i = 0; i < nh; i++) {
            b->hosts[i] = b->scratch[i];
            b->take[i] = c->take[b->scratch[i]];
        }
    }
    shoal_sched_take_clear(c, b->scratch, nh);
}

static void shoal_sched_mark_leaves(const shoal_sched_cluster_t *c, int s, char *leaf_ok)
{
    leaf_ok[s] = 1;
    for (int i = 0; i < c->sw[s].nkids; i++) {
        shoal_sched_mark_leaves(c, c->sw[s].kids[i], leaf_ok);
    }
}

static double shoal_sched_binom(int n, int m)
{
    double r = 1;
    for (int i = 1; i <= m; i++) {
        r = r * (n - m + i) / i;
    }
    return r;
}

/* Under a switch of switches: every set of the fewest children that can hold k (and of one
 * more), the fewest hosts inside it, where there are at most SHOAL_SCHED_SUBSETS_MAX sets. */
#define SHOAL_SCHED_SUBSETS_MAX 64
static int shoal_sched_try_subsets(shoal_sched_cluster_t *c, shoal_sched_best_t *b, int s, int k)
{
    const shoal_sched_switch_t *sw = &c->sw[s];
    int n = sw->nkids, idx[16], need = 0, sum = 0;
    int caps[64];

    if (sw->nnodes > 0 || n < 2 || n > 64) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        caps[i] = c->cap[c->nnodes + sw->kids[i]];
    }
    /* the fewest children: the largest first */
    int sorted[64];
    memcpy(sorted, caps, sizeof(int) * (size_t)n);
    for (int i = 1; i < n; i++) {
        for (int m = i; m > 0 && sorted[m] > sorted[m - 1]; m--) {
            int t = sorted[m];
            sorted[m] = sorted[m - 1];
            sorted[m - 1] = t;
        }
    }
    while (need < n && sum < k) {
        sum += sorted[need++];
    }
    for (int m = need; m <= need + 1 && m <= n && m <= 16; m++) {
        if (shoal_sched_binom(n, m) > SHOAL_SCHED_SUBSETS_MAX) {
            continue;
        }
        for (int i = 0; i < m; i++) {
            idx[i] = i;
        }
        for (;;) {
            int total = 0;
            for (int i = 0; i < m; i++) {
                total += caps[idx[i]];
            }
            if (total >= k) {
                memset(b->leaf_ok, 0, (size_t)c->nsw);
                for (int i = 0; i < m; i++) {
                    shoal_sched_mark_leaves(c, sw->kids[idx[i]], b->leaf_ok);
                }
                if (shoal_sched_take_flat(c, c->nnodes + s, k, b->scratch, b->leaf_ok) != 0) {
                    return -1;
                }
                shoal_sched_consider(c, b, c->nnodes + s, sw->level);
            }
            int i = m - 1;
            while (i >= 0 && idx[i] == n - m + i) {
                i--;
            }
            if (i < 0) {
                break;
            }
            idx[i]++;
            for (int q = i + 1; q < m; q++) {
                idx[q] = idx[q - 1] + 1;
            }
        }
    }
    return 0;
}

/* Switch s as the top of a job of k ranks: every shape of it, into b. */
static int shoal_sched_try_top(shoal_sched_cluster_t *c, shoal_sched_best_t *b, int s, int k)
{
    int id = c->nnodes + s;
    /* under a switch of nodes only, the fewest children are the fewest hosts */
    int shapes = c->sw[s].nkids > 0 ? 3 : 1;

    for (int shape = 0; shape < shapes; shape++) {
        if (shoal_sched_take_shape(c, id, k, b->scratch, shape, b->leaf_ok) != 0) {
            return -1;
        }
        shoal_sched_consider(c, b, id, c->sw[s].level);
    }
    return shapes > 1 ? shoal_sched_try_subsets(c, b, s, k) : 0;
}

/* The memo of (k, level) in switch x's set: its own, else one gone stale, else one by hash. */
static struct shoal_sched_top_memo *shoal_sched_top_way(const shoal_sched_cluster_t *c,
                                                        struct shoal_sched_top_memo *set, int x,
                                                        int level, int k)
{
    struct shoal_sched_top_memo *stale = NULL;

    for (int w = 0; w < SHOAL_SCHED_TOP_WAYS; w++) {
        if (set[w].k == k && set[w].level == level) {
            return &set[w];
        }
        if (stale == NULL && (set[w].epoch != c->room.epoch || set[w].ver != c->room.ver[x])) {
            stale = &set[w];
        }
    }
    return stale != NULL ? stale
                         : &set[((unsigned)k * 7u + (unsigned)level) % SHOAL_SCHED_TOP_WAYS];
}

/* The top at this level under switch x that the search over every switch of the level would
 * keep (shoal_sched_consider: the cheapest ring, then the least room at every level from the
 * top, then the tree order): its switch, or -1, its ring's cost and first host's order, and
 * its room chain below x's parent. Kept per switch for a few (k, level) pairs until room
 * under it changes, so a job evaluates the switches whose room changed, not every one.
 * tmp: scratch for one switch's shapes. */
static int shoal_sched_best_top(shoal_sched_cluster_t *c, shoal_sched_best_t *tmp, int x,
                                int level, int k, struct shoal_sched_top_memo *out, int *chain,
                                int *nchain)
{
    const shoal_sched_switch_t *sw = &c->sw[x];
    struct shoal_sched_top_memo *set = &c->room.top[(size_t)x * SHOAL_SCHED_TOP_WAYS], *m;

    m = shoal_sched_top_way(c, set, x, level, k);
    if (m->epoch != c->room.epoch || m->ver != c->room.ver[x] || m->k != k ||
        m->level != level) {
        struct shoal_sched_top_memo r = {.epoch = c->room.epoch, .ver = c->room.ver[x],
                                         .k = k, .level = level, .top = -1};
        if (sw->level == level) {
            tmp->found = 0;
            if (shoal_sched_try_top(c, tmp, x, k) != 0) {
                return -1;
            }
            if (tmp->found) {
                r.top = x;
                r.cost = tmp->cost;
                r.order = tmp->order;
            }
        } else {
            int rchain[SHOAL_SCHED_CHAIN_MAX], nr = 0;
            for (int i = 0; i < sw->nkids; i++) {
                int t = sw->kids[i], tchain[SHOAL_SCHED_CHAIN_MAX], nt;
                struct shoal_sched_top_memo tr;
                if (c->sw[t].level < level || c->cap[c->nnodes + t] < k) {
                    continue;
                }
                if (shoal_sched_best_top(c, tmp, t, level, k, &tr, tchain, &nt) != 0) {
                    return -1;
                }
                if (tr.top < 0) {
                    continue;
                }
                int room = r.top < 0 ? 0 : shoal_sched_room_cmp(tchain, nt, rchain, nr);
                if (r.top < 0 || tr.cost < r.cost ||
                    (tr.cost == r.cost && (room < 0 || (room == 0 && tr.order < r.order)))) {
                    r.top = tr.top;
                    r.cost = tr.cost;
                    r.order = tr.order;
                    memcpy(rchain, tchain, sizeof(int) * (size_t)nt);
                    nr = nt;
                }
            }
        }
        *m = r;
    }
    *out = *m;
    /* the room chain from x down to the top, rebuilt from the top up */
    *nchain = 0;
    if (m->top >= 0) {
        int tmpc[SHOAL_SCHED_CHAIN_MAX], n = 0;
        for (int s = m->top;; s = c->sw[s].parent) {
            tmpc[n++] = c->cap[c->nnodes + s];
            if (s == x) {
                break;
            }
        }
        for (int i = 0; i < n; i++) {
            chain[i] = tmpc[n - 1 - i];
        }
        *nchain = n;
    }
    return 0;
}

/* A best-so-far on the cluster's scratch (c->room.buf), slot 0 or 1: allocated with the
 * tree, since a job's placement that mapped and zeroed fresh pages for it spent more time in
 * the kernel than in the search. */
static void shoal_sched_best_init(const shoal_sched_cluster_t *c, shoal_sched_best_t *b,
                                  int slot)
{
    size_t n = (size_t)c->nnodes;
    memset(b, 0, sizeof(*b));
    b->hosts = c->room.buf + (size_t)slot * 3 * n;
    b->take = b->hosts + n;
    b->scratch = b->take + n;
    b->leaf_ok = c->room.leaf_buf + (size_t)slot * ((size_t)c->nsw + 1);
}

int shoal_sched_place(shoal_sched_cluster_t *c, shoal_sched_job_t *j,
                      shoal_sched_place_info_t *info)
{
    int k = j->ranks, rc;
    /* each host and switch as the top is searched only where the room chain is whole */
    int fast = c->maxlevel < SHOAL_SCHED_CHAIN_MAX && !c->room.exhaustive;
    shoal_sched_best_t b, tmp;

    if (c->free_gpus < k) {
        return 0; /* the quick answer for most jobs that wait */
    }
    shoal_sched_caps(c, j->cpus, j->mem_mb);
    if (c->cap[c->nnodes + c->root] < k) {
        return 0;
    }
    shoal_sched_best_init(c, &b, 0);
    shoal_sched_best_init(c, &tmp, 1);
    /* one node: the tightest, in the tightest switches */
    if (fast) {
        int chain[SHOAL_SCHED_CHAIN_MAX], nchain;
        int n = k <= c->room.gpus_max && c->room.node_max[c->root] >= k
                    ? shoal_sched_one_host(c, c->root, k, chain, &nchain)
                    : -1;
        if (n >= 0) {
            c->take[n] = k;
            shoal_sched_consider(c, &b, n, 0);
        }
    } else {
        for (int i = 0; i < c->nnodes; i++) {
            if (c->cap[i] >= k) {
                c->take[i] = k;
                shoal_sched_consider(c, &b, i, 0);
            }
        }
    }
    rc = 0;
    for (int level = 1; rc == 0 && level <= c->maxlevel &&
                        (!b.found || b.cost > shoal_sched_level_floor(c, level));
         level++) {
        if (fast) {
            struct shoal_sched_top_memo top;
            int chain[SHOAL_SCHED_CHAIN_MAX], nchain;
            rc = shoal_sched_best_top(c, &tmp, c->root, level, k, &top, chain, &nchain);
            if (rc == 0 && top.top >= 0) {
                rc = shoal_sched_try_top(c, &b, top.top, k);
            }
            continue;
        }
        for (int s = 0; rc == 0 && s < c->nsw; s++) {
            if (c->sw[s].level == level && c->cap[c->nnodes + s] >= k) {
                rc = shoal_sched_try_top(c, &b, s, k);
            }
        }
    }
    if (rc != 0) {
        return SHOAL_ERR_NO_MEMORY;
    }
    if (!b.found) {
        return 0;
    }
    for (int i = 0; i < b.nh; i++) {
        c->take[b.hosts[i]] = b.take[i];
    }
    if (info != NULL) {
        *info = (shoal_sched_place_info_t){
            .level = b.level, .top = b.top < c->nnodes ? b.top : b.top - c->nnodes,
            .nhosts = b.nh, .cost = b.cost, .free_under_top = b.cap,
        };
    }
    return shoal_sched_assign(c, j, b.hosts, b.nh);
}

int shoal_sched_place_first_fit(shoal_sched_cluster_t *c, shoal_sched_job_t *j)
{
    int left = j->ranks, nh = 0, rc;
    int *hosts = malloc(sizeof(int) * (size_t)c->nnodes);

    if (hosts == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    shoal_sched_caps(c, j->cpus, j->mem_mb);
    if (c->cap[c->nnodes + c->root] < left) {
        free(hosts);
        return 0;
    }
    for (int i = 0; i < c->nnodes && left > 0; i++) {
        int t = SHOAL_MIN(c->cap[i], left);
        if (t > 0) {
            c->take[i] = t;
            hosts[nh++] = i;
            left -= t;
        }
    }
    rc = shoal_sched_assign(c, j, hosts, nh);
    free(hosts);
    return rc;
}

/* The lowest subtree with room, the one with least room at that level; nodes in order. */
int shoal_sched_place_slurm_tree(shoal_sched_cluster_t *c, shoal_sched_job_t *j)
{
    int k = j->ranks, best = -1, best_cap = 0, nh, rc;
    int *hosts = malloc(sizeof(int) * (size_t)c->nnodes);

    if (hosts == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    shoal_sched_caps(c, j->cpus, j->mem_mb);
    for (int i = 0; i < c->nnodes; i++) {
        if (c->cap[i] >= k && (best < 0 || c->cap[i] < best_cap)) {
            best = i;
            best_cap = c->cap[i];
        }
    }
    for (int level = 1; best < 0 && level <= c->maxlevel; level++) {
        for (int s = 0; s < c->nsw; s++) {
            int id = c->nnodes + s;
            if (c->sw[s].level == level && c->cap[id] >= k && (best < 0 || c->cap[id] < best_cap)) {
                best = id;
                best_cap = c->cap[id];
            }
        }
    }
    if (best < 0) {
        free(hosts);
        return 0;
    }
    if (best < c->nnodes) {
        c->take[best] = k;
        hosts[0] = best;
        nh = 1;
    } else {
        /* every node of the subtree, in tree order, first fit */
        for (int i = 0; i < c->nnodes; i++) {
            c->take[i] = c->cap[i];
        }
        nh = shoal_sched_collect(c, best, hosts, 0);
        for (int i = 0; i < c->nnodes; i++) {
            c->take[i] = 0;
        }
        int left = k, used = 0;
        for (int h = 0; h < nh && left > 0; h++) {
            int t = SHOAL_MIN(c->cap[hosts[h]], left);
            c->take[hosts[h]] = t;
            hosts[used++] = hosts[h];
            left -= t;
        }
        nh = used;
    }
    rc = shoal_sched_assign(c, j, hosts, nh);
    free(hosts);
    return rc;
}

/* The lowest switch above switches a and b. */
static int shoal_sched_lca_switch(const shoal_sched_cluster_t *c, int a, int b)
{
    int da = 0, db = 0;

    for (int s = a; c->sw[s].parent >= 0; s = c->sw[s].parent) {
        da++;
    }
    for (int s = b; c->sw[s].parent >= 0; s = c->sw[s].parent) {
        db++;
    }
    for (; da > db; da--) {
        a = c->sw[a].parent;
    }
    for (; db > da; db--) {
        b = c->sw[b].parent;
    }
    while (a != b) {
        a = c->sw[a].parent;
        b = c->sw[b].parent;
    }
    return a;
}

int shoal_sched_place_describe(shoal_sched_cluster_t *c, const shoal_sched_job_t *j,
                               shoal_sched_place_info_t *info)
{
    int *hosts, nh = 0, top;

    if (j->ranks <= 0) {
        return SHOAL_ERR_INVALID_ARG; /* a placed job has a rank */
    }
    hosts = malloc(sizeof(int) * (size_t)j->ranks);
    if (hosts == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int r = 0; r < j->ranks; r++) {
        if (r == 0 || j->node_of[r] != j->node_of[r - 1]) {
            hosts[nh++] = j->node_of[r];
        }
    }
    top = c->nodes[hosts[0]].leaf;
    for (int h = 1; h < nh; h++) {
        top = shoal_sched_lca_switch(c, top, c->nodes[hosts[h]].leaf);
    }
    *info = (shoal_sched_place_info_t){
        .level = nh == 1 ? 0 : c->sw[top].level,
        .top = nh == 1 ? hosts[0] : top,
        .nhosts = nh,
        .cost = shoal_sched_ring_cost(c, hosts, nh),
        .free_under_top = nh == 1 ? c->cap[hosts[0]] : c->cap[c->nnodes + top],
    };
    free(hosts);
    return 1;
}

int shoal_sched_largest_gang(shoal_sched_cluster_t *c)
{
    int best = 0;
    shoal_sched_caps(c, 0, 0);
    for (int s = 0; s < c->nsw; s++) {
        if (c->sw[s].nnodes > 0 && !c->sw[s].virt) {
            best = SHOAL_MAX(best, c->cap[c->nnodes + s]);
        } else if (c->sw[s].nnodes > 0) {
            for (int i = 0; i < c->sw[s].nnodes; i++) {
                best = SHOAL_MAX(best, c->cap[c->sw[s].nodes[i]]);
            }
        }
    }
    return best;
}
