#!/bin/sh
# Generates configure and Makefile.in. Needs autoconf, automake, libtool, pkg-config.
set -e
cd "$(dirname "$0")"
mkdir -p build-aux config/m4
autoreconf -fi
# automake does not install the TAP driver by itself.
am_dir=$(automake --print-libdir)
cp -f "$am_dir/tap-driver.sh" build-aux/tap-driver.sh
chmod +x build-aux/tap-driver.sh
