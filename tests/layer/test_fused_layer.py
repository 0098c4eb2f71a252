"""The fused layer: matmul's bias and activation, matmul_pair's gated unit (glu=).

Exactness: every ISA gives the same bits as the scalar ISA (the reference), and the fused
forms give exactly the bits of their unfused composition (the product, plus the bias in
float32, then the activation pass of _simd/epilogue.h; for glu, act(y1) * y2), so the fusion
changes where the arithmetic runs, never its result.  Accuracy: each activation against a
float64 evaluation of the same function on the same float32 input."""
import numpy as np
import pytest
from scipy.special import erfc, expit

import pyw8a8
from pyw8a8 import _dispatch, _kernels, _rows
from pyw8a8.matmul import ACTIVATIONS

NAMES = list(ACTIVATIONS)
# Measured over 5.3 million float32 inputs (random bit patterns of every exponent, dense
# grids on [-20, 20] and [-15, 0] and a log grid to -1e4; the sweep of
# test_activation_accuracy, four times larger): relu exact, gelu 3.89, gelu_tanh 3.19,
# silu 3.05 units in the last place.  gelu's roundings: its erfcx fit 0.6 units (float
# coefficients), its evaluation about 2, the exponential's 1, a quotient and a product.
ULP_BOUND = {"relu": 0.0, "gelu": 4.0, "gelu_tanh": 3.5, "silu": 3.5}


def _reference(name, x):
    """The activation in float64 of float32 inputs x (no cancellation in the tails)."""
    xd = x.astype(np.float64)
    if name == "relu":
        return np.maximum(xd, 0)
    if name == "gelu":
        return 0.5 * xd * erfc(-xd / np.sqrt(2))
    if name == "gelu_tanh":
        with np.errstate(over="ignore"):
            return xd * expit(2 * np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3))
    return xd * expit(xd)


def _activate(x, name, isa="scalar"):
    """The activation pass of ISA `isa` on a copy of float32 x."""
    y = np.array(x, dtype=np.float32).reshape(1, -1)
    _rows.activate(_dispatch.IsaOps(isa), y, ACTIVATIONS[name])
    return y.reshape(np.shape(x))


def _ulps(got, want):
    """|got - want| in units of the last place of want rounded to float32."""
    with np.errstate(over="ignore"):
        ulp = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / ulp


