/* shoal-bill: reads the billing ledger of shoald (src/agent/ledger.h).
 *   usage   [--from T] [--to T] [--tenant X] [--job J] [--csv]   usage per tenant and job
 *   verify                                                       checks the HMAC chain
 *   plot    --out FILE.png [--from T] [--to T] [--tenant X] [--metric M] [--step S]
 *   sla     --month YYYY-MM [--tenant X] [--target PERCENT] [--csv]
 * Global options: --ledger URL (default sqlite:///var/lib/shoal/ledger.db), --key-file F (the
 * ledger key, raw bytes; verify needs it). Times: ISO-8601 (2026-12-01T10:00:00Z, a date, an
 * offset +02:00) or unix seconds. A tool, not the library: it prints to stdout. Exit 0 ok,
 * 1 a broken chain (verify) or a failure, 2 usage (verify: also an unreadable ledger or key).
 * The ledger is always opened as a reader: nothing is created. */
#include "agent/shoal_bill.h"
#include "agent/ledger_int.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHOAL_BILL_DEFAULT_LEDGER "sqlite:///var/lib/shoal/ledger.db"
#define SHOAL_BILL_KEY_MAX 1024

static void shoal_bill_usage(FILE *fp)
{
    fprintf(fp,
            "usage: shoal-bill [--ledger URL] [--key-file F] COMMAND [options]\n"
            "  usage  [--from T] [--to T] [--tenant X] [--job J] [--csv]\n"
            "         usage per tenant and job: minutes billed, GPU-seconds and GPU-hours,\n"
            "         payload bytes same-host and cross-host, operations, seconds in\n"
            "         collectives (an aligned table, or CSV)\n"
            "  verify [--head SEQ:MAC]\n"
            "         recomputes the HMAC chain (needs --key-file); exit 0 intact, 1 broken\n"
            "         (the first bad seq is named); --head: a head printed by an earlier\n"
            "         verify must still be in the chain (no truncated or rewritten tail)\n"
            "  plot   --out FILE.png [--from T] [--to T] [--tenant X]\n"
            "         [--metric gpu|bytes|ops|coll] [--step SECONDS]\n"
            "         a PNG of usage over time per tenant (gnuplot)\n"
            "  sla    --month YYYY-MM [--tenant X] [--target PERCENT] [--csv]\n"
            "         minutes failed by the platform and by the tenant, and the availability\n"
            "         against the target (default 99.5%%)\n"
            "URL: sqlite:///PATH (default %s) or postgresql://USER@HOST:PORT/DB\n"
            "T: 2026-12-01T10:00:00Z (ISO-8601, UTC unless an offset is given), 2026-12-01, or\n"
            "   unix seconds. --from defaults to the beginning, --to to the end of time.\n",
            SHOAL_BILL_DEFAULT_LEDGER);
}

/* ---- arguments ----------------------------------------------------------------------------- */


/* 1 when s starts with pat, where 'D' in pat is a decimal digit and anything else itself:
 * sscanf's %2d alone also takes a sign or a blank ("2026-+1-01"). */
static int shoal_bill_shape(const char *s, const char *pat)
{
    for (; *pat != '\0'; s++, pat++) {
        if (*pat == 'D' ? !(*s >= '0' && *s <= '9') : *s != *pat)
            return 0;
    }
    return 1;
}

/* The day exists in that month (timegm would move 2026-02-30 to March 2 in silence). */
static int shoal_bill_date_ok(int y, int mo, int d)
{
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = 12};

    if (mo < 1 || mo > 12 || d < 1 || d > 31)
        return 0;
    (void)timegm(&tm);
    return tm.tm_mon == mo - 1 && tm.tm_mday == d;
}

