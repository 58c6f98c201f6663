#!/bin/sh
# QoS pacing (src/qos/pace.c), the short form of perf/qos_bench.sh: two tenants' jobs at once
# on this host; a rate cap (SHOAL_QOS_RATE_MAX) holds within 12% over the run (30% in each
# 1 s window) over shared memory and TCP while the other job runs free, and rates an agent
# publishes in rates pages (SHOAL_QOS_RATES) give 1:3 shares within 25% in every window.
# Generous bounds (the full measurement, with 2%, is the bench's, see its header); both jobs
# must finish and never stall.
#
# Environment: top_builddir, top_srcdir (make check).
. "$(dirname "$0")/../tap.sh"

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
bench=$srcdir/perf/qos_bench.sh

if [ ! -x "$builddir/shoalrun" ] || [ ! -x "$builddir/qos_load" ]; then
    echo "1..0 # SKIP shoalrun or qos_load not built"
    exit 0
fi

field() { # field NAME RESULT_LINE
    echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}

# The cap holds within 12% over the run and 30% in every 1 s window, retried once: a sampler
# thread that wakes late on a loaded machine moves bytes from one window into the next. When
# the machine is so loaded (make check -j2 beside other tests) that even the free job runs
# below 3x the cap, a job cannot be expected to keep up with the cap either: then only the
# ceiling is checked (the run's mean at most 12% above; an unpaced job is far above it).
# The same when the host runs more than 3 runnable tasks per CPU (load average, other jobs
# beside make check): the capped ranks sleep between their steps and then wait for a CPU
# behind the spinning ones (the free job, the others), longer than their bucket holds
# (measured at load 15-20 on 2 CPUs: -14% to -47% with the free job at 0.8-1.4 GB/s, with
# and without the pacer's fast path alike). perf/qos_bench.sh --mode cap has the figures.
overloaded() { tap_overloaded; }
cap_ok() { # cap_ok MAX_ERR MEAN_ERR MIN_B
    awk -v e="$1" -v m="$2" -v b="$3" -v c=33554432 -v o="$(overloaded && echo 1)" 'BEGIN {
        if (e == "" || m == "" || b == "") exit 1
        if (b < 3 * c || o) exit !(m <= 12)
        exit !(e <= 30 && m <= 12 && m >= -12) }'
}
cap_starved() { # cap_starved MIN_B
    awk -v b="$1" -v c=33554432 -v o="$(overloaded && echo 1)" \
        'BEGIN { exit !(b != "" && (b < 3 * c || o)) }'
}
run_cap() { # run_cap TRANSPORT
    for try in 1 2; do
        out=$(top_builddir=$builddir "$bench" --build "$builddir" --mode cap --transport "$1" \
            --seconds 4 --cap 32m --bytes 128k 2>&1)
        res=$(echo "$out" | grep '^result')
        err=$(field max_err_pct "$res") mean=$(field mean_err_pct "$res")
        [ "$(field status "$res")" = ok ] && [ "$(field windows "$res")" -ge 2 ] &&
            cap_ok "$err" "$mean" "$(field min_b "$res")" && break
        echo "# try $try:"
        echo "$out" | sed 's/^/# /'
    done
    echo "$out" | grep -v '^result' | sed 's/^/# /'
    if [ "$(field status "$res")" = ok ] && [ "$(field windows "$res")" -ge 2 ]; then
        tap OK "$1: both jobs ran to the end, $(field windows "$res") full windows"
    else
        tap FAIL "$1: a job failed or stalled ($res)"
    fi
    # --bytes 128k (the default, written as --cap is): qos_load read "-b 128k" as 128 bytes
    if echo "$out" | grep -q '^# qos bench: .*AllReduce of 131072 bytes,'; then
        tap OK "$1: --bytes 128k is an AllReduce of 131072 bytes"
    else
        tap FAIL "$1: --bytes 128k not taken as 131072 bytes"
    fi
    minb=$(field min_b "$res")
    if cap_ok "$err" "$mean" "$minb" && cap_starved "$minb"; then
        tap OK "$1: the capped job not above its cap ($mean% over the run; the machine too" \
            "loaded to check the floor: the free job ran at $minb B/s at least, load" \
            "$(cut -d' ' -f1 /proc/loadavg))"
    elif cap_ok "$err" "$mean" "$minb"; then
        tap OK "$1: the capped job within 12% of its cap over the run ($mean%), every window" \
            "within 30% (worst $err%)"
    else
        tap FAIL "$1: the capped job off its cap: $mean% over the run, worst window $err%"
    fi
    if [ "$(field paced_a "$res")" -gt 0 ] 2>/dev/null && [ "$(field paced_b "$res")" = 0 ] &&
        [ "$(field min_b "$res")" -gt 0 ] 2>/dev/null; then
        tap OK "$1: time held back counted for the capped job only; the free job never stalled"
    else
        tap FAIL "$1: paced_ns or the free job's windows wrong ($res)"
    fi
}

run_cap shm
run_cap tcp

