#!/bin/sh
# shoal under a real Slurm (TAP). Starts, in a temp dir and on loopback only, munged (its own
# key and socket), slurmctld and slurmd (a generated slurm.conf: this host as the one node with
# its real CPUs, proctrack/linuxproc, task/none, no cgroups, select/cons_tres, partitions
# "reserved" and "spot" with preempt/partition_prio and a GraceTime on spot, non-default
# ports), then:
#   1. srun --mpi=pmix -n 4 of tests/slurm/slurm_rank: the unique id through Slurm's PMIx
#      server, allreduces checked on every rank; again with -m arbitrary and a SLURM_HOSTFILE
#      (the planner's per-rank placement), each rank on its line's host;
#   2. sbatch --nodelist=<the planner's node list> --signal=USR1@N: every rank gets USR1, all
#      stop at the same step, write a checkpoint, the job completes;
#   3. a spot job preempted by a reserved one: the spot ranks get SIGTERM (the grace time
#      begins), stop at the same step and checkpoint, the job requeues itself, the reserved job
#      runs, and the spot job comes back with SLURM_RESTART_COUNT=1;
#   4. the communicator's identity: job = SLURM_JOB_ID, epoch = SLURM_RESTART_COUNT (0, then 1
#      after the requeue);
#   5. srun of the same loop where only one rank gets the signal: all still stop together.
#   6. a batch script that runs the program without srun: an error naming srun, at once;
#   7. srun --preserve-env -n 2 in an allocation of 4: a job of 2 ranks (SLURM_STEP_NUM_TASKS);
#   8. shoal_config_t.timeout_ms bounds the PMIx exchange when a rank never calls;
#   9. and is how long a SHOAL_ROOT root waits for a late rank (not SHOAL_TIMEOUT_MS).
# Every daemon is stopped and the temp dir removed at the end, also on failure; the last test
# checks that no process of this Slurm is left. Skips (with the reason) only where Slurm
# cannot run here: not root, or Slurm/munge not installed, or shoal built without PMIx.
#
# Knobs (environment):
#   SLURMTEST_PLACE_CMD  the command that makes case 2's node list: run as
#                        "$SLURMTEST_PLACE_CMD SLURM_CONF NTASKS", it prints a Slurm hostlist
#                        (default: tests/slurm/place_cmd.sh, i.e. shoal-place, when built).
#   SLURMTEST_HOSTFILE_CMD  the command that makes case 1b's SLURM_HOSTFILE (srun -m
#                        arbitrary: one host per rank, in rank order), run the same way; it
#                        prints the file (default: shoal-place through place_cmd.sh).
#   SLURMTEST_KEEP=1     keep the temp dir (logs) after the test.
# Needs: top_builddir (exported by `make check`; defaults to the current directory).

top_builddir=${top_builddir:-.}
top_builddir=$(cd "$top_builddir" && pwd)
export top_builddir
if [ -x "$top_builddir/shoal-place" ]; then
    here=$(cd "$(dirname "$0")" && pwd)
    : "${SLURMTEST_PLACE_CMD:=$here/place_cmd.sh nodelist}"
    : "${SLURMTEST_HOSTFILE_CMD:=$here/place_cmd.sh slurm_hostfile}"
fi
B=$top_builddir
PROG=$B/tests/slurm/slurm_rank
unset SHOAL_UID SHOAL_ROOT SHOAL_SECRET SHOAL_RANK SHOAL_NRANKS SHOAL_LOCAL_RANK \
    SHOAL_LOCAL_SIZE SHOAL_TRANSPORT SHOAL_JOB SHOAL_EPOCH SHOAL_TENANT SHOAL_CREDENTIAL
# Run inside another Slurm job (or its srun), its SLURM_* would point the clients at that job.
for v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done

skip_all() { echo "1..0 # SKIP $1"; exit 0; }

[ "$(id -u)" = 0 ] || skip_all "needs root (slurmd starts job steps as their user; CI runs as root)"
for c in munged munge unmunge slurmctld slurmd srun sbatch sinfo squeue scontrol scancel; do
    command -v "$c" >/dev/null 2>&1 ||
        skip_all "no $c (Debian: apt-get install slurmctld slurmd slurm-client munge)"
done
[ -x "$PROG" ] || skip_all "$PROG not built"
grep -q '^#define SHOAL_HAVE_PMIX 1' "$B/config.h" 2>/dev/null ||
    skip_all "shoal built without PMIx (Debian: libpmix-dev): no unique id through srun --mpi=pmix"

