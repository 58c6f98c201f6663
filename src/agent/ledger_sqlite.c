/* The ledger in SQLite (the embedded default): WAL journal, synchronous=FULL, one BEGIN
 * IMMEDIATE transaction per commit, prepared statements only.
 *
 * A file that was removed, moved away or replaced would go on taking writes through the open
 * handle, into an inode nobody reads: before each transaction the path is checked against the
 * file opened (device, inode) and for write access; a mismatch closes the handle, and a
 * database that is not there (it is never re-created after the first open) or not writable is
 * SHOAL_ERR_TRANSPORT, reopened at the next call. */
#include "agent/ledger_int.h"

#include <errno.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHOAL_LEDGER_SQLITE_BUSY_MS 10000

typedef struct {
    sqlite3 *db;
    char *path;
    dev_t dev;
    ino_t ino;
    int writer;                        /* 0: a reader, never creates or changes the schema */
    int in_txn;
    sqlite3_stmt *stmt[SHOAL_LEDGER_SQL_COUNT];
} shoal_ledger_sqlite_t;

static shoal_status_t shoal_ledger_sqlite_status(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_DONE:
    case SQLITE_ROW:
        return SHOAL_OK;
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
    case SQLITE_TOOBIG:
        return SHOAL_ERR_INVALID_ARG;
    case SQLITE_NOMEM:
        return SHOAL_ERR_NO_MEMORY;
    default:                           /* I/O, read-only, full, busy, cantopen, corrupt */
        return SHOAL_ERR_TRANSPORT;
    }
}

static shoal_status_t shoal_ledger_sqlite_fail(shoal_ledger_sqlite_t *be, int rc,
                                               const char *what)
{
    shoal_error(METER, "ledger: SQLite %s on %s failed: %s (%s)", what, be->path,
                be->db != NULL ? sqlite3_errmsg(be->db) : "no handle", sqlite3_errstr(rc));
    return shoal_ledger_sqlite_status(rc);
}

static void shoal_ledger_sqlite_disconnect(shoal_ledger_sqlite_t *be)
{
    for (int i = 0; i < SHOAL_LEDGER_SQL_COUNT; i++) {
        sqlite3_finalize(be->stmt[i]);
        be->stmt[i] = NULL;
    }
    if (be->db != NULL)
        sqlite3_close_v2(be->db);
    be->db = NULL;
    be->in_txn = 0;
}

static shoal_status_t shoal_ledger_sqlite_exec(shoal_ledger_sqlite_t *be, const char *sql)
{
    int rc = sqlite3_exec(be->db, sql, NULL, NULL, NULL);

    if (rc != SQLITE_OK)
        return shoal_ledger_sqlite_fail(be, rc, sql);
    return SHOAL_OK;
}

/* The statement, prepared once per connection, reset and unbound. */
static shoal_status_t shoal_ledger_sqlite_stmt(shoal_ledger_sqlite_t *be, shoal_ledger_sql_t id,
                                               sqlite3_stmt **stmt_p)
{
    int rc;

    if (be->stmt[id] == NULL) {
        rc = sqlite3_prepare_v3(be->db, shoal_ledger_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
                                &be->stmt[id], NULL);
        if (rc != SQLITE_OK)
            return shoal_ledger_sqlite_fail(be, rc, "prepare");
    }
    sqlite3_reset(be->stmt[id]);
    sqlite3_clear_bindings(be->stmt[id]);
    *stmt_p = be->stmt[id];
    return SHOAL_OK;
}

/* The stored schema version (0: none or not a number), or -1 when it cannot be read: logged,
 * its status in *status_p. A reader that may not write the ledger's directory cannot open a
 * WAL ledger whose -shm file is not there (the agent is stopped): that read "schema version
 * 0, this shoal reads version 2", not why. */
