/* ib_remap: a send buffer freed and mapped again at the same address between two AllReduces
 * must not send the old pages (the registration cache of SHOAL_IB_REG_CACHE=1 keeps a
 * registration keyed by address; the pages behind that address change underneath it).
 *
 *     shoalrun -n N tests/vm/ib_remap [MIB] [ROUNDS]
 *
 * Every round maps the send and receive buffers (anonymous mmap, at the addresses of the
 * previous round: MAP_FIXED_NOREPLACE), fills the send buffer with a value of its own
 * (rank + 1 + 100 * round), runs an AllReduce SUM, checks every element, unmaps both. A
 * second group does the same with malloc/free (a large block: glibc maps and unmaps it). A
 * third sends around the ring from a read-only mapping (PROT_READ: a buffer
 * SHOAL_IB_REG_CACHE=1 cannot register for local write, which must still be sent).
 * Rank 0 prints one TAP line per group, combined over the ranks. */
#include <shoal.h>

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

static void *remap_map(void *hint, size_t len)
{
    void *p = mmap(hint, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (hint != NULL ? MAP_FIXED_NOREPLACE : 0), -1,
                   0);
    return p == MAP_FAILED ? NULL : p;
}

/* One round: fill, AllReduce, check. Returns the number of wrong elements (or 1 on error). */
static int remap_round(shoal_comm_t comm, int rank, int n, int32_t *s, int32_t *r,
                       size_t count, int round, char *why, size_t len)
{
    int32_t want = 0;
    shoal_status_t st;
    for (size_t i = 0; i < count; i++) {
        s[i] = rank + 1 + 100 * round;
        r[i] = -1;
    }
    for (int k = 0; k < n; k++) {
        want += k + 1 + 100 * round;
    }
    st = shoal_allreduce(s, r, count, SHOAL_INT32, SHOAL_SUM, comm, NULL);
    if (st != SHOAL_OK) {
        snprintf(why, len, "round %d: AllReduce: %s: %s", round, shoal_strerror(st),
                 shoal_comm_last_error(comm));
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        if (r[i] != want) {
            size_t bad = 0;
            for (size_t j = i; j < count; j++) {
                bad += r[j] != want;
            }
            snprintf(why, len, "round %d: element %zu is %d, want %d (%zu of %zu wrong; "
                     "the previous round's sum is %d)", round, i, r[i], want, bad, count,
                     want - 100 * n);
            return bad > 0x7fffffff ? 0x7fffffff : (int)bad;
        }
    }
    return 0;
}

/* mode 0: mmap at the same addresses; 1: malloc/free. */
static int remap_group(shoal_comm_t comm, int rank, int n, size_t bytes, int rounds, int mode,
                       int *tap)
{
    void *sp = NULL, *rp = NULL;
    int32_t bad = 0, sum = 0, same = 1, allsame = 0;
    char why[256] = "";
    for (int round = 0; round < rounds && bad == 0; round++) {
        void *s, *r;
        if (mode == 0) {
            s = remap_map(sp, bytes);
            r = remap_map(rp, bytes);
        } else {
            s = malloc(bytes);
            r = malloc(bytes);
        }
        if (s == NULL || r == NULL) {
            snprintf(why, sizeof(why), "round %d: no memory at the old address", round);
            bad = 1;
            break;
        }
        same &= round == 0 || (s == sp && r == rp);
        sp = s;
        rp = r;
        bad = remap_round(comm, rank, n, s, r, bytes / 4, round, why, sizeof(why));
        if (mode == 0) {
            munmap(s, bytes);
            munmap(r, bytes);
        } else {
            free(s);
            free(r);
        }
    }
    if (shoal_allreduce(&bad, &sum, 1, SHOAL_INT32, SHOAL_SUM, comm, NULL) != SHOAL_OK ||
        shoal_allreduce(&same, &allsame, 1, SHOAL_INT32, SHOAL_SUM, comm, NULL) != SHOAL_OK) {
        sum = 1;
    }
    if (bad != 0) {
        fprintf(stderr, "# rank %d: %s: %s\n", rank, mode == 0 ? "mmap" : "malloc", why);
    }
    if (rank == 0) {
        printf("%s %d - %s: %d rounds of a %zu MiB AllReduce, buffers freed and mapped "
               "again between rounds (%s; %d wrong elements over the ranks)\n",
               sum == 0 ? "ok" : "not ok", ++*tap, mode == 0 ? "munmap/mmap" : "free/malloc",
               rounds, bytes >> 20,
               allsame == n ? "same addresses on every rank" : "addresses moved on some rank",
               (int)sum);
    }
    return sum != 0;
}

