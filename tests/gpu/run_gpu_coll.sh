#!/bin/sh
# Runs tests/gpu/test_gpu_coll under shoalrun for GPU_NRANKS (default "1 2 4") ranks, all on
# the first GPU, and for a few backend variants; merges rank 0's TAP lines into one stream
# prefixed by the configuration (GPU_LABEL, then the variant). Then two kill cases (a rank
# dies with a stream-ordered AllReduce in flight). Prints "1..0 # SKIP ..." when no CUDA
# driver/GPU is usable.
# Environment: top_builddir (make check), GPU_NRANKS, GPU_TIMEOUT (s per run, default 300),
# GPU_NCCL_LIB (a libnccl: also runs test_gpu_coll --nccl through the NCCL delegate),
# GPU_KILL_TIMEOUT_MS (the kill cases' SHOAL_TIMEOUT_MS, default 5000).
. "$(dirname "$0")/../tap.sh"
builddir=${top_builddir:-.}
shoalrun=$builddir/shoalrun
prog=$builddir/tests/gpu/test_gpu_coll
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_gpu.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$prog" ]; then
    echo "1..0 # SKIP $shoalrun or $prog not built"
    exit 0
fi
probe=$(SHOAL_DEBUG=NONE "$prog" --probe 2>/dev/null)
case $probe in
"1..0"*) echo "$probe"; exit 0 ;;
esac

run() {
    label=$1
    n=$2
    shift 2
    xs=""
    args=""
    for v in SHOAL_TIMEOUT_MS=60000 "$@"; do
        case $v in
        GPU_ARGS=*) args=${v#GPU_ARGS=} ;;
        *) xs="$xs -x $v" ;;
        esac
    done
    # shellcheck disable=SC2086
    "$shoalrun" --no-prefix --timeout "${GPU_TIMEOUT:-300}" -n "$n" $xs "$prog" $args >"$tmp/out" \
        2>"$tmp/err"
    rc=$?
    while IFS= read -r line; do
        case $line in
        "ok "*|"not ok "*)
            n_tap=$((n_tap + 1))
            echo "${line%% [0-9]*} $n_tap - $label: ${line#* - }"
            ;;
        "Bail out!"*)
            n_tap=$((n_tap + 1))
            echo "not ok $n_tap - $label: ${line#Bail out!}"
            ;;
        esac
    done <"$tmp/out"
    if [ "$rc" -ne 0 ]; then
        sed -e 's/^/# stderr: /' "$tmp/err" | head -n 40
    fi
    n_tap=$((n_tap + 1))
    if [ "$rc" -eq 0 ]; then
        echo "ok $n_tap - $label: shoalrun exited 0"
    else
        echo "not ok $n_tap - $label: shoalrun exited $rc"
    fi
}

# The kill cases' SHOAL_TIMEOUT_MS, which also bounds their init (GPU_KILL_TIMEOUT_MS: more
# for a ThreadSanitizer build sharing 2 cores, as .ci/run gives it).
kill_ms=${GPU_KILL_TIMEOUT_MS:-5000}

# kill_case LABEL NRANKS VAR=VALUE...: test_gpu_coll --kill (the last rank SIGKILLs itself
# with a stream-ordered AllReduce in flight); every survivor's stream must be released and
# its communicator fail with SHOAL_ERR_PEER_FAILED naming the victim within the timeout.
kill_case() {
    label=$1
    n=$2
    shift 2
    xs=""
    for v in SHOAL_TIMEOUT_MS=$kill_ms "$@"; do
        xs="$xs -x $v"
    done
    # shellcheck disable=SC2086
    "$shoalrun" --no-prefix --grace 30 --timeout 90 -n "$n" $xs "$prog" --kill >"$tmp/out" \
        2>"$tmp/err"
    rc=$?
    sed -e 's/^/# /' "$tmp/out"
    if [ "$rc" -eq 137 ]; then
        tap OK "$label: the victim died of SIGKILL (shoalrun exit 137)"
    else
        tap FAIL "$label: shoalrun exited $rc, expected 137"
        sed -e 's/^/# stderr: /' "$tmp/err" | head -n 40
    fi
    r=0
    while [ $r -lt $((n - 1)) ]; do
        line=$(grep "^survivor $r: " "$tmp/out" | head -n 1)
        ms=$(echo "$line" | sed -n 's/^survivor [0-9]*: status [A-Z_]* after \([0-9]*\) ms: .*/\1/p')
        case $line in
        *"status SHOAL_ERR_PEER_FAILED after"*"[victim not named]") ok=FAIL ;;
        *"status SHOAL_ERR_PEER_FAILED after"*) ok=OK ;;
        *) ok=FAIL ;;
        esac
        if [ "$ok" = OK ] && [ "${ms:-99999}" -gt $((kill_ms + 3000)) ]; then
            ok=FAIL
        fi
        tap $ok "$label: survivor $r: stream released, ${line#survivor $r: status }"
        r=$((r + 1))
    done
}

