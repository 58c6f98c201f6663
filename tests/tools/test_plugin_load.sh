#!/bin/sh
# TAP test: loading libshoal leaves the application alone (issue 10, finding 9). libshoal does
# not link UCX or verbs; a job on shm/tcp maps neither and keeps its SIGSEGV/SIGBUS/SIGILL/
# SIGFPE/SIGHUP handlers (tests/tools/sigcheck.c checks /proc/self/maps and sigaction after
# init and an AllReduce); SHOAL_TRANSPORT=ucx loads libucp at first use, works, and still leaves the
# handlers alone unless UCX_HANDLE_ERRORS is set.
# Needs: top_builddir (exported by `make check`; defaults to the current directory).

top_builddir=${top_builddir:-.}
SHOALRUN="$top_builddir/shoalrun"
SIGCHECK="$top_builddir/tests/tools/sigcheck"
LIB="$top_builddir/.libs/libshoal.so"
T=$(mktemp -d "${TMPDIR:-/tmp}/test_plugin_load.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
unset SHOAL_UID SHOAL_RANK SHOAL_NRANKS SHOAL_LOCAL_RANK SHOAL_LOCAL_SIZE SHOAL_TRANSPORT \
      SHOAL_UCX_LIBRARY UCX_HANDLE_ERRORS

NTESTS=18
echo "1..$NTESTS"
n=0
ok() { # ok COND-EXIT-STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; diag; fi
}
skip() { n=$((n + 1)); echo "ok $n # SKIP $1"; }
diag() { [ -f "$T/out" ] && sed 's/^/#   /' "$T/out" "$T/err" 2>/dev/null | head -n 20; }
have() { grep -q "^#define SHOAL_HAVE_$1 1" "$top_builddir/config.h"; }
# run ENV...: two ranks of sigcheck under shoalrun with the given environment, deadline 120 s
run() {
    env "$@" timeout -s KILL 120 "$SHOALRUN" -n 2 --timeout 60 "$SIGCHECK" >"$T/out" 2>"$T/err"
    rc=$?
}
# every rank's line matches the pattern
both() { [ "$(grep -c "sigcheck rank [01]: $1" "$T/out")" -eq 2 ]; }

if [ ! -x "$SHOALRUN" ] || [ ! -x "$SIGCHECK" ] || [ ! -f "$LIB" ]; then
    i=0; while [ $i -lt $NTESTS ]; do i=$((i + 1)); echo "ok $i # SKIP not built"; done
    exit 0
fi

# 1-2: the library links none of them, and does not export the forwarders
out=$(ldd "$LIB" 2>&1)
echo "$out" | grep -Eq 'lib(ucp|ucs|uct|ucm|ibverbs)\.so'
ok $((1 - $?)) "ldd libshoal.so lists no libucp/libucs/libuct/libibverbs"
[ $? -eq 0 ] || echo "$out" | sed 's/^/#   /'
# (an undefined one would mean a UCX/verbs call without a forwarder in ucx_dl.c/ib_dl.c)
nm -D "$LIB" | grep -E ' [TUWw] (ucp_|ucs_|uct_|ibv_)' >"$T/syms"
[ -s "$T/syms" ]
ok $((1 - $?)) "libshoal.so neither exports nor needs a ucp_/ucs_/uct_/ibv_ symbol"
[ -s "$T/syms" ] && sed 's/^/#   /' "$T/syms" | head -n 10

# 3-8: shm (forced), then the default choice (shm on one host): nothing loaded, signals untouched
for mode in "SHOAL_TRANSPORT=shm" "SHOAL_DEBUG=WARN"; do
    run "$mode"
    ok "$rc" "$mode: 2 ranks, init and AllReduce succeed"
    both 'ucs=0 ucp=0 uct=0 ibverbs=0 '
    ok $? "$mode: no libucs/libucp/libuct/libibverbs in /proc/self/maps"
    both '.* handlers=same ucs_handler=0 allreduce=correct'
    ok $? "$mode: SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGHUP handlers untouched (SIG_DFL without a sanitizer)"
done

# 9-10: tcp
run SHOAL_TRANSPORT=tcp
ok "$rc" "SHOAL_TRANSPORT=tcp: init and AllReduce succeed"
both 'ucs=0 ucp=0 uct=0 ibverbs=0 handlers=same ucs_handler=0 allreduce=correct'
ok $? "SHOAL_TRANSPORT=tcp: nothing loaded, handlers untouched"

if have UCX; then
    # 11-13: ucx loads libucp at first use, works, and UCX's handlers are removed again
    run SHOAL_TRANSPORT=ucx
    ok "$rc" "SHOAL_TRANSPORT=ucx: init and AllReduce succeed"
    both 'ucs=1 ucp=1 '
    ok $? "SHOAL_TRANSPORT=ucx: libucp and libucs were loaded"
    both '.* handlers=same ucs_handler=0 allreduce=correct'
    ok $? "SHOAL_TRANSPORT=ucx: the application's fatal-signal and SIGHUP handlers are back"\
" after UCX loaded"
    # 14: UCX_HANDLE_ERRORS set: the user asked for UCX's handlers, they stay
    run SHOAL_TRANSPORT=ucx UCX_HANDLE_ERRORS=bt
    both 'ucs=1 .* ucs_handler=1 allreduce=correct'
    ok $? "SHOAL_TRANSPORT=ucx UCX_HANDLE_ERRORS=bt: UCX's handlers are kept"
    # 15: a missing library is a clean error that says which
    run SHOAL_TRANSPORT=ucx SHOAL_UCX_LIBRARY=/nonexistent/libucp.so.0
    want='SHOAL_TRANSPORT=ucx, but the transport is not usable here: cannot load /nonexistent/'
    [ "$rc" -ne 0 ] && grep -q "$want" "$T/err"
    ok $? "SHOAL_UCX_LIBRARY missing: init fails and says which library could not be loaded"
else
    skip "ucx not built"; skip "ucx not built"; skip "ucx not built"; skip "ucx not built"
    skip "ucx not built"
fi

# 16: shoal_info -b names where each transport's library comes from
"$top_builddir/shoal_info" -b >"$T/out" 2>"$T/err"
if have UCX; then
    grep -Eq '^#   ucx .*library: .*libucp' "$T/out"
    ok $? "shoal_info -b: the ucx transport's library"
else
    grep -Eq '^#   tcp ' "$T/out"
    ok $? "shoal_info -b: lists the transports"
fi

# 17: shoal_info -c to a full disk is exit 1: its 34 kB went out in earlier writes, whose
# failure left nothing for the final fflush to fail on (exit 0)
"$top_builddir/shoal_info" -c >/dev/full 2>"$T/err"; r=$?
[ "$r" -eq 1 ] && grep -q '^shoal_info: writing to stdout failed' "$T/err"
ok $? "shoal_info -c to a full disk: exit 1, said (rc $r)"

# 18: -n and --ppn shape the topology view (-t) only: given alone they were ignored silently
"$top_builddir/shoal_info" -n 4 >"$T/out" 2>"$T/err"; r=$?
[ "$r" -eq 2 ] && grep -q '^shoal_info: -n and --ppn go with -t' "$T/err"
ok $? "shoal_info -n without -t: exit 2, said (rc $r)"
