/* shoald: the spool of minutes the ledger did not take. An agent that stops while the
 * database is down (not slow: it does not answer at all) holds batches that no cursor in the
 * ledger reflects: the last minutes of ranks that ended, their failures, the cursor deletes of
 * pages billed to their end. Dropped, no later agent could bill them (their pages are gone).
 * So they are written to STATE_DIR/ledger.spool: one file, replaced atomically (a temporary
 * file of mode 0600, fsync, rename, fsync of the directory), made by the agent's user. The
 * next agent reads it at start and commits its batches, in order, before it reads a cursor
 * or a job's last minute (agent_minute.c, shoald_ledger_open), so that what it bills next
 * starts where the spooled batches end. After each batch is stored the file is rewritten
 * without it: a kill -9 in between replays that batch alone, which the ledger takes as the
 * exact replay of a stored commit (ledger.h), so nothing is billed twice.
 *
 * The file ends with an HMAC (a key derived from the ledger's) over all of it: a file that was
 * altered, cut short, written for another ledger key or host, not a regular file of the
 * agent's user with mode 0600, or a symbolic link is refused with the cause in the log and
 * renamed to ledger.spool.refused-UNIXTIME beside it, for the provider to look at; never
 * dropped, never billed from.
 *
 * Layout (host byte order: the file never leaves its host): the header, then per batch its
 * minute, its counts and its records and cursors as the agent holds them, then the MAC. */
#include "agent/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHOALD_SPOOL_MAGIC "SHOALSP1"
#define SHOALD_SPOOL_NAME "ledger.spool"
/* More than any agent holds: a batch per minute for a day of 4096 jobs is ~700 MiB, and a
 * file larger than this is not one we wrote. */
#define SHOALD_SPOOL_MAX (1024ull * 1024 * 1024)

typedef struct {
    char magic[8];
    uint32_t rec_size, cur_size;           /* the structs as this build lays them out */
    uint64_t nbatches;
    char host[64];                         /* the agent's host key */
} shoald_spool_head_t;

typedef struct {
    int64_t minute;
    uint64_t nrecs, ncurs;
} shoald_spool_bhead_t;

static int shoald_spool_path(const shoald_t *a, const char *suffix, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/%s%s", a->cfg->state_dir, SHOALD_SPOOL_NAME, suffix);

    return n > 0 && (size_t)n < len ? 0 : -1;
}

/* Two agents on one state_dir (a second one started by hand, by a second unit, or a stop
 * that took longer than the restart) each replay the spool the other writes: the same
 * minutes committed from two agents, or a spool one replaced with its own while the other
 * still had to read it. So the agent holds an exclusive flock on STATE_DIR/shoald.lock (open
 * close-on-exec, released by the kernel however the agent ends) from its start to its exit. */
shoal_status_t shoald_state_lock(shoald_t *a)
{
    const char *dir = a->cfg->state_dir;
    char path[4096];
    int fd, n;

    a->state_lock_fd = -1;
    n = snprintf(path, sizeof(path), "%s/shoald.lock", dir);
    if (n <= 0 || (size_t)n >= sizeof(path)) {
        shoal_error(METER, "state_dir %s is too long", dir);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        shoal_warn(METER, "cannot make state_dir %s: %s: minutes held at a stop with the "
                   "ledger down cannot be spooled", dir, strerror(errno));
        return SHOAL_OK;
    }
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        shoal_warn(METER, "cannot open %s: %s: minutes held at a stop with the ledger down "
                   "cannot be spooled", path, strerror(errno));
        return SHOAL_OK;
    }
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EINTR)
            continue;
        if (errno == EWOULDBLOCK) {
            shoal_error(METER, "another agent uses state_dir %s (it holds %s): give each agent "
                        "its own state_dir", dir, path);
        } else {
            shoal_error(METER, "flock(%s): %s", path, strerror(errno));
        }
        close(fd);
        return SHOAL_ERR_SYSTEM;
    }
    a->state_lock_fd = fd;
    return SHOAL_OK;
}

static shoal_status_t shoald_spool_mac(const shoald_t *a, const void *buf, size_t len,
                                       uint8_t mac[SHOAL_HMAC_BYTES])
{
    uint8_t key[SHOAL_HMAC_BYTES];
    shoal_status_t st;

    st = shoal_kdf(a->cfg->ledger_key, sizeof(a->cfg->ledger_key), "shoald ledger spool",
                   a->host_key, strlen(a->host_key), key);
    if (st == SHOAL_OK)
        st = shoal_hmac(key, sizeof(key), buf, len, mac);
    shoal_secret_wipe(key, sizeof(key));
    return st;
}

