"""The perplexity comparison: ``perplexity.json``'s content and ``perplexity.md``'s tables."""

from __future__ import annotations

from .bootstrap import RESAMPLES, SEED
from .perplexity import KL_PERCENTILES, summarize

__all__ = ["build_perplexity", "render_perplexity_markdown"]


def _context_entry(run):
    """One context's summaries, or its error."""
    entry = {k: run.get(k) for k in ("windows", "positions_per_window", "corpus", "wall_time_s",
                                      "load_time_s", "eval_time_s", "score_s", "peak_rss_mib",
                                      "isa", "kernel_threads", "error")}
    entry = {k: v for k, v in entry.items() if v is not None}
    if "error" in run:
        return entry
    control = run["configs"]["control"]
    positions = run["windows"] * run["positions_per_window"]
    entry["configs"] = {
        name: dict(summarize(control, scores), forward_s=scores["forward_s"],
                   forward_s_per_1k_tokens=1e3 * scores["forward_s"] / positions)
        for name, scores in run["configs"].items()}
    return entry


def build_perplexity(runs: dict, meta: dict) -> dict:
    """The comparison of the perplexity runs ({context: result or {"error": ...}}): ``meta``
    and ``contexts``, per context its windows, times and, per configuration,
    `~pyw8a8.evaluate.perplexity.summarize` with ``forward_s`` and
    ``forward_s_per_1k_tokens``."""
    return {"meta": meta,
            "contexts": {str(c): _context_entry(run) for c, run in runs.items()}}


def _interval(point, interval, spec):
    return f"{spec.format(point)} [{spec.format(interval[0])}, {spec.format(interval[1])}]"


def _row(name, e):
    kl = "- | - | " + " | ".join("-" for _ in KL_PERCENTILES) + " | -"
    change = "-"
    if name != "control":
        change = _interval(100 * e["perplexity_change"],
                           [100 * v for v in e["perplexity_change_interval"]], "{:+.3f}%")
        kl = " | ".join([_interval(e["kl_mean"], e["kl_mean_interval"], "{:.6f}")]
                        + [f"{e[f'kl_p{q:g}']:.6f}" for q in KL_PERCENTILES]
                        + [f"{e['kl_max']:.4f}", f"{100 * e['same_top1']:.2f}%"])
    return (f"| {name} | {e['perplexity']:.4f} | {change} | {kl} "
            f"| {e['forward_s']:.1f} s | {e['forward_s_per_1k_tokens']:.2f} s |")


def _context_lines(context, entry):
    lines = ["", f"## Context {context}", ""]
    if "error" in entry:
        return lines + [f"The run failed: {' '.join(str(entry['error']).split())}"]
    positions = entry["windows"] * entry["positions_per_window"]
    lines += [
        f"{entry['windows']} windows of {context} tokens (BOS and {entry['positions_per_window']} "
        f"scored tokens): {positions:,} positions. Process wall time "
        f"{entry['wall_time_s']:.1f} s (loading {entry['load_time_s']:.1f} s, scoring "
        f"{entry['score_s']:.1f} s), peak RSS {entry['peak_rss_mib']:.0f} MiB.",
        "",
        "| Configuration | Perplexity | Perplexity change [95% CI] | Mean KL [95% CI] | "
        + " | ".join(f"P{q:g} KL" for q in KL_PERCENTILES)
        + " | Max KL | Same top token | Forward time | Forward time / 1k tokens |",
        "|---" * (8 + len(KL_PERCENTILES)) + "|",
    ]
    return lines + [_row(name, e) for name, e in entry["configs"].items()]


def render_perplexity_markdown(comp: dict) -> str:
    """The text of perplexity.md: the setup, then a table per context length."""
    meta = comp["meta"]
    lines = [
        "# W8A8 perplexity and KL: Gemma 3 270M (numpy)",
        "",
        f"- Text: {meta['data']}; the first {meta['tokens']:,} tokens of the stream, cut into "
        "non-overlapping windows per context, each from its own BOS",
        f"- Date: {meta['date']}; CPU: {meta['cpu']}; {meta['cpus']} logical CPUs; "
        f"threads: {meta['threads'] or 'default'}; total wall time {meta['wall_time_s']:.1f} s",
        "- One process per context: every configuration scores the same windows, a chunk of "
        "positions at a time against the control's distributions. *Forward time*: that "
        "configuration's forward passes alone (full-vocabulary logits at every position).",
        "",
        "Perplexity: exp of the mean negative log-likelihood of every scored token. "
        "*Perplexity change*: this configuration's perplexity over the control's, minus 1. "
        "*KL*: KL(control || configuration) of the next-token distribution at every "
        "position, nats; percentiles over positions. *Same top token*: share of positions "
        "whose most likely token is the control's. [95% CI]: 2.5th and 97.5th percentiles "
        f"of {RESAMPLES:,} bootstrap resamples of the windows (seed {SEED}), the control's "
        "and the configuration's scores resampled together; a few windows give only a "
        "rough interval.",
    ]
    for context, entry in comp["contexts"].items():
        lines += _context_lines(context, entry)
    return "\n".join(lines) + "\n"
