"""pyw8a8.torch.Int8Cache: transformers' KV cache in int8 and pyw8a8's int8 attention over
it, on tiny random Llama (GQA) and Gemma 3 (a sliding-window layer, GQA, softcapping)
models built from configs.  Skipped, with the reason shown, where torch or transformers
is missing."""
import copy
import importlib
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
transformers = pytest.importorskip("transformers",
                                   reason="needs transformers (pip install '.[torch-model]')")

import pyw8a8.torch as pt  # noqa: E402

from torch_helpers import COMPILE_MODES, tiny_gemma3, tiny_llama  # noqa: E402


def llama(attention="sdpa"):
    return tiny_llama(attn_implementation=attention)


def gemma(window=6):
    return tiny_gemma3(sliding_window=window, attn_logit_softcapping=30.0)


def generate(model, ids, cache=None, **kwargs):
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, cache=cache, **kwargs)
    return out.sequences, torch.stack(out.logits)


@pytest.mark.parametrize("build, terms", [(llama, 1), (gemma, 1), (gemma, 2)],
                         ids=["llama", "gemma3", "gemma3-two-terms"])
def test_generate_with_the_int8_cache_gives_the_default_cache_s_tokens(build, terms):
    model = pt.quantize(build())
    assert model.config._attn_implementation == "pyw8a8"
    ids = torch.randint(0, 96, (1, 11), generator=torch.Generator().manual_seed(2))
    expected, expected_logits = generate(model, ids)
    cache = pt.Int8Cache(model.config, probability_terms=terms)
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


def _cache(windows=(None,), heads=2, head_dim=64, **kwargs):
    config = transformers.LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads,
                                      num_key_value_heads=heads,
                                      num_hidden_layers=len(windows), vocab_size=8,
                                      head_dim=head_dim)
    config.layer_types = ["full_attention" if w is None else "sliding_attention"
                          for w in windows]
    config.sliding_window = next((w for w in windows if w is not None), None)
    return pt.Int8Cache(config, **kwargs)


def _states(tokens, heads=2, head_dim=64, seed=7, batch=2):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, heads, tokens, head_dim, generator=g)
    keys[..., 5] *= 20  # an outlier channel, which the rotation spreads
    return keys, torch.randn(batch, heads, tokens, head_dim, generator=g)


def _attend(cache, layer, query, receipt, mask=None):
    return torch.ops.pyw8a8.kv_attention(query, receipt, mask, 0.125, 0.0)


def test_the_attention_is_numpy_s_int8_attention_on_the_same_store():
    from pyw8a8.attention import Int8KVCache, int8_attention
    cache = _cache()
    keys, values = _states(37)
    receipt, same = cache.layers[0].update(keys, values)
    assert receipt is same and receipt.tolist() == [cache.cache_id, 0, 0, 37]
    query = torch.randn(2, 4, 37, 64, generator=torch.Generator().manual_seed(8))
    got = _attend(cache, 0, query, receipt)  # (batch, queries, heads, head_dim)
    ref = Int8KVCache([None], 4, 64, query_terms=1, probability_terms=2)
    expected = int8_attention(ref, 0, (query * 0.125).permute(2, 0, 1, 3).reshape(37, 8, 64)
                              .numpy(), keys.permute(2, 0, 1, 3).reshape(37, 4, 64).numpy(),
                              values.permute(2, 0, 1, 3).reshape(37, 4, 64).numpy())
    np.testing.assert_array_equal(got.permute(1, 0, 2, 3).reshape(37, 8, 64).numpy(),
                                  expected)
    # and close to float attention over the float keys and values
    exact = torch.nn.functional.scaled_dot_product_attention(
        query, keys.repeat_interleave(2, 1), values.repeat_interleave(2, 1), is_causal=True,
        scale=0.125).transpose(1, 2)
    assert (got - exact).abs().max() <= 0.02 * exact.abs().max()


