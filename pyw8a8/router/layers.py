"""The layers a router hands to a model: W8A8 `Int8Linear` and `Int8GatedLinear`, float32
`FloatLinear`, and `SeparatePair`.

A W8A8 layer packs its weight lazily, on first use, and then drops the float reference:
the packed int8 weight replaces the float one.  The kernels come from a backend, by default
`COMPILED_KERNELS`; any object with the same four functions can stand in for it.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt

from .._validation import bias_vector
from ..matmul import matmul, matmul_pair
from ..packing import PackedWeight, pack_weight
from ..scaling import equalize_ffn
from .cache import WeightCache

__all__ = ["COMPILED_KERNELS", "FloatLinear", "Int8GatedLinear", "Int8Linear", "SeparatePair",
           "float_linear"]

logger = logging.getLogger("pyw8a8")

#: The kernels a layer calls unless it is given a ``backend``: pyw8a8's compiled ones.
#: A backend is any object with these four functions (the tests pass an exact float fake).
COMPILED_KERNELS = SimpleNamespace(
    pack_weight=pack_weight, matmul=matmul, matmul_pair=matmul_pair, equalize_ffn=equalize_ffn
)


def _release_pages(array) -> None:
    """Best effort: drop this process's resident pages of a memory-mapped weight.

    After packing, the float weight is no longer needed in RAM; for a
    read-only file mapping the pages are simply re-read from the file if
    touched again, so this is always safe.
    """
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    mm = getattr(base, "_mmap", None)
    if isinstance(mm, mmap.mmap) and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            mm.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):  # pragma: no cover
            pass


def check_weight(w: npt.ArrayLike, name: str = "weight") -> npt.NDArray[np.float32]:
    """`w` as a 2-D float32 array, the caller's object itself when it already is one."""
    # Keep the caller's object when possible: the cache keys on its identity.
    if not isinstance(w, np.ndarray):
        w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"{name}: weight must be 2-D (N, K), got shape {w.shape}")
    if w.dtype != np.float32:
        w = w.astype(np.float32)
    return w


def _layer_bias(bias: npt.ArrayLike | None, shape: tuple[int, ...],
                name: str | None) -> npt.NDArray[np.float32] | None:
    """A layer's bias as float32 (N,), or None; the error names the layer."""
    return bias_vector(bias, shape[0], f"{name or 'layer'}: bias")


def _as_input(x: npt.ArrayLike, k: int, name: str) -> npt.NDArray[np.float32]:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"{name}: expected input of shape (M, {k}), got {x.shape}")
    return x


class WeightSource:
    """A float weight, possibly replaced (equalized by its FFN group) before it is first used."""

    __slots__ = ("w", "group", "role")

    def __init__(self, w, group=None, role=None):
        self.w = w
        self.group = group
        self.role = role

    def resolve(self):
        if self.group is not None:
            return self.group.weight(self.role)
        return self.w

    def release(self):
        """Forget the float weight once the layer holds what it needs."""
        if self.group is not None:
            self.group.release(self.role)
        self.w = None
        self.group = None


