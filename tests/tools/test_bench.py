"""The benchmark command's helpers (its timings are not asserted: speed is shown by running it)."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pyw8a8
from pyw8a8.tools import bench, bench_table, contenders, probes, roofline


def test_format_table_reports_peaks_and_ratios():
    """Each ISA's GOPS is divided by its own peak, whichever ISA is fastest in the row."""
    rows = [((64, 1024, 1024), {"numpy f32": 100.0, "pyw8a8 avx512vnni": 150.0,
                                "pyw8a8 avx2": 60.0, "peer": 120.0}),
            ((1, 1024, 1024), {"numpy f32": 10.0, "pyw8a8 avx512vnni": 20.0,
                               "pyw8a8 avx2": 40.0, "peer": 20.0})]
    header = ["M", "K", "N", "numpy f32", "pyw8a8 avx512vnni", "pyw8a8 avx2", "peer"]
    peaks = {"avx512vnni": 600.0, "avx2": 300.0}
    bounds = roofline.Roofline(peaks, {"L2": 80.0, "L3": 40.0, "DRAM": 20.0},
                               {"L2": 1 << 20, "L3": 16 << 20})
    lines = bench_table.format_table(header, rows, ["avx512vnni", "avx2"], peaks=peaks,
                                     roofline=bounds, fp32_peak=200.0)
    assert lines[0].split(" | ")[-5:] == ["% peak avx512vnni", "% peak avx2",
                                          "numpy % fp32 peak", "roofline GOPS (bound)",
                                          "% roofline |"]
    first = [c.strip() for c in lines[2].strip("|").split("|")]
    # 64 x 1024 x 1024 on avx512vnni: 1 MiB of weight from L2 at 80 GB/s with 512 KiB of
    # activations and output: 2 * 64 MiB ops over 1.5 MiB / 80 GB/s -> 6827 GOPS, above
    # the 600 GOPS peak: compute-bound at 600.
    assert first[7:14] == ["1.5x", "1.25x", "25%", "20%", "50%", "600 (compute)", "25%"]
    second = [c.strip() for c in lines[3].strip("|").split("|")]
    # 1 x 1024 x 1024 on avx2 (the faster there): 1 MiB + 8 KiB from L2 at 80 GB/s.
    attainable = 2 * 1024 * 1024 / ((1 << 20) + 8 * 1024) * 80
    assert second[7:] == ["4.0x", "2.00x", "3%", "13%", "5%",
                          f"{attainable:.0f} (L2)", f"{100 * 40 / attainable:.0f}%"]


def test_the_roofline_bound_is_the_level_holding_the_weight_or_the_peak():
    bounds = roofline.Roofline({"avx2": 500.0}, {"L2": 100.0, "L3": 50.0, "DRAM": 20.0},
                               {"L2": 1 << 20, "L3": 16 << 20})
    assert bounds.level(1 << 20) == "L2" and bounds.level((1 << 20) + 1) == "L3"
    assert bounds.level(16 << 20) == "L3" and bounds.level((16 << 20) + 1) == "DRAM"
    gops, bound = bounds.attainable("avx2", 1, 8192, 8192)  # 64 MiB: memory-bound
    moved = 8192 * 8192 + 4 * 16384
    assert bound == "DRAM" and gops == pytest.approx(2 * 8192 * 8192 / moved * 20)
    assert bounds.attainable("avx2", 1024, 1024, 1024) == (500.0, "compute")