static int shoal_ledger_sqlite_version_get(shoal_ledger_sqlite_t *be, shoal_status_t *status_p)
{
    sqlite3_stmt *st = NULL;
    int version = 0, rc;

    /* not kept: a migration changes the schema under a prepared statement */
    rc = sqlite3_prepare_v2(be->db, "SELECT value FROM ledger_meta WHERE name = 'schema_version'",
                            -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
            version = sqlite3_column_int(st, 0);
    }
    if (rc != SQLITE_OK && rc != SQLITE_ROW && rc != SQLITE_DONE) {
        *status_p = shoal_ledger_sqlite_fail(be, rc, "read of the schema version");
        if (!be->writer && ((rc & 0xff) == SQLITE_READONLY || (rc & 0xff) == SQLITE_CANTOPEN))
            shoal_error(METER, "ledger: a reader of %s needs its -shm file (the agent makes it "
                        "while it runs) or a directory it may write", be->path);
        version = -1;
    }
    sqlite3_finalize(st);
    return version;
}

static shoal_status_t shoal_ledger_sqlite_version(shoal_ledger_sqlite_t *be)
{
    shoal_status_t status = SHOAL_ERR_UNSUPPORTED;
    int version = shoal_ledger_sqlite_version_get(be, &status);

    if (version < 0)
        return status;
    if (version == SHOAL_LEDGER_SCHEMA_VERSION)
        return SHOAL_OK;
    shoal_error(METER, "ledger: %s has schema version %d, this shoal reads version %d%s",
                be->path, version, SHOAL_LEDGER_SCHEMA_VERSION,
                version == 1 && !be->writer ? " (shoald of this version upgrades it when it "
                                              "opens it)" : "");
    return SHOAL_ERR_UNSUPPORTED;
}

/* A writer creates what is missing, upgrades an older version, then checks the version; a
 * reader only checks. */
static shoal_status_t shoal_ledger_sqlite_schema(shoal_ledger_sqlite_t *be)
{
    shoal_status_t status;
    int version;

    if (!be->writer)
        return shoal_ledger_sqlite_version(be);
    SHOAL_CHECK(shoal_ledger_sqlite_exec(be, "BEGIN IMMEDIATE"));
    for (size_t i = 0; i < shoal_ledger_schema_nsql; i++) {
        status = shoal_ledger_sqlite_exec(be, shoal_ledger_schema_sql[i]);
        if (status != SHOAL_OK)
            goto err_rollback;
    }
    version = shoal_ledger_sqlite_version_get(be, &status);
    if (version < 0)
        goto err_rollback;
    if (version == 1) {
        for (size_t i = 0; i < shoal_ledger_migrate_v1_nsql; i++) {
            status = shoal_ledger_sqlite_exec(be, shoal_ledger_migrate_v1_sql[i]);
            if (status != SHOAL_OK)
                goto err_rollback;
        }
        shoal_info(METER, "ledger: %s upgraded from schema version 1 to %d (a host column)",
                   be->path, SHOAL_LEDGER_SCHEMA_VERSION);
    }
    SHOAL_CHECK_GOTO(shoal_ledger_sqlite_version(be), status, err_rollback);
    return shoal_ledger_sqlite_exec(be, "COMMIT");

err_rollback:
    sqlite3_exec(be->db, "ROLLBACK", NULL, NULL, NULL);
    return status;
}

