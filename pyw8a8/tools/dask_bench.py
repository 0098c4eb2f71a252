"""``python -m pyw8a8 bench --dask``: the product of a large M on local dask clusters of 1
and 2 worker processes (1 thread each) against the in-process call.  Each chunk of rows
is drawn (standard normal), multiplied by the packed weight and its rows summed (only M
floats come back); efficiency of w workers = T(1 worker) / (w * T(w workers))."""
import statistics
import time

import numpy as np

from .. import _threads
from ..lab.record import markdown_table
from ..matmul import matmul
from ..packing import pack_weight


def _in_process(packed, m, k, chunk, seed):
    rng = np.random.default_rng(seed)
    total = 0.0
    for r0 in range(0, m, chunk):
        x = rng.standard_normal((min(chunk, m - r0), k), dtype=np.float32)
        total += float(matmul(x, packed).sum(axis=-1, dtype=np.float64).sum())
    return total


def _row_sums(y):
    return y.sum(axis=-1, dtype=np.float64)


def _on_cluster(client, shared, m, k, chunk, seed):
    import dask.array as da

    from ..dask import matmul as dask_matmul

    x = da.random.default_rng(seed).standard_normal((m, k), chunks=(chunk, k),
                                                    dtype=np.float32)
    y = dask_matmul(x, shared)
    return float(y.map_blocks(_row_sums, drop_axis=1, dtype=np.float64).sum().compute(
        scheduler=client))


def _median_time(fn, rounds):
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(m, k, n, chunk, rounds, workers=(1, 2), seed=0, out=print):
    """The in-process product and local clusters of `workers` processes timed: a row
    (name, workers, threads, seconds, gops, rows_per_s) per run."""
    try:
        import distributed
    except ImportError:
        raise SystemExit('bench --dask needs dask and distributed: pip install -e ".[dask]"')
    from .. import dask as pdask

    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    packed = pack_weight(w)
    ops = 2.0 * m * n * k
    out(f"dask: M={m} x K={k} x N={n} in chunks of {chunk} rows ({-(-m // chunk)} chunks), "
        f"{packed!r}; median of {rounds} rounds after a warm-up")
    rows = []
    previous = _threads.num_threads_override()
    for nthreads in sorted({_threads.get_num_threads(), 1}, reverse=True):
        _threads.set_num_threads(nthreads)
        try:
            _in_process(packed, min(chunk, m), k, chunk, seed)  # warm-up: tuner, faults
            t = _median_time(lambda: _in_process(packed, m, k, chunk, seed), rounds)
        finally:
            _threads.set_num_threads(previous)
        rows.append(dict(name="in-process pyw8a8.matmul", workers=0, threads=nthreads,
                         seconds=t))
        out(f"  in-process ({nthreads} thread{'s' if nthreads > 1 else ''}): {t:.2f} s")
    for nw in workers:
        t0 = time.perf_counter()
        with distributed.LocalCluster(n_workers=nw, threads_per_worker=1, processes=True,
                                      dashboard_address=None, silence_logs=40) as cluster, \
                distributed.Client(cluster) as client:
            client.wait_for_workers(nw, timeout=120)
            shared = pdask.pack_weight(packed, client=client)
            # Warm-up: one chunk per worker (imports, the tuner, page faults).
            _on_cluster(client, shared, min(nw * chunk, m), k, chunk, seed)
            startup = time.perf_counter() - t0
            t = _median_time(lambda: _on_cluster(client, shared, m, k, chunk, seed), rounds)
        rows.append(dict(name=f"dask LocalCluster, {nw} worker{'s' if nw > 1 else ''}",
                         workers=nw, threads=1, seconds=t))
        out(f"  {nw} worker(s) x 1 thread: {t:.2f} s (cluster start and warm-up "
            f"{startup:.1f} s, not timed)")
    for row in rows:
        row["gops"] = ops / row["seconds"] / 1e9
        row["rows_per_s"] = m / row["seconds"]
    return rows


def format_rows(rows):
    """The markdown table of :func:`run`'s rows ("vs in-process": against the first row)."""
    base = rows[0]["seconds"]
    one = next((r["seconds"] for r in rows if r["workers"] == 1), None)
    return markdown_table(
        ["run", "processes x threads", "time (s)", "rows/s", "GOPS", "vs in-process",
         "scaling efficiency"],
        [[r["name"], f"1 x {r['threads']}" if r["workers"] == 0 else f"{r['workers']} x 1",
          f"{r['seconds']:.2f}", f"{r['rows_per_s']:,.0f}", f"{r['gops']:.0f}",
          f"{base / r['seconds']:.2f}x",
          "" if r["workers"] == 0 or one is None else
          f"{100 * one / (r['workers'] * r['seconds']):.0f}%"] for r in rows])