def test_peak_loops_count_their_work():
    """Each ISA reaches its own loop (the registry's): the work per iteration is chains x
    lanes (12 chains) or the scalar loop's 16."""
    from pyw8a8 import _cpu, _probes
    per_iter = {"scalar": 16, "avx2": 12 * 32, "avxvnni": 12 * 32,
                "avx512vnni": 12 * 64,
                "amx": 4 * 16 * 16 * 64}
    for name in pyw8a8.available_isas():
        macs = per_iter.get(name, 16)
        assert _probes.peak_macs(_cpu.checked_ops(name, "isa"), 10, 2) == 2 * 10 * macs, name
    features = _cpu.cpu_features()
    if features["avx2"]:
        lanes = 16 if features["avx512f"] else 8
        assert _probes.fp32_peak_macs(features["avx512f"], 10, 2) == 2 * 10 * 12 * lanes
    assert probes.int8_peak_gops("scalar", 1, seconds=0.01) > 0


def test_a_peak_is_its_fastest_block(monkeypatch):
    """A probe's peak is the fastest of its timed blocks: a block slowed by another
    tenant's load does not lower it.  On a clock that advances 1 s per 1e9 MACs, but
    3x that in the first block of the calibrated size, 5 blocks read 2 GOPS."""
    clock = [0.0]
    blocks = []

    def run(iters):
        blocks.append(iters)
        slow = 3.0 if iters / 1e9 >= 0.2 and blocks.count(iters) == 1 else 1.0
        clock[0] += iters / 1e9 * slow
        return iters

    monkeypatch.setattr(probes.time, "perf_counter", lambda: clock[0])
    assert probes._gops_of(run, seconds=1.0, blocks=5) == pytest.approx(2.0)
    # Calibrated until one block took at least seconds / blocks, then 4 more of that size.
    assert blocks[-5:] == [blocks[-1]] * 5 and blocks[-1] / 1e9 >= 0.2


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.uname().machine == "x86_64"
                         and shutil.which("objdump")), reason="needs Linux x86-64 and objdump")
def test_the_vector_peak_probes_keep_their_chains_in_registers():
    """A probe whose compiler keeps its accumulators on the stack times the stores, not the
    instruction: GCC's tree-PRE once made the AVX-VNNI probe store 10 of its 12 chains on
    every round, and it read half its peak.  No vector probe may address the stack."""
    from pyw8a8 import _dispatch, _probes
    bodies = {}
    for module in (_dispatch, _probes):
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", module.__file__],
                              capture_output=True, text=True, check=True).stdout
        bodies.update(re.findall(r"<(w8_avx\w*_peak\w*)>:\n(.*?)\n\n", text, flags=re.S))
    if not bodies:
        pytest.skip("the extension modules are stripped of their symbols")
    assert {"w8_avx2_peak", "w8_avxvnni_peak", "w8_avx512_peak", "w8_avx2_peak_fp32",
            "w8_avx512_peak_fp32"} <= set(bodies), sorted(bodies)
    for name, body in bodies.items():
        assert "(%rsp)" not in body, f"{name} addresses the stack:\n{body}"


def test_bench_refuses_an_isa_this_cpu_lacks(capsys):
    """An unsupported ISA would die on an illegal instruction (and amx would run without
    the tile permission): the command refuses it with a clear message instead."""
    missing = [i for i in pyw8a8.compiled_isas() if i not in pyw8a8.available_isas()]
    for name in missing + ["no-such-isa"]:
        with pytest.raises(SystemExit):
            bench.main(["--isa", name, "--no-peers"])
        assert name in capsys.readouterr().err


def test_fwht_vs_copy_measures_both_contenders():
    rows = probes.fwht_vs_copy(rounds=2, calls=2)
    assert [kib for kib, _, _ in rows] == list(probes.FWHT_KIB)
    assert all(f > 0 and c > 0 for _, f, c in rows)


def test_crossover_finds_where_the_wide_isa_wins_for_good():
    """The threshold of the small-M fallback (amx below it runs avx512vnni) is measured,
    not guessed: the smallest M from which the wide ISA wins at every larger M."""
    from pyw8a8.tools import proxies
    wide = pyw8a8.available_isas()[0]
    rows, start = proxies.crossover(wide, "scalar", 128, 64, rounds=1, min_time=0.001,
                                    rows=(1, 8))
    assert [m for m, _, _ in rows] == [1, 8]
    assert all(t_wide > 0 and t_narrow > 0 for _, t_wide, t_narrow in rows)
    wins = [m for m, t_wide, t_narrow in rows if t_wide < t_narrow]
    assert start is None or (start in wins and all(m in wins for m in (1, 8) if m >= start))
    with pytest.raises((ValueError, RuntimeError), match="--crossover"):
        proxies.crossover("no-such-isa", "scalar", 128, 64, 1, 0.001)


