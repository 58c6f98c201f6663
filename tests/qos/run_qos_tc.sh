#!/bin/sh
# The kernel side of QoS on TCP (scripts/shoal-tc.sh, shoald's qos_tc), in network
# namespaces: the htb tree is made, carries two tenants' real traffic 1:3 by their DSCP
# through a link shaped to 200 Mbit/s (perf/qos_bench.sh --mode agent --transport netns: the
# classes' byte counters and the jobs' windows), and is removed; shoald sets it up at start
# and removes it at stop; shoald without CAP_NET_ADMIN says once that tc cannot be configured,
# falls back to pacing and keeps serving. Needs root (namespaces) and tc; skipped otherwise.
#
# Environment: top_builddir, top_srcdir (make check).
. "$(dirname "$0")/../tap.sh"

builddir=${top_builddir:-.}
srcdir=${top_srcdir:-$(dirname "$0")/../..}
builddir=$(cd "$builddir" && pwd)
srcdir=$(cd "$srcdir" && pwd)
shoaltc=$srcdir/scripts/shoal-tc.sh

if [ "$(id -u)" != 0 ] || ! command -v tc >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then
    echo "1..0 # SKIP needs root, ip and tc (network namespaces)"
    exit 0
fi
ns=shoaltc-$$
if ! ip netns add "$ns" 2>/dev/null; then
    echo "1..0 # SKIP cannot make a network namespace"
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/run_qos_tc.XXXXXX") || exit 1
agent=
cleanup() {
    [ -z "$agent" ] || kill -9 "$agent" 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
unset SHOAL_DEBUG SHOAL_CREDENTIAL SHOAL_CREDENTIAL_FILE

field() {
    echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
ip -n "$ns" link set lo up && ip -n "$ns" link add q0 type veth peer name q1 &&
    ip -n "$ns" link set q0 up &&
    ip -n "$ns" link set q1 up || { echo "1..0 # SKIP no veth"; exit 0; }

# 1. the script: tree made, classes and filters as asked, removed, remove idempotent
"$shoaltc" -n "$ns" setup q0 1gbit a,rate=240mbit,dscp=10 b,rate=720mbit,dscp=18 >"$T/o" 2>&1
rc=$?
classes=$(tc -n "$ns" class show dev q0 | awk '{ print $3 }' | sort | tr '\n' ' ')
filters=$(tc -n "$ns" filter show dev q0 | grep -c 'flowid 5:[ab]')
if [ $rc = 0 ] && [ "$classes" = "5:1 5:99 5:a 5:b " ] && [ "$filters" = 4 ]; then
    tap OK "shoal-tc setup: htb root 5:, tenant classes 5:a 5:b, DSCP filters for IPv4 and IPv6"
else
    tap FAIL "shoal-tc setup: rc $rc, classes '$classes', $filters filters"
    sed 's/^/#   /' "$T/o"
fi
"$shoaltc" -n "$ns" setup q0 1gbit a,rate=900mbit,dscp=10 b,rate=900mbit,dscp=18 >"$T/o" 2>&1
rc=$?
if [ $rc = 2 ] && tc -n "$ns" class show dev q0 | grep -q '5:a.*rate 240Mbit'; then
    tap OK "shoal-tc setup: rates above the link refused (exit 2), the tree left as it was"
else
    tap FAIL "shoal-tc setup with rates above the link: rc $rc"
fi
"$shoaltc" -n "$ns" remove q0 >/dev/null 2>&1 && "$shoaltc" -n "$ns" remove q0 >/dev/null 2>&1
rc=$?
if [ $rc = 0 ] && ! tc -n "$ns" qdisc show dev q0 | grep -q 'htb 5:'; then
    tap OK "shoal-tc remove: the tree is gone; a second remove is a no-op"
else
    tap FAIL "shoal-tc remove: rc $rc, $(tc -n "$ns" qdisc show dev q0)"
fi

# 2. real traffic: two tenants 1:3 through htb at 200 Mbit/s
if [ -x "$builddir/tests/netns/mkuid" ] && [ -x "$builddir/qos_load" ]; then
    for try in 1 2; do
        out=$(top_builddir=$builddir "$srcdir/perf/qos_bench.sh" --build "$builddir" \
            --mode agent --transport netns --ranks 1 --weights 1:3 --link 200mbit --seconds 4 \
            --bytes 1048576 2>&1)
        res=$(echo "$out" | grep '^result')
        a=$(echo "$out" | sed -n 's/^# tc class 5:a sent \([0-9]*\) bytes/\1/p')
        b=$(echo "$out" | sed -n 's/^# tc class 5:b sent \([0-9]*\) bytes/\1/p')
        awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { exit !(a > 0 && b / a >= 2.0 && b / a <= 4.5) }' &&
            [ "$(field status "$res")" = ok ] && break
        echo "# try $try:"
    done
    echo "$out" | sed 's/^/# /'
    if [ "$(field status "$res")" = ok ] &&
        awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { exit !(a > 0 && b / a >= 2.0 && b / a <= 4.5) }'; then
        tap OK "1:3 through htb: the classes carried $a and $b bytes (ratio" \
            "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }'); worst window share" \
            "error $(field max_share_err_pct "$res")%)"
    else
        tap FAIL "1:3 through htb: classes $a / $b bytes ($res)"
    fi
else
    tap OK "# SKIP mkuid or qos_load not built"
fi

# 3. shoald sets the tree up at start and removes it at stop
if [ -x "$builddir/shoald" ] && [ -x "$builddir/shoal-cred" ]; then
    "$builddir/shoal-cred" keygen -o "$T/master.key" >/dev/null 2>&1
    cat >"$T/conf" <<EOC
listen=$T/sock
http=none
ledger_url=none
master_key_file=$T/master.key
qos_rates_dir=$T/rates
qos_tc=$shoaltc
qos_tc_dev=q0
qos_tc_link_rate=1gbit
tenant.a.dscp=10
tenant.a.tc_weight=1
tenant.b.dscp=18
tenant.b.tc_weight=3
tenant.s.class=spot
tenant.s.dscp=8
state_dir=$T/state
EOC
    ip netns exec "$ns" "$builddir/shoald" -c "$T/conf" --ready-file "$T/ready" >"$T/agent.log" 2>&1 &
    agent=$!
    i=0
    while [ ! -s "$T/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    tree=$(tc -n "$ns" class show dev q0 | awk '$3 != "5:1" && $3 != "5:99" { print $9 }' |
        sort | tr '\n' ' ')
    kill -TERM "$agent"
    wait "$agent"
    rc=$?
    agent=
    case $tree in
    "10Mbit 242500Kbit 727500Kbit ") ok=1 ;;
    *) ok=0 ;;
    esac
    if [ $ok = 1 ]; then
        tap OK "shoald: htb classes by tc_weight (a 1, b 3: 97% of the link) and 1% for spot"
    else
        tap FAIL "shoald's tree: $tree"
        sed 's/^/#   /' "$T/agent.log" | tail -n 5
    fi
    if [ $rc = 0 ] && ! tc -n "$ns" qdisc show dev q0 | grep -q 'htb 5:'; then
        tap OK "shoald stopped: the tree is removed"
    else
        tap FAIL "shoald stopped (rc $rc): $(tc -n "$ns" qdisc show dev q0)"
    fi

    # 4. without CAP_NET_ADMIN: said once, pacing stands in, the agent keeps serving
    if command -v setpriv >/dev/null 2>&1; then
        rm -f "$T/ready" "$T/sock"
        chmod 755 "$T"
        chown 65534 "$T/master.key"
        mkdir -m 777 "$T/nobody"
        sed -e "s|^listen=.*|listen=$T/nobody/sock|" -e "s|^qos_rates_dir=.*|qos_rates_dir=$T/nobody/rates|" \
            -e 's|^http=.*|http=127.0.0.1:0|' -e 's|^qos_tc_dev=.*|qos_tc_dev=q0,q1|' \
            -e "s|^state_dir=.*|state_dir=$T/nobody/state|" \
            "$T/conf" >"$T/nobody/conf"
        echo "qos_capacity_net=100m" >>"$T/nobody/conf"
        chmod 644 "$T/nobody/conf"
        ip netns exec "$ns" setpriv --reuid=65534 --regid=65534 --clear-groups \
            --inh-caps=-all --bounding-set=-all "$builddir/shoald" -c "$T/nobody/conf" \
            --ready-file "$T/nobody/ready" >"$T/agent2.log" 2>&1 &
        agent=$!
        i=0
        while [ ! -s "$T/nobody/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        http=$(sed -n 's/^http=//p' "$T/nobody/ready" 2>/dev/null)
        m=$(ip netns exec "$ns" curl -s -m 5 "http://$http/metrics" 2>/dev/null)
        kill -TERM "$agent" 2>/dev/null
        wait "$agent"
        agent=
        nwarn=$(grep -c 'tc cannot be configured on' "$T/agent2.log")
        if [ -n "$http" ] && [ "$nwarn" = 2 ] &&
            echo "$m" | grep -q '^shoal_qos_tc_interfaces 0' &&
            echo "$m" | grep -q 'shoal_qos_capacity_bytes_per_second{locality="other_host"} 104857600'; then
            tap OK "no CAP_NET_ADMIN: one warning per interface, the NICs paced (qos_capacity_net)," \
                "the agent serves"
        else
            tap FAIL "no CAP_NET_ADMIN: $nwarn warnings, ready $(cat "$T/nobody/ready" 2>/dev/null)"
            sed 's/^/#   /' "$T/agent2.log" | tail -n 8
            echo "$m" | grep qos_ | sed 's/^/#   /'
        fi
    else
        tap OK "# SKIP setpriv not found"
    fi
else
    tap OK "# SKIP shoald not built"
    tap OK "# SKIP shoald not built"
    tap OK "# SKIP shoald not built"
fi
tap_plan
exit $fails
