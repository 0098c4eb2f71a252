"""The exact integer halves of int8 attention: float rows split into one or two int8 terms,
and their products with a layer's packed pages, all pages of a product in one compiled call
(`_kernels.page_column_sums`, `page_row_sums`: exact int32 sums of int8 x int8).

A row x quantizes to ``hi`` with scale ``s = max|x| / 127``; with two terms, the residual
``x - s hi`` (at most s/2 in size) quantizes to ``lo`` on the finer step ``s / LO_STEPS``.
Both terms are rows of the same product (the page is read once), and ``LO_STEPS * (hi . w)
+ (lo . w)`` is the row's exact integer sum on the step ``s / LO_STEPS``.
"""
from __future__ import annotations

import threading

import numpy as np

from .. import _cpu, _kernels, _rows, _threads
from .._validation import check_finite_row

#: The most tokens whose int8 x int8 sums stay in int32: 127 * 127 * 131072 < 2**31.
EXACT_INT32_TOKENS = 131072

#: Rows a thread of a paged product gets at least (`_page_threads`).
MIN_ROWS_PER_THREAD = 64

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
    bad = _rows.int8_terms(x, q, step, LO_STEPS, _threads.threads_for(x.size * 8))
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
    (R, tokens) int32, exact; column j is position ``span.start + j`` (or ``last.start +
    j`` without full pages)."""
    count = last.count if last is not None else 0
    out = np.empty((rows.shape[0], span.count + count), np.int32)
    if span.count:
        _kernels.page_column_sums(_cpu.active_ops(rows.shape[0]), rows,
                                  span.key_plans[head], out[:, :span.count],
                                  _page_threads(rows.shape[0], out.size * rows.shape[1]))
    if count:
        _rows.int8_dots(rows, last.keys[head, :count], out[:, span.count:])
    return out


def value_sums(rows, span, last, head, head_dim):
    """rows ((R, tokens) int8, a column per position of `span` then `last`, as
    `key_sums`) . their values (KV head `head`, `head_dim` wide): (R, head_dim) int32, or
    int64 beyond 131072 tokens, exact."""
    rows = np.ascontiguousarray(rows)
    m = rows.shape[0]
    out = np.zeros((m, head_dim), np.int32 if rows.shape[1] <= EXACT_INT32_TOKENS else np.int64)
    if span.count:
        _kernels.page_row_sums(_cpu.active_ops(m), rows[:, :span.count],
                               span.value_plans[head], out,
                               _page_threads(m, m * span.count * head_dim),
                               _workspace(_kernels.page_row_sums_work(
                                   m, head_dim, span.value_plans[head][0].K)))
    if last is not None and last.count:
        part = out if out.dtype == np.int32 else np.zeros(out.shape, np.int32)
        _rows.int8_row_combinations(rows[:, span.count:], last.values[head, :last.count],
                                    part)
        if part is not out:
            out += part
    return out


def _page_threads(rows, work):
    """Threads for a paged product of `rows` rows doing `work` multiply-adds: the pages'
    products split over their rows only, so one thread below a few row tiles a thread
    (at 8 rows, two threads took 3.5x as long: a parallel region per page)."""
    return _threads.threads_for(work) if rows >= MIN_ROWS_PER_THREAD * 2 else 1


def _workspace(nbytes):
    """This thread's reused work buffer for `_kernels.page_row_sums`, of at least
    `nbytes`."""
    work = getattr(_WORK, "buffer", None)
    if work is None or work.nbytes < nbytes:
        work = _WORK.buffer = np.empty(nbytes, np.uint8)
    return work


_WORK = threading.local()
