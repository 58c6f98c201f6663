#!/bin/sh
# TAP test of shoald's billing minute (minute_seconds=2) with the real ledger: SQLite (a fresh
# database in the test's directory), or with LEDGER_MODE=pg a PostgreSQL server started here
# (test_shoald_minute_pg.sh). Per (tenant, job, host, minute) one record whose sums (shoal-bill
# usage --csv) equal the counters the rank wrote; allocated GPU-seconds within 0.5% of GPUs x
# the rank's lifetime (the page's creation to its end, as the rank measured it); a database
# that goes down (SQLite: its directory moved away and back; PostgreSQL: the server stopped
# and started) holds the minutes in memory and gets them all when it comes back; a kill -9 of
# the agent in the middle of a job, then a new agent that the rank registers with again: no
# minute of the job's life missing, none doubled, totals exact, the chain verifies; failed
# ranks per cause; the cursors of ended ranks are deleted once billed; a rank that comes back
# after its job's next minutes were billed has its earlier time folded into the first open
# minute, logged; a restarted agent's rejoin_grace and rejoin_wait keep that from happening
# to a rank that registers again within them; an uncredentialed job billed beside a
# credentialed one; long host names that share their first 32 characters kept apart, and a
# cursor keyed the older way resumed from; one job on two hosts whose agents share the ledger,
# each host's record of each minute in that minute; with PostgreSQL, a server that hangs (its
# processes stopped) while registrations and scrapes go on, and one that a standby replaces.
. "$(dirname "$0")/agent_lib.sh"
. "$(dirname "$0")/../ledger/ledger_env.sh"
need_agent
BILL="$top_builddir/shoal-bill"
make_keys || { echo "1..0 # SKIP cannot make keys"; exit 0; }
mode=${LEDGER_MODE:-sqlite}
if [ "$mode" = pg ]; then
    pg_find || { echo "1..0 # SKIP no PostgreSQL server binaries (initdb, pg_ctl)"; exit 0; }
    PGT=$(ledger_tmpdir test_shoald_pg) || exit 1
    CLEANUP_HOOK='pg_cleanup; rm -rf "$PGT"'
    pg_setup "$PGT" || { echo "1..1"; echo "not ok 1 - the PostgreSQL server did not start"
        sed 's/^/#   /' "$PGT/pg.log" 2>/dev/null | tail -n 20; exit 1; }
    URL="postgresql:///shoal_ledger?host=$PGT&port=$PG_PORT&user=shoal"
    q() { timeout -s KILL 30 psql -X -q -At -h "$PGT" -p "$PG_PORT" -U shoal shoal_ledger -c "$1"; }
    db_down() { pg_stop; }
    db_up() { pg_start; }
else
    mkdir "$T/db" || exit 1
    L="$T/db/ledger.db"
    URL="sqlite://$L"
    q() { timeout -s KILL 30 sqlite3 -batch "$L" "$1"; }
    # the agent's SQLite backend notices the file is not at its path any more
    db_down() { mv "$T/db" "$T/db.away"; }
    db_up() { mv "$T/db.away" "$T/db"; }
fi
base_conf "$T/conf" "ledger_url=$URL" "ledger_key_file=$T/ledger.key" "minute_seconds=2"

usage_col() { # usage_col TENANT JOB COLUMN: a column of shoal-bill usage --csv
    timeout -s KILL 30 "$BILL" --ledger "$URL" usage --csv --tenant "$1" --job "$2" \
        2>>"$T/bill.err" | awk -F, -v c="$3" 'NR == 2 { print $c }'
}
sum_gpu() { usage_col "$1" "$2" 5; }
sum_ops() { usage_col "$1" "$2" 9; }
sum_cross() { usage_col "$1" "$2" 8; }
# minutes_ok TENANT JOB: one record per minute from the first to the last (none missing, none
# twice), at least MIN of them; prints "count first last"
minutes_of() {
    q "SELECT count(*), count(DISTINCT minute), min(minute), max(minute) FROM ledger_records
       WHERE tenant = '$1' AND job = '$2'" | tr '|' ' '
}
minutes_ok() {
    set -- $(minutes_of "$1" "$2") "$3"
    [ "$1" = "$2" ] && [ "$1" -ge "$5" ] && [ $(( ($4 - $3) / 2 + 1 )) -eq "$1" ]
}
final_of() { # final_of ops|sent CLIENT-OUTPUT: the rank's final counter
    sed -n "s/^final .*$1=\\([0-9]*\\).*/\\1/p" "$2" | head -n 1
}
wait_minutes() { # wait_minutes N: N minute boundaries later (and a little)
    sleep $(( $1 * 2 ))
    sleep 0.5
}
within() { # within GOT WANT PERMILLE
    awk -v g="$1" -v l="$2" -v p="$3" 'BEGIN { d = g - l; if (d < 0) d = -d;
        exit !(l > 0 && d <= p / 1000 * l) }'
}

start_agent "$T/conf"
ok $? "the agent starts with a 2 s minute and the $mode ledger" "$T/agent.log"

# 2-6: a rank with 2 GPUs that lives about 6 s and counts all the while
ACME=$(cred acme train)
timeout -s KILL 30 "$MC" --sock "$SOCK" --tenant acme --job train --cred "$ACME" --ngpus 2 \
    --tick 20 --hold 6 >"$T/r1.out" 2>&1
