/*
 * Slurm's hostlist expressions ("node[01-16],gpu[1-3,7]"), an exact equivalent of libslurm's
 * slurm_hostlist_create / _shift / _ranged_string on well-formed input (tests/unit/
 * test_sched_hostlist.c compares the two where libslurm is installed):
 *  - separators are ',', ' ' and tab outside brackets;
 *  - a bracket group holds comma-separated numbers or lo-hi ranges; the width of a range is the
 *    length of its lower bound as written ("[01-10]": 01..10, "[1-10]": 1..10);
 *  - a token may hold several groups but must end with one ("rack[1-2]-n[1-4]"); the group
 *    before the last one varies slowest, the first one fastest, the last one fastest of all
 *    (Slurm's order: a[1-2]b[3-4]c[5-6] gives a1b3c5 a1b3c6 a2b3c5 ...);
 *  - a plain name's trailing digits are its number ("n007": prefix n, 7, width 3);
 *  - pushing a range right after one with the same prefix, compatible zero padding and the
 *    next number extends it; nothing is sorted or deduplicated;
 *  - the ranged string brackets consecutive ranges of one prefix: n[1-3,5],login.
 * Where libslurm guesses (an unbalanced bracket, a sign or space inside brackets, a number of
 * more than 18 digits), this is an error (for names: no number). Limits: 65536 hosts per
 * range (Slurm's), SHOAL_HOSTLIST_MAX hosts per list, 1023 bytes per token.
 */
#include "sched/sched.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHOAL_HOSTLIST_RANGE_MAX 65536UL
#define SHOAL_HOSTLIST_TOKEN_MAX 1023
#define SHOAL_HOSTLIST_DIGITS_MAX 18
#define SHOAL_HOSTLIST_GROUPS_MAX 8

typedef struct {
    unsigned long lo, hi;
    int width;
} shoal_hl_num_t;

/* Zeros that padding num to width adds. */
static int shoal_hostlist_zero_padded(unsigned long num, int width)
{
    int n = 1;
    while ((num /= 10UL) != 0) {
        n++;
    }
    return width > n ? width - n : 0;
}

/* Slurm's _width_equiv: widths wn, wm of n, m are equivalent if equal, or if giving both
 * numbers either width changes neither one's padding (then the widths are made equal). */
static int shoal_hostlist_width_equiv(unsigned long n, int *wn, unsigned long m, int *wm)
{
    int npad, nmpad, mpad, mnpad;

    if (*wn == *wm) {
        return 1;
    }
    npad = shoal_hostlist_zero_padded(n, *wn);
    nmpad = shoal_hostlist_zero_padded(n, *wm);
    mpad = shoal_hostlist_zero_padded(m, *wm);
    mnpad = shoal_hostlist_zero_padded(m, *wn);
    if (npad != nmpad && mpad != mnpad) {
        return 0;
    }
    if (npad != nmpad) {
        *wm = *wn;
    } else {
        *wn = *wm;
    }
    return 1;
}

