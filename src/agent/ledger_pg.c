/* The ledger in PostgreSQL (libpq), for a provider's central database: the schema of
 * ledger.c, statements prepared once per connection, one transaction per commit with the head
 * row locked FOR UPDATE (agents on many hosts share one chain, its seq stays consecutive).
 *
 * A lost connection (server down, restarted, network) fails the call with SHOAL_ERR_TRANSPORT;
 * the transaction is gone with it on the server side. The next call reconnects. Timeouts bound
 * every wait: connect_timeout, tcp_user_timeout, statement_timeout and lock_timeout, and the
 * client's own SHOAL_LEDGER_PG_WAIT_MS for a server that hangs. The URL may hold a password: it
 * is never logged (database, host and port are). */
#include "agent/ledger_int.h"

#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define SHOAL_LEDGER_PG_LOCK_ID 0x73686f616cLL /* "shoal": serialises schema creation */

typedef struct {
    PGconn *conn;
    char *url;
    int writer;                        /* 0: a reader, never creates the tables */
    int in_txn;
} shoal_ledger_pg_t;

static void shoal_ledger_pg_notice(void *arg, const char *message)
{
    shoal_trace(METER, "ledger: PostgreSQL says: %s", message);
}

static void shoal_ledger_pg_disconnect(shoal_ledger_pg_t *be)
{
    if (be->conn != NULL)
        PQfinish(be->conn);
    be->conn = NULL;
    be->in_txn = 0;
}

/* A result that is not an error. */
static int shoal_ledger_pg_good(const PGresult *res)
{
    ExecStatusType st = PQresultStatus(res);

    return st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_EMPTY_QUERY;
}

/* Logs a failed result and classifies it: a unique violation is the caller's, everything
 * else (connection, shutdown, disk full, timeouts, a table gone) is the database's. */
static shoal_status_t shoal_ledger_pg_fail(shoal_ledger_pg_t *be, PGresult *res,
                                           const char *what)
{
    const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res != NULL ? PQresultErrorMessage(res) : "";
    shoal_status_t status = SHOAL_ERR_TRANSPORT;

    if (msg == NULL || *msg == '\0')
        msg = PQerrorMessage(be->conn);
    if (PQstatus(be->conn) == CONNECTION_BAD) {
        shoal_error(METER, "ledger: PostgreSQL %s on database %s at %s:%s failed, the "
                    "connection is lost: %s", what, PQdb(be->conn), PQhost(be->conn),
                    PQport(be->conn), msg);
    } else {
        if (state != NULL && strncmp(state, "23", 2) == 0)
            status = SHOAL_ERR_INVALID_ARG;
        shoal_error(METER, "ledger: PostgreSQL %s on database %s failed (SQLSTATE %s): %s",
                    what, PQdb(be->conn), state != NULL ? state : "?", msg);
    }
    return status;
}

/* The longest a statement waits for the server's answer: past statement_timeout (30 s) and
 * lock_timeout (15 s), with which a server that runs ends a slow statement itself. Those are
 * the server's own: one that hangs (its processes stopped, stuck on its disk) keeps the
 * connection up, the kernel acknowledges what is sent (so tcp_user_timeout never fires), and
 * PQexec waited for ever (shoal-bill never ended; the agent's ledger calls never came back). */
#define SHOAL_LEDGER_PG_WAIT_MS 35000

/* PQexec's result for a query that PQsend* sent (sent 0: NULL, PQerrorMessage says why), with
 * a deadline: past it the connection is shut down, which fails the query and the connection
 * (CONNECTION_BAD: the next call reconnects). The first failed result, else the last one. */
