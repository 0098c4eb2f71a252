"""The evaluated configurations: their names, the router settings they stand for, their models."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..models import gemma3
from ..router import Router, RouterConfig, WeightCache, float_linear
from .bfloat16 import bfloat16_linear

__all__ = ["DEFAULT_CONFIGS", "NOISE_FLOOR", "Bfloat16Weights", "build_model", "linear_factory",
           "parse_config", "parse_config_list"]

#: The noise-floor configuration's name (see `Bfloat16Weights`).
NOISE_FLOOR = "bf16"

DEFAULT_CONFIGS = ["control", NOISE_FLOOR, "naive", "rotated128", "rotated64",
                   "rotated128+scaling"]

# fullmatch, ASCII digits, no leading zeros: "naive\n", "rotated0128" or "rotated١٢٨" are not
# names ("rotated0" still parses so that it gets the power-of-two message).
_CONFIG_RE = re.compile(r"(control|bf16|naive|env|rotated(0|[1-9][0-9]*))(\+scaling)?")


@dataclass(frozen=True)
class Bfloat16Weights:
    """The noise floor's settings: the float32 model on weight matrices rounded to bfloat16.

    Every matrix the model's linear factory receives (the output layer's tied embedding
    included; the embedding lookup and the norms keep float32) is rounded once with
    `~pyw8a8.evaluate.bfloat16.round_to_bfloat16`; the arithmetic stays float32.
    """


def parse_config(name: str):
    """Router settings of a configuration name.

    Names: ``control`` (float), ``bf16`` (the noise floor: float with bfloat16-rounded
    weights), ``naive`` (W8A8, no rotation), ``rotatedN`` (rotation with block N, a power
    of two from 16 to 4096), ``env`` (``RouterConfig.from_env()``); the W8A8 ones
    optionally followed by ``+scaling`` (FFN equalization).

    Returns
    -------
    RouterConfig, Bfloat16Weights or None
        None for the float control.

    Raises
    ------
    ValueError
        For an unknown name, or one whose settings `RouterConfig` rejects (``rotated8``,
        ``rotated8192``, or ``env`` with a bad ``PYW8A8_*`` variable); the message names
        the configuration.
    """
    m = _CONFIG_RE.fullmatch(name) if isinstance(name, str) else None
    if not m:
        raise ValueError(
            f"unknown configuration {name!r}; use control, bf16, naive, env or rotatedN "
            "(N a power of two from 16 to 4096), the last three optionally with +scaling"
        )
    kind, block, scaling = m.group(1), m.group(2), bool(m.group(3))
    if kind == "control":
        if scaling:
            raise ValueError("control+scaling is not a configuration (the control is float)")
        return None
    if kind == NOISE_FLOOR:
        if scaling:
            raise ValueError("bf16+scaling is not a configuration (FFN scaling is for W8A8)")
        return Bfloat16Weights()
    # RouterConfig validates its fields (rotatedN: a block pack_weight accepts); say which
    # configuration name they came from.
    try:
        if kind == "env":
            cfg = RouterConfig.from_env()
            return cfg.with_(scaling=True) if scaling else cfg
        if kind == "naive":
            return RouterConfig(rotate=False, scaling=scaling)
        return RouterConfig(rotate=True, block=int(block), scaling=scaling)
    except ValueError as exc:
        raise ValueError(f"configuration {name!r}: {exc}") from exc


def parse_config_list(values):
    """Configuration names of ``--configs`` values (comma or space separated), validated,
    without repeats, the control first."""
    names = []
    for v in values:
        names += [p.strip() for p in v.split(",") if p.strip()]
    for n in names:
        parse_config(n)  # validate early
    out = []
    for n in names:
        if n not in out:
            out.append(n)
    if "control" in out:
        out.remove("control")
    return ["control"] + out  # KL and flips are relative to the control: run it first


def linear_factory(settings):
    """(linear factory, router) of a configuration's settings (see `parse_config`).

    The factory is ``float_linear`` for the control, ``bfloat16_linear`` for the noise
    floor (router None for both) and a `Router` of its own for a W8A8 configuration.
    """
    if settings is None:
        return float_linear, None
    if isinstance(settings, Bfloat16Weights):
        return bfloat16_linear, None
    router = Router(settings, cache=WeightCache(0))  # one model: nothing to share
    return router, router


def build_model(settings, weights, config):
    """(model, router) of a configuration's settings (see `parse_config`); router None for
    the float models."""
    factory, router = linear_factory(settings)
    return gemma3.Gemma3(weights, config=config, linear=factory), router
