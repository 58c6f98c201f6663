#!/bin/sh
# End to end, with real jobs: shoald (private socket, a free HTTP port, an SQLite ledger, 2 s
# minutes, tenants acme and beta) and real shoal jobs under shoalrun (tests/meter/meter_rank:
# forced ring algorithms whose every case checks that shoal_comm_stats moved by exactly the
# bytes the algorithm moves), each rank holding its tenant's credential (SHOAL_CREDENTIAL_FILE,
# issued by shoal-cred) and declaring 2 GPUs (SHOAL_METER_GPUS=count:2). Checked:
#  - acme's job over shm (2 ranks) and beta's over tcp (4 ranks), at the same time, then
#    acme's over ucx (3 ranks, where UCX is usable) and beta's 8 ranks on 2 virtual hosts
#    (hostid_wrap.sh: shm inside a host, tcp across, so cross-host bytes too): the ranks'
#    own final shoal_comm_stats totals (payload bytes sent, operations) equal the agent's
#    /metrics (summed over labels), the ledger's sums (shoal-bill usage --csv, after the jobs
#    ended and a minute boundary passed) and what a real Prometheus server scraping the agent
#    answers on /api/v1/query; allocated GPU-seconds within 0.5% of the ranks' lifetimes x 2;
#  - each tenant's scrape view carries its own job names only;
#  - a job of tenant gamma (a valid credential, but the agent does not serve gamma) is
#    refused and counted; with SHOAL_AGENT_REQUIRED=1 its init fails with
#    SHOAL_ERR_PERMISSION; nothing of it is billed;
#  - crash injection: the agent is killed -9 three times at random moments of a ~16 s job and
#    restarted after a random pause: the ledger has every minute of the job once, the chain
#    verifies, the totals are exact against the ranks' own stats, GPU-seconds within 0.5%.
. "$(dirname "$0")/agent_lib.sh"
need_agent
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
SHOALRUN="$top_builddir/shoalrun"
RANK="$top_builddir/tests/meter/meter_rank"
BILL="$top_builddir/shoal-bill"
if [ ! -x "$SHOALRUN" ] || [ ! -x "$RANK" ] || [ ! -x "$BILL" ]; then
    echo "1..0 # SKIP shoalrun, meter_rank or shoal-bill not built"
    exit 0
fi
command -v sqlite3 >/dev/null 2>&1 || { echo "1..0 # SKIP no sqlite3 command"; exit 0; }
make_keys || { echo "1..0 # SKIP cannot make keys"; exit 0; }
unset SHOAL_TRANSPORT SHOAL_ALGO SHOAL_AGENT SHOAL_AGENT_REQUIRED SHOAL_METER_GPUS
mkdir "$T/db" || exit 1
L="$T/db/ledger.db"
URL="sqlite://$L"
base_conf "$T/conf" "ledger_url=$URL" "ledger_key_file=$T/ledger.key" "minute_seconds=2"
q() { timeout -s KILL 30 sqlite3 -batch "$L" "$1"; }
credfile() { # credfile TENANT JOB: a credential file (mode 600) issued with the master key
    cred "$1" "$2" >"$T/$1.$2.cred" && chmod 600 "$T/$1.$2.cred" && echo "$T/$1.$2.cred"
}

