#!/bin/bash
# The tc section of the VM stage (tests/vm/guest_ib.sh runs it, VM_SECTIONS=tc): shoal-tc.sh's
# htb tree with its real classifiers and fq leaves, which this host's kernel may lack (Debian's
# 6.1 in the guest has them all). Two "hosts" (network namespaces joined by a bridge,
# tests/netns/netns_lib.sh), on each host's link the tree of scripts/shoal-tc.sh at LINK with
# three tenants, one per classifier:
#   tp  prio=3: its sockets carry SO_PRIORITY 3 (SHOAL_QOS_CLASS=spot, SHOAL_QOS_PRIORITY=spot=3,
#       no DSCP): tc filter basic match meta(priority eq 3)
#   tm  mark=32: its ranks run as uid 1000, the hosts' nftables mark that uid's packets
#       (meta skuid 1000 meta mark set 32); the job itself marks nothing (default class)
#   td  dscp=18: its sockets carry DSCP AF21 (SHOAL_QOS_CLASS=burstable): u32 on the TOS byte
# Each tenant runs one job (qos_load, an AllReduce loop, one rank per host, tcp) at the same
# time. Checks, per host, from tc -s class show: each tenant's class carried what its job
# sent to the other host (its payload plus TCP/IP headers and its ACKs) and the default
# class 5:99 next to nothing (ARP, the rendezvous with mkuid); the leaves are fq.
# Reports (does not assert) the split of the link among the three (rates 1:1:2 of the link)
# over the seconds in which all three sent.
# Environment: top_srcdir, top_builddir (the guest build), TC_LINK (10mbit), TC_SECONDS (8).
# TAP on stdout.
set -u
src=${top_srcdir:?}
b=${top_builddir:?}
link=${TC_LINK:-10mbit}
secs=${TC_SECONDS:-8}
t_start=$SECONDS
n_tap=0
fails=0
tap() { # tap 0|1 description
    n_tap=$((n_tap + 1))
    if [ "$1" = 0 ]; then echo "ok $n_tap - $2"; else echo "not ok $n_tap - $2"; fails=$((fails + 1)); fi
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/guest_tc.XXXXXX") || exit 1
chmod 755 "$tmp"
NETNS_MKUID=$b/tests/netns/mkuid
NETNS_TMP=$tmp
# shellcheck disable=SC2016,SC2089 # eval'ed by netns_lib.sh's trap
netns_on_exit='rm -rf "$tmp"'
# shellcheck source=tests/netns/netns_lib.sh
. "$src/tests/netns/netns_lib.sh"
for p in "$NETNS_MKUID" "$b/qos_load"; do
    [ -x "$p" ] || { echo "Bail out! $p not built"; exit 1; }
done
netns_usable || { echo "Bail out! no network namespaces: $netns_why"; exit 1; }
netns_setup 2 "" 2>"$tmp/setup.err" || { echo "Bail out! netns_setup: $(head -n 1 "$tmp/setup.err")"; exit 1; }
echo "# $(uname -r); hosts:$netns_hosts, link $link, $secs s"

link_b=$(echo "$link" | awk '{ v = tolower($1); m = 1; if (v ~ /mbit$/) { m = 1e6; sub(/mbit$/, "", v) }
    else if (v ~ /kbit$/) { m = 1e3; sub(/kbit$/, "", v) } printf "%.0f\n", v * m }')
ra=$((link_b * 97 / 100 / 4))
specs="tp,rate=${ra}bit,prio=3 tm,rate=${ra}bit,mark=32 td,rate=$((2 * ra))bit,dscp=18"
ok=0
for h in $netns_hosts; do
    # no GSO: htb and fq then see MTU-sized packets (at 10 Mbit/s a 64 KiB GSO packet is 52 ms
    # of the link), as on a NIC with its offloads below the qdisc
    ip -n "$h" link set "$netns_ifname" gso_max_segs 1 2>/dev/null
    # shellcheck disable=SC2086 # a word list
    "$src/scripts/shoal-tc.sh" -n "$h" setup "$netns_ifname" "$link" $specs >>"$tmp/tc.log" 2>&1 ||
        ok=1
    # the provider's firewall: uid 1000's packets get mark 32 (what tm's class matches)
    ip netns exec "$h" nft -f - <<EON >>"$tmp/tc.log" 2>&1 || ok=1
add table inet shoaltc
add chain inet shoaltc out { type filter hook output priority 0; policy accept; }
add rule inet shoaltc out meta skuid 1000 meta mark set 32
EON
done
sed 's/^/# /' "$tmp/tc.log"
# shellcheck disable=SC2086 # a word list
set -- $netns_hosts
h0=$1
leaves=$(tc -n "$h0" qdisc show dev "$netns_ifname" | awk '$2 == "fq" { n++ } END { print n + 0 }')
tc -n "$h0" filter show dev "$netns_ifname" | grep -E 'flowid|meta|handle 0x20' | sed 's/^/# filter: /'
tap "$([ "$ok" = 0 ] && [ "$leaves" = 4 ] && tc -n "$h0" filter show dev "$netns_ifname" |
    grep -q 'meta(priority eq 3)' && tc -n "$h0" filter show dev "$netns_ifname" |
    grep -q 'fw.*handle 0x20 classid 5:b'; echo $?)" \
    "shoal-tc.sh on both hosts: classes 5:a (prio 3), 5:b (fw mark 32), 5:c (dscp 18), $leaves fq leaves of 4; nft marks uid 1000 (exit $ok)"

