"""The native operator: the C++ CPU kernels of ``torch.ops.pyw8a8.linear`` and
``gated_linear`` (``csrc/pyw8a8_ops.cpp``), bound to the core's call object
(``pyw8a8._kernels.CALL_API``, ``_simd/call.h``).

Torch's C++ ABI changes between releases and the core wheel must not depend on one, so
the operator is built for the installed torch (``torch.utils.cpp_extension``; a C++
compiler, which ``torch.compile`` on a CPU needs anyway) once per source and torch
version, into ``$PYW8A8_CACHE_DIR`` (default ``~/.cache/pyw8a8``), saying so on stderr:
about 40 s on 2 cores; ``python -m pyw8a8.torch.build`` builds it ahead of time.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import torch

from .. import _kernels
from . import _ops  # noqa: F401  (the operators' schemas, before their kernels)

ENV_CACHE = "PYW8A8_CACHE_DIR"
_SOURCE = Path(__file__).parent / "csrc" / "pyw8a8_ops.cpp"
_INCLUDE = Path(__file__).parent.parent / "_simd"


def _build_name() -> str:
    """The library's name: its sources' and torch's version digest, so a build serves
    only the torch it was built for."""
    digest = hashlib.sha256()
    for path in (_SOURCE, _INCLUDE / "call.h"):
        digest.update(path.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    return f"pyw8a8_torch_ops_{digest.hexdigest()[:16]}"


def cache_dir() -> Path:
    """Where the built operators are kept, one folder per source and torch version."""
    root = os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache",
                                                     "pyw8a8")
    return Path(root) / "torch_ops"


def _import_built(name: str, directory: Path) -> Optional[ModuleType]:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{name}{suffix}"
        if path.exists():
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


def _build(name: str, directory: Path) -> ModuleType:
    from torch.utils import cpp_extension

    directory.mkdir(parents=True, exist_ok=True)
    print(f"pyw8a8.torch: building its C++ operator for torch {torch.__version__} into "
          f"{directory} (once; about 40 s on 2 cores)...", file=sys.stderr, flush=True)
    start = time.monotonic()
    module = cpp_extension.load(name, sources=[str(_SOURCE)],
                                extra_include_paths=[str(_INCLUDE)],
                                extra_cflags=["-O2"], build_directory=str(directory),
                                verbose=False)
    print(f"pyw8a8.torch: built in {time.monotonic() - start:.0f} s", file=sys.stderr,
          flush=True)
    return module


def load() -> ModuleType:
    """The native operator's module, built if need be, its CPU kernels registered and bound
    to the core.

    Raises
    ------
    ImportError
        If it cannot be built (no C++ compiler, no torch headers) or bound.
    """
    name = _build_name()
    directory = cache_dir() / name
    try:
        module = _import_built(name, directory) or _build(name, directory)
    except Exception as exc:  # a missing compiler, headers, ninja: any build failure
        raise ImportError(f"pyw8a8.torch: its C++ operator could not be built for torch "
                          f"{torch.__version__} ({type(exc).__name__}: {exc}); it needs a "
                          f"C++ compiler, as torch.compile does") from exc
    problem = module.bind(_kernels.CALL_API)
    if problem:
        raise ImportError(f"pyw8a8.torch: its C++ operator does not fit this pyw8a8: "
                          f"{problem}; delete {cache_dir()} to rebuild it")
    return module


#: The native operator's module, its CPU kernels registered.
NATIVE = load()
#: What the eager layers call (a dense CPU tensor, nothing recording a graph, no
#: __torch_function__ mode): the operators, entered from C++ (a leaner crossing from
#: Python than torch.ops', the same dispatch).
eager_linear, eager_gated_linear = NATIVE.linear, NATIVE.gated_linear


def check_input(x: Any, in_features: int) -> None:
    """The operators' check of an input (``csrc``), for a forward whose graph is being
    recorded, where the kernel sees only a fake tensor.

    Raises
    ------
    TypeError
        `x` is not a tensor, is sparse or nested, or is not float32 / bfloat16.
    ValueError
        `x` is not on the CPU, or its last dimension is not `in_features`.
    RuntimeError
        A gradient would be recorded (autograd is on and `x` requires one).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    NATIVE.check_input(x, in_features)