def _sweep(n=1 << 20, seed=0):
    """Finite float32 values of every exponent and sign, and dense grids where the
    activations bend and where their negative tails lose the most (gelu's at x = -3 to -13)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([x[np.isfinite(x)], np.linspace(-20, 20, 1 << 16, dtype=np.float32),
                           -np.logspace(-3, 4, 1 << 14).astype(np.float32),
                           np.linspace(-15, 0, n >> 2, dtype=np.float32)])


@pytest.fixture(scope="module")
def layer():
    rng = np.random.default_rng(3)
    k, n = 300, 70  # K past a 64-multiple, N past a 16-multiple: edge tiles on every ISA
    x = rng.standard_normal((37, k)).astype(np.float32)
    w_gate = rng.standard_normal((n, k)).astype(np.float32)
    w_up = rng.standard_normal((n, k)).astype(np.float32) * 0.5
    return {"x": x, "gate": pyw8a8.pack_weight(w_gate), "up": pyw8a8.pack_weight(w_up),
            "gate_signed": pyw8a8.pack_weight(w_gate, encoding="signed"),
            "bias1": rng.standard_normal(n).astype(np.float32),
            "bias2": rng.standard_normal(n).astype(np.float32)}


# ---- exactness ----

@pytest.mark.parametrize("name", [None] + NAMES)
def test_matmul_bias_activation_is_bit_identical_on_every_isa(any_isa, layer, name):
    got = pyw8a8.matmul(layer["x"], layer["gate"], bias=layer["bias1"], activation=name)
    with pyw8a8.use_isa("scalar"):
        want = pyw8a8.matmul(layer["x"], layer["gate"], bias=layer["bias1"], activation=name)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", NAMES)
def test_fused_layer_equals_its_unfused_composition(any_isa, layer, name):
    product = pyw8a8.matmul(layer["x"], layer["gate"])
    unfused = _activate(product + layer["bias1"], name)  # float32 sum, as the epilogue's
    fused = pyw8a8.matmul(layer["x"], layer["gate"], bias=layer["bias1"], activation=name)
    np.testing.assert_array_equal(fused, unfused)
    np.testing.assert_array_equal(pyw8a8.matmul(layer["x"], layer["gate"], activation=name),
                                  _activate(product, name))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("gate", ["gate", "gate_signed"])
def test_glu_equals_activation_of_gate_times_up(any_isa, layer, name, gate):
    # The signed-encoded gate beside a biased up projection: two activation formats in one
    # call on the VNNI ISAs.
    y1, y2 = pyw8a8.matmul_pair(layer["x"], layer[gate], layer["up"], bias1=layer["bias1"],
                                bias2=layer["bias2"])
    fused = pyw8a8.matmul_pair(layer["x"], layer[gate], layer["up"], glu=name,
                               bias1=layer["bias1"], bias2=layer["bias2"])
    np.testing.assert_array_equal(fused, _activate(y1, name) * y2)
    with pyw8a8.use_isa("scalar"):
        scalar = pyw8a8.matmul_pair(layer["x"], layer[gate], layer["up"], glu=name,
                                    bias1=layer["bias1"], bias2=layer["bias2"])
    np.testing.assert_array_equal(fused, scalar)


@pytest.mark.parametrize("m", [1, 5, 64, 200])
def test_glu_at_every_row_count_matches_the_unfused_pair(any_isa, m):
    # Row counts below, at and beyond a tile and the AMX threshold; one thread and two.
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, 640)).astype(np.float32)
    gate = pyw8a8.pack_weight(rng.standard_normal((272, 640)).astype(np.float32))
    up = pyw8a8.pack_weight(rng.standard_normal((272, 640)).astype(np.float32))
    y1, y2 = pyw8a8.matmul_pair(x, gate, up)
    for threads in (1, 2):
        pyw8a8.set_num_threads(threads)
        np.testing.assert_array_equal(pyw8a8.matmul_pair(x, gate, up, glu="gelu_tanh"),
                                      _activate(y1, "gelu_tanh") * y2)


def test_fused_forms_take_nd_and_float64_activations(layer):
    x3 = layer["x"][:36].reshape(3, 12, -1)
    got = pyw8a8.matmul(x3.astype(np.float64), layer["gate"], bias=layer["bias1"].astype(
        np.float64), activation="silu")
    want = pyw8a8.matmul(layer["x"][:36], layer["gate"], bias=layer["bias1"], activation="silu")
    np.testing.assert_array_equal(got, want.reshape(3, 12, -1))
    glu = pyw8a8.matmul_pair(x3, layer["gate"], layer["up"], glu="silu")
    assert glu.shape == (3, 12, 70) and glu.dtype == np.float32
    np.testing.assert_array_equal(glu.reshape(36, -1), pyw8a8.matmul_pair(
        layer["x"][:36], layer["gate"], layer["up"], glu="silu"))


def test_fused_layer_with_out_and_bfloat16(layer):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    want = pyw8a8.matmul(layer["x"], layer["gate"], bias=layer["bias1"], activation="gelu")
    out = np.empty_like(want)
    assert pyw8a8.matmul(layer["x"], layer["gate"], bias=layer["bias1"], activation="gelu",
                         out=out) is out
    np.testing.assert_array_equal(out, want)
    half = pyw8a8.matmul(layer["x"], layer["gate"], bias=layer["bias1"], activation="gelu",
                         out_dtype=ml_dtypes.bfloat16)
    np.testing.assert_array_equal(half, want.astype(ml_dtypes.bfloat16))


def test_k_zero_gives_the_activation_of_the_bias():
    packed = pyw8a8.pack_weight(np.zeros((5, 0), np.float32))
    bias = np.array([-3.0, -0.0, 0.0, 1.5, 40.0], np.float32)
    got = pyw8a8.matmul(np.zeros((2, 0), np.float32), packed, bias=bias, activation="gelu")
    np.testing.assert_array_equal(got, np.broadcast_to(_activate(np.float32(0) + bias, "gelu"),
                                                       (2, 5)))
    glu = pyw8a8.matmul_pair(np.zeros((2, 0), np.float32), packed, packed, glu="relu",
                             bias1=bias, bias2=bias)
    np.testing.assert_array_equal(glu[0], _activate(np.float32(0) + bias, "relu") *
                                  (np.float32(0) + bias))


@pytest.mark.slow
def test_fused_layer_beyond_the_exact_int32_range():
    # K past W8_EXACT_K: int64 sums, finished by the scalar reference (product.h); the same
    # bits as the unfused composition.
    rng = np.random.default_rng(9)
    k = _kernels.W8_EXACT_K + 100
    x = rng.standard_normal((2, k)).astype(np.float32)
    gate = pyw8a8.pack_weight(rng.standard_normal((3, k)).astype(np.float32), rotate=False)
    up = pyw8a8.pack_weight(rng.standard_normal((3, k)).astype(np.float32), rotate=False)
    bias = np.array([1.0, -2.0, 0.5], np.float32)
    y1, y2 = pyw8a8.matmul_pair(x, gate, up, bias1=bias)
    np.testing.assert_array_equal(pyw8a8.matmul(x, gate, bias=bias, activation="silu"),
                                  _activate(y1, "silu"))
    np.testing.assert_array_equal(pyw8a8.matmul_pair(x, gate, up, glu="silu", bias1=bias),
                                  _activate(y1, "silu") * y2)


# ---- the activations themselves ----

@pytest.mark.parametrize("name", NAMES)
def test_activation_accuracy_against_float64(name):
    x = _sweep()
    err = _ulps(_activate(x, name), _reference(name, x))
    assert np.nanmax(err) <= ULP_BOUND[name], (name, float(np.nanmax(err)))


@pytest.mark.parametrize("name", NAMES)
def test_activation_is_bit_identical_on_every_isa(any_isa, name):
    x = _sweep(1 << 16, seed=4)
    np.testing.assert_array_equal(_activate(x, name, any_isa), _activate(x, name))


@pytest.mark.parametrize("name", NAMES)
def test_activation_special_values(any_isa, name):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-45, -1e-45, 1e-30,
                  -1e-30, 200.0, -200.0], np.float32)
    y = _activate(x, name, any_isa)
    assert np.isnan(y[4])                        # NaN propagates
    assert y[0] == 0 and not np.signbit(y[0])    # +0 -> +0
    assert y[1] == 0 and np.signbit(y[1])        # -0 -> -0
    assert y[2] == np.inf and y[5] == np.float32(3e38) and y[11] == 200
    assert y[3] == 0 and y[6] == 0 and y[12] == 0  # the limits at -inf: 0 (or -0)
    # Subnormal and tiny inputs: x * 0.5 (gelu and silu at 0), x * 0.5 (gelu_tanh), relu x.
    np.testing.assert_array_equal(y[7:11], _reference(name, x[7:11]).astype(np.float32))


def test_activations_agree_with_torch_within_a_few_ulps():
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x = np.concatenate([np.linspace(-12, 12, 100001, dtype=np.float32),
                        np.random.default_rng(5).standard_normal(100000).astype(np.float32)])
    t = torch.from_numpy(x)
    theirs = {"relu": functional.relu(t), "gelu": functional.gelu(t),
              "gelu_tanh": functional.gelu(t, approximate="tanh"), "silu": functional.silu(t)}
    for name, value in theirs.items():
        ours, ref, torchs = _activate(x, name), _reference(name, x), value.numpy()
        # They agree to float32 rounding in absolute terms ...
        assert np.max(np.abs(ours - torchs) / np.maximum(1, np.abs(x))) <= 1e-6, name
        # ... and where they differ by more than a few units of the result (torch's float32
        # 0.5 x (1 + erf(x / sqrt 2)) cancels in the negative tail: 8,000 units at x = -3.5),
        # ours is the one within ULP_BOUND of float64.
        apart = _ulps(torchs, ref) > ULP_BOUND[name] + 1
        assert np.all(_ulps(ours[apart], ref[apart]) <= ULP_BOUND[name]), name


# ---- bad input ----

def test_bias_of_wrong_shape_dtype_or_value_is_refused(layer):
    x, packed = layer["x"], layer["gate"]
    for bias, match in [(np.zeros(69, np.float32), "bias must have shape \\(70,\\)"),
                        (np.zeros((1, 70), np.float32), "bias must have shape"),
                        (np.zeros(70, np.int32), "bias must be a float32 or float64"),
                        (np.zeros(70, np.complex64), "bias must be a float32 or float64"),
                        (np.full(70, np.nan, np.float32), "bias holds NaN or Inf"),
                        (np.full(70, 1e300), "bias has a value beyond float32")]:
        with pytest.raises(ValueError, match=match):
            pyw8a8.matmul(x, packed, bias=bias)
    with pytest.raises(ValueError, match="bias2 must have shape"):
        pyw8a8.matmul_pair(x, packed, layer["up"], bias2=np.zeros(3, np.float32))


@pytest.mark.parametrize("activation", ["gelu_erf", "ReLU", "", 1, np.float32(1)])
def test_unknown_activation_is_refused(layer, activation):
    with pytest.raises(ValueError, match="activation must be None or one of 'relu'"):
        pyw8a8.matmul(layer["x"], layer["gate"], activation=activation)
    with pytest.raises(ValueError, match="glu must be None or one of"):
        pyw8a8.matmul_pair(layer["x"], layer["gate"], layer["up"], glu=activation)


def test_glu_with_weights_of_different_k_or_n_is_refused(layer):
    rng = np.random.default_rng(1)
    other_n = pyw8a8.pack_weight(rng.standard_normal((71, 300)).astype(np.float32))
    other_k = pyw8a8.pack_weight(rng.standard_normal((70, 301)).astype(np.float32))
    with pytest.raises(ValueError, match="glu='silu' needs packed1 .* of one N: 70 vs 71"):
        pyw8a8.matmul_pair(layer["x"], layer["gate"], other_n, glu="silu")
    with pytest.raises(ValueError, match="packed1 and packed2 differ in K"):
        pyw8a8.matmul_pair(layer["x"], layer["gate"], other_k, glu="silu")
    # Without glu, products of different N stay allowed.
    y1, y2 = pyw8a8.matmul_pair(layer["x"], layer["gate"], other_n)
    assert y1.shape == (37, 70) and y2.shape == (37, 71)
