#!/bin/sh
# Channels connected at first use (SHOAL_CONNECT=lazy, src/core; transports/tcp connects on
# the progress path, shm maps a peer's segment at first use). mp_lazy counts the peers each
# rank connects (its tcp sockets): init's own exchanges, then a ring AllReduce's neighbours,
# then an AllToAll (both ends of every pair connect at once, also with 4 sockets per pair);
# eager and SHOAL_CONNECT=auto beside it. Then every collective of mp_coll, and the pairwise
# AllToAll, run lazily over tcp and shm at 2 to 8 ranks. Where shoal_info -b says ucx is
# usable, the same over ucx (transports/ucx opens an endpoint at first use): mp_lazy counts
# the endpoints the transport's log says it authenticated (SHOAL_DEBUG_FILE per process), and
# mp_coll and the pairwise AllToAll run lazily at 2 to 8 ranks. Rank 0's TAP lines are merged
# into one stream, prefixed by the configuration; one more line per run checks the exit status.
#
# Environment: top_builddir, top_srcdir (set by make check), MP_TIMEOUT (seconds per run,
# default 240), LAZY_NRANKS (mp_coll's rank counts over tcp and ucx, default "2 3 5 8"),
# LAZY_UCX=0 to skip the ucx runs.

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
shoalrun=$builddir/shoalrun
lazy=$builddir/tests/mp/mp_lazy
coll=$builddir/tests/mp/mp_coll
a2a=$builddir/tests/mp/mp_alltoall
wrap=$srcdir/tests/mp/hostid_wrap.sh
timeout=${MP_TIMEOUT:-240}
n_tap=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_lazy.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$lazy" ] || [ ! -x "$coll" ] || [ ! -x "$a2a" ]; then
    echo "1..0 # SKIP shoalrun, mp_lazy, mp_coll or mp_alltoall not built"
    exit 0
fi

# shellcheck source=tests/mp/run_lib.sh
. "$srcdir/tests/mp/run_lib.sh"

count="SHOAL_TRANSPORT=tcp SHOAL_SOCKET_NSOCKS=1 SHOAL_ALGO=ring"
mp_job "tcp n=8 eager count" 8 "$count SHOAL_CONNECT=eager" "$lazy" eager
mp_job "tcp n=16 lazy count" 16 "$count SHOAL_CONNECT=lazy" "$lazy" lazy
mp_job "tcp n=8 auto(4) count" 8 "$count SHOAL_CONNECT=auto SHOAL_CONNECT_LAZY_RANKS=4" \
    "$lazy" lazy
mp_job "tcp n=2 lazy count" 2 "$count SHOAL_CONNECT=lazy" "$lazy" lazy
mp_job "tcp n=5 lazy count nsocks=4" 5 \
    "SHOAL_TRANSPORT=tcp SHOAL_SOCKET_NSOCKS=4 SHOAL_ALGO=ring SHOAL_CONNECT=lazy" "$lazy" lazy_n4
for n in ${LAZY_NRANKS:-2 3 5 8}; do
    mp_job "tcp n=$n lazy" "$n" "SHOAL_TRANSPORT=tcp SHOAL_CONNECT=lazy" "$coll"
done
mp_job "tcp n=4 lazy nsocks=4 alltoall" 4 \
    "SHOAL_TRANSPORT=tcp SHOAL_CONNECT=lazy SHOAL_SOCKET_NSOCKS=4 SHOAL_ALGO=pairwise" "$a2a"
