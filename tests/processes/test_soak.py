"""A soak: 8 Python threads and 2 forked workers multiply, pack and pickle at random for a
while, every result compared bit for bit with a single-threaded reference, and the
process's peak memory must stay flat once every thread has warmed up.

About 20 s by default; ``python -m pytest -m soak tests/processes/test_soak.py`` runs it for
``SOAK_LONG_SECONDS`` (5 minutes), and ``PYW8A8_SOAK_SECONDS`` sets any duration."""
import os
import pickle
import resource
import threading
import time

import numpy as np
import pytest

import pyw8a8

THREADS = 8
FORKED_WORKERS = 2
SOAK_SECONDS = 20
SOAK_LONG_SECONDS = 300
RSS_GROWTH_LIMIT = 16 << 20


def _duration(config):
    if os.environ.get("PYW8A8_SOAK_SECONDS"):
        return float(os.environ["PYW8A8_SOAK_SECONDS"])
    return SOAK_LONG_SECONDS if "soak" in (config.getoption("markexpr", "") or "") \
        else SOAK_SECONDS


def _cases(rng, count=10):
    """Random products (K rarely a multiple of 64), with their single-threaded results."""
    cases = []
    for _ in range(count):
        m, k, n = int(rng.integers(1, 80)), int(rng.integers(1, 700)), int(rng.integers(1, 140))
        rotate = bool(rng.integers(2))
        encoding = str(rng.choice(["biased", "signed"]))
        w = rng.standard_normal((n, k)).astype(np.float32)
        w2 = rng.standard_normal((n + 3, k)).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        packed = pyw8a8.pack_weight(w, rotate=rotate, encoding=encoding)
        packed2 = pyw8a8.pack_weight(w2, rotate=rotate, encoding=encoding)
        cases.append(dict(w=w, x=x, rotate=rotate, encoding=encoding, packed=packed,
                          packed2=packed2, y=pyw8a8.matmul(x, packed),
                          pair=pyw8a8.matmul_pair(x, packed, packed2)))
    return cases


def _check(case, op, isa):
    """One operation on ISA `isa`; returns a description of a mismatch, or None."""
    with pyw8a8.use_isa(isa):
        if op == "matmul":
            ok = np.array_equal(pyw8a8.matmul(case["x"], case["packed"]), case["y"])
        elif op == "pair":
            y1, y2 = pyw8a8.matmul_pair(case["x"], case["packed"], case["packed2"])
            ok = np.array_equal(y1, case["pair"][0]) and np.array_equal(y2, case["pair"][1])
        elif op == "pack":
            p = pyw8a8.pack_weight(case["w"], rotate=case["rotate"],
                                   encoding=case["encoding"])
            ok = (np.array_equal(p.panels, case["packed"].panels) and
                  np.array_equal(p.scales, case["packed"].scales))
        else:
            p = pickle.loads(pickle.dumps(case["packed"], protocol=5))
            ok = np.array_equal(pyw8a8.matmul(case["x"], p), case["y"])
    return None if ok else f"{op} on {isa}, x {case['x'].shape}, rotate={case['rotate']}"


OPS = ("matmul", "pair", "pack", "pickle")


def _run(cases, seed, deadline, failures, warmed=None):
    """Random operations until `deadline`, each thread on ISAs of its own choosing; after
    one pass over every case and operation, waits at the `warmed` barrier."""
    rng = np.random.default_rng(seed)
    isas = pyw8a8.available_isas()
    for case in cases:
        for op in OPS:
            failures.append(_check(case, op, isas[seed % len(isas)]))
    if warmed is not None:
        warmed.wait()
    while time.monotonic() < deadline:
        case = cases[int(rng.integers(len(cases)))]
        failures.append(_check(case, OPS[int(rng.integers(len(OPS)))],
                               isas[int(rng.integers(len(isas)))]))


def _max_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


@pytest.mark.soak
def test_soak_threads_and_forked_workers(request):
    seconds = _duration(request.config)
    rng = np.random.default_rng(int(time.time()) if seconds > SOAK_SECONDS else 17)
    pyw8a8.set_num_threads(1)
    cases = _cases(rng)
    pyw8a8.set_num_threads(None)
    big = rng.standard_normal((256, 1024)).astype(np.float32)
    pyw8a8.matmul(big, pyw8a8.pack_weight(big))  # the parent's OpenMP pool exists now
    deadline = time.monotonic() + seconds
    children = []
    for worker in range(FORKED_WORKERS):
        pid = os.fork()
        if pid == 0:  # pragma: no cover (runs in the child)
            status = 2
            try:
                failures = []
                _run(cases, 100 + worker, deadline, failures)
                status = int(any(failures))
            finally:
                os._exit(status)
        children.append(pid)
    failures = []
    warmed = threading.Barrier(THREADS + 1)
    threads = [threading.Thread(target=_run, args=(cases, t, deadline, failures, warmed))
               for t in range(THREADS)]
    for t in threads:
        t.start()
    warmed.wait(timeout=seconds + 120)
    rss_warm = _max_rss()
    for t in threads:
        t.join(timeout=seconds + 120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    statuses = []
    for pid in children:
        for _ in range(int(seconds + 120) * 10):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses.append(os.waitstatus_to_exitcode(status))
                break
            time.sleep(0.1)
        else:
            os.kill(pid, 9)
            statuses.append("hung")
    growth = _max_rss() - rss_warm
    mismatches = [f for f in failures if f is not None]
    assert not mismatches, mismatches[:10]
    assert len(failures) > THREADS * len(cases) * len(OPS)  # the loop ran past warm-up
    assert statuses == [0] * FORKED_WORKERS, statuses
    assert growth <= RSS_GROWTH_LIMIT, f"max RSS grew by {growth / 2**20:.1f} MiB"
