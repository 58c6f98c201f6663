#!/bin/bash
# perf/gpu_share.sh: AllReduce on device buffers when the ranks share one GPU, for the device
# machine, after perf/gpu_check.sh built in build-gpu (GPU_CHECK_BUILD). Several processes
# on one GPU get it in time slices (one context at a time) unless NVIDIA's MPS server
# joins them into one; this script measures the same AllReduce (tests/gpu/gpu_bench) with
# one rank and with two, stream-ordered and blocking, without MPS and, where
# nvidia-cuda-mps-control exists, under MPS; and examples/cuda_overlap both ways; first, the
# probe's part 4 (what a held stream stalls in its own process: holder/op:1 = the op finished
# while the holder was held, 0 = it waited for it). Prepare:
#   run(command="GPU_CHECK_BUILD_ONLY=1 bash perf/gpu_check.sh; bash perf/gpu_share.sh",
#       carry=[as perf/gpu_check.sh says])
# Output: one line per case, then a table; logs in $OUT/gpu_share.tgz when $OUT is set.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
B=${GPU_CHECK_BUILD:-$src/build-gpu}
logs=/tmp/gpu_share
rm -rf "$logs" && mkdir -p "$logs"
t_start=$(date +%s)
declare -A R
pack() { [ -n "${OUT:-}" ] && tar -C /tmp -czf "$OUT/gpu_share.tgz" gpu_share; }
trap 'pack; [ -n "${mps:-}" ] && echo quit | nvidia-cuda-mps-control' EXIT

