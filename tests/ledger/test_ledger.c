/* TAP test of the billing ledger (src/agent/ledger.h) against a real database:
 *   test_ledger sqlite:///DIR/ledger.db      (DIR made by the caller, writable)
 *   test_ledger postgresql:///DB?host=...     (a server the caller started; LEDGER_TEST_STOP
 *                                              and LEDGER_TEST_START are shell commands that
 *                                              stop and start it)
 * Round trips (commit, each, last_minute, cursor), a duplicate refused atomically, the exact
 * replay of a stored commit, the chain verified and every kind of tampering named by seq
 * (each field altered, a record deleted, the tail dropped, two records swapped; a head that is
 * not a number), a reader with the key that verifies and creates no ledger that is not there,
 * kill -9 of a writer in the middle of a stream of commits (records present iff their cursors
 * are), and a database gone (file unwritable, directory moved away, server stopped):
 * SHOAL_ERR_TRANSPORT, nothing half-written, the retried commit succeeds; a PostgreSQL read
 * longer than statement_timeout. The log never shows the key, nor a URL's password. */
#include "agent/ledger.h"
#include "agent/ledger_int.h"
#include "tests/tap.h"
#include "util/util.h"

#include <errno.h>
#include <inttypes.h>
#if SHOAL_HAVE_LIBPQ
#include <libpq-fe.h>
#endif
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MINUTE0 1796083200LL          /* 2026-12-01T00:00:00Z */
#define KILL_MINUTE0 1798761600LL     /* 2027-01-01T00:00:00Z */

static const uint8_t test_key[] = "test-ledger-key-3f9a0c17d2b84e65";
static const char *test_url;
static int test_pg;
static char test_path[4096];          /* SQLite: the database file */
static char test_dir[4096];           /* SQLite: its directory */
static char test_log[4200];

static shoal_ledger_record_t rec_make(const char *tenant, const char *job, int64_t minute, int i)
{
    shoal_ledger_record_t r;

    memset(&r, 0, sizeof(r));
    snprintf(r.tenant, sizeof(r.tenant), "%s", tenant);
    snprintf(r.job, sizeof(r.job), "%s", job);
    snprintf(r.qos_class, sizeof(r.qos_class), "%s", i % 2 == 0 ? "reserved" : "spot");
    r.minute = minute;
    r.gpu_seconds = 30.25 + i;
    r.bytes_same_host = 1000u * (uint64_t)i + 7;
    r.bytes_cross_host = ((uint64_t)1 << 40) | (uint64_t)i;
    r.ops = 3u * (uint64_t)i + 1;
    r.coll_seconds = 0.1 * i;         /* not exact in binary: must come back bit for bit */
    r.failed_platform = (uint64_t)(i % 2);
    r.failed_tenant = (uint64_t)(i % 3 == 0);
    return r;
}

static shoal_ledger_cursor_t cursor_make(const char *key, uint64_t base, int n)
{
    shoal_ledger_cursor_t c;

    memset(&c, 0, sizeof(c));
    snprintf(c.key, sizeof(c.key), "%s", key);
    c.ncounters = n;
    for (int i = 0; i < n; i++)
        c.counters[i] = base * (uint64_t)(i + 1);
    return c;
}

static int rec_equal(const shoal_ledger_record_t *a, const shoal_ledger_record_t *b)
{
    return strcmp(a->tenant, b->tenant) == 0 && strcmp(a->job, b->job) == 0 &&
           strcmp(a->qos_class, b->qos_class) == 0 && a->minute == b->minute &&
           memcmp(&a->gpu_seconds, &b->gpu_seconds, sizeof(double)) == 0 &&
           a->bytes_same_host == b->bytes_same_host &&
           a->bytes_cross_host == b->bytes_cross_host && a->ops == b->ops &&
           memcmp(&a->coll_seconds, &b->coll_seconds, sizeof(double)) == 0 &&
           a->failed_platform == b->failed_platform && a->failed_tenant == b->failed_tenant &&
           a->seq == b->seq && memcmp(a->mac, b->mac, 32) == 0;
}

/* ---- collecting records ------------------------------------------------------------------ */

typedef struct {
    shoal_ledger_record_t r[64];
    int n;
    uint64_t count;
    int in_order;
    uint64_t last_seq;
} collect_t;

static int collect_cb(const shoal_ledger_record_t *rec, void *arg)
{
    collect_t *c = arg;

    if (c->n < 64)
        c->r[c->n++] = *rec;
    c->count++;
    if (rec->seq <= c->last_seq)
        c->in_order = 0;
    c->last_seq = rec->seq;
    return 0;
}

static int collect(shoal_ledger_t *l, int64_t from, int64_t to, const char *tenant,
                   const char *job, collect_t *c)
{
    memset(c, 0, sizeof(*c));
    c->in_order = 1;
    return shoal_ledger_each(l, from, to, tenant, job, collect_cb, c) == SHOAL_OK ? 0 : -1;
}

/* ---- listing the open pages -------------------------------------------------------------- */

typedef struct {
    char text[512];
    int n;
} listed_t;

static int list_cb(const char *key, const char *tenant, const char *job, void *arg)
{
    listed_t *g = arg;
    size_t len = strlen(g->text);

    snprintf(g->text + len, sizeof(g->text) - len, "%s=%s/%s ", key, tenant, job);
    g->n++;
    return 0;
}

static int list_cursors(shoal_ledger_t *l, const char *prefix, listed_t *g)
{
    memset(g, 0, sizeof(*g));
    return shoal_ledger_cursor_list(l, prefix, list_cb, g) == SHOAL_OK ? 0 : -1;
}

/* ---- SQL outside the API: the tampering and the server ------------------------------------- */

