#!/bin/sh
# Configures and builds shoal out of tree: scripts/build.sh [builddir] [configure args...]
# Default build dir: build/. Re-running only rebuilds what changed.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
bdir=${1:-build}
[ $# -gt 0 ] && shift
cd "$top"
[ -x configure ] || ./autogen.sh >/dev/null
mkdir -p "$bdir"
cd "$bdir"
[ -f Makefile ] || "$top/configure" -q "$@"
make -j"$(nproc)" >/dev/null
echo "build.sh: built in $top/$bdir"
