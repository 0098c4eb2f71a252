"""pyw8a8.torch.Int8Cache: transformers' KV cache in int8 and pyw8a8's int8 attention over
it, on tiny random Llama (GQA) and Gemma 3 (a sliding-window layer, GQA, softcapping)
models built from configs.  Skipped, with the reason shown, where torch or transformers
is missing."""
import numpy as np
import pytest

import pyw8a8

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
transformers = pytest.importorskip("transformers",
                                   reason="needs transformers (pip install '.[torch-model]')")

import pyw8a8.torch as pt  # noqa: E402
from pyw8a8.torch import _int8_attention  # noqa: E402
from pyw8a8.torch.kv_cache import Int8Layer  # noqa: E402


def llama(attention="sdpa"):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96,
                                      attn_implementation=attention)
    return transformers.LlamaForCausalLM(config).eval()


def gemma(window=6):
    torch.manual_seed(1)
    config = transformers.Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=96, sliding_window=window,
        layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=30.0,
        query_pre_attn_scalar=32, attn_implementation="sdpa")
    return transformers.Gemma3ForCausalLM(config).eval()


def generate(model, ids, cache=None, **kwargs):
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, cache=cache, **kwargs)
    return out.sequences, torch.stack(out.logits)


@pytest.mark.parametrize("build, probabilities", [(llama, "int8"), (gemma, "int8"),
                                                  (gemma, "int8x2")],
                         ids=["llama", "gemma3", "gemma3-int8x2"])
def test_generate_with_the_int8_cache_gives_the_default_cache_s_tokens(build, probabilities):
    model = pt.quantize(build())
    assert model.config._attn_implementation == "pyw8a8"
    ids = torch.randint(0, 96, (1, 11), generator=torch.Generator().manual_seed(2))
    expected, expected_logits = generate(model, ids)
    cache = pt.Int8Cache(model.config, probabilities=probabilities)
    got, logits = generate(model, ids, cache)
    assert got.tolist() == expected.tolist()
    scale = expected_logits.abs().max()
    assert (logits - expected_logits).abs().max() <= 0.05 * scale
    assert cache.get_seq_length() == 11 + 5


def test_a_left_padded_batch_decodes_as_with_the_default_cache():
    model = pt.quantize(llama())
    ids = torch.randint(1, 96, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # the second prompt is 5 tokens, padded on the left
    expected, expected_logits = generate(model, ids, attention_mask=mask)
    got, logits = generate(model, ids, pt.Int8Cache(model.config), attention_mask=mask)
    assert got.tolist() == expected.tolist()
    assert (logits - expected_logits).abs().max() <= 0.05 * expected_logits.abs().max()


@pytest.mark.parametrize("build", [llama, gemma], ids=["llama", "gemma3"])
def test_prefill_then_decode_equals_one_prefill_of_the_whole_sequence(build):
    model = pt.quantize(build())
    ids = torch.randint(0, 96, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        whole = model(ids, cache=pt.Int8Cache(model.config)).logits[0]
        cache = pt.Int8Cache(model.config)
        steps = [model(ids[:, :10], cache=cache).logits[0]]
        steps += [model(ids[:, i:i + 1], cache=cache).logits[0] for i in range(10, 16)]
    torch.testing.assert_close(torch.cat(steps), whole, rtol=0, atol=1e-4)


def test_a_model_with_the_default_cache_computes_what_it_did_before():
    for build, attention in ((llama, "sdpa"), (lambda: llama("eager"), "eager")):
        model = pt.quantize(build())
        assert model.pyw8a8_report.attention == (attention, pt.attention.ATTENTION_NAMES[attention])
        assert "int8 with a pyw8a8.torch.Int8Cache" in str(model.pyw8a8_report)
        ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(5))
        with torch.inference_mode():
            ours = model(ids).logits
            model.set_attn_implementation(attention)
            before = model(ids).logits
        assert torch.equal(ours, before)


def test_eager_models_and_models_pyw8a8_did_not_quantize_run_on_it():
    eager = pt.quantize(llama("eager"))
    assert eager.config._attn_implementation == "pyw8a8_eager"
    ids = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(6))
    assert generate(eager, ids, pt.Int8Cache(eager.config))[0].tolist() == \
        generate(eager, ids)[0].tolist()
    float_model = pt.enable_int8_attention(llama())
    assert float_model.config._attn_implementation == "pyw8a8"
    assert generate(float_model, ids, pt.Int8Cache(float_model.config))[0].tolist() == \
        generate(float_model, ids)[0].tolist()


def _filled_layer(tokens=37, heads=2, head_dim=64, window=None, seed=7):
    layer = Int8Layer(heads, head_dim, _int8_attention.rotation_block(head_dim), 0, window)
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(2, heads, tokens, head_dim, generator=g)
    keys[..., 5] *= 20  # an outlier channel, which the rotation spreads
    values = torch.randn(2, heads, tokens, head_dim, generator=g)
    return layer, layer.update(keys, values), keys, values


