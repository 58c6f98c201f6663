/* A rank's side of the registration with shoald, for the agent's tests: creates a metering
 * page exactly as src/meter/meter_page.h says (sealed memfd, header, identity), registers it
 * with its credential, prints the agent's answer ("status=N reason=..."), then sets the
 * counters given with --set, holds, and ends like the library does (state CLOSED, then the
 * connection closes). --mode makes it misbehave on purpose.
 *   meter_client --sock PATH --tenant T --job J [--rank R --nranks N --ngpus G --epoch E]
 *                [--cred TEXT] [--mode M] [--set NAME=V]... [--hold-stdin | --hold S]
 *                [--fork-holder S] [--created-ago S]
 * Counter names: ops:C, sent:TL:LOC, recv:TL:LOC, coll_ns, errors, peer_failures, aborts,
 * and the process's abuse signals auth_failed, auth_refused, breaker_opened; cuda_ipc_sent,
 * cuda_ipc_recv (device bytes through CUDA IPC); nccl_sent, nccl_recv (the NCCL delegate's
 * ring-equivalent bytes); coll_ticks and tick_mult (the rate of the
 * conversion slot in force, ns per tick << 32: set it before coll_ticks), the time of a page
 * of version 2 (coll_ns is version 1's, still read).
 * --abandon S: count for S s, close the connection with the page still live (a registration
 * the library gave up on), count S s more unregistered, then register the same page again;
 * --set2 NAME=V: a second page of the same process (another communicator, comm_id 2, its own
 * connection) registered after the first, with these values; it ends with the first, or
 * --end2 S seconds after its registration (the first held on); --rank2 R --nranks2 N: its
 * rank and size (default the first's).
 * Modes: good, nofd, twofds, unsealed, badsize, badmagic, garbage, shortclose, slow, silent,
 * truncrace (mc_truncrace), flood (registers, then streams bytes from four writers on the kept
 * connection, which the protocol forbids, until the agent closes it: exit 0, or 1 when it is
 * still open after --hold S, 10 s by default); with a descriptor whose last close() waits (a
 * loopback TCP socket with unsent data and SO_LINGER 30 s, its peer kept for --hold S, the
 * client's own copy closed once sent): lingerpage (sent as the page), lingermany (after the
 * page, six more: more than the agent's ancillary room held), lingertail (a valid
 * registration, then one more byte carrying it, before the answer).
 * --tick MS: every MS ms one more allreduce and 1000 bytes sent over tcp to another host;
 * --weight W: the QoS weight the page asks for (the agent takes at most the credential's);
 * --dup: register the same page a second time on another connection (a reconnect);
 * --rereg: when the agent goes away, register the same page again with the next agent (as
 * the library does); the final counters and the page's life are printed at the end
 * ("final ops=N sent=N life_ns=N").
 * Exit 0 accepted, 1 refused, 3 failure of the client itself. */
#include "meter/meter_page.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 2U
#endif

static int mc_die(const char *what)
{
    fprintf(stderr, "meter_client: %s: %s\n", what, strerror(errno));
    exit(3);
}

