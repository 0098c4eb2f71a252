"""The evaluation's runs, each in a fresh process (:mod:`pyw8a8.lab.processes`), so that
its wall time and peak RSS are its own; each result is kept as ``runs/<name>.json``."""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
from pathlib import Path

from .._threads import set_num_threads
from ..lab.processes import WorkerError, run_once

__all__ = ["run_in_subprocess", "run_spec"]

#: The thread counts a run's process starts with, where --threads sets them.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def run_spec(spec: dict) -> dict:
    """A run, in its own process: the result of ``spec["kind"]`` ("speed", "ppl", "long"; none:
    a configuration's questions), or its error, traceback and peak RSS (never raised)."""
    from .long_context import run_long_context
    from .perplexity_run import run_perplexity
    from .speed import run_speed
    from .worker import peak_rss_mib, run_config
    runners = {"speed": run_speed, "ppl": run_perplexity, "long": run_long_context}
    try:
        if spec.get("threads"):
            set_num_threads(int(spec["threads"]))
        return runners.get(spec.get("kind"), run_config)(spec)
    except BaseException as exc:  # reported in the result, as any run's outcome
        print(traceback.format_exc(), file=sys.stderr)
        return {"name": spec["name"], "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(), "peak_rss_mib": peak_rss_mib()}


def run_in_subprocess(spec: dict, work: Path, threads) -> dict:
    """The result of `spec` (:func:`run_spec`) in a fresh process, with its wall time; also
    written to ``work/<name>.json``."""
    env = {var: str(threads) for var in _THREAD_VARIABLES} if threads else {}
    t0 = time.perf_counter()
    try:
        result = run_once(f"{__name__}:run_spec", spec, env=env)
    except WorkerError as exc:  # the process itself died
        result = {"name": spec["name"], "error": f"the run's process failed: {exc}"}
    result["wall_time_s"] = time.perf_counter() - t0
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", spec["name"])
    (work / f"{safe}.json").write_text(json.dumps(result, indent=1))
    return result
