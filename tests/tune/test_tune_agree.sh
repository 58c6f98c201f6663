#!/bin/sh
# Settings that follow the machine (src/tune):
#  - under shoalrun, rank 1 is given another machine profile (and an explicit setting of its
#    own): every rank must still use rank 0's values (tune_rank checks; shm and tcp);
#  - the transport sizes (shm ring, tcp split, ucx inline) are each host's lowest rank's: the
#    shm segment of rank 1 has rank 0's ring although rank 1's own profile gives another;
#  - shoal_info -t prints the profile and each setting with its source: derived, env, file
#    (SHOAL_TUNING_FILE 'set' line, SHOAL_CONF_FILE), default (SHOAL_TUNE=0); the measurement
#    is cached per host (a second run reads it; a file others may write is not trusted);
#    caches are found both by sysfs and (where built in) hwloc.
# Environment: top_builddir, top_srcdir (set by make check).

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
shoalrun=$builddir/shoalrun
info=$builddir/shoal_info
rankp=$builddir/tests/tune/tune_rank
timeout=120
n_tap=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_tune.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ ! -x "$shoalrun" ] || [ ! -x "$info" ] || [ ! -x "$rankp" ]; then
    echo "1..0 # SKIP shoalrun, shoal_info or tune_rank not built"
    exit 0
fi
# shellcheck source=tests/mp/run_lib.sh
. "$srcdir/tests/mp/run_lib.sh"

m0="l2=2m,l3=32m,copy_cache=20,copy=9,reduce=8"
m1="l2=256k,l3=8m,copy_cache=160,copy=2,reduce=1"
export SHOAL_TUNE_CACHE_DIR="$tmp"
mp_job "shm n=3" 3 "SHOAL_TUNE_MACHINE=$m0 TUNE_TEST_RANK1_MACHINE=$m1" "$rankp"
mp_job "shm n=2, rank 1 sets SHOAL_CHUNK_SIZE" 2 \
    "SHOAL_TUNE_MACHINE=$m0 TUNE_TEST_RANK1_MACHINE=$m1 TUNE_TEST_RANK1_ENV=SHOAL_CHUNK_SIZE=256k" \
    "$rankp"
if grep -q "is not rank 0's" "$tmp/err"; then
    n_tap=$((n_tap + 1)); echo "ok $n_tap - rank 1 is told its SHOAL_CHUNK_SIZE lost to rank 0's"
else
    n_tap=$((n_tap + 1)); echo "not ok $n_tap - rank 1 did not warn about its own SHOAL_CHUNK_SIZE"
fi
# the same setting by a 'set' line of rank 1's own SHOAL_TUNING_FILE: it lost as silently as
# it was said to win ('explicit settings always win')
printf 'set CHUNK_SIZE 256k\n' >"$tmp/r1tun"
r1env="TUNE_TEST_RANK1_ENV=SHOAL_TUNING_FILE=$tmp/r1tun"
mp_job "shm n=2, rank 1's SHOAL_TUNING_FILE sets CHUNK_SIZE" 2 \
    "SHOAL_TUNE_MACHINE=$m0 TUNE_TEST_RANK1_MACHINE=$m1 $r1env" "$rankp"
n_tap=$((n_tap + 1))
if grep -q "set CHUNK_SIZE in SHOAL_TUNING_FILE = 262144 is not rank 0's" "$tmp/err"; then
    echo "ok $n_tap - rank 1 is told its tuning file's CHUNK_SIZE lost to rank 0's"
else
    echo "not ok $n_tap - rank 1 did not warn about its tuning file's CHUNK_SIZE"
fi
mp_job "tcp n=3" 3 "SHOAL_TRANSPORT=tcp SHOAL_TUNE_MACHINE=$m0 TUNE_TEST_RANK1_MACHINE=$m1" \
    "$rankp"

# check LABEL PATTERN FILE: one TAP line, ok if the extended regex matches a line of FILE.
check() {
    n_tap=$((n_tap + 1))
    if grep -Eq "$2" "$3"; then
        echo "ok $n_tap - $1"
    else
        echo "not ok $n_tap - $1 (no line matches '$2')"
        sed -e 's/^/# /' "$3" | grep -i -E 'setting|cache|memory|chunk|shm_|model' | head -n 20
    fi
}
info_t() {
    env -u SHOAL_TUNE_MACHINE "$@" "$info" -t -n 2 >"$tmp/info" 2>"$tmp/info.err"
}

