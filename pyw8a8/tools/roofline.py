"""What a product can reach on this CPU, from the bench's own probes: its roofline.

A product of M x K x N does ``2 M K N`` operations and reads its weight (K N bytes), its
activations (4 M K) and writes its output (4 M N).  Its attainable speed is its operations
over the longer of two times: at the ISA's instruction peak (``probes.int8_peak_gops``),
and moving those bytes at the read bandwidth of the cache level that holds the weight
between calls (each thread's L2 share, the last-level cache, or memory).  The bench
judges each kernel against that, not only against its peers.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import _dispatch
from .probes import CACHE_RESIDENT_BYTES, read_bandwidth_gbs

LEVELS = ("L2", "L3", "DRAM")


@dataclass(frozen=True)
class Roofline:
    """The bounds of a product on this CPU and thread count: each ISA's instruction `peak`
    (GOPS), each level's read `bandwidth` (GB/s, all threads reading) and the bytes a
    weight may have to stay in a level between calls (`capacity`: the threads' L2
    together, each reading its share of the columns; the last-level cache)."""

    peak: dict
    bandwidth: dict
    capacity: dict

    def level(self, weight_bytes: int) -> str:
        """The level a weight of `weight_bytes` is read from, called again and again."""
        for name in LEVELS[:-1]:
            if weight_bytes <= self.capacity[name]:
                return name
        return LEVELS[-1]

    def attainable(self, isa: str, m: int, k: int, n: int) -> tuple[float, str]:
        """(GOPS, bound) of an M x K x N product on `isa`: bound 'compute' or the level
        whose bandwidth limits it."""
        ops = 2.0 * m * k * n
        weight = k * n
        level = self.level(weight)
        moved = weight + 4.0 * m * (k + n)
        compute_s = ops / (self.peak[isa] * 1e9)
        memory_s = moved / (self.bandwidth[level] * 1e9)
        seconds = max(compute_s, memory_s)
        return ops / seconds / 1e9, "compute" if compute_s >= memory_s else level


def measure(peaks: dict, nthreads: int) -> Roofline:
    """The roofline of this CPU for `nthreads` threads: the given instruction `peaks`
    (GOPS per ISA), and each level's read bandwidth, probed."""
    # A weight split over the threads' columns stays in L2 when each share fits its core's
    # (XNNPACK read a 1.3 MB weight from two 1 MB L2s on a Zen 5); probed on half of it.
    l2 = (_dispatch.cache_bytes(2) or 512 * 1024) * nthreads
    bandwidth = {"L2": read_bandwidth_gbs(nthreads, nbytes=l2 // 2, rounds=25, reads=64),
                 "L3": read_bandwidth_gbs(nthreads, nbytes=8 << 20, rounds=25, reads=4),
                 "DRAM": read_bandwidth_gbs(nthreads)}
    return Roofline(dict(peaks), bandwidth, {"L2": l2, "L3": CACHE_RESIDENT_BYTES})
