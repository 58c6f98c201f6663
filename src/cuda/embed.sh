#!/bin/sh
# embed.sh FILE NAME: prints a C file holding FILE's bytes as
#   const unsigned char NAME[] (16-byte aligned) and const size_t NAME_size,
# both hidden. Used to embed the kernels' fatbin into libshoal (POSIX od + sed, no xxd).
set -e
[ -r "$1" ] || { echo "embed.sh: cannot read $1" >&2; exit 1; }
echo "/* Generated from $(basename "$1") by src/cuda/embed.sh; do not edit. */"
echo "#include <stddef.h>"
echo "__attribute__((visibility(\"hidden\"), aligned(16))) const unsigned char $2[] = {"
od -An -v -tx1 "$1" | sed -e 's/ *\([0-9a-f][0-9a-f]\)/0x\1,/g' -e '/^$/d'
echo "};"
echo "__attribute__((visibility(\"hidden\"))) const size_t ${2}_size = sizeof($2);"