static int tamper(const char *sql)
{
    int ok = 0;

    if (test_pg) {
#if SHOAL_HAVE_LIBPQ
        PGconn *c = PQconnectdb(test_url);
        PGresult *res;

        if (PQstatus(c) == CONNECTION_OK) {
            res = PQexec(c, sql);
            ok = PQresultStatus(res) == PGRES_COMMAND_OK ||
                 PQresultStatus(res) == PGRES_TUPLES_OK;
            if (!ok)
                tap_diag("psql: %s", PQresultErrorMessage(res));
            PQclear(res);
        }
        PQfinish(c);
#endif
    } else {
        sqlite3 *db = NULL;
        char *err = NULL;

        if (sqlite3_open_v2(test_path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
            sqlite3_busy_timeout(db, 10000);
            ok = sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK;
            if (!ok)
                tap_diag("sqlite3: %s", err != NULL ? err : "?");
            sqlite3_free(err);
        }
        sqlite3_close(db);
    }
    return ok ? 0 : -1;
}

static int run_cmd(const char *what, const char *env)
{
    const char *cmd = getenv(env);
    int rc;

    if (cmd == NULL)
        return -1;
    fflush(stdout);
    rc = system(cmd);
    if (rc != 0)
        tap_diag("%s (%s) exited %d", what, env, rc);
    return rc == 0 ? 0 : -1;
}

/* ---- the cases ----------------------------------------------------------------------------- */

static void test_round_trips(shoal_ledger_t *l)
{
    shoal_ledger_record_t b1[3] = {
        rec_make("acme", "train-1", MINUTE0, 1), rec_make("acme", "train-2", MINUTE0, 2),
        rec_make("globex", "sim", MINUTE0, 3),
    };
    shoal_ledger_record_t b2[2] = {
        rec_make("acme", "train-1", MINUTE0 + 60, 4), rec_make("globex", "sim", MINUTE0 + 60, 5),
    };
    shoal_ledger_cursor_t c1 = cursor_make("host-a/101/comm-1/0", 1000, 40);
    shoal_ledger_cursor_t c2 = cursor_make("host-a/102/comm-1/1", 7, 3);
    shoal_ledger_cursor_t cursors1[2] = {c1, c2}, got;
    shoal_ledger_cursor_t cursors2[2];
    uint64_t seq = 99, bad = 0;
    collect_t c;

    c1.counters[39] = UINT64_MAX;
    c1.counters[38] = ((uint64_t)1 << 63) + 5;
    cursors1[0] = c1;
    b1[1].bytes_cross_host = UINT64_MAX - 5;          /* above INT64_MAX: kept bit for bit */
    tap_ok(shoal_ledger_head(l, &seq, NULL) == SHOAL_OK && seq == 0, "an empty ledger: head 0");
    tap_is_int(shoal_ledger_verify(l, &bad), SHOAL_OK, "an empty ledger verifies");
    tap_is_int(shoal_ledger_last_minute(l, "acme", "train-1", NULL), -1, "no last minute yet");
    tap_is_int(shoal_ledger_cursor(l, c1.key, &got), SHOAL_ERR_INVALID_ARG, "no cursor yet");

    tap_is_int(shoal_ledger_commit(l, b1, 3, cursors1, 2), SHOAL_OK, "commit of 3 records");
    tap_ok(b1[0].seq == 1 && b1[1].seq == 2 && b1[2].seq == 3, "seq assigned 1, 2, 3 (%" PRIu64
           ", %" PRIu64 ", %" PRIu64 ")", b1[0].seq, b1[1].seq, b1[2].seq);
    tap_ok(collect(l, INT64_MIN, INT64_MAX, NULL, NULL, &c) == 0 && c.n == 3 &&
           rec_equal(&c.r[0], &b1[0]) && rec_equal(&c.r[1], &b1[1]) &&
           rec_equal(&c.r[2], &b1[2]), "each returns the records bit for bit, mac included");
    tap_ok(shoal_ledger_cursor(l, c1.key, &got) == SHOAL_OK && got.ncounters == 40 &&
           memcmp(got.counters, c1.counters, sizeof(c1.counters)) == 0 &&
           strcmp(got.key, c1.key) == 0, "a cursor of 40 counters (to UINT64_MAX) round trips");
    tap_is_int(shoal_ledger_last_minute(l, "acme", "train-1", NULL), MINUTE0, "last minute");

    cursors2[0] = cursor_make(c1.key, 2000, 40);
    cursors2[1] = c2;
    cursors2[1].ncounters = -1;                       /* the page is gone: its cursor too */
    tap_is_int(shoal_ledger_commit(l, b2, 2, cursors2, 2), SHOAL_OK, "second commit");
    tap_ok(b2[0].seq == 4 && b2[1].seq == 5, "seq goes on: 4, 5");
    tap_is_int(shoal_ledger_last_minute(l, "acme", "train-1", NULL), MINUTE0 + 60,
               "last minute moved");
    tap_is_int(shoal_ledger_last_minute(l, "acme", "train-2", NULL), MINUTE0,
               "the other job's too");
    tap_ok(shoal_ledger_cursor(l, c1.key, &got) == SHOAL_OK && got.counters[0] == 2000 &&
           got.counters[39] == 80000, "the cursor was replaced");
    tap_is_int(shoal_ledger_cursor(l, c2.key, &got), SHOAL_ERR_INVALID_ARG,
               "a cursor with ncounters < 0 is removed");
    tap_ok(collect(l, INT64_MIN, INT64_MAX, "acme", NULL, &c) == 0 && c.n == 3 && c.in_order,
           "each by tenant: 3 records in seq order");
    tap_ok(collect(l, INT64_MIN, INT64_MAX, "acme", "train-1", &c) == 0 && c.n == 2 &&
           rec_equal(&c.r[1], &b2[0]), "each by tenant and job");
    tap_ok(collect(l, MINUTE0 + 60, MINUTE0 + 120, NULL, NULL, &c) == 0 && c.n == 2 &&
           c.r[0].seq == 4, "each over [from, to): the second minute only");
    tap_ok(collect(l, MINUTE0, MINUTE0 + 60, "nobody", NULL, &c) == 0 && c.n == 0,
           "an unknown tenant: nothing");
    tap_is_int(shoal_ledger_verify(l, &bad), SHOAL_OK, "the chain verifies");
}

static void test_duplicates(shoal_ledger_t *l)
{
    shoal_ledger_record_t dup[2] = {
        rec_make("initech", "etl", MINUTE0, 6), rec_make("acme", "train-1", MINUTE0, 1),
    };
    shoal_ledger_record_t replay[2] = {
        rec_make("acme", "train-1", MINUTE0 + 60, 4), rec_make("globex", "sim", MINUTE0 + 60, 5),
    };
    shoal_ledger_record_t twice[2] = {
        rec_make("initech", "etl", MINUTE0, 6), rec_make("initech", "etl", MINUTE0, 7),
    };
    shoal_ledger_cursor_t cur = cursor_make("host-b/1/comm-9/0", 5, 4), got;
    shoal_ledger_cursor_t replay_cursors[2] = {
        cursor_make("host-a/101/comm-1/0", 2000, 40), cursor_make("host-a/102/comm-1/1", 7, 3),
    };
    uint64_t seq = 0, bad = 0;

    replay_cursors[1].ncounters = -1;
    tap_is_int(shoal_ledger_commit(l, dup, 2, &cur, 1), SHOAL_ERR_INVALID_ARG,
               "a commit holding an existing (tenant, job, minute) is refused");
    tap_ok(shoal_ledger_last_minute(l, "initech", "etl", NULL) == -1 &&
           shoal_ledger_cursor(l, cur.key, &got) == SHOAL_ERR_INVALID_ARG &&
           shoal_ledger_head(l, &seq, NULL) == SHOAL_OK && seq == 5,
           "... atomically: neither its new record nor its cursor is there, head still 5");
    tap_is_int(shoal_ledger_commit(l, twice, 2, NULL, 0), SHOAL_ERR_INVALID_ARG,
               "a commit holding one minute twice is refused");
    tap_is_int(shoal_ledger_commit(l, replay, 2, replay_cursors, 2), SHOAL_OK,
               "the exact replay of a stored commit (answer lost) is accepted");
    tap_ok(replay[0].seq == 4 && replay[1].seq == 5 && shoal_ledger_head(l, &seq, NULL) ==
           SHOAL_OK && seq == 5, "... with the stored seq, and nothing written twice");
    replay[1].ops++;
    tap_is_int(shoal_ledger_commit(l, replay, 2, replay_cursors, 2), SHOAL_ERR_INVALID_ARG,
               "a replay with a different figure is refused");
    cur = cursor_make("host-c/7/comm-3/0", 11, 8);
    tap_ok(shoal_ledger_commit(l, NULL, 0, &cur, 1) == SHOAL_OK &&
           shoal_ledger_cursor(l, cur.key, &got) == SHOAL_OK && got.counters[7] == 88 &&
           shoal_ledger_head(l, &seq, NULL) == SHOAL_OK && seq == 5,
           "a commit of cursors only (a new page's baseline): stored, head unchanged");
    tap_is_int(shoal_ledger_verify(l, &bad), SHOAL_OK, "the chain still verifies");
}

/* One tampering: apply, verify names want_seq, undo, verify clean. */
static void tamper_case(shoal_ledger_t *l, const char *what, const char *apply, const char *undo,
                        uint64_t want_seq)
{
    uint64_t bad = 0;
    shoal_status_t status;

    if (tamper(apply) != 0) {
        tap_ok(0, "%s: the tampering SQL ran", what);
        return;
    }
    status = shoal_ledger_verify(l, &bad);
    tap_ok(status == SHOAL_ERR_AUTH && bad == want_seq, "%s: detected at seq %" PRIu64
           " (status %d, seq %" PRIu64 ")", what, want_seq, (int)status, bad);
    tap_ok(tamper(undo) == 0 && shoal_ledger_verify(l, &bad) == SHOAL_OK,
           "%s: undone, the chain verifies again", what);
}

/* A head_seq that is not a number read as 0: verify passed a ledger of 5 records as an empty
 * one, and the next commit failed on seq 1 as a duplicate (SHOAL_ERR_INVALID_ARG, which the
 * agent takes for a minute written by another agent). */
static void test_head_malformed(shoal_ledger_t *l)
{
    shoal_ledger_record_t r = rec_make("headless", "j", MINUTE0, 1);
    uint64_t bad = 0, seq = 0;

    if (tamper("CREATE TABLE saved_head AS SELECT value FROM ledger_meta WHERE name = 'head_seq';"
               " UPDATE ledger_meta SET value = 'x' WHERE name = 'head_seq'") != 0) {
        tap_ok(0, "a malformed head_seq: the tampering SQL ran");
        return;
    }
    tap_is_int(shoal_ledger_verify(l, &bad), SHOAL_ERR_PROTOCOL,
               "a malformed head_seq: verify says the head is malformed, not ok");
    tap_is_int(shoal_ledger_commit(l, &r, 1, NULL, 0), SHOAL_ERR_PROTOCOL,
               "... and a commit is refused as such, not as a duplicate minute");
    tap_ok(tamper("UPDATE ledger_meta SET value = (SELECT value FROM saved_head)"
                  " WHERE name = 'head_seq'; DROP TABLE saved_head") == 0 &&
           shoal_ledger_verify(l, &bad) == SHOAL_OK && shoal_ledger_head(l, &seq, NULL) ==
           SHOAL_OK && seq == 5 && shoal_ledger_last_minute(l, "headless", "j", NULL) == -1,
           "a malformed head_seq: undone, the chain verifies at seq 5, nothing was written");
}

static void test_tampering(shoal_ledger_t *l)
{
    static const char *const fields[][3] = {
        {"tenant", "tenant = tenant || 'x'", "tenant = substr(tenant, 1, length(tenant) - 1)"},
        {"job", "job = job || 'x'", "job = substr(job, 1, length(job) - 1)"},
        {"class", "class = 'spot'", "class = 'reserved'"},
        {"minute", "minute = minute + 60", "minute = minute - 60"},
        {"gpu_seconds", "gpu_seconds = gpu_seconds + 1", "gpu_seconds = gpu_seconds - 1"},
        {"bytes_same_host", "bytes_same_host = bytes_same_host - 1",
         "bytes_same_host = bytes_same_host + 1"},
        {"bytes_cross_host", "bytes_cross_host = bytes_cross_host - 1",
         "bytes_cross_host = bytes_cross_host + 1"},
        {"ops", "ops = ops + 1", "ops = ops - 1"},
        {"coll_seconds", "coll_seconds = coll_seconds * 2", "coll_seconds = coll_seconds / 2"},
        {"failed_platform", "failed_platform = 1", "failed_platform = 0"},
        {"failed_tenant", "failed_tenant = 1", "failed_tenant = 0"},
    };
    char apply[512], undo[512], what[128];
    collect_t c;

    /* seq 2 is (acme, train-2, MINUTE0, i = 2): reserved, no failures */
    if (collect(l, INT64_MIN, INT64_MAX, NULL, NULL, &c) != 0 || c.n != 5) {
        tap_ok(0, "the 5 records to tamper with are there");
        return;
    }
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(fields); i++) {
        snprintf(apply, sizeof(apply), "UPDATE ledger_records SET %s WHERE seq = 2",
                 fields[i][1]);
        snprintf(undo, sizeof(undo), "UPDATE ledger_records SET %s WHERE seq = 2", fields[i][2]);
        snprintf(what, sizeof(what), "%s altered", fields[i][0]);
        tamper_case(l, what, apply, undo, 2);
    }
    {
        char hex[65];

        for (int i = 0; i < 32; i++)
            snprintf(hex + 2 * i, 3, "%02x", c.r[1].mac[i]);
        snprintf(apply, sizeof(apply), "UPDATE ledger_records SET mac = '%s' WHERE seq = 2",
                 "0000000000000000000000000000000000000000000000000000000000000000");
        snprintf(undo, sizeof(undo), "UPDATE ledger_records SET mac = '%s' WHERE seq = 2", hex);
        tamper_case(l, "mac altered", apply, undo, 2);
    }
    tamper_case(l, "record 3 deleted",
                "CREATE TABLE saved AS SELECT * FROM ledger_records WHERE seq = 3;"
                " DELETE FROM ledger_records WHERE seq = 3",
                "INSERT INTO ledger_records SELECT * FROM saved; DROP TABLE saved", 3);
    tamper_case(l, "the last record (5) deleted",
                "CREATE TABLE saved AS SELECT * FROM ledger_records WHERE seq = 5;"
                " DELETE FROM ledger_records WHERE seq = 5",
                "INSERT INTO ledger_records SELECT * FROM saved; DROP TABLE saved", 5);
    tamper_case(l, "records 2 and 4 swapped (seq exchanged)",
                "UPDATE ledger_records SET seq = -2 WHERE seq = 2;"
                " UPDATE ledger_records SET seq = 2 WHERE seq = 4;"
                " UPDATE ledger_records SET seq = 4 WHERE seq = -2",
                "UPDATE ledger_records SET seq = -2 WHERE seq = 2;"
                " UPDATE ledger_records SET seq = 2 WHERE seq = 4;"
                " UPDATE ledger_records SET seq = 4 WHERE seq = -2", 2);
    tamper_case(l, "records 1 and 2 swapped (contents and macs exchanged)",
                "CREATE TABLE saved AS SELECT * FROM ledger_records WHERE seq IN (1, 2);"
                " DELETE FROM ledger_records WHERE seq IN (1, 2);"
                " INSERT INTO ledger_records SELECT 3 - seq, tenant, job, class, minute,"
                " gpu_seconds, bytes_same_host, bytes_cross_host, ops, coll_seconds,"
                " failed_platform, failed_tenant, mac, host FROM saved",
                "DELETE FROM ledger_records WHERE seq IN (1, 2);"
                " INSERT INTO ledger_records SELECT * FROM saved; DROP TABLE saved", 1);
    test_head_malformed(l);
}

