#!/bin/sh
# Soak test (tests/soak/soak.c) on 4 ranks under shoalrun: mixed collectives with flat RSS and
# descriptor count, then init/split/destroy cycles leaving no descriptor, thread or /dev/shm
# entry behind. Rank 0's TAP lines are numbered here; one more line checks shoalrun's status.
#
# Environment: top_builddir (set by make check). Short form by default (2000 collectives,
# 30 cycles, 10-20 s per transport on a loaded machine). SOAK_LONG=1: the long form (10^5 collectives,
# 1000 cycles). SOAK_COLLS / SOAK_CYCLES override the counts, SOAK_TRANSPORTS the transports
# (default "shm tcp"; the long form "shm"), SOAK_NRANKS the ranks (4), SOAK_TIMEOUT the
# seconds per run (default 300, long form 3600).

builddir=${top_builddir:-.}
shoalrun=$builddir/shoalrun
prog=$builddir/tests/soak/soak
if [ "${SOAK_LONG:-0}" != 0 ]; then
    colls=${SOAK_COLLS:-100000}; cycles=${SOAK_CYCLES:-1000}
    transports=${SOAK_TRANSPORTS:-shm}; limit=${SOAK_TIMEOUT:-3600}
else
    colls=${SOAK_COLLS:-2000}; cycles=${SOAK_CYCLES:-30}
    transports=${SOAK_TRANSPORTS:-"shm tcp"}; limit=${SOAK_TIMEOUT:-300}
fi
nranks=${SOAK_NRANKS:-4}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_soak.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$prog" ]; then
    echo "1..0 # SKIP $shoalrun or $prog not built"
    exit 0
fi

n=0
for tl in $transports; do
    t0=$(date +%s)
    SHOAL_TRANSPORT=$tl SHOAL_TIMEOUT_MS=60s timeout -s KILL $((limit + 30)) \
        "$shoalrun" -n "$nranks" --no-prefix --timeout "$limit" "$prog" "$colls" "$cycles" \
        >"$tmp/out" 2>"$tmp/err"
    rc=$?
    secs=$(($(date +%s) - t0))
    grep '^# ' "$tmp/out" | sed "s/^# /# $tl: /"
    while IFS= read -r line; do
        case $line in
        "ok - "* | "not ok - "*)
            n=$((n + 1))
            echo "$line" | sed "s/^\(ok\|not ok\) - /\1 $n - $tl n=$nranks: /"
            ;;
        esac
    done <"$tmp/out"
    n=$((n + 1))
    if [ $rc -eq 0 ]; then
        echo "ok $n - $tl n=$nranks: shoalrun exits 0 ($secs s)"
    else
        echo "not ok $n - $tl n=$nranks: shoalrun exits $rc ($secs s)"
        sed 's/^/#   /' "$tmp/err" | head -n 30
    fi
done
echo "1..$n"
