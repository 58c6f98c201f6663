#!/bin/sh
# TAP test of shoald's registration socket: a good page is accepted; a wrong tenant claim, a
# forged credential, an unknown tenant, an expired credential, a uid the tenant does not
# allow, no credential, a malformed message, garbage bytes, a page of the wrong size, an
# unsealed memfd, no descriptor, two descriptors are refused with a reason and counted (per
# reason, per claimed tenant, per uid; the abuse rule flags the flood) while the agent keeps
# running; silent and slow clients time out and do not stall others; a client that floods its
# connection after registering is cut and does not stall /metrics, nor do descriptors whose
# close() waits (a lingering TCP socket handed over); ended pages count in
# max_pages_per_uid until billed; bad credentials are logged within the refusals' cap only;
# the pidfd tells a process's exit while its connection is still open; a tenant keeps at
# most 256 jobs without ranks; config errors name
# the line.
. "$(dirname "$0")/agent_lib.sh"
need_agent
make_keys || { echo "1..0 # SKIP cannot make keys"; exit 0; }
uid=$(id -u)

# 1-9: the configuration file: --help-config, an unknown key, bad values, no password logged
"$SHOALD" --help-config >"$T/help" 2>&1
grep -q '^minute_seconds' "$T/help" && grep -q '^tenant.NAME.uids' "$T/help" &&
    grep -q '^ledger_url' "$T/help"
ok $? "--help-config lists the keys with their meaning" "$T/help"
printf 'listen=%s\n# comment\nbogus_key=1\n' "$T/x.sock" >"$T/bad.conf"
timeout -k 5 10 "$SHOALD" -c "$T/bad.conf" >"$T/bad.out" 2>&1
brc=$?
[ $brc -eq 1 ] && grep -q "bad.conf:3: unknown key" "$T/bad.out"
ok $? "an unknown key is an error naming the file and line" "$T/bad.out"
printf 'tenant.acme.class=gold\n' >"$T/bad2.conf"
timeout -k 5 10 "$SHOALD" -c "$T/bad2.conf" >"$T/bad.out" 2>&1
[ $? -eq 1 ] && grep -q "bad2.conf:1: class must be reserved or spot" "$T/bad.out"
ok $? "a bad tenant class is an error naming the line" "$T/bad.out"
# qos_tc without its interfaces: a config error (it crashed the arbiter's start)
base_conf "$T/bad3.conf" "qos_rates_dir=$T/qos" "qos_tc=/bin/true" "qos_tc_dev="
timeout -k 5 10 "$SHOALD" -c "$T/bad3.conf" >"$T/bad.out" 2>&1
[ $? -eq 1 ] && grep -q "qos_tc needs qos_tc_dev" "$T/bad.out"
ok $? "qos_tc without qos_tc_dev is a config error (exit 1)" "$T/bad.out"
# conf_refused MESSAGE LINE...: each LINE alone (beside base_conf's) must make the agent exit 1
# with MESSAGE; $bad lists those that did not
conf_refused() {
    msg=$1; shift
    bad=""
    for line in "$@"; do
        base_conf "$T/bad4.conf" "qos_rates_dir=$T/qos" "qos_capacity_shm=1g" "$line"
        timeout -k 5 10 "$SHOALD" -c "$T/bad4.conf" >"$T/bad.out" 2>&1
        brc=$?
        [ $brc -eq 1 ] && grep -q "$msg" "$T/bad.out" || bad="$bad $line:$brc"
    done
}
# qos_period out of 1ms..60s (0 and inf made the agent spin at 100% CPU)
conf_refused "qos_period must be 1ms..60s" qos_period=0 qos_period=inf qos_period=-5 \
    qos_period=60001ms
is "$bad" "" "qos_period=0, inf, -5, 60001ms are config errors naming the range (exit 1)"
# reg_timeout out of 1ms..60s (0 refused every registration, inf gave a silent client no
# deadline)
conf_refused "reg_timeout must be 1ms..60s" reg_timeout=0 reg_timeout=inf reg_timeout=-5 \
    reg_timeout=60001ms
