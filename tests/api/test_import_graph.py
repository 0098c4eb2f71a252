"""The package's shape: no import circle between its modules (function-level imports
included, which is where circles hide), no module importing a name back from the package's
``__init__`` (a subpackage's public names may be imported from its ``__init__``), and at
most 12 modules at the package root (the API and its plumbing; the lab tools live in
``pyw8a8.tools``, the evaluation in ``pyw8a8.evaluate``), which load on first access
after ``import pyw8a8``."""
import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pyw8a8"
MAX_ROOT_MODULES = 12


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _exists(name, modules):
    """A Python module or package of pyw8a8, or a compiled one (its .pyx)."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return name in modules or path.with_suffix(".pyx").exists()


def _imports(name, path, modules):
    """(target module, the imported name when it comes from a package's __init__) of every
    pyw8a8 import in the module `name`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pyw8a8":
                    yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "pyw8a8":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if _exists(sub, modules):
                    yield sub, None
                else:
                    yield source, alias.name


def _graph():
    modules = _modules()
    return {name: list(_imports(name, path, modules)) for name, path in modules.items()}


def test_no_module_imports_back_from_the_package_root():
    """``from .. import isa`` in a submodule runs back up to ``pyw8a8/__init__`` (which
    imports nearly everything): each module imports from the module that defines a name."""
    offenders = [(name, what) for name, edges in _graph().items() if name != "pyw8a8"
                 for target, what in edges if target == "pyw8a8"]
    assert offenders == []


def test_no_import_circle():
    graph = {name: {t for t, _ in edges if t != name} for name, edges in _graph().items()}
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph or nxt == "pyw8a8":
                continue  # compiled modules import nothing of ours; the root is the API
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError(f"import circle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_at_most_12_modules_at_the_package_root():
    root = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_subpackages_load_on_first_access_after_import_pyw8a8():
    """``import pyw8a8`` then ``pyw8a8.router`` (and the others the README names) works,
    while the import itself loads none of them (dask would cost a second)."""
    code = textwrap.dedent("""
        import sys, pyw8a8
        loaded = [m for m in ("dask", "pyw8a8.dask", "pyw8a8.router", "pyw8a8.evaluate")
                  if m in sys.modules]
        assert not loaded, loaded
        assert pyw8a8.router.Router is sys.modules["pyw8a8.router"].Router
        assert pyw8a8.metrics is sys.modules["pyw8a8.evaluate.metrics"]
        assert callable(pyw8a8.metrics.kl_divergence)
        assert pyw8a8.evaluate.main and pyw8a8.tools and pyw8a8.models
        assert {"dask", "evaluate", "metrics", "models", "router", "tools",
                "torch"} <= set(dir(pyw8a8))
        hidden = {"importlib", "sys", "_kernels", "_dispatch", "_cpu"} & set(dir(pyw8a8))
        assert not hidden, dir(pyw8a8)
        try:
            pyw8a8.no_such_name
        except AttributeError as error:
            assert str(error) == "module 'pyw8a8' has no attribute 'no_such_name'"
        else:
            raise AssertionError("no AttributeError")
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent,
                   timeout=120)


def test_pyw8a8_dask_after_import_pyw8a8():
    pytest.importorskip("dask.array")
    code = "import pyw8a8; print(pyw8a8.dask.matmul.__module__)"
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "pyw8a8.dask"


def test_every_file_the_internals_page_names_exists():
    """The code map of docs/guide/internals.md names files that exist: a module named
    relative to the package (``router/cache.py``), its ``_simd`` folder (``avx2.h``) or the
    repository (``tests/...``)."""
    root = PACKAGE.parent
    page = (root / "docs" / "guide" / "internals.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/]+\.(?:py|pyx|pxd|h))`", page))
    assert len(named) > 40  # the page's tables still name the modules
    missing = [name for name in sorted(named)
               if not any((base / name).is_file()
                          for base in (PACKAGE, PACKAGE / "_simd", root))]
    assert missing == []
