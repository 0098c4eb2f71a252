"""Blocking parameters per shape, tuned on real calls and cached.

Results never depend on the blocking: every product's integer sums are exact and
converted to float once (see ``matmul``). What is tuned is the K-range width kc (the
ISA's B micro-panels filling L1, or the whole K), the M block mc and the task split over N
and M. The first calls of a new shape try each candidate in turn (round-robin, like
gemma.cpp's autotuner); afterwards the fastest is used. The cache key holds the kernel (ISA
and weight encoding), an M bucket, K, N and the thread count, so different kernels never
share an entry.

A shape is *settled* once the tuner's first calls of it have tried the candidate blockings
and kept the fastest (``Tuner.choose`` then answers the index None). Each weight of such a
call remembers that blocking for its kind of call (matmul, matmul_pair, gated pair), ISA,
row count and thread count (``WeightPlan.remember_blocking``, read back by
``settled_blocking``). A *settled call* is one whose weights all remember a blocking for
it: it runs from C without the Python route (``_kernels.settled_product``;
``matmul.settled_call`` for ``pyw8a8.torch``).
"""
import threading

from . import _dispatch
from ._layout import W8_KPAD, W8_NR, padded

# The per-core caches the blocks are sized for, as the CPU reports them (_simd/cpu.h); where
# it cannot tell, the smallest of the x86 CPUs measured (Zen 3: 32 KiB and 512 KiB).
_L1_BYTES = _dispatch.cache_bytes(1) or 32 * 1024
_L2_BYTES = _dispatch.cache_bytes(2) or 512 * 1024
ROUNDS = 3
_SLOWER = 1.25  # candidates this much slower than the best after a round are dropped


