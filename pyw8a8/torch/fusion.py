"""Which of a model's linear layers can take the activation after them into their kernel.

A parent module whose own forward code (traced with torch.fx, its children kept as calls)
passes a linear child's output straight to an activation child, and uses neither anywhere
else, computes ``act(linear(x))``: :func:`pyw8a8.torch.quantize` then packs that linear
layer with the activation fused and puts ``nn.Identity()`` in the activation's place, so
the parent's code, type and ``state_dict`` keys stay as they were.  The activation is
recognized by its type (``nn.ReLU``, ``nn.SiLU``, ``nn.GELU``) or, for a parameterless
module of another type (transformers' ``GELUActivation``, say), by what it computes on a
probe of values from -12 to 12.  A parent whose forward does not trace is left alone.

A gated linear unit, ``act(gate(x)) * up(x)``, is recognized the same way.  Where it is the
parent's whole forward, ``[down](act(gate(x)) * up(x))`` with nothing else (the FFN of
Llama, Gemma and Qwen), :func:`pyw8a8.torch.quantize` packs the gate and the up projection
into one :class:`pyw8a8.torch.GatedLinear` (x quantized once, neither product stored) and
the parent becomes the ``torch.fx.GraphModule`` of that same graph with the unit as one
call (:func:`fused_parent`): the traced graph is the parent's code, so nothing else can
change.  Elsewhere the product stays in the parent's code and the report names the unit.

Linear children called one after another on one input (an attention block's query, key
and value projections) are found in the parent's forward source (:func:`shared_inputs`),
which torch.fx cannot trace in transformers' models: the layers then run as one product
(:mod:`pyw8a8.torch._shared_product`).
"""
from __future__ import annotations

import ast
import functools
import inspect
import operator
import textwrap
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
class GatedFusion:
    """In `parent`, the gated linear unit ``activation(gate(x)) * up(x)``; `down` the child
    its product goes to where that is all the parent's forward does ('' for the product
    itself), None where the forward does more (the unit then stays in the parent's code)."""

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


def find(model: nn.Module, linears: set[int]) -> tuple[list[Fusion], list[GatedFusion]]:
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
                    gated.append(GatedFusion(parent_name, source.target, up.target, act, name,
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


@dataclass(frozen=True)
class SharedInput:
    """In `parent`, the linear children `members` called in this order, in consecutive
    statements, on one local tensor (`input`) and nothing else in between."""

    parent: str
    members: tuple[str, ...]
    input: str


# What may follow a projection's call in its statement: reshaping its output, which reads
# nothing else and writes nothing.
_RESHAPES = frozenset({"view", "reshape", "transpose", "permute", "unflatten", "contiguous"})


def _inert(node: ast.expr) -> bool:
    """Whether evaluating `node` calls nothing (names, constants, attributes of them,
    arithmetic and tuples of them): nothing in it can write a tensor."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _inert(node.value)
    if isinstance(node, ast.Starred):
        return _inert(node.value)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_inert(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _inert(node.operand)
    if isinstance(node, ast.BinOp):
        return _inert(node.left) and _inert(node.right)
    return False


def _projection(stmt: ast.stmt, self_name: str) -> Optional[tuple[str, str, str]]:
    """(child, input, target) where `stmt` is ``target = self.child(input)``, optionally
    followed by reshaping calls with inert arguments, `input` and `target` plain names."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)):
        return None
    node = stmt.value
    while (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
           and node.func.attr in _RESHAPES and all(_inert(a) for a in node.args)
           and all(_inert(k.value) for k in node.keywords)):
        node = node.func.value
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == self_name
            and len(node.args) == 1 and isinstance(node.args[0], ast.Name)
            and not node.keywords):
        return None
    return node.func.attr, node.args[0].id, stmt.targets[0].id


@functools.lru_cache(maxsize=256)
def _forward_runs(cls: type) -> tuple[tuple[tuple[str, ...], str], ...]:
    """The runs of `cls.forward`: consecutive statements ``target = self.child(x)...`` on
    one input `x` that none of them assigns, each child named once in the whole forward;
    as (children in order, x).  Empty where the source cannot be read or parsed."""
    try:
        source = textwrap.dedent(inspect.getsource(cls.forward))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return ()
    function = next((n for n in tree.body if isinstance(n, (ast.FunctionDef,
                                                           ast.AsyncFunctionDef))), None)
    if function is None or not function.args.args:
        return ()
    self_name = function.args.args[0].arg
    mentions: dict[str, int] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == self_name:
            mentions[node.attr] = mentions.get(node.attr, 0) + 1
    runs = []

    def close(run):
        if len(run) > 1:
            runs.append((tuple(child for child, _, _ in run), run[0][1]))

    for node in ast.walk(function):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            run: list[tuple[str, str, str]] = []
            for stmt in statements:
                found = _projection(stmt, self_name)
                if found is not None and run and found[1] == run[0][1] and \
                        found[0] not in (child for child, _, _ in run):
                    run.append(found)
                else:
                    close(run)
                    run = [found] if found is not None else []
                if run and run[-1][2] == run[0][1]:  # the input rebound: the run ends
                    close(run)
                    run = []
            close(run)
    return tuple((children, x) for children, x in runs
                 if all(mentions.get(c) == 1 for c in children) and x != self_name)


def shared_inputs(model: nn.Module, linears: set[int]) -> list[SharedInput]:
    """The runs of linear layers in `model` called one after another on one input, whose
    parent's forward is its class's (read from its source); `linears` are the ids of the
    layers that will be replaced (each with one parent and one call)."""
    found = []
    for parent_name, parent in model.named_modules():
        children = dict(parent.named_children())
        if sum(id(c) in linears for c in children.values()) < 2 or \
                "forward" in vars(parent):
            continue
        for members, x in _forward_runs(type(parent)):
            if all(id(children.get(m)) in linears for m in members):
                found.append(SharedInput(parent_name, members, x))
    return found


def fused_parent(parent: nn.Module, unit: GatedFusion, gated: nn.Module) -> fx.GraphModule:
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