def test_a_sliding_layer_gives_the_dynamic_layer_s_sizes_and_drops_passed_pages():
    from transformers.cache_utils import DynamicSlidingWindowLayer
    cache = _cache((200,))
    theirs = DynamicSlidingWindowLayer(sliding_window=200)
    g = torch.Generator().manual_seed(10)
    for step in range(600):
        n = 300 if step == 0 else 3 if step == 50 else 1
        assert cache.layers[0].get_mask_sizes(n) == theirs.get_mask_sizes(n)
        k, v = torch.randn(2, 2, 2, n, 64, generator=g)
        cache.layers[0].update(k, v)
        theirs.update(k, v)
        held = cache.store.held(0)
        assert held.stop == cache.get_seq_length()
        assert 200 <= len(held) <= 200 + 128 or step == 0
    assert cache.get_seq_length() == theirs.get_seq_length() == 300 + 598 + 3


def test_nbytes_counts_what_the_store_allocated():
    model = pt.quantize(gemma())
    cache = pt.Int8Cache(model.config)
    assert cache.nbytes == 0
    with torch.inference_mode():
        model(torch.arange(40).unsqueeze(0), cache=cache)
    assert cache.nbytes == cache.store.nbytes > 0
    # batch 1, 2 KV heads of 32: keys and values 32 bytes a token, scales 4 each; the
    # open pages' room in whole 16s of tokens: the global layer's 40 tokens in 48, the
    # sliding layer (window 6, pages of 16) only the page that holds its window
    per_token = 2 * (2 * 32 + 2 * 4)
    assert cache.nbytes == (48 + 16) * per_token


def test_bad_states_are_refused_naming_what_is_wrong():
    layer = _cache().layers[0]
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
    with pytest.raises(ValueError, match="key_states holds NaN or Inf"):
        layer.update(bad, torch.zeros(1, 2, 4, 64))
    with pytest.raises(ValueError, match="differ in shape"):
        layer.update(torch.zeros(1, 2, 4, 64), torch.zeros(1, 2, 5, 64))
    assert layer.cache.store.length == 0  # nothing refused was stored
    layer.update(torch.zeros(1, 2, 4, 64), torch.zeros(1, 2, 4, 64))
    with pytest.raises(ValueError, match="batch 2"):
        layer.update(torch.zeros(2, 2, 1, 64), torch.zeros(2, 2, 1, 64))
    layer.cache.config._attn_implementation_internal = "pyw8a8"
    with pytest.raises(ValueError, match="layer_idx 1: .* model of 1 attention layers"):
        layer.cache.update(torch.zeros(1, 2, 1, 64), torch.zeros(1, 2, 1, 64), 1)


def test_a_bad_mask_is_refused_and_the_stored_tokens_stay_as_they_were():
    cache = _cache()
    receipt, _ = cache.layers[0].update(*_states(5, batch=1))
    query = torch.randn(1, 2, 1, 64)
    before = cache.store.quantized_keys(0)
    step, _ = cache.layers[0].update(*_states(1, batch=1, seed=3))
    for mask, error in ((torch.ones(1, 1, 1, 9, dtype=torch.bool), ValueError),
                        (torch.ones(1, 3, 1, 6, dtype=torch.bool), ValueError),
                        (torch.ones(1, 1, 1, 6, dtype=torch.int32), TypeError)):
        with pytest.raises(error, match="attention_mask"):
            _attend(cache, 0, query, step, mask)
        keys = cache.store.quantized_keys(0)
        assert all(np.array_equal(a, b) for a, b in zip(keys, before))
        step, _ = cache.layers[0].update(*_states(1, batch=1, seed=3))
    visible = torch.ones(1, 1, 1, 6, dtype=torch.bool)
    torch.testing.assert_close(_attend(cache, 0, query, step, visible),
                               _attend(cache, 0, query, step), rtol=0, atol=0)


def test_queries_the_int8_attention_cannot_take_are_refused():
    cache = _cache()
    receipt, _ = cache.layers[0].update(*_states(5))
    module = torch.nn.Module()
    attention = pt.attention.int8_attention
    with pytest.raises(TypeError, match="query must be float32.*torch.float64"):
        attention(module, torch.zeros(2, 4, 1, 64, dtype=torch.float64), receipt, receipt,
                  None)
    with pytest.raises(TypeError, match="attention_mask must be a tensor"):
        attention(module, torch.zeros(2, 4, 1, 64), receipt, receipt, [1])
    bad = torch.zeros(2, 4, 5, 64)
    bad[1, 2, 3, 4] = float("nan")
    with pytest.raises(ValueError, match="query holds NaN or Inf"):
        attention(module, bad, receipt, receipt, None)


