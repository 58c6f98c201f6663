#!/bin/sh
# Metering exactness (src/meter): jobs with a known traffic pattern under shoalrun, each rank
# checking shoal_comm_stats against the bytes the forced algorithms move (meter_rank.c), over
# shm, tcp and ucx, 2 to 8 ranks, on one host and on virtual hosts (hostid_wrap.sh: shm inside
# a host, tcp across, split same-host / other-host). A test acceptor (meter_acceptor.c, a
# fixture standing in for the node agent) receives every page through SCM_RIGHTS; when each
# communicator ends, the counters it reads from the shared page must equal the ranks' last
# shoal_comm_stats, the page must be CLOSED and carry the identity. Then the agent protocol:
# re-registration after the agent drops the connection, a refusing agent (a warning, or an
# init failure with SHOAL_AGENT_REQUIRED=1), no agent, a silent agent, SHOAL_METER=0, a
# stranger's listener at SHOAL_AGENT (never sent the credential), SHOAL_AGENT_UID.
#
# Environment: top_builddir, top_srcdir (make check), METER_TIMEOUT (seconds per job, 120),
# METER_QUICK=1 for fewer rank counts.
. "$(dirname "$0")/../tap.sh"

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
shoalrun=$builddir/shoalrun
rank=$builddir/tests/meter/meter_rank
acceptor=$builddir/tests/meter/meter_acceptor
wrap=$srcdir/tests/mp/hostid_wrap.sh
timeout=${METER_TIMEOUT:-120}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_meter.XXXXXX") || exit 99
acc_pid=
cleanup() {
    [ -n "$acc_pid" ] && kill "$acc_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$rank" ] || [ ! -x "$acceptor" ]; then
    echo "1..0 # SKIP shoalrun, meter_rank or meter_acceptor not built"
    exit 0
fi
# shellcheck source=tests/mp/run_lib.sh
. "$srcdir/tests/mp/run_lib.sh"

sock=$tmp/agent.sock
# meter_rank configures tenant acme, job meter-test: shoalrun makes the job's unique id for
# them (the tenant-bound join refuses a rank whose tenant differs from the id's)
SHOAL_TENANT=acme
SHOAL_JOB=meter-test
export SHOAL_TENANT SHOAL_JOB

acc_start() { # acc_start [options]: a fresh acceptor on $sock writing $tmp/acc
    rm -f "$tmp/acc" "$tmp/stats"
    "$acceptor" "$sock" "$tmp/acc" --timeout $((timeout + 60)) "$@" 2>"$tmp/acc.err" &
    acc_pid=$!
    for _ in $(seq 50); do
        [ -S "$sock" ] && return 0
        sleep 0.1
    done
    echo "# acceptor did not start"
    return 1
}

acc_stop() {
    sleep 0.5 # the last closes reach its poll loop
    kill "$acc_pid" 2>/dev/null
    wait "$acc_pid" 2>/dev/null
    acc_pid=
}

# acc_compare LABEL NPAGES: the acceptor's page lines == the ranks' final stats lines, and
# every page CLOSED, even seq, with the job's identity.
acc_compare() {
    grep '^pid=' "$tmp/acc" | sort >"$tmp/a.sorted"
    sort "$tmp/stats" >"$tmp/s.sorted" 2>/dev/null
    if [ -s "$tmp/s.sorted" ] && cmp -s "$tmp/a.sorted" "$tmp/s.sorted" &&
        [ "$(wc -l <"$tmp/s.sorted")" -eq "$2" ]; then
        tap OK "$1: the $2 pages the acceptor mapped hold the ranks' final counters"
    else
        tap FAIL "$1: acceptor pages differ from shoal_comm_stats"
        diff "$tmp/a.sorted" "$tmp/s.sorted" | head -n 20 | sed 's/^/# /'
        sed 's/^/# acceptor: /' "$tmp/acc.err" | head -n 10
    fi
    bad=$(grep '^ident' "$tmp/acc" | grep -v 'state=2 seq_even=1 tenant=acme job=meter-test' |
        grep -c . )
    gpus=$(grep '^ident' "$tmp/acc" | grep -c 'ngpus=2 gpus=0,2 pid_ok=1')
    if [ "$bad" -eq 0 ] && [ "$gpus" -eq "$2" ]; then
        tap OK "$1: every page CLOSED at destroy, identity tenant/job/GPUs/pid as registered"
    else
        tap FAIL "$1: page state or identity"
        grep '^ident' "$tmp/acc" | head -n 8 | sed 's/^/# /'
    fi
}

