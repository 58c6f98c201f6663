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
