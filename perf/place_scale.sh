#!/bin/sh
# shoal-place at scale: one planning round of JOBS queued jobs on LEAVES leaf switches of 4
# hosts of 8 GPUs (128 leaves per spine, one core), 3,000 tenants, seeded job sizes of
# 1, 1, 2, 4, 8, 8, 16, 32, 64 GPUs, half spot. Prints the round's CPU and wall time and the
# placed/pending counts; the plan goes to $OUT/plan (compare two builds' with cmp).
#   perf/place_scale.sh [SHOAL_PLACE] (env: LEAVES=16384 JOBS=50000 SEED=7 OUT=dir)
# The defaults are the note's case: 65,536 hosts, 50,000 jobs.
set -eu
PLACE=${1:-${top_builddir:-build}/shoal-place}
LEAVES=${LEAVES:-16384}
JOBS=${JOBS:-50000}
SEED=${SEED:-7}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/place_scale.XXXXXX")}
[ -x "$PLACE" ] || { echo "place_scale: $PLACE is not executable" >&2; exit 2; }
mkdir -p "$OUT"
awk -v L="$LEAVES" -v J="$JOBS" -v seed="$SEED" -v out="$OUT" 'BEGIN {
    srand(seed)
    printf "ClusterName=scale\nNodeName=n[0-%d] CPUs=64 RealMemory=512000 Gres=gpu:8\n",
        4 * L - 1 > out "/slurm.conf"
    for (l = 0; l < L; l++)
        printf "SwitchName=l%d Nodes=n[%d-%d]\n", l, 4 * l, 4 * l + 3 > out "/topology.conf"
    spines = int((L + 127) / 128)
    for (s = 0; s < spines; s++) {
        hi = (s + 1) * 128 - 1; if (hi > L - 1) hi = L - 1
        printf "SwitchName=s%d Switches=l[%d-%d]\n", s, s * 128, hi > out "/topology.conf"
    }
    printf "SwitchName=core Switches=s[0-%d]\n", spines - 1 > out "/topology.conf"
    split("1 1 2 4 8 8 16 32 64", size, " ")
    for (t = 0; t < 3000; t++)
        printf "tenant=t%d weight=%d\n", t, 1 + int(rand() * 4) > out "/jobs"
    for (j = 0; j < J; j++)
        printf "job=j%d tenant=t%d gpus=%d class=%s\n", j, int(rand() * 3000),
            size[1 + int(rand() * 9)], rand() < 0.5 ? "spot" : "reserved" > out "/jobs"
}'
/usr/bin/time -f "%U %S %e" -o "$OUT/time" "$PLACE" --slurm-conf "$OUT/slurm.conf" \
    --topology "$OUT/topology.conf" --jobs "$OUT/jobs" >"$OUT/plan"
read -r user sys wall <"$OUT/time"
echo "place_scale: $((4 * LEAVES)) hosts, $JOBS jobs: $(grep -c '^place ' "$OUT/plan") placed," \
    "$(grep -c '^pending ' "$OUT/plan") pending; CPU $(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }') s, wall $wall s" \
    "(plan in $OUT/plan)"
