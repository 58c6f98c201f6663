/* The bootstrap's variable-length round (shoal_boot_allgatherv): a real root on loopback and
 * ranks in threads, records of different lengths (one empty, one at the largest a rank may
 * give), a fixed-length round and a barrier after it on the same connections; the table
 * parser's bounds; the root's bytes: a table of the records' lengths, not of the largest; and
 * the root's thread is over (its port closed) when shoal_boot_root_wait returns, whether the
 * ranks said bye or nobody came (then it is stopped at the grace); a process forked after its
 * parent started a root neither waits for that root nor stops it, and closes its copy of
 * the root's listening socket; and the process's return from main stops a root nobody
 * waited for before the exit handlers registered earlier (libcrypto's) run; and a failed
 * init of the root's process under an infinite timeout returns after the grace. */
#include "core/core.h"
#include "core/boot_proto.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define NR 5

static shoal_boot_uid_t uid;

typedef struct {
    int rank;
    shoal_status_t st;
    int table_ok;   /* every rank's record came back, in rank order, byte for byte */
    int fixed_ok;   /* the fixed-length round after it */
    size_t table_len;
} rank_t;

/* Rank k's record: k * 37 bytes (rank 0 says nothing), the last rank the largest allowed. */
static size_t rec_len(int k)
{
    return k == NR - 1 ? SHOAL_BOOT_MAX_BLOB : (size_t)k * 37;
}

static uint8_t rec_byte(int k, size_t i)
{
    return (uint8_t)(k * 31 + i * 7 + 1);
}

static void *rank_main(void *arg)
{
    rank_t *me = arg;
    shoal_boot_t *b = NULL;
    uint8_t *rec = malloc(rec_len(me->rank) + 1), *table = NULL;
    const uint8_t *ents[NR];
    uint32_t lens[NR];
    int32_t mine = me->rank * 1000, all[NR];

    for (size_t i = 0; i < rec_len(me->rank); i++) {
        rec[i] = rec_byte(me->rank, i);
    }
    me->st = shoal_boot_connect(&uid, me->rank, NR, 20000, NULL, &b);
    if (me->st == SHOAL_OK) {
        me->st = shoal_boot_allgatherv(b, rec, rec_len(me->rank), &table, ents, lens);
    }
    if (me->st == SHOAL_OK) {
        me->table_ok = 1;
        for (int k = 0; k < NR; k++) {
            me->table_len += 4 + lens[k];
            if (lens[k] != rec_len(k)) {
                me->table_ok = 0;
                continue;
            }
            for (size_t i = 0; i < lens[k]; i++) {
                me->table_ok &= ents[k][i] == rec_byte(k, i);
            }
        }
        me->st = shoal_boot_allgather(b, &mine, sizeof(mine), all);
    }
    if (me->st == SHOAL_OK) {
        me->fixed_ok = 1;
        for (int k = 0; k < NR; k++) {
            me->fixed_ok &= all[k] == k * 1000;
        }
        me->st = shoal_boot_barrier(b);
    }
    shoal_boot_close(b);
    free(table);
    free(rec);
    return NULL;
}

/* 1 when a connection to the root's address is refused: its listener is closed. */
static int root_gone(const shoal_boot_uid_t *u)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), refused;
    refused = connect(fd, (const struct sockaddr *)&u->root, u->root_len) != 0;
    close(fd);
    return refused;
}

static void test_round(void)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    pthread_t th[NR];
    rank_t r[NR];
    int all_ok = 1, tables = 1, fixed = 1;

    memset(&uid, 0, sizeof(uid));
    memset(&ss, 0, sizeof(ss));
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memset(uid.secret, 0x42, sizeof(uid.secret));
    tap_is_int(shoal_boot_root_start(&ss, sizeof(*s4), 0, shoal_core_config.timeout_ms, &uid),
               SHOAL_OK, "root started");
    for (int k = 0; k < NR; k++) {
        memset(&r[k], 0, sizeof(r[k]));
        r[k].rank = k;
        pthread_create(&th[k], NULL, rank_main, &r[k]);
    }
    for (int k = 0; k < NR; k++) {
        pthread_join(th[k], NULL);
        all_ok &= r[k].st == SHOAL_OK;
        tables &= r[k].table_ok;
        fixed &= r[k].fixed_ok;
        if (r[k].st != SHOAL_OK) {
            tap_diag("rank %d: %s", k, shoal_strerror(r[k].st));
        }
    }
    tap_ok(all_ok, "every rank finished both rounds and the barrier");
    tap_ok(tables, "every rank got every record, of its own length, byte for byte");
    tap_ok(fixed, "a fixed-length round after the variable one is right");
    tap_is_int((long long)r[0].table_len, 4 * NR + 37 * (1 + 2 + 3) + SHOAL_BOOT_MAX_BLOB,
               "the table holds the records' lengths, not NR times the largest");
    shoal_boot_root_key_t k;
    shoal_boot_root_key(&uid, &k);
    uint64_t t0 = shoal_time_ns();
    shoal_boot_root_wait(&k, 5000, 1);
    double ms = (double)(shoal_time_ns() - t0) / 1e6;
    tap_ok(ms < 4000, "the root ended by itself once every rank said bye (%.1f ms)", ms);
    tap_ok(root_gone(&uid), "its thread is over: the port is closed");
}

