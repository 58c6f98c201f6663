#!/bin/sh
# Fault tests under shoalrun, TAP on stdout (tests/fault/kill.c does the work):
#  - kill: N ranks loop over 8 MiB AllReduces, the last one SIGKILLs itself inside one; every
#    survivor must fail with SHOAL_ERR_PEER_FAILED naming the victim, within
#    SHOAL_TIMEOUT_MS + slack, and shoalrun must report the victim's SIGKILL (exit 137); also
#    over tcp (and ucx where usable) with SHOAL_CONNECT=lazy on 8 ranks, where most survivors
#    have no channel to it; and over ucx with every rank on a virtual host of its own
#    (tests/mp/hostid_wrap.sh), where UCX still uses its shared memory.
#  - abort: rank 0 blocks in an AllReduce the others never join; shoal_comm_abort from a
#    second thread must make it return SHOAL_ERR_ABORTED within 1 s; the late ranks get an
#    error too; over ucx (2 ranks), the late rank's error must be SHOAL_ERR_PEER_FAILED, told
#    that rank 0 failed.
#  - idle: shoal_comm_get_async_error's answers (healthy, NULL arguments, aborted), then the
#    last rank dies while every rank is idle: the survivors, calling no collective, must see
#    SHOAL_ERR_PEER_FAILED naming it from shoal_comm_get_async_error within 2 s.
#  - leader: the last rank's main thread calls pthread_exit and a worker goes on; the others,
#    idle, must not take it for dead (its main thread is a zombie), and an AllReduce with the
#    worker must then succeed (shm, tcp).
#    Again with rank 0 in a pid namespace of its own (root only): ranks of one host in
#    different pid namespaces must not take each other for dead by their pids.
#  - idle abort: rank 0 aborts between calls (nothing in flight) and lives on; the others' next
#    call must fail within 1 s, told by rank 0's failure notice (shm, tcp, ucx where usable).
# Environment: top_builddir (set by make check), KILL_TIMEOUT_MS (the jobs' SHOAL_TIMEOUT_MS,
# default 5000; tests/vm's sanitized run gives its slow 4-rank start more), KILL_REPEAT (runs
# per kill case, default 1),
# KILL_TRANSPORTS (default "shm tcp", plus "ucx" where shoal_info -b says it is usable),
# KILL_WRAP (a command every rank runs through, see MP_WRAP in tests/mp/run_lib.sh),
# KILL_ABORT=0 to skip the abort cases. KILL_LAZY_N (default 8): ranks of the lazy cases (over
# ib too, when set and KILL_TRANSPORTS names ib); KILL_ONLY_LAZY=1: only the lazy cases of
# KILL_TRANSPORTS (tests/vm's lazy section).
. "$(dirname "$0")/../tap.sh"

builddir=${top_builddir:-.}
shoalrun=$builddir/shoalrun
prog=$builddir/tests/fault/kill
timeout_ms=${KILL_TIMEOUT_MS:-5000}
slack_ms=3000
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_kill.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$prog" ]; then
    echo "1..0 # SKIP $shoalrun or $prog not built"
    exit 0
fi

# launch LABEL NRANKS TRANSPORT ARGS...: runs the job, output in $tmp/out and $tmp/err.
launch() {
    label=$1
    n=$2
    tl=$3
    shift 3
    env -u SHOAL_TRANSPORT "$shoalrun" --no-prefix --grace 30 --timeout 90 -n "$n" \
        -x SHOAL_TIMEOUT_MS=$timeout_ms ${tl:+-x SHOAL_TRANSPORT=$tl} \
        ${connect:+-x SHOAL_CONNECT=$connect} ${KILL_WRAP:-} "$prog" "$@" \
        >"$tmp/out" 2>"$tmp/err"
    rc=$?
    sed -e 's/^/# /' "$tmp/out"
}

dump_err() {
    sed -e 's/^/# stderr: /' "$tmp/err" | head -n 40
}

