"""Tests of `Int8KVCache`: quantization, rotation, paged growth, the sliding window's ring of
pages, and its argument checks."""
import copy
import pickle

import numpy as np
import pytest

import pyw8a8
from pyw8a8.attention import Int8KVCache, int8_attention

D = 32  # head_dim: two rotation blocks of 16 where a test asks for block=16


def _tokens(rng, n, heads=1, scale=1.0):
    return (scale * rng.standard_normal((n, heads, D))).astype(np.float32)


def _quantized(x, rotated, block=D):
    """The cache's expected int8 rows and scales of x (n, heads, D): per token and head,
    after the rotation."""
    heads = np.ascontiguousarray(x.transpose(1, 0, 2))
    if rotated:
        heads = pyw8a8.rotate(heads, block=block)
    q, s = pyw8a8.quantize_per_token(heads.reshape(-1, D))
    return q.reshape(heads.shape), s.reshape(heads.shape[:2])


@pytest.mark.parametrize("rotate_keys, rotate_values", [(True, False), (False, True)])
def test_append_stores_the_quantized_rotated_tokens(rotate_keys, rotate_values):
    rng = np.random.default_rng(0)
    cache = Int8KVCache([None], n_kv_heads=2, head_dim=D, rotate_keys=rotate_keys,
                        rotate_values=rotate_values, page_tokens=8)
    keys, values = _tokens(rng, 21, 2), _tokens(rng, 21, 2)
    for a, b in [(0, 5), (5, 6), (6, 19), (19, 21)]:  # across page boundaries
        cache.append(0, keys[a:b], values[a:b])
    assert cache.length == 21 and cache.held(0) == range(21)
    for got, x, rotated in [(cache.quantized_keys(0), keys, rotate_keys),
                            (cache.quantized_values(0), values, rotate_values)]:
        q, s = _quantized(x, rotated)
        np.testing.assert_array_equal(got[0], q)
        np.testing.assert_array_equal(got[1], s)
        assert got[0].dtype == np.int8 and got[1].dtype == np.float32
        assert np.abs(got[0]).max() == 127  # symmetric, the largest magnitude at 127


