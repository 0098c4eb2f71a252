"""`WeightCache`: a bounded LRU cache of packed weights, shared by the layers built from one array."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import numpy as np

__all__ = ["WeightCache", "default_cache"]


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
        n = int(packed.nbytes)
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._purge_stale()
            if self.max_bytes is not None and n > self.max_bytes:
                return
            self._entries[key] = (weakref.ref(array), packed, n)
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