say() { echo "== $(($(date +%s) - t_start))s: $*"; }
# bench NAME NRANKS VAR=VALUE...: gpu_bench allreduce 1, 16 and 256 MiB; R[NAME] = busbw list
bench() {
    local name=$1 n=$2 xs=""
    shift 2
    for v in "$@"; do xs="$xs -x $v"; done
    # shellcheck disable=SC2086
    timeout -k 5 90 "$B/shoalrun" -n "$n" $xs "$B/tests/gpu/gpu_bench" allreduce 1 16 256 \
        >"$logs/$name.log" 2>&1
    say "$name: rc $? ($(tail -n 1 "$logs/$name.log" | cut -c1-140))"
    R[$name]=$(awk '/what=allreduce_dev/ {for (i=1;i<=NF;i++) if ($i ~ /^(bytes|time_us)=/) {split($i,a,"="); printf "%s", (a[1]=="bytes" ? a[2]/1048576 "MiB:" : a[2] "us ")}}' "$logs/$name.log")
}
# overlap NAME [VAR=VALUE]: examples/cuda_overlap, 2 ranks
overlap() {
    local xs=""
    [ $# -gt 1 ] && xs="-x $2"
    # shellcheck disable=SC2086
    timeout -k 5 90 "$B/shoalrun" -n 2 $xs "$B/examples/cuda_overlap" 64 >"$logs/$1.log" 2>&1
    say "$1: rc $? ($(tail -n 1 "$logs/$1.log" | cut -c1-160))"
    R[$1]=$(sed -n 's/.*compute \([0-9.]*\) ms, allreduce \([0-9.]*\) ms, both \([0-9.]*\) ms, overlap efficiency \([0-9.]*\).*/compute \1 ms, allreduce \2 ms, both \3 ms: \4/p' "$logs/$1.log")
}

# probe NAME ARG: perf/gpu_share_probe.cu's part ARG; R[NAME] = its medians
probe() {
    timeout -k 5 60 /tmp/gpu_share_probe "$2" >"$logs/$1.log" 2>&1
    say "$1: rc $?"
    cat "$logs/$1.log"
    R[$1]=$(awk '/^probe/ {for (i=1;i<=NF;i++) if ($i ~ /^(what|median_us|p90_us)=/) {split($i,a,"="); printf "%s%s", a[2], (a[1]=="p90_us" ? "; " : " ")}}' "$logs/$1.log")
}

say "$(nvidia-smi --query-gpu=name,compute_mode --format=csv,noheader 2>/dev/null)"
nvcc -arch=sm_90 -o /tmp/gpu_share_probe "$src/perf/gpu_share_probe.cu" -lcuda >"$logs/probe_build.log" 2>&1 ||
    say "probe build failed: $(tail -n 3 "$logs/probe_build.log")"
probe probe_legacy legacy
R[probe_legacy]=$(awk '/what=legacy_hold/ {split($3,h,"="); split($4,o,"="); split($5,d,"="); printf "%s/%s:%s ", h[2], o[2], d[2]}' "$logs/probe_legacy.log")
probe probe_roundtrip roundtrip
probe probe_other other
probe probe_pingpong pingpong
probe probe_handover handover
bench n1_stream 1
bench n1_block 1 GPU_BENCH_BLOCKING=1
bench n2_stream 2
bench n2_block 2 GPU_BENCH_BLOCKING=1
bench n2_hostfn 2 SHOAL_CUDA_SYNC=hostfn
bench n2_host 2 SHOAL_CUDA_SYNC=host
# waits that never sleep (a yield loop of up to seconds): whether the 1 ms sleeps count
bench n2_stream_spin 2 SHOAL_SPIN_COUNT=10000000 SHOAL_SPIN_ADAPT=0
bench n2_staging_block 2 SHOAL_CUDA_BACKEND=staging GPU_BENCH_BLOCKING=1
overlap overlap
overlap overlap_host SHOAL_CUDA_SYNC=host
# SHOAL_CUDA_SYNC=host's correctness on the GPU: test_gpu_coll's sweep and group, 2 ranks
timeout -k 5 120 "$B/shoalrun" -n 2 -x SHOAL_CUDA_SYNC=host -x GPU_EXPECT_SYNC=host \
    "$B/tests/gpu/test_gpu_coll" >"$logs/coll_host.log" 2>&1
rc=$?
R[coll_host]="$(grep -c '^\[0\] ok ' "$logs/coll_host.log") ok, $(grep -c '^\[0\] not ok ' "$logs/coll_host.log") not ok, rc $rc"
say "coll_host: ${R[coll_host]}"
if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        mps=1
        say "MPS server started"
        probe mps_probe_roundtrip roundtrip
        probe mps_probe_other other
        probe mps_probe_pingpong pingpong
        probe mps_probe_handover handover
        bench mps_n2_stream 2
        bench mps_n2_block 2 GPU_BENCH_BLOCKING=1
        bench mps_n2_hostfn 2 SHOAL_CUDA_SYNC=hostfn
        bench mps_n2_host 2 SHOAL_CUDA_SYNC=host
        bench mps_n2_stream_spin 2 SHOAL_SPIN_COUNT=10000000 SHOAL_SPIN_ADAPT=0
        overlap mps_overlap
        echo quit | nvidia-cuda-mps-control
        mps=
        cp -r "$CUDA_MPS_LOG_DIRECTORY" "$logs/mps_log" 2>/dev/null
    else
        say "nvidia-cuda-mps-control -d failed"
    fi
else
    say "no nvidia-cuda-mps-control"
fi

echo
echo "gpu_share summary ($(($(date +%s) - t_start)) s): time per AllReduce of 1, 16, 256 MiB"
for k in n1_stream n1_block n2_stream n2_block n2_hostfn n2_host n2_stream_spin \
    n2_staging_block mps_n2_stream mps_n2_block mps_n2_hostfn mps_n2_host mps_n2_stream_spin \
    probe_roundtrip probe_other probe_pingpong mps_probe_roundtrip mps_probe_other \
    mps_probe_pingpong probe_handover mps_probe_handover probe_legacy; do
    printf '%-20s %s\n' "$k" "${R[$k]:-n/a}"
done
printf '%-20s %s\n' "overlap" "${R[overlap]:-n/a}"
printf '%-20s %s\n' "overlap, sync host" "${R[overlap_host]:-n/a}"
printf '%-20s %s\n' "test_gpu_coll host" "${R[coll_host]:-n/a}"
printf '%-20s %s\n' "overlap under MPS" "${R[mps_overlap]:-n/a}"