/* A root nobody joins is stopped at the grace, its thread joined. */
static void test_stop(void)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    shoal_boot_uid_t u;

    memset(&u, 0, sizeof(u));
    memset(&ss, 0, sizeof(ss));
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    tap_is_int(shoal_boot_root_start(&ss, sizeof(*s4), 0, shoal_core_config.timeout_ms, &u),
               SHOAL_OK, "an idle root started");
    shoal_boot_root_key_t k, other;
    shoal_boot_root_key(&u, &k);
    other = k;
    other.tag[0] ^= 1;
    uint64_t t0 = shoal_time_ns();
    shoal_boot_root_wait(&other, 100, 1); /* another job's root at the same address: not ours */
    tap_ok((double)(shoal_time_ns() - t0) / 1e6 < 50 && !root_gone(&u),
           "a key with another job's tag neither waits for nor stops the root");
    t0 = shoal_time_ns();
    shoal_boot_root_wait(&k, 100, 0);
    tap_ok(!root_gone(&u), "without stop, a root not done is left running after the grace");
    t0 = shoal_time_ns();
    shoal_boot_root_wait(&k, 100, 1);
    double ms = (double)(shoal_time_ns() - t0) / 1e6;
    tap_ok(ms >= 99 && ms < 2000, "waited the grace, then stopped it (%.1f ms)", ms);
    tap_ok(root_gone(&u), "the idle root's port is closed");
    shoal_boot_root_wait(&k, 100, 1); /* no such root any more: nothing */
    tap_ok(1, "waiting for a root that is gone returns");
}

/* Sockets among this process's descriptors (the root's listening one, inherited). */
static int sockets_open(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], link[64];
    int n = 0;

    while (d != NULL && (e = readdir(d)) != NULL) {
        ssize_t k;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        k = readlink(path, link, sizeof(link) - 1);
        n += k > 7 && strncmp(link, "socket:", 7) == 0;
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

/* A child forked after the root started (a parent that makes the unique id, then forks its
 * ranks) inherits the list of roots, not the root's thread: its destroy waited for that
 * thread forever, after it had stopped the parent's root through the shared eventfd. */
static void test_fork(void)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    shoal_boot_uid_t u;
    int status = -1;
    pid_t pid, got = 0;

    memset(&u, 0, sizeof(u));
    memset(&ss, 0, sizeof(ss));
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    shoal_boot_root_key_t k;
    tap_is_int(shoal_boot_root_start(&ss, sizeof(*s4), 0, shoal_core_config.timeout_ms, &u),
               SHOAL_OK, "a root started");
    shoal_boot_root_key(&u, &k);
    pid = fork();
    if (pid == 0) {
        shoal_boot_root_wait(&k, 100, 1);
        _exit(sockets_open() == 0 ? 0 : 2);
    }
    for (int i = 0; i < 500 && pid > 0 && (got = waitpid(pid, &status, WNOHANG)) == 0; i++) {
        usleep(10000);
    }
    if (pid > 0 && got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    tap_ok(got == pid && WIFEXITED(status),
           "a forked child's wait for its parent's root returns (not waiting for a thread it "
           "does not have)");
    tap_ok(got == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the child closed its copy of the root's listening socket");
    tap_ok(!root_gone(&u), "the parent's root still runs: the child did not stop it");
    shoal_boot_root_wait(&k, 100, 1);
    tap_ok(root_gone(&u), "the parent stops its own root");
}

/* The child of test_exit: its exit handler, registered before any root starts (as
 * libcrypto's cleanup is when the application used libcrypto first), runs after shoal's
 * and finds the root's listener closed. */
static shoal_boot_uid_t exit_uid;

static void exit_check(void)
{
    _exit(root_gone(&exit_uid) ? 0 : 1);
}

static int exit_child(void)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;

    atexit(exit_check);
    memset(&ss, 0, sizeof(ss));
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (shoal_boot_root_start(&ss, sizeof(*s4), 0, shoal_core_config.timeout_ms, &exit_uid) !=
        SHOAL_OK) {
        _exit(2);
    }
    return 0; /* from main, the root still waiting for its ranks */
}

/* A root no communicator waited for is stopped by the process's exit, before the exit
 * handlers registered earlier (libcrypto's) run. */
static void test_exit(const char *self)
{
    int st = -1;
    pid_t pid = fork();

    if (pid == 0) {
        execl(self, self, "--exit-child", (char *)NULL);
        _exit(3);
    }
    waitpid(pid, &st, 0);
    tap_ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
           "returning from main stops a root nobody waited for before earlier exit handlers "
           "run (status %#x)", st);
}

