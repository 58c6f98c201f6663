#!/bin/sh
# Runs tests/mp/mp_coll under shoalrun for every transport x number of ranks (plus a few
# forced-algorithm variants, and a count that differs across ranks over tcp and ucx on 2-4
# ranks) and merges rank 0's TAP lines into one TAP stream, each
# description prefixed by the configuration ("tcp n=3: allreduce float sum (23 cases)").
# One more line per run checks shoalrun's exit status. The plan comes last.
#
# Environment: top_builddir (set by make check), MP_NRANKS (default "1 2 3 4 5 8"),
# MP_TRANSPORTS (default "shm tcp", plus "ucx" where shoal_info -b says it is usable; ucx
# runs use MP_UCX_NRANKS, default "2 3 4"), MP_VARIANTS=0 to skip the forced-algorithm runs,
# MP_TIMEOUT (seconds per run, default 240), MP_SECTIONS (mp_coll sections, default all).

builddir=${top_builddir:-.}
shoalrun=$builddir/shoalrun
prog=$builddir/tests/mp/mp_coll
nranks_list=${MP_NRANKS:-"1 2 3 4 5 8"}
if [ -z "${MP_TRANSPORTS:-}" ] && "$builddir/shoal_info" -b 2>/dev/null | grep -q "ucx *usable: yes"; then
    MP_TRANSPORTS="shm tcp ucx"
fi
transports=${MP_TRANSPORTS:-"shm tcp"}
timeout=${MP_TIMEOUT:-240}
n_tap=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_mp.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$prog" ]; then
    echo "1..0 # SKIP $shoalrun or $prog not built"
    exit 0
fi

# shellcheck source=tests/mp/run_lib.sh
. "${top_srcdir:-$(dirname "$0")/../..}/tests/mp/run_lib.sh"

# run LABEL NRANKS [VAR=VALUE...]: one mp_coll job (run_lib.sh); SHOAL_TRANSPORT unset means
# the automatic choice.
run() {
    _label=$1
    _n=$2
    shift 2
    # shellcheck disable=SC2086 # MP_SECTIONS is a word list on purpose
    mp_job "$_label" "$_n" "$*" "$prog" ${MP_SECTIONS:-}
}

for tl in $transports; do
    list=$nranks_list
    [ "$tl" = ucx ] && [ -z "${MP_NRANKS:-}" ] && list=${MP_UCX_NRANKS:-"2 3 4"}
    for n in $list; do
        if [ "$tl" = shm ]; then
            run "shm n=$n" "$n" # the automatic choice: shm between ranks of one host
        else
            run "$tl n=$n" "$n" SHOAL_TRANSPORT="$tl"
        fi
    done
done
# A count that differs across ranks over the channel transports: every rank fails at once
# (mp_coll's named-only section "mismatch", on a communicator split off for it).
for tl in $transports; do
    [ "$tl" = shm ] && continue
    for n in 2 3 4; do
        mp_job "$tl n=$n mismatch" "$n" "SHOAL_TRANSPORT=$tl" "$prog" mismatch
    done
done
# SHOAL_CHECK_ARGS=1: a root or count that differs across ranks (broadcast, allgather,
# reduce_scatter, allreduce, reduce) fails every rank with SHOAL_ERR_INVALID_ARG, and the
# communicator stays usable (mp_coll's named-only section "argcheck").
for tl in $transports; do
    for n in 2 3 4; do
        if [ "$tl" = shm ]; then
            mp_job "shm n=$n argcheck" "$n" "SHOAL_CHECK_ARGS=1" "$prog" argcheck
        else
            mp_job "$tl n=$n argcheck" "$n" "SHOAL_TRANSPORT=$tl SHOAL_CHECK_ARGS=1" "$prog" \
                argcheck
        fi
    done
done
# A group whose peer never posts its side: the group's end fails within the timeout and
# names the peer; in a group over two communicators, the other one's messages still go
# (mp_coll's named-only section "p2pfail").
for tl in $transports; do
    mp_job "$tl n=2 p2pfail" 2 "SHOAL_TRANSPORT=$tl" "$prog" p2pfail
done
# A process forked from a rank: its use, abort and destroy of the rank's communicator are
# refused at once and the rank's communicator works on (mp_coll's named-only "forked").
for tl in $transports; do
    mp_job "$tl n=2 forked" 2 "SHOAL_TRANSPORT=$tl" "$prog" forked
done
# A member cannot make a split's child (out of descriptors) and the leader waits in the
# child's bootstrap: an abort of the parent ends that split at once (mp_coll's "splitabort").
for tl in $transports; do
    mp_job "$tl n=3 splitabort" 3 "SHOAL_TRANSPORT=$tl" "$prog" splitabort
done
if [ "${MP_VARIANTS:-1}" != 0 ]; then
    # Forced algorithms and tiny pipeline chunks / windows: many slices per call.
    run "shm n=4 ring chunk=4k" 4 SHOAL_ALGO=ring SHOAL_CHUNK_SIZE=4096
    run "shm n=5 rd" 5 SHOAL_ALGO=rd SHOAL_CHUNK_SIZE=4096
    # SHOAL_ALGO=shm: the cost model may price 4 KiB windows above a channel algorithm
    run "shm n=3 window=4k" 3 SHOAL_ALGO=shm SHOAL_SHM_WINDOW=4096 SHOAL_SHM_ONESHOT_MAX=1024
    run "shm n=2 ll=4k" 2 SHOAL_SHM_LL_MAX=4096
    run "shm n=3 ll=4k" 3 SHOAL_SHM_LL_MAX=4096
    # the LL lines without the prefetch for writing (on in every other shm run)
    run "shm n=3 ll=4k prefetchw=0" 3 SHOAL_SHM_LL_MAX=4096 SHOAL_SHM_PREFETCHW=0
    run "tcp n=3 ring chunk=4k" 3 SHOAL_TRANSPORT=tcp SHOAL_ALGO=ring SHOAL_CHUNK_SIZE=4096
    # 17 ranks: nranks blocks of the largest allgather / reduce-scatter count pass 8 MiB (the
    # test's buffers grow with the rank count; fixed ones overran and crashed the ranks)
    mp_job "shm n=17 allgather reduce_scatter" 17 "" "$prog" allgather reduce_scatter
    # perf/shm_ll_bench switches the prefetch on and off between batches of one communicator
    # and checks every batch's result (a hint must change no value)
    bench=$builddir/shm_ll_bench
    for n in 2 3; do
        n_tap=$((n_tap + 1))
        if [ ! -x "$bench" ]; then
            echo "ok $n_tap - shm_ll_bench n=$n # SKIP $bench not built"
            continue
        fi
        if "$shoalrun" --no-prefix --timeout "$timeout" -n "$n" "$bench" -n 100 -k 3 -w 10 \
            -b 4,8,64,112,168,4096 >"$tmp/llb" 2>&1 && [ "$(grep -c '^size ' "$tmp/llb")" -eq 6 ]; then
            echo "ok $n_tap - shm_ll_bench n=$n: LL results equal with the prefetch on and off"
        else
            echo "not ok $n_tap - shm_ll_bench n=$n"
            sed 's/^/# /' "$tmp/llb" | head
        fi
    done
fi
echo "1..$n_tap"
