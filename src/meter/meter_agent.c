/*
 * Registration of a communicator's meter page with the node agent shoald (meter_page.h):
 * connect to the UNIX socket SHOAL_AGENT (non-blocking, SHOAL_METER_AGENT_MS in all), send one
 * shoal_meter_reg_t and the credential text with the page's memfd as SCM_RIGHTS, read one
 * shoal_meter_reg_reply_t. The connection stays open: its end tells the agent that the
 * communicator ended. An agent that restarts drops it; the next call that looks (at most once
 * a second, shoal_meter_call_end) registers the same page again, so the agent's counts
 * continue where they were. No agent: nothing changes, the next looks find none. An agent
 * that does not answer is asked again after 2, 4, ... 64 s (shoal_meter_agent_note).
 *
 * The credential is a bearer token, so it goes only to a listener the provider stands behind
 * (shoal_meter_agent_trusted): whoever can create the socket path (a directory others may
 * write, a path left by an agent that died) could otherwise collect every job's credential.
 */
#include "meter/meter.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

typedef enum {
    SHOAL_METER_REG_OK = 0,   /* accepted */
    SHOAL_METER_REG_ABSENT,   /* no socket, or nobody listening */
    SHOAL_METER_REG_FAILED,   /* an agent is there but the exchange failed or timed out */
    SHOAL_METER_REG_REFUSED,  /* the agent answered no */
    SHOAL_METER_REG_UNTRUSTED, /* the listener is not one the credential may go to */
    SHOAL_METER_REG_DENIED    /* this process may not reach the socket (its mode, group) */
} shoal_meter_reg_result_t;

static int shoal_meter_agent_off(void)
{
    const char *path = shoal_meter_config.agent;
    return path == NULL || path[0] == '\0' || strcmp(path, "none") == 0;
}

/* Waits for events on fd until the deadline; 1 ready, 0 timed out, -1 error. */
static int shoal_meter_agent_poll(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int left = shoal_deadline_left_ms(deadline, SHOAL_METER_AGENT_MS), ret;
        ret = poll(&pfd, 1, left > 0 ? left : 0);
        if (ret > 0) {
            return (pfd.revents & (POLLERR | POLLNVAL)) != 0 && (pfd.revents & events) == 0
                       ? -1 : 1;
        }
        if (ret == 0) {
            return shoal_deadline_passed(deadline) || left == 0 ? 0 : 1;
        }
        if (errno != EINTR) {
            return -1;
        }
    }
}

static shoal_meter_reg_result_t shoal_meter_agent_connect(const char *path, uint64_t deadline,
                                                          int *fd_p)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd, err = 0;
    socklen_t elen = sizeof(err);

    if (strlen(path) >= sizeof(sa.sun_path)) {
        shoal_warn_once(METER, "SHOAL_AGENT=%s: path too long for a UNIX socket", path);
        return SHOAL_METER_REG_ABSENT;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        shoal_warn(METER, "socket(AF_UNIX) failed: %s", strerror(errno));
        return SHOAL_METER_REG_FAILED;
    }
    while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN && !shoal_deadline_passed(deadline)) {
            shoal_sleep_us(1000); /* the agent's backlog is full: try again */
            continue;
        }
        if (errno == EINPROGRESS) {
            if (shoal_meter_agent_poll(fd, POLLOUT, deadline) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0) {
                break;
            }
            errno = err != 0 ? err : ETIMEDOUT;
        }
        err = errno;
        close(fd);
        if (err == EACCES || err == EPERM) {
            /* the agent's socket_mode and socket_group leave this process out: a refusal,
             * not an agent that did not answer */
            shoal_info(METER, "connect(%s) failed: %s: this process may not register with the "
                       "node agent", path, strerror(err));
            return SHOAL_METER_REG_DENIED;
        }
        shoal_info(METER, "connect(%s) failed: %s: no node agent", path, strerror(err));
        return err == ECONNREFUSED || err == ENOENT ? SHOAL_METER_REG_ABSENT
                                                    : SHOAL_METER_REG_FAILED;
    }
    *fd_p = fd;
    return SHOAL_METER_REG_OK;
}

/* 1 if the listener's uid (SO_PEERCRED of the connected socket: the kernel's record of who
 * called listen) may receive the credential: root; this process's own uid (nothing to steal
 * from itself); SHOAL_AGENT_UID; or the uid that owns the socket's directory and each one
 * above it up to one of root's, none of them writable by group or others: then root made the
 * topmost of them and chose its owner (the systemd unit's /run/shoal, owned by the agent's
 * user). A directory anyone may create (under /tmp) proves nothing: its owner is whoever
 * made it first. */
