#!/bin/sh
# rxe_host.sh PROG [ARGS...]: run PROG as one rank of a shoalrun job on one of the two
# "hosts" of the Soft-RoCE VM (tests/vm/init.sh): rank r is on host h = r mod 2 (so that ring
# neighbours sit on different hosts), or on the r-th entry of MP_HOSTMAP ("0,0,1,1"). Host h
# is SHOAL_HOSTID=host<h> with the device rxe<h> (SHOAL_IB_HCA, UCX_NET_DEVICES), whose port
# is on veth<h>.
rank=${SHOAL_RANK:?SHOAL_RANK is not set (run under shoalrun)}
if [ -n "${MP_HOSTMAP:-}" ]; then
    h=$(printf '%s\n' "$MP_HOSTMAP" | cut -d, -f$((rank + 1)))
else
    h=$((rank % 2))
fi
SHOAL_HOSTID=host$h
SHOAL_IB_HCA=rxe$h
SHOAL_IB_OOB_IFNAME=veth$h
UCX_NET_DEVICES=${UCX_NET_DEVICES:-rxe$h:1}
export SHOAL_HOSTID SHOAL_IB_HCA SHOAL_IB_OOB_IFNAME UCX_NET_DEVICES
exec "$@"
