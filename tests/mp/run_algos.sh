#!/bin/sh
# Runs the algorithms of src/coll/{tree,rab,hier,allgather2,bcast2,rs2,alltoall}.c under
# shoalrun with SHOAL_ALGO forcing each one, on odd and even rank counts, over shm and tcp,
# and the hierarchical one on virtual multi-host layouts (hostid_wrap.sh gives each rank group
# its own SHOAL_HOSTID: shm inside a host, tcp across). Rank 0's TAP lines are merged into one
# stream, each prefixed by its configuration; one more line per run checks the exit status.
#
# Environment: top_builddir, top_srcdir (set by make check), MP_TIMEOUT (seconds per run,
# default 240), ALGOS_QUICK=1 for a shorter sweep.

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
shoalrun=$builddir/shoalrun
coll=$builddir/tests/mp/mp_coll
a2a=$builddir/tests/mp/mp_alltoall
wrap=$srcdir/tests/mp/hostid_wrap.sh
timeout=${MP_TIMEOUT:-240}
n_tap=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_algos.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$coll" ] || [ ! -x "$a2a" ]; then
    echo "1..0 # SKIP shoalrun, mp_coll or mp_alltoall not built"
    exit 0
fi

# run LABEL NRANKS "VAR=VALUE..." PROGRAM [ARGS...]
run() {
    label=$1
    n=$2
    vars=$3
    shift 3
    xs=""
    for v in SHOAL_TIMEOUT_MS=30000 $vars; do
        xs="$xs -x $v"
    done
    # shellcheck disable=SC2086 # xs is a word list on purpose
    env -u SHOAL_TRANSPORT -u SHOAL_ALGO "$shoalrun" --no-prefix --timeout "$timeout" -n "$n" \
        $xs "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    ngroups=0
    while IFS= read -r line; do
        case $line in
        "ok "*|"not ok "*)
            desc=${line#* - }
            status=${line%% [0-9]*}
            n_tap=$((n_tap + 1))
            ngroups=$((ngroups + 1))
            echo "$status $n_tap - $label: $desc"
            ;;
        "Bail out!"*)
            n_tap=$((n_tap + 1))
            echo "not ok $n_tap - $label: rank 0 bailed out: ${line#Bail out!}"
            ;;
        esac
    done <"$tmp/out"
    if [ "$rc" -ne 0 ] || grep -q '^# rank' "$tmp/err"; then
        sed -e 's/^/# stderr: /' "$tmp/err" | grep -v '^# stderr: $' | head -n 40
    fi
    n_tap=$((n_tap + 1))
    if [ "$rc" -eq 0 ] && [ "$ngroups" -gt 0 ]; then
        echo "ok $n_tap - $label: shoalrun exited 0 ($ngroups groups)"
    else
        echo "not ok $n_tap - $label: shoalrun exited $rc ($ngroups groups)"
    fi
}

if [ "${ALGOS_QUICK:-0}" = 1 ]; then
    counts="3 4"
else
    counts="2 3 4 5"
fi
ar="allreduce allreduce_big determinism"
for n in $counts; do
    run "shm n=$n dbtree" "$n" "SHOAL_ALGO=dbtree" "$coll" $ar
    run "shm n=$n rab" "$n" "SHOAL_ALGO=rab" "$coll" $ar reduce_scatter
    run "shm n=$n bruck" "$n" "SHOAL_ALGO=bruck" "$coll" allgather
    run "shm n=$n ptree" "$n" "SHOAL_ALGO=ptree" "$coll" broadcast
    run "shm n=$n alltoall" "$n" "" "$a2a"
done
run "shm n=8 dbtree" 8 "SHOAL_ALGO=dbtree" "$coll" allreduce_big
run "shm n=8 rab" 8 "SHOAL_ALGO=rab" "$coll" allreduce_big reduce_scatter
run "tcp n=3 dbtree chunk=4k" 3 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=dbtree SHOAL_CHUNK_SIZE=4096" \
    "$coll" $ar
run "tcp n=5 rab chunk=4k" 5 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=rab SHOAL_CHUNK_SIZE=4096" \
    "$coll" $ar
run "tcp n=4 rab" 4 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=rab" "$coll" reduce_scatter
run "tcp n=3 alltoall chunk=4k" 3 "SHOAL_TRANSPORT=tcp SHOAL_CHUNK_SIZE=4096" "$a2a"
run "tcp n=5 ptree" 5 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=ptree" "$coll" broadcast
# Hierarchical: hosts of 2+2, 2+2+1, 1+1+1, 1+2+3 and interleaved 3+2 ranks.
run "hosts 2x2 hier" 4 "SHOAL_ALGO=hier MP_PPN=2" "$wrap" "$coll" $ar
run "hosts 2+2+1 hier chunk=4k" 5 "SHOAL_ALGO=hier MP_PPN=2 SHOAL_CHUNK_SIZE=4096" \
    "$wrap" "$coll" $ar
run "hosts 1+1+1 hier" 3 "SHOAL_ALGO=hier MP_PPN=1" "$wrap" "$coll" $ar
if [ "${ALGOS_QUICK:-0}" != 1 ]; then
    run "hosts 1+2+3 hier" 6 "SHOAL_ALGO=hier MP_HOSTMAP=0,1,1,2,2,2" "$wrap" "$coll" $ar
    run "hosts 3+2 interleaved hier" 5 "SHOAL_ALGO=hier MP_HOSTMAP=1,0,1,0,0" "$wrap" "$coll" $ar
    run "hosts 2x2 alltoall" 4 "MP_PPN=2" "$wrap" "$a2a"
fi
echo "1..$n_tap"
