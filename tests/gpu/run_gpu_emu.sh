#!/bin/sh
# Runs run_gpu_coll.sh (test_gpu_coll: every collective x dtype x op x count on device
# buffers, stream ordering, groups; 1, 2 and 4 ranks; staging and hostfn variants) on
# libfakecuda, the host emulation of the CUDA driver (tests/gpu/fakecuda.c), so the CUDA
# layer's logic is checked where there is no GPU. Then the emulation's own strictness: a
# device fault (kernel on memory outside every allocation) must fail the call with a named
# error, and a host read of a device pointer must crash rather than pass. Where NCCL support
# is built, also the NCCL delegate on libfakenccl (tests/gpu/fakenccl.c, an emulation of the
# five NCCL calls over the emulated device memory): 2, 3 and 4 ranks, one emulated device each.
# Environment: top_builddir (make check), GPU_NRANKS, GPU_TIMEOUT.
builddir=${top_builddir:-.}
srcdir=${srcdir:-$(dirname "$0")/../..}
lib=$builddir/tests/gpu/.libs/libfakecuda.so
if [ ! -r "$lib" ]; then
    echo "1..0 # SKIP $lib not built"
    exit 0
fi
case $lib in
/*) ;;
*) lib=$(pwd)/$lib ;;
esac
SHOAL_CUDA_LIBCUDA=$lib
# No host function may hold the driver's callback thread (SHOAL_CUDA_SYNC=hostfn waits on the
# device): one that runs longer faults the emulated driver, and the run fails. 500 ms: below
# the late-peer case's 800 ms wait, which a blocking host function would last; above what a
# short one took on a loaded 2-core machine (158 ms; 150 was the limit then).
FAKECUDA_HOSTFN_MAX_MS=${FAKECUDA_HOSTFN_MAX_MS:-500}
export SHOAL_CUDA_LIBCUDA FAKECUDA_HOSTFN_MAX_MS
# libfakecuda_old: the emulation with a pre-11.7 driver's entry point names (the 11.6 runs)
old=$builddir/tests/gpu/.libs/libfakecuda_old.so
if [ -r "$old" ]; then
    case $old in
    /*) ;;
    *) old=$(pwd)/$old ;;
    esac
    GPU_OLD_LIBCUDA=$old
    export GPU_OLD_LIBCUDA
fi
# libfakenccl (tests/gpu/fakenccl.c, NCCL builds): the NCCL delegate's runs, emulated too
nccl=$builddir/tests/gpu/.libs/libfakenccl.so
if [ -r "$nccl" ]; then
    case $nccl in
    /*) ;;
    *) nccl=$(pwd)/$nccl ;;
    esac
    GPU_NCCL_LIB=$nccl
    export GPU_NCCL_LIB
fi
GPU_LABEL="emulated driver, " top_builddir=$builddir sh "$srcdir/tests/gpu/run_gpu_coll.sh"
