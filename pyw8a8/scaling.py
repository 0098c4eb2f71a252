"""Per-channel scaling folded into weights: smaller int8 quantization ranges, same output.

Two transforms, both exact in real arithmetic:

- :func:`equalize_ffn` (data-free): in a gated FFN ``y = W_down (act(W_gate x) * (W_up x))``
  hidden channel i is scaled by t_i on the up projection's output and by 1/t_i on the down
  projection's input. The product ``*`` is bilinear and the activation sees the gate only,
  so this is exact for any activation (GELU and SiLU are not positively homogeneous, which
  is why the gate is never scaled). It balances the down projection's input activations
  against its weight columns (per-row scales absorb any scaling of W_up's rows).
- :func:`smooth` (SmoothQuant, needs calibration maxima): input channel j of a set of
  linears sharing one input is multiplied by s_j in the weights and divided by s_j in the
  activation (folded into the preceding norm's gain), moving range from activation
  outliers into the weights.

Apply scaling before rotation (pack the returned weights with ``rotate=True``).
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

NORM_FLOOR = 1e-12
SMOOTH_FLOOR = 1e-5
_MODES = ("gated", "plain")

_FloatArray = npt.NDArray[np.floating[Any]]  # float32 or float64, as the input
_Factors = npt.NDArray[np.float64]


def _matrix(w: npt.ArrayLike, name: str) -> _FloatArray:
    arr = np.asarray(w)
    if arr.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be a float32 or float64 array, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds NaN or Inf")
    return arr


def _real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _norms(w: _FloatArray, axis: int) -> npt.NDArray[np.float64]:
    return np.maximum(np.linalg.norm(w.astype(np.float64, copy=False), axis=axis),
                      NORM_FLOOR)


@overload
def equalize_ffn(w_gate: npt.ArrayLike, w_up: npt.ArrayLike, w_down: npt.ArrayLike,
                 clamp: float = ..., mode: Literal["gated", "plain"] = ...
                 ) -> tuple[_FloatArray, _FloatArray, _FloatArray, _Factors]: ...
@overload
def equalize_ffn(w_gate: None, w_up: npt.ArrayLike, w_down: npt.ArrayLike,
                 clamp: float = ..., mode: Literal["plain"] = ...
                 ) -> tuple[None, _FloatArray, _FloatArray, _Factors]: ...
def equalize_ffn(w_gate: npt.ArrayLike | None, w_up: npt.ArrayLike, w_down: npt.ArrayLike,
                 clamp: float = 16.0, mode: Literal["gated", "plain"] = "gated"
                 ) -> tuple[_FloatArray | None, _FloatArray, _FloatArray, _Factors]:
    """Data-free equalization of a (gated) FFN's hidden channels.

    Per hidden channel i, with L2 norms ``u_i = ||w_up[i, :]||``, ``g_i = ||w_gate[i, :]||``
    and ``d_i = ||w_down[:, i]||`` (each floored at 1e-12)::

        t_i = clip(sqrt(d_i / (u_i * g_i)), 1 / clamp, clamp)    (mode="gated")
        t_i = clip(sqrt(d_i / u_i), 1 / clamp, clamp)            (mode="plain")

    Parameters
    ----------
    w_gate : array_like of float32 or float64, shape (F, D), or None
        Gate projection (``torch.nn.Linear.weight`` layout); None only in "plain" mode.
    w_up, w_down : array_like of float32 or float64, shapes (F, D) and (D, F)
        Up and down projections.
    clamp : float
        Bound on the factors, at least 1 (1 disables the scaling).
    mode : {'gated', 'plain'}
        The hidden activation's proxy: ``u_i * g_i`` for ``act(w_gate x)_i * (w_up x)_i``,
        or ``u_i`` alone (cross-layer equalization: ``w_up x`` times anything unscaled).

    Returns
    -------
    w_gate, w_up, w_down : ndarray, shapes (F, D), (F, D) and (D, F)
        The gate unchanged (or None), ``w_up * t[:, None]`` and ``w_down / t[None, :]``.
    t : ndarray of float64, shape (F,)
        The factors: ``w_down (act(w_gate x) * (w_up x))`` is unchanged for any activation.

    Raises
    ------
    TypeError
        A weight not a float32/float64 array, or clamp not a real number.
    ValueError
        A weight not 2-D or holding NaN/Inf, shapes that disagree, clamp < 1, unknown mode.

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> rng = np.random.default_rng(0)
    >>> w_gate, w_up = rng.standard_normal((2, 32, 16))
    >>> w_down = rng.standard_normal((16, 32)) * np.linspace(0.1, 10, 32)  # uneven columns
    >>> gate, up, down, t = pyw8a8.equalize_ffn(w_gate, w_up, w_down)
    >>> t.shape, bool(np.all((1 / 16 <= t) & (t <= 16)))
    ((32,), True)
    >>> silu = lambda h: h / (1 + np.exp(-h))
    >>> ffn = lambda g, u, d, x: d @ (silu(g @ x) * (u @ x))
    >>> x = rng.standard_normal(16)
    >>> bool(np.allclose(ffn(gate, up, down, x), ffn(w_gate, w_up, w_down, x)))
    True
    """
    gate, up, down, clamp = _ffn_arguments(w_gate, w_up, w_down, clamp, mode)
    ratio = _norms(down, axis=0) / _norms(up, axis=1)
    if gate is not None and mode == "gated":  # a gate is required in this mode
        ratio /= _norms(gate, axis=1)
    t = np.clip(np.sqrt(ratio), 1.0 / clamp, clamp)
    return (gate, (up * t[:, None]).astype(up.dtype, copy=False),
            (down / t[None, :]).astype(down.dtype, copy=False), t)


def _ffn_arguments(w_gate, w_up, w_down, clamp, mode):
    """`equalize_ffn`'s arguments checked: the weights as 2-D float arrays (the gate None
    where it is None), clamp as a float."""
    if mode not in _MODES:
        raise ValueError(f"mode must be 'gated' or 'plain', got {mode!r}")
    clamp = _real(clamp, "clamp")
    if clamp < 1:
        raise ValueError(f"clamp must be at least 1, got {clamp}")
    up = _matrix(w_up, "w_up")
    down = _matrix(w_down, "w_down")
    f, d = up.shape
    if down.shape != (d, f):
        raise ValueError(f"w_down must have shape (D, F) = {(d, f)} to follow w_up of "
                         f"shape {up.shape}, got {down.shape}")
    gate = None
    if w_gate is not None:
        gate = _matrix(w_gate, "w_gate")
        if gate.shape != up.shape:
            raise ValueError(f"w_gate must have w_up's shape {up.shape}, got {gate.shape}")
    elif mode == "gated":
        raise ValueError("w_gate is required in mode='gated' (pass mode='plain' without "
                         "a gate)")
    return gate, up, down, clamp


def smooth(weights: Sequence[npt.ArrayLike], act_absmax: npt.ArrayLike,
           alpha: float = 0.5) -> tuple[_Factors, list[_FloatArray]]:
    """SmoothQuant factors for linears that share one input activation.

    ``s_j = act_absmax_j**alpha / wmax_j**(1 - alpha)``, clamped to at least 1e-5, where
    ``wmax_j = max over the weights of max_i |W[i, j]|`` (clamped to at least 1e-5).

    Parameters
    ----------
    weights : sequence of array_like of float32 or float64, each of shape (N_w, K)
        The consumers of the activation (e.g. q/k/v, or gate/up), in the
        ``torch.nn.Linear.weight`` layout.
    act_absmax : array_like of float, shape (K,)
        Calibration maximum of ``|x[:, j]|`` per input channel, non-negative.
    alpha : float
        Migration strength in [0, 1]: 0 leaves the activation alone (s = 1 / wmax), 1
        moves all of its range into the weights.

    Returns
    -------
    s : ndarray of float64, shape (K,)
        The factors. The caller divides the activation by s (fold ``1 / s`` into the
        preceding norm's gain); then ``(x / s) @ (W * s).T == x @ W.T``.
    scaled : list of ndarray, each of shape (N_w, K)
        ``W * s[None, :]`` per weight, in each weight's dtype.

    Raises
    ------
    TypeError
        weights not a sequence of float32/float64 arrays, act_absmax not a real array, or
        alpha not a real number.
    ValueError
        weights empty, not 2-D, holding NaN/Inf or of different K; act_absmax of the wrong
        shape or holding negative or non-finite values; alpha outside [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((8, 64))
    >>> x[:, 3] *= 50  # an outlier input channel
    >>> w_q, w_k = rng.standard_normal((2, 32, 64))
    >>> s, (q_scaled, k_scaled) = pyw8a8.smooth([w_q, w_k], np.abs(x).max(axis=0))
    >>> bool(np.allclose((x / s) @ q_scaled.T, x @ w_q.T))
    True
    >>> bool(np.abs(x / s).max(axis=0)[3] < np.abs(x).max(axis=0)[3])  # outlier tamed
    True
    """
    mats = _consumers(weights)
    act = _absmax(act_absmax, mats[0].shape[1])
    alpha = _real(alpha, "alpha")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    wmax = np.max([np.abs(w).max(axis=0, initial=0.0) for w in mats], axis=0)
    wmax = np.maximum(wmax.astype(np.float64), SMOOTH_FLOOR)
    s = np.maximum(act**alpha / wmax**(1 - alpha), SMOOTH_FLOOR)
    return s, [(w * s[None, :]).astype(w.dtype, copy=False) for w in mats]


def _consumers(weights):
    """`smooth`'s weights as checked 2-D float arrays of one K."""
    if isinstance(weights, np.ndarray) or not isinstance(weights, (list, tuple)):
        raise TypeError(f"weights must be a list or tuple of 2-D arrays (pass [w] for one "
                        f"weight), got {type(weights).__name__}")
    if not weights:
        raise ValueError("weights is empty")
    mats = [_matrix(w, f"weights[{i}]") for i, w in enumerate(weights)]
    k = mats[0].shape[1]
    for i, w in enumerate(mats):
        if w.shape[1] != k:
            raise ValueError(f"weights[{i}] has K={w.shape[1]} input channels, weights[0] "
                             f"has {k}")
    return mats


def _absmax(act_absmax, k):
    """`smooth`'s act_absmax as a checked float64 (k,) array."""
    act = np.asarray(act_absmax)
    if act.dtype.kind not in "fiu":
        raise TypeError(f"act_absmax must be a real array, got dtype {act.dtype}")
    if act.shape != (k,):
        raise ValueError(f"act_absmax must have shape ({k},) (one value per input "
                         f"channel), got {act.shape}")
    act = act.astype(np.float64)
    if not np.all(np.isfinite(act)) or np.any(act < 0):
        raise ValueError("act_absmax must hold finite, non-negative values")
    return act
