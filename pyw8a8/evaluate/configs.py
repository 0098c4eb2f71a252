"""The evaluated configurations: their names, the router settings they stand for, their models."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..models import gemma3
from ..router import Router, RouterConfig, WeightCache, float_linear
from .bfloat16 import bfloat16_linear

__all__ = ["DEFAULT_CONFIGS", "NOISE_FLOOR", "Bfloat16Weights", "build_model", "build_models",
           "kv_cache_kind", "linear_factory", "parse_config", "parse_config_list"]

NOISE_FLOOR = "bf16"

DEFAULT_CONFIGS = ["control", NOISE_FLOOR, "naive", "rotated128", "rotated64",
                   "rotated128+scaling"]

# fullmatch, ASCII digits, no leading zeros: "naive\n", "rotated0128" or "rotated١٢٨" are not
# names ("rotated0" still parses so that it gets the power-of-two message).
_CONFIG_RE = re.compile(
    r"(control|bf16|naive|env|rotated(0|[1-9][0-9]*))(\+scaling)?(\+kv8(?:norot)?)?")
# The model's KV cache (`Gemma3`'s kv_cache) of each suffix.
_KV_CACHES = {None: "float", "+kv8": "int8", "+kv8norot": "int8-norot"}


@dataclass(frozen=True)
class Bfloat16Weights:
    """The noise floor's settings: every matrix the linear factory receives (the tied output
    embedding included) rounded once to bfloat16, float32 arithmetic."""


def parse_config(name: str):
    """Router settings of a configuration name: ``control`` (float), ``bf16`` (the noise
    floor), ``naive`` (no rotation), ``rotatedN`` (block N, a power of two from 16 to 4096)
    or ``env`` (``RouterConfig.from_env()``), the W8A8 ones optionally with ``+scaling``,
    then ``+kv8`` (int8 KV cache, keys rotated) or ``+kv8norot`` (`kv_cache_kind`).

    Returns
    -------
    RouterConfig, Bfloat16Weights or None
        None for the control.

    Raises
    ------
    ValueError
        Naming the configuration, for an unknown name, a suffix on a float one, or settings
        `RouterConfig` rejects."""
    kind, block, scaling, kv = _name_parts(name)
    if kind in ("control", NOISE_FLOOR):
        if scaling or kv:
            model = ("the control is the float reference" if kind == "control" else
                     "the noise floor is a float model")
            why = ("FFN scaling is for W8A8" if scaling else "the int8 KV cache goes with "
                   "the W8A8 configurations, e.g. rotated128+kv8")
            raise ValueError(f"{name} is not a configuration ({model}; {why})")
        return None if kind == "control" else Bfloat16Weights()
    try:
        if kind == "env":
            cfg = RouterConfig.from_env()
            return cfg.with_(scaling=True) if scaling else cfg
        if kind == "naive":
            return RouterConfig(rotate=False, scaling=scaling)
        return RouterConfig(rotate=True, block=int(block), scaling=scaling)
    except ValueError as exc:
        raise ValueError(f"configuration {name!r}: {exc}") from exc


def _name_parts(name):
    """(kind, block digits or None, +scaling, +kv8 suffix or None) of a configuration name."""
    m = _CONFIG_RE.fullmatch(name) if isinstance(name, str) else None
    if not m:
        raise ValueError(
            f"unknown configuration {name!r}; use control, bf16, naive, env or rotatedN "
            "(N a power of two from 16 to 4096), the last three optionally with +scaling, "
            "then optionally with +kv8 (int8 KV cache) or +kv8norot"
        )
    return m.group(1), m.group(2), bool(m.group(3)), m.group(4)


def kv_cache_kind(name: str) -> str:
    """`Gemma3`'s ``kv_cache`` of a configuration name: "float", "int8" (``+kv8``) or
    "int8-norot"; ValueError as `parse_config`."""
    parse_config(name)
    return _KV_CACHES[_name_parts(name)[3]]


def parse_config_list(values):
    """Configuration names of ``--configs`` values (comma or space separated), validated,
    without repeats, the control first."""
    names = []
    for v in values:
        names += [p.strip() for p in v.split(",") if p.strip()]
    for n in names:
        parse_config(n)
    # KL and flips are relative to the control: it runs first
    return ["control"] + [n for n in dict.fromkeys(names) if n != "control"]


def linear_factory(settings):
    """(linear factory, router) of a configuration's settings: ``float_linear`` or
    ``bfloat16_linear`` (router None), or a `Router` of its own."""
    if settings is None:
        return float_linear, None
    if isinstance(settings, Bfloat16Weights):
        return bfloat16_linear, None
    router = Router(settings, cache=WeightCache(0))  # one model: nothing to share
    return router, router


def build_models(names):
    """The Gemma 3 270M models of the configurations `names`, built on one load of the
    float weights (dropped once built): ({name: model}, its tokenizer, its config)."""
    weights = gemma3.load_weights()
    config = gemma3.load_config()
    models = {name: build_model(parse_config(name), weights, config, kv_cache_kind(name))[0]
              for name in names}
    return models, gemma3.load_tokenizer(), config


def build_model(settings, weights, config, kv_cache="float"):
    """(model, router) of a configuration's settings (see `parse_config`) and KV cache (see
    `kv_cache_kind`); router None for the float models."""
    factory, router = linear_factory(settings)
    return gemma3.Gemma3(weights, config=config, linear=factory, kv_cache=kv_cache), router
