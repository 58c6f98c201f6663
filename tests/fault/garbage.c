/*
 * Garbage at the bootstrap root. This process creates the unique id (the root runs in one of
 * its threads), opens raw TCP connections to the root and sends it junk: random bytes, a
 * truncated frame (then half-close), a truncated frame left hanging, frame headers with an
 * absurd length, a hello with a wrong HMAC. It also forks a process whose uid has a flipped
 * secret (must get SHOAL_ERR_AUTH) and the 3 ranks of a real job, which must initialise and
 * compute correct AllReduces regardless, one of them while 100 idle strangers hold
 * connections to the root. Every raw connection must be closed by the root
 * (read until EOF, with a deadline). Children run under alarm(); the parent kills whatever
 * is left at its deadline. TAP on stdout.
 */
#include "core/boot.h"
#include "core/boot_proto.h"
#include "tests/tap.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GB_NRANKS 3
#define GB_TIMEOUT_MS 5000          /* SHOAL_TIMEOUT_MS for the root and the ranks */
#define GB_EOF_DEADLINE_MS 9000     /* a hanging stranger is dropped after GB_TIMEOUT_MS */
#define GB_CHILD_DEADLINE_MS 40000
#define GB_HANGING 2              /* index of the stranger left hanging */
#define GB_FLOOD 100              /* idle connections, more than SHOAL_BOOT_MAX_PENDING */
#define GB_COUNT_SMALL 1021
#define GB_COUNT_BIG (1048576 + 3)

typedef struct {
    const char *what;
    int fd;
    int expect_refused;   /* a REFUSED frame must arrive before EOF */
    int32_t refused_status;
    size_t got;           /* bytes read before EOF */
    int closed;           /* EOF or reset seen */
    double closed_ms;
} gb_conn_t;

