/* Coordinated stop: the requests (async-signal-safe flags) and the agreement. See stop.h. */
#include "stop/stop.h"

#include "core/core.h"
#include "meter/meter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set from signal handlers: these must be plain lock-free atomics. */
_Static_assert(__atomic_always_lock_free(sizeof(int), 0), "int atomics must be lock-free");

/* The process was told to stop (shoal_request_stop, the SHOAL_STOP_SIGNALS handler): every
 * communicator of the process, present and future, contributes 1 to its agreements. */
static int shoal_stop_process_flag;
/* The signal that set it, 0 for a call (for the log line of the agreement). */
static int shoal_stop_process_signo;
/* An agreement of some communicator of the process said stop. */
static int shoal_stop_agreed_any;

void shoal_stop_request_process(int signo)
{
    /* The signal number first: whoever sees the flag (acquire) sees the number too. A call
     * (0) leaves a signal's number: it erased it, and with it the stop under way, so the last
     * destroy put SIG_DFL back and a repeated signal killed the exiting process. */
    if (signo != 0) {
        __atomic_store_n(&shoal_stop_process_signo, signo, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&shoal_stop_process_flag, 1, __ATOMIC_RELEASE);
}

int shoal_stop_under_way(void)
{
    return __atomic_load_n(&shoal_stop_agreed_any, __ATOMIC_ACQUIRE) ||
           (__atomic_load_n(&shoal_stop_process_flag, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&shoal_stop_process_signo, __ATOMIC_RELAXED) != 0);
}

shoal_status_t shoal_request_stop(void)
{
    shoal_stop_request_process(0);
    return SHOAL_OK;
}

shoal_status_t shoal_comm_request_stop(shoal_comm_t comm)
{
    /* In a process forked from comm's, as every call on comm: the flag would be the child's
     * own copy, which no agreement of the parent reads (a worker's request accepted and
     * lost). Not logged: this may run in a signal handler. */
    if (comm == NULL || shoal_comm_forked(comm)) {
        return SHOAL_ERR_INVALID_ARG;
    }
    __atomic_store_n(&comm->stop.requested, 1, __ATOMIC_RELEASE);
    return SHOAL_OK;
}

shoal_status_t shoal_stop_comm_init(shoal_stop_comm_t *stop, const char *tenant,
                                    const char *job)
{
    const char *pattern = shoal_stop_config.file;
    char path[4096], why[160];

    if (pattern != NULL && pattern[0] != '\0') {
        if (shoal_provider_path_expand(pattern, tenant, job, path, sizeof(path), why,
                                       sizeof(why)) != SHOAL_OK) {
            shoal_error(SCHED, "SHOAL_STOP_FILE=%s: %s", pattern, why);
            return SHOAL_ERR_INVALID_ARG;
        }
        stop->file = strdup(path);
        if (stop->file == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
    }
    return shoal_stop_sig_ref(stop);
}

void shoal_stop_comm_fini(shoal_stop_comm_t *stop)
{
    shoal_stop_sig_unref(stop);
    free(stop->file);
    stop->file = NULL;
}

/* The stop file exists: a request for this communicator, kept (sticky) like any other. A
 * file that another tenant's job could have put there (shoal_provider_file_untrusted; a
 * symbolic link, which anyone may point anywhere) is not obeyed: it would stop this job. */
static int shoal_stop_file_seen(shoal_stop_comm_t *stop)
{
    struct stat sb;
    if (stop->file == NULL || lstat(stop->file, &sb) != 0) {
        return 0;
    }
    const char *why = S_ISLNK(sb.st_mode) ? "it is a symbolic link"
                                          : shoal_provider_file_untrusted(stop->file, &sb);
    if (why != NULL) {
        /* an exchange: two threads that check at once warn once, without a data race */
        if (__atomic_exchange_n(&stop->refused_ino, (uint64_t)sb.st_ino, __ATOMIC_RELAXED) !=
            (uint64_t)sb.st_ino) {
            shoal_warn(SCHED, "stop file %s ignored: %s (owner uid %u, mode %04o)", stop->file,
                       why, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777));
        }
        return 0;
    }
    __atomic_store_n(&stop->requested, 1, __ATOMIC_RELEASE);
    return 1;
}

/* Why this rank asks to stop, for the log: "a signal (SIGUSR1)", "a call", "" (it does not). */
static const char *shoal_stop_why(int comm_req, int proc_req, char *buf, size_t len,
                                  char *name, size_t namelen)
{
    int signo = __atomic_load_n(&shoal_stop_process_signo, __ATOMIC_RELAXED);
    if (proc_req && signo > 0) {
        snprintf(buf, len, "signal %d (SIG%s)", signo,
                 shoal_stop_signal_name(signo, name, namelen));
    } else if (proc_req) {
        snprintf(buf, len, "shoal_request_stop");
    } else if (comm_req == 2) {
        snprintf(buf, len, "the stop file");
    } else if (comm_req) {
        snprintf(buf, len, "shoal_comm_request_stop");
    } else {
        snprintf(buf, len, "no request here");
    }
    return buf;
}

shoal_status_t shoal_comm_should_stop(shoal_comm_t comm, int *stop_p)
{
    int32_t mine, all = 0;
    int comm_req, proc_req;
    uint32_t checks;
    shoal_status_t st;
    char why[64], name[16];

    if (comm == NULL) {
        return SHOAL_ERR_INVALID_ARG;
    }
    st = stop_p == NULL ? SHOAL_ERR_INVALID_ARG : shoal_comm_check_usable(comm);
    if (st != SHOAL_OK) {
        /* refused before it ran: counted in errors, as a refused collective is (not in a
         * forked child, whose meter page is its parent's) */
        if (!shoal_comm_forked(comm)) {
            shoal_meter_count_refused(comm->meter);
        }
        return st;
    }
    /* Every rank set agreed at the same call: every rank answers here from now on, and no
     * rank waits for an agreement the others skip. */
    if (__atomic_load_n(&comm->stop.agreed, __ATOMIC_ACQUIRE)) {
        *stop_p = 1;
        return SHOAL_OK;
    }
    /* Read once: a request from now on belongs to the next call. */
    comm_req = __atomic_load_n(&comm->stop.requested, __ATOMIC_ACQUIRE);
    proc_req = __atomic_load_n(&shoal_stop_process_flag, __ATOMIC_ACQUIRE);
    if (!comm_req && !proc_req && shoal_stop_file_seen(&comm->stop)) {
        comm_req = 2;
    }
    mine = comm_req || proc_req;
    st = shoal_allreduce(&mine, &all, 1, SHOAL_INT32, SHOAL_MAX, comm, NULL);
    if (st != SHOAL_OK) {
        return st; /* logged where it was found; shoal_comm_last_error names the rank */
    }
    checks = __atomic_add_fetch(&comm->stop.checks, 1, __ATOMIC_RELAXED);
    if (all != 0) {
        __atomic_store_n(&comm->stop.agreed, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&shoal_stop_agreed_any, 1, __ATOMIC_RELEASE);
        shoal_info(SCHED, "rank %d: communicator %08x: every rank agreed to stop at check %u "
                   "(this rank: %s)", comm->rank, comm->comm_id, checks,
                   shoal_stop_why(comm_req, proc_req, why, sizeof(why), name, sizeof(name)));
    }
    *stop_p = all != 0;
    return SHOAL_OK;
}
