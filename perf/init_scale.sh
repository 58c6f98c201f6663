#!/bin/sh
# Init time at growing rank counts on this host: shoal over shm and over tcp, next to Open
# MPI, each the slowest rank's time from main() to the end of its first barrier (init_us) and
# of a first 8-byte AllReduce (first_us), plus the whole job's wall time and the bytes the
# bootstrap root read and wrote (shoal only; from its INFO line).
#   perf/init_scale.sh [-b BUILD] [-r REPS] [-o TABLE] [N ...]    (default N: 2 4 ... 256)
# Writes a markdown table (median of REPS runs per cell) to TABLE and stdout; the raw runs go
# to TABLE.raw. Say how loaded the machine was: the table's head records uptime's load.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
build=$top/build
reps=1
table=$top/perf/results/init_scale.md
while getopts b:r:o: opt; do
    case $opt in
    b) build=$OPTARG ;;
    r) reps=$OPTARG ;;
    o) table=$OPTARG ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
counts=${*:-"2 4 8 16 32 64 128 256"}
raw=$table.raw
: >"$raw"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

now() { date +%s.%N; }

# one KIND N: appends "KIND N wall_s init_ms first_ms root_in root_out rc" to $raw
one() {
    kind=$1 n=$2
    t0=$(now)
    case $kind in
    mpi)
        timeout 900 mpirun --oversubscribe -np "$n" --bind-to none --mca btl self,vader,tcp \
            "$build/init_perf_mpi" >"$tmp/out" 2>"$tmp/err"
        rc=$? ;;
    *)
        SHOAL_TRANSPORT=$kind SHOAL_DEBUG=INFO SHOAL_DEBUG_SUBSYS=BOOT \
            "$build/shoalrun" --no-prefix --timeout 900 -n "$n" "$build/init_perf" \
            >"$tmp/out" 2>"$tmp/err"
        rc=$? ;;
    esac
    t1=$(now)
    awk -v k="$kind" -v n="$n" -v w="$(echo "$t1 - $t0" | bc)" -v rc="$rc" '
        /^INIT rank/ { c++; if ($7 > i) i = $7; if ($9 > f) f = $9 }
        /bytes in,/ { for (j = 1; j <= NF; j++) { if ($j == "in,") bi = $(j - 2); if ($j == "out") bo = $(j - 2) } }
        END { if (c != n) rc = rc == 0 ? 1 : rc
              printf "%s %d %.2f %.1f %.1f %s %s %d\n", k, n, w, i / 1e3, f / 1e3,
                     bi == "" ? "-" : bi, bo == "" ? "-" : bo, rc }' "$tmp/out" "$tmp/err" \
        | tee -a "$raw"
}

for n in $counts; do
    for r in $(seq "$reps"); do
        for kind in shm tcp mpi; do
            one "$kind" "$n"
        done
    done
done

python3 - "$raw" "$table" "$(uptime)" "$(nproc)" <<'PY'
import sys, statistics
raw, table, up, ncpu = sys.argv[1:5]
rows = {}
for line in open(raw):
    k, n, w, i, f, bi, bo, rc = line.split()
    if rc != "0":
        continue
    rows.setdefault((int(n), k), []).append((float(w), float(i), float(f), bi, bo))
med = lambda xs: statistics.median(xs) if xs else float("nan")
out = ["# Init time on one host (%s CPUs)" % ncpu, "",
       "Slowest rank, ms, from main() to the end of the first barrier (init) and of a first "
       "8-byte AllReduce (first); job wall time in s; bytes the bootstrap root read / wrote. "
       "Medians of the runs in %s." % raw.split("/")[-1], "",
       "Load when the table was written: `%s`" % up.strip(), "",
       "| ranks | shm init | shm first | tcp init | tcp first | Open MPI init | Open MPI first "
       "| shm wall | tcp wall | MPI wall | root in (B) | root out (B) |",
       "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for n in sorted({n for n, _ in rows}):
    def g(k, j):
        v = rows.get((n, k), [])
        return "%.0f" % med([x[j] for x in v]) if v else "-"
    def gw(k):
        v = rows.get((n, k), [])
        return "%.1f" % med([x[0] for x in v]) if v else "-"
    tcp = rows.get((n, "tcp"), [])
    bi = tcp[0][3] if tcp else "-"
    bo = tcp[0][4] if tcp else "-"
    out.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        n, g("shm", 1), g("shm", 2), g("tcp", 1), g("tcp", 2), g("mpi", 1), g("mpi", 2),
        gw("shm"), gw("tcp"), gw("mpi"), bi, bo))
open(table, "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
