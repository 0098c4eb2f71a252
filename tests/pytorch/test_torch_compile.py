"""pyw8a8.torch under torch.compile, torch.export and TorchScript: the custom operators'
schemas and fake implementations (torch.library.opcheck), one graph with no breaks, and the
same bits as the eager layers.  Skipped, with the reason shown, where torch is not
installed."""
import io
import warnings

import pytest

from torch_helpers import COMPILE_MODES, native_calls, torch

pt = pytest.importorskip("pyw8a8.torch")


class Encoder(torch.nn.Module):
    """torch attention between pyw8a8 layers, and a gated FFN unit."""

    def __init__(self, d=64, f=128):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = pt.Linear.from_float(torch.nn.Linear(d, 3 * d))
        self.out = pt.Linear.from_float(torch.nn.Linear(d, d), activation="gelu")
        self.unit = pt.GatedLinear.from_float(torch.nn.Linear(d, f), torch.nn.Linear(d, f),
                                              glu="silu")
        self.down = pt.Linear.from_float(torch.nn.Linear(f, d, bias=False))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v))
        return x + self.down(self.unit(x))


@pytest.fixture(scope="module")
def model():
    return Encoder().eval()


def inputs():
    return (torch.randn(2, 12, 64),)


def test_the_operators_pass_opcheck(model):
    x, = inputs()
    linear = (x, *model.qkv._tensors("weight"), model.qkv.bias, "")
    torch.library.opcheck(torch.ops.pyw8a8.linear.default, linear)
    act = (x, *model.out._tensors("weight"), model.out.bias, "gelu")
    torch.library.opcheck(torch.ops.pyw8a8.linear.default, act)
    gated = (x, *model.unit._tensors("gate"), *model.unit._tensors("up"),
             model.unit.gate_bias, model.unit.up_bias, "silu")
    torch.library.opcheck(torch.ops.pyw8a8.gated_linear.default, gated)


def test_the_operator_is_the_eager_layer_bit_for_bit(model):
    x, = inputs()
    with torch.no_grad():
        y = torch.ops.pyw8a8.linear(x, *model.out._tensors("weight"), model.out.bias, "gelu")
        assert torch.equal(y, model.out(x))


def test_torch_compile_runs_the_model_in_one_graph(model):
    x, = inputs()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        # Inductor fuses torch's own float operations (the residual adds, the attention)
        # in its own order, so the whole model is close, not bit-identical.
        for x in (x, torch.randn(2, 12, 64)):
            expected = model(x)
            assert (compiled(x) - expected).abs().max() < 1e-2 * expected.abs().max()


def test_compiled_pyw8a8_layers_return_the_eager_bits():
    torch.manual_seed(1)
    layers = torch.nn.Sequential(
        pt.Linear.from_float(torch.nn.Linear(64, 96), activation="gelu_tanh"),
        pt.GatedLinear.from_float(torch.nn.Linear(96, 80), torch.nn.Linear(96, 80)),
        pt.Linear.from_float(torch.nn.Linear(80, 32, bias=False)))
    compiled = torch.compile(layers, fullgraph=True)
    with torch.no_grad():
        for x in (torch.randn(3, 64), torch.randn(5, 7, 64)):
            assert torch.equal(compiled(x), layers(x))


def test_torch_export_captures_the_operators_and_round_trips_through_a_file(model):
    x, = inputs()
    program = torch.export.export(model, (x,))
    targets = [str(node.target) for node in program.graph.nodes
               if node.op == "call_function"]
    assert targets.count("pyw8a8.linear.default") == 3, targets
    assert targets.count("pyw8a8.gated_linear.default") == 1, targets
    with torch.no_grad():
        expected = model(x)
        assert torch.equal(program.module()(x), expected)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    with torch.no_grad():
        assert torch.equal(loaded.module()(x), expected)


def test_a_compiled_model_still_refuses_what_the_eager_one_refuses(model):
    compiled = torch.compile(model, fullgraph=True)
    with pytest.raises(Exception, match="inference_mode"):
        compiled(torch.randn(2, 12, 64, requires_grad=True))