# meter_job LABEL N "VARS" [wrap] CASES...: one exactness job with an acceptor.
meter_job() {
    _label=$1
    _n=$2
    _vars=$3
    shift 3
    acc_start || return
    mp_job "$_label" "$_n" "SHOAL_AGENT=$sock METER_STATS_FILE=$tmp/stats SHOAL_METER_GPUS=0,2 \
SHOAL_RING_ORDER=rank $_vars" "$@"
    acc_stop
    _pages=$_n
    case " $* " in *" split_abort "*) _pages=$((2 * _n)) ;; esac
    acc_compare "$_label" "$_pages"
}

all="allreduce allgather reduce_scatter p2p p2p_group bcast reduce alltoall barrier errors split_abort"
if [ "${METER_QUICK:-0}" = 1 ]; then counts="2 3"; else counts="2 3 4 8"; fi
for n in $counts; do
    meter_job "shm n=$n ring" "$n" "SHOAL_ALGO=ring SHOAL_TRANSPORT=shm" "$rank" $all
done
# SHOAL_CHECK_ARGS=1: the comparison before each collective is the library's own exchange,
# not the tenant's payload; it was counted (80 bytes per step each way, billed).
meter_job "shm n=3 ring, SHOAL_CHECK_ARGS=1" 3 "SHOAL_ALGO=ring SHOAL_TRANSPORT=shm \
SHOAL_CHECK_ARGS=1" "$rank" allreduce allgather reduce_scatter p2p bcast reduce alltoall barrier
for n in 3 5; do
    meter_job "tcp n=$n ring" "$n" "SHOAL_ALGO=ring SHOAL_TRANSPORT=tcp" "$rank" $all
done
if "$builddir/shoal_info" -b 2>/dev/null | grep -q 'ucx *usable: yes'; then
    meter_job "ucx n=3 ring" 3 "SHOAL_ALGO=ring SHOAL_TRANSPORT=ucx" "$rank" $all
else
    n_tap=$((n_tap + 1))
    echo "ok $n_tap - ucx # SKIP this build has no UCX"
fi
for n in 2 4; do
    meter_job "shm n=$n direct path" "$n" \
        "SHOAL_ALGO=shm SHOAL_SHM_LL_MAX=1024 SHOAL_SHM_ONESHOT_MAX=16k" "$rank" shmd barrier
done
# Each rank forks a child that holds copies of its descriptors: the acceptor still sees the
# communicator end at its destroy (the rank checks, with the child alive).
meter_job "forked child" 2 "METER_ACC_FILE=$tmp/acc" "$rank" fork_child barrier
# Nonblocking calls in flight together: the seqlock covers all of them.
meter_job "overlapping calls" 2 "SHOAL_ALGO=ring" "$rank" overlap
# Virtual hosts: tcp across, shm within; the ring's neighbours decide the locality.
ring="allreduce allgather reduce_scatter p2p p2p_group bcast reduce alltoall"
meter_job "hosts 2+2 ring" 4 "SHOAL_ALGO=ring MP_PPN=2" "$wrap" "$rank" $ring
meter_job "hosts 1+2+3 ring" 6 "SHOAL_ALGO=ring MP_HOSTMAP=0,1,1,2,2,2" "$wrap" "$rank" $ring
meter_job "hosts 1,0,1,0,0 interleaved" 5 "SHOAL_ALGO=ring MP_HOSTMAP=1,0,1,0,0" "$wrap" \
    "$rank" $ring

