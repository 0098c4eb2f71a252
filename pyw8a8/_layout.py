"""The kernels' memory layout, as the Python modules see it: the C core's constants
(``_simd/common.h``, exported by ``_kernels``) and the one rounding rule every padded size
follows, and the alignment of the arrays the kernels stream."""
import math

import numpy as np

# Re-exported: the C core's constants (from _kernels) and the output rule (empty_output),
# which lives with the memory of outputs (_outputs), allocated without running Python code
# by the settled call (_kernels.settled_product).
from ._kernels import W8_A_ROW_PAD, W8_EXACT_K, W8_KPAD, W8_NR, data_address  # noqa: F401
from ._outputs import (  # noqa: F401
    ALIGN_BYTES,
    ALIGNED_FROM_BYTES,
    RECYCLED_BUFFERS,
    RECYCLED_BYTES,
    empty_output,
    recycled_bytes,
)


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


def is_aligned(arr):
    """Whether arr's data starts on an ALIGN_BYTES boundary."""
    return data_address(arr) % ALIGN_BYTES == 0
