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
import pyw8a8.attention
import pyw8a8.dask
import pyw8a8.router

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
# Examples that need what a test machine lacks, by a string that marks them, and why.
NOT_RUN = {"tcp://scheduler-host:8786": "needs a running dask scheduler",
           "/path/to/llm": "needs a language model's checkpoint (the PyTorch guide's recipe "
                           "runs on a small random one)"}
if importlib.util.find_spec("torch") is None:
    NOT_RUN["import torch"] = ("needs PyTorch, which is not installed "
                               "(pip install \".[torch]\" adds it)")
if importlib.util.find_spec("transformers") is None:
    NOT_RUN["import transformers"] = ("needs transformers, which is not installed "
                                      "(pip install \".[torch-model]\" adds it)")


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

def test_readme_is_short_and_in_the_newcomers_order():
    # The README is for a newcomer: what pyw8a8 is, the project's two set-up commands (the
    # main job, the tests), why to use it against its peers, how to install it, a numpy and
    # a PyTorch example within the first screen, then the guides; the figures and their
    # history live in the guides and in docs/benchmarks/.
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 160
    intro = text.split("\n\n")[1]
    assert len(re.split(r"(?<=\.)\s+", intro.strip())) == 3, intro  # three sentences
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S)
    assert text.index("```") == first_block.start()  # the commands come first
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ['pip install -e ".[bench]" && python -m pyw8a8 bench',
                        'pip install -e ".[test]" && python -m pytest']
    sections = re.findall(r"^## (.*)$", text, flags=re.M)
    assert sections[:2] == ["Why use it", "Install and use"]
    assert sections[-1] == "Documentation"
    why = text.split("## Why use it")[1].split("\n## ")[0]
    assert all(peer in why for peer in ("torch's dynamic int8", "torchao", "ONNX Runtime"))
    assert "does not lead" in why
    install = text.split("## Install and use")[1].split("\n## ")[0]
    assert 'pip install ".[torch]"' in install
    examples = [(m.start(), m.end()) for m in re.finditer(r"^```python\n.*?^```", text,
                                                          flags=re.S | re.M)]
    numpy_example, torch_example = (text[start:end] for start, end in examples[:2])
    assert "import torch" not in numpy_example and "import torch" in torch_example
    assert all(text.count("\n", 0, end) < 40 for _, end in examples[:2])
    assert text.index("## Install and use") < examples[0][0]


# A commit hash: a word of 7 to 40 hex digits, with a letter and a digit among them.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
USER_PAGES = [p for p in PAGES + [ROOT / "CHANGELOG.md"]
              if (ROOT / "docs" / "benchmarks") not in p.parents]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_commit_hash_outside_the_benchmark_record(page):
    # Which commit measured what is the record's business (docs/benchmarks/); a user page
    # states what holds now.
    assert COMMIT.findall(page.read_text()) == []


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
                {f"pyw8a8.attention.{n}" for n in pyw8a8.attention.__all__} |
                {f"pyw8a8.router.{n}" for n in pyw8a8.router.__all__
                 if n != "PACKED_FORMAT_VERSION" and n not in pyw8a8.__all__} |
                {"pyw8a8.router.packed_file.PACKED_FORMAT_VERSION"} |
                {f"pyw8a8.torch.{n}" for n in ("Linear", "GatedLinear", "quantize",
                                                "QuantizeReport", "Decision", "Int8Cache",
                                                "enable_int8_attention")})
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
