#!/bin/sh
# QoS bench (issue 12), first version: two tenants' jobs (two shoalrun invocations at once,
# SHOAL_TENANT a and b) running AllReduce loops (qos_load) over shared memory or TCP on this
# host; every rank samples shoal_comm_stats at each whole second of the wall clock, and this
# script sums each job's payload bytes sent per window.
#
#   --mode cap      job a capped with SHOAL_QOS_RATE_MAX=CAP, job b free: a's rate per window
#                   against the cap (error %), b's rate, both jobs' time held back by pacing.
#   --mode weights  this script stands in for the node agent: it divides CAPACITY among a and
#                   b by weight (weights W = wa:wb, the two always busy, so the weighted
#                   max-min shares are proportional) and publishes the rates in their rates
#                   pages (SHOAL_QOS_RATES=DIR/%t.rate, beaten every 200 ms); prints each
#                   tenant's share per window against its target, and Jain's index of the
#                   weight-normalised rates.
#   --mode overhead allreduce_perf (one job, RANKS ranks) at 8 B and 64 MiB, REPS alternated
#                   runs with SHOAL_QOS_RATE_MAX unset (no pacer: one branch per send) and
#                   set very high (1000g: the pacer's clock read and arithmetic on every send,
#                   never a wait); medians and the ratio set/unset.
#
# usage: perf/qos_bench.sh [--mode cap|weights|overhead] [--reps K] [--transport shm|tcp] [--ranks N]
#            [--seconds S] [--bytes B] [--cap RATE] [--capacity RATE] [--weights wa:wb]
#            [--period MS] [--build DIR]
# --transport netns: two "hosts" (network namespaces, tests/netns/netns_lib.sh, needs root)
# joined by links shaped to --link (default 1gbit) with htb, RANKS ranks per host per job, tcp
# between them (the same jobs, each launched by netns_job instead of shoalrun).
# RATE in bytes/s with k m g suffixes (powers of 1024, as SHOAL_QOS_RATE_MAX takes them).
# Last lines (for tests/qos/run_qos.sh):
#   result mode=cap windows=N max_err_pct=E mean_err_pct=M min_b=B paced_a=P paced_b=Q status=ok
#   result mode=weights windows=N max_share_err_pct=E min_jain=J status=ok

here=$(cd "$(dirname "$0")" && pwd)
build=${top_builddir:-$here/../build}
mode=cap transport=shm ranks=2 seconds=6 bytes=131072 cap=64m capacity=128m weights=1:1
period=1000 reps=5 link=1gbit
while [ $# -gt 0 ]; do
    case $1 in
    --mode) mode=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --cap) cap=$2; shift 2 ;;
    --capacity) capacity=$2; shift 2 ;;
    --weights) weights=$2; shift 2 ;;
    --period) period=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) sed -n '/^# usage/,/^# RATE/p' "$0" >&2; exit 2 ;;
    esac
