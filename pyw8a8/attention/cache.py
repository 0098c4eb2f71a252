"""`Int8KVCache`: a transformer's keys and values as int8, one float32 scale per token and KV
head, in pages packed once for pyw8a8's exact int8 products."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .._validation import float_array
from ..rotation import check_rotation, rotate, rotate_checked, unrotate
from ._exact import quantize_terms
from ._pages import LayerPages

__all__ = ["Int8KVCache"]


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _default_page(window):
    """`Int8KVCache`'s default page_tokens for a layer of `window` (None: global)."""
    if window is None:
        return 256
    return 1 << min(8, max(4, (max(1, window // 4)).bit_length() - 1))


def _terms(value, name):
    if isinstance(value, bool) or value not in (1, 2):
        raise ValueError(f"{name} must be 1 or 2, got {value!r}")
    return int(value)


class Int8KVCache:
    """Keys and values of every layer as int8, for `int8_attention`.

    Each token's key and value of each KV head is quantized symmetrically, round to
    nearest, to [-127, 127] with the scale ``max|x| / 127`` (as pyw8a8 quantizes
    activations).  With `rotate_keys` the keys are first rotated by pyw8a8's block
    randomized Hadamard transform (`pyw8a8.rotate`, orthonormal), and `int8_attention`
    rotates the queries the same way, so ``q . k`` is unchanged in exact arithmetic while
    an outlier feature no longer sets the whole key's scale.  `rotate_values` does the same
    for the values (the attention output is rotated back).

    Tokens are held in pages of `page_tokens`: appending packs only the last, open page
    again; a full page is packed once and never rewritten.  A global layer grows a page at
    a time; a sliding-window layer drops the pages that no later query can see, so it
    holds its window and at most one page more.

    Parameters
    ----------
    windows : sequence of (int or None)
        One entry per layer: None for a global (causal) layer, else its sliding window in
        tokens (a query at position t sees the keys at t - window + 1 .. t).
    n_kv_heads, head_dim : int
        The KV heads per layer and their width.
    rotate_keys : bool
        Rotate keys and queries (default True).
    rotate_values : bool
        Rotate values (default False).
    query_terms, probability_terms : {1, 2}
        int8 terms per query row and per probability row in `int8_attention`: 2 adds the
        row's quantization residual as a second int8 row of the same product (default 2).
    block : int, optional
        The rotation's block, a power of two from 16 to 4096 dividing `head_dim`; default
        `head_dim`.
    seed : int
        The rotation's random signs (default 0).
    page_tokens : int, optional
        Tokens per page.  Default: 256 for a global layer, and for a sliding-window layer
        a quarter of its window (a power of two from 16 to 256).  Larger pages mean fewer,
        larger products (at 8,192 tokens, 256 prefilled 1.13x and decoded 1.25x as fast as
        128, Zen 5); a sliding layer holds its window and up to a page more.

    Attributes
    ----------
    n_layers : int
    length : int
        Positions appended to every layer.

    Raises
    ------
    ValueError
        If a window is not None or a positive int, `n_kv_heads`, `head_dim` or
        `page_tokens` is not a positive int, a terms count is not 1 or 2, or the rotation
        does not fit `head_dim` (the message names the argument).
    """

    def __init__(self, windows: Sequence[int | None], n_kv_heads: int, head_dim: int, *,
                 rotate_keys: bool = True, rotate_values: bool = False,
                 query_terms: int = 2, probability_terms: int = 2,
                 block: int | None = None, seed: int = 0,
                 page_tokens: int | None = None) -> None:
        if isinstance(windows, (str, bytes)) or not isinstance(windows, Sequence):
            raise TypeError(f"windows must be a sequence (one entry per layer), got "
                            f"{type(windows).__name__}")
        self.windows = tuple(None if w is None else _positive_int(w, f"windows[{i}]")
                             for i, w in enumerate(windows))
        self.n_kv_heads = _positive_int(n_kv_heads, "n_kv_heads")
        self.head_dim = _positive_int(head_dim, "head_dim")
        self.page_tokens = None if page_tokens is None else _positive_int(page_tokens,
                                                                          "page_tokens")
        self.query_terms = _terms(query_terms, "query_terms")
        self.probability_terms = _terms(probability_terms, "probability_terms")
        self.rotate_keys, self.rotate_values = bool(rotate_keys), bool(rotate_values)
        self.block = self.head_dim if block is None else block
        self.seed = seed
        if self.rotate_keys or self.rotate_values:
            try:
                self.block, self.seed = check_rotation(self.head_dim, self.block, seed,
                                                       name="head_dim", caller="rotate")
            except ValueError as exc:
                raise ValueError(f"the rotation of head_dim={self.head_dim} with block="
                                 f"{self.block} (default: head_dim): {exc}") from None
        self._layers = [LayerPages(self.n_kv_heads, self.head_dim,
                                   self.page_tokens or _default_page(w), w)
                        for w in self.windows]

    @property
    def n_layers(self) -> int:
        return len(self._layers)

    @property
    def length(self) -> int:
        return min((p.length for p in self._layers), default=0)

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed pages, the open pages' int8 rows and every scale."""
        return sum(p.nbytes for p in self._layers)

    def held(self, layer: int) -> range:
        """The positions whose keys and values `layer` holds (its pages')."""
        pages = self._pages(layer).pages
        return range(pages[0].start, pages[-1].stop) if pages else range(0)

    def quantized_keys(self, layer: int) -> tuple[npt.NDArray[np.int8],
                                                   npt.NDArray[np.float32]]:
        """The held keys of `layer` (rotated when `rotate_keys`).

        Returns
        -------
        q : ndarray of int8, shape (n_kv_heads, len(held(layer)), head_dim)
        scale : ndarray of float32, shape (n_kv_heads, len(held(layer)))
            The keys are ``q * scale[..., None]``.
        """
        return self._gather(layer, "int8_keys", "key_scales")

    def quantized_values(self, layer: int) -> tuple[npt.NDArray[np.int8],
                                                     npt.NDArray[np.float32]]:
        """The held values of `layer` (rotated when `rotate_values`), as `quantized_keys`."""
        return self._gather(layer, "int8_values", "value_scales")

    def append(self, layer: int, keys: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Quantize and append the keys and values of the next positions of `layer`.

        Parameters
        ----------
        layer : int
        keys, values : array_like of float32 or float64, shape (n, n_kv_heads, head_dim)
            Keys after their norm and RoPE; values.

        Raises
        ------
        TypeError, ValueError
            For a bad layer, dtype or shape, or NaN/Inf (the message names the argument).
        """
        self._append(layer, keys, values, ("keys", "values"))

    def _append(self, layer, keys, values, names):
        """`append`, its errors naming the keys and values `names` (a caller's arguments)."""
        pages = self._pages(layer)
        k, v = self._heads(keys, names[0]), self._heads(values, names[1])
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"{names[0]} and {names[1]} differ in tokens: {k.shape[1]} "
                             f"and {v.shape[1]}")
        self._append_heads(pages, k, v, names)

    def _append_heads(self, pages, k, v, names):
        """Append k and v, (n_kv_heads, n, head_dim) float32 C-contiguous, to `pages` (a
        layer's).  Keys and values are quantized in one call: a decode step's few rows
        cost that call's overhead, not their arithmetic."""
        k, v = self.rotated(k, self.rotate_keys), self.rotated(v, self.rotate_values)
        rows = np.concatenate([k.reshape(-1, self.head_dim), v.reshape(-1, self.head_dim)])
        try:
            q, scale = quantize_terms(rows, 1, " and ".join(names))
        except ValueError:  # NaN or Inf; or finite, but beyond float32 once rotated
            for x, name in ((k, names[0]), (v, names[1])):
                if not np.isfinite(x).all():
                    raise ValueError(f"{name} holds NaN or Inf") from None
            raise ValueError(f"{' and '.join(names)}: beyond the float32 range once "
                             f"rotated") from None
        heads, n = self.n_kv_heads, k.shape[1]
        half = heads * n
        pages.append(q[:half].reshape(heads, n, self.head_dim),
                     q[half:].reshape(heads, n, self.head_dim),
                     scale[:half].reshape(heads, n), scale[half:].reshape(heads, n))

    def _truncate(self, layer, length):
        """Forget the positions of `layer` from `length` on; RuntimeError where a sliding
        window has dropped tokens a query at `length` would see."""
        self._pages(layer).truncate(length)

    def _select_streams(self, index):
        """Keep the KV heads `index` (int array, in that order) of every layer: the
        batch rows of a caller that lays a batch out as heads."""
        for pages in self._layers:
            pages.select(index)
        self.n_kv_heads = len(index)

    def rotated(self, x: npt.ArrayLike, on: bool = True) -> npt.NDArray[np.float32]:
        """x rotated as the cache rotates keys (and values): the queries' rotation.

        Parameters
        ----------
        x : array_like of float32 or float64, shape (..., head_dim)
        on : bool
            False returns x unchanged (a cache whose keys are not rotated).

        Returns
        -------
        ndarray of float32, shape (..., head_dim)
            ``pyw8a8.rotate(x, block, seed)``: orthonormal, so ``rotated(q) . rotated(k)``
            is ``q . k`` in exact arithmetic.
        """
        if not on:
            return x
        if (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous
                and x.ndim and x.shape[-1] == self.head_dim):
            return rotate_checked(x, self.block, self.seed)  # the cache's own calls
        return rotate(x, block=self.block, seed=self.seed)

    def unrotated(self, y: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """The inverse of `rotated`: y (..., head_dim) float32/float64 rotated back,
        float32."""
        return unrotate(y, block=self.block, seed=self.seed)

    def _heads(self, x, name):
        """x (n, n_kv_heads, head_dim) float32/float64, checked, as (n_kv_heads, n,
        head_dim) float32 C-contiguous."""
        arr = float_array(x, name)
        if arr.ndim != 3 or arr.shape[1:] != (self.n_kv_heads, self.head_dim):
            raise ValueError(f"{name} must have shape (n, n_kv_heads={self.n_kv_heads}, "
                             f"head_dim={self.head_dim}), got {arr.shape}")
        return np.ascontiguousarray(arr.transpose(1, 0, 2), np.float32)

    def _pages(self, layer):
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not (
                0 <= layer < len(self._layers)):
            raise ValueError(f"layer must be an int in [0, {len(self._layers)}), got "
                             f"{layer!r}")
        return self._layers[layer]

    def _gather(self, layer, int8_rows, scales):
        pages = self._pages(layer).pages
        n = sum(p.count for p in pages)
        q = np.empty((self.n_kv_heads, n, self.head_dim), np.int8)
        s = np.empty((self.n_kv_heads, n), np.float32)
        at = 0
        for p in pages:
            for h in range(self.n_kv_heads):
                q[h, at:at + p.count] = getattr(p, int8_rows)(h)
            s[:, at:at + p.count] = getattr(p, scales)[:, :p.count]
            at += p.count
        return q, s

    def __repr__(self) -> str:
        return (f"Int8KVCache(layers={self.n_layers}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, length={self.length}, "
                f"rotate_keys={self.rotate_keys}, rotate_values={self.rotate_values}, "
                f"nbytes={self.nbytes})")

