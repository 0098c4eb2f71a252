"""pyw8a8.dask: the same product on a dask cluster (issue 14).

One real ``distributed.LocalCluster`` (2 worker processes, 1 thread each) serves the
module: bit-identity with the in-process product, the weight transferred once per worker
(unpickles counted on the workers, and no worker fetching it from another), a worker
killed mid-computation, and the errors.
"""
import functools
import os
import signal
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import dask  # noqa: E402

import pyw8a8  # noqa: E402
import pyw8a8.dask  # noqa: E402

TIMEOUT = 60  # seconds for any one cluster operation


def weight(n=48, k=300, seed=0):
    return np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)


def activations(shape, seed=1, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def bits_equal(a, b):
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


# --- without a cluster ----------------------------------------------------------------


def test_local_scheduler_without_a_client():
    packed = pyw8a8.pack_weight(weight())
    xn = activations((3, 50, 300))
    x = da.from_array(xn, chunks=(2, 16, 300))
    y = pyw8a8.dask.matmul(x, packed, client=None)
    assert y.shape == (3, 50, 48) and y.dtype == np.float32
    assert y.chunks == ((2, 1), (16, 16, 16, 2), (48,))
    bits_equal(y.compute(scheduler="threads"), pyw8a8.matmul(xn, packed))
    shared = pyw8a8.dask.pack_weight(weight())
    assert "in the graph" in repr(shared) and "padded K=300 to 384" in repr(shared)
    bits_equal(pyw8a8.dask.matmul(x, shared).compute(scheduler="sync"),
               pyw8a8.matmul(xn, packed))


def test_errors():
    packed = pyw8a8.pack_weight(weight())
    x = da.from_array(activations((64, 300)), chunks=(16, 150))
    with pytest.raises(ValueError, match=r"x is chunked along K, its last dimension "
                       r"\(chunks \(150, 150\)\).*x.rechunk\(\{1: -1\}\)"):
        pyw8a8.dask.matmul(x, packed)
    # Rechunked as the message says, it works.
    y = pyw8a8.dask.matmul(x.rechunk({1: -1}), packed)
    bits_equal(y.compute(scheduler="sync"), pyw8a8.matmul(x.compute(), packed))
    with pytest.raises(ValueError, match="weight expects K=300"):
        pyw8a8.dask.matmul(da.ones((4, 200), chunks=2), packed)
    with pytest.raises(TypeError, match="x must be a dask.array.Array, got ndarray"):
        pyw8a8.dask.matmul(np.ones((4, 300)), packed)
    with pytest.raises(TypeError, match="x must be float32 or float64, got int8"):
        pyw8a8.dask.matmul(da.ones((4, 300), dtype=np.int8), packed)
    with pytest.raises(TypeError, match="packed must be a SharedWeight .* got ndarray"):
        pyw8a8.dask.matmul(da.ones((4, 300)), weight())
    with pytest.raises(ValueError, match="at least one dimension"):
        pyw8a8.dask.matmul(da.ones(()), packed)
    with pytest.raises(TypeError, match="already packed"):
        pyw8a8.dask.pack_weight(packed, block=64)
    with pytest.raises(ValueError, match=r"pad=True"):
        pyw8a8.dask.pack_weight(weight(), block=64)
    # A bad row raises pyw8a8.matmul's error when its chunk is computed, naming the row
    # in the whole array (row 21 is row 5 of its chunk).
    xn = activations((32, 300))
    xn[21, 5] = np.nan
    y = pyw8a8.dask.matmul(da.from_array(xn, chunks=(8, 300)), packed)
    with pytest.raises(ValueError, match=r"row 21\b"):
        y.compute(scheduler="sync")


def test_bench_dask_command(capsys):
    """A tiny `python -m pyw8a8 bench --dask`: in-process and clusters of 1 and 2 workers
    (timings are not asserted: speed is shown by running it)."""
    from pyw8a8.__main__ import main
    assert main(["bench", "--dask", "--dask-shape", "96,64,32", "--dask-chunk", "32"]) == 0
    out = capsys.readouterr().out
    assert "M=96 x K=64 x N=32 in chunks of 32 rows (3 chunks)" in out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| run | processes x threads | time (s) | rows/s | GOPS")
    assert [line.split(" | ")[1] for line in table[1:]][-2:] == ["1 x 1", "2 x 1"]
    assert table[-2].endswith("| 100% |")


def test_bench_format_rows():
    from pyw8a8.tools import dask_bench
    rows = [dict(name="in", workers=0, threads=2, seconds=2.0),
            dict(name="one", workers=1, threads=1, seconds=3.0),
            dict(name="two", workers=2, threads=1, seconds=1.5)]
    for r in rows:
        r["gops"], r["rows_per_s"] = 10 / r["seconds"], 1000 / r["seconds"]
    lines = dask_bench.format_rows(rows)
    assert lines[2] == "| in | 1 x 2 | 2.00 | 500 | 5 | 1.00x |  |"
    assert lines[3] == "| one | 1 x 1 | 3.00 | 333 | 3 | 0.67x | 100% |"
    assert lines[4] == "| two | 2 x 1 | 1.50 | 667 | 7 | 1.33x | 100% |"


# --- on a LocalCluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, worker_dashboard_address=None,
                                  silence_logs=40) as cluster, \
            distributed.Client(cluster, timeout=TIMEOUT) as c:
        c.wait_for_workers(2, timeout=TIMEOUT)
        yield c


