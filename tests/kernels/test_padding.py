"""Every K with the defaults: the zero-padded last rotation block (issue 14).

A rotation block that does not divide K is zero-padded: the weight at pack time, the
activations inside the fused quantizer. Checked for every K from 1 to 300 and a few large
odd ones, on every ISA this CPU runs, with rotation on and off, against the float64
product of the rotated quantized operands.
"""
import tracemalloc

import numpy as np
import pytest
from scipy.linalg import hadamard

import pyw8a8
from pyw8a8 import _kernels, _rows
from pyw8a8.quantize import quantize_rows
from pyw8a8.rotation import auto_block, rotated_length

KS = list(range(1, 301)) + [1001, 2049, 4097, 6911]


def product(a, b):
    """a @ b in float64 without BLAS threads (see test_rotation.product)."""
    return np.einsum("...i,ij->...j", a.astype(np.float64), b.astype(np.float64))


def padded_rotation_matrix(k, block, seed):
    """(Kr, K) float64 matrix of the zero-padded block rotation: the rotation matrix of
    Kr = K rounded up to block features, restricted to the first K inputs."""
    kr = rotated_length(k, block)
    d = _rows.sign_bits(0, kr, seed).astype(np.float64)
    r = np.zeros((kr, kr))
    h = hadamard(block) / np.sqrt(block)
    for b in range(0, kr, block):
        r[b:b + block, b:b + block] = h * (1 - 2.0 * d[b:b + block])[None, :]
    return r[:, :k]


def operands(k, rng):
    m, n = 1 + k % 5, 1 + k % 19
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, rng.integers(k)] *= 20  # an outlier feature
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32) + np.float32(0.01)
    return x, w


def quantized_reference(x, packed):
    """float64 product of the operands the kernel used: x rotated (zero-padded) and
    quantized per token, the packed weight's int8 rows and scales."""
    if packed.rotate:
        x = pyw8a8.rotate(x, packed.block, packed.seed, pad=True)
    qa, sa = pyw8a8.quantize_per_token(x)
    qw = packed.int8()
    return product(qa, qw.T) * sa[:, None].astype(np.float64) * packed.scales


@pytest.mark.parametrize("rotate", [True, False], ids=["rotated", "plain"])
def test_every_k_matches_quantized_reference(any_isa, rotate):
    rng = np.random.default_rng(14)
    for k in KS:
        x, w = operands(k, rng)
        encoding = ("biased", "signed")[k % 2]
        packed = pyw8a8.pack_weight(w, encoding=encoding, rotate=rotate, seed=k)
        kr = rotated_length(k, auto_block(k)) if rotate else k
        assert packed.shape == w.shape and packed.rotated_k == kr, k
        assert packed.kp % 64 == 0 and packed.kp >= kr, k
        qw = packed.int8()
        assert qw.shape == (w.shape[0], kr), k
        if rotate:  # the weight's rows are those of the zero-padded rotation
            wr = pyw8a8.rotate(np.pad(w, ((0, 0), (0, kr - k))), packed.block, k)
            q, s = pyw8a8.quantize_per_channel(wr)
            np.testing.assert_array_equal(qw, q, err_msg=f"K={k}")
            np.testing.assert_array_equal(packed.scales, s, err_msg=f"K={k}")
        y = pyw8a8.matmul(x, packed)
        ref = quantized_reference(x, packed)
        rms = np.sqrt(np.mean(ref**2))
        err = np.abs(y - ref).max() / rms
        assert err <= 1e-6, f"{any_isa} K={k} rotate={rotate}: {err:.2e}"
        # Zeros add nothing: the W8A8 product still approximates x @ w.T (RMS error
        # measured: at most 3.2% rotated, 7.1% plain with this outlier feature).
        exact = product(x, w.T)
        assert np.sqrt(np.mean((y - exact) ** 2)) <= 0.1 * np.sqrt(np.mean(exact**2)), k


