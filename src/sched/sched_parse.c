/*
 * The inputs: slurm.conf NodeName and DownNodes lines, topology.conf (the tree form), the jobs
 * file.
 * Every line is "Key=Value Key=Value ..." (keys case-insensitive, '#' starts a comment, a
 * trailing '\' joins the next line). Anything malformed is an error naming the line.
 */
#include "sched/sched.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHOAL_SCHED_LINE_MAX 65536
#define SHOAL_SCHED_KV_MAX 64
#define SHOAL_SCHED_FILE_MAX (64 << 20)
#define SHOAL_SCHED_CPUS_MAX (1 << 20) /* CPUs per node, and per rank in a jobs file */

typedef struct {
    char *key[SHOAL_SCHED_KV_MAX];
    char *val[SHOAL_SCHED_KV_MAX];
    int n;
} shoal_sched_kv_t;

/* Reads path whole: to EOF with a growing buffer, so a pipe or FIFO (--jobs <(...)) is read as
 * it comes; a failed read (a directory: EISDIR) is an error naming the file, never an empty
 * file; at most SHOAL_SCHED_FILE_MAX bytes whatever the file is, and no NUL byte. */
shoal_status_t shoal_sched_read_file(const char *path, char **text_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    char *text = NULL;
    size_t off = 0, cap = 65536;
    shoal_status_t st = SHOAL_OK;

    if (fd < 0) {
        shoal_error(SCHED, "open(%s) failed: %s", path, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if (sb.st_size > SHOAL_SCHED_FILE_MAX) {
            shoal_error(SCHED, "%s: larger than %d bytes", path, SHOAL_SCHED_FILE_MAX);
            close(fd);
            return SHOAL_ERR_INVALID_ARG;
        }
        cap = (size_t)sb.st_size + 2; /* + 1 to see EOF without growing, + 1 for the NUL */
    }
    text = malloc(cap);
    if (text == NULL) {
        close(fd);
        return SHOAL_ERR_NO_MEMORY;
    }
    for (;;) {
        if (cap - off < 2) { /* room for one more byte and the NUL */
            if (cap >= (size_t)SHOAL_SCHED_FILE_MAX + 2) {
                shoal_error(SCHED, "%s: larger than %d bytes", path, SHOAL_SCHED_FILE_MAX);
                st = SHOAL_ERR_INVALID_ARG;
                break;
            }
            size_t ncap = SHOAL_MIN(2 * cap, (size_t)SHOAL_SCHED_FILE_MAX + 2);
            char *t = realloc(text, ncap);
            if (t == NULL) {
                st = SHOAL_ERR_NO_MEMORY;
                break;
            }
            text = t;
            cap = ncap;
        }
        ssize_t n = read(fd, text + off, cap - off - 1);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            shoal_error(SCHED, "read(%s) failed: %s", path, strerror(errno));
            st = SHOAL_ERR_SYSTEM;
            break;
        }
        if (n == 0) {
            break;
        }
        off += (size_t)n;
    }
    close(fd);
    /* the parsers read up to the first NUL: what followed one (a job, a node) was dropped in
     * silence, so such a file is not text and is refused */
    const char *nul = st == SHOAL_OK ? memchr(text, '\0', off) : NULL;
    if (nul != NULL) {
        shoal_error(SCHED, "%s: a NUL byte at offset %zu: not a text file", path,
                    (size_t)(nul - text));
        st = SHOAL_ERR_INVALID_ARG;
    }
    if (st != SHOAL_OK) {
        free(text);
        return st;
    }
    text[off] = '\0';
    *text_p = text;
    return SHOAL_OK;
}

/* Splits one logical line in place into key=value pairs; a word without '=' is an error. With
 * quotes (Slurm's files), a value in double quotes may hold blanks, as Slurm's parser takes it
 * (Reason="bad disk" on a DownNodes or NodeName line: such a slurm.conf was refused); the
 * quotes around a value are dropped. The jobs file has no quotes: its names go into file
 * names and the plan's Key=Value lines. */
