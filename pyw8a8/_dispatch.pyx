# cython: language_level=3
"""Dispatch: the registry's ISAs and the call setup, which picks the ISA and the thread
count of each call.

The registry (``_simd/dispatch.h``) is read here, so this is the one binary that links the
kernels; the other compiled modules reach them through an ``IsaOps`` handle. Its state is
set by ``_cpu`` (set_isa, use_isa, PYW8A8_ISA, the small-M fallbacks) and ``_threads``
(set_num_threads, fork), which validate the settings and read the environment; the rules
every call applies to that state (``call_ops``, ``threads_for``, the fork fallback) are
here, read from C by ``_kernels.call`` and the torch operator (``call_place``), so that a
call's setup runs no Python code.
"""
from openmp cimport omp_get_max_threads, omp_set_num_threads
from libc.stdint cimport int64_t

cdef extern from "pythread.h" nogil:
    unsigned long PyThread_get_thread_ident()

from pyw8a8._kernels cimport W8_ENC_SIGNED
from pyw8a8._core cimport (W8_CORR_READS_ROWS, W8_NUM_ISAS,
                           w8_amx_config_roundtrip, w8_cache_bytes, w8_cpu_detect,
                           w8_cpu_features, w8_isa_best, w8_isa_lookup, w8_isa_ops, w8_isas,
                           w8_leave_master_cpu, w8_master_here, w8_master_place,
                           w8_noop_ukernel, w8_noop_ukernel_f32)

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


def isa_names():
    """Every ISA of the registry (compiled into this binary), most preferred first."""
    return [w8_isas[i].name.decode() for i in range(W8_NUM_ISAS)]


def isa_supported(str name):
    """Whether this CPU (and OS) runs ISA `name`; for amx this asks Linux for the tile
    state the first time."""
    cdef const w8_isa_ops *ops = w8_isa_lookup(name.encode())
    return ops != NULL and bool(ops.supported(&_features))


def isa_explicit_only(str name):
    """Whether ISA `name` is a test ISA, chosen only when asked for by name."""
    cdef const w8_isa_ops *ops = w8_isa_lookup(name.encode())
    return ops != NULL and bool(ops.explicit_only)


def best_isa():
    """The ISA the dispatcher picks on this CPU."""
    return w8_isa_best(&_features).name.decode()


cdef class IsaOps:
    """One ISA: its registry entry, chosen once and passed along.

    ``noop_kernel=True`` gives a copy whose microkernels do no arithmetic (they store
    zeros): everything else runs as on the ISA, which is what ``bench --overhead`` times;
    ``tile_of`` then gives it the register tile (rows, panels) of another ISA, so the
    loop nest and epilogues run as often as they would there.
    """

    @property
    def address(self):
        """The ISA's table's address, for C callers reached from Python (_attention)."""
        return <size_t>self.ops

    def __cinit__(self, str name, bint noop_kernel=False, str tile_of=None):
        cdef const w8_isa_ops *entry = w8_isa_lookup(name.encode())
        cdef const w8_isa_ops *tile = entry
        if entry == NULL:
            raise ValueError(f"unknown ISA {name!r}")
        if tile_of is not None:
            tile = w8_isa_lookup(tile_of.encode())
            if tile == NULL or not noop_kernel:
                raise ValueError(f"tile_of={tile_of!r} needs noop_kernel=True and an ISA")
        self.table = entry[0]
        if noop_kernel:
            self.table.ukernel[0] = w8_noop_ukernel
            self.table.ukernel[1] = w8_noop_ukernel
            if self.table.ukernel_f32[0] != NULL:  # the ISA finishes tiles in its kernels
                self.table.ukernel_f32[0] = w8_noop_ukernel_f32
                self.table.ukernel_f32[1] = w8_noop_ukernel_f32
            if self.table.ukernel_prefetch[0] != NULL:  # its prefetching kernels alike
                self.table.ukernel_prefetch[0] = w8_noop_ukernel
                self.table.ukernel_prefetch[1] = w8_noop_ukernel
            if self.table.ukernel_f32_prefetch[0] != NULL:
                self.table.ukernel_f32_prefetch[0] = w8_noop_ukernel_f32
                self.table.ukernel_f32_prefetch[1] = w8_noop_ukernel_f32
            self.table.mr, self.table.npanels = tile.mr, tile.npanels
            self.table.whole_tiles = tile.whole_tiles
        self.ops = &self.table
        # Its own name keeps the tuner's timings of the real kernels apart.
        self.name = name
        if noop_kernel:
            self.name += f"+noop({tile.name.decode()} tile)"
        self.mr = self.table.mr
        self.npanels = self.table.npanels
        self.whole_k = self.table.whole_k

    @property
    def prefetches(self):
        """Whether the ISA has kernels that prefetch the weight (the tuner times them for
        one or two row tiles)."""
        return self.ops.ukernel_prefetch[0] != NULL

    @property
    def auto_encoding(self):
        """The weight encoding this ISA runs best ('biased' or 'signed')."""
        return "signed" if self.ops.auto_encoding == W8_ENC_SIGNED else "biased"

    def row_sums(self, int enc):
        """Whether the kernel of encoding `enc` needs the activations' prefix sums."""
        return W8_CORR_READS_ROWS(self.ops.corr[enc])

    def activation_key(self, int enc):
        """Products whose keys are equal share one quantization of their activations."""
        return (self.ops.a_flip[enc], W8_CORR_READS_ROWS(self.ops.corr[enc]))

    def __repr__(self):
        return f"IsaOps({self.name!r})"


