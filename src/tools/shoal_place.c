/*
 * shoal-place: where each queued job's ranks go on a Slurm cluster (src/sched).
 *
 *   shoal-place --slurm-conf slurm.conf [--topology topology.conf] --jobs jobs.txt
 *               [--explain] [--no-preempt] [--policy shoal|first-fit|slurm-tree]
 *               [--uplink-cost X] [--hwloc NAME=FILE]... [--out DIR]
 *               [--usage FILE [--usage-half-life SECONDS] [--usage-now T]]
 *               [--job NAME --print KIND]
 *   shoal-place simulate [--seed N] [--jobs N] [--tenants N] [--leaves N]
 *               [--hosts-per-leaf N] [--gpus N] [--load X] [--no-preempt] [--out DIR]
 *   shoal-place hostlist expand|compress EXPR
 *
 * --hwloc NAME=FILE takes node NAME's CPUs, memory and GPUs from hwloc XML (after slurm.conf,
 * before topology.conf). Prints one line per decision (place / preempt / pending; --explain
 * adds why). --out DIR (made if missing)
 * writes DIR/<job>.{nodelist,slurm_hostfile,ompi_hostfile,rankfile,gpus,ring} for every job
 * placed; --job NAME --print KIND prints one of them (e.g. for sbatch --nodelist=$(...)), and
 * with --explain the plan and its reasons on stderr.
 * --usage FILE: past GPU-seconds per tenant (shoal-bill usage --csv, or tenant,gpu_seconds[,end])
 * decayed with the half-life (default 7 days; end is unix seconds, age from --usage-now or the
 * clock) and added to the order of service of weighted DRF (src/sched/sched_usage.c).
 * Exit status: 0 done, 1 an input or output error, 2 usage (also a --job the jobs file does
 * not name), 3 --job was not placed.
 */
#include "sched/sched.h"

#include <errno.h>
#include <math.h>
#include <getopt.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void shoal_place_usage(FILE *fp)
{
    fprintf(fp,
            "usage: shoal-place --slurm-conf FILE [--topology FILE] --jobs FILE [--explain]\n"
            "                   [--no-preempt] [--policy shoal|first-fit|slurm-tree]\n"
            "                   [--uplink-cost X] [--hwloc NAME=FILE]... [--out DIR]\n"
            "                   [--usage FILE [--usage-half-life SECONDS] [--usage-now T]]\n"
            "                   [--job NAME --print KIND]\n"
            "       shoal-place simulate [--seed N] [--jobs N] [--tenants N] [--leaves N]\n"
            "                   [--hosts-per-leaf N] [--gpus N] [--load X] [--no-preempt]\n"
            "                   [--out DIR]\n"
            "       shoal-place hostlist expand|compress EXPR\n"
            "KIND: nodelist slurm_hostfile ompi_hostfile rankfile gpus ring\n");
}

/* A whole number of option opt in lo..hi (the whole text: "20abc" is not 20); -1 with the
 * option and its range said otherwise. */
static int shoal_place_int(const char *opt, const char *s, int lo, int hi, int *v_p)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "shoal-place: --%s takes an integer %d..%d, not '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *v_p = (int)v;
    return 0;
}

/* A finite number of option opt in lo..hi; -1 with the option and its range said otherwise. */
static int shoal_place_num(const char *opt, const char *s, double lo, double hi, double *v_p)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "shoal-place: --%s takes a number %g..%g, not '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *v_p = v;
    return 0;
}

/* --seed: 0..2^64-1, decimal or 0x hex (strtoull alone takes "-1" and "xyz"). */
static int shoal_place_seed(const char *s, uint64_t *v_p)
{
    unsigned long long v;
    char *end;

    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || strchr(s, '-') != NULL) {
        fprintf(stderr, "shoal-place: --seed takes an integer 0..%llu, not '%s'\n",
                (unsigned long long)UINT64_MAX, s);
        return -1;
    }
    *v_p = (uint64_t)v;
    return 0;
}

