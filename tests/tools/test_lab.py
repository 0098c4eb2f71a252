"""What the bench and the evaluation share (pyw8a8/lab): the fresh processes and the
turns."""
import os

import numpy as np
import pytest

import pyw8a8
from pyw8a8.lab import processes, turns
from pyw8a8.tools import contenders


def test_a_worker_calls_opens_and_asks_in_its_own_process():
    with processes.Worker() as worker:
        assert worker.call("os:getpid") != os.getpid()
        worker.open("collections:Counter", "abca")
        assert worker.ask("most_common", 1) == [["a", 2]]
        with pytest.raises(processes.WorkerError, match="ZeroDivisionError"):
            worker.call("operator:truediv", 1, 0)
        assert worker.call("operator:add", 1, 2) == 3  # a failed call leaves it serving


def test_a_file_loaded_alone_imports_nothing_of_the_package(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text("import sys\n\ndef modules():\n"
                      "    print('to stderr, not the replies')\n"
                      "    return sorted(m for m in sys.modules if m.startswith('pyw8a8'))\n")
    assert processes.run_once(f"{script}:modules") == []


def test_a_process_that_dies_says_why():
    with pytest.raises(processes.WorkerError, match="gone"):
        processes.run_once("sys:exit", "gone", capture_stderr=True)


def test_turns_rotate_and_keep_each_contender_s_samples():
    order = []
    samples = turns.take_turns({name: lambda i, n=name: order.append(n) or i
                                for name in "abc"}, 3, settle=0, rotate=True)
    assert order == list("abc" "bca" "cab")
    assert samples == {name: [0, 1, 2] for name in "abc"}
    assert turns.spread([1.0, 2.0, 4.0]) == 1.5


def test_warm_up_goes_on_until_the_tuner_settles(monkeypatch):
    """A contender is timed once pyw8a8's tuner stopped trying blockings, however many
    calls its candidates take past WARM_CALLS (here 2, fewer than any shape's tuning).

    On the portable scalar ISA at two threads, whose candidates at this shape are several
    on every CPU kind: the CPU's own ISA may have a single one (AMX from 8 threads), which
    settles on creation."""
    from pyw8a8 import _dispatch, tuning
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 256)).astype(np.float32)
    w = pyw8a8.pack_weight(rng.standard_normal((192, 256)).astype(np.float32))
    monkeypatch.setattr(turns, "WARM_CALLS", 2)
    pyw8a8.set_num_threads(2)  # the conftest fixture restores the default count
    tuning.clear()
    calls = []
    with pyw8a8.use_isa("scalar"):
        turns.warm_up(lambda: calls.append(pyw8a8.matmul(x, w)), 0.0)
    cands = tuning.candidates(_dispatch.IsaOps("scalar"), 96, 192, w.kp, 2)
    # The untimed first call, then two rounds of every candidate at least.
    assert len(cands) >= 2, cands
    assert tuning.unsettled() == 0
    assert 1 + 2 * len(cands) <= len(calls) <= turns.MAX_WARM_CALLS
    calls.clear()
    turns.warm_up(lambda: calls.append(None), 0.0)  # settled: WARM_CALLS, no more
    assert len(calls) == 2


def test_an_isolated_contender_reports_its_failure():
    with turns.Isolated(contenders.BUILD, 1) as worker:
        with pytest.raises(RuntimeError, match="no-such-isa"):
            worker.build("product", "pyw8a8 no-such-isa", 1, 64, 64).warm_up(0.001)