/* Appends len bytes to the buffer (*buf_p, *used_p of *cap_p); -1 without memory. */
static int shoald_spool_put(char **buf_p, size_t *used_p, size_t *cap_p, const void *p,
                            size_t len)
{
    if (*used_p + len > *cap_p) {
        size_t cap = SHOAL_MAX(2 * *cap_p, *used_p + len);
        char *buf = realloc(*buf_p, cap);

        if (buf == NULL)
            return -1;
        *buf_p = buf;
        *cap_p = cap;
    }
    if (len > 0)
        memcpy(*buf_p + *used_p, p, len);
    *used_p += len;
    return 0;
}

static int shoald_spool_put_list(char **buf_p, size_t *used_p, size_t *cap_p,
                                 const shoald_batch_t *b, uint64_t *n_p)
{
    for (; b != NULL; b = b->next) {
        shoald_spool_bhead_t bh = {.minute = b->minute, .nrecs = b->nrecs, .ncurs = b->ncurs};

        if (shoald_spool_put(buf_p, used_p, cap_p, &bh, sizeof(bh)) != 0 ||
            shoald_spool_put(buf_p, used_p, cap_p, b->recs, b->nrecs * sizeof(*b->recs)) != 0 ||
            shoald_spool_put(buf_p, used_p, cap_p, b->curs, b->ncurs * sizeof(*b->curs)) != 0)
            return -1;
        (*n_p)++;
    }
    return 0;
}

