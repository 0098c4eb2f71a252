"""int8_matmul equals the int64 numpy reference bit for bit on every ISA and encoding."""
import itertools

import numpy as np
import pytest

import pyw8a8

ENCODINGS = ["biased", "signed"]
SIZES = [1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 127, 128, 129, 640, 1000]


def reference(qa, qw):
    return qa.astype(np.int64) @ qw.T.astype(np.int64)


def _grid():
    """Every size in each dimension against small and odd partners, plus large mixes."""
    shapes = set()
    for s in SIZES:
        shapes.update({(s, 17, 65), (5, s, 129), (3, 16, s)})
    shapes.update(itertools.product([1, 4, 63], [15, 64, 127], [128, 1000]))
    shapes.update({(640, 129, 127), (129, 640, 64), (65, 1000, 640), (1000, 65, 129)})
    return sorted(shapes)


@pytest.fixture
def isa(any_isa):
    """Every compiled ISA (conftest's any_isa: skipped, with the reason, where this CPU
    lacks it)."""
    return any_isa


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("shape", _grid(), ids=lambda s: "x".join(map(str, s)))
def test_random_grid(isa, encoding, shape):
    if isa.startswith("scalar") and np.prod(shape) > 3_000_000:
        pytest.skip("the plain C ISAs are checked on the smaller shapes")
    m, n, k = shape
    rng = np.random.default_rng(hash(shape) % 2**32)
    qa = rng.integers(-127, 128, (m, k), dtype=np.int8)
    qw = rng.integers(-127, 128, (n, k), dtype=np.int8)
    c = pyw8a8.int8_matmul(qa, qw, encoding=encoding)
    assert c.dtype == np.int32 and c.shape == (m, n)
    np.testing.assert_array_equal(c, reference(qa, qw))


EXTREMES = {
    "all+127": lambda shape: np.full(shape, 127, np.int8),
    "all-127": lambda shape: np.full(shape, -127, np.int8),
    "alternating": lambda shape: np.where(np.indices(shape).sum(0) % 2, 127, -127)
    .astype(np.int8),
}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("a_kind", sorted(EXTREMES))
@pytest.mark.parametrize("w_kind", sorted(EXTREMES))
@pytest.mark.parametrize("shape", [(7, 33, 1000), (1, 16, 4096), (13, 5, 129)])
def test_extreme_operands(isa, encoding, a_kind, w_kind, shape):
    m, n, k = shape
    qa, qw = EXTREMES[a_kind]((m, k)), EXTREMES[w_kind]((n, k))
    np.testing.assert_array_equal(pyw8a8.int8_matmul(qa, qw, encoding=encoding),
                                  reference(qa, qw))


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("kc", [64, 128, 192])
def test_many_k_ranges(isa, encoding, kc):
    """Several K-ranges: the compensation and the int64 accumulation per range."""
    rng = np.random.default_rng(kc)
    qa = rng.integers(-127, 128, (9, 1000), dtype=np.int8)
    qw = rng.integers(-127, 128, (40, 1000), dtype=np.int8)
    np.testing.assert_array_equal(
        pyw8a8.int8_matmul(qa, qw, encoding=encoding, _kc=kc), reference(qa, qw))


def test_isas_agree(isa):
    rng = np.random.default_rng(3)
    qa = rng.integers(-127, 128, (37, 300), dtype=np.int8)
    qw = rng.integers(-127, 128, (70, 300), dtype=np.int8)
    with pyw8a8.use_isa("scalar"):
        expect = pyw8a8.int8_matmul(qa, qw)
    np.testing.assert_array_equal(pyw8a8.int8_matmul(qa, qw), expect)


def test_int64_output_and_overflow():
    k = 140_000  # 127 * 127 * k > 2**31
    qa = np.full((1, k), 127, np.int8)
    qw = np.full((2, k), 127, np.int8)
    with pytest.raises(OverflowError, match="int64"):
        pyw8a8.int8_matmul(qa, qw)
    c = pyw8a8.int8_matmul(qa, qw, out_dtype=np.int64)
    assert c.dtype == np.int64
    np.testing.assert_array_equal(c, np.full((1, 2), 127 * 127 * k, np.int64))


def test_empty_dimensions():
    for m, n, k in [(0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0)]:
        c = pyw8a8.int8_matmul(np.zeros((m, k), np.int8), np.zeros((n, k), np.int8))
        assert c.shape == (m, n) and c.dtype == np.int32
        assert not c.any()


def test_memory_orders():
    rng = np.random.default_rng(5)
    qa = rng.integers(-127, 128, (40, 70), dtype=np.int8)
    qw = rng.integers(-127, 128, (30, 70), dtype=np.int8)
    expect = reference(qa, qw)
    np.testing.assert_array_equal(
        pyw8a8.int8_matmul(np.asfortranarray(qa), np.asfortranarray(qw)), expect)
    np.testing.assert_array_equal(
        pyw8a8.int8_matmul(qa[::-1], qw[:, ::-1][:, ::-1]), expect[::-1])


@pytest.mark.parametrize("bad, match", [
    (lambda a, w: (a.astype(np.int16), w), "qa must be an int8"),
    (lambda a, w: (a, w.astype(np.uint8)), "qw must be an int8"),
    (lambda a, w: (a[0], w), "qa must be 2-D"),
    (lambda a, w: (a, w[:, :-1]), "differ in K"),
])
def test_bad_operands(bad, match):
    a = np.ones((2, 8), np.int8)
    w = np.ones((3, 8), np.int8)
    qa, qw = bad(a, w)
    with pytest.raises((TypeError, ValueError), match=match):
        pyw8a8.int8_matmul(qa, qw)


def test_minus_128_rejected():
    a = np.ones((2, 8), np.int8)
    a[1, 3] = -128
    with pytest.raises(ValueError, match="qa holds -128"):
        pyw8a8.int8_matmul(a, np.ones((3, 8), np.int8))
