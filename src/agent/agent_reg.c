/* shoald: the registration socket. A rank connects, sends one shoal_meter_reg_t followed by
 * its credential text, with the memfd of its metering page attached (SCM_RIGHTS), and reads
 * one shoal_meter_reg_reply_t. The connection then stays open: its end is the sign that the
 * communicator ended (the pidfd tells the process's exit); a byte on it ends it too.
 *
 * The agent believes the kernel, not the job: pid, uid and gid come from SO_PEERCRED, the
 * tenant from a credential that verifies with the tenant's key. Everything else is checked:
 * one descriptor exactly, a sealed memfd of the page's size, the page's header, names, ranks.
 * Every read is non-blocking with a deadline (reg_timeout); at most max_pending registrations
 * are in progress (the oldest is dropped); a refusal is answered with a reason, counted per
 * reason, per claimed tenant and per uid, and the agent goes on. */
#include "agent/agent.h"
#include "tenant/tenant.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif

/* Ancillary room: more than one is refused, not truncated. As many as one message can carry
 * (SCM_MAX_FD): the kernel closes one that does not fit, in the agent's recvmsg, where its
 * close could wait (shoald_close_later). */
#define SHOALD_REG_MAX_FDS 253
#define SHOALD_REG_BACKLOG 128
#define SHOALD_FD_RESERVE 64    /* the agent's own: listeners, epoll, signalfd, the ledger's,
                                 * /proc reads, the tc script's */
#define SHOALD_REG_LOG_PER_MINUTE 20
#define SHOALD_REG_ACCEPT_PAUSE_MS 100 /* accept failed for want of descriptors or memory */

typedef struct shoald_pend {
    struct shoald_pend *next, *prev;
    shoald_tag_t tag;
    int fd;
    int memfd;                  /* first descriptor received, -1 none */
    int extra_fds;              /* more descriptors than one, or truncated ancillary data */
    int evicted;                /* dropped for a newer one (max_pending), at the next sweep */
    uint64_t deadline_ns;
    struct ucred peer;
    size_t len;
    uint8_t buf[sizeof(shoal_meter_reg_t) + SHOAL_TENANT_CRED_TEXT_MAX];
} shoald_pend_t;

struct shoald_reg {
    shoald_t *a;
    int epfd;
    int lfd;
    shoald_tag_t tag;
    shoald_pend_t *head, *tail; /* oldest first */
    unsigned npending;
    unsigned logged, suppressed;
    uint64_t log_minute;
    uint64_t accept_resume_ns;  /* the listener is out of the epoll set until then; 0: in it */
    unsigned accept_failures;   /* accepts failed since the last that worked */
    int nopidfd_said;           /* "no pidfds here" was logged */
};

const char *shoald_refusal_name(int r)
{
    static const char *const names[] = {
#define SHOALD_REFUSAL_NAME_(n, s) s,
        SHOALD_REFUSAL_MAP(SHOALD_REFUSAL_NAME_)
#undef SHOALD_REFUSAL_NAME_
    };
    return r >= 0 && r < SHOALD_NREFUSALS ? names[r] : "?";
}

/* ---- closing what clients handed over --------------------------------------------------- */

/* A client could hand the agent a descriptor whose last close() waits: a loopback TCP socket
 * with unsent data and SO_LINGER waits up to its linger time (without end for a large one;
 * the agent's signals are blocked, so SIGTERM did not end it), a FUSE file until its daemon
 * answers. Closed in the loop, such a page (refused), one more descriptor, or one that came
 * with a byte after the registration stopped registrations, /metrics and the minute for every
 * tenant. They are closed on this thread, an abortive close for a socket so that one that
 * lingers anyway holds up few others; when its pipe is full (it is stuck) the loop closes. */
struct shoald_closer {
    int wfd;                    /* non-blocking write end: one int per descriptor */
    int epfd;                   /* the loop's: a descriptor leaves it before it is queued */
};

static void *shoald_closer_main(void *arg)
{
    const struct linger off = {.l_onoff = 1, .l_linger = 0};
    struct pollfd pfd = {.fd = (int)(intptr_t)arg, .events = POLLIN};
    ssize_t ret;
    int fd;

    for (;;) {
        if (poll(&pfd, 1, 1000) <= 0) /* idle: look again (EINTR, or nothing in a second) */
            continue;
        ret = read(pfd.fd, &fd, sizeof(fd));
        if (ret < 0 && errno == EINTR)
            continue;
        if (ret != (ssize_t)sizeof(fd))
            break; /* the write end was closed: the agent stops */
        (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &off, sizeof(off));
        close(fd);
    }
    close(pfd.fd);
    return NULL;
}

