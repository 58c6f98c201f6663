/* The ledger's backends (SQLite, PostgreSQL) behind one small ops table; ledger.c holds the
 * chain, the transaction logic and everything else that is the same for both. */
#ifndef SHOAL_AGENT_LEDGER_INT_H
#define SHOAL_AGENT_LEDGER_INT_H

#include "agent/ledger.h"
#include "util/util.h"

#define SHOAL_LEDGER_SCHEMA_VERSION 2
#define SHOAL_LEDGER_MAC_HEX (2 * SHOAL_HMAC_BYTES + 1)

/* The schema, the same text for both backends: statements separated by ';'. Integers are
 * BIGINT (a uint64 counter is stored as the int64 with the same bits), the MAC as lowercase
 * hex, a cursor's counters as decimal numbers separated by ','. */
extern SHOAL_HIDDEN const char *const shoal_ledger_schema_sql[];
extern SHOAL_HIDDEN const size_t shoal_ledger_schema_nsql;
/* What a writer runs, in the schema's transaction, on a ledger of version 1 (ends at 2). */
extern SHOAL_HIDDEN const char *const shoal_ledger_migrate_v1_sql[];
extern SHOAL_HIDDEN const size_t shoal_ledger_migrate_v1_nsql;

/* The statements, the same text for both backends (PostgreSQL reads ?N as $N). Each is
 * prepared once per connection with parameters: no SQL is ever built from names. */
typedef enum {
    SHOAL_LEDGER_SQL_HEAD_GET,    /* -> name, value */
    SHOAL_LEDGER_SQL_META_SET,    /* ?1 value, ?2 name */
    SHOAL_LEDGER_SQL_FIND,        /* ?1 tenant, ?2 job, ?3 host, ?4 minute -> record columns */
    SHOAL_LEDGER_SQL_INSERT,      /* ?1..?14: the record columns */
    SHOAL_LEDGER_SQL_CURSOR_PUT,  /* ?1 key, ?2 counters */
    SHOAL_LEDGER_SQL_CURSOR_DEL,  /* ?1 key */
    SHOAL_LEDGER_SQL_CURSOR_GET,  /* ?1 key -> counters */
    SHOAL_LEDGER_SQL_LAST_MINUTE, /* ?1 tenant, ?2 job, ?3 host or NULL -> max(minute) */
    SHOAL_LEDGER_SQL_EACH,        /* ?1 from, ?2 to, ?3 tenant or NULL, ?4 job or NULL */
    SHOAL_LEDGER_SQL_META_GET,    /* ?1 name -> value */
    /* writers only (a reader of a ledger that an older agent wrote may not have the table) */
    SHOAL_LEDGER_SQL_CURSOR_JOB_PUT, /* ?1 key, ?2 tenant, ?3 job */
    SHOAL_LEDGER_SQL_CURSOR_JOB_DEL, /* ?1 key */
    SHOAL_LEDGER_SQL_CURSOR_LIST, /* ?1 key prefix -> key, tenant, job */
    SHOAL_LEDGER_SQL_COUNT
} shoal_ledger_sql_t;
extern SHOAL_HIDDEN const char *const shoal_ledger_sql[SHOAL_LEDGER_SQL_COUNT];
/* The columns of a record, in the order FIND and EACH return them and INSERT takes them. */
#define SHOAL_LEDGER_NCOLS 14

/* A backend. Every function returns SHOAL_OK, SHOAL_ERR_TRANSPORT (the database is unreachable,
 * unwritable or lost the connection: logged by the backend, the transaction is gone) or another
 * error (logged). begin() starts a write transaction that serialises writers (SQLite: BEGIN
 * IMMEDIATE; PostgreSQL: the head row locked FOR UPDATE); the record and cursor calls between
 * begin() and commit() are part of it. each() streams rows in seq order; its callback must not
 * call the backend. */
typedef struct {
    const char *name;
    /* writer 0 (a reader: reports): no file or table is created, only the version checked */
    shoal_status_t (*open)(const char *url, int writer, void **be_p);
    void (*close)(void *be);
    shoal_status_t (*begin)(void *be);
    shoal_status_t (*commit)(void *be);
    void (*rollback)(void *be);
    shoal_status_t (*head_get)(void *be, uint64_t *seq_p, uint8_t mac[SHOAL_HMAC_BYTES]);
    shoal_status_t (*head_set)(void *be, uint64_t seq, const uint8_t mac[SHOAL_HMAC_BYTES]);
    shoal_status_t (*record_find)(void *be, const char *tenant, const char *job,
                                  const char *host, int64_t minute, shoal_ledger_record_t *rec_p,
                                  int *found_p);
    shoal_status_t (*record_insert)(void *be, const shoal_ledger_record_t *rec);
    /* with the cursor's job, when it names one (the job of a key never changes) */
    shoal_status_t (*cursor_put)(void *be, const shoal_ledger_cursor_t *cursor);
    /* with its job */
    shoal_status_t (*cursor_del)(void *be, const char *key);
    /* writer only: the cursors whose key starts with prefix and whose job is known */
    shoal_status_t (*cursor_list)(void *be, const char *prefix, shoal_ledger_cursor_cb_t cb,
                                  void *arg);
    shoal_status_t (*cursor_get)(void *be, const char *key, shoal_ledger_cursor_t *cursor_p,
                                 int *found_p);
    shoal_status_t (*last_minute)(void *be, const char *tenant, const char *job,
                                  const char *host, int64_t *minute_p);
    shoal_status_t (*each)(void *be, int64_t from, int64_t to, const char *tenant,
                           const char *job, shoal_ledger_each_cb_t cb, void *arg);
} shoal_ledger_ops_t;

#if SHOAL_HAVE_SQLITE3
extern SHOAL_HIDDEN const shoal_ledger_ops_t shoal_ledger_sqlite_ops;
#endif
#if SHOAL_HAVE_LIBPQ
extern SHOAL_HIDDEN const shoal_ledger_ops_t shoal_ledger_pg_ops;
#endif

/* Shared codecs (ledger.c). */
SHOAL_HIDDEN void shoal_ledger_mac_to_hex(const uint8_t mac[SHOAL_HMAC_BYTES],
                                          char hex[SHOAL_LEDGER_MAC_HEX]);
/* 0 on success, -1 when hex is not 64 hex digits. */
SHOAL_HIDDEN int shoal_ledger_mac_from_hex(const char *hex, uint8_t mac[SHOAL_HMAC_BYTES]);
/* The head's seq as stored (decimal digits, at most INT64_MAX: the BIGINT seq column); -1 when
 * it is not one. */
SHOAL_HIDDEN int shoal_ledger_seq_parse(const char *text, uint64_t *seq_p);
/* "c0,c1,...": 0 on success, -1 when buf is too small. */
SHOAL_HIDDEN int shoal_ledger_counters_format(const shoal_ledger_cursor_t *cursor, char *buf,
                                              size_t len);
SHOAL_HIDDEN int shoal_ledger_counters_parse(const char *text, shoal_ledger_cursor_t *cursor);
/* Copies a text column into a fixed field; -1 when it does not fit. */
SHOAL_HIDDEN int shoal_ledger_copy_text(char *dst, size_t size, const char *src);
#define SHOAL_LEDGER_COUNTERS_TEXT (64 * 21 + 1)

#endif
