# cython: language_level=3
"""The compiled call of every product: numpy's face of the call object in C
(``_simd/call_path.h``), and its table for the torch operator (``CALL_API``).

A call (``call``, ``int8_call``, int8 attention's ``kv_attention``) hands C the plans
(``WeightPlan``), rows, outputs, ISA and thread count (``_dispatch``); C checks, tunes,
lays out the thread's scratch and runs, the GIL released.  A fault C returns is raised
here with C's message and error class, as the torch operator raises it.  ``call``
declines (returns None) an argument not in its normal form, for matmul to convert.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t
from cython.parallel cimport parallel, prange
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from cpython.pycapsule cimport PyCapsule_New

cimport numpy as cnp
import numpy as np

from pyw8a8._call_path cimport (
    W8_ARG_COUNT, W8_CALL_ABI_VERSION, W8_CALL_CAPSULE, W8_CALL_GLU, W8_CALL_KINDS,
    W8_CALL_ONE, W8_CALL_PAIR, W8_ERROR_MEMORY, W8_ERROR_TYPE, W8_FAULT_ACTIVATION,
    W8_FAULT_NONE, W8_FORMAT_PADDED, W8_FORMAT_UNPADDED, W8_MAX_BLOCK, W8_MAX_CANDIDATES,
    W8_MIN_BLOCK, W8_PLAN_CHECK_CONTENTS, W8_SETTLED_SLOTS, W8_TUNE_ROUNDS,
    W8_TUNE_SETTLED, w8_activation_code, w8_activation_names, w8_blocking, w8_call,
    w8_call_api, w8_call_forget_tuning, w8_call_lock_give, w8_call_lock_take,
    w8_call_path_init, w8_call_run, w8_call_unsettled, w8_candidates, w8_fault,
    w8_fault_names, w8_fault_text, w8_fit_blocking, w8_isa_id_of, w8_kc_for, w8_m_bucket,
    w8_plan, w8_plan_free, w8_plan_new, w8_plan_outputs, w8_settled_blocking,
    w8_tune_choice, w8_tune_choose, w8_tune_clear, w8_tune_record,
    w8_tuned_cache_bytes, w8_tuner, w8_weight_arrays, w8_weight_header)
from pyw8a8._core cimport w8_isa_ops
from pyw8a8._outputs cimport ARG_READY, _empty_output, out_fault, output_give, output_take
from pyw8a8._dispatch cimport IsaOps, call_ops, call_place, threads_for

cnp.import_array()

if w8_call_path_init() != 0:
    raise ImportError("pyw8a8._kernels: the call path's thread key or fork handler failed")

CALL_ONE, CALL_PAIR, CALL_GLU = W8_CALL_ONE, W8_CALL_PAIR, W8_CALL_GLU
#: The packed format versions this pyw8a8 reads, and the rotation's blocks (call.h).
FORMAT_UNPADDED, FORMAT_PADDED = W8_FORMAT_UNPADDED, W8_FORMAT_PADDED
MIN_BLOCK, MAX_BLOCK = W8_MIN_BLOCK, W8_MAX_BLOCK
#: The row counts a weight remembers a settled blocking for, per kind of call.
SETTLED_ROWS = W8_SETTLED_SLOTS
#: The fused activations by name (common.h W8_ACT_*; the arithmetic is _simd/epilogue.h's).
ACTIVATIONS = {w8_activation_names[code].decode(): code for code in range(1, 5)}
_ENCODINGS = ("biased", "signed")
_ERRORS = {W8_ERROR_TYPE: TypeError, W8_ERROR_MEMORY: MemoryError}


def data_address(cnp.ndarray arr):
    """The address of arr's first element (without ``arr.ctypes.data``'s ctypes object)."""
    return <size_t>cnp.PyArray_DATA(arr)


# ---- faults: C's message and error class, raised ----

cdef tuple _NAMES_ONE = (b"x", b"packed", b"packed2", b"bias", b"bias2")
cdef tuple _NAMES_PAIR = (b"x", b"packed1", b"packed2", b"bias1", b"bias2")


cdef int _raise(const w8_fault *f, tuple names, object shape=None,
                object activation=None) except -1:
    """Raise fault `f` with C's message, naming the arguments `names` (W8_ARG_* order);
    `shape` x's, `activation` the value given for it."""
    cdef w8_fault_names n
    cdef int64_t dims[64]
    cdef char buf[1024]
    cdef int i
    memset(&n, 0, sizeof(n))
    for i in range(W8_ARG_COUNT):
        n.name[i] = <const char *>names[i]
    if shape is not None and 0 < len(shape) <= 64:
        n.ndim = len(shape)
        for i in range(n.ndim):
            dims[i] = shape[i]
        n.shape = dims
    given = repr(activation).encode()
    n.activation_arg = b"activation" if names is _NAMES_ONE else b"glu"
    n.activation_given = given
    error = w8_fault_text(f, &n, buf, sizeof(buf))
    raise _ERRORS.get(error, ValueError)(buf.decode())


