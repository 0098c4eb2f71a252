"""Misuse and hostile inputs: every one is a clear exception naming the argument, nothing is
written, nothing crashes.  Also int32 overflow at huge K, damaged saved weights and bad
instruction-set overrides (in a subprocess, so a crash would show as a signal)."""
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import pyw8a8
from pyw8a8 import PackedWeight

ENCODINGS = ("biased", "signed")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def weight():
    return np.random.default_rng(0).standard_normal((5, 70)).astype(np.float32)


# --- wrong K, wrong weight objects ------------------------------------------------


def test_wrong_k_is_rejected(weight, any_isa):
    for enc in ENCODINGS:
        packed = pyw8a8.pack_weight(weight, encoding=enc, rotate=False)
        for x in (np.ones((3, 71)), np.ones((3, 69)), np.ones(64), np.ones((2, 3, 0))):
            with pytest.raises(ValueError, match=r"\bx\b.*K=70"):
                pyw8a8.matmul(x, packed)
            with pytest.raises(ValueError, match=r"\bx\b.*K=70"):
                pyw8a8.matmul_pair(x, packed, packed)
        other = pyw8a8.pack_weight(np.ones((5, 64)), encoding=enc, rotate=False)
        with pytest.raises(ValueError, match="packed1 and packed2 differ in K"):
            pyw8a8.matmul_pair(np.ones((3, 70)), packed, other)


def test_scalar_activation_is_rejected(weight):
    with pytest.raises(ValueError, match=r"\bx\b"):
        pyw8a8.matmul(np.float32(1), pyw8a8.pack_weight(weight, rotate=False))


@pytest.mark.parametrize("bogus", [None, 3, "w", np.ones((5, 70), np.float32),
                                   np.ones((5, 70), np.int8)], ids=lambda b: type(b).__name__)
def test_non_packed_weight_is_rejected(weight, bogus):
    packed = pyw8a8.pack_weight(weight, rotate=False)
    x = np.ones((2, 70), np.float32)
    with pytest.raises(TypeError, match=r"\bpacked\b.*PackedWeight"):
        pyw8a8.matmul(x, bogus)
    with pytest.raises(TypeError, match=r"\bpacked1\b"):
        pyw8a8.matmul_pair(x, bogus, packed)
    with pytest.raises(TypeError, match=r"\bpacked2\b"):
        pyw8a8.matmul_pair(x, packed, bogus)


def test_saved_dict_is_not_a_weight(weight):
    with pytest.raises(TypeError, match=r"\bpacked\b.*dict"):
        pyw8a8.matmul(np.ones((2, 70)), pyw8a8.pack_weight(weight, rotate=False).to_dict())


def test_inconsistent_packed_weight_never_reaches_the_kernels(weight):
    """A hand-built or altered PackedWeight whose arrays do not match its shape would make
    the kernels read out of bounds; it is rejected first."""
    packed = pyw8a8.pack_weight(weight, rotate=False)
    x = np.ones((2, 4096), np.float32)
    liar = PackedWeight((4096, 4096), "biased", packed.panels, packed.psum, packed.scales)
    with pytest.raises(ValueError, match=r"\bpacked\b.*'panels'"):
        pyw8a8.matmul(x, liar)
    for attr, value in [("panels", packed.panels[:, :-1]), ("scales", packed.scales[:-1]),
                        ("scales", packed.scales.astype(np.float64)),
                        ("panels", np.asfortranarray(packed.panels)), ("psum", None),
                        ("encoding", "nope"), ("shape", (5, 7000))]:
        bad = pyw8a8.pack_weight(weight, rotate=False)
        setattr(bad, attr, value)
        with pytest.raises(ValueError, match=r"\bpacked\b"):
            pyw8a8.matmul(np.ones((2, bad.shape[1]), np.float32), bad)


# --- out= ---------------------------------------------------------------------------


