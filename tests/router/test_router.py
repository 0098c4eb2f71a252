"""Tests of pyw8a8.router: routing decisions, lazy packing, the
packed-weight cache and the packed-weight file format.

Most tests give the router a tiny exact fake backend instead of the compiled kernels (so
they check the plumbing, not the kernels); the tests at the end use the real kernels.
"""

import logging
import threading

import numpy as np
import pytest

from pyw8a8.models.gemma3.layers import geglu
from pyw8a8.router import (
    FloatLinear,
    Int8GatedLinear,
    Int8Linear,
    Router,
    RouterConfig,
    WeightCache,
    load_packed,
    save_packed,
)

# ---------------------------------------------------------------------------
# A fake backend: exact float "packing", records every call
# ---------------------------------------------------------------------------


class FakePacked:
    def __init__(self, w, rotate=False, block=128, seed=0, encoding="auto"):
        self.w = np.array(w, dtype=np.float32, copy=True)
        self.shape = self.w.shape
        self.rotate, self.block, self.seed, self.encoding = rotate, block, seed, encoding

    @property
    def nbytes(self):
        return self.w.size  # pretend one byte per weight

    def to_dict(self):
        return {"w": self.w, "rot": np.array([self.rotate, self.block, self.seed], np.int64)}

    @classmethod
    def from_dict(cls, d):
        if set(d) != {"w", "rot"}:
            raise ValueError(f"bad keys {sorted(d)}")
        r, b, s = (int(v) for v in d["rot"])
        return cls(d["w"], bool(r), b, s)


class FakeKernels:
    PackedWeight = FakePacked

    def __init__(self):
        self.packs = []
        self.pair_calls = 0
        self.equalize_calls = 0
        self.lock = threading.Lock()

    def pack_weight(self, w, *, rotate=False, block=128, seed=0, encoding="auto", pad=None):
        with self.lock:
            self.packs.append((w.shape, rotate, block, seed))
        return FakePacked(w, rotate, block, seed, encoding)

    def matmul(self, x, p, bias=None):
        y = (np.asarray(x, np.float32) @ p.w.T).astype(np.float32)
        return y if bias is None else y + bias

    def matmul_pair(self, x, p1, p2, glu=None, bias1=None, bias2=None):
        self.pair_calls += 1
        y1, y2 = self.matmul(x, p1, bias1), self.matmul(x, p2, bias2)
        if glu is None:
            return y1, y2
        assert glu == "gelu_tanh", glu  # what the tests' models ask for
        return geglu(y1, y2)

    def equalize_ffn(self, w_gate, w_up, w_down, clamp=16.0):
        self.equalize_calls += 1
        s = np.linspace(0.5, 4.0, w_up.shape[0]).astype(np.float32)
        return w_gate, w_up * s[:, None], w_down / s[None, :]


@pytest.fixture
def fake():
    return FakeKernels()


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------
# Routing decisions (RouterConfig itself: test_router_config.py)
# ---------------------------------------------------------------------------


def test_decide_defaults_everything_w8a8():
    r = Router(RouterConfig())
    assert r.decide("blk.0.attn_q.weight", (1024, 640))
    assert r.decide("output", (262144, 640))


def test_decide_reads_every_setting_of_the_rule():
    """The rule itself is tested in test_selection.py; here, the router passes it each
    setting and the weight's (N, K)."""
    r = Router(RouterConfig(include=["blk.*"], exclude=["*ffn_down*"], min_in_features=1024,
                            skip_rows=100000))
    assert r.decide("blk.0.ffn_up.weight", (99999, 1024))
    assert not r.decide("output", (640, 2048))  # not included
    assert not r.decide("blk.0.ffn_down.weight", (640, 2048))  # excluded
    assert not r.decide("blk.0.attn_q.weight", (1024, 640))  # K < min_in_features
    assert not r.decide("blk.0.ffn_up.weight", (100000, 2048))  # N >= skip_rows
    with pytest.raises(ValueError):
        r.decide("x", (3,))


@pytest.mark.parametrize("old, new", [("Linear", "Int8Linear"),
                                      ("LinearPair", "Int8GatedLinear")])
