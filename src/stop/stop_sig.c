/* The optional stop handler (SHOAL_STOP_SIGNALS). The library changes no signal disposition
 * unless this variable names signals: then the first communicator installs one handler for
 * them (sigaction, SA_SIGINFO | SA_RESTART, the application's actions saved) and the last one
 * destroyed puts the saved actions back, unless the application replaced the handler since,
 * or unless a stop is under way (a stop signal came, or an agreement said stop: the process is
 * exiting, and a late signal must not kill it, so the handler stays).
 * The handler only sets the process-wide request flag (one atomic store) and then calls the
 * application's own handler if the saved action was one (a function, not SIG_DFL/SIG_IGN;
 * once only when it was SA_RESETHAND). In a child forked without exec, which has no
 * communicator to stop, it gives the signal the application's action instead
 * (shoal_stop_sig_forked):
 * SIGTERM's default action (death) is what the handler exists to replace. */
#include "stop/stop.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define SHOAL_STOP_SIG_MAX 64 /* signals 1..64 fit the mask (bit s - 1) */
#define SHOAL_STOP_SIG_BIT(s) (UINT64_C(1) << ((s) - 1))

/* The signals a job may be told to stop with (besides the real-time ones). KILL and STOP
 * cannot be caught; fault signals (SEGV, BUS, FPE, ILL, ABRT, TRAP, SYS) and job-control or
 * I/O signals (CHLD, CONT, TSTP, TTIN, TTOU, PIPE, URG, WINCH, IO, PROF, VTALRM) mean
 * something else. */
static const struct {
    const char *name;
    int signo;
} shoal_stop_sig_names[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"ALRM", SIGALRM}, {"TERM", SIGTERM},
    {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"XCPU", SIGXCPU}, {"PWR", SIGPWR},
};

static pthread_mutex_t shoal_stop_sig_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t shoal_stop_sig_fork_once = PTHREAD_ONCE_INIT;
static int shoal_stop_sig_users;     /* communicators holding a reference (under the lock) */
static uint64_t shoal_stop_sig_mask; /* installed now (atomic; written under the lock) */
/* The application's actions, by signal: written by sigaction before the handler can run for
 * that signal, read by the handler, never changed while it is installed. */
static struct sigaction shoal_stop_sig_old[SHOAL_STOP_SIG_MAX + 1];
/* By signal: its saved action is one-shot (SA_RESETHAND) and the handler has called it (atomic;
 * cleared when an action is saved). */
static int shoal_stop_sig_fired[SHOAL_STOP_SIG_MAX + 1];
/* The process the handler serves (atomic): the one that installed it, or a forked child that
 * made a communicator of its own since (shoal_stop_sig_ref). */
static pid_t shoal_stop_sig_pid;

const char *shoal_stop_signal_name(int signo, char *buf, size_t len)
{
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_stop_sig_names); i++) {
        if (shoal_stop_sig_names[i].signo == signo) {
            snprintf(buf, len, "%s", shoal_stop_sig_names[i].name);
            return buf;
        }
    }
    if (signo >= SIGRTMIN && signo <= SIGRTMAX) {
        snprintf(buf, len, "RTMIN+%d", signo - SIGRTMIN);
    } else {
        snprintf(buf, len, "%d", signo);
    }
    return buf;
}

/* One entry of the list: a name (SIG prefix optional), RTMIN+n / RTMAX-n, or a number. */
static int shoal_stop_signal_lookup(const char *tok)
{
    char *end;
    long n;

    if (strncasecmp(tok, "SIG", 3) == 0) {
        tok += 3;
    }
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_stop_sig_names); i++) {
        if (strcasecmp(tok, shoal_stop_sig_names[i].name) == 0) {
            return shoal_stop_sig_names[i].signo;
        }
    }
    if (strncasecmp(tok, "RTMIN", 5) == 0 || strncasecmp(tok, "RTMAX", 5) == 0) {
        int base = toupper((unsigned char)tok[3]) == 'I' ? SIGRTMIN : SIGRTMAX;
        if (tok[5] == '\0') {
            return base;
        }
        if ((tok[5] != '+' && tok[5] != '-') || !isdigit((unsigned char)tok[6])) {
            return -1;
        }
        n = strtol(tok + 6, &end, 10);
        if (*end != '\0' || n > SIGRTMAX - SIGRTMIN) {
            return -1;
        }
        n = tok[5] == '+' ? base + n : base - n;
        return n >= SIGRTMIN && n <= SIGRTMAX ? (int)n : -1;
    }
    if (!isdigit((unsigned char)tok[0])) {
        return -1;
    }
    n = strtol(tok, &end, 10);
    if (*end != '\0' || n <= 0 || n > SHOAL_STOP_SIG_MAX) {
        return -1;
    }
    if (n >= SIGRTMIN && n <= SIGRTMAX) {
        return (int)n;
    }
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(shoal_stop_sig_names); i++) {
        if (shoal_stop_sig_names[i].signo == n) {
            return (int)n;
        }
    }
    return -1;
}

