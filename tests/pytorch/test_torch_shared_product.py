"""Layers called one after another on one input (q, k, v) as one product: found in the
forward's source, the same bits as each layer alone, and kept right through loads, copies,
writes, threads and graphs."""
import copy
import pickle
import threading

import pytest

import pyw8a8

from torch_helpers import COMPILE_MODES, assert_refuses_bad_input, native_calls, torch

pt = pytest.importorskip("pyw8a8.torch")
from pyw8a8.torch import fusion  # noqa: E402


class Attention(torch.nn.Module):
    """Grouped-query attention as transformers writes it: 4 query heads, 2 key/value heads."""

    def __init__(self, d=64, bias=True):
        super().__init__()
        self.q_proj = torch.nn.Linear(d, 64, bias=bias)
        self.k_proj = torch.nn.Linear(d, 32, bias=bias)
        self.v_proj = torch.nn.Linear(d, 32, bias=bias)
        self.o_proj = torch.nn.Linear(64, d, bias=bias)

    def forward(self, hidden_states):
        hidden_shape = (*hidden_states.shape[:-1], -1, 16)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(-2, -3)
        key = self.k_proj(hidden_states).view(*hidden_shape).transpose(-2, -3)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(-2, -3)
        key, value = key.repeat_interleave(2, -3), value.repeat_interleave(2, -3)
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value)
        return self.o_proj(out.transpose(-2, -3).reshape(*hidden_states.shape[:-1], 64))


def _models(seed=0, **kwargs):
    """A float Attention, pyw8a8's with the shared product, and pyw8a8's without."""
    torch.manual_seed(seed)
    model = Attention(**kwargs).eval()
    return model, pt.quantize(model), pt.quantize(model, fuse=False)


def _own(layer, x):
    """`layer`'s own product: pyw8a8.matmul on its packed weight."""
    bias = None if layer.bias is None else layer.bias.numpy()
    return torch.from_numpy(pyw8a8.matmul(x.reshape(-1, x.shape[-1]).numpy(),
                                          layer.packed("weight"), bias=bias)
                            ).reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("bias", [True, False])
def test_q_k_v_run_as_one_product_with_each_layers_bits(bias):
    model, shared, alone = _models(bias=bias)
    [unit] = shared.pyw8a8_report.shared
    assert (unit.members, unit.input) == (("q_proj", "k_proj", "v_proj"), "hidden_states")
    assert "one product: q_proj, k_proj, v_proj" in str(shared.pyw8a8_report)
    assert alone.pyw8a8_report.shared == [] and alone.q_proj._shared is None
    assert set(shared.state_dict()) == set(alone.state_dict())
    x = torch.randn(3, 5, 64)
    with torch.inference_mode():
        y = shared(x)
        assert torch.equal(y, alone(x))
        for name in ("q_proj", "k_proj", "v_proj"):  # each alone: its own product
            layer = getattr(shared, name)
            assert torch.equal(layer(x), _own(layer, x))
        assert shared.q_proj._shared.memo is None  # the product is not kept past v
    assert (y - model(x)).abs().max() < 0.05 * model(x).abs().max()


def test_a_call_outside_the_order_runs_the_layers_own_product():
    _, shared, _ = _models()
    q, k, v = shared.q_proj, shared.k_proj, shared.v_proj
    x, other = torch.randn(4, 64), torch.randn(4, 64)
    with torch.no_grad():
        q(x)
        assert torch.equal(k(other), _own(k, other))  # another input
        assert torch.equal(v(x), _own(v, x))  # v before k
        q(x)
        x.mul_(2)  # written since the product
        assert torch.equal(k(x), _own(k, x))
        with torch.inference_mode():
            h = torch.randn(4, 64)
            q(h), k(h)
            assert torch.equal(v(h), _own(v, h))


def test_bad_input_is_refused_through_the_shared_product():
    _, shared, _ = _models()
    assert_refuses_bad_input(shared.q_proj, torch.randn(5, 64))
    with torch.inference_mode(), pytest.raises(ValueError, match="expects K=64"):
        shared(torch.randn(2, 63))


def test_loads_copies_and_writes_keep_the_shared_weight_right():
    _, shared, alone = _models()
    _, _, other = _models(seed=1)
    x = torch.randn(2, 3, 64)
    with torch.inference_mode():
        shared.load_state_dict(other.state_dict())  # the shared weight packed again
        assert shared.q_proj._shared.intact() and torch.equal(shared(x), other(x))
        for copied in (copy.deepcopy(shared), pickle.loads(pickle.dumps(shared))):
            assert copied.q_proj._shared is not shared.q_proj._shared
            assert torch.equal(copied(x), other(x)) and copied.q_proj._shared.intact()
    with torch.no_grad():  # a write in place reaches the shared weight (its memory)
        shared.k_proj.weight_scales.mul_(2)
        other.k_proj.weight_scales.mul_(2)
        shared.v_proj.bias += 1
        other.v_proj.bias += 1
    with torch.inference_mode():
        assert torch.equal(shared(x), other(x))
    shared.v_proj.weight_scales = other.v_proj.weight_scales.clone() * 3  # replaced
    other.v_proj.weight_scales *= 3
    with torch.inference_mode():
        assert shared.q_proj._shared.intact() and torch.equal(shared(x), other(x))


