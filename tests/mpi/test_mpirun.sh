#!/bin/sh
# TAP test of shoal under Open MPI's mpirun: libshoal_mpi (tests/mpi/test_shoal_mpi), the MPI
# example, the perf tools through shoal_comm_init_env with no MPI linked (unique id through
# PMIx, then through SHOAL_ROOT + SHOAL_SECRET), and the perf tools' MPI twins.
# Skips with the reason when mpirun (or a piece built only with MPI/PMIx) is missing.
# Needs: top_builddir (exported by `make check`; defaults to the current directory).

top_builddir=${top_builddir:-.}
B=$top_builddir
T=$(mktemp -d "${TMPDIR:-/tmp}/test_mpirun.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
unset SHOAL_UID SHOAL_ROOT SHOAL_SECRET SHOAL_RANK SHOAL_NRANKS SHOAL_LOCAL_RANK \
    SHOAL_LOCAL_SIZE SHOAL_TRANSPORT

NTESTS=39
echo "1..$NTESTS"
n=0
ok() { # ok COND-EXIT-STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else
        echo "not ok $n - $2"; diag; fi
}
skip() { # skip COUNT REASON
    i=0; while [ $i -lt "$1" ]; do i=$((i + 1)); n=$((n + 1)); echo "ok $n # SKIP $2"; done
}
diag() { sed 's/^/#   /' "$T/out" "$T/err" 2>/dev/null | tail -n 25; }

if ! command -v mpirun >/dev/null 2>&1; then
    skip $NTESTS "mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev)"
    exit 0
fi

# Root is refused by Open MPI unless told; 4 ranks on fewer cores need --oversubscribe.
# pml ob1 with the self/vader/tcp BTLs: what works on any machine (no UCX device needed).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader,tcp"
# Sanitizer builds: Open MPI and PMIx keep much of what they allocate until exit, which
# LeakSanitizer reports as leaks in every rank; leak checking is off for these runs only
# (the other tests keep it). ASan/UBSan errors still fail the runs.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS

# run NP PROGRAM ARGS...: under mpirun with an outer deadline; out/err in $T, status in $rc.
run() {
    np=$1; shift
    t0=$(date +%s)
    timeout -k 10 180 $MPIRUN -np "$np" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    secs=$(($(date +%s) - t0))
}
# wrong_ok: the perf table in $T/out has rows, each with #wrong 0 twice, and says OK.
wrong_ok() {
    awk '/^ *[0-9]/ { rows++; if ($9 != "0" || $13 != "0") bad++ }
         /Out of bounds values : 0 OK/ { okline = 1 }
         END { exit !(rows > 0 && bad == 0 && okline) }' "$T/out"
}

# 1-4: libshoal_mpi over MPI_COMM_WORLD and over the halves of a split, 4 and 3 ranks
if [ -x "$B/tests/mpi/test_shoal_mpi" ]; then
    for np in 4 3; do
        run $np "$B/tests/mpi/test_shoal_mpi"
        ok $rc "test_shoal_mpi, $np ranks: exit 0 (${secs}s)"
        [ "$(grep -c '^ok - ' "$T/out")" -eq 14 ] && ! grep -q '^not ok' "$T/out"
        ok $? "test_shoal_mpi, $np ranks: all 14 checks pass"
    done
else
    skip 4 "built without MPI: no tests/mpi/test_shoal_mpi"
fi

# 5-6: the example, as README tells users to run it
if [ -x "$B/examples/allreduce_mpi" ]; then
    run 4 "$B/examples/allreduce_mpi"
    ok $rc "mpirun -np 4 examples/allreduce_mpi exits 0 (${secs}s)"
    grep -q '^allreduce_mpi: 4 ranks, 1048576 floats each: correct on every rank$' "$T/out"
    ok $? "examples/allreduce_mpi prints a correct result"
else
    skip 2 "built without MPI: no examples/allreduce_mpi"
fi

# 7-15: shoal perf tools under mpirun, no MPI linked: the unique id goes through PMIx
if grep -q '^#define SHOAL_HAVE_PMIX 1' "$B/config.h" 2>/dev/null; then
    run 4 -x SHOAL_DEBUG=info -x SHOAL_DEBUG_SUBSYS=INIT "$B/allreduce_perf" -b 8 -e 1M -f 4 -c 1
    ok $rc "allreduce_perf under mpirun (PMIx) exits 0 (${secs}s)"
    wrong_ok
    ok $? "allreduce_perf under mpirun (PMIx): #wrong 0 at every size"
    [ "$(grep -c 'unique id exchanged through PMIx' "$T/err")" -eq 4 ]
    ok $? "all 4 ranks got the unique id through PMIx"
    run 4 -x SHOAL_TRANSPORT=tcp "$B/allreduce_perf" -b 8 -e 1M -f 32 -d all -o all
    [ $rc -eq 0 ] && wrong_ok
    ok $? "allreduce_perf under mpirun (PMIx), tcp, every dtype and op (${secs}s)"
    # broadcast_perf with a timeout one second short of INT_MAX ms: PMIx's timeout in whole
    # seconds was rounded up in int, an overflow (UBSan in the sanitizer build)
    for tool in broadcast_perf allgather_perf reduce_scatter_perf; do
        big=; [ "$tool" = broadcast_perf ] && big="-x SHOAL_TIMEOUT_MS=2147483647"
        # shellcheck disable=SC2086 # two words or none
        run 4 $big "$B/$tool" -b 8 -e 1M -f 8 -c 1
        [ $rc -eq 0 ] && wrong_ok
        ok $? "$tool under mpirun (PMIx): exit 0, #wrong 0 (${secs}s)"
    done
    # A stale PMIX_NAMESPACE with no server: PMIx_Init fails, the old error, quickly.
    t0=$(date +%s)
    PMIX_NAMESPACE=shoal-test-none SHOAL_RANK=0 SHOAL_NRANKS=2 \
        timeout -k 5 30 "$B/allreduce_perf" -b 8 -e 8 >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -ne 0 ] && [ $(($(date +%s) - t0)) -lt 10 ] &&
        grep -q 'neither SHOAL_UID nor SHOAL_ROOT is set, and no PMIx server' "$T/err"
    ok $? "PMIX_NAMESPACE without a server address: fails at once, naming SHOAL_UID, SHOAL_ROOT and PMIx"
    # A dead server (nothing listens on port 1): PMIx_Init fails; the same error, no crash.
    PMIX_NAMESPACE=shoal-test-none PMIX_RANK=0 PMIX_SERVER_URI41='1.0;tcp4://127.0.0.1:1' \
        SHOAL_RANK=0 SHOAL_NRANKS=2 timeout -k 5 30 "$B/allreduce_perf" -b 8 -e 8 \
            >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -eq 1 ] && grep -q 'neither SHOAL_UID nor SHOAL_ROOT is set, and no PMIx server' "$T/err"
    ok $? "PMIx server unreachable: PMIx_Init fails, the same error (rc $rc)"
