#!/bin/bash
# The Soft-RoCE VM stage (TAP): builds what the guest runs in the guest build dir, boots the
# VM (tests/vm/vm.sh) with the checkout and that build dir shared in, runs
# tests/vm/guest_ib.sh inside and prints its TAP. Skips (with the reason) only where this
# machine cannot build or boot the VM.
#
# The guest build: a build dir configured for the VM's root (its libc and libcrypto; verbs
# and UCX are loaded at first use), static so that no libtool wrapper needs relinking:
#   ./scripts/build.sh build-vm $(tests/vm/run_vm.sh --configure-args)
#   make -C build-vm test-suite.log TESTS=tests/vm/run_vm.sh TEST_LOGS=tests/vm/run_vm.log
# or simply tests/vm/run_vm.sh (top_builddir defaults to build-vm, configured if missing).
# Environment: top_builddir, SHOAL_VM_CACHE (the image cache, see vm.sh), VM_TIMEOUT
# (seconds for the whole VM run, default 900), VM_SECTIONS (guest_ib.sh sections; default
# all but perf, "all" for every one), MP_FULL=1 (the full collective sweeps, by hand).
top=$(cd "$(dirname "$0")/../.." && pwd)
cfg_args="--disable-shared --without-hwloc --without-pmix --without-cuda --without-mpi
    --without-microhttpd --without-sqlite3 --without-libpq --without-nccl"
if [ "${1:-}" = --configure-args ]; then
    echo $cfg_args
    exit 0
fi
bdir=${top_builddir:-$top/build-vm}
progs="shoalrun shoal_info tl_perf tests/tl/test_tl tests/tl/test_ib_logic tests/mp/mp_coll tests/fault/kill
    tests/vm/ib_qp tests/vm/ib_remap"

why=$("$top/tests/vm/vm.sh" check)
if [ $? -ne 0 ]; then
    echo "1..0 # SKIP the Soft-RoCE VM cannot run here: $why"
    exit 0
fi
if [ ! -f "$bdir/Makefile" ]; then
    # shellcheck disable=SC2086 # a word list
    "$top/scripts/build.sh" "$(realpath -m --relative-to="$top" "$bdir")" $cfg_args >/dev/null ||
        { echo "Bail out! configuring the guest build in $bdir failed"; exit 1; }
fi
if grep -q '^#define SHOAL_HAVE_RDMACM 0' "$bdir/config.h" 2>/dev/null &&
    [ -f /usr/include/rdma/rdma_cma.h ]; then
    # configured before the guest build took librdmacm (the cm section needs it)
    # shellcheck disable=SC2086 # a word list
    (cd "$bdir" && "$top/configure" -q $cfg_args) >/dev/null ||
        { echo "Bail out! reconfiguring the guest build in $bdir failed"; exit 1; }
fi
if grep -q '^#define SHOAL_HAVE_VERBS 0' "$bdir/config.h" 2>/dev/null ||
    grep -q '^SHOAL_SAN_CFLAGS = .*-fsanitize' "$bdir/Makefile"; then
    echo "Bail out! $bdir is not a guest build (verbs off or sanitizers on): configure it with $cfg_args"
    exit 1
fi
# shellcheck disable=SC2086 # a word list
if ! make -C "$bdir" -j"$(nproc)" $progs > "$bdir/vm-build.log" 2>&1; then
    tail -20 "$bdir/vm-build.log" | sed 's/^/# /'
    echo "Bail out! building the guest's programs in $bdir failed"
    exit 1
fi
share=()
case $bdir/ in "$top"/*) ;; *) share=(-s "$bdir") ;; esac
t0=$SECONDS
"$top/tests/vm/vm.sh" run -t "${VM_TIMEOUT:-900}" "${share[@]}" -- \
    "top_srcdir=$top top_builddir=$(cd "$bdir" && pwd) VM_SECTIONS='${VM_SECTIONS:-}' MP_FULL='${MP_FULL:-0}'" \
    "bash $top/tests/vm/guest_ib.sh"
rc=$?
echo "# the VM stage took $((SECONDS - t0)) s (vm.sh exit $rc)"
exit $rc
