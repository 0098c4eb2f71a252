"""Property-based tests (Hypothesis): exactness of the integer products, accuracy of the float
products, and agreement between ISAs and weight encodings, over shapes
(0 and 1 in every dimension, K across the 64-byte padding and the K-range boundaries),
dtypes, memory orders and hostile values (zeros, +-127, denormals, 3e38, one outlier per row).

Every test runs on every compiled ISA (the ``any_isa`` fixture: an ISA this CPU lacks is a
skip with its reason) with both encodings, against the same references, and the float
products bit for bit against the ``scalar`` ISA, so an AVX-512 or AMX machine checks its
own ISAs.  The number of
examples is set by the Hypothesis profile (see conftest.py).
"""
import importlib.util
import math

import numpy as np
import pytest
from hypothesis import assume, given, note
from hypothesis import strategies as st

import pyw8a8

ENCODINGS = ("biased", "signed")
HAS_ROTATION = importlib.util.find_spec("pyw8a8.rotation") is not None

# max |matmul - reference| / RMS(reference), the reference computed in float64 from the
# quantized operands (see docs/guarantees.md).
TOL = 1e-6

LAYOUTS = ("C", "F", "strided", "negative", "unaligned")


def relayout(a, kind):
    """An array equal to `a` laid out in memory as `kind`."""
    if kind == "C":
        return np.ascontiguousarray(a)
    if kind == "F":
        return np.asfortranarray(a)
    if kind == "strided":  # every other element of a larger array, in every dimension
        big = np.zeros(tuple(2 * s + 1 for s in a.shape), a.dtype)
        view = big[tuple(slice(1, None, 2) for _ in a.shape)]
    elif kind == "negative":  # negative strides in every dimension
        view = np.empty(a.shape, a.dtype)[tuple(slice(None, None, -1) for _ in a.shape)]
    elif kind == "unaligned":  # an offset view of a byte buffer
        buf = np.zeros(a.nbytes + 1, np.uint8)
        view = buf[1:].view(a.dtype).reshape(a.shape)
        assert a.dtype.itemsize == 1 or a.size == 0 or not view.flags.aligned
    else:
        raise AssertionError(kind)
    view[...] = a
    return view


def dims(small, specials):
    return st.one_of(st.integers(0, small), st.sampled_from(specials))


M_DIMS = dims(9, (13, 17, 31))
N_DIMS = dims(20, (31, 32, 33, 47, 64, 65))
# Across the 64-byte K padding and the K-range (kc) boundaries of every ISA.
K_DIMS = dims(70, (127, 128, 129, 255, 256, 257, 511, 512, 513, 1000, 2047, 2048, 2049,
                   4160))
SEEDS = st.integers(0, 2**32 - 1)

INT8_PATTERNS = ("random", "max", "min", "plusminus", "zeros", "sparse")


def int8_values(rng, shape, pattern):
    if pattern == "random":
        return rng.integers(-127, 128, shape, dtype=np.int8)
    if pattern == "max":
        return np.full(shape, 127, np.int8)
    if pattern == "min":
        return np.full(shape, -127, np.int8)
    if pattern == "plusminus":
        return np.where(rng.random(shape) < 0.5, 127, -127).astype(np.int8)
    if pattern == "zeros":
        return np.zeros(shape, np.int8)
    if pattern == "sparse":
        q = rng.integers(-127, 128, shape, dtype=np.int8)
        return np.where(rng.random(shape) < 0.05, q, 0).astype(np.int8)
    raise AssertionError(pattern)


# Row kinds of float operands.  "denormal" rows quantize to zero rows; "mixed" rows hold
# denormals beside normal values; "huge" rows reach 3.4e38 (just below FLT_MAX).
X_ROWS = ("normal", "zeros", "denormal", "mixed", "huge", "outlier")
W_ROWS = ("normal", "zeros", "denormal", "mixed", "outlier", "small")


def float_row(rng, k, kind):
    if kind == "zeros":
        return np.zeros(k)
    if kind == "denormal":
        return rng.standard_normal(k) * 1e-40
    if kind == "huge":
        row = rng.uniform(-3e38, 3e38, k)
        if k:
            row[rng.integers(k)] = 3.4e38 * rng.choice([-1, 1])
        return row
    row = rng.standard_normal(k) * 10.0 ** rng.uniform(-3, 3)
    if kind == "small":
        row *= 1e-6
    elif kind == "mixed":
        row[rng.random(k) < 0.5] = 1e-41
    elif kind == "outlier" and k:
        row[rng.integers(k)] *= 1e4
    return row


def float_matrix(rng, rows, k, kinds):
    return np.array([float_row(rng, k, kinds[rng.integers(len(kinds))])
                     for _ in range(rows)]).reshape(rows, k)


