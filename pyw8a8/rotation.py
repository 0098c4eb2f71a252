"""Block randomized Walsh-Hadamard rotation: spreads outliers before int8 quantization.

The rotation of a vector of K features acts on each block of `block` consecutive features
independently (with ``pad=True`` a last partial block is zero-padded, so the rotated vector
has K rounded up to a multiple of `block` features; the zeros add nothing to a dot product
and the rotation stays orthonormal on the padded space): ``y_b = H (D_b x_b) / sqrt(block)``,
with ``H`` the Sylvester Hadamard matrix (natural order, ``scipy.linalg.hadamard``) and ``D_b`` the
diagonal of random signs of the block's absolute positions. It is orthonormal, so rotating
both operands of a dot product leaves it unchanged: ``rotate(a) . rotate(b) == a . b``, and
:func:`pyw8a8.matmul` rotates the activations (fused with their quantization) of a weight
packed with ``rotate=True``.

The signs come from a hash of (position, seed) (``_simd/fwht.h``): in every aligned window
of 65,536 positions the low 16 bits of the position go through a seed-keyed bijection of
16-bit values, and a position is negated when the top bit of its image is set; so exactly
half of every window is negated, the pattern has no short period, and the hash costs three
16-bit multiplies per position.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _cpu, _rows, _threads
from ._kernels import MAX_BLOCK, MIN_BLOCK  # the blocks a rotation takes (call.h)
from ._layout import padded
from ._validation import float_array

MAX_SEED = 2**32 - 1


def _is_power_of_two(n):
    return n >= 1 and n & (n - 1) == 0


def rotated_length(k: int, block: int) -> int:
    """K rounded up to a multiple of `block`: the length of a zero-padded rotated row."""
    return padded(k, block)


def auto_block(k: int) -> int:
    """The block ``pack_weight(block='auto')`` uses for K = `k` features: 128, or for K
    below 128 the smallest power of two from 16 that covers K (one zero-padded block)."""
    return min(128, max(MIN_BLOCK, 1 << max(int(k) - 1, 0).bit_length()))


def check_rotation(k: int, block: Any, seed: Any, name: str = "x", pad: bool = False,
                   caller: str = "pack_weight") -> tuple[int, int]:
    """Validate a rotation of K = `k` features; returns (block, seed) as ints.

    `caller` is the public function whose options the message of a block that does not
    divide K offers: "pack_weight", "rotate" or "unrotate".

    Raises
    ------
    TypeError
        If block or seed is not an int.
    ValueError
        If block is not a power of two in [16, 4096], seed is outside [0, 2**32 - 1], or
        block does not divide K and `pad` is false (for pack_weight and rotate the message
        names ``pad=True``, which zero-pads the last block, and suggests a block that
        divides K, if any; for unrotate it says to pass the whole padded rotation).
    """
    try:
        block = operator.index(block)
        seed = operator.index(seed)
    except TypeError:
        raise TypeError(f"block and seed must be ints, got {type(block).__name__} and "
                        f"{type(seed).__name__}") from None
    if not (_is_power_of_two(block) and MIN_BLOCK <= block <= MAX_BLOCK):
        raise ValueError(f"block must be a power of two from {MIN_BLOCK} to {MAX_BLOCK}, "
                         f"got {block}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**32 - 1], got {seed}")
    if k % block and not pad:
        raise ValueError(f"{name} has K={k} features, not a multiple of block={block}; "
                         f"{_partial_block_remedy(k, block, caller)}")
    return block, seed


def _partial_block_remedy(k, block, caller):
    """What the user of `caller` can do about a block that does not divide K: only the
    options that function has."""
    kr = rotated_length(k, block)
    if caller == "unrotate":
        # Another block or padding would not invert the rotation: only its whole output,
        # padded by rotate, does.
        return (f"unrotate inverts whole blocks of the rotation's block and seed: pass the "
                f"whole output of rotate(x, {block}, seed, pad=True) ({kr} features when x "
                f"has {k}) and keep the first K of the result")
    fits = [b for b in (2**i for i in range(4, 13)) if b < block and k % b == 0]
    hint = (f"use block={fits[-1]} (the largest power of two >= {MIN_BLOCK} dividing K)"
            if fits else f"K is not a multiple of {MIN_BLOCK}, so no block fits whole")
    remedy = f"{hint}, or pass pad=True to zero-pad the last block to {kr} features"
    if caller == "pack_weight":
        remedy += (" (what pack_weight's default block='auto' does), or do not rotate "
                   "(rotate=False)")
    return remedy


def _threads_for(size, n):
    """Threads for transforms of `size` elements in blocks of n (about log2(n) + 2
    operations per element, counting the sign flip)."""
    return _threads.threads_for(size * (n.bit_length() + 1))


def _as_rows(x: npt.ArrayLike,
             name: str) -> tuple[npt.NDArray[np.float32], tuple[int, ...]]:
    """x as a C-contiguous float32 (M, K) matrix, and its original shape."""
    arr = float_array(x, name)
    rows = arr.reshape(math.prod(arr.shape[:-1]), arr.shape[-1])
    return np.ascontiguousarray(rows), arr.shape


def fwht(x: npt.ArrayLike,
         out: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.float32]:
    """Unnormalized fast Walsh-Hadamard transform along the last axis.

    Parameters
    ----------
    x : array_like of float32 or float64, shape (..., n)
        n a power of two (1, 2, 4, ...); either byte order.
    out : ndarray of float32, shape (..., n), optional
        Where to write the result; may be x itself (a float32 array) for an in-place
        transform.

    Returns
    -------
    ndarray of float32, shape (..., n)
        ``x @ scipy.linalg.hadamard(n)`` (the Sylvester, natural-order matrix; symmetric,
        so also ``H @ x`` per vector), computed in float32 with n log2(n) additions. Every
        ISA returns the same bits.

    Raises
    ------
    TypeError
        If x is not float32/float64, or out is not a native float32 ndarray.
    ValueError
        If x is a scalar, a float64 x holds a finite value beyond float32's range, n is
        not a power of two, or out has the wrong shape or is read-only.

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> pyw8a8.fwht(np.array([1, 0, 0, 0], dtype=np.float32))  # the first Hadamard column
    array([1., 1., 1., 1.], dtype=float32)
    >>> h = pyw8a8.fwht(np.eye(8, dtype=np.float32))  # the Hadamard matrix itself
    >>> bool(np.array_equal(h @ h, 8 * np.eye(8)))  # H H = n I
    True
    """
    arr = float_array(x, "x")
    n = arr.shape[-1]
    if not _is_power_of_two(n):
        raise ValueError(f"x must have a power-of-two length in its last dimension, got "
                         f"shape {arr.shape}")
    result = _fwht_rows(arr, out)
    if result.size:
        _rows.fwht_blocks(_cpu.active_ops(), result, n, _threads_for(result.size, n))
    if out is not None and result is not out:
        out[...] = result
        return out
    return result


def _fwht_rows(arr: npt.NDArray[np.floating], out: npt.NDArray[np.float32] | None
               ) -> npt.NDArray[np.float32]:
    """C-contiguous float32 memory holding `arr`, for `fwht` to transform in place: `out`
    itself where it is C-contiguous (checked first), else a new array."""
    if out is None:
        return np.array(arr, dtype=np.float32, order="C")
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise TypeError(f"out must be a float32 ndarray, got "
                        f"{getattr(out, 'dtype', type(out).__name__)}")
    if out.shape != arr.shape:
        raise ValueError(f"out has shape {out.shape}, expected {arr.shape}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    # A C-contiguous out is transformed in place; anything else through a copy.
    result = out if out.flags.c_contiguous else np.empty(arr.shape, np.float32)
    if result is not arr:  # fwht(x, out=x) transforms x where it is, with no copy
        np.copyto(result, arr)
    return result

def rotate(x: npt.ArrayLike, block: int = 128, seed: int = 0,
           pad: bool = False) -> npt.NDArray[np.float32]:
    """Block randomized Hadamard rotation of the last axis (orthonormal).

    Parameters
    ----------
    x : array_like of float32 or float64, shape (..., K)
        K a multiple of `block`, unless `pad`; either byte order.
    block : int
        Block size, a power of two from 16 to 4096.
    seed : int
        Seed of the random signs, in [0, 2**32 - 1].
    pad : bool
        Zero-pad a last partial block: the result has ``Kr = ceil(K / block) * block``
        features, the rotation of x with ``Kr - K`` zeros appended.

    Returns
    -------
    ndarray of float32, shape (..., Kr)
        Per block b of each row: ``hadamard(block) @ (d_b * x_b) / sqrt(block)``, with
        d_b the +-1 signs of the block's positions. The same floats that
        :func:`pyw8a8.matmul` quantizes for a weight packed with this rotation.
        ``Kr == K`` when block divides K.

    Raises
    ------
    TypeError
        If x is not float32/float64, or block/seed are not ints.
    ValueError
        If x is a scalar, a float64 x holds a finite value beyond float32's range, block
        is not a power of two in [16, 4096], seed is out of range, or K is not a multiple
        of block and `pad` is false (the message names ``pad=True`` and suggests a block
        that fits).

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.standard_normal((2, 256)).astype(np.float32)
    >>> ra, rb = pyw8a8.rotate(a, block=128), pyw8a8.rotate(b, block=128)
    >>> ra.shape, ra.dtype
    ((256,), dtype('float32'))
    >>> bool(np.isclose(ra @ rb, a @ b, rtol=1e-4))  # dot products are unchanged
    True
    >>> pyw8a8.rotate(np.ones((3, 100), np.float32), block=64, pad=True).shape
    (3, 128)
    """
    return _rotate(x, "x", block, seed, inverse=False, pad=pad)


def unrotate(y: npt.ArrayLike, block: int = 128, seed: int = 0) -> npt.NDArray[np.float32]:
    """Inverse (and transpose) of :func:`rotate` with the same block and seed.

    Parameters
    ----------
    y : array_like of float32 or float64, shape (..., K)
        K a multiple of `block`; either byte order.
    block : int
        Block size, a power of two from 16 to 4096.
    seed : int
        Seed of the random signs, in [0, 2**32 - 1].

    Returns
    -------
    ndarray of float32, shape (..., K)
        x with ``rotate(x, block, seed) == y`` up to float32 rounding.

    Raises
    ------
    TypeError, ValueError
        As :func:`rotate`, for `y`; with no `pad` here, a K that is not a multiple of
        block is always a ValueError (the message says to pass the whole zero-padded
        rotation: its inverse takes the padded vector, a multiple of `block`, and returns
        it whole; keep its first K features).

    See Also
    --------
    rotate : the forward rotation, and its `pad` for a K that `block` does not divide.

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    >>> y = pyw8a8.rotate(x, block=64, seed=7)
    >>> bool(np.allclose(pyw8a8.unrotate(y, block=64, seed=7), x, atol=1e-5))
    True
    """
    return _rotate(y, "y", block, seed, inverse=True)


def rotate_checked(x: npt.NDArray[np.float32], block: int, seed: int,
                   inverse: bool = False) -> npt.NDArray[np.float32]:
    """`rotate` (or, `inverse`, `unrotate`) of x for a caller that has checked its
    arguments: x a C-contiguous float32 array whose last axis is a multiple of `block`, a
    block and seed that `check_rotation` accepted (internal: the calls of an int8
    attention's decode step, where rotate's checks cost more than the transform)."""
    out = np.empty_like(x)
    rows = x.reshape(-1, x.shape[-1])
    _rows.rotate_rows(_cpu.active_ops(), rows, out.reshape(rows.shape), block, seed, inverse,
                      _threads_for(out.size, block))
    return out


def _rotate(x: npt.ArrayLike, name: str, block: int, seed: int, inverse: bool,
            pad: bool = False) -> npt.NDArray[np.float32]:
    """The block rotation (or its inverse) of the last axis of x, as float32."""
    x2d, shape = _as_rows(x, name)
    block, seed = check_rotation(shape[-1], block, seed, name=name, pad=pad,
                                 caller="unrotate" if inverse else "rotate")
    kr = rotated_length(shape[-1], block)
    out = np.empty((x2d.shape[0], kr), dtype=np.float32)
    _rows.rotate_rows(_cpu.active_ops(), x2d, out, block, seed, inverse,
                          _threads_for(out.size, block))
    return out.reshape(shape[:-1] + (kr,))
