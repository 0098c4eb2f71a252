"""Contenders taking turns: each timed in its turn of every round (A, B, C, A, B, C, ...),
so that a noisy shared machine slows them alike; the medians are what the lab reports.

:func:`take_turns` is the one loop, for the bench's tables, ``bench --torch`` and the
evaluation's side-by-side checks.  :func:`measure` times functions of no arguments in it,
each warmed up first and timed in blocks of calls: a function called in this process, or
an :class:`Isolated` one, built and timed in a process of its own
(``bench --check-isolation`` compares the two).
"""
import contextlib
import statistics
import sys
import time

from .processes import Worker, function

#: Pause before each turn: thread pools spin for a while after a call (ONNX Runtime's for
#: about 0.1 s on 2 vCPUs, OpenBLAS's for up to ~0.1 s without pyw8a8's thread policy),
#: which on a machine with few cores steals the next contender's cores.  So every turn
#: starts from pools that have gone to sleep: pyw8a8's tuner, among others, would
#: otherwise judge its candidates on calls slowed by another pool.
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


def take_turns(turns, rounds, settle=SETTLE_SECONDS, rotate=False):
    """What each contender's turn gives, round by round.

    Parameters
    ----------
    turns : dict of str to callable
        ``turn(i)`` is a contender's turn in round i; it returns what is kept of it.
    rounds : int
    settle : float
        Seconds of pause before each turn (SETTLE_SECONDS).
    rotate : bool
        Round i starts with the i-th contender (the order rotating), rather than the first.
    """
    names = list(turns)
    samples = {name: [] for name in names}
    for i in range(rounds):
        start = i % len(names) if rotate else 0
        for name in names[start:] + names[:start]:
            time.sleep(settle)
            samples[name].append(turns[name](i))
    return samples


def spread(values):
    """The range of `values` over their median (0 where the median is)."""
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


def _tuner_settling():
    """Whether pyw8a8's blocking tuner, where this process uses it, is still trying
    candidates: calls timed then would time them, not the blocking it settles on."""
    tuning = sys.modules.get("pyw8a8.tuning")
    return tuning is not None and tuning.unsettled() > 0


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


class TimedCalls:
    """A function of no arguments warmed up and timed in blocks: in this process, or, as
    the session of an :class:`Isolated` contender's process, built there (:meth:`build`)
    on `nthreads` of pyw8a8's threads."""

    def __init__(self, nthreads=None, fn=None):
        if nthreads is not None:
            from .._threads import set_num_threads
            set_num_threads(nthreads)
        self.fn = fn

    def build(self, make, *args):
        """Build the function ``make(*args)`` (`make` named as
        :func:`~pyw8a8.lab.processes.function` reads it); its ``kernel`` attribute, where
        it names the kernel it runs, or None."""
        self.fn = function(make)(*args)
        return getattr(self.fn, "kernel", None)

    def warm_up(self, min_time):
        return warm_up(self.fn, min_time)

    def block(self, reps):
        return time_block(self.fn, reps)


class Isolated:
    """A contender built and timed in a fresh process of its own (nothing of this
    process's libraries, thread pools or caches is shared), on `nthreads` threads, with
    the functions ``make(*args)`` returns (`make`: ``"module:name"``, called there).

    Use :meth:`build` for each new set of arguments, then pass it to :func:`measure`;
    :meth:`close` ends the process (or use it as a context manager).
    """

    def __init__(self, make, nthreads):
        self.make = make
        self._worker = Worker().open(f"{__name__}:TimedCalls", nthreads)

    def build(self, *args):
        """Build the contender ``make(*args)`` in the other process; returns self, its
        ``kernel`` the contender's (see :meth:`TimedCalls.build`)."""
        self.kernel = self._worker.ask("build", self.make, *args)
        return self

    def warm_up(self, min_time):
        return self._worker.ask("warm_up", min_time)

    def block(self, reps):
        return self._worker.ask("block", reps)

    def close(self):
        self._worker.close()

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
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(Isolated(make, nthreads)) for name in names}


def measure_rounds(contenders, rounds, min_time):
    """Seconds per call of each contender (a function of no arguments, or an
    :class:`Isolated` one) in each of `rounds` rounds of turns, a block of calls of at
    least `min_time` seconds each (its call count from the warm-up): round i of every
    contender ran back to back, so their ratios round by round cancel the machine's drift.

    Returns
    -------
    dict of str to list of float
    """
    timers = {name: c if isinstance(c, Isolated) else TimedCalls(fn=c)
              for name, c in contenders.items()}
    reps = {}
    for name, timer in timers.items():
        time.sleep(SETTLE_SECONDS)  # every warm-up, too, from sleeping pools
        reps[name] = max(1, int(min_time / max(timer.warm_up(min_time), 1e-7)))
    return take_turns({name: lambda i, t=timer, r=reps[name]: t.block(r)
                       for name, timer in timers.items()}, rounds)


def measure(contenders, rounds, min_time):
    """Median seconds per call of each contender ({name: float}; the arguments as
    :func:`measure_rounds`')."""
    return {name: statistics.median(s)
            for name, s in measure_rounds(contenders, rounds, min_time).items()}