void shoald_close_later(shoald_t *a, int fd)
{
    if (fd < 0)
        return;
    /* Out of the loop's epoll set first: it leaves it by itself only once closed, and its tag
     * (a registration, a page) is freed before. Writes of an int are atomic (below
     * PIPE_BUF): the thread reads whole ones. */
    if (a->closer != NULL && fcntl(fd, F_GET_SEALS) < 0) {
        (void)epoll_ctl(a->closer->epfd, EPOLL_CTL_DEL, fd, NULL);
        if (write(a->closer->wfd, &fd, sizeof(fd)) == (ssize_t)sizeof(fd))
            return;
    }
    close(fd);
}

static void shoald_closer_start(shoald_t *a, int epfd)
{
    struct shoald_closer *c = calloc(1, sizeof(*c));
    pthread_attr_t attr;
    pthread_t th;
    int p[2] = {-1, -1}, err;

    if (c == NULL || pipe2(p, O_CLOEXEC) != 0 || fcntl(p[1], F_SETFL, O_NONBLOCK) != 0) {
        err = errno;
    } else if ((err = pthread_attr_init(&attr)) == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        err = pthread_create(&th, &attr, shoald_closer_main, (void *)(intptr_t)p[0]);
        pthread_attr_destroy(&attr);
        if (err == 0) {
            c->wfd = p[1];
            c->epfd = epfd;
            a->closer = c;
            return;
        }
    }
    shoal_warn(METER, "no thread to close clients' descriptors (%s): the loop closes them",
               strerror(err));
    if (p[0] >= 0) {
        close(p[0]);
        close(p[1]);
    }
    free(c);
}

/* The thread closes what is queued, then ends; later closes are the loop's own. */
static void shoald_closer_stop(shoald_t *a)
{
    if (a->closer == NULL)
        return;
    close(a->closer->wfd);
    free(a->closer);
    a->closer = NULL;
}

/* ---- listening socket ------------------------------------------------------------------ */

static shoal_status_t shoald_reg_mkdir(const char *path)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)], *p;

    snprintf(dir, sizeof(dir), "%s", path);
    p = strrchr(dir, '/');
    if (p == NULL || p == dir)
        return SHOAL_OK;
    *p = '\0';
    for (p = dir + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            goto err;
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        goto err;
    return SHOAL_OK;
err:
    shoal_error(METER, "cannot create %s: %s", dir, strerror(errno));
    return SHOAL_ERR_SYSTEM;
}

