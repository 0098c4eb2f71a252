"""Contenders taking turns, round by round (A, B, C, A, B, C, ...), so that a noisy shared
machine slows them alike: :func:`take_turns` is the one loop; :func:`measure` times
functions of no arguments in it, warmed up, in blocks of calls, in this process or in
one of their own (:class:`Isolated`)."""
import contextlib
import statistics
import sys
import time

from .processes import Worker, function

#: Pause before each turn: thread pools spin after a call (ONNX Runtime's and OpenBLAS's
#: for about 0.1 s), which on few cores steals the next contender's (and pyw8a8's tuner
#: would judge its candidates on calls so slowed).
SETTLE_SECONDS = 0.2
# Warm-up calls: first-call costs, and the tuner's candidates (3 rounds of up to 23 per
# shape), on up to MAX_WARM_CALLS while it is still trying them.
WARM_CALLS = 40
MAX_WARM_CALLS = 120
# Untimed calls opening each block: after the pause, the first calls took up to 4x the
# steady time (cores clocked down; 64 x 1152 x 6912 on the Xeon).
REWARM_SECONDS = 0.01


def take_turns(turns, rounds, settle=SETTLE_SECONDS, rotate=False):
    """{name: [turn(i) of each round i]} of `turns` ({name: turn}) over `rounds` rounds, with
    `settle` seconds of pause before each turn; with `rotate`, round i starts with the i-th."""
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
    """Whether pyw8a8's blocking tuner, where this process uses it, still tries candidates."""
    tuning = sys.modules.get("pyw8a8.tuning")
    return tuning is not None and tuning.unsettled() > 0


def warm_up(fn, min_time):
    """Call `fn` WARM_CALLS times, for at least `min_time` seconds, and on while pyw8a8's
    tuner settles (at most MAX_WARM_CALLS); the median seconds per call of the second half."""
    times = []
    start = time.perf_counter()
    while (len(times) < WARM_CALLS or time.perf_counter() - start < min_time or
           (_tuner_settling() and len(times) < MAX_WARM_CALLS)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[len(times) // 2:])


def time_block(fn, reps):
    """Seconds per call of `reps` calls of `fn`, after REWARM_SECONDS of untimed calls."""
    end = time.perf_counter() + REWARM_SECONDS
    while time.perf_counter() < end:
        fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


class TimedCalls:
    """A function of no arguments warmed up and timed in blocks: in this process, or as an
    :class:`Isolated` contender's session, built there on `nthreads` threads."""

    def __init__(self, nthreads=None, fn=None):
        if nthreads is not None:
            from .._threads import set_num_threads
            set_num_threads(nthreads)
        self.fn = fn

    def build(self, make, *args):
        """Build ``make(*args)`` (`make`: ``"module:name"``); its ``kernel`` attribute or None."""
        self.fn = function(make)(*args)
        return getattr(self.fn, "kernel", None)

    def warm_up(self, min_time):
        return warm_up(self.fn, min_time)

    def block(self, reps):
        return time_block(self.fn, reps)


class Isolated:
    """A contender built (``make(*args)``, see :meth:`build`) and timed in a fresh process of
    its own on `nthreads` threads; pass it to :func:`measure`, close it when done."""

    def __init__(self, make, nthreads):
        self.make = make
        self._worker = Worker().open(f"{__name__}:TimedCalls", nthreads)

    def build(self, *args):
        """Build the contender ``make(*args)`` there; self, its ``kernel`` the contender's."""
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
    """{name: :class:`Isolated`} for `names`, each building with `make`; all closed on exit."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(Isolated(make, nthreads)) for name in names}


def measure_rounds(contenders, rounds, min_time):
    """Seconds per call of each contender (a function of no arguments or an
    :class:`Isolated`) in each of `rounds` rounds, a block of at least `min_time` seconds
    each: {name: [seconds]}, round i of all run back to back."""
    timers = {name: c if isinstance(c, Isolated) else TimedCalls(fn=c)
              for name, c in contenders.items()}
    reps = {}
    for name, timer in timers.items():
        time.sleep(SETTLE_SECONDS)  # every warm-up, too, from sleeping pools
        reps[name] = max(1, int(min_time / max(timer.warm_up(min_time), 1e-7)))
    return take_turns({name: lambda i, t=timer, r=reps[name]: t.block(r)
                       for name, timer in timers.items()}, rounds)


def measure(contenders, rounds, min_time):
    """Median seconds per call of each contender, as :func:`measure_rounds` times them."""
    return {name: statistics.median(s)
            for name, s in measure_rounds(contenders, rounds, min_time).items()}
