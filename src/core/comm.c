/*
 * Communicator lifecycle: unique ids, init (bootstrap rounds, transport choice, connects),
 * destroy, abort, split, and the sticky error every later call reports.
 */
#include "core/core.h"
#include "core/boot_proto.h" /* SHOAL_BOOT_MAX_RANKS */
#include "meter/meter.h"
#include "qos/pace.h"
#if SHOAL_HAVE_PMIX
#include "core/pmix.h"
#endif

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Not in shoal.h: for libshoal_mpi, which makes the id for a communicator whose cfg it knows
 * (cfg may be NULL). The id carries cfg's identity (its tenant and job name, as the ranks'
 * shoal_comm_init resolves it): made for the environment's only, every rank given a cfg with
 * a tenant or job name was refused at the join (SHOAL_ERR_PERMISSION). Its root waits cfg's
 * timeout without progress; with SHOAL_TIMEOUT_MS, a rank later than that but within cfg's
 * timeout found the root gone and every rank failed. */
SHOAL_EXPORT shoal_status_t shoal__get_unique_id_cfg(shoal_uid_t *uid, const shoal_config_t *cfg);

/* The id for cfg's identity (NULL: the environment's), its root waiting timeout_ms (< 0:
 * none) without progress. */
static shoal_status_t shoal_unique_id_make(shoal_uid_t *uid, const shoal_config_t *cfg,
                                           int timeout_ms);

shoal_status_t shoal_get_unique_id(shoal_uid_t *uid)
{
    shoal_config_global_init();
    return shoal_unique_id_make(uid, NULL, shoal_core_config.timeout_ms);
}

SHOAL_EXPORT int shoal__comm_timeout_ms(const shoal_config_t *cfg);

SHOAL_EXPORT shoal_status_t shoal__get_unique_id_cfg(shoal_uid_t *uid, const shoal_config_t *cfg)
{
    return shoal_unique_id_make(uid, cfg, shoal__comm_timeout_ms(cfg));
}

static shoal_status_t shoal_unique_id_make(shoal_uid_t *uid, const shoal_config_t *cfg,
                                           int timeout_ms)
{
    uint8_t raw[SHOAL_SECRET_BYTES];
    shoal_boot_uid_t u;
    shoal_tenant_id_t id;
    shoal_tenant_cred_t cred;
    struct sockaddr_storage ss;
    socklen_t len;
    int any, found = 0;
    shoal_status_t st;

    if (uid == NULL) {
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_config_global_init();
    memset(&u, 0, sizeof(u));
    memset(raw, 0, sizeof(raw));
    memset(&cred, 0, sizeof(cred));
    /* The id carries the identity of the process that makes it: its ranks must match. Both
     * it and the secret's binding take one reading of the credential. */
    SHOAL_CHECK_GOTO(shoal_tenant_cred_load(&cred, &found), st, out);
    SHOAL_CHECK_GOTO(shoal_tenant_id_resolve(cfg, found ? &cred : NULL, &id), st, out);
    SHOAL_CHECK_GOTO(shoal_random_bytes(u.secret, sizeof(u.secret)), st, out);
    memcpy(raw, u.secret, sizeof(raw));
    SHOAL_CHECK_GOTO(shoal_boot_ident_make(&id, &u.ident), st, out);
    SHOAL_CHECK_GOTO(shoal_boot_listen_addr(0, &ss, &len, &any), st, out);
    /* The root proves the secret bound to the credential (if any); the id carries it
     * unbound (shoal_tenant_secret_bind). */
    SHOAL_CHECK_GOTO(shoal_tenant_secret_bind(found ? &cred : NULL, u.secret, sizeof(u.secret)),
                     st, out);
    SHOAL_CHECK_GOTO(shoal_boot_root_start(&ss, len, any, timeout_ms, &u), st, out);
    memcpy(u.secret, raw, sizeof(raw));
    shoal_boot_uid_encode(&u, uid);
    st = SHOAL_OK;
out:
    shoal_secret_wipe(&u, sizeof(u));
    shoal_secret_wipe(raw, sizeof(raw));
    shoal_secret_wipe(&cred, sizeof(cred));
    return st;
}

const char *shoal_comm_peer_host(struct shoal_comm *comm, int rank)
{
    if (comm->peers == NULL || rank < 0 || rank >= comm->nranks) {
        return "?";
    }
    return comm->peers[rank].host;
}

/* The state and flags of /proc/PID/stat, or of /proc/PID/task/TID/stat when tid > 0: 0 when
 * read, -1 (errno set) when not. */
static int shoal_comm_proc_stat(pid_t pid, pid_t tid, char *state, unsigned *flags)
{
    char path[80], buf[512], *rp;
    ssize_t n;
    int fd;

    if (tid > 0) {
        snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)tid);
    } else {
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        errno = EIO;
        return -1;
    }
    buf[n] = '\0';
    rp = strrchr(buf, ')');
    if (rp == NULL || sscanf(rp + 1, " %c %*d %*d %*d %*d %*d %u", state, flags) != 2) {
        errno = EIO;
        return -1;
    }
    return 0;
}

/* Whether a thread (state and flags of its stat) runs: not a zombie, not dead, not exiting
 * (the kernel's PF_EXITING, 0x4). */
static int shoal_comm_thread_runs(char state, unsigned flags)
{
    return state != 'Z' && state != 'X' && (flags & 0x4u) == 0;
}

/* Whether a thread of pid other than its main one runs. */
static int shoal_comm_other_thread_runs(pid_t pid)
{
    char path[64], state;
    unsigned flags;
    struct dirent *de;
    int runs = 0;
    DIR *dir;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    dir = opendir(path);
    if (dir == NULL) {
        return 0;
    }
    while (!runs && (de = readdir(dir)) != NULL) {
        long tid = strtol(de->d_name, NULL, 10);
        if (tid > 0 && tid != (long)pid &&
            shoal_comm_proc_stat(pid, (pid_t)tid, &state, &flags) == 0) {
            runs = shoal_comm_thread_runs(state, flags);
        }
    }
    closedir(dir);
    return runs;
}

/* 0 if the process is gone, a zombie (killed, not yet reaped by its parent) or exiting (the
 * kernel's PF_EXITING in the flags of /proc/PID/stat: a SIGKILLed process closes its sockets
 * while its state still reads R, and a peer that sees the close must not take it for alive
 * and blame another rank). /proc/PID/stat is the main thread's: a main thread that called
 * pthread_exit is a zombie, exiting, while the process's other threads run on (and talk to
 * us), so then the process lives while one of them runs. */
static int shoal_comm_pid_alive(pid_t pid)
{
    char state;
    unsigned flags;

    if (kill(pid, 0) != 0 && errno == ESRCH) {
        return 0;
    }
    if (shoal_comm_proc_stat(pid, 0, &state, &flags) != 0) {
        return errno != ENOENT;
    }
    return shoal_comm_thread_runs(state, flags) || shoal_comm_other_thread_runs(pid);
}

/* Whether peer r's published pid names its process here: a rank of this host in another pid
 * namespace (a container sharing the host id through SHOAL_HOSTID or the UTS namespace)
 * published a pid of its namespace, which here is nobody or some other process. Such a peer
 * is not judged by its pid (the shared-memory transport's check still sees it go). */
static int shoal_comm_pid_ours(const struct shoal_comm *comm, int r)
{
    uint32_t mine = comm->peers[comm->rank].pid_ns, its = comm->peers[r].pid_ns;
    return comm->peers[r].pid > 0 && (mine == 0 || its == 0 || mine == its);
}

/* A process of this host that is gone, or -1. Only a hint for the error sentence. */
static int shoal_comm_dead_local_peer(struct shoal_comm *comm, int except)
{
    for (int l = 0; l < comm->local_size; l++) {
        int r = comm->local_ranks[l];
        if (r != comm->rank && r != except && shoal_comm_pid_ours(comm, r) &&
            !shoal_comm_pid_alive((pid_t)comm->peers[r].pid)) {
            return r;
        }
    }
    return -1;
}

int shoal_comm_culprit(struct shoal_comm *comm, int blamed, int peer)
{
    int dead;
    if (blamed >= 0 && blamed < comm->nranks) {
        return blamed;
    }
    /* A peer that only closed its connection (it failed because of someone else, and its
     * notice did not reach us) while another process of this host is gone: that one. */
    if (peer >= 0 && peer < comm->nranks && comm->peers != NULL &&
        comm->peers[peer].host_id == comm->peers[comm->rank].host_id &&
        shoal_comm_pid_ours(comm, peer) && shoal_comm_pid_alive((pid_t)comm->peers[peer].pid) &&
        (dead = shoal_comm_dead_local_peer(comm, peer)) >= 0) {
        return dead;
    }
    return peer;
}

