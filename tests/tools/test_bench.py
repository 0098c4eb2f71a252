"""The benchmark command's helpers (its timings are not asserted: speed is shown by running it)."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pyw8a8
from pyw8a8.tools import bench, contenders, probes


def test_format_table_reports_peaks_and_ratios():
    """Each ISA's GOPS is divided by its own peak, whichever ISA is fastest in the row."""
    rows = [((64, 1024, 1024), {"numpy f32": 100.0, "pyw8a8 avx512vnni": 150.0,
                                "pyw8a8 avx2": 60.0, "peer": 120.0}),
            ((1, 1024, 1024), {"numpy f32": 10.0, "pyw8a8 avx512vnni": 20.0,
                               "pyw8a8 avx2": 40.0, "peer": 20.0})]
    header = ["M", "K", "N", "numpy f32", "pyw8a8 avx512vnni", "pyw8a8 avx2", "peer"]
    lines = bench.format_table(header, rows, ["avx512vnni", "avx2"],
                               peaks={"avx512vnni": 600.0, "avx2": 300.0},
                               bandwidth={"L3": 40.0, "DRAM": 20.0}, fp32_peak=200.0)
    assert lines[0].split(" | ")[-4:] == ["% peak avx512vnni", "% peak avx2",
                                          "numpy % fp32 peak",
                                          "M=1 weight GB/s (% of L3 or DRAM read) |"]
    first = [c.strip() for c in lines[2].strip("|").split("|")]
    assert first[7:12] == ["1.5x", "1.25x", "25%", "20%", "50%"]
    second = [c.strip() for c in lines[3].strip("|").split("|")]
    assert second[7:] == ["4.0x", "2.00x", "3%", "13%", "5%", "20.0 (50% of L3)"]


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
    header = bench.table_header(names)
    assert header[3:] == ["numpy f32", "pyw8a8 avx2", "onnxruntime int8", bench.TORCH_COLUMN]
    rows = [((8, 64, 64), {"numpy f32": 10.0, "pyw8a8 avx2": 60.0, "onnxruntime int8": 20.0,
                           "torch fbgemm": 30.0, "torch x86": 40.0})]
    line = bench.format_table(header, rows, ["avx2"])[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:] == ["10", "60", "20", "40 (x86)", "6.0x", "1.50x"]