is "$bad" "" "reg_timeout=0, inf, -5, 60001ms are config errors naming the range (exit 1)"
# max_pending=0 behaved as 1; tenant.NAME.tc_mark=0 (every unmarked packet's mark) was taken
conf_refused "max_pending must be 1..65536" max_pending=0
b1=$bad
conf_refused "tc_mark must be a positive integer" tenant.acme.tc_mark=0
is "$b1$bad" "" "max_pending=0 and tc_mark=0 are config errors naming the range (exit 1)"
# A PostgreSQL password in ledger_url (user:PASSWORD@, ?password=) was logged as written, at
# start and at every retry of a ledger that cannot be opened; now it shows as ***
# pw_hidden NAME URL SECRET SHOWN: an agent given ledger_url=URL logs SHOWN, never SECRET
pw_hidden() {
    base_conf "$T/$1.conf" "ledger_key_file=$T/ledger.key" "ledger_url=$2"
    SHOAL_DEBUG=INFO timeout -k 5 3 "$SHOALD" -c "$T/$1.conf" >"$T/$1.out" 2>&1
    ! grep -q "$3" "$T/$1.out" && grep -q "ledger $4 cannot" "$T/$1.out"
}
pw_hidden pw "postgresql://shoal:TopSecretPw@127.0.0.1:1/billing?password=TopSecretPw2" \
    TopSecret 'postgresql://shoal:\*\*\*@127.0.0.1:1/billing?password=\*\*\*'
ok $? "the ledger URL's password is not logged (*** in its place)" "$T/pw.out"
# a '?' in the password (libpq reads user:password@ up to the '@'): the URL was logged whole
pw_hidden pwq "postgresql://shoal:Top?SecretPw3@127.0.0.1:1/billing" SecretPw3 \
    'postgresql://shoal:\*\*\*@127.0.0.1:1/billing'
ok $? "a password holding '?' is not logged either" "$T/pwq.out"
# The same on the command line: every local user reads /proc/PID/cmdline. The agent keeps a
# copy and overwrites the argument with the redacted URL, and warns; so does shoal-bill.
base_conf "$T/pwarg.conf" "ledger_key_file=$T/ledger.key"
"$SHOALD" -c "$T/pwarg.conf" --ledger "postgresql://shoal:ArgSecretPw@127.0.0.1:1/billing" \
    --ready-file "$T/pwarg.ready" >"$T/pwarg.out" 2>&1 &
PWPID=$!
PIDS="$PIDS $PWPID"
i=0
while [ ! -s "$T/pwarg.ready" ] && [ $i -lt 100 ] && kill -0 $PWPID 2>/dev/null; do
    sleep 0.1; i=$((i + 1))
done
tr '\0' ' ' </proc/$PWPID/cmdline >"$T/pwarg.cmdline" 2>/dev/null
kill $PWPID 2>/dev/null
wait $PWPID 2>/dev/null
! grep -q ArgSecret "$T/pwarg.cmdline" "$T/pwarg.out" &&
    grep -q -- '--ledger postgresql://shoal:\*\*\*@127.0.0.1:1/billing' "$T/pwarg.cmdline" &&
    grep -q 'warning: --ledger carries a password' "$T/pwarg.out"
ok $? "--ledger's password: gone from /proc/PID/cmdline once read (*** there), a warning" \
    "$T/pwarg.cmdline"
timeout -k 5 20 "$top_builddir/shoal-bill" --ledger "postgresql://shoal:ArgSecretPw@127.0.0.1:1/billing" \
    --key-file "$T/ledger.key" verify >"$T/pwbill.out" 2>&1
! grep -q ArgSecret "$T/pwbill.out" &&
    grep -q 'shoal-bill: warning: --ledger carries a password' "$T/pwbill.out"