static int shoal_meter_agent_trusted(const char *path, int fd, uid_t *uid_p)
{
    char dir[PATH_MAX], real[PATH_MAX], *slash;
    struct ucred peer;
    socklen_t len = sizeof(peer);
    struct stat sd;
    int owned = 0;

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
        shoal_warn(METER, "SO_PEERCRED on the node agent's socket %s failed: %s", path,
                   strerror(errno));
        return 0;
    }
    *uid_p = peer.uid;
    if (peer.uid == 0 || peer.uid == geteuid() ||
        (shoal_meter_config.agent_uid >= 0 && peer.uid == (uid_t)shoal_meter_config.agent_uid)) {
        return 1;
    }
    snprintf(dir, sizeof(dir), "%s", path);
    slash = strrchr(dir, '/');
    if (slash == NULL) {
        snprintf(dir, sizeof(dir), ".");
    } else {
        slash[slash == dir ? 1 : 0] = '\0';
    }
    if (realpath(dir, real) == NULL) {
        return 0;
    }
    for (;;) {
        if (stat(real, &sd) != 0 || (sd.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
            return 0;
        }
        if (sd.st_uid == 0) {
            return owned; /* root's, above at least one of the listener's */
        }
        if (sd.st_uid != peer.uid || strcmp(real, "/") == 0) {
            return 0;
        }
        owned = 1;
        slash = strrchr(real, '/');
        slash[slash == real ? 1 : 0] = '\0'; /* up one ("/" above /run) */
    }
}

/* The message, the credential and the memfd; then the answer. */
static shoal_meter_reg_result_t shoal_meter_agent_exchange(struct shoal_meter *m, int fd,
                                                           uint64_t deadline,
                                                           shoal_meter_reg_reply_t *rep)
{
    shoal_meter_reg_t reg = {.magic = SHOAL_METER_REG_MAGIC, .version = SHOAL_METER_VERSION,
                             .page_bytes = SHOAL_METER_PAGE_BYTES,
                             .cred_len = (uint32_t)m->cred_len};
    struct iovec iov[2] = {{.iov_base = &reg, .iov_len = sizeof(reg)},
                           {.iov_base = m->cred, .iov_len = m->cred_len}};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = m->cred_len > 0 ? 2 : 1,
                         .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    size_t total = sizeof(reg) + m->cred_len, sent = 0, got = 0;

    memset(&ctl, 0, sizeof(ctl));
    CMSG_FIRSTHDR(&msg)->cmsg_level = SOL_SOCKET;
    CMSG_FIRSTHDR(&msg)->cmsg_type = SCM_RIGHTS;
    CMSG_FIRSTHDR(&msg)->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(CMSG_FIRSTHDR(&msg)), &m->memfd, sizeof(int));
    while (sent < total) {
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (shoal_meter_agent_poll(fd, POLLOUT, deadline) != 1) {
                return SHOAL_METER_REG_FAILED;
            }
            continue;
        }
        if (n <= 0) {
            shoal_info(METER, "sending the registration to the node agent failed: %s",
                       strerror(errno));
            return SHOAL_METER_REG_FAILED;
        }
        sent += (size_t)n;
        /* The fd went with the first byte; the rest is plain data. */
        msg.msg_control = NULL;
        msg.msg_controllen = 0;
        while (msg.msg_iovlen > 0 && (size_t)n >= msg.msg_iov[0].iov_len) {
            n -= (ssize_t)msg.msg_iov[0].iov_len;
            msg.msg_iov++;
            msg.msg_iovlen--;
        }
        if (msg.msg_iovlen > 0) {
            msg.msg_iov[0].iov_base = (char *)msg.msg_iov[0].iov_base + n;
            msg.msg_iov[0].iov_len -= (size_t)n;
        }
    }
    while (got < sizeof(*rep)) {
        ssize_t n = recv(fd, (char *)rep + got, sizeof(*rep) - got, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (shoal_meter_agent_poll(fd, POLLIN, deadline) != 1) {
                shoal_info(METER, "the node agent did not answer within %d ms",
                           SHOAL_METER_AGENT_MS);
                return SHOAL_METER_REG_FAILED;
            }
            continue;
        }
        if (n <= 0) {
            shoal_info(METER, "the node agent closed the connection before answering%s%s",
                       n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
            return SHOAL_METER_REG_FAILED;
        }
        got += (size_t)n;
    }
    if (rep->magic != SHOAL_METER_REG_MAGIC) {
        shoal_warn(METER, "the node agent answered a malformed reply (magic %08x)", rep->magic);
        return SHOAL_METER_REG_FAILED;
    }
    rep->reason[sizeof(rep->reason) - 1] = '\0';
    for (char *c = rep->reason; *c != '\0'; c++) {
        if (*c < 0x20 || *c > 0x7e) {
            *c = '?'; /* printable in our log, whatever the agent sent */
        }
    }
    return rep->status == SHOAL_OK ? SHOAL_METER_REG_OK : SHOAL_METER_REG_REFUSED;
}

