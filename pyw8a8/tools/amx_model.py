"""``bench --amx-model``: a cost model of the AMX product, to judge a change to its loop nest
on any CPU before an AMX Xeon measures it.

It follows the loop nest of ``_simd/gemm_loops.h`` with the microkernel of ``_simd/amx.h``
(2 x 2 tiles of 16 x 16 int32: a 32-row block times a pair of 16-column panels, each
64-value step two A and two B tile loads of 1 KB and four ``tdpbusd``), on one thread's
share of a product, and counts what each resource does:

- the tile unit: one ``tdpbusd`` each ``TDP_CYCLES`` cycles;
- the bytes of every tile load and store and the level each comes from.  A design names
  the blocks whose A rows and B panels stay in L1 while the kernel calls of the block
  reuse them (``rows`` row blocks by ``cols`` panel pairs, over a K-range of ``kc``):
  inside a block each A and B byte comes from L2 once (a B byte's first read from where
  the weight stays between calls: L2, L3 or memory, by its size) and from L1 after.
  Today's order (``cols=1``, every row block of the thread) keeps one pair of B panels
  in L1 across the row blocks where it fits beside a row block's A and the C tiles, and
  reads each row block's A from L2 again for every pair of panels;
- the int32 sums: the C tiles stored by every kernel call and loaded again by each
  K-range but the first, in L1; and the tile unit idle around them: a store waits for
  the call's last multiplies, and the next call's first for the loads;
- the work outside the tiles, which today runs before the multiply (quantizing the
  activations) and after it (the epilogue that converts the sums), not beside it.

A thread's time is its slowest resource (they overlap) plus that outside work, unless the
design overlaps it too; the estimate is the operations over the slower thread's time, as a
share of the tile unit's peak.  The machine's figures are those of the 2-core Sapphire
Rapids Xeon of issue 60.  A model, not a measurement: it ranks designs and names the
resource that bounds each; the Xeon's bench says how fast they run.  Where they disagree
the Xeon is right: the model still ranks "A block in L1" (256-value K-ranges) above the
whole K, which the Xeon measured the other way (2026-12-08).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: Cycles per tdpbusd on a core (16 x 16 x 64 multiply-accumulates).
TDP_CYCLES = 16
TILE_BYTES = 1024
#: A kernel call's block: 32 rows by 2 panels of 16 columns, and its C tiles (int32).
BLOCK = 32
C_BYTES = BLOCK * BLOCK * 4
LEVELS = ("L1", "L2", "L3", "DRAM")


@dataclass(frozen=True)
class Machine:
    """One core's caches, its read rates in bytes a cycle, its clock, and the cycles a
    value of the work outside the tiles takes."""

    ghz: float = 2.4          # 2 cores x 2048 ops a cycle: the 9.8 TOPS of the tile probe
    l1: int = 48 << 10
    l2: int = 2 << 20
    l3_share: int = 8 << 20   # the last-level cache a core's share of a weight may keep
    #: Bytes a cycle.  L2 is what tile loads get, fitted to the measured shares of the three
    #: L2-bound shapes of issue 60's table (its read probe's 175 GB/s, 36 B a cycle a
    #: core, put them 1.5-1.9x too fast; 20 puts them within 10%).
    rate: tuple = (("L1", 128.0), ("L2", 20.0), ("L3", 9.8), ("DRAM", 5.0))
    quantize_cycles_value: float = 0.35  # AVX-512 quantizer, rotation included
    epilogue_cycles_value: float = 0.1   # int32 sums to scaled float32, AVX-512
    #: Cycles the tile unit idles per kernel call storing its C tiles, and more where the
    #: call loads them first (a later K-range): a loop of tile loads and multiplies from
    #: L1 lost 150 cycles a call to a store, 250 to a store and a load (one Xeon core,
    #: 2026-12-08), which made the 256-value K-ranges of "A block in L1" slower than the
    #: whole K (0.84-0.95x at 1024 x 2048 x 640) where the model without them said 2.4x.
    store_idle_cycles: float = 150.0
    reload_idle_cycles: float = 100.0

    @property
    def peak_gops(self) -> float:
        """One core's tile unit."""
        return 2 * 16 * 16 * 64 / TDP_CYCLES * self.ghz


@dataclass(frozen=True)
class Design:
    """A blocking of the loop nest: its K-range `kc` (0: the whole K, AMX's default, its C
    tiles accumulating over all of it; -1: the largest with a pair of B panels, a row
    block's A and the C tiles in L1) and its row block `mc` (0: the A block filling half of
    L2, tuner.h's default),
    whether the work outside the tiles overlaps them, and whether a weight larger than a
    core's L2 is split over N (each thread reads half of it) rather than over M."""

    name: str
    kc: int = 0
    mc: int = 0
    overlapped: bool = False
    large_weight_over_n: bool = False


DESIGNS = (
    Design("today"),
    Design("K-ranges, B fits beside A", kc=-1),
    Design("A block in L1 (the tuner's kc 256, mc 64)", kc=256, mc=64),
    Design("A block in L1, overlapped", kc=256, mc=64, overlapped=True),
    Design("the same, a large weight split over N", kc=256, mc=64, overlapped=True,
           large_weight_over_n=True),
)


@dataclass
class Estimate:
    """One thread's counts, and the product's estimate."""

    design: str
    kc: int
    mc: int
    tdp: int
    bytes: dict   # level -> bytes of tile loads and stores
    cycles: dict  # resource ("tiles" or a level) -> cycles
    bound: str
    gops: float
    share_of_peak: float