/* A reader (no key): reads, never writes, never verifies. */
static void test_reader(void)
{
    shoal_ledger_record_t r = rec_make("reader", "j", MINUTE0, 1);
    shoal_ledger_t *rd = NULL;
    uint64_t bad = 0;
    collect_t c;

    tap_is_int(shoal_ledger_open(test_url, NULL, 0, &rd), SHOAL_OK, "a reader opens the ledger");
    if (rd == NULL)
        return;
    tap_ok(collect(rd, INT64_MIN, INT64_MAX, NULL, NULL, &c) == 0 && c.count == 5,
           "the reader sees the 5 records");
    tap_ok(shoal_ledger_commit(rd, &r, 1, NULL, 0) == SHOAL_ERR_INVALID_ARG &&
           shoal_ledger_verify(rd, &bad) == SHOAL_ERR_INVALID_ARG,
           "the reader can neither commit nor verify");
    shoal_ledger_close(rd);
}

/* The number of shoal's tables in the PostgreSQL database of url, -1 when it cannot tell. */
static int pg_ledger_tables(const char *url)
{
    int n = -1;
#if SHOAL_HAVE_LIBPQ
    PGconn *c = PQconnectdb(url);
    PGresult *res;

    if (PQstatus(c) == CONNECTION_OK) {
        res = PQexec(c, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ledger%'");
        if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
            n = atoi(PQgetvalue(res, 0, 0));
        PQclear(res);
    }
    PQfinish(c);
#else
    (void)url;
#endif
    return n;
}

/* A reader with the key (shoal-bill verify): it verifies and never writes; a ledger that is
 * not there is an error, and nothing is created (no SQLite file, no table in an empty
 * PostgreSQL database: the server's own "postgres"). */
static void test_reader_key(void)
{
    shoal_ledger_record_t r = rec_make("reader", "j", MINUTE0, 1);
    shoal_ledger_t *rd = NULL;
    const char *q = strchr(test_url, '?');
    char url[4200];
    uint64_t bad = 0;
    listed_t got;
    int absent;

    tap_is_int(shoal_ledger_open_reader(test_url, test_key, sizeof(test_key) - 1, &rd),
               SHOAL_OK, "a reader with the key opens the ledger");
    if (rd != NULL) {
        tap_ok(shoal_ledger_verify(rd, &bad) == SHOAL_OK, "it verifies the chain");
        tap_ok(shoal_ledger_commit(rd, &r, 1, NULL, 0) == SHOAL_ERR_INVALID_ARG &&
               shoal_ledger_cursor_list(rd, "h:", list_cb, &got) == SHOAL_ERR_INVALID_ARG,
               "it can neither commit nor list the open pages");
        shoal_ledger_close(rd);
        rd = NULL;
    }
    if (test_pg)
        snprintf(url, sizeof(url), "postgresql:///postgres%s", q != NULL ? q : "");
    else
        snprintf(url, sizeof(url), "sqlite://%s/absent.db", test_dir);
    tap_ok(shoal_ledger_open_reader(url, test_key, sizeof(test_key) - 1, &rd) != SHOAL_OK &&
           rd == NULL, "a reader with the key of a ledger that is not there fails");
    if (rd != NULL)
        shoal_ledger_close(rd);
    absent = test_pg ? pg_ledger_tables(url) == 0 : access(url + strlen("sqlite://"), F_OK) != 0;
    tap_ok(absent, "and creates nothing (%s)", test_pg ? "no table" : "no file");
}

/* A reader's connection is read-only to the database itself (shoal-bill): SQLite opened it
 * read-write, and its last close checkpointed a killed writer's WAL into the file. A write
 * in the backend's own transaction is refused. */
static void test_reader_readonly(void)
{
#if SHOAL_HAVE_LIBPQ
    const shoal_ledger_ops_t *ops = test_pg ? &shoal_ledger_pg_ops : &shoal_ledger_sqlite_ops;
#else
    const shoal_ledger_ops_t *ops = &shoal_ledger_sqlite_ops;
#endif
    const uint8_t mac[SHOAL_HMAC_BYTES] = {0};
    shoal_status_t st;
    void *be = NULL;

    if (ops->open(test_pg ? test_url : test_path, 0, &be) != SHOAL_OK) {
        tap_ok(0, "a reader's backend opens the ledger");
        return;
    }
    /* PostgreSQL refuses the head's row lock at begin; SQLite begins and refuses the write */
    st = ops->begin(be);
    if (st == SHOAL_OK) {
        st = ops->head_set(be, 0, mac);
        ops->rollback(be);
    }
    tap_ok(st != SHOAL_OK, "a reader's connection cannot write (%s)", shoal_status_name(st));
    ops->close(be);
}

/* 1 when the log (SHOAL_DEBUG_FILE) has text. */
static int log_has(const char *text)
{
    FILE *fp = fopen(test_log, "r");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    int found = 0;

    if (fp == NULL)
        return 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            char *nb = realloc(buf, cap = 2 * cap + 8192);

            if (nb == NULL)
                break;
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, fp);

        if (got == 0)
            break;
        n += got;
    }
    fclose(fp);
    if (buf != NULL) {
        buf[n] = '\0';
        found = strstr(buf, text) != NULL;
    }
    free(buf);
    return found;
}

