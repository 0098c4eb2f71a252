"""pyw8a8.torch's layers and `quantize`: bit for bit pyw8a8.matmul / matmul_pair on the same
packed weights, every input form a torch model passes, and the errors (saving and copying:
test_torch_saving.py).
Skipped, with the reason shown, where torch is not installed (.ci/run installs it)."""
import pickle

import numpy as np
import pytest

import pyw8a8

from torch_helpers import dense, torch

pt = pytest.importorskip("pyw8a8.torch")

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]


def reference(layer, x):
    """pyw8a8.matmul on the layer's own packed weight, as numpy."""
    bias = None if layer.bias is None else layer.bias.numpy()
    return pyw8a8.matmul(x.float().numpy(), layer.packed("weight"), bias=bias,
                         activation=layer.activation)


def close(y, ref, tol=0.05):
    ref = ref.float()
    return bool((y.float() - ref).abs().max() <= tol * ref.pow(2).mean().sqrt())


# --- the product ------------------------------------------------------------------


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("rotate", [True, False])
def test_linear_is_pyw8a8_matmul_bit_for_bit_on_every_isa(any_isa, activation, rotate):
    lin = dense(200, 96)
    layer = pt.Linear.from_float(lin, rotate=rotate, activation=activation)
    x = torch.randn(3, 5, 200)
    with torch.inference_mode():
        y = layer(x)
    assert y.shape == (3, 5, 96) and y.dtype == torch.float32
    assert np.array_equal(y.numpy(), reference(layer, x))
    act = {None: lambda v: v, "relu": torch.relu, "silu": torch.nn.functional.silu,
           "gelu": torch.nn.functional.gelu,
           "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[activation]
    with torch.no_grad():
        assert close(y, act(lin(x)))


def test_a_layer_without_bias_and_one_from_packed_weights():
    w = np.random.default_rng(1).standard_normal((64, 300)).astype(np.float32)
    packed = pyw8a8.pack_weight(w, rotate=True, block=64, pad=True)
    layer = pt.Linear.from_packed(packed)
    x = torch.randn(7, 300)
    with torch.no_grad():
        y = layer(x)
    assert layer.bias is None and (layer.in_features, layer.out_features) == (300, 64)
    assert np.array_equal(y.numpy(), pyw8a8.matmul(x.numpy(), packed))


def test_gated_linear_is_matmul_pair_with_glu_bit_for_bit(any_isa):
    gate, up = dense(256, 160, seed=1), dense(256, 160, seed=2)
    unit = pt.GatedLinear.from_float(gate, up, glu="gelu_tanh")
    x = torch.randn(2, 9, 256)
    with torch.no_grad():
        y = unit(x)
        expected = torch.nn.functional.gelu(gate(x), approximate="tanh") * up(x)
    ref = pyw8a8.matmul_pair(x.numpy(), unit.packed("gate"), unit.packed("up"),
                             glu="gelu_tanh", bias1=gate.bias.detach().numpy(),
                             bias2=up.bias.detach().numpy())
    assert np.array_equal(y.numpy(), ref)
    assert close(y, expected, tol=0.25)  # a product of two quantized products: 0.15 here


def test_gated_linear_needs_one_shape_and_a_glu():
    with pytest.raises(ValueError, match="one shape"):
        pt.GatedLinear.from_float(dense(64, 32), dense(64, 48))
    with pytest.raises(ValueError, match="glu"):
        pt.GatedLinear.from_float(dense(64, 32), dense(64, 32), glu=None)
    with pytest.raises(ValueError, match="glu must be one of"):
        pt.GatedLinear.from_float(dense(64, 32), dense(64, 32), glu="tanh")


def test_bfloat16_inputs_are_widened_and_the_result_rounded_back():
    layer = pt.Linear.from_float(dense(128, 64))
    x = torch.randn(4, 128).bfloat16()
    with torch.no_grad():
        y = layer(x)
    assert y.dtype == torch.bfloat16
    expected = torch.from_numpy(reference(layer, x.float())).bfloat16()
    assert torch.equal(y, expected)


def test_strided_and_channels_last_inputs_give_the_contiguous_result():
    layer = pt.Linear.from_float(dense(32, 16))
    x = torch.randn(2, 32, 6, 32).contiguous(memory_format=torch.channels_last)
    assert not x.is_contiguous()
    t = torch.randn(32, 5).t()  # (5, 32), transposed strides
    with torch.no_grad():
        assert torch.equal(layer(x), layer(x.contiguous()))
        assert torch.equal(layer(t), layer(t.contiguous()))
        assert torch.equal(layer(x[:, :, ::2]), layer(x[:, :, ::2].contiguous()))


def test_a_negative_view_is_read_as_the_values_it_shows():
    layer = pt.Linear.from_float(dense(64, 8))
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(layer(torch._neg_view(x)), layer(-x))


def test_empty_and_large_leading_dimensions():
    layer = pt.Linear.from_float(dense(64, 8))
    with torch.no_grad():
        assert layer(torch.empty(0, 64)).shape == (0, 8)
        assert layer(torch.empty(2, 0, 64)).shape == (2, 0, 8)


# --- inference only, and the errors -------------------------------------------------


def test_a_forward_that_needs_gradients_says_to_use_inference_mode():
    layer = pt.Linear.from_float(dense(64, 8))
    x = torch.randn(2, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"inference_mode\(\) or torch.no_grad\(\)"):
        layer(x)
    with torch.no_grad():
        assert torch.equal(layer(x), layer(x.detach()))


@pytest.mark.parametrize("x, error, match", [
    (lambda: torch.randn(2, 64).half(), TypeError, "x must be float32 or bfloat16"),
    (lambda: torch.randn(2, 64).double(), TypeError, "x must be float32 or bfloat16"),
    (lambda: torch.ones(2, 64, dtype=torch.int8), TypeError, "x must be float32"),
    (lambda: torch.empty(2, 64, device="meta"), ValueError, "x is on meta"),
    (lambda: torch.randn(2, 63), ValueError,
     r"x has 63 features in its last dimension \(shape \(2, 63\)\) but the weight expects K=64"),
    (lambda: torch.tensor(1.0), ValueError, "x must have at least one dimension, got a scalar"),
    (lambda: np.ones((2, 64), np.float32), TypeError, "x must be a torch.Tensor"),
    (lambda: torch.randn(2, 64).to_sparse(), TypeError,
     r"x must be a dense \(strided\) tensor, got layout torch.sparse_coo"),
    (lambda: torch.nested.as_nested_tensor([torch.randn(2, 64), torch.randn(3, 64)]),
     TypeError, r"x must be a dense \(strided\) tensor, got a nested tensor"),
])
def test_bad_inputs_name_the_argument(x, error, match):
    layer = pt.Linear.from_float(dense(64, 8))
    with torch.no_grad(), pytest.raises(error, match=match):
        layer(x())


@pytest.mark.skipif(not hasattr(torch.library, "register_vmap"),
                    reason="vmap rules for custom operators need torch 2.5")
def test_torch_func_vmap_maps_the_input_and_grad_is_refused():
    torch.manual_seed(4)
    layers = (pt.Linear.from_float(dense(64, 32), activation="silu"),
              pt.GatedLinear.from_float(dense(64, 16, seed=1), dense(64, 16, seed=2)))
    x = torch.randn(4, 5, 64)
    with torch.no_grad():
        for layer in layers:
            assert torch.equal(torch.func.vmap(layer)(x), layer(x))
            assert torch.equal(torch.func.vmap(layer, in_dims=1)(x), layer(x.movedim(1, 0)))
            twice = torch.func.vmap(torch.func.vmap(layer))(x.reshape(2, 2, 5, 64))
            assert torch.equal(twice, layer(x).reshape(2, 2, 5, -1))
    with pytest.raises(RuntimeError, match=r"inference_mode\(\)"):
        torch.func.grad(lambda t: layers[0](t).sum())(torch.randn(3, 64))
    weights = layers[0]._tensors("weight")
    with torch.no_grad(), pytest.raises(ValueError, match="maps over its input only"):
        torch.func.vmap(torch.ops.pyw8a8.linear, in_dims=(0, 0, None, None, None, None, None))(
            x, torch.stack([weights[0]] * 4), *weights[1:], layers[0].bias, "")


def test_non_finite_inputs_name_the_row():
    layer = pt.Linear.from_float(dense(64, 8))
    x = torch.randn(3, 64)
    x[1, 5] = float("nan")
    with torch.no_grad(), pytest.raises(ValueError, match="row 1"):
        layer(x)


def test_from_float_refuses_what_it_cannot_pack():
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear"):
        pt.Linear.from_float(torch.nn.Conv1d(4, 4, 1))
    with pytest.raises(ValueError, match="meta"):
        pt.Linear.from_float(torch.nn.Linear(8, 4, device="meta"))
    lin = dense(16, 4)
    with torch.no_grad():
        lin.weight[2, 3] = float("inf")
    with pytest.raises(ValueError, match="row 2"):
        pt.Linear.from_float(lin)
    with pytest.raises(ValueError, match="activation must be one of"):
        pt.Linear.from_float(dense(16, 4), activation="tanh")
    with pytest.raises(TypeError, match="packed must be a pyw8a8.PackedWeight"):
        pt.Linear.from_packed(np.zeros((4, 4)))


def test_dtype_casts_keep_the_int8_format_and_devices_other_than_the_cpu_are_refused():
    model = torch.nn.Sequential(pt.Linear.from_float(dense(64, 32)), torch.nn.Linear(32, 8))
    x = torch.randn(2, 64)
    with torch.no_grad():
        before = model[0](x)
        model.to(torch.bfloat16)
        assert model[1].weight.dtype == torch.bfloat16
        assert model[0].weight_scales.dtype == torch.float32
        assert model[0].bias.dtype == torch.float32
        assert torch.equal(model[0](x), before)
        assert model(x.bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="runs on the CPU only"):
        model[0].to("meta")
    with torch.no_grad():
        assert torch.equal(model[0](x), before)  # left as it was


# --- quantize ---------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)
        self.up = torch.nn.Linear(64, 256)
        self.down = torch.nn.Linear(256, 64)
        self.tiny = torch.nn.Linear(8, 64)

    def forward(self, x):
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def test_quantize_replaces_linear_layers_and_reports_what_it_kept_and_why():
    torch.manual_seed(0)
    model = Block().eval()
    q = pt.quantize(model, exclude=["down"], min_in_features=16)
    report = q.pyw8a8_report
    assert report.replaced == ["up"]
    assert report.kept == {"attn.out_proj": pytest.approx(report.kept["attn.out_proj"]),
                           "down": "excluded", "tiny": "in_features=8 < min_in_features=16"}
    assert "MultiheadAttention" in report.kept["attn.out_proj"]
    assert isinstance(q.up, pt.Linear) and type(model.up) is torch.nn.Linear
    assert "1 layers in W8A8, 3 kept in float" in str(report)
    x = torch.randn(2, 10, 64)
    with torch.no_grad():
        assert close(q(x), model(x))


def test_min_features_is_the_deprecated_name_of_min_in_features():
    """The Router's name of the setting, min_in_features, is quantize's too: the former
    min_features still works, with a warning naming the new one; both are an error."""
    model = torch.nn.Sequential(dense(8, 32), torch.nn.ReLU(), dense(32, 32))
    with pytest.warns(DeprecationWarning, match="min_features=.*min_in_features="):
        q = pt.quantize(model, min_features=16)
    assert q.pyw8a8_report.kept == {"0": "in_features=8 < min_in_features=16"}
    with pytest.raises(TypeError, match="min_in_features=.*min_features="):
        pt.quantize(model, min_features=16, min_in_features=16)


def test_quantize_include_inplace_a_root_linear_and_tied_layers():
    model = torch.nn.Sequential(dense(32, 32), torch.nn.ReLU(), dense(32, 32))
    same = pt.quantize(model, include=["2"], inplace=True)
    assert same is model and isinstance(model[2], pt.Linear)
    assert type(model[0]) is torch.nn.Linear
    root = pt.quantize(dense(32, 16))
    assert isinstance(root, pt.Linear) and root.pyw8a8_report.replaced == [""]
    shared = dense(32, 32)
    tied = pt.quantize(torch.nn.Sequential(shared, torch.nn.ReLU(), shared))
    assert tied[0] is tied[2] and isinstance(tied[0], pt.Linear)
    assert tied.pyw8a8_report.replaced == ["0", "2"]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(min_in_features=-1), ValueError, "min_in_features"),
    (dict(include=[3]), TypeError, "include must be"),
    (dict(block=3), ValueError, "block"),
])
def test_quantize_checks_its_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        pt.quantize(torch.nn.Sequential(dense(32, 32)), **kwargs)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        pt.quantize(object())


