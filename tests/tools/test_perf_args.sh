#!/bin/sh
# TAP test of the benchmarks' command lines (perf/perf_args.h): a size or count that is not all
# a number is refused with status 2 before anything runs. Each tool read its numbers its own
# way, most with atoi or a bare strtoull: "-b 64x" timed 64 bytes, "-b 1G" 1 byte, "-n 1e6" one
# iteration, "-n abc" none, and the table still printed. Also: membw, when it cannot start
# every thread it asked for, says so and ends (the started threads waited at its barrier for
# ever). Tools this build lacks (ucx_floor without UCX) are skipped.
# Needs: top_builddir (exported by `make check`; defaults to the current directory).

top_builddir=${top_builddir:-.}
. "$(dirname "$0")/../tap.sh"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_perf_args.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
unset SHOAL_RANK SHOAL_NRANKS SHOAL_COMM_ID

# refused TOOL ARGS...: status 2 within 30 s, a sentence on stderr, nothing timed on stdout
refused() {
    tool=$1; shift
    if [ ! -x "$top_builddir/$tool" ]; then
        tap OK "# SKIP $tool is not built here"
        return
    fi
    timeout -s KILL 30 "$top_builddir/$tool" "$@" </dev/null >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" -eq 2 ] && [ -s "$T/err" ] && [ ! -s "$T/out" ]; then
        tap OK "$tool $*: refused (status 2)"
    else
        tap FAIL "$tool $*: status $rc, $(wc -c <"$T/out") bytes out"
        sed 's/^/#   /' "$T/err" | head -n 5
    fi
}

refused membw -s 64x
refused membw -s 1G0
refused membw -r 2x
refused membw -r 0
refused cma_rate -b 4Kx
refused cma_rate -e 1e6
refused cma_rate -r abc
refused inplace_bench -b 64x
refused inplace_bench -n 1e6
refused inplace_bench -b 1M -e
refused tl_perf -t shm -b 64x
refused tl_perf -t shm -n 1e6
refused tl_perf -t shm -W 0
refused shm_ll_bench -n 5z
refused shm_ll_bench -k -1
refused ucx_floor -s 20x
refused ucx_floor -n 1e6
refused meter_bench -b 8x
refused meter_bench -r 1z
refused meter_bench -n 0
refused qos_load -b 4mx
refused qos_load -r 1z
refused select_bench -b 8x auto
refused select_bench -f 4.5 auto
refused select_bench -r 1e3 auto
refused allreduce_perf -b 8x
refused allreduce_perf -n 1e6
refused nbc_overlap -b 8x
refused nbc_overlap -n 0

# What they read: suffixes are powers of 1024 and a B after one is allowed.
if [ -x "$top_builddir/membw" ]; then
    timeout -s KILL 60 "$top_builddir/membw" -s 4KB -t 1 -r 1 >"$T/out" 2>"$T/err"
    rc=$?
    tap "$([ $rc -eq 0 ] && grep -q 'size 4096$' "$T/out" && echo OK || echo FAIL)" \
        "membw -s 4KB copies 4096 bytes (status $rc: $(cat "$T/out"))"
    # Room for the buffers, not for 64 thread stacks: some threads start, one fails. Not
    # under a sanitizer, which reserves terabytes of address space at its start.
    if ldd "$top_builddir/membw" 2>/dev/null | grep -q 'libasan\|libtsan'; then
        tap OK "# SKIP membw under a sanitizer: no address-space limit"
    else
        (ulimit -v 100000 && exec timeout -s KILL 30 "$top_builddir/membw" -s 4K -t 64 -r 2) \
            >"$T/out" 2>"$T/err"
        rc=$?
        tap "$([ $rc -eq 1 ] && grep -q 'cannot allocate or start 64 threads' "$T/err" &&
               echo OK || echo FAIL)" \
            "membw: 64 threads where some cannot start: status 1 and a sentence, no hang ($rc)"
    fi
else
    tap OK "# SKIP membw is not built here"
    tap OK "# SKIP membw is not built here"
fi
tap_plan
exit "$fails"
