/* shoal-bill plot: usage per tenant over time, drawn by gnuplot (a child process under a
 * deadline) from a data file and a script written in a private temp dir, removed after. */
#include "agent/shoal_bill.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHOAL_BILL_GNUPLOT_TIMEOUT_MS 60000
/* 9999-12-31T23:59:59Z: the last time of a four-digit year */
#define SHOAL_BILL_PLOT_TIME_MAX INT64_C(253402300799)

/* The plot's files while they exist, and gnuplot while it runs: a SIGINT, SIGTERM or SIGHUP
 * (the user's ^C, a timeout's kill) removes them before the tool dies of it (they stayed in
 * the temp dir, with the tenants' usage in them). The paths are made before the handlers are
 * set: the handler calls only async-signal-safe functions. */
static const char *const shoal_bill_tmp_files[] = {"usage.dat", "usage.gp", "usage.png"};
static char shoal_bill_tmp_path[SHOAL_ARRAY_SIZE(shoal_bill_tmp_files) + 1][4200];
static volatile sig_atomic_t shoal_bill_gnuplot_pid;
static const int shoal_bill_tmp_signals[] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction shoal_bill_tmp_saved[SHOAL_ARRAY_SIZE(shoal_bill_tmp_signals)];

static void shoal_bill_tmp_remove(void)
{
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_bill_tmp_files); i++) {
        unlink(shoal_bill_tmp_path[i]);
    }
    rmdir(shoal_bill_tmp_path[SHOAL_ARRAY_SIZE(shoal_bill_tmp_files)]);
}

static void shoal_bill_tmp_on_signal(int sig)
{
    pid_t child = shoal_bill_gnuplot_pid;
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    shoal_bill_tmp_remove();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* set = 1: the paths of dir's files, then the handlers; 0: the handlers as they were. */
static void shoal_bill_tmp_guard(const char *dir, int set)
{
    if (set) {
        size_t n = SHOAL_ARRAY_SIZE(shoal_bill_tmp_files);
        for (size_t i = 0; i < n; i++) {
            snprintf(shoal_bill_tmp_path[i], sizeof(shoal_bill_tmp_path[i]), "%s/%s", dir,
                     shoal_bill_tmp_files[i]);
        }
        snprintf(shoal_bill_tmp_path[n], sizeof(shoal_bill_tmp_path[n]), "%s", dir);
    }
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_bill_tmp_signals); i++) {
        if (set) {
            struct sigaction sa = {.sa_handler = shoal_bill_tmp_on_signal};
            sigemptyset(&sa.sa_mask);
            sigaction(shoal_bill_tmp_signals[i], &sa, &shoal_bill_tmp_saved[i]);
        } else {
            sigaction(shoal_bill_tmp_signals[i], &shoal_bill_tmp_saved[i], NULL);
        }
    }
}

/* ---- plot ---------------------------------------------------------------------------------- */

typedef struct {
    int tenant;                        /* index into names */
    int64_t bucket;                    /* the record's minute, then its step */
    double value;
} shoal_bill_point_t;

typedef struct {
    const shoal_bill_args_t *a;
    char (*names)[SHOAL_LEDGER_NAME_MAX];
    int nnames, capnames;
    shoal_bill_point_t *pts;
    size_t npts, cappts;
    int64_t step;
    int failed;
} shoal_bill_plot_t;

static double shoal_bill_metric(const char *metric, const shoal_ledger_record_t *rec)
{
    if (strcmp(metric, "bytes") == 0)
        return (double)rec->bytes_same_host + (double)rec->bytes_cross_host;
    if (strcmp(metric, "ops") == 0)
        return (double)rec->ops;
    if (strcmp(metric, "coll") == 0)
        return rec->coll_seconds;
    return rec->gpu_seconds;
}

static int shoal_bill_plot_cb(const shoal_ledger_record_t *rec, void *arg)
{
    shoal_bill_plot_t *p = arg;
    int t;

    for (t = 0; t < p->nnames && strcmp(p->names[t], rec->tenant) != 0; t++)
        ;
    if (t == p->nnames) {
        if (p->nnames == p->capnames) {
            int cap = p->capnames != 0 ? 2 * p->capnames : 16;
            void *nn = realloc(p->names, (size_t)cap * sizeof(p->names[0]));

            if (nn == NULL)
                goto fail;
            p->names = nn;
            p->capnames = cap;
        }
        snprintf(p->names[p->nnames++], SHOAL_LEDGER_NAME_MAX, "%s", rec->tenant);
    }
    if (p->npts == p->cappts) {
        size_t cap = p->cappts != 0 ? 2 * p->cappts : 1024;
        void *np = realloc(p->pts, cap * sizeof(p->pts[0]));

        if (np == NULL)
            goto fail;
        p->pts = np;
        p->cappts = cap;
    }
    p->pts[p->npts++] = (shoal_bill_point_t){
        .tenant = t,
        .bucket = rec->minute,
        .value = shoal_bill_metric(p->a->metric, rec),
    };
    return 0;

fail:
    p->failed = 1;
    return 1;
}

