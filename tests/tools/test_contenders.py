"""The contenders of the bench's tables (pyw8a8/tools/contenders.py, the one registry):
the FFN block's, the peers', torch's layer, each built and run; the FFN and torch-layer
tables."""
import numpy as np
import pytest

import pyw8a8
from pyw8a8.tools import contenders, ffn_bench, peers


def test_numpy_gelu_tanh_times_matches_float64():
    """The numpy tanh-GELU of ``bench --ffn`` (float32, in place) against float64: within
    a few float32 roundings of the result, and of g*u where 1 + tanh(...) cancels (large
    negative g), as any float32 evaluation of this formula."""
    rng = np.random.default_rng(0)
    g = (rng.standard_normal((16, 64)) * 4).astype(np.float32)
    g[0, :4] = [0.0, -30.0, 30.0, -1e-3]
    u = rng.standard_normal((16, 64)).astype(np.float32)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    expected = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3))) * u64
    got = contenders.gelu_tanh_times(g, u)
    assert got is g and got.dtype == np.float32
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(got - expected) <= 8 * eps * (np.abs(expected) + np.abs(g64 * u64)))


def test_ffn_contenders_return_the_block_and_are_timed():
    """Each FFN contender returns the (M, N) block; pyw8a8's unfused and fused blocks are
    the same products through numpy's tanh-GELU and the kernels' (within the float32
    roundings of the formula, see above); the table gives every time and ratio."""
    names = contenders.ffn_names()
    for name in names:
        assert tuple(contenders.build_contender("ffn", name, 3, 64, 32)().shape) == (3, 32)
    x, wg, wu = contenders.ffn_data(3, 64, 32)
    pg, pu = (pyw8a8.pack_weight(w, rotate=False) for w in (wg, wu))
    g, u = pyw8a8.matmul_pair(x, pg, pu)
    gu = np.abs(g.astype(np.float64) * u)
    unfused = contenders.build_contender("ffn", "pyw8a8 unfused", 3, 64, 32)()
    np.testing.assert_array_equal(unfused, contenders.gelu_tanh_times(g, u))
    fused = contenders.build_contender("ffn", "pyw8a8 fused", 3, 64, 32)()
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(fused - unfused.astype(np.float64)) <= 8 * eps * (np.abs(unfused) + gu))
    [(shape, times)] = ffn_bench.run([(3, 64, 32)], names, rounds=1, min_time=0.001)
    assert shape == (3, 64, 32) and set(times) == set(names)
    assert all(t > 0 for t in times.values())


def test_ffn_table_has_an_xnnpack_column_where_it_was_timed():
    rows = [((64, 640, 2048), {"numpy f32": 4e-3, "pyw8a8 unfused": 2e-3, "pyw8a8 fused": 1e-3,
                               "xnnpack int8": 2e-3})]
    header, _, line = ffn_bench.format_rows(rows)
    assert "| xnnpack int8 ms |" in header and "| xnnpack vs numpy |" in header
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[6] == "2.000" and cells[9] == "2.00x"


def test_ffn_table_reports_ratios_to_numpy_and_the_fusion_gain():
    rows = [((64, 640, 2048), {"numpy f32": 4e-3, "pyw8a8 unfused": 2e-3, "pyw8a8 fused": 1e-3,
                               "torch fbgemm": 3e-3, "torch x86": 2.5e-3})]
    lines = ffn_bench.format_rows(rows)
    assert lines[0] == ("| M | K | N | numpy f32 ms | pyw8a8 unfused ms | pyw8a8 fused ms | "
                        "torch int8 ms | unfused vs numpy | fused vs numpy | torch vs numpy | "
                        "fused vs unfused |")
    assert lines[2] == ("| 64 | 640 | 2048 | 4.000 | 2.000 | 1.000 | 2.500 (x86) | 2.00x | "
                        "4.00x | 1.60x | 2.00x |")


