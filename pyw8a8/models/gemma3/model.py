"""`Gemma3`: the float32 numpy forward pass of a Gemma 3 text model, with every weight matmul
pluggable."""

from __future__ import annotations

import math
import threading

import numpy as np

from ...attention import Int8KVCache, int8_attention
from ...router import SeparatePair, float_linear
from .config import EMBEDDING_NAME, OUTPUT_NAME, Gemma3Config
from .layers import KVCache, apply_rope, geglu, rms_norm
from .weights import ensure_cache, load_config, load_tokenizer, load_weights

__all__ = ["KV_CACHE_KINDS", "Gemma3", "load_model"]

#: The KV caches a model makes (`Gemma3.new_cache`): float32, or int8 (`Int8KVCache`) with
#: the keys rotated, or without the rotation (the ablation).
KV_CACHE_KINDS = ("float", "int8", "int8-norot")


def _checked_tensor(weights, name, shape):
    """weights[name], checked to be a float32 array of `shape`."""
    if name not in weights:
        raise KeyError(f"weights lack tensor {name!r}")
    w = weights[name]
    if tuple(w.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(w.shape)}")
    if w.dtype != np.float32:
        raise ValueError(f"{name}: expected float32, got {w.dtype}")
    return w


def _norm(get, name, n):
    """A norm's (n,) weights, copied into RAM (small; the file may be memory-mapped)."""
    return np.array(get(name, (n,)), dtype=np.float32)


class _Layer:
    __slots__ = (
        "q", "k", "v", "o", "gate_up", "down", "attn_norm", "q_norm", "k_norm",
        "post_attn_norm", "ffn_norm", "post_ffn_norm", "is_global", "inv_freq",
    )