NODE=$(hostname -s 2>/dev/null || hostname)
# One short dir: munge's and PMIx's unix socket paths live under it (108 bytes at most).
T=$(mktemp -d "${TMPDIR:-/tmp}/shoal-slurm.XXXXXX") || exit 1
CONF=$T/slurm.conf
PIDS="" # the daemons this test started

# Every process of this Slurm: the daemons, slurmstepd and the jobs' tasks all carry
# SLURM_CONF=$CONF in their environment (the daemons get it below, the jobs from the clients).
ours() {
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        [ "$p" = "$$" ] && continue
        { tr '\0' '\n' < "$d/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$CONF" && echo "$p"
    done
}
stop_all() { # cancel the jobs, stop the daemons (TERM, then KILL), sweep what is left
    if [ -n "$PIDS" ]; then
        sl scancel --quiet --user=root 2>/dev/null
        i=0
        while [ $i -lt 50 ] && sl squeue -h -o %i 2>/dev/null | grep -q .; do
            sleep 0.2; i=$((i + 1))
        done
        # slurmd first (it ends its steps), then slurmctld, then munged
        for p in $PIDS; do
            kill -TERM "$p" 2>/dev/null
            i=0
            while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
            kill -KILL "$p" 2>/dev/null
            wait "$p" 2>/dev/null
        done
        PIDS=""
    fi
    for p in $(ours); do kill -KILL "$p" 2>/dev/null; done
}
cleanup() {
    stop_all
    if [ "${SLURMTEST_KEEP:-0}" = 1 ]; then echo "# kept $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

sl() { SLURM_CONF=$CONF "$@"; } # a Slurm client (or daemon) of this test's cluster

n=0
fails=0
bail() { echo "Bail out! $1"; exit 1; }
ok() { # ok EXIT-STATUS DESCRIPTION [LOG...]: one TAP line; the logs' tails on failure
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; return 0; fi
    echo "not ok $n - $2"; fails=$((fails + 1)); shift 2
    for f in "$@"; do [ -f "$f" ] && { echo "#   --- $f"; tail -n 25 "$f" | sed 's/^/#   /'; }; done
    return 1
}
# wait_for SECONDS COMMAND...: polls COMMAND every 0.2 s until it succeeds; 1 on timeout.
wait_for() {
    w_end=$(($(date +%s) + $1)); shift
    while ! "$@"; do
        [ "$(date +%s)" -ge "$w_end" ] && return 1
        sleep 0.2
    done
    return 0
}
# rank_stacks FILE: the threads' stacks (gdb) of every slurm_rank still running, into FILE:
# a rank that does not exit once it stopped is named with the place it waits.
rank_stacks() {
    : > "$1"
    for p in $(pgrep -f "$PROG loop" 2>/dev/null); do
        echo "slurm_rank pid $p still running: $(ps -o stat=,etimes=,args= -p "$p" | cut -c1-120)"
        command -v gdb > /dev/null 2>&1 &&
            timeout 30 gdb -batch -nx -p "$p" -ex 'thread apply all bt 6' 2>/dev/null |
            grep -E '^(Thread|#[0-9])' | cut -c1-150
    done >> "$1"
}
# free_port: a TCP port nothing listens on (the base comes from the pid, so two runs differ).
free_port() {
    p=$((17000 + ($$ + $1 * 7919) % 8000))
    while ss -Htln "sport = :$p" 2>/dev/null | grep -q .; do p=$((p + 1)); done
    echo "$p"
}
jobfield() { # jobfield JOBID FIELD: a field of scontrol show job (nothing without a job id)
    [ -n "$1" ] || return 0
    sl scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}
job_state() { jobfield "$1" JobState; }
job_is() { [ "$(job_state "$1")" = "$2" ]; }
job_finished() { # the job reached a final state (any: the callers check which)
    case "$(job_state "$1")" in
    COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PREEMPTED|BOOT_FAIL|DEADLINE|OUT_OF_MEMORY)
        return 0 ;;
    esac
    return 1
}
lines() { grep -c "$@" 2>/dev/null || true; } # lines PATTERN FILE: matching lines (0 if none)
# same_step FILE: 4 "stop rank=R step=S" lines, one per rank, all with the same S; prints S
same_step() {
    awk '/^stop rank=/ { split($2, r, "="); split($3, s, "="); seen[r[2]] = 1; step[s[2]] = 1
                         n++; last = s[2] }
         END { k = 0; for (x in step) k++; m = 0; for (x in seen) m++
               if (n != 4 || k != 1 || m != 4) exit 1; print last }' "$1"
}