@pytest.mark.parametrize("variable", ["PYW8A8_AMX_MIN_ROWS"])
def test_small_m_thresholds_come_from_the_environment(monkeypatch, variable):
    from pyw8a8 import _cpu
    assert variable in [v for _, _, v, _ in _cpu.SMALL_M_FALLBACKS]
    monkeypatch.setenv(variable, " 24 ")
    assert _cpu._min_rows(variable, 8) == 24
    monkeypatch.delenv(variable)
    assert _cpu._min_rows(variable, 8) == 8
    monkeypatch.setenv(variable, "many")
    with pytest.raises(ValueError, match=f"{variable}='many'"):
        _cpu._min_rows(variable, 8)


def test_torch_column_is_the_fastest_engine():
    """torch's engines fold into one column, labelled with the fastest; the best-peer ratio
    takes that engine."""
    names = ["numpy f32", "pyw8a8 avx2", "onnxruntime int8", "torch fbgemm", "torch x86"]
    header = bench_table.table_header(names)
    assert header[3:] == ["numpy f32", "pyw8a8 avx2", "onnxruntime int8", bench_table.TORCH_COLUMN]
    rows = [((8, 64, 64), {"numpy f32": 10.0, "pyw8a8 avx2": 60.0, "onnxruntime int8": 20.0,
                           "torch fbgemm": 30.0, "torch x86": 40.0})]
    line = bench_table.format_table(header, rows, ["avx2"])[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:] == ["10", "60", "20", "40 (x86)", "6.0x", "1.50x"]


