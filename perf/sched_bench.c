/*
 * Decision latency of the planner (src/sched): a cluster of 10,000 GPUs (1,250 hosts of 8
 * under 40 leaf switches of 32 hosts and one spine), half of it busy with running jobs, and
 * 1,000 queued jobs of 1..64 GPUs from 20 tenants (30% spot; --tenants N spreads the jobs over
 * N, where DRF's choice of the next tenant is what costs). One decision = one full
 * planning round over the whole queue (DRF order, gang placement, preemption); each round
 * starts from the same state. Prints p50 / p99 / max in ms over --rounds rounds, of the wall
 * time and of the planning thread's CPU time (the two differ on a machine shared with others).
 *   perf/sched_bench [--rounds N] [--gpus N] [--queue N] [--tenants N] [--seed N]
 */
#include "sched/sched.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double sched_bench_now_ms(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int sched_bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Appends to the text *t (*len bytes, *cap allocated), growing it: the text was a fixed 4 MiB,
 * and a queue of 100,000 jobs (6 MB) wrote past its end (cap - len wrapped around). 0, or -1
 * without memory (*t freed and NULL). */
static int sched_bench_cat(char **t, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int sched_bench_cat(char **t, size_t *len, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    int n;

    for (;;) {
        va_start(ap, fmt);
        n = *t != NULL ? vsnprintf(*t + *len, *cap - *len, fmt, ap) : -1;
        va_end(ap);
        if (n < 0) {
            return -1;
        }
        if (*len + (size_t)n < *cap) {
            *len += (size_t)n;
            return 0;
        }
        char *nt = realloc(*t, 2 * *cap + (size_t)n);
        if (nt == NULL) {
            free(*t);
            *t = NULL;
            return -1;
        }
        *t = nt;
        *cap = 2 * *cap + (size_t)n;
    }
}

/* slurm.conf, topology.conf and the jobs file as text, then the real parsers. */
static int sched_bench_build(int gpus, int queue, int tenants, uint64_t seed,
                             shoal_sched_cluster_t *c, shoal_sched_queue_t *q)
{
    int hosts = gpus / 8, leaves = (hosts + 31) / 32, rc = 0;
    size_t cap = 1 << 22, len = 0;
    char *t = malloc(cap);
    shoal_status_t st;

    rc |= sched_bench_cat(&t, &len, &cap, "NodeName=n[0000-%04d] CPUs=128 RealMemory=1024000 "
                          "Gres=gpu:8\n", hosts - 1);
    st = rc == 0 ? shoal_sched_slurm_conf_parse(t, "bench.conf", c) : SHOAL_ERR_NO_MEMORY;
    len = 0;
    for (int l = 0; l < leaves && rc == 0; l++) {
        int lo = l * 32, hi = SHOAL_MIN(hosts, lo + 32) - 1;
        rc |= sched_bench_cat(&t, &len, &cap, "SwitchName=leaf%02d Nodes=n[%04d-%04d]\n", l,
                              lo, hi);
    }
    rc |= rc == 0 ? sched_bench_cat(&t, &len, &cap, "SwitchName=spine Switches=leaf[00-%02d]\n",
                                    leaves - 1) : 0;
    if (st == SHOAL_OK) {
        st = rc == 0 ? shoal_sched_topology_parse(t, "bench.topo", c) : SHOAL_ERR_NO_MEMORY;
    }
    if (st == SHOAL_OK) {
        st = shoal_sched_cluster_finish(c);
    }
    /* running jobs: whole hosts, about half the cluster */
    len = 0;
    for (int h = 0, k = 0; h + 2 <= hosts / 2 && rc == 0; h += 2, k++) {
        rc |= sched_bench_cat(&t, &len, &cap, "job=r%d tenant=t%d gpus=%d cpus=8 mem=32G "
                              "class=%s state=running nodes=n[%04d-%04d]\n", k, k % tenants,
                              8 + 8 * (k % 2), k % 3 == 0 ? "spot" : "reserved", h * 2 % hosts,
                              h * 2 % hosts + (k % 2));
    }
    for (int i = 0; i < queue && rc == 0; i++) {
        int g = 1 << (int)(shoal_sched_rand(&seed) % 7);
        rc |= sched_bench_cat(&t, &len, &cap, "job=q%d tenant=t%d gpus=%d cpus=8 mem=32G "
                              "class=%s\n", i,
                              (int)(shoal_sched_rand(&seed) % (uint64_t)tenants), g,
                              shoal_sched_rand(&seed) % 10 < 3 ? "spot" : "reserved");
    }
    if (st == SHOAL_OK) {
        st = rc == 0 ? shoal_sched_jobs_parse(t, "bench.jobs", c, q) : SHOAL_ERR_NO_MEMORY;
    }
    if (rc != 0) {
        fprintf(stderr, "sched_bench: out of memory for the input text\n");
    }
    free(t);
    return st == SHOAL_OK ? 0 : -1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"rounds", required_argument, NULL, 'r'}, {"gpus", required_argument, NULL, 'g'},
        {"queue", required_argument, NULL, 'q'}, {"seed", required_argument, NULL, 's'},
        {"tenants", required_argument, NULL, 't'}, {NULL, 0, NULL, 0},
    };
    int rounds = 30, gpus = 10000, queue = 1000, tenants = 20, opt, placed = 0, pre = 0;
    uint64_t seed = 7;
    double *ms;

    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        uint64_t v = 0;
        /* atoi took "1e6" as 1 and "abc" as 0, which then ended the run without a word */
        int bad = opt != 's' && (shoal_parse_u64(optarg, 1000000000, &v, NULL) != 0);

        switch (bad ? '?' : opt) {
        case 'r': rounds = (int)v; break;
        case 'g': gpus = (int)v; break;
        case 'q': queue = (int)v; break;
        case 't': tenants = (int)v; break;
        case 's':
            if (shoal_parse_u64(optarg, UINT64_MAX, &seed, NULL) == 0)
                break;
            /* fall through */
        default:
            fprintf(stderr, "usage: sched_bench [--rounds N>=1] [--gpus N>=64] [--queue N>=1] "
                    "[--tenants N>=1] [--seed N] (decimal counts)\n");
            return 2;
        }
    }
    if (rounds < 1 || gpus < 64 || queue < 1 || tenants < 1) {
        fprintf(stderr, "sched_bench: --rounds, --queue and --tenants must be at least 1, "
                "--gpus at least 64\n");
        return 2;
    }
    ms = calloc((size_t)rounds, sizeof(double));
    double *cpu = calloc((size_t)rounds, sizeof(double));
    if (ms == NULL || cpu == NULL) {
        fprintf(stderr, "sched_bench: out of memory\n");
        return 1;
    }
    for (int r = 0; r < rounds; r++) {
        shoal_sched_cluster_t c = {0};
        shoal_sched_queue_t q = {0};
        shoal_sched_plan_t plan = {0};
        shoal_sched_opts_t o = {.policy = SHOAL_SCHED_POLICY_SHOAL, .preempt = 1};
        if (sched_bench_build(gpus, queue, tenants, seed + (uint64_t)r, &c, &q) != 0) {
            fprintf(stderr, "sched_bench: building the inputs failed\n");
            return 1;
        }
        double t0 = sched_bench_now_ms(CLOCK_MONOTONIC);
        double c0 = sched_bench_now_ms(CLOCK_THREAD_CPUTIME_ID);
        if (shoal_sched_plan_round(&c, &q, &o, &plan) != SHOAL_OK) {
            return 1;
        }
        ms[r] = sched_bench_now_ms(CLOCK_MONOTONIC) - t0;
        cpu[r] = sched_bench_now_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
        placed = 0;
        pre = 0;
        for (int i = 0; i < plan.n; i++) {
            placed += plan.d[i].placed;
            pre += plan.d[i].preempted_by >= 0;
        }
        shoal_sched_plan_free(&plan);
        shoal_sched_queue_free(&q);
        shoal_sched_cluster_free(&c);
    }
    qsort(ms, (size_t)rounds, sizeof(double), sched_bench_cmp);
    qsort(cpu, (size_t)rounds, sizeof(double), sched_bench_cmp);
    printf("# sched_bench: %d GPUs, %d queued jobs, %d tenants, %d rounds (last: %d placed, %d "
           "preempted)\n", gpus, queue, tenants, rounds, placed, pre);
    printf("decision_ms p50 %.2f p99 %.2f max %.2f (wall)\n", ms[rounds / 2],
           ms[(int)(0.99 * (rounds - 1) + 0.5)], ms[rounds - 1]);
    printf("decision_cpu_ms p50 %.2f p99 %.2f max %.2f (CPU time of the planning thread: what "
           "the wall time is on an idle core)\n", cpu[rounds / 2],
           cpu[(int)(0.99 * (rounds - 1) + 0.5)], cpu[rounds - 1]);
    free(ms);
    free(cpu);
    return 0;
}
