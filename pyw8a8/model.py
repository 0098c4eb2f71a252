"""Model-level W8A8: route the weight matmuls of any numpy model to int8 kernels.

A numpy model that builds its weight matmuls through a factory
``linear(name, w) -> layer`` (``layer(x)`` maps float32 ``(M, K)`` to
``(M, N)``) can run in W8A8 by passing a `Router` as that factory::

    from pyw8a8.model import Router, RouterConfig
    router = Router(RouterConfig(rotate=True, block=128))
    model = Gemma3(weights, linear=router)   # router.pair handles gate/up

The router decides per tensor (by name and shape) whether the matmul uses
W8A8 (`Linear`) or stays float (`FloatLayer`).  W8A8 layers pack their weight
lazily, on first use, and then drop the float reference: the packed int8
weight replaces the float one.  ``RouterConfig.from_env()`` reads the same
settings from ``PYW8A8_*`` environment variables.

The kernels themselves (``pyw8a8.pack_weight``, ``pyw8a8.matmul``,
``pyw8a8.matmul_pair``, ``pyw8a8.equalize_ffn``, ``PackedWeight``) live in
the core package and are imported lazily, so this module imports without the
compiled extension.
"""

from __future__ import annotations

import fnmatch
import logging
import mmap
import os
import threading
import time
import weakref
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = [
    "RouterConfig",
    "Router",
    "Linear",
    "LinearPair",
    "FloatLayer",
    "WeightCache",
    "save_packed",
    "load_packed",
    "PACKED_FORMAT_VERSION",
]

logger = logging.getLogger("pyw8a8")

#: Version of the ``.npz`` layout written by `save_packed`.
PACKED_FORMAT_VERSION = 1

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def _core():
    """The core package, with a clear error if the compiled kernels are missing."""
    import pyw8a8

    if not hasattr(pyw8a8, "pack_weight"):
        raise ImportError(
            "pyw8a8's compiled W8A8 kernels are not available (pyw8a8.pack_weight is "
            "missing); build/install the package, e.g. `pip install -e .`"
        )
    return pyw8a8


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def _parse_bool(var, raw):
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"{var}={raw!r}: expected a boolean (1/0, true/false, yes/no, on/off)")


def _parse_int(var, raw, minimum=None):
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ValueError(f"{var}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{var}={raw!r}: must be >= {minimum}")
    return value


def _parse_list(raw):
    return [p.strip() for p in raw.split(",") if p.strip()]


