/* qos_load: one rank of a tenant's job for perf/qos_bench.sh. It runs AllReduce loops of -b
 * bytes for -s seconds (every rank stops at the same iteration: the first element of each
 * call carries a "my time is up" vote) while a sampler thread reads shoal_comm_stats at every
 * whole period of CLOCK_REALTIME (-p ms, default 1000), so the ranks of every job running at
 * once sample the same windows. One line per sample on stdout:
 *   qos job=<SHOAL_TENANT> rank=<r> t=<unix ms> sent=<bytes_sent> paced_ns=<ns> rate=<B/s>
 *       net=<bytes_sent_other_host>
 * and at the end the same with end=<unix ms> instead of t=, and "qos job=... rank=... done iters=<n> status=<name>".
 * usage: qos_load [-s seconds] [-b bytes, K/M/G] [-p period_ms] [-t transport]
 *
 * qos_load -L N: latency instead: AllReduce of 8 B, 64 B, 512 B, 4 KiB and 32 KiB, N timed
 * calls each (after N/10 untimed), every call timed on every rank; rank 0 prints, per size,
 *   lat job=<SHOAL_TENANT> size=<bytes> n=<N> p50_us=<median> p99_us=<99th percentile>
 * of the slowest rank's time per call (each rank's times are reduced with MAX).
 *
 * qos_load -w PATH -r RATE [-s seconds] stands in for the node agent instead: it writes the
 * rates page PATH (src/qos/pace_page.h) with RATE bytes/s and beats it (gen += 2) every
 * 200 ms for the given seconds, then leaves it (a silent agent).
 */
#include "perf/perf_args.h"

#include <shoal.h>
#include "qos/pace_page.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static shoal_comm_t qos_comm;
static int qos_rank;
static long qos_period_ms = 1000;
static volatile int qos_stop;
static const char *qos_job;

static uint64_t qos_now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void qos_sample(const char *what, uint64_t t_ms)
{
    shoal_stats_t s = SHOAL_STATS_INIT;
    if (shoal_comm_stats(qos_comm, &s) == SHOAL_OK) {
        printf("qos job=%s rank=%d %s=%llu sent=%llu paced_ns=%llu rate=%llu net=%llu\n",
               qos_job, qos_rank, what, (unsigned long long)t_ms,
               (unsigned long long)s.bytes_sent, (unsigned long long)s.paced_ns,
               (unsigned long long)s.pace_rate, (unsigned long long)s.bytes_sent_other_host);
    }
}

static void *qos_sampler(void *arg)
{
    uint64_t period = (uint64_t)qos_period_ms * 1000000ull;
    uint64_t next = (qos_now_ns(CLOCK_REALTIME) / period + 1) * period;
    (void)arg;
    while (!qos_stop) {
        struct timespec ts = {.tv_sec = (time_t)(next / 1000000000ull),
                              .tv_nsec = (long)(next % 1000000000ull)};
        if (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) != 0) {
            continue;
        }
        if (!qos_stop) {
            qos_sample("t", next / 1000000ull);
        }
        next += period;
    }
    return NULL;
}

/* The agent's side of the rates page: create, publish, heartbeat. */
static int qos_agent(const char *path, uint64_t rate, double seconds)
{
    char tmp[4096];
    shoal_qos_rates_page_t *pg;
    uint64_t end = qos_now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    int fd;

    snprintf(tmp, sizeof(tmp), "%s.new", path);
    fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, SHOAL_QOS_RATES_PAGE_BYTES) != 0) {
        perror(tmp);
        return 1;
    }
    pg = mmap(NULL, SHOAL_QOS_RATES_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (pg == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    pg->magic = SHOAL_QOS_RATES_MAGIC;
    pg->version = SHOAL_QOS_RATES_VERSION;
    __atomic_store_n(&pg->gen, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&pg->rate, rate, __ATOMIC_RELEASE);
    __atomic_store_n(&pg->gen, 2, __ATOMIC_RELEASE);
    if (rename(tmp, path) != 0) {
        perror(path);
        return 1;
    }
    while (qos_now_ns(CLOCK_MONOTONIC) < end) {
        usleep(200000);
        __atomic_store_n(&pg->heartbeat_ns, qos_now_ns(CLOCK_REALTIME), __ATOMIC_RELAXED);
        __atomic_store_n(&pg->gen, pg->gen + 2, __ATOMIC_RELEASE);
    }
    return 0;
}

static int qos_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* -L N: the latency loop (see the header). */
static shoal_status_t qos_latency(long n)
{
    static const size_t sizes[] = {8, 64, 512, 4096, 32768};
    float buf[32768 / sizeof(float)];
    double *t = calloc((size_t)n, sizeof(double));
    shoal_status_t st = SHOAL_OK;

    if (t == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    memset(buf, 0, sizeof(buf));
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]) && st == SHOAL_OK; k++) {
        size_t count = sizes[k] / sizeof(float);
        for (long i = -n / 10; i < n && st == SHOAL_OK; i++) {
            uint64_t t0 = qos_now_ns(CLOCK_MONOTONIC);
            st = shoal_allreduce(buf, buf, count, SHOAL_FLOAT32, SHOAL_SUM, qos_comm, NULL);
            if (i >= 0) {
                t[i] = (double)(qos_now_ns(CLOCK_MONOTONIC) - t0) * 1e-3;
            }
        }
        if (st == SHOAL_OK) {
            st = shoal_allreduce(t, t, (size_t)n, SHOAL_FLOAT64, SHOAL_MAX, qos_comm, NULL);
        }
        if (st == SHOAL_OK && qos_rank == 0) {
            qsort(t, (size_t)n, sizeof(double), qos_cmp_double);
            printf("lat job=%s size=%zu n=%ld p50_us=%.2f p99_us=%.2f\n", qos_job, sizes[k], n,
                   t[n / 2], t[(size_t)((double)n * 0.99) < (size_t)n ?
                                 (size_t)((double)n * 0.99) : (size_t)n - 1]);
        }
    }
    free(t);
    return st;
}

