"""Tests of `int8_attention`: its integer products against int64 numpy on every ISA, the
whole computation against a float64 model of it, and against float attention."""
import numpy as np
import pytest

import pyw8a8
from pyw8a8.attention import Int8KVCache, int8_attention
from pyw8a8.attention._exact import LO_STEPS, combine, key_sums, quantize_terms, value_sums

D = 64


def _qkv(rng, n, heads=4, kv=1):
    q = (0.2 * rng.standard_normal((n, heads, D))).astype(np.float32)
    k = rng.standard_normal((n, kv, D)).astype(np.float32)
    k[..., 5] *= 8  # an outlier feature, as real keys have
    v = rng.standard_normal((n, kv, D)).astype(np.float32)
    return q, k, v


def _float_attention(q, keys, values, start, window):
    """float64 attention of q (n, heads, D) at positions start.. over keys/values (T, kv,
    D) at positions 0..T-1."""
    n, heads, _ = q.shape
    group = heads // keys.shape[1]
    qpos = np.arange(start, start + n)[:, None]
    kpos = np.arange(keys.shape[0])[None, :]
    masked = kpos > qpos
    if window is not None:
        masked |= qpos - kpos >= window
    out = np.empty(q.shape)
    for h in range(heads):
        s = q[:, h].astype(np.float64) @ keys[:, h // group].T.astype(np.float64)
        s[masked] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, h] = p @ values[:, h // group]
    return out


@pytest.fixture
def filled_cache():
    """A cache whose layer 0 holds 45 tokens in pages of 16 (two full, one open)."""
    rng = np.random.default_rng(0)
    cache = Int8KVCache([None], 2, D, page_tokens=16)
    for n in (20, 1, 24):
        _, k, v = _qkv(rng, n, kv=2)
        cache.append(0, k, v)
    return cache


def test_integer_products_are_exact_on_every_isa(any_isa, filled_cache):
    rng = np.random.default_rng(len(any_isa))
    span, last = filled_cache._layers[0].seen(0, 45)  # two full pages, one open
    assert span.count == 32 and last.count == 13
    keys, _ = filled_cache.quantized_keys(0)
    values, _ = filled_cache.quantized_values(0)
    for rows in (1, 7, 33):
        for h in (0, 1):
            q8 = rng.integers(-127, 128, (rows, D), dtype=np.int8)
            got = key_sums(q8, span, last, h)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, q8.astype(np.int64) @ keys[h].T.astype(np.int64))
            p8 = rng.integers(-127, 128, (rows, 45), dtype=np.int8)
            got = value_sums(p8, span, last, h, D)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, p8.astype(np.int64) @ values[h].astype(np.int64))
    extreme = np.full((3, D), 127, np.int8)
    np.testing.assert_array_equal(key_sums(extreme, span, last, 0),
                                  extreme.astype(np.int64) @ keys[0].T.astype(np.int64))


@pytest.mark.parametrize("terms", [1, 2])
def test_two_int8_terms_are_one_exact_sum_on_a_finer_step(terms):
    rng = np.random.default_rng(terms)
    x = rng.standard_normal((9, 40)).astype(np.float32)
    x[3] = 0.0  # a zero row: zero terms, zero step
    w = rng.integers(-127, 128, (40, 11), dtype=np.int8)
    rows, step = quantize_terms(x, terms, "x")
    assert rows.shape == (terms * 9, 40) and rows.dtype == np.int8 and step.shape == (9,)
    assert np.abs(rows).max() <= 127
    sums = combine(rows.astype(np.int64) @ w.astype(np.int64), terms)
    whole = rows[:9].astype(np.int64) * (LO_STEPS if terms == 2 else 1)
    if terms == 2:
        whole += rows[9:]
    np.testing.assert_array_equal(sums, whole @ w.astype(np.int64))
    # the terms hold x to half a step of the combined sum
    err = np.abs(whole * step[:, None].astype(np.float64) - x)
    assert np.all(err <= step[:, None] * 0.5 * (1 + 1e-5) + 1e-12)
    assert step[3] == 0 and not whole[3].any()


