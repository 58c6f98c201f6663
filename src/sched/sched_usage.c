/*
 * Past usage for the order of service, the way Slurm's fair-share does it (priority/
 * multifactor: usage decayed with PriorityDecayHalfLife, normalized by shares): the metering
 * ledger's GPU-seconds per tenant (`shoal-bill usage --csv`), each row decayed by
 * 2^(-age / half_life) when the file says when it was used, summed per tenant and turned into
 * a share of the cluster's GPU-time over one half-life. DRF adds that share to the tenant's
 * dominant share before dividing by its weight, so a tenant that used more recently is served
 * later among equals; the running allocations, gangs, topology and preemption are untouched.
 */
#include "sched/sched.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SHOAL_SCHED_USAGE_COLS 64

double shoal_sched_usage_decay(double age, double half_life)
{
    if (!(age > 0) || !(half_life > 0)) {
        return 1.0;
    }
    return exp2(-age / half_life);
}

/* One CSV record (RFC 4180, as shoal-bill usage --csv writes it) from *pp, decoded in place
 * into at most max fields: a field in double quotes may hold ',', CR, LF and '""' (one quote);
 * blanks around a field are dropped, inside quotes kept. *pp moves past the record's line end
 * and *line counts the line ends passed. The count of fields; -1 with *why for a malformed
 * quote, -2 for more than max fields. */
static int shoal_sched_usage_record(char **pp, int *line, char **f, int max, const char **why)
{
    char *r = *pp, *w = *pp; /* decoding only shrinks: w never passes r */
    int n = 0;

    for (;;) {
        char *start = w, sep;
        while (*r == ' ' || *r == '\t') {
            r++;
        }
        if (n == max) {
            return -2;
        }
        f[n++] = start;
        if (*r == '"') {
            for (r++; *r != '"' || r[1] == '"'; r++) {
                if (*r == '\0') {
                    *why = "a quoted field is not closed";
                    return -1;
                }
                *line += *r == '\n';
                r += *r == '"'; /* "" is one quote */
                *w++ = *r;
            }
            r++;
            while (*r == ' ' || *r == '\t' || *r == '\r') {
                r++;
            }
            if (*r != ',' && *r != '\n' && *r != '\0') {
                *why = "text after a closing quote";
                return -1;
            }
        } else {
            for (; *r != ',' && *r != '\n' && *r != '\0'; r++) {
                if (*r == '"') {
                    *why = "a quote inside a field not quoted (quote the field, double the quote)";
                    return -1;
                }
                *w++ = *r;
            }
            while (w > start && (w[-1] == ' ' || w[-1] == '\t' || w[-1] == '\r')) {
                w--;
            }
        }
        sep = *r;
        *w++ = '\0';
        if (sep == '\0') {
            *pp = r;
            return n;
        }
        r++;
        if (sep == '\n') {
            (*line)++;
            *pp = r;
            return n;
        }
    }
}

static int shoal_sched_usage_num(const char *s, double *v)
{
    char *end;
    if (*s == '\0') {
        return 0;
    }
    *v = strtod(s, &end);
    return *end == '\0' && isfinite(*v) && *v >= 0;
}

static void shoal_sched_usage_note(shoal_sched_usage_t *u, const char *tenant)
{
    size_t len = strlen(u->note), tl = strlen(tenant);
    for (const char *p = u->note; (p = strstr(p, tenant)) != NULL; p++) {
        if ((p == u->note || p[-1] == ' ') && (p[tl] == '\0' || p[tl] == ' ')) {
            return; /* named already */
        }
    }
    if (len + strlen(tenant) + 8 < sizeof(u->note)) {
        snprintf(u->note + len, sizeof(u->note) - len, "%s%s", len > 0 ? " " : "", tenant);
    } else if (len + 4 < sizeof(u->note) && (len < 3 || strcmp(u->note + len - 3, "...") != 0)) {
        /* len < 3: a first name too long for the note (the test read before note[]) */
        snprintf(u->note + len, sizeof(u->note) - len, "%s...", len > 0 ? " " : "");
    }
}

