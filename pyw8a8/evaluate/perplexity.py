"""Perplexity and KL against the control at every position of a text (numpy only).

Full-vocabulary logits of every position would not fit in memory (262,144 floats each),
so a chunk of positions at a time, the control's distributions (`ControlDistribution`)
score each configuration's: ``-log Q(next)``, ``KL(P || Q)`` and whether both rank the
same token first, kept per position (`WindowScores`); `summarize` turns them into
perplexity, its change and KL statistics, with bootstrap intervals over windows."""

from __future__ import annotations

import numpy as np

from .bootstrap import RESAMPLES, SEED, mean_interval, paired_bootstrap

__all__ = ["KL_PERCENTILES", "ControlDistribution", "WindowScores", "summarize"]

#: Percentiles of the per-position KL that the summary reports.
KL_PERCENTILES = (50, 99, 99.9)


def _row_lse(row64, work):
    """log(sum(exp(row))) of a float64 row, `work` a scratch row of its size."""
    m = row64.max()
    if not np.isfinite(m):  # NaN or +inf anywhere, or a row of -inf
        raise ValueError("logits contain NaN or infinities")
    np.subtract(row64, m, out=work)
    np.exp(work, out=work)
    return m + np.log(work.sum())


class ControlDistribution:
    """The control's next-token distributions of a chunk of positions, to score targets by.

    A row at a time in float64 (two scratch rows stay in cache, where a chunk's float64
    temporaries would stream through memory a dozen times), with
    ``KL(P || Q) = sum_v p_v (c_v - t_v) + lse(t) - lse(c)`` for logits c and t.

    Parameters
    ----------
    logits : array_like, shape (m, V)
        The control's logits, finite.
    next_ids : array_like, shape (m,)
        The token following each position, in ``[0, V)``.

    Attributes
    ----------
    nll : numpy.ndarray of float64, shape (m,)
        The control's ``-log P(next)``.

    Raises
    ------
    ValueError
        If the shapes disagree, an id is out of range or a logit is not finite."""

    def __init__(self, logits, next_ids):
        c = np.asarray(logits, dtype=np.float32)
        ids = np.asarray(next_ids, dtype=np.int64)
        if c.ndim != 2 or c.shape[1] == 0 or ids.shape != (c.shape[0],):
            raise ValueError(f"logits must be (m, V) and next_ids (m,), got {c.shape} "
                             f"and {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= c.shape[1]):
            raise ValueError(f"next_ids must lie in [0, {c.shape[1]})")
        self.logits, self.next_ids = c, ids
        self.p = np.empty(c.shape, np.float64)
        self.lse = np.empty(ids.size, np.float64)
        row, work = np.empty(c.shape[1]), np.empty(c.shape[1])
        for i in range(ids.size):
            row[:] = c[i]
            self.lse[i] = lse = _row_lse(row, work)
            np.subtract(row, lse, out=work)
            np.exp(work, out=self.p[i])
        self.nll = self.lse - c[np.arange(ids.size), ids]
        self.top1 = np.argmax(c, axis=1)

    def score(self, target_logits):
        """(nll, kl, same_top1) of a target's logits (the control's shape, finite): float64
        ``-log Q(next)``, float64 ``KL(P || Q)`` (clipped at 0) and bool, each (m,)."""
        t = np.asarray(target_logits, dtype=np.float32)
        if t.shape != self.logits.shape:
            raise ValueError(f"target logits must have the control's shape "
                             f"{self.logits.shape}, got {t.shape}")
        m = t.shape[0]
        lse, kl = np.empty(m), np.empty(m)
        row, work = np.empty(t.shape[1]), np.empty(t.shape[1])
        for i in range(m):
            row[:] = t[i]
            lse[i] = _row_lse(row, work)
            work[:] = self.logits[i]
            np.subtract(work, row, out=work)
            kl[i] = np.dot(self.p[i], work) + lse[i] - self.lse[i]
        nll = lse - t[np.arange(m), self.next_ids]
        return nll, np.maximum(kl, 0.0), np.argmax(t, axis=1) == self.top1


class WindowScores:
    """One configuration's per-position scores: `add` chunks to the current window,
    `end_window` closes it."""

    def __init__(self):
        self.nll, self.kl, self.same_top1 = [], [], []
        self._open = ([], [], [])

    def add(self, nll, kl, same_top1):
        """Append a chunk's (m,) arrays, as `ControlDistribution.score` returns them."""
        for part, values in zip(self._open, (nll, kl, same_top1)):
            part.append(np.asarray(values))

    def end_window(self):
        """Close the current window (it must hold a position)."""
        if not self._open[0]:
            raise ValueError("end_window: the window has no positions")
        for store, part in zip((self.nll, self.kl, self.same_top1), self._open):
            store.append(np.concatenate(part))
            part.clear()

    def as_dict(self):
        """Per-window lists (JSON-ready): ``nll``, ``kl`` and ``same_top1`` per position."""
        return {"nll": [w.tolist() for w in self.nll], "kl": [w.tolist() for w in self.kl],
                "same_top1": [w.astype(int).tolist() for w in self.same_top1]}


def _window_means(windows, name):
    if not windows:
        raise ValueError(f"{name}: no windows")
    sizes = {len(w) for w in windows}
    if len(sizes) != 1:
        raise ValueError(f"{name}: windows of different lengths {sorted(sizes)}")
    return np.array([np.mean(w) for w in windows], np.float64)


def summarize(control: dict, target: dict, **bootstrap) -> dict:
    """Perplexity, its change and KL statistics of a target against the control.

    Parameters
    ----------
    control, target : dict
        `WindowScores.as_dict` of each on the same windows, all of one length.
    **bootstrap
        ``resamples``, ``seed``, ``confidence`` of
        `~pyw8a8.evaluate.bootstrap.paired_bootstrap`.

    Returns
    -------
    dict
        ``windows``, ``positions``, ``perplexity``, ``control_perplexity``,
        ``perplexity_change`` (target over control perplexity, minus 1) and its
        ``_interval``, ``kl_mean`` and its ``_interval``, ``kl_p50``, ``kl_p99``,
        ``kl_p99.9``, ``kl_max``, ``same_top1``; intervals ``[low, high]`` over windows,
        paired.

    Raises
    ------
    ValueError
        If the windows are missing or differ in length or count."""
    c_nll = _window_means(control["nll"], "control")
    t_nll = _window_means(target["nll"], "target")
    kl_windows = _window_means(target["kl"], "target KL")
    if c_nll.size != t_nll.size or len(control["nll"][0]) != len(target["nll"][0]):
        raise ValueError(f"the control has {c_nll.size} windows of {len(control['nll'][0])} "
                         f"positions, the target {t_nll.size} of {len(target['nll'][0])}")
    kl = np.concatenate([np.asarray(w, np.float64) for w in target["kl"]])
    same = np.concatenate([np.asarray(w, bool) for w in target["same_top1"]])
    # equal windows: the mean of the window means is the mean over every position
    change = float(np.exp(t_nll.mean() - c_nll.mean()) - 1.0)
    out = {
        "windows": int(t_nll.size),
        "positions": int(kl.size),
        "perplexity": float(np.exp(t_nll.mean())),
        "control_perplexity": float(np.exp(c_nll.mean())),
        "perplexity_change": change,
        "perplexity_change_interval": list(paired_bootstrap(
            lambda t, c: np.expm1(t.mean(axis=1) - c.mean(axis=1)), [t_nll, c_nll],
            **bootstrap)),
        "kl_mean": float(kl.mean()),
        "kl_mean_interval": list(mean_interval(kl_windows, **bootstrap)),
        "kl_max": float(kl.max()),
        "same_top1": float(same.mean()),
        "bootstrap": {"resamples": bootstrap.get("resamples", RESAMPLES),
                      "seed": bootstrap.get("seed", SEED),
                      "confidence": bootstrap.get("confidence", 0.95)},
    }
    for q, v in zip(KL_PERCENTILES, np.percentile(kl, KL_PERCENTILES)):
        out[f"kl_p{q:g}"] = float(v)
    return out