def test_rotated_contender_has_its_own_ratio_to_the_best_peer():
    """The first ISA also runs with rotation on; its column is not a peer, and its ratio
    to the best peer has a column of its own."""
    names = contenders.contender_names(["avx512vnni", "avx2"], with_peers=False)
    assert names == ["numpy f32", "pyw8a8 avx512vnni", "pyw8a8 avx2",
                     "pyw8a8 avx512vnni rotated"]
    header = bench.table_header(names + ["onnxruntime int8"])
    rows = [((8, 64, 64), {"numpy f32": 10.0, "pyw8a8 avx512vnni": 60.0, "pyw8a8 avx2": 30.0,
                           "pyw8a8 avx512vnni rotated": 50.0, "onnxruntime int8": 40.0})]
    lines = bench.format_table(header, rows, ["avx512vnni", "avx2"])
    assert lines[0].endswith("| vs numpy | vs best peer | avx512vnni rotated vs best peer |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[3:] == ["10", "60", "30", "50", "40", "6.0x", "1.50x", "1.25x"]
    rotated = contenders.build_contender(f"pyw8a8 {pyw8a8.isa()} rotated", 2, 64, 16)()
    plain = contenders.build_contender(f"pyw8a8 {pyw8a8.isa()}", 2, 64, 16)()
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
    from pyw8a8.evaluate.download import QuestionsUnavailable
    from pyw8a8.tools import torch_bench

    def unfetchable(count):
        raise QuestionsUnavailable("the MMLU questions could not be fetched: offline")

    def encoder():
        raise AssertionError("the model must not be loaded without texts")
    monkeypatch.setattr(torch_bench, "texts", unfetchable)
    monkeypatch.setattr(torch_bench, "load_encoder", encoder)
    assert torch_bench.main(1, ["CPU: test"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "CPU: test", "bench --torch: the MMLU questions could not be fetched: offline"]


def test_missing_litert_is_reported_with_its_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    from pyw8a8.tools import peers
    assert not peers.xnnpack_available()
    assert "xnnpack int8" not in contenders.contender_names(["avx2"])
    [line] = [line for line in peers.missing() if "xnnpack" in line]
    assert peers.XNNPACK_INSTALL in line


def test_xnnpack_runs_its_own_fully_connected_layer_close_to_float():
    """The XNNPACK contender is LiteRT's one-operator model delegated to XNNPACK (checked
    when it is built), and its product is the int8 one: close to float, not equal."""
    from pyw8a8.tools import peers
    if not peers.xnnpack_available():
        pytest.skip(f"needs LiteRT ({peers.XNNPACK_INSTALL})")
    assert "xnnpack int8" in contenders.contender_names(["avx2"])
    x, w = contenders.shape_data(3, 200, 48)
    y = contenders.build_contender("xnnpack int8", 3, 200, 48)()
    expected = x @ w.T
    error = np.abs(y - expected).max() / np.sqrt(np.mean(expected ** 2))
    assert y.shape == (3, 48) and 0 < error < 0.05


def test_format_isolation_gives_both_figures_and_their_ratio():
    rows = [((1, 64, 64), {"a beside": 50.0, "a": 100.0, "b beside": 95.0, "b": 100.0})]
    lines = bench.format_isolation(rows, ["a", "b"])
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
    assert len(bench.format_isolation([(shape, gops)], names)) == 2 + len(names) + 2


def test_warm_up_goes_on_until_the_tuner_settles(monkeypatch):
    """A contender is timed once pyw8a8's tuner stopped trying blockings, however many
    calls its candidates take past WARM_CALLS (here 2, fewer than any shape's tuning).

    On the portable scalar ISA at two threads, whose candidates at this shape are several
    on every CPU kind: the CPU's own ISA may have a single one (AMX from 8 threads), which
    settles on creation."""
    from pyw8a8.tools import measure
    from pyw8a8.tuning import TUNER
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 256)).astype(np.float32)
    w = pyw8a8.pack_weight(rng.standard_normal((192, 256)).astype(np.float32))
    monkeypatch.setattr(measure, "WARM_CALLS", 2)
    pyw8a8.set_num_threads(2)  # the conftest fixture restores the default count
    TUNER.clear()
    calls = []
    with pyw8a8.use_isa("scalar"):
        measure.warm_up(lambda: calls.append(pyw8a8.matmul(x, w)), 0.0)
    (entry,) = TUNER._entries.values()
    # The untimed first call, then two rounds of every candidate at least.
    assert len(entry.cands) >= 2, entry.cands
    assert TUNER.unsettled() == 0
    assert 1 + 2 * len(entry.cands) <= len(calls) <= measure.MAX_WARM_CALLS
    calls.clear()
    measure.warm_up(lambda: calls.append(None), 0.0)  # settled: WARM_CALLS, no more
    assert len(calls) == 2


def test_an_isolated_contender_reports_its_failure():
    from pyw8a8.tools.measure import Isolated
    with Isolated(contenders.build_contender, 1) as worker:
        with pytest.raises(RuntimeError, match="no-such-isa"):
            worker.build("pyw8a8 no-such-isa", 1, 64, 64).warm_up(0.001)


def test_numpy_gelu_tanh_times_matches_float64():
    """The numpy tanh-GELU of ``bench --ffn`` (float32, in place) against float64: within
    a few float32 roundings of the result, and of g*u where 1 + tanh(...) cancels (large
    negative g), as any float32 evaluation of this formula."""
    from pyw8a8.tools import ffn_bench
    rng = np.random.default_rng(0)
    g = (rng.standard_normal((16, 64)) * 4).astype(np.float32)
    g[0, :4] = [0.0, -30.0, 30.0, -1e-3]
    u = rng.standard_normal((16, 64)).astype(np.float32)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    expected = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3))) * u64
    got = ffn_bench.gelu_tanh_times(g, u)
    assert got is g and got.dtype == np.float32
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(got - expected) <= 8 * eps * (np.abs(expected) + np.abs(g64 * u64)))


