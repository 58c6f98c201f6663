#!/bin/sh
# QoS with the node agent arbitrating (src/agent/agent_qos.c), the short form of
# perf/qos_bench.sh --mode agent over shared memory: shoald divides qos_capacity_shm among the
# tenants that register with it, by the weights of their credentials, and publishes the rates
# in the rates pages the jobs' pacers read. Checked: 1:3 shares; three tenants 1:1:2 where one
# leaves (the others take its part: work-conserving, and re-converge); the QoS series on
# /metrics; an agent killed with SIGKILL leaves the job at its last rate, then at full speed
# after SHOAL_QOS_RATES_TIMEOUT, never stalled; a job without tenant is paced as uid=N. Generous
# bounds (the bench has the figures).
#
# Environment: top_builddir, top_srcdir (make check).
. "$(dirname "$0")/../tap.sh"

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
bench=$srcdir/perf/qos_bench.sh

if [ ! -x "$builddir/shoalrun" ] || [ ! -x "$builddir/qos_load" ] || [ ! -x "$builddir/shoald" ]; then
    echo "1..0 # SKIP shoalrun, qos_load or shoald not built"
    exit 0
fi
unset SHOAL_CREDENTIAL SHOAL_CREDENTIAL_FILE SHOAL_DEBUG SHOAL_TENANT