# ---- start: munge, slurmctld, slurmd -----------------------------------------------------
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/log" "$T/out" "$T/ckpt2" "$T/ckpt3" "$T/ckpt5" ||
    exit 1
# Sanitizer builds: libpmix keeps a few strings from PMIx_Init until exit (PMIx 4.2), which
# LeakSanitizer reports in every rank; those, and only those, are suppressed (srun passes the
# environment to the ranks). shoal's own leaks still fail the runs.
printf 'leak:libpmix.so\n' > "$T/lsan.supp"
LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$T/lsan.supp"
export LSAN_OPTIONS
chmod 711 "$T" "$T/munge" # munged: its socket's dir must be searchable by all
if command -v mungekey >/dev/null 2>&1; then
    mungekey -c -b 1024 -k "$T/munge/munge.key" 2>"$T/log/mungekey.err"
else
    (umask 077; dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 2>/dev/null)
fi
chmod 600 "$T/munge/munge.key"
MSOCK=$T/munge/sock
SLURM_CONF=$CONF munged -F --socket="$MSOCK" --key-file="$T/munge/munge.key" \
    --pid-file="$T/munge/munged.pid" --log-file="$T/log/munged.log" \
    --seed-file="$T/munge/seed" --num-threads=2 >"$T/log/munged.out" 2>&1 &
MUNGE_PID=$!
munge_ok() { munge -S "$MSOCK" -n 2>/dev/null | unmunge -S "$MSOCK" >/dev/null 2>&1; }
wait_for 15 munge_ok
ok $? "munged (own key, socket in the temp dir) encodes and decodes a credential" \
    "$T/log/munged.out" "$T/log/munged.log" || bail "munged did not start"

CTLD_PORT=$(free_port 1)
SLURMD_PORT=$(free_port 2)
[ "$SLURMD_PORT" = "$CTLD_PORT" ] && SLURMD_PORT=$((CTLD_PORT + 1))
# This machine as slurmd sees it (CPUs, sockets, cores, threads, memory): no overcommitted
# node description, so Slurm places exactly what the hardware holds.
HW=$(slurmd -C 2>/dev/null | head -1 | sed -n 's/^NodeName=[^ ]* //p')
[ -n "$HW" ] || HW="CPUs=$(nproc)"
CPUS=$(echo "$HW" | tr ' ' '\n' | sed -n 's/^CPUs=//p')
GRACE=20
cat > "$CONF" <<EOF
# Generated by tests/slurm/test_slurm.sh: a one-node cluster on loopback, in $T.
ClusterName=shoaltest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MSOCK
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$T/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$(hostname) $HW State=UNKNOWN
PartitionName=reserved Nodes=$NODE PriorityTier=10 PreemptMode=OFF MaxTime=10 Default=YES State=UP
PartitionName=spot Nodes=$NODE PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE MaxTime=10
EOF
: > "$T/plugstack.conf" # no SPANK plugins from /etc/slurm
SLURM_CONF=$CONF slurmctld -D -i -f "$CONF" >"$T/log/slurmctld.out" 2>&1 &
CTLD_PID=$!
SLURM_CONF=$CONF slurmd -D -f "$CONF" -N "$NODE" >"$T/log/slurmd.out" 2>&1 &
SLURMD_PID=$!
PIDS="$SLURMD_PID $CTLD_PID $MUNGE_PID"
node_idle() { [ "$(sl sinfo -h -n "$NODE" -o %t 2>/dev/null | head -1)" = "idle" ]; }
t0=$(date +%s)
wait_for 60 node_idle
rc=$?
d="$(($(date +%s) - t0))s, $CPUS CPUs, ports $CTLD_PORT/$SLURMD_PORT"
ok $rc "slurmctld and slurmd up: sinfo shows $NODE idle ($d)" \
    "$T/log/slurmctld.out" "$T/log/slurmctld.log" "$T/log/slurmd.out" "$T/log/slurmd.log" ||
    bail "slurmctld/slurmd did not bring $NODE up"
sl srun --mpi=list >"$T/out/mpilist" 2>&1
grep -qw pmix "$T/out/mpilist"
ok $? "srun --mpi=list offers pmix" "$T/out/mpilist"