/* ISO-8601 (date, date and time, Z or an offset) or unix seconds; -1 when malformed. */
static int shoal_bill_time_parse(const char *s, int64_t *t_p)
{
    int y, mo, d, h = 0, mi = 0, sec = 0, n = 0, oh = 0, om = 0;
    struct tm tm = {0};
    const char *p;
    char *end;

    if (*s >= '0' && *s <= '9' && strspn(s, "0123456789") == strlen(s)) {
        errno = 0;
        *t_p = strtoll(s, &end, 10);
        return errno == 0 ? 0 : -1;
    }
    if (!shoal_bill_shape(s, "DDDD-DD-DD") ||
        sscanf(s, "%4d-%2d-%2d%n", &y, &mo, &d, &n) != 3 || n != 10)
        return -1;
    p = s + n;
    if (*p == 'T' || *p == ' ') {
        if (!shoal_bill_shape(p + 1, "DD:DD") ||
            sscanf(p + 1, "%2d:%2d%n", &h, &mi, &n) != 2 || n != 5)
            return -1;
        p += 1 + n;
        if (*p == ':') {
            if (!shoal_bill_shape(p + 1, "DD") || sscanf(p + 1, "%2d%n", &sec, &n) != 1 ||
                n != 2)
                return -1;
            p += 1 + n;
            if (*p == '.')
                p += 1 + strspn(p + 1, "0123456789");
        }
    }
    if (*p == 'Z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        if (!shoal_bill_shape(p + 1, "DD:DD") ||
            sscanf(p + 1, "%2d:%2d%n", &oh, &om, &n) != 2 || n != 5 || oh > 23 || om > 59)
            return -1;
        if (*p == '-') {
            oh = -oh;
            om = -om;
        }
        p += 1 + n;
    }
    if (*p != '\0' || !shoal_bill_date_ok(y, mo, d) || h > 23 || mi > 59 || sec > 60)
        return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    *t_p = (int64_t)timegm(&tm) - (int64_t)oh * 3600 - (int64_t)om * 60;
    return 0;
}

/* [start, end) of "YYYY-MM" in UTC. */
static int shoal_bill_month_parse(const char *s, int64_t *from_p, int64_t *to_p)
{
    struct tm tm = {0};
    int y, mo, n = 0;

    if (!shoal_bill_shape(s, "DDDD-DD") || sscanf(s, "%4d-%2d%n", &y, &mo, &n) != 2 || n != 7 ||
        s[n] != '\0' || mo < 1 || mo > 12)
        return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = 1;
    *from_p = (int64_t)timegm(&tm);
    tm = (struct tm){.tm_year = y - 1900 + (mo == 12), .tm_mon = mo % 12, .tm_mday = 1};
    *to_p = (int64_t)timegm(&tm);
    return 0;
}

/* The ledger key: a file of raw bytes (shoal-cred keygen writes one). */
static int shoal_bill_key_read(const char *path, uint8_t *key, size_t *len_p)
{
    char why[512];
    int loose;

    if (shoal_secret_file_read(path, key, 16, SHOAL_BILL_KEY_MAX, len_p, &loose, why,
                               sizeof(why)) != SHOAL_OK) {
        fprintf(stderr, "shoal-bill: key file %s\n", why);
        return -1;
    }
    if (loose)
        fprintf(stderr, "shoal-bill: warning: key file %s may be read by group or others: "
                "chmod 600 it\n", path);
    return 0;
}

int shoal_bill_open(const shoal_bill_args_t *a, int need_key, shoal_ledger_t **ledger_p)
{
    uint8_t key[SHOAL_BILL_KEY_MAX];
    size_t keylen = 0;
    shoal_status_t status;

    if (need_key && a->key_file == NULL) {
        fprintf(stderr, "shoal-bill: verify needs the ledger key (--key-file F)\n");
        return 2;
    }
    if (a->key_file != NULL && shoal_bill_key_read(a->key_file, key, &keylen) != 0)
        return 1;
    /* a reader even with the key: a mistyped URL must not create a ledger (nor tables) */
    status = shoal_ledger_open_reader(a->ledger, keylen > 0 ? key : NULL, keylen, ledger_p);
    shoal_secret_wipe(key, sizeof(key));
    if (status != SHOAL_OK) {
        fprintf(stderr, "shoal-bill: cannot open the ledger: %s\n", shoal_strerror(status));
        return 1;
    }
    return 0;
}

/* ---- usage --------------------------------------------------------------------------------- */

/* The sums of the byte and operation counts: 128 bits. Each record's count is a uint64, and a
 * month of a busy 8-GPU job's same-host bytes is some 4e18: a TOTAL of a few such jobs went
 * past 2^64 and wrapped in silence to a small number (a bill too low, by 2^64 bytes). */
typedef unsigned __int128 shoal_bill_sum_t;

typedef struct {
    char tenant[SHOAL_LEDGER_NAME_MAX];
    char job[SHOAL_LEDGER_NAME_MAX];
    char qos_class[16];
    uint64_t minutes;
    double gpu_seconds;
    shoal_bill_sum_t bytes_same_host;
    shoal_bill_sum_t bytes_cross_host;
    shoal_bill_sum_t ops;
    double coll_seconds;
} shoal_bill_group_t;

