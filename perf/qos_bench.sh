#!/bin/sh
# QoS bench (issue 12), first version: two tenants' jobs (two shoalrun invocations at once,
# SHOAL_TENANT a and b) running AllReduce loops (qos_load) over shared memory or TCP on this
# host; every rank samples shoal_comm_stats at each whole second of the wall clock, and this
# script sums each job's payload bytes sent per window.
#
#   --mode cap      job a capped with SHOAL_QOS_RATE_MAX=CAP, job b free: a's rate per window
#                   against the cap (error %), b's rate, both jobs' time held back by pacing.
#                   --alone: job a only (the pacer's own accuracy, no CPU taken by job b);
#                   --job-env VAR=VALUE (repeatable) goes to the jobs' environment.
#   --mode weights  this script stands in for the node agent: it divides CAPACITY among a and
#                   b by weight (weights W = wa:wb, the two always busy, so the weighted
#                   max-min shares are proportional) and publishes the rates in their rates
#                   pages (SHOAL_QOS_RATES=DIR/%t.rate, beaten every 200 ms); prints each
#                   tenant's share per window against its target, and Jain's index of the
#                   weight-normalised rates.
#   --mode overhead allreduce_perf (one job, RANKS ranks) at 8 B and 64 MiB, REPS alternated
#                   runs with SHOAL_QOS_RATE_MAX unset (no pacer: one branch per send) and
#                   set very high (1000g: the pacer's clock read and arithmetic on every send,
#                   never a wait); medians and the ratio set/unset, and the best runs (on
#                   a loaded machine the best run is the closest to the cost itself). Then
#                   the same comparison in one process (perf/meter_bench.c -d qos -T: one
#                   communicator paced at 1000g, its pacer detached for every other batch,
#                   as no SHOAL_QOS_RATE_MAX leaves it): medians of both, the median
#                   per-pair difference and its ratio (the least noisy figure; separate runs
#                   differ by more than the cost at 8 B, and so do two communicators, one
#                   paced and one not, by where their shared areas lie).
#
# usage: perf/qos_bench.sh [--mode cap|weights|overhead] [--reps K] [--transport shm|tcp] [--ranks N]
#            [--seconds S] [--bytes B] [--cap RATE] [--capacity RATE] [--weights wa:wb]
#            [--period MS] [--build DIR] [--tc-script PATH]
# --transport netns: two "hosts" (network namespaces, tests/netns/netns_lib.sh, needs root)
# joined by links shaped to --link (default 1gbit) with htb, RANKS ranks per host per job, tcp
# between them (the same jobs, each launched by netns_job instead of shoalrun). --tc-script:
# another shoal-tc.sh (e.g. an older one, to compare its htb parameters).
# RATE in bytes/s with k m g suffixes (powers of 1024, as SHOAL_QOS_RATE_MAX takes them); B,
# an AllReduce's bytes, with them too.
# Last lines (for tests/qos/run_qos.sh):
#   result mode=cap windows=N max_err_pct=E mean_err_pct=M min_b=B paced_a=P paced_b=Q status=ok
#   result mode=weights windows=N max_share_err_pct=E min_jain=J paced_a=P paced_b=Q
#          mean_a=A mean_b=B status=ok    (A, B: each job's mean over the windows, bytes/s)

here=$(cd "$(dirname "$0")" && pwd)
build=${top_builddir:-$here/../build}
mode=cap transport=shm ranks=2 seconds=6 bytes= cap=64m capacity=128m weights=1:1
period=1000 reps= link=1gbit qperiod=100ms arrive= leave= tol=5 png= lat_n=20000 skip=1000
kill_agent= agent_x_add= spot_cpu=idle job_env_add= cap_alone= tc_script=
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
    --qperiod) qperiod=$2; shift 2 ;;
    --arrive) arrive=$2; shift 2 ;;
    --leave) leave=$2; shift 2 ;;
    --tol) tol=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --png) png=$2; shift 2 ;;
    --lat-iters) lat_n=$2; shift 2 ;;
    --kill-agent) kill_agent=$2; shift 2 ;;
    --job-env) agent_x_add="$agent_x_add -x $2"; job_env_add="$job_env_add $2"; shift 2 ;;
    --alone) cap_alone=1; shift ;;
    --spot-cpu) spot_cpu=$2; shift 2 ;;
    --tc-script) tc_script=$2; shift 2 ;;
    *) sed -n '/^# usage/,/^# RATE/p' "$0" >&2; exit 2 ;;
    esac
