# The float outputs of the products (_outputs.pyx), as _kernels cimports them.
from libc.stdint cimport int64_t

cimport numpy as cnp


cdef cnp.ndarray _empty_output(int nd, cnp.npy_intp *dims)
cdef void *output_take(size_t nbytes, size_t *size) noexcept nogil
cdef void output_give(void *memory, size_t size) noexcept nogil

# How an out= stands (out_fault).
cpdef enum:
    ARG_READY = 0           # accepted, and written as it is
    ARG_CONVERT = 1         # accepted: written from a float32 array the product writes
    ARG_BAD_TYPE = 2
    ARG_BAD_DTYPE = 3
    ARG_BAD_SHAPE = 4
    ARG_READ_ONLY = 6
    ARG_OVERLAPS = 7
cpdef int out_fault(object out, object x, cnp.ndarray rows, int64_t n, object dtype=*)
