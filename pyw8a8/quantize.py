"""Symmetric round-to-nearest int8 quantization, one scale per row.

For a row x: ``scale = max|x| / 127`` and ``q = clip(rint(x * (127 / max|x|)), -127, 127)``
(round half to even). The range is [-127, 127], never -128, so the scheme is symmetric and
needs no zero point. A row whose max |x| is below ``127 * FLT_MIN`` (about 1.5e-36, all
zeros included) gets ``scale = 0`` and ``q = 0``: dequantizing gives exact zeros. A row
holding NaN or Inf raises ``ValueError`` naming the row.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from . import _cpu, _kernels, _rows, _threads
from ._layout import W8_A_ROW_PAD, W8_KPAD, padded
from ._validation import check_finite_row, float_array
from .rotation import check_rotation, rotated_length


def quantize_rows(x2d, kp, ops=None, enc=_kernels.W8_ENC_BIASED, name="x", shape=None,
                  block=0, seed=0, row_offset=0):
    """Quantize a C-contiguous float32 (M, K) matrix into bytes as the kernel of ISA `ops`
    (default: the active one) and weight encoding `enc` reads them (internal).

    `shape` is the caller's shape of x (..., K), for the error message of a bad row;
    `row_offset` is the index of x2d's first row in it (x2d may be a block of rows).
    block > 0 quantizes ``rotation.rotate(x2d, block, seed, pad=True)`` instead, fused
    (bit-identical): a last partial block is zero-padded in a per-thread scratch row, never
    in a copy of x2d, so kp must cover K rounded up to block.
    For enc = W8_ENC_BIASED the bytes are the plain int8 values on every ISA.

    Returns (q uint8 (Mp, kp), scale float32 (M,), psum int32 (M, kp/64 + 1) or (0, 1)):
    q's rows are M rounded up to whole tiles (W8_A_ROW_PAD); rows past M are scratch.
    """
    ops = _cpu.active_ops() if ops is None else ops
    m, k = x2d.shape
    q = np.empty((padded(m, W8_A_ROW_PAD), kp), np.uint8)
    scale = np.empty((m,), np.float32)
    sums = np.empty((m if ops.row_sums(enc) else 0, kp // W8_KPAD + 1), np.int32)
    if k == 0:
        q.fill(ops.activation_key(enc)[0])
        scale.fill(0)
        sums.fill(0)
        return q, scale, sums
    if block:
        block, seed = check_rotation(k, block, seed, name, pad=True)
        if rotated_length(k, block) > kp:
            raise ValueError(f"{name} has K={k} features: rotated in blocks of "
                             f"block={block} it needs {rotated_length(k, block)} columns, "
                             f"more than kp={kp}")
    bad = _rows.quantize_rows(ops, enc, x2d, q, scale, sums,
                                 _threads.threads_for(m * k * 16), block, seed)
    if block and bad >= 0 and np.all(np.isfinite(x2d[bad])):
        raise ValueError(f"{name} row {bad + row_offset} is finite but too large to "
                         "rotate: its rotation exceeds the float32 range")
    check_finite_row(bad + row_offset if bad >= 0 else bad, name,
                     x2d.shape if shape is None else shape)
    return q, scale, sums


def _quantize_matrix(x: npt.ArrayLike,
                     name: str) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    arr = float_array(x, name, ndim=2)
    q, scale, _ = quantize_rows(np.ascontiguousarray(arr), arr.shape[1], name=name)
    return q[:arr.shape[0]].view(np.int8), scale


def quantize_per_token(x: npt.ArrayLike) -> tuple[npt.NDArray[np.int8],
                                                 npt.NDArray[np.float32]]:
    """Quantize activations to int8 with one scale per row (token).

    Parameters
    ----------
    x : array_like of float32 or float64, shape (M, K)
        Activations, one token per row.

    Returns
    -------
    q : ndarray of int8, shape (M, K)
        Values in [-127, 127].
    scale : ndarray of float32, shape (M,)
        ``max|x[m]| / 127``, or 0 for a (numerically) zero row; ``q * scale[:, None]``
        approximates x.

    Raises
    ------
    TypeError
        If x is not a float32/float64 array.
    ValueError
        If x is not 2-D, or a row holds NaN or Inf (the message names the row).

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> x = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]], dtype=np.float32)
    >>> q, scale = pyw8a8.quantize_per_token(x)
    >>> q.dtype, q.shape, scale.dtype
    (dtype('int8'), (2, 3), dtype('float32'))
    >>> q.tolist()  # the largest |x| of a row maps to 127; a zero row to zeros
    [[64, -127, 32], [0, 0, 0]]
    >>> bool(np.all(np.abs(q * scale[:, None] - x) <= scale[:, None] / 2))  # half a step
    True
    """
    return _quantize_matrix(x, "x")


def quantize_per_channel(w: npt.ArrayLike) -> tuple[npt.NDArray[np.int8],
                                                   npt.NDArray[np.float32]]:
    """Quantize weights to int8 with one scale per output channel.

    Parameters
    ----------
    w : array_like of float32 or float64, shape (N, K)
        Weights in the ``torch.nn.Linear.weight`` layout (out_features, in_features).

    Returns
    -------
    q : ndarray of int8, shape (N, K)
        Values in [-127, 127].
    scale : ndarray of float32, shape (N,)
        ``max|w[n]| / 127``, or 0 for a (numerically) zero row.

    Raises
    ------
    TypeError, ValueError
        As :func:`quantize_per_token`, for `w` and its rows (output channels).

    See Also
    --------
    quantize_per_token : the same rounding, one scale per activation row.

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    >>> q, scale = pyw8a8.quantize_per_channel(w)
    >>> q.shape, scale.shape
    ((16, 64), (16,))
    >>> bool(np.all(np.abs(q).max(axis=1) == 127))  # every row spans the int8 range
    True
    >>> bool(np.allclose(scale, np.abs(w).max(axis=1) / 127))
    True
    """
    return _quantize_matrix(w, "w")