/* A "root" that is no shoal root: another service now holds the port of a stale SHOAL_UID
 * (an HTTP server answers its error and closes). It will never speak the bootstrap: the rank
 * says so at once, not after redialing it for the whole timeout. */
typedef struct {
    int lfd;
    int accepts;
    int stop; /* atomic: set by the test, read by the thread */
} junk_root_t;

static void *junk_root_main(void *arg)
{
    static const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    junk_root_t *j = arg;
    while (!__atomic_load_n(&j->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {.fd = j->lfd, .events = POLLIN};
        int fd;
        if (poll(&p, 1, 20) <= 0) {
            continue;
        }
        fd = accept(j->lfd, NULL, NULL);
        if (fd < 0) {
            continue;
        }
        j->accepts++;
        (void)!write(fd, reply, sizeof(reply) - 1);
        close(fd);
    }
    return NULL;
}

static void test_not_a_root(void)
{
    struct sockaddr_in *s4;
    shoal_boot_uid_t u;
    shoal_boot_t *b = NULL;
    junk_root_t j = {.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
    socklen_t len = sizeof(u.root);
    pthread_t th;
    shoal_status_t st;

    memset(&u, 0, sizeof(u));
    s4 = (struct sockaddr_in *)&u.root;
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    u.root_len = sizeof(*s4);
    if (j.lfd < 0 || bind(j.lfd, (struct sockaddr *)s4, sizeof(*s4)) != 0 ||
        listen(j.lfd, 16) != 0 || getsockname(j.lfd, (struct sockaddr *)&u.root, &len) != 0) {
        tap_skip(3, "no loopback listener");
        return;
    }
    pthread_create(&th, NULL, junk_root_main, &j);
    uint64_t t0 = shoal_time_ns();
    st = shoal_boot_connect(&u, 1, 2, 3000, NULL, &b);
    double ms = (double)(shoal_time_ns() - t0) / 1e6;
    __atomic_store_n(&j.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    close(j.lfd);
    tap_is_int(st, SHOAL_ERR_PROTOCOL, "a server that is no shoal root: SHOAL_ERR_PROTOCOL");
    tap_ok(ms < 1000, "at once, not at the timeout of 3000 ms (%.1f ms)", ms);
    tap_is_int(j.accepts, 1, "dialed once, not redialed for the whole timeout");
    if (st == SHOAL_OK) {
        shoal_boot_close(b);
    }
}

/* A root that gives up waiting (its timeout shorter than the ranks': the launcher's
 * SHOAL_TIMEOUT_MS, ranks with a longer cfg.timeout_ms) while a rank never came: the ranks
 * that joined are told it timed out, not left to find its connection closed ("peer process
 * failed" while the root's process lives on). */
static void test_root_gives_up(void)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    shoal_boot_uid_t u;
    shoal_boot_t *b = NULL;
    shoal_status_t st;

    memset(&u, 0, sizeof(u));
    memset(&ss, 0, sizeof(ss));
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memset(u.secret, 0x17, sizeof(u.secret));
    tap_is_int(shoal_boot_root_start(&ss, sizeof(*s4), 0, 300, &u), SHOAL_OK,
               "a root of 300 ms started");
    st = shoal_boot_connect(&u, 0, 2, 10000, NULL, &b);
    tap_is_int(st, SHOAL_OK, "rank 0 of 2 joined");
    if (st != SHOAL_OK) {
        tap_skip(2, "no join");
        return;
    }
    uint64_t t0 = shoal_time_ns();
    st = shoal_boot_barrier(b);
    double ms = (double)(shoal_time_ns() - t0) / 1e6;
    tap_is_int(st, SHOAL_ERR_TIMEOUT, "rank 1 never came: the joined rank is told the root "
               "timed out (%s)", shoal_boot_error(b));
    tap_ok(ms < 5000, "when the root gave up, not at the rank's own timeout (%.1f ms)", ms);
    shoal_boot_close(b);
    shoal_boot_root_key_t k;
    shoal_boot_root_key(&u, &k);
    shoal_boot_root_wait(&k, 1000, 1);
}

/* An init that fails in the process that runs the root (a transport not in this build), with
 * cfg.timeout_ms < 0 (no deadline): the root is told and given a grace of at most 1 s for
 * the ranks still to come. The grace was min(timeout, 1000), -1, no end: shoal_comm_init
 * waited for ever for a root that waits for ever for rank 1, instead of returning its error. */
static void test_init_fails_no_timeout(void)
{
    int status = -1;
    pid_t pid = fork(), got = 0;

    if (pid == 0) {
        shoal_uid_t id;
        shoal_comm_t comm = NULL;
        shoal_config_t cfg = SHOAL_CONFIG_INIT;
        shoal_status_t st;

        alarm(30);
        if (shoal_get_unique_id(&id) != SHOAL_OK) {
            _exit(3);
        }
        cfg.timeout_ms = -1;
        cfg.transport = "nosuch";
        st = shoal_comm_init(&comm, 2, 0, &id, &cfg);
        _exit(st == SHOAL_ERR_INVALID_ARG ? 0 : 4);
    }
    for (int i = 0; i < 1000 && pid > 0 && (got = waitpid(pid, &status, WNOHANG)) == 0; i++) {
        usleep(10000);
    }
    if (pid > 0 && got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    tap_ok(got == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "an init that fails in the root's process without a timeout returns its error "
           "within 10 s (status %#x%s)", status, got == 0 ? ", killed" : "");
}

/* A root address the network answers "unreachable" for (SHOAL_ROOT on a subnet this host has
 * no route to): the rank retries until its timeout, then says why. It said only that the
 * connect "did not complete within the timeout" (a firewall dropping SYNs?): the kernel's
 * "No route to host" of every attempt was never logged. */
static void test_unreachable(void)
{
    shoal_boot_uid_t u;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&u.root;
    shoal_boot_t *b = NULL;
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), err = 0;
    socklen_t elen = sizeof(err);
    uint64_t t0 = shoal_time_ns();
    tap_log_t log;
    shoal_status_t st;

    memset(&u, 0, sizeof(u));
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(9);
    inet_pton(AF_INET6, "2001:db8::1", &s6->sin6_addr); /* documentation prefix: no host */
    u.root_len = sizeof(*s6);
    if (fd >= 0 && connect(fd, (struct sockaddr *)s6, sizeof(*s6)) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            err = poll(&p, 1, 4000) == 1 &&
                          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0
                      ? err
                      : 0;
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    if (err != EHOSTUNREACH && err != ENETUNREACH) {
        tap_skip(2, "this host's network does not answer 2001:db8::1 with unreachable");
        return;
    }
    int probe_ms = (int)((shoal_time_ns() - t0) / 1000000);
    int level = shoal_log_level_cur;
    tap_log_begin(&log);
    shoal_log_level_cur = SHOAL_LOG_WARN;
    /* room for a whole neighbour discovery (3 s) after the probe's answer expires: with
     * 1000 ms past twice the probe's time, an attempt on a loaded host was still waiting for
     * the kernel's answer at the deadline, and nothing said why */
    st = shoal_boot_connect(&u, 1, 2, 2 * probe_ms + 4000, NULL, &b);
    shoal_log_level_cur = level;
    tap_log_end(&log);
    tap_is_int(st, SHOAL_ERR_TIMEOUT, "an unreachable root: timed out (after retrying)");
    tap_ok(tap_log_count(&log, "[BOOT]", strerror(err)) >= 1,
           "the log says why every attempt failed: %s", strerror(err));
    tap_log_close(&log);
}

/* The two tests of a process out of descriptors change the log level and the root's ring hook
 * while the root's thread runs, and take every descriptor, ThreadSanitizer's report file's
 * too: under it they raced on the level (a report that could not be written, and every later
 * forked child then exited 66). They run in the other builds. */
#if defined(__SANITIZE_THREAD__)
#define BOOT_V_TSAN 1
#else
#define BOOT_V_TSAN 0
#endif
#define BOOT_V_TSAN_WHY "the descriptor tests change the log level beside the root's thread"

/* A root whose process is out of file descriptors while a rank waits in its backlog: accept()
 * fails (EMFILE) at every pass and the listener stays readable. The root logged "root accept
 * failed" at every pass, spinning (tens of thousands of lines a second); at most once a
 * second now, and it sleeps between the tries. */
static void test_root_emfile(void)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    shoal_boot_uid_t u;
    tap_fds_t fds;
    tap_log_t log;
    int fd, level = shoal_log_level_cur, out;
    struct rusage r0, r1;

    if (BOOT_V_TSAN) {
        tap_skip(3, "ThreadSanitizer: " BOOT_V_TSAN_WHY);
        return;
    }

    memset(&u, 0, sizeof(u));
    memset(&ss, 0, sizeof(ss));
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    tap_is_int(shoal_boot_root_start(&ss, sizeof(*s4), 0, 10000, &u), SHOAL_OK,
               "a root started");
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    tap_log_begin(&log);
    shoal_log_level_cur = SHOAL_LOG_WARN;
    out = tap_fds_exhaust(&fds);
    getrusage(RUSAGE_SELF, &r0);
    int connected = out && fd >= 0 && connect(fd, (struct sockaddr *)&u.root, u.root_len) == 0;
    usleep(500 * 1000);
    getrusage(RUSAGE_SELF, &r1);
    tap_fds_restore(&fds);
    shoal_log_level_cur = level;
    tap_log_end(&log);
    if (!connected) {
        tap_skip(2, "could not run out of descriptors with a connection in the backlog");
    } else {
        double cpu_ms = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec +
                                 r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1e3 +
                        (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec +
                                 r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e3;
        int lines = tap_log_count(&log, "[BOOT]", "accept");
        tap_ok(lines >= 1 && lines <= 2, "out of descriptors for 500 ms: the root says so once "
               "(%d lines)", lines);
        tap_ok(cpu_ms < 150, "and does not spin meanwhile (%.0f ms of CPU in 500 ms)", cpu_ms);
    }
    tap_log_close(&log);
    if (fd >= 0) {
        close(fd);
    }
    shoal_boot_root_key_t k;
    shoal_boot_root_key(&u, &k);
    shoal_boot_root_wait(&k, 100, 1);
}

/* The ring listener of a rank whose process is out of file descriptors when its previous
 * rank dials (rank 1 here, a thread of this process; rank 0 a child): accept() fails at every
 * pass and the listener stays readable. The rank spun on it without a word until its
 * timeout, then blamed the previous rank ("never proved itself"); it fails within about a
 * second now, naming the cause. The root's ring hook runs out of descriptors here, leaving
 * one for rank 1's own dial. */
static tap_fds_t ring_fds;
static int ring_out;

static void ring_emfile_hook(int nranks, uint8_t *recs)
{
    (void)nranks;
    (void)recs;
    ring_out = tap_fds_exhaust(&ring_fds) && ring_fds.n > 0;
    if (ring_out) {
        close(ring_fds.fds[--ring_fds.n]); /* rank 1's dial to rank 0 */
    }
    shoal_boot_root_ring_hook = NULL;
}

static void test_ring_emfile(void)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    shoal_boot_uid_t u;
    shoal_boot_t *b = NULL;
    int32_t mine = 1, all[2];
    tap_log_t log;
    int level = shoal_log_level_cur, status;
    pid_t pid;
    shoal_status_t st;

    if (BOOT_V_TSAN) {
        tap_skip(2, "ThreadSanitizer: " BOOT_V_TSAN_WHY);
        return;
    }
    memset(&u, 0, sizeof(u));
    memset(&ss, 0, sizeof(ss));
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memset(u.secret, 0x29, sizeof(u.secret));
    if (shoal_core_config.boot_exchange != SHOAL_BOOT_EXCHANGE_RING ||
        shoal_boot_root_start(&ss, sizeof(*s4), 0, 20000, &u) != SHOAL_OK) {
        tap_skip(2, "no ring exchange or no root");
        return;
    }
    pid = fork();
    if (pid == 0) {
        shoal_boot_t *b0 = NULL;
        int32_t zero = 0, got[2];
        alarm(30);
        if (shoal_boot_connect(&u, 0, 2, 8000, NULL, &b0) == SHOAL_OK) {
            (void)shoal_boot_allgather(b0, &zero, sizeof(zero), got);
            shoal_boot_close(b0);
        }
        _exit(0);
    }
    shoal_boot_root_ring_hook = ring_emfile_hook;
    tap_log_begin(&log);
    shoal_log_level_cur = SHOAL_LOG_WARN;
    uint64_t t0 = shoal_time_ns();
    st = shoal_boot_connect(&u, 1, 2, 8000, NULL, &b);
    if (st == SHOAL_OK) {
        st = shoal_boot_allgather(b, &mine, sizeof(mine), all);
    }
    double ms = (double)(shoal_time_ns() - t0) / 1e6;
    tap_fds_restore(&ring_fds);
    shoal_boot_root_ring_hook = NULL;
    shoal_log_level_cur = level;
    tap_log_end(&log);
    shoal_boot_close(b);
    waitpid(pid, &status, 0);
    if (!ring_out) {
        tap_skip(2, "could not run out of descriptors");
    } else {
        tap_ok(st != SHOAL_OK && ms < 4000, "rank 1 out of descriptors for its ring listener "
               "fails within about a second, not at its timeout of 8 s (%s after %.0f ms)",
               shoal_strerror(st), ms);
        tap_ok(tap_log_count(&log, "[BOOT]", strerror(EMFILE)) >= 1,
               "and says why: %s", strerror(EMFILE));
    }
    tap_log_close(&log);
    shoal_boot_root_key_t k;
    shoal_boot_root_key(&u, &k);
    shoal_boot_root_wait(&k, 1000, 1);
}

/* A root at an IPv6 link-local address (SHOAL_ROOT=[fe80::...%eth0]:port): the ring's
 * records carry no interface (scope), and a link-local address without one cannot be dialed
 * (EINVAL): the ranks' ring links failed, every bootstrap with them. Each rank takes the
 * scope of its own connection to the root, on the same link. */
typedef struct {
    shoal_boot_uid_t *u;
    int rank;
    shoal_status_t st;
    int32_t all[2];
} ll_rank_t;

static void *ll_rank_main(void *arg)
{
    ll_rank_t *me = arg;
    shoal_boot_t *b = NULL;
    int32_t mine = 100 + me->rank;

    me->st = shoal_boot_connect(me->u, me->rank, 2, 5000, NULL, &b);
    if (me->st == SHOAL_OK) {
        me->st = shoal_boot_allgather(b, &mine, sizeof(mine), me->all);
    }
    if (me->st == SHOAL_OK) {
        me->st = shoal_boot_barrier(b);
    }
    if (b != NULL) {
        shoal_boot_close(b);
    }
    return NULL;
}

static void test_link_local(void)
{
    struct ifaddrs *ifs = NULL;
    struct sockaddr_storage ss;
    shoal_boot_uid_t u;
    pthread_t th[2];
    ll_rank_t r[2];
    int found = 0;

    memset(&ss, 0, sizeof(ss));
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *it = ifs; it != NULL && !found; it = it->ifa_next) {
            if (it->ifa_addr != NULL && it->ifa_addr->sa_family == AF_INET6 &&
                (it->ifa_flags & IFF_UP) != 0 && (it->ifa_flags & IFF_LOOPBACK) == 0 &&
                IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)it->ifa_addr)->sin6_addr)) {
                memcpy(&ss, it->ifa_addr, sizeof(struct sockaddr_in6));
                found = 1;
            }
        }
        freeifaddrs(ifs);
    }
    memset(&u, 0, sizeof(u));
    memset(u.secret, 0x61, sizeof(u.secret));
    if (!found || shoal_core_config.boot_exchange != SHOAL_BOOT_EXCHANGE_RING ||
        shoal_boot_root_start(&ss, sizeof(struct sockaddr_in6), 0, 5000, &u) != SHOAL_OK) {
        tap_skip(1, "no IPv6 link-local address to listen on");
        return;
    }
    for (int k = 0; k < 2; k++) {
        r[k] = (ll_rank_t){.u = &u, .rank = k};
        pthread_create(&th[k], NULL, ll_rank_main, &r[k]);
    }
    for (int k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
    }
    tap_ok(r[0].st == SHOAL_OK && r[1].st == SHOAL_OK && r[0].all[1] == 101 &&
               r[1].all[0] == 100,
           "a root at a link-local address: the ring's links are made (%s, %s)",
           shoal_strerror(r[0].st), shoal_strerror(r[1].st));
    shoal_boot_root_key_t k;
    shoal_boot_root_key(&u, &k);
    shoal_boot_root_wait(&k, 1000, 1);
}