def reference(x2d, packed):
    """float64 product of the quantized operands (the value matmul approximates), the same
    with absolute values (the magnitude its rounding errors scale with), and (qa, sa)."""
    qa, sa = pyw8a8.quantize_per_token(x2d)
    qw = packed.int8()
    scale = sa.astype(np.float64)[:, None] * packed.scales.astype(np.float64)[None, :]
    acc = qa.astype(np.int64) @ qw.T.astype(np.int64)
    mag = np.abs(qa.astype(np.int64)) @ np.abs(qw.T.astype(np.int64))
    return acc * scale, mag * scale, (qa, sa)


U = 2.0**-24  # unit roundoff of float32


def assert_within_tolerance(y, ref, mag, ranges):
    """The guarantees of docs/guarantees.md for a float32 result y of `ranges` K-ranges:
    |y - ref| <= (ranges + 2) u sum_k |terms| per element, and max|y - ref| <= TOL RMS(ref)
    when no element dominates (max |ref| <= 5 RMS(ref))."""
    assert y.shape == ref.shape
    if ref.size == 0:
        return
    assert np.all(np.isfinite(y))
    err = np.abs(y.astype(np.float64) - ref)
    bound = (ranges + 2) * U * mag
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), \
        f"element {worst}: error {err[worst]:.3g} > bound {bound[worst]:.3g}"
    rms = math.sqrt(np.mean(ref * ref))
    if rms == 0:
        assert err.max() == 0
    elif np.max(np.abs(ref)) <= 5 * rms:
        assert err.max() <= TOL * rms, f"max-abs-error / RMS = {err.max() / rms:.3g}"


# Products of the two scales must be normal floats and results below FLT_MAX for the
# tolerance to hold (float32 output); when they are not, the weights are rescaled by the
# smallest power of two (which leaves their int8 values unchanged) that brings them there.
_LO, _HI = 2.0**-118, 2.0**120


def _scale_window(sa, sb, k):
    sa, sb = sa[sa > 0].astype(np.float64), sb[sb > 0].astype(np.float64)
    if not sa.size or not sb.size:
        return 0.0, 1.0
    return sa.min() * sb.min(), sa.max() * sb.max() * 127.0 * 127.0 * max(k, 1)


def _pack_centred(w, x2d, k, **kwargs):
    packed = pyw8a8.pack_weight(w, **kwargs)
    _, sa = pyw8a8.quantize_per_token(x2d)
    lo, hi = _scale_window(sa, packed.scales, k)
    if lo and not (_LO <= lo and hi <= _HI):
        shift = (math.floor(math.log2(_HI / hi)) if hi > _HI
                 else math.ceil(math.log2(_LO / lo)))
        packed = pyw8a8.pack_weight(np.ldexp(w, shift), **kwargs)
        lo, hi = _scale_window(sa, packed.scales, k)
    assume(lo == 0 or (_LO <= lo and hi <= _HI))
    return packed


# --- int8_matmul ------------------------------------------------------------------


@pytest.mark.exhaustive
@given(m=M_DIMS, n=N_DIMS, k=K_DIMS, pa=st.sampled_from(INT8_PATTERNS),
       pw=st.sampled_from(INT8_PATTERNS), la=st.sampled_from(LAYOUTS),
       lw=st.sampled_from(LAYOUTS), seed=SEEDS)
def test_int8_matmul_is_exact(any_isa, m, n, k, pa, pw, la, lw, seed):
    rng = np.random.default_rng(seed)
    qa, qw = int8_values(rng, (m, k), pa), int8_values(rng, (n, k), pw)
    expected = qa.astype(np.int64) @ qw.T.astype(np.int64)
    a_in, w_in = relayout(qa, la), relayout(qw, lw)
    for enc in ENCODINGS:
        r64 = pyw8a8.int8_matmul(a_in, w_in, encoding=enc, out_dtype=np.int64)
        assert r64.dtype == np.int64 and r64.shape == (m, n)
        np.testing.assert_array_equal(r64, expected, err_msg=f"{any_isa} {enc}")
        r32 = pyw8a8.int8_matmul(a_in, w_in, encoding=enc)
        assert r32.dtype == np.int32 and r32.shape == (m, n)
        np.testing.assert_array_equal(r32, expected, err_msg=f"{any_isa} {enc}")
    np.testing.assert_array_equal(a_in, qa)  # inputs are never written
    np.testing.assert_array_equal(w_in, qw)


# --- matmul -----------------------------------------------------------------------


