"""Thread count of the parallel kernels.

By default it follows OpenMP (``OMP_NUM_THREADS``, and threadpoolctl, which limits the
OpenMP runtime this extension links); :func:`set_num_threads` overrides it."""
import operator

from . import _kernels

_override = None


def get_num_threads():
    """Number of threads the next call will use.

    Returns
    -------
    int
    """
    if _override is not None:
        return _override
    return max(1, _kernels.omp_max_threads())


def set_num_threads(n):
    """Set the thread count of later calls; ``None`` returns to the OpenMP default.

    Parameters
    ----------
    n : int or None
        At least 1.
    """
    global _override
    if n is None:
        _override = None
        return
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"n must be an int or None, got {type(n).__name__}") from None
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    _override = n


# Below this many multiply-accumulates a product runs on one thread: waking a team costs
# about as much as the work (and far more on a loaded machine, where a descheduled thread
# stalls the join for a whole time slice).
SERIAL_WORK = 1 << 21


def threads_for(work):
    """Threads for a call doing `work` multiply-accumulates (or element operations)."""
    return 1 if work < SERIAL_WORK else get_num_threads()
