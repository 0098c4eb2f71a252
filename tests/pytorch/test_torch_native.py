"""The native operator (pyw8a8/torch/csrc): built where a C++ compiler is, every call runs
the core's call object from C++ (no Python) and returns pyw8a8.matmul's bits and errors;
where it cannot be built, importing pyw8a8.torch says why.  Skipped, with the reason
shown, where torch is not installed."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import pyw8a8

from torch_helpers import OpsCalled, assert_refuses_bad_input, dense, native_calls, torch

pt = pytest.importorskip("pyw8a8.torch")
from pyw8a8.torch import _native  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reference(layer, x):
    bias = None if layer.bias is None else layer.bias.numpy()
    y = pyw8a8.matmul(x.float().numpy(), layer.packed("weight"), bias=bias,
                      activation=layer.activation)
    return torch.from_numpy(y).to(x.dtype)


@pytest.mark.parametrize("activation", [None, "gelu_tanh", "silu"])
def test_calls_return_the_matmul_bits_from_the_first_on(activation):
    """No call goes back to Python: the first call of a shape (tuned in C) and every one
    after it, any strides, bfloat16, other leading dimensions."""
    layer = pt.Linear.from_float(dense(96, 40), activation=activation)
    x = torch.randn(6, 96)
    with torch.inference_mode():
        for other in (x, x.t().contiguous().t(), x.bfloat16(), x.reshape(2, 3, 96),
                      torch.randn(6, 96), x[:0], x[:1]):
            for _ in range(12):  # across the tuner's candidates
                before = native_calls()
                y = layer(other)
                assert native_calls() == before + 1
                assert y.dtype == other.dtype and y.shape == (*other.shape[:-1], 40)
                assert torch.equal(y, reference(layer, other))


def test_the_gated_unit_returns_matmul_pairs_bits():
    unit = pt.GatedLinear.from_float(dense(64, 48, seed=1), dense(64, 48, seed=2),
                                     glu="gelu_tanh")
    x = torch.randn(3, 64)
    expected = pyw8a8.matmul_pair(x.numpy(), unit.packed("gate"), unit.packed("up"),
                                  glu="gelu_tanh", bias1=unit.gate_bias.numpy(),
                                  bias2=unit.up_bias.numpy())
    with torch.inference_mode():
        for _ in range(12):
            assert np.array_equal(unit(x).numpy(), expected)


def test_a_freed_large_output_is_reused_and_a_live_one_never():
    """The operator's outputs come from the core's kept output memory, numpy's too."""
    from pyw8a8._outputs import recycled_bytes
    layer = pt.Linear.from_float(dense(64, 1024))
    x = torch.randn(32, 64)  # a 128 KiB output: kept when freed
    with torch.inference_mode():
        first = layer(x)
        address, expected = first.data_ptr(), first.clone()
        del first
        assert recycled_bytes() >= 32 * 1024 * 4
        again = layer(x)
        assert again.data_ptr() == address
        live = layer(x + 1)
        assert live.data_ptr() != again.data_ptr()
        assert torch.equal(again, expected) and torch.equal(live, reference(layer, x + 1))
        assert torch.equal(again, reference(layer, x))


def test_errors_are_the_cores_with_numpys_messages():
    """What the core refuses, the operator raises with pyw8a8.matmul's message."""
    layer = pt.Linear.from_float(dense(64, 8), activation="gelu")
    x = torch.randn(5, 64)
    assert_refuses_bad_input(layer, x)
    packed = layer.packed("weight")
    bad = x.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError) as numpy_error:
        pyw8a8.matmul(bad.numpy(), packed)
    with torch.inference_mode(), pytest.raises(ValueError) as torch_error:
        layer(bad)
    assert str(torch_error.value).startswith(str(numpy_error.value))
    b = layer._buffers
    with torch.inference_mode():
        with pytest.raises(ValueError, match="activation must be None or one of .* 'tanh'"):
            torch.ops.pyw8a8.linear(x, b["weight_panels"], b["weight_psum"],
                                    b["weight_scales"], b["weight_header"], None, "tanh")
        with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
            torch.ops.pyw8a8.linear(x, b["weight_panels"], b["weight_psum"],
                                    b["weight_scales"], b["weight_header"], torch.ones(9), "")
    with torch.no_grad():
        layer.bias[2] = float("nan")
        with pytest.raises(ValueError, match="bias holds NaN or Inf"):
            layer(x)


