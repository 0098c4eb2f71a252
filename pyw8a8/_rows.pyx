# cython: language_level=3
"""The passes of an ISA over rows: the block Hadamard rotation (``_simd/fwht.h``), the
quantization of activation rows (fused with it; ``_simd/quant.h``) and the activation pass.

Callers (``pyw8a8.rotation``, ``pyw8a8.quantize``, ``pyw8a8.matmul``) validate every
argument first: arrays are C-contiguous float32, block sizes are powers of two, `isa` is
the ISA (an ``IsaOps``) whose passes run. Loops release the GIL and run rows (blocks, in
`fwht_blocks`) in OpenMP ``prange``.
"""
from cython.parallel cimport parallel, prange, threadid
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset
cimport numpy as cnp

import numpy as np

from pyw8a8._core cimport (w8_fwht_fn, w8_isa_ops, w8_join_team, w8_master_here, w8_master_place,
                           w8_quantize_row, w8_quantize_row_rotated, w8_rotate_row,
                           w8_sign_bit, w8_sign_scale_fn, w8_sign_table, w8_tile_finish,
                           w8_unrotate_row)
from pyw8a8._dispatch cimport IsaOps

cnp.import_array()


def fwht_blocks(IsaOps isa, cnp.ndarray x, int64_t block, int nthreads):
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
    cdef w8_fwht_fn fwht = isa.ops.fwht
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


def rotate_rows(IsaOps isa, const float[:, ::1] x, float[:, ::1] out, int64_t block,
                uint32_t seed, bint inverse, int nthreads):
    """out = the block rotation of each row of x, or its inverse (out may be x when the
    lengths agree).

    Forward, out has K rounded up to a multiple of block columns (a last partial block of x
    is zero-padded); the inverse needs K a multiple of block and out as wide as x (checked
    here too, so a wrong call raises instead of writing out of bounds).
    """
    cdef w8_fwht_fn fwht = isa.ops.fwht
    cdef w8_sign_scale_fn sign_scale = isa.ops.sign_scale
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


def signs(IsaOps isa, uint32_t start, int64_t n, uint32_t seed):
    """The +-1 signs of positions start .. start + n - 1 as ISA `isa` applies them.

    Returns
    -------
    ndarray of float32, shape (n,)
    """
    cdef w8_sign_scale_fn sign_scale = isa.ops.sign_scale
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


def quantize_rows(IsaOps isa, int enc, const float[:, ::1] x, uint8_t[:, ::1] q,
                  float[::1] scale, int32_t[:, ::1] psum, int nthreads, int64_t block=0,
                  uint32_t seed=0):
    """Quantize each row of x into q (Kp columns, zero-padded) in parallel, as the kernel
    of ISA `isa` and weight encoding `enc` reads them; K >= 1.

    psum is (M, Kp/64 + 1) or has zero rows when prefix sums are not needed.
    block > 0 rotates each row first (block Hadamard with signs from `seed`, fused with
    the quantization; block is a power of two, a last partial block zero-padded: the
    caller makes Kp cover K rounded up to block).
    Returns the index of the first row holding NaN/Inf, or -1.
    """
    cdef int64_t M = x.shape[0], K = x.shape[1], Kp = q.shape[1], i
    cdef int want_psum = psum.shape[0] > 0
    cdef int64_t bad = -1
    cdef uint8_t flip = isa.ops.a_flip[enc]
    cdef float *signs = NULL
    cdef uint8_t *st
    if M == 0:
        return -1
    # Per-row status (0 ok, 1 NaN/Inf, 2 no scratch memory), scanned once at the end.
    st = <uint8_t *>calloc(M, 1)
    if st == NULL:
        raise MemoryError(f"no memory for the status of {M} rows")
    cdef w8_master_place master = w8_master_here()
    if block == 0:
        with nogil, parallel(num_threads=nthreads):
            w8_join_team(master)
            for i in prange(M, schedule="static"):
                st[i] = w8_quantize_row(isa.ops, &x[i, 0], K, Kp, flip, &q[i, 0],
                                        &scale[i], &psum[i, 0] if want_psum else NULL)
    else:
        signs = <float *>malloc(K * sizeof(float))
        if signs == NULL:
            free(st)
            raise MemoryError(f"no memory for the sign table of {K} features")
        w8_sign_table(isa.ops.sign_scale, signs, K, block, seed)
        with nogil:
            _quantize_rotated(isa.ops, x, q, scale, psum, flip, block, signs, st, nthreads,
                              master)
        free(signs)
    for i in range(M):
        if st[i] != 0:
            bad = i if st[i] == 1 else -2
            break
    free(st)
    if bad == -2:
        raise MemoryError(f"no memory for a scratch row of {K} floats")
    return bad


cdef void _quantize_rotated(const w8_isa_ops *ops, const float[:, ::1] x, uint8_t[:, ::1] q,
                            float[::1] scale, int32_t[:, ::1] psum, uint8_t flip,
                            int64_t block, const float *signs, uint8_t *st, int nthreads,
                            w8_master_place master) noexcept nogil:
    """quantize_rows's rotated rows, each from a scratch row of its thread's, so the
    activation matrix is never copied whole; st[i] 2 where no scratch could be had."""
    cdef int64_t i, K = x.shape[1], Kp = q.shape[1]
    cdef float *scratch = NULL
    cdef int want_psum = psum.shape[0] > 0
    with parallel(num_threads=nthreads):
        w8_join_team(master)
        scratch = <float *>malloc(Kp * sizeof(float))  # Kp >= K padded to block
        for i in prange(x.shape[0], schedule="static"):
            if scratch == NULL:
                st[i] = 2
            else:
                st[i] = w8_quantize_row_rotated(
                    ops, &x[i, 0], K, Kp, flip, &q[i, 0], &scale[i],
                    &psum[i, 0] if want_psum else NULL, block, signs, scratch)
        free(scratch)


def activate(IsaOps isa, float[:, ::1] x, int act):
    """Apply activation `act` (a W8_ACT_* value) in place to x with the activation pass of
    ISA `isa` (its vectors and its scalar tail), as the fused layer applies it to its
    tiles; for testing one ISA's arithmetic on any float32 values."""
    cdef w8_tile_finish fin
    cdef int64_t r, c0, cols = x.shape[1]
    memset(&fin, 0, sizeof(fin))
    fin.act = act
    if x.shape[0] == 0 or cols == 0:
        return
    with nogil:
        for r in range(x.shape[0]):
            for c0 in range(0, cols, 1 << 20):
                isa.ops.act_tile(&x[r, c0], cols, 1, <int>min(cols - c0, 1 << 20), &fin)