else
    skip 9 "built without PMIx (Debian: libpmix-dev)"
fi

# 16-18: the same through SHOAL_ROOT + SHOAL_SECRET (rank 0 listens on the port)
port=$((20000 + $$ % 20000))
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
run 4 -x SHOAL_ROOT=127.0.0.1:$port -x SHOAL_SECRET=$secret -x SHOAL_DEBUG=info \
    -x SHOAL_DEBUG_SUBSYS=INIT "$B/allreduce_perf" -b 8 -e 1M -f 4 -c 1
ok $rc "allreduce_perf under mpirun (SHOAL_ROOT=127.0.0.1:$port) exits 0 (${secs}s)"
wrong_ok
ok $? "allreduce_perf under mpirun (SHOAL_ROOT): #wrong 0 at every size"
! grep -q 'through PMIx' "$T/err"
ok $? "SHOAL_ROOT wins over PMIx"

# 19: a wrong secret on one rank is refused (auth), and nothing hangs
run 2 -x SHOAL_ROOT=127.0.0.1:$((port + 1)) -x SHOAL_SECRET=$secret -x SHOAL_TIMEOUT_MS=20s \
    sh -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && SHOAL_SECRET=$(echo "$SHOAL_SECRET" | tr 0-9a-f 1-9a-f0); export SHOAL_SECRET; exec "$0" -b 8 -e 8' "$B/allreduce_perf"
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ]
ok $? "SHOAL_ROOT with a different secret on rank 1 fails (rc $rc, ${secs}s)"

