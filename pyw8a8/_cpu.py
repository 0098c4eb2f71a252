"""Which ISA runs the kernels: CPU features, the PYW8A8_ISA override and
run-time switching (numpy-style dispatch over ISAs compiled into one portable binary)."""
import contextlib
import os
from collections.abc import Iterator

from . import _dispatch
from ._validation import positive_int

ENV_ISA = "PYW8A8_ISA"


def cpu_features() -> dict[str, bool]:
    """Instruction-set features of this CPU that the operating system also enables.

    Returns
    -------
    dict of str to bool
        Keys include ``avx2``, ``avx512_vnni``, ``avx_vnni``, ``amx_int8`` (x86) and
        ``asimd``, ``asimddp`` (Arm); a feature is True only when usable.

    Examples
    --------
    >>> import pyw8a8
    >>> features = pyw8a8.cpu_features()
    >>> sorted(k for k in features if k in ("avx2", "avx512_vnni", "asimddp"))
    ['asimddp', 'avx2', 'avx512_vnni']
    >>> all(isinstance(v, bool) for v in features.values())
    True
    """
    return _dispatch.cpu_features()


def compiled_isas() -> list[str]:
    """Every ISA compiled into this build (the C registry), most preferred first.

    Returns
    -------
    list of str

    Examples
    --------
    >>> import pyw8a8
    >>> pyw8a8.compiled_isas()[-2:]  # the portable ISAs close the list
    ['scalar', 'scalar_u8s8']
    >>> set(pyw8a8.available_isas()) <= set(pyw8a8.compiled_isas())
    True
    """
    return _dispatch.isa_names()


def available_isas() -> list[str]:
    """ISAs this CPU can run, most preferred first.

    ``scalar`` comes last but one; last is ``scalar_u8s8``, plain C computing the u8 x s8
    products and +128 compensation of the VNNI/AMX ISAs, which is never chosen by default
    and lets the tests check that arithmetic on any CPU.  ``amx`` counts only once Linux
    has granted the process the tile state (asked for here, the first time).

    Returns
    -------
    list of str
        The names :func:`use_isa` and ``PYW8A8_ISA`` accept on this CPU.

    Examples
    --------
    >>> import pyw8a8
    >>> pyw8a8.available_isas()  # on an AVX2 CPU: ['avx2', 'scalar', 'scalar_u8s8']
    [...'scalar', 'scalar_u8s8']
    """
    return [name for name in _dispatch.isa_names() if _dispatch.isa_supported(name)]


def checked_ops(name: object, source: str) -> _dispatch.IsaOps:
    """The IsaOps of ISA `name`, or a clear error naming `source` when it is unknown or
    this CPU cannot run it (internal)."""
    known = _dispatch.isa_names()
    if not isinstance(name, str) or name not in known:
        raise ValueError(f"{source}={name!r} is not an ISA of pyw8a8; "
                         f"expected one of {known}")
    if not _dispatch.isa_supported(name):
        raise RuntimeError(f"{source}={name!r}: this CPU (or OS) does not support it; "
                           f"supported here: {available_isas()}")
    return _dispatch.IsaOps(name)


def _initial_ops():
    forced = os.environ.get(ENV_ISA)
    if forced:
        return checked_ops(forced.strip(), ENV_ISA)
    return _dispatch.IsaOps(_dispatch.best_isa())


# The ISA state lives in the compiled module _dispatch, where a matmul
# reads it without running Python code; this module owns its rules.  The process-wide ISA
# (set_isa, PYW8A8_ISA, the CPU's best) ...
_dispatch.set_process_ops(_initial_ops())
# ... and the ISA of the current thread, when a use_isa / use_ops body set one
# (_dispatch.enter_scope): a switch made in one thread never changes what another thread
# (or a thread started inside it) runs.


# Below a row count an ISA's tiles are mostly empty and a narrower ISA of the same CPU is
# faster: (ISA, the ISA it runs below the threshold, the variable that overrides it, the
# threshold measured with `python -m pyw8a8 bench --crossover WIDE NARROW`).
# - amx: the avx512vnni kernels (which every AMX CPU has); measured 8 on a Sapphire Rapids
#   Xeon (2 vCPUs, K = N = 2048: amx 1.12x as fast at M = 8, slower below).
# (avx2 has none: its 2-row tile serves every M.)
SMALL_M_FALLBACKS = (
    ("amx", "avx512vnni", "PYW8A8_AMX_MIN_ROWS", 8),
)