def test_ffn_contenders_return_the_block_and_are_timed():
    """Each FFN contender returns the (M, N) block; pyw8a8's unfused and fused blocks are
    the same products through numpy's tanh-GELU and the kernels' (within the float32
    roundings of the formula, see above); the table gives every time and ratio."""
    from pyw8a8.tools import ffn_bench
    names = ffn_bench.contender_names()
    for name in names:
        assert tuple(ffn_bench.build_contender(name, 3, 64, 32)().shape) == (3, 32)
    x, wg, wu = ffn_bench.ffn_data(3, 64, 32)
    pg, pu = (pyw8a8.pack_weight(w, rotate=False) for w in (wg, wu))
    g, u = pyw8a8.matmul_pair(x, pg, pu)
    gu = np.abs(g.astype(np.float64) * u)
    unfused = ffn_bench.build_contender("pyw8a8 unfused", 3, 64, 32)()
    np.testing.assert_array_equal(unfused, ffn_bench.gelu_tanh_times(g, u))
    fused = ffn_bench.build_contender("pyw8a8 fused", 3, 64, 32)()
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(fused - unfused.astype(np.float64)) <= 8 * eps * (np.abs(unfused) + gu))
    [(shape, times)] = ffn_bench.run([(3, 64, 32)], names, rounds=1, min_time=0.001)
    assert shape == (3, 64, 32) and set(times) == set(names)
    assert all(t > 0 for t in times.values())


def test_ffn_table_has_an_xnnpack_column_where_it_was_timed():
    from pyw8a8.tools import ffn_bench
    rows = [((64, 640, 2048), {"numpy f32": 4e-3, "pyw8a8 unfused": 2e-3, "pyw8a8 fused": 1e-3,
                               "xnnpack int8": 2e-3})]
    header, _, line = ffn_bench.format_rows(rows)
    assert "| xnnpack int8 ms |" in header and "| xnnpack vs numpy |" in header
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[6] == "2.000" and cells[9] == "2.00x"


def test_ffn_table_reports_ratios_to_numpy_and_the_fusion_gain():
    from pyw8a8.tools import ffn_bench
    rows = [((64, 640, 2048), {"numpy f32": 4e-3, "pyw8a8 unfused": 2e-3, "pyw8a8 fused": 1e-3,
                               "torch fbgemm": 3e-3, "torch x86": 2.5e-3})]
    lines = ffn_bench.format_rows(rows)
    assert lines[0] == ("| M | K | N | numpy f32 ms | pyw8a8 unfused ms | pyw8a8 fused ms | "
                        "torch int8 ms | unfused vs numpy | fused vs numpy | torch vs numpy | "
                        "fused vs unfused |")
    assert lines[2] == ("| 64 | 640 | 2048 | 4.000 | 2.000 | 1.000 | 2.500 (x86) | 2.00x | "
                        "4.00x | 1.60x | 2.00x |")


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
    plain, rotated = bench.summary_lines(bench.table_header(names), rows, ["avx2"])
    assert plain == ("pyw8a8 (rotation off): 0.75-2.00x the best int8 peer; slower than a "
                     "peer at 1 of 2 shapes: 64x4096x4096 (torch int8 (fbgemm) 1.33x faster)")
    assert rotated.startswith("pyw8a8 avx2 rotated: 0.70-1.80x the best int8 peer; slower")
    ahead = [(shape, {**g, "torch fbgemm": 1, "torch x86": 1}) for shape, g in rows]
    assert bench.summary_lines(bench.table_header(names), ahead, ["avx2"])[0].endswith(
        "ahead of every peer at every shape")
    assert bench.summary_lines(bench.table_header(names[:3]), rows, ["avx2"]) == []


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

    def role(name, *payload):
        order.append(name)
        if name == "_both":
            return {"torch": next(beside) / 2, "pyw8a8": 0.40, "calls": [[8, 16, 16, 0]]}
        assert payload[0] == [[8, 16, 16, 0]]  # the replay of what the model called
        hot = next(pyw8a8_alone)
        return {"pyw8a8": hot, "pyw8a8 swept": hot + 0.04}

    def in_process(args):
        order.append("torch alone")
        return {"torch": next(torch_alone)}
    monkeypatch.setattr(torch_sharing, "_role", role)
    monkeypatch.setattr(torch_sharing, "_in_process", in_process)
    shares = torch_sharing.run(["a text"], rounds=1)
    assert order == ["_both", "torch alone", "_pyw8a8_alone"] * torch_sharing.PASSES
    assert shares == pytest.approx({"torch beside": 0.11, "torch alone": 0.12,
                                    "pyw8a8 beside": 0.40, "pyw8a8 alone": 0.32,
                                    "pyw8a8 alone swept": 0.36})
    table = torch_sharing.format_table(shares)
    assert [line.split(" | ")[-1] for line in table[2:5]] == ["1.09x |", "0.80x |", "0.90x |"]


