# Type stub of the compiled attention, float and int8 over a paged KV store (_attention.pyx).
from typing import Any

import numpy as np
import numpy.typing as npt

from ._kernels import WeightPlan

def float_attention(q: npt.NDArray[np.float32], k: npt.NDArray[np.float32],
                    v: npt.NDArray[np.float32], mask_bool: npt.NDArray[np.uint8] | None,
                    mask_add: npt.NDArray[np.float32] | None, out: npt.NDArray[np.float32],
                    scale: float, causal: bool, nthreads: int) -> None: ...
def int8_terms(x: npt.NDArray[np.float32], q: npt.NDArray[np.int8],
               step: npt.NDArray[np.float32], lo_steps: int, nthreads: int) -> int: ...
class PlanTable:
    streams: int
    pages: int
    def __init__(self, rows: list[list[WeightPlan]]) -> None: ...
def kv_attention(isa: int, nthreads: int, q: npt.NDArray[np.float32], q_start: int,
                 query_terms: int, probability_terms: int, lo_steps: int, span: Any,
                 last: Any, window: int, softcap: float, mask: npt.NDArray[Any] | None,
                 mask_start: int, kv_per_batch: int, out: npt.NDArray[np.float32],
                 block_rows: int) -> int: ...
def kv_sums(isa: int, rows: npt.NDArray[np.int8], span: Any, last: Any, stream: int,
            d: int, keys: bool) -> npt.NDArray[np.int32] | npt.NDArray[np.int64]: ...