static shoal_status_t shoald_spool_write(const char *path, const char *tmp, const char *dir,
                                         const char *buf, size_t len)
{
    size_t off = 0;
    ssize_t n;
    int fd, dfd;

    (void)unlink(tmp); /* one a kill -9 left behind */
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        shoal_error(METER, "spool: cannot create %s: %s", tmp, strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    while (off < len) {
        n = write(fd, buf + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    if (off < len || fsync(fd) != 0) {
        shoal_error(METER, "spool: cannot write %s: %s", tmp,
                    off < len && errno == 0 ? "short write" : strerror(errno));
        close(fd);
        (void)unlink(tmp);
        return SHOAL_ERR_TRANSPORT;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        shoal_error(METER, "spool: cannot rename %s to %s: %s", tmp, path, strerror(errno));
        (void)unlink(tmp);
        return SHOAL_ERR_TRANSPORT;
    }
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd); /* the rename itself survives a power loss */
        close(dfd);
    }
    return SHOAL_OK;
}

shoal_status_t shoald_spool_save(shoald_t *a, const shoald_batch_t *first,
                                 const shoald_batch_t *second)
{
    char path[4096], tmp[4096];
    shoald_spool_head_t h;
    uint8_t mac[SHOAL_HMAC_BYTES];
    char *buf = NULL;
    size_t used = 0, cap = 0;
    shoal_status_t st;

    if (shoald_spool_path(a, "", path, sizeof(path)) != 0 ||
        shoald_spool_path(a, ".tmp", tmp, sizeof(tmp)) != 0) {
        shoal_error(METER, "spool: state_dir %s is too long", a->cfg->state_dir);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (a->spool_stuck) {
        /* a refused spool could not be put aside: writing would replace it */
        shoal_error(METER, "spool: %s was refused and is still there: not replaced", path);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (first == NULL && second == NULL) {
        if (unlink(path) != 0 && errno != ENOENT) {
            shoal_error(METER, "spool: cannot remove %s: %s", path, strerror(errno));
            return SHOAL_ERR_TRANSPORT;
        }
        return SHOAL_OK;
    }
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, SHOALD_SPOOL_MAGIC, sizeof(h.magic));
    h.rec_size = sizeof(shoal_ledger_record_t);
    h.cur_size = sizeof(shoal_ledger_cursor_t);
    snprintf(h.host, sizeof(h.host), "%s", a->host_key);
    if (shoald_spool_put(&buf, &used, &cap, &h, sizeof(h)) != 0 ||
        shoald_spool_put_list(&buf, &used, &cap, first, &h.nbatches) != 0 ||
        shoald_spool_put_list(&buf, &used, &cap, second, &h.nbatches) != 0 ||
        shoald_spool_put(&buf, &used, &cap, mac, sizeof(mac)) != 0) {
        free(buf);
        shoal_error(METER, "spool: out of memory");
        return SHOAL_ERR_NO_MEMORY;
    }
    memcpy(buf, &h, sizeof(h)); /* with its count */
    st = shoald_spool_mac(a, buf, used - sizeof(mac), mac);
    if (st == SHOAL_OK) {
        memcpy(buf + used - sizeof(mac), mac, sizeof(mac));
        /* the directory of the agent's state: made private when it is missing */
        if (mkdir(a->cfg->state_dir, 0700) != 0 && errno != EEXIST)
            shoal_warn(METER, "spool: cannot make %s: %s", a->cfg->state_dir, strerror(errno));
        st = shoald_spool_write(path, tmp, a->cfg->state_dir, buf, used);
    }
    free(buf);
    return st;
}

/* A cursor of this agent's host: keyed by its host key, or the deletion of a cursor under the
 * older key of a host name of more than 32 characters (its first 32: shoald_page_cursor), which
 * the batch of such a page's next minute holds. */
static int shoald_spool_key_ours(const shoald_t *a, const shoal_ledger_cursor_t *c)
{
    size_t n = strlen(a->host_key);

    if (strncmp(c->key, a->host_key, n) == 0 && c->key[n] == ':')
        return 1;
    n = strnlen(a->hostname, 32);
    return c->ncounters < 0 && strcmp(a->host_key, a->hostname) != 0 && n > 0 &&
           strncmp(c->key, a->hostname, n) == 0 && c->key[n] == ':';
}

/* Checks the file's contents; 0, or -1 with the cause in why. */
static int shoald_spool_parse(shoald_t *a, const char *buf, size_t len, shoald_batch_t **list_p,
                              unsigned *n_p, char *why, size_t whylen)
{
    shoald_spool_head_t h;
    shoald_batch_t *list = NULL, **tail = &list, *b;
    uint8_t mac[SHOAL_HMAC_BYTES];
    size_t off = sizeof(h), end;
    uint64_t i, k;

    if (len < sizeof(h) + sizeof(mac)) {
        snprintf(why, whylen, "is too short (%zu bytes) to be a spool", len);
        return -1;
    }
    memcpy(&h, buf, sizeof(h));
    if (memcmp(h.magic, SHOALD_SPOOL_MAGIC, sizeof(h.magic)) != 0 ||
        h.rec_size != sizeof(shoal_ledger_record_t) ||
        h.cur_size != sizeof(shoal_ledger_cursor_t)) {
        snprintf(why, whylen, "is not a spool of this agent's version");
        return -1;
    }
    if (strnlen(h.host, sizeof(h.host)) == sizeof(h.host) || strcmp(h.host, a->host_key) != 0) {
        snprintf(why, whylen, "was written by the agent of another host (%.63s, this one is "
                 "%s)", h.host, a->host_key);
        return -1;
    }
    end = len - sizeof(mac);
    if (shoald_spool_mac(a, buf, end, mac) != SHOAL_OK ||
        !shoal_memeq_ct(mac, buf + end, sizeof(mac))) {
        snprintf(why, whylen, "does not verify with the ledger's key (altered, cut short, or "
                 "written for another ledger)");
        return -1;
    }
    for (i = 0; i < h.nbatches; i++) {
        shoald_spool_bhead_t bh;

        if (end - off < sizeof(bh))
            goto err_short;
        memcpy(&bh, buf + off, sizeof(bh));
        off += sizeof(bh);
        if (bh.nrecs > (end - off) / sizeof(shoal_ledger_record_t) ||
            bh.ncurs > (end - off - bh.nrecs * sizeof(shoal_ledger_record_t)) /
                           sizeof(shoal_ledger_cursor_t))
            goto err_short;
        b = calloc(1, sizeof(*b));
        if (b != NULL) {
            b->recs = malloc((bh.nrecs + 1) * sizeof(*b->recs));
            b->curs = malloc((bh.ncurs + 1) * sizeof(*b->curs));
        }
        if (b == NULL || b->recs == NULL || b->curs == NULL) {
            if (b != NULL)
                shoald_batch_free(b);
            snprintf(why, whylen, "cannot be read: out of memory");
            goto err;
        }
        *tail = b;
        tail = &b->next;
        b->minute = bh.minute;
        b->nrecs = bh.nrecs;
        b->ncurs = bh.ncurs;
        memcpy(b->recs, buf + off, bh.nrecs * sizeof(*b->recs));
        off += bh.nrecs * sizeof(*b->recs);
        memcpy(b->curs, buf + off, bh.ncurs * sizeof(*b->curs));
        off += bh.ncurs * sizeof(*b->curs);
        for (k = 0; k < b->nrecs; k++) {
            const shoal_ledger_record_t *r = &b->recs[k];

            if (!shoal_ledger_record_ok(r) || strcmp(r->host, a->host_key) != 0) {
                snprintf(why, whylen, "holds a record the ledger would refuse or of another "
                         "host (batch %llu)", (unsigned long long)i);
                goto err;
            }
        }
        for (k = 0; k < b->ncurs; k++) {
            const shoal_ledger_cursor_t *c = &b->curs[k];

            if (!shoal_ledger_cursor_ok(c) || !shoald_spool_key_ours(a, c)) {
                snprintf(why, whylen, "holds a cursor the ledger would refuse or of another "
                         "host (batch %llu)", (unsigned long long)i);
                goto err;
            }
        }
        (*n_p)++;
    }
    if (off != end)
        goto err_short;
    *list_p = list;
    return 0;

err_short:
    snprintf(why, whylen, "is cut short or has bytes past its batches");
err:
    while ((b = list) != NULL) {
        list = b->next;
        shoald_batch_free(b);
    }
    *n_p = 0;
    return -1;
}

/* Moves a refused spool aside (the link itself for a symbolic link: link() does not follow
 * it), so that it is kept and the agent's next spool does not replace it; never over an
 * earlier refused one (rename would). */
static void shoald_spool_refuse(shoald_t *a, const char *path, const char *why)
{
    char aside[4096], suffix[64];
    long long now = (long long)time(NULL);

    errno = 0;
    for (int i = 0; i < 100; i++) {
        if (i == 0)
            snprintf(suffix, sizeof(suffix), ".refused-%lld", now);
        else
            snprintf(suffix, sizeof(suffix), ".refused-%lld.%d", now, i);
        if (shoald_spool_path(a, suffix, aside, sizeof(aside)) != 0)
            break;
        if (link(path, aside) != 0) {
            struct stat sb;

            if (errno == EEXIST)
                continue;
            /* protected_hardlinks refuses a link to another user's file: renamed, in the
             * agent's own directory, to a name that is not there */
            if (lstat(aside, &sb) == 0 || errno != ENOENT || rename(path, aside) != 0)
                break;
        } else if (unlink(path) != 0) {
            int err = errno;

            (void)unlink(aside);
            errno = err;
            break;
        }
        shoal_error(METER, "spool: %s %s: refused, its minutes are not billed; kept as %s "
                    "for the provider to look at", path, why, aside);
        return;
    }
    a->spool_stuck = 1;
    shoal_error(METER, "spool: %s %s: refused, its minutes are not billed; it cannot be "
                "renamed aside (%s) and stays where it is: no spool is written over it", path,
                why, strerror(errno));
}

shoal_status_t shoald_spool_load(shoald_t *a, shoald_batch_t **list_p, unsigned *n_p)
{
    char path[4096], why[256];
    struct stat sb;
    char *buf = NULL;
    size_t off = 0;
    ssize_t n;
    int fd;

    *list_p = NULL;
    *n_p = 0;
    if (shoald_spool_path(a, "", path, sizeof(path)) != 0) {
        shoal_error(METER, "spool: state_dir %s is too long", a->cfg->state_dir);
        return SHOAL_ERR_INVALID_ARG;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT)
        return SHOAL_OK;
    if (fd < 0) {
        int err = errno;

        snprintf(why, sizeof(why), "cannot be opened (%s)",
                 err == ELOOP ? "a symbolic link" : strerror(err));
        goto err_refuse;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(why, sizeof(why), "is not a regular file");
        goto err_close;
    }
    if (sb.st_uid != geteuid() || (sb.st_mode & 077) != 0) {
        snprintf(why, sizeof(why), "is owned by uid %u with mode %04o (the agent writes its "
                 "own, uid %u, mode 0600)", (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777),
                 (unsigned)geteuid());
        goto err_close;
    }
    if ((uint64_t)sb.st_size > SHOALD_SPOOL_MAX) {
        snprintf(why, sizeof(why), "is larger than %llu bytes",
                 (unsigned long long)SHOALD_SPOOL_MAX);
        goto err_close;
    }
    buf = malloc((size_t)sb.st_size + 1);
    if (buf == NULL) {
        close(fd);
        shoal_error(METER, "spool: out of memory reading %s: left for the next start", path);
        return SHOAL_ERR_NO_MEMORY;
    }
    while (off < (size_t)sb.st_size) {
        n = read(fd, buf + off, (size_t)sb.st_size - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    close(fd);
    if (shoald_spool_parse(a, buf, off, list_p, n_p, why, sizeof(why)) != 0)
        goto err_refuse;
    free(buf);
    if (*n_p > 0)
        shoal_info(METER, "spool: %s holds %u minutes the last agent could not write to the "
                   "ledger: they are written before anything else", path, *n_p);
    return SHOAL_OK;

err_close:
    close(fd);
err_refuse:
    free(buf);
    shoald_spool_refuse(a, path, why);
    return SHOAL_ERR_INVALID_ARG;
}

/* Only an agent with a ledger reads the spool: one started with ledger_url=none over the
 * state_dir of one that had a ledger left its minutes there, billed by no one, without a
 * word. It stays for an agent with that ledger. */
void shoald_spool_unread(shoald_t *a)
{
    char path[4096];
    struct stat sb;

    if (shoald_spool_path(a, "", path, sizeof(path)) != 0 || lstat(path, &sb) != 0)
        return;
    shoal_warn(METER, "spool: %s holds minutes an agent could not write to its ledger: with "
               "ledger_url=none they are not billed; an agent with that ledger writes them at "
               "its start", path);
}
