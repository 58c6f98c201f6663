#!/bin/sh
# Nonblocking collectives (tests/mp/mp_nbc.c) under shoalrun, TAP on stdout:
#  - ok: every kind of shoal_i* call (the alltoall and the barrier too) in flight at once on
#    three communicators, waited for in several orders, results exact (rank 0's TAP lines,
#    merged as in run_mp.sh); with the automatic choice and with rows forced by SHOAL_ALGO;
#  - overlap: two intra-node AllReduces in flight at once, the last rank late (mp_nbc.c's
#    nbc_mode_overlap);
#  - mem: calls in flight of algorithms that use no scratch take no pool scratch;
#  - kill: the last rank dies while the others have four calls in flight on two
#    communicators: every call must complete with an error naming it, within the deadline;
#  - destroy: rank 0 destroys its communicator with a call in flight that no peer joins: the
#    call fails at once (SHOAL_ERR_ABORTED), under SHOAL_CHECK_ARGS=1 too.
# Environment: top_builddir (set by make check), NBC_TIMEOUT (seconds per job, default 180),
# NBC_TIMEOUT_MS (the kill jobs' SHOAL_TIMEOUT_MS, default 5000: it bounds their init and
# setup too, which a ThreadSanitizer build on a loaded 2-core machine can take longer than;
# .ci/run gives its TSan suite more).

builddir=${top_builddir:-.}
shoalrun=$builddir/shoalrun
prog=$builddir/tests/mp/mp_nbc
wrap=${top_srcdir:-$(dirname "$0")/../..}/tests/mp/hostid_wrap.sh
timeout=${NBC_TIMEOUT:-180}
timeout_ms=${NBC_TIMEOUT_MS:-5000}
slack_ms=5000
n_tap=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_nbc.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$prog" ]; then
    echo "1..0 # SKIP $shoalrun or $prog not built"
    exit 0
fi

# shellcheck source=tests/mp/run_lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/mp/run_lib.sh"

tap() { # tap OK|FAIL description
    n_tap=$((n_tap + 1))
    if [ "$1" = OK ]; then
        echo "ok $n_tap - $2"
    else
        echo "not ok $n_tap - $2"
    fi
}

mp_job "shm n=3" 3 "" "$prog" ok
mp_job "tcp n=4" 4 "SHOAL_TRANSPORT=tcp" "$prog" ok
mp_job "tcp n=3 chunk=4k" 3 "SHOAL_TRANSPORT=tcp SHOAL_CHUNK_SIZE=4096" "$prog" ok
# SHOAL_CHECK_ARGS=1: every call first compares its arguments, then runs whole, one at a time
# (select.c's shoal_coll_plan): the same results, whatever the order of the waits.
mp_job "shm n=3 check_args" 3 "SHOAL_CHECK_ARGS=1" "$prog" ok
mp_job "tcp n=4 check_args" 4 "SHOAL_TRANSPORT=tcp SHOAL_CHECK_ARGS=1" "$prog" ok
# Forced rows, every call of that collective in flight as its step-wise plan beside the
# others: recursive doubling (the fold on 3 and 5 ranks; 4 KiB chunks make the 64 Ki-element
# calls run in several scratch-sized passes) and Bruck (the allgathers that fit the scratch;
# the larger ones fall back to the ring).
mp_job "shm n=4 rd chunk=4k" 4 "SHOAL_ALGO=rd SHOAL_CHUNK_SIZE=4096" "$prog" ok
mp_job "shm n=5 rd" 5 "SHOAL_ALGO=rd" "$prog" ok
mp_job "tcp n=3 rd chunk=4k" 3 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=rd SHOAL_CHUNK_SIZE=4096" \
    "$prog" ok
mp_job "shm n=3 bruck" 3 "SHOAL_ALGO=bruck SHOAL_DEBUG=info SHOAL_DEBUG_SUBSYS=coll" "$prog" ok
# The choice's log line says where the forced row served the call and where the model chose
# (it said '(SHOAL_ALGO)' after the model's AllReduce choice too).
if grep -q 'allgather of .*: bruck (SHOAL_ALGO);' "$tmp/err" &&
    grep -q 'allreduce of .*: [a-z]* (SHOAL_ALGO=bruck does not apply here);' "$tmp/err" &&
    ! grep -q 'allreduce of .*: [a-z]* (SHOAL_ALGO);' "$tmp/err"; then
    tap OK "shm n=3 bruck: the log credits SHOAL_ALGO on the allgathers, not on the AllReduces"
