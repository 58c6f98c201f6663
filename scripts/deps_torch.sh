#!/bin/sh
# Installs what the PyTorch backend (bindings/torch) needs to build and test: torch and pytest
# from PyPI, into the Python that runs it (${PYTHON:-python3}). Reuses pip's cache
# (~/.cache/pip, or PIP_CACHE_DIR); does nothing when both import already. Fails (exit 1) when
# torch cannot be installed or imported: CI must not pass without it.
set -e
py=${PYTHON:-python3}
if "$py" -c "import torch, torch.distributed, pytest" 2>/dev/null; then
    echo "deps_torch.sh: torch $("$py" -c 'import torch; print(torch.__version__)') and pytest present"
    exit 0
fi
# Debian's own python3 refuses pip installs (PEP 668) unless told; a pyenv or venv python does not
brk=""
if "$py" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages &&
   [ -e "$("$py" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ]; then
    brk=--break-system-packages
fi
echo "deps_torch.sh: installing torch and pytest with $py -m pip (about 5 GB the first time)"
"$py" -m pip install -q $brk torch pytest || { echo "deps_torch.sh: pip install torch FAILED"; exit 1; }
"$py" -c "import torch, torch.distributed, pytest" ||
    { echo "deps_torch.sh: torch does not import after install"; exit 1; }