/* A socket file left by an agent that died is removed; one that answers is another agent. */
static shoal_status_t shoald_reg_stale(const struct sockaddr_un *sa)
{
    struct stat st;
    int fd, ret;

    if (lstat(sa->sun_path, &st) != 0)
        return SHOAL_OK;
    if (!S_ISSOCK(st.st_mode)) {
        shoal_error(METER, "%s exists and is not a socket", sa->sun_path);
        return SHOAL_ERR_SYSTEM;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return SHOAL_ERR_SYSTEM;
    ret = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    close(fd);
    if (ret == 0) {
        shoal_error(METER, "another agent listens on %s", sa->sun_path);
        return SHOAL_ERR_SYSTEM;
    }
    unlink(sa->sun_path);
    return SHOAL_OK;
}

static shoal_status_t shoald_reg_listen(shoald_reg_t *r)
{
    const shoald_config_t *cfg = r->a->cfg;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct group *gr;
    char *end;
    gid_t gid;

    if (strlen(cfg->listen) >= sizeof(sa.sun_path)) {
        shoal_error(METER, "socket path %s is too long", cfg->listen);
        return SHOAL_ERR_INVALID_ARG;
    }
    memcpy(sa.sun_path, cfg->listen, strlen(cfg->listen) + 1);
    SHOAL_CHECK(shoald_reg_mkdir(sa.sun_path));
    SHOAL_CHECK(shoald_reg_stale(&sa));
    r->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->lfd < 0 || bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        shoal_error(METER, "cannot bind %s: %s", sa.sun_path, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    if (chmod(sa.sun_path, cfg->socket_mode) != 0) {
        shoal_error(METER, "chmod %o %s: %s", cfg->socket_mode, sa.sun_path, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    if (cfg->socket_group != NULL) {
        gr = getgrnam(cfg->socket_group);
        gid = gr != NULL ? gr->gr_gid : (gid_t)strtoul(cfg->socket_group, &end, 10);
        if ((gr == NULL && *end != '\0') || chown(sa.sun_path, (uid_t)-1, gid) != 0) {
            shoal_error(METER, "cannot give %s to group %s: %s", sa.sun_path,
                        cfg->socket_group, gr == NULL && *end != '\0' ? "no such group" :
                        strerror(errno));
            return SHOAL_ERR_SYSTEM;
        }
    }
    if (listen(r->lfd, SHOALD_REG_BACKLOG) != 0) {
        shoal_error(METER, "listen %s: %s", sa.sun_path, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    return SHOAL_OK;
}

/* A page holds two descriptors while it is kept (its connection, its pidfd). Past the
 * process's limit the agent had none left: the kernel dropped the page's memfd (refused as
 * "no page descriptor was attached", the client's fault), a pidfd failed (the page taken for
 * exited while its rank ran) and accept failed. The soft limit is raised to the hard one, and
 * max_pages lowered, said once, to what is left besides the agent's own descriptors, the HTTP
 * connections, two per registration in progress and one pass of accept over the backlog
 * (taken in before the oldest in progress are dropped). */
static void shoald_reg_fd_budget(shoald_config_t *cfg)
{
    unsigned long long reserve, room;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t cur = rl.rlim_cur;

        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = cur;
    }
    reserve = SHOALD_FD_RESERVE + SHOALD_REG_BACKLOG + 2ull * cfg->max_pending +
              (cfg->http != NULL ? SHOALD_HTTP_MAX_CONN + SHOALD_HTTP_SPARE : 0);
    room = rl.rlim_cur > reserve ? (rl.rlim_cur - reserve) / 2 : 0;
    if (room >= cfg->max_pages)
        return;
    shoal_warn(METER, "max_pages=%u needs %llu file descriptors, this process may open %llu "
               "(raise it: ulimit -n, LimitNOFILE=): the agent keeps at most %llu pages",
               cfg->max_pages, 2ull * cfg->max_pages + reserve,
               (unsigned long long)rl.rlim_cur, room);
    cfg->max_pages = (unsigned)room;
}

/* ---- pending registrations ------------------------------------------------------------ */

static void shoald_reg_pend_free(shoald_reg_t *r, shoald_pend_t *q, int close_fd)
{
    if (q->prev != NULL)
        q->prev->next = q->next;
    else
        r->head = q->next;
    if (q->next != NULL)
        q->next->prev = q->prev;
    else
        r->tail = q->prev;
    r->npending--;
    if (close_fd)
        shoald_close_later(r->a, q->fd); /* its queue may hold descriptors the client sent */
    shoald_close_later(r->a, q->memfd);
    shoal_secret_wipe(q->buf, sizeof(q->buf)); /* the credential is a bearer token */
    free(q);
}

static void shoald_reg_reply(int fd, shoal_status_t st, const char *reason)
{
    shoal_meter_reg_reply_t rep;
    ssize_t ret;

    memset(&rep, 0, sizeof(rep));
    rep.magic = SHOAL_METER_REG_MAGIC;
    rep.status = st;
    snprintf(rep.reason, sizeof(rep.reason), "%s", reason);
    /* A fresh socket's buffer holds it: never blocks, a peer that left gets nothing. */
    ret = send(fd, &rep, sizeof(rep), MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)ret;
}

/* A new minute of the refusals' log: the count of those the last one left out is said. Said
 * only at the next refusal, a burst that stopped left its 20 lines and no word of the others:
 * the loop's timer says it too (shoald_reg_timeouts, shoald_reg_wait_ms). */
static void shoald_reg_log_minute(shoald_reg_t *r)
{
    uint64_t minute = shoald_unix_ns() / 60000000000ull;

    if (minute == r->log_minute)
        return;
    if (r->suppressed > 0)
        shoal_warn(METER, "%u more refused registrations were not logged", r->suppressed);
    r->log_minute = minute;
    r->logged = 0;
    r->suppressed = 0;
}

static void shoald_reg_log_refusal(shoald_reg_t *r, const char *msg)
{
    shoald_reg_log_minute(r);
    if (r->logged++ < SHOALD_REG_LOG_PER_MINUTE)
        shoal_warn(METER, "%s", msg);
    else
        r->suppressed++;
}

static void shoald_reg_refuse(shoald_reg_t *r, shoald_pend_t *q, shoald_refusal_t why,
                              shoal_status_t st, const char *claimed, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void shoald_reg_refuse(shoald_reg_t *r, shoald_pend_t *q, shoald_refusal_t why,
                              shoal_status_t st, const char *claimed, const char *fmt, ...)
{
    char reason[120], line[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    r->a->refused[why]++;
    shoald_abuse_note(r->a, claimed, q->peer.uid, why == SHOALD_REFUSE_BAD_CREDENTIAL ||
                      why == SHOALD_REFUSE_EXPIRED);
    snprintf(line, sizeof(line), "registration of pid %d (uid %u) refused (%s): %s",
             (int)q->peer.pid, (unsigned)q->peer.uid, shoald_refusal_name(why), reason);
    shoald_reg_log_refusal(r, line);
    shoald_reg_reply(q->fd, st, reason);
    shoald_reg_pend_free(r, q, 1);
}

static int shoald_reg_uid_ok(const shoald_tenant_t *t, uid_t uid)
{
    size_t i;

    if (t->uids == NULL)
        return 1;
    for (i = 0; i < t->nuids; i++) {
        if (t->uids[i] == uid)
            return 1;
    }
    return 0;
}

/* Every page the agent holds for uid: live, and ended but not yet billed and collected (those
 * count in npages too, so one uid that churns registrations cannot fill max_pages for all). */
static unsigned shoald_reg_uid_pages(shoald_t *a, uid_t uid)
{
    shoald_job_t *j;
    shoald_page_t *p;
    unsigned n = 0;

    for (j = a->jobs; j != NULL; j = j->next) {
        for (p = j->pages; p != NULL; p = p->next)
            n += p->uid == uid;
    }
    return n;
}

/* The peer's pidfd, or -1 with errno: ESRCH when the process is gone. */
static int shoald_reg_pidfd(shoald_pend_t *q)
{
    socklen_t len = sizeof(int);
    int fd = -1;

    /* The kernel's pidfd of the peer (Linux 6.5): no window for pid reuse. */
    if (getsockopt(q->fd, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) {
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        return fd;
    }
    return (int)syscall(SYS_pidfd_open, q->peer.pid, 0);
}

/* The page is checked: its header, identity and names. NULL when it is fine. */
static const char *shoald_reg_page_check(const shoal_meter_page_t *s)
{
    if (s->magic != SHOAL_METER_MAGIC)
        return "the page's magic is wrong";
    if (s->version < SHOAL_METER_VERSION_MIN || s->version > SHOAL_METER_VERSION)
        return "the page's version is not supported";
    if (s->size != sizeof(shoal_meter_page_t))
        return "the page's size field is wrong";
    if (s->nranks <= 0 || s->rank < 0 || s->rank >= s->nranks)
        return "the page's rank is out of range";
    /* gpus[] lists the first SHOAL_METER_MAX_GPUS; the count is all of them (a rank that
     * sees 17 MIG instances or declares count:32 was refused, and ran unmetered) */
    if (s->ngpus < 0 || s->ngpus > SHOAL_METER_NGPUS_MAX)
        return "the page's GPU count is out of range";
    if (!shoald_name_ok(s->job, sizeof(s->job)))
        return "the page's job name is missing or not printable";
    if (s->tenant[0] != '\0' && !shoald_name_ok(s->tenant, sizeof(s->tenant)))
        return "the page's tenant name is not printable";
    return NULL;
}

/* The tenant claim: credential (verified with the tenant's key), then the uid. On refusal it
 * answers and frees q and returns NULL. */
static const char *shoald_reg_claim(shoald_reg_t *r, shoald_pend_t *q,
                                    const shoal_meter_page_t *s, const char *credtext,
                                    int *cred_class, int *cred_weight)
{
    char why[SHOAL_TENANT_CRED_WHY_MAX];
    shoal_tenant_cred_t cred;
    shoald_tenant_t *t;
    shoal_status_t st;
    const char *cls;

    if (credtext[0] == '\0') {
        if (s->tenant[0] != '\0' || !r->a->cfg->allow_uncredentialed) {
            shoald_reg_refuse(r, q, SHOALD_REFUSE_NO_CREDENTIAL, SHOAL_ERR_PERMISSION,
                              s->tenant, "no credential%s%s", s->tenant[0] != '\0' ?
                              " for the claimed tenant " : "", s->tenant);
            return NULL;
        }
        return "reserved";
    }
    /* The quiet variants: any local user can send credentials, and the library's parser
     * logs each failure; the refusal's line is the only one, rate-limited. */
    if (shoal_tenant_cred_parse_quiet(credtext, &cred, why, sizeof(why)) != SHOAL_OK) {
        shoald_reg_refuse(r, q, SHOALD_REFUSE_BAD_CREDENTIAL, SHOAL_ERR_AUTH, s->tenant,
                          "the credential is malformed: %s", why);
        goto refused;
    }
    t = shoald_config_tenant(r->a->cfg, cred.id.tenant);
    if (t == NULL) {
        shoald_reg_refuse(r, q, SHOALD_REFUSE_UNKNOWN_TENANT, SHOAL_ERR_PERMISSION, NULL,
                          "tenant %.64s is not served by this agent", cred.id.tenant);
        goto refused;
    }
    st = shoal_tenant_cred_verify_quiet(&cred, t->key, (int64_t)(shoald_unix_ns() / 1000000000ull),
                                        NULL, 0);
    /* Expired (its MAC verified) while it ran: a rank whose page the ledger held open when
     * this agent started, back from the same process, is let in again. It registered before
     * its credential expired, and its counts since went on; refused, the rest of its job ran
     * unmetered after an agent restart. */
    if (st == SHOAL_ERR_PERMISSION &&
        shoald_rejoin_expected(r->a, cred.id.tenant, cred.id.job, q->peer.pid)) {
        shoal_info(METER, "%s/%s: the credential expired while its rank ran; its page was open "
                   "in the ledger when this agent started, so it registers again", t->name,
                   cred.id.job);
        st = SHOAL_OK;
    }
    if (st != SHOAL_OK) {
        shoald_reg_refuse(r, q, st == SHOAL_ERR_PERMISSION ? SHOALD_REFUSE_EXPIRED :
                          SHOALD_REFUSE_BAD_CREDENTIAL, st == SHOAL_ERR_PERMISSION ?
                          SHOAL_ERR_PERMISSION : SHOAL_ERR_AUTH, t->name,
                          st == SHOAL_ERR_PERMISSION ? "the credential of tenant %s expired" :
                          "the credential does not verify with the key of tenant %s",
                          t->name);
        goto refused;
    }
    if (strcmp(s->tenant, cred.id.tenant) != 0 || strcmp(s->job, cred.id.job) != 0 ||
        s->epoch != cred.id.epoch) {
        shoald_reg_refuse(r, q, SHOALD_REFUSE_TENANT_MISMATCH, SHOAL_ERR_PERMISSION, s->tenant,
                          "the page claims tenant %.32s job %.32s, the credential names "
                          "another tenant, job or epoch", s->tenant, s->job);
        goto refused;
    }
    if (!shoald_reg_uid_ok(t, q->peer.uid)) {
        shoald_reg_refuse(r, q, SHOALD_REFUSE_UID_NOT_ALLOWED, SHOAL_ERR_PERMISSION, t->name,
                          "uid %u may not run jobs of tenant %s", (unsigned)q->peer.uid,
                          t->name);
        goto refused;
    }
    cls = cred.id.qos_class == SHOAL_QOS_SPOT ? "spot" : t->class_name;
    *cred_class = cred.id.qos_class;
    *cred_weight = cred.id.qos_weight;
    shoal_secret_wipe(&cred, sizeof(cred));
    return cls;
refused:
    shoal_secret_wipe(&cred, sizeof(cred)); /* its MAC is a bearer token */
    return NULL;
}

/* The message is complete: check everything, then hand the page to the aggregation. */
static void shoald_reg_complete(shoald_reg_t *r, shoald_pend_t *q)
{
    const shoal_meter_reg_t *m = (const shoal_meter_reg_t *)q->buf;
    char credtext[SHOAL_TENANT_CRED_TEXT_MAX];
    shoal_meter_page_t snap;
    const char *bad, *cls;
    void *map;
    struct stat st;
    shoald_page_t *p;
    int seals, pidfd, pidfd_errno, fd, cred_class = 0, cred_weight = 1;

    if (q->extra_fds || q->memfd < 0) {
        shoald_reg_refuse(r, q, SHOALD_REFUSE_NO_FD, SHOAL_ERR_INVALID_ARG, NULL,
                          q->memfd < 0 ? "no page descriptor was attached" :
                          "more than one descriptor was attached");
        return;
    }
    /* The seals before the size: a size read before them could still change. A client that
     * truncated its unsealed memfd to 0 and sealed it between the two checks had the agent
     * map an empty file and die of SIGBUS at its first read, for every tenant. */
    seals = fcntl(q->memfd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        shoald_reg_refuse(r, q, SHOALD_REFUSE_UNSEALED, SHOAL_ERR_INVALID_ARG, NULL,
                          "the page's memfd is not sealed against shrinking and growing");
        return;
    }
    if (fstat(q->memfd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size != SHOAL_METER_PAGE_BYTES) {
        shoald_reg_refuse(r, q, SHOALD_REFUSE_BAD_PAGE, SHOAL_ERR_INVALID_ARG, NULL,
                          "the page is %lld bytes, expected a memfd of %d",
                          (long long)st.st_size, SHOAL_METER_PAGE_BYTES);
        return;
    }
    map = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ, MAP_SHARED, q->memfd, 0);
    if (map == MAP_FAILED) {
        shoald_reg_refuse(r, q, SHOALD_REFUSE_BAD_PAGE, SHOAL_ERR_INVALID_ARG, NULL,
                          "the page cannot be mapped: %s", strerror(errno));
        return;
    }
    memcpy(&snap, map, sizeof(snap)); /* the identity is read once, here */
    bad = shoald_reg_page_check(&snap);
    if (bad != NULL) {
        munmap(map, SHOAL_METER_PAGE_BYTES);
        shoald_reg_refuse(r, q, SHOALD_REFUSE_BAD_PAGE, SHOAL_ERR_INVALID_ARG, NULL, "%s", bad);
        return;
    }
    memcpy(credtext, q->buf + sizeof(*m), m->cred_len);
    credtext[m->cred_len] = '\0';
    cls = shoald_reg_claim(r, q, &snap, credtext, &cred_class, &cred_weight);
    shoal_secret_wipe(credtext, sizeof(credtext));
    if (cls == NULL) {
        munmap(map, SHOAL_METER_PAGE_BYTES);
        return;
    }
    if (r->a->npages >= r->a->cfg->max_pages) {
        munmap(map, SHOAL_METER_PAGE_BYTES);
        shoald_reg_refuse(r, q, SHOALD_REFUSE_LIMIT, SHOAL_ERR_NO_MEMORY, snap.tenant,
                          "the agent holds its limit of %u pages (max_pages, or what its "
                          "file descriptors allow)",
                          r->a->cfg->max_pages);
        return;
    }
    if (shoald_reg_uid_pages(r->a, q->peer.uid) >= r->a->cfg->max_pages_per_uid) {
        munmap(map, SHOAL_METER_PAGE_BYTES);
        shoald_reg_refuse(r, q, SHOALD_REFUSE_LIMIT, SHOAL_ERR_NO_MEMORY, snap.tenant,
                          "uid %u holds its limit of %u pages (max_pages_per_uid; an "
                          "ended page counts until billed)", (unsigned)q->peer.uid,
                          r->a->cfg->max_pages_per_uid);
        return;
    }
    pidfd = shoald_reg_pidfd(q);
    pidfd_errno = pidfd < 0 ? errno : 0;
    fd = q->fd;
    if (shoald_page_add(r->a, &snap, map, fd, pidfd, q->peer.pid, q->peer.uid, q->peer.gid,
                        cls, &p) != SHOAL_OK) {
        munmap(map, SHOAL_METER_PAGE_BYTES);
        if (pidfd >= 0)
            close(pidfd);
        shoald_reg_reply(fd, SHOAL_ERR_NO_MEMORY, "the agent is out of memory");
        shoald_reg_pend_free(r, q, 1);
        return;
    }
    shoald_qos_page_register(r->a, p, &snap, cred_class, cred_weight);
    r->a->accepted++;
    shoald_reg_reply(fd, SHOAL_OK, "");
    shoal_info(METER, "rank %d/%d of %s/%s registered (pid %d, uid %u, %d GPUs, class %s)",
               (int)snap.rank, (int)snap.nranks, p->job->tenant, snap.job, (int)q->peer.pid,
               (unsigned)q->peer.uid, (int)snap.ngpus, cls);
    epoll_ctl(r->epfd, EPOLL_CTL_DEL, fd, NULL);
    shoald_reg_pend_free(r, q, 0);
    shoald_reg_watch(r, p);
    /* Without pidfds (pidfd_open is Linux 5.3, ENOSYS before; a seccomp profile may refuse
     * it) every page was ended here, its rank alive: not metered, billed for no time. The
     * end of its connection tells the exit then (the kernel closes it with the process), and
     * shoald_page_final asks whether the pid still runs the same process (its start time). */
    if (pidfd < 0 && pidfd_errno == ESRCH) {
        shoald_page_end(r->a, p, "exited before the agent could watch it");
    } else if (pidfd < 0 && !r->nopidfd_said) {
        r->nopidfd_said = 1;
        shoal_warn(METER, "no pidfd for pid %d (%s): ranks' exits are told by the end of their "
                   "connections, pids checked against their start time", (int)p->pid,
                   strerror(pidfd_errno));
    }
}

/* Reads what the peer sent so far, exactly up to the end of the message; descriptors are
 * collected from every segment. */
static void shoald_reg_pend_read(shoald_reg_t *r, shoald_pend_t *q)
{
    union {
        char buf[CMSG_SPACE(SHOALD_REG_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    const shoal_meter_reg_t *m = (const shoal_meter_reg_t *)q->buf;
    struct msghdr msg = {0};
    struct cmsghdr *c;
    struct iovec iov;
    size_t want, i, nfd;
    ssize_t ret;
    int *fds;

    for (;;) {
        want = sizeof(*m);
        if (q->len >= sizeof(*m)) {
            if (m->magic != SHOAL_METER_REG_MAGIC || m->version < SHOAL_METER_VERSION_MIN ||
                m->version > SHOAL_METER_VERSION ||
                m->page_bytes != SHOAL_METER_PAGE_BYTES ||
                m->cred_len >= SHOAL_TENANT_CRED_TEXT_MAX) {
                shoald_reg_refuse(r, q, SHOALD_REFUSE_MALFORMED, SHOAL_ERR_INVALID_ARG, NULL,
                                  "not a shoal_meter_reg_t of version %d to %d for a %d-byte "
                                  "page (or the credential is too long)",
                                  SHOAL_METER_VERSION_MIN, SHOAL_METER_VERSION,
                                  SHOAL_METER_PAGE_BYTES);
                return;
            }
            want += m->cred_len;
        }
        if (q->len == want) {
            shoald_reg_complete(r, q);
            return;
        }
        iov.iov_base = q->buf + q->len;
        iov.iov_len = want - q->len;
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        ret = recvmsg(q->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (ret < 0 && errno == EINTR)
            continue;
        if (ret < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        for (c = CMSG_FIRSTHDR(&msg); ret > 0 && c != NULL; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            fds = (int *)CMSG_DATA(c);
            nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (i = 0; i < nfd; i++) {
                if (q->memfd < 0) {
                    q->memfd = fds[i];
                } else {
                    shoald_close_later(r->a, fds[i]);
                    q->extra_fds = 1;
                }
            }
        }
        if (ret > 0 && (msg.msg_flags & MSG_CTRUNC) != 0)
            q->extra_fds = 1;
        if (ret <= 0) {
            /* The peer left (or broke the socket) before a whole message: nobody to answer. */
            r->a->refused[SHOALD_REFUSE_MALFORMED]++;
            shoald_abuse_note(r->a, NULL, q->peer.uid, 0);
            shoal_info(METER, "registration of pid %d ended after %zu bytes: %s",
                       (int)q->peer.pid, q->len, ret == 0 ? "closed" : strerror(errno));
            shoald_reg_pend_free(r, q, 1);
            return;
        }
        q->len += (size_t)ret;
    }
}

/* accept failed for want of a descriptor (EMFILE, ENFILE) or of memory. The connection stays
 * in the backlog and the listener readable: the loop came straight back to the same failure,
 * logging a warning at every turn (thousands a second, at full CPU) until a descriptor was
 * freed, by a registration's deadline at the earliest. The listener leaves the epoll set for
 * SHOALD_REG_ACCEPT_PAUSE_MS (shoald_reg_timeouts puts it back) and the failure is logged once
 * until an accept works again; the waiting clients are served then. */
static void shoald_reg_accept_pause(shoald_reg_t *r, int err)
{
    struct epoll_event ev = {.events = 0};

    if (r->accept_failures++ == 0)
        shoal_warn(METER, "accept on %s: %s: new registrations wait in the backlog (tried "
                   "again every %d ms; said once until it works)", r->a->cfg->listen,
                   strerror(err), SHOALD_REG_ACCEPT_PAUSE_MS);
    ev.data.ptr = &r->tag;
    if (epoll_ctl(r->epfd, EPOLL_CTL_MOD, r->lfd, &ev) == 0)
        r->accept_resume_ns = shoal_deadline_ns(SHOALD_REG_ACCEPT_PAUSE_MS);
}

static void shoald_reg_accept(shoald_reg_t *r)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
    socklen_t len;
    shoald_pend_t *q;
    int fd;

    for (;;) {
        fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                shoald_reg_accept_pause(r, errno);
            else if (errno != EAGAIN && errno != EWOULDBLOCK)
                shoal_warn(METER, "accept on %s: %s", r->a->cfg->listen, strerror(errno));
            return;
        }
        if (r->accept_failures > 0) {
            shoal_info(METER, "accept on %s works again, after %u failures", r->a->cfg->listen,
                       r->accept_failures);
            r->accept_failures = 0;
        }
        if (r->npending >= r->a->cfg->max_pending) {
            /* The oldest registrations in progress give way, at the sweep after this batch of
             * events (one of them may be in the batch). */
            for (q = r->head; q != NULL && q->evicted; q = q->next)
                ;
            if (q != NULL) {
                q->evicted = 1;
                q->deadline_ns = 0;
            }
        }
        q = calloc(1, sizeof(*q));
        if (q == NULL) {
            close(fd);
            continue;
        }
        q->fd = fd;
        q->memfd = -1;
        q->tag = (shoald_tag_t){.kind = SHOALD_TAG_PENDING, .obj = q};
        len = sizeof(q->peer);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &q->peer, &len) != 0) {
            shoal_warn(METER, "SO_PEERCRED: %s", strerror(errno));
            close(fd);
            free(q);
            continue;
        }
        q->deadline_ns = shoal_deadline_ns(r->a->cfg->reg_timeout_ms);
        q->prev = r->tail;
        if (r->tail != NULL)
            r->tail->next = q;
        else
            r->head = q;
        r->tail = q;
        r->npending++;
        ev.data.ptr = &q->tag;
        if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            shoal_warn(METER, "epoll_ctl: %s", strerror(errno));
            shoald_reg_pend_free(r, q, 1);
        }
    }
}

/* An event on a registered page's connection. The library sends nothing after the agent's
 * reply: the end of the connection is the end of the communicator. A byte there breaks the
 * protocol (a client that streamed bytes held the agent in its read loop: no /metrics, no
 * registration, no minute): it is logged (rate-limited with the refusals), counted against
 * the page's tenant and uid (the abuse rule), and the connection is ended as if the client
 * had closed it, so the page is billed exactly as after a close. One read of one byte per
 * event: nothing a client sends can hold the loop. Descriptors that came with the byte are
 * taken (the kernel would close them in the read) and closed by the closer. */
static void shoald_reg_page_conn(shoald_reg_t *r, shoald_page_t *p, uint32_t events)
{
    union {
        char buf[CMSG_SPACE(SHOALD_REG_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    char byte, line[256];
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *c;
    size_t i, nfd;
    ssize_t ret;

    ret = recvmsg(p->conn_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    for (c = CMSG_FIRSTHDR(&msg); ret > 0 && c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (i = 0; i < nfd; i++)
            shoald_close_later(r->a, ((int *)CMSG_DATA(c))[i]);
    }
    if (ret > 0) {
        snprintf(line, sizeof(line), "rank %d of %s/%s (pid %d, uid %u) sent bytes after its "
                 "registration (protocol violation): its connection is closed", (int)p->rank,
                 p->job->tenant, p->job->job, (int)p->pid, (unsigned)p->uid);
        shoald_reg_log_refusal(r, line);
        shoald_abuse_note(r->a, p->job->tenant, p->uid, 0);
        shoald_page_end(r->a, p, "broke the registration protocol, its connection closed");
        return;
    }
    /* EINTR or EAGAIN with no hang-up: nothing now (level-triggered, the loop comes back). */
    if (ret == 0 || (ret < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
        (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) != 0)
        shoald_page_end(r->a, p, "closed its communicator");
}

void shoald_reg_event(shoald_reg_t *r, void *tagp, uint32_t events)
{
    shoald_tag_t *tag = tagp;

    switch (tag->kind) {
    case SHOALD_TAG_LISTEN:
        shoald_reg_accept(r);
        break;
    case SHOALD_TAG_PENDING:
        shoald_reg_pend_read(r, tag->obj);
        break;
    case SHOALD_TAG_PAGE_CONN:
        shoald_reg_page_conn(r, tag->obj, events);
        break;
    case SHOALD_TAG_PAGE_PID:
        shoald_page_end(r->a, tag->obj, "exited");
        break;
    default:
        break;
    }
}

void shoald_reg_watch(shoald_reg_t *r, shoald_page_t *p)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};

    ev.data.ptr = &p->tag_conn;
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, p->conn_fd, &ev) != 0)
        shoal_warn(METER, "epoll_ctl(connection of pid %d): %s", (int)p->pid, strerror(errno));
    if (p->pidfd >= 0) {
        ev.events = EPOLLIN;
        ev.data.ptr = &p->tag_pid;
        if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, p->pidfd, &ev) != 0)
            shoal_warn(METER, "epoll_ctl(pidfd of %d): %s", (int)p->pid, strerror(errno));
    }
}

void shoald_reg_timeouts(shoald_reg_t *r)
{
    uint64_t now = shoal_time_ns();

    shoald_pend_t *q, *next;
    struct epoll_event ev = {.events = EPOLLIN};

    if (r->suppressed > 0)
        shoald_reg_log_minute(r);
    if (r->accept_resume_ns != 0 && r->accept_resume_ns <= now) {
        ev.data.ptr = &r->tag;
        if (epoll_ctl(r->epfd, EPOLL_CTL_MOD, r->lfd, &ev) == 0)
            r->accept_resume_ns = 0;
    }
    /* Deadlines are in arrival order; evicted ones may sit anywhere. */
    for (q = r->head; q != NULL; q = next) {
        next = q->next;
        if (q->evicted)
            shoald_reg_refuse(r, q, SHOALD_REFUSE_LIMIT, SHOAL_ERR_TIMEOUT, NULL,
                              "too many registrations in progress");
        else if (q->deadline_ns <= now)
            shoald_reg_refuse(r, q, SHOALD_REFUSE_TIMEOUT, SHOAL_ERR_TIMEOUT, NULL,
                              "the registration did not arrive within reg_timeout");
        else
            break;
    }
}

int shoald_reg_wait_ms(shoald_reg_t *r)
{
    int ms = -1, pause;

    if (r->head != NULL)
        ms = shoal_deadline_left_ms(r->head->deadline_ns, 60000) + 1;
    if (r->accept_resume_ns != 0) {
        pause = shoal_deadline_left_ms(r->accept_resume_ns, 60000) + 1;
        ms = ms < 0 || pause < ms ? pause : ms;
    }
    if (r->suppressed > 0) { /* the count of the refusals left out, at the minute's end */
        pause = 60000 - (int)(shoald_unix_ns() / 1000000ull % 60000ull) + 1;
        ms = ms < 0 || pause < ms ? pause : ms;
    }
    return ms;
}

shoal_status_t shoald_reg_start(shoald_t *a, int epfd, shoald_reg_t **r_p)
{
    struct epoll_event ev = {.events = EPOLLIN};
    shoald_reg_t *r;

    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return SHOAL_ERR_NO_MEMORY;
    r->a = a;
    r->epfd = epfd;
    r->lfd = -1;
    r->tag = (shoald_tag_t){.kind = SHOALD_TAG_LISTEN, .obj = r};
    shoald_reg_fd_budget(a->cfg);
    shoald_closer_start(a, epfd);
    if (shoald_reg_listen(r) != SHOAL_OK)
        goto err;
    ev.data.ptr = &r->tag;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, r->lfd, &ev) != 0) {
        shoal_error(METER, "epoll_ctl: %s", strerror(errno));
        goto err;
    }
    *r_p = r;
    return SHOAL_OK;
err:
    if (r->lfd >= 0)
        close(r->lfd);
    shoald_closer_stop(a);
    free(r);
    return SHOAL_ERR_SYSTEM;
}

void shoald_reg_stop(shoald_reg_t *r)
{
    if (r == NULL)
        return;
    while (r->head != NULL)
        shoald_reg_pend_free(r, r->head, 1);
    shoald_closer_stop(r->a);
    close(r->lfd);
    unlink(r->a->cfg->listen);
    free(r);
}
