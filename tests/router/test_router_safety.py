"""Hostile input to pyw8a8.router: stale cached weights, invalid configurations and
malformed packed-weight files.

* `WeightCache` never returns a weight packed from other data: not after an in-place edit
  of the float array, not for a new array that reuses a freed array's id.
* `RouterConfig` (and ``RouterConfig.from_env``, and the evaluation's configuration names)
  reject settings that ``pyw8a8.pack_weight`` would reject, when they are built.
* `load_packed` raises FileNotFoundError for a missing file and ValueError (naming the
  file) for anything malformed; `save_packed` refuses names that would not load back.
"""

import gc
import re
import struct
import zipfile
import zlib

import numpy as np
import pytest

import pyw8a8
from pyw8a8.evaluate import cli
from pyw8a8.evaluate.configs import parse_config, parse_config_list
from pyw8a8.router import Int8Linear, Router, RouterConfig, WeightCache, load_packed, save_packed
from pyw8a8.router import cache as cache_module
from pyw8a8.router.cache import content_checksum


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Packed:
    """A stand-in packed weight: a copy of the float weight, one "byte" per value."""

    def __init__(self, w):
        self.w = np.array(w, copy=True)
        self.nbytes = self.w.size


# ---------------------------------------------------------------------------
# WeightCache: never a weight packed from other data
# ---------------------------------------------------------------------------


def test_router_repacks_a_weight_edited_in_place():
    # The case: a second model on the same array after ``w += 1``.
    cache = WeightCache(None)
    w, x = rand(64, 128), rand(3, 128, seed=1)
    Router(cache=cache)("mlp.up_proj", w)(x)
    w += 1.0
    got = Router(cache=cache)("mlp.up_proj", w)(x)
    np.testing.assert_array_equal(got, Int8Linear(w, block=128)(x))  # packed from the new values
    assert (cache.hits, cache.misses) == (0, 2)
    Router(cache=cache)("mlp.up_proj", w)(x)  # unchanged since: shared
    assert cache.hits == 1


def _view_edit(w):
    view = w.reshape(-1)[::7]  # another view of the same memory
    view[3] = 0.5


@pytest.mark.parametrize("edit", [
    lambda w: w.__iadd__(1.0),
    lambda w: w.__setitem__((5, 3), 0.0),               # one element
    lambda w: w.__setitem__((-1, -1), np.nextafter(w[-1, -1], np.inf)),  # one ulp
    lambda w: w.__setitem__([0, 1], w[[1, 0]]),          # a row swap (same values)
    lambda w: w.__setitem__((0, 0), -w[0, 0]),
    _view_edit,
], ids=["+=1", "one-element", "one-ulp", "row-swap", "sign", "through-a-view"])
def test_cache_misses_after_any_in_place_edit(edit):
    cache = WeightCache(None)
    w = rand(16, 24)
    cache.put(w, Packed(w), "s")
    assert cache.get(w, "s") is not None
    edit(w)
    assert cache.get(w, "s") is None
    assert len(cache) == 0 and cache.nbytes == 0  # the stale entry is dropped


def test_cache_never_serves_a_freed_arrays_weight_to_a_new_array_with_its_id():
    cache = WeightCache(None)
    a = rand(10, 10)
    cache.put(a, Packed(a), "s")
    old_id = id(a)
    del a
    gc.collect()
    keep = []  # hold the misses so that each new array gets another address
    for _ in range(1000):
        b = np.zeros((10, 10), np.float32)
        if id(b) == old_id:
            break
        keep.append(b)
    else:
        pytest.skip("CPython did not reuse the freed array's id")
    assert cache.get(b, "s") is None
    packed = cache.get_or_pack(b, lambda: Packed(b), "s")
    np.testing.assert_array_equal(packed.w, 0.0)


def test_cache_misses_when_the_array_changes_while_packing():
    cache = WeightCache(None)
    w = rand(8, 8)

    def pack_then_edit():  # another thread edits w during the packing
        packed = Packed(w)
        w[0, 0] += 1.0
        return packed

    cache.get_or_pack(w, pack_then_edit, "s")
    packed = cache.get_or_pack(w, lambda: Packed(w), "s")
    np.testing.assert_array_equal(packed.w, w)
    assert (cache.hits, cache.misses) == (0, 2)


def test_cache_invalidate_and_clear():
    cache = WeightCache(None)
    a, b = rand(4, 4), rand(4, 4, seed=1)
    cache.put(a, Packed(a), "s1")
    cache.put(a, Packed(a), "s2")
    cache.put(b, Packed(b), "s1")
    assert cache.invalidate(a) == 2
    assert cache.get(a, "s1") is None and cache.get(a, "s2") is None
    assert cache.get(b, "s1") is not None and cache.nbytes == 16
    assert cache.invalidate(a) == 0
    cache.clear()
    assert cache.get(b, "s1") is None and len(cache) == 0


