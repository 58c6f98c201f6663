#!/bin/sh
# Installs what shoal needs to build and test on Debian 12 (run as root, or with sudo).
# Required: a C toolchain, autotools, pkg-config, OpenSSL's libcrypto (HMAC for authenticated
# joins). For the test suite: iproute2 (network-namespace tests), procps.
set -e
# Optional (used where found): UCX, rdma-core (verbs, rdmacm), hwloc, PMIx, Open MPI, Gloo,
# gnuplot (perf/compare.sh plots, shoal-bill plot). CI's fuzzing build: clang and its
# compiler-rt (libFuzzer, libclang_rt.fuzzer in libclang-rt-14-dev, which libclang-rt-dev pulls
# in). The billing ledger: libsqlite3-dev (the embedded default) and libpq-dev (PostgreSQL); its
# tests use sqlite3 and a PostgreSQL server they start themselves (postgresql). The node agent
# shoald: libmicrohttpd (its /metrics); its tests: prometheus (promtool and a real server) and
# curl (HTTP client). tests/slurm: a one-node Slurm the test starts itself (slurmctld, slurmd,
# slurm-client, munge; srun's PMIx plugin, mpi_pmix_v4, is in slurm-wlm-basic-plugins). Their
# services are not started by the install (see below): the test runs its own daemons.
# shoal-place's hostlist test compares with Slurm's own: libslurm-dev. The Soft-RoCE VM stage
# (tests/vm): qemu-system-x86, debootstrap, cpio, kmod (the guest's kernel and root come from
# Debian's packages at its first run).
pkgs="build-essential autoconf automake libtool pkg-config libssl-dev iproute2 procps
      libucx-dev libibverbs-dev librdmacm-dev libhwloc-dev libpmix-dev libopenmpi-dev
      openmpi-bin libgloo-dev gnuplot-nox clang libclang-rt-dev libsqlite3-dev sqlite3
      libpq-dev postgresql libmicrohttpd-dev prometheus curl libslurm-dev qemu-system-x86
      debootstrap cpio kmod"
daemons="slurmctld slurmd slurm-client munge"
missing=""
missing_daemons=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
for p in $daemons; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing_daemons="$missing_daemons $p"
done
if [ -z "$missing$missing_daemons" ]; then
    echo "deps.sh: all packages present"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO=sudo
fi
echo "deps.sh: installing$missing$missing_daemons"
$SUDO apt-get update -qq
if [ -n "$missing" ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
if [ -n "$missing_daemons" ]; then
    # Debian's postinst would start munged, slurmctld and slurmd (invoke-rc.d / systemd) with
    # /etc's key and config: a policy-rc.d that denies every start keeps them stopped (it is
    # removed again unless one was already there), and with systemd running they are stopped
    # and disabled afterwards. No recommends: slurm-wlm-plugins would pull in MySQL and more.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# deps.sh: no service starts while Slurm and munge install\nexit 101\n' |
            $SUDO tee "$policy" >/dev/null
        $SUDO chmod 755 "$policy"
        own_policy=1
    fi
    rc=0
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        $missing_daemons >/dev/null || rc=$?
    [ $own_policy = 1 ] && $SUDO rm -f "$policy"
    [ $rc = 0 ] || exit $rc
    if [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now munge slurmctld slurmd >/dev/null 2>&1 || true
    fi
fi
