#!/bin/sh
# The ledger test (test_ledger) on an SQLite database in a fresh directory, as an unprivileged
# user when run as root (so that a read-only file is read-only).
. "$(dirname "$0")/ledger_env.sh"
T=$(ledger_tmpdir test_ledger_sqlite) || exit 1
trap 'rm -rf "$T"' EXIT
as_user mkdir "$T/db" || exit 1
as_user timeout -s KILL 300 "$top_builddir/tests/ledger/test_ledger" "sqlite://$T/db/ledger.db"
