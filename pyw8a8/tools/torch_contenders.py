"""``bench --torch``'s model-level table: each contender in a process of its own.

A contender is a quantizer (``float``; ``torchao``, Int8DynamicActivationInt8WeightConfig:
pyw8a8's scheme without the rotation; ``pyw8a8``, :func:`pyw8a8.torch.quantize`) in a
mode: eager, ``compiled`` (Inductor's defaults) or ``max`` (freezing + max-autotune, as
torchao's users compile), static shapes.  Each runs in a fresh interpreter with a fresh
Inductor cache (a user's process holds one model; Inductor's settings are global; the
compile time is a first compile's).  They prepare one after another, then take turns
round by round, so a shift in a shared host's load reaches them alike.  Float runs
first: the others' speed is a ratio to it, their fidelity against its outputs."""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from typing import Any

from ..lab.processes import Worker, WorkerError
from ..lab.turns import take_turns
from .contenders import MODEL_CONTENDERS, MODES
from .peers import torchao_available
from .torch_model_runs import TEMPLATE_KINDS
from .torch_sharing import KEEP_FREED_MEMORY

#: The table's contenders unless --torch-contenders names others.
DEFAULT_CONTENDERS = ("float", "torchao-max", "pyw8a8", "pyw8a8-compiled", "pyw8a8-max")
MODELS = ("encoder", "lm")


def label(key: str) -> str:
    """The table's name of contender `key`: "pyw8a8 compiled (freezing + max-autotune)"."""
    quantizer, _, mode = key.partition("-")
    return f"{quantizer} {MODES['-' + mode if mode else '']}"


def comma_keys(text: str, known, what: str) -> list[str]:
    """The comma-separated keys of `text`, each once, in order; ValueError naming `what`
    where one is not in `known` or there is none."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        raise ValueError(f"unknown {what} {', '.join(unknown) or '(none)'}; expected some "
                         f"of {', '.join(known)}")
    return list(dict.fromkeys(keys))


def parse_contenders(text: str) -> list[str]:
    """--torch-contenders: comma-separated keys, in the order given, float first."""
    keys = comma_keys(text, MODEL_CONTENDERS, "contender")
    return ["float"] + [k for k in keys if k != "float"]


def parse_models(text: str) -> list[str]:
    """--torch-models: comma-separated, of MODELS, "sharing", "kvcache" and "checkpoint"."""
    return comma_keys(text, MODELS + ("sharing", "kvcache", "checkpoint"), "model")


class Contender:
    """One contender in a fresh interpreter with a fresh Inductor cache, driven a phase at a
    time (:class:`~pyw8a8.tools.torch_model_runs.ModelContender`, whose `spec` it takes).
    A failure leaves :attr:`error` (the last lines of its traceback) and stops its phases."""

    def __init__(self, spec: dict, timeout: float = 3600) -> None:
        self.error = None
        self._cache = tempfile.TemporaryDirectory(prefix="pyw8a8-inductor-")
        env = {**KEEP_FREED_MEMORY, "TORCHINDUCTOR_CACHE_DIR": self._cache.name,
               "HF_HUB_OFFLINE": "1"}
        self._worker = Worker(env=env, timeout=timeout, capture_stderr=True)
        self._phase(self._worker.open, "pyw8a8.tools.torch_model_runs:ModelContender", spec)

    def _phase(self, request, *args):
        if self.error is None:
            try:
                return request(*args)
            except WorkerError as exc:
                lines = [line for line in str(exc).splitlines() if line.strip()]
                self.error = " / ".join(lines[-3:])[-600:]
                self.close()
        return None

    def round(self) -> None:
        """One timed round."""
        self._phase(self._worker.ask, "round")

    def finish(self) -> dict:
        """The result (medians, fidelity), or {"error": why}; the process then ends."""
        result = self._phase(self._worker.ask, "finish")
        self.close()
        return {"error": self.error} if self.error is not None else result

    def close(self) -> None:
        self._worker.close()
        self._cache.cleanup()


@dataclass
class Settings:
    """The --torch options the model-level table and "kvcache" (``kv``) run with."""

    models: list
    contenders: list
    rounds: int
    texts: int = 64
    tokens: int = 24
    prompt_tokens: int = 192
    prompts: int = 3
    layers: int | None = None
    #: "kvcache"'s settings (a torch_kv_bench.KVSettings)
    kv: Any = None


def run(settings: Settings, texts: dict | None = None, progress=print) -> list[dict]:
    """Every model's contenders, one process each, float first; a row per model (and text
    set) and contender: the result, its fidelity against float and its speed ratio."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="pyw8a8-bench-torch-") as outdir:
        for model in settings.models:
            if model not in MODELS:
                continue
            spec = {"model": model, "rounds": settings.rounds, "outdir": outdir}
            if model == "encoder":
                spec["texts"] = texts
            else:
                spec.update(tokens=settings.tokens, prompt_tokens=settings.prompt_tokens,
                            prompts=settings.prompts, layers=settings.layers)
            running = {}
            for key in settings.contenders:
                if key.startswith("torchao") and not torchao_available():
                    continue  # left out, and bench --torch says so
                t0 = time.perf_counter()
                running[key] = Contender({**spec, "contender": key})
                error = running[key].error
                progress(f"bench --torch: {model}, {label(key)}: ready in "
                         f"{time.perf_counter() - t0:.0f} s"
                         + (f" (failed: {error})" if error else ""))
                if key == "float" and error:
                    break  # nothing to compare with
            take_turns({key: lambda i, c=contender: c.round()
                        for key, contender in running.items()}, settings.rounds, settle=0)
            results = {key: contender.finish() for key, contender in running.items()}
            rows += (_encoder_rows if model == "encoder" else _lm_rows)(results)
    return rows


