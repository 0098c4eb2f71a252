"""``bench --torch``'s model-level contender in its own process (the session that
:class:`~pyw8a8.tools.torch_contenders.Contender` drives): the model loaded, quantized
and compiled, its first call and warm-up, its timed rounds, then its medians, what ran
and the outputs its fidelity is computed from."""
from __future__ import annotations

import contextlib
import re
import statistics
import sys
import time
from pathlib import Path

from ..lab.turns import spread
from .contenders import build_contender


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
    C++ GEMM templates by micro-kernel (TEMPLATE_KINDS), ATen ``_int_mm`` and oneDNN
    ``qlinear_pointwise`` calls, pyw8a8's product and attention operator calls, graphs,
    graph breaks and Inductor's C++ and qlinear `counters` (torch._dynamo's by default)."""
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


def _prepare(first, again) -> dict:
    """The first call's seconds (`first()`: compilation included), the warm-up's calls
    (`again()` until pyw8a8's tuner settles, else once) and what ran."""
    out = {}
    with _compiled_code() as codes:
        t0 = time.perf_counter()
        first()
        out["first_call_s"] = time.perf_counter() - t0
        if "pyw8a8.torch" in sys.modules:
            from .torch_sharing import settle_tuning
            out["warm_calls"] = settle_tuning(again)
        else:
            again()
            out["warm_calls"] = 1
    out["kernels"] = kernel_report(codes)
    return out


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
        def first():
            self.embeddings = self._encode_all()
        return _prepare(first, self._encode_all)

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
            out["sets"][name] = {"seconds": seconds, "spread": spread(times),
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
        tokens, turn = self.spec["tokens"], iter(range(1 << 30))
        return _prepare(lambda: self.decoder.generate(self.prompts[0], tokens),
                        lambda: self.decoder.generate(
                            self.prompts[next(turn) % len(self.prompts)], tokens))

    def round(self) -> dict:
        """Decode and prefill seconds of one generation of each prompt, its tokens."""
        runs = [self.decoder.generate(p, self.spec["tokens"]) for p in self.prompts]
        return {"decode_s": sum(r.decode_s for r in runs),
                "prefill_s": sum(r.prefill_s for r in runs),
                "tokens": [r.tokens for r in runs]}

    def finish(self, rounds: list[dict]) -> dict:
        """Medians of the rounds, the profiled split of a step, and the KL to float's next-token
        distributions, fed float's tokens (float saves them)."""
        import numpy as np

        from . import torch_lm
        tokens, prompts, decoder = self.spec["tokens"], self.prompts, self.decoder
        steps = len(prompts) * (tokens - 1)
        rates = [steps / r["decode_s"] for r in rounds]
        generated = rounds[-1]["tokens"]
        out = {"speed": statistics.median(rates), "spread": spread(rates),
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



class ModelContender:
    """One contender in this process, `spec`: model ("encoder" or "lm"), contender (a key of
    MODEL_CONTENDERS), outdir (where outputs go), rounds, and texts ({name: [str]}) for the
    encoder, tokens, prompt_tokens, prompts and layers for the LM.  Built, first called and
    warmed up here; then a timed round per :meth:`round`, and :meth:`finish`'s result."""

    def __init__(self, spec: dict) -> None:
        key, model_name = spec["contender"], spec["model"]
        t0 = time.perf_counter()
        if model_name == "encoder":
            from .encode_timing import load_encoder
            model, tokenizer = load_encoder(), None
        else:
            from .torch_lm import load_lm
            model, tokenizer = load_lm(spec.get("layers"))
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = build_contender("torch model", key, model)
        self.out = {"load_s": load_s, "prepare_s": time.perf_counter() - t0}
        self.run = (_EncoderRun(spec, key, model) if model_name == "encoder" else
                    _LMRun(spec, key, model, tokenizer))
        self.out.update(self.run.prepare())
        self.rounds = []

    def round(self) -> None:
        """One timed round."""
        self.rounds.append(self.run.round())

    def finish(self) -> dict:
        """The medians of the rounds (of one more, where none ran), the fidelity and the rest."""
        self.out.update(self.run.finish(self.rounds or [self.run.round()]))
        return self.out
