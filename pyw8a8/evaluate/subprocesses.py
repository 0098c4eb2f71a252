"""One fresh process per run: the parent writes a spec and spawns Python; the child runs it.

A fresh process measures a configuration's wall time (startup, loading, lazy packing)
and peak RSS honestly.  The spec and the result travel as JSON files in the work folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

from .perplexity_run import run_perplexity
from .speed import run_speed
from .worker import peak_rss_mib, run_config

# What a spec's "kind" runs; no kind: one configuration's questions.
_RUNNERS = {"speed": run_speed, "ppl": run_perplexity}

__all__ = ["run_in_subprocess", "worker_main"]


def worker_main(spec_path: str) -> int:
    """Entry point of the per-configuration subprocess."""
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["result_path"])
    try:
        result = _RUNNERS.get(spec.get("kind"), run_config)(spec)
        code = 0
    except BaseException as exc:  # report, never hang the parent
        result = {"name": spec["name"], "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(), "peak_rss_mib": peak_rss_mib()}
        print(result["traceback"], file=sys.stderr)
        code = 1
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
    return code


def run_in_subprocess(spec: dict, work: Path, threads) -> dict:
    """Run `spec` in a fresh Python process (`worker_main`) and return its result with the
    process's wall time and return code; the result is also left in `work`."""
    name = spec["name"]
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", name)
    spec_path = work / f"{safe}.spec.json"
    result_path = work / f"{safe}.json"
    spec = dict(spec, result_path=str(result_path))
    spec_path.write_text(json.dumps(spec))
    if result_path.exists():
        result_path.unlink()
    env = dict(os.environ)
    if threads:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
            env[var] = str(threads)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-c",
           "import sys; from pyw8a8.evaluate.subprocesses import worker_main; "
           "sys.exit(worker_main(sys.argv[1]))", str(spec_path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env)
    wall = time.perf_counter() - t0
    spec_path.unlink(missing_ok=True)
    if result_path.exists():
        result = json.loads(result_path.read_text())
    else:
        result = {"name": name, "error": f"worker exited with code {proc.returncode} and no result"}
    result["wall_time_s"] = wall
    result["returncode"] = proc.returncode
    result_path.write_text(json.dumps(result, indent=1))
    return result
