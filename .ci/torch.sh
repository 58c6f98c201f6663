#!/bin/bash
# CI step for the PyTorch backend: installs torch (scripts/deps_torch.sh, fails loudly without
# it), stages `make install` of the release build (build/) under build/torch-stage, builds and
# pip-installs bindings/torch against it, runs its pytest suite. Last line:
# "torch: N passed, N failed".
# Environment (perf/gpu_check.sh uses them on the device machine): TORCH_BUILD (the build
# dir, default build), TORCH_PIP_TARGET (install the extension into this dir and put it on
# PYTHONPATH, instead of the interpreter's site-packages), TORCH_TESTS (pytest arguments, run
# in bindings/torch/tests; default ".").
set -u
cd "$(dirname "$0")/.." || exit 1
py=${PYTHON:-python3}
fail() { echo "=== torch: $1"; echo "torch: 0 passed, 1 failed"; exit 1; }

./scripts/deps_torch.sh || fail "torch could not be installed"
b=$(cd "${TORCH_BUILD:-build}" 2>/dev/null && pwd) ||
    fail "no build dir ${TORCH_BUILD:-build} (scripts/build.sh build first)"
[ -x "$b/shoalrun" ] || fail "no release build in $b (scripts/build.sh build first)"
stage=$b/torch-stage
rm -rf "$stage"
make -C "$b" install DESTDIR="$stage" > "$b/torch-install.log" 2>&1 ||
    fail "make install DESTDIR=$stage failed ($b/torch-install.log)"
pc=$(dirname "$(find "$stage" -name shoal.pc | head -1)")
where=()
if [ -n "${TORCH_PIP_TARGET:-}" ]; then
    rm -rf "$TORCH_PIP_TARGET"
    where=(--target "$TORCH_PIP_TARGET")
    export PYTHONPATH=$TORCH_PIP_TARGET${PYTHONPATH:+:$PYTHONPATH}
fi
echo "=== torch: pip install --no-build-isolation ./bindings/torch (shoal.pc in $pc)"
PKG_CONFIG="pkg-config --define-prefix" PKG_CONFIG_PATH="$pc" \
    "$py" -m pip install -q --no-build-isolation --force-reinstall --no-deps "${where[@]}" \
    ./bindings/torch > "$b/torch-pip.log" 2>&1 || {
    tail -40 "$b/torch-pip.log"
    # A machine we cannot install on (the device machine: no PyPI, maybe no pip or wheel)
    # still builds with setuptools alone into the target dir; tests import shoal_torch.
    [ -n "${TORCH_PIP_TARGET:-}" ] || fail "the extension did not build"
    echo "=== torch: pip failed; setup.py build into $TORCH_PIP_TARGET instead"
    mkdir -p "$TORCH_PIP_TARGET"
    (cd bindings/torch && PKG_CONFIG="pkg-config --define-prefix" PKG_CONFIG_PATH="$pc" \
        "$py" setup.py -q build --build-base "$b/torch-setup-build" &&
        cp -r "$b"/torch-setup-build/lib*/. "$TORCH_PIP_TARGET"/) >> "$b/torch-pip.log" 2>&1 ||
        { tail -40 "$b/torch-pip.log"; fail "the extension did not build"; }
}
echo "=== torch: pytest bindings/torch/tests ${TORCH_TESTS:-.}"
# shellcheck disable=SC2086 # TORCH_TESTS is a list of pytest arguments
(cd bindings/torch/tests && SHOALRUN=$b/shoalrun timeout -k 30 1500 \
    "$py" -m pytest -q -p no:cacheprovider -o junit_family=xunit2 \
    --junitxml="$b/torch-pytest.xml" ${TORCH_TESTS:-.}) > "$b/torch-pytest.out" 2>&1
rc=$?
grep -E '^(FAILED|ERROR)|passed|failed' "$b/torch-pytest.out" | tail -40
p=$(grep -o '[0-9]* passed' "$b/torch-pytest.out" | tail -1 | cut -d' ' -f1)
f=$(grep -oE '[0-9]+ (failed|error)' "$b/torch-pytest.out" | awk '{s+=$1} END {print s+0}')
p=${p:-0}
if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1 # pytest failed without a count (no tests collected, crash, timeout)
    tail -30 "$b/torch-pytest.out"
fi
echo "torch: $p passed, $f failed"
[ $rc -eq 0 ]