def _model_of_int8_attention(cache, q, start, window):
    """float64 model of what int8_attention computes, from the cache's int8 contents and
    numpy's own products (one KV head)."""
    keys, k_scale = cache.quantized_keys(0)
    values, v_scale = cache.quantized_values(0)
    first = cache.held(0).start
    heads = q.transpose(1, 0, 2)  # (heads, n, D)
    rq = cache.rotated(np.ascontiguousarray(heads), cache.rotate_keys).reshape(-1, D)
    q8, q_step = quantize_terms(rq, cache.query_terms, "q")
    sums = combine(q8.astype(np.int64) @ keys[0].T.astype(np.int64), cache.query_terms)
    s = sums * q_step[:, None].astype(np.float64) * k_scale[0][None, :]
    n = q.shape[0]
    qpos = np.tile(np.arange(start, start + n), q.shape[1])[:, None]
    kpos = np.arange(first, first + keys.shape[1])[None, :]
    masked = kpos > qpos
    if window is not None:
        masked |= qpos - kpos >= window
    s[masked] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p8, p_step = quantize_terms((p * v_scale[0][None, :]).astype(np.float32),
                                cache.probability_terms, "p")
    sums = combine(p8.astype(np.int64) @ values[0].astype(np.int64), cache.probability_terms)
    out = (sums * p_step[:, None].astype(np.float64)).astype(np.float32)
    if cache.rotate_values:
        out = cache.unrotated(out)
    return out.reshape(q.shape[1], n, D).transpose(1, 0, 2)


@pytest.mark.parametrize("window", [None, 7, 30])
@pytest.mark.parametrize("options", [
    dict(),
    dict(rotate_keys=False, query_terms=1, probability_terms=1),
    dict(rotate_values=True, query_terms=1),
])
def test_int8_attention_is_its_float64_model(window, options):
    rng = np.random.default_rng(11)
    cache = Int8KVCache([window], 1, D, page_tokens=8, **options)
    start = 0
    for n in (13, 1, 1, 9):  # a prefill, decode steps, a chunk; pages fill and ring
        q, k, v = _qkv(rng, n)
        got = int8_attention(cache, 0, q, k, v, block_rows=5)
        assert got.shape == q.shape and got.dtype == np.float32
        # the model reads the keys after the append: the window may have dropped pages
        # that only the first queries of the chunk saw, so model those queries alone.
        seen = cache.held(0).start
        first = 0 if window is None else max(0, seen + window - 1 - start)
        ref = _model_of_int8_attention(cache, q[first:], start + first, window)
        np.testing.assert_allclose(got[first:], ref, rtol=1e-4, atol=1e-4)
        start += n


@pytest.mark.parametrize("window", [None, 6])
def test_int8_attention_is_close_to_float_attention(window):
    rng = np.random.default_rng(12)
    results = {}
    for terms in (1, 2):
        cache = Int8KVCache([window], 1, D, page_tokens=8, query_terms=terms,
                            probability_terms=terms)
        keys, values, outs, refs = [], [], [], []
        rng = np.random.default_rng(12)
        start = 0
        for n in (17, 1, 5):
            q, k, v = _qkv(rng, n)
            keys.append(k)
            values.append(v)
            outs.append(int8_attention(cache, 0, q, k, v, block_rows=4))
            refs.append(_float_attention(q, np.concatenate(keys), np.concatenate(values),
                                         start, window))
            start += n
        out, ref = np.concatenate(outs), np.concatenate(refs)
        results[terms] = np.abs(out - ref).max() / np.abs(ref).max()
    assert results[2] < 0.02
    assert results[2] < results[1]