if [ "${LAZY_UCX:-1}" != 0 ] && "$builddir/shoal_info" -b 2>/dev/null |
        grep -q "ucx *usable: yes"; then
    # every rank logs to its own file (%p), which mp_lazy reads back
    ucount="SHOAL_TRANSPORT=ucx SHOAL_ALGO=ring SHOAL_DEBUG=TRACE SHOAL_DEBUG_SUBSYS=UCX"
    ucount="$ucount SHOAL_DEBUG_FILE=$tmp/ucxlog.%p"
    mp_job "ucx n=8 eager count" 8 "$ucount SHOAL_CONNECT=eager" "$lazy" eager_ucx
    mp_job "ucx n=16 lazy count" 16 "$ucount SHOAL_CONNECT=lazy" "$lazy" lazy_ucx
    mp_job "ucx n=2 lazy count" 2 "$ucount SHOAL_CONNECT=lazy" "$lazy" lazy_ucx
    # the endpoints' protocols as UCX reports them (SHOAL_DEBUG=trace): shoal's 2 KiB
    # shared-memory FIFO elements carry a 32-byte header with payloads up to about 1.9 KiB in
    # UCX's short protocol (UCX's 128-byte ones stop below 96 bytes: header + 64 B); a user's
    # UCX_MM_FIFO_ELEM_SIZE wins
    ucx_short() { # LABEL LO HI: every endpoint's tag_send short limit within LO..HI bytes
        _us=$(cat "$tmp"/ucxlog.* 2>/dev/null | sed -n 's/.*ucx endpoint to peer [0-9]*: tag_send: 0\.\.<egr\/short>\.\.\([0-9]*\)\.\..*/\1/p' | sort -u | tr '\n' ' ' | sed 's/ $//')
        n_tap=$((n_tap + 1))
        if [ -n "$_us" ] && echo "$_us" | awk -v lo="$2" -v hi="$3" '{ for (i = 1; i <= NF; i++) if ($i < lo || $i > hi) exit 1 }'; then
            echo "ok $n_tap - $1 (short protocol up to $_us bytes)"
        else
            echo "not ok $n_tap - $1 (short limits: '${_us:-none logged}', want $2..$3)"
        fi
    }
    ucx_short "ucx: shoal's FIFO elements carry a 64 B-1.9 KiB payload in UCX's short protocol" \
        1900 2048
    rm -f "$tmp"/ucxlog.*
    mp_job "ucx n=2 user FIFO elements" 2 "$ucount SHOAL_CONNECT=eager UCX_MM_FIFO_ELEM_SIZE=128" \
        "$lazy" eager_ucx
    ucx_short "ucx: UCX_MM_FIFO_ELEM_SIZE=128 from the user wins" 1 127
    rm -f "$tmp"/ucxlog.*
    for n in ${LAZY_NRANKS:-2 3 5 8}; do
        mp_job "ucx n=$n lazy" "$n" "SHOAL_TRANSPORT=ucx SHOAL_CONNECT=lazy" "$coll"
    done
    mp_job "ucx n=5 lazy alltoall" 5 "SHOAL_TRANSPORT=ucx SHOAL_CONNECT=lazy SHOAL_ALGO=pairwise" \
        "$a2a"
else
    n_tap=$((n_tap + 1))
    echo "ok $n_tap - ucx lazy # SKIP ucx not usable here (shoal_info -b) or LAZY_UCX=0"
fi
# The shoal segment names in /dev/shm, one a line, sorted. make -j check runs other tests
# beside this one: their live segments come and go, so a name counts as left only if it is
# new, mapped by no process, and still there a few seconds later.
shm_list() {
    for _f in /dev/shm/shoal-*; do
        [ -e "$_f" ] && echo "${_f#/dev/shm/}"
    done | sort
}
shm_list > "$tmp/shm0"
mp_job "shm n=4 lazy" 4 "SHOAL_CONNECT=lazy" "$coll"
mp_job "shm n=3 lazy ring" 3 "SHOAL_CONNECT=lazy SHOAL_ALGO=ring SHOAL_CHUNK_SIZE=4096" "$coll" \
    allreduce reduce_scatter allgather
# Virtual hosts (hostid_wrap.sh): shm inside a host, tcp across, both lazy.
ar="allreduce allreduce_big determinism"
# shellcheck disable=SC2086 # $ar is a word list on purpose
mp_job "hosts 2x2 hier lazy" 4 "SHOAL_ALGO=hier MP_PPN=2 SHOAL_CONNECT=lazy" "$wrap" "$coll" $ar
mp_job "hosts 3x2 lazy" 6 "MP_PPN=2 SHOAL_CONNECT=lazy" "$wrap" "$coll" allreduce broadcast \
    allgather reduce_scatter sendrecv split
shm_list > "$tmp/shm1"
left=""
for _n in $(comm -13 "$tmp/shm0" "$tmp/shm1"); do
    if ! grep -qs "/dev/shm/$_n" /proc/[0-9]*/maps; then
        left="$left $_n"
    fi
done
if [ -n "$left" ]; then
    sleep 5 # a segment another test is just creating, not yet mapped: gone or mapped by now
    still=""
    for _n in $left; do
        [ -e "/dev/shm/$_n" ] && ! grep -qs "/dev/shm/$_n" /proc/[0-9]*/maps && still="$still $_n"
    done
    left=$still
fi
n_tap=$((n_tap + 1))
if [ -z "$left" ]; then
    echo "ok $n_tap - lazy shm: no segment name left in /dev/shm after the jobs" \
        "($(wc -l < "$tmp/shm0") before, $(wc -l < "$tmp/shm1") after, all others' live ones)"
else
    echo "not ok $n_tap - lazy shm: segment names left in /dev/shm, mapped by no process:$left"
fi
echo "1..$n_tap"