/* A minute billed to a group: the hosts of a job write one record each for a minute, which
 * counts once. */
typedef struct {
    size_t g;
    int64_t minute;
} shoal_bill_minute_t;

typedef struct {
    shoal_bill_group_t *g;
    size_t n, cap;
    size_t last;                       /* the group hit last: records come in runs */
    shoal_bill_minute_t *m;            /* (group, minute) of each record, counted at the end */
    size_t nm, capm;
    int failed;
} shoal_bill_groups_t;

static shoal_bill_group_t *shoal_bill_group_find(shoal_bill_groups_t *gs,
                                                 const shoal_ledger_record_t *rec)
{
    shoal_bill_group_t *g;

    for (size_t k = 0; k < gs->n; k++) {
        size_t i = (gs->last + k) % gs->n;

        g = &gs->g[i];
        if (strcmp(g->tenant, rec->tenant) == 0 && strcmp(g->job, rec->job) == 0 &&
            strcmp(g->qos_class, rec->qos_class) == 0) {
            gs->last = i;
            return g;
        }
    }
    if (gs->n == gs->cap) {
        size_t cap = gs->cap != 0 ? 2 * gs->cap : 64;
        shoal_bill_group_t *ng = realloc(gs->g, cap * sizeof(*ng));

        if (ng == NULL)
            return NULL;
        gs->g = ng;
        gs->cap = cap;
    }
    g = &gs->g[gs->n];
    memset(g, 0, sizeof(*g));
    snprintf(g->tenant, sizeof(g->tenant), "%s", rec->tenant);
    snprintf(g->job, sizeof(g->job), "%s", rec->job);
    snprintf(g->qos_class, sizeof(g->qos_class), "%s", rec->qos_class);
    gs->last = gs->n++;
    return g;
}

static int shoal_bill_usage_cb(const shoal_ledger_record_t *rec, void *arg)
{
    shoal_bill_groups_t *gs = arg;
    shoal_bill_group_t *g = shoal_bill_group_find(gs, rec);

    if (g == NULL) {
        gs->failed = 1;
        return 1;
    }
    if (gs->nm == gs->capm) {
        size_t cap = gs->capm != 0 ? 2 * gs->capm : 1024;
        shoal_bill_minute_t *nm = realloc(gs->m, cap * sizeof(*nm));

        if (nm == NULL) {
            gs->failed = 1;
            return 1;
        }
        gs->m = nm;
        gs->capm = cap;
    }
    gs->m[gs->nm].g = (size_t)(g - gs->g);
    gs->m[gs->nm++].minute = rec->minute;
    g->gpu_seconds += rec->gpu_seconds;
    g->bytes_same_host += rec->bytes_same_host;
    g->bytes_cross_host += rec->bytes_cross_host;
    g->ops += rec->ops;
    g->coll_seconds += rec->coll_seconds;
    return 0;
}

static int shoal_bill_minute_cmp(const void *a, const void *b)
{
    const shoal_bill_minute_t *x = a, *y = b;

    if (x->g != y->g)
        return x->g < y->g ? -1 : 1;
    return x->minute < y->minute ? -1 : x->minute > y->minute;
}

/* Each group's distinct minutes (records of one minute from several hosts count once). */
static void shoal_bill_minutes_count(shoal_bill_groups_t *gs)
{
    if (gs->nm > 0)
        qsort(gs->m, gs->nm, sizeof(gs->m[0]), shoal_bill_minute_cmp);
    for (size_t i = 0; i < gs->nm; i++) {
        if (i == 0 || gs->m[i].g != gs->m[i - 1].g || gs->m[i].minute != gs->m[i - 1].minute)
            gs->g[gs->m[i].g].minutes++;
    }
    free(gs->m);
    gs->m = NULL;
    gs->nm = gs->capm = 0;
}

static int shoal_bill_group_cmp(const void *a, const void *b)
{
    const shoal_bill_group_t *x = a, *y = b;
    int c = strcmp(x->tenant, y->tenant);

    if (c == 0)
        c = strcmp(x->job, y->job);
    return c != 0 ? c : strcmp(x->qos_class, y->qos_class);
}

#define SHOAL_BILL_NCOLS 10
#define SHOAL_BILL_SUM_TEXT 40         /* 2^128 has 39 digits */

