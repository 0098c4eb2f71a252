"""Threads, the GIL, memory, and the sanitizer build.

- One PackedWeight shared by 8 Python threads gives the serial results, bit for bit.
- Thread counts 1, 2, 3 give identical results (K-ranges are summed in one fixed order).
- threadpoolctl's OpenMP limit is what pyw8a8.get_num_threads() reports.
- Long calls release the GIL: another Python thread runs while a product runs.
- Repeated calls do not grow the resident set; a freed PackedWeight returns its memory.
- `make sanitize` (ASan + UBSan build) runs clean (deselect with -m 'not slow').
"""
import gc
import linecache
import os
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import pyw8a8

ENCODINGS = ("biased", "signed")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNDER_ASAN = "asan" in os.environ.get("LD_PRELOAD", "")


# --- concurrency ------------------------------------------------------------------


def test_concurrent_calls_on_one_shared_weight_match_serial_calls(any_isa):
    rng = np.random.default_rng(5)
    k = 2200  # more than one K-range on every ISA
    packed = {enc: pyw8a8.pack_weight(rng.standard_normal((70, k)), encoding=enc, rotate=False)
              for enc in ENCODINGS}
    qw = packed["biased"].int8()
    # Different shapes per thread, so the tuner's cache is written concurrently too.
    inputs = [rng.standard_normal((1 + 7 * t, k)).astype(np.float32) for t in range(8)]
    qinputs = [rng.integers(-127, 128, (3 + t, k), dtype=np.int8) for t in range(8)]
    rounds = 6
    serial = [[pyw8a8.matmul(x, packed[enc]) for enc in ENCODINGS] for x in inputs]
    serial_int = [pyw8a8.int8_matmul(q, qw) for q in qinputs]
    results = [None] * 8
    errors = []
    barrier = threading.Barrier(8)

    def work(t):
        try:
            barrier.wait()
            got = []
            # use_isa holds for its own thread only: each worker selects the ISA itself.
            with pyw8a8.use_isa(any_isa):
                for r in range(rounds):
                    for enc in ENCODINGS:
                        got.append((enc, pyw8a8.matmul(inputs[t], packed[enc])))
                    got.append(("int", pyw8a8.int8_matmul(qinputs[t], qw)))
                    y1, y2 = pyw8a8.matmul_pair(inputs[t], packed["biased"],
                                                packed["biased"])
                    got.append(("pair", (y1, y2)))
            results[t] = got
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    for t in range(8):
        for kind, y in results[t]:
            if kind == "int":
                np.testing.assert_array_equal(y, serial_int[t])
            elif kind == "pair":
                np.testing.assert_array_equal(y[0], serial[t][0])
                np.testing.assert_array_equal(y[1], serial[t][0])
            else:
                np.testing.assert_array_equal(y, serial[t][ENCODINGS.index(kind)])


def test_thread_counts_give_identical_results(any_isa):
    rng = np.random.default_rng(6)
    cases = [(1, 33, 2200), (37, 70, 2100), (300, 48, 300), (5, 400, 64)]
    for m, n, k in cases:
        x = rng.standard_normal((m, k)).astype(np.float32)
        qa = rng.integers(-127, 128, (m, k), dtype=np.int8)
        qw = rng.integers(-127, 128, (n, k), dtype=np.int8)
        exact = qa.astype(np.int64) @ qw.T.astype(np.int64)
        for enc in ENCODINGS:
            packed = pyw8a8.pack_weight(rng.standard_normal((n, k)), encoding=enc,
                                        rotate=False)
            first = None
            for threads in (1, 2, 3):
                pyw8a8.set_num_threads(threads)
                # Several calls: the tuner tries different task splits.
                for _ in range(3):
                    y = pyw8a8.matmul(x, packed)
                    first = y if first is None else first
                    np.testing.assert_array_equal(y, first, err_msg=f"{threads}")
                    r = pyw8a8.int8_matmul(qa, qw, encoding=enc)
                    assert r.dtype == np.int32
                    np.testing.assert_array_equal(r, exact, err_msg=f"{threads}")


