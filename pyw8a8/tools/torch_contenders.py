"""``bench --torch``'s model-level table: each contender in a process of its own.

A contender is a quantizer and a way to run the model:

* quantizers: ``float`` (the model as loaded, float32), ``torchao``
  (``torchao.quantization.quantize_`` with ``Int8DynamicActivationInt8WeightConfig()``:
  per-token int8 activations, per-channel int8 weights, the scheme of pyw8a8 without its
  rotation) and ``pyw8a8`` (:func:`pyw8a8.torch.quantize`, rotated, block 128);
* modes: eager; ``compiled``, ``model.compile(dynamic=False)`` with Inductor's defaults;
  ``max``, the same with ``torch._inductor.config.freezing = True``, ``max_autotune = True``
  and ``max_autotune_gemm_backends = "CPP,ATEN"``: the settings a PyTorch user picks for
  torchao, under which Inductor writes its int8 GEMMs as C++ templates with AMX or
  AVX-512 VNNI micro-kernels.

Compiled contenders use static shapes (``dynamic=False``): the encoder meets a shape per
batch (a few), the LM two (its prompt and one token, through a ``StaticCache``).

Each contender runs in a fresh interpreter (:class:`Contender`): a user's process holds
one model, and Inductor's settings, which are global, must not reach the next contender.
Its Inductor cache is a fresh folder, so the compile time is a first compile's, as a
user meets it (and the user's own cache is left alone).  The contenders prepare one after
another, then take turns round by round, each timing its own rounds while the others
wait: on a shared host, a shift in load then reaches every contender alike.  The process
reports:

* the first call's wall time, compilation included (for an eager contender, its first
  call: allocations and pyw8a8's tuning);
* the speed, medians of rounds after warm-up (pyw8a8's tuner settled first);
* what ran: the C++ GEMM templates Inductor wrote and the micro-kernel in each (AMX if it
  holds AMX tile instructions, VNNI if AVX-512 VNNI ones, else another), ATen ``_int_mm``
  calls, pyw8a8's product and attention operator calls in the compiled code, and
  Inductor's counters
  (``cpp_templated_kernel_counter``, ``cpp_micro_gemm_amx_counter``);
* the outputs the fidelity is computed from.

The float contender runs first: the others' speed is given as a ratio to it, and their
fidelity against its outputs (the encoder's embeddings; the LM's next-token
distributions, with every contender fed the float model's greedy tokens).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUANTIZERS = ("float", "torchao", "pyw8a8")
MODES = {"": "eager", "-compiled": "compiled", "-max": "compiled (freezing + max-autotune)"}
#: The contenders by key ("pyw8a8-max"), every quantizer in every mode.
CONTENDERS = [q + m for q in QUANTIZERS for m in MODES]
#: The table's contenders unless --torch-contenders names others.
DEFAULT_CONTENDERS = ("float", "torchao-max", "pyw8a8", "pyw8a8-compiled", "pyw8a8-max")
MODELS = ("encoder", "lm")
TORCHAO_INSTALL = 'pip install ".[torchao]" in the pyw8a8 checkout'


def label(key: str) -> str:
    """The table's name of contender `key`: "pyw8a8 compiled (freezing + max-autotune)"."""
    quantizer, _, mode = key.partition("-")
    return f"{quantizer} {MODES['-' + mode if mode else '']}"


def comma_keys(text: str, known, what: str) -> list[str]:
    """The comma-separated keys of `text`, each once, in the order given; ValueError
    naming `what` where one is not in `known` or there is none."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        raise ValueError(f"unknown {what} {', '.join(unknown) or '(none)'}; expected some "
                         f"of {', '.join(known)}")
    return list(dict.fromkeys(keys))


def parse_contenders(text: str) -> list[str]:
    """--torch-contenders: comma-separated keys, in the order given, float first."""
    return ["float"] + [k for k in comma_keys(text, CONTENDERS, "contender") if k != "float"]


def parse_models(text: str) -> list[str]:
    """--torch-models: comma-separated, of MODELS, "sharing" and "kvcache"."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = MODELS + ("sharing", "kvcache")
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown model {', '.join(unknown) or '(none)'}; expected some of "
                         f"{', '.join(known)}")
    return list(dict.fromkeys(names))


def torchao_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("torchao") is not None


# -- in the contender's process ------------------------------------------------------------

def _quantize(model, quantizer: str):
    """`model` with its linear layers quantized in place by `quantizer`."""
    if quantizer == "torchao":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
        quantize_(model, Int8DynamicActivationInt8WeightConfig())
    elif quantizer == "pyw8a8":
        import pyw8a8.torch as pt
        model = pt.quantize(model, inplace=True)
    return model


