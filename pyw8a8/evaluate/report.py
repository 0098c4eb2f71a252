"""The comparison of the runs: ``comparison.json``'s content and ``comparison.md``'s tables."""

from __future__ import annotations

import math

from .bootstrap import RESAMPLES, SEED
from .configs import NOISE_FLOOR
from .metrics import answer_intervals, compare_answers, kl_summary
from .speed import decode_summary, speed_summary, time_split

__all__ = ["build_comparison", "render_markdown"]


def build_comparison(results: dict, labels, meta: dict, speed=None) -> dict:
    """The comparison of the configurations' results and of the speed check, if it ran."""
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
                entry["intervals"] = answer_intervals(labels, control["choices"], r["choices"])
                if name != "control":
                    entry["answers"] = compare_answers(labels, control["choices"], r["choices"])
                    if r.get("kl_full"):
                        entry["kl_full"] = kl_summary(r["kl_full"])
                        entry["kl_options"] = kl_summary(r["kl_options"])
                        entry["kl_full_values"] = r["kl_full"]
                        entry["kl_options_values"] = r["kl_options"]
        out["configs"][name] = entry
    floor = out["configs"].get(NOISE_FLOOR)
    if floor is not None and "answers" in floor:
        changed_by_floor = {i for i, (c, f) in enumerate(zip(control["choices"], floor["choices"]))
                            if c != f}
        for name, entry in out["configs"].items():
            if "answers" in entry:
                entry["changes_shared_with_noise_floor"] = sum(
                    1 for i, (c, t) in enumerate(zip(control["choices"], entry["choices"]))
                    if c != t and i in changed_by_floor)
    if speed is not None:
        out["speed"] = _speed_entry(speed)
    return out


def _speed_entry(speed):
    """The side-by-side check's part of the comparison: its raw times and their summaries."""
    if "error" in speed:
        return {"error": speed["error"]}
    entry = {"routing": speed["routing"]}
    if "times_s" in speed:
        entry.update({k: speed[k] for k in ("ids", "n_tokens", "times_s", "linear_s")})
        entry["summary"] = speed_summary(speed)
        entry["split"] = {name: time_split(t, speed["linear_s"][name], len(t))
                          for name, t in speed["times_s"].items()}
    if "decode" in speed:
        d = speed["decode"]
        steps = (d["new_tokens"] - 1) * len(d["n_tokens"])
        entry["decode"] = dict(d, summary=decode_summary(d), split={
            name: {"prefill": time_split(r["prefill_s"], r["prefill_linear_s"], len(d["n_tokens"])),
                   "decode": time_split(r["decode_s"], r["decode_linear_s"], steps,
                                        r["decode_output_s"])}
            for name, r in d["runs"].items()})
    return entry