# job NAME NRANKS TENANT JOB "VAR=VALUE..." CASES...: one meter_rank job under shoalrun,
# registered with the agent; the ranks' final stats in $T/NAME.stats, lifetimes in
# $T/NAME.life, output in $T/NAME.out and .err; status in $T/NAME.rc
job() {
    _name=$1; _n=$2; _t=$3; _j=$4; _vars=$5; shift 5
    _cf=$(credfile "$_t" "$_j") || return 1
    # shellcheck disable=SC2046 # (shoalrun makes the unique id for the credential's tenant)
    SHOAL_CREDENTIAL_FILE=$_cf timeout -s KILL 150 "$SHOALRUN" --no-prefix --timeout 120 -n "$_n" \
        -x SHOAL_TIMEOUT_MS=30000 -x "SHOAL_AGENT=$SOCK" -x "SHOAL_CREDENTIAL_FILE=$_cf" \
        -x "METER_TENANT=$_t" -x "METER_JOB=$_j" -x "METER_STATS_FILE=$T/$_name.stats" \
        -x "METER_LIFE_FILE=$T/$_name.life" -x SHOAL_METER_GPUS=count:2 \
        -x SHOAL_RING_ORDER=rank $(for v in $_vars; do printf -- '-x %s ' "$v"; done) \
        $JOB_WRAP "$RANK" "$@" >"$T/$_name.out" 2>"$T/$_name.err"
    echo $? >"$T/$_name.rc"
}
job_ok() { # job_ok NAME NRANKS: shoalrun exited 0, every case passed, NRANKS stats lines
    [ "$(cat "$T/$1.rc")" = 0 ] && grep -q '^ok ' "$T/$1.out" && ! grep -q '^not ok' "$T/$1.out" &&
        [ "$(grep -c 'c=0 ' "$T/$1.stats")" = "$2" ] && [ "$(grep -c . "$T/$1.life")" = "$2" ]
}
# From the ranks' own final shoal_comm_stats (communicator 0 of each rank):
rank_ops() { sed -n 's/.* c=0 .*ops=\([0-9,]*\) .*/\1/p' "$T/$1.stats" |
    tr ',' '\n' | awk '{ s += $1 } END { printf "%d\n", s }'; }
rank_sent() { # rank_sent NAME same|other
    sed -n 's/.* c=0 .* sent=\([0-9,]*\) .*/\1/p' "$T/$1.stats" | tr ',' '\n' |
        awk -v w="$2" '{ if ((NR % 2 == 1) == (w == "same")) s += $1 } END { printf "%d\n", s }'
}
rank_gpu_s() { awk -F'life_ns=' '{ s += 2 * $2 / 1e9 } END { printf "%.4f\n", s }' "$T/$1.life"; }
# From the agent's /metrics ($T/scrape): a family summed over the job's series
metric_sum() { # metric_sum FAMILY TENANT JOB [EXTRA-LABEL-MATCH]
    awk -v f="$1{tenant=\"$2\",shoal_job=\"$3\"" -v x="${4:-}" \
        'index($0, f) == 1 && substr($0, length(f) + 1, 1) ~ /[,}]/ && index($0, x) > 0 {
         s += $NF } END { printf "%d\n", s }' "$T/scrape"
}
metric_gpu_s() {
    awk -v f="shoal_allocated_gpu_seconds_total{tenant=\"$1\",shoal_job=\"$2\"}" \
        'index($0, f) == 1 { print $NF }' "$T/scrape"
}
# From the ledger (shoal-bill usage --csv: tenant,job,class,minutes,gpu_seconds,gpu_hours,
# bytes_same_host,bytes_cross_host,ops,coll_seconds)
usage_col() {
    timeout -s KILL 30 "$BILL" --ledger "$URL" usage --csv --tenant "$1" --job "$2" \
        2>>"$T/bill.err" | awk -F, -v c="$3" 'NR == 2 { print $c }'
}
within() { # within GOT WANT PERMILLE
    awk -v g="$1" -v l="$2" -v p="$3" 'BEGIN { d = g - l; if (d < 0) d = -d;
        exit !(l > 0 && d <= p / 1000 * l) }'
}
minutes_of() {
    q "SELECT count(*), count(DISTINCT minute), min(minute), max(minute) FROM ledger_records
       WHERE tenant = '$1' AND job = '$2'" | tr '|' ' '
}
minutes_ok() { # minutes_ok TENANT JOB MIN: one record per minute, first to last, >= MIN
    set -- $(minutes_of "$1" "$2") "$3"
    [ "$1" = "$2" ] && [ "$1" -ge "$5" ] && [ $(( ($4 - $3) / 2 + 1 )) -eq "$1" ]
}
wait_minutes() { sleep $(( $1 * 2 )); sleep 0.5; }
rand_ms() { # rand_ms MIN MAX
    echo $(( $1 + $(od -An -N2 -tu2 /dev/urandom) % ($2 - $1 + 1) ))
}
sleep_ms() { sleep "$(awk -v m="$1" 'BEGIN { printf "%.3f", m / 1000 }')"; }

start_agent "$T/conf"
ok $? "shoald starts (SQLite ledger, 2 s minutes, HTTP on $HTTP)" "$T/agent.log"
have_prom=0
if command -v prometheus >/dev/null 2>&1; then
    start_prometheus && have_prom=1
    ok $? "a Prometheus server scrapes the agent (port $PPORT)" "$T/prom.log"
