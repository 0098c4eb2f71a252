"""``bench --torch --torch-models kvcache`` (pyw8a8/tools/torch_kv_bench.py): its options,
and its smallest run, the Llama-shaped model with one layer at 16 tokens of context (Gemma
3 270M's is the same code with another model: tests/pytorch/test_torch_bench_models.py
loads that model).  Speed is not asserted: the bench shows it."""
import re

import pytest

from pyw8a8.tools import bench


@pytest.mark.parametrize("option, message", [
    (["--kv-tokens", "0"], "--kv-tokens must be at least 1"),
    (["--kv-context", "0"], "--kv-context must be at least 1"),
    (["--kv-layers", "0"], "--kv-layers must be at least 1"),
    (["--kv-models", "llama,bert"], "unknown model bert"),
    (["--torch-models", "kvcache,gpt"], "unknown model gpt"),
])
def test_bad_options_are_refused_before_anything_runs(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--torch", "--torch-models", "kvcache"] + option
                   if option[0] != "--torch-models" else ["--torch"] + option)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_smallest_run_prints_both_caches_bytes_and_kl(capsys):
    pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
    pytest.importorskip("transformers", reason="needs transformers ('.[torch-model]')")
    status = bench.main(["--torch", "--torch-models", "kvcache", "--kv-models", "llama",
                         "--kv-context", "16", "--kv-tokens", "2", "--kv-layers", "1",
                         "--rounds", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 12 and cells[0] == "llama":
            rows[cells[3]] = cells
    assert list(rows) == ["default", "Int8Cache", "Int8Cache terms=1", "Int8Cache compiled"], out
    for cells in rows.values():
        assert cells[1:3] == ["1", "16"]
        assert float(re.match(r"(\S+) \(", cells[5]).group(1)) > 0  # decode tok/s
    assert rows["default"][6] == rows["default"][7] == "1.00x"
    # float32 K and V: 16 tokens x 8 heads x 64 x 4 bytes x 2; Int8Cache: 16 tokens of
    # room (its open page's) x 8 heads x (64 + 4) bytes x 2
    assert float(rows["default"][8]) == pytest.approx(16 * 8 * 64 * 4 * 2 / 2**20, rel=1e-3)
    for name in ("Int8Cache", "Int8Cache terms=1", "Int8Cache compiled"):
        assert float(rows[name][8]) == pytest.approx(16 * 8 * 68 * 2 / 2**20, rel=1e-3)
        kl_next, kl_mean = float(rows[name][9]), float(rows[name][10].split()[0])
        assert 0 <= kl_next < 0.01 and 0 <= kl_mean < 0.01, out
    assert all(float(cells[11]) < 0.05 for cells in rows.values()), out
    assert "compiled, the eager Int8Cache's greedy token at 3 of 3 positions" in out, out
