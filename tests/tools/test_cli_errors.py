"""Hostile input at the command line: every usage or environment error of ``python -m
pyw8a8 ...`` ends with one line on stderr and exit status 2, never a traceback.

The commands run in subprocesses, as a user runs them (a bad ``PYW8A8_*`` setting fails
while the package is imported, before any code of the command runs); the properties call
the parsers in process, for speed.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pyw8a8
from pyw8a8.tools import bench, bench_options, quality

REPO = Path(__file__).resolve().parents[2]


def run_cli(args, **variables):
    """``python -m <args>`` with no PYW8A8_* variable but `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYW8A8_")}
    env.update(variables)
    return subprocess.run([sys.executable, "-m", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def assert_usage_error(result, names):
    """Exit status 2, no traceback, and a last stderr line naming what was wrong."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() and "Traceback" not in result.stderr, result.stderr
    assert names in result.stderr.strip().splitlines()[-1], result.stderr


@pytest.mark.parametrize("args, names", [
    (["bench", "--shapes", "0,64,64"], "--shapes"),
    (["bench", "--shapes", "1,2"], "--shapes"),
    (["bench", "--shapes", "a,b,c"], "--shapes"),
    (["bench", "--shapes", "1,64,64;"], "--shapes"),  # an empty item, not the default grid
    (["bench", "--rounds", "0"], "--rounds"),
    (["bench", "--min-time", "-1"], "--min-time"),
    (["bench", "--min-time", "nan"], "--min-time"),
    (["bench", "--dask-chunk", "0"], "--dask-chunk"),
    (["bench", "--dask-shape", "1,2"], "--dask-shape"),
    (["bench", "--crossover", "no-such-isa", "scalar"], "--crossover"),
    (["info", "--isa", "no-such-isa"], "--isa"),
    (["quality", "--width", "192"], "--width 192"),  # the default block 128 does not divide it
    (["quality", "--tokens", "-1"], "--tokens"),
    (["quality", "--seed", "-1"], "--seed"),
    (["eval", "--out", "/dev/null/x"], "--out"),
    (["nosuch"], "'nosuch'"),
])
def test_a_bad_command_line_is_one_line_and_status_2(args, names):
    assert_usage_error(run_cli(["pyw8a8", *args]), names)


BAD_SETTINGS = [("PYW8A8_ISA", "bogus"), ("PYW8A8_THREAD_POLICY", "sometimes"),
                ("PYW8A8_AMX_MIN_ROWS", "many"),
                # libgomp crashed or exited the process when it could not create them
                ("OMP_NUM_THREADS", str(8 * (os.cpu_count() or 1) + 1)),
                ("OMP_NUM_THREADS", "100000,2")]
# An ISA compiled in but not runnable on this CPU raises RuntimeError rather than ValueError.
BAD_SETTINGS += [pytest.param("PYW8A8_ISA", name, id=f"PYW8A8_ISA={name} (this CPU lacks it)")
                 for name in pyw8a8.compiled_isas() if name not in pyw8a8.available_isas()]


@pytest.mark.parametrize("module", ["pyw8a8", "pyw8a8.evaluate"])
@pytest.mark.parametrize("variable, value", BAD_SETTINGS)
def test_a_bad_setting_is_one_line_and_status_2(module, variable, value):
    # --help would exit 0 if the setting were not checked: the status tells the two apart.
    result = run_cli([module, "--help"], **{variable: value})
    assert_usage_error(result, variable)
    assert result.stderr.startswith("pyw8a8: ") and len(result.stderr.splitlines()) == 1


def test_a_bad_setting_still_raises_value_error_on_import():
    """Only the command line turns it into an exit: a library user gets the exception."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYW8A8_")}
    result = subprocess.run([sys.executable, "-c", "import pyw8a8"], cwd=REPO,
                            env={**env, "PYW8A8_ISA": "bogus"}, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1
    assert "ValueError: PYW8A8_ISA='bogus'" in result.stderr.splitlines()[-1]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_commands(flag):
    result = run_cli(["pyw8a8", flag])
    assert result.returncode == 0 and not result.stderr
    lines = result.stdout.splitlines()
    for name in ("info", "bench", "eval", "quality"):
        assert sum(line.split()[:1] == [name] for line in lines) == 1, result.stdout


def test_version_prints_the_package_s():
    result = run_cli(["pyw8a8", "--version"])
    assert result.returncode == 0 and not result.stderr
    assert result.stdout == f"pyw8a8 {pyw8a8.__version__}\n"


@pytest.mark.parametrize("command, option", [("bench", "--shapes"), ("info", "--rounds"),
                                             ("quality", "--blocks")])
def test_a_command_help_shows_its_own_options(command, option):
    result = run_cli(["pyw8a8", command, "--help"])
    assert result.returncode == 0
    assert result.stdout.startswith(f"usage: python -m pyw8a8 {command} ")
    assert option in result.stdout


# Text near the accepted forms (signs, spaces, separators, dots) and arbitrary text.
NEAR_NUMBERS = st.from_regex(r"[-+ ]?[0-9]{0,3}([.,;][-0-9]{0,3}){0,4}|nan|-?inf",
                             fullmatch=True)
TEXT = NEAR_NUMBERS | st.text(max_size=20)


@given(TEXT)
def test_the_bench_parsers_return_valid_values_or_raise_value_error(text):
    for parse, valid in ((bench_options.parse_count, lambda v: isinstance(v, int) and v >= 1),
                         (bench_options.parse_seconds, lambda v: 0 < v < float("inf")),
                         (bench_options.parse_shape, lambda v: len(v) == 3 and min(v) >= 1)):
        try:
            value = parse(text)
        except ValueError as exc:
            assert repr(text) in str(exc)  # the message quotes what was given
        else:
            assert valid(value), (parse, text, value)
    try:
        shapes = bench_options.parse_shapes(text)
    except ValueError:
        return
    assert len(shapes) == text.count(";") + 1


@given(st.lists(st.tuples(*[st.integers(1, 10**6)] * 3), min_size=1, max_size=4))
def test_parse_shapes_reads_back_what_it_is_given(shapes):
    assert bench_options.parse_shapes(";".join(",".join(map(str, s)) for s in shapes)) == shapes


def _rejects(parse, text):
    try:
        parse(text)
    except ValueError:
        return True
    return False


@pytest.fixture
def no_work(monkeypatch):
    """Fail, rather than run a benchmark, if a value a parser rejects got through."""
    def refuse(*args, **kwargs):
        raise AssertionError("a bad option reached the measurement")
    monkeypatch.setattr(bench, "_machine_info", refuse)  # every bench mode starts with it
    monkeypatch.setattr(quality, "synthetic_ffn", refuse)


OPTIONS = [(bench.main, "--rounds", bench_options.parse_count),
           (bench.main, "--dask-chunk", bench_options.parse_count),
           (bench.main, "--min-time", bench_options.parse_seconds),
           (bench.main, "--shapes", bench_options.parse_shapes),
           (bench.main, "--dask-shape", bench_options.parse_shape),
           (quality.main, "--tokens", int),
           (quality.main, "--width", int),
           (quality.main, "--hidden", int)]


@settings(max_examples=25)
@given(st.sampled_from(OPTIONS), TEXT)
def test_a_rejected_value_exits_with_status_2(no_work, capsys, option, text):
    main, name, parse = option
    assume(_rejects(parse, text))
    with pytest.raises(SystemExit) as exit_:
        main([f"{name}={text}"])  # the = form: text starting with "-" stays the value
    assert exit_.value.code == 2
    assert name in capsys.readouterr().err.splitlines()[-1]


SIZES = st.sampled_from([0, 16, 48, 64, 96, 128, 256]) | st.integers(-2, 300)


@settings(max_examples=25)
@given(tokens=st.integers(-1, 4), width=SIZES, hidden=SIZES, outliers=st.integers(-1, 8),
       blocks=st.lists(st.sampled_from([-16, 0, 8, 16, 24, 32, 64, 128, 256, 8192]),
                       min_size=1, max_size=3),
       seed=st.sampled_from([-1, 0, 7, 2**32 - 1, 2**32]))
def test_quality_runs_what_it_accepts_and_refuses_the_rest(capsys, tokens, width, hidden,
                                                           outliers, blocks, seed):
    argv = [f"--tokens={tokens}", f"--width={width}", f"--hidden={hidden}",
            f"--outliers={outliers}", "--blocks", *map(str, blocks), f"--seed={seed}"]
    try:
        quality.check_options(tokens, width, hidden, outliers, blocks, seed)
    except ValueError as exc:
        assert str(exc).startswith("--")  # names the option
        with pytest.raises(SystemExit) as exit_:
            quality.main(argv)
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(str(exc))
    else:
        assert quality.main(argv) == 0