def test_the_torchao_contender_is_its_int8_linear_compiled_and_names_its_kernel():
    pytest.importorskip("torchao", reason="needs torchao (pip install '.[torchao]')")
    from pyw8a8.tools import peers
    x, w = contenders.shape_data(8, 128, 64)
    run = peers.torchao_matmul(x, w)
    y = run().numpy()
    ref = x @ w.T
    assert np.abs(y - ref).max() < 0.05 * np.abs(ref).max()
    assert run.kernel in ("amx", "vnni", "oneDNN qlinear", "_int_mm")
    assert contenders.TORCHAO in contenders.contender_names(["avx2"])


def test_the_inductor_kernel_is_read_from_the_generated_code():
    from pyw8a8.tools import peers
    named = {"_tile_loadd(...)": "amx", "_mm512_dpbusd_epi32(...)": "vnni",
             "torch.ops.onednn.qlinear_pointwise.tensor(...)": "oneDNN qlinear",
             "extern_kernels._int_mm(buf0, arg1, out=buf2)": "_int_mm", "cpp_fused_add": "?"}
    for code, kernel in named.items():
        assert peers.inductor_int8_kernel(code) == kernel, code


def test_torch_layer_times_the_layer_eager_compiled_and_on_the_python_operator():
    """bench --torch-layer: each contender in its own process (the Python operator's needs
    PYW8A8_TORCH_NATIVE=0 before pyw8a8.torch is imported), one row per shape."""
    pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
    from pyw8a8.tools import torch_layer_bench
    lines = torch_layer_bench.run([(1, 64, 32)], rounds=1, min_time=0.01, nthreads=1)
    header, _, row = lines[:3]
    for name in torch_layer_bench.contender_names():
        assert f"| {name} (us) |" in header
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["1", "64", "32"]
    assert all(float(c.rstrip("x")) for c in cells[3:])
    kernels = next(line for line in lines if line.startswith("Kernels: "))
    assert "pyw8a8.torch python op: " in kernels and "via Python" in kernels


def test_torch_layer_derives_a_call_inside_a_compiled_graph_and_the_target():
    """A layer's call in a graph is the 9-call graph less the one-call graph, over the 8
    calls it adds (Dynamo's entry counted once); the target is 1.25 x matmul + 3 us."""
    from pyw8a8.tools import torch_layer_bench as tlb
    names = [tlb.MATMUL, tlb.EAGER, tlb.COMPILED, tlb.COMPILED_GRAPH, tlb.PYTHON_OPERATOR,
             tlb.TORCHAO, tlb.TORCHAO_GRAPH]
    us = {tlb.MATMUL: 8.0, tlb.EAGER: 12.5, tlb.COMPILED: 30.0, tlb.COMPILED_GRAPH: 110.0,
          tlb.PYTHON_OPERATOR: 20.0, tlb.TORCHAO: 32.0, tlb.TORCHAO_GRAPH: 128.0}
    lines = tlb.format_table([((1, 64, 32), {k: v * 1e-6 for k, v in us.items()})], names, {})
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = dict(zip(header, (c.strip() for c in lines[2].strip("|").split("|"))))
    assert row["pyw8a8.torch - matmul (us)"] == "+4.5"
    assert row["pyw8a8.torch compiled, in a graph (us)"] == "10.0"  # (110 - 30) / 8
    assert row["torchao inductor, in a graph (us)"] == "12.0"  # (128 - 32) / 8
    assert row["target: 1.25 x matmul + 3 us"] == "13.0"
    assert row["in a graph, pyw8a8.torch vs torchao"] == "1.20x"
    without_torchao = tlb.format_table([((1, 64, 32), {k: v * 1e-6 for k, v in us.items()})],
                                       names[:5], {})
    assert "torchao" not in without_torchao[0]


# --- bench --record ---------------------------------------------------------------

CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
cpu family\t: {family}
model\t\t: {model}
model name\t: {name}
flags\t\t: fpu sse2

