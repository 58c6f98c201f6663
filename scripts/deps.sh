#!/bin/sh
# Installs what shoal needs to build and test on Debian 12 (run as root, or with sudo).
# Required: a C toolchain, autotools, pkg-config, OpenSSL's libcrypto (HMAC for authenticated
# joins). For the test suite: iproute2 (network-namespace tests), procps.
set -e
# Optional (used where found): UCX, rdma-core (verbs, rdmacm), hwloc, PMIx, Open MPI, Gloo,
# gnuplot (perf/compare.sh plots), libmicrohttpd (the node agent shoald's /metrics) and
# prometheus (promtool and a real server for the agent's tests), curl (the tests' HTTP client).
pkgs="build-essential autoconf automake libtool pkg-config libssl-dev iproute2 procps
      libucx-dev libibverbs-dev librdmacm-dev libhwloc-dev libpmix-dev libopenmpi-dev
      openmpi-bin libgloo-dev gnuplot-nox libmicrohttpd-dev prometheus curl"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "deps.sh: all packages present"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO=sudo
fi
echo "deps.sh: installing$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