/* mkdir DIR (one level, 0755) where it is not there: --out of a plan and of a simulation. */
static int shoal_place_mkdir(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "shoal-place: --out: mkdir(%s): %s\n", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* rc, or 1 where stdout did not take everything (a full disk, /dev/full): the plan or the
 * hostlist was lost and shoal-place still exited 0, so `sbatch --nodelist=$(...)` or a script
 * went on with nothing. */
static int shoal_place_done(int rc)
{
    if ((fflush(stdout) != 0 || ferror(stdout)) && rc == 0) {
        fprintf(stderr, "shoal-place: writing to stdout failed\n");
        return 1;
    }
    return rc;
}

static int shoal_place_hostlist(int argc, char **argv)
{
    shoal_hostlist_t hl = {0};
    int rc = 0;

    if (argc == 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        shoal_place_usage(stdout);
        return 0;
    }
    if (argc != 4 || (strcmp(argv[2], "expand") != 0 && strcmp(argv[2], "compress") != 0)) {
        shoal_place_usage(stderr);
        return 2;
    }
    if (shoal_hostlist_parse(argv[3], &hl) != SHOAL_OK) {
        shoal_hostlist_free(&hl);
        return 1;
    }
    if (strcmp(argv[2], "expand") == 0) {
        char name[4096];
        for (size_t i = 0; i < hl.nhosts; i++) {
            if (shoal_hostlist_nth(&hl, i, name, sizeof(name)) >= 0) {
                printf("%s\n", name);
            }
        }
    } else {
        char *s = shoal_hostlist_ranged(&hl);
        rc = s == NULL;
        if (s != NULL) {
            printf("%s\n", s);
        }
        free(s);
    }
    shoal_hostlist_free(&hl);
    return rc;
}

static int shoal_place_simulate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"seed", required_argument, NULL, 's'}, {"jobs", required_argument, NULL, 'j'},
        {"tenants", required_argument, NULL, 't'}, {"leaves", required_argument, NULL, 'l'},
        {"hosts-per-leaf", required_argument, NULL, 'h'}, {"gpus", required_argument, NULL, 'g'},
        {"load", required_argument, NULL, 'L'}, {"out", required_argument, NULL, 'o'},
        {"no-preempt", no_argument, NULL, 'n'}, {"help", no_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    shoal_sched_sim_opts_t o = {.seed = 1, .njobs = 2000, .ntenants = 4, .leaves = 8,
                                .hosts_per_leaf = 8, .gpus_per_host = 8, .load = 0.9};
    int c, bad = 0;

    optind = 2;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': bad = shoal_place_seed(optarg, &o.seed); break;
        case 'j': bad = shoal_place_int("jobs", optarg, 1, 1000000, &o.njobs); break;
        case 't': bad = shoal_place_int("tenants", optarg, 1, 1000, &o.ntenants); break;
        case 'l': bad = shoal_place_int("leaves", optarg, 1, 256, &o.leaves); break;
        case 'h': bad = shoal_place_int("hosts-per-leaf", optarg, 1, 256, &o.hosts_per_leaf); break;
        case 'g':
            bad = shoal_place_int("gpus", optarg, 1, SHOAL_SCHED_GPU_MAX, &o.gpus_per_host);
            break;
        case 'L': bad = shoal_place_num("load", optarg, 0.001, 100, &o.load); break;
        case 'o': o.outdir = optarg; break;
        case 'n': o.no_preempt = 1; break;
        case 'H': shoal_place_usage(stdout); return 0;
        default: shoal_place_usage(stderr); return 2;
        }
        if (bad != 0)
            return 2;
    }
    if (optind != argc) {
        fprintf(stderr, "shoal-place simulate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o.outdir != NULL && shoal_place_mkdir(o.outdir) != 0)
        return 1;
    return shoal_sched_simulate_all(&o, stdout) == SHOAL_OK ? 0 : 1;
}

#define SHOAL_PLACE_HWLOC_MAX 256

typedef struct {
    const char *conf, *topo, *jobs, *out, *job, *print, *usage;
    shoal_sched_usage_t u;
    char *hwloc[SHOAL_PLACE_HWLOC_MAX]; /* NAME=FILE */
    int nhwloc;
    int explain;
    double uplink;
    shoal_sched_opts_t o;
} shoal_place_args_t;

static int shoal_place_args(int argc, char **argv, shoal_place_args_t *a)
{
    static const struct option opts[] = {
        {"slurm-conf", required_argument, NULL, 'c'}, {"topology", required_argument, NULL, 't'},
        {"jobs", required_argument, NULL, 'j'}, {"explain", no_argument, NULL, 'e'},
        {"no-preempt", no_argument, NULL, 'n'}, {"policy", required_argument, NULL, 'p'},
        {"uplink-cost", required_argument, NULL, 'u'}, {"out", required_argument, NULL, 'o'},
        {"job", required_argument, NULL, 'J'}, {"print", required_argument, NULL, 'P'},
        {"hwloc", required_argument, NULL, 'W'}, {"help", no_argument, NULL, 'H'},
        {"usage", required_argument, NULL, 'U'},
        {"usage-half-life", required_argument, NULL, 'h'},
        {"usage-now", required_argument, NULL, 'N'},
        {NULL, 0, NULL, 0},
    };
    int c;
    char *end;

    memset(a, 0, sizeof(*a));
    a->o.preempt = 1;
    a->u.half_life = SHOAL_SCHED_USAGE_HALF_LIFE_DEFAULT;
    a->u.now = (double)time(NULL);
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': a->conf = optarg; break;
        case 't': a->topo = optarg; break;
        case 'j': a->jobs = optarg; break;
        case 'e': a->explain = 1; break;
        case 'n': a->o.preempt = 0; break;
        case 'u':
            if (shoal_place_num("uplink-cost", optarg, 0.001, 1000, &a->uplink) != 0)
                return 2;
            break;
        case 'o': a->out = optarg; break;
        case 'J': a->job = optarg; break;
        case 'P': a->print = optarg; break;
        case 'U': a->usage = optarg; break;
        case 'h':
        case 'N': {
            double v = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !isfinite(v) || (c == 'h' ? !(v > 0) : v < 0)) {
                fprintf(stderr, "shoal-place: --%s %s: expected %s\n",
                        c == 'h' ? "usage-half-life" : "usage-now", optarg,
                        c == 'h' ? "seconds > 0" : "unix seconds");
                return 2;
            }
            *(c == 'h' ? &a->u.half_life : &a->u.now) = v;
            break;
        }
        case 'W':
            if (a->nhwloc == SHOAL_PLACE_HWLOC_MAX || strchr(optarg, '=') == NULL) {
                fprintf(stderr, "shoal-place: --hwloc NAME=FILE (at most %d)\n",
                        SHOAL_PLACE_HWLOC_MAX);
                return 2;
            }
            /* one host: a hostlist ("node[01-02]=FILE") became a host of that name, and a
             * job placed "on one host" that Slurm reads as several */
            if (strcspn(optarg, "[], \t") < (size_t)(strchr(optarg, '=') - optarg)) {
                fprintf(stderr, "shoal-place: --hwloc %s: NAME is one host name, not a "
                        "hostlist\n", optarg);
                return 2;
            }
            a->hwloc[a->nhwloc++] = optarg;
            break;
        case 'p':
            a->o.policy = strcmp(optarg, "shoal") == 0       ? SHOAL_SCHED_POLICY_SHOAL
                          : strcmp(optarg, "first-fit") == 0  ? SHOAL_SCHED_POLICY_FIRST_FIT
                          : strcmp(optarg, "slurm-tree") == 0 ? SHOAL_SCHED_POLICY_SLURM
                                                              : -1;
            if (a->o.policy < 0) {
                fprintf(stderr, "shoal-place: --policy %s: expected shoal, first-fit or "
                        "slurm-tree\n", optarg);
                shoal_place_usage(stderr);
                return 2;
            }
            break;
        case 'H': shoal_place_usage(stdout); return 0;
        default: shoal_place_usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "shoal-place: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    /* each says what is wrong: the usage alone named none of them */
    if (a->conf == NULL || a->jobs == NULL) {
        fprintf(stderr, "shoal-place: --slurm-conf and --jobs are required\n");
    } else if ((a->job == NULL) != (a->print == NULL)) {
        fprintf(stderr, "shoal-place: --job and --print go together\n");
    } else if (a->print != NULL && shoal_sched_out_kind(a->print) < 0) {
        fprintf(stderr, "shoal-place: --print %s: expected one of", a->print);
        for (int k = 0; shoal_sched_out_names[k] != NULL; k++) {
            fprintf(stderr, " %s", shoal_sched_out_names[k]);
        }
        fprintf(stderr, "\n");
    } else {
        return -1;
    }
    shoal_place_usage(stderr);
    return 2;
}