# check_survivor LABEL RANK VICTIM
check_survivor() {
    line=$(grep "^survivor $2: " "$tmp/out" | head -n 1)
    if [ -z "$line" ]; then
        tap FAIL "$1: survivor $2 printed no verdict (hung and killed, or crashed)"
        return
    fi
    st=$(echo "$line" | sed -n 's/^survivor [0-9]*: status \([A-Z_]*\) after .*/\1/p')
    ms=$(echo "$line" | sed -n 's/^survivor [0-9]*: status [A-Z_]* after \([0-9]*\) ms: .*/\1/p')
    why=${line#*ms: }
    if [ "$st" != SHOAL_ERR_PEER_FAILED ]; then
        tap FAIL "$1: survivor $2 got $st, expected SHOAL_ERR_PEER_FAILED"
    elif ! echo "$why" | grep -Eq "(peer|rank) $3([^0-9]|\$)"; then
        tap FAIL "$1: survivor $2: the error does not name rank $3: $why"
    elif [ "${ms:-999999}" -gt $((timeout_ms + slack_ms)) ]; then
        tap FAIL "$1: survivor $2 took $ms ms (limit $((timeout_ms + slack_ms)))"
    else
        tap OK "$1: survivor $2: SHOAL_ERR_PEER_FAILED after $ms ms naming rank $3"
    fi
}

kill_case() { # kill_case TRANSPORT NRANKS [CONNECT]
    connect=${3:-}
    label="kill ${1:-shm} n=$2${connect:+ $connect}${kill_label:-}"
    victim=$(($2 - 1))
    launch "$label" "$2" "$1" kill 8
    if [ "$rc" -eq 137 ]; then
        tap OK "$label: the victim died of SIGKILL (shoalrun exit 137)"
    else
        tap FAIL "$label: shoalrun exited $rc, expected 137 (victim SIGKILLed)"
        dump_err
    fi
    r=0
    while [ $r -lt "$victim" ]; do
        check_survivor "$label" $r $victim
        r=$((r + 1))
    done
}

abort_case() { # abort_case TRANSPORT NRANKS MIB [strict]
    label="abort ${1:-shm} n=$2 ${3}MiB"
    launch "$label" "$2" "$1" abort "$3"
    line=$(grep '^aborted 0: ' "$tmp/out")
    st=$(echo "$line" | sed -n 's/^aborted 0: status \([A-Z_]*\) after .*/\1/p')
    ms=$(echo "$line" | sed -n 's/^aborted 0: status [A-Z_]* after \([0-9]*\) ms .*/\1/p')
    if [ "$st" = SHOAL_ERR_ABORTED ] && [ "${ms:-999999}" -lt 1000 ]; then
        tap OK "$label: blocked AllReduce returned SHOAL_ERR_ABORTED $ms ms after the abort"
    else
        tap FAIL "$label: blocked AllReduce: ${line:-no verdict from rank 0}"
    fi
    if grep -q '^after abort 0: barrier status SHOAL_ERR_ABORTED' "$tmp/out"; then
        tap OK "$label: later calls on the aborted communicator fail at once"
    else
        tap FAIL "$label: later calls: $(grep '^after abort 0' "$tmp/out")"
    fi
    r=1
    while [ $r -lt "$2" ]; do
        line=$(grep "^late $r: " "$tmp/out")
        case $line in
        "late $r: status SHOAL_OK"*|"") tap FAIL "$label: rank $r: ${line:-no verdict}" ;;
        *)
            if [ "${4:-}" = strict ] && ! echo "$line" | grep -Eq \
                "status SHOAL_ERR_PEER_FAILED .*because of rank 0([^0-9]|\$)"; then
                tap FAIL "$label: late rank $r was not told that rank 0 failed: $line"
            else
                tap OK "$label: late rank $r got an error: ${line#late $r: status }"
            fi
            ;;
        esac
        r=$((r + 1))
    done
    if [ "$rc" -eq 0 ]; then
        tap OK "$label: shoalrun exited 0"
    else
        tap FAIL "$label: shoalrun exited $rc"
        dump_err
    fi
}

