#!/bin/sh
# Open MPI's remote shell for network-namespace hosts (perf/compare.sh --netns): mpirun calls
#     netns_rsh.sh HOST COMMAND...
# with HOST one of the namespaces' addresses 10.99.0.K; the command runs in namespace
# $SHOAL_NETNS_PREFIX-(K-1), in a UTS namespace of its own whose hostname names the host, so
# that Open MPI sees distinct nodes. Environment: SHOAL_NETNS_PREFIX (set by compare.sh).
host=$1
shift
[ -n "${SHOAL_NETNS_PREFIX:-}" ] || { echo "netns_rsh.sh: SHOAL_NETNS_PREFIX is not set" >&2; exit 2; }
case $host in
10.99.0.*) k=${host##*.} ;;
*) echo "netns_rsh.sh: '$host' is not a namespace host (10.99.0.K)" >&2; exit 2 ;;
esac
exec ip netns exec "$SHOAL_NETNS_PREFIX-$((k - 1))" unshare --uts sh -c "hostname nshost$k && $*"
