"""The exact integer halves of int8 attention: float rows split into one or two int8 terms,
and their exact products with a layer's pages (``_simd/kv_attention.h``, the products int8
attention runs, here for the tests).

A row x quantizes to ``hi`` with scale ``s = max|x| / 127``; with two terms, the residual
``x - s hi`` (at most s/2 in size) quantizes to ``lo`` on the finer step ``s / LO_STEPS``.
Both terms are rows of the same product (the page is read once), and ``LO_STEPS * (hi . w)
+ (lo . w)`` is the row's exact integer sum on the step ``s / LO_STEPS``.
"""
from __future__ import annotations

import numpy as np

from .. import _attention, _cpu, _threads
from .._validation import check_finite_row

#: The residual's steps per step of the first term: its range, +-s/2, spans +-127 of them.
LO_STEPS = 254


def quantize_terms(x, terms, name):
    """Rows x ((M, K) float32) as int8 terms: ((terms * M, K) int8, the first term's rows
    then the residual's, and the (M,) float32 step of the combined sum of `combine`).  A row
    holding NaN or Inf raises ValueError naming it."""
    x = np.ascontiguousarray(x, np.float32)
    m, k = x.shape
    q = np.empty((terms * m, k), np.int8)
    step = np.empty(m, np.float32)
    bad = _attention.int8_terms(x, q, step, LO_STEPS, _threads.threads_for(x.size * 8))
    check_finite_row(bad, name, x.shape)
    return q, step


def combine(sums, terms):
    """The int64 sums on the finer step of `quantize_terms`, from the (terms * M, N) sums of
    its rows."""
    if terms == 1:
        return sums.astype(np.int64)
    m = sums.shape[0] // 2
    return sums[:m].astype(np.int64) * LO_STEPS + sums[m:]


def key_sums(rows, span, last, head):
    """rows ((R, head_dim) int8) . every key of the full pages `span` (a
    `_pages.PackedSpan`) then of the open page `last` (or None) of KV head `head`:
    (R, tokens) int32, exact, as int8 attention's products take them; column j is position
    ``span.start + j`` (or ``last.start + j`` without full pages)."""
    return _kv_sums(rows, span, last, head, rows.shape[1], True)


def value_sums(rows, span, last, head, head_dim):
    """rows ((R, tokens) int8, a column per position of `span` then `last`, as
    `key_sums`) . their values (KV head `head`, `head_dim` wide): (R, head_dim) int64,
    exact."""
    return _kv_sums(rows, span, last, head, head_dim, False)


def _kv_sums(rows, span, last, head, width, keys):
    return _attention.kv_sums(_cpu.active_ops(rows.shape[0]).address,
                              np.ascontiguousarray(rows), span, last, head, width, keys)
