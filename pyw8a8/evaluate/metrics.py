"""Baseline-relative evaluation metrics for quantized models.

Accuracy alone hides how much a compressed model's behaviour moved: two
models can score the same while many individual answers swap correctness.
Following Dutta et al., "Accuracy is Not All You Need" (NeurIPS 2024), this
module reports *flips* (answers whose correctness changed) and the KL
divergence of the target model's next-token distribution from the control's.

Everything here is plain numpy and independent of the kernels.
"""

from __future__ import annotations

import numpy as np

from .bootstrap import mean_interval, paired_bootstrap

__all__ = [
    "log_softmax",
    "kl_divergence",
    "option_kl",
    "compare_answers",
    "answer_intervals",
    "kl_summary",
]


def log_softmax(logits):
    """Numerically stable log-softmax over the last axis, in float64.

    Parameters
    ----------
    logits : array_like
        Unnormalized log-probabilities, shape ``(..., V)`` with ``V >= 1``.

    Returns
    -------
    numpy.ndarray
        float64 array of the same shape whose ``exp`` sums to 1 over the
        last axis.

    Raises
    ------
    ValueError
        If the input is a scalar, has an empty last axis or contains NaN or
        +inf values.
    """
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
    # Terms with p == 0 contribute 0 (0 * log 0 = 0), even where q == 0 too.
    diff = np.where(p > 0, logp - logq, 0.0)
    kl = np.sum(p * diff, axis=-1)
    # Tiny negative values are rounding noise; KL is non-negative.
    return np.maximum(kl, 0.0)


def kl_divergence(p_logits, q_logits):
    """KL(P || Q) in nats between the softmax distributions of two logit arrays.

    ``P`` is the control (reference) model and ``Q`` the target (e.g. the
    W8A8 model): ``sum_v p_v (log p_v - log q_v)`` over the full last axis.

    Parameters
    ----------
    p_logits : array_like
        Control logits, shape ``(..., V)``.
    q_logits : array_like
        Target logits, same shape as `p_logits`.

    Returns
    -------
    float or numpy.ndarray
        A Python float for 1-D inputs, otherwise a float64 array of shape
        ``(...)`` (one value per row).

    Raises
    ------
    ValueError
        If the shapes differ or the logits are invalid (see `log_softmax`).

    Examples
    --------
    >>> round(kl_divergence([0.0, 0.0], [0.0, np.log(3.0)]), 6)
    0.143841
    """
    p = np.asarray(p_logits)
    q = np.asarray(q_logits)
    if p.shape != q.shape:
        raise ValueError(
            f"control and target logits must have the same shape, got {p.shape} and {q.shape}"
        )
    kl = _kl_from_logp(log_softmax(p), log_softmax(q))
    if np.ndim(kl) == 0:
        return float(kl)
    return kl


def option_kl(control_logits, target_logits, option_ids):
    """KL(control || target) over the distribution restricted to answer options.

    Both logit vectors are restricted to the given token ids (e.g. the ids of
    " A", " B", " C", " D") and renormalized with a softmax before the KL is
    taken, as in the answer-option KL of Dutta et al. (2024).

    Parameters
    ----------
    control_logits, target_logits : array_like
        Logits over the full vocabulary, shape ``(..., V)``.
    option_ids : sequence of int
        Distinct token ids of the options, each in ``[0, V)``.

    Returns
    -------
    float or numpy.ndarray
        As for `kl_divergence`.

    Raises
    ------
    ValueError
        If the shapes differ, `option_ids` is empty, has duplicates or is out
        of range.
    """
    c = np.asarray(control_logits)
    t = np.asarray(target_logits)
    if c.shape != t.shape:
        raise ValueError(
            f"control and target logits must have the same shape, got {c.shape} and {t.shape}"
        )
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
        raise ValueError(
            "labels, control_choice and target_choice must have the same length, "
            f"got {len(y)}, {len(c)} and {len(t)}"
        )
    return y, c, t


def compare_answers(labels, control_choice, target_choice):
    """Compare a target model's multiple-choice answers with a control's.

    Parameters
    ----------
    labels : sequence of int
        Correct option index per question.
    control_choice : sequence of int
        Option chosen by the control (reference) model per question.
    target_choice : sequence of int
        Option chosen by the target model per question.

    Returns
    -------
    dict
        ``n``: number of questions; ``control_correct`` / ``target_correct``: number
        answered correctly; ``control_accuracy`` / ``target_accuracy``: fraction correct;
        ``correct_to_incorrect``: control right, target wrong; ``incorrect_to_correct``:
        control wrong, target right; ``flips``: the sum of the previous two (the paper's
        definition; wrong-to-wrong changes are *not* flips); ``flip_rate``: ``flips / n``;
        ``wrong_to_wrong_changes``: both wrong but with different answers;
        ``answer_changes``: questions whose chosen answer differs (all three kinds above);
        ``net_correct``: ``target_correct - control_correct``; ``top1_agreement``:
        fraction of questions with identical choices.  Fractions are ``nan`` when
        ``n == 0``.

    Raises
    ------
    ValueError
        If the three sequences have different lengths or are not 1-D integer
        sequences.
    """
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
    """95% paired bootstrap intervals of `compare_answers`' rates, over questions.

    Every interval resamples the questions with the same seed (`pyw8a8.evaluate.bootstrap`),
    and the accuracy change resamples the control's and the target's correctness together.

    Parameters
    ----------
    labels, control_choice, target_choice : sequence of int
        As for `compare_answers` (at least one question).
    **kwargs
        ``resamples``, ``seed``, ``confidence`` of `~pyw8a8.evaluate.bootstrap.paired_bootstrap`.

    Returns
    -------
    dict
        ``[low, high]`` lists of Python floats for ``target_accuracy``, ``accuracy_change``
        (target minus control accuracy), ``flip_rate`` and ``answer_change_rate``.

    Raises
    ------
    ValueError
        As for `compare_answers`, or for no questions.
    """
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
    """Summary statistics of per-question KL values.

    Parameters
    ----------
    values : array_like
        1-D array of KL divergences (non-negative floats).

    Returns
    -------
    dict
        ``n``, ``mean``, ``median``, ``p95`` (``numpy.percentile`` with linear
        interpolation) and ``max``, as Python floats.

    Raises
    ------
    ValueError
        If `values` is empty, not 1-D, or contains NaN.
    """
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
