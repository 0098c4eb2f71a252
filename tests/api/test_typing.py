"""The type information users get: ``mypy --strict`` on a script that calls every public
function (tests/api/typing/user_script.py), the compiled modules' stubs against the modules
(mypy's stubtest), and the marker that makes an installed pyw8a8 typed at all."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pyw8a8

pytest.importorskip("mypy", reason="mypy is not installed (it is in the [test] extra)")

ROOT = Path(__file__).resolve().parents[2]
USER_SCRIPT = ROOT / "tests" / "api" / "typing" / "user_script.py"
# As a user's mypy sees an installed typed package: its annotations are read, the errors
# inside it are not the user's (an installed package is always followed silently).
MYPY = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
        "--config-file", str(ROOT / "pyproject.toml")]


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    return ["--cache-dir", str(tmp_path_factory.mktemp("mypy_cache"))]


def run(args):
    # This checkout's pyw8a8, whatever another one the environment has installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_package_is_marked_typed():
    package = Path(pyw8a8.__file__).parent
    assert (package / "py.typed").is_file()
    for module in ("_dispatch", "_kernels", "_outputs", "_rows", "_probes"):
        assert (package / f"{module}.pyi").is_file(), module


def test_user_script_uses_every_public_name():
    import pyw8a8.dask
    import pyw8a8.router
    text = USER_SCRIPT.read_text()
    names = ([f"pyw8a8.{n}" for n in pyw8a8.__all__] +
             [f"pyw8a8.dask.{n}" for n in ("pack_weight", "matmul", "SharedWeight")] +
             list(pyw8a8.router.__all__))
    assert [n for n in names if n not in text] == []


def test_user_script_passes_mypy_strict(mypy_cache):
    result = run(MYPY + mypy_cache + [str(USER_SCRIPT)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_rejects_a_wrong_call(mypy_cache, tmp_path):
    """The annotations are read: a bad argument and a misused result are errors."""
    script = tmp_path / "wrong.py"
    script.write_text("import numpy as np\nimport pyw8a8\n"
                      "y = pyw8a8.rotate(np.ones((2, 64), np.float32), block='64')\n"
                      "n: str = pyw8a8.get_num_threads()\n")
    result = run(MYPY + mypy_cache + [str(script)])
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'Argument "block" to "rotate" has incompatible type "str"' in result.stdout
    assert 'has type "int", variable has type "str"' in result.stdout


def test_user_script_runs():
    result = run([sys.executable, str(USER_SCRIPT)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


def test_compiled_module_stubs_match_the_modules(mypy_cache):
    result = run([sys.executable, "-m", "mypy.stubtest", "--mypy-config-file",
                  str(ROOT / "pyproject.toml"), "--allowlist",
                  str(ROOT / "tests" / "api" / "typing" / "stubtest_allowlist.txt"),
                  "pyw8a8._dispatch", "pyw8a8._kernels", "pyw8a8._outputs", "pyw8a8._rows",
                  "pyw8a8._probes"])
    assert result.returncode == 0, result.stdout + result.stderr
