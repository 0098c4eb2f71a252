# cython: language_level=3
"""Compiled block Hadamard rotation: typed entry points around ``_simd/fwht.h``.

Callers (``pyw8a8.rotation``) validate every argument first: arrays are C-contiguous
float32, block sizes are powers of two, `isa` is the active path's index in the registry
(``IsaOps.index``). Loops release the GIL and run rows (blocks, in `fwht_blocks`) in
OpenMP ``prange``.
"""
from cython.parallel cimport parallel, prange
from libc.stdint cimport int64_t, uint32_t
cimport numpy as cnp

import numpy as np

from pyw8a8._kernels cimport (W8_NUM_ISAS, w8_fwht_fn, w8_isas, w8_join_team,
                              w8_master_here, w8_master_place, w8_rotate_row, w8_sign_bit,
                              w8_sign_scale_fn, w8_unrotate_row)

cnp.import_array()


cdef inline int _checked(int isa) except -1:
    if not 0 <= isa < W8_NUM_ISAS:
        raise ValueError(f"no instruction-set path has index {isa}")
    return isa


def fwht_blocks(int isa, cnp.ndarray x, int64_t block, int nthreads):
    """Unnormalized FWHT, in place, of every `block` consecutive values of x.

    x is a writeable, C-contiguous float32 array whose size is a multiple of `block` (checked
    here too, so a wrong call raises instead of writing out of bounds). It is read through its
    data pointer, and one thread runs without entering an OpenMP region: a typed memoryview
    and a parallel region cost about 1 us per call, the time of some 30 block transforms.
    """
    if (cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(x)
            or not cnp.PyArray_ISWRITEABLE(x) or block < 1 or cnp.PyArray_SIZE(x) % block):
        raise ValueError("fwht_blocks needs a writeable C-contiguous float32 array whose "
                         "size is a multiple of block")
    cdef w8_fwht_fn fwht = w8_isas[_checked(isa)].fwht
    cdef float *p = <float *> cnp.PyArray_DATA(x)
    cdef int64_t nblocks = cnp.PyArray_SIZE(x) // block, i
    cdef w8_master_place master
    if nthreads <= 1:
        with nogil:
            for i in range(nblocks):
                fwht(p + i * block, block)
    else:
        master = w8_master_here()
        with nogil, parallel(num_threads=nthreads):
            w8_join_team(master)
            for i in prange(nblocks, schedule="static"):
                fwht(p + i * block, block)


def rotate_rows(int isa, const float[:, ::1] x, float[:, ::1] out, int64_t block,
                uint32_t seed, bint inverse, int nthreads):
    """out = the block rotation of each row of x, or its inverse (out may be x when the
    lengths agree).

    Forward, out has K rounded up to a multiple of block columns (a last partial block of x
    is zero-padded); the inverse needs K a multiple of block and out as wide as x (checked
    here too, so a wrong call raises instead of writing out of bounds).
    """
    cdef w8_fwht_fn fwht = w8_isas[_checked(isa)].fwht
    cdef w8_sign_scale_fn sign_scale = w8_isas[isa].sign_scale
    cdef int64_t M = x.shape[0], K = x.shape[1], i
    if (block < 1 or out.shape[0] != M or
            out.shape[1] != (K if inverse else (K + block - 1) // block * block) or
            (inverse and K % block)):
        raise ValueError("rotate_rows: out must have x's rows and K (inverse: K a multiple "
                         "of block) or, forward, K rounded up to block columns")
    if M == 0 or K == 0:
        return
    cdef w8_master_place master = w8_master_here()
    with nogil, parallel(num_threads=nthreads):
        w8_join_team(master)
        for i in prange(M, schedule="static"):
            if inverse:
                w8_unrotate_row(fwht, sign_scale, &x[i, 0], &out[i, 0], K, block, seed)
            else:
                w8_rotate_row(fwht, sign_scale, &x[i, 0], &out[i, 0], K, block, seed)


def signs(int isa, uint32_t start, int64_t n, uint32_t seed):
    """The +-1 signs of positions start .. start + n - 1 as path `isa` applies them.

    Returns
    -------
    ndarray of float32, shape (n,)
    """
    cdef w8_sign_scale_fn sign_scale = w8_isas[_checked(isa)].sign_scale
    out = np.ones(n, dtype=np.float32)
    cdef float[::1] o = out
    if n > 0:
        sign_scale(&o[0], &o[0], n, start, seed, 1.0)
    return out


def sign_bits(uint32_t start, int64_t n, uint32_t seed):
    """w8_sign_bit (the reference definition) of positions start .. start + n - 1.

    Returns
    -------
    ndarray of uint8, shape (n,)
        1 where the position is negated.
    """
    out = np.empty(n, dtype=np.uint8)
    cdef unsigned char[::1] o = out
    cdef int64_t i
    for i in range(n):
        o[i] = <unsigned char>w8_sign_bit(start + <uint32_t>i, seed)
    return out