# idle_case TRANSPORT NRANKS: the survivors of an idle communicator learn of the victim's death
# from shoal_comm_get_async_error alone, within idle_limit_ms of its death (300 ms after the
# last call), and its answers to healthy, aborted and NULL arguments are right (a split of the
# aborted one fails and sets its result to NULL).
idle_limit_ms=2000
idle_case() {
    label="idle ${1:-shm} n=$2"
    victim=$(($2 - 1))
    launch "$label" "$2" "$1" idle 1
    for what in healthy "null comm" "null out" "aborted split"; do
        want="SHOAL_OK SHOAL_OK"
        case $what in
        null*) want=SHOAL_ERR_INVALID_ARG ;;
        aborted*) want="SHOAL_OK SHOAL_ERR_ABORTED, its split SHOAL_ERR_ABORTED" ;;
        esac
        bad=$(grep "^$what [0-9]*: " "$tmp/out" | grep -v ": $want\$")
        n=$(grep -c "^$what [0-9]*: " "$tmp/out")
        if [ -z "$bad" ] && [ "$n" -eq "$2" ]; then
            tap OK "$label: get_async_error, $what: $want on every rank"
        else
            tap FAIL "$label: get_async_error, $what: expected $want on $2 ranks: ${bad:-$n lines}"
        fi
    done
    r=0
    while [ $r -lt "$victim" ]; do
        line=$(grep "^idle $r: " "$tmp/out" | head -n 1)
        st=$(echo "$line" | sed -n 's/^idle [0-9]*: status \([A-Z_]*\) after .*/\1/p')
        ms=$(echo "$line" | sed -n 's/^idle [0-9]*: status [A-Z_]* after \([0-9]*\) ms .*/\1/p')
        if [ "$st" != SHOAL_ERR_PEER_FAILED ]; then
            tap FAIL "$label: survivor $r: ${line:-no verdict}"
        elif ! echo "$line" | grep -Eq "(peer|rank) $victim([^0-9]|\$)"; then
            tap FAIL "$label: survivor $r: the error does not name rank $victim: $line"
        elif [ "${ms:-999999}" -gt $((300 + idle_limit_ms)) ]; then
            tap FAIL "$label: survivor $r saw it $ms ms after the last call (limit $((300 + idle_limit_ms)))"
        else
            tap OK "$label: survivor $r: SHOAL_ERR_PEER_FAILED naming rank $victim, $ms ms after the last call (death at 300 ms), no collective"
        fi
        r=$((r + 1))
    done
    if [ "$rc" -ne 137 ]; then
        tap FAIL "$label: shoalrun exited $rc, expected 137 (victim SIGKILLed)"
        dump_err
    fi
}

# idleabort_case TRANSPORT NRANKS: rank 0 aborts between calls and lives on; the others' next
# call fails within 1 s, told by rank 0 (not at their timeout, not by its exit).
idleabort_case() {
    label="idle abort ${1:-shm} n=$2"
    launch "$label" "$2" "$1" idleabort 0
    if grep -q '^idleabort 0: later call SHOAL_ERR_ABORTED$' "$tmp/out"; then
        tap OK "$label: rank 0's call after its abort: SHOAL_ERR_ABORTED"
    else
        tap FAIL "$label: rank 0's call after its abort: $(grep '^idleabort 0:' "$tmp/out")"
    fi
    r=1
    while [ $r -lt "$2" ]; do
        line=$(grep "^idleabort $r: " "$tmp/out")
        ms=$(echo "$line" | sed -n 's/^idleabort [0-9]*: status SHOAL_ERR_PEER_FAILED after \([0-9]*\) ms: .*/\1/p')
        if [ -z "$ms" ] || ! echo "$line" | grep -q 'because of rank 0'; then
            tap FAIL "$label: rank $r: ${line:-no verdict}"
        elif [ "$ms" -gt 1000 ]; then
            tap FAIL "$label: rank $r learned of the abort after $ms ms (limit 1000)"
        else
            tap OK "$label: rank $r: SHOAL_ERR_PEER_FAILED after $ms ms, told that rank 0 failed"
        fi
        r=$((r + 1))
    done
    if [ "$rc" -ne 0 ]; then
        tap FAIL "$label: shoalrun exited $rc"
        dump_err
    fi
}

kill_tls="shm tcp"
if "$builddir/shoal_info" -b 2>/dev/null | grep -q "ucx *usable: yes"; then
    kill_tls="shm tcp ucx"
