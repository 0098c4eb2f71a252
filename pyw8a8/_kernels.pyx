# cython: language_level=3
"""Compiled core of pyw8a8: typed entry points around the C kernels of ``_simd``.

Callers (the Python modules of the package) validate and normalize every argument first;
this module trusts its inputs, releases the GIL and runs its loops in OpenMP ``prange``.
The one exception is ``settled_product``, the common call run from C: it checks that its
arguments are already in the normal form and declines (returns None) anything else.
"""
from cython.parallel cimport parallel, prange
cimport openmp
from openmp cimport omp_get_max_threads, omp_set_num_threads
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from posix.stdlib cimport posix_memalign
from libc.string cimport memset
from libc.math cimport isfinite
from cpython.contextvars cimport get_value
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.ref cimport PyObject
import contextvars

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


def cache_bytes(int level):
    """This CPU's per-core level-1 data (1) or level-2 (2) cache in bytes; 0 if unknown."""
    return w8_cache_bytes(level)


def data_address(cnp.ndarray arr):
    """The address of arr's first element (numpy's own, ``arr.ctypes.data``, costs a
    ctypes object per call)."""
    return <size_t>cnp.PyArray_DATA(arr)


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
            self.table.mr, self.table.npanels = tile.mr, tile.npanels
            self.table.whole_tiles = tile.whole_tiles
        self.ops = &self.table
        # Its own name keeps the tuner's timings of the real kernels apart.
        self.name = name
        if noop_kernel:
            self.name += f"+noop({tile.name.decode()} tile)"
        self.index = entry - &w8_isas[0]
        self.mr = self.table.mr
        self.npanels = self.table.npanels
        self.whole_k = self.table.whole_k

    @property
    def auto_encoding(self):
        """The weight encoding this path runs best ('biased' or 'signed')."""
        return "signed" if self.ops.auto_encoding == W8_ENC_SIGNED else "biased"

    def row_sums(self, int enc):
        """Whether the kernel of encoding `enc` needs the activations' prefix sums."""
        return W8_CORR_READS_ROWS(self.ops.corr[enc])

    def activation_key(self, int enc):
        """Products whose keys are equal share one quantization of their activations."""
        return (self.ops.a_flip[enc], W8_CORR_READS_ROWS(self.ops.corr[enc]))

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
        # One scratch row per thread: the rotated row is quantized from it, so the
        # activation matrix is never copied whole.
        with nogil, parallel(num_threads=nthreads):
            w8_join_team(master)
            scratch = <float *>malloc(Kp * sizeof(float))  # Kp >= K padded to block
            for i in prange(M, schedule="static"):
                if scratch == NULL:
                    st[i] = 2
                else:
                    st[i] = w8_quantize_row_rotated(
                        isa.ops, &x[i, 0], K, Kp, flip, &q[i, 0], &scale[i],
                        &psum[i, 0] if want_psum else NULL, block, signs, scratch)
            free(scratch)
        free(signs)
    for i in range(M):
        if st[i] != 0:
            bad = i if st[i] == 1 else -2
            break
    free(st)
    if bad == -2:
        raise MemoryError(f"no memory for a scratch row of {K} floats")
    return bad


def amx_config_roundtrip():
    """Load the AMX tile configuration and read it back (call only where the amx path is
    supported): True when every byte arrived, None when this build has no AMX path."""
    cdef int ok = w8_amx_config_roundtrip()
    return None if ok < 0 else bool(ok)


def master_cpu():
    """The CPU of the calling thread as a parallel region's master records it (team.h); -1
    where that is unknown (not Linux)."""
    return w8_master_here().cpu


def leave_master_cpu(int cpu):
    """What a worker of a region whose master runs on `cpu` does as it starts: True if the
    calling thread ran on that CPU and moved off it (team.h)."""
    cdef w8_master_place place
    place.cpu = cpu
    return bool(w8_leave_master_cpu(place))