# Four ranks on fewer CPUs: --overcommit (one CPU per task is Slurm's default).
OC=""
[ "${CPUS:-1}" -lt 4 ] && OC="--overcommit"
# The environment of ranks that Slurm signals while they may be exiting (cases 2 and 3):
# without LeakSanitizer's exit check, which a SIGCONT inside it makes wait forever (case 3).
NOLEAK_ASAN="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

# ---- case 2 first (its USR1 comes from slurmctld's periodic time-limit check, up to 30 s
# after the start), so that case 1 runs while it waits ------------------------------------
# The node list: shoal-place's output when SLURMTEST_PLACE_CMD names it, else this node.
if [ -n "${SLURMTEST_PLACE_CMD:-}" ]; then
    NODELIST=$($SLURMTEST_PLACE_CMD "$CONF" 4 2>"$T/out/place.err")
else
    NODELIST=$NODE
fi
# --time=1 and USR1@58: the warning is due 2 s after the start; the rank loop gives up after
# 90 s without it (exit 3).
# Slurm follows the warning with a SIGCONT: the kernel's signal_generate trace of one run
# showed slurmstepd send USR1 to the 4 ranks, then SIGCONT from another of its threads 4 ms
# later, and the ranks enter LeakSanitizer's exit check 30-80 ms after that. Under load the
# SIGCONT can land inside that check, which then waits forever (see case 3): in one ASan CI
# run a rank stopped and checkpointed, but lived on until the time limit killed the job. So
# these ranks, like case 3's, run without the exit check; cases 1, 1b and 5 keep it.
cat > "$T/case2.sh" <<EOF
#!/bin/sh
echo "batch job=\$SLURM_JOB_ID nodelist=\$SLURM_JOB_NODELIST"
ASAN_OPTIONS="$NOLEAK_ASAN" srun --mpi=pmix -n 4 $OC "$PROG" loop 90 "$T/ckpt2"
echo "srun exit \$?"
EOF
J2=$(sl sbatch --parsable -p reserved -J shoal-case2 --nodelist="$NODELIST" -n 4 $OC \
         --time=1 --signal=USR1@58 -o "$T/out/case2.out" "$T/case2.sh" 2>"$T/out/case2.err")
[ -n "$J2" ]
ok $? "sbatch --nodelist=$NODELIST --signal=USR1@58 accepted (job ${J2:-none})" \
    "$T/out/case2.err" "$T/out/place.err"

# ---- case 1: srun --mpi=pmix -n 4 --------------------------------------------------------
t0=$(date +%s)
sl timeout -k 5 120 srun --mpi=pmix -J shoal-case1 -n 4 $OC "$PROG" check 20 65536 \
    >"$T/out/case1.out" 2>"$T/out/case1.err"
rc=$?
ok $rc "srun --mpi=pmix -n 4 slurm_rank check: exit 0 ($(($(date +%s) - t0))s)" \
    "$T/out/case1.out" "$T/out/case1.err" "$T/log/slurmd.log"
[ "$(lines '^check rank=[0-3] wrong=0$' "$T/out/case1.out")" = 4 ] &&
    grep -qx 'check: 4 ranks, 20 allreduces: correct on every rank' "$T/out/case1.out"
ok $? "20 allreduces of 65536 int32 correct on all 4 ranks" "$T/out/case1.out"
# case 4 (identity), from case 1: the ranks saw one job id, Slurm's, and epoch 0
J1=$(sed -n 's/^ident rank=0 nranks=4 job=\([0-9][0-9]*\) epoch=0 .*/\1/p' "$T/out/case1.out")
[ -n "$J1" ] &&
    [ "$(lines "^ident rank=[0-3] nranks=4 job=$J1 epoch=0 " "$T/out/case1.out")" = 4 ] &&
    [ "$(jobfield "$J1" JobName)" = shoal-case1 ]
ok $? "identity under srun: every rank's job is SLURM_JOB_ID (${J1:-none}, shoal-case1), epoch 0" \
    "$T/out/case1.out"

# ---- case 5: the stop signal reaches one rank only (a launcher that forwards it to some ranks,
# an agent that tells one): every rank still stops at the same step. Runs while case 2 waits.
VICTIM=$(($$ % 4))
sl timeout -k 5 120 srun --mpi=pmix -J shoal-onerank -n 4 $OC "$PROG" loop 90 "$T/ckpt5" \
    >"$T/out/case5.out" 2>"$T/out/case5.err" &
