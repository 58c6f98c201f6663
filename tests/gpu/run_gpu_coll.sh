#!/bin/sh
# Runs tests/gpu/test_gpu_coll under shoalrun for GPU_NRANKS (default "1 2 4") ranks, all on
# the first GPU, and for a few backend variants; merges rank 0's TAP lines into one stream
# prefixed by the configuration. Prints "1..0 # SKIP ..." when no CUDA driver/GPU is usable.
# Environment: top_builddir (make check), GPU_NRANKS, GPU_TIMEOUT (s per run, default 300).
builddir=${top_builddir:-.}
shoalrun=$builddir/shoalrun
prog=$builddir/tests/gpu/test_gpu_coll
n_tap=0
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
    for v in SHOAL_TIMEOUT_MS=60000 "$@"; do
        xs="$xs -x $v"
    done
    # shellcheck disable=SC2086
    "$shoalrun" --no-prefix --timeout "${GPU_TIMEOUT:-300}" -n "$n" $xs "$prog" >"$tmp/out" 2>"$tmp/err"
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

for n in ${GPU_NRANKS:-1 2 4}; do
    run "gpu n=$n" "$n"
done
run "gpu n=2 staging chunk=64k" 2 SHOAL_CUDA_BACKEND=staging SHOAL_CUDA_CHUNK_SIZE=65536 \
    SHOAL_CUDA_STAGING_SIZE=1m
run "gpu n=2 hostfn sync" 2 SHOAL_CUDA_SYNC=hostfn
echo "1..$n_tap"