def amx_config_roundtrip():
    """Load the AMX tile configuration and read it back (call only where the amx ISA is
    supported): True when every byte arrived, None when this build has no AMX ISA."""
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


# ---- the call setup: which ISA and how many threads a product runs with ----
#
# After a product that streamed a megabyte or more through the caches, every step of
# Python code misses them: matmul's setup in Python took 20 us at 64 x 2048 x 640, against
# 4 us with warm caches (AMX Xeon, 2 vCPUs). So the state lives here, in C variables.

cdef IsaOps _process_ops = None   # set_isa, PYW8A8_ISA, or the CPU's best
# The small-M fallbacks (set_small_m_ops): below _fallback_rows[i] rows, the ISA of
# registry name _fallback_name[i] runs on _fallback_ops[i] (its table _fallback_table[i]).
# C values, so that a call placed without the GIL (call_place) reads the same rule as
# call_ops.  Every IsaOps once set stays alive (_ever_set): a call may still hold its table.
cdef enum:
    _MAX_FALLBACKS = 4
cdef const char *_fallback_name[_MAX_FALLBACKS]
cdef const w8_isa_ops *_fallback_table[_MAX_FALLBACKS]
cdef int64_t _fallback_rows[_MAX_FALLBACKS]
cdef int _nfallbacks = 0
cdef list _fallback_ops = []
cdef const w8_isa_ops *_process_table = NULL
cdef list _ever_set = []

cdef extern from *:
    """
    /* The ISA of a use_isa body, for the calling thread only (a thread started inside the
     * body keeps the process-wide ISA): its IsaOps (kept alive by the body), its table,
     * and whether it runs exactly, without a small-M fallback. */
    static _Thread_local void *w8_scope_ops = NULL;
    static _Thread_local const void *w8_scope_table = NULL;
    static _Thread_local int w8_scope_exactly = 0;
    """
    void *w8_scope_ops
    const void *w8_scope_table
    int w8_scope_exactly
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
    """Make `ops` the process-wide ISA (_cpu.set_isa)."""
    global _process_ops, _process_table
    _ever_set.append(ops)
    _process_ops, _process_table = ops, ops.ops


