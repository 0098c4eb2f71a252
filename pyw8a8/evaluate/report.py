"""The comparison of the runs: ``comparison.json``'s content and ``comparison.md``'s tables."""

from __future__ import annotations

import math

from ..metrics import compare_answers, kl_summary
from .speed import speed_summary

__all__ = ["build_comparison", "render_markdown"]


def build_comparison(results: dict, labels, meta: dict, speed=None) -> dict:
    """Assemble the comparison (pure function of the per-config results and of the
    side-by-side speed check, if it ran)."""
    control = results.get("control")
    ctrl_ok = control is not None and "error" not in control
    out = {"meta": meta, "labels": list(labels), "configs": {}}
    for name, r in results.items():
        entry = {k: r.get(k) for k in (
            "n", "correct", "accuracy", "wall_time_s", "load_time_s", "build_time_s",
            "eval_time_s", "mean_question_s", "median_question_s", "peak_rss_mib", "isa",
            "kernel_threads", "router", "router_config", "error")}
        entry = {k: v for k, v in entry.items() if v is not None}
        if "error" not in r:
            entry["choices"] = r["choices"]
            if ctrl_ok:
                entry["speedup"] = control["wall_time_s"] / r["wall_time_s"]
                entry["eval_speedup"] = control["eval_time_s"] / r["eval_time_s"]
                if name != "control":
                    entry["answers"] = compare_answers(labels, control["choices"], r["choices"])
                    if r.get("kl_full"):
                        entry["kl_full"] = kl_summary(r["kl_full"])
                        entry["kl_options"] = kl_summary(r["kl_options"])
                        entry["kl_full_values"] = r["kl_full"]
                        entry["kl_options_values"] = r["kl_options"]
        out["configs"][name] = entry
    if speed is not None:
        if "error" in speed:
            out["speed"] = {"error": speed["error"]}
        else:
            out["speed"] = {"ids": speed["ids"], "n_tokens": speed["n_tokens"],
                            "times_s": speed["times_s"], "summary": speed_summary(speed)}
    return out