static shoal_status_t shoal_hostlist_push_range(shoal_hostlist_t *hl, const char *prefix,
                                                unsigned long lo, unsigned long hi, int width,
                                                int single)
{
    shoal_hostrange_t *tail = hl->nranges > 0 ? &hl->ranges[hl->nranges - 1] : NULL;
    size_t count = single ? 1 : (size_t)(hi - lo + 1);

    if (hl->nhosts + count > SHOAL_HOSTLIST_MAX) {
        shoal_error(SCHED, "hostlist: more than %d hosts", SHOAL_HOSTLIST_MAX);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (tail != NULL && !single && !tail->single && tail->hi + 1 == lo &&
        strcmp(tail->prefix, prefix) == 0 &&
        shoal_hostlist_width_equiv(tail->lo, &tail->width, lo, &width)) {
        tail->hi = hi;
        hl->nhosts += count;
        return SHOAL_OK;
    }
    if (hl->nranges == hl->cap) {
        int cap = hl->cap == 0 ? 8 : 2 * hl->cap;
        shoal_hostrange_t *r = realloc(hl->ranges, sizeof(*r) * (size_t)cap);
        if (r == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
        hl->ranges = r;
        hl->cap = cap;
    }
    shoal_hostrange_t *nr = &hl->ranges[hl->nranges];
    nr->prefix = strdup(prefix);
    if (nr->prefix == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    nr->lo = single ? 0 : lo;
    nr->hi = single ? 0 : hi;
    nr->width = single ? 0 : width;
    nr->single = single;
    hl->nranges++;
    hl->nhosts += count;
    return SHOAL_OK;
}

shoal_status_t shoal_hostlist_push_host(shoal_hostlist_t *hl, const char *host)
{
    size_t len = strlen(host), p = len;
    char prefix[SHOAL_HOSTLIST_TOKEN_MAX + 1];

    if (len == 0 || len > SHOAL_HOSTLIST_TOKEN_MAX) {
        shoal_error(SCHED, "hostlist: host name of %zu bytes", len);
        return SHOAL_ERR_INVALID_ARG;
    }
    while (p > 0 && isdigit((unsigned char)host[p - 1])) {
        p--;
    }
    memcpy(prefix, host, p);
    prefix[p] = '\0';
    if (p == len || len - p > SHOAL_HOSTLIST_DIGITS_MAX) {
        return shoal_hostlist_push_range(hl, host, 0, 0, 0, 1);
    }
    unsigned long num = strtoul(host + p, NULL, 10);
    return shoal_hostlist_push_range(hl, prefix, num, num, (int)(len - p), 0);
}

/* One number: digits only, at most SHOAL_HOSTLIST_DIGITS_MAX. */
static int shoal_hostlist_number(const char *s, size_t len, unsigned long *v)
{
    if (len == 0 || len > SHOAL_HOSTLIST_DIGITS_MAX) {
        return -1;
    }
    *v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) {
            return -1;
        }
        *v = *v * 10 + (unsigned long)(s[i] - '0');
    }
    return 0;
}

/* "1-3,07,9-" -> ranges (Slurm takes "9-" as 9). */
static shoal_status_t shoal_hostlist_group(const char *s, size_t len, shoal_hl_num_t **out,
                                           int *n_p)
{
    shoal_hl_num_t *r = NULL;
    int n = 0, cap = 0;
    size_t i = 0;

    while (i <= len) {
        size_t j = i, dash;
        while (j < len && s[j] != ',') {
            j++;
        }
        for (dash = i; dash < j && s[dash] != '-'; dash++) {
        }
        if (n == cap) {
            cap = cap == 0 ? 4 : 2 * cap;
            shoal_hl_num_t *nr = realloc(r, sizeof(*r) * (size_t)cap);
            if (nr == NULL) {
                free(r);
                return SHOAL_ERR_NO_MEMORY;
            }
            r = nr;
        }
        shoal_hl_num_t *x = &r[n];
        if (shoal_hostlist_number(s + i, dash - i, &x->lo) != 0) {
            goto bad;
        }
        x->width = (int)(dash - i);
        x->hi = x->lo;
        if (dash < j && dash + 1 < j && shoal_hostlist_number(s + dash + 1, j - dash - 1,
                                                              &x->hi) != 0) {
            goto bad;
        }
        if (x->hi < x->lo || x->hi - x->lo + 1 > SHOAL_HOSTLIST_RANGE_MAX) {
            goto bad;
        }
        n++;
        i = j + 1;
    }
    *out = r;
    *n_p = n;
    return SHOAL_OK;
bad:
    shoal_error(SCHED, "hostlist: invalid range '%.*s'", (int)len, s);
    free(r);
    return SHOAL_ERR_INVALID_ARG;
}

typedef struct {
    const char *lit[SHOAL_HOSTLIST_GROUPS_MAX]; /* literal before group g */
    size_t litlen[SHOAL_HOSTLIST_GROUPS_MAX];
    shoal_hl_num_t *num[SHOAL_HOSTLIST_GROUPS_MAX];
    int nnum[SHOAL_HOSTLIST_GROUPS_MAX];
    int ngroups;
    unsigned long vals[SHOAL_HOSTLIST_GROUPS_MAX]; /* current value of groups 0..ngroups-2 */
    int widths[SHOAL_HOSTLIST_GROUPS_MAX];
} shoal_hl_tok_t;

/* Groups 0..g-1 fixed by the loops above; g == ngroups - 1: push the last group's ranges. */
static shoal_status_t shoal_hostlist_expand(shoal_hostlist_t *hl, shoal_hl_tok_t *t, int g)
{
    if (g < 0) {
        char prefix[SHOAL_HOSTLIST_TOKEN_MAX + 64];
        size_t len = 0;
        int last = t->ngroups - 1;
        for (int i = 0; i <= last; i++) {
            if (len + t->litlen[i] + 24 >= sizeof(prefix)) {
                shoal_error(SCHED, "hostlist: host name too long");
                return SHOAL_ERR_INVALID_ARG;
            }
            memcpy(prefix + len, t->lit[i], t->litlen[i]);
            len += t->litlen[i];
            if (i < last) {
                len += (size_t)snprintf(prefix + len, sizeof(prefix) - len, "%0*lu",
                                        t->widths[i], t->vals[i]);
            }
        }
        prefix[len] = '\0';
        for (int k = 0; k < t->nnum[last]; k++) {
            shoal_hl_num_t *x = &t->num[last][k];
            SHOAL_CHECK(shoal_hostlist_push_range(hl, prefix, x->lo, x->hi, x->width, 0));
        }
        return SHOAL_OK;
    }
    /* the groups of the prefix: the one nearest the last group varies slowest */
    for (int k = 0; k < t->nnum[g]; k++) {
        shoal_hl_num_t *x = &t->num[g][k];
        for (unsigned long v = x->lo; v <= x->hi; v++) {
            t->vals[g] = v;
            t->widths[g] = x->width;
            SHOAL_CHECK(shoal_hostlist_expand(hl, t, g - 1));
        }
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_hostlist_token(shoal_hostlist_t *hl, const char *s, size_t len)
{
    shoal_hl_tok_t t;
    shoal_status_t st = SHOAL_OK;
    size_t i = 0, start = 0;

    if (len > SHOAL_HOSTLIST_TOKEN_MAX) {
        shoal_error(SCHED, "hostlist: token of %zu bytes (at most %d)", len,
                    SHOAL_HOSTLIST_TOKEN_MAX);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (memchr(s, '[', len) == NULL) {
        char host[SHOAL_HOSTLIST_TOKEN_MAX + 1];
        if (memchr(s, ']', len) != NULL) {
            shoal_error(SCHED, "hostlist: ']' without '[' in '%.*s'", (int)len, s);
            return SHOAL_ERR_INVALID_ARG;
        }
        memcpy(host, s, len);
        host[len] = '\0';
        return shoal_hostlist_push_host(hl, host);
    }
    memset(&t, 0, sizeof(t));
    while (i < len) {
        if (s[i] == ']') {
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        if (s[i] != '[') {
            i++;
            continue;
        }
        size_t close = i + 1;
        while (close < len && s[close] != ']' && s[close] != '[') {
            close++;
        }
        if (close >= len || s[close] != ']' || t.ngroups == SHOAL_HOSTLIST_GROUPS_MAX) {
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        t.lit[t.ngroups] = s + start;
        t.litlen[t.ngroups] = i - start;
        st = shoal_hostlist_group(s + i + 1, close - i - 1, &t.num[t.ngroups],
                                  &t.nnum[t.ngroups]);
        if (st != SHOAL_OK) {
            break;
        }
        t.ngroups++;
        i = close + 1;
        start = i;
    }
    if (st == SHOAL_OK && start != len) {
        st = SHOAL_ERR_INVALID_ARG; /* text after the last group: Slurm refuses it too */
    }
    if (st == SHOAL_OK) {
        st = shoal_hostlist_expand(hl, &t, t.ngroups - 2);
    } else {
        shoal_error(SCHED, "hostlist: malformed brackets in '%.*s'", (int)len, s);
    }
    for (int g = 0; g < t.ngroups; g++) {
        free(t.num[g]);
    }
    return st;
}

shoal_status_t shoal_hostlist_parse(const char *expr, shoal_hostlist_t *hl)
{
    size_t i = 0, n = strlen(expr);

    while (i < n) {
        size_t j;
        int depth = 0;
        while (i < n && (expr[i] == ',' || expr[i] == ' ' || expr[i] == '\t')) {
            i++;
        }
        for (j = i; j < n; j++) {
            if (expr[j] == '[') {
                depth++;
            } else if (expr[j] == ']') {
                depth--;
            } else if (depth == 0 && (expr[j] == ',' || expr[j] == ' ' || expr[j] == '\t')) {
                break;
            }
        }
        if (j > i) {
            SHOAL_CHECK(shoal_hostlist_token(hl, expr + i, j - i));
        }
        i = j;
    }
    return SHOAL_OK;
}

int shoal_hostlist_nth(const shoal_hostlist_t *hl, size_t n, char *buf, size_t size)
{
    /* the cursor is a cache, not the list's value: updating it through a const list is safe
     * (each list belongs to one thread) */
    shoal_hostlist_t *cur = (shoal_hostlist_t *)hl;
    int i = 0;
    size_t base = 0;

    if (hl->it_range > 0 && hl->it_range < hl->nranges && n >= hl->it_base) {
        i = hl->it_range;
        base = hl->it_base;
    }
    for (; i < hl->nranges; i++) {
        const shoal_hostrange_t *r = &hl->ranges[i];
        size_t cnt = r->single ? 1 : (size_t)(r->hi - r->lo + 1);
        if (n - base < cnt) {
            int len = r->single ? snprintf(buf, size, "%s", r->prefix)
                                : snprintf(buf, size, "%s%0*lu", r->prefix, r->width,
                                           r->lo + (n - base));
            cur->it_range = i;
            cur->it_base = base;
            return len >= 0 && (size_t)len < size ? len : -1;
        }
        base += cnt;
    }
    return -1;
}

/* A small growing string. */
static int shoal_hostlist_cat(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int shoal_hostlist_cat(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    int n;

    for (;;) {
        va_start(ap, fmt);
        n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            return -1;
        }
        if (*len + (size_t)n < *cap) {
            *len += (size_t)n;
            return 0;
        }
        char *nb = realloc(*buf, *cap * 2 + (size_t)n);
        if (nb == NULL) {
            return -1;
        }
        *buf = nb;
        *cap = *cap * 2 + (size_t)n;
    }
}

static int shoal_hostlist_within(const shoal_hostrange_t *a, const shoal_hostrange_t *b)
{
    return !a->single && !b->single && strcmp(a->prefix, b->prefix) == 0;
}

static int shoal_hostlist_numstr(char **buf, size_t *len, size_t *cap,
                                 const shoal_hostrange_t *r)
{
    if (r->lo < r->hi) {
        return shoal_hostlist_cat(buf, len, cap, "%0*lu-%0*lu", r->width, r->lo, r->width,
                                  r->hi);
    }
    return shoal_hostlist_cat(buf, len, cap, "%0*lu", r->width, r->lo);
}

char *shoal_hostlist_ranged(const shoal_hostlist_t *hl)
{
    size_t len = 0, cap = 64;
    char *buf = malloc(cap);
    int i = 0, rc = 0;

    if (buf == NULL) {
        return NULL;
    }
    buf[0] = '\0';
    while (i < hl->nranges && rc == 0) {
        const shoal_hostrange_t *r = &hl->ranges[i];
        if (i > 0) {
            rc |= shoal_hostlist_cat(&buf, &len, &cap, ",");
        }
        int bracket = !r->single && (r->hi > r->lo || (i + 1 < hl->nranges &&
                                     shoal_hostlist_within(r, &hl->ranges[i + 1])));
        if (!bracket) {
            rc |= r->single ? shoal_hostlist_cat(&buf, &len, &cap, "%s", r->prefix)
                            : shoal_hostlist_cat(&buf, &len, &cap, "%s%0*lu", r->prefix,
                                                 r->width, r->lo);
            i++;
            continue;
        }
        rc |= shoal_hostlist_cat(&buf, &len, &cap, "%s[", r->prefix);
        rc |= shoal_hostlist_numstr(&buf, &len, &cap, r);
        while (++i < hl->nranges && shoal_hostlist_within(&hl->ranges[i], &hl->ranges[i - 1])) {
            rc |= shoal_hostlist_cat(&buf, &len, &cap, ",");
            rc |= shoal_hostlist_numstr(&buf, &len, &cap, &hl->ranges[i]);
        }
        rc |= shoal_hostlist_cat(&buf, &len, &cap, "]");
    }
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

void shoal_hostlist_free(shoal_hostlist_t *hl)
{
    for (int i = 0; i < hl->nranges; i++) {
        free(hl->ranges[i].prefix);
    }
    free(hl->ranges);
    memset(hl, 0, sizeof(*hl));
}