# The agent drops every first connection (a restart): each page is registered again, the
# same memfd, and the counters still agree at the end.
acc_start --drop-first
mp_job "agent restart" 3 "SHOAL_AGENT=$sock METER_STATS_FILE=$tmp/stats SHOAL_METER_GPUS=0,2" \
    "$rank" hold=2.5
acc_stop
drops=$(grep -c '^dropped' "$tmp/acc")
regs2=$(grep '^ident' "$tmp/acc" | grep -c 'regs=2')
if [ "$drops" -eq 3 ] && [ "$regs2" -eq 3 ]; then
    tap OK "agent restart: 3 connections dropped, 3 pages registered again (same memfd)"
else
    tap FAIL "agent restart: $drops dropped, $regs2 registered twice"
    sed 's/^/# /' "$tmp/acc" | head
fi
acc_compare "agent restart" 3

# The process's circuit-breaker counters reach the page (auth_failed, auth_refused,
# breaker_opened) at the library's once-a-second check, with or without an agent.
mp_job "breaker signals" 2 "SHOAL_AGENT=none SHOAL_TENANT_BREAKER_FAILS=3" "$rank" breaker=3

# neg_job LABEL N "VARS" EXPECTED-STATUS-OR-ok: init outcome with a refusing/absent agent.
neg_job() {
    # shellcheck disable=SC2086
    env -u SHOAL_TRANSPORT -u SHOAL_ALGO "$shoalrun" --no-prefix --timeout 60 -n "$2" \
        $(for v in $3; do printf -- '-x %s ' "$v"; done) "$rank" "$4" >"$tmp/out" 2>"$tmp/err"
}

acc_start --refuse
neg_job refuse 2 "SHOAL_AGENT=$sock" barrier
rc=$?
warns=$(grep -c "WARN \[METER\] the node agent .* refused communicator .* of tenant 'acme'" \
    "$tmp/err")
if [ "$rc" -eq 0 ] && [ "$warns" -eq 2 ]; then
    tap OK "refusing agent: the job runs, one warning per rank with the reason"
else
    tap FAIL "refusing agent: rc $rc, $warns warnings"
    sed 's/^/# /' "$tmp/err" | head
fi
grep -q 'tenant acme is not allowed on this node' "$tmp/err" &&
    tap OK "refusing agent: the warning carries the agent's reason" ||
    tap FAIL "refusing agent: reason missing from the warning"
neg_job refuse-required 2 "SHOAL_AGENT=$sock SHOAL_AGENT_REQUIRED=1" expect_init=SHOAL_ERR_PERMISSION
rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c 'init: SHOAL_ERR_PERMISSION' "$tmp/out")" -eq 2 ]; then
    tap OK "refusing agent, SHOAL_AGENT_REQUIRED=1: init fails with SHOAL_ERR_PERMISSION"
else
    tap FAIL "refusing agent, SHOAL_AGENT_REQUIRED=1: rc $rc"
    sed 's/^/# /' "$tmp/out" "$tmp/err" | head
fi
acc_stop

neg_job none 2 "SHOAL_AGENT=$tmp/no-agent.sock" barrier
rc=$?
[ "$rc" -eq 0 ] && tap OK "no agent: the job runs and shoal_comm_stats answers" ||
    { tap FAIL "no agent: rc $rc"; sed 's/^/# /' "$tmp/out" "$tmp/err" | head; }
neg_job none-required 2 "SHOAL_AGENT=$tmp/no-agent.sock SHOAL_AGENT_REQUIRED=1" \
    expect_init=SHOAL_ERR_SYSTEM
