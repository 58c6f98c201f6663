# Sourced by the ledger's tests: a TAP-safe temp dir and the user that runs the databases and
# the test binary (PostgreSQL refuses root, and root ignores the file modes the SQLite test
# sets): the caller's own user, or postgres / nobody when run as root.
top_builddir=${top_builddir:-.}
unset SHOAL_DEBUG SHOAL_DEBUG_FILE PGHOST PGPORT PGUSER PGDATABASE PGPASSWORD
ledger_user=""
if [ "$(id -u)" = "0" ]; then
    if id postgres >/dev/null 2>&1; then ledger_user=postgres; else ledger_user=nobody; fi
fi
# as_user CMD ARGS...: runs CMD as $ledger_user (or as we are)
as_user() {
    if [ -n "$ledger_user" ]; then runuser -u "$ledger_user" -- "$@"; else "$@"; fi
}
# ledger_tmpdir NAME: a new directory owned by the test user, printed
ledger_tmpdir() {
    d=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || return 1
    if [ -n "$ledger_user" ]; then chown "$ledger_user" "$d"; fi
    chmod 755 "$d"
    echo "$d"
}

# A PostgreSQL server for a test: pg_find (sets PGBIN; 1 when there is none), pg_setup DIR (a
# fresh cluster in DIR/pg owned by the test user, listening on a unix socket in DIR only, port
# $PG_PORT naming the socket, no TCP; database shoal_ledger, user shoal, trust), pg_stop and
# pg_start (the test takes it down and back), pg_cleanup (immediate stop; call it at exit).
pg_find() {
    PGBIN=""
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then PGBIN=$d; break; fi
    done
    if [ -z "$PGBIN" ] && command -v pg_ctl >/dev/null 2>&1 &&
            command -v initdb >/dev/null 2>&1; then
        PGBIN=$(dirname "$(command -v pg_ctl)")
    fi
    [ -n "$PGBIN" ]
}
pg_setup() {
    PG_DIR=$1
    PG_PORT=$((20000 + $$ % 20000))
    as_user timeout -s KILL 120 "$PGBIN/initdb" -D "$PG_DIR/pg" -A trust -U shoal -E UTF8 \
        --no-sync >"$PG_DIR/initdb.log" 2>&1 || return 1
    pg_start || return 1
    as_user timeout -s KILL 60 "$PGBIN/createdb" -h "$PG_DIR" -p "$PG_PORT" -U shoal shoal_ledger
}
pg_start() {
    as_user timeout -s KILL 90 "$PGBIN/pg_ctl" -D "$PG_DIR/pg" -l "$PG_DIR/pg.log" -w -t 60 \
        -o "-k $PG_DIR -p $PG_PORT -c listen_addresses='' -c fsync=off" start >/dev/null
}
pg_stop() {
    as_user timeout -s KILL 90 "$PGBIN/pg_ctl" -D "$PG_DIR/pg" -m fast -w -t 60 stop >/dev/null
}
pg_cleanup() {
    if [ -n "$PG_DIR" ] && [ -f "$PG_DIR/pg/postmaster.pid" ]; then
        as_user "$PGBIN/pg_ctl" -D "$PG_DIR/pg" -m immediate -w -t 30 stop >/dev/null 2>&1
    fi
}
