# shellcheck shell=sh
# Multi-host runs on one machine: "hosts" are network namespaces joined by veth pairs to a
# bridge that lives in a namespace of its own, so nothing is added to the root namespace and
# concurrent runs never see each other. Sourced by tests/netns/run_netns.sh and
# perf/compare.sh.
#
#   netns_usable                  -> 0, or 1 with the reason in $netns_why
#   netns_setup HOSTS [RATE]      make HOSTS namespaces (10.99.0.1..), RATE shapes every host
#                                 link in both directions with htb (e.g. 1gbit); cleanup is
#                                 armed (trap EXIT INT TERM) before anything is made
#   netns_uid_start               run mkuid in the first host (its root must be reachable)
#   netns_job OUT NPH PLACE SECS PROG ARGS...
#                                 NPH ranks per host, PLACE block|interleave; rank r's output
#                                 goes to OUT.r.out / OUT.r.err; extra variables for the ranks
#                                 in $NETNS_ENV (words VAR=VALUE); returns the worst exit status
#   netns_cleanup                 kill what we started, delete our namespaces (idempotent)
#
# Needs: root, iproute2 (ip, and tc for RATE), veth and bridge support, timeout(1).
# Variables: NETNS_MKUID (path of tests/netns/mkuid), NETNS_TMP (scratch directory).

netns_prefix="shoalns-$$"
netns_hosts=""
netns_nhosts=0
netns_pids=""
netns_uid=""
netns_uid_pid=""
netns_armed=0
netns_why=""
netns_ifname=veth0

netns_log() {
    echo "# netns: $*" >&2
}

