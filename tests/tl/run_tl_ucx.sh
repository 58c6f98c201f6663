#!/bin/sh
# Conformance suite against the ucx transport (UCX picks shared memory or tcp here).
exec "${top_builddir:-.}/tests/tl/test_tl" ucx "$@"