def test_padded_rotation_is_the_padded_matrix(any_isa):
    """rotate(pad=True) against float64 matrices, and equal to rotating x with zeros
    appended; the fused quantizer quantizes exactly those floats."""
    rng = np.random.default_rng(3)
    for k in list(range(1, 300, 7)) + [1001]:
        for block in sorted({16, 64, auto_block(k)}):
            x = rng.standard_normal((3, k)).astype(np.float32)
            kr = rotated_length(k, block)
            y = pyw8a8.rotate(x, block, 5, pad=True)
            assert y.shape == (3, kr)
            np.testing.assert_allclose(y, product(x, padded_rotation_matrix(k, block, 5).T),
                                       rtol=0, atol=2e-5)
            np.testing.assert_array_equal(
                y, pyw8a8.rotate(np.pad(x, ((0, 0), (0, kr - k))), block, 5))
            # The inverse of the padded rotation gives back x, then zeros.
            back = pyw8a8.unrotate(y, block, 5)
            np.testing.assert_allclose(back[:, :k], x, rtol=0, atol=2e-5)
            np.testing.assert_allclose(back[:, k:], 0, rtol=0, atol=2e-5)
            kp = -(-kr // 64) * 64
            for enc in (_kernels.W8_ENC_BIASED, _kernels.W8_ENC_SIGNED):
                fused = quantize_rows(x, kp, enc=enc, block=block, seed=5)
                plain = quantize_rows(y, kp, enc=enc)
                for a, b in zip(fused, plain):  # q's rows past 3 are scratch
                    np.testing.assert_array_equal(a[:3], b[:3],
                                                  err_msg=f"K={k} block={block}")


def test_auto_block_and_repr():
    assert [auto_block(k) for k in (1, 16, 17, 33, 64, 65, 127, 128, 129, 5000)] == \
        [16, 16, 32, 64, 64, 128, 128, 128, 128, 128]
    w = np.random.default_rng(1).standard_normal((4, 100)).astype(np.float32)
    p = pyw8a8.pack_weight(w)
    assert (p.rotate, p.block, p.rotated_k, p.kp) == (True, 128, 128, 128)
    assert "block=128" in repr(p) and "padded K=100 to 128" in repr(p)
    p = pyw8a8.pack_weight(w[:, :64])
    assert (p.block, p.rotated_k) == (64, 64) and "padded" not in repr(p)
    p = pyw8a8.pack_weight(np.ones((4, 256), np.float32))
    assert (p.block, p.rotated_k) == (128, 256) and "padded" not in repr(p)
    # An explicit block pads only when asked to.
    p = pyw8a8.pack_weight(w, block=32, pad=True)
    assert (p.block, p.rotated_k, p.kp) == (32, 128, 128)
    p = pyw8a8.pack_weight(np.ones((2, 130), np.float32), block=256, pad=True)
    assert (p.rotated_k, p.kp) == (256, 256)
    for bad in ("big", ""):
        with pytest.raises(ValueError, match="block must be a power of two or 'auto'"):
            pyw8a8.pack_weight(w, block=bad)
    with pytest.raises(TypeError, match="pad must be"):
        pyw8a8.pack_weight(w, pad="yes")
    with pytest.raises(ValueError, match=r"K=100 .*block=64; .*pad=True"):
        pyw8a8.pack_weight(w, block=64)
    with pytest.raises(ValueError, match=r"K=100 .*block=128; .*pad=True"):
        pyw8a8.pack_weight(w, block="auto", pad=False)
    with pytest.raises(ValueError, match=r"x has K=100 .*pad=True"):
        pyw8a8.rotate(w, 128)


def test_dequantize_and_saved_format():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((20, 300)).astype(np.float32)
    p = pyw8a8.pack_weight(w)
    assert p.rotated_k == 384
    d = p.dequantize()
    assert d.shape == w.shape and d.flags.c_contiguous
    rms = np.sqrt(np.mean((d - w) ** 2, axis=1))
    assert np.all(rms <= 0.35 * p.scales)
    # Padded weights are saved as format 2; unpadded ones stay format 1.
    saved = p.to_dict()
    assert int(saved["format_version"]) == 2
    loaded = pyw8a8.PackedWeight.from_dict(saved)
    np.testing.assert_array_equal(loaded.panels, p.panels)
    assert loaded.rotated_k == 384
    x = rng.standard_normal((3, 300)).astype(np.float32)
    np.testing.assert_array_equal(pyw8a8.matmul(x, loaded), pyw8a8.matmul(x, p))
    assert int(pyw8a8.pack_weight(w[:, :256]).to_dict()["format_version"]) == 1
    with pytest.raises(ValueError, match="packed weight rotation: .*K=300"):
        pyw8a8.PackedWeight.from_dict(dict(saved, format_version=np.array(1)))


def test_padding_does_not_copy_the_activations():
    """Only the per-thread scratch row holds the padding: a product allocates its output
    and the quantized activations (1 byte per padded feature), never a float copy of x."""
    rng = np.random.default_rng(4)
    m, k, n = 2048, 1000, 8
    x = rng.standard_normal((m, k)).astype(np.float32)
    packed = pyw8a8.pack_weight(rng.standard_normal((n, k)).astype(np.float32))
    assert packed.rotated_k == 1024
    pyw8a8.matmul(x, packed)  # warms up the thread's scratch
    tracemalloc.start()
    try:
        pyw8a8.matmul(x, packed)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < m * n * 4 + x.nbytes // 4, peak
