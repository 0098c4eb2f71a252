"""int8 attention: an int8 KV cache and exact int8 x int8 attention on pyw8a8's kernels.

`Int8KVCache` holds every layer's keys and values as int8 with one float32 scale per token
and KV head (keys rotated by pyw8a8's block randomized Hadamard transform by default), in
pages packed once; `int8_attention` appends a step's keys and values and attends its
queries, both products (``q . K`` and ``P . V``) exact integer sums::

    cache = Int8KVCache([None, 512], n_kv_heads=1, head_dim=256)
    out = int8_attention(cache, 0, q * scale, k, v)   # (n, n_heads, head_dim) float32

One module per job: `cache` (the cache and its quantization), `attend` (the attention),
``_pages`` (the paged storage) and ``_exact`` (the integer products).
"""
from .attend import int8_attention
from .cache import Int8KVCache

__all__ = ["Int8KVCache", "int8_attention"]
