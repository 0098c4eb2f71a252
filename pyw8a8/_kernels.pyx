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
from posix.stdlib cimport posix_memalign
from libc.string cimport memset

cimport numpy as cnp
import numpy as np

cnp.import_array()

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
    """Every path of the registry (compiled into this binary), most preferred first."""
    return [w8_isas[i].name.decode() for i in range(W8_NUM_ISAS)]


def isa_supported(str name):
    """Whether this CPU (and OS) runs path `name`; for amx this asks Linux for the tile
    state the first time."""
    cdef const w8_isa_ops *ops = w8_isa_lookup(name.encode())
    return ops != NULL and bool(ops.supported(&_features))


def isa_explicit_only(str name):
    """Whether path `name` is a test path, chosen only when asked for by name."""
    cdef const w8_isa_ops *ops = w8_isa_lookup(name.encode())
    return ops != NULL and bool(ops.explicit_only)


def best_isa():
    """The path the dispatcher picks on this CPU."""
    return w8_isa_best(&_features).name.decode()


cdef class IsaOps:
    """One instruction-set path: its registry entry, chosen once and passed along.

    ``noop_kernel=True`` gives a copy whose microkernels do no arithmetic (they store
    zeros): everything else runs as on the path, which is what ``bench --overhead`` times;
    ``tile_of`` then gives it the register tile (rows, panels) of another path, so the
    loop nest and epilogues run as often as they would there.
    """

    def __cinit__(self, str name, bint noop_kernel=False, str tile_of=None):
        cdef const w8_isa_ops *entry = w8_isa_lookup(name.encode())
        cdef const w8_isa_ops *tile = entry
        if entry == NULL:
            raise ValueError(f"unknown instruction-set path {name!r}")
        if tile_of is not None:
            tile = w8_isa_lookup(tile_of.encode())
            if tile == NULL or not noop_kernel:
                raise ValueError(f"tile_of={tile_of!r} needs noop_kernel=True and a path")
        self.table = entry[0]
        if noop_kernel:
            self.table.ukernel[0] = w8_noop_ukernel
            self.table.ukernel[1] = w8_noop_ukernel
            if self.table.ukernel_f32[0] != NULL:  # the path finishes tiles in its kernels
                self.table.ukernel_f32[0] = w8_noop_ukernel_f32
                self.table.ukernel_f32[1] = w8_noop_ukernel_f32
            self.table.mr, self.table.nv = tile.mr, tile.nv
            self.table.whole_tiles = tile.whole_tiles
        self.ops = &self.table
        # Its own name keeps the tuner's timings of the real kernels apart.
        self.name = name
        if noop_kernel:
            self.name += f"+noop({tile.name.decode()} tile)"
        self.index = entry - &w8_isas[0]
        self.mr = self.table.mr
        self.nv = self.table.nv
        self.whole_k = self.table.whole_k

    @property
    def auto_encoding(self):
        """The weight encoding this path runs best ('biased' or 'signed')."""
        return "signed" if self.ops.auto_encoding == W8_ENC_SIGNED else "biased"

    def row_sums(self, int enc):
        """Whether the kernel of encoding `enc` needs the activations' prefix sums."""
        return self.ops.corr[enc] == W8_CORR_ROW

    def activation_key(self, int enc):
        """Products whose keys are equal share one quantization of their activations."""
        return (self.ops.a_flip[enc], self.ops.corr[enc] == W8_CORR_ROW)

    def __repr__(self):
        return f"IsaOps({self.name!r})"


