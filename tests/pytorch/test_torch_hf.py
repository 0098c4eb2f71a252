"""pyw8a8.torch.W8A8Config: transformers' from_pretrained quantizes with pyw8a8 as it loads,
the same model pyw8a8.torch.quantize makes.  Tiny random checkpoints saved to a temporary
directory; skipped, with the reason shown, where torch or transformers is missing."""
import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
transformers = pytest.importorskip("transformers",
                                   reason="needs transformers (pip install '.[torch-model]')")

import pyw8a8.torch as pt  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96,
                                      tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("float")
    model.save_pretrained(path)
    return path, model


@pytest.mark.parametrize("options", [{}, {"exclude": ["lm_head"], "block": 32, "seed": 3}])
def test_loading_with_the_config_is_quantize_of_the_float_model(checkpoint, options):
    path, float_model = checkpoint
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=pt.W8A8Config(**options))
    expected = pt.quantize(float_model, **options)
    assert str(model.pyw8a8_report) == str(expected.pyw8a8_report)
    assert isinstance(model.model.layers[0].self_attn.q_proj, pt.Linear)
    assert model.config._attn_implementation == "pyw8a8"
    assert model.config.quantization_config.quant_method == "pyw8a8"
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, expected(ids).logits)
        tokens = model.generate(ids[:1], max_new_tokens=4, do_sample=False,
                                cache=pt.Int8Cache(model.config))
    assert tokens.shape == (1, 11)


def test_saving_says_it_is_not_a_checkpoint_and_the_state_dict_reloads(checkpoint, tmp_path):
    path, float_model = checkpoint
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=pt.W8A8Config())
    with pytest.raises(ValueError, match="quantized with pyw8a8 and is not serializable"):
        model.save_pretrained(tmp_path / "int8")
    again = pt.quantize(float_model)
    again.load_state_dict(model.state_dict())
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        assert torch.equal(again(ids).logits, model(ids).logits)


@pytest.mark.parametrize("options, error, message", [
    ({"block": 3}, ValueError, "block must be a power of two"),
    ({"seed": -1}, ValueError, "seed must be at least 0"),
    ({"include": 5}, TypeError, "include must be a glob pattern"),
    ({"rotate": "yes"}, TypeError, "rotate must be a bool"),
    ({"fuse": 1}, TypeError, "fuse must be a bool"),
    ({"min_in_features": -2}, ValueError, "min_in_features must be a non-negative int"),
])
def test_bad_options_are_refused_when_the_config_is_made(options, error, message):
    with pytest.raises(error, match=message):
        pt.W8A8Config(**options)


def test_a_device_map_off_the_cpu_is_refused():
    # from_pretrained asks for accelerate before a quantizer sees a device_map: the
    # quantizer's own check, as from_pretrained calls it
    from pyw8a8.torch.hf import W8A8Quantizer
    quantizer = W8A8Quantizer(pt.W8A8Config(), pre_quantized=False)
    quantizer.validate_environment(device_map={"": "cpu"})
    with pytest.raises(ValueError, match="pyw8a8 runs on the CPU; device_map"):
        quantizer.validate_environment(device_map={"": "cuda:0"})


def test_the_config_round_trips_through_a_dict():
    config = pt.W8A8Config(include="model.*", block=64)
    again = pt.W8A8Config.from_dict(config.to_dict())
    assert again.quantize_options() == config.quantize_options()
    assert config.quantize_options()["include"] == ["model.*"]