def _compile(model, mode: str):
    """`model` compiled in place for `mode` ("compiled" or "max"), static shapes."""
    if mode == "max":
        import torch._inductor.config as inductor
        inductor.freezing = True
        inductor.max_autotune = True
        inductor.max_autotune_gemm_backends = "CPP,ATEN"
    model.compile(dynamic=False)
    return model


@contextlib.contextmanager
def _compiled_code():
    """The wrapper code of every graph Inductor compiles (or loads) inside, as a list."""
    codes: list[str] = []
    try:
        from torch._inductor.graph import GraphLowering
    except ImportError:  # pragma: no cover - an Inductor without it: counters only
        yield codes
        return
    previous = GraphLowering.save_output_code

    def save(code):
        codes.append(code)
        if previous is not None:
            previous(code)
    GraphLowering.save_output_code = save
    try:
        yield codes
    finally:
        GraphLowering.save_output_code = previous


_KERNEL_SOURCE = re.compile(r"'''(.*?)'''", re.DOTALL)
#: Micro-kernels of Inductor's C++ GEMM template, as the table names them.
TEMPLATE_KINDS = {"amx": "AMX", "vnni": "AVX-512 VNNI", "ref": "reference loop",
                  "other": "other"}


def kernel_report(codes: list[str], counters=None) -> dict:
    """What the compiled graphs in `codes` (Inductor's wrapper code) run for their products:
    C++ GEMM templates by micro-kernel (a template kernel's source holds "micro_gemm"; AMX
    where it holds AMX tile products, VNNI where AVX-512 VNNI dot products, the reference
    loop where no intrinsics at all), ATen
    ``_int_mm`` and oneDNN ``qlinear_pointwise`` calls, pyw8a8's product operator calls
    (``pyw8a8_ops``) and attention calls (``pyw8a8_attention``), the graph count and graph
    breaks, and Inductor's C++ template and qlinear counters (`counters`:
    torch._dynamo's, by default)."""
    report = {"graphs": len(codes), **{f"template_{kind}": 0 for kind in TEMPLATE_KINDS},
              "int_mm": 0, "onednn_qlinear": 0, "pyw8a8_ops": 0, "pyw8a8_attention": 0}
    for code in codes:
        for source in _KERNEL_SOURCE.findall(code):
            if "micro_gemm" not in source:
                continue
            if re.search(r"_tile_dp(bu|bs)[sd]d", source):
                kind = "amx"
            elif "_mm512_dpbusd_epi32" in source:
                kind = "vnni"
            elif "_mm" not in source and "at::vec" not in source:
                kind = "ref"  # CppMicroGemmRef: a plain loop, where no ISA's kernel fits
            else:
                kind = "other"
            report[f"template_{kind}"] += 1
        outside = _KERNEL_SOURCE.sub("", code)
        report["int_mm"] += len(re.findall(r"\b(?:extern_kernels|aten)\._int_mm(?:\.default)?\(",
                                           outside))
        report["onednn_qlinear"] += len(re.findall(r"\bonednn\.qlinear_pointwise\b[\w.]*\(",
                                                   outside))
        report["pyw8a8_ops"] += len(re.findall(
            r"\btorch\.ops\.pyw8a8\.(?:linear|gated_linear)\.default\(", outside))
        report["pyw8a8_attention"] += len(re.findall(
            r"\btorch\.ops\.pyw8a8\.float_attention\.default\(", outside))
    if counters is None:
        import torch
        counters = torch._dynamo.utils.counters
    report["counters"] = {k: v for k, v in counters["inductor"].items()
                          if k.startswith(("cpp_", "qlinear_")) and v}
    report["graph_breaks"] = sum(counters["graph_break"].values())
    return report


def _settle(call) -> int:
    """Warm-up calls: pyw8a8's tuner settled (torch_sharing.settle_tuning), else one."""
    if "pyw8a8.torch" in sys.modules:
        from .torch_sharing import settle_tuning
        return settle_tuning(call)
    call()
    return 1


def _spread(values):
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


