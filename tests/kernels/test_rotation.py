"""fwht / rotate / unrotate, the sign hash, and the fused rotate-then-quantize path.

Across ISAs the FWHT and the rotation are compared bit for bit: every
ISA runs the same butterfly network with exact +-1 products (see _simd/fwht.h).
"""
import numpy as np
import pytest
from scipy.linalg import hadamard

import pyw8a8
from pyw8a8 import _dispatch, _kernels, _rows
from pyw8a8.quantize import quantize_rows

LOG_NS = range(17)  # n = 1 .. 2^16


@pytest.fixture
def isa(any_isa):
    """Every compiled ISA (conftest's any_isa: skipped, with the reason, where this CPU
    lacks it)."""
    return any_isa


def product(a, b):
    """a @ b in float64 without BLAS, whose threads contend with the kernels' on a busy
    machine (einsum's own loop is plenty for these sizes)."""
    return np.einsum("...i,ij->...j", a.astype(np.float64), b.astype(np.float64))


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def sylvester_columns(x, cols):
    """(x @ H)[..., cols] in float64 from H[i, j] = (-1)^popcount(i & j)."""
    i, j = np.arange(x.shape[-1])[:, None], np.asarray(cols)[None, :]
    return product(x, 1 - 2 * popcount_parity(i & j))


def popcount_parity(v):
    """1 where an element has an odd number of set bits, else 0 (numpy 1.x, which the
    wheel supports, has no bitwise_count)."""
    parity = np.zeros_like(v)
    while v.any():
        parity ^= v & 1
        v = v >> 1
    return parity


def test_popcount_formula_is_scipys_hadamard():
    n = 256
    np.testing.assert_array_equal(sylvester_columns(np.eye(n), range(n)), hadamard(n))


