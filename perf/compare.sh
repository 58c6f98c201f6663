#!/bin/sh
# Side by side: shoal vs Open MPI (as a user gets it, and with glibc's malloc tuned so that it
# does not map and fault in a fresh temporary per call) vs Gloo's ring-chunked AllReduce, on
# the same ranks, sizes and machine in one run, alternating, REPS repetitions (median).
# Prints per size each one's time and busbw and the ratios shoal/other, the physical limit
# measured on the spot and shoal's fraction of it, and writes a PNG plot of busbw vs size.
#
# usage: perf/compare.sh [MODE...] [--reps K] [--full] [--build DIR] [--out DIR]
#   --shm N              N ranks on this host, shared memory (shoal's automatic choice; shoal
#                        again with its buffers from shoal_mem_alloc: column shoal_mem)
#   --tcp N              N ranks over loopback TCP (SHOAL_TRANSPORT=tcp; Open MPI with
#                        --mca pml ob1 --mca btl self,tcp)
#   --ucx N              N ranks over UCX (SHOAL_TRANSPORT=ucx) vs Open MPI's pml ucx
#                        (--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any: Open MPI
#                        4.1 refuses UCX here without them), both on what UCX finds (sysv/cma/tcp)
#   --netns HxP          H network-namespace hosts x P ranks (tests/netns harness, root only):
#                        shoal with the topology-aware ring on block placement, shoal with a
#                        host-oblivious ring (SHOAL_ALGO=ring SHOAL_RING_ORDER=rank) over interleaved ranks,
#                        Gloo (block placement) and Open MPI over TCP (btl tcp, block placement,
#                        daemons started in the namespaces by perf/netns_rsh.sh)
#   --rate R             shape every netns host link to R (tc htb; default 1gbit)
#   --full               more sizes (factor 2), up to 256 MiB, more iterations
# Default: --shm 2. Data: float sum, in place (Gloo's algorithm is in place only), 8 B to
# 32 KiB with -w 1000 -n 20000 (Gloo -w 100 -n 1000), 256 KiB to 64 MiB with -w 5 -n 20
# (netns: -w 20 -n 200 and -w 1 -n 5). Each mode's table is followed by one of the same
# launches' out-of-place times (shoal against each program that has them, and shoal's in
# place / out of place).
# Environment: COMPARE_TIMEOUT (seconds per launch, default 300).

here=$(cd "$(dirname "$0")" && pwd)
srcdir=$(cd "$here/.." && pwd)
build=""
out=""
reps=3
full=0
rate=1gbit
modes=""
tmo=${COMPARE_TIMEOUT:-300}
tuned_env="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"

