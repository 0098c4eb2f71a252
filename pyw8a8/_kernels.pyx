# cython: language_level=3
"""The compiled call of every product: numpy's face of the call object in C
(``_simd/call_path.h``), and its table for the torch operator (``CALL_API``).

A call (``call``, ``int8_call``; int8 attention's pages through ``CALL_API``) hands C the plans
(``WeightPlan``), rows, outputs, ISA and thread count (``_dispatch``); C checks, tunes,
lays out the thread's scratch and runs, the GIL released.  A fault C returns is raised
here with C's message and error class, as the torch operator raises it.  ``call``
declines (returns None) an argument not in its normal form, for matmul to convert.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport free
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

    @property
    def address(self):
        """The plan's address, for the page tables of int8 attention (_attention)."""
        return <size_t>self.plan

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
        on ISA `ops` with `nthreads` threads, as (kc, mc, nc, m_step, n_step, prefetch);
        None if none."""
        cdef w8_blocking b
        cdef int found
        if not 0 <= kind < W8_CALL_KINDS:
            raise ValueError(f"unknown call kind {kind}")
        w8_call_lock_take()
        found = w8_settled_blocking(self.plan, kind, w8_isa_id_of(ops.ops), m, nthreads, &b)
        w8_call_lock_give()
        return _blocking_tuple(b) if found else None


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


cdef tuple _blocking_tuple(w8_blocking b):
    """A blocking as the tests and the bench see it: (kc, mc, nc, m_step, n_step,
    prefetch)."""
    return (b.kc, b.mc, b.nc, b.m_step, b.n_step, b.prefetch)


cdef const int64_t *_blocking_of(tuple blocking, int64_t *b) except? NULL:
    """`blocking` (kc, mc, nc, m_step, n_step, prefetch) in b, or NULL for the tuner's."""
    if blocking is None:
        return NULL
    b[0], b[1], b[2], b[3], b[4], b[5] = blocking
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
    `blocking`: (kc, mc, nc, m_step, n_step, prefetch) instead of the tuner's (tests).

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
    cdef int64_t b[6]
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
    int64; `blocking` (kc, mc, nc, m_step, n_step, prefetch) instead of the tuner's
    (tests)."""
    cdef w8_call c
    cdef int64_t b[6]
    memset(&c, 0, sizeof(c))
    c.x, c.int8_input, c.M, c.K = cnp.PyArray_DATA(qa), 1, qa.shape[0], qa.shape[1]
    c.kind, c.plan[0] = W8_CALL_ONE, plan.plan
    c.out[0], c.ldo[0], c.out_size = cnp.PyArray_DATA(out), out.shape[1], out.itemsize
    c.blocking = _blocking_of(blocking, b)
    _run(&c, _NAMES_ONE, None)


# ---- the tuner (_simd/tuner.h), for pyw8a8.tuning ----

TUNE_ROUNDS = W8_TUNE_ROUNDS


def candidates(IsaOps ops, int64_t m, int64_t n, int64_t kp, int nthreads, int streams=1):
    """The candidate blockings (kc, mc, nc, m_step, n_step, prefetch) of a shape, the
    default first."""
    cdef w8_blocking out[W8_MAX_CANDIDATES]
    cdef int i, count = w8_candidates(ops.ops, m, n, kp, nthreads, streams, out)
    return [_blocking_tuple(out[i]) for i in range(count)]


def kc_for(IsaOps ops, int64_t kp, int streams=1, m=None):
    """The K-range width of a shape (tuner.h's w8_kc_for; `m` None: any row count)."""
    return w8_kc_for(ops.ops, kp, streams, -1 if m is None else m)


def m_bucket(int64_t m):
    """The row counts that share one tuning entry with `m` rows: those of its bucket."""
    return w8_m_bucket(m)


def fit(tuple blocking, int64_t m):
    """A bucket's candidate adapted to a call's exact M."""
    cdef w8_blocking b
    b.kc, b.mc, b.nc, b.m_step, b.n_step, b.prefetch = blocking
    return _blocking_tuple(w8_fit_blocking(b, m))


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
        return (entry, None if c.index == W8_TUNE_SETTLED else c.index,
                _blocking_tuple(c.blocking))

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
