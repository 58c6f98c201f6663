/* SHOAL_TOPO_FILE: a synthetic cluster (hosts, ranks per host, links); format in topo.h. */
#include "topo/topo.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHOAL_TOPO_FILE_MAX (1 << 20)
#define SHOAL_TOPO_TOK_MAX 64

typedef struct {
    int nhosts;
    int cyclic;
    int sockets;
    int nppn;
    int ppn[SHOAL_TOPO_TOK_MAX];
    int hosts_line;     /* the count of the 'hosts' line, 0 without one */
    int host_lines;     /* the host lines' highest host + 1, 0 none */
    int max_rank;       /* highest rank of the host lines, -1 none */
    int *explicit_host; /* [nranks], -1 when not placed by a host line */
} shoal_topo_spec_t;

/* Splits line into whitespace-separated tokens (in place); returns the count. */
static int shoal_topo_file_tokens(char *line, char **tok, int max)
{
    int n = 0;
    char *save = NULL, *t;
    char *hash = strchr(line, '#');

    if (hash != NULL) {
        *hash = '\0';
    }
    for (t = strtok_r(line, " \t\r", &save); t != NULL && n < max;
         t = strtok_r(NULL, " \t\r", &save)) {
        tok[n++] = t;
    }
    return n;
}

static int shoal_topo_file_int(const char *s, int lo, int *v_p)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > 1 << 20) {
        return -1;
    }
    *v_p = (int)v;
    return 0;
}

static int shoal_topo_file_double(const char *s, double *v_p)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= 0) || v > 1e9) {
        return -1;
    }
    *v_p = v;
    return 0;
}

/* "link intra|inter lat <us> bw <GB/s> send <us> recv <us>" (any part may be left out, not
 * all). */
static int shoal_topo_file_link(char **tok, int n, shoal_topo_file_t *tf)
{
    shoal_link_t l;
    int inter, have = 0;
    if (n < 4 || (n % 2) != 0) {
        return -1;
    }
    if (strcmp(tok[1], "intra") == 0) {
        inter = 0;
    } else if (strcmp(tok[1], "inter") == 0) {
        inter = 1;
    } else {
        return -1;
    }
    l = inter ? tf->inter : tf->intra;
    for (int i = 2; i < n; i += 2) {
        double v;
        if (shoal_topo_file_double(tok[i + 1], &v) != 0) {
            return -1;
        }
        if (strcmp(tok[i], "lat") == 0) {
            l.alpha_us = v;
            have |= SHOAL_TOPO_LINK_LAT;
        } else if (strcmp(tok[i], "bw") == 0 && v >= 1e-9) { /* 1e-320: a beta of inf */
            l.beta_us = shoal_gbs_to_beta(v);
            have |= SHOAL_TOPO_LINK_BW;
        } else if (strcmp(tok[i], "send") == 0) {
            l.send_us = v;
            have |= SHOAL_TOPO_LINK_SEND;
        } else if (strcmp(tok[i], "recv") == 0) {
            l.recv_us = v;
            have |= SHOAL_TOPO_LINK_RECV;
        } else {
            return -1;
        }
    }
    if (inter) {
        tf->inter = l;
        tf->have_inter |= have;
    } else {
        tf->intra = l;
        tf->have_intra |= have;
    }
    return 0;
}

shoal_link_t shoal_topo_file_link_over(shoal_link_t base, const shoal_link_t *l, int have)
{
    base.alpha_us = (have & SHOAL_TOPO_LINK_LAT) != 0 ? l->alpha_us : base.alpha_us;
    base.beta_us = (have & SHOAL_TOPO_LINK_BW) != 0 ? l->beta_us : base.beta_us;
    base.send_us = (have & SHOAL_TOPO_LINK_SEND) != 0 ? l->send_us : base.send_us;
    base.recv_us = (have & SHOAL_TOPO_LINK_RECV) != 0 ? l->recv_us : base.recv_us;
    return base;
}

