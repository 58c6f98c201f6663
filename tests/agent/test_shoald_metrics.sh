#!/bin/sh
# TAP test of shoald's /metrics: the series equal the counters the ranks wrote in their pages
# (sums per tenant and job, gone ranks kept), label values escaped, promtool check metrics
# passes, the tenant view carries no other tenant's jobs (bearer token per tenant), 404 and
# 405 for what is not served, a slow or garbage HTTP client stalls neither registration nor
# scrapes, nor does a local user holding connections open without requests, and a real
# Prometheus server scraping the agent answers the same totals through
# its HTTP API.
. "$(dirname "$0")/agent_lib.sh"
need_agent
make_keys || { echo "1..0 # SKIP cannot make keys"; exit 0; }

base_conf "$T/conf" "export_ranks=yes"
start_agent "$T/conf"
ok $? "the agent starts" "$T/agent.log"
grep -q "WARN.*http: /metrics serves every tenant's job names .* set provider_token_file" \
    "$T/agent.log"
ok $? "without provider_token_file it warns that the provider view is open" "$T/agent.log"

# client NAME ARGS...: a rank held for 120 s in the background (killed by the test), output
# in $T/NAME.out; waits until the agent answered it.
client() {
    name=$1; shift
    "$MC" --sock "$SOCK" --hold 120 "$@" >"$T/$name.out" 2>"$T/$name.err" &
    eval "PID_$name=$!"
    PIDS="$PIDS $!"
    i=0
    while ! grep -q '^status=' "$T/$name.out" 2>/dev/null && [ $i -lt 100 ]; do
        sleep 0.1; i=$((i + 1))
    done
    grep -q '^status=0 ' "$T/$name.out"
}
ACME=$(cred acme train)
client a0 --tenant acme --job train --cred "$ACME" --rank 0 --nranks 2 --ngpus 2 \
    --set ops:0=100 --set ops:3=7 --set sent:1:1=123456789 --set recv:1:1=123456000 \
    --set sent:0:0=4096 --set recv:0:0=8192 --set coll_ns=1500000000 --set errors=1 \
    --set cuda_ipc_sent=65536 --set cuda_ipc_recv=98304 \
    --set nccl_sent=1800042 --set nccl_recv=1800042
ok $? "rank 0 of acme/train registered" "$T/a0.out"
# rank 1's time in ticks (a page of version 2: 1e9 ticks at 0.5 ns), rank 0's in coll_ns (as a
# library of version 1 writes it): the agent converts and adds both
client a1 --tenant acme --job train --cred "$ACME" --rank 1 --nranks 2 --ngpus 2 \
    --set ops:0=100 --set ops:3=7 --set sent:1:1=1000000 --set recv:1:1=2000000 \
    --set tick_mult=2147483648 --set coll_ticks=1000000000 --set peer_failures=2 \
    --set cuda_ipc_sent=98304 --set cuda_ipc_recv=65536 \
    --set nccl_sent=1800042 --set nccl_recv=1800042
ok $? "rank 1 of acme/train registered" "$T/a1.out"
client b0 --tenant beta --job infer --cred "$(cred beta infer)" --ngpus 1 \
    --set ops:1=5 --set sent:2:1=777
ok $? "rank 0 of beta/infer registered" "$T/b0.out"
WEIRD='we"ird\job'
client w0 --tenant acme --job "$WEIRD" --cred "$(cred acme "$WEIRD")" --set ops:5=3
ok $? "a job whose name holds a quote and a backslash registered" "$T/w0.out"

client d0 --tenant acme --job dupjob --cred "$(cred acme dupjob)" --ngpus 1 --dup \
    --set ops:0=9
# the second registration comes after the first one's answer: wait for it too (10 s at most)
i=0
while ! grep -q '^dup status=' "$T/d0.out" 2>/dev/null && [ $i -lt 100 ]; do
    sleep 0.1; i=$((i + 1))
done
grep -q '^dup status=0 ' "$T/d0.out"
ok $? "the same page registered again (a reconnect) is accepted" "$T/d0.out"

code=$(scrape)
is "$code" 200 "GET /metrics answers 200"
AJ='tenant="acme",shoal_job="train"'
is "$(metric "shoal_collective_ops_total{$AJ,collective=\"allreduce\"}")" 200 \
    "allreduce calls: the sum of both ranks' pages"
