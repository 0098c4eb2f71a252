"""The blocking of each product shape, tuned on real calls: the Python face of the call
object's tuner (``_simd/tuner.h`` says what it tunes and how), which runs in C inside
every call.  A weight remembers the blocking of each shape its calls settled
(``_kernels.WeightPlan.settled_blocking`` reads it back)."""
from . import _kernels

#: Rounds of calls a shape's candidates take at most before one is kept.
ROUNDS = _kernels.TUNE_ROUNDS
#: The per-core L2 the blocks are sized for, as the CPU reports it.
L2_BYTES = _kernels.tuned_cache_bytes(2)
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
