#!/bin/sh
# TAP test of the agent's own view of a rank's GPUs for billing (gpu_device_prefix): billing
# trusted the GPUs a rank declares (SHOAL_METER_GPUS, CUDA_VISIBLE_DEVICES), so a job that
# declared none paid no GPU-seconds. The agent counts the distinct device files PREFIX<N> a
# rank's process holds open (here files in the test's directory that the ranks open) and
# bills the most of that and what the rank declares: declared none holding nvidia0 (twice)
# and nvidia1 is billed 2 GPUs x its life, declared 2 holding 1 is billed 2, nvidiactl and
# nvidia-uvm count for nothing; the agent warns once per job that holds more than it declares.
. "$(dirname "$0")/agent_lib.sh"
need_agent
BILL="$top_builddir/shoal-bill"
[ -x "$BILL" ] || { echo "1..0 # SKIP shoal-bill not built (no SQLite)"; exit 0; }
make_keys || { echo "1..0 # SKIP cannot make keys"; exit 0; }
mkdir "$T/db" "$T/dev" || exit 1
for f in nvidia0 nvidia1 nvidia2 nvidiactl nvidia-uvm; do : >"$T/dev/$f"; done
URL="sqlite://$T/db/ledger.db"
base_conf "$T/conf" "ledger_url=$URL" "ledger_key_file=$T/ledger.key" "minute_seconds=2" \
    "gpu_device_prefix=$T/dev/nvidia"

sum_gpu() { # sum_gpu JOB: acme's allocated GPU-seconds of JOB (shoal-bill usage --csv)
    timeout -s KILL 30 "$BILL" --ledger "$URL" usage --csv --tenant acme --job "$1" \
        2>>"$T/bill.err" | awk -F, 'NR == 2 { print $5 }'
}
final_life() { sed -n 's/^final .*life_ns=\([0-9]*\).*/\1/p' "$1" | head -n 1; }
within() { # within GOT WANT PERMILLE
    awk -v g="$1" -v l="$2" -v p="$3" 'BEGIN { d = g - l; if (d < 0) d = -d;
        exit !(l > 0 && d <= p / 1000 * l) }'
}
rank() { # rank JOB NGPUS OUT: a rank of acme/JOB that counts for 5 s (descriptors: the caller)
    timeout -s KILL 30 "$MC" --sock "$SOCK" --tenant acme --job "$1" \
        --cred "$(cred acme "$1")" --ngpus "$2" --tick 50 --hold 5 >"$3" 2>&1
}

start_agent "$T/conf"
ok $? "the agent starts with gpu_device_prefix in the test's directory" "$T/agent.log"

# three ranks at once: each holds its device files open for its whole life
rank none 0 "$T/none.out" 5<"$T/dev/nvidia0" 6<"$T/dev/nvidia0" 7<"$T/dev/nvidia1" \
    8<"$T/dev/nvidiactl" 9<"$T/dev/nvidia-uvm" &
R1=$!
rank decl2 2 "$T/decl2.out" 7<"$T/dev/nvidia0" &
R2=$!
rank ctl 0 "$T/ctl.out" 8<"$T/dev/nvidiactl" 9<"$T/dev/nvidia-uvm" &
R3=$!
PIDS="$PIDS $R1 $R2 $R3"
wait "$R1"; r1=$?
wait "$R2"; r2=$?
wait "$R3"; r3=$?
[ "$r1" = 0 ] && [ "$r2" = 0 ] && [ "$r3" = 0 ]
ok $? "the three ranks registered, counted for 5 s and ended ($r1 $r2 $r3)" "$T/none.out"
sleep 4.5

life=$(awk -v l="$(final_life "$T/none.out")" 'BEGIN { printf "%.4f", 2 * l / 1e9 }')
gs=$(sum_gpu none)
within "$gs" "$life" 5
ok $? "declared none, holds nvidia0 (twice) and nvidia1: $gs GPU-seconds within 0.5% of \
2 GPUs x its life ($life)" "$T/agent.log"
life=$(awk -v l="$(final_life "$T/decl2.out")" 'BEGIN { printf "%.4f", 2 * l / 1e9 }')
gs=$(sum_gpu decl2)
within "$gs" "$life" 5
ok $? "declared 2, holds nvidia0: $gs GPU-seconds within 0.5% of 2 GPUs x its life ($life)"
gs=$(sum_gpu ctl)
awk -v g="$gs" 'BEGIN { exit !(g != "" && g + 0 == 0) }'
ok $? "nvidiactl and nvidia-uvm are not GPUs: ${gs:-no} GPU-seconds"
is "$(grep -c 'acme/none: rank 0 (pid [0-9]*) holds 2 GPU device files' "$T/agent.log")" 1 \
    "the agent warns once that acme/none holds 2 GPUs and declares 0"
is "$(grep -c 'acme/decl2: .*GPU device\|acme/ctl: .*GPU device' "$T/agent.log" | tr -d ' ')" 0 \
    "no warning for the jobs that hold no more than they declare"
stop_agent
done_testing
