"""`quantize`: a model's ``nn.Linear`` layers replaced by pyw8a8 layers, with the reasons.

It mirrors ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)``
(a copy unless ``inplace=True``; layers replaced by type, exactly ``nn.Linear``), with the
selection rule of pyw8a8's numpy :class:`~pyw8a8.router.Router`
(:func:`pyw8a8.router.selection.float_reason`): `include` and `exclude` glob patterns on
the qualified module names, and `min_in_features` (layers with fewer input features stay
float).  It plans first (which layers go W8A8, what is fused: the report), then replaces
the modules.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import nn

from .._validation import renamed_keyword
from ..router.selection import float_reason
from . import fusion
from ._packed_module import _PackedModule
from ._shared_product import SharedProduct, can_share
from .attention import ATTENTION_NAMES, enable_int8_attention
from .embedding import Int8Embedding
from .modules import GatedLinear, Linear

__all__ = ["Decision", "QuantizeReport", "quantize"]

logger = logging.getLogger("pyw8a8.torch")


@dataclass(frozen=True)
class Decision:
    """What :func:`quantize` did with one module: ``action`` 'w8a8' or 'float', and why."""

    name: str
    kind: str
    in_features: int
    out_features: int
    action: str
    reason: str


@dataclass
class QuantizeReport:
    """Every ``nn.Linear`` (and subclass) :func:`quantize` met, in module order."""

    decisions: list[Decision] = field(default_factory=list)
    fused: list[fusion.Fusion] = field(default_factory=list)
    gated: list[fusion.GatedFusion] = field(default_factory=list)
    #: Layers run as one product on their one input (an attention block's q, k and v).
    shared: list[fusion.SharedInput] = field(default_factory=list)
    #: A transformers model's attention implementation before and after, where quantize
    #: set pyw8a8's (:func:`~pyw8a8.torch.enable_int8_attention`): ("sdpa", "pyw8a8");
    #: the first one's where `model` holds several.
    attention: Optional[tuple[str, str]] = None
    #: Embeddings that shared a replaced layer's weight (a tied vocabulary), now
    #: :class:`~pyw8a8.torch.embedding.Int8Embedding`\ s reading its int8 copy: (embedding,
    #: layer).
    tied: list[tuple[str, str]] = field(default_factory=list)

    @property
    def replaced(self) -> list[str]:
        return [d.name for d in self.decisions if d.action == "w8a8"]

    @property
    def kept(self) -> dict[str, str]:
        """Modules kept in float, and why."""
        return {d.name: d.reason for d in self.decisions if d.action == "float"}

    def __str__(self) -> str:
        lines = [f"pyw8a8.torch.quantize: {len(self.replaced)} layers in W8A8, "
                 f"{len(self.kept)} kept in float"]
        lines += [f"  {d.action:5} {d.name or '(root)'} ({d.kind} {d.in_features} -> "
                  f"{d.out_features}): {d.reason}" for d in self.decisions]
        lines += [f"  fused {_join(f.parent, f.linear)} with the {f.activation} after it "
                  f"({_join(f.parent, f.activation_module)} is now nn.Identity)"
                  for f in self.fused]
        lines += [f"  gated {_join(g.parent, '')}: {g.activation}({g.gate}(x)) * {g.up}(x), "
                  + (f"one GatedLinear in {g.gate}'s place ({g.up} gone; "
                     f"{_join(g.parent, '')} is now a torch.fx.GraphModule)"
                     if g.down is not None else
                     "left in the module's code (its forward does more than the unit)")
                  for g in self.gated]
        lines += [f"  one product: {', '.join(_join(s.parent, m) for m in s.members)} "
                  f"(called in turn on {s.input})" for s in self.shared]
        lines += [f"  tied {e}: its rows read from {h}'s int8 weight (the float copy dropped)"
                  for e, h in self.tied]
        if self.attention:
            lines.append(f"  attention: {self.attention[1]} (int8 with a "
                         f"pyw8a8.torch.Int8Cache, else {self.attention[0]} as before)")
        return "\n".join(lines)


def _join(parent: str, child: str) -> str:
    return ".".join(p for p in (parent, child) if p) or "(root)"


def _selection(include: Optional[Sequence[str]], exclude: Optional[Sequence[str]],
               min_in_features: int) -> dict:
    """quantize's selection arguments, checked, as `float_reason`'s keywords."""
    selection = {"include": _patterns(include, "include"),
                 "exclude": _patterns(exclude, "exclude")}
    if (isinstance(min_in_features, bool) or not isinstance(min_in_features, int)
            or min_in_features < 0):
        raise ValueError(f"min_in_features must be a non-negative int, got "
                         f"{min_in_features!r}")
    return {**selection, "min_in_features": min_in_features}


def _patterns(value: Optional[Sequence[str]], name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    try:
        patterns = list(value)
    except TypeError:
        patterns = [value]
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{name} must be a glob pattern or a list of them")
    return patterns


def _reason(name: str, module: nn.Linear, selection: dict,
            devices: tuple[str, ...]) -> Optional[str]:
    """Why this linear layer stays float, or None when it goes W8A8 (its weight on one
    of `devices`)."""
    if type(module) is not nn.Linear:
        if isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear):
            return ("its parent reads its weight directly (nn.MultiheadAttention's out_proj; "
                    "quantize_dynamic keeps it too)")
        return f"a subclass of nn.Linear ({type(module).__name__}), whose forward may differ"
    reason = float_reason(name, module.out_features, module.in_features, **selection)
    if reason is not None:
        return reason
    weight = module.weight
    if weight.device.type not in devices:
        return f"its weight is on {weight.device}"
    if not weight.is_floating_point():
        return f"its weight is {weight.dtype}"
    return None


@dataclass
class _Plan:
    """What :func:`quantize` does to a model, decided before any module is replaced."""

    #: Every decision, and the fusions that will be made (shared inputs: candidates, kept
    #: by `_apply` where the layers can share one product).
    report: QuantizeReport
    #: The layers that go W8A8, under each of their names (a tied layer has several).
    layers: list[tuple[str, nn.Linear]]
    #: The gated units that become one GatedLinear: their parent's whole forward, gate and
    #: up of one shape.
    units: list[fusion.GatedFusion]


def _plan(model: nn.Module, selection: dict, fuse: bool, log_level: int,
          devices: tuple[str, ...] = ("cpu",)) -> _Plan:
    """Which of `model`'s layers go W8A8, each decision logged, and what is fused; a layer
    whose weight is on none of `devices` stays float."""
    report, layers = QuantizeReport(), []
    # Every name of a layer shared by several parents (tied weights) gets the one new layer.
    for name, module in model.named_modules(remove_duplicate=False):
        if not isinstance(module, nn.Linear):
            continue
        reason = _reason(name, module, selection, devices)
        d = Decision(name, type(module).__name__, module.in_features, module.out_features,
                     "float" if reason else "w8a8", reason or "w8a8")
        logger.log(log_level, "%s %s (%s %d -> %d): %s", d.action, d.name or "(root)",
                   d.kind, d.in_features, d.out_features, d.reason)
        report.decisions.append(d)
        if reason is None:
            layers.append((name, module))
    if not fuse:
        return _Plan(report, layers, [])
    # A layer of several names (tied) is called in several places: never fused.
    names = Counter(id(module) for _, module in layers)
    single = {i for i, count in names.items() if count == 1}
    report.fused, gated = fusion.find(model, single)
    report.shared = fusion.shared_inputs(model, single)
    units = [g for g in gated if g.down is not None and _one_shape(model, g)]
    report.gated = [g if g in units else dataclasses.replace(g, down=None) for g in gated]
    in_units = _unit_layers(units)
    report.fused = [f for f in report.fused if _join(f.parent, f.linear) not in in_units]
    return _Plan(report, layers, units)


def _one_shape(model: nn.Module, unit: fusion.GatedFusion) -> bool:
    gate, up = (model.get_submodule(_join(unit.parent, c)) for c in (unit.gate, unit.up))
    return gate.weight.shape == up.weight.shape


def _unit_layers(units: list[fusion.GatedFusion]) -> set[str]:
    """The qualified names of the gates and ups of `units`."""
    return {_join(g.parent, c) for g in units for c in (g.gate, g.up)}


class _Packer:
    """The layers quantize makes: packed from the float layers' weights."""

    def __init__(self, packing: dict) -> None:
        self.packing = packing  # rotate, block, seed

    def linear(self, module: nn.Linear, activation: Optional[str]) -> Linear:
        return Linear.from_float(module, activation=activation, **self.packing)

    def gated(self, gate: nn.Linear, up: nn.Linear, glu: str) -> GatedLinear:
        return GatedLinear.from_float(gate, up, glu=glu, **self.packing)