def test_former_layer_names_warn_and_give_the_new_classes(old, new):
    import pyw8a8.router

    with pytest.warns(DeprecationWarning, match=f"pyw8a8.router.{old} is deprecated, use "
                                                 f"pyw8a8.router.{new}"):
        cls = getattr(pyw8a8.router, old)
    assert cls is getattr(pyw8a8.router, new)
    with pytest.raises(AttributeError):
        pyw8a8.router.NoSuchLayer  # noqa: B018


def test_router_factory_kinds_and_laziness(fake):
    r = Router(RouterConfig(exclude=["*attn_k*"]), cache=WeightCache(None), backend=fake)
    q = r("blk.0.attn_q.weight", rand(8, 4))
    k = r("blk.0.attn_k.weight", rand(2, 4))
    assert isinstance(q, Int8Linear) and isinstance(k, FloatLinear)
    assert fake.packs == [] and not q.is_packed  # nothing packed at construction
    pair = r.pair("blk.0.ffn_gate.weight", rand(6, 4, seed=1),
                  "blk.0.ffn_up.weight", rand(6, 4, seed=2))
    assert isinstance(pair, Int8GatedLinear)
    x = rand(3, 4, seed=3)
    g, u = pair(x)
    assert fake.pair_calls == 1
    np.testing.assert_allclose(g, x @ rand(6, 4, seed=1).T, rtol=1e-6)
    np.testing.assert_allclose(u, x @ rand(6, 4, seed=2).T, rtol=1e-6)
    mixed = Router(RouterConfig(exclude=["*ffn_up*"]), backend=fake).pair(
        "g", rand(6, 4), "blk.0.ffn_up.weight", rand(6, 4))
    assert not isinstance(mixed, Int8GatedLinear)
    assert set(r.layers) == {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                             "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"}
    st = r.stats()
    assert st["w8a8_layers"] == 3 and st["float_layers"] == 1


def test_k_not_a_multiple_of_block_is_rotated_with_a_padded_last_block():
    """It was packed unrotated while labelled rotated; now the last block is zero-padded."""
    r = Router(RouterConfig(block=128), cache=WeightCache(None))
    w, x = rand(4, 200), rand(3, 200, seed=1)
    layer = r("b", w)
    packed = layer.pack()
    assert layer.rotate is True and packed.rotate is True and packed.rotated_k == 256
    y = layer(x)
    assert np.abs(y - x @ w.T).max() <= 0.05 * np.sqrt(np.mean((x @ w.T) ** 2))


def test_router_output_matches_float(fake):
    w = rand(5, 7)
    x = rand(3, 7, seed=1)
    for cfg in (RouterConfig(), RouterConfig(exclude=["w"])):
        layer = Router(cfg, backend=fake)("w", w)
        np.testing.assert_allclose(layer(x), x @ w.T, rtol=1e-6)
        with pytest.raises(ValueError):
            layer(rand(3, 6))


# ---------------------------------------------------------------------------
# Int8Linear: lazy, thread safe, keeps only the packed weight
# ---------------------------------------------------------------------------


def test_linear_packs_once_under_threads_and_drops_float(fake):
    w = rand(16, 8)
    lin = Int8Linear(w, rotate=False, block=64, seed=3, name="w", backend=fake)
    x = rand(4, 8, seed=1)
    outs = []
    barrier = threading.Barrier(8)

    def work():
        barrier.wait()
        outs.append(lin(x))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake.packs) == 1
    assert fake.packs[0] == ((16, 8), False, 64, 3)
    assert lin._source is None  # no float reference left
    assert lin.nbytes == 16 * 8
    for o in outs:
        np.testing.assert_allclose(o, x @ w.T, rtol=1e-6)


def test_linear_rejects_bad_weight():
    with pytest.raises(ValueError):
        Int8Linear(np.zeros(5, np.float32))


def test_verbose_logging(fake, caplog):
    caplog.set_level(logging.INFO, logger="pyw8a8")
    r = Router(RouterConfig(verbose=True, exclude=["b"]), cache=WeightCache(None), backend=fake)
    r("a", rand(4, 8))(rand(1, 8))
    r("b", rand(4, 8))
    text = caplog.text
    assert "route a (4, 8) -> W8A8" in text
    assert "route b (4, 8) -> float (excluded)" in text
    assert "packed a (4, 8) -> 32 bytes" in text


