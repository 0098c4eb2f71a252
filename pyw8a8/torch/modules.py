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
from torch import nn

from ..packing import PackedWeight
from . import _native
from ._packed_module import _pack, _PackedModule, _skeleton

__all__ = ["GatedLinear", "Linear"]

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")


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
