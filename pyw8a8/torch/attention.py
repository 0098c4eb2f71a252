"""pyw8a8's attention implementations for transformers models.

transformers picks a model's attention function by name (``config._attn_implementation``,
looked up in its ``AttentionInterface``) and the mask function by the same name
(``AttentionMaskInterface``).  pyw8a8 registers one name per implementation it wraps:
``"pyw8a8"`` over ``"sdpa"`` and ``"pyw8a8_eager"`` over ``"eager"``, each with the mask
function of the one it wraps.  Called with the receipt of an
:class:`~pyw8a8.torch.Int8Cache`'s layer in the place of the keys, it runs pyw8a8's int8
attention (``torch.ops.pyw8a8.kv_attention``).  In a bidirectional layer (an encoder's)
over "sdpa", float32 attention runs on pyw8a8's fused kernel
(``torch.ops.pyw8a8.float_attention``: SDPA's arithmetic within float32 rounding, the keys
a padding mask hides skipped).  Anything else (a decoder's attention over a default cache,
"eager") calls the wrapped function with the same arguments, so the model computes what
it computed before.  The checks are on the layer, dtypes and arguments, which
``torch.compile`` resolves while tracing: a compiled model keeps one graph.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from . import _float_attention, _int8_attention  # noqa: F401 (registers kv_attention)
from ._ops import INFERENCE_ONLY

__all__ = ["ATTENTION_NAMES", "enable_int8_attention"]

#: pyw8a8's implementation's name for each implementation it wraps.
ATTENTION_NAMES = {"sdpa": "pyw8a8", "eager": "pyw8a8_eager"}
#: The query dtypes the int8 attention takes.
QUERY_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _eager(module: torch.nn.Module) -> Callable:
    """The model's own eager attention: its modeling file's ``eager_attention_forward``
    (transformers' default when a model's implementation is "eager")."""
    function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if function is None:
        raise RuntimeError(f"{type(module).__name__}'s module has no eager_attention_forward "
                           f"for pyw8a8_eager to call")
    return function


def is_receipt(key: Any) -> bool:
    """Whether `key` is an Int8Cache layer's receipt (``torch.ops.pyw8a8.kv_append``'s)
    in the place of the keys."""
    return isinstance(key, torch.Tensor) and key.dtype == torch.int64 and key.dim() == 1


def int8_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, attention_mask: Any, **kwargs):
    """pyw8a8's int8 attention over an Int8Cache's layer, for transformers.

    Parameters
    ----------
    module : torch.nn.Module
        The model's attention module.
    query : torch.Tensor
        float32, bfloat16 or float16 (batch, query heads, queries, head_dim), on the CPU;
        query heads a multiple of the KV heads (GQA).
    key, value : torch.Tensor
        The receipt :meth:`Int8Layer.update` returns in their places.
    attention_mask : torch.Tensor or None
        The mask of the model's mask function: bool (True where a query sees a token) or
        additive float, (batch, 1 or query heads, queries, tokens); None: causal.
    **kwargs
        ``scaling`` (default head_dim ** -0.5), ``softcap`` (tanh softcapping of the
        scores, as Gemma 2 has), ``dropout`` (must be 0: inference only); the rest (the
        sliding window, which the cache's layer applies) is not used.

    Returns
    -------
    tuple
        The output, (batch, queries, query heads, head_dim) in `query`'s dtype, and None
        (no attention weights).
    """
    if not isinstance(query, torch.Tensor) or query.device.type != "cpu":
        raise ValueError(f"query must be a CPU tensor; pyw8a8's int8 attention runs on the "
                         f"CPU, got {getattr(query, 'device', type(query).__name__)}")
    if query.dtype not in QUERY_DTYPES:
        raise TypeError(f"query must be float32, bfloat16 or float16, got {query.dtype}")
    if query.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"query {INFERENCE_ONLY}")
    if query.dim() != 4:
        raise ValueError(f"query must be (batch, heads, queries, head_dim), got shape "
                         f"{tuple(query.shape)}")
    if kwargs.get("dropout", 0.0) and module.training:
        raise RuntimeError("pyw8a8's int8 attention is inference only: dropout must be 0 "
                           "(call model.eval())")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a tensor or None, got "
                        f"{type(attention_mask).__name__}")
    scaling = kwargs.get("scaling")
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    softcap = kwargs.get("softcap")
    out = torch.ops.pyw8a8.kv_attention(query, key, attention_mask, scaling,
                                        0.0 if softcap is None else float(softcap))
    return out, None


def _takes_float_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: Any, kwargs: dict) -> bool:
    """Whether pyw8a8's float attention (``torch.ops.pyw8a8.float_attention``) computes
    this call of SDPA's: a bidirectional layer's (an encoder's: a causal one's prefill and
    decode stay SDPA's), float32 on the CPU, with no gradient to record, no dropout in
    training, no softcapping, position bias or attention weights asked for, and a bool or
    float32 mask or none."""
    if getattr(module, "is_causal", True) or (module.training and kwargs.get("dropout")):
        return False
    if any(kwargs.get(name) is not None for name in ("softcap", "position_bias")) or \
            kwargs.get("output_attentions"):
        return False
    if not all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (query, key, value)):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return False
    return attention_mask is None or (isinstance(attention_mask, torch.Tensor) and
                                      attention_mask.dtype in _float_attention.MASK_DTYPES)


def _over(inner: str) -> Callable:
    """The registered function of the pyw8a8 implementation over `inner`."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def attention(module, query, key, value, attention_mask, **kwargs):
        if is_receipt(key):
            return int8_attention(module, query, key, value, attention_mask, **kwargs)
        if inner == "sdpa" and _takes_float_attention(module, query, key, value,
                                                      attention_mask, kwargs):
            scaling = kwargs.get("scaling")
            scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
            out = torch.ops.pyw8a8.float_attention(query, key, value, attention_mask, scale,
                                                   False)
            return out.transpose(1, 2), None
        wrapped = _eager(module) if inner == "eager" else ALL_ATTENTION_FUNCTIONS[inner]
        return wrapped(module, query, key, value, attention_mask, **kwargs)
    attention.__name__ = f"pyw8a8_over_{inner}"
    return attention


def _padding_mask_over(sdpa_mask: Callable) -> Callable:
    """The mask function of "pyw8a8": sdpa's, but an encoder's padding mask as
    (batch, 1, 1, keys), one row for every head and query, where sdpa's expands it to
    (batch, 1, queries, keys).  The attention reads it broadcast either way; compiled,
    Inductor wrote the expanded mask out element by element, 28 ms of a 300 ms encode of
    the whole questions of `bench --torch` (Zen 5)."""
    from transformers.masking_utils import bidirectional_mask_function

    def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
             attention_mask=None, local_size=None, allow_is_bidirectional_skip=False,
             **kwargs):
        if not (mask_function is bidirectional_mask_function and local_size is None
                and kv_offset == 0 and isinstance(attention_mask, torch.Tensor)
                and attention_mask.dim() == 2 and attention_mask.shape[1] == kv_length):
            return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset,
                             kv_offset=kv_offset, mask_function=mask_function,
                             attention_mask=attention_mask, local_size=local_size,
                             allow_is_bidirectional_skip=allow_is_bidirectional_skip,
                             **kwargs)
        # No mask where nothing is padded, as sdpa's (eager only: it reads the values).
        if allow_is_bidirectional_skip and not torch.compiler.is_compiling() and \
                bool(attention_mask.all()):
            return None
        return attention_mask[:, None, None, :].bool()
    return mask