rc=$?
is "$rc" 0 "the rank registered, counted for 6 s and ended"
wait_minutes 2
ops=$(final_of ops "$T/r1.out")
sent=$(final_of sent "$T/r1.out")
is "$(sum_ops acme train)" "$ops" "the ledger's operations equal the rank's ($ops)"
is "$(sum_cross acme train)" "$sent" "the ledger's cross-host bytes equal the rank's ($sent)"
life=$(awk -v l="$(final_of life_ns "$T/r1.out")" 'BEGIN { printf "%.4f", 2 * l / 1e9 }')
gs=$(sum_gpu acme train)
within "$gs" "$life" 5
ok $? "allocated GPU-seconds $gs within 0.5% of 2 GPUs x the lifetime ($life)"
minutes_ok acme train 3 &&
    [ "$(q "SELECT count(*) FROM ledger_records WHERE tenant = 'acme' AND job = 'train'
           AND class <> 'reserved'")" = 0 ]
ok $? "one record per minute ($(minutes_of acme train)), none missing or twice, class reserved"

# 7: one process with 2 GPUs and two communicators (a world and a split): each page declares
# the process's GPUs, which were billed once per page (twice 2 GPUs x the lifetime)
timeout -s KILL 30 "$MC" --sock "$SOCK" --tenant acme --job twocomm \
    --cred "$(cred acme twocomm)" --ngpus 2 --tick 20 --hold 4 --set2 ops:0=1 \
    >"$T/r1b.out" 2>&1
rc=$?
wait_minutes 2
life=$(awk -v l="$(final_of life_ns "$T/r1b.out")" 'BEGIN { printf "%.4f", 2 * l / 1e9 }')
gs=$(sum_gpu acme twocomm)
[ "$rc" = 0 ] && grep -q '^second status=0' "$T/r1b.out" && within "$gs" "$life" 5
ok $? "a process's 2 GPUs are billed once over its 2 communicators: $gs GPU-seconds within \
0.5% of 2 x its lifetime ($life)" "$T/r1b.out"

# 8-13: the database goes down for 3 minutes while a rank counts; nothing is lost
BETA=$(cred beta infer)
timeout -s KILL 40 "$MC" --sock "$SOCK" --tenant beta --job infer --cred "$BETA" --ngpus 1 \
    --tick 20 --hold 9 >"$T/r2.out" 2>&1 &
R2=$!
PIDS="$PIDS $R2"
sleep 1
db_down
wait_minutes 3
scrape >/dev/null
pend=$(metric shoal_ledger_pending_batches)
fails=$(metric shoal_ledger_commit_failures_total)
[ "${pend:-0}" -ge 2 ] && [ "${fails:-0}" -ge 1 ]
ok $? "with the database down, minutes are held ($pend batches, $fails failed commits)"
grep -q "minutes held in memory" "$T/agent.log"
ok $? "the agent says so in its log" "$T/agent.log"
db_up
wait "$R2"
wait_minutes 2
sleep 1
scrape >/dev/null
is "$(metric shoal_ledger_pending_batches)" 0 "when it comes back every held minute is written"
is "$(sum_ops beta infer)" "$(final_of ops "$T/r2.out")" "beta's operations are exact"
is "$(sum_cross beta infer)" "$(final_of sent "$T/r2.out")" "beta's bytes are exact"
minutes_ok beta infer 4 &&
    [ "$(q "SELECT count(*) FROM ledger_records WHERE tenant = 'beta' AND class <> 'spot'")" = 0 ]
ok $? "beta's minutes ($(minutes_of beta infer)) have no gap and are billed spot (its class)"

# 14-21: kill -9 of the agent in the middle of a job, down for more than two minutes; a new
# agent; the rank registers again
timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job crash --cred "$(cred acme crash)" \
    --ngpus 4 --tick 20 --hold 12 --rereg >"$T/r3.out" 2>"$T/r3.err" &
R3=$!
PIDS="$PIDS $R3"
sleep 3.3
stop_agent KILL
sleep 4.5
start_agent "$T/conf"
ok $? "a new agent starts on the socket the killed one left" "$T/agent.log"
wait "$R3"
grep -q "registered again" "$T/r3.err"
ok $? "the rank registered its page again with the new agent" "$T/r3.err"
grep -q "resumes from its ledger cursor" "$T/agent.log"
ok $? "the new agent took the page's cursor from the ledger" "$T/agent.log"
wait_minutes 2
is "$(sum_ops acme crash)" "$(final_of ops "$T/r3.out")" \
    "operations across the crash are exact (none lost, none twice)"
is "$(sum_cross acme crash)" "$(final_of sent "$T/r3.out")" "bytes across the crash are exact"
minutes_ok acme crash 6
ok $? "every minute of the job's life is in the ledger once ($(minutes_of acme crash))"
life=$(awk -v l="$(final_of life_ns "$T/r3.out")" 'BEGIN { printf "%.4f", 4 * l / 1e9 }')
gs=$(sum_gpu acme crash)
within "$gs" "$life" 5
ok $? "GPU-seconds across the crash $gs within 0.5% of 4 GPUs x the lifetime ($life)"
# each minute's GPU-seconds is at most 4 GPUs x 2 s (the gap's time is not piled into one)
is "$(q "SELECT count(*) FROM ledger_records WHERE job = 'crash' AND gpu_seconds > 8.001")" 0 \
    "no minute holds more than 4 GPUs x 2 s"