/* Agents on the hosts of one job share the ledger: each writes its own record of a minute
 * (version 1 had one per job and minute, and the second agent moved its record to the next
 * minute: the job's minutes drifted into the future). The host is in the key and the MAC. */
static void test_hosts(shoal_ledger_t *l)
{
    const int64_t m = MINUTE0 + 7200;
    shoal_ledger_record_t r[2], again, dup[2], hc;
    uint64_t bad = 0;
    int ok;
    char sql[256], undo[256];
    collect_t c;

    r[0] = rec_make("multi", "j", m, 1);
    r[1] = rec_make("multi", "j", m, 3);
    snprintf(r[0].host, sizeof(r[0].host), "node-a");
    snprintf(r[1].host, sizeof(r[1].host), "node-b");
    ok = shoal_ledger_commit(l, r, 2, NULL, 0) == SHOAL_OK && r[1].seq == r[0].seq + 1;
    tap_ok(ok, "two hosts' records of one job and minute are both taken (seq %" PRIu64 ", %"
           PRIu64 ")", r[0].seq, r[1].seq);
    tap_ok(collect(l, m, m + 60, "multi", "j", &c) == 0 && c.n == 2 &&
               strcmp(c.r[0].host, "node-a") == 0 && strcmp(c.r[1].host, "node-b") == 0 &&
               c.r[0].minute == m && c.r[1].minute == m,
           "both read back with their hosts, in the same minute");
    again = rec_make("multi", "j", m, 5);
    snprintf(again.host, sizeof(again.host), "node-a");
    tap_ok(shoal_ledger_commit(l, &again, 1, NULL, 0) == SHOAL_ERR_INVALID_ARG,
           "a second record of one host for that minute is refused");
    dup[0] = rec_make("multi", "j", m + 60, 1);
    dup[1] = rec_make("multi", "j", m + 60, 3);
    snprintf(dup[0].host, sizeof(dup[0].host), "node-c");
    snprintf(dup[1].host, sizeof(dup[1].host), "node-c");
    tap_ok(shoal_ledger_commit(l, dup, 2, NULL, 0) == SHOAL_ERR_INVALID_ARG &&
               shoal_ledger_last_minute(l, "multi", "j", "node-c") == -1,
           "a batch with one host's minute twice is refused whole");
    hc = dup[0];
    ok = shoal_ledger_commit(l, &hc, 1, NULL, 0) == SHOAL_OK;
    {
        int64_t la = shoal_ledger_last_minute(l, "multi", "j", "node-a");
        int64_t lc = shoal_ledger_last_minute(l, "multi", "j", "node-c");
        int64_t ld = shoal_ledger_last_minute(l, "multi", "j", "node-d");
        int64_t lany = shoal_ledger_last_minute(l, "multi", "j", NULL);

        tap_ok(ok && la == m && lc == m + 60 && ld == -1 && lany == m + 60,
               "last minute per host (node-a %lld, node-c %lld, node-d %lld, any %lld)",
               (long long)la, (long long)lc, (long long)ld, (long long)lany);
    }
    r[0].seq = r[1].seq = 0;
    ok = shoal_ledger_commit(l, r, 2, NULL, 0) == SHOAL_OK && r[0].seq != 0;
    tap_ok(ok, "the exact replay of the two hosts' commit writes nothing (seq %" PRIu64 ")",
           r[0].seq);
    {
        uint8_t vmac[32], hmac[32];
        uint64_t vseq = 0, hseq = 0;

        ok = shoal_ledger_verify_head(l, &bad, &vseq, vmac) == SHOAL_OK &&
             shoal_ledger_head(l, &hseq, hmac) == SHOAL_OK && vseq == hseq && vseq == hc.seq &&
             memcmp(vmac, hmac, 32) == 0 && memcmp(vmac, hc.mac, 32) == 0;
        tap_ok(ok, "the chain with hosts verifies, up to the head it names (seq %" PRIu64 ")",
               vseq);
    }
    snprintf(sql, sizeof(sql), "UPDATE ledger_records SET host = 'node-b' WHERE seq = %" PRIu64,
             hc.seq);
    snprintf(undo, sizeof(undo), "UPDATE ledger_records SET host = 'node-c' WHERE seq = %"
             PRIu64, hc.seq);
    tamper_case(l, "a record moved to another host", sql, undo, hc.seq);
}

