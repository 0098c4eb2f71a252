"""Control-relative metrics of a quantized model (numpy only): accuracy hides answers that
swap correctness, so, after Dutta et al., "Accuracy is Not All You Need" (NeurIPS 2024),
*flips* and the KL of the target's next-token distribution from the control's."""

from __future__ import annotations

import numpy as np

from .bootstrap import mean_interval, paired_bootstrap

__all__ = ["log_softmax", "kl_divergence", "option_kl", "compare_answers", "answer_intervals",
           "kl_summary"]


def log_softmax(logits):
    """Log-softmax over the last axis, in float64.

    Parameters
    ----------
    logits : array_like, shape (..., V), V >= 1

    Returns
    -------
    numpy.ndarray of float64, the input's shape

    Raises
    ------
    ValueError
        For a scalar, an empty last axis, NaN or +inf, or a row all -inf."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("log_softmax needs at least one axis, got a scalar")
    if x.shape[-1] == 0:
        raise ValueError("log_softmax needs a non-empty last axis")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("logits contain NaN or +inf")
    m = np.max(x, axis=-1, keepdims=True)
    if np.isneginf(m).any():
        raise ValueError("a row of logits is entirely -inf")
    shifted = x - m
    lse = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return shifted - lse


def _kl_from_logp(logp, logq):
    p = np.exp(logp)
    diff = np.where(p > 0, logp - logq, 0.0)  # 0 log 0 = 0, even where q == 0
    return np.maximum(np.sum(p * diff, axis=-1), 0.0)  # below 0: rounding


def _same_shape(control, target):
    c, t = np.asarray(control), np.asarray(target)
    if c.shape != t.shape:
        raise ValueError(f"control and target logits must have the same shape, got {c.shape} "
                         f"and {t.shape}")
    return c, t


def kl_divergence(p_logits, q_logits):
    """KL(P || Q) in nats of the softmax distributions of the control's logits (P) and the
    target's (Q).

    Parameters
    ----------
    p_logits, q_logits : array_like, shape (..., V)

    Returns
    -------
    float (1-D inputs) or numpy.ndarray of float64, shape (...)

    Raises
    ------
    ValueError
        If the shapes differ or the logits are invalid (see `log_softmax`).

    Examples
    --------
    >>> round(kl_divergence([0.0, 0.0], [0.0, np.log(3.0)]), 6)
    0.143841"""
    p, q = _same_shape(p_logits, q_logits)
    kl = _kl_from_logp(log_softmax(p), log_softmax(q))
    if np.ndim(kl) == 0:
        return float(kl)
    return kl


def option_kl(control_logits, target_logits, option_ids):
    """KL(control || target) of the distributions restricted to the answer options' token ids
    and renormalized (Dutta et al.'s answer-option KL).

    Parameters
    ----------
    control_logits, target_logits : array_like, shape (..., V)
    option_ids : sequence of int
        Distinct token ids in ``[0, V)``.

    Returns
    -------
    float or numpy.ndarray
        As `kl_divergence`.

    Raises
    ------
    ValueError
        If the shapes differ, or `option_ids` is empty, repeats an id or is out of range."""
    c, t = _same_shape(control_logits, target_logits)
    if c.ndim == 0:
        raise ValueError("logits must have at least one axis")
    ids = np.asarray(option_ids)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("option_ids must be a non-empty 1-D sequence of token ids")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"option_ids must be integers, got dtype {ids.dtype}")
    if len(np.unique(ids)) != ids.size:
        raise ValueError(f"option_ids contains duplicates: {ids.tolist()}")
    vocab = c.shape[-1]
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"option_ids must lie in [0, {vocab}), got {ids.tolist()}")
    return kl_divergence(c[..., ids], t[..., ids])


def _as_choice_array(name, values):
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must contain integer choice indices, got dtype {a.dtype}")
    return a.astype(np.int64)


def _choice_arrays(labels, control_choice, target_choice):
    y = _as_choice_array("labels", labels)
    c = _as_choice_array("control_choice", control_choice)
    t = _as_choice_array("target_choice", target_choice)
    if not (len(y) == len(c) == len(t)):
        raise ValueError("labels, control_choice and target_choice must have the same "
                         f"length, got {len(y)}, {len(c)} and {len(t)}")
    return y, c, t


def compare_answers(labels, control_choice, target_choice):
    """A target's multiple-choice answers against the control's.

    Parameters
    ----------
    labels, control_choice, target_choice : sequence of int
        Per question: the correct option, the control's and the target's choice.

    Returns
    -------
    dict
        ``n``; ``control_correct``, ``target_correct`` and their ``_accuracy``;
        ``correct_to_incorrect``, ``incorrect_to_correct`` and their sum ``flips`` (the
        paper's: wrong-to-wrong changes are not flips), ``flip_rate``;
        ``wrong_to_wrong_changes``; ``answer_changes`` (all three kinds); ``net_correct``;
        ``top1_agreement``.  Fractions are nan for no questions.

    Raises
    ------
    ValueError
        If the sequences differ in length or are not 1-D integer sequences."""
    y, c, t = _choice_arrays(labels, control_choice, target_choice)
    n = int(len(y))
    c_ok = c == y
    t_ok = t == y
    changed = c != t
    c2i = int(np.sum(c_ok & ~t_ok))
    i2c = int(np.sum(~c_ok & t_ok))
    w2w = int(np.sum(~c_ok & ~t_ok & changed))
    flips = c2i + i2c

    def frac(k):
        return float(k) / n if n else float("nan")

    return {
        "n": n,
        "control_correct": int(c_ok.sum()),
        "target_correct": int(t_ok.sum()),
        "control_accuracy": frac(c_ok.sum()),
        "target_accuracy": frac(t_ok.sum()),
        "flips": flips,
        "flip_rate": frac(flips),
        "correct_to_incorrect": c2i,
        "incorrect_to_correct": i2c,
        "wrong_to_wrong_changes": w2w,
        "answer_changes": int(changed.sum()),
        "net_correct": int(t_ok.sum()) - int(c_ok.sum()),
        "top1_agreement": frac(np.sum(~changed)),
    }


def answer_intervals(labels, control_choice, target_choice, **kwargs):
    """Paired bootstrap intervals of `compare_answers`' rates over questions.

    Parameters
    ----------
    labels, control_choice, target_choice : sequence of int
        As `compare_answers` (at least one question).
    **kwargs
        ``resamples``, ``seed``, ``confidence`` of `~pyw8a8.evaluate.bootstrap.paired_bootstrap`.

    Returns
    -------
    dict
        ``[low, high]`` of ``target_accuracy``, ``accuracy_change`` (the control's and the
        target's correctness resampled together), ``flip_rate`` and ``answer_change_rate``."""
    y, c, t = _choice_arrays(labels, control_choice, target_choice)
    c_ok = (c == y).astype(np.float64)
    t_ok = (t == y).astype(np.float64)
    return {
        "target_accuracy": list(mean_interval(t_ok, **kwargs)),
        "accuracy_change": list(paired_bootstrap(
            lambda tr, cr: tr.mean(axis=1) - cr.mean(axis=1), [t_ok, c_ok], **kwargs)),
        "flip_rate": list(mean_interval(c_ok != t_ok, **kwargs)),
        "answer_change_rate": list(mean_interval(c != t, **kwargs)),
    }


def kl_summary(values):
    """``n``, ``mean``, ``median``, ``p95`` and ``max`` (Python floats) of per-question KL.

    Raises
    ------
    ValueError
        If `values` is empty, not 1-D, or holds NaN."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {v.shape}")
    if v.size == 0:
        raise ValueError("kl_summary needs at least one value")
    if np.isnan(v).any():
        raise ValueError("KL values contain NaN")
    return {
        "n": int(v.size),
        "mean": float(np.mean(v)),
        "median": float(np.median(v)),
        "p95": float(np.percentile(v, 95, method="linear")),
        "max": float(np.max(v)),
    }
