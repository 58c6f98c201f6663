/* A ledger for the agent's tests (ledger.h), until the SQLite/PostgreSQL store is merged:
 * URL mem:///path. Records and cursors are appended to the text file path, one line each,
 * in one write per commit (so a restarted agent finds its cursors, and the tests read what
 * was billed):
 *   R tenant job class minute gpu_seconds same cross ops coll_seconds fp ft seq
 *   C key n c0 c1 ...            (the last line of a key wins)
 * While the file path.down exists, open and commit fail with SHOAL_ERR_TRANSPORT (a database
 * that is down). No HMAC chain: verify checks the sequence only. Test code, not the product. */
#include "agent/ledger.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct shoal_ledger {
    char path[4096];
    char down[4200];
    uint64_t seq;
};

static int ledger_mem_down(const shoal_ledger_t *l)
{
    return access(l->down, F_OK) == 0;
}

shoal_status_t shoal_ledger_open(const char *url, const uint8_t *key, size_t keylen,
                                 shoal_ledger_t **ledger_p)
{
    shoal_ledger_t *l;
    FILE *fp;
    char line[1024];

    (void)key;
    (void)keylen;
    if (strncmp(url, "mem://", 6) != 0 || url[6] != '/')
        return SHOAL_ERR_UNSUPPORTED;
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return SHOAL_ERR_NO_MEMORY;
    snprintf(l->path, sizeof(l->path), "%s", url + 6);
    snprintf(l->down, sizeof(l->down), "%s.down", l->path);
    if (ledger_mem_down(l)) {
        free(l);
        return SHOAL_ERR_TRANSPORT;
    }
    fp = fopen(l->path, "re");
    if (fp != NULL) {
        while (fgets(line, sizeof(line), fp) != NULL)
            l->seq += line[0] == 'R';
        fclose(fp);
    }
    *ledger_p = l;
    return SHOAL_OK;
}

void shoal_ledger_close(shoal_ledger_t *ledger)
{
    free(ledger);
}

typedef int (*ledger_mem_line_cb_t)(const char *line, void *arg);

static void ledger_mem_scan(shoal_ledger_t *l, ledger_mem_line_cb_t cb, void *arg)
{
    char line[2048];
    FILE *fp = fopen(l->path, "re");

    if (fp == NULL)
        return;
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (cb(line, arg) != 0)
            break;
    }
    fclose(fp);
}

static int ledger_mem_parse_rec(const char *line, shoal_ledger_record_t *r)
{
    unsigned long long same, cross, ops, fp, ft, seq;
    long long minute;

    memset(r, 0, sizeof(*r));
    if (sscanf(line, "R %63s %63s %15s %lld %lf %llu %llu %llu %lf %llu %llu %llu", r->tenant,
               r->job, r->qos_class, &minute, &r->gpu_seconds, &same, &cross, &ops,
               &r->coll_seconds, &fp, &ft, &seq) != 12)
        return -1;
    r->minute = minute;
    r->bytes_same_host = same;
    r->bytes_cross_host = cross;
    r->ops = ops;
    r->failed_platform = fp;
    r->failed_tenant = ft;
    r->seq = seq;
    return 0;
}

typedef struct {
    const char *tenant, *job;
    int64_t from, to, last;
    shoal_ledger_each_cb_t cb;
    void *arg;
} ledger_mem_q_t;

static int ledger_mem_last_cb(const char *line, void *arg)
{
    ledger_mem_q_t *q = arg;
    shoal_ledger_record_t r;

    if (line[0] == 'R' && ledger_mem_parse_rec(line, &r) == 0 && strcmp(r.tenant, q->tenant) == 0 &&
        strcmp(r.job, q->job) == 0 && r.minute > q->last)
        q->last = r.minute;
    return 0;
}

int64_t shoal_ledger_last_minute(shoal_ledger_t *ledger, const char *tenant, const char *job)
{
    ledger_mem_q_t q = {.tenant = tenant, .job = job, .last = -1};

    ledger_mem_scan(ledger, ledger_mem_last_cb, &q);
    return q.last;
}