def test_bad_out_is_rejected_and_untouched(weight, any_isa):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 70)).astype(np.float32)
    x_copy = x.copy()
    for enc in ENCODINGS:
        packed = pyw8a8.pack_weight(weight, encoding=enc, rotate=False)
        cases = [
            (np.full((3, 4), 7, np.float32), ValueError, r"\bout\b.*shape"),
            (np.full((5, 3), 7, np.float32), ValueError, r"\bout\b.*shape"),
            (np.full((1, 3, 5), 7, np.float32), ValueError, r"\bout\b.*shape"),
            (np.full((3, 5), 7, np.float64), TypeError, r"\bout\b.*dtype"),
            (np.full((3, 5), 7, np.int32), TypeError, r"\bout\b.*dtype"),
            (np.full((3, 5), 7, np.float16), TypeError, r"\bout\b.*dtype"),
        ]
        readonly = np.full((3, 5), 7, np.float32)
        readonly.flags.writeable = False
        cases.append((readonly, ValueError, r"\bout\b.*read-only"))
        for out, exc, pattern in cases:
            before = out.copy()
            with pytest.raises(exc, match=pattern):
                pyw8a8.matmul(x, packed, out=out)
            np.testing.assert_array_equal(out, before)
        with pytest.raises(TypeError, match=r"\bout\b"):
            pyw8a8.matmul(x, packed, out=[[0.0] * 5] * 3)
        with pytest.raises(TypeError, match=r"\bout_dtype\b"):
            pyw8a8.matmul(x, packed, out=np.zeros((3, 5), np.float32), out_dtype=np.float64)
        np.testing.assert_array_equal(x, x_copy)


def test_out_overlapping_the_input_is_rejected(any_isa):
    rng = np.random.default_rng(3)
    for enc in ENCODINGS:
        packed = pyw8a8.pack_weight(rng.standard_normal((8, 8)), encoding=enc, rotate=False)
        buf = rng.standard_normal(64).astype(np.float32)
        rows = buf.reshape(8, 8)
        wide = np.zeros(32)  # float64 activations whose bytes a float32 out overlaps
        views = [
            (rows, rows),                                        # out is x
            (buf[:32].reshape(4, 8), buf[24:56].reshape(4, 8)),  # partial overlap
            (rows[:4], rows[3::-1]),                             # reversed rows
            (rows[::2], rows[::2]),                              # same strided view
            (wide.reshape(4, 8), wide.view(np.float32)[:32].reshape(4, 8)),
        ]
        for x, out in views:
            assert np.shares_memory(x, out)
            saved, wide_saved = buf.copy(), wide.copy()
            with pytest.raises(ValueError, match=r"\bout\b.*overlaps.*\bx\b"):
                pyw8a8.matmul(x, packed, out=out)
            np.testing.assert_array_equal(buf, saved)
            np.testing.assert_array_equal(wide, wide_saved)


# --- int8_matmul ------------------------------------------------------------------


def test_int8_matmul_misuse(any_isa):
    a = np.ones((3, 10), np.int8)
    w = np.ones((4, 10), np.int8)
    a_saved, w_saved = a.copy(), w.copy()
    for enc in ENCODINGS:
        for bad_a in (np.full((3, 10), -128, np.int8),):
            with pytest.raises(ValueError, match=r"\bqa\b.*-128"):
                pyw8a8.int8_matmul(bad_a, w, encoding=enc)
        bad_w = w.copy()
        bad_w[3, 9] = -128
        with pytest.raises(ValueError, match=r"\bqw\b.*-128"):
            pyw8a8.int8_matmul(a, bad_w, encoding=enc)
        for dtype in (np.uint8, np.int16, np.int32, np.float32, np.float64, object, bool):
            with pytest.raises(TypeError, match=r"\bqa\b.*int8"):
                pyw8a8.int8_matmul(a.astype(dtype), w, encoding=enc)
            with pytest.raises(TypeError, match=r"\bqw\b.*int8"):
                pyw8a8.int8_matmul(a, w.astype(dtype), encoding=enc)
        with pytest.raises(ValueError, match=r"\bqa\b.*\bqw\b.*differ in K"):
            pyw8a8.int8_matmul(a, np.ones((4, 11), np.int8), encoding=enc)
        with pytest.raises(ValueError, match=r"\bqa\b.*2-D"):
            pyw8a8.int8_matmul(a[0], w, encoding=enc)
        with pytest.raises(ValueError, match=r"\bqw\b.*2-D"):
            pyw8a8.int8_matmul(a, w[None], encoding=enc)
        for out_dtype in (np.float32, np.int16, np.uint32, object):
            with pytest.raises(TypeError, match=r"\bout_dtype\b"):
                pyw8a8.int8_matmul(a, w, encoding=enc, out_dtype=out_dtype)
    with pytest.raises(ValueError, match=r"\bencoding\b"):
        pyw8a8.int8_matmul(a, w, encoding="unsigned")
    np.testing.assert_array_equal(a, a_saved)
    np.testing.assert_array_equal(w, w_saved)


