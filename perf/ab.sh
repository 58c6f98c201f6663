#!/bin/sh
# A/B of two builds on the same sizes in one run: launches alternate A, B, A, B, ... (REPS
# each) so that the machine's load falls on both alike; prints per size, type and op the
# median time over the launches of A and B, out of place and in place, the ratios B/A of the
# medians and of the fastest launches (the lower tail: less of the load in it), and in place /
# out of place.
#
# usage: perf/ab.sh [--reps K] [--np N] [--env 'VAR=V ...'] [--label-a A] [--label-b B]
#                   BUILD_A BUILD_B PROGRAM [perf args...]
#   BUILD_A, BUILD_B   build directories holding shoalrun and PROGRAM (e.g. reduce_scatter_perf)
#   --np N             ranks (default 2)
#   --env '...'        variables for both (e.g. 'SHOAL_ALGO=rab SHOAL_TRANSPORT=tcp')
#   --reps K           launches of each build (default 5)
# The perf args go to PROGRAM (e.g. -b 1K -e 256K -f 4 -n 200 -w 20). The load average is
# printed at the start and at the end. Environment: AB_TIMEOUT (seconds per launch, 300).

reps=5
np=2
envs=""
la=A
lb=B
tmo=${AB_TIMEOUT:-300}

die() {
    echo "ab.sh: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case $1 in
    --reps) reps=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --env) envs=$2; shift 2 ;;
    --label-a) la=$2; shift 2 ;;
    --label-b) lb=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) break ;;
    esac
done
[ $# -ge 3 ] || die "needs BUILD_A BUILD_B PROGRAM (see --help)"
a=$1
b=$2
prog=$3
shift 3
for d in "$a" "$b"; do
    if [ ! -x "$d/shoalrun" ] || [ ! -x "$d/$prog" ]; then
        die "no shoalrun or $prog in $d"
    fi
done
tmp=$(mktemp -d) || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT

echo "# ab.sh: $np ranks, $prog $*, env '$envs', $reps launches each, alternating"
echo "# A ($la): $a"
echo "# B ($lb): $b"
echo "# load average at start: $(cat /proc/loadavg)"
i=0
while [ $i -lt "$reps" ]; do
    for side in A B; do
        if [ $side = A ]; then d=$a; else d=$b; fi
        # shellcheck disable=SC2086
        if ! env $envs timeout "$tmo" "$d/shoalrun" -n "$np" "$d/$prog" "$@" \
                > "$tmp/out" 2>&1; then
            cat "$tmp/out" >&2
            die "launch $i of $side failed"
        fi
        # rank 0's result lines: size count type op root t_out ... t_in ... (one per size,
        # type and op: -d all or -o all gives several rows of one size, kept apart)
        sed -n 's/^\[0\] *//p' "$tmp/out" | awk -v s=$side \
            '$1 ~ /^[0-9]+$/ && NF >= 13 { print s, $1, $3, $4, $6, $10 }' >> "$tmp/all"
    done
    i=$((i + 1))
done
echo "# load average at end:   $(cat /proc/loadavg)"
awk -v la="$la" -v lb="$lb" '
function sortv(key,    n, i, j, t) {
    n = cnt[key]
    for (i = 1; i <= n; i++) v[i] = val[key, i]
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    return n
}
function med(key,    n) { n = sortv(key); return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
function lo(key) { sortv(key); return v[1] }
{
    z = $2 " " $3 " " $4 # size, type, op: one row of the table
    k = $1 SUBSEP z SUBSEP "o"; val[k, ++cnt[k]] = $5
    k = $1 SUBSEP z SUBSEP "i"; val[k, ++cnt[k]] = $6
    if (!(z in seen)) { seen[z] = 1; sizes[++ns] = z }
}
END {
    printf "# time (us) per size, type and op: median over the launches; B/A < 1: B faster\n"
    printf "# (med: of the medians, min: of the fastest launches); i/o > 1: in place slower than\n"
    printf "# out of place\n"
    printf "# %10s %8s %4s %9s %9s %6s %6s %9s %9s %6s %6s %6s %6s\n", "bytes", "type", "op",
           la " out", lb " out",
           "B/A", "min", la " in", lb " in", "B/A", "min", "A i/o", "B i/o"
    for (s = 1; s <= ns; s++) {
        z = sizes[s]
        split(z, f, " ")
        ao = med("A" SUBSEP z SUBSEP "o"); bo = med("B" SUBSEP z SUBSEP "o")
        ai = med("A" SUBSEP z SUBSEP "i"); bi = med("B" SUBSEP z SUBSEP "i")
        mo = lo("B" SUBSEP z SUBSEP "o") / lo("A" SUBSEP z SUBSEP "o")
        mi = lo("B" SUBSEP z SUBSEP "i") / lo("A" SUBSEP z SUBSEP "i")
        printf "  %10s %8s %4s %9.2f %9.2f %6.3f %6.3f %9.2f %9.2f %6.3f %6.3f %6.3f %6.3f\n",
               f[1], f[2], f[3], ao, bo,
               bo / ao, mo, ai, bi, bi / ai, mi, ai / ao, bi / bo
    }
}' "$tmp/all"