fi
i=0
while [ $i -lt "${KILL_REPEAT:-1}" ]; do
    for tl in ${KILL_TRANSPORTS:-$kill_tls}; do
        [ "${KILL_ONLY_LAZY:-0}" = 1 ] && break
        [ "$tl" = shm ] && tl="" # the automatic choice: shm on one host
        kill_case "$tl" 3
        kill_case "$tl" 4
    done
    # Channels connected at first use: most survivors never had one to the victim.
    [ "${KILL_ONLY_LAZY:-0}" = 1 ] || kill_case tcp "${KILL_LAZY_N:-8}" lazy
    case " ${KILL_TRANSPORTS:-$kill_tls} " in
    *" ucx "*) kill_case ucx "${KILL_LAZY_N:-8}" lazy ;;
    esac
    case " ${KILL_TRANSPORTS:-$kill_tls} " in
    *" ib "*) [ -n "${KILL_LAZY_N:-}" ] && kill_case ib "$KILL_LAZY_N" lazy ;;
    esac
    # ucx with every rank on a virtual host of its own (hostid_wrap.sh): UCX still carries the
    # messages through its shared memory, which tells nobody of a death; the survivors timed
    # out (SHOAL_ERR_TIMEOUT, naming nobody) until the transport watched such a peer's process.
    case " ${KILL_TRANSPORTS:-$kill_tls} " in
    *" ucx "*)
        if [ "${KILL_ONLY_LAZY:-0}" != 1 ] && [ -z "${KILL_WRAP:-}" ]; then
            KILL_WRAP="$(dirname "$0")/../mp/hostid_wrap.sh" kill_label=" virtual hosts"
            kill_case ucx 3
            KILL_WRAP="" kill_label=""
        fi
        ;;
    esac
    i=$((i + 1))
done
connect=""
for tl in "" tcp; do
    [ "${KILL_ONLY_LAZY:-0}" = 1 ] && break
    if [ -n "${KILL_WRAP:-}" ]; then
        # Ranks on virtual hosts (tests/vm): an idle communicator looks only at the peers of
        # its own host; others learn of a death at their next call (README).
        tap OK "idle ${tl:-shm} n=3 # SKIP ranks wrapped onto several hosts (KILL_WRAP)"
        continue
    fi
    idle_case "$tl" 3
done
# leader_case TRANSPORT NRANKS [VARIANT]
leader_case() {
    label="leader${3:+ $3} ${1:-shm} n=$2"
    launch "$label" "$2" "$1" leader
    r=0
    while [ $r -lt "$2" ]; do
        line=$(grep "^leader $r: " "$tmp/out" | head -n 1)
        if [ "$line" = "leader $r: async SHOAL_OK, allreduce SHOAL_OK, sum $2" ]; then
            tap OK "$label: rank $r: ${line#leader $r: }"
        else
            tap FAIL "$label: rank $r: ${line:-no verdict}"
        fi
        r=$((r + 1))
    done
    if [ "$rc" -eq 0 ]; then
        tap OK "$label: shoalrun exited 0"
    else
        tap FAIL "$label: shoalrun exited $rc"
        dump_err
    fi
}
for tl in "" tcp; do
    [ "${KILL_ONLY_LAZY:-0}" = 1 ] || [ -n "${KILL_WRAP:-}" ] && break
    leader_case "$tl" 3
done
# The same with rank 0 in a pid namespace of its own (a container sharing the host id): the
# pids the others published name nobody there (and its pid 1 is another process here), so an
# idle rank must not judge a peer of another pid namespace by its pid (it took both for dead).
cat >"$tmp/pidns_wrap.sh" <<'EOF'
#!/bin/sh
[ "$SHOAL_RANK" = 0 ] && exec unshare --pid --fork --kill-child "$@"
exec "$@"
EOF
chmod +x "$tmp/pidns_wrap.sh"
for tl in "" tcp; do
    [ "${KILL_ONLY_LAZY:-0}" = 1 ] || [ -n "${KILL_WRAP:-}" ] && break
    if ! unshare --pid --fork true 2>/dev/null; then
        tap OK "leader pidns ${tl:-shm} n=3 # SKIP unshare --pid needs root (CAP_SYS_ADMIN)"
        continue
    fi
    KILL_WRAP=$tmp/pidns_wrap.sh
    leader_case "$tl" 3 pidns
    KILL_WRAP=""