shoal_status_t shoal_stop_signals_parse(const char *spec, uint64_t *mask_p, char *why,
                                        size_t whylen)
{
    uint64_t mask = 0;
    const char *p = spec == NULL ? "" : spec;

    while (*p != '\0') {
        char tok[32];
        size_t len = strcspn(p, ", \t");
        int signo;

        if (len == 0) {
            p++;
            continue;
        }
        if (len >= sizeof(tok)) {
            snprintf(why, whylen, "SHOAL_STOP_SIGNALS: entry '%.*s...' is too long", 16, p);
            return SHOAL_ERR_INVALID_ARG;
        }
        memcpy(tok, p, len);
        tok[len] = '\0';
        p += len;
        signo = shoal_stop_signal_lookup(tok);
        if (signo <= 0 || signo > SHOAL_STOP_SIG_MAX) {
            snprintf(why, whylen, "SHOAL_STOP_SIGNALS: '%s' is not a signal a job can be told "
                     "to stop with (HUP INT QUIT ALRM TERM USR1 USR2 XCPU PWR RTMIN+n, or "
                     "their numbers)", tok);
            return SHOAL_ERR_INVALID_ARG;
        }
        mask |= SHOAL_STOP_SIG_BIT(signo);
    }
    *mask_p = mask;
    return SHOAL_OK;
}

uint64_t shoal_stop_signals_installed(void)
{
    return __atomic_load_n(&shoal_stop_sig_mask, __ATOMIC_ACQUIRE);
}

/* The saved action is a function to chain to. SIG_DFL and SIG_IGN are none whatever the
 * flags: an action set to SIG_IGN with SA_SIGINFO in its flags (code that always sets that
 * flag) reads back with SA_SIGINFO and sa_sigaction (void *)1, which the handler called, a
 * SIGSEGV at the first stop signal. sa_handler and sa_sigaction share their storage. */
static int shoal_stop_sig_is_func(const struct sigaction *sa)
{
    return sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN;
}

static void shoal_stop_sig_chain(const struct sigaction *old, int signo, siginfo_t *si,
                                 void *uc)
{
    if ((old->sa_flags & SA_SIGINFO) != 0) {
        old->sa_sigaction(signo, si, uc);
    } else {
        old->sa_handler(signo);
    }
}

/* The handler in a child forked (without exec) from the process it serves: the child has no
 * communicator to stop (a Python multiprocessing or DataLoader worker), so the signal gets the
 * application's own action, as if the library had not been asked: that action back for good
 * (sigaction is async-signal-safe), then this signal given to it. A worker its parent
 * terminated with SIGTERM kept running: the handler only set a flag nobody would read. */
static void shoal_stop_sig_forked(int signo, siginfo_t *si, void *uc)
{
    const struct sigaction *old = &shoal_stop_sig_old[signo];
    struct sigaction act = *old;
    int call = shoal_stop_sig_is_func(old);

    if (call && (old->sa_flags & SA_RESETHAND) != 0) {
        /* one-shot: SIG_DFL from now on, as the kernel leaves it; called if it never ran */
        call = __atomic_exchange_n(&shoal_stop_sig_fired[signo], 1, __ATOMIC_ACQ_REL) == 0;
        act.sa_handler = SIG_DFL;
        act.sa_flags = 0;
    }
    sigaction(signo, &act, NULL);
    if (call) {
        shoal_stop_sig_chain(old, signo, si, uc);
    } else if (act.sa_handler == SIG_DFL) {
        raise(signo); /* blocked while this handler runs: the default action at its return */
    }
}

/* Async-signal-safe: a getpid, one atomic store, then the application's handler, errno
 * preserved. */
static void shoal_stop_sig_handler(int signo, siginfo_t *si, void *uc)
{
    int saved_errno = errno;
    const struct sigaction *old;

    if (signo > 0 && signo <= SHOAL_STOP_SIG_MAX &&
        getpid() != __atomic_load_n(&shoal_stop_sig_pid, __ATOMIC_RELAXED)) {
        shoal_stop_sig_forked(signo, si, uc);
        errno = saved_errno;
        return;
    }
    shoal_stop_request_process(signo);
    if (signo > 0 && signo <= SHOAL_STOP_SIG_MAX) {
        old = &shoal_stop_sig_old[signo];
        /* A one-shot action (SA_RESETHAND) runs once, as without us: the kernel would have
         * reset it to SIG_DFL, which is what this handler replaces (a later signal only
         * requests the stop). It ran at every signal, which its code did not expect. */
        if (shoal_stop_sig_is_func(old) &&
            ((old->sa_flags & SA_RESETHAND) == 0 ||
             __atomic_exchange_n(&shoal_stop_sig_fired[signo], 1, __ATOMIC_ACQ_REL) == 0)) {
            shoal_stop_sig_chain(old, signo, si, uc);
        }
    }
    errno = saved_errno;
}