C5=$!
c5_ready() { [ "$(lines '^loop rank=[0-3] ready pid=' "$T/out/case5.out")" = 4 ]; }
wait_for 100 c5_ready
rc=$?
VPID=$(sed -n "s/^loop rank=$VICTIM ready pid=\([0-9]*\)$/\1/p" "$T/out/case5.out")
[ $rc -eq 0 ] && [ -n "$VPID" ] && kill -USR1 "$VPID"
ok $? "4 ranks in their loop under srun; SIGUSR1 to rank $VICTIM only (pid ${VPID:-none})" \
    "$T/out/case5.out" "$T/out/case5.err"
wait $C5
rc=$?
S5=$(same_step "$T/out/case5.out")
[ $rc -eq 0 ] && [ -n "$S5" ] &&
    [ "$(lines "^stop rank=$VICTIM step=$S5 signal=USR1$" "$T/out/case5.out")" = 1 ] &&
    [ "$(lines "^stop rank=[0-3] step=$S5 signal=none$" "$T/out/case5.out")" = 3 ]
ok $? "only rank $VICTIM got it, yet all 4 stopped at step ${S5:-?} and srun exits 0 (rc $rc)" \
    "$T/out/case5.out" "$T/out/case5.err"

# ---- case 1b: srun -m arbitrary, the ranks placed by a SLURM_HOSTFILE (shoal-place writes
# one; the default is this node for every rank) --------------------------------------------
if [ -n "${SLURMTEST_HOSTFILE_CMD:-}" ]; then
    $SLURMTEST_HOSTFILE_CMD "$CONF" 4 >"$T/hostfile" 2>"$T/out/place.err"
else
    for r in 0 1 2 3; do echo "$NODE"; done >"$T/hostfile"
fi
SLURM_HOSTFILE=$T/hostfile sl timeout -k 5 120 srun --mpi=pmix -J shoal-arbitrary -m arbitrary \
    -n 4 $OC "$PROG" check 3 1024 >"$T/out/case1b.out" 2>"$T/out/case1b.err"
rc=$?
placed=0
r=0
while read -r h; do
    [ $r -lt 4 ] && { grep -q "^ident rank=$r nranks=4 .* host=${h%%.*}$" "$T/out/case1b.out" ||
                      placed=1; }
    r=$((r + 1))
done <"$T/hostfile"
[ $rc -eq 0 ] && [ $r -ge 4 ] && [ $placed -eq 0 ] &&
    grep -qx 'check: 4 ranks, 3 allreduces: correct on every rank' "$T/out/case1b.out"
ok $? "srun -m arbitrary with SLURM_HOSTFILE: correct, every rank on its hostfile line's host" \
    "$T/hostfile" "$T/out/case1b.out" "$T/out/case1b.err" "$T/out/place.err"

# ---- case 6: a batch script that runs the program itself, without srun (SHOAL_ROOT and
# SHOAL_SECRET set, as for srun across hosts): an error naming srun at once; the process took
# itself for rank 0 of SLURM_NTASKS and waited SHOAL_TIMEOUT_MS for ranks nobody started ----
cat > "$T/case6.sh" <<EOF
#!/bin/sh
t0=\$(date +%s)
SHOAL_ROOT=127.0.0.1:$(free_port 3) SHOAL_SECRET=$(printf '5e%.0s' $(seq 32)) \\
    SHOAL_TIMEOUT_MS=60s "$PROG" check 3 1024
echo "exit \$? after \$((\$(date +%s) - t0))s"
EOF
J6=$(sl sbatch --parsable -p reserved -J shoal-nosrun -n 4 $OC -o "$T/out/case6.out" \
         "$T/case6.sh" 2>"$T/out/case6.err")
wait_for 120 job_finished "$J6"
grep -q "SLURM_NTASKS=4 but no SLURM_STEP_ID: this is Slurm's batch script, not a task of srun" \
    "$T/out/case6.out" && grep -Eq '^exit 1 after [0-9]s$' "$T/out/case6.out"
ok $? "sbatch -n 4 of a script that runs the program without srun: it fails at once, naming srun" \
    "$T/out/case6.out" "$T/out/case6.err"

# ---- case 7: srun --preserve-env -n 2 in an allocation of 4 tasks (also how Slurm's
# interactive step, LaunchParameters=use_interactive_step, starts the shell): the tasks keep
# the allocation's SLURM_NTASKS=4, the step has SLURM_STEP_NUM_TASKS=2. Through SHOAL_ROOT (no
# PMIx to cross-check the size) both ranks took the job for 4 ranks and waited for ranks 2 and
# 3 until SHOAL_TIMEOUT_MS ------------------------------------------------------------------
cat > "$T/case7.sh" <<EOF
#!/bin/sh
SHOAL_ROOT=127.0.0.1:$(free_port 4) SHOAL_SECRET=$(printf '7a%.0s' $(seq 32)) \\
    SHOAL_TIMEOUT_MS=30s srun --preserve-env --mpi=none -n 2 $OC sh -c \\
    'echo "env rank=\$SLURM_PROCID ntasks=\$SLURM_NTASKS step_tasks=\$SLURM_STEP_NUM_TASKS"
     exec "\$0" check 3 1024' "$PROG"
