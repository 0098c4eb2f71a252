"""`int8_attention`: causal (optionally sliding-window) attention of new queries over an
`Int8KVCache`, both of its products exact int8 x int8 sums on pyw8a8's kernels.

Per KV head and block of queries:

1. scores: the query rows (rotated as the keys are when ``cache.rotate_keys``) split into
   ``cache.query_terms`` int8 terms, times the int8 keys page by page, exact int32 sums,
   then scaled by the query and key scales;
2. a float32 softmax of each row;
3. values: each probability times its value's scale, the row split into
   ``cache.probability_terms`` int8 terms, times the int8 values page by page, exact sums,
   scaled by the row's step (and rotated back when ``cache.rotate_values``).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .. import _attention, _cpu, _threads
from .._validation import float_array
from ._exact import LO_STEPS
from .cache import Int8KVCache

__all__ = ["int8_attention"]


def int8_attention(cache: Int8KVCache, layer: int, q: npt.ArrayLike, k: npt.ArrayLike,
                   v: npt.ArrayLike, *, block_rows: int = 64) -> npt.NDArray[np.float32]:
    """Append the new tokens' keys and values to `cache` and attend their queries.

    The new tokens take positions ``cache.length .. cache.length + n - 1`` of `layer`.
    Query i sees the keys at positions up to its own (causal) and, on a sliding-window
    layer, not before ``position - window + 1``: the masked scores are -inf exactly where
    a float model's are.  Both products are exact int8 sums over the cache's pages, the
    queries and the probabilities each split into int8 terms (see the module).

    Parameters
    ----------
    cache : Int8KVCache
        Updated in place: `k` and `v` are appended to `layer`.
    layer : int
    q : array_like of float32 or float64, shape (n, n_heads, head_dim)
        The new queries after norm and RoPE, already multiplied by the attention scale;
        ``n_heads`` a multiple of ``cache.n_kv_heads`` (query head h reads KV head
        ``h // (n_heads // n_kv_heads)``).
    k, v : array_like of float32 or float64, shape (n, n_kv_heads, head_dim)
        The new keys (after norm and RoPE) and values.
    block_rows : int
        Queries per block: bounds the scores held at once and skips the keys after the
        block's last query.

    Returns
    -------
    ndarray of float32, shape (n, n_heads, head_dim)

    Raises
    ------
    TypeError
        If `cache` is not an `Int8KVCache` or an array is not float32/float64.
    ValueError
        If a shape does not fit the cache or the others (the message names the argument),
        `layer` is out of range, or an input holds NaN or Inf.
    """
    queries = _checked(cache, q, k, v, block_rows)
    n, n_kv, d = queries.shape[0], cache.n_kv_heads, cache.head_dim
    pages = cache._pages(layer)
    start = pages.length
    cache._append(layer, k, v, ("k", "v"))
    group = queries.shape[1] // n_kv
    # (n_kv, group, n, head_dim): the query heads of each KV head
    heads = queries.transpose(1, 0, 2).reshape(n_kv, group, n, d)
    heads = cache.rotated(np.ascontiguousarray(heads, np.float32), cache.rotate_keys)
    out = np.empty((1, n, n_kv * group, d), np.float32)
    attend_layer(cache, layer, heads, start, out, block_rows=int(block_rows))
    out = out[0]
    if cache.rotate_values:
        out = cache.unrotated(out)
    return out


def attend_layer(cache, layer, heads, start, out, *, block_rows=64, mask=None,
                 mask_start=0, softcap=0.0, kv_per_batch=None, name="q"):
    """The attention of query rows over `layer`'s held tokens, appended already: heads
    (streams, group, nq, head_dim) float32 C-contiguous, rotated as the keys and scaled,
    query i at position ``start + i``; out (batch, nq, heads, head_dim) float32, streams
    = batch * kv_per_batch (default: one batch row).  mask (batch, 1 or heads, nq,
    columns), bool or float32, column c at position ``mask_start + c``; None: causal (and
    the layer's window).  A query row holding NaN or Inf raises ValueError naming
    `name`."""
    pages = cache._pages(layer)
    n = heads.shape[2]
    if mask is not None:  # the mask's columns, whatever the positions of the queries
        lo, hi = mask_start, pages.length
    else:
        lo = 0 if pages.window is None else max(0, start - pages.window + 1)
        hi = start + n
    span, last = pages.seen(lo, hi)
    rows = cache.query_terms * heads.shape[1] * min(n, block_rows)
    tokens = span.count + (last.count if last is not None else 0)
    bad = _attention.kv_attention(
        _cpu.active_ops(rows).address, _threads.threads_for(heads.size * tokens), heads, start,
        cache.query_terms, cache.probability_terms, LO_STEPS, span, last,
        0 if pages.window is None else pages.window, softcap, mask, mask_start,
        kv_per_batch or heads.shape[0], out, block_rows)
    pages.trim()
    if bad:
        raise ValueError(f"{name} holds NaN or Inf")


def _checked(cache, q, k, v, block_rows):
    """`int8_attention`'s arguments checked: q as a float array (n, n_heads, head_dim)."""
    if not isinstance(cache, Int8KVCache):
        raise TypeError(f"cache must be an Int8KVCache, got {type(cache).__name__}")
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) or (
            block_rows < 1):
        raise ValueError(f"block_rows must be a positive int, got {block_rows!r}")
    queries = float_array(q, "q")
    n_kv, d = cache.n_kv_heads, cache.head_dim
    if queries.ndim != 3 or queries.shape[2] != d or queries.shape[1] % n_kv:
        raise ValueError(f"q must have shape (n, n_heads, head_dim={d}) with n_heads a "
                         f"multiple of n_kv_heads={n_kv}, got {queries.shape}")
    if not np.all(np.isfinite(queries)):
        raise ValueError("q holds NaN or Inf")
    n = queries.shape[0]
    for name, arr in (("k", k), ("v", v)):
        shape = np.shape(arr)
        if len(shape) != 3 or shape[0] != n:
            raise ValueError(f"{name} must have shape (n={n}, n_kv_heads={n_kv}, "
                             f"head_dim={d}) to match q, got {shape}")
    return queries
