#!/bin/sh
# Installs what the PyTorch backend (bindings/torch) needs to build and test: torch, numpy and
# pytest from PyPI, into the Python that runs it (${PYTHON:-python3}). numpy: torch's wheel no
# longer requires it, but torch.distributed's object collectives (all_gather_object, which the
# tests use to collect the ranks' verdicts) need it. Reuses pip's cache
# (~/.cache/pip, or PIP_CACHE_DIR); does nothing when both import already. Fails (exit 1) when
# torch cannot be installed or imported: CI must not pass without it.
set -e
py=${PYTHON:-python3}
if "$py" -c "import torch, torch.distributed, numpy, pytest" 2>/dev/null; then
    echo "deps_torch.sh: torch $("$py" -c 'import torch; print(torch.__version__)'), numpy and pytest present"
    exit 0
fi
# Debian's own python3 refuses pip installs (PEP 668) unless told; a pyenv or venv python does not
brk=""
if "$py" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages &&
   [ -e "$("$py" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ]; then
    brk=--break-system-packages
fi
echo "deps_torch.sh: installing torch, numpy and pytest with $py -m pip (about 5 GB the first time)"
"$py" -m pip install -q $brk torch numpy pytest ||
    { echo "deps_torch.sh: pip install torch FAILED"; exit 1; }
"$py" -c "import torch, torch.distributed, numpy, pytest" ||
    { echo "deps_torch.sh: torch does not import after install"; exit 1; }
