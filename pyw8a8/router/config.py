"""The router's settings (`RouterConfig`) and how they are read from ``PYW8A8_*`` variables."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .._validation import renamed_keyword
from ..packing import ENCODINGS as PACKED_ENCODINGS
from ..rotation import MAX_BLOCK, MAX_SEED, MIN_BLOCK

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


def _parse_int(var, raw):
    try:
        return int(raw.strip(), 10)
    except ValueError:
        raise ValueError(f"{var}={raw!r}: expected an integer") from None


def _check_int(label, value, minimum, maximum=None, power_of_two=False) -> int:
    """`value` as an int if it is one within the rule, else a ValueError naming `label`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{label} must be an integer, got {value!r}")
    value = int(value)
    if power_of_two:
        ok = minimum <= value <= maximum and value & (value - 1) == 0
        rule = f"a power of two from {minimum} to {maximum}"
    else:
        ok = value >= minimum and (maximum is None or value <= maximum)
        rule = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    if not ok:
        raise ValueError(f"{label} must be {rule}, got {value!r}")
    return value


# The integer fields' rules, shared by the constructor and `from_env`.  The block and seed
# ranges are those `pyw8a8.pack_weight` accepts when rotating, so that a configuration
# fails when it is built, not at the first forward.
_INT_RULES = {
    "min_in_features": dict(minimum=0),
    "skip_rows": dict(minimum=1),
    "block": dict(minimum=MIN_BLOCK, maximum=MAX_BLOCK, power_of_two=True),
    "seed": dict(minimum=0, maximum=MAX_SEED),
}


def _env_int(var, raw, name):
    """Integer field `name` from variable `var`'s value `raw`; errors name the variable."""
    return _check_int(f"{var}={raw!r}", _parse_int(var, raw), **_INT_RULES[name])


# The weight encodings `pyw8a8.pack_weight` accepts.
_ENCODINGS = ("auto",) + PACKED_ENCODINGS


def _parse_list(raw):
    return [p.strip() for p in raw.split(",") if p.strip()]


@renamed_keyword("min_k", "min_in_features")
@dataclass
class RouterConfig:
    """Which weight matmuls run in W8A8, and how they are packed.

    Parameters
    ----------
    min_in_features : int
        Matrices of fewer input features (``K < min_in_features``, of a weight of shape
        (N, K)) stay float.  Default 0 (none).  The name of ``pyw8a8.torch.quantize``'s
        setting; ``min_k``, its former name, still works, with a DeprecationWarning.
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
        Rotation block size, a power of two from 16 to 4096 (what
        ``pyw8a8.pack_weight`` accepts).  A matrix whose K it does not divide
        is rotated with its last block zero-padded (``pack_weight(pad=True)``).
    seed : int
        Seed of the rotation signs, in [0, 2**32 - 1].
    scaling : bool
        Data-free FFN equalization (``pyw8a8.equalize_ffn``) of each
        gate/up/down triple before packing; exact in float arithmetic.
    encoding : {'auto', 'biased', 'signed'}
        Weight byte encoding passed to ``pyw8a8.pack_weight``.

    Raises
    ------
    ValueError
        If a field is out of its range or of the wrong type (the message names
        the field), so a bad configuration fails when it is built, not at the
        first forward.
    """

    min_in_features: int = 0
    skip_rows: int | None = None
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    verbose: bool = False
    rotate: bool = True
    block: int = 128
    seed: int = 0
    scaling: bool = False
    encoding: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.include, str):
            self.include = _parse_list(self.include)
        if isinstance(self.exclude, str):
            self.exclude = _parse_list(self.exclude)
        self.include = list(self.include)
        self.exclude = list(self.exclude)
        for label, pats in (("include", self.include), ("exclude", self.exclude)):
            if not all(isinstance(p, str) for p in pats):
                raise ValueError(f"{label} must be a list of glob pattern strings")
        for name, rule in _INT_RULES.items():
            value = getattr(self, name)
            if not (name == "skip_rows" and value is None):
                setattr(self, name, _check_int(name, value, **rule))
        if not (isinstance(self.encoding, str) and self.encoding in _ENCODINGS):
            raise ValueError(f"encoding must be one of {', '.join(map(repr, _ENCODINGS))}, "
                             f"got {self.encoding!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 **overrides: Any) -> RouterConfig:
        """Configuration from ``PYW8A8_*`` environment variables.

        Variables (all optional): ``PYW8A8_MIN_IN_FEATURES`` (int >= 0; its former name
        ``PYW8A8_MIN_K`` still works, with a DeprecationWarning),
        ``PYW8A8_SKIP_ROWS`` (int >= 1; ``0``/``none``/empty disables),
        ``PYW8A8_INCLUDE`` and ``PYW8A8_EXCLUDE`` (comma-separated globs),
        ``PYW8A8_VERBOSE``, ``PYW8A8_ROTATE``, ``PYW8A8_SCALING`` (booleans),
        ``PYW8A8_BLOCK`` (a power of two from 16 to 4096), ``PYW8A8_SEED`` (int in
        [0, 2**32 - 1]).  Keyword `overrides` take precedence.

        Raises
        ------
        ValueError
            On a malformed or out-of-range value, or both ``PYW8A8_MIN_IN_FEATURES``
            and ``PYW8A8_MIN_K`` set; the message names the variable.  Invalid
            `overrides` raise as in the constructor.
        """
        env = os.environ if environ is None else environ
        kw: dict[str, Any] = {}

        def get(name):
            v = env.get(name)
            return None if v is None else str(v)

        var = "PYW8A8_MIN_IN_FEATURES"
        if get("PYW8A8_MIN_K") is not None:
            if get(var) is not None:
                raise ValueError(f"both {var} and PYW8A8_MIN_K, its deprecated name, are "
                                 f"set: set {var} only")
            warnings.warn(f"PYW8A8_MIN_K is deprecated, set {var}", DeprecationWarning,
                          stacklevel=2)
            var = "PYW8A8_MIN_K"
        if (v := get(var)) is not None and v.strip():
            kw["min_in_features"] = _env_int(var, v, "min_in_features")
        if (v := get("PYW8A8_SKIP_ROWS")) is not None:
            if v.strip().lower() in ("", "none", "0"):
                kw["skip_rows"] = None
            else:
                kw["skip_rows"] = _env_int("PYW8A8_SKIP_ROWS", v, "skip_rows")
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
            kw["block"] = _env_int("PYW8A8_BLOCK", v, "block")
        if (v := get("PYW8A8_SEED")) is not None and v.strip():
            kw["seed"] = _env_int("PYW8A8_SEED", v, "seed")
        kw.update(overrides)
        return cls(**kw)

    @property
    def min_k(self) -> int:
        """The former name of `min_in_features` (deprecated)."""
        warnings.warn("RouterConfig.min_k is deprecated, read min_in_features",
                      DeprecationWarning, stacklevel=2)
        return self.min_in_features

    @renamed_keyword("min_k", "min_in_features")
    def with_(self, **changes: Any) -> RouterConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)
