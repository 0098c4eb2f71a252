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
# Smaller outputs (empty_output) come straight from numpy's allocator: aligning one costs
# 0.4 us a call, more than the split lines cost an output written once by a call that
# reads 16 or more weight bytes per output byte (M = 1).
ALIGNED_FROM_BYTES = 64 * 1024
cdef cnp.npy_intp _align_bytes = ALIGN_BYTES, _aligned_from_bytes = ALIGNED_FROM_BYTES


# Outputs from ALIGNED_FROM_BYTES on own their memory (posix_memalign: aligned, and without
# the transparent-huge-page advice numpy gives arrays from 4 MiB on, which makes the kernel
# compact memory for each fresh output: an 18 MiB array took 5.6x as long to allocate and
# fill with it, on a Zen 5).  Freed, that memory is kept for the next
# output of about its size (RECYCLED_*): a model's layers free and allocate outputs of the
# same few shapes call after call, and memory glibc has given back to the system returns
# as fresh pages, faulted and zeroed on the product's first write.  The sentence encoder
# through pyw8a8.torch encoded 1.05x as fast on a Zen 3 with each output's memory reused.
cdef enum:
    _RECYCLED_SLOTS = 8                   # freed buffers kept at most
cdef size_t _recycled_limit = 1 << 28     # and at most this many bytes of them
RECYCLED_BUFFERS, RECYCLED_BYTES = _RECYCLED_SLOTS, _recycled_limit
cdef void *_recycled[_RECYCLED_SLOTS]
cdef size_t _recycled_size[_RECYCLED_SLOTS]
cdef int _recycled_count = 0
cdef size_t _recycled_bytes = 0


cdef void *_take_recycled(size_t nbytes, size_t *size) noexcept:
    """The most recently freed kept buffer of nbytes to 2 * nbytes bytes (its size to
    `size`), no longer kept; NULL if none.  Called with the GIL held, as _recycle is."""
    cdef int i
    cdef void *data
    for i in range(_recycled_count - 1, -1, -1):
        if nbytes <= _recycled_size[i] <= 2 * nbytes:
            data, size[0] = _recycled[i], _recycled_size[i]
            _forget(i)
            return data
    return NULL


cdef void _forget(int i) noexcept:
    """Stop keeping kept buffer `i` (the newer ones move down one place)."""
    global _recycled_count, _recycled_bytes
    cdef int j
    _recycled_bytes -= _recycled_size[i]
    for j in range(i, _recycled_count - 1):
        _recycled[j], _recycled_size[j] = _recycled[j + 1], _recycled_size[j + 1]
    _recycled_count -= 1


cdef void _recycle(void *data, size_t size) noexcept:
    """Keep a freed output's memory for a later output, dropping the oldest kept buffers
    to stay within RECYCLED_BUFFERS and RECYCLED_BYTES; free it if it alone exceeds them."""
    global _recycled_count, _recycled_bytes
    if size > _recycled_limit:
        free(data)
        return
    while _recycled_count == _RECYCLED_SLOTS or _recycled_bytes + size > _recycled_limit:
        free(_recycled[0])
        _forget(0)
    _recycled[_recycled_count], _recycled_size[_recycled_count] = data, size
    _recycled_count += 1
    _recycled_bytes += size


def recycled_bytes():
    """Bytes of freed output memory kept for later outputs."""
    return _recycled_bytes


cdef class _OutputMemory:
    """The memory of one output array (its base): kept for a later output, or freed, with
    the array."""
    cdef void *data
    cdef size_t size

    def __dealloc__(self):
        if self.data != NULL:
            _recycle(self.data, self.size)


cdef cnp.ndarray _empty_output(int nd, cnp.npy_intp *dims):
    cdef cnp.npy_intp nbytes = sizeof(float), i
    cdef _OutputMemory memory
    for i in range(nd):
        nbytes *= dims[i]
    if nbytes < _aligned_from_bytes:
        return cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
    memory = _OutputMemory.__new__(_OutputMemory)
    memory.data = _take_recycled(nbytes, &memory.size)
    if memory.data == NULL:
        if posix_memalign(&memory.data, _align_bytes, nbytes) != 0:
            memory.data = NULL
            raise MemoryError(f"no memory for a {nbytes}-byte output")
        memory.size = nbytes
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