cdef int _activation(object activation, tuple names) except -1:
    """The W8_ACT_* of `activation`, None or a name of ACTIVATIONS."""
    cdef w8_fault f
    cdef int code = -1
    if activation is None:
        return 0
    if isinstance(activation, str) and "\0" not in activation:
        code = w8_activation_code(activation.encode())
    if code <= 0:
        memset(&f, 0, sizeof(f))
        f.code = W8_FAULT_ACTIVATION
        _raise(&f, names, None, activation)
    return code


# ---- plans ----

cdef class WeightPlan:
    """A packed weight's plan: the C call object's half of each of its products (its
    arrays as the kernels read them, which it keeps alive, its rotation's sign table, the
    blockings its calls settled), built once per packed weight."""
    cdef w8_plan *plan
    cdef readonly object panels, psum, scales, shape, encoding
    cdef readonly int64_t N, K, Kp, block
    cdef readonly int enc
    cdef readonly uint32_t seed
    cdef readonly bint rotate

    def __cinit__(self, cnp.ndarray panels, cnp.ndarray psum, cnp.ndarray scales,
                  tuple shape, str encoding, int format_version, bint rotate, int64_t block,
                  uint32_t seed, bint check_contents=False):
        # The caller (PackedWeight.plan) has checked the arrays' dtypes and contiguity;
        # C checks the settings and sizes (and with check_contents, the contents).
        cdef w8_weight_header h
        cdef w8_weight_arrays a
        cdef w8_fault f
        h.format_version, h.n, h.k = format_version, shape[0], shape[1]
        h.encoding, h.rotate, h.block, h.seed = _ENCODINGS.index(encoding), rotate, block, seed
        a.panels, a.panels_bytes = <const uint8_t *>cnp.PyArray_DATA(panels), panels.size
        a.psum, a.psum_values = <const int32_t *>cnp.PyArray_DATA(psum), psum.size
        a.scales, a.scales_values = <const float *>cnp.PyArray_DATA(scales), scales.size
        self.plan = w8_plan_new(&h, &a, W8_PLAN_CHECK_CONTENTS if check_contents else 0, &f)
        if self.plan == NULL:
            _raise(&f, _NAMES_ONE)
        self.panels, self.psum, self.scales = panels, psum, scales
        self.shape, self.encoding = shape, encoding
        self.N, self.K, self.Kp, self.block = self.plan.N, self.plan.K, self.plan.Kp, block
        self.enc, self.rotate, self.seed = self.plan.enc, rotate, seed

    def __dealloc__(self):
        w8_plan_free(self.plan)

    def settled_blocking(self, int kind, IsaOps ops, int64_t m, int nthreads):
        """The blocking this weight settled for a call of kind `kind` (CALL_*) of `m` rows
        on ISA `ops` with `nthreads` threads, as (kc, mc, nc, m_step, n_step); None if
        none."""
        cdef w8_blocking b
        cdef int found
        if not 0 <= kind < W8_CALL_KINDS:
            raise ValueError(f"unknown call kind {kind}")
        w8_call_lock_take()
        found = w8_settled_blocking(self.plan, kind, w8_isa_id_of(ops.ops), m, nthreads, &b)
        w8_call_lock_give()
        return (b.kc, b.mc, b.nc, b.m_step, b.n_step) if found else None


# ---- the calls ----

cdef bint _ready_bias(object bias, int64_t n, const float **data):
    """Whether `bias` is None or a native, C-contiguous, aligned float32 ndarray of shape
    (n,), which C reads as it is (its values C checks)."""
    cdef cnp.ndarray arr
    data[0] = NULL
    if bias is None:
        return True
    if type(bias) is not np.ndarray:
        return False
    arr = bias
    if (cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32 or arr.ndim != 1 or arr.shape[0] != n
            or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISBEHAVED_RO(arr)):
        return False
    data[0] = <const float *>cnp.PyArray_DATA(arr)
    return True