class _Skeleton(_Packer):
    """The same layers on 'meta', of the float layers' shapes, packed as `packing` and
    `encoding` say: a skeleton for a saved int8 checkpoint to fill."""

    def __init__(self, packing: dict, encoding: str) -> None:
        super().__init__({**packing, "encoding": encoding, "device": "meta"})

    def linear(self, module: nn.Linear, activation: Optional[str]) -> Linear:
        return Linear(module.in_features, module.out_features, module.bias is not None,
                      activation=activation, **self.packing)

    def gated(self, gate: nn.Linear, up: nn.Linear, glu: str) -> GatedLinear:
        return GatedLinear(gate.in_features, gate.out_features, gate.bias is not None,
                           glu=glu, **self.packing)


def _apply(model: nn.Module, plan: _Plan, packer: _Packer) -> nn.Module:
    """`model` with the planned layers replaced by `packer`'s, and pyw8a8's attention; a
    new object where `model` itself is replaced.  Layers sharing one input share a product
    from their packed weights: not a skeleton's (:func:`share_products` once loaded)."""
    report = plan.report
    # A gated unit's gate and up are packed in its GatedLinear, its activation with them.
    units = {g: packer.gated(
        *(model.get_submodule(_join(g.parent, c)) for c in (g.gate, g.up)),
        glu=g.activation) for g in plan.units}
    in_units = _unit_layers(plan.units)
    activations = {_join(f.parent, f.linear): f.activation for f in report.fused}
    layers: dict[int, Linear] = {}
    for name, module in plan.layers:
        if name in in_units:
            continue
        if id(module) not in layers:
            layers[id(module)] = packer.linear(module, activations.get(name or "(root)"))
        model = _replace(model, name, layers[id(module)])
    if not isinstance(packer, _Skeleton):
        share_products(model, report)
    for f in report.fused:
        model.get_submodule(f.parent).register_module(f.activation_module, nn.Identity())
    for g, gated in units.items():
        model = _replace(model, g.parent,
                         fusion.fused_parent(model.get_submodule(g.parent), g, gated))
    model = _tie_embeddings(model, plan, layers)
    _enable_attention(model, report)
    return model