/* A ledger of version 1 (no host column, one record per job and minute): a reader refuses it
 * and says who upgrades it; a writer's open upgrades it in place, keeping every record, and
 * the chain still verifies (an empty host adds nothing to a MAC). */
static void test_migrate_v1(shoal_ledger_t **lp)
{
    shoal_ledger_t *r = NULL;
    uint64_t head = 0, head2 = 0, bad = 0;
    shoal_ledger_record_t rec;
    collect_t before, after = {0};
    shoal_status_t st;
    int ok;

    ok = collect(*lp, INT64_MIN, INT64_MAX, NULL, NULL, &before) == 0 &&
         shoal_ledger_head(*lp, &head, NULL) == SHOAL_OK && head > 0;
    shoal_ledger_close(*lp);
    *lp = NULL;
    ok = ok && tamper("CREATE TABLE v1 AS SELECT seq, tenant, job, class, minute, gpu_seconds,"
                      " bytes_same_host, bytes_cross_host, ops, coll_seconds, failed_platform,"
                      " failed_tenant, mac FROM ledger_records;"
                      "DROP TABLE ledger_records;"
                      "CREATE TABLE ledger_records (seq BIGINT PRIMARY KEY, tenant TEXT NOT NULL,"
                      " job TEXT NOT NULL, class TEXT NOT NULL, minute BIGINT NOT NULL,"
                      " gpu_seconds DOUBLE PRECISION NOT NULL, bytes_same_host BIGINT NOT NULL,"
                      " bytes_cross_host BIGINT NOT NULL, ops BIGINT NOT NULL,"
                      " coll_seconds DOUBLE PRECISION NOT NULL, failed_platform BIGINT NOT NULL,"
                      " failed_tenant BIGINT NOT NULL, mac TEXT NOT NULL,"
                      " UNIQUE (tenant, job, minute));"
                      "INSERT INTO ledger_records SELECT * FROM v1;"
                      "DROP TABLE v1;"
                      "CREATE INDEX ledger_records_minute ON ledger_records (minute);"
                      "UPDATE ledger_meta SET value = '1' WHERE name = 'schema_version'") == 0;
    tap_ok(ok, "the test made a version 1 ledger (%" PRIu64 " records)", before.count);
    st = shoal_ledger_open_reader(test_url, test_key, sizeof(test_key) - 1, &r);
    tap_ok(st == SHOAL_ERR_UNSUPPORTED && log_has("upgrades it when it opens it"),
           "a reader refuses version 1 and says that shoald upgrades it (status %d)", (int)st);
    if (r != NULL && st == SHOAL_OK)
        shoal_ledger_close(r);
    st = shoal_ledger_open(test_url, test_key, sizeof(test_key) - 1, lp);
    if (st != SHOAL_OK)
        tap_bail("the writer's open of a version 1 ledger failed: %d", (int)st);
    ok = log_has("upgraded from schema version 1 to 2") &&
         collect(*lp, INT64_MIN, INT64_MAX, NULL, NULL, &after) == 0 &&
         after.count == before.count && after.n == before.n &&
         memcmp(after.r, before.r, sizeof(after.r[0]) * (size_t)after.n) == 0 &&
         shoal_ledger_head(*lp, &head2, NULL) == SHOAL_OK && head2 == head;
    tap_ok(ok, "a writer's open upgrades it: %" PRIu64 " records, the same, head seq %" PRIu64,
           after.count, head2);
    tap_ok(shoal_ledger_verify(*lp, &bad) == SHOAL_OK, "the upgraded chain verifies");
    rec = before.r[0];
    snprintf(rec.host, sizeof(rec.host), "node-z");
    rec.seq = 0;
    tap_ok(shoal_ledger_commit(*lp, &rec, 1, NULL, 0) == SHOAL_OK &&
               shoal_ledger_last_minute(*lp, rec.tenant, rec.job, "node-q") >= rec.minute,
           "then another host's record of a version 1 minute is taken, and a version 1 "
           "record counts as every host's last minute");
}

