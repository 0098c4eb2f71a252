"""`Router`: the ``linear(name, w)`` factory that sends each weight matmul of a model to W8A8
or float."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy.typing as npt

from ..packing import PackedWeight
from .cache import WeightCache, default_cache
from .config import RouterConfig
from .ffn import FfnGroup, ffn_role
from .layers import (
    COMPILED_KERNELS,
    FloatLinear,
    Int8GatedLinear,
    Int8Linear,
    SeparatePair,
    WeightSource,
    check_weight,
)
from .selection import float_reason

__all__ = ["Router"]

logger = logging.getLogger("pyw8a8")


class Router:
    """Linear-layer factory that routes each weight matmul to W8A8 or float.

    Parameters
    ----------
    config : RouterConfig, optional
        Default ``RouterConfig()``.
    cache : WeightCache, optional
        Packed-weight cache; default the process-wide `default_cache()`.
    packed : dict[str, PackedWeight], optional
        Pre-packed weights by tensor name (e.g. from `load_packed`); such
        tensors use them instead of packing.
    backend : object, optional
        The kernels every W8A8 layer and FFN group calls (``pack_weight``,
        ``matmul``, ``matmul_pair``, ``equalize_ffn``); default
        `~pyw8a8.router.layers.COMPILED_KERNELS`.

    Notes
    -----
    ``router(name, w)`` (or ``router(name, w, bias)``) returns an `Int8Linear` or a
    `FloatLinear`; ``router.pair(name_gate, w_gate, name_up, w_up)`` returns a layer
    giving ``(gate_out, up_out)``, an `Int8GatedLinear` (``pyw8a8.matmul_pair``, with the
    fused ``glu(x, activation)``) when both go W8A8, else a `SeparatePair`.
    ``router.layers`` maps names to the layers created.

    Examples
    --------
    >>> import numpy as np
    >>> from pyw8a8.router import Router, RouterConfig
    >>> rng = np.random.default_rng(0)
    >>> router = Router(RouterConfig(min_in_features=64))
    >>> q = router("blk.0.attn_q.weight", rng.standard_normal((256, 256), np.float32))
    >>> tiny = router("blk.0.tiny.weight", rng.standard_normal((8, 16), np.float32))
    >>> type(q).__name__, type(tiny).__name__  # K = 16 < min_in_features stays float
    ('Int8Linear', 'FloatLinear')
    >>> x = rng.standard_normal((4, 256), np.float32)
    >>> y = q(x)  # packed now, on first use
    >>> y.shape, q.is_packed
    ((4, 256), True)
    >>> err = np.linalg.norm(y - x @ q.packed.dequantize().T) / np.linalg.norm(y)
    >>> bool(err < 0.02)
    True
    """

    def __init__(self, config: RouterConfig | None = None, cache: WeightCache | None = None,
                 packed: dict[str, PackedWeight] | None = None, backend: Any = None) -> None:
        self.config = config if config is not None else RouterConfig()
        self.cache = cache if cache is not None else default_cache()
        self.prepacked = dict(packed) if packed else {}
        self.backend = backend if backend is not None else COMPILED_KERNELS
        self.layers: dict[str, Int8Linear | FloatLinear] = {}
        self._groups = {}
        self._lock = threading.Lock()
        if self.config.verbose:
            _enable_verbose_logging()

    # -- decisions ---------------------------------------------------------

    def decide(self, name: str, shape: Sequence[int]) -> bool:
        """True if tensor `name` of shape ``(N, K)`` should use W8A8."""
        return self._float_reason(name, shape) is None

    def _float_reason(self, name, shape):
        """Why tensor `name` of shape ``(N, K)`` stays float, or None if it uses W8A8."""
        if len(shape) != 2:
            raise ValueError(f"{name}: expected a 2-D (N, K) shape, got {tuple(shape)}")
        c = self.config
        return float_reason(name, int(shape[0]), int(shape[1]), include=c.include,
                            exclude=c.exclude, min_in_features=c.min_in_features,
                            skip_rows=c.skip_rows)

    # -- factories ---------------------------------------------------------

    def _source(self, name, w):
        if not self.config.scaling:
            return WeightSource(w)
        key, role = ffn_role(name)
        if key is None:
            return WeightSource(w)
        with self._lock:
            group = self._groups.get(key)
            if group is None or group.done is not None or role in group.raw:
                group = self._groups[key] = FfnGroup(key, self.backend)
            group.raw[role] = w
        return WeightSource(None, group, role)

    def _make(self, name: str, w: npt.ArrayLike,
              bias: npt.ArrayLike | None = None) -> Int8Linear | FloatLinear:
        w = check_weight(w, name)
        reason = self._float_reason(name, w.shape)
        use = reason is None
        if self.config.verbose:
            logger.info("pyw8a8: route %s %s -> %s (%s)", name, tuple(w.shape),
                        "W8A8" if use else "float", reason or "w8a8")
        if use and name in self.prepacked:
            layer = Int8Linear.from_packed(self.prepacked[name], name=name, backend=self.backend,
                                       bias=bias)
            if tuple(layer.shape) != tuple(w.shape):
                raise ValueError(
                    f"{name}: pre-packed weight has shape {layer.shape}, model expects {w.shape}"
                )
        elif use:
            c = self.config
            layer = Int8Linear(w, rotate=c.rotate, block=c.block, seed=c.seed, encoding=c.encoding,
                           name=name, cache=self.cache, verbose=c.verbose, backend=self.backend,
                           bias=bias, _source=self._source(name, w))
        else:
            layer = FloatLinear(w, name=name, bias=bias, _source=self._source(name, w))
        self.layers[name] = layer
        return layer

    def __call__(self, name: str, w: npt.ArrayLike,
                 bias: npt.ArrayLike | None = None) -> Int8Linear | FloatLinear:
        """``linear(name, w, bias=None) -> layer`` factory: ``layer(x) = x @ w.T + bias``,
        the bias fused into the W8A8 kernels' epilogue (float32, shape (N,))."""
        return self._make(name, w, bias)

    def pair(self, name_gate: str, w_gate: npt.ArrayLike, name_up: str,
             w_up: npt.ArrayLike) -> Int8GatedLinear | SeparatePair:
        """Gate/up factory of a gated linear unit; one quantized activation when both go
        W8A8."""
        g = self._make(name_gate, w_gate)
        u = self._make(name_up, w_up)
        if isinstance(g, Int8Linear) and isinstance(u, Int8Linear):
            return Int8GatedLinear(g, u)
        return SeparatePair(g, u)

    # -- utilities ---------------------------------------------------------

    def pack_all(self) -> dict[str, PackedWeight]:
        """Pack every W8A8 layer now; returns ``{name: PackedWeight}`` (for `save_packed`)."""
        return {name: layer.pack() for name, layer in self.layers.items()
                if isinstance(layer, Int8Linear)}

    def stats(self) -> dict[str, int | float]:
        """Counts, packed bytes and total pack time of the layers created so far."""
        w8 = [layer for layer in self.layers.values() if isinstance(layer, Int8Linear)]
        return {
            "w8a8_layers": len(w8),
            "float_layers": len(self.layers) - len(w8),
            "packed_bytes": int(sum(layer.nbytes for layer in w8)),
            "pack_time_s": float(sum(layer.pack_time or 0.0 for layer in w8)),
        }


def _enable_verbose_logging():
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)

