"""The kernels' memory layout, as the Python modules see it: the C core's constants
(``_simd/common.h``, exported by ``_kernels``) and the one rounding rule every padded size
follows."""
from ._kernels import W8_A_ROW_PAD, W8_EXACT_K, W8_KPAD, W8_NR  # noqa: F401 (re-exported)


def padded(n, multiple):
    """`n` rounded up to a multiple of `multiple` (K to 64, N to 16, rows to whole tiles, K
    to a rotation block)."""
    return -(-n // multiple) * multiple


def packed_k(k, rotate, block):
    """Packed K of a weight of K = `k` features: its rotated length (K rounded up to the
    rotation block) rounded up to a multiple of 64."""
    return padded(padded(k, block) if rotate else k, W8_KPAD)