# ---- the call setup: which path and how many threads a product runs with ----
#
# Its state lives here, set by _cpu (set_isa, use_isa, PYW8A8_ISA, amx's small-M fallback)
# and _threads (set_num_threads, fork), whose functions own the rules and the checks, so
# that a matmul's setup (settled_product) runs no Python code.  After a product that
# streamed a megabyte or more through the caches, every step of Python code misses them:
# matmul's setup in Python took 20 us at 64 x 2048 x 640 and 7 us at 1 x 640 x 2048,
# against 4 us with warm caches (AMX Xeon, 2 vCPUs; 15-20% of those calls).

cdef IsaOps _process_ops = None   # set_isa, PYW8A8_ISA, or the CPU's best
cdef dict _small_m = {}  # path name -> (the IsaOps it runs below `rows` rows, rows)
# The path of a use_isa body: (IsaOps, exactly), for its thread and context only.
cdef object _scoped_ops = contextvars.ContextVar("pyw8a8_isa", default=None)
SCOPED_OPS = _scoped_ops

cdef int _threads_override = 0   # set_num_threads; 0: OpenMP's default
cdef int _max_threads = 1
cdef int64_t _serial_work = 0
cdef bint _pool_left_behind = False  # a forked child whose surviving thread ran a team
cdef unsigned long _survivor = 0

cdef extern from *:
    """
    /* Whether the calling thread has started an OpenMP team: the thread that forks takes
     * this with it into the child, where its team is gone (_threads.py). */
    static _Thread_local int w8_started_team = 0;
    """
    int w8_started_team


def set_process_ops(IsaOps ops):
    """Make `ops` the process-wide path (_cpu.set_isa)."""
    global _process_ops
    _process_ops = ops


def set_small_m_ops(str name, IsaOps ops, int64_t rows):
    """Path `name` runs products of fewer than `rows` activation rows on `ops`."""
    _small_m[name] = (ops, rows)


cpdef IsaOps call_ops(int64_t rows):
    """The path of a product with `rows` activation rows on the calling thread and context
    (a use_isa body's, or the process-wide path, or its small-M fallback); -1: not a
    product, so no fallback."""
    cdef IsaOps ops = _process_ops
    cdef bint exactly = False
    scoped = get_value(_scoped_ops, None)
    if scoped is not None:
        ops, exactly = scoped
    if rows >= 0 and not exactly:
        fallback = _small_m.get(ops.name)
        if fallback is not None and rows < fallback[1]:
            return fallback[0]
    return ops


def configure_threads(int max_threads, int64_t serial_work):
    """The largest thread count, and the work below which a product runs on one thread
    (_threads.py says why)."""
    global _max_threads, _serial_work
    _max_threads, _serial_work = max_threads, serial_work


def set_threads_override(int n):
    """set_num_threads's count; 0: back to OpenMP's default."""
    global _threads_override
    _threads_override = n


def threads_override():
    """set_num_threads's count, or None."""
    return _threads_override or None


def note_fork_in_child():
    """After a fork, in the child: if the surviving thread had started a team, its pool was
    left behind, and it runs products on one thread from now on."""
    global _pool_left_behind, _survivor
    if w8_started_team:
        _pool_left_behind, _survivor = True, PyThread_get_thread_ident()


def follow_threads(int n):
    """Make `n` the OpenMP default of the calling thread (pyw8a8.torch: torch's count), so
    that a runtime of pyw8a8's own follows torch.set_num_threads as a shared one does."""
    if omp_get_max_threads() != n:
        omp_set_num_threads(n)


cpdef bint fork_fallback():
    """Whether the calling thread is a forked child's surviving thread whose OpenMP pool
    was left behind by the fork."""
    return _pool_left_behind and PyThread_get_thread_ident() == _survivor


cpdef int num_threads():
    """The thread count of the calling thread's next parallel call."""
    if fork_fallback():
        return 1
    if _threads_override:
        return _threads_override
    # Clamped too: omp_set_num_threads from other code in the process is not checked.
    return min(max(1, omp_get_max_threads()), _max_threads)