# ---------------------------------------------------------------------------
# WeightCache
# ---------------------------------------------------------------------------


def test_cache_lru_bound_and_clear():
    cache = WeightCache(max_bytes=250)
    arrays = [rand(10, 10, seed=i) for i in range(4)]  # 100 "bytes" packed each
    for i, a in enumerate(arrays[:2]):
        cache.put(a, FakePacked(a), "s")
    assert cache.nbytes == 200 and len(cache) == 2
    assert cache.get(arrays[0], "s") is not None  # refresh 0: now 1 is the LRU
    cache.put(arrays[2], FakePacked(arrays[2]), "s")
    assert cache.nbytes <= 250 and len(cache) == 2
    assert cache.get(arrays[1], "s") is None
    assert cache.get(arrays[0], "s") is not None and cache.get(arrays[2], "s") is not None
    assert cache.get(arrays[0], "other-settings") is None
    cache.clear()
    assert cache.nbytes == 0 and len(cache) == 0


def test_cache_too_large_entry_and_stale_entries():
    cache = WeightCache(max_bytes=50)
    a = rand(10, 10)
    cache.put(a, FakePacked(a))
    assert len(cache) == 0 and cache.nbytes == 0
    cache = WeightCache(max_bytes=None)
    b = rand(10, 10)
    cache.put(b, FakePacked(b))
    assert cache.nbytes == 100
    del b  # the float array dies: its entry must not be served for a new array
    c = rand(10, 10, seed=5)
    assert cache.get(c) is None
    cache.put(c, FakePacked(c))
    assert cache.nbytes == 100


def test_cache_does_not_keep_float_alive():
    import gc
    import weakref

    cache = WeightCache(None)
    a = rand(4, 4)
    ref = weakref.ref(a)
    cache.put(a, FakePacked(np.zeros((4, 4))))
    del a
    gc.collect()
    assert ref() is None


def test_cache_bad_bound():
    with pytest.raises(ValueError):
        WeightCache(-1)


def test_router_shares_cache_across_models(fake):
    cache = WeightCache(None)
    w = rand(8, 8)
    x = rand(2, 8)
    Router(RouterConfig(), cache=cache, backend=fake)("w", w)(x)
    Router(RouterConfig(), cache=cache, backend=fake)("w", w)(x)
    assert len(fake.packs) == 1 and cache.hits == 1
    # other settings: packed again
    Router(RouterConfig(block=64), cache=cache, backend=fake)("w", w)(x)
    assert len(fake.packs) == 2


# ---------------------------------------------------------------------------
# FFN scaling plumbing
# ---------------------------------------------------------------------------


def _ffn(layer_gate_up, layer_down, x):
    g, u = layer_gate_up(x)
    a = g / (1 + np.exp(-g)) * u
    return layer_down(a)


def test_scaling_equalizes_each_ffn_once_and_is_exact(fake):
    wg, wu, wd = rand(12, 8, seed=1), rand(12, 8, seed=2), rand(8, 12, seed=3)
    x = rand(3, 8, seed=4)
    ref = _ffn(lambda v: (v @ wg.T, v @ wu.T), lambda v: v @ wd.T, x)
    for cfg in (RouterConfig(scaling=True), RouterConfig(scaling=True, exclude=["*ffn_down*"])):
        fake.equalize_calls = 0
        r = Router(cfg, cache=WeightCache(None), backend=fake)
        gu = r.pair("blk.0.ffn_gate.weight", wg, "blk.0.ffn_up.weight", wu)
        down = r("blk.0.ffn_down.weight", wd)
        out = _ffn(gu, down, x)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        assert fake.equalize_calls == 1
        assert r._groups and all(g.done == {} for g in r._groups.values())


def test_scaling_incomplete_group_falls_back(fake, caplog):
    r = Router(RouterConfig(scaling=True), cache=WeightCache(None), backend=fake)
    wg, wu = rand(6, 4), rand(6, 4, seed=1)
    gu = r.pair("blk.0.ffn_gate.weight", wg, "blk.0.ffn_up.weight", wu)
    x = rand(2, 4)
    g, u = gu(x)
    np.testing.assert_allclose(u, x @ wu.T, rtol=1e-6)
    assert fake.equalize_calls == 0
    assert "FFN scaling skipped" in caplog.text


