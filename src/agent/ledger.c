/* The billing ledger (src/agent/ledger.h): the HMAC chain, the commit transaction and the
 * verification, the same for every backend. The backends (ledger_sqlite.c, ledger_pg.c) only
 * move rows.
 *
 * Chain: mac(seq) = HMAC-SHA256(key, mac(seq - 1) | canonical(record incl. seq)), mac(0) = 32
 * zero bytes. The head (last seq, its mac) is kept in ledger_meta and moved in the commit's
 * transaction, so a dropped last record is detected too. */
#include "agent/ledger_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOAL_LEDGER_KEY_MAX 1024
#define SHOAL_LEDGER_DOMAIN "shoal-ledger-v1"

struct shoal_ledger {
    const shoal_ledger_ops_t *ops;
    void *be;
    uint8_t *key;                      /* NULL: no verify (a reader without the key) */
    size_t keylen;
    int writer;                        /* 0 for a reader (reports, verify): no commit */
};

/* Version 2: the host that billed a record (agents on the hosts of one job share the ledger,
 * each bills its own ranks: one record per host). Version 1 had one record per minute of a
 * job, and the second host's agent moved its minute after the first's, so that a job's
 * minutes drifted into the future. */
#define SHOAL_LEDGER_RECORDS_TABLE \
    "CREATE TABLE IF NOT EXISTS ledger_records (" \
    " seq BIGINT PRIMARY KEY," \
    " tenant TEXT NOT NULL," \
    " job TEXT NOT NULL," \
    " class TEXT NOT NULL," \
    " minute BIGINT NOT NULL," \
    " gpu_seconds DOUBLE PRECISION NOT NULL," \
    " bytes_same_host BIGINT NOT NULL," \
    " bytes_cross_host BIGINT NOT NULL," \
    " ops BIGINT NOT NULL," \
    " coll_seconds DOUBLE PRECISION NOT NULL," \
    " failed_platform BIGINT NOT NULL," \
    " failed_tenant BIGINT NOT NULL," \
    " mac TEXT NOT NULL," \
    " host TEXT NOT NULL DEFAULT ''," \
    " UNIQUE (tenant, job, host, minute))"

const char *const shoal_ledger_schema_sql[] = {
    "CREATE TABLE IF NOT EXISTS ledger_meta ("
    " name TEXT PRIMARY KEY,"
    " value TEXT NOT NULL)",
    SHOAL_LEDGER_RECORDS_TABLE,
    "CREATE INDEX IF NOT EXISTS ledger_records_minute ON ledger_records (minute)",
    "CREATE TABLE IF NOT EXISTS ledger_cursors ("
    " key TEXT PRIMARY KEY,"
    " counters TEXT NOT NULL)",
    /* the job of each cursor (added after version 1's first release: created by a writer's
     * open where it is missing; a cursor without a row here has an unknown job) */
    "CREATE TABLE IF NOT EXISTS ledger_cursor_jobs ("
    " key TEXT PRIMARY KEY,"
    " tenant TEXT NOT NULL,"
    " job TEXT NOT NULL)",
    "INSERT INTO ledger_meta (name, value) VALUES ('schema_version', '2')"
    " ON CONFLICT (name) DO NOTHING",
    "INSERT INTO ledger_meta (name, value) VALUES ('head_seq', '0') ON CONFLICT (name) DO NOTHING",
    "INSERT INTO ledger_meta (name, value) VALUES ('head_mac',"
    " '0000000000000000000000000000000000000000000000000000000000000000')"
    " ON CONFLICT (name) DO NOTHING",
};
const size_t shoal_ledger_schema_nsql = SHOAL_ARRAY_SIZE(shoal_ledger_schema_sql);

#define SHOAL_LEDGER_COLS1 "seq, tenant, job, class, minute, gpu_seconds, bytes_same_host, " \
    "bytes_cross_host, ops, coll_seconds, failed_platform, failed_tenant, mac"
#define SHOAL_LEDGER_COLS SHOAL_LEDGER_COLS1 ", host"

/* Version 1 to 2, in the schema's transaction: the table is made again (a UNIQUE constraint
 * cannot be changed in place in SQLite), its records kept with the host '' (one agent's, as
 * they were), which their MACs cover as they did (an empty host adds nothing). */
const char *const shoal_ledger_migrate_v1_sql[] = {
    "ALTER TABLE ledger_records RENAME TO ledger_records_v1",
    SHOAL_LEDGER_RECORDS_TABLE,
    "INSERT INTO ledger_records (" SHOAL_LEDGER_COLS ") SELECT " SHOAL_LEDGER_COLS1 ", ''"
    " FROM ledger_records_v1",
    "DROP TABLE ledger_records_v1",
    "CREATE INDEX IF NOT EXISTS ledger_records_minute ON ledger_records (minute)",
    "UPDATE ledger_meta SET value = '2' WHERE name = 'schema_version'",
};
const size_t shoal_ledger_migrate_v1_nsql = SHOAL_ARRAY_SIZE(shoal_ledger_migrate_v1_sql);