def _check_matmul(isa, x, w, xshape, dtype, layout, out_kind, rotate, block=128, seed=0):
    """matmul on ISA `isa` (and on scalar, the reference ISA) with both encodings:
    within tolerance of the float64 reference and bit-identical across ISAs and
    encodings."""
    k = xshape[-1]
    x = relayout(x.reshape(xshape).astype(dtype), layout)
    x2d = np.ascontiguousarray(x.astype(np.float32)).reshape(math.prod(xshape[:-1]), k)
    xq = x2d
    if rotate:
        from pyw8a8.rotation import rotate as _rotate
        xq = _rotate(x2d, block=block, seed=seed)
        assume(np.all(np.isfinite(xq)))
    results = {}
    quantized = {}
    for name in dict.fromkeys((isa, "scalar")):
        with pyw8a8.use_isa(name):
            for enc in ENCODINGS:
                packed = _pack_centred(w, xq, k, encoding=enc, rotate=rotate,
                                       **({"block": block, "seed": seed} if rotate else {}))
                n = packed.shape[0]
                ref, mag, (qa, sa) = reference(xq, packed)
                quantized[name] = (qa, sa)
                oshape = xshape[:-1] + (n,)
                if out_kind is None:
                    y = pyw8a8.matmul(x, packed)
                else:
                    out = relayout(np.full(oshape, np.nan, np.float32), out_kind)
                    y = pyw8a8.matmul(x, packed, out=out)
                    assert y is out
                assert y.dtype == np.float32 and y.shape == oshape
                note(f"{name} {enc}")
                assert_within_tolerance(y.reshape(ref.shape), ref, mag, 1)
                # One conversion of the exact sum and two float32 products: within three
                # roundings of the exact result itself (docs/guarantees.md).
                err = np.abs(y.reshape(ref.shape).astype(np.float64) - ref)
                assert np.all(err <= 3.001 * U * np.abs(ref) + 1e-45), f"{name} {enc}"
                results[name, enc] = y
    # Quantization is bit-identical on every ISA.
    np.testing.assert_array_equal(quantized[isa][0], quantized["scalar"][0])
    np.testing.assert_array_equal(quantized[isa][1], quantized["scalar"][1])
    # Float results: bit-identical between encodings and between ISAs (the same exact
    # sum, the same three roundings).
    base = results["scalar", "biased"]
    for (name, enc), y in results.items():
        np.testing.assert_array_equal(y, base, err_msg=f"{name} {enc} vs scalar")


@pytest.mark.exhaustive
@given(m=M_DIMS, n=N_DIMS, k=K_DIMS, lead=st.sampled_from(("2d", "3d", "1d")),
       dtype=st.sampled_from((np.float32, np.float64)), layout=st.sampled_from(LAYOUTS),
       out_kind=st.sampled_from((None, "C", "F", "negative")),
       x_kinds=st.sets(st.sampled_from(X_ROWS), min_size=1, max_size=3).map(sorted),
       w_kinds=st.sets(st.sampled_from(W_ROWS), min_size=1, max_size=3).map(sorted),
       seed=SEEDS)
def test_matmul_matches_quantized_reference(any_isa, m, n, k, lead, dtype, layout, out_kind,
                                            x_kinds, w_kinds, seed):
    rng = np.random.default_rng(seed)
    xshape = {"2d": (m, k), "3d": (2, m, k), "1d": (k,)}[lead]
    rows = int(np.prod(xshape[:-1]))
    x = float_matrix(rng, rows, k, x_kinds)
    w = float_matrix(rng, n, k, w_kinds).astype(dtype)
    _check_matmul(any_isa, x, w, xshape, dtype, layout, out_kind, rotate=False)


@pytest.mark.exhaustive
@pytest.mark.skipif(not HAS_ROTATION, reason="pyw8a8.rotation is not there yet")
@given(m=M_DIMS, n=N_DIMS, log_block=st.integers(4, 8), blocks=st.integers(1, 4),
       dtype=st.sampled_from((np.float32, np.float64)), layout=st.sampled_from(LAYOUTS),
       x_kinds=st.sets(st.sampled_from(tuple(r for r in X_ROWS if r != "huge")),
                       min_size=1, max_size=3).map(sorted),
       w_kinds=st.sets(st.sampled_from(W_ROWS), min_size=1, max_size=3).map(sorted),
       rot_seed=st.integers(0, 2**31 - 1), seed=SEEDS)
def test_rotated_matmul_matches_quantized_reference(any_isa, m, n, log_block, blocks, dtype, layout,
                                                    x_kinds, w_kinds, rot_seed, seed):
    rng = np.random.default_rng(seed)
    block = 2**log_block
    k = block * blocks
    x = float_matrix(rng, m, k, x_kinds)
    w = float_matrix(rng, n, k, w_kinds).astype(dtype)
    _check_matmul(any_isa, x, w, (m, k), dtype, layout, None, rotate=True, block=block,
                  seed=rot_seed)


