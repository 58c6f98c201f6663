/*
 * Soak test, one rank of a shoalrun job (4 ranks in tests/soak/run_soak.sh).
 *
 * (a) Mixed collectives: allreduce, broadcast, allgather, reduce_scatter, alltoall, barrier
 *     and shoal_iallreduce + wait, small and medium sizes, every result checked. After a
 *     warm-up, the resident set (/proc/self/statm) and the open descriptors (/proc/self/fd)
 *     must stay flat.
 * (b) Init/destroy cycles: rank 0 makes a unique id, every rank joins a new communicator,
 *     splits it (shoal_comm_split), runs a collective on both, destroys both. Afterwards no
 *     descriptor, no thread (/proc/self/task) and no /dev/shm entry of this job may be left
 *     (the names of the job's segments are taken from /proc/self/maps during the cycles).
 *
 * usage: soak [NCOLLS [NCYCLES]] (default 2000 and 30; run_soak.sh SOAK_LONG=1 passes 100000
 * and 1000). Rank 0 prints TAP lines without a plan and "# " figures; the script numbers them.
 */
#include <shoal.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SOAK_RSS_BOUND_KB 4096 /* growth of the resident set allowed after the warm-up */
#define SOAK_MAX_COUNT 65536   /* int32 elements per rank and block (256 KiB) */

static const size_t soak_counts[] = {1, 7, 64, 1000, 16384, SOAK_MAX_COUNT};

typedef struct {
    shoal_comm_t comm;
    int rank;
    int n;
    int32_t *in, *out;
    float *fin, *fout;
} soak_t;

/* shoal_wait sets *req to NULL once it has freed the request (MPI-style). */
static shoal_status_t soak_wait(shoal_request_t *req)
{
    return shoal_wait(req);
}

static double soak_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long soak_rss_kb(void)
{
    FILE *fp = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;

    if (fp == NULL)
        return -1;
    if (fscanf(fp, "%ld %ld", &size, &res) != 2)
        res = -1;
    fclose(fp);
    return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Entries of a /proc directory, "." and ".." not counted. */
static int soak_count_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.')
            n++;
    }
    closedir(d);
    return n;
}

static int soak_fds(void) { return soak_count_dir("/proc/self/fd") - 1; /* opendir's own */ }
static int soak_threads(void) { return soak_count_dir("/proc/self/task"); }

/* ---- (a) mixed collectives ---------------------------------------------------------------- */