def test_the_integer_products_equal_an_int64_reference():
    layer, (keys, values), _, _ = _filled_layer()
    cached = getattr(keys, _int8_attention.MARK)
    g = torch.Generator().manual_seed(8)
    queries_t = torch.randint(-127, 128, (2, 2, 64, 6), dtype=torch.int8, generator=g)
    scores = _int8_attention.int8_products(keys, queries_t)
    assert scores.dtype == torch.int32
    assert torch.equal(scores.long(), keys.long() @ queries_t.long())
    probs_t = torch.randint(-127, 128, (2, 2, 37, 6), dtype=torch.int8, generator=g)
    sums = _int8_attention.int8_products(cached.values_t, probs_t)
    assert torch.equal(sums.long(), values.transpose(-1, -2).long() @ probs_t.long())
    # the stored values are the int8 rows of the float ones: |v - v8 * scale| <= scale / 2
    assert keys.dtype == values.dtype == torch.int8 and keys.abs().max() <= 127


def test_the_attention_is_float_attention_over_the_dequantized_cache():
    layer, (keys, values), float_keys, float_values = _filled_layer()
    cached = getattr(keys, _int8_attention.MARK)
    query = torch.randn(2, 4, 3, 64, generator=torch.Generator().manual_seed(9))
    got = _int8_attention.attend(query, keys, cached._replace(probabilities="int8"), None,
                                 0.125, None)
    # float64 attention over the stored int8 keys and values and the int8 queries,
    # dequantized (P alone is not quantized), causal and aligned to the last token; GQA
    # by repeating
    k = (keys.double() * cached.key_scales.double().unsqueeze(-1)).repeat_interleave(2, 1)
    v = (values.double() * cached.value_scales.double().unsqueeze(-1)).repeat_interleave(2, 1)
    q8, q_scales = _int8_attention.quantize_rows(query, cached.block, cached.seed)
    q = q8.double() * q_scales.double().unsqueeze(-1)
    scores = (q @ k.transpose(-1, -2)) * 0.125
    scores += torch.full((3, 37), float("-inf"), dtype=torch.float64).triu(35)
    expected = (torch.softmax(scores, -1) @ v).transpose(1, 2)
    error = (got.double() - expected).abs().max()
    assert error <= 0.02 * expected.abs().max()
    # P as two int8 rows, the second its rounding error: about 15 bits
    finer = _int8_attention.attend(query, keys, cached._replace(probabilities="int8x2"),
                                   None, 0.125, None)
    assert (finer.double() - expected).abs().max() <= min(error / 10,
                                                          2e-4 * expected.abs().max())
    # and close to attention over the float keys and values themselves
    exact = torch.nn.functional.scaled_dot_product_attention(
        query, float_keys.repeat_interleave(2, 1), float_values.repeat_interleave(2, 1),
        is_causal=False, attn_mask=scores[0, 0].isfinite(), scale=0.125).transpose(1, 2)
    assert (got - exact).abs().max() <= 0.05 * exact.abs().max()


def test_the_rotation_keeps_q_dot_k_and_spreads_an_outlier():
    for head_dim, block in ((64, 64), (256, 256), (80, 16), (24, 0)):
        assert _int8_attention.rotation_block(head_dim) == block
        if not block:
            continue  # no power-of-two block from 16 divides 24: such keys are not rotated
        q, k = torch.randn(2, 5, head_dim, generator=torch.Generator().manual_seed(head_dim))
        k[:, 3] *= 30
        rq, rk = (torch.from_numpy(pyw8a8.rotate(t.numpy(), block=block, seed=3)) for t in (q, k))
        torch.testing.assert_close(rq @ rk.T, q @ k.T, atol=1e-3, rtol=1e-5)
        assert rk.abs().amax(-1).max() < k.abs().amax(-1).max() / 2
        # the cache's quantizer rotates as pyw8a8.rotate does, fused
        k8, scales = _int8_attention.quantize_rows(k, block, 3)
        torch.testing.assert_close(k8.float() * scales[:, None], rk, rtol=0,
                                   atol=float(scales.max()) / 2 + 1e-6)


