"""The eval's ``+kv8`` configurations end to end in the worker, on the tiny random Gemma 3
(the real model class, its int8 KV cache and exact int8 attention; no model download)."""
import numpy as np
import pytest
from test_gemma3 import TINY16, _tiny_weights

from pyw8a8.evaluate import worker


class _Tokenizer:
    def token_id(self, piece):
        return {" A": 2, " B": 3, " C": 4, " D": 5}[piece]

    def encode(self, prompt):
        return [1] + [7 + ord(c) % 30 for c in prompt]


@pytest.fixture
def tiny_eval(monkeypatch, clean_env):
    from pyw8a8.models import gemma3

    weights = _tiny_weights(TINY16, seed=4)
    monkeypatch.setattr(gemma3, "load_weights", lambda *a, **k: dict(weights))
    monkeypatch.setattr(gemma3, "load_tokenizer", lambda *a, **k: _Tokenizer())
    monkeypatch.setattr(gemma3, "load_config", lambda *a, **k: TINY16)
    return [{"id": str(i), "prompt": f"question {i}: {'xyz' * i}?", "label": i % 4,
             "options": [" A", " B", " C", " D"]} for i in range(3)]


def test_worker_runs_kv8_configs_against_the_control(tiny_eval, tmp_path):
    control = tmp_path / "control_logits.npy"
    spec = {"samples": tiny_eval, "control_logits": str(control)}
    ref = worker.run_config(dict(spec, name="control"))
    assert ref["kv_cache"] == "float" and control.exists()
    kl = {}
    for name in ("naive", "naive+kv8", "naive+kv8norot", "rotated16+kv8"):
        r = worker.run_config(dict(spec, name=name))
        assert r["kv_cache"] == {"naive": "float", "naive+kv8norot": "int8-norot"}.get(
            name, "int8")
        assert r["n"] == 3 and len(r["kl_full"]) == 3
        kl[name] = float(np.mean(r["kl_full"]))
    # the int8 cache adds a little to W8A8's own divergence, never a broken model
    assert all(0 <= v < 0.05 for v in kl.values())
    assert kl["naive+kv8"] != kl["naive"]
