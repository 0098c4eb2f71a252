"""`_PackedModule`: a module whose packed weights live in its buffers, the base of
:class:`~pyw8a8.torch.Linear` and :class:`~pyw8a8.torch.GatedLinear`.

Each weight is four buffers, ``<prefix>_<part>`` for each part of PARTS (panels, sums,
scales and an int64 header of its settings), so ``state_dict``, ``torch.save`` /
``torch.load``, ``copy.deepcopy`` and pickling carry it as it is; this module holds what
every packed layer does with them: building them (packed, zero or a skeleton on 'meta'),
loading and checking them, keeping them float32 and on the CPU, and the forward that
sends a call to the eager entry or to the operator a graph records.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import fx, nn

from .._validation import bias_vector
from ..packing import PackedWeight, pack_weight
from . import _native, _ops

PARTS = ("panels", "psum", "scales", "header")


def _records_ops() -> bool:
    """Whether this forward is being captured as a graph of torch operators (by
    ``torch.compile``, ``torch.export`` or ``torch.jit.trace``), which records the
    ``torch.ops.pyw8a8`` call; ``torch.fx``'s proxies the forward recognizes itself."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _pack(w: np.ndarray, rotate: bool, block: int | str, seed: int,
          encoding: str) -> PackedWeight:
    """pack_weight for a layer, which takes any K: the last block zero-padded where `block`
    does not divide it."""
    return pack_weight(w, rotate=rotate, block=block, seed=seed, encoding=encoding, pad=True)