def test_layers_that_cannot_share_after_a_load_run_alone():
    torch.manual_seed(0)
    model = Attention().eval()
    shared, alone = pt.quantize(model), pt.quantize(model, fuse=False)
    reblocked = pt.quantize(model, block=32).state_dict()
    state = {**shared.state_dict(), **{k: v for k, v in reblocked.items()
                                       if k.startswith("k_proj.")}}
    shared.load_state_dict(state)  # k_proj's layout now differs from q_proj's
    alone.load_state_dict(state)
    group = shared.q_proj._shared
    assert not group.ready and group.memo is None
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(shared(x), alone(x))


def test_threads_sharing_a_model_each_get_their_own_product():
    _, shared, alone = _models()
    inputs = [torch.randn(2, 7, 64) for _ in range(4)]
    with torch.inference_mode():
        expected = [alone(x) for x in inputs]
    failures = []

    def work(i):
        with torch.inference_mode():
            for _ in range(60):
                if not torch.equal(shared(inputs[i]), expected[i]):
                    failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compiled_the_shared_product_is_one_operator_call_with_the_eager_bits(mode):
    """Under every compile mode: one graph (fullgraph refuses a break), the eager bits, a
    changing row count included, and two operator calls a forward: q, k and v as one
    product, then o_proj."""
    import torch._inductor.config as inductor
    config, options = COMPILE_MODES[mode]
    _, shared, alone = _models()
    torch._dynamo.reset()
    with inductor.patch(config), torch.inference_mode():
        compiled = torch.compile(shared, fullgraph=True, **options)
        for shape in [(2, 5, 64), (3, 64)] if mode == "dynamic" else [(2, 5, 64)]:
            x = torch.randn(*shape)
            for _ in range(60):  # the first calls of a shape tune its blocking
                compiled(x)
            expected = alone(x)
            before = native_calls()
            assert torch.equal(compiled(x), expected)
            assert native_calls() - before == 2
    torch._dynamo.reset()


def test_an_aoti_package_runs_the_shared_product(tmp_path):
    _, shared, alone = _models()
    x = torch.randn(3, 64)
    program = torch.export.export(shared, (x,))
    assert sum(n.target is torch.ops.pyw8a8.linear.default for n in program.graph.nodes) == 2
    path = torch._inductor.aoti_compile_and_package(program,
                                                    package_path=str(tmp_path / "a.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    with torch.inference_mode():
        expected = alone(x)
        before = native_calls()
        assert torch.equal(runner(x), expected)
        assert native_calls() - before == 2


class Rebound(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(64, 64) for _ in range(3))

    def forward(self, h):
        x = self.a(h)
        h = self.b(h).view(-1, 64)  # rebinds h: c reads another tensor
        y = self.c(h)
        return x + h + y


class Between(Rebound):
    def forward(self, h):
        x = self.a(h)
        h.mul_(2)  # a statement between: no run
        y = self.b(h)
        return x + y + self.c(h)


class Twice(Rebound):
    def forward(self, h):
        x = self.a(h)
        y = self.b(h)
        return x + y + self.b(h) + self.c(h)  # b called twice


class Calls(Rebound):
    def forward(self, h):
        x = self.a(h).view(self.shape(h))  # a call in the reshape: anything could run
        y = self.b(h)
        return x + y + self.c(h)

    def shape(self, h):
        return h.shape


class Mixed(Rebound):
    def forward(self, h, e):
        x = self.a(h)
        y = self.b(e)  # another input: b and c share e
        z = self.c(e).transpose(0, 1).transpose(0, 1)
        return x + y + z


def test_only_consecutive_calls_on_one_unwritten_input_share():
    assert fusion._forward_runs(Rebound) == ((("a", "b"), "h"),)
    assert fusion._forward_runs(Between) == ()
    assert fusion._forward_runs(Twice) == ()
    assert fusion._forward_runs(Calls) == ()
    assert fusion._forward_runs(Mixed) == ((("b", "c"), "e"),)
    torch.manual_seed(0)
    model = Rebound()
    q = pt.quantize(model)
    assert [s.members for s in q.pyw8a8_report.shared] == [("a", "b")]
    h = torch.randn(4, 64)
    with torch.inference_mode():
        assert torch.equal(q(h), pt.quantize(model, fuse=False)(h))
    excluded = pt.quantize(model, exclude=["b"])
    assert excluded.pyw8a8_report.shared == [] and excluded.a._shared is None


def test_transformers_attention_blocks_are_found():
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert import modeling_bert
    from transformers.models.llama import modeling_llama
    assert fusion._forward_runs(modeling_llama.LlamaAttention) == (
        (("q_proj", "k_proj", "v_proj"), "hidden_states"),)
    assert fusion._forward_runs(modeling_bert.BertSelfAttention) == (
        (("query", "key", "value"), "hidden_states"),)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=97)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    q = pt.quantize(model)
    assert len(q.pyw8a8_report.shared) == 2
    alone = copy.deepcopy(q)
    for module in alone.modules():
        module._shared = None
    ids = torch.tensor([[5, 7, 11, 13, 17]])
    with torch.inference_mode():
        assert torch.equal(q(input_ids=ids).logits, alone(input_ids=ids).logits)
