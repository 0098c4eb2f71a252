"""One layer's int8 keys and values in pages of tokens, each page packed once for the
kernels: the keys as an (tokens, head_dim) weight (the scores' product), the values
transposed, (head_dim, tokens) (the probabilities' product).

Appending writes the new tokens into the open page (the last, partly filled one) and packs
only that page again; a page that fills is never touched again.  A sliding-window layer
drops whole pages that lie before every later query's window, so it holds the window and at
most one page more: a ring of pages.  A global layer only grows, a page at a time.
"""
from __future__ import annotations

import numpy as np

from ..packing import pack_int8


class Page:
    """Tokens ``start .. start + count - 1`` of one layer, every KV head: the int8 rows
    (kept while the page is open), their scales and the packed products' weights."""

    __slots__ = ("start", "count", "keys", "values", "key_scales", "value_scales",
                 "packed_keys", "packed_values")

    def __init__(self, start, n_kv_heads, tokens, head_dim):
        self.start = start
        self.count = 0
        self.keys = np.zeros((n_kv_heads, tokens, head_dim), np.int8)
        self.values = np.zeros((n_kv_heads, tokens, head_dim), np.int8)
        self.key_scales = np.zeros((n_kv_heads, tokens), np.float32)
        self.value_scales = np.zeros((n_kv_heads, tokens), np.float32)
        self.packed_keys = self.packed_values = ()

    @property
    def stop(self):
        return self.start + self.count

    def fill(self, keys, values, key_scales, value_scales):
        """Append tokens ((n_kv, n, head_dim) int8 and (n_kv, n) float32) and pack the page
        again; returns how many fitted."""
        n = min(keys.shape[1], self.keys.shape[1] - self.count)
        at = slice(self.count, self.count + n)
        self.keys[:, at] = keys[:, :n]
        self.values[:, at] = values[:, :n]
        self.key_scales[:, at] = key_scales[:, :n]
        self.value_scales[:, at] = value_scales[:, :n]
        self.count += n
        ones = np.ones(self.keys.shape[2], np.float32)
        live = slice(0, self.count)
        self.packed_keys = tuple(pack_int8(k[live], np.ones(self.count, np.float32))
                                 for k in self.keys)
        self.packed_values = tuple(pack_int8(np.ascontiguousarray(v[live].T), ones)
                                   for v in self.values)
        return n

    def close(self):
        """The page is full: keep the packed weights and scales, drop the int8 rows (the
        packed panels hold the same values)."""
        self.keys = self.values = None
        self.key_scales = self.key_scales.copy()
        self.value_scales = self.value_scales.copy()

    @property
    def nbytes(self):
        held = [self.key_scales, self.value_scales]
        if self.keys is not None:
            held += [self.keys, self.values]
        return (sum(a.nbytes for a in held)
                + sum(p.nbytes for p in self.packed_keys + self.packed_values))


class LayerPages:
    """The pages of one layer: `window` None (global, grows) or the sliding window in tokens
    (a ring of pages)."""

    def __init__(self, n_kv_heads, head_dim, page_tokens, window):
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.page_tokens, self.window = page_tokens, window
        self.pages = []
        self.length = 0

    def append(self, keys, values, key_scales, value_scales):
        """Append tokens (int8 (n_kv, n, head_dim), float32 scales (n_kv, n)), first dropping
        the pages that no query from position `length` on can see."""
        if self.window is not None:
            first_seen = self.length - self.window + 1
            while self.pages and self.pages[0].stop <= first_seen:
                del self.pages[0]
        done, n = 0, keys.shape[1]
        while done < n:
            page = self.pages[-1] if self.pages else None
            if page is None or page.keys is None:
                page = Page(self.length + done, self.n_kv_heads, self.page_tokens,
                            self.head_dim)
                self.pages.append(page)
            done += page.fill(keys[:, done:], values[:, done:], key_scales[:, done:],
                              value_scales[:, done:])
            if page.count == self.page_tokens:
                page.close()
        self.length += n

    def covering(self, lo, hi):
        """The pages holding any position in [lo, hi)."""
        return [p for p in self.pages if p.stop > lo and p.start < hi]

    @property
    def nbytes(self):
        return sum(p.nbytes for p in self.pages)
