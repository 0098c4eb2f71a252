"""`quantize`: a model's ``nn.Linear`` layers replaced by pyw8a8 layers, with the reasons.

It mirrors ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)``
(a copy unless ``inplace=True``; layers replaced by type, exactly ``nn.Linear``), with the
selection rules of pyw8a8's numpy :class:`~pyw8a8.router.Router` under the same names:
`include` and `exclude` glob patterns on the qualified module names, and `min_in_features`
(layers with fewer input features stay float).
"""
from __future__ import annotations

import copy
import dataclasses
import fnmatch
import logging
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

from torch import nn

from .._validation import renamed_keyword
from . import fusion
from ._shared_product import SharedProduct, can_share
from .attention import ATTENTION_NAMES, enable_int8_attention
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
    gated: list[fusion.GatedUnit] = field(default_factory=list)
    #: Layers run as one product on their one input (an attention block's q, k and v).
    shared: list[fusion.SharedInput] = field(default_factory=list)
    #: A transformers model's attention implementation before and after, where quantize
    #: set pyw8a8's (:func:`~pyw8a8.torch.enable_int8_attention`): ("sdpa", "pyw8a8");
    #: the first one's where `model` holds several.
    attention: Optional[tuple[str, str]] = None

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
        if self.attention:
            lines.append(f"  attention: {self.attention[1]} (int8 with a "
                         f"pyw8a8.torch.Int8Cache, else {self.attention[0]} as before)")
        return "\n".join(lines)


def _join(parent: str, child: str) -> str:
    return ".".join(p for p in (parent, child) if p) or "(root)"


