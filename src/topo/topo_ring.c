/* Grouping of ranks by host and socket, the host-aware ring order, the ring order a placement
 * asks for (a list of host names). */
#include "topo/topo.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Grouping by value: (value, rank) pairs sorted. Each rank scanned the lower ranks for its
 * value, n^2 / 2 steps: at 256Ki ranks, 32Ki hosts of 8, tens of seconds of every rank's init
 * (tests/unit/test_topo). */
typedef struct {
    uint64_t id;
    int rank;
} shoal_topo_idr_t;

static int shoal_topo_idr_cmp(const void *pa, const void *pb)
{
    const shoal_topo_idr_t *a = pa, *b = pb;
    if (a->id != b->id) {
        return a->id < b->id ? -1 : 1;
    }
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

/* first[r] = the lowest rank whose value (ids[], else ints[]) is r's; 0, or -1 without memory
 * (first untouched). */
static int shoal_topo_firsts(int n, const uint64_t *ids, const int *ints, int *first)
{
    shoal_topo_idr_t *k = malloc(sizeof(*k) * (size_t)(n > 0 ? n : 1));

    if (k == NULL) {
        return -1;
    }
    for (int r = 0; r < n; r++) {
        k[r] = (shoal_topo_idr_t){.id = ids != NULL ? ids[r] : (uint64_t)(int64_t)ints[r],
                                  .rank = r};
    }
    qsort(k, (size_t)n, sizeof(*k), shoal_topo_idr_cmp);
    for (int i = 0, f = 0; i < n; i++) {
        if (k[i].id != k[f].id) {
            f = i; /* a group's lowest rank sorts first */
        }
        first[k[i].rank] = k[f].rank;
    }
    free(k);
    return 0;
}

/* The same, by scanning (no memory for the sort): the same answer, every rank must agree. */
static void shoal_topo_firsts_scan(int n, const uint64_t *ids, const int *ints, int *first)
{
    for (int r = 0; r < n; r++) {
        first[r] = r;
        for (int q = 0; q < r; q++) {
            if (ids != NULL ? ids[q] == ids[r] : ints[q] == ints[r]) {
                first[r] = q;
                break;
            }
        }
    }
}

int shoal_topo_host_index(int n, const uint64_t *host_ids, int *host_of)
{
    int nhosts = 0;

    /* first ranks into host_of itself: first[r] <= r, so host_of[first[r]] is already the
     * index when r reads it */
    if (shoal_topo_firsts(n, host_ids, NULL, host_of) != 0) {
        shoal_topo_firsts_scan(n, host_ids, NULL, host_of);
    }
    for (int r = 0; r < n; r++) {
        host_of[r] = host_of[r] == r ? nhosts++ : host_of[host_of[r]];
    }
    return nhosts;
}

/* Sort key: (rank of the host's lowest rank, socket, rank). host_first[h] is that rank. */
typedef struct {
    int host_first;
    int socket;
    int rank;
} shoal_topo_key_t;

static int shoal_topo_key_cmp(const void *pa, const void *pb)
{
    const shoal_topo_key_t *a = pa, *b = pb;
    if (a->host_first != b->host_first) {
        return a->host_first < b->host_first ? -1 : 1;
    }
    if (a->socket != b->socket) {
        return a->socket < b->socket ? -1 : 1;
    }
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

void shoal_topo_ring_order(int n, const int *host_of, const int *socket_of, int *order)
{
    shoal_topo_key_t *keys = malloc(sizeof(*keys) * (size_t)n);

    if (keys == NULL) {
        /* Rank order is always a valid ring. */
        for (int r = 0; r < n; r++) {
            order[r] = r;
        }
        return;
    }
    /* each rank's host's first rank, in order[] until the order is written */
    if (shoal_topo_firsts(n, NULL, host_of, order) != 0) {
        shoal_topo_firsts_scan(n, NULL, host_of, order);
    }
    for (int r = 0; r < n; r++) {
        keys[r] = (shoal_topo_key_t){
            .host_first = order[r],
            .socket = socket_of != NULL ? socket_of[r] : 0,
            .rank = r,
        };
    }
    qsort(keys, (size_t)n, sizeof(*keys), shoal_topo_key_cmp);
    for (int i = 0; i < n; i++) {
        order[i] = keys[i].rank;
    }
    free(keys);
}

int shoal_topo_ring_share(int n, const int *host_of, const int *order)
{
    int best = 0, nhosts = 0;
    int *count;

    for (int r = 0; r < n; r++) {
        nhosts = SHOAL_MAX(nhosts, host_of[r] + 1);
    }
    count = calloc((size_t)SHOAL_MAX(nhosts, 1), sizeof(int));
    if (count == NULL) {
        return n;
    }
    for (int i = 0; i < n; i++) {
        int a = order[i], b = order[(i + 1) % n];
        if (host_of[a] != host_of[b]) {
            count[host_of[a]]++;
        }
    }
    for (int h = 0; h < nhosts; h++) {
        best = SHOAL_MAX(best, count[h]);
    }
    free(count);
    return best;
}

/* ---- the ring order a placement asks for (SHOAL_RING_HOSTS / SHOAL_RING_HOSTS_FILE) ------ */

static int shoal_topo_ring_host_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
}

static int shoal_topo_ring_name_cmp(const void *a, const void *b, void *names)
{
    const char(*nm)[SHOAL_TOPO_HOSTNAME_MAX] = names;
    return strcmp(nm[*(const int *)a], nm[*(const int *)b]);
}

/* Indices of rh's names in name order (malloc'ed; NULL when there are none or no memory). */
static int *shoal_topo_ring_hosts_sorted(const shoal_topo_ring_hosts_t *rh)
{
    int *idx = rh->n > 0 ? malloc(sizeof(*idx) * (size_t)rh->n) : NULL;

    for (int i = 0; idx != NULL && i < rh->n; i++) {
        idx[i] = i;
    }
    if (idx != NULL) {
        qsort_r(idx, (size_t)rh->n, sizeof(*idx), shoal_topo_ring_name_cmp, rh->names);
    }
    return idx;
}

shoal_status_t shoal_topo_ring_hosts_parse(const char *text, shoal_topo_ring_hosts_t *rh)
{
    const char *p = text;

    memset(rh, 0, sizeof(*rh));
    while (*p != '\0') {
        if (*p == '#') {
            while (*p != '\0' && *p != '\n') {
                p++;
            }
            continue;
        }
        if (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            p++;
            continue;
        }
        const char *s = p;
        while (shoal_topo_ring_host_char(*p)) {
            p++;
        }
        size_t len = (size_t)(p - s);
        if (len == 0 || len >= SHOAL_TOPO_HOSTNAME_MAX ||
            (*p != '\0' && *p != ',' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' &&
             *p != '#') || rh->n == SHOAL_TOPO_RING_HOSTS_MAX) {
            /* placed by line and column, not shown: SHOAL_RING_HOSTS_FILE naming the wrong
             * file (a token, a credential) put its text in the log */
            int line = 1;
            const char *bol = text;
            for (const char *q = text; q < s; q++) {
                if (*q == '\n') {
                    line++;
                    bol = q + 1;
                }
            }
            shoal_warn(TOPO, "ring host list: bad host name at line %d, column %d (letters, "
                       "digits, '.', '_', '-'; at most %d characters, %d hosts)", line,
                       (int)(p - bol) + 1, SHOAL_TOPO_HOSTNAME_MAX - 1,
                       SHOAL_TOPO_RING_HOSTS_MAX);
            shoal_topo_ring_hosts_free(rh);
            return SHOAL_ERR_INVALID_ARG;
        }
        if (rh->n == rh->cap) {
            int cap = rh->cap == 0 ? 16 : 2 * rh->cap;
            char (*nn)[SHOAL_TOPO_HOSTNAME_MAX] = realloc(rh->names, sizeof(*nn) * (size_t)cap);
            if (nn == NULL) {
                shoal_topo_ring_hosts_free(rh);
                return SHOAL_ERR_NO_MEMORY;
            }
            rh->names = nn;
            rh->cap = cap;
        }
        memcpy(rh->names[rh->n], s, len);
        rh->names[rh->n][len] = '\0';
        rh->n++;
    }
    /* Names listed twice: neighbours once sorted. Each name against all before it took
     * n^2 / 2 comparisons, seconds of CPU on every rank's init for a list near the limit. */
    int *idx = shoal_topo_ring_hosts_sorted(rh);
    if (idx == NULL && rh->n > 0) {
        shoal_topo_ring_hosts_free(rh);
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int i = 1; i < rh->n; i++) {
        if (strcmp(rh->names[idx[i - 1]], rh->names[idx[i]]) == 0) {
            shoal_warn(TOPO, "ring host list: host %s listed twice", rh->names[idx[i]]);
            free(idx);
            shoal_topo_ring_hosts_free(rh);
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    free(idx);
    /* the fingerprint ranks compare: the same list on every rank, or none is used */
    rh->hash = 0x5348524eULL;
    for (int i = 0; i < rh->n; i++) {
        rh->hash = shoal_hash64(rh->names[i], strlen(rh->names[i]) + 1, rh->hash);
    }
    return SHOAL_OK;
}

void shoal_topo_ring_hosts_free(shoal_topo_ring_hosts_t *rh)
{
    free(rh->names);
    memset(rh, 0, sizeof(*rh));
}

int shoal_topo_ring_order_hosts(int n, const int *socket_of, const char *const *host_name,
                                const shoal_topo_ring_hosts_t *rh, int *order)
{
    shoal_topo_key_t *keys = malloc(sizeof(*keys) * (size_t)n);
    /* each rank's host found by bisection of the sorted names, not by a scan of the list */
    int *idx = shoal_topo_ring_hosts_sorted(rh);

    if (keys == NULL || (idx == NULL && rh->n > 0)) {
        free(keys);
        free(idx);
        return -1;
    }
    for (int r = 0; r < n; r++) {
        int pos = -1, lo = 0, hi = rh->n - 1;
        while (lo <= hi && pos < 0) {
            int mid = lo + (hi - lo) / 2, c = strcmp(rh->names[idx[mid]], host_name[r]);
            if (c == 0) {
                pos = idx[mid];
            } else if (c < 0) {
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        if (pos < 0) {
            free(keys);
            free(idx);
            return r + 1;
        }
        keys[r] = (shoal_topo_key_t){
            .host_first = pos,
            .socket = socket_of != NULL ? socket_of[r] : 0,
            .rank = r,
        };
    }
    qsort(keys, (size_t)n, sizeof(*keys), shoal_topo_key_cmp);
    for (int i = 0; i < n; i++) {
        order[i] = keys[i].rank;
    }
    free(keys);
    free(idx);
    return 0;
}

shoal_status_t shoal_topo_ring_hosts_load(const char *inline_list, const char *path,
                                          shoal_topo_ring_hosts_t *rh)
{
    memset(rh, 0, sizeof(*rh));
    if (inline_list != NULL && inline_list[0] != '\0') {
        return shoal_topo_ring_hosts_parse(inline_list, rh);
    }
    if (path == NULL || path[0] == '\0') {
        return SHOAL_OK;
    }
    char *buf, why[96];
    int err = shoal_text_file_read(path, SHOAL_TOPO_RING_FILE_MAX, &buf, NULL, why, sizeof(why));
    if (err != 0) {
        /* a directory read as an empty list, without a word */
        shoal_warn(TOPO, "SHOAL_RING_HOSTS_FILE=%s %s", path, why);
        return err == ENOMEM ? SHOAL_ERR_NO_MEMORY : SHOAL_ERR_INVALID_ARG;
    }
    shoal_status_t st = shoal_topo_ring_hosts_parse(buf, rh);
    free(buf);
    return st;
}