ok $? "shoal-bill warns too, and never shows the password" "$T/pwbill.out"
# qos_spot_cpu: idle, nice or none (anything else was taken as none)
bad=""
for v in idel SCHED_IDLE ""; do
    base_conf "$T/bad5.conf" "qos_spot_cpu=$v"
    timeout -k 5 10 "$SHOALD" -c "$T/bad5.conf" >"$T/bad.out" 2>&1
    brc=$?
    [ $brc -eq 1 ] && grep -q "bad5.conf:9: qos_spot_cpu must be idle, nice or none" "$T/bad.out" ||
        bad="$bad '$v':$brc"
done
is "$bad" "" "qos_spot_cpu=idel, SCHED_IDLE or empty is a config error naming the line"
# --minute-seconds: 1..3600, a usage error (exit 2) otherwise; 4294967297 wrapped to 1
bad=""
for v in 4294967297 5000 0 -1 abc 60x ""; do
    timeout -k 5 10 "$SHOALD" -c "$T/bad.conf" --minute-seconds "$v" >"$T/bad.out" 2>&1
    brc=$?
    [ $brc -eq 2 ] && grep -q -- "--minute-seconds takes 1..3600" "$T/bad.out" ||
        bad="$bad '$v':$brc"
done
timeout -k 5 10 "$SHOALD" -c "$T/bad.conf" --minute-seconds 3600 >"$T/bad.out" 2>&1
is "$bad:$?" ":1" "--minute-seconds out of 1..3600 or not a number is a usage error (exit 2)"

base_conf "$T/conf" "tenant.gamma.uids=$((uid + 4242))" "abuse_max_refused=5" \
    "reg_timeout=500ms" "max_pending=8"
start_agent "$T/conf"
ok $? "the agent starts and writes its ready file" "$T/agent.log"
[ -S "$SOCK" ] && [ "$(stat -c %a "$SOCK")" = 666 ] && [ "$(stat -c %a "$T/run")" = 755 ]
ok $? "the socket is 0666 in a 0755 directory"
# A second agent on the same state_dir (its own socket) would replay and replace the first
# one's spool: it is refused at its start, before it touches a socket, and the first one
# serves on. With the same socket as well, the first one's socket stays.
sed -e "s#^listen=.*#listen=$T/run2/shoald.sock#" -e "s#^http=.*#http=none#" "$T/conf" \
    >"$T/conf2"
bad=""
for c in conf2 conf; do
    timeout -k 5 10 "$SHOALD" -c "$T/$c" >"$T/bad.out" 2>&1
    brc=$?
    [ $brc -eq 1 ] && grep -q "another agent uses state_dir $T/state" "$T/bad.out" ||
        bad="$bad $c:$brc"
done
[ -z "$bad" ] && [ ! -e "$T/run2/shoald.sock" ] && [ -S "$SOCK" ] && alive
ok $? "a second agent on the same state_dir is refused; the first keeps its socket$bad" \
    "$T/bad.out"

ACME=$(cred acme train)
mc --tenant acme --job train --cred "$ACME" --ngpus 2 --hold-stdin </dev/null
is "$rc:$(status_of)" "0:0" "a page of tenant acme with acme's credential is accepted"

# Refusals: each answered with a status and a reason, and the agent goes on.
refuse() { # refuse WANT-STATUS REASON-GREP DESCRIPTION CLIENT-ARGS...
    want=$1; grepr=$2; desc=$3; shift 3
    mc "$@"
    st=$(status_of)
    if [ "$rc" = 1 ] && [ "$st" = "$want" ] && grep -q "$grepr" "$T/mc.out" && alive; then
        ok 0 "$desc"
    else
        ok 1 "$desc (rc $rc, status '$st')" "$T/mc.out"
    fi
}
BETA=$(cred beta infer)
refuse -61 "claims tenant acme" "a rank of tenant beta claiming tenant acme is refused " \
    --tenant acme --job infer --cred "$BETA"
refuse -61 "claims tenant acme" \
    "a rank claiming acme's job with another job's credential is refused" \
    --tenant acme --job other --cred "$ACME"
FORGED=$("$CREDTOOL" issue -k "$T/other.key" --tenant acme --job train 2>/dev/null)
refuse -60 "does not verify" "a forged credential (signed with another key) is refused" \
    --tenant acme --job train --cred "$FORGED"
