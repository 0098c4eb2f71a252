"""equalize_ffn and smooth: exact output invariance, the formulas, clamping, validation."""
import numpy as np
import pytest

import pyw8a8
from pyw8a8.tools.quality import gelu_tanh


def ffn(x, w_gate, w_up, w_down):
    return (gelu_tanh(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def weights(rng, d=48, f=96):
    w_gate = rng.standard_normal((f, d))
    w_up = rng.standard_normal((f, d)) * np.exp(rng.normal(0, 2, (f, 1)))
    w_down = rng.standard_normal((d, f)) * np.exp(rng.normal(0, 2, (1, f)))
    return w_gate, w_up, w_down


@pytest.mark.parametrize("mode", ["gated", "plain"])
def test_equalize_ffn_keeps_the_output(mode):
    rng = np.random.default_rng(0)
    w_gate, w_up, w_down = weights(rng)
    x = rng.standard_normal((10, 48))
    g, u, d, t = pyw8a8.equalize_ffn(w_gate, w_up, w_down, mode=mode)
    assert g is not None and np.array_equal(g, w_gate)
    assert not np.allclose(t, 1)
    np.testing.assert_allclose(ffn(x, g, u, d), ffn(x, w_gate, w_up, w_down), rtol=1e-12,
                               atol=1e-12 * np.abs(ffn(x, w_gate, w_up, w_down)).max())


def test_equalize_ffn_formula_and_clamp():
    rng = np.random.default_rng(1)
    w_gate, w_up, w_down = weights(rng)
    w_up[3] *= 1e6     # huge up row: t hits 1 / clamp
    w_down[:, 4] *= 1e6  # huge down column: t hits clamp
    w_up[5] = 0        # zero row: floored norm, finite t
    u, g = np.linalg.norm(w_up, axis=1), np.linalg.norm(w_gate, axis=1)
    dn = np.linalg.norm(w_down, axis=0)
    _, new_up, new_down, t = pyw8a8.equalize_ffn(w_gate, w_up, w_down, clamp=8.0)
    expect = np.clip(np.sqrt(dn / (np.maximum(u, 1e-12) * g)), 1 / 8, 8)
    np.testing.assert_allclose(t, expect, rtol=1e-14)
    assert t[3] == 1 / 8 and t[4] == 8 and t[5] == 8
    np.testing.assert_allclose(new_up, w_up * t[:, None], rtol=1e-15)
    np.testing.assert_allclose(new_down, w_down / t[None, :], rtol=1e-15)
    _, _, _, t_plain = pyw8a8.equalize_ffn(None, w_up, w_down, mode="plain", clamp=8.0)
    np.testing.assert_allclose(
        t_plain, np.clip(np.sqrt(dn / np.maximum(u, 1e-12)), 1 / 8, 8), rtol=1e-14)
    _, same_up, _, ones = pyw8a8.equalize_ffn(w_gate, w_up, w_down, clamp=1)
    np.testing.assert_array_equal(ones, 1)
    np.testing.assert_array_equal(same_up, w_up)


def test_equalize_ffn_balances_the_down_projection():
    # After equalization (plain mode) up row i and down column i have equal norms.
    rng = np.random.default_rng(2)
    w_gate, w_up, w_down = weights(rng)
    _, u, d, t = pyw8a8.equalize_ffn(w_gate, w_up, w_down, mode="plain", clamp=1e9)
    np.testing.assert_allclose(np.linalg.norm(u, axis=1), np.linalg.norm(d, axis=0),
                               rtol=1e-12)


def test_equalize_ffn_dtypes():
    rng = np.random.default_rng(3)
    w_gate, w_up, w_down = (w.astype(np.float32) for w in weights(rng))
    g, u, d, t = pyw8a8.equalize_ffn(w_gate, w_up, w_down)
    assert (g.dtype, u.dtype, d.dtype, t.dtype) == (np.float32,) * 3 + (np.float64,)


def test_equalize_ffn_errors():
    w = np.ones((8, 4))
    with pytest.raises(ValueError, match="w_down must have shape"):
        pyw8a8.equalize_ffn(w, w, np.ones((8, 4)))
    with pytest.raises(ValueError, match="w_gate must have w_up's shape"):
        pyw8a8.equalize_ffn(np.ones((8, 5)), w, np.ones((4, 8)))
    with pytest.raises(ValueError, match="w_gate is required"):
        pyw8a8.equalize_ffn(None, w, np.ones((4, 8)))
    with pytest.raises(ValueError, match="mode"):
        pyw8a8.equalize_ffn(w, w, np.ones((4, 8)), mode="silu")
    with pytest.raises(ValueError, match="clamp must be at least 1"):
        pyw8a8.equalize_ffn(w, w, np.ones((4, 8)), clamp=0.5)
    with pytest.raises(TypeError, match="clamp"):
        pyw8a8.equalize_ffn(w, w, np.ones((4, 8)), clamp="16")
    with pytest.raises(TypeError, match="w_up must be a float32 or float64"):
        pyw8a8.equalize_ffn(w, np.ones((8, 4), np.int32), np.ones((4, 8)))
    bad = w.copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="w_gate holds NaN"):
        pyw8a8.equalize_ffn(bad, w, np.ones((4, 8)))


def test_smooth_keeps_the_product():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 32)) * np.exp(rng.normal(0, 2, 32))
    w1, w2 = rng.standard_normal((24, 32)), rng.standard_normal((8, 32))
    s, (v1, v2) = pyw8a8.smooth([w1, w2], np.abs(x).max(axis=0))
    for w, v in ((w1, w1 * s), (w2, w2 * s)):
        np.testing.assert_allclose((x / s) @ v.T, x @ w.T, rtol=1e-12,
                                   atol=1e-12 * np.abs(x @ w.T).max())
    np.testing.assert_array_equal(v1, w1 * s)
    np.testing.assert_array_equal(v2, w2 * s)