static int shoal_topo_file_line(char **tok, int n, int nranks, shoal_topo_spec_t *sp,
                                shoal_topo_file_t *tf)
{
    if (strcmp(tok[0], "hosts") == 0) {
        if (n != 2 || shoal_topo_file_int(tok[1], 1, &sp->nhosts) != 0) {
            return -1;
        }
        sp->hosts_line = sp->nhosts;
        return 0;
    }
    if (strcmp(tok[0], "sockets") == 0) {
        return n == 2 ? shoal_topo_file_int(tok[1], 1, &sp->sockets) : -1;
    }
    if (strcmp(tok[0], "layout") == 0) {
        if (n != 2 || (strcmp(tok[1], "block") != 0 && strcmp(tok[1], "cyclic") != 0)) {
            return -1;
        }
        sp->cyclic = strcmp(tok[1], "cyclic") == 0;
        return 0;
    }
    if (strcmp(tok[0], "ppn") == 0) {
        sp->nppn = n - 1;
        for (int i = 1; i < n; i++) {
            if (shoal_topo_file_int(tok[i], 1, &sp->ppn[i - 1]) != 0) {
                return -1;
            }
        }
        return n >= 2 ? 0 : -1;
    }
    if (strcmp(tok[0], "host") == 0) {
        int h;
        if (n < 4 || strcmp(tok[2], "ranks") != 0 || shoal_topo_file_int(tok[1], 0, &h) != 0) {
            return -1;
        }
        for (int i = 3; i < n; i++) {
            int r;
            if (shoal_topo_file_int(tok[i], 0, &r) != 0) {
                return -1;
            }
            if (r < nranks) {
                sp->explicit_host[r] = h;
            }
            sp->max_rank = SHOAL_MAX(sp->max_rank, r);
        }
        sp->host_lines = SHOAL_MAX(sp->host_lines, h + 1);
        return 0;
    }
    if (strcmp(tok[0], "link") == 0) {
        return shoal_topo_file_link(tok, n, tf);
    }
    return -1;
}

/* Host of rank r from hosts/ppn/layout (explicit host lines aside); nppn >= 1 unless cyclic;
 * not cyclic over a ppn list (shoal_topo_deal_next). */
static int shoal_topo_file_place(const shoal_topo_spec_t *sp, int r)
{
    int total = 0;

    if (sp->cyclic) {
        return r % sp->nhosts;
    }
    if (sp->nppn == 1) {
        return (r / sp->ppn[0]) % sp->nhosts;
    }
    for (int h = 0; h < sp->nppn; h++) {
        total += sp->ppn[h];
    }
    r %= total;
    for (int h = 0; h < sp->nppn; h++) {
        if (r < sp->ppn[h]) {
            return h % sp->nhosts;
        }
        r -= sp->ppn[h];
    }
    return 0;
}

/* Cyclic over a ppn list: ranks dealt one per host in turn, a host left out once it has its
 * count ('ppn 3 1': 0 1 0 0), again from the start after the list's sum. It was r mod hosts,
 * which gave every host the same count (0 1 0 1). The hosts that still have room form a ring
 * (next[]), so each rank costs O(1). */
typedef struct {
    int left[SHOAL_TOPO_TOK_MAX];
    int next[SHOAL_TOPO_TOK_MAX];
    int cur, prev, dealt, total;
} shoal_topo_deal_t;

static void shoal_topo_deal_reset(const shoal_topo_spec_t *sp, shoal_topo_deal_t *d)
{
    d->total = 0;
    for (int h = 0; h < sp->nppn; h++) {
        d->left[h] = sp->ppn[h];
        d->next[h] = (h + 1) % sp->nppn;
        d->total += sp->ppn[h];
    }
    d->cur = 0;
    d->prev = sp->nppn - 1;
    d->dealt = 0;
}

static int shoal_topo_deal_next(const shoal_topo_spec_t *sp, shoal_topo_deal_t *d)
{
    int h;

    if (d->dealt == d->total) {
        shoal_topo_deal_reset(sp, d);
    }
    h = d->cur;
    d->dealt++;
    if (--d->left[h] == 0) {
        d->next[d->prev] = d->next[h]; /* full: out of the ring */
    } else {
        d->prev = h;
    }
    d->cur = d->next[h];
    return h % sp->nhosts;
}

/* Host of rank r in a block layout of nranks over nhosts without ppn: the first
 * nranks % nhosts hosts one rank more than the others. Blocks of ceil(nranks / nhosts) left
 * the last hosts empty ('hosts 4' over 6 ranks was 2 2 2 0: three hosts, not four). */
static int shoal_topo_file_even(int nhosts, int nranks, int r)
{
    int q = nranks / nhosts, rem = nranks % nhosts;

    return r < rem * (q + 1) ? r / (q + 1) : rem + (r - rem * (q + 1)) / q;
}