/* The credential text (a secret) is kept only while a registration may still send it: with
 * no agent to ask (SHOAL_AGENT=none, no memfd to hand over) or one that refused, never again. */
static void shoal_meter_cred_drop(struct shoal_meter *m)
{
    shoal_secret_wipe(m->cred, sizeof(m->cred));
    m->cred_len = 0;
}

/* One registration attempt; on success m->sock is the open connection. */
static shoal_meter_reg_result_t shoal_meter_agent_register(struct shoal_meter *m,
                                                           shoal_status_t *refused_p)
{
    const char *path = shoal_meter_config.agent;
    uint64_t deadline = shoal_deadline_ns(SHOAL_METER_AGENT_MS);
    shoal_meter_reg_reply_t rep;
    shoal_meter_reg_result_t r;
    struct stat sb;
    uid_t uid = (uid_t)-1;
    int fd = -1;

    if (m->memfd < 0) {
        return SHOAL_METER_REG_ABSENT;
    }
    if (stat(path, &sb) != 0) {
        return errno == EACCES ? SHOAL_METER_REG_DENIED : SHOAL_METER_REG_ABSENT;
    }
    r = shoal_meter_agent_connect(path, deadline, &fd);
    if (r != SHOAL_METER_REG_OK) {
        return r;
    }
    if (!shoal_meter_agent_trusted(path, fd, &uid)) {
        shoal_warn_once(METER, "the listener at SHOAL_AGENT=%s runs as uid %u: not root, "
                        "this process's uid, SHOAL_AGENT_UID or the owner of the socket's "
                        "directories under one of root's; the job credential is not sent to "
                        "it and the job runs without the node agent", path, (unsigned)uid);
        close(fd);
        return SHOAL_METER_REG_UNTRUSTED;
    }
    memset(&rep, 0, sizeof(rep));
    r = shoal_meter_agent_exchange(m, fd, deadline, &rep);
    if (r == SHOAL_METER_REG_REFUSED) {
        *refused_p = rep.status < 0 ? (shoal_status_t)rep.status : SHOAL_ERR_PERMISSION;
        shoal_warn_once(METER, "the node agent (%s) refused communicator %08x of tenant '%s' "
                        "job '%s': %s (%s); the job runs unmetered by the agent", path,
                        m->page->comm_id, m->page->tenant, m->page->job,
                        rep.reason[0] != '\0' ? rep.reason : "no reason given",
                        shoal_status_name(*refused_p));
    }
    if (r != SHOAL_METER_REG_OK) {
        close(fd);
        return r;
    }
    m->sock = fd;
    shoal_info(METER, "communicator %08x rank %d registered with the node agent (%s)",
               m->page->comm_id, m->page->rank, path);
    return SHOAL_METER_REG_OK;
}

/* An agent that is there but did not answer (silent, stuck, its backlog full) costs the call
 * that asked SHOAL_METER_AGENT_MS; asked once a second, it would take that much of every
 * second from the job (more where ranks ask at different moments and wait for each other).
 * After n such failures in a row the next try waits 2^n s, at most SHOAL_METER_AGENT_BACKOFF_S;
 * an answer, or no agent at all (a cheap look), starts over at once a second. */
#define SHOAL_METER_AGENT_BACKOFF_S 64

static void shoal_meter_agent_note(struct shoal_meter *m, shoal_meter_reg_result_t r)
{
    uint64_t secs;
    /* a listener not trusted is asked as rarely as a silent one: it may be a stranger's */
    if (r != SHOAL_METER_REG_FAILED && r != SHOAL_METER_REG_UNTRUSTED) {
        m->agent_fails = 0;
        return;
    }
    m->agent_fails = SHOAL_MIN(m->agent_fails + 1, 6);
    secs = SHOAL_MIN(1ull << m->agent_fails, (uint64_t)SHOAL_METER_AGENT_BACKOFF_S);
    m->agent_retry = shoal_meter_ticks() + secs * shoal_meter_clock.ticks_per_sec;
}