TAMPER=$(printf '%s' "$ACME" | sed 's/job=train/job=trainX/')
refuse -60 "does not verify" "a credential whose fields were altered is refused" \
    --tenant acme --job trainX --cred "$TAMPER"
GHOST=$(cred ghost j1)
refuse -61 "not served" "a credential of a tenant the agent does not serve is refused" \
    --tenant ghost --job j1 --cred "$GHOST"
OLD=$(cred acme train --expires @1000000000)
refuse -61 "expired" "an expired credential is refused" --tenant acme --job train --cred "$OLD"
GAMMA=$(cred gamma g1)
refuse -61 "uid $uid may not" "a uid the tenant does not allow is refused" \
    --tenant gamma --job g1 --cred "$GAMMA"
refuse -61 "no credential" "a page claiming a tenant without a credential is refused" \
    --tenant acme --job train
refuse -61 "no credential" "a page without credential nor tenant is refused by default" \
    --job anon
refuse -1 "not a shoal_meter_reg_t" "garbage bytes are refused as malformed" \
    --mode garbage --tenant acme --job train --cred "$ACME"
refuse -1 "no page descriptor" "a registration without a descriptor is refused" \
    --mode nofd --tenant acme --job train --cred "$ACME"
refuse -1 "more than one descriptor" "a registration with two descriptors is refused" \
    --mode twofds --tenant acme --job train --cred "$ACME"
refuse -1 "8192 bytes" "a page of the wrong size is refused" \
    --mode badsize --tenant acme --job train --cred "$ACME"
refuse -1 "not sealed" "an unsealed memfd is refused" \
    --mode unsealed --tenant acme --job train --cred "$ACME"
refuse -1 "magic" "a page with a wrong magic is refused" \
    --mode badmagic --tenant acme --job train --cred "$ACME"
mc --mode shortclose --tenant acme --job train --cred "$ACME"
sleep 0.2
alive
ok $? "a client that sends 5 bytes and leaves does not hurt the agent"
refuse -20 "reg_timeout" "a slow client (a byte every 300 ms) is cut at reg_timeout" \
    --mode slow --tenant acme --job train --cred "$ACME"

# The counters of the refusals, per reason, per claimed tenant, per uid.
scrape >/dev/null
is "$(metric 'shoal_registrations_refused_total{reason="tenant_mismatch"}')" 2 \
    "tenant_mismatch refusals counted"
is "$(metric 'shoal_registrations_refused_total{reason="bad_credential"}')" 2 \
    "bad_credential refusals counted"
is "$(metric 'shoal_auth_failures_total{tenant="acme"}')" 3 \
    "auth failures claiming acme counted (forged, altered, expired)"
is "$(metric 'shoal_tenant_refusals_total{tenant="_unknown"}')" 10 \
    "refusals with no configured tenant are folded into _unknown"
is "$(metric "shoal_uid_refusals_total{uid=\"$uid\"}")" 17 "refusals counted per uid"
is "$(metric 'shoal_abuse_flags_total{tenant="acme"}')" 1 \
    "the abuse rule flags acme (more than 5 refusals claiming it in a minute)"
grep -q "abuse: tenant acme flagged" "$T/agent.log"
ok $? "the flag is in the log" "$T/agent.log"
wait_metric 'shoal_ranks{tenant="acme",shoal_job="train"}' 0
ok $? "the accepted rank has exited: no rank alive"

# Silent clients fill the pending slots: a good registration still goes through at once (an
# agent that waited on them would take 12 x reg_timeout; the bound leaves room for a loaded
# machine).
i=0
while [ $i -lt 12 ]; do
    timeout -s KILL 20 "$MC" --sock "$SOCK" --mode silent >/dev/null 2>&1 &
    PIDS="$PIDS $!"
    i=$((i + 1))