/* Runs collective number i; returns 0 if it succeeded with the right result. */
static int soak_one(soak_t *s, long i)
{
    const int n = s->n, r = s->rank, kind = (int)(i % 7);
    const size_t c = soak_counts[(size_t)(i / 7) % (sizeof(soak_counts) / sizeof(soak_counts[0]))];
    const int32_t seed = (int32_t)(i % 100003);
    shoal_request_t req = NULL;
    shoal_status_t st = SHOAL_OK;
    size_t j;
    int root, b;

    switch (kind) {
    case 0: /* allreduce int32 sum */
        for (j = 0; j < c; j++)
            s->in[j] = (r + 1) + (int32_t)((j + (size_t)seed) % 13);
        st = shoal_allreduce(s->in, s->out, c, SHOAL_INT32, SHOAL_SUM, s->comm, NULL);
        for (j = 0; j < c && st == SHOAL_OK; j++)
            if (s->out[j] != n * (n + 1) / 2 + n * (int32_t)((j + (size_t)seed) % 13))
                return -1;
        break;
    case 1: /* broadcast from a rotating root */
        root = (int)(i / 7 % n);
        for (j = 0; j < c; j++)
            s->out[j] = r == root ? seed * 31 + (int32_t)j : -1;
        st = shoal_broadcast(s->out, s->out, c, SHOAL_INT32, root, s->comm, NULL);
        for (j = 0; j < c && st == SHOAL_OK; j++)
            if (s->out[j] != seed * 31 + (int32_t)j)
                return -1;
        break;
    case 2: /* allgather */
        for (j = 0; j < c; j++)
            s->in[j] = r * 100000 + (int32_t)((j + (size_t)seed) % 100000);
        st = shoal_allgather(s->in, s->out, c, SHOAL_INT32, s->comm, NULL);
        for (b = 0; b < n && st == SHOAL_OK; b++)
            for (j = 0; j < c; j++)
                if (s->out[(size_t)b * c + j] !=
                    b * 100000 + (int32_t)((j + (size_t)seed) % 100000))
                    return -1;
        break;
    case 3: /* reduce_scatter int32 sum */
        for (b = 0; b < n; b++)
            for (j = 0; j < c; j++)
                s->in[(size_t)b * c + j] = (r + 1) * (b + 1) + (int32_t)((j + (size_t)seed) % 5);
        st = shoal_reduce_scatter(s->in, s->out, c, SHOAL_INT32, SHOAL_SUM, s->comm, NULL);
        for (j = 0; j < c && st == SHOAL_OK; j++)
            if (s->out[j] != (r + 1) * n * (n + 1) / 2 + n * (int32_t)((j + (size_t)seed) % 5))
                return -1;
        break;
    case 4: /* alltoall */
        for (b = 0; b < n; b++)
            for (j = 0; j < c; j++)
                s->in[(size_t)b * c + j] = r * 1000 + b * 10 + (int32_t)((j + (size_t)seed) % 7);
        st = shoal_alltoall(s->in, s->out, c, SHOAL_INT32, s->comm, NULL);
        for (b = 0; b < n && st == SHOAL_OK; b++)
            for (j = 0; j < c; j++)
                if (s->out[(size_t)b * c + j] !=
                    b * 1000 + r * 10 + (int32_t)((j + (size_t)seed) % 7))
                    return -1;
        break;
    case 5:
        st = shoal_barrier(s->comm, NULL);
        break;
    default: /* non-blocking allreduce, float32 (exact small integers) */
        for (j = 0; j < c; j++)
            s->fin[j] = (float)(r + (int)((j + (size_t)seed) % 9));
        st = shoal_iallreduce(s->fin, s->fout, c, SHOAL_FLOAT32, SHOAL_SUM, s->comm, &req);
        if (st == SHOAL_OK)
            st = soak_wait(&req);
        for (j = 0; j < c && st == SHOAL_OK; j++)
            if (s->fout[j] != (float)(n * (n - 1) / 2 + n * (int)((j + (size_t)seed) % 9)))
                return -1;
        break;
    }
    if (st != SHOAL_OK) {
        fprintf(stderr, "soak rank %d: collective %ld (kind %d, count %zu): %s\n", r, i, kind,
                c, shoal_comm_last_error(s->comm));
        return -1;
    }
    return 0;
}

/* ---- (b) init/destroy cycles ---------------------------------------------------------------- */

typedef struct {
    char (*names)[128];
    size_t n, cap;
} soak_names_t;

/* Adds the /dev/shm names this process maps now. */
static void soak_shm_scan(soak_names_t *nm)
{
    FILE *fp = fopen("/proc/self/maps", "r");
    char line[1024];

    if (fp == NULL)
        return;
    while (fgets(line, sizeof(line), fp) != NULL) {
        char *p = strstr(line, "/dev/shm/"), name[128];
        size_t k, len;
        int dup = 0;
        if (p == NULL)
            continue;
        p += 9;
        len = strcspn(p, " \n");
        if (len == 0 || len >= sizeof(name))
            continue;
        memcpy(name, p, len);
        name[len] = '\0';
        for (k = nm->n > 64 ? nm->n - 64 : 0; k < nm->n && !dup; k++)
            dup = strcmp(nm->names[k], name) == 0;
        if (dup)
            continue;
        if (nm->n == nm->cap) {
            size_t cap = nm->cap ? 2 * nm->cap : 256;
            void *nn = realloc(nm->names, cap * sizeof(*nm->names));
            if (nn == NULL)
                break;
            nm->names = nn;
            nm->cap = cap;
        }
        memcpy(nm->names[nm->n++], name, len + 1);
    }
    fclose(fp);
}

static int soak_shm_left(const soak_names_t *nm)
{
    char path[256];
    int left = 0;

    for (size_t k = 0; k < nm->n; k++) {
        snprintf(path, sizeof(path), "/dev/shm/%s", nm->names[k]);
        if (access(path, F_OK) == 0) {
            if (left < 5)
                fprintf(stderr, "soak: %s is left behind\n", path);
            left++;
        }
    }
    return left;
}

/* Entries of /dev/shm named shoal*, any job (only reported: other jobs may run meanwhile). */
static int soak_shm_all(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "shoal", 5) == 0)
            n++;
    }
    closedir(d);
    return n;
}