static shoal_status_t shoal_sched_kv_split(char *line, const char *src, int lineno, int quotes,
                                           shoal_sched_kv_t *kv)
{
    char *p = line;

    kv->n = 0;
    for (;;) {
        int quoted = 0;
        while (*p == ' ' || *p == '\t' || *p == '\r') {
            p++;
        }
        if (*p == '\0') {
            return SHOAL_OK;
        }
        char *w = p;
        while (*p != '\0' && (quoted || (*p != ' ' && *p != '\t' && *p != '\r'))) {
            quoted ^= quotes && *p == '"';
            p++;
        }
        if (quoted) {
            shoal_error(SCHED, "%s:%d: '%s' has a quote that is not closed", src, lineno, w);
            return SHOAL_ERR_INVALID_ARG;
        }
        if (*p != '\0') {
            *p++ = '\0';
        }
        char *eq = strchr(w, '=');
        if (quotes && kv->n == 0 && eq == NULL && strcasecmp(w, "Include") == 0) {
            /* Slurm's "Include FILE": refused as "not Key=Value", as if the file were
             * malformed; its NodeName lines are not read here, so say how to give them */
            size_t n = strlen(p);
            while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r')) {
                n--;
            }
            shoal_error(SCHED, "%s:%d: Include %.*s is not followed: give its NodeName lines "
                        "in the file without the Include line (e.g. --slurm-conf <(grep -vi "
                        "'^include' slurm.conf; cat FILE))", src, lineno, (int)n, p);
            return SHOAL_ERR_INVALID_ARG;
        }
        if (eq == NULL || eq == w || kv->n == SHOAL_SCHED_KV_MAX) {
            shoal_error(SCHED, "%s:%d: '%s' is not Key=Value (or more than %d pairs)", src,
                        lineno, w, SHOAL_SCHED_KV_MAX);
            return SHOAL_ERR_INVALID_ARG;
        }
        *eq = '\0';
        char *v = eq + 1;
        size_t vlen = strlen(v);
        if (quotes && vlen >= 2 && v[0] == '"' && v[vlen - 1] == '"') {
            v[vlen - 1] = '\0';
            v++;
        }
        kv->key[kv->n] = w;
        kv->val[kv->n] = v;
        kv->n++;
    }
}

/* Calls fn for each logical line (comments stripped, continuations joined; quotes: see
 * shoal_sched_kv_split). */
typedef shoal_status_t (*shoal_sched_line_cb_t)(void *ctx, shoal_sched_kv_t *kv, const char *src,
                                                int lineno);