/* Sockets: each host's ranks, in rank order, cut into sp->sockets contiguous groups. One pass
 * over the ranks ordered by (host, rank): the cost follows the ranks, not hosts x ranks (a
 * file of 555555 hosts took over 10 s, tests/fuzz/regress/topo_file). */
static int shoal_topo_file_cmp(const void *a, const void *b, void *host_of)
{
    int ra = *(const int *)a, rb = *(const int *)b;
    int ha = ((const int *)host_of)[ra], hb = ((const int *)host_of)[rb];
    return ha != hb ? (ha < hb ? -1 : 1) : (ra > rb) - (ra < rb);
}

static shoal_status_t shoal_topo_file_sockets(shoal_topo_file_t *tf)
{
    int *order = malloc((size_t)(tf->nranks > 0 ? tf->nranks : 1) * sizeof(*order));
    if (order == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int r = 0; r < tf->nranks; r++) {
        order[r] = r;
    }
    qsort_r(order, (size_t)tf->nranks, sizeof(*order), shoal_topo_file_cmp, tf->host_of);
    for (int s = 0; s < tf->nranks;) {
        int e = s, cnt;
        while (e < tf->nranks && tf->host_of[order[e]] == tf->host_of[order[s]]) {
            e++;
        }
        cnt = e - s;
        for (int i = 0; i < cnt; i++) {
            /* 64-bit product: up to 2^20 sockets times thousands of ranks */
            tf->socket_of[order[s + i]] = (int)((int64_t)i * tf->sockets / cnt);
        }
        s = e;
    }
    free(order);
    return SHOAL_OK;
}

/* The ranks the file places before wrapping around: the ppn list's sum, one ppn times the
 * 'hosts' line's count, past the highest rank of the host lines; 0 when it does not say. */
static int shoal_topo_file_described(const shoal_topo_spec_t *sp)
{
    int64_t lay = 0;

    if (sp->nppn > 1) {
        for (int h = 0; h < sp->nppn; h++) {
            lay += sp->ppn[h];
        }
    } else if (sp->nppn == 1 && sp->hosts_line > 0) {
        lay = (int64_t)sp->ppn[0] * sp->nhosts; /* as shoal_topo_file_place wraps */
    }
    return (int)SHOAL_MIN(SHOAL_MAX(lay, (int64_t)sp->max_rank + 1), (int64_t)1 << 30);
}

static shoal_status_t shoal_topo_file_finish(shoal_topo_spec_t *sp, int nranks,
                                             shoal_topo_file_t *tf)
{
    shoal_topo_deal_t deal;

    /* The layout's hosts: the 'hosts' line, else as many as the ppn list or one ppn ask for;
     * the host lines' count only where nothing else says (they place just the ranks they
     * name). Their count counted first: 'ppn 2' with 'host 0 ranks 7' put all 8 ranks on one
     * host, (r / 2) mod 1, and a 'hosts' line before a host line gave another layout than
     * after it. */
    if (sp->nhosts == 0) {
        sp->nhosts = sp->nppn > 1 ? sp->nppn : SHOAL_MAX(sp->host_lines, 1);
        if (sp->nppn == 1) {
            sp->nhosts = (nranks + sp->ppn[0] - 1) / sp->ppn[0];
        }
    }
    tf->nhosts = SHOAL_MAX(sp->nhosts, sp->host_lines);
    tf->sockets = sp->sockets;
    tf->nranks = nranks;
    tf->described = shoal_topo_file_described(sp);
    shoal_topo_deal_reset(sp, &deal);
    for (int r = 0; r < nranks; r++) {
        /* every rank takes its turn in the deal, those placed by host lines too: each rank's
         * host depends on its number only, as in the other layouts */
        int dealt = sp->cyclic && sp->nppn > 1 ? shoal_topo_deal_next(sp, &deal) : -1;
        if (sp->explicit_host[r] >= 0) {
            tf->host_of[r] = sp->explicit_host[r];
        } else if (dealt >= 0) {
            tf->host_of[r] = dealt;
        } else if (sp->nppn == 0 && !sp->cyclic) {
            tf->host_of[r] = shoal_topo_file_even(sp->nhosts, nranks, r);
        } else {
            tf->host_of[r] = shoal_topo_file_place(sp, r);
        }
    }
    return shoal_topo_file_sockets(tf);
}

