"""RouterConfig: its defaults, its validation, and the ``PYW8A8_*`` variables it reads
(every malformed value named in the message)."""
import warnings

import pytest

from pyw8a8.router import RouterConfig


def test_config_defaults():
    c = RouterConfig()
    assert (c.min_in_features, c.skip_rows, c.include, c.exclude) == (0, None, [], [])
    assert (c.verbose, c.rotate, c.block, c.seed, c.scaling) == (False, True, 128, 0, False)


@pytest.mark.parametrize(
    "kw", [{"block": 96}, {"block": 0}, {"min_in_features": -1}, {"skip_rows": 0},
           {"include": [1]}, {"min_in_features": 1.5}, {"seed": "x"}]
)
def test_config_validation(kw):
    with pytest.raises(ValueError):
        RouterConfig(**kw)


def test_from_env_all_variables():
    env = {
        "PYW8A8_MIN_IN_FEATURES": "512",
        "PYW8A8_SKIP_ROWS": "100000",
        "PYW8A8_INCLUDE": "blk.*, output ,",
        "PYW8A8_EXCLUDE": "*attn_k*,*attn_v*",
        "PYW8A8_VERBOSE": "yes",
        "PYW8A8_ROTATE": "0",
        "PYW8A8_BLOCK": "64",
        "PYW8A8_SCALING": "true",
        "PYW8A8_SEED": "7",
        "UNRELATED": "x",
    }
    c = RouterConfig.from_env(env)
    assert c.min_in_features == 512 and c.skip_rows == 100000
    assert c.include == ["blk.*", "output"]
    assert c.exclude == ["*attn_k*", "*attn_v*"]
    assert c.verbose is True and c.rotate is False and c.scaling is True
    assert c.block == 64 and c.seed == 7


def test_from_env_empty_and_overrides():
    assert RouterConfig.from_env({}) == RouterConfig()
    c = RouterConfig.from_env({"PYW8A8_SKIP_ROWS": "0", "PYW8A8_ROTATE": "1"}, rotate=False)
    assert c.skip_rows is None and c.rotate is False
    assert RouterConfig.from_env({"PYW8A8_SKIP_ROWS": "none"}).skip_rows is None


def test_from_env_reads_os_environ(clean_env):
    clean_env.setenv("PYW8A8_MIN_IN_FEATURES", "33")
    assert RouterConfig.from_env().min_in_features == 33


@pytest.mark.parametrize(
    "var,value",
    [
        ("PYW8A8_MIN_IN_FEATURES", "abc"),
        ("PYW8A8_MIN_IN_FEATURES", "-3"),
        ("PYW8A8_SKIP_ROWS", "1e5"),
        ("PYW8A8_VERBOSE", "maybe"),
        ("PYW8A8_ROTATE", "2"),
        ("PYW8A8_BLOCK", "100"),
        ("PYW8A8_BLOCK", "x"),
        ("PYW8A8_SEED", "0.5"),
    ],
)
def test_from_env_malformed_names_variable(var, value):
    with pytest.raises(ValueError, match=var):
        RouterConfig.from_env({var: value})


def test_min_k_is_the_deprecated_name_of_min_in_features():
    """The setting pyw8a8.torch.quantize calls min_in_features was the Router's min_k:
    that name, as a keyword, an attribute or PYW8A8_MIN_K, still works, with a warning
    naming the new one; both names at once are an error naming them."""
    with pytest.warns(DeprecationWarning, match="min_k=.*min_in_features="):
        c = RouterConfig(min_k=64)
    assert c == RouterConfig(min_in_features=64)
    with pytest.warns(DeprecationWarning, match="min_k=.*min_in_features="):
        assert c.with_(min_k=32) == RouterConfig(min_in_features=32)
    with pytest.warns(DeprecationWarning, match="min_k.*min_in_features"):
        assert c.min_k == 64
    with pytest.warns(DeprecationWarning, match="PYW8A8_MIN_K.*PYW8A8_MIN_IN_FEATURES"):
        assert RouterConfig.from_env({"PYW8A8_MIN_K": "16"}) == RouterConfig(
            min_in_features=16)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="PYW8A8_MIN_K="):
        RouterConfig.from_env({"PYW8A8_MIN_K": "-1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in (lambda: RouterConfig(min_k=1, min_in_features=2),
                     lambda: c.with_(min_k=1, min_in_features=2)):
            with pytest.raises(TypeError, match="min_in_features=.*min_k="):
                call()
        with pytest.raises(ValueError, match="PYW8A8_MIN_IN_FEATURES.*PYW8A8_MIN_K"):
            RouterConfig.from_env({"PYW8A8_MIN_K": "1", "PYW8A8_MIN_IN_FEATURES": "2"})
        RouterConfig.from_env({"PYW8A8_MIN_IN_FEATURES": "8"})  # the new name: no warning
