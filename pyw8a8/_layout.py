"""The kernels' memory layout, as the Python modules see it: the C core's constants
(``_simd/common.h``, exported by ``_kernels``) and the one rounding rule every padded size
follows, and the alignment of the arrays the kernels stream."""
import math

import numpy as np

from ._kernels import W8_A_ROW_PAD, W8_EXACT_K, W8_KPAD, W8_NR, data_address  # noqa: F401 (re-exported)

# Packed panels and float outputs start on a cache line, so that no 64-byte quad row, tile
# row or zmm store straddles two lines (numpy aligns to 16 bytes only): with the panels and
# the output 16 bytes off, the AMX product at 256 x 1152 x 6912 took 1.5x as long, and a
# split line costs the AVX-512 loads too.
ALIGN_BYTES = 64
# Smaller outputs (empty_output) come straight from np.empty: aligning costs 0.4 us a call
# (a view of a larger buffer), more than the split lines cost an output written once by a
# call that reads 16 or more weight bytes per output byte (a decode step's, M = 1).
ALIGNED_FROM_BYTES = 64 * 1024


def padded(n, multiple):
    """`n` rounded up to a multiple of `multiple` (K to 64, N to 16, rows to whole tiles, K
    to a rotation block)."""
    return -(-n // multiple) * multiple


def packed_k(k, rotate, block):
    """Packed K of a weight of K = `k` features: its rotated length (K rounded up to the
    rotation block) rounded up to a multiple of 64."""
    return padded(padded(k, block) if rotate else k, W8_KPAD)


def empty_aligned(shape, dtype):
    """An uninitialized C-contiguous array whose data starts on an ALIGN_BYTES boundary (a
    view of a slightly larger buffer)."""
    dtype = np.dtype(dtype)
    buf = np.empty(math.prod(shape) * dtype.itemsize + ALIGN_BYTES, dtype=np.uint8)
    return np.ndarray(shape, dtype, buf, -data_address(buf) % ALIGN_BYTES)


def empty_output(shape, dtype):
    """An uninitialized C-contiguous output array: aligned (empty_aligned) from
    ALIGNED_FROM_BYTES, below that wherever numpy puts it."""
    if math.prod(shape) * dtype.itemsize < ALIGNED_FROM_BYTES:
        return np.empty(shape, dtype)
    return empty_aligned(shape, dtype)


def is_aligned(arr):
    """Whether arr's data starts on an ALIGN_BYTES boundary."""
    return data_address(arr) % ALIGN_BYTES == 0
