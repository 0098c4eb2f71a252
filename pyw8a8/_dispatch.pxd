# The registry's ISAs and the call setup (_dispatch.pyx), as the other compiled modules
# cimport them: the ISA handle and the rules a settled call reads from C.
from libc.stdint cimport int64_t

from pyw8a8._core cimport w8_isa_ops


cdef class IsaOps:
    cdef w8_isa_ops table
    cdef const w8_isa_ops *ops
    cdef readonly str name
    cdef readonly int mr, npanels
    cdef readonly bint whole_k


cpdef IsaOps call_ops(int64_t rows)
cpdef bint fork_fallback() noexcept nogil
cpdef int num_threads() noexcept nogil
cpdef int threads_for(int64_t work) noexcept nogil
cdef void call_place(int64_t rows, int64_t work, int torch_threads, const void **isa,
                     int *nthreads) noexcept nogil
