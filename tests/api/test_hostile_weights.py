"""Altered and hand-built PackedWeights, and operands at the ends of float32's range: a clean
exception or a right result on every ISA, never a crash, a hang or NaN from finite data."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pyw8a8
from pyw8a8 import PackedWeight

RNG = np.random.default_rng(5)
W = RNG.standard_normal((40, 2049)).astype(np.float32)
X = RNG.standard_normal((3, 2049)).astype(np.float32)


@pytest.mark.parametrize("attr, value", [("block", 2176), ("block", 1000), ("block", -1),
                                         ("block", 0), ("block", 128.0), ("seed", -1),
                                         ("seed", 2**40), ("rotate", 0), ("rotate", False)])
def test_rotation_settings_cannot_be_altered(attr, value):
    """block 2176 on K = 2049 corrupted the heap, a negative block hung, seed -1 gave
    OverflowError on one path and ValueError on the other: the settings are fixed."""
    packed = pyw8a8.pack_weight(W)
    ref = pyw8a8.matmul(X, packed)
    with pytest.raises(AttributeError):
        setattr(packed, attr, value)
    np.testing.assert_array_equal(pyw8a8.matmul(X, packed), ref)
    np.testing.assert_array_equal(pyw8a8.matmul(X.astype(np.float64), packed), ref)


@pytest.mark.parametrize("kwargs, match", [
    (dict(block=2176), "block must be a power of two"), (dict(block=-1), "block"),
    (dict(block=128.5), "block must be an int"), (dict(seed=-1), "seed must be in"),
    (dict(seed=2**32), "seed must be in"), (dict(rotate="yes"), "rotate must be a bool")])
def test_hand_built_weights_with_bad_settings_are_refused(kwargs, match):
    p = pyw8a8.pack_weight(W, rotate=False)
    settings = dict(rotate=True, block=128, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        PackedWeight(p.shape, p.encoding, p.panels, p.psum, p.scales, **settings)


def test_a_weight_whose_arrays_no_longer_fit_its_rotation_is_refused_on_every_isa():
    """Arrays of a block-128 weight under block 64 (K = 2049 rounds up differently)."""
    good = pyw8a8.pack_weight(W, block=128, pad=True)
    bad = PackedWeight(good.shape, good.encoding, good.panels, good.psum, good.scales,
                       rotate=True, block=2048, seed=0)
    for x in (X, X.astype(np.float64), X[0], X.reshape(1, 3, -1)):
        with pytest.raises(ValueError, match="'panels'"):
            pyw8a8.matmul(x, bad)
    with pytest.raises(ValueError, match="'panels'"):
        pyw8a8.matmul_pair(X, good, bad)


_ATTRS = ("shape", "encoding", "panels", "psum", "scales", "rotate", "block", "seed")
_VALUES = st.one_of(st.none(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=4),
                    st.tuples(st.integers(-3, 5000), st.integers(-3, 5000)),
                    st.sampled_from([np.zeros(3, np.uint8), np.zeros((3, 4), np.int32),
                                     np.zeros((3, 513, 64), np.uint8), "biased", "signed",
                                     True, 64, 4096]))


@given(attr=st.sampled_from(_ATTRS), value=_VALUES, dtype=st.sampled_from(["f4", "f8"]))
def test_mutated_weights_give_clean_exceptions_or_right_results(attr, value, dtype):
    packed = pyw8a8.pack_weight(W[:20, :300])
    x = X[:, :300].astype(dtype)
    ref = pyw8a8.matmul(x, packed)
    try:
        setattr(packed, attr, value)
    except AttributeError:
        return
    try:
        y = pyw8a8.matmul(x, packed)
    except (ValueError, TypeError):
        return
    np.testing.assert_array_equal(y, ref)  # accepted only if it still means the same


@pytest.mark.parametrize("big, small", [(3e21, 2e21), (1e30, 3e29), (3e38, 1e38)])
def test_huge_finite_operands_give_no_nan(big, small):
    """The epilogue formed s_a * s_w first, which overflowed once max|x| * max|w| passed
    5.5e42 (then 0 * Inf gave NaN); the smaller scale now comes first."""
    x = np.array([[big, small, 0, 0]], np.float32)
    w = np.array([[small / big, 1, 0, 0]], np.float32) * np.float32(big)
    packed = pyw8a8.pack_weight(w, rotate=False)
    qa, sa = pyw8a8.quantize_per_token(x)
    exact = (qa.astype(np.int64) @ packed.int8().T.astype(np.int64)).item() * \
        float(sa[0]) * float(packed.scales[0])
    results = []
    for isa in pyw8a8.available_isas():
        with pyw8a8.use_isa(isa):
            results.append(pyw8a8.matmul(x, packed))
    for y in results:
        np.testing.assert_array_equal(y, results[0])
    if exact < float(np.finfo(np.float32).max):
        assert np.isfinite(results[0]).all()
        assert abs(results[0][0, 0] - exact) <= 4e-7 * exact
    else:
        assert np.isinf(results[0]).all()  # the true result overflows float32: Inf, not NaN


@pytest.mark.parametrize("value", [1e-20, 1e-25, 1e-30])
def test_tiny_operands_keep_their_precision(value):
    """x = w = 1e-20 at K = 1024 came out 10% low: s_a * s_w was subnormal."""
    x = np.full((2, 1024), value, np.float32)
    packed = pyw8a8.pack_weight(x, rotate=False)
    exact = 1024 * float(np.float32(value)) ** 2
    for isa in pyw8a8.available_isas():
        with pyw8a8.use_isa(isa):
            y = pyw8a8.matmul(x, packed)
        if exact > float(np.finfo(np.float32).tiny):
            np.testing.assert_allclose(y, exact, rtol=1e-6, err_msg=isa)


def test_empty_weights_dequantize_to_their_shape():
    for shape in [(0, 5), (0, 300), (7, 0)]:
        p = pyw8a8.pack_weight(np.ones(shape, np.float32))
        assert p.dequantize().shape == shape
