"""The arithmetic of :class:`~pyw8a8.torch.Int8Cache`: int8 rows, the key rotation and the
int8 attention over the cached keys and values.

Quantization is pyw8a8's activation scheme, by pyw8a8's own row quantizer (the one
:func:`pyw8a8.matmul` runs): per row (one token of one head) a float32 scale
``max|x| / 127`` and ``round(x / scale)`` in [-127, 127].  Keys (after RoPE) and the
queries that meet them are rotated first, fused with their quantization, by the block
randomized Walsh-Hadamard transform of :func:`pyw8a8.rotate` (orthonormal, so ``q . k``
is unchanged in exact arithmetic); values are not.

The attention works in a transposed layout, tokens along rows: per batch row and KV head,
``S^T = K8 @ Q8^T`` (int8 x int8, exact int32 sums; the query heads of a group of GQA are
columns of ``Q8^T``, so K is never repeated), then the scales, softcapping and the mask,
a float32 softmax down the columns, V's per-token scale folded into each column of P,
each column quantized (``scale = max / 127``; with "int8x2" its rounding error too, as
more columns), and ``O^T = V8^T @ P8^T`` exact in int32.
Both products are ``torch._int_mm`` with the long operand (the cached tokens) on the left,
the layout in which it is fastest for the few query columns of a decode step; every
operand is laid out anew (standard strides), as ``_int_mm`` needs on AMX CPUs.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from .. import quantize as _quantize
from .._layout import W8_KPAD, padded
from ..rotation import MAX_BLOCK, MIN_BLOCK

#: The attribute of the int8 keys an Int8Cache returns that holds their `QuantizedKV`.
MARK = "_pyw8a8_quantized_kv"
#: The largest magnitude of a quantized value (symmetric int8).
QMAX = 127
#: The int32 sums of P.V stay exact while 127 * 127 * tokens < 2**31.
MAX_TOKENS = (2**31 - 1) // (QMAX * QMAX)
#: How the attention quantizes each query's probabilities (V's scales folded in) for P.V:
#: "int8", one int8 row, scale max / 127; "int8x2", that row and its rounding error as a
#: second int8 row in steps of 1/254 of the first's (about 15 bits; twice the columns of
#: the same product).
PROBABILITIES = ("int8", "int8x2")
# The float scores of one chunk of queries (all heads): 16 MiB, so a long prefill does
# not hold a (queries x tokens) matrix per head at once.
_CHUNK_ELEMENTS = 1 << 22


class QuantizedKV(NamedTuple):
    """The cached tokens an attention call reads, besides the int8 keys themselves.

    ``key_scales`` and ``value_scales``: float32 (batch, kv_heads, tokens); ``values_t``:
    int8 (batch, kv_heads, head_dim, tokens), the values transposed; ``block`` and
    ``seed``: the keys' rotation (block 0: not rotated); ``probabilities``: how P.V
    quantizes P (`PROBABILITIES`)."""

    key_scales: torch.Tensor
    values_t: torch.Tensor
    value_scales: torch.Tensor
    block: int
    seed: int
    probabilities: str


def rotation_block(head_dim: int) -> int:
    """The rotation block for `head_dim` features: the largest power of two that divides
    it (head_dim itself when it is one), at most 4096; 0 (no rotation) when that is below
    16, the smallest block :func:`pyw8a8.rotate` takes."""
    block = min(head_dim & -head_dim, MAX_BLOCK)
    return block if block >= MIN_BLOCK else 0


def quantize_rows(x: torch.Tensor, block: int = 0, seed: int = 0,
                  name: str = "x") -> tuple[torch.Tensor, torch.Tensor]:
    """int8 rows of float `x` (..., n), rotated first where `block` (pyw8a8's row
    quantizer, rotation fused), and their float32 scales (...); ``x ~= q * scale`` (an
    all-zero row: scale 0).  A row holding Inf or NaN raises a ValueError naming `name`."""
    shape = x.shape
    rows = x.detach().reshape(-1, shape[-1]).to(torch.float32).contiguous()
    width = padded(shape[-1], W8_KPAD)
    q, scales, _ = _quantize.quantize_rows(rows.numpy(), width, name=name, shape=shape,
                                           block=block, seed=seed)
    q8 = torch.from_numpy(q[:rows.shape[0], :shape[-1]].view(np.int8))
    return q8.reshape(shape), torch.from_numpy(scales).reshape(shape[:-1])


def _laid_out(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` converted to `dtype` in fresh memory of standard strides."""
    return torch.empty(x.shape, dtype=dtype).copy_(x)