echo "srun exit \$?"
EOF
J7=$(sl sbatch --parsable -p reserved -J shoal-preserve -n 4 $OC -o "$T/out/case7.out" \
         "$T/case7.sh" 2>"$T/out/case7.err")
wait_for 120 job_finished "$J7"
[ "$(lines '^env rank=[01] ntasks=4 step_tasks=2$' "$T/out/case7.out")" = 2 ] &&
    [ "$(lines '^check rank=[01] wrong=0$' "$T/out/case7.out")" = 2 ] &&
    grep -qx 'srun exit 0' "$T/out/case7.out"
ok $? "srun --preserve-env -n 2 in an allocation of 4: 2 ranks (SLURM_STEP_NUM_TASKS), correct" \
    "$T/out/case7.out" "$T/out/case7.err"

# ---- case 8: the communicator's own timeout (shoal_config_t.timeout_ms = 3 s, SHOAL_TIMEOUT_MS
# 120 s) bounds the unique id's exchange through PMIx: rank 1 never calls, rank 0 gives up in
# the fence within a few seconds (it waited SHOAL_TIMEOUT_MS: cfg.timeout_ms was not passed)
sl timeout -k 5 120 env SHOAL_TIMEOUT_MS=120s SLURM_RANK_TIMEOUT_MS=3000 \
    srun --mpi=pmix -J shoal-cfgtimeout -n 2 $OC sh -c '
        [ "$SLURM_PROCID" = 1 ] && exec sleep 25
        t0=$(date +%s); "$0" check 3 1024; echo "rank0 exit $? after $(($(date +%s) - t0))s"' \
    "$PROG" >"$T/out/case8.out" 2>"$T/out/case8.err"
secs=$(sed -n 's/^rank0 exit 1 after \([0-9]*\)s$/\1/p' "$T/out/case8.out")
[ -n "$secs" ] && [ "$secs" -lt 15 ] && grep -q 'PMIx_Fence over namespace' "$T/out/case8.err"
ok $? "cfg.timeout_ms 3 s, SHOAL_TIMEOUT_MS 120 s, rank 1 absent: rank 0 fails in ${secs:-?}s" \
    "$T/out/case8.out" "$T/out/case8.err"

# ---- case 9: the same through SHOAL_ROOT: the root (rank 0's) waits as long as the
# communicator's timeout. cfg.timeout_ms 60 s, SHOAL_TIMEOUT_MS 3 s, rank 1 starts 8 s late:
# the job runs (the root gave up after SHOAL_TIMEOUT_MS without a join, failing both ranks)
sl timeout -k 5 120 env SHOAL_TIMEOUT_MS=3s SLURM_RANK_TIMEOUT_MS=60000 \
    SHOAL_ROOT=127.0.0.1:$(free_port 5) SHOAL_SECRET=$(printf '9c%.0s' $(seq 32)) \
    srun --mpi=none -J shoal-roottimeout -n 2 $OC sh -c \
        '[ "$SLURM_PROCID" = 1 ] && sleep 8; exec "$0" check 3 1024' "$PROG" \
    >"$T/out/case9.out" 2>"$T/out/case9.err"
rc=$?
[ $rc -eq 0 ] && [ "$(lines '^check rank=[01] wrong=0$' "$T/out/case9.out")" = 2 ]
ok $? "SHOAL_ROOT, cfg.timeout_ms 60 s, SHOAL_TIMEOUT_MS 3 s, rank 1 8 s late: runs (rc $rc)" \
    "$T/out/case9.out" "$T/out/case9.err"

# ---- case 2: its result ------------------------------------------------------------------
t0=$(date +%s)
job2_ok() { job_is "$J2" COMPLETED && [ "$(jobfield "$J2" ExitCode)" = 0:0 ]; }
wait_for 100 job_finished "$J2" && wait_for 5 job2_ok
rc=$?
d=$(($(date +%s) - t0))
ok $rc "the sbatch job completes: $(job_state "$J2") $(jobfield "$J2" ExitCode) (waited ${d}s)" \
    "$T/out/case2.out" "$T/log/slurmctld.log"