def _encoder_rows(results: dict) -> list[dict]:
    import numpy as np
    import torch

    from .encode_timing import fidelity
    rows = []
    base = results.get("float", {})
    for name in (base.get("sets") or {}):
        reference = torch.from_numpy(np.load(base["sets"][name]["embeddings"]))
        for key, r in results.items():
            row = {"model": "encoder", "set": name, "contender": key, **_common(r)}
            if "error" not in r:
                s = r["sets"][name]
                row.update(speed=s["speed"], spread=s["spread"],
                           ratio=s["speed"] / base["sets"][name]["speed"])
                if key != "float":
                    row["fidelity"] = fidelity(torch.from_numpy(np.load(s["embeddings"])),
                                               reference)
            rows.append(row)
    if not rows:
        rows = [{"model": "encoder", "set": "", "contender": k, **_common(r)}
                for k, r in results.items()]
    return rows


def _lm_rows(results: dict) -> list[dict]:
    rows = []
    base = results.get("float", {})
    for key, r in results.items():
        row = {"model": "lm", "set": "", "contender": key, **_common(r)}
        if "error" not in r:
            row.update(speed=r["speed"], spread=r["spread"], prefill_s=r["prefill_s"],
                       split=r["split"])
            if "speed" in base:
                row["ratio"] = r["speed"] / base["speed"]
            if "kl" in r:
                row["fidelity"] = {k: r[k] for k in ("kl", "kl_max", "top1", "same_tokens")}
        rows.append(row)
    return rows


def _common(result: dict) -> dict:
    keys = ("error", "first_call_s", "warm_calls", "kernels", "load_s", "prepare_s",
            "operator")
    return {k: result[k] for k in keys if k in result}


def kernels_text(row: dict) -> str:
    """The table's "what ran" cell of a row."""
    k = row.get("kernels")
    if not k:
        return "-"
    parts = []
    if row["contender"].partition("-")[2]:
        templates = [f"{k[f'template_{kind}']} {name}" for kind, name in TEMPLATE_KINDS.items()
                     if k.get(f"template_{kind}")]
        if templates:
            parts.append("C++ GEMM template: " + ", ".join(templates))
        if k["int_mm"]:
            parts.append(f"ATen _int_mm: {k['int_mm']}")
        if k.get("onednn_qlinear"):
            parts.append(f"oneDNN qlinear: {k['onednn_qlinear']}")
        if k["pyw8a8_ops"]:
            parts.append(f"pyw8a8 ops: {k['pyw8a8_ops']}")
        if k.get("pyw8a8_attention"):
            parts.append(f"pyw8a8 attention: {k['pyw8a8_attention']}")
        parts.append(f"{k['graphs']} graphs, {k['graph_breaks']} breaks")
        parts += [f"{name}={value}" for name, value in k["counters"].items()]
    if row.get("operator"):
        parts.append(f"{row['operator']} operator")
    return "; ".join(parts) or "-"


