"""The blocking of each product shape, tuned on real calls: the Python face of the call
object's tuner (``_simd/tuner.h``), which runs in C inside every call.

Results never depend on the blocking: every product's integer sums are exact and
converted to float once. What is tuned is the K-range width kc (the ISA's B micro-panels
filling L1, or the whole K), the M block mc and the task split over N and M. The first
calls of a new shape try each candidate in turn (round-robin, like gemma.cpp's autotuner);
afterwards the fastest is used. A tuning entry is keyed on the kernel (ISA and weight
encoding), the weights in the call, an M bucket, K, N and the thread count.

A shape is *settled* once its first calls have tried the candidates and kept the fastest;
each weight of such a call then remembers that blocking for its kind of call (matmul,
matmul_pair, gated pair), ISA, row count and thread count
(``_kernels.WeightPlan.settled_blocking`` reads it back), and its later calls of that
shape skip the tuner.
"""
from . import _kernels

#: Rounds of calls a shape's candidates take at most before one is kept.
ROUNDS = _kernels.TUNE_ROUNDS
#: The per-core caches the blocks are sized for, as the CPU reports them.
L1_BYTES, L2_BYTES = _kernels.tuned_cache_bytes(1), _kernels.tuned_cache_bytes(2)
candidates = _kernels.candidates
kc_for = _kernels.kc_for
m_bucket = _kernels.m_bucket
fit = _kernels.fit
Tuner = _kernels.Tuner


def unsettled() -> int:
    """How many shapes the calls are still tuning (their calls still try candidates)."""
    return _kernels.unsettled()


def clear() -> None:
    """Forget every tuned shape: the next calls of each tune it again (the weights keep
    the blockings they settled)."""
    _kernels.forget_tuning()
