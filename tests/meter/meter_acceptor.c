/*
 * Test fixture, not a node agent: the other end of SHOAL_AGENT for tests/meter. Listens on a
 * UNIX socket, takes each registration (shoal_meter_reg_t, credential text, memfd as
 * SCM_RIGHTS), checks the page it was given (size, seals, magic, pid against SO_PEERCRED),
 * answers, keeps the mapping, and when the connection closes writes what the page says, in
 * the format of meter_rank's METER_STATS_FILE lines, plus one "ident" line per page.
 *
 *   meter_acceptor SOCKET OUTFILE [--refuse] [--silent] [--drop-first] [--timeout S]
 *     --refuse      answer SHOAL_ERR_PERMISSION with a reason
 *     --silent      never answer (the library must give up after its deadline)
 *     --drop-first  close each page's first connection right after the answer (an agent
 *                   restart); the library must register the same page again
 * Exits on SIGTERM/SIGINT or after the timeout (default 300 s), removing the socket.
 */
#include "src/meter/meter_page.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAXC 256

typedef struct {
    int fd;
    pid_t pid;
    const shoal_meter_page_t *page;
    ino_t ino;
    int c;            /* index of the page among its process's pages, by first registration */
    int regs;         /* registrations of this page so far (this one included) */
    char cred[600];
} conn_t;

static conn_t conns[MAXC];
static int nconns;
static volatile sig_atomic_t stop;
static FILE *out;
static int refuse, silent, drop_first;
/* pages seen: (pid, inode) -> index, registrations */
static struct {
    pid_t pid;
    ino_t ino;
    int c, regs;
} seen[MAXC];
static int nseen;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void page_line(const conn_t *k)
{
    const shoal_meter_page_t *p = k->page;
    fprintf(out, "pid=%d c=%d rank=%d ops=", (int)k->pid, k->c, p->rank);
    for (int i = 0; i < 16; i++) {
        fprintf(out, "%s%llu", i ? "," : "",
                (unsigned long long)(i < SHOAL_METER_NCOLL ? p->ops[i] : 0));
    }
    fprintf(out, " sent=");
    for (int t = 0; t < SHOAL_METER_NTL; t++) {
        fprintf(out, "%s%llu,%llu", t ? "," : "", (unsigned long long)p->bytes_sent[t][0],
                (unsigned long long)p->bytes_sent[t][1]);
    }
    fprintf(out, " recv=");
    for (int t = 0; t < SHOAL_METER_NTL; t++) {
        fprintf(out, "%s%llu,%llu", t ? "," : "", (unsigned long long)p->bytes_recv[t][0],
                (unsigned long long)p->bytes_recv[t][1]);
    }
    fprintf(out, " coll_ns=%llu errors=%llu peer_failures=%llu aborts=%llu\n",
            (unsigned long long)shoal_meter_page_coll_ns(p), (unsigned long long)p->errors,
            (unsigned long long)p->peer_failures, (unsigned long long)p->aborts);
    fprintf(out, "ident pid=%d c=%d rank=%d nranks=%d state=%u seq_even=%d tenant=%s job=%s "
            "class=%d weight=%d ngpus=%d gpus=%d,%d pid_ok=%d regs=%d cred=%s\n", (int)k->pid,
            k->c, p->rank, p->nranks, p->state, (int)((p->seq & 1) == 0), p->tenant, p->job,
            p->qos_class, p->qos_weight, p->ngpus, p->gpus[0], p->gpus[1], p->pid == k->pid,
            k->regs, k->cred[0] != '\0' ? "yes" : "none");
    fflush(out);
}

static int read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
        if (n <= 0) {
            return -1;
        }
        got += (size_t)n;
    }
    return 0;
}

static void reply(int fd, int status, const char *reason)
{
    shoal_meter_reg_reply_t r = {.magic = SHOAL_METER_REG_MAGIC, .status = status};
    snprintf(r.reason, sizeof(r.reason), "%s", reason);
    (void)!send(fd, &r, sizeof(r), MSG_NOSIGNAL);
}

