# Helpers of the shoald tests (sourced): TAP output, a private directory, keys and
# credentials, an agent started and stopped inside the test (never left behind).
# Needs: top_builddir (exported by `make check`; defaults to the current directory).

top_builddir=${top_builddir:-.}
SHOALD="$top_builddir/shoald"
MC="$top_builddir/tests/agent/meter_client"
CREDTOOL="$top_builddir/shoal-cred"
unset SHOAL_CREDENTIAL SHOAL_CREDENTIAL_FILE SHOAL_DEBUG SHOAL_DEBUG_FILE SHOAL_CONF_FILE
T=$(mktemp -d "${TMPDIR:-/tmp}/test_shoald.XXXXXX") || exit 1
PIDS=""       # processes this test started, killed at exit
AGENT_PID=""
n=0
failed=0

CLEANUP_HOOK=""  # a command the test adds (a database server to stop, a directory to remove)
agent_cleanup() {
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    [ -n "$CLEANUP_HOOK" ] && eval "$CLEANUP_HOOK"
    rm -rf "$T"
}
trap agent_cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE

ok() { # ok EXIT-STATUS DESCRIPTION [FILE-TO-SHOW]
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else
        failed=$((failed + 1))
        echo "not ok $n - $2"
        [ -n "$3" ] && [ -f "$3" ] && sed 's/^/#   /' "$3" | tail -n 15
    fi
}
is() { # is GOT WANT DESCRIPTION
    n=$((n + 1))
    if [ "$1" = "$2" ]; then echo "ok $n - $3"; else
        failed=$((failed + 1))
        echo "not ok $n - $3"; echo "#   got: '$1'"; echo "#  want: '$2'"; fi
}
skip_rest() { # skip_rest COUNT REASON
    i=0
    while [ "$i" -lt "$1" ]; do n=$((n + 1)); i=$((i + 1)); echo "ok $n # SKIP $2"; done
}
done_testing() {
    ! grep -q 'Sanitizer\|runtime error' "$T/agent.log" 2>/dev/null
    ok $? "no sanitizer report in the agent's log" "$T/agent.log"
    echo "1..$n"
    [ "$failed" -eq 0 ]
}

need_agent() {
    if [ ! -x "$SHOALD" ] || [ ! -x "$MC" ] || [ ! -x "$CREDTOOL" ]; then
        echo "1..0 # SKIP shoald not built (libmicrohttpd missing)"
        exit 0
    fi
}

# Keys: a provider master key, a ledger key; tenants acme and beta derive from the master.
make_keys() {
    "$CREDTOOL" keygen -o "$T/master.key" >/dev/null 2>&1 &&
        "$CREDTOOL" keygen -o "$T/other.key" >/dev/null 2>&1 &&
        "$CREDTOOL" keygen -o "$T/ledger.key" >/dev/null 2>&1 || return 1
    printf 'acme-scrape-token-0123456789\n' >"$T/acme.token"
    printf 'beta-scrape-token-0123456789\n' >"$T/beta.token"
    chmod 600 "$T/acme.token" "$T/beta.token"
}
cred() { # cred TENANT JOB [issue options...]: a credential signed with the master key
    t=$1; j=$2; shift 2
    "$CREDTOOL" issue -k "$T/master.key" --tenant "$t" --job "$j" "$@" 2>/dev/null
}

# start_agent CONF [shoald options...]: starts shoald, waits for its ready file (10 s).
start_agent() {
    conf=$1; shift
    rm -f "$T/ready"
    # AGENT_NOFILE: the agent's descriptor limit (ulimit -n, soft and hard); AGENT_WRAP: a
    # program that runs the agent (tests/agent/nopidfd)
    ( [ -z "${AGENT_NOFILE:-}" ] || ulimit -n "$AGENT_NOFILE" || exit 1
      exec ${AGENT_WRAP:-} "$SHOALD" -c "$conf" --ready-file "$T/ready" "$@" ) \
        >>"$T/agent.log" 2>&1 &
    AGENT_PID=$!
    PIDS="$PIDS $AGENT_PID"
    i=0
    while [ ! -s "$T/ready" ] && [ $i -lt 100 ]; do
        kill -0 "$AGENT_PID" 2>/dev/null || return 1
        sleep 0.1; i=$((i + 1))
    done
    [ -s "$T/ready" ] || return 1
    SOCK=$(sed -n 's/^sock=//p' "$T/ready")
    HTTP=$(sed -n 's/^http=//p' "$T/ready")
    return 0
}
stop_agent() { # stop_agent [SIGNAL]: stops it and waits (10 s at most, then -9)
    [ -n "$AGENT_PID" ] || return 0
    kill "-${1:-TERM}" "$AGENT_PID" 2>/dev/null
    i=0
    while kill -0 "$AGENT_PID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$AGENT_PID" 2>/dev/null
    wait "$AGENT_PID" 2>/dev/null
    agent_rc=$?
    AGENT_PID=""
    return 0
}
# agent_folds TENANT/JOB [RANK]: the folds the agent logged (src/agent/agent_minute.c,
# shoald_minute_fold), a "MINUTE GPU-SECONDS" line each
agent_folds() {
    sed -n "s|.* $1: rank ${2:-[0-9]*} .* its \([0-9.]*\) GPU-seconds before then folded into minute \([0-9]*\)\$|\2 \1|p" \
        "$T/agent.log"
}
alive() { kill -0 "$AGENT_PID" 2>/dev/null; }

