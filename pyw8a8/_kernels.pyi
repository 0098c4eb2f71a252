# Type stub of the compiled product (_kernels.pyx): what the Python modules call.
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ._dispatch import IsaOps

W8_NR: int
W8_KPAD: int
W8_A_ROW_PAD: int
W8_EXACT_K: int
W8_ENC_BIASED: int
W8_ENC_SIGNED: int
W8_OUT_F32: int
W8_OUT_I32: int
W8_OUT_I64: int
W8_ACT_NONE: int
W8_ACT_RELU: int
W8_ACT_GELU: int
W8_ACT_GELU_TANH: int
W8_ACT_SILU: int

def data_address(arr: np.ndarray[Any, Any]) -> int: ...


class WeightPlan:
    address: Final[int]
    panels: Final[npt.NDArray[np.uint8]]
    psum: Final[npt.NDArray[np.int32]]
    scales: Final[npt.NDArray[np.float32]]
    shape: Final[tuple[int, int]]
    encoding: Final[str]
    N: Final[int]
    K: Final[int]
    Kp: Final[int]
    block: Final[int]
    enc: Final[int]
    seed: Final[int]
    rotate: Final[bool]
    def __new__(cls, panels: npt.NDArray[np.uint8], psum: npt.NDArray[np.int32],
                scales: npt.NDArray[np.float32], shape: tuple[int, int], encoding: str,
                format_version: int, rotate: bool, block: int, seed: int,
                check_contents: bool = ...) -> WeightPlan: ...
    def settled_blocking(self, kind: int, ops: IsaOps, m: int,
                         nthreads: int) -> tuple[int, int, int, int, int] | None: ...

_Blocking = tuple[int, int, int, int, int]

# call.h's w8_call_api, as a capsule (types.CapsuleType from Python 3.13)
CALL_API: object

def call(x: object, plan1: object, plan2: object, bias1: object, bias2: object,
         activation: object, kind: int, out: object = ..., blocking: _Blocking | None = ...,
         ) -> (npt.NDArray[np.float32]
               | tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None): ...
def int8_call(qa: npt.NDArray[np.int8], plan: WeightPlan, out: npt.NDArray[Any],
              blocking: _Blocking | None = ...) -> None: ...
FORMAT_UNPADDED: int
FORMAT_PADDED: int
MIN_BLOCK: int
MAX_BLOCK: int
CALL_ONE: int
CALL_PAIR: int
CALL_GLU: int
SETTLED_ROWS: int
ACTIVATIONS: dict[str, int]
TUNE_ROUNDS: int
def candidates(ops: IsaOps, m: int, n: int, kp: int, nthreads: int,
               streams: int = ...) -> list[_Blocking]: ...
def kc_for(ops: IsaOps, kp: int, streams: int = ..., m: int | None = ...) -> int: ...
def m_bucket(m: int) -> int: ...
def fit(blocking: _Blocking, m: int) -> _Blocking: ...
def tuned_cache_bytes(level: int) -> int: ...
def unsettled() -> int: ...
def forget_tuning() -> None: ...

class Tuner:
    def choose(self, ops: IsaOps, enc: int, group: int, m: int, n: int, kp: int,
               nthreads: int, streams: int = ...) -> tuple[int, int | None, _Blocking]: ...
    def record(self, entry: int, index: int | None, seconds: float) -> None: ...