@pytest.mark.parametrize("log_n", LOG_NS)
def test_fwht_matches_hadamard(isa, log_n):
    n = 2**log_n
    x = np.random.default_rng(log_n).standard_normal((3, n)).astype(np.float32)
    y = pyw8a8.fwht(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    if n <= 2048:
        ref = product(x, hadamard(n))
    else:  # scipy's matrix would not fit; check a spread of columns
        cols = np.unique(np.r_[0, 1, n - 1, np.random.default_rng(1).integers(0, n, 64)])
        ref, y = sylvester_columns(x, cols), y[:, cols]
    # n log2(n) float32 additions: error below eps * log2(n) * ||x|| per element.
    tol = 2.0**-23 * max(log_n, 1) * np.linalg.norm(x, axis=1, keepdims=True)
    assert np.all(np.abs(y - ref) <= tol)


@pytest.mark.parametrize("log_n", LOG_NS)
def test_fwht_identical_on_every_isa(isa, log_n):
    n = 2**log_n
    x = np.random.default_rng(100 + log_n).standard_normal((2, n)).astype(np.float32)
    with pyw8a8.use_isa("scalar"):
        expect = pyw8a8.fwht(x)
    np.testing.assert_array_equal(bits(pyw8a8.fwht(x)), bits(expect), err_msg=isa)


def test_fwht_in_place_and_out():
    x = np.random.default_rng(2).standard_normal((4, 5, 64)).astype(np.float32)
    expect = pyw8a8.fwht(x)
    y = x.copy()
    assert pyw8a8.fwht(y, out=y) is y
    np.testing.assert_array_equal(y, expect)
    out = np.empty((64, 4, 5), np.float32).transpose(1, 2, 0)  # not C-contiguous
    assert pyw8a8.fwht(x.astype(np.float64), out=out) is out
    np.testing.assert_array_equal(out, expect)
    # H H = n I: transforming twice scales by n.
    np.testing.assert_allclose(pyw8a8.fwht(expect), 64 * x, rtol=0, atol=1e-4)


def test_fwht_errors():
    with pytest.raises(ValueError, match="power-of-two"):
        pyw8a8.fwht(np.ones((2, 12), np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        pyw8a8.fwht(np.ones(8, np.int32))
    with pytest.raises(TypeError, match="out must be a float32"):
        pyw8a8.fwht(np.ones(8), out=np.ones(8))
    with pytest.raises(ValueError, match="out has shape"):
        pyw8a8.fwht(np.ones(8), out=np.ones(16, np.float32))
    assert pyw8a8.fwht(np.ones((0, 8))).shape == (0, 8)


def block_rotation_matrix(k, block, seed):
    """The rotation as an explicit float64 (K, K) matrix: rotate(x) == x @ R.T."""
    d = _rows.sign_bits(0, k, seed)
    r = np.zeros((k, k))
    h = hadamard(block) / np.sqrt(block)
    for b in range(0, k, block):
        r[b:b + block, b:b + block] = h * (1 - 2.0 * d[b:b + block])[None, :]
    return r


@pytest.mark.parametrize("block", [16, 32, 64, 128, 256])
def test_rotate_is_the_block_matrix(isa, block):
    k, seed = 512, 7
    x = np.random.default_rng(block).standard_normal((6, k)).astype(np.float32)
    ref = x.astype(np.float64) @ block_rotation_matrix(k, block, seed).T
    np.testing.assert_allclose(pyw8a8.rotate(x, block, seed), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("block", [16, 128, 4096])
def test_rotate_identical_on_every_isa(isa, block):
    x = np.random.default_rng(3).standard_normal((5, 8192)).astype(np.float32)
    with pyw8a8.use_isa("scalar"):
        expect = pyw8a8.rotate(x, block, 11), pyw8a8.unrotate(x, block, 11)
    got = pyw8a8.rotate(x, block, 11), pyw8a8.unrotate(x, block, 11)
    for g, e in zip(got, expect):
        np.testing.assert_array_equal(bits(g), bits(e), err_msg=isa)


@pytest.mark.parametrize("block", [16, 64, 128, 4096])
def test_rotation_is_orthonormal(isa, block):
    k = 4096
    rng = np.random.default_rng(block)
    a = rng.standard_normal((8, k)).astype(np.float32)
    b = (a + rng.standard_normal((8, k))).astype(np.float32)
    ra, rb = pyw8a8.rotate(a, block, 5), pyw8a8.rotate(b, block, 5)
    exact = np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))
    rotated = np.einsum("ij,ij->i", ra.astype(np.float64), rb.astype(np.float64))
    np.testing.assert_allclose(rotated, exact, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(ra, axis=1), np.linalg.norm(a, axis=1),
                               rtol=1e-6)
    # Inverse both ways, and the inverse is the transpose: unrotate(e_i) = row i of R.
    np.testing.assert_allclose(pyw8a8.unrotate(ra, block, 5), a, rtol=0, atol=2e-6)
    np.testing.assert_allclose(pyw8a8.rotate(pyw8a8.unrotate(a, block, 5), block, 5), a,
                               rtol=0, atol=2e-6)
    rows = pyw8a8.unrotate(np.eye(64, k, dtype=np.float32), block, 5)
    np.testing.assert_allclose(rows @ rows.T, np.eye(64), atol=1e-6)


def test_rotate_shapes_and_dtypes():
    x = np.random.default_rng(4).standard_normal((2, 3, 64))
    y = pyw8a8.rotate(x, 32)
    assert y.dtype == np.float32 and y.shape == (2, 3, 64)
    np.testing.assert_array_equal(y, pyw8a8.rotate(x.astype(np.float32), 32))
    np.testing.assert_array_equal(y[1, 2], pyw8a8.rotate(x[1, 2], 32))
    np.testing.assert_array_equal(y[:, ::-1], pyw8a8.rotate(x[:, ::-1], 32))
    assert pyw8a8.rotate(np.ones((0, 32)), 16).shape == (0, 32)
    assert pyw8a8.rotate(np.ones((3, 0)), 16).shape == (3, 0)
    assert not np.array_equal(pyw8a8.rotate(x, 32, seed=1), y)


def test_rotate_errors():
    x = np.ones((2, 96), np.float32)
    with pytest.raises(ValueError, match=r"K=96 .* block=128; use block=32"):
        pyw8a8.rotate(x)
    with pytest.raises(ValueError, match=r"no block fits"):
        pyw8a8.rotate(np.ones((2, 40)), 16)
    for block in (8, 48, 8192):
        with pytest.raises(ValueError, match="power of two from 16 to 4096"):
            pyw8a8.rotate(x, block)
    for seed in (-1, 2**32):
        with pytest.raises(ValueError, match="seed"):
            pyw8a8.rotate(x, 32, seed)
    with pytest.raises(TypeError, match="ints"):
        pyw8a8.rotate(x, 32.0)
    with pytest.raises(TypeError, match="float32 or float64"):
        pyw8a8.unrotate(np.ones((2, 32), np.int8), 32)
    with pytest.raises(ValueError, match="y has K=96"):
        pyw8a8.unrotate(x, 64)


SEEDS = [0, 1, 12345, 2**32 - 1]


@pytest.mark.parametrize("seed", SEEDS)
def test_sign_hash_balanced_in_every_window(seed):
    neg = _rows.sign_bits(0, 2**20, seed).reshape(16, 65536).sum(axis=1)
    np.testing.assert_array_equal(neg, 32768)
    # The high bits of the position are mixed in: windows far away are balanced too.
    assert _rows.sign_bits(0xFFFF0000, 65536, seed).sum() == 32768


@pytest.mark.parametrize("seed", SEEDS)
def test_sign_hash_has_no_short_period(seed):
    s = _rows.sign_bits(0, 2**20, seed)
    for p in range(1, 4097):
        # A period of the whole range is a period of its prefix: check that first.
        if np.array_equal(s[:4096], s[p:p + 4096]):
            assert not np.array_equal(s[:-p], s[p:]), f"period {p}"


def test_sign_hash_looks_random():
    s0 = 1.0 - 2.0 * _rows.sign_bits(0, 2**18, 0)
    s1 = 1.0 - 2.0 * _rows.sign_bits(0, 2**18, 1)
    # Independent seeds, no lag correlation (random: about 0.002 standard deviation).
    assert abs(np.mean(s0 * s1)) < 0.01
    for lag in (1, 2, 3, 7, 8, 16, 64, 128, 256, 4096):
        assert abs(np.mean(s0[:-lag] * s0[lag:])) < 0.01, lag
    # No block of signs is close to a Walsh function (which H would map to a spike, leaving
    # an outlier unspread); random signs give about 0.45 over this many blocks.
    corr = np.abs(s0.reshape(-1, 128) @ hadamard(128)).max() / 128
    assert corr < 0.6


def test_sign_hash_same_on_every_isa(isa):
    ref = 1.0 - 2.0 * _rows.sign_bits(65536 - 37, 200001, 99).astype(np.float32)
    signs = _rows.signs(_dispatch.IsaOps(isa), 65536 - 37, 200001, 99)
    np.testing.assert_array_equal(signs, ref)


@pytest.mark.parametrize("block", [16, 32, 64, 128, 512])
@pytest.mark.parametrize("enc", [_kernels.W8_ENC_BIASED, _kernels.W8_ENC_SIGNED])
def test_fused_quantization_is_quantize_of_rotate(isa, block, enc):
    rng = np.random.default_rng(block)
    k = 1536
    x = rng.standard_normal((33, k)).astype(np.float32) * np.float32(3)
    x[:, 5] *= 50
    x[4] = 0
    x[7] = 1e-37  # below the zero-scale threshold
    kp = k + 64  # padding beyond K
    fused = quantize_rows(x, kp, enc=enc, block=block, seed=9)
    plain = quantize_rows(pyw8a8.rotate(x, block, 9), kp, enc=enc)
    for got, expect in zip(fused, plain):
        np.testing.assert_array_equal(got[:33], expect[:33])  # rows past 33 are scratch
    assert fused[1][4] == 0 and fused[1][7] == 0


def test_fused_quantization_threads_and_errors():
    x = np.random.default_rng(5).standard_normal((50, 256)).astype(np.float32)
    pyw8a8.set_num_threads(1)
    one = quantize_rows(x, 256, block=64, seed=1)
    pyw8a8.set_num_threads(2)
    two = quantize_rows(x, 256, block=64, seed=1)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a[:50], b[:50])  # rows past 50 are scratch
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[17, 100] = bad
        with pytest.raises(ValueError, match="non-finite value .* row 17"):
            quantize_rows(y, 256, block=64)
    # Finite, but sqrt(64) times the largest entry exceeds float32 (all of a block's
    # energy lands in one coefficient when x is the sign pattern).
    y = x.copy()
    y[3] = 1e38 * _rows.signs(_dispatch.IsaOps("scalar"), 0, 256, 0)
    with pytest.raises(ValueError, match="row 3 is finite but too large to rotate"):
        quantize_rows(y, 256, block=64)
    # A last partial block is zero-padded, so kp must hold K rounded up to the block.
    with pytest.raises(ValueError, match=r"block=256 it needs 256 columns, more than kp=128"):
        quantize_rows(np.ones((2, 96), np.float32), 128, block=256)


def quantized_reference(x, packed):
    """float64 product of the operands the kernel used: rotated, quantized activations."""
    xr = pyw8a8.rotate(x, packed.block, packed.seed) if packed.rotate else x
    qa, sa = pyw8a8.quantize_per_token(xr.reshape(-1, x.shape[-1]))
    qw = packed.int8()
    ref = (qa.astype(np.float64) @ qw.T.astype(np.float64)) * sa[:, None] * packed.scales
    return ref.reshape(x.shape[:-1] + (packed.shape[0],))


@pytest.mark.parametrize("encoding", ["biased", "signed"])
@pytest.mark.parametrize("block", [32, 128])
def test_matmul_with_rotated_weight(isa, encoding, block):
    rng = np.random.default_rng(block)
    x = rng.standard_normal((2, 9, 512)).astype(np.float32)
    x[..., 3] *= 30
    w = rng.standard_normal((40, 512)).astype(np.float32)
    packed = pyw8a8.pack_weight(w, encoding=encoding, block=block, seed=3)
    y = pyw8a8.matmul(x, packed)
    ref = quantized_reference(x, packed)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
    y1, y2 = pyw8a8.matmul_pair(x, packed, packed)
    np.testing.assert_array_equal(y1, y)
    np.testing.assert_array_equal(y2, y)
    # Rotation is orthonormal, so the W8A8 product still approximates x @ w.T.
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(y - exact).max() < 0.02 * np.abs(exact).max()


@pytest.mark.parametrize("k", [512, 200])  # 200: a zero-padded last block
def test_matmul_rotates_as_rotate_does(isa, k):
    """A product's rows are rotated with the weight's sign table (WeightPlan.signs): the
    same bits as pyw8a8.rotate's signs, so the product equals that of the pre-rotated rows
    with the same packed bytes declared unrotated."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((70, k)).astype(np.float32)
    x[:, 3] *= 40
    packed = pyw8a8.pack_weight(rng.standard_normal((48, k)).astype(np.float32), block=64,
                                seed=11, pad=True)
    plain = pyw8a8.PackedWeight((48, packed.rotated_k), packed.encoding, packed.panels,
                                packed.psum, packed.scales)
    np.testing.assert_array_equal(pyw8a8.matmul(x, packed),
                                  pyw8a8.matmul(pyw8a8.rotate(x, 64, 11, pad=True), plain))


def test_pack_weight_rotates_by_default():
    w = np.random.default_rng(6).standard_normal((20, 256)).astype(np.float32)
    packed = pyw8a8.pack_weight(w)
    assert (packed.rotate, packed.block, packed.seed) == (True, 128, 0)
    q, s = pyw8a8.quantize_per_channel(pyw8a8.rotate(w))
    np.testing.assert_array_equal(packed.int8(), q)
    np.testing.assert_array_equal(packed.scales, s)
    # Rounding errors (at most scale / 2, RMS scale / sqrt(12)) keep their RMS unrotated.
    rms = np.sqrt(np.mean((packed.dequantize() - w) ** 2, axis=1))
    assert np.all(rms <= 0.35 * packed.scales)
    # An explicit block that does not divide K raises, naming the padding and its switch.
    with pytest.raises(ValueError, match=r"w has K=100 .*pad=True to zero-pad the last "
                       r"block to 128 features .*rotate=False"):
        pyw8a8.pack_weight(np.ones((4, 100)), block=128)
    with pytest.raises(ValueError, match=r"w has K=96 .* use block=32 .*pad=True"):
        pyw8a8.pack_weight(np.ones((4, 96)), block=128)
    assert not pyw8a8.pack_weight(np.ones((4, 100)), rotate=False).rotate
    # The defaults pack every K (see test_padding.py).
    assert pyw8a8.pack_weight(np.ones((4, 96))).rotated_k == 128


def test_fwht_blocks_rejects_what_it_cannot_transform():
    """The compiled entry point reads raw pointers: it checks layout itself, so a wrong call
    raises instead of writing out of bounds."""
    isa = _dispatch.IsaOps(pyw8a8.isa())
    good = np.ones((4, 128), np.float32)
    fortran = np.asfortranarray(np.ones((128, 4), np.float32))
    for bad, block in [(good.astype(np.float64), 128), (fortran, 128), (good[:, ::2], 64),
                       (good, 96), (good, 0)]:
        with pytest.raises(ValueError, match="fwht_blocks"):
            _rows.fwht_blocks(isa, bad, block, 1)
    readonly = good.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="fwht_blocks"):
        _rows.fwht_blocks(isa, readonly, 128, 1)
    for nthreads in (1, 2):
        x = np.arange(512, dtype=np.float32).reshape(4, 128)
        _rows.fwht_blocks(isa, x, 128, nthreads)
        expected = np.arange(512, dtype=np.float32).reshape(4, 128) @ hadamard(128)
        np.testing.assert_array_equal(x, expected.astype(np.float32))
