"""Tests of the evaluation's configuration names (`parse_config`, `parse_config_list`).

Tests named ``test_gap_*`` pin former gaps (strict configuration names); they were strict
xfails until the gaps were fixed.  ``--configs`` on the command line: test_evaluate_cli.py.
"""

import pytest

from pyw8a8.evaluate.configs import (
    DEFAULT_CONFIGS,
    Bfloat16Weights,
    kv_cache_kind,
    parse_config,
    parse_config_list,
)
from pyw8a8.router import RouterConfig


@pytest.mark.parametrize("name, rotate, block, scaling", [
    ("naive", False, 128, False),
    ("naive+scaling", False, 128, True),
    ("rotated128", True, 128, False),
    ("rotated64", True, 64, False),
    ("rotated32+scaling", True, 32, True),
    ("rotated16", True, 16, False),
    ("rotated4096", True, 4096, False),
])
def test_parse_config_names(clean_env, name, rotate, block, scaling):
    cfg = parse_config(name)
    assert isinstance(cfg, RouterConfig)
    assert (cfg.rotate, cfg.block, cfg.scaling) == (rotate, block, scaling)
    assert cfg == RouterConfig(rotate=rotate, block=block, scaling=scaling)


def test_parse_config_control_is_float():
    assert parse_config("control") is None


def test_parse_config_bf16_is_the_noise_floor():
    assert parse_config("bf16") == Bfloat16Weights()
    assert "bf16" in DEFAULT_CONFIGS and parse_config_list(["naive,bf16"]) == [
        "control", "naive", "bf16"]


def test_parse_config_env_reads_the_environment(clean_env):
    clean_env.setenv("PYW8A8_BLOCK", "32")
    clean_env.setenv("PYW8A8_ROTATE", "0")
    clean_env.setenv("PYW8A8_MIN_IN_FEATURES", "100")
    cfg = parse_config("env")
    assert (cfg.block, cfg.rotate, cfg.min_in_features, cfg.scaling) == (32, False, 100,
                                                                          False)
    cfg = parse_config("env+scaling")
    assert (cfg.block, cfg.rotate, cfg.min_in_features, cfg.scaling) == (32, False, 100,
                                                                          True)
    clean_env.setenv("PYW8A8_BLOCK", "3")
    with pytest.raises(ValueError, match="PYW8A8_BLOCK"):
        parse_config("env")


@pytest.mark.parametrize("name, base, kind", [
    ("naive+kv8", "naive", "int8"),
    ("rotated128+kv8", "rotated128", "int8"),
    ("rotated64+scaling+kv8", "rotated64+scaling", "int8"),
    ("rotated128+kv8norot", "rotated128", "int8-norot"),
    ("env+scaling+kv8norot", "env+scaling", "int8-norot"),
    ("rotated128", "rotated128", "float"),
    ("control", "control", "float"),
    ("bf16", "bf16", "float"),
])
def test_kv8_suffix_names_the_kv_cache_of_the_same_w8a8_config(clean_env, name, base, kind):
    assert parse_config(name) == parse_config(base)
    assert kv_cache_kind(name) == kind


@pytest.mark.parametrize("name, match", [
    ("control+kv8", r"control\+kv8 is not a configuration \(the control is the float "
                    r"reference; the int8 KV cache goes with the W8A8 configurations"),
    ("bf16+kv8norot", r"bf16\+kv8norot is not a configuration \(the noise floor is a float"),
    ("rotated128+kv8+scaling", "unknown configuration .*then optionally with \\+kv8"),
    ("naive+kv8+kv8", "unknown configuration"),
    ("naive+kv4", "unknown configuration"),
    ("rotated96+kv8", "power of two"),
])
def test_kv8_suffix_rejections(name, match):
    with pytest.raises(ValueError, match=match):
        parse_config(name)
    with pytest.raises(ValueError, match=match):
        kv_cache_kind(name)


@pytest.mark.parametrize("name", ["", "Control", "NAIVE", "rotated", "rotated-4", "rotatedx",
                                  "naive+scaling+scaling", "scaling", " naive", "fp16",
                                  "naive,rotated64"])
def test_parse_config_unknown_name(name):
    with pytest.raises(ValueError,
                       match=r"unknown configuration .*control, bf16, naive, env or rotatedN"):
        parse_config(name)


@pytest.mark.parametrize("name", ["naive\n", "control\n", "rotated64+scaling\n",
                                  "rotated0128", "rotated064", "rotated00",
                                  "rotated\u0661\u0662\u0668"])  # Arabic-Indic "128"
def test_gap_parse_config_is_strict_about_names(name):
    with pytest.raises(ValueError, match=r"unknown configuration"):
        parse_config(name)


@pytest.mark.parametrize("name, match", [
    ("control+scaling", "control\\+scaling is not a configuration"),
    ("rotated3", "power of two"),
    ("rotated0", "power of two"),
    ("rotated96+scaling", "power of two"),
    ("bf16+scaling", "bf16\\+scaling is not a configuration"),
])
def test_parse_config_invalid_combination(name, match):
    with pytest.raises(ValueError, match=match):
        parse_config(name)


def test_parse_configs_splits_dedupes_and_puts_control_first():
    assert parse_config_list(["naive, rotated64", "naive,control", " rotated128+scaling ,"]) == [
        "control", "naive", "rotated64", "rotated128+scaling"]
    assert parse_config_list([","]) == ["control"]
    assert parse_config_list([",".join(DEFAULT_CONFIGS)]) == DEFAULT_CONFIGS
    with pytest.raises(ValueError, match="unknown configuration 'bogus'"):
        parse_config_list(["naive,bogus"])
