/* The billing ledger of shoald: one record per tenant, job, host and wall-clock minute,
 * chained by an HMAC so that no record can be altered or dropped unnoticed. SQLite (embedded
 * default) or PostgreSQL (libpq, a provider's central database), one schema.
 *
 * Contract with the agent (src/agent/shoald*.c):
 *  - The agent samples every registered page at each minute boundary (and when a page's rank
 *    exits), computes per (tenant, job) the exact counter deltas since the cursor stored in
 *    the ledger, and hands the minute to shoal_ledger_commit() together with the new cursors.
 *    Records and cursors are written in ONE transaction: a kill -9 before the commit loses
 *    nothing (the next agent recomputes from the old cursors), after it counts nothing twice.
 *  - A database that is down: commit returns SHOAL_ERR_TRANSPORT; the agent keeps the minute
 *    in memory (and retries with backoff), and at its stop in its spool for the next agent
 *    (agent_spool.c), never drops it.
 */
#ifndef SHOAL_AGENT_LEDGER_H
#define SHOAL_AGENT_LEDGER_H

#include <shoal.h>
#include <stddef.h>
#include <stdint.h>

#define SHOAL_LEDGER_NAME_MAX 64

typedef struct {
    char tenant[SHOAL_LEDGER_NAME_MAX];
    char job[SHOAL_LEDGER_NAME_MAX];
    char qos_class[16];                /* "reserved" | "spot" (billing class) */
    int64_t minute;                    /* unix seconds of the minute's start (multiple of the
                                        * minute length; tests may shorten the minute) */
    double gpu_seconds;                /* allocated GPU-seconds: sum over ranks of GPUs x
                                        * seconds the rank lived within this minute */
    uint64_t bytes_same_host;          /* payload bytes sent, same host */
    uint64_t bytes_cross_host;         /* payload bytes sent, other hosts */
    uint64_t ops;                      /* collective calls */
    double coll_seconds;               /* time inside collectives */
    uint64_t failed_platform;          /* ranks that failed for causes the platform owns
                                        * (peer lost, timeout, transport) in this minute */
    uint64_t failed_tenant;            /* ranks that failed by the tenant's own abort */
    char host[SHOAL_LEDGER_NAME_MAX];  /* the agent's host that billed it ("": one agent per
                                        * job, as ledgers of version 1 were): the hosts of a
                                        * job each write their own record of a minute */
    /* set by the ledger on commit */
    uint64_t seq;                      /* 1, 2, ... over the whole ledger */
    uint8_t mac[32];                   /* HMAC(ledger key, prev mac | canonical record) */
} shoal_ledger_record_t;

/* Where a registered page's counters stood when they were last billed. */
typedef struct {
    char key[96];                      /* stable id of a page: host, pid, comm_id, rank,
                                        * created_unix_ns */
    uint64_t counters[64];             /* the page's counters, in page order */
    int ncounters;                     /* in a commit, < 0 removes the key's cursor (a page
                                        * that is gone and fully billed) */
    char tenant[SHOAL_LEDGER_NAME_MAX]; /* in a commit: the page's job, stored with its first
                                        * cursor ("": none); not read back by cursor() */
    char job[SHOAL_LEDGER_NAME_MAX];
} shoal_ledger_cursor_t;

/* A stored cursor with its job (shoal_ledger_cursor_list); nonzero stops the listing. */
typedef int (*shoal_ledger_cursor_cb_t)(const char *key, const char *tenant, const char *job,
                                        void *arg);

typedef struct shoal_ledger shoal_ledger_t;

/* url: "sqlite:///path/to/ledger.db" (also "sqlite:PATH" or a bare path; the file is created
 * with the schema when missing) or a libpq URI "postgresql://user@host:port/db" (also
 * "postgres://", and "postgresql:///db?host=/socket/dir&port=N"; the tables are created when
 * missing). key: the ledger's HMAC key (from the agent's config file, never logged); NULL with
 * keylen 0 opens a reader (reports): commit and verify are then refused. */
shoal_status_t shoal_ledger_open(const char *url, const uint8_t *key, size_t keylen,
                                 shoal_ledger_t **ledger_p);
/* A reader even with a key (shoal-bill): like a keyless reader, it creates no file and no
 * table (a ledger that is not there is an error) and cannot commit; with a key it verifies. */
shoal_status_t shoal_ledger_open_reader(const char *url, const uint8_t *key, size_t keylen,
                                        shoal_ledger_t **ledger_p);