def test_the_decode_is_unchanged_by_the_seed_but_the_stored_keys_are_not():
    outs, stored = [], []
    query = torch.randn(2, 4, 1, 64, generator=torch.Generator().manual_seed(9))
    for seed in (0, 5):
        cache = _cache(seed=seed)
        cache.layers[0].update(*_states(36))
        receipt, _ = cache.layers[0].update(*_states(1, seed=4))
        outs.append(_attend(cache, 0, query, receipt))
        stored.append(cache.store.quantized_keys(0)[0])
    assert not np.array_equal(*stored)
    assert (outs[0] - outs[1]).abs().max() <= 0.05 * outs[0].abs().max()  # int8 noise


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
    with pytest.raises(ValueError, match="probability_terms must be 1 or 2, got 3"):
        pt.Int8Cache(config, probability_terms=3)
    with pytest.raises(ValueError, match="seed"):
        pt.Int8Cache(config.__class__(num_hidden_layers=1), seed=-1)


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


def test_a_copied_or_unpickled_cache_decodes_on_its_own_store():
    # transformers' docs reuse a prefilled prompt's cache by deep-copying it
    model = pt.quantize(gemma())
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(13))
    with torch.inference_mode():
        prompt = pt.Int8Cache(model.config)
        model(ids[:, :8], cache=prompt)
        twin = copy.deepcopy(prompt)
        assert twin.cache_id != prompt.cache_id and twin.store is not prompt.store
        assert twin.layers[0].cache is twin
        first = model(ids[:, 8:10], cache=twin).logits
        assert prompt.get_seq_length() == prompt.store.length == 8  # untouched
        second = model(ids[:, 8:10], cache=pickle.loads(pickle.dumps(prompt))).logits
        third = model(ids[:, 8:10], cache=prompt).logits
    assert torch.equal(first, second) and torch.equal(first, third)


def test_crop_forgets_the_last_tokens_as_assisted_decoding_needs():
    cache = _cache()
    layer = cache.layers[0]
    keys, values = _states(300)  # a full page of 256 and an open one
    layer.update(keys, values)
    layer.crop(-60)  # into the full page: it opens again
    assert layer.get_seq_length() == 240 and layer.get_mask_sizes(1) == (241, 0)
    assert cache.store.held(0) == range(240)
    ref = _cache()
    ref.layers[0].update(keys[:, :, :240], values[:, :, :240])
    step = _states(1, seed=11)
    query = torch.randn(2, 4, 1, 64, generator=torch.Generator().manual_seed(12))
    got = _attend(cache, 0, query, layer.update(*step)[0])
    expected = _attend(ref, 0, query, ref.layers[0].update(*step)[0])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="negative count"):
        layer.crop(2)
    sliding = _cache((8,))
    sliding.layers[0].update(*_states(200))
    sliding.layers[0].update(*_states(1))
    with pytest.raises(RuntimeError, match="keeps only its last"):
        sliding.layers[0].crop(-150)


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_a_compiled_model_decodes_the_eager_tokens_in_one_graph(mode):
    import torch._inductor.config as inductor_config
    config, options = COMPILE_MODES[mode]
    model = pt.quantize(gemma())
    ids = torch.randint(0, 96, (1, 11), generator=torch.Generator().manual_seed(2))
    expected, expected_logits = generate(model, ids, pt.Int8Cache(model.config))
    # Resetting a max-autotune backend imports this module, whose torch.compiler.disable
    # adds to the dict of backends reset is iterating (torch 2.13): imported first here.
    importlib.import_module("torch._inductor.wrapper_benchmark")
    torch._dynamo.reset()
    with inductor_config.patch(config):
        compiled = torch.compile(model, fullgraph=True, **options)
        got, logits = generate(compiled, ids, pt.Int8Cache(model.config))
    assert got.tolist() == expected.tolist()
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-3)
