"""Shared test setup: Hypothesis profiles and restoring the global state tests change.

Hypothesis profiles (``PYW8A8_HYPOTHESIS=<name>`` picks one explicitly):
  ci          derandomized (fixed examples), moderate max_examples; the default when CI is set
  dev         random examples, as many as ci; the default elsewhere
  exhaustive  many examples; also chosen by ``pytest -m exhaustive``
  sanitize    few examples, for the slow ASan/UBSan build of ``make sanitize``
"""
import os

import pytest
from hypothesis import HealthCheck, settings

import pyw8a8

_common = dict(
    deadline=None,
    # The autouse fixture below only restores global state; examples stay independent.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", max_examples=100, derandomize=True, **_common)
settings.register_profile("dev", max_examples=100, **_common)
settings.register_profile("exhaustive", max_examples=5000, **_common)
settings.register_profile("sanitize", max_examples=8, derandomize=True, **_common)


def _profile(config):
    name = os.environ.get("PYW8A8_HYPOTHESIS", "").strip()
    if name:
        return name
    if "exhaustive" in (config.getoption("markexpr", "") or ""):
        return "exhaustive"
    return "ci" if os.environ.get("CI") else "dev"


def pytest_configure(config):
    # An explicit --hypothesis-profile wins over the environment.
    if config.getoption("hypothesis_profile", None) is None:
        settings.load_profile(_profile(config))


def pytest_report_header(config):
    return (f"pyw8a8: isa={pyw8a8.isa()} available={pyw8a8.available_isas()} "
            f"threads={pyw8a8.get_num_threads()} "
            f"hypothesis-profile={settings.get_current_profile_name()}")


@pytest.fixture(params=pyw8a8.compiled_isas())
def any_isa(request):
    """Every compiled ISA, active for the test; skipped, with the reason, where this CPU
    cannot run it (its kernels still run in the emulated C build, tests/c)."""
    name = request.param
    if name not in pyw8a8.available_isas():
        pytest.skip(f"ISA {name}: this CPU lacks it (features: "
                    f"{[k for k, v in pyw8a8.cpu_features().items() if v]})")
    with pyw8a8.use_isa(name):
        yield name


@pytest.fixture(autouse=True)
def _restore_pyw8a8_state():
    """Tests switch ISAs and thread counts; put both back after each test."""
    isa = pyw8a8.isa()
    yield
    pyw8a8.set_isa(isa)
    pyw8a8.set_num_threads(None)


@pytest.fixture
def clean_env(monkeypatch):
    """No ``PYW8A8_*`` variable in the environment for the test; returns `monkeypatch`, to set
    some."""
    for var in list(os.environ):
        if var.startswith("PYW8A8_"):
            monkeypatch.delenv(var)
    return monkeypatch
