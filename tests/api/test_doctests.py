"""The Examples sections of the public API run and check what they show.

Only the public modules are collected (not the lab in ``pyw8a8.tools``, the evaluation or
the model, whose imports are heavy); outputs that depend on the CPU are written with the
``...`` ellipsis or as comparisons.
"""
import doctest
import importlib
import inspect
import sys

import pytest

import pyw8a8

PUBLIC_MODULES = [
    "pyw8a8", "pyw8a8._cpu", "pyw8a8._threads", "pyw8a8._thread_policy", "pyw8a8.matmul",
    "pyw8a8.packing", "pyw8a8.quantize", "pyw8a8.rotation", "pyw8a8.scaling", "pyw8a8.dask",
    "pyw8a8.router", "pyw8a8.router.cache", "pyw8a8.router.config", "pyw8a8.router.layers",
    "pyw8a8.router.packed_file", "pyw8a8.router.routing",
]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def module(name):
    importlib.import_module(name)
    return sys.modules[name]  # pyw8a8.matmul is also a function's name


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_examples_run(name):
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = []  # what each failed example expected and got
    for test in doctest.DocTestFinder().find(module(name), name, globs={}):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def has_example(obj):
    doc = inspect.getdoc(obj) or ""
    return "Examples\n--------" in doc and ">>>" in doc


def test_every_public_name_has_examples():
    missing = [name for name in pyw8a8.__all__ if not has_example(getattr(pyw8a8, name))]
    assert missing == []


def test_examples_are_collected():
    """The runner above finds the examples: a module without any would pass silently."""
    found = sum(len(t.examples) for t in doctest.DocTestFinder().find(
        module("pyw8a8.rotation"), "pyw8a8.rotation", globs={}))
    assert found >= 10


def test_help_signatures_read_as_written():
    """help(pyw8a8.matmul) shows ``x: 'npt.ArrayLike'``, not numpy's typing internals."""
    for name in pyw8a8.__all__:
        obj = getattr(pyw8a8, name)
        if callable(obj):
            try:
                signature = str(inspect.signature(obj))
            except ValueError:  # a compiled function without one
                continue
            assert "numpy._typing" not in signature and "Union[" not in signature, \
                (name, signature)