done
sleep 0.1
t0=$(date +%s%N)
mc --tenant acme --job train --cred "$ACME"
t1=$(date +%s%N)
ms=$(( (t1 - t0) / 1000000 ))
[ "$rc" = 0 ] && [ $ms -lt 1000 ]
ok $? "12 silent clients do not stall a registration (it took $ms ms)" "$T/mc.out"
sleep 1
scrape >/dev/null
lim=$(metric 'shoal_registrations_refused_total{reason="limit"}')
tmo=$(metric 'shoal_registrations_refused_total{reason="timeout"}')
[ "$((lim + tmo))" -ge 12 ] && [ "$lim" -ge 4 ]
ok $? "the silent clients were dropped (limit $lim, timeout $tmo)"

# The pidfd: the process exits while a child keeps its connection open.
mc --tenant acme --job pidjob --cred "$(cred acme pidjob)" --ngpus 1 --fork-holder 8
is "$rc" 0 "a rank registers, forks a child holding the connection, exits"
wait_metric 'shoal_ranks{tenant="acme",shoal_job="pidjob"}' 0
ok $? "the agent notices the exit through the pidfd, the connection still open"
grep -q "acme/pidjob (pid [0-9]*) exited" "$T/agent.log"
ok $? "and says so in the log" "$T/agent.log"

# A registered client that streams bytes on its kept connection (the protocol sends nothing
# after the agent's reply) held the single-threaded agent in its read loop: now the first
# bytes end the page as a close does, /metrics answers meanwhile, it counts as a refusal.
FJ='tenant="acme",shoal_job="flood"'
scrape >/dev/null
arefused=$(metric 'shoal_tenant_refusals_total{tenant="acme"}')
timeout -s KILL 20 "$MC" --sock "$SOCK" --tenant acme --job flood --cred "$(cred acme flood)" \
    --ngpus 1 --set ops:0=7 --mode flood --hold 8 >"$T/flood.out" 2>&1 &
FPID=$!
PIDS="$PIDS $FPID"
i=0
while ! grep -q '^status=' "$T/flood.out" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
sleep 0.2
t0=$(date +%s%N)
code=$(curl -s -m 2 -o "$T/scrape" -w '%{http_code}' "http://$HTTP/metrics")
t1=$(date +%s%N)
is "$code" 200 \
    "/metrics answers while a registered client floods its connection ($(( (t1 - t0) / 1000000 )) ms)"
wait $FPID
frc=$?
is "$frc:$(sed -n 's/^status=\([^ ]*\) .*/\1/p' "$T/flood.out")" "0:0" \
    "the flooder was accepted, then the agent closed its connection"
grep -q "acme/flood (pid [0-9]*) broke the registration protocol" "$T/agent.log"
ok $? "the page's end names the protocol violation" "$T/agent.log"
wait_metric "shoal_ranks{$FJ}" 0
ok $? "its page ended as at a close: no rank alive"
is "$(metric "shoal_collective_ops_total{$FJ,collective=\"allreduce\"}")" 7 \
    "and its counters stay in its job's totals"
is "$(metric 'shoal_tenant_refusals_total{tenant="acme"}')" "$((arefused + 1))" \
    "the violation counts against the tenant (abuse rule)"

# Descriptors whose last close() waits: a loopback TCP socket with unsent data and SO_LINGER
# (30 s) sent as the page, six more than the ancillary room held (the kernel dropped the
# extra ones in the agent's recvmsg), or on one more byte after a valid registration (dropped
# by the agent's read of its kept connection). The agent closed them in its only thread:
# registrations, /metrics and the minute stood still for the linger (without end for a
# large one: its signals are blocked, SIGTERM did not stop it). They are closed on a thread
# of their own now.
bad=""
for m in lingerpage lingermany lingertail; do
    timeout -s KILL 30 "$MC" --sock "$SOCK" --tenant acme --job linger --cred "$(cred acme \
        linger)" --mode "$m" --hold 8 >"$T/lg.out" 2>&1 &
    LPID=$!
    PIDS="$PIDS $LPID"
    i=0
    while ! grep -q '^status=' "$T/lg.out" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    sleep 0.3
    code=$(curl -s -m 3 -o /dev/null -w '%{http_code}' "http://$HTTP/metrics")
    [ "$code" = 200 ] || bad="$bad $m:$code"
    kill -9 $LPID 2>/dev/null
    wait $LPID 2>/dev/null
