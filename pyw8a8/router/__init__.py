"""W8A8 in any numpy model: route each weight matmul to int8 kernels or keep it float.

A numpy model that builds its weight matmuls through a factory
``linear(name, w) -> layer`` (``layer(x)`` maps float32 ``(M, K)`` to
``(M, N)``) can run in W8A8 by passing a `Router` as that factory::

    from pyw8a8.router import Router, RouterConfig
    router = Router(RouterConfig(rotate=True, block=128))
    model = Gemma3(weights, linear=router)   # router.pair handles gate/up

The router decides per tensor (by name and shape) whether the matmul uses W8A8
(`Int8Linear`) or stays float (`FloatLinear`); a gated linear unit's gate and up
projections (``router.pair``) become one `Int8GatedLinear` when both go W8A8.  W8A8
layers pack their weight lazily, on first use, and then drop the float reference: the
packed int8 weight replaces the float one.  ``RouterConfig.from_env()`` reads the same
settings from ``PYW8A8_*`` environment variables.

One module per job: `config` (the settings and the environment), `cache` (the
packed-weight LRU cache), `selection` (which layers go W8A8, the rule
``pyw8a8.torch.quantize`` shares), `layers` (the layers and the kernel backend), `ffn`
(FFN groups for data-free scaling), `routing` (the router) and `packed_file` (saving and
loading packed weights).
"""

import warnings

from .cache import WeightCache, default_cache
from .config import RouterConfig
from .layers import FloatLinear, Int8GatedLinear, Int8Linear, SeparatePair, float_linear
from .packed_file import PACKED_FORMAT_VERSION, load_packed, save_packed
from .routing import Router

__all__ = [
    "RouterConfig",
    "Router",
    "Int8Linear",
    "Int8GatedLinear",
    "FloatLinear",
    "SeparatePair",
    "float_linear",
    "WeightCache",
    "default_cache",
    "save_packed",
    "load_packed",
    "PACKED_FORMAT_VERSION",
]

# Former names, kept for old code: the router's layers are named apart from
# pyw8a8.torch.Linear, and the gate/up layer after the gated unit it computes.
_RENAMED = {"Linear": "Int8Linear", "LinearPair": "Int8GatedLinear"}


def __getattr__(name):
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"pyw8a8.router.{name} is deprecated, use pyw8a8.router.{new}",
                      DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