/* The registration on a new connection; 0 keep the connection, -1 close it. */
static int take_registration(conn_t *k)
{
    shoal_meter_reg_t reg;
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = &reg, .iov_len = sizeof(reg)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    struct ucred uc;
    socklen_t ul = sizeof(uc);
    struct stat sb;
    int memfd = -1, seals;
    ssize_t n = recvmsg(k->fd, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    void *p;

    if (n != (ssize_t)sizeof(reg)) {
        fprintf(stderr, "acceptor: short registration (%zd)\n", n);
        return -1;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            memcpy(&memfd, CMSG_DATA(c), sizeof(int));
        }
    }
    if (reg.magic != SHOAL_METER_REG_MAGIC || reg.version != SHOAL_METER_VERSION ||
        reg.page_bytes != SHOAL_METER_PAGE_BYTES || reg.cred_len >= sizeof(k->cred) ||
        memfd < 0) {
        fprintf(stderr, "acceptor: bad registration (magic %x, fd %d)\n", reg.magic, memfd);
        reply(k->fd, -41, "malformed registration");
        return -1;
    }
    if (read_full(k->fd, k->cred, reg.cred_len) != 0) {
        return -1;
    }
    k->cred[reg.cred_len] = '\0';
    getsockopt(k->fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul);
    k->pid = uc.pid;
    seals = fcntl(memfd, F_GET_SEALS);
    if (fstat(memfd, &sb) != 0 || sb.st_size != SHOAL_METER_PAGE_BYTES ||
        (seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) !=
            (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
        fprintf(stderr, "acceptor: page of %lld bytes, seals %x\n", (long long)sb.st_size, seals);
        reply(k->fd, -41, "page not sealed or of the wrong size");
        close(memfd);
        return -1;
    }
    p = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ, MAP_SHARED, memfd, 0);
    close(memfd);
    if (p == MAP_FAILED || ((const shoal_meter_page_t *)p)->magic != SHOAL_METER_MAGIC) {
        reply(k->fd, -41, "bad page");
        return -1;
    }
    k->page = p;
    k->ino = sb.st_ino;
    k->c = -1;
    for (int i = 0; i < nseen; i++) {
        if (seen[i].pid == k->pid && seen[i].ino == sb.st_ino) {
            k->c = seen[i].c;
            k->regs = ++seen[i].regs;
        }
    }
    if (k->c < 0 && nseen < MAXC) {
        int c = 0;
        for (int i = 0; i < nseen; i++) {
            c += seen[i].pid == k->pid;
        }
        seen[nseen].pid = k->pid;
        seen[nseen].ino = sb.st_ino;
        seen[nseen].c = c;
        seen[nseen].regs = 1;
        nseen++;
        k->c = c;
        k->regs = 1;
    }
    if (silent) {
        return 0;
    }
    if (refuse) {
        reply(k->fd, -61, "tenant acme is not allowed on this node");
        return -1;
    }
    reply(k->fd, 0, "");
    if (drop_first && k->regs == 1) {
        fprintf(out, "dropped pid=%d c=%d\n", (int)k->pid, k->c);
        fflush(out);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int lfd, timeout = 300;
    time_t end;

    if (argc < 3) {
        fprintf(stderr, "usage: meter_acceptor SOCKET OUTFILE [options]\n");
        return 2;
    }
    for (int i = 3; i < argc; i++) {
        refuse |= strcmp(argv[i], "--refuse") == 0;
        silent |= strcmp(argv[i], "--silent") == 0;
        drop_first |= strcmp(argv[i], "--drop-first") == 0;
        if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
            timeout = atoi(argv[++i]);
        }
    }
    out = fopen(argv[2], "w");
    if (out == NULL) {
        perror(argv[2]);
        return 2;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", argv[1]);
    unlink(argv[1]);
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 64) != 0) {
        perror("acceptor: listen");
        return 2;
    }
    end = time(NULL) + timeout;
    while (!stop && time(NULL) < end) {
        struct pollfd pfd[MAXC + 1];
        pfd[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < nconns; i++) {
            pfd[i + 1] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
        }
        if (poll(pfd, (nfds_t)nconns + 1, 200) <= 0) {
            continue;
        }
        for (int i = nconns - 1; i >= 0; i--) {
            char b;
            if (pfd[i + 1].revents == 0) {
                continue;
            }
            if (conns[i].page != NULL && recv(conns[i].fd, &b, 1, MSG_DONTWAIT) > 0) {
                continue; /* nothing is expected after the registration */
            }
            if (conns[i].page != NULL) {
                page_line(&conns[i]); /* the communicator ended (or the process died) */
            }
            close(conns[i].fd);
            conns[i] = conns[--nconns];
        }
        if ((pfd[0].revents & POLLIN) != 0 && nconns < MAXC) {
            conn_t *k = &conns[nconns];
            memset(k, 0, sizeof(*k));
            k->fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            if (k->fd < 0) {
                continue;
            }
            {
                struct timeval tv = {.tv_sec = 2};
                setsockopt(k->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
            }
            if (take_registration(k) == 0) {
                nconns++;
            } else {
                close(k->fd);
            }
        }
    }
    close(lfd);
    unlink(argv[1]);
    fclose(out);
    return 0;
}
