#!/bin/sh
# shoal-tc: the kernel side of shoal's per-tenant bandwidth shares on a host's interfaces
# (DESIGN.md section 7, QoS). The node agent shoald runs it (qos_tc, qos_tc_dev) at start and
# stop; a provider may run it by hand.
#
#   shoal-tc.sh [-n NETNS] setup DEV LINK_RATE TENANT_SPEC...
#   shoal-tc.sh [-n NETNS] remove DEV
#   shoal-tc.sh [-n NETNS] show DEV
#
# setup makes an htb root (handle 5:) on DEV with one parent class at LINK_RATE (rate = ceil:
# the whole link) and, under it, one class per tenant: rate = the tenant's guaranteed share,
# ceil = LINK_RATE (spare bandwidth goes to whoever uses it: htb lends it by the classes'
# rates), an fq leaf (per-flow fairness and pacing inside the tenant; fq_codel, sfq or htb's
# own fifo where the kernel lacks it), and a filter that puts the tenant's packets in its
# class. Traffic no filter claims goes to a default class (5:99,
# the rate left over, at least 1% of the link, ceil LINK_RATE).
#
# TENANT_SPEC: NAME,rate=RATE,CLASSIFIER (tc rates: 300mbit, 1gbit...), CLASSIFIER one of:
#   dscp=N  the DSCP (0..63) the tenant's packets carry (IP_TOS / IPV6_TCLASS; shoal sets it
#           per class, SHOAL_QOS_DSCP): u32 match on the IPv4 TOS byte and the IPv6 traffic
#           class. Needs only cls_u32, which every kernel with htb has.
#   prio=N  the skb priority the tenant's sockets carry (SO_PRIORITY; shoal sets it per class,
#           SHOAL_QOS_PRIORITY): tc filter basic match meta(priority eq N). A process may set
#           its own SO_PRIORITY 0..6, so this trusts the jobs to keep the provider's lists.
#   mark=M  the fwmark the provider's firewall sets by the tenant's uid (e.g. nft: meta skuid
#           1000 meta mark set M), which a job cannot change: tc filter fw handle M.
# (prio= needs cls_basic and mark= cls_fw; a kernel without them answers exit 3.)
# setup replaces an existing root qdisc of DEV and removes what it made on failure; remove
# deletes the root qdisc if it is shoal's (handle 5:); both are idempotent.
#
# Environment: SHOAL_TC_BURST_MS (default 100): each tenant class's burst, in ms of its rate
# (at least 16000 bytes); the classes' cburst is 2 ms of LINK_RATE and their htb quantum
# follows their rate.
#
# Exit status: 0 done; 2 usage; 3 tc may not be configured here (no CAP_NET_ADMIN, no tc, no
# such device): the caller falls back to in-library pacing (shoald says so once); 1 other.

ns=
if [ "${1:-}" = -n ]; then
    ns=$2
    shift 2
fi
usage() {
    sed -n '/^#   shoal-tc.sh/p' "$0" | sed 's/^#   /usage: /' >&2
    exit 2
}
[ $# -ge 2 ] || usage
cmd=$1 dev=$2
shift 2

tcx() { # tc in the namespace, if any
    if [ -n "$ns" ]; then tc -n "$ns" "$@"; else tc "$@"; fi
}

if ! command -v tc >/dev/null 2>&1; then
    echo "shoal-tc: tc (iproute2) not found" >&2
    exit 3
fi
if ! tcx qdisc show dev "$dev" >/dev/null 2>&1; then
    echo "shoal-tc: no device $dev${ns:+ in namespace $ns}" >&2
    exit 3
fi

ours() {
    tcx qdisc show dev "$dev" | grep -q '^qdisc htb 5: root'
}

case $cmd in
remove)
    if ours; then
        tcx qdisc del dev "$dev" root || exit 1
        echo "shoal-tc: removed the htb root of $dev${ns:+ (namespace $ns)}"
    fi
    exit 0
    ;;
