"""The float32 building blocks of the forward pass: `KVCache`, RMSNorm, GeGLU and RoPE."""

from __future__ import annotations

import math

import numpy as np

from .config import Gemma3Config

__all__ = ["KVCache", "apply_rope", "geglu", "rms_norm"]


class KVCache:
    """Per-layer keys (after norm and RoPE) and values for incremental decoding.

    ``length`` is the number of positions already processed.  Storage grows
    geometrically; each layer holds arrays of shape ``(n_kv_heads, capacity,
    head_dim)``.
    """

    def __init__(self, config: Gemma3Config):
        self.config = config
        self.length = 0
        self._cap = 0
        shape = (config.n_kv_heads, 0, config.head_dim)
        self._k = [np.empty(shape, np.float32) for _ in range(config.n_layers)]
        self._v = [np.empty(shape, np.float32) for _ in range(config.n_layers)]

    def reserve(self, total: int) -> None:
        if total <= self._cap:
            return
        cap = max(total, 2 * self._cap, 64)
        c = self.config
        for store in (self._k, self._v):
            for i, old in enumerate(store):
                new = np.empty((c.n_kv_heads, cap, c.head_dim), np.float32)
                new[:, : self.length] = old[:, : self.length]
                store[i] = new
        self._cap = cap

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        m = k.shape[1]
        self._k[layer][:, start : start + m] = k
        self._v[layer][:, start : start + m] = v

    def keys(self, layer: int, start: int, stop: int) -> np.ndarray:
        return self._k[layer][:, start:stop]

    def values(self, layer: int, start: int, stop: int) -> np.ndarray:
        return self._v[layer][:, start:stop]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._k) + sum(a.nbytes for a in self._v)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis (row sums of squares by einsum: half
    the time of np.mean(np.square(x)), with no temporary the size of x)."""
    inv = np.einsum("...i,...i->...", x, x)[..., None]
    inv *= np.float32(1.0 / x.shape[-1])
    inv += np.float32(eps)
    np.sqrt(inv, out=inv)
    np.divide(np.float32(1.0), inv, out=inv)
    out = x * inv
    out *= w
    return out


_GELU_C = math.sqrt(2.0 / math.pi)


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up, with 0.5 (1 + tanh(v)) written as 1 / (1 + exp(-2 v)).

    The two forms are equal; numpy's float32 exp is vectorized where its tanh is not, so
    this takes half the time (it was a sixth of the whole forward pass).  exp overflows to
    Inf for very negative gates, giving the correct limit 0.
    """
    t = gate * gate
    t *= np.float32(-2.0 * _GELU_C * 0.044715)
    t -= np.float32(2.0 * _GELU_C)
    t *= gate  # -2 v, v = c (g + 0.044715 g^3)
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += np.float32(1.0)
    out = gate * up
    out /= t
    return out


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX (half-split) rotary embedding; x: (m, heads, D), cos/sin: (m, D/2)."""
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    cs = cos[:, None, :]
    sn = sin[:, None, :]
    out = np.empty_like(x)
    out[..., :half] = x1 * cs - x2 * sn
    out[..., half:] = x2 * cs + x1 * sn
    return out