def test_import_pyw8a8_never_imports_torch():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys, pyw8a8, pyw8a8.router; "
                          "print('torch' in sys.modules)"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["pyw8a8.torch", "pyw8a8.torch.modules",
                                  "pyw8a8.torch.convert"])
def test_the_examples_run(name):
    import doctest
    import importlib
    import sys
    importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    tests = doctest.DocTestFinder().find(sys.modules[name], name, globs={})
    assert sum(len(t.examples) for t in tests) >= 3
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


# --- fusion of the activation after a layer -------------------------------------------


class Intermediate(torch.nn.Module):
    """BERT's intermediate block: a linear layer, then an activation module, in its code."""

    def __init__(self, act):
        super().__init__()
        self.dense = torch.nn.Linear(64, 256)
        self.act = act

    def forward(self, x):
        return self.act(self.dense(x))


class CustomGelu(torch.nn.Module):  # as transformers' GELUActivation: no type pyw8a8 knows
    def forward(self, x):
        return torch.nn.functional.gelu(x)


class Twice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(64, 64)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        y = self.dense(x)
        return self.act(y) + y  # the layer's output is read twice: no fusion


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up = torch.nn.Linear(64, 128), torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("act, name", [
    (torch.nn.GELU(), "gelu"), (torch.nn.GELU(approximate="tanh"), "gelu_tanh"),
    (torch.nn.ReLU(), "relu"), (torch.nn.SiLU(), "silu"), (CustomGelu(), "gelu")])