done
shoalrun=$build/shoalrun
load=$build/qos_load
[ -x "$shoalrun" ] && [ -x "$load" ] || { echo "qos_bench.sh: build $build first" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qos_bench.XXXXXX") || exit 2
pids=
trap 'for p in $pids; do kill "$p" 2>/dev/null; done; [ -n "$QOS_KEEP" ] || rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

bytes_of() { # 64m -> 67108864
    echo "$1" | awk '{ v = $1; m = 1; s = tolower(substr(v, length(v)));
        if (s == "k") m = 1024; else if (s == "m") m = 1048576; else if (s == "g") m = 1073741824;
        if (m > 1) v = substr(v, 1, length(v) - 1); printf "%.0f\n", v * m }'
}
cap_b=$(bytes_of "$cap")
capacity_b=$(bytes_of "$capacity")
hosts=1
[ "$transport" = netns ] && hosts=2
wa=${weights%%:*}
wb=${weights##*:}

if [ "$transport" = netns ]; then
    NETNS_MKUID=$build/tests/netns/mkuid
    NETNS_TMP=$tmp
    netns_on_exit='for p in $pids; do kill "$p" 2>/dev/null; done; [ -n "$QOS_KEEP" ] || rm -rf "$tmp"'
    # shellcheck source=tests/netns/netns_lib.sh
    . "$here/../tests/netns/netns_lib.sh"
    netns_usable || { echo "qos_bench.sh: no network namespaces: $netns_why" >&2; exit 2; }
    netns_setup 2 "$link" 2>"$tmp/setup.err" || {
        echo "qos_bench.sh: namespace setup failed: $(head -n 1 "$tmp/setup.err")" >&2; exit 2; }
fi

# job TENANT [VAR=VALUE...]: one job of qos_load in the background, output in tmp/TENANT
job() {
    t=$1
    shift
    if [ "$transport" = netns ]; then
        mkdir -p "$tmp/ns.$t"
        # A subshell per job: netns_job keeps its state in variables and NETNS_TMP files.
        (
            NETNS_TMP=$tmp/ns.$t
            NETNS_ENV="SHOAL_TENANT=$t SHOAL_JOB=qos-bench SHOAL_AGENT=none SHOAL_TRANSPORT=tcp $*"
            export SHOAL_TENANT="$t" SHOAL_JOB=qos-bench
            netns_job "$tmp/ns.$t/r" "$ranks" block \
                $((${seconds%.*} + 60)) "$load" -s "$seconds" -b "$bytes" -p "$period"
            rc=$?
            cat "$tmp/ns.$t"/r.*.out >"$tmp/$t"
            cat "$tmp/ns.$t"/r.*.err >"$tmp/$t.err"
            exit $rc
        ) &
        pids="$pids $!"
        return
    fi
    xs="-x SHOAL_AGENT=none -x SHOAL_TRANSPORT=$transport"
    for v in "$@"; do xs="$xs -x $v"; done
    # shellcheck disable=SC2086
    SHOAL_TENANT=$t SHOAL_JOB=qos-bench "$shoalrun" --no-prefix --timeout $((${seconds%.*} + 60)) \
        -n "$ranks" $xs "$load" -s "$seconds" -b "$bytes" -p "$period" >"$tmp/$t" \
        2>"$tmp/$t.err" &
    pids="$pids $!"
}

if [ "$mode" = overhead ]; then
    perf=$build/allreduce_perf
    median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2];
        else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
    one() { # one RATE_MAX SIZE WARMUP ITERS: rank 0's out-of-place time (us)
        "$shoalrun" --no-prefix --timeout 300 -n "$ranks" -x SHOAL_AGENT=none \
            -x SHOAL_TRANSPORT="$transport" ${1:+-x SHOAL_QOS_RATE_MAX=$1} "$perf" -b "$2" \
            -e "$2" -w "$3" -n "$4" -c 0 2>/dev/null | awk '$1 ~ /^[0-9]+$/ { print $6; exit }'
    }
    echo "# qos overhead: allreduce_perf, $transport, $ranks ranks, $reps alternated runs;" \
        "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
    printf '# %8s %14s %14s %8s\n' size "unset (us)" "1000g (us)" ratio
    for spec in "8 2000 20000" "64M 2 10"; do
        # shellcheck disable=SC2086
        set -- $spec
        : >"$tmp/u"
        : >"$tmp/s"
        for r in $(seq "$reps"); do
            one "" "$1" "$2" "$3" >>"$tmp/u"
            one 1000g "$1" "$2" "$3" >>"$tmp/s"
        done
        u=$(median <"$tmp/u")
        v=$(median <"$tmp/s")
        printf '  %8s %14s %14s %8.3f\n' "$1" "$u" "$v" "$(echo "$v $u" | awk '{ print $1 / $2 }')"
    done
    exit 0
fi
echo "# qos bench: mode $mode, $transport, 2 jobs x $ranks ranks, AllReduce of $bytes bytes," \
    "${seconds} s, windows of $period ms; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$mode" = cap ]; then
    echo "# job a: SHOAL_QOS_RATE_MAX=$cap ($cap_b bytes/s for its ranks on each of $hosts" \
        "host(s) together); job b: none"
    job a "SHOAL_QOS_RATE_MAX=$cap"
    job b
    target_a=$((cap_b * hosts)) target_b=0
else
    ra=$(awk -v c="$capacity_b" -v a="$wa" -v b="$wb" 'BEGIN { printf "%.0f", c * a / (a + b) }')
    rb=$(awk -v c="$capacity_b" -v a="$wa" -v b="$wb" 'BEGIN { printf "%.0f", c * b / (a + b) }')
    echo "# agent: capacity $capacity_b bytes/s, weights $wa:$wb -> rates a $ra, b $rb" \
        "(rates pages in $tmp)"
    "$load" -w "$tmp/a.rate" -r "$ra" -s $((${seconds%.*} + 30)) &
    pids="$pids $!"
    "$load" -w "$tmp/b.rate" -r "$rb" -s $((${seconds%.*} + 30)) &
    pids="$pids $!"
    sleep 0.3
    job a "SHOAL_QOS_RATES=$tmp/%t.rate"
    job b "SHOAL_QOS_RATES=$tmp/%t.rate"
    target_a=$ra target_b=$rb