def test_bad_attention_arguments_name_the_argument():
    rng = np.random.default_rng(13)
    cache = Int8KVCache([None], 2, D)
    q, k, v = _qkv(rng, 3, heads=4, kv=2)
    with pytest.raises(ValueError, match="q must have shape .* multiple of n_kv_heads=2"):
        int8_attention(cache, 0, q[:, :3], k, v)  # 3 query heads over 2 KV heads
    with pytest.raises(ValueError, match=r"q must have shape \(n, n_heads, head_dim=64\)"):
        int8_attention(cache, 0, q[..., :32], k, v)
    with pytest.raises(ValueError, match=r"k must have shape \(n, n_kv_heads=2"):
        int8_attention(cache, 0, q, k[:, :1], v)  # one KV head too few
    with pytest.raises(ValueError, match=r"v must have shape \(n=3"):
        int8_attention(cache, 0, q, k, v[:2])
    with pytest.raises(TypeError, match="q must be"):
        int8_attention(cache, 0, q.astype(np.float16), k, v)
    with pytest.raises(TypeError, match="k must be"):
        int8_attention(cache, 0, q, k.astype(np.int8), v)
    with pytest.raises(TypeError, match="cache must be an Int8KVCache"):
        int8_attention(object(), 0, q, k, v)
    with pytest.raises(ValueError, match="layer"):
        int8_attention(cache, 1, q, k, v)
    with pytest.raises(ValueError, match="block_rows"):
        int8_attention(cache, 0, q, k, v, block_rows=0)
    bad = q.copy()
    bad[0, 0, 0] = np.inf
    with pytest.raises(ValueError, match="q holds NaN or Inf"):
        int8_attention(cache, 0, bad, k, v)
    assert cache.length == 0  # no failed call appended anything
    assert int8_attention(cache, 0, q, k, v).shape == q.shape
    assert cache.length == 3


def test_rotation_matches_pyw8a8_rotate():
    x = np.random.default_rng(14).standard_normal((3, D)).astype(np.float32)
    cache = Int8KVCache([None], 1, D, block=32, seed=5)
    np.testing.assert_array_equal(cache.rotated(x, True), pyw8a8.rotate(x, block=32, seed=5))


def test_first_int8_term_is_quantize_per_token():
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((7, 300)) * rng.random((7, 1)) * 10).astype(np.float32)
    x[2] = 0.0
    q, scale = pyw8a8.quantize_per_token(x)
    one, step1 = quantize_terms(x, 1, "x")
    two, step2 = quantize_terms(x, 2, "x")
    np.testing.assert_array_equal(one, q)
    np.testing.assert_array_equal(step1, scale)
    np.testing.assert_array_equal(two[:7], q)
    np.testing.assert_array_equal(step2, scale / np.float32(LO_STEPS))
    assert not two[9].any() and step2[2] == 0  # the zero row
    bad = x.copy()
    bad[4, 17] = np.nan
    with pytest.raises(ValueError, match="x has a non-finite value .* in row 4"):
        quantize_terms(bad, 2, "x")


def test_value_products_stay_exact_beyond_int32():
    """127 * 127 over 140,800 tokens (1,100 pages of 128) is above 2**31: the sums are int64
    and exact, each page's int32 product added up in int64."""
    pages, k, d = 1100, 128, 16
    cache = Int8KVCache([None], 1, d, rotate_keys=False)
    ones = np.ones((pages * k, 1, d), np.float32)
    cache.append(0, ones, ones)
    span, last = cache._layers[0].seen(0, pages * k)
    assert span.count == pages * k and last is None
    rows = np.full((2, pages * k), 127, np.int8)
    rows[1, ::2] = -127
    out = value_sums(rows, span, last, 0, d)
    np.testing.assert_array_equal(out[0], 127 * 127 * pages * k)
    assert 127 * 127 * pages * k > 2**31
    np.testing.assert_array_equal(out[1], 0)


def test_a_causal_mask_gives_the_causal_attention_and_a_blind_query_zeros():
    from pyw8a8.attention.attend import attend_layer
    rng = np.random.default_rng(22)
    cache = Int8KVCache([None], 2, D, page_tokens=8)
    q, k, v = _qkv(rng, 21, heads=4, kv=2)
    cache.append(0, k, v)
    heads = np.ascontiguousarray(q.transpose(1, 0, 2).reshape(2, 2, 21, D))
    heads = cache.rotated(heads)
    causal = np.empty((1, 21, 4, D), np.float32)
    attend_layer(cache, 0, heads, 0, causal, block_rows=5)
    visible = np.tril(np.ones((21, 21), bool))[None, None]
    additive = np.where(visible, 0, -np.inf).astype(np.float32)
    for mask in (visible.copy(), additive):
        mask[0, 0, 3] = False if mask.dtype == bool else -np.inf  # query 3 sees nothing
        got = np.empty_like(causal)
        attend_layer(cache, 0, heads, 0, got, block_rows=5, mask=mask)
        np.testing.assert_array_equal(np.delete(got, 3, axis=1), np.delete(causal, 3, axis=1))
        assert not got[0, 3].any()
