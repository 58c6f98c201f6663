#!/bin/sh
# TAP test of shoald's billing minute (minute_seconds=2) against the test ledger (ledger.h
# over a text file, tests/agent/ledger_mem.c): per (tenant, job, minute) one record whose sums
# equal the counters the rank wrote; allocated GPU-seconds within 0.5% of GPUs x the rank's
# lifetime (the page's creation to its end, as the rank measured it); a ledger that goes
# down holds the minutes in memory and gets them all when it
# comes back; a kill -9 of the agent in the middle of a job, then a new agent that the rank
# registers with again: no minute lost or doubled, totals exact; failed ranks per cause.
. "$(dirname "$0")/agent_lib.sh"
need_agent
make_keys || { echo "1..0 # SKIP cannot make keys"; exit 0; }
L="$T/ledger.txt"
base_conf "$T/conf" "ledger_url=mem://$L" "ledger_key_file=$T/ledger.key" "minute_seconds=2"

sum_col() { # sum_col TENANT JOB COLUMN: the sum of a record field over the ledger
    awk -v t="$1" -v j="$2" -v c="$3" '$1 == "R" && $2 == t && $3 == j { s += $c }
        END { printf "%.6f\n", s }' "$L"
}
int_col() { sum_col "$@" | sed 's/\..*//'; }
dup_minutes() {
    awk '$1 == "R" { k = $2 " " $3 " " $5; if (seen[k]++) d++ } END { print d + 0 }' "$L"
}
final_of() { # final_of ops|sent CLIENT-OUTPUT: the rank's final counter
    sed -n "s/^final .*$1=\\([0-9]*\\).*/\\1/p" "$2" | head -n 1
}
wait_minutes() { # wait_minutes N: N minute boundaries later (and a little)
    sleep $(( $1 * 2 ))
    sleep 0.5
}

start_agent "$T/conf"
ok $? "the agent starts with a 2 s minute and the test ledger" "$T/agent.log"

# 2-6: a rank with 2 GPUs that lives about 6 s and counts all the while
ACME=$(cred acme train)
timeout -s KILL 30 "$MC" --sock "$SOCK" --tenant acme --job train --cred "$ACME" --ngpus 2 \
    --tick 20 --hold 6 >"$T/r1.out" 2>&1
rc=$?
is "$rc" 0 "the rank registered, counted for 6 s and ended"
wait_minutes 2
ops=$(final_of ops "$T/r1.out")
sent=$(final_of sent "$T/r1.out")
is "$(int_col acme train 9)" "$ops" "the ledger's operations equal the rank's ($ops)"
is "$(int_col acme train 8)" "$sent" "the ledger's cross-host bytes equal the rank's ($sent)"
life=$(awk -v l="$(final_of life_ns "$T/r1.out")" 'BEGIN { printf "%.4f", 2 * l / 1e9 }')
gs=$(sum_col acme train 6)
awk -v g="$gs" -v l="$life" 'BEGIN { d = g - l; if (d < 0) d = -d; exit !(d <= 0.005 * l) }'
ok $? "allocated GPU-seconds $gs within 0.5% of 2 GPUs x the lifetime ($life)"
nrec=$(awk '$1 == "R" && $2 == "acme" && $3 == "train"' "$L" | wc -l)
[ "$nrec" -ge 3 ] && [ "$(dup_minutes)" = 0 ] &&
    awk '$1 == "R" && $2 == "acme" && $3 == "train" && $4 != "reserved" { exit 1 }' "$L"
ok $? "one record per minute ($nrec), none twice, class reserved" "$L"

# 7-11: the ledger goes down for 3 minutes while a rank counts; nothing is lost
BETA=$(cred beta infer)
timeout -s KILL 40 "$MC" --sock "$SOCK" --tenant beta --job infer --cred "$BETA" --ngpus 1 \
    --tick 20 --hold 9 >"$T/r2.out" 2>&1 &
R2=$!
PIDS="$PIDS $R2"
sleep 1
: >"$L.down"
wait_minutes 3
scrape >/dev/null
pend=$(metric shoal_ledger_pending_batches)
fails=$(metric shoal_ledger_commit_failures_total)
[ "${pend:-0}" -ge 2 ] && [ "${fails:-0}" -ge 1 ]
ok $? "with the ledger down, minutes are held ($pend batches, $fails failed commits)"
grep -q "minutes held in memory" "$T/agent.log"
ok $? "the agent says so in its log" "$T/agent.log"
rm -f "$L.down"
wait "$R2"
wait_minutes 2
sleep 1
scrape >/dev/null
is "$(metric shoal_ledger_pending_batches)" 0 "when it comes back every held minute is written"
is "$(int_col beta infer 9)" "$(final_of ops "$T/r2.out")" "beta's operations are exact"
is "$(int_col beta infer 8)" "$(final_of sent "$T/r2.out")" "beta's bytes are exact"
awk '$1 == "R" && $2 == "beta" && $4 != "spot" { exit 1 }' "$L"
ok $? "beta's minutes are billed spot (its tenant class)" "$L"

# 13-18: kill -9 of the agent in the middle of a job; a new agent; the rank registers again
timeout -s KILL 60 "$MC" --sock "$SOCK" --tenant acme --job crash --cred "$(cred acme crash)" \
    --ngpus 4 --tick 20 --hold 11 --rereg >"$T/r3.out" 2>"$T/r3.err" &
R3=$!
PIDS="$PIDS $R3"
sleep 3.3
stop_agent KILL
sleep 1.5
start_agent "$T/conf"
ok $? "a new agent starts on the socket the killed one left" "$T/agent.log"
wait "$R3"
grep -q "registered again" "$T/r3.err"
ok $? "the rank registered its page again with the new agent" "$T/r3.err"
grep -q "resumes from its ledger cursor" "$T/agent.log"
ok $? "the new agent took the page's cursor from the ledger" "$T/agent.log"
wait_minutes 2
is "$(int_col acme crash 9)" "$(final_of ops "$T/r3.out")" \
    "operations across the crash are exact (none lost, none twice)"
is "$(int_col acme crash 8)" "$(final_of sent "$T/r3.out")" "bytes across the crash are exact"
is "$(dup_minutes)" 0 "no minute is in the ledger twice"
life=$(awk -v l="$(final_of life_ns "$T/r3.out")" 'BEGIN { printf "%.4f", 4 * l / 1e9 }')
gs=$(sum_col acme crash 6)
awk -v g="$gs" -v l="$life" 'BEGIN { d = g - l; if (d < 0) d = -d; exit !(d <= 0.005 * l) }'
ok $? "GPU-seconds across the crash $gs within 0.5% of 4 GPUs x the lifetime ($life)"

# 20-21: failures per cause
mc --tenant acme --job fails --cred "$(cred acme fails)" --set aborts=1
mc --tenant acme --job fails --cred "$(cred acme fails)" --rank 0 --set peer_failures=3
wait_minutes 2
is "$(int_col acme fails 12)" 1 "a rank that aborted is a failure the tenant caused"
is "$(int_col acme fails 11)" 1 "a rank that ended after peer failures is the platform's"
stop_agent
is "$agent_rc" 0 "the agent stops cleanly"
done_testing
