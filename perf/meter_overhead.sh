#!/bin/sh
# Cost of metering (src/meter) on the data path, both sides in one run: meter_bench
# (perf/meter_bench.c -T) times alternating batches of the same AllReduce on one communicator
# in one process, its meter attached for one batch of each pair and detached for the other
# (as SHOAL_METER=0 leaves a communicator), so that drift, placement and load fall on both.
# (Two communicators, one made with the meter and one without, differ by where their shared
# areas lie: up to 80 ns at 8 B on 2 ranks either way, changing from launch to launch, more
# than the meter's cost; one communicator has no such difference: three launches here agreed
# within 0.01; perf/results/overhead-2026-12-05.txt.) Per case: medians and minima of the per-call
# time (ns) on and off, their ratios, and the median of the per-pair differences (the best
# figure of the meter's cost on a loaded machine). Cases: 8 B on RANKS ranks (latency: the
# per-call cost), 64 MiB on RANKS ranks (bandwidth: one add per message), 8 B on 1 rank (no
# communication: the call path alone). The issue's budget: <= 1.01 at 8 B, nothing
# measurable at 64 MiB.
#
# The 1-rank case also in thread CPU time (its calls never wait: the meter's cost on the call
# path without the machine's preemptions, the robust figure on a loaded machine).
# Then the pieces on this machine (1-rank run): one read of the call path's clock
# (shoal_ticks: rdtsc), one clock_gettime, the meter's hooks with both clock reads, and with
# the entry read given (a call pays that much for the meter where the entry read is shared
# with the CUDA layer's driver check: a process without libcuda), the hooks of page version 1
# (a multiply per call); and in context, after a wait whose exit is mispredicted like a
# peer's: one clock read, the hooks, version 1's hooks. And, with valgrind, the instructions
# per call on and off (callgrind, 1 rank, two call counts: the difference per call, less the
# instructions of what runs on time rather than per call: the CUDA layer's look for a loaded
# driver, dl_iterate_phdr, and the meter's once-a-second check; a machine-independent figure).
#
# usage: perf/meter_overhead.sh [--ranks N] [--pairs K] [--build DIR] [--transport T]
#                               [--no-callgrind]
# The agent is off (SHOAL_AGENT=none) so that only counting is measured.

here=$(cd "$(dirname "$0")" && pwd)
build=$here/../build
ranks=2
pairs=101
transport=""
callgrind=1
while [ $# -gt 0 ]; do
    case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --pairs|--reps) pairs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --no-callgrind) callgrind=0; shift ;;
    *) echo "usage: $0 [--ranks N] [--pairs K] [--build DIR] [--transport T] [--no-callgrind]" >&2
       exit 2 ;;
    esac