# 22-25: kill -9 again, and the database is down when the rank registers with the new agent
# (the rank is stopped meanwhile, so it registers only then): its cursor cannot be read, so
# the page waits, counting, instead of being billed again from zero; exact once it answers
timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job dbdown --cred "$(cred acme dbdown)" \
    --ngpus 1 --tick 20 --hold 11 --rereg >"$T/r5.out" 2>"$T/r5.err" &
R5=$!
PIDS="$PIDS $R5"
sleep 3.3
R5C=$(pgrep -P "$R5")      # the client (R5 is its timeout)
kill -STOP "$R5C"
stop_agent KILL
start_agent "$T/conf"
ok $? "a new agent starts with the database up" "$T/agent.log"
db_down
kill -CONT "$R5C"
sleep 3
grep -q "cursor of page .* cannot be read" "$T/agent.log"
ok $? "the rank registered while the database was down: its cursor is awaited" "$T/agent.log"
db_up
wait "$R5"
wait_minutes 2
sleep 1
is "$(sum_ops acme dbdown)" "$(final_of ops "$T/r5.out")" \
    "its operations are exact (what the killed agent billed is not billed again)"
life=$(awk -v l="$(final_of life_ns "$T/r5.out")" 'BEGIN { printf "%.4f", l / 1e9 }')
gs=$(sum_gpu acme dbdown)
within "$gs" "$life" 5
ok $? "its GPU-seconds $gs within 0.5% of 1 GPU x its lifetime ($life)"

# 26-29: failures per cause
mc --tenant acme --job fails --cred "$(cred acme fails)" --set aborts=1
mc --tenant acme --job fails --cred "$(cred acme fails)" --rank 0 --set peer_failures=3
wait_minutes 2
is "$(q "SELECT sum(failed_tenant) FROM ledger_records WHERE job = 'fails'")" 1 \
    "a rank that aborted is a failure the tenant caused"
is "$(q "SELECT sum(failed_platform) FROM ledger_records WHERE job = 'fails'")" 1 \
    "a rank that ended after peer failures is the platform's"
mc --tenant acme --job fails2 --cred "$(cred acme fails2)" --set peer_failures=1 \
    --abandon 1 --hold 1
wait_minutes 2
is "$(q "SELECT sum(failed_platform) FROM ledger_records WHERE job = 'fails2'")" 1 \
    "a failed rank whose registration closed and came back (two ends of one page) is one failure"
# device bytes through CUDA IPC are billed as same-host bytes, with the shm ones
mc --tenant acme --job devipc --cred "$(cred acme devipc)" --set sent:0:0=1000 \
    --set cuda_ipc_sent=123456 --set cuda_ipc_recv=654321
wait_minutes 2
is "$(q "SELECT sum(bytes_same_host) || ':' || sum(bytes_cross_host) FROM ledger_records
         WHERE job = 'devipc'")" 124456:0 "CUDA IPC bytes are billed as same-host bytes"

# 30-34: a registration the library gave up on (its connection closed, the page still live)
# is billed to that point, and its cursor kept: the same page registered again goes on from
# it (nothing counted twice), and only the end of the communicator deletes the cursor
timeout -s KILL 40 "$MC" --sock "$SOCK" --tenant acme --job abandon --cred "$(cred acme abandon)" \
    --ngpus 1 --tick 20 --abandon 3 --hold 6 >"$T/r4.out" 2>"$T/r4.err"
is "$?" 0 "a rank gave up its registration, counted on and registered the same page again"
wait_minutes 2
is "$(sum_ops acme abandon)" "$(final_of ops "$T/r4.out")" \
    "its operations are exact (the part before it gave up is not counted again)"
life=$(awk -v l="$(final_of life_ns "$T/r4.out")" 'BEGIN { printf "%.4f", l / 1e9 }')
gs=$(sum_gpu acme abandon)
within "$gs" "$life" 5
ok $? "its GPU-seconds $gs within 0.5% of 1 GPU x its lifetime ($life)"
is "$(q "SELECT count(*) FROM ledger_cursors")" 0 \
    "every rank ended and was billed: no cursor is left in the ledger"
