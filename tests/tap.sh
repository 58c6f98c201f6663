# shellcheck shell=sh
# TAP for the shell tests (sourced: . "$(dirname "$0")/../tap.sh"): one counter, one verdict.
#   tap OK|FAIL DESCRIPTION...   one numbered "ok"/"not ok" line; FAIL also sets fails=1
#   tap_skip_all REASON...       "1..0 # SKIP REASON" and exit 0 (nothing to run here)
#   tap_plan                     the "1..N" line, at the end
#   tap_overloaded               true when the host runs more than 3 runnable tasks per CPU
#                                (load average): checks of rates and shares relax then
# Counters: n_tap (lines so far), fails (0, or 1 once a case failed; "exit $fails" at the end).

n_tap=0
fails=0

tap() {
    _tap_r=$1
    shift
    n_tap=$((n_tap + 1))
    if [ "$_tap_r" = OK ]; then
        echo "ok $n_tap - $*"
    else
        echo "not ok $n_tap - $*"
        fails=1
    fi
}

tap_skip_all() {
    echo "1..0 # SKIP $*"
    exit 0
}

tap_plan() {
    echo "1..$n_tap"
}

# Rate and share checks need CPU time when they ask for it: on a host with more than 3
# runnable tasks per CPU (other jobs beside make check) the paced ranks sleep, then wait for a
# CPU behind the spinning ones longer than their buckets hold, and no job reaches its rate.
tap_overloaded() {
    awk -v n="$(nproc 2>/dev/null || echo 1)" '{ exit !($1 > 3 * n) }' /proc/loadavg 2>/dev/null
}