/* Under the lock. Puts back the saved action of every signal in mask whose handler is still
 * ours; one the application replaced since is its own now and stays. */
static void shoal_stop_sig_restore(uint64_t mask)
{
    char name[16];
    for (int s = 1; s <= SHOAL_STOP_SIG_MAX; s++) {
        struct sigaction cur;
        if ((mask & SHOAL_STOP_SIG_BIT(s)) == 0) {
            continue;
        }
        if (sigaction(s, NULL, &cur) != 0) {
            continue;
        }
        if ((cur.sa_flags & SA_SIGINFO) == 0 || cur.sa_sigaction != shoal_stop_sig_handler) {
            shoal_info(SCHED, "SIG%s: the application replaced the stop handler; left as it is",
                       shoal_stop_signal_name(s, name, sizeof(name)));
            continue;
        }
        if (sigaction(s, &shoal_stop_sig_old[s], NULL) != 0) {
            shoal_warn(SCHED, "sigaction(SIG%s) restoring the application's action failed: %s",
                       shoal_stop_signal_name(s, name, sizeof(name)), strerror(errno));
        }
    }
    __atomic_store_n(&shoal_stop_sig_mask, 0, __ATOMIC_RELEASE);
}

/* Under the lock. */
static shoal_status_t shoal_stop_sig_install(uint64_t mask)
{
    struct sigaction act;
    uint64_t done = 0;
    char name[16];

    __atomic_store_n(&shoal_stop_sig_pid, getpid(), __ATOMIC_RELAXED);
    for (int s = 1; s <= SHOAL_STOP_SIG_MAX; s++) {
        struct sigaction cur, old, prev;
        if ((mask & SHOAL_STOP_SIG_BIT(s)) == 0) {
            continue;
        }
        memset(&act, 0, sizeof(act));
        act.sa_sigaction = shoal_stop_sig_handler;
        act.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&act.sa_mask);
        /* The application's action is saved before ours is in place: sigaction(s, &act,
         * &saved) copies the old action out only after the new one is installed, and a
         * signal in between found the slot empty (the application's handler not called). */
        if (sigaction(s, NULL, &cur) != 0) {
            shoal_error(SCHED, "sigaction(SIG%s) reading the application's action failed: %s",
                        shoal_stop_signal_name(s, name, sizeof(name)), strerror(errno));
            shoal_stop_sig_restore(done);
            return SHOAL_ERR_SYSTEM;
        }
        if ((cur.sa_flags & SA_SIGINFO) != 0 && cur.sa_sigaction == shoal_stop_sig_handler) {
            /* Ours, with no communicator: the application replaced it while one lived (so the
             * last destroy left its action alone) and then put back the action that call
             * returned, ours. Saved as the application's, the handler called itself at the
             * next signal until the stack overflowed. The application's action saved at the
             * earlier install is still the one to chain (and whether a one-shot one ran,
             * shoal_stop_sig_fired, still holds: a forked child's first communicator finds
             * the handler it inherited so). */
            old = shoal_stop_sig_old[s];
        } else {
            old = cur;
            shoal_stop_sig_old[s] = old;
            __atomic_store_n(&shoal_stop_sig_fired[s], 0, __ATOMIC_RELAXED);
        }
        if (shoal_stop_sig_is_func(&old)) {
            /* The application's handler runs inside ours: with its own flags (no SA_RESTART
             * of ours where it wants its system calls interrupted, its SA_ONSTACK and
             * SA_NODEFER) and its mask. SA_RESETHAND is not carried over: ours stays, and
             * calls such an action once (shoal_stop_sig_fired). */
            act.sa_flags = SA_SIGINFO | (old.sa_flags & (SA_RESTART | SA_ONSTACK | SA_NODEFER));
            act.sa_mask = old.sa_mask;
        }
        if (sigaction(s, &act, &prev) != 0) {
            shoal_error(SCHED, "sigaction(SIG%s) installing the stop handler failed: %s",
                        shoal_stop_signal_name(s, name, sizeof(name)), strerror(errno));
            shoal_stop_sig_restore(done);
            return SHOAL_ERR_SYSTEM;
        }
        if (prev.sa_sigaction != cur.sa_sigaction || prev.sa_flags != cur.sa_flags) {
            /* another thread of the application set its action between the two calls: that
             * one is the application's (the window of a signal reading the older is its own
             * race, as it would be without us) */
            shoal_stop_sig_old[s] = prev;
            __atomic_store_n(&shoal_stop_sig_fired[s], 0, __ATOMIC_RELAXED);
        }
        done |= SHOAL_STOP_SIG_BIT(s);
        __atomic_store_n(&shoal_stop_sig_mask, done, __ATOMIC_RELEASE);
    }
    shoal_info(SCHED, "stop handler installed for SHOAL_STOP_SIGNALS=%s",
               shoal_stop_config.signals);
    return SHOAL_OK;
}

