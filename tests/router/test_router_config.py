"""RouterConfig: its defaults, its validation, and the ``PYW8A8_*`` variables it reads
(every malformed value named in the message)."""
import pytest

from pyw8a8.router import RouterConfig


def test_config_defaults():
    c = RouterConfig()
    assert (c.min_k, c.skip_rows, c.include, c.exclude) == (0, None, [], [])
    assert (c.verbose, c.rotate, c.block, c.seed, c.scaling) == (False, True, 128, 0, False)


@pytest.mark.parametrize(
    "kw", [{"block": 96}, {"block": 0}, {"min_k": -1}, {"skip_rows": 0}, {"include": [1]},
           {"min_k": 1.5}, {"seed": "x"}]
)
def test_config_validation(kw):
    with pytest.raises(ValueError):
        RouterConfig(**kw)


def test_from_env_all_variables():
    env = {
        "PYW8A8_MIN_K": "512",
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
    assert c.min_k == 512 and c.skip_rows == 100000
    assert c.include == ["blk.*", "output"]
    assert c.exclude == ["*attn_k*", "*attn_v*"]
    assert c.verbose is True and c.rotate is False and c.scaling is True
    assert c.block == 64 and c.seed == 7


def test_from_env_empty_and_overrides():
    assert RouterConfig.from_env({}) == RouterConfig()
    c = RouterConfig.from_env({"PYW8A8_SKIP_ROWS": "0", "PYW8A8_ROTATE": "1"}, rotate=False)
    assert c.skip_rows is None and c.rotate is False
    assert RouterConfig.from_env({"PYW8A8_SKIP_ROWS": "none"}).skip_rows is None


def test_from_env_reads_os_environ(monkeypatch):
    monkeypatch.setenv("PYW8A8_MIN_K", "33")
    assert RouterConfig.from_env().min_k == 33


@pytest.mark.parametrize(
    "var,value",
    [
        ("PYW8A8_MIN_K", "abc"),
        ("PYW8A8_MIN_K", "-3"),
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