def test_a_damaged_weight_is_refused_with_the_saved_formats_messages():
    """A weight's tensors are checked the first time they are seen, contents included."""
    layer = pt.Linear.from_float(dense(64, 24))
    panels, psum, scales, header = (t.clone() for t in layer._tensors("weight"))
    x = torch.randn(2, 64)
    cases = [
        (3, header.clone().index_fill_(0, torch.tensor([0]), 9), "format 9"),
        (3, header.clone().index_fill_(0, torch.tensor([5]), 100), "power of two"),
        (2, scales[:-1].clone(), "'scales' has 23 elements"),
        (0, panels.clone().zero_(), "holds -128"),
        (2, scales.clone().fill_(-1.0), "negative or non-finite"),
    ]
    for at, damaged, match in cases:
        parts = [panels, psum, scales, header]
        parts[at] = damaged
        with torch.inference_mode(), pytest.raises(ValueError, match=match):
            torch.ops.pyw8a8.linear(x, *parts, None, "")


class _CalledFunctions(torch.overrides.TorchFunctionMode):
    """The functions called through torch's Python API, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_eager_layers_enter_the_operators_from_cpp_and_the_dispatcher_still_sees_them():
    """An eager layer calls the operator through the native module's entry, not torch.ops'
    Python binding: the same operator and bits, dispatched as before, so a dispatch mode
    and the profiler see each call; a __torch_function__ mode, which only torch.ops'
    binding consults, gets the call through torch.ops."""
    layer = pt.Linear.from_float(dense(96, 40), activation="silu")
    unit = pt.GatedLinear.from_float(dense(96, 24, seed=1), dense(96, 24, seed=2),
                                     glu="gelu_tanh")
    x = torch.randn(3, 96)
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


def test_a_scoped_or_changed_isa_is_seen():
    """use_isa's body and set_isa reach the operator's calls: the blockings they settle
    are remembered for the ISA they ran on."""
    layer = pt.Linear.from_float(dense(64, 32))
    x = torch.randn(2, 64)
    expected = reference(layer, x)
    plan = layer.packed("weight").plan()
    nthreads = pyw8a8._threads.threads_for(2 * 64 * 32)

    def settled_on(name):
        ops = pyw8a8._dispatch.IsaOps(name)
        return layer.packed("weight").plan().settled_blocking(0, ops, 2, nthreads)

    del plan
    with torch.inference_mode():
        with pyw8a8.use_isa("scalar"):
            for _ in range(100):
                assert torch.equal(layer(x), expected)
        before = pyw8a8.isa()
        pyw8a8.set_isa("scalar_u8s8")
        try:
            for _ in range(100):
                assert torch.equal(layer(x), expected)
        finally:
            pyw8a8.set_isa(before)
    # The torch operator's plan is its own (made from the tensors), so the ISAs are seen
    # through its results above; numpy's plan of the same weight settles on the same rule.
    with pyw8a8.use_isa("scalar"):
        for _ in range(100):
            pyw8a8.matmul(x.numpy(), layer.packed("weight"))
    assert settled_on("scalar") is not None


def test_weights_written_in_place_and_unaligned_panels_are_read_as_they_are():
    layer = pt.Linear.from_float(dense(64, 24))
    panels, psum, scales, header = layer._tensors("weight")
    # Panels 16 bytes past a cache line, as an AOTInductor package stores its constants:
    # the core reads its own aligned copy of them.
    buffer = torch.empty(panels.numel() + 64, dtype=torch.uint8)
    offset = (16 - buffer.data_ptr()) % 64
    shifted = buffer[offset:offset + panels.numel()].view(panels.shape)
    shifted.copy_(panels)
    assert shifted.data_ptr() % 64 == 16
    x = torch.randn(4, 64)

    def op():
        return torch.ops.pyw8a8.linear(x, shifted, psum, scales, header, layer.bias, "")

    with torch.inference_mode():
        assert torch.equal(op(), reference(layer, x))
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


def test_threads_share_the_native_operator():
    layers = [pt.Linear.from_float(dense(64, 32, seed=s)) for s in range(3)]
    x = torch.randn(3, 64)
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


def test_where_the_build_fails_the_import_says_why(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "import pyw8a8.torch"], capture_output=True, text=True,
        timeout=600, cwd=ROOT, env={**os.environ, "PYW8A8_CACHE_DIR": str(tmp_path),
                                    "CXX": "false"})
    assert result.returncode != 0
    assert "ImportError: pyw8a8.torch: its C++ operator could not be built" in result.stderr
    assert "building its C++ operator for torch" in result.stderr  # the wait is said
