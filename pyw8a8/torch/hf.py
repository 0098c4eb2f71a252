"""`W8A8Config`: pyw8a8 in transformers' quantizer registry, so a model is quantized as it
loads, saved in int8 and loaded again::

    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=W8A8Config())
    model.save_pretrained(saved)                           # int8 safetensors + config.json
    model = AutoModelForCausalLM.from_pretrained(saved)    # after `import pyw8a8.torch`

From a float checkpoint the quantizer lets transformers load it, then runs
:func:`pyw8a8.torch.quantize` on the model in place, with the config's options (one rule
for both routes: the same layers, fusions, tied vocabulary and attention).  Saved, the
checkpoint holds the packed weights as the layers' buffers hold them (``<layer>.weight_panels``,
``_psum``, ``_scales``, ``_header``) and the config names the options and the encoding;
loading it builds the quantized model's skeleton from the config (``convert.skeleton``),
which the saved tensors fill, each weight checked in full: no float weight is made.
"""
from __future__ import annotations

import json
import zlib
from typing import Any, Optional, Sequence

import numpy as np
import torch
from transformers.quantizers.auto import register_quantization_config, register_quantizer
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from .._layout import W8_KPAD, W8_NR
from .._packed.panels import ENCODINGS
from ..packing import resolve_encoding
from . import _ops
from ._packed_module import _pack, _PackedModule
from .convert import _selection, own_float_memory, quantize, share_products, skeleton

__all__ = ["W8A8Config"]

#: The quant_method transformers knows pyw8a8 by.
QUANT_METHOD = "pyw8a8"
#: The layout of a saved checkpoint (its tensors' names and the config's fields); a
#: checkpoint of another is refused.
CHECKPOINT_FORMAT = 1
#: The safetensors metadata entry of the packed tensors' CRC-32s (JSON, by key).
CHECKSUMS = "pyw8a8_crc32"


