"""torch.ops.pyw8a8.float_attention: attention over float32 keys and values on pyw8a8's fused
kernel, against a float64 reference and SDPA, and as the attention of a transformers
encoder that pyw8a8 quantized.  Skipped, with the reason shown, where torch (or, for the
model tests, transformers) is missing."""
import numpy as np
import pytest

import pyw8a8

from torch_helpers import COMPILE_MODES, OpsCalled, torch

pt = pytest.importorskip("pyw8a8.torch")

F = torch.nn.functional


def attend(q, k, v, mask=None, scale=None, causal=False):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    with torch.inference_mode():
        return torch.ops.pyw8a8.float_attention(q, k, v, mask, scale, causal)


def reference(q, k, v, mask=None, scale=None, causal=False):
    """The attention in float64, a row that sees no key zeros (as SDPA gives)."""
    q, k, v = (t.double() for t in (q, k, v))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    seen = torch.ones_like(scores, dtype=torch.bool)
    if causal:
        seen &= torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    if mask is not None and mask.dtype == torch.bool:
        seen = seen & mask
    elif mask is not None:
        scores = scores + mask.double()
    scores = scores.masked_fill(~seen, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    weights = (scores - top.nan_to_num(neginf=0.0)).exp()
    out = (weights @ v) / weights.sum(-1, keepdim=True)
    return out.nan_to_num(nan=0.0).float()


def heads(b, h, n, d, seed, layout="bhnd"):
    """(b, h, n, d) float32; "bnhd": a view of (b, n, h, d) memory, as transformers has it."""
    g = torch.Generator().manual_seed(seed)
    if layout == "bnhd":
        return torch.randn(b, n, h, d, generator=g).transpose(1, 2)
    return torch.randn(b, h, n, d, generator=g)


def padding_mask(lengths, n, queries=None):
    """bool (b, 1, queries, n): row i of a batch sees its first lengths[i] keys."""
    keys = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return keys[:, None, None, :].expand(len(lengths), 1, queries or n, n)


CASES = {
    "padded sentences": dict(b=4, hq=3, hkv=3, nq=13, nk=13, d=32, mask="padding"),
    "no mask": dict(b=2, hq=2, hkv=2, nq=5, nk=37, d=20, mask=None),
    "gqa, additive": dict(b=2, hq=4, hkv=2, nq=9, nk=70, d=64, mask="additive"),
    "holes": dict(b=2, hq=2, hkv=1, nq=6, nk=45, d=40, mask="holes"),
    "per-head mask": dict(b=1, hq=3, hkv=3, nq=7, nk=33, d=16, mask="per head"),
    "causal": dict(b=2, hq=2, hkv=1, nq=11, nk=11, d=72, mask="causal"),
}


def case_inputs(c, seed=0, layout="bhnd"):
    q = heads(c["b"], c["hq"], c["nq"], c["d"], seed, layout)
    k = heads(c["b"], c["hkv"], c["nk"], c["d"], seed + 1, layout)
    v = heads(c["b"], c["hkv"], c["nk"], c["d"], seed + 2, layout)
    g = torch.Generator().manual_seed(seed + 3)
    kind, mask, causal = c["mask"], None, False
    if kind == "padding":
        mask = padding_mask([13, 4, 1, 9][:c["b"]], c["nk"])
    elif kind == "additive":
        mask = torch.randn(c["b"], 1, c["nq"], c["nk"], generator=g)
        mask[0, 0, 2, :] = float("-inf")  # a row that sees nothing
        mask[1, 0, :, 50:] = float("-inf")
    elif kind == "holes":
        mask = torch.rand(c["b"], 1, 1, c["nk"], generator=g) > 0.4
    elif kind == "per head":
        mask = torch.rand(c["b"], c["hq"], c["nq"], c["nk"], generator=g) > 0.3
    elif kind == "causal":
        causal = True
    return q, k, v, mask, causal


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_the_attention_is_the_float64_attention_within_float32_rounding(name, layout):
    q, k, v, mask, causal = case_inputs(CASES[name], layout=layout)
    got = attend(q, k, v, mask, causal=causal)
    want = reference(q, k, v, mask, causal=causal)
    assert got.shape == q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)
    if k.shape[1] == q.shape[1]:  # SDPA without enable_gqa
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        torch.testing.assert_close(got, sdpa, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("shapes", [((1, 2, 3, 1), (1, 2, 5, 1), None),
                                    ((1, 2, 3, 8), (1, 2, 1, 8), (1, 1, 3, 1)),
                                    ((2, 2, 1, 4), (2, 1, 1, 4), (2, 1, 1, 1))],
                         ids=["one value a head", "one key", "one query and key"])
def test_dimensions_of_one_value_are_taken(shapes):
    qs, ks, ms = shapes
    q, k, v = heads(*qs, 0), heads(*ks, 1), heads(*ks, 2)
    mask = None if ms is None else torch.ones(ms, dtype=torch.bool).expand(
        qs[0], 1, qs[2], ks[2])
    torch.testing.assert_close(attend(q, k, v, mask), reference(q, k, v, mask),
                               atol=2e-6, rtol=2e-5)


def test_the_output_is_laid_out_as_transformers_returns_it():
    q, k, v, mask, _ = case_inputs(CASES["padded sentences"])
    out = attend(q, k, v, mask)
    assert out.transpose(1, 2).is_contiguous()


def test_a_row_that_sees_no_key_gets_zeros_as_in_sdpa():
    q, k, v = heads(1, 2, 3, 8, 0), heads(1, 2, 5, 8, 1), heads(1, 2, 5, 8, 2)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[0, 0, 1] = False
    out = attend(q, k, v, mask)
    assert (out[:, :, 1] == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_a_sentence_s_bits_do_not_depend_on_its_batch_or_the_threads():
    """A row reads its own keys only, each sum in one order: alone, or padded in a batch
    of longer sentences, on one thread or two, it gets the same bits."""
    q, k, v = heads(3, 4, 40, 32, 0), heads(3, 4, 40, 32, 1), heads(3, 4, 40, 32, 2)
    lengths = [40, 7, 23]
    batch = attend(q, k, v, padding_mask(lengths, 40))
    for i, n in enumerate(lengths):
        alone = attend(q[i:i + 1, :, :n], k[i:i + 1, :, :n], v[i:i + 1, :, :n])
        assert torch.equal(batch[i:i + 1, :, :n], alone)
    before = pyw8a8.get_num_threads()
    try:
        pyw8a8.set_num_threads(1)
        one = attend(q, k, v, padding_mask(lengths, 40))
    finally:
        pyw8a8.set_num_threads(before)
    assert torch.equal(batch, one)


def test_a_query_s_bits_do_not_depend_on_the_queries_beside_it():
    """Queries are computed in tiles of several rows over the keys any of them sees; a row
    of a tile whose neighbours see other keys gets the bits it gets alone."""
    q, k, v = heads(1, 2, 9, 24, 0), heads(1, 2, 50, 24, 1), heads(1, 2, 50, 24, 2)
    g = torch.Generator().manual_seed(4)
    mask = torch.zeros(1, 2, 9, 50, dtype=torch.bool)
    for h in range(2):
        for i in range(9):
            lo = int(torch.randint(0, 30, (1,), generator=g))
            mask[0, h, i, lo:lo + int(torch.randint(1, 20, (1,), generator=g))] = True
    together = attend(q, k, v, mask)
    for i in range(9):
        alone = attend(q[:, :, i:i + 1], k, v, mask[:, :, i:i + 1])
        assert torch.equal(together[:, :, i:i + 1], alone)


def test_bad_input_is_refused_naming_the_argument():
    q, k, v = heads(1, 2, 3, 8, 0), heads(1, 2, 5, 8, 1), heads(1, 2, 5, 8, 2)
    with pytest.raises(TypeError, match="query must be float32"):
        attend(q.double(), k, v)
    with pytest.raises(TypeError, match="value must be float32"):
        attend(q, k, v.half())
    with pytest.raises(ValueError, match="key must be \\(batch, heads, tokens, head_dim\\)"):
        attend(q, k[0], v)
    with pytest.raises(ValueError, match="key and value must be"):
        attend(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match="key's 2 heads must divide the query's 3"):
        attend(heads(1, 3, 3, 8, 0), k, v)
    with pytest.raises(TypeError, match="mask must be a CPU bool or float32"):
        attend(q, k, v, torch.ones(1, 1, 3, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="mask of shape \\(1, 1, 3, 4\\) does not broadcast"):
        attend(q, k, v, torch.ones(1, 1, 3, 4, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="inference_mode"):
        torch.ops.pyw8a8.float_attention(q.requires_grad_(), k, v, None, 0.5, False)


@pytest.mark.parametrize("mode", list(COMPILE_MODES))
def test_compiled_it_is_one_call_with_the_eager_bits(mode):
    patches, kwargs = COMPILE_MODES[mode]
    q, k, v, mask, _ = case_inputs(CASES["padded sentences"], layout="bnhd")

    def block(q, k, v, mask):
        out = torch.ops.pyw8a8.float_attention(q, k, v, mask, 0.25, False)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1) * 2.0

    torch._dynamo.reset()
    with torch._inductor.config.patch(patches), torch.inference_mode():
        eager = block(q, k, v, mask)
        compiled = torch.compile(block, fullgraph=True, **kwargs)(q, k, v, mask)
    assert torch.equal(compiled, eager)


# ---- as a transformers encoder's attention ----

def _transformers():
    return pytest.importorskip("transformers",
                               reason="needs transformers (pip install '.[torch-model]')")


def bert():
    transformers = _transformers()
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     vocab_size=120, attn_implementation="sdpa")
    return transformers.BertModel(config).eval()


def batch(n=3, length=12):
    torch.manual_seed(5)
    ids = torch.randint(1, 120, (n, length))
    mask = torch.ones(n, length, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 9:] = 0
    return ids, mask


def test_quantize_gives_an_encoder_pyw8a8_s_float_attention():
    model = pt.quantize(bert())
    assert model.config._attn_implementation == "pyw8a8"
    ids, mask = batch()
    with torch.inference_mode(), OpsCalled() as ops:
        ours = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert ops.names.count("pyw8a8.float_attention") == 2  # one a layer
    assert "aten._scaled_dot_product_flash_attention_for_cpu" not in ops.names
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        sdpa = model(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(ours[real], sdpa[real], atol=1e-4, rtol=1e-4)


def test_an_encoder_s_padding_mask_is_one_row_a_batch_row():
    """Not expanded to (batch, 1, queries, keys): compiled, Inductor would write that out."""
    transformers = _transformers()
    from transformers.masking_utils import create_bidirectional_mask
    model = pt.quantize(bert())
    ids, mask = batch()
    embeds = torch.zeros(3, 12, 64)
    made = create_bidirectional_mask(config=model.config, inputs_embeds=embeds,
                                     attention_mask=mask)
    assert made.shape == (3, 1, 1, 12) and made.dtype == torch.bool
    assert torch.equal(made[:, 0, 0], mask.bool())
    # nothing padded: no mask, as sdpa's (eager)
    assert create_bidirectional_mask(config=model.config, inputs_embeds=embeds,
                                     attention_mask=torch.ones(3, 12, dtype=torch.long)) is None
    # a decoder's masks are sdpa's own
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96,
                                      attn_implementation="sdpa")
    llama = pt.quantize(transformers.LlamaForCausalLM(config).eval())
    from transformers.masking_utils import create_causal_mask
    causal = create_causal_mask(config=llama.config, inputs_embeds=torch.zeros(1, 6, 64),
                                attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1]]),
                                past_key_values=None, position_ids=torch.arange(6)[None])
    assert causal.shape == (1, 1, 6, 6)