static shoal_status_t shoal_ledger_sqlite_connect(shoal_ledger_sqlite_t *be, int create)
{
    /* A reader (shoal-bill) opens read-only: a read-write handle is a writer to SQLite, and
     * the last one to close checkpoints the WAL into the file and deletes it (a report
     * rewrote the ledger), and one run by another user (root) makes -wal and -shm files
     * the agent's user cannot open for writing once it is killed before it removes them. */
    int flags = (be->writer ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY) |
                SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0);
    shoal_status_t status;
    struct stat st;
    int rc;

    /* SQLite open(2)s the path without O_NONBLOCK: a FIFO there (a mistyped path) blocked
     * shoal-bill, or the agent's ledger thread, for ever, waiting for a writer */
    if (stat(be->path, &st) == 0 && !S_ISREG(st.st_mode)) {
        shoal_error(METER, "ledger: %s is not a regular file (an SQLite database is one)",
                    be->path);
        return SHOAL_ERR_TRANSPORT;
    }
    rc = sqlite3_open_v2(be->path, &be->db, flags, NULL);
    if (rc != SQLITE_OK) {
        status = shoal_ledger_sqlite_fail(be, rc, "open");
        goto err_close;
    }
    sqlite3_extended_result_codes(be->db, 1);
    sqlite3_busy_timeout(be->db, SHOAL_LEDGER_SQLITE_BUSY_MS);
    if (be->writer) {
        SHOAL_CHECK_GOTO(shoal_ledger_sqlite_exec(be, "PRAGMA journal_mode=WAL"), status,
                         err_close);
        SHOAL_CHECK_GOTO(shoal_ledger_sqlite_exec(be, "PRAGMA synchronous=FULL"), status,
                         err_close);
    }
    SHOAL_CHECK_GOTO(shoal_ledger_sqlite_schema(be), status, err_close);
    if (stat(be->path, &st) != 0) {
        shoal_error(METER, "ledger: stat(%s) failed: %s", be->path, strerror(errno));
        status = SHOAL_ERR_TRANSPORT;
        goto err_close;
    }
    be->dev = st.st_dev;
    be->ino = st.st_ino;
    return SHOAL_OK;

err_close:
    shoal_ledger_sqlite_disconnect(be);
    return status;
}

/* Before a transaction (or a read outside one): the file opened is still the file at the path,
 * and writable when we are about to write. */
