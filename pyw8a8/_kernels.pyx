# cython: language_level=3
"""Compiled core of pyw8a8: typed entry points around the C kernels of ``_simd``.

Callers (the Python modules of the package) validate and normalize every argument first;
this module trusts its inputs, releases the GIL and runs its loops in OpenMP ``prange``.
"""
from cython.parallel cimport parallel, prange
cimport openmp
from openmp cimport omp_get_max_threads
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

cimport numpy as cnp
import numpy as np

cnp.import_array()

NR = W8_NR
KPAD = W8_KPAD
MAX_KC = W8_MAX_KC
OUT_F32 = W8_OUT_F32
OUT_I32 = W8_OUT_I32
OUT_I64 = W8_OUT_I64
CORR_NONE = W8_CORR_NONE
CORR_ROW = W8_CORR_ROW
CORR_COL = W8_CORR_COL

cdef w8_cpu_features _features
w8_cpu_detect(&_features)


def cpu_features():
    """Instruction-set features the CPU and the operating system both support."""
    return {
        "sse4_1": bool(_features.sse41), "avx2": bool(_features.avx2),
        "fma": bool(_features.fma), "avx512f": bool(_features.avx512f),
        "avx512bw": bool(_features.avx512bw), "avx512vl": bool(_features.avx512vl),
        "avx512_vnni": bool(_features.avx512vnni), "avx_vnni": bool(_features.avxvnni),
        "amx_tile": bool(_features.amx_tile), "amx_int8": bool(_features.amx_int8),
        "asimd": bool(_features.asimd), "asimddp": bool(_features.asimddp),
    }


def isa_names():
    """Every path compiled into this binary, most preferred first."""
    return [w8_isa_names[i].decode() for i in range(W8_NUM_ISAS)
            if w8_isa_lookup(w8_isa_names[i]) != NULL]


def isa_supported(str name):
    cdef bytes b = name.encode()
    return bool(w8_isa_supported(&_features, b))


cdef class IsaOps:
    """One instruction-set path: the C function table and its kernel geometry."""
    cdef const w8_isa_ops *ops
    cdef readonly str name
    cdef readonly int mr, nv

    def __cinit__(self, str name):
        cdef bytes b = name.encode()
        self.ops = w8_isa_lookup(b)
        if self.ops == NULL:
            raise ValueError(f"unknown instruction-set path {name!r}")
        self.name = name
        self.mr = self.ops.mr
        self.nv = self.ops.nv

    def a_flip(self, int enc):
        """XOR applied to quantized activations for the kernel of encoding `enc`."""
        return int(self.ops.a_flip[enc])

    def corr(self, int enc):
        """Compensation (CORR_*) the kernel of encoding `enc` needs."""
        return int(self.ops.corr[enc])


def quantize_rows(IsaOps isa, const float[:, ::1] x, uint8_t[:, ::1] q, float[::1] scale,
                  int32_t[:, ::1] psum, int flip, int nthreads, int64_t block=0,
                  uint32_t seed=0):
    """Quantize each row of x into q (Kp columns, zero-padded) in parallel; K >= 1.

    psum is (M, Kp/64 + 1) or has zero rows when prefix sums are not needed.
    block > 0 rotates each row first (block Hadamard with signs from `seed`, fused with
    the quantization; block is a power of two, a last partial block zero-padded: the
    caller makes Kp cover K rounded up to block).
    Returns the index of the first row holding NaN/Inf, or -1.
    """
    cdef int64_t M = x.shape[0], K = x.shape[1], Kp = q.shape[1], i
    cdef int want_psum = psum.shape[0] > 0
    cdef int64_t bad = -1
    cdef w8_fwht_fn fwht
    cdef float *scratch = NULL
    cdef uint8_t *st
    if M == 0:
        return -1
    # Per-row status (0 ok, 1 NaN/Inf, 2 no scratch memory), scanned once at the end.
    st = <uint8_t *>calloc(M, 1)
    if st == NULL:
        raise MemoryError(f"no memory for the status of {M} rows")
    if block == 0:
        with nogil:
            for i in prange(M, schedule="static", num_threads=nthreads):
                st[i] = w8_quantize_row(isa.ops, &x[i, 0], K, Kp,
                                        <uint8_t>flip, &q[i, 0],
                                        &scale[i], &psum[i, 0] if want_psum else NULL)
    else:
        fwht = w8_fwht_for(isa.ops.name)
        # One scratch row per thread: the rotated row is quantized from it, so the
        # activation matrix is never copied whole.
        with nogil, parallel(num_threads=nthreads):
            scratch = <float *>malloc(Kp * sizeof(float))  # Kp >= K padded to block
            for i in prange(M, schedule="static"):
                if scratch == NULL:
                    st[i] = 2
                else:
                    st[i] = w8_quantize_row_rotated(
                        isa.ops, fwht, &x[i, 0], K, Kp, <uint8_t>flip, &q[i, 0],
                        &scale[i], &psum[i, 0] if want_psum else NULL, block, seed, scratch)
            free(scratch)
    for i in range(M):
        if st[i] != 0:
            bad = i if st[i] == 1 else -2
            break
    free(st)
    if bad == -2:
        raise MemoryError(f"no memory for a scratch row of {K} floats")
    return bad


