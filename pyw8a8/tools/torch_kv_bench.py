"""``bench --torch --torch-models kvcache``: :class:`pyw8a8.torch.Int8Cache` (P.V with P
as two int8 rows, or one: ``probability_terms=1``) against transformers' default cache
on models quantized by :func:`pyw8a8.torch.quantize`, eager and compiled (torch.compile's
defaults, Int8Cache), in one process.

* ``llama``: a Llama-shaped model of random weights (LLAMA_SHAPE), 8 layers, 8,192 tokens
  of context; the targets: Int8Cache prefills at least as fast, decodes at least 2x as
  fast, and compiled at least 0.95x as fast as eager, with the same greedy tokens.
* ``gemma``: Gemma 3 270M on 4,096 tokens of MMLU questions; the targets: Int8Cache adds
  at most 0.002 KL at the next token, decodes no slower and allocates at most 0.27x the
  default cache's bytes.

Each cache is filled by one prefill (timed once), then they decode in turns, each round
``--kv-tokens`` steps per cache, all fed the default cache's greedy tokens, so their
next-token distributions compare: KL(default || Int8Cache), and each cache's KL to the
float model shows the floor that quantizing the model alone sets.  The bytes are each
cache's own after the prefill (Int8Cache's ``nbytes``, room to grow included)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from ..lab.turns import spread, take_turns
from . import torch_contenders

MODELS = ("llama", "gemma")
DEFAULT_CONTEXT = {"llama": 8192, "gemma": 4096}
DEFAULT_LAYERS = {"llama": 8, "gemma": None}
LLAMA_SHAPE = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                   head_dim=64, intermediate_size=2816, vocab_size=32000)
#: The caches by row name: (Int8Cache's `probability_terms`, or None for the default
#: cache; whether the model runs under torch.compile, its default settings).
CACHES = {"default": (None, False), "Int8Cache": (2, False),
          "Int8Cache terms=1": (1, False), "Int8Cache compiled": (2, True)}


@dataclass
class KVSettings:
    """What --kv-models, --kv-context, --kv-tokens, --kv-layers and --rounds ask."""

    models: list = field(default_factory=lambda: list(MODELS))
    context: int | None = None
    tokens: int = 32
    layers: int | None = None
    rounds: int = 5


def parse_models(text: str) -> list[str]:
    """--kv-models: comma-separated, of MODELS."""
    return torch_contenders.comma_keys(text, MODELS, "model")


def llama(layers: int, max_positions: int):
    """The Llama-shaped model with random weights (seed 0), float32, SDPA attention."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=max_positions,
                         attn_implementation="sdpa", **LLAMA_SHAPE)
    return LlamaForCausalLM(config).eval()


def _model_and_prompt(name: str, settings: KVSettings):
    """The float model and a prompt of the context's length (token ids)."""
    import torch
    context = settings.context or DEFAULT_CONTEXT[name]
    layers = settings.layers or DEFAULT_LAYERS[name]
    if name == "llama":
        model = llama(layers, context + settings.tokens * (settings.rounds + 1) + 1)
        generator = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, LLAMA_SHAPE["vocab_size"], (context,),
                               generator=generator).tolist()
        return model, prompt
    from . import torch_lm
    model, tokenizer = torch_lm.load_lm(layers)
    return model, torch_lm.prompts(tokenizer, 1, context)[0]


def _cache(kind: str, model):
    import transformers

    import pyw8a8.torch as pt
    if CACHES[kind][0] is None:
        return transformers.DynamicCache(config=model.config)
    return pt.Int8Cache(model.config, probability_terms=CACHES[kind][0])


def cache_bytes(cache) -> int:
    """The bytes a cache holds: Int8Cache's ``nbytes``, a DynamicCache's keys and values."""
    if hasattr(cache, "nbytes"):
        return cache.nbytes
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
               if layer.keys is not None)


def measure(model, prompt: list[int], tokens: int, rounds: int):
    """Every cache of CACHES on `model` (quantized): per cache its prefill seconds, decode
    tok/s (median of the rounds), spread and bytes; per cache its next-token logits, float32
    (1 + rounds * tokens, vocabulary); the tokens fed."""
    import torch
    compiled = torch.compile(model)

    def step(cache, ids, kind="default"):
        run = compiled if CACHES[kind][1] else model
        return run(input_ids=torch.tensor([ids]), cache=cache, use_cache=True,
                   logits_to_keep=1).logits[0, -1]

    results = {kind: {} for kind in CACHES}
    logits = {kind: [] for kind in CACHES}
    caches = {}

    def decode(kind):
        def turn(i):  # the default cache's steps give the tokens every cache is fed
            t0 = time.perf_counter()
            for j in range(tokens):
                out = step(caches[kind], [fed[i * tokens + j]], kind)
                logits[kind].append(out)
                if kind == "default":
                    fed.append(int(out.argmax()))
            return time.perf_counter() - t0
        return turn
    with torch.inference_mode():
        for kind in CACHES:
            if CACHES[kind][1]:  # compiled: a prefill and a step first, untimed
                warm = _cache(kind, model)
                for ids in (prompt[:max(1, min(64, len(prompt) - 2))], prompt[-2:-1],
                            prompt[-1:]):
                    step(warm, ids, kind)
            caches[kind] = _cache(kind, model)
            t0 = time.perf_counter()
            logits[kind].append(step(caches[kind], prompt, kind))
            results[kind]["prefill_s"] = time.perf_counter() - t0
            results[kind]["bytes"] = cache_bytes(caches[kind])
        fed = [int(logits["default"][0].argmax())]
        times = take_turns({kind: decode(kind) for kind in CACHES}, rounds, settle=0)
    for kind in CACHES:
        results[kind].update(tok_s=tokens / statistics.median(times[kind]),
                             spread=spread(times[kind]))
    return results, {k: torch.stack(v).numpy() for k, v in logits.items()}, fed


