"""matmul / matmul_pair / pack_weight against references, on every ISA and encoding."""
import os
import sys

import numpy as np
import pytest

import pyw8a8
from pyw8a8 import _kernels

ENCODINGS = ["biased", "signed"]


@pytest.fixture
def isa(any_isa):
    """Every compiled ISA (conftest's any_isa: skipped, with the reason, where this CPU
    lacks it)."""
    return any_isa


def realistic(rng, m, k, n, outliers=3):
    """Activations with rows of different magnitude and a few 10x outlier columns."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    x *= np.exp(rng.uniform(-2, 2, (m, 1))).astype(np.float32)
    x[:, rng.choice(k, size=min(outliers, k), replace=False)] *= 10
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    w += np.float32(0.01)  # channels that are not zero-mean stress the compensation
    return x, w


def quantized_reference(x, packed):
    """float64 product of the quantized operands the kernel actually used."""
    qa, sa = pyw8a8.quantize_per_token(x.reshape(-1, x.shape[-1]))
    qw = packed.int8()
    ref = (qa.astype(np.float64) @ qw.T.astype(np.float64)) * sa[:, None] * packed.scales
    return ref.reshape(x.shape[:-1] + (packed.shape[0],))


def rel_err(y, ref):
    rms = np.sqrt(np.mean(np.square(ref, dtype=np.float64)))
    return np.abs(y.astype(np.float64) - ref).max() / rms


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 640, 2048), (5, 129, 17), (64, 1000, 65),
                                   (127, 2048, 33), (17, 6000, 40)],
                         ids=lambda s: "x".join(map(str, s)))
def test_matches_quantized_reference(isa, encoding, shape):
    m, k, n = shape
    x, w = realistic(np.random.default_rng(k), m, k, n)
    packed = pyw8a8.pack_weight(w, encoding=encoding, rotate=False)
    y = pyw8a8.matmul(x, packed)
    assert y.dtype == np.float32 and y.shape == (m, n)
    assert rel_err(y, quantized_reference(x, packed)) <= 1e-6


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_close_to_float_product(isa, encoding):
    """Documented plain W8A8 accuracy against x @ w.T on data with 10x outlier columns:
    RMS error <= 5% and max error <= 60% of RMS(x @ w.T) (measured: 3% and 25-45%)."""
    x, w = realistic(np.random.default_rng(0), 64, 1024, 256)
    y = pyw8a8.matmul(x, pyw8a8.pack_weight(w, encoding=encoding, rotate=False))
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.sqrt(np.mean((y - ref) ** 2) / np.mean(ref**2)) <= 0.05
    assert rel_err(y, ref) <= 0.6


def test_isas_agree(isa):
    x, w = realistic(np.random.default_rng(1), 40, 700, 90)
    packed = pyw8a8.pack_weight(w, rotate=False)
    with pyw8a8.use_isa("scalar"):
        expect = pyw8a8.matmul(x, packed)
    np.testing.assert_array_equal(pyw8a8.matmul(x, packed), expect)


def test_leading_dims_and_memory_orders():
    x, w = realistic(np.random.default_rng(2), 24, 96, 48)
    packed = pyw8a8.pack_weight(w, rotate=False)
    y = pyw8a8.matmul(x, packed)
    x3 = x.reshape(2, 3, 4, 96)
    np.testing.assert_array_equal(pyw8a8.matmul(x3, packed), y.reshape(2, 3, 4, 48))
    np.testing.assert_array_equal(pyw8a8.matmul(np.asfortranarray(x), packed), y)
    np.testing.assert_array_equal(pyw8a8.matmul(x.astype(np.float64), packed), y)
    np.testing.assert_array_equal(pyw8a8.matmul(x[::-1], packed), y[::-1])
    np.testing.assert_array_equal(pyw8a8.matmul(x[0], packed), y[0])


def test_out_argument():
    x, w = realistic(np.random.default_rng(3), 8, 64, 32)
    packed = pyw8a8.pack_weight(w, rotate=False)
    expect = pyw8a8.matmul(x, packed)
    out = np.full((8, 32), np.nan, np.float32)
    assert pyw8a8.matmul(x, packed, out=out) is out
    np.testing.assert_array_equal(out, expect)
    strided = np.full((8, 64), np.nan, np.float32)[:, ::2]
    pyw8a8.matmul(x, packed, out=strided)
    np.testing.assert_array_equal(strided, expect)


def test_bfloat16_output():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x, w = realistic(np.random.default_rng(4), 8, 64, 32)
    packed = pyw8a8.pack_weight(w, rotate=False)
    y = pyw8a8.matmul(x, packed, out_dtype=ml_dtypes.bfloat16)
    assert y.dtype == ml_dtypes.bfloat16
    expect = pyw8a8.matmul(x, packed)
    np.testing.assert_array_equal(y, expect.astype(ml_dtypes.bfloat16))
    out = np.empty((8, 32), ml_dtypes.bfloat16)
    assert pyw8a8.matmul(x, packed, out=out) is out
    np.testing.assert_array_equal(out, y)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_matmul_pair(isa, encoding):
    x, w1 = realistic(np.random.default_rng(5), 33, 640, 200)
    _, w2 = realistic(np.random.default_rng(6), 33, 640, 120)
    p1 = pyw8a8.pack_weight(w1, encoding=encoding, rotate=False)
    p2 = pyw8a8.pack_weight(w2, encoding="signed", rotate=False)
    y1, y2 = pyw8a8.matmul_pair(x, p1, p2)
    np.testing.assert_array_equal(y1, pyw8a8.matmul(x, p1))
    np.testing.assert_array_equal(y2, pyw8a8.matmul(x, p2))


def test_pack_weight_properties():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((50, 300)).astype(np.float32)
    for encoding in ENCODINGS:
        packed = pyw8a8.pack_weight(w, encoding=encoding, rotate=False)
        assert packed.shape == (50, 300) and packed.encoding == encoding
        q, s = pyw8a8.quantize_per_channel(w)
        np.testing.assert_array_equal(packed.int8(), q)
        np.testing.assert_array_equal(packed.scales, s)
        # Honest size: 64 x 320 padded bytes + scales (+ compensation sums when signed).
        expect = 64 * 320 + 50 * 4 + (64 * 6 * 4 if encoding == "signed" else 0)
        assert packed.nbytes == expect
        deq = packed.dequantize()
        assert deq.dtype == np.float32 and deq.shape == w.shape
        assert np.abs(deq - w).max() <= 0.5 * s.max() * (1 + 1e-6)
        again = pyw8a8.PackedWeight.from_dict(packed.to_dict())
        np.testing.assert_array_equal(again.int8(), q)


def test_empty_shapes():
    w = np.ones((4, 8), np.float32)
    packed = pyw8a8.pack_weight(w, rotate=False)
    assert pyw8a8.matmul(np.zeros((0, 8), np.float32), packed).shape == (0, 4)
    packed0 = pyw8a8.pack_weight(np.ones((0, 8), np.float32), rotate=False)
    assert pyw8a8.matmul(np.ones((3, 8), np.float32), packed0).shape == (3, 0)
    packedk = pyw8a8.pack_weight(np.ones((4, 0), np.float32), rotate=False)
    y = pyw8a8.matmul(np.ones((3, 0), np.float32), packedk)
    assert y.shape == (3, 4) and not y.any()


def test_zero_rows():
    x = np.zeros((3, 64), np.float32)
    x[1] = 1
    y = pyw8a8.matmul(x, pyw8a8.pack_weight(np.ones((5, 64), np.float32), rotate=False))
    assert not y[0].any() and not y[2].any()
    np.testing.assert_allclose(y[1], 64, rtol=1e-6)


def test_bad_inputs():
    packed = pyw8a8.pack_weight(np.ones((4, 8), np.float32), rotate=False)
    with pytest.raises(TypeError, match="x must be a float32 or float64"):
        pyw8a8.matmul(np.ones((2, 8), np.int32), packed)
    with pytest.raises(ValueError, match="K=8"):
        pyw8a8.matmul(np.ones((2, 9), np.float32), packed)
    with pytest.raises(TypeError, match="PackedWeight"):
        pyw8a8.matmul(np.ones((2, 8), np.float32), np.ones((4, 8), np.float32))
    x = np.ones((2, 8), np.float32)
    x[1, 2] = np.nan
    out = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="row 1"):
        pyw8a8.matmul(x, packed, out=out)
    assert not out.any()
    with pytest.raises(ValueError, match="out has shape"):
        pyw8a8.matmul(np.ones((2, 8), np.float32), packed, out=np.zeros((2, 5), np.float32))
    with pytest.raises(TypeError, match="out has dtype"):
        pyw8a8.matmul(np.ones((2, 8), np.float32), packed, out=np.zeros((2, 4)))
    ro = np.zeros((2, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        pyw8a8.matmul(np.ones((2, 8), np.float32), packed, out=ro)
    with pytest.raises(ValueError, match="encoding"):
        pyw8a8.pack_weight(np.ones((4, 8), np.float32), encoding="u8")
    with pytest.raises(TypeError, match="w must be a float32"):
        pyw8a8.pack_weight(np.ones((4, 8), np.int8))
    p2 = pyw8a8.pack_weight(np.ones((4, 16), np.float32), rotate=False)
    with pytest.raises(ValueError, match="differ in K"):
        pyw8a8.matmul_pair(np.ones((2, 8), np.float32), packed, p2)


def test_isa_selection():
    assert pyw8a8.isa() in pyw8a8.available_isas()
    assert "scalar" in pyw8a8.available_isas()
    features = pyw8a8.cpu_features()
    assert {"avx2", "avx512_vnni", "avx_vnni", "amx_int8"} <= set(features)
    with pytest.raises(ValueError, match="not an ISA of pyw8a8"):
        pyw8a8.set_isa("sse9")


def test_thread_count_controls():
    previous = pyw8a8.get_num_threads()
    pyw8a8.set_num_threads(1)
    assert pyw8a8.get_num_threads() == 1
    pyw8a8.set_num_threads(None)
    assert pyw8a8.get_num_threads() == previous
    for bad in (0, -3, 8 * (os.cpu_count() or 1) + 1, 100000):
        with pytest.raises(ValueError, match=f"n must be from 1 to .*got {bad}"):
            pyw8a8.set_num_threads(bad)
    assert pyw8a8.get_num_threads() == previous


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("m", [1, 3, 40])
def test_compiled_call_equals_the_general_route(any_isa, rotate, m):
    """A C-contiguous float32 x without out= takes the one compiled entry point; anything
    else the general route: the bits must not depend on which."""
    x, w = realistic(np.random.default_rng(m), m, 200, 70)
    packed = pyw8a8.pack_weight(w, rotate=rotate)
    fast = pyw8a8.matmul(x, packed)
    general = pyw8a8.matmul(np.asfortranarray(x), packed)
    np.testing.assert_array_equal(fast, general)
    np.testing.assert_array_equal(pyw8a8.matmul(x[0], packed), fast[0])
    out = np.empty_like(fast)
    np.testing.assert_array_equal(pyw8a8.matmul(x, packed, out=out), fast)


def test_compiled_call_keeps_the_errors():
    x, w = realistic(np.random.default_rng(0), 5, 64, 16)
    packed = pyw8a8.pack_weight(w)
    x[3, 7] = np.nan
    with pytest.raises(ValueError, match="row 3"):
        pyw8a8.matmul(x, packed)
    with pytest.raises(ValueError, match="K=64"):
        pyw8a8.matmul(x[:, :32].copy(), packed)
    # A weight whose arrays were replaced is checked again, not trusted from before.
    pyw8a8.matmul(np.ones((2, 64), np.float32), packed)
    packed.scales = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="scales"):
        pyw8a8.matmul(np.ones((2, 64), np.float32), packed)


def _settled(x, packed, kind=_kernels.CALL_ONE):
    """The blocking the weight settled for calls of kind `kind` of x's rows, or None."""
    m = int(np.prod(x.shape[:-1]))
    nthreads = pyw8a8._threads.threads_for(m * x.shape[-1] * packed.shape[0])
    return packed.plan().settled_blocking(kind, pyw8a8._cpu.active_ops(m), m, nthreads)