shoal_status_t shoal_comm_set_failed(struct shoal_comm *comm, shoal_status_t status, int culprit,
                                     const char *fmt, ...)
{
    va_list ap;
    int first;

    pthread_mutex_lock(&comm->err_lock);
    first = shoal_comm_fatal(comm) == SHOAL_OK;
    if (first) {
        int n = snprintf(comm->last_error, sizeof(comm->last_error), "rank %d (%s): ",
                         comm->rank, shoal_hostname());
        va_start(ap, fmt);
        vsnprintf(comm->last_error + n, sizeof(comm->last_error) - (size_t)n, fmt, ap);
        va_end(ap);
        /* Publishes the sentence: a reader that sees fatal (acquire) sees last_error. */
        __atomic_store_n(&comm->fatal, status, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&comm->err_lock);
    if (first) {
        shoal_error(CORE, "%s (%s)", comm->last_error, shoal_status_name(status));
        /* Tell the peers, so that they fail now rather than at their timeout. */
        for (int i = 0; i < comm->ntls; i++) {
            if (comm->tls[i].ctx != NULL && comm->tls[i].ops->fail != NULL) {
                comm->tls[i].ops->fail(comm->tls[i].ctx, culprit < 0 ? comm->rank : culprit,
                                       status);
            }
        }
    }
    return status;
}

/* The issue order's ticket when nobody holds or waits for it (ticket_next == ticket_serving),
 * without blocking: 1 if taken (release with shoal_comm_ticket_release), 0 if busy. Tickets
 * only grow, so the compare-and-swap cannot succeed on a stale pair. */
static int shoal_comm_ticket_try(struct shoal_comm *comm)
{
    uint64_t serving = __atomic_load_n(&comm->ticket_serving, __ATOMIC_SEQ_CST);
    uint64_t expect = serving;
    return __atomic_compare_exchange_n(&comm->ticket_next, &expect, serving + 1, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* An abort that no call has turned into a failure yet (it came between calls): fail the
 * communicator now, which sends the transports' failure notices, so that the peers fail at
 * once instead of at their timeout. That needs the transports' one driver: the caller holds
 * the ticket (held), or takes it here if nobody holds it; if a call holds it, that call's
 * wait sees the abort and fails the communicator itself. */
static void shoal_comm_abort_fail(struct shoal_comm *comm, int held)
{
    if (!shoal_comm_aborted(comm) || shoal_comm_fatal(comm) != SHOAL_OK ||
        (!held && !shoal_comm_ticket_try(comm))) {
        return;
    }
    (void)shoal_comm_set_failed(comm, SHOAL_ERR_ABORTED, comm->rank,
                                "aborted by the application");
    if (!held) {
        shoal_comm_ticket_release(comm);
    }
}

/* A communicator used in a process forked from the one that made it: its sockets, segments
 * and peers are the parent's, its threads are not in this process. A call would talk on the
 * parent's connections in the middle of its messages, an abort would fail the parent's job,
 * a destroy wait for threads that are not here (it hung) or unlink the parent's segments.
 * Refused, touching nothing (no lock: one a parent thread held at the fork stays held). */
static shoal_status_t shoal_comm_forked_refuse(struct shoal_comm *comm, const char *what)
{
    shoal_error(CORE, "rank %d: communicator %08x was made by process %d, which forked this "
                "one (%d): a forked process cannot %s it (it is left to the parent; make a "
                "communicator of its own)", comm->rank, comm->comm_id, (int)comm->pid,
                (int)getpid(), what);
    return SHOAL_ERR_INVALID_ARG;
}

shoal_status_t shoal_comm_check_usable(struct shoal_comm *comm)
{
    shoal_status_t fatal;
    if (shoal_comm_forked(comm)) {
        return shoal_comm_forked_refuse(comm, "use");
    }
    fatal = shoal_comm_fatal(comm);
    if (fatal != SHOAL_OK) {
        return fatal;
    }
    if (SHOAL_UNLIKELY(shoal_comm_aborted(comm))) {
        shoal_comm_abort_fail(comm, 0); /* not with the ticket held: see ticket_wait */
        return SHOAL_ERR_ABORTED;
    }
    return SHOAL_OK;
}

/* ---- issue-order execution ---------------------------------------------------------- */

/* Tickets are atomics: the common case (no proxy work queued) takes no lock at all. */
uint64_t shoal_comm_ticket_take(struct shoal_comm *comm)
{
    return __atomic_fetch_add(&comm->ticket_next, 1, __ATOMIC_SEQ_CST);
}

/* The ticket is not served yet: sleep on exec_cond until it is. Out of line, so that the
 * common case below (served already) saves no registers for it. */
static __attribute__((noinline)) void shoal_comm_ticket_sleep(struct shoal_comm *comm,
                                                              uint64_t ticket)
{
    pthread_mutex_lock(&comm->exec_lock);
    /* Atomic: shoal_comm_ticket_release reads it without the lock (seq_cst on both
     * sides: either it sees this waiter, or this waiter sees its serving count). */
    __atomic_fetch_add(&comm->ticket_waiters, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&comm->ticket_serving, __ATOMIC_SEQ_CST) != ticket) {
        /* The call being served has its own deadline; this wait ends when it does. The
         * 10 ms cap only bounds the cost of a missed broadcast. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&comm->exec_cond, &comm->exec_lock, &ts);
    }
    __atomic_fetch_sub(&comm->ticket_waiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&comm->exec_lock);
}

shoal_status_t shoal_comm_ticket_wait(struct shoal_comm *comm, uint64_t ticket)
{
    if (SHOAL_UNLIKELY(__atomic_load_n(&comm->ticket_serving, __ATOMIC_ACQUIRE) != ticket)) {
        shoal_comm_ticket_sleep(comm, ticket);
    }
    if (SHOAL_UNLIKELY(shoal_comm_aborted(comm))) {
        shoal_comm_abort_fail(comm, 1);
    }
    return shoal_comm_check_usable(comm);
}

void shoal_comm_ticket_release(struct shoal_comm *comm)
{
    __atomic_fetch_add(&comm->ticket_serving, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&comm->ticket_waiters, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&comm->exec_lock);
        pthread_cond_broadcast(&comm->exec_cond);
        pthread_mutex_unlock(&comm->exec_lock);
    }
}

/* ---- init ------------------------------------------------------------------------------ */

uint32_t shoal_fork_gen;
static pthread_once_t shoal_fork_once = PTHREAD_ONCE_INIT;

static void shoal_fork_child(void)
{
    __atomic_store_n(&shoal_fork_gen, __atomic_load_n(&shoal_fork_gen, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED); /* one thread in a child that was just forked */
}

static void shoal_fork_register(void)
{
    if (pthread_atfork(NULL, NULL, shoal_fork_child) != 0) {
        shoal_warn(CORE, "pthread_atfork failed: a process forked from this one is not kept "
                   "from using its communicators");
    }
}

/* *s becomes a copy of itself (NULL stays NULL); 1 if the copy failed (*s is NULL then). */
static int shoal_comm_keep_str(const char **s)
{
    if (*s == NULL) {
        return 0;
    }
    *s = strdup(*s);
    return *s == NULL;
}

static shoal_status_t shoal_comm_alloc(int nranks, int rank, const shoal_config_t *cfg,
                                       struct shoal_comm **comm_p)
{
    struct shoal_comm *comm = calloc(1, sizeof(*comm));
    if (comm == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    shoal_ticks_init(); /* the call path's clock, before any call (once per process, 2 ms) */
    pthread_once(&shoal_fork_once, shoal_fork_register);
    comm->fork_gen = __atomic_load_n(&shoal_fork_gen, __ATOMIC_RELAXED);
    comm->pid = (int32_t)getpid();
    comm->rank = rank;
    comm->nranks = nranks;
    comm->abort_efd = -1;
    pthread_mutex_init(&comm->err_lock, NULL);
    pthread_mutex_init(&comm->exec_lock, NULL);
    pthread_cond_init(&comm->exec_cond, NULL);
    pthread_mutex_init(&comm->proxy_lock, NULL);
    if (cfg != NULL) {
        size_t n = cfg->size != 0 && cfg->size < sizeof(comm->cfg) ? cfg->size : sizeof(comm->cfg);
        memcpy(&comm->cfg, cfg, n);
    }
    comm->cfg.size = sizeof(comm->cfg);
    /* Explicit config field > env > default. */
    comm->timeout_ms = comm->cfg.timeout_ms != 0 ? comm->cfg.timeout_ms
                                                 : shoal_core_config.timeout_ms;
    if (comm->timeout_ms < 0) {
        comm->timeout_ms = -1;
    }
    comm->spin_count = shoal_core_config.spin_count;
    /* Strings in cfg are the caller's: keep copies. A copy that failed would read as unset. */
    int lost = shoal_comm_keep_str(&comm->cfg.tenant) |
               shoal_comm_keep_str(&comm->cfg.job_name) |
               shoal_comm_keep_str(&comm->cfg.transport) |
               shoal_comm_keep_str(&comm->cfg.algorithm);
    comm->peers = calloc((size_t)nranks, sizeof(*comm->peers));
    comm->chans = calloc((size_t)nranks, sizeof(*comm->chans));
    comm->local_ranks = calloc((size_t)nranks, sizeof(int));
    if (comm->peers == NULL || comm->chans == NULL || comm->local_ranks == NULL || lost) {
        shoal_comm_destroy(comm);
        return SHOAL_ERR_NO_MEMORY;
    }
    /* Out of descriptors is not out of memory: it said SHOAL_ERR_NO_MEMORY, with no line. */
    comm->abort_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (comm->abort_efd < 0) {
        shoal_error(INIT, "rank %d: eventfd for the communicator's abort notice failed: %s",
                    rank, strerror(errno));
        shoal_comm_destroy(comm);
        return SHOAL_ERR_SYSTEM;
    }
    *comm_p = comm;
    return SHOAL_OK;
}

/* The CPU this process is bound to, plus one; 0 when its affinity allows several (or is
 * unknown). *ncpu_p: how many CPUs it may run on. */
static int shoal_comm_pinned_cpu(int *ncpu_p)
{
    cpu_set_t set;
    *ncpu_p = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        return 0;
    }
    *ncpu_p = CPU_COUNT(&set);
    if (*ncpu_p != 1) {
        return 0;
    }
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &set)) {
            return c + 1;
        }
    }
    return 0;
}

/* Waiters poll with a pause instruction for a few microseconds (SHOAL_SPIN_PAUSE) before they
 * yield, unless a rank of this host may share our CPU: then a spinning waiter only delays the
 * rank it waits for, and it yields at once. A rank bound to one CPU (shoalrun, mpirun
 * --bind-to core) shares it when another local rank is bound to the same CPU, or when unbound
 * local ranks exist and the host's ranks outnumber its CPUs; an unbound rank shares when the
 * host's ranks outnumber the CPUs it may run on. (Counting only the bound rank's own CPU
 * made every bound rank yield at once: the yield costs a system call per wait, 2x the
 * latency of a small AllReduce on 2 ranks.)
 * A transport whose device moves the data with this host's CPUs (host_cpu(): Soft-RoCE) adds
 * one more party to the count: the kernel's packet processing. Where that makes the CPUs
 * too few, a waiter also yields at once, and it sleeps (on the transport's fd, woken by the
 * completion) after SHOAL_HOST_CPU_YIELDS yields at most: tests/vm on one CPU, 64 KiB
 * streams over rxe, 3.3 MiB/s with 2000 yields, 6.6 with 1 (pausing first: 8 B latency 4 ms,
 * a scheduler tick, against 0.24-0.39 ms). */
#define SHOAL_HOST_CPU_YIELDS 16

static int shoal_comm_host_cpu(struct shoal_comm *comm)
{
    for (int t = 0; t < comm->ntls; t++) {
        const shoal_tl_ops_t *ops = comm->tls[t].ops;
        if (comm->tls[t].ctx != NULL && (ops->caps & SHOAL_TL_CAP_HOST_CPU) != 0 &&
            ops->host_cpu != NULL && ops->host_cpu(comm->tls[t].ctx)) {
            return 1;
        }
    }
    return 0;
}

static void shoal_comm_plan_spinning(struct shoal_comm *comm)
{
    int ncpu, mine = comm->peers[comm->rank].pinned_cpu, shared = 0, unbound = 0, dev = 0;
    int online = (int)sysconf(_SC_NPROCESSORS_ONLN);

    (void)shoal_comm_pinned_cpu(&ncpu); /* the CPUs it may run on (mine: as the others saw) */

    if (mine == 0) {
        shared = comm->local_size > ncpu;
    } else {
        for (int q = 0; q < comm->local_size; q++) {
            int p = comm->local_ranks[q], cpu = comm->peers[p].pinned_cpu;
            if (p == comm->rank) {
                continue;
            }
            shared |= cpu == mine;
            unbound |= cpu == 0;
        }
        shared |= unbound && comm->local_size > online;
    }
    if (shoal_comm_host_cpu(comm)) {
        dev = comm->local_size + 1 > (mine == 0 ? ncpu : online);
        shared |= dev;
    }
    comm->pause_spins = shared ? 0 : shoal_core_config.spin_pause;
    /* Adaptive spinning (shoal_chan_idle) where a network transport is in use, whose polls are
     * system calls and whose waits can be long (a slow link); shared memory keeps its spin (8 B
     * AllReduces over shm on the loaded machine: 1.4 us median with the full spin, 2.9 us with
     * the adaptive one, 6 alternated runs each) */
    comm->spin_adapt = 0;
    for (int t = 0; t < comm->ntls && shoal_core_config.spin_adapt; t++) {
        comm->spin_adapt |= comm->tls[t].ctx != NULL && !comm->tls[t].ops->intra_node_only;
    }
    comm->spin_count = dev ? SHOAL_MIN(shoal_core_config.spin_count, SHOAL_HOST_CPU_YIELDS)
                           : shoal_core_config.spin_count;
    shoal_trace(INIT, "rank %d: %d local ranks, bound to cpu %d of %d allowed (%d online)%s: "
                "%s, %u pause polls before yielding, %u yields before sleeping", comm->rank,
                comm->local_size, mine - 1, ncpu, online,
                dev ? ", a device driven by the host's CPUs" : "",
                shared ? "cpu shared" : "cpu not shared", comm->pause_spins, comm->spin_count);
}

/* Which registry transport carries the channel to peer p (same on both sides). */
static int shoal_comm_pick_tl(struct shoal_comm *comm, int forced, int p)
{
    const shoal_peer_info_t *me = &comm->peers[comm->rank], *it = &comm->peers[p];
    if (forced >= 0) {
        return forced;
    }
    for (size_t i = 0; i < shoal_tl_count(); i++) {
        const shoal_tl_ops_t *ops = shoal_tl_get(i);
        if ((me->tl_mask & it->tl_mask & (1u << i)) == 0) {
            continue;
        }
        if (ops->intra_node_only && me->host_id != it->host_id) {
            continue;
        }
        return (int)i;
    }
    return -1;
}

static shoal_status_t shoal_comm_forced_tl(struct shoal_comm *comm, int *forced_p)
{
    const char *name = comm->cfg.transport != NULL ? comm->cfg.transport
                                                   : shoal_core_config.transport;
    *forced_p = -1;
    if (name == NULL || name[0] == '\0') {
        return SHOAL_OK;
    }
    for (size_t i = 0; i < shoal_tl_count(); i++) {
        if (strcmp(shoal_tl_get(i)->name, name) == 0) {
            *forced_p = (int)i;
            return SHOAL_OK;
        }
    }
    shoal_error(INIT, "%s=%s: no such transport in this build",
                comm->cfg.transport != NULL ? "shoal_config_t.transport" : "SHOAL_TRANSPORT",
                name);
    return SHOAL_ERR_INVALID_ARG;
}

/* Round 0 done: local ranks, and which transport each channel uses. */
static shoal_status_t shoal_comm_plan_channels(struct shoal_comm *comm, int *used)
{
    int forced;
    SHOAL_CHECK(shoal_comm_forced_tl(comm, &forced));
    comm->local_size = 0;
    for (int p = 0; p < comm->nranks; p++) {
        if (comm->peers[p].host_id == comm->peers[comm->rank].host_id) {
            if (p == comm->rank) {
                comm->local_rank = comm->local_size;
            }
            comm->local_ranks[comm->local_size++] = p;
        }
    }
    comm->all_local = comm->local_size == comm->nranks;
    for (int p = 0; p < comm->nranks; p++) {
        int t;
        if (p == comm->rank) {
            continue;
        }
        t = shoal_comm_pick_tl(comm, forced, p);
        if (t < 0 || (comm->peers[p].tl_mask & (1u << t)) == 0 ||
            (shoal_tl_get((size_t)t)->intra_node_only &&
             comm->peers[p].host_id != comm->peers[comm->rank].host_id)) {
            shoal_error(INIT, "no transport can reach peer %d (%s)%s%s", p, comm->peers[p].host,
                        forced >= 0 ? " with SHOAL_TRANSPORT=" : "",
                        forced >= 0 ? shoal_tl_get((size_t)forced)->name : "");
            return SHOAL_ERR_UNSUPPORTED;
        }
        comm->chans[p].tl = &comm->tls[t];
        used[t]++;
    }
    return SHOAL_OK;
}

/* SHOAL_CONNECT: lazy or eager channels. The same on every rank (same environment and
 * nranks); a transport that cannot connect lazily stays eager (both sides agree: the flag
 * follows the transport's caps, the same build everywhere). */
static void shoal_comm_plan_connect(struct shoal_comm *comm)
{
    int mode = shoal_core_config.connect, min = shoal_core_config.connect_lazy_ranks;
    comm->lazy = mode == SHOAL_CONNECT_LAZY ||
                 (mode == SHOAL_CONNECT_AUTO && min > 0 && comm->nranks >= min);
    if (comm->lazy && comm->rank == 0) {
        shoal_info(INIT, "comm of %d ranks: channels connect at first use (SHOAL_CONNECT=%s)",
                   comm->nranks, mode == SHOAL_CONNECT_LAZY ? "lazy" : "auto");
    }
}

/* The transport sizes: the lowest local rank's, so that the shm ring's agree on the host
 * (each rank derived its own; SHOAL_TUNE_MACHINE or a measurement may differ between
 * them). A rank whose own differ says so once. */
static void shoal_comm_plan_sizes(struct shoal_comm *comm)
{
    static int warned;
    const shoal_tl_sizes_t *mine = &comm->peers[comm->rank].tl_sizes;
    const shoal_tl_sizes_t *lead = &comm->peers[comm->local_ranks[0]].tl_sizes;

    comm->tl_sizes = *lead;
    if (memcmp(mine, lead, sizeof(*mine)) != 0 &&
        !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
        shoal_warn(INIT, "rank %d: transport sizes (shm slot %llu x %u, tcp split %llu, ucx "
                   "inline %u) differ from local rank 0's (rank %d: %llu x %u, %llu, %u): "
                   "every rank of the host uses local rank 0's", comm->rank,
                   (unsigned long long)mine->shm_slot_size, mine->shm_nslots,
                   (unsigned long long)mine->tcp_min_split, mine->ucx_inline_max,
                   comm->local_ranks[0], (unsigned long long)lead->shm_slot_size,
                   lead->shm_nslots, (unsigned long long)lead->tcp_min_split,
                   lead->ucx_inline_max);
    }
}

static shoal_status_t shoal_comm_init_tls(struct shoal_comm *comm, const int *used)
{
    shoal_tl_params_t params = {
        .rank = comm->rank, .nranks = comm->nranks,
        .local_rank = comm->local_rank, .local_size = comm->local_size,
        .comm_id = comm->comm_id, .secret = comm->secret,
        .timeout_ms = comm->timeout_ms, .abort_flag = &comm->aborted,
        .qos_valid = 1, .qos_priority = comm->qos.marks.priority, .qos_dscp = comm->qos.marks.dscp,
        .qos_ib_tc = comm->qos.marks.ib_tc, .qos_ib_sl = comm->qos.marks.ib_sl,
        .qos_rate_max = comm->qos.rate_max,
        .qos_class_name = shoal_qos_class_name(comm->qos.qos_class),
        .sizes = &comm->tl_sizes,
        .link_sizes = shoal_comm_assembly.link_sizes,
    };
    comm->ntls = (int)shoal_tl_count();
    for (int t = 0; t < comm->ntls; t++) {
        comm->tls[t].ops = shoal_tl_get((size_t)t);
        comm->tls[t].npeers = used[t];
        if (used[t] == 0) {
            continue;
        }
        params.lazy = comm->lazy && (comm->tls[t].ops->caps & SHOAL_TL_CAP_LAZY) != 0;
        comm->tls[t].lazy = params.lazy;
        shoal_status_t st = comm->tls[t].ops->init(&params, &comm->tls[t].ctx);
        if (st != SHOAL_OK) {
            shoal_error(INIT, "rank %d: transport %s failed to initialise: %s", comm->rank,
                        comm->tls[t].ops->name, shoal_strerror(st));
            return st;
        }
        if ((comm->tls[t].ops->caps & SHOAL_TL_CAP_SHARED_AREA) != 0) {
            comm->shm = &comm->tls[t];
        }
    }
    return SHOAL_OK;
}

/* Round 1: exchange addresses, then connect every transport to its peers. A rank's record
 * holds only the transports it initialised, each as u8 registry index | u8 0 | u16 length
 * (little endian) | address: a shm + tcp record is ~170 bytes where a fixed slot per
 * transport took 4 KiB, and the root sends every rank the whole table (n^2 records). */
static size_t shoal_comm_addr_record(struct shoal_comm *comm, uint8_t *rec, size_t cap,
                                     shoal_status_t *st_p)
{
    size_t off = 0;
    *st_p = SHOAL_OK;
    for (int t = 0; t < comm->ntls; t++) {
        size_t len = SHOAL_TL_ADDR_MAX;
        if (comm->tls[t].ctx == NULL) {
            continue;
        }
        if (cap - off < 4 + SHOAL_TL_ADDR_MAX) {
            *st_p = SHOAL_ERR_INTERNAL;
            return 0;
        }
        *st_p = comm->tls[t].ops->address(comm->tls[t].ctx, rec + off + 4, &len);
        if (*st_p != SHOAL_OK) {
            return 0;
        }
        rec[off] = (uint8_t)t;
        rec[off + 1] = 0;
        shoal_put_le(rec + off + 2, len, 2);
        off += 4 + len;
    }
    return off;
}

/* Transport t's address in a peer's record, or NULL (*len_p 0) if it published none. */
static const uint8_t *shoal_comm_addr_find(const uint8_t *rec, uint32_t reclen, int t,
                                           size_t *len_p)
{
    size_t off = 0;
    *len_p = 0;
    while (reclen - off >= 4) {
        size_t len = (size_t)shoal_get_le(rec + off + 2, 2);
        if (len > reclen - off - 4 || len > SHOAL_TL_ADDR_MAX) {
            return NULL;
        }
        if (rec[off] == t) {
            *len_p = len;
            return rec + off + 4;
        }
        off += 4 + len;
    }
    return NULL;
}

static shoal_status_t shoal_comm_connect(struct shoal_comm *comm, shoal_boot_t *boot)
{
    uint8_t mine[SHOAL_TL_MAX * (4 + SHOAL_TL_ADDR_MAX)], *table = NULL;
    const uint8_t **ents = malloc(sizeof(void *) * (size_t)comm->nranks);
    uint32_t *elens = malloc(sizeof(uint32_t) * (size_t)comm->nranks);
    int *peers = malloc(sizeof(int) * (size_t)comm->nranks);
    const void **addrs = malloc(sizeof(void *) * (size_t)comm->nranks);
    size_t *lens = malloc(sizeof(size_t) * (size_t)comm->nranks), mylen;
    shoal_ep_t **eps = malloc(sizeof(void *) * (size_t)comm->nranks);
    shoal_status_t st = SHOAL_ERR_NO_MEMORY;
    uint64_t t0 = shoal_time_ns(), t1 = 0;

    if (ents == NULL || elens == NULL || peers == NULL || addrs == NULL || lens == NULL ||
        eps == NULL) {
        goto out;
    }
    mylen = shoal_comm_addr_record(comm, mine, sizeof(mine), &st);
    if (st != SHOAL_OK) {
        goto out;
    }
    SHOAL_CHECK_GOTO(shoal_boot_allgatherv(boot, mine, mylen, &table, ents, elens), st, out);
    t1 = shoal_time_ns();
    for (int t = 0; t < comm->ntls; t++) {
        int n = 0;
        if (comm->tls[t].ctx == NULL) {
            continue;
        }
        for (int p = 0; p < comm->nranks; p++) {
            if (p != comm->rank && comm->chans[p].tl == &comm->tls[t]) {
                addrs[n] = shoal_comm_addr_find(ents[p], elens[p], t, &lens[n]);
                if (addrs[n] == NULL || lens[n] == 0) {
                    shoal_error(INIT, "peer %d (%s) published no %s address", p,
                                comm->peers[p].host, comm->tls[t].ops->name);
                    st = SHOAL_ERR_PROTOCOL;
                    goto out;
                }
                peers[n] = p;
                n++;
            }
        }
        st = comm->tls[t].ops->connect_all(comm->tls[t].ctx, peers, n, addrs, lens, eps);
        if (st != SHOAL_OK) {
            shoal_error(INIT, "rank %d: %s connections failed: %s", comm->rank,
                        comm->tls[t].ops->name, shoal_strerror(st));
            goto out;
        }
        for (int i = 0; i < n; i++) {
            comm->chans[peers[i]].ep = eps[i];
        }
    }
    shoal_info(INIT, "rank %d: addresses exchanged in %.1f ms, channels %s in %.1f ms",
               comm->rank, (double)(t1 - t0) / 1e6,
               comm->lazy ? "set up to connect at first use" : "connected",
               (double)(shoal_time_ns() - t1) / 1e6);
    st = SHOAL_OK;
out:
    free(table);
    free(ents);
    free(elens);
    free(peers);
    free(addrs);
    free(lens);
    free(eps);
    return st;
}

static shoal_status_t shoal_comm_bootstrap(struct shoal_comm *comm, const shoal_boot_uid_t *u)
{
    shoal_boot_t *boot = NULL;
    shoal_peer_info_t me;
    int used[SHOAL_TL_MAX] = {0}, ncpu, forced;
    shoal_status_t st;

    SHOAL_CHECK(shoal_comm_forced_tl(comm, &forced));
    SHOAL_CHECK(shoal_boot_connect(u, comm->rank, comm->nranks, comm->timeout_ms,
                                   comm->boot_abort, &boot));
    memset(&me, 0, sizeof(me));
    me.host_id = shoal_host_id();
    me.rank = comm->rank;
    me.pid = (int32_t)getpid();
    me.pid_ns = shoal_pid_ns();
    snprintf(me.host, sizeof(me.host), "%s", shoal_hostname());
    me.pinned_cpu = shoal_comm_pinned_cpu(&ncpu);
    /* UCX and verbs are queried (loaded) only when forced, or across hosts where sysfs has
     * an RDMA device and no transport before them was chosen (tl_registry.c) */
    me.tl_mask = shoal_tl_query_mask(forced);
    shoal_comm_plan_connect(comm);
    me.lazy = comm->lazy;
    shoal_comm_assembly.tl_sizes(&me.tl_sizes);
    SHOAL_CHECK_GOTO(shoal_boot_allgather(boot, &me, sizeof(me), comm->peers), st, out);
    for (int p = 0; p < comm->nranks; p++) {
        if (comm->peers[p].rank != p) {
            shoal_error(INIT, "bootstrap table entry %d claims rank %d", p, comm->peers[p].rank);
            st = SHOAL_ERR_PROTOCOL;
            goto out;
        }
        comm->peers[p].host[SHOAL_HOSTNAME_MAX - 1] = '\0';
    }
    SHOAL_CHECK_GOTO(shoal_comm_plan_channels(comm, used), st, out);
    shoal_comm_plan_sizes(comm);
    for (int p = 0; p < comm->nranks; p++) {
        if (comm->peers[p].lazy != me.lazy) {
            shoal_error(INIT, "rank %d connects channels %s, rank %d (%s) %s: SHOAL_CONNECT and "
                        "SHOAL_CONNECT_LAZY_RANKS must be the same on every rank", comm->rank,
                        me.lazy ? "at first use" : "at init", p, comm->peers[p].host,
                        comm->peers[p].lazy ? "at first use" : "at init");
            st = SHOAL_ERR_INVALID_ARG;
            goto out;
        }
    }
    SHOAL_CHECK_GOTO(shoal_comm_init_tls(comm, used), st, out);
    shoal_comm_plan_spinning(comm); /* after init: a transport's device may need our CPUs */
    SHOAL_CHECK_GOTO(shoal_comm_connect(comm, boot), st, out);
    /* Everyone connected (or, lazy, listening): transports may drop their names and
     * listeners where no connection is made later. */
    SHOAL_CHECK_GOTO(shoal_boot_barrier(boot), st, out);
    for (int t = 0; t < comm->ntls; t++) {
        if (comm->tls[t].ctx != NULL && comm->tls[t].ops->ready != NULL) {
            SHOAL_CHECK_GOTO(comm->tls[t].ops->ready(comm->tls[t].ctx), st, out);
        }
    }
    st = SHOAL_OK;
out:
    shoal_boot_close(boot);
    return st;
}

/* The communicator's key and id, from the job secret and the identity: key = kdf(secret,
 * "comm", identity | nranks), comm_id the start of another output (it reveals nothing and
 * differs between tenants, jobs, epochs and splits). A split child's job secret is itself
 * derived from its parent's key, the split's sequence number and the color, so the key of
 * every communicator on a path of splits is its own. */
static shoal_status_t shoal_comm_derive_keys(struct shoal_comm *comm, const uint8_t *secret)
{
    uint8_t ctx[SHOAL_TENANT_ID_ENC_MAX + 4], out[SHOAL_HMAC_BYTES] = {0};
    size_t n = shoal_tenant_id_encode(&comm->ident, ctx, sizeof(ctx));
    shoal_status_t st;

    shoal_put_le(ctx + n, (uint32_t)comm->nranks, 4);
    n += 4;
    st = shoal_kdf(secret, SHOAL_SECRET_BYTES, "comm", ctx, n, comm->secret);
    if (st == SHOAL_OK) {
        st = shoal_kdf(secret, SHOAL_SECRET_BYTES, "comm-id", ctx, n, out);
    }
    comm->comm_id = (uint32_t)shoal_get_le(out, 4);
    shoal_secret_wipe(out, sizeof(out));
    return st;
}

/* How long a communicator waits for the root this process runs, at a failed init or at
 * destroy: up to 1 s, less with a shorter timeout. Without a timeout (< 0) still 1 s: the
 * grace was min(-1, 1000), no end, and an init that failed here (a transport not in the
 * build) waited for ever for a root that waits for ever for the ranks still to come. */
static int shoal_comm_root_grace_ms(const struct shoal_comm *comm)
{
    return comm->timeout_ms < 0 ? 1000 : SHOAL_MIN(comm->timeout_ms, 1000);
}

/* u: where the root is, the job secret (used for the join, never kept) and the identity the
 * rank proves; id: the same identity in names; boot_abort: the abort flag the bootstrap
 * obeys instead of the new communicator's own, which nobody can set yet (a split's parent's),
 * or NULL (its own). */
static shoal_status_t shoal_comm_init_uid(shoal_comm_t *comm_p, int nranks, int rank,
                                          const shoal_boot_uid_t *u, const shoal_tenant_id_t *id,
                                          const shoal_tenant_cred_t *cred,
                                          const shoal_config_t *cfg,
                                          const volatile int *boot_abort)
{
    struct shoal_comm *comm = NULL;
    shoal_status_t st;

    SHOAL_CHECK(shoal_comm_alloc(nranks, rank, cfg, &comm));
    comm->boot_abort = boot_abort != NULL ? boot_abort : &comm->aborted;
    comm->ident = *id;
    comm->init_cred = cred; /* the caller's reading, for the meter's registration */
    /* First: a stop signal during a long bootstrap is then a request, not a death. */
    SHOAL_CHECK_GOTO(shoal_stop_comm_init(&comm->stop, id->tenant, id->job), st, err);
    SHOAL_CHECK_GOTO(shoal_qos_comm_init(comm), st, err);
    SHOAL_CHECK_GOTO(shoal_comm_derive_keys(comm, u->secret), st, err);
    shoal_boot_root_key(u, &comm->boot_root);
    shoal_boot_root_extend(&comm->boot_root, comm->timeout_ms);
    st = shoal_comm_bootstrap(comm, u);
    comm->boot_abort = &comm->aborted; /* a parent's flag is no longer needed (nor alive) */
    if (st != SHOAL_OK) {
        goto err;
    }
    SHOAL_CHECK_GOTO(shoal_comm_assembly.init(comm), st, err);
    /* After the topology's init traffic: the counters start at the first call. */
    SHOAL_CHECK_GOTO(shoal_meter_comm_init(comm), st, err);
    SHOAL_CHECK_GOTO(shoal_qos_pace_comm_init(comm), st, err); /* after the meter: its page */
    comm->init_cred = NULL;
    shoal_info(INIT, "rank %d of %d on %s: comm %08x ready (local rank %d of %d)", rank, nranks,
               shoal_hostname(), comm->comm_id, comm->local_rank, comm->local_size);
    *comm_p = comm;
    return SHOAL_OK;
err:
    comm->init_cred = NULL;
    if (comm->boot_root.len > 0) { /* a root here tells the job now, and the ranks that come
                                    * late (shoal_comm_init_failed's, before the grace) */
        shoal_boot_root_fail(&comm->boot_root);
        shoal_boot_root_wait(&comm->boot_root, shoal_comm_root_grace_ms(comm), 0);
        comm->boot_root.len = 0;
    }
    shoal_comm_destroy(comm);
    return st;
}

/* A unique id: this rank's configured identity must be the one the id was made for. */
static shoal_status_t shoal_comm_init_from_uid(shoal_comm_t *comm_p, int nranks, int rank,
                                               shoal_boot_uid_t *u, const shoal_config_t *cfg)
{
    shoal_tenant_id_t id;
    shoal_tenant_cred_t cred;
    shoal_boot_ident_t mine;
    char why[256];
    int found = 0;
    shoal_status_t st;

    /* One reading of the credential for the identity, the secret's binding and the meter:
     * a file the provider rewrote between them (a restart's new epoch) gave a rank a secret
     * bound to one and an identity or registration of the other. */
    memset(&cred, 0, sizeof(cred));
    SHOAL_CHECK_GOTO(shoal_tenant_cred_load(&cred, &found), st, out);
    SHOAL_CHECK_GOTO(shoal_tenant_id_resolve(cfg, found ? &cred : NULL, &id), st, out);
    SHOAL_CHECK_GOTO(shoal_boot_ident_make(&id, &mine), st, out);
    if (shoal_boot_ident_check(&u->ident, &mine, &id, why, sizeof(why)) != SHOAL_OK) {
        shoal_error(INIT, "rank %d of %d: %s", rank, nranks, why);
        st = SHOAL_ERR_PERMISSION;
        goto out;
    }
    SHOAL_CHECK_GOTO(shoal_tenant_secret_bind(found ? &cred : NULL, u->secret,
                                              sizeof(u->secret)), st, out);
    st = shoal_comm_init_uid(comm_p, nranks, rank, u, &id, found ? &cred : NULL, cfg, NULL);
out:
    shoal_secret_wipe(&cred, sizeof(cred));
    return st;
}

/* An init that failed before its rank joined leaves the others waiting for it until their
 * timeout (300 s by default), and the root, when this process runs it, serving nobody: the
 * root tells them at once instead (nothing when the root is elsewhere, or already over). */
static void shoal_comm_init_failed(const shoal_boot_uid_t *u, shoal_status_t st)
{
    if (st != SHOAL_OK) {
        shoal_boot_root_key_t k;
        shoal_boot_root_key(u, &k);
        shoal_boot_root_fail(&k);
    }
}

shoal_status_t shoal_comm_init(shoal_comm_t *comm_p, int nranks, int rank,
                               const shoal_uid_t *uid, const shoal_config_t *cfg)
{
    shoal_boot_uid_t u;
    shoal_status_t st;

    if (comm_p == NULL || uid == NULL) {
        shoal_error(INIT, "shoal_comm_init: %s is NULL", comm_p == NULL ? "comm_p" : "uid");
        return SHOAL_ERR_INVALID_ARG;
    }
    /* nranks past what a job may have said SHOAL_ERR_NO_MEMORY (its table), with no line */
    if (nranks <= 0 || nranks > SHOAL_BOOT_MAX_RANKS || rank < 0 || rank >= nranks) {
        shoal_error(INIT, "shoal_comm_init: rank %d of %d: nranks must be 1 to %d and the rank in "
                    "[0, nranks)", rank, nranks, SHOAL_BOOT_MAX_RANKS);
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_config_global_init();
    SHOAL_CHECK(shoal_boot_uid_decode(uid, &u));
    st = shoal_comm_init_from_uid(comm_p, nranks, rank, &u, cfg);
    shoal_comm_init_failed(&u, st);
    shoal_secret_wipe(&u, sizeof(u));
    return st;
}

/* SHOAL_ROOT=host:port and SHOAL_SECRET: rank 0 runs the root there, waiting as long as the
 * communicator's timeout (with SHOAL_TIMEOUT_MS's, a root of cfg.timeout_ms = 60 s gave up
 * after SHOAL_TIMEOUT_MS=3s on a rank that started 8 s late, failing every rank). */
static shoal_status_t shoal_comm_root_from_env(int rank, const shoal_tenant_id_t *id,
                                               const shoal_tenant_cred_t *cred, int timeout_ms,
                                               shoal_boot_uid_t *u)
{
    char host[256], port[8];
    uint16_t portnum;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
    int ret;

    if (shoal_boot_root_split(shoal_core_config.root, host, sizeof(host), &portnum) != SHOAL_OK) {
        shoal_error(INIT, "SHOAL_ROOT=%s is not host:port or [ipv6]:port (port 1..65535)",
                    shoal_core_config.root);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (shoal_core_config.secret == NULL ||
        shoal_boot_hex_decode(shoal_core_config.secret, u->secret, sizeof(u->secret)) !=
            SHOAL_OK) {
        shoal_error(INIT, "SHOAL_ROOT needs SHOAL_SECRET: exactly %d hex characters, the same on "
                    "every rank", 2 * SHOAL_SECRET_BYTES);
        return SHOAL_ERR_INVALID_ARG;
    }
    SHOAL_CHECK(shoal_tenant_secret_bind(cred, u->secret, sizeof(u->secret)));
    snprintf(port, sizeof(port), "%u", (unsigned)portnum);
    ret = getaddrinfo(host, port, &hints, &res);
    if (ret != 0 || res == NULL) {
        shoal_error(INIT, "SHOAL_ROOT=%s: cannot resolve: %s", shoal_core_config.root,
                    gai_strerror(ret));
        return SHOAL_ERR_INVALID_ARG;
    }
    memcpy(&u->root, res->ai_addr, res->ai_addrlen);
    u->root_len = res->ai_addrlen;
    freeaddrinfo(res);
    /* No id to carry the identity: every rank proves its own, the root holds rank 0's. */
    SHOAL_CHECK(shoal_boot_ident_make(id, &u->ident));
    if (rank == 0) {
        struct sockaddr_storage at = u->root;
        return shoal_boot_root_start(&at, u->root_len,
                                     shoal_core_config.boot_bind == SHOAL_BOOT_BIND_ANY,
                                     timeout_ms, u);
    }
    return SHOAL_OK;
}

/* Rank and size from the launcher when SHOAL_RANK and SHOAL_NRANKS are not both set. The one
 * of them that is set must agree with the launcher: `mpirun -x SHOAL_NRANKS=3 -np 2` asks for a
 * job of another size than the launcher started, and taking either value silently runs a job
 * the user did not ask for (or waits for a rank that never comes). */
static shoal_status_t shoal_comm_env_launcher(int *rank_p, int *nranks_p)
{
    int lrank = -1, lnranks = -1;
    const char *const *names = shoal_core_launcher_env(&lrank, &lnranks);

    if (names == NULL) {
        return SHOAL_OK; /* no launcher: the caller says what is missing */
    }
    if (lrank < 0) {
        return SHOAL_ERR_INVALID_ARG; /* not numbers: logged by shoal_core_launcher_env */
    }
    if (*rank_p >= 0 && *rank_p != lrank) {
        shoal_error(INIT, "shoal_comm_init_env: SHOAL_RANK=%d, but the launcher says %s=%d: "
                    "unset SHOAL_RANK, or set both SHOAL_RANK and SHOAL_NRANKS", *rank_p,
                    names[0], lrank);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (*nranks_p > 0 && *nranks_p != lnranks) {
        shoal_error(INIT, "shoal_comm_init_env: SHOAL_NRANKS=%d, but the launcher says %s=%d: "
                    "unset SHOAL_NRANKS, or start as many ranks as it says", *nranks_p,
                    names[1], lnranks);
        return SHOAL_ERR_INVALID_ARG;
    }
    *rank_p = lrank;
    *nranks_p = lnranks;
    return SHOAL_OK;
}

/* Why shoal_comm_init_env has no rank and size, naming the variable to fix: "no rank/size
 * (set SHOAL_RANK and SHOAL_NRANKS)" was said also where both were set (SHOAL_RANK=2
 * SHOAL_NRANKS=2), or where one was and the other missing or not a number, or where Slurm set
 * SLURM_PROCID but not SLURM_NTASKS. A launcher's values are checked where they are read. */
static void shoal_comm_env_no_rank(int rank, int nranks)
{
    const char *set, *unset;

    if (rank >= 0 && nranks > 0) {
        shoal_error(INIT, "shoal_comm_init_env: SHOAL_RANK=%d is not below SHOAL_NRANKS=%d "
                    "(every rank needs the job's size and a rank of its own, 0 to size - 1)",
                    rank, nranks);
    } else if (rank >= 0) {
        shoal_error(INIT, "shoal_comm_init_env: SHOAL_RANK=%d is set, but SHOAL_NRANKS is not (or "
                    "is not a count of 1 or more) and no launcher's variables give the size: "
                    "set both", rank);
    } else if (nranks > 0) {
        shoal_error(INIT, "shoal_comm_init_env: SHOAL_NRANKS=%d is set, but SHOAL_RANK is not (or "
                    "is not a rank of 0 or more) and no launcher's variables give the rank: set "
                    "both", nranks);
    } else if (shoal_core_launcher_partial(&set, &unset)) {
        shoal_error(INIT, "shoal_comm_init_env: %s is set but %s is not: no rank and size from "
                    "the launcher (set SHOAL_RANK and SHOAL_NRANKS, or both of those)", set,
                    unset);
    } else {
        shoal_error(INIT, "shoal_comm_init_env: no rank/size (set SHOAL_RANK and SHOAL_NRANKS, "
                    "or launch with shoalrun, mpirun or srun)");
    }
}

/* Not in shoal.h: for libshoal_mpi, which sees only exported symbols, so that its broadcast of
 * the unique id gives up when the join that follows it would (an MPI collective has no
 * deadline of its own: ranks waited forever for one that never called). */
SHOAL_EXPORT int shoal__comm_timeout_ms(const shoal_config_t *cfg);
SHOAL_EXPORT int shoal__comm_timeout_ms(const shoal_config_t *cfg)
{
    int ms;

    shoal_config_global_init();
    ms = cfg != NULL && (cfg->size == 0 || cfg->size > offsetof(shoal_config_t, timeout_ms)) &&
                 cfg->timeout_ms != 0
             ? cfg->timeout_ms
             : shoal_core_config.timeout_ms; /* as shoal_comm_alloc copies cfg */
    return ms < 0 ? -1 : ms;
}

shoal_status_t shoal_comm_init_env(shoal_comm_t *comm_p, const shoal_config_t *cfg)
{
    int rank, nranks;
    shoal_boot_uid_t u;
    shoal_status_t st;
#if SHOAL_HAVE_PMIX
    shoal_uid_t pmix_uid;
#endif

    if (comm_p == NULL) {
        shoal_error(INIT, "shoal_comm_init_env: comm_p is NULL");
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_config_global_init();
    rank = shoal_core_config.rank;
    nranks = shoal_core_config.nranks;
    /* Only -1 (the default) means "from the launcher": -5 or a count of 0 was read so too,
     * silently, and the launcher's values used instead of the user's mistake. */
    if (rank < -1 || nranks < -1 || nranks == 0) {
        shoal_error(INIT, "shoal_comm_init_env: %s (-1, the default, takes it from the launcher)",
                    rank < -1 ? "SHOAL_RANK is below 0" : "SHOAL_NRANKS is below 1");
        return SHOAL_ERR_INVALID_ARG;
    }
    if ((rank < 0 || nranks <= 0) && shoal_comm_env_launcher(&rank, &nranks) != SHOAL_OK) {
        return SHOAL_ERR_INVALID_ARG;
    }
    if (rank < 0 || nranks <= 0 || rank >= nranks) {
        shoal_comm_env_no_rank(rank, nranks);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (nranks > SHOAL_BOOT_MAX_RANKS) {
        shoal_error(INIT, "shoal_comm_init_env: rank %d of %d: a job has at most %d ranks", rank,
                    nranks, SHOAL_BOOT_MAX_RANKS);
        return SHOAL_ERR_INVALID_ARG;
    }
    memset(&u, 0, sizeof(u));
    if (shoal_core_config.uid != NULL && shoal_core_config.uid[0] != '\0') {
        shoal_uid_t uid;
        SHOAL_CHECK(shoal_boot_uid_from_hex(shoal_core_config.uid, &uid));
        st = shoal_boot_uid_decode(&uid, &u);
        shoal_secret_wipe(&uid, sizeof(uid));
        SHOAL_CHECK(st);
    } else if (shoal_core_config.root != NULL && shoal_core_config.root[0] != '\0') {
        shoal_tenant_id_t id;
        shoal_tenant_cred_t cred;
        int found = 0;
        memset(&cred, 0, sizeof(cred));
        st = shoal_tenant_cred_load(&cred, &found); /* once: see shoal_comm_init_from_uid */
        if (st == SHOAL_OK) {
            st = shoal_tenant_id_resolve(cfg, found ? &cred : NULL, &id);
        }
        if (st == SHOAL_OK) {
            st = shoal_comm_root_from_env(rank, &id, found ? &cred : NULL,
                                          shoal__comm_timeout_ms(cfg), &u);
            if (st == SHOAL_OK) {
                st = shoal_comm_init_uid(comm_p, nranks, rank, &u, &id, found ? &cred : NULL,
                                         cfg, NULL);
                shoal_comm_init_failed(&u, st);
            }
        }
        shoal_secret_wipe(&cred, sizeof(cred));
        shoal_secret_wipe(&u, sizeof(u));
        return st;
#if SHOAL_HAVE_PMIX
    } else if ((st = shoal_pmix_exchange_uid(rank, nranks, cfg, shoal__comm_timeout_ms(cfg),
                                             &pmix_uid)) != SHOAL_ERR_UNSUPPORTED) {
        /* PMIx launcher: rank 0's id, published through the PMIx server, under the
         * communicator's timeout (with SHOAL_TIMEOUT_MS's, cfg.timeout_ms = 3 s waited 300 s
         * in the fence for a rank that never called). */
        SHOAL_CHECK(st);
        st = shoal_boot_uid_decode(&pmix_uid, &u);
        shoal_secret_wipe(&pmix_uid, sizeof(pmix_uid));
        SHOAL_CHECK(st);
#endif
    } else {
        shoal_error(INIT, "shoal_comm_init_env: neither SHOAL_UID nor SHOAL_ROOT is set%s",
                    SHOAL_HAVE_PMIX ? ", and no PMIx server (mpirun, srun --mpi=pmix) answered"
                                    : "");
        return SHOAL_ERR_INVALID_ARG;
    }
    st = shoal_comm_init_from_uid(comm_p, nranks, rank, &u, cfg);
    shoal_comm_init_failed(&u, st);
    shoal_secret_wipe(&u, sizeof(u));
    return st;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

shoal_status_t shoal_comm_destroy(shoal_comm_t comm)
{
    if (comm == NULL) {
        shoal_error(CORE, "shoal_comm_destroy: NULL communicator");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (shoal_comm_forked(comm)) {
        return shoal_comm_forked_refuse(comm, "destroy"); /* its memory goes with the process */
    }
    shoal_proxy_stop(comm);
    shoal_comm_abort_fail(comm, 0); /* an abort the peers were not told of yet */
    if (comm->boot_root.len > 0) { /* its root, when this process runs it: its thread over */
        shoal_boot_root_wait(&comm->boot_root, shoal_comm_root_grace_ms(comm), 1);
    }
    shoal_qos_pace_comm_fini(comm);
    shoal_comm_assembly.fini(comm);
    for (int t = 0; t < comm->ntls; t++) {
        if (comm->tls[t].ctx != NULL) {
            comm->tls[t].ops->fini(comm->tls[t].ctx);
            comm->tls[t].ctx = NULL;
        }
    }
    /* Last: the communicator holds its resources (and the GPUs it bills) until its
     * transports are down; then state CLOSED, the agent told. */
    shoal_meter_comm_fini(comm);
    if (comm->abort_efd >= 0) {
        close(comm->abort_efd);
    }
    free((void *)comm->cfg.tenant);
    free((void *)comm->cfg.job_name);
    free((void *)comm->cfg.transport);
    free((void *)comm->cfg.algorithm);
    free(comm->peers);
    free(comm->chans);
    free(comm->local_ranks);
    shoal_secret_wipe(comm->secret, sizeof(comm->secret));
    pthread_mutex_destroy(&comm->err_lock);
    pthread_mutex_destroy(&comm->exec_lock);
    pthread_cond_destroy(&comm->exec_cond);
    pthread_mutex_destroy(&comm->proxy_lock);
    shoal_secret_wipe(comm->secret, sizeof(comm->secret));
    shoal_stop_comm_fini(&comm->stop); /* last: the handler outlives everything else */
    free(comm);
    return SHOAL_OK;
}

shoal_status_t shoal_comm_abort(shoal_comm_t comm)
{
    uint64_t one = 1;
    if (comm == NULL) {
        shoal_error(CORE, "shoal_comm_abort: NULL communicator");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (shoal_comm_forked(comm)) {
        return shoal_comm_forked_refuse(comm, "abort");
    }
    __atomic_store_n(&comm->aborted, 1, __ATOMIC_RELEASE);
    shoal_meter_count_abort(comm->meter);
    (void)!write(comm->abort_efd, &one, sizeof(one));
    if (comm->shm != NULL && comm->shm->ops->notify != NULL) {
        comm->shm->ops->notify(comm->shm->ctx, comm->local_rank);
    }
    pthread_mutex_lock(&comm->exec_lock);
    pthread_cond_broadcast(&comm->exec_cond);
    pthread_mutex_unlock(&comm->exec_lock);
    shoal_info(CORE, "rank %d: communicator %08x aborted by the application", comm->rank,
               comm->comm_id);
    shoal_comm_abort_fail(comm, 0); /* idle: the peers are told now */
    return SHOAL_OK;
}

shoal_status_t shoal_comm_rank(shoal_comm_t comm, int *rank_p)
{
    if (comm == NULL || rank_p == NULL) {
        shoal_error(CORE, "shoal_comm_rank: NULL %s", comm == NULL ? "communicator"
                                                                   : "rank pointer");
        return SHOAL_ERR_INVALID_ARG;
    }
    *rank_p = comm->rank;
    return SHOAL_OK;
}

shoal_status_t shoal_comm_size(shoal_comm_t comm, int *size_p)
{
    if (comm == NULL || size_p == NULL) {
        shoal_error(CORE, "shoal_comm_size: NULL %s", comm == NULL ? "communicator"
                                                                   : "size pointer");
        return SHOAL_ERR_INVALID_ARG;
    }
    *size_p = comm->nranks;
    return SHOAL_OK;
}

const char *shoal_comm_last_error(shoal_comm_t comm)
{
    if (comm == NULL) {
        return "invalid communicator (NULL)";
    }
    if (shoal_comm_fatal(comm) == SHOAL_OK) { /* acquire: the sentence is complete */
        if (shoal_comm_aborted(comm)) {
            return "communicator aborted by the application";
        }
        /* a dead peer that the call in flight is about to fail the communicator for */
        return shoal_comm_dead_peer(comm) >= 0 ? comm->dead_why : "no error";
    }
    return comm->last_error;
}

/* ---- asynchronous error ------------------------------------------------------------------ */

/* A local peer whose process is gone, or -1. Reads only what init wrote: any thread. */
static int shoal_comm_gone_local_peer(struct shoal_comm *comm)
{
    for (int l = 0; l < comm->local_size; l++) {
        int r = comm->local_ranks[l];
        if (r != comm->rank && shoal_comm_pid_ours(comm, r) &&
            !shoal_comm_pid_alive((pid_t)comm->peers[r].pid)) {
            return r;
        }
    }
    return -1;
}

/* The ticket holder's look at the peers of this host: first their processes (a dead one is
 * named as itself), then the shared-memory transport's check (also a peer that failed its
 * communicator, with the rank it blamed). Fails the communicator on the first failed one. */
static void shoal_comm_probe_local(struct shoal_comm *comm)
{
    int r = shoal_comm_gone_local_peer(comm);
    if (r >= 0) {
        (void)shoal_comm_set_failed(comm, SHOAL_ERR_PEER_FAILED, r,
                                    "peer %d (%s) died (its process is gone; seen while idle)",
                                    r, shoal_comm_peer_host(comm, r));
        return;
    }
    if (comm->shm == NULL || comm->shm->ops->peer_check == NULL) {
        return;
    }
    for (int l = 0; l < comm->local_size; l++) {
        int culprit = -1;
        char why[192];
        r = comm->local_ranks[l];
        why[0] = '\0';
        if (r != comm->rank &&
            comm->shm->ops->peer_check(comm->shm->ctx, l, why, sizeof(why), &culprit) !=
                SHOAL_OK) {
            (void)shoal_comm_set_failed(comm, SHOAL_ERR_PEER_FAILED,
                                        shoal_comm_culprit(comm, culprit, r),
                                        "peer %d (%s) failed (seen while idle): %s", r,
                                        shoal_comm_peer_host(comm, r), why);
            return;
        }
    }
}

shoal_status_t shoal_comm_get_async_error(shoal_comm_t comm, shoal_status_t *async_error)
{
    shoal_status_t st;
    uint64_t now, last;
    int r;

    if (comm == NULL || async_error == NULL) {
        shoal_error(CORE, "shoal_comm_get_async_error: NULL %s",
                    comm == NULL ? "communicator" : "status pointer");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (shoal_comm_forked(comm)) { /* as every call there (shoal.h); it answered SHOAL_OK */
        return shoal_comm_forked_refuse(comm, "ask after");
    }
    st = shoal_comm_check_usable(comm);
    now = shoal_time_ns();
    last = __atomic_load_n(&comm->async_probe_ns, __ATOMIC_RELAXED);
    if (st == SHOAL_OK && __atomic_load_n(&comm->dead_peer, __ATOMIC_ACQUIRE) != 0) {
        st = SHOAL_ERR_PEER_FAILED; /* found before: its driver has not failed comm yet */
    } else if (st == SHOAL_OK && comm->local_size > 1 && now - last >= SHOAL_ASYNC_PROBE_NS) {
        __atomic_store_n(&comm->async_probe_ns, now, __ATOMIC_RELAXED);
        if (shoal_comm_ticket_try(comm)) {
            /* Idle: nobody looks at the peers; look now, as the ticket's holder (the
             * transports have one driver at a time). */
            shoal_comm_probe_local(comm);
            shoal_comm_ticket_release(comm);
            st = shoal_comm_check_usable(comm);
        } else if ((r = shoal_comm_gone_local_peer(comm)) >= 0) {
            /* A call in flight drives the transports and sees the failures of the peers it
             * waits for; a peer it does not wait for may die unseen. Its driver fails the
             * communicator at its next idle step (woken as by an abort); the answer is the
             * status that failure gives. */
            uint64_t one = 1;
            int none = 0;
            if (__atomic_compare_exchange_n(&comm->dead_peer, &none, -1, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                snprintf(comm->dead_why, sizeof(comm->dead_why),
                         "rank %d (%s): peer %d (%s) died (its process is gone)", comm->rank,
                         shoal_hostname(), r, shoal_comm_peer_host(comm, r));
                __atomic_store_n(&comm->dead_peer, r + 1, __ATOMIC_RELEASE);
            }
            (void)!write(comm->abort_efd, &one, sizeof(one));
            if (comm->shm != NULL && comm->shm->ops->notify != NULL) {
                comm->shm->ops->notify(comm->shm->ctx, comm->local_rank);
            }
            st = SHOAL_ERR_PEER_FAILED;
        }
    }
    *async_error = st;
    return SHOAL_OK;
}

/* ---- split: (color, key) over the parent; the leader of each color runs the child's root ----
 * No secret travels: every rank derives the child's job secret from the parent's key, and only
 * the root's address goes over the parent's channels. */

typedef struct {
    uint16_t family;                    /* 0: the leader could not start the root */
    uint16_t port;                      /* network order; family 0: -(the leader's status) */
    uint8_t addr[16];
} shoal_split_addr_t;

/* kdf(parent key, "split", parent identity | parent comm id | sequence number | color). */
static shoal_status_t shoal_comm_split_secret(struct shoal_comm *comm, uint32_t seq, int color,
                                              uint8_t out[SHOAL_SECRET_BYTES])
{
    uint8_t ctx[SHOAL_TENANT_ID_ENC_MAX + 12];
    size_t n = shoal_tenant_id_encode(&comm->ident, ctx, sizeof(ctx));
    shoal_put_le(ctx + n, comm->comm_id, 4);
    shoal_put_le(ctx + n + 4, seq, 4);
    shoal_put_le(ctx + n + 8, (uint32_t)color, 4);
    return shoal_kdf(comm->secret, sizeof(comm->secret), "split", ctx, n + 12, out);
}

static void shoal_comm_split_addr_pack(const shoal_boot_uid_t *u, shoal_split_addr_t *a)
{
    memset(a, 0, sizeof(*a));
    a->family = u->root.ss_family;
    if (a->family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&u->root;
        a->port = s6->sin6_port;
        memcpy(a->addr, &s6->sin6_addr, 16);
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&u->root;
        a->port = s4->sin_port;
        memcpy(a->addr, &s4->sin_addr, 4);
    }
}

static shoal_status_t shoal_comm_split_addr_unpack(const shoal_split_addr_t *a, int leader,
                                                   shoal_boot_uid_t *u)
{
    memset(&u->root, 0, sizeof(u->root));
    if (a->family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&u->root;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = a->port;
        memcpy(&s6->sin6_addr, a->addr, 16);
        u->root_len = sizeof(*s6);
    } else if (a->family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&u->root;
        s4->sin_family = AF_INET;
        s4->sin_port = a->port;
        memcpy(&s4->sin_addr, a->addr, 4);
        u->root_len = sizeof(*s4);
    } else {
        /* The leader's own failure (out of memory or descriptors, a refused socket): the
         * parent is fine, and a member said SHOAL_ERR_PEER_FAILED, as if it was not. */
        shoal_status_t st = -(int)a->port;
        if (st != SHOAL_ERR_NO_MEMORY && st != SHOAL_ERR_SYSTEM && st != SHOAL_ERR_INTERNAL &&
            st != SHOAL_ERR_UNSUPPORTED) {
            st = SHOAL_ERR_PEER_FAILED;
        }
        shoal_error(INIT, "split: leader rank %d could not start the new communicator's root "
                    "(%s)", leader, shoal_status_name(st));
        return st;
    }
    return SHOAL_OK;
}

/* The split's messages travel on the parent's channels with core's own primitives
 * (shoal_chan_sendrecv: no layer above core is called), as one collective of the parent: its
 * sequence number, in its issue order (the caller holds a ticket). */

/* Every rank's (color, key) into all[2 * rank ..], around the ring of ranks. all == NULL (no
 * memory for it): the rank only passes mine and then each entry it receives on to the next
 * rank, through two pairs of its own, so that the others' ring completes. */
static shoal_status_t shoal_comm_split_gather(struct shoal_comm *comm, int64_t *all,
                                              const int64_t mine[2], uint32_t seq)
{
    int n = comm->nranks, r = comm->rank;
    int64_t relay[2][2] = {{mine[0], mine[1]}, {0, 0}};
    for (int j = 0; j < n - 1; j++) {
        int sb = (r - j + n) % n, rb = (r - j - 1 + 2 * n) % n;
        SHOAL_CHECK(shoal_chan_sendrecv(comm, (r + 1) % n,
                                        all != NULL ? &all[2 * sb] : relay[j & 1],
                                        (r + n - 1) % n,
                                        all != NULL ? &all[2 * rb] : relay[(j + 1) & 1],
                                        2 * sizeof(int64_t), seq, (uint32_t)j));
    }
    return SHOAL_OK;
}

/* The leader starts the child's root where its members can reach it (loopback when they all
 * share its host) and tells them where; the others learn it. */
static shoal_status_t shoal_comm_split_root(struct shoal_comm *comm, const int64_t *all,
                                            int color, int leader, shoal_boot_uid_t *u,
                                            uint32_t seq)
{
    shoal_split_addr_t a;
    shoal_status_t st = SHOAL_OK;
    uint32_t step = (uint32_t)comm->nranks;

    if (leader != comm->rank) {
        SHOAL_CHECK(shoal_chan_sendrecv(comm, -1, NULL, leader, &a, sizeof(a), seq, step));
        return shoal_comm_split_addr_unpack(&a, leader, u);
    }
    struct sockaddr_storage ss;
    socklen_t len;
    int any, local = 1;
    for (int p = 0; p < comm->nranks; p++) {
        local &= all[2 * p] != color || comm->peers[p].host_id == comm->peers[comm->rank].host_id;
    }
    st = shoal_boot_listen_addr(local, &ss, &len, &any);
    if (st == SHOAL_OK) {
        st = shoal_boot_root_start(&ss, len, any, comm->timeout_ms, u);
    }
    if (st == SHOAL_OK) {
        shoal_comm_split_addr_pack(u, &a);
    } else {
        memset(&a, 0, sizeof(a)); /* family 0: the members fail now, not at their timeout */
        a.port = (uint16_t)-(int)st;
    }
    for (int p = 0; p < comm->nranks; p++) {
        if (p == comm->rank || all[2 * p] != color) {
            continue;
        }
        shoal_status_t sst = shoal_chan_sendrecv(comm, p, &a, -1, NULL, sizeof(a), seq, step);
        if (sst != SHOAL_OK) {
            if (st == SHOAL_OK) {
                /* The members told so far join a root that would wait for the others until
                 * its timeout: it fails them at once instead. */
                shoal_boot_root_key_t k;
                shoal_boot_root_key(u, &k);
                shoal_boot_root_fail(&k);
            }
            return sst;
        }
    }
    return st;
}

/* The new communicator of a split: the parent's identity; the credential the process holds
 * now goes to the meter's registration (one that cannot be read: registered without it,
 * which the agent refuses for a tenant's page, as before). */
static shoal_status_t shoal_comm_split_init(struct shoal_comm *comm, shoal_comm_t *newcomm_p,
                                            int newsize, int newrank, const shoal_boot_uid_t *u)
{
    shoal_tenant_cred_t cred;
    int found = 0;
    shoal_status_t st;

    memset(&cred, 0, sizeof(cred));
    if (shoal_tenant_cred_load(&cred, &found) != SHOAL_OK) {
        shoal_warn(INIT, "split: the job credential could not be read: the new communicator "
                   "registers with the node agent without it");
        found = 0;
    }
    /* its bootstrap obeys the parent's abort: the caller's way out of a wait for a member
     * that never joins (its child init failed before it could) */
    st = shoal_comm_init_uid(newcomm_p, newsize, newrank, u, &comm->ident,
                             found ? &cred : NULL, &comm->cfg, &comm->aborted);
    shoal_secret_wipe(&cred, sizeof(cred));
    /* The leader's init that failed before its bootstrap (out of memory or descriptors) left
     * its root waiting for it, and the members there until their timeout: told now. */
    shoal_comm_init_failed(u, st);
    return st;
}

/* The colour a rank with a bad argument sends in the split's exchange (colours are ints), and
 * the one a rank without memory for the exchange's table sends. */
#define SHOAL_SPLIT_BAD INT64_MIN
#define SHOAL_SPLIT_NOMEM (INT64_MIN + 1)

shoal_status_t shoal_comm_split(shoal_comm_t comm, int color, int key, shoal_comm_t *newcomm_p)
{
    int64_t mine[2] = {color, key}, *all;
    int newrank = 0, newsize = 0, leader = -1, held = 0;
    uint32_t seq, cseq;
    uint64_t ticket;
    shoal_boot_uid_t u;
    shoal_status_t st;

    if (comm == NULL) {
        shoal_error(CORE, "shoal_comm_split: NULL communicator");
        if (newcomm_p != NULL) {
            *newcomm_p = NULL; /* as after every failure */
        }
        return SHOAL_ERR_INVALID_ARG;
    }
    /* NULL until a child is made: every failure (a failed or aborted parent, a peer gone
     * during the exchange) leaves no stale handle there that a cleanup would destroy. */
    if (newcomm_p != NULL) {
        *newcomm_p = NULL;
    }
    /* Before its ticket: in a process forked while a call of the parent's was in flight (a
     * proxy's request included), that call's ticket is never served here, and the wait for
     * its own went on forever. */
    if (shoal_comm_forked(comm)) {
        return shoal_comm_forked_refuse(comm, "split");
    }
    /* A rank's bad argument still takes part in the exchange, as a mark the others see: the
     * ranks that called with valid ones waited out their timeout for it before. */
    int bad = newcomm_p == NULL || (color < 0 && color != SHOAL_SPLIT_NOCOLOR);
    if (bad) {
        shoal_error(CORE, "shoal_comm_split: %s on rank %d: every rank of the communicator "
                    "fails this split", newcomm_p == NULL ? "no result pointer" :
                    "a negative colour other than SHOAL_SPLIT_NOCOLOR", comm->rank);
        mine[0] = SHOAL_SPLIT_BAD;
    }
    /* Without it the rank still takes part (a mark, as for a bad argument): it returned at
     * once, and the others waited out their timeout for it (forever without one), while its
     * split and sequence counters fell behind theirs. */
    all = malloc(sizeof(mine) * (size_t)comm->nranks);
    if (all == NULL) {
        shoal_error(CORE, "shoal_comm_split: no memory for the colours of %d ranks on rank %d: "
                    "every rank of the communicator fails this split", comm->nranks,
                    comm->rank);
        if (!bad) {
            mine[0] = SHOAL_SPLIT_NOMEM;
        }
    }
    memset(&u, 0, sizeof(u));
    seq = comm->split_seq++; /* every rank of the parent counts every split */
    ticket = shoal_comm_ticket_take(comm);
    st = shoal_comm_ticket_wait(comm, ticket);
    held = 1;
    if (st != SHOAL_OK) {
        goto out;
    }
    cseq = comm->seq++;
    if (all != NULL) {
        all[2 * comm->rank] = mine[0];
        all[2 * comm->rank + 1] = mine[1];
    }
    SHOAL_CHECK_GOTO(shoal_comm_split_gather(comm, all, mine, cseq), st, out);
    if (all == NULL) {
        st = SHOAL_ERR_NO_MEMORY;
        goto out;
    }
    for (int p = 0; p < comm->nranks; p++) {
        if (all[2 * p] == SHOAL_SPLIT_BAD) {
            if (!bad) {
                shoal_error(CORE, "shoal_comm_split: rank %d passed an invalid colour or no "
                            "result pointer (its log says which): this split fails", p);
            }
            st = SHOAL_ERR_INVALID_ARG;
            goto out;
        }
    }
    for (int p = 0; p < comm->nranks; p++) {
        if (all[2 * p] == SHOAL_SPLIT_NOMEM) {
            shoal_error(CORE, "shoal_comm_split: rank %d had no memory for the split (its log "
                        "says so): this split fails", p);
            st = SHOAL_ERR_NO_MEMORY;
            goto out;
        }
    }
    /* New rank: order by (key, parent rank) among ranks of my color. */
    for (int p = 0; p < comm->nranks; p++) {
        if (all[2 * p] != color) {
            continue;
        }
        newsize++;
        if (all[2 * p + 1] < key || (all[2 * p + 1] == key && p < comm->rank)) {
            newrank++;
        }
        if (leader < 0 || all[2 * p + 1] < all[2 * leader + 1]) {
            leader = p;
        }
    }
    if (color == SHOAL_SPLIT_NOCOLOR) {
        st = SHOAL_OK;
        goto out;
    }
    SHOAL_CHECK_GOTO(shoal_comm_split_secret(comm, seq, color, u.secret), st, out);
    SHOAL_CHECK_GOTO(shoal_boot_ident_make(&comm->ident, &u.ident), st, out);
    SHOAL_CHECK_GOTO(shoal_comm_split_root(comm, all, color, leader, &u, cseq), st, out);
    held = 0;
    shoal_comm_ticket_release(comm); /* the child's bootstrap does not hold the parent */
    st = shoal_comm_split_init(comm, newcomm_p, newsize, newrank, &u);
out:
    if (held) {
        shoal_comm_ticket_release(comm);
    }
    shoal_secret_wipe(&u, sizeof(u));
    free(all);
    return bad ? SHOAL_ERR_INVALID_ARG : st;
}