die() {
    echo "compare.sh: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case $1 in
    --shm|--tcp|--ucx|--netns) [ $# -ge 2 ] || die "$1 needs an argument"; modes="$modes ${1#--}:$2"; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --full) full=1; shift ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
modes=${modes:-" shm:2"}
if [ -z "$build" ]; then
    for d in . "$srcdir/build" "$srcdir"; do
        if [ -x "$d/allreduce_perf" ]; then build=$(cd "$d" && pwd); break; fi
    done
fi
[ -n "$build" ] && [ -x "$build/allreduce_perf" ] || die "no allreduce_perf: build first, or --build DIR"
out=${out:-$build/compare-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out/raw" || die "cannot make $out"
have_mpi=0
[ -x "$build/allreduce_perf_mpi" ] && command -v mpirun >/dev/null 2>&1 && have_mpi=1
have_gloo=0
[ -x "$build/gloo_twin" ] && have_gloo=1

# The small sizes run 20000 calls each (5-200 ms): with 1000 (0.3-0.5 ms at 8-512 B), one
# preemption of 0.1-0.2 ms moved a measurement by a third, and it hit shoal and Open MPI
# alike (2026-12-05 ucx run: Open MPI 512 B 0.62/0.85/0.63 us, shoal 64 B 0.81/0.54/0.44 us
# in place over three launches), so that the medians of 3 compared preemptions. Gloo keeps
# 1000: its calls take 0.2-0.3 ms each.
if [ "$full" = 1 ]; then
    small="-b 8 -e 32K -f 2 -w 1000 -n 20000"
    small_slow="-b 8 -e 32K -f 2 -w 100 -n 1000"
    large="-b 64K -e 256M -f 2 -w 5 -n 50"
else
    small="-b 8 -e 32K -f 8 -w 1000 -n 20000"
    small_slow="-b 8 -e 32K -f 8 -w 100 -n 1000"
    large="-b 256K -e 64M -f 4 -w 5 -n 20"
fi

log() {
    echo "$*" >&2
}

# collect NAME FILE REP: appends "name size time busbw wrong oop_time" rows to data: the
# in-place columns, and the out-of-place time ("-" where the program has none: Gloo).
# busbw is recomputed from size and time (the tables round it to 2 decimals):
# busbw = size / time * 2(N-1)/N, N = $cur_nranks.
collect() {
    awk -v name="$1" -v n="$cur_nranks" '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ && $10 > 0 {
        print name, $1, $10, $1 / $10 / 1e3 * 2 * (n - 1) / n, $13,
              ($6 ~ /^[0-9.]+$/ && $6 > 0 ? $6 : "-") }' "$2" >>"$out/data.$mode_tag"
}

# run_sweeps NAME LAUNCHER...: the two sweeps under the given launch command.
run_sweeps() {
    name=$1
    shift
    for sweep in small large; do
        eval "args=\$$sweep"
        [ "$name" = gloo ] && [ "$sweep" = small ] && args=$small_slow
        f="$out/raw/$mode_tag.$name.$rep.$sweep.txt"
        # shellcheck disable=SC2086 # args is a word list
        "$@" $args >"$f" 2>"$f.err"
        rc=$?
        if [ "$rc" -ne 0 ]; then
            log "  $name ($sweep sweep) exited $rc; see $f.err"
        fi
        collect "$name" "$f"
    done
}

shoal_local() { # shoal_local N [VAR=VALUE...] -- perf args
    n=$1
    shift
    xs=""
    while [ "$1" != "--" ]; do xs="$xs -x $1"; shift; done
    shift
    # shellcheck disable=SC2086
    "$build/shoalrun" --no-prefix --timeout "$tmo" -n "$n" $xs "$build/allreduce_perf" "$@"
}

ompi() { # ompi N tuned|user [mca...] -- perf args
    n=$1
    how=$2
    shift 2
    mca=""
    while [ "$1" != "--" ]; do mca="$mca $1"; shift; done
    shift
    if [ "$how" = tuned ]; then
        # shellcheck disable=SC2086
        GLIBC_TUNABLES=$tuned_env timeout -k 5 "$tmo" mpirun --allow-run-as-root --oversubscribe \
            -np "$n" -x GLIBC_TUNABLES $mca "$build/allreduce_perf_mpi" "$@"
    else
        # shellcheck disable=SC2086
        timeout -k 5 "$tmo" mpirun --allow-run-as-root --oversubscribe -np "$n" $mca \
            "$build/allreduce_perf_mpi" "$@"
    fi
}

gloo_local() { # gloo_local N -- perf args
    n=$1
    shift 2
    store=$(mktemp -d "$out/raw/gloo-store.XXXXXX")
    "$build/shoalrun" --no-prefix --timeout "$tmo" -n "$n" "$build/gloo_twin" --store "$store" \
        --host 127.0.0.1 "$@"
    rc=$?
    rm -rf "$store"
    return $rc
}

# ---- netns launches (tests/netns/netns_lib.sh) ----
shoal_ns() { # shoal_ns P block|interleave [VAR=VALUE...] -- perf args
    p=$1
    place=$2
    shift 2
    envs=""
    while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
    shift
    NETNS_ENV="$envs" netns_job "$NETNS_TMP/job" "$p" "$place" "$tmo" "$build/allreduce_perf" "$@"
    rc=$?
    cat "$NETNS_TMP/job.0.out"
    cat "$NETNS_TMP"/job.*.err >&2
    return $rc
}

gloo_ns() { # gloo_ns P -- perf args
    p=$1
    shift 2
    store=$(mktemp -d "$out/raw/gloo-store.XXXXXX")
    NETNS_ENV="" netns_job "$NETNS_TMP/job" "$p" block "$tmo" "$build/gloo_twin" --store "$store" \
        --iface veth0 "$@"
    rc=$?
    cat "$NETNS_TMP/job.0.out"
    cat "$NETNS_TMP"/job.*.err >&2
    rm -rf "$store"
    return $rc
}

ompi_ns() { # ompi_ns P -- perf args: Open MPI over TCP across the namespaces, block placement
    p=$1
    shift 2
    hosts=""
    k=1
    while [ "$k" -le "$netns_nhosts" ]; do
        hosts="$hosts${hosts:+,}10.99.0.$k:$p"
        k=$((k + 1))
    done
    # mpirun runs in the first host (its own UTS namespace); netns_rsh.sh starts the daemons of
    # the others. btl tcp only: shared memory between "hosts" would bypass the shaped links.
    # shellcheck disable=SC2016 # expanded by the inner shell
    SHOAL_NETNS_PREFIX=$netns_prefix timeout -k 5 "$tmo" ip netns exec "$netns_prefix-0" \
        unshare --uts sh -c 'hostname nshost1 && exec "$@"' sh \
        mpirun --allow-run-as-root --oversubscribe --host "$hosts" -np "$((p * netns_nhosts))" \
        --mca plm_rsh_agent "$here/netns_rsh.sh" --mca pml ob1 --mca btl self,tcp \
        --mca btl_tcp_if_include 10.99.0.0/24 --mca oob_tcp_if_include 10.99.0.0/24 \
        "$build/allreduce_perf_mpi" "$@"
}

# median of the values on stdin
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# col_median NAME SIZE FIELD: the median over the repetitions of one column of the mode's
# data rows ("-", a column the program has none of, left out).
col_median() {
    awk -v n="$1" -v s="$2" -v f="$3" '$1 == n && $2 == s && $f != "-" { print $f }' \
        "$out/data.$mode_tag" | median
}

# membw_run N WHEN: perf/membw with 1..min(N, CPUs) threads into raw/membw.MODE.WHEN.txt;
# prints the best copy bandwidth, GB/s.
membw_run() {
    ncpu=$(nproc)
    t=$(($1 < ncpu ? $1 : ncpu))
    list=1
    i=2
    while [ "$i" -le "$t" ]; do list="$list,$i"; i=$((i + 1)); done
    "$build/membw" -s 64M -t "$list" -r 10 >"$out/raw/membw.$mode_tag.$2.txt" 2>&1
    awk '$1 == "membw" && $5 > m { m = $5 } END { print m + 0 }' "$out/raw/membw.$mode_tag.$2.txt"
}

# bound_shm N: the shm AllReduce busbw bound from the copy bandwidth, GB/s (sets bound_text).
# The machine's copy bandwidth moves between runs (10-15.6 GB/s on one 2-vCPU VM in a day), so
# it is measured before and after the mode's runs ($bw_before) and the higher one is used.
bound_shm() {
    n=$1
    ncpu=$(nproc)
    t=$((n < ncpu ? n : ncpu))
    bw_after=$(membw_run "$n" after)
    bw=$(awk -v a="$bw_before" -v b="$bw_after" 'BEGIN { print (a > b ? a : b) }')
    bound=$(awk -v b="$bw" -v n="$n" 'BEGIN { printf "%.2f", 4 * (n - 1) * b / (n * (3 * n - 1)) }')
    bound_text="memory copy bandwidth B = $bw GB/s (perf/membw, best of 1..$t threads, 64 MiB;
# the higher of $bw_before before and $bw_after after this mode's runs)
# AllReduce bound on one host: every input byte read once (N*S), every output byte written
# once (N*S), each result byte read by the N-1 ranks that did not reduce it ((N-1)*S):
# traffic >= (3N-1)*S at 2*B bytes/s (a copy reads and writes), so
# busbw = 2(N-1)/N * S/t <= 4(N-1)*B / (N(3N-1)) = $bound GB/s for N=$n"
}

# report TITLE BOUND: the table of medians and the plot for the current mode.
report() {
    title=$1
    bnd=$2
    names=$(awk '{ print $1 }' "$out/data.$mode_tag" | awk '!seen[$0]++')
    sizes=$(awk '{ print $2 }' "$out/data.$mode_tag" | sort -n | uniq)
    med="$out/median.$mode_tag"
    : >"$med"
    for s in $sizes; do
        line="$s"
        for nm in $names; do
            tm=$(col_median "$nm" "$s" 3)
            bw=$(col_median "$nm" "$s" 4)
            line="$line $tm $bw"
        done
        echo "$line" >>"$med"
    done
    wrong=$(awk '$5 != 0 && $5 != "N/A" { n++ } END { print n + 0 }' "$out/data.$mode_tag")
    echo
    echo "## $title"
    echo "# medians of $reps runs; time in us, busbw in GB/s (float sum, in place);"
    echo "# t-ratio = shoal time / other time (< 1: shoal faster), bw-ratio = shoal busbw / other"
    case " $names " in
    *" shoal_mem "*)
        echo "# shoal_mem: shoal with its buffers from shoal_mem_alloc (allreduce_perf -m 1); the"
        echo "# other columns use ordinary (malloc) buffers; %bound_mem is shoal_mem's busbw / bound" ;;
    esac
    [ "$wrong" -ne 0 ] && echo "# WARNING: $wrong measurements had wrong results (see $out/raw)"
    set -- $names
    first=$1
    shift
    others="$*"
    awk -v names="$first $others" -v bnd="$bnd" '
        BEGIN { k = split(names, nm, " ")
                printf "%10s %10s %8s", "size(B)", nm[1] "_us", nm[1] "_bw"
                for (i = 2; i <= k; i++) printf " | %13s %8s %7s %7s", nm[i] "_us", nm[i] "_bw", "t-ratio", "bw-ratio"
                if (bnd > 0) printf " | %6s", "%bound"
                memcol = 0
                for (i = 2; i <= k; i++) if (nm[i] == "shoal_mem") memcol = 2 * i + 1
                if (bnd > 0 && memcol > 0) printf " %10s", "%bound_mem"
                printf "\n" }
        { printf "%10d %10.2f %8.4f", $1, $2, $3
          for (i = 2; i <= k; i++) {
              t = $(2 * i); b = $(2 * i + 1)
              printf " | %13.2f %8.4f %7.2f %7.2f", t, b, (t > 0 ? $2 / t : 0), (b > 0 ? $3 / b : 0)
          }
          if (bnd > 0) printf " | %5.0f%%", 100 * $3 / bnd
          if (bnd > 0 && memcol > 0) printf " %9.0f%%", 100 * $memcol / bnd
          printf "\n" }' "$med"
    plot "$title" "$names" "$bnd"
    report_oop "$title" "$names"
}

