# cython: language_level=3
"""The compiled product of pyw8a8: weight plans, scratch and the one call of the C call
path (``_simd/product.h``) that every product enters.

The ISA a call runs (an ``IsaOps``) and its thread count come from ``_dispatch``, its output
memory from ``_outputs``. Callers (the Python modules of the package) validate and
normalize every argument first; this module trusts its inputs and releases the GIL. The
one exception is ``settled_product``, the common call run from C: it declines (returns
None) any argument not already in the normal form. What is acceptable, and what is the
normal form, is one rule per argument here (``activation_code``, ``pair_fault``,
``bias_fault``, ``out_fault``), which the callers' checks read too.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcpy, memset
from libc.stdlib cimport free
from posix.stdlib cimport posix_memalign
from libc.math cimport isfinite
from cpython.pycapsule cimport PyCapsule_New

cimport numpy as cnp
import numpy as np

from pyw8a8._core cimport (W8_A_BYTES, W8_CORR_READS_ROWS, W8_MAX_WEIGHTS, w8_gemm,
                           w8_isa_ops,
                           w8_product, w8_run_product, w8_scalar_sign_scale, w8_sign_table)
from pyw8a8._outputs cimport _empty_output
from pyw8a8._dispatch cimport IsaOps, call_ops, call_place, threads_for, w8_call_place

cdef extern from "_simd/native_api.h" nogil:
    ctypedef struct w8_weight_desc:
        const uint8_t *panels
        const int32_t *psum
        const float *scales
        const float *signs
        int64_t N, K, Kp, block
        int enc, rotate
        uint32_t seed
    ctypedef struct w8_blocking:
        int64_t kc, mc, nc, m_step, n_step
    ctypedef struct w8_native_call:
        const float *x
        int64_t M, K
        const w8_weight_desc *w[2]
        const float *bias[2]
        int nw, glu, act
        w8_blocking blocking
        float *out
    ctypedef struct w8_native_api:
        int abi_version
        int (*call_place)(int64_t rows, int64_t work, int torch_threads,
                          w8_call_place *place) noexcept nogil
        size_t (*scratch_bytes)(const w8_native_call *call,
                                const w8_call_place *place) noexcept nogil
        int64_t (*run)(const w8_native_call *call, const w8_call_place *place,
                       void *scratch) noexcept nogil
    int W8_NATIVE_ABI_VERSION
    const char *W8_NATIVE_CAPSULE

cnp.import_array()

cdef enum:
    # page_row_sums: the longest K of a page, and of a sum kept in int32 (127 * 127 * K
    # below 2**31).
    _PAGE_K = 1024
    _PAGE_K_SUM = 131072


def data_address(cnp.ndarray arr):
    """The address of arr's first element (numpy's own, ``arr.ctypes.data``, costs a
    ctypes object per call)."""
    return <size_t>cnp.PyArray_DATA(arr)


# ---- the compiled call path of every product ----

# The kinds of settled call (settled_product), each remembered apart by a weight: one
# product (matmul), a pair (matmul_pair), a gated pair (matmul_pair with glu=). A call is
# settled once the tuner has kept a blocking for its shape and its weights remember it
# (pyw8a8.tuning's docstring).
cdef enum:
    W8_CALL_ONE = 0
    W8_CALL_PAIR = 1
    W8_CALL_GLU = 2
    W8_CALL_KINDS = 3
    # The row counts a weight remembers a settled blocking for, per kind: a model's layer
    # sees a few in turn (batches of other lengths, a prompt then one token at a time).
    # With one, a sentence encoder's two batch shapes would take matmul's route in Python
    # on every call, which between layers that stream their weights through the caches
    # costs tens of microseconds a call in cache misses.
    W8_SETTLED_ROWS = 4
CALL_ONE, CALL_PAIR, CALL_GLU = W8_CALL_ONE, W8_CALL_PAIR, W8_CALL_GLU
SETTLED_ROWS = W8_SETTLED_ROWS
# The fused activations by name (common.h W8_ACT_*; the arithmetic is _simd/epilogue.h's).
ACTIVATIONS = {"relu": W8_ACT_RELU, "gelu": W8_ACT_GELU, "gelu_tanh": W8_ACT_GELU_TANH,
               "silu": W8_ACT_SILU}


# One weight of a product, as C values: from product's lists, or settled_product's.
ctypedef struct w8_call_weight:
    const w8_weight_desc *w  # a WeightPlan's (borrowed from the caller), or a capsule caller's
    int64_t kc, mc, nc, m_step, n_step
    const float *bias
    void *out       # NULL: none (the up projection of a gated pair)
    int64_t ldo
    int out_size    # bytes per output element


cdef class WeightPlan:
    """The per-weight half of a product, built once per packed weight: the kernel-ready
    pointers of its arrays (which it keeps alive), its sizes, encoding and rotation (with
    the rotation's sign table, which every activation row of its products multiplies by)."""
    cdef readonly object panels, psum, scales, shape, encoding, signs
    # Per call kind (CALL_*), the blockings the tuner settled for this weight's calls of the
    # last W8_SETTLED_ROWS row counts of that kind (remember_blocking): what a call runs
    # with, from C in settled_product, when its ISA (by name), rows and threads are those
    # of one of them. The tuner (tuning.TUNER) keeps the tuning; this is the weight's record
    # of it. A new row count takes the place of the one remembered longest (settled_next).
    cdef list settled_isa  # [kind][slot]: the ISA's name, None for an empty slot
    cdef int64_t settled_m[W8_CALL_KINDS][W8_SETTLED_ROWS]
    cdef int settled_threads[W8_CALL_KINDS][W8_SETTLED_ROWS]
    cdef int64_t settled_blockings[W8_CALL_KINDS][W8_SETTLED_ROWS][5]
    cdef int settled_next[W8_CALL_KINDS]
    cdef w8_weight_desc desc  # what the kernels read: the arrays' memory, sizes, rotation
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
        self.N, self.K, self.Kp = shape[0], shape[1], kp
        self.enc = W8_ENC_SIGNED if encoding == "signed" else W8_ENC_BIASED
        self.rotate, self.block, self.seed = rotate, block, seed
        # (The C arrays start zeroed, as the object's memory is: settled_next at slot 0.)
        self.settled_isa = [[None] * W8_SETTLED_ROWS for _ in range(W8_CALL_KINDS)]
        self.signs = None
        d = &self.desc
        d.panels = <const uint8_t *>cnp.PyArray_DATA(panels)
        d.psum = <const int32_t *>cnp.PyArray_DATA(psum) if psum.shape[0] else NULL
        d.scales = <const float *>cnp.PyArray_DATA(scales)
        d.signs = NULL
        d.N, d.K, d.Kp, d.block = self.N, self.K, kp, block
        d.enc, d.rotate, d.seed = self.enc, rotate, seed
        if rotate and self.K:
            # Built once, by the reference: every ISA's sign application gives these bits.
            self.signs = np.empty(self.K, np.float32)
            d.signs = <const float *>cnp.PyArray_DATA(self.signs)
            w8_sign_table(w8_scalar_sign_scale, <float *>d.signs, self.K, block, seed)

    def descriptor_address(self):
        """The address of this plan's C half (a native_api.h ``w8_weight_desc``), valid
        while the plan lives: what pyw8a8.torch's native operator copies."""
        return <size_t>&self.desc

    def remember_blocking(self, int kind, IsaOps ops, int64_t m, int nthreads,
                          tuple blocking):
        """Remember a settled blocking of this weight in a call of kind `kind` (CALL_*) of
        `m` rows on ISA `ops` with `nthreads` threads, for settled_product: in the slot of
        that call if it has one, else in the one remembered longest."""
        cdef int slot
        cdef int64_t *b
        if not 0 <= kind < W8_CALL_KINDS:
            raise ValueError(f"unknown call kind {kind}")
        slot = self.settled_slot(kind, ops, m, nthreads)
        if slot < 0:
            slot = self.settled_next[kind]
            self.settled_next[kind] = (slot + 1) % W8_SETTLED_ROWS
        b = self.settled_blockings[kind][slot]
        b[0], b[1], b[2], b[3], b[4] = blocking
        self.settled_isa[kind][slot] = ops.name
        self.settled_m[kind][slot], self.settled_threads[kind][slot] = m, nthreads

    def settled_blocking(self, int kind, IsaOps ops, int64_t m, int nthreads):
        """The blocking remembered for a call of kind `kind` (CALL_*) of `m` rows on ISA
        `ops` with `nthreads` threads, as (kc, mc, nc, m_step, n_step); None if none."""
        cdef w8_call_weight cw
        if not 0 <= kind < W8_CALL_KINDS:
            raise ValueError(f"unknown call kind {kind}")
        if not self.settled(kind, ops, m, nthreads, &cw):
            return None
        return (cw.kc, cw.mc, cw.nc, cw.m_step, cw.n_step)

    cdef int settled_slot(self, int kind, IsaOps ops, int64_t m, int nthreads):
        """The slot remembering this call's blocking, or -1."""
        cdef int slot
        names = self.settled_isa[kind]
        for slot in range(W8_SETTLED_ROWS):
            if self.settled_m[kind][slot] != m or self.settled_threads[kind][slot] != nthreads:
                continue
            isa = names[slot]
            # The ISA by name, as the tuner settles it: use_isa builds a new IsaOps each time.
            if isa is not None and (isa is ops.name or isa == ops.name):
                return slot
        return -1

    cdef bint settled(self, int kind, IsaOps ops, int64_t m, int nthreads,
                      w8_call_weight *cw):
        """Whether this weight settled a blocking for this call; if so, it goes to `cw`."""
        cdef int slot = self.settled_slot(kind, ops, m, nthreads)
        if slot < 0:
            return False
        cdef int64_t *b = self.settled_blockings[kind][slot]
        cw.kc, cw.mc, cw.nc, cw.m_step, cw.n_step = b[0], b[1], b[2], b[3], b[4]
        return True


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


cdef inline const float *_bias_data(object bias):
    if bias is None:
        return NULL
    return <const float *>cnp.PyArray_DATA(bias)


def product(IsaOps isa, cnp.ndarray x, list weights, list outs, Scratch scratch,
            int nthreads, list blockings, list biases, int act=W8_ACT_NONE, bint glu=False):
    """The products of the rows of x with one or two weights, in one call of the C call
    path (``_simd/product.h``): the rows are prepared once per activation format, then
    every block of every product runs, in one parallel region, the GIL released.

    x: (M, K) C-contiguous float32 (a W8A8 product: rows quantized, rotated first when the
    weights are) or int8 in [-127, 127] (an exact integer product of unrotated weights);
    M, K >= 1.  weights: WeightPlans of this K and one rotation.  outs[j]: (M, N_j) with
    C-contiguous rows, not overlapping x: float32 for float x, int32 or int64 for int8 x
    (int32 only up to W8_EXACT_K).  blockings[j]: (kc, mc, nc, m_step, n_step).  biases[j]:
    None or a C-contiguous float32 (N_j,) added to product j's float result.  act: the
    W8_ACT_* of the first product (float x only).  glu: the two weights are a gated pair
    of one N: a single output, outs[0] = act(x @ w0.T + b0) * (x @ w1.T + b1), finished
    tile by tile (the up projection's sums go to the scratch, never to a float array).
    Returns -1, or the index of the first row that holds NaN/Inf or whose rotation
    overflows (no output is then written).
    """
    cdef int nw = len(weights), j
    cdef w8_call_weight w[W8_MAX_WEIGHTS]
    cdef cnp.ndarray out
    if not 1 <= nw <= W8_MAX_WEIGHTS or len(blockings) != nw or len(biases) != nw:
        raise ValueError("one or two weights, each with a blocking and a bias")
    if len(outs) != (1 if glu else nw) or (glu and nw != 2):
        raise ValueError("an output per weight, or one for a gated pair of two weights")
    for j in range(nw):
        w[j].w = &(<WeightPlan?>weights[j]).desc
        w[j].kc, w[j].mc, w[j].nc, w[j].m_step, w[j].n_step = blockings[j]
        w[j].bias = _bias_data(biases[j])
        w[j].out, w[j].ldo, w[j].out_size = NULL, 0, 0
        if j < len(outs):
            out = outs[j]
            w[j].out, w[j].ldo = cnp.PyArray_DATA(out), out.strides[0] // out.itemsize
            w[j].out_size = out.itemsize
    return _run_product(isa, cnp.PyArray_DATA(x), cnp.PyArray_TYPE(x) == cnp.NPY_INT8,
                        x.shape[0], x.shape[1], w, nw, scratch, nthreads, act, glu)


# ---- the paged products of int8 attention (pyw8a8.attention) ----
# A KV cache's keys or values are packed a page of tokens at a time, so one attention
# product is many small ones, a page each: a few microseconds of kernel work behind each
# Python call (`product`) cost more than the kernels (a decode step over 4,096 tokens took
# 1.2x the float cache's time so).  These run a product's pages in one call, one after
# another, each page's product split over its rows only, over its whole K.

cdef void _row_tasks(w8_call_weight *cw, const w8_weight_desc *w, int64_t rows, IsaOps isa,
                     int nthreads) noexcept:
    """A task per thread, each a share of the `rows` rows (whole tiles) and all of w's
    columns (whole strips of the kernel's width), over the whole K: a page's weight is
    small enough for L1 and L2 either way."""
    cdef int64_t ncols = W8_NR * isa.npanels
    cdef int64_t share = (rows + nthreads - 1) // nthreads
    cdef int64_t m_step = (share + isa.mr - 1) // isa.mr * isa.mr
    cw.w, cw.bias = w, NULL
    cw.kc, cw.mc, cw.nc = w.Kp, m_step, (w.N + ncols - 1) // ncols * ncols
    cw.m_step, cw.n_step = m_step, cw.nc


def page_column_sums(IsaOps isa, cnp.ndarray x, list weights, cnp.ndarray out,
                     Scratch scratch, int nthreads):
    """The exact int32 products of int8 rows x (R, K), C-contiguous, values in [-127, 127],
    with weights of K columns each (WeightPlans of unrotated int8 weights, (N_j, K)): weight
    j's into the columns ``out[:, at_j:at_j + N_j]`` of out (R, sum N_j) int32 with
    C-contiguous rows, ``at_j`` the N of the weights before it (the scores of a query block
    over a cache's keys, a page a weight)."""
    cdef int64_t R = x.shape[0], K = x.shape[1], at = 0
    cdef w8_call_weight cw
    cdef const w8_weight_desc *w
    cdef char *base = <char *>cnp.PyArray_DATA(out)
    cdef int64_t ldo = out.strides[0] // 4
    for plan in weights:
        w = &(<WeightPlan?>plan).desc
        if w.K != K or w.rotate or at + w.N > out.shape[1]:
            raise ValueError("every weight must have the rows' K, no rotation, and fit out")
        _row_tasks(&cw, w, R, isa, nthreads)
        cw.out, cw.ldo, cw.out_size = base + at * 4, ldo, 4
        _run_product(isa, cnp.PyArray_DATA(x), True, R, K, &cw, 1, scratch, nthreads,
                     W8_ACT_NONE, False)
        at += w.N
    if at != out.shape[1]:
        raise ValueError("the weights' columns must add up to out's")


def page_row_sums(IsaOps isa, cnp.ndarray x, list weights, cnp.ndarray out,
                  Scratch scratch, int nthreads, cnp.ndarray work):
    """The exact products of int8 rows x (R, sum K_j), rows C-contiguous, values in
    [-127, 127], split along K over weights of N rows each (WeightPlans of unrotated int8
    weights, (N, K_j), K_j <= 1024): the columns ``x[:, at_j:at_j + K_j]`` times weight j,
    summed over j into out (R, N), C-contiguous, int32 where sum K_j <= 131072 (127 * 127
    * K below 2**31), else int64 (a query block's probabilities times a cache's values, a
    page a weight).  work: a C-contiguous buffer of at least ``page_row_sums_work(R, N,
    max K_j)`` bytes, reused from call to call (fresh memory for it, faulted in on every
    call, took longer than the products)."""
    cdef int64_t R = x.shape[0], T = x.shape[1], N = out.shape[1], at = 0, i, r
    cdef int64_t ldx = x.strides[0], held = 0
    cdef bint wide = cnp.PyArray_TYPE(out) == cnp.NPY_INT64
    cdef w8_call_weight cw
    cdef const w8_weight_desc *w
    cdef const int8_t *xs = <const int8_t *>cnp.PyArray_DATA(x)
    cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
    cdef int8_t *cols
    cdef int32_t *part
    cdef int32_t *acc
    cdef int64_t kmax = 0
    if not wide and (cnp.PyArray_TYPE(out) != cnp.NPY_INT32 or T > _PAGE_K_SUM):
        raise ValueError(f"out must be int64, or int32 for at most {_PAGE_K_SUM} columns")
    for plan in weights:
        w = &(<WeightPlan?>plan).desc
        if w.N != N or w.rotate or w.K > _PAGE_K:
            raise ValueError(f"every weight must have out's N, K <= {_PAGE_K} and no "
                             "rotation")
        kmax = max(kmax, w.K)
    if cnp.PyArray_NBYTES(work) < page_row_sums_work(R, N, kmax):
        raise ValueError("work is too small")
    # The running sum over the pages so far, in int32 up to _PAGE_K_SUM of K: out itself,
    # or in work (then added to out, and restarted); then in work, a page's product and
    # its columns of x, as the rows of that product.
    acc = <int32_t *>cnp.PyArray_DATA(out if not wide else work)
    part = <int32_t *>cnp.PyArray_DATA(work) + (R * N if wide else 0)
    cols = <int8_t *>(part + R * N)
    if wide:
        memset(o, 0, R * N * sizeof(int64_t))
    for plan in weights:
        w = &(<WeightPlan>plan).desc
        if at + w.K > T:
            raise ValueError("the weights' K must add up to x's columns")
        for r in range(R):
            memcpy(cols + r * w.K, xs + r * ldx + at, w.K)
        _row_tasks(&cw, w, R, isa, nthreads)
        if held + w.K > _PAGE_K_SUM:
            for i in range(R * N):
                o[i] += acc[i]
            held = 0
        # The first page of a sum writes it; the others add their product to it.
        cw.out, cw.ldo, cw.out_size = acc if held == 0 else part, N, 4
        _run_product(isa, cols, True, R, w.K, &cw, 1, scratch, nthreads, W8_ACT_NONE,
                     False)
        if held:
            for i in range(R * N):
                acc[i] += part[i]
        held += w.K
        at += w.K
    if at != T:
        raise ValueError("the weights' K must add up to x's columns")
    if not weights and not wide:
        memset(acc, 0, R * N * sizeof(int32_t))
    if wide and held:
        for i in range(R * N):
            o[i] += acc[i]


cpdef int64_t page_row_sums_work(int64_t rows, int64_t n, int64_t k):
    """The bytes of page_row_sums's `work` for R rows, N values and pages of up to K (an
    int64 out's)."""
    return 8 * rows * n + rows * k


cdef int64_t _run_product(IsaOps isa, const void *x, bint int8_input, int64_t M, int64_t K,
                          w8_call_weight *weights, int nw, Scratch scratch, int nthreads,
                          int act, bint glu) except -2:
    """product's work, from C values, on the calling thread's Scratch."""
    cdef w8_product p
    cdef int nworkers = nthreads if nthreads > 1 else 1
    cdef size_t size = _set_up(&p, isa.ops, x, int8_input, M, K, weights, nw, nworkers,
                               act, glu, NULL)
    cdef char *base = scratch.reserve(size)
    cdef int64_t bad
    _set_up(&p, isa.ops, x, int8_input, M, K, weights, nw, nworkers, act, glu, base)
    with nogil:
        bad = w8_run_product(&p, nworkers)
    return bad


cdef size_t _set_up(w8_product *p, const w8_isa_ops *ops, const void *x, bint int8_input,
                    int64_t M, int64_t K, w8_call_weight *weights, int nw, int nworkers,
                    int act, bint glu, char *base) noexcept nogil:
    """Sets up the product p of x with `weights` (their formats, scratch and jobs) in the
    scratch at `base`; with base NULL, only measures it.  Returns the scratch's bytes."""
    cdef const w8_weight_desc *w = weights[0].w
    cdef bint wide = not int8_input and w.Kp > W8_EXACT_K
    cdef int fmt_of[W8_MAX_WEIGHTS]
    cdef char *sums[W8_MAX_WEIGHTS]
    cdef size_t size
    cdef int j
    p.ops, p.x, p.int8_input, p.M, p.K, p.Kp = ops, x, int8_input, M, K, w.Kp
    p.block = w.block if w.rotate and not int8_input else 0
    p.signs = w.signs
    _assign_formats(p, weights, nw, fmt_of)
    size = _lay_out_scratch(p, weights, nw, glu, wide, nworkers, base, sums)
    if base == NULL:
        return size
    p.njobs = 1 if glu else nw
    for j in range(nw):
        _set_job(p, j, &weights[j], fmt_of[j], glu, wide, sums[j], act)
    return size


cdef void _assign_formats(w8_product *p, w8_call_weight *weights, int nw,
                          int *fmt_of) noexcept nogil:
    """The activation formats the weights read, one per sign flip and need of row sums
    (p.fmt, p.nformats), prepared once each however many weights read them; the format of
    weight j goes to fmt_of[j]."""
    cdef uint8_t flip
    cdef bint row_sums
    cdef int j, f
    p.nformats = 0
    for j in range(nw):
        flip = p.ops.a_flip[weights[j].w.enc]
        row_sums = W8_CORR_READS_ROWS(p.ops.corr[weights[j].w.enc])
        fmt_of[j] = -1
        for f in range(p.nformats):
            if p.fmt[f].flip == flip and p.fmt[f].row_sums == row_sums:
                fmt_of[j] = f
        if fmt_of[j] < 0:
            fmt_of[j] = p.nformats
            p.fmt[p.nformats].flip, p.fmt[p.nformats].row_sums = flip, row_sums
            p.nformats += 1


cdef size_t _lay_out_scratch(w8_product *p, w8_call_weight *weights, int nw, bint glu,
                             bint wide, int nworkers, char *base, char **sums) noexcept nogil:
    """The scratch of p: each format's bytes and sums, the scales, the row statuses, the
    raw sums that go to no output (sums[j]: a float product beyond W8_EXACT_K, int64,
    converted at the end; the up projection of a gated pair; else NULL), one rotation row
    per thread.  Points p's buffers into it at `base` (unless NULL); returns its bytes."""
    cdef int64_t Mp = (p.M + W8_A_ROW_PAD - 1) // W8_A_ROW_PAD * W8_A_ROW_PAD
    cdef int64_t np1 = p.Kp // W8_KPAD + 1, n
    cdef size_t q_bytes = _aligned(Mp * p.Kp * W8_A_BYTES(p.ops)), off = 0, off_scale, off_st
    cdef size_t off_rot
    cdef size_t fmt_off[W8_MAX_WEIGHTS]
    cdef size_t sums_off[W8_MAX_WEIGHTS]
    cdef int f, j
    for f in range(p.nformats):
        fmt_off[f] = off
        off += q_bytes + _aligned(p.M * np1 * sizeof(int32_t) if p.fmt[f].row_sums else 0)
    off_scale = off
    off_st = off_scale + _aligned(p.M * sizeof(float))
    off = off_st + _aligned(p.M)
    for j in range(nw):
        sums_off[j], n = off, p.M * weights[j].w.N
        if wide:
            off += _aligned(n * sizeof(int64_t))
        elif glu and j == 1:
            off += _aligned(n * sizeof(int32_t))
    off_rot = off
    p.rot_stride = (p.K + p.block - 1) // p.block * p.block if p.block else 0
    p.rot_stride = _aligned(p.rot_stride * sizeof(float)) // sizeof(float)
    if base == NULL:
        return off_rot + p.rot_stride * sizeof(float) * nworkers
    for f in range(p.nformats):
        p.fmt[f].q = <uint8_t *>(base + fmt_off[f])
        p.fmt[f].psum = <int32_t *>(base + fmt_off[f] + q_bytes)
    p.a_scale = <float *>(base + off_scale)
    p.status = <uint8_t *>(base + off_st)
    p.rot = <float *>(base + off_rot)
    for j in range(nw):
        sums[j] = base + sums_off[j] if wide or (glu and j == 1) else NULL
    return off_rot + p.rot_stride * sizeof(float) * nworkers


cdef void _set_job(w8_product *p, int j, w8_call_weight *cw, int f, bint glu, bint wide,
                   char *sums, int act) noexcept nogil:
    """The loop nest of weight j (p.jobs[j], or p.up for the up projection of a gated
    pair): its operands, blocking and output."""
    cdef const w8_weight_desc *w = cw.w
    cdef bint up = glu and j == 1
    cdef w8_gemm *g = &p.up if up else &p.jobs[j].g
    g.ops, g.enc, g.M, g.N, g.Kp = p.ops, w.enc, p.M, w.N, p.Kp
    g.a, g.lda = p.fmt[f].q, p.Kp * W8_A_BYTES(p.ops)
    g.a_psum = p.fmt[f].psum if p.fmt[f].row_sums else NULL
    g.b, g.b_psum, g.a_scale, g.b_scale = w.panels, w.psum, p.a_scale, w.scales
    g.bias = cw.bias
    g.act = act if j == 0 else W8_ACT_NONE
    g.up = NULL
    g.kc, g.mc, g.nc = cw.kc, cw.mc, cw.nc
    p.wide_out[j] = NULL
    if up:
        # The up projection's raw sums, finished with the gate's tiles.
        g.out_kind = W8_OUT_I64 if wide else W8_OUT_I32
        g.out, g.ldo = sums, w.N
        p.jobs[0].g.up = g
        return
    g.out, g.ldo = cw.out, cw.ldo
    g.out_kind = W8_OUT_F32
    if p.int8_input:
        g.out_kind = W8_OUT_I64 if cw.out_size == 8 else W8_OUT_I32
    elif wide:
        # Exact int32 sums per W8_EXACT_K-range, added in int64, converted at the end.
        g.out_kind = W8_OUT_I64
        p.wide_out[j], p.wide_ldo[j] = <float *>g.out, g.ldo
        g.out, g.ldo = sums, w.N
    p.jobs[j].m_step, p.jobs[j].n_step = cw.m_step, cw.n_step


# ---- what a product accepts: one rule per argument, read by both routes ----
# The checked route (matmul.py, _validation.py) raises the error of the fault a rule
# answers; settled_product declines every argument a rule does not answer ARG_READY for.
# One definition of each argument's acceptance, so the two routes cannot drift apart.

cpdef enum:
    ARG_READY = 0           # accepted, and read (or written) as it is
    ARG_CONVERT = 1         # accepted once converted: the checked route's work
    ARG_BAD_TYPE = 2
    ARG_BAD_DTYPE = 3
    ARG_BAD_SHAPE = 4
    ARG_NOT_FINITE = 5
    ARG_READ_ONLY = 6
    ARG_OVERLAPS = 7
    ARG_OTHER_K = 8         # the two weights of a pair differ in K,
    ARG_OTHER_N = 9         # in N (a gated pair),
    ARG_OTHER_ROTATION = 10  # or in rotation


cpdef int activation_code(object activation):
    """The W8_ACT_* of `activation`, None or a name of ACTIVATIONS; -1 for anything else."""
    if activation is None:
        return W8_ACT_NONE
    code = ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    return -1 if code is None else code


cpdef int pair_fault(WeightPlan w1, WeightPlan w2, bint glu):
    """Whether w1 and w2 can be the weights of one product of one activation (matmul_pair;
    with `glu`, a gated pair): ARG_READY, or the first fault of ARG_OTHER_K, ARG_OTHER_N
    (with `glu` only), ARG_OTHER_ROTATION (whether they rotate, and with which block and
    seed: those of an unrotated weight mean nothing)."""
    if w2.K != w1.K:
        return ARG_OTHER_K
    if glu and w2.N != w1.N:
        return ARG_OTHER_N
    if w2.rotate != w1.rotate or (w1.rotate and (w2.block != w1.block
                                                 or w2.seed != w1.seed)):
        return ARG_OTHER_ROTATION
    return ARG_READY


cpdef int bias_fault(object bias, int64_t n):
    """How `bias` stands as the bias of a product of n outputs. ARG_READY: None, or a
    native-order, C-contiguous, aligned float32 ndarray of shape (n,) holding finite
    values, which the product reads as it is.  ARG_CONVERT: not an ndarray, or a float32
    or float64 one of shape (n,) in another form (float64, the other byte order, strided,
    unaligned): acceptable if its native float32 copy is ARG_READY.  Else the first fault
    of ARG_BAD_DTYPE (not float32 or float64), ARG_BAD_SHAPE (not (n,)), ARG_NOT_FINITE
    (NaN or Inf)."""
    cdef cnp.ndarray arr
    cdef const float *b
    cdef int64_t i
    cdef int typenum
    if bias is None:
        return ARG_READY
    if type(bias) is not np.ndarray:
        return ARG_CONVERT
    arr = bias
    typenum = cnp.PyArray_TYPE(arr)  # whichever byte order
    if typenum != cnp.NPY_FLOAT32 and typenum != cnp.NPY_FLOAT64:
        return ARG_BAD_DTYPE
    if arr.ndim != 1 or arr.shape[0] != n:
        return ARG_BAD_SHAPE
    if (typenum != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(arr)
            or not cnp.PyArray_ISBEHAVED_RO(arr)):
        return ARG_CONVERT
    b = <const float *>cnp.PyArray_DATA(arr)
    for i in range(n):
        if not isfinite(b[i]):
            return ARG_NOT_FINITE
    return ARG_READY


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


def settled_product(object x, object plan1, object plan2, object bias1, object bias2,
                    object activation, bint pair, bint glu, object scratch,
                    object out=None):
    """The common calls of matmul and matmul_pair, from C: `x` a C-contiguous, aligned,
    native-order float32 ndarray (any leading dimensions, at least one row of K >= 1
    features); `plan1` (and with `pair`, `plan2`) the WeightPlan(s), N >= 1, of x's K
    (a pair as pair_fault accepts); the biases as bias_fault accepts them as they are
    (ARG_READY); `activation` None or a name of ACTIVATIONS (with `glu`, the gate's); each
    weight having settled a blocking for this call's kind, ISA, row count and thread count
    (WeightPlan.remember_blocking); `scratch` the thread's Scratch; `out` None, or (one
    weight, no pair) matmul's out= as out_fault accepts it as it is, left untouched when
    a row fails.

    Returns matmul's output (`out` when given), matmul_pair's (y1, y2) or its gated
    output; or None when the call is not such a call, or a row of x holds NaN/Inf: the
    caller then takes the general route (which reports the row, or the argument).
    """
    cdef cnp.ndarray arr, y1, y2 = None
    cdef WeightPlan w1, w2 = None
    cdef IsaOps ops
    cdef int nthreads, nw = 1, act = W8_ACT_NONE
    cdef int kind = W8_CALL_GLU if glu else W8_CALL_ONE
    cdef int64_t K, M
    cdef w8_call_weight cw[2]
    if (type(x) is not np.ndarray or type(plan1) is not WeightPlan
            or type(scratch) is not Scratch or (pair and type(plan2) is not WeightPlan)
            or (out is not None and pair)):
        return None
    arr, w1 = x, plan1
    if pair:
        w2, nw = plan2, 2
        kind = W8_CALL_GLU if glu else W8_CALL_PAIR
    elif glu:
        return None
    act = activation_code(activation)
    if (act < 0 or arr.ndim == 0 or cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32
            or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISBEHAVED_RO(arr)
            or cnp.PyArray_SIZE(arr) == 0):
        return None
    K = arr.shape[arr.ndim - 1]
    # No features or no outputs: accepted, but the checked route's (no kernel runs).
    if K != w1.K or K == 0 or w1.N == 0 or (
            w2 is not None and (w2.N == 0 or pair_fault(w1, w2, glu) != ARG_READY)):
        return None
    M = cnp.PyArray_SIZE(arr) // K
    ops = call_ops(M)
    nthreads = threads_for(M * K * (w1.N + (w2.N if w2 is not None else 0)))
    if not w1.settled(kind, ops, M, nthreads, &cw[0]):
        return None
    if w2 is not None:
        if glu:
            cw[1] = cw[0]  # a gated pair runs one loop nest, over the gate's blocking
        elif not w2.settled(kind, ops, M, nthreads, &cw[1]):
            return None
        if bias_fault(bias2, w2.N) != ARG_READY:
            return None
        cw[1].bias = _bias_data(bias2)
    if bias_fault(bias1, w1.N) != ARG_READY:
        return None
    cw[0].bias = _bias_data(bias1)
    if out is None:
        y1 = _settled_output(arr, w1, &cw[0])
    elif out_fault(out, arr, arr, w1.N) == ARG_READY:
        y1 = out
        cw[0].w, cw[0].out, cw[0].ldo = &w1.desc, cnp.PyArray_DATA(y1), w1.N
        cw[0].out_size = sizeof(float)
    else:
        return None
    if w2 is not None:
        if glu:
            cw[1].w, cw[1].out, cw[1].ldo, cw[1].out_size = &w2.desc, NULL, 0, 0
        else:
            y2 = _settled_output(arr, w2, &cw[1])
    if _run_product(ops, cnp.PyArray_DATA(arr), False, M, K, cw, nw, <Scratch>scratch,
                    nthreads, act, glu) >= 0:
        return None
    return (y1, y2) if kind == W8_CALL_PAIR else y1


cdef cnp.ndarray _settled_output(cnp.ndarray x, WeightPlan w, w8_call_weight *cw):
    """The float32 output of x's leading dimensions and w.N columns, set as cw's."""
    cdef cnp.npy_intp dims[64]
    cdef int i, nd = x.ndim
    for i in range(nd - 1):
        dims[i] = x.shape[i]
    dims[nd - 1] = w.N
    y = _empty_output(nd, dims)
    cw.w, cw.out, cw.ldo, cw.out_size = &w.desc, cnp.PyArray_DATA(y), w.N, sizeof(float)
    return y


# ---- the native interface (_simd/native_api.h): the call path for code built apart ----

cdef void _native_weights(const w8_native_call *c, w8_call_weight *w) noexcept nogil:
    """The call's weights as the call path takes them: one blocking (a gated pair runs
    one loop nest), the output on the first."""
    cdef int j
    for j in range(c.nw):
        w[j].w = c.w[j]
        w[j].kc, w[j].mc, w[j].nc = c.blocking.kc, c.blocking.mc, c.blocking.nc
        w[j].m_step, w[j].n_step = c.blocking.m_step, c.blocking.n_step
        w[j].bias = c.bias[j]
        w[j].out, w[j].ldo, w[j].out_size = NULL, 0, 0
    w[0].out, w[0].ldo, w[0].out_size = c.out, c.w[0].N, sizeof(float)


cdef size_t _native_scratch_bytes(const w8_native_call *c,
                                  const w8_call_place *place) noexcept nogil:
    cdef w8_product p
    cdef w8_call_weight w[W8_MAX_WEIGHTS]
    _native_weights(c, w)
    return _set_up(&p, <const w8_isa_ops *>place.isa, c.x, False, c.M, c.K, w, c.nw,
                   place.nthreads if place.nthreads > 1 else 1, c.act, c.glu, NULL)


cdef int64_t _native_run(const w8_native_call *c, const w8_call_place *place,
                         void *scratch) noexcept nogil:
    cdef w8_product p
    cdef w8_call_weight w[W8_MAX_WEIGHTS]
    cdef int nworkers = place.nthreads if place.nthreads > 1 else 1
    _native_weights(c, w)
    _set_up(&p, <const w8_isa_ops *>place.isa, c.x, False, c.M, c.K, w, c.nw, nworkers,
            c.act, c.glu, <char *>scratch)
    return w8_run_product(&p, nworkers)


cdef w8_native_api _native_api
_native_api.abi_version = W8_NATIVE_ABI_VERSION
_native_api.call_place = call_place
_native_api.scratch_bytes = _native_scratch_bytes
_native_api.run = _native_run
#: The native interface (native_api.h's w8_native_api) as a capsule.
NATIVE_API = PyCapsule_New(&_native_api, W8_NATIVE_CAPSULE, NULL)