class _EncoderRun:
    """The encoder's phases in a contender's process: each text set encoded."""

    def __init__(self, spec: dict, key: str, model) -> None:
        self.spec, self.key, self.model = spec, key, model
        self.sets = spec["texts"]

    def _encode(self, texts):
        import torch
        with torch.inference_mode():
            return self.model.encode(texts, batch_size=32, convert_to_tensor=True)

    def _encode_all(self):
        return {name: self._encode(texts) for name, texts in self.sets.items()}

    def prepare(self) -> dict:
        """The first call (compilation included), the warm-up and what ran."""
        out = {}
        with _compiled_code() as codes:
            t0 = time.perf_counter()
            self.embeddings = self._encode_all()
            out["first_call_s"] = time.perf_counter() - t0
            out["warm_calls"] = _settle(self._encode_all)
        out["kernels"] = kernel_report(codes)
        return out

    def round(self) -> dict:
        """Seconds of one encode of each set."""
        times = {}
        for name, texts in self.sets.items():
            t0 = time.perf_counter()
            self._encode(texts)
            times[name] = time.perf_counter() - t0
        return times

    def finish(self, rounds: list[dict]) -> dict:
        """Medians of the rounds; the embeddings saved for the fidelity."""
        import numpy as np
        out = {"sets": {}}
        for i, (name, texts) in enumerate(self.sets.items()):
            path = Path(self.spec["outdir"]) / f"encoder-{self.key}-{i}.npy"
            np.save(path, self.embeddings[name].float().numpy())
            times = [r[name] for r in rounds]
            seconds = statistics.median(times)
            out["sets"][name] = {"seconds": seconds, "spread": _spread(times),
                                 "speed": len(texts) / seconds, "embeddings": str(path)}
        return out


class _LMRun:
    """The LM's phases in a contender's process: greedy decodes of each prompt."""

    def __init__(self, spec: dict, key: str, model, tokenizer) -> None:
        from . import torch_lm
        self.spec, self.key = spec, key
        self.prompts = torch_lm.prompts(tokenizer, spec["prompts"], spec["prompt_tokens"])
        self.decoder = torch_lm.Decoder(model, spec["prompt_tokens"] + spec["tokens"])

    def prepare(self) -> dict:
        tokens, out = self.spec["tokens"], {}
        with _compiled_code() as codes:
            t0 = time.perf_counter()
            self.decoder.generate(self.prompts[0], tokens)
            out["first_call_s"] = time.perf_counter() - t0
            turn = iter(range(1 << 30))
            out["warm_calls"] = _settle(
                lambda: self.decoder.generate(self.prompts[next(turn) % len(self.prompts)],
                                              tokens))
        out["kernels"] = kernel_report(codes)
        return out

    def round(self) -> dict:
        """Decode and prefill seconds of one generation of each prompt, its tokens."""
        runs = [self.decoder.generate(p, self.spec["tokens"]) for p in self.prompts]
        return {"decode_s": sum(r.decode_s for r in runs),
                "prefill_s": sum(r.prefill_s for r in runs),
                "tokens": [r.tokens for r in runs]}

    def finish(self, rounds: list[dict]) -> dict:
        """Medians of the rounds, the profiled split of a step, and the next-token
        distributions fed float's tokens: saved by float, scored by the others."""
        import numpy as np

        from . import torch_lm
        tokens, prompts, decoder = self.spec["tokens"], self.prompts, self.decoder
        steps = len(prompts) * (tokens - 1)
        rates = [steps / r["decode_s"] for r in rounds]
        generated = rounds[-1]["tokens"]
        out = {"speed": statistics.median(rates), "spread": _spread(rates),
               "prefill_s": statistics.median(r["prefill_s"] for r in rounds) / len(prompts),
               "tokens": generated,
               "split": torch_lm.decode_split(decoder, prompts[0], tokens)}
        reference = Path(self.spec["outdir"]) / "lm-reference.npz"
        if self.key == "float":
            runs = [decoder.generate(p, tokens, keep_logits=True) for p in prompts]
            np.savez(reference, tokens=np.array([r.tokens for r in runs]),
                     logits=np.stack([np.stack([t.numpy() for t in r.logits]) for r in runs]))
            return out
        ref = np.load(reference)
        kl, top1 = [], []
        for p, ref_tokens, ref_logits in zip(prompts, ref["tokens"], ref["logits"]):
            run = decoder.generate(p, tokens, forced=[int(t) for t in ref_tokens[:-1]],
                                   keep_logits=True)
            logits = np.stack([t.numpy() for t in run.logits])
            kl.extend(torch_lm.kl_divergence(ref_logits, logits))
            top1.extend(logits.argmax(-1) == ref_tokens)
        out.update(kl=float(np.mean(kl)), kl_max=float(np.max(kl)), top1=float(np.mean(top1)),
                   same_tokens=float(np.mean([a == list(b) for a, b in
                                              zip(generated, ref["tokens"])])))
        return out


