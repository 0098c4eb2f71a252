"""How pyw8a8's OpenMP threads and numpy's BLAS threads share the cores.

A model that alternates numpy BLAS calls with pyw8a8 calls runs two thread pools, and both
busy-wait after each call: libgomp's threads spin for a while before they sleep (hundreds
of thousands of pause loops by default), and OpenBLAS's threads for 2^28 cycles (about
0.1 s). On a machine with a few cores each pool then steals the other's cores, and a
W8A8 model ran slower than its float version (a small numpy transformer: up to twice its
time, 2 cores).  Environment variables would fix both, but the libraries read
them when they load, before the user's code runs, so pyw8a8 sets the policy itself:

* libgomp (pyw8a8's own pool): ``GOMP_SPINCOUNT`` is set to ``OPENMP_SPINCOUNT`` while the
  compiled module loads libgomp, then removed again, unless the user chose a wait policy
  (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``) or libgomp was already loaded.
* OpenBLAS (numpy's BLAS, found with threadpoolctl): its worker threads are restarted with
  a spin of 2^``BLAS_THREAD_TIMEOUT`` cycles (about 0.1 ms) instead of 2^28, unless the user
  set ``OPENBLAS_THREAD_TIMEOUT``.  Nothing else about the BLAS changes: the same number of
  threads, the same kernels; a BLAS call that follows another within 0.1 ms still finds
  its threads awake.  MKL and other BLAS libraries are left alone (reported as such).

``PYW8A8_THREAD_POLICY=leave`` turns both off.  :func:`thread_policy` reports what was done.
The OpenBLAS restart happens once, during ``import pyw8a8``: import pyw8a8 before starting
threads that call numpy's BLAS (as one imports libraries before starting threads anyway).
"""
import contextlib
import ctypes
import importlib.util
import os
import struct
from typing import Any

ENV_POLICY = "PYW8A8_THREAD_POLICY"
OPENMP_SPINCOUNT = "10000"
BLAS_THREAD_TIMEOUT = 18  # OpenBLAS spins for 2 ** this many cycles after a call

_report: dict[str, Any] = {"policy": "share", "openmp": "not loaded yet", "blas": []}


def _enabled():
    value = os.environ.get(ENV_POLICY, "share").strip().lower()
    if value not in ("share", "leave"):
        raise ValueError(f"{ENV_POLICY}={value!r}: expected 'share' or 'leave'")
    _report["policy"] = value
    return value == "share"