static int soak_cycle(soak_t *s, long cyc, soak_names_t *nm)
{
    shoal_uid_t uid;
    shoal_comm_t c = NULL, sc = NULL;
    shoal_request_t req = NULL;
    shoal_status_t st;
    int32_t v = s->rank + 1, sum = 0;
    float f = 1.0f, fsum = 0.0f;
    int sr = -1, ss = 0, bad = 0;

    memset(&uid, 0, sizeof(uid));
    if (s->rank == 0 && (st = shoal_get_unique_id(&uid)) != SHOAL_OK) {
        fprintf(stderr, "soak: cycle %ld: shoal_get_unique_id: %s\n", cyc, shoal_strerror(st));
        memset(&uid, 0, sizeof(uid)); /* the others then fail to join and say so */
    }
    st = shoal_broadcast(&uid, &uid, sizeof(uid), SHOAL_UINT8, 0, s->comm, NULL);
    if (st != SHOAL_OK)
        return -1;
    st = shoal_comm_init(&c, s->n, s->rank, &uid, NULL);
    memset(&uid, 0, sizeof(uid));
    if (st != SHOAL_OK) {
        fprintf(stderr, "soak rank %d: cycle %ld: init: %s\n", s->rank, cyc, shoal_strerror(st));
        return -1;
    }
    st = shoal_allreduce(&v, &sum, 1, SHOAL_INT32, SHOAL_SUM, c, NULL);
    bad |= st != SHOAL_OK || sum != s->n * (s->n + 1) / 2;
    /* Two halves, reversed order inside each. */
    st = shoal_comm_split(c, s->rank % 2, -s->rank, &sc);
    if (st != SHOAL_OK || sc == NULL) {
        fprintf(stderr, "soak rank %d: cycle %ld: split: %s\n", s->rank, cyc, shoal_strerror(st));
        bad = 1;
    } else {
        shoal_comm_rank(sc, &sr);
        shoal_comm_size(sc, &ss);
        bad |= ss != (s->n + 1 - s->rank % 2) / 2;
        st = shoal_iallreduce(&f, &fsum, 1, SHOAL_FLOAT32, SHOAL_SUM, sc, &req);
        if (st == SHOAL_OK)
            st = soak_wait(&req);
        bad |= st != SHOAL_OK || fsum != (float)ss;
    }
    soak_shm_scan(nm);
    if (sc != NULL)
        bad |= shoal_comm_destroy(sc) != SHOAL_OK;
    bad |= shoal_comm_destroy(c) != SHOAL_OK;
    return bad ? -1 : 0;
}

/* Every rank's value combined with MAX on the world communicator. */
static long soak_max(soak_t *s, long v)
{
    int64_t in = v, out = v;
    if (shoal_allreduce(&in, &out, 1, SHOAL_INT64, SHOAL_MAX, s->comm, NULL) != SHOAL_OK)
        return LONG_MAX;
    return (long)out;
}

static int soak_tap_n;
static int soak_tap(soak_t *s, int ok, const char *desc)
{
    if (s->rank == 0)
        printf("%s - %s\n", ok ? "ok" : "not ok", desc);
    soak_tap_n++;
    return ok;
}

