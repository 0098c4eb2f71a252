"""`Int8Cache`: a transformers ``Cache`` whose keys and values are int8.

Each layer keeps its tokens in buffers with room to spare: int8 keys (rotated, then
quantized per token and KV head) and their float32 scales, int8 values stored transposed
(head_dim x tokens, the left operand of the attention's P.V product) and theirs.  A new
token is written in place; a full buffer grows to twice its size (amortized doubling), and
a sliding-window layer, which keeps only its last ``window - 1`` tokens as transformers'
``DynamicSlidingWindowLayer`` does, in a buffer of about twice the window, moves them to
the front once it reaches the end, so no step copies the whole cache.

``update`` returns int8 views of the live tokens, the keys marked with the rest
(:class:`~pyw8a8.torch._int8_attention.QuantizedKV`); pyw8a8's attention implementation
(:mod:`pyw8a8.torch.attention`) finds the mark and runs the int8 attention.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs
from transformers.configuration_utils import PreTrainedConfig

from .._layout import padded
from . import _int8_attention
from .attention import ATTENTION_NAMES

__all__ = ["Int8Cache", "Int8Layer"]

#: The dtypes the cache quantizes from.
KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Buffers hold whole multiples of this many tokens; a full layer's first buffer holds its
# first update and an eighth more (then doubles).
_CAPACITY_STEP = 64


class Int8Layer(CacheLayerMixin):
    """One attention layer's int8 keys and values (see the module's description).

    Parameters
    ----------
    num_heads, head_dim : int
        The KV heads and their size, which every update must have.
    block, seed : int
        The keys' rotation before quantizing (:func:`pyw8a8.rotate`'s); block 0: none.
    probabilities : {"int8", "int8x2"}
        How the attention quantizes P for P.V (:class:`Int8Cache`).
    window : int, optional
        A sliding-window layer's window: only the last ``window - 1`` tokens are kept
        between updates.
    """

    is_compileable = False
    is_croppable = True

    def __init__(self, num_heads: int, head_dim: int, block: int, seed: int,
                 window: Optional[int] = None, probabilities: str = "int8x2"):
        super().__init__()
        self.num_heads, self.head_dim, self.block, self.seed = num_heads, head_dim, block, seed
        self.probabilities = probabilities
        self.window = window
        self.is_sliding = window is not None
        self.cumulative_length = 0
        self._buffers: Optional[dict[str, torch.Tensor]] = None
        self._start = self._end = 0

    # token axis of each buffer: keys (B, H, cap, d), values_t (B, H, d, cap), scales (B, H, cap)
    _AXES = {"keys": 2, "key_scales": 2, "values_t": 3, "value_scales": 2}

    @property
    def capacity(self) -> int:
        """Tokens the buffers hold before they grow or, sliding, move their tokens."""
        return 0 if self._buffers is None else self._buffers["keys"].shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of the layer's buffers (as allocated, the room to spare included)."""
        return 0 if self._buffers is None else sum(b.nbytes for b in self._buffers.values())

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        n = key_states.shape[2]
        self._allocate(key_states.shape[0], padded(n + n // 8 + 1, _CAPACITY_STEP))
        self.device = key_states.device
        self.is_initialized = True

    def _allocate(self, batch: int, capacity: int) -> None:
        """Fresh buffers of `capacity` tokens, the live tokens copied to their front."""
        h, d = self.num_heads, self.head_dim
        new = {"keys": torch.empty((batch, h, capacity, d), dtype=torch.int8),
               "key_scales": torch.empty((batch, h, capacity), dtype=torch.float32),
               "values_t": torch.empty((batch, h, d, capacity), dtype=torch.int8),
               "value_scales": torch.empty((batch, h, capacity), dtype=torch.float32)}
        live = self._end - self._start
        if self._buffers is not None:
            for name, axis in self._AXES.items():
                new[name].narrow(axis, 0, live).copy_(
                    self._buffers[name].narrow(axis, self._start, live))
        self._buffers, self._start, self._end = new, 0, live

    def _make_room(self, tokens: int) -> None:
        if self._end + tokens <= self.capacity:
            return
        live = self._end - self._start
        if live + tokens <= self.capacity // 2:  # a sliding layer: move its window forward
            for name, axis in self._AXES.items():
                buffer = self._buffers[name]
                buffer.narrow(axis, 0, live).copy_(buffer.narrow(axis, self._start, live).clone())
            self._start, self._end = 0, live
        else:
            self._allocate(self._buffers["keys"].shape[0],
                           max(2 * self.capacity, live + tokens))

    def _check(self, key_states: Any, value_states: Any) -> None:
        for name, t in (("key_states", key_states), ("value_states", value_states)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.device.type != "cpu":
                raise ValueError(f"{name} is on {t.device}; Int8Cache and its int8 attention "
                                 f"run on the CPU")
            if t.dtype not in KV_DTYPES:
                raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
            if t.dim() != 4 or t.shape[1] != self.num_heads or t.shape[3] != self.head_dim:
                raise ValueError(f"{name} must be (batch, {self.num_heads} KV heads, tokens, "
                                 f"{self.head_dim}) as the model's config says, got shape "
                                 f"{tuple(t.shape)}")
        if value_states.shape != key_states.shape:
            raise ValueError(f"value_states {tuple(value_states.shape)} and key_states "
                             f"{tuple(key_states.shape)} differ in shape")
        if self._buffers is not None and key_states.shape[0] != self._buffers["keys"].shape[0]:
            raise ValueError(f"key_states has batch {key_states.shape[0]}; the cache holds "
                             f"{self._buffers['keys'].shape[0]} (reset it for another batch)")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize and append the new tokens; return the int8 keys (batch, heads, tokens,
        head_dim), marked with the rest, and values (the same shape, a transposed view)
        of every token the attention sees: all of them, or for a sliding layer the last
        ``window - 1`` before these and these."""
        self._check(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        k8, k_scales = _int8_attention.quantize_rows(key_states, self.block, self.seed,
                                                     name="key_states")
        v8, v_scales = _int8_attention.quantize_rows(value_states, name="value_states")
        n = key_states.shape[2]
        self._make_room(n)
        b, e = self._buffers, self._end
        b["keys"][:, :, e:e + n] = k8
        b["key_scales"][:, :, e:e + n] = k_scales
        b["values_t"][:, :, :, e:e + n] = v8.transpose(-1, -2)
        b["value_scales"][:, :, e:e + n] = v_scales
        self._end += n
        self.cumulative_length += n
        s = self._start
        if self._end - s > _int8_attention.MAX_TOKENS:
            raise ValueError(f"{self._end - s} tokens exceed the {_int8_attention.MAX_TOKENS} "
                             f"whose int8 attention sums stay exact in int32")
        keys_out = b["keys"][:, :, s:self._end]
        values_t = b["values_t"][:, :, :, s:self._end]
        setattr(keys_out, _int8_attention.MARK, _int8_attention.QuantizedKV(
            b["key_scales"][:, :, s:self._end], values_t, b["value_scales"][:, :, s:self._end],
            self.block, self.seed, self.probabilities))
        if self.window is not None:
            self._start = max(s, self._end - (self.window - 1))
            window_capacity = padded(2 * self.window, _CAPACITY_STEP)
            if self.capacity > 2 * window_capacity:  # after a long prefill: the window only
                self._allocate(b["keys"].shape[0], window_capacity)
        return keys_out, values_t.transpose(-1, -2)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The length and offset of the tokens the next update returns (for the mask)."""
        if self.window is None:
            return self.cumulative_length + query_length, 0
        offset = max(self.cumulative_length - self.window + 1, 0)
        kept = min(self.cumulative_length, self.window - 1)
        return kept + query_length, offset

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1 if self.window is None else self.window

    def reset(self) -> None:
        self._buffers, self._start, self._end = None, 0, 0
        self.cumulative_length = 0
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` tokens (a negative count, as transformers
        5 passes it); a sliding layer only while it still holds them."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got "
                             f"{tokens_to_remove}")
        remove = -tokens_to_remove
        if remove > self._end - self._start:
            raise RuntimeError(f"cannot remove {remove} tokens: this sliding-window layer "
                               f"keeps only its last {self._end - self._start}")
        self._end -= remove
        self.cumulative_length -= remove

    def _map_batch(self, fn) -> None:
        if self._buffers is not None:
            self._buffers = {name: fn(buffer) for name, buffer in self._buffers.items()}

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda b: b.index_select(0, beam_idx.cpu()))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda b: b.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda b: b[indices])


class Int8Cache(Cache):
    """A transformers ``Cache`` holding keys and values in int8, for pyw8a8's int8
    attention.

    Keys and values are quantized per token and KV head (one float32 scale each,
    symmetric, round to nearest, magnitudes up to 127); keys after a block randomized
    Hadamard rotation (:func:`pyw8a8.rotate`, block = head_dim when it is a power of two),
    which the attention applies to the queries too.  Pass it as ``past_key_values`` (or
    ``cache``) to the forward or ``generate`` of a model whose attention runs through
    pyw8a8 (:func:`pyw8a8.torch.quantize` sets that, or
    :func:`pyw8a8.torch.enable_int8_attention`).

    Parameters
    ----------
    config : transformers.PreTrainedConfig
        The config of the model that runs it (``model.config``): its KV heads, head size,
        layer types (full or sliding-window attention) and attention implementation.
    seed : int
        Seed of the rotation's signs, in [0, 2**32 - 1].
    probabilities : {"int8", "int8x2"}
        How P.V quantizes each query's probabilities (V's scales folded in): "int8x2"
        (the default), an int8 row (scale max / 127) and its rounding error as a second
        int8 row in steps of 1/254 of the first's (about 15 bits), two int8 products in
        one call; "int8", the first row alone.  One int8 row loses the probabilities below
        half a step of the largest:
        on Gemma 3 270M at 1,024 tokens of context the KL of the next-token distributions
        to the float model was 0.0088 with "int8", 0.0039 with "int8x2" and 0.0035 with
        the default cache (``bench --torch --torch-models kvcache``).

    Raises
    ------
    TypeError
        `config` is not a transformers config.
    ValueError
        The model is an encoder-decoder (cross-attention), or has layers other than full,
        sliding-window or chunked attention (linear attention, shared KV, ...).

    Notes
    -----
    ``update`` raises a RuntimeError where the model's attention implementation is not
    pyw8a8's (naming it), a ValueError for states of another KV head count, head size or
    batch, or off the CPU, a TypeError for a dtype other than float32, bfloat16, float16.
    Cropping works (assisted decoding); offloading and ``torch.compile`` do not.

    Examples
    --------
    >>> import torch, transformers, pyw8a8.torch
    >>> config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    ...     vocab_size=100)
    >>> model = pyw8a8.torch.quantize(transformers.LlamaForCausalLM(config).eval())
    >>> cache = pyw8a8.torch.Int8Cache(model.config)
    >>> out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4,
    ...                      do_sample=False, cache=cache)  # transformers 4: past_key_values
    >>> cache.get_seq_length()  # the last new token is not fed back
    6
    >>> cache.nbytes  # 2 layers x 64 tokens of room x 2 heads x (16 + 16 + 4 + 4) bytes
    10240
    """

    def __init__(self, config: PreTrainedConfig, *, seed: int = 0,
                 probabilities: str = "int8x2"):
        if not isinstance(config, PreTrainedConfig):
            raise TypeError(f"config must be a transformers PreTrainedConfig (model.config), "
                            f"got {type(config).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an int in [0, 2**32 - 1], got {seed!r}")
        if probabilities not in _int8_attention.PROBABILITIES:
            raise ValueError(f"probabilities must be one of "
                             f"{', '.join(map(repr, _int8_attention.PROBABILITIES))}, got "
                             f"{probabilities!r}")
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("Int8Cache holds a decoder's self-attention; this model is an "
                             "encoder-decoder, whose cross-attention cannot run on it")
        text = config.get_text_config(decoder=True)
        num_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        block = _int8_attention.rotation_block(int(head_dim))
        layer_types, layer_kwargs = get_layer_types_and_kwargs(text)
        layers = []
        for i, (layer_type, kwargs) in enumerate(zip(layer_types, layer_kwargs)):
            if layer_type == "full_attention":
                window = None
            elif layer_type in ("sliding_attention", "chunked_attention"):
                window = int(kwargs["sliding_window"])
            else:
                raise ValueError(f"layer {i} of the model is {layer_type!r}; Int8Cache holds "
                                 f"full and sliding-window attention layers only")
            layers.append(Int8Layer(int(num_heads), int(head_dim), block, seed, window,
                                    probabilities))
        super().__init__(layers=layers)
        self.config = text
        self.seed, self.probabilities = seed, probabilities

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        implementation = self.config._attn_implementation
        if implementation not in ATTENTION_NAMES.values():
            raise RuntimeError(
                f"the model's attention implementation is {implementation!r}, which cannot "
                f"read an Int8Cache: quantize the model with pyw8a8.torch.quantize or call "
                f"pyw8a8.torch.enable_int8_attention(model), and make the cache from that "
                f"model's config (Int8Cache(model.config))")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    @property
    def nbytes(self) -> int:
        """Bytes of the cache's buffers: int8 keys and values and their float32 scales, as
        allocated (with the room each layer keeps to grow in place)."""
        return sum(layer.nbytes for layer in self.layers)
