# cython: language_level=3
"""The products' float outputs: where an output of each size comes from, and why
(alignment, huge pages); and which out= a product writes as it is."""
from libc.stdint cimport int64_t

cimport numpy as cnp
import numpy as np

cnp.import_array()


# Packed panels and float outputs start on a cache line, so that no 64-byte quad row, tile
# row or zmm store straddles two lines (numpy aligns to 16 bytes only): with the panels and
# the output 16 bytes off, the AMX product at 256 x 1152 x 6912 took 1.5x as long, and a
# split line costs the AVX-512 loads too.
ALIGN_BYTES = 64
# Smaller outputs (empty_output) come straight from numpy's allocator: aligning one costs
# 0.4 us a call, more than the split lines cost an output written once by a call that
# reads 16 or more weight bytes per output byte (M = 1).
ALIGNED_FROM_BYTES = 64 * 1024
cdef cnp.npy_intp _aligned_from_bytes = ALIGNED_FROM_BYTES


# Outputs from ALIGNED_FROM_BYTES on: _simd/outputs.h's kept memory, torch's outputs' too.
cdef extern from "_simd/outputs.h" nogil:
    int W8_KEPT_OUTPUTS
    size_t W8_KEPT_OUTPUT_BYTES
    void *w8_output_take(size_t bytes, size_t *size)
    void w8_output_give(void *memory, size_t size)
    size_t w8_kept_output_bytes()
    int w8_outputs_init()
if w8_outputs_init() != 0:
    raise ImportError("pyw8a8._outputs: pthread_atfork failed")
RECYCLED_BUFFERS, RECYCLED_BYTES = W8_KEPT_OUTPUTS, W8_KEPT_OUTPUT_BYTES


cdef void *output_take(size_t nbytes, size_t *size) noexcept nogil:
    return w8_output_take(nbytes, size)


cdef void output_give(void *memory, size_t size) noexcept nogil:
    w8_output_give(memory, size)


def recycled_bytes():
    """Bytes of freed output memory kept for later outputs."""
    return w8_kept_output_bytes()


cdef class _OutputMemory:
    """The memory of one output array (its base): kept for a later output, or freed, with
    the array."""
    cdef void *data
    cdef size_t size

    def __dealloc__(self):
        if self.data != NULL:
            w8_output_give(self.data, self.size)


cdef cnp.ndarray _empty_output(int nd, cnp.npy_intp *dims):
    cdef cnp.npy_intp nbytes = sizeof(float), i
    cdef _OutputMemory memory
    for i in range(nd):
        nbytes *= dims[i]
    if nbytes < _aligned_from_bytes:
        return cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
    memory = _OutputMemory.__new__(_OutputMemory)
    memory.data = w8_output_take(nbytes, &memory.size)
    if memory.data == NULL:
        raise MemoryError(f"no memory for a {nbytes}-byte output")
    arr = cnp.PyArray_SimpleNewFromData(nd, dims, cnp.NPY_FLOAT32, memory.data)
    cnp.set_array_base(arr, memory)
    return arr


def empty_output(tuple shape):
    """An uninitialized C-contiguous float32 array of `shape`: from ALIGNED_FROM_BYTES on,
    in memory of its own (recycled when freed) starting on an ALIGN_BYTES boundary."""
    cdef cnp.npy_intp dims[64]
    cdef int i, nd = len(shape)
    if nd > 64:
        raise ValueError(f"{nd} dimensions: at most 64")
    for i in range(nd):
        dims[i] = shape[i]
    return _empty_output(nd, dims)


# ---- numpy's out=: the one rule matmul and the compiled call read ----

cpdef int out_fault(object out, object x, cnp.ndarray rows, int64_t n, object dtype=None):
    """How `out` stands as the output of the product of `rows` (x as the float32 array the
    product reads) with a weight of n outputs, `dtype` (None, float32 or bfloat16) the
    dtype asked for. ARG_READY: an ndarray the product writes as it is: native float32,
    C-contiguous, aligned and writeable, of rows' leading dimensions and n columns,
    sharing no memory with x.  ARG_CONVERT: acceptable, copied into from a float32 array
    the product writes (bfloat16, strided, unaligned).  Else the first fault of
    ARG_BAD_TYPE (not an ndarray), ARG_BAD_SHAPE, ARG_BAD_DTYPE (not `dtype`; without it,
    neither float32 nor bfloat16), ARG_READ_ONLY, ARG_OVERLAPS (sharing memory with x)."""
    cdef cnp.ndarray arr
    cdef int i, nd = rows.ndim
    cdef bint float32
    cdef char *o
    cdef char *a
    if not isinstance(out, np.ndarray):
        return ARG_BAD_TYPE
    arr = out
    if arr.ndim != nd or arr.shape[nd - 1] != n:
        return ARG_BAD_SHAPE
    for i in range(nd - 1):
        if arr.shape[i] != rows.shape[i]:
            return ARG_BAD_SHAPE
    float32 = cnp.PyArray_TYPE(arr) == cnp.NPY_FLOAT32 and cnp.PyArray_ISNOTSWAPPED(arr)
    if (not float32 and arr.dtype.name != "bfloat16") if dtype is None else arr.dtype != dtype:
        return ARG_BAD_DTYPE
    if not cnp.PyArray_ISWRITEABLE(arr):
        return ARG_READ_ONLY
    if (type(x) is np.ndarray and cnp.PyArray_IS_C_CONTIGUOUS(arr)
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x)):
        # Contiguous arrays share memory exactly when their byte ranges overlap.
        o, a = <char *>cnp.PyArray_DATA(arr), <char *>cnp.PyArray_DATA(<cnp.ndarray>x)
        if o < a + cnp.PyArray_NBYTES(<cnp.ndarray>x) and a < o + cnp.PyArray_NBYTES(arr):
            return ARG_OVERLAPS
    elif np.shares_memory(arr, x):
        return ARG_OVERLAPS
    return ARG_READY if float32 and cnp.PyArray_ISCARRAY(arr) else ARG_CONVERT