static double gb_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int gb_connect(const shoal_boot_uid_t *u)
{
    int fd = socket(u->root.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    if (connect(fd, (const struct sockaddr *)&u->root, u->root_len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void gb_send(int fd, const void *buf, size_t len)
{
    (void)!send(fd, buf, len, MSG_NOSIGNAL);
}

/* Reads the root's 48-byte challenge (header + nonce); returns 0 on success. */
static int gb_read_challenge(int fd, uint8_t *nonce)
{
    uint8_t buf[sizeof(shoal_boot_frame_t) + SHOAL_BOOT_NONCE];
    size_t have = 0;
    double deadline = gb_now_ms() + 5000;
    while (have < sizeof(buf) && gb_now_ms() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;
        if (poll(&p, 1, 100) <= 0) {
            continue;
        }
        n = recv(fd, buf + have, sizeof(buf) - have, 0);
        if (n <= 0) {
            return -1;
        }
        have += (size_t)n;
    }
    if (have < sizeof(buf)) {
        return -1;
    }
    shoal_boot_frame_t f;
    memcpy(&f, buf, sizeof(f));
    if (f.magic != SHOAL_BOOT_FRAME_MAGIC || f.type != SHOAL_BOOT_CHALLENGE) {
        return -1;
    }
    memcpy(nonce, buf + sizeof(f), SHOAL_BOOT_NONCE);
    return 0;
}

static void gb_open_all(const shoal_boot_uid_t *u, gb_conn_t *c, int n)
{
    uint8_t junk[4096], nonce[SHOAL_BOOT_NONCE];
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                            .len = sizeof(shoal_boot_hello_t), .round = 0};
    shoal_boot_hello_t h;

    for (size_t i = 0; i < sizeof(junk); i++) {
        junk[i] = (uint8_t)(rand() & 0xff);
    }
    for (int i = 0; i < n; i++) {
        c[i].fd = gb_connect(u);
    }
    /* 0: random bytes. */
    gb_send(c[0].fd, junk, sizeof(junk));
    /* 1: a hello header and half a hello, then half-close. */
    gb_send(c[1].fd, &f, sizeof(f));
    gb_send(c[1].fd, junk, sizeof(h) / 2);
    shutdown(c[1].fd, SHUT_WR);
    /* 2: the same, left hanging: the root must drop it at its handshake deadline. */
    gb_send(c[2].fd, &f, sizeof(f));
    gb_send(c[2].fd, junk, sizeof(h) / 2);
    /* 3: a hello header with an absurd length. */
    f.len = 0xfffffff0u;
    gb_send(c[3].fd, &f, sizeof(f));
    gb_send(c[3].fd, junk, sizeof(junk));
    /* 4: an allgather frame of absurd length before any hello. */
    f.type = SHOAL_BOOT_AG;
    f.len = SHOAL_BOOT_MAX_BLOB * 16u;
    gb_send(c[4].fd, &f, sizeof(f));
    gb_send(c[4].fd, junk, sizeof(junk));
    /* 5: a well-formed hello with a wrong HMAC: REFUSED(SHOAL_ERR_AUTH), then close. */
    if (gb_read_challenge(c[5].fd, nonce) == 0) {
        f.type = SHOAL_BOOT_HELLO;
        f.len = sizeof(h);
        memset(&h, 0, sizeof(h));
        h.rank = 0;
        h.nranks = GB_NRANKS;
        memcpy(h.nonce, junk, sizeof(h.nonce));
        memcpy(h.mac, junk + 64, sizeof(h.mac));
        gb_send(c[5].fd, &f, sizeof(f));
        gb_send(c[5].fd, &h, sizeof(h));
    }
}

/* Reads every connection until all are closed, connection stop (if >= 0) is closed, or
 * until_ms after t0; REFUSED frames are parsed. */
static void gb_drain(gb_conn_t *c, int n, double t0, double until_ms, int stop)
{
    uint8_t buf[8192];
    int open = n;
    while (open > 0 && gb_now_ms() - t0 < until_ms && (stop < 0 || !c[stop].closed)) {
        struct pollfd p[16];
        open = 0;
        for (int i = 0; i < n; i++) {
            p[i] = (struct pollfd){.fd = c[i].closed ? -1 : c[i].fd, .events = POLLIN};
            open += !c[i].closed;
        }
        if (poll(p, (nfds_t)n, 100) <= 0) {
            continue;
        }
        for (int i = 0; i < n; i++) {
            ssize_t r;
            if (c[i].closed || p[i].revents == 0) {
                continue;
            }
            r = recv(c[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (r > 0) {
                /* Frames: the challenge (48 bytes), then maybe REFUSED (16 bytes). */
                for (size_t off = 0; off + sizeof(shoal_boot_frame_t) <= (size_t)r; off += 4) {
                    shoal_boot_frame_t f;
                    memcpy(&f, buf + off, sizeof(f));
                    if (f.magic == SHOAL_BOOT_FRAME_MAGIC && f.type == SHOAL_BOOT_REFUSED) {
                        c[i].refused_status = (int32_t)f.round;
                    }
                }
                c[i].got += (size_t)r;
            } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                c[i].closed = 1;
                c[i].closed_ms = gb_now_ms() - t0;
            }
        }
    }
}

/* ---- children ------------------------------------------------------------------------ */

static int gb_check_allreduce(shoal_comm_t comm, int rank, size_t count)
{
    float *s = malloc(count * sizeof(float)), *r = malloc(count * sizeof(float));
    shoal_status_t st;
    int bad = 0;
    if (s == NULL || r == NULL) {
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        s[i] = (float)((rank + (int)(i % 5)) % 4);
    }
    st = shoal_allreduce(s, r, count, SHOAL_FLOAT32, SHOAL_SUM, comm, NULL);
    for (size_t i = 0; st == SHOAL_OK && i < count; i++) {
        float want = 0;
        for (int q = 0; q < GB_NRANKS; q++) {
            want += (float)((q + (int)(i % 5)) % 4);
        }
        if (r[i] != want) {
            fprintf(stderr, "# rank %d: element %zu: expected %g got %g\n", rank, i,
                    (double)want, (double)r[i]);
            bad = 1;
            break;
        }
    }
    if (st != SHOAL_OK) {
        fprintf(stderr, "# rank %d: allreduce of %zu: %s: %s\n", rank, count,
                shoal_status_name(st), shoal_comm_last_error(comm));
    }
    free(s);
    free(r);
    return st != SHOAL_OK || bad;
}

/* Exit status: 0 if all went well, else the negated shoal status (or 1 for wrong data). */
static void gb_rank_main(const shoal_uid_t *uid, int rank)
{
    shoal_comm_t comm = NULL;
    shoal_status_t st;
    int bad;

    shoal_config_t cfg = SHOAL_CONFIG_INIT;

    alarm(30);
    cfg.timeout_ms = 20000; /* the root's is 5 s; ranks wait longer for the late rank 2 */
    st = shoal_comm_init(&comm, GB_NRANKS, rank, uid, &cfg);
    if (st != SHOAL_OK) {
        fprintf(stderr, "# rank %d: shoal_comm_init: %s\n", rank, shoal_status_name(st));
        exit(-st);
    }
    bad = gb_check_allreduce(comm, rank, GB_COUNT_SMALL) ||
          gb_check_allreduce(comm, rank, GB_COUNT_BIG);
    shoal_comm_destroy(comm);
    exit(bad); /* not _exit: LeakSanitizer checks at exit */
}

static void gb_intruder_main(const shoal_uid_t *uid)
{
    shoal_comm_t comm = NULL;
    shoal_status_t st;

    alarm(30);
    st = shoal_comm_init(&comm, GB_NRANKS, 1, uid, NULL);
    if (st == SHOAL_OK) {
        shoal_comm_destroy(comm);
    }
    exit(-st);
}

typedef struct {
    pid_t pid;
    int go_fd;   /* write end: the uid goes there when the child may start */
} gb_child_t;

/* Forks a child before any library thread exists (fork-safe, and LeakSanitizer in the child
 * sees only its own allocations). It waits for its uid on a pipe, then runs fn. */
static gb_child_t gb_spawn(void (*fn)(const shoal_uid_t *, int), int rank)
{
    gb_child_t c = {.pid = -1, .go_fd = -1};
    int p[2];
    if (pipe(p) != 0) {
        return c;
    }
    fflush(stdout);
    fflush(stderr);
    c.pid = fork();
    if (c.pid == 0) {
        shoal_uid_t uid;
        size_t have = 0;
        alarm(40);
        close(p[1]);
        while (have < sizeof(uid)) {
            ssize_t n = read(p[0], (char *)&uid + have, sizeof(uid) - have);
            if (n <= 0) {
                _exit(98); /* the parent gave up on us */
            }
            have += (size_t)n;
        }
        close(p[0]);
        fn(&uid, rank);
        exit(99);
    }
    close(p[0]);
    c.go_fd = p[1];
    return c;
}

static void gb_go(gb_child_t *c, const shoal_uid_t *uid)
{
    (void)!write(c->go_fd, uid, sizeof(*uid));
    close(c->go_fd);
    c->go_fd = -1;
}

static void gb_intruder_trampoline(const shoal_uid_t *uid, int rank)
{
    (void)rank;
    gb_intruder_main(uid);
}

/* Waits for every child until the deadline, then kills the rest. codes[i] = exit status,
 * or -1 if killed / died of a signal. Returns 1 if all exited by themselves. */
static int gb_reap(gb_child_t *kids, int *codes, int n, double t0)
{
    int left = n, all = 1;
    for (int i = 0; i < n; i++) {
        codes[i] = kids[i].pid > 0 ? -2 : -1;
        left -= kids[i].pid <= 0;
        if (kids[i].go_fd >= 0) {
            close(kids[i].go_fd); /* never started: it exits at once */
        }
    }
    while (left > 0 && gb_now_ms() - t0 < GB_CHILD_DEADLINE_MS) {
        int ws;
        pid_t p = waitpid(-1, &ws, WNOHANG);
        if (p <= 0) {
            usleep(10000);
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (kids[i].pid == p) {
                codes[i] = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
                left--;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        if (codes[i] == -2) {
            all = 0;
            kill(kids[i].pid, SIGKILL);
            waitpid(kids[i].pid, NULL, 0);
            codes[i] = -1;
        }
    }
    return all;
}

static void gb_report(const gb_conn_t *c, int n)
{
    for (int i = 0; i < n; i++) {
        if (c[i].fd < 0) {
            tap_ok(0, "%s: could not connect to the root", c[i].what);
            continue;
        }
        tap_ok(c[i].closed, "%s: root closed the connection (%zu bytes read, %.0f ms)",
               c[i].what, c[i].got, c[i].closed_ms);
        if (c[i].expect_refused) {
            tap_is_int(c[i].refused_status, SHOAL_ERR_AUTH, "%s: refused with %s", c[i].what,
                       shoal_status_name((shoal_status_t)c[i].refused_status));
        }
        close(c[i].fd);
    }
}

int main(void)
{
    gb_conn_t conns[] = {
        {.what = "random bytes"},
        {.what = "truncated hello, half-closed"},
        {.what = "truncated hello, left hanging"},
        {.what = "hello header with length 0xfffffff0"},
        {.what = "allgather header of 16 MiB before any hello"},
        {.what = "hello with a wrong HMAC", .expect_refused = 1},
    };
    const int nconns = (int)(sizeof(conns) / sizeof(conns[0]));
    gb_child_t kids[GB_NRANKS + 1];
    int codes[GB_NRANKS + 1], all_exited;
    shoal_uid_t uid, baduid;
    shoal_boot_uid_t u;
    double t0;

    alarm(90);
    signal(SIGPIPE, SIG_IGN);
    setenv("SHOAL_TIMEOUT_MS", "5000", 1);
    srand((unsigned)getpid());
    for (int r = 0; r < GB_NRANKS; r++) {
        kids[r] = gb_spawn(gb_rank_main, r);
    }
    kids[GB_NRANKS] = gb_spawn(gb_intruder_trampoline, 0);
    if (shoal_get_unique_id(&uid) != SHOAL_OK || shoal_boot_uid_decode(&uid, &u) != SHOAL_OK) {
        tap_bail("shoal_get_unique_id / shoal_boot_uid_decode failed");
        gb_reap(kids, codes, GB_NRANKS + 1, gb_now_ms());
        return 1;
    }
    tap_ok(1, "unique id created and decoded (root in this process)");
    for (size_t i = 0; i < sizeof(u.secret); i++) {
        u.secret[i] ^= 0xff;
    }
    shoal_boot_uid_encode(&u, &baduid);
    t0 = gb_now_ms();
    gb_open_all(&u, conns, nconns);
    /* The root must stay up until the hanging stranger's handshake deadline: rank 1 joins
     * half-way (the root's idle deadline restarts), rank 2 once the stranger is dropped. */
    gb_go(&kids[GB_NRANKS], &baduid);
    gb_go(&kids[0], &uid);
    gb_drain(conns, nconns, t0, GB_TIMEOUT_MS / 2, -1);
    gb_go(&kids[1], &uid);
    gb_drain(conns, nconns, t0, GB_EOF_DEADLINE_MS, GB_HANGING);
    /* A flood of idle strangers (more than the root holds pending) while rank 2 joins: the
     * root evicts the oldest, and a real rank that is evicted anyway redials. */
    int flood[GB_FLOOD], nflood = 0;
    for (int i = 0; i < GB_FLOOD; i++) {
        flood[i] = gb_connect(&u);
        nflood += flood[i] >= 0;
    }
    tap_is_int(nflood, GB_FLOOD, "%d idle connections opened to the root", GB_FLOOD);
    gb_go(&kids[2], &uid);
    gb_drain(conns, nconns, t0, GB_EOF_DEADLINE_MS, -1);
    gb_report(conns, nconns);
    for (int i = 0; i < GB_FLOOD; i++) {
        if (flood[i] >= 0) {
            close(flood[i]);
        }
    }
    tap_ok(conns[GB_HANGING].closed && conns[GB_HANGING].closed_ms > GB_TIMEOUT_MS - 1000,
           "the hanging stranger was dropped at its handshake deadline (%.0f ms, deadline %d)",
           conns[GB_HANGING].closed_ms, GB_TIMEOUT_MS);
    all_exited = gb_reap(kids, codes, GB_NRANKS + 1, t0);
    tap_is_int(codes[GB_NRANKS], -SHOAL_ERR_AUTH,
               "process with a flipped secret: shoal_comm_init returned %s",
               codes[GB_NRANKS] > 0 ? shoal_status_name((shoal_status_t)-codes[GB_NRANKS])
                                    : codes[GB_NRANKS] == 0 ? "SHOAL_OK" : "(killed)");
    for (int r = 0; r < GB_NRANKS; r++) {
        tap_is_int(codes[r], 0, "rank %d of the real job: init and AllReduces correct (exit %d)",
                   r, codes[r]);
    }
    tap_ok(all_exited, "every child exited before the %d ms deadline", GB_CHILD_DEADLINE_MS);
    return tap_done();
}
