"""pyw8a8 and torch in one process: one thread count, and forks after either one ran.

**Thread count.** pyw8a8's layers in a torch model run on ``torch.get_num_threads()``
threads, so ``torch.set_num_threads(n)`` sets both libraries' count, unless
:func:`pyw8a8.set_num_threads` was called, which then sets pyw8a8's alone.  A build of
pyw8a8 from source links the system's ``libgomp.so.1``, and torch's CPU wheel ships its
runtime under that very soname, so the process loads one copy and the two share its
thread pool and its count anyway; pyw8a8's wheel vendors its runtime under a hashed name,
and then the count is carried over on each call (:func:`follow_torch_threads`).

**Fork.** A child forked after torch ran a parallel op cannot run torch's ops (GNU OpenMP's
pool is gone; they hang), but pyw8a8's products in it return, bit-identical, whether
pyw8a8 or torch started the pool (tests/pytorch/test_torch_processes.py).
"""
import os

import torch

from .. import _dispatch, _thread_policy


def shares_runtime() -> bool:
    """Whether pyw8a8's OpenMP runtime is the one torch loaded: torch's CPU library needs a
    runtime of the very name pyw8a8's compiled module needs (the loader loads one copy)."""
    own = _thread_policy._own_openmp_library()
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        return own is not None and own in _thread_policy._needed_libraries(library)
    except OSError:  # a torch build laid out otherwise: assume the copies are apart
        return False


def follow_torch_threads() -> None:
    """Run the calling thread's next products on torch's thread count, unless
    pyw8a8.set_num_threads overrides it (a C call that changes nothing when the counts
    already agree)."""
    if _dispatch.threads_override() is None:
        _dispatch.follow_threads(torch.get_num_threads())