def _min_rows(variable, measured):
    value = os.environ.get(variable, str(measured)).strip()
    if not value.isdigit():
        raise ValueError(f"{variable}={value!r}: expected a row count >= 0")
    return int(value)


for _wide, _narrow, _variable, _measured in SMALL_M_FALLBACKS:
    if _narrow in _dispatch.isa_names():
        _dispatch.set_small_m_ops(_wide, _dispatch.IsaOps(_narrow),
                                  _min_rows(_variable, _measured))


def active_ops(rows: int | None = None) -> _dispatch.IsaOps:
    """The function table for a product with `rows` activation rows (internal; None: not a
    product, so no small-M fallback)."""
    return _dispatch.call_ops(-1 if rows is None else rows)


def isa(rows: int | None = None) -> str:
    """Name of the ISA the calling thread uses, or that a product of
    `rows` activation rows runs.

    Parameters
    ----------
    rows : int, optional
        The rows (M, every leading dimension of ``x`` together) of a product. Small
        products run a narrower ISA than the chosen one where that is faster: below 8 rows
        ``amx`` runs the ``avx512vnni`` kernels (``PYW8A8_AMX_MIN_ROWS``), whether the ISA
        was chosen by :func:`set_isa`, :func:`use_isa` or at import. Without `rows`, the
        chosen ISA.

    Returns
    -------
    str
        One of :func:`available_isas`: the one a :func:`use_isa` body of this thread
        chose, else the process-wide one (:func:`set_isa`, the ``PYW8A8_ISA`` environment
        variable, or the CPU's best, chosen at import); with `rows`, the ISA such a call
        runs, as ``matmul`` picks it.

    Raises
    ------
    TypeError
        If `rows` is not an int.
    ValueError
        If `rows` is negative.

    Examples
    --------
    >>> import pyw8a8
    >>> pyw8a8.isa() in pyw8a8.available_isas()
    True
    >>> pyw8a8.isa(rows=1) in pyw8a8.available_isas()
    True
    >>> with pyw8a8.use_isa("scalar"):
    ...     pyw8a8.isa(rows=1)
    'scalar'
    """
    if rows is None:
        return _dispatch.call_ops(-1).name
    return _dispatch.call_ops(positive_int(rows, "rows", minimum=0)).name


def set_isa(name: str) -> None:
    """Switch the process-wide ISA: every later call of every thread, except inside a
    :func:`use_isa` body, which keeps its own.

    Parameters
    ----------
    name : str
        An ISA from :func:`available_isas`.

    Raises
    ------
    ValueError
        If `name` is not an ISA of pyw8a8.
    RuntimeError
        If this CPU cannot run it.

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> w = pyw8a8.pack_weight(np.ones((16, 64), np.float32))
    >>> x = np.ones((2, 64), np.float32)
    >>> before = pyw8a8.isa()
    >>> pyw8a8.set_isa("scalar")
    >>> pyw8a8.isa()
    'scalar'
    >>> y_scalar = pyw8a8.matmul(x, w)
    >>> pyw8a8.set_isa(before)
    >>> bool(np.array_equal(y_scalar, pyw8a8.matmul(x, w)))  # the same bits on every ISA
    True
    """
    _dispatch.set_process_ops(checked_ops(name, "isa"))


@contextlib.contextmanager
def use_ops(ops: _dispatch.IsaOps, exactly: bool = True) -> Iterator[None]:
    """Run the body's calls of this thread on `ops`, an IsaOps of a supported ISA;
    `exactly`: without amx's small-M fallback either (internal: the bench's no-op kernel
    copies of an ISA, its amx / avx512vnni crossover)."""
    previous = _dispatch.enter_scope(ops, exactly)
    try:
        yield
    finally:
        _dispatch.leave_scope(previous)


def use_isa(name: str) -> contextlib.AbstractContextManager[None]:
    """Context manager running the calls of its body on the ISA `name`.

    The switch holds for the calling thread only: other threads, and
    threads started inside the body, keep the process-wide ISA (:func:`set_isa`).

    Parameters
    ----------
    name : str
        The body's ISA, one of :func:`available_isas` (checked when called, before the
        body runs).

    Raises
    ------
    ValueError, RuntimeError
        As :func:`set_isa`.

    Examples
    --------
    >>> import pyw8a8
    >>> before = pyw8a8.isa()
    >>> with pyw8a8.use_isa("scalar"):
    ...     print(pyw8a8.isa())
    scalar
    >>> pyw8a8.isa() == before  # back to the process-wide ISA
    True
    """
    return use_ops(checked_ops(name, "isa"), exactly=False)
