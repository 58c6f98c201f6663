#!/bin/sh
# hostid_wrap.sh PROG [ARGS...]: run PROG as one rank of a shoalrun job on a virtual host:
# SHOAL_HOSTID=host<N> from MP_HOSTMAP, a comma-separated list of host numbers per rank
# (rank r gets the r-th entry, e.g. "0,0,1,1,1"), or else host$((SHOAL_RANK / MP_PPN)).
# Ranks with different host ids use tcp between them and shm within a host.
rank=${SHOAL_RANK:?SHOAL_RANK is not set (run under shoalrun)}
if [ -n "${MP_HOSTMAP:-}" ]; then
    h=$(printf '%s\n' "$MP_HOSTMAP" | cut -d, -f$((rank + 1)))
else
    h=$((rank / ${MP_PPN:-1}))
fi
SHOAL_HOSTID=host$h
export SHOAL_HOSTID
exec "$@"
