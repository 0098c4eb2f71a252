"""``bench --record`` and ``eval --record``: the dated record of a run
(pyw8a8/lab/record.py)."""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import pyw8a8
from pyw8a8.lab import record
from pyw8a8.tools import bench

CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
cpu family\t: {family}
model\t\t: {model}
model name\t: {name}
flags\t\t: fpu sse2

processor\t: 1
vendor_id\t: SomethingElse
"""


@pytest.mark.parametrize("vendor, family, model, name, amx, kind", [
    ("AuthenticAMD", 25, 0x01, "AMD EPYC 7763 64-Core Processor", False, "zen3"),
    ("AuthenticAMD", 25, 0x21, "AMD Ryzen 9 5950X 16-Core Processor", False, "zen3"),
    ("AuthenticAMD", 25, 0x11, "AMD EPYC 9R14 96-Core Processor", False, "zen4"),
    ("AuthenticAMD", 25, 0x61, "AMD Ryzen 9 7950X 16-Core Processor", False, "zen4"),
    ("AuthenticAMD", 25, 0xA0, "AMD EPYC", False, "zen4"),
    ("AuthenticAMD", 26, 0x02, "AMD EPYC 9R45", False, "zen5"),
    ("GenuineIntel", 6, 0x8F, "Intel(R) Xeon(R) Platinum 8488C", True, "xeon-amx"),
    # Without a kind of its own: the model name's slug and the CPU's best ISA.
    ("GenuineIntel", 6, 0x55, "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz", False,
     "intel-xeon-platinum-8259cl-avx2"),
    ("AuthenticAMD", 23, 0x31, "AMD EPYC 7R32 48-Core Processor", False, "amd-epyc-7r32-avx2"),
])
def test_the_record_names_the_cpu_kind(vendor, family, model, name, amx, kind):
    fields = record.cpuinfo_fields(CPUINFO.format(vendor=vendor, family=family, model=model,
                                                  name=name))
    assert fields["vendor_id"] == vendor and record.cpu_model(fields) == name
    assert record.cpu_kind(fields, {"amx_int8": amx}, "avx2") == kind


def test_the_record_of_a_cpu_without_cpuinfo_fields_is_named_by_its_platform():
    import platform

    kind = record.cpu_kind({}, {}, "scalar_u8s8")
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*-scalar-u8s8", kind), kind
    assert kind.startswith(re.sub(r"[^a-z0-9]+", "-", (platform.processor() or
                                                         platform.machine()).lower())[:4])


def _git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_record_names_the_commit_of_a_checkout_dirty_or_not(tmp_path):
    if not shutil.which("git"):
        pytest.skip("needs git")
    package = tmp_path / "repo" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    repo = package.parent
    _git(repo, "init", "-q")
    _git(repo, "add", "pkg/__init__.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert record.source_commit(package) == head
    (package / "other.txt").write_text("untracked files are not changes\n")
    assert record.source_commit(package) == head
    # A record's own files, changed by the run that writes them, are no change of the code
    # when the record names its directory; another directory's, or one outside the
    # checkout, changes nothing.
    records = repo / "records"
    records.mkdir()
    (records / "run.md").write_text("one\n")
    _git(repo, "add", "records/run.md")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "two")
    head = _git(repo, "rev-parse", "HEAD")
    (records / "run.md").write_text("two\n")
    assert record.source_commit(package, ignore=records) == head
    assert record.source_commit(package, ignore=tmp_path / "elsewhere") == f"{head}-dirty"
    assert record.source_commit(package) == f"{head}-dirty"
    _git(repo, "checkout", "-q", "records/run.md")
    (package / "__init__.py").write_text("x = 2\n")
    assert record.source_commit(package) == f"{head}-dirty"
    assert record.source_commit(package, ignore=records) == f"{head}-dirty"
    # Files git does not track (an installed copy inside a checkout) and no checkout at all.
    copy = repo / "venv" / "pkg"
    copy.mkdir(parents=True)
    (copy / "__init__.py").write_text("x = 1\n")
    assert record.source_commit(copy) == "unknown"
    outside = tmp_path / "plain" / "pkg"
    outside.mkdir(parents=True)
    (outside / "__init__.py").write_text("x = 1\n")
    assert record.source_commit(outside) == "unknown"


def test_bench_record_keeps_the_run_its_machine_versions_commit_and_command(
        tmp_path, monkeypatch, capsys):
    """``bench --record DIR`` on the smallest run the bench offers: what it printed, with its
    table rows as markdown, goes to DIR/YYYY-MM-DD-<cpu kind>.md, with the CPU, the threads,
    the versions, the commit and the command, and its chart to the .svg beside it; a second
    run that day is appended."""
    import datetime

    # The bandwidth probe reads a 1 GiB buffer and the rotation's cost times 2048-wide
    # products: neither is what this test checks.
    monkeypatch.setattr(bench.roofline, "read_bandwidth_gbs", lambda *a, **k: 10.0)
    monkeypatch.setattr(bench, "print_rotation", lambda *a, **k: print("rotation: skipped"))
    directory = tmp_path / "records" / "new"  # made where missing
    argv = ["--no-peers", "--isa", "scalar", "--shapes", "1,64,64;2,64,128", "--rounds", "1",
            "--min-time", "0.001", "--record", str(directory)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    path, picture = sorted(directory.iterdir())  # the record and its chart
    today = datetime.date.today().isoformat()
    kind = record.cpu_kind(record.cpuinfo_fields(), pyw8a8.cpu_features(),
                           pyw8a8.available_isas()[0])
    assert path.name == f"{today}-{kind}.md"
    assert picture.name == f"{today}-{kind}.svg" and f"chart: {picture.name}" in printed
    assert picture.read_text().startswith("<svg ")
    assert printed.rstrip().endswith(f"recorded in {path}")
    text = path.read_text()
    assert text.startswith(f"# pyw8a8 bench on {kind}, {today}\n")
    assert text.count("\n## Run of ") == 1
    rows = [line for line in printed.splitlines() if line.startswith("|")]
    assert [r.split(" | ")[:3] for r in rows[2:4]] == [["| 1", "64", "64"], ["| 2", "64", "128"]]
    for line in rows:  # every table line, as a markdown table line of the record
        assert f"\n{line}\n" in text
    assert f"\n\n{rows[0]}\n" in text  # a table starts after a blank line
    assert "```text\nCPU: " in text and "rotation: skipped" in text
    fields = dict(re.findall(r"^- (\w[\w ]*): (.*)$", text, flags=re.M))
    assert fields["command"] == (f"`python -m pyw8a8 bench --no-peers --isa scalar --shapes "
                                 f"'1,64,64;2,64,128' --rounds 1 --min-time 0.001 --record "
                                 f"{directory}`")
    assert fields["date"].startswith(today)
    assert fields["commit"] == record.source_commit()
    package = os.path.dirname(pyw8a8.__file__)
    if _tracked(package):  # run from a checkout: its HEAD, with -dirty for changes
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", fields["commit"])
        assert fields["commit"].startswith(_git(package, "rev-parse", "HEAD"))
    else:
        assert fields["commit"] == "unknown"
    assert fields["CPU"].startswith(record.cpu_model(record.cpuinfo_fields()))
    assert fields["CPU"].endswith(f"kind: {kind})")
    features = [k for k, v in pyw8a8.cpu_features().items() if v]
    assert fields["ISA features"].startswith(", ".join(features))
    assert fields["threads"].startswith(f"{pyw8a8.get_num_threads()} (")
    import platform
    assert fields["versions"].startswith(f"python {platform.python_version()}, numpy "
                                         f"{np.__version__}, pyw8a8 {pyw8a8.__version__}")
    # A table run of other shapes keeps the day's chart (the docs show the standard grid's).
    drawn = picture.read_text()
    assert bench.main(argv[:3] + ["--shapes", "1,64,32"] + argv[5:]) == 0
    assert f"chart: {picture.name} kept" in capsys.readouterr().out
    assert picture.read_text() == drawn
    text = path.read_text()
    # Another run the same day: a further section of the same file.
    assert record.write(directory, "| a | b |\n|---|---|\n| 1 | 2 |\n", "again") == path
    again = path.read_text()
    assert again.startswith(text) and again.count("\n## Run of ") == 3
    assert "\n- command: `again`\n" in again[len(text):]
    assert again.rstrip().endswith("| a | b |\n|---|---|\n| 1 | 2 |")


def test_the_record_names_the_variables_that_hold_libraries_to_an_isa(tmp_path, monkeypatch):
    """A run with every library held to AVX2 says so in its record; other variables, and
    Inductor's cache directory, which torch sets itself, stay out of it."""
    held = {"ATEN_CPU_CAPABILITY": "avx2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
            "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "OPENBLAS_CORETYPE": "Haswell", "PYW8A8_ISA": "avx2"}
    for name, value in held.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SOMETHING_ELSE", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/set-by-torch")
    text = record.write(tmp_path, "| a |\n|---|\n| 1 |\n", "bench").read_text()
    [line] = [line for line in text.splitlines() if line.startswith("- environment: ")]
    named = dict(item.split("=", 1) for item in line[len("- environment: "):].split())
    assert {k: named[k] for k in held} == held
    assert "SOMETHING_ELSE" not in named and "TORCHINDUCTOR_CACHE_DIR" not in named


def _tracked(package):
    try:
        return subprocess.run(["git", "-C", package, "ls-files", "--error-unmatch",
                               "__init__.py"], capture_output=True).returncode == 0
    except OSError:
        return False


def test_bench_record_refuses_a_directory_it_cannot_write_before_measuring(tmp_path, capsys):
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(SystemExit) as exit:
        bench.main(["--no-peers", "--record", str(taken)])
    assert exit.value.code == 2
    err = capsys.readouterr()
    assert "--record" in err.err and str(taken) in err.err and err.out == ""


def test_bench_help_documents_record(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    assert "--record DIR" in re.sub(r"\s+", " ", capsys.readouterr().out)
