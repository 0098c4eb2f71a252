"""Which of a model's linear layers can take the activation after them into their kernel.

A parent module whose own forward code (traced with torch.fx, its children kept as calls)
passes a linear child's output straight to an activation child, and uses neither anywhere
else, computes ``act(linear(x))``: :func:`pyw8a8.torch.quantize` then packs that linear
layer with the activation fused and puts ``nn.Identity()`` in the activation's place, so
the parent's code, type and ``state_dict`` keys stay as they were.  The activation is
recognized by its type (``nn.ReLU``, ``nn.SiLU``, ``nn.GELU``) or, for a parameterless
module of another type (transformers' ``GELUActivation``, say), by what it computes on a
probe of values from -12 to 12.  A parent whose forward does not trace is left alone.

A gated unit, ``act(gate(x)) * up(x)``, is recognized the same way.  Where it is the
parent's whole forward, ``[down](act(gate(x)) * up(x))`` with nothing else (the FFN of
Llama, Gemma and Qwen), :func:`pyw8a8.torch.quantize` packs the gate and the up projection
into one :class:`pyw8a8.torch.GatedLinear` (x quantized once, neither product stored) and
the parent becomes the ``torch.fx.GraphModule`` of that same graph with the unit as one
call (:func:`fused_parent`): the traced graph is the parent's code, so nothing else can
change.  Elsewhere the product stays in the parent's code and the report names the unit.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional

import torch
from torch import fx, nn


@dataclass(frozen=True)
class Fusion:
    """In `parent` (a qualified name), ``activation(linear(x))`` through two children."""

    parent: str
    linear: str
    activation_module: str
    activation: str


@dataclass(frozen=True)
class GatedUnit:
    """In `parent`, ``activation(gate(x)) * up(x)``; `down` the child its product goes to
    where that is all the parent's forward does ('' for the product itself), None where
    the forward does more (the unit then stays in the parent's code)."""

    parent: str
    gate: str
    up: str
    activation: str
    activation_module: str = ""
    down: Optional[str] = None


_REFERENCES = {
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
}
_PROBE = torch.linspace(-12.0, 12.0, 4800)


def activation_name(module: nn.Module) -> Optional[str]:
    """pyw8a8's name of the elementwise activation `module` computes, or None."""
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.SiLU):
        return "silu"
    if isinstance(module, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        return None
    try:
        with torch.no_grad():
            got = module(_PROBE.clone())
            shuffled = module(_PROBE.flip(0).reshape(1, 3, -1).clone())
    except Exception:  # not a one-tensor elementwise module
        return None
    if not isinstance(got, torch.Tensor) or got.shape != _PROBE.shape or \
            not torch.equal(shuffled.reshape(-1).flip(0), got):
        return None
    for name, fn in _REFERENCES.items():
        expected = fn(_PROBE)
        if torch.allclose(got, expected, rtol=1e-6, atol=1e-6):
            return name
    return None


class _ChildrenAsCalls(fx.Tracer):
    """Traces a module's own forward: every child stays one call_module node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def _graph(parent: nn.Module) -> Optional[fx.Graph]:
    try:
        return _ChildrenAsCalls().trace(parent)
    except Exception:  # control flow on tensors, unsupported Python: no fusion here
        return None


def find(model: nn.Module, linears: set[int]) -> tuple[list[Fusion], list[GatedUnit]]:
    """The fusions and gated units in `model`; `linears` are the ids of the linear layers
    that will be replaced (each must have one parent and one call)."""
    fusions, gated = [], []
    for parent_name, parent in model.named_modules():
        children = dict(parent.named_children())
        if not any(id(c) in linears for c in children.values()):
            continue
        graph = _graph(parent)
        if graph is None:
            continue
        calls: dict[str, list[fx.Node]] = {}
        for node in graph.nodes:
            if node.op == "call_module":
                calls.setdefault(node.target, []).append(node)

        def single_call(name):
            nodes = calls.get(name, [])
            return nodes[0] if len(nodes) == 1 and name in children else None

        def linear_call(node):
            ok = (node.op == "call_module" and id(children.get(node.target)) in linears and
                  single_call(node.target) is node and len(node.users) == 1)
            return node.target if ok else None

        for name, nodes in calls.items():
            node = single_call(name)
            if node is None or len(node.args) != 1 or node.kwargs:
                continue
            source = node.args[0]
            if not isinstance(source, fx.Node) or linear_call(source) is None:
                continue
            act = activation_name(children[name])
            if act is None:
                continue
            product = next(iter(node.users), None)
            if product is not None and len(node.users) == 1 and product.op == "call_function" \
                    and product.target in (operator.mul, torch.mul) and len(product.args) == 2:
                other = [a for a in product.args if a is not node]
                up = other[0] if len(other) == 1 and isinstance(other[0], fx.Node) else None
                if up is not None and linear_call(up) and up.args == source.args:
                    gated.append(GatedUnit(parent_name, source.target, up.target, act, name,
                                           _whole_forward(graph, source, node, up, product)))
            fusions.append(Fusion(parent_name, source.target, name, act))
    return fusions, gated


def _whole_forward(graph: fx.Graph, gate: fx.Node, act: fx.Node, up: fx.Node,
                   product: fx.Node) -> Optional[str]:
    """Where the parent's forward of one input is the gated unit on that input and, at
    most, one child called on its product and returned: that child's name ('' for none);
    else None."""
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    if len(inputs) != 1 or inputs[0].args or gate.args != (inputs[0],):
        return None
    unit = {gate, act, up, product}
    rest = [n for n in graph.nodes if n.op not in ("placeholder", "output") and n not in unit]
    output = next(n for n in graph.nodes if n.op == "output")
    if not rest:
        return "" if output.args == (product,) else None
    [down] = rest if len(rest) == 1 else [None]
    if (down is None or down.op != "call_module" or down.args != (product,) or down.kwargs
            or output.args != (down,) or len(product.users) != 1):
        return None
    return down.target


def fused_parent(parent: nn.Module, unit: GatedUnit, gated: nn.Module) -> fx.GraphModule:
    """`parent` (whose forward `unit` is whole) as the GraphModule of its own graph with the
    unit one call of `gated`, in the gate's place; its other child (the down projection)
    kept as it is."""
    graph = fx.Graph()
    y = graph.call_module(unit.gate, (graph.placeholder("x"),))
    children = {unit.gate: gated}
    if unit.down:
        y = graph.call_module(unit.down, (y,))
        children[unit.down] = parent.get_submodule(unit.down)
    graph.output(y)
    module = fx.GraphModule(children, graph, class_name=type(parent).__name__)
    return module.train(parent.training)
