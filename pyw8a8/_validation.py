"""Argument checks shared by the public functions: every message names the argument."""
import functools
import operator
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

_Renamed = TypeVar("_Renamed", bound=Callable[..., Any])  # a function or a class

_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)
_FLOAT32_MAX = np.finfo(np.float32).max


def float_array(x, name, ndim=None, shape=None, row_offset=0):
    """`x` as a native float32 ndarray (float32 of either byte order or float64 converted,
    as numpy would; other dtypes: TypeError).

    `shape` and `row_offset` place x's rows in a larger array for the error message of a
    float64 value beyond float32's range, as in :func:`check_finite_row` (default: x is
    the whole array).

    Raises
    ------
    TypeError
        If x is not a float32 or float64 array.
    ValueError
        If x does not have `ndim` dimensions (default: at least one), or a float64 x holds
        a finite value beyond float32's range (the message names the row).
    """
    arr = np.asarray(x)
    native = arr.dtype is _FLOAT32  # identity first: this runs on every call of the API
    if not native and arr.dtype.newbyteorder("=") not in (_FLOAT32, _FLOAT64):
        raise TypeError(f"{name} must be a float32 or float64 array, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if ndim is None and arr.ndim < 1:
        raise ValueError(f"{name} must have at least one dimension, got a scalar")
    if not native:
        arr = _to_float32(arr, name, arr.shape if shape is None else shape, row_offset)
    # The C kernels load floats through float pointers: an unaligned buffer (an offset
    # view of bytes) is copied, as its loads would be undefined behaviour.
    return arr if arr.flags.aligned else arr.copy()


def _to_float32(arr, name, shape, row_offset):
    """Convert a float32 of the other byte order, or a float64, to native float32."""
    # A float64 beyond float32's range would become Inf and be reported as "NaN or Inf";
    # the cast's overflow flag finds it at the cost of an errstate, and only this error
    # path looks for the row.
    try:
        with np.errstate(over="raise"):
            return arr.astype(_FLOAT32)
    except FloatingPointError:
        pass
    with np.errstate(over="ignore"):
        overflow = np.isinf(arr.astype(_FLOAT32)) & np.isfinite(arr)
    flat = int(np.argmax(overflow))
    value = arr.reshape(-1)[flat]
    raise ValueError(f"{name} has a finite value ({value}) beyond float32's range "
                     f"(max {_FLOAT32_MAX!s}) in "
                     f"{_row_text(flat // arr.shape[-1] + row_offset, shape)}; pyw8a8 "
                     f"computes in float32: rescale or clip {name}") from None


def bias_vector(bias, n, name):
    """`bias` as a C-contiguous, aligned, native float32 vector of length n, or None: the
    array itself where it is one, else a float32 copy.

    Raises
    ------
    ValueError
        If bias is not a float32 or float64 array of shape (n,), or holds NaN/Inf, or a
        float64 value beyond float32's range.
    """
    if bias is None:
        return None
    arr = np.asarray(bias)
    if arr.dtype.newbyteorder("=") not in (_FLOAT32, _FLOAT64):
        raise ValueError(f"{name} must be a float32 or float64 array, got dtype {arr.dtype}")
    if arr.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) (one value per output channel), "
                         f"got {arr.shape}")
    ready = arr
    if not (arr.dtype is _FLOAT32 and arr.flags.c_contiguous and arr.flags.aligned):
        with np.errstate(over="ignore"):
            ready = arr.astype(_FLOAT32, order="C")
    if not np.all(np.isfinite(ready)):
        if np.all(np.isfinite(arr)):
            raise ValueError(f"{name} has a value beyond float32's range "
                             f"(max {_FLOAT32_MAX!s}); pyw8a8 computes in float32")
        raise ValueError(f"{name} holds NaN or Inf")
    return ready


def int8_matrix(x, name):
    """`x` as a C-contiguous int8 ndarray (N, K) with values in [-127, 127].

    Raises
    ------
    TypeError
        If x is not an int8 array.
    ValueError
        If x is not 2-D, or holds -128 (the message names the first row holding it).
    """
    arr = np.asarray(x)
    if arr.dtype != np.int8:
        raise TypeError(f"{name} must be an int8 array, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {arr.shape}")
    if arr.size and arr.min() == -128:
        row = int(np.argmax((arr == -128).any(axis=1)))
        raise ValueError(f"{name} holds -128 (first in row {row}): pyw8a8's int8 is "
                         "symmetric, [-127, 127] (-128 has no positive counterpart, and "
                         "the kernels' exact int32 sums count on |q| <= 127); clip it "
                         f"(np.clip({name}, -127, 127): -128 becomes -127, one step) or "
                         "requantize")
    return np.ascontiguousarray(arr)


def renamed_keyword(old: str, new: str) -> Callable[[_Renamed], _Renamed]:
    """A decorator of a function, or of a class (its ``__init__``): keyword `old` is taken
    as the deprecated name of `new`, with a DeprecationWarning naming `new`; passing both
    is a TypeError naming them."""
    def decorate(target: _Renamed) -> _Renamed:
        function = target.__init__ if isinstance(target, type) else target
        owner = target.__qualname__

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{owner} got both {new}= and {old}=, its deprecated "
                                    f"name: pass {new}= only")
                warnings.warn(f"{owner}: {old}= is deprecated, pass {new}=",
                              DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)
        if isinstance(target, type):
            setattr(target, "__init__", call)
            return target
        return cast(_Renamed, call)
    return decorate


def positive_int(value, name, minimum=1):
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _row_text(row, shape):
    """'row r' for row r of an array of `shape` (..., K) with its rows flattened, plus its
    index over the leading dimensions when there are several."""
    if len(shape) <= 2:
        return f"row {row}"
    index = tuple(int(i) for i in np.unravel_index(row, shape[:-1]))
    return f"row {row} (index {index})"


def check_finite_row(bad_row, name, shape):
    """Raise the documented error for a row holding NaN or Inf (bad_row >= 0)."""
    if bad_row >= 0:
        raise ValueError(f"{name} has a non-finite value (NaN or Inf) in "
                         f"{_row_text(bad_row, shape)}; int8 quantization needs finite "
                         "values")