cdef cnp.ndarray _output_of(cnp.ndarray x, int64_t n):
    """A float32 output of x's leading dimensions and n columns."""
    cdef cnp.npy_intp dims[64]
    cdef int i, nd = x.ndim
    for i in range(nd - 1):
        dims[i] = x.shape[i]
    dims[nd - 1] = n
    return _empty_output(nd, dims)


cdef const int64_t *_blocking_of(tuple blocking, int64_t *b) except? NULL:
    """`blocking` (kc, mc, nc, m_step, n_step) in b, or NULL for the tuner's."""
    if blocking is None:
        return NULL
    b[0], b[1], b[2], b[3], b[4] = blocking
    return b


cdef int _run(w8_call *c, tuple names, object shape, object activation=None) except -1:
    """Runs `c`, the GIL released: on the calling thread's ISA and thread count unless
    `c` names them."""
    cdef w8_fault f
    cdef int code
    cdef int64_t n = c.plan[0].N + (c.plan[1].N if c.plan[1] != NULL else 0)
    cdef IsaOps ops
    if c.isa == NULL:
        ops = call_ops(c.M)
        c.isa, c.nthreads = ops.ops, threads_for(c.M * c.K * n)
    with nogil:
        code = w8_call_run(c, &f)
    if code != W8_FAULT_NONE:
        _raise(&f, names, shape, activation)
    return 0


def call(object x, object plan1, object plan2, object bias1, object bias2,
         object activation, int kind, object out=None, tuple blocking=None):
    """A W8A8 call of kind `kind` (CALL_*): x's rows times `plan1` (and `plan2`, a pair's
    or gated pair's second weight), each plus its bias, the first (a gated pair's gate)
    through `activation`.

    `x`: a C-contiguous, aligned, native float32 ndarray (..., K), at least one dimension.
    Biases: None or such float32 arrays of shape (N,).  `out` (CALL_ONE only): None or a
    C-contiguous, aligned, native float32 ndarray of x's leading dimensions and N columns
    that shares no memory with x (matmul's out= as out_fault accepts it as it is).
    `blocking`: (kc, mc, nc, m_step, n_step) instead of the tuner's (tests).

    Returns matmul's output (`out` when given), matmul_pair's (y1, y2) or its gated
    output; None where an argument is not in that form, for the caller to convert.

    Raises
    ------
    ValueError, TypeError, MemoryError
        What C refuses: K, the pair's weights, the activation, a bias or a row of x holding
        NaN or Inf; nothing is written then.
    """
    cdef w8_call c
    cdef cnp.ndarray arr, y1, y2 = None
    cdef WeightPlan w1 = plan1 if type(plan1) is WeightPlan else None
    cdef WeightPlan w2 = plan2 if type(plan2) is WeightPlan else None
    cdef int64_t M = 1
    cdef int64_t b[5]
    cdef int i
    names = _NAMES_ONE if kind == W8_CALL_ONE else _NAMES_PAIR
    if (type(x) is not np.ndarray or w1 is None or (kind != W8_CALL_ONE and w2 is None)
            or (kind == W8_CALL_PAIR and activation is not None)):
        return None
    arr = x
    if (arr.ndim == 0 or cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32
            or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISBEHAVED_RO(arr)):
        return None
    memset(&c, 0, sizeof(c))
    c.plan[0], c.plan[1] = w1.plan, w2.plan if kind != W8_CALL_ONE else NULL
    if not _ready_bias(bias1, w1.N, &c.bias[0]) or (
            kind != W8_CALL_ONE and not _ready_bias(bias2, w2.N, &c.bias[1])):
        return None
    for i in range(arr.ndim - 1):
        M *= arr.shape[i]
    c.x, c.M, c.K, c.kind = cnp.PyArray_DATA(arr), M, arr.shape[arr.ndim - 1], kind
    c.act = _activation(activation, names)
    if out is not None:
        if kind != W8_CALL_ONE or out_fault(out, arr, arr, w1.N) != ARG_READY:
            return None
        y1 = out
    else:
        y1 = _output_of(arr, w1.N)
    c.out[0], c.ldo[0], c.out_size = cnp.PyArray_DATA(y1), w1.N, 4
    if kind == W8_CALL_PAIR:
        y2 = _output_of(arr, w2.N)
        c.out[1], c.ldo[1] = cnp.PyArray_DATA(y2), w2.N
    c.blocking = _blocking_of(blocking, b)
    _run(&c, names, (<object>arr).shape, activation)
    return (y1, y2) if kind == W8_CALL_PAIR else y1