cpdef int threads_for(int64_t work):
    """Threads for a call doing `work` multiply-accumulates (or element operations)."""
    global w8_started_team
    cdef int n
    if work < _serial_work:
        return 1
    n = num_threads()
    if n > 1:
        w8_started_team = 1
    return n


# ---- the compiled call path of every product ----

# The kinds of settled call (settled_product), each remembered apart by a weight: one
# product (matmul), a pair (matmul_pair), a gated pair (matmul_pair with glu=).
cdef enum:
    W8_CALL_ONE = 0
    W8_CALL_PAIR = 1
    W8_CALL_GLU = 2
    W8_CALL_KINDS = 3
CALL_ONE, CALL_PAIR, CALL_GLU = W8_CALL_ONE, W8_CALL_PAIR, W8_CALL_GLU
# The fused activations by name (common.h W8_ACT_*; the arithmetic is activation.h's).
ACTIVATIONS = {"relu": W8_ACT_RELU, "gelu": W8_ACT_GELU, "gelu_tanh": W8_ACT_GELU_TANH,
               "silu": W8_ACT_SILU}


# One weight of a product, as C values: from product's lists, or settled_product's.
ctypedef struct w8_call_weight:
    PyObject *plan  # a WeightPlan, borrowed from the caller
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
    cdef readonly dict blocking  # settled tuner choices, (path, M, threads) -> blocking
    # Per call kind (CALL_*), the settled blocking of this weight's last call of that kind
    # (remember_blocking): what settled_product runs with when the path (by name), the
    # rows and the threads are the same again.
    cdef list last_path
    cdef int64_t last_m[W8_CALL_KINDS]
    cdef int last_threads[W8_CALL_KINDS]
    cdef int64_t last_blocking[W8_CALL_KINDS][5]
    cdef const uint8_t *b
    cdef const int32_t *b_psum
    cdef const float *b_scale
    cdef const float *sign_table
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
        self.last_path = [None] * W8_CALL_KINDS
        self.signs, self.sign_table = None, NULL
        if rotate and self.K:
            # Built once, by the reference: every path's sign application gives these bits.
            self.signs = np.empty(self.K, np.float32)
            self.sign_table = <const float *>cnp.PyArray_DATA(self.signs)
            w8_sign_table(w8_scalar_sign_scale, <float *>self.sign_table, self.K, block, seed)

    def remember_blocking(self, int kind, IsaOps ops, int64_t m, int nthreads,
                          tuple blocking):
        """Remember a settled blocking of this weight in a call of kind `kind` (CALL_*) of
        `m` rows on path `ops` with `nthreads` threads, for settled_product."""
        cdef int64_t *b
        if not 0 <= kind < W8_CALL_KINDS:
            raise ValueError(f"unknown call kind {kind}")
        b = self.last_blocking[kind]
        b[0], b[1], b[2], b[3], b[4] = blocking
        self.last_path[kind] = ops.name
        self.last_m[kind], self.last_threads[kind] = m, nthreads

    cdef bint settled(self, int kind, IsaOps ops, int64_t m, int nthreads,
                      w8_call_weight *cw):
        """Whether this weight settled a blocking for this call; if so, it goes to `cw`."""
        cdef int64_t *b = self.last_blocking[kind]
        path = self.last_path[kind]
        # The path by name, as the tuner settles it: use_isa builds a new IsaOps each time.
        if (self.last_m[kind] != m or self.last_threads[kind] != nthreads or path is None
                or (path is not ops.name and path != ops.name)):
            return False
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


def activate(IsaOps isa, float[:, ::1] x, int act):
    """Apply activation `act` (a W8_ACT_* value) in place to x with the activation pass of
    path `isa` (its vectors and its scalar tail), as the fused layer applies it to its
    tiles; for testing one path's arithmetic on any float32 values."""
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


