"""The evaluated configurations: their names, the router settings they stand for, their models."""

from __future__ import annotations

import re

from ..models import gemma3
from ..router import Router, RouterConfig, WeightCache

__all__ = ["DEFAULT_CONFIGS", "build_model", "parse_config", "parse_config_list"]

DEFAULT_CONFIGS = ["control", "naive", "rotated128", "rotated64", "rotated128+scaling"]

# fullmatch, ASCII digits, no leading zeros: "naive\n", "rotated0128" or "rotated١٢٨" are not
# names ("rotated0" still parses so that it gets the power-of-two message).
_CONFIG_RE = re.compile(r"(control|naive|env|rotated(0|[1-9][0-9]*))(\+scaling)?")


def parse_config(name: str):
    """Router settings of a configuration name.

    Names: ``control`` (float), ``naive`` (W8A8, no rotation), ``rotatedN``
    (rotation with block N), ``env`` (``RouterConfig.from_env()``), each
    optionally followed by ``+scaling`` (FFN equalization).

    Returns
    -------
    RouterConfig or None
        None for the float control.

    Raises
    ------
    ValueError
        For an unknown name.
    """
    m = _CONFIG_RE.fullmatch(name) if isinstance(name, str) else None
    if not m:
        raise ValueError(
            f"unknown configuration {name!r}; use control, naive, env or rotatedN "
            "(N a power of two), optionally with +scaling"
        )
    kind, block, scaling = m.group(1), m.group(2), bool(m.group(3))
    if kind == "control":
        if scaling:
            raise ValueError("control+scaling is not a configuration (the control is float)")
        return None
    if kind == "env":
        cfg = RouterConfig.from_env()
        return cfg.with_(scaling=True) if scaling else cfg
    if kind == "naive":
        return RouterConfig(rotate=False, scaling=scaling)
    return RouterConfig(rotate=True, block=int(block), scaling=scaling)


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


def build_model(rcfg, weights, config):
    """(model, router) of a configuration's router settings; router None for the control."""
    if rcfg is None:
        return gemma3.Gemma3(weights, config=config), None
    router = Router(rcfg, cache=WeightCache(0))  # one model: nothing to share
    return gemma3.Gemma3(weights, config=config, linear=router), router