class Int8Linear:
    """A W8A8 linear layer: ``layer(x) = x @ w.T`` with int8 weights and activations.

    Parameters
    ----------
    w : numpy.ndarray
        float32 weight of shape ``(N, K)``.
    rotate, block, seed, encoding
        Packing settings passed to ``pyw8a8.pack_weight``.
    bias : array_like of float, shape (N,), optional
        Added to the product in the kernels' epilogue (``pyw8a8.matmul``'s `bias`).
    name : str, optional
        Used in log messages.
    cache : WeightCache, optional
        Shares packed weights between layers built from the same array.
    verbose : bool
        Log the packing (name, shape, bytes, time) at INFO level instead of
        DEBUG on the ``"pyw8a8"`` logger.
    backend : object, optional
        The kernels (``pack_weight``, ``matmul``, ``matmul_pair``,
        ``equalize_ffn``); default `COMPILED_KERNELS`.

    Notes
    -----
    Packing happens once, on the first call (or `pack`), under a lock, and
    the layer then keeps only the packed weight: the float reference is
    dropped (and, for memory-mapped weights, its resident pages released).
    """

    def __init__(self, w: npt.ArrayLike, rotate: bool = True, block: int = 128, seed: int = 0,
                 encoding: str = "auto", name: str | None = None,
                 cache: WeightCache | None = None, verbose: bool = False,
                 backend: Any = None, bias: npt.ArrayLike | None = None,
                 _source: WeightSource | None = None) -> None:
        if _source is None:
            w = check_weight(w, name or "weight")
            _source = WeightSource(w)
            shape = w.shape
        else:
            shape = tuple(np.shape(w))
        self.shape: tuple[int, ...] = tuple(int(s) for s in shape)
        self.bias = _layer_bias(bias, self.shape, name)
        self.name = name
        self.rotate = bool(rotate)
        self.block = int(block)
        self.seed = int(seed)
        self.encoding = encoding
        self.backend = backend if backend is not None else COMPILED_KERNELS
        self._source = _source
        self._cache = cache
        self.verbose = bool(verbose)
        self._packed: PackedWeight | None = None
        self._lock = threading.Lock()
        self.pack_time: float | None = None

    @classmethod
    def from_packed(cls, packed: PackedWeight, name: str | None = None,
                    backend: Any = None, bias: npt.ArrayLike | None = None) -> Int8Linear:
        """A layer around an already packed weight (see `load_packed`)."""
        self = cls.__new__(cls)
        self.shape = tuple(int(s) for s in packed.shape)
        self.bias = _layer_bias(bias, self.shape, name)
        self.name = name
        self.rotate = packed.rotate
        self.block = packed.block
        self.seed = packed.seed
        self.encoding = packed.encoding
        self.backend = backend if backend is not None else COMPILED_KERNELS
        self._source = None
        self._cache = None
        self.verbose = False
        self._packed = packed
        self._lock = threading.Lock()
        self.pack_time = 0.0
        return self

    @property
    def is_packed(self) -> bool:
        """Whether the weight has been packed."""
        return self._packed is not None

    def _settings(self):
        return ("w8a8", self.rotate, self.block, self.seed, self.encoding)

    def pack(self) -> PackedWeight:
        """Pack the weight now (idempotent, thread safe); returns the PackedWeight."""
        packed = self._packed
        if packed is not None:
            return packed
        with self._lock:
            if self._packed is None:
                w = check_weight(self._source.resolve(), self.name or "weight")
                t0 = time.perf_counter()

                def do_pack():
                    # pad: a K that the block does not divide is rotated with its last
                    # block zero-padded, so every matrix gets the rotation it is labelled
                    # with.
                    return self.backend.pack_weight(w, rotate=self.rotate, block=self.block,
                                                    seed=self.seed, encoding=self.encoding,
                                                    pad=True)

                if self._cache is not None:
                    packed = self._cache.get_or_pack(w, do_pack, *self._settings())
                else:
                    packed = do_pack()
                self.pack_time = time.perf_counter() - t0
                self._packed = packed
                self._source.release()
                self._source = None  # packed weights replace float weights
                _release_pages(w)
                level = logging.INFO if self.verbose else logging.DEBUG
                if logger.isEnabledFor(level):
                    logger.log(
                        level,
                        "pyw8a8: packed %s %s -> %d bytes in %.3f s",
                        self.name or "<weight>", self.shape, packed.nbytes, self.pack_time,
                    )
            return self._packed

    @property
    def packed(self) -> PackedWeight:
        """The packed weight (packed now if it was not yet)."""
        return self.pack()

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weight (0 before packing)."""
        return int(self._packed.nbytes) if self._packed is not None else 0

    def __call__(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        packed = self.pack()
        x = _as_input(x, self.shape[1], self.name or "Int8Linear")
        if self.bias is None:
            return self.backend.matmul(x, packed)
        return self.backend.matmul(x, packed, bias=self.bias)

    def __repr__(self):
        state = "packed" if self.is_packed else "lazy"
        return (f"Int8Linear({self.name!r}, shape={self.shape}, rotate={self.rotate}, "
                f"block={self.block}, {state})")


class Int8GatedLinear:
    """A gated linear unit's gate and up projections, both W8A8, on one quantized activation.

    ``layer.glu(x, activation) -> activation(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)``
    in one fused call (``pyw8a8.matmul_pair``'s `glu`, as ``pyw8a8.torch.GatedLinear``),
    neither product stored; ``layer(x)`` gives the two projections unfinished,
    ``(x @ w_gate.T + b_gate, x @ w_up.T + b_up)``.  The product runs on the gate's
    backend.

    Parameters
    ----------
    gate, up : Int8Linear
        The projections, of weights of shape (F, K) and (F2, K): one K.
    """

    def __init__(self, gate: Int8Linear, up: Int8Linear) -> None:
        if gate.shape[1] != up.shape[1]:
            raise ValueError(f"gate and up weights must share K, got {gate.shape} and "
                             f"{up.shape}")
        self.gate = gate
        self.up = up

    def _inputs(self, x: npt.ArrayLike) -> tuple[PackedWeight, PackedWeight,
                                                 npt.NDArray[np.float32]]:
        p1, p2 = self.gate.pack(), self.up.pack()
        return p1, p2, _as_input(x, self.gate.shape[1], self.gate.name or "Int8GatedLinear")

    def _biases(self) -> dict[str, npt.NDArray[np.float32]]:
        """matmul_pair's bias arguments, only where a layer has one (backends without bias
        support keep working for bias-free models)."""
        return {f"bias{i}": layer.bias for i, layer in ((1, self.gate), (2, self.up))
                if layer.bias is not None}

    def __call__(self, x: npt.ArrayLike) -> tuple[npt.NDArray[np.float32],
                                                  npt.NDArray[np.float32]]:
        p1, p2, rows = self._inputs(x)
        return self.gate.backend.matmul_pair(rows, p1, p2, **self._biases())

    def glu(self, x: npt.ArrayLike, activation: str) -> npt.NDArray[np.float32]:
        """``activation(gate(x)) * up(x)`` in one fused call (``pyw8a8.matmul_pair``'s
        `glu`); `activation` is one of its names."""
        p1, p2, rows = self._inputs(x)
        return self.gate.backend.matmul_pair(rows, p1, p2, glu=activation, **self._biases())

    def __repr__(self):
        return f"Int8GatedLinear({self.gate!r}, {self.up!r})"


class FloatLinear:
    """A float32 linear layer: ``layer(x) = x @ w.T``.

    The layers a router keeps in float, and every layer of a float control model (see
    `float_linear`).

    Parameters
    ----------
    w : numpy.ndarray
        Weight of shape ``(N, K)`` (converted to float32 if needed).
    name : str, optional
        Used in error messages and the repr.
    bias : array_like of float, shape (N,), optional
        Added to the product.
    """

    def __init__(self, w: npt.ArrayLike, name: str | None = None,
                 bias: npt.ArrayLike | None = None,
                 _source: WeightSource | None = None) -> None:
        if _source is None:
            w = check_weight(w, name or "weight")
            _source = WeightSource(w)
        self.shape: tuple[int, ...] = tuple(int(s) for s in np.shape(w))
        self.bias = _layer_bias(bias, self.shape, name)
        self.name = name
        self._source = _source
        self._w: npt.NDArray[np.float32] | None = None
        self._lock = threading.Lock()

    @property
    def weight(self) -> npt.NDArray[np.float32]:
        """The float32 weight (N, K)."""
        if self._w is None:
            with self._lock:
                if self._w is None:
                    self._w = check_weight(self._source.resolve(), self.name or "weight")
                    self._source.release()
                    self._source = None
        return self._w

    def __call__(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        w = self.weight
        x = _as_input(x, self.shape[1], self.name or "FloatLinear")
        y = x @ w.T
        if self.bias is not None:
            y += self.bias
        return y

    def __repr__(self):
        return f"FloatLinear({self.name!r}, shape={self.shape})"


def float_linear(name: str, w: npt.ArrayLike) -> FloatLinear:
    """The float32 ``linear(name, w)`` factory: every weight matmul of a model stays float.

    Parameters
    ----------
    name : str
        Tensor name.
    w : numpy.ndarray
        Weight of shape ``(N, K)``.

    Returns
    -------
    FloatLinear
    """
    return FloatLinear(w, name=name)


class SeparatePair:
    """Two independent layers on one input: ``layer(x) -> (first(x), second(x))``."""

    def __init__(self, first: Int8Linear | FloatLinear, second: Int8Linear | FloatLinear) -> None:
        self.first = first
        self.second = second

    def __call__(self, x: npt.ArrayLike) -> tuple[npt.NDArray[np.float32],
                                                  npt.NDArray[np.float32]]:
        return self.first(x), self.second(x)

    def __repr__(self):
        return f"SeparatePair({self.first!r}, {self.second!r})"
