"""Tests of the noise floor's rounding to bfloat16 (`pyw8a8.evaluate.bfloat16`)."""

import numpy as np
import pytest

from pyw8a8.evaluate.bfloat16 import bfloat16_linear, round_to_bfloat16
from pyw8a8.router import FloatLinear


@pytest.mark.parametrize("value, rounded", [
    (1.0, 1.0),
    (1.0 + 2.0 ** -8, 1.0),                              # a tie: down to the even 1.0
    (1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -6),              # a tie: up to the even neighbour
    (1.0 + 2.0 ** -8 + 2.0 ** -20, 1.0 + 2.0 ** -7),     # above the tie: up
    (-(1.0 + 2.0 ** -8 + 2.0 ** -20), -(1.0 + 2.0 ** -7)),
    (3.0 * 2.0 ** -130, 3.0 * 2.0 ** -130),              # subnormal, exact in bfloat16
    (np.finfo(np.float32).max, np.inf),                   # beyond the largest bfloat16
    (-np.inf, -np.inf),
    (0.0, 0.0),
])
def test_round_to_bfloat16_by_hand(value, rounded):
    got = round_to_bfloat16(np.array([value], dtype=np.float32))
    assert got.dtype == np.float32 and got[0] == np.float32(rounded)


def test_round_to_bfloat16_matches_ml_dtypes_on_every_kind_of_bit_pattern():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = np.random.default_rng(0).integers(0, 2 ** 32, size=200_000, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32).reshape(400, 500)
    got = round_to_bfloat16(x)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(x)
    assert got.shape == x.shape and nan.any()
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(x[nan]))  # sign kept


def test_round_to_bfloat16_reads_a_read_only_strided_input_over_chunks(monkeypatch):
    from pyw8a8.evaluate import bfloat16

    monkeypatch.setattr(bfloat16, "_CHUNK", 7)  # several chunks and a ragged last one
    x = np.random.default_rng(1).standard_normal((30, 20)).astype(np.float32)[:, ::2]
    x.flags.writeable = False
    got = round_to_bfloat16(x)
    assert got.flags.c_contiguous and got.shape == (30, 10)
    # bfloat16 keeps the top 16 bits: the rounding error is at most half a unit (2^-8 relative)
    assert np.all(got.view(np.uint32) & 0xFFFF == 0)
    assert np.all(np.abs(got - x) <= np.abs(x) * 2.0 ** -8)


def test_bfloat16_linear_is_a_float_layer_on_rounded_weights():
    w = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    layer = bfloat16_linear("blk.0.attn_q.weight", w)
    assert isinstance(layer, FloatLinear) and layer.shape == (5, 8)
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(layer(x), x @ round_to_bfloat16(w).T)
