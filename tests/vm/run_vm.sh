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
# (seconds for the whole VM run, default 1400), VM_SECTIONS (guest_ib.sh sections; default
# all but perf, "all" for every one), MP_FULL=1 (the full collective sweeps, by hand),
# VM_ICOUNT (qemu -icount shift, see vm.sh SHOAL_VM_ICOUNT; default 3 when the sections are
# just perf, so that the measurement does not depend on the host's load; "" for none).
#
# VM_SANITIZE=1: the guest programs built with ASan and UBSan in build-vm-san (the same
# configure arguments plus --enable-sanitizers); the sanitizer runtimes (the guest image has
# none) are this host's, shared in with the build and found through LD_LIBRARY_PATH (host
# and guest are both Debian bookworm). Default sections then: the verbs ones (UCX's memory
# hooks are not built for ASan), any report fails the section:
#   VM_SANITIZE=1 tests/vm/run_vm.sh
top=$(cd "$(dirname "$0")/../.." && pwd)
cfg_args="--disable-shared --without-hwloc --without-pmix --without-cuda --without-mpi
    --without-microhttpd --without-sqlite3 --without-libpq --without-nccl"
if [ "${1:-}" = --configure-args ]; then
    echo $cfg_args
    exit 0
fi
san=${VM_SANITIZE:-0}
if [ "$san" = 1 ]; then
    bdir=${top_builddir:-$top/build-vm-san}
    cfg_args="$cfg_args --enable-sanitizers"
else
    bdir=${top_builddir:-$top/build-vm}
fi
progs="shoalrun shoal_info tl_perf tests/tl/test_tl tests/tl/test_ib_logic tests/tl/test_ib_lazy tests/mp/mp_coll tests/mp/mp_lazy tests/fault/kill
    tests/vm/ib_qp tests/vm/ib_remap qos_load tests/netns/mkuid"

why=$("$top/tests/vm/vm.sh" check)
if [ $? -ne 0 ]; then
    echo "1..0 # SKIP the Soft-RoCE VM cannot run here: $why"
    exit 0
fi
if [ ! -f "$bdir/Makefile" ]; then
    # configured only: the programs the guest runs are built below
    [ -x "$top/configure" ] || (cd "$top" && ./autogen.sh >/dev/null)
    # shellcheck disable=SC2086 # a word list
    mkdir -p "$bdir" && (cd "$bdir" && "$top/configure" -q $cfg_args) >/dev/null ||
        { echo "Bail out! configuring the guest build in $bdir failed"; exit 1; }
fi
if grep -q '^#define SHOAL_HAVE_RDMACM 0' "$bdir/config.h" 2>/dev/null &&
    [ -f /usr/include/rdma/rdma_cma.h ]; then
    # configured before the guest build took librdmacm (the cm section needs it)
    # shellcheck disable=SC2086 # a word list
    (cd "$bdir" && "$top/configure" -q $cfg_args) >/dev/null ||
        { echo "Bail out! reconfiguring the guest build in $bdir failed"; exit 1; }
fi
has_san=0
grep -q '^SHOAL_SAN_CFLAGS = .*-fsanitize=address' "$bdir/Makefile" && has_san=1
if grep -q '^#define SHOAL_HAVE_VERBS 0' "$bdir/config.h" 2>/dev/null || [ "$has_san" != "$san" ]; then
    echo "Bail out! $bdir is not a guest build (verbs off, or sanitizers not as VM_SANITIZE=$san asks): configure it with $cfg_args"
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
genv=""
sections=${VM_SECTIONS:-}
if [ "$san" = 1 ]; then
    # the host's sanitizer runtimes, next to the programs
    mkdir -p "$bdir/vm-san-libs" || exit 1
    for l in libasan.so libubsan.so; do
        f=$(readlink -f "$(gcc -print-file-name=$l)")
        [ -f "$f" ] || { echo "Bail out! no $l on this host (gcc -print-file-name)"; exit 1; }
        cp -L "$f" "$bdir/vm-san-libs/$(objdump -p "$f" | awk '$1 == "SONAME" { print $2 }')" ||
            exit 1
    done
    genv="LD_LIBRARY_PATH=$(cd "$bdir" && pwd)/vm-san-libs"
    # reports go to files that guest_ib.sh turns into failures (children's stderr is not
    # always kept)
    genv="$genv VM_SAN_LOGS=/tmp/shoal-san"
    genv="$genv ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0:exitcode=23:log_path=/tmp/shoal-san/asan"
    genv="$genv UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=23:log_path=/tmp/shoal-san/ubsan"
    sections=${sections:-"tl qp mp remap kill linkdown cm auto"}
fi
icount=${VM_ICOUNT-}
[ -z "${VM_ICOUNT+set}" ] && [ "$sections" = perf ] && icount=3
t0=$SECONDS
SHOAL_VM_ICOUNT=$icount "$top/tests/vm/vm.sh" run -t "${VM_TIMEOUT:-1400}" "${share[@]}" -- \
    "top_srcdir=$top top_builddir=$(cd "$bdir" && pwd) VM_SECTIONS='$sections' MP_FULL='${MP_FULL:-0}' $genv" \
    "bash $top/tests/vm/guest_ib.sh"
rc=$?
echo "# the VM stage took $((SECONDS - t0)) s (vm.sh exit $rc)"
exit $rc