def _settle(x, packed, calls=400):
    """Call matmul on x until the weight has settled a blocking for its rows (the tuner
    tries candidates first), every call giving the first one's bits; returns them."""
    first = pyw8a8.matmul(x, packed)
    for _ in range(calls):
        np.testing.assert_array_equal(pyw8a8.matmul(x, packed), first)
        if _settled(x, packed) is not None:
            return first
    pytest.fail(f"no blocking settled for {x.shape} in {calls} calls")


def test_a_weight_keeps_the_settled_calls_of_its_last_row_counts():
    """A layer sees a few row counts in turn (batches of other lengths, a prompt then one
    token at a time): its weight keeps a settled blocking for each of the last
    SETTLED_ROWS of them, and a new one takes the place of the one kept longest."""
    rng = np.random.default_rng(5)
    packed = pyw8a8.pack_weight(rng.standard_normal((40, 96)).astype(np.float32))
    xs = [rng.standard_normal((m, 96)).astype(np.float32)
          for m in range(1, _kernels.SETTLED_ROWS + 2)]
    for x in xs:
        _settle(x, packed)
    assert _settled(xs[0], packed) is None  # the oldest, gone
    assert all(_settled(x, packed) is not None for x in xs[1:])
    pyw8a8.matmul(xs[0], packed)  # settled with the tuner: remembered again, for xs[1]'s
    assert _settled(xs[0], packed) is not None
    assert _settled(xs[1], packed) is None
    assert all(_settled(x, packed) is not None for x in xs[2:])


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("lead", [(1,), (3,), (2, 20), ()], ids=str)
def test_settled_compiled_call_equals_the_general_route(any_isa, rotate, lead):
    """Every call runs the compiled call, tuning or settled: the same bits as the
    normalizing route (an F-ordered x takes it) and into out=, any leading dimensions."""
    x, w = realistic(np.random.default_rng(len(lead)), max(1, int(np.prod(lead))), 200, 70)
    x = x.reshape(lead + (200,))
    packed = pyw8a8.pack_weight(w, rotate=rotate)
    fast = _settle(x, packed)
    assert fast.shape == lead + (70,) and fast.dtype == np.float32
    np.testing.assert_array_equal(fast, pyw8a8.matmul(x, packed))
    np.testing.assert_array_equal(fast, pyw8a8.matmul(np.asfortranarray(x), packed))
    np.testing.assert_array_equal(fast, pyw8a8.matmul(x, packed, out=np.empty_like(fast)))