def _kc(design: Design, kp: int, machine: Machine) -> int:
    if design.kc > 0:
        kc = design.kc
    elif design.kc == 0:  # w8_kc_for of an ISA with whole_k
        return kp
    else:
        kc = (machine.l1 - C_BYTES) // (2 * BLOCK)
    return min(kp, max(64, kc // 64 * 64))


def _weight_level(kp: int, n: int, machine: Machine, threads: int) -> str:
    weight = kp * n
    if weight <= machine.l2 * threads:
        return "L2"
    return "L3" if weight <= machine.l3_share * threads else "DRAM"


def _spans(total: int, size: int) -> list[int]:
    return [min(size, total - start) for start in range(0, total, size)]


def estimate(m: int, k: int, n: int, design: Design = DESIGNS[0], threads: int = 2,
             machine: Machine = Machine()) -> Estimate:
    """The estimate of an M x K x N product on `threads` cores, split over M where each
    thread gets a row block or more (each task owns its rows: product.h), else over N.
    (The tuner times the split over N too; on the Xeon of issue 60 the split over M
    matched the measured speed at 64 rows, within 8%, and the split over N did not.)

    One thread's loop nest (gemm_loops.h): for each K-range, for each block of `mc` rows,
    for each pair of panels, for each row block of 32: the kernel.  A pair of B panels is
    read from the weight's level by the first row block of the first row block group,
    from L2 by those of the next groups (from the weight's level where the K-range's B
    does not fit in half of L2), and from L1 by the other row blocks where it fits beside
    a row block's A and the C tiles.  A row block's A comes from L2 (the quantizer wrote
    it there) for the first pair of panels, and again for each next one unless the whole
    `mc` block fits in L1 beside the B pair and the C tiles."""
    kp = math.ceil(k / 64) * 64
    over_m = m >= BLOCK * threads and not (design.large_weight_over_n and kp * n > machine.l2)
    mt, nt = (math.ceil(m / threads), n) if over_m else (m, math.ceil(n / threads))
    kc = _kc(design, kp, machine)
    mc = design.mc or machine.l2 // 2 // kc // BLOCK * BLOCK  # tuner.h's `fit`
    mc = max(BLOCK, min(mc, math.ceil(mt / BLOCK) * BLOCK))
    col_blocks = _spans(nt, BLOCK)
    tiles = lambda count: 1 + (count > 16)  # noqa: E731  the tiles a block spans
    tdp = sum(tiles(r) * tiles(c) for r in _spans(mt, BLOCK) for c in col_blocks) * (kp // 64)
    ranges = _spans(kp, kc)
    calls = len(_spans(mt, BLOCK)) * len(col_blocks) * len(ranges)
    idle = calls * machine.store_idle_cycles + \
        calls * (len(ranges) - 1) / len(ranges) * machine.reload_idle_cycles
    first = _weight_level(kp, n, machine, threads)
    moved = dict.fromkeys(LEVELS, 0.0)
    for i, kr in enumerate(ranges):
        b = [tiles(c) * 16 * kr for c in col_blocks]  # each pair's B (16 quad rows a tile)
        b_again = "L2" if nt * kr <= machine.l2 // 2 else first
        for g, rows in enumerate(_spans(mt, mc)):
            # each row block's A: tiles of its rows (8 rows load 8-row tiles)
            a = [r * kr for r in _spans(rows, BLOCK)]
            b_in_l1 = 2 * BLOCK * kr + max(a) + C_BYTES <= machine.l1
            a_in_l1 = sum(a) + 2 * BLOCK * kr + C_BYTES <= machine.l1
            moved[first if g == 0 else b_again] += sum(b)
            moved["L1" if b_in_l1 else "L2"] += sum(b) * (len(a) - 1)
            moved["L2"] += sum(a)
            moved["L1" if a_in_l1 else "L2"] += sum(a) * (len(b) - 1)
            moved["L1"] += sum(tiles(r) * tiles(c) * TILE_BYTES * (2 if i else 1)
                               for r in _spans(rows, BLOCK) for c in col_blocks)
    rates = dict(machine.rate)
    cycles = {"tiles": tdp * TDP_CYCLES + idle, **{lv: moved[lv] / rates[lv] for lv in LEVELS}}
    bound = max(cycles, key=cycles.get)
    outside = mt * kp * machine.quantize_cycles_value + mt * nt * machine.epilogue_cycles_value
    total = max(cycles[bound], outside) if design.overlapped else cycles[bound] + outside
    gops = 2.0 * m * k * n / (total / (machine.ghz * 1e9)) / 1e9
    return Estimate(design.name, kc, mc, tdp, moved, cycles, bound, gops,
                    gops / (threads * machine.peak_gops))


def format_table(shapes, threads: int = 2, machine: Machine = Machine()) -> list[str]:
    """Each design's estimate at each shape, as markdown lines."""
    from ..lab.record import markdown_table
    rows = []
    for m, k, n in shapes:
        for design in DESIGNS:
            e = estimate(m, k, n, design, threads, machine)
            rows.append([f"{m} x {k} x {n}", e.design, e.kc, e.mc,
                         f"{e.bytes['L2'] / 1e6:.1f}",
                         f"{(e.bytes['L3'] + e.bytes['DRAM']) / 1e6:.1f}", e.bound,
                         f"{e.gops:.0f}", f"{100 * e.share_of_peak:.0f}%"])
    rates = dict(machine.rate)
    return ([f"AMX cost model: {threads} cores at {machine.ghz} GHz, tile peak "
             f"{threads * machine.peak_gops:.0f} GOPS, L1 {machine.l1 >> 10} KiB, tile "
             f"loads from L2 at {rates['L2']:.0f} B a cycle and a core, from L3 at "
             f"{rates['L3']:.1f}; estimates, not measurements", ""] +
            markdown_table(["M x K x N", "design", "kc", "mc", "MB from L2 a thread",
                            "MB from L3 or memory", "bound", "est. GOPS", "est. % peak"],
                           rows, "lllrrrlrr"))