else
    skip_rest 1 "prometheus not installed (Debian: prometheus)"
fi

# ---- acme over shm (2 ranks) and beta over tcp (4 ranks), at the same time ----
# breaker=3: each rank's process notes 3 failed authentications of a stranger in its circuit
# breaker (SHOAL_TENANT_BREAKER_FAILS=3: it opens, 2 connections refused); the metering page
# carries them to the agent
CASES="allreduce allgather reduce_scatter bcast p2p breaker=3 hold=2"
BRK="SHOAL_TENANT_BREAKER_FAILS=3"
job shm 2 acme e2e-shm "SHOAL_ALGO=ring SHOAL_TRANSPORT=shm $BRK" $CASES &
J1=$!
job tcp 4 beta e2e-tcp "SHOAL_ALGO=ring SHOAL_TRANSPORT=tcp $BRK" $CASES &
J2=$!
PIDS="$PIDS $J1 $J2"
wait "$J1"
wait "$J2"
job_ok shm 2
ok $? "acme's 2-rank shm job ran, every case moved exactly the expected bytes" "$T/shm.err"
job_ok tcp 4
ok $? "beta's 4-rank tcp job ran, every case moved exactly the expected bytes" "$T/tcp.err"
# then ucx (3 ranks) and 8 ranks on 2 virtual hosts (4 + 4: shm inside, tcp across); they
# live 5 s and more, so that the end of a rank under load (its destroy, tens of ms on 2 busy
# CPUs) stays well inside the 0.5% of its GPU-seconds
JOBS="shm acme e2e-shm|tcp beta e2e-tcp"
if "$top_builddir/shoal_info" -b 2>/dev/null | grep -q 'ucx *usable: yes'; then
    job ucx 3 acme e2e-ucx "SHOAL_ALGO=ring SHOAL_TRANSPORT=ucx $BRK" allreduce allgather p2p \
        breaker=3 hold=5 &
    J3=$!
    PIDS="$PIDS $J3"
    JOBS="$JOBS|ucx acme e2e-ucx"
fi
JOB_WRAP="$top_srcdir/tests/mp/hostid_wrap.sh" job hosts 8 beta e2e-hosts \
    "SHOAL_ALGO=ring MP_PPN=4 $BRK" allreduce p2p breaker=3 hold=5
[ -n "${J3:-}" ] && wait "$J3"
if [ -n "${J3:-}" ]; then
    job_ok ucx 3
    ok $? "acme's 3-rank ucx job ran, every case moved exactly the expected bytes" "$T/ucx.err"
else
    skip_rest 1 "UCX is not usable here"
fi
job_ok hosts 8
ok $? "beta's 8 ranks on 2 virtual hosts ran, every case moved exactly the expected bytes" \
    "$T/hosts.err"
JOBS="$JOBS|hosts beta e2e-hosts"

# ---- gamma: a valid credential, a tenant the agent does not serve ----
scrape >/dev/null
ref0=$(metric 'shoal_registrations_refused_total{reason="unknown_tenant"}')
job gamma 2 gamma e2e-gamma "SHOAL_TRANSPORT=shm" barrier
is "$(cat "$T/gamma.rc")" 0 "gamma's job runs without the agent (SHOAL_AGENT_REQUIRED=0)"
grep -q "refused" "$T/gamma.err"
ok $? "and each rank warns that the agent refused it" "$T/gamma.err"
job gammareq 2 gamma e2e-gamma "SHOAL_TRANSPORT=shm SHOAL_AGENT_REQUIRED=1" \
    expect_init=SHOAL_ERR_PERMISSION
[ "$(cat "$T/gammareq.rc")" = 0 ] &&
    [ "$(grep -c 'init: SHOAL_ERR_PERMISSION' "$T/gammareq.out")" = 2 ]
ok $? "with SHOAL_AGENT_REQUIRED=1 its init fails with SHOAL_ERR_PERMISSION" "$T/gammareq.out"
scrape >/dev/null
is "$(( $(metric 'shoal_registrations_refused_total{reason="unknown_tenant"}') - ${ref0:-0} ))" 4 \
    "the agent refused and counted its 4 registrations (unknown tenant)"
is "$(metric 'shoal_tenant_refusals_total{tenant="_unknown"}')" 4 \
    "per claimed tenant too, folded into _unknown (no label from the stranger)"