static void test_parse(void)
{
    uint8_t t[4 + 3 + 4 + 0 + 4 + 2];
    const uint8_t *ents[3];
    uint32_t lens[3];

    shoal_put_le(t, 3, 4);
    memcpy(t + 4, "abc", 3);
    shoal_put_le(t + 7, 0, 4);
    shoal_put_le(t + 11, 2, 4);
    memcpy(t + 15, "xy", 2);
    tap_is_int(shoal_boot_table_v_parse(t, sizeof(t), 3, ents, lens), SHOAL_OK,
               "a well-formed table parses");
    tap_ok(lens[0] == 3 && memcmp(ents[0], "abc", 3) == 0 && lens[1] == 0 && lens[2] == 2 &&
               memcmp(ents[2], "xy", 2) == 0, "records where they are");
    tap_is_int(shoal_boot_table_v_parse(t, sizeof(t) - 1, 3, ents, lens), SHOAL_ERR_PROTOCOL,
               "a record running past the table is refused");
    tap_is_int(shoal_boot_table_v_parse(t, sizeof(t), 2, ents, lens), SHOAL_ERR_PROTOCOL,
               "bytes left over after the last rank are refused");
    tap_is_int(shoal_boot_table_v_parse(t, sizeof(t), 4, ents, lens), SHOAL_ERR_PROTOCOL,
               "a table with fewer records than ranks is refused");
    shoal_put_le(t + 11, 0xffffffffu, 4);
    tap_is_int(shoal_boot_table_v_parse(t, sizeof(t), 3, ents, lens), SHOAL_ERR_PROTOCOL,
               "a length that would wrap an offset is refused");
}

