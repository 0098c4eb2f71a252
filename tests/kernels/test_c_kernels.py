"""The C-level kernel tests (tests/c): natively, with every x86 ISA's intrinsics emulated,
and the Arm NEON ISAs under qemu.  tests/c/run.sh builds and runs each; the C program
prints one "tested <ISA>" line per ISA and closes with "N passed, N failed"."""
import os
import platform
import re
import shutil
import subprocess
import sys

import pytest

import pyw8a8

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
X86 = platform.machine().lower() in ("x86_64", "amd64")
SKIPPED = 77

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("cc") is None,
                                reason="needs bash and a C compiler")


def run_c_tests(mode):
    """Output of tests/c/run.sh `mode`, after checking that every check passed."""
    run = subprocess.run(["bash", os.path.join(ROOT, "tests", "c", "run.sh"), mode],
                         capture_output=True, text=True, timeout=1200,
                         env=dict(os.environ, PYTHON=sys.executable))
    output = run.stdout + run.stderr
    if run.returncode == SKIPPED:
        pytest.skip(output.strip().splitlines()[-1])
    assert run.returncode == 0, output[-4000:]
    summaries = re.findall(r"^(\d+) passed, (\d+) failed", output, flags=re.M)
    assert summaries, output[-4000:]
    assert all(int(failed) == 0 and int(passed) > 0 for passed, failed in summaries)
    return output


def isas_checked(output):
    return set(re.findall(r"^tested (\w+):", output, flags=re.M)) - {"fwht"}


def test_native_isas():
    output = run_c_tests("native")
    assert isas_checked(output) == set(pyw8a8.available_isas())


@pytest.mark.skipif(not X86, reason="the emulated build covers the x86 ISAs")
def test_every_x86_isa_emulated():
    """Every compiled ISA's kernels, quantizer, FWHT and epilogue run on this CPU, whatever
    it lacks, bit-exact against int64 references."""
    output = run_c_tests("emulated")
    assert isas_checked(output) == set(pyw8a8.compiled_isas()), output[-2000:]
    if shutil.which("objdump"):
        assert "no AVX-512, VNNI or AMX instruction" in output


def test_arm_isas_under_qemu():
    output = run_c_tests("arm")
    assert output.count(" passed, 0 failed") == 2  # with and without dotprod
