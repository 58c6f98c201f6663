#!/bin/sh
# Conformance suite against the shm transport.
exec "${top_builddir:-.}/tests/tl/test_tl" shm "$@"
