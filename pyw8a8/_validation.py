"""Argument checks shared by the public functions: every message names the argument."""
import operator

import numpy as np


_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)


def float_array(x, name, ndim=None):
    """`x` as a float32 ndarray (float64 converted silently; other dtypes: TypeError)."""
    arr = np.asarray(x)
    if arr.dtype is not _FLOAT32:  # identity first: this runs on every call of the API
        if arr.dtype != _FLOAT32 and arr.dtype != _FLOAT64:
            raise TypeError(f"{name} must be a float32 or float64 array, got dtype {arr.dtype}")
        arr = arr.astype(np.float32, copy=False)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if ndim is None and arr.ndim < 1:
        raise ValueError(f"{name} must have at least one dimension, got a scalar")
    # The C kernels load floats through float pointers: an unaligned buffer (an offset
    # view of bytes) is copied, as its loads would be undefined behaviour.
    return arr if arr.flags.aligned else arr.copy()


def int8_matrix(x, name):
    arr = np.asarray(x)
    if arr.dtype != np.int8:
        raise TypeError(f"{name} must be an int8 array, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {arr.shape}")
    if arr.size and arr.min() == -128:
        raise ValueError(f"{name} holds -128: the symmetric scheme uses [-127, 127]; "
                         "clip it (np.clip(q, -127, 127)) or requantize")
    return np.ascontiguousarray(arr)


def positive_int(value, name, minimum=1):
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def check_finite_row(bad_row, name, shape):
    """Raise the documented error for a row holding NaN or Inf (bad_row >= 0)."""
    if bad_row >= 0:
        index = np.unravel_index(bad_row, shape[:-1]) if len(shape) > 1 else ()
        where = f"row {bad_row}" + (f" (index {tuple(int(i) for i in index)})"
                                    if len(shape) > 2 else "")
        raise ValueError(f"{name} has a non-finite value (NaN or Inf) in {where}; "
                         "int8 quantization needs finite values")
