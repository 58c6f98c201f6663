#!/bin/sh
# QoS marks on a real tcp job (src/qos, transports/tcp): 2 ranks under shoalrun with
# SHOAL_TRANSPORT=tcp; every data socket of the communicator must carry the SO_PRIORITY and
# DSCP of the job's class, SO_MAX_PACING_RATE = SHOAL_QOS_LINK_RATE_MAX / sockets per peer with a
# cap, and nothing when the class is default (qos_rank.c checks with getsockopt).
#
# Environment: top_builddir (make check), QOS_TIMEOUT (seconds per job, 60).
builddir=${top_builddir:-.}
shoalrun=$builddir/shoalrun
rank=$builddir/tests/qos/qos_rank
timeout=${QOS_TIMEOUT:-60}
n=0
if [ ! -x "$shoalrun" ] || [ ! -x "$rank" ]; then
    echo "1..0 # SKIP shoalrun or qos_rank not built"
    exit 0
fi
unset SHOAL_CREDENTIAL SHOAL_CREDENTIAL_FILE SHOAL_QOS_CLASS SHOAL_QOS_WEIGHT SHOAL_QOS_DSCP \
    SHOAL_QOS_PRIORITY SHOAL_QOS_LINK_RATE_MAX SHOAL_QOS_CLASS_MAX
echo "1..6"
job() { # job DESCRIPTION PRIO TOS RATE [VAR=VALUE...]
    d=$1 p=$2 t=$3 r=$4
    shift 4
    n=$((n + 1))
    if out=$(env SHOAL_TRANSPORT=tcp SHOAL_SOCKET_NSOCKS=2 "$@" "$shoalrun" --timeout "$timeout" \
        -n 2 "$rank" "$p" "$t" "$r" 2>&1); then
        echo "ok $n - $d"
    else
        echo "not ok $n - $d"
    fi
    echo "$out" | sed 's/^/# /' | head -n 20
}
job "default class: no marks on any data socket" -1 -1 0
job "spot: SO_PRIORITY 1, DSCP CS1 (IP_TOS 0x20) on every data socket" 1 32 0 SHOAL_QOS_CLASS=spot
job "burstable: SO_PRIORITY 4, DSCP AF21 (IP_TOS 0x48)" 4 72 0 SHOAL_QOS_CLASS=burstable
job "guaranteed without a credential is lowered to burstable (SHOAL_QOS_CLASS_MAX)" 4 72 0 \
    SHOAL_QOS_CLASS=guaranteed
job "guaranteed with a provider ceiling of guaranteed: SO_PRIORITY 6, AF41 (0x88)" 6 136 0 \
    SHOAL_QOS_CLASS=guaranteed SHOAL_QOS_CLASS_MAX=guaranteed
job "SHOAL_QOS_LINK_RATE_MAX=100m over 2 sockets: SO_MAX_PACING_RATE 50m on each, custom DSCP EF" \
    1 184 52428800 SHOAL_QOS_CLASS=spot SHOAL_QOS_LINK_RATE_MAX=100m SHOAL_QOS_DSCP=spot=EF