def kc_for(ops, kp, streams=1, m=None):
    """K-range width: the B micro-panels of a tile (kc x 16*npanels bytes each, `streams` of
    them: two for a gated pair, whose tiles read the gate's and the up projection's) fit in
    L1, or the whole K for an ISA whose traits say so (AMX: its C tiles accumulate over all
    of K) and for a call of at most two row tiles (`m` rows): there a panel is read once, or
    twice with the second read from L2, so a K-range buys no reuse and costs a second pass
    over the output (M = 1 and 8 ran 1.5-2.6% faster over whole K, AVX-512 on the Xeon)."""
    if ops.whole_k or (m is not None and m <= 2 * ops.mr):
        return kp
    ncols = W8_NR * ops.npanels
    kc = max(W8_KPAD, (_L1_BYTES // (ncols * streams)) // W8_KPAD * W8_KPAD)
    return min(kc, kp)


def m_bucket(m):
    """Shapes whose M falls in one bucket share a tuning entry."""
    if m <= 16:
        return m
    return 1 << (m - 1).bit_length()


def _task_splits(ops, m, n, kp, nthreads, streams):
    """(m_step, n_step) task splits, the heuristic default first: over N (each task all the
    rows of a column block; over M too where N has too few blocks, from two row tiles a
    thread), and from one row tile a thread, over M only (each task all the columns of its
    rows, which it quantizes itself: see w8_tasks_own_rows), the default where the whole
    weight fits in L2."""
    ncols = W8_NR * ops.npanels
    groups = padded(n, ncols) // ncols
    rows_for_threads = nthreads > 1 and m >= 2 * ops.mr * nthreads  # two tiles a thread
    over_n, over_m = [], []
    for tasks_per_thread in (2, 1, 4):
        n_tasks = max(1, min(groups, tasks_per_thread * nthreads))
        n_step = padded(groups, n_tasks) // n_tasks * ncols
        m_tasks = 1
        if rows_for_threads and n_tasks < tasks_per_thread * nthreads:
            m_tasks = -(-tasks_per_thread * nthreads // n_tasks)
        m_step = padded(-(-m // m_tasks), ops.mr) if m else ops.mr
        over_n.append((m_step, n_step))
    # Over M only from one row tile a thread: at 64 x 2048 x 640 on AMX (one 32-row tile
    # each), a thread that quantizes its rows and reads the whole weight from its own L2
    # ran 1.2x as fast as the split over N (2 Xeon vCPUs).
    if nthreads > 1 and m >= ops.mr * nthreads:
        for tasks_per_thread in (1, 2):
            m_step = padded(-(-m // (tasks_per_thread * nthreads)), ops.mr)
            if -(-m // m_step) >= nthreads:  # tasks own their rows only so (product.h)
                over_m.append((m_step, padded(n, ncols)))
    weight_fits_l2 = padded(n, ncols) * kp * streams <= _L2_BYTES
    return over_m + over_n if weight_fits_l2 else over_n + over_m


def candidates(ops, m, n, kp, nthreads, streams=1):
    """(kc, mc, nc, m_step, n_step) choices, the heuristic default first.

    Besides the K-ranges whose B micro-panels fill L1, each task split is tried once over
    the whole K where its panels fit in half of L2: a K-range costs a pass over the output's
    int32 sums (the whole K took down to 0.79x the time of kc = 1024 at K = 1152 to 2048;
    Zen 3, avx2, 2 threads).  `m` is the bucket's first call's (exact up to 16 rows, so
    calls of one or two row tiles all take the whole K, as kc_for says)."""
    kc = kc_for(ops, kp, streams, m)
    ncols = W8_NR * ops.npanels

    def mc_fit(width):  # an A block of `width` values a row in half of L2
        return max(ops.mr, (_L2_BYTES // 2 // max(width, 1)) // ops.mr * ops.mr)

    # nc: the whole task, or a block whose B part (nc x kc) stays in L2.
    nc_l2 = max(ncols, (_L2_BYTES // 2 // max(kc * streams, 1)) // ncols * ncols)
    whole_k = kc < kp and kp * ncols * streams <= _L2_BYTES // 2  # B panels in half of L2
    out = []
    for m_step, n_step in _task_splits(ops, m, n, kp, nthreads, streams):
        fit = mc_fit(kc)
        blocks = [(kc, mc, nc) for mc in (fit, max(ops.mr, fit // 4 // ops.mr * ops.mr))
                  for nc in (n_step, min(n_step, nc_l2))]
        if whole_k:
            blocks.append((kp, mc_fit(kp), n_step))
        for width, mc, nc in blocks:
            cand = (width, min(mc, max(m_step, ops.mr)), nc, m_step, n_step)
            if cand not in out:
                out.append(cand)
    return out


class _Entry:
    __slots__ = ("cands", "times", "alive", "calls", "round_end", "best")

    def __init__(self, cands):
        self.cands = cands
        self.times = [float("inf")] * len(cands)
        self.alive = list(range(len(cands)))
        self.calls = 0
        # The call count at which the current round (one call per live candidate) ends.
        # Counted, not found as a multiple of the live count: the two weights of a pair of
        # one shape share an entry, and their calls step it by two.
        self.round_end = len(cands)
        self.best = cands[0] if len(cands) == 1 else None


class Tuner:
    """Thread-safe cache of tuned blocking per (kernel, M bucket, K, N, threads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = {}

    def clear(self):
        with self._lock:
            self._entries.clear()

    def choose(self, ops, enc, group, m, n, kp, nthreads, streams=1):
        """(key, index, (kc, mc, nc, m_step, n_step)) for the next call of this shape, with
        weight encoding `enc`, in a call of `group` weights (one, or matmul_pair's two) whose
        tiles each read `streams` weights (two for a gated pair); index is None once the
        shape is settled, and -1 for its untimed first call."""
        key = (ops.name, enc, group, streams, m_bucket(m), kp, n, nthreads)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                # A shape's first call carries one-time costs (the scratch growing, its
                # pages faulting in): it runs the default untimed (index -1), so that no
                # candidate, the default least of all, is judged on it.
                entry = self._entries[key] = _Entry(
                    candidates(ops, m, n, kp, nthreads, streams))
                return key, -1, _fit(entry.cands[0], m)
            if entry.best is not None:
                return key, None, _fit(entry.best, m)
            index = entry.alive[entry.calls % len(entry.alive)]
            entry.calls += 1
        return key, index, _fit(entry.cands[index], m)

    def unsettled(self):
        """How many shapes are still being tuned (their calls still try candidates)."""
        with self._lock:
            return sum(entry.best is None for entry in self._entries.values())

    def record(self, key, index, seconds):
        if index is None or index < 0:
            return
        with self._lock:
            entry = self._entries[key]
            if entry.best is not None:
                return
            entry.times[index] = min(entry.times[index], seconds)
            if entry.calls < entry.round_end:
                return
            # After each round but the first, whose calls still carry warm-up costs (the
            # thread team and the caches settling: the first timed calls of a shape took
            # up to 2x the steady time), so no candidate is dropped for coming first.
            if entry.round_end > len(entry.cands):
                best = min(entry.times[i] for i in entry.alive)
                entry.alive = [i for i in entry.alive if entry.times[i] <= best * _SLOWER]
                if entry.calls >= ROUNDS * len(entry.cands) or len(entry.alive) == 1:
                    entry.best = entry.cands[min(entry.alive, key=entry.times.__getitem__)]
            entry.round_end = entry.calls + len(entry.alive)


def _fit(cand, m):
    """A bucket's candidate adapted to this call's exact M."""
    kc, mc, nc, m_step, n_step = cand
    return kc, max(1, min(mc, m)), nc, max(1, min(m_step, m)), n_step


TUNER = Tuner()