/* v in decimal (printf has no conversion for 128 bits). */
static const char *shoal_bill_sum_text(shoal_bill_sum_t v, char buf[SHOAL_BILL_SUM_TEXT])
{
    char *p = buf + SHOAL_BILL_SUM_TEXT - 1;

    *p = '\0';
    do {
        *--p = (char)('0' + (int)(v % 10));
        v /= 10;
    } while (v != 0);
    return p;
}

static void shoal_bill_group_cells(const shoal_bill_group_t *g, char cells[][80])
{
    char num[SHOAL_BILL_SUM_TEXT];

    snprintf(cells[0], 80, "%s", g->tenant);
    snprintf(cells[1], 80, "%s", g->job);
    snprintf(cells[2], 80, "%s", g->qos_class);
    snprintf(cells[3], 80, "%" PRIu64, g->minutes);
    snprintf(cells[4], 80, "%.3f", g->gpu_seconds);
    snprintf(cells[5], 80, "%.4f", g->gpu_seconds / 3600.0);
    snprintf(cells[6], 80, "%s", shoal_bill_sum_text(g->bytes_same_host, num));
    snprintf(cells[7], 80, "%s", shoal_bill_sum_text(g->bytes_cross_host, num));
    snprintf(cells[8], 80, "%s", shoal_bill_sum_text(g->ops, num));
    snprintf(cells[9], 80, "%.3f", g->coll_seconds);
}

static void shoal_bill_usage_print(const shoal_bill_group_t *rows, size_t n,
                                   const shoal_bill_group_t *total)
{
    static const char *const head[SHOAL_BILL_NCOLS] = {
        "TENANT", "JOB", "CLASS", "MINUTES", "GPU_SECONDS", "GPU_HOURS", "BYTES_SAME_HOST",
        "BYTES_CROSS_HOST", "OPS", "COLL_SECONDS",
    };
    int width[SHOAL_BILL_NCOLS];
    char cells[SHOAL_BILL_NCOLS][80];

    for (int c = 0; c < SHOAL_BILL_NCOLS; c++)
        width[c] = (int)strlen(head[c]);
    for (size_t i = 0; i <= n; i++) {
        shoal_bill_group_cells(i < n ? &rows[i] : total, cells);
        for (int c = 0; c < SHOAL_BILL_NCOLS; c++)
            width[c] = SHOAL_MAX(width[c], (int)strlen(cells[c]));
    }
    for (int c = 0; c < SHOAL_BILL_NCOLS; c++)
        printf(c < 3 ? "%-*s%s" : "%*s%s", width[c], head[c],
               c + 1 < SHOAL_BILL_NCOLS ? "  " : "\n");
    for (size_t i = 0; i <= n; i++) {
        shoal_bill_group_cells(i < n ? &rows[i] : total, cells);
        for (int c = 0; c < SHOAL_BILL_NCOLS; c++)
            printf(c < 3 ? "%-*s%s" : "%*s%s", width[c], cells[c],
                   c + 1 < SHOAL_BILL_NCOLS ? "  " : "\n");
    }
}

/* One CSV field and its separator (RFC 4180): a field that holds ',', '"', CR or LF is
 * quoted, its quotes doubled. Tenant and job names may hold ',' and '"' (credentials allow
 * any printable byte but ' ', ';' and '='). */
static void shoal_bill_csv_field(const char *s, char sep)
{
    if (strpbrk(s, ",\"\r\n") == NULL) {
        fputs(s, stdout);
    } else {
        putchar('"');
        for (; *s != '\0'; s++) {
            if (*s == '"')
                putchar('"');
            putchar(*s);
        }
        putchar('"');
    }
    putchar(sep);
}