class Gemma3:
    """Float32 numpy forward pass of a Gemma 3 text model.

    Parameters
    ----------
    weights : dict[str, numpy.ndarray]
        GGUF tensor name -> float32 array (see `load_weights`).
    config : Gemma3Config, optional
        Default: inferred from the tensor shapes with Gemma 3 defaults.
    linear : callable, optional
        ``linear(name, w) -> layer`` with ``layer(x: (M, K)) -> (M, N)``.
        Called once per weight matrix at construction (layers may pack
        lazily).  Default ``pyw8a8.router.float_linear`` (the float control).
    linear_pair : callable, optional
        ``linear_pair(name_gate, w_gate, name_up, w_up) -> layer`` with
        ``layer(x) -> (gate_out, up_out)``, and optionally ``layer.glu(x,
        "gelu_tanh")`` for the fused gated unit (the router's `Int8GatedLinear` has it; the FFN
        then never forms either product in float).  Default: ``linear.pair`` if the
        factory has one, otherwise two separate ``linear`` layers.
    max_tokens_per_step : int
        Longer inputs are processed in consecutive chunks of this many
        tokens through the KV cache (bounds activation memory).
    attn_chunk_elems : int
        Bound on the number of attention scores materialized at once.
    attn_block : int
        At most this many query rows per attention block (smaller blocks
        skip more of the causally masked scores).
    kv_cache : {"float", "int8", "int8-norot"}
        The cache `new_cache` makes, and so the attention of `forward` without a
        cache: float32 keys and values (`KVCache`, float attention), or int8 ones
        (`pyw8a8.attention.Int8KVCache`: exact int8 attention, `int8_attention`),
        with the keys Hadamard-rotated or, for the ablation, not.

    Notes
    -----
    The linear factory receives the GGUF names (``blk.3.ffn_gate.weight``
    ...) and `OUTPUT_NAME` (``"output"``) for the logits layer, whose weight
    is the tied ``token_embd.weight``.  The model keeps no reference to the
    weight matrices itself, only to the norms and the (memory-mapped)
    embedding needed for the lookup.
    """

    def __init__(
        self,
        weights: dict,
        config: Gemma3Config | None = None,
        linear=None,
        linear_pair=None,
        max_tokens_per_step: int = 4096,
        attn_chunk_elems: int = 1 << 23,
        attn_block: int = 128,
        kv_cache: str = "float",
    ):
        if EMBEDDING_NAME not in weights:
            raise KeyError(f"weights lack {EMBEDDING_NAME!r}")
        self.config = c = config if config is not None else Gemma3Config.from_weights(weights)
        if c.n_heads % c.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        if c.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        if max_tokens_per_step < 1:
            raise ValueError("max_tokens_per_step must be >= 1")
        self.max_tokens_per_step = int(max_tokens_per_step)
        self.attn_chunk_elems = int(attn_chunk_elems)
        self.attn_block = max(1, int(attn_block))
        if kv_cache not in KV_CACHE_KINDS:
            raise ValueError(f"kv_cache must be one of {', '.join(map(repr, KV_CACHE_KINDS))}, "
                             f"got {kv_cache!r}")
        self.kv_cache = kv_cache

        if linear is None:
            linear = float_linear
        if linear_pair is None:
            linear_pair = getattr(linear, "pair", None)
            if linear_pair is None:
                def linear_pair(ng, wg, nu, wu):
                    return SeparatePair(linear(ng, wg), linear(nu, wu))
        self.linear = linear

        def get(name, shape):
            return _checked_tensor(weights, name, shape)

        H, D = c.hidden_size, c.head_dim
        self.embedding = get(EMBEDDING_NAME, (c.vocab_size, H))
        self.embed_scale = np.float32(math.sqrt(H))
        self.output_norm = _norm(get, "output_norm.weight", H)

        exps = np.arange(D // 2, dtype=np.float64) * 2.0 / D
        inv_freq = {True: c.rope_base_global ** -exps, False: c.rope_base_local ** -exps}
        self.layers = [self._layer(i, get, linear, linear_pair, inv_freq)
                       for i in range(c.n_layers)]
        self.output = linear(OUTPUT_NAME, self.embedding)
        self._lock = threading.Lock()

    def _layer(self, i, get, linear, linear_pair, inv_freq):
        """Layer i: its norms (copied into RAM), its linear layers from the factories and
        its RoPE frequencies (global or local)."""
        c, p = self.config, f"blk.{i}."
        H, F, D = c.hidden_size, c.ffn_size, c.head_dim
        QD, KD = c.n_heads * D, c.n_kv_heads * D
        L = _Layer()
        L.attn_norm = _norm(get, p + "attn_norm.weight", H)
        L.q_norm = _norm(get, p + "attn_q_norm.weight", D)
        L.k_norm = _norm(get, p + "attn_k_norm.weight", D)
        L.post_attn_norm = _norm(get, p + "post_attention_norm.weight", H)
        L.ffn_norm = _norm(get, p + "ffn_norm.weight", H)
        L.post_ffn_norm = _norm(get, p + "post_ffw_norm.weight", H)
        L.q = linear(p + "attn_q.weight", get(p + "attn_q.weight", (QD, H)))
        L.k = linear(p + "attn_k.weight", get(p + "attn_k.weight", (KD, H)))
        L.v = linear(p + "attn_v.weight", get(p + "attn_v.weight", (KD, H)))
        L.o = linear(p + "attn_output.weight", get(p + "attn_output.weight", (H, QD)))
        L.gate_up = linear_pair(
            p + "ffn_gate.weight", get(p + "ffn_gate.weight", (F, H)),
            p + "ffn_up.weight", get(p + "ffn_up.weight", (F, H)),
        )
        L.down = linear(p + "ffn_down.weight", get(p + "ffn_down.weight", (H, F)))
        L.is_global = c.is_global(i)
        L.inv_freq = inv_freq[L.is_global]
        return L

    # -- public API --------------------------------------------------------

    def new_cache(self) -> KVCache | Int8KVCache:
        """An empty KV cache for `forward`, of the model's `kv_cache` kind."""
        c = self.config
        if self.kv_cache == "float":
            return KVCache(c)
        windows = [None if L.is_global else c.sliding_window for L in self.layers]
        return Int8KVCache(windows, c.n_kv_heads, c.head_dim,
                           rotate_keys=self.kv_cache == "int8")

    def forward(self, token_ids, cache: KVCache | Int8KVCache | None = None,
                logits_positions=None):
        """Run the model on new tokens and return next-token logits.

        Parameters
        ----------
        token_ids : sequence of int
            New tokens (include BOS at the start of a sequence).  With a
            non-empty `cache` they continue the cached sequence.
        cache : KVCache or Int8KVCache, optional
            Updated in place.  Default: a fresh cache of the model's `kv_cache` kind
            (a full prefill).
        logits_positions : sequence of int, optional
            Indices into `token_ids` (negative allowed) whose logits to
            compute.  Default: only the last position.

        Returns
        -------
        numpy.ndarray
            float32 logits, shape ``(vocab,)`` by default, or
            ``(len(logits_positions), vocab)``.
        """
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        c = self.config
        if ids.size == 0:
            raise ValueError("token_ids is empty")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"token ids must lie in [0, {c.vocab_size})")
        single = logits_positions is None
        pos = np.array([-1] if single else logits_positions, dtype=np.int64).reshape(-1)
        if pos.size and (pos.min() < -ids.size or pos.max() >= ids.size):
            raise ValueError("logits_positions out of range")
        pos = np.where(pos < 0, pos + ids.size, pos)
        if cache is None:
            cache = self.new_cache()

        hidden = np.empty((pos.size, c.hidden_size), np.float32)
        step = self.max_tokens_per_step
        with self._lock:
            for s in range(0, ids.size, step):
                chunk = ids[s : s + step]
                x = self._run_layers(chunk, cache)
                sel = (pos >= s) & (pos < s + chunk.size)
                if sel.any():
                    hidden[sel] = x[pos[sel] - s]
            h = rms_norm(hidden, self.output_norm, c.rms_eps)
            logits = np.asarray(self.output(h), dtype=np.float32)
        return logits[0] if single else logits

    __call__ = forward

    def generate(self, token_ids, max_new_tokens: int,
                 cache: KVCache | Int8KVCache | None = None):
        """Greedy generation through the KV cache, one token per forward pass.

        The first new token comes from the prefill of `token_ids`; each later one from a
        forward pass of the previous new token alone (decode).  The tokens come from an
        iterator, each produced when asked for, so a caller can time the prefill (until the
        first token) apart from the decode steps, or stop early (at an end-of-sequence
        token, say).

        Parameters
        ----------
        token_ids : sequence of int
            The prompt (include BOS at the start of a sequence).  With a non-empty
            `cache` it continues the cached sequence.
        max_new_tokens : int
            How many tokens to generate (>= 1); no end-of-sequence token stops it.
        cache : KVCache or Int8KVCache, optional
            Updated in place; after the last token it holds every position but the last
            token's (which is never fed back).  Default: a fresh cache.

        Returns
        -------
        iterator of int
            The argmax of each step's logits (ties: the lowest id, as `numpy.argmax`).

        Raises
        ------
        ValueError
            If `max_new_tokens` < 1 or `token_ids` is empty (at the call, before any
            forward pass); as `forward` for token ids outside the vocabulary.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        prompt = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if prompt.size == 0:
            raise ValueError("token_ids is empty")
        if cache is None:
            cache = self.new_cache()
        return self._greedy(prompt, int(max_new_tokens), cache)

    def _greedy(self, prompt, max_new_tokens, cache):
        if isinstance(cache, KVCache):
            # The whole sequence's room at once: no cache growth (a copy) inside the decode
            # loop (an Int8KVCache grows a page at a time, never copying).
            cache.reserve(cache.length + prompt.size + max_new_tokens - 1)
        token = int(np.argmax(self.forward(prompt, cache)))
        yield token
        for _ in range(max_new_tokens - 1):
            token = int(np.argmax(self.forward([token], cache)))
            yield token

    # -- internals ---------------------------------------------------------

    def _run_layers(self, ids: np.ndarray, cache: KVCache | Int8KVCache) -> np.ndarray:
        c = self.config
        start = cache.length
        m = ids.size
        in_float = isinstance(cache, KVCache)
        if in_float:
            cache.reserve(start + m)
        scale = np.float32(c.query_pre_attn_scalar ** -0.5)
        x = np.asarray(self.embedding[ids], dtype=np.float32) * self.embed_scale
        positions = np.arange(start, start + m, dtype=np.float64)
        rope = {}
        for i, L in enumerate(self.layers):
            key = id(L.inv_freq)
            if key not in rope:
                ang = positions[:, None] * L.inv_freq[None, :]
                rope[key] = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
            cos, sin = rope[key]

            h = rms_norm(x, L.attn_norm, c.rms_eps)
            q = np.asarray(L.q(h), np.float32).reshape(m, c.n_heads, c.head_dim)
            k = np.asarray(L.k(h), np.float32).reshape(m, c.n_kv_heads, c.head_dim)
            v = np.asarray(L.v(h), np.float32).reshape(m, c.n_kv_heads, c.head_dim)
            q = apply_rope(rms_norm(q, L.q_norm, c.rms_eps), cos, sin)
            k = apply_rope(rms_norm(k, L.k_norm, c.rms_eps), cos, sin)
            if in_float:
                cache.write(i, start, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
                attn = self._attention(i, L, q, start, cache)
            else:
                attn = int8_attention(cache, i, q * scale, k, v, block_rows=self.attn_block)
                attn = attn.reshape(m, -1)
            o = np.asarray(L.o(attn), np.float32)
            x = x + rms_norm(o, L.post_attn_norm, c.rms_eps)

            h = rms_norm(x, L.ffn_norm, c.rms_eps)
            fused = getattr(L.gate_up, "glu", None)
            if fused is not None:  # W8A8: the gated unit in the kernels' epilogue
                act = np.asarray(fused(h, "gelu_tanh"), np.float32)
            else:
                g, u = L.gate_up(h)
                act = geglu(np.asarray(g, np.float32), np.asarray(u, np.float32))
            f = np.asarray(L.down(act), np.float32)
            x = x + rms_norm(f, L.post_ffn_norm, c.rms_eps)
        if in_float:
            cache.length = start + m
        return x

    def _attention(self, layer, L, q, start, cache):
        """Causal (and for local layers sliding-window) attention of new queries.

        q: (m, n_heads, head_dim) for positions start..start+m-1; keys and
        values for positions 0..start+m-1 are in the cache.
        """
        c = self.config
        m = q.shape[0]
        group = c.n_heads // c.n_kv_heads
        scale = np.float32(c.query_pre_attn_scalar ** -0.5)
        window = None if L.is_global else c.sliding_window
        # (n_kv, group, m, D)
        qh = (q * scale).transpose(1, 0, 2).reshape(c.n_kv_heads, group, m, c.head_dim)
        out = np.empty((c.n_kv_heads, group, m, c.head_dim), np.float32)

        span_max = start + m if window is None else min(start + m, window + m - 1)
        rows = max(1, self.attn_chunk_elems // max(1, c.n_heads * span_max))
        # Small query blocks skip most of the causally masked key range.
        rows = min(rows, self.attn_block)
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            q_lo, q_hi = start + r0, start + r1  # absolute query positions [q_lo, q_hi)
            k_lo = 0 if window is None else max(0, q_lo - window + 1)
            k_hi = q_hi
            keys = cache.keys(layer, k_lo, k_hi)  # (n_kv, T, D)
            vals = cache.values(layer, k_lo, k_hi)
            qc = qh[:, :, r0:r1].reshape(c.n_kv_heads, group * (r1 - r0), c.head_dim)
            s = np.matmul(qc, keys.transpose(0, 2, 1))  # (n_kv, group*mc, T)
            s = s.reshape(c.n_kv_heads, group, r1 - r0, k_hi - k_lo)
            qpos = np.arange(q_lo, q_hi)[:, None]
            kpos = np.arange(k_lo, k_hi)[None, :]
            masked = kpos > qpos
            if window is not None:
                masked |= (qpos - kpos) >= window
            if masked.any():
                # An additive 0 / -inf mask broadcast over the heads: a tenth of the time
                # of assigning through the boolean index.
                s += np.where(masked, np.float32(-np.inf), np.float32(0.0))
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            pv = np.matmul(s.reshape(c.n_kv_heads, group * (r1 - r0), k_hi - k_lo), vals)
            out[:, :, r0:r1] = pv.reshape(c.n_kv_heads, group, r1 - r0, c.head_dim)
        # head h = kv * group + g  ->  (m, n_heads * D)
        return out.reshape(c.n_heads, m, c.head_dim).transpose(1, 0, 2).reshape(m, -1)


def load_model(directory=None, linear=None, linear_pair=None, progress: bool = False):
    """Convenience loader.

    Returns
    -------
    (Gemma3, Tokenizer)
    """
    directory = ensure_cache(directory, progress=progress)
    weights = load_weights(directory)
    model = Gemma3(weights, config=load_config(directory), linear=linear, linear_pair=linear_pair)
    return model, load_tokenizer(directory)
