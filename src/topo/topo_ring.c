/* Grouping of ranks by host and socket, the host-aware ring order, double binary trees. */
#include "topo/topo.h"

#include <stdlib.h>

int shoal_topo_host_index(int n, const uint64_t *host_ids, int *host_of)
{
    int nhosts = 0;

    for (int r = 0; r < n; r++) {
        host_of[r] = -1;
        for (int q = 0; q < r; q++) {
            if (host_ids[q] == host_ids[r]) {
                host_of[r] = host_of[q];
                break;
            }
        }
        if (host_of[r] < 0) {
            host_of[r] = nhosts++;
        }
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
    for (int r = 0; r < n; r++) {
        int first = r;
        for (int q = 0; q < r; q++) {
            if (host_of[q] == host_of[r]) {
                first = q;
                break;
            }
        }
        keys[r] = (shoal_topo_key_t){
            .host_first = first,
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