/* The job stored with a cursor, and the listing of a host's open pages (what a restarted
 * agent waits for, src/agent/agent_minute.c rejoin_wait); a ledger that an older agent wrote
 * lacks the table: a reader still opens it, a writer adds it. */
static void test_cursor_jobs(shoal_ledger_t *l)
{
    static const char *const keys[] = {"hostx:11:7:0:100", "hostx:12:7:1:100",
                                       "hostx_y:13:7:0:100", "hosty:14:7:0:100",
                                       "hostx:15:7:2:100"};
    shoal_ledger_cursor_t c[5];
    shoal_ledger_t *l2 = NULL, *rd = NULL;
    listed_t got;

    for (int i = 0; i < 5; i++) {
        c[i] = cursor_make(keys[i], 3, 2);
        if (i < 4) { /* the last one: a cursor without its job (an older agent's) */
            snprintf(c[i].tenant, sizeof(c[i].tenant), "t%d", i);
            snprintf(c[i].job, sizeof(c[i].job), "job%d", i);
        }
    }
    tap_is_int(shoal_ledger_commit(l, NULL, 0, c, 5), SHOAL_OK,
               "cursors with their jobs (and one without) committed");
    tap_ok(list_cursors(l, "hostx:", &got) == 0 && got.n == 2 &&
           strcmp(got.text, "hostx:11:7:0:100=t0/job0 hostx:12:7:1:100=t1/job1 ") == 0,
           "the open pages of host hostx, with their jobs, in key order (%s)", got.text);
    tap_ok(list_cursors(l, "hostx_", &got) == 0 && got.n == 1 &&
           strcmp(got.text, "hostx_y:13:7:0:100=t2/job2 ") == 0,
           "a prefix is matched as text, not as a LIKE pattern (%s)", got.text);
    c[0].ncounters = -1;
    c[1].ncounters = 5; /* moved on: the job stays */
    snprintf(c[1].tenant, sizeof(c[1].tenant), "other");
    tap_is_int(shoal_ledger_commit(l, NULL, 0, c, 2), SHOAL_OK, "one page done, one moved on");
    tap_ok(list_cursors(l, "hostx:", &got) == 0 && got.n == 1 &&
           strcmp(got.text, "hostx:12:7:1:100=t1/job1 ") == 0,
           "a deleted cursor leaves the list; a key's job is the one first stored (%s)",
           got.text);
    c[2].tenant[0] = '\0';
    snprintf(c[2].job, sizeof(c[2].job), "half");
    tap_is_int(shoal_ledger_commit(l, NULL, 0, &c[2], 1), SHOAL_ERR_INVALID_ARG,
               "a cursor with a job but no tenant is refused");
    tap_ok(tamper("DROP TABLE ledger_cursor_jobs") == 0 &&
           shoal_ledger_open(test_url, NULL, 0, &rd) == SHOAL_OK,
           "a reader opens a ledger without the table of cursor jobs (an older agent's)");
    if (rd != NULL) {
        tap_is_int(shoal_ledger_cursor_list(rd, "hostx:", list_cb, &got), SHOAL_ERR_INVALID_ARG,
                   "a reader cannot list the open pages");
        shoal_ledger_close(rd);
    }
    tap_ok(shoal_ledger_open(test_url, test_key, sizeof(test_key) - 1, &l2) == SHOAL_OK &&
           list_cursors(l2, "hostx:", &got) == 0 && got.n == 0,
           "a writer's open adds the table back (empty: those jobs are not known)");
    if (l2 != NULL)
        shoal_ledger_close(l2);
    for (int i = 0; i < 5; i++) {
        c[i].ncounters = -1;
        c[i].tenant[0] = c[i].job[0] = '\0';
    }
    tap_is_int(shoal_ledger_commit(l, NULL, 0, c, 5), SHOAL_OK, "the cursors removed");
}

/* ---- kill -9 of a writer ------------------------------------------------------------------- */

#define KILL_JOBS 3
#define KILL_COUNTERS 5

/* Commits k = K+1, K+2, ... : KILL_JOBS records of minute KILL_MINUTE0 + 60 k and the cursors
 * "kill/a" = (k, 2k, ..) and "kill/b" = (k); never returns. */
static void kill_writer(void)
{
    shoal_ledger_cursor_t cur[2];
    shoal_ledger_record_t recs[KILL_JOBS];
    shoal_ledger_t *l;
    uint64_t k = 0;

    if (shoal_ledger_open(test_url, test_key, sizeof(test_key) - 1, &l) != SHOAL_OK)
        _exit(3);
    if (shoal_ledger_cursor(l, "kill/a", &cur[0]) == SHOAL_OK)
        k = cur[0].counters[0];
    for (int iter = 0; iter < 100000; iter++) {
        k++;
        for (int j = 0; j < KILL_JOBS; j++) {
            char job[16];

            snprintf(job, sizeof(job), "job-%d", j);
            recs[j] = rec_make("killme", job, KILL_MINUTE0 + 60 * (int64_t)k, (int)(k % 7));
        }
        cur[0] = cursor_make("kill/a", k, KILL_COUNTERS);
        cur[1] = cursor_make("kill/b", k, 1);
        if (shoal_ledger_commit(l, recs, KILL_JOBS, cur, 2) != SHOAL_OK)
            _exit(4);
    }
    _exit(0);
}