def float_logits(model, prompt: list[int], fed: list[int]):
    """The float model's next-token logits at the positions `measure` kept (one forward pass)."""
    import torch
    ids = prompt + fed[:-1]
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False,
                     logits_to_keep=len(fed)).logits[0].numpy()


def fidelity(logits: dict, reference) -> dict:
    """Per cache: its mean KL to the float `reference` ("kl_float"), and for an Int8Cache
    KL(default || it) at the first position, mean and max."""
    import numpy as np

    from .torch_lm import kl_divergence
    out = {}
    for kind in CACHES:
        out[kind] = {"kl_float": float(np.mean(kl_divergence(reference, logits[kind])))}
        if kind != "default":
            kl = kl_divergence(logits["default"], logits[kind])
            out[kind].update(kl_next=float(kl[0]), kl_mean=float(np.mean(kl)),
                             kl_max=float(np.max(kl)))
        if CACHES[kind][1]:  # compiled: its greedy tokens against the eager Int8Cache's
            same = logits[kind].argmax(-1) == logits["Int8Cache"].argmax(-1)
            out[kind].update(same_tokens=int(same.sum()), positions=int(same.size))
    return out


def run(settings: KVSettings, progress=print) -> list[dict]:
    """A row per model and cache: the settings it ran at and `measure`'s figures."""
    import pyw8a8.torch as pt
    rows = []
    for name in settings.models:
        t0 = time.perf_counter()
        model, prompt = _model_and_prompt(name, settings)
        quantized = pt.quantize(model)
        results, logits, fed = measure(quantized, prompt, settings.tokens, settings.rounds)
        del quantized
        kl = fidelity(logits, float_logits(model, prompt, fed))
        for kind in CACHES:
            rows.append({"model": name, "context": len(prompt),
                         "layers": model.config.num_hidden_layers, "cache": kind,
                         **results[kind], **kl[kind]})
        progress(f"bench --torch: kvcache, {name}: {time.perf_counter() - t0:.0f} s")
    return rows


def format_table(rows: list[dict], settings: KVSettings) -> list[str]:
    lines = [f"\nKV cache: Int8Cache against transformers' default (DynamicCache, float32), "
             f"both on the model quantized by pyw8a8.torch.quantize; decode: "
             f"{settings.tokens} one-token steps a round, the caches taking turns, "
             f"{settings.rounds} rounds (median), both fed the default cache's greedy "
             f"tokens; KL(default || Int8Cache) of the next-token distributions, and each "
             f"cache's mean KL to the float model (unquantized) over the same positions",
             "llama: random weights, hidden 1024, 16 query heads, 8 KV heads of 64; gemma: "
             "Gemma 3 270M on MMLU questions; Int8Cache: P as two int8 rows (its default); "
             "Int8Cache terms=1: Int8Cache(probability_terms=1), P as one int8 row; Int8Cache "
             "compiled: the model under torch.compile (defaults), compiled on a short prompt "
             "first",
             "| model | layers | context | cache | prefill s | decode tok/s (spread) | vs "
             "default | prefill vs default | cache MiB | KL next token | KL mean (max) | KL "
             "to float |",
             "|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    base = {r["model"]: r for r in rows if r["cache"] == "default"}
    for r in rows:
        kl = (f"{r['kl_next']:.5f} | {r['kl_mean']:.5f} ({r['kl_max']:.5f})"
              if "kl_next" in r else "reference | reference")
        lines.append(f"| {r['model']} | {r['layers']} | {r['context']} | {r['cache']} | "
                     f"{r['prefill_s']:.2f} | {r['tok_s']:.1f} (±{r['spread'] * 50:.0f}%) | "
                     f"{r['tok_s'] / base[r['model']]['tok_s']:.2f}x | "
                     f"{base[r['model']]['prefill_s'] / r['prefill_s']:.2f}x | "
                     f"{r['bytes'] / 2**20:.3g} | "
                     f"{kl} | {r['kl_float']:.5f} |")
    for r in rows:
        if "same_tokens" in r:
            lines.append(f"{r['model']}: compiled, the eager Int8Cache's greedy token at "
                         f"{r['same_tokens']} of {r['positions']} positions")
    return lines


def main(settings: KVSettings, progress=print) -> int:
    """The table; status 1 (with the reason printed) where a package or the questions
    are missing."""
    from ..evaluate import QuestionsUnavailable
    try:
        import transformers  # noqa: F401
        if "gemma" in settings.models:
            from .torch_lm import _imports
            _imports()
        rows = run(settings, progress)
    except (ImportError, QuestionsUnavailable) as exc:
        print(f"bench --torch kvcache: {exc}")
        return 1
    for line in format_table(rows, settings):
        print(line)
    return 0
