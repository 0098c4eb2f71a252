"""One product for the linear layers a module calls one after another on one input.

An attention block's query, key and value projections read the same hidden states
(:func:`pyw8a8.torch.fusion.shared_inputs` finds them in the block's forward).
:func:`pyw8a8.torch.quantize` packs their weights one after another into one weight, held
by the first layer in non-persistent buffers (``shared_*``), and each layer's own buffers
become views of it: the ``state_dict`` keys, each layer alone and its bits stay as they
were.  The first layer's call runs the one product (x quantized and rotated once, one
call; at M = 1 on Zen 5, with the weights read from memory, Gemma 3 270M's 1024 + 256 +
256 channels took 47 us as one product against 61 us as three, module calls included) and
keeps it; the next layers, called in turn on the same tensor, return their columns of it,
the last one dropping it.  Any other call (another tensor, one written since, another
order) runs the layer's own product.

The layers' views must be the shared weight's memory.  A load, an unpickled or
deep-copied model, a buffer replaced or moved breaks that: the layers then pack the shared
weight again (:meth:`SharedProduct.fuse`: at once where a layer's buffers change, else on
the next eager call), and until then each runs its own product.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from .._layout import W8_NR
from ..packing import PackedWeight
from . import _native, _ops

#: The first layer's buffers that hold the shared weight (not in the state_dict).
SHARED = ("shared_panels", "shared_psum", "shared_scales", "shared_header", "shared_bias")
#: A layer's buffers that view the shared weight (psum: where the encoding has sums).
VIEWED = ("weight_panels", "weight_psum", "weight_scales", "bias")


def _version(x: torch.Tensor) -> Optional[int]:
    # An inference tensor keeps no version counter: asking raises, and a torch error
    # costs tens of microseconds (its backtrace), more than the products it saves.
    return None if x.is_inference() else x._version


def can_share(layers: list[Any]) -> Optional[str]:
    """Why `layers` (pyw8a8 Linear layers, unfused) cannot run as one product, or None."""
    return _why_apart(layers, [layer.packed("weight") for layer in layers])


def _why_apart(layers: list[Any], packed: list[PackedWeight]) -> Optional[str]:
    """:func:`can_share` on the layers' weights already at hand."""
    settings = {(p.shape[1], p.kp, p.encoding, p.rotate, p.block, p.seed) for p in packed}
    if len(settings) > 1:
        return "their weights differ in K or in how they were packed"
    if any(p.shape[0] % W8_NR for p in packed[:-1]):
        return f"an output size that is not a multiple of {W8_NR} (a panel) but for the last"
    if len({layer.bias is None for layer in layers}) > 1:
        return "some have a bias and some not"
    if any(layer.activation is not None for layer in layers):
        return "an activation is fused into one of them"
    return None


