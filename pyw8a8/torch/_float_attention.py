"""``torch.ops.pyw8a8.float_attention``: attention over float32 keys and values, fused, on
pyw8a8's kernel (``_simd/float_attention.h``).

It is the attention of an encoder's layers: SDPA's arithmetic in float32, within float32
rounding of it, but the keys a padding mask hides at the ends of a row are skipped instead
of computed and thrown away.  32 sentences padded to 93 tokens (about 20 real ones each),
12 heads of 32: 1.4-1.7 ms against SDPA's 6.4-9.4 ms (AMD Zen 5, 2 threads); in the sentence
encoder of `bench --torch` the attention went from a third of an encode to a fifth.  It is
built for many queries a head: a decoder's one-token step (its keys transposed once a
head for a single query) is SDPA's to run, and transformers' decoders keep SDPA.

The operator returns (batch, query heads, queries, head_dim) laid out as (batch, queries,
query heads, head_dim), the layout transformers' attention functions hand back, so the
transpose that follows is free.  Its fake implementation gives the same strides, so
``torch.compile`` and ``torch.export`` keep it as one call.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .. import _attention, _threads
from . import _runtime
from ._ops import INFERENCE_ONLY

_LIBRARY = torch.library.Library("pyw8a8", "FRAGMENT")
_LIBRARY.define("float_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, "
                "float scale, bool causal) -> Tensor")

#: The dtypes of an additive or boolean mask the operator takes.
MASK_DTYPES = (torch.bool, torch.float32)


def _out(query: torch.Tensor) -> torch.Tensor:
    """An output for `query` (B, Hq, Lq, D): (B, Lq, Hq, D) memory, viewed as (B, Hq, Lq, D)."""
    b, h, n, d = query.shape
    return query.new_empty((b, n, h, d)).transpose(1, 2)


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           mask: Optional[torch.Tensor]) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}; pyw8a8's attention runs on the CPU")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, heads, tokens, head_dim), got shape "
                             f"{tuple(t.shape)}")
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(f"{name} {INFERENCE_ONLY}")
    b, hq, _, d = query.shape
    if key.shape != value.shape or key.shape[0] != b or key.shape[3] != d:
        raise ValueError(f"key and value must be ({b}, kv heads, tokens, {d}) as query "
                         f"{tuple(query.shape)} needs, got {tuple(key.shape)} and "
                         f"{tuple(value.shape)}")
    if key.shape[1] == 0 or hq % key.shape[1]:
        raise ValueError(f"the key's {key.shape[1]} heads must divide the query's {hq}")
    if mask is not None:
        if mask.device.type != "cpu" or mask.dtype not in MASK_DTYPES:
            raise TypeError(f"mask must be a CPU bool or float32 tensor, got {mask.dtype} "
                            f"on {mask.device}")
        target = (b, hq, query.shape[2], key.shape[2])
        try:
            torch.broadcast_shapes(mask.shape, target)
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to "
                             f"(batch, heads, queries, keys) {target}") from None


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def float_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    mask: Optional[torch.Tensor], scale: float, causal: bool) -> torch.Tensor:
    """``softmax(scale * query @ key^T + mask) @ value`` on pyw8a8's kernel.

    Parameters
    ----------
    query : torch.Tensor
        float32 (batch, query heads, queries, head_dim), on the CPU.
    key, value : torch.Tensor
        float32 (batch, kv heads, keys, head_dim); kv heads divides query heads (grouped
        query attention: each KV head serves query heads / kv heads of them).
    mask : torch.Tensor or None
        bool (True where a query sees a key) or additive float32, broadcasting to
        (batch, query heads, queries, keys).
    scale : float
        The scores' factor (``head_dim ** -0.5`` in most models).
    causal : bool
        Query i sees keys 0..i only (besides the mask).

    Returns
    -------
    torch.Tensor
        float32 (batch, query heads, queries, head_dim), its memory laid out as
        (batch, queries, query heads, head_dim).  A query that sees no key gets zeros, as
        SDPA gives it.
    """
    _check(query, key, value, mask)
    _runtime.follow_torch_threads()
    out = _out(query)
    mask_bool = mask_add = None
    if mask is not None:
        m = _unit_last(mask.expand(query.shape[0], query.shape[1], query.shape[2],
                                   key.shape[2]))
        if m.dtype == torch.bool:
            mask_bool = m.numpy().view(np.uint8)
        else:
            mask_add = m.numpy()
    b, h, n, d = query.shape
    _attention.float_attention(_unit_last(query).numpy(), _unit_last(key).numpy(),
                          _unit_last(value).numpy(), mask_bool, mask_add, out.numpy(),
                          float(scale), bool(causal),
                          _threads.threads_for(2 * b * h * n * key.shape[2] * d))
    return out


_LIBRARY.impl("float_attention", float_attention, "CPU")


@torch.library.register_fake("pyw8a8::float_attention")
def _float_attention_fake(query, key, value, mask, scale, causal):
    return _out(query)