static PGresult *shoal_ledger_pg_wait(shoal_ledger_pg_t *be, int sent)
{
    uint64_t deadline = shoal_deadline_ns(SHOAL_LEDGER_PG_WAIT_MS);
    int sock = PQsocket(be->conn);
    PGresult *res, *keep = NULL;

    if (!sent)
        return NULL;
    while (PQisBusy(be->conn)) {
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        int left = shoal_deadline_left_ms(deadline, SHOAL_LEDGER_PG_WAIT_MS);
        int ret = left > 0 ? poll(&pfd, 1, left) : 0;

        if (ret < 0 && errno == EINTR)
            continue;
        if (ret <= 0) {
            shoal_error(METER, "ledger: PostgreSQL database %s at %s:%s did not answer within "
                        "%d s: the connection is dropped", PQdb(be->conn), PQhost(be->conn),
                        PQport(be->conn), SHOAL_LEDGER_PG_WAIT_MS / 1000);
            /* libpq reads the end of the stream at once: the query fails, the connection
             * is bad (PQgetResult below does not wait) */
            shutdown(sock, SHUT_RDWR);
        }
        if (PQconsumeInput(be->conn) == 0)
            break;
    }
    while ((res = PQgetResult(be->conn)) != NULL) {
        if (keep == NULL || shoal_ledger_pg_good(keep)) {
            PQclear(keep); /* a good one gives way to the next; a failure stays */
            keep = res;
        } else {
            PQclear(res);
        }
    }
    return keep;
}

/* PQexec with the deadline. */
static PGresult *shoal_ledger_pg_query(shoal_ledger_pg_t *be, const char *sql)
{
    return shoal_ledger_pg_wait(be, PQsendQuery(be->conn, sql));
}

static shoal_status_t shoal_ledger_pg_exec(shoal_ledger_pg_t *be, const char *sql,
                                           const char *what)
{
    PGresult *res = shoal_ledger_pg_query(be, sql);
    ExecStatusType st = PQresultStatus(res);
    shoal_status_t status = SHOAL_OK;

    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        status = shoal_ledger_pg_fail(be, res, what);
    PQclear(res);
    return status;
}

/* ?N -> $N: the statements are written once for both backends. */
static void shoal_ledger_pg_sql(const char *in, char *out, size_t size)
{
    size_t i;

    for (i = 0; in[i] != '\0' && i + 1 < size; i++)
        out[i] = in[i] == '?' ? '$' : in[i];
    out[i] = '\0';
}

static shoal_status_t shoal_ledger_pg_prepare(shoal_ledger_pg_t *be)
{
    char name[32], sql[1024];

    /* a reader skips the writers' statements: an older agent's ledger may lack their table */
    int n = be->writer ? SHOAL_LEDGER_SQL_COUNT : SHOAL_LEDGER_SQL_CURSOR_JOB_PUT;

    for (int i = 0; i < n; i++) {
        PGresult *res;
        shoal_status_t status = SHOAL_OK;

        snprintf(name, sizeof(name), "shoal_ledger_%d", i);
        shoal_ledger_pg_sql(shoal_ledger_sql[i], sql, sizeof(sql));
        res = shoal_ledger_pg_wait(be, PQsendPrepare(be->conn, name, sql, 0, NULL));
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
            status = shoal_ledger_pg_fail(be, res, "prepare");
        PQclear(res);
        if (status != SHOAL_OK)
            return status;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_schema(shoal_ledger_pg_t *be)
{
    char lock[96];
    shoal_status_t status;
    PGresult *res;

    SHOAL_CHECK(shoal_ledger_pg_exec(be, "BEGIN", "begin"));
    snprintf(lock, sizeof(lock), "SELECT pg_advisory_xact_lock(%lld)", SHOAL_LEDGER_PG_LOCK_ID);
    for (size_t i = 0; be->writer && i < shoal_ledger_schema_nsql; i++) {
        if (i == 0)
            SHOAL_CHECK_GOTO(shoal_ledger_pg_exec(be, lock, "schema lock"), status,
                             err_rollback);
        SHOAL_CHECK_GOTO(shoal_ledger_pg_exec(be, shoal_ledger_schema_sql[i], "schema creation"),
                         status, err_rollback);
    }
    res = shoal_ledger_pg_query(be, "SELECT value FROM ledger_meta WHERE name = "
                                "'schema_version'");
    if (be->writer && PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
        strcmp(PQgetvalue(res, 0, 0), "1") == 0) {
        PQclear(res);
        for (size_t i = 0; i < shoal_ledger_migrate_v1_nsql; i++)
            SHOAL_CHECK_GOTO(shoal_ledger_pg_exec(be, shoal_ledger_migrate_v1_sql[i],
                                                  "schema upgrade"), status, err_rollback);
        shoal_info(METER, "ledger: database %s upgraded from schema version 1 to %d (a host "
                   "column)", PQdb(be->conn), SHOAL_LEDGER_SCHEMA_VERSION);
        res = shoal_ledger_pg_query(be, "SELECT value FROM ledger_meta WHERE name = "
                                    "'schema_version'");
    }
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        status = shoal_ledger_pg_fail(be, res, "read of the schema version");
        PQclear(res);
        goto err_rollback;
    }
    if (PQntuples(res) != 1 || atoi(PQgetvalue(res, 0, 0)) != SHOAL_LEDGER_SCHEMA_VERSION) {
        shoal_error(METER, "ledger: database %s has schema version %s, this shoal reads "
                    "version %d%s", PQdb(be->conn), PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) :
                    "?", SHOAL_LEDGER_SCHEMA_VERSION, PQntuples(res) == 1 &&
                    strcmp(PQgetvalue(res, 0, 0), "1") == 0 ? " (shoald of this version "
                    "upgrades it when it opens it)" : "");
        PQclear(res);
        status = SHOAL_ERR_UNSUPPORTED;
        goto err_rollback;
    }
    PQclear(res);
    return shoal_ledger_pg_exec(be, "COMMIT", "schema commit");

err_rollback:
    if (PQstatus(be->conn) == CONNECTION_OK)
        PQclear(shoal_ledger_pg_query(be, "ROLLBACK"));
    return status;
}

