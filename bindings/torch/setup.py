# Builds shoal's torch.distributed backend against the installed libshoal (pkg-config shoal).
#   pip install --no-build-isolation ./bindings/torch
# --no-build-isolation builds against the torch already installed (the extension must match it
# exactly; an isolated build would download another torch). PKG_CONFIG names the pkg-config
# command (e.g. "pkg-config --define-prefix" for a DESTDIR-staged install); PKG_CONFIG_PATH
# finds shoal.pc outside the default search path.
import os
import shlex
import subprocess
import sys

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
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


include_dirs = [f[2:] for f in pkg_config("--cflags-only-I")]
library_dirs = [f[2:] for f in pkg_config("--libs-only-L")]
libraries = [f[2:] for f in pkg_config("--libs-only-l")]

setup(
    name="shoal-torch",
    version="0.1.0",
    description="shoal as a torch.distributed backend",
    packages=["shoal_torch"],
    py_modules=["shoal_torch_autoload"],
    ext_modules=[
        CppExtension(
            "shoal_torch._C",
            ["csrc/shoal_backend.cpp"],
            include_dirs=include_dirs,
            library_dirs=library_dirs,
            libraries=libraries,
            # find libshoal where pkg-config found it, without LD_LIBRARY_PATH
            extra_link_args=["-Wl,-rpath," + d for d in library_dirs],
            extra_compile_args=["-O2"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    entry_points={"torch.backends": ["shoal = shoal_torch_autoload:load"]},
    python_requires=">=3.9",
)