static void test_kill9(shoal_ledger_t *l, unsigned seed)
{
    const int rounds = 8;
    int consistent = 1, chain = 1, died = 1;
    uint64_t k = 0, prev = 0, bad = 0;

    srand(seed);
    for (int r = 0; r < rounds; r++) {
        shoal_ledger_cursor_t a, b;
        collect_t c;
        int wst = 0;
        pid_t pid;

        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid == 0)
            kill_writer();
        shoal_sleep_us(30000 + (unsigned)(rand() % 250) * 1000);
        kill(pid, SIGKILL);
        waitpid(pid, &wst, 0);
        if (!WIFSIGNALED(wst) || WTERMSIG(wst) != SIGKILL) {
            tap_diag("round %d: the writer ended by itself (status %d)", r, wst);
            died = 0;
        }
        if (shoal_ledger_verify(l, &bad) != SHOAL_OK) {
            tap_diag("round %d: the chain is broken at seq %" PRIu64, r, bad);
            chain = 0;
        }
        k = 0;
        if (shoal_ledger_cursor(l, "kill/a", &a) == SHOAL_OK) {
            k = a.counters[0];
            for (int i = 0; i < KILL_COUNTERS; i++)
                consistent &= a.ncounters == KILL_COUNTERS && a.counters[i] == k * (i + 1u);
            consistent &= shoal_ledger_cursor(l, "kill/b", &b) == SHOAL_OK &&
                          b.counters[0] == k;
        }
        /* every committed minute has all its records, none beyond the cursor */
        consistent &= collect(l, INT64_MIN, INT64_MAX, "killme", NULL, &c) == 0 &&
                      c.count == KILL_JOBS * k;
        for (int j = 0; j < KILL_JOBS; j++) {
            char job[16];

            snprintf(job, sizeof(job), "job-%d", j);
            consistent &= shoal_ledger_last_minute(l, "killme", job, NULL) ==
                          (k > 0 ? KILL_MINUTE0 + 60 * (int64_t)k : -1);
        }
        tap_diag("round %d: %" PRIu64 " commits stored (+%" PRIu64 ")", r, k, k - prev);
        prev = k;
    }
    tap_ok(died, "the writer was killed by SIGKILL in each of %d rounds", rounds);
    tap_ok(chain, "after each kill -9 the chain verifies");
    tap_ok(consistent, "after each kill -9 the records are there iff their cursors are "
           "(%" PRIu64 " commits of %d records)", k, KILL_JOBS);
    tap_ok(k > (uint64_t)rounds, "the writers made progress (%" PRIu64 " commits)", k);
}

/* ---- the database gone --------------------------------------------------------------------- */

static void check_nothing_lost(shoal_ledger_t *l, const char *tenant, int64_t minute,
                               const char *ckey, const char *what)
{
    shoal_ledger_cursor_t got;
    uint64_t bad = 0;

    tap_ok(shoal_ledger_last_minute(l, tenant, "j", NULL) == minute &&
           shoal_ledger_cursor(l, ckey, &got) == SHOAL_OK && got.counters[0] == 42 &&
           shoal_ledger_verify(l, &bad) == SHOAL_OK, "%s: the retried commit is stored, "
           "the chain verifies", what);
}

static void test_down_sqlite(shoal_ledger_t *l)
{
    shoal_ledger_record_t r = rec_make("outage", "j", MINUTE0, 1);
    shoal_ledger_cursor_t cur = cursor_make("outage/1", 42, 2), got;
    char moved[4200];

    if (geteuid() == 0) {
        tap_skip(3, "root ignores file modes");
    } else {
        chmod(test_path, 0444);
        tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_ERR_TRANSPORT,
                   "database file made read-only: SHOAL_ERR_TRANSPORT");
        chmod(test_path, 0644);
        tap_ok(shoal_ledger_last_minute(l, "outage", "j", NULL) == -1 &&
               shoal_ledger_cursor(l, cur.key, &got) == SHOAL_ERR_INVALID_ARG,
               "... nothing of it was written");
        tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_OK, "writable again: retry ok");
    }
    r = rec_make("outage2", "j", MINUTE0, 2);
    cur = cursor_make("outage/2", 42, 2);
    snprintf(moved, sizeof(moved), "%s.away", test_dir);
    if (rename(test_dir, moved) != 0) {
        tap_ok(0, "rename %s: %s", test_dir, strerror(errno));
        return;
    }
    tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_ERR_TRANSPORT,
               "database directory moved away: SHOAL_ERR_TRANSPORT");
    tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_ERR_TRANSPORT,
               "... and again (no new empty ledger is created in its place)");
    tap_ok(access(test_path, F_OK) != 0, "... nothing was created at the old path");
    if (rename(moved, test_dir) != 0) {
        tap_ok(0, "rename back %s: %s", moved, strerror(errno));
        return;
    }
    tap_ok(shoal_ledger_last_minute(l, "outage2", "j", NULL) == -1 &&
           shoal_ledger_cursor(l, cur.key, &got) == SHOAL_ERR_INVALID_ARG,
           "directory back: nothing of the failed commit was written");
    tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_OK, "the retried commit succeeds");
    check_nothing_lost(l, "outage2", MINUTE0, cur.key, "directory back");
}

static void test_down_pg(shoal_ledger_t *l)
{
    shoal_ledger_record_t r = rec_make("outage", "j", MINUTE0, 1);
    shoal_ledger_cursor_t cur = cursor_make("outage/1", 42, 2), got;

    if (getenv("LEDGER_TEST_STOP") == NULL || getenv("LEDGER_TEST_START") == NULL) {
        tap_skip(6, "LEDGER_TEST_STOP/START not given");
        return;
    }
    tap_ok(run_cmd("stopping the server", "LEDGER_TEST_STOP") == 0, "the server is stopped");
    tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_ERR_TRANSPORT,
               "server down: SHOAL_ERR_TRANSPORT");
    tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_ERR_TRANSPORT,
               "... again (the reconnect fails too, within its timeout)");
    /* the job's last minute cannot be read: a failure, not "none" (the agent billed a minute
     * the ledger held, and its commit moved it later) */
    int64_t last = 12345;
    shoal_status_t lst = shoal_ledger_last_minute_get(l, "acme", "train-1", NULL, &last);
    tap_ok(lst == SHOAL_ERR_TRANSPORT && last == 12345, "... a job's last minute is a failure "
           "too, not 'none' (%s)", shoal_status_name(lst));
    tap_ok(run_cmd("starting the server", "LEDGER_TEST_START") == 0, "the server is back");
    tap_ok(shoal_ledger_last_minute(l, "outage", "j", NULL) == -1 &&
           shoal_ledger_cursor(l, cur.key, &got) == SHOAL_ERR_INVALID_ARG,
           "nothing of the failed commits was written");
    tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_OK,
               "the retried commit reconnects and succeeds");
    check_nothing_lost(l, "outage", MINUTE0, cur.key, "server back");
    /* a restart between two calls: the stale connection is noticed and replaced */
    r = rec_make("outage", "j", MINUTE0 + 60, 2);
    tap_ok(run_cmd("stopping", "LEDGER_TEST_STOP") == 0 &&
           run_cmd("starting", "LEDGER_TEST_START") == 0, "the server restarted");
    tap_is_int(shoal_ledger_commit(l, &r, 1, &cur, 1), SHOAL_OK,
               "the next commit after a restart succeeds at once");
}

/* PostgreSQL: a read longer than statement_timeout (30 s). The rows came from one statement,
 * which the server cancelled after 30 s (SQLSTATE 57014): a report or verify of some 20
 * million records failed every time. Here 36000 rows taken at about 1 ms each. */
typedef struct {
    uint64_t n;
    double sum;
} slow_t;

static int slow_cb(const shoal_ledger_record_t *rec, void *arg)
{
    slow_t *s = arg;
    struct timespec ts = {.tv_nsec = 1000000};

    s->n++;
    s->sum += rec->gpu_seconds;
    nanosleep(&ts, NULL);
    return 0;
}