# --- non-finite activations and weights ------------------------------------------


@pytest.mark.exhaustive
@given(m=st.integers(1, 9), k=st.integers(1, 300), lead=st.sampled_from(("2d", "3d")),
       dtype=st.sampled_from((np.float32, np.float64)),
       bad=st.sampled_from((np.nan, np.inf, -np.inf)), layout=st.sampled_from(LAYOUTS),
       extra_bad=st.booleans(), seed=SEEDS)
def test_non_finite_activations_raise_naming_the_row(any_isa, m, k, lead, dtype, bad, layout,
                                                     extra_bad, seed):
    rng = np.random.default_rng(seed)
    xshape = (m, k) if lead == "2d" else (2, m, k)
    rows = int(np.prod(xshape[:-1]))
    x = rng.standard_normal((rows, k))
    row = int(rng.integers(rows))
    x[row, rng.integers(k)] = bad
    if extra_bad and row + 1 < rows:  # a later bad row: the first one is reported
        x[rng.integers(row + 1, rows), rng.integers(k)] = np.nan
    x = relayout(x.reshape(xshape).astype(dtype), layout)
    w = rng.standard_normal((5, k))
    for enc in ENCODINGS:
        packed = pyw8a8.pack_weight(w, encoding=enc, rotate=False)
        out = np.full(xshape[:-1] + (5,), 7.0, np.float32)
        where = rf"\brow {row}\b"
        if lead == "3d":  # and its index in the leading dimensions
            where += rf" \(index \({row // m}, {row % m}\)\)"
        with pytest.raises(ValueError, match=rf"\bx\b.*non-finite.*{where}"):
            pyw8a8.matmul(x, packed, out=out)
        assert np.all(out == 7.0), "out was written before the error"
        with pytest.raises(ValueError, match=rf"\brow {row}\b"):
            pyw8a8.matmul_pair(x, packed, packed)
    if lead == "2d":
        with pytest.raises(ValueError, match=rf"\bx\b.*\brow {row}\b"):
            pyw8a8.quantize_per_token(x)
        # The same matrix as weights: the error names w and the row.
        with pytest.raises(ValueError, match=rf"\bw\b.*\brow {row}\b"):
            pyw8a8.pack_weight(x, rotate=False)
        with pytest.raises(ValueError, match=rf"\bw\b.*\brow {row}\b"):
            pyw8a8.quantize_per_channel(x)


# --- dtypes -----------------------------------------------------------------------

REJECTED_DTYPES = (np.int8, np.uint8, np.int32, np.int64, np.float16, np.complex64,
                   np.complex128, object, bool)


@pytest.mark.parametrize("dtype", REJECTED_DTYPES, ids=lambda d: np.dtype(d).name)
def test_float_entry_points_reject_other_dtypes(any_isa, dtype):
    x = np.ones((3, 8)).astype(dtype)
    packed = pyw8a8.pack_weight(np.ones((4, 8), np.float32), rotate=False)
    with pytest.raises(TypeError, match=r"\bx\b.*float32 or float64"):
        pyw8a8.matmul(x, packed)
    with pytest.raises(TypeError, match=r"\bx\b"):
        pyw8a8.matmul_pair(x, packed, packed)
    with pytest.raises(TypeError, match=r"\bx\b"):
        pyw8a8.quantize_per_token(x)
    with pytest.raises(TypeError, match=r"\bw\b"):
        pyw8a8.quantize_per_channel(x)
    with pytest.raises(TypeError, match=r"\bw\b"):
        pyw8a8.pack_weight(x, rotate=False)


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_float_entry_points_accept_float32_and_float64(dtype):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 40)), rng.standard_normal((5, 40))
    want = pyw8a8.matmul(x.astype(np.float32),
                         pyw8a8.pack_weight(w.astype(np.float32), rotate=False))
    got = pyw8a8.matmul(x.astype(dtype), pyw8a8.pack_weight(w.astype(dtype), rotate=False))
    # float64 operands are rounded to float32 first: the same result.
    np.testing.assert_array_equal(got, want)


def test_float64_beyond_float32_range_is_rejected_naming_the_row():
    packed = pyw8a8.pack_weight(np.ones((2, 4)), rotate=False)
    x = np.ones((3, 4))
    x[2, 1] = 1e39  # finite in float64, +Inf once rounded to float32
    with pytest.raises(ValueError, match=r"finite value .*beyond float32's range.*\brow 2\b"):
        pyw8a8.matmul(x, packed)
