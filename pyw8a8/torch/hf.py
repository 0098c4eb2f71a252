"""`W8A8Config`: pyw8a8 in transformers' quantizer registry, so a model is quantized as it
loads::

    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=W8A8Config())

The quantizer lets transformers load the float checkpoint, then runs
:func:`pyw8a8.torch.quantize` on the model in place, with the config's options (one rule
for both routes: the same layers, fusions, tied vocabulary and attention).  A model so
loaded does not save as a transformers checkpoint (``save_pretrained`` says so); its
``state_dict`` saves and loads as any quantized model's.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import numpy as np
import torch
from transformers.quantizers import HfQuantizer
from transformers.quantizers.auto import register_quantization_config, register_quantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from .._layout import W8_KPAD, W8_NR
from .convert import _selection, quantize
from .modules import _pack, _PackedModule

__all__ = ["W8A8Config"]

#: The quant_method transformers knows pyw8a8 by.
QUANT_METHOD = "pyw8a8"
_LOG = logging.getLogger(__name__)


class W8A8Config(QuantizationConfigMixin):
    """pyw8a8's quantization for ``from_pretrained(..., quantization_config=...)``.

    Parameters
    ----------
    include, exclude, min_in_features, rotate, block, seed, fuse
        As :func:`pyw8a8.torch.quantize`: which ``nn.Linear`` layers go W8A8, the
        rotation of their weights, and whether activations and gated units are fused.

    Raises
    ------
    TypeError, ValueError
        For an option :func:`~pyw8a8.torch.quantize` would refuse (the message names it),
        when the config is made rather than after the checkpoint has loaded.

    Examples
    --------
    >>> import pyw8a8.torch
    >>> config = pyw8a8.torch.W8A8Config(exclude=["lm_head"], block=128)
    >>> config.quant_method, config.quantize_options()["block"]
    ('pyw8a8', 128)
    """

    def __init__(self, include: Optional[Sequence[str]] = None,
                 exclude: Optional[Sequence[str]] = None, min_in_features: int = 0,
                 rotate: bool = True, block: int | str = "auto", seed: int = 0,
                 fuse: bool = True, **kwargs: Any) -> None:
        self.quant_method = QUANT_METHOD
        self.include, self.exclude = include, exclude
        self.min_in_features, self.rotate, self.block = min_in_features, rotate, block
        self.seed, self.fuse = seed, fuse
        self.post_init()

    def post_init(self) -> None:
        """The options checked by quantize's own rules; the patterns as lists (or None)."""
        selection = _selection(self.include, self.exclude, self.min_in_features)
        self.include = selection["include"] if self.include is not None else None
        self.exclude = selection["exclude"] if self.exclude is not None else None
        for name in ("rotate", "fuse"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        # The rotation's block and seed, refused as packing a weight would refuse them.
        _pack(np.zeros((W8_NR, W8_KPAD), np.float32), self.rotate, self.block, self.seed,
              "auto")

    def quantize_options(self) -> dict:
        """The keyword arguments of :func:`pyw8a8.torch.quantize` this config stands for."""
        return {"include": self.include, "exclude": self.exclude,
                "min_in_features": self.min_in_features, "rotate": self.rotate,
                "block": self.block, "seed": self.seed, "fuse": self.fuse}


class W8A8Quantizer(HfQuantizer):
    """transformers' side of `W8A8Config`: the float checkpoint loads, then
    :func:`pyw8a8.torch.quantize` runs on the model in place."""

    requires_calibration = False

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        device_map = kwargs.get("device_map")
        devices = set(device_map.values()) if isinstance(device_map, dict) else {device_map}
        if not devices <= {None, "cpu", -1}:
            raise ValueError(f"pyw8a8 runs on the CPU; device_map {device_map!r} places the "
                             f"model elsewhere")

    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        if self.pre_quantized:
            raise ValueError("this checkpoint names pyw8a8's quantization, but pyw8a8 reads "
                             "float checkpoints only: load the float model with "
                             "quantization_config=W8A8Config()")
        model = quantize(model, inplace=True, **self.quantization_config.quantize_options())
        _own_memory(model)
        return model

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        _LOG.warning("pyw8a8: a model quantized on loading does not save as a transformers "
                     "checkpoint; save its state_dict (torch.save(model.state_dict(), ...)) "
                     "and load it into a model quantized the same way")
        return False

    @property
    def is_trainable(self) -> bool:
        return False


def _own_memory(model: Any) -> None:
    """The float tensors quantize left (norms, biases, layers kept float) copied into memory
    of their own: loaded, they are views of the checkpoint's mapped file, and while one of
    them lives the whole mapping does, with every page quantizing read (Gemma 3 270M held
    1.8 GB resident where its tensors are 270 MB)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, _PackedModule):  # packed from numpy, its own memory
                continue
            for tensor in (*module._parameters.values(), *module._buffers.values()):
                if tensor is not None and tensor.is_floating_point():
                    tensor.data = tensor.data.clone()


# Registered once, when this module is first imported (the registry refuses a second).
register_quantization_config(QUANT_METHOD)(W8A8Config)
register_quantizer(QUANT_METHOD)(W8A8Quantizer)