static int shoal_bill_cmd_usage(const shoal_bill_args_t *a)
{
    shoal_bill_groups_t gs = {0};
    shoal_bill_group_t total = {.tenant = "TOTAL", .job = "-", .qos_class = "-"};
    shoal_ledger_t *ledger;
    shoal_status_t status;
    int ret;

    ret = shoal_bill_open(a, 0, &ledger);
    if (ret != 0)
        return ret;
    status = shoal_ledger_each(ledger, a->from, a->to, a->tenant, a->job, shoal_bill_usage_cb,
                               &gs);
    shoal_ledger_close(ledger);
    if (status != SHOAL_OK || gs.failed) {
        fprintf(stderr, "shoal-bill: cannot read the ledger: %s\n",
                shoal_strerror(gs.failed ? SHOAL_ERR_NO_MEMORY : status));
        free(gs.g);
        free(gs.m);
        return 1;
    }
    shoal_bill_minutes_count(&gs);
    if (gs.n > 0)
        qsort(gs.g, gs.n, sizeof(gs.g[0]), shoal_bill_group_cmp);
    for (size_t i = 0; i < gs.n; i++) {
        total.minutes += gs.g[i].minutes;
        total.gpu_seconds += gs.g[i].gpu_seconds;
        total.bytes_same_host += gs.g[i].bytes_same_host;
        total.bytes_cross_host += gs.g[i].bytes_cross_host;
        total.ops += gs.g[i].ops;
        total.coll_seconds += gs.g[i].coll_seconds;
    }
    if (a->csv) {
        printf("tenant,job,class,minutes,gpu_seconds,gpu_hours,bytes_same_host,"
               "bytes_cross_host,ops,coll_seconds\n");
        for (size_t i = 0; i < gs.n; i++) {
            const shoal_bill_group_t *g = &gs.g[i];
            char same[SHOAL_BILL_SUM_TEXT], cross[SHOAL_BILL_SUM_TEXT], ops[SHOAL_BILL_SUM_TEXT];

            shoal_bill_csv_field(g->tenant, ',');
            shoal_bill_csv_field(g->job, ',');
            shoal_bill_csv_field(g->qos_class, ',');
            printf("%" PRIu64 ",%.6f,%.6f,%s,%s,%s,%.6f\n", g->minutes, g->gpu_seconds,
                   g->gpu_seconds / 3600.0, shoal_bill_sum_text(g->bytes_same_host, same),
                   shoal_bill_sum_text(g->bytes_cross_host, cross),
                   shoal_bill_sum_text(g->ops, ops), g->coll_seconds);
        }
    } else {
        shoal_bill_usage_print(gs.g, gs.n, &total);
    }
    free(gs.g);
    return 0;
}

/* ---- verify -------------------------------------------------------------------------------- */

typedef struct {
    uint64_t seq;
    uint8_t mac[32];
    int found, same;
} shoal_bill_head_t;

static int shoal_bill_head_cb(const shoal_ledger_record_t *rec, void *arg)
{
    shoal_bill_head_t *h = arg;

    if (rec->seq != h->seq)
        return 0;
    h->found = 1;
    h->same = memcmp(rec->mac, h->mac, sizeof(h->mac)) == 0;
    return 1;
}

/* --head SEQ:MAC (a line verify printed earlier): that record is still in the chain. */
static int shoal_bill_head_check(shoal_ledger_t *ledger, const char *spec)
{
    shoal_bill_head_t h = {0};
    const char *colon = strchr(spec, ':');
    const char *end = NULL;

    if (shoal_parse_u64(spec, INT64_MAX, &h.seq, &end) != 0 || colon == NULL ||
        end != colon || h.seq == 0 || strlen(colon + 1) != 64) {
        fprintf(stderr, "shoal-bill: --head takes SEQ:MAC (64 hex digits)\n");
        return 2;
    }
    /* hex digits only: sscanf's %2x also took a sign, blanks and "0x" inside the MAC */
    if (shoal_ledger_mac_from_hex(colon + 1, h.mac) != 0) {
        fprintf(stderr, "shoal-bill: --head takes SEQ:MAC (64 hex digits)\n");
        return 2;
    }
    if (shoal_ledger_each(ledger, INT64_MIN, INT64_MAX, NULL, NULL, shoal_bill_head_cb, &h) !=
        SHOAL_OK) {
        fprintf(stderr, "shoal-bill: cannot read the ledger\n");
        return 1;
    }
    if (!h.found || !h.same) {
        printf("ledger chain BROKEN at seq %" PRIu64 " (the recorded head is %s: the tail was "
               "truncated or rewritten)\n", h.seq, h.found ? "altered" : "missing");
        return 1;
    }
    return 0;
}