[ "$(jobfield "$J2" NodeList)" = "$NODE" ] && [ "$(jobfield "$J2" ReqNodeList)" = "$NODELIST" ] &&
    grep -qx "batch job=$J2 nodelist=$NODE" "$T/out/case2.out"
rc=$?
d="ReqNodeList=$(jobfield "$J2" ReqNodeList), NodeList=$(jobfield "$J2" NodeList)"
ok $rc "it ran where the node list said ($d)" \
    "$T/out/case2.out"
S2=$(same_step "$T/out/case2.out")
[ -n "$S2" ] && [ "$(lines '^stop rank=[0-3] step=[0-9]* signal=USR1$' "$T/out/case2.out")" = 4 ] &&
    grep -qx 'srun exit 0' "$T/out/case2.out"
ok $? "--signal=USR1: every rank got USR1, all 4 stopped at step ${S2:-?}, srun exit 0" \
    "$T/out/case2.out"
ck=0
for r in 0 1 2 3; do
    grep -qx "step=$S2 job=$J2 epoch=0" "$T/ckpt2/ckpt.$r" 2>/dev/null || ck=1
done
ok $ck "every rank's checkpoint holds step $S2, job $J2, epoch 0" "$T/ckpt2/ckpt.0"

# ---- case 3: a spot job preempted by a reserved job ---------------------------------------
# The spot job takes the whole node (--exclusive); its batch script, after the ranks stopped
# and checkpointed, requeues itself at once (Slurm would requeue it only at the end of
# GraceTime, and a job that just exits is COMPLETED, never requeued). On the restart
# (SLURM_RESTART_COUNT=1) it resumes from the checkpoint's step.
#
# slurm_rank stops through the library's coordinated stop (src/stop): its handler calls
# shoal_request_stop, its loop shoal_comm_should_stop, so this case (Slurm signals every
# rank) and case 5 (one rank only) check that every rank stops at the same step,
# checkpoints and exits 0 well within the grace time.
#
# Slurm sends the spot job SIGCONT with SIGTERM, and srun forwards it again. Under ASan, a
# SIGCONT that reaches a rank during LeakSanitizer's check at exit discards the SIGSTOP of the
# check's PTRACE_ATTACH, and the check then waits for it forever. The rank lives on until
# the grace time ends and srun kills it, and the job's script never prints "srun exit".
# That happened in 2 of 19 ASan runs of this test here. The ranks showed the tracer in
# SuspendThread's waitpid (gdb). A small ASan program that gets SIGCONTs while it exits hung
# in 17 of 100 runs, and in none with detect_leaks=0. So the preempted ranks run without the
# exit check, as case 2's do; cases 1, 1b and 5 keep it.
cat > "$T/case3.sh" <<EOF
#!/bin/sh
echo "batch job=\$SLURM_JOB_ID restart=\${SLURM_RESTART_COUNT:-0}"
if [ "\${SLURM_RESTART_COUNT:-0}" = 0 ]; then
    ASAN_OPTIONS="$NOLEAK_ASAN" srun --mpi=pmix -n 4 $OC "$PROG" loop 90 "$T/ckpt3"
    echo "srun exit \$? at \$(date +%s)"
    scontrol -o show job \$SLURM_JOB_ID | tr ' ' '\n' | grep '^PreemptTime='
    scontrol requeue \$SLURM_JOB_ID
    sleep 60 # until the requeue ends this run
else
    echo "resume from step \$(sed -n 's/^step=\([0-9]*\) .*/\1/p' "$T/ckpt3/ckpt.0")"
    srun --mpi=pmix -n 4 $OC "$PROG" check 3 1024
    echo "srun exit \$?"
fi
EOF
J3=$(sl sbatch --parsable -p spot -J shoal-spot --requeue --exclusive -n 4 $OC --time=5 \
         --open-mode=append -o "$T/out/case3.out" "$T/case3.sh" 2>"$T/out/case3.err")
spot_ready() { [ "$(lines '^loop rank=[0-3] ready pid=' "$T/out/case3.out")" = 4 ]; }
wait_for 60 spot_ready
ok $? "the spot job ${J3:-none} runs: 4 ranks in their loop" "$T/out/case3.out" "$T/out/case3.err"
cat > "$T/case3r.sh" <<EOF
#!/bin/sh
echo "reserved start \$(date +%s)"
srun --mpi=pmix -n 4 $OC "$PROG" check 5 4096
echo "srun exit \$?"
EOF
T3=$(date +%s)
J3R=$(sl sbatch --parsable -p reserved -J shoal-reserved -n 4 $OC --time=2 \
          -o "$T/out/case3r.out" "$T/case3r.sh" 2>>"$T/out/case3.err")