done
alive
is "$?:$bad" "0:" \
    "lingering sockets handed over (as the page, in excess, after it) do not stall /metrics"

# max_pages_per_uid counts every page the agent holds for the uid, the ended ones not billed
# yet too (they count in max_pages): one uid that registers and closes over and over is
# refused after its 5 held pages instead of filling max_pages for every uid. (The pages are
# collected at the minute's end: minute_seconds=3600 keeps them for the test.)
stop_agent
base_conf "$T/conf3" "max_pages=20" "max_pages_per_uid=5" "minute_seconds=3600"
start_agent "$T/conf3"
CHURN=$(cred acme churn)
got=""
want=""
i=0
while [ $i -lt 22 ]; do
    mc --tenant acme --job churn --cred "$CHURN"
    got="$got $rc:$(status_of)"
    if [ $i -lt 5 ]; then want="$want 0:0"; else want="$want 1:-2"; fi
    i=$((i + 1))
done
is "$got" "$want" "a uid that registers and closes 22 times is refused after its 5 held pages"
grep -q "uid $uid holds its limit of 5 pages (max_pages_per_uid" "$T/mc.out"
ok $? "the refusal names the uid's limit" "$T/mc.out"
if [ "$uid" = 0 ] && command -v setpriv >/dev/null 2>&1; then
    chmod 711 "$T" # the socket's directory is in $T: let uid 65534 reach it
    timeout -s KILL 20 setpriv --reuid 65534 --regid 65534 --clear-groups "$MC" --sock "$SOCK" \
        --tenant acme --job other --cred "$(cred acme other)" >"$T/mc.out" 2>"$T/mc.err"
    rc=$?
    is "$rc:$(status_of)" "0:0" "another uid (65534) still registers" "$T/mc.err"
else
    skip_rest 1 "not root (another uid needs setpriv --reuid)"
fi

# Descriptors: a held page costs the agent two (its connection, its pidfd). Under ulimit -n 240
# the agent took pages until it had none left, then refused the next ones as "no page
# descriptor was attached" (the kernel drops a descriptor it cannot install; counted as the
# client's fault, no_fd) and took a page whose pidfd it could not open as exited while its
# rank ran. It now keeps at most the pages its limit leaves room for (said at start) and
# refuses the others as limit, with the reason.
stop_agent
base_conf "$T/conf5" "http=none" "max_pending=8"
AGENT_NOFILE=240 start_agent "$T/conf5"
FDS=$(cred acme fds)
HOLDERS=""
i=0
while [ $i -lt 120 ]; do # one after the other (a burst would be max_pending's to cut)
    timeout -s KILL 40 "$MC" --sock "$SOCK" --tenant acme --job fds --cred "$FDS" --hold 30 \
        >"$T/fd$i.out" 2>&1 &
    HOLDERS="$HOLDERS $!"
    PIDS="$PIDS $!"
    j=0
    while ! grep -q '^status=' "$T/fd$i.out" 2>/dev/null && [ $j -lt 100 ]; do
        sleep 0.02; j=$((j + 1))
    done
    i=$((i + 1))
done
room=$(sed -n 's/.*the agent keeps at most \([0-9]*\) pages.*/\1/p' "$T/agent.log" | tail -n 1)
nok=$(cat "$T"/fd*.out | grep -c '^status=0 ')
nlim=$(cat "$T"/fd*.out | grep -c "^status=-2 reason=the agent holds its limit of $room pages")
is "${room:-none}:$nok:$nlim" "16:16:104" \
    "under ulimit -n 240, 120 held pages: 16 kept (the room the agent said), 104 refused as limit"
! grep -q "no page descriptor" "$T"/fd*.out && ! grep -q "before the agent could watch" \
    "$T/agent.log" && alive
ok $? "none refused as no_fd, none taken for exited, the agent runs" "$T/agent.log"
AGENT_NOFILE=
stop_agent
for p in $HOLDERS; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done