def test_threadpoolctl_limit_is_respected():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    x = np.ones((4, 64), np.float32)
    packed = pyw8a8.pack_weight(np.ones((8, 64)), rotate=False)
    before = pyw8a8.get_num_threads()
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        assert pyw8a8.get_num_threads() == 1
        pyw8a8.matmul(x, packed)
    with threadpoolctl.threadpool_limits(3, user_api="openmp"):
        assert pyw8a8.get_num_threads() == 3
        # An explicit set_num_threads wins over the OpenMP default.
        pyw8a8.set_num_threads(2)
        assert pyw8a8.get_num_threads() == 2
        pyw8a8.set_num_threads(None)
        assert pyw8a8.get_num_threads() == 3
    assert pyw8a8.get_num_threads() == before


# --- the GIL ----------------------------------------------------------------------


def _lines_another_thread_saw(call, calls):
    """The source line this thread was at each time another Python thread ran while this
    one called `call()` up to `calls` times (stopping after a call during which the other
    thread saw it in a compiled product, at a ``_kernels.`` line of pyw8a8.matmul).

    The switch interval is made 1000 s, so no thread is forced to hand the GIL over: the
    other thread runs only where this one releases it, and a compiled product that held it
    would never be seen from there (test_the_witness_sees_a_call_only_when_it_releases_the_gil
    shows both cases). Seeing the line of the product, not only of the call site, rules out
    numpy operations of the wrapper (int8_matmul packs its weight with some) that release the
    GIL themselves. The call count guards only against the other thread waking after a
    product ended; nothing here is timed."""
    me = threading.get_ident()
    go, done = threading.Event(), threading.Event()
    seen = []

    def other():
        go.wait()
        while not done.is_set():
            frame = sys._current_frames()[me]
            seen.append(linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip())
            time.sleep(1e-4)  # hands the GIL back: the next sample waits for a release

    th = threading.Thread(target=other, daemon=True)
    th.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000)
    try:
        go.set()
        for _ in range(calls):
            call()
            if any(_in_product(line) for line in seen):
                break
    finally:
        sys.setswitchinterval(interval)
        done.set()
        th.join(timeout=60)
    assert not th.is_alive()
    return seen


def _in_product(line):
    return "_kernels." in line and "call(" in line


needs_gil = pytest.mark.skipif(not getattr(sys, "_is_gil_enabled", lambda: True)(),
                               reason="this Python runs without the GIL")


@needs_gil
def test_the_witness_sees_a_call_only_when_it_releases_the_gil():
    """time.sleep releases the GIL: the other thread sees this thread in it. sum() over a
    range runs in C holding the GIL: the other thread never runs during it."""
    sleeping = _lines_another_thread_saw(lambda: time.sleep(0.02), 3)
    assert any("time.sleep(0.02)" in line for line in sleeping), sleeping
    holding = _lines_another_thread_saw(lambda: sum(range(3_000_000)), 3)
    assert not any("sum(range" in line for line in holding), holding


@needs_gil
@pytest.mark.parametrize("kind", ["int8_matmul", "matmul"])
def test_long_calls_release_the_gil(any_isa, kind):
    """Another Python thread runs while a product runs: it sees this thread inside it."""
    rng = np.random.default_rng(7)
    m, k, n = 128, 2048, 1024
    if kind == "int8_matmul":
        qa = rng.integers(-127, 128, (m, k), dtype=np.int8)
        qw = rng.integers(-127, 128, (n, k), dtype=np.int8)

        def call():
            pyw8a8.int8_matmul(qa, qw)
    else:
        x = rng.random((m, k), dtype=np.float32)
        packed = pyw8a8.pack_weight(rng.standard_normal((n, k)), rotate=False)

        def call():
            pyw8a8.matmul(x, packed)
    pyw8a8.set_num_threads(1)  # leave the second core to the other thread
    seen = _lines_another_thread_saw(call, 20)
    assert any(_in_product(line) for line in seen), seen[-10:]


# --- memory -----------------------------------------------------------------------


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _repeat(fn, max_calls, seconds):
    t0 = time.perf_counter()
    calls = 0
    while calls < max_calls and time.perf_counter() - t0 < seconds:
        fn()
        calls += 1
    return calls


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/statm") or UNDER_ASAN,
                                reason="needs /proc/self/statm; ASan keeps freed memory")