static shoal_status_t shoal_ledger_pg_connect(shoal_ledger_pg_t *be)
{
    /* Defaults first: what the URL says overrides them. */
    static const char *const keys[] = {"connect_timeout", "tcp_user_timeout", "keepalives_idle",
                                       "application_name", "dbname", NULL};
    const char *values[] = {"5", "15000", "10", "shoal-ledger", be->url, NULL};
    shoal_status_t status;

    be->conn = PQconnectdbParams(keys, values, 1);
    if (be->conn == NULL)
        return SHOAL_ERR_NO_MEMORY;
    if (PQstatus(be->conn) != CONNECTION_OK) {
        shoal_error(METER, "ledger: cannot connect to PostgreSQL database %s at %s:%s: %s",
                    PQdb(be->conn), PQhost(be->conn), PQport(be->conn),
                    PQerrorMessage(be->conn));
        status = SHOAL_ERR_TRANSPORT;
        goto err_disconnect;
    }
    PQsetNoticeProcessor(be->conn, shoal_ledger_pg_notice, NULL);
    SHOAL_CHECK_GOTO(shoal_ledger_pg_exec(be, "SET statement_timeout = '30s';"
                                          " SET lock_timeout = '15s';"
                                          " SET extra_float_digits = 3", "session setup"),
                     status, err_disconnect);
    /* A reader (shoal-bill) only reads: the server refuses any write or row lock of its
     * session, whatever the user's grants, so a report can never alter the ledger or hold a
     * lock that the agent's commits wait for. */
    if (!be->writer)
        SHOAL_CHECK_GOTO(shoal_ledger_pg_exec(be, "SET default_transaction_read_only = on",
                                              "read-only session setup"),
                         status, err_disconnect);
    SHOAL_CHECK_GOTO(shoal_ledger_pg_schema(be), status, err_disconnect);
    SHOAL_CHECK_GOTO(shoal_ledger_pg_prepare(be), status, err_disconnect);
    return SHOAL_OK;

err_disconnect:
    shoal_ledger_pg_disconnect(be);
    return status;
}

