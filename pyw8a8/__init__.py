"""pyw8a8: fast, faithful W8A8 matrix multiplication for numpy on CPUs.

int8 weights (one scale per output channel, packed once) times int8 activations (one scale
per token, quantized per call), exact int32 accumulation, float output; by default with a
block randomized Walsh-Hadamard rotation that spreads outliers before quantizing.
"""
import importlib
import sys
from typing import TYPE_CHECKING

from . import _thread_policy

try:  # the PYW8A8_* settings are read here; a bad one raises ValueError (or RuntimeError)
    with _thread_policy.openmp_wait_policy():
        from . import _dispatch  # noqa: F401  (loads libgomp, which reads its spin count now)
    from . import _cpu, _threads  # noqa: F401  (PYW8A8_ISA, PYW8A8_*_MIN_ROWS, OMP_NUM_THREADS)
except (ValueError, RuntimeError) as error:
    # `python -m pyw8a8 ...` imports the package before its __main__ (sys.argv[0] is "-m"
    # until then): no caller can catch the error, so report it as the command line does.
    if sys.argv[:1] != ["-m"]:
        raise
    print(f"pyw8a8: {error}", file=sys.stderr)
    raise SystemExit(2) from None

from ._cpu import available_isas, compiled_isas, cpu_features, isa, set_isa, use_isa
from ._thread_policy import thread_policy
from ._threads import get_num_threads, set_num_threads
from .matmul import int8_matmul, matmul, matmul_pair
from .packing import PackedWeight, pack_quantized, pack_weight
from .quantize import quantize_per_channel, quantize_per_token
from .rotation import fwht, rotate, unrotate
from .scaling import equalize_ffn, smooth

_thread_policy.share_blas_cores()  # numpy's BLAS is loaded by now

__version__ = "0.2.0"  # the one place the version is set (pyproject.toml reads it)

# Subpackages load on first access (``pyw8a8.router`` works after ``import pyw8a8``), so
# the import stays as cheap as the API: pyw8a8.dask imports dask, pyw8a8.torch torch, the
# evaluation its model and reports. ``metrics`` is the evaluation's metrics module.
_SUBMODULES = {"attention": "attention", "dask": "dask", "evaluate": "evaluate",
               "metrics": "evaluate.metrics",
               "models": "models", "router": "router", "tools": "tools", "torch": "torch"}


if TYPE_CHECKING:  # loaded on first access (below); typed as what they are
    from .router.packed_file import load_packed, save_packed

# Functions of a subpackage that belong to the API, loaded with it on first access.
_LAZY_FUNCTIONS = {"save_packed": "router.packed_file", "load_packed": "router.packed_file"}


def __getattr__(name):
    if name in _LAZY_FUNCTIONS:
        value = getattr(importlib.import_module(f".{_LAZY_FUNCTIONS[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    else:
        raise AttributeError(f"module 'pyw8a8' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    # The API and the subpackages, not the modules this file imports to build them.
    return sorted(set(__all__) | set(_SUBMODULES) | {"__version__"})

__all__ = [
    "PackedWeight",
    "available_isas",
    "compiled_isas",
    "cpu_features",
    "equalize_ffn",
    "fwht",
    "get_num_threads",
    "int8_matmul",
    "isa",
    "load_packed",
    "matmul",
    "matmul_pair",
    "pack_quantized",
    "pack_weight",
    "quantize_per_channel",
    "quantize_per_token",
    "rotate",
    "save_packed",
    "set_isa",
    "set_num_threads",
    "smooth",
    "thread_policy",
    "unrotate",
    "use_isa",
]