static int shoal_bill_point_cmp(const void *a, const void *b)
{
    const shoal_bill_point_t *x = a, *y = b;

    if (x->tenant != y->tenant)
        return x->tenant < y->tenant ? -1 : 1;
    return x->bucket < y->bucket ? -1 : x->bucket > y->bucket;
}

/* The step (--step, or the shortest of 1 min, 5 min, ... 1 day, 1 week that gives at most 500
 * steps over the records' range), then each point's minute rounded down to its step. */
static void shoal_bill_plot_buckets(shoal_bill_plot_t *p)
{
    static const int64_t steps[] = {60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                                    86400, 7 * 86400};
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    size_t k = 0;

    for (size_t i = 0; i < p->npts; i++) {
        lo = SHOAL_MIN(lo, p->pts[i].bucket);
        hi = SHOAL_MAX(hi, p->pts[i].bucket);
    }
    while (k + 1 < SHOAL_ARRAY_SIZE(steps) && (hi - lo) / steps[k] > 500)
        k++;
    p->step = p->a->step > 0 ? p->a->step : steps[k];
    for (size_t i = 0; i < p->npts; i++) {
        int64_t m = p->pts[i].bucket, r = m % p->step;

        /* rounded down, in 64 bits: (m % step + step) overflowed for a --step near 2^63 and
         * sent gnuplot times it spun on until its deadline */
        if (r < 0 && m >= INT64_MIN + p->step + r)
            r += p->step;
        p->pts[i].bucket = m - r;
    }
}

/* Runs "gnuplot script" under a deadline; 0 when it exited 0. */
static int shoal_bill_gnuplot(const char *script)
{
    char *argv[] = {"gnuplot", (char *)script, NULL};
    char why[256];

    if (shoal_child_run(argv, NULL, 0, SHOAL_BILL_GNUPLOT_TIMEOUT_MS, &shoal_bill_gnuplot_pid,
                        why, sizeof(why)) != 0) {
        fprintf(stderr, "shoal-bill: %s\n", why);
        return -1;
    }
    return 0;
}

/* A tenant's name as a gnuplot title: only characters that need no quoting. */
static void shoal_bill_title(const char *in, char *out, size_t size)
{
    size_t i;

    for (i = 0; in[i] != '\0' && i + 1 < size; i++)
        out[i] = (strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+@:",
                         in[i]) != NULL) ? in[i] : '_';
    out[i] = '\0';
}

/* dir/name as a gnuplot string in single quotes, a quote in it doubled (gnuplot's only escape
 * there). dir comes from TMPDIR: written as it was, a quote in it ended the string and the rest
 * ran as gnuplot commands (system('...') included), and a plain "/home/o'brien/tmp" failed. */
static void shoal_bill_gp_path(FILE *gp, const char *dir, const char *name)
{
    fputc('\'', gp);
    for (const char *s = dir; *s != '\0'; s++) {
        if (*s == '\'')
            fputc('\'', gp);
        fputc(*s, gp);
    }
    fprintf(gp, "/%s'", name);
}