class SharedProduct:
    """The linear layers `layers` (pyw8a8 Linear, in call order) as one product.

    Built by :func:`pyw8a8.torch.quantize`, after :func:`can_share` accepted them; it
    packs the shared weight at once (:meth:`fuse`).  Each layer keeps it as ``_shared``
    and its place in the order as ``_shared_slot``.
    """

    def __init__(self, layers: list[Any]) -> None:
        self.layers = list(layers)
        self.sizes = tuple(layer.out_features for layer in self.layers)
        self.memo: Optional[tuple] = None
        self.ready = False  # the layers' buffers are the views fuse made
        self.pending = False  # unpickled: fuse on the next eager call
        self.views: tuple = ()  # the shared buffers, then each layer's views (fuse)
        for slot, layer in enumerate(self.layers):
            layer._shared, layer._shared_slot = self, slot
        if not self.fuse():
            raise ValueError(f"these layers cannot run as one product: "
                             f"{can_share(self.layers)}")

    def __getstate__(self) -> dict:
        # Pickle gives each tensor memory of its own, so the views are not kept: the
        # weight is packed again on the first eager call after loading.  A product in
        # flight is not kept either.
        return {"layers": self.layers, "sizes": self.sizes, "memo": None, "ready": False,
                "pending": True, "views": ()}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @torch.inference_mode(False)
    def fuse(self) -> bool:
        """Pack the layers' weights (and biases) into the first layer's shared buffers and
        make each layer's own buffers views of them; False, each layer then running
        alone, where they can no longer share one (a load gave them other layouts)."""
        self.memo, self.pending, self.ready = None, False, False
        packed = [layer.packed("weight") for layer in self.layers]
        if _why_apart(self.layers, packed) is not None:
            return False
        first = packed[0]
        whole = PackedWeight((sum(self.sizes), first.shape[1]), first.encoding,
                             np.concatenate([p.panels for p in packed]),
                             np.concatenate([p.psum for p in packed]),
                             np.concatenate([p.scales for p in packed]),
                             first.rotate, first.block, first.seed)
        shared = list(_ops.tensors_of(whole, adopt=True))
        biases = [layer.bias for layer in self.layers]
        shared.append(None if biases[0] is None else torch.cat([b.float() for b in biases]))
        leader = self.layers[0]
        for name, tensor in zip(SHARED, shared):
            # Not register_buffer: a pyw8a8 layer's checks the views it would replace.
            leader._buffers[name] = tensor
            leader._non_persistent_buffers_set.add(name)
        panels, psum, scales, _, bias = shared
        views, start = [tuple(shared)], 0
        for layer, p, size in zip(self.layers, packed, self.sizes):
            stop = start + size
            own = (panels[start // W8_NR:-(-stop // W8_NR)],
                   psum[start:stop] if psum.shape[0] else layer._buffers["weight_psum"],
                   scales[start:stop], None if bias is None else bias[start:stop])
            for name, view in zip(VIEWED, own):
                layer._buffers[name] = view
            _ops.keep_weight(*own[:3], layer._buffers["weight_header"], p)
            views.append(own)
            start = stop
        self.views, self.ready = tuple(views), True
        return True

    def intact(self) -> bool:
        """Whether the shared buffers and every layer's views are still those :meth:`fuse`
        made (a replaced buffer is another tensor; one written in place is the same
        memory, so the shared weight sees the write)."""
        if not self.ready:
            return False
        shared, *own = self.views
        buffers = self.layers[0]._buffers
        if any(buffers[name] is not t for name, t in zip(SHARED, shared)):
            return False
        return all(layer._buffers[name] is t for layer, views in zip(self.layers, own)
                   for name, t in zip(VIEWED, views))

    def take(self, layer: Any, x: Any) -> Optional[torch.Tensor]:
        """A later layer's columns of the product the first one kept, where `layer` is
        the next in the order and `x` that product's input, unwritten since; else None."""
        memo = self.memo
        if memo is None or memo[0] is not x or memo[2] != layer._shared_slot or \
                (memo[1] is not None and memo[1] != x._version):
            return None
        slot = memo[2]
        self.memo = None if slot == len(self.sizes) - 1 else (x, memo[1], slot + 1, memo[3])
        return memo[3][slot]

    def lead(self, layer: Any, x: torch.Tensor, graph: bool) -> torch.Tensor:
        """`layer`'s output for `x` where :meth:`take` had none: the first layer's runs
        the shared product and keeps it for the others; a later layer's is its own
        product.  `graph`: the call a graph records (torch.compile, torch.export,
        torch.jit.trace)."""
        if self.pending and not graph:
            self.fuse()
        if layer._shared_slot or not self.ready:
            return layer._operator(x) if graph else layer._eager(x)
        op = torch.ops.pyw8a8.linear if graph else _native.eager_linear
        y = op(x, layer.shared_panels, layer.shared_psum, layer.shared_scales,
               layer.shared_header, layer.shared_bias, "")
        parts = y.split_with_sizes(self.sizes, -1)
        self.memo = (x, None if graph else _version(x), 1, parts)
        return parts[0]