# Deletes namespaces of earlier runs (shoalns-PID-*) whose PID is gone.
netns_reap_leftovers() {
    for _nl_ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^shoalns-[0-9]*-'); do
        _nl_pid=${_nl_ns#shoalns-}
        _nl_pid=${_nl_pid%%-*}
        if [ "$_nl_pid" != "$$" ] && ! kill -0 "$_nl_pid" 2>/dev/null; then
            netns_log "deleting leftover namespace $_nl_ns"
            ip netns pids "$_nl_ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
            ip netns delete "$_nl_ns" 2>/dev/null
        fi
    done
}

netns_usable() {
    if [ "$(id -u)" != 0 ]; then
        netns_why="needs root (ip netns add)"
        return 1
    fi
    for _nl_tool in ip timeout; do
        if ! command -v "$_nl_tool" >/dev/null 2>&1; then
            netns_why="$_nl_tool not found (iproute2, coreutils)"
            return 1
        fi
    done
    _nl_probe="$netns_prefix-probe"
    if ! ip netns add "$_nl_probe" 2>/dev/null; then
        netns_why="'ip netns add' is not permitted here"
        return 1
    fi
    if ! ip -n "$_nl_probe" link add pa type veth peer name pb 2>/dev/null ||
        ! ip -n "$_nl_probe" link add pbr type bridge 2>/dev/null; then
        ip netns delete "$_nl_probe" 2>/dev/null
        netns_why="veth or bridge links are not supported in a namespace here"
        return 1
    fi
    ip netns delete "$_nl_probe" 2>/dev/null
    return 0
}

netns_cleanup() {
    for _nl_pid in $netns_pids $netns_uid_pid; do
        kill -TERM "$_nl_pid" 2>/dev/null
    done
    if [ -n "$netns_pids$netns_uid_pid" ]; then
        sleep 0.2
        for _nl_pid in $netns_pids $netns_uid_pid; do
            kill -KILL "$_nl_pid" 2>/dev/null
        done
    fi
    exec 7>&-
    netns_pids=""
    netns_uid_pid=""
    for _nl_ns in $netns_hosts "$netns_prefix-br" "$netns_prefix-probe"; do
        if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$_nl_ns"; then
            ip netns pids "$_nl_ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
            ip netns delete "$_nl_ns" 2>/dev/null
        fi
    done
    netns_hosts=""
    netns_nhosts=0
}

netns_arm() {
    if [ "$netns_armed" = 0 ]; then
        netns_armed=1
        trap 'netns_cleanup; eval "${netns_on_exit:-:}"' EXIT
        trap 'netns_cleanup; trap - EXIT; exit 130' INT
        trap 'netns_cleanup; trap - EXIT; exit 143' TERM
    fi
}

# netns_shape NS DEV RATE: htb root qdisc with one class at RATE for everything.
netns_shape() {
    ip -n "$1" link set "$2" txqueuelen 1000 2>/dev/null
    tc -n "$1" qdisc add dev "$2" root handle 1: htb default 10 &&
        tc -n "$1" class add dev "$2" parent 1: classid 1:10 htb rate "$3"
}

netns_setup() {
    _nl_nh=$1
    _nl_rate=${2:-}
    netns_arm
    netns_reap_leftovers
    _nl_br="$netns_prefix-br"
    ip netns add "$_nl_br" || return 1
    ip -n "$_nl_br" link set lo up &&
        ip -n "$_nl_br" link add br0 type bridge &&
        ip -n "$_nl_br" link set br0 up || return 1
    _nl_h=0
    while [ "$_nl_h" -lt "$_nl_nh" ]; do
        _nl_ns="$netns_prefix-$_nl_h"
        ip netns add "$_nl_ns" || return 1
        netns_hosts="$netns_hosts $_nl_ns"
        netns_nhosts=$((_nl_h + 1))
        ip -n "$_nl_br" link add "vb$_nl_h" type veth peer name "$netns_ifname" netns "$_nl_ns" &&
            ip -n "$_nl_br" link set "vb$_nl_h" master br0 up &&
            ip -n "$_nl_ns" link set lo up &&
            ip -n "$_nl_ns" addr add "10.99.0.$((_nl_h + 1))/24" dev "$netns_ifname" &&
            ip -n "$_nl_ns" link set "$netns_ifname" up || return 1
        if [ -n "$_nl_rate" ]; then
            netns_shape "$_nl_ns" "$netns_ifname" "$_nl_rate" && netns_shape "$_nl_br" "vb$_nl_h" "$_nl_rate" ||
                return 1
        fi
        _nl_h=$((_nl_h + 1))
    done
    # Wait for the links to pass traffic (bridge ports start in the listening state only with
    # STP, which is off; the veth carrier comes up at once, but give it a moment).
    _nl_h=1
    while [ "$_nl_h" -lt "$_nl_nh" ]; do
        ip netns exec "$netns_prefix-0" ping -c 1 -W 2 "10.99.0.$((_nl_h + 1))" >/dev/null 2>&1 ||
            netns_log "warning: 10.99.0.$((_nl_h + 1)) does not answer ping yet"
        _nl_h=$((_nl_h + 1))
    done
    return 0
}

# Starts mkuid in the first host; sets netns_uid. Its stdin is a FIFO held open on fd 7:
# closing fd 7 (netns_cleanup) ends it, and so does its own deadline.
netns_uid_start() {
    _nl_usecs=${1:-600}
    _nl_fifo="$NETNS_TMP/uid.fifo"
    rm -f "$_nl_fifo" "$NETNS_TMP/uid"
    mkfifo "$_nl_fifo" || return 1
    ip netns exec "$netns_prefix-0" timeout -k 2 "$((_nl_usecs + 5))" "$NETNS_MKUID" "$_nl_usecs" \
        <"$_nl_fifo" >"$NETNS_TMP/uid" 2>"$NETNS_TMP/uid.err" &
    netns_uid_pid=$!
    exec 7>"$_nl_fifo"
    _nl_i=0
    while [ "$_nl_i" -lt 100 ]; do
        netns_uid=$(head -n 1 "$NETNS_TMP/uid" 2>/dev/null)
        if [ ${#netns_uid} -eq 256 ]; then
            return 0
        fi
        sleep 0.1
        _nl_i=$((_nl_i + 1))
    done
    netns_log "mkuid gave no id: $(cat "$NETNS_TMP/uid.err" 2>/dev/null)"
    return 1
}

netns_uid_stop() {
    exec 7>&-
    if [ -n "$netns_uid_pid" ]; then
        wait "$netns_uid_pid" 2>/dev/null
        netns_uid_pid=""
    fi
}

# netns_host_of RANK NPH PLACE: index of the namespace of RANK.
netns_host_of() {
    if [ "$3" = interleave ]; then
        echo $(($1 % netns_nhosts))
    else
        echo $(($1 / $2))
    fi
}

netns_job() {
    _nl_out=$1
    _nl_nph=$2
    _nl_place=$3
    _nl_secs=$4
    shift 4
    _nl_n=$((_nl_nph * netns_nhosts))
    netns_uid_start "$((_nl_secs + 10))" || return 1
    netns_pids=""
    _nl_r=0
    while [ "$_nl_r" -lt "$_nl_n" ]; do
        _nl_ns="$netns_prefix-$(netns_host_of "$_nl_r" "$_nl_nph" "$_nl_place")"
        # shellcheck disable=SC2086 # NETNS_ENV is a word list on purpose
        ip netns exec "$_nl_ns" timeout -k 2 "$_nl_secs" env SHOAL_UID="$netns_uid" SHOAL_RANK="$_nl_r" \
            SHOAL_NRANKS="$_nl_n" SHOAL_HOSTID="$_nl_ns" SHOAL_SOCKET_IFNAME="=$netns_ifname" \
            ${NETNS_ENV:-} "$@" >"$_nl_out.$_nl_r.out" 2>"$_nl_out.$_nl_r.err" </dev/null &
        netns_pids="$netns_pids $!"
        _nl_r=$((_nl_r + 1))
    done
    _nl_worst=0
    for _nl_pid in $netns_pids; do
        wait "$_nl_pid"
        _nl_rc=$?
        if [ "$_nl_rc" -gt "$_nl_worst" ]; then
            _nl_worst=$_nl_rc
        fi
    done
    netns_pids=""
    netns_uid_stop
    netns_uid=""
    return "$_nl_worst"
}
