#!/bin/sh
# select_check.sh: is shoal's automatic algorithm choice right on this machine?
#
# For each transport and rank count, runs select_bench under shoalrun: one communicator with
# the automatic choice and one per forced algorithm, timed in turn at every size and
# repetition inside one process (so that the drift of a shared VM hits all alike), medians
# of REPS. Prints per size: auto's choice (from the INFO [COLL] log lines), auto's time, the
# best forced algorithm and its time, the ratio chosen/best, and every forced time (us);
# chosen_us is the mean of auto's time and the forced run of its choice (the same code). A
# forced algorithm that cannot run a size (the log shows another) is left out there.
# Exits 1 when some ratio exceeds LIMIT (default 1.10), 0 otherwise.
#
# usage: perf/select_check.sh [-c COLL] [-t "shm tcp"] [-n "2 3 4"] [-r REPS]
#                             [-b MIN] [-e MAX] [-l LIMIT] [-B BUILDDIR]
#   COLL: allreduce (default), broadcast, allgather, reduce_scatter
#   Sizes MIN (8) to MAX (64M), factor 4. Run from a build directory (or give it with -B):
#   it needs ./shoalrun and ./select_bench. SELECT_CHECK_RUN_ARGS: extra shoalrun options
#   (e.g. "--bind-to core": ranks that outnumber the cores are then placed the same way in
#   every run, rank i on CPU i mod ncpu).
set -u

coll=allreduce
transports="shm tcp"
ranks="2 3 4"
reps=5
minb=8
maxb=64M
limit=1.10
bdir=.
while getopts c:t:n:r:b:e:l:B:h opt; do
    case $opt in
    c) coll=$OPTARG ;;
    t) transports=$OPTARG ;;
    n) ranks=$OPTARG ;;
    r) reps=$OPTARG ;;
    b) minb=$OPTARG ;;
    e) maxb=$OPTARG ;;
    l) limit=$OPTARG ;;
    B) bdir=$OPTARG ;;
    *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
done

case $coll in
allreduce) algos="ring rd shm dbtree rab hier" ;;
broadcast) algos="tree ring ptree" ;;
allgather) algos="ring bruck" ;;
reduce_scatter) algos="ring rab" ;;
*) echo "select_check: unknown collective $coll" >&2; exit 2 ;;
esac
run="$bdir/shoalrun"
bench="$bdir/select_bench"
for f in "$run" "$bench"; do
    [ -x "$f" ] || { echo "select_check: $f not found (build first, or -B BUILDDIR)" >&2; exit 2; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/select_check.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM

# One run of select_bench: "tag size algo us" rows, tag auto or the forced name, algo what
# the log says ran (forced rows whose algorithm never shows in the log at that size: "-").
one_run() { # transport nranks
    SHOAL_TRANSPORT=$1 SHOAL_DEBUG=INFO SHOAL_DEBUG_SUBSYS=COLL \
        timeout 600 "$run" ${SELECT_CHECK_RUN_ARGS:-} -n "$2" "$bench" -c "$coll" -b "$minb" -e "$maxb" -r "$reps" \
        $algos >"$tmp/out" 2>&1 ||
        { echo "select_check: $1 n=$2 failed:" >&2; tail -5 "$tmp/out" >&2; }
    awk -v n="$2" -v coll="$coll" '
        function lg(x,  l) { l = -1; while (x >= 1) { x /= 2; l++ } return l }
        /INFO \[COLL\] rank 0: / {
            b = -1
            for (i = 1; i <= NF; i++) {
                if ($i == coll && $(i + 1) == "of") { b = lg($(i + 2)) }
                if ($i ~ /^2\^[0-9]+\):$/) { a = $(i + 1); f = $(i + 2) == "(SHOAL_ALGO);" }
            }
            sub(/;$/, "", a)
            if (b < 0) next
            if (f) ran[b, a] = 1; else pick[b] = a
            next
        }
        $1 == "[0]" && $2 == coll && NF == 5 { row[++nr] = $3 " " $4 " " $5 }
        END {
            for (k = 1; k <= nr; k++) {
                split(row[k], v, " "); s = v[1]; b = lg(s)
                if (pick[b] == "") b = lg(int(s / n))
                if (pick[b] == "") b = lg(int(s / n / 4) * 4)
                if (v[2] == "auto") print "auto", s, (pick[b] == "" ? "?" : pick[b]), v[3]
                else print v[2], s, (ran[b, v[2]] ? v[2] : "-"), v[3]
            }
        }' "$tmp/out"
}

status=0
allfail=""
for tl in $transports; do
    for n in $ranks; do
        one_run "$tl" "$n" >"$tmp/all"
        echo "# $coll, SHOAL_TRANSPORT=$tl, $n ranks, medians of $reps interleaved runs (us)"
        printf '#%11s %8s %10s %8s %10s %6s  %s\n' bytes auto chosen_us best best_us ratio forced
        # rows: tag size algo time -> per (tag,size) median; forced rows count only when the
        # log shows the forced algorithm ran.
        awk -v limit="$limit" -v algos="$algos" '
            function med(list,  m, v, i, j, t) {
                m = split(list, v, " ")
                for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
                    if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
                return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
            }
            {
                tag = $1; s = $2; sizes[s] = 1
                if (tag == "auto") { t["auto", s] = $4; ch[s] = $3; next }
                if ($3 == tag) t[tag, s] = $4
            }
            END {
                na = split(algos, al, " "); bad = 0
                ns = 0; for (s in sizes) ss[++ns] = s + 0
                for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++)
                    if (ss[j] < ss[i]) { x = ss[i]; ss[i] = ss[j]; ss[j] = x }
                for (i = 1; i <= ns; i++) {
                    s = ss[i]; au = med(t["auto", s]); best = ""; bt = 0; oth = ""
                    for (k = 1; k <= na; k++) {
                        if (t[al[k], s] == "") continue
                        m = med(t[al[k], s]); oth = oth sprintf(" %s=%.1f", al[k], m)
                        if (best == "" || m < bt) { best = al[k]; bt = m }
                    }
                    # auto and the forced run of its choice time the same algorithm: their
                    # mean is the chosen algorithm time (halves the noise of one sample)
                    if (t[ch[s], s] != "") au = (au + med(t[ch[s], s])) / 2
                    ratio = bt > 0 ? au / bt : 0
                    flag = ratio > limit ? "  <-- over" : ""
                    if (ratio > limit) bad = 1
                    printf "%12d %8s %10.2f %8s %10.2f %6.2f %s%s\n", s, ch[s], au, best, bt,
                           ratio, oth, flag
                }
                exit bad
            }' "$tmp/all" || { status=1; allfail="$allfail $tl/$n"; }
        echo
    done
done
if [ "$status" -ne 0 ]; then
    echo "select_check: auto is more than $limit x the best forced algorithm in:$allfail"
fi
exit $status
