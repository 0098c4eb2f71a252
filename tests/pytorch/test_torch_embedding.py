"""pyw8a8.torch.quantize on a tied vocabulary: the embedding reads the LM head's int8 weight
(Int8Embedding), so the model holds one int8 copy of it.  Tiny random transformers models;
skipped, with the reason shown, where torch or transformers is missing."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
transformers = pytest.importorskip("transformers",
                                   reason="needs transformers (pip install '.[torch-model]')")

import pyw8a8.torch as pt  # noqa: E402
from pyw8a8.torch.embedding import Int8Embedding  # noqa: E402

from torch_helpers import tiny_gemma3, tiny_llama  # noqa: E402


def gemma(tied=True):
    return tiny_gemma3(tie_word_embeddings=tied)


def llama():
    return tiny_llama(seed=2, hidden_size=80, num_hidden_layers=1, vocab_size=100,
                      tie_word_embeddings=True)


@pytest.mark.parametrize("build", [gemma, llama], ids=["gemma3", "llama-k80"])
def test_a_tied_embedding_reads_the_head_s_int8_rows(build):
    model = build()
    q = pt.quantize(model)
    embedding = q.get_input_embeddings()
    assert isinstance(embedding, Int8Embedding) and embedding.head is q.lm_head
    assert q.pyw8a8_report.tied == [("model.embed_tokens", "lm_head")]
    assert "tied model.embed_tokens: its rows read from lm_head's int8" in str(q.pyw8a8_report)
    vocab, width = model.config.vocab_size, model.config.hidden_size
    # no float copy of the vocabulary is left, and the head's buffers are saved once
    assert not any(p.shape == (vocab, width) for p in q.parameters())
    assert not any("embed_tokens" in key for key in q.state_dict())
    ids = torch.tensor([[0, 5, 17, vocab - 1], [3, 3, 40, 16]])
    dequantized = torch.from_numpy(q.lm_head.packed("weight").dequantize())
    scale = getattr(model.model.embed_tokens, "embed_scale", torch.tensor(1.0))
    with torch.inference_mode():
        got, float_rows = embedding(ids), model.get_input_embeddings()(ids)
    torch.testing.assert_close(got, dequantized[ids] * scale, rtol=1e-5, atol=1e-6)
    assert (got - float_rows).abs().max() <= 0.02 * float_rows.abs().max()
    assert got.shape == (2, 4, width) and got.dtype == torch.float32
    for bad in (vocab, -1):  # as nn.Embedding, an id outside the vocabulary is refused
        with pytest.raises(IndexError, match=f"input_ids holds {bad}, outside the vocabulary"):
            embedding(torch.tensor([[1, bad]]))


def test_the_quantized_model_generates_compiles_and_copies_with_it():
    model = pt.quantize(gemma())
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        logits = model(ids).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        torch.testing.assert_close(compiled(ids).logits, logits, rtol=0, atol=1e-5)
        clone = copy.deepcopy(model)
        assert clone.get_input_embeddings().head is clone.lm_head
        assert torch.equal(clone(ids).logits, logits)
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 13)


def test_untied_models_and_bfloat16_keep_their_own_embedding_or_dtype():
    untied = pt.quantize(gemma(tied=False))
    assert type(untied.get_input_embeddings()).__name__ == "Gemma3TextScaledWordEmbedding"
    assert untied.pyw8a8_report.tied == []
    half = pt.quantize(gemma().to(torch.bfloat16))
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        rows = half.get_input_embeddings()(ids)
    assert rows.dtype == torch.bfloat16
    np.testing.assert_allclose(rows.float().numpy(), pt.quantize(gemma()).get_input_embeddings()(
        ids).numpy(), rtol=1e-2, atol=1e-2)


def test_a_mismatched_head_is_refused():
    head = pt.Linear(64, 96)
    with pytest.raises(ValueError, match="the embedding is 95 x 64, the head's weight 96 x 64"):
        Int8Embedding(head, torch.nn.Embedding(95, 64))
    with pytest.raises(TypeError, match="head must be a pyw8a8.torch.Linear"):
        Int8Embedding(torch.nn.Linear(64, 96), torch.nn.Embedding(96, 64))