# 20-28: the MPI twins print the same table for Open MPI
if [ -x "$B/allreduce_perf_mpi" ]; then
    run 4 "$B/allreduce_perf_mpi" -b 8 -e 1M -f 4 -c 1
    ok $rc "allreduce_perf_mpi exits 0 (${secs}s)"
    wrong_ok
    ok $? "allreduce_perf_mpi: #wrong 0 at every size"
    grep -q '^# allreduce_perf_mpi: Open MPI' "$T/out"
    ok $? "allreduce_perf_mpi names Open MPI in its header"
    run 4 "$B/allreduce_perf_mpi" -b 8 -e 64K -f 64 -d all -o all
    [ $rc -eq 0 ] && wrong_ok
    ok $? "allreduce_perf_mpi, every dtype and op MPI has: #wrong 0 (${secs}s)"
    grep -q '^# half sum: not supported by Open MPI' "$T/out" &&
        grep -q '^# bfloat16 max: not supported' "$T/out" &&
        grep -q '^# float avg: not supported' "$T/out"
    ok $? "allreduce_perf_mpi reports half, bfloat16 and avg as not supported"
    for tool in broadcast_perf_mpi allgather_perf_mpi reduce_scatter_perf_mpi; do
        run 4 "$B/$tool" -b 8 -e 1M -f 8 -c 1
        [ $rc -eq 0 ] && wrong_ok
        ok $? "$tool: exit 0, #wrong 0 (${secs}s)"
    done
    run 3 "$B/reduce_scatter_perf_mpi" -b 8 -e 64K -f 8 -d int32 -o all
    [ $rc -eq 0 ] && wrong_ok
    ok $? "reduce_scatter_perf_mpi, 3 ranks, int32, every op: #wrong 0 (${secs}s)"
else
    skip 9 "built without MPI: no MPI twins of the perf tools"
fi

# 29-30: SHOAL_NRANKS / SHOAL_RANK set alone and different from the launcher's value: an
# error naming both at once (the launcher's values used to win silently: a 2-rank job ran
# where 3 were asked for)
run 2 -x SHOAL_NRANKS=3 -x SHOAL_TIMEOUT_MS=20s "$B/allreduce_perf" -b 8 -e 8
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -lt 15 ] &&
    [ "$(grep -c 'SHOAL_NRANKS=3, but the launcher says OMPI_COMM_WORLD_SIZE=2' "$T/err")" -eq 2 ]
ok $? "mpirun -x SHOAL_NRANKS=3 -np 2: both ranks fail at once naming both values (rc $rc, ${secs}s)"
OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 SHOAL_RANK=0 SHOAL_TIMEOUT_MS=20s \
    timeout -k 5 30 "$B/allreduce_perf" -b 8 -e 8 >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 1 ] && grep -q 'SHOAL_RANK=0, but the launcher says OMPI_COMM_WORLD_RANK=1' "$T/err"
ok $? "SHOAL_RANK=0 alone where Open MPI says rank 1: the same error (rc $rc)"