# --- int32 overflow at huge K -----------------------------------------------------


@pytest.mark.parametrize("k", [2**17, 2**20])
@pytest.mark.parametrize("sign", [1, -1], ids=["+127x+127", "-127x+127"])
def test_int8_matmul_at_huge_k(k, sign, any_isa):
    a = np.full((2, k), 127 * sign, np.int8)
    w = np.full((1, k), 127, np.int8)
    exact = sign * 127 * 127 * k
    fits = -2**31 <= exact <= 2**31 - 1
    assert fits == (k == 2**17)  # 2^17 fits int32 (2.11e9), 2^20 does not
    for enc in ENCODINGS:
        r64 = pyw8a8.int8_matmul(a, w, encoding=enc, out_dtype=np.int64)
        assert r64.dtype == np.int64 and np.all(r64 == exact), (any_isa, enc)
        if fits:
            r32 = pyw8a8.int8_matmul(a, w, encoding=enc)
            assert r32.dtype == np.int32 and np.all(r32 == exact), (any_isa, enc)
        else:
            with pytest.raises(OverflowError, match=r"int32.*out_dtype=numpy\.int64"):
                pyw8a8.int8_matmul(a, w, encoding=enc)


@pytest.mark.parametrize("k", [2**17, 2**20])
def test_matmul_at_huge_k(k, any_isa):
    rng = np.random.default_rng(k)
    x = np.ones((2, k), np.float32)
    x[1] = -1.0                     # rows quantize to all +127 / all -127
    w = np.ones((2, k), np.float32)
    w[1, ::3] = -0.5                # a second channel with mixed values
    for enc in ENCODINGS:
        packed = pyw8a8.pack_weight(w, encoding=enc, rotate=False)
        qa, sa = pyw8a8.quantize_per_token(x)
        ref = (qa.astype(np.int64) @ packed.int8().T.astype(np.int64)) * \
            sa[:, None].astype(np.float64) * packed.scales[None, :].astype(np.float64)
        y = pyw8a8.matmul(x, packed)
        err = np.max(np.abs(y - ref)) / np.sqrt(np.mean(ref**2))
        assert err <= 1e-6, (any_isa, enc, err)
        np.testing.assert_allclose(y[:, 0], [k, -k], rtol=1e-6)
    # A random one too: many K-ranges with cancellation.
    x = rng.standard_normal((1, k)).astype(np.float32)
    packed = pyw8a8.pack_weight(rng.standard_normal((2, k)), rotate=False)
    qa, sa = pyw8a8.quantize_per_token(x)
    ref = (qa.astype(np.int64) @ packed.int8().T.astype(np.int64)) * \
        sa[:, None].astype(np.float64) * packed.scales[None, :].astype(np.float64)
    y = pyw8a8.matmul(x, packed)
    assert np.max(np.abs(y - ref)) <= 1e-6 * np.sqrt(np.mean(ref**2)), any_isa


# --- saved weights ----------------------------------------------------------------


def _save(packed, path):
    np.savez(path, **packed.to_dict())
    return path


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_saved_weight_round_trip(tmp_path, weight, encoding, any_isa):
    packed = pyw8a8.pack_weight(weight, encoding=encoding, rotate=False)
    path = _save(packed, tmp_path / "w.npz")
    with np.load(path) as f:
        loaded = PackedWeight.from_dict(f)
    x = np.random.default_rng(4).standard_normal((3, 70))
    np.testing.assert_array_equal(pyw8a8.matmul(x, loaded), pyw8a8.matmul(x, packed))


