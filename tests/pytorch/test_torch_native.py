"""The native operator (pyw8a8/torch/csrc): built where a C++ compiler is, settled calls run
in C++ with no Python and return pyw8a8.matmul's bits, anything else takes the Python
operator's route and its errors, and where it is off the layers run on the Python operator.
Skipped, with the reason shown, where torch is not installed."""
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import pyw8a8

from torch_helpers import OpsCalled, assert_refuses_bad_input, dense, torch

pt = pytest.importorskip("pyw8a8.torch")
from pyw8a8.torch import _native  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
native = pytest.mark.skipif(_native.NATIVE is None, reason="the native operator is off here "
                            "(PYW8A8_TORCH_NATIVE=0, or no C++ compiler to build it)")


def calls():
    return dict(_native.NATIVE.counters())


def settle(layer, x, limit=400):
    """Call the layer until a call of x's rows runs natively (the tuner tries candidate
    blockings first)."""
    for _ in range(limit):
        before = calls()["native_calls"]
        with torch.inference_mode():
            layer(x)
        if calls()["native_calls"] > before:
            return
    pytest.fail(f"no native call for {tuple(x.shape)} in {limit} calls")


def routes(f):
    """f()'s result and how many calls it made natively and through Python."""
    before = calls()
    y = f()
    after = calls()
    return y, after["native_calls"] - before["native_calls"], (after["python_calls"] -
                                                                before["python_calls"])


def reference(layer, x):
    bias = None if layer.bias is None else layer.bias.numpy()
    y = pyw8a8.matmul(x.float().numpy(), layer.packed("weight"), bias=bias,
                      activation=layer.activation)
    return torch.from_numpy(y).to(x.dtype)


def test_the_native_operator_is_built_where_a_compiler_is():
    if os.environ.get("PYW8A8_TORCH_NATIVE", "1").strip() == "0":
        pytest.skip("PYW8A8_TORCH_NATIVE=0 keeps the Python operator")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: the layers run on the Python operator")
    assert _native.NATIVE is not None


@native
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "silu"])
def test_settled_calls_run_natively_and_return_the_matmul_bits(activation):
    layer = pt.Linear.from_float(dense(96, 40), activation=activation)
    x = torch.randn(6, 96)
    settle(layer, x)
    with torch.inference_mode():
        # Any strides, bfloat16, other leading dimensions of the same rows: all from C.
        for other in (x, x.t().contiguous().t(), x.bfloat16(), x.reshape(2, 3, 96),
                      torch.randn(6, 96)):
            y, in_c, in_python = routes(lambda: layer(other))
            assert (in_c, in_python) == (1, 0)
            assert y.dtype == other.dtype and y.shape == (*other.shape[:-1], 40)
            assert torch.equal(y, reference(layer, other))


@native
def test_the_gated_unit_runs_natively_with_matmul_pairs_bits():
    unit = pt.GatedLinear.from_float(dense(64, 48, seed=1), dense(64, 48, seed=2),
                                     glu="gelu_tanh")
    x = torch.randn(3, 64)
    settle(unit, x)
    with torch.inference_mode():
        y, in_c, in_python = routes(lambda: unit(x))
    assert (in_c, in_python) == (1, 0)
    expected = pyw8a8.matmul_pair(x.numpy(), unit.packed("gate"), unit.packed("up"),
                                  glu="gelu_tanh", bias1=unit.gate_bias.numpy(),
                                  bias2=unit.up_bias.numpy())
    assert np.array_equal(y.numpy(), expected)


@native
def test_a_freed_large_output_is_reused_and_a_live_one_never():
    layer = pt.Linear.from_float(dense(64, 1024))
    x = torch.randn(32, 64)  # a 128 KiB output: kept when freed
    settle(layer, x)
    with torch.inference_mode():
        first = layer(x)
        address, expected = first.data_ptr(), first.clone()
        del first
        assert calls()["outputs_kept_bytes"] >= 32 * 1024 * 4
        again, in_c, _ = routes(lambda: layer(x))
        assert in_c == 1 and again.data_ptr() == address
        live = layer(x + 1)
        assert live.data_ptr() != again.data_ptr()
        assert torch.equal(again, expected) and torch.equal(live, reference(layer, x + 1))
        assert torch.equal(again, reference(layer, x))


@native
def test_what_c_cannot_take_gets_the_python_route_and_its_errors():
    layer = pt.Linear.from_float(dense(64, 8), activation="gelu")
    x = torch.randn(5, 64)
    settle(layer, x)
    with torch.inference_mode():
        # Rows this weight settled nothing for yet: checked and tuned in Python.
        y, in_c, in_python = routes(lambda: layer(x[:4]))
        assert (in_c, in_python) == (0, 1) and torch.equal(y, reference(layer, x[:4]))
    assert_refuses_bad_input(layer, x)
    with torch.no_grad():
        layer.bias[2] = float("nan")
        with pytest.raises(ValueError, match="bias"):
            layer(x)