static shoal_status_t shoal_sched_lines(const char *text, const char *src, int quotes,
                                        shoal_sched_line_cb_t fn, void *ctx)
{
    char *buf = malloc(SHOAL_SCHED_LINE_MAX);
    size_t len = 0;
    int lineno = 0, first = 1;
    shoal_status_t st = SHOAL_OK;
    shoal_sched_kv_t kv;

    if (buf == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    for (const char *p = text; st == SHOAL_OK && *p != '\0';) {
        const char *e = strchr(p, '\n');
        size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
        const char *hash = memchr(p, '#', n);
        size_t keep = hash != NULL ? (size_t)(hash - p) : n;
        int cont;

        lineno++;
        first = len == 0 ? lineno : first;
        while (keep > 0 && (p[keep - 1] == ' ' || p[keep - 1] == '\t' || p[keep - 1] == '\r')) {
            keep--;
        }
        cont = hash == NULL && keep > 0 && p[keep - 1] == '\\';
        keep -= cont;
        if (len + keep + 2 > SHOAL_SCHED_LINE_MAX) {
            shoal_error(SCHED, "%s:%d: line longer than %d bytes", src, lineno,
                        SHOAL_SCHED_LINE_MAX);
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        memcpy(buf + len, p, keep);
        len += keep;
        buf[len++] = ' ';
        buf[len] = '\0';
        p = e != NULL ? e + 1 : p + n;
        if (!cont || *p == '\0') {
            st = shoal_sched_kv_split(buf, src, first, quotes, &kv);
            if (st == SHOAL_OK && kv.n > 0) {
                st = fn(ctx, &kv, src, first);
            }
            len = 0;
        }
    }
    free(buf);
    return st;
}

/* A non-negative integer. With mult, a size in MB with Slurm's units (str_to_mbytes, as in
 * --mem): no suffix or M is MB, K is KB rounded up to whole MB, G x1024, T x1024^2. */
static int shoal_sched_num(const char *s, int mult, long max, long *v)
{
    char *end;
    long x;

    if (s[0] < '0' || s[0] > '9') {
        return -1;
    }
    errno = 0;
    x = strtol(s, &end, 10);
    if (errno != 0) {
        return -1;
    }
    if (mult && *end != '\0' && end[1] == '\0') {
        long m = 1;
        switch (*end) {
        case 'k': case 'K': x = x / 1024 + (x % 1024 != 0); break;
        case 'm': case 'M': break;
        case 'g': case 'G': m = 1024; break;
        case 't': case 'T': m = 1024L * 1024; break;
        default: return -1;
        }
        if (x > max / m) {
            return -1;
        }
        x *= m;
        end++;
    }
    if (*end != '\0' || x > max) {
        return -1;
    }
    *v = x;
    return 0;
}

/* Gres=gpu:8, gpu:a100:8, gpu:a100:4(S:0-1),gpu:v100:2, gpu (one), mps:100 (not a GPU). */
static int shoal_sched_gres_gpus(const char *val, long *gpus)
{
    char tmp[512];
    char *save = NULL;

    if (strlen(val) >= sizeof(tmp)) {
        return -1;
    }
    strcpy(tmp, val);
    *gpus = 0;
    for (char *it = strtok_r(tmp, ",", &save); it != NULL; it = strtok_r(NULL, ",", &save)) {
        char *paren = strchr(it, '(');
        char *last;
        long n = 1;
        if (paren != NULL) {
            *paren = '\0';
        }
        if (strncmp(it, "gpu", 3) != 0 || (it[3] != '\0' && it[3] != ':')) {
            continue;
        }
        last = strrchr(it, ':');
        if (last != NULL && last[1] >= '0' && last[1] <= '9') {
            if (shoal_sched_num(last + 1, 0, SHOAL_SCHED_GPU_MAX, &n) != 0) {
                return -1;
            }
        }
        *gpus += n;
    }
    return *gpus <= SHOAL_SCHED_GPU_MAX ? 0 : -1;
}

/* A NodeName line's numbers, -1 where neither the line nor NodeName=DEFAULT gives one. */
typedef struct {
    long cpus, mem, gpus, boards, sockets, sockets_per_board, cores, threads;
    int future; /* State=FUTURE: defined, not there yet (Slurm runs nothing on it) */
    int down;   /* State=DOWN, DRAIN, FAIL or FAILING: Slurm starts no new job there */
} shoal_sched_node_spec_t;

/* The numeric NodeName keys. A count of 0 is refused: Slurm calls CPUs=0, Sockets=0 and the
 * rest invalid (and resets them to 1); the planner would take a node with 0 CPUs as full. */
static const struct {
    const char *key;
    size_t off;
    long min, max;
} shoal_sched_node_keys[] = {
    {.key = "CPUs", .off = offsetof(shoal_sched_node_spec_t, cpus), .min = 1,
     .max = SHOAL_SCHED_CPUS_MAX},
    {.key = "Procs", .off = offsetof(shoal_sched_node_spec_t, cpus), .min = 1,
     .max = SHOAL_SCHED_CPUS_MAX},
    {.key = "RealMemory", .off = offsetof(shoal_sched_node_spec_t, mem), .min = 0,
     .max = 1L << 40},
    {.key = "Boards", .off = offsetof(shoal_sched_node_spec_t, boards), .min = 1, .max = 64},
    {.key = "Sockets", .off = offsetof(shoal_sched_node_spec_t, sockets), .min = 1, .max = 4096},
    {.key = "SocketsPerBoard", .off = offsetof(shoal_sched_node_spec_t, sockets_per_board),
     .min = 1, .max = 4096},
    {.key = "CoresPerSocket", .off = offsetof(shoal_sched_node_spec_t, cores), .min = 1,
     .max = 4096},
    {.key = "ThreadsPerCore", .off = offsetof(shoal_sched_node_spec_t, threads), .min = 1,
     .max = 64},
};

typedef struct {
    shoal_sched_cluster_t *c;
    shoal_sched_node_spec_t dflt; /* NodeName=DEFAULT so far */
    shoal_hostlist_t down;        /* the DownNodes= lines' hosts, marked at the end */
} shoal_sched_conf_ctx_t;

static shoal_status_t shoal_sched_node_key(shoal_sched_node_spec_t *s, const char *k,
                                           const char *v, const char *src, int lineno)
{
    if (strcasecmp(k, "State") == 0) {
        /* FUTURE, or FUTURE with flags (FUTURE+...): a job planned there never starts */
        s->future = strncasecmp(v, "FUTURE", 6) == 0 && (v[6] == '\0' || v[6] == '+');
        /* taken as the others were: jobs planned where sbatch --nodelist waits for ever */
        s->down = 0;
        for (const char *w = v;;) { /* each word of STATE+FLAG+... */
            size_t n = strcspn(w, "+");
            s->down |= (n == 4 && strncasecmp(w, "DOWN", 4) == 0) ||
                       (n == 5 && strncasecmp(w, "DRAIN", 5) == 0) ||
                       (n == 4 && strncasecmp(w, "FAIL", 4) == 0) ||
                       (n == 7 && strncasecmp(w, "FAILING", 7) == 0);
            if (w[n] == '\0') {
                break;
            }
            w += n + 1;
        }
        return SHOAL_OK;
    }
    if (strcasecmp(k, "Gres") == 0) {
        if (shoal_sched_gres_gpus(v, &s->gpus) != 0) {
            shoal_error(SCHED, "%s:%d: bad value %s=%s", src, lineno, k, v);
            return SHOAL_ERR_INVALID_ARG;
        }
        return SHOAL_OK;
    }
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_sched_node_keys); i++) {
        long x;
        if (strcasecmp(k, shoal_sched_node_keys[i].key) != 0) {
            continue;
        }
        if (shoal_sched_num(v, 0, shoal_sched_node_keys[i].max, &x) != 0 ||
            x < shoal_sched_node_keys[i].min) {
            shoal_error(SCHED, "%s:%d: bad value %s=%s (a whole number in %ld..%ld)", src,
                        lineno, k, v, shoal_sched_node_keys[i].min,
                        shoal_sched_node_keys[i].max);
            return SHOAL_ERR_INVALID_ARG;
        }
        *(long *)((char *)s + shoal_sched_node_keys[i].off) = x;
        return SHOAL_OK;
    }
    return SHOAL_OK; /* Feature, State, Weight and the rest are Slurm's business */
}

