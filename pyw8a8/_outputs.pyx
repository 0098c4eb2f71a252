# cython: language_level=3
"""The memory of the products' float outputs: where an output of each size comes from,
and why (alignment, huge pages)."""
from libc.stdlib cimport free
from posix.stdlib cimport posix_memalign

cimport numpy as cnp

cnp.import_array()


# Packed panels and float outputs start on a cache line, so that no 64-byte quad row, tile
# row or zmm store straddles two lines (numpy aligns to 16 bytes only): with the panels and
# the output 16 bytes off, the AMX product at 256 x 1152 x 6912 took 1.5x as long, and a
# split line costs the AVX-512 loads too.
ALIGN_BYTES = 64
# Smaller outputs (empty_output) come straight from numpy's allocator: aligning costs 0.4 us
# a call (a view of a larger buffer), more than the split lines cost an output written once
# by a call that reads 16 or more weight bytes per output byte (a decode step's, M = 1).
ALIGNED_FROM_BYTES = 64 * 1024
cdef cnp.npy_intp _align_bytes = ALIGN_BYTES, _aligned_from_bytes = ALIGNED_FROM_BYTES


# From 4 MiB on, numpy asks the kernel for transparent huge pages (madvise), and where the
# kernel then compacts memory to find them (defrag "madvise", the default of many systems)
# each fresh output pays for it: on the Zen 5 host, an 18 MiB array took 42 ms to allocate
# and fill against 7.5 ms without the advice, and a sentence encoder's linear layers twice
# their time alone.  An output is written once and read by the next operation, which huge
# pages do not speed up, so large ones come from malloc, as torch's tensors do.
PLAIN_PAGES_FROM_BYTES = 1 << 22
cdef cnp.npy_intp _plain_pages_from_bytes = PLAIN_PAGES_FROM_BYTES


cdef class _OutputMemory:
    """The memory of one large output array (its base): freed with the array."""
    cdef void *data

    def __dealloc__(self):
        free(self.data)


cdef cnp.ndarray _empty_output(int nd, cnp.npy_intp *dims):
    cdef cnp.npy_intp nbytes = sizeof(float), i
    cdef char *data
    cdef _OutputMemory memory
    for i in range(nd):
        nbytes *= dims[i]
    if nbytes < _aligned_from_bytes:
        return cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
    if nbytes >= _plain_pages_from_bytes:
        memory = _OutputMemory.__new__(_OutputMemory)
        if posix_memalign(&memory.data, _align_bytes, nbytes) != 0:
            raise MemoryError(f"no memory for a {nbytes}-byte output")
        arr = cnp.PyArray_SimpleNewFromData(nd, dims, cnp.NPY_FLOAT32, memory.data)
        cnp.set_array_base(arr, memory)
        return arr
    nbytes += _align_bytes
    buf = cnp.PyArray_EMPTY(1, &nbytes, cnp.NPY_UINT8, 0)
    data = <char *>cnp.PyArray_DATA(buf)
    data += (-<size_t>data) % <size_t>_align_bytes
    arr = cnp.PyArray_SimpleNewFromData(nd, dims, cnp.NPY_FLOAT32, data)
    cnp.set_array_base(arr, buf)
    return arr


def empty_output(tuple shape):
    """An uninitialized C-contiguous float32 array of `shape`: from ALIGNED_FROM_BYTES on,
    its data starts on an ALIGN_BYTES boundary (a view of a slightly larger buffer), from
    PLAIN_PAGES_FROM_BYTES on in memory of its own without huge-page advice."""
    cdef cnp.npy_intp dims[64]
    cdef int i, nd = len(shape)
    if nd > 64:
        raise ValueError(f"{nd} dimensions: at most 64")
    for i in range(nd):
        dims[i] = shape[i]
    return _empty_output(nd, dims)