field() { # field NAME RESULT_LINE
    echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
within() { # within VALUE LIMIT: VALUE <= LIMIT (floats)
    awk -v v="$1" -v l="$2" 'BEGIN { exit !(v != "" && v + 0 <= l + 0) }'
}
# On an overloaded host (tap_overloaded: more than 3 runnable tasks per CPU, helpers or other
# jobs beside make check) no tenant reaches its rate, so the agent's shares cannot show (the
# arbiter rightly gives what one leaves unused to the others; 1:3 measured 40-60% off at
# load 20-29 on 2 CPUs): then the invariant that holds whatever the load is checked instead,
# the tenants' total at most 12% above the capacity.
capped() { # capped RESULT_LINE CAPACITY_BYTES: status ok, total over the run within capacity
    [ "$(field status "$1")" = ok ] &&
        awk -v t="$(field tot_pre "$1")" -v c="$2" 'BEGIN { exit !(t != "" && t <= 1.12 * c) }'
}
shares_ok() { # shares_ok RESULT_LINE TOL CAPACITY_BYTES
    if tap_overloaded; then
        capped "$1" "$3"
    else
        [ "$(field status "$1")" = ok ] && [ "$(field windows "$1")" -ge 2 ] &&
            within "$(field max_share_err_pct "$1")" "$2"
    fi
}
# bench CHECK ARGS...: runs the bench (twice at most: a loaded machine may spoil a window);
# CHECK is a shell condition on $res; leaves the output in $out
bench() {
    check=$1
    shift
    for try in 1 2; do
        out=$(top_builddir=$builddir "$bench" --build "$builddir" --mode agent --transport shm \
            "$@" 2>&1)
        res=$(echo "$out" | grep '^result')
        eval "$check" && return 0
        echo "# try $try:"
        echo "$out" | sed 's/^/# /'
    done
    return 1
}

# 1. Two tenants 1:3 (their credentials' weights), capacity 64 MiB/s, 1 s windows, 512 KiB
# AllReduces: with 128 KiB the weight-3 tenant needs 384 calls a second, and beside other
# processes (load 5 on 2 vCPUs: make -j2 check) each call waits for its ranks' time slices, so
# it could not use its 48 MiB/s and the arbiter rightly gave the rest to the other (worst
# windows 24.8%, 53.6%, 79.7% off in 3 runs); with 512 KiB, 2.4-3.2% in 3 runs at that load.
bench 'shares_ok "$res" 25 67108864' --weights 1:3 --capacity 64m --seconds 4 --bytes 524288
echo "$out" | grep -v '^result' | sed 's/^/# /'
if shares_ok "$res" 25 67108864 && tap_overloaded; then
    tap OK "agent, 1:3: the tenants' total within the capacity ($(field tot_pre "$res") B/s; the" \
        "host too loaded to check the shares, load $(cut -d' ' -f1 /proc/loadavg))"
elif shares_ok "$res" 25 67108864; then
    tap OK "agent, 1:3: each tenant within 25% of its share in every window (worst" \
        "$(field max_share_err_pct "$res")%, Jain $(field min_jain "$res"))"
else
    tap FAIL "agent, 1:3: shares off ($res)"
fi
if echo "$out" | grep -q 'metrics: shoal_qos_weight{tenant="t2",class="burstable"} 3' &&
    echo "$out" | grep -q 'metrics: shoal_qos_rate_bytes_per_second{tenant="t1"} [1-9]' &&
    echo "$out" | grep -q 'metrics: shoal_qos_paced_seconds_total{tenant="t1"} [0-9.]*[1-9]'; then
    tap OK "/metrics: the tenants' class, weight, rate and time held back"
else
    tap FAIL "/metrics lacks the QoS series"
fi

# 2. Three tenants 1:1:2, t3 leaves after 2 s: t1 and t2 take its part (work-conserving).
leave_ok() { # leave_ok RESULT_LINE: re-converged within 1 s, shares within 15%
    if tap_overloaded; then
        capped "$1" 67108864
    else
        [ "$(field status "$1")" = ok ] && [ "$(field events "$1")" = 1 ] &&
            within "$(field worst_conv_ms "$1")" 1000 &&
            within "$(field max_share_err_pct "$1")" 15
    fi
}
conserving() { # conserving RESULT_LINE: the others took the part of the one that left
    tap_overloaded ||
        awk -v a="$(field tot_pre "$1")" -v b="$(field tot_post "$1")" \
            'BEGIN { exit !(a > 0 && b >= 0.8 * a) }'
}
bench 'leave_ok "$res" && conserving "$res"' \
    --weights 1:1:2 --capacity 64m --seconds 5 --period 250 --leave 3:2 --tol 15
echo "$out" | grep -v '^result' | sed 's/^/# /'
if leave_ok "$res" && tap_overloaded; then
    tap OK "agent, 1:1:2, one leaves: the tenants' total within the capacity" \
        "($(field tot_pre "$res") B/s; the host too loaded to check the shares)"
elif leave_ok "$res"; then
    tap OK "agent, 1:1:2, one leaves: shares within 15% (worst $(field max_share_err_pct "$res")%)," \
        "again $(field conv_ms "$res") ms after it left"
else
    tap FAIL "agent, 1:1:2, one leaves: no re-convergence ($res)"
fi
if conserving "$res" && tap_overloaded; then
    tap OK "work-conserving: not checked, the host too loaded for the tenants to reach" \
        "their rates (load $(cut -d' ' -f1 /proc/loadavg))"
elif conserving "$res"; then
    tap OK "work-conserving: the remaining tenants send $(field tot_post "$res") B/s after," \
        "$(field tot_pre "$res") B/s before"
else
    tap FAIL "not work-conserving: $(field tot_pre "$res") B/s before, $(field tot_post "$res") after"
fi

# 3. The agent dies (SIGKILL) after 1 s: the job keeps its rate (its first window at most 30%
# above the 32 MiB/s it was given), then runs free after the 1 s timeout (its last window far
# above).
bench '[ "$(field status "$res")" = ok ] && within "$(field first "$res")" 43620761 &&
    awk -v l="$(field last "$res")" "BEGIN { exit !(l > 2 * 33554432) }"' \
    --weights 1 --capacity 32m --seconds 4 --kill-agent 1 --job-env SHOAL_QOS_RATES_TIMEOUT=1s
echo "$out" | grep -v '^result' | sed 's/^/# /'
if [ "$(field status "$res")" = ok ] && within "$(field first "$res")" 43620761 &&
    awk -v l="$(field last "$res")" 'BEGIN { exit !(l > 2 * 33554432) }'; then
    tap OK "agent killed: the job ended cleanly, paced before ($(field first "$res") B/s), at" \
        "full speed after the timeout ($(field last "$res") B/s in its last window)"
else
    tap FAIL "agent killed: the job stalled or stayed paced ($res)"
fi
# 4. A tenant arrives (1:1, t2 starts 1.5 s after t1), 20 ms windows: t1's pacers already
# run at the 1:1 rate at t2's first sample, at the latest one window later (the arbiter
# divides again at t2's registration; its next run came 40-80 ms later, and 150-200 ms before
# the registration read the counters), and the throughputs are within 25% of 1:1 within
# 200 ms.
bench '[ "$(field status "$res")" = ok ] && [ "$(field events "$res")" = 1 ] &&
    within "$(field worst_rate_conv_ms "$res")" 20 && within "$(field worst_conv_ms "$res")" 200' \
    --weights 1:1 --capacity 64m --seconds 3 --period 20 --bytes 16384 --arrive 2:1.5 --tol 25
echo "$out" | grep -v '^result' | sed 's/^/# /' | awk '$2 + 0 >= 1.3 && $2 + 0 <= 1.8'
if [ "$(field status "$res")" = ok ] && within "$(field worst_rate_conv_ms "$res")" 20; then
    tap OK "agent, a tenant arrives: the incumbent's rate at 1:1 $(field rate_conv_ms "$res") ms" \
        "after the newcomer's first sample"
else
    tap FAIL "agent, a tenant arrives: the incumbent kept its rate ($res)"
fi
if [ "$(field status "$res")" = ok ] && within "$(field worst_conv_ms "$res")" 200; then
    tap OK "agent, a tenant arrives: throughputs 1:1 within 25% after $(field conv_ms "$res") ms"
else
    tap FAIL "agent, a tenant arrives: no re-convergence within 200 ms ($res)"
fi

# 5. A spot tenant's ranks run SCHED_IDLE (qos_spot_cpu=idle), so that they take no time
# slices from the guaranteed tenant's; its p99 beside them (1 round, 2000 calls a size: the
# figures are the bench's, on a quiet machine) only printed.
out=$(top_builddir=$builddir "$bench" --build "$builddir" --mode latency --transport shm \
    --capacity 16g --reps 1 --lat-iters 2000 --seconds 4 2>&1)
res=$(echo "$out" | grep '^result')
echo "$out" | sed 's/^/# /'
if [ "$(field status "$res")" = ok ] && echo "$out" | grep -q 'agent: spot cpu of pid [0-9]* (t2/qos-bench): SCHED_IDLE'; then
    tap OK "latency: the spot tenant's ranks run SCHED_IDLE; the guaranteed job's p99 ratio" \
        "$(field worst_p99_ratio "$res") at $(field worst_size "$res") B"
else
    tap FAIL "latency: the spot tenant's ranks were not made SCHED_IDLE, or a job failed ($res)"
fi
# 6. A job without tenant (allow_uncredentialed) is arbitrated under the name it is billed
# under, uid=N: its pacer reads the rates page uid=N.rate that the agent writes for it, and runs
# at the agent's rate (it read default.rate, which the agent no longer wrote, and ran unpaced;
# "default" could also be a real tenant's page).
T=$(mktemp -d)
cat >"$T/shoald.conf" <<EOC
listen=$T/sock
http=127.0.0.1:0
ledger_url=none
allow_uncredentialed=yes
qos_rates_dir=$T/rates
qos_capacity_shm=16m
state_dir=$T/state
EOC
mkdir -p "$T/rates"
SHOAL_DEBUG=INFO "$builddir/shoald" -c "$T/shoald.conf" --ready-file "$T/ready" \
    >"$T/shoald.log" 2>&1 &
apid=$!
i=0
while [ ! -s "$T/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
SHOAL_JOB=anon "$builddir/shoalrun" --no-prefix --timeout 60 -n 2 -x SHOAL_JOB \
    -x SHOAL_AGENT="$T/sock" -x SHOAL_QOS_RATES="$T/rates/%t.rate" -x SHOAL_TRANSPORT=shm \
    "$builddir/qos_load" -s 2 -b 131072 -p 500 >"$T/out" 2>"$T/err"
rc=$?
uid=$(id -u)
pages=$(ls "$T/rates" | tr '\n' ' ') # before the agent's exit removes them
kill "$apid" 2>/dev/null
wait "$apid" 2>/dev/null
rate=$(grep ' end=' "$T/out" | head -n 1 | tr ' ' '\n' | sed -n 's/^rate=//p')
if [ $rc -eq 0 ] && [ "$pages" = "uid=$uid.rate " ] && [ -n "$rate" ] && [ "$rate" -gt 0 ] &&
    [ "$rate" -le $((16 * 1024 * 1024)) ]; then
    tap OK "a job without tenant is paced by the agent as uid=$uid (rates page uid=$uid.rate," \
        "a rank's rate $rate B/s of 16 MiB/s)"
else
    tap FAIL "a job without tenant was not paced as uid=$uid (exit $rc, rate '$rate'," \
        "pages: $pages)"
    sed 's/^/# /' "$T/err" "$T/shoald.log" | tail -n 20
fi
rm -rf "$T"
# 7. A long qos_period (1ms..60s) with the library's SHOAL_QOS_RATES_TIMEOUT shorter than it:
# the pages' gen still moves at least once a second (pace_page.h's heartbeat), so the job
# keeps the agent's rate. (The gen moved once a period: with qos_period=5s and a 1 s timeout
# the job took the agent for dead after 1 s of each period and ran unpaced, rate 0.)
T=$(mktemp -d)
cat >"$T/shoald.conf" <<EOC
listen=$T/sock
http=127.0.0.1:0
ledger_url=none
allow_uncredentialed=yes
qos_rates_dir=$T/rates
qos_capacity_shm=16m
qos_period=5s
state_dir=$T/state
EOC
mkdir -p "$T/rates"
SHOAL_DEBUG=INFO "$builddir/shoald" -c "$T/shoald.conf" --ready-file "$T/ready" \
    >"$T/shoald.log" 2>&1 &
apid=$!
i=0
while [ ! -s "$T/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
SHOAL_JOB=beat "$builddir/shoalrun" --no-prefix --timeout 60 -n 2 -x SHOAL_JOB \
    -x SHOAL_AGENT="$T/sock" -x SHOAL_QOS_RATES="$T/rates/%t.rate" -x SHOAL_TRANSPORT=shm \
    -x SHOAL_QOS_RATES_TIMEOUT=1s "$builddir/qos_load" -s 3 -b 131072 -p 500 >"$T/out" 2>"$T/err"
rc=$?
kill "$apid" 2>/dev/null
wait "$apid" 2>/dev/null
rate=$(grep ' end=' "$T/out" | head -n 1 | tr ' ' '\n' | sed -n 's/^rate=//p')
if [ $rc -eq 0 ] && [ -n "$rate" ] && [ "$rate" -gt 0 ] && ! grep -q 'was not updated' "$T/err"
then
    tap OK "qos_period=5s, SHOAL_QOS_RATES_TIMEOUT=1s: the pages' heartbeat keeps the job at" \
        "the agent's rate ($rate B/s at its end)"
else
    tap FAIL "qos_period=5s: the job took the agent for dead (exit $rc, rate '$rate' at its end)"
    sed 's/^/# /' "$T/err" | tail -n 10
fi
# 8. A second communicator of a tenant (another job of the same uid) registers between two runs
# of the arbiter (qos_period=5s): its tenant's rate is split between the two at once, each rank
# of the newcomer at 16 MiB/s / 2 communicators / 2 ranks. (The page kept the rate of one
# communicator until the next run, up to qos_period later: the tenant sent twice its share.)
T=$(mktemp -d)
sed -e "s|^listen=.*|listen=$T/sock|" -e "s|^qos_rates_dir=.*|qos_rates_dir=$T/rates|" \
    -e "s|^state_dir=.*|state_dir=$T/state|" >"$T/shoald.conf" <<EOC
listen=
http=127.0.0.1:0
ledger_url=none
allow_uncredentialed=yes
qos_rates_dir=
qos_capacity_shm=16m
qos_period=5s
state_dir=
EOC
mkdir -p "$T/rates"
SHOAL_DEBUG=INFO "$builddir/shoald" -c "$T/shoald.conf" --ready-file "$T/ready" \
    >"$T/shoald.log" 2>&1 &
apid=$!
i=0
while [ ! -s "$T/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
pids=
secs=4 # the first one runs on past the second one's end
for j in one two; do
    [ $j = two ] && sleep 1
    SHOAL_JOB=$j "$builddir/shoalrun" --no-prefix --timeout 60 -n 2 -x SHOAL_JOB \
        -x SHOAL_AGENT="$T/sock" -x SHOAL_QOS_RATES="$T/rates/%t.rate" -x SHOAL_TRANSPORT=shm \
        "$builddir/qos_load" -s $secs -b 131072 -p 500 >"$T/out.$j" 2>"$T/err.$j" &
    pids="$pids $!"
    secs=1
done
wait $pids
kill "$apid" 2>/dev/null
wait "$apid" 2>/dev/null
rate=$(grep ' end=' "$T/out.two" | head -n 1 | tr ' ' '\n' | sed -n 's/^rate=//p')
rate1=$(grep ' end=' "$T/out.one" | head -n 1 | tr ' ' '\n' | sed -n 's/^rate=//p')
if [ "$rate" = 4194304 ] && [ "$rate1" = 8388608 ]; then
    tap OK "a tenant's second communicator: the tenant's rate split at its registration" \
        "($rate B/s a rank), whole again for the first at the second's end"
else
    tap FAIL "a tenant's second communicator: a rank at '$rate' B/s, not 4194304 (the first" \
        "at its end '$rate1', not 8388608)"
    sed 's/^/# /' "$T/err.two" | tail -n 5
fi
rm -rf "$T"
# 9. qos_tc's script runs with the signals as a program expects them: none blocked, SIGPIPE not
# ignored. (It inherited the agent's own: SIGTERM and SIGINT blocked for its signalfd, SIGPIPE
# ignored, so an operator's kill, a timeout(1) inside the script, or a stop of the unit could
# not end it or its tc, and its pipelines saw EPIPE.) A stand-in script records them.
if [ -x "$builddir/shoal-cred" ]; then
    T=$(mktemp -d)
    "$builddir/shoal-cred" keygen -o "$T/master.key" >/dev/null 2>&1
    # awk, not sh: a shell clears its own signal mask at its start
    cat >"$T/tc.sh" <<EOS
#!$(command -v awk) -f
BEGIN { while ((getline l < "/proc/self/status") > 0) if (l ~ /^Sig(Blk|Ign)/) print l > "$T/sig"
        for (i = 1; i < ARGC; i++) print ARGV[i] > "$T/args"
        exit 3 }
EOS
    chmod 755 "$T/tc.sh"
    cat >"$T/shoald.conf" <<EOC
listen=$T/sock
http=none
ledger_url=none
master_key_file=$T/master.key
qos_rates_dir=$T/rates
qos_tc=$T/tc.sh
qos_tc_dev=shoalq0
tenant.a.dscp=10
state_dir=$T/state
EOC
    "$builddir/shoald" -c "$T/shoald.conf" --ready-file "$T/ready" >"$T/shoald.log" 2>&1 &
    apid=$!
    i=0
    while [ ! -s "$T/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill "$apid" 2>/dev/null
    wait "$apid" 2>/dev/null
    blk=$(sed -n 's/^SigBlk:[[:space:]]*//p' "$T/sig" 2>/dev/null)
    ign=$(sed -n 's/^SigIgn:[[:space:]]*//p' "$T/sig" 2>/dev/null)
    if [ -n "$blk" ] && [ "$blk" = 0000000000000000 ] && [ $((0x$ign & 0x1000)) = 0 ]; then
        tap OK "qos_tc's script runs with no signal blocked and SIGPIPE not ignored"
    else
        tap FAIL "qos_tc's script: SigBlk '$blk', SigIgn '$ign' (SIGTERM 0x4000, SIGINT 0x2," \
            "SIGPIPE 0x1000)"
        sed 's/^/# /' "$T/shoald.log" | tail -n 5
    fi
    # 10. qos_tc_link_rate in tc's units as shoal-tc.sh and tc take them, any case, and bps
    # (bytes): "1Gbit" and "125000000bps" were "not a tc rate" to the agent, tc never set up.
    for rate in 1Gbit 125000000bps; do
        rm -f "$T/ready" "$T/args"
        sed -i "s/^qos_tc_link_rate=.*//" "$T/shoald.conf"
        echo "qos_tc_link_rate=$rate" >>"$T/shoald.conf"
        "$builddir/shoald" -c "$T/shoald.conf" --ready-file "$T/ready" >"$T/shoald.log" 2>&1 &
        apid=$!
        i=0
        while [ ! -s "$T/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        kill "$apid" 2>/dev/null
        wait "$apid" 2>/dev/null
        if grep -qx "a,rate=970000000bit,dscp=10" "$T/args" 2>/dev/null; then
            tap OK "qos_tc_link_rate=$rate: the tc script runs, tenant a at 97% of 1 Gbit/s"
        else
            tap FAIL "qos_tc_link_rate=$rate: the tc script was not run as expected"
            sed 's/^/# /' "$T/shoald.log" | grep -i 'tc' | tail -n 3
        fi
    done
    # 11. The rates directory shoald makes is 0755 whatever its umask: with umask 077 it was
    # 0700, every other uid's job could not open its page and ran unpaced without a word.
    rm -f "$T/ready"
    sed -i "s|^qos_rates_dir=.*|qos_rates_dir=$T/new/rates|" "$T/shoald.conf"
    (umask 077 && exec "$builddir/shoald" -c "$T/shoald.conf" --ready-file "$T/ready" \
        >"$T/shoald.log" 2>&1) &
    apid=$!
    i=0
    while [ ! -s "$T/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    modes=$(stat -c %a "$T/new" "$T/new/rates" 2>/dev/null | tr '\n' ' ')
    kill "$apid" 2>/dev/null
    wait "$apid" 2>/dev/null
    if [ "$modes" = "755 755 " ]; then
        tap OK "umask 077: the rates directory shoald makes is 0755 (its parents too)"
    else
        tap FAIL "umask 077: the rates directory and its parent made with modes '$modes'"
    fi
    rm -rf "$T"
else
    tap OK "# SKIP shoal-cred not built"
    tap OK "# SKIP shoal-cred not built"
    tap OK "# SKIP shoal-cred not built"
    tap OK "# SKIP shoal-cred not built"
fi
tap_plan
exit $fails