static int shoal_bill_cmd_verify(const shoal_bill_args_t *a)
{
    uint8_t mac[32];
    char hex[65];
    shoal_ledger_t *ledger;
    shoal_status_t status;
    uint64_t bad = 0, seq = 0;
    int ret;

    ret = shoal_bill_open(a, 1, &ledger);
    if (ret != 0)
        return 2; /* usage, or a ledger or key that cannot be read: not a broken chain */
    /* the head verify read first: one read after it may be past what was checked */
    status = shoal_ledger_verify_head(ledger, &bad, &seq, mac);
    if (status == SHOAL_OK && a->head != NULL) {
        ret = shoal_bill_head_check(ledger, a->head);
        if (ret != 0) {
            shoal_ledger_close(ledger);
            return ret;
        }
    }
    shoal_ledger_close(ledger);
    if (status == SHOAL_ERR_AUTH) {
        printf("ledger chain BROKEN at seq %" PRIu64 " (altered, missing or reordered record)"
               "\n", bad);
        return 1;
    }
    if (status != SHOAL_OK) {
        fprintf(stderr, "shoal-bill: cannot verify the ledger: %s\n", shoal_strerror(status));
        return 1;
    }
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    printf("ledger chain ok: %" PRIu64 " records, head seq %" PRIu64 " mac %s\n", seq, seq,
           hex);
    return 0;
}

/* ---- sla ----------------------------------------------------------------------------------- */

typedef struct {
    int tenant;
    int64_t minute;
    int platform;                      /* failed_platform > 0 */
    int by_tenant;                     /* failed_tenant > 0 */
} shoal_bill_sla_min_t;

typedef struct {
    char (*names)[SHOAL_LEDGER_NAME_MAX];
    int nnames, capnames;
    shoal_bill_sla_min_t *m;
    size_t n, cap;
    int failed;
} shoal_bill_sla_t;

static int shoal_bill_sla_cb(const shoal_ledger_record_t *rec, void *arg)
{
    shoal_bill_sla_t *s = arg;
    int t;

    for (t = s->nnames - 1; t >= 0 && strcmp(s->names[t], rec->tenant) != 0; t--)
        ;
    if (t < 0) {
        if (s->nnames == s->capnames) {
            int cap = s->capnames != 0 ? 2 * s->capnames : 16;
            void *nn = realloc(s->names, (size_t)cap * sizeof(s->names[0]));

            if (nn == NULL)
                goto fail;
            s->names = nn;
            s->capnames = cap;
        }
        t = s->nnames++;
        snprintf(s->names[t], SHOAL_LEDGER_NAME_MAX, "%s", rec->tenant);
    }
    if (s->n == s->cap) {
        size_t cap = s->cap != 0 ? 2 * s->cap : 4096;
        void *nm = realloc(s->m, cap * sizeof(s->m[0]));

        if (nm == NULL)
            goto fail;
        s->m = nm;
        s->cap = cap;
    }
    s->m[s->n++] = (shoal_bill_sla_min_t){
        .tenant = t, .minute = rec->minute, .platform = rec->failed_platform > 0,
        .by_tenant = rec->failed_tenant > 0,
    };
    return 0;

fail:
    s->failed = 1;
    return 1;
}

static int shoal_bill_sla_cmp(const void *a, const void *b)
{
    const shoal_bill_sla_min_t *x = a, *y = b;

    if (x->tenant != y->tenant)
        return x->tenant < y->tenant ? -1 : 1;
    return x->minute < y->minute ? -1 : x->minute > y->minute;
}

static void shoal_bill_sla_line(const shoal_bill_args_t *a, const char *tenant, uint64_t minutes,
                                uint64_t platform, uint64_t by_tenant, int width)
{
    /* met: (minutes - platform) / minutes >= target, in integers (parts per million) */
    uint64_t target_ppm = (uint64_t)(a->target * 10000.0 + 0.5);
    int met = minutes > 0 && (minutes - platform) * 1000000u >= target_ppm * minutes;
    char avail[32];

    /* rounded down, in thousandths of a percent: "%.3f" rounded to nearest, and 6 platform
     * minutes out of 1199 (99.49958%) read "99.500%" on a line that said "missed" */
    if (minutes > 0) {
        uint64_t milli = (minutes - platform) * 100000u / minutes;

        snprintf(avail, sizeof(avail), "%" PRIu64 ".%03" PRIu64 "%%", milli / 1000,
                 milli % 1000);
    } else {
        snprintf(avail, sizeof(avail), "-");
    }
    if (a->csv) {
        shoal_bill_csv_field(tenant, ',');
        shoal_bill_csv_field(a->month, ',');
        printf("%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%s,%.3f%%,%s\n", minutes, platform,
               by_tenant, avail, a->target, minutes == 0 ? "n/a" : met ? "met" : "missed");
    } else
        printf("%-*s  %-7s  %9" PRIu64 "  %15" PRIu64 "  %13" PRIu64 "  %12s  %7.3f%%  %s\n",
               width, tenant, a->month, minutes, platform, by_tenant, avail, a->target,
               minutes == 0 ? "n/a" : met ? "met" : "missed");
}