def _tie_embeddings(model: nn.Module, plan: _Plan, layers: dict) -> nn.Module:
    """`model` with each embedding that shares a replaced layer's weight (a tied LM head's)
    reading that layer's int8 weight instead, noted in the report."""
    heads = {id(module.weight): (name, layers[id(module)]) for name, module in plan.layers
             if id(module) in layers}
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Embedding) and id(module.weight) in heads:
            head_name, head = heads[id(module.weight)]
            model = _replace(model, name, Int8Embedding(head, module))
            plan.report.tied.append((name, head_name))
    return model


def _replace(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """`model` with its submodule `name` replaced by `module` ('': `module` itself)."""
    if not name:
        return module
    parent, _, child = name.rpartition(".")
    model.get_submodule(parent).register_module(child, module)
    return model


def share_products(model: nn.Module, report: QuantizeReport) -> None:
    """The layers of each of `report`'s shared inputs run as one product where they can;
    the report keeps those that do."""
    report.shared = [s for s in report.shared if _share_product(model, s)]


def _share_product(model: nn.Module, shared: fusion.SharedInput) -> bool:
    """Whether the layers of `shared` now run as one product (they do where they can)."""
    members = [model.get_submodule(_join(shared.parent, m)) for m in shared.members]
    if all(type(m) is Linear for m in members) and can_share(members) is None:
        SharedProduct(members)
        return True
    return False


def _enable_attention(model: nn.Module, report: QuantizeReport) -> None:
    """pyw8a8's attention for the transformers models in `model`, noted in `report`."""
    for inner in _transformers_models(model):
        before = inner.config._attn_implementation
        if before in ATTENTION_NAMES:
            enable_int8_attention(inner)
            report.attention = report.attention or (before, inner.config._attn_implementation)


def _transformers_models(model: nn.Module) -> list[nn.Module]:
    """The transformers models in `model`: itself if it is one, else the outermost ones it
    holds (a SentenceTransformer's); each sets its submodels' attention itself."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return []
    found, stack = [], [model]
    while stack:
        module = stack.pop()
        if isinstance(module, transformers.PreTrainedModel):
            found.append(module)
        else:
            stack.extend(reversed(list(module.children())))
    return found


@renamed_keyword("min_features", "min_in_features")
def quantize(model: nn.Module, *, include: Optional[Sequence[str]] = None,
             exclude: Optional[Sequence[str]] = None, min_in_features: int = 0,
             inplace: bool = False, rotate: bool = True, block: int | str = "auto",
             seed: int = 0, fuse: bool = True, verbose: bool = False) -> nn.Module:
    """Replace a model's ``nn.Linear`` layers with :class:`pyw8a8.torch.Linear`.

    Parameters
    ----------
    model : torch.nn.Module
        A CPU model (or one ``nn.Linear``).
    include, exclude : glob pattern or list of them, optional
        Only the layers whose qualified name (``model.named_modules()``) matches one of
        `include`, when it is given, and none of `exclude` (``["lm_head"]``) go W8A8.
    min_in_features : int
        Layers with fewer input features stay float (the Router's setting of the same
        name); ``min_features``, its former name, works with a DeprecationWarning.
    inplace : bool
        Change `model` itself (the float tensors it keeps are then copied into memory of
        their own, out of the file ``from_pretrained`` mapped); by default a deep copy is
        changed and returned.
    rotate, block, seed
        As :func:`pyw8a8.pack_weight`.
    fuse : bool
        Fuse activations, gated units and layers called in turn on one input (Notes).
    verbose : bool
        Log every decision to the ``"pyw8a8.torch"`` logger at INFO (always at DEBUG).

    Returns
    -------
    torch.nn.Module
        The model with its layers replaced; ``pyw8a8_report``, a :class:`QuantizeReport`,
        says what was replaced, what was kept in float and why.

    Notes
    -----
    Subclasses of ``nn.Linear`` and layers off the CPU or of a non-float weight stay float.
    `fuse` (:mod:`pyw8a8.torch.fusion`) puts an activation into the layer before it, a
    module's whole gated unit into one :class:`GatedLinear`, an attention's q, k and v into
    one product. Transformers models get :func:`enable_int8_attention`.

    Examples
    --------
    >>> import torch, pyw8a8.torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
    ...                             torch.nn.Linear(256, 8))
    >>> q = pyw8a8.torch.quantize(model, exclude=["2"])
    >>> print(q.pyw8a8_report)
    pyw8a8.torch.quantize: 1 layers in W8A8, 1 kept in float
      w8a8  0 (Linear 64 -> 256): w8a8
      float 2 (Linear 256 -> 8): excluded
      fused 0 with the gelu after it (1 is now nn.Identity)
    >>> type(q[0]).__module__, type(model[0]).__module__  # the model itself is unchanged
    ('pyw8a8.torch.modules', 'torch.nn.modules.linear')
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    selection = _selection(include, exclude, min_in_features)
    model = model if inplace else copy.deepcopy(model)
    plan = _plan(model, selection, fuse, logging.INFO if verbose else logging.DEBUG)
    model = _apply(model, plan, _Packer({"rotate": rotate, "block": block, "seed": seed}))
    if inplace:  # a copy's tensors are its own already
        own_float_memory(model)
    model.pyw8a8_report = plan.report
    return model