def _fmt(v, spec="{:.3f}", none="-"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return spec.format(v)


def _ratio(num, den, spec):
    """num / den formatted, or "-" where den is not positive (nothing to time)."""
    return spec.format(num / den) if den > 0 else "-"


def _md_cell(text, limit=None) -> str:
    """Free text as one table cell: whitespace runs as one space, "|" as its HTML entity."""
    text = " ".join(str(text).split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.replace("|", "&#124;")


def _table(columns, rows):
    """A markdown table: the header of `columns`, its separator line, then `rows`."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *rows]


def _answered(cfgs):
    """(name, entry, answers) of each configuration compared with the control."""
    return [(name, e, e["answers"]) for name, e in cfgs.items() if e.get("answers")]


def _noise_floor_lines(cfgs):
    lines = ["", "## Answer changes against the noise floor", ""]
    floor = cfgs.get(NOISE_FLOOR)
    if floor is None or "answers" not in floor:
        why = "failed" if floor is not None else "did not run (add it to --configs)"
        return lines + [f"The noise floor ({NOISE_FLOOR}) {why}: no reference for the changes."]
    fa, fkl = floor["answers"], floor.get("kl_full") or {}
    lines += [
        f"{NOISE_FLOOR}: the control's weight matrices (the output layer's included) rounded "
        "to bfloat16 once, float32 arithmetic. Its answer changes are those that rounding "
        "alone produces on this model's near-tied options: a configuration with about as "
        "many changes as the noise floor changes no more answers than rounding does. "
        "*Shared*: questions whose answer both this configuration and the noise floor change.",
        "",
    ]
    return lines + _table(
        ["Configuration", "Answer changes", "Noise floor's changes", "Shared with the noise floor",
         "Mean KL", "Noise floor's mean KL"],
        [f"| {name} | {a['answer_changes']} | {fa['answer_changes']} "
         f"| {e['changes_shared_with_noise_floor']} "
         f"| {_fmt((e.get('kl_full') or {}).get('mean'), '{:.6f}')} "
         f"| {_fmt(fkl.get('mean'), '{:.6f}')} |"
         for name, e, a in _answered(cfgs)])


def _routing_cell(routing):
    if routing["output"] == "float" and not routing["w8a8_layers"]:
        return "none (float)"
    total = routing["w8a8_layers"] + routing["float_layers"]
    return f"{routing['w8a8_layers']}/{total}, output layer {routing['output'].upper()}"


def _speed_lines(sp):
    lines = []
    if "summary" in sp:
        lines += [
            f"{len(sp['ids'])} questions ({min(sp['n_tokens'])}-{max(sp['n_tokens'])} "
            "tokens), every configuration in one process, taking turns on each question "
            "(a pause before each pass): on a shared machine this is the speedup to "
            "quote; the serial runs' wall times above also carry the load's drift.",
            "",
        ] + _table(["Configuration", "Median speedup", "Total-time speedup", "Mean time/question"],
                   [f"| {name} | {e['median_speedup']:.3f}x | {e['total_speedup']:.3f}x "
                    f"| {e['mean_time_s']:.3f} s |" for name, e in sp["summary"].items()])
    d = sp.get("decode")
    if d:
        n = len(d["n_tokens"])
        lines += [
            "", "## Decode, side by side", "",
            f"Greedy generation of {d['new_tokens']} new tokens after each of {n} prompts "
            f"({min(d['n_tokens'])}-{max(d['n_tokens'])} tokens), every configuration in the "
            "same process, taking turns on each prompt. Prefill: the prompt's forward pass, "
            "up to the first new token; decode: the other "
            f"{d['new_tokens'] - 1} tokens, one forward pass of one token each through the "
            "KV cache. Tokens per second are summed tokens over summed times. Every W8A8 "
            "configuration runs its linear layers as routed in the column *W8A8 layers*; "
            "the default router settings (min_in_features=0, skip_rows=None, no include or "
            "exclude patterns) put every one in W8A8, the output layer (the tied 262144 x "
            "640 embedding) included. *Same greedy tokens*: the tokens equal to the control's "
            "up to the first difference, summed over the prompts.",
            "",
        ] + _table(["Configuration", "W8A8 layers", "Prefill tokens/s", "Prefill speedup",
                    "Decode tokens/s", "Decode speedup", "Same greedy tokens"],
                   [f"| {name} | {_routing_cell(sp['routing'][name])} "
                    f"| {e['prefill_tokens_per_s']:.1f} | {e['prefill_speedup']:.3f}x "
                    f"| {e['decode_tokens_per_s']:.2f} | {e['decode_speedup']:.3f}x "
                    f"| {e['same_tokens']}/{e['generated_tokens']} |"
                    for name, e in d["summary"].items()])
    lines += _split_lines(sp)
    return lines


def _split_lines(sp):
    """The time split table: each configuration's time inside linear layers and the rest."""
    passes = []
    if "split" in sp:
        passes.append(("prefill, per question", sp["split"]))
    if "decode" in sp:
        splits = sp["decode"]["split"]
        passes.append(("prefill, per decode prompt", {n: s["prefill"] for n, s in splits.items()}))
        passes.append(("decode, per token", {n: s["decode"] for n, s in splits.items()}))
    if not passes:
        return []
    lines = [
        "", "## Where the time goes: linear layers and the rest", "",
        "Time per forward pass (per question, per prompt) or per decoded token, split into the "
        "time inside the model's linear layers (their calls timed, the output layer's "
        "included) and the rest (embedding lookup, attention, norms, RoPE, GeGLU, residual "
        "adds). *Linear speedup*: the control's linear time over this configuration's. "
        "*Bound*: the speedup if this configuration's linear layers took no time and the "
        "rest stayed; the end-to-end speedup is control total / (linear + rest).",
        "",
    ]
    return lines + _table(
        ["Configuration", "Pass", "Total", "Linear layers", "Output layer", "Rest",
         "Linear share", "Linear speedup", "Speedup", "Bound"],
        [_split_row(name, label, e, split["control"])
         for label, split in passes for name, e in split.items()])


def _split_row(name, label, e, ctrl):
    output = f"{1e3 * e['output_s']:.2f} ms" if "output_s" in e else "-"
    return (f"| {name} | {label} | {1e3 * e['total_s']:.2f} ms "
            f"| {1e3 * e['linear_s']:.2f} ms | {output} "
            f"| {1e3 * e['rest_s']:.2f} ms | {100 * e['linear_share']:.1f}% "
            f"| {_ratio(ctrl['linear_s'], e['linear_s'], '{:.2f}x')} "
            f"| {_ratio(ctrl['total_s'], e['total_s'], '{:.3f}x')} "
            f"| {_ratio(ctrl['total_s'], e['rest_s'], '{:.2f}x')} |")


def _intro_lines(meta):
    """The title and what was run, where and how it was measured."""
    return [
        "# W8A8 evaluation: Gemma 3 270M (numpy)",
        "",
        f"- Data: {meta['data']} ({meta['n']} questions)",
        f"- Date: {meta['date']}; CPU: {meta['cpu']}; {meta['cpus']} logical CPUs; "
        f"threads: {meta['threads'] or 'default'}",
        f"- Total wall time: {_fmt(meta.get('wall_time_s'), '{:.1f} s')} (every run, from "
        "the start of the command)",
        f"- Python {meta['python']}, numpy {meta['numpy']}"
        + (f", kernel ISA {meta['isa']}" if meta.get("isa") else ""),
        "- Control: the Q4_K_M release dequantized to float32; W8A8 re-quantizes those floats.",
        "- Each configuration ran in a fresh process; wall time covers the whole process "
        "(startup, loading, lazy packing, every question). Peak RSS is the process's VmHWM, "
        "which includes resident pages of the memory-mapped float32 weight cache.",
    ]


def _combined_row(name, e):
    if "error" in e:
        return f"| {_md_cell(name)} | failed: {_md_cell(e['error'], 80)} | | | | | | | | |"
    n = e["n"]
    a = e.get("answers")
    kl = e.get("kl_full") or {}
    changes = f"{a['answer_changes']}/{n} ({100 * a['answer_changes'] / n:.2f}%)" if a else "-"
    flips = f"{a['flips']}/{n} ({100 * a['flip_rate']:.2f}%)" if a else "-"
    return (
        f"| {name} | {e['correct']}/{n} ({100 * e['accuracy']:.2f}%) "
        f"| {_fmt(e.get('wall_time_s'), '{:.2f} s')} "
        f"| {_fmt(e.get('speedup'), '{:.3f}x')} "
        f"| {_fmt(e.get('mean_question_s'), '{:.3f} s')} "
        f"| {changes} | {flips} "
        f"| {_fmt(kl.get('mean'), '{:.6f}')} | {_fmt(kl.get('p95'), '{:.6f}')} "
        f"| {_fmt(e.get('peak_rss_mib'), '{:.1f} MiB')} |"
    )


def _combined_lines(cfgs):
    """Every configuration in one row, a failed one with its error."""
    return ["", "## Combined result", ""] + _table(
        ["Configuration", "Accuracy", "Wall time", "Speedup", "Time/question", "Answer changes",
         "Correctness flips", "Mean KL", "P95 KL", "Peak RSS"],
        [_combined_row(name, e) for name, e in cfgs.items()])


def _speed_section_lines(sp):
    if not sp:
        return []
    lines = ["", "## Speed, side by side", ""]
    if "error" in sp:
        return lines + [f"The side-by-side check failed: {_md_cell(sp['error'], 200)}"]
    return lines + _speed_lines(sp)


def _flips_lines(cfgs):
    return ["", "## Flips and answer changes (vs control)", ""] + _table(
        ["Configuration", "Changes", "Correct -> incorrect", "Incorrect -> correct",
         "Wrong -> wrong", "Flips", "Net correct", "Top-1 agreement"],
        [f"| {name} | {a['answer_changes']} | {a['correct_to_incorrect']} "
         f"| {a['incorrect_to_correct']} | {a['wrong_to_wrong_changes']} | {a['flips']} "
         f"| {a['net_correct']:+d} | {100 * a['top1_agreement']:.2f}% |"
         for name, _, a in _answered(cfgs)])


def _interval_cell(point, interval, scale=100.0, spec="{:.2f}"):
    low, high = interval
    return (f"{spec.format(scale * point)} [{spec.format(scale * low)}, "
            f"{spec.format(scale * high)}]")


def _interval_lines(cfgs):
    """Accuracy, its change, flips and answer changes with their bootstrap intervals."""
    rows = []
    for name, e in cfgs.items():
        iv = e.get("intervals")
        if iv is None:
            continue
        a = e.get("answers")
        cells = [_interval_cell(e["accuracy"], iv["target_accuracy"])]
        if a is None:  # the control: only its accuracy has an interval worth printing
            cells += ["-", "-", "-"]
        else:
            cells += [_interval_cell(a["target_accuracy"] - a["control_accuracy"],
                                     iv["accuracy_change"], spec="{:+.2f}"),
                      _interval_cell(a["flip_rate"], iv["flip_rate"]),
                      _interval_cell(a["answer_changes"] / a["n"], iv["answer_change_rate"])]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "## 95% confidence intervals (paired bootstrap over questions)", "",
            f"Percent of the questions; [low, high]: the 2.5th and 97.5th percentiles of "
            f"{RESAMPLES:,} resamples of the questions with replacement (numpy generator, "
            f"seed {SEED}), the control's and each configuration's answers resampled "
            "together. An interval of the accuracy change that contains 0 does not tell the "
            "configuration's accuracy from the control's.", ""] + _table(
        ["Configuration", "Accuracy", "Accuracy change", "Correctness flips",
         "Answer changes"], rows)


def _kl_lines(cfgs):
    def row(name, f, o):
        return (f"| {name} | {f['mean']:.6f} | {f['median']:.6f} | {f['p95']:.6f} | {f['max']:.6f} "
                f"| {o['mean']:.6f} | {o['median']:.6f} | {o['p95']:.6f} | {o['max']:.6f} |")

    return ["", "## KL(control || target) at the answer position, nats", ""] + _table(
        ["Configuration", "Full mean", "Full median", "Full p95", "Full max", "Options mean",
         "Options median", "Options p95", "Options max"],
        [row(name, e["kl_full"], e["kl_options"]) for name, e in cfgs.items() if e.get("kl_full")])


def _timing_row(name, e):
    rt = e.get("router") or {}
    return (
        f"| {name} | {_fmt(e.get('load_time_s'), '{:.2f} s')} "
        f"| {_fmt(e.get('build_time_s'), '{:.2f} s')} "
        f"| {_fmt(rt.get('pack_time_s'), '{:.2f} s')} "
        f"| {_fmt(e.get('eval_time_s'), '{:.2f} s')} "
        f"| {_fmt(e.get('eval_speedup'), '{:.3f}x')} "
        f"| {_fmt(rt.get('packed_bytes'), '{:,}')} |"
    )


def _timing_lines(cfgs):
    """Where each working configuration's time went: loading, building, packing, questions."""
    return ["", "## Timing details", ""] + _table(
        ["Configuration", "Load", "Build", "Packing", "Questions", "Eval speedup", "Packed bytes"],
        [_timing_row(name, e) for name, e in cfgs.items() if "error" not in e])


_DEFINITIONS = [
    "",
    "Definitions: *answer change*: the chosen option differs from the control's (including "
    "wrong -> other wrong). *Correctness flip* (Dutta et al. 2024): correct -> incorrect or "
    "incorrect -> correct. *KL*: KL(control || target) of the next-token distribution at the "
    "answer position, over the full vocabulary and over the softmax restricted to the four "
    "option tokens. *Packing* is included in the questions' time (it happens lazily on the "
    "first question).",
    "",
]


def render_markdown(comp: dict) -> str:
    """The text of comparison.md (`comp`: `build_comparison`'s), a section per table."""
    cfgs = comp["configs"]
    sections = [
        _intro_lines(comp["meta"]),
        _combined_lines(cfgs),
        _interval_lines(cfgs),
        _noise_floor_lines(cfgs),
        _speed_section_lines(comp.get("speed")),
        _flips_lines(cfgs),
        _kl_lines(cfgs),
        _timing_lines(cfgs),
        _DEFINITIONS,
    ]
    return "\n".join(line for lines in sections for line in lines)