# 31: launcher variables that are not a rank below a size: an error naming them, at once (they
# were read with atoi: "abc" was rank 0, which then listened as the job's root, "2junk" size 2)
bad=""
for v in "abc 2" "1x 2" "0 2junk" "2 2" "-1 2" "0 99999999999" " 2"; do
    r=${v% *} s=${v##* }
    OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$s SHOAL_ROOT=127.0.0.1:$((port + 2)) \
        SHOAL_SECRET=$secret SHOAL_TIMEOUT_MS=20s timeout -k 5 30 "$B/allreduce_perf" -b 8 -e 8 \
        >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -eq 1 ] && grep -qF "the launcher's OMPI_COMM_WORLD_RANK='$r' and OMPI_COMM_WORLD_SIZE='$s' are not a rank and a size" "$T/err" ||
        bad="$bad [$v: rc $rc]"
done
[ -z "$bad" ]
ok $? "launcher rank/size not numbers, or rank >= size: an error naming both at once${bad:+ (failed:$bad)}"

# 32: a PMIx server address where something accepts and never answers (a stopped launcher, a
# stale PMIX_SERVER_URI whose port another process holds): PMIx_Init gives up at
# SHOAL_TIMEOUT_MS and the no-PMIx error follows (PMIx_Init waited for the handshake forever)
if ! grep -q '^#define SHOAL_HAVE_PMIX 1' "$B/config.h" 2>/dev/null; then
    skip 1 "built without PMIx (Debian: libpmix-dev)"
elif ! command -v python3 >/dev/null 2>&1; then
    skip 1 "no python3 for the silent listener"
else
    hport=$((port + 3))
    python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16); s.settimeout(0.5); held = []
end = time.time() + 60
while time.time() < end:
    try: held.append(s.accept()[0])
    except OSError: pass' "$hport" &
    listener=$!
    sleep 1
    t0=$(date +%s)
    PMIX_NAMESPACE=shoal-test-silent PMIX_RANK=0 PMIX_SERVER_URI41="1.0;tcp4://127.0.0.1:$hport" \
        SHOAL_RANK=0 SHOAL_NRANKS=2 SHOAL_TIMEOUT_MS=3s timeout -k 5 40 "$B/allreduce_perf" \
        -b 8 -e 8 >"$T/out" 2>"$T/err"
    rc=$?
    secs=$(($(date +%s) - t0))
    kill "$listener" 2>/dev/null
    wait "$listener" 2>/dev/null
    [ $rc -eq 1 ] && [ $secs -lt 15 ] &&
        grep -q 'neither SHOAL_UID nor SHOAL_ROOT is set, and no PMIx server' "$T/err"
    ok $? "a PMIx server that never answers: PMIx_Init gives up at SHOAL_TIMEOUT_MS (rc $rc, ${secs}s)"
fi