shoal_status_t shoal_ledger_commit(shoal_ledger_t *ledger, shoal_ledger_record_t *recs, size_t n,
                                   const shoal_ledger_cursor_t *cursors, size_t ncursors)
{
    size_t i, len = 0, cap = 4096 + n * 512 + ncursors * 1400;
    char *buf;
    FILE *fp;
    int k;

    if (ledger_mem_down(ledger))
        return SHOAL_ERR_TRANSPORT;
    for (i = 0; i < n; i++) {
        if (shoal_ledger_last_minute(ledger, recs[i].tenant, recs[i].job) >= recs[i].minute)
            return SHOAL_ERR_INVALID_ARG;
    }
    buf = malloc(cap);
    if (buf == NULL)
        return SHOAL_ERR_NO_MEMORY;
    for (i = 0; i < n; i++) {
        recs[i].seq = ledger->seq + i + 1;
        len += (size_t)snprintf(buf + len, cap - len,
                                "R %s %s %s %lld %.6f %llu %llu %llu %.9f %llu %llu %llu\n",
                                recs[i].tenant, recs[i].job, recs[i].qos_class,
                                (long long)recs[i].minute, recs[i].gpu_seconds,
                                (unsigned long long)recs[i].bytes_same_host,
                                (unsigned long long)recs[i].bytes_cross_host,
                                (unsigned long long)recs[i].ops, recs[i].coll_seconds,
                                (unsigned long long)recs[i].failed_platform,
                                (unsigned long long)recs[i].failed_tenant,
                                (unsigned long long)recs[i].seq);
    }
    for (i = 0; i < ncursors; i++) {
        len += (size_t)snprintf(buf + len, cap - len, "C %s %d", cursors[i].key,
                                cursors[i].ncounters);
        for (k = 0; k < cursors[i].ncounters; k++)
            len += (size_t)snprintf(buf + len, cap - len, " %llu",
                                    (unsigned long long)cursors[i].counters[k]);
        len += (size_t)snprintf(buf + len, cap - len, "\n");
    }
    fp = fopen(ledger->path, "ae");
    if (fp == NULL || fwrite(buf, 1, len, fp) != len || fflush(fp) != 0 ||
        fsync(fileno(fp)) != 0) {
        if (fp != NULL)
            fclose(fp);
        free(buf);
        return SHOAL_ERR_TRANSPORT;
    }
    fclose(fp);
    free(buf);
    ledger->seq += n;
    return SHOAL_OK;
}

typedef struct {
    const char *key;
    shoal_ledger_cursor_t *cur;
    int found;
} ledger_mem_cur_q_t;

static int ledger_mem_cursor_cb(const char *line, void *arg)
{
    ledger_mem_cur_q_t *q = arg;
    size_t klen = strlen(q->key);
    const char *p;
    char *end;
    int n, k;

    if (line[0] != 'C' || strncmp(line + 2, q->key, klen) != 0 || line[2 + klen] != ' ')
        return 0;
    p = line + 2 + klen + 1;
    n = (int)strtol(p, &end, 10);
    if (n < 0 || n > 64)
        return 0;
    memset(q->cur, 0, sizeof(*q->cur));
    snprintf(q->cur->key, sizeof(q->cur->key), "%s", q->key);
    for (k = 0; k < n; k++)
        q->cur->counters[k] = strtoull(end, &end, 10);
    q->cur->ncounters = n;
    q->found = 1;
    return 0;
}

shoal_status_t shoal_ledger_cursor(shoal_ledger_t *ledger, const char *key,
                                   shoal_ledger_cursor_t *cursor)
{
    ledger_mem_cur_q_t q = {.key = key, .cur = cursor};

    ledger_mem_scan(ledger, ledger_mem_cursor_cb, &q);
    return q.found ? SHOAL_OK : SHOAL_ERR_INVALID_ARG;
}

static int ledger_mem_each_cb(const char *line, void *arg)
{
    ledger_mem_q_t *q = arg;
    shoal_ledger_record_t r;

    if (line[0] != 'R' || ledger_mem_parse_rec(line, &r) != 0)
        return 0;
    if (r.minute < q->from || r.minute >= q->to || (q->tenant != NULL &&
        strcmp(r.tenant, q->tenant) != 0) || (q->job != NULL && strcmp(r.job, q->job) != 0))
        return 0;
    return q->cb(&r, q->arg);
}

shoal_status_t shoal_ledger_each(shoal_ledger_t *ledger, int64_t from, int64_t to,
                                 const char *tenant, const char *job, shoal_ledger_each_cb_t cb,
                                 void *arg)
{
    ledger_mem_q_t q = {.tenant = tenant, .job = job, .from = from, .to = to, .cb = cb,
                        .arg = arg};

    ledger_mem_scan(ledger, ledger_mem_each_cb, &q);
    return SHOAL_OK;
}

shoal_status_t shoal_ledger_verify(shoal_ledger_t *ledger, uint64_t *bad_seq_p)
{
    (void)ledger;
    (void)bad_seq_p;
    return SHOAL_OK;
}