# accept failing with EMFILE (ulimit -n 20; 30 clients that connect and say nothing hold what
# is left until reg_timeout, the rest wait in the backlog): the listener stays readable, and the
# agent logged "accept on ...: Too many open files" at every turn of its loop, thousands of lines
# a second at full CPU. It pauses accepting instead, says so once, and serves the backlog once
# descriptors are free.
base_conf "$T/conf7" "http=none" "reg_timeout=3s"
from=$(($(wc -l <"$T/agent.log") + 1))
AGENT_NOFILE=20 start_agent "$T/conf7"
AGENT_NOFILE=
SILENT=""
i=0
while [ $i -lt 30 ]; do
    timeout -s KILL 30 "$MC" --sock "$SOCK" --mode silent >"$T/silent$i.out" 2>&1 &
    SILENT="$SILENT $!"
    PIDS="$PIDS $!"
    i=$((i + 1))
done
cpu0=$(awk '{ print $14 + $15 }' "/proc/$AGENT_PID/stat")
sleep 2
cpu=$(($(awk '{ print $14 + $15 }' "/proc/$AGENT_PID/stat") - cpu0))
nacc=$(tail -n +"$from" "$T/agent.log" | grep -c "accept on .*Too many open files")
[ "$nacc" -eq 1 ] && [ "$cpu" -lt 50 ]
ok $? "accept out of descriptors: said once ($nacc lines), no busy loop ($cpu ticks in 2 s)"
for p in $SILENT; do wait "$p" 2>/dev/null; done
nto=$(cat "$T"/silent*.out | grep -c "^status=-.* reason=the registration did not arrive within")
mc --tenant acme --job emfile --cred "$(cred acme emfile)"
[ "$nto" = 30 ] && [ -n "$(status_of)" ] && alive
ok $? "all 30 answered at their deadline ($nto), then a new registration is answered" "$T/mc.out"
stop_agent

# A kernel without pidfds (before Linux 5.3; tests/agent/nopidfd makes pidfd_open fail with
# ENOSYS and SO_PEERPIDFD with ENOPROTOOPT): every page was ended at its registration, "exited
# before the agent could watch it", its rank alive (not metered, billed for no time). The end
# of the rank's connection tells its exit there.
base_conf "$T/conf8"
if ! AGENT_WRAP=$top_builddir/tests/agent/nopidfd start_agent "$T/conf8"; then
    skip_rest 2 "no seccomp filter here: $(grep 'nopidfd:' "$T/agent.log" | tail -n 1)"
else
    timeout -s KILL 20 "$MC" --sock "$SOCK" --tenant acme --job nopidfd \
        --cred "$(cred acme nopidfd)" --hold 3 >"$T/np.out" 2>&1 &
    np=$!
    PIDS="$PIDS $np"
    wait_metric 'shoal_ranks{tenant="acme",shoal_job="nopidfd"}' 1 &&
        ! grep -q "exited before the agent could watch it" "$T/agent.log" &&
        grep -q "no pidfd for pid .*Function not implemented" "$T/agent.log"
    ok $? "no pidfds: a registered rank stays live (not ended at once), said once" "$T/agent.log"
    wait "$np"
    wait_metric 'shoal_ranks{tenant="acme",shoal_job="nopidfd"}' 0 &&
        grep -q "rank 0 of acme/nopidfd (pid [0-9]*) closed its communicator" "$T/agent.log"
    ok $? "no pidfds: its exit ends the page (the connection's end)" "$T/agent.log"
fi
stop_agent

# A memfd sent unsealed, then truncated to 0 and sealed while the agent checked it: the agent
# read the size before the seals, so a client that did both between the two checks had it
# map an empty file and die of SIGBUS at its first read (every tenant's metering and billing
# gone; a few thousand tries, under a second). The seals are checked first.
base_conf "$T/conf6"
start_agent "$T/conf6"
timeout -s KILL 30 "$MC" --sock "$SOCK" --mode truncrace --hold 4 >"$T/race.out" 2>&1
[ $? = 0 ] && alive
ok $? "memfds truncated and sealed while the agent checks them: all answered, the agent runs" \
    "$T/race.out"
stop_agent