int main(int argc, char **argv)
{
    long lat_n = 0;
    const char *agent_path = NULL;
    uint64_t agent_rate = 0;
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    double seconds = 3;
    size_t bytes = 1 << 20, count;
    uint64_t end, iters = 0;
    shoal_status_t st;
    pthread_t th;
    float *buf;
    int opt;

    while ((opt = getopt(argc, argv, "s:b:p:t:w:r:L:")) != -1) {
        switch (opt) {
        case 's': seconds = atof(optarg); break;
        case 'b':
            if (perf_arg_size(optarg, &bytes) != 0 || bytes < 4) {
                fprintf(stderr, "qos_load: -b %s: a byte count of at least 4 expected (K, M, G: 1024s)\n",
                        optarg);
                return 2;
            }
            break;
        case 'p': qos_period_ms = atol(optarg); break;
        case 't': cfg.transport = optarg; break;
        case 'w': agent_path = optarg; break;
        case 'r':
            if (perf_arg_size(optarg, &agent_rate) != 0) {
                fprintf(stderr, "qos_load: -r %s: a rate in bytes/s expected\n", optarg);
                return 2;
            }
            break;
        case 'L': lat_n = atol(optarg); break;
        default:
            fprintf(stderr, "usage: qos_load [-s seconds] [-b bytes] [-p period_ms] "
                            "[-t transport] [-L calls]\n");
            return 2;
        }
    }
    if (agent_path != NULL) {
        return qos_agent(agent_path, agent_rate, seconds);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    qos_job = getenv("SHOAL_TENANT") != NULL ? getenv("SHOAL_TENANT") : "default";
    count = bytes / sizeof(float) > 0 ? bytes / sizeof(float) : 1;
    buf = calloc(count, sizeof(float));
    if (buf == NULL || qos_period_ms <= 0) {
        return 2;
    }
    st = shoal_comm_init_env(&qos_comm, &cfg);
    if (st != SHOAL_OK) {
        fprintf(stderr, "qos_load: shoal_comm_init_env: %s\n", shoal_strerror(st));
        return 1;
    }
    shoal_comm_rank(qos_comm, &qos_rank);
    if (lat_n > 0) {
        st = qos_latency(lat_n);
        printf("qos job=%s rank=%d done latency status=%s\n", qos_job, qos_rank,
               shoal_status_name(st));
        shoal_comm_destroy(qos_comm);
        free(buf);
        return st == SHOAL_OK ? 0 : 1;
    }
    end = qos_now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    pthread_create(&th, NULL, qos_sampler, NULL);
    for (;;) {
        buf[0] = qos_now_ns(CLOCK_MONOTONIC) >= end ? 1.0f : 0.0f;
        st = shoal_allreduce(buf, buf, count, SHOAL_FLOAT32, SHOAL_SUM, qos_comm, NULL);
        iters++;
        if (st != SHOAL_OK || buf[0] > 0) {
            break;
        }
    }
    qos_stop = 1;
    pthread_join(th, NULL);
    qos_sample("end", qos_now_ns(CLOCK_REALTIME) / 1000000ull);
    printf("qos job=%s rank=%d done iters=%llu status=%s\n", qos_job, qos_rank,
           (unsigned long long)iters, shoal_status_name(st));
    if (st != SHOAL_OK) {
        fprintf(stderr, "qos_load: rank %d: %s: %s\n", qos_rank, shoal_strerror(st),
                shoal_comm_last_error(qos_comm));
    }
    shoal_comm_destroy(qos_comm);
    free(buf);
    return st == SHOAL_OK ? 0 : 1;
}