const char *const shoal_ledger_sql[SHOAL_LEDGER_SQL_COUNT] = {
    [SHOAL_LEDGER_SQL_HEAD_GET] =
        "SELECT name, value FROM ledger_meta WHERE name IN ('head_seq', 'head_mac')",
    [SHOAL_LEDGER_SQL_META_SET] = "UPDATE ledger_meta SET value = ?1 WHERE name = ?2",
    [SHOAL_LEDGER_SQL_FIND] = "SELECT " SHOAL_LEDGER_COLS " FROM ledger_records"
                              " WHERE tenant = ?1 AND job = ?2 AND host = ?3 AND minute = ?4",
    [SHOAL_LEDGER_SQL_INSERT] = "INSERT INTO ledger_records (" SHOAL_LEDGER_COLS ") VALUES"
                                " (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    [SHOAL_LEDGER_SQL_CURSOR_PUT] = "INSERT INTO ledger_cursors (key, counters) VALUES (?1, ?2)"
                                    " ON CONFLICT (key) DO UPDATE SET counters = ?2",
    [SHOAL_LEDGER_SQL_CURSOR_DEL] = "DELETE FROM ledger_cursors WHERE key = ?1",
    [SHOAL_LEDGER_SQL_CURSOR_GET] = "SELECT counters FROM ledger_cursors WHERE key = ?1",
    [SHOAL_LEDGER_SQL_LAST_MINUTE] =
        "SELECT MAX(minute) FROM ledger_records WHERE tenant = ?1 AND job = ?2"
        " AND (CAST(?3 AS TEXT) IS NULL OR host = ?3 OR host = '')",
    [SHOAL_LEDGER_SQL_EACH] = "SELECT " SHOAL_LEDGER_COLS " FROM ledger_records"
                              " WHERE minute >= ?1 AND minute < ?2"
                              " AND (CAST(?3 AS TEXT) IS NULL OR tenant = ?3)"
                              " AND (CAST(?4 AS TEXT) IS NULL OR job = ?4) ORDER BY seq",
    [SHOAL_LEDGER_SQL_META_GET] = "SELECT value FROM ledger_meta WHERE name = ?1",
    [SHOAL_LEDGER_SQL_CURSOR_JOB_PUT] = "INSERT INTO ledger_cursor_jobs (key, tenant, job)"
                                        " VALUES (?1, ?2, ?3) ON CONFLICT (key) DO NOTHING",
    [SHOAL_LEDGER_SQL_CURSOR_JOB_DEL] = "DELETE FROM ledger_cursor_jobs WHERE key = ?1",
    [SHOAL_LEDGER_SQL_CURSOR_LIST] = "SELECT c.key, j.tenant, j.job FROM ledger_cursors c"
                                     " JOIN ledger_cursor_jobs j ON j.key = c.key"
                                     " WHERE substr(c.key, 1, length(CAST(?1 AS TEXT))) = ?1"
                                     " ORDER BY c.key",
};

/* ---- codecs ------------------------------------------------------------------------------ */

void shoal_ledger_mac_to_hex(const uint8_t mac[SHOAL_HMAC_BYTES], char hex[SHOAL_LEDGER_MAC_HEX])
{
    static const char digits[] = "0123456789abcdef";

    for (int i = 0; i < SHOAL_HMAC_BYTES; i++) {
        hex[2 * i] = digits[mac[i] >> 4];
        hex[2 * i + 1] = digits[mac[i] & 15];
    }
    hex[2 * SHOAL_HMAC_BYTES] = '\0';
}