! grep -q 'gamma' "$T/scrape"
ok $? "nothing of gamma is in /metrics" "$T/scrape"

# ---- after a minute boundary: the ranks, /metrics, the ledger and Prometheus agree ----
wait_minutes 2
scrape >/dev/null
IFS='|'
set -- $JOBS
unset IFS
for x in "$@"; do
    set -- $x
    ops=$(rank_ops "$1")
    same=$(rank_sent "$1" same)
    other=$(rank_sent "$1" other)
    echo "# $2/$3: the ranks' stats: $ops operations, $same bytes sent same-host, $other other"
    [ "$ops" -gt 0 ] && [ "$same" -gt 0 ] && { [ "$1" != hosts ] || [ "$other" -gt 0 ]; }
    ok $? "$2/$3: the ranks counted operations and bytes (and cross-host ones on 2 hosts)"
    is "$(metric_sum shoal_collective_ops_total "$2" "$3")" "$ops" \
        "$2/$3: /metrics operations (summed over collectives) = the ranks' ($ops)"
    is "$(metric_sum shoal_payload_bytes_total "$2" "$3" 'direction="sent"')" \
        "$((same + other))" "$2/$3: /metrics bytes sent (summed over labels) = the ranks'"
    is "$(usage_col "$2" "$3" 9)" "$ops" "$2/$3: the ledger's operations = the ranks'"
    is "$(usage_col "$2" "$3" 7)" "$same" "$2/$3: the ledger's same-host bytes = the ranks'"
    is "$(usage_col "$2" "$3" 8)" "$other" "$2/$3: the ledger's cross-host bytes = the ranks'"
    life=$(rank_gpu_s "$1")
    gs=$(usage_col "$2" "$3" 5)
    within "$gs" "$life" 5
    ok $? "$2/$3: the ledger's GPU-seconds $gs within 0.5% of 2 GPUs x the ranks' lives ($life)"
    mg=$(metric_gpu_s "$2" "$3")
    within "$mg" "$life" 5
    ok $? "$2/$3: /metrics GPU-seconds $mg within 0.5% too"
    minutes_ok "$2" "$3" 2
    ok $? "$2/$3: one ledger record per minute of its life ($(minutes_of "$2" "$3"))"
    nr=$(grep -c 'c=0 ' "$T/$1.stats")
    is "$(metric_sum shoal_join_auth_failures_total "$2" "$3")" $((3 * nr)) \
        "$2/$3: /metrics join auth failures, 3 per rank's process ($((3 * nr)))"
    is "$(metric_sum shoal_join_refused_total "$2" "$3")" $((2 * nr)) \
        "$2/$3: refused joins, 2 per process"
    is "$(metric_sum shoal_join_breakers_opened_total "$2" "$3")" "$nr" \
        "$2/$3: breakers opened, 1 per process"
    if [ $have_prom = 1 ]; then
        QO="sum(shoal_collective_ops_total{tenant=\"$2\",shoal_job=\"$3\"})"
        QB="sum(shoal_payload_bytes_total{tenant=\"$2\",shoal_job=\"$3\",direction=\"sent\"})"
        i=0
        while [ $i -lt 100 ] && [ "$(promq "$QO")" != "$ops" ]; do sleep 0.2; i=$((i + 1)); done
        is "$(promq "$QO")" "$ops" "$2/$3: Prometheus's /api/v1/query answers the operations"
        is "$(promq "$QB")" "$((same + other))" "$2/$3: and the bytes sent"
    else
        skip_rest 2 "prometheus not installed"
    fi
done
is "$(q "SELECT count(*) FROM ledger_records WHERE tenant = 'gamma'")" 0 \
    "the refused tenant is not billed"

# ---- each tenant's view carries its own jobs only ----
code=$(scrape "/metrics?tenant=acme" -H "Authorization: Bearer acme-scrape-token-0123456789")
[ "$code" = 200 ] && grep -q 'shoal_job="e2e-shm"' "$T/scrape" &&
    ! grep -q 'e2e-tcp\|e2e-hosts\|tenant="beta"\|gamma' "$T/scrape"