rm -f "$tmp"/shoal-tune-*
info_t
check "shoal_info -t: first run measures" "memory \(measured now\): copy in L2 [0-9.]+ GB/s" "$tmp/info"
check "shoal_info -t: the window is derived from the L2" \
    "shm_window +[0-9]+[km] +derived +L2 [0-9]+ KiB / 2" "$tmp/info"
check "shoal_info -t: the one-shot limit is derived from the copy rate" \
    "shm_oneshot_max +[0-9]+k? +derived +2048 x copy in L2" "$tmp/info"
check "shoal_info -t: the model's copy rate is the measured one" \
    "model_copy_rate +[0-9.]+GB/s +derived +8000 x copy from memory [0-9.]+ / 12.0 GB/s" "$tmp/info"
n_tap=$((n_tap + 1))
f=$(ls "$tmp"/shoal-tune-* 2>/dev/null | grep -v '\.lock$' | head -n 1)
if [ -n "$f" ] && [ "$(stat -c %a "$f")" = 600 ]; then
    echo "ok $n_tap - the measurement is cached per host in a 0600 file"
else
    echo "not ok $n_tap - no per-host cache file in $tmp: $(ls "$tmp")"
fi
info_t
check "shoal_info -t: second run reads the per-host cache" "memory \(measured earlier, per-host cache file\)" "$tmp/info"
# The AllReduce choice printed is the one a job makes: SHOAL_TRANSPORT=tcp on one host has no
# intra-node path (shoal_info printed shm at every size where such a job ran rd or ring).
info_t SHOAL_TRANSPORT=tcp
sed -n '/^# allreduce: modelled/,/^# broadcast: modelled/p' "$tmp/info" >"$tmp/info.ar"
check "shoal_info -t with SHOAL_TRANSPORT=tcp on one host: no shm AllReduce" \
    "^# +8 +- .* (rd|ring|dbtree|rab)$" "$tmp/info.ar"
check "... the links within the host are tcp's" "links: intra 20.00 us 1.50 GB/s" "$tmp/info"
[ -n "$f" ] && touch -d '2 hours ago' "$f"
info_t
check "a cache file last written 2 hours ago is measured again" \
    "memory \(measured now, each rate the best of this and the per-host cache file's samples\)" \
    "$tmp/info"
check "... and the record keeps its start, as its second sample" " since [0-9]+ samples 2$" "$f"
[ -n "$f" ] && sed -i "s/ since [0-9]* / since $(($(date +%s) - 8 * 86400)) /" "$f"
info_t
check "a record begun 8 days ago (written now) is measured again" "memory \(measured now\)" \
    "$tmp/info"
check "... and starts again as sample 1" " since [0-9]+ samples 1$" "$f"
[ -n "$f" ] && chmod 0620 "$f"
info_t
check "a cache file others may write is not trusted: measured again" "memory \(measured now\)" "$tmp/info"

info_t SHOAL_SHM_WINDOW=128k
check "SHOAL_SHM_WINDOW wins over the derived value" "shm_window +128k +env +SHOAL_SHM_WINDOW" "$tmp/info"
printf 'shm lat 1.0 bw 5.0\nset CHUNK_SIZE 256k\nset SHM_WINDOW 1m\ncopy lat 0 bw 3.5\n' >"$tmp/tuning"
info_t SHOAL_TUNING_FILE="$tmp/tuning" SHOAL_SHM_WINDOW=128k
check "a tuning file 'set' line wins over the derived value" \
    "chunk_size +256k +file +set CHUNK_SIZE in SHOAL_TUNING_FILE" "$tmp/info"
check "the environment wins over the tuning file" "shm_window +128k +env" "$tmp/info"
check "the tuning file's copy line sets the model's rate" "model_copy_rate +3.50GB/s +file" "$tmp/info"
printf 'SHOAL_SHM_LL_MAX=512\n' >"$tmp/conf"
info_t SHOAL_CONF_FILE="$tmp/conf"
check "SHOAL_CONF_FILE wins over the derived value" \
    "shm_ll_max +512 +file +SHOAL_SHM_LL_MAX in SHOAL_CONF_FILE" "$tmp/info"
info_t SHOAL_TUNE=0
check "SHOAL_TUNE=0: the fixed defaults" "shm_window +512k +default +SHOAL_TUNE=0" "$tmp/info"
info_t SHOAL_TUNE_MACHINE="$m1"
check "SHOAL_TUNE_MACHINE gives the profile" \
    "shm_window +128k +derived +L2 256 KiB / 2" "$tmp/info"

