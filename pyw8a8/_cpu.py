"""Which instruction-set path runs the kernels: CPU features, the PYW8A8_ISA override and
run-time switching (numpy-style dispatch over paths compiled into one portable binary)."""
import contextlib
import contextvars
import os

from . import _kernels

ENV_ISA = "PYW8A8_ISA"


def cpu_features():
    """Instruction-set features of this CPU that the operating system also enables.

    Returns
    -------
    dict of str to bool
        Keys include ``avx2``, ``avx512_vnni``, ``avx_vnni``, ``amx_int8`` (x86) and
        ``asimd``, ``asimddp`` (Arm); a feature is True only when usable.
    """
    return _kernels.cpu_features()


def compiled_isas():
    """Every path compiled into this build (the C registry), most preferred first.

    Returns
    -------
    list of str
    """
    return _kernels.isa_names()


def available_isas():
    """Paths this CPU can run, most preferred first.

    ``scalar`` comes last but one; last is ``scalar_u8s8``, plain C computing the u8 x s8
    products and +128 compensation of the VNNI/AMX paths, which is never chosen by default
    and lets the tests check that arithmetic on any CPU.  ``amx`` counts only once Linux
    has granted the process the tile state (asked for here, the first time).

    Returns
    -------
    list of str
    """
    return [name for name in _kernels.isa_names() if _kernels.isa_supported(name)]


def checked_ops(name, source):
    """The IsaOps of path `name`, or a clear error naming `source` when it is unknown or
    this CPU cannot run it (internal)."""
    known = _kernels.isa_names()
    if not isinstance(name, str) or name not in known:
        raise ValueError(f"{source}={name!r} is not an instruction-set path of pyw8a8; "
                         f"expected one of {known}")
    if not _kernels.isa_supported(name):
        raise RuntimeError(f"{source}={name!r}: this CPU (or OS) does not support it; "
                           f"supported here: {available_isas()}")
    return _kernels.IsaOps(name)


def _initial_ops():
    forced = os.environ.get(ENV_ISA)
    if forced:
        return checked_ops(forced.strip(), ENV_ISA)
    return _kernels.IsaOps(_kernels.best_isa())


# The process-wide path (set_isa, PYW8A8_ISA, the CPU's best) ...
_default = _initial_ops()
# ... and the path of the current thread and context, when a use_isa / use_ops body set
# one: (IsaOps, exactly).  A context variable, as numpy 2's errstate, so a switch made in
# one thread never changes what another thread (or a thread started inside it) runs.
_scoped = contextvars.ContextVar("pyw8a8_isa", default=None)


# Below this many activation rows an AMX tile is mostly empty; the avx512vnni kernels
# (which every AMX CPU has) are faster there.  `python -m pyw8a8 bench --crossover amx
# avx512vnni` measured 8 on a Sapphire Rapids Xeon (2 vCPUs, K = N = 2048: avx512vnni 0.8x
# the time of amx at M <= 4, amx 1.12x faster at M = 8 and 1.4-2.4x from M = 16);
# PYW8A8_AMX_MIN_ROWS overrides it.
ENV_AMX_MIN_ROWS = "PYW8A8_AMX_MIN_ROWS"
AMX_MIN_ROWS_MEASURED = 8


def _amx_min_rows():
    value = os.environ.get(ENV_AMX_MIN_ROWS, str(AMX_MIN_ROWS_MEASURED)).strip()
    if not value.isdigit():
        raise ValueError(f"{ENV_AMX_MIN_ROWS}={value!r}: expected a row count >= 0")
    return int(value)


AMX_MIN_ROWS = _amx_min_rows()
_amx_fallback = None


def _current():
    """(IsaOps, exactly) of the calling thread and context."""
    scoped = _scoped.get()
    return (_default, False) if scoped is None else scoped


def active_ops(rows=None):
    """The function table for a product with `rows` activation rows (internal)."""
    global _amx_fallback
    ops, exactly = _current()
    if ops.name == "amx" and rows is not None and rows < AMX_MIN_ROWS and not exactly:
        if _amx_fallback is None:
            _amx_fallback = _kernels.IsaOps("avx512vnni")
        return _amx_fallback
    return ops


def isa():
    """Name of the instruction-set path the calling thread uses.

    Returns
    -------
    str
        One of :func:`available_isas`: the one a :func:`use_isa` body of this thread
        chose, else the process-wide one (:func:`set_isa`, the ``PYW8A8_ISA`` environment
        variable, or the CPU's best, chosen at import).
    """
    return _current()[0].name


def set_isa(name):
    """Switch the process-wide path: every later call of every thread, except inside a
    :func:`use_isa` body, which keeps its own.

    Parameters
    ----------
    name : str
        A path from :func:`available_isas`.

    Raises
    ------
    ValueError
        If `name` is not a path of pyw8a8.
    RuntimeError
        If this CPU cannot run it.
    """
    global _default
    _default = checked_ops(name, "isa")


@contextlib.contextmanager
def use_ops(ops, exactly=True):
    """Run the body's calls of this thread and context on `ops`, an IsaOps of a supported
    path; `exactly`: without amx's small-M fallback either (internal: the bench's no-op
    kernel copies of a path, its amx / avx512vnni crossover)."""
    token = _scoped.set((ops, exactly))
    try:
        yield
    finally:
        _scoped.reset(token)


def use_isa(name):
    """Context manager running the calls of its body on the path `name`.

    The switch holds for the calling thread (and its context) only: other threads, and
    threads started inside the body, keep the process-wide path (:func:`set_isa`).

    Parameters
    ----------
    name : str
        The body's path, one of :func:`available_isas` (checked when called, before the
        body runs).

    Raises
    ------
    ValueError, RuntimeError
        As :func:`set_isa`.
    """
    return use_ops(checked_ops(name, "isa"), exactly=False)