def test_truncated_or_damaged_file_gives_a_clear_error(tmp_path, weight):
    packed = pyw8a8.pack_weight(weight, encoding="signed", rotate=False)
    data = _save(packed, tmp_path / "w.npz").read_bytes()
    cuts = sorted({0, 1, 4, 22, 100, len(data) // 3, len(data) // 2, len(data) - 22,
                   len(data) - 1} | set(range(0, len(data), 97)))
    flips = range(0, len(data), 61)
    damaged = [data[:c] for c in cuts] + \
        [data[:p] + bytes([data[p] ^ 0xFF]) + data[p + 1:] for p in flips]
    path = tmp_path / "bad.npz"
    for blob in damaged:
        path.write_bytes(blob)
        try:
            f = np.load(path)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile):
            continue  # numpy itself refuses the file: a clear error
        with f:
            try:
                loaded = PackedWeight.from_dict(f)
            except ValueError as exc:
                assert "packed weight" in str(exc)
                continue
        # A flip that left the file valid (e.g. in a zip comment field): it must still
        # be the same weight, or at least a consistent one.
        y = pyw8a8.matmul(np.ones((1, 70)), loaded)
        assert y.shape == (1, 5)


def _corruptions(d):
    """(description, dict) pairs of damaged to_dict() contents."""
    out = []

    def variant(desc, **changes):
        e = dict(d)
        for key, value in changes.items():
            if value is None:
                del e[key]
            else:
                e[key] = value
        out.append((desc, e))

    for key in d:
        variant(f"missing {key}", **{key: None})
    variant("format 3", format_version=np.array(3))
    variant("shape 3 values", shape=np.array([5, 70, 1]))
    variant("shape wrong K", shape=np.array([5, 700]))
    variant("shape wrong N", shape=np.array([17, 70]))
    variant("negative shape", shape=np.array([-5, 70]))
    variant("encoding 7", encoding=np.array(7))
    variant("encoding -1", encoding=np.array(-1))
    variant("encoding as text", encoding=np.array("signed"))
    variant("rotation block 0", rotation=np.array([1, 0, 0]))
    variant("rotation block 3", rotation=np.array([1, 3, 0]))
    variant("rotation block not dividing K", rotation=np.array([1, 64, 0]))
    variant("rotation seed -1", rotation=np.array([1, 16, -1]))
    variant("rotation 2 values", rotation=np.array([1, 128]))
    variant("panels truncated", panels=d["panels"][:, :-1])
    variant("panels flat", panels=d["panels"].reshape(-1))
    variant("panels int8", panels=d["panels"].view(np.int8))
    variant("panels list", panels=d["panels"].tolist())
    variant("psum float", psum=d["psum"].astype(np.float32))
    variant("scales float64", scales=d["scales"].astype(np.float64))
    variant("scales short", scales=d["scales"][:-1])
    for bad in (np.nan, np.inf, -1.0):
        s = d["scales"].copy()
        s[2] = bad
        variant(f"scales {bad}", scales=s)
    encoding = ("biased", "signed")[int(d["encoding"])]
    p = d["panels"].copy()
    p[0, 0, 0] = 0x00 if encoding == "biased" else 0x80  # the byte of q = -128
    variant("panels -128", panels=p)
    p = d["panels"].copy()
    p[0, -1, 0] ^= 0x01  # K padding (K = 70 < Kp = 128) no longer zero
    variant("K padding", panels=p)
    p = d["panels"].copy()
    p[0, 0, 4 * 15] ^= 0x01  # channel 15 is padding (N = 5 < 16)
    variant("N padding", panels=p)
    if encoding == "signed":
        s = d["psum"].copy()
        s[1, 1] += 1
        variant("psum inconsistent", psum=s)
    return out


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_corrupted_dict_is_rejected(weight, encoding):
    d = pyw8a8.pack_weight(weight, encoding=encoding, rotate=False).to_dict()
    for desc, bad in _corruptions(d):
        with pytest.raises(ValueError, match="packed weight"):
            PackedWeight.from_dict(bad)
            pytest.fail(f"accepted: {desc}")
    for bogus in (None, 3, "w.npz", [], {}):
        with pytest.raises(ValueError, match="not a packed weight"):
            PackedWeight.from_dict(bogus)


# --- instruction-set selection ------------------------------------------------------


@pytest.mark.parametrize("name", ["", "AVX2", "sse2", "neon2", " avx2", None, 3, b"avx2",
                                  ["avx2"]])