void shoal_ledger_close(shoal_ledger_t *ledger);
/* url as a log line may show it: the password of a PostgreSQL URL (user:PASSWORD@ and any
 * password=VALUE or sslpassword=VALUE, in the query or a key=value connection string)
 * replaced by ***. */
void shoal_ledger_url_redact(const char *url, char *buf, size_t len);
/* A URL from the command line (--ledger), which every local user reads in /proc/PID/cmdline:
 * one with a password is copied (the copy is kept for the process's life and returned), the
 * argument itself overwritten with the redacted form, which is what ps shows from then on, and
 * prog warns on stderr that the password was visible until then. Otherwise arg itself. NULL
 * without memory. */
const char *shoal_ledger_url_arg(char *arg, const char *prog);
/* Appends the records (seq and mac are assigned) and replaces the cursors, atomically. A
 * record whose (tenant, job, host, minute) exists already is refused as SHOAL_ERR_INVALID_ARG
 * (nothing is written), except the exact replay of a commit that was stored but whose answer
 * was lost (every record identical and every cursor as given): SHOAL_OK, seq and mac filled
 * from the stored records, nothing written twice. SHOAL_ERR_TRANSPORT: the database is down,
 * unreachable, unwritable or its file is gone; nothing was written, retry later (the next call
 * reconnects). */
shoal_status_t shoal_ledger_commit(shoal_ledger_t *ledger, shoal_ledger_record_t *recs, size_t n,
                                   const shoal_ledger_cursor_t *cursors, size_t ncursors);
/* 1 if shoal_ledger_commit would take this record (names set and terminated, minute and
 * seconds not negative, seconds finite) or cursor (key set, ncounters at most the maximum, job
 * named in full or not at all); a batch that holds one that is not is refused whole. */
int shoal_ledger_record_ok(const shoal_ledger_record_t *r);
int shoal_ledger_cursor_ok(const shoal_ledger_cursor_t *c);
/* The stored cursor of key; SHOAL_ERR_INVALID_ARG when there is none. */
shoal_status_t shoal_ledger_cursor(shoal_ledger_t *ledger, const char *key,
                                   shoal_ledger_cursor_t *cursor);
/* Every stored cursor whose key starts with prefix (an agent's own host: "name:") and whose
 * job is known, in key order: the pages that were not fully billed when the last commit was
 * made (a page's cursor goes once it is). A writer only (SHOAL_ERR_INVALID_ARG for a reader). */
shoal_status_t shoal_ledger_cursor_list(shoal_ledger_t *ledger, const char *prefix,
                                        shoal_ledger_cursor_cb_t cb, void *arg);
/* The last minute committed for (tenant, job) by host (NULL: by any host; a record of version
 * 1, host "", counts for every host: its agent billed the job's ranks it knew) in *minute_p,
 * -1 if none; a database that failed is the status (logged), *minute_p untouched. */
shoal_status_t shoal_ledger_last_minute_get(shoal_ledger_t *ledger, const char *tenant,
                                            const char *job, const char *host,
                                            int64_t *minute_p);
/* The same as a value: -1 for none and for a database that failed alike (reports, tests). */
int64_t shoal_ledger_last_minute(shoal_ledger_t *ledger, const char *tenant, const char *job,
                                 const char *host);
/* Iterates the records with minute in [from, to) in seq order (tenant/job NULL: all). The
 * callback returns 0 to go on, nonzero to stop; it must not call the ledger. */
typedef int (*shoal_ledger_each_cb_t)(const shoal_ledger_record_t *rec, void *arg);
shoal_status_t shoal_ledger_each(shoal_ledger_t *ledger, int64_t from, int64_t to,
                                 const char *tenant, const char *job, shoal_ledger_each_cb_t cb,
                                 void *arg);
/* Recomputes the chain; SHOAL_OK, or SHOAL_ERR_AUTH with *bad_seq_p = the first bad record
 * (altered, missing or reordered). */
shoal_status_t shoal_ledger_verify(shoal_ledger_t *ledger, uint64_t *bad_seq_p);
/* The same, and on SHOAL_OK the head that was verified: the chain up to it is intact (a head
 * read afterwards may be past what was checked, when a commit came in between). */
shoal_status_t shoal_ledger_verify_head(shoal_ledger_t *ledger, uint64_t *bad_seq_p,
                                        uint64_t *head_seq_p, uint8_t head_mac[32]);
/* The head of the chain: the last seq committed (0: none) and its mac (mac_p may be NULL).
 * Kept outside the ledger (printed by shoal-bill verify), it also detects a truncated tail. */
shoal_status_t shoal_ledger_head(shoal_ledger_t *ledger, uint64_t *seq_p, uint8_t mac_p[32]);

#endif