L=${GPU_LABEL:-}
# GPU_EXPECT_SYNC: a driver of CUDA 11.7 or later has the v2 stream memory operations
for n in ${GPU_NRANKS:-1 2 4}; do
    run "${L}gpu n=$n" "$n" GPU_EXPECT_SYNC=memops
done
run "${L}gpu n=2 staging chunk=64k" 2 SHOAL_CUDA_BACKEND=staging SHOAL_CUDA_CHUNK_SIZE=65536 \
    SHOAL_CUDA_STAGING_SIZE=1m
# rank 0's IPC buffer smaller than the others' (SHOAL_CUDA_IPC_SIZE is read by each rank)
run "${L}gpu n=2 rank 0 IPC buffer 64k" 2 GPU_RANK0_IPC_SIZE=64k SHOAL_CUDA_IPC_SIZE=1m
run "${L}gpu n=2 hostfn sync" 2 SHOAL_CUDA_SYNC=hostfn GPU_EXPECT_SYNC=hostfn
run "${L}gpu n=2 host sync" 2 SHOAL_CUDA_SYNC=host GPU_EXPECT_SYNC=host
# the emulation as a driver older than 11.7 without the v1 memops: the hostfn fallback; with
# GPU_OLD_LIBCUDA (run_gpu_emu.sh), under such a driver's entry point names, and the driver
# must load (GPU_REQUIRE_DRIVER: no skip)
case ${SHOAL_CUDA_LIBCUDA:-} in
*fakecuda*)
    drv=${GPU_OLD_LIBCUDA:-$SHOAL_CUDA_LIBCUDA}
    run "${L}gpu n=2 CUDA 11.6 driver" 2 FAKECUDA_DRIVER_VERSION=11060 GPU_EXPECT_SYNC=hostfn \
        "SHOAL_CUDA_LIBCUDA=$drv" GPU_REQUIRE_DRIVER=1
    run "${L}gpu n=2 CUDA 11.6 driver, v1 memops on" 2 FAKECUDA_DRIVER_VERSION=11060 \
        FAKECUDA_MEMOPS_V1=1 GPU_EXPECT_SYNC=memops "SHOAL_CUDA_LIBCUDA=$drv" \
        GPU_REQUIRE_DRIVER=1
    ;;
esac
# one device per rank where there are several (FAKECUDA_DEVICES: the emulation's count)
run "${L}gpu n=2 device per rank" 2 GPU_DEVICE_PER_RANK=1 FAKECUDA_DEVICES=2
# the NCCL delegate (SHOAL_CUDA_BACKEND=nccl) with GPU_NCCL_LIB (run_gpu_emu.sh: libfakenccl,
# the emulation; on a machine with GPUs: a real libnccl), one device per rank; 3 ranks: the
# ring bytes 2 (n - 1) S / n are not whole and are floored
if [ -n "${GPU_NCCL_LIB:-}" ]; then
    for n in 2 3 4; do
        run "${L}gpu n=$n nccl delegate" "$n" SHOAL_CUDA_BACKEND=nccl \
            "SHOAL_CUDA_LIBNCCL=$GPU_NCCL_LIB" GPU_DEVICE_PER_RANK=1 "FAKECUDA_DEVICES=$n" \
            GPU_ARGS=--nccl
    done
    # every case, not only the delegated ones, with the delegate in use: rank 0's AllReduce
    # input in host memory (mixed_host_device) went to the IPC path while the others were in
    # NCCL: both waited until the timeout
    run "${L}gpu n=2 nccl delegate, every case" 2 SHOAL_CUDA_BACKEND=nccl \
        "SHOAL_CUDA_LIBNCCL=$GPU_NCCL_LIB" GPU_DEVICE_PER_RANK=1 FAKECUDA_DEVICES=2
    # the emulated NCCL's ncclGetUniqueId fails on rank 0: every rank falls back to the IPC
    # path together (a rank in ncclCommInitRank, whose wait for rank 0 outlasts
    # SHOAL_TIMEOUT_MS here, would leave rank 0 alone in the IPC setup until it times out)
    case ${SHOAL_CUDA_LIBCUDA:-} in
    *fakecuda*)
        run "${L}gpu n=2 nccl, rank 0 has no unique id" 2 SHOAL_CUDA_BACKEND=nccl \
            "SHOAL_CUDA_LIBNCCL=$GPU_NCCL_LIB" GPU_DEVICE_PER_RANK=1 FAKECUDA_DEVICES=2 \
            FAKENCCL_FAIL_UNIQUE_ID=1 FAKENCCL_TIMEOUT_MS=120000
        ;;
    esac
fi
kill_case "${L}gpu kill n=3" 3
kill_case "${L}gpu kill n=4 tcp staging" 4 SHOAL_TRANSPORT=tcp SHOAL_CUDA_BACKEND=staging
tap_plan
