#!/bin/sh
# Runs tests/mp/mp_shmcopy under shoalrun (every rank on this host, shm) in the
# configurations that take each road of the intra-node AllReduce, and checks in each run's
# log (SHOAL_DEBUG=INFO) that the road was taken:
#  - shoal_mem_alloc buffers reduced in place ("in place in shoal_mem_alloc buffers");
#  - ordinary buffers by single copies where this kernel allows them (the probe's verdict is
#    read from the log: "single copy ... on" must be followed by the road being used), and
#    with SHOAL_SHM_CMA=0 by the staged two-shot (the road never taken);
#  - tiny windows: the overlapped two-shot over many windows, odd counts;
#  - mismatched counts / dtypes / ops across ranks;
#  - shoal_mem_alloc buffers allocated and freed at every step: no mapping of a freed one kept;
#  - a rank whose buffers a peer may not map (not dumpable): the buffers are staged.
# Environment: top_builddir, SHMCOPY_TIMEOUT (seconds per run, default 240).

builddir=${top_builddir:-.}
shoalrun=$builddir/shoalrun
prog=$builddir/tests/mp/mp_shmcopy
timeout=${SHMCOPY_TIMEOUT:-240}
n_tap=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_shmcopy.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$prog" ]; then
    echo "1..0 # SKIP $shoalrun or $prog not built"
    exit 0
fi

# shellcheck source=tests/mp/run_lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/mp/run_lib.sh"

# logcheck LABEL yes|no PATTERN: one TAP line, whether rank 0's stderr of the last job
# (SHOAL_DEBUG=INFO) holds PATTERN.
logcheck() {
    n_tap=$((n_tap + 1))
    if grep -q "$3" "$tmp/err"; then _found=yes; else _found=no; fi
    if [ "$_found" = "$2" ]; then
        echo "ok $n_tap - $1"
    else
        echo "not ok $n_tap - $1 (log line '$3' expected: $2)"
        grep -E "\[(COLL|SHM)\]" "$tmp/err" | head -n 20 | sed 's/^/# /'
    fi
}

info="SHOAL_DEBUG=INFO SHOAL_DEBUG_SUBSYS=COLL,SHM"

mp_job "shm n=2" 2 "$info" "$prog" mem plain mismatch nan
logcheck "shm n=2: shoal_mem_alloc buffers are reduced in place" yes \
    "in place in shoal_mem_alloc buffers (no staging)"
if grep -q "single copy (process_vm_readv) on" "$tmp/err"; then
    logcheck "shm n=2: single copies used where the probe allowed them" yes \
        "by single copies (process_vm_readv/writev)"
else
    logcheck "shm n=2: no single copies where the probe refused them" no \
        "by single copies (process_vm_readv/writev)"
fi

mp_job "shm n=3 SHOAL_SHM_CMA=0" 3 "$info SHOAL_SHM_CMA=0" "$prog" mem churn plain mismatch nan
logcheck "shm n=3 SHOAL_SHM_CMA=0: the probe is skipped" yes "off (SHOAL_SHM_CMA=0)"
logcheck "shm n=3 SHOAL_SHM_CMA=0: no single copies" no \
    "by single copies (process_vm_readv/writev)"
logcheck "shm n=3 SHOAL_SHM_CMA=0: shoal_mem_alloc buffers still in place" yes \
    "in place in shoal_mem_alloc buffers (no staging)"

mp_job "shm n=3 single copies, small chunks" 3 \
    "$info SHOAL_SHM_WINDOW=8192 SHOAL_SHM_DIRECT_MIN=4096" "$prog" plain nan
if grep -q "single copy (process_vm_readv) on" "$tmp/err"; then
    logcheck "shm n=3 small chunks: single copies used" yes \
        "by single copies (process_vm_readv/writev)"
fi

# Rank 0 cannot take rank 1's descriptors (rank 1 not dumpable, rank 0 without
# CAP_SYS_PTRACE): shoal_mem_alloc buffers are staged, not a failed communicator.
mp_job "shm n=2 rank 1 not dumpable" 2 "$info" "$prog" nodump mem
logcheck "shm n=2 rank 1 not dumpable: shared buffers staged, not mapped" no \
    "in place in shoal_mem_alloc buffers (no staging)"

# SHOAL_ALGO=shm: 4 KiB windows make the shm path dearer in the cost model, which may then
# pick a channel algorithm for some counts (the ASan build's slower measured rates did), and
# ranks with mismatched counts would choose different algorithms (a timeout, not the
# INVALID_ARG this job checks): this job is about the two-shot path's windows.
mp_job "shm n=4 two-shot, 4k windows" 4 \
    "SHOAL_ALGO=shm SHOAL_SHM_WINDOW=4096 SHOAL_SHM_ONESHOT_MAX=1024 SHOAL_SHM_DIRECT_MIN=1g" \
    "$prog" plain mismatch
echo "1..$n_tap"