static shoal_status_t shoal_ledger_sqlite_check(shoal_ledger_sqlite_t *be, int write)
{
    struct stat st;

    if (be->in_txn)
        return SHOAL_OK;
    if (be->db != NULL && (stat(be->path, &st) != 0 || st.st_dev != be->dev ||
                           st.st_ino != be->ino)) {
        shoal_error(METER, "ledger: the SQLite database %s was removed, moved or replaced; "
                    "closing it", be->path);
        shoal_ledger_sqlite_disconnect(be);
    }
    if (be->db == NULL) {
        if (access(be->path, F_OK) != 0) {
            shoal_error(METER, "ledger: the SQLite database %s is not there: %s (it is not "
                        "re-created; restore it)", be->path, strerror(errno));
            return SHOAL_ERR_TRANSPORT;
        }
        SHOAL_CHECK(shoal_ledger_sqlite_connect(be, 0));
        shoal_info(METER, "ledger: reopened the SQLite database %s", be->path);
    }
    if (write && access(be->path, W_OK) != 0) {
        shoal_error(METER, "ledger: the SQLite database %s is not writable: %s", be->path,
                    strerror(errno));
        return SHOAL_ERR_TRANSPORT;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_sqlite_open(const char *path, int writer, void **be_p)
{
    shoal_ledger_sqlite_t *be = calloc(1, sizeof(*be));
    shoal_status_t status;

    if (be == NULL)
        return SHOAL_ERR_NO_MEMORY;
    be->path = strdup(path);
    if (be->path == NULL) {
        free(be);
        return SHOAL_ERR_NO_MEMORY;
    }
    be->writer = writer;
    status = shoal_ledger_sqlite_connect(be, writer);
    if (status != SHOAL_OK) {
        free(be->path);
        free(be);
        return status;
    }
    *be_p = be;
    return SHOAL_OK;
}

static void shoal_ledger_sqlite_close(void *arg)
{
    shoal_ledger_sqlite_t *be = arg;

    shoal_ledger_sqlite_disconnect(be);
    free(be->path);
    free(be);
}

static shoal_status_t shoal_ledger_sqlite_begin(void *arg)
{
    shoal_ledger_sqlite_t *be = arg;

    SHOAL_CHECK(shoal_ledger_sqlite_check(be, 1));
    SHOAL_CHECK(shoal_ledger_sqlite_exec(be, "BEGIN IMMEDIATE"));
    be->in_txn = 1;
    return SHOAL_OK;
}

static void shoal_ledger_sqlite_rollback(void *arg)
{
    shoal_ledger_sqlite_t *be = arg;

    if (be->db != NULL && !sqlite3_get_autocommit(be->db))
        sqlite3_exec(be->db, "ROLLBACK", NULL, NULL, NULL);
    be->in_txn = 0;
}

static shoal_status_t shoal_ledger_sqlite_commit(void *arg)
{
    shoal_ledger_sqlite_t *be = arg;
    shoal_status_t status = shoal_ledger_sqlite_exec(be, "COMMIT");

    if (status != SHOAL_OK) {
        shoal_ledger_sqlite_rollback(be);
        return status == SHOAL_ERR_NO_MEMORY ? status : SHOAL_ERR_TRANSPORT;
    }
    be->in_txn = 0;
    return SHOAL_OK;
}

/* Steps a statement that returns no row. */
static shoal_status_t shoal_ledger_sqlite_done(shoal_ledger_sqlite_t *be, sqlite3_stmt *st,
                                               const char *what)
{
    int rc = sqlite3_step(st);

    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return shoal_ledger_sqlite_fail(be, rc, what);
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_sqlite_head_get(void *arg, uint64_t *seq_p,
                                                   uint8_t mac[SHOAL_HMAC_BYTES])
{
    shoal_ledger_sqlite_t *be = arg;
    int rc, have = 0, bad = 0;
    sqlite3_stmt *st;

    SHOAL_CHECK(shoal_ledger_sqlite_check(be, 0));
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_HEAD_GET, &st));
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        const char *value = (const char *)sqlite3_column_text(st, 1);

        if (name == NULL || value == NULL) {
            bad = 1;
        } else if (strcmp(name, "head_seq") == 0) {
            /* strictly: anything else read as 0, and verify passed a ledger of records as
             * empty while the next commit failed on seq 1 as a duplicate */
            bad |= shoal_ledger_seq_parse(value, seq_p) != 0;
            have |= 1;
        } else if (shoal_ledger_mac_from_hex(value, mac) == 0) {
            have |= 2;
        } else {
            bad = 1;
        }
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return shoal_ledger_sqlite_fail(be, rc, "read of the head");
    if (bad || have != 3) {
        shoal_error(METER, "ledger: the head in %s (ledger_meta) is missing or malformed",
                    be->path);
        return SHOAL_ERR_PROTOCOL;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_sqlite_head_set(void *arg, uint64_t seq,
                                                   const uint8_t mac[SHOAL_HMAC_BYTES])
{
    shoal_ledger_sqlite_t *be = arg;
    char hex[SHOAL_LEDGER_MAC_HEX], num[24];
    sqlite3_stmt *st;

    shoal_ledger_mac_to_hex(mac, hex);
    snprintf(num, sizeof(num), "%" PRIu64, seq);
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_META_SET, &st));
    sqlite3_bind_text(st, 1, num, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, "head_seq", -1, SQLITE_STATIC);
    SHOAL_CHECK(shoal_ledger_sqlite_done(be, st, "update of the head"));
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_META_SET, &st));
    sqlite3_bind_text(st, 1, hex, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, "head_mac", -1, SQLITE_STATIC);
    return shoal_ledger_sqlite_done(be, st, "update of the head");
}

/* Column i holds exactly what the ledger binds there: SQLite keeps the type a value was stored
 * with, and a report's filter (tenant = ?, minute >= ?) compares stored values, while the MAC
 * covers what sqlite3_column_*() converts them to. A tenant rewritten as a BLOB, or as text
 * with a NUL after the name, reads back as the same name (the MAC holds) but no longer matches
 * --tenant: such a row reads as malformed (its MAC never verifies), so verify names it. The
 * types are checked before any column is read as another (which converts it). */
