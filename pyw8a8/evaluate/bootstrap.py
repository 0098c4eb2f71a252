"""Paired bootstrap confidence intervals (numpy only): the units (questions, windows)
resampled with replacement, every array of one interval with the same indices, so that a
difference against the control carries only the variation of the difference."""

from __future__ import annotations

import numpy as np

__all__ = ["RESAMPLES", "SEED", "paired_bootstrap", "mean_interval"]

#: Resamples of every reported interval.
RESAMPLES = 10_000
#: The generator seed of every reported interval: the same draws for every configuration.
SEED = 0

# Resample indices drawn at once: bounds the (batch, n) temporaries to ~32 MiB of int64.
_ELEMENTS_PER_BATCH = 1 << 22


def paired_bootstrap(statistic, samples, *, resamples=RESAMPLES, seed=SEED, confidence=0.95):
    """Percentile bootstrap interval of `statistic`, every sample resampled alike.

    Parameters
    ----------
    statistic : callable
        ``statistic(*resampled)``: one float64 array (batch, n) per sample, row b resample
        b; returns the statistic of every row, shape (batch,).
    samples : sequence of array_like
        1-D arrays of one length n >= 1.
    resamples : int, optional
    seed : int, optional
        Of ``numpy.random.default_rng``: the same seed and sizes, the same interval.
    confidence : float, optional
        In (0, 1).

    Returns
    -------
    (float, float)
        The ``(1 -+ confidence) / 2`` percentiles of the resampled statistic.

    Raises
    ------
    ValueError
        If `samples` is empty, not 1-D, empty arrays or of different lengths, or
        `resamples` or `confidence` is out of range."""
    arrays = [np.asarray(s, dtype=np.float64) for s in samples]
    if not arrays:
        raise ValueError("samples must hold at least one array")
    if any(a.ndim != 1 for a in arrays):
        raise ValueError(f"samples must be 1-D arrays, got shapes {[a.shape for a in arrays]}")
    n = arrays[0].size
    if n == 0:
        raise ValueError("samples must not be empty")
    if any(a.size != n for a in arrays):
        raise ValueError(f"samples must have the same length, got {[a.size for a in arrays]}")
    if isinstance(resamples, bool) or int(resamples) != resamples or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    rng = np.random.default_rng(seed)
    batch = max(1, _ELEMENTS_PER_BATCH // n)
    values = np.empty(int(resamples), np.float64)
    for start in range(0, values.size, batch):
        b = min(batch, values.size - start)
        idx = rng.integers(0, n, size=(b, n))
        values[start : start + b] = statistic(*(a[idx] for a in arrays))
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def mean_interval(values, **kwargs):
    """Bootstrap interval of the mean of `values`, shape (n,); `kwargs` as `paired_bootstrap`'s."""
    return paired_bootstrap(lambda v: v.mean(axis=1), [values], **kwargs)