spot_stopped() { grep -q '^srun exit' "$T/out/case3.out"; }
wait_for 30 spot_stopped || rank_stacks "$T/out/case3.stacks"
S3=$(same_step "$T/out/case3.out")
[ -n "$S3" ] && [ "$(lines '^stop rank=[0-3] step=[0-9]* signal=TERM$' "$T/out/case3.out")" = 4 ]
rc=$?
d="$(($(date +%s) - T3))s after the reserved job's submission, grace $GRACE s"
ok $rc "preempted: every spot rank got SIGTERM, all 4 stopped at step ${S3:-?} ($d)" \
    "$T/out/case3.out" "$T/log/slurmctld.log" "$T/out/case3.stacks"
ck=0
for r in 0 1 2 3; do
    grep -qx "step=$S3 job=$J3 epoch=0" "$T/ckpt3/ckpt.$r" 2>/dev/null || ck=1
done
ok $ck "every spot rank's checkpoint holds step $S3, job $J3, epoch 0" "$T/ckpt3/ckpt.0"
wait_for 60 job_finished "$J3R" && wait_for 5 job_is "$J3R" COMPLETED &&
    grep -qx 'srun exit 0' "$T/out/case3r.out" &&
    grep -qx 'check: 4 ranks, 5 allreduces: correct on every rank' "$T/out/case3r.out"
ok $? "the reserved job ${J3R:-none} ran and completed with correct results" \
    "$T/out/case3r.out" "$T/log/slurmctld.log"
stop_at=$(sed -n 's/^srun exit [0-9]* at //p' "$T/out/case3.out" | head -1)
res_at=$(sed -n 's/^reserved start //p' "$T/out/case3r.out")
ptime=$(sed -n 's/^PreemptTime=//p' "$T/out/case3.out" | head -1)
[ -n "$stop_at" ] && [ -n "$res_at" ] && [ "$res_at" -ge "$stop_at" ] &&
    [ -n "$ptime" ] && [ "$ptime" != None ]
rc=$?
d="PreemptTime=${ptime:-none}; it started at $res_at, the ranks stopped at $stop_at"
ok $rc "slurmctld preempted the spot job for the reserved one ($d)" \
    "$T/out/case3.out" "$T/log/slurmctld.log" "$T/out/case3.stacks"
# A requeued job waits (BeginTime) about two minutes before it may start again; the test
# lets it start at once.
requeued() { [ "$(jobfield "$J3" Restarts)" = 1 ] && job_is "$J3" PENDING; }
wait_for 30 requeued
rq=$?
sl scontrol update JobId="$J3" StartTime=now >/dev/null 2>&1
ok $rq "the spot job is requeued: PENDING, Restarts=1" "$T/log/slurmctld.log"
spot_done() { [ "$(jobfield "$J3" Restarts)" = 1 ] && job_finished "$J3"; }
wait_for 60 spot_done && wait_for 5 job_is "$J3" COMPLETED &&
    grep -qx "resume from step $S3" "$T/out/case3.out" &&
    [ "$(lines '^check rank=[0-3] wrong=0$' "$T/out/case3.out")" = 4 ] &&
    [ "$(lines '^srun exit 0$' "$T/out/case3.out")" = 1 ]
ok $? "the spot job comes back (restart 1), resumes from step $S3 and completes" \
    "$T/out/case3.out" "$T/log/slurmctld.log"
# case 4: the epoch follows SLURM_RESTART_COUNT
[ "$(lines "^ident rank=[0-3] nranks=4 job=$J3 epoch=0 " "$T/out/case3.out")" = 4 ] &&
    [ "$(lines "^ident rank=[0-3] nranks=4 job=$J3 epoch=1 " "$T/out/case3.out")" = 4 ]
ok $? "identity across the requeue: job $J3 on every rank, epoch 0 then 1 (SLURM_RESTART_COUNT)" \
    "$T/out/case3.out"

# ---- shutdown ------------------------------------------------------------------------------
stop_all
left=$(ours | tr '\n' ' ')
[ -z "$left" ]
ok $? "every daemon stopped, no process of this Slurm left${left:+ (left: $left)}"
echo "1..$n"
[ $fails -eq 0 ]