/* A usable connection outside a transaction: reconnects after a loss. */
static shoal_status_t shoal_ledger_pg_ready(shoal_ledger_pg_t *be)
{
    if (be->in_txn)
        return SHOAL_OK;
    if (be->conn != NULL && PQstatus(be->conn) == CONNECTION_OK)
        return SHOAL_OK;
    shoal_ledger_pg_disconnect(be);
    SHOAL_CHECK(shoal_ledger_pg_connect(be));
    shoal_info(METER, "ledger: reconnected to PostgreSQL database %s", PQdb(be->conn));
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_open(const char *url, int writer, void **be_p)
{
    shoal_ledger_pg_t *be = calloc(1, sizeof(*be));
    shoal_status_t status;

    if (be == NULL)
        return SHOAL_ERR_NO_MEMORY;
    be->url = strdup(url);
    if (be->url == NULL) {
        free(be);
        return SHOAL_ERR_NO_MEMORY;
    }
    be->writer = writer;
    status = shoal_ledger_pg_connect(be);
    if (status != SHOAL_OK) {
        shoal_secret_wipe(be->url, strlen(be->url));
        free(be->url);
        free(be);
        return status;
    }
    *be_p = be;
    return SHOAL_OK;
}

static void shoal_ledger_pg_close(void *arg)
{
    shoal_ledger_pg_t *be = arg;

    shoal_ledger_pg_disconnect(be);
    shoal_secret_wipe(be->url, strlen(be->url));
    free(be->url);
    free(be);
}

/* Runs a prepared statement; the result is the caller's (PQclear) on SHOAL_OK. */
static shoal_status_t shoal_ledger_pg_run(shoal_ledger_pg_t *be, shoal_ledger_sql_t id,
                                          int nparams, const char *const *values,
                                          const char *what, PGresult **res_p)
{
    char name[32];
    PGresult *res;
    ExecStatusType st;

    snprintf(name, sizeof(name), "shoal_ledger_%d", (int)id);
    res = shoal_ledger_pg_wait(be, PQsendQueryPrepared(be->conn, name, nparams, values, NULL,
                                                       NULL, 0));
    st = PQresultStatus(res);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        shoal_status_t status = shoal_ledger_pg_fail(be, res, what);

        PQclear(res);
        return status;
    }
    *res_p = res;
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_begin(void *arg)
{
    shoal_ledger_pg_t *be = arg;
    shoal_status_t status;

    SHOAL_CHECK(shoal_ledger_pg_ready(be));
    status = shoal_ledger_pg_exec(be, "BEGIN", "begin");
    if (status != SHOAL_OK && PQstatus(be->conn) == CONNECTION_BAD) {
        /* the server went away since the last call (a restart): one new connection */
        SHOAL_CHECK(shoal_ledger_pg_ready(be));
        status = shoal_ledger_pg_exec(be, "BEGIN", "begin");
    }
    if (status != SHOAL_OK)
        return status;
    be->in_txn = 1;
    status = shoal_ledger_pg_exec(be, "SELECT value FROM ledger_meta WHERE name = 'head_seq'"
                                  " FOR UPDATE", "lock of the head");
    if (status != SHOAL_OK) {
        if (PQstatus(be->conn) == CONNECTION_OK)
            PQclear(shoal_ledger_pg_query(be, "ROLLBACK"));
        be->in_txn = 0;
    }
    return status;
}

static void shoal_ledger_pg_rollback(void *arg)
{
    shoal_ledger_pg_t *be = arg;

    if (be->conn != NULL && PQstatus(be->conn) == CONNECTION_OK &&
        PQtransactionStatus(be->conn) != PQTRANS_IDLE)
        PQclear(shoal_ledger_pg_query(be, "ROLLBACK"));
    be->in_txn = 0;
}

static shoal_status_t shoal_ledger_pg_commit(void *arg)
{
    shoal_ledger_pg_t *be = arg;
    shoal_status_t status = shoal_ledger_pg_exec(be, "COMMIT", "commit");

    shoal_ledger_pg_rollback(be);
    return status == SHOAL_OK || status == SHOAL_ERR_NO_MEMORY ? status : SHOAL_ERR_TRANSPORT;
}

static shoal_status_t shoal_ledger_pg_head_get(void *arg, uint64_t *seq_p,
                                               uint8_t mac[SHOAL_HMAC_BYTES])
{
    shoal_ledger_pg_t *be = arg;
    int have = 0, bad = 0;
    PGresult *res;

    SHOAL_CHECK(shoal_ledger_pg_ready(be));
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_HEAD_GET, 0, NULL, "read of the head",
                                    &res));
    for (int i = 0; i < PQntuples(res); i++) {
        const char *name = PQgetvalue(res, i, 0), *value = PQgetvalue(res, i, 1);

        if (strcmp(name, "head_seq") == 0) {
            /* strictly: anything else read as 0 (ledger_sqlite.c) */
            bad |= shoal_ledger_seq_parse(value, seq_p) != 0;
            have |= 1;
        } else if (shoal_ledger_mac_from_hex(value, mac) == 0) {
            have |= 2;
        } else {
            bad = 1;
        }
    }
    PQclear(res);
    if (bad || have != 3) {
        shoal_error(METER, "ledger: the head in database %s (ledger_meta) is missing or "
                    "malformed", PQdb(be->conn));
        return SHOAL_ERR_PROTOCOL;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_head_set(void *arg, uint64_t seq,
                                               const uint8_t mac[SHOAL_HMAC_BYTES])
{
    shoal_ledger_pg_t *be = arg;
    char hex[SHOAL_LEDGER_MAC_HEX], num[24];
    const char *v1[] = {num, "head_seq"}, *v2[] = {hex, "head_mac"};
    PGresult *res;

    shoal_ledger_mac_to_hex(mac, hex);
    snprintf(num, sizeof(num), "%" PRIu64, seq);
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_META_SET, 2, v1, "update of the head",
                                    &res));
    PQclear(res);
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_META_SET, 2, v2, "update of the head",
                                    &res));
    PQclear(res);
    return SHOAL_OK;
}