# transport sizes: derived from the profile, explicit settings win, SHOAL_TUNE=0 the constants
info_t SHOAL_TUNE_MACHINE="$m0 tcp_rbuf=512k"
check "shm ring slot from the copy rate in L2" \
    "shm_slot_size +16k +derived +copy in L2 20.0 GB/s x 1000 ns" "$tmp/info"
check "shm ring slots from the copy rate from memory and the L2" \
    "shm_nslots +32 +derived +ring copy 9.0 GB/s x 50 us <= L2 / 2 / slot" "$tmp/info"
check "tcp striping threshold from the receive buffer" \
    "tcp_min_split +1m +derived +2 x tcp receive buffer 512 KiB" "$tmp/info"
check "ucx inline limit from the copy rate in L2" \
    "ucx_inline_max +4k +derived +8192 x copy in L2 20.0" "$tmp/info"
check "ucx single-copy threshold from the L2" \
    "ucx_cma_min +128k +derived +L2 2048 KiB / 16" "$tmp/info"
info_t SHOAL_TUNE_MACHINE="$m0" SHOAL_SHM_NSLOTS=6 SHOAL_TCP_RCVBUF=64k
check "SHOAL_SHM_NSLOTS wins over the derived count" "shm_nslots +6 +env +SHOAL_SHM_NSLOTS" \
    "$tmp/info"
check "SHOAL_TCP_RCVBUF is the receive buffer the split follows" \
    "tcp_min_split +128k +derived +2 x tcp receive buffer 64 KiB" "$tmp/info"
printf 'set SHM_SLOT_SIZE 32k\nset UCX_INLINE_MAX 2k\n' >"$tmp/tuning2"
info_t SHOAL_TUNE_MACHINE="$m0" SHOAL_TUNING_FILE="$tmp/tuning2"
check "a tuning file 'set SHM_SLOT_SIZE' wins" "shm_slot_size +32k +file" "$tmp/info"
if "$info" -b 2>/dev/null | grep -Eq 'ucx +found: yes'; then
    check "a tuning file 'set UCX_INLINE_MAX' wins" "ucx_inline_max +2k +file" "$tmp/info"
    info_t SHOAL_TUNE_MACHINE="$m0" SHOAL_UCX_CMA_MIN=0
    check "SHOAL_UCX_CMA_MIN=0 wins over the derived threshold" \
        "ucx_cma_min +0 +env +SHOAL_UCX_CMA_MIN" "$tmp/info"
else
    n_tap=$((n_tap + 2)); echo "ok $((n_tap - 1)) # SKIP ucx not built in"
    echo "ok $n_tap # SKIP ucx not built in"
fi
info_t SHOAL_TUNE_MACHINE="$m0" SHOAL_TUNE=0
check "SHOAL_TUNE=0: the shm ring's constants" "shm_slot_size +64k +default +SHOAL_TUNE=0" \
    "$tmp/info"
"$info" -c -m >"$tmp/md" 2>/dev/null
check "shoal_info -c -m: the derived defaults say so" \
    "SHOAL_SHM_SLOT_SIZE. \\| derived \\(see .shoal_info -t.\\), else .64k." "$tmp/md"
# README's table holds every row shoal_info -c -m prints (a build without ucx, ib or CUDA
# prints fewer), and a variable that no code reads is not a variable: set, it is named
# unknown (SHOAL_TREE_MAX_BYTES was listed as choosing the broadcast algorithm, read and never
# used: the cost model chooses).
sed -n '/^<!-- BEGIN shoal_info -c -m -->$/,/^<!-- END shoal_info -c -m -->$/p' \
    "$srcdir/README.md" >"$tmp/md.readme"
n_tap=$((n_tap + 1))
grep '^| `' "$tmp/md.readme" | sort | uniq -d >"$tmp/md.dup"
if [ -s "$tmp/md" ] && ! grep -vxF -f "$tmp/md.readme" "$tmp/md" >"$tmp/md.stale" &&
    [ ! -s "$tmp/md.dup" ]; then
    echo "ok $n_tap - README's variable table has every row of shoal_info -c -m, each once"
else echo "not ok $n_tap - README's variable table lacks: $(head -c 300 "$tmp/md.stale");" \
    "twice: $(head -c 300 "$tmp/md.dup")"; fi
