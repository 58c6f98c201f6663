#!/bin/sh
# The NCCL delegate's bytes from the library to the node agent, on the emulations (no GPU, no
# NCCL here: libfakecuda for the driver, libfakenccl for NCCL, tests/gpu/fakenccl.c): shoald
# (private socket, a free loopback HTTP port, no ledger) and test_gpu_coll --nccl under shoalrun
# on 2 and on 4 ranks (one emulated device each, SHOAL_CUDA_BACKEND=nccl), registered with the
# agent (SHOAL_AGENT_REQUIRED=1, tenant acme's credential). Checked: the job passes its own
# checks (every AllReduce exact, the nccl counters of shoal_comm_stats equal to the
# ring-equivalent bytes); the agent's /metrics has transport "nccl", same host, sent and
# received each equal to the ranks' own totals (the job prints their sums over ranks), and no
# nccl series for other hosts.
# Environment: top_builddir (make check).
. "$(dirname "$0")/../agent/agent_lib.sh"
need_agent
SHOALRUN="$top_builddir/shoalrun"
PROG="$top_builddir/tests/gpu/test_gpu_coll"
CUDA_LIB="$top_builddir/tests/gpu/.libs/libfakecuda.so"
NCCL_LIB="$top_builddir/tests/gpu/.libs/libfakenccl.so"
if [ ! -x "$SHOALRUN" ] || [ ! -x "$PROG" ] || [ ! -r "$CUDA_LIB" ] || [ ! -r "$NCCL_LIB" ]; then
    echo "1..0 # SKIP shoalrun, test_gpu_coll, libfakecuda or libfakenccl not built"
    exit 0
fi
case $CUDA_LIB in /*) ;; *) CUDA_LIB=$(pwd)/$CUDA_LIB ;; esac
case $NCCL_LIB in /*) ;; *) NCCL_LIB=$(pwd)/$NCCL_LIB ;; esac
make_keys || { echo "1..0 # SKIP cannot make keys"; exit 0; }
unset SHOAL_TRANSPORT SHOAL_ALGO SHOAL_AGENT SHOAL_AGENT_REQUIRED SHOAL_CUDA_BACKEND
base_conf "$T/conf"
start_agent "$T/conf"
ok $? "shoald starts (HTTP on $HTTP)" "$T/agent.log"

for nr in 2 4; do
    J=ncclj$nr
    cred acme "$J" >"$T/$J.cred" && chmod 600 "$T/$J.cred"
    SHOAL_CREDENTIAL_FILE=$T/$J.cred timeout -s KILL 200 "$SHOALRUN" --no-prefix --timeout 180 \
        -n "$nr" -x SHOAL_TIMEOUT_MS=60000 -x "SHOAL_AGENT=$SOCK" -x SHOAL_AGENT_REQUIRED=1 \
        -x "SHOAL_CREDENTIAL_FILE=$T/$J.cred" -x "SHOAL_CUDA_LIBCUDA=$CUDA_LIB" \
        -x SHOAL_CUDA_BACKEND=nccl -x "SHOAL_CUDA_LIBNCCL=$NCCL_LIB" -x GPU_DEVICE_PER_RANK=1 \
        -x "FAKECUDA_DEVICES=$nr" "$PROG" --nccl >"$T/$J.out" 2>"$T/$J.err"
    rc=$?
    [ "$rc" -eq 0 ] && grep -q '^ok ' "$T/$J.out" && ! grep -q '^not ok' "$T/$J.out"
    ok $? "$nr ranks: the job through the NCCL delegate passes its checks (rc $rc)" "$T/$J.err"
    # "# metering: ... sums over ranks: cuda_ipc sent A recv B, nccl sent S recv R; ..."
    sent=$(sed -n 's/^# metering: .* nccl sent \([0-9]*\) recv \([0-9]*\);.*/\1/p' "$T/$J.out")
    recv=$(sed -n 's/^# metering: .* nccl sent \([0-9]*\) recv \([0-9]*\);.*/\2/p' "$T/$J.out")
    [ -n "$sent" ] && [ "$sent" -gt 0 ]
    ok $? "$nr ranks: the ranks counted nccl bytes (sum over ranks: ${sent:-none})" "$T/$J.out"
    scrape >/dev/null
    NC="shoal_payload_bytes_total{tenant=\"acme\",shoal_job=\"$J\",transport=\"nccl\""
    is "$(metric "$NC,locality=\"same_host\",direction=\"sent\"}"):$(metric \
        "$NC,locality=\"same_host\",direction=\"received\"}")" "$sent:$recv" \
        "$nr ranks: /metrics has the ranks' own nccl totals, sent and received (same host)"
    ! grep -q "shoal_job=\"$J\",transport=\"nccl\",locality=\"other_host\"" "$T/scrape"
    ok $? "$nr ranks: no nccl series for other hosts"
done
stop_agent
done_testing
