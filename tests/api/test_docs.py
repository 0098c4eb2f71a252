"""The documentation: the README's and the user guide's examples run, their links lead
somewhere, the API reference names every public name, and Sphinx builds the pages with
warnings as errors (when Sphinx is installed: the [docs] extra, part of [test])."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyw8a8
import pyw8a8.dask
import pyw8a8.router

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
# Examples that need what a test machine lacks, by a string that marks them, and why.
NOT_RUN = {"tcp://scheduler-host:8786": "needs a running dask scheduler"}
if importlib.util.find_spec("torch") is None:
    NOT_RUN["import torch"] = ("needs PyTorch, which is not installed "
                               "(pip install \".[torch]\" adds it)")


def python_blocks(page):
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(page, tmp_path, monkeypatch, capsys):
    """A page's python blocks run in order in one namespace, as a reader would paste them
    (in a scratch directory: some write files)."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    ran, not_run = 0, set()
    for number, block in enumerate(python_blocks(page), 1):
        reasons = {why for marker, why in NOT_RUN.items() if marker in block}
        if reasons:
            not_run |= reasons
            continue
        exec(compile(block, f"{page.name} example {number}", "exec"), namespace)
        ran += 1
    if not ran:
        # Nothing on the page could run here: a skip that says why, not a pass that
        # checked nothing (the page has python blocks, or it would not be a parameter).
        pytest.skip(f"every example of {page.name} {'; '.join(sorted(not_run))}")
    if page.name == "README.md":  # what its router example's comment says it prints
        assert capsys.readouterr().out.splitlines()[-1] == "1 1"


def test_a_page_whose_examples_all_need_a_missing_package_is_skipped(tmp_path, monkeypatch,
                                                                     capsys):
    # Every example of the PyTorch guide imports torch: where torch is missing (marked so
    # here, whether or not it is installed), the page is skipped with the reason.
    monkeypatch.setitem(NOT_RUN, "import torch", "needs PyTorch, which is not installed")
    with pytest.raises(pytest.skip.Exception,
                       match="every example of pytorch.md needs PyTorch"):
        test_examples_run(ROOT / "docs" / "guide" / "pytorch.md", tmp_path, monkeypatch,
                          capsys)

def test_readme_opens_with_the_two_commands_then_install_and_use():
    # The project's standing rule: the README starts with its two set-up commands (the main
    # job, the tests); a newcomer's install and examples follow at once.
    text = (ROOT / "README.md").read_text()
    sections = re.findall(r"^## (.*)$", text, flags=re.M)
    assert sections[:5] == ["Commands", "Install", "Use", "PyTorch",
                            "W8A8 in your own numpy model"]
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines()
    assert "python -m pyw8a8 bench" in first_block[0] and "python -m pytest" in first_block[1]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [link for link in links if "://" not in link
               and not (page.parent / link).exists()]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_table_rows_have_the_header_cells(page):
    """A '|' in a cell, even inside a code span, ends the cell unless escaped ('\\|')."""
    bad, header = [], None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = len(re.findall(r"(?<!\\)\|", line)) - 1
        if header is None:
            header = cells
        elif cells != header:
            bad.append(number)
    assert bad == []


def test_api_reference_names_every_public_name():
    text = (ROOT / "docs" / "api.rst").read_text()
    current = ""
    names = set()
    for line in text.splitlines():  # names are relative to the currentmodule before them
        if line.startswith(".. currentmodule:: "):
            current = line.split(":: ")[1]
        match = re.match(r"\.\. auto(?:function|class|data):: ([\w.]+)", line)
        if match:
            name = match[1]
            names.add(name if name.startswith("pyw8a8.") else f"{current}.{name}")
    expected = ({f"pyw8a8.{n}" for n in pyw8a8.__all__} |
                {f"pyw8a8.dask.{n}" for n in ("pack_weight", "matmul", "SharedWeight")} |
                {f"pyw8a8.router.{n}" for n in pyw8a8.router.__all__
                 if n != "PACKED_FORMAT_VERSION" and n not in pyw8a8.__all__} |
                {"pyw8a8.router.packed_file.PACKED_FORMAT_VERSION"} |
                {f"pyw8a8.torch.{n}" for n in ("Linear", "GatedLinear", "quantize",
                                                "QuantizeReport", "Decision")})
    assert sorted(expected - names) == []


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in ("sphinx", "myst_parser", "numpydoc")),
                    reason="Sphinx, myst-parser or numpydoc is not installed ([docs] extra)")
def test_sphinx_builds_without_warnings(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "html" / "api.html").is_file()
