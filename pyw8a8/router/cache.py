"""`WeightCache`: a bounded LRU cache of packed weights, shared by the layers of one array."""

from __future__ import annotations

import threading
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ..packing import PackedWeight

__all__ = ["WeightCache", "content_checksum", "default_cache"]

# Rows are checksummed in chunks of about this many bytes, so that a non-contiguous
# weight is copied one chunk at a time, never whole.
_CHECKSUM_CHUNK_BYTES = 1 << 20


def content_checksum(array: np.ndarray) -> int:
    """CRC-32 of every value of `array`, in C order (no copy of a C-contiguous array).

    Parameters
    ----------
    array : numpy.ndarray

    Returns
    -------
    int
        Unsigned 32-bit checksum of the array's bytes.
    """
    if array.ndim == 0 or array.size == 0:
        return zlib.crc32(np.ascontiguousarray(array))
    step = max(1, _CHECKSUM_CHUNK_BYTES // array[0].nbytes)
    crc = 0
    for start in range(0, array.shape[0], step):
        crc = zlib.crc32(np.ascontiguousarray(array[start:start + step]), crc)
    return crc


class WeightCache:
    """Bounded LRU cache of packed weights, shared by the layers built from one float array.

    A lookup returns a packed weight only if it was packed from the very same live array
    object, of the same shape and dtype, with the same packing settings, **and** the
    array's contents still have the checksum taken just before it was packed.

    * Identity: the cache holds a weak reference to each source array (it never keeps
      float weights alive) and compares objects, not ids, so a new array that reuses a
      freed array's id never gets the old weight.  Tensor names are not part of the key:
      tied weights (one array under two names) share one packing, which is correct
      because identity and contents are checked.
    * Contents: a CRC-32 of every value (`content_checksum`).  It catches every in-place
      edit made before the lookup (``w += 1``, ``w[3, 5] = 0``, a row swap, a write
      through another view of the same memory): every edit confined to one float32
      element with certainty, any other edit unless it happens to keep the CRC (a
      ``2**-32`` chance for edits not made against it).  It is a checksum, not a
      cryptographic hash: an edit crafted to keep the CRC is missed.  The checksum is
      taken before packing, so an array edited while it is being packed misses on its
      next lookup instead of hitting stale data.

    Not covered: a layer that has already packed its weight keeps it (it drops the float
    reference), so editing the float array afterwards does not change that layer; build
    a new layer (``router(name, w)``) to use the edited weight.  A weight that is not
    float32 is converted to a new array by each layer, so it is packed again rather than
    shared.  ``invalidate(array)`` drops an array's entries explicitly and ``clear()``
    drops all of them.

    Cost: each lookup (`get`, `get_or_pack`, `put`) reads the whole array once: about
    0.9 ms for a 2048 x 640 float32 weight (5 MiB, ~5.6 GB/s on a 2-core Xeon), half
    the time of packing it (1.9 ms) and about 60 single-row (M = 1) products with it.
    A router's layer looks its weight up once, when it first packs, not at every
    forward.  A cache with ``max_bytes=0`` stores nothing and skips the checksum.

    Parameters
    ----------
    max_bytes : int or None
        Upper bound on the bytes of packed weights held by the cache; least
        recently used entries are evicted beyond it.  ``None``: unbounded.
        An entry larger than the bound is not cached at all.

    Raises
    ------
    ValueError
        If `max_bytes` is not None or an integer >= 0.
    """

    def __init__(self, max_bytes: int | None = 1 << 30) -> None:
        if max_bytes is not None and (isinstance(max_bytes, bool)
                                      or not isinstance(max_bytes, (int, np.integer))
                                      or max_bytes < 0):
            raise ValueError(f"max_bytes must be None or an integer >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        # key -> (weak reference to the array, its checksum when packed, packed, nbytes)
        self._entries: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._nbytes = 0
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(array: np.ndarray, *settings: Hashable) -> tuple[Hashable, ...]:
        """The entry key of `array` packed with `settings` (identity, shape and dtype)."""
        return (id(array), tuple(array.shape), array.dtype.str) + tuple(settings)

    @property
    def nbytes(self) -> int:
        """Bytes of packed weights currently held."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key):
        self._nbytes -= self._entries.pop(key)[3]

    def _purge_stale(self):
        for key in [k for k, entry in self._entries.items() if entry[0]() is None]:
            self._drop(key)

    def _get(self, array, checksum, settings):
        key = self.key(array, *settings)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (entry[0]() is not array or entry[1] != checksum):
                self._drop(key)  # another array under a reused id, or edited contents
                entry = None
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[2]

    def _put(self, array, checksum, packed, settings):
        key = self.key(array, *settings)
        n = int(packed.nbytes)
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._purge_stale()
            if self.max_bytes is not None and n > self.max_bytes:
                return
            self._entries[key] = (weakref.ref(array), checksum, packed, n)
            self._nbytes += n
            while self.max_bytes is not None and self._nbytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, array: np.ndarray, *settings: Hashable) -> PackedWeight | None:
        """The packed weight cached for `array`, as its contents are now, and `settings`; or
        None."""
        return self._get(array, content_checksum(array), settings)

    def put(self, array: np.ndarray, packed: PackedWeight, *settings: Hashable) -> None:
        """Insert (or refresh) an entry, then evict down to `max_bytes`.

        `packed` must have been packed from `array`'s current contents: their checksum
        is recorded now (`get_or_pack` records it before packing instead).
        """
        self._put(array, content_checksum(array), packed, settings)

    def get_or_pack(self, array: np.ndarray, pack: Callable[[], PackedWeight],
                    *settings: Hashable) -> PackedWeight:
        """Cached packed weight, or ``pack()`` inserted into the cache."""
        if self.max_bytes == 0:  # nothing can be stored: skip the checksum
            with self._lock:
                self.misses += 1
            return pack()
        checksum = content_checksum(array)
        packed = self._get(array, checksum, settings)
        if packed is None:
            packed = pack()
            self._put(array, checksum, packed, settings)
        return packed

    def invalidate(self, array: np.ndarray) -> int:
        """Drop every entry packed from `array` (any settings); returns how many."""
        with self._lock:
            keys = [k for k, entry in self._entries.items() if entry[0]() is array]
            for key in keys:
                self._drop(key)
            return len(keys)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._nbytes = 0


_DEFAULT_CACHE: WeightCache | None = None
_DEFAULT_CACHE_LOCK = threading.Lock()


def default_cache() -> WeightCache:
    """The process-wide cache used by routers created without one (1 GiB bound)."""
    global _DEFAULT_CACHE
    with _DEFAULT_CACHE_LOCK:
        if _DEFAULT_CACHE is None:
            _DEFAULT_CACHE = WeightCache(1 << 30)
        return _DEFAULT_CACHE
