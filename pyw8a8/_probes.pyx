# cython: language_level=3
"""The bench's probes of the machine (``python -m pyw8a8 bench``, ``info``): each ISA's
int8 instruction peak, the float32 FMA peak and the read bandwidth, on every thread."""
from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

import numpy as np

from ._core cimport w8_fp32_peak, w8_peak_fn, w8_read_bytes
from ._dispatch cimport IsaOps


cdef int64_t _run_peak(w8_peak_fn fn, int64_t iters, int nthreads):
    sinks = np.zeros(nthreads, dtype=np.int32)
    macs = np.zeros(nthreads, dtype=np.int64)
    cdef int32_t[::1] s = sinks
    cdef int64_t[::1] mv = macs
    cdef int t
    with nogil:
        for t in prange(nthreads, schedule="static", num_threads=nthreads):
            mv[t] = fn(iters, &s[t])
    return int(macs.sum())


def peak_macs(IsaOps isa, int64_t iters, int nthreads):
    """Run the int8 instruction-peak loop of ISA `isa` on `nthreads` threads (the caller
    has checked that this CPU runs it).

    Returns the total multiply-accumulates performed (divide by the wall time).
    """
    return _run_peak(isa.ops.peak, iters, nthreads)


def fp32_peak_macs(bint zmm, int64_t iters, int nthreads):
    """The float32 FMA peak loop (ymm, or zmm where the CPU has AVX-512), as peak_macs."""
    cdef w8_peak_fn fn = w8_fp32_peak(zmm)
    if fn == NULL:
        raise RuntimeError("no float32 peak loop for this architecture")
    return _run_peak(fn, iters, nthreads)


def read_bytes(const uint8_t[::1] buf, int nthreads, int reads=1):
    """Read every byte of buf `reads` times, split across `nthreads` threads, each thread
    its share (a bandwidth probe)."""
    cdef int64_t n = buf.shape[0], chunk = (n // nthreads) // 64 * 64, t
    cdef int r
    out = np.zeros(nthreads, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    if chunk == 0:
        return 0
    with nogil:
        for t in prange(nthreads, schedule="static", num_threads=nthreads):
            for r in range(reads):
                o[t] ^= w8_read_bytes(&buf[t * chunk], chunk)
    return int(np.bitwise_xor.reduce(out))