# report_oop TITLE NAMES: the out-of-place times of the same launches (medians), shoal's
# against each other that has them, and shoal's in place / out of place (issue 14's targets:
# no size where another is faster, in either placement; in place never slower).
report_oop() {
    oop_title=$1
    oop_names=""
    for nm in $2; do
        awk -v n="$nm" '$1 == n && $6 != "-" { f = 1 } END { exit !f }' "$out/data.$mode_tag" &&
            oop_names="$oop_names $nm"
    done
    # shellcheck disable=SC2086 # a word list
    set -- $oop_names
    [ "$1" = shoal ] || return 0
    medo="$out/median_oop.$mode_tag"
    : >"$medo"
    for s in $(awk '{ print $2 }' "$out/data.$mode_tag" | sort -n | uniq); do
        line="$s $(col_median shoal "$s" 3)"
        for nm in $oop_names; do
            line="$line $(col_median "$nm" "$s" 6)"
        done
        echo "$line" >>"$medo"
    done
    echo
    echo "## $oop_title: out of place (the same launches' out-of-place columns; medians, us)"
    echo "# t-ratio = shoal's out-of-place time / the other's (< 1: shoal faster);"
    echo "# shoal ip/oop = shoal's in-place time / its out-of-place time (> 1: in place slower);"
    case " $oop_names " in
    *" shoal_mem "*) echo "# shoal_mem is shoal's own path for shoal_mem_alloc buffers, not a competitor" ;;
    esac
    awk -v names="$oop_names" '
        BEGIN { k = split(names, nm, " ")
                printf "%10s %13s", "size(B)", "shoal_oop_us"
                for (i = 2; i <= k; i++) printf " | %17s %7s", nm[i] "_oop_us", "t-ratio"
                printf " | %14s\n", "shoal ip/oop" }
        { printf "%10d %13.2f", $1, $3
          for (i = 2; i <= k; i++) {
              t = $(i + 2)
              printf " | %17.2f %7.2f", t, (t > 0 ? $3 / t : 0)
              if (nm[i] !~ /^shoal/ && t > 0 && slower_than($3, t)) slower++
          }
          r = ($3 > 0 ? $2 / $3 : 0)
          printf " | %14.2f\n", r
          if (slower_than($2, $3)) ipslow++ }
        END { printf "# slower by more than 2%% and 0.01 us (the tables\047 resolution): shoal out of"
              printf " place than another program at %d sizes x programs;", slower
              printf " shoal in place than out of place at %d sizes\n", ipslow }
        function slower_than(a, b) { return a > b * 1.02 + 0.01 }' "$medo"
}