done
shoalrun=$build/shoalrun
bench=$build/meter_bench
[ -x "$shoalrun" ] && [ -x "$bench" ] || { echo "meter_overhead.sh: build $build first" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/meter_overhead.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

# run NRANKS ARGS...: meter_bench's key value lines in $tmp/out
run() {
    n=$1
    shift
    xs="-x SHOAL_AGENT=none"
    [ -n "$transport" ] && xs="$xs -x SHOAL_TRANSPORT=$transport"
    # shellcheck disable=SC2086
    "$shoalrun" --no-prefix --timeout 600 -n "$n" $xs "$bench" "$@" >"$tmp/out" 2>"$tmp/err" ||
        { echo "meter_overhead.sh: meter_bench $* on $n ranks failed:" >&2; cat "$tmp/err" >&2; exit 1; }
}
key() { awk -v k="$1" '$1 == k { print $2 }' "$tmp/out"; }

echo "# meter overhead: meter_bench -T, $pairs alternated pairs of batches (one communicator," \
    "its meter attached and detached)${transport:+, $transport}, $(nproc) CPUs, load" \
    "$(cut -d' ' -f1-3 /proc/loadavg), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
printf '# %8s %5s %11s %11s %7s %11s %11s %7s %9s %7s\n' size ranks "on median" "off median" \
    ratio "on min" "off min" ratio "on-off" ratio
for spec in "8 $ranks 2000" "64M $ranks 2" "8 1 20000"; do
    # shellcheck disable=SC2086
    set -- $spec
    k=$pairs
    w=$3
    [ "$1" = 64M ] && { k=$(( pairs < 21 ? pairs : 21 )); w=2; }
    run "$2" -b "$1" -n "$3" -k "$k" -w "$w" -T
    printf '  %8s %5s %11s %11s %7s %11s %11s %7s %9s %7s\n' "$1" "$2" "$(key on_median_ns)" \
        "$(key off_median_ns)" "$(key ratio_median)" "$(key on_min_ns)" "$(key off_min_ns)" \
        "$(key ratio_min)" "$(key diff_median_ns)" "$(key ratio_diff)"
    if [ "$1" = 8 ] && [ "$2" != 1 ]; then
        cp "$tmp/out" "$tmp/lat"
    fi
    if [ "$2" = 1 ]; then
        printf '  %8s %5s %11s %11s %7s %11s %11s %7s %9s %7s  (thread CPU time)\n' "$1" "$2" \
            "$(key cpu_on_median_ns)" "$(key cpu_off_median_ns)" "" "" "" "" \
            "$(key cpu_diff_median_ns)" "$(key cpu_ratio_diff)"
    fi
done
# (times in ns per call; on-off: median of the per-pair differences, its ratio to off median)
echo "# pieces (ns, this machine, 1 rank): clock $(key clock) at $(key clock_ghz) GHz;" \
    "one clock read $(key clock_read_ns), one clock_gettime $(key clock_gettime_ns);" \
    "meter hooks with both reads $(key hooks_ns), with the entry read shared $(key hooks_marginal_ns)" \
    "(page version 1, a multiply per call: $(key hooks_mul_ns))"
echo "# in context (ns): a wait like a peer's $(key wait_ns); then one clock read" \
    "+$(awk -v a="$(key wait_clock_ns)" -v b="$(key wait_ns)" 'BEGIN { printf "%.2f", a - b }')," \
    "the meter's hooks" \
    "+$(awk -v a="$(key wait_meter_ns)" -v b="$(key wait_ns)" 'BEGIN { printf "%.2f", a - b }')," \
    "version 1's hooks" \
    "+$(awk -v a="$(key wait_mul_ns)" -v b="$(key wait_ns)" 'BEGIN { printf "%.2f", a - b }')"
if [ -s "$tmp/lat" ]; then
    awk -v c="$(key clock_read_ns)" '$1 == "off_median_ns" { off = $2 } END {
        printf "# 1%% of the %s-rank 8 B call (%.1f ns) is %.2f ns; one clock read is %.1f%% of it\n",
               r, off, off / 100, 100 * c / off }' r="$ranks" "$tmp/lat"
fi

if [ "$callgrind" = 1 ] && command -v valgrind >/dev/null 2>&1; then
    for m in on off; do
        for n in 5000 10000; do
            "$shoalrun" --no-prefix --timeout 600 -n 1 -x SHOAL_AGENT=none valgrind \
                --tool=callgrind --toggle-collect=shoal_allreduce \
                --callgrind-out-file="$tmp/cg.$m.$n" "$bench" -o "$m" -n "$n" -w 10 \
                >/dev/null 2>"$tmp/cg.$m.$n.err" || { echo "meter_overhead.sh: callgrind failed" >&2; exit 1; }
            # the total less what runs on time, not per call (inclusive costs)
            callgrind_annotate --inclusive=yes --threshold=100 "$tmp/cg.$m.$n" 2>/dev/null |
                awk '/PROGRAM TOTALS/ { gsub(",", "", $1); t = $1 }
                     !/=>/ && /:dl_iterate_phdr |:shoal_meter_check / { gsub(",", "", $1); x += $1 }
                     END { print t - x }' >"$tmp/ir.$m.$n"
            [ -s "$tmp/ir.$m.$n" ] || { echo "meter_overhead.sh: callgrind_annotate failed" >&2; exit 1; }
        done
    done
    on=$(( ($(cat "$tmp/ir.on.10000") - $(cat "$tmp/ir.on.5000")) ))
    off=$(( ($(cat "$tmp/ir.off.10000") - $(cat "$tmp/ir.off.5000")) ))
    awk -v on="$on" -v off="$off" 'BEGIN {
        printf "# instructions per 8 B AllReduce call, 1 rank (callgrind, shoal_allreduce and below):" \
               " on %.1f, off %.1f, meter %.1f (%.1f%%)\n", on / 5000, off / 5000,
               (on - off) / 5000, 100 * (on - off) / off }'
fi