def int8_products(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Exact ``left[b, h] @ right[b, h]`` for int8 (B, H, M, K) and (B, H, K, N): int32
    (B, H, M, N), one ``torch._int_mm`` per (b, h)."""
    batch, heads, m, _ = left.shape
    out = torch.empty((batch, heads, m, right.shape[-1]), dtype=torch.int32)
    for a, b, c in zip(left.flatten(0, 1).unbind(), right.flatten(0, 1).unbind(),
                       out.flatten(0, 1).unbind()):
        torch._int_mm(a, b, out=c)
    return out


def _mask_columns(mask: torch.Tensor, heads: int, groups: int, queries: int,
                  tokens: int) -> torch.Tensor:
    """The model's mask (batch, 1 or query heads, queries, >= tokens) as (batch, 1 or
    heads, tokens, 1 or groups, queries): a view of the scores' transposed layout."""
    if mask.dim() != 4 or mask.shape[-2] != queries or mask.shape[-1] < tokens:
        raise ValueError(f"attention_mask must be (batch, heads, {queries}, {tokens}), got "
                         f"shape {tuple(mask.shape)}")
    mask = mask[..., :tokens]
    if mask.shape[1] == 1:
        return mask.transpose(-1, -2).unsqueeze(3)
    if mask.shape[1] != heads * groups:
        raise ValueError(f"attention_mask has {mask.shape[1]} heads; expected 1 or "
                         f"{heads * groups}")
    return mask.reshape(mask.shape[0], heads, groups, queries, tokens).permute(0, 1, 4, 2, 3)


def attend(query: torch.Tensor, keys: torch.Tensor, cached: QuantizedKV,
           mask: Optional[torch.Tensor], scaling: float,
           softcap: Optional[float]) -> torch.Tensor:
    """Attention of float `query` (B, Hq, Q, d) over the int8 `keys` (B, H, T, d) and
    `cached`; `mask` as transformers' mask functions give it (bool, True where a query
    sees a token, or additive float; None: causal, the last query seeing every token).

    Returns the output as transformers' attention functions do: (B, Q, Hq, d), in
    `query`'s dtype."""
    batch, query_heads, queries, head_dim = query.shape
    heads, tokens = keys.shape[1], keys.shape[2]
    groups = query_heads // heads
    q8, q_scales = quantize_rows(query, cached.block, cached.seed, name="query")
    q8 = q8.view(batch, heads, groups, queries, head_dim)
    q_scales = (q_scales * scaling).view(batch, heads, groups, queries)
    columns = None if mask is None else _mask_columns(mask, heads, groups, queries, tokens)
    out = torch.empty((batch, queries, heads, groups, head_dim), dtype=torch.float32)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * tokens * groups))
    for i0 in range(0, queries, chunk):
        i1 = min(queries, i0 + chunk)
        width = groups * (i1 - i0)
        # causal (no mask): the chunk's last query sees the first `seen` tokens, no more
        seen = tokens if columns is not None else tokens - queries + i1
        queries_t = _laid_out(q8[:, :, :, i0:i1].permute(0, 1, 4, 2, 3).reshape(
            batch, heads, head_dim, width), torch.int8)
        scores = int8_products(keys[:, :, :seen], queries_t).float()
        scores.mul_(cached.key_scales[:, :, :seen].unsqueeze(-1))
        scores.mul_(q_scales[:, :, :, i0:i1].reshape(batch, heads, 1, width))
        if softcap is not None:
            scores = torch.tanh(scores / softcap).mul_(softcap)
        grid = scores.view(batch, heads, seen, groups, i1 - i0)
        if columns is not None:
            part = columns[..., i0:i1]
            if part.dtype == torch.bool:
                grid.masked_fill_(~part, float("-inf"))
            else:
                grid.add_(part)
        elif i1 - i0 > 1:  # causal, aligned to the last token
            visible = torch.arange(seen).unsqueeze(1) <= \
                torch.arange(tokens - queries + i0, tokens - queries + i1).unsqueeze(0)
            grid.masked_fill_(~visible.unsqueeze(1), float("-inf"))
        probs = torch.softmax(scores, dim=2)
        if columns is not None and columns.dtype == torch.bool:
            probs.nan_to_num_(0.0)  # a query that sees no token (padding) gets zeros
        o = _weighted_values(probs, cached, seen, width)
        out[:, i0:i1] = o.view(batch, heads, head_dim, groups, i1 - i0).permute(0, 4, 1, 3, 2)
    return out.view(batch, queries, query_heads, head_dim).to(query.dtype)


def _weighted_values(probs: torch.Tensor, cached: QuantizedKV, seen: int,
                     width: int) -> torch.Tensor:
    """``O^T = V8^T @ P8^T`` of the probabilities `probs` (B, H, seen, width), float32
    (B, H, head_dim, width); `probs` is overwritten."""
    probs.mul_(cached.value_scales[:, :, :seen].unsqueeze(-1))
    # each query's column of P to int8, scale max / 127 (P >= 0; a column of zeros,
    # a query that sees nothing, stays zeros)
    p_scales = probs.amax(dim=2, keepdim=True).div_(QMAX)
    probs.div_(p_scales.clamp(min=torch.finfo(torch.float32).tiny))
    high = torch.round(probs)
    if cached.probabilities == "int8x2":
        # the rounding error, within half a step, in steps of 1/254 of one: more
        # columns of the same product, (T, 2 x width)
        low = probs.sub_(high).mul_(2 * QMAX).round_()
        high = torch.cat([high, low], dim=-1)
    sums = int8_products(cached.values_t[..., :seen], _laid_out(high, torch.int8)).float()
    o = sums[..., :width].mul_(p_scales)
    if cached.probabilities == "int8x2":
        o.add_(sums[..., width:].mul_(p_scales / (2 * QMAX)))
    return o
