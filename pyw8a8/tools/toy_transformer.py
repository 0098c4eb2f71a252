"""A small numpy transformer whose linear layers go through numpy or pyw8a8, with default
settings: numpy's BLAS runs the attention, pyw8a8 the linear layers, their thread pools
taking turns on the cores.  ``bench --mixed``, asv's ``MixedModel`` and the thread
policy's tests use it."""
import time

import numpy as np

from ..matmul import matmul
from ..packing import pack_weight

LAYERS, D, F, HEADS, TOKENS = 6, 640, 2048, 10, 256


def build(seed=0, layers=LAYERS, d=D, f=F):
    """Random float32 weights, (out, in) like torch.nn.Linear, scaled to unit gain."""
    rng = np.random.default_rng(seed)

    def weight(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    return [{"qkv": weight(3 * d, d), "o": weight(d, d), "up": weight(2 * f, d),
             "down": weight(d, f)} for _ in range(layers)]


def forward(x, layers, linear, heads=HEADS):
    """Pre-norm blocks: attention (numpy) and a SiLU-gated FFN; linear(x, w) ~ x @ w.T."""
    t, d = x.shape
    hd = d // heads

    def norm(v):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + np.float32(1e-6))
    for layer in layers:
        q, k, v = np.split(linear(norm(x), layer["qkv"]), 3, axis=1)
        q = q.reshape(t, heads, hd).transpose(1, 0, 2)
        k = k.reshape(t, heads, hd).transpose(1, 2, 0)
        v = v.reshape(t, heads, hd).transpose(1, 0, 2)
        scores = q @ k / np.float32(np.sqrt(hd))
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        x = x + linear((scores @ v).transpose(1, 0, 2).reshape(t, d), layer["o"])
        g, u = np.split(linear(norm(x), layer["up"]), 2, axis=1)
        x = x + linear(g / (1 + np.exp(-g)) * u, layer["down"])
    return x


def float_linear(x, w):
    return x @ w.T


def w8a8_linear(layers, **pack_kw):
    """A linear(x, w) running pyw8a8.matmul on weights packed once, here."""
    packed = {id(w): pack_weight(w, **pack_kw) for layer in layers for w in layer.values()}
    return lambda x, w: matmul(x, packed[id(w)])


def best_times(rounds=7, seed=0, tokens=TOKENS):
    """Best forward seconds of the float and the W8A8 model, taking turns in one process."""
    layers = build(seed)
    x = np.random.default_rng(seed + 1).standard_normal((tokens, D)).astype(np.float32)
    variants = {"float": float_linear, "w8a8": w8a8_linear(layers)}
    best = {name: float("inf") for name in variants}
    for name, linear in variants.items():  # first calls (tuning, page faults) untimed
        forward(x, layers, linear)
    for _ in range(rounds):
        for name, linear in variants.items():
            t0 = time.perf_counter()
            forward(x, layers, linear)
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def relative_error(seed=0, tokens=TOKENS):
    """Max-abs difference of the W8A8 forward from the float one, over the float output's RMS."""
    layers = build(seed)
    x = np.random.default_rng(seed + 1).standard_normal((tokens, D)).astype(np.float32)
    expected = forward(x, layers, float_linear)
    got = forward(x, layers, w8a8_linear(layers))
    return float(np.abs(got - expected).max() / np.sqrt(np.mean(expected ** 2)))
