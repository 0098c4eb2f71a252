"""Which weight matmuls go int8: the one rule of `Router` and ``pyw8a8.torch.quantize``."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

__all__ = ["float_reason"]


def float_reason(name: str, out_features: int, in_features: int, *,
                 include: Sequence[str] = (), exclude: Sequence[str] = (),
                 min_in_features: int = 0, skip_rows: int | None = None) -> str | None:
    """Why the layer `name`, of a weight of shape ``(out_features, in_features)``, stays
    float, or None where it goes int8.

    Parameters
    ----------
    name : str
        The tensor's or module's qualified name, which the patterns match.
    out_features, in_features : int
        N and K of its weight, shape (N, K).
    include : sequence of str
        fnmatch glob patterns; when non-empty, only matching names go int8.
    exclude : sequence of str
        Glob patterns of names that stay float (applied after `include`).
    min_in_features : int
        Layers of fewer input features stay float.
    skip_rows : int or None
        Layers of at least this many output features stay float; None: never.

    Returns
    -------
    str or None
        The reason, in words (a report's or a log's), or None.
    """
    if include and not any(fnmatch.fnmatchcase(name, p) for p in include):
        return "not included"
    if any(fnmatch.fnmatchcase(name, p) for p in exclude):
        return "excluded"
    if in_features < min_in_features:
        return f"in_features={in_features} < min_in_features={min_in_features}"
    if skip_rows is not None and out_features >= skip_rows:
        return f"out_features={out_features} >= skip_rows={skip_rows}"
    return None
