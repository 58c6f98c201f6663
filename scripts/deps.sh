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
# curl (HTTP client). The Soft-RoCE VM stage (tests/vm): qemu-system-x86, debootstrap, cpio,
# kmod (the guest's kernel and root come from Debian's packages at its first run).
pkgs="build-essential autoconf automake libtool pkg-config libssl-dev iproute2 procps
      libucx-dev libibverbs-dev librdmacm-dev libhwloc-dev libpmix-dev libopenmpi-dev
      openmpi-bin libgloo-dev gnuplot-nox clang libclang-rt-dev libsqlite3-dev sqlite3
      libpq-dev postgresql libmicrohttpd-dev prometheus curl qemu-system-x86 debootstrap cpio
      kmod"
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
