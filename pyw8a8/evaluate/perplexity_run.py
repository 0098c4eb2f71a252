"""The perplexity run: every configuration scores the same windows of one context length,
in one process, against the control's distributions."""

from __future__ import annotations

import time

import numpy as np

from .._cpu import isa
from .._threads import get_num_threads
from .configs import build_models
from .corpus import boolq_stream, windows
from .perplexity import ControlDistribution, WindowScores
from .worker import peak_rss_mib, progress

__all__ = ["LOGITS_CHUNK", "run_perplexity"]

#: Positions whose logits are held at once: 128 MiB of float32 logits, 256 MiB float64.
LOGITS_CHUNK = 128


def _score_window(models, window, scores, forward_s):
    """Every configuration's scores of one window added to `scores`, a chunk at a time against
    the control's (the first model's); forward seconds to `forward_s`; the scoring's
    seconds returned."""
    caches = {name: model.new_cache() for name, model in models.items()}
    score_s, context = 0.0, len(window)
    for s in range(0, context - 1, LOGITS_CHUNK):
        # positions s .. e-1 predict tokens s+1 .. e (the last one only predicted)
        e = min(s + LOGITS_CHUNK, context - 1)
        control = None
        for name, model in models.items():
            f0 = time.perf_counter()
            logits = model.forward(window[s:e], caches[name], np.arange(e - s))
            f1 = time.perf_counter()
            if control is None:
                control = ControlDistribution(logits, window[s + 1 : e + 1])
                scores[name].add(control.nll, np.zeros(e - s), np.ones(e - s, bool))
            else:
                scores[name].add(*control.score(logits))
            forward_s[name] += f1 - f0
            score_s += time.perf_counter() - f1
            del logits
    for name in models:
        scores[name].end_window()
    return score_s


def run_perplexity(spec: dict) -> dict:
    """Score every configuration on the windows of one context length, a chunk of positions
    at a time: the control's forward pass gives the distributions, each other's is scored
    against them (``forward_s``: the logits alone, not the scoring).

    Parameters
    ----------
    spec : dict
        ``configs`` (the control first), ``context`` (BOS included), ``tokens`` (of the
        stream).

    Returns
    -------
    dict
        ``context``, ``windows``, ``positions_per_window``, ``corpus``; per configuration
        (``configs``) its `WindowScores.as_dict` and ``forward_s``; ``score_s``,
        ``load_time_s``, ``peak_rss_mib``."""
    t0 = time.perf_counter()
    names = list(spec["configs"])
    if names[0] != "control":
        raise ValueError(f"the control must come first, got {names}")
    context = int(spec["context"])
    models, tok, _ = build_models(names)
    stream, origin = boolq_stream(tok, int(spec["tokens"]))
    wins = windows(stream, context, tok.bos_id)
    t_loaded = time.perf_counter()

    scores = {name: WindowScores() for name in names}
    forward_s = dict.fromkeys(names, 0.0)
    score_s = 0.0
    for window in progress(wins, len(wins), f"context {context}", unit="window"):
        score_s += _score_window(models, window, scores, forward_s)
    t_done = time.perf_counter()
    return {"name": spec["name"], "isa": isa(), "kernel_threads": get_num_threads(),
            "context": context, "windows": int(len(wins)), "positions_per_window": context - 1,
            "corpus": f"{origin}: {stream.size} tokens of its passages",
            "configs": {name: dict(scores[name].as_dict(), forward_s=forward_s[name])
                        for name in names},
            "score_s": score_s, "load_time_s": t_loaded - t0,
            "eval_time_s": t_done - t_loaded, "peak_rss_mib": peak_rss_mib()}