def _call(x, packed, **kw):
    """The compiled call of matmul(x, packed, ...), or None where it declines."""
    return _kernels.call(x, packed._plan, None, kw.get("bias"), None, kw.get("activation"),
                         _kernels.CALL_ONE)


def test_the_compiled_call_declines_what_it_would_convert():
    """_kernels.call answers None (matmul then normalizes the argument and calls it again)
    for an x not in the form it reads as it is; it rejects a K of another weight."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    packed = pyw8a8.pack_weight(rng.standard_normal((40, 96)).astype(np.float32))
    packed.plan()
    np.testing.assert_array_equal(_call(x, packed), pyw8a8.matmul(x, packed))
    buf = np.zeros(x.nbytes + 4, np.uint8)[1:1 + x.nbytes]
    unaligned = buf.view(np.float32).reshape(x.shape)
    unaligned[...] = x

    class Sub(np.ndarray):
        pass

    for other in (x.astype(np.float64), np.asfortranarray(x), unaligned,
                  x.astype(x.dtype.newbyteorder()), x.view(Sub), x.tolist(), np.float32(1)):
        assert _call(other, packed) is None
        if not isinstance(other, list) and getattr(other, "size", 0) and other.ndim == 2:
            np.testing.assert_array_equal(pyw8a8.matmul(other, packed),
                                          pyw8a8.matmul(np.array(other, np.float32), packed))
    for rows in (x[:5].copy(), x[:0]):
        np.testing.assert_array_equal(_call(rows, packed), pyw8a8.matmul(rows, packed))
    with pytest.raises(ValueError, match="x has 48 features .* expects K=96"):
        _call(x[:, :48].copy(), packed)
    assert _kernels.call(x, None, None, None, None, None, _kernels.CALL_ONE) is None


def test_settled_compiled_call_keeps_the_errors_and_the_checks():
    """A NaN row after the weight settled is still named; a replaced array drops the plan
    the compiled call reads, so the weight is checked again."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    packed = pyw8a8.pack_weight(rng.standard_normal((16, 64)).astype(np.float32))
    fast = _settle(x, packed)
    bad = x.copy()
    bad[3, 7] = np.inf
    with pytest.raises(ValueError, match="row 3"):
        pyw8a8.matmul(bad, packed)
    packed.scales = packed.scales * 2
    assert packed._plan is None
    np.testing.assert_allclose(pyw8a8.matmul(x, packed), fast * 2, rtol=1e-6, atol=0)
    packed.scales = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="scales"):
        pyw8a8.matmul(x, packed)