# 33: the PMIx server stops answering after the handshake (mpirun stopped while rank 0 waits in
# the fence for rank 1, which never calls): rank 0 gives up 2 s after SHOAL_TIMEOUT_MS (its
# PMIx_Fence waited for the server's answer forever: the server enforces PMIX_TIMEOUT). mpirun
# is stopped once rank 0 listens (its rendezvous root: it starts after PMIx_Init, just before
# the fence); rank 0's output would go through the stopped mpirun: it reports through files.
if grep -q '^#define SHOAL_HAVE_PMIX 1' "$B/config.h" 2>/dev/null; then
    rm -f "$T/r0.rc" "$T/r0.err" "$T/r0.pid"
    timeout -k 5 120 $MPIRUN -np 2 -x SHOAL_TIMEOUT_MS=8s sh -c '
        [ "$OMPI_COMM_WORLD_RANK" = 1 ] && exec sleep 60
        t0=$(date +%s)
        sh -c "echo \$\$ >$1/r0.pid; exec \"\$0\" -b 8 -e 8" "$0" 2>"$1/r0.err"
        echo "$? $(($(date +%s) - t0))" >"$1/r0.rc"' "$B/allreduce_perf" "$T" >/dev/null 2>&1 &
    timeout_pid=$!
    i=0
    until [ -s "$T/r0.pid" ] && ss -Htlnp 2>/dev/null | grep -q "pid=$(cat "$T/r0.pid")," ||
        [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done
    sleep 0.3
    mpirun_pid=$(pgrep -P "$timeout_pid" | head -n 1)
    [ -n "$mpirun_pid" ] && kill -STOP "$mpirun_pid"
    i=0; while [ ! -s "$T/r0.rc" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    [ -n "$mpirun_pid" ] && kill -CONT "$mpirun_pid" && kill "$mpirun_pid"
    wait "$timeout_pid" 2>/dev/null
    set -- $(cat "$T/r0.rc" 2>/dev/null)
    [ "${1:-}" = 1 ] && [ "${2:-99}" -lt 25 ] &&
        grep -q 'no answer from the PMIx server within 10 s' "$T/r0.err"
    ok $? "the PMIx server stops answering in the fence: rank 0 fails at the timeout (rc ${1:-none}, ${2:-?}s)"
    [ "${1:-}" = 1 ] || sed 's/^/#   /' "$T/r0.err" 2>/dev/null | tail -n 10
else
    skip 1 "built without PMIx (Debian: libpmix-dev)"
fi

# 34: no usable rank/size, and the message names what to fix (it said "no rank/size (set
# SHOAL_RANK and SHOAL_NRANKS ...)" also where both were set, rank 2 of 2, or where one was and
# the other missing or not a number, or where Slurm set SLURM_PROCID but not SLURM_NTASKS);
# a rank below -1 or a count of 0 is an error (it was taken as "from the launcher")
bad=""
for v in "SHOAL_RANK=2 SHOAL_NRANKS=2|SHOAL_RANK=2 is not below SHOAL_NRANKS=2" \
    "SHOAL_RANK=1|SHOAL_RANK=1 is set, but SHOAL_NRANKS is not" \
    "SHOAL_RANK=1 SHOAL_NRANKS=2x|SHOAL_RANK=1 is set, but SHOAL_NRANKS is not" \
    "SHOAL_NRANKS=2|SHOAL_NRANKS=2 is set, but SHOAL_RANK is not" \
    "SLURM_PROCID=1 SLURM_STEP_ID=0|SLURM_PROCID is set but SLURM_NTASKS is not" \
    "PMI_SIZE=2|PMI_SIZE is set but PMI_RANK is not" \
    "SHOAL_RANK=-5 SHOAL_NRANKS=2|SHOAL_RANK is below 0 (-1, the default" \
    "SHOAL_RANK=0 SHOAL_NRANKS=0|SHOAL_NRANKS is below 1 (-1, the default"; do
    vars=${v%%|*} want=${v#*|}
    env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMIX_SIZE -u PMI_RANK \
        -u PMI_SIZE -u SLURM_PROCID -u SLURM_NTASKS $vars SHOAL_ROOT=127.0.0.1:$((port + 4)) \
        SHOAL_SECRET=$secret SHOAL_TIMEOUT_MS=20s timeout -k 5 30 "$B/allreduce_perf" -b 8 -e 8 \
        >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -eq 1 ] && grep -qF "$want" "$T/err" || bad="$bad [$vars: rc $rc]"
done
[ -z "$bad" ]
ok $? "no rank/size: the error names the variable to fix${bad:+ (failed:$bad)}"

# 35: rank 0's PMIx_Put of the unique id fails (libpmixfail preloaded there): every rank
# still fences, and the others fail at once naming rank 0 (rank 0 returned before the fence and
# the others waited in it for SHOAL_TIMEOUT_MS, 30 s here; past the fence, asked of the server,
# the key rank 0 never put was waited for as long). Rank 0 stays connected to its PMIx server
# until the others are done, as a program that goes on after the error would (a process that
# ends is reported by the server, which ends the others' fence at once).
shim=$B/tests/mpi/.libs/libpmixfail.so
if ! grep -q '^#define SHOAL_HAVE_PMIX 1' "$B/config.h" 2>/dev/null || [ ! -f "$shim" ]; then
    skip 1 "built without PMIx (Debian: libpmix-dev)"
else
    rm -f "$T"/f[0-2].rc "$T"/f[0-2].err "$T/f.done"
    timeout -k 5 120 $MPIRUN -np 3 -x SHOAL_TIMEOUT_MS=30s sh -c '
        r=$OMPI_COMM_WORLD_RANK t0=$(date +%s)
        if [ "$r" = 0 ]; then
            ASAN_OPTIONS="$ASAN_OPTIONS:verify_asan_link_order=0" LD_PRELOAD=$2 \
                PMIXFAIL_LINGER_S=60 PMIXFAIL_LINGER_UNTIL=$1/f.done \
                "$0" -b 8 -e 8 >/dev/null 2>"$1/f$r.err"
        else
            "$0" -b 8 -e 8 >/dev/null 2>"$1/f$r.err"
        fi
        echo "$? $(($(date +%s) - t0))" >"$1/f$r.rc"
        [ -s "$1/f1.rc" ] && [ -s "$1/f2.rc" ] && touch "$1/f.done"
        exit 0' "$B/allreduce_perf" "$T" "$shim" >"$T/out" 2>"$T/err"
    bad=""
    for r in 1 2; do
        set -- $(cat "$T/f$r.rc" 2>/dev/null)
        [ "${1:-}" = 1 ] && [ "${2:-99}" -lt 20 ] || bad="$bad [rank $r: rc ${1:-none}, ${2:-?}s]"
        grep -q 'rank 0 published no unique id' "$T/f$r.err" || bad="$bad [rank $r's error]"
    done
    set -- $(cat "$T/f0.rc" 2>/dev/null)
    [ "${1:-}" = 1 ] || bad="$bad [rank 0: rc ${1:-none}]"
    grep -q 'PMIx_Put/PMIx_Commit(shoal.uid.0) failed' "$T/f0.err" || bad="$bad [rank 0's error]"
    what="rank 0's PMIx_Put fails: every rank fails at once, the others naming rank 0"
    [ -z "$bad" ]
    ok $? "$what${bad:+ (failed:$bad)}"
    [ -z "$bad" ] || sed 's/^/#   /' "$T"/f[0-2].err 2>/dev/null | tail -n 20
fi

# 36-37: the id's root waits cfg's timeout, not SHOAL_TIMEOUT_MS: a rank 3 s late with
# SHOAL_TIMEOUT_MS=1000 and cfg.timeout_ms 20000 still gets its communicator
if [ -x "$B/tests/mpi/test_shoal_mpi" ]; then
    run 3 -x SHOAL_TIMEOUT_MS=1000 "$B/tests/mpi/test_shoal_mpi" late
    ok $rc "test_shoal_mpi late, 3 ranks: exit 0 (${secs}s)"
    [ "$(grep -c '^ok - ' "$T/out")" -eq 2 ] && ! grep -q '^not ok' "$T/out"
    ok $? "test_shoal_mpi late: a rank past SHOAL_TIMEOUT_MS but within cfg's timeout joins"
else
    skip 2 "built without MPI: no tests/mpi/test_shoal_mpi"
fi

# 38-39: shoal_comm_init_env through PMIx with cfg.tenant and cfg.job_name: rank 0's id is
# made for cfg's identity (it was made for the environment's: every rank refused at the join)
if [ ! -x "$B/tests/mpi/test_shoal_mpi" ]; then
    skip 2 "built without MPI: no tests/mpi/test_shoal_mpi"
elif ! grep -q '^#define SHOAL_HAVE_PMIX 1' "$B/config.h" 2>/dev/null; then
    skip 2 "built without PMIx (Debian: libpmix-dev)"
else
    run 3 "$B/tests/mpi/test_shoal_mpi" env
    ok $rc "test_shoal_mpi env, 3 ranks: exit 0 (${secs}s)"
    [ "$(grep -c '^ok - ' "$T/out")" -eq 1 ] && ! grep -q '^not ok' "$T/out"
    ok $? "test_shoal_mpi env: shoal_comm_init_env (PMIx) with cfg's tenant and job joins"
fi
