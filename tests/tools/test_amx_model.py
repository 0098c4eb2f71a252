"""The AMX cost model (pyw8a8/tools/amx_model.py): its counts follow the loop nest, its
estimates respect the machine's bounds, and the designs it compares differ as their
blocking says.  Arithmetic only: it runs on every machine."""
import dataclasses

import pytest

from pyw8a8.tools import amx_model as model
from pyw8a8.tools import bench

TODAY, BESIDE, BLOCKS, OVERLAPPED, OVER_N = model.DESIGNS


def test_the_tile_count_is_the_loop_nest_s():
    # 64 rows over 2 threads: 32 rows each; 48 columns: a pair of panels and one panel;
    # K = 100 pads to 128, two 64-value steps
    e = model.estimate(64, 100, 48, TODAY, threads=2)
    assert e.tdp == (2 * 2 + 2 * 1) * 2
    # and two kernel calls over the whole K, each idling the tile unit for its store
    machine = model.Machine()
    assert e.cycles["tiles"] == e.tdp * model.TDP_CYCLES + 2 * machine.store_idle_cycles


def test_k_ranges_idle_the_tile_unit_for_their_stores_and_reloads():
    machine = model.Machine()
    whole, ranged = (model.estimate(64, 256, 32, d, threads=1, machine=machine)
                     for d in (TODAY, dataclasses.replace(TODAY, kc=64)))
    assert whole.tdp == ranged.tdp == 2 * 4 * 4  # two row blocks of 2 x 2 tiles, 4 steps
    # two row blocks: two calls over the whole K, eight over four K-ranges (six reloading)
    assert ranged.cycles["tiles"] - whole.cycles["tiles"] == \
        6 * machine.store_idle_cycles + 6 * machine.reload_idle_cycles


@pytest.mark.parametrize("shape", [(1, 1152, 6912), (8, 4096, 4096), (64, 2048, 640),
                                   (256, 1152, 6912), (1024, 2048, 640)])
def test_no_estimate_passes_a_bound(shape):
    machine = model.Machine()
    for design in model.DESIGNS:
        e = model.estimate(*shape, design, threads=2, machine=machine)
        assert 0 < e.share_of_peak <= 1
        # no faster than the weight's first read from its level allows
        m, k, n = shape
        level = model._weight_level(-(-k // 64) * 64, n, machine, 2)
        assert e.cycles[level] >= e.bytes[level] / dict(machine.rate)[level] - 1e-9
        assert e.bound == max(e.cycles, key=e.cycles.get)


def test_blocks_in_l1_read_less_from_l2_and_overlap_only_helps():
    shape = (1024, 2048, 640)
    today, beside, blocks, overlapped = (model.estimate(*shape, d) for d in
                                         (TODAY, BESIDE, BLOCKS, OVERLAPPED))
    assert today.kc == 2048 and beside.kc == 704  # the whole K; B beside A and C in L1
    # A is read again from L2 for every pair of panels until a block of it fits in L1
    assert today.bytes["L2"] >= beside.bytes["L2"] > 3 * blocks.bytes["L2"]
    assert today.gops <= beside.gops < blocks.gops <= overlapped.gops
    assert blocks.tdp == today.tdp  # the same multiplies, read from elsewhere


def test_an_a_block_that_does_not_fit_in_l1_reads_from_l2_again():
    big = dataclasses.replace(BLOCKS, kc=512)  # 64 x 512 of A, 32 KiB, beside 16 of B
    fits, spills = (model.estimate(1024, 2048, 640, d) for d in (BLOCKS, big))
    assert spills.bytes["L2"] > 2 * fits.bytes["L2"]


def test_the_bench_prints_the_model(capsys):
    assert bench.main(["--amx-model", "--shapes", "64,2048,640;1,640,2048"]) == 0
    out = capsys.readouterr().out
    assert "estimates, not measurements" in out
    assert sum(line.startswith("| 64 x 2048 x 640 |") for line in out.splitlines()) == \
        len(model.DESIGNS)


def test_a_large_weight_split_over_n_is_read_once_from_l3():
    # 64 rows over M: each thread reads the whole 16.8 MB weight; over N, half of it
    over_m, over_n = (model.estimate(64, 4096, 4096, d) for d in (OVERLAPPED, OVER_N))
    assert over_m.bytes["L3"] == 2 * over_n.bytes["L3"] == 4096 * 4096