plot() {
    png="$out/busbw-$mode_tag.png"
    if ! command -v gnuplot >/dev/null 2>&1; then
        echo "# gnuplot not found: no plot"
        return
    fi
    {
        echo "set terminal pngcairo size 1000,650 noenhanced" 2>/dev/null
        echo "set output '$png'"
        echo "set title '$1: AllReduce busbw (median of $reps)'"
        echo "set logscale x 2; set logscale y 10; set grid"
        echo "set xlabel 'message size (bytes)'; set ylabel 'busbw (GB/s)'; set key left top"
        echo "set format x '%.0s%cB'"
        printf "plot "
        i=0
        sep=""
        for nm in $2; do
            printf "%s'%s' using 1:%d with linespoints title '%s'" "$sep" "$out/median.$mode_tag" $((i * 2 + 3)) "$nm"
            sep=", "
            i=$((i + 1))
        done
        if [ -n "$3" ] && [ "$3" != 0 ]; then
            printf "%s%s with lines dashtype 2 title 'limit %s GB/s'" "$sep" "$3" "$3"
        fi
        echo
    } >"$out/plot.$mode_tag.gp"
    if gnuplot "$out/plot.$mode_tag.gp" 2>"$out/plot.$mode_tag.err" ||
        { sed -i 's/pngcairo/png/' "$out/plot.$mode_tag.gp" && gnuplot "$out/plot.$mode_tag.gp" 2>"$out/plot.$mode_tag.err"; }; then
        echo "# plot: $png"
    else
        echo "# plot failed: $(head -n 2 "$out/plot.$mode_tag.err")"
    fi
}