static int shoal_bill_plot_write(const shoal_bill_plot_t *p, const char *dir)
{
    static const char *const ylabel[] = {"GPU-seconds", "payload bytes", "operations",
                                         "seconds in collectives"};
    const char *m = p->a->metric;
    int mi = strcmp(m, "bytes") == 0 ? 1 : strcmp(m, "ops") == 0 ? 2 : strcmp(m, "coll") == 0;
    char path[4096], title[SHOAL_LEDGER_NAME_MAX];
    FILE *data, *gp;
    size_t i = 0;

    snprintf(path, sizeof(path), "%s/usage.dat", dir);
    data = fopen(path, "w");
    if (data == NULL)
        return -1;
    for (int t = 0; t < p->nnames; t++) {
        fprintf(data, "# tenant %d\n", t);
        while (i < p->npts && p->pts[i].tenant == t) {
            int64_t b = p->pts[i].bucket;
            double v = 0;

            for (; i < p->npts && p->pts[i].tenant == t && p->pts[i].bucket == b; i++)
                v += p->pts[i].value;
            fprintf(data, "%" PRId64 " %.9g\n", b, v);
            /* "with steps" holds a point's value up to the next point: a step before a gap
             * without records went on over the gap, and a tenant's last step (its only one,
             * in a short range) had no width, so nothing of it was drawn. Each step ends at
             * 0 where its time ends, unless the next one starts there (and the end is a
             * time gnuplot can draw: --step may be near 2^63). */
            if (b <= SHOAL_BILL_PLOT_TIME_MAX - p->step &&
                (i == p->npts || p->pts[i].tenant != t || p->pts[i].bucket != b + p->step))
                fprintf(data, "%" PRId64 " 0\n", b + p->step);
        }
        fprintf(data, "\n\n");
    }
    if (fclose(data) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/usage.gp", dir);
    gp = fopen(path, "w");
    if (gp == NULL)
        return -1;
    fprintf(gp, "set terminal pngcairo size 1200,600 noenhanced\nset output ");
    shoal_bill_gp_path(gp, dir, "usage.png");
    fprintf(gp, "\nset xdata time\nset timefmt '%%s'\nset format x \"%%m-%%d\\n%%H:%%M\"\n"
                "set xlabel 'time (UTC)'\nset ylabel '%s per %" PRId64 " s'\n"
                "set yrange [0:*]\nset key outside right\nset grid\nplot ", ylabel[mi], p->step);
    for (int t = 0; t < p->nnames; t++) {
        shoal_bill_title(p->names[t], title, sizeof(title));
        fputs(t > 0 ? ", \\\n     " : "", gp);
        shoal_bill_gp_path(gp, dir, "usage.dat");
        fprintf(gp, " index %d using 1:2 with steps lw 2 title '%s'", t, title);
    }
    fprintf(gp, "\n");
    return fclose(gp) == 0 ? 0 : -1;
}

static int shoal_bill_copy(const char *from, const char *to)
{
    char buf[65536];
    int in, out, ret = 0;
    ssize_t n;

    in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -1;
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        close(in);
        return -1;
    }
    while ((n = read(in, buf, sizeof(buf))) > 0) {
        if (write(out, buf, (size_t)n) != n) {
            ret = -1;
            break;
        }
    }
    if (n < 0)
        ret = -1;
    close(in);
    if (close(out) != 0)
        ret = -1;
    return ret;
}

int shoal_bill_cmd_plot(const shoal_bill_args_t *a)
{
    shoal_bill_plot_t p = {.a = a};
    char dir[4000], path[4200];
    const char *tmpdir = getenv("TMPDIR");
    shoal_ledger_t *ledger;
    shoal_status_t status;
    int ret = 1;

    if (a->out == NULL) {
        fprintf(stderr, "shoal-bill: plot needs --out FILE.png\n");
        return 2;
    }
    ret = shoal_bill_open(a, 0, &ledger);
    if (ret != 0)
        return ret;
    ret = 1;
    status = shoal_ledger_each(ledger, a->from, a->to, a->tenant, NULL, shoal_bill_plot_cb, &p);
    shoal_ledger_close(ledger);
    if (status != SHOAL_OK || p.failed) {
        fprintf(stderr, "shoal-bill: cannot read the ledger: %s\n",
                shoal_strerror(p.failed ? SHOAL_ERR_NO_MEMORY : status));
        goto out;
    }
    if (p.npts == 0) {
        fprintf(stderr, "shoal-bill: no records in the range: nothing to plot\n");
        goto out;
    }
    shoal_bill_plot_buckets(&p);
    qsort(p.pts, p.npts, sizeof(p.pts[0]), shoal_bill_point_cmp);
    /* a line break cannot be quoted in a gnuplot string: such a TMPDIR is not used */
    if (tmpdir == NULL || tmpdir[0] != '/' || strlen(tmpdir) >= 3900 ||
        strpbrk(tmpdir, "\n\r") != NULL)
        tmpdir = "/tmp";
    snprintf(dir, sizeof(dir), "%s/shoal-bill.XXXXXX", tmpdir);
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "shoal-bill: mkdtemp(%s) failed: %s\n", dir, strerror(errno));
        goto out;
    }
    shoal_bill_tmp_guard(dir, 1);
    if (shoal_bill_plot_write(&p, dir) != 0) {
        fprintf(stderr, "shoal-bill: cannot write the plot files in %s: %s\n", dir,
                strerror(errno));
    } else if (shoal_bill_gnuplot((snprintf(path, sizeof(path), "%s/usage.gp", dir), path)) ==
               0) {
        snprintf(path, sizeof(path), "%s/usage.png", dir);
        if (shoal_bill_copy(path, a->out) != 0)
            fprintf(stderr, "shoal-bill: cannot write %s: %s\n", a->out, strerror(errno));
        else
            ret = 0;
    }
    shoal_bill_tmp_remove();
    shoal_bill_tmp_guard(dir, 0);
    if (ret == 0)
        printf("wrote %s: %d tenants, %s per %" PRId64 " s\n", a->out, p.nnames, a->metric,
               p.step);
out:
    free(p.names);
    free(p.pts);
    return ret;
}