# class bytes of a host's link: "5:a 5:b 5:c 5:99" on one line
counters() {
    tc -n "$1" -s class show dev "$netns_ifname" | awk '
        $1 == "class" && $2 == "htb" { c = $3 }
        $1 == "Sent" && c != "" { s[c] = $2; c = "" }
        END { printf "%d %d %d %d\n", s["5:a"], s["5:b"], s["5:c"], s["5:99"] }'
}
declare -A before
for h in $netns_hosts; do before[$h]=$(counters "$h"); done

# tenant TENANT [VAR=VALUE...] -- PREFIX...: one job, one rank per host, in the background
tenant() {
    local t=$1 envs=""
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs="$envs $1"; shift; done
    shift
    mkdir -p "$tmp/ns.$t"
    chmod 777 "$tmp/ns.$t"
    (
        NETNS_TMP=$tmp/ns.$t
        NETNS_ENV="SHOAL_TENANT=$t SHOAL_JOB=tc SHOAL_AGENT=none SHOAL_TRANSPORT=tcp
            SHOAL_SOCKET_NSOCKS=1 TMPDIR=/tmp $envs"
        export SHOAL_TENANT="$t" SHOAL_JOB=tc
        netns_job "$tmp/ns.$t/r" 1 block $((secs + 90)) "$@" "$b/qos_load" -s "$secs" \
            -b 262144 -p 1000
        rc=$?
        cat "$tmp/ns.$t"/r.*.out >"$tmp/$t"
        cat "$tmp/ns.$t"/r.*.err >"$tmp/$t.err"
        exit $rc
    ) &
    jpids="$jpids $!"
}
# the split: host 0's counters every second while the jobs run
(
    end=$((SECONDS + secs + 60))
    while [ $SECONDS -lt $end ] && [ ! -f "$tmp/stop" ]; do
        echo "$(date +%s.%N) $(counters "$h0")"
        sleep 1
    done
) >"$tmp/samples" &
sampler=$!
jpids=
tenant tp SHOAL_QOS_CLASS=spot SHOAL_QOS_PRIORITY=spot=3 SHOAL_QOS_DSCP=spot=none --
tenant tm -- setpriv --reuid=1000 --regid=1000 --clear-groups
tenant td SHOAL_QOS_CLASS=burstable SHOAL_QOS_DSCP=burstable=AF21 --
jobs_ok=0
for p in $jpids; do wait "$p" || jobs_ok=1; done
touch "$tmp/stop"
wait "$sampler"
for t in tp tm td; do
    n=$(grep -c "done iters=.* status=SHOAL_OK" "$tmp/$t")
    [ "$n" = 2 ] || { jobs_ok=1; echo "# job $t:"; tail -n 5 "$tmp/$t.err" | sed 's/^/#   /'; }
done
tap "$jobs_ok" "three tenants' jobs (tp, tm as uid 1000, td), one rank per host over tcp, ran $secs s and finished cleanly"

# what the link carried: packets per class (MTU-sized without GSO), TCP's segments
for h in $netns_hosts; do
    tc -n "$h" -s class show dev "$netns_ifname" | awk -v h="$h" '$1 == "class" { c = $3 }
        $1 == "Sent" && c != "" { printf "# %s class %s: %s bytes %s packets\n", h, c, $2, $4; c = "" }'
    ip netns exec "$h" nstat -az 2>/dev/null | awk -v h="$h" '$1 ~ /^(TcpOutSegs|TcpRetransSegs|TcpExtTCPLostRetransmit|IpExtOutOctets|TcpExtTCPSackRecovery)$/ {
        printf "# %s %s %s\n", h, $1, $2 }'