def test_an_activation_after_a_layer_is_fused_into_its_kernel(act, name):
    torch.manual_seed(0)
    model = Intermediate(act)
    q = pt.quantize(model)
    assert q.dense.activation == name and isinstance(q.act, torch.nn.Identity)
    assert set(q.state_dict()) == {f"dense.{k}" for k in q.dense.state_dict()}
    assert "fused dense with the " + name in str(q.pyw8a8_report)
    x = torch.randn(5, 64)
    unfused = pt.quantize(model, fuse=False)
    assert unfused.dense.activation is None and type(unfused.act) is type(model.act)
    with torch.no_grad():
        fused = q(x)
        assert torch.equal(fused, torch.from_numpy(reference(q.dense, x)))
        # The same product, then torch's activation: float roundings apart.
        torch.testing.assert_close(fused, unfused(x), rtol=1e-5, atol=1e-6)


def test_what_is_not_one_activation_of_one_layer_output_stays_unfused():
    from pyw8a8.torch import fusion
    q = pt.quantize(Twice())
    assert q.dense.activation is None and isinstance(q.act, torch.nn.ReLU)
    assert pt.quantize(Intermediate(torch.nn.Tanh())).dense.activation is None
    assert fusion.activation_name(torch.nn.Tanh()) is None
    assert fusion.activation_name(torch.nn.Softmax(dim=-1)) is None  # not elementwise
    assert fusion.activation_name(torch.nn.Linear(4, 4)) is None