static int shoal_bill_cmd_sla(const shoal_bill_args_t *a)
{
    shoal_bill_sla_t s = {0};
    shoal_ledger_t *ledger;
    shoal_status_t status;
    int64_t from, to;
    int ret, width = 6;
    size_t i = 0;

    if (a->month == NULL || shoal_bill_month_parse(a->month, &from, &to) != 0) {
        fprintf(stderr, "shoal-bill: sla needs --month YYYY-MM\n");
        return 2;
    }
    ret = shoal_bill_open(a, 0, &ledger);
    if (ret != 0)
        return ret;
    status = shoal_ledger_each(ledger, from, to, a->tenant, NULL, shoal_bill_sla_cb, &s);
    shoal_ledger_close(ledger);
    if (status != SHOAL_OK || s.failed) {
        fprintf(stderr, "shoal-bill: cannot read the ledger: %s\n",
                shoal_strerror(s.failed ? SHOAL_ERR_NO_MEMORY : status));
        free(s.names);
        free(s.m);
        return 1;
    }
    if (s.n > 0)
        qsort(s.m, s.n, sizeof(s.m[0]), shoal_bill_sla_cmp);
    for (int t = 0; t < s.nnames; t++)
        width = SHOAL_MAX(width, (int)strlen(s.names[t]));
    if (a->csv)
        printf("tenant,month,minutes,platform_failed_minutes,tenant_failed_minutes,"
               "availability,target,sla\n");
    else
        printf("%-*s  %-7s  %9s  %15s  %13s  %12s  %8s  %s\n", width, "TENANT", "MONTH",
               "MINUTES", "PLATFORM_FAILED", "TENANT_FAILED", "AVAILABILITY", "TARGET", "SLA");
    if (s.n == 0 && a->tenant != NULL)
        shoal_bill_sla_line(a, a->tenant, 0, 0, 0, width);
    /* one line per tenant: its distinct minutes, and those with a failure of either kind */
    while (i < s.n) {
        int t = s.m[i].tenant;
        uint64_t minutes = 0, platform = 0, by_tenant = 0;

        while (i < s.n && s.m[i].tenant == t) {
            int64_t minute = s.m[i].minute;
            int pf = 0, tf = 0;

            for (; i < s.n && s.m[i].tenant == t && s.m[i].minute == minute; i++) {
                pf |= s.m[i].platform;
                tf |= s.m[i].by_tenant;
            }
            minutes++;
            platform += (uint64_t)pf;
            by_tenant += (uint64_t)tf;
        }
        shoal_bill_sla_line(a, s.names[t], minutes, platform, by_tenant, width);
    }
    free(s.names);
    free(s.m);
    return 0;
}

/* ---- main ---------------------------------------------------------------------------------- */

/* The options each command takes (their getopt letters): any other is refused, not
 * ignored (sla --from printed the whole month and said nothing). NULL for an unknown
 * command, which main reports. */
static const char *shoal_bill_cmd_opts(const char *cmd)
{
    static const char *const cmds[][2] = {
        {"usage", "ftTJc"}, {"verify", "H"}, {"plot", "oftTms"}, {"sla", "MTgc"},
    };
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(cmds); i++) {
        if (strcmp(cmd, cmds[i][0]) == 0) {
            return cmds[i][1];
        }
    }
    return NULL;
}