static void test_long_read_pg(shoal_ledger_t *l)
{
    slow_t s = {0};
    shoal_status_t status;

    if (tamper("INSERT INTO ledger_records SELECT 1000000000000 + g, 'bulk', 'j', 'reserved',"
               " 1796083200::bigint + 60 * g, 1.5, 1, 1, 1, 1, 0, 0, repeat('0', 64)"
               " FROM generate_series(1, 36000) g") != 0) {
        tap_ok(0, "36000 rows of tenant bulk inserted");
        return;
    }
    status = shoal_ledger_each(l, INT64_MIN, INT64_MAX, "bulk", NULL, slow_cb, &s);
    tap_ok(status == SHOAL_OK && s.n == 36000 && s.sum == 54000.0,
           "a read of 36000 rows that takes longer than statement_timeout gets them all "
           "(status %d, %" PRIu64 " rows)", (int)status, s.n);
    tap_ok(tamper("DELETE FROM ledger_records WHERE tenant = 'bulk'") == 0, "the rows removed");
}

/* The password of a libpq URL as log lines show it: ***. A '?' in the password ended the
 * search for user:password@ (libpq reads on to the '@'), and the URL was logged as written. */
static void test_url_redact(void)
{
    static const char *const cases[][2] = {
        {"postgresql://shoal:pw@host:5432/db?password=pw2",
         "postgresql://shoal:***@host:5432/db?password=***"},
        {"postgresql://shoal:Ab?Secret@127.0.0.1:1/billing",
         "postgresql://shoal:***@127.0.0.1:1/billing"},
        {"postgres://shoal:a?b@c@host?sslmode=require", "postgres://shoal:***@host?sslmode=require"},
        {"postgresql://shoal:pw@host:5432?password=x@y",
         "postgresql://shoal:***@host:5432?password=***"},
        {"postgresql://shoal@host?password=x@y", "postgresql://shoal@host?password=***"},
        {"postgresql:///db?host=/run/pg&password=p", "postgresql:///db?host=/run/pg&password=***"},
        {"postgresql://shoal:Xq7/Zr9@127.0.0.1:5432/db",
         "postgresql://shoal:***@127.0.0.1:5432/db"},
        /* the password of the client certificate's key (libpq 13+): logged as written */
        {"postgresql://shoal@host/db?sslmode=verify-full&sslpassword=keypw",
         "postgresql://shoal@host/db?sslmode=verify-full&sslpassword=***"},
        {"postgresql://shoal@host/db?sslpassword=kp&password=pw",
         "postgresql://shoal@host/db?sslpassword=***&password=***"},
        /* libpq's key=value form allows blanks around '=' (refused by open, but logged) */
        {"host=db password = pw dbname=billing", "host=db password = *** dbname=billing"},
        {"host=db password= 'p w' user=x", "host=db password= *** user=x"},
    };
    shoal_ledger_t *l = NULL;
    char buf[256];

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(cases); i++) {
        shoal_ledger_url_redact(cases[i][0], buf, sizeof(buf));
        tap_ok(strcmp(buf, cases[i][1]) == 0, "redacted %s: %s", cases[i][0], buf);
    }
    /* libpq read "shoal:Xq7" as host and port, "Zr9@127.0.0.1:5432/db" as the database, and
     * its error (logged) named both pieces */
    tap_ok(shoal_ledger_open("postgresql://shoal:Xq7/Zr9@127.0.0.1:1/db", test_key,
                             sizeof(test_key) - 1, &l) == SHOAL_ERR_INVALID_ARG &&
               log_has("percent-encode '/' as %2F") && !log_has("Xq7") && !log_has("Zr9"),
           "a '/' in a PostgreSQL URL's password is refused, its pieces never logged");
    if (l != NULL)
        shoal_ledger_close(l);
    l = NULL;
    /* libpq's key=value form was taken for an SQLite file name: made in the working directory
     * and billed into, or its open failed with the password in the log line */
    tap_ok(shoal_ledger_open("host=/nonexistent-shoal dbname=billing password=Kv8s3cret",
                             test_key, sizeof(test_key) - 1, &l) == SHOAL_ERR_INVALID_ARG &&
               log_has("key=value") && !log_has("Kv8s3cret"),
           "a libpq key=value string is refused, not taken for an SQLite path, its password "
           "never logged");
    if (l != NULL)
        shoal_ledger_close(l);
}

static void test_log_lines(void)
{
    char buf[1 << 16];
    FILE *fp = fopen(test_log, "r");
    size_t n = 0;

    if (fp != NULL) {
        n = fread(buf, 1, sizeof(buf) - 1, fp);
        fclose(fp);
    }
    buf[n] = '\0';
    tap_ok(strstr(buf, test_pg ? "connection is lost" : "moved or replaced") != NULL,
           "the log says why the database failed");
    tap_ok(strstr(buf, "is recorded already") != NULL, "the log names the duplicate minute");
    tap_ok(strstr(buf, (const char *)test_key) == NULL && strstr(buf, "3f9a0c17") == NULL,
           "the log never shows the key");
}

int main(int argc, char **argv)
{
    shoal_ledger_t *l;
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    char *slash;

    if (argc != 2) {
        fprintf(stderr, "usage: test_ledger sqlite:///DIR/ledger.db | postgresql://...\n");
        return 2;
    }
    test_url = argv[1];
    test_pg = strncmp(test_url, "postgres", 8) == 0;
    if (!test_pg) {
        snprintf(test_path, sizeof(test_path), "%s", test_url + strlen("sqlite://"));
        snprintf(test_dir, sizeof(test_dir), "%s", test_path);
        slash = strrchr(test_dir, '/');
        if (slash != NULL)
            *slash = '\0';
        snprintf(test_log, sizeof(test_log), "%s.log", test_dir);
    } else {
        snprintf(test_log, sizeof(test_log), "%s/test_ledger_pg.%d.log",
                 getenv("LEDGER_TEST_LOGDIR") != NULL ? getenv("LEDGER_TEST_LOGDIR") : "/tmp",
                 (int)getpid());
    }
    unlink(test_log);
    setenv("SHOAL_DEBUG", "INFO", 1);
    setenv("SHOAL_DEBUG_FILE", test_log, 1);
    shoal_config_global_init();
    tap_diag("%s ledger, kill seed %u", test_pg ? "PostgreSQL" : "SQLite", seed);

    if (shoal_ledger_open(test_url, test_key, sizeof(test_key) - 1, &l) != SHOAL_OK)
        tap_bail("cannot open the ledger %s", test_pg ? "(PostgreSQL)" : test_path);
    test_round_trips(l);
    test_duplicates(l);
    test_tampering(l);
    test_reader();
    test_reader_key();
    test_reader_readonly();
    test_cursor_jobs(l);
    test_migrate_v1(&l);
    test_hosts(l);
    test_kill9(l, seed);
    if (test_pg) {
        test_down_pg(l);
        test_long_read_pg(l);
    } else {
        test_down_sqlite(l);
    }
    shoal_ledger_close(l);
    test_url_redact();
    test_log_lines();
    if (test_pg)
        unlink(test_log);
    return tap_done();
}