/* --hwloc NAME=FILE: the host's CPUs, memory and GPUs from hwloc XML (stderr says what). */
static shoal_status_t shoal_place_hwloc(shoal_sched_cluster_t *c, const char *arg)
{
#if SHOAL_HAVE_HWLOC
    char name[SHOAL_SCHED_NAME_MAX], summary[768];
    const char *eq = strchr(arg, '=');
    size_t len = (size_t)(eq - arg);

    if (len == 0 || len >= sizeof(name)) {
        fprintf(stderr, "shoal-place: --hwloc %s: the node name is empty or too long\n", arg);
        return SHOAL_ERR_INVALID_ARG;
    }
    memcpy(name, arg, len);
    name[len] = '\0';
    SHOAL_CHECK(shoal_sched_hwloc_node(c, name, eq + 1, summary, sizeof(summary)));
    fprintf(stderr, "shoal-place: hwloc %s\n", summary);
    return SHOAL_OK;
#else
    (void)c;
    fprintf(stderr, "shoal-place: --hwloc %s: built without hwloc (libhwloc-dev)\n", arg);
    return SHOAL_ERR_UNSUPPORTED;
#endif
}

static shoal_status_t shoal_place_load(shoal_place_args_t *a, shoal_sched_cluster_t *c,
                                       shoal_sched_queue_t *q)
{
    char *text = NULL;
    shoal_status_t st = shoal_sched_read_file(a->conf, &text);

    if (st == SHOAL_OK) {
        st = shoal_sched_slurm_conf_parse(text, a->conf, c);
    }
    free(text);
    text = NULL;
    for (int i = 0; st == SHOAL_OK && i < a->nhwloc; i++) {
        st = shoal_place_hwloc(c, a->hwloc[i]);
    }
    if (st == SHOAL_OK && a->topo != NULL) {
        st = shoal_sched_read_file(a->topo, &text);
        if (st == SHOAL_OK) {
            st = shoal_sched_topology_parse(text, a->topo, c);
        }
        free(text);
        text = NULL;
    }
    c->uplink_cost = a->uplink;
    if (st == SHOAL_OK) {
        st = shoal_sched_cluster_finish(c);
    }
    if (st == SHOAL_OK) {
        st = shoal_sched_read_file(a->jobs, &text);
    }
    if (st == SHOAL_OK) {
        st = shoal_sched_jobs_parse(text, a->jobs, c, q);
    }
    free(text);
    text = NULL;
    if (st == SHOAL_OK && a->usage != NULL) {
        st = shoal_sched_read_file(a->usage, &text);
        if (st == SHOAL_OK) {
            st = shoal_sched_usage_parse(text, a->usage, c, q, &a->u);
        }
        free(text);
    }
    return st;
}

