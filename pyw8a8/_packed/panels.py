"""The panel layout of a packed weight, written once: its arrays' dtypes and shapes, the
packing of int8 rows into panels and its inverse, and the check that arrays fit it.

Layout (see ``_simd/common.h``): K is zero-padded to a multiple of 64 (Kp) and N to a
multiple of 16 (Np); the bytes form Np/16 panels of Kp/4 quad rows, each quad row holding
4 consecutive K values of 16 output channels (64 bytes: one zmm, two ymm, one AMX tile row).
'biased' weights store ``q + 128`` as uint8, 'signed' ones ``q`` with prefix sums over
64-K chunks (the compensation of kernels that shift the activations by +128 against signed
weights, W8_CORR_COL).
"""
import numpy as np

from .._layout import W8_KPAD, W8_NR, empty_aligned, padded

ENCODINGS = ("biased", "signed")
_U8, _I32, _F32 = np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.float32)
# The XOR that turns a signed byte into its biased encoding (q + 128) and back.
_BIAS = np.uint8(0x80)
# Rows packed at a time: bounds the temporaries of packing a large weight (the 262144 x
# 640 embedding of a language model) to a few tens of MB.
PACK_ROWS = 8192


def array_layout(n, kp, encoding):
    """(dtype, shape) of the panels, psum and scales arrays of an (N, K) weight packed
    into Kp columns."""
    return ((_U8, (padded(n, W8_NR) // W8_NR, kp // 4, 4 * W8_NR)),
            (_I32, (padded(n, W8_NR) if encoding == "signed" else 0, kp // W8_KPAD + 1)),
            (_F32, (n,)))


def empty_arrays(n, kp, encoding):
    """Uninitialized panels and compensation sums of an (N, K) weight packed into Kp."""
    (_, panels_shape), (_, psum_shape), _ = array_layout(n, kp, encoding)
    return empty_aligned(panels_shape, np.uint8), np.empty(psum_shape, dtype=np.int32)


def prefix_sums(q, kp, out):
    """The prefix sums over 64-value chunks of int8 rows q ((rows, K), zero-padded to kp)
    into out ((rows, kp/64 + 1) int32): the compensation of the +128 encodings over any
    K-range (W8_CORR_* in ``_simd/common.h``; the fused quantizer computes the same in C)."""
    rows, k = q.shape
    full = q
    if k != kp:
        full = np.zeros((rows, kp), dtype=np.int8)
        full[:, :k] = q
    out[:, 0] = 0
    np.cumsum(full.reshape(rows, kp // W8_KPAD, W8_KPAD).sum(
        axis=2, dtype=np.int32), axis=1, out=out[:, 1:])


def fill_panels(panels, psum, row0, q, encoding):
    """Write quantized rows q ((rows, Kp) int8, zero-padded along K) of channels row0...
    into their panels (row0 a multiple of 16) and, for signed weights, their prefix sums;
    the inverse of `unpack_panels`."""
    rows, kp = q.shape
    full = q
    if rows % W8_NR:  # the last panel's missing channels encode 0
        full = np.zeros((padded(rows, W8_NR), kp), dtype=np.int8)
        full[:rows] = q
    raw = full.view(np.uint8)
    if encoding == "biased":
        raw = raw ^ _BIAS  # padding becomes 128, i.e. q = 0
    p0 = row0 // W8_NR
    p1 = p0 + full.shape[0] // W8_NR
    panels[p0:p1] = raw.reshape(p1 - p0, W8_NR, kp // 4, 4).transpose(0, 2, 1, 3).reshape(
        p1 - p0, kp // 4, 4 * W8_NR)
    if encoding == "signed":
        prefix_sums(full, kp, psum[row0:row0 + full.shape[0]])


def unpack_panels(panels, n, kp, k, encoding):
    """The int8 rows (N, k) stored in `panels` (of Kp columns, k <= Kp): the inverse of
    `fill_panels`, as a fresh C-contiguous array."""
    count = panels.shape[0]  # explicit sizes: -1 is ambiguous when K == 0
    raw = panels.reshape(count, kp // 4, W8_NR, 4).transpose(0, 2, 1, 3)
    raw = raw.reshape(count * W8_NR, kp)[:n, :k]
    if encoding == "biased":
        raw = raw ^ _BIAS
    return np.ascontiguousarray(raw).view(np.int8)


def pack_int8_rows(q, encoding):
    """The panels and sums of int8 rows q ((N, K), values in [-127, 127]) packed into Kp =
    K rounded up to 64, PACK_ROWS rows at a time."""
    n, k = q.shape
    kp = padded(k, W8_KPAD)
    panels, psum = empty_arrays(n, kp, encoding)
    for r0 in range(0, n, PACK_ROWS):
        rows = q[r0:r0 + PACK_ROWS]
        chunk = np.zeros((rows.shape[0], kp), dtype=np.int8)
        chunk[:, :k] = rows
        fill_panels(panels, psum, r0, chunk, encoding)
    if n == 0:
        panels.fill(0x80 if encoding == "biased" else 0)
    return panels, psum


def fits_layout(shape, kp, encoding, arrays):
    """Whether `arrays` (panels, psum, scales) are aligned C-contiguous arrays of the
    dtypes and shapes the layout of an (N, K) = `shape` weight of Kp columns implies:
    the fast check of every product (a few attribute comparisons)."""
    try:
        n, k = shape
        if n < 0 or k < 0 or encoding not in ENCODINGS:
            return False
        return all(isinstance(a, np.ndarray) and a.shape == s and a.dtype == d
                   and a.flags.c_contiguous and a.flags.aligned
                   for a, (d, s) in zip(arrays, array_layout(n, kp, encoding)))
    except (TypeError, ValueError, ZeroDivisionError):
        return False


def check_layout(shape, kp, encoding, arrays):
    """Raise ValueError, naming the setting or array, unless `fits_layout`."""
    if fits_layout(shape, kp, encoding, arrays):
        return
    if encoding not in ENCODINGS:
        raise ValueError(f"packed weight encoding {encoding!r} is not one of {ENCODINGS}")
    if min(shape) < 0:
        raise ValueError(f"packed weight shape {shape} is negative")
    for name, arr, (dtype, want) in zip(("panels", "psum", "scales"), arrays,
                                        array_layout(shape[0], kp, encoding)):
        if not (isinstance(arr, np.ndarray) and arr.dtype == dtype and
                arr.shape == want and arr.flags.c_contiguous and arr.flags.aligned):
            got = (f"{arr.dtype} {arr.shape}" if isinstance(arr, np.ndarray)
                   else type(arr).__name__)
            if isinstance(arr, np.ndarray) and not arr.flags.c_contiguous:
                got += " not C-contiguous"
            if isinstance(arr, np.ndarray) and not arr.flags.aligned:
                got += " unaligned"
            raise ValueError(f"packed weight array {name!r}: expected aligned "
                             f"C-contiguous {np.dtype(dtype)} {want}, got {got}")
    raise ValueError(f"packed weight shape {shape!r} is not two ints")