static int shoal_ledger_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int shoal_ledger_mac_from_hex(const char *hex, uint8_t mac[SHOAL_HMAC_BYTES])
{
    if (hex == NULL || strlen(hex) != 2 * SHOAL_HMAC_BYTES)
        return -1;
    for (int i = 0; i < SHOAL_HMAC_BYTES; i++) {
        int hi = shoal_ledger_hex_digit(hex[2 * i]);
        int lo = shoal_ledger_hex_digit(hex[2 * i + 1]);

        if (hi < 0 || lo < 0)
            return -1;
        mac[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int shoal_ledger_seq_parse(const char *text, uint64_t *seq_p)
{
    return shoal_parse_u64(text, INT64_MAX, seq_p, NULL);
}

int shoal_ledger_counters_format(const shoal_ledger_cursor_t *cursor, char *buf, size_t len)
{
    size_t off = 0;

    buf[0] = '\0';
    for (int i = 0; i < cursor->ncounters; i++) {
        int ret = snprintf(buf + off, len - off, "%s%" PRIu64, i > 0 ? "," : "",
                           cursor->counters[i]);

        if (ret < 0 || (size_t)ret >= len - off)
            return -1;
        off += (size_t)ret;
    }
    return 0;
}

int shoal_ledger_counters_parse(const char *text, shoal_ledger_cursor_t *cursor)
{
    const char *p = text;
    int n = 0;

    if (*p == '\0') {
        cursor->ncounters = 0;
        return 0;
    }
    for (;;) {
        const char *end;

        if (n >= (int)SHOAL_ARRAY_SIZE(cursor->counters) ||
            shoal_parse_u64(p, UINT64_MAX, &cursor->counters[n++], &end) != 0)
            return -1;
        if (*end == '\0')
            break;
        if (*end != ',')
            return -1;
        p = end + 1;
    }
    cursor->ncounters = n;
    return 0;
}

int shoal_ledger_copy_text(char *dst, size_t size, const char *src)
{
    size_t len = src != NULL ? strlen(src) : 0;

    if (len >= size)
        return -1;
    memcpy(dst, src != NULL ? src : "", len + 1);
    return 0;
}

static size_t shoal_ledger_put_str(uint8_t *p, const char *s)
{
    size_t len = strlen(s);

    shoal_put_le(p, len, 2);
    memcpy(p + 2, s, len);
    return 2 + len;
}

/* The bits the chain covers. A zero counts as +0.0: SQLite's REAL column gives -0.0 back as
 * 0.0, so a record committed with -0.0 seconds (commit takes it: it is not below 0) failed
 * verify although nobody altered it. */
static uint64_t shoal_ledger_double_bits(double d)
{
    uint64_t bits;

    if (d == 0)
        d = 0.0;
    memcpy(&bits, &d, sizeof(bits));
    return bits;
}

/* mac = HMAC(key, prev | domain | seq | tenant | job | class | [host] | minute | figures): the
 * host only when there is one, so that a record of version 1 (none) verifies as it did; the
 * strings are length-prefixed and the figures of fixed size, so no record with a host has the
 * bytes of one without. */
static shoal_status_t shoal_ledger_mac(const shoal_ledger_t *ledger,
                                       const uint8_t prev[SHOAL_HMAC_BYTES], uint64_t seq,
                                       const shoal_ledger_record_t *rec,
                                       uint8_t mac[SHOAL_HMAC_BYTES])
{
    uint8_t buf[SHOAL_HMAC_BYTES + sizeof(SHOAL_LEDGER_DOMAIN) + 4 * (2 + 64) + 16 * 8];
    const uint64_t fields[] = {
        (uint64_t)rec->minute, shoal_ledger_double_bits(rec->gpu_seconds), rec->bytes_same_host,
        rec->bytes_cross_host, rec->ops, shoal_ledger_double_bits(rec->coll_seconds),
        rec->failed_platform, rec->failed_tenant,
    };
    size_t off = 0;

    memcpy(buf, prev, SHOAL_HMAC_BYTES);
    off += SHOAL_HMAC_BYTES;
    memcpy(buf + off, SHOAL_LEDGER_DOMAIN, sizeof(SHOAL_LEDGER_DOMAIN));
    off += sizeof(SHOAL_LEDGER_DOMAIN);
    shoal_put_le(buf + off, seq, 8);
    off += 8;
    off += shoal_ledger_put_str(buf + off, rec->tenant);
    off += shoal_ledger_put_str(buf + off, rec->job);
    off += shoal_ledger_put_str(buf + off, rec->qos_class);
    if (rec->host[0] != '\0')
        off += shoal_ledger_put_str(buf + off, rec->host);
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(fields); i++) {
        shoal_put_le(buf + off, fields[i], 8);
        off += 8;
    }
    return shoal_hmac(ledger->key, ledger->keylen, buf, off, mac);
}

/* ---- open / close ------------------------------------------------------------------------ */

/* In a URI "scheme://user:password@host/db", the '@' a person meant to end the user part: the
 * last one before the query. NULL when there is none. */
static const char *shoal_ledger_url_userinfo_end(const char *auth)
{
    const char *query = auth + strcspn(auth, "?"), *at = NULL;

    for (const char *p = auth; p < query; p++)
        at = *p == '@' ? p : at;
    return at;
}

/* A password with '/' in it ("user:pa/ss@host/db"): libpq ends the user part at the first '/'
 * and reads "user:pa" as host and port and "ss@host/db" as the database name, so that the
 * password's pieces went into the log's connection error, and, with a number before the '/',
 * to a server of that name. */
static int shoal_ledger_url_slash_in_password(const char *url)
{
    const char *auth = strstr(url, "://"), *at;

    if (auth == NULL)
        return 0;
    auth += 3;
    at = shoal_ledger_url_userinfo_end(auth);
    return at != NULL && memchr(auth, '/', (size_t)(at - auth)) != NULL;
}

/* 1 when url starts as libpq's key=value form does ("host=db dbname=billing ..."): a keyword
 * of lowercase letters and '_', then '=' (blanks around it allowed). */
static int shoal_ledger_url_conninfo(const char *url)
{
    const char *p = url + strspn(url, " \t");
    size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz_");

    return n > 0 && p[n + strspn(p + n, " \t")] == '=';
}

static shoal_status_t shoal_ledger_backend(const char *url, const shoal_ledger_ops_t **ops_p,
                                           const char **arg_p)
{
    if (strncmp(url, "postgresql://", 13) == 0 || strncmp(url, "postgres://", 11) == 0) {
        if (shoal_ledger_url_slash_in_password(url)) {
            shoal_error(METER, "ledger: the PostgreSQL URL has a '/' before its last '@' (in the "
                        "password?): libpq would read a piece of it as the host and another as "
                        "the database; percent-encode '/' as %%2F (and '@' as %%40)");
            return SHOAL_ERR_INVALID_ARG;
        }
#if SHOAL_HAVE_LIBPQ
        *ops_p = &shoal_ledger_pg_ops;
        *arg_p = url;
        return SHOAL_OK;
#else
        shoal_error(METER, "ledger: a PostgreSQL URL, but shoal was built without libpq");
        return SHOAL_ERR_UNSUPPORTED;
#endif
    }
    if (shoal_ledger_url_conninfo(url)) {
        /* taken for an SQLite file name, it was made in the working directory (the agent's:
         * /) and billed into, or its open failed with the password in the log line */
        shoal_error(METER, "ledger: a libpq key=value string is not taken (it is not logged: "
                    "it may hold a password); write it as postgresql://USER@HOST:PORT/DB, or "
                    "sqlite:PATH for a file of that name");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (strncmp(url, "sqlite:", 7) == 0) {
        url += 7;
        if (strncmp(url, "//", 2) == 0)
            url += 2;
    } else if (strstr(url, "://") != NULL) {
        shoal_error(METER, "ledger: unknown URL scheme in '%.*s' (sqlite:///PATH, "
                    "postgresql://...)", (int)(strstr(url, "://") - url), url);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (*url == '\0') {
        shoal_error(METER, "ledger: empty SQLite path");
        return SHOAL_ERR_INVALID_ARG;
    }
#if SHOAL_HAVE_SQLITE3
    *ops_p = &shoal_ledger_sqlite_ops;
    *arg_p = url;
    return SHOAL_OK;
#else
    shoal_error(METER, "ledger: an SQLite path, but shoal was built without sqlite3");
    return SHOAL_ERR_UNSUPPORTED;
#endif
}

static shoal_status_t shoal_ledger_open_as(const char *url, const uint8_t *key, size_t keylen,
                                           int writer, shoal_ledger_t **ledger_p)
{
    const shoal_ledger_ops_t *ops;
    shoal_ledger_t *ledger;
    shoal_status_t status;
    const char *arg;

    if (url == NULL || ledger_p == NULL || keylen > SHOAL_LEDGER_KEY_MAX ||
        (key == NULL) != (keylen == 0)) {
        shoal_error(METER, "ledger: open with a bad argument (url, key of %zu bytes)", keylen);
        return SHOAL_ERR_INVALID_ARG;
    }
    status = shoal_ledger_backend(url, &ops, &arg);
    if (status != SHOAL_OK)
        return status;
    ledger = calloc(1, sizeof(*ledger));
    if (ledger == NULL)
        return SHOAL_ERR_NO_MEMORY;
    ledger->ops = ops;
    ledger->writer = writer;
    if (keylen > 0) {
        ledger->key = malloc(keylen);
        if (ledger->key == NULL) {
            status = SHOAL_ERR_NO_MEMORY;
            goto err_free;
        }
        memcpy(ledger->key, key, keylen);
        ledger->keylen = keylen;
    }
    SHOAL_CHECK_GOTO(ops->open(arg, writer, &ledger->be), status, err_free);
    *ledger_p = ledger;
    return SHOAL_OK;

err_free:
    if (ledger->key != NULL) {
        shoal_secret_wipe(ledger->key, ledger->keylen);
        free(ledger->key);
    }
    free(ledger);
    return status;
}

shoal_status_t shoal_ledger_open(const char *url, const uint8_t *key, size_t keylen,
                                 shoal_ledger_t **ledger_p)
{
    return shoal_ledger_open_as(url, key, keylen, keylen > 0, ledger_p);
}

shoal_status_t shoal_ledger_open_reader(const char *url, const uint8_t *key, size_t keylen,
                                        shoal_ledger_t **ledger_p)
{
    return shoal_ledger_open_as(url, key, keylen, 0, ledger_p);
}

/* The length of "password=" or "sslpassword=" (the password of the client certificate's key,
 * libpq 13+: it was logged as written), blanks around '=' included (libpq's key=value form
 * allows them: "password = pw" was logged as written), when a parameter of that name starts
 * at p, at the URL's start or after '?', '&' or ' '; 0 otherwise. */
static size_t shoal_ledger_url_secret_kw(const char *url, const char *p)
{
    static const char *const kws[] = {"password", "sslpassword"};

    if (p != url && strchr("?& ", p[-1]) == NULL)
        return 0;
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(kws); i++) {
        size_t n = strlen(kws[i]);

        if (strncmp(p, kws[i], n) != 0)
            continue;
        n += strspn(p + n, " \t");
        if (p[n] != '=')
            return 0;
        return n + 1 + strspn(p + n + 1, " \t");
    }
    return 0;
}

/* A libpq URL may carry the database password (user:PASSWORD@host, ?password=, or
 * password=VALUE in a key=value string) and the client key's (sslpassword=); the agent logged
 * the URL as it was, at each retry. */
void shoal_ledger_url_redact(const char *url, char *buf, size_t len)
{
    const char *auth = strstr(url, "://"), *end = NULL, *at = NULL, *colon = NULL, *p;
    size_t n = 0, kwlen;

    if (len == 0)
        return;
    if (auth != NULL) {
        /* libpq's rule: user[:password]@ is there when an '@' comes before the first '/'. A
         * '?' does not end it (libpq takes "user:pa?ss@host" with the password "pa?ss"): it
         * did here, and such a password was logged as written. */
        auth += 3;
        end = auth + strcspn(auth, "/");
        at = memchr(auth, '@', (size_t)(end - auth));
        if (at == NULL && shoal_ledger_url_slash_in_password(url)) {
            /* a '/' in the password (refused by open): hide up to the last '@' all the same */
            at = shoal_ledger_url_userinfo_end(auth);
            colon = memchr(auth, ':', (size_t)(at - auth));
            if (colon == NULL)
                at = NULL;
        } else if (at != NULL) {
            colon = memchr(auth, ':', (size_t)(at - auth));
            /* an '@' in the password itself: the last one before the host's query */
            for (p = at + 1; p < end && *p != '?'; p++)
                at = *p == '@' ? p : at;
        }
    }
    for (p = url; *p != '\0' && n + 1 < len;) {
        const char *skip = NULL;

        if (colon != NULL && p == colon + 1) {
            skip = at;
        } else if ((kwlen = shoal_ledger_url_secret_kw(url, p)) > 0) {
            memcpy(buf + n, p, SHOAL_MIN(kwlen, len - 1 - n));
            n += SHOAL_MIN(kwlen, len - 1 - n);
            p += kwlen;
            if (*p == '\'') { /* a quoted conninfo value, \' inside */
                for (skip = p + 1; *skip != '\0' && *skip != '\''; skip++)
                    skip += skip[0] == '\\' && skip[1] != '\0';
                skip += *skip == '\'';
            } else {
                skip = p + strcspn(p, "& ");
            }
        }
        if (skip != NULL) {
            for (const char *r = "***"; *r != '\0' && n + 1 < len; r++)
                buf[n++] = *r;
            p = skip;
            continue;
        }
        buf[n++] = *p++;
    }
    buf[n] = '\0';
}

const char *shoal_ledger_url_arg(char *arg, const char *prog)
{
    static char *kept; /* reachable, so never reported as a leak */
    size_t len = strlen(arg);
    char *red = malloc(len + 4), *copy;

    if (red == NULL)
        return NULL;
    shoal_ledger_url_redact(arg, red, len + 4);
    if (strcmp(red, arg) == 0) {
        free(red);
        return arg;
    }
    copy = strdup(arg);
    if (copy == NULL) {
        free(red);
        return NULL;
    }
    free(kept);
    kept = copy;
    /* "***" may be longer than a one-letter password: what fits, then NULs */
    memset(arg, 0, len);
    memcpy(arg, red, SHOAL_MIN(strlen(red), len));
    free(red);
    fprintf(stderr, "%s: warning: --ledger carries a password, which other local users could "
            "read in /proc/%d/cmdline until now: set it in a file of mode 0600 instead "
            "(ledger_url in the config file, or PGPASSFILE)\n", prog, (int)getpid());
    return copy;
}

void shoal_ledger_close(shoal_ledger_t *ledger)
{
    if (ledger == NULL)
        return;
    ledger->ops->close(ledger->be);
    if (ledger->key != NULL) {
        shoal_secret_wipe(ledger->key, ledger->keylen);
        free(ledger->key);
    }
    free(ledger);
}

/* ---- commit ------------------------------------------------------------------------------ */

static int shoal_ledger_name_ok(const char *s, size_t size)
{
    size_t len = strnlen(s, size);

    return len > 0 && len < size;
}

int shoal_ledger_record_ok(const shoal_ledger_record_t *r)
{
    return shoal_ledger_name_ok(r->tenant, sizeof(r->tenant)) &&
           shoal_ledger_name_ok(r->job, sizeof(r->job)) &&
           shoal_ledger_name_ok(r->qos_class, sizeof(r->qos_class)) &&
           strnlen(r->host, sizeof(r->host)) < sizeof(r->host) && r->minute >= 0 &&
           isfinite(r->gpu_seconds) && r->gpu_seconds >= 0 && isfinite(r->coll_seconds) &&
           r->coll_seconds >= 0;
}

int shoal_ledger_cursor_ok(const shoal_ledger_cursor_t *c)
{
    int named = c->tenant[0] != '\0' || c->job[0] != '\0';

    return shoal_ledger_name_ok(c->key, sizeof(c->key)) &&
           c->ncounters <= (int)SHOAL_ARRAY_SIZE(c->counters) &&
           (!named || (shoal_ledger_name_ok(c->tenant, sizeof(c->tenant)) &&
                       shoal_ledger_name_ok(c->job, sizeof(c->job))));
}

static shoal_status_t shoal_ledger_check_batch(const shoal_ledger_record_t *recs, size_t n,
                                               const shoal_ledger_cursor_t *cursors,
                                               size_t ncursors)
{
    for (size_t i = 0; i < n; i++) {
        const shoal_ledger_record_t *r = &recs[i];

        if (!shoal_ledger_record_ok(r)) {
            shoal_error(METER, "ledger: record %zu of the commit is malformed (empty or "
                        "unterminated name, negative minute or seconds)", i);
            return SHOAL_ERR_INVALID_ARG;
        }
        for (size_t j = 0; j < i; j++) {
            if (recs[j].minute == r->minute && strcmp(recs[j].tenant, r->tenant) == 0 &&
                strcmp(recs[j].job, r->job) == 0 && strcmp(recs[j].host, r->host) == 0) {
                shoal_error(METER, "ledger: the commit holds (tenant %s, job %s, host '%s', "
                            "minute %" PRId64 ") twice", r->tenant, r->job, r->host, r->minute);
                return SHOAL_ERR_INVALID_ARG;
            }
        }
    }
    for (size_t i = 0; i < ncursors; i++) {
        if (!shoal_ledger_cursor_ok(&cursors[i])) {
            shoal_error(METER, "ledger: cursor %zu of the commit is malformed", i);
            return SHOAL_ERR_INVALID_ARG;
        }
    }
    return SHOAL_OK;
}

static int shoal_ledger_record_same(const shoal_ledger_record_t *a,
                                    const shoal_ledger_record_t *b)
{
    return strcmp(a->tenant, b->tenant) == 0 && strcmp(a->job, b->job) == 0 &&
           strcmp(a->host, b->host) == 0 && strcmp(a->qos_class, b->qos_class) == 0 &&
           a->minute == b->minute &&
           shoal_ledger_double_bits(a->gpu_seconds) == shoal_ledger_double_bits(b->gpu_seconds) &&
           a->bytes_same_host == b->bytes_same_host && a->bytes_cross_host == b->bytes_cross_host &&
           a->ops == b->ops &&
           shoal_ledger_double_bits(a->coll_seconds) ==
               shoal_ledger_double_bits(b->coll_seconds) &&
           a->failed_platform == b->failed_platform && a->failed_tenant == b->failed_tenant;
}

/* 1 when every cursor of the batch is stored as given (a deletion: absent). */
static shoal_status_t shoal_ledger_cursors_stored(shoal_ledger_t *ledger,
                                                  const shoal_ledger_cursor_t *cursors,
                                                  size_t ncursors, int *same_p)
{
    shoal_ledger_cursor_t *stored = malloc(sizeof(*stored));
    shoal_status_t status = SHOAL_OK;
    int found;

    if (stored == NULL)
        return SHOAL_ERR_NO_MEMORY;
    *same_p = 1;
    for (size_t i = 0; i < ncursors && *same_p; i++) {
        const shoal_ledger_cursor_t *c = &cursors[i];

        status = ledger->ops->cursor_get(ledger->be, c->key, stored, &found);
        if (status != SHOAL_OK)
            break;
        if (c->ncounters < 0)
            *same_p = !found;
        else
            *same_p = found && stored->ncounters == c->ncounters &&
                      memcmp(stored->counters, c->counters,
                             sizeof(c->counters[0]) * (size_t)c->ncounters) == 0;
    }
    free(stored);
    return status;
}

/* Records of the batch that exist already. All of them, identical, and the cursors as stored:
 * the replay of a commit whose answer was lost (*replay_p = 1, seq and mac copied into out).
 * Some: a conflict (SHOAL_ERR_INVALID_ARG). None: SHOAL_OK, *replay_p = 0. */
static shoal_status_t shoal_ledger_find_existing(shoal_ledger_t *ledger,
                                                 const shoal_ledger_record_t *recs, size_t n,
                                                 const shoal_ledger_cursor_t *cursors,
                                                 size_t ncursors, shoal_ledger_record_t *out,
                                                 int *replay_p)
{
    size_t nfound = 0, nsame = 0, first = 0;
    shoal_status_t status;
    int found, same;

    *replay_p = 0;
    for (size_t i = 0; i < n; i++) {
        status = ledger->ops->record_find(ledger->be, recs[i].tenant, recs[i].job,
                                          recs[i].host, recs[i].minute, &out[i], &found);
        if (status != SHOAL_OK)
            return status;
        if (!found)
            continue;
        if (nfound++ == 0)
            first = i;
        nsame += shoal_ledger_record_same(&recs[i], &out[i]);
    }
    if (nfound == 0)
        return SHOAL_OK;
    if (nfound == n && nsame == n) {
        SHOAL_CHECK(shoal_ledger_cursors_stored(ledger, cursors, ncursors, &same));
        if (same) {
            *replay_p = 1;
            return SHOAL_OK;
        }
    }
    shoal_error(METER, "ledger: (tenant %s, job %s, host '%s', minute %" PRId64 ") is recorded "
                "already (seq %" PRIu64 "): the commit of %zu records is refused",
                recs[first].tenant, recs[first].job, recs[first].host, recs[first].minute,
                out[first].seq, n);
    return SHOAL_ERR_INVALID_ARG;
}

static shoal_status_t shoal_ledger_write(shoal_ledger_t *ledger, shoal_ledger_record_t *tmp,
                                         size_t n, const shoal_ledger_cursor_t *cursors,
                                         size_t ncursors)
{
    uint8_t mac[SHOAL_HMAC_BYTES];
    uint64_t seq;

    SHOAL_CHECK(ledger->ops->head_get(ledger->be, &seq, mac));
    for (size_t i = 0; i < n; i++) {
        tmp[i].seq = ++seq;
        SHOAL_CHECK(shoal_ledger_mac(ledger, mac, tmp[i].seq, &tmp[i], tmp[i].mac));
        memcpy(mac, tmp[i].mac, SHOAL_HMAC_BYTES);
        SHOAL_CHECK(ledger->ops->record_insert(ledger->be, &tmp[i]));
    }
    for (size_t i = 0; i < ncursors; i++) {
        if (cursors[i].ncounters < 0)
            SHOAL_CHECK(ledger->ops->cursor_del(ledger->be, cursors[i].key));
        else
            SHOAL_CHECK(ledger->ops->cursor_put(ledger->be, &cursors[i]));
    }
    if (n > 0)
        SHOAL_CHECK(ledger->ops->head_set(ledger->be, seq, mac));
    return SHOAL_OK;
}

shoal_status_t shoal_ledger_commit(shoal_ledger_t *ledger, shoal_ledger_record_t *recs, size_t n,
                                   const shoal_ledger_cursor_t *cursors, size_t ncursors)
{
    shoal_ledger_record_t *tmp = NULL;
    shoal_status_t status;
    int replay = 0;

    if (ledger == NULL || (n > 0 && recs == NULL) || (ncursors > 0 && cursors == NULL))
        return SHOAL_ERR_INVALID_ARG;
    if (!ledger->writer) {
        shoal_error(METER, "ledger: opened as a reader, it cannot commit");
        return SHOAL_ERR_INVALID_ARG;
    }
    SHOAL_CHECK(shoal_ledger_check_batch(recs, n, cursors, ncursors));
    if (n > 0) {
        tmp = calloc(n, sizeof(*tmp));
        if (tmp == NULL)
            return SHOAL_ERR_NO_MEMORY;
    }
    SHOAL_CHECK_GOTO(ledger->ops->begin(ledger->be), status, out_free);
    SHOAL_CHECK_GOTO(shoal_ledger_find_existing(ledger, recs, n, cursors, ncursors, tmp, &replay),
                     status, out_rollback);
    if (replay) {
        shoal_info(METER, "ledger: the commit of %zu records (seq %" PRIu64 "..) was stored "
                   "already; nothing written", n, tmp[0].seq);
        ledger->ops->rollback(ledger->be);
    } else {
        if (n > 0)
            memcpy(tmp, recs, n * sizeof(*tmp));
        SHOAL_CHECK_GOTO(shoal_ledger_write(ledger, tmp, n, cursors, ncursors), status,
                         out_rollback);
        SHOAL_CHECK_GOTO(ledger->ops->commit(ledger->be), status, out_free);
    }
    for (size_t i = 0; i < n; i++) {
        recs[i].seq = tmp[i].seq;
        memcpy(recs[i].mac, tmp[i].mac, SHOAL_HMAC_BYTES);
    }
    free(tmp);
    return SHOAL_OK;

out_rollback:
    ledger->ops->rollback(ledger->be);
out_free:
    free(tmp);
    return status;
}

/* ---- reads ------------------------------------------------------------------------------- */

shoal_status_t shoal_ledger_cursor(shoal_ledger_t *ledger, const char *key,
                                   shoal_ledger_cursor_t *cursor)
{
    shoal_ledger_cursor_t *tmp;
    shoal_status_t status;
    int found = 0;

    if (ledger == NULL || key == NULL || cursor == NULL)
        return SHOAL_ERR_INVALID_ARG;
    tmp = malloc(sizeof(*tmp));
    if (tmp == NULL)
        return SHOAL_ERR_NO_MEMORY;
    status = ledger->ops->cursor_get(ledger->be, key, tmp, &found);
    if (status == SHOAL_OK && !found)
        status = SHOAL_ERR_INVALID_ARG;
    if (status == SHOAL_OK)
        *cursor = *tmp;
    free(tmp);
    return status;
}

shoal_status_t shoal_ledger_cursor_list(shoal_ledger_t *ledger, const char *prefix,
                                        shoal_ledger_cursor_cb_t cb, void *arg)
{
    if (ledger == NULL || prefix == NULL || cb == NULL || !ledger->writer)
        return SHOAL_ERR_INVALID_ARG;
    return ledger->ops->cursor_list(ledger->be, prefix, cb, arg);
}

shoal_status_t shoal_ledger_last_minute_get(shoal_ledger_t *ledger, const char *tenant,
                                            const char *job, const char *host,
                                            int64_t *minute_p)
{
    int64_t minute = -1;

    if (ledger == NULL || tenant == NULL || job == NULL || minute_p == NULL)
        return SHOAL_ERR_INVALID_ARG;
    SHOAL_CHECK(ledger->ops->last_minute(ledger->be, tenant, job, host, &minute));
    *minute_p = minute;
    return SHOAL_OK;
}

int64_t shoal_ledger_last_minute(shoal_ledger_t *ledger, const char *tenant, const char *job,
                                 const char *host)
{
    int64_t minute = -1;

    return shoal_ledger_last_minute_get(ledger, tenant, job, host, &minute) == SHOAL_OK ? minute
                                                                                       : -1;
}

shoal_status_t shoal_ledger_each(shoal_ledger_t *ledger, int64_t from, int64_t to,
                                 const char *tenant, const char *job, shoal_ledger_each_cb_t cb,
                                 void *arg)
{
    if (ledger == NULL || cb == NULL)
        return SHOAL_ERR_INVALID_ARG;
    if (from >= to)
        return SHOAL_OK;
    return ledger->ops->each(ledger->be, from, to, tenant, job, cb, arg);
}

shoal_status_t shoal_ledger_head(shoal_ledger_t *ledger, uint64_t *seq_p,
                                 uint8_t mac_p[SHOAL_HMAC_BYTES])
{
    uint8_t mac[SHOAL_HMAC_BYTES];
    uint64_t seq;

    if (ledger == NULL || seq_p == NULL)
        return SHOAL_ERR_INVALID_ARG;
    SHOAL_CHECK(ledger->ops->head_get(ledger->be, &seq, mac));
    *seq_p = seq;
    if (mac_p != NULL)
        memcpy(mac_p, mac, SHOAL_HMAC_BYTES);
    return SHOAL_OK;
}

/* ---- verify ------------------------------------------------------------------------------ */

typedef struct {
    shoal_ledger_t *ledger;
    uint64_t head_seq;
    uint8_t head_mac[SHOAL_HMAC_BYTES];
    int head_seen;                     /* the record at head_seq matched head_mac */
    uint64_t next;                     /* the seq the next record must have */
    uint8_t prev[SHOAL_HMAC_BYTES];
    uint64_t bad;                      /* 0: none found yet */
    shoal_status_t status;
} shoal_ledger_verify_t;

static int shoal_ledger_verify_cb(const shoal_ledger_record_t *rec, void *arg)
{
    shoal_ledger_verify_t *v = arg;
    uint8_t mac[SHOAL_HMAC_BYTES];

    if (rec->seq != v->next && (rec->seq < v->next || rec->seq > (uint64_t)INT64_MAX)) {
        /* a row inserted (or renumbered) below the chain's next seq: name it, not only the
         * seq that it hides */
        shoal_error(METER, "ledger: a record with seq %" PRId64 " (tenant %s, job %s, minute %"
                    PRId64 ") stands where seq %" PRIu64 " belongs: inserted or renumbered",
                    (int64_t)rec->seq, rec->tenant, rec->job, rec->minute, v->next);
        v->bad = v->next;
        return 1;
    }
    if (rec->seq != v->next) {
        shoal_error(METER, "ledger: record seq %" PRIu64 " is missing (next stored: %" PRIu64
                    ")", v->next, rec->seq);
        v->bad = v->next;
        return 1;
    }
    v->status = shoal_ledger_mac(v->ledger, v->prev, v->next, rec, mac);
    if (v->status != SHOAL_OK)
        return 1;
    if (!shoal_memeq_ct(mac, rec->mac, SHOAL_HMAC_BYTES)) {
        shoal_error(METER, "ledger: record seq %" PRIu64 " (tenant %s, job %s, minute %" PRId64
                    ") does not match its MAC: altered, reordered or forged", rec->seq,
                    rec->tenant, rec->job, rec->minute);
        v->bad = v->next;
        return 1;
    }
    memcpy(v->prev, rec->mac, SHOAL_HMAC_BYTES);
    if (v->next == v->head_seq)
        v->head_seen = shoal_memeq_ct(rec->mac, v->head_mac, SHOAL_HMAC_BYTES);
    v->next++;
    return 0;
}

shoal_status_t shoal_ledger_verify(shoal_ledger_t *ledger, uint64_t *bad_seq_p)
{
    return shoal_ledger_verify_head(ledger, bad_seq_p, NULL, NULL);
}

shoal_status_t shoal_ledger_verify_head(shoal_ledger_t *ledger, uint64_t *bad_seq_p,
                                        uint64_t *head_seq_p, uint8_t head_mac[SHOAL_HMAC_BYTES])
{
    shoal_ledger_verify_t v = {.ledger = ledger, .next = 1};
    shoal_status_t status;

    if (ledger == NULL || bad_seq_p == NULL)
        return SHOAL_ERR_INVALID_ARG;
    if (ledger->key == NULL) {
        shoal_error(METER, "ledger: opened without a key, it cannot verify");
        return SHOAL_ERR_INVALID_ARG;
    }
    /* The head first: records committed meanwhile extend the chain past it. */
    SHOAL_CHECK(ledger->ops->head_get(ledger->be, &v.head_seq, v.head_mac));
    status = ledger->ops->each(ledger->be, INT64_MIN, INT64_MAX, NULL, NULL,
                               shoal_ledger_verify_cb, &v);
    if (status == SHOAL_OK)
        status = v.status;
    if (status != SHOAL_OK)
        return status;
    if (v.bad == 0 && v.next <= v.head_seq) {
        shoal_error(METER, "ledger: the chain ends at seq %" PRIu64 " but its head is seq %"
                    PRIu64 ": records were dropped", v.next - 1, v.head_seq);
        v.bad = v.next;
    } else if (v.bad == 0 && v.head_seq > 0 && !v.head_seen) {
        shoal_error(METER, "ledger: the head (seq %" PRIu64 ") does not match its record",
                    v.head_seq);
        v.bad = v.head_seq;
    }
    if (v.bad != 0) {
        *bad_seq_p = v.bad;
        return SHOAL_ERR_AUTH;
    }
    if (head_seq_p != NULL)
        *head_seq_p = v.head_seq;
    if (head_mac != NULL)
        memcpy(head_mac, v.head_mac, SHOAL_HMAC_BYTES);
    return SHOAL_OK;
}