def test_a_sliding_layer_keeps_its_window_and_gives_the_dynamic_layer_s_sizes():
    from transformers.cache_utils import DynamicSlidingWindowLayer
    layer, ours, _, _ = _filled_layer(tokens=5, window=8)
    theirs = DynamicSlidingWindowLayer(sliding_window=8)
    theirs.update(torch.zeros(2, 2, 5, 64), torch.zeros(2, 2, 5, 64))
    g = torch.Generator().manual_seed(10)
    for step in range(100):
        n = 3 if step == 50 else 1
        assert layer.get_mask_sizes(n) == theirs.get_mask_sizes(n)
        k, v = torch.randn(2, 2, n, 64, generator=g), torch.randn(2, 2, n, 64, generator=g)
        keys, values = layer.update(k, v)
        expected, _ = theirs.update(k, v)
        assert keys.shape == values.shape == expected.shape
        assert layer._end - layer._start == min(7, layer.get_seq_length())  # window - 1
        assert layer.capacity <= 64
    assert layer.get_seq_length() == theirs.get_seq_length() == 5 + 99 + 3


def test_a_sliding_layer_returns_a_long_prefill_whole_then_keeps_its_window():
    layer, (keys, values), float_keys, _ = _filled_layer(tokens=300, window=8)
    assert keys.shape[2] == values.shape[2] == 300  # the prefill's queries see them all
    assert layer.capacity == 64  # then two windows' room, in whole 64s, not 300 tokens'
    kept, _ = layer.update(*torch.zeros(2, 2, 2, 1, 64))
    # the last 7 of the prefill, unchanged by the move, and the new token
    assert torch.equal(kept[:, :, :7], keys[:, :, -7:]) and kept.shape[2] == 8
    assert layer.get_seq_length() == 301


def test_appending_writes_in_place_and_grows_by_doubling():
    layer, (keys, _), _, _ = _filled_layer(tokens=3)
    first = keys.clone()
    pointers, capacities = set(), []
    g = torch.Generator().manual_seed(11)
    for _ in range(300):
        keys, _ = layer.update(*torch.randn(2, 2, 2, 1, 64, generator=g))
        pointers.add(keys.data_ptr())
        capacities.append(layer.capacity)
    assert capacities[0] == 64 and layer.capacity == 512
    assert len(pointers) == 4  # 64 -> 128 -> 256 -> 512: a new buffer per doubling
    assert torch.equal(keys[:, :, :3], first)  # the first tokens carried along unchanged
    assert keys.shape[2] == layer.get_seq_length() == 303


def test_nbytes_counts_the_int8_buffers_and_their_scales():
    model = pt.quantize(gemma())
    cache = pt.Int8Cache(model.config)
    assert cache.nbytes == 0
    with torch.inference_mode():
        model(torch.arange(40).unsqueeze(0), cache=cache)
    # per layer, batch 1, 2 KV heads of 32: keys and values 32 bytes a token, scales 4 each
    per_token = 2 * (2 * 32 + 2 * 4)
    assert cache.nbytes == sum(layer.capacity for layer in cache.layers) * per_token
    # 40 tokens and an eighth more, in whole 64s; the sliding layer keeps about two windows
    assert [layer.capacity for layer in cache.layers] == [64, 64]
    float_cache = transformers.DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.arange(40).unsqueeze(0), cache=float_cache)
    float_bytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in float_cache.layers)
    assert float_bytes == (5 + 40) * 2 * 2 * 32 * 4  # the sliding layer keeps 5


def test_bad_states_are_refused_naming_what_is_wrong():
    layer = Int8Layer(2, 64, 0, 0)
    with pytest.raises(ValueError, match=r"2 KV heads"):
        layer.update(torch.zeros(1, 3, 4, 64), torch.zeros(1, 3, 4, 64))
    with pytest.raises(ValueError, match="64"):
        layer.update(torch.zeros(1, 2, 4, 32), torch.zeros(1, 2, 4, 32))
    with pytest.raises(TypeError, match="key_states must be float32.*torch.int32"):
        layer.update(torch.zeros(1, 2, 4, 64, dtype=torch.int32), torch.zeros(1, 2, 4, 64))
    with pytest.raises(ValueError, match="value_states is on meta"):
        layer.update(torch.zeros(1, 2, 4, 64), torch.zeros(1, 2, 4, 64, device="meta"))
    bad = torch.zeros(1, 2, 4, 64)
    bad[0, 1, 2, 3] = float("inf")
    with pytest.raises(ValueError, match=r"key_states has a non-finite .*\(index \(0, 1, 2\)"):
        layer.update(bad, torch.zeros(1, 2, 4, 64))
    with pytest.raises(ValueError, match="differ in shape"):
        layer.update(torch.zeros(1, 2, 4, 64), torch.zeros(1, 2, 5, 64))
    layer.update(torch.zeros(1, 2, 4, 64), torch.zeros(1, 2, 4, 64))
    with pytest.raises(ValueError, match="batch 2"):
        layer.update(torch.zeros(2, 2, 1, 64), torch.zeros(2, 2, 1, 64))


