"""What the pyw8a8.torch tests share: torch (skipping the importing test module, with the
reason shown, where it is not installed) and the float layers they quantize."""
import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install '.[torch]')")


def dense(k, n, bias=True, seed=0):
    """A float nn.Linear(k, n), its initial weights set by `seed`."""
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n, bias=bias)


def assert_refuses_bad_input(layer, x):
    """`layer` (64 input features) refuses a row holding Inf (naming it), a wrong feature
    count and a gradient to record, whichever route its calls take; `x`: 5 good rows."""
    import pytest
    bad = x.clone()
    bad[3, 7] = float("inf")
    with torch.inference_mode():
        with pytest.raises(ValueError, match="row 3"):
            layer(bad)
        with pytest.raises(ValueError, match="x has 63 features .* expects K=64"):
            layer(torch.randn(5, 63))
    with pytest.raises(RuntimeError, match=r"inference_mode\(\)"):
        layer(x.clone().requires_grad_())


# The compile settings a user picks: Inductor's config patches, and torch.compile's arguments.
COMPILE_MODES = {
    "default": ({}, {}),
    "max-autotune": ({}, {"mode": "max-autotune"}),
    "freezing": ({"freezing": True}, {}),
    "cpp_wrapper": ({"cpp_wrapper": True}, {}),
    "dynamic": ({}, {"dynamic": True}),
}


def tiny_llama(seed=0, **config):
    """A Llama of random weights (`seed`), 2 layers, 4 query heads over 2 KV heads of 16, a
    vocabulary of 96; `config` overrides."""
    import transformers
    torch.manual_seed(seed)
    settings = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=96)
    settings.update(config)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings)).eval()


def tiny_gemma3(**config):
    """A Gemma 3 of random weights (seed 1), 2 layers (a sliding window of 6, then a global
    one), 4 query heads over 2 KV heads of 32, a vocabulary of 96; `config` overrides."""
    import transformers
    torch.manual_seed(1)
    settings = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=96,
                    sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                    query_pre_attn_scalar=32, attn_implementation="sdpa")
    settings.update(config)
    return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**settings)).eval()


def native_calls():
    """The products the native operator ran."""
    from pyw8a8.torch import _native
    return _native.NATIVE.calls()


class OpsCalled(torch.utils._python_dispatch.TorchDispatchMode):
    """The operators a forward calls, by name, as the dispatcher's Python key sees them."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))