else
    tap FAIL "shm n=3 bruck: choice log lines: $(grep -m 2 'allreduce of' "$tmp/err" | cut -c1-160)"
fi
mp_job "tcp n=4 bruck chunk=4k" 4 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=bruck SHOAL_CHUNK_SIZE=4096" \
    "$prog" ok
# The double binary tree: 4 KiB chunks make the large calls pipelines of many chunks.
mp_job "shm n=4 dbtree chunk=4k" 4 "SHOAL_ALGO=dbtree SHOAL_CHUNK_SIZE=4096" "$prog" ok
mp_job "tcp n=5 dbtree chunk=4k" 5 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=dbtree SHOAL_CHUNK_SIZE=4096" \
    "$prog" ok
# Rabenseifner AllReduce plans (the fold on 3 and 5 ranks, pieces of a 4 KiB-chunk scratch),
# and the recursive-halving reduce-scatter plans (SHOAL_ALGO=rab on 4 ranks: on the world's
# copy of 4 ranks and on the halves of 2 at once; 4 KiB chunks make them several slices).
mp_job "shm n=3 rab" 3 "SHOAL_ALGO=rab" "$prog" ok
mp_job "tcp n=5 rab chunk=4k" 5 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=rab SHOAL_CHUNK_SIZE=4096" \
    "$prog" ok
mp_job "shm n=4 rab chunk=4k" 4 "SHOAL_ALGO=rab SHOAL_CHUNK_SIZE=4096" "$prog" ok
mp_job "tcp n=4 rab chunk=4k" 4 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=rab SHOAL_CHUNK_SIZE=4096" \
    "$prog" ok
# Pipelined tree broadcast plans on the world and its copy at once (4 KiB chunks: the
# 2 Mi-element broadcast is a pipeline of 4096 chunks).
mp_job "shm n=4 ptree chunk=4k" 4 "SHOAL_ALGO=ptree SHOAL_CHUNK_SIZE=4096" "$prog" ok
mp_job "tcp n=5 ptree chunk=4k" 5 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=ptree SHOAL_CHUNK_SIZE=4096" \
    "$prog" ok
# Hierarchical AllReduce plans on virtual hosts (hostid_wrap.sh): 2x2 on the world and its
# copy, 1+1 on each half, in flight together; 2+2+1 with 4 KiB segments (pipelines of many).
mp_job "hosts 2x2 hier" 4 "SHOAL_ALGO=hier MP_PPN=2" "$wrap" "$prog" ok
mp_job "hosts 2+2+1 hier segment=4k" 5 "SHOAL_ALGO=hier MP_PPN=2 SHOAL_HIER_SEGMENT=4096" \
    "$wrap" "$prog" ok
# Algorithms that use no scratch take none from the pool: 8 calls of 4 MiB in flight on a
# fresh communicator grow the process by less than 16 MiB (each took a pool buffer of
# 4 x SHOAL_CHUNK_SIZE, faulted in, 32 MiB in all). Hierarchical AllReduce, the pipelined and
# binomial tree broadcasts, the chain broadcast and the ring allgather, over virtual hosts.
mp_job "hosts 2x2 hier mem" 4 "SHOAL_ALGO=hier MP_PPN=2 SHOAL_CHUNK_SIZE=1m" "$wrap" "$prog" \
    mem allreduce
mp_job "hosts 2x2 ptree mem" 4 "SHOAL_ALGO=ptree MP_PPN=2 SHOAL_CHUNK_SIZE=1m" "$wrap" "$prog" \
    mem broadcast
mp_job "hosts 2x2 tree mem" 4 "SHOAL_ALGO=tree MP_PPN=2 SHOAL_CHUNK_SIZE=1m" "$wrap" "$prog" \
    mem broadcast
mp_job "hosts 2x2 ring mem" 4 "SHOAL_ALGO=ring MP_PPN=2 SHOAL_CHUNK_SIZE=1m" "$wrap" "$prog" \
    mem broadcast allgather