show)
    tcx -s qdisc show dev "$dev"
    tcx -s class show dev "$dev"
    tcx filter show dev "$dev"
    exit 0
    ;;
setup) ;;
*) usage ;;
esac

[ $# -ge 2 ] || usage
link=$1
shift

# tc rate -> bits/s (tc's units: bit, kbit, mbit, gbit = powers of 1000; bps = bytes).
bits() {
    echo "$1" | awk '{ v = tolower($1); m = 1;
        if (v ~ /gbit$/) { m = 1e9; sub(/gbit$/, "", v) }
        else if (v ~ /mbit$/) { m = 1e6; sub(/mbit$/, "", v) }
        else if (v ~ /kbit$/) { m = 1e3; sub(/kbit$/, "", v) }
        else if (v ~ /bit$/) { sub(/bit$/, "", v) }
        else if (v ~ /bps$/) { m = 8; sub(/bps$/, "", v) }
        if (v !~ /^[0-9.]+$/) { print -1; exit } printf "%.0f\n", v * m }'
}
link_b=$(bits "$link")
[ "$link_b" -gt 0 ] 2>/dev/null || { echo "shoal-tc: bad link rate $link" >&2; exit 2; }

# Check every spec before touching the device.
sum=0
for spec in "$@"; do
    name=${spec%%,*}
    rest=${spec#"$name"}
    rate= prio= mark= dscp= ncls=0
    for kv in $(echo "$rest" | tr ',' ' '); do
        case $kv in
        rate=*) rate=${kv#rate=} ;;
        prio=*) prio=${kv#prio=}; ncls=$((ncls + 1)) ;;
        mark=*) mark=${kv#mark=}; ncls=$((ncls + 1)) ;;
        dscp=*) dscp=${kv#dscp=}; ncls=$((ncls + 1)) ;;
        *) echo "shoal-tc: $spec: unknown field $kv" >&2; exit 2 ;;
        esac
    done
    r=$(bits "${rate:-x}")
    if [ -z "$name" ] || [ -z "$rate" ] || [ "$r" -lt 0 ] 2>/dev/null || [ "$ncls" != 1 ] ||
        { [ -n "$dscp" ] && ! [ "$dscp" -ge 0 -a "$dscp" -le 63 ] 2>/dev/null; }; then
        echo "shoal-tc: $spec: expected NAME,rate=RATE,dscp=N|prio=N|mark=M" >&2
        exit 2
    fi
    sum=$((sum + r))
    [ "$r" -le "${rmax:-0}" ] || rmax=$r
done
[ "$sum" -le "$link_b" ] || {
    echo "shoal-tc: the tenants' rates add up to more than the link ($sum > $link_b bit/s)" >&2
    exit 2
}
left=$((link_b - sum))
floor=$((link_b / 100))
[ "$left" -ge "$floor" ] || left=$floor
[ "$left" -le "$rmax" ] || rmax=$left
# htb's own defaults do not fit a link divided by weight at these rates:
# - quantum (the bytes a class sends per turn of htb's round robin among the classes that
#   send within their rate, and among those that borrow the link's spare): tc makes it
#   rate / r2q and clamps it to 200000 bytes, so above 16 Mbit/s every class got the same
#   200000 and the spare was split 1:1 whatever the weights. Here: proportional to the rate,
#   200000 for the largest class, at least one 1514-byte frame.
# - cburst (and the root's burst): tc's default is about one frame (1375 bytes at 1 Gbit/s),
#   so every late wake-up of htb's timer on a loaded host is link time lost for good;
#   2 ms of the link rate (at least 16000 bytes) lets it catch up within the link's rate.
quantum() { # quantum RATE_BITS
    q=$(awk -v r="$1" -v m="$rmax" 'BEGIN { printf "%.0f", 200000 * r / m }')
    [ "$q" -ge 1514 ] || q=1514
    echo "$q"
}
cb=$(( link_b * 2 / 8000 ))
[ "$cb" -ge 16000 ] || cb=16000

