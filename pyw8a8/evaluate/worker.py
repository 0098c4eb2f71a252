"""The per-configuration run: one configuration answers every question, in its own process."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from .._cpu import isa
from .._threads import get_num_threads
from ..models import gemma3
from .configs import build_model, kv_cache_kind, parse_config
from .metrics import kl_divergence, option_kl

__all__ = ["partial_logits_path", "peak_rss_mib", "progress", "run_config"]


def peak_rss_mib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0
    except (ImportError, OSError):  # pragma: no cover
        return None


def progress(iterable, total, desc, unit="q"):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def partial_logits_path(control_path):
    """Where the control writes its logits until it is done (the others read only complete
    ones, at `control_path`)."""
    return control_path.with_name(control_path.name + ".partial.npy")


def _control_logits(control_path, is_control, shape):
    """(store, control): the control's memory map to write its logits in, or the control's
    logits to compare with (None if absent or of another shape: then no KL)."""
    if is_control:
        store = np.lib.format.open_memmap(partial_logits_path(control_path), mode="w+",
                                          dtype=np.float32, shape=shape)
        return store, None
    if control_path.exists():
        control = np.load(control_path, mmap_mode="r")
        if control.shape == shape:
            return None, control
    return None, None


def _answer_questions(model, tok, samples, desc, control_path, is_control, vocab):
    """Each question's choice, option logits, token count, forward time and, where the
    control's logits are there, KL; the control writes its own logits for the others."""
    n = len(samples)
    store, control = _control_logits(control_path, is_control, (n, vocab))
    option_sets = {}
    choices, opt_logits, ntok, times = [], [], [], []
    kl_full, kl_opt = [], []
    for i, s in enumerate(progress(samples, n, desc)):
        key = tuple(s["options"])
        if key not in option_sets:
            option_sets[key] = [tok.token_id(o) for o in key]
        ids = option_sets[key]
        tokens = tok.encode(s["prompt"])
        q0 = time.perf_counter()
        logits = model.forward(tokens)
        times.append(time.perf_counter() - q0)
        ntok.append(len(tokens))
        ol = logits[ids].astype(np.float64)
        choices.append(int(np.argmax(ol)))
        opt_logits.append([float(v) for v in ol])
        if store is not None:
            store[i] = logits
        if control is not None:
            ref = np.asarray(control[i])
            kl_full.append(float(kl_divergence(ref, logits)))
            kl_opt.append(float(option_kl(ref, logits, ids)))
    if store is not None:
        store.flush()
        del store
        # only complete control logits are used
        os.replace(partial_logits_path(control_path), control_path)
    return {"choices": choices, "option_logits": opt_logits, "n_tokens": ntok,
            "question_times_s": times, "kl_full": kl_full if control is not None else None,
            "kl_options": kl_opt if control is not None else None}


def run_config(spec: dict) -> dict:
    """One configuration's answers, KL against the control's logits, times and peak RSS, as
    ``runs/<name>.json`` keeps them; `spec`: ``name``, ``samples``, ``control_logits`` (the
    file the control writes and the others read)."""
    t0 = time.perf_counter()
    name = spec["name"]
    result = {"name": name, "isa": isa(), "kernel_threads": get_num_threads()}

    weights = gemma3.load_weights()
    tok = gemma3.load_tokenizer()
    config = gemma3.load_config()
    t_loaded = time.perf_counter()

    rcfg = parse_config(name)
    result["kv_cache"] = kv_cache = kv_cache_kind(name)
    model, router = build_model(rcfg, weights, config, kv_cache)
    if router is not None:
        result["router_config"] = {k: v for k, v in vars(rcfg).items()}
    del weights  # the model keeps what it needs
    t_built = time.perf_counter()

    samples = spec["samples"]
    answers = _answer_questions(model, tok, samples, name, Path(spec["control_logits"]),
                                rcfg is None, config.vocab_size)
    t_done = time.perf_counter()

    n = len(samples)
    correct = int(sum(int(c == s["label"]) for c, s in zip(answers["choices"], samples)))
    times = answers["question_times_s"]
    result.update({"n": n, "correct": correct, "accuracy": correct / n, **answers})
    result.update(load_time_s=t_loaded - t0, build_time_s=t_built - t_loaded,
                  eval_time_s=t_done - t_built, worker_time_s=t_done - t0,
                  mean_question_s=float(np.mean(times)),
                  median_question_s=float(np.median(times)), peak_rss_mib=peak_rss_mib())
    if router is not None:
        result["router"] = router.stats()
    return result
