#!/bin/sh
# Runs the algorithms of src/coll/{tree,rab,hier,allgather2,bcast2,rs2,alltoall}.c under
# shoalrun with SHOAL_ALGO forcing each one, on odd and even rank counts, over shm and tcp,
# and the hierarchical one on virtual multi-host layouts (hostid_wrap.sh gives each rank group
# its own SHOAL_HOSTID: shm inside a host, tcp across). Rank 0's TAP lines are merged into one
# stream, each prefixed by its configuration; one more line per run checks the exit status.
#
# Environment: top_builddir, top_srcdir (set by make check), MP_TIMEOUT (seconds per run,
# default 240), ALGOS_QUICK=1 for a shorter sweep.

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
shoalrun=$builddir/shoalrun
coll=$builddir/tests/mp/mp_coll
a2a=$builddir/tests/mp/mp_alltoall
wrap=$srcdir/tests/mp/hostid_wrap.sh
timeout=${MP_TIMEOUT:-240}
n_tap=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_algos.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$coll" ] || [ ! -x "$a2a" ]; then
    echo "1..0 # SKIP shoalrun, mp_coll or mp_alltoall not built"
    exit 0
fi

# shellcheck source=tests/mp/run_lib.sh
. "$srcdir/tests/mp/run_lib.sh"

if [ "${ALGOS_QUICK:-0}" = 1 ]; then
    counts="3 4"
else
    counts="2 3 4 5"
fi
ar="allreduce allreduce_big determinism"
for n in $counts; do
    mp_job "shm n=$n dbtree" "$n" "SHOAL_ALGO=dbtree" "$coll" $ar
    mp_job "shm n=$n rab" "$n" "SHOAL_ALGO=rab" "$coll" $ar reduce_scatter
    mp_job "shm n=$n bruck" "$n" "SHOAL_ALGO=bruck" "$coll" allgather
    mp_job "shm n=$n ptree" "$n" "SHOAL_ALGO=ptree" "$coll" broadcast
    mp_job "shm n=$n alltoall" "$n" "" "$a2a"
done
mp_job "shm n=8 dbtree" 8 "SHOAL_ALGO=dbtree" "$coll" allreduce_big
mp_job "shm n=8 rab" 8 "SHOAL_ALGO=rab" "$coll" allreduce_big reduce_scatter
mp_job "tcp n=3 dbtree chunk=4k" 3 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=dbtree SHOAL_CHUNK_SIZE=4096" \
    "$coll" $ar
mp_job "tcp n=5 rab chunk=4k" 5 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=rab SHOAL_CHUNK_SIZE=4096" \
    "$coll" $ar
mp_job "tcp n=4 rab" 4 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=rab" "$coll" reduce_scatter
mp_job "tcp n=3 alltoall chunk=4k" 3 "SHOAL_TRANSPORT=tcp SHOAL_CHUNK_SIZE=4096" "$a2a"
mp_job "tcp n=5 ptree" 5 "SHOAL_TRANSPORT=tcp SHOAL_ALGO=ptree" "$coll" broadcast
# Hierarchical: hosts of 2+2, 2+2+1, 1+1+1, 1+2+3 and interleaved 3+2 ranks.
mp_job "hosts 2x2 hier" 4 "SHOAL_ALGO=hier MP_PPN=2" "$wrap" "$coll" $ar
mp_job "hosts 2+2+1 hier chunk=4k" 5 "SHOAL_ALGO=hier MP_PPN=2 SHOAL_CHUNK_SIZE=4096" \
    "$wrap" "$coll" $ar
mp_job "hosts 1+1+1 hier" 3 "SHOAL_ALGO=hier MP_PPN=1" "$wrap" "$coll" $ar
# Pipeline segments of 4 KiB: the odd counts end in a partial segment, the big ones run
# hundreds of segments through the pipeline's slots (every wait advancing the rings).
mp_job "hosts 2+2+1 hier segment=4k" 5 "SHOAL_ALGO=hier MP_PPN=2 SHOAL_HIER_SEGMENT=4096" \
    "$wrap" "$coll" $ar
if [ "${ALGOS_QUICK:-0}" != 1 ]; then
    mp_job "hosts 1+2+3 hier" 6 "SHOAL_ALGO=hier MP_HOSTMAP=0,1,1,2,2,2" "$wrap" "$coll" $ar
    mp_job "hosts 3+2 interleaved hier" 5 "SHOAL_ALGO=hier MP_HOSTMAP=1,0,1,0,0" "$wrap" "$coll" $ar
    mp_job "hosts 2x2 alltoall" 4 "MP_PPN=2" "$wrap" "$a2a"
fi
# Settings of src/coll set on one rank only: every rank uses rank 0's (rank 1's
# SHOAL_RD_MAX_BYTES cut in-place alltoalls into other pieces than its peers', a protocol
# error; its SHOAL_SHM_DIRECT_MIN took the two-shot road where rank 0 took the direct one, and
# both timed out). MP_RANK1_ENV is exported on rank 1 alone.
rank1='if [ "$SHOAL_RANK" = 1 ]; then export "$MP_RANK1_ENV"; fi; exec "$@"'
mp_job "shm n=3, SHOAL_RD_MAX_BYTES=1m on rank 1 only" 3 \
    "SHOAL_CHUNK_SIZE=4096 MP_RANK1_ENV=SHOAL_RD_MAX_BYTES=1m" sh -c "$rank1" sh "$a2a"
mp_job "shm n=2, SHOAL_SHM_DIRECT_MIN=1g on rank 1 only" 2 \
    "MP_RANK1_ENV=SHOAL_SHM_DIRECT_MIN=1g" sh -c "$rank1" sh "$coll" allreduce_big
echo "1..$n_tap"