rc=$?
[ "$rc" -eq 0 ] && tap OK "no agent, SHOAL_AGENT_REQUIRED=1: init fails (SHOAL_ERR_SYSTEM)" ||
    { tap FAIL "no agent, required: rc $rc"; sed 's/^/# /' "$tmp/out" "$tmp/err" | head; }
neg_job agent-none 2 "SHOAL_AGENT=none" barrier
rc=$?
[ "$rc" -eq 0 ] && tap OK "SHOAL_AGENT=none: the job runs" || tap FAIL "SHOAL_AGENT=none: rc $rc"
# A job credential and no agent to give it to (SHOAL_AGENT=none), or one that refused: the
# library keeps no copy of the credential text (a secret) for the communicator's life.
if "$builddir/shoal-cred" keygen -o "$tmp/master.key" >/dev/null 2>&1 &&
    "$builddir/shoal-cred" issue -k "$tmp/master.key" --tenant acme --job meter-test \
        >"$tmp/cred" 2>/dev/null && chmod 600 "$tmp/cred"; then
    SHOAL_CREDENTIAL_FILE=$tmp/cred
    export SHOAL_CREDENTIAL_FILE
    neg_job cred-none 2 "SHOAL_AGENT=none" cred_wiped
    rc=$?
    [ "$rc" -eq 0 ] && tap OK "credential, SHOAL_AGENT=none: no copy of its text kept" ||
        { tap FAIL "credential, SHOAL_AGENT=none: rc $rc"; sed 's/^/# /' "$tmp/out" | head; }
    acc_start --refuse
    neg_job cred-refused 2 "SHOAL_AGENT=$sock" cred_wiped
    rc=$?
    acc_stop
    [ "$rc" -eq 0 ] && tap OK "credential, refusing agent: no copy of its text kept" ||
        { tap FAIL "credential, refusing agent: rc $rc"; sed 's/^/# /' "$tmp/out" | head; }
    # An agent that took the page: the text stays (for a re-registration), out of core dumps.
    acc_start
    neg_job cred-kept 2 "SHOAL_AGENT=$sock" cred_nodump
    rc=$?
    acc_stop
    [ "$rc" -eq 0 ] && tap OK "credential, accepting agent: its text is left out of core dumps" ||
        { tap FAIL "credential, accepting agent: rc $rc"; sed 's/^/# /' "$tmp/out" | head; }
    unset SHOAL_CREDENTIAL_FILE
else
    tap FAIL "shoal-cred could not issue a credential"
