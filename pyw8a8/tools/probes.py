"""What bounds a product on this CPU, measured: each ISA's instruction peak, the float32
FMA peak, the read bandwidths of memory and the last-level cache, and the rotation's cost
(its transform against a copy, and the rotated product against the plain one)."""
import statistics
import time

import numpy as np

from .. import _cpu, _probes, _threads
from .._layout import empty_aligned
from ..lab.record import markdown_table
from ..lab.turns import measure_rounds
from ..rotation import fwht
from .contenders import pyw8a8_product


def _gops_of(run, seconds, blocks=5):
    """GOPS of a peak loop `run(iters)` returning its MACs: the fastest of `blocks` blocks,
    `seconds` in all (a shared host's load only lowers a peak: timed once, a 2-thread probe
    on Zen 5 read 1034 of its 2100 GOPS)."""
    iters = 100_000
    while True:
        t0 = time.perf_counter()
        macs = run(iters)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds / blocks:
            break
        iters *= 2 if elapsed > seconds / blocks / 10 else 8
    best = macs / elapsed
    for _ in range(blocks - 1):
        t0 = time.perf_counter()
        macs = run(iters)
        best = max(best, macs / (time.perf_counter() - t0))
    return 2 * best / 1e9


def int8_peak_gops(isa, nthreads, seconds=0.3):
    """Instruction peak (GOPS) of ISA `isa`: its microkernel's inner instructions in
    independent register chains on every thread."""
    ops = _cpu.checked_ops(isa, "isa")
    return _gops_of(lambda iters: _probes.peak_macs(ops, iters, nthreads), seconds)


def fp32_peak_gops(nthreads, seconds=0.3):
    """(GOPS, vector width) of the float32 FMA peak (numpy's BLAS's instruction); None off x86."""
    features = _cpu.cpu_features()
    if not (features.get("avx2") and features.get("fma")):
        return None, None
    zmm = bool(features.get("avx512f"))
    gops = _gops_of(lambda iters: _probes.fp32_peak_macs(zmm, iters, nthreads), seconds)
    return gops, "avx512" if zmm else "avx2"


# Weights up to this size stay in the last-level cache over the bench's repeated calls
# (the CPUs measured have 32 MiB of L3 or more).
CACHE_RESIDENT_BYTES = 16 << 20


def read_bandwidth_gbs(nthreads, nbytes=1 << 30, rounds=5, reads=1):
    """Read bandwidth (GB/s, the fastest of `rounds`, each `reads` reads: a shared host's
    load only lowers it, as it does a peak) over a buffer of `nbytes`: 1 GiB for memory,
    8 MiB for the last-level cache, a share of L2 per thread for L2 (many reads a round,
    each too short to time alone)."""
    buf = np.ones(nbytes, dtype=np.uint8)
    _probes.read_bytes(buf, nthreads)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        _probes.read_bytes(buf, nthreads, reads)
        times.append(time.perf_counter() - t0)
    return nbytes * reads / min(times) / 1e9


FWHT_KIB = (384, 512)  # L2-resident transforms (per-core L2 of 512 KiB or more)
ROTATION_SHAPES = [(1, 2048, 2048), (8, 2048, 2048), (64, 2048, 2048), (256, 2048, 2048)]


def fwht_vs_copy(rounds, calls=16, block=128, k=2048):
    """Throughput of the in-place FWHT of 128-blocks against np.copyto of an L2-resident
    (M, 2048) float32 array: [(KiB, fwht GB/s, copy GB/s)], medians over rounds.  Both
    arrays start on a cache line: at different offsets, glibc's copy ran ten times slower
    on Zen 3 under KVM, which would flatter the transform."""
    rng = np.random.default_rng(0)
    out = []
    for kib in FWHT_KIB:
        m = kib * 1024 // (4 * k)
        start = (rng.standard_normal((m, k)) * 1e-30).astype(np.float32)
        x, y = empty_aligned((m, k), np.float32), empty_aligned((m, k), np.float32)
        blocks = x.reshape(m, k // block, block)
        t_fwht, t_copy = [], []
        for _ in range(rounds):
            np.copyto(x, start)
            t0 = time.perf_counter()
            for _ in range(calls):
                fwht(blocks, out=blocks)
            t_fwht.append((time.perf_counter() - t0) / calls)
            t0 = time.perf_counter()
            for _ in range(calls):
                np.copyto(y, x)
            t_copy.append((time.perf_counter() - t0) / calls)
        out.append((kib, x.nbytes / statistics.median(t_fwht) / 1e9,
                    x.nbytes / statistics.median(t_copy) / 1e9))
    return out


def rotated_matmul_cost(isa, rounds, min_time):
    """Per shape: ((M, K, N), the rotated product's extra time in each round, sorted), against
    the plain one's in the same round."""
    rng = np.random.default_rng(1)
    rows = []
    for m, k, n in ROTATION_SHAPES:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        times = measure_rounds({"plain": pyw8a8_product(x, w, isa, rotate=False),
                                "rotated": pyw8a8_product(x, w, isa, rotate=True)},
                               rounds, min_time)
        rows.append(((m, k, n), sorted(r / p - 1 for r, p in zip(times["rotated"],
                                                                 times["plain"]))))
    return rows


def print_rotation(isa, rounds, min_time):
    print(f"\nRotation (ISA {isa}, {_threads.get_num_threads()} threads, medians of "
          f"interleaved rounds)")
    print("\n".join(markdown_table(
        ["in-place fwht of 128-blocks", "fwht GB/s", "np.copyto GB/s", "fwht / copy"],
        [[f"({kib * 256 // 2048}, 2048) float32, {kib} KiB", f"{f:.1f}", f"{c:.1f}",
          f"{100 * f / c:.0f}%"] for kib, f, c in fwht_vs_copy(max(rounds, 15))])))
    print("\n" + "\n".join(markdown_table(
        ["M", "K", "N", "time of the rotated product over the plain one (block 128; +: the "
         "rotation costs), median of the rounds", "lowest to highest round"],
        [[m, k, n, f"{100 * statistics.median(extra):+.1f}%",
          f"{100 * extra[0]:+.1f}% to {100 * extra[-1]:+.1f}%"]
         for (m, k, n), extra in rotated_matmul_cost(isa, rounds, min_time)])))
    print("(each round times both products back to back; the spread is the machine's noise)")