def test_cache_shares_one_packing_between_names_of_one_array():
    # Tied weights: the key is the array (identity and contents), not the tensor name.
    cache = WeightCache(None)
    w, x = rand(32, 128), rand(2, 128, seed=1)
    r = Router(RouterConfig(), cache=cache)
    np.testing.assert_array_equal(r("token_embd", w)(x), r("output", w)(x))
    assert (cache.hits, cache.misses) == (1, 1)


def test_cache_in_place_reshape_is_another_key():
    cache = WeightCache(None)
    w = rand(4, 6)
    cache.put(w, Packed(w), "s")
    w.shape = (6, 4)
    assert cache.get(w, "s") is None


def test_cache_without_room_skips_the_checksum(monkeypatch):
    def fail(array):
        raise AssertionError("checksum taken")

    monkeypatch.setattr(cache_module, "content_checksum", fail)
    cache = WeightCache(0)
    w = rand(4, 4)
    assert cache.get_or_pack(w, lambda: Packed(w), "s").nbytes == 16
    assert len(cache) == 0 and cache.misses == 1


def test_content_checksum_covers_every_value_in_c_order(monkeypatch):
    w = rand(37, 29)
    whole = zlib.crc32(w.tobytes())
    monkeypatch.setattr(cache_module, "_CHECKSUM_CHUNK_BYTES", 3 * w[0].nbytes + 1)  # ragged chunks
    assert content_checksum(w) == whole
    assert content_checksum(w.T) == zlib.crc32(np.ascontiguousarray(w.T).tobytes())
    assert content_checksum(w[:0]) == zlib.crc32(b"")
    assert content_checksum(np.float32(2.0).reshape(())) == zlib.crc32(np.float32(2.0).tobytes())


@pytest.mark.parametrize("bound", [True, -1, 1.5, "1"])
def test_cache_bad_bound(bound):
    with pytest.raises(ValueError, match="max_bytes"):
        WeightCache(bound)


# ---------------------------------------------------------------------------
# RouterConfig: validated when built
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("block", 1), ("block", 8), ("block", 8192), ("block", 96), ("block", 0), ("block", True),
    ("block", 128.0),
    ("seed", -1), ("seed", 2**32), ("seed", "0"), ("seed", 1.0),
    ("encoding", "bogus"), ("encoding", None), ("encoding", "AUTO"),
    ("min_in_features", -1), ("min_in_features", True),
    ("skip_rows", 0), ("skip_rows", -5),
])
def test_config_rejects_bad_fields_naming_them(field, value):
    with pytest.raises(ValueError, match=f"^{field} must"):
        RouterConfig(**{field: value})
    with pytest.raises(ValueError, match=f"^{field} must"):
        RouterConfig().with_(**{field: value})


def test_config_accepts_the_edges_and_normalizes_numpy_ints():
    c = RouterConfig(block=np.int64(16), seed=np.uint32(2**32 - 1), min_in_features=np.int32(0),
                     skip_rows=1, encoding="signed")
    assert (c.block, c.seed, c.min_in_features, c.skip_rows) == (16, 2**32 - 1, 0, 1)
    assert all(type(v) is int for v in (c.block, c.seed, c.min_in_features))
    assert RouterConfig(block=4096, encoding="biased").block == 4096


@pytest.mark.parametrize("block", [16, 4096])
def test_every_block_the_config_accepts_packs(block):
    w, x = rand(2, block), rand(1, block, seed=1)
    layer = Router(RouterConfig(block=block), cache=WeightCache(0))("w", w)
    assert layer(x).shape == (1, 2) and layer.packed.rotate and layer.packed.block == block


@pytest.mark.parametrize("var, value", [
    ("PYW8A8_BLOCK", "8"), ("PYW8A8_BLOCK", "8192"), ("PYW8A8_BLOCK", "1"),
    ("PYW8A8_SEED", "-1"), ("PYW8A8_SEED", "4294967296"),
    ("PYW8A8_MIN_IN_FEATURES", "-1"), ("PYW8A8_SKIP_ROWS", "-2"),
])
def test_from_env_rejects_out_of_range_values_naming_the_variable(var, value):
    with pytest.raises(ValueError, match=f"^{var}="):
        RouterConfig.from_env({var: value})


def test_from_env_reads_the_edges():
    c = RouterConfig.from_env({"PYW8A8_BLOCK": "4096", "PYW8A8_SEED": "4294967295"})
    assert (c.block, c.seed) == (4096, 2**32 - 1)


@pytest.mark.parametrize("name", ["rotated8", "rotated8192", "rotated1", "rotated0",
                                  "rotated8+scaling", "rotated99999999999999999999"])