run_local_mode() { # shm|tcp|ucx N
    kind=$1
    n=$2
    cur_nranks=$n
    mode_tag="$kind$n"
    : >"$out/data.$mode_tag"
    if [ "$kind" = tcp ]; then
        shoal_env="SHOAL_TRANSPORT=tcp"
        mca_user="--mca pml ob1 --mca btl self,tcp"
        title="TCP loopback, $n ranks"
    elif [ "$kind" = ucx ]; then
        shoal_env="SHOAL_TRANSPORT=ucx"
        mca_user="--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any"
        title="UCX, $n ranks (shoal over UCX vs Open MPI pml ucx)"
    else
        shoal_env="SHOAL_TIMEOUT_MS=60000"
        mca_user=""
        title="shared memory, $n ranks"
    fi
    [ "$kind" = shm ] && bw_before=$(membw_run "$n" before)
    rep=1
    while [ "$rep" -le "$reps" ]; do
        log "[$title] repetition $rep of $reps"
        run_sweeps shoal shoal_local "$n" $shoal_env --
        if [ "$kind" = shm ]; then
            # the same with the buffers from shoal_mem_alloc (allreduce_perf -m 1): no staging
            # and no kernel copy, the path a user who allocates with it gets
            run_sweeps shoal_mem shoal_local "$n" $shoal_env -- -m 1
        fi
        if [ "$have_mpi" = 1 ]; then
            run_sweeps ompi ompi "$n" user $mca_user --
            run_sweeps ompi_tuned ompi "$n" tuned $mca_user --
        fi
        if [ "$have_gloo" = 1 ] && [ "$kind" != ucx ]; then
            run_sweeps gloo gloo_local "$n" --
        fi
        rep=$((rep + 1))
    done
    if [ "$kind" = shm ]; then
        bound_shm "$n"
        echo
        echo "# $bound_text"
        report "$title" "$bound"
    else
        echo
        echo "# no physical limit is measured for $kind (kernel or UCX copies); see the shm bound"
        report "$title" 0
    fi
}

