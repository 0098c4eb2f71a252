"""Thread count of the parallel kernels.

By default it follows OpenMP (``OMP_NUM_THREADS``, and threadpoolctl, which limits the
OpenMP runtime this extension links); :func:`set_num_threads` overrides it.

GNU libgomp's thread pool does not survive ``fork``: the child inherits the pool's
bookkeeping but not its threads, so the thread that forked (the only one the child has)
would wait forever for them at its next parallel region.  The pool belongs to the thread
that started it, though: any other thread gets a fresh one.  So in a forked child, the
thread that survived the fork runs every product on one thread (no parallel region), if
it had run a parallel region before the fork; threads the child starts run in parallel
as usual.
"""
import operator
import os

from . import _dispatch

# Thread counts above this are refused: libgomp crashes or exits the process when it
# cannot create the threads asked for (100000 segfaulted, 60000 exited).
MAX_THREADS_PER_CPU = 8


# The thread state (the override, the fork's survivor) lives in the compiled module, where
# a matmul reads it without running Python code (_dispatch); this module
# owns its rules and checks.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_dispatch.note_fork_in_child)


# os.cpu_count() reads the system's CPU list on each call (1.7 us): once is enough, the
# count of logical CPUs does not change under a running process.
_MAX_THREADS = MAX_THREADS_PER_CPU * (os.cpu_count() or 1)


def max_threads() -> int:
    """The largest thread count accepted: MAX_THREADS_PER_CPU per logical CPU."""
    return _MAX_THREADS


def _check_environment():
    """OMP_NUM_THREADS gets the bound set_num_threads has (its first level, the one pyw8a8's
    products use); values OpenMP itself rejects are OpenMP's to report."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if value.isdigit() and int(value) > max_threads():
        raise ValueError(f"OMP_NUM_THREADS={value}: at most {max_threads()} threads "
                         f"({MAX_THREADS_PER_CPU} per logical CPU) can run pyw8a8's products")


_check_environment()


def fork_fallback() -> bool:
    """Whether the calling thread is a forked child's surviving thread whose OpenMP pool
    was left behind by the fork (it then runs products on one thread)."""
    return _dispatch.fork_fallback()


def get_num_threads() -> int:
    """Number of threads the next call of the calling thread will use.

    Returns
    -------
    int
        :func:`set_num_threads`'s count, else OpenMP's default (``OMP_NUM_THREADS``,
        threadpoolctl's limit); 1 in the thread that survived a ``fork`` after it ran a
        parallel product (see the user guide's "Threads and processes").

    Examples
    --------
    >>> import os
    >>> import pyw8a8
    >>> 1 <= pyw8a8.get_num_threads() <= 8 * os.cpu_count()
    True
    """
    return _dispatch.num_threads()


def set_num_threads(n: int | None) -> None:
    """Set the thread count of later calls, process-wide; ``None`` returns to the OpenMP
    default.

    Parameters
    ----------
    n : int or None
        From 1 to 8 per logical CPU (:func:`max_threads`).

    Raises
    ------
    TypeError
        If `n` is not an int or None.
    ValueError
        If `n` is out of that range.

    Examples
    --------
    >>> import pyw8a8
    >>> pyw8a8.set_num_threads(1)
    >>> pyw8a8.get_num_threads()
    1
    >>> pyw8a8.set_num_threads(None)  # back to OpenMP's default
    >>> pyw8a8.set_num_threads(0)
    Traceback (most recent call last):
    ...
    ValueError: n must be from 1 to ... per logical CPU), got 0
    """
    if n is None:
        _dispatch.set_threads_override(0)
        return
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"n must be an int or None, got {type(n).__name__}") from None
    if not 1 <= n <= max_threads():
        raise ValueError(f"n must be from 1 to {max_threads()} ({MAX_THREADS_PER_CPU} per "
                         f"logical CPU), got {n}")
    _dispatch.set_threads_override(n)


def num_threads_override() -> int | None:
    """set_num_threads's count, or None (OpenMP's default)."""
    return _dispatch.threads_override()


# Below this many multiply-accumulates a product runs on one thread: waking a team costs
# about as much as the work (and far more on a loaded machine, where a descheduled thread
# stalls the join for a whole time slice).  A product wakes its team once (its rows and
# blocks share one parallel region), so from about half a million a second thread pays
# (2 Xeon vCPUs: one token through 1024 x 640 ran 1.3x as fast on two threads, through
# 256 x 640 slower).
SERIAL_WORK = 1 << 19
_dispatch.configure_threads(max_threads(), SERIAL_WORK)


def threads_for(work: int) -> int:
    """Threads for a call doing `work` multiply-accumulates (or element operations)."""
    return _dispatch.threads_for(work)
