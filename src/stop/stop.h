/* Coordinated stop (DESIGN.md section 7, issue 13): a preempted job stops on every rank at the
 * same step, so that its checkpoint is one consistent state.
 *
 *  - A request is a flag: one per communicator (shoal_comm_request_stop) and one for the
 *    process (shoal_request_stop, and the handler SHOAL_STOP_SIGNALS installs). Setting it is
 *    one lock-free atomic store, so it is async-signal-safe; it is sticky.
 *  - shoal_comm_should_stop is the agreement: an AllReduce MAX of each rank's flag, read once
 *    when the call starts, over the communicator (its timeout and failure detection apply). The
 *    agreement's result, never the local flag, is the answer: every rank gets the same one for
 *    the same call; a request arriving during the agreement is seen by the next call.
 *  - The stop file (SHOAL_STOP_FILE): a path whose existence is a request, looked at by each
 *    agreement until there is one (one lstat() call), for a node agent or a preStop hook.
 *  - The optional handler (stop_sig.c): installed only when SHOAL_STOP_SIGNALS names signals,
 *    with sigaction at the first communicator's init, the application's action saved (and
 *    chained when it was a function), restored when the last communicator is destroyed (kept
 *    once a stop is under way: a late signal must not kill the exiting process).
 *
 * The core's narrow hook: the per-communicator state below lives in struct shoal_comm (stop),
 * and comm.c calls shoal_stop_comm_init / shoal_stop_comm_fini.
 */
#ifndef SHOAL_STOP_H
#define SHOAL_STOP_H

#include "util/util.h"

#include <stdint.h>


/* SHOAL_STOP_* variables (stop_config.c). */
typedef struct {
    const char *signals;       /* SHOAL_STOP_SIGNALS: "USR1,TERM"; empty = no handler */
    const char *file;          /* SHOAL_STOP_FILE: a path (%t tenant, %j job); empty = none */
} shoal_stop_config_t;
extern SHOAL_HIDDEN shoal_stop_config_t shoal_stop_config;

/* Per-communicator state (struct shoal_comm's stop member). requested and agreed are read and
 * written only with __atomic builtins: requested from signal handlers and other threads. */
typedef struct {
    int requested;             /* shoal_comm_request_stop was called */
    int agreed;                /* an agreement said stop (the same call on every rank) */
    uint32_t checks;           /* agreements run so far (same on every rank) */
    int sig_user;              /* this communicator holds a reference on the handler */
    char *file;                /* SHOAL_STOP_FILE expanded, or NULL */
    uint64_t refused_ino;      /* the last stop file refused as untrusted (warned once) */
} shoal_stop_comm_t;

/* At communicator init (before the bootstrap; stop is the communicator's member, tenant and
 * job its identity's names, "" when none): expands SHOAL_STOP_FILE, and takes a reference on
 * the SHOAL_STOP_SIGNALS handler, installing it first if this is the first communicator.
 * SHOAL_ERR_INVALID_ARG for a malformed list or path, SHOAL_ERR_SYSTEM when sigaction fails
 * (logged). */
SHOAL_HIDDEN shoal_status_t shoal_stop_comm_init(shoal_stop_comm_t *stop, const char *tenant,
                                                 const char *job);
/* At destroy: drops the reference; the last one restores the saved actions. */
SHOAL_HIDDEN void shoal_stop_comm_fini(shoal_stop_comm_t *stop);
/* The handler's references (stop_sig.c), one per communicator: see shoal_stop_comm_init. */
SHOAL_HIDDEN shoal_status_t shoal_stop_sig_ref(shoal_stop_comm_t *stop);
SHOAL_HIDDEN void shoal_stop_sig_unref(shoal_stop_comm_t *stop);

/* The process-wide flag (stop.c): set by shoal_request_stop and the handler. */
SHOAL_HIDDEN void shoal_stop_request_process(int signo);
/* 1 once the process is stopping: a stop signal came, or an agreement said stop. */
SHOAL_HIDDEN int shoal_stop_under_way(void);

/* Parses a SHOAL_STOP_SIGNALS list ("USR1,TERM", "SIGUSR1", "10", "RTMIN+2"; commas or spaces,
 * case-insensitive) into a bit mask (bit s - 1 for signal s). Signals a job is told to stop with
 * only: HUP INT QUIT ALRM TERM USR1 USR2 XCPU PWR and the real-time ones; never KILL, STOP or a
 * fault signal. On error a sentence in why and SHOAL_ERR_INVALID_ARG. */
SHOAL_HIDDEN shoal_status_t shoal_stop_signals_parse(const char *spec, uint64_t *mask_p,
                                                     char *why, size_t whylen);
/* Writes "USR1" for SIGUSR1, "RTMIN+2", or the number; returns buf. */
SHOAL_HIDDEN const char *shoal_stop_signal_name(int signo, char *buf, size_t len);
/* The signals the handler is installed for now (bit mask, 0 = none). */
SHOAL_HIDDEN uint64_t shoal_stop_signals_installed(void);

#endif
