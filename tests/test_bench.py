"""The benchmark command's helpers (its timings are not asserted: speed is shown by running it)."""
import numpy as np
import pytest

from pyw8a8 import bench


@pytest.mark.parametrize("shape", [(1,), (3, 5), (48, 2048)])
def test_aligned_empty_starts_on_a_cache_line(shape):
    a = bench.aligned_empty(shape)
    assert a.shape == shape and a.dtype == np.float32 and a.flags.c_contiguous
    assert a.ctypes.data % 64 == 0


def test_format_table_reports_peaks_and_ratios():
    rows = [((64, 1024, 1024), {"numpy f32": 100.0, "pyw8a8 avx2": 150.0, "peer": 120.0}),
            ((1, 1024, 1024), {"numpy f32": 10.0, "pyw8a8 avx2": 40.0, "peer": 20.0})]
    header = ["M", "K", "N", "numpy f32", "pyw8a8 avx2", "peer"]
    lines = bench.format_table(header, rows, ["avx2"], peaks={"avx2": 300.0}, bandwidth=40.0,
                               fp32_peak=200.0)
    assert lines[0].split(" | ")[-3:] == ["% int8 peak", "numpy % fp32 peak",
                                          "M=1 weight GB/s (% of DRAM) |"]
    first = [c.strip() for c in lines[2].strip("|").split("|")]
    assert first[6:10] == ["1.5x", "1.25x", "50%", "50%"]
    second = [c.strip() for c in lines[3].strip("|").split("|")]
    assert second[6:] == ["4.0x", "2.00x", "13%", "5%", "20.0 (50%)"]


def test_peak_loops_dispatch_by_name_and_count_their_work():
    """Each name reaches its own loop: the work per iteration is chains x lanes (12 chains;
    an unknown name would fall back to the scalar loop's 16)."""
    from pyw8a8 import _cpu, _kernels
    per_iter = {"scalar": 16}
    if _cpu.cpu_features()["avx2"]:
        per_iter.update({"avx2": 12 * 32, "fp32-avx2": 12 * 8})
    if _cpu.cpu_features()["avx512f"]:
        per_iter["fp32-avx512"] = 12 * 16
    for name, macs in per_iter.items():
        assert _kernels.peak_macs(name, 10, 2) == 2 * 10 * macs, name
    assert bench.fp32_peak_name() in per_iter or bench.fp32_peak_name() is None
    assert bench.int8_peak_gops("scalar", 1, seconds=0.01) > 0


def test_fwht_vs_copy_measures_both_contenders():
    rows = bench.fwht_vs_copy(rounds=2, calls=2)
    assert [kib for kib, _, _ in rows] == list(bench.FWHT_KIB)
    assert all(f > 0 and c > 0 for _, f, c in rows)