def int8_call(cnp.ndarray qa, WeightPlan plan, cnp.ndarray out, tuple blocking=None):
    """The exact product of int8 rows qa (M, K), C-contiguous, in [-127, 127], with an
    unrotated weight's plan into out (M, N), C-contiguous int32 (up to W8_EXACT_K) or
    int64; `blocking` (kc, mc, nc, m_step, n_step) instead of the tuner's (tests)."""
    cdef w8_call c
    cdef int64_t b[5]
    memset(&c, 0, sizeof(c))
    c.x, c.int8_input, c.M, c.K = cnp.PyArray_DATA(qa), 1, qa.shape[0], qa.shape[1]
    c.kind, c.plan[0] = W8_CALL_ONE, plan.plan
    c.out[0], c.ldo[0], c.out_size = cnp.PyArray_DATA(out), out.shape[1], out.itemsize
    c.blocking = _blocking_of(blocking, b)
    _run(&c, _NAMES_ONE, None)


# ---- int8 attention over a paged KV store (_simd/kv_attention.h, pyw8a8.attention) ----

cdef extern from "_simd/kv_attention.h" nogil:
    ctypedef struct w8_kv_attention:
        const float *q
        int64_t streams, group, nq, d, q_start
        int query_terms, probability_terms
        int64_t lo_steps, npages, page, span_start
        const w8_plan **key_plans
        const w8_plan **value_plans
        const float *key_scales
        const float *value_scales
        int64_t open_start, open_count, open_room
        const int8_t *open_keys
        const int8_t *open_values
        const float *open_key_scales
        const float *open_value_scales
        int64_t window
        float softcap
        const uint8_t *mask_visible
        const float *mask_add
        int64_t mask_start, mask_cols, mask_sb, mask_sh, mask_sq, kv_per_batch
        float *out
        int64_t out_sb, out_sq, out_sh, block_rows
        const w8_isa_ops *isa
        int nthreads
    ctypedef struct w8_kv_span:
        int64_t p0, p1, first, T
        int open
    enum:
        W8_KV_OK, W8_KV_QUERY_NOT_FINITE, W8_KV_NO_MEMORY, W8_KV_KERNEL
    int w8_kv_attend(const w8_kv_attention *a)
    w8_kv_span w8_kv_span_of(const w8_kv_attention *a, int64_t lo, int64_t hi)
    int w8_kv_key_sums(const w8_kv_attention *a, int64_t s, w8_kv_span sp, const int8_t *q8,
                       int64_t R, int32_t *S)
    int w8_kv_value_sums(const w8_kv_attention *a, int64_t s, w8_kv_span sp, const int8_t *P,
                         int64_t R, int8_t *cols, int32_t *part, int64_t *acc)
    int w8_int8_terms_row(const float *x, int64_t K, int64_t lo_steps, int8_t *hi,
                          int8_t *lo, float *step)


def int8_terms(const float[:, ::1] x, int8_t[:, ::1] q, float[::1] step, int64_t lo_steps,
               int nthreads):
    """The rows of x (M, K) as int8 terms (`pyw8a8.attention._exact.quantize_terms`): q
    (terms * M, K), the first term's rows then, with two terms (q.shape[0] == 2 M), the
    residual's on the lo_steps finer step; step (M,) the step of each row's combined sum.
    Returns the index of the first row holding NaN or Inf (nothing written for it), or -1.
    """
    cdef int64_t M = x.shape[0], K = x.shape[1], i, bad = -1
    cdef bint two = q.shape[0] == 2 * M
    if q.shape[0] != (2 if two else 1) * M or q.shape[1] != K or step.shape[0] != M:
        raise ValueError("q must have M or 2 M rows of x's K, step M")
    if M == 0 or K == 0:
        return -1
    cdef uint8_t *st = <uint8_t *>calloc(M, 1)
    if st == NULL:
        raise MemoryError(f"no memory for the status of {M} rows")
    with nogil, parallel(num_threads=nthreads):
        for i in prange(M, schedule="static"):
            st[i] = w8_int8_terms_row(&x[i, 0], K, lo_steps, &q[i, 0],
                                      &q[M + i, 0] if two else NULL, &step[i])
    for i in range(M):
        if st[i]:
            bad = i
            break
    free(st)
    return bad