/* fork() waits for the lock and the child gets it free, with the state it guards whole: a
 * child forked while another thread held it (installing the handler for a communicator, or
 * removing it at a destroy) got it held by a thread it does not have, and its first
 * communicator's init or destroy waited for it forever. */
static void shoal_stop_sig_fork_prepare(void)
{
    pthread_mutex_lock(&shoal_stop_sig_lock);
}

static void shoal_stop_sig_fork_release(void)
{
    pthread_mutex_unlock(&shoal_stop_sig_lock);
}

static void shoal_stop_sig_fork_register(void)
{
    if (pthread_atfork(shoal_stop_sig_fork_prepare, shoal_stop_sig_fork_release,
                       shoal_stop_sig_fork_release) != 0) {
        shoal_warn(SCHED, "pthread_atfork failed: a process forked while a communicator is "
                   "made or destroyed may hang at its own first one");
    }
}

shoal_status_t shoal_stop_sig_ref(shoal_stop_comm_t *stop)
{
    shoal_status_t st = SHOAL_OK;
    uint64_t mask;
    char why[256];

    if (shoal_stop_config.signals == NULL || shoal_stop_config.signals[0] == '\0') {
        return SHOAL_OK;
    }
    if (shoal_stop_signals_parse(shoal_stop_config.signals, &mask, why, sizeof(why)) !=
        SHOAL_OK) {
        shoal_error(SCHED, "%s", why);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (mask == 0) {
        return SHOAL_OK;
    }
    /* Before the lock's first use: every fork from then on is covered (unref takes it only
     * after a ref did). */
    pthread_once(&shoal_stop_sig_fork_once, shoal_stop_sig_fork_register);
    pthread_mutex_lock(&shoal_stop_sig_lock);
    /* Not when it stayed in place after a stop signal (see shoal_stop_sig_unref): saving our
     * own handler as the application's would make it call itself. */
    if (__atomic_load_n(&shoal_stop_sig_mask, __ATOMIC_RELAXED) == 0) {
        st = shoal_stop_sig_install(mask);
    } else if (getpid() != __atomic_load_n(&shoal_stop_sig_pid, __ATOMIC_RELAXED)) {
        /* A forked child's own communicator: the handler it inherited serves it now. The
         * references it inherited are the parent's communicators, which the child cannot
         * destroy: counted, they kept the handler after the child's last destroy, and a
         * SIGTERM to the child only set a flag nobody would read. Its count starts here, and
         * so does its handler, installed as for a first communicator (which also takes the
         * process): a stop signal that came before gave the application's action back for
         * good (shoal_stop_sig_forked), and taken as still in place, the handler was missing
         * for this communicator (the signal never asked it to stop). */
        shoal_stop_sig_users = 0;
        st = shoal_stop_sig_install(mask);
    }
    if (st == SHOAL_OK) {
        shoal_stop_sig_users++;
        stop->sig_user = 1;
    }
    pthread_mutex_unlock(&shoal_stop_sig_lock);
    return st;
}

void shoal_stop_sig_unref(shoal_stop_comm_t *stop)
{
    if (!stop->sig_user) {
        return;
    }
    pthread_mutex_lock(&shoal_stop_sig_lock);
    stop->sig_user = 0;
    if (--shoal_stop_sig_users == 0) {
        if (shoal_stop_under_way()) {
            /* The process is on its way out (a stop signal came, or the ranks agreed to stop
             * because another rank got one): a late or repeated signal (a launcher that
             * forwards it to the ranks one by one, a second SIGTERM) must not kill it with the
             * default action while it saves and exits. The handler only sets a flag and calls
             * the application's, so it may stay. */
            shoal_info(SCHED, "stop handler kept: a stop is under way, and a late signal must "
                       "not kill the process while it exits");
        } else {
            shoal_stop_sig_restore(__atomic_load_n(&shoal_stop_sig_mask, __ATOMIC_RELAXED));
            shoal_info(SCHED, "stop handler removed: the application's actions are back");
        }
    }
    pthread_mutex_unlock(&shoal_stop_sig_lock);
}