is "$(metric "shoal_collective_ops_total{$AJ,collective=\"allgather\"}")" 14 "allgather calls"
PB="shoal_payload_bytes_total{$AJ"
TCPO='transport="tcp",locality="other_host"'
is "$(metric "$PB,$TCPO,direction=\"sent\"}")" 124456789 "tcp bytes sent to other hosts"
is "$(metric "$PB,$TCPO,direction=\"received\"}")" 125456000 "tcp bytes received from other hosts"
is "$(metric "$PB,transport=\"shm\",locality=\"same_host\",direction=\"received\"}")" 8192 \
    "shm bytes received"
IPC='transport="cuda_ipc",locality="same_host"'
is "$(metric "$PB,$IPC,direction=\"sent\"}"):$(metric "$PB,$IPC,direction=\"received\"}")" \
    163840:163840 "device bytes through CUDA IPC: transport cuda_ipc, same host"
! grep -q 'transport="cuda_ipc",locality="other_host"' "$T/scrape"
ok $? "no cuda_ipc series for other hosts (one host by construction)"
# the NCCL delegate's ring-equivalent bytes (2 (n - 1) S / n of an AllReduce of S = 1200028 B
# on 4 ranks = 1800042 per rank and direction)
NC='transport="nccl",locality="same_host"'
is "$(metric "$PB,$NC,direction=\"sent\"}"):$(metric "$PB,$NC,direction=\"received\"}")" \
    3600084:3600084 "the NCCL delegate's bytes: transport nccl, same host"
! grep -q 'transport="nccl",locality="other_host"' "$T/scrape"
ok $? "no nccl series for other hosts (the delegate runs on one host only)"
is "$(metric "shoal_collective_seconds_total{$AJ}")" 2.000000000 "seconds inside collectives"
is "$(metric "shoal_errors_total{$AJ}")" 1 "errors"
is "$(metric "shoal_peer_failures_total{$AJ}")" 2 "peer failures"
is "$(metric "shoal_ranks{$AJ}")" 2 "ranks alive"
DJ='tenant="acme",shoal_job="dupjob"'
dops=$(metric "shoal_collective_ops_total{$DJ,collective=\"allreduce\"}")
is "$dops:$(metric "shoal_ranks{$DJ}")" 9:1 "a page registered twice counts once"
is "$(metric "shoal_gpus_allocated{$AJ}")" 4 "GPUs allocated"
is "$(metric "shoal_rank_collective_ops_total{$AJ,rank=\"1\"}")" 107 "per-rank series on request"
BJ='tenant="beta",shoal_job="infer"'
UCXO='transport="ucx",locality="other_host",direction="sent"'
is "$(metric "shoal_payload_bytes_total{$BJ,$UCXO}")" 777 "beta's ucx bytes"
# A rank with more GPUs than the page lists by ordinal (16): 20 MIG instances in
# CUDA_VISIBLE_DEVICES, or count:20. The library counts them all (meter_page.h, ngpus); the
# agent refused such a page ("GPU count is out of range"), so the rank ran unmetered.
client m0 --tenant beta --job mig --cred "$(cred beta mig)" --ngpus 20 --set ops:0=1
ok $? "a rank declaring 20 GPUs registered" "$T/m0.out"
scrape >/dev/null
is "$(metric "shoal_gpus_allocated{tenant=\"beta\",shoal_job=\"mig\"}")" 20 \
    "it is billed for its 20 GPUs"
kill "$PID_m0" 2>/dev/null
# One process with 2 GPUs and two communicators (a world and a split): each page declares the
# process's GPUs, which were counted once per page (4 GPUs, twice the GPU-seconds)
t0=$(date +%s%N)
client c0 --tenant acme --job twocomm --cred "$(cred acme twocomm)" --ngpus 2 --set ops:0=1 \
    --set2 ops:0=1
i=0
while ! grep -q '^second status=' "$T/c0.out" 2>/dev/null && [ $i -lt 100 ]; do
    sleep 0.1; i=$((i + 1))
done
sleep 1
scrape >/dev/null
t1=$(date +%s%N)
CJ='tenant="acme",shoal_job="twocomm"'
is "$(metric "shoal_ranks{$CJ}"):$(metric "shoal_gpus_allocated{$CJ}")" 2:2 \
    "a process's two communicators: 2 ranks (communicators), its 2 GPUs once"