def quantize_rows(IsaOps isa, int enc, const float[:, ::1] x, uint8_t[:, ::1] q,
                  float[::1] scale, int32_t[:, ::1] psum, int nthreads, int64_t block=0,
                  uint32_t seed=0):
    """Quantize each row of x into q (Kp columns, zero-padded) in parallel, as the kernel
    of path `isa` and weight encoding `enc` reads them; K >= 1.

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
                st[i] = w8_quantize_row(isa.ops, &x[i, 0], K, Kp, flip, &q[i, 0],
                                        &scale[i], &psum[i, 0] if want_psum else NULL)
    else:
        # One scratch row per thread: the rotated row is quantized from it, so the
        # activation matrix is never copied whole.
        with nogil, parallel(num_threads=nthreads):
            scratch = <float *>malloc(Kp * sizeof(float))  # Kp >= K padded to block
            for i in prange(M, schedule="static"):
                if scratch == NULL:
                    st[i] = 2
                else:
                    st[i] = w8_quantize_row_rotated(
                        isa.ops, &x[i, 0], K, Kp, flip, &q[i, 0], &scale[i],
                        &psum[i, 0] if want_psum else NULL, block, seed, scratch)
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

    Each job is a tuple ``(enc, a, m, a_psum, b, b_psum, a_scale, b_scale, N, out,
    out_kind, kc, mc, nc, m_step, n_step)``: C[:m, :N] of `out` (a C-contiguous 2-D
    float32, int32 or int64 array per out_kind, rows possibly longer than N) = the first m
    rows of the quantized activations `a` (its rows a multiple of W8_A_ROW_PAD, Kp
    columns) times the packed panels `b`, split into m_step x n_step tasks.  float32 and
    int32 outputs need Kp <= W8_EXACT_K.  Empty psum/scale arrays (zero rows) mean "not
    needed".  Arrays must stay alive (the caller's list keeps them) and are trusted: the
    Python layer has validated them.
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
        (enc, a, M, a_psum, b, b_psum, a_scale, b_scale, N, outa, out_kind,
         kc, mc, nc, m_step, n_step) = jobs[j]
        Kp = a.shape[1]
        job_m_step[j] = m_step
        job_n_step[j] = n_step
        if M == 0 or N == 0 or Kp == 0:
            job_first[j + 1] = job_first[j]
            continue
        if out_kind != W8_OUT_I64 and Kp > W8_EXACT_K:
            raise ValueError(f"K of {Kp} needs the int64 output (W8_EXACT_K)")
        if a.shape[0] < M or a.shape[0] % W8_A_ROW_PAD:
            raise ValueError("the activation buffer must hold whole W8_A_ROW_PAD row tiles")
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
    cdef const w8_isa_ops *ops = isa.ops
    with nogil:
        if nthreads <= 1 or ntasks == 1:
            # No OpenMP region: waking a team costs more than a small product.
            w8_task_begin(ops)
            for t in range(ntasks):
                _run_task(plans, njobs, job_first, job_m_step, job_n_step, t)
            w8_task_end(ops)
        else:
            with parallel(num_threads=nthreads):
                # Once per thread and call (AMX: the tile configuration).
                w8_task_begin(ops)
                for t in prange(ntasks, schedule="dynamic"):
                    _run_task(plans, njobs, job_first, job_m_step, job_n_step, t)
                w8_task_end(ops)


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


def amx_config_roundtrip():
    """Load the AMX tile configuration and read it back (call only where the amx path is
    supported): True when every byte arrived, None when this build has no AMX path."""
    cdef int ok = w8_amx_config_roundtrip()
    return None if ok < 0 else bool(ok)


def omp_max_threads():
    """OpenMP's current default team size (OMP_NUM_THREADS, omp_set_num_threads)."""
    return omp_get_max_threads()


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
    """Run the int8 instruction-peak loop of path `isa` on `nthreads` threads (the caller
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


# ---- the compiled call path of matmul (one weight, float32 rows in, float32 rows out) ----

cdef class WeightPlan:
    """The per-weight half of a product, built once per packed weight: the kernel-ready
    pointers of its arrays (which it keeps alive), its sizes, encoding and rotation."""
    cdef readonly object panels, psum, scales, shape, encoding
    cdef readonly dict blocking  # settled tuner choices, (path, M, threads) -> blocking
    cdef const uint8_t *b
    cdef const int32_t *b_psum
    cdef const float *b_scale
    cdef readonly int64_t N, K, Kp, block
    cdef readonly int enc
    cdef readonly uint32_t seed
    cdef readonly bint rotate

    def __cinit__(self, cnp.ndarray panels, cnp.ndarray psum, cnp.ndarray scales,
                  tuple shape, str encoding, int64_t kp, bint rotate, int64_t block,
                  uint32_t seed):
        # The caller (PackedWeight.plan) has checked dtypes, shapes and contiguity.
        self.panels, self.psum, self.scales = panels, psum, scales
        self.shape, self.encoding = shape, encoding
        self.b = <const uint8_t *>cnp.PyArray_DATA(panels)
        self.b_psum = <const int32_t *>cnp.PyArray_DATA(psum) if psum.shape[0] else NULL
        self.b_scale = <const float *>cnp.PyArray_DATA(scales)
        self.N, self.K, self.Kp = shape[0], shape[1], kp
        self.enc = W8_ENC_SIGNED if encoding == "signed" else W8_ENC_BIASED
        self.rotate, self.block, self.seed = rotate, block, seed
        self.blocking = {}

    cpdef bint describes(self, panels, psum, scales, shape, encoding, bint rotate,
                         block, seed):
        """Whether this plan still describes a weight with these attributes (identity of
        the arrays: a weight whose arrays were replaced gets a new, checked plan)."""
        return (panels is self.panels and psum is self.psum and scales is self.scales and
                shape == self.shape and encoding == self.encoding and
                rotate == self.rotate and (not rotate or (block == self.block and
                                                         seed == self.seed)))


cdef class Scratch:
    """A buffer reused by the calls of one thread (the quantized activations, their scales
    and sums, the per-row status, the rotation's rows): growing it only when a call needs
    more spares a large product the allocation and page faults of fresh memory."""
    cdef char *data
    cdef size_t size

    cdef char *reserve(self, size_t n) except NULL:
        cdef void *p = NULL
        if n > self.size:
            if posix_memalign(&p, 64, n) != 0:
                raise MemoryError(f"no memory for {n} bytes of scratch")
            free(self.data)
            self.data = <char *>p
            self.size = n
        return self.data

    def __dealloc__(self):
        free(self.data)


cdef inline size_t _aligned(size_t n) nogil:
    return (n + 63) // 64 * 64


def matmul_rows(IsaOps isa, WeightPlan w, cnp.ndarray x, cnp.ndarray out, Scratch scratch,
                int nthreads, int64_t kc, int64_t mc, int64_t nc, int64_t m_step,
                int64_t n_step):
    """out = the W8A8 product of the rows of x with the weight `w`, in one call.

    x: (M, K) C-contiguous float32 with K == w.K; out: (M, N) C-contiguous float32, not
    overlapping x; w.Kp <= W8_EXACT_K; M >= 1.  Quantizes every row (rotated first when
    the weight is) into `scratch`, then runs the blocked product with the given blocking,
    the GIL released throughout.  Returns -1, or the index of the first row that holds
    NaN/Inf or whose rotation overflows (out is then unspecified).
    """
    cdef int64_t M = x.shape[0], K = w.K, Kp = w.Kp, N = w.N
    cdef int64_t Mp = (M + W8_A_ROW_PAD - 1) // W8_A_ROW_PAD * W8_A_ROW_PAD
    cdef int64_t np1 = Kp // W8_KPAD + 1, i, t, ntasks, n_blocks
    cdef const w8_isa_ops *ops = isa.ops
    cdef uint8_t flip = ops.a_flip[w.enc]
    cdef bint row_sums = ops.corr[w.enc] == W8_CORR_ROW
    cdef int64_t kr = (K + w.block - 1) // w.block * w.block if w.rotate else K
    cdef int nworkers = nthreads if nthreads > 1 else 1
    # Layout of the scratch: q | scales | prefix sums | status | one rotation row a thread.
    cdef size_t off_scale = _aligned(Mp * Kp)
    cdef size_t off_psum = off_scale + _aligned(M * sizeof(float))
    cdef size_t off_st = off_psum + _aligned(M * np1 * sizeof(int32_t) if row_sums else 0)
    cdef size_t off_rot = off_st + _aligned(M)
    cdef size_t rot_row = _aligned(kr * sizeof(float)) if w.rotate else 0
    cdef char *base = scratch.reserve(off_rot + rot_row * nworkers)
    cdef uint8_t *q = <uint8_t *>base
    cdef float *a_scale = <float *>(base + off_scale)
    cdef int32_t *a_psum = <int32_t *>(base + off_psum) if row_sums else NULL
    cdef uint8_t *st = <uint8_t *>(base + off_st)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(x)
    cdef int64_t block = w.block if w.rotate else 0
    cdef uint32_t seed = w.seed
    cdef w8_gemm_plan g
    cdef int tid
    with nogil:
        if nworkers == 1:
            for i in range(M):
                st[i] = _quantize_one(ops, block, seed, xp + i * K, K, Kp, flip, q + i * Kp,
                                      a_scale + i, a_psum + i * np1 if row_sums else NULL,
                                      <float *>(base + off_rot))
        else:
            for i in prange(M, schedule="static", num_threads=nworkers):
                tid = openmp.omp_get_thread_num()
                st[i] = _quantize_one(ops, block, seed, xp + i * K, K, Kp, flip, q + i * Kp,
                                      a_scale + i, a_psum + i * np1 if row_sums else NULL,
                                      <float *>(base + off_rot + tid * rot_row))
    for i in range(M):
        if st[i]:
            return i
    g.ops = ops
    g.enc = w.enc
    g.M, g.N, g.Kp = M, N, Kp
    g.a, g.lda, g.a_psum = q, Kp, a_psum
    g.b, g.b_psum = w.b, w.b_psum
    g.a_scale, g.b_scale = a_scale, w.b_scale
    g.out_kind = W8_OUT_F32
    g.out = cnp.PyArray_DATA(out)
    g.ldo = N
    g.kc, g.mc, g.nc = kc, mc, nc
    n_blocks = (N + n_step - 1) // n_step
    ntasks = ((M + m_step - 1) // m_step) * n_blocks
    with nogil:
        if nworkers == 1 or ntasks == 1:
            w8_task_begin(ops)
            for t in range(ntasks):
                _run_block(&g, t, n_blocks, m_step, n_step)
            w8_task_end(ops)
        else:
            with parallel(num_threads=nworkers):
                w8_task_begin(ops)
                for t in prange(ntasks, schedule="dynamic"):
                    _run_block(&g, t, n_blocks, m_step, n_step)
                w8_task_end(ops)
    return -1


cdef inline uint8_t _quantize_one(const w8_isa_ops *ops, int64_t block, uint32_t seed,
                                  const float *x, int64_t K, int64_t Kp, uint8_t flip,
                                  uint8_t *q, float *scale, int32_t *psum,
                                  float *rot) noexcept nogil:
    """One row as the kernels read it; block 0: no rotation."""
    if block:
        return w8_quantize_row_rotated(ops, x, K, Kp, flip, q, scale, psum, block, seed, rot)
    return w8_quantize_row(ops, x, K, Kp, flip, q, scale, psum)


cdef inline void _run_block(const w8_gemm_plan *g, int64_t t, int64_t n_blocks,
                            int64_t m_step, int64_t n_step) noexcept nogil:
    cdef int64_t m0 = (t // n_blocks) * m_step, n0 = (t % n_blocks) * n_step
    w8_gemm_range(g, m0, min(m0 + m_step, g.M), n0, min(n0 + n_step, g.N))