@pytest.mark.parametrize("shape", [(64, 256, 512), (8, 64, 32), (300, 128, 640),
                                   (1, 192, 512)])
@pytest.mark.parametrize("settled", [False, True])
def test_out_is_untouched_when_a_row_fails(isa, shape, settled):
    """A row of x that holds NaN or Inf, or whose rotation overflows, raises and writes
    nothing to out, from the compiled call and from the checked route: also where each of
    two threads quantizes a block of rows and multiplies it (64 rows of 256), whose
    blocks were once written before the other thread found the failing row, and for a
    single row, which the calling thread prepares before the team starts."""
    m, k, n = shape
    pyw8a8.set_num_threads(2)
    rng = np.random.default_rng(5)
    packed = pyw8a8.pack_weight(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    if settled:
        _settle(x, packed)
    last = m - 1
    for value, cols, error in [(np.nan, 3, rf"\bx\b.*non-finite.*row {last}\b"),
                               (np.inf, 3, rf"\bx\b.*non-finite.*row {last}\b"),
                               (3e38, slice(None), rf"\bx\b row {last} .*too large")]:
        bad = x.copy()
        bad[-1, cols] = value
        out = np.full((m, n), 7.0, np.float32)
        with pytest.raises(ValueError, match=error):
            pyw8a8.matmul(bad, packed, out=out)
        assert np.all(out == 7.0), (value, int(np.sum(out != 7.0)))


def test_out_takes_the_compiled_call(isa, monkeypatch):
    """A settled call into a float32 C-contiguous out runs from C, with no check in
    Python, the same bits as without out; an out the compiled call cannot take as it is
    (overlapping x, strided, of another shape) gets the checked route and its errors."""
    rng = np.random.default_rng(6)
    packed = pyw8a8.pack_weight(rng.standard_normal((32, 32)).astype(np.float32))
    x = rng.standard_normal((4, 4, 32)).astype(np.float32)
    bias = np.ones(32, np.float32)
    _settle(x, packed)
    want = pyw8a8.matmul(x, packed, bias=bias, activation="silu")
    route = sys.modules["pyw8a8.matmul"]
    checked_output = route._output

    def checked(*args):
        raise AssertionError("out= checked in Python")
    monkeypatch.setattr(route, "_output", checked)
    out = np.full((4, 4, 32), np.nan, np.float32)
    assert pyw8a8.matmul(x, packed, bias=bias, activation="silu", out=out) is out
    np.testing.assert_array_equal(out, want)
    monkeypatch.setattr(route, "_output", checked_output)
    with pytest.raises(ValueError, match=r"\bout\b.*overlaps.*\bx\b"):
        pyw8a8.matmul(x, packed, out=x)
    strided = np.full((4, 4, 64), np.nan, np.float32)[..., ::2]
    assert pyw8a8.matmul(x, packed, bias=bias, activation="silu", out=strided) is strided
    np.testing.assert_array_equal(strided, want)
    with pytest.raises(ValueError, match=r"\bout\b.*shape"):
        pyw8a8.matmul(x, packed, out=np.zeros((16, 32), np.float32))


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("m", [1, 24])
def test_layer_and_pair_calls_equal_the_general_route(any_isa, rotate, m):
    """matmul with bias and activation, matmul_pair, and its gated form: the compiled call
    gives the normalizing route's bits (an F-ordered x takes it), on every blocking the
    tuner tries and the one it settles."""
    rng = np.random.default_rng(m)
    x, w = realistic(rng, m, 160, 48)
    gate = pyw8a8.pack_weight(w, rotate=rotate)
    up = pyw8a8.pack_weight(realistic(rng, 1, 160, 48)[1], rotate=rotate)
    b1, b2 = rng.standard_normal((2, 48)).astype(np.float32)
    xf = np.asfortranarray(x)
    gate.plan(), up.plan()
    cases = [
        (lambda v: pyw8a8.matmul(v, gate, bias=b1, activation="gelu_tanh"),
         lambda: _kernels.call(x, gate._plan, None, b1, None, "gelu_tanh", _kernels.CALL_ONE)),
        (lambda v: pyw8a8.matmul_pair(v, gate, up, bias1=b1),
         lambda: _kernels.call(x, gate._plan, up._plan, b1, None, None, _kernels.CALL_PAIR)),
        (lambda v: pyw8a8.matmul_pair(v, gate, up, glu="silu", bias2=b2),
         lambda: _kernels.call(x, gate._plan, up._plan, None, b2, "silu", _kernels.CALL_GLU)),
    ]
    for call, fast in cases:
        general = call(xf)
        for _ in range(3 * _kernels.TUNE_ROUNDS * 8):
            for a, b in zip(*(v if isinstance(v, tuple) else (v,) for v in (fast(), general))):
                np.testing.assert_array_equal(a, b)


def test_the_compiled_call_rejects_what_c_checks():
    """Biases holding NaN, unknown activations, weights that do not pair up: the compiled
    call raises matmul's errors (C's faults); biases it would convert it declines."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    gate, up = (pyw8a8.pack_weight(rng.standard_normal((32, 64)).astype(np.float32))
                for _ in range(2))
    gate.plan()
    bias = np.ones(32, np.float32)
    nan_bias = bias.copy()
    nan_bias[5] = np.nan
    for f in (lambda: _call(x, gate, bias=nan_bias),
              lambda: pyw8a8.matmul(x, gate, bias=nan_bias)):
        with pytest.raises(ValueError, match="bias holds NaN"):
            f()
    for bad in (bias.astype(np.float64), bias[:31], np.ones((1, 32), np.float32),
                bias.tolist(), np.ones(64, np.float32)[::2]):
        assert _call(x, gate, bias=bad) is None
    for act in ("tanh", 3, ["relu"]):
        for f in (lambda: _call(x, gate, activation=act),
                  lambda: pyw8a8.matmul(x, gate, activation=act)):
            with pytest.raises(ValueError, match="activation must be"):
                f()
    other = pyw8a8.pack_weight(rng.standard_normal((16, 64)).astype(np.float32))
    unrotated = pyw8a8.pack_weight(rng.standard_normal((32, 64)).astype(np.float32),
                                   rotate=False)
    with pytest.raises(ValueError, match="one N"):
        pyw8a8.matmul_pair(x, gate, other, glu="relu")
    with pytest.raises(ValueError, match="different rotations"):
        pyw8a8.matmul_pair(x, gate, unrotated)
    # a pair needs two weights
    assert _kernels.call(x, gate._plan, None, None, None, "relu", _kernels.CALL_GLU) is None


def test_bfloat16_output_by_name():
    """numpy users name dtypes by string; numpy knows 'bfloat16' only after ml_dtypes is
    imported, which matmul does for them."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x, w = realistic(np.random.default_rng(4), 8, 64, 32)
    packed = pyw8a8.pack_weight(w, rotate=False)
    y = pyw8a8.matmul(x, packed, out_dtype="bfloat16")
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y, pyw8a8.matmul(x, packed, out_dtype=ml_dtypes.bfloat16))
    assert pyw8a8.matmul(x, packed, out_dtype="float32").dtype == np.float32
