"""The side-by-side speed check, every configuration's model built once in one process and
timed in turn: a prefill of each chosen question, and greedy decodes (a prefill, then
one-token forward passes through the KV cache), each pass's time inside the linear
layers recorded too (`~pyw8a8.evaluate.timing.LinearTimer`)."""

from __future__ import annotations

import time

import numpy as np

from ..lab import turns
from ..models import gemma3
from ..router import Int8Linear
from .configs import kv_cache_kind, linear_factory, parse_config
from .timing import LinearTimer

__all__ = ["decode_summary", "run_speed", "speed_questions", "speed_summary", "time_split"]


def speed_questions(n, count):
    """Indices of `count` questions spread evenly over n (all of them if count >= n)."""
    if count <= 0 or n == 0:
        return []
    return sorted({int(round(v)) for v in np.linspace(0, n - 1, min(count, n))})


def _routing(router):
    """How a model's weight matrices are routed: counts, and the output layer's kind."""
    if router is None:
        return {"w8a8_layers": 0, "output": "float"}
    stats = router.stats()
    output = router.layers.get(gemma3.OUTPUT_NAME)
    return {"w8a8_layers": stats["w8a8_layers"], "float_layers": stats["float_layers"],
            "output": "w8a8" if isinstance(output, Int8Linear) else "float"}


def run_speed(spec: dict) -> dict:
    """Time every configuration on the same questions and prompts in one process, each in turn
    (:func:`~pyw8a8.lab.turns.take_turns`, the order rotating) so a slow spell of a shared
    machine slows them alike, with default thread settings.

    Parameters
    ----------
    spec : dict
        ``configs``, ``samples`` (prefill questions), ``decode_samples`` (decode prompts),
        ``decode_tokens`` (>= 2).

    Returns
    -------
    dict
        ``routing`` per configuration; ``ids``, ``n_tokens``, ``times_s`` and ``linear_s``
        of the prefills; ``decode`` (`_decode_check`)."""
    weights, config, tok = gemma3.load_weights(), gemma3.load_config(), gemma3.load_tokenizer()
    models, timers, routers = {}, {}, {}
    for name in spec["configs"]:
        factory, routers[name] = linear_factory(parse_config(name))
        timers[name] = LinearTimer(factory)
        models[name] = gemma3.Gemma3(weights, config=config, linear=timers[name],
                                     kv_cache=kv_cache_kind(name))
    del weights
    prompts = [tok.encode(s["prompt"]) for s in spec["samples"]]
    decode_prompts = [tok.encode(s["prompt"]) for s in spec.get("decode_samples", [])]
    # packing, first calls and the tuner's settling stay out of the timings
    shortest = min(prompts + decode_prompts, key=len)
    for model in models.values():
        list(model.generate(shortest, 2))
    result = {"name": "speed", "routing": {n: _routing(r) for n, r in routers.items()}}
    if prompts:
        runs = turns.take_turns({name: _prefill(models[name], timers[name], prompts)
                                 for name in models}, len(prompts), turns.SETTLE_SECONDS,
                                rotate=True)
        result.update({"ids": [s["id"] for s in spec["samples"]],
                       "n_tokens": [len(t) for t in prompts],
                       "times_s": {n: [t for t, _ in r] for n, r in runs.items()},
                       "linear_s": {n: [lin for _, lin in r] for n, r in runs.items()}})
    if decode_prompts:
        result["decode"] = _decode_check(models, timers, decode_prompts,
                                         int(spec["decode_tokens"]))
        result["decode"]["ids"] = [s["id"] for s in spec["decode_samples"]]
    return result


def _prefill(model, timer, prompts):
    """A prefill turn: (seconds, seconds inside the linear layers) of the i-th prompt."""
    def turn(i):
        timer.reset()
        t0 = time.perf_counter()
        model.forward(prompts[i])
        return time.perf_counter() - t0, timer.seconds()
    return turn