run_netns_mode() { # HxP
    hp=$1
    h=${hp%x*}
    p=${hp#*x}
    mode_tag="netns$hp"
    cur_nranks=$((h * p))
    : >"$out/data.$mode_tag"
    NETNS_TMP="$out/raw/netns.tmp"
    NETNS_MKUID="$build/tests/netns/mkuid"
    mkdir -p "$NETNS_TMP"
    [ -x "$NETNS_MKUID" ] || die "$NETNS_MKUID not built (make check builds it, or make tests/netns/mkuid)"
    # shellcheck source=tests/netns/netns_lib.sh
    . "$srcdir/tests/netns/netns_lib.sh"
    netns_usable || die "network namespaces unavailable: $netns_why"
    netns_setup "$h" "$rate" || die "namespace setup failed"
    title="netns $h hosts x $p ranks, links shaped to $rate"
    # A shaped link is slow (64 MiB takes about a second at 1 Gbit/s): fewer iterations.
    small_saved=$small
    small_slow_saved=$small_slow
    large_saved=$large
    small="-b 8 -e 32K -f 8 -w 20 -n 200"
    small_slow=$small
    large="-b 256K -e 64M -f 4 -w 1 -n 5"
    [ "$full" = 1 ] && large="-b 64K -e 64M -f 2 -w 2 -n 10"
    rep=1
    while [ "$rep" -le "$reps" ]; do
        log "[$title] repetition $rep of $reps"
        run_sweeps shoal shoal_ns "$p" block SHOAL_TIMEOUT_MS=120000 --
        run_sweeps shoal_oblivious shoal_ns "$p" interleave SHOAL_TIMEOUT_MS=120000 SHOAL_ALGO=ring SHOAL_RING_ORDER=rank --
        run_sweeps shoal_interleaved shoal_ns "$p" interleave SHOAL_TIMEOUT_MS=120000 --
        if [ "$have_gloo" = 1 ]; then
            run_sweeps gloo gloo_ns "$p" --
        fi
        if [ "$have_mpi" = 1 ] && command -v unshare >/dev/null 2>&1; then
            run_sweeps ompi ompi_ns "$p" --
        fi
        rep=$((rep + 1))
    done
    netns_cleanup
    small=$small_saved
    small_slow=$small_slow_saved
    large=$large_saved
    gbps=$(echo "$rate" | awk '{ v = $1 + 0; u = tolower($1); sub(/^[0-9.]+/, "", u)
        m = (u == "gbit") ? 1e9 : (u == "mbit") ? 1e6 : (u == "kbit") ? 1e3 : 1
        printf "%.4f", v * m / 8 / 1e9 }')
    n=$((h * p))
    echo
    echo "# link rate $rate = $gbps GB/s per direction per host (tc htb on both ends of each veth)"
    echo "# bounds: a flat ring whose ranks are grouped by host crosses each host link once per"
    echo "# direction, and that rank's edge carries 2(N-1)/N * S, so busbw = 2(N-1)/N * S/t <= rate;"
    hbound=$(awk -v n=$n -v h=$h -v r=$gbps 'BEGIN { printf "%.4f", (n - 1) / n * h / (h - 1) * r }')
    echo "# hierarchical (reduce-scatter inside the host, allreduce across, allgather inside):"
    echo "# each host sends 2(H-1)/H * S, busbw <= (N-1)/N * H/(H-1) * rate = $hbound GB/s;"
    echo "# a ring over interleaved ranks crosses at every hop: P edges share each link, busbw <= rate/P."
    echo "# %bound below is busbw / the hierarchical bound $hbound GB/s (issue 14's target: >= 90% from 4 MiB)"
    echo "# shoal = block placement, automatic choice; shoal_oblivious = interleaved ranks with"
    echo "# SHOAL_ALGO=ring SHOAL_RING_ORDER=rank (crosses hosts at every hop); shoal_interleaved = interleaved ranks,"
    echo "# automatic (topology-aware) choice and order; gloo = block placement; ompi = Open MPI"
    echo "# over TCP (btl tcp, block placement)"
    report "$title" "$hbound"
}

{
    echo "# perf/compare.sh on $(hostname), $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "# build: $build; raw outputs: $out/raw"
    echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine skews every figure)"
    echo "# shoal: $("$build/shoal_info" -v 2>/dev/null | head -n 1 | sed 's/^# *//')"
    [ "$have_mpi" = 1 ] && echo "# Open MPI: $(mpirun --version 2>/dev/null | head -n 1); tuned = GLIBC_TUNABLES=$tuned_env"
    [ "$have_mpi" = 1 ] || echo "# Open MPI: not run (allreduce_perf_mpi not built or mpirun missing)"
    [ "$have_gloo" = 1 ] || echo "# Gloo: not run (gloo_twin not built)"
    for m in $modes; do
        case $m in
        shm:*) run_local_mode shm "${m#shm:}" ;;
        tcp:*) run_local_mode tcp "${m#tcp:}" ;;
        ucx:*) run_local_mode ucx "${m#ucx:}" ;;
        netns:*) run_netns_mode "${m#netns:}" ;;
        esac
    done
} | tee "$out/summary.txt"
echo "# summary: $out/summary.txt" >&2