def test_models_and_configs_it_cannot_serve_are_refused_naming_why():
    model = llama()  # sdpa, not pyw8a8's attention
    with pytest.raises(RuntimeError, match="attention implementation is 'sdpa'"):
        with torch.inference_mode():
            model(torch.arange(4).unsqueeze(0), cache=pt.Int8Cache(model.config))
    with pytest.raises(TypeError, match="PreTrainedModel"):
        pt.enable_int8_attention(torch.nn.Linear(2, 2))
    model.config._attn_implementation_internal = "flex_attention"
    with pytest.raises(ValueError, match="'flex_attention'; pyw8a8's int8 attention wraps"):
        pt.enable_int8_attention(model)
    with pytest.raises(ValueError, match="encoder-decoder"):
        pt.Int8Cache(transformers.T5Config())
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4)
    config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ValueError, match="layer 1 of the model is 'linear_attention'"):
        pt.Int8Cache(config)
    with pytest.raises(TypeError, match="config must be"):
        pt.Int8Cache({"num_hidden_layers": 2})
    with pytest.raises(ValueError, match="probabilities must be one of 'int8', 'int8x2'"):
        pt.Int8Cache(config, probabilities="int4")
    with pytest.raises(ValueError, match="seed"):
        pt.Int8Cache(config.__class__(num_hidden_layers=1), seed=-1)


def test_queries_the_int8_attention_cannot_take_are_refused():
    layer, (keys, values), _, _ = _filled_layer()
    module = torch.nn.Module()
    attention = pt.attention.int8_attention
    with pytest.raises(ValueError, match="multiple of 2 heads"):
        attention(module, torch.zeros(2, 3, 1, 64), keys, values, None)
    with pytest.raises(TypeError, match="query must be float32.*torch.float64"):
        attention(module, torch.zeros(2, 4, 1, 64, dtype=torch.float64), keys, values, None)
    with pytest.raises(TypeError, match="not an Int8Cache's"):
        attention(module, torch.zeros(2, 4, 1, 64), keys.clone(), values, None)
    with pytest.raises(ValueError, match="attention_mask must be"):
        attention(module, torch.zeros(2, 4, 1, 64), keys, values,
                  torch.ones(2, 1, 1, 12, dtype=torch.bool))


def test_the_decode_is_unchanged_by_the_seed_but_the_stored_keys_are_not():
    a, (keys_a, _), _, _ = _filled_layer()
    b = Int8Layer(2, 64, 64, 5)
    g = torch.Generator().manual_seed(7)
    keys, values = torch.randn(2, 2, 37, 64, generator=g), torch.randn(2, 2, 37, 64,
                                                                          generator=g)
    keys[..., 5] *= 20
    keys_b, _ = b.update(keys, values)
    assert not torch.equal(keys_a, keys_b)
    query = torch.randn(2, 4, 1, 64, generator=torch.Generator().manual_seed(9))
    out_a = _int8_attention.attend(query, keys_a, getattr(keys_a, _int8_attention.MARK),
                                   None, 0.125, None)
    out_b = _int8_attention.attend(query, keys_b, getattr(keys_b, _int8_attention.MARK),
                                   None, 0.125, None)
    assert np.abs((out_a - out_b).numpy()).max() <= 0.02 * out_a.abs().max().item()


def test_the_examples_run():
    import doctest
    import sys
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    tests = doctest.DocTestFinder().find(sys.modules["pyw8a8.torch.kv_cache"],
                                         "pyw8a8.torch.kv_cache", globs={})
    assert sum(len(t.examples) for t in tests) >= 5
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_importing_pyw8a8_torch_does_not_import_transformers():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys, pyw8a8.torch; "
                          "print('transformers' in sys.modules)"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_beam_search_and_bfloat16_run_on_it():
    # beam search expands the cache's batch and reorders it every step
    model = pt.quantize(llama().to(torch.bfloat16))
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(12))
    with torch.inference_mode():
        expected = model.generate(ids, max_new_tokens=4, do_sample=False, num_beams=2)
        got = model.generate(ids, max_new_tokens=4, do_sample=False, num_beams=2,
                             cache=pt.Int8Cache(model.config))
    assert got.tolist() == expected.tolist()


def test_crop_forgets_the_last_tokens_as_assisted_decoding_needs():
    layer, (keys, _), _, _ = _filled_layer(tokens=10)
    layer.crop(-3)
    assert layer.get_seq_length() == 7 and layer.get_mask_sizes(1) == (8, 0)
    again, _ = layer.update(*torch.zeros(2, 2, 2, 1, 64))
    assert again.shape[2] == 8 and torch.equal(again[:, :, :7], keys[:, :, :7])
    with pytest.raises(ValueError, match="negative count"):
        layer.crop(2)
    sliding, _, _, _ = _filled_layer(tokens=20, window=8)
    with pytest.raises(RuntimeError, match="keeps only its last 7"):
        sliding.crop(-10)