static int mc_memfd(size_t size, int seal)
{
    int fd = memfd_create("shoal-meter", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    if (fd < 0)
        mc_die("memfd_create");
    if (ftruncate(fd, (off_t)size) != 0)
        mc_die("ftruncate");
    if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        mc_die("F_ADD_SEALS");
    return fd;
}

/* 0 when the whole message went, else -1. */
static int mc_send_try(int s, const void *buf, size_t len, const int *fds, int nfds)
{
    union {
        char buf[CMSG_SPACE(8 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    struct cmsghdr *c;

    if (nfds > 0) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
    }
    return sendmsg(s, &msg, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

static void mc_send(int s, const void *buf, size_t len, const int *fds, int nfds)
{
    if (mc_send_try(s, buf, len, fds, nfds) != 0)
        mc_die("sendmsg");
}

static uint64_t *mc_counter(shoal_meter_page_t *pg, const char *name)
{
    int a, b;

    if (sscanf(name, "ops:%d", &a) == 1 && a >= 0 && a < SHOAL_METER_NCOLL)
        return &pg->ops[a];
    if (sscanf(name, "sent:%d:%d", &a, &b) == 2 && a >= 0 && a < SHOAL_METER_NTL && b >= 0 &&
        b < SHOAL_METER_NLOC)
        return &pg->bytes_sent[a][b];
    if (sscanf(name, "recv:%d:%d", &a, &b) == 2 && a >= 0 && a < SHOAL_METER_NTL && b >= 0 &&
        b < SHOAL_METER_NLOC)
        return &pg->bytes_recv[a][b];
    if (strcmp(name, "coll_ns") == 0)
        return &pg->coll_ns;
    if (strcmp(name, "coll_ticks") == 0)
        return &pg->coll_ticks;
    if (strcmp(name, "tick_mult") == 0)
        return &pg->tick_conv[pg->tick_slot & 1].mult;
    if (strcmp(name, "errors") == 0)
        return &pg->errors;
    if (strcmp(name, "peer_failures") == 0)
        return &pg->peer_failures;
    if (strcmp(name, "aborts") == 0)
        return &pg->aborts;
    if (strcmp(name, "auth_failed") == 0)
        return &pg->auth_failed;
    if (strcmp(name, "auth_refused") == 0)
        return &pg->auth_refused;
    if (strcmp(name, "breaker_opened") == 0)
        return &pg->breaker_opened;
    if (strcmp(name, "cuda_ipc_sent") == 0)
        return &pg->cuda_ipc_sent;
    if (strcmp(name, "cuda_ipc_recv") == 0)
        return &pg->cuda_ipc_recv;
    if (strcmp(name, "nccl_sent") == 0)
        return &pg->nccl_sent;
    if (strcmp(name, "nccl_recv") == 0)
        return &pg->nccl_recv;
    fprintf(stderr, "meter_client: unknown counter %s\n", name);
    exit(3);
}

/* A connected loopback TCP socket whose last close() waits up to 30 s (SO_LINGER) for its
 * unsent data: the peer (*peer_p, kept open) never reads and both buffers are full. */
static int mc_linger_sock(int *peer_p)
{
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct linger lg = {.l_onoff = 1, .l_linger = 30};
    socklen_t alen = sizeof(in);
    int small = 4096, l, c;
    char buf[65536] = {0};

    l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || c < 0)
        mc_die("socket");
    setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    if (bind(l, (struct sockaddr *)&in, sizeof(in)) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&in, &alen) != 0 ||
        connect(c, (struct sockaddr *)&in, sizeof(in)) != 0)
        mc_die("loopback tcp");
    *peer_p = accept(l, NULL, NULL);
    if (*peer_p < 0)
        mc_die("accept");
    close(l);
    while (send(c, buf, sizeof(buf), MSG_DONTWAIT | MSG_NOSIGNAL) > 0)
        ;
    if (setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) != 0)
        mc_die("SO_LINGER");
    return c;
}

static int mc_connect(const struct sockaddr_un *sa)
{
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (s < 0)
        mc_die("socket");
    if (connect(s, (const struct sockaddr *)sa, sizeof(*sa)) != 0) {
        close(s);
        return -1;
    }
    return s;
}

static int mc_reply(int s, shoal_meter_reg_reply_t *rep)
{
    size_t got;
    ssize_t ret;

    for (got = 0; got < sizeof(*rep);) {
        ret = recv(s, (char *)rep + got, sizeof(*rep) - got, 0);
        if (ret <= 0)
            return -1;
        got += (size_t)ret;
    }
    rep->reason[sizeof(rep->reason) - 1] = '\0';
    return 0;
}

static uint64_t mc_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* --mode truncrace: registrations one after the other for --hold seconds (5 by default), at
 * most --tries, each of a memfd of the page's size sent unsealed, then truncated to 0 and
 * sealed 0 to 30 us later (in steps of 100 ns, over and over): an agent that checks the
 * size before the seals can see the right size and then the seals, map an empty file and
 * die of SIGBUS at its first read. Exit 0 when the agent answered every one, 2 when it
 * stopped answering. */
static int mc_truncrace(const struct sockaddr_un *sa, double seconds, long tries)
{
    shoal_meter_reg_t reg = {.magic = SHOAL_METER_REG_MAGIC, .version = SHOAL_METER_VERSION,
                             .page_bytes = SHOAL_METER_PAGE_BYTES};
    uint64_t end = mc_now_ms() + (uint64_t)(seconds * 1000);
    struct timeval tv = {.tv_sec = 5, .tv_usec = 0};
    shoal_meter_reg_reply_t rep;
    struct timespec t0, t;
    shoal_meter_page_t *pg;
    long k, delay_ns;
    int s, fd, lost = 1;

    for (k = 0;; k++) {
        if (k >= tries || mc_now_ms() >= end) {
            lost = 0;
            break;
        }
        s = mc_connect(sa);
        if (s < 0)
            break;
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        fd = mc_memfd(SHOAL_METER_PAGE_BYTES, 0);
        pg = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (pg == MAP_FAILED)
            mc_die("mmap");
        pg->magic = SHOAL_METER_MAGIC;
        pg->version = SHOAL_METER_VERSION;
        pg->size = sizeof(*pg);
        munmap(pg, SHOAL_METER_PAGE_BYTES);
        if (mc_send_try(s, &reg, sizeof(reg), &fd, 1) != 0) {
            close(fd);
            close(s);
            break;
        }
        delay_ns = (k % 301) * 100;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do
            clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < delay_ns);
        if (ftruncate(fd, 0) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
            mc_die("truncate and seal");
        close(fd);
        if (mc_reply(s, &rep) != 0) {
            close(s);
            break;
        }
        close(s);
    }
    printf("truncrace: the agent answered %ld registrations%s\n", k,
           lost ? ", then stopped answering" : "");
    return lost ? 2 : 0;
}

/* Holds the page: ticks the counters, re-registers with a new agent, until the deadline or
 * stdin's end. */
static void mc_hold(shoal_meter_page_t *pg, int *s_p, const struct sockaddr_un *sa,
                    const uint8_t *msg, size_t len, int fd, double hold, int hold_stdin,
                    int tick_ms, int rereg)
{
    uint64_t end = hold > 0 ? mc_now_ms() + (uint64_t)(hold * 1000) : UINT64_MAX;
    uint64_t next_tick = mc_now_ms() + (uint64_t)tick_ms;
    shoal_meter_reg_reply_t rep;
    struct pollfd pf[2];
    char junk[256];
    int n;

    if (!hold_stdin && hold <= 0)
        return;
    while (mc_now_ms() < end) {
        n = 0;
        if (hold_stdin)
            pf[n++] = (struct pollfd){.fd = 0, .events = POLLIN};
        if (*s_p >= 0)
            pf[n++] = (struct pollfd){.fd = *s_p, .events = POLLIN};
        poll(pf, (nfds_t)n, 20);
        if (hold_stdin && (pf[0].revents & (POLLIN | POLLHUP)) != 0 &&
            read(0, junk, sizeof(junk)) <= 0)
            return;
        if (*s_p >= 0 && (pf[n - 1].revents & (POLLIN | POLLHUP)) != 0 &&
            recv(*s_p, junk, sizeof(junk), MSG_DONTWAIT) <= 0) {
            close(*s_p); /* the agent went away */
            *s_p = -1;
        }
        if (*s_p < 0 && rereg) {
            *s_p = mc_connect(sa);
            if (*s_p >= 0) {
                /* A connect in the moment the old agent dies can land in its listener's
                 * backlog and be reset: the send fails, and the next round tries again. */
                if (mc_send_try(*s_p, msg, len, &fd, 1) != 0 || mc_reply(*s_p, &rep) != 0 ||
                    rep.status != 0) {
                    close(*s_p);
                    *s_p = -1;
                } else {
                    fprintf(stderr, "meter_client: registered again\n");
                }
            }
        }
        if (tick_ms > 0 && mc_now_ms() >= next_tick) {
            next_tick += (uint64_t)tick_ms;
            __atomic_store_n(&pg->seq, pg->seq + 1, __ATOMIC_RELEASE);
            __atomic_store_n(&pg->ops[0], pg->ops[0] + 1, __ATOMIC_RELAXED);
            __atomic_store_n(&pg->bytes_sent[1][1], pg->bytes_sent[1][1] + 1000,
                             __ATOMIC_RELAXED);
            __atomic_store_n(&pg->seq, pg->seq + 1, __ATOMIC_RELEASE);
        }
    }
}

/* Streams bytes on the registration connection until the agent closes it (0) or for
 * seconds (1). Each send waits 100 ms at most, so the deadline holds while the agent does
 * not read. */
static int mc_flood_one(int s, double seconds, uint64_t *sent_p)
{
    static char junk[65536];
    uint64_t end = mc_now_ms() + (uint64_t)(seconds * 1000);
    ssize_t ret;

    memset(junk, 'F', sizeof(junk));
    while (mc_now_ms() < end) {
        ret = send(s, junk, sizeof(junk), MSG_NOSIGNAL);
        if (ret > 0)
            *sent_p += (uint64_t)ret;
        else if (ret < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return 0;
    }
    return 1;
}

/* Four writers (this process and three children) on the one connection, so that the agent
 * never finds it empty while it reads: exit 0 when the agent closed it for every writer. */
static int mc_flood(int s, double seconds)
{
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    int bufsz = 4 << 20, i, st, rc;
    pid_t kids[3];
    uint64_t sent = 0;

    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof(bufsz));
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    for (i = 0; i < 3; i++) {
        kids[i] = fork();
        if (kids[i] == 0)
            _exit(mc_flood_one(s, seconds, &sent));
    }
    rc = mc_flood_one(s, seconds, &sent);
    for (i = 0; i < 3; i++) {
        if (kids[i] < 0 || waitpid(kids[i], &st, 0) != kids[i] || !WIFEXITED(st) ||
            WEXITSTATUS(st) != 0)
            rc = 1;
    }
    printf("flood ended after %llu bytes of this writer: %s\n", (unsigned long long)sent,
           rc == 0 ? "the agent closed the connection" : "the connection stayed open");
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"sock", 1, NULL, 's'}, {"tenant", 1, NULL, 't'}, {"job", 1, NULL, 'j'},
        {"rank", 1, NULL, 'r'}, {"nranks", 1, NULL, 'n'}, {"ngpus", 1, NULL, 'g'},
        {"epoch", 1, NULL, 'e'}, {"cred", 1, NULL, 'c'}, {"mode", 1, NULL, 'm'},
        {"set", 1, NULL, 'S'}, {"hold", 1, NULL, 'H'}, {"hold-stdin", 0, NULL, 'I'},
        {"fork-holder", 1, NULL, 'F'}, {"created-ago", 1, NULL, 'C'}, {"tick", 1, NULL, 'T'},
        {"rereg", 0, NULL, 'R'}, {"dup", 0, NULL, 'D'}, {"set2", 1, NULL, '2'},
        {"abandon", 1, NULL, 'A'}, {"weight", 1, NULL, 'W'}, {"tries", 1, NULL, 'N'},
        {"rank2", 1, NULL, 'x'}, {"nranks2", 1, NULL, 'y'}, {"end2", 1, NULL, 'z'},
        {NULL, 0, NULL, 0}};
    int rank2 = -1, nranks2 = -1;
    double end2 = 0;
    const char *sock = NULL, *tenant = "", *job = "job", *cred = "", *mode = "good";
    char *sets[64], *sets2[64], *eq;
    int nsets2 = 0, s3 = -1, fd2;
    shoal_meter_page_t *pg2;
    int nsets = 0, rank = 0, nranks = 1, ngpus = 0, hold_stdin = 0, c, i, s, fd, fds[2];
    int tick_ms = 0, rereg = 0, dup = 0, s2, weight = 0, lfd = -1, lpeer = -1, lfds[7];
    double hold = 0, fork_hold = -1, created_ago = 0, abandon = 0;
    long tries = 1000000;
    unsigned long long epoch = 0;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    shoal_meter_reg_reply_t rep;
    shoal_meter_page_t *pg;
    shoal_meter_reg_t *reg;
    struct timespec ts;
    size_t len;
    uint8_t msg[1024];

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': sock = optarg; break;
        case 't': tenant = optarg; break;
        case 'j': job = optarg; break;
        case 'r': rank = atoi(optarg); break;
        case 'n': nranks = atoi(optarg); break;
        case 'g': ngpus = atoi(optarg); break;
        case 'e': epoch = strtoull(optarg, NULL, 10); break;
        case 'c': cred = optarg; break;
        case 'm': mode = optarg; break;
        case 'S': if (nsets < 64) sets[nsets++] = optarg; break;
        case 'H': hold = atof(optarg); break;
        case 'I': hold_stdin = 1; break;
        case 'F': fork_hold = atof(optarg); break;
        case 'C': created_ago = atof(optarg); break;
        case 'T': tick_ms = atoi(optarg); break;
        case 'R': rereg = 1; break;
        case 'D': dup = 1; break;
        case '2': if (nsets2 < 64) sets2[nsets2++] = optarg; break;
        case 'A': abandon = atof(optarg); break;
        case 'W': weight = atoi(optarg); break;
        case 'N': tries = atol(optarg); break;
        case 'x': rank2 = atoi(optarg); break;
        case 'y': nranks2 = atoi(optarg); break;
        case 'z': end2 = atof(optarg); break;
        default: return 3;
        }
    }
    if (sock == NULL || strlen(sock) >= sizeof(sa.sun_path))
        return 3;
    memcpy(sa.sun_path, sock, strlen(sock));
    if (strcmp(mode, "truncrace") == 0)
        return mc_truncrace(&sa, hold > 0 ? hold : 5, tries);
    s = mc_connect(&sa);
    if (s < 0)
        mc_die("connect");

    fd = mc_memfd(strcmp(mode, "badsize") == 0 ? 2 * SHOAL_METER_PAGE_BYTES :
                  SHOAL_METER_PAGE_BYTES, strcmp(mode, "unsealed") != 0);
    pg = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (pg == MAP_FAILED)
        mc_die("mmap");
    pg->magic = strcmp(mode, "badmagic") == 0 ? 0xdeadbeef : SHOAL_METER_MAGIC;
    pg->version = SHOAL_METER_VERSION;
    pg->size = sizeof(*pg);
    pg->state = SHOAL_METER_LIVE;
    snprintf(pg->tenant, sizeof(pg->tenant), "%s", tenant);
    snprintf(pg->job, sizeof(pg->job), "%s", job);
    pg->epoch = epoch;
    pg->comm_id = 1;
    pg->qos_weight = weight;
    pg->rank = rank;
    pg->nranks = nranks;
    pg->ngpus = ngpus;
    for (i = 0; i < SHOAL_METER_MAX_GPUS; i++)
        pg->gpus[i] = i < ngpus ? i : -1;
    pg->pid = getpid();
    clock_gettime(CLOCK_REALTIME, &ts);
    pg->created_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec -
                          (uint64_t)(created_ago * 1e9);

    reg = (shoal_meter_reg_t *)msg;
    reg->magic = SHOAL_METER_REG_MAGIC;
    reg->version = SHOAL_METER_VERSION;
    reg->page_bytes = SHOAL_METER_PAGE_BYTES;
    reg->cred_len = (uint32_t)strlen(cred);
    memcpy(msg + sizeof(*reg), cred, reg->cred_len);
    len = sizeof(*reg) + reg->cred_len;
    fds[0] = fd;
    fds[1] = fd;
    if (strcmp(mode, "garbage") == 0) {
        memset(msg, 'G', 64);
        mc_send(s, msg, 64, NULL, 0);
    } else if (strcmp(mode, "shortclose") == 0) {
        mc_send(s, msg, 5, fds, 1);
        close(s);
        return 0;
    } else if (strcmp(mode, "slow") == 0) {
        for (i = 0; i < (int)len; i++) {
            mc_send(s, msg + i, 1, i == 0 ? fds : NULL, i == 0);
            usleep(300000);
            if (recv(s, &rep, sizeof(rep), MSG_DONTWAIT | MSG_PEEK) > 0)
                break; /* the agent gave up on us */
        }
    } else if (strcmp(mode, "silent") == 0) {
        /* nothing: the agent's deadline ends it */
    } else if (strncmp(mode, "linger", 6) == 0) {
        lfd = mc_linger_sock(&lpeer);
        for (i = 0; i < 7; i++)
            lfds[i] = i == 0 && strcmp(mode, "lingerpage") != 0 ? fd : lfd;
        if (strcmp(mode, "lingertail") == 0) {
            mc_send(s, msg, len, fds, 1);
            mc_send(s, "x", 1, &lfd, 1);
        } else {
            mc_send(s, msg, len, lfds, strcmp(mode, "lingermany") == 0 ? 7 : 1);
        }
        close(lfd); /* the agent holds the last one */
    } else {
        mc_send(s, msg, len, fds, strcmp(mode, "nofd") == 0 ? 0 :
                strcmp(mode, "twofds") == 0 ? 2 : 1);
    }
    if (mc_reply(s, &rep) != 0) {
        printf("status=closed reason=the agent closed the connection\n");
        return 1;
    }
    printf("status=%d reason=%s\n", rep.status, rep.reason);
    fflush(stdout);
    if (lpeer >= 0 && hold > 0)
        usleep((useconds_t)(hold * 1e6)); /* the peer stays: the agent's close would wait */
    if (rep.magic != SHOAL_METER_REG_MAGIC || rep.status != 0)
        return 1;

    if (dup) {
        /* The same page registered again on a second connection, the first one still open. */
        s2 = mc_connect(&sa);
        if (s2 < 0)
            mc_die("connect");
        mc_send(s2, msg, len, &fd, 1);
        if (mc_reply(s2, &rep) != 0)
            return 1;
        printf("dup status=%d reason=%s\n", rep.status, rep.reason);
        fflush(stdout);
        close(s);
        s = s2;
    }
    /* The library's writer: seq odd while the counters change. */
    __atomic_store_n(&pg->seq, pg->seq + 1, __ATOMIC_RELEASE);
    for (i = 0; i < nsets; i++) {
        eq = strchr(sets[i], '=');
        if (eq == NULL)
            return 3;
        *eq = '\0';
        __atomic_store_n(mc_counter(pg, sets[i]), strtoull(eq + 1, NULL, 10), __ATOMIC_RELAXED);
    }
    __atomic_store_n(&pg->seq, pg->seq + 1, __ATOMIC_RELEASE);
    if (strcmp(mode, "flood") == 0)
        return mc_flood(s, hold > 0 ? hold : 10);
    if (nsets2 > 0) {
        /* A second communicator of this process: its own page and connection. */
        fd2 = mc_memfd(SHOAL_METER_PAGE_BYTES, 1);
        pg2 = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
        if (pg2 == MAP_FAILED)
            mc_die("mmap");
        memcpy(pg2, pg, offsetof(shoal_meter_page_t, seq));
        pg2->comm_id = 2;
        if (rank2 >= 0)
            pg2->rank = rank2;
        if (nranks2 > 0)
            pg2->nranks = nranks2;
        for (i = 0; i < nsets2; i++) {
            eq = strchr(sets2[i], '=');
            if (eq == NULL)
                return 3;
            *eq = '\0';
            *mc_counter(pg2, sets2[i]) = strtoull(eq + 1, NULL, 10);
        }
        s3 = mc_connect(&sa);
        if (s3 < 0)
            mc_die("connect");
        mc_send(s3, msg, len, &fd2, 1);
        if (mc_reply(s3, &rep) != 0)
            return 1;
        printf("second status=%d reason=%s\n", rep.status, rep.reason);
        fflush(stdout);
        if (end2 > 0) { /* its communicator is destroyed while the process lives on */
            usleep((useconds_t)(end2 * 1e6));
            __atomic_store_n(&pg2->state, SHOAL_METER_CLOSED, __ATOMIC_RELEASE);
            close(s3);
            s3 = -1;
            printf("second ended\n");
            fflush(stdout);
        }
    }
    if (fork_hold >= 0) {
        /* A child keeps the connection open: only the pidfd can tell the agent we left. */
        if (fork() == 0) {
            usleep((useconds_t)(fork_hold * 1e6));
            _exit(0);
        }
        _exit(0);
    }
    if (abandon > 0) {
        mc_hold(pg, &s, &sa, msg, len, fd, abandon, 0, tick_ms, 0);
        if (s >= 0)
            close(s);
        s = -1;
        mc_hold(pg, &s, &sa, msg, len, fd, abandon, 0, tick_ms, 0);
        s = mc_connect(&sa);
        if (s < 0)
            mc_die("connect");
        mc_send(s, msg, len, &fd, 1);
        if (mc_reply(s, &rep) != 0 || rep.status != 0)
            return 1;
        fprintf(stderr, "meter_client: registered again\n");
    }
    mc_hold(pg, &s, &sa, msg, len, fd, hold, hold_stdin, tick_ms, rereg);
    __atomic_store_n(&pg->state, SHOAL_METER_CLOSED, __ATOMIC_RELEASE);
    clock_gettime(CLOCK_REALTIME, &ts);
    /* life_ns: from the page's creation to its end (the connection closes right after) */
    printf("final ops=%llu sent=%llu life_ns=%llu\n", (unsigned long long)pg->ops[0],
           (unsigned long long)pg->bytes_sent[1][1],
           (unsigned long long)((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec -
                                pg->created_unix_ns));
    fflush(stdout);
    if (s >= 0)
        close(s);
    if (s3 >= 0)
        close(s3);
    return 0;
}