def _torchscript(build):
    """`build()` with TorchScript's deprecation warnings (torch 2.13 warns at every
    torch.jit.trace and torch.jit.script) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        return build()


def test_torch_jit_trace_records_the_operators_not_the_traced_result(model):
    # Traced through the eager path, the numpy product entered the graph as a constant:
    # the traced module returned the traced input's result for every input.
    x, = inputs()
    with torch.no_grad():
        traced = _torchscript(lambda: torch.jit.trace(model, (x,)))
        kinds = {node.kind() for node in traced.inlined_graph.nodes()}
        assert {"pyw8a8::linear", "pyw8a8::gated_linear"} <= kinds, kinds
        other = torch.randn(2, 12, 64)
        assert torch.equal(traced(other), model(other))


def test_torch_jit_script_runs_the_layers_and_round_trips_through_a_file(model):
    scripted = _torchscript(lambda: torch.jit.script(model))
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)  # the operators are pyw8a8.torch's, registered here
    with torch.no_grad():
        for x in (torch.randn(2, 12, 64), torch.randn(1, 5, 64).bfloat16().float()):
            expected = model(x)
            assert torch.equal(scripted(x), expected)
            assert torch.equal(loaded(x), expected)


@pytest.mark.parametrize("x, message", [
    (lambda: torch.randn(2, 64).half(), "must be float32 or bfloat16, got torch.float16"),
    (lambda: torch.randn(2, 63), "x has 63 features in its last dimension"),
    (lambda: torch.randn(2, 64, requires_grad=True), r"inference_mode\(\)"),
])
def test_a_scripted_layer_refuses_what_the_eager_one_refuses(x, message):
    torch.manual_seed(2)
    for layer in (pt.Linear.from_float(torch.nn.Linear(64, 32)),
                  pt.GatedLinear.from_float(torch.nn.Linear(64, 16), torch.nn.Linear(64, 16))):
        scripted = _torchscript(lambda: torch.jit.script(layer))
        with pytest.raises(Exception, match=message):
            scripted(x())


def test_torch_fx_symbolic_trace_records_the_operators(model):
    # A pyw8a8 layer is no leaf of fx's default tracer (its module is not torch.nn's), so
    # fx traces into its forward, which records the operator on the layer's buffers.
    torch.manual_seed(3)
    layers = torch.nn.Sequential(
        pt.Linear.from_float(torch.nn.Linear(64, 96), activation="gelu"),
        pt.GatedLinear.from_float(torch.nn.Linear(96, 80, bias=False),
                                  torch.nn.Linear(96, 80, bias=False), glu="gelu_tanh"),
        pt.Linear.from_float(torch.nn.Linear(80, 32, bias=False)))
    for module in (layers, model):
        graph = torch.fx.symbolic_trace(module)
        targets = [str(node.target) for node in graph.graph.nodes
                   if node.op == "call_function"]
        assert any(t.startswith("pyw8a8.") for t in targets), targets
        with torch.no_grad():
            for x in (torch.randn(3, 64), torch.randn(2, 12, 64)):
                assert torch.equal(graph(x), module(x))


# --- every compile mode, and AOTInductor -------------------------------------------

def _layers():
    torch.manual_seed(1)
    return torch.nn.Sequential(
        pt.Linear.from_float(torch.nn.Linear(64, 96), activation="gelu_tanh"),
        pt.GatedLinear.from_float(torch.nn.Linear(96, 80), torch.nn.Linear(96, 80)),
        pt.Linear.from_float(torch.nn.Linear(80, 32, bias=False))).eval()


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_every_compile_mode_keeps_one_graph_and_the_eager_bits(mode):
    """Under each mode the layers are one graph (fullgraph refuses a break) and return
    the eager layers' bits, a changing row count included; the native operator runs the
    calls once settled (under freezing too: the packed weights stay the tensors they are,
    not constants copied on every call)."""
    import torch._inductor.config as inductor_config
    config, options = COMPILE_MODES[mode]
    layers = _layers()
    torch._dynamo.reset()
    with inductor_config.patch(config), torch.inference_mode():
        compiled = torch.compile(layers, fullgraph=True, **options)
        shapes = [(3, 64), (5, 7, 64)] if mode == "dynamic" else [(3, 64)]
        for shape in shapes:
            x = torch.randn(*shape)
            for _ in range(60):  # the first calls of a shape tune its blocking
                y = compiled(x)
            expected = layers(x)
            before = native_calls()
            y = compiled(x)
            assert native_calls() - before == 3  # every layer, from C++
            assert torch.equal(y, expected)
    torch._dynamo.reset()


def test_an_aoti_package_loads_and_runs_the_pyw8a8_kernels(tmp_path):
    """torch.export, AOTInductor's package and its loader: the eager bits, from the
    native operator (the package's constants are 16-byte aligned; it reads its own aligned
    copy of the panels)."""
    layers = _layers()
    x = torch.randn(3, 64)
    program = torch.export.export(layers, (x,))
    path = torch._inductor.aoti_compile_and_package(program,
                                                    package_path=str(tmp_path / "m.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    with torch.inference_mode():
        expected = layers(x)
        for _ in range(60):
            y = runner(x)
        before = native_calls()
        y = runner(x)
        assert torch.equal(y, expected)
        assert native_calls() - before == 3
