#!/bin/bash
# CI step for the PyTorch backend: installs torch (scripts/deps_torch.sh, fails loudly without
# it), stages `make install` of the release build (build/) under build/torch-stage, builds and
# pip-installs bindings/torch against it, runs its pytest suite. Last line:
# "torch: N passed, N failed".
set -u
cd "$(dirname "$0")/.."
top=$(pwd)
py=${PYTHON:-python3}
fail() { echo "=== torch: $1"; echo "torch: 0 passed, 1 failed"; exit 1; }

./scripts/deps_torch.sh || fail "torch could not be installed"
[ -x build/shoalrun ] || fail "no release build in build/ (scripts/build.sh build first)"
stage=$top/build/torch-stage
rm -rf "$stage"
make -C build install DESTDIR="$stage" > build/torch-install.log 2>&1 ||
    fail "make install DESTDIR=$stage failed (build/torch-install.log)"
pc=$(dirname "$(find "$stage" -name shoal.pc | head -1)")
echo "=== torch: pip install --no-build-isolation ./bindings/torch (shoal.pc in $pc)"
PKG_CONFIG="pkg-config --define-prefix" PKG_CONFIG_PATH="$pc" \
    "$py" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./bindings/torch \
    > build/torch-pip.log 2>&1 || { tail -40 build/torch-pip.log; fail "the extension did not build"; }
echo "=== torch: pytest bindings/torch/tests"
(cd bindings/torch/tests && SHOALRUN=$top/build/shoalrun timeout -k 30 1500 \
    "$py" -m pytest -q -p no:cacheprovider -o junit_family=xunit2 \
    --junitxml="$top/build/torch-pytest.xml" .) > build/torch-pytest.out 2>&1
rc=$?
grep -E '^(FAILED|ERROR)|passed|failed' build/torch-pytest.out | tail -40
p=$(grep -o '[0-9]* passed' build/torch-pytest.out | tail -1 | cut -d' ' -f1)
f=$(grep -oE '[0-9]+ (failed|error)' build/torch-pytest.out | awk '{s+=$1} END {print s+0}')
p=${p:-0}
if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1 # pytest failed without a count (no tests collected, crash, timeout)
    tail -30 build/torch-pytest.out
fi
echo "torch: $p passed, $f failed"
[ $rc -eq 0 ]