scrape >/dev/null
is "$(metric "shoal_collective_ops_total{tenant=\"acme\",shoal_job=\"abandon\",collective=\"allreduce\"}")" \
    "$(final_of ops "$T/r4.out")" \
    "/metrics counts its operations once too (the closed registration was not collected into the job's totals while its process could register it again)"

# 35-38: a rank that registers only after the job's next minutes were billed without it (a
# process that started with the job, slept 5 s, then registered the page it made at its
# start, as a rank that made no call for minutes after an agent restart would): its time
# before then cannot go back into those minutes' records, so it is folded into the job's
# first open minute, and the agent says so with the seconds; the sum stays exact. The late
# rank has two communicators (two pages of one process, its GPU once): the agent says what
# the minute got, the process's seconds once (it logged each page's, twice what was folded)
timeout -s KILL 40 "$MC" --sock "$SOCK" --tenant acme --job late --cred "$(cred acme late)" \
    --ngpus 1 --hold 9 >"$T/r5a.out" 2>"$T/r5a.err" &
R5=$!
PIDS="$PIDS $R5"
timeout -s KILL 40 sh -c 'sleep 5; exec "$@"' sh "$MC" --sock "$SOCK" --tenant acme --job late \
    --cred "$(cred acme late)" --rank 1 --nranks 2 --ngpus 1 --created-ago 5 --hold 2 \
    --set2 ops:0=1 >"$T/r5b.out" 2>"$T/r5b.err"
rcb=$?
wait "$R5"
rca=$?
[ "$rca" = 0 ] && [ "$rcb" = 0 ] && grep -q '^second status=0 ' "$T/r5b.out"
ok $? "two ranks of a job: one counts 9 s, the other (two communicators) registers 5 s after it started" "$T/r5b.err"
wait_minutes 2
fold=$(agent_folds acme/late | awk '{ n[$1]++; s[$1] += $2; m = $1 }
    END { if (m != "") printf "%s %.6f %d\n", m, s[m], n[m] }')
set -- $fold
awk -v s="${2:-0}" -v n="${3:-0}" 'BEGIN { exit !(s >= 1.0 && s <= 5.5 && n == 1) }'
ok $? "the agent reported the late rank's time folded into minute ${1:-?} once (${3:-no} lines, ${2:-none} GPU-seconds)" \
    "$T/agent.log"
over=$(q "SELECT gpu_seconds FROM ledger_records WHERE job = 'late' AND minute = ${1:-0}")
awk -v g="${over:-0}" -v s="${2:-0}" 'BEGIN { exit !(g > 4.001 && g - s <= 4.001) }'
ok $? "that minute holds $over GPU-seconds: above 2 ranks x 1 GPU x 2 s by no more than the fold"
life=$(awk -v a="$(final_of life_ns "$T/r5a.out")" -v b="$(final_of life_ns "$T/r5b.out")" \
    'BEGIN { printf "%.4f", (a + b) / 1e9 }')
gs=$(sum_gpu acme late)
within "$gs" "$life" 5
ok $? "the job's GPU-seconds $gs within 0.5% of its ranks' lives ($life)"

# 39-51: a restarted agent waits for the running ranks. Two ranks of a job count through a
# kill -9 of the agent; rank 1 is stopped, so it registers with the new agent only 2.5 s
# after it started, when a minute boundary has passed.
# - rejoin_grace=5s: the new agent's first batch waits for every rank: every minute gets its
#   own record, none above the ranks' capacity, no fold.
# - rejoin_grace=0, rejoin_wait=600s (the default): the ledger holds rank 1's page open and
#   its process runs, so its job alone is not billed until it is back: the same result.
# - rejoin_grace=0, rejoin_wait=0: the boundary is billed with rank 0 alone and rank 1's time
#   since its cursor is folded into the first open minute (logged).
# Totals exact in every case.
for v in 5s:600s 0:600s 0:0; do
    grace=${v%%:*} wait=${v#*:}
    job=rejoin$grace-$wait
    { cat "$T/conf"; echo "rejoin_grace=$grace"; echo "rejoin_wait=$wait"; } >"$T/conf.g"
    for r in 0 1; do
        timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job "$job" \
            --cred "$(cred acme "$job")" --rank $r --nranks 2 --ngpus 1 --tick 20 --hold 11 \
            --rereg >"$T/$job.$r.out" 2>"$T/$job.$r.err" &
        eval "RJ$r=\$!"
        PIDS="$PIDS $!"
    done
    sleep 3.3
    RJ1C=$(pgrep -P "$RJ1")
    kill -STOP "$RJ1C"
    stop_agent KILL
    start_agent "$T/conf.g"
    ok $? "$job: a new agent after a kill -9, one rank of the job stopped" "$T/agent.log"
    sleep 2.5
    kill -CONT "$RJ1C"
    wait "$RJ0"; rc0=$?
    wait "$RJ1"; rc1=$?
    wait_minutes 2
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ] && grep -q "registered again" "$T/$job.1.err"
    ok $? "$job: both ranks registered again and ended" "$T/$job.1.err"
    ops=$(( $(final_of ops "$T/$job.0.out") + $(final_of ops "$T/$job.1.out") ))
    is "$(sum_ops acme "$job")" "$ops" "$job: the job's operations are exact"
    over=$(q "SELECT count(*) FROM ledger_records WHERE job = '$job' AND gpu_seconds > 4.001")
    folds=$(agent_folds "acme/$job" 1 | wc -l)
    if [ "$wait" = 0 ]; then
        [ "$over" -ge 1 ] && [ "$folds" -ge 1 ]
        ok $? "$job: rank 1's time was folded into one minute ($over above 2 GPUs x 2 s, $folds fold logged)" \
            "$T/agent.log"
    else
        [ "$over" = 0 ] && [ "$folds" = 0 ] && minutes_ok acme "$job" 5
        ok $? "$job: a record per minute ($(minutes_of acme "$job")), none above 2 GPUs x 2 s, no fold" \
            "$T/agent.log"
    fi
    if [ "$v" = 0:600s ]; then
        grep -q "acme/$job: page .* was open when the last agent stopped" "$T/agent.log" &&
            grep -q "acme/$job: page .* registered again" "$T/agent.log"
        ok $? "$job: the agent named the page it waited for, and its return" "$T/agent.log"
    fi
done

# 52-54: a rank whose process ends while no agent runs. The new agent finds its page open in
# the ledger and its process gone: it says so (that time is not known), does not wait for it,
# and deletes its cursor (nothing else ever would).
timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job dead --cred "$(cred acme dead)" \
    --ngpus 1 --tick 20 --hold 20 --rereg >"$T/r6.out" 2>"$T/r6.err" &
R6=$!
PIDS="$PIDS $R6"
sleep 3.3
R6C=$(pgrep -P "$R6")
stop_agent KILL
kill -9 "$R6C"
wait "$R6"
start_agent "$T/conf"
ok $? "a new agent after a kill -9, a rank killed while none ran" "$T/agent.log"
wait_minutes 2
grep -q "acme/dead: the process of page [^ ]*:$R6C:[^ ]* ended while no agent ran" "$T/agent.log"
ok $? "the new agent found the killed rank's page open in the ledger and its process gone" \
    "$T/agent.log"
is "$(q "SELECT count(*) FROM ledger_cursors WHERE key LIKE '%:$R6C:%'")" 0 \
    "its cursor was deleted"

# 55-58: a rank whose credential expires while it runs, through an agent restart. Its page is
# open in the ledger and its process runs, so the new agent lets it register again with the
# expired credential (it was refused as expired, and the rest of its job ran unmetered). A
# process that was not running under that page is still refused it.
EXP=$(cred acme expiring --expires 5)
timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job expiring --cred "$EXP" \
    --ngpus 1 --tick 20 --hold 10 --rereg >"$T/r9.out" 2>"$T/r9.err" &
R9=$!
PIDS="$PIDS $R9"
sleep 2.3
stop_agent KILL
sleep 4.7 # the credential expired (its expiry is in whole seconds)
start_agent "$T/conf"
ok $? "a new agent after a kill -9, a running rank's credential expired meanwhile" \
    "$T/agent.log"
timeout -s KILL 30 "$MC" --sock "$SOCK" --tenant acme --job expiring --cred "$EXP" \
    --ngpus 1 --hold 1 >"$T/r10.out" 2>&1
rc10=$?
wait "$R9"; rc9=$?
wait_minutes 2
[ "$rc9" = 0 ] && grep -q "registered again" "$T/r9.err" &&
    grep -q "acme/expiring: the credential expired while its rank ran" "$T/agent.log"
ok $? "the rank registered again with its credential expired (rc $rc9)" "$T/r9.err"
is "$(sum_ops acme expiring)" "$(final_of ops "$T/r9.out")" \
    "its job's operations are billed exactly"
[ "$rc10" = 1 ] && grep -q "expired" "$T/r10.out"
ok $? "a new process with that expired credential is refused (rc $rc10)" "$T/r10.out"

# 59-61: with allow_uncredentialed, a page without tenant is billed as tenant uid=N beside a
# credentialed job; neither holds the other back (a record of tenant "" was refused by the
# ledger and kept every later minute in memory)
stop_agent
base_conf "$T/conf_anon" "ledger_url=$URL" "ledger_key_file=$T/ledger.key" "minute_seconds=2" \
    "allow_uncredentialed=yes"
start_agent "$T/conf_anon"
timeout -s KILL 30 "$MC" --sock "$SOCK" --job anon --ngpus 1 --tick 20 --hold 3 \
    >"$T/r7.out" 2>&1 &
R7=$!
timeout -s KILL 30 "$MC" --sock "$SOCK" --tenant acme --job paid --cred "$(cred acme paid)" \
    --ngpus 1 --tick 20 --hold 3 >"$T/r8.out" 2>&1
wait "$R7"
wait_minutes 2
scrape >/dev/null
is "$(metric shoal_ledger_pending_batches):$(metric shoal_ledger_dropped_total)" "0:0" \
    "uncredentialed beside credentialed: no minute held back, nothing dropped" "$T/agent.log"
uid=$(id -u)
is "$(sum_ops "uid=$uid" anon):$(sum_ops acme paid)" \
    "$(final_of ops "$T/r7.out"):$(final_of ops "$T/r8.out")" \
    "the uncredentialed job is billed as tenant uid=$uid, the credentialed one as acme, exactly"
minutes_ok "uid=$uid" anon 1 && grep -q "of uid=$uid/anon registered" "$T/agent.log"
ok $? "uid=$uid/anon: a record per minute ($(minutes_of "uid=$uid" anon)), named so in the \
agent's registration line" "$T/agent.log"

# 62-66: long host names (cloud nodes) on one ledger. Two agents whose names share their first
# 32 characters: the second, restarted, does not take the first one's open page for its own
# (both keyed the name cut at 32, so it waited for or deleted the other host's cursors). A
# cursor keyed that old way is resumed from and then deleted: a rank is not billed twice
# across the upgrade.
H1=gke-prod-cluster-gpu-pool-a1b2c3d4-node1
H2=gke-prod-cluster-gpu-pool-a1b2c3d4-node2
stop_agent
{ cat "$T/conf"; echo "hostname=$H1"; echo "rejoin_grace=0"; } >"$T/conf.h1"
{ sed "s|^listen=.*|listen=$T/run2/shoald.sock|" "$T/conf"; echo "hostname=$H2"
  echo "rejoin_grace=0"; } >"$T/conf.h2"
start_agent "$T/conf.h1"
timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job longhost \
    --cred "$(cred acme longhost)" --ngpus 1 --tick 20 --hold 12 --rereg \
    >"$T/lh.out" 2>"$T/lh.err" &
LH=$!
PIDS="$PIDS $LH"
sleep 3.3
stop_agent KILL
K=$(q "SELECT key FROM ledger_cursors WHERE key LIKE 'gke-prod-%'")
case $K in
"gke-prod-cluster-gpu-po~"????????":"*) true ;;
*) false ;;
esac
ok $? "a host name of more than 32 characters is keyed by 23 of them and a hash: $K"
start_agent "$T/conf.h2"
sleep 1
stop_agent
grep -q "acme/longhost: page" "$T/agent.log"
ok $((! $?)) "an agent of another host with the same first 32 characters leaves the page alone" \
    "$T/agent.log"