@dataclass
class RouterConfig:
    """Which weight matmuls run in W8A8, and how they are packed.

    Parameters
    ----------
    min_k : int
        Matrices with ``K < min_k`` stay float.  Default 0 (none).
    skip_rows : int or None
        Matrices with ``N >= skip_rows`` stay float (e.g. a huge output
        layer).  Default None: never.
    include : list of str
        fnmatch glob patterns on tensor names; when non-empty, only matching
        tensors may use W8A8.
    exclude : list of str
        Glob patterns of tensors that stay float (applied after `include`).
    verbose : bool
        Log every routing decision and every packed tensor (name, shape,
        bytes, pack time) to the ``"pyw8a8"`` logger.
    rotate : bool
        Block randomized-Hadamard rotation of weights and activations.
    block : int
        Rotation block size (a power of two).
    seed : int
        Seed of the rotation signs.
    scaling : bool
        Data-free FFN equalization (``pyw8a8.equalize_ffn``) of each
        gate/up/down triple before packing; exact in float arithmetic.
    encoding : str
        Weight byte encoding passed to ``pyw8a8.pack_weight``.
    """

    min_k: int = 0
    skip_rows: int | None = None
    include: list = field(default_factory=list)
    exclude: list = field(default_factory=list)
    verbose: bool = False
    rotate: bool = True
    block: int = 128
    seed: int = 0
    scaling: bool = False
    encoding: str = "auto"

    def __post_init__(self):
        if isinstance(self.include, str):
            self.include = _parse_list(self.include)
        if isinstance(self.exclude, str):
            self.exclude = _parse_list(self.exclude)
        self.include = list(self.include)
        self.exclude = list(self.exclude)
        for label, pats in (("include", self.include), ("exclude", self.exclude)):
            if not all(isinstance(p, str) for p in pats):
                raise ValueError(f"{label} must be a list of glob pattern strings")
        if isinstance(self.min_k, bool) or not isinstance(self.min_k, (int, np.integer)) or self.min_k < 0:
            raise ValueError(f"min_k must be an integer >= 0, got {self.min_k!r}")
        if self.skip_rows is not None and (
            isinstance(self.skip_rows, bool)
            or not isinstance(self.skip_rows, (int, np.integer))
            or self.skip_rows < 1
        ):
            raise ValueError(f"skip_rows must be None or an integer >= 1, got {self.skip_rows!r}")
        b = self.block
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 or (b & (b - 1)):
            raise ValueError(f"block must be a positive power of two, got {b!r}")
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "RouterConfig":
        """Configuration from ``PYW8A8_*`` environment variables.

        Variables (all optional): ``PYW8A8_MIN_K`` (int >= 0),
        ``PYW8A8_SKIP_ROWS`` (int >= 1; ``0``/``none``/empty disables),
        ``PYW8A8_INCLUDE`` and ``PYW8A8_EXCLUDE`` (comma-separated globs),
        ``PYW8A8_VERBOSE``, ``PYW8A8_ROTATE``, ``PYW8A8_SCALING`` (booleans),
        ``PYW8A8_BLOCK`` (power of two), ``PYW8A8_SEED`` (int).  Keyword
        `overrides` take precedence.

        Raises
        ------
        ValueError
            On a malformed value; the message names the variable.
        """
        env = os.environ if environ is None else environ
        kw = {}

        def get(name):
            v = env.get(name)
            return None if v is None else str(v)

        if (v := get("PYW8A8_MIN_K")) is not None and v.strip():
            kw["min_k"] = _parse_int("PYW8A8_MIN_K", v, minimum=0)
        if (v := get("PYW8A8_SKIP_ROWS")) is not None:
            if v.strip().lower() in ("", "none", "0"):
                kw["skip_rows"] = None
            else:
                kw["skip_rows"] = _parse_int("PYW8A8_SKIP_ROWS", v, minimum=1)
        if (v := get("PYW8A8_INCLUDE")) is not None:
            kw["include"] = _parse_list(v)
        if (v := get("PYW8A8_EXCLUDE")) is not None:
            kw["exclude"] = _parse_list(v)
        for var, attr in (
            ("PYW8A8_VERBOSE", "verbose"),
            ("PYW8A8_ROTATE", "rotate"),
            ("PYW8A8_SCALING", "scaling"),
        ):
            if (v := get(var)) is not None:
                kw[attr] = _parse_bool(var, v)
        if (v := get("PYW8A8_BLOCK")) is not None and v.strip():
            b = _parse_int("PYW8A8_BLOCK", v, minimum=1)
            if b & (b - 1):
                raise ValueError(f"PYW8A8_BLOCK={v!r}: must be a power of two")
            kw["block"] = b
        if (v := get("PYW8A8_SEED")) is not None and v.strip():
            kw["seed"] = _parse_int("PYW8A8_SEED", v)
        kw.update(overrides)
        return cls(**kw)

    def with_(self, **changes) -> "RouterConfig":
        """A copy with some fields changed."""
        return replace(self, **changes)


# ---------------------------------------------------------------------------
# Packed-weight cache
# ---------------------------------------------------------------------------


def _packed_nbytes(packed) -> int:
    n = getattr(packed, "nbytes", None)
    if n is not None:
        return int(n)
    to_dict = getattr(packed, "to_dict", None)
    if to_dict is not None:
        return int(sum(np.asarray(a).nbytes for a in to_dict().values()))
    return 0