/* CPUs as Slurm infers them when CPUs= is not given (read_config.c): Sockets (the node's
 * total), or Boards x SocketsPerBoard, or one socket per board; times CoresPerSocket times
 * ThreadsPerCore, each 1 by default. In 64 bits, and refused above the CPUs= bound. */
static shoal_status_t shoal_sched_node_cpus(const shoal_sched_node_spec_t *s, const char *src,
                                            int lineno, long *cpus_p)
{
    uint64_t boards = s->boards > 0 ? (uint64_t)s->boards : 1;
    uint64_t cores = s->cores > 0 ? (uint64_t)s->cores : 1;
    uint64_t threads = s->threads > 0 ? (uint64_t)s->threads : 1;
    uint64_t sockets, n;

    if (s->sockets > 0 && s->sockets_per_board > 0) {
        shoal_error(SCHED, "%s:%d: Sockets= and SocketsPerBoard= both given (on the line or in "
                    "NodeName=DEFAULT): Slurm takes one or the other", src, lineno);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (s->cpus > 0) {
        *cpus_p = s->cpus;
        return SHOAL_OK;
    }
    sockets = s->sockets_per_board > 0 ? boards * (uint64_t)s->sockets_per_board
              : s->sockets > 0         ? (uint64_t)s->sockets
                                       : boards;
    n = sockets * cores * threads;
    if (n > SHOAL_SCHED_CPUS_MAX) {
        shoal_error(SCHED, "%s:%d: no CPUs=, and sockets x CoresPerSocket x ThreadsPerCore = "
                    "%" PRIu64 " x %" PRIu64 " x %" PRIu64 " = %" PRIu64 " CPUs, above %d",
                    src, lineno, sockets, cores, threads, n, SHOAL_SCHED_CPUS_MAX);
        return SHOAL_ERR_INVALID_ARG;
    }
    *cpus_p = (long)n;
    return SHOAL_OK;
}

static shoal_status_t shoal_sched_conf_line(void *vctx, shoal_sched_kv_t *kv, const char *src,
                                            int lineno)
{
    shoal_sched_conf_ctx_t *ctx = vctx;
    shoal_sched_node_spec_t spec = ctx->dflt;
    shoal_hostlist_t hl = {0};
    shoal_status_t st = SHOAL_OK;
    long cpus;

    if (strcasecmp(kv->key[0], "DownNodes") == 0) {
        /* DOWN by default, or State= DRAIN, FAIL, FAILING, FUTURE: no new job in each case */
        if (shoal_hostlist_parse(kv->val[0], &ctx->down) != SHOAL_OK) {
            shoal_error(SCHED, "%s:%d: bad DownNodes '%s'", src, lineno, kv->val[0]);
            return SHOAL_ERR_INVALID_ARG;
        }
        return SHOAL_OK;
    }
    if (strcasecmp(kv->key[0], "NodeName") != 0) {
        return SHOAL_OK; /* partitions and the rest are Slurm's business */
    }
    for (int i = 1; i < kv->n; i++) {
        SHOAL_CHECK(shoal_sched_node_key(&spec, kv->key[i], kv->val[i], src, lineno));
    }
    if (strcasecmp(kv->val[0], "DEFAULT") == 0) {
        ctx->dflt = spec; /* each DEFAULT line adds to the ones before it, as in Slurm */
        return SHOAL_OK;
    }
    SHOAL_CHECK(shoal_sched_node_cpus(&spec, src, lineno, &cpus));
    if (shoal_hostlist_parse(kv->val[0], &hl) != SHOAL_OK || hl.nhosts == 0) {
        shoal_error(SCHED, "%s:%d: bad NodeName '%s'", src, lineno, kv->val[0]);
        shoal_hostlist_free(&hl);
        return SHOAL_ERR_INVALID_ARG;
    }
    for (size_t h = 0; h < hl.nhosts && st == SHOAL_OK; h++) {
        char name[SHOAL_SCHED_NAME_MAX];
        if (shoal_hostlist_nth(&hl, h, name, sizeof(name)) < 0) {
            shoal_error(SCHED, "%s:%d: a host name longer than %d", src, lineno,
                        SHOAL_SCHED_NAME_MAX - 1);
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        /* Slurm refuses a node defined twice (fatal: "Duplicated NodeName"); taking the last
         * definition silently would plan on GPUs and CPUs the cluster may not have */
        if (shoal_sched_node_find(ctx->c, name) >= 0) {
            shoal_error(SCHED, "%s:%d: node %s is defined twice (Slurm: Duplicated NodeName)",
                        src, lineno, name);
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        if (spec.future) {
            continue; /* not a node to plan on (a job there never starts) */
        }
        st = shoal_sched_node_add(ctx->c, name, (int)cpus, spec.mem, (int)spec.gpus);
        if (st == SHOAL_OK) {
            ctx->c->nodes[ctx->c->nnodes - 1].down = spec.down;
        }
    }
    shoal_hostlist_free(&hl);
    return st;
}

shoal_status_t shoal_sched_slurm_conf_parse(const char *text, const char *src,
                                            shoal_sched_cluster_t *c)
{
    /* Slurm's defaults: RealMemory 1, no GPUs; CPUs inferred (1 when nothing is given) */
    shoal_sched_conf_ctx_t ctx = {
        .c = c,
        .dflt = {.cpus = -1, .mem = 1, .gpus = 0, .boards = -1, .sockets = -1,
                 .sockets_per_board = -1, .cores = -1, .threads = -1},
    };
    shoal_status_t st = shoal_sched_lines(text, src, 1, shoal_sched_conf_line, &ctx);

    /* DownNodes= after every NodeName line, as Slurm applies them; a name it does not
     * define is an error in Slurm's log, not a fatal one */
    for (size_t h = 0; st == SHOAL_OK && h < ctx.down.nhosts; h++) {
        char name[SHOAL_SCHED_NAME_MAX];
        int n = shoal_hostlist_nth(&ctx.down, h, name, sizeof(name)) >= 0
                    ? shoal_sched_node_find(c, name) : -1;
        if (n >= 0) {
            c->nodes[n].down = 1;
        } else {
            shoal_warn(SCHED, "%s: DownNodes names %s, not a node of it (or of State=FUTURE): "
                       "ignored", src, name);
        }
    }
    shoal_hostlist_free(&ctx.down);
    return st;
}

/* topology.conf: two passes, so Switches= may name a switch defined further down. */
typedef struct {
    shoal_sched_cluster_t *c;
    int pass;
} shoal_sched_topo_ctx_t;

static shoal_status_t shoal_sched_topo_link(shoal_sched_cluster_t *c, int s, const char *val,
                                            int nodes, const char *src, int lineno)
{
    shoal_hostlist_t hl = {0};
    shoal_status_t st = shoal_hostlist_parse(val, &hl);

    if (st != SHOAL_OK) {
        /* the hostlist's own message names the expression only: in a long topology.conf the
         * line was not to be found */
        shoal_error(SCHED, "%s:%d: bad %s=%s", src, lineno, nodes ? "Nodes" : "Switches", val);
    }
    for (size_t h = 0; st == SHOAL_OK && h < hl.nhosts; h++) {
        char name[SHOAL_SCHED_NAME_MAX];
        int x = -1;
        if (shoal_hostlist_nth(&hl, h, name, sizeof(name)) >= 0) {
            x = nodes ? shoal_sched_node_find(c, name) : -2;
        } else if (!nodes) {
            /* no switch has such a name: it was warned about as a node "not in slurm.conf"
             * and the link dropped, where a short unknown name is refused */
            shoal_error(SCHED, "%s:%d: switch '%s...' unknown (a name longer than %d)", src,
                        lineno, name, SHOAL_SCHED_NAME_MAX - 1);
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        /* named again under the same switch (Nodes=n[1-2],n1): Slurm takes a set; "under
         * two switches" or "two parents" refused such a topology.conf */
        if (x == -2) {
            x = shoal_sched_switch_find(c, name);
            if (x >= 0 && x != s && c->sw[x].parent == s) {
                continue;
            }
            if (x < 0 || x == s || c->sw[x].parent >= 0) {
                shoal_error(SCHED, "%s:%d: switch '%s' unknown, itself, or under two parents",
                            src, lineno, name);
                st = SHOAL_ERR_INVALID_ARG;
                break;
            }
            c->sw[x].parent = s;
            st = shoal_sched_list_add(&c->sw[s].kids, &c->sw[s].nkids, x) == 0
                     ? SHOAL_OK
                     : SHOAL_ERR_NO_MEMORY;
        } else if (x < 0) {
            shoal_warn(SCHED, "%s:%d: node '%s' is not in slurm.conf: ignored", src, lineno,
                       name);
        } else if (c->nodes[x].leaf == s) {
            continue;
        } else if (c->nodes[x].leaf >= 0) {
            shoal_error(SCHED, "%s:%d: node '%s' under two switches", src, lineno, name);
            st = SHOAL_ERR_INVALID_ARG;
        } else {
            st = shoal_sched_list_add(&c->sw[s].nodes, &c->sw[s].nnodes, x) == 0
                     ? SHOAL_OK
                     : SHOAL_ERR_NO_MEMORY;
            c->nodes[x].leaf = st == SHOAL_OK ? s : c->nodes[x].leaf;
        }
    }
    shoal_hostlist_free(&hl);
    return st;
}

static shoal_status_t shoal_sched_topo_line(void *vctx, shoal_sched_kv_t *kv, const char *src,
                                            int lineno)
{
    shoal_sched_topo_ctx_t *ctx = vctx;
    shoal_sched_cluster_t *c = ctx->c;
    int s;

    if (strcasecmp(kv->key[0], "SwitchName") != 0) {
        shoal_error(SCHED, "%s:%d: expected SwitchName=, got %s=", src, lineno, kv->key[0]);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (ctx->pass == 0) {
        if (shoal_sched_switch_find(c, kv->val[0]) >= 0) {
            shoal_error(SCHED, "%s:%d: switch '%s' defined twice", src, lineno, kv->val[0]);
            return SHOAL_ERR_INVALID_ARG;
        }
        if (kv->val[0][0] == '\0' || shoal_sched_switch_add(c, kv->val[0]) < 0) {
            shoal_error(SCHED, "%s:%d: bad switch name", src, lineno);
            return SHOAL_ERR_INVALID_ARG;
        }
        return SHOAL_OK;
    }
    s = shoal_sched_switch_find(c, kv->val[0]);
    for (int i = 1; i < kv->n; i++) {
        if (strcasecmp(kv->key[i], "Nodes") == 0 || strcasecmp(kv->key[i], "Switches") == 0) {
            SHOAL_CHECK(shoal_sched_topo_link(c, s, kv->val[i],
                                              strcasecmp(kv->key[i], "Nodes") == 0, src,
                                              lineno));
        } else if (strcasecmp(kv->key[i], "LinkSpeed") != 0) {
            shoal_error(SCHED, "%s:%d: unknown key %s", src, lineno, kv->key[i]);
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_sched_topology_parse(const char *text, const char *src,
                                          shoal_sched_cluster_t *c)
{
    shoal_sched_topo_ctx_t ctx = {.c = c, .pass = 0};
    SHOAL_CHECK(shoal_sched_lines(text, src, 1, shoal_sched_topo_line, &ctx));
    ctx.pass = 1;
    return shoal_sched_lines(text, src, 1, shoal_sched_topo_line, &ctx);
}

/* ---- the jobs file --------------------------------------------------------------------- */

typedef struct {
    shoal_sched_cluster_t *c;
    shoal_sched_queue_t *q;
    shoal_sched_index_t job_ix; /* the queue's job names, for "listed twice" */
} shoal_sched_jobs_ctx_t;

static const char *shoal_sched_job_name(const void *base, int i)
{
    return ((const shoal_sched_job_t *)base)[i].name;
}

static shoal_status_t shoal_sched_weight_set(shoal_sched_tenant_t *t, const char *v,
                                             const char *src, int lineno)
{
    char *end;
    double w = strtod(v, &end);
    /* Bounded below too: a share divided by a denormal weight (1e-320) is infinite, and
     * every such tenant ties with every other. */
    if (*end != '\0' || !(w >= 1e-6) || w > 1e6) {
        shoal_error(SCHED, "%s:%d: weight '%s' is not a number in [1e-6, 1e6]", src, lineno, v);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (t->weight > 0 && t->weight != w) {
        shoal_error(SCHED, "%s:%d: tenant %s has weight %g already, not %g", src, lineno,
                    t->name, t->weight, w);
        return SHOAL_ERR_INVALID_ARG;
    }
    t->weight = w;
    return SHOAL_OK;
}

/* A running job's ranks over its nodes, as evenly as possible, lowest free GPUs first. */
static shoal_status_t shoal_sched_job_alloc_nodes(shoal_sched_jobs_ctx_t *ctx,
                                                  shoal_sched_job_t *j, const char *nodes,
                                                  const char *src, int lineno)
{
    shoal_hostlist_t hl = {0};
    shoal_status_t st = shoal_hostlist_parse(nodes, &hl);
    int nn = (int)hl.nhosts, r = 0;

    if (st != SHOAL_OK || nn == 0 || nn > j->ranks) {
        shoal_error(SCHED, "%s:%d: nodes=%s: not a host list of 1..%d hosts", src, lineno,
                    nodes, j->ranks);
        shoal_hostlist_free(&hl);
        return SHOAL_ERR_INVALID_ARG;
    }
    j->node_of = malloc(sizeof(int) * (size_t)j->ranks);
    j->gpu_of = malloc(sizeof(int) * (size_t)j->ranks);
    /* the hosts named so far: a host named twice (n1,n2,n1) gave node[1-2,1] and its lines
     * twice in the launcher files; Slurm's node list of a job is a set */
    char *seen = calloc((size_t)ctx->c->nnodes + 1, 1);
    if (j->node_of == NULL || j->gpu_of == NULL || seen == NULL) {
        free(seen);
        shoal_hostlist_free(&hl);
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int h = 0; h < nn && st == SHOAL_OK; h++) {
        char name[SHOAL_SCHED_NAME_MAX];
        int n = shoal_hostlist_nth(&hl, (size_t)h, name, sizeof(name)) >= 0
                    ? shoal_sched_node_find(ctx->c, name) : -1;
        int cnt = j->ranks / nn + (h < j->ranks % nn), room;
        /* the host by name, and which fault: "node 17 of nodes=n[01-64] unknown or without
         * room" left both to be worked out */
        if (n < 0) {
            shoal_error(SCHED, "%s:%d: job %s: host %s of nodes=%s is not in slurm.conf", src,
                        lineno, j->name, name, nodes);
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        if (seen[n]) {
            shoal_error(SCHED, "%s:%d: job %s: host %s is named twice in nodes=%s", src, lineno,
                        j->name, name, nodes);
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        seen[n] = 1;
        room = shoal_sched_node_room(ctx->c, n, j->cpus, j->mem_mb); /* down or not */
        if (room < cnt) {
            shoal_error(SCHED, "%s:%d: job %s: host %s of nodes=%s has room for %d of its %d "
                        "ranks there (GPUs, CPUs and memory per rank)", src, lineno, j->name,
                        name, nodes, room, cnt);
            st = SHOAL_ERR_INVALID_ARG;
            break;
        }
        uint64_t used = ctx->c->nodes[n].gpu_used;
        for (int g = 0; cnt > 0 && g < ctx->c->nodes[n].gpus; g++) {
            if ((used & (1ULL << g)) == 0) {
                j->node_of[r] = n;
                j->gpu_of[r++] = g;
                used |= 1ULL << g;
                cnt--;
            }
        }
        for (int k = r - (j->ranks / nn + (h < j->ranks % nn)); k < r; k++) {
            shoal_sched_node_gpu_set(ctx->c, n, j->gpu_of[k], 1);
            ctx->c->nodes[n].cpus_used += j->cpus;
            ctx->c->nodes[n].mem_used += j->mem_mb;
        }
    }
    free(seen);
    shoal_hostlist_free(&hl);
    if (st == SHOAL_OK) {
        /* the node counters are set; the tenant's use comes with the job's demand */
        double d[SHOAL_SCHED_RES];
        shoal_sched_job_demand(j, d);
        for (int k = 0; k < SHOAL_SCHED_RES; k++) {
            ctx->q->tenants[j->tenant].use[k] += d[k];
        }
        j->state = SHOAL_SCHED_RUNNING;
    }
    return st;
}

/* A signal as sbatch --signal and scancel --signal take it (SIG already stripped): a name of
 * Slurm's sig_name2num, any case, or a number 1..64. "SIG" alone or a typo would be printed as
 * the victim's signal and only fail when the operator runs scancel. */
static int shoal_sched_signal_ok(const char *v)
{
    static const char *const names[] = {"HUP",  "INT",  "QUIT", "ABRT", "KILL", "ALRM",
                                        "TERM", "USR1", "USR2", "URG",  "CONT", "STOP",
                                        "TSTP", "TTIN", "TTOU", "XCPU"};
    long n;

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(names); i++) {
        if (strcasecmp(v, names[i]) == 0) {
            return 1;
        }
    }
    return shoal_sched_num(v, 0, 64, &n) == 0 && n >= 1;
}

static shoal_status_t shoal_sched_job_key(shoal_sched_jobs_ctx_t *ctx, shoal_sched_job_t *j,
                                          const char *k, const char *v, const char *src,
                                          int lineno, const char **nodes)
{
    long x = 0;
    int bad = 0;

    if (strcasecmp(k, "tenant") == 0) {
        j->tenant = shoal_sched_tenant_get(ctx->q, v);
        bad = j->tenant < 0;
    } else if (strcasecmp(k, "gpus") == 0 || strcasecmp(k, "ranks") == 0) {
        bad = shoal_sched_num(v, 0, 1 << 16, &x) != 0 || x < 1;
        j->ranks = (int)x;
    } else if (strcasecmp(k, "cpus") == 0) {
        bad = shoal_sched_num(v, 0, SHOAL_SCHED_CPUS_MAX, &x) != 0;
        j->cpus = (int)x;
    } else if (strcasecmp(k, "mem") == 0) {
        bad = shoal_sched_num(v, 1, 1L << 40, &x) != 0;
        j->mem_mb = x;
    } else if (strcasecmp(k, "class") == 0) {
        bad = strcasecmp(v, "reserved") != 0 && strcasecmp(v, "spot") != 0;
        j->cls = strcasecmp(v, "spot") == 0 ? SHOAL_SCHED_SPOT : SHOAL_SCHED_RESERVED;
    } else if (strcasecmp(k, "state") == 0) {
        bad = strcasecmp(v, "queued") != 0 && strcasecmp(v, "running") != 0;
    } else if (strcasecmp(k, "nodes") == 0) {
        *nodes = v;
    } else if (strcasecmp(k, "signal") == 0) {
        const char *sig = strncasecmp(v, "SIG", 3) == 0 ? v + 3 : v;
        bad = !shoal_sched_signal_ok(sig) || strlen(sig) >= sizeof(j->signal);
        if (!bad) {
            strcpy(j->signal, sig);
        }
    } else if (strcasecmp(k, "grace") == 0) {
        bad = shoal_sched_num(v, 0, 86400, &x) != 0;
        j->grace_s = (int)x;
    } else if (strcasecmp(k, "weight") != 0) {
        shoal_error(SCHED, "%s:%d: unknown key %s", src, lineno, k);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (bad) {
        shoal_error(SCHED, "%s:%d: bad value %s=%s", src, lineno, k, v);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_sched_jobs_line(void *vctx, shoal_sched_kv_t *kv, const char *src,
                                            int lineno)
{
    shoal_sched_jobs_ctx_t *ctx = vctx;
    const char *nodes = NULL, *weight = NULL;
    int running = 0;

    if (strcasecmp(kv->key[0], "tenant") == 0) {
        int t = shoal_sched_tenant_get(ctx->q, kv->val[0]);
        if (t < 0 || kv->n != 2 || strcasecmp(kv->key[1], "weight") != 0) {
            shoal_error(SCHED, "%s:%d: expected tenant=NAME weight=W", src, lineno);
            return SHOAL_ERR_INVALID_ARG;
        }
        return shoal_sched_weight_set(&ctx->q->tenants[t], kv->val[1], src, lineno);
    }
    if (strcasecmp(kv->key[0], "job") != 0) {
        shoal_error(SCHED, "%s:%d: a line starts with job= or tenant=, not %s=", src, lineno,
                    kv->key[0]);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (kv->val[0][0] == '\0' || strlen(kv->val[0]) >= SHOAL_SCHED_NAME_MAX ||
        strchr(kv->val[0], '/') != NULL) {
        shoal_error(SCHED, "%s:%d: job name empty, with '/', or longer than %d", src, lineno,
                    SHOAL_SCHED_NAME_MAX - 1);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (shoal_sched_index_find(&ctx->job_ix, kv->val[0], shoal_sched_job_name, ctx->q->jobs) >=
        0) {
        shoal_error(SCHED, "%s:%d: job %s listed twice", src, lineno, kv->val[0]);
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_sched_job_t *j = shoal_sched_job_new(ctx->q);
    if (j == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    strcpy(j->name, kv->val[0]);
    SHOAL_CHECK(shoal_sched_index_add(&ctx->job_ix, shoal_sched_job_name, ctx->q->jobs));
    j->tenant = -1;
    /* Slurm's default of one CPU per task: with 0, CPUs were not counted and a job was placed
     * on a node whose CPUs other jobs' cpus= had taken (cpus=0: none, as srun --overcommit) */
    j->cpus = 1;
    for (int i = 1; i < kv->n; i++) {
        SHOAL_CHECK(shoal_sched_job_key(ctx, j, kv->key[i], kv->val[i], src, lineno, &nodes));
        weight = strcasecmp(kv->key[i], "weight") == 0 ? kv->val[i] : weight;
        running |= strcasecmp(kv->key[i], "state") == 0 && strcasecmp(kv->val[i], "running") == 0;
    }
    if (j->tenant < 0 || j->ranks < 1) {
        shoal_error(SCHED, "%s:%d: job %s needs tenant= and gpus=", src, lineno, j->name);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (weight != NULL) {
        SHOAL_CHECK(shoal_sched_weight_set(&ctx->q->tenants[j->tenant], weight, src, lineno));
    }
    if (running != (nodes != NULL)) {
        shoal_error(SCHED, "%s:%d: job %s: state=running and nodes= go together", src, lineno,
                    j->name);
        return SHOAL_ERR_INVALID_ARG;
    }
    return running ? shoal_sched_job_alloc_nodes(ctx, j, nodes, src, lineno) : SHOAL_OK;
}

shoal_status_t shoal_sched_jobs_parse(const char *text, const char *src,
                                      shoal_sched_cluster_t *c, shoal_sched_queue_t *q)
{
    shoal_sched_jobs_ctx_t ctx = {.c = c, .q = q};
    shoal_status_t st = SHOAL_OK;
    while (st == SHOAL_OK && ctx.job_ix.n < q->njobs) {
        st = shoal_sched_index_add(&ctx.job_ix, shoal_sched_job_name, q->jobs);
    }
    st = st == SHOAL_OK ? shoal_sched_lines(text, src, 0, shoal_sched_jobs_line, &ctx) : st;
    shoal_sched_index_free(&ctx.job_ix);
    SHOAL_CHECK(st);
    for (int t = 0; t < q->ntenants; t++) {
        q->tenants[t].weight = q->tenants[t].weight > 0 ? q->tenants[t].weight : 1.0;
    }
    return SHOAL_OK;
}
