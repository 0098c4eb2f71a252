"""The noise floor: float32 arithmetic on weight matrices rounded to bfloat16 once, whose
answer changes against the control count the questions so near a tie that rounding
alone flips them."""

from __future__ import annotations

import numpy as np

from ..router import float_linear

__all__ = ["bfloat16_linear", "round_to_bfloat16"]

#: Elements rounded per step: bounds the temporaries (a few uint32 arrays of this size)
#: while rounding the 262144 x 640 output layer.
_CHUNK = 1 << 22


def round_to_bfloat16(w) -> np.ndarray:
    """Float32 values rounded to the nearest bfloat16 (ties to even), kept as float32.

    The values of ``w.astype(ml_dtypes.bfloat16).astype(numpy.float32)``, computed on the
    bits (no ml_dtypes): add half a unit less one plus the kept part's lowest bit, clear
    the low 16 bits.  Overflow rounds to infinity; NaNs stay NaN (quiet, sign kept).

    Parameters
    ----------
    w : array_like
        Values convertible to float32 (only read).

    Returns
    -------
    numpy.ndarray
        A new C-contiguous float32 array of `w`'s shape."""
    src = np.ascontiguousarray(w, dtype=np.float32)
    out = np.empty(src.shape, np.float32)
    bits_in = src.reshape(-1).view(np.uint32)
    bits_out = out.reshape(-1).view(np.uint32)
    for s in range(0, bits_in.size, _CHUNK):
        u = bits_in[s : s + _CHUNK]
        r = (u >> np.uint32(16)) & np.uint32(1)
        r += np.uint32(0x7FFF)
        r += u  # no wrap for finite values or infinities: their exponent field is < 0xFF
        r &= np.uint32(0xFFFF0000)
        nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        if nan.any():  # the addition may carry a NaN's payload into its sign: redo them
            r[nan] = (u[nan] | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
        bits_out[s : s + _CHUNK] = r
    return out


def bfloat16_linear(name, w):
    """The noise floor's ``linear(name, w)`` factory: `float_linear` on `w` rounded once."""
    return float_linear(name, round_to_bfloat16(w))
