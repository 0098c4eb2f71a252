"""Build the compiled core of pyw8a8.

One Cython extension per responsibility, all compiled for the baseline of the target
architecture: every ISA is compiled with per-function target attributes
inside the C headers of ``pyw8a8/_simd`` and chosen at run time, so the binary is
portable: no flag ties it to the build machine's CPU.

Environment variables:
    PYW8A8_SANITIZE=1   build with AddressSanitizer and UndefinedBehaviorSanitizer
                        (used by ``make sanitize``; run with the sanitizer runtime preloaded).
    PYW8A8_NO_OPENMP=1  build without OpenMP (single-threaded).
"""
import glob
import json
import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup


def _compile_flags():
    """(compile, link) flags from pyw8a8/_simd/build_flags.json, the one place they are set."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyw8a8", "_simd",
                           "build_flags.json")) as f:
        spec = json.load(f)
    if sys.platform == "win32":
        return spec["msvc"], []
    flags, link = list(spec["cflags"]), []
    if os.environ.get("PYW8A8_NO_OPENMP") != "1":
        flags += spec["openmp"]
        link += spec["openmp"]
    if os.environ.get("PYW8A8_SANITIZE") == "1":
        san = [f for f in spec["sanitize"] if f.startswith("-f")]
        flags = [f for f in flags if not f.startswith("-O")] + spec["sanitize"]
        link += san
    return flags, link


compile_args, link_args = _compile_flags()
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
extensions = [
    Extension(
        name,
        [f"pyw8a8/{name.split('.')[-1]}.pyx"],
        include_dirs=[np.get_include(), "pyw8a8"],
        # The C core is headers only: an edit to any of them rebuilds every module (without
        # this, build_ext --inplace would keep a module compiled from the old headers).
        depends=sorted(glob.glob("pyw8a8/_simd/*.h") + glob.glob("pyw8a8/*.pxd")),
        define_macros=macros,
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    for name in ("pyw8a8._dispatch", "pyw8a8._kernels", "pyw8a8._outputs", "pyw8a8._rows",
                 "pyw8a8._attention", "pyw8a8._probes")
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
)