def test_a_model_inside_another_module_gets_it_too():
    """A SentenceTransformer holds its transformers model as a submodule."""
    wrapped = torch.nn.Sequential(torch.nn.ModuleDict({"auto_model": bert()}))
    q = pt.quantize(wrapped)
    assert q[0]["auto_model"].config._attn_implementation == "pyw8a8"
    assert q.pyw8a8_report.attention == ("sdpa", "pyw8a8")


def test_a_decoder_keeps_sdpa():
    transformers = _transformers()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96,
                                      attn_implementation="sdpa")
    model = pt.quantize(transformers.LlamaForCausalLM(config).eval())
    with torch.inference_mode(), OpsCalled() as ops:
        model(input_ids=torch.randint(0, 96, (1, 6)))
    assert "pyw8a8.float_attention" not in ops.names


def test_a_compiled_encoder_runs_it_in_one_graph():
    model = pt.quantize(bert())
    ids, mask = batch()
    with torch.inference_mode():
        eager = model(input_ids=ids, attention_mask=mask).last_hidden_state
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(model)(input_ids=ids, attention_mask=mask)
        compiled = torch.compile(model, fullgraph=True)(input_ids=ids,
                                                        attention_mask=mask).last_hidden_state
    assert explanation.graph_break_count == 0, explanation.break_reasons
    real = mask.bool()
    torch.testing.assert_close(compiled[real], eager[real], atol=1e-5, rtol=1e-5)
    assert np.isfinite(compiled.numpy()).all()


def test_an_aoti_package_of_an_encoder_runs_it(tmp_path):
    model = pt.quantize(bert())
    ids, mask = batch()

    class Encoder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, mask):
            return self.model(input_ids=ids, attention_mask=mask).last_hidden_state

    encoder = Encoder(model)
    with torch.inference_mode():
        eager = encoder(ids, mask)
        program = torch.export.export(encoder, (ids, mask))
        calls = [n for n in program.graph.nodes
                 if n.target is torch.ops.pyw8a8.float_attention.default]
        assert len(calls) == 2
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp_path / "encoder.pt2"))
        got = torch._inductor.aoti_load_package(path)(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], eager[real], atol=1e-5, rtol=1e-5)