static int shoal_bill_parse(int argc, char **argv, shoal_bill_args_t *a)
{
    static const struct option opts[] = {
        {"from", required_argument, NULL, 'f'},   {"to", required_argument, NULL, 't'},
        {"tenant", required_argument, NULL, 'T'}, {"job", required_argument, NULL, 'J'},
        {"csv", no_argument, NULL, 'c'},          {"out", required_argument, NULL, 'o'},
        {"metric", required_argument, NULL, 'm'}, {"step", required_argument, NULL, 's'},
        {"month", required_argument, NULL, 'M'},  {"target", required_argument, NULL, 'g'},
        {"head", required_argument, NULL, 'H'},   {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char *end;
    int c;

    const char *takes = shoal_bill_cmd_opts(argv[0]);
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        if (takes != NULL && c != 'h' && c != '?' && c != ':' && strchr(takes, c) == NULL) {
            const char *name = "?";
            for (size_t i = 0; opts[i].name != NULL; i++) {
                name = opts[i].val == c ? opts[i].name : name;
            }
            fprintf(stderr, "shoal-bill: %s does not take --%s (see shoal-bill --help)\n",
                    argv[0], name);
            return 2;
        }
        switch (c) {
        case 'f':
        case 't':
            if (shoal_bill_time_parse(optarg, c == 'f' ? &a->from : &a->to) != 0) {
                fprintf(stderr, "shoal-bill: bad time '%s' (2026-12-01T10:00:00Z or unix "
                        "seconds)\n", optarg);
                return 2;
            }
            break;
        case 'T': a->tenant = optarg; break;
        case 'J': a->job = optarg; break;
        case 'c': a->csv = 1; break;
        case 'o': a->out = optarg; break;
        case 'M': a->month = optarg; break;
        case 'H': a->head = optarg; break;
        case 'm':
            if (strcmp(optarg, "gpu") != 0 && strcmp(optarg, "bytes") != 0 &&
                strcmp(optarg, "ops") != 0 && strcmp(optarg, "coll") != 0) {
                fprintf(stderr, "shoal-bill: --metric is gpu, bytes, ops or coll\n");
                return 2;
            }
            a->metric = optarg;
            break;
        case 's':
            a->step = strtoll(optarg, &end, 10);
            if (*end != '\0' || a->step <= 0) {
                fprintf(stderr, "shoal-bill: --step takes a number of seconds > 0\n");
                return 2;
            }
            break;
        case 'g':
            a->target = strtod(optarg, &end);
            if (*end != '\0' || !(a->target > 0 && a->target <= 100)) {
                fprintf(stderr, "shoal-bill: --target takes a percentage in (0, 100]\n");
                return 2;
            }
            break;
        case 'h': shoal_bill_usage(stdout); return 3;
        default: shoal_bill_usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "shoal-bill: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (a->from >= a->to) {
        fprintf(stderr, "shoal-bill: --from must be before --to\n");
        return 2;
    }
    return 0;
}

/* The report reached stdout in full: one cut short (a full disk) exited 0, and a billing
 * script took the truncated CSV for the whole month. ret: the command's exit code. */
static int shoal_bill_output_check(int ret)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "shoal-bill: cannot write the report to stdout: %s\n",
                strerror(errno));
        return ret == 0 ? 1 : ret;
    }
    return ret;
}

int main(int argc, char **argv)
{
    static const struct option gopts[] = {
        {"ledger", required_argument, NULL, 'l'}, {"key-file", required_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    shoal_bill_args_t a = {
        .ledger = SHOAL_BILL_DEFAULT_LEDGER, .from = INT64_MIN, .to = INT64_MAX,
        .metric = "gpu", .target = 99.5,
    };
    const char *cmd;
    int c, ret;

    shoal_config_global_init(); /* SHOAL_DEBUG for the ledger's log lines */
    while ((c = getopt_long(argc, argv, "+l:k:h", gopts, NULL)) != -1) {
        switch (c) {
        case 'l':
            a.ledger = shoal_ledger_url_arg(optarg, "shoal-bill");
            if (a.ledger == NULL) {
                fprintf(stderr, "shoal-bill: out of memory\n");
                return 1;
            }
            break;
        case 'k': a.key_file = optarg; break;
        case 'h': shoal_bill_usage(stdout); return 0;
        default: shoal_bill_usage(stderr); return 2;
        }
    }
    if (optind >= argc) {
        shoal_bill_usage(stderr);
        return 2;
    }
    cmd = argv[optind];
    ret = shoal_bill_parse(argc - optind, argv + optind, &a);
    if (ret != 0)
        return ret == 3 ? 0 : ret;
    if (strcmp(cmd, "usage") == 0) {
        ret = shoal_bill_cmd_usage(&a);
    } else if (strcmp(cmd, "verify") == 0) {
        ret = shoal_bill_cmd_verify(&a);
    } else if (strcmp(cmd, "plot") == 0) {
        ret = shoal_bill_cmd_plot(&a);
    } else if (strcmp(cmd, "sla") == 0) {
        ret = shoal_bill_cmd_sla(&a);
    } else {
        fprintf(stderr, "shoal-bill: unknown command '%s'\n", cmd);
        shoal_bill_usage(stderr);
        return 2;
    }
    return shoal_bill_output_check(ret);
}