done
# per host: the class bytes against what each job's rank there sent to the other host
i=0
for h in $netns_hosts; do
    read -r a0 b0 c0 d0 <<<"${before[$h]}"
    read -r a1 b1 c1 d1 <<<"$(counters "$h")"
    da=$((a1 - a0)) db=$((b1 - b0)) dc=$((c1 - c0)) dd=$((d1 - d0))
    # the rank on host i is rank i (block placement, one per host): its last net= (end line)
    net() { awk -v r="$i" '$1 == "qos" && $3 == "rank=" r && $4 ~ /^end=/ { split($8, x, "="); print x[2] }' "$tmp/$1"; }
    np=$(net tp) nm=$(net tm) nd=$(net td)
    echo "# host $i ($h): class 5:a (tp) $da bytes for ${np:-?} sent by tp, 5:b (tm) $db for ${nm:-?}, 5:c (td) $dc for ${nd:-?}, 5:99 (default) $dd"
    for x in "prio tp 5:a $da ${np:-0}" "mark tm 5:b $db ${nm:-0}" "dscp td 5:c $dc ${nd:-0}"; do
        # shellcheck disable=SC2086 # a word list
        set -- $x
        # at least the payload; at most 1.10 x it (headers at MTU 1500, 4.6%, and the ACKs of
        # what it received) plus 1 MiB: a communicator sends about 0.8 MB per host that its
        # payload counter does not count (3 AllReduces of 256 KiB: 1.66 MB on the link for
        # 0.79 MB counted, over the netns harness on the host)
        r=$(awk -v c="$4" -v p="$5" 'BEGIN { if (p > 0) printf "%.3f", c / p; else print 0 }')
        tap "$(awk -v c="$4" -v p="$5" 'BEGIN { exit !(p > 1000000 && c >= p && c <= 1.10 * p + 1048576) }'; echo $?)" \
            "host $i, $1 path: tenant $2's bytes in its class $3: $4 bytes for $5 sent ($r x)"
    done
    tot=$((da + db + dc))
    tap "$(awk -v d="$dd" -v t="$tot" 'BEGIN { exit !(t > 0 && d <= 0.005 * t) }'; echo $?)" \
        "host $i: the default class 5:99 carried $dd bytes ($(awk -v d="$dd" -v t="$tot" 'BEGIN { printf "%.3f", t ? 100 * d / t : 0 }')% of the tenants' $tot)"
    i=$((i + 1))
done

# the split on host 0: per 1 s window where every class sent, each class's share against
# its rate's (1/4, 1/4, 1/2); and the whole run from the first to the last such window
awk -v lb="$link_b" '
    { t[NR] = $1; a[NR] = $2; b[NR] = $3; c[NR] = $4 }
    END {
        for (i = 2; i <= NR; i++) {
            dt = t[i] - t[i - 1]; x = a[i] - a[i - 1]; y = b[i] - b[i - 1]; z = c[i] - c[i - 1]
            s = x + y + z
            if (x <= 0 || y <= 0 || z <= 0 || dt <= 0) continue
            n++; if (!f) f = i - 1; l = i
            printf "# window %2d: %5.2f %5.2f %5.2f Mbit/s, shares %.3f %.3f %.3f (rates 0.25 0.25 0.5), link use %.0f%%\n",
                n, 8 * x / dt / 1e6, 8 * y / dt / 1e6, 8 * z / dt / 1e6, x / s, y / s, z / s,
                100 * 8 * s / dt / lb
        }
        if (n < 1) { print "split windows=0"; exit }
        x = a[l] - a[f]; y = b[l] - b[f]; z = c[l] - c[f]; s = x + y + z; dt = t[l] - t[f]
        printf "split windows=%d shares=%.3f,%.3f,%.3f link_use_pct=%.0f\n", n, x / s, y / s, z / s,
            100 * 8 * s / dt / lb
    }' "$tmp/samples" >"$tmp/split"
grep '^#' "$tmp/split"
sp=$(grep '^split' "$tmp/split")
# reported, not asserted: the emulated CPU, not the link, limits the jobs here (16-100% of the
# link in use per second at host load 12-16), so the split says little about htb
echo "# the split of host 0's link among tp:tm:td (rates 1:1:2): $sp"
echo "# the tc section took $((SECONDS - t_start)) s"
echo "1..$n_tap"
exit "$fails"