gs=$(metric "shoal_allocated_gpu_seconds_total{$CJ}")
awk -v g="$gs" -v l="$(( (t1 - t0) / 1000000 ))" 'BEGIN { exit !(g > 0 && g <= 2 * l / 1000) }'
ok $? "its GPU-seconds ($gs) at most 2 GPUs x the time since it started"
kill "$PID_c0" 2>/dev/null
# Per-rank series of processes with a world and a split communicator: s1 is world rank 1 of 4
# and rank 0 of 2 in its split, s0 is world rank 0. Keyed by each page's own rank, the split's
# rank 0 was added to world rank 0's series; and when the split ended (destroyed, the process
# living on), its counts left rank 1's sum: a counter that went back.
SR=$(cred acme splitranks)
client s0 --tenant acme --job splitranks --cred "$SR" --rank 0 --nranks 4 --set ops:0=3
client s1 --tenant acme --job splitranks --cred "$SR" --rank 1 --nranks 4 --set ops:0=5 \
    --set2 ops:0=7 --rank2 0 --nranks2 2 --end2 2
i=0
while ! grep -q '^second status=0' "$T/s1.out" 2>/dev/null && [ $i -lt 100 ]; do
    sleep 0.1; i=$((i + 1))
done
scrape >/dev/null
SJ='tenant="acme",shoal_job="splitranks"'
RO="shoal_rank_collective_ops_total{$SJ"
is "$(metric "$RO,rank=\"0\"}"):$(metric "$RO,rank=\"1\"}")" 3:12 \
    "per-rank series: a process under its world rank, summed over its communicators"
i=0
while ! grep -q '^second ended' "$T/s1.out" 2>/dev/null && [ $i -lt 100 ]; do
    sleep 0.1; i=$((i + 1))
done
sleep 1.5 # the agent sees the end and drops the page
scrape >/dev/null
is "$(metric "$RO,rank=\"1\"}"):$(metric "shoal_ranks{$SJ}")" 12:2 \
    "its split communicator ended: rank 1's counter keeps its counts (no reset)"
kill "$PID_s0" "$PID_s1" 2>/dev/null
WJ='tenant="acme",shoal_job="we\"ird\\job"'
is "$(metric "shoal_collective_ops_total{$WJ,collective=\"barrier\"}")" 3 \
    "label values are escaped (quote and backslash)"
grep -c '^# TYPE ' "$T/scrape" >"$T/ntype"
[ "$(grep -c '^# HELP ' "$T/scrape")" = "$(cat "$T/ntype")" ] &&
    ! grep -v '^#' "$T/scrape" | grep -q '^shoal_[a-z_]*_total{[^}]*} -'
ok $? "every family has HELP and TYPE"
if command -v promtool >/dev/null 2>&1; then
    promtool check metrics <"$T/scrape" >"$T/promtool" 2>&1
    ok $? "promtool check metrics passes" "$T/promtool"
else
    skip_rest 1 "promtool not installed (Debian: prometheus)"
fi

# A rank that exits: its counters stay in the job's totals.
kill "$PID_a1"
wait_metric "shoal_ranks{$AJ}" 1
ok $? "rank 1's exit is noticed"
is "$(metric "shoal_collective_ops_total{$AJ,collective=\"allreduce\"}")" 200 \
    "its counters stay in the job's totals"
is "$(metric "shoal_rank_failures_total{$AJ,cause=\"platform\"}")" 1 \
    "a rank that ends after peer failures counts as a platform failure"

# The tenant views.
code=$(scrape "/metrics?tenant=acme" -H "Authorization: Bearer acme-scrape-token-0123456789")
is "$code" 200 "acme's view with acme's token answers 200"
grep -q 'shoal_job="train"' "$T/scrape" && ! grep -q 'tenant="beta"' "$T/scrape" &&
    ! grep -q 'infer' "$T/scrape" && ! grep -q 'shoal_registrations' "$T/scrape"
ok $? "acme's view has acme's jobs and none of beta's, nor the agent's own series" "$T/scrape"
code=$(scrape "/metrics?tenant=beta" -H "Authorization: Bearer beta-scrape-token-0123456789")
[ "$code" = 200 ] && grep -q 'shoal_job="infer"' "$T/scrape" && ! grep -q 'train' "$T/scrape" &&
    ! grep -q 'ird' "$T/scrape"
