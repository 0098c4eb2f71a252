"""The operators of :class:`~pyw8a8.torch.Int8Cache`: its layers' keys and values go into
pyw8a8's int8 KV store (:class:`pyw8a8.attention.Int8KVCache`, a batch row's KV heads as
its heads) and its attention runs on pyw8a8's attention core (``_simd/kv_attention.h``),
the store and core numpy's :func:`pyw8a8.attention.int8_attention` runs on.

* ``pyw8a8::kv_append(handle, key_states, value_states) -> receipt``: quantizes a layer's
  new keys (rotated) and values into the store.  The receipt, int64 (cache, layer, tokens
  before, new tokens), is what the layer's ``update`` gives the attention.
* ``pyw8a8::kv_attention(query, receipt, mask, scaling, softcap) -> out``: the attention
  of the layer's queries over what the store holds once the receipt's append is in.  A
  mask it cannot read is refused and the append undone: the store is as it was.

Both run opaque to ``torch.compile`` (their fake implementations give the shapes), so a
compiled model keeps one graph; the attention consumes the receipt, which orders the two.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Optional

import numpy as np
import torch

from ..attention.attend import attend_layer
from ..rotation import MAX_BLOCK, MIN_BLOCK

#: The caches the operators serve, by the id in their handles.
_CACHES: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_IDS = itertools.count(1)


def rotation_block(head_dim: int) -> int:
    """The rotation block for `head_dim` features: the largest power of two that divides
    it (head_dim itself when it is one), at most 4096; 0 (no rotation) when that is below
    16, the smallest block :func:`pyw8a8.rotate` takes."""
    block = min(head_dim & -head_dim, MAX_BLOCK)
    return block if block >= MIN_BLOCK else 0


def register(cache) -> int:
    """An id for `cache` (an Int8Cache), by which the operators find it."""
    cache_id = next(_IDS)
    _CACHES[cache_id] = cache
    return cache_id


def _cache(cache_id: int):
    cache = _CACHES.get(cache_id)
    if cache is None:
        raise RuntimeError(f"the Int8Cache of this handle ({cache_id}) no longer exists")
    return cache


@torch.library.custom_op("pyw8a8::kv_append", mutates_args=())
def kv_append(handle: torch.Tensor, key_states: torch.Tensor,
              value_states: torch.Tensor) -> torch.Tensor:
    """Append a layer's new keys and values (batch, KV heads, tokens, head_dim) to the store
    of the cache `handle` names (int64: cache, layer); returns the receipt."""
    cache_id, layer = handle.tolist()
    return _cache(cache_id).append_states(layer, key_states, value_states)


@kv_append.register_fake
def _(handle, key_states, value_states):
    return handle.new_empty(4)


@torch.library.custom_op("pyw8a8::kv_attention", mutates_args=())
def kv_attention(query: torch.Tensor, receipt: torch.Tensor, mask: Optional[torch.Tensor],
                 scaling: float, softcap: float) -> torch.Tensor:
    """The attention of query (batch, query heads, queries, head_dim) over the layer the
    receipt names: (batch, queries, query heads, head_dim), in query's dtype."""
    cache_id, layer, before, new = receipt.tolist()
    return attend(_cache(cache_id).store, layer, before, new, query, mask, scaling, softcap)


@kv_attention.register_fake
def _(query, receipt, mask, scaling, softcap):
    batch, heads, queries, head_dim = query.shape
    return query.new_empty((batch, queries, heads, head_dim))


def mask_array(mask: Optional[torch.Tensor], batch: int, heads: int, queries: int,
               held: int) -> Optional[np.ndarray]:
    """The model's mask (batch, 1 or heads, queries, columns: the last columns positions
    the layer holds), bool or additive float, as the core reads it: a numpy view (or a
    float32 copy); ValueError or TypeError naming attention_mask if it is none of these."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a tensor or None, got {type(mask).__name__}")
    if mask.dim() != 4 or mask.shape[0] not in (1, batch) or mask.shape[1] not in (1, heads) \
            or mask.shape[2] != queries or not 1 <= mask.shape[3] <= held:
        raise ValueError(f"attention_mask must be (batch={batch}, 1 or {heads} heads, "
                         f"{queries} queries, at most the {held} tokens the layer holds), "
                         f"got shape {tuple(mask.shape)}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(f"attention_mask must be bool or floating, got {mask.dtype}")
    if mask.dtype not in (torch.bool, torch.float32) or mask.stride(3) != 1:
        mask = mask.to(torch.float32 if mask.dtype != torch.bool else torch.bool,
                       memory_format=torch.contiguous_format)
    if mask.shape[0] != batch:
        mask = mask.expand(batch, -1, -1, -1)
    return mask.detach().numpy()


def attend(store, layer: int, before: int, new: int, query: torch.Tensor,
           mask: Optional[torch.Tensor], scaling: float, softcap: float) -> torch.Tensor:
    """kv_attention's arithmetic on `store` (an Int8KVCache whose heads are batch rows' KV
    heads), the layer's last `new` positions from `before` appended already; on a bad
    mask the append is undone."""
    batch, heads, queries, head_dim = query.shape
    kv_heads = store.n_kv_heads // batch
    end = before + new
    held = store.held(layer)
    try:
        array = mask_array(mask, batch, heads, queries, end - held.start)
    except (TypeError, ValueError):
        store._truncate(layer, before)
        raise
    rows = (query.detach().to(torch.float32) * scaling).reshape(
        batch * kv_heads, heads // kv_heads, queries, head_dim).contiguous().numpy()
    rows = store.rotated(rows, store.rotate_keys)
    out = torch.empty((batch, queries, heads, head_dim), dtype=torch.float32)
    attend_layer(store, layer, rows, end - queries, out.numpy(), mask=array,
                 mask_start=0 if array is None else end - array.shape[3],
                 softcap=softcap, kv_per_batch=kv_heads, name="query")
    return out if query.dtype == torch.float32 else out.to(query.dtype)