def _skeleton(device: Any) -> bool:
    """Whether a layer is built on the 'meta' device (a skeleton whose weights a checkpoint
    loads, the arrays uninitialized) rather than as a zero layer on the CPU."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind not in ("cpu", "meta"):
        raise ValueError(f"device must be 'cpu' or 'meta' (pyw8a8 layers run on the CPU), "
                         f"got {device!r}")
    return kind == "meta"


class _PackedModule(nn.Module):
    """The buffers of packed weights, ``<prefix>_<part>`` for each part, and their loading.

    Subclasses name their weights in ``_weights`` (buffer prefixes) and biases in
    ``_biases``, and define the product twice: ``_operator`` (a torch.ops.pyw8a8 call, what
    a graph records) and ``_eager`` (the same operator entered from C++ on the buffers, for
    a dense CPU tensor, without the lookups that cost a fifth of a one-token product).
    """

    _weights: tuple[str, ...] = ()
    _biases: tuple[str, ...] = ()
    _parts: dict[str, tuple[str, ...]] = {}  # each weight's buffer names, in PARTS order
    #: Where the layer runs as one product with others on one input (quantize sets it):
    #: the _shared_product.SharedProduct, and the layer's place in its call order.
    _shared: Any = None
    _shared_slot = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._parts = {w: tuple(f"{w}_{part}" for part in PARTS) for w in cls._weights}

    # The buffers are made outside inference mode, even when a layer is built or loaded
    # inside it: an inference tensor has no version counter, which tells packed_from that a
    # weight was written in place.
    @torch.inference_mode(False)
    def _set_weight(self, prefix: str, packed: PackedWeight, adopt: bool) -> None:
        # adopt: `packed` is this module's alone (_ops.tensors_of)
        for name, tensor in zip(self._parts[prefix], _ops.tensors_of(packed, adopt)):
            self.register_buffer(name, tensor)

    @torch.inference_mode(False)
    def _set_skeleton(self, shape: tuple[int, int], bias: bool, packing: tuple) -> None:
        """Every weight and bias of shape `shape` (N, K) on 'meta', packed as `packing`
        (rotate, block, seed, encoding) says, the headers filled: what a checkpoint's
        tensors replace, nothing allocated."""
        n, k = shape
        layout = _pack(np.zeros((0, k), np.float32), *packing)
        meta = torch.device("meta")
        for prefix in self._weights:
            for name, tensor in zip(self._parts[prefix], _ops.empty_tensors(layout, n, meta)):
                self.register_buffer(name, tensor)
        for name in self._biases:
            self.register_buffer(name, torch.empty(n, device=meta) if bias else None)
        self.out_features, self.in_features = shape

    def settings(self, prefix: str) -> dict[str, int]:
        """The settings a weight was packed with (its header's values by name), without
        reading its arrays."""
        return _ops.settings(self._buffers[self._parts[prefix][3]])

    @torch.inference_mode(False)
    def _set_bias(self, name: str, bias: Any, n: int) -> None:
        if bias is None:
            self.register_buffer(name, None)
            return
        if isinstance(bias, torch.Tensor):
            bias = bias.detach().cpu().float().numpy()
        self.register_buffer(name, torch.from_numpy(bias_vector(bias, n, name).copy()))

    def _tensors(self, prefix: str) -> tuple[torch.Tensor, ...]:
        return tuple(self._buffers[name] for name in self._parts[prefix])

    def packed(self, prefix: str) -> PackedWeight:
        """The PackedWeight held in the buffers of `prefix` (e.g. ``'weight'``)."""
        return _ops.packed_from(*self._tensors(prefix))

    def _apply(self, fn, recurse=True):
        # .to(dtype), .half(), .bfloat16() must not convert the scales or the biases: they
        # are part of the int8 format, float32 by definition.  A layer moves to no device
        # but the CPU.
        kept = {name: buf for name, buf in self._buffers.items() if buf is not None}
        result = super()._apply(fn, recurse)
        moved = [(name, self._buffers[name].device) for name, old in kept.items()
                 if self._buffers[name].device != old.device]
        for name, old in kept.items():
            if name in dict(moved) or self._buffers[name].dtype != old.dtype:
                self._buffers[name] = old
        if moved:
            raise ValueError(f"{type(self).__name__} runs on the CPU only; its buffers cannot "
                             f"move to {moved[0][1]}")
        self._repack_if_replaced()
        return result

    def _repack_if_replaced(self) -> None:
        # A buffer replaced (a load, _apply's new tensor, an assignment) is no longer the
        # view of the shared weight the product reads: pack that weight again at once.
        shared = self._shared
        if shared is not None and not shared.intact():
            shared.fuse()

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self.__dict__.get("_buffers", ()):
            self._repack_if_replaced()

    def register_buffer(self, name: str, tensor: Optional[torch.Tensor],
                        persistent: bool = True) -> None:
        super().register_buffer(name, tensor, persistent)
        self._repack_if_replaced()

    @torch.inference_mode(False)
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # Every weight is replaced whole (its layout may differ from the one this module was
        # built with, e.g. another rotation block) and checked in full before it is used.
        for weight in self._weights:
            keys = [prefix + name for name in self._parts[weight]]
            missing = [key for key in keys if key not in state_dict]
            missing_keys.extend(missing)
            if missing:
                continue
            tensors = [_ops.owned_copy(state_dict[key].cpu()) for key in keys]
            try:
                packed = _ops.packed_from(*tensors)
            except ValueError as exc:
                error_msgs.append(f"{prefix}{weight}: {exc}")
                continue
            expected = self.packed(weight).shape
            if packed.shape != expected:
                error_msgs.append(f"{prefix}{weight}: a packed weight of shape {packed.shape}, "
                                  f"this module's is {expected}")
                continue
            for name, tensor in zip(self._parts[weight], tensors):
                self._buffers[name] = tensor
        for name in self._biases:
            key = prefix + name
            mine = self._buffers.get(name)
            if key not in state_dict:
                if mine is not None:
                    missing_keys.append(key)
                continue
            if mine is None:
                unexpected_keys.append(key)
                continue
            try:
                value = bias_vector(state_dict[key].detach().cpu().float().numpy(),
                                    mine.shape[0], key)
            except ValueError as exc:
                error_msgs.append(str(exc))
                continue
            self._buffers[name] = torch.from_numpy(value.copy())
        self._repack_if_replaced()
        if strict:
            known = {name for names in self._parts.values() for name in names}
            known |= set(self._biases)
            unexpected_keys.extend(key for key in state_dict if key.startswith(prefix) and
                                   key[len(prefix):] not in known and
                                   key[len(prefix):].split(".", 1)[0] not in self._modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            # TorchScript compiles this branch alone (_forward's Python it cannot): the
            # operator, which checks its input as check_input does, but for the gradient,
            # which a call below autograd does not see.
            if x.requires_grad and torch.is_grad_enabled():
                raise RuntimeError("x " + _ops.INFERENCE_ONLY)
            return self._operator(x)
        return self._forward(x)

    @torch.jit.unused
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self._shared
        if shared is not None:  # a later layer of a shared product: its kept columns
            y = shared.take(self, x)
            if y is not None:
                return y
        if isinstance(x, fx.Proxy):  # torch.fx symbolic tracing: checked when the graph runs
            return self._operator(x)
        if (type(x) is torch.Tensor and x.is_cpu and x.layout is torch.strided
                and not x.is_nested and not (_records_ops() or _ops.under_functorch(x)
                                             or torch._C._is_torch_function_mode_enabled())):
            # A dense CPU tensor reaches the operator's CPU kernel, which checks the rest.
            # (A __torch_function__ mode sees the call only through torch.ops.)
            return self._eager(x) if shared is None else shared.lead(self, x, graph=False)
        # Here: a graph being recorded, or x not a plain dense CPU tensor (a FakeTensor
        # under torch.compile, a subclass, a sparse or meta tensor, which the dispatcher
        # would send elsewhere, or no tensor at all, which check_input refuses before
        # under_functorch could fail on it).  Under torch.compile the operator's kernel
        # checks x when the graph runs (Dynamo cannot trace the C++ check), but for the
        # gradient, which a call below autograd does not see.
        if not torch.compiler.is_compiling():
            _native.check_input(x, self.in_features)
        elif x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("x " + _ops.INFERENCE_ONLY)
        return self._operator(x) if shared is None else shared.lead(self, x, graph=True)

    def __getstate__(self):
        # The buffers pickle (and deep-copy) as fresh views: the weight kept on a panels
        # tensor is not pickled with it, and the copy checks and keeps its own.
        state = super().__getstate__()
        state["_buffers"] = {name: None if buf is None else buf.detach()
                             for name, buf in self._buffers.items()}
        return state

    def __setstate__(self, state):
        # Unpickled buffers are in torch's memory: the weights move to owned_copy's, where
        # a large one gets huge pages.
        super().__setstate__(state)
        with torch.inference_mode(False):
            for names in self._parts.values():
                panels = self._buffers.get(names[0])
                if panels is not None:
                    self._buffers[names[0]] = _ops.owned_copy(panels)
