#!/bin/sh
# The ledger test (test_ledger) against a real PostgreSQL server started here: a fresh cluster
# (initdb) in a temp dir, listening on a unix socket in that dir only, as an unprivileged user
# when run as root (PostgreSQL refuses root). The test stops and restarts it mid-run. The
# server is stopped and the dir removed at the end, also on failure.
. "$(dirname "$0")/ledger_env.sh"
PGBIN=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then PGBIN=$d; break; fi
done
if [ -z "$PGBIN" ] && command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1
then
    PGBIN=$(dirname "$(command -v pg_ctl)")
fi
if [ -z "$PGBIN" ]; then
    echo "1..0 # SKIP no PostgreSQL server binaries (initdb, pg_ctl; Debian: postgresql)"
    exit 0
fi
T=$(ledger_tmpdir test_ledger_pg) || exit 1
PORT=$((20000 + $$ % 20000))           # names the socket in $T; no TCP port is opened
PGOPTS="-k $T -p $PORT -c listen_addresses='' -c fsync=off"
cleanup() {
    if [ -f "$T/pg/postmaster.pid" ]; then
        as_user "$PGBIN/pg_ctl" -D "$T/pg" -m immediate -w -t 30 stop >/dev/null 2>&1
    fi
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! as_user timeout -s KILL 120 "$PGBIN/initdb" -D "$T/pg" -A trust -U shoal -E UTF8 --no-sync \
        >"$T/initdb.log" 2>&1; then
    echo "1..1"; echo "not ok 1 - initdb failed"; sed 's/^/#   /' "$T/initdb.log"; exit 1
fi
LEDGER_TEST_START="timeout -s KILL 90 $PGBIN/pg_ctl -D $T/pg -l $T/pg.log -w -t 60 -o \"$PGOPTS\" start >/dev/null"
LEDGER_TEST_STOP="timeout -s KILL 90 $PGBIN/pg_ctl -D $T/pg -m fast -w -t 60 stop >/dev/null"
LEDGER_TEST_LOGDIR=$T
export LEDGER_TEST_START LEDGER_TEST_STOP LEDGER_TEST_LOGDIR
if ! as_user sh -c "$LEDGER_TEST_START" || \
   ! as_user timeout -s KILL 60 "$PGBIN/createdb" -h "$T" -p "$PORT" -U shoal shoal_ledger; then
    echo "1..1"; echo "not ok 1 - the PostgreSQL server did not start"
    sed 's/^/#   /' "$T/pg.log" 2>/dev/null | tail -n 20; exit 1
fi
URL="postgresql:///shoal_ledger?host=$T&port=$PORT&user=shoal"
as_user timeout -s KILL 300 "$top_builddir/tests/ledger/test_ledger" "$URL"