class WeightCache:
    """Bounded LRU cache of packed weights.

    Keys are ``(id(array), array.shape, settings...)``.  The cache holds a
    weak reference to each source array and treats an entry whose array has
    been garbage collected as stale (ids can be reused), so it never keeps
    float weights alive.

    Parameters
    ----------
    max_bytes : int or None
        Upper bound on the bytes of packed weights held by the cache; least
        recently used entries are evicted beyond it.  ``None``: unbounded.
        An entry larger than the bound is not cached at all.
    """

    def __init__(self, max_bytes: int | None = 1 << 30):
        if max_bytes is not None and (not isinstance(max_bytes, (int, np.integer)) or max_bytes < 0):
            raise ValueError(f"max_bytes must be None or an integer >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict = OrderedDict()  # key -> (weakref, packed, nbytes)
        self._nbytes = 0
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(array: np.ndarray, *settings) -> tuple:
        return (id(array), tuple(array.shape)) + tuple(settings)

    @property
    def nbytes(self) -> int:
        """Bytes of packed weights currently held."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key):
        _, _, n = self._entries.pop(key)
        self._nbytes -= n

    def _purge_stale(self):
        for key in [k for k, (ref, _, _) in self._entries.items() if ref() is None]:
            self._drop(key)

    def get(self, array: np.ndarray, *settings):
        """The cached packed weight for `array` and `settings`, or None."""
        key = self.key(array, *settings)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0]() is not array:
                if entry is not None:
                    self._drop(key)
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, array: np.ndarray, packed, *settings) -> None:
        """Insert (or refresh) an entry, then evict down to `max_bytes`."""
        key = self.key(array, *settings)
        n = _packed_nbytes(packed)
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._purge_stale()
            if self.max_bytes is not None and n > self.max_bytes:
                return
            try:
                ref = weakref.ref(array)
            except TypeError:  # pragma: no cover - ndarray supports weakrefs
                return
            self._entries[key] = (ref, packed, n)
            self._nbytes += n
            while self.max_bytes is not None and self._nbytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get_or_pack(self, array: np.ndarray, pack, *settings):
        """Cached packed weight, or ``pack()`` inserted into the cache."""
        packed = self.get(array, *settings)
        if packed is None:
            packed = pack()
            self.put(array, packed, *settings)
        return packed

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._nbytes = 0


_DEFAULT_CACHE = None
_DEFAULT_CACHE_LOCK = threading.Lock()


def default_cache() -> WeightCache:
    """The process-wide cache used by routers created without one (1 GiB bound)."""
    global _DEFAULT_CACHE
    with _DEFAULT_CACHE_LOCK:
        if _DEFAULT_CACHE is None:
            _DEFAULT_CACHE = WeightCache(1 << 30)
        return _DEFAULT_CACHE


# ---------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------


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


def _check_weight(w, name="weight"):
    # Keep the caller's object when possible: the cache keys on its identity.
    if not isinstance(w, np.ndarray):
        w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"{name}: weight must be 2-D (N, K), got shape {w.shape}")
    if w.dtype != np.float32:
        w = w.astype(np.float32)
    return w


def _as_input(x, k, name):
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"{name}: expected input of shape (M, {k}), got {x.shape}")
    return x


class _Source:
    """A float weight, possibly replaced (equalized) before it is first used."""

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


def _pack(w, rotate, block, seed, encoding):
    return _core().pack_weight(w, rotate=bool(rotate), block=int(block), seed=int(seed),
                               encoding=encoding)


class Linear:
    """A W8A8 linear layer: ``layer(x) = x @ w.T`` with int8 weights and activations.

    Parameters
    ----------
    w : numpy.ndarray
        float32 weight of shape ``(N, K)``.
    rotate, block, seed, encoding
        Packing settings passed to ``pyw8a8.pack_weight``.
    name : str, optional
        Used in log messages.
    cache : WeightCache, optional
        Shares packed weights between layers built from the same array.
    verbose : bool
        Log the packing (name, shape, bytes, time) at INFO level instead of
        DEBUG on the ``"pyw8a8"`` logger.

    Notes
    -----
    Packing happens once, on the first call (or `pack`), under a lock, and
    the layer then keeps only the packed weight: the float reference is
    dropped (and, for memory-mapped weights, its resident pages released).
    """

    def __init__(self, w, rotate=True, block=128, seed=0, encoding="auto", name=None, cache=None,
                 verbose=False, _source=None):
        if _source is None:
            w = _check_weight(w, name or "weight")
            _source = _Source(w)
            shape = w.shape
        else:
            shape = tuple(np.shape(w))
        self.shape = tuple(int(s) for s in shape)
        self.name = name
        self.rotate = bool(rotate)
        self.block = int(block)
        self.seed = int(seed)
        self.encoding = encoding
        self._source = _source
        self._cache = cache
        self.verbose = bool(verbose)
        self._packed = None
        self._lock = threading.Lock()
        self.pack_time = None

    @classmethod
    def from_packed(cls, packed, name=None):
        """A layer around an already packed weight (see `load_packed`)."""
        shape = getattr(packed, "shape", None)
        self = cls.__new__(cls)
        self.shape = tuple(int(s) for s in shape) if shape is not None else None
        self.name = name
        self.rotate = getattr(packed, "rotate", None)
        self.block = getattr(packed, "block", None)
        self.seed = getattr(packed, "seed", None)
        self.encoding = getattr(packed, "encoding", None)
        self._source = None
        self._cache = None
        self.verbose = False
        self._packed = packed
        self._lock = threading.Lock()
        self.pack_time = 0.0
        return self

    @property
    def is_packed(self) -> bool:
        return self._packed is not None

    def _settings(self):
        return ("w8a8", self.rotate, self.block, self.seed, self.encoding)

    def pack(self):
        """Pack the weight now (idempotent, thread safe); returns the PackedWeight."""
        packed = self._packed
        if packed is not None:
            return packed
        with self._lock:
            if self._packed is None:
                w = _check_weight(self._source.resolve(), self.name or "weight")
                t0 = time.perf_counter()

                def do_pack():
                    return _pack(w, self.rotate, self.block, self.seed, self.encoding)

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
                        self.name or "<weight>", self.shape, _packed_nbytes(packed), self.pack_time,
                    )
            return self._packed

    @property
    def packed(self):
        return self.pack()

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weight (0 before packing)."""
        return _packed_nbytes(self._packed) if self._packed is not None else 0

    def __call__(self, x):
        packed = self.pack()
        if self.shape is not None:
            x = _as_input(x, self.shape[1], self.name or "Linear")
        else:
            x = np.asarray(x, dtype=np.float32)
        return _core().matmul(x, packed)

    def __repr__(self):
        state = "packed" if self.is_packed else "lazy"
        return f"Linear({self.name!r}, shape={self.shape}, rotate={self.rotate}, block={self.block}, {state})"


class LinearPair:
    """Two W8A8 layers sharing one quantized activation (``pyw8a8.matmul_pair``).

    ``layer(x) -> (x @ w1.T, x @ w2.T)``, e.g. the gate and up projections of
    a gated FFN.
    """

    def __init__(self, first: Linear, second: Linear):
        if first.shape[1] != second.shape[1]:
            raise ValueError(f"pair weights must share K, got {first.shape} and {second.shape}")
        self.first = first
        self.second = second

    def __call__(self, x):
        p1, p2 = self.first.pack(), self.second.pack()
        x = _as_input(x, self.first.shape[1], self.first.name or "LinearPair")
        return _core().matmul_pair(x, p1, p2)

    def __repr__(self):
        return f"LinearPair({self.first!r}, {self.second!r})"


class FloatLayer:
    """Float32 ``x @ w.T`` (the layers the router keeps in float)."""

    def __init__(self, w, name=None, _source=None):
        if _source is None:
            w = _check_weight(w, name or "weight")
            _source = _Source(w)
        self.shape = tuple(int(s) for s in np.shape(w))
        self.name = name
        self._source = _source
        self._w = None
        self._lock = threading.Lock()

    @property
    def weight(self):
        if self._w is None:
            with self._lock:
                if self._w is None:
                    self._w = _check_weight(self._source.resolve(), self.name or "weight")
                    self._source.release()
                    self._source = None
        return self._w

    def __call__(self, x):
        w = self.weight
        x = _as_input(x, self.shape[1], self.name or "FloatLayer")
        return x @ w.T

    def __repr__(self):
        return f"FloatLayer({self.name!r}, shape={self.shape})"


class _SeparatePair:
    def __init__(self, first, second):
        self.first = first
        self.second = second

    def __call__(self, x):
        return self.first(x), self.second(x)

    def __repr__(self):
        return f"Pair({self.first!r}, {self.second!r})"


# ---------------------------------------------------------------------------
# FFN equalization groups
# ---------------------------------------------------------------------------

_FFN_ROLES = (
    ("ffn_gate", "gate"), ("ffn_up", "up"), ("ffn_down", "down"),
    ("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"),
)


def _ffn_role(name):
    """(group key, role) for FFN weights, else (None, None)."""
    for token, role in _FFN_ROLES:
        if token in name:
            return name.replace(token, "\0ffn\0"), role
    return None, None


class _FfnGroup:
    """Collects gate/up/down of one FFN and equalizes them once, at first use."""

    def __init__(self, key):
        self.key = key
        self.raw = {}
        self.done = None
        self.lock = threading.Lock()

    def weight(self, role):
        with self.lock:
            if self.done is None:
                if all(r in self.raw for r in ("gate", "up", "down")):
                    core = _core()
                    if not hasattr(core, "equalize_ffn"):
                        raise ImportError(
                            "FFN scaling needs pyw8a8.equalize_ffn, which this pyw8a8 lacks"
                        )
                    # equalize_ffn returns (w_gate, w_up, w_down[, factors])
                    g, u, d = core.equalize_ffn(
                        self.raw["gate"], self.raw["up"], self.raw["down"]
                    )[:3]
                    self.done = {"gate": g, "up": u, "down": d}
                    logger.debug("pyw8a8: equalized FFN %s", self.key.replace("\0ffn\0", "ffn_*"))
                else:
                    missing = {"gate", "up", "down"} - set(self.raw)
                    logger.warning(
                        "pyw8a8: FFN scaling skipped for %s (missing %s)",
                        self.key.replace("\0ffn\0", "ffn_*"), sorted(missing),
                    )
                    self.done = dict(self.raw)
                self.raw = None  # drop the float references
            return self.done[role]

    def release(self, role):
        with self.lock:
            if self.done is not None:
                self.done.pop(role, None)


# ---------------------------------------------------------------------------
# Router
# ---------------------------------------------------------------------------


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

    Notes
    -----
    ``router(name, w)`` returns a `Linear` or a `FloatLayer`;
    ``router.pair(name_gate, w_gate, name_up, w_up)`` returns a layer giving
    ``(gate_out, up_out)``, a `LinearPair` (``pyw8a8.matmul_pair``) when both
    go W8A8.  ``router.layers`` maps names to the layers created.
    """

    def __init__(self, config: RouterConfig | None = None, cache: WeightCache | None = None,
                 packed: dict | None = None):
        self.config = config if config is not None else RouterConfig()
        self.cache = cache if cache is not None else default_cache()
        self.prepacked = dict(packed) if packed else {}
        self.layers = {}
        self._groups = {}
        self._lock = threading.Lock()
        if self.config.verbose:
            _enable_verbose_logging()

    # -- decisions ---------------------------------------------------------

    def decide(self, name: str, shape) -> bool:
        """True if tensor `name` of shape ``(N, K)`` should use W8A8."""
        if len(shape) != 2:
            raise ValueError(f"{name}: expected a 2-D (N, K) shape, got {tuple(shape)}")
        n, k = int(shape[0]), int(shape[1])
        c = self.config
        if c.include and not any(fnmatch.fnmatchcase(name, p) for p in c.include):
            return False
        if any(fnmatch.fnmatchcase(name, p) for p in c.exclude):
            return False
        if k < c.min_k:
            return False
        if c.skip_rows is not None and n >= c.skip_rows:
            return False
        return True

    def _reason(self, name, shape):
        n, k = int(shape[0]), int(shape[1])
        c = self.config
        if c.include and not any(fnmatch.fnmatchcase(name, p) for p in c.include):
            return "not included"
        if any(fnmatch.fnmatchcase(name, p) for p in c.exclude):
            return "excluded"
        if k < c.min_k:
            return f"K={k} < min_k={c.min_k}"
        if c.skip_rows is not None and n >= c.skip_rows:
            return f"N={n} >= skip_rows={c.skip_rows}"
        return "w8a8"

    # -- factories ---------------------------------------------------------

    def _source(self, name, w):
        if not self.config.scaling:
            return _Source(w)
        key, role = _ffn_role(name)
        if key is None:
            return _Source(w)
        with self._lock:
            group = self._groups.get(key)
            if group is None or group.done is not None or role in group.raw:
                group = self._groups[key] = _FfnGroup(key)
            group.raw[role] = w
        return _Source(None, group, role)

    def _make(self, name, w):
        w = _check_weight(w, name)
        use = self.decide(name, w.shape)
        if self.config.verbose:
            logger.info("pyw8a8: route %s %s -> %s (%s)", name, tuple(w.shape),
                        "W8A8" if use else "float", self._reason(name, w.shape))
        if use and name in self.prepacked:
            layer = Linear.from_packed(self.prepacked[name], name=name)
            if layer.shape is not None and tuple(layer.shape) != tuple(w.shape):
                raise ValueError(
                    f"{name}: pre-packed weight has shape {layer.shape}, model expects {w.shape}"
                )
            layer.shape = tuple(w.shape)
        elif use:
            c = self.config
            rotate = c.rotate
            if rotate and w.shape[1] % c.block:
                # The rotation needs whole blocks; such a matrix is quantized unrotated.
                rotate = False
                logger.log(logging.INFO if c.verbose else logging.DEBUG,
                           "pyw8a8: %s: K=%d not a multiple of block=%d, packing unrotated",
                           name, w.shape[1], c.block)
            layer = Linear(w, rotate=rotate, block=c.block, seed=c.seed, encoding=c.encoding,
                           name=name, cache=self.cache, verbose=c.verbose,
                           _source=self._source(name, w))
        else:
            layer = FloatLayer(w, name=name, _source=self._source(name, w))
        self.layers[name] = layer
        return layer

    def __call__(self, name: str, w):
        """``linear(name, w) -> layer`` factory."""
        return self._make(name, w)

    def pair(self, name_gate: str, w_gate, name_up: str, w_up):
        """Gate/up pair factory; shares one quantized activation when both are W8A8."""
        g = self._make(name_gate, w_gate)
        u = self._make(name_up, w_up)
        if isinstance(g, Linear) and isinstance(u, Linear):
            return LinearPair(g, u)
        return _SeparatePair(g, u)

    # -- utilities ---------------------------------------------------------

    def pack_all(self) -> dict:
        """Pack every W8A8 layer now; returns ``{name: PackedWeight}`` (for `save_packed`)."""
        return {name: layer.pack() for name, layer in self.layers.items() if isinstance(layer, Linear)}

    def stats(self) -> dict:
        """Counts, packed bytes and total pack time of the layers created so far."""
        w8 = [l for l in self.layers.values() if isinstance(l, Linear)]
        return {
            "w8a8_layers": len(w8),
            "float_layers": len(self.layers) - len(w8),
            "packed_bytes": int(sum(l.nbytes for l in w8)),
            "pack_time_s": float(sum(l.pack_time or 0.0 for l in w8)),
        }


def _enable_verbose_logging():
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)


# ---------------------------------------------------------------------------
# Saving / loading packed weights
# ---------------------------------------------------------------------------

_FORMAT_KEY = "__pyw8a8_packed_format__"
_NAMES_KEY = "__names__"


def save_packed(path, mapping: dict) -> None:
    """Save packed weights to an ``.npz`` file (no pickling).

    Parameters
    ----------
    path : str or path-like
        Destination file (numpy appends ``.npz`` if missing).
    mapping : dict[str, PackedWeight]
        Tensor name -> packed weight; each must provide ``to_dict()``
        returning ``{str: numpy.ndarray}``.
    """
    arrays = {
        _FORMAT_KEY: np.array(PACKED_FORMAT_VERSION, dtype=np.int64),
        _NAMES_KEY: np.array(list(mapping.keys()), dtype=np.str_),
    }
    for i, (name, packed) in enumerate(mapping.items()):
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be strings, got {name!r}")
        d = packed.to_dict()
        if not isinstance(d, dict):
            raise ValueError(f"{name}: to_dict() must return a dict")
        for key, value in d.items():
            if "/" in key:
                raise ValueError(f"{name}: to_dict() key {key!r} must not contain '/'")
            arr = np.asarray(value)
            if arr.dtype == object:
                raise ValueError(f"{name}: to_dict()[{key!r}] is an object array")
            arrays[f"{i}/{key}"] = arr
    np.savez(path, **arrays)


def load_packed(path, cls=None) -> dict:
    """Load packed weights written by `save_packed`.

    Parameters
    ----------
    path : str or path-like
    cls : type, optional
        Class with ``from_dict``; default ``pyw8a8.PackedWeight``.

    Returns
    -------
    dict[str, PackedWeight]

    Raises
    ------
    ValueError
        If the file is corrupted, truncated, not a packed-weight file or of
        an unsupported format version.
    """
    if cls is None:
        cls = _core().PackedWeight
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = set(npz.files)
            if _FORMAT_KEY not in files or _NAMES_KEY not in files:
                raise ValueError(f"{path}: not a pyw8a8 packed-weight file")
            version = int(npz[_FORMAT_KEY])
            if version != PACKED_FORMAT_VERSION:
                raise ValueError(
                    f"{path}: unsupported packed format version {version} "
                    f"(this pyw8a8 reads {PACKED_FORMAT_VERSION})"
                )
            names = [str(n) for n in npz[_NAMES_KEY].tolist()]
            parts = [dict() for _ in names]
            for f in files:
                if f in (_FORMAT_KEY, _NAMES_KEY):
                    continue
                idx, sep, key = f.partition("/")
                if not sep or not idx.isdigit() or int(idx) >= len(names):
                    raise ValueError(f"{path}: unexpected entry {f!r}")
                parts[int(idx)][key] = npz[f]  # reading checks the CRC
    except ValueError as exc:
        msg = str(exc)
        if str(path) in msg:
            raise
        raise ValueError(f"{path}: corrupted or truncated packed-weight file ({msg})") from exc
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as exc:
        raise ValueError(f"{path}: corrupted or truncated packed-weight file ({exc})") from exc
    out = {}
    for name, d in zip(names, parts):
        if not d:
            raise ValueError(f"{path}: no arrays stored for {name!r}")
        try:
            out[name] = cls.from_dict(d)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: invalid packed weight {name!r}: {exc}") from exc
    return out