cdef inline const float *_bias_data(object bias):
    if bias is None:
        return NULL
    return <const float *>cnp.PyArray_DATA(bias)


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
    overflows (the outputs are then unspecified).
    """
    cdef int nw = len(weights), j
    cdef w8_call_weight w[W8_MAX_WEIGHTS]
    cdef cnp.ndarray out
    if not 1 <= nw <= W8_MAX_WEIGHTS or len(blockings) != nw or len(biases) != nw:
        raise ValueError("one or two weights, each with a blocking and a bias")
    if len(outs) != (1 if glu else nw) or (glu and nw != 2):
        raise ValueError("an output per weight, or one for a gated pair of two weights")
    for j in range(nw):
        w[j].plan = <PyObject *>(<WeightPlan?>weights[j])
        w[j].kc, w[j].mc, w[j].nc, w[j].m_step, w[j].n_step = blockings[j]
        w[j].bias = _bias_data(biases[j])
        w[j].out, w[j].ldo, w[j].out_size = NULL, 0, 0
        if j < len(outs):
            out = outs[j]
            w[j].out, w[j].ldo = cnp.PyArray_DATA(out), out.strides[0] // out.itemsize
            w[j].out_size = out.itemsize
    return _run_product(isa, cnp.PyArray_DATA(x), cnp.PyArray_TYPE(x) == cnp.NPY_INT8,
                        x.shape[0], x.shape[1], w, nw, scratch, nthreads, act, glu)


cdef int64_t _run_product(IsaOps isa, const void *x, bint int8_input, int64_t M, int64_t K,
                          w8_call_weight *weights, int nw, Scratch scratch, int nthreads,
                          int act, bint glu) except -2:
    """product's work, from C values: lays out the scratch and the jobs, then runs them."""
    cdef const w8_isa_ops *ops = isa.ops
    cdef int j, f
    cdef WeightPlan w = <WeightPlan>weights[0].plan
    cdef int64_t Kp = w.Kp
    cdef int64_t Mp = (M + W8_A_ROW_PAD - 1) // W8_A_ROW_PAD * W8_A_ROW_PAD
    cdef int64_t np1 = Kp // W8_KPAD + 1, bad
    cdef bint wide = not int8_input and Kp > W8_EXACT_K
    cdef int nworkers = nthreads if nthreads > 1 else 1
    cdef size_t fmt_off[W8_MAX_WEIGHTS]
    cdef size_t sums_off[W8_MAX_WEIGHTS]
    cdef int fmt_of[W8_MAX_WEIGHTS]
    cdef size_t off = 0, off_scale, off_st, off_rot
    cdef uint8_t flip
    cdef bint row_sums
    cdef char *base
    cdef w8_product p
    cdef w8_gemm_plan *g
    p.ops, p.x, p.int8_input, p.M, p.K, p.Kp = ops, x, int8_input, M, K, Kp
    p.block = w.block if w.rotate and not int8_input else 0
    p.signs = w.sign_table
    # The scratch: each format's bytes and sums, the scales, the row statuses, the raw sums
    # that go to no output (a float product beyond W8_EXACT_K: int64, converted at the end;
    # the up projection of a gated pair), one rotation row per thread.
    p.nformats = 0
    for j in range(nw):
        w = <WeightPlan>weights[j].plan
        flip, row_sums = ops.a_flip[w.enc], W8_CORR_READS_ROWS(ops.corr[w.enc])
        fmt_of[j] = -1
        for f in range(p.nformats):
            if p.fmt[f].flip == flip and p.fmt[f].row_sums == row_sums:
                fmt_of[j] = f
        if fmt_of[j] < 0:
            f = fmt_of[j] = p.nformats
            p.fmt[f].flip, p.fmt[f].row_sums = flip, row_sums
            fmt_off[f] = off
            off += _aligned(Mp * Kp) + _aligned(M * np1 * sizeof(int32_t) if row_sums else 0)
            p.nformats += 1
    off_scale = off
    off_st = off_scale + _aligned(M * sizeof(float))
    off = off_st + _aligned(M)
    for j in range(nw):
        sums_off[j] = off
        if wide:
            off += _aligned(M * (<WeightPlan>weights[j].plan).N * sizeof(int64_t))
        elif glu and j == 1:
            off += _aligned(M * (<WeightPlan>weights[j].plan).N * sizeof(int32_t))
    off_rot = off
    p.rot_stride = (K + p.block - 1) // p.block * p.block if p.block else 0
    p.rot_stride = _aligned(p.rot_stride * sizeof(float)) // sizeof(float)
    base = scratch.reserve(off_rot + p.rot_stride * sizeof(float) * nworkers)
    for f in range(p.nformats):
        p.fmt[f].q = <uint8_t *>(base + fmt_off[f])
        p.fmt[f].psum = <int32_t *>(base + fmt_off[f] + _aligned(Mp * Kp))
    p.a_scale = <float *>(base + off_scale)
    p.status = <uint8_t *>(base + off_st)
    p.rot = <float *>(base + off_rot)
    p.njobs = 1 if glu else nw
    for j in range(nw):
        w = <WeightPlan>weights[j].plan
        g = &p.up if glu and j == 1 else &p.jobs[j].g
        f = fmt_of[j]
        g.ops, g.enc, g.M, g.N, g.Kp = ops, w.enc, M, w.N, Kp
        g.a, g.lda = p.fmt[f].q, Kp
        g.a_psum = p.fmt[f].psum if p.fmt[f].row_sums else NULL
        g.b, g.b_psum, g.a_scale, g.b_scale = w.b, w.b_psum, p.a_scale, w.b_scale
        g.bias = weights[j].bias
        g.act = act if j == 0 else W8_ACT_NONE
        g.up = NULL
        g.kc, g.mc, g.nc = weights[j].kc, weights[j].mc, weights[j].nc
        p.wide_out[j] = NULL
        if glu and j == 1:
            # The up projection's raw sums, finished with the gate's tiles.
            g.out_kind = W8_OUT_I64 if wide else W8_OUT_I32
            g.out, g.ldo = base + sums_off[j], w.N
            p.jobs[0].g.up = g
            continue
        g.out, g.ldo = weights[j].out, weights[j].ldo
        g.out_kind = W8_OUT_F32
        if int8_input:
            g.out_kind = W8_OUT_I64 if weights[j].out_size == 8 else W8_OUT_I32
        elif wide:
            # Exact int32 sums per W8_EXACT_K-range, added in int64, converted at the end.
            g.out_kind = W8_OUT_I64
            p.wide_out[j], p.wide_ldo[j] = <float *>g.out, g.ldo
            g.out, g.ldo = base + sums_off[j], w.N
        p.jobs[j].m_step, p.jobs[j].n_step = weights[j].m_step, weights[j].n_step
    with nogil:
        bad = w8_run_product(&p, nworkers)
    return bad