LK="$(printf %.32s "$H1"):${K#*:}"
q "UPDATE ledger_cursors SET key = '$LK' WHERE key = '$K';
   UPDATE ledger_cursor_jobs SET key = '$LK' WHERE key = '$K'"
start_agent "$T/conf.h1"
wait "$LH"
wait_minutes 2
grep -q "page $K resumes from the cursor of its older key $LK" "$T/agent.log"
ok $? "the page, its cursor keyed the old way (the name cut at 32), resumes from that one" \
    "$T/agent.log"
is "$(sum_ops acme longhost)" "$(final_of ops "$T/lh.out")" \
    "... and its operations are billed exactly once"
is "$(q "SELECT count(*) FROM ledger_cursors WHERE key IN ('$K', '$LK')")" 0 \
    "the old cursor went with the first batch, the new one with the rank's end"

# 67-71: one job on two hosts and one ledger. The agents of node-a and node-b each bill their
# own rank: each writes its record of every minute the job lived, in that minute. (With one
# record per job and minute, the second agent's commit collided with the first's and moved
# its record after the job's last minute: the job's minutes drifted into the future.)
stop_agent
mkdir -p "$T/run3"
{ cat "$T/conf"; echo "hostname=node-a"; echo "rejoin_grace=0"; } >"$T/conf.na"
{ sed -e "s|^listen=.*|listen=$T/run3/shoald.sock|" -e "s|^state_dir=.*|state_dir=$T/state_b|" \
      "$T/conf"; echo "hostname=node-b"
  echo "rejoin_grace=0"; } >"$T/conf.nb"