/* A rank of the process that runs the root fails its init (here: an unknown transport) under
 * an infinite timeout (cfg.timeout_ms < 0): the init waits for the root's thread for a grace
 * of at most 1 s, as under a finite one. It waited forever: the grace was the timeout, -1. */
static void test_init_fail_inf(void)
{
    int status = -1, waited = 0;
    uint64_t t0 = shoal_time_ns();
    pid_t pid = fork();

    if (pid == 0) {
        shoal_config_t cfg = SHOAL_CONFIG_INIT;
        shoal_comm_t c = NULL;
        shoal_uid_t id;

        alarm(60);
        cfg.timeout_ms = -1;
        cfg.transport = "bogus";
        _exit(shoal_get_unique_id(&id) == SHOAL_OK &&
                      shoal_comm_init(&c, 2, 0, &id, &cfg) == SHOAL_ERR_INVALID_ARG && c == NULL
                  ? 0
                  : 1);
    }
    while (pid > 0 && (waited = (int)waitpid(pid, &status, WNOHANG)) == 0 &&
           shoal_time_ns() - t0 < 10000000000ull) {
        usleep(10000);
    }
    if (pid > 0 && waited == 0) {
        kill(pid, SIGKILL);
        (void)waitpid(pid, &status, 0);
    }
    double ms = (double)(shoal_time_ns() - t0) / 1e6;
    tap_ok(pid > 0 && waited == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "a failed init under an infinite timeout returns SHOAL_ERR_INVALID_ARG (%s after "
           "%.0f ms)", waited == 0 ? "still waiting, killed" : "exited", ms);
}

int main(int argc, char **argv)
{
    setenv("SHOAL_DEBUG", "NONE", 0);
    shoal_config_global_init();
    if (argc > 1 && strcmp(argv[1], "--exit-child") == 0) {
        return exit_child();
    }
    test_parse();
    test_not_a_root();
    test_root_gives_up();
    test_init_fails_no_timeout();
    test_unreachable();
    test_root_emfile();
    test_ring_emfile();
    test_link_local();
    test_round();
    test_stop();
    test_fork();
    test_init_fail_inf();
    test_exit("/proc/self/exe");
    return tap_done();
}