shoal_status_t shoal_sched_usage_parse(const char *text, const char *src,
                                       const shoal_sched_cluster_t *c, shoal_sched_queue_t *q,
                                       shoal_sched_usage_t *u)
{
    char *copy = strdup(text);
    char *f[SHOAL_SCHED_USAGE_COLS];
    int line = 1, ncols = 0, col_tenant = -1, col_gpu = -1, col_end = -1, col_age = -1;
    shoal_status_t st = SHOAL_ERR_INVALID_ARG;
    double gpus = c->total[SHOAL_SCHED_GPU];

    if (copy == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    u->rows = u->decayed = u->unknown = 0;
    u->note[0] = '\0';
    if (!(u->half_life > 0) || !isfinite(u->half_life)) {
        shoal_error(SCHED, "%s: the half-life must be a positive number of seconds", src);
        goto out;
    }
    for (int t = 0; t < q->ntenants; t++) {
        q->tenants[t].past_gpu_s = 0;
        q->tenants[t].past = 0;
    }
    for (char *p = copy; *p != '\0';) {
        int lineno = line;
        const char *why = NULL;
        char *s = p;
        while (*s == ' ' || *s == '\t' || *s == '\r') {
            s++;
        }
        if (*s == '\n' || *s == '#') { /* a blank line, a comment */
            char *e = strchr(s, '\n');
            p = e != NULL ? e + 1 : s + strlen(s);
            line++;
            continue;
        }
        if (*s == '\0') {
            break;
        }
        int n = shoal_sched_usage_record(&p, &line, f, SHOAL_SCHED_USAGE_COLS, &why);
        if (n == -2) {
            shoal_error(SCHED, "%s:%d: more than %d columns", src, lineno,
                        SHOAL_SCHED_USAGE_COLS);
            goto out;
        }
        if (n < 0) {
            shoal_error(SCHED, "%s:%d: malformed CSV (RFC 4180): %s", src, lineno, why);
            goto out;
        }
        if (ncols == 0) { /* the header */
            ncols = n;
            for (int i = 0; i < n; i++) {
                int *col = strcmp(f[i], "tenant") == 0        ? &col_tenant
                           : strcmp(f[i], "gpu_seconds") == 0 ? &col_gpu
                           : strcmp(f[i], "end") == 0         ? &col_end
                           : strcmp(f[i], "age_seconds") == 0 ? &col_age
                                                              : NULL;
                if (col != NULL && *col >= 0) {
                    shoal_error(SCHED, "%s:%d: column %s twice", src, lineno, f[i]);
                    goto out;
                }
                if (col != NULL) {
                    *col = i;
                }
            }
            if (col_tenant < 0 || col_gpu < 0) {
                shoal_error(SCHED, "%s:%d: the header names no tenant and gpu_seconds columns "
                            "(expected the CSV of shoal-bill usage --csv, or tenant,gpu_seconds)",
                            src, lineno);
                goto out;
            }
            if (col_end >= 0 && col_age >= 0) {
                shoal_error(SCHED, "%s:%d: columns end and age_seconds both given", src, lineno);
                goto out;
            }
            continue;
        }
        if (n != ncols) {
            shoal_error(SCHED, "%s:%d: %d columns, the header has %d", src, lineno, n, ncols);
            goto out;
        }
        double gs, when = 0, age = 0;
        /* At most 1e15 (a million GPUs for 31 years): two rows of 1e308 summed to an
         * infinite past, which ties every such tenant with every other. */
        if (!shoal_sched_usage_num(f[col_gpu], &gs) || gs > 1e15) {
            shoal_error(SCHED, "%s:%d: gpu_seconds '%s' is not a number in [0, 1e15]", src,
                        lineno, f[col_gpu]);
            goto out;
        }
        if (col_end >= 0 && !shoal_sched_usage_num(f[col_end], &when)) {
            shoal_error(SCHED, "%s:%d: end '%s' is not unix seconds", src, lineno, f[col_end]);
            goto out;
        }
        if (col_age >= 0 && !shoal_sched_usage_num(f[col_age], &age)) {
            shoal_error(SCHED, "%s:%d: age_seconds '%s' is not a number >= 0", src, lineno,
                        f[col_age]);
            goto out;
        }
        if (col_end >= 0) {
            age = u->now - when; /* a period ending in the future counts fully */
        }
        if (f[col_tenant][0] == '\0') {
            shoal_error(SCHED, "%s:%d: an empty tenant", src, lineno);
            goto out;
        }
        u->rows++;
        u->decayed += col_end >= 0 || col_age >= 0;
        /* by the queue's index: a scan of every tenant for every row took 6 s of CPU for
         * 400,000 rows of 5,000 tenants, ten times that for ten times the tenants */
        int t = shoal_sched_tenant_find(q, f[col_tenant]);
        if (t < 0) {
            u->unknown++;
            shoal_sched_usage_note(u, f[col_tenant]);
            continue;
        }
        q->tenants[t].past_gpu_s += gs * shoal_sched_usage_decay(age, u->half_life);
    }
    if (ncols == 0) {
        shoal_error(SCHED, "%s: empty: expected a header line (tenant,...,gpu_seconds,...)",
                    src);
        goto out;
    }
    for (int t = 0; t < q->ntenants; t++) {
        q->tenants[t].past = gpus > 0 ? q->tenants[t].past_gpu_s / (gpus * u->half_life) : 0;
    }
    st = SHOAL_OK;
out:
    free(copy);
    return st;
}

typedef struct {
    int t;
    double key;
} shoal_sched_usage_rank_t;

static int shoal_sched_usage_rank_cmp(const void *pa, const void *pb)
{
    const shoal_sched_usage_rank_t *a = pa, *b = pb;
    if (a->key != b->key) {
        return a->key < b->key ? -1 : 1;
    }
    return a->t - b->t; /* ties: the lower tenant index, as in shoal_sched_drf_fill */
}

static void shoal_sched_usage_order(const shoal_sched_cluster_t *c,
                                    const shoal_sched_queue_t *q, shoal_sched_usage_rank_t *r,
                                    int n, int with_past, FILE *fp)
{
    for (int i = 0; i < n; i++) {
        const shoal_sched_tenant_t *t = &q->tenants[r[i].t];
        r[i].key = shoal_sched_drf_key(t->use, c->total, t->weight, with_past ? t->past : 0);
    }
    qsort(r, (size_t)n, sizeof(*r), shoal_sched_usage_rank_cmp);
    for (int i = 0; i < n; i++) {
        fprintf(fp, "%s%s (%.4f)", i > 0 ? ", " : "", q->tenants[r[i].t].name, r[i].key);
    }
    fputc('\n', fp);
}

void shoal_sched_usage_explain(const shoal_sched_cluster_t *c, const shoal_sched_queue_t *q,
                               const shoal_sched_usage_t *u, FILE *fp)
{
    shoal_sched_usage_rank_t *r = malloc(sizeof(*r) * (size_t)(q->ntenants + 1));
    unsigned char *seen = calloc((size_t)q->ntenants + 1, 1); /* tenant t listed in r */
    int n = 0;

    fprintf(fp, "usage: %d row(s), %d decayed with a half-life of %.0f s; a tenant's past "
            "share is its decayed GPU-seconds over %.0f GPUs x one half-life\n", u->rows,
            u->decayed, u->half_life, c->total[SHOAL_SCHED_GPU]);
    for (int t = 0; t < q->ntenants; t++) {
        const shoal_sched_tenant_t *x = &q->tenants[t];
        fprintf(fp, "usage: tenant %s: %.0f GPU-s after decay, past share %.4f, weight %g: "
                "+%.4f to its weighted dominant share\n", x->name, x->past_gpu_s, x->past,
                x->weight, x->past / x->weight);
    }
    if (u->unknown > 0) {
        fprintf(fp, "usage: %d row(s) of tenants not in the jobs file ignored: %s\n", u->unknown,
                u->note);
    }
    if (r == NULL || seen == NULL) {
        free(seen);
        free(r);
        return;
    }
    /* the tenants with a queued job, in the jobs' order (a flag per tenant: a scan of r per
     * job was jobs x tenants) */
    for (int i = 0; i < q->njobs; i++) {
        int t = q->jobs[i].tenant;
        if (q->jobs[i].state == SHOAL_SCHED_QUEUED && !seen[t]) {
            seen[t] = 1;
            r[n++].t = t;
        }
    }
    free(seen);
    shoal_sched_usage_rank_t *w = malloc(sizeof(*w) * (size_t)(n + 1));
    if (w == NULL) {
        free(r);
        return;
    }
    memcpy(w, r, sizeof(*r) * (size_t)n);
    fprintf(fp, "usage: order of service at the start, with past usage: ");
    shoal_sched_usage_order(c, q, r, n, 1, fp);
    fprintf(fp, "usage: order of service at the start, without it:      ");
    shoal_sched_usage_order(c, q, w, n, 0, fp);
    int same = 1;
    for (int i = 0; i < n; i++) {
        same &= r[i].t == w[i].t;
    }
    fprintf(fp, "usage: past usage %s the order of service\n", same ? "did not change"
                                                                   : "changed");
    free(w);
    free(r);
}