@needs_proc
def test_many_small_calls_do_not_grow_rss(any_isa):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    packed = {enc: pyw8a8.pack_weight(rng.standard_normal((16, 64)), encoding=enc, rotate=False)
              for enc in ENCODINGS}
    qa = rng.integers(-127, 128, (4, 64), dtype=np.int8)
    out = np.empty((4, 16), np.float32)

    def step():
        pyw8a8.matmul(x, packed["biased"])
        pyw8a8.matmul(x, packed["signed"], out=out)
        pyw8a8.int8_matmul(qa, qa)
        pyw8a8.quantize_per_token(x)

    _repeat(step, 1000, 0.5)  # warm up the allocator and the tuner
    gc.collect()
    before = _rss()
    # Up to 10^5 calls (4 per step), within about 2.5 s over all the ISAs.
    calls = 4 * _repeat(step, 100_000 // 4, 2.5 / len(pyw8a8.compiled_isas()))
    gc.collect()
    grown = _rss() - before
    # 64 bytes kept per call would already be ~2 MiB over 30,000 calls.
    assert grown < 2 * 2**20, f"RSS grew {grown / 2**20:.2f} MiB in {calls} calls"


@needs_proc
def test_many_large_calls_do_not_grow_rss():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    packed = pyw8a8.pack_weight(rng.standard_normal((1024, 1024)), rotate=False)
    qa = rng.integers(-127, 128, (64, 1024), dtype=np.int8)
    qw = packed.int8()

    def step():
        pyw8a8.matmul(x, packed)
        pyw8a8.int8_matmul(qa, qw)

    _repeat(step, 50, 1.0)
    gc.collect()
    before = _rss()
    calls = _repeat(step, 1000, 2.5)
    gc.collect()
    grown = _rss() - before
    # Each call allocates ~0.5 MB of results and temporaries: keeping any would show.
    assert grown < 16 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB in {calls} calls"


def test_freed_packed_weight_returns_its_memory_tracemalloc():
    w = np.random.default_rng(10).standard_normal((1024, 2048)).astype(np.float32)
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for enc in ENCODINGS:
            packed = pyw8a8.pack_weight(w, encoding=enc, rotate=False)
            held, _ = tracemalloc.get_traced_memory()
            assert held - base >= packed.nbytes  # numpy buffers are traced
            pyw8a8.matmul(w[:3], packed)
            del packed
            gc.collect()
            now, _ = tracemalloc.get_traced_memory()
            assert now - base < 256 * 1024, f"{(now - base) / 2**20:.2f} MiB still held"
    finally:
        tracemalloc.stop()


@needs_proc
def test_freed_packed_weight_returns_its_memory_rss():
    w = np.random.default_rng(11).standard_normal((4096, 4096)).astype(np.float32)
    gc.collect()
    _malloc_trim()
    before = _rss()
    packed = pyw8a8.pack_weight(w, rotate=False)
    assert _rss() - before >= packed.nbytes // 2
    del packed
    gc.collect()
    # glibc may keep freed blocks below its (adaptive) mmap threshold in its heap; ask it
    # to hand them back so RSS shows what pyw8a8 released.
    _malloc_trim()
    assert _rss() - before < 8 * 2**20


def _malloc_trim():
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# --- sanitizers -------------------------------------------------------------------


@pytest.mark.slow
def test_make_sanitize_runs_clean():
    if not shutil.which("make") or not shutil.which("gcc"):
        pytest.skip("needs make and gcc")
    env = dict(os.environ)
    t0 = time.perf_counter()
    # This interpreter builds and runs the sanitized copy: a plain `python` on PATH may be
    # another one (a virtual environment run without activating it), lacking the test
    # requirements.
    r = subprocess.run(["make", "-s", "sanitize", f"PYTHON={sys.executable}"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - t0
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, f"make sanitize failed after {elapsed:.0f} s:\n{tail}"
    assert "ERROR: AddressSanitizer" not in tail and "runtime error:" not in tail