static int shoal_ledger_pg_row(const PGresult *res, int row, shoal_ledger_record_t *rec)
{
    memset(rec, 0, sizeof(*rec));
    rec->seq = strtoull(PQgetvalue(res, row, 0), NULL, 10);
    if (shoal_ledger_copy_text(rec->tenant, sizeof(rec->tenant), PQgetvalue(res, row, 1)) != 0 ||
        shoal_ledger_copy_text(rec->job, sizeof(rec->job), PQgetvalue(res, row, 2)) != 0 ||
        shoal_ledger_copy_text(rec->qos_class, sizeof(rec->qos_class),
                               PQgetvalue(res, row, 3)) != 0)
        return -1;
    rec->minute = strtoll(PQgetvalue(res, row, 4), NULL, 10);
    rec->gpu_seconds = strtod(PQgetvalue(res, row, 5), NULL);
    rec->bytes_same_host = (uint64_t)strtoll(PQgetvalue(res, row, 6), NULL, 10);
    rec->bytes_cross_host = (uint64_t)strtoll(PQgetvalue(res, row, 7), NULL, 10);
    rec->ops = (uint64_t)strtoll(PQgetvalue(res, row, 8), NULL, 10);
    rec->coll_seconds = strtod(PQgetvalue(res, row, 9), NULL);
    rec->failed_platform = (uint64_t)strtoll(PQgetvalue(res, row, 10), NULL, 10);
    rec->failed_tenant = (uint64_t)strtoll(PQgetvalue(res, row, 11), NULL, 10);
    if (shoal_ledger_copy_text(rec->host, sizeof(rec->host), PQgetvalue(res, row, 13)) != 0)
        return -1;
    return shoal_ledger_mac_from_hex(PQgetvalue(res, row, 12), rec->mac);
}