def test_xnnpack_runs_its_own_fully_connected_layer_close_to_float():
    """The XNNPACK contender is LiteRT's one-operator model delegated to XNNPACK (checked
    when it is built), and its product is the int8 one: close to float, not equal."""
    if not peers.xnnpack_available():
        pytest.skip(f"needs LiteRT ({peers.XNNPACK_INSTALL})")
    assert "xnnpack int8" in contenders.contender_names(["avx2"])
    x, w = contenders.shape_data(3, 200, 48)
    y = contenders.build_contender("product", "xnnpack int8", 3, 200, 48)()
    expected = x @ w.T
    error = np.abs(y - expected).max() / np.sqrt(np.mean(expected ** 2))
    assert y.shape == (3, 48) and 0 < error < 0.05


def test_the_torchao_contender_is_its_int8_linear_compiled_and_names_its_kernel():
    pytest.importorskip("torchao", reason="needs torchao (pip install '.[torchao]')")
    x, w = contenders.shape_data(8, 128, 64)
    run = peers.torchao_matmul(x, w)
    y = run().numpy()
    ref = x @ w.T
    assert np.abs(y - ref).max() < 0.05 * np.abs(ref).max()
    assert run.kernel in ("amx", "vnni", "oneDNN qlinear", "_int_mm")
    assert contenders.TORCHAO in contenders.contender_names(["avx2"])


def test_the_inductor_kernel_is_read_from_the_generated_code():
    named = {"_tile_loadd(...)": "amx", "_mm512_dpbusd_epi32(...)": "vnni",
             "torch.ops.onednn.qlinear_pointwise.tensor(...)": "oneDNN qlinear",
             "extern_kernels._int_mm(buf0, arg1, out=buf2)": "_int_mm", "cpp_fused_add": "?"}
    for code, kernel in named.items():
        assert peers.inductor_int8_kernel(code) == kernel, code


def test_torch_layer_times_the_layer_eager_and_compiled():
    """bench --torch-layer: each contender in its own process, one row per shape."""
    pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
    from pyw8a8.tools import torch_layer_bench
    lines = torch_layer_bench.run([(1, 64, 32)], rounds=1, min_time=0.01, nthreads=1)
    header, _, row = lines[:3]
    for name in contenders.torch_layer_names():
        assert f"| {name} (us) |" in header
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["1", "64", "32"]
    assert all(float(c.rstrip("x")) for c in cells[3:])
    kernels = next(line for line in lines if line.startswith("Kernels: "))
    assert "pyw8a8.torch: " in kernels


def test_torch_layer_derives_a_call_inside_a_compiled_graph_and_the_target():
    """A layer's call in a graph is the 9-call graph less the one-call graph, over the 8
    calls it adds (Dynamo's entry counted once); the target is 1.25 x matmul + 3 us."""
    from pyw8a8.tools import torch_layer_bench as tlb
    c = contenders
    names = [c.MATMUL, c.EAGER, c.COMPILED, c.COMPILED_GRAPH, c.TORCHAO, c.TORCHAO_GRAPH]
    us = {c.MATMUL: 8.0, c.EAGER: 12.5, c.COMPILED: 30.0, c.COMPILED_GRAPH: 110.0,
          c.TORCHAO: 32.0, c.TORCHAO_GRAPH: 128.0}
    lines = tlb.format_table([((1, 64, 32), {k: v * 1e-6 for k, v in us.items()})], names, {})
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = dict(zip(header, (c.strip() for c in lines[2].strip("|").split("|"))))
    assert row["pyw8a8.torch - matmul (us)"] == "+4.5"
    assert row["pyw8a8.torch compiled, in a graph (us)"] == "10.0"  # (110 - 30) / 8
    assert row["torchao inductor, in a graph (us)"] == "12.0"  # (128 - 32) / 8
    assert row["target: 1.25 x matmul + 3 us"] == "13.0"
    assert row["in a graph, pyw8a8.torch vs torchao"] == "1.20x"
    without_torchao = tlb.format_table([((1, 64, 32), {k: v * 1e-6 for k, v in us.items()})],
                                       names[:4], {})
    assert "torchao" not in without_torchao[0]
