"""Properties of the per-token and per-channel quantizers on every ISA."""
import numpy as np
import pytest

import pyw8a8

QUANTIZERS = [pyw8a8.quantize_per_token, pyw8a8.quantize_per_channel]


@pytest.fixture
def isa(any_isa):
    """Every compiled ISA (conftest's any_isa: skipped, with the reason, where this CPU
    lacks it)."""
    return any_isa


def _rows(rng, m, k):
    """Rows of very different magnitudes, a few with a 10x outlier."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    x *= np.exp(rng.uniform(-6, 6, (m, 1))).astype(np.float32)
    x[::3, rng.integers(0, k)] *= 10
    return x


@pytest.mark.parametrize("quantize", QUANTIZERS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (17, 129), (64, 1000), (5, 4099)])
def test_rounding_and_range(isa, quantize, shape):
    x = _rows(np.random.default_rng(shape[1]), *shape)
    q, scale = quantize(x)
    assert q.dtype == np.int8 and q.shape == shape
    assert scale.dtype == np.float32 and scale.shape == (shape[0],)
    assert q.min() >= -127
    np.testing.assert_array_equal(scale, np.abs(x).max(axis=1) / np.float32(127))
    # q is rint(x * (127 / amax)) in float32: within half a step plus float rounding.
    exact = x.astype(np.float64) / scale.astype(np.float64)[:, None]
    assert np.abs(q - exact).max() <= 0.5 + 1e-4
    # The largest magnitude of each row maps to +-127.
    rows = np.arange(shape[0])
    peak = np.abs(x).argmax(axis=1)
    np.testing.assert_array_equal(np.abs(q[rows, peak]), 127)


@pytest.mark.parametrize("copies", [5, 25, 27])
def test_round_half_to_even(isa, copies):
    # 127 / amax == 1 with amax = 127: x * inv is exact, so ties are visible.  40, 200 and
    # 216 values reach each loop of the SIMD quantizers (64, 16 and 1 at a time).
    x = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5] * copies], np.float32)
    q, scale = pyw8a8.quantize_per_token(x)
    assert scale[0] == 1.0
    np.testing.assert_array_equal(q[0], [127, 0, 2, 2, 0, -2, -2, 4] * copies)


def test_isas_agree_bit_for_bit(isa):
    x = _rows(np.random.default_rng(1), 33, 1000)
    with pyw8a8.use_isa("scalar"):
        q0, s0 = pyw8a8.quantize_per_token(x)
    q, s = pyw8a8.quantize_per_token(x)
    np.testing.assert_array_equal(q, q0)
    np.testing.assert_array_equal(s, s0)


@pytest.mark.parametrize("quantize", QUANTIZERS)
def test_zero_and_tiny_rows(isa, quantize):
    x = np.ones((4, 50), np.float32)
    x[1] = 0
    x[2] = 1e-37  # below 127 * FLT_MIN: treated as zero
    q, scale = quantize(x)
    assert scale[1] == 0 and scale[2] == 0 and not q[1].any() and not q[2].any()
    assert scale[0] == np.float32(1 / 127) and (q[0] == 127).all()


def test_one_element_rows(isa):
    q, scale = pyw8a8.quantize_per_token(np.array([[-3.0], [0.0], [2e-3]], np.float32))
    np.testing.assert_array_equal(q[:, 0], [-127, 0, 127])
    np.testing.assert_allclose(scale, [3 / 127, 0, 2e-3 / 127], rtol=1e-7)


def test_huge_values(isa):
    x = np.array([[3e38, -3e38, 1.0] * 11], np.float32)
    q, scale = pyw8a8.quantize_per_token(x)
    assert np.isfinite(scale).all() and q[0, 0] == 127 and q[0, 1] == -127 and q[0, 2] == 0


@pytest.mark.parametrize("quantize, name", [(pyw8a8.quantize_per_token, "x"),
                                            (pyw8a8.quantize_per_channel, "w")])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_names_the_row(isa, quantize, name, bad):
    x = np.ones((6, 40), np.float32)
    x[4, 37] = bad
    with pytest.raises(ValueError, match=rf"{name} has a non-finite value.*row 4"):
        quantize(x)


@pytest.mark.parametrize("quantize, name", [(pyw8a8.quantize_per_token, "x"),
                                            (pyw8a8.quantize_per_channel, "w")])
def test_bad_inputs(quantize, name):
    with pytest.raises(TypeError, match=f"{name} must be a float32 or float64"):
        quantize(np.ones((2, 3), np.int32))
    with pytest.raises(TypeError, match=f"{name} must be a float32 or float64"):
        quantize(np.ones((2, 3), np.float16))
    with pytest.raises(ValueError, match=f"{name} must be 2-D"):
        quantize(np.ones(3, np.float32))


def test_float64_and_memory_orders():
    x = _rows(np.random.default_rng(2), 20, 30)
    q, s = pyw8a8.quantize_per_token(x)
    for variant in (x.astype(np.float64), np.asfortranarray(x), x[::-1][::-1],
                    np.repeat(x, 2, axis=1)[:, ::2]):
        q2, s2 = pyw8a8.quantize_per_token(variant)
        np.testing.assert_array_equal(q2, q)
        np.testing.assert_array_equal(s2, s)


def test_empty():
    q, s = pyw8a8.quantize_per_token(np.zeros((0, 5), np.float32))
    assert q.shape == (0, 5) and s.shape == (0,)
    q, s = pyw8a8.quantize_per_token(np.zeros((3, 0), np.float32))
    assert q.shape == (3, 0) and (s == 0).all()