def register() -> None:
    """Register pyw8a8's implementations with transformers (once; again is harmless)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface
    for inner, name in ATTENTION_NAMES.items():
        if name not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
            AttentionInterface.register(name, _over(inner))
            wrapped = ALL_MASK_ATTENTION_FUNCTIONS[inner]
            AttentionMaskInterface.register(
                name, _padding_mask_over(wrapped) if inner == "sdpa" else wrapped)


def enable_int8_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Run a transformers model's attention through pyw8a8: int8 attention where the
    model is given an :class:`~pyw8a8.torch.Int8Cache`, pyw8a8's float attention in its
    bidirectional layers over "sdpa" (an encoder's), its own attention otherwise.

    :func:`pyw8a8.torch.quantize` calls it on a transformers model; call it on a model
    that pyw8a8 did not quantize to use an Int8Cache there.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        On the CPU, with attention implementation "sdpa" or "eager".

    Returns
    -------
    transformers.PreTrainedModel
        `model` itself, its attention implementation now "pyw8a8" (over "sdpa") or
        "pyw8a8_eager" (over "eager"); already so, it is left as it is.

    Raises
    ------
    TypeError
        `model` is not a transformers ``PreTrainedModel``.
    ValueError
        Its attention implementation is another (flash, flex, paged: pyw8a8 wraps sdpa and
        eager), or it cannot change it (its attention does not go through transformers'
        ``AttentionInterface``).
    """
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel, got "
                        f"{type(model).__name__}")
    current = model.config._attn_implementation
    if current in ATTENTION_NAMES.values():
        return model
    if current not in ATTENTION_NAMES:
        raise ValueError(f"the model's attention implementation is {current!r}; pyw8a8's "
                         f"int8 attention wraps {' or '.join(map(repr, ATTENTION_NAMES))} "
                         f"(load the model with attn_implementation='sdpa')")
    register()
    model.set_attn_implementation(ATTENTION_NAMES[current])
    if model.config._attn_implementation != ATTENTION_NAMES[current]:
        raise ValueError(f"{type(model).__name__} cannot change its attention implementation "
                         f"(its attention does not go through transformers' "
                         f"AttentionInterface)")
    return model
