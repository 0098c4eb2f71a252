"""``nn.Module`` layers on pyw8a8's products: `Linear` and the gated `GatedLinear`.

The packed weight lives in the module's buffers (panels, sums, scales and an int64 header
of its settings), so ``state_dict``, ``torch.save`` / ``torch.load``, ``copy.deepcopy`` and
pickling carry it as it is, and ``load_state_dict`` checks what it loads.  The layers are
for inference: their buffers never require gradients, and a forward that would need one
raises.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import fx, nn

from .._validation import bias_vector
from ..packing import PackedWeight, pack_weight
from . import _native, _ops

__all__ = ["GatedLinear", "Linear"]

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
PARTS = ("panels", "psum", "scales", "header")


def _records_ops() -> bool:
    """Whether this forward is being captured as a graph of torch operators (by
    ``torch.compile``, ``torch.export`` or ``torch.jit.trace``), which records the
    ``torch.ops.pyw8a8`` call; ``torch.fx``'s proxies the forward recognizes itself."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _activation(value: Optional[str], name: str) -> Optional[str]:
    if value not in ACTIVATIONS:
        raise ValueError(f"{name} must be one of {ACTIVATIONS}, got {value!r}")
    return value


def _glu(value: Optional[str]) -> str:
    if value is None:
        raise ValueError("glu must be one of 'relu', 'gelu', 'gelu_tanh', 'silu'")
    return _activation(value, "glu")