shoal_status_t shoal_meter_agent_register_init(struct shoal_meter *m)
{
    shoal_status_t refused = SHOAL_ERR_PERMISSION;
    shoal_meter_reg_result_t r;

    if (m->memfd < 0) {
        shoal_meter_cred_drop(m); /* no page to hand over: no registration will send it */
    }
    if (shoal_meter_agent_off()) {
        m->agent_state = SHOAL_METER_AGENT_OFF;
        shoal_meter_cred_drop(m);
        if (shoal_meter_config.agent_required) {
            shoal_error(METER, "SHOAL_AGENT_REQUIRED=1 but SHOAL_AGENT=none");
            return SHOAL_ERR_INVALID_ARG;
        }
        return SHOAL_OK;
    }
    r = shoal_meter_agent_register(m, &refused);
    shoal_meter_agent_note(m, r);
    switch (r) {
    case SHOAL_METER_REG_OK:
        m->agent_state = SHOAL_METER_AGENT_REGISTERED;
        return SHOAL_OK;
    case SHOAL_METER_REG_REFUSED:
        m->agent_state = SHOAL_METER_AGENT_REFUSED;
        shoal_meter_cred_drop(m);
        if (shoal_meter_config.agent_required) {
            shoal_error(METER, "SHOAL_AGENT_REQUIRED=1 and the node agent refused this "
                        "communicator");
            return refused;
        }
        return SHOAL_OK;
    case SHOAL_METER_REG_DENIED:
        m->agent_state = SHOAL_METER_AGENT_NONE;
        if (shoal_meter_config.agent_required) {
            shoal_error(METER, "SHOAL_AGENT_REQUIRED=1 and this process may not connect to the "
                        "node agent at %s: permission denied (the agent's socket_mode and "
                        "socket_group)", shoal_meter_config.agent);
            return SHOAL_ERR_PERMISSION;
        }
        return SHOAL_OK;
    case SHOAL_METER_REG_UNTRUSTED:
        m->agent_state = SHOAL_METER_AGENT_NONE;
        if (shoal_meter_config.agent_required) {
            shoal_error(METER, "SHOAL_AGENT_REQUIRED=1 and the listener at %s is not a node "
                        "agent this job trusts", shoal_meter_config.agent);
            return SHOAL_ERR_PERMISSION;
        }
        return SHOAL_OK;
    default:
        m->agent_state = SHOAL_METER_AGENT_NONE;
        if (shoal_meter_config.agent_required) {
            shoal_error(METER, "SHOAL_AGENT_REQUIRED=1 and no node agent %s at %s",
                        r == SHOAL_METER_REG_ABSENT ? "listens" : "answered",
                        shoal_meter_config.agent);
            return r == SHOAL_METER_REG_ABSENT ? SHOAL_ERR_SYSTEM : SHOAL_ERR_TIMEOUT;
        }
        return SHOAL_OK;
    }
}

/* 1 if the agent closed our connection (it exited or restarted). */
static int shoal_meter_agent_dropped(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLRDHUP};
    char buf[256];
    if (poll(&pfd, 1, 0) <= 0) {
        return 0;
    }
    if ((pfd.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0) {
        return 1;
    }
    for (;;) { /* the protocol has nothing after the reply: drop whatever came */
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0) {
            return 1;
        }
        if (n < 0) {
            return errno != EAGAIN && errno != EINTR;
        }
    }
}

void shoal_meter_agent_check(struct shoal_meter *m)
{
    shoal_status_t refused = SHOAL_ERR_PERMISSION;
    shoal_meter_reg_result_t r;
    if (m->agent_state == SHOAL_METER_AGENT_REGISTERED) {
        if (!shoal_meter_agent_dropped(m->sock)) {
            return;
        }
        shoal_info(METER, "the node agent closed the connection of communicator %08x: "
                   "registering again", m->page->comm_id);
        close(m->sock);
        m->sock = -1;
        m->agent_state = SHOAL_METER_AGENT_NONE;
    }
    if (m->agent_state != SHOAL_METER_AGENT_NONE) {
        return; /* off or refused: never asked again */
    }
    if (m->agent_fails > 0 && shoal_meter_ticks() < m->agent_retry) {
        return; /* it did not answer lately: not yet */
    }
    r = shoal_meter_agent_register(m, &refused);
    shoal_meter_agent_note(m, r);
    switch (r) {
    case SHOAL_METER_REG_OK:
        m->agent_state = SHOAL_METER_AGENT_REGISTERED;
        break;
    case SHOAL_METER_REG_REFUSED:
        m->agent_state = SHOAL_METER_AGENT_REFUSED;
        shoal_meter_cred_drop(m);
        break;
    default:
        break; /* still none: look again in a second */
    }
}