class _CalledFunctions(torch.overrides.TorchFunctionMode):
    """The functions called through torch's Python API, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@native
def test_eager_layers_enter_the_operators_from_cpp_and_the_dispatcher_still_sees_them():
    """An eager layer calls the operator through the native module's entry, not torch.ops'
    Python binding: the same operator and bits, dispatched as before, so a dispatch mode
    and the profiler see each call; a __torch_function__ mode, which only torch.ops'
    binding consults, gets the call through torch.ops."""
    layer = pt.Linear.from_float(dense(96, 40), activation="silu")
    unit = pt.GatedLinear.from_float(dense(96, 24, seed=1), dense(96, 24, seed=2),
                                     glu="gelu_tanh")
    x = torch.randn(3, 96)
    settle(layer, x)
    settle(unit, x)
    b = layer._buffers
    args = (x, b["weight_panels"], b["weight_psum"], b["weight_scales"], b["weight_header"],
            b["bias"], "silu")
    with torch.inference_mode():
        assert torch.equal(_native.eager_linear(*args), torch.ops.pyw8a8.linear(*args))
        assert torch.equal(layer(x), reference(layer, x))
        with OpsCalled() as dispatched:
            y, g = layer(x), unit(x)
        assert dispatched.names == ["pyw8a8.linear", "pyw8a8.gated_linear"]
        assert torch.equal(y, reference(layer, x)) and torch.equal(g, unit(x))
        with torch.profiler.profile() as profile:
            layer(x)
        assert "pyw8a8::linear" in [event.name for event in profile.events()]
        with _CalledFunctions() as called:
            y = layer(x)
        assert any("pyw8a8.linear" in name for name in called.names), called.names
        assert torch.equal(y, reference(layer, x))


@native
def test_a_scoped_or_changed_isa_is_seen():
    layer = pt.Linear.from_float(dense(64, 32))
    x = torch.randn(2, 64)
    settle(layer, x)
    expected = reference(layer, x)
    with torch.inference_mode():
        with pyw8a8.use_isa("scalar"):  # the scope is the Python route's to see
            y, in_c, in_python = routes(lambda: layer(x))
        assert (in_c, in_python) == (0, 1) and torch.equal(y, expected)
        before = pyw8a8.isa()
        pyw8a8.set_isa("scalar")
        try:
            y, in_c, in_python = routes(lambda: layer(x))  # a new setting: settled anew
            assert in_c == 0 and torch.equal(y, expected)
        finally:
            pyw8a8.set_isa(before)


@native
def test_weights_written_in_place_and_unaligned_panels_are_read_as_they_are():
    layer = pt.Linear.from_float(dense(64, 24))
    panels, psum, scales, header = layer._tensors("weight")
    # Panels 16 bytes past a cache line, as an AOTInductor package stores its constants:
    # the native side reads its own aligned copy of them.
    buffer = torch.empty(panels.numel() + 64, dtype=torch.uint8)
    offset = (16 - buffer.data_ptr()) % 64
    shifted = buffer[offset:offset + panels.numel()].view(panels.shape)
    shifted.copy_(panels)
    assert shifted.data_ptr() % 64 == 16
    x = torch.randn(4, 64)

    def op():
        return torch.ops.pyw8a8.linear(x, shifted, psum, scales, header, layer.bias, "")

    with torch.inference_mode():
        for _ in range(400):
            y, in_c, _ = routes(op)
            if in_c:
                break
        assert in_c == 1 and torch.equal(y, reference(layer, x))
    # Another weight of this shape written into the same tensors: their versions change,
    # and the weight is read anew (the aligned copy of the panels too).
    other = pt.Linear.from_float(dense(64, 24, seed=5))
    with torch.no_grad():
        for mine, theirs in zip((shifted, psum, scales), other._tensors("weight")):
            mine.copy_(theirs)
    with torch.inference_mode():
        y = op()
    expected = pyw8a8.matmul(x.numpy(), other.packed("weight"), bias=layer.bias.numpy())
    assert torch.equal(y, torch.from_numpy(expected))


@native
def test_threads_share_the_native_operator():
    layers = [pt.Linear.from_float(dense(64, 32, seed=s)) for s in range(3)]
    x = torch.randn(3, 64)
    for layer in layers:
        settle(layer, x)
    expected = [reference(layer, x) for layer in layers]
    failures = []

    def work(i):
        with torch.inference_mode():
            for _ in range(100):
                if not torch.equal(layers[i % 3](x), expected[i % 3]):
                    failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures and not any(t.is_alive() for t in threads)


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, **env})


CHECK = """
import warnings, numpy as np, torch, pyw8a8
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    import pyw8a8.torch as pt
from pyw8a8.torch import _native
torch.manual_seed(0)
layer = pt.Linear.from_float(torch.nn.Linear(64, 16), activation="silu")
x = torch.randn(3, 64)
with torch.inference_mode():
    y = layer(x)
ref = pyw8a8.matmul(x.numpy(), layer.packed("weight"), bias=layer.bias.numpy(),
                    activation="silu")
assert np.array_equal(y.numpy(), ref)
print("native", _native.NATIVE is not None)
print("warnings", [str(w.message) for w in seen if "native operator" in str(w.message)])
"""


def test_switched_off_the_layers_run_on_the_python_operator_without_a_warning():
    result = _run(CHECK, PYW8A8_TORCH_NATIVE="0")
    assert result.returncode == 0, result.stderr
    assert "native False" in result.stdout and "warnings []" in result.stdout


def test_where_the_build_fails_a_warning_says_why_once_and_the_layers_still_run(tmp_path):
    result = _run(CHECK, PYW8A8_CACHE_DIR=str(tmp_path), CXX="false", PYW8A8_TORCH_NATIVE="1")
    assert result.returncode == 0, result.stderr
    assert "native False" in result.stdout
    line = [s for s in result.stdout.splitlines() if s.startswith("warnings")][0]
    assert line.count("the native operator is off: it could not be built") == 1, line


@pytest.mark.skipif(_native.NATIVE is None, reason="the module runs on the Python operator "
                    "already")
def test_the_layer_tests_pass_on_the_python_operator():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         os.path.join(ROOT, "tests", "pytorch", "test_torch_layers.py")],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env={**os.environ, "PYW8A8_TORCH_NATIVE": "0"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
