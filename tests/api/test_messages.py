"""Error messages that name what the user passed: rows of the whole dask array, float64
values beyond float32's range, byte orders, unrotate's options and matmul's out_dtype
(hostile input)."""
import re
import sys

import numpy as np
import pytest

import pyw8a8

F32_MAX = r"3\.4028235e\+38"


@pytest.fixture(scope="module")
def packed():
    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    return pyw8a8.pack_weight(w)


def activations(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def in_process_error(x, packed):
    with pytest.raises(ValueError) as info:
        pyw8a8.matmul(x, packed)
    return str(info.value)


# --- pyw8a8.dask: rows of the whole array, not of the chunk ----------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dask_names_the_row_in_the_whole_array(packed, dtype):
    da = pytest.importorskip("dask.array")
    import pyw8a8.dask
    xn = activations((32, 64)).astype(dtype)
    xn[21, 5] = np.nan  # row 5 of the third chunk
    y = pyw8a8.dask.matmul(da.from_array(xn, chunks=(8, 64)), packed)
    with pytest.raises(ValueError, match=r"x has a non-finite value \(NaN or Inf\) in "
                       r"row 21;") as info:
        y.compute(scheduler="sync")
    assert info.value.__context__ is None or info.value.__suppress_context__
    assert str(info.value) == in_process_error(xn, packed)


def test_dask_names_the_row_of_chunks_along_several_dimensions(packed):
    da = pytest.importorskip("dask.array")
    import pyw8a8.dask
    xn = activations((4, 6, 64)).astype(np.float64)
    xn[3, 4, 1] = 1e300  # in the chunk (1, 1): its local row (1, 1) is row 4 of it
    x = da.from_array(xn, chunks=(2, 3, 64))
    with pytest.raises(ValueError, match=r"row 22 \(index \(3, 4\)\)") as info:
        pyw8a8.dask.matmul(x, packed).compute(scheduler="sync")
    assert str(info.value) == in_process_error(xn, packed)
    # Too large to rotate (finite): the same row numbering.
    xn = np.ones((4, 6, 64), np.float32)
    xn[2, 5] = 3.4e38
    x = da.from_array(xn, chunks=(2, 3, 64))
    with pytest.raises(ValueError, match=r"x row 17 is finite but too large to rotate"):
        pyw8a8.dask.matmul(x, packed).compute(scheduler="sync")


def test_dask_accepts_either_byte_order(packed):
    da = pytest.importorskip("dask.array")
    import pyw8a8.dask
    xn = activations((16, 64))
    y = pyw8a8.dask.matmul(da.from_array(xn.astype(">f4"), chunks=(8, 64)), packed)
    np.testing.assert_array_equal(y.compute(scheduler="sync").view(np.uint32),
                                  pyw8a8.matmul(xn, packed).view(np.uint32))


def test_dask_names_an_inconsistent_packed_weight():
    pytest.importorskip("dask.array")
    import pyw8a8.dask
    broken = pyw8a8.pack_weight(np.ones((8, 64)))
    broken.scales = broken.scales[:-1]
    with pytest.raises(ValueError, match=r"^w is not a consistent PackedWeight: packed "
                       "weight"):
        pyw8a8.dask.pack_weight(broken)
    for call in (pyw8a8.dask.SharedWeight,
                 lambda p: pyw8a8.dask.matmul(pyw8a8.dask.da.ones((2, 64)), p)):
        with pytest.raises(ValueError, match=r"^packed is not a consistent PackedWeight: "
                           "packed weight"):
            call(broken)


# --- float64 beyond float32's range -----------------------------------------------------


def test_float64_beyond_float32_range_is_not_called_nan(packed):
    x = activations((3, 2, 64)).astype(np.float64)
    x[1, 1, 7] = -1e300
    pattern = (r"^x has a finite value \(-1e\+300\) beyond float32's range \(max "
               rf"{F32_MAX}\) in row 3 \(index \(1, 1\)\)")
    with pytest.raises(ValueError, match=pattern):
        pyw8a8.matmul(x, packed)
    with pytest.raises(ValueError, match=r"^x has .*beyond float32's range .* in row 3;"):
        pyw8a8.quantize_per_token(x.reshape(6, 64))
    w = np.ones((5, 64))
    w[4, 0] = 1e39
    with pytest.raises(ValueError, match=rf"^w has a finite value \(1e\+39\) beyond "
                       rf"float32's range \(max {F32_MAX}\) in row 4;"):
        pyw8a8.pack_weight(w)
    with pytest.raises(ValueError, match=r"^y has .*beyond float32's range"):
        pyw8a8.unrotate(w, 64)
    # Inf and NaN are still reported as such, and a value that rounds to float32's max
    # is not an overflow.
    w[4, 0] = np.inf
    with pytest.raises(ValueError, match=r"w has a non-finite value \(NaN or Inf\) in "
                       r"row 4;"):
        pyw8a8.pack_weight(w)
    w[4, 0] = float(np.finfo(np.float32).max) * (1 + 2**-30)
    assert pyw8a8.pack_weight(w, rotate=False).shape == (5, 64)


# --- byte order -------------------------------------------------------------------------


def test_any_byte_order_of_float_inputs(packed):
    x = activations((5, 64))
    want = pyw8a8.matmul(x, packed).view(np.uint32)
    w = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    for order in (">", "<"):
        for dtype in ("f4", "f8"):
            x_other = x.astype(order + dtype)
            np.testing.assert_array_equal(pyw8a8.matmul(x_other, packed).view(np.uint32),
                                          want)
            np.testing.assert_array_equal(pyw8a8.rotate(x_other, 64),
                                          pyw8a8.rotate(x, 64))
        a, b = pyw8a8.pack_weight(w.astype(order + "f4")), pyw8a8.pack_weight(w)
        for name in ("panels", "psum", "scales"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    # int8 has no byte order: '>i1' is plain int8.
    qa, qw = pyw8a8.quantize_per_token(x)[0], pyw8a8.quantize_per_channel(w)[0]
    assert np.dtype(">i1") == np.int8
    np.testing.assert_array_equal(pyw8a8.int8_matmul(qa.astype(">i1"), qw.astype("<i1")),
                                  pyw8a8.int8_matmul(qa, qw))
    with pytest.raises(TypeError, match=r"x must be a float32 or float64 array, got "
                       r"dtype >f2"):
        pyw8a8.matmul(x.astype(">f2"), packed)


# --- unrotate's options -----------------------------------------------------------------


def test_unrotate_message_offers_what_unrotate_has():
    y = np.ones((2, 96), np.float32)
    with pytest.raises(ValueError, match=r"y has K=96 features, not a multiple of "
                       r"block=64; unrotate inverts whole blocks .* pass the whole output "
                       r"of rotate\(x, 64, seed, pad=True\) \(128 features") as info:
        pyw8a8.unrotate(y, 64)
    # Neither a pad switch nor another block: neither would invert the rotation.
    assert "pad=True to" not in str(info.value) and "use block" not in str(info.value)
    # What it says works: the whole padded rotation inverts, its first K are x.
    x = activations((2, 96))
    back = pyw8a8.unrotate(pyw8a8.rotate(x, 64, 3, pad=True), 64, 3)
    np.testing.assert_allclose(back[:, :96], x, rtol=0, atol=1e-5)
    np.testing.assert_allclose(back[:, 96:], 0, rtol=0, atol=1e-5)
    # rotate offers its pad switch, not pack_weight's rotate=False.
    with pytest.raises(ValueError, match=r"use block=32 .*, or pass pad=True to zero-pad "
                       r"the last block to 128 features$"):
        pyw8a8.rotate(y, 64)


# --- matmul's out_dtype ----------------------------------------------------------------


def test_bfloat16_by_name_without_ml_dtypes_names_the_extra(packed, monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now fails
    with pytest.raises(ImportError, match=r'out_dtype="bfloat16" needs ml_dtypes: pip '
                       r'install "pyw8a8\[bf16\]"'):
        pyw8a8.matmul(activations((2, 64)), packed, out_dtype="bfloat16")


@pytest.mark.parametrize("out_dtype", ["float16", "bogus", np.int32, 3])
def test_an_unsupported_out_dtype_is_named(packed, out_dtype):
    with pytest.raises(TypeError, match=r"out_dtype must be float32 or bfloat16 .*, got "
                       + re.escape(repr(out_dtype))):
        pyw8a8.matmul(activations((2, 64)), packed, out_dtype=out_dtype)
