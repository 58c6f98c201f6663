#!/bin/sh
# Init with channels connected at init (SHOAL_CONNECT=eager) against at first use (lazy), over
# tcp and shm on this host: init_perf's slowest init (ms), and the max and mean over the ranks
# of the channel phase of init (the INFO line "addresses exchanged in ... ms, channels ... in
# ... ms"). One line per run; perf/results/connect_lazy.md is a table of its output.
#   perf/connect_lazy.sh [-b BUILD] [-r REPS] [N ...]    (default N: 64 128)
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
build=$top/build
reps=2
while getopts b:r: opt; do
    case $opt in
    b) build=$OPTARG ;;
    r) reps=$OPTARG ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
counts=${*:-"64 128"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

one() { # one KIND MODE N
    if [ "$1" = tcp ]; then tl=SHOAL_TRANSPORT=tcp; else tl=SHOAL_TRANSPORT=; fi
    env "$tl" SHOAL_CONNECT="$2" SHOAL_DEBUG=INFO SHOAL_DEBUG_SUBSYS=INIT \
        "$build/shoalrun" --no-prefix --timeout 900 -n "$3" "$build/init_perf" \
        >"$tmp/out" 2>"$tmp/err"
    rc=$?
    conn=$(grep 'channels' "$tmp/err" |
        awk '{ x = $(NF - 1) + 0; if (x > m) m = x; s += x } END { printf "%.1f %.1f", m, s / NR }')
    init=$(awk '/^INIT rank/ { if ($7 + 0 > i) i = $7 + 0 } END { printf "%.0f", i / 1e3 }' \
        "$tmp/out")
    echo "$1 $2 $3 rc=$rc init_ms=$init connect_max_ms=${conn% *} connect_mean_ms=${conn#* }"
}

uptime
for _ in $(seq "$reps"); do
    for n in $counts; do
        for kind in tcp shm; do
            for m in eager lazy; do
                one "$kind" "$m" "$n"
            done
        done
    done
done
uptime
