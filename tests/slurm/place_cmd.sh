#!/bin/sh
# test_slurm.sh's default SLURMTEST_PLACE_CMD / SLURMTEST_HOSTFILE_CMD: asks shoal-place
# (src/sched) where a job of NTASKS ranks goes in the test's one-node Slurm.
#   place_cmd.sh nodelist|slurm_hostfile SLURM_CONF NTASKS
# shoal-place plans GPUs (one per rank); the test's node has none, so the planner's copy of
# slurm.conf declares Gres=gpu:NTASKS on its node line (Slurm itself never sees that copy).
# Prints shoal-place's answer on stdout; errors on stderr, exit status nonzero.
set -eu
kind=$1 conf=$2 n=$3
place=${top_builddir:-.}/shoal-place
dir=$(mktemp -d "${TMPDIR:-/tmp}/place_cmd.XXXXXX")
trap 'rm -rf "$dir"' EXIT
sed "/^NodeName=/{/Gres=/!s/\$/ Gres=gpu:$n/}" "$conf" >"$dir/slurm.conf"
# cpus=0: CPUs not counted, as the test's srun --overcommit on a node of fewer CPUs than ranks
printf 'tenant=acme weight=1\njob=slurmtest tenant=acme gpus=%s cpus=0 class=reserved\n' "$n" \
    >"$dir/jobs"
"$place" --slurm-conf "$dir/slurm.conf" --jobs "$dir/jobs" --job slurmtest --print "$kind"
