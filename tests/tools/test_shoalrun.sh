#!/bin/sh
# TAP test of the shoalrun launcher (ranks, exit codes, failures, timeout, output tagging,
# signals), a smoke run of the perf tools through it (#wrong must be 0), SHOAL_TUNING_FILE and
# the waiters' spinning plan for bound and unbound ranks.
# Needs: top_builddir (exported by `make check`; defaults to the current directory).

top_builddir=${top_builddir:-.}
SHOALRUN="$top_builddir/shoalrun"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_shoalrun.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
unset SHOAL_UID SHOAL_RANK SHOAL_NRANKS SHOAL_LOCAL_RANK SHOAL_LOCAL_SIZE

NTESTS=55
echo "1..$NTESTS"
n=0
ok() { # ok COND-EXIT-STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}
is() { # is GOT WANT DESCRIPTION
    n=$((n + 1))
    if [ "$1" = "$2" ]; then echo "ok $n - $3"; else
        echo "not ok $n - $3"; echo "#   got: '$1'"; echo "#  want: '$2'"; fi
}
diag_file() { sed 's/^/#   /' "$1" | head -n 30; }
# Runs shoalrun under an outer deadline (so a broken launcher cannot hang the suite),
# output in $T/out and $T/err, status in $rc, wall seconds in $secs.
run() {
    t0=$(date +%s)
    timeout -s KILL 120 "$SHOALRUN" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    secs=$(($(date +%s) - t0))
}
alive() { # alive PID: exists and is not a zombie waiting for a reaper
    kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null
}
all_dead() { # all_dead PIDFILE...: every pid listed is gone
    for f in "$@"; do
        [ -s "$f" ] || return 1
        alive "$(cat "$f")" && return 1
    done
    return 0
}

wait_files() { # wait_files FILE...: up to 10 s for every file to be non-empty
    i=0
    for f in "$@"; do
        while [ ! -s "$f" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    done
}

if [ ! -x "$SHOALRUN" ]; then
    i=0; while [ $i -lt $NTESTS ]; do i=$((i + 1)); echo "ok $i # SKIP no shoalrun in $top_builddir"; done
    exit 0
fi

# 1-4: every rank sees its own SHOAL_RANK, the rank count, the local rank/size and one uid
run -n 4 --timeout 60 sh -c 'echo "rank=$SHOAL_RANK nranks=$SHOAL_NRANKS local=$SHOAL_LOCAL_RANK/$SHOAL_LOCAL_SIZE"; echo "uid=$SHOAL_UID"'
is "$rc" 0 "4 ranks of a small command exit 0"
got=$(grep -o 'rank=[0-9]* nranks=[0-9]* local=[0-9/]*' "$T/out" | sort | tr '\n' ' ')
is "$got" "rank=0 nranks=4 local=0/4 rank=1 nranks=4 local=1/4 rank=2 nranks=4 local=2/4 rank=3 nranks=4 local=3/4 " \
    "each rank sees a distinct SHOAL_RANK, SHOAL_NRANKS, SHOAL_LOCAL_RANK/SIZE"
bad=$(grep -c '^\[\([0-3]\)\] rank=\1 ' "$T/out")
is "$bad" 4 "each line carries its own rank's prefix"
uids=$(sed -n 's/^\[[0-9]*\] uid=//p' "$T/out" | sort -u)
echo "$uids" | grep -qx '[0-9a-f]\{256\}' && [ "$(echo "$uids" | wc -l)" -eq 1 ]
ok $? "every rank gets the same SHOAL_UID of 256 hex digits"

# 5-6: exit status is the worst rank's
run -n 3 --timeout 60 sh -c 'exit $((SHOAL_RANK * 2))'
is "$rc" 4 "exit status is the worst of the ranks' (0, 2, 4 -> 4)"
grep -q 'rank 2 (pid [0-9]*) exited with status 4' "$T/err"
ok $? "a failing rank is reported on stderr"

# 7-9: a rank killed by a signal: the others are killed after the grace period
run -n 3 --grace 1 --timeout 60 sh -c 'echo $$ > '"$T"'/pid.$SHOAL_RANK; if [ $SHOAL_RANK = 1 ]; then sleep 0.3; kill -9 $$; fi; exec sleep 30'
is "$rc" 137 "a rank killed by SIGKILL gives exit status 128+9"
grep -q 'rank 1 (pid [0-9]*) killed by signal 9' "$T/err"
ok $? "the killed rank is reported on stderr"
[ "$secs" -lt 10 ] && all_dead "$T/pid.0" "$T/pid.1" "$T/pid.2"
ok $? "survivors are killed once the grace period ends (${secs}s)"
rm -f "$T"/pid.*

# 10: survivors that exit on their own within the grace period keep their status
run -n 3 --grace 20 --timeout 60 sh -c 'if [ $SHOAL_RANK = 0 ]; then exit 3; fi; sleep 1; exit 5'
[ "$rc" -eq 5 ] && [ "$secs" -lt 15 ]
ok $? "survivors exiting by themselves in the grace period count (rc $rc, ${secs}s)"

# 11-12: --timeout kills everything and exits 124, quickly
run -n 3 --timeout 1 sh -c 'echo $$ > '"$T"'/pid.$SHOAL_RANK; exec sleep 30'
is "$rc" 124 "--timeout exits 124"
[ "$secs" -lt 6 ] && all_dead "$T/pid.0" "$T/pid.1" "$T/pid.2"
ok $? "--timeout 1 kills every rank promptly (${secs}s)"
rm -f "$T"/pid.*

# 13-15: prefixed output keeps every line, whole, from every rank, on the right stream
run -n 3 --timeout 60 sh -c 'i=0; while [ $i -lt 2000 ]; do echo "line $i of rank $SHOAL_RANK"; i=$((i+1)); done; echo "err of rank $SHOAL_RANK" >&2; printf "tail of rank $SHOAL_RANK"'
good=0
for r in 0 1 2; do
    c=$(grep -c "^\[$r\] line [0-9]* of rank $r\$" "$T/out")
    u=$(sed -n "s/^\[$r\] line \([0-9]*\) of rank $r\$/\1/p" "$T/out" | sort -un | wc -l)
    [ "$c" -eq 2000 ] && [ "$u" -eq 2000 ] && good=$((good + 1))
done
[ "$rc" -eq 0 ] && [ "$good" -eq 3 ] && [ "$(wc -l < "$T/out")" -eq 6003 ]
ok $? "all 3 x 2000 lines arrive whole, each with its rank's prefix"
[ "$(grep -c '^\[[0-2]\] tail of rank [0-2]$' "$T/out")" -eq 3 ]
ok $? "an unterminated last line is flushed at exit"
[ "$(grep -c '^\[\([0-2]\)\] err of rank \1$' "$T/err")" -eq 3 ] && ! grep -q 'err of' "$T/out"
ok $? "stderr lines go to stderr, prefixed"

# 16: -x sets variables for the ranks
run -n 2 --timeout 60 -x SHOALRUN_TEST_VAR=hello -- sh -c 'echo "v=$SHOALRUN_TEST_VAR"'
[ "$rc" -eq 0 ] && [ "$(grep -c '^\[[01]\] v=hello$' "$T/out")" -eq 2 ]
ok $? "-x VAR=VALUE reaches every rank"

# 17: --no-prefix leaves output alone
run -n 2 --no-prefix --timeout 60 sh -c 'echo plain'
[ "$rc" -eq 0 ] && [ "$(grep -cx plain "$T/out")" -eq 2 ]
ok $? "--no-prefix passes output through untouched"

# 18: usage errors and a missing program
"$SHOALRUN" true >/dev/null 2>&1; a=$?
"$SHOALRUN" -n 2 /nonexistent/program >/dev/null 2>&1; b=$?
[ "$a" -eq 2 ] && [ "$b" -eq 127 ]
ok $? "missing -n exits 2, a missing program exits 127 (got $a, $b)"

# 19: SIGTERM to shoalrun is forwarded to every rank
t0=$(date +%s)
"$SHOALRUN" -n 2 --timeout 60 sh -c 'trap "echo got-term; exit 0" TERM; echo $$ > '"$T"'/pid.$SHOAL_RANK; sleep 30 & wait' \
    >"$T/out" 2>"$T/err" &
pid=$!
wait_files "$T/pid.0" "$T/pid.1"
kill -TERM $pid
wait $pid; rc=$?
secs=$(($(date +%s) - t0))
rm -f "$T"/pid.*
[ "$rc" -eq 143 ] && [ "$(grep -c 'got-term' "$T/out")" -eq 2 ] && [ "$secs" -lt 10 ]
ok $? "SIGTERM is forwarded to every rank, shoalrun exits 128+15 (rc $rc, ${secs}s)"

# 20: ranks die with shoalrun (PR_SET_PDEATHSIG)
"$SHOALRUN" -n 2 sh -c 'echo $$ > '"$T"'/pid.$SHOAL_RANK; exec sleep 30' >/dev/null 2>&1 &
pid=$!
wait_files "$T/pid.0" "$T/pid.1"
kill -KILL $pid; wait $pid 2>/dev/null
i=0; while [ $i -lt 50 ] && ! all_dead "$T/pid.0" "$T/pid.1"; do sleep 0.1; i=$((i + 1)); done
all_dead "$T/pid.0" "$T/pid.1"
ok $? "ranks are killed when shoalrun itself is killed"
rm -f "$T"/pid.*

# 21-25: perf smoke (needs the whole library): #wrong must be 0 everywhere
perf_ok() { # perf_ok: rc 0, at least one data row, every #wrong column 0, bounds line OK
    [ "$rc" -eq 0 ] || return 1
    sed -n 's/^\[0\] //p' "$T/out" > "$T/out0"
    grep -q '^# Out of bounds values : 0 OK' "$T/out0" || return 1
    tail -n 1 "$T/out0" | grep -q '^# Avg bus bandwidth' || return 1
    grep -v '^#' "$T/out0" |
        awk 'NF == 13 { rows++; if ($9 != 0 || $13 != 0) bad++ } END { exit !(rows > 0 && bad == 0) }'
}
perf_case() { # perf_case DESCRIPTION SHOALRUN-ARGS...
    d=$1; shift
    run "$@"
    perf_ok; r=$?
    ok $r "$d (rc $rc)"
    [ $r -eq 0 ] || { diag_file "$T/out"; diag_file "$T/err"; }
}
P="$top_builddir"
perf_case "shoalrun -n 2 allreduce_perf -b 8 -e 1M -f 4: #wrong 0" \
    -n 2 --timeout 120 "$P/allreduce_perf" -b 8 -e 1M -f 4 -n 2 -w 1 -c 1
perf_case "shoalrun -n 3 allreduce_perf over tcp: #wrong 0" \
    -n 3 --timeout 120 -x SHOAL_TRANSPORT=tcp "$P/allreduce_perf" -b 8 -e 1M -f 4 -n 2 -w 1 -c 1
perf_case "shoalrun -n 3 broadcast_perf -r 1: #wrong 0" \
    -n 3 --timeout 120 "$P/broadcast_perf" -b 8 -e 256K -f 8 -n 2 -w 1 -c 1 -r 1
perf_case "shoalrun -n 3 allgather_perf: #wrong 0" \
    -n 3 --timeout 120 "$P/allgather_perf" -b 8 -e 256K -f 8 -n 2 -w 1 -c 1
perf_case "shoalrun -n 3 reduce_scatter_perf: #wrong 0" \
    -n 3 --timeout 120 "$P/reduce_scatter_perf" -b 8 -e 256K -f 8 -n 2 -w 1 -c 1

# 26-28: SHOAL_TUNING_FILE: rank 0 writes what it measured when the file is absent; a file
# that exists is read instead of measuring, its link and memory rates reach the cost model
# (on a loaded machine a run's measurement may not be believable: the file is then not
# written, and the next run measures again; it wrote a file with no link line, never rewritten)
tune="$T/tuning"
for i in 1 2 3; do
    run -n 2 --timeout 120 -x SHOAL_TUNING_FILE="$tune" "$P/allreduce_perf" -b 8 -e 8 -n 2 -w 1
    [ "$rc" -ne 0 ] || [ -f "$tune" ] && break
done
[ "$rc" -eq 0 ] && grep -q '^shm lat [0-9.]* bw [0-9.]* send [0-9.]* recv [0-9.]*$' "$tune"
ok $? "an absent tuning file is written after measuring (rc $rc)"
[ -f "$tune" ] || diag_file "$T/err"
printf 'shm lat 7.5 bw 3.25\nreduce lat 0 bw 12.5\ncopy lat 0 bw 20\n' > "$tune"
run -n 2 --timeout 120 -x SHOAL_TUNING_FILE="$tune" -x SHOAL_DEBUG=INFO \
    -x SHOAL_DEBUG_SUBSYS=TOPO "$P/allreduce_perf" -b 8 -e 8 -n 2 -w 1
[ "$rc" -eq 0 ] && grep -q 'link shm: 7.50 us, 3.250 GB/s' "$T/out" "$T/err"
ok $? "a tuning file's link figures replace the measurement (rc $rc)"
grep -q 'memory: reduce 12.50 GB/s, copy 20.00 GB/s' "$T/out" "$T/err"
ok $? "a tuning file's reduce and copy rates reach the cost model"

# 29-31: waiters poll before yielding only when no other local rank may run on their CPU
spin_plan() { # spin_plan SHOALRUN-PREFIX...: rc, and the trace lines in $T/spin
    run "$@" -x SHOAL_DEBUG=TRACE -x SHOAL_DEBUG_SUBSYS=INIT "$P/allreduce_perf" -b 8 -e 8 -n 2 -w 1
    grep -h 'pause polls before yielding' "$T/out" "$T/err" > "$T/spin"
}
if [ "$(nproc)" -ge 2 ]; then
    spin_plan -n 2 --timeout 60 --bind-to auto
    [ "$rc" -eq 0 ] && [ "$(grep -c 'cpu not shared, [1-9][0-9]* pause polls' "$T/spin")" -eq 2 ]
    ok $? "2 ranks bound to their own CPUs poll before yielding"
else
    n=$((n + 1)); echo "ok $n # SKIP one CPU: 2 ranks cannot have their own"
fi
run -n 2 --timeout 60 -x SHOAL_DEBUG=TRACE -x SHOAL_DEBUG_SUBSYS=INIT \
    sh -c 'exec taskset -c 0 "$0" -b 8 -e 8 -n 2 -w 1' "$P/allreduce_perf"
grep -h 'pause polls before yielding' "$T/out" "$T/err" > "$T/spin"
[ "$rc" -eq 0 ] && [ "$(grep -c 'bound to cpu 0 .*cpu shared, 0 pause polls' "$T/spin")" -eq 2 ]
ok $? "2 ranks bound to the same CPU yield at once (rc $rc)"
[ "$rc" -eq 0 ] || diag_file "$T/err"
nr=$(($(nproc) + 1))
spin_plan -n $nr --timeout 120
[ "$rc" -eq 0 ] && [ "$(grep -c 'cpu shared, 0 pause polls' "$T/spin")" -eq $nr ]
ok $? "$nr ranks on $(nproc) CPUs: every rank yields at once (rc $rc)"

# 32: --timeout and --grace take finite seconds (nan passed the range check)
bad=""
for a in "--timeout nan" "--timeout NaN" "--grace nan" "--grace inf" "--timeout -1"; do
    # shellcheck disable=SC2086 # the option and its value
    "$SHOALRUN" -n 1 $a true >/dev/null 2>"$T/err"; r=$?
    [ "$r" -eq 2 ] && grep -q "invalid ${a%% *} .*(seconds, 0..1e9)" "$T/err" || bad="$bad '$a':$r"
done
is "$bad" "" "non-finite or negative --timeout/--grace is a usage error (exit 2) naming the option"

# 33: SHOAL_SHM_DIR is where the shm segments are made (it was only where they were checked:
# they went to /dev/shm whatever it said), and nothing is left there
mkdir "$T/shmdir"
run -n 2 --timeout 60 -x SHOAL_TRANSPORT=shm -x "SHOAL_SHM_DIR=$T/shmdir" -x SHOAL_DEBUG=TRACE \
    -x SHOAL_DEBUG_SUBSYS=SHM "$P/allreduce_perf" -b 1M -e 1M -n 2 -w 1
[ "$rc" -eq 0 ] && [ "$(grep -c "segment $T/shmdir/shoal-[0-9a-f]*: " "$T/err")" -eq 2 ] &&
    [ -z "$(ls -A "$T/shmdir")" ]
ok $? "SHOAL_SHM_DIR=DIR: both ranks' segments made in DIR, none left after (rc $rc)"
# 34: SIGUSR1 (Slurm's --signal before the time limit) is passed on to every rank, and
# shoalrun lives on (it died of it, leaving what the ranks started running)
t0=$(date +%s)
"$SHOALRUN" -n 2 --timeout 60 sh -c 'trap "echo got-usr1; exit 0" USR1; echo $$ > '"$T"'/pid.$SHOAL_RANK; sleep 30 & wait' \
    >"$T/out" 2>"$T/err" &
pid=$!
wait_files "$T/pid.0" "$T/pid.1"
kill -USR1 $pid
wait $pid; rc=$?
secs=$(($(date +%s) - t0))
rm -f "$T"/pid.*
[ "$rc" -eq 0 ] && [ "$(grep -c '^\[[01]\] got-usr1$' "$T/out")" -eq 2 ] && [ "$secs" -lt 10 ]
ok $? "SIGUSR1 is forwarded to every rank, shoalrun exits with their status (rc $rc, ${secs}s)"
# 35: -x of a variable shoalrun sets per rank is a usage error: it went into the environment
# twice (C's getenv read the first, sh and Python the last)
bad=""
for v in SHOAL_RANK=7 SHOAL_NRANKS=3 SHOAL_UID SHOAL_LOCAL_RANK=0 SHOAL_LOCAL_SIZE=1; do
    "$SHOALRUN" -n 1 -x "$v" true >/dev/null 2>"$T/err"; r=$?
    [ "$r" -eq 2 ] && grep -q "^shoalrun: -x ${v%%=*}: shoalrun sets it for every rank itself" \
        "$T/err" || bad="$bad $v:$r"
done
is "$bad" "" "-x SHOAL_RANK=... and the other per-rank variables are refused (exit 2)"
# 36: the root in shoalrun waits for ranks that join later than SHOAL_TIMEOUT_MS after the
# start (it gave up, so they could not form the job), and the ranks keep the user's value
SHOAL_TIMEOUT_MS=1000 run -n 2 --timeout 60 -x SHOAL_TIMEOUT_MS=30000 \
    sh -c 'sleep 2.5; exec "$0" -b 8 -e 8 -n 1 -w 1' "$P/allreduce_perf"
[ "$rc" -eq 0 ] && ! grep -q 'giving up' "$T/err"
ok $? "ranks that init 2.5 s after the start join a root given SHOAL_TIMEOUT_MS=1000 (rc $rc)"
[ "$rc" -eq 0 ] || diag_file "$T/err"
# 37: a program execve refuses is reported with the reason (it said only "execve failed")
printf 'echo hi\n' > "$T/noshebang"; chmod +x "$T/noshebang"
printf '#!/nonexistent/interp\necho hi\n' > "$T/badinterp"; chmod +x "$T/badinterp"
run -n 1 "$T/noshebang"; a=$rc; cp "$T/err" "$T/err.a"
run -n 1 "$T/badinterp"
[ "$a" -eq 127 ] && [ "$rc" -eq 127 ] &&
    grep -q "rank setup failed: $T/noshebang: not an executable format (a script needs a #! line)" "$T/err.a" &&
    grep -q "rank setup failed: $T/badinterp: no such file, or its #! interpreter" "$T/err"
ok $? "execve's refusal names the program and why, exit 127 (got $a, $rc)"
# 38: ranks that disagree on the rank count: the refused one is told what to check (it got
# "the root refused this rank: invalid argument"), and the other learns the job failed (it
# waited SHOAL_TIMEOUT_MS)
run -n 2 --grace 1 --timeout 60 -x SHOAL_TIMEOUT_MS=5000 sh -c \
    'if [ "$SHOAL_RANK" = 1 ]; then export SHOAL_NRANKS=3; fi; exec "$0" -b 8 -e 8 -n 1 -w 1' \
    "$P/allreduce_perf"
[ "$rc" -ne 0 ] && grep -q "does not fit the job's: every rank needs the same SHOAL_NRANKS" "$T/err" &&
    grep -q "a rank joined twice or with another rank count" "$T/err"
ok $? "a rank of a job of another size is refused with a sentence naming SHOAL_NRANKS; the other is told at once (rc $rc)"
# 39: what a rank started in the background and left running is killed when the job ends
# (it went on, orphaned, after shoalrun had exited)
run -n 2 --timeout 60 sh -c 'sleep 60 >/dev/null 2>&1 & echo $! > '"$T"'/pid.$SHOAL_RANK'
i=0; while [ $i -lt 20 ] && ! all_dead "$T/pid.0" "$T/pid.1"; do sleep 0.1; i=$((i + 1)); done
[ "$rc" -eq 0 ] && all_dead "$T/pid.0" "$T/pid.1" && grep -q 'leaving processes of its group running' "$T/err"
ok $? "a rank's background child is killed at the job's end (rc $rc)"
for f in "$T"/pid.*; do [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
rm -f "$T"/pid.*
# 40: a SHOAL_UID left from a job that is over: the rank says that nothing listens at the
# root and why that may be (it said only that connect did not complete within the timeout)
run -n 1 --timeout 60 sh -c 'echo "$SHOAL_UID"'
stale=$(sed -n 's/^\[0\] //p' "$T/out")
SHOAL_UID=$stale SHOAL_RANK=0 SHOAL_NRANKS=2 SHOAL_TIMEOUT_MS=1000 timeout -s KILL 60 \
    "$P/allreduce_perf" -b 8 -e 8 -n 1 -w 1 >/dev/null 2>"$T/err"; r=$?
[ "$r" -ne 0 ] && grep -q "nothing listens at the root's address .*a SHOAL_UID left in the environment from an earlier job" "$T/err"
ok $? "a stale SHOAL_UID: the rank names the likely cause (rc $r)"
[ "$r" -ne 0 ] || diag_file "$T/err"
# 41: a segment left in SHOAL_SHM_DIR by a rank killed in the middle of init (no lock held,
# unmodified for 2 minutes) is removed by the next job's ranks; it stayed until reboot
mkdir -p "$T/shmdir2"
dead=$T/shmdir2/shoal-0123456789abcdef0123456789abcdef
head -c 65536 /dev/zero > "$dead" && chmod 600 "$dead" && touch -m -d '-2 minutes' "$dead"
run -n 2 --timeout 60 -x SHOAL_TRANSPORT=shm -x "SHOAL_SHM_DIR=$T/shmdir2" -x SHOAL_DEBUG=INFO \
    -x SHOAL_DEBUG_SUBSYS=SHM "$P/allreduce_perf" -b 8 -e 8 -n 1 -w 1
[ "$rc" -eq 0 ] && [ -z "$(ls -A "$T/shmdir2")" ] &&
    grep -q "removed segment $T/shmdir2/shoal-0123456789abcdef0123456789abcdef (65536 bytes): its owner died" "$T/err"
ok $? "a dead rank's leftover segment is removed by the next job (rc $rc)"
[ "$rc" -eq 0 ] && [ -z "$(ls -A "$T/shmdir2")" ] || diag_file "$T/err"
# 42: a reader of shoalrun's output that stops reading (a stuck consumer of a pipe, a terminal
# paused with Ctrl-S): --timeout still ends the job (shoalrun sat in write() until the reader
# went away, its timeout and SIGINT/SIGTERM unheeded)
rm -f "$T/rc"
t0=$(date +%s)
{ timeout -s KILL 60 "$SHOALRUN" -n 2 --timeout 2 sh -c 'yes | head -c 5000000; sleep 30' \
      2>"$T/err"; echo "$?" >"$T/rc"; } | sleep 40 &
reader=$!
wait_files "$T/rc"
secs=$(($(date +%s) - t0))
kill "$reader" 2>/dev/null
[ "$(cat "$T/rc" 2>/dev/null)" = 124 ] && [ "$secs" -lt 10 ] && grep -q 'timeout after 2 s' "$T/err"
ok $? "stdout's reader stops reading: --timeout 2 still ends the job (rc $(cat "$T/rc" 2>/dev/null), ${secs}s)"
# 43: stdout and stderr one pipe (2>&1) whose reader lags: every line arrives whole, none cut
# by the other stream's (their output waits in one queue)
timeout -s KILL 120 "$SHOALRUN" -n 2 --timeout 100 sh -c 'i=0; while [ $i -lt 20000 ]; do
    echo "out $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; echo "err $i yyyyyyyyyyyyyyyyyyyyyyy" >&2
    i=$((i + 1)); done' 2>&1 | { sleep 2; cat; } >"$T/out"
# shoalrun's own whole lines ("shoalrun: ...", or the library's log lines such as CI's
# "unknown environment variable SHOAL_TEST_TIMEOUT" warning) may come between the ranks' and
# are shown; any other line is a piece of a cut one
good=$(grep -c -E '^\[[01]\] (out [0-9]+ x{32}|err [0-9]+ y{23})$' "$T/out")
grep -v -E '^\[[01]\] (out [0-9]+ x{32}|err [0-9]+ y{23})$' "$T/out" >"$T/other"
[ "$good" -eq 80000 ] &&
    ! grep -q -v -E '^(shoalrun: |[^ ]+:[0-9]+:[0-9]+ shoal (ERROR|WARN|INFO) \[[A-Z_]+\] )' "$T/other"
ok $? "2>&1 through a reader that lags: all 80000 lines whole ($good whole, $(wc -l <"$T/other") other lines)"
[ -s "$T/other" ] && diag_file "$T/other"
# 44: -x given twice for one name: the last wins, once (both went into the environment: C's
# getenv read the first, sh the last)
run -n 1 --timeout 60 -x SHOALRUN_T42=first -x SHOALRUN_T42=second -x SHOALRUN_T42B=b1 \
    sh -c 'echo "$(env | grep -c "^SHOALRUN_T42=") $SHOALRUN_T42 $SHOALRUN_T42B"'
[ "$rc" -eq 0 ] && grep -q '^\[0\] 1 second b1$' "$T/out"
ok $? "-x twice for a name: the last value, once in the environment (rc $rc)"
[ "$rc" -eq 0 ] || diag_file "$T/err"
# 45: SIGTSTP (^Z reaches shoalrun's process group, not the ranks', which lead their own):
# the ranks stop, then shoalrun; SIGCONT resumes them all and the job ends well (shoalrun
# stopped alone and the ranks ran on)
state() { ps -o stat= -p "$1" 2>/dev/null | cut -c1; }
"$SHOALRUN" -n 2 --timeout 60 sh -c 'echo $$ > '"$T"'/tpid.$SHOAL_RANK
    i=0; while [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done; echo done' \
    >"$T/out" 2>"$T/err" &
pid=$!
wait_files "$T/tpid.0" "$T/tpid.1"
kill -TSTP $pid
i=0
while [ $i -lt 50 ] && [ "$(state $pid)" != T ]; do sleep 0.1; i=$((i + 1)); done
st="$(state $pid)$(state "$(cat "$T/tpid.0")")$(state "$(cat "$T/tpid.1")")"
sleep 4 # longer than the ranks' 3 s of work: stopped, they are not done
grep -q done "$T/out"; early=$?
kill -CONT $pid
wait $pid; rc=$?
rm -f "$T"/tpid.*
[ "$st" = TTT ] && [ $early -ne 0 ] && [ "$rc" -eq 0 ] && [ "$(grep -c '^\[[01]\] done$' "$T/out")" -eq 2 ]
ok $? "SIGTSTP stops the ranks and shoalrun (states $st), SIGCONT resumes them: both done (rc $rc)"
# 46: SIGQUIT (^\) is forwarded like SIGTERM: the ranks get it and exit on their own,
# shoalrun reports them and exits 128 + 3, as for any signal that ends the job (it died of
# it, the ranks only by its PDEATHSIG's SIGKILL, unreported). The ranks are
# perl: started with & from this script they inherit SIGQUIT ignored, which sh cannot trap.
"$SHOALRUN" -n 2 --timeout 60 perl -e '$SIG{QUIT} = sub { print "got-quit\n"; exit 3 };
    open(my $f, ">", "'"$T"'/qpid.$ENV{SHOAL_RANK}") or die; print $f "$$\n"; close($f);
    $| = 1; sleep 30;' >"$T/out" 2>"$T/err" &
pid=$!
wait_files "$T/qpid.0" "$T/qpid.1"
kill -QUIT $pid
wait $pid; rc=$?
rm -f "$T"/qpid.*
[ "$rc" -eq 131 ] && [ "$(grep -c '^\[[01]\] got-quit$' "$T/out")" -eq 2 ] &&
    grep -q '^shoalrun: Quit, forwarding it to 2 rank(s)' "$T/err" &&
    [ "$(grep -c '^shoalrun: rank [01] (pid [0-9]*) exited with status 3$' "$T/err")" -eq 2 ]
ok $? "SIGQUIT is forwarded to every rank, each exits on its own, shoalrun reports them (rc $rc)"
# 47: a rank that cannot be started (no fds left for its pipes): shoalrun kills the ranks it
# started, exits 1 and leaves the shell that ran it alone (the unstarted ranks' pid 0 made
# the final SIGKILL kill(-0): shoalrun's own process group, the shell included; and their
# fd 0 had the loop read shoalrun's stdin as their output)
cat > "$T/fdlimit.sh" <<'EOF'
ulimit -n 64 || exit 99
echo "stdin-line" | "$1" -n 40 --timeout 60 sh -c 'echo $$ > "$0.$SHOAL_RANK"; exec sleep 30' \
    "$2/fpid" >"$2/out" 2>"$2/err"
echo "$?" > "$2/alive"
EOF
rm -f "$T/alive"
timeout -s KILL 60 setsid -w sh "$T/fdlimit.sh" "$SHOALRUN" "$T"
# a rank killed before its echo leaves an empty file: those that wrote theirs
fpids=$(find "$T" -name 'fpid.*' -size +0 | tr '\n' ' ')
# shellcheck disable=SC2086 # the list of files
i=0; while [ $i -lt 50 ] && ! all_dead $fpids; do sleep 0.1; i=$((i + 1)); done
# shellcheck disable=SC2086
[ "$(cat "$T/alive" 2>/dev/null)" = 1 ] && grep -q '^shoalrun: pipe failed' "$T/err" &&
    [ -n "$fpids" ] && all_dead $fpids && ! grep -q stdin-line "$T/out"
ok $? "a rank that cannot be started: the others are killed, exit 1, the caller lives (rc $(cat "$T/alive" 2>/dev/null))"
[ -s "$T/alive" ] || diag_file "$T/err"
for f in "$T"/fpid.*; do [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
rm -f "$T"/fpid.*
# 48: empty lines arrive: one that ended what a read of the pipe returned was dropped (a lone
# "\n", the second of "a\n\n"), so a rank's `echo` printed nothing
run -n 1 --timeout 60 sh -c 'echo; echo x; sleep 0.2; printf "\n"; sleep 0.2; printf "a\n\n"
    sleep 0.2; echo end'
is "$rc:$(tr '\n' '|' <"$T/out")" "0:[0] |[0] x|[0] |[0] a|[0] |[0] end|" \
    "empty lines keep their place, each with its prefix"
# 49: a reader that lags when the ranks exit gets all they wrote: the last of it, still in
# their pipes (unread while SHOALRUN_PEND_MAX waited for the reader), was dropped 1 s after
# they exited (800 KiB: 79455 of 81920 lines, exit 0)
bad=""
for kib in 800 820; do
    got=$(timeout -s KILL 60 "$SHOALRUN" -n 1 --timeout 60 sh -c "yes 123456789 | head -c $((kib * 1024))" \
          2>"$T/err" | { sleep 3; wc -l; })
    [ "$got" -eq $((kib * 1024 / 10)) ] || bad="$bad ${kib}KiB:$got"
done
is "$bad" "" "a reader 3 s late: every line of 800 and 820 KiB arrives"
# 50: -n 600 (the help says 1..1024) under the usual soft limit of 1024 descriptors: shoalrun
# raises its own towards the hard one (the job failed at rank ~500 with "pipe failed: Too many
# open files"), and its ranks get the limit it was given
# shellcheck disable=SC3045 # dash's and bash's ulimit take -H and -S
hard=$(ulimit -H -n)
if [ "$hard" = unlimited ] || [ "$hard" -ge 1864 ]; then
    # shellcheck disable=SC3045
    (ulimit -S -n 1024 && exec timeout -s KILL 120 "$SHOALRUN" -n 600 --timeout 100 \
        sh -c 'ulimit -n') >"$T/out" 2>"$T/err"; rc=$?
    [ "$rc" -eq 0 ] && [ "$(grep -c '^\[[0-9]*\] 1024$' "$T/out")" -eq 600 ]
    ok $? "-n 600 under a soft limit of 1024 fds: runs, each rank sees 1024 (rc $rc)"
    [ "$rc" -eq 0 ] || diag_file "$T/err"
else
    n=$((n + 1)); echo "ok $n # SKIP hard limit of $hard fds: 600 ranks need 1864"
fi
# 51: started with SIGCHLD ignored (a parent's SIG_IGN passes through exec): the kernel reaped
# the ranks itself, waitpid never saw them, and shoalrun ran on forever after they exited,
# past its own --timeout (only SIGKILL ended it)
t0=$(date +%s)
timeout -s KILL 15 perl -e '$SIG{CHLD} = "IGNORE"; exec @ARGV or die' "$SHOALRUN" -n 2 \
    --timeout 5 sh -c 'exit $((SHOAL_RANK + 3))' >"$T/out" 2>"$T/err"; rc=$?
secs=$(($(date +%s) - t0))
[ "$rc" -eq 4 ] && [ "$secs" -lt 5 ] && grep -q 'rank 1 (pid [0-9]*) exited with status 4' "$T/err"
ok $? "SIGCHLD ignored by shoalrun's parent: the ranks' statuses are seen, exit 4 (rc $rc, ${secs}s)"
# 52: stdout closed by the caller (cmd >&-): the signalfd took fd 1, the ranks' output was
# queued for it and polled for room it never had, and the job never ended (killed here at
# 20 s); with stdin closed, rank 0 got fd 0 closed. /dev/null stands in for them now
t0=$(date +%s)
timeout -s KILL 20 "$SHOALRUN" -n 2 sh -c 'echo out; echo err >&2' >&- 2>"$T/err"; rc=$?
secs=$(($(date +%s) - t0))
timeout -s KILL 20 "$SHOALRUN" -n 1 sh -c 'cat; echo "cat $?"' <&- >"$T/out" 2>&1; rc2=$?
[ "$rc" -eq 0 ] && [ "$secs" -lt 10 ] && [ "$(grep -c '^\[[01]\] err$' "$T/err")" -eq 2 ] &&
    [ "$rc2" -eq 0 ] && grep -q '^\[0\] cat 0$' "$T/out"
ok $? "stdout or stdin closed by the caller: the job ends, its lines arrive (rc $rc in ${secs}s, $rc2)"
# 53: perf/ab.sh with -d all: every type of a size has its own row. The rows were keyed by
# size alone, so the ten types' times of one size went into one "median over the launches"
# (and "min" compared the fastest type of B with the fastest of A)
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
AB_TIMEOUT=60 timeout -s KILL 200 "$top_srcdir/perf/ab.sh" --reps 1 "$P" "$P" allreduce_perf \
    -b 1K -e 4K -f 4 -n 2 -w 1 -d all >"$T/out" 2>"$T/err"; rc=$?
rows=$(awk '$1 ~ /^[0-9]+$/' "$T/out" | wc -l)
[ "$rc" -eq 0 ] && [ "$rows" -eq 20 ] && grep -Eq '^ +1024 +int8 +sum ' "$T/out" &&
    grep -Eq '^ +4096 +double +sum ' "$T/out"
ok $? "perf/ab.sh -d all: one row per size and type (rc $rc, $rows rows of 20)"
[ "$rows" -eq 20 ] || { diag_file "$T/out"; diag_file "$T/err"; }
# 54: perf/nbc_overlap refuses a size it cannot read and no repetitions: "-b 8x" (strtoull
# stopped at the x: 8 bytes, two floats, timed as if it loaded the links) and "-n 0" (the
# medians of nothing read before their arrays) both ran and printed a ratio
run -n 3 --timeout 60 "$P/nbc_overlap" -b 8x -n 1; rc1=$rc
run -n 3 --timeout 60 "$P/nbc_overlap" -b 64 -n 0; rc2=$rc
run -n 3 --timeout 60 "$P/nbc_overlap" -b 64K -n 1
[ "$rc1" -eq 2 ] && [ "$rc2" -eq 2 ] && [ "$rc" -eq 0 ] && grep -q 'bytes 65536 reps 1 ' "$T/out"
ok $? "nbc_overlap: -b 8x and -n 0 refused (rc $rc1, $rc2), -b 64K times 65536 bytes (rc $rc)"
# 55: a rank's process group number stays the job's until the end. shoalrun reaped a rank at
# its exit, freeing its pid; at the job's end it killed the group of that number, which after a
# pid wraparound was a stranger's (as root, anyone's). Here, in a pid namespace of its own, the
# next pid is set to rank 0's once it has exited and a new session is started: it took rank 0's
# number and shoalrun killed it. Rank 0 is a zombie until the end now.
if [ "$(id -u)" = 0 ] && unshare -pf --kill-child --mount-proc true 2>/dev/null; then
    timeout -s KILL 60 unshare -pf --kill-child --mount-proc sh -c '
        SR=$1 T=$2
        "$SR" -n 2 --timeout 30 sh -c "if [ \"\$SHOAL_RANK\" = 0 ]; then echo \$\$ > $T/r0; exit 0; fi; sleep 2" &
        sr=$!
        i=0; while [ ! -s "$T/r0" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
        sleep 0.3
        p0=$(cat "$T/r0")
        echo $((p0 - 1)) > /proc/sys/kernel/ns_last_pid
        setsid sleep 60 &
        v=$!
        wait $sr; rc=$?
        alive=dead; kill -0 $v 2>/dev/null && alive=alive
        echo "rank0 $p0 stranger $v rc $rc $alive"
        kill $v 2>/dev/null' sh "$SHOALRUN" "$T" >"$T/out" 2>"$T/err"
    grep -q ' rc 0 alive$' "$T/out"
    ok $? "a stranger's process group that could take an exited rank's number is not killed ($(cat "$T/out"))"
    rm -f "$T/r0"
else
    echo "ok 55 # SKIP needs root and unshare --pid"
fi
exit 0