cdef class PlanTable:
    """The plans of a run of full pages, stream by stream, as the attention reads them:
    ``rows[s][p]`` the WeightPlan of stream s's page p (every stream as many)."""

    cdef const w8_plan **plans
    cdef readonly int64_t streams, pages
    cdef list rows

    def __cinit__(self, list rows):
        self.rows = rows
        self.streams = len(rows)
        self.pages = len(rows[0]) if rows else 0
        self.plans = <const w8_plan **>malloc(max(1, self.streams * self.pages) *
                                              sizeof(w8_plan *))
        if self.plans == NULL:
            raise MemoryError("no memory for a page table")
        for s, row in enumerate(rows):
            if len(row) != self.pages:
                raise ValueError("every stream must have as many pages")
            for p, plan in enumerate(row):
                self.plans[s * self.pages + p] = (<WeightPlan?>plan).plan

    def __dealloc__(self):
        free(self.plans)


cdef int _set_store(w8_kv_attention *a, object span, object last, int64_t streams,
                    int64_t d) except -1:
    """The store's pages into `a`: `span` a PackedSpan (its tables, scales, page), `last`
    the open Page or None; checked against the streams and head_dim."""
    cdef PlanTable keys = span.key_table, values = span.value_table
    cdef cnp.ndarray ks, vs, ok, ov, oks, ovs
    a.npages, a.page, a.span_start = keys.pages, span.page, span.start
    if a.npages and (keys.streams != streams or values.streams != streams or
                     values.pages != a.npages):
        raise ValueError("the page tables must have a row per stream")
    a.key_plans, a.value_plans = keys.plans, values.plans
    if a.npages:
        ks, vs = span.key_scales, span.value_scales
        for arr in (ks, vs):
            if arr.dtype != np.float32 or not arr.flags.c_contiguous or arr.shape[0] != \
                    streams or arr.shape[1] != a.npages * a.page:
                raise ValueError("the span's scales must be (streams, tokens) float32")
        a.key_scales = <const float *>cnp.PyArray_DATA(ks)
        a.value_scales = <const float *>cnp.PyArray_DATA(vs)
    a.open_count = 0 if last is None else last.count
    if a.open_count:
        ok, ov, oks, ovs = last.keys, last.values, last.key_scales, last.value_scales
        a.open_start, a.open_room = last.start, ok.shape[1]
        if not (ok.dtype == ov.dtype == np.int8 and ok.flags.c_contiguous and
                ov.flags.c_contiguous and ok.shape[0] == ov.shape[0] == streams and
                ok.shape[2] == ov.shape[2] == d and ov.shape[1] == a.open_room and
                oks.flags.c_contiguous and ovs.flags.c_contiguous and
                oks.dtype == ovs.dtype == np.float32 and oks.shape[1] == ovs.shape[1] ==
                a.open_room and a.open_count <= a.open_room):
            raise ValueError("the open page's rows must be (streams, room, head_dim) int8")
        a.open_keys = <const int8_t *>cnp.PyArray_DATA(ok)
        a.open_values = <const int8_t *>cnp.PyArray_DATA(ov)
        a.open_key_scales = <const float *>cnp.PyArray_DATA(oks)
        a.open_value_scales = <const float *>cnp.PyArray_DATA(ovs)
    elif a.npages:
        a.open_start = a.span_start + a.npages * a.page
    return 0