def _patterns(value: Optional[Sequence[str]], name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    patterns = list(value)
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{name} must be a glob pattern or a list of them")
    return patterns


def _reason(name: str, module: nn.Linear, include: list[str], exclude: list[str],
            min_in_features: int) -> Optional[str]:
    """Why this linear layer stays float, or None when it goes W8A8."""
    if type(module) is not nn.Linear:
        if isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear):
            return ("its parent reads its weight directly (nn.MultiheadAttention's out_proj; "
                    "quantize_dynamic keeps it too)")
        return f"a subclass of nn.Linear ({type(module).__name__}), whose forward may differ"
    if include and not any(fnmatch.fnmatchcase(name, p) for p in include):
        return "not included"
    if any(fnmatch.fnmatchcase(name, p) for p in exclude):
        return "excluded"
    if module.in_features < min_in_features:
        return f"in_features={module.in_features} < min_in_features={min_in_features}"
    weight = module.weight
    if weight.device.type != "cpu":
        return f"its weight is on {weight.device}"
    if not weight.is_floating_point():
        return f"its weight is {weight.dtype}"
    return None


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
    include : glob pattern or list of them, optional
        When given, only layers whose qualified name (``model.named_modules()``) matches
        one go W8A8.
    exclude : glob pattern or list of them, optional
        Layers that stay float (applied after `include`), e.g. ``["lm_head"]``.
    min_in_features : int
        Layers with fewer input features stay float (the Router's setting of the same
        name).  ``min_features``, its former name, still works, with a
        DeprecationWarning.
    inplace : bool
        Change `model` itself; by default a deep copy is changed and returned.
    rotate, block, seed
        As :func:`pyw8a8.pack_weight`.
    fuse : bool
        Fuse an activation that follows a replaced layer into its kernel where the module
        holding both passes the layer's output to it alone (:mod:`pyw8a8.torch.fusion`;
        BERT's ``intermediate``, for one): the activation's module becomes
        ``nn.Identity()``, the code and the ``state_dict`` keys stay.  Fuse a gated
        unit that is its module's whole forward, and run the layers a module calls one
        after another on one input as one product (see Notes).
    verbose : bool
        Log every decision to the ``"pyw8a8.torch"`` logger at INFO (always at DEBUG).

    Returns
    -------
    torch.nn.Module
        The model with its layers replaced; its attribute ``pyw8a8_report`` is a
        :class:`QuantizeReport` (what was replaced, what was kept in float and why).

    Notes
    -----
    Kept in float: subclasses of ``nn.Linear`` (their forward may differ), among them
    ``nn.MultiheadAttention``'s ``out_proj``, which that module reads directly; layers off
    the CPU or with a non-float weight; those the patterns and `min_in_features` leave out.
    The gated unit, ``act(gate(x)) * up(x)``, where it is a module's whole forward (with
    at most a down projection after it: the FFN of Llama, Gemma and Qwen) becomes one
    :class:`pyw8a8.torch.GatedLinear` in the gate's place, and that module the
    ``torch.fx.GraphModule`` of its own graph with the unit as one call (`fuse`;
    :mod:`pyw8a8.torch.fusion`).  Elsewhere its activation is fused into the gate and the
    report names the unit.

    Layers that a module's forward calls in consecutive statements on one tensor, each
    only reshaping the output (``q = self.q_proj(h).view(...)``, then k and v: the
    attention of Llama, Gemma, Qwen and BERT), run as one product, h quantized once; each
    returns its columns of it, and their ``state_dict`` keys stay (`fuse`;
    :mod:`pyw8a8.torch.fusion`).

    A transformers model with "sdpa" or "eager" attention, or one inside `model` (a
    SentenceTransformer's), gets pyw8a8's attention implementation over it
    (:func:`~pyw8a8.torch.enable_int8_attention`): int8 attention where it is given an
    :class:`~pyw8a8.torch.Int8Cache`, pyw8a8's float attention in its bidirectional
    (encoder) layers over "sdpa", which skips the keys a padding mask hides, and the
    model's own attention elsewhere.

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
    include_p, exclude_p = _patterns(include, "include"), _patterns(exclude, "exclude")
    if (isinstance(min_in_features, bool) or not isinstance(min_in_features, int)
            or min_in_features < 0):
        raise ValueError(f"min_in_features must be a non-negative int, got "
                         f"{min_in_features!r}")
    if not inplace:
        model = copy.deepcopy(model)
    report = QuantizeReport()
    replacements = []
    # Every name of a layer shared by several parents (tied weights) gets the one new layer.
    for name, module in model.named_modules(remove_duplicate=False):
        if not isinstance(module, nn.Linear):
            continue
        reason = _reason(name, module, include_p, exclude_p, min_in_features)
        report.decisions.append(Decision(name, type(module).__name__, module.in_features,
                                         module.out_features, "float" if reason else "w8a8",
                                         reason or "w8a8"))
        if reason is None:
            replacements.append((name, module))
    names: dict[int, list[str]] = {}
    for name, module in replacements:
        names.setdefault(id(module), []).append(name)
    if fuse:  # a layer of several names (tied) is called in several places: never fused
        single = {i for i, n in names.items() if len(n) == 1}
        report.fused, report.gated = fusion.find(model, single)
        report.shared = fusion.shared_inputs(model, single)
    # A gated unit that is its parent's whole forward becomes one GatedLinear (fusion.py);
    # its gate and up are packed there, its activation with them.
    units = {}
    for g in report.gated:
        gate, up = (model.get_submodule(_join(g.parent, c)) for c in (g.gate, g.up))
        if g.down is not None and gate.weight.shape == up.weight.shape:
            units[g] = GatedLinear.from_float(gate, up, glu=g.activation, rotate=rotate,
                                              block=block, seed=seed)
    report.gated = [g if g in units else dataclasses.replace(g, down=None)
                    for g in report.gated]
    in_units = {_join(g.parent, c) for g in units for c in (g.gate, g.up)}
    report.fused = [f for f in report.fused if _join(f.parent, f.linear) not in in_units]
    activations = {_join(f.parent, f.linear): f for f in report.fused}
    layers: dict[int, Linear] = {}
    for name, module in replacements:
        if name in in_units:
            continue
        layer = layers.get(id(module))
        if layer is None:
            fused = activations.get(name or "(root)")
            layer = layers[id(module)] = Linear.from_float(
                module, rotate=rotate, block=block, seed=seed,
                activation=fused.activation if fused else None)
        if not name:
            model = layer
            break
        parent_name, _, child = name.rpartition(".")
        model.get_submodule(parent_name).register_module(child, layer)
    shared = []
    for s in report.shared:
        members = [model.get_submodule(_join(s.parent, m)) for m in s.members]
        if all(type(m) is Linear for m in members) and can_share(members) is None:
            SharedProduct(members)
            shared.append(s)
    report.shared = shared
    for f in report.fused:
        model.get_submodule(f.parent).register_module(f.activation_module, nn.Identity())
    for g, gated in units.items():
        parent = fusion.fused_parent(model.get_submodule(g.parent), g, gated)
        if not g.parent:
            model = parent
            continue
        grandparent, _, child = g.parent.rpartition(".")
        model.get_submodule(grandparent).register_module(child, parent)
    for d in report.decisions:
        logger.log(logging.INFO if verbose else logging.DEBUG, "%s %s (%s %d -> %d): %s",
                   d.action, d.name or "(root)", d.kind, d.in_features, d.out_features,
                   d.reason)
    for inner in _transformers_models(model):
        before = inner.config._attn_implementation
        if before in ATTENTION_NAMES:
            enable_int8_attention(inner)
            report.attention = report.attention or (before, inner.config._attn_implementation)
    model.pyw8a8_report = report
    return model
