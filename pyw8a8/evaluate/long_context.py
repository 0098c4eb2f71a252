"""``eval --long-context``: prefill time, decode speed and KV-cache memory of configurations
side by side at long contexts (a float KV cache against ``+kv8``), in one process of its
own."""

from __future__ import annotations

import time

import numpy as np

from .._cpu import isa
from .._threads import get_num_threads
from ..lab.record import markdown_table
from ..lab.turns import take_turns
from .configs import build_models
from .corpus import boolq_stream
from .worker import peak_rss_mib, progress

__all__ = ["float32_kv_bytes", "render_long_context", "run_long_context"]


def float32_kv_bytes(config, length: int) -> int:
    """Bytes of a float32 KV cache of `length` positions, each sliding-window layer holding its
    window only: what ``+kv8``'s memory is measured against."""
    per_token = 2 * config.n_kv_heads * config.head_dim * 4  # a key and a value, float32
    held = sum(length if config.is_global(i) else min(length, config.sliding_window)
               for i in range(config.n_layers))
    return held * per_token


#: Prompt tokens of a configuration's timed prefills per length (1 to 3 prefills).
PREFILL_TOKENS = 8192


def prefill_runs(context: int) -> int:
    """Timed prefills per configuration at `context` tokens."""
    return max(1, min(3, PREFILL_TOKENS // context))


def run_long_context(spec: dict) -> dict:
    """Prefill and decode every configuration at each context length L (ascending): the first
    L tokens of the BoolQ passages (BOS first) prefilled into a fresh cache (`prefill_runs`
    times), then ``decode_tokens`` greedy tokens; prefills and steps take turns, the order
    rotating.  `spec`: ``configs``, ``contexts``, ``decode_tokens``.

    Returns
    -------
    dict
        ``contexts``: per length and configuration ``prefill_s`` and ``decode_s`` (each
        one's seconds), ``kv_bytes``, ``float32_kv_bytes`` and ``tokens``; ``isa``,
        ``kernel_threads``, ``corpus``, ``peak_rss_mib``."""
    names = list(spec["configs"])
    contexts = sorted(int(c) for c in spec["contexts"])
    steps = int(spec["decode_tokens"])
    models, tok, config = build_models(names)
    stream, origin = boolq_stream(tok, max(contexts) - 1)
    prompt_of = {c: np.concatenate([[tok.bos_id], stream[:c - 1]]) for c in contexts}
    for name in names:  # packing and first-call costs stay out of the timings
        list(models[name].generate(prompt_of[contexts[0]][:64], 2))
    result = {"contexts": {}}
    for context in progress(contexts, len(contexts), "long context", unit="context"):
        entry = _context_entry(models, prompt_of[context], steps)
        for e in entry.values():
            e["float32_kv_bytes"] = float32_kv_bytes(config, context + steps - 1)
        result["contexts"][str(context)] = entry
    result.update(configs=names, decode_tokens=steps, isa=isa(),
                  kernel_threads=get_num_threads(),
                  corpus=f"{origin}: the first {max(contexts) - 1} tokens of its passages",
                  peak_rss_mib=peak_rss_mib())
    return result


def _context_entry(models, prompt, steps):
    """Per configuration at one context: prefill and step seconds, tokens, the cache's bytes."""
    caches, last = {}, {}

    def prefill(name):
        def turn(i):
            caches[name] = None  # the last run's cache goes before the next is made
            caches[name] = models[name].new_cache()
            t0 = time.perf_counter()
            logits = models[name].forward(prompt, caches[name])
            seconds = time.perf_counter() - t0
            last[name] = int(np.argmax(logits))
            return seconds
        return turn

    def decode(name):
        def turn(i):
            t0 = time.perf_counter()
            logits = models[name].forward([last[name]], caches[name])
            seconds = time.perf_counter() - t0
            last[name] = int(np.argmax(logits))
            return seconds, last[name]
        return turn
    fills = take_turns({name: prefill(name) for name in models}, prefill_runs(len(prompt)),
                       settle=0, rotate=True)
    first = dict(last)
    decoded = take_turns({name: decode(name) for name in models}, steps - 1, settle=0,
                         rotate=True)
    return {name: {"prefill_s": fills[name], "decode_s": [t for t, _ in decoded[name]],
                   "tokens": [first[name]] + [token for _, token in decoded[name]],
                   "kv_bytes": int(caches[name].nbytes)} for name in models}


def render_long_context(result: dict, meta: dict) -> str:
    """The markdown report of `run_long_context`'s result."""
    names = result["configs"]
    base = names[0]
    lines = [
        "# Long context: prefill, decode and KV-cache memory",
        "",
        f"{meta['cpu']} ({meta['cpus']} CPUs), ISA `{result['isa']}`, "
        f"{result['kernel_threads']} kernel threads; {meta['date']}; "
        f"{meta['wall_time_s']:.0f} s in all.  Text: {result['corpus']}.  Each "
        f"configuration prefills the context ({PREFILL_TOKENS // 1024}k prompt tokens of "
        "prefills per length, at least one), then decodes "
        f"{result['decode_tokens'] - 1} tokens one at a time, the configurations taking "
        "turns prefill by prefill and step by step.",
        "",
    ]
    rows = []
    for context, entry in result["contexts"].items():
        ref_fill = float(np.median(entry[base]["prefill_s"]))
        ref_step = float(np.median(entry[base]["decode_s"]))
        for name in names:
            e = entry[name]
            fill, step = float(np.median(e["prefill_s"])), float(np.median(e["decode_s"]))
            rows.append([context, name, f"{fill:.2f}", f"{ref_fill / fill:.2f}x",
                         f"{1e3 * step:.1f}", f"{ref_step / step:.2f}x",
                         f"{e['kv_bytes'] / 2**20:.1f}",
                         f"{e['kv_bytes'] / e['float32_kv_bytes']:.3f}x"])
    lines += markdown_table(
        ["context", "configuration", "prefill (s, median)", f"prefill vs {base}",
         "decode (ms/token, median)", f"decode vs {base}", "KV cache (MiB)",
         "vs float32 of the same tokens"], rows, "rlrrrrrr")
    lines += [
        "",
        "*vs* columns: the first configuration's time over this one's (above 1: faster).  "
        "The float32 reference holds the same positions with each sliding-window layer "
        "keeping its window only; a float `KVCache` as allocated holds every position of "
        "every layer, with room to grow.",
        "",
    ]
    return "\n".join(lines)