def _seconds(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def format_table(rows: list[dict], settings: Settings, texts: dict | None) -> list[str]:
    lines = ["\nModel level: each contender in a process of its own (a fresh Inductor cache: "
             "first compiles), compiled ones with static shapes (dynamic=False); speed: "
             f"medians of {settings.rounds} rounds, the contenders taking turns round by "
             "round"]
    if any(r["model"] == "encoder" for r in rows):
        counts = ", ".join(f"{len(v)} {k}" for k, v in (texts or {}).items())
        lines.append(f"encoder: all-MiniLM-L6-v2, SentenceTransformer.encode of {counts} "
                     "(batches of 32), speed in texts/s; fidelity: mean (lowest) cosine "
                     "to float")
    if any(r["model"] == "lm" for r in rows):
        layers = ("" if settings.layers is None else
                  f", only its first {settings.layers} layers (a quick check, not the model)")
        lines.append(f"lm: Gemma 3 270M in transformers{layers}, greedy decode of "
                     f"{settings.tokens} tokens after {settings.prompts} prompt(s) of "
                     f"{settings.prompt_tokens} tokens (StaticCache), speed in decode tok/s "
                     f"(the {settings.tokens - 1} one-token steps); fidelity: KL to float "
                     "of the next-token distributions, mean (max) over the positions, every "
                     "contender fed float's tokens, and the share of positions with float's "
                     "top token")
    lines += ["| model | contender | speed (spread) | vs float | fidelity | first call s | "
              "what ran |", "|---|---|--:|--:|--:|--:|---|"]
    for r in rows:
        model = r["model"] + (f", {r['set']}" if r["set"] else "")
        if "error" in r:
            lines.append(f"| {model} | {label(r['contender'])} | - | - | - | - | "
                         f"failed: {r['error']} |")
            continue
        speed = f"{r['speed']:.1f} (±{r['spread'] * 50:.0f}%)"
        if "prefill_s" in r:
            speed += f", prefill {r['prefill_s'] * 1e3:.0f} ms"
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        f = r.get("fidelity")
        if f is None:
            fid = "reference" if r["contender"] == "float" else "-"
        elif "kl" in f:
            fid = f"KL {f['kl']:.4f} ({f['kl_max']:.3f}), top-1 {f['top1']:.3f}"
        else:
            fid = f"cosine {f['cosine']:.4f} ({f['cosine_min']:.4f})"
        lines.append(f"| {model} | {label(r['contender'])} | {speed} | {ratio} | {fid} | "
                     f"{_seconds(r['first_call_s'])} | {kernels_text(r)} |")
    lines.append("first call: the first encode of the texts or generation of the first prompt, "
                 "compilation included; what ran (compiled): Inductor's C++ GEMM templates by "
                 "micro-kernel, ATen _int_mm calls, pyw8a8's product operator calls (ops) "
                 "and attention calls in the compiled graphs, and Inductor's counters")
    split = [r for r in rows if "split" in r]
    if split:
        lines += ["\nlm: where a decoded token's time goes, ms per one-token step of one "
                  "generation under torch's profiler (slower than unprofiled): the linear "
                  "layers' products (pyw8a8's operators, ATen's _int_mm, mm or addmm), the "
                  "LM head's product, and the rest (attention, norms, activation quantizing "
                  "outside a product, Python)",
                  "| contender | step | products | LM head | rest |", "|---|--:|--:|--:|--:|"]
        lines += [f"| {label(r['contender'])} | {r['split']['total']:.2f} | "
                  f"{r['split']['products']:.2f} | {r['split']['head']:.2f} | "
                  f"{r['split']['rest']:.2f} |" for r in split]
    return lines