class GatedAndMore(Gated):
    def forward(self, x):  # the unit, and a residual: more than the unit
        return x + self.down(self.act(self.gate(x)) * self.up(x))


class NormedFfn(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.norm, self.mlp = torch.nn.LayerNorm(64), mlp

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def test_a_gated_unit_that_is_a_modules_forward_becomes_one_gated_linear():
    torch.manual_seed(0)
    model = NormedFfn(Gated()).eval()
    q = pt.quantize(model)
    [unit] = q.pyw8a8_report.gated
    assert (unit.gate, unit.up, unit.activation, unit.down) == ("gate", "up", "silu", "down")
    assert isinstance(q.mlp, torch.fx.GraphModule) and type(q.mlp).__name__ == "Gated"
    assert isinstance(q.mlp.gate, pt.GatedLinear) and q.mlp.gate.glu == "silu"
    assert not hasattr(q.mlp, "up") and "one GatedLinear in gate's place" in str(
        q.pyw8a8_report)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        h = q.norm(x)
        g = q.mlp.gate
        unit_out = pyw8a8.matmul_pair(h.numpy(), g.packed("gate"), g.packed("up"), glu="silu",
                                      bias1=g.gate_bias.numpy(), bias2=g.up_bias.numpy())
        assert torch.equal(q.mlp(h), q.mlp.down(torch.from_numpy(unit_out)))
        y = q(x)
        assert close(y, model(x), tol=0.1)
        fresh = pt.quantize(NormedFfn(Gated()).eval())
        fresh.load_state_dict(q.state_dict())
        assert torch.equal(fresh(x), y)
        assert torch.equal(pickle.loads(pickle.dumps(q))(x), y)
    unfused = pt.quantize(model, fuse=False)
    assert type(unfused.mlp) is Gated and unfused.pyw8a8_report.gated == []


def test_a_gated_unit_in_a_forward_that_does_more_stays_in_its_code():
    torch.manual_seed(0)
    model = GatedAndMore()
    q = pt.quantize(model)
    [unit] = q.pyw8a8_report.gated
    assert unit.down is None and type(q) is GatedAndMore
    assert q.gate.activation == "silu" and isinstance(q.act, torch.nn.Identity)
    assert "left in the module's code" in str(q.pyw8a8_report)
    x = torch.randn(4, 64)
    with torch.no_grad():
        assert close(q(x), model(x), tol=0.1)
