#!/bin/sh
# tests/watchdog.sh TEST [ARGS...]: how make check runs every test (LOG_COMPILER).
#
# The test runs in the foreground, as it would without this script (its signal dispositions
# untouched). A watchdog beside it waits SHOAL_TEST_TIMEOUT seconds (default 1200; 0 turns it
# off). If the test is still running then, the watchdog prints, as TAP diagnostics, a failed
# result naming the test, every process under it (ps) and the threads' stacks of up to 6 of
# them (gdb, when installed), then kills them all. One hung test thus fails by name, with the
# place it hung, and make check goes on; without it a hang held the whole CI run until the
# run's own limit, which names nothing. A process the test leaves behind holding its output
# (make's reader would wait for it) fails the test too, named, and is killed. On exit the
# script adds "# watchdog: NAME took N s".
limit=${SHOAL_TEST_TIMEOUT:-1200}
case $limit in
'' | *[!0-9]*)
    echo "Bail out! SHOAL_TEST_TIMEOUT=$limit is not a whole number of seconds"
    exit 99
    ;;
esac
[ "$limit" -eq 0 ] && exec "$@"
[ $# -ge 1 ] || { echo "Bail out! usage: watchdog.sh TEST [ARGS...]"; exit 99; }

name=${1##*/}
top=$$
start=$(date +%s)

descendants() { # PID [EXCLUDE]: every process below PID, not below EXCLUDE, parents first
    ps -e -o pid= -o ppid= | awk -v root="$1" -v skip="${2:-0}" '
        { kids[$2] = kids[$2] " " $1 }
        END {
            n = split(kids[root], q, " ")
            for (i = 1; i <= n; i++) {
                if (q[i] == skip) continue
                print q[i]
                m = split(kids[q[i]], c, " ")
                for (j = 1; j <= m; j++) q[++n] = c[j]
            }
        }'
}

(
    nap=
    trap 'kill $nap 2>/dev/null; exit 0' TERM
    trap '' PIPE # a reader gone early must not stop the killing
    me=$(sh -c 'echo $PPID')
    end=$((start + limit))
    while [ "$(date +%s)" -lt "$end" ]; do
        sleep 5 > /dev/null 2>&1 & # not holding make's pipe from the test
        nap=$!
        wait $nap
    done
    trap '' TERM # killing now: the script waits for it to finish, not cut it short
    pids=$(descendants "$top" "$me")
    [ -n "$pids" ] || exit 0
    echo "not ok - watchdog: $name still running after $limit s (SHOAL_TEST_TIMEOUT): killed"
    # shellcheck disable=SC2086 # a list of pids
    ps -o pid=,ppid=,etimes=,stat=,args= -p "$(echo $pids | tr ' ' ,)" 2>/dev/null |
        cut -c1-220 | sed 's/^/# /'
    if command -v gdb > /dev/null 2>&1; then
        shown=0
        for p in $pids; do
            [ $shown -lt 6 ] || break
            comm=$(ps -o comm= -p "$p" 2>/dev/null) || continue
            case $comm in
            sh | bash | dash | timeout | sleep | awk | mawk | tee | cat) continue ;;
            esac
            shown=$((shown + 1))
            echo "# stacks of $p ($comm):"
            timeout 30 gdb -batch -nx -p "$p" -ex 'thread apply all bt 10' 2>/dev/null |
                grep -E '^(Thread|#[0-9])' | cut -c1-200 | head -60 | sed 's/^/#   /'
        done
    fi
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null
    sleep 5
    # shellcheck disable=SC2086
    kill -KILL $pids $(descendants "$top" "$me") 2>/dev/null
    exit 0
) &
dog=$!

# left_writers PIPE: processes other than this script and its parent (tap-driver's subshell)
# that hold PIPE open for writing; the access mode is the octal flags' last digit & 3
left_writers() {
    find /proc/[0-9]*/fd -maxdepth 1 -lname "$(printf '%s' "$1" | sed 's/[][]/\\&/g')" \
        2>/dev/null | while IFS=/ read -r _ _ p _ fd; do
        [ "$p" = "$top" ] || [ "$p" = "$PPID" ] && continue
        case $(sed -n 's/^flags:[[:space:]]*//p' "/proc/$p/fdinfo/$fd" 2>/dev/null) in
        *1 | *2 | *5 | *6) echo "$p" ;;
        esac
    done | sort -u
}

"$@"
rc=$?
kill -TERM "$dog" 2>/dev/null
wait "$dog" 2>/dev/null
# A process the test left behind that still holds its output keeps make's reader waiting for
# ever, after the test itself ended: give it 30 s to go, then name it, kill it, fail the test.
out=$(readlink "/proc/$top/fd/1" 2>/dev/null)
case $out in
pipe:*)
    left=$(left_writers "$out")
    n=0
    while [ -n "$left" ] && [ $n -lt 60 ]; do
        sleep 0.5
        n=$((n + 1))
        left=$(left_writers "$out")
    done
    if [ -n "$left" ]; then
        echo "not ok - watchdog: $name left processes that held its output 30 s after it" \
            "ended: killed"
        # shellcheck disable=SC2086 # a list of pids
        ps -o pid=,ppid=,etimes=,stat=,args= -p "$(echo $left | tr ' ' ,)" 2>/dev/null |
            cut -c1-220 | sed 's/^/# /'
        # shellcheck disable=SC2086
        kill -KILL $left 2>/dev/null
        rc=1
    fi
    ;;
esac
echo "# watchdog: $name took $(($(date +%s) - start)) s"
exit $rc