def contender_main(spec: dict, commands=None, reply=None) -> dict:
    """One contender in this process (`spec`: see :class:`Contender`): load, quantize,
    compile, the first call and the warm-up, replying ``{"ready": ...}``; then a timed
    round for each ``round`` line of `commands` (stdin), replying its number; at
    ``finish`` (or the end of `commands`), the medians, the fidelity and the rest as the
    last reply (stdout), also returned."""
    commands = sys.stdin if commands is None else commands
    reply = reply or (lambda value: print(json.dumps(value), flush=True))
    key, model_name = spec["contender"], spec["model"]
    quantizer, _, mode = key.partition("-")
    t0 = time.perf_counter()
    if model_name == "encoder":
        from .encode_timing import load_encoder
        model, tokenizer = load_encoder(), None
    else:
        from .torch_lm import load_lm
        model, tokenizer = load_lm(spec.get("layers"))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = _quantize(model, quantizer)
    if mode:
        model = _compile(model, mode)
    out = {"load_s": load_s, "prepare_s": time.perf_counter() - t0}
    if quantizer == "pyw8a8":
        from ..torch import _native
        out["operator"] = "native" if _native.NATIVE is not None else "Python"
    run = (_EncoderRun(spec, key, model) if model_name == "encoder" else
           _LMRun(spec, key, model, tokenizer))
    out.update(run.prepare())
    reply({"ready": True})
    rounds = []
    for line in commands:
        if line.strip() == "round":
            rounds.append(run.round())
            reply({"round": len(rounds)})
        elif line.strip() == "finish":
            break
    out.update(run.finish(rounds or [run.round()]))
    reply(out)
    return out


# -- in bench's process --------------------------------------------------------------------

class Contender:
    """One contender in a fresh interpreter with a fresh Inductor cache, driven a phase at
    a time (:func:`contender_main`), so that several take turns round by round.  `spec`:
    model ("encoder" or "lm"), contender (a key of CONTENDERS), outdir (where outputs go),
    and the model's settings: texts ({name: [str]}) for the encoder; tokens,
    prompt_tokens, prompts and layers (None: all) for the LM.  A failure anywhere leaves
    :attr:`error` (the last lines of its stderr) and no further phase runs."""

    def __init__(self, spec: dict, timeout: float = 3600) -> None:
        from .torch_sharing import KEEP_FREED_MEMORY
        self.timeout, self.error = timeout, None
        self._cache = tempfile.TemporaryDirectory(prefix="pyw8a8-inductor-")
        self._stderr = tempfile.TemporaryFile(mode="w+")
        env = {**os.environ, **KEEP_FREED_MEMORY, "TORCHINDUCTOR_CACHE_DIR": self._cache.name,
               "HF_HUB_OFFLINE": "1"}
        code = ("import json, sys; from pyw8a8.tools import torch_contenders as c; "
                "c.contender_main(json.loads(sys.stdin.readline()))")
        self._process = subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr)
        self._send(json.dumps(spec))
        self._receive()  # ready

    def _send(self, line: str) -> None:
        if self.error is None:
            try:
                self._process.stdin.write(line + "\n")
                self._process.stdin.flush()
            except OSError:
                self._fail()

    def _receive(self) -> dict:
        if self.error is not None:
            return {}
        ready, _, _ = select.select([self._process.stdout], [], [], self.timeout)
        line = self._process.stdout.readline() if ready else ""
        if not line:
            self._fail(None if ready else f"no reply in {self.timeout:.0f} s")
            return {}
        return json.loads(line)

    def _fail(self, why: str | None = None) -> None:
        self._process.kill()
        self._process.wait()
        self._stderr.seek(0)
        lines = [line for line in self._stderr.read().strip().splitlines() if line.strip()]
        self.error = why or " / ".join(lines[-3:])[-600:] or \
            f"exit status {self._process.returncode}"
        self.close()

    def round(self) -> None:
        """One timed round."""
        self._send("round")
        self._receive()

    def finish(self) -> dict:
        """The result (medians, fidelity), or {"error": why}; the process then ends."""
        self._send("finish")
        result = self._receive()
        if self.error is not None:
            return {"error": self.error}
        self._process.wait()
        self.close()
        return result

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        for stream in (self._process.stdin, self._process.stdout, self._stderr):
            stream.close()
        self._cache.cleanup()


@dataclass
class Settings:
    """What --torch-models, --torch-contenders, --texts, --tokens, --prompt-tokens,
    --prompts, --lm-layers and --rounds ask of the model-level table."""

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
            # Each contender prepares alone (its first call times the compilation); then
            # the rounds take turns, so that the host's load shifts reach all contenders
            # alike; float finishes first (its outputs are the reference).
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
            for _ in range(settings.rounds):
                for contender in running.values():
                    contender.round()
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
    """The table's "what ran" cell: templates by micro-kernel, ATen _int_mm calls, pyw8a8
    product and attention operator calls, graphs and graph breaks, Inductor's counters."""
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