def test_set_isa_with_bad_names(name):
    before = pyw8a8.isa()
    with pytest.raises(ValueError, match=r"isa=.*not an ISA of pyw8a8"):
        pyw8a8.set_isa(name)
    with pytest.raises(ValueError):
        with pyw8a8.use_isa(name):
            pass
    assert pyw8a8.isa() == before


def _unsupported_isas():
    from pyw8a8 import _dispatch
    return [n for n in _dispatch.isa_names() if n not in pyw8a8.available_isas()]


def test_set_isa_the_cpu_lacks():
    before = pyw8a8.isa()
    for name in _unsupported_isas():
        with pytest.raises(RuntimeError, match=rf"isa='{name}'.*does not support"):
            pyw8a8.set_isa(name)
        assert pyw8a8.isa() == before


def _import_with_isa(value):
    env = dict(os.environ, PYW8A8_ISA=value)
    env.pop("PYTHONFAULTHANDLER", None)
    return subprocess.run([sys.executable, "-c", "import pyw8a8; print(pyw8a8.isa())"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value", ["bogus", "AVX2", "scalar;avx2", "../../x"])
def test_unknown_pyw8a8_isa_fails_cleanly(value):
    r = _import_with_isa(value)
    assert r.returncode > 0, r  # an exception, not a signal
    assert "PYW8A8_ISA" in r.stderr and repr(value) in r.stderr
    assert "not an ISA of pyw8a8" in r.stderr


def test_pyw8a8_isa_the_cpu_lacks_fails_cleanly():
    names = _unsupported_isas()
    if not names:
        pytest.skip("this CPU runs every compiled ISA")
    for name in names:
        r = _import_with_isa(name)
        assert r.returncode > 0, r
        assert "PYW8A8_ISA" in r.stderr and "does not support" in r.stderr


def test_pyw8a8_isa_selects_each_available_isa(any_isa):
    r = _import_with_isa(f" {any_isa} ")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == any_isa


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", 2.0])
def test_set_num_threads_with_bad_values(n):
    before = pyw8a8.get_num_threads()
    with pytest.raises((TypeError, ValueError), match=r"\bn\b"):
        pyw8a8.set_num_threads(n)
    assert pyw8a8.get_num_threads() == before


# --- alignment and rotation overflow --------------------------------------------------


def _unaligned(a):
    buf = np.zeros(a.nbytes + 1, np.uint8)
    view = buf[1:].view(a.dtype).reshape(a.shape)
    view[...] = a
    return view


def test_unaligned_out_and_arrays(weight, any_isa):
    """The kernels load through typed pointers: unaligned buffers are copied (inputs, out)
    or rejected (arrays inside a PackedWeight), never read in place."""
    x = np.random.default_rng(12).standard_normal((3, 70)).astype(np.float32)
    for enc in ENCODINGS:
        packed = pyw8a8.pack_weight(weight, encoding=enc, rotate=False)
        want = pyw8a8.matmul(x, packed)
        out = _unaligned(np.zeros((3, 5), np.float32))
        assert not out.flags.aligned
        assert pyw8a8.matmul(_unaligned(x), packed, out=out) is out
        np.testing.assert_array_equal(out, want)
        d = packed.to_dict()
        d["scales"] = _unaligned(d["scales"])
        np.testing.assert_array_equal(pyw8a8.matmul(x, PackedWeight.from_dict(d)), want)
        packed.scales = _unaligned(packed.scales)
        with pytest.raises(ValueError, match=r"\bpacked\b.*'scales'.*unaligned"):
            pyw8a8.matmul(x, packed)


def test_rotation_overflow_of_huge_finite_values(any_isa):
    k = 128
    x = np.ones((3, k), np.float32)
    x[1] = 3.4e38  # finite, but its rotation exceeds the float32 range
    for enc in ENCODINGS:
        packed = pyw8a8.pack_weight(np.ones((4, k)), encoding=enc, rotate=True, block=k)
        out = np.full((3, 4), 7.0, np.float32)
        with pytest.raises(ValueError, match=r"\bx\b.*row 1\b"):
            pyw8a8.matmul(x, packed, out=out)
        assert np.all(out == 7.0)
