"""The noise floor: a float32 model whose weight matrices are rounded to bfloat16 once.

Rounding every weight to bfloat16 (8 significant bits, the float32 exponent range) and
back changes nothing but the weights' low bits, and the arithmetic stays float32.  Its
answer changes against the float32 control count the questions whose options are so
near a tie that rounding alone flips them: a floor for the W8A8 configurations' changes.
"""

from __future__ import annotations

import numpy as np

from ..router import float_linear

__all__ = ["bfloat16_linear", "round_to_bfloat16"]

#: Elements rounded per step: bounds the temporaries (a few uint32 arrays of this size)
#: while rounding the 262144 x 640 output layer.
_CHUNK = 1 << 22


def round_to_bfloat16(w) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32.

    The same values as ``w.astype(ml_dtypes.bfloat16).astype(numpy.float32)``, computed
    on the bits so that the evaluation needs no ml_dtypes: add half a bfloat16 unit (less
    one, plus the kept part's lowest bit, which breaks ties to even) and clear the low 16
    bits.  Finite values beyond the largest bfloat16 round to infinity; infinities stay;
    NaNs stay NaN (quiet, sign kept).

    Parameters
    ----------
    w : array_like
        Values convertible to float32 (a read-only memory map is fine: it is only read).

    Returns
    -------
    numpy.ndarray
        A new C-contiguous float32 array of `w`'s shape.
    """
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
    """The ``linear(name, w)`` factory of the noise floor: float32 layers on bfloat16-rounded
    weights (rounded once, here).

    See Also
    --------
    pyw8a8.router.float_linear : the same factory, parameters and layers on the weights as
        they are.
    """
    return float_linear(name, round_to_bfloat16(w))