static shoal_status_t shoal_ledger_pg_record_find(void *arg, const char *tenant,
                                                  const char *job, const char *host,
                                                  int64_t minute,
                                                  shoal_ledger_record_t *rec_p, int *found_p)
{
    shoal_ledger_pg_t *be = arg;
    char num[24];
    const char *values[] = {tenant, job, host, num};
    PGresult *res;

    snprintf(num, sizeof(num), "%" PRId64, minute);
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_FIND, 4, values, "lookup of a record",
                                    &res));
    *found_p = PQntuples(res) > 0;
    if (*found_p && shoal_ledger_pg_row(res, 0, rec_p) != 0)
        memset(rec_p, 0, sizeof(*rec_p));
    PQclear(res);
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_record_insert(void *arg, const shoal_ledger_record_t *rec)
{
    shoal_ledger_pg_t *be = arg;
    char hex[SHOAL_LEDGER_MAC_HEX], n[9][32];
    const char *values[SHOAL_LEDGER_NCOLS] = {
        n[0], rec->tenant, rec->job, rec->qos_class, n[1], n[2], n[3], n[4], n[5], n[6], n[7],
        n[8], hex, rec->host,
    };
    PGresult *res;

    snprintf(n[0], sizeof(n[0]), "%" PRId64, (int64_t)rec->seq);
    snprintf(n[1], sizeof(n[1]), "%" PRId64, rec->minute);
    snprintf(n[2], sizeof(n[2]), "%.17g", rec->gpu_seconds);
    snprintf(n[3], sizeof(n[3]), "%" PRId64, (int64_t)rec->bytes_same_host);
    snprintf(n[4], sizeof(n[4]), "%" PRId64, (int64_t)rec->bytes_cross_host);
    snprintf(n[5], sizeof(n[5]), "%" PRId64, (int64_t)rec->ops);
    snprintf(n[6], sizeof(n[6]), "%.17g", rec->coll_seconds);
    snprintf(n[7], sizeof(n[7]), "%" PRId64, (int64_t)rec->failed_platform);
    snprintf(n[8], sizeof(n[8]), "%" PRId64, (int64_t)rec->failed_tenant);
    shoal_ledger_mac_to_hex(rec->mac, hex);
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_INSERT, SHOAL_LEDGER_NCOLS, values,
                                    "insert of a record", &res));
    PQclear(res);
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_cursor_put(void *arg, const shoal_ledger_cursor_t *cursor)
{
    shoal_ledger_pg_t *be = arg;
    char text[SHOAL_LEDGER_COUNTERS_TEXT];
    const char *values[] = {cursor->key, text};
    const char *jvalues[] = {cursor->key, cursor->tenant, cursor->job};
    PGresult *res;

    if (shoal_ledger_counters_format(cursor, text, sizeof(text)) != 0)
        return SHOAL_ERR_INVALID_ARG;
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_CURSOR_PUT, 2, values,
                                    "write of a cursor", &res));
    PQclear(res);
    if (cursor->tenant[0] == '\0')
        return SHOAL_OK;
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_CURSOR_JOB_PUT, 3, jvalues,
                                    "write of a cursor's job", &res));
    PQclear(res);
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_cursor_del(void *arg, const char *key)
{
    shoal_ledger_pg_t *be = arg;
    const char *values[] = {key};
    PGresult *res;

    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_CURSOR_DEL, 1, values,
                                    "removal of a cursor", &res));
    PQclear(res);
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_CURSOR_JOB_DEL, 1, values,
                                    "removal of a cursor's job", &res));
    PQclear(res);
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_cursor_list(void *arg, const char *prefix,
                                                  shoal_ledger_cursor_cb_t cb, void *cb_arg)
{
    shoal_ledger_pg_t *be = arg;
    const char *values[] = {prefix};
    PGresult *res;
    int n, stop = 0;

    SHOAL_CHECK(shoal_ledger_pg_ready(be));
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_CURSOR_LIST, 1, values,
                                    "read of the cursors", &res));
    n = PQntuples(res);
    for (int i = 0; i < n && !stop; i++)
        stop = cb(PQgetvalue(res, i, 0), PQgetvalue(res, i, 1), PQgetvalue(res, i, 2),
                  cb_arg) != 0;
    PQclear(res);
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_pg_cursor_get(void *arg, const char *key,
                                                 shoal_ledger_cursor_t *cursor_p, int *found_p)
{
    shoal_ledger_pg_t *be = arg;
    const char *values[] = {key};
    shoal_status_t status = SHOAL_OK;
    PGresult *res;

    SHOAL_CHECK(shoal_ledger_pg_ready(be));
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_CURSOR_GET, 1, values,
                                    "read of a cursor", &res));
    *found_p = PQntuples(res) > 0;
    if (*found_p) {
        memset(cursor_p, 0, sizeof(*cursor_p));
        if (shoal_ledger_copy_text(cursor_p->key, sizeof(cursor_p->key), key) != 0 ||
            shoal_ledger_counters_parse(PQgetvalue(res, 0, 0), cursor_p) != 0) {
            shoal_error(METER, "ledger: the cursor of %s in database %s is malformed", key,
                        PQdb(be->conn));
            status = SHOAL_ERR_PROTOCOL;
        }
    }
    PQclear(res);
    return status;
}