def _decode(model, timer, prompts, new_tokens):
    """A decode turn: the i-th prompt's generation, its prefill and one-token steps."""
    def turn(i):
        timer.reset()
        steps = model.generate(prompts[i], new_tokens)
        t0 = time.perf_counter()
        first = next(steps)
        t1 = time.perf_counter()
        prefill_linear = timer.seconds()
        timer.reset()
        rest = list(steps)
        t2 = time.perf_counter()
        return {"prefill_s": t1 - t0, "prefill_linear_s": prefill_linear,
                "decode_s": t2 - t1, "decode_linear_s": timer.seconds(),
                "decode_output_s": timer.output_seconds(), "tokens": [first] + rest}
    return turn


def _decode_check(models, timers, prompts, new_tokens):
    """Greedy generation of `new_tokens` after each prompt, every model in turn: per
    configuration and prompt, ``prefill_s`` and ``prefill_linear_s`` (to the first token),
    ``decode_s``, ``decode_linear_s``, ``decode_output_s`` and ``tokens``."""
    runs = turns.take_turns({name: _decode(models[name], timers[name], prompts, new_tokens)
                             for name in models}, len(prompts),
                            turns.SETTLE_SECONDS, rotate=True)
    per = {name: {key: [run[key] for run in r] for key in r[0]} for name, r in runs.items()}
    return {"new_tokens": new_tokens, "n_tokens": [len(t) for t in prompts], "runs": per}


def speed_summary(speed: dict) -> dict:
    """Per configuration: the median over questions of control time / configuration time,
    and the ratio of the summed times (both 1.0 for the control)."""
    times = speed["times_s"]
    control = np.asarray(times["control"], dtype=np.float64)
    out = {}
    for name, t in times.items():
        t = np.asarray(t, dtype=np.float64)
        out[name] = {"median_speedup": float(np.median(control / t)),
                     "total_speedup": float(control.sum() / t.sum()),
                     "mean_time_s": float(t.mean())}
    return out


def _common_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def decode_summary(decode: dict) -> dict:
    """Per configuration: prefill and decode tokens per second (summed tokens over summed
    times), their ratio to the control's, and how many of its greedy tokens equal the
    control's (the common prefix of each prompt's generation, summed)."""
    runs = decode["runs"]
    prompt_tokens = float(sum(decode["n_tokens"]))
    steps = float((decode["new_tokens"] - 1) * len(decode["n_tokens"]))
    control = runs["control"]
    out = {}
    for name, r in runs.items():
        prefill = prompt_tokens / float(np.sum(r["prefill_s"]))
        dec = steps / float(np.sum(r["decode_s"]))
        out[name] = {"prefill_tokens_per_s": prefill, "decode_tokens_per_s": dec,
                     "same_tokens": sum(_common_prefix(a, b) for a, b in
                                        zip(r["tokens"], control["tokens"])),
                     "generated_tokens": sum(len(t) for t in r["tokens"])}
    for e in out.values():
        e["prefill_speedup"] = e["prefill_tokens_per_s"] / out["control"]["prefill_tokens_per_s"]
        e["decode_speedup"] = e["decode_tokens_per_s"] / out["control"]["decode_tokens_per_s"]
    return out


def time_split(totals, linear, count, output=None) -> dict:
    """Mean time per forward pass (or token) inside the linear layers and the rest: `totals`
    and `linear` (and the output layer's part, `output`) per measurement, summed over
    `count` passes or tokens.

    Returns
    -------
    dict
        ``total_s``, ``linear_s``, ``rest_s``, ``linear_share`` and, with `output`,
        ``output_s``."""
    total = float(np.sum(totals)) / count
    lin = float(np.sum(linear)) / count
    out = {"total_s": total, "linear_s": lin, "rest_s": total - lin,
           "linear_share": lin / total}
    if output is not None:
        out["output_s"] = float(np.sum(output)) / count
    return out
