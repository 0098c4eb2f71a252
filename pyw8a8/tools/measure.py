"""Side-by-side timing: contenders called in interleaved rounds (A, B, C, A, B, C, ...), so
a noisy shared machine slows them alike, each round started from idle thread pools; the
medians are what the bench and the proxies report.

A contender is a function of no arguments timed in this process, or an :class:`Isolated`
one: a contender built and timed in a process of its own, which the rounds interleave with
the others all the same (``bench --check-isolation`` compares the two).
"""
import contextlib
import multiprocessing
import statistics
import sys
import time
import traceback

SETTLE_SECONDS = 0.2
# Calls of a contender before it is timed: first-call costs, caches, and pyw8a8's blocking
# tuner, which tries its candidates on the first calls of a shape (3 rounds of up to 23):
# where the tuner is still trying them, the warm-up goes on, up to MAX_WARM_CALLS.
WARM_CALLS = 40
MAX_WARM_CALLS = 120
# Untimed calls that open each block: after the pause before it (SETTLE_SECONDS), the
# cores have clocked down, and the first calls of a block took up to 4x the steady time
# (64 x 1152 x 6912 on the Xeon, pyw8a8 and ONNX Runtime alike): a block measures the
# library, not the idle state the pause left.
REWARM_SECONDS = 0.01


def _tuner_settling():
    """Whether pyw8a8's blocking tuner, where this process uses it, is still trying
    candidates: calls timed then would time them, not the blocking it settles on."""
    tuning = sys.modules.get("pyw8a8.tuning")
    return tuning is not None and tuning.TUNER.unsettled() > 0


def warm_up(fn, min_time):
    """Call `fn` WARM_CALLS times and for at least `min_time` seconds, and on until pyw8a8's
    tuner has settled (at most MAX_WARM_CALLS calls).

    Returns
    -------
    float
        The median seconds per call of the second half of those calls (the first ones
        carry the first-call costs).
    """
    times = []
    start = time.perf_counter()
    while (len(times) < WARM_CALLS or time.perf_counter() - start < min_time or
           (_tuner_settling() and len(times) < MAX_WARM_CALLS)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[len(times) // 2:])


def time_block(fn, reps):
    """Seconds per call of `reps` consecutive calls of `fn`, after REWARM_SECONDS of
    untimed calls."""
    end = time.perf_counter() + REWARM_SECONDS
    while time.perf_counter() < end:
        fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


class _InProcess:
    """A contender called in this process."""

    def __init__(self, fn):
        self.fn = fn

    def warm_up(self, min_time):
        return warm_up(self.fn, min_time)

    def block(self, reps):
        return time_block(self.fn, reps)


def measure(contenders, rounds, min_time):
    """Median seconds per call of each contender, timed in interleaved rounds
    (:func:`measure_rounds`' medians).

    Parameters
    ----------
    contenders : dict of str to callable or Isolated
        Functions of no arguments, or contenders that live in a process of their own.
    rounds : int
        Timed blocks per contender.
    min_time : float
        Seconds of calls per block (the block's call count comes from the warm-up).

    Returns
    -------
    dict of str to float
    """
    return {name: statistics.median(s)
            for name, s in measure_rounds(contenders, rounds, min_time).items()}


def measure_rounds(contenders, rounds, min_time):
    """Seconds per call of each contender in each of `rounds` interleaved rounds (the
    arguments as :func:`measure`'s): round i of every contender ran back to back, so their
    ratios round by round cancel the machine's drift.

    Returns
    -------
    dict of str to list of float
    """
    timers = {name: c if isinstance(c, Isolated) else _InProcess(c)
              for name, c in contenders.items()}
    reps = {}
    for name, timer in timers.items():
        # Idle thread pools spin for a while after a call (ONNX Runtime's for about 0.1 s
        # on 2 vCPUs, OpenBLAS's for up to ~0.1 s without pyw8a8's thread policy); on a
        # machine with few cores that steals the next contender's cores.  So every warm-up
        # and every block starts from pools that have gone to sleep: pyw8a8's tuner, among
        # others, would otherwise judge its candidates on calls slowed by another pool.
        time.sleep(SETTLE_SECONDS)
        reps[name] = max(1, int(min_time / max(timer.warm_up(min_time), 1e-7)))
    samples = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            time.sleep(SETTLE_SECONDS)
            samples[name].append(timer.block(reps[name]))
    return samples


def _serve(conn, make, nthreads):
    """An isolated contender's process: builds contenders with `make(*args)` and times
    them on the parent's requests, until it receives None."""
    from .. import _threads
    _threads.set_num_threads(nthreads)
    fn = None
    while True:
        request = conn.recv()
        if request is None:
            return
        op, arg = request
        try:
            if op == "build":
                fn = make(*arg)
                reply = getattr(fn, "kernel", None)
            elif op == "warm_up":
                reply = warm_up(fn, arg)
            else:
                reply = time_block(fn, arg)
        except Exception:  # reported to the parent, which raises it there
            conn.send(("error", traceback.format_exc()))
        else:
            conn.send(("ok", reply))


class Isolated:
    """A contender built and timed in a fresh process of its own (spawned, so nothing of
    this process's libraries, thread pools or caches is shared), on this thread count.

    Parameters
    ----------
    make : callable
        A module-level function (it is pickled by name), ``make(*args)`` returns the
        contender's function of no arguments; called in the other process.
    nthreads : int
        pyw8a8's thread count there (:func:`pyw8a8.set_num_threads`).

    Use :meth:`build` for each new set of arguments, then pass it to :func:`measure`;
    :meth:`close` ends the process (or use it as a context manager).
    """

    def __init__(self, make, nthreads):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, make, nthreads), daemon=True)
        self._process.start()
        child.close()

    def _ask(self, op, arg):
        self._conn.send((op, arg))
        status, reply = self._conn.recv()
        if status == "error":
            raise RuntimeError(f"the isolated contender's process failed:\n{reply}")
        return reply

    def build(self, *args):
        """Build the contender ``make(*args)`` in the other process; returns self, its
        ``kernel`` the contender's (the attribute of its function: which kernel it runs,
        where it names one) or None."""
        self.kernel = self._ask("build", args)
        return self

    def warm_up(self, min_time):
        return self._ask("warm_up", min_time)

    def block(self, reps):
        return self._ask("block", reps)

    def close(self):
        """End the process (it is a daemon: it also ends with this one)."""
        try:
            self._conn.send(None)
        except OSError:  # it has ended already (BrokenPipeError)
            pass
        self._process.join(timeout=30)
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def isolated(make, names, nthreads):
    """One :class:`Isolated` contender per name of `names`, each in a process of its own
    that builds contenders with `make`; all closed on exit.

    Yields
    ------
    dict of str to Isolated
    """
    workers = {}
    try:
        for name in names:
            workers[name] = Isolated(make, nthreads)
        yield workers
    finally:
        for worker in workers.values():
            worker.close()