static shoal_status_t shoal_ledger_pg_last_minute(void *arg, const char *tenant,
                                                  const char *job, const char *host,
                                                  int64_t *minute_p)
{
    shoal_ledger_pg_t *be = arg;
    const char *values[] = {tenant, job, host};
    PGresult *res;

    SHOAL_CHECK(shoal_ledger_pg_ready(be));
    SHOAL_CHECK(shoal_ledger_pg_run(be, SHOAL_LEDGER_SQL_LAST_MINUTE, 3, values,
                                    "read of the last minute", &res));
    *minute_p = PQntuples(res) > 0 && !PQgetisnull(res, 0, 0) ?
                    strtoll(PQgetvalue(res, 0, 0), NULL, 10) : -1;
    PQclear(res);
    return SHOAL_OK;
}

/* Reads the rows through a cursor, SHOAL_LEDGER_PG_FETCH at a time: a month of records is not
 * held in memory, and statement_timeout bounds each FETCH, not the whole read. One statement
 * streamed in single-row mode was cancelled after 30 s (SQLSTATE 57014): a report or verify
 * of a ledger of some 20 million records (500 jobs for four weeks) always failed. */
#define SHOAL_LEDGER_PG_FETCH 10000

static shoal_status_t shoal_ledger_pg_each(void *arg, int64_t from, int64_t to,
                                           const char *tenant, const char *job,
                                           shoal_ledger_each_cb_t cb, void *cb_arg)
{
    shoal_ledger_pg_t *be = arg;
    char f[24], t[24], each[1024], sql[1100], fetch[64];
    const char *values[] = {f, t, tenant, job};
    shoal_status_t status = SHOAL_OK;
    shoal_ledger_record_t rec;
    PGresult *res;
    int stop = 0, n;

    SHOAL_CHECK(shoal_ledger_pg_ready(be));
    snprintf(f, sizeof(f), "%" PRId64, from);
    snprintf(t, sizeof(t), "%" PRId64, to);
    shoal_ledger_pg_sql(shoal_ledger_sql[SHOAL_LEDGER_SQL_EACH], each, sizeof(each));
    snprintf(sql, sizeof(sql), "DECLARE shoal_each NO SCROLL CURSOR FOR %s", each);
    snprintf(fetch, sizeof(fetch), "FETCH %d FROM shoal_each", SHOAL_LEDGER_PG_FETCH);
    SHOAL_CHECK(shoal_ledger_pg_exec(be, "BEGIN", "begin of a read"));
    res = shoal_ledger_pg_wait(be, PQsendQueryParams(be->conn, sql, 4, NULL, values, NULL, NULL,
                                                     0));
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        status = shoal_ledger_pg_fail(be, res, "read of the records");
    PQclear(res);
    while (status == SHOAL_OK && !stop) {
        res = shoal_ledger_pg_query(be, fetch);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
            status = shoal_ledger_pg_fail(be, res, "read of the records");
            PQclear(res);
            break;
        }
        n = PQntuples(res);
        for (int i = 0; i < n && !stop; i++) {
            if (shoal_ledger_pg_row(res, i, &rec) != 0)
                memset(rec.mac, 0, sizeof(rec.mac));
            stop = cb(&rec, cb_arg) != 0;
        }
        PQclear(res);
        stop |= n < SHOAL_LEDGER_PG_FETCH;
    }
    /* the cursor goes with the transaction; nothing was written */
    if (PQstatus(be->conn) == CONNECTION_OK)
        PQclear(shoal_ledger_pg_query(be, "ROLLBACK"));
    return status;
}

const shoal_ledger_ops_t shoal_ledger_pg_ops = {
    .name = "postgresql",
    .open = shoal_ledger_pg_open,
    .close = shoal_ledger_pg_close,
    .begin = shoal_ledger_pg_begin,
    .commit = shoal_ledger_pg_commit,
    .rollback = shoal_ledger_pg_rollback,
    .head_get = shoal_ledger_pg_head_get,
    .head_set = shoal_ledger_pg_head_set,
    .record_find = shoal_ledger_pg_record_find,
    .record_insert = shoal_ledger_pg_record_insert,
    .cursor_put = shoal_ledger_pg_cursor_put,
    .cursor_del = shoal_ledger_pg_cursor_del,
    .cursor_get = shoal_ledger_pg_cursor_get,
    .cursor_list = shoal_ledger_pg_cursor_list,
    .last_minute = shoal_ledger_pg_last_minute,
    .each = shoal_ledger_pg_each,
};