def _count_unpickles():
    """On a worker: count the PackedWeight unpickles from now on."""
    from pyw8a8 import packing
    original = getattr(packing._unpickle, "__wrapped__", packing._unpickle)

    @functools.wraps(original)
    def counting(*args):
        counting.count += 1
        return original(*args)

    counting.count = 0
    packing._unpickle = counting  # pickles made here still name pyw8a8.packing._unpickle


def _unpickles():
    from pyw8a8 import packing
    return getattr(packing._unpickle, "count", None)


def _incoming_keys(dask_worker):
    return [str(key) for entry in dask_worker.transfer_incoming_log
            for key in entry.get("keys", ())]


def test_bit_identical_and_weight_shipped_once(client):
    client.run(_count_unpickles)
    w = weight(n=40, k=300)
    shared = pyw8a8.dask.pack_weight(w, client=client)
    assert "on the cluster's workers" in repr(shared)
    packed = pyw8a8.pack_weight(w)
    xn = activations((5, 37, 300))
    x = da.from_array(xn, chunks=(2, 10, 300))  # 12 chunks
    y = pyw8a8.dask.matmul(x, shared)
    bits_equal(y.compute(timeout=TIMEOUT), pyw8a8.matmul(xn, packed))
    # Float64 activations in a second graph, with the same shipped weight.
    x64 = da.from_array(activations((64, 300), seed=2, dtype=np.float64), chunks=(8, 300))
    bits_equal(pyw8a8.dask.matmul(x64, shared).compute(timeout=TIMEOUT),
               pyw8a8.matmul(x64.compute(), packed))
    # Every chunk of both graphs (20) ran on a worker that held the weight: no worker
    # fetched it from another (the transfer logs), and each unpickled it at most twice
    # (the scatter; dask may deserialize a worker's received copy once more under load,
    # seen once in CI), not once per chunk.
    counts = client.run(_unpickles)
    assert set(counts) == set(client.scheduler_info()["workers"])
    assert all(1 <= n <= 2 for n in counts.values()), counts
    key = str(shared.ref.key)
    for keys in client.run(_incoming_keys).values():
        assert key not in keys
    # A PackedWeight passed directly is shipped for that graph, to every worker once more
    # at most (by content hash: the workers already hold this one).
    bits_equal(pyw8a8.dask.matmul(x, packed).compute(timeout=TIMEOUT),
               pyw8a8.matmul(xn, packed))
    assert all(n <= 3 for n in client.run(_unpickles).values())


def test_worker_killed_mid_computation(client):
    """A worker process killed while it computes chunks: its tasks run again elsewhere and
    every row arrives, bit-identical."""
    packed = pyw8a8.pack_weight(weight(n=32, k=256, seed=3))
    shared = pyw8a8.dask.pack_weight(packed, client=client)
    xn = activations((24 * 8, 256), seed=4)

    def slow(block):  # a chunk takes 0.3 s, so the kill lands mid-computation
        time.sleep(0.3)
        return block

    x = da.from_array(xn, chunks=(8, 256)).map_blocks(slow, dtype=np.float32)
    pids = client.run(os.getpid)
    future = client.compute(pyw8a8.dask.matmul(x, shared))
    deadline = time.monotonic() + TIMEOUT
    victim = None
    while victim is None and time.monotonic() < deadline:
        busy = [addr for addr, keys in client.processing().items() if keys]
        victim = busy[0] if len(busy) == 2 else None
        time.sleep(0.05)
    assert victim is not None, "the workers never both started"
    assert not future.done()
    os.kill(pids[victim], signal.SIGKILL)
    bits_equal(future.result(timeout=TIMEOUT), pyw8a8.matmul(xn, packed))
    # The nanny restarts the killed worker; wait for it so later tests see two workers.
    client.wait_for_workers(2, timeout=TIMEOUT)
    assert pids[victim] not in client.run(os.getpid).values()


def test_default_client_is_used(client):
    """Under a Client, a PackedWeight is scattered (a Future), not put in the graph."""
    shared = pyw8a8.dask.SharedWeight(pyw8a8.pack_weight(weight(k=64)))
    assert isinstance(shared.ref, distributed.Future)
    xn = activations((20, 64))
    y = pyw8a8.dask.matmul(da.from_array(xn, chunks=(7, 64)), shared)
    with dask.config.set(scheduler=client):
        bits_equal(y.compute(), pyw8a8.matmul(xn, pyw8a8.pack_weight(weight(k=64))))
