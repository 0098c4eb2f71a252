"""A user's script calling every public function of pyw8a8: ``mypy --strict`` must pass on it
(tests/api/test_typing.py), and it runs.

The annotated variables state the types the docstrings promise, so mypy checks the package's
annotations against them, not only that the calls are well formed.
"""
from __future__ import annotations

import pickle
import tempfile
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import numpy.typing as npt

import pyw8a8
import pyw8a8.dask
from pyw8a8.router import (
    PACKED_FORMAT_VERSION,
    FloatLinear,
    Int8GatedLinear,
    Int8Linear,
    Router,
    RouterConfig,
    SeparatePair,
    WeightCache,
    default_cache,
    float_linear,
    load_packed,
    save_packed,
)

F32 = npt.NDArray[np.float32]
rng = np.random.default_rng(0)
x: F32 = rng.standard_normal((4, 256)).astype(np.float32)
w: F32 = rng.standard_normal((32, 256)).astype(np.float32)

# The CPU, its ISAs and the threads.
features: dict[str, bool] = pyw8a8.cpu_features()
compiled: list[str] = pyw8a8.compiled_isas()
available: list[str] = pyw8a8.available_isas()
isa: str = pyw8a8.isa()
pyw8a8.set_isa(isa)
with pyw8a8.use_isa("scalar"):
    assert pyw8a8.isa() == "scalar"
pyw8a8.set_num_threads(1)
threads: int = pyw8a8.get_num_threads()
pyw8a8.set_num_threads(None)
policy: dict[str, Any] = pyw8a8.thread_policy()

# Packing and the products, the fused layer, weights quantized elsewhere.
packed: pyw8a8.PackedWeight = pyw8a8.pack_weight(w)
y: F32 = pyw8a8.matmul(x, packed)
gate, up = pyw8a8.matmul_pair(x, packed, packed)
bias: F32 = np.zeros(packed.shape[0], np.float32)
fused: npt.NDArray[Any] = pyw8a8.matmul(x, packed, bias=bias, activation="silu")
glu: F32 = pyw8a8.matmul_pair(x, packed, packed, glu="gelu_tanh", bias1=bias)
exactly: pyw8a8.PackedWeight = pyw8a8.pack_weight(w, rotate=False)
q_back, s_back = exactly.quantized()
again_q: pyw8a8.PackedWeight = pyw8a8.pack_quantized(q_back, s_back)
assert np.array_equal(pyw8a8.matmul(x, again_q), pyw8a8.matmul(x, exactly))
assert np.array_equal(gate, y) and np.array_equal(up, y)
shape: tuple[int, int] = packed.shape
rotated: bool = packed.rotate
block: int = packed.block
q8: npt.NDArray[np.int8] = packed.int8()
approx: F32 = packed.dequantize()
arrays: dict[str, npt.NDArray[Any]] = packed.to_dict()
again: pyw8a8.PackedWeight = pyw8a8.PackedWeight.from_dict(arrays)
assert np.array_equal(pickle.loads(pickle.dumps(again)).int8(), q8)

qa, sa = pyw8a8.quantize_per_token(x)
qw, sw = pyw8a8.quantize_per_channel(w)
scales: F32 = sa
exact: npt.NDArray[np.signedinteger[Any]] = pyw8a8.int8_matmul(qa, qw)
assert np.array_equal(exact, qa.astype(np.int64) @ qw.T.astype(np.int64))

# The rotation and the scaling.
h: F32 = pyw8a8.fwht(x)
r: F32 = pyw8a8.rotate(x, block=64, seed=3)
back: F32 = pyw8a8.unrotate(r, block=64, seed=3)
w_gate, w_up = rng.standard_normal((2, 64, 32))
w_down = rng.standard_normal((32, 64))
g2, up2, down2, t = pyw8a8.equalize_ffn(w_gate, w_up, w_down)
factors: npt.NDArray[np.float64] = t
none_gate, up3, down3, t3 = pyw8a8.equalize_ffn(None, w_up, w_down, mode="plain")
assert none_gate is None
s, (scaled,) = pyw8a8.smooth([w], np.abs(x).max(axis=0), alpha=0.5)

# dask, with its local scheduler (no cluster needed).
shared: pyw8a8.dask.SharedWeight = pyw8a8.dask.pack_weight(w, rotate=False)
lazy: da.Array = pyw8a8.dask.matmul(da.from_array(x, chunks=(2, 256)), shared)
computed = lazy.compute()
assert computed.shape == (4, 32)
direct: da.Array = pyw8a8.dask.matmul(da.from_array(x, chunks=(2, 256)), packed)

# The router, in a numpy model of one FFN.
config: RouterConfig = RouterConfig(min_in_features=64, block=64).with_(seed=1)
from_env: RouterConfig = RouterConfig.from_env({"PYW8A8_MIN_IN_FEATURES": "64"})
cache: WeightCache = WeightCache(max_bytes=1 << 24)
router = Router(config, cache=cache)
assert router.decide("ffn_up", (64, 256))
layer: Int8Linear | FloatLinear = router("blk.0.ffn_up.weight", w)
out: F32 = layer(x)
pair: Int8GatedLinear | SeparatePair = router.pair("blk.0.ffn_gate.weight", w,
                                              "blk.0.ffn_up2.weight", w)
pair_out: tuple[F32, F32] = pair(x)
small: Int8Linear | FloatLinear = router("tiny", w[:, :32])
assert isinstance(small, FloatLinear)
assert isinstance(layer, Int8Linear) and isinstance(pair, Int8GatedLinear)
float_layer: FloatLinear = float_linear("blk.0.ffn_down.weight", w)
separate = SeparatePair(float_layer, float_layer)
counts: dict[str, int | float] = router.stats()
shared_cache: WeightCache = default_cache()
with tempfile.TemporaryDirectory() as tmp:
    file = Path(tmp) / "packed.npz"
    save_packed(file, router.pack_all())
    loaded: dict[str, pyw8a8.PackedWeight] = load_packed(file)
    pyw8a8.save_packed(file, loaded)
    reloaded: dict[str, pyw8a8.PackedWeight] = pyw8a8.load_packed(file)
    assert sorted(reloaded) == sorted(loaded)
    assert sorted(loaded) == ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
                              "blk.0.ffn_up2.weight"]
    restored = Int8Linear.from_packed(loaded["blk.0.ffn_up.weight"])
    assert np.array_equal(restored(x), out)
version: int = PACKED_FORMAT_VERSION
print("ok")