# ---------------------------------------------------------------------------
# save_packed / load_packed
# ---------------------------------------------------------------------------


def test_save_load_roundtrip(tmp_path):
    mapping = {"blk.0.attn_q.weight": FakePacked(rand(4, 8), True, 64, 2),
               "output": FakePacked(rand(3, 8))}
    path = tmp_path / "packed.npz"
    save_packed(path, mapping)
    loaded = load_packed(path, cls=FakePacked)
    assert list(loaded) == list(mapping)
    for name in mapping:
        np.testing.assert_array_equal(loaded[name].w, mapping[name].w)
    assert loaded["blk.0.attn_q.weight"].block == 64


def test_load_truncated_and_garbage(tmp_path):
    path = tmp_path / "packed.npz"
    save_packed(path, {"a": FakePacked(rand(64, 64))})
    data = path.read_bytes()
    for i, blob in enumerate([data[: len(data) // 2], data[:100], b"not a zip file at all"]):
        bad = tmp_path / f"bad{i}.npz"
        bad.write_bytes(blob)
        with pytest.raises(ValueError, match="corrupted or truncated|not a pyw8a8"):
            load_packed(bad, cls=FakePacked)
    # flip bytes inside the stored array data: the zip CRC check catches it
    flipped = bytearray(data)
    mid = len(flipped) // 2
    flipped[mid : mid + 8] = bytes(b ^ 0xFF for b in flipped[mid : mid + 8])
    bad = tmp_path / "flipped.npz"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ValueError):
        load_packed(bad, cls=FakePacked)


def test_load_wrong_kind_or_version(tmp_path):
    plain = tmp_path / "plain.npz"
    np.savez(plain, x=np.zeros(3))
    with pytest.raises(ValueError, match="not a pyw8a8"):
        load_packed(plain, cls=FakePacked)
    future = tmp_path / "future.npz"
    np.savez(future, **{"__pyw8a8_packed_format__": np.array(99), "__names__": np.array(["a"])})
    with pytest.raises(ValueError, match="version 99"):
        load_packed(future, cls=FakePacked)
    bad_entry = tmp_path / "bad_entry.npz"
    np.savez(bad_entry, **{"__pyw8a8_packed_format__": np.array(1), "__names__": np.array(["a"]),
                           "0/w": np.zeros((2, 2), np.float32)})
    with pytest.raises(ValueError, match="invalid packed weight 'a'"):
        load_packed(bad_entry, cls=FakePacked)


def test_router_uses_prepacked(fake, tmp_path):
    w = rand(4, 8)
    path = tmp_path / "p.npz"
    save_packed(path, {"w": FakePacked(w)})
    r = Router(RouterConfig(), packed=load_packed(path, cls=FakePacked), backend=fake)
    layer = r("w", np.zeros_like(w))  # weights given to the factory are not re-packed
    x = rand(2, 8, seed=1)
    np.testing.assert_allclose(layer(x), x @ w.T, rtol=1e-6)
    assert fake.packs == []
    with pytest.raises(ValueError, match="pre-packed"):
        r("w", np.zeros((5, 8), np.float32))


# ---------------------------------------------------------------------------
# With the real compiled core
# ---------------------------------------------------------------------------


@pytest.fixture
def core():
    import pyw8a8

    return pyw8a8


def _rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_real_linear_and_pair_close_to_float(core):
    w1, w2 = rand(64, 256, seed=1), rand(96, 256, seed=2)
    x = rand(5, 256, seed=3)
    r = Router(RouterConfig(rotate=False), cache=WeightCache(None))
    lin = r("a", w1)
    assert _rel_err(lin(x), x @ w1.T) < 0.02
    assert isinstance(lin.packed, core.PackedWeight)
    g, u = r.pair("g", w1, "u", w2)(x)
    np.testing.assert_allclose(g, lin(x), rtol=1e-5, atol=1e-5)
    assert _rel_err(u, x @ w2.T) < 0.02


def test_real_rotated_linear(core):
    w = rand(64, 256, seed=1)
    w[:, 3] *= 50.0  # an outlier input channel
    x = rand(5, 256, seed=3)
    x[:, 3] *= 50.0
    ref = x @ w.T
    naive = Int8Linear(w, rotate=False)(x)
    rotated = Int8Linear(w, rotate=True, block=128)(x)
    assert _rel_err(rotated, ref) < _rel_err(naive, ref)


def test_real_save_load_packed(core, tmp_path):
    r = Router(RouterConfig(rotate=False), cache=WeightCache(None))
    r("a", rand(32, 128))
    r("b", rand(16, 128, seed=1))
    packed = r.pack_all()
    save_packed(tmp_path / "p.npz", packed)
    loaded = load_packed(tmp_path / "p.npz")
    x = rand(3, 128, seed=2)
    for name in packed:
        np.testing.assert_array_equal(core.matmul(x, loaded[name]), core.matmul(x, packed[name]))


def test_real_scaling_exact_in_float_and_close_in_w8a8(core):
    wg, wu, wd = rand(256, 128, seed=1), rand(256, 128, seed=2), rand(128, 256, seed=3)
    wu[7] *= 30.0  # a hidden channel with a large up projection
    x = rand(6, 128, seed=4)
    # The reference in float64, so the check does not depend on how numpy's BLAS orders
    # its float32 sums (it differs between BLAS builds and CPUs).
    x64, wg64, wu64, wd64 = (a.astype(np.float64) for a in (x, wg, wu, wd))
    ref = _ffn(lambda v: (v @ wg64.T, v @ wu64.T), lambda v: v @ wd64.T, x64)
    # All float: the equalization must not change the function, beyond float32 roundings
    # of sums of up to K = 256 terms.
    r = Router(RouterConfig(scaling=True, include=["nothing"]), cache=WeightCache(None))
    out = _ffn(r.pair("blk.0.ffn_gate.weight", wg, "blk.0.ffn_up.weight", wu),
               r("blk.0.ffn_down.weight", wd), x)
    err = np.max(np.abs(out - ref)) / np.sqrt(np.mean(ref ** 2))
    assert err <= 4 * 256 * np.finfo(np.float32).eps, err
    # W8A8 with scaling stays close to float.
    r = Router(RouterConfig(scaling=True, rotate=True, block=128), cache=WeightCache(None))
    out = _ffn(r.pair("blk.0.ffn_gate.weight", wg, "blk.0.ffn_up.weight", wu),
               r("blk.0.ffn_down.weight", wd), x)
    assert _rel_err(out, ref) < 0.05


# ---------------------------------------------------------------------------
# Biased layers and the fused gated unit
# ---------------------------------------------------------------------------

def test_router_layers_take_a_bias_fused_into_the_kernel():
    import pyw8a8
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 128)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    x = rng.standard_normal((5, 128)).astype(np.float32)
    router = Router(RouterConfig(min_in_features=64), cache=WeightCache())
    layer = router("fc.weight", w, b)
    assert isinstance(layer, Int8Linear)
    np.testing.assert_array_equal(layer(x), pyw8a8.matmul(x, layer.packed, bias=b))
    float_layer = Router(RouterConfig(exclude=["*"]), cache=WeightCache())("fc.weight", w, b)
    assert isinstance(float_layer, FloatLinear)
    np.testing.assert_allclose(float_layer(x), x @ w.T + b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="fc.weight: bias must have shape \\(40,\\)"):
        router("fc.weight", w, b[:3])
    with pytest.raises(ValueError, match="fc.weight: bias holds NaN"):
        router("fc.weight", w, np.full(40, np.nan, np.float32))


def test_gated_linear_glu_is_matmul_pair_glu():
    import pyw8a8
    rng = np.random.default_rng(3)
    wg, wu = (rng.standard_normal((48, 128)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((7, 128)).astype(np.float32)
    gated = Router(RouterConfig(min_in_features=64), cache=WeightCache()).pair("g", wg, "u", wu)
    assert isinstance(gated, Int8GatedLinear)
    got = gated.glu(x, "silu")
    want = pyw8a8.matmul_pair(x, gated.gate.packed, gated.up.packed, glu="silu")
    np.testing.assert_array_equal(got, want)