def gemm(IsaOps isa, list jobs, int nthreads):
    """Run GEMM jobs in one parallel region.

    Each job is a tuple ``(enc, a, a_psum, b, b_psum, a_scale, b_scale, N, out, out_kind,
    kc, mc, nc, m_step, n_step)``: C[:M, :N] of `out` (a C-contiguous 2-D float32, int32 or
    int64 array per out_kind, rows possibly longer than N) = the quantized activations `a`
    (M, Kp) times the packed panels `b`, split into m_step x n_step tasks.  Empty
    psum/scale arrays (zero rows) mean "not needed".  Arrays must stay alive (the caller's
    list keeps them) and are trusted: the Python layer has validated them.
    """
    cdef int njobs = len(jobs), j
    cdef int64_t M, N, Kp, m_step, n_step, t, ntasks = 0
    cdef const uint8_t[:, ::1] a
    cdef const int32_t[:, ::1] a_psum, b_psum
    cdef const uint8_t[::1] b
    cdef const float[::1] a_scale, b_scale
    cdef cnp.ndarray outa
    cdef int64_t job_m_step[64]
    cdef int64_t job_n_step[64]
    cdef int64_t job_first[65]
    if njobs > 64:
        raise ValueError("at most 64 jobs per call")
    cdef w8_gemm_plan plans[64]
    job_first[0] = 0
    for j in range(njobs):
        (enc, a, a_psum, b, b_psum, a_scale, b_scale, N, outa, out_kind,
         kc, mc, nc, m_step, n_step) = jobs[j]
        M = a.shape[0]
        Kp = a.shape[1]
        job_m_step[j] = m_step
        job_n_step[j] = n_step
        if M == 0 or N == 0 or Kp == 0:
            job_first[j + 1] = job_first[j]
            continue
        plans[j].ops = isa.ops
        plans[j].enc = enc
        plans[j].M = M
        plans[j].N = N
        plans[j].Kp = Kp
        plans[j].a = &a[0, 0]
        plans[j].lda = Kp
        plans[j].a_psum = &a_psum[0, 0] if a_psum.shape[0] > 0 else NULL
        plans[j].b = &b[0]
        plans[j].b_psum = &b_psum[0, 0] if b_psum.shape[0] > 0 else NULL
        plans[j].a_scale = &a_scale[0] if a_scale.shape[0] > 0 else NULL
        plans[j].b_scale = &b_scale[0] if b_scale.shape[0] > 0 else NULL
        plans[j].out_kind = out_kind
        plans[j].out = cnp.PyArray_DATA(outa)
        plans[j].ldo = outa.strides[0] // outa.itemsize
        plans[j].kc = kc
        plans[j].mc = mc
        plans[j].nc = nc
        job_first[j + 1] = job_first[j] + ((M + m_step - 1) // m_step) * \
            ((N + n_step - 1) // n_step)
    ntasks = job_first[njobs]
    if ntasks == 0:
        return
    with nogil:
        for t in prange(ntasks, schedule="dynamic", num_threads=nthreads):
            _run_task(plans, njobs, job_first, job_m_step, job_n_step, t)


cdef void _run_task(const w8_gemm_plan *plans, int njobs, const int64_t *job_first,
                    const int64_t *m_steps, const int64_t *n_steps,
                    int64_t t) noexcept nogil:
    """Task t: the job whose task range holds t, then its (m block, n block) in row-major
    order of blocks."""
    cdef int j = 0
    while t >= job_first[j + 1]:
        j += 1
    cdef const w8_gemm_plan *g = &plans[j]
    cdef int64_t local = t - job_first[j]
    cdef int64_t n_blocks = (g.N + n_steps[j] - 1) // n_steps[j]
    cdef int64_t m0 = (local // n_blocks) * m_steps[j], n0 = (local % n_blocks) * n_steps[j]
    w8_gemm_range(g, m0, min(m0 + m_steps[j], g.M), n0, min(n0 + n_steps[j], g.N))

def amx_request():
    """Ask the OS for the AMX tile state; True when granted."""
    return bool(w8_amx_request())


def omp_max_threads():
    """OpenMP's current default team size (OMP_NUM_THREADS, omp_set_num_threads)."""
    return omp_get_max_threads()


def peak_macs(str isa, int64_t iters, int nthreads):
    """Run the int8 instruction-peak loop of path `isa` on `nthreads` threads.

    Returns the total multiply-accumulates performed (divide by the wall time).
    """
    cdef bytes name = isa.encode()
    cdef w8_peak_fn fn = w8_peak_for(name)
    cdef int64_t t, total = 0
    cdef int32_t sink = 0
    sinks = np.zeros(nthreads, dtype=np.int32)
    macs = np.zeros(nthreads, dtype=np.int64)
    cdef int32_t[::1] s = sinks
    cdef int64_t[::1] mv = macs
    with nogil:
        for t in prange(nthreads, schedule="static", num_threads=nthreads):
            mv[t] = fn(iters, &s[t])
    return int(macs.sum())


def read_bytes(const uint8_t[::1] buf, int nthreads):
    """Read every byte of buf, split across `nthreads` threads (a bandwidth probe)."""
    cdef int64_t n = buf.shape[0], chunk = (n // nthreads) // 64 * 64, t
    out = np.zeros(nthreads, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    if chunk == 0:
        return 0
    with nogil:
        for t in prange(nthreads, schedule="static", num_threads=nthreads):
            o[t] = w8_read_bytes(&buf[t * chunk], chunk)
    return int(np.bitwise_xor.reduce(out))