fi
# A stranger listening at SHOAL_AGENT (a uid neither root, the job's, SHOAL_AGENT_UID nor the
# owner of a directory only root can make: here nobody, in a world-writable directory) gets
# no registration, so never the job credential: the job runs without it (a warning per rank)
# or, with SHOAL_AGENT_REQUIRED=1, init fails. SHOAL_AGENT_UID, or a directory of its own
# that only root could make, is trusted. Root only: the stranger runs as nobody.
nob_start() { # nob_start DIR: the acceptor as nobody on DIR/agent.sock, its lines in DIR/acc
    setpriv --reuid=65534 --regid=65534 --clear-groups "$acceptor" "$1/agent.sock" "$1/acc" \
        --timeout $((timeout + 60)) 2>"$tmp/acc.err" &
    acc_pid=$!
    for _ in $(seq 50); do
        [ -S "$1/agent.sock" ] && return 0
        sleep 0.1
    done
    echo "# the acceptor did not start as nobody"
    return 1
}
nob_regs() { sleep 0.5; kill "$acc_pid" 2>/dev/null; wait "$acc_pid" 2>/dev/null; acc_pid=
    grep -c '^ident.* cred=yes' "$1/acc"; }
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1 && [ -s "$tmp/cred" ]; then
    chmod 755 "$tmp" && mkdir -m 1777 "$tmp/ww" && mkdir -m 755 "$tmp/run" &&
        mkdir -m 755 "$tmp/run/own" "$tmp/run/own/sub" "$tmp/ww/evil" "$tmp/ww/evil/run" &&
        chown 65534 "$tmp/run/own" "$tmp/run/own/sub" "$tmp/ww/evil" "$tmp/ww/evil/run"
    SHOAL_CREDENTIAL_FILE=$tmp/cred # shoalrun's root and the ranks: the same job secret
    export SHOAL_CREDENTIAL_FILE
    nob_start "$tmp/ww"
    neg_job stranger 2 "SHOAL_AGENT=$tmp/ww/agent.sock" barrier
    rc=$?
    warns=$(grep -c "WARN \[METER\] the listener at SHOAL_AGENT=.* runs as uid 65534: .* not sent" \
        "$tmp/err")
    regs=$(nob_regs "$tmp/ww")
    if [ "$rc" -eq 0 ] && [ "$warns" -eq 2 ] && [ "$regs" -eq 0 ]; then
        tap OK "a stranger's listener at SHOAL_AGENT: no credential sent, the job runs, a warning per rank"
    else
        tap FAIL "a stranger's listener: rc $rc, $warns warnings, $regs credentials received"
        sed 's/^/# /' "$tmp/err" | head
    fi
    nob_start "$tmp/ww"
    neg_job stranger-required 2 "SHOAL_AGENT=$tmp/ww/agent.sock SHOAL_AGENT_REQUIRED=1" expect_init=SHOAL_ERR_PERMISSION
    rc=$?
    regs=$(nob_regs "$tmp/ww")
    if [ "$rc" -eq 0 ] && [ "$(grep -c 'init: SHOAL_ERR_PERMISSION' "$tmp/out")" -eq 2 ] &&
        [ "$regs" -eq 0 ]; then
        tap OK "a stranger's listener, SHOAL_AGENT_REQUIRED=1: init fails with SHOAL_ERR_PERMISSION"
    else
        tap FAIL "a stranger's listener, required: rc $rc, $regs credentials received"
        sed 's/^/# /' "$tmp/out" "$tmp/err" | head
    fi
    nob_start "$tmp/ww"
    neg_job agent-uid 2 "SHOAL_AGENT=$tmp/ww/agent.sock SHOAL_AGENT_UID=65534" barrier
    rc=$?
    regs=$(nob_regs "$tmp/ww")
    [ "$rc" -eq 0 ] && [ "$regs" -eq 2 ] &&
        tap OK "SHOAL_AGENT_UID names the agent's uid: both ranks register" ||
        { tap FAIL "SHOAL_AGENT_UID: rc $rc, $regs registrations"; sed 's/^/# /' "$tmp/err" | head; }
    nob_start "$tmp/run/own/sub"
    neg_job agent-dir 2 "SHOAL_AGENT=$tmp/run/own/sub/agent.sock" barrier
    rc=$?
    regs=$(nob_regs "$tmp/run/own/sub")
    [ "$rc" -eq 0 ] && [ "$regs" -eq 2 ] &&
        tap OK "an agent owning its directories under one of root's (like /run/shoal): both ranks register" ||
        { tap FAIL "agent's own directories: rc $rc, $regs registrations"; sed 's/^/# /' "$tmp/err" | head; }
    nob_start "$tmp/ww/evil/run"
    neg_job stranger-dirs 2 "SHOAL_AGENT=$tmp/ww/evil/run/agent.sock" barrier
    rc=$?
    regs=$(nob_regs "$tmp/ww/evil/run")
    [ "$rc" -eq 0 ] && [ "$regs" -eq 0 ] &&
        tap OK "a stranger owning its directories under a world-writable one: no credential sent" ||
        { tap FAIL "stranger's own directories: rc $rc, $regs credentials received"; sed 's/^/# /' "$tmp/err" | head; }
    unset SHOAL_CREDENTIAL_FILE