# Two intra-node AllReduces in flight at once on one host (their plans), the last rank late:
# on two communicators, the one it joined completes first; on one, a broadcast behind an
# AllReduce completes on the ranks that need only rank 0 (LL, one-shot, two-shot/direct).
mp_job "shm n=3 overlap" 3 "" "$prog" overlap
mp_job "shm n=4 overlap" 4 "" "$prog" overlap
# 6 ranks: the alltoall, barrier and Bruck plans use more channels than a plan lists
# (SHOAL_PLAN_PEERS): they advance step by step, but alone on their communicator.
mp_job "shm n=6 bruck" 6 "SHOAL_ALGO=bruck" "$prog" ok
# A destroy with a call in flight that the peers never join fails it at once: under
# SHOAL_CHECK_ARGS=1 the call runs whole on the proxy, which waited in the arguments' exchange
# until the peers exited or SHOAL_TIMEOUT_MS (nbc_mode_destroy).
mp_job "shm n=2 destroy" 2 "SHOAL_TIMEOUT_MS=60000" "$prog" destroy
mp_job "tcp n=3 destroy check_args" 3 \
    "SHOAL_TRANSPORT=tcp SHOAL_CHECK_ARGS=1 SHOAL_TIMEOUT_MS=60000" "$prog" destroy

# kill_job LABEL NRANKS TRANSPORT [ALGO [PPN]] (PPN: ranks per virtual host, hostid_wrap.sh)
kill_job() {
    env -u SHOAL_TRANSPORT -u SHOAL_ALGO "$shoalrun" --no-prefix --grace 30 --timeout "$timeout" \
        -n "$2" -x SHOAL_TIMEOUT_MS=$timeout_ms ${3:+-x SHOAL_TRANSPORT=$3} \
        ${4:+-x SHOAL_ALGO=$4} ${5:+-x MP_PPN=$5} ${5:+"$wrap"} "$prog" kill \
        >"$tmp/out" 2>"$tmp/err"
    rc=$?
    victim=$(($2 - 1))
    r=0
    while [ $r -lt "$victim" ]; do
        lines=$(grep -c "^survivor $r: call " "$tmp/out")
        bad=$(grep "^survivor $r: call " "$tmp/out" | grep -v ": ok " | head -n 1)
        slow=$(grep "^survivor $r: call " "$tmp/out" |
            sed -n 's/.* after \([0-9]*\) ms: .*/\1/p' |
            awk -v lim=$((timeout_ms + slack_ms)) '$1 > lim { print; exit }')
        if [ "$lines" -ne 4 ]; then
            tap FAIL "$1: survivor $r reported $lines of 4 calls (hung, or crashed)"
            sed -e 's/^/# /' "$tmp/out" "$tmp/err" | head -n 40
        elif [ -n "$bad" ]; then
            tap FAIL "$1: survivor $r: $bad"
        elif [ -n "$slow" ]; then
            tap FAIL "$1: survivor $r took $slow ms (limit $((timeout_ms + slack_ms)))"
        else
            tap OK "$1: survivor $r: 4 calls in flight on 2 communicators completed, errors name rank $victim ($(grep "^survivor $r: call 3" "$tmp/out" | sed 's/.*: call 3 [a-z_]* on [a-z]*: ok //' | cut -c1-60))"
        fi
        r=$((r + 1))
    done
    if [ "$rc" -eq 137 ] || grep -q "killed\|signal 9\|SIGKILL" "$tmp/err"; then
        tap OK "$1: shoalrun reported the victim's SIGKILL (exit $rc)"
    else
        tap FAIL "$1: shoalrun exited $rc, expected the victim's SIGKILL"
        sed -e 's/^/# stderr: /' "$tmp/err" | head -n 20
    fi
}

kill_job "kill tcp n=3" 3 tcp
kill_job "kill shm n=3" 3 ""
# The AllReduce and allgather as recursive doubling, Bruck and double binary tree plans
# (SHOAL_ALGO=bruck leaves the AllReduce to the model).
kill_job "kill tcp n=3 rd" 3 tcp rd
kill_job "kill shm n=4 bruck" 4 "" bruck
kill_job "kill tcp n=4 dbtree" 4 tcp dbtree
# The reduce-scatter as a recursive-halving plan (4 ranks), the broadcast as a pipelined tree.
kill_job "kill tcp n=4 rab" 4 tcp rab
kill_job "kill shm n=4 rab" 4 "" rab
kill_job "kill tcp n=5 ptree" 5 tcp ptree
kill_job "kill shm n=3 ptree" 3 "" ptree
# The AllReduce as a hierarchical plan on 2 virtual hosts of 2 ranks (shm within, tcp across).
kill_job "kill hosts 2x2 hier" 4 "" hier 2
echo "1..$n_tap"