int main(int argc, char **argv)
{
    long ncolls = argc > 1 ? atol(argv[1]) : 2000, ncycles = argc > 2 ? atol(argv[2]) : 30;
    long warm = ncolls / 10 < 1000 ? ncolls / 10 : 1000, wrong = 0, i;
    long rss0 = 0, rss1 = 0, rss_max = 0, fd0 = 0, fd1 = 0, th0, th1, fdc0, fdc1, left;
    long shm_all0, shm_all1;
    soak_names_t nm = {0};
    soak_t s = {0};
    double t0, t1, t2;
    char desc[512];

    if (shoal_comm_init_env(&s.comm, NULL) != SHOAL_OK) {
        fprintf(stderr, "soak: shoal_comm_init_env failed\n");
        return 1;
    }
    shoal_comm_rank(s.comm, &s.rank);
    shoal_comm_size(s.comm, &s.n);
    s.in = malloc(sizeof(int32_t) * SOAK_MAX_COUNT * (size_t)s.n);
    s.out = malloc(sizeof(int32_t) * SOAK_MAX_COUNT * (size_t)s.n);
    s.fin = malloc(sizeof(float) * SOAK_MAX_COUNT);
    s.fout = malloc(sizeof(float) * SOAK_MAX_COUNT);
    if (s.in == NULL || s.out == NULL || s.fin == NULL || s.fout == NULL)
        return 1;
    memset(s.in, 0, sizeof(int32_t) * SOAK_MAX_COUNT * (size_t)s.n);
    memset(s.out, 0, sizeof(int32_t) * SOAK_MAX_COUNT * (size_t)s.n);

    /* (a) */
    t0 = soak_now();
    for (i = 0; i < ncolls; i++) {
        if (i == warm) {
            rss0 = rss_max = soak_rss_kb();
            fd0 = soak_fds();
        }
        if (soak_one(&s, i) != 0 && wrong++ < 5)
            fprintf(stderr, "soak rank %d: collective %ld is wrong\n", s.rank, i);
        if (i > warm && i % 1000 == 0) {
            long r = soak_rss_kb();
            rss_max = r > rss_max ? r : rss_max;
        }
    }
    t1 = soak_now();
    rss1 = soak_rss_kb();
    rss_max = rss1 > rss_max ? rss1 : rss_max;
    fd1 = soak_fds();
    if (s.rank == 0)
        printf("# (a) %ld collectives on %d ranks in %.1f s (%.1f us each); rank 0: RSS %ld KiB "
               "after %ld warm-up calls, %ld KiB at the end (max %ld); fds %ld -> %ld\n",
               ncolls, s.n, t1 - t0, 1e6 * (t1 - t0) / (double)(ncolls > 0 ? ncolls : 1), rss0,
               warm, rss1, rss_max, fd0, fd1);
    snprintf(desc, sizeof(desc), "%ld mixed collectives (7 kinds, 1..%d elements) all right",
             ncolls, SOAK_MAX_COUNT);
    soak_tap(&s, soak_max(&s, wrong) == 0, desc);
    snprintf(desc, sizeof(desc), "resident set flat after the warm-up (max growth over ranks "
             "%ld KiB, bound %d)", soak_max(&s, rss_max - rss0), SOAK_RSS_BOUND_KB);
    soak_tap(&s, soak_max(&s, rss_max - rss0) < SOAK_RSS_BOUND_KB, desc);
    snprintf(desc, sizeof(desc), "open descriptors flat (max growth over ranks %ld)",
             soak_max(&s, fd1 - fd0));
    soak_tap(&s, soak_max(&s, fd1 - fd0) == 0, desc);

    /* (b) */
    fdc0 = soak_fds();
    th0 = soak_threads();
    shm_all0 = soak_shm_all();
    wrong = 0;
    for (i = 0; i < ncycles; i++) {
        if (soak_cycle(&s, i, &nm) != 0 && wrong++ < 5)
            fprintf(stderr, "soak rank %d: cycle %ld failed\n", s.rank, i);
    }
    /* The root threads are detached: give the last one a moment to end. */
    for (int k = 0; k < 500 && soak_threads() > th0; k++)
        usleep(10000);
    shoal_barrier(s.comm, NULL);
    t2 = soak_now();
    fdc1 = soak_fds();
    th1 = soak_threads();
    left = soak_shm_left(&nm);
    shm_all1 = soak_shm_all();
    if (s.rank == 0)
        printf("# (b) %ld init/split/destroy cycles in %.1f s (%.1f ms each); rank 0: fds %ld "
               "-> %ld, threads %ld -> %ld, %zu /dev/shm names of the job seen, %ld left; "
               "/dev/shm shoal* entries (any job) %ld -> %ld; RSS %ld KiB\n",
               ncycles, t2 - t1, 1e3 * (t2 - t1) / (double)(ncycles > 0 ? ncycles : 1), fdc0,
               fdc1, th0, th1, nm.n, left, shm_all0, shm_all1, soak_rss_kb());
    snprintf(desc, sizeof(desc), "%ld init/split/destroy cycles all right", ncycles);
    soak_tap(&s, soak_max(&s, wrong) == 0, desc);
    snprintf(desc, sizeof(desc), "no descriptor left behind (max over ranks %ld)",
             soak_max(&s, fdc1 - fdc0));
    soak_tap(&s, soak_max(&s, fdc1 - fdc0) == 0, desc);
    snprintf(desc, sizeof(desc), "no thread left behind (max over ranks %ld)",
             soak_max(&s, th1 - th0));
    soak_tap(&s, soak_max(&s, th1 - th0) == 0, desc);
    snprintf(desc, sizeof(desc), "no /dev/shm entry of the job left behind (%ld names seen by "
             "rank 0)", (long)nm.n);
    soak_tap(&s, soak_max(&s, left) == 0, desc);
    fflush(stdout);
    free(nm.names);
    free(s.in);
    free(s.out);
    free(s.fin);
    free(s.fout);
    return shoal_comm_destroy(s.comm) == SHOAL_OK ? 0 : 1;
}