static int shoal_ledger_sqlite_col_ok(sqlite3_stmt *st, int i, int type)
{
    if (sqlite3_column_type(st, i) != type)
        return 0;
    return type != SQLITE_TEXT ||
           strlen((const char *)sqlite3_column_text(st, i)) == (size_t)sqlite3_column_bytes(st, i);
}

/* A row of FIND or EACH into a record; -1 when a column is not of its type (the record is
 * filled as read all the same), does not fit or the mac is bad. */
static int shoal_ledger_sqlite_row(sqlite3_stmt *st, shoal_ledger_record_t *rec)
{
    static const int types[SHOAL_LEDGER_NCOLS] = {
        SQLITE_INTEGER, SQLITE_TEXT,    SQLITE_TEXT,    SQLITE_TEXT,  SQLITE_INTEGER,
        SQLITE_FLOAT,   SQLITE_INTEGER, SQLITE_INTEGER, SQLITE_INTEGER, SQLITE_FLOAT,
        SQLITE_INTEGER, SQLITE_INTEGER, SQLITE_TEXT,    SQLITE_TEXT,
    };
    int typed = 1;

    for (int i = 0; i < SHOAL_LEDGER_NCOLS; i++)
        typed &= shoal_ledger_sqlite_col_ok(st, i, types[i]);
    memset(rec, 0, sizeof(*rec));
    rec->seq = (uint64_t)sqlite3_column_int64(st, 0);
    if (shoal_ledger_copy_text(rec->tenant, sizeof(rec->tenant),
                               (const char *)sqlite3_column_text(st, 1)) != 0 ||
        shoal_ledger_copy_text(rec->job, sizeof(rec->job),
                               (const char *)sqlite3_column_text(st, 2)) != 0 ||
        shoal_ledger_copy_text(rec->qos_class, sizeof(rec->qos_class),
                               (const char *)sqlite3_column_text(st, 3)) != 0)
        return -1;
    rec->minute = sqlite3_column_int64(st, 4);
    rec->gpu_seconds = sqlite3_column_double(st, 5);
    rec->bytes_same_host = (uint64_t)sqlite3_column_int64(st, 6);
    rec->bytes_cross_host = (uint64_t)sqlite3_column_int64(st, 7);
    rec->ops = (uint64_t)sqlite3_column_int64(st, 8);
    rec->coll_seconds = sqlite3_column_double(st, 9);
    rec->failed_platform = (uint64_t)sqlite3_column_int64(st, 10);
    rec->failed_tenant = (uint64_t)sqlite3_column_int64(st, 11);
    if (shoal_ledger_mac_from_hex((const char *)sqlite3_column_text(st, 12), rec->mac) != 0 ||
        shoal_ledger_copy_text(rec->host, sizeof(rec->host),
                               (const char *)sqlite3_column_text(st, 13)) != 0)
        return -1;
    return typed ? 0 : -1; /* the figures as read, for a report; never a MAC that verifies */
}

static shoal_status_t shoal_ledger_sqlite_record_find(void *arg, const char *tenant,
                                                      const char *job, const char *host,
                                                      int64_t minute,
                                                      shoal_ledger_record_t *rec_p, int *found_p)
{
    shoal_ledger_sqlite_t *be = arg;
    sqlite3_stmt *st;
    int rc;

    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_FIND, &st));
    sqlite3_bind_text(st, 1, tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, job, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, host, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, minute);
    rc = sqlite3_step(st);
    *found_p = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW && shoal_ledger_sqlite_row(st, rec_p) != 0) {
        /* an altered row: it exists, verify names it */
        memset(rec_p, 0, sizeof(*rec_p));
    }
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return shoal_ledger_sqlite_fail(be, rc, "lookup of a record");
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_sqlite_record_insert(void *arg,
                                                        const shoal_ledger_record_t *rec)
{
    shoal_ledger_sqlite_t *be = arg;
    char hex[SHOAL_LEDGER_MAC_HEX];
    sqlite3_stmt *st;

    shoal_ledger_mac_to_hex(rec->mac, hex);
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_INSERT, &st));
    sqlite3_bind_int64(st, 1, (int64_t)rec->seq);
    sqlite3_bind_text(st, 2, rec->tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, rec->job, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, rec->qos_class, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, rec->minute);
    sqlite3_bind_double(st, 6, rec->gpu_seconds);
    sqlite3_bind_int64(st, 7, (int64_t)rec->bytes_same_host);
    sqlite3_bind_int64(st, 8, (int64_t)rec->bytes_cross_host);
    sqlite3_bind_int64(st, 9, (int64_t)rec->ops);
    sqlite3_bind_double(st, 10, rec->coll_seconds);
    sqlite3_bind_int64(st, 11, (int64_t)rec->failed_platform);
    sqlite3_bind_int64(st, 12, (int64_t)rec->failed_tenant);
    sqlite3_bind_text(st, 13, hex, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 14, rec->host, -1, SQLITE_STATIC);
    return shoal_ledger_sqlite_done(be, st, "insert of a record");
}

