"""``bench --torch``'s model-level table as markdown: speed, ratio to float, fidelity,
first call and what ran, and where a decoded token's time goes."""
from __future__ import annotations

from .torch_contenders import Settings, label
from .torch_model_runs import TEMPLATE_KINDS


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
