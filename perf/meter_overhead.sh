#!/bin/sh
# Cost of metering (src/meter) on the data path: allreduce_perf with the counters on
# (SHOAL_METER=1, the default) and off (SHOAL_METER=0), alternating in one run, REPS
# repetitions each, at 8 B (latency: the per-call cost, seqlock + two clock reads + a few
# stores) and 64 MiB (bandwidth: one store per message). Prints the median time of each and
# the ratio on/off (and of the minima: the best estimate of a quiet machine when others load
# it); the issue's budget is <= 1.01 at 8 B and no measurable change at 64 MiB.
# The agent is off (SHOAL_AGENT=none) so that only counting is measured.
#
# usage: perf/meter_overhead.sh [--ranks N] [--reps K] [--build DIR] [--transport T]
# A loaded machine makes single runs noisy: the medians of alternated runs are what to
# compare, and the spread is printed with them.

here=$(cd "$(dirname "$0")" && pwd)
build=$here/../build
ranks=2
reps=7
transport=""
while [ $# -gt 0 ]; do
    case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    *) echo "usage: $0 [--ranks N] [--reps K] [--build DIR] [--transport T]" >&2; exit 2 ;;
    esac
done
shoalrun=$build/shoalrun
perf=$build/allreduce_perf
[ -x "$shoalrun" ] && [ -x "$perf" ] || { echo "meter_overhead.sh: build $build first" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/meter_overhead.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

# one_run METER SIZE WARMUP ITERS NRANKS: the out-of-place time (us) of rank 0's line
one_run() {
    xs="-x SHOAL_METER=$1 -x SHOAL_AGENT=none"
    [ -n "$transport" ] && xs="$xs -x SHOAL_TRANSPORT=$transport"
    # shellcheck disable=SC2086
    "$shoalrun" --no-prefix --timeout 300 -n "$5" $xs "$perf" -b "$2" -e "$2" -w "$3" \
        -n "$4" -c 0 2>/dev/null | awk '$1 ~ /^[0-9]+$/ { print $6; exit }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2];
    else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
spread() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s..%s", lo, hi }'; }

echo "# meter overhead: allreduce_perf, $ranks ranks${transport:+, $transport}, $reps" \
    "alternated repetitions of SHOAL_METER=1 and =0, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '# %10s %6s %12s %12s %8s %10s %10s %8s\n' size ranks "on median" "off median" \
    "ratio" "on min" "off min" "ratio"
# The last line is the per-call cost alone: one rank, no communication, so on - off is what
# the counting adds to every call (compare it with the 2-rank 8 B time of a quiet machine).
for spec in "8 2000 20000 $ranks" "64M 2 10 $ranks" "8 10000 1000000 1"; do
    # shellcheck disable=SC2086
    set -- $spec
    : >"$tmp/on"
    : >"$tmp/off"
    for r in $(seq "$reps"); do
        if [ $((r % 2)) -eq 1 ]; then order="1 0"; else order="0 1"; fi
        for m in $order; do
            t=$(one_run "$m" "$1" "$2" "$3" "$4")
            [ -n "$t" ] || { echo "meter_overhead.sh: a run failed (SHOAL_METER=$m, $1)" >&2; exit 1; }
            if [ "$m" = 1 ]; then echo "$t" >>"$tmp/on"; else echo "$t" >>"$tmp/off"; fi
        done
    done
    on=$(median <"$tmp/on")
    off=$(median <"$tmp/off")
    onmin=$(sort -g "$tmp/on" | head -n 1)
    offmin=$(sort -g "$tmp/off" | head -n 1)
    printf '  %10s %6s %12s %12s %8s %10s %10s %8s\n' "$1" "$4" "$on" "$off" \
        "$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.4f", a / b }')" "$onmin" "$offmin" \
        "$(awk -v a="$onmin" -v b="$offmin" 'BEGIN { printf "%.4f", a / b }')"
    echo "#   spread (us): on $(spread <"$tmp/on"), off $(spread <"$tmp/off")"
done
