#!/bin/sh
# Conformance suite against the IB verbs transport; skipped where no RDMA device exists.
bin="${top_builddir:-.}/tests/tl"
n=$("$bin/test_ib_logic" --devices 2>/dev/null || echo 0)
if [ "${n:-0}" -eq 0 ]; then
    echo "1..0 # SKIP no RDMA device (ibv_get_device_list found none)"
    exit 0
fi
exec "$bin/test_tl" ib "$@"
