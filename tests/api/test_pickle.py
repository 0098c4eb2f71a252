"""PackedWeight travels: pickle, copy.deepcopy and a process pool (issue 14).

A pickle holds the packed bytes, scales, sums, block, seed, encoding and format version,
with no float copy, and unpickles on a process whose ISA differs (each encoding runs
exactly on every ISA).
"""
import concurrent.futures
import copy
import multiprocessing
import pickle
import threading

import numpy as np
import pytest

import pyw8a8
from pyw8a8 import packing

CASES = [  # (K, pack_weight keywords)
    (256, dict(encoding="biased")),
    (100, dict(encoding="signed")),           # zero-padded last block
    (300, dict(encoding="biased", seed=7)),   # padded, format 2
    (70, dict(encoding="signed", rotate=False)),
    (64, dict(encoding="biased", block=32, seed=2**32 - 1)),
]


def weight_and_x(k, kw, n=37, m=5):
    rng = np.random.default_rng(k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    return pyw8a8.pack_weight(w, **kw), x


def same_weight(a, b):
    assert type(b) is pyw8a8.PackedWeight
    for attr in ("shape", "encoding", "rotate", "block", "seed", "rotated_k", "kp"):
        assert getattr(a, attr) == getattr(b, attr), attr
    for attr in ("panels", "psum", "scales"):
        x, y = getattr(a, attr), getattr(b, attr)
        assert x.dtype == y.dtype and x.shape == y.shape and x.flags.c_contiguous
        np.testing.assert_array_equal(x, y)
    assert repr(a) == repr(b)


@pytest.mark.parametrize("k,kw", CASES)
@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip(k, kw, protocol):
    packed, x = weight_and_x(k, kw)
    data = pickle.dumps(packed, protocol=protocol)
    # The bytes, the scales and the sums, and a few hundred bytes of settings (protocol
    # 2 can only write bytes as latin-1 text, up to twice as long).
    assert len(data) < packed.nbytes * (2 if protocol == 2 else 1) + 600
    loaded = pickle.loads(data)
    same_weight(packed, loaded)
    np.testing.assert_array_equal(pyw8a8.matmul(x, loaded), pyw8a8.matmul(x, packed))


def test_pickle_protocol_5_out_of_band():
    """What dask's serializers use: the arrays travel as buffers, not inside the pickle."""
    packed, x = weight_and_x(300, {})
    buffers = []
    data = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 1000 and sum(memoryview(b).nbytes for b in buffers) == packed.nbytes
    loaded = pickle.loads(data, buffers=buffers)
    same_weight(packed, loaded)
    np.testing.assert_array_equal(pyw8a8.matmul(x, loaded), pyw8a8.matmul(x, packed))


@pytest.mark.parametrize("k,kw", CASES)
def test_deepcopy(k, kw):
    packed, x = weight_and_x(k, kw)
    clone = copy.deepcopy(packed)
    same_weight(packed, clone)
    assert not np.shares_memory(clone.panels, packed.panels)
    np.testing.assert_array_equal(pyw8a8.matmul(x, clone), pyw8a8.matmul(x, packed))
    assert copy.copy(packed).panels is packed.panels  # shallow: shares the arrays


def test_unpickle_checks_what_it_loads():
    packed, _ = weight_and_x(100, {})
    _, args = packed.__reduce__()
    assert args[0] == 2  # a padded weight is format 2
    with pytest.raises(ValueError, match="format 99 is not supported"):
        packing._unpickle(99, *args[1:])
    with pytest.raises(ValueError, match="format 'x'"):
        packing._unpickle("x", *args[1:])
    with pytest.raises(ValueError, match="packed weight rotation: .*pad=True"):
        packing._unpickle(1, *args[1:])  # format 1 has no padded blocks
    version, shape, encoding, rotate, block, seed, panels, psum, scales = args
    with pytest.raises(ValueError, match="'panels'"):
        packing._unpickle(version, shape, encoding, rotate, block, seed, panels[:1], psum,
                          scales)
    with pytest.raises(ValueError, match="encoding 'odd'"):
        packing._unpickle(version, shape, "odd", rotate, block, seed, panels, psum, scales)
    with pytest.raises(ValueError, match="block must be a power of two"):
        packing._unpickle(version, shape, encoding, rotate, 48, seed, panels, psum, scales)


@pytest.mark.parametrize("encoding", ["biased", "signed"])
def test_every_encoding_on_every_isa(encoding, any_isa):
    """A weight packed for one CPU (biased on x86, signed on Arm) runs on any ISA: the
    unpickled weight gives, on each ISA, the same bits as the original on that ISA."""
    packed, x = weight_and_x(300, dict(encoding=encoding))
    loaded = pickle.loads(pickle.dumps(packed))
    y = pyw8a8.matmul(x, loaded)
    np.testing.assert_array_equal(y, pyw8a8.matmul(x, packed), err_msg=any_isa)
    with pyw8a8.use_isa("scalar"):
        ref = pyw8a8.matmul(x, loaded)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


def _remote_matmul(x, packed, isa):
    """In a worker process: the product on ISA `isa`, and what the worker saw."""
    if isa is not None:
        pyw8a8.set_isa(isa)
    return pyw8a8.matmul(x, packed), pyw8a8.isa(), repr(packed)


def test_process_pool(any_isa):
    """Weights sent to fresh (spawned) processes, set to an ISA (or left on their default),
    give the bits the parent gets on that ISA."""
    jobs = [(k, kw, isa) for (k, kw), isa in zip(CASES, [None] + [any_isa] * len(CASES))]
    default = []  # the process-wide ISA (any_isa holds for this thread only)
    probe = threading.Thread(target=lambda: default.append(pyw8a8.isa()))
    probe.start()
    probe.join()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        futures = []
        for k, kw, isa in jobs:
            packed, x = weight_and_x(k, kw)
            futures.append((pool.submit(_remote_matmul, x, packed, isa), x, packed, isa))
        for future, x, packed, isa in futures:
            y, used, text = future.result(timeout=120)
            assert used == (isa or default[0]) and text == repr(packed)
            with pyw8a8.use_isa(used):
                np.testing.assert_array_equal(y, pyw8a8.matmul(x, packed), err_msg=used)