processor\t: 1
vendor_id\t: SomethingElse
"""


@pytest.mark.parametrize("vendor, family, model, name, amx, kind", [
    ("AuthenticAMD", 25, 0x01, "AMD EPYC 7763 64-Core Processor", False, "zen3"),
    ("AuthenticAMD", 25, 0x21, "AMD Ryzen 9 5950X 16-Core Processor", False, "zen3"),
    ("AuthenticAMD", 25, 0x11, "AMD EPYC 9R14 96-Core Processor", False, "zen4"),
    ("AuthenticAMD", 25, 0x61, "AMD Ryzen 9 7950X 16-Core Processor", False, "zen4"),
    ("AuthenticAMD", 25, 0xA0, "AMD EPYC", False, "zen4"),
    ("AuthenticAMD", 26, 0x02, "AMD EPYC 9R45", False, "zen5"),
    ("GenuineIntel", 6, 0x8F, "Intel(R) Xeon(R) Platinum 8488C", True, "xeon-amx"),
    # Without a kind of its own: the model name's slug and the CPU's best ISA.
    ("GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz", False,
     "intel-xeon-platinum-8259cl-avx2"),
    ("AuthenticAMD", 23, 0x31, "AMD EPYC 7R32 48-Core Processor", False, "amd-epyc-7r32-avx2"),
])
def test_the_record_names_the_cpu_kind(vendor, family, model, name, amx, kind):
    from pyw8a8.tools import record
    fields = record.cpuinfo_fields(CPUINFO.format(vendor=vendor, family=family, model=model,
                                                  name=name))
    assert fields["vendor_id"] == vendor and record.cpu_model(fields) == name
    assert record.cpu_kind(fields, {"amx_int8": amx}, "avx2") == kind


def test_the_record_of_a_cpu_without_cpuinfo_fields_is_named_by_its_platform():
    import platform

    from pyw8a8.tools import record
    kind = record.cpu_kind({}, {}, "scalar_u8s8")
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*-scalar-u8s8", kind), kind
    assert kind.startswith(re.sub(r"[^a-z0-9]+", "-", (platform.processor() or
                                                         platform.machine()).lower())[:4])


def _git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_record_names_the_commit_of_a_checkout_dirty_or_not(tmp_path):
    import shutil
    if not shutil.which("git"):
        pytest.skip("needs git")
    from pyw8a8.tools import record
    package = tmp_path / "repo" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    repo = package.parent
    _git(repo, "init", "-q")
    _git(repo, "add", "pkg/__init__.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert record.source_commit(package) == head
    (package / "other.txt").write_text("untracked files are not changes\n")
    assert record.source_commit(package) == head
    (package / "__init__.py").write_text("x = 2\n")
    assert record.source_commit(package) == f"{head}-dirty"
    # Files git does not track (an installed copy inside a checkout) and no checkout at all.
    copy = repo / "venv" / "pkg"
    copy.mkdir(parents=True)
    (copy / "__init__.py").write_text("x = 1\n")
    assert record.source_commit(copy) == "unknown"
    outside = tmp_path / "plain" / "pkg"
    outside.mkdir(parents=True)
    (outside / "__init__.py").write_text("x = 1\n")
    assert record.source_commit(outside) == "unknown"


def test_bench_record_keeps_the_run_its_machine_versions_commit_and_command(
        tmp_path, monkeypatch, capsys):
    """``bench --record DIR`` on the smallest run the bench offers: what it printed, with its
    table rows as markdown, goes to DIR/YYYY-MM-DD-<cpu kind>.md, with the CPU, the threads,
    the versions, the commit and the command; a second run that day is appended."""
    import datetime

    from pyw8a8.tools import record
    # The bandwidth probe reads a 1 GiB buffer and the rotation's cost times 2048-wide
    # products: neither is what this test checks.
    monkeypatch.setattr(bench, "read_bandwidth_gbs", lambda *a, **k: 10.0)
    monkeypatch.setattr(bench, "print_rotation", lambda *a, **k: print("rotation: skipped"))
    directory = tmp_path / "records" / "new"  # made where missing
    argv = ["--no-peers", "--isa", "scalar", "--shapes", "1,64,64;2,64,128", "--rounds", "1",
            "--min-time", "0.001", "--record", str(directory)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    [path] = directory.iterdir()
    today = datetime.date.today().isoformat()
    kind = record.cpu_kind(record.cpuinfo_fields(), pyw8a8.cpu_features(),
                           pyw8a8.available_isas()[0])
    assert path.name == f"{today}-{kind}.md"
    assert printed.rstrip().endswith(f"recorded in {path}")
    text = path.read_text()
    assert text.startswith(f"# pyw8a8 bench on {kind}, {today}\n")
    assert text.count("\n## Run of ") == 1
    rows = [line for line in printed.splitlines() if line.startswith("|")]
    assert [r.split(" | ")[:3] for r in rows[2:4]] == [["| 1", "64", "64"], ["| 2", "64", "128"]]
    for line in rows:  # every table line, as a markdown table line of the record
        assert f"\n{line}\n" in text
    assert f"\n\n{rows[0]}\n" in text  # a table starts after a blank line
    assert "```text\nCPU: " in text and "rotation: skipped" in text
    fields = dict(re.findall(r"^- (\w[\w ]*): (.*)$", text, flags=re.M))
    assert fields["command"] == (f"`python -m pyw8a8 bench --no-peers --isa scalar --shapes "
                                 f"'1,64,64;2,64,128' --rounds 1 --min-time 0.001 --record "
                                 f"{directory}`")
    assert fields["date"].startswith(today)
    assert fields["commit"] == record.source_commit()
    package = os.path.dirname(pyw8a8.__file__)
    if _tracked(package):  # run from a checkout: its HEAD, with -dirty for changes
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", fields["commit"])
        assert fields["commit"].startswith(_git(package, "rev-parse", "HEAD"))
    else:
        assert fields["commit"] == "unknown"
    assert fields["CPU"].startswith(record.cpu_model(record.cpuinfo_fields()))
    assert fields["CPU"].endswith(f"kind: {kind})")
    features = [k for k, v in pyw8a8.cpu_features().items() if v]
    assert fields["ISA features"].startswith(", ".join(features))
    assert fields["threads"].startswith(f"{pyw8a8.get_num_threads()} (")
    import platform
    assert fields["versions"].startswith(f"python {platform.python_version()}, numpy "
                                         f"{np.__version__}, pyw8a8 {pyw8a8.__version__}")
    # Another run the same day: a further section of the same file.
    assert record.write(directory, "| a | b |\n|---|---|\n| 1 | 2 |\n", "again") == path
    again = path.read_text()
    assert again.startswith(text) and again.count("\n## Run of ") == 2
    assert "\n- command: `again`\n" in again[len(text):]
    assert again.rstrip().endswith("| a | b |\n|---|---|\n| 1 | 2 |")


def test_the_record_names_the_variables_that_hold_libraries_to_an_isa(tmp_path, monkeypatch):
    """A run with every library held to AVX2 says so in its record; other variables, and
    Inductor's cache directory, which torch sets itself, stay out of it."""
    from pyw8a8.tools import record
    held = {"ATEN_CPU_CAPABILITY": "avx2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
            "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "OPENBLAS_CORETYPE": "Haswell", "PYW8A8_ISA": "avx2"}
    for name, value in held.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SOMETHING_ELSE", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/set-by-torch")
    text = record.write(tmp_path, "| a |\n|---|\n| 1 |\n", "bench").read_text()
    [line] = [line for line in text.splitlines() if line.startswith("- environment: ")]
    named = dict(item.split("=", 1) for item in line[len("- environment: "):].split())
    assert {k: named[k] for k in held} == held
    assert "SOMETHING_ELSE" not in named and "TORCHINDUCTOR_CACHE_DIR" not in named


def _tracked(package):
    try:
        return subprocess.run(["git", "-C", package, "ls-files", "--error-unmatch",
                               "__init__.py"], capture_output=True).returncode == 0
    except OSError:
        return False


def test_bench_record_refuses_a_directory_it_cannot_write_before_measuring(tmp_path, capsys):
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(SystemExit) as exit:
        bench.main(["--no-peers", "--record", str(taken)])
    assert exit.value.code == 2
    err = capsys.readouterr()
    assert "--record" in err.err and str(taken) in err.err and err.out == ""


def test_bench_help_documents_record(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    assert "--record DIR" in re.sub(r"\s+", " ", capsys.readouterr().out)