/* A line's first word is shown only when it is a keyword: a file given by mistake (a
 * credential, a token) had its first line's first word, maybe the secret itself, in every
 * rank's log. */
static void shoal_topo_file_error(int lineno, const char *word)
{
    static const char *const kw[] = {"hosts", "sockets", "layout", "ppn", "host", "link"};

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(kw); i++) {
        if (strcmp(word, kw[i]) == 0) {
            shoal_error(TOPO, "SHOAL_TOPO_FILE line %d: cannot parse the line starting with "
                        "'%s'", lineno, word);
            return;
        }
    }
    shoal_error(TOPO, "SHOAL_TOPO_FILE line %d: does not start with a keyword (hosts, ppn, "
                "layout, host, sockets, link; the line is not shown: is it the right file?)",
                lineno);
}

shoal_status_t shoal_topo_file_parse(const char *text, int nranks, shoal_topo_file_t *tf)
{
    shoal_topo_spec_t sp = {.sockets = 1, .max_rank = -1};
    char *copy = strdup(text), *line, *next;
    int lineno = 0;
    shoal_status_t st = SHOAL_ERR_INVALID_ARG;

    memset(tf, 0, sizeof(*tf));
    if (nranks <= 0) {
        free(copy);
        return SHOAL_ERR_INVALID_ARG;
    }
    tf->host_of = calloc((size_t)nranks, sizeof(int));
    tf->socket_of = calloc((size_t)nranks, sizeof(int));
    sp.explicit_host = malloc(sizeof(int) * (size_t)nranks);
    if (copy == NULL || tf->host_of == NULL || tf->socket_of == NULL || sp.explicit_host == NULL) {
        st = SHOAL_ERR_NO_MEMORY;
        goto out;
    }
    for (int r = 0; r < nranks; r++) {
        sp.explicit_host[r] = -1;
    }
    /* Line by line, empty ones counted too: an error names the line's number. */
    for (line = copy; line != NULL; line = next) {
        char *tok[SHOAL_TOPO_TOK_MAX + 1];
        int n;
        next = strchr(line, '\n');
        if (next != NULL) {
            *next++ = '\0';
        }
        lineno++;
        n = shoal_topo_file_tokens(line, tok, SHOAL_TOPO_TOK_MAX + 1);
        if (n == 0) {
            continue;
        }
        if (n > SHOAL_TOPO_TOK_MAX || shoal_topo_file_line(tok, n, nranks, &sp, tf) != 0) {
            shoal_topo_file_error(lineno, tok[0]);
            goto out;
        }
    }
    st = shoal_topo_file_finish(&sp, nranks, tf);
out:
    free(copy);
    free(sp.explicit_host);
    if (st != SHOAL_OK) {
        shoal_topo_file_free(tf);
    }
    return st;
}

shoal_status_t shoal_topo_file_load(const char *path, int nranks, shoal_topo_file_t *tf)
{
    char *buf, why[96];
    size_t len = 0;
    int err;
    shoal_status_t st;

    memset(tf, 0, sizeof(*tf));
    /* Read whole or refused: cut at the limit, the lines past it were lost without a word and
     * the last one read was parsed half ('hosts 2' at the end of a 1.2 MB file: every rank
     * on one host); a directory read as an empty file. So was a file of zeros (a write a
     * crash lost): the text ended at its first NUL byte, the lines past it unread. */
    err = shoal_text_file_read(path, SHOAL_TOPO_FILE_MAX, &buf, &len, why, sizeof(why));
    if (err == 0 && memchr(buf, '\0', len) != NULL) {
        snprintf(why, sizeof(why), "has a NUL byte at offset %zu: not a text file",
                 strlen(buf));
        free(buf);
        err = EINVAL;
    }
    if (err != 0) {
        shoal_error(TOPO, "SHOAL_TOPO_FILE=%s %s", path, why);
        return err == ENOMEM ? SHOAL_ERR_NO_MEMORY : SHOAL_ERR_INVALID_ARG;
    }
    st = shoal_topo_file_parse(buf, nranks, tf);
    if (st != SHOAL_OK) {
        shoal_error(TOPO, "SHOAL_TOPO_FILE=%s is not a valid topology file", path);
    }
    free(buf);
    return st;
}

void shoal_topo_file_free(shoal_topo_file_t *tf)
{
    free(tf->host_of);
    free(tf->socket_of);
    memset(tf, 0, sizeof(*tf));
}
