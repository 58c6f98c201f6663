#!/bin/sh
# Multi-host checks without a cluster: "hosts" are network namespaces joined by veth pairs to
# a bridge (tests/netns/netns_lib.sh); ranks are started by hand in them with a SHOAL_HOSTID
# per namespace, so ranks of one namespace use shm and ranks of different ones tcp.
# tests/netns/ns_coll checks the channel transports and the results of allreduce, broadcast,
# allgather and reduce_scatter; rank 0's TAP lines are merged here, each prefixed by the
# layout. Skips (1..0 # SKIP) where network namespaces cannot be made.
#
# Environment: top_builddir (set by make check); NETNS_LAYOUTS to replace the default list
# (words HOSTSxPPN[:interleave][:RATE]); NETNS_ALGOS, algorithms to force on top of the
# automatic choice (default: every SHOAL_ALGO value this build accepts, tried from a list);
# NETNS_TIMEOUT (seconds per run, default 60).

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
prog=$builddir/tests/netns/ns_coll
NETNS_MKUID=$builddir/tests/netns/mkuid
timeout=${NETNS_TIMEOUT:-60}
layouts=${NETNS_LAYOUTS:-"2x2:1gbit 3x1 2x3 2x2:interleave"}
algo_layouts="3x1 2x3:interleave"
n_tap=0
NETNS_TMP=$(mktemp -d "${TMPDIR:-/tmp}/run_netns.XXXXXX") || exit 99
netns_on_exit='rm -rf "$NETNS_TMP"'
export NETNS_TMP NETNS_MKUID

# shellcheck source=tests/netns/netns_lib.sh
. "$srcdir/tests/netns/netns_lib.sh"

if [ ! -x "$prog" ] || [ ! -x "$NETNS_MKUID" ]; then
    echo "1..0 # SKIP $prog or $NETNS_MKUID not built"
    rm -rf "$NETNS_TMP"
    exit 0
fi
if ! netns_usable; then
    echo "1..0 # SKIP network namespaces unavailable: $netns_why"
    rm -rf "$NETNS_TMP"
    exit 0
fi
netns_arm

# Algorithm names this build accepts (shoal_info warns about a value it does not know).
valid_algos() {
    for a in ${NETNS_ALGOS:-ring rd tree rab rabenseifner hier hierarchical dbtree \
        double_tree pairwise}; do
        if SHOAL_ALGO=$a "$builddir/shoal_info" -c 2>&1 | grep -q "^SHOAL_ALGO=$a\$"; then
            printf '%s ' "$a"
        fi
    done
}

# run LAYOUT [VAR=VALUE...]: one job in fresh namespaces; TAP lines of rank 0, then one line
# for the exit statuses of all ranks.
run() {
    layout=$1
    shift
    hp=${layout%%:*}
    hosts=${hp%x*}
    nph=${hp#*x}
    place=block
    rate=""
    case $layout in *:interleave*) place=interleave ;; esac
    case $layout in *:*bit) rate=${layout##*:} ;; esac
    label="$layout${1:+ $*}"
    if ! netns_setup "$hosts" "$rate" 2>"$NETNS_TMP/setup.err"; then
        n_tap=$((n_tap + 1))
        echo "not ok $n_tap - $label: namespace setup failed"
        sed -e 's/^/# /' "$NETNS_TMP/setup.err"
        netns_cleanup
        return
    fi
    t0=$(date +%s.%N)
    NETNS_ENV="SHOAL_TIMEOUT_MS=30000 $*" netns_job "$NETNS_TMP/job" "$nph" "$place" \
        "$timeout" "$prog"
    rc=$?
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    netns_cleanup
    ngroups=0
    while IFS= read -r line; do
        case $line in
        "ok "*|"not ok "*)
            n_tap=$((n_tap + 1))
            ngroups=$((ngroups + 1))
            echo "${line%% [0-9]*} $n_tap - $label: ${line#* - }"
            ;;
        "Bail out!"*)
            n_tap=$((n_tap + 1))
            echo "not ok $n_tap - $label: rank 0 bailed out: ${line#Bail out!}"
            ;;
        "#"*) echo "$line ($label)" ;;
        esac
    done <"$NETNS_TMP/job.0.out"
    if [ "$rc" -ne 0 ]; then
        for f in "$NETNS_TMP"/job.*.err; do
            sed -e "s|^|# $(basename "$f"): |" "$f" | head -n 20
        done
    fi
    n_tap=$((n_tap + 1))
    if [ "$rc" -eq 0 ] && [ "$ngroups" -gt 0 ]; then
        echo "ok $n_tap - $label: $((hosts * nph)) ranks exited 0 after ${secs} s"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "not ok $n_tap - $label: timed out after ${secs} s (limit $timeout s)"
    else
        echo "not ok $n_tap - $label: worst exit status $rc after ${secs} s"
    fi
    rm -f "$NETNS_TMP"/job.*
}

for layout in $layouts; do
    run "$layout"
done
algos=$(valid_algos)
echo "# forced algorithms: ${algos:-none}"
for a in $algos; do
    for layout in $algo_layouts; do
        run "$layout" "SHOAL_ALGO=$a"
    done
done
echo "1..$n_tap"
