"""Sphinx configuration of pyw8a8's documentation: a user guide in Markdown (MyST) and an
API reference generated from the numpydoc docstrings.

Build (CI does the same, with warnings as errors: tests/api/test_docs.py in the test
environment, and .ci/run in a fresh one that has the [docs] extra alone):

    pip install -e ".[docs]"
    sphinx-build -W -b html docs docs/_build/html
"""
import importlib.util
import sys
from pathlib import Path

# Document this checkout's package (built in place), whichever pyw8a8 is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyw8a8  # noqa: E402

project = "pyw8a8"
author = "The pyw8a8 authors"
copyright = "2026, The pyw8a8 authors"
release = pyw8a8.__version__
version = release

extensions = [
    "myst_parser",  # the guide pages are Markdown, as the README they came from
    "sphinx.ext.autodoc",
    "numpydoc",  # the docstrings' Parameters / Returns / Examples sections
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # [text](#a-heading) links, as on GitHub

# The reference documents each public name once, where pyw8a8/__init__ exports it; class
# members are listed by autodoc, so numpydoc's own member tables (which would need
# autosummary pages) are off.
numpydoc_show_class_members = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the numpydoc sections already give every type
# pyw8a8.torch (and for its Int8Cache transformers) and pyw8a8.dask import their
# libraries, which the [docs] extra leaves out: where one is missing, autodoc reads the
# docstrings against a stand-in.
autodoc_mock_imports = [m for m in ("torch", "transformers", "dask", "distributed")
                        if importlib.util.find_spec(m) is None]
if "torch" in autodoc_mock_imports:
    # pyw8a8.torch builds its C++ operator on import, which a stand-in torch cannot.
    autodoc_mock_imports.append("pyw8a8.torch._native")

html_theme = "alabaster"
html_title = f"pyw8a8 {release}"
