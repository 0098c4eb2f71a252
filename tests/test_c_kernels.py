"""The C-level kernel tests (tests/c): natively, and the Arm NEON paths under qemu."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("cc") is None,
                    reason="needs bash and a C compiler")
def test_c_kernels_native_and_arm():
    run = subprocess.run(["bash", os.path.join(ROOT, "tests", "c", "run_arm.sh")],
                         capture_output=True, text=True, timeout=1500)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    summaries = re.findall(r"^(\d+) passed, (\d+) failed", output, flags=re.M)
    assert summaries, output[-4000:]
    assert all(int(failed) == 0 and int(passed) > 0 for passed, failed in summaries)
    if "SKIPPED the Arm tests" not in output:
        # native, qemu -cpu max (neondot) and qemu -cpu cortex-a53 (neon)
        assert len(summaries) >= 3, output[-4000:]
