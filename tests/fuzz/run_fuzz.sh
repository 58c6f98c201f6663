#!/bin/bash
# Runs every libFuzzer target (a --enable-fuzzing build) for a bounded time, each on a copy of
# its seed corpus and crash regressions in a temporary directory (the tree is not touched).
# TAP: one case per target, ok when it found nothing, with libFuzzer's count of executions.
# A finding fails the case and prints the input's path (kept) and its base64.
#   FUZZ_SECONDS  time per target (default 20)      FUZZ_JOBS     targets run at once (1)
#   FUZZ_TIMEOUT  seconds one input may take (10)   FUZZ_RSS_MB   memory limit (2048)
#   FUZZ_TARGETS  names to run (default: all)       FUZZ_ARGS     more libFuzzer flags
set -u
b=${top_builddir:-.}
s=${top_srcdir:-.}
secs=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-1}
targets=${FUZZ_TARGETS:-$(cat "$b/tests/fuzz/targets" 2>/dev/null)}

if [ -z "$targets" ]; then
    echo "1..0 # SKIP no fuzz targets listed"
    exit 0
fi
set -- $targets
if [ ! -x "$b/tests/fuzz/fuzz_$1" ]; then
    echo "1..0 # SKIP the libFuzzer targets are built by configure --enable-fuzzing (clang)"
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/shoal-fuzz.XXXXXX") || exit 1

fuzz_one() { # name -> $tmp/<name>/{corpus,log,rc}
    local t=$1 w=$tmp/$1
    mkdir -p "$w/corpus"
    cp "$s/tests/fuzz/corpus/$t"/* "$w/corpus/" 2>/dev/null
    [ -d "$s/tests/fuzz/regress/$t" ] && cp "$s/tests/fuzz/regress/$t"/* "$w/corpus/" 2>/dev/null
    # -close_fd_mask=1: a target's stray stdout would break the TAP stream.
    "$b/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout="${FUZZ_TIMEOUT:-10}" \
        -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -print_final_stats=1 -close_fd_mask=1 \
        -artifact_prefix="$w/" ${FUZZ_ARGS:-} "$w/corpus" > "$w/log" 2>&1
    echo $? > "$w/rc"
}

running=0
for t in $targets; do
    fuzz_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n 2>/dev/null || wait
        running=$((running - 1))
    fi
done
wait

echo "1..$#"
i=0 failed=0
for t in $targets; do
    i=$((i + 1))
    w=$tmp/$t
    rc=$(cat "$w/rc" 2>/dev/null || echo 99)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$w/log" | tail -1)
    art=$(ls "$w"/crash-* "$w"/leak-* "$w"/timeout-* "$w"/oom-* 2>/dev/null | head -1)
    if [ "$rc" = 0 ] && [ -z "$art" ]; then
        echo "ok $i - $t: ${execs:-?} executions in ${secs} s, nothing found"
        rm -rf "$w"
        continue
    fi
    failed=1
    echo "not ok $i - $t: libFuzzer exited with $rc after ${execs:-?} executions"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|.*fuzz invariant|    #[0-9] )' "$w/log" |
        head -20 | sed 's/^/# /'
    if [ -n "$art" ]; then
        echo "# input: $art (kept; add it to tests/fuzz/regress/$t/ once fixed)"
        echo "# base64: $(base64 -w0 "$art")"
    else
        tail -n 20 "$w/log" | sed 's/^/# /'
    fi
done
[ "$failed" = 0 ] && rm -rf "$tmp"
exit 0
