#!/bin/bash
# Runs inside the Soft-RoCE VM (tests/vm/guest_ib.sh, section "order"; TAP): the transport
# chosen across hosts when ib is left out (SHOAL_TRANSPORT_EXCLUDE=ib), issue 14. The
# registry's order is ib, ucx, tcp: ucx goes ahead of tcp only where sysfs has an ACTIVE RDMA
# port and UCX's own resources hold an RDMA transport; otherwise tcp, and with no RDMA device
# UCX is not even loaded. 4 ranks, two per "host" (MP_HOSTMAP=0,0,1,1, tests/vm/rxe_host.sh).
# Environment: top_srcdir, top_builddir (the guest build).
set -u
src=${top_srcdir:?}
b=${top_builddir:?}
wrap=$src/tests/vm/rxe_host.sh
tmp=$(mktemp -d /tmp/guest_order.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
n=0
tap() { # tap 0|1 description
    n=$((n + 1))
    if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}
export UCX_UD_ETH_DGID_CHECK=n UCX_WARN_UNUSED_ENV_VARS=n
unset SHOAL_TRANSPORT UCX_TLS

# What Debian's UCX finds on rxe0: the verbs transports (rc_verbs, ud_verbs) or only tcp
if command -v ucx_info > /dev/null; then
    UCX_NET_DEVICES=rxe0:1 ucx_info -d > "$tmp/ucx_info" 2>&1
    tls=$(awk '/Transport:/ { print $3 }' "$tmp/ucx_info" | sort -u | tr '\n' ' ')
    echo "# ucx_info -d (UCX_NET_DEVICES=rxe0:1): transports $tls"
else
    tls=""
    echo "# no ucx_info in the VM"
fi
case " $tls " in
*" rc_verbs "*|*" ud_verbs "*|*" rc_mlx5 "*|*" dc_mlx5 "*) verbs=1 ;;
*) verbs=0 ;;
esac
tap "$([ $verbs = 1 ]; echo $?)" "ucx_info -d: Debian's UCX has a verbs transport on rxe0 ($tls)"

# shoal_info -b: the choice on this host's side, and why
SHOAL_TRANSPORT_EXCLUDE=ib UCX_NET_DEVICES=rxe0:1 "$b/shoal_info" -b > "$tmp/info" 2>&1
line=$(grep "^# across hosts" "$tmp/info")
echo "# shoal_info -b: $line"
want="across hosts \\(this host's side\\): ucx \\(UCX reaches other hosts over RDMA: "
want="$want.*(rc|ud)_verbs/rxe0:1.*not taken before it: ib: excluded"
echo "$line" | grep -Eq "$want"
tap $? "shoal_info -b, ib excluded: ucx across hosts, over rc/ud_verbs on rxe0"

# job JOBNAME ENV...: mp_coll allreduce + barrier on 4 ranks of two hosts, INFO logs of INIT
# and UCX; output in $tmp/JOBNAME.out/.err, exit status in rc
job() {
    local name=$1
    shift
    local x=() e
    for e in "$@"; do x+=(-x "$e"); done
    timeout 400 "$b/shoalrun" --no-prefix --timeout 380 -n 4 -x SHOAL_DEBUG=INFO \
        -x SHOAL_DEBUG_SUBSYS=INIT,UCX -x MP_HOSTMAP=0,0,1,1 "${x[@]}" "$wrap" \
        "$b/tests/mp/mp_coll" allreduce barrier > "$tmp/$name.out" 2> "$tmp/$name.err"
    rc=$?
    grep -E "across hosts|UCX (loaded|unavailable)|ucx endpoints|ucx (chosen|not chosen)" \
        "$tmp/$name.err" | sort | uniq -c | head -8 | sed -e "s/^/# $name: /"
    if [ $rc -ne 0 ] || grep -q '^not ok' "$tmp/$name.out"; then
        tail -20 "$tmp/$name.err" | sed -e "s/^/# $name stderr: /"
        grep '^not ok' "$tmp/$name.out" | head -5 | sed -e "s/^/# $name: /"
        return 1
    fi
    return 0
}
count() { grep -c "$1" "$2"; }

# 1. ib excluded, rxe up, UCX's defaults (no UCX_TLS): ucx over verbs between the hosts
job ucx SHOAL_TRANSPORT_EXCLUDE=ib
tap $? "ib excluded, rxe up: 4 ranks on two hosts, allreduce and barrier pass (exit $rc)"
if [ $verbs = 1 ]; then
    c=$(count "across hosts: ucx (UCX reaches other hosts over RDMA" "$tmp/ucx.err")
    tap "$([ "$c" = 4 ]; echo $?)" "ib excluded: every rank chose ucx across hosts ($c of 4)"
    c=$(count "2 ucx endpoints authenticated" "$tmp/ucx.err")
    tap "$([ "$c" = 4 ]; echo $?)" "ib excluded: every rank connected its 2 peers on the other host over ucx ($c of 4)"
else
    c=$(count "across hosts: tcp (" "$tmp/ucx.err")
    tap "$([ "$c" = 4 ]; echo $?)" "ib excluded, UCX without verbs here: every rank chose tcp ($c of 4)"
fi

# 2. ib excluded, UCX limited to tcp (UCX_TLS): UCX loaded, asked, and tcp chosen
job ucxtcp SHOAL_TRANSPORT_EXCLUDE=ib UCX_TLS=tcp,sm,self
tap $? "ib excluded, UCX_TLS=tcp,sm,self: allreduce and barrier pass (exit $rc)"
c=$(count "across hosts: tcp (.*ucx: only when forced: UCX has no RDMA transport that UCX_TLS" "$tmp/ucxtcp.err")
tap "$([ "$c" = 4 ]; echo $?)" "UCX_TLS=tcp,sm,self: every rank chose tcp, saying why ($c of 4)"
c=$(count "ucx endpoints" "$tmp/ucxtcp.err")
tap "$([ "$c" = 0 ]; echo $?)" "UCX_TLS=tcp,sm,self: no ucx endpoint ($c)"

# 3. no RDMA device in sysfs (as on a host without one): tcp, UCX never loaded
job nodev SHOAL_TRANSPORT_EXCLUDE=ib SHOAL_UCX_SYSFS_ROOT="$tmp/nosys"
tap $? "no RDMA device (SHOAL_UCX_SYSFS_ROOT empty): allreduce and barrier pass (exit $rc)"
c=$(count "across hosts: tcp (.*ucx: no device: no RDMA device" "$tmp/nodev.err")
tap "$([ "$c" = 4 ]; echo $?)" "no RDMA device: every rank chose tcp, saying why ($c of 4)"
c=$(count "UCX loaded\\|UCX unavailable" "$tmp/nodev.err")
tap "$([ "$c" = 0 ]; echo $?)" "no RDMA device: UCX not loaded on any rank ($c lines say it was)"

echo "1..$n"
