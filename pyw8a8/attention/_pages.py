"""One layer's int8 keys and values in pages of tokens.  A full page is packed once for the
kernels, the keys as an (tokens, head_dim) weight (the scores' product), the values
transposed, (head_dim, tokens) (the probabilities' product), and never touched again.  The
last page, while it fills, keeps its int8 rows only: appending writes the new tokens there
and packs nothing, and its share of the products is an exact integer loop over those rows
(`_exact`).  A sliding-window layer drops whole pages that lie before every later query's
window, so it holds the window and at most one page more: a ring of pages.  A global layer
only grows, a page at a time.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import _attention
from ..packing import pack_int8

#: An open page's room for tokens grows by this many.
_ROOM_STEP = 16


@functools.lru_cache(maxsize=None)
def _ones(n):
    """A read-only float32 (n,) of ones: the scales of every packed page of n rows (the
    products are integer; a page's own array of them was 2% of its bytes)."""
    ones = np.ones(n, np.float32)
    ones.flags.writeable = False
    return ones


class Page:
    """Tokens ``start .. start + count - 1`` of one layer, every KV head: while open the int8
    rows, once full the packed products' weights; and the tokens' scales."""

    __slots__ = ("start", "count", "head_dim", "tokens", "keys", "values", "key_scales",
                 "value_scales", "packed_keys", "packed_values", "key_plans", "value_plans")

    def __init__(self, start, n_kv_heads, tokens, head_dim):
        self.start, self.count, self.head_dim, self.tokens = start, 0, head_dim, tokens
        # Room for a few tokens, grown as they come: an open page holds what it was given
        # and less than _ROOM_STEP tokens more, not a page's worth (18 layers' open pages
        # of 128 tokens were 0.07x of Gemma 3's float32 cache at 512 tokens).  A growth
        # copies the page's few rows.
        room = min(tokens, _ROOM_STEP)
        self.keys = np.zeros((n_kv_heads, room, head_dim), np.int8)
        self.values = np.zeros((n_kv_heads, room, head_dim), np.int8)
        self.key_scales = np.zeros((n_kv_heads, room), np.float32)
        self.value_scales = np.zeros((n_kv_heads, room), np.float32)
        self.packed_keys = self.packed_values = self.key_plans = self.value_plans = ()

    @property
    def stop(self):
        return self.start + self.count

    @property
    def is_open(self):
        return self.keys is not None

    def fill(self, keys, values, key_scales, value_scales):
        """Append tokens ((n_kv, n, head_dim) int8 and (n_kv, n) float32); returns how many
        fitted."""
        n = min(keys.shape[1], self.tokens - self.count)
        if self.count + n > self.keys.shape[1]:
            self._grow(min(self.tokens, -(-(self.count + n) // _ROOM_STEP) * _ROOM_STEP))
        at = slice(self.count, self.count + n)
        self.keys[:, at] = keys[:, :n]
        self.values[:, at] = values[:, :n]
        self.key_scales[:, at] = key_scales[:, :n]
        self.value_scales[:, at] = value_scales[:, :n]
        self.count += n
        return n

    def _grow(self, room):
        for name in ("keys", "values", "key_scales", "value_scales"):
            old = getattr(self, name)
            new = np.zeros(old.shape[:1] + (room,) + old.shape[2:], old.dtype)
            new[:, :self.count] = old[:, :self.count]
            setattr(self, name, new)

    def close(self):
        """The page is full: pack its keys and values for the kernels and drop the int8
        rows (the packed panels hold the same values)."""
        self.packed_keys = tuple(pack_int8(k, _ones(self.count)) for k in self.keys)
        self.packed_values = tuple(pack_int8(np.ascontiguousarray(v.T), _ones(self.head_dim))
                                   for v in self.values)
        self.keys = self.values = None
        self._plan()

    def cut(self, count):
        """Keep the first `count` tokens; a full page is opened again, from its packed
        int8 values (the same values its rows held)."""
        if not self.is_open and count < self.count:
            self.keys = np.stack([w.int8() for w in self.packed_keys])
            self.values = np.ascontiguousarray(np.stack([w.int8().T
                                                         for w in self.packed_values]))
            self.packed_keys = self.packed_values = self.key_plans = self.value_plans = ()
        self.count = count

    def select(self, index):
        """Keep the KV heads `index`, in that order."""
        for name in ("keys", "values"):
            if getattr(self, name) is not None:
                setattr(self, name, np.ascontiguousarray(getattr(self, name)[index]))
        self.key_scales = np.ascontiguousarray(self.key_scales[index])
        self.value_scales = np.ascontiguousarray(self.value_scales[index])
        for name in ("packed_keys", "packed_values", "key_plans", "value_plans"):
            held = getattr(self, name)
            setattr(self, name, tuple(held[i] for i in index) if held else ())

    def _plan(self):
        # Each an attribute of its own: packing made them, and nothing replaces them.
        self.key_plans = tuple(w.plan() for w in self.packed_keys)
        self.value_plans = tuple(w.plan() for w in self.packed_values)

    def __getstate__(self):
        # A kernel plan holds addresses, not data: a copy or pickle plans its own weights.
        return {name: getattr(self, name) for name in self.__slots__
                if name not in ("key_plans", "value_plans")}

    def __setstate__(self, state):
        for name, value in state.items():
            setattr(self, name, value)
        self._plan()

    def int8_keys(self, head):
        """The page's int8 keys of `head`, (count, head_dim)."""
        if self.is_open:
            return self.keys[head, :self.count]
        return self.packed_keys[head].int8()

    def int8_values(self, head):
        """The page's int8 values of `head`, (count, head_dim)."""
        if self.is_open:
            return self.values[head, :self.count]
        return self.packed_values[head].int8().T

    @property
    def nbytes(self):
        held = [self.key_scales, self.value_scales]
        if self.is_open:
            held += [self.keys, self.values]
        # The packed weights' scales are every page's one array of ones (`_ones`).
        return (sum(a.nbytes for a in held)
                + sum(p.panels.nbytes + p.psum.nbytes
                      for p in self.packed_keys + self.packed_values))


class LayerPages:
    """The pages of one layer: `window` None (global, grows) or the sliding window in tokens
    (a ring of pages)."""

    def __init__(self, n_kv_heads, head_dim, page_tokens, window):
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.page_tokens, self.window = page_tokens, window
        self.pages = []
        self.length = 0
        self._span, self._span_key = None, ()

    def append(self, keys, values, key_scales, value_scales):
        """Append tokens (int8 (n_kv, n, head_dim), float32 scales (n_kv, n)), first dropping
        the pages that no query from position `length` on can see."""
        self.trim()
        done, n = 0, keys.shape[1]
        while done < n:
            page = self.pages[-1] if self.pages else None
            if page is None or not page.is_open:
                page = Page(self.length + done, self.n_kv_heads, self.page_tokens,
                            self.head_dim)
                self.pages.append(page)
            done += page.fill(keys[:, done:], values[:, done:], key_scales[:, done:],
                              value_scales[:, done:])
            if page.count == self.page_tokens:
                page.close()
        self.length += n

    def trim(self):
        """Drop the pages that no query from position `length` on can see: after a long
        prefill's attention, a sliding-window layer keeps its window (and at most a page
        more), not the prompt."""
        if self.window is not None:
            first_seen = self.length - self.window + 1
            while self.pages and self.pages[0].stop <= first_seen:
                del self.pages[0]

    def truncate(self, length):
        """Forget the positions from `length` on (see `Int8KVCache._truncate`)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot keep {length} of {self.length} tokens")
        first = self.pages[0].start if self.pages else self.length
        if self.window is not None and first > max(0, length - self.window + 1):
            raise RuntimeError(f"cannot remove {self.length - length} tokens: this "
                               f"sliding-window layer keeps only its last "
                               f"{self.length - first}")
        while self.pages and self.pages[-1].start >= length:
            del self.pages[-1]
        if self.pages:
            self.pages[-1].cut(length - self.pages[-1].start)
        self.length = length
        self._span, self._span_key = None, ()

    def select(self, index):
        """Keep the KV heads `index`, in that order, in every page."""
        for page in self.pages:
            page.select(index)
        self.n_kv_heads = len(index)
        self._span, self._span_key = None, ()

    def covering(self, lo, hi):
        """The pages holding any position in [lo, hi)."""
        return [p for p in self.pages if p.stop > lo and p.start < hi]

    def seen(self, lo, hi):
        """(the full pages holding any position in [lo, hi) as one `PackedSpan`, the open
        page if it holds one, else None): what the queries at positions below hi whose
        window starts at lo attend to."""
        pages = self.covering(lo, hi)
        last = pages[-1] if pages and pages[-1].is_open else None
        full = pages[:-1] if last is not None else pages
        key = (full[0].start, len(full)) if full else None
        if key != self._span_key:  # a decode step's pages are the last step's
            self._span, self._span_key = PackedSpan(full, self.page_tokens), key
        return self._span, last

    @property
    def nbytes(self):
        return sum(p.nbytes for p in self.pages)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_span"], state["_span_key"] = None, ()  # the plans of the copy's own pages
        return state


class PackedSpan:
    """Consecutive full pages of one layer as int8 attention reads them: per KV head the
    plans of their packed keys and values, as `_attention.PlanTable`s, and their scales,
    concatenated.

    Attributes
    ----------
    start, count, page : int
        The positions ``start .. start + count - 1``, `page` tokens a page.
    key_table, value_table : _attention.PlanTable
        Row h: KV head h's plan per page.
    key_scales, value_scales : ndarray of float32, shape (n_kv_heads, count)
        None without pages.
    """

    __slots__ = ("start", "count", "page", "key_table", "value_table", "key_scales",
                 "value_scales")

    def __init__(self, pages, page):
        self.start = pages[0].start if pages else 0
        self.count, self.page = sum(p.count for p in pages), page
        heads = range(len(pages[0].key_plans)) if pages else range(0)
        self.key_table = _attention.PlanTable([[p.key_plans[h] for p in pages] for h in heads])
        self.value_table = _attention.PlanTable([[p.value_plans[h] for p in pages]
                                               for h in heads])
        self.key_scales = _joined([p.key_scales for p in pages])
        self.value_scales = _joined([p.value_scales for p in pages])


def _joined(scales):
    return np.concatenate(scales, axis=1) if scales else None