def test_smooth_formula():
    rng = np.random.default_rng(5)
    w1, w2 = rng.standard_normal((6, 5)), rng.standard_normal((3, 5))
    w1[:, 4] = w2[:, 4] = 0  # all-zero input channel: weight max floored at 1e-5
    act = np.array([1.0, 10.0, 0.0, 100.0, 2.0])
    wmax = np.maximum(np.maximum(np.abs(w1).max(0), np.abs(w2).max(0)), 1e-5)
    for alpha in (0.0, 0.5, 0.8, 1.0):
        s, _ = pyw8a8.smooth((w1, w2), act, alpha=alpha)
        np.testing.assert_allclose(s, np.maximum(act**alpha / wmax**(1 - alpha), 1e-5),
                                   rtol=1e-14)
    s, _ = pyw8a8.smooth([w1], act)
    assert s[2] == 1e-5  # a zero activation channel gets the floor, not 0
    s32, (v,) = pyw8a8.smooth([w1.astype(np.float32)], act)
    assert v.dtype == np.float32 and s32.dtype == np.float64


def test_smooth_errors():
    w = np.ones((4, 3))
    with pytest.raises(TypeError, match=r"pass \[w\]"):
        pyw8a8.smooth(w, np.ones(3))
    with pytest.raises(ValueError, match="empty"):
        pyw8a8.smooth([], np.ones(3))
    with pytest.raises(ValueError, match=r"weights\[1\] has K=4"):
        pyw8a8.smooth([w, np.ones((2, 4))], np.ones(3))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        pyw8a8.smooth([w], np.ones(4))
    with pytest.raises(ValueError, match="non-negative"):
        pyw8a8.smooth([w], np.array([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="non-negative"):
        pyw8a8.smooth([w], np.array([1.0, np.inf, 1.0]))
    with pytest.raises(ValueError, match="alpha"):
        pyw8a8.smooth([w], np.ones(3), alpha=1.5)
    with pytest.raises(TypeError, match="act_absmax must be a real array"):
        pyw8a8.smooth([w], np.array(["a", "b", "c"]))
    with pytest.raises(TypeError, match=r"weights\[0\] must be a float32"):
        pyw8a8.smooth([np.ones((4, 3), np.int64)], np.ones(3))
