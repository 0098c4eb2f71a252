"""pyw8a8 for PyTorch models: a W8A8 ``nn.Linear``, the gated unit, and `quantize`.

``import pyw8a8.torch`` imports torch (``pip install ".[torch]"`` in the pyw8a8
checkout); ``import pyw8a8`` never does.  The layers are inference-only CPU modules
whose products are :func:`pyw8a8.matmul` and :func:`pyw8a8.matmul_pair`, bit for bit,
through the operators ``torch.ops.pyw8a8.linear`` and ``torch.ops.pyw8a8.gated_linear``
(C++ kernels, built for the installed torch on first import), eager, under
``torch.compile`` and from ``torch.export`` or AOTInductor.  For transformers models,
:class:`Int8Cache`, an int8 KV cache, and the int8 attention that reads it
(:func:`enable_int8_attention`, which `quantize` applies).

Examples
--------
>>> import torch, pyw8a8.torch
>>> model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(),
...                             torch.nn.Linear(512, 128))
>>> q = pyw8a8.torch.quantize(model)
>>> with torch.inference_mode():
...     y = q(torch.randn(2, 128))
>>> y.shape
torch.Size([2, 128])
"""
try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised where torch is absent
    raise ImportError("pyw8a8.torch needs PyTorch: pip install \".[torch]\" in the pyw8a8 "
                      "checkout (torch's CPU build first: pip install torch --index-url "
                      "https://download.pytorch.org/whl/cpu)") from exc

import importlib
import sys

from . import (
    _native,  # noqa: F401  (registers their CPU kernels)
    _on_import,
    _ops,  # noqa: F401  (defines torch.ops.pyw8a8.*)
)
from .attention import enable_int8_attention
from .convert import Decision, QuantizeReport, quantize
from .modules import GatedLinear, Linear

__all__ = ["Decision", "GatedLinear", "Int8Cache", "Linear", "QuantizeReport", "W8A8Config",
           "enable_int8_attention", "quantize"]

# A saved int8 checkpoint loads by from_pretrained after `import pyw8a8.torch` alone.
_on_import.register_with_transformers()

if "transformers.modeling_utils" in sys.modules:
    # A pickled quantized model names pyw8a8's attention implementation in its config:
    # unpickling imports transformers, then this package (for the layers).
    from .attention import register as _register
    _register()


#: The names that import transformers, which `import pyw8a8.torch` does not need, and
#: their modules.
_WITH_TRANSFORMERS = {"Int8Cache": "kv_cache", "W8A8Config": "hf"}


def __getattr__(name):
    if name in _WITH_TRANSFORMERS:
        try:
            module = importlib.import_module(f"{__name__}.{_WITH_TRANSFORMERS[name]}")
        except ImportError as exc:
            raise ImportError(f"pyw8a8.torch.{name} needs transformers ({exc}): pip "
                              f"install transformers") from exc
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