def _needed_libraries(path):
    """The DT_NEEDED entries of an ELF shared object, in order; [] for a file that is not
    ELF (or has no dynamic section).

    Read from the dynamic section, not by searching the file's bytes: auditwheel's
    patchelf renames a needed library by appending the new name to the string table,
    so the old ``libgomp.so.1`` is still there, before the vendored name."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        return []
    bits64, order = data[4] == 2, "<" if data[5] == 1 else ">"
    word, dyn = ("Q", "qQ") if bits64 else ("I", "iI")
    shoff, = struct.unpack_from(order + word, data, 0x28 if bits64 else 0x20)
    shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A if bits64 else 0x2E)
    section = struct.Struct(order + ("IIQQQQIIQQ" if bits64 else "IIIIIIIIII"))
    sections = [section.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    entry = struct.Struct(order + dyn)
    names = []
    for _, kind, _, _, offset, size, link, *_ in sections:
        if kind != 6:  # SHT_DYNAMIC; its sh_link is the section of its strings
            continue
        strings = sections[link][4]
        for tag, value in entry.iter_unpack(data[offset:offset + size]):
            if tag == 1:  # DT_NEEDED
                names.append(data[strings + value:data.index(b"\0", strings + value)]
                             .decode())
    return names


def _own_openmp_library():
    """The file name under which the compiled modules link their OpenMP runtime (its
    DT_NEEDED entry): ``libgomp.so.1`` for a build from source, the hashed
    ``libgomp-<hash>.so.1...`` that auditwheel vendors into a wheel; None without one."""
    spec = importlib.util.find_spec("._dispatch", __package__)
    try:
        needed = _needed_libraries(spec.origin)
    except (AttributeError, OSError):  # no such module, or its file cannot be read
        return None
    return next((name for name in needed if name.startswith(("libgomp.", "libgomp-"))), None)


def _loaded(library):
    """Whether a library of this name (or soname) is already loaded, without loading it."""
    try:
        ctypes.CDLL(library, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def openmp_wait_policy():
    """Context for importing the compiled module: libgomp reads its spin count as it loads."""
    if not _enabled():
        _report["openmp"] = "left alone (PYW8A8_THREAD_POLICY=leave)"
        yield
        return
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        _report["openmp"] = "left alone (the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT)"
        yield
        return
    library = _own_openmp_library()
    if library is None:
        _report["openmp"] = "no OpenMP runtime linked (a build without OpenMP)"
        yield
        return
    # Another copy of libgomp (torch's, under a hashed name) reads its own variables; only
    # the runtime pyw8a8 links has missed its chance when it is loaded already.
    if _loaded(library):
        _report["openmp"] = f"left alone ({library} was loaded before pyw8a8)"
        yield
        return
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPINCOUNT
    try:
        yield
    finally:
        del os.environ["GOMP_SPINCOUNT"]
    _report["openmp"] = f"GOMP_SPINCOUNT={OPENMP_SPINCOUNT} ({library})"


def _calm_openblas(path):
    """Restart one OpenBLAS's worker threads with a short spin; returns what was done."""
    lib = ctypes.CDLL(path)
    needed = ("openblas_read_env", "openblas_thread_timeout", "blas_thread_shutdown_")
    if not all(hasattr(lib, name) for name in needed):
        return "left alone (this OpenBLAS has no thread-timeout entry points)"
    lib.openblas_thread_timeout.restype = ctypes.c_uint
    if lib.openblas_thread_timeout() != 0:
        return "left alone (OPENBLAS_THREAD_TIMEOUT was set)"
    # OpenBLAS re-reads its variables here, and its threads take the new timeout when the
    # next BLAS call starts them again.
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(BLAS_THREAD_TIMEOUT)
    try:
        lib.openblas_read_env()
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]
    lib.blas_thread_shutdown_()
    return (f"worker spin 2^{BLAS_THREAD_TIMEOUT} cycles "
            f"(OPENBLAS_THREAD_TIMEOUT={BLAS_THREAD_TIMEOUT})")


def share_blas_cores():
    """Apply the BLAS half of the policy to every BLAS library loaded in the process (once,
    at import: numpy has loaded its BLAS by then)."""
    if not _enabled():
        return
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return
    for pool in threadpool_info():
        if pool.get("user_api") != "blas":
            continue
        entry = {"library": pool["filepath"], "internal_api": pool.get("internal_api")}
        if os.environ.get("OPENBLAS_THREAD_TIMEOUT"):
            entry["action"] = "left alone (the user set OPENBLAS_THREAD_TIMEOUT)"
        elif pool.get("internal_api") == "openblas" and \
                pool.get("threading_layer") == "pthreads":
            entry["action"] = _calm_openblas(pool["filepath"])
        else:
            entry["action"] = "left alone (not a pthreads OpenBLAS)"
        _report["blas"].append(entry)


def thread_policy() -> dict[str, Any]:
    """What pyw8a8 did, at import, to the busy-waiting of its threads and of the BLAS's.

    Returns
    -------
    dict
        ``policy`` ('share', or 'leave' with ``PYW8A8_THREAD_POLICY=leave``), ``openmp``
        (pyw8a8's OpenMP spin setting and the runtime it links), ``blas`` (one entry per
        BLAS library: its path and what was changed) and ``fork`` (whether the calling
        thread falls back to one thread, as the survivor of a fork).

    Examples
    --------
    >>> import pyw8a8
    >>> report = pyw8a8.thread_policy()
    >>> sorted(report)
    ['blas', 'fork', 'openmp', 'policy']
    >>> report["policy"] in ("share", "leave")
    True
    """
    from ._threads import fork_fallback
    fork = ("this thread survived a fork after it ran a parallel product: its products run "
            "on one thread (libgomp's pool does not survive fork; threads started in this "
            "process run in parallel)" if fork_fallback() else "not a forked child's "
            "surviving thread with a stale OpenMP pool")
    return {"policy": _report["policy"], "openmp": _report["openmp"],
            "blas": [dict(e) for e in _report["blas"]], "fork": fork}
