"""End-to-end W8A8 evaluation on Gemma 3 270M: ``python -m pyw8a8 eval``.

Three studies of the float control against W8A8 configurations (`studies`), each run in
fresh processes (`runs`): the MMLU questions (accuracy, answer changes, flips and KL,
Dutta et al. 2024; wall time, peak RSS; a side-by-side speed check), ``--ppl``
(perplexity and KL over BoolQ passages) and ``--long-context``.  ``bf16`` is the noise
floor.  The method and figures: docs/guide/evaluation.md."""

from .cli import main
from .configs import DEFAULT_CONFIGS, parse_config
from .download import QuestionsUnavailable
from .samples import load_samples

__all__ = ["main", "parse_config", "load_samples", "DEFAULT_CONFIGS", "QuestionsUnavailable"]