class W8A8Config(QuantizationConfigMixin):
    """pyw8a8's quantization for ``from_pretrained(..., quantization_config=...)``.

    Parameters
    ----------
    include, exclude, min_in_features, rotate, block, seed, fuse
        As :func:`pyw8a8.torch.quantize`: which ``nn.Linear`` layers go W8A8, the
        rotation of their weights, and whether activations and gated units are fused.
    encoding, checkpoint_format
        Set when a model is quantized, and saved with it: the packed weights' encoding
        ('biased' or 'signed', which every CPU reads) and the checkpoint's layout; a
        config read from a saved checkpoint has them, one given by hand leaves them None.

    Raises
    ------
    TypeError, ValueError
        For an option :func:`~pyw8a8.torch.quantize` would refuse (the message names it),
        when the config is made rather than after the checkpoint has loaded; for an
        encoding or a checkpoint format this pyw8a8 does not read.

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
                 fuse: bool = True, encoding: Optional[str] = None,
                 checkpoint_format: Optional[int] = None, **kwargs: Any) -> None:
        self.quant_method = QUANT_METHOD
        self.include, self.exclude = include, exclude
        self.min_in_features, self.rotate, self.block = min_in_features, rotate, block
        self.seed, self.fuse = seed, fuse
        self.encoding, self.checkpoint_format = encoding, checkpoint_format
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
        if self.encoding is not None and self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.checkpoint_format not in (None, CHECKPOINT_FORMAT):
            raise ValueError(f"checkpoint_format {self.checkpoint_format!r}: this pyw8a8 "
                             f"reads checkpoints of format {CHECKPOINT_FORMAT} (saved by "
                             f"another version?)")

    def quantize_options(self) -> dict:
        """The keyword arguments of :func:`pyw8a8.torch.quantize` this config stands for."""
        return {"include": self.include, "exclude": self.exclude,
                "min_in_features": self.min_in_features, "rotate": self.rotate,
                "block": self.block, "seed": self.seed, "fuse": self.fuse}


class W8A8Quantizer(HfQuantizer):
    """transformers' side of `W8A8Config`: a float checkpoint loads, then
    :func:`pyw8a8.torch.quantize` runs on the model in place; a saved one fills the
    skeleton of the quantized model."""

    requires_calibration = False

    def __init__(self, quantization_config: W8A8Config, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        #: While a saved checkpoint loads: the packed layers' qualified names, and each
        #: weight's header as the config implies it (what the checkpoint's must be).
        self._layers: set[str] = set()
        self._headers: dict[str, torch.Tensor] = {}
        #: The CRC-32 of each packed tensor, as saved in the checkpoint's metadata.
        self._checksums: dict[str, int] = {}

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        device_map = kwargs.get("device_map")
        devices = set(device_map.values()) if isinstance(device_map, dict) else {device_map}
        if not devices <= {None, "cpu", -1}:
            raise ValueError(f"pyw8a8 runs on the CPU; device_map {device_map!r} places the "
                             f"model elsewhere")

    def _process_model_before_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        if not self.pre_quantized:
            return model
        config = self.quantization_config
        if config.checkpoint_format is None or config.encoding is None:
            raise ValueError("this checkpoint's quantization_config names pyw8a8 but not its "
                             "encoding and checkpoint_format: it was not written by "
                             "save_pretrained of a pyw8a8 model")
        self._checksums = _saved_checksums(kwargs.get("checkpoint_files") or ())
        _tie(model)
        skeleton(model, encoding=config.encoding, **config.quantize_options())
        # Ties whose float weights quantize replaced are gone; those kept float (an
        # excluded LM head's) tie as before.
        params = dict(model.named_parameters(remove_duplicate=False))
        model.all_tied_weights_keys = {t: s for t, s in model.all_tied_weights_keys.items()
                                       if t in params and s in params}
        packed = _packed_modules(model)
        self._layers = {name for name, _ in packed}
        self._headers = {f"{name}.{part}": module._buffers[part].clone()
                         for name, module in packed
                         for parts in module._parts.values() for part in parts[3:]}
        return model

    def get_new_dtype(self, converter: Any, param: Any, dtype: Any) -> Any:
        # A packed layer's scales and biases are float32 by definition: never cast to the
        # dtype the model's float tensors load in.
        targets = getattr(converter, "_original_target_patterns", ())
        if self.pre_quantized and any(t.rpartition(".")[0] in self._layers for t in targets):
            return None
        return super().get_new_dtype(converter, param, dtype)

    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        config = self.quantization_config
        if self.pre_quantized:
            _check_loaded(model, self._headers, self._checksums)
            share_products(model, model.pyw8a8_report)
            own_float_memory(model)
        else:
            model = quantize(model, inplace=True, **config.quantize_options())
            config.encoding = resolve_encoding("auto")
            config.checkpoint_format = CHECKPOINT_FORMAT
        return model

    def get_state_dict_and_metadata(self, model: Any) -> tuple[dict, dict]:
        # Layers that share one product view its weight: safetensors saves each tensor
        # whole, so a view is saved as a copy of its own.
        state = {name: t.clone() if _is_view(t) else t
                 for name, t in model.state_dict().items()}
        checksums = {f"{name}.{part}": _crc32(module._buffers[part])
                     for name, module in _packed_modules(model)
                     for parts in module._parts.values() for part in parts}
        return state, {CHECKSUMS: json.dumps(checksums)}

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def _tie(model: Any) -> None:
    """The skeleton's tied weights made one, as loading a float checkpoint ties them, so
    the skeleton's layers are those quantize makes (a tied LM head packed once, its
    embedding reading it).  (transformers' own tie_weights does nothing while the
    skeleton is being built.)"""
    for target, source in model.all_tied_weights_keys.items():
        parent, _, name = target.rpartition(".")
        setattr(model.get_submodule(parent), name, model.get_parameter(source))


def _crc32(t: torch.Tensor) -> int:
    return zlib.crc32(t.detach().contiguous().numpy().view(np.uint8).reshape(-1))


def _saved_checksums(files: Sequence[str]) -> dict[str, int]:
    """The packed tensors' CRC-32s from the metadata of a checkpoint's safetensors files
    (each shard holds them all)."""
    from safetensors import safe_open
    for file in files:
        if str(file).endswith(".safetensors"):
            with safe_open(file, "pt") as f:
                saved = (f.metadata() or {}).get(CHECKSUMS)
            if saved is not None:
                return {key: int(value) for key, value in json.loads(saved).items()}
    raise ValueError("this checkpoint's safetensors files hold no pyw8a8 checksums: it was "
                     "not written by save_pretrained of a pyw8a8 model")


def _packed_modules(model: Any) -> list[tuple[str, _PackedModule]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, _PackedModule)]


def _is_view(t: torch.Tensor) -> bool:
    return t.untyped_storage().nbytes() != t.numel() * t.element_size()


def _check_loaded(model: Any, headers: dict, checksums: dict) -> None:
    """Every packed layer's tensors loaded from the checkpoint, as saved (their CRC-32s),
    of the settings its config implies, checked in full (the layout and contents every
    product trusts) and moved into memory of their own; ValueError naming the first that
    is not."""
    for name, module in _packed_modules(model):
        for prefix, parts in module._parts.items():
            keys = [f"{name}.{part}" for part in parts]
            loaded = [module._buffers[part] for part in parts]
            for key, tensor in zip(keys, loaded):
                if not getattr(tensor, "_is_hf_initialized", False):
                    raise ValueError(f"the checkpoint has no {key}: not a complete "
                                     f"pyw8a8 checkpoint")
                if checksums.get(key) != _crc32(tensor):
                    raise ValueError(f"{key} is damaged: its bytes are not those saved "
                                     f"(CRC-32 {_crc32(tensor)}, saved "
                                     f"{checksums.get(key)})")
            if not torch.equal(loaded[3], headers[keys[3]]):
                raise ValueError(
                    f"{keys[3]} says {_ops.settings(loaded[3])}, the checkpoint's "
                    f"config implies {_ops.settings(headers[keys[3]])}")
            owned = [_ops.owned_copy(t) for t in loaded]
            try:
                _ops.packed_from(*owned)
            except ValueError as exc:
                raise ValueError(f"{name}.{prefix}: {exc}") from None
            with torch.inference_mode(False):
                for part, tensor in zip(parts, owned):
                    module._buffers[part] = tensor
        for part in module._biases:
            bias = module._buffers[part]
            if bias is not None and not getattr(bias, "_is_hf_initialized", False):
                raise ValueError(f"the checkpoint has no {name}.{part}: not a complete "
                                 f"pyw8a8 checkpoint")


# Registered once, when this module is first imported (the registry refuses a second).
register_quantization_config(QUANT_METHOD)(W8A8Config)
register_quantizer(QUANT_METHOD)(W8A8Quantizer)