# A SHOAL_ name in the sources' comments is a variable of that table or a name the code has;
# one that is neither is stale (shmdirect.c said single copies start at a SHOAL_SHM_CMA_MIN
# that never was: the direct path starts at SHOAL_SHM_DIRECT_MIN). Names ending in '_' are
# families (SHOAL_SHMD_CAP_*), SHOAL_TREE_MAX_BYTES is named as gone. The code's names are
# read with the comments stripped by a compiler (cc -fpreprocessed: GCC).
n_tap=$((n_tap + 1))
if echo 'int x;' | ${CC:-cc} -fpreprocessed -dD -E -P - >/dev/null 2>&1; then
    for f in "$srcdir"/include/*.h "$srcdir"/src/*/*.[ch] "$srcdir"/transports/*/*.[ch]; do
        ${CC:-cc} -fpreprocessed -dD -E -P "$f" 2>/dev/null
    done | grep -ohE '\bSHOAL_[A-Z0-9_]+\b' | LC_ALL=C sort -u >"$tmp/names.code"
    grep -oE '^\| `SHOAL_[A-Z0-9_]+`' "$tmp/md.readme" | grep -oE 'SHOAL_[A-Z0-9_]+' |
        LC_ALL=C sort -u >"$tmp/names.vars"
    grep -ohE '\bSHOAL_[A-Z0-9_]+\b' "$srcdir"/include/*.h "$srcdir"/src/*/*.[ch] \
        "$srcdir"/transports/*/*.[ch] | grep -v '_$' | grep -vx SHOAL_TREE_MAX_BYTES |
        LC_ALL=C sort -u | LC_ALL=C comm -23 - "$tmp/names.code" |
        LC_ALL=C comm -23 - "$tmp/names.vars" >"$tmp/names.stale"
    if [ ! -s "$tmp/names.stale" ]; then
        echo "ok $n_tap - every SHOAL_ name in the sources' comments is a variable or the code's"
    else echo "not ok $n_tap - comments name what is neither a variable nor in the code:" \
        "$(tr '\n' ' ' <"$tmp/names.stale" | head -c 300)"; fi
else
    echo "ok $n_tap # SKIP no compiler that strips comments (cc -fpreprocessed)"
fi
SHOAL_TREE_MAX_BYTES=1m "$info" -c >/dev/null 2>"$tmp/unknown"
check "SHOAL_TREE_MAX_BYTES (never used) is an unknown variable" \
    "unknown environment variable SHOAL_TREE_MAX_BYTES" "$tmp/unknown"
# the shm transport really runs with the derived ring (16k x 32 from m0) on every rank, also
# where a rank's own profile would give another ring (rank 1: m1)
mp_job "shm n=2, derived ring" 2 \
    "SHOAL_DEBUG=info SHOAL_TUNE_MACHINE=$m0 TUNE_TEST_RANK1_MACHINE=$m1" "$rankp"
check "every rank's shm segment has 16k x 32 rings" "rank 1: segment .* rings of 32 x 16384 B" \
    "$tmp/err"

# A tuning file that is there but unusable is reported and left as it was: rank 0 writes the
# measured profile only where there is none (it wrote over a file with one bad line, losing
# the user's other lines).
printf '# my links\nshm lat 1.0 bw fast\n' >"$tmp/tuning_bad"
cp "$tmp/tuning_bad" "$tmp/tuning_bad.orig"
mp_job "shm n=2, malformed tuning file" 2 \
    "SHOAL_TUNE_MACHINE=$m0 TUNE_TEST_RANK1_MACHINE=$m1 SHOAL_TUNING_FILE=$tmp/tuning_bad" \
    "$rankp"
n_tap=$((n_tap + 1))
if cmp -s "$tmp/tuning_bad" "$tmp/tuning_bad.orig" &&
    grep -q "is malformed: its link profile is ignored" "$tmp/err"
then
    echo "ok $n_tap - a malformed tuning file is reported and not written over"
else echo "not ok $n_tap - malformed tuning file: now '$(head -c 200 "$tmp/tuning_bad")'"; fi
# A tuning file is read whole: one past 4 KiB was read cut (its later lines lost, or the
# line at the cut refused as malformed).
{
    i=0
    while [ $i -lt 60 ]; do
        echo "# a comment line of eighty bytes, padding the file past 4 KiB .................."
        i=$((i + 1))
    done
    echo "shm lat 1.25 bw 5.0 send 0.5 recv 0.5"
    echo "tcp lat 20 bw 1.0"
} >"$tmp/tuning_long"
cp "$tmp/tuning_long" "$tmp/tuning_long.orig"
mp_job "shm n=2, tuning file of 5 KiB" 2 \
    "SHOAL_DEBUG=info SHOAL_TUNE_MACHINE=$m0 TUNE_TEST_RANK1_MACHINE=$m1
    SHOAL_TUNING_FILE=$tmp/tuning_long" "$rankp"
n_tap=$((n_tap + 1))
if cmp -s "$tmp/tuning_long" "$tmp/tuning_long.orig" && ! grep -q "malformed" "$tmp/err" &&
    grep -q "link shm: 1.25 us" "$tmp/err"
then
    echo "ok $n_tap - a tuning file of 5 KiB is read whole (its links used, the file kept)"
else
    echo "not ok $n_tap - tuning file of 5 KiB: $(grep -i 'tuning\|link shm' "$tmp/err" | head -n 1)"
fi

# discovery: sysfs and, where built in, hwloc give the same L2 as the kernel
l2=""
for d in /sys/devices/system/cpu/cpu0/cache/index*; do
    [ "$(cat "$d/level" 2>/dev/null)" = 2 ] && l2=$(sed 's/K$//' "$d/size") && break
done
if [ -z "$l2" ] || ! echo "$l2" | grep -Eq '^[0-9]+$'; then
    n_tap=$((n_tap + 1)); echo "ok $n_tap # SKIP no L2 size in sysfs"
else
    info_t SHOAL_TOPO_DISCOVERY=sysfs
    check "caches found by sysfs" "caches \(sysfs\): L1d [0-9]+ KiB, L2 $l2 KiB" "$tmp/info"
    if "$info" -b 2>/dev/null | grep -Eq 'hwloc +found: yes built in'; then
        info_t SHOAL_TOPO_DISCOVERY=hwloc
        check "caches found by hwloc" "caches \(hwloc\): L1d [0-9]+ KiB, L2 $l2 KiB" "$tmp/info"
    else
        n_tap=$((n_tap + 1)); echo "ok $n_tap # SKIP hwloc not built in"
    fi
fi
# shoal_info's options: -n and --ppn are 1..65536 (atoi took abc, -5 and 0 as the default,
# 99999999999 failed without a word, 100000000 ran past 30 s); --help; an unknown option
# is named as given (it printed a NUL byte)
bad=""
for a in "-n abc" "-n -5" "-n 0" "-n 99999999999" "-n 100000000" "-n 20x" "--ppn 0"; do
    # shellcheck disable=SC2086 # the option and its value
    timeout -s KILL 30 "$info" -t $a >"$tmp/opt" 2>&1; r=$?
    [ "$r" -eq 2 ] && grep -q "^shoal_info: ${a% *} takes 1..65536, not '${a#* }'$" "$tmp/opt" ||
        bad="$bad '$a':$r"
done
n_tap=$((n_tap + 1))
if [ -z "$bad" ]; then
    echo "ok $n_tap - shoal_info -t: -n/--ppn outside 1..65536 exit 2 naming the option"
else echo "not ok $n_tap - shoal_info -t: bad -n/--ppn not refused:$bad"; fi
# Its CPU time is bounded, not its wall time: under ASan at load 20 on 2 CPUs the run took
# 45 s on the wall clock and failed a 30 s bound. The shell's times (second line: its
# children's user and system time, "XmY.YYYs") counts shoal_info, which timeout waits for;
# the KILL is only the bound on a hang.
secs=$( (env -u SHOAL_TUNE_MACHINE timeout -s KILL 300 "$info" -t -n 65536 --ppn 1 \
    >"$tmp/info" 2>&1
    echo $? >"$tmp/info.rc"
    times) | awk 'NR == 2 { split($1, u, "m"); split($2, s, "m")
                            printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
r=$(cat "$tmp/info.rc")
n_tap=$((n_tap + 1))
if [ "$r" -eq 0 ] && [ -n "$secs" ] && [ "$secs" -lt 30 ] &&
    grep -q "^# 65536 ranks on 65536 host(s)" "$tmp/info"
then
    echo "ok $n_tap - shoal_info -t -n 65536 --ppn 1 (the most hosts) takes ${secs}s of CPU"
else echo "not ok $n_tap - shoal_info -t -n 65536 --ppn 1: rc $r in ${secs}s of CPU"; fi
"$info" --help >"$tmp/opt" 2>&1; r=$?
"$info" --bogus >"$tmp/opt2" 2>&1; r2=$?
n_tap=$((n_tap + 1))
if [ "$r:$r2" = "0:2" ] && grep -q "^usage: shoal_info" "$tmp/opt" &&
    grep -q "'--bogus'" "$tmp/opt2" && [ "$(tr -d '[:print:]\n' <"$tmp/opt2" | wc -c)" -eq 0 ]
then
    echo "ok $n_tap - shoal_info --help exits 0; an unknown option is named as given, exit 2"
else echo "not ok $n_tap - shoal_info --help rc $r, --bogus rc $r2: $(head -n 1 "$tmp/opt2")"; fi
# -n's default without a topology file: this host's PUs, at least 2 (the usage said the PUs;
# with discovery off, 0 PUs, it shows 2 ranks)
"$info" --help >"$tmp/opt" 2>&1
env -u SHOAL_TUNE_MACHINE SHOAL_TOPO_DISCOVERY=none "$info" -t >"$tmp/info" 2>&1; r=$?
n_tap=$((n_tap + 1))
if [ "$r" -eq 0 ] && grep -q "PUs of this host, at least 2)" "$tmp/opt" &&
    grep -q "^# 2 ranks on 1 host(s)" "$tmp/info"
then
    echo "ok $n_tap - shoal_info -t: -n's default, as the usage says: the PUs, at least 2"
else echo "not ok $n_tap - shoal_info -t -n's default: rc $r: $(grep -h 'PUs of\|ranks on' \
    "$tmp/opt" "$tmp/info")"; fi
# shoal_info -c is a SHOAL_CONF_FILE: only what was set is an assignment (a default or a
# derived value fed back would pin it; a secret's "<set>" would become its value)
env -i PATH="$PATH" SHOAL_DEBUG=INFO SHOAL_SECRET="$(printf '5a%.0s' $(seq 32))" "$info" -c \
    >"$tmp/conf" 2>/dev/null
env -i PATH="$PATH" SHOAL_CONF_FILE="$tmp/conf" "$info" -c >"$tmp/conf2" 2>"$tmp/conf2.err"
n_tap=$((n_tap + 1))
if [ "$(grep '^SHOAL_' "$tmp/conf")" = "SHOAL_DEBUG=INFO" ] &&
    grep -q '^# SHOAL_SECRET=<set>$' "$tmp/conf" &&
    grep -B1 '^SHOAL_DEBUG=INFO$' "$tmp/conf2" | grep -q 'set by: file' &&
    ! grep -q 'ERROR\|WARN' "$tmp/conf2.err"
then
    echo "ok $n_tap - shoal_info -c: only the variables set are assignments (secrets and defaults are comments); fed back as SHOAL_CONF_FILE it loads cleanly"
else echo "not ok $n_tap - shoal_info -c as a conf file: $(grep '^SHOAL_' "$tmp/conf" | head -3 | tr '\n' ' ')"; fi
# A FIFO as SHOAL_TUNING_FILE: the 'set' lines' reader opened it and waited for a writer for
# ever (shoal_info -t and every rank's init); refused at once now, with the reason
mkfifo "$tmp/fifo"
env -u SHOAL_TUNE_MACHINE SHOAL_TUNING_FILE="$tmp/fifo" timeout -s KILL 60 "$info" -t -n 2 \
    >"$tmp/info" 2>"$tmp/info.err"; r=$?
n_tap=$((n_tap + 1))
if [ "$r" -eq 1 ] && grep -q "SHOAL_TUNING_FILE=$tmp/fifo is not a regular file (a FIFO)" "$tmp/info.err"
then
    echo "ok $n_tap - a FIFO as SHOAL_TUNING_FILE is refused at once with the reason (exit 1)"
else echo "not ok $n_tap - a FIFO as SHOAL_TUNING_FILE: rc $r: $(head -n 2 "$tmp/info.err")"; fi
# A malformed SHOAL_TUNING_FILE fails -t as a malformed SHOAL_TOPO_FILE does (it exited 0
# after the error, the topology file's 1)
printf 'shm lat x bw 1\n' >"$tmp/badtun"
printf 'bogus\n' >"$tmp/badtopo"
env -u SHOAL_TUNE_MACHINE SHOAL_TUNING_FILE="$tmp/badtun" "$info" -t -n 2 \
    >"$tmp/info" 2>"$tmp/info.err"; r=$?
env -u SHOAL_TUNE_MACHINE SHOAL_TOPO_FILE="$tmp/badtopo" "$info" -t -n 2 \
    >"$tmp/info2" 2>"$tmp/info2.err"; r2=$?
n_tap=$((n_tap + 1))
if [ "$r:$r2" = "1:1" ] && grep -q "SHOAL_TUNING_FILE line 1" "$tmp/info.err" &&
    grep -q "^# allreduce: modelled" "$tmp/info"
then
    echo "ok $n_tap - shoal_info -t: a malformed SHOAL_TUNING_FILE is exit 1, as a SHOAL_TOPO_FILE"
else echo "not ok $n_tap - shoal_info -t malformed tuning file rc $r, topology file rc $r2:" \
    "$(head -n 1 "$tmp/info.err")"; fi
# The same for SHOAL_CONF_FILE, read at the first call into the library; and /dev/zero, one
# line that getline grew until the memory ran out
env -u SHOAL_TUNE_MACHINE SHOAL_CONF_FILE="$tmp/fifo" timeout -s KILL 60 "$info" -c \
    >"$tmp/info" 2>"$tmp/info.err"; r=$?
# (a bound on the address space, so that a regression fails instead of taking the host's
# memory; not under ASan, which reserves terabytes for its shadow)
vlim=4000000
ldd "$info" 2>/dev/null | grep -q 'libasan\|libtsan' && vlim=unlimited
(ulimit -v "$vlim"; env -u SHOAL_TUNE_MACHINE SHOAL_CONF_FILE=/dev/zero timeout -s KILL 60 \
    "$info" -c >"$tmp/info2" 2>"$tmp/info2.err"); r2=$?
n_tap=$((n_tap + 1))
if [ "$r:$r2" = "0:0" ] &&
    grep -q "SHOAL_CONF_FILE $tmp/fifo is not a regular file (a FIFO, a directory, a device): ignored" "$tmp/info.err" &&
    grep -q "SHOAL_CONF_FILE /dev/zero is not a regular file" "$tmp/info2.err"
then
    echo "ok $n_tap - a FIFO or /dev/zero as SHOAL_CONF_FILE is refused at once with the reason"
else echo "not ok $n_tap - SHOAL_CONF_FILE FIFO rc $r, /dev/zero rc $r2: $(head -n 2 "$tmp/info.err" "$tmp/info2.err")"; fi
# A link line of SHOAL_TOPO_FILE that leaves parts out keeps their usual values: 'link inter
# lat 100' alone was a link of bandwidth 0, which the cost model dropped for tcp's default
# (20 us): shoal_info printed 'inter 100.00 us 0.000 GB/s' and modelled 8 B across two hosts
# in 32 us with recursive doubling
printf 'hosts 2\nppn 2\nlink inter lat 100\n' >"$tmp/topo"
env -u SHOAL_TUNE_MACHINE -u SHOAL_TUNING_FILE -u SHOAL_TRANSPORT SHOAL_TOPO_FILE="$tmp/topo" \
    "$info" -t -n 4 >"$tmp/info" 2>"$tmp/info.err"
check "a topology file's 'link inter lat 100': that latency, tcp's usual bandwidth" \
    "links: intra .* inter 100.00 us 1.500 GB/s" "$tmp/info"
sed -n '/^# allreduce: modelled/,/^# broadcast: modelled/p' "$tmp/info" >"$tmp/info.ar"
n_tap=$((n_tap + 1))
if awk '$2 == 8 { for (i = 3; i < NF; i++) if ($i != "-" && $i + 0 < 100) bad = 1; seen = 1 }
        END { exit !(seen && !bad) }' "$tmp/info.ar"; then
    echo "ok $n_tap - ... and every AllReduce of 8 B across the two hosts is modelled at 100 us or more"
else
    echo "not ok $n_tap - 8 B across hosts modelled below the file's 100 us: $(grep -E '^# +8 ' "$tmp/info.ar")"
fi
# Without -n, the ranks the topology file describes, as the usage says (this host's PUs were
# taken: 'hosts 4, ppn 8' printed 2 ranks on one host); a file that does not say: the PUs
printf 'hosts 4\nppn 8\nsockets 2\n' >"$tmp/topo"
env -u SHOAL_TUNE_MACHINE SHOAL_TOPO_FILE="$tmp/topo" "$info" -t >"$tmp/info" 2>"$tmp/info.err"
check "shoal_info -t without -n: the topology file's 32 ranks on 4 hosts" \
    "^# 32 ranks on 4 host\(s\) from " "$tmp/info"
printf 'hosts 2\n' >"$tmp/topo"
env -u SHOAL_TUNE_MACHINE SHOAL_TOPO_FILE="$tmp/topo" "$info" -t >"$tmp/info" 2>"$tmp/info.err"
check "... a file that gives no rank count: this host's PUs (at least 2)" \
    "^# ([2-9]|[1-9][0-9]+) ranks on (1|2) host\(s\) from " "$tmp/info"
# Ranks whose own SHOAL_RING_ORDER or SHOAL_TOPO_FILE differ from rank 0's built other rings:
# init passed, and the first ring AllReduce waited for a peer that sent elsewhere until
# SHOAL_TIMEOUT_MS (20 s here), then blamed that peer. Every rank must now fail init at once,
# saying what differs.
printf 'hosts 2\nlayout cyclic\n' >"$tmp/topo"
printf 'hosts 2\n' >"$tmp/topo2"
# sysfs of a kernel that reports no package (physical_package_id -1, some arm64 machines and
# VMs): every CPU was skipped as absent, discovery failed whole, and the caches were unknown
# (the settings their fixed defaults). A fake cpu tree mounted in a private mount namespace.
fake="$tmp/fakecpu"
for c in 0 1; do
    mkdir -p "$fake/cpu$c/topology"
    echo -1 >"$fake/cpu$c/topology/physical_package_id"
    echo "$c" >"$fake/cpu$c/topology/core_id"
done
fake_cache() { # fake_cache INDEX LEVEL TYPE SIZE
    mkdir -p "$fake/cpu0/cache/index$1"
    echo "$2" >"$fake/cpu0/cache/index$1/level"
    echo "$3" >"$fake/cpu0/cache/index$1/type"
    echo "$4" >"$fake/cpu0/cache/index$1/size"
}
fake_cache 0 1 Data 48K
fake_cache 1 1 Instruction 32K
fake_cache 2 2 Unified 2048K
fake_cache 3 3 Unified 32M
n_tap=$((n_tap + 1))
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
    echo "ok $n_tap # SKIP not root or no unshare -m: cannot mount a fake sysfs"
elif unshare -m sh -c 'mount --bind "$1" /sys/devices/system/cpu && shift && exec "$@"' sh \
    "$fake" env -u SHOAL_TUNE_MACHINE SHOAL_TOPO_DISCOVERY=sysfs "$info" -t -n 2 \
    >"$tmp/info" 2>"$tmp/info.err" &&
    grep -Eq 'caches \(sysfs\): L1d 48 KiB, L2 2048 KiB, L3 32768 KiB; 2 cores' "$tmp/info"; then
    echo "ok $n_tap - sysfs without package ids: the CPUs and caches are still found"
else
    echo "not ok $n_tap - sysfs without package ids: $(grep -m 1 'caches (' "$tmp/info")"
fi
for case in "rank 0 sets SHOAL_RING_ORDER=rank:SHOAL_RING_ORDER=rank" \
    "rank 0 has another SHOAL_TOPO_FILE:SHOAL_TOPO_FILE=$tmp/topo2"; do
    t0=$(date +%s)
    env -u SHOAL_TRANSPORT -u SHOAL_TUNE_MACHINE "$shoalrun" --no-prefix --timeout 60 -n 4 \
        -x SHOAL_TOPO_FILE="$tmp/topo" -x SHOAL_TIMEOUT_MS=20000 -x SHOAL_ALGO=ring \
        -x TOPO_TEST_RANK0_ENV="${case#*:}" \
        sh -c '[ "$SHOAL_RANK" = 0 ] && export "$TOPO_TEST_RANK0_ENV"; exec "$0"' \
        "$builddir/examples/allreduce" >"$tmp/out" 2>"$tmp/err"
    r=$?
    secs=$(($(date +%s) - t0))
    n_tap=$((n_tap + 1))
    if [ "$r" -ne 0 ] && [ "$secs" -lt 15 ] &&
        [ "$(grep -c 'than rank 0 (.*): they must be the same on every rank' "$tmp/err")" -eq 4 ]; then
        echo "ok $n_tap - ${case%%:*}: every rank's init fails at once, saying so (${secs} s)"
    else
        echo "not ok $n_tap - ${case%%:*}: rc $r after ${secs} s: $(grep -m 3 ERROR "$tmp/err")"
    fi
done
# SHOAL_TUNE_MACHINE giving some rates: the others are measured (or read from the per-host
# cache file), as the caches it does not give are discovered. 'copy=9.5' alone left the copy in
# L2 and the reduction at 0.00 GB/s, and the limits that follow the copy in L2 at their fixed
# defaults ('copy rate unknown'), the model's reduction rate 'not measured'.
nz='(0\.0[1-9]|0\.[1-9]|[1-9])'
info_t SHOAL_TUNE_MACHINE=copy=9.5
check "SHOAL_TUNE_MACHINE=copy=9.5: that rate, the others measured" \
    "memory \(SHOAL_TUNE_MACHINE where it gives them, else measured\): copy in L2 $nz[0-9.]* GB/s, copy from memory 9.50 GB/s, reduce from memory $nz" \
    "$tmp/info"
check "... and the limits that follow the copy in L2 are derived from it" \
    "shm_ll_max +[0-9]+ +derived +64 x copy in L2 $nz" "$tmp/info"
echo "1..$n_tap"