else
    for c in stranger stranger-required agent-uid agent-dir stranger-dirs; do
        n_tap=$((n_tap + 1))
        echo "ok $n_tap - $c # SKIP needs root and setpriv (a listener of another uid)"
    done
fi
neg_job disabled 2 "SHOAL_METER=0 SHOAL_AGENT=$tmp/no-agent.sock" disabled
rc=$?
[ "$rc" -eq 0 ] && [ "$(grep -c 'disabled: ok' "$tmp/out")" -eq 2 ] &&
    tap OK "SHOAL_METER=0: calls work, shoal_comm_stats is SHOAL_ERR_UNSUPPORTED" ||
    { tap FAIL "SHOAL_METER=0: rc $rc"; sed 's/^/# /' "$tmp/out" "$tmp/err" | head; }

# An agent that accepts but never answers: init gives up after its 200 ms deadline.
acc_start --silent
t0=$(date +%s%N)
neg_job silent 2 "SHOAL_AGENT=$sock" barrier
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
acc_stop
if [ "$rc" -eq 0 ] && [ "$ms" -lt 10000 ]; then
    tap OK "silent agent: init gives up after 200 ms, the job runs ($ms ms for the whole job)"
else
    tap FAIL "silent agent: rc $rc after $ms ms"
    sed 's/^/# /' "$tmp/err" | head
fi

# The silent agent again, with calls for 4.5 s: each try costs a call 200 ms, so after one
# that got no answer the library waits 2, 4, ... s before the next (once a second, that was
# 20% of the job's time, more where ranks wait for each other's stalls): per rank the init's
# try and one at about 2 s, not one a second.
acc_start --silent
neg_job silent-hold 2 "SHOAL_AGENT=$sock" hold=4.5
rc=$?
acc_stop
tries=$(grep -c '^ident' "$tmp/acc")
if [ "$rc" -eq 0 ] && [ "$tries" -ge 2 ] && [ "$tries" -le 6 ]; then
    tap OK "silent agent, calls for 4.5 s: $tries registration tries in all (2 ranks), backing off"
else
    tap FAIL "silent agent, calls for 4.5 s: rc $rc, $tries registration tries (want 2 to 6)"
    sed 's/^/# /' "$tmp/out" "$tmp/err" | head
fi

# The in-process comparisons of perf/meter_overhead.sh and perf/qos_bench.sh (meter_bench
# -T): one communicator whose meter (-d qos: pacer) is detached for every other batch. The
# tool itself checks that the page counted the metered batches and that a detached batch
# changed none of its counters (with -d qos: that the paced batches used the pacer and a
# detached one did not), and exits 1 otherwise.
bench=$builddir/meter_bench
for spec in "meter shm" "meter tcp" "qos shm" "qos tcp"; do
    # shellcheck disable=SC2086 # two words
    set -- $spec
    if [ ! -x "$bench" ]; then
        tap OK "meter_bench -T -d $1 over $2 # SKIP $bench not built"
        continue
    fi
    tlenv=""
    [ "$2" = tcp ] && tlenv="-x SHOAL_TRANSPORT=tcp"
    # shellcheck disable=SC2086 # tlenv is empty or one option and its value
    "$shoalrun" --no-prefix --timeout "$timeout" -n 2 -x SHOAL_AGENT=none $tlenv "$bench" -T \
        -d "$1" -n 200 -k 3 -w 20 >"$tmp/out" 2>"$tmp/err"
    rc=$?
    what="the page counts the metered batches only"
    [ "$1" = qos ] && what="the paced batches use the pacer, the detached ones do not"
    if [ "$rc" -eq 0 ] && grep -Eq '^(metered|paced)_calls 620$' "$tmp/out"; then
        tap OK "meter_bench -T -d $1 over $2: $what"
    else
        tap FAIL "meter_bench -T -d $1 over $2: rc $rc"
        sed 's/^/# /' "$tmp/out" "$tmp/err" | head
    fi
done

tap_plan