cdef int _set_mask(w8_kv_attention *a, cnp.ndarray mask, int64_t mask_start) except -1:
    """A 4-D mask (batch, 1 or heads, queries, columns), bool or float32, into `a`."""
    if mask is None:
        return 0
    if mask.ndim != 4 or mask.dtype not in (np.bool_, np.float32):
        raise ValueError("the mask must be 4-D, bool or float32")
    cdef int64_t item = mask.itemsize
    a.mask_start, a.mask_cols = mask_start, mask.shape[3]
    a.mask_sb, a.mask_sh, a.mask_sq = (mask.strides[0] // item, mask.strides[1] // item,
                                       mask.strides[2] // item)
    if mask.shape[1] == 1:
        a.mask_sh = 0
    if mask.strides[3] != item:
        raise ValueError("the mask's columns must be adjacent")
    if mask.dtype == np.bool_:
        a.mask_visible = <const uint8_t *>cnp.PyArray_DATA(mask)
    else:
        a.mask_add = <const float *>cnp.PyArray_DATA(mask)
    return 0


def kv_attention(IsaOps isa, int nthreads, cnp.ndarray q, int64_t q_start, int query_terms,
                 int probability_terms, int64_t lo_steps, object span, object last,
                 int64_t window, float softcap, cnp.ndarray mask, int64_t mask_start,
                 int64_t kv_per_batch, cnp.ndarray out, int64_t block_rows):
    """int8 attention of one layer (kv_attention.h): q (streams, group, nq, d) float32,
    C-contiguous (rotated and scaled); the store's full pages `span` and open page `last`;
    out (batch, nq, heads, d) float32 with d adjacent, heads = kv_per_batch * group.
    Returns 0, or 1 where a query row holds NaN or Inf."""
    cdef w8_kv_attention a
    memset(&a, 0, sizeof(a))
    if (q.dtype != np.float32 or not q.flags.c_contiguous or q.ndim != 4 or
            out.dtype != np.float32 or out.ndim != 4 or not out.flags.writeable):
        raise ValueError("q must be (streams, group, nq, d) float32, out 4-D float32")
    a.q, a.streams, a.group, a.nq, a.d = (<const float *>cnp.PyArray_DATA(q), q.shape[0],
                                          q.shape[1], q.shape[2], q.shape[3])
    if (kv_per_batch < 1 or a.streams % kv_per_batch or out.shape[0] != a.streams //
            kv_per_batch or out.shape[1] != a.nq or out.shape[2] != kv_per_batch * a.group
            or out.shape[3] != a.d or out.strides[3] != 4):
        raise ValueError("out must be (batch, nq, heads, d) for q's streams")
    if query_terms not in (1, 2) or probability_terms not in (1, 2):
        raise ValueError("terms must be 1 or 2")
    a.q_start, a.query_terms, a.probability_terms = q_start, query_terms, probability_terms
    a.lo_steps, a.window, a.softcap, a.kv_per_batch = lo_steps, window, softcap, kv_per_batch
    _set_store(&a, span, last, a.streams, a.d)
    _set_mask(&a, mask, mask_start)
    a.out = <float *>cnp.PyArray_DATA(out)
    a.out_sb, a.out_sq, a.out_sh = out.strides[0] // 4, out.strides[1] // 4, out.strides[2] // 4
    a.block_rows, a.isa, a.nthreads = block_rows, isa.ops, nthreads
    cdef int status
    with nogil:
        status = w8_kv_attend(&a)
    if status == W8_KV_NO_MEMORY:
        raise MemoryError("no memory for int8 attention's scratch")
    if status == W8_KV_KERNEL:
        raise RuntimeError("int8 attention: a page's product failed")
    return 1 if status == W8_KV_QUERY_NOT_FINITE else 0


def kv_sums(IsaOps isa, cnp.ndarray rows, object span, object last, int64_t stream,
            int64_t d, bint keys):
    """The exact products of int8 rows with every token of one stream, as int8 attention
    takes them: ``rows (R, d) . keys`` (R, tokens) int32 with `keys`, else ``rows (R,
    tokens) . values`` (R, d) int64 (the tests' window on kv_attention.h)."""
    cdef w8_kv_attention a
    memset(&a, 0, sizeof(a))
    a.d, a.isa = d, isa.ops
    streams = span.key_scales.shape[0] if span.count else last.keys.shape[0]
    _set_store(&a, span, last, streams, d)
    cdef w8_kv_span sp = w8_kv_span_of(&a, -(1 << 62), 1 << 62)
    cdef int64_t R = rows.shape[0]
    if rows.dtype != np.int8 or not rows.flags.c_contiguous or rows.shape[1] != (
            d if keys else sp.T) or not 0 <= stream < streams:
        raise ValueError("rows must be C-contiguous int8 of the stream's width")
    cdef cnp.ndarray out = np.empty((R, sp.T) if keys else (R, d),
                                    np.int32 if keys else np.int64)
    cdef cnp.ndarray cols = np.empty(max(1, R * a.page), np.int8)
    cdef cnp.ndarray part = np.empty(max(1, R * d), np.int32)
    cdef int status
    if keys:
        status = w8_kv_key_sums(&a, stream, sp, <const int8_t *>cnp.PyArray_DATA(rows), R,
                                <int32_t *>cnp.PyArray_DATA(out))
    else:
        status = w8_kv_value_sums(&a, stream, sp, <const int8_t *>cnp.PyArray_DATA(rows), R,
                                  <int8_t *>cnp.PyArray_DATA(cols),
                                  <int32_t *>cnp.PyArray_DATA(part),
                                  <int64_t *>cnp.PyArray_DATA(out))
    if status != W8_KV_OK:
        raise RuntimeError("int8 attention: a page's product failed")
    return out


# ---- the tuner (_simd/tuner.h), for pyw8a8.tuning ----

TUNE_ROUNDS = W8_TUNE_ROUNDS


def candidates(IsaOps ops, int64_t m, int64_t n, int64_t kp, int nthreads, int streams=1):
    """The candidate blockings (kc, mc, nc, m_step, n_step) of a shape, the default first."""
    cdef w8_blocking out[W8_MAX_CANDIDATES]
    cdef int i, count = w8_candidates(ops.ops, m, n, kp, nthreads, streams, out)
    return [(out[i].kc, out[i].mc, out[i].nc, out[i].m_step, out[i].n_step)
            for i in range(count)]


def kc_for(IsaOps ops, int64_t kp, int streams=1, m=None):
    """The K-range width of a shape (tuner.h's w8_kc_for; `m` None: any row count)."""
    return w8_kc_for(ops.ops, kp, streams, -1 if m is None else m)


def m_bucket(int64_t m):
    """The row counts that share one tuning entry with `m` rows: those of its bucket."""
    return w8_m_bucket(m)


def fit(tuple blocking, int64_t m):
    """A bucket's candidate adapted to a call's exact M."""
    cdef w8_blocking b
    b.kc, b.mc, b.nc, b.m_step, b.n_step = blocking
    b = w8_fit_blocking(b, m)
    return (b.kc, b.mc, b.nc, b.m_step, b.n_step)


def tuned_cache_bytes(int level):
    """The per-core L1 (1) or L2 (2) bytes the blocks are sized for."""
    return w8_tuned_cache_bytes(level)


def unsettled():
    """How many shapes the calls' tuner is still tuning."""
    return w8_call_unsettled()


def forget_tuning():
    """Forget every tuned shape (plans keep the blockings they settled)."""
    w8_call_forget_tuning()


cdef class Tuner:
    """A tuner apart from the calls' one, whose choices and timings the tests drive."""
    cdef w8_tuner tuner

    def __dealloc__(self):
        w8_tune_clear(&self.tuner)
        free(self.tuner.entries)

    def choose(self, IsaOps ops, int enc, int group, int64_t m, int64_t n, int64_t kp,
               int nthreads, int streams=1):
        """(entry, index, blocking) of the next call of this shape: index None once the
        shape is settled, -1 for its untimed first call."""
        cdef w8_tune_choice c
        if w8_tune_choose(&self.tuner, ops.ops, enc, group, m, n, kp, nthreads, streams,
                          &c) != 0:
            raise MemoryError("no memory for a tuning entry")
        cdef int64_t entry = 0
        while self.tuner.entries[entry] != c.entry:
            entry += 1
        b = (c.blocking.kc, c.blocking.mc, c.blocking.nc, c.blocking.m_step,
             c.blocking.n_step)
        return entry, (None if c.index == W8_TUNE_SETTLED else c.index), b

    def record(self, int64_t entry, index, double seconds):
        """The time of a call of candidate `index` of `entry`."""
        if index is not None and 0 <= entry < self.tuner.count:
            w8_tune_record(self.tuner.entries[entry], index, seconds)


# ---- the table for code built apart (call.h): the torch operator ----

cdef w8_call_api _api
_api.abi_version = W8_CALL_ABI_VERSION
_api.place = call_place
_api.plan_new = w8_plan_new
_api.plan_free = w8_plan_free
_api.plan_outputs = w8_plan_outputs
_api.run = w8_call_run
_api.activation_code = w8_activation_code
_api.fault_text = w8_fault_text
_api.output_take = output_take
_api.output_give = output_give
#: The call object's table (call.h's w8_call_api) as a capsule.
CALL_API = PyCapsule_New(&_api, W8_CALL_CAPSULE, NULL)
