#!/bin/sh
# Overlap of nonblocking collectives when a network link is the bottleneck (issue 14): three
# network namespaces on one bridge; rank 0's link is fast (4 x RATE), the links of ranks 1
# and 2 are shaped to RATE (tc htb, both directions). perf/nbc_overlap.c times an 8 MiB
# iallreduce on communicator A = {0, 1} alone, on B = {0, 2} alone, and one on each at once;
# each communicator's traffic crosses its own slow link, so the two at once can take the time
# of one. Target: two / one <= 1.2. For reference it also times two on A (one link: ~2x).
#
# usage: perf/nbc_overlap.sh [--rate 200mbit] [--size 8M] [--reps 5]
# Needs root, iproute2 with tc, the build (top_builddir, default build/). Exit 0 when the
# target is met, 1 when not, 77 when namespaces are unavailable. Cleans up its namespaces.
set -u
top_builddir=${top_builddir:-build}
top_srcdir=${top_srcdir:-.}
rate=200mbit
size=8M
reps=5
while [ $# -gt 0 ]; do
    case $1 in
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--rate R] [--size S] [--reps N]" >&2; exit 2 ;;
    esac
done
case $size in
*M) bytes=$((${size%M} * 1048576)) ;;
*K|*k) bytes=$((${size%?} * 1024)) ;;
*) bytes=$size ;;
esac
PROG=$top_builddir/nbc_overlap
NETNS_MKUID=$top_builddir/tests/netns/mkuid
NETNS_TMP=$(mktemp -d "${TMPDIR:-/tmp}/nbc_overlap.XXXXXX") || exit 1
netns_on_exit='rm -rf "$NETNS_TMP"'
export NETNS_TMP NETNS_MKUID
# shellcheck source=tests/netns/netns_lib.sh
. "$top_srcdir/tests/netns/netns_lib.sh"
for f in "$PROG" "$NETNS_MKUID"; do
    [ -x "$f" ] || { echo "nbc_overlap: $f not built" >&2; exit 1; }
done
if ! netns_usable; then
    echo "nbc_overlap: SKIP: $netns_why"
    rm -rf "$NETNS_TMP"
    exit 77
fi
command -v tc >/dev/null 2>&1 || { echo "nbc_overlap: SKIP: tc not found"; exit 77; }

netns_setup 3 "$rate" || { echo "nbc_overlap: setting up the namespaces failed" >&2; exit 1; }
# rank 0's host: 4 x the rate, so that only the links of ranks 1 and 2 limit
fast=$(echo "$rate" | awk '{ n = $0 + 0; u = substr($0, length(n "") + 1); print 4 * n u }')
tc -n "$netns_prefix-0" class change dev "$netns_ifname" parent 1: classid 1:10 htb rate "$fast" &&
    tc -n "$netns_prefix-br" class change dev vb0 parent 1: classid 1:10 htb rate "$fast" ||
    { echo "nbc_overlap: reshaping rank 0's link failed" >&2; exit 1; }

echo "# nbc_overlap: 3 namespaces, links of ranks 1 and 2 at $rate, rank 0's at $fast;" \
    "iallreduce of $size over tcp, $reps repetitions (medians)"
NETNS_ENV="SHOAL_TRANSPORT=tcp SHOAL_TIMEOUT_MS=60000 ${NBC_ENV:-}"
netns_job "$NETNS_TMP/job" 1 block 300 "$PROG" -b "$bytes" -n "$reps"
rc=$?
cat "$NETNS_TMP/job.0.out"
if [ $rc -ne 0 ]; then
    for r in 0 1 2; do
        sed "s/^/# rank $r: /" "$NETNS_TMP/job.$r.err" | tail -n 5
    done
    echo "nbc_overlap: the job failed (exit $rc)"
    exit 1
fi
ratio=$(sed -n 's/.* two [0-9.]* s ratio \([0-9.]*\) .*/\1/p' "$NETNS_TMP/job.0.out")
if awk -v r="$ratio" 'BEGIN { exit !(r != "" && r + 0 <= 1.2) }'; then
    echo "# two in flight on different communicators / one: $ratio (target <= 1.2): met"
    exit 0
fi
echo "# two in flight on different communicators / one: $ratio (target <= 1.2): NOT met"
exit 1