# Bad credentials cost the journal at most the refusals' cap (20 lines a minute): the
# library's parser and verifier logged an ERROR of their own for each (120 bad registrations,
# 120 lines). 20 malformed, 20 forged and 20 expired ones within a run that may straddle a
# minute: no [TENANT] line, at most 2 x 20 refusal lines, every one refused and counted.
stop_agent
base_conf "$T/conf4"
start_agent "$T/conf4"
from=$(($(wc -l <"$T/agent.log") + 1))
BADTEXT='shoal-cred-v1:tenant=acme;job=train;epoch=0;class=guaranteed;weight=1;expires=0;mac=zz'
i=0
while [ $i -lt 20 ]; do
    mc --tenant acme --job train --cred "$BADTEXT"
    mc --tenant acme --job train --cred "$FORGED"
    mc --tenant acme --job train --cred "$OLD"
    i=$((i + 1))
done
tail -n +"$from" "$T/agent.log" >"$T/bad.log"
is "$(grep -c '\[TENANT\]' "$T/bad.log")" 0 \
    "60 bad credentials log no line of the parser or verifier"
nref=$(grep -c 'refused (' "$T/bad.log")
[ "$nref" -ge 1 ] && [ "$nref" -le 40 ]
ok $? "and $nref refusal lines, within the cap of 20 a minute" "$T/bad.log"
grep -q "refused (bad_credential): the credential is malformed: field 'mac' is not 64" \
    "$T/bad.log"
ok $? "the refusal of a malformed credential says what is wrong" "$T/bad.log"
scrape >/dev/null
is "$(metric 'shoal_registrations_refused_total{reason="bad_credential"}'):$(metric \
    'shoal_registrations_refused_total{reason="expired"}')" "40:20" "all 60 refused and counted"
# The refusals past the cap are said as a count once their minute is over: said only at the
# next refusal, a burst that stopped left 20 lines and no word of the others. Past the next
# minute's start (no refusal since), lines and counts add up to the 60.
sleep $((61 - $(date +%s) % 60))
sleep 1.5
tail -n +"$from" "$T/agent.log" >"$T/bad.log"
nmore=$(sed -n 's/.* \([0-9]*\) more refused registrations were not logged.*/\1/p' "$T/bad.log" |
    awk '{ s += $1 } END { print s + 0 }')
is "$(($(grep -c 'refused (' "$T/bad.log") + nmore))" 60 \
    "the refusals not logged are counted in the log once their minute is over"

# Uncredentialed pages when the provider allows them.
stop_agent
base_conf "$T/conf2" "allow_uncredentialed=yes"
start_agent "$T/conf2"
mc --job anon
is "$rc:$(status_of)" "0:0" \
    "with allow_uncredentialed, a page without tenant or credential is accepted"
refuse -61 "no credential" "but one that claims a tenant still needs a credential" \
    --tenant acme --job train
stop_agent
# Such a client names its jobs: 300 that registered and ended under new names were all kept
# for job_retention (an hour; some 60000 jobs and 250 MB of /metrics at the default
# max_pages_per_uid). A tenant keeps at most 256 jobs without ranks, the newest.
base_conf "$T/conf3" "allow_uncredentialed=yes" "minute_seconds=1"
start_agent "$T/conf3"
i=0
while [ $i -lt 300 ]; do
    timeout -s KILL 20 "$MC" --sock "$SOCK" --job "churn-$i" >/dev/null 2>&1
    i=$((i + 1))
done
sleep 2.5 # a minute (1 s) bills the ended pages, and the jobs are left without ranks
scrape >/dev/null
is "$(grep -c '^shoal_ranks{tenant="uid=[0-9]*",shoal_job="churn-' "$T/scrape"):$(metric \
    "shoal_ranks{tenant=\"uid=$uid\",shoal_job=\"churn-299\"}")" "256:0" \
    "300 jobs ended under new names: the tenant keeps the newest 256"
stop_agent
is "$agent_rc" 0 "the agent stops cleanly on SIGTERM"
[ ! -e "$SOCK" ]
ok $? "and removes its socket"
done_testing