def _float_weight(linear: Any, name: str) -> tuple[np.ndarray, Optional[torch.Tensor]]:
    """An nn.Linear's weight as float32 numpy (N, K), and its bias tensor."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{name} must be a torch.nn.Linear, got {type(linear).__name__}")
    w = linear.weight
    if w.device.type != "cpu":
        raise ValueError(f"{name}.weight is on {w.device}; pack from a CPU module")
    if not w.is_floating_point():
        raise TypeError(f"{name}.weight must be floating point, got {w.dtype}")
    return w.detach().float().numpy(), linear.bias


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


class Linear(_PackedModule):
    """A W8A8 ``nn.Linear``: ``activation(x @ w.T + bias)`` on pyw8a8's int8 kernels.

    The weight is packed once (int8, one scale per output channel, rotated by default);
    each call quantizes the input per row (token).  Build it with :meth:`from_float` from
    an ``nn.Linear``, or :meth:`from_packed`; ``Linear(in_features, out_features)`` is a
    zero layer of that shape, to load a ``state_dict`` into.

    Parameters
    ----------
    in_features, out_features : int
        K and N.
    bias : bool
        Whether the layer has a bias (float32, shape (N,)).
    activation : {None, 'relu', 'gelu', 'gelu_tanh', 'silu'}
        Applied in the kernel's epilogue, after the bias.
    rotate, block, seed, encoding
        As :func:`pyw8a8.pack_weight`.
    device : {None, 'cpu', 'meta'}
        'meta' builds the layer's skeleton: its buffers' shapes and settings, nothing
        allocated, for a checkpoint to fill (``from_pretrained`` of a saved model).

    Notes
    -----
    ``forward(x)`` takes a CPU tensor of shape (..., K), float32 or bfloat16, any strides
    (channels-last included): float32 crosses to numpy without a copy, bfloat16 is widened
    to float32 (exactly) and the result rounded back to bfloat16; the output has x's
    dtype and shape (..., N).  It is the same computation, bit for bit, as
    :func:`pyw8a8.matmul` on the same packed weight, eager, under ``torch.compile``, from
    ``torch.export`` and in TorchScript (``torch.ops.pyw8a8.linear``).

    Examples
    --------
    >>> import torch, pyw8a8.torch
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> dense = torch.nn.Linear(256, 64)
    >>> layer = pyw8a8.torch.Linear.from_float(dense)
    >>> x = torch.randn(3, 5, 256)
    >>> with torch.inference_mode():
    ...     y, ref = layer(x), dense(x)
    >>> y.shape, y.dtype
    (torch.Size([3, 5, 64]), torch.float32)
    >>> bool((y - ref).abs().max() < 0.05 * ref.pow(2).mean().sqrt())
    True
    """

    _weights = ("weight",)
    _biases = ("bias",)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 activation: Optional[str] = None, rotate: bool = True,
                 block: int | str = "auto", seed: int = 0, encoding: str = "auto",
                 device: Any = None) -> None:
        super().__init__()
        if _skeleton(device):
            self._set_skeleton((out_features, in_features), bias,
                               (rotate, block, seed, encoding))
            self.activation = _activation(activation, "activation")
            return
        zeros = np.zeros((out_features, in_features), np.float32)
        self._init(_pack(zeros, rotate, block, seed, encoding),
                   np.zeros(out_features, np.float32) if bias else None, activation, True)

    def _init(self, packed: PackedWeight, bias: Any, activation: Optional[str],
              adopt: bool = False) -> None:
        self.out_features, self.in_features = packed.shape
        self.activation = _activation(activation, "activation")
        self._set_weight("weight", packed, adopt)
        self._set_bias("bias", bias, self.out_features)

    @classmethod
    def from_packed(cls, packed: PackedWeight, bias: Any = None, *,
                    activation: Optional[str] = None) -> Linear:
        """A layer on an existing :class:`pyw8a8.PackedWeight` (its memory is shared).

        Parameters
        ----------
        packed : PackedWeight, shape (N, K)
        bias : tensor or array of shape (N,), optional
        activation : {None, 'relu', 'gelu', 'gelu_tanh', 'silu'}
        """
        if not isinstance(packed, PackedWeight):
            raise TypeError(f"packed must be a pyw8a8.PackedWeight, got "
                            f"{type(packed).__name__}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._init(packed, bias, activation)
        return layer

    @classmethod
    def from_float(cls, linear: nn.Linear, *, rotate: bool = True, block: int | str = "auto",
                   seed: int = 0, activation: Optional[str] = None,
                   encoding: str = "auto") -> Linear:
        """Quantize and pack an ``nn.Linear`` (its weight is read, not kept).

        Parameters
        ----------
        linear : torch.nn.Linear
            A CPU module, weight (N, K) of any float dtype.
        rotate, block, seed, encoding
            As :func:`pyw8a8.pack_weight` (block 'auto': 128, smaller for K < 128), the last
            block zero-padded where it does not divide K.
        activation : {None, 'relu', 'gelu', 'gelu_tanh', 'silu'}
            Fused after the bias: the module computes ``activation(linear(x))``.

        Raises
        ------
        TypeError
            `linear` is not an ``nn.Linear``, or its weight is not floating point.
        ValueError
            The weight is not on the CPU or holds NaN/Inf; a setting is out of range.
        """
        w, bias = _float_weight(linear, "linear")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._init(_pack(w, rotate, block, seed, encoding), bias, activation, adopt=True)
        return layer

    def _eager(self, x: torch.Tensor) -> torch.Tensor:
        # The operator entered from C++ (_native.eager_linear), the buffers read from the
        # dict: nn.Module's attribute lookup costs about a microsecond each, a fifth of a
        # one-token product.
        b = self._buffers
        return _native.eager_linear(x, b["weight_panels"], b["weight_psum"],
                                    b["weight_scales"], b["weight_header"], b["bias"],
                                    self.activation or "")

    def _operator(self, x: torch.Tensor) -> torch.Tensor:
        """The product as the call a graph records, ``torch.ops.pyw8a8.linear``."""
        activation = self.activation
        return torch.ops.pyw8a8.linear(x, self.weight_panels, self.weight_psum,
                                       self.weight_scales, self.weight_header, self.bias,
                                       "" if activation is None else activation)

    def extra_repr(self) -> str:
        settings = self.settings("weight")
        rotation = f"block={settings['block']}" if settings["rotate"] else "rotate=False"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation}, {rotation}")


class GatedLinear(_PackedModule):
    """The gated unit of a transformer's FFN in one W8A8 call:
    ``glu(gate(x)) * up(x)``, x quantized once, both products finished tile by tile
    (:func:`pyw8a8.matmul_pair` with `glu`).

    Build it with :meth:`from_float` from the gate and up ``nn.Linear`` layers (one shape,
    (N, K)).  ``forward(x)`` takes what :class:`Linear` takes and returns (..., N).

    Parameters
    ----------
    glu : {'relu', 'gelu', 'gelu_tanh', 'silu'}
        Llama, Mistral, Qwen: 'silu'; Gemma: 'gelu_tanh'.
    in_features, out_features, bias, rotate, block, seed, encoding, device
        As :class:`Linear`'s: ``GatedLinear(K, N)`` is a zero unit, ``device='meta'`` a
        skeleton.

    Examples
    --------
    >>> import torch, pyw8a8, pyw8a8.torch
    >>> gate, up = torch.nn.Linear(128, 96, bias=False), torch.nn.Linear(128, 96, bias=False)
    >>> unit = pyw8a8.torch.GatedLinear.from_float(gate, up, glu="silu")
    >>> x = torch.randn(4, 128)
    >>> with torch.no_grad():
    ...     y = unit(x)
    >>> y.shape
    torch.Size([4, 96])
    >>> same = pyw8a8.matmul_pair(x.numpy(), unit.packed("gate"), unit.packed("up"), glu="silu")
    >>> bool((y.numpy() == same).all())
    True
    """

    _weights = ("gate", "up")
    _biases = ("gate_bias", "up_bias")

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 glu: str = "silu", rotate: bool = True, block: int | str = "auto",
                 seed: int = 0, encoding: str = "auto", device: Any = None) -> None:
        super().__init__()
        if _skeleton(device):
            self._set_skeleton((out_features, in_features), bias,
                               (rotate, block, seed, encoding))
            self.glu = _glu(glu)
            return
        zeros = np.zeros((out_features, in_features), np.float32)
        packed = [_pack(zeros, rotate, block, seed, encoding) for _ in range(2)]
        biases = [np.zeros(out_features, np.float32) if bias else None] * 2
        self._init(packed, biases, glu, adopt=True)

    def _init(self, packed: list[PackedWeight], biases: list[Any], glu: str,
              adopt: bool = False) -> None:
        gate, up = packed
        if gate.shape != up.shape:
            raise ValueError(f"gate and up must have one shape, got {gate.shape} and "
                             f"{up.shape}")
        if (gate.rotate, gate.block, gate.seed) != (up.rotate, up.block, up.seed):
            raise ValueError("gate and up must be packed with the same rotation settings")
        self.glu = _glu(glu)
        self.out_features, self.in_features = gate.shape
        for name, weight, bias in zip(self._weights, packed, biases):
            self._set_weight(name, weight, adopt)
            self._set_bias(f"{name}_bias", bias, self.out_features)

    @classmethod
    def from_float(cls, gate: nn.Linear, up: nn.Linear, *, glu: str = "silu",
                   rotate: bool = True, block: int | str = "auto", seed: int = 0,
                   encoding: str = "auto") -> GatedLinear:
        """Quantize and pack the gate and up projections of a gated FFN.

        Raises
        ------
        TypeError, ValueError
            As :meth:`Linear.from_float`; ValueError also if the two differ in shape.
        """
        weights = [_float_weight(linear, name) for linear, name in ((gate, "gate"), (up, "up"))]
        packed = [_pack(w, rotate, block, seed, encoding) for w, _ in weights]
        unit = cls.__new__(cls)
        nn.Module.__init__(unit)
        unit._init(packed, [bias for _, bias in weights], glu, adopt=True)
        return unit

    def _eager(self, x: torch.Tensor) -> torch.Tensor:
        b = self._buffers  # as Linear._eager
        return _native.eager_gated_linear(x, b["gate_panels"], b["gate_psum"],
                                          b["gate_scales"], b["gate_header"], b["up_panels"],
                                          b["up_psum"], b["up_scales"], b["up_header"],
                                          b["gate_bias"], b["up_bias"], self.glu)

    def _operator(self, x: torch.Tensor) -> torch.Tensor:
        """The unit as the call a graph records, ``torch.ops.pyw8a8.gated_linear``."""
        return torch.ops.pyw8a8.gated_linear(
            x, self.gate_panels, self.gate_psum, self.gate_scales, self.gate_header,
            self.up_panels, self.up_psum, self.up_scales, self.up_header, self.gate_bias,
            self.up_bias, self.glu)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"glu={self.glu!r}, bias={self.gate_bias is not None}")