# qos_load -b takes a size, all of it (perf/perf_args.h: "4m" is 4 MiB): "4mx" was 4 bytes
# (one float per AllReduce), strtoull stopping at the m
"$builddir/qos_load" -b 4mx -s 1 >"${TMPDIR:-/tmp}/run_qos.$$" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q 'a byte count' "${TMPDIR:-/tmp}/run_qos.$$"; then
    tap OK "qos_load -b 4mx: refused (rc 2), not run as 4 bytes"
else
    tap FAIL "qos_load -b 4mx: rc $rc: $(head -n 2 "${TMPDIR:-/tmp}/run_qos.$$")"
fi
rm -f "${TMPDIR:-/tmp}/run_qos.$$"

# Rates pages 1:3 of 32 MiB/s (8 and 24 MiB/s: rates a loaded machine still sustains), each
# 1 s window within 25% of the shares (unpaced, both jobs would get about 1:1: +100%/-33%);
# retried once. On a host with more than 3 runnable tasks per CPU (overloaded, as for the cap)
# neither job reaches its rate (load 20 on 2 CPUs: 2-3 MiB/s together), so the pacer holds
# neither back and the shares are 1:1 whatever it does (3 of 3 runs failed there): then each
# job's mean over the run is checked against its rate only (at most 12% above).
weights_ok() { # weights_ok RESULT_LINE
    [ "$(field status "$1")" = ok ] && [ "$(field windows "$1")" -ge 2 ] || return 1
    if overloaded; then
        awk -v a="$(field mean_a "$1")" -v b="$(field mean_b "$1")" -v ra=8388608 \
            -v rb=25165824 'BEGIN { exit !(a != "" && b != "" && a <= 1.12 * ra &&
                                         b <= 1.12 * rb) }'
    else
        awk -v e="$(field max_share_err_pct "$1")" 'BEGIN { exit !(e != "" && e <= 25) }'
    fi
}
for try in 1 2; do
    out=$(top_builddir=$builddir "$bench" --build "$builddir" --mode weights --transport shm \
        --seconds 4 --capacity 32m --weights 1:3 2>&1)
    res=$(echo "$out" | grep '^result')
    err=$(field max_share_err_pct "$res")
    weights_ok "$res" && break
    echo "# try $try:"
    echo "$out" | sed 's/^/# /'
done
echo "$out" | sed 's/^/# /'
if weights_ok "$res" && overloaded; then
    tap OK "rates pages 1:3: neither tenant above its rate over the run (the machine too" \
        "loaded to check the shares, load $(cut -d' ' -f1 /proc/loadavg): $res)"
elif weights_ok "$res"; then
    tap OK "rates pages 1:3: each tenant's share within 25% of its target in every window" \
        "(worst $err%)"
else
    tap FAIL "rates pages 1:3: shares off ($res)"
fi

# SHOAL_QOS_RATES_TIMEOUT shorter than the agent's heartbeat (its pages' gen moves at least
# once a second, pace_page.h) is refused at shoal_comm_init with an error that names it: with
# 0 or 100ms a job took its live agent for dead between two heartbeats, ran unpaced most of
# the time and warned "was not updated" several times a second on every rank. 1s is taken.
T=$(mktemp -d)
for v in 0 100ms 1s; do
    "$builddir/shoalrun" --no-prefix --timeout 30 -n 2 -x SHOAL_TRANSPORT=shm \
        -x SHOAL_QOS_RATES="$T/%t.rate" -x SHOAL_QOS_RATES_TIMEOUT=$v \
        "$builddir/qos_load" -s 0.3 -b 4096 >"$T/out" 2>"$T/err"
    rc=$?
    if [ $v = 1s ] && [ $rc -eq 0 ]; then
        tap OK "SHOAL_QOS_RATES_TIMEOUT=1s: the job runs"
    elif [ $v != 1s ] && [ $rc -ne 0 ] && grep -q 'SHOAL_QOS_RATES_TIMEOUT' "$T/err" &&
        ! grep -q 'was not updated' "$T/err"; then
        tap OK "SHOAL_QOS_RATES_TIMEOUT=$v: refused at init with an error that names it"
    else
        tap FAIL "SHOAL_QOS_RATES_TIMEOUT=$v: exit $rc"
        sed 's/^/# /' "$T/err" | tail -n 5
    fi
done
# A hard cap whose part of a rank is below the pacer's minimum (64 KiB/s a rank): the ranks
# are paced at the minimum, above the cap, which is said (it was silent: SHOAL_QOS_RATE_MAX=64k
# on 2 local ranks ran at 128 KiB/s with no word) and documented.
"$builddir/shoalrun" --no-prefix --timeout 30 -n 2 -x SHOAL_TRANSPORT=shm \
    -x SHOAL_QOS_RATE_MAX=64k "$builddir/qos_load" -s 0.3 -b 4096 >"$T/out" 2>"$T/err"
rc=$?
if [ $rc -eq 0 ] && grep -q "SHOAL_QOS_RATE_MAX=65536 .*below the pacer's minimum" "$T/err"
then
    tap OK "SHOAL_QOS_RATE_MAX=64k on 2 local ranks: raised to the minimum, with a warning"
else
    tap FAIL "SHOAL_QOS_RATE_MAX=64k on 2 local ranks: exit $rc, no warning"
    sed 's/^/# /' "$T/err" | tail -n 5
fi
rm -rf "$T"
tap_plan
exit $fails