ok $? "acme's view has e2e-shm and no job name of another tenant" "$T/scrape"
code=$(scrape "/metrics?tenant=beta" -H "Authorization: Bearer beta-scrape-token-0123456789")
[ "$code" = 200 ] && grep -q 'shoal_job="e2e-tcp"' "$T/scrape" &&
    ! grep -q 'e2e-shm\|e2e-ucx\|tenant="acme"\|gamma' "$T/scrape"
ok $? "beta's view has e2e-tcp and no job name of another tenant" "$T/scrape"
if [ $have_prom = 1 ]; then
    kill "$PROM_PID" 2>/dev/null
    wait "$PROM_PID" 2>/dev/null
fi

# ---- crash injection: kill -9 the agent three times during a job, restart it ----
job crash 2 acme e2e-crash "SHOAL_ALGO=ring SHOAL_TRANSPORT=shm" allreduce hold=16 &
J3=$!
PIDS="$PIDS $J3"
kills=""
for k in 1 2 3; do
    up=$(rand_ms 1000 2500)
    down=$(rand_ms 200 2600)
    sleep_ms "$up"
    stop_agent KILL
    sleep_ms "$down"
    start_agent "$T/conf" || break
    kills="$kills ${up}ms+${down}ms"
done
echo "# kills (up, then down):$kills"
alive
ok $? "the agent survived three kill -9 and restarts" "$T/agent.log"
wait "$J3"
job_ok crash 2
ok $? "the job ran through the crashes, every case exact" "$T/crash.err"
wait_minutes 2
ops=$(rank_ops crash)
same=$(rank_sent crash same)
is "$(usage_col acme e2e-crash 9)" "$ops" \
    "across the crashes the ledger's operations are exact ($ops)"
is "$(usage_col acme e2e-crash 7)" "$same" "and its bytes ($same)"
life=$(rank_gpu_s crash)
gs=$(usage_col acme e2e-crash 5)
within "$gs" "$life" 5
ok $? "GPU-seconds $gs within 0.5% of 2 GPUs x the ranks' lives ($life)"
lmin=$(awk -F'life_ns=' '{ if ($2 > m) m = $2 } END { printf "%d", m / 2e9 }' "$T/crash.life")
minutes_ok acme e2e-crash "$lmin"
r=$?
q "SELECT minute, gpu_seconds, ops FROM ledger_records WHERE job = 'e2e-crash'" >"$T/minutes"
ok $r "every minute of the job's life (${lmin}x2 s) is in the ledger, once" "$T/minutes"
# A minute may hold more only where the agent said that a rank's earlier time was folded into
# it (a rank that registered again after the job's next minutes were billed without it), and
# by no more than the seconds it named (src/agent/agent_minute.c, shoald_minute_fold).
q "SELECT minute, gpu_seconds FROM ledger_records WHERE job = 'e2e-crash' AND gpu_seconds > 8.001" \
    >"$T/over"
agent_folds acme/e2e-crash >"$T/folds"
awk -F'|' -v folds="$T/folds" '
    BEGIN { while ((getline l < folds) > 0) { split(l, a, " "); n++; fm[n] = a[1]; fs[n] = a[2] } }
    { ok = 0; for (i = 1; i <= n; i++) if (fm[i] == $1 && $2 - fs[i] <= 8.001) ok = 1
      if (!ok) { print "minute " $1 ": " $2 " GPU-seconds, no fold explains it"; bad = 1 } }
    END { exit bad }' "$T/over" >"$T/over.why"
r=$?
[ -s "$T/over" ] && echo "# minutes above 8 GPU-seconds (minute|seconds): $(tr '\n' ' ' <"$T/over"); the agent's folds (minute seconds): $(tr '\n' ' ' <"$T/folds")"
ok $r "no minute holds more than 2 ranks x 2 GPUs x 2 s but by a fold the agent reported" "$T/over.why"
is "$(q "SELECT count(*) - count(DISTINCT tenant || '/' || job || '/' || minute) FROM
         ledger_records")" 0 "no (tenant, job, minute) twice in the ledger"
stop_agent
is "$agent_rc" 0 "the agent stops cleanly"
timeout -s KILL 30 "$BILL" --ledger "$URL" --key-file "$T/ledger.key" verify >"$T/verify.out" 2>&1
ok $? "shoal-bill verify: the HMAC chain is intact" "$T/verify.out"
is "$(q "SELECT count(*) FROM ledger_cursors")" 0 "every page was billed to its end"
done_testing
