"""The native operator: the C++ CPU kernels of ``torch.ops.pyw8a8.linear`` and
``gated_linear`` (``csrc/pyw8a8_ops.cpp``), built for the installed torch on first use.

**Why on first use.** The core wheel must not depend on a torch version, and torch's C++
ABI changes between releases, so the operator is compiled against the torch that is
installed, by ``torch.utils.cpp_extension`` (a C++ compiler, which ``torch.compile`` on a
CPU needs anyway), once per source and torch version, into
``$PYW8A8_CACHE_DIR`` (default ``~/.cache/pyw8a8``), about 40 s on 2 cores.  Later
imports load the built library.  ``PYW8A8_TORCH_NATIVE=0`` keeps the Python operator;
where the build fails, the layers keep it too and a warning says why, once.

The operator reaches the product through the core's native interface
(``pyw8a8._kernels.NATIVE_API``, ``_simd/native_api.h``).  A call it cannot take from C
(a weight not seen yet, a shape not settled, an input to check or refuse) comes back to
:func:`python_call`, the Python operator's route.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import torch

from .. import _dispatch, _kernels
from . import _ops

ENV_SWITCH = "PYW8A8_TORCH_NATIVE"
ENV_CACHE = "PYW8A8_CACHE_DIR"
_SOURCE = Path(__file__).parent / "csrc" / "pyw8a8_ops.cpp"
_INCLUDE = Path(__file__).parent.parent / "_simd"


def _build_name() -> str:
    """The library's name: its sources' and torch's version digest, so a build serves
    only the torch it was built for."""
    digest = hashlib.sha256()
    for path in (_SOURCE, _INCLUDE / "native_api.h"):
        digest.update(path.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    return f"pyw8a8_torch_ops_{digest.hexdigest()[:16]}"


def _cache_dir() -> Path:
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
    return cpp_extension.load(name, sources=[str(_SOURCE)],
                              extra_include_paths=[str(_INCLUDE)],
                              extra_cflags=["-O2"], build_directory=str(directory),
                              verbose=False)


def load() -> tuple[Optional[ModuleType], str]:
    """The native operator's module, its CPU kernels registered, and "" ; or None and why
    not (the caller keeps the Python operator)."""
    if os.environ.get(ENV_SWITCH, "1").strip() == "0":
        return None, f"{ENV_SWITCH}=0"
    name = _build_name()
    directory = _cache_dir() / name
    try:
        module = _import_built(name, directory) or _build(name, directory)
    except Exception as exc:  # a missing compiler, headers, ninja: any build failure
        return None, f"it could not be built ({type(exc).__name__}: {exc})"
    problem = module.bind(_kernels.NATIVE_API, dict(_kernels.ACTIVATIONS))
    return (None, problem) if problem else (module, "")


def warn_python_operator(reason: str) -> None:
    warnings.warn(f"pyw8a8.torch: the native operator is off: {reason}; the layers run on "
                  f"the Python operator (a Python call per layer)", RuntimeWarning,
                  stacklevel=2)


def python_call(kind: int, x: Any, tensors: list, biases: list, activation: str,
                generation: Optional[int], nthreads: Optional[int]) -> tuple:
    """A native call's Python route: the Python operator's product (which checks `x` and
    the weights, raises their errors, and tunes the shape), then, where the native side
    placed the call (`generation`, `nthreads`: the settings it saw), what it may run from
    C next time: ((each weight's plan address), blocking) once the shape is settled."""
    weights = [_ops.packed_from(*parts) for parts in tensors]
    if kind == _kernels.CALL_GLU:
        y = _ops.gated_product(x, weights[0], weights[1], biases[0], biases[1], activation)
    else:
        y = _ops.product(x, weights[0], biases[0], activation or None)
    if generation is None or _dispatch.generation() != generation:
        return y, None
    plans = [w._plan for w in weights]
    for plan, parts in zip(plans, tensors):
        # A plan is handed over on the tensors' own sums and scales; its panels may be an
        # aligned copy (PackedWeight.plan), which the native side makes its own.
        if plan is None or _kernels.data_address(plan.scales) != parts[2].data_ptr() or (
                plan.psum.size and _kernels.data_address(plan.psum) != parts[1].data_ptr()):
            return y, None
    m = x.numel() // x.shape[-1]
    blocking = plans[0].settled_blocking(kind, _dispatch.call_ops(m), m, nthreads)
    if blocking is None:
        return y, None
    return y, (tuple(plan.descriptor_address() for plan in plans), blocking)


#: The native operator's module where it loaded (its CPU kernels registered), else None
#: (the Python operator's kernels are registered instead).
NATIVE, _off = load()
if NATIVE is None:
    _ops._LIBRARY.impl("linear", _ops.python_linear, "CPU")
    _ops._LIBRARY.impl("gated_linear", _ops.python_gated_linear, "CPU")
    if not _off.startswith(ENV_SWITCH):
        warn_python_operator(_off)

#: What the eager layers call (a dense CPU tensor, nothing recording a graph, no
#: __torch_function__ mode): the operators, entered from the native module's C++ where it
#: loaded (a leaner crossing from Python than torch.ops', the same dispatch), else their
#: overloads.
if NATIVE is not None:
    eager_linear, eager_gated_linear = NATIVE.linear, NATIVE.gated_linear
else:
    eager_linear = torch.ops.pyw8a8.linear.default
    eager_gated_linear = torch.ops.pyw8a8.gated_linear.default