rm -f "$T/ready.b"
"$SHOALD" -c "$T/conf.nb" --ready-file "$T/ready.b" >>"$T/agent_b.log" 2>&1 &
BPID=$!
PIDS="$PIDS $BPID"
start_agent "$T/conf.na"
i=0
while [ ! -s "$T/ready.b" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
SOCKB=$(sed -n 's/^sock=//p' "$T/ready.b")
[ -n "$SOCKB" ] && [ -n "$SOCK" ]
ok $? "two agents (node-a, node-b) share the ledger" "$T/agent_b.log"
t0=$(date +%s)
for h in a b; do
    s=$SOCK; [ $h = b ] && s=$SOCKB
    timeout -s KILL 60 "$MC" --sock "$s" --tenant acme --job twohost \
        --cred "$(cred acme twohost)" --rank $([ $h = a ] && echo 0 || echo 1) --nranks 2 \
        --ngpus 1 --tick 20 --hold 7 >"$T/th.$h.out" 2>"$T/th.$h.err" &
    eval "TH$h=\$!"
    PIDS="$PIDS $!"
done
wait "$THa"; rca=$?
wait "$THb"; rcb=$?
t1=$(date +%s)
wait_minutes 2
stop_agent
kill "$BPID" 2>/dev/null
i=0
while kill -0 "$BPID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
wait "$BPID" 2>/dev/null
is "$rca/$rcb/$agent_rc/$?" 0/0/0/0 \
    "a rank on each host counted for 7 s and ended; both agents stop"
hosts=$(q "SELECT host || ':' || count(*) || ':' || count(DISTINCT minute) || ':' ||
               min(minute) || ':' || max(minute) FROM ledger_records
           WHERE tenant = 'acme' AND job = 'twohost' GROUP BY host ORDER BY host" | tr '\n' ' ')
ha=$(echo "$hosts" | tr ' ' '\n' | grep '^node-a:')
hb=$(echo "$hosts" | tr ' ' '\n' | grep '^node-b:')
hosts_ok=1
for h in "$ha" "$hb"; do
    IFS=: read -r _ hn hnd hlo hhi <<EOF2
$h
EOF2
    # every minute once, none missing, none after the rank's end or before its start
    [ -n "$hn" ] && [ "$hn" = "$hnd" ] && [ "$hn" -ge 3 ] &&
        [ $(( (hhi - hlo) / 2 + 1 )) -eq "$hn" ] && [ "$hhi" -le "$t1" ] &&
        [ "$hlo" -ge $((t0 - 2)) ] || hosts_ok=0
done
is "$hosts_ok" 1 "each host has its own record of every minute of the job's life [$t0, $t1]: $hosts"
is "$(sum_ops acme twohost)" \
    "$(( $(final_of ops "$T/th.a.out") + $(final_of ops "$T/th.b.out") ))" \
    "the job's operations are both ranks' exactly"
is "$(usage_col acme twohost 4)" "$(q "SELECT count(DISTINCT minute) FROM ledger_records
                                       WHERE tenant = 'acme' AND job = 'twohost'")" \
    "shoal-bill counts the job's minutes once, not once per host"

# 68-72 (PostgreSQL): the server hangs (its processes stopped: a host that froze, a server
# stuck on its disk) while a rank counts. The agent must go on serving: a new rank registers
# within its 200 ms (the library's budget; 1 s here) and /metrics answers, the minutes are held
# and all written once the server runs again. (The ledger's calls ran on the agent's only
# thread: it waited on the hung server for ever, registrations timed out, scrapes hung.)
if [ "$mode" = pg ]; then
    stop_agent
    start_agent "$T/conf.na"
    ok $? "an agent starts for the hung-server case" "$T/agent.log"
    timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job hung --cred "$(cred acme hung)" \
        --ngpus 1 --tick 20 --hold 9 >"$T/hg.out" 2>"$T/hg.err" &
    HG=$!
    PIDS="$PIDS $HG"
    sleep 1
    PGM=$(head -n 1 "$PGT/pg/postmaster.pid")
    PGPIDS="$PGM $(pgrep -P "$PGM" | tr '\n' ' ')"
    # never leave the server stopped: its cleanup (pg_ctl stop) could not end it
    CLEANUP_HOOK="kill -CONT $PGPIDS 2>/dev/null; $CLEANUP_HOOK"
    kill -STOP $PGPIDS
    wait_minutes 1
    t0=$(date +%s%N)
    mc --tenant acme --job hung2 --cred "$(cred acme hung2)"
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    [ "$rc:$(status_of)" = "0:0" ] && [ "$ms" -lt 1000 ]
    ok $? "with the server hung, a rank registers in ${ms} ms (status $rc:$(status_of))" \
        "$T/mc.err"
    t0=$(date +%s%N)
    code=$(scrape)
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    [ "$code" = 200 ] && [ "$ms" -lt 1000 ] && [ "$(metric shoal_ledger_pending_batches)" -ge 1 ]
    ok $? "and /metrics answers in ${ms} ms (HTTP $code), $(metric shoal_ledger_pending_batches) \
minutes held"
    kill -CONT $PGPIDS
    wait "$HG"
    wait_minutes 2
    sleep 1
    scrape >/dev/null
    is "$(metric shoal_ledger_pending_batches)" 0 "once it runs again every held minute is written"
    is "$(sum_ops acme hung)" "$(final_of ops "$T/hg.out")" \
        "the operations of the rank that counted through the hang are exact"
    minutes_ok acme hung 4
    ok $? "its minutes ($(minutes_of acme hung)) have no gap, none twice"
fi

# 68-75 (74-81 with PostgreSQL): the database is down (not slow) when the agent stops. The
# minutes it holds, among them the last ones of a rank that ended (in no cursor: no later
# agent could bill them from the ledger), go to the spool, STATE_DIR/ledger.spool (mode
# 0600); the next agent, the database up, writes them at its start, exactly once, before it
# reads a cursor. A spool put back after it was written bills nothing twice; one altered or
# a symbolic link is refused and kept aside. (The minutes were dropped, while the log said
# that the next agent bills them.)
stop_agent
SPOOL=$T/state/ledger.spool
start_agent "$T/conf"
ok $? "an agent starts for the database down at its stop" "$T/agent.log"
timeout -s KILL 30 "$MC" --sock "$SOCK" --tenant acme --job spooled \
    --cred "$(cred acme spooled)" --ngpus 1 --tick 20 --hold 5 >"$T/sp.out" 2>&1 &
SP=$!
PIDS="$PIDS $SP"
sleep 1
db_down
wait "$SP"
wait_minutes 2
scrape >/dev/null
held=$(metric shoal_ledger_pending_batches)
stop_agent
[ "$agent_rc" = 0 ] && [ "${held:-0}" -ge 2 ] && [ -f "$SPOOL" ] && [ ! -L "$SPOOL" ] &&
    [ "$(stat -c %a "$SPOOL")" = 600 ] && grep -q "saved in $T/state/ledger.spool" "$T/agent.log"
ok $? "stopped with the database down and ${held:-no} minutes held: they are in the spool, \
mode 0600" "$T/agent.log"
cp -p "$SPOOL" "$T/spool.copy"
db_up
start_agent "$T/conf"
[ $? = 0 ] && [ ! -e "$SPOOL" ] && grep -q "the spooled minute .* is written" "$T/agent.log"
ok $? "the next agent writes the spooled minutes at its start and removes the spool" \
    "$T/agent.log"
is "$(sum_ops acme spooled):$(sum_cross acme spooled)" \
    "$(final_of ops "$T/sp.out"):$(final_of sent "$T/sp.out")" \
    "the rank's operations and bytes are billed exactly, its last minutes included"
minutes_ok acme spooled 3 &&
    [ "$(q "SELECT count(*) FROM ledger_cursor_jobs WHERE job = 'spooled'")" = 0 ]
ok $? "its minutes ($(minutes_of acme spooled)) have no gap, none twice; its cursor is deleted"
stop_agent
cp -p "$T/spool.copy" "$SPOOL"
start_agent "$T/conf"
[ $? = 0 ] && [ ! -e "$SPOOL" ] &&
    [ "$(sum_ops acme spooled)" = "$(final_of ops "$T/sp.out")" ] && minutes_ok acme spooled 3
ok $? "the same spool put back is taken as written: nothing billed twice \
($(minutes_of acme spooled))" "$T/agent.log"
stop_agent
cp -p "$T/spool.copy" "$SPOOL"
printf 'X' | dd of="$SPOOL" bs=1 seek=200 conv=notrunc 2>/dev/null
start_agent "$T/conf"
[ $? = 0 ] && [ ! -e "$SPOOL" ] && ls "$SPOOL".refused-* >/dev/null 2>&1 &&
    grep -q "does not verify with the ledger's key" "$T/agent.log" &&
    [ "$(sum_ops acme spooled)" = "$(final_of ops "$T/sp.out")" ]
ok $? "an altered spool is refused, kept aside and not billed from" "$T/agent.log"
stop_agent
rm -f "$SPOOL".refused-*
ln -s "$T/spool.copy" "$SPOOL"
start_agent "$T/conf"
[ $? = 0 ] && [ ! -e "$SPOOL" ] && [ -L "$(ls -d "$SPOOL".refused-* | head -n 1)" ] &&
    grep -q "ledger.spool cannot be opened (a symbolic link)" "$T/agent.log" &&
    [ "$(sum_ops acme spooled)" = "$(final_of ops "$T/sp.out")" ]
ok $? "a spool that is a symbolic link is refused, the link kept aside" "$T/agent.log"

# 76-77 (82-83 with PostgreSQL): the chain
timeout -s KILL 30 "$BILL" --ledger "$URL" --key-file "$T/ledger.key" verify >"$T/verify.out" 2>&1
ok $? "shoal-bill verify: the HMAC chain is intact" "$T/verify.out"
is "$(q "SELECT count(*) - count(DISTINCT tenant || '/' || job || '/' || host || '/' || minute)
         FROM ledger_records")" 0 "no (tenant, job, host, minute) twice in the whole ledger"

# 84-86 (PostgreSQL): the server hangs for good and a standby takes its place on the same
# socket (a failover). The agent's connection to the hung one gets no answer: it is dropped
# after 35 s (the ledger's own deadline), and the held minutes go to the standby. (libpq
# waited on the hung server for ever: none was written again until the agent restarted.)
if [ "$mode" = pg ]; then
    PGT2=$(ledger_tmpdir test_shoald_pg2) || exit 1
    as_user timeout -s KILL 120 "$PGBIN/initdb" -D "$PGT2/pg" -A trust -U shoal -E UTF8 \
        --no-sync >"$PGT2/initdb.log" 2>&1
    ok $? "a standby cluster is made" "$PGT2/initdb.log"
    timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job failover \
        --cred "$(cred acme failover)" --ngpus 1 --tick 20 --hold 6 >"$T/fo.out" 2>"$T/fo.err" &
    FO=$!
    PIDS="$PIDS $FO"
    sleep 1
    PGM=$(head -n 1 "$PGT/pg/postmaster.pid")
    PGPIDS="$PGM $(pgrep -P "$PGM" | tr '\n' ' ')"
    CLEANUP_HOOK="kill -CONT $PGPIDS 2>/dev/null; as_user \"$PGBIN/pg_ctl\" -D \"$PGT2/pg\" \
-m immediate -w -t 30 stop >/dev/null 2>&1; rm -rf \"$PGT2\"; $CLEANUP_HOOK"
    kill -STOP $PGPIDS
    wait_minutes 1
    rm -f "$PGT/.s.PGSQL.$PG_PORT" "$PGT/.s.PGSQL.$PG_PORT.lock"
    as_user timeout -s KILL 90 "$PGBIN/pg_ctl" -D "$PGT2/pg" -l "$PGT2/pg.log" -w -t 60 \
        -o "-k $PGT -p $PG_PORT -c listen_addresses='' -c fsync=off" start >/dev/null &&
        as_user timeout -s KILL 60 "$PGBIN/createdb" -h "$PGT" -p "$PG_PORT" -U shoal \
            shoal_ledger
    ok $? "the standby runs on the hung server's socket" "$PGT2/pg.log"
    wait "$FO"
    t0=$(date +%s)
    i=0
    while [ $i -lt 100 ]; do
        scrape >/dev/null
        [ "$(metric shoal_ledger_pending_batches)" = 0 ] &&
            [ "$(q "SELECT count(*) FROM ledger_records WHERE job = 'failover'")" -gt 0 ] &&
            break
        sleep 1; i=$((i + 1))
    done
    [ $i -lt 100 ]
    ok $? "the held minutes are on the standby $(( $(date +%s) - t0 )) s after it came \
($(metric shoal_ledger_pending_batches) held)" "$T/agent.log"
fi
done_testing