# mc ARGS...: a client on the agent's socket, 20 s at most; output in $T/mc.out, status $rc.
mc() {
    timeout -s KILL 20 "$MC" --sock "$SOCK" "$@" >"$T/mc.out" 2>"$T/mc.err"
    rc=$?
}
status_of() { sed -n 's/^status=\([^ ]*\) .*/\1/p' "$T/mc.out"; }

scrape() { # scrape [PATH] [curl options...]: body in $T/scrape, HTTP code printed
    p=${1:-/metrics}; [ $# -gt 0 ] && shift
    curl -s -m 10 -o "$T/scrape" -w '%{http_code}' "$@" "http://$HTTP$p"
}
metric() { # metric 'name{labels}' [FILE]: the value of one series (exact match of the prefix)
    K=$1 awk 'index($0, ENVIRON["K"] " ") == 1 { print $2 }' "${2:-$T/scrape}"
}
wait_metric() { # wait_metric 'series' VALUE: polls /metrics for 10 s until it has VALUE
    i=0
    while [ $i -lt 100 ]; do
        scrape >/dev/null
        [ "$(metric "$1")" = "$2" ] && return 0
        sleep 0.1; i=$((i + 1))
    done
    return 1
}

base_conf() { # base_conf FILE [extra lines...]
    f=$1; shift
    {
        echo "listen=$T/run/shoald.sock"
        echo "http=127.0.0.1:0"
        echo "ledger_url=none"
        echo "master_key_file=$T/master.key"
        echo "tenant.acme.class=reserved"
        echo "tenant.acme.scrape_token_file=$T/acme.token"
        echo "tenant.beta.class=spot"
        echo "tenant.beta.scrape_token_file=$T/beta.token"
        for l in "$@"; do echo "$l"; done
        # last: the lines above keep their numbers (the tests' config errors name them)
        echo "state_dir=$T/state"
    } >"$f"
}

# A real Prometheus server scraping the agent ($HTTP) every second, on a free loopback port
# ($PPORT; five tries), data in $T; killed at exit with the test's other processes. With
# PROM_TOKEN_FILE set, it sends that bearer token (provider_token_file).
start_prometheus() {
    try=0
    while [ $try -lt 5 ]; do
        PPORT=$(( 20000 + ($(od -An -N2 -tu2 /dev/urandom) + try * 7919) % 40000 ))
        cat >"$T/prom.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: shoald
    static_configs:
      - targets: ['$HTTP']
EOF
        if [ -n "${PROM_TOKEN_FILE:-}" ]; then
            echo "    authorization: {type: Bearer, credentials_file: '$PROM_TOKEN_FILE'}" \
                >>"$T/prom.yml"
        fi
        rm -rf "$T/prom-data"
        prometheus --config.file="$T/prom.yml" --storage.tsdb.path="$T/prom-data" \
            --web.listen-address="127.0.0.1:$PPORT" --log.level=warn >"$T/prom.log" 2>&1 &
        PROM_PID=$!
        PIDS="$PIDS $PROM_PID"
        i=0
        while [ $i -lt 100 ]; do
            if ! kill -0 "$PROM_PID" 2>/dev/null; then break; fi
            curl -s -m 2 "http://127.0.0.1:$PPORT/-/ready" 2>/dev/null | grep -q Ready && return 0
            sleep 0.2; i=$((i + 1))
        done
        kill -9 "$PROM_PID" 2>/dev/null
        try=$((try + 1))
    done
    return 1
}
promq() { # promq QUERY: the value of the first result, or nothing
    curl -s -m 5 -G "http://127.0.0.1:$PPORT/api/v1/query" --data-urlencode "query=$1" |
        sed -n 's/.*"value":\[[0-9.e+]*,"\([^"]*\)"\].*/\1/p'
}