ok $? "beta's view has beta's job and none of acme's" "$T/scrape"
is "$(scrape "/metrics?tenant=acme")" 401 "a tenant view without a token is refused (401)"
is "$(scrape "/metrics?tenant=acme" -H "Authorization: Bearer beta-scrape-token-0123456789")" \
    401 "a tenant view with another tenant's token is refused"
is "$(scrape "/metrics?tenant=ghost" -H "Authorization: Bearer x")" 401 \
    "an unknown tenant gets the same answer"
# A tenant view that names no tenant ("?tenant" without '=', or an empty name): the first
# was served the provider's view, every tenant's jobs, as if no tenant had been asked for.
is "$(scrape "/metrics?tenant"):$(scrape "/metrics?tenant=")" 400:400 \
    "a tenant view without a tenant's name is a bad request (400)"
grep -q 'names its tenant' "$T/scrape"
ok $? "its answer says what is missing" "$T/scrape"
# The scheme is case-insensitive and the token may follow more than one space (RFC 7235):
# Prometheus sends its authorization type as written ("type: bearer" gave 401 at every scrape)
is "$(scrape "/metrics?tenant=acme" -H "Authorization: bearer acme-scrape-token-0123456789"):$(
    scrape "/metrics?tenant=acme" -H "Authorization: BEARER   acme-scrape-token-0123456789")" \
    200:200 "the scheme 'bearer' in any case, and spaces before the token, are accepted"
is "$(scrape "/metrics?tenant=acme" -H "Authorization: Bearerx acme-scrape-token-0123456789")" \
    401 "but not another scheme that starts with it"
if command -v promtool >/dev/null 2>&1; then
    scrape "/metrics?tenant=acme" -H "Authorization: Bearer acme-scrape-token-0123456789" >/dev/null
    promtool check metrics <"$T/scrape" >"$T/promtool" 2>&1
    ok $? "promtool passes on the tenant view" "$T/promtool"
else
    skip_rest 1 "promtool not installed"
fi

# What is not served.
code=$(scrape /nothing)
[ "$code" = 404 ] && grep -q "serves /metrics" "$T/scrape"
ok $? "an unknown path answers 404 with a sentence"
is "$(scrape / )" 404 "so does /"
is "$(scrape /metrics -X POST -d x)" 405 "POST answers 405"

