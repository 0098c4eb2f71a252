"""``bench --torch --torch-models checkpoint`` (pyw8a8/tools/torch_checkpoint_bench.py) end
to end on a tiny Gemma 3 of random weights (the bench's is Gemma 3 270M): each route in a
process of its own, the same bits on every route, the int8 checkpoint's bytes within the
target (a property of the format, not of the machine's speed).  Skipped without torch or
transformers."""
import re
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
pytest.importorskip("transformers", reason="needs transformers (pip install '.[torch-model]')")

from pyw8a8.tools import torch_checkpoint_bench as bench  # noqa: E402


def save_tiny(directory):
    """A tiny Gemma 3 with Gemma's tied vocabulary (the bench's prompt holds its ids),
    saved as a float transformers checkpoint: run in the bench's process for it."""
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, vocab_size=262144, tie_word_embeddings=True)
    model = transformers.Gemma3ForCausalLM(config).eval()
    model.save_pretrained(Path(directory) / "float")


def test_every_route_gives_the_w8a8config_load_s_bits_and_the_checkpoint_is_int8(capsys):
    rows, sizes = bench.run(progress=print, save=f"{__file__}:save_tiny")
    assert [r["route"] for r in rows] == list(bench.ROUTES)
    for row in rows:
        assert row["same tokens"] and row["same logits"], row
        assert row["seconds"] > 0 and row["resident"] > 0 and row["peak"] >= row["resident"]
    # the packed weights: a quarter of float32's, plus the norms and the headers
    assert sizes["int8"] <= 0.30 * sizes["float"], sizes
    lines = bench.format_table(rows, sizes)
    ratio = float(re.search(r"save_pretrained wrote \d+ MB \((\S+)x\)", lines[1]).group(1))
    assert ratio <= 0.30
    assert sum(line.startswith("|") for line in lines) == 2 + len(rows)  # header, rule