static shoal_status_t shoal_ledger_sqlite_cursor_put(void *arg,
                                                     const shoal_ledger_cursor_t *cursor)
{
    shoal_ledger_sqlite_t *be = arg;
    char text[SHOAL_LEDGER_COUNTERS_TEXT];
    sqlite3_stmt *st;

    if (shoal_ledger_counters_format(cursor, text, sizeof(text)) != 0)
        return SHOAL_ERR_INVALID_ARG;
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_CURSOR_PUT, &st));
    sqlite3_bind_text(st, 1, cursor->key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, text, -1, SQLITE_STATIC);
    SHOAL_CHECK(shoal_ledger_sqlite_done(be, st, "write of a cursor"));
    if (cursor->tenant[0] == '\0')
        return SHOAL_OK;
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_CURSOR_JOB_PUT, &st));
    sqlite3_bind_text(st, 1, cursor->key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, cursor->tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, cursor->job, -1, SQLITE_STATIC);
    return shoal_ledger_sqlite_done(be, st, "write of a cursor's job");
}

static shoal_status_t shoal_ledger_sqlite_cursor_del(void *arg, const char *key)
{
    shoal_ledger_sqlite_t *be = arg;
    sqlite3_stmt *st;

    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_CURSOR_DEL, &st));
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    SHOAL_CHECK(shoal_ledger_sqlite_done(be, st, "removal of a cursor"));
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_CURSOR_JOB_DEL, &st));
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    return shoal_ledger_sqlite_done(be, st, "removal of a cursor's job");
}

static shoal_status_t shoal_ledger_sqlite_cursor_list(void *arg, const char *prefix,
                                                      shoal_ledger_cursor_cb_t cb, void *cb_arg)
{
    shoal_ledger_sqlite_t *be = arg;
    shoal_status_t status = SHOAL_OK;
    sqlite3_stmt *st;
    int rc, stop = 0;

    SHOAL_CHECK(shoal_ledger_sqlite_check(be, 0));
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_CURSOR_LIST, &st));
    sqlite3_bind_text(st, 1, prefix, -1, SQLITE_STATIC);
    while (!stop && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *key = (const char *)sqlite3_column_text(st, 0);
        const char *tenant = (const char *)sqlite3_column_text(st, 1);
        const char *job = (const char *)sqlite3_column_text(st, 2);

        if (key != NULL && tenant != NULL && job != NULL)
            stop = cb(key, tenant, job, cb_arg) != 0;
    }
    if (!stop && rc != SQLITE_DONE)
        status = shoal_ledger_sqlite_fail(be, rc, "read of the cursors");
    sqlite3_reset(st);
    return status;
}