def test_rotated_contender_has_its_own_ratio_to_the_best_peer():
    """The first ISA also runs with rotation on; its column is not a peer, and its ratio
    to the best peer has a column of its own."""
    names = contenders.contender_names(["avx512vnni", "avx2"], with_peers=False)
    assert names == ["numpy f32", "pyw8a8 avx512vnni", "pyw8a8 avx2",
                     "pyw8a8 avx512vnni rotated"]
    header = bench_table.table_header(names + ["onnxruntime int8"])
    rows = [((8, 64, 64), {"numpy f32": 10.0, "pyw8a8 avx512vnni": 60.0, "pyw8a8 avx2": 30.0,
                           "pyw8a8 avx512vnni rotated": 50.0, "onnxruntime int8": 40.0})]
    lines = bench_table.format_table(header, rows, ["avx512vnni", "avx2"])
    assert lines[0].endswith("| vs numpy | vs best peer | avx512vnni rotated vs best peer |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[3:] == ["10", "60", "30", "50", "40", "6.0x", "1.50x", "1.25x"]
    rotated = contenders.build_contender("product", f"pyw8a8 {pyw8a8.isa()} rotated", 2, 64, 16)()
    plain = contenders.build_contender("product", f"pyw8a8 {pyw8a8.isa()}", 2, 64, 16)()
    assert rotated.shape == plain.shape == (2, 16) and not np.array_equal(rotated, plain)


def test_missing_torch_is_reported_with_its_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    from pyw8a8.tools import peers
    assert peers.torch_engines() is None
    assert not any(n.startswith("torch") for n in contenders.contender_names(["avx2"]))
    lines = {line.split(" ", 1)[0]: line for line in peers.missing()}
    assert peers.TORCH_INSTALL in lines["torch"] and peers.TORCHAO_INSTALL in lines["torchao"]


def test_torch_bench_without_its_texts_says_so_before_loading_the_model(monkeypatch, capsys):
    """bench --torch offline: the questions cannot be fetched; one line, status 1, and the
    encoder is never loaded."""
    from pyw8a8.evaluate import QuestionsUnavailable
    from pyw8a8.tools import torch_bench, torch_contenders

    def unfetchable(count):
        raise QuestionsUnavailable("the MMLU questions could not be fetched: offline")

    def encoder():
        raise AssertionError("the model must not be loaded without texts")
    monkeypatch.setattr(torch_bench, "texts", unfetchable)
    monkeypatch.setattr(torch_bench, "load_encoder", encoder)
    settings = torch_contenders.Settings(models=["sharing", "encoder", "lm"],
                                         contenders=["float"], rounds=1)
    assert torch_bench.main(settings, ["CPU: test"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "CPU: test", "bench --torch: the MMLU questions could not be fetched: offline"]


def test_missing_litert_is_reported_with_its_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    from pyw8a8.tools import peers
    assert not peers.xnnpack_available()
    assert "xnnpack int8" not in contenders.contender_names(["avx2"])
    [line] = [line for line in peers.missing() if "xnnpack" in line]
    assert peers.XNNPACK_INSTALL in line


def test_format_isolation_gives_both_figures_and_their_ratio():
    rows = [((1, 64, 64), {"a beside": 50.0, "a": 100.0, "b beside": 95.0, "b": 100.0})]
    lines = bench_table.format_isolation(rows, ["a", "b"])
    assert lines[2] == "| 1 | 64 | 64 | a | 50 | 100 | 0.50 |"
    assert lines[3] == "| 1 | 64 | 64 | b | 95 | 100 | 0.95 |"
    assert lines[-1] == "beside / alone: 1 outside 10%: 1x64x64 a"


def test_check_isolation_times_each_contender_alone_and_beside():
    """The bench's method on a small shape: every contender gets a figure from a process of
    its own and (``bench --check-isolation``) one beside the others, in the same rounds."""
    names = contenders.contender_names([pyw8a8.available_isas()[0]], with_peers=False)
    [(shape, gops)] = bench.run_table([(2, 64, 128)], names, rounds=2, min_time=0.001,
                                      beside=True)
    assert shape == (2, 64, 128)
    assert set(gops) == set(names) | {f"{name} beside" for name in names}
    assert all(v > 0 for v in gops.values())
    assert len(bench_table.format_isolation([(shape, gops)], names)) == 2 + len(names) + 2


def test_info_help_is_its_own(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"], quick=True)
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m pyw8a8 info") and "--isa" in out
    assert "--ffn" not in out and "--torch" not in out and "--shapes" not in out


def test_rotation_cost_comes_with_its_spread_over_rounds(capsys):
    """The rotated product's extra time is one ratio per round (both products back to back
    within it), sorted, and the table gives the median with the lowest and highest round."""
    isa = pyw8a8.isa()
    rows = probes.rotated_matmul_cost(isa, rounds=3, min_time=0.001)
    assert [shape for shape, _ in rows] == probes.ROTATION_SHAPES
    assert any(m == 8 for (m, _, _), _ in rows)
    for _, extra in rows:
        assert len(extra) == 3 and extra == sorted(extra) and all(e > -1 for e in extra)
    probes.print_rotation(isa, rounds=3, min_time=0.001)
    out = capsys.readouterr().out
    assert "median of the rounds | lowest to highest round |" in out
    assert re.search(r"^\| 8 \| 2048 \| 2048 \| [+-]\d+\.\d% \| [+-]\d+\.\d% to [+-]\d+\.\d% \|$",
                     out, flags=re.M)


def test_summary_says_plainly_where_a_peer_is_faster():
    names = ["numpy f32", "pyw8a8 avx2", "pyw8a8 avx2 rotated", "onnxruntime int8",
             "torch fbgemm", "torch x86"]
    rows = [((1, 640, 2048), {"numpy f32": 30, "pyw8a8 avx2": 100, "pyw8a8 avx2 rotated": 90,
                              "onnxruntime int8": 50, "torch fbgemm": 20, "torch x86": 25}),
            ((64, 4096, 4096), {"numpy f32": 80, "pyw8a8 avx2": 150, "pyw8a8 avx2 rotated": 140,
                                "onnxruntime int8": 120, "torch fbgemm": 200, "torch x86": 180})]
    plain, rotated = bench_table.summary_lines(bench_table.table_header(names), rows, ["avx2"])
    assert plain == ("pyw8a8 (rotation off): 0.75-2.00x the best int8 peer; slower than a "
                     "peer at 1 of 2 shapes: 64x4096x4096 (torch int8 (fbgemm) 1.33x faster)")
    assert rotated.startswith("pyw8a8 avx2 rotated: 0.70-1.80x the best int8 peer; slower")
    ahead = [(shape, {**g, "torch fbgemm": 1, "torch x86": 1}) for shape, g in rows]
    assert bench_table.summary_lines(bench_table.table_header(names), ahead, ["avx2"])[0].endswith(
        "ahead of every peer at every shape")
    assert bench_table.summary_lines(bench_table.table_header(names[:3]), rows, ["avx2"]) == []


@pytest.mark.parametrize("sizes, expected", [
    ({1: "32K", 2: "1024K", 3: "32768K"}, 128 << 20),  # a Zen 4's: the least sweep
    ({1: "48K", 2: "2048K", 3: "300M"}, 600 << 20),    # a 16-core Xeon's: twice its L3
    ({}, 128 << 20),                                    # none reported
])
def test_the_sweep_reads_past_the_last_level_cache(tmp_path, sizes, expected):
    from pyw8a8.tools import torch_sharing
    for i, (level, size) in enumerate(sizes.items()):
        index = tmp_path / f"index{i}"
        index.mkdir()
        (index / "level").write_text(f"{level}\n")
        (index / "size").write_text(f"{size}\n")
    assert torch_sharing.sweep_bytes(tmp_path) == expected


def test_torch_sharing_runs_its_three_processes_in_turns_and_takes_medians(monkeypatch):
    """bench --torch's sharing table: both, torch alone and pyw8a8 alone run in turns, PASSES
    times (a slow stretch of the host falls on all three), each share the median of its
    processes' medians."""
    from pyw8a8.tools import torch_sharing
    order, beside = [], iter([0.20, 0.90, 0.22])
    torch_alone, pyw8a8_alone = iter([0.10, 0.50, 0.12]), iter([0.30, 0.32, 0.95])

    def in_process(name, *args):
        role = name.rpartition(":")[2]
        order.append(role)
        if role == "both":
            return {"torch": next(beside) / 2, "pyw8a8": 0.40, "calls": [[8, 16, 16, 0]]}
        if role == "torch_alone":
            assert name.startswith(torch_sharing.encode_timing.__file__)  # loaded alone
            return {"torch": next(torch_alone)}
        assert args[0] == [[8, 16, 16, 0]]  # the replay of what the model called
        hot = next(pyw8a8_alone)
        return {"pyw8a8": hot, "pyw8a8 swept": hot + 0.04}
    monkeypatch.setattr(torch_sharing, "_in_process", in_process)
    shares = torch_sharing.run(["a text"], rounds=1)
    assert order == ["both", "torch_alone", "pyw8a8_alone"] * torch_sharing.PASSES
    assert shares == pytest.approx({"torch beside": 0.11, "torch alone": 0.12,
                                    "pyw8a8 beside": 0.40, "pyw8a8 alone": 0.32,
                                    "pyw8a8 alone swept": 0.36})
    table = torch_sharing.format_table(shares)
    assert [line.split(" | ")[-1] for line in table[2:5]] == ["1.09x |", "0.80x |", "0.90x |"]
