"""The side-by-side speed check: every configuration timed in turn on the same few questions."""

from __future__ import annotations

import time

import numpy as np
from .. import set_num_threads
from ..models import gemma3
from .configs import build_model, parse_config
from .worker import progress

__all__ = ["SPEED_SETTLE_S", "run_speed", "speed_questions", "speed_summary"]

#: Pause before each timed forward pass of the side-by-side speed check, so thread pools
#: that spin after a call (OpenBLAS's, OpenMP's) have gone to sleep.
SPEED_SETTLE_S = 0.2


def speed_questions(n, count):
    """Indices of `count` questions spread evenly over n (all of them if count >= n)."""
    if count <= 0 or n == 0:
        return []
    return sorted({int(round(v)) for v in np.linspace(0, n - 1, min(count, n))})


def run_speed(spec: dict) -> dict:
    """Time every configuration on the same few questions in one process, interleaved.

    The per-configuration runs are serial, so on a shared machine their wall times drift
    with the neighbours' load; here each question is answered by every configuration in
    turn (the order rotating from question to question), so a slow spell slows them alike.
    Every model runs with default thread settings (numpy's BLAS as loaded, pyw8a8's thread
    policy: see ``pyw8a8.thread_policy``).
    """
    threads = spec.get("threads")
    if threads:
        set_num_threads(int(threads))
    weights = gemma3.load_weights()
    tok = gemma3.load_tokenizer()
    config = gemma3.load_config()
    models = {name: build_model(parse_config(name), weights, config)[0]
              for name in spec["configs"]}
    del weights
    prompts = [tok.encode(s["prompt"]) for s in spec["samples"]]

    def forward(name, tokens):
        models[name].forward(tokens)

    names = list(models)
    shortest = min(prompts, key=len)
    for name in names:  # packing and first-call costs stay out of the timings
        forward(name, shortest)
    times = {name: [] for name in names}
    for i, tokens in enumerate(progress(prompts, len(prompts), "side by side")):
        for name in names[i % len(names):] + names[: i % len(names)]:
            time.sleep(SPEED_SETTLE_S)
            t0 = time.perf_counter()
            forward(name, tokens)
            times[name].append(time.perf_counter() - t0)
    return {"name": "speed", "ids": [s["id"] for s in spec["samples"]],
            "n_tokens": [len(t) for t in prompts], "times_s": times}


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