done
# Over ucx, rank 0 in a pid namespace of its own, where a process takes rank 1's pid (set
# through ns_last_pid) and is killed once every endpoint is set up: the transport watched the
# process that the peer's published pid names there, and took its exit for rank 1's, failing
# a healthy job ("peer 1 (pid N) exited").
cat >"$tmp/pidns_ucx_wrap.sh" <<'EOF'
#!/bin/sh
d=$KILL_DIR
case "$SHOAL_RANK" in
0) exec unshare --pid --fork --kill-child sh -c '
       while [ ! -s "$0/pid.1" ]; do sleep 0.01; done
       echo $(($(cat "$0/pid.1") - 1)) >/proc/sys/kernel/ns_last_pid
       sleep 60 &
       echo $! >"$0/fake"
       touch "$0/ready"
       (while [ ! -e "$0/mark" ]; do sleep 0.01; done; kill "$(cat "$0/fake")") &
       exec "$@"' "$d" "$@" ;;
1) echo $$ >"$d/pid.1.tmp" && mv "$d/pid.1.tmp" "$d/pid.1"
   i=0
   while [ ! -e "$d/ready" ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i + 1)); done ;;
esac
exec "$@"
EOF
chmod +x "$tmp/pidns_ucx_wrap.sh"
pidns_ucx_case() {
    label="pidns ucx n=3, a process of rank 0's namespace with rank 1's pid exits"
    mkdir -p "$tmp/pu"
    KILL_DIR=$tmp/pu KILL_MARK=$tmp/pu/mark
    export KILL_DIR KILL_MARK
    KILL_WRAP=$tmp/pidns_ucx_wrap.sh
    launch "$label" 3 ucx steady 0
    KILL_WRAP=""
    unset KILL_DIR KILL_MARK
    fake=$(cat "$tmp/pu/fake" 2>/dev/null)
    if [ "$fake" != "$(cat "$tmp/pu/pid.1" 2>/dev/null)" ] || [ ! -e "$tmp/pu/mark" ]; then
        tap OK "$label # SKIP the process did not get rank 1's pid (${fake:-none})"
    elif [ "$(grep -c "^steady [0-2]: status SHOAL_OK after" "$tmp/out")" = 3 ] &&
        [ "$rc" -eq 0 ]; then
        tap OK "$label: every rank's AllReduces succeed"
    else
        tap FAIL "$label: $(grep -v "^steady [0-2]: status SHOAL_OK" "$tmp/out" | head -n 1)"
        dump_err
    fi
}
case " ${KILL_TRANSPORTS:-$kill_tls} " in
*" ucx "*)
    if [ "${KILL_ONLY_LAZY:-0}" != 1 ] && [ -z "${KILL_WRAP:-}" ]; then
        if unshare --pid --fork true 2>/dev/null; then
            pidns_ucx_case
        else
            tap OK "pidns ucx n=3 # SKIP unshare --pid needs root (CAP_SYS_ADMIN)"
        fi
    fi
    ;;
esac
for tl in "" tcp; do
    [ "${KILL_ABORT:-1}" = 0 ] && break
    abort_case "$tl" 2 0
    abort_case "$tl" 2 8
    abort_case "$tl" 3 8
done
# Over ucx, the late rank's first send finds rank 0 gone (its worker destroyed, its process
# exiting): UCX fails it at once ("Shared memory error"), before any liveness check; the error
# must still be SHOAL_ERR_PEER_FAILED with the cause rank 0's notice gave (it was
# SHOAL_ERR_TRANSPORT, blaming nobody).
case " ${KILL_TRANSPORTS:-$kill_tls} " in
*" ucx "*) [ "${KILL_ABORT:-1}" = 0 ] || [ "${KILL_ONLY_LAZY:-0}" = 1 ] || abort_case ucx 2 0 strict ;;
esac
for tl in ${KILL_TRANSPORTS:-$kill_tls}; do
    [ "${KILL_ABORT:-1}" = 0 ] || [ "${KILL_ONLY_LAZY:-0}" = 1 ] && break
    [ "$tl" = shm ] && tl=""
    idleabort_case "$tl" 3
done
tap_plan
