#!/bin/sh
# Conformance suite against the tcp transport.
exec "${top_builddir:-.}/tests/tl/test_tl" tcp "$@"