# Slow and garbage HTTP clients, while ranks register and Prometheus-like scrapes go on.
HOST=${HTTP%:*}
PORT=${HTTP##*:}
(printf 'GET /metr'; sleep 8) | timeout -s KILL 12 curl -s "telnet://$HOST:$PORT" \
    >/dev/null 2>&1 &
PIDS="$PIDS $!"
(head -c 3000 /dev/urandom; sleep 8) | timeout -s KILL 12 curl -s "telnet://$HOST:$PORT" \
    >/dev/null 2>&1 &
PIDS="$PIDS $!"
sleep 0.3
t0=$(date +%s%N)
mc --tenant acme --job quick --cred "$(cred acme quick)"
t1=$(date +%s%N)
ms=$(( (t1 - t0) / 1000000 ))
[ "$rc" = 0 ] && [ $ms -lt 1000 ]
ok $? "a slow and a garbage HTTP client do not stall registration ($ms ms)" "$T/mc.out"
is "$(scrape)" 200 "nor other scrapes"
alive
ok $? "the agent is still running"

# Every local user connects from 127.0.0.1: 32 connections held open without a request (a
# byte now and then beats the idle timeout) took all that address could have, and every
# scrape from the host was refused. Over the limit, the connection idle longest gives way.
i=0
while [ $i -lt 70 ]; do
    (printf 'G'; sleep 6) 2>/dev/null | timeout -s KILL 10 curl -s "telnet://$HOST:$PORT" \
        >/dev/null 2>&1 &
    PIDS="$PIDS $!"
    i=$((i + 1))
done
sleep 1.5
codes=""
for i in 1 2 3; do codes="$codes $(scrape)"; sleep 0.3; done
is "$codes" " 200 200 200" "70 connections held open without a request do not keep scrapes out"
alive
ok $? "the agent is still running"

# Abuse signals from the library's circuit breaker (meter_page.h: auth_failed, auth_refused,
# breaker_opened; process-wide, so every page of a process carries the same values): per
# process the largest over its pages, summed over the job's processes; kept after they end.
G=$(cred acme guarded)
timeout -s KILL 20 "$MC" --sock "$SOCK" --tenant acme --job guarded --cred "$G" --nranks 2 \
    --set auth_failed=5 --set auth_refused=2 --set breaker_opened=1 --set2 auth_failed=7 \
    --set2 auth_refused=1 --set2 breaker_opened=1 --hold 2 >"$T/g1.out" 2>&1 &
G1=$!
timeout -s KILL 20 "$MC" --sock "$SOCK" --tenant acme --job guarded --cred "$G" --rank 1 \
    --nranks 2 --set auth_failed=3 --hold 2 >"$T/g2.out" 2>&1 &
G2=$!
PIDS="$PIDS $G1 $G2"
JL='{tenant="acme",shoal_job="guarded"}'
wait_metric "shoal_join_auth_failures_total$JL" 10
ok $? "join auth failures: the largest of a process's pages (7, not 5 + 7), plus 3" "$T/scrape"
is "$(metric "shoal_join_refused_total$JL")" 2 \
    "refused joins: the largest of the process's pages (2)"
is "$(metric "shoal_join_breakers_opened_total$JL")" 1 "breakers opened: not summed over pages (1)"
wait "$G1"; wait "$G2"
grep -q '^second status=0' "$T/g1.out"
ok $? "the process's second communicator registered too" "$T/g1.out"
sleep 0.3
scrape >/dev/null
is "$(metric "shoal_join_auth_failures_total$JL")" 10 "the counts stay after the processes ended"
code=$(scrape "/metrics?tenant=acme" -H "Authorization: Bearer acme-scrape-token-0123456789")
is "$(metric "shoal_join_auth_failures_total$JL")" 10 "acme's own view carries them"
code=$(scrape "/metrics?tenant=beta" -H "Authorization: Bearer beta-scrape-token-0123456789")
! grep -q 'guarded' "$T/scrape"
ok $? "beta's view does not" "$T/scrape"

# A real Prometheus server scrapes the agent; its HTTP API answers the same totals.
HAVE_PROM=0
command -v prometheus >/dev/null 2>&1 && HAVE_PROM=1
if [ $HAVE_PROM -eq 0 ]; then
    skip_rest 4 "prometheus not installed (Debian: prometheus)"
else
    start_prometheus
    ok $? "a Prometheus server starts on loopback (port $PPORT)" "$T/prom.log"
    Q1="shoal_collective_ops_total{tenant=\"acme\",shoal_job=\"train\",collective=\"allreduce\"}"
    Q2="sum(shoal_payload_bytes_total{tenant=\"acme\",shoal_job=\"train\",direction=\"sent\"})"
    i=0
    while [ $i -lt 150 ] && [ "$(promq "$Q1")" != 200 ]; do sleep 0.2; i=$((i + 1)); done
    is "$(promq "$Q1")" 200 "Prometheus's API answers the allreduce calls of acme/train"
    is "$(promq "$Q2")" 128224809 "and the payload bytes it sent (all transports, cuda_ipc and nccl too)"
    is "$(promq 'up{job="shoald"}')" 1 "the target is up (its job label is Prometheus's own)"
    kill "$PROM_PID" 2>/dev/null
    wait "$PROM_PID" 2>/dev/null
fi
stop_agent

# The provider's view behind its own bearer token (provider_token_file): every local user
# reaches loopback, and the view names every tenant's jobs.
PTOKEN=provider-scrape-token-0123456789
printf '  %s\n' "$PTOKEN" >"$T/provider.token"
printf 'short\n' >"$T/short.token"
chmod 600 "$T/provider.token" "$T/short.token"
base_conf "$T/conf_short" "provider_token_file=$T/short.token"
timeout -s KILL 20 "$SHOALD" -c "$T/conf_short" --ready-file "$T/ready_short" >"$T/short.out" 2>&1
is "$?:$(grep -c 'scrape token of the provider (.*short.token) is shorter than 16 bytes' \
    "$T/short.out")" "1:1" "a provider token under 16 bytes is a config error naming the file"
# A key file that cannot be used is named with the configuration key that gave it (the file
# alone did not say which line to fix). (The provider's token file below starts with spaces:
# cut, as Prometheus cuts them from the credentials_file it sends.)
printf 'x' >"$T/bad.key"; chmod 600 "$T/bad.key"
base_conf "$T/conf_badkey" "tenant.beta.key_file=$T/bad.key"
timeout -s KILL 20 "$SHOALD" -c "$T/conf_badkey" --ready-file "$T/ready_bk" >"$T/bk.out" 2>&1
is "$?:$(grep -c "shoald: tenant.beta.key_file: $T/bad.key is not a regular file of 32 bytes" \
    "$T/bk.out")" "1:1" "a bad key file is a config error naming tenant.beta.key_file"
base_conf "$T/conf_p" "provider_token_file=$T/provider.token"
start_agent "$T/conf_p"
ok $? "an agent with provider_token_file starts" "$T/agent.log"
is "$(grep -c "set provider_token_file" "$T/agent.log")" 1 \
    "and does not warn (the one warning in the log is the first agent's)"
client p0 --tenant acme --job ptrain --cred "$(cred acme ptrain)" --ngpus 1 --set ops:0=4
ok $? "a rank of acme/ptrain registered" "$T/p0.out"
is "$(scrape)" 401 "the provider view without a token: 401"
grep -q "provider_token_file" "$T/scrape"
ok $? "the answer names provider_token_file" "$T/scrape"
is "$(scrape /metrics -H "Authorization: Bearer acme-scrape-token-0123456789")" 401 \
    "a tenant's token does not open the provider view"
is "$(scrape /metrics -H "Authorization: Bearer ${PTOKEN}x")" 401 "nor a longer token"
PL='shoal_collective_ops_total{tenant="acme",shoal_job="ptrain",collective="allreduce"}'
is "$(scrape /metrics -H "Authorization: Bearer $PTOKEN"):$(metric "$PL")" "200:4" \
    "the provider's token opens it: acme/ptrain's 4 allreduce calls"
is "$(scrape "/metrics?tenant=acme" \
    -H "Authorization: Bearer acme-scrape-token-0123456789"):$(metric "$PL")" "200:4" \
    "the tenant's view still takes the tenant's token"
if [ $HAVE_PROM -eq 0 ]; then
    skip_rest 2 "prometheus not installed (Debian: prometheus)"
else
    PROM_TOKEN_FILE="$T/provider.token" start_prometheus
    ok $? "a Prometheus server with the provider's token file starts (port $PPORT)" "$T/prom.log"
    i=0
    while [ $i -lt 150 ] && [ "$(promq "$PL")" != 4 ]; do sleep 0.2; i=$((i + 1)); done
    is "$(promq "$PL"):$(promq 'up{job="shoald"}')" "4:1" \
        "Prometheus scrapes it with authorization: credentials_file (the value, target up)"
    kill "$PROM_PID" 2>/dev/null
    wait "$PROM_PID" 2>/dev/null
fi
kill "$PID_p0" 2>/dev/null
stop_agent

# The QoS arbiter with weights far apart: acme at 1000000 (the most a credential gives), beta
# at 1, both sending (some 50 KB/s each) over the NICs (qos_capacity_net, no tc). beta's share
# of 20 KiB/s is 0.02 bytes a second: it was truncated to a rate of 0, which its rates page
# means as no limit, so the lightest tenant ran unpaced. A share above 0 is published as 1 B/s
# at least (the library raises it to its slowest rate).
base_conf "$T/conf_q" "qos_rates_dir=$T/qos" "qos_capacity_net=20k" "qos_period=500ms"
start_agent "$T/conf_q"
client qa --tenant acme --job heavy --cred "$(cred acme heavy --weight 1000000)" \
    --weight 1000000 --tick 10
client qb --tenant beta --job light --cred "$(cred beta light)" --weight 1 --tick 10
QR='shoal_qos_comm_rate_bytes_per_second'
i=0
while [ $i -lt 50 ]; do # the arbiter has measured both as greedy
    scrape >/dev/null
    [ "$(metric "$QR{tenant=\"acme\"}")" -gt 20000 ] 2>/dev/null &&
        [ -n "$(metric "$QR{tenant=\"beta\"}")" ] && break
    sleep 0.1; i=$((i + 1))
done
is "$(metric "$QR{tenant=\"acme\"}"):$(metric "$QR{tenant=\"beta\"}")" "20479:1" \
    "weights 1000000:1 of 20 KiB/s: acme 20479 B/s, beta 1 B/s (not 0, no limit)"
is "$(od -An -j16 -N8 -tu8 "$T/qos/beta.rate" | tr -d ' ')" 1 \
    "beta's rates page holds 1 B/s"
kill "$PID_qa" "$PID_qb" 2>/dev/null
stop_agent
done_testing