def test_rotation_keeps_query_key_products():
    rng = np.random.default_rng(1)
    cache = Int8KVCache([None], 1, D, block=16, seed=7)
    q, k = _tokens(rng, 5), _tokens(rng, 9)
    exact = np.einsum("qhd,khd->qk", q.astype(np.float64), k.astype(np.float64))
    rq, rk = cache.rotated(q, True), cache.rotated(k, True)
    assert not np.allclose(rq, q)
    np.testing.assert_allclose(np.einsum("qhd,khd->qk", rq, rk), exact, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(cache.unrotated(rk), k, atol=1e-6)


def test_appending_never_repacks_a_full_page():
    rng = np.random.default_rng(2)
    cache = Int8KVCache([None], 1, D, page_tokens=4)
    cache.append(0, _tokens(rng, 10), _tokens(rng, 10))
    pages = cache._layers[0].pages
    full = [(p, p.packed_keys[0], p.packed_values[0], p.packed_keys[0].panels.copy())
            for p in pages if p.count == 4]
    assert len(full) == 2
    before = cache.quantized_keys(0)
    for _ in range(7):  # one token at a time, as a decode step
        cache.append(0, _tokens(rng, 1), _tokens(rng, 1))
    for page, k, v, panels in full:
        assert page in cache._layers[0].pages
        # the same packed arrays, unchanged: nothing was copied or rewritten
        assert page.packed_keys[0] is k and page.packed_values[0] is v
        np.testing.assert_array_equal(k.panels, panels)
    after = cache.quantized_keys(0)
    np.testing.assert_array_equal(after[0][:, :10], before[0])
    np.testing.assert_array_equal(after[1][:, :10], before[1])
    assert cache.held(0) == range(17)


def test_sliding_window_is_a_ring_of_pages():
    rng = np.random.default_rng(3)
    window, page = 12, 4
    cache = Int8KVCache([window, None], 1, D, page_tokens=page)
    keys = _tokens(rng, 60)
    sizes = []
    for t in range(60):
        for layer in (0, 1):
            cache.append(layer, keys[t:t + 1], keys[t:t + 1])
        held = cache.held(0)
        # every key a later query can see (from t + 2 - window on) is still there ...
        assert held.stop == t + 1 and held.start <= max(0, t + 2 - window)
        # ... and at most one page more than the window
        assert len(held) <= window + page
        sizes.append(cache._layers[0].nbytes)
    assert cache.held(1) == range(60)  # the global layer keeps everything
    q, s = cache.quantized_keys(0)
    ref_q, ref_s = _quantized(keys[cache.held(0).start:], True)
    np.testing.assert_array_equal(q, ref_q)
    np.testing.assert_array_equal(s, ref_s)
    assert max(sizes[30:]) == max(sizes[window + page:30])  # steady: a ring
    assert cache._layers[1].nbytes > 3 * max(sizes)


def test_nbytes_is_about_a_byte_per_element():
    rng = np.random.default_rng(4)
    cache = Int8KVCache([None] * 2, 1, 256, page_tokens=128)
    for layer in (0, 1):
        x = rng.standard_normal((512, 1, 256)).astype(np.float32)
        cache.append(layer, x, x)
    float_bytes = 2 * 2 * 512 * 256 * 4  # keys and values of two layers in float32
    assert float_bytes / 4 <= cache.nbytes <= float_bytes / 3.5
    assert repr(cache).startswith("Int8KVCache(layers=2")


@pytest.mark.parametrize("kwargs, match", [
    (dict(windows=[0]), r"windows\[0\]"),
    (dict(windows=[None, 2.5]), r"windows\[1\]"),
    (dict(n_kv_heads=0), "n_kv_heads"),
    (dict(head_dim=-4), "head_dim"),
    (dict(page_tokens=0), "page_tokens"),
    (dict(query_terms=3), "query_terms"),
    (dict(probability_terms=0), "probability_terms"),
    (dict(head_dim=24), "head_dim"),  # the rotation's block does not fit
    (dict(block=12), "block"),
])
def test_bad_construction_names_the_argument(kwargs, match):
    args = dict(windows=[None], n_kv_heads=1, head_dim=D) | kwargs
    with pytest.raises(ValueError, match=match):
        Int8KVCache(**args)
    with pytest.raises(TypeError, match="windows"):
        Int8KVCache(None, 1, D)


def test_bad_append_names_the_argument():
    rng = np.random.default_rng(5)
    cache = Int8KVCache([None, 8], 2, D)
    good = _tokens(rng, 3, 2)
    with pytest.raises(ValueError, match="layer"):
        cache.append(2, good, good)
    with pytest.raises(ValueError, match=r"keys must have shape \(n, n_kv_heads=2"):
        cache.append(0, _tokens(rng, 3, 1), good)  # one KV head too few
    with pytest.raises(ValueError, match="values must have shape"):
        cache.append(0, good, good[..., :-1])
    with pytest.raises(TypeError, match="keys"):
        cache.append(0, good.astype(np.int32), good)
    with pytest.raises(ValueError, match="keys and values differ in tokens"):
        cache.append(0, good, good[:2])
    bad = good.copy()
    bad[1, 0, 3] = np.nan
    with pytest.raises(ValueError, match="values"):
        cache.append(0, good, bad)
    assert cache.length == 0 and cache.held(0) == range(0)  # nothing was appended


def test_an_open_page_holds_what_it_was_given():
    """A page of 128 tokens starts with room for 16 and grows 16 at a time: one token costs
    its bytes, not a page's, and the values survive each growth."""
    rng = np.random.default_rng(6)
    cache = Int8KVCache([None], 1, D, page_tokens=128)
    keys, values = _tokens(rng, 130), _tokens(rng, 130)
    cache.append(0, keys[:1], values[:1])
    one = cache.nbytes
    assert one <= 16 * 2 * (D + 4)  # 16 tokens of room: int8 rows and a scale each
    for t in range(1, 130):  # through 32, 48, ... 128 (a full page, packed), a new page
        cache.append(0, keys[t:t + 1], values[t:t + 1])
    for got, x in [(cache.quantized_keys(0), keys), (cache.quantized_values(0), values)]:
        q, s = _quantized(x, x is keys)
        np.testing.assert_array_equal(got[0], q)
        np.testing.assert_array_equal(got[1], s)
    page = cache._layers[0].pages[1]
    assert page.count == 2 and page.keys.shape[1] == 16


@pytest.mark.parametrize("duplicate", [copy.deepcopy, lambda c: pickle.loads(pickle.dumps(c))])
def test_a_copied_cache_attends_as_the_original(duplicate):
    """A deep copy or pickle of a cache with full and open pages in a global and a sliding
    layer (a prompt's cache kept for reuse) attends the next token to the same bits, and
    appending to it leaves the original as it was."""
    rng = np.random.default_rng(7)
    cache = Int8KVCache([None, 64], 1, D, page_tokens=32)
    for layer in (0, 1):
        int8_attention(cache, layer, _tokens(rng, 100, 2), _tokens(rng, 100), _tokens(rng, 100))
    twin = duplicate(cache)
    step = [_tokens(rng, 1, 2), _tokens(rng, 1), _tokens(rng, 1)]
    for layer in (0, 1):
        np.testing.assert_array_equal(int8_attention(twin, layer, *step),
                                      int8_attention(cache, layer, *step))
    int8_attention(twin, 0, *step)
    assert cache.held(0) == range(101) and twin.held(0) == range(102)