cdef const float *_settled_bias(object bias, int64_t n, bint *ok):
    """The data of `bias` when it is None (NULL) or a native float32 vector of n finite
    values, aligned and contiguous; otherwise *ok becomes False."""
    cdef cnp.ndarray arr
    cdef const float *b
    cdef int64_t i
    if bias is None:
        return NULL
    if type(bias) is not np.ndarray:
        ok[0] = False
        return NULL
    arr = bias
    if (arr.ndim != 1 or arr.shape[0] != n or cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32
            or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISBEHAVED_RO(arr)):
        ok[0] = False
        return NULL
    b = <const float *>cnp.PyArray_DATA(arr)
    for i in range(n):
        if not isfinite(b[i]):
            ok[0] = False
    return b


def settled_product(object x, object plan1, object plan2, object bias1, object bias2,
                    object activation, bint pair, bint glu, object scratch):
    """The common calls of matmul and matmul_pair, from C: `x` a C-contiguous, aligned,
    native-order float32 ndarray (any leading dimensions, at least one row of K >= 1
    features); `plan1` (and with `pair`, `plan2`) the WeightPlan(s), N >= 1, of one K and
    rotation (with `glu`, a pair of one N); the biases None or float32 vectors of N finite
    values;
    `activation` None or a name of ACTIVATIONS (with `glu`, the gate's); each weight having
    settled a blocking for this call's kind, path, row count and thread count
    (WeightPlan.remember_blocking); `scratch` the thread's Scratch.

    Returns matmul's output, matmul_pair's (y1, y2) or its gated output; or None when the
    call is not such a call, or a row of x holds NaN/Inf: the caller then takes the
    general path (which reports the row, or the argument).
    """
    cdef cnp.ndarray arr, y1, y2 = None
    cdef WeightPlan w1, w2 = None
    cdef IsaOps ops
    cdef int nd, i, nthreads, nw = 1, act = W8_ACT_NONE
    cdef int kind = W8_CALL_GLU if glu else W8_CALL_ONE
    cdef int64_t K, M, n_total
    cdef cnp.npy_intp dims[64]
    cdef w8_call_weight cw[2]
    cdef bint ok = True
    if (type(x) is not np.ndarray or type(plan1) is not WeightPlan
            or type(scratch) is not Scratch):
        return None
    arr, w1 = x, plan1
    if pair:
        if type(plan2) is not WeightPlan:
            return None
        w2, nw = plan2, 2
        kind = W8_CALL_GLU if glu else W8_CALL_PAIR
    if activation is not None:
        code = ACTIVATIONS.get(activation) if type(activation) is str else None
        if code is None:
            return None
        act = code
    nd = arr.ndim
    if (nd == 0 or cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32
            or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISBEHAVED_RO(arr)):
        return None
    K = arr.shape[nd - 1]
    if K != w1.K or K == 0 or w1.N == 0 or cnp.PyArray_SIZE(arr) == 0:
        return None
    n_total = w1.N
    if w2 is not None:
        if (w2.K != K or w2.N == 0 or w2.rotate != w1.rotate or (glu and w2.N != w1.N)
                or (w1.rotate and (w2.block != w1.block or w2.seed != w1.seed))):
            return None
        n_total += w2.N
    elif glu:
        return None
    M = cnp.PyArray_SIZE(arr) // K
    ops = call_ops(M)
    nthreads = threads_for(M * K * n_total)
    if not w1.settled(kind, ops, M, nthreads, &cw[0]):
        return None
    if w2 is not None:
        if glu:
            cw[1] = cw[0]  # a gated pair runs one loop nest, over the gate's blocking
        elif not w2.settled(kind, ops, M, nthreads, &cw[1]):
            return None
    cw[0].bias = _settled_bias(bias1, w1.N, &ok)
    if w2 is not None:
        cw[1].bias = _settled_bias(bias2, w2.N, &ok)
    if not ok:
        return None
    for i in range(nd - 1):
        dims[i] = arr.shape[i]
    dims[nd - 1] = w1.N
    y1 = _empty_output(nd, dims)
    cw[0].plan, cw[0].out, cw[0].ldo, cw[0].out_size = <PyObject *>w1, cnp.PyArray_DATA(y1), w1.N, sizeof(float)
    if w2 is not None:
        cw[1].plan, cw[1].out, cw[1].ldo, cw[1].out_size = <PyObject *>w2, NULL, 0, 0
        if not glu:
            dims[nd - 1] = w2.N
            y2 = _empty_output(nd, dims)
            cw[1].out, cw[1].ldo, cw[1].out_size = cnp.PyArray_DATA(y2), w2.N, sizeof(float)
    if _run_product(ops, cnp.PyArray_DATA(arr), False, M, K, cw, nw, <Scratch>scratch,
                    nthreads, act, glu) >= 0:
        return None
    return (y1, y2) if kind == W8_CALL_PAIR else y1