def _fmt(v, spec="{:.3f}", none="-"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return spec.format(v)


def _md_cell(text, limit=None) -> str:
    """Free text as one markdown table cell: whitespace runs (newlines included) become one
    space and "|" becomes the HTML entity, so the row keeps its columns."""
    text = " ".join(str(text).split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.replace("|", "&#124;")


def render_markdown(comp: dict) -> str:
    """comparison.md text."""
    meta = comp["meta"]
    cfgs = comp["configs"]
    lines = [
        "# W8A8 evaluation: Gemma 3 270M (numpy)",
        "",
        f"- Data: {meta['data']} ({meta['n']} questions)",
        f"- Date: {meta['date']}; CPU: {meta['cpu']}; {meta['cpus']} logical CPUs; "
        f"threads: {meta['threads'] or 'default'}",
        f"- Python {meta['python']}, numpy {meta['numpy']}"
        + (f", kernel ISA {meta['isa']}" if meta.get("isa") else ""),
        "- Control: the Q4_K_M release dequantized to float32; W8A8 re-quantizes those floats.",
        "- Each configuration ran in a fresh process; wall time covers the whole process "
        "(startup, loading, lazy packing, every question). Peak RSS is the process's VmHWM, "
        "which includes resident pages of the memory-mapped float32 weight cache.",
        "",
        "## Combined result",
        "",
        "| Configuration | Accuracy | Wall time | Speedup | Time/question | Answer changes "
        "| Correctness flips | Mean KL | P95 KL | Peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in cfgs.items():
        if "error" in e:
            lines.append(f"| {_md_cell(name)} | failed: {_md_cell(e['error'], 80)} "
                         "| | | | | | | | |")
            continue
        n = e["n"]
        a = e.get("answers")
        kl = e.get("kl_full") or {}
        changes = f"{a['answer_changes']}/{n} ({100 * a['answer_changes'] / n:.2f}%)" if a else "-"
        flips = f"{a['flips']}/{n} ({100 * a['flip_rate']:.2f}%)" if a else "-"
        lines.append(
            f"| {name} | {e['correct']}/{n} ({100 * e['accuracy']:.2f}%) "
            f"| {_fmt(e.get('wall_time_s'), '{:.2f} s')} "
            f"| {_fmt(e.get('speedup'), '{:.3f}x')} "
            f"| {_fmt(e.get('mean_question_s'), '{:.3f} s')} "
            f"| {changes} | {flips} "
            f"| {_fmt(kl.get('mean'), '{:.6f}')} | {_fmt(kl.get('p95'), '{:.6f}')} "
            f"| {_fmt(e.get('peak_rss_mib'), '{:.1f} MiB')} |"
        )
    sp = comp.get("speed")
    if sp:
        lines += ["", "## Speed, side by side", ""]
        if "error" in sp:
            lines.append(f"The side-by-side check failed: {_md_cell(sp['error'], 200)}")
        else:
            lines += [
                f"{len(sp['ids'])} questions ({min(sp['n_tokens'])}-{max(sp['n_tokens'])} "
                "tokens), every configuration in one process, taking turns on each question "
                "(a pause before each pass): on a shared machine this is the speedup to "
                "quote; the serial runs' wall times above also carry the load's drift.",
                "",
                "| Configuration | Median speedup | Total-time speedup | Mean time/question |",
                "|---|---|---|---|",
            ]
            for name, e in sp["summary"].items():
                lines.append(f"| {name} | {e['median_speedup']:.3f}x | {e['total_speedup']:.3f}x "
                             f"| {e['mean_time_s']:.3f} s |")
    lines += [
        "",
        "## Flips and answer changes (vs control)",
        "",
        "| Configuration | Changes | Correct -> incorrect | Incorrect -> correct "
        "| Wrong -> wrong | Flips | Net correct | Top-1 agreement |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in cfgs.items():
        a = e.get("answers")
        if not a:
            continue
        lines.append(
            f"| {name} | {a['answer_changes']} | {a['correct_to_incorrect']} "
            f"| {a['incorrect_to_correct']} | {a['wrong_to_wrong_changes']} | {a['flips']} "
            f"| {a['net_correct']:+d} | {100 * a['top1_agreement']:.2f}% |"
        )
    lines += [
        "",
        "## KL(control || target) at the answer position, nats",
        "",
        "| Configuration | Full mean | Full median | Full p95 | Full max "
        "| Options mean | Options median | Options p95 | Options max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in cfgs.items():
        f, o = e.get("kl_full"), e.get("kl_options")
        if not f:
            continue
        lines.append(
            f"| {name} | {f['mean']:.6f} | {f['median']:.6f} | {f['p95']:.6f} | {f['max']:.6f} "
            f"| {o['mean']:.6f} | {o['median']:.6f} | {o['p95']:.6f} | {o['max']:.6f} |"
        )
    lines += [
        "",
        "## Timing details",
        "",
        "| Configuration | Load | Build | Packing | Questions | Eval speedup | Packed bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in cfgs.items():
        if "error" in e:
            continue
        rt = e.get("router") or {}
        lines.append(
            f"| {name} | {_fmt(e.get('load_time_s'), '{:.2f} s')} "
            f"| {_fmt(e.get('build_time_s'), '{:.2f} s')} "
            f"| {_fmt(rt.get('pack_time_s'), '{:.2f} s')} "
            f"| {_fmt(e.get('eval_time_s'), '{:.2f} s')} "
            f"| {_fmt(e.get('eval_speedup'), '{:.3f}x')} "
            f"| {_fmt(rt.get('packed_bytes'), '{:,}')} |"
        )
    lines += [
        "",
        "Definitions: *answer change*: the chosen option differs from the control's (including "
        "wrong -> other wrong). *Correctness flip* (Dutta et al. 2024): correct -> incorrect or "
        "incorrect -> correct. *KL*: KL(control || target) of the next-token distribution at the "
        "answer position, over the full vocabulary and over the softmax restricted to the four "
        "option tokens. *Packing* is included in the questions' time (it happens lazily on the "
        "first question).",
        "",
    ]
    return "\n".join(lines)