static shoal_status_t shoal_ledger_sqlite_cursor_get(void *arg, const char *key,
                                                     shoal_ledger_cursor_t *cursor_p,
                                                     int *found_p)
{
    shoal_ledger_sqlite_t *be = arg;
    shoal_status_t status = SHOAL_OK;
    sqlite3_stmt *st;
    int rc;

    SHOAL_CHECK(shoal_ledger_sqlite_check(be, 0));
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_CURSOR_GET, &st));
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    *found_p = 0;
    if (rc == SQLITE_ROW) {
        memset(cursor_p, 0, sizeof(*cursor_p));
        if (shoal_ledger_copy_text(cursor_p->key, sizeof(cursor_p->key), key) != 0 ||
            shoal_ledger_counters_parse((const char *)sqlite3_column_text(st, 0), cursor_p) !=
                0) {
            shoal_error(METER, "ledger: the cursor of %s in %s is malformed", key, be->path);
            status = SHOAL_ERR_PROTOCOL;
        }
        *found_p = 1;
    } else if (rc != SQLITE_DONE) {
        status = shoal_ledger_sqlite_fail(be, rc, "read of a cursor");
    }
    sqlite3_reset(st);
    return status;
}

static shoal_status_t shoal_ledger_sqlite_last_minute(void *arg, const char *tenant,
                                                      const char *job, const char *host,
                                                      int64_t *minute_p)
{
    shoal_ledger_sqlite_t *be = arg;
    sqlite3_stmt *st;
    int rc;

    SHOAL_CHECK(shoal_ledger_sqlite_check(be, 0));
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_LAST_MINUTE, &st));
    sqlite3_bind_text(st, 1, tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, job, -1, SQLITE_STATIC);
    if (host != NULL)
        sqlite3_bind_text(st, 3, host, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_reset(st);
        return shoal_ledger_sqlite_fail(be, rc, "read of the last minute");
    }
    *minute_p = sqlite3_column_type(st, 0) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return SHOAL_OK;
}

static shoal_status_t shoal_ledger_sqlite_each(void *arg, int64_t from, int64_t to,
                                               const char *tenant, const char *job,
                                               shoal_ledger_each_cb_t cb, void *cb_arg)
{
    shoal_ledger_sqlite_t *be = arg;
    shoal_status_t status = SHOAL_OK;
    shoal_ledger_record_t rec;
    sqlite3_stmt *st;
    int rc;

    SHOAL_CHECK(shoal_ledger_sqlite_check(be, 0));
    SHOAL_CHECK(shoal_ledger_sqlite_stmt(be, SHOAL_LEDGER_SQL_EACH, &st));
    sqlite3_bind_int64(st, 1, from);
    sqlite3_bind_int64(st, 2, to);
    if (tenant != NULL)
        sqlite3_bind_text(st, 3, tenant, -1, SQLITE_STATIC);
    if (job != NULL)
        sqlite3_bind_text(st, 4, job, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (shoal_ledger_sqlite_row(st, &rec) != 0) {
            /* a name too long or a mac that is not hex: only an edit outside the ledger
             * makes one; the chain check fails on it */
            memset(rec.mac, 0, sizeof(rec.mac));
        }
        if (cb(&rec, cb_arg) != 0)
            break;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        status = shoal_ledger_sqlite_fail(be, rc, "read of the records");
    sqlite3_reset(st);
    return status;
}

const shoal_ledger_ops_t shoal_ledger_sqlite_ops = {
    .name = "sqlite",
    .open = shoal_ledger_sqlite_open,
    .close = shoal_ledger_sqlite_close,
    .begin = shoal_ledger_sqlite_begin,
    .commit = shoal_ledger_sqlite_commit,
    .rollback = shoal_ledger_sqlite_rollback,
    .head_get = shoal_ledger_sqlite_head_get,
    .head_set = shoal_ledger_sqlite_head_set,
    .record_find = shoal_ledger_sqlite_record_find,
    .record_insert = shoal_ledger_sqlite_record_insert,
    .cursor_put = shoal_ledger_sqlite_cursor_put,
    .cursor_del = shoal_ledger_sqlite_cursor_del,
    .cursor_get = shoal_ledger_sqlite_cursor_get,
    .cursor_list = shoal_ledger_sqlite_cursor_list,
    .last_minute = shoal_ledger_sqlite_last_minute,
    .each = shoal_ledger_sqlite_each,
};