def own_float_memory(model: nn.Module) -> None:
    """The float tensors quantize left (norms, biases, layers kept float) copied into memory
    of their own: loaded by from_pretrained, they are views of the checkpoint's mapped
    file, and while one of them lives the whole mapping does, with every page quantizing
    read (Gemma 3 270M held 1.4 GB resident where its tensors are 270 MB)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, _PackedModule):  # packed from numpy, its own memory
                continue
            for tensor in (*module._parameters.values(), *module._buffers.values()):
                if tensor is not None and tensor.is_floating_point():
                    tensor.data = tensor.data.clone()


def skeleton(model: nn.Module, *, encoding: str, include: Optional[Sequence[str]] = None,
             exclude: Optional[Sequence[str]] = None, min_in_features: int = 0,
             rotate: bool = True, block: int | str = "auto", seed: int = 0,
             fuse: bool = True) -> nn.Module:
    """`model` (a skeleton on 'meta', as transformers builds one to load a checkpoint
    into) changed in place into the skeleton of ``quantize(model, ...)``: the same
    layers, fusions, tied vocabulary and attention, their buffers on 'meta' but for the
    headers, packed with `encoding`, for the tensors of a saved quantized model to fill.
    Once they have, :func:`share_products` with its report finishes it."""
    selection = _selection(include, exclude, min_in_features)
    plan = _plan(model, selection, fuse, logging.DEBUG, devices=("cpu", "meta"))
    packing = {"rotate": rotate, "block": block, "seed": seed}
    model = _apply(model, plan, _Skeleton(packing, encoding))
    model.pyw8a8_report = plan.report
    return model
