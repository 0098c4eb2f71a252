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
    """The bounds of a product on this CPU and thread count.

    Attributes
    ----------
    peak : dict of str to float
        Each ISA's instruction peak, GOPS.
    bandwidth : dict of str to float
        Read bandwidth of each level of `LEVELS`, GB/s, all threads reading.
    capacity : dict of str to int
        Bytes a weight may have to stay in a level between calls: the threads' L2
        together, and the last-level cache (the bench's cache-resident bound).
    """

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


def measure(peaks: dict, nthreads: int, dram: float | None = None,
            l3: float | None = None) -> Roofline:
    """The roofline of this CPU for `nthreads` threads: the given instruction `peaks`
    (GOPS per ISA), and each level's read bandwidth (`dram` and `l3` where the caller
    probed them already)."""
    l2_each = _dispatch.cache_bytes(2) or 512 * 1024
    l2 = l2_each * nthreads // 2  # half of each core's L2: the activations need room
    bandwidth = {
        "L2": read_bandwidth_gbs(nthreads, nbytes=l2, rounds=25, reads=64),
        "L3": l3 if l3 is not None else read_bandwidth_gbs(nthreads, nbytes=8 << 20,
                                                           rounds=25),
        "DRAM": dram if dram is not None else read_bandwidth_gbs(nthreads),
    }
    return Roofline(dict(peaks), bandwidth, {"L2": l2, "L3": CACHE_RESIDENT_BYTES})

