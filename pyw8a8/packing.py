"""Packed int8 weights: quantized once, stored in the layout every microkernel reads.

The layout and its packing and unpacking are ``_packed/panels.py``'s; the saved format
(files and pickles) is ``_packed/saved.py``'s. A rotated weight whose block does not divide
K holds its rotated rows, K rounded up to the block (Kr), and Kp covers Kr.

A :class:`PackedWeight` pickles as its packed bytes, scales, sums and settings (no float
copy) and works on every ISA whatever its encoding, so it can be sent to
another process or machine (a process pool, a dask cluster: see :mod:`pyw8a8.dask`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from . import _cpu, _kernels
from ._layout import HUGE_PAGE_FROM_BYTES, empty_aligned, is_aligned, packed_k, padded
from ._packed import panels as _panels
from ._packed import saved as _saved
from ._packed.panels import ENCODINGS
from ._validation import float_array, int8_matrix, positive_int
from .quantize import quantize_rows
from .rotation import auto_block, check_rotation, unrotate


def resolve_encoding(encoding):
    """For 'auto', the encoding the active ISA runs best (its registry entry): 'biased' on
    x86 (u8 x s8 instructions), 'signed' on Arm (sdot)."""
    if encoding == "auto":
        return _cpu.active_ops().auto_encoding
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be 'biased', 'signed' or 'auto', got {encoding!r}")
    return encoding


_Packed = TypeVar("_Packed", bound="PackedWeight")  # from_dict makes the class it is called on


class PackedWeight:
    """An int8 weight matrix in kernel layout, with its per-output-channel scales.

    Created by :func:`pack_weight` (float weights, quantized there; the float weights are
    not kept) or :func:`pack_quantized` (int8 weights quantized elsewhere, as they are).

    Attributes
    ----------
    shape : tuple of int
        (N, K): output channels, input features.
    encoding : {'biased', 'signed'}
        Bytes stored as ``q + 128`` (uint8) or as ``q`` (int8).
    scales : ndarray of float32, shape (N,)
        ``max|w[n]| / 127`` (of the rotated row when `rotate`), or the scales given to
        :func:`pack_quantized`.
    rotate : bool
        Whether rows were rotated (block Walsh-Hadamard) before quantization.
    block, seed : int
        The rotation's block size (a power of two from 16 to 4096) and seed (in
        [0, 2**32 - 1]).  `rotate`, `block` and `seed` are read-only: the packed bytes
        were made with them (setting one raises AttributeError; repack instead).  The
        arrays can be replaced; every product checks them first (:meth:`check_layout`).
    rotated_k : int
        Features of the stored (rotated) rows: K, or when rotated and `block` does not
        divide K, K rounded up to `block` (the last block zero-padded before rotating;
        :func:`pyw8a8.matmul` pads the activations the same way, fused, without a copy).

    A PackedWeight pickles (and ``copy.deepcopy``-s) as its packed bytes, scales, sums,
    settings and format version, with no float copy; its `encoding` works on every
    ISA, so it can be unpickled on a CPU whose ISAs differ.

    Examples
    --------
    >>> import pickle
    >>> import numpy as np
    >>> import pyw8a8
    >>> w = np.random.default_rng(0).standard_normal((48, 100)).astype(np.float32)
    >>> packed = pyw8a8.pack_weight(w)
    >>> packed  # doctest: +ELLIPSIS
    PackedWeight(shape=(48, 100), ..., padded K=100 to 128 (last block zero-padded), nbytes=...)
    >>> packed.shape, packed.rotated_k, packed.scales.dtype
    ((48, 100), 128, dtype('float32'))
    >>> err = np.abs(packed.dequantize() - w).max()  # within half a step of each row
    >>> bool(err <= packed.scales.max() / 2 * np.sqrt(128))
    True
    >>> again = pickle.loads(pickle.dumps(packed))  # packed bytes only, no float copy
    >>> bool(np.array_equal(again.int8(), packed.int8()))
    True
    """

    __slots__ = ("shape", "encoding", "scales", "_rotate", "_block", "_seed", "panels",
                 "psum", "_plan")

    shape: tuple[int, int]
    encoding: str
    scales: npt.NDArray[np.float32]
    panels: npt.NDArray[np.uint8]
    psum: npt.NDArray[np.int32]

    def __init__(self, shape: tuple[int, int], encoding: str, panels: npt.NDArray[np.uint8],
                 psum: npt.NDArray[np.int32], scales: npt.NDArray[np.float32],
                 rotate: bool = False, block: int = 128, seed: int = 0) -> None:
        self.shape = (int(shape[0]), int(shape[1]))
        self.encoding = encoding
        self.panels = panels
        self.psum = psum
        self.scales = scales
        # Checked here, and fixed from here on: the packed bytes were rotated with them,
        # and the kernels trust them (a block that is not a power of two would make the
        # fused rotation write past its rows).
        self._rotate = _saved.check_rotate(rotate)
        self._block = _saved.check_block(block)
        self._seed = _saved.check_seed(seed)
        self._plan: _kernels.WeightPlan | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # Replacing an attribute (an array, the shape, the encoding) drops the compiled
        # plan, so the next product checks the weight again and builds a new one: the
        # kernels (and matmul's compiled call, which reads _plan alone) trust a plan.
        object.__setattr__(self, name, value)
        if name != "_plan":
            object.__setattr__(self, "_plan", None)

    @property
    def rotate(self) -> bool:
        """Whether the rows were rotated."""
        return self._rotate

    @property
    def block(self) -> int:
        """The rotation's block size."""
        return self._block

    @property
    def seed(self) -> int:
        """The rotation's seed."""
        return self._seed

    def plan(self) -> _kernels.WeightPlan:
        """The per-weight half of a product (a ``_kernels.WeightPlan``), built and checked
        once; rebuilt (and checked again) only if an attribute has been replaced since.
        Panels that do not start on a 64-byte boundary are replaced by an aligned copy."""
        if self._plan is None:
            self._plan = self._new_plan(check_contents=False)
        return self._plan

    def check_contents(self) -> None:
        """Raise ValueError, naming the array, unless the arrays hold what
        :func:`pack_weight` makes of int8 weights: values in [-127, 127], zero padding,
        matching compensation sums, finite non-negative scales (O(N K); files are read so).
        """
        self._plan = self._new_plan(check_contents=True)

    def _new_plan(self, check_contents: bool) -> _kernels.WeightPlan:
        self.check_layout()
        if not is_aligned(self.panels):
            # Panels unpickled, loaded or built by hand: copied once to a cache-line
            # boundary, where every kernel load of them is one line (_layout.py).
            aligned = empty_aligned(self.panels.shape, np.uint8)
            aligned[...] = self.panels
            self.panels = aligned
        return _kernels.WeightPlan(self.panels, self.psum, self.scales, self.shape,
                                   self.encoding, self._format_version(), self.rotate,
                                   self.block, self.seed, check_contents)

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed panels, the scales and the compensation sums."""
        return self.panels.nbytes + self.scales.nbytes + self.psum.nbytes

    def check_layout(self) -> None:
        """Raise ValueError unless the arrays have the dtypes, shapes and C order that
        `shape`, `encoding` and the rotation imply.

        O(1).  The kernels trust the arrays, so every product checks a hand-built or
        altered weight first, on every ISA (the compiled call path whenever an attribute
        has been replaced since its last check).  `rotate`, `block` and `seed` are checked
        when they are set.
        """
        try:
            kp = self.kp
        except (TypeError, ValueError, IndexError):
            raise ValueError(f"packed weight shape {self.shape!r} is not two ints") from None
        _panels.check_layout(self.shape, kp, self.encoding,
                             (self.panels, self.psum, self.scales))

    @property
    def kp(self) -> int:
        """Packed K: `rotated_k` rounded up to a multiple of 64."""
        return packed_k(self.shape[1], self.rotate, self.block)

    @property
    def rotated_k(self) -> int:
        """Features of the stored (rotated) rows (see the class's attributes)."""
        return padded(self.shape[1], self.block) if self.rotate else self.shape[1]

    def __repr__(self) -> str:
        rot = ""
        if self.rotate:
            rot = f", rotate=True, block={self.block}, seed={self.seed}"
            if self.rotated_k != self.shape[1]:
                rot += (f", padded K={self.shape[1]} to {self.rotated_k} "
                        "(last block zero-padded)")
        return (f"PackedWeight(shape={self.shape}, encoding={self.encoding!r}{rot}, "
                f"nbytes={self.nbytes})")

    def __reduce__(self):
        # Packed bytes, sums, scales and settings only (no float copy); numpy pickles the
        # arrays as raw buffers (out of band with protocol 5, as dask sends them).
        return (_unpickle, (self._format_version(), self.shape, self.encoding, self.rotate,
                            self.block, self.seed, self.panels, self.psum, self.scales))

    def _format_version(self) -> int:
        return _saved.format_version(self.shape[1], self.rotated_k)

    def int8(self) -> npt.NDArray[np.int8]:
        """The quantized weights.

        Returns
        -------
        ndarray of int8, shape (N, rotated_k)
            In the rotated basis when `rotate` is True (then `rotated_k` columns: K, or K
            rounded up to `block` when the last block was zero-padded); else (N, K).
        """
        return _panels.unpack_panels(self.panels, self.shape[0], self.kp, self.rotated_k,
                                     self.encoding)

    def quantized(self) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
        """The int8 weights and per-channel scales the kernels multiply, for reuse elsewhere.

        ``pack_quantized(*packed.quantized())`` multiplies bit-identically to `packed`
        (with any `encoding`).

        Returns
        -------
        qw : ndarray of int8, shape (N, K), C-contiguous
            Values in [-127, 127]; a fresh copy.
        scale : ndarray of float32, shape (N,)
            Per output channel; a fresh copy.  ``qw * scale[:, None]`` is what
            :meth:`dequantize` returns.

        Raises
        ------
        ValueError
            If the weight is rotated (``rotate=True``): its int8 values are in the rotated
            basis (rows times the block Walsh-Hadamard transform), not a quantization of the
            weights themselves, and no int8 (N, K) in the original basis multiplies the
            same.  Use :meth:`int8` for the rotated values (they pair with
            ``pyw8a8.rotate(x, block, seed, pad=True)``), :meth:`dequantize` for float
            weights, or pack with ``rotate=False``.  Also if the arrays no longer fit the
            weight (see :meth:`check_layout`).

        Examples
        --------
        >>> import numpy as np, pyw8a8
        >>> w = np.array([[1.0, -0.25, 0.0], [-4.0, 1.0, 3.0]], dtype=np.float32)
        >>> qw, scale = pyw8a8.pack_weight(w, rotate=False).quantized()
        >>> qw.dtype, qw.shape, scale.dtype, scale.shape
        (dtype('int8'), (2, 3), dtype('float32'), (2,))
        >>> qw.tolist()
        [[127, -32, 0], [-127, 32, 95]]
        """
        if self.rotate:
            raise ValueError(
                "quantized() needs an unrotated weight; this one was rotated before "
                f"quantization (block={self.block}, seed={self.seed}), so its int8 values "
                "are in the rotated basis, not a quantization of the weights: use int8() "
                "for them (to pair with pyw8a8.rotate(x, block, seed, pad=True)), "
                "dequantize() for float weights, or pack_weight(w, rotate=False)")
        self.check_layout()  # int8() reads the panels by the shape and encoding
        return self.int8(), self.scales.copy()

    def dequantize(self) -> npt.NDArray[np.float32]:
        """The float32 approximation of the original weights.

        Returns
        -------
        ndarray of float32, shape (N, K)
            ``q * scale`` per row, rotated back when the weight was rotated.
        """
        w = self.int8().astype(np.float32) * self.scales[:, None]
        if self.rotate and w.size:
            w = unrotate(w, block=self.block, seed=self.seed)
        return np.ascontiguousarray(w[:, :self.shape[1]])

    def to_dict(self) -> dict[str, npt.NDArray[Any]]:
        """Arrays describing this weight, for ``np.savez`` (see :meth:`from_dict`)."""
        return _saved.as_dict(self)

    @classmethod
    def from_dict(cls: type[_Packed], d: Mapping[str, Any]) -> _Packed:
        """Rebuild a weight from :meth:`to_dict` arrays, checking every size and dtype.

        Raises
        ------
        ValueError
            If an array is missing, unreadable (a damaged ``np.load`` file), of the wrong
            dtype or shape, or the format is unknown; or if the contents are not what
            :func:`pack_weight` makes (-128, non-zero padding, inconsistent sums, negative
            or non-finite scales).
        """
        return _saved.read_dict(cls, d)


def _unpickle(version, shape, encoding, rotate, block, seed, panels, psum, scales):
    """Rebuild a pickled PackedWeight: its format, settings and layout checked, not its
    contents (a pickle is trusted code; unpickling stays O(1) beyond the bytes' copy)."""
    if isinstance(panels, np.ndarray) and panels.nbytes >= HUGE_PAGE_FROM_BYTES:
        # numpy's memory holds the unpickled bytes: a large weight moves to one of its own,
        # eligible for huge pages (_layout.py says why).
        moved = empty_aligned(panels.shape, panels.dtype)
        moved[...] = panels
        panels = moved
    return _saved.checked(PackedWeight, _saved.pickled_version(version), shape, encoding,
                          rotate, block, seed, panels, psum, scales)


def pack_int8(q, scales, encoding="auto", rotate=False, block=128, seed=0):
    """Pack already-quantized weights (internal; q (N, K) int8 in [-127, 127])."""
    encoding = resolve_encoding(encoding)
    panels, psum = _panels.pack_int8_rows(q, encoding)
    return PackedWeight(q.shape, encoding, panels, psum,
                        np.ascontiguousarray(scales, dtype=np.float32), rotate, block, seed)


def _channel_scales(scale, n):
    """`scale` as float32 (N,), checked: a float array of shape (N,), finite and >= 0."""
    arr = np.asarray(scale)
    if arr.dtype.kind != "f":
        raise TypeError(f"scale must be a float array, got dtype {arr.dtype}")
    if arr.shape != (n,):
        raise ValueError(f"scale must have shape ({n},), one per row of qw, got shape "
                         f"{arr.shape}")
    with np.errstate(over="ignore"):  # beyond float32's range is reported below
        # A fresh aligned copy: the weight must not change with the caller's array.
        scales = np.array(arr, dtype=np.float32)
    bad = ~np.isfinite(scales) | (scales < 0)
    if bad.any():
        i = int(np.argmax(bad))
        beyond = (" (beyond float32's range)" if np.isfinite(arr[i]) and
                  not np.isfinite(scales[i]) else "")
        raise ValueError(f"scale must be finite and >= 0, got {arr[i]}{beyond} for row {i}")
    return scales


def pack_quantized(qw: npt.ArrayLike, scale: npt.ArrayLike, *,
                   encoding: Literal["auto", "biased", "signed"] = "auto") -> PackedWeight:
    """Store int8 weights quantized elsewhere, as they are, in the kernels' layout.

    For weights from another tool (a PyTorch per-channel qint8 ``Linear``:
    ``weight().int_repr()`` and ``weight().q_per_channel_scales()``, with zero points 0),
    so that pyw8a8 multiplies the very same int8 weights.  The product is
    ``s_a[m] * scale[n] * sum_k qa[m, k] * qw[n, k]``, exactly as for :func:`pack_weight`.

    Rotation is not offered: it has to happen before quantization (the rotated float rows
    are what gets quantized).  Rotating int8 rows gives non-integer values that would need
    requantizing, and those would no longer be the weights you passed.

    Parameters
    ----------
    qw : array_like of int8, shape (N, K)
        Quantized weights in the ``torch.nn.Linear.weight`` layout, values in [-127, 127];
        any memory order (copied into the packed layout).
    scale : array_like of float, shape (N,)
        One scale per output channel (row of `qw`), finite and >= 0; the weight is
        ``qw * scale[:, None]``.  Stored as float32, the kernels' precision (float64
        scales are rounded to the nearest float32).
    encoding : {'auto', 'biased', 'signed'}
        As in :func:`pack_weight`.

    Returns
    -------
    PackedWeight
        ``shape == (N, K)``, ``rotate == False``; ``quantized()`` gives `qw` and `scale`
        (as float32) back.

    Raises
    ------
    TypeError
        If `qw` is not an int8 array or `scale` not a float array.
    ValueError
        If `qw` is not 2-D or holds -128: pyw8a8's int8 is symmetric, [-127, 127]
        (symmetric schemes elsewhere may produce -128, PyTorch's qint8 among them; clip with
        ``np.clip(qw, -127, 127)``, which moves those weights by one step); if `scale` is
        not of shape (N,), or holds a negative, NaN, Inf or beyond-float32 value (the
        message names the row); or if `encoding` is unknown.

    Examples
    --------
    >>> import numpy as np, pyw8a8
    >>> qw = np.array([[127, -3, 0], [5, -127, 64]], dtype=np.int8)
    >>> scale = np.array([0.5, 0.25], dtype=np.float32)
    >>> packed = pyw8a8.pack_quantized(qw, scale)
    >>> packed.shape, packed.rotate
    ((2, 3), False)

    A row of activations whose max ``|x|`` is 127 quantizes to itself (scale 1), so the
    product is exact: ``0.5 * (127*127 - 6)`` and ``0.25 * (635 - 254 - 64)``.

    >>> pyw8a8.matmul(np.array([[127.0, 2.0, -1.0]], dtype=np.float32), packed).tolist()
    [[8061.5, 79.25]]
    """
    q = int8_matrix(qw, "qw")
    n, k = q.shape
    scales = _channel_scales(scale, n)
    # The block of an unrotated weight is only recorded; take the one pack_weight(w,
    # rotate=False) records, since matmul_pair requires two weights' (rotate, block,
    # seed) to match.
    return pack_int8(q, scales, encoding, rotate=False, block=auto_block(k))


def pack_weight(w: npt.ArrayLike, *, encoding: Literal["auto", "biased", "signed"] = "auto",
                rotate: bool = True, block: int | Literal["auto"] = "auto", seed: int = 0,
                pad: bool | None = None) -> PackedWeight:
    """Quantize a weight matrix once and store it in the kernels' layout.

    Parameters
    ----------
    w : array_like of float32 or float64, shape (N, K)
        Weights in the ``torch.nn.Linear.weight`` layout (out_features, in_features).
    encoding : {'auto', 'biased', 'signed'}
        'biased' stores ``q + 128`` as uint8 (what x86 u8 x s8 instructions want; the
        kernel subtracts ``128 * sum(qa)``), 'signed' stores int8. 'auto' picks the active
        ISA's own ('biased' on x86, 'signed' on Arm). Every ISA computes the same exact
        results with either.
    rotate : bool
        Rotate each row by the block randomized Walsh-Hadamard transform before quantizing
        (activations are then rotated by :func:`matmul` with the same transform, fused
        with their quantization). On by default: it spreads outlier features, which
        otherwise set a coarse per-row scale (see :mod:`pyw8a8.rotation`).
    block : int or 'auto'
        Rotation block size, a power of two from 16 to 4096. 'auto' (the default) takes
        128, or for K below 128 the smallest power of two from 16 that covers K, and
        zero-pads the last block, so every K packs; the repr says which block and padding.
    seed : int
        Seed of the rotation's random signs, in [0, 2**32 - 1].
    pad : bool, optional
        Zero-pad the last block when `block` does not divide K: the weight's rows are
        rotated as if K were rounded up to `block` with zeros (``rotated_k`` features),
        and :func:`matmul` pads the activations in the same way inside its fused
        quantizer (no copy of x). The rotation stays orthonormal on the padded space and
        the zeros add nothing to the product. Default: True for ``block='auto'``, False
        for an explicit block, which then has to divide K.

    Returns
    -------
    PackedWeight
        ``shape == (N, K)``; the float weights are not kept.

    Raises
    ------
    TypeError
        If w is not a float32/float64 array.
    ValueError
        If w is not 2-D, holds NaN/Inf (the message names the row), or `encoding`,
        `block`, `seed` are invalid, or (when rotating) an explicit `block` does not divide
        K and `pad` is not set: the message names ``pad=True`` and suggests a block that
        divides K, if any; ``rotate=False`` packs any K too.

    Examples
    --------
    >>> import numpy as np, pyw8a8
    >>> w = np.random.default_rng(0).standard_normal((48, 100)).astype(np.float32)
    >>> packed = pyw8a8.pack_weight(w)
    >>> packed.shape, packed.rotate, packed.block, packed.rotated_k
    ((48, 100), True, 128, 128)
    >>> err = np.abs(packed.dequantize() - w).max() / np.abs(w).max()
    >>> bool(err < 0.02)
    True
    """
    arr = float_array(w, "w", ndim=2)
    encoding = resolve_encoding(encoding)
    n, k = arr.shape
    if isinstance(block, str):
        if block != "auto":
            raise ValueError(f"block must be a power of two or 'auto', got {block!r}")
        size = auto_block(k)
        pad = True if pad is None else pad
    else:
        size = positive_int(block, "block")
    seed = positive_int(seed, "seed", minimum=0)
    if pad not in (None, True, False):
        raise TypeError(f"pad must be True, False or None, got {pad!r}")
    if rotate:
        size, seed = check_rotation(k, size, seed, name="w", pad=bool(pad))
    kp = packed_k(k, rotate, size)
    panels, psum = _panels.empty_arrays(n, kp, encoding)
    scales = np.empty(n, dtype=np.float32)
    # Block by block, rotation fused with quantization: no float copy of the whole weight.
    for r0 in range(0, n, _panels.PACK_ROWS):
        rows = np.ascontiguousarray(arr[r0:r0 + _panels.PACK_ROWS])
        q, scales[r0:r0 + rows.shape[0]], _ = quantize_rows(
            rows, kp, name="w", shape=arr.shape, block=size if rotate and k else 0,
            seed=seed, row_offset=r0)
        _panels.fill_panels(panels, psum, r0, q[:rows.shape[0]].view(np.int8), encoding)
    return PackedWeight((n, k), encoding, panels, psum, scales, rotate, size, seed)