fi
status=ok
# Wait for the two jobs (the last two pids started with job()); agents are killed at exit.
set -- $pids
while [ $# -gt 2 ]; do shift; done
for p in "$@"; do
    wait "$p" || status=failed
done
for t in a b; do
    if ! grep -q "done iters=.* status=SHOAL_OK" "$tmp/$t"; then
        status=failed
        echo "# job $t did not finish cleanly:"
        sed 's/^/#   /' "$tmp/$t.err" | tail -n 5
    fi
done

cat "$tmp/a" "$tmp/b" | awk -v ranks="$((ranks * hosts))" -v period="$period" -v mode="$mode" \
    -v ta="$target_a" -v tb="$target_b" -v wa="$wa" -v wb="$wb" -v status="$status" '
$1 == "qos" && $4 ~ /^end=/ { split($2, j, "="); split($6, p, "="); last_paced[j[2]] += p[2] }
$1 == "qos" && $4 ~ /^t=/ {
    split($2, j, "="); split($4, t, "="); split($5, s, "="); split($6, p, "=");
    sum[j[2], t[2]] += s[2]; n[j[2], t[2]]++; times[t[2]] = 1;
}
END {
    nt = 0
    for (x in times) tl[++nt] = x    # strings: mawk prints large numbers as 1.8e+12
    for (i = 2; i <= nt; i++) for (k = i; k > 1 && tl[k - 1] + 0 > tl[k] + 0; k--) {
        y = tl[k]; tl[k] = tl[k - 1]; tl[k - 1] = y }
    if (mode == "cap")
        printf "# %8s %12s %12s %10s\n", "window", "a MiB/s", "b MiB/s", "a vs cap"
    else
        printf "# %8s %12s %12s %9s %9s %9s %9s %7s\n", "window", "a MiB/s", "b MiB/s",
            "a share", "b share", "a err", "b err", "Jain"
    nw = 0; maxe = 0; sume = 0; minb = -1; minj = 1
    for (i = 2; i <= nt; i++) {
        t0 = tl[i - 1]; t1 = tl[i]
        if (n["a", t0] != ranks || n["a", t1] != ranks || n["b", t0] != ranks ||
            n["b", t1] != ranks || t1 - t0 != period) continue   # both jobs running
        ra = (sum["a", t1] - sum["a", t0]) * 1000 / period
        rb = (sum["b", t1] - sum["b", t0]) * 1000 / period
        nw++
        if (mode == "cap") {
            e = 100 * (ra / ta - 1); ae = e < 0 ? -e : e
            if (ae > maxe) maxe = ae; sume += e
            if (minb < 0 || rb < minb) minb = rb
            printf "  %8d %12.2f %12.2f %+9.2f%%\n", nw, ra / 1048576, rb / 1048576, e
        } else {
            tot = ra + rb; sa = tot > 0 ? ra / tot : 0; sb = tot > 0 ? rb / tot : 0
            ea = 100 * (sa / (wa / (wa + wb)) - 1); eb = 100 * (sb / (wb / (wa + wb)) - 1)
            xa = ra / wa; xb = rb / wb
            jain = (xa + xb) ^ 2 / (2 * (xa * xa + xb * xb))
            if (jain < minj) minj = jain
            ae = ea < 0 ? -ea : ea; if (ae > maxe) maxe = ae
            ae = eb < 0 ? -eb : eb; if (ae > maxe) maxe = ae
            printf "  %8d %12.2f %12.2f %9.4f %9.4f %+8.2f%% %+8.2f%% %7.4f\n", nw,
                ra / 1048576, rb / 1048576, sa, sb, ea, eb, jain
        }
    }
    if (nw == 0) status = "no-windows"
    if (mode == "cap")
        printf "result mode=cap windows=%d max_err_pct=%.2f mean_err_pct=%.2f min_b=%.0f " \
            "paced_a=%.0f paced_b=%.0f status=%s\n", nw, maxe, nw ? sume / nw : 0, minb,
            last_paced["a"], last_paced["b"], status
    else
        printf "result mode=weights windows=%d max_share_err_pct=%.2f min_jain=%.4f " \
            "paced_a=%.0f paced_b=%.0f status=%s\n", nw, maxe, minj, last_paced["a"],
            last_paced["b"], status
}'
