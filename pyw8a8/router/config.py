"""The router's settings (`RouterConfig`) and how they are read from ``PYW8A8_*`` variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["RouterConfig"]

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def _parse_bool(var, raw):
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"{var}={raw!r}: expected a boolean (1/0, true/false, yes/no, on/off)")


def _parse_int(var, raw, minimum=None):
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ValueError(f"{var}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{var}={raw!r}: must be >= {minimum}")
    return value


def _parse_list(raw):
    return [p.strip() for p in raw.split(",") if p.strip()]


@dataclass
class RouterConfig:
    """Which weight matmuls run in W8A8, and how they are packed.

    Parameters
    ----------
    min_k : int
        Matrices with ``K < min_k`` stay float.  Default 0 (none).
    skip_rows : int or None
        Matrices with ``N >= skip_rows`` stay float (e.g. a huge output
        layer).  Default None: never.
    include : list of str
        fnmatch glob patterns on tensor names; when non-empty, only matching
        tensors may use W8A8.
    exclude : list of str
        Glob patterns of tensors that stay float (applied after `include`).
    verbose : bool
        Log every routing decision and every packed tensor (name, shape,
        bytes, pack time) to the ``"pyw8a8"`` logger.
    rotate : bool
        Block randomized-Hadamard rotation of weights and activations.
    block : int
        Rotation block size (a power of two).
    seed : int
        Seed of the rotation signs.
    scaling : bool
        Data-free FFN equalization (``pyw8a8.equalize_ffn``) of each
        gate/up/down triple before packing; exact in float arithmetic.
    encoding : str
        Weight byte encoding passed to ``pyw8a8.pack_weight``.
    """

    min_k: int = 0
    skip_rows: int | None = None
    include: list = field(default_factory=list)
    exclude: list = field(default_factory=list)
    verbose: bool = False
    rotate: bool = True
    block: int = 128
    seed: int = 0
    scaling: bool = False
    encoding: str = "auto"

    def __post_init__(self):
        if isinstance(self.include, str):
            self.include = _parse_list(self.include)
        if isinstance(self.exclude, str):
            self.exclude = _parse_list(self.exclude)
        self.include = list(self.include)
        self.exclude = list(self.exclude)
        for label, pats in (("include", self.include), ("exclude", self.exclude)):
            if not all(isinstance(p, str) for p in pats):
                raise ValueError(f"{label} must be a list of glob pattern strings")
        if isinstance(self.min_k, bool) or not isinstance(self.min_k, (int, np.integer)) or self.min_k < 0:
            raise ValueError(f"min_k must be an integer >= 0, got {self.min_k!r}")
        if self.skip_rows is not None and (
            isinstance(self.skip_rows, bool)
            or not isinstance(self.skip_rows, (int, np.integer))
            or self.skip_rows < 1
        ):
            raise ValueError(f"skip_rows must be None or an integer >= 1, got {self.skip_rows!r}")
        b = self.block
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 or (b & (b - 1)):
            raise ValueError(f"block must be a positive power of two, got {b!r}")
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "RouterConfig":
        """Configuration from ``PYW8A8_*`` environment variables.

        Variables (all optional): ``PYW8A8_MIN_K`` (int >= 0),
        ``PYW8A8_SKIP_ROWS`` (int >= 1; ``0``/``none``/empty disables),
        ``PYW8A8_INCLUDE`` and ``PYW8A8_EXCLUDE`` (comma-separated globs),
        ``PYW8A8_VERBOSE``, ``PYW8A8_ROTATE``, ``PYW8A8_SCALING`` (booleans),
        ``PYW8A8_BLOCK`` (power of two), ``PYW8A8_SEED`` (int).  Keyword
        `overrides` take precedence.

        Raises
        ------
        ValueError
            On a malformed value; the message names the variable.
        """
        env = os.environ if environ is None else environ
        kw = {}

        def get(name):
            v = env.get(name)
            return None if v is None else str(v)

        if (v := get("PYW8A8_MIN_K")) is not None and v.strip():
            kw["min_k"] = _parse_int("PYW8A8_MIN_K", v, minimum=0)
        if (v := get("PYW8A8_SKIP_ROWS")) is not None:
            if v.strip().lower() in ("", "none", "0"):
                kw["skip_rows"] = None
            else:
                kw["skip_rows"] = _parse_int("PYW8A8_SKIP_ROWS", v, minimum=1)
        if (v := get("PYW8A8_INCLUDE")) is not None:
            kw["include"] = _parse_list(v)
        if (v := get("PYW8A8_EXCLUDE")) is not None:
            kw["exclude"] = _parse_list(v)
        for var, attr in (
            ("PYW8A8_VERBOSE", "verbose"),
            ("PYW8A8_ROTATE", "rotate"),
            ("PYW8A8_SCALING", "scaling"),
        ):
            if (v := get(var)) is not None:
                kw[attr] = _parse_bool(var, v)
        if (v := get("PYW8A8_BLOCK")) is not None and v.strip():
            b = _parse_int("PYW8A8_BLOCK", v, minimum=1)
            if b & (b - 1):
                raise ValueError(f"PYW8A8_BLOCK={v!r}: must be a power of two")
            kw["block"] = b
        if (v := get("PYW8A8_SEED")) is not None and v.strip():
            kw["seed"] = _parse_int("PYW8A8_SEED", v)
        kw.update(overrides)
        return cls(**kw)

    def with_(self, **changes) -> "RouterConfig":
        """A copy with some fields changed."""
        return replace(self, **changes)
