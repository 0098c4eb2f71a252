"""The exact integer halves of int8 attention: float rows split into one or two int8 terms,
and their products with a layer's packed pages through pyw8a8's one compiled entry point
(exact int32 sums of int8 x int8).

A row x quantizes to ``hi`` with scale ``s = max|x| / 127``; with two terms, the residual
``x - s hi`` (at most s/2 in size) quantizes to ``lo`` on the finer step ``s / LO_STEPS``.
Both terms are rows of the same product (the page is read once), and ``LO_STEPS * (hi . w)
+ (lo . w)`` is the row's exact integer sum on the step ``s / LO_STEPS``.
"""
from __future__ import annotations

import numpy as np

from ..matmul import _product
from ..quantize import quantize_per_token

#: The residual's steps per step of the first term: its range, +-s/2, spans +-127 of them.
LO_STEPS = 254


def quantize_terms(x, terms, name):
    """Rows x ((M, K) float32) as int8 terms: ((terms * M, K) int8, the first term's rows
    then the residual's, and the (M,) float32 step of the combined sum of `combine`)."""
    hi, scale = quantize_per_token(x)
    if terms == 1:
        return hi, scale
    step = scale / np.float32(LO_STEPS)
    safe = np.where(step > 0, step, np.float32(1))[:, None]
    residual = x - hi * scale[:, None]
    lo = np.clip(np.rint(residual / safe), -127, 127).astype(np.int8)
    return np.concatenate([hi, lo]), step


def combine(sums, terms):
    """The int64 sums on the finer step of `quantize_terms`, from the (terms * M, N) sums of
    its rows."""
    if terms == 1:
        return sums.astype(np.int64)
    m = sums.shape[0] // 2
    return sums[:m].astype(np.int64) * LO_STEPS + sums[m:]


def key_sums(rows, pages, head):
    """rows ((R, head_dim) int8) . every key of `pages` (consecutive, head `head`):
    (R, tokens) int32, exact; column j is position ``pages[0].start + j``."""
    out = np.empty((rows.shape[0], sum(p.count for p in pages)), np.int32)
    at = 0
    for page in pages:
        cols = out[:, at:at + page.count]  # rows of the output stay contiguous
        _product(rows, [page.packed_keys[head].plan()], [cols], "query rows", rows.shape)
        at += page.count
    return out


def value_sums(rows, pages, head):
    """rows ((R, tokens) int8, a column per position of `pages`) . their values (head
    `head`): (R, head_dim) int64, exact."""
    out = np.zeros((rows.shape[0], pages[0].packed_values[head].shape[0]), np.int64)
    part = np.empty(out.shape, np.int32)
    at = 0
    for page in pages:
        cols = np.ascontiguousarray(rows[:, at:at + page.count])
        _product(cols, [page.packed_values[head].plan()], [part], "probability rows",
                 cols.shape)
        out += part
        at += page.count
    return out