def test_eval_config_names_with_a_bad_block_are_rejected_naming_the_config(name):
    quoted = re.escape(f"configuration '{name}'")
    with pytest.raises(ValueError, match=rf"{quoted}: block must be a power of two"):
        parse_config(name)
    with pytest.raises(ValueError, match=quoted):
        parse_config_list([f"naive,{name}"])


def test_eval_cli_rejects_rotated8_as_a_usage_error(tmp_path, capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("main() must stop at the configuration names")

    for name in ("load_samples", "run_in_subprocess"):  # never a real evaluation here
        monkeypatch.setattr(cli, name, boom)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--configs", "rotated8", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "configuration 'rotated8'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_eval_env_config_names_the_config_and_the_variable(monkeypatch):
    monkeypatch.setenv("PYW8A8_BLOCK", "8192")
    with pytest.raises(ValueError, match="configuration 'env': PYW8A8_BLOCK='8192'"):
        parse_config("env")


# ---------------------------------------------------------------------------
# load_packed / save_packed: malformed files
# ---------------------------------------------------------------------------

FORMAT, NAMES = "__pyw8a8_packed_format__", "__names__"


@pytest.fixture(scope="module")
def packed():
    return pyw8a8.pack_weight(rand(8, 64), rotate=False)


@pytest.fixture
def good(tmp_path, packed):
    path = tmp_path / "good.npz"
    save_packed(path, {"a": packed, "b": packed})
    return path


def _arrays(packed, **changes):
    """The arrays of a valid one-tensor file, with `changes` (None removes an entry)."""
    arrays = {FORMAT: np.array(1, np.int64), NAMES: np.array(["a"])}
    arrays.update({f"0/{k}": v for k, v in packed.to_dict().items()})
    arrays.update(changes)
    return {k: v for k, v in arrays.items() if v is not None}


def _write_zip(path, members):
    """A zip of raw members (name -> bytes); `np.save` bytes for arrays."""
    with zipfile.ZipFile(path, "w") as z:
        for name, value in members.items():
            if isinstance(value, np.ndarray):
                with z.open(name, "w") as f:
                    np.save(f, value)
            else:
                z.writestr(name, value)
    return path


def test_load_good_file_round_trips(good, packed):
    loaded = load_packed(good)
    assert list(loaded) == ["a", "b"]
    x = rand(2, 64, seed=1)
    np.testing.assert_array_equal(pyw8a8.matmul(x, loaded["b"]), pyw8a8.matmul(x, packed))


def test_load_missing_file_is_file_not_found(tmp_path):
    missing = tmp_path / "nope.npz"
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        load_packed(missing)
    with pytest.raises(OSError):  # a directory: cannot be opened, not "corrupted"
        load_packed(tmp_path)


def test_load_truncated_file(good, tmp_path):
    data = good.read_bytes()
    bad = tmp_path / "truncated.npz"
    for n in (0, 3, 4, 30, len(data) // 2, len(data) - 1):
        bad.write_bytes(data[:n])
        with pytest.raises(ValueError, match="truncated.npz: (corrupted|not a pyw8a8)"):
            load_packed(bad)


def test_load_flipped_byte_fails_the_crc(good, tmp_path):
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        info = z.getinfo("0/panels.npy")
    data[info.header_offset + 30 + len(info.filename) + 200] ^= 0xFF  # inside panels' data
    bad = tmp_path / "flipped.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="flipped.npz: corrupted"):
        load_packed(bad)


def test_load_files_that_are_not_npz(tmp_path):
    cases = {"garbage.npz": b"not a zip file at all", "pickle.npz": b"\x80\x04K\x01."}
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
    np.save(tmp_path / "array.npy", np.zeros(3))
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    for name in [*cases, "array.npy", "other.npz"]:
        with pytest.raises(ValueError, match=rf"{name}: not a pyw8a8 packed-weight file"):
            load_packed(tmp_path / name)


@pytest.mark.parametrize("changes, match", [
    ({FORMAT: np.array(99)}, "unsupported packed format version 99"),
    ({FORMAT: np.array(1.0)}, f"entry '{FORMAT}' must be an integer scalar"),
    ({FORMAT: np.array([1, 1])}, f"entry '{FORMAT}' must be an integer scalar"),
    ({FORMAT: np.array("1")}, f"entry '{FORMAT}' must be an integer scalar"),
    ({NAMES: np.array([0])}, f"entry '{NAMES}' must be a 1-D array of strings"),
    ({NAMES: np.array("a")}, f"entry '{NAMES}' must be a 1-D array of strings"),
    ({NAMES: np.array([["a"]])}, f"entry '{NAMES}' must be a 1-D array of strings"),
    ({"1/panels": np.zeros(3)}, "unexpected entry '1/panels'"),
    ({"00/panels": np.zeros(3)}, "unexpected entry '00/panels'"),
    ({"\u0660/panels": np.zeros(3)}, "unexpected entry"),  # an Arabic-Indic zero
    ({"0/panels": None}, "invalid packed weight 'a'"),
    ({"0/shape": np.array(["x", "y"])}, "invalid packed weight 'a'"),
])
def test_load_wrong_entries(tmp_path, packed, changes, match):
    path = tmp_path / "bad.npz"
    np.savez(path, **_arrays(packed, **changes))
    with pytest.raises(ValueError, match=f"bad.npz: {match}"):
        load_packed(path)


def test_load_member_that_is_not_an_array(tmp_path, packed):
    path = _write_zip(tmp_path / "bad.npz", {f"{k}.npy": v for k, v in _arrays(packed).items()}
                      | {"0/junk": b"hello"})
    with pytest.raises(ValueError, match="bad.npz: entry '0/junk' is raw bytes"):
        load_packed(path)


def test_load_duplicate_names_and_entries(tmp_path, packed):
    twice = _arrays(packed, **{NAMES: np.array(["a", "a"])},
                    **{f"1/{k}": v for k, v in packed.to_dict().items()})
    np.savez(tmp_path / "names.npz", **twice)
    with pytest.raises(ValueError, match=r"names.npz: duplicate tensor names \['a'\]"):
        load_packed(tmp_path / "names.npz")
    # "0/scales.npy" and "0/scales" are one entry to np.load
    members = {f"{k}.npy": v for k, v in _arrays(packed).items()} | {"0/scales": b"x"}
    _write_zip(tmp_path / "entries.npz", members)
    with pytest.raises(ValueError, match=r"entries.npz: duplicate entries \['0/scales'\]"):
        load_packed(tmp_path / "entries.npz")


def test_load_unsupported_compression_method(good, tmp_path):
    # zipfile raises NotImplementedError for an unknown method: still a ValueError here.
    data = bytearray(good.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        start = data.find(signature)
        while start >= 0:
            data[start + offset:start + offset + 2] = struct.pack("<H", 99)
            start = data.find(signature, start + 4)
    bad = tmp_path / "method.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="method.npz: corrupted or truncated"):
        load_packed(bad)


def test_save_refuses_names_and_keys_that_would_not_load_back(tmp_path, packed):
    with pytest.raises(ValueError, match="trailing NUL"):
        save_packed(tmp_path / "p.npz", {"a": packed, "a\0": packed})
    with pytest.raises(ValueError, match="must be strings"):
        save_packed(tmp_path / "p.npz", {1: packed})

    class Keys:
        def __init__(self, key):
            self.key = key

        def to_dict(self):
            return {self.key: np.zeros(2)}

    for key in ("", "a/b", 3):
        with pytest.raises(ValueError, match="non-empty string without '/'"):
            save_packed(tmp_path / "p.npz", {"a": Keys(key)})
    assert not (tmp_path / "p.npz").exists()


def test_save_and_load_packed_are_in_the_api_and_agree_on_the_file_name(tmp_path):
    """pyw8a8.save_packed("w") writes w.npz (numpy's rule) and pyw8a8.load_packed("w")
    reads it; the names are router's own functions."""
    packed = pyw8a8.pack_weight(rand(16, 64))
    assert pyw8a8.save_packed is save_packed and pyw8a8.load_packed is load_packed
    pyw8a8.save_packed(tmp_path / "w", {"w": packed})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.npz"]
    for name in (tmp_path / "w", str(tmp_path / "w"), tmp_path / "w.npz"):
        assert np.array_equal(pyw8a8.load_packed(name)["w"].int8(), packed.int8())
    with pytest.raises(FileNotFoundError, match="other"):
        pyw8a8.load_packed(tmp_path / "other")


@pytest.mark.parametrize("call, match", [
    (lambda p, w: save_packed(p / "w.npz", w), "mapping must be a mapping of tensor names"),
    (lambda p, w: save_packed(p / "w.npz", [w]), "mapping must be a mapping"),
    (lambda p, w: save_packed(p / "w.npz", {"w": w.int8()}), r"mapping\['w'\] must be a packed"),
    (lambda p, w: save_packed(3, {"w": w}), "path must be a str or path-like, got int"),
    (lambda p, w: load_packed(None), "path must be a str or path-like, got NoneType"),
])
def test_save_and_load_packed_name_a_wrong_argument(tmp_path, call, match):
    with pytest.raises(TypeError, match=match):
        call(tmp_path, pyw8a8.pack_weight(rand(8, 64)))
    assert list(tmp_path.iterdir()) == []
