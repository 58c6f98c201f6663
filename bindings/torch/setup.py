# Builds shoal's torch.distributed backend against the installed libshoal (pkg-config shoal).
#   pip install --no-build-isolation ./bindings/torch
# --no-build-isolation builds against the torch already installed (the extension must match it
# exactly; an isolated build would download another torch). PKG_CONFIG names the pkg-config
# command (e.g. "pkg-config --define-prefix" for a DESTDIR-staged install); PKG_CONFIG_PATH
# finds shoal.pc outside the default search path.
#
# CUDA: the extension takes CUDA tensors (stream-ordered shoal calls on the current stream)
# when torch has CUDA, the CUDA toolkit's headers are found (CUDA_HOME, or nvcc on PATH, as
# torch's extension tools look for it) and libshoal was built with CUDA (`shoal_info -b` of
# that installation says "cuda found: yes"). SHOAL_TORCH_CUDA=0 builds the CPU-only extension
# regardless; SHOAL_TORCH_CUDA=1 fails the build when one of the three is missing; unset (or
# "auto") decides by the three and says what it decided.
import os
import re
import shlex
import subprocess
import sys

from setuptools import setup

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:
    sys.exit("shoal-torch: PyTorch is not importable here; install torch first and build "
             "with: pip install --no-build-isolation ./bindings/torch")


def pkg_config(*args):
    cmd = shlex.split(os.environ.get("PKG_CONFIG", "pkg-config")) + list(args) + ["shoal"]
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit("shoal-torch: `%s` failed (%s); install shoal (make install) or set "
                 "PKG_CONFIG_PATH to the folder holding shoal.pc" % (" ".join(cmd), e))
    return shlex.split(out)


def libshoal_cuda():
    """True / False: whether the libshoal that pkg-config finds was built with CUDA (its
    installation's shoal_info -b says so); None when that cannot be told."""
    cmd = shlex.split(os.environ.get("PKG_CONFIG", "pkg-config")) + ["--variable=prefix", "shoal"]
    try:
        prefix = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
        out = subprocess.run([os.path.join(prefix, "bin", "shoal_info"), "-b"], check=True,
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\s+cuda\s+found:\s+(yes|no)", out, re.M)
    return None if m is None else m.group(1) == "yes"


def want_cuda():
    """(build the CUDA part?, why) from SHOAL_TORCH_CUDA, torch, the toolkit and libshoal."""
    mode = os.environ.get("SHOAL_TORCH_CUDA", "auto").strip().lower()
    if mode in ("0", "no", "off", "false"):
        return False, "SHOAL_TORCH_CUDA=%s" % mode
    missing = []
    if torch.version.cuda is None:
        missing.append("torch %s has no CUDA" % torch.__version__)
    if CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "include",
                                                            "cuda_runtime_api.h")):
        missing.append("no CUDA toolkit found (set CUDA_HOME)")
    if libshoal_cuda() is False:
        missing.append("libshoal was built without CUDA (shoal_info -b)")
    if missing and mode in ("1", "yes", "on", "true"):
        sys.exit("shoal-torch: SHOAL_TORCH_CUDA=%s, but %s" % (mode, "; ".join(missing)))
    if missing:
        return False, "; ".join(missing)
    return True, "torch CUDA %s, toolkit in %s" % (torch.version.cuda, CUDA_HOME)


include_dirs = [f[2:] for f in pkg_config("--cflags-only-I")]
library_dirs = [f[2:] for f in pkg_config("--libs-only-L")]
libraries = [f[2:] for f in pkg_config("--libs-only-l")]

cuda, why = want_cuda()
print("shoal-torch: building %s (%s)" % ("with CUDA tensors" if cuda else "for CPU tensors only",
                                         why), file=sys.stderr)
ext_args = dict(
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    libraries=libraries,
    # find libshoal where pkg-config found it, without LD_LIBRARY_PATH
    extra_link_args=["-Wl,-rpath," + d for d in library_dirs],
    extra_compile_args=["-O2"] + (["-DSHOAL_TORCH_CUDA=1"] if cuda else []),
)
if cuda:
    extension = CUDAExtension("shoal_torch._C", ["csrc/shoal_backend.cpp"], **ext_args)
else:
    extension = CppExtension("shoal_torch._C", ["csrc/shoal_backend.cpp"], **ext_args)

setup(
    name="shoal-torch",
    version="0.1.0",
    description="shoal as a torch.distributed backend",
    packages=["shoal_torch"],
    py_modules=["shoal_torch_autoload"],
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension},
    entry_points={"torch.backends": ["shoal = shoal_torch_autoload:load"]},
    python_requires=">=3.9",
)
