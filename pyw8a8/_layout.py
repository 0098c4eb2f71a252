"""The kernels' memory layout, as the Python modules see it: the C core's constants
(``_simd/common.h``, exported by ``_kernels``) and the one rounding rule every padded size
follows, and the alignment of the arrays the kernels stream."""
import errno
import math
import mmap

import numpy as np

# Re-exported: the C core's constants (from _kernels) and the output rule (empty_output),
# which lives with the memory of outputs (_outputs), allocated without running Python code
# by the compiled call (_kernels.call).
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


#: From this size on a weight's array is a private anonymous mapping of its own, advised to
#: the kernel for transparent huge pages before its first write: where THP is "madvise"
#: (the usual default) nothing else asks for them (numpy's arrays and torch's tensors had
#: none on an AMX Xeon), and a weight streamed once a call, as in every one-token decode
#: step, then misses the TLB each 4 KiB: Gemma 3's 1 x 640 x 262144 LM head took 1.5x as
#: long from 4 KiB pages there.
HUGE_PAGE_FROM_BYTES = 1 << 22


def empty_aligned(shape, dtype):
    """An uninitialized C-contiguous array for a weight, whose data starts on an
    ALIGN_BYTES boundary: a view of a slightly larger buffer, or from
    HUGE_PAGE_FROM_BYTES on (on Linux) a page-aligned mapping advised for huge pages."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= HUGE_PAGE_FROM_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as exc:  # out of memory is a MemoryError, as numpy's is
            if exc.errno == errno.ENOMEM:
                raise MemoryError(f"cannot allocate {nbytes} bytes for a weight") from None
            raise
        memory.madvise(mmap.MADV_HUGEPAGE)
        return np.frombuffer(memory, dtype=dtype).reshape(shape)
    buf = np.empty(nbytes + ALIGN_BYTES, dtype=np.uint8)
    return np.ndarray(shape, dtype, buf, -data_address(buf) % ALIGN_BYTES)


def is_aligned(arr):
    """Whether arr's data starts on an ALIGN_BYTES boundary."""
    return data_address(arr) % ALIGN_BYTES == 0