int main(int argc, char **argv)
{
    shoal_place_args_t a;
    shoal_sched_cluster_t c = {0};
    shoal_sched_queue_t q = {0};
    shoal_sched_plan_t plan = {0};
    int rc;

    if (argc > 1 && strcmp(argv[1], "hostlist") == 0) {
        return shoal_place_done(shoal_place_hostlist(argc, argv));
    }
    if (argc > 1 && strcmp(argv[1], "simulate") == 0) {
        return shoal_place_done(shoal_place_simulate(argc, argv));
    }
    rc = shoal_place_args(argc, argv, &a);
    if (rc >= 0) {
        return shoal_place_done(rc);
    }
    rc = 1;
    if (shoal_place_load(&a, &c, &q) != SHOAL_OK) {
        goto out;
    }
    /* with --job --print, --explain goes to stderr (it was dropped in silence): stdout is the
     * one file, for sbatch --nodelist=$(...) */
    FILE *plan_fp = a.job == NULL ? stdout : a.explain ? stderr : NULL;
    if (a.usage != NULL && a.explain) {
        shoal_sched_usage_explain(&c, &q, &a.u, plan_fp);
    }
    if (shoal_sched_plan_round(&c, &q, &a.o, &plan) != SHOAL_OK) {
        goto out;
    }
    if (plan_fp != NULL) {
        shoal_sched_plan_print(&c, &q, &plan, a.explain, plan_fp);
    }
    /* --out with --job --print too: the files were dropped in silence there (exit 0) */
    rc = a.out != NULL && shoal_place_mkdir(a.out) != 0;
    for (int i = 0; a.out != NULL && i < plan.n && rc == 0; i++) {
        const shoal_sched_job_t *j = &q.jobs[plan.d[i].job];
        if (plan.d[i].placed && j->state == SHOAL_SCHED_RUNNING) {
            rc = shoal_sched_output_dir(&c, j, a.out) == SHOAL_OK ? 0 : 1;
        }
    }
    if (rc == 0 && a.job != NULL) {
        /* a name the jobs file does not have (a typo) is no job that waits: exit 3 made a
         * script that retries pending jobs retry it forever */
        rc = 2;
        for (int i = 0; i < q.njobs; i++) {
            if (strcmp(q.jobs[i].name, a.job) != 0) {
                continue;
            }
            rc = 3;
            if (q.jobs[i].state == SHOAL_SCHED_RUNNING) {
                rc = shoal_sched_output(&c, &q.jobs[i], shoal_sched_out_kind(a.print),
                                        stdout) == SHOAL_OK ? 0 : 1;
            }
        }
        if (rc == 2) {
            fprintf(stderr, "shoal-place: --job %s: the jobs file %s has no job named %s\n",
                    a.job, a.jobs, a.job);
        } else if (rc == 3) {
            fprintf(stderr, "shoal-place: job %s is not placed\n", a.job);
        }
    }
out:
    shoal_sched_plan_free(&plan);
    shoal_sched_queue_free(&q);
    shoal_sched_cluster_free(&c);
    return shoal_place_done(rc);
}
