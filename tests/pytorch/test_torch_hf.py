"""pyw8a8.torch.W8A8Config: transformers' from_pretrained quantizes with pyw8a8 as it loads,
the same model pyw8a8.torch.quantize makes; save_pretrained writes it in int8, and
from_pretrained reads it back, bit for bit, or refuses a bad checkpoint.  Tiny random
checkpoints saved to a temporary directory; skipped, with the reason shown, where torch or
transformers is missing."""
import json
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")
transformers = pytest.importorskip("transformers",
                                   reason="needs transformers (pip install '.[torch-model]')")

import pyw8a8.torch as pt  # noqa: E402

from torch_helpers import tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = tiny_llama(tie_word_embeddings=True)
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


@pytest.fixture(scope="module")
def saved(checkpoint, tmp_path_factory):
    """The float checkpoint loaded with W8A8Config, saved by save_pretrained."""
    path, _ = checkpoint
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=pt.W8A8Config())
    directory = tmp_path_factory.mktemp("int8")
    model.save_pretrained(directory)
    return directory, model


IDS = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(1))


def test_saved_checkpoint_reloads_in_a_new_process_bit_for_bit(saved, tmp_path):
    directory, model = saved
    # A fresh interpreter: `import pyw8a8.torch` alone makes the checkpoint loadable.
    script = (
        "import sys, torch, pyw8a8.torch, transformers\n"
        "model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "ids = torch.load(sys.argv[2])\n"
        "floats = [n for n, p in model.named_parameters() if p.dim() == 2]\n"
        "assert not floats, floats\n"
        "assert type(model.model.embed_tokens).__name__ == 'Int8Embedding'\n"
        "with torch.inference_mode():\n"
        "    torch.save(model(ids).logits, sys.argv[3])\n")
    torch.save(IDS, tmp_path / "ids.pt")
    out = subprocess.run([sys.executable, "-c", script, str(directory), str(tmp_path / "ids.pt"),
                          str(tmp_path / "logits.pt")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    with torch.inference_mode():
        assert torch.equal(torch.load(tmp_path / "logits.pt"), model(IDS).logits)


def test_saved_checkpoint_holds_the_packed_weights_and_the_config(saved):
    directory, model = saved
    from safetensors import safe_open
    with safe_open(directory / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert keys == set(model.state_dict())
    assert "lm_head.weight_panels" in keys and "model.embed_tokens.weight" not in keys
    assert not any(key.endswith("proj.weight") for key in keys)
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "pyw8a8" and config["checkpoint_format"] == 1
    assert config["encoding"] == "biased"


def test_reloaded_model_generates_and_compiles_as_the_saved_one(saved):
    directory, model = saved
    again = transformers.AutoModelForCausalLM.from_pretrained(directory)
    assert str(again.pyw8a8_report) == str(model.pyw8a8_report)
    assert again.model.layers[0].self_attn.q_proj._shared is not None  # q, k, v one product
    prompt = IDS[:1]
    with torch.inference_mode():
        tokens = [m.generate(prompt, max_new_tokens=4, do_sample=False,
                             cache=pt.Int8Cache(m.config)) for m in (model, again)]
        compiled = torch.compile(again, fullgraph=True)
        logits = compiled(IDS).logits
    assert torch.equal(tokens[0], tokens[1])
    with torch.inference_mode():
        assert torch.allclose(logits, model(IDS).logits, atol=1e-4)


def test_options_are_saved_with_the_checkpoint(checkpoint, tmp_path):
    path, float_model = checkpoint
    options = {"exclude": ["lm_head"], "block": 32, "seed": 3, "fuse": False}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=pt.W8A8Config(**options))
    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert again.config.quantization_config.quantize_options() == \
        pt.W8A8Config(**options).quantize_options()
    assert isinstance(again.lm_head, torch.nn.Linear) and not isinstance(again.lm_head,
                                                                          pt.Linear)
    with torch.inference_mode():
        assert torch.equal(again(IDS).logits, pt.quantize(float_model, **options)(IDS).logits)


def test_a_checkpoint_of_the_other_encoding_loads_with_the_same_bits(checkpoint, saved,
                                                                    tmp_path, monkeypatch):
    # An Arm CPU packs 'signed' where x86 packs 'biased'; either loads on every CPU.
    import pyw8a8.packing
    from pyw8a8.torch import hf
    path, _ = checkpoint
    resolve = pyw8a8.packing.resolve_encoding
    signed = lambda encoding: "signed" if encoding == "auto" else resolve(encoding)  # noqa
    monkeypatch.setattr(pyw8a8.packing, "resolve_encoding", signed)
    monkeypatch.setattr(hf, "resolve_encoding", signed)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=pt.W8A8Config())
    model.save_pretrained(tmp_path)
    monkeypatch.undo()
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert again.config.quantization_config.encoding == "signed"
    assert again.lm_head.packed("weight").encoding == "signed"
    with torch.inference_mode():
        assert torch.equal(again(IDS).logits, saved[1](IDS).logits)


def _truncate(file):
    file.write_bytes(file.read_bytes()[:-1000])


def _flip_a_weight_byte(file):
    # safetensors: an 8-byte header length, the JSON header, then the tensors' bytes
    data = bytearray(file.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    offset = header["model.layers.1.mlp.down_proj.weight_panels"]["data_offsets"][0]
    data[8 + size + offset + 100] ^= 0x01
    file.write_bytes(bytes(data))


def _drop_a_tensor(file):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    with safe_open(file, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(file)
    del tensors["model.layers.1.self_attn.v_proj.weight_scales"]
    save_file(tensors, file, metadata=metadata)


@pytest.mark.parametrize("config_change, file_change, error, message", [
    ({"checkpoint_format": 9}, None, ValueError, "reads checkpoints of format 1"),
    ({"encoding": None}, None, ValueError, "not written by save_pretrained"),
    ({"encoding": "packed"}, None, ValueError, "encoding must be one of"),
    ({"block": 32}, None, ValueError, "weight_header says .*'block': 64.* implies .*'block': 32"),
    ({"fuse": False}, None, ValueError, "has no model.layers.0.mlp.gate_proj.weight_panels"),
    (None, _truncate, Exception, "incomplete metadata|deserializ"),
    (None, _flip_a_weight_byte, ValueError, "down_proj.weight_panels is damaged"),
    (None, _drop_a_tensor, ValueError, "has no model.layers.1.self_attn.v_proj.weight_scales"),
])
def test_a_bad_checkpoint_is_refused_naming_what_is_wrong(saved, tmp_path, config_change,
                                                          file_change, error, message):
    directory, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    if config_change:
        config = json.loads((copy / "config.json").read_text())
        config["quantization_config"].update(config_change)
        (copy / "config.json").write_text(json.dumps(config))
    if file_change:
        file_change(copy / "model.safetensors")
    with pytest.raises(error, match=message):
        transformers.AutoModelForCausalLM.from_pretrained(copy)


def test_a_mismatched_shape_is_refused(saved, tmp_path):
    directory, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    config = json.loads((copy / "config.json").read_text())
    config["intermediate_size"] = 256
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        transformers.AutoModelForCausalLM.from_pretrained(copy)


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


def test_the_guide_s_recipe_runs_without_a_deprecation_warning(tmp_path, monkeypatch, capsys):
    # pytorch.md's start-to-end recipe (from_pretrained with W8A8Config, generate with
    # Int8Cache, save_pretrained, from_pretrained, torch.compile) as a user pastes it: no
    # deprecated transformers or pyw8a8 call (torch's own imports warn about TorchScript).
    import re
    import warnings
    from pathlib import Path
    page = Path(__file__).resolve().parents[2] / "docs" / "guide" / "pytorch.md"
    recipe = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)[0]
    assert "save_pretrained" in recipe and "torch.compile" in recipe
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(recipe, "pytorch.md recipe", "exec"), {"__name__": "__main__"})
    deprecated = [f"{w.filename}: {w.message}" for w in caught
                  if issubclass(w.category, (DeprecationWarning, FutureWarning))
                  and re.search(r"transformers|pyw8a8", w.filename)]
    assert not deprecated
    assert capsys.readouterr().out.splitlines()[-1] == "True"  # the same greedy tokens


def test_a_sharded_checkpoint_and_a_bfloat16_load(saved, tmp_path):
    # Shards each hold the checksums of them all; a bfloat16 load casts the float tensors
    # (the norms), never the packed layers' scales and biases, which the int8 format keeps
    # in float32.
    directory, model = saved
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    half = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    assert half.model.norm.weight.dtype == torch.bfloat16
    assert half.lm_head.weight_scales.dtype == torch.float32
    with torch.inference_mode():
        assert torch.equal(again(IDS).logits, model(IDS).logits)
        assert half(IDS).logits.dtype == torch.bfloat16
