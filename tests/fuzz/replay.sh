#!/bin/sh
# make check: replays each fuzz target's seed corpus (tests/fuzz/corpus/<name>/, one case per
# target) and each crash regression (tests/fuzz/regress/<name>/<input>, one case per input)
# through tests/fuzz/replay_<name> (the target without libFuzzer: works in every build, and
# under --enable-sanitizers finds what the fuzzer found). TAP on stdout.
set -u
b=${top_builddir:-.}
s=${top_srcdir:-.}
targets=$(cat "$b/tests/fuzz/targets") || { echo "1..0 # SKIP no tests/fuzz/targets"; exit 0; }
tmp=$(mktemp -d) || exit 1
export FUZZ_CFG_STRINGS=1 # fuzz_config: the STRING rows too (one input each, no growing pool)
trap 'rm -rf "$tmp"' EXIT

regress() { # target -> the regression inputs, one a line
    [ -d "$s/tests/fuzz/regress/$1" ] || return 0
    find "$s/tests/fuzz/regress/$1" -maxdepth 1 -type f ! -name '.*' | LC_ALL=C sort
}

n=0
for t in $targets; do
    n=$((n + 1 + $(regress "$t" | wc -l)))
done
echo "1..$n"

i=0
report() { # ok? description -- prints the case, with the replay's last lines when it failed
    i=$((i + 1))
    if [ "$1" = 0 ]; then
        echo "ok $i - $2"
    else
        echo "not ok $i - $2"
        tail -n 25 "$tmp/err" | sed 's/^/# /'
    fi
}

for t in $targets; do
    bin="$b/tests/fuzz/replay_$t"
    corpus="$s/tests/fuzz/corpus/$t"
    if [ ! -d "$corpus" ]; then
        echo "no seed corpus $corpus" > "$tmp/err"
        report 1 "$t: seed corpus"
    else
        "$bin" "$corpus" > "$tmp/out" 2> "$tmp/err"
        rc=$?
        report $rc "$t: seed corpus replayed ($(cat "$tmp/out" 2>/dev/null) inputs)"
    fi
    for f in $(regress "$t"); do
        "$bin" "$f" > "$tmp/out" 2> "$tmp/err"
        report $? "$t: crash regression $(basename "$f")"
    done
done