fail() {
    echo "shoal-tc: $1" >&2
    tcx qdisc del dev "$dev" root 2>/dev/null
    case $1 in
    *"Operation not permitted"*|*"ermission"*|*"not found"*|*"unknown"*) exit 3 ;;
    esac
    exit 1
}
run() { # run tc ARGS: stops at the first failure with tc's message
    out=$(tcx "$@" 2>&1) || fail "tc $*: $out"
}

if ours; then
    run qdisc del dev "$dev" root # a fresh tree: htb cannot change its root in place
fi
run qdisc replace dev "$dev" root handle 5: htb default 99
run class add dev "$dev" parent 5: classid 5:1 htb rate "${link_b}bit" ceil "${link_b}bit" \
    burst "$cb" cburst "$cb"
run class add dev "$dev" parent 5:1 classid 5:99 htb rate "${left}bit" ceil "${link_b}bit" \
    cburst "$cb" quantum "$(quantum "$left")"
# The leaf: the first queueing discipline this kernel has (none: htb's fifo).
leaf=
for q in fq fq_codel sfq; do
    if tcx qdisc add dev "$dev" parent 5:99 handle 99: "$q" 2>/dev/null; then
        leaf=$q
        break
    fi
done
[ -n "$leaf" ] || echo "shoal-tc: $dev: no fq, fq_codel or sfq in this kernel: htb's fifo" \
    "leaves" >&2
id=10
for spec in "$@"; do
    name=${spec%%,*}
    rate= prio= mark= dscp=
    for kv in $(echo "${spec#"$name"}" | tr ',' ' '); do
        case $kv in
        rate=*) rate=${kv#rate=} ;;
        prio=*) prio=${kv#prio=} ;;
        mark=*) mark=${kv#mark=} ;;
        dscp=*) dscp=${kv#dscp=} ;;
        esac
    done
    hex=$(printf '%x' "$id")
    # burst: SHOAL_TC_BURST_MS (100) ms of its rate (at least 16000 bytes), so that a tenant
    # whose traffic comes in steps (a collective waits for its peers between them) gets back
    # what it left to the others while it waited, instead of losing it to them
    rb=$(bits "$rate")
    bb=$(( rb / 8 * ${SHOAL_TC_BURST_MS:-100} / 1000 ))
    run class add dev "$dev" parent 5:1 classid "5:$hex" htb rate "${rb}bit" \
        ceil "${link_b}bit" burst "$(( bb > 16000 ? bb : 16000 ))" cburst "$cb" \
        quantum "$(quantum "$rb")"
    [ -z "$leaf" ] || run qdisc add dev "$dev" parent "5:$hex" handle "$hex:" "$leaf"
    if [ -n "$dscp" ]; then
        tos=$(printf '0x%02x' $((dscp << 2)))
        run filter add dev "$dev" parent 5: protocol ip prio 1 u32 \
            match ip tos "$tos" 0xfc flowid "5:$hex"
        run filter add dev "$dev" parent 5: protocol ipv6 prio 2 u32 \
            match ip6 priority "$tos" 0xfc flowid "5:$hex"
    elif [ -n "$prio" ]; then
        run filter add dev "$dev" parent 5: protocol all prio 3 basic \
            match "meta(priority eq $prio)" flowid "5:$hex"
    else
        run filter add dev "$dev" parent 5: protocol all prio 4 handle "$mark" fw flowid "5:$hex"
    fi
    echo "shoal-tc: $dev${ns:+ (namespace $ns)}: tenant $name class 5:$hex rate $rate ceil" \
        "$link ${dscp:+dscp $dscp}${prio:+priority $prio}${mark:+mark $mark}${leaf:+, $leaf leaf}"
    id=$((id + 1))
done
exit 0
