"""`Int8Cache`: a transformers ``Cache`` whose keys and values are int8, a thin adapter over
pyw8a8's int8 KV store (:class:`pyw8a8.attention.Int8KVCache`: pages of int8 keys, rotated,
and values, one float32 scale per token and KV head; a batch row's KV heads are the store's
heads).  A layer's ``update`` appends through ``torch.ops.pyw8a8.kv_append`` and returns its
receipt; pyw8a8's attention implementation (:mod:`pyw8a8.torch.attention`) finds the
receipt and runs ``torch.ops.pyw8a8.kv_attention`` (:mod:`._int8_attention`).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs
from transformers.configuration_utils import PreTrainedConfig

from ..attention import Int8KVCache
from . import _int8_attention
from .attention import ATTENTION_NAMES

__all__ = ["Int8Cache", "Int8Layer"]

#: The dtypes the cache quantizes from.
KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class Int8Layer(CacheLayerMixin):
    """One attention layer of an :class:`Int8Cache`: its place in the cache's store, and
    the token count and window transformers' masks are sized by.

    Parameters
    ----------
    cache : Int8Cache
    index : int
        The layer's index in the cache's store.
    window : int, optional
        A sliding-window layer's window.
    """

    is_compileable = False
    is_croppable = True

    def __init__(self, cache: "Int8Cache", index: int, window: Optional[int] = None):
        super().__init__()
        self.cache, self.index, self.window = cache, index, window
        self.is_sliding = window is not None
        self.cumulative_length = 0
        # int64 (cache id, layer): the operators' handle of this layer's store
        self.handle = torch.tensor([cache.cache_id, index])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize and store the new tokens (batch, KV heads, tokens, head_dim); return
        their receipt twice (in the places of the keys and values), which pyw8a8's
        attention reads."""
        self.cache.check_states(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        receipt = torch.ops.pyw8a8.kv_append(self.handle, key_states, value_states)
        self.cumulative_length += key_states.shape[2]
        return receipt, receipt

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The length and offset of the tokens the next attention sees (for the mask): all
        of them, or for a sliding layer the last ``window - 1`` and the new ones."""
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
        self.cumulative_length = 0
        self.is_initialized = False
        self.cache.store = None  # every layer's: the next update may bring another batch

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` tokens (a negative count, as transformers
        5 passes it); a sliding layer only while it still holds them."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got "
                             f"{tokens_to_remove}")
        if tokens_to_remove and self.cache.store is not None:
            self.cache.store._truncate(self.index, self.cumulative_length + tokens_to_remove)
        self.cumulative_length += tokens_to_remove

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.index == 0:
            self.cache.select_batch(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.index == 0 and self.cache.store is not None:
            self.cache.select_batch(torch.arange(self.cache.batch).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.index == 0 and self.cache.store is not None:
            self.cache.select_batch(torch.arange(self.cache.batch)[indices])


class Int8Cache(Cache):
    """A transformers ``Cache`` holding keys and values in int8, for pyw8a8's int8
    attention.

    Keys and values are quantized per token and KV head (one float32 scale each,
    symmetric, round to nearest, magnitudes up to 127); keys after a block randomized
    Hadamard rotation (:func:`pyw8a8.rotate`, block = head_dim when it is a power of two),
    which the attention applies to the queries too.  They are held in pages of 128 tokens
    (a sliding-window layer drops the pages its window has passed), as numpy's
    :class:`pyw8a8.attention.Int8KVCache` holds them: the same store, and the same int8
    attention (both products exact int8 sums on pyw8a8's kernels).  Pass it as
    ``past_key_values`` (or ``cache``) to the forward or ``generate`` of a model whose
    attention runs through pyw8a8 (:func:`pyw8a8.torch.quantize` sets that, or
    :func:`pyw8a8.torch.enable_int8_attention`), eager or under ``torch.compile``.

    Parameters
    ----------
    config : transformers.PreTrainedConfig
        The config of the model that runs it (``model.config``): its KV heads, head size,
        layer types (full or sliding-window attention) and attention implementation.
    seed : int
        Seed of the rotation's signs, in [0, 2**32 - 1].
    probability_terms : {1, 2}
        int8 terms per query's row of probabilities (V's scales folded in) in P.V, as
        numpy's :class:`pyw8a8.attention.Int8KVCache` names them: 2 (the default), an int8
        row (scale max / 127) and its rounding error as a second int8 row in steps of
        1/254 of the first's (about 15 bits), rows of one product; 1, the first row
        alone, which loses the probabilities below half a step of the largest.

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
    pyw8a8's (naming it), a ValueError for a layer the config does not have, for states
    of another KV head count, head size or batch, or off the CPU, a TypeError for a dtype
    other than float32, bfloat16, float16; the attention refuses a mask of another shape
    (the stored tokens are then as they were).  Cropping (assisted decoding) and beam
    search work; offloading does not.

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
    >>> cache.nbytes  # 2 layers x 2 heads x 16 tokens of room x (16 + 16 + 4 + 4) bytes
    2560
    """

    def __init__(self, config: PreTrainedConfig, *, seed: int = 0,
                 probability_terms: int = 2):
        if not isinstance(config, PreTrainedConfig):
            raise TypeError(f"config must be a transformers PreTrainedConfig (model.config), "
                            f"got {type(config).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an int in [0, 2**32 - 1], got {seed!r}")
        if isinstance(probability_terms, bool) or probability_terms not in (1, 2):
            raise ValueError(f"probability_terms must be 1 or 2, got {probability_terms!r}")
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("Int8Cache holds a decoder's self-attention; this model is an "
                             "encoder-decoder, whose cross-attention cannot run on it")
        text = config.get_text_config(decoder=True)
        self.num_heads = int(getattr(text, "num_key_value_heads", None) or
                             text.num_attention_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or
                            text.hidden_size // text.num_attention_heads)
        self.block = _int8_attention.rotation_block(self.head_dim)
        windows = []
        layer_types, layer_kwargs = get_layer_types_and_kwargs(text)
        for i, (layer_type, kwargs) in enumerate(zip(layer_types, layer_kwargs)):
            if layer_type == "full_attention":
                windows.append(None)
            elif layer_type in ("sliding_attention", "chunked_attention"):
                windows.append(int(kwargs["sliding_window"]))
            else:
                raise ValueError(f"layer {i} of the model is {layer_type!r}; Int8Cache holds "
                                 f"full and sliding-window attention layers only")
        self.windows = windows
        self.config = text
        self.seed, self.probability_terms = seed, int(probability_terms)
        self.store: Optional[Int8KVCache] = None  # made at the first update: its batch
        self.cache_id = _int8_attention.register(self)
        super().__init__(layers=[Int8Layer(self, i, w) for i, w in enumerate(windows)])

    def __setstate__(self, state: dict) -> None:
        # A copy or an unpickled cache (a prefilled prompt reused, as transformers' docs
        # show with DynamicCache) holds its own store under its own id: the handles it
        # was copied with would reach the original's.
        self.__dict__.update(state)
        self.cache_id = _int8_attention.register(self)
        for layer in self.layers:
            layer.handle = torch.tensor([self.cache_id, layer.index])

    @property
    def batch(self) -> int:
        """The batch rows the store holds (0 before the first update)."""
        return 0 if self.store is None else self.store.n_kv_heads // self.num_heads

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        implementation = self.config._attn_implementation
        if implementation not in ATTENTION_NAMES.values():
            raise RuntimeError(
                f"the model's attention implementation is {implementation!r}, which cannot "
                f"read an Int8Cache: quantize the model with pyw8a8.torch.quantize or call "
                f"pyw8a8.torch.enable_int8_attention(model), and make the cache from that "
                f"model's config (Int8Cache(model.config))")
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not (
                0 <= layer_idx < len(self.layers)):
            raise ValueError(f"layer_idx {layer_idx!r}: this Int8Cache was made for a model "
                             f"of {len(self.layers)} attention layers")
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def check_states(self, key_states: Any, value_states: Any) -> None:
        """A layer's new keys and values checked (what compiled code can check: types,
        shapes, dtypes)."""
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

    def append_states(self, layer: int, key_states: torch.Tensor,
                      value_states: torch.Tensor) -> torch.Tensor:
        """kv_append: the states into the store; the receipt."""
        batch, heads, n, head_dim = key_states.shape
        if self.store is None:
            self.store = Int8KVCache(
                self.windows, batch * heads, head_dim, rotate_keys=self.block > 0,
                probability_terms=self.probability_terms,
                query_terms=1, block=self.block or None, seed=self.seed)
        elif batch != self.batch:
            raise ValueError(f"key_states has batch {batch}; the cache holds {self.batch} "
                             f"(reset it for another batch)")
        before = self.store._pages(layer).length
        k, v = (t.detach().to(torch.float32).reshape(batch * heads, n, head_dim)
                .contiguous().numpy() for t in (key_states, value_states))
        self.store._append_heads(self.store._pages(layer), k, v,
                                 ("key_states", "value_states"))
        return torch.tensor([self.cache_id, layer, before, n])

    def select_batch(self, rows: torch.Tensor) -> None:
        """Keep the batch rows `rows` (beam search's reordering, repeats, selections)."""
        if self.store is None:
            return
        rows = rows.cpu().reshape(-1)
        if rows.numel() and not (0 <= int(rows.min()) and int(rows.max()) < self.batch):
            raise ValueError(f"batch rows {rows.tolist()} out of the cache's {self.batch}")
        heads = torch.arange(self.num_heads)
        self.store._select_streams((rows[:, None] * self.num_heads + heads).reshape(-1)
                                   .numpy())

    @property
    def nbytes(self) -> int:
        """Bytes the store has allocated: int8 keys and values, packed or open, and their
        float32 scales."""
        return 0 if self.store is None else self.store.nbytes