done
[ -n "$reps" ] || reps=$([ "$mode" = latency ] && echo 3 || echo 5)
# --bytes: 128 KiB, but 4 MiB for the weighted split through htb (agent, netns): a tenant
# whose AllReduces are small cannot keep its class backlogged (a few hundred KiB in flight,
# its ranks waiting on each other between steps), the link is then not the bottleneck and
# htb gives each tenant what it sends (1:3 at 200 Mbit/s with 128 KiB: the link 54% used, the
# split 1:1.1; with 4 MiB: 92-101% used, each second within 6% of 1:3)
[ -n "$bytes" ] || bytes=$([ "$mode" = agent ] && [ "$transport" = netns ] && echo 4194304 ||
    echo 131072)
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
# --bytes takes the suffixes of --cap too: "--bytes 4m" went to qos_load as "-b 4m", which read
# it as 4 bytes (one float per AllReduce: nothing paced, and the header said "4m bytes")
bytes=$(bytes_of "$bytes")
[ "$bytes" -ge 4 ] 2>/dev/null || { echo "qos_bench.sh: --bytes must be at least 4" >&2; exit 2; }
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
    # agent and latency: shoal-tc.sh shapes the links (and divides them), not netns_setup
    case $mode in agent|latency) nslink= ;; *) nslink=$link ;; esac
    netns_setup 2 "$nslink" 2>"$tmp/setup.err" || {
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
    minof() { sort -g | head -n 1; }
    echo "# median and best (min) of the runs: on a loaded machine the best is the cost itself"
    printf '# %8s %14s %14s %8s %12s %12s %8s\n' size "unset (us)" "1000g (us)" ratio \
        "unset min" "1000g min" "ratio"
    for spec in "8 2000 100000" "64M 2 10"; do
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
        um=$(minof <"$tmp/u")
        vm=$(minof <"$tmp/s")
        printf '  %8s %14s %14s %8.3f %12s %12s %8.3f\n' "$1" "$u" "$v" \
            "$(echo "$v $u" | awk '{ print $1 / $2 }')" "$um" "$vm" \
            "$(echo "$vm $um" | awk '{ print $1 / $2 }')"
    done
    echo "# in one process: meter_bench -d qos -T (one communicator paced at 1000g, its pacer" \
        "detached for every other batch; ratio_diff = (unpaced + median per-pair difference)" \
        "/ unpaced)"
    printf '# %8s %14s %14s %12s %10s\n' size "none (ns)" "1000g (ns)" "diff (ns)" ratio_diff
    for spec in "8 2000 101" "64M 2 11"; do
        # shellcheck disable=SC2086
        set -- $spec
        "$shoalrun" --no-prefix --timeout 600 -n "$ranks" -x SHOAL_AGENT=none \
            -x SHOAL_TRANSPORT="$transport" "$build/meter_bench" -d qos -T -b "$1" -n "$2" \
            -k "$3" -w "$2" >"$tmp/mb" 2>"$tmp/mb.err" ||
            { echo "qos_bench.sh: meter_bench -d qos -T failed:" >&2; cat "$tmp/mb.err" >&2; exit 1; }
        mk() { awk -v k="$1" '$1 == k { print $2 }' "$tmp/mb"; }
        printf '  %8s %14s %14s %12s %10s\n' "$1" "$(mk off_median_ns)" "$(mk on_median_ns)" \
            "$(mk diff_median_ns)" "$(mk ratio_diff)"
    done
    exit 0
fi
# ---- modes with the node agent (agent, latency, capacity) ------------------------------------
# agent: N tenants (one per weight of --weights, named t1..tN), each one job of RANKS ranks per
# host. shm: shoald arbitrates (qos_capacity_shm = --capacity, qos_period = --qperiod), the
# jobs register with it and read their rates pages. netns: the kernel divides the link:
# shoal-tc.sh puts an htb tree on each host's link (--link, classes by weight, DSCP classifier)
# and each tenant's packets carry its own DSCP (SHOAL_QOS_DSCP); no pacing.
# --arrive I:S  tenant I starts S seconds after the others; --leave I:S  tenant I stops after
# S seconds. Per window: each tenant's MiB/s, its share of what the active tenants sent
# against its weight's share, Jain's index of rate/weight; after each arrival and leave, the
# time until the first window with every share within --tol % (re-convergence); a PNG of
# each tenant's throughput over time (--png FILE, gnuplot). netns also: the link's own split
# per window from the htb classes' byte counters (both hosts' egress, sampled every --period
# ms): "# tc window" lines with each tenant's share error, Jain's index and the link's use, and
# result_tc (windows, max and mean share error, Jain; sat_*: only the windows in which the link
# was at least 90% used, the ones where htb, not the jobs, decides the split). The jobs' own
# counters (the result line) count what they handed to their sockets, which buffers of several
# MB decouple from the wire within a second.
# latency: tenant "g" (guaranteed, weight 8) runs qos_load -L (8 B..32 KiB AllReduce, p99)
# alone, then again while tenant "s" (spot, weight 1) saturates with --bytes AllReduces; the
# ratio of the p99s per size. shm: under the agent; netns: under the htb tree. --reps K
# rounds (default 3) of alone then beside spot, --lat-iters calls a size (default 20000);
# the medians over the rounds. --spot-cpu idle|nice|none: the agent's qos_spot_cpu (default
# idle). --capacity above what the guaranteed job sends alone (e.g. 16g), so that its own
# pacing is not what is measured.
# Re-convergence at a finer resolution than 1 s: --period 20 --bytes 16384 (20 ms windows,
# 16 KiB calls so that a window holds tens of them); conv_ms is then a multiple of 20 ms
# (one window: converged in the first window after the event). rate_conv_ms (shm) is the
# time until the pacers' own rates (pace_rate of shoal_comm_stats) are the new shares.
# capacity: one tenant alone, unpaced: what the transport carries (the capacity to configure).
agent_tenants=
agent_setup() { # the agent (shm) or the htb trees (netns); sets agent_env
    agent_env=
    if [ "$transport" = netns ]; then
        sum_w=$(echo "$weights" | tr ':' '\n' | awk '{ s += $1 } END { print s }')
        link_bits=$(echo "$link" | awk '{ v = tolower($1); m = 1;
            if (v ~ /gbit$/) { m = 1e9; sub(/gbit$/, "", v) } else if (v ~ /mbit$/) { m = 1e6;
            sub(/mbit$/, "", v) } printf "%.0f\n", v * m }')
        specs= i=0
        for w in $(echo "$weights" | tr ':' ' '); do
            i=$((i + 1))
            specs="$specs t$i,rate=$(awk -v l="$link_bits" -v w="$w" -v s="$sum_w" \
                'BEGIN { printf "%.0f", l * 0.97 * w / s }')bit,dscp=$((2 + 8 * i))"
        done
        for h in $netns_hosts; do
            # shellcheck disable=SC2086
            "${tc_script:-$here/../scripts/shoal-tc.sh}" -n "$h" setup "$netns_ifname" "$link" $specs \
                >>"$tmp/tc.log" 2>&1 || { echo "qos_bench.sh: shoal-tc.sh failed:" \
                "$(tail -n 1 "$tmp/tc.log")" >&2; exit 2; }
        done
        echo "# tc: htb on each host's $netns_ifname at $link:$specs"
        return
    fi
    shoald=$build/shoald
    [ -x "$shoald" ] && [ -x "$build/shoal-cred" ] || {
        echo "qos_bench.sh: shoald not built (libmicrohttpd)" >&2; exit 2; }
    "$build/shoal-cred" keygen -o "$tmp/master.key" >/dev/null 2>&1 || exit 2
    cat >"$tmp/shoald.conf" <<EOC
listen=$tmp/shoald.sock
http=127.0.0.1:0
ledger_url=none
master_key_file=$tmp/master.key
qos_rates_dir=$tmp/rates
qos_capacity_shm=$capacity
qos_period=$qperiod
qos_spot_cpu=$spot_cpu
state_dir=$tmp/state
EOC
    for t in $agent_tenants; do echo "tenant.$t.class=reserved" >>"$tmp/shoald.conf"; done
    SHOAL_DEBUG=${QOS_AGENT_DEBUG:-INFO} "$shoald" -c "$tmp/shoald.conf" \
        --ready-file "$tmp/ready" >"$tmp/shoald.log" 2>&1 &
    agent_pid=$!
    pids="$pids $agent_pid"
    i=0
    while [ ! -s "$tmp/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ -s "$tmp/ready" ] || { echo "qos_bench.sh: shoald did not start:" \
        "$(tail -n 2 "$tmp/shoald.log")" >&2; exit 2; }
    agent_http=$(sed -n 's/^http=//p' "$tmp/ready")
    echo "# agent: shoald (pid $agent_pid), capacity $capacity same host, period $qperiod," \
        "metrics http://$agent_http/metrics"
}
agent_cred() { # agent_cred TENANT CLASS WEIGHT: its credential file
    "$build/shoal-cred" issue -k "$tmp/master.key" --tenant "$1" --job qos-bench \
        --class "$2" --weight "$3" >"$tmp/$1.cred" 2>/dev/null || exit 2
    chmod 600 "$tmp/$1.cred"
}
# ajob TENANT INDEX SECONDS [qos_load args...]: one tenant's job in the background
ajob() {
    t=$1 idx=$2 secs=$3
    shift 3
    if [ "$transport" = netns ]; then
        mkdir -p "$tmp/ns.$t"
        (
            NETNS_TMP=$tmp/ns.$t
            NETNS_ENV="SHOAL_TENANT=$t SHOAL_JOB=qos-bench SHOAL_AGENT=none SHOAL_TRANSPORT=tcp
                SHOAL_QOS_CLASS=burstable SHOAL_QOS_DSCP=burstable=$((2 + 8 * idx))$job_env_add"
            export SHOAL_TENANT="$t" SHOAL_JOB=qos-bench # mkuid makes the id for the tenant
            netns_job "$tmp/ns.$t/r" "$ranks" block $((${secs%.*} + 60)) "$load" "$@"
            rc=$?
            cat "$tmp/ns.$t"/r.*.out >"$tmp/$t"
            cat "$tmp/ns.$t"/r.*.err >"$tmp/$t.err"
            exit $rc
        ) &
        pids="$pids $!"
        jpids="$jpids $!"
        return
    fi
    # shellcheck disable=SC2086
    SHOAL_TENANT=$t SHOAL_JOB=qos-bench SHOAL_CREDENTIAL_FILE=$tmp/$t.cred \
        "$shoalrun" --no-prefix --timeout $((${secs%.*} + 60)) -n "$ranks" \
        -x SHOAL_TENANT -x SHOAL_JOB -x SHOAL_CREDENTIAL_FILE -x SHOAL_AGENT="$tmp/shoald.sock" \
        -x SHOAL_TRANSPORT="$transport" -x SHOAL_QOS_RATES="$tmp/rates/%t.rate" \
        $agent_x "$load" "$@" >"$tmp/$t" 2>"$tmp/$t.err" &
    pids="$pids $!"
    jpids="$jpids $!"
}
agent_wait() { # waits for the jobs; status=failed when one did not end cleanly
    for p in $jpids; do wait "$p" || status=failed; done
    jpids=
}

if [ "$mode" = agent ] || [ "$mode" = latency ] || [ "$mode" = capacity ]; then
    status=ok jpids= agent_x=$agent_x_add scraper=
    if [ "$mode" = latency ]; then weights=8:1; fi
    if [ "$mode" = capacity ]; then weights=1; fi
    i=0
    for w in $(echo "$weights" | tr ':' ' '); do i=$((i + 1)); agent_tenants="$agent_tenants t$i"; done
    ntenants=$i
    echo "# qos bench: mode $mode, $transport, $ntenants tenant(s) x $ranks ranks x $hosts" \
        "host(s), weights $weights, AllReduce of $bytes bytes, ${seconds} s, windows of" \
        "$period ms; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
    if [ "$mode" = capacity ]; then
        transport_=$transport
        SHOAL_TENANT=t1 SHOAL_JOB=qos-bench "$shoalrun" --no-prefix --timeout $((${seconds%.*} + 60)) \
            -n "$ranks" -x SHOAL_AGENT=none -x SHOAL_TRANSPORT="$transport_" -x SHOAL_TENANT \
            -x SHOAL_JOB "$load" -s "$seconds" -b "$bytes" -p "$period" >"$tmp/t1" 2>"$tmp/t1.err"
        awk -v ranks="$ranks" '$1 == "qos" && $4 ~ /^t=/ { split($4, t, "="); split($5, s, "=");
            sum[t[2]] += s[2]; n[t[2]]++ } END { m = 0; k = 0; prev = ""
            for (x in sum) tl[++k] = x
            for (i = 2; i <= k; i++) for (j = i; j > 1 && tl[j - 1] + 0 > tl[j] + 0; j--) {
                y = tl[j]; tl[j] = tl[j - 1]; tl[j - 1] = y }
            for (i = 2; i <= k; i++) if (n[tl[i]] == ranks && n[tl[i - 1]] == ranks) {
                r = (sum[tl[i]] - sum[tl[i - 1]]) * 1000 / (tl[i] - tl[i - 1]); c++; tot += r
                if (r > m) m = r }
            printf "result mode=capacity windows=%d mean_bps=%.0f max_bps=%.0f\n", c,
                c ? tot / c : 0, m }' "$tmp/t1"
        exit 0
    fi
    agent_setup
    if [ "$mode" = latency ]; then
        if [ "$transport" != netns ]; then
            agent_cred t1 guaranteed 8
            agent_cred t2 spot 1
        fi
        echo "# t1: guaranteed, weight 8, qos_load -L $lat_n (alone, then with t2 saturating);" \
            "$reps rounds, medians of each size's p50 and p99 over the rounds"
        : >"$tmp/alone"
        : >"$tmp/loaded"
        for round in $(seq "$reps"); do
            ajob t1 1 60 -L "$lat_n"
            agent_wait
            grep '^lat' "$tmp/t1" | sed "s/^/round=$round /" >>"$tmp/alone"
            ajob t2 2 $((${seconds%.*} + 60)) -s $((${seconds%.*} + 60)) -b "$bytes" -p "$period"
            spot_pid=${jpids# }
            sleep 1.5
            jpids=
            ajob t1 1 60 -L "$lat_n"
            agent_wait
            grep '^lat' "$tmp/t1" | sed "s/^/round=$round /" >>"$tmp/loaded"
            # the spot job: stopped now (its deadline is far), its ranks with it
            [ "$transport" = netns ] || pkill -P "$spot_pid" 2>/dev/null
            kill "$spot_pid" 2>/dev/null
            wait "$spot_pid" 2>/dev/null
            # the spot ranks' scheduling class and nice value as the agent left them
            [ -n "${spot_sched:-}" ] || spot_sched=$(grep -h 'spot cpu' "$tmp/shoald.log" 2>/dev/null |
                tail -n 1 | sed 's/.*spot cpu/spot cpu/')
        done
        [ -n "${spot_sched:-}" ] && echo "# agent: $spot_sched"
        printf '# %8s %12s %12s %12s %12s %8s\n' size "alone p50" "alone p99" "spot p50" \
            "spot p99" "p99 x"
        awk -v status="$status" -v reps="$reps" '
            function med(a, n,   i, j, y) { for (i = 2; i <= n; i++) for (j = i; j > 1 &&
                a[j - 1] > a[j]; j--) { y = a[j]; a[j] = a[j - 1]; a[j - 1] = y }
                return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
            { f = FILENAME ~ /loaded$/ ? "l" : "a"; delete v
              for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
              s = v["size"]; if (!(s in seen)) { seen[s] = 1; order[++ns] = s }
              k = ++cnt[f, s]; p50[f, s, k] = v["p50_us"]; p99[f, s, k] = v["p99_us"] }
            END {
                for (q = 1; q <= ns; q++) {
                    s = order[q]
                    for (g = 1; g <= 2; g++) {
                        f = g == 1 ? "a" : "l"; n = cnt[f, s]
                        for (k = 1; k <= n; k++) { x[k] = p50[f, s, k]; y[k] = p99[f, s, k] }
                        m50[f] = med(x, n); m99[f] = med(y, n); if (n != reps) status = "failed"
                    }
                    r = m99["a"] > 0 ? m99["l"] / m99["a"] : 0
                    printf "  %8s %12.2f %12.2f %12.2f %12.2f %8.2f\n", s, m50["a"], m99["a"],
                        m50["l"], m99["l"], r
                    if (r > worst) { worst = r; wsize = s }
                }
                if (ns != 5) status = "failed"
                printf "result mode=latency sizes=%d rounds=%d worst_p99_ratio=%.3f " \
                    "worst_size=%s status=%s\n", ns, reps, worst, wsize, status
            }' "$tmp/alone" "$tmp/loaded"
        exit 0
    fi
    i=0
    for w in $(echo "$weights" | tr ':' ' '); do
        i=$((i + 1))
        [ "$transport" = netns ] || agent_cred "t$i" burstable "$w"
    done
    arr_i=${arrive%%:*} arr_s=${arrive##*:} lv_i=${leave%%:*} lv_s=${leave##*:}
    if [ "$transport" = netns ]; then
        # what the link carried: every --period ms (on the wall clock's whole periods, as
        # qos_load samples) the byte counters of each host's tenant classes (5:a = t1, ...),
        # counted where htb dequeues them: the split of the link itself, not of what the jobs
        # handed to their sockets (which socket buffers of several MB decouple from the wire)
        (
            while [ ! -f "$tmp/tc.stop" ]; do
                now=$(date +%s%N)
                sleep "$(awk -v n="$now" -v p="$period" 'BEGIN { ms = int(n / 1e6);
                    printf "%.3f", (p - ms % p) / 1000 }')"
                line=$(( $(date +%s%N) / 1000000 ))
                for h in $netns_hosts; do
                    line="$line $(tc -n "$h" -s class show dev "$netns_ifname" 2>/dev/null | awk '
                        $1 == "class" && $2 == "htb" { c = $3 }
                        $1 == "Sent" && c != "" { s[c] = $2; c = "" }
                        END { for (i = 10; i < 10 + '"$ntenants"'; i++) {
                            k = sprintf("5:%x", i); printf "%s%d", (i > 10 ? " " : ""), s[k] } }')"
                done
                echo "$line"
            done
        ) >"$tmp/tc.samples" 2>/dev/null &
        tc_sampler=$!
        pids="$pids $tc_sampler"
    fi
    i=0
    for w in $(echo "$weights" | tr ':' ' '); do
        i=$((i + 1))
        [ "$i" = "$arr_i" ] && continue
        s=$seconds
        [ "$i" = "$lv_i" ] && s=$lv_s
        ajob "t$i" "$i" "$s" -s "$s" -b "$bytes" -p "$period"
    done
    if [ -n "$kill_agent" ] && [ -n "${agent_pid:-}" ]; then
        # a dead agent: its pages stay, their gen stops; the jobs' pacers must not stall.
        # Timed from the first job's first sample (a loaded machine may start it late), at
        # most 30 s of waiting for it.
        (w=0
         while [ $w -lt 300 ] && ! grep -q '^qos' "$tmp/t1" 2>/dev/null; do
             sleep 0.1; w=$((w + 1))
         done
         sleep "$kill_agent"; kill -9 "$agent_pid" 2>/dev/null; echo "# agent killed (SIGKILL)" \
            "$kill_agent s after the first sample") &
    fi
    if [ -n "${agent_http:-}" ] && command -v curl >/dev/null 2>&1; then
        # the agent's QoS series half way through
        (sleep "$(awk -v s="$seconds" 'BEGIN { print s / 2 }')"
         curl -s -m 5 "http://$agent_http/metrics" >"$tmp/metrics.new" 2>/dev/null &&
             mv "$tmp/metrics.new" "$tmp/metrics") &
        scraper=$!
    fi
    if [ -n "$arrive" ]; then
        sleep "$arr_s"
        s=$(awk -v a="$seconds" -v b="$arr_s" 'BEGIN { print a - b }')
        ajob "t$arr_i" "$arr_i" "$s" -s "$s" -b "$bytes" -p "$period"
    fi
    agent_wait
    if [ -n "${tc_sampler:-}" ]; then
        touch "$tmp/tc.stop"
        wait "$tc_sampler" 2>/dev/null
    fi
    for t in $agent_tenants; do
        if ! grep -q "done iters=.* status=SHOAL_OK" "$tmp/$t"; then
            status=failed
            echo "# job $t did not finish cleanly:"
            sed 's/^/#   /' "$tmp/$t.err" | tail -n 5
        fi
    done
    # The scrape is over (curl -m 5) before its file is read: on a loaded machine it could
    # still be running when the jobs had ended, and the series were missing from the output.
    [ -n "${scraper:-}" ] && wait "$scraper" 2>/dev/null
    if [ -s "$tmp/metrics" ]; then
        grep '^shoal_qos_' "$tmp/metrics" | sed 's/^/# metrics: /'
    fi
    if [ "$transport" = netns ]; then
        # what each htb class of the first host carried (5:a = t1, 5:b = t2, ..., 5:99 other)
        # shellcheck disable=SC2086
        set -- $netns_hosts
        tc -n "$1" -s class show dev "$netns_ifname" 2>/dev/null | awk '
            $1 == "class" && $2 == "htb" { c = $3 }
            $1 == "Sent" && c != "" && c != "5:1" { print "# tc class " c " sent " $2 " bytes"; c = "" }'
    fi
    cat $(for t in $agent_tenants; do echo "$tmp/$t"; done) | awk -v ranks="$((ranks * hosts))" \
        -v period="$period" -v weights="$weights" -v status="$status" -v tol="$tol" \
        -v data="$tmp/plot.dat" -v skip="$skip" -v arr="${arrive:+t$arr_i}" \
        -v lv="${leave:+t$lv_i}" -v col="$([ "$transport" = netns ] && echo 8 || echo 5)" \
        -v capb="$([ "$transport" = netns ] || echo "$capacity_b")" '
    $1 == "qos" && $4 ~ /^t=/ {
        split($2, j, "="); split($4, t, "="); split($col, s, "=")
        sum[j[2], t[2]] += s[2]; n[j[2], t[2]]++; times[t[2]] = 1
        split($7, rt, "="); prate[j[2], t[2]] += rt[2]
        if (!(j[2] in first) || t[2] + 0 < first[j[2]] + 0) first[j[2]] = t[2]
        if (!(j[2] in last) || t[2] + 0 > last[j[2]] + 0) last[j[2]] = t[2]
    }
    END {
        nt = split(weights, w, ":")
        k = 0
        for (x in times) tl[++k] = x
        for (i = 2; i <= k; i++) for (m = i; m > 1 && tl[m - 1] + 0 > tl[m] + 0; m--) {
            y = tl[m]; tl[m] = tl[m - 1]; tl[m - 1] = y }
        hdr = sprintf("# %6s", "t (s)")
        for (i = 1; i <= nt; i++) hdr = hdr sprintf(" %9s", "t" i " MiB/s")
        for (i = 1; i <= nt; i++) hdr = hdr sprintf(" %7s", "t" i " err")
        print hdr sprintf(" %7s", "Jain")
        # events: arrivals (a tenant whose first sample is late) and leaves (early last)
        t00 = tl[1]; tend = tl[k]; nev = 0
        if (arr != "") ev[++nev] = first[arr]
        if (lv != "") ev[++nev] = last[lv]
        nw = 0; maxe = 0; minj = 1
        for (i = 2; i <= k; i++) {
            t0 = tl[i - 1]; t1 = tl[i]
            if (t1 - t0 != period) continue
            wsum = 0; tot = 0; na = 0; line = sprintf("  %6.1f", (t1 - t00) / 1000)
            for (q = 1; q <= nt; q++) {
                id = "t" q; act[q] = n[id, t0] == ranks && n[id, t1] == ranks
                r[q] = act[q] ? (sum[id, t1] - sum[id, t0]) * 1000 / period : 0
                if (act[q]) { wsum += w[q]; tot += r[q]; na++ }
                line = line sprintf(" %9.2f", r[q] / 1048576)
            }
            lastt = 0
            for (q = 1; q <= nt; q++) lastt += r[q]
            if (firstt == "") firstt = lastt
            printf "%.3f", (t1 - t00) / 1000 > data
            for (q = 1; q <= nt; q++) printf " %.3f", r[q] / 1048576 > data
            printf "\n" > data
            if (na < 2 || tot <= 0) { print line; continue }
            # the expected set: every tenant but one not yet arrived or already gone (a job
            # that starts or ends a little late or early is not an event)
            full = 1
            for (q = 1; q <= nt; q++) {
                id = "t" q
                want = !((id == arr && t1 <= first[arr]) || (id == lv && t0 >= last[lv]))
                if (want != act[q]) full = 0
            }
            s1 = 0; s2 = 0; worst = 0
            for (q = 1; q <= nt; q++) {
                if (!act[q]) { line = line sprintf(" %7s", "-"); continue }
                e = 100 * ((r[q] / tot) / (w[q] / wsum) - 1); ae = e < 0 ? -e : e
                if (ae > worst) worst = ae
                line = line sprintf(" %+6.1f%%", e)
                x = r[q] / w[q]; s1 += x; s2 += x * x
            }
            jain = s1 * s1 / (na * s2)
            print line sprintf(" %7.4f", jain)
            if (!full) continue
            win_ok[i] = worst <= tol; win_t1[i] = t1
            if (t0 - t00 >= skip && (nev == 0 || t1 <= ev[1])) { pre += tot; npre++ }
            if (nev > 0 && t0 >= ev[nev] + skip) { post += tot; npost++ }
            # steady windows: not within skip ms after the start or an event
            steady = t0 - t00 >= skip
            for (e2 = 1; e2 <= nev; e2++) if (t0 >= ev[e2] - period && t0 < ev[e2] + skip) steady = 0
            if (!steady) continue
            nw++
            if (worst > maxe) maxe = worst
            if (jain < minj) minj = jain
        }
        # The rates of the pacers (shm, under the agent): from each event, the time until every
        # tenant that is running after it has the rate of its new share (capacity by weight among
        # them) within tol %: after an arrival the others at most that much above it (they
        # made room), after a leave at least that much below (they took its part). 0: at the first
        # sample of the arriving tenant already. Independent of the noise of the windows.
        rconv = ""; worstr = 0
        for (e2 = 1; e2 <= nev && capb > 0; e2++) {
            c = -1
            for (i = 1; i <= k && c < 0; i++) {
                tt = tl[i]; if (tt + 0 < ev[e2] + 0) continue
                if (tt + 0 == ev[e2] + 0 && !(arr != "" && ev[e2] == first[arr])) continue
                wsum = 0; ok = 1; m = 0
                for (q = 1; q <= nt; q++) { id = "t" q
                    if (n[id, tt] == ranks && !(id == lv && tt >= last[lv])) wsum += w[q] }
                for (q = 1; q <= nt; q++) { id = "t" q
                    if (n[id, tt] != ranks || (id == lv && tt >= last[lv])) continue
                    m++; tgt = capb * w[q] / wsum; pr = prate[id, tt]
                    if (arr != "" && ev[e2] == first[arr] && id != arr && pr > tgt * (1 + tol / 100)) ok = 0
                    if (!(arr != "" && ev[e2] == first[arr]) && pr < tgt * (1 - tol / 100)) ok = 0 }
                if (ok && m > 0) c = tt - ev[e2]
            }
            rconv = rconv (rconv == "" ? "" : ",") c
            if (c < 0 || c > worstr) worstr = c < 0 ? 1e9 : c
        }
        conv = ""; worstc = 0
        for (e2 = 1; e2 <= nev; e2++) {
            c = -1
            for (i = 2; i <= k; i++) if ((i in win_ok) && tl[i - 1] + 0 >= ev[e2] + 0 && win_ok[i]) {
                c = win_t1[i] - ev[e2]; break }
            conv = conv (conv == "" ? "" : ",") c
            if (c < 0 || c > worstc) worstc = c < 0 ? 1e9 : c
        }
        if (nw == 0 && nt >= 2) status = "no-windows"
        printf "result mode=agent tenants=%d windows=%d max_share_err_pct=%.2f min_jain=%.4f " \
            "events=%d conv_ms=%s worst_conv_ms=%.0f rate_conv_ms=%s worst_rate_conv_ms=%.0f " \
            "tot_pre=%.0f tot_post=%.0f first=%.0f last=%.0f status=%s\n", nt, nw, maxe, minj,
            nev, conv == "" ? "none" : conv, worstc, rconv == "" ? "none" : rconv, worstr,
            npre ? pre / npre : 0, npost ? post / npost : 0, firstt, lastt, status
    }'
    if [ -s "$tmp/tc.samples" ] && [ -z "$arrive$leave" ]; then
        # the link's split per window from the htb counters (both hosts' egress summed):
        # from the first window in which every tenant's class sent, after --skip ms, to the
        # one before the last such window (in which the jobs end, each at its own moment); a
        # tenant idle in between counts against it
        awk -v nt="$ntenants" -v nh="$hosts" -v period="$period" -v weights="$weights" \
            -v skip="$skip" -v linkb="$link_bits" '
        { t[NR] = $1; for (q = 1; q <= nt; q++) { v = 0
              for (h = 0; h < nh; h++) v += $(2 + h * nt + q - 1); c[NR, q] = v } }
        END {
            split(weights, w, ":"); wsum = 0; for (q = 1; q <= nt; q++) wsum += w[q]
            first = 0; last = 0
            for (i = 2; i <= NR; i++) { all = 1
                for (q = 1; q <= nt; q++) if (c[i, q] - c[i - 1, q] <= 0) all = 0
                if (all) { if (!first) first = i; last = i } }
            nw = 0; maxe = 0; sume = 0; minj = 1; sumj = 0
            for (i = first; first && i < last; i++) {
                dt = t[i] - t[i - 1]
                if (t[i - 1] - t[first - 1] < skip || dt < 0.8 * period || dt > 1.2 * period) continue
                tot = 0; for (q = 1; q <= nt; q++) { r[q] = (c[i, q] - c[i - 1, q]) * 1000 / dt; tot += r[q] }
                if (tot <= 0) continue
                s1 = 0; s2 = 0; worst = 0; line = sprintf("# tc window %6.1f s:", (t[i] - t[first - 1]) / 1000)
                for (q = 1; q <= nt; q++) { e = 100 * ((r[q] / tot) / (w[q] / wsum) - 1); ae = e < 0 ? -e : e
                    if (ae > worst) worst = ae; x = r[q] / w[q]; s1 += x; s2 += x * x
                    line = line sprintf(" t%d %7.2f MiB/s %+6.1f%%", q, r[q] / 1048576, e) }
                j = s1 * s1 / (nt * s2)
                # the use of the link (payload and headers as htb counts them, per host): below
                # 90% the link is not the bottleneck and htb gives each what it sends
                use = 100 * tot * 8 / nh / linkb
                print line sprintf("  Jain %.4f  link %3.0f%%", j, use)
                nw++; sume += worst; sumj += j; if (worst > maxe) maxe = worst; if (j < minj) minj = j
                if (use >= 90) { ns++; if (worst > maxs) maxs = worst; if (!ns1 || j < minjs) minjs = j; ns1 = 1 }
                if (!t0) t0 = i - 1; t1 = i
            }
            sh = ""; tot = 0
            for (q = 1; q <= nt; q++) tot += c[t1, q] - c[t0, q]
            for (q = 1; q <= nt && nw; q++) sh = sh (q > 1 ? "," : "") sprintf("%.4f", (c[t1, q] - c[t0, q]) / tot)
            printf "result_tc windows=%d max_share_err_pct=%.2f mean_share_err_pct=%.2f " \
                "min_jain=%.4f mean_jain=%.4f shares=%s link_use_pct=%.1f sat_windows=%d " \
                "sat_max_share_err_pct=%.2f sat_min_jain=%.4f\n", nw, maxe,
                nw ? sume / nw : 0, minj, nw ? sumj / nw : 0, sh == "" ? "none" : sh,
                nw ? 100 * tot * 8 * 1000 / (t[t1] - t[t0]) / nh / linkb : 0, ns, maxs,
                ns ? minjs : 0
        }' "$tmp/tc.samples"
    fi
    if [ -n "$png" ] && command -v gnuplot >/dev/null 2>&1 && [ -s "$tmp/plot.dat" ]; then
        {
            echo "set terminal pngcairo size 1000,500 noenhanced"
            echo "set output '$png'"
            echo "set title 'shoal QoS: $ntenants tenants, weights $weights, $transport'"
            echo "set xlabel 'time (s)'; set ylabel 'MiB/s (payload sent)'; set key outside"
            printf "plot"
            i=0
            for w in $(echo "$weights" | tr ':' ' '); do
                i=$((i + 1))
                [ $i -gt 1 ] && printf ","
                printf " '%s' using 1:%d with steps lw 2 title 't%d (weight %s)'" \
                    "$tmp/plot.dat" $((i + 1)) "$i" "$w"
            done
            echo
        } >"$tmp/plot.gp"
        gnuplot "$tmp/plot.gp" 2>"$tmp/plot.err" && echo "# plot: $png" ||
            echo "# plot failed: $(head -n 1 "$tmp/plot.err")"
    fi
    exit 0
fi
echo "# qos bench: mode $mode, $transport, 2 jobs x $ranks ranks, AllReduce of $bytes bytes," \
    "${seconds} s, windows of $period ms; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$mode" = cap ]; then
    echo "# job a: SHOAL_QOS_RATE_MAX=$cap ($cap_b bytes/s for its ranks on each of $hosts" \
        "host(s) together); job b: none"
    # shellcheck disable=SC2086
    job a "SHOAL_QOS_RATE_MAX=$cap" $job_env_add
    # --alone: no free job beside it (the pacer's own accuracy, without CPU contention)
    [ -n "$cap_alone" ] || job b $job_env_add
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
# Wait for the jobs (the last two pids started with job(), one with --alone); agents are
# killed at exit.
set -- $pids
while [ $# -gt $([ -n "$cap_alone" ] && echo 1 || echo 2) ]; do shift; done
for p in "$@"; do
    wait "$p" || status=failed
done
for t in a $([ -n "$cap_alone" ] || echo b); do
    if ! grep -q "done iters=.* status=SHOAL_OK" "$tmp/$t"; then
        status=failed
        echo "# job $t did not finish cleanly:"
        sed 's/^/#   /' "$tmp/$t.err" | tail -n 5
    fi
done

[ -n "$cap_alone" ] && : >"$tmp/b"
cat "$tmp/a" "$tmp/b" | awk -v ranks="$((ranks * hosts))" -v period="$period" -v mode="$mode" \
    -v ta="$target_a" -v tb="$target_b" -v wa="$wa" -v wb="$wb" -v status="$status" \
    -v alone="$cap_alone" '
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
        if (n["a", t0] != ranks || n["a", t1] != ranks || (!alone && (n["b", t0] != ranks ||
            n["b", t1] != ranks)) || t1 - t0 != period) continue   # both jobs running
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
            suma += ra; sumb += rb
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
            "paced_a=%.0f paced_b=%.0f mean_a=%.0f mean_b=%.0f status=%s\n", nw, maxe, minj,
            last_paced["a"], last_paced["b"], nw ? suma / nw : 0, nw ? sumb / nw : 0, status
}'