def set_small_m_ops(str name, IsaOps ops, int64_t rows):
    """ISA `name` runs products of fewer than `rows` activation rows on `ops`."""
    global _nfallbacks
    cdef const w8_isa_ops *wide = w8_isa_lookup(name.encode())
    cdef int i
    if wide == NULL:
        raise ValueError(f"unknown ISA {name!r}")
    _ever_set.append(ops)
    i = 0
    while i < _nfallbacks and _fallback_name[i] != wide.name:
        i += 1
    if i == _nfallbacks:
        if i == _MAX_FALLBACKS:
            raise ValueError(f"at most {_MAX_FALLBACKS} small-M fallbacks")
        _nfallbacks += 1
        _fallback_ops.append(ops)
    _fallback_ops[i] = ops
    _fallback_name[i], _fallback_table[i], _fallback_rows[i] = wide.name, ops.ops, rows


cdef int _fallback_of(const w8_isa_ops *isa, int64_t rows) noexcept nogil:
    """The small-M fallback a product of `rows` rows on `isa` runs on, or -1."""
    cdef int i
    for i in range(_nfallbacks):
        if _fallback_name[i] == isa.name and rows < _fallback_rows[i]:
            return i
    return -1


def enter_scope(IsaOps ops, bint exactly):
    """A use_ops body of the calling thread opens on `ops`: returns what it replaces, for
    leave_scope."""
    global w8_scope_ops, w8_scope_table, w8_scope_exactly
    previous = (<object>w8_scope_ops if w8_scope_ops != NULL else None, w8_scope_exactly)
    w8_scope_ops, w8_scope_table, w8_scope_exactly = <void *>ops, ops.ops, exactly
    return previous


def leave_scope(tuple previous):
    """The body closes: the calling thread's ISA is what enter_scope returned again."""
    global w8_scope_ops, w8_scope_table, w8_scope_exactly
    ops, exactly = previous
    w8_scope_ops = <void *>ops if ops is not None else NULL
    w8_scope_table = (<IsaOps>ops).ops if ops is not None else NULL
    w8_scope_exactly = exactly


cdef void call_place(int64_t rows, int64_t work, int torch_threads, const void **isa,
                     int *nthreads) noexcept nogil:
    """call.h's place: the ISA call_ops gives, and pyw8a8.torch's thread count
    (follow_threads, then threads_for)."""
    cdef const w8_isa_ops *ops = <const w8_isa_ops *>w8_scope_table
    cdef int fallback = -1
    if ops == NULL:
        ops = _process_table
    if not (w8_scope_table != NULL and w8_scope_exactly) and rows >= 0:
        fallback = _fallback_of(ops, rows)
    isa[0] = _fallback_table[fallback] if fallback >= 0 else ops
    if not _threads_override and omp_get_max_threads() != torch_threads:
        omp_set_num_threads(torch_threads)
    nthreads[0] = threads_for(work)


cpdef IsaOps call_ops(int64_t rows):
    """The ISA of a product with `rows` activation rows on the calling thread (a use_isa
    body's, or the process-wide ISA, or its small-M fallback); -1: not a product, so no
    fallback."""
    cdef IsaOps ops = _process_ops
    cdef int fallback = -1
    if w8_scope_ops != NULL:
        ops = <IsaOps>w8_scope_ops
    if not (w8_scope_ops != NULL and w8_scope_exactly) and rows >= 0:
        fallback = _fallback_of(ops.ops, rows)
    return _fallback_ops[fallback] if fallback >= 0 else ops


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


cpdef bint fork_fallback() noexcept nogil:
    """Whether the calling thread is a forked child's surviving thread whose OpenMP pool
    was left behind by the fork."""
    return _pool_left_behind and PyThread_get_thread_ident() == _survivor


cpdef int num_threads() noexcept nogil:
    """The thread count of the calling thread's next parallel call."""
    if fork_fallback():
        return 1
    if _threads_override:
        return _threads_override
    # Clamped too: omp_set_num_threads from other code in the process is not checked.
    return min(max(1, omp_get_max_threads()), _max_threads)


cpdef int threads_for(int64_t work) noexcept nogil:
    """Threads for a call doing `work` multiply-accumulates (or element operations)."""
    global w8_started_team
    cdef int n
    if work < _serial_work:
        return 1
    n = num_threads()
    if n > 1:
        w8_started_team = 1
    return n