/* Rank r sends bytes from a PROT_READ mapping to rank r + 1 and receives rank r - 1's. */
static int remap_readonly(shoal_comm_t comm, int rank, int n, size_t bytes, int *tap)
{
    int32_t bad = 0, sum = 0;
    char why[256] = "";
    int32_t *s = remap_map(NULL, bytes), *r = malloc(bytes);
    size_t count = bytes / 4;
    if (s == NULL || r == NULL) {
        snprintf(why, sizeof(why), "no memory");
        bad = 1;
    } else {
        shoal_status_t st;
        int to = (rank + 1) % n, from = (rank + n - 1) % n;
        for (size_t i = 0; i < count; i++) {
            s[i] = rank + 1;
            r[i] = -1;
        }
        if (mprotect(s, bytes, PROT_READ) != 0) {
            snprintf(why, sizeof(why), "mprotect failed");
            bad = 1;
        }
        /* rank 0 sends first, every other rank receives first: no cycle of blocked sends */
        st = bad != 0 ? SHOAL_ERR_INVALID_ARG
             : rank == 0 ? shoal_send(s, count, SHOAL_INT32, to, comm, NULL)
                         : shoal_recv(r, count, SHOAL_INT32, from, comm, NULL);
        if (st == SHOAL_OK) {
            st = rank == 0 ? shoal_recv(r, count, SHOAL_INT32, from, comm, NULL)
                           : shoal_send(s, count, SHOAL_INT32, to, comm, NULL);
        }
        if (bad == 0 && st != SHOAL_OK) {
            snprintf(why, sizeof(why), "send/recv: %s: %s", shoal_strerror(st),
                     shoal_comm_last_error(comm));
            bad = 1;
        }
        for (size_t i = 0; bad == 0 && i < count; i++) {
            if (r[i] != from + 1) {
                snprintf(why, sizeof(why), "element %zu is %d, want %d", i, r[i], from + 1);
                bad = 1;
            }
        }
    }
    if (shoal_allreduce(&bad, &sum, 1, SHOAL_INT32, SHOAL_SUM, comm, NULL) != SHOAL_OK) {
        sum = 1;
    }
    if (bad != 0) {
        fprintf(stderr, "# rank %d: read-only: %s\n", rank, why);
    }
    if (rank == 0) {
        printf("%s %d - read-only: a %zu MiB message sent around the ring from a PROT_READ "
               "mapping (%d ranks failed)\n", sum == 0 ? "ok" : "not ok", ++*tap, bytes >> 20,
               (int)sum);
    }
    if (s != NULL) {
        munmap(s, bytes);
    }
    free(r);
    return sum != 0;
}

int main(int argc, char **argv)
{
    shoal_comm_t comm;
    int rank, n, tap = 0, status = 0;
    size_t bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 4) << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;

    if (shoal_comm_init_env(&comm, NULL) != SHOAL_OK) {
        printf("not ok 1 - shoal_comm_init_env\n1..1\n");
        return 1;
    }
    shoal_comm_rank(comm, &rank);
    shoal_comm_size(comm, &n);
    status |= remap_group(comm, rank, n, bytes, rounds, 0, &tap);
    /* A fixed mmap threshold: glibc's dynamic one rises at the first free() of a mapped
     * block, and the later blocks would come from the heap (not unmapped, not remapped). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    status |= remap_group(comm, rank, n, bytes, rounds, 1, &tap);
    /* last: a failure here leaves the communicator failed */
    status |= remap_readonly(comm, rank, n, bytes, &tap);
    if (rank == 0) {
        printf("1..%d\n", tap);
    }
    shoal_comm_destroy(comm);
    return status;
}
