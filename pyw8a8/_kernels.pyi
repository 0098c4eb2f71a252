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
    panels: Final[npt.NDArray[np.uint8]]
    psum: Final[npt.NDArray[np.int32]]
    scales: Final[npt.NDArray[np.float32]]
    shape: Final[tuple[int, int]]
    encoding: Final[str]
    signs: Final[npt.NDArray[np.float32] | None]
    N: Final[int]
    K: Final[int]
    Kp: Final[int]
    block: Final[int]
    enc: Final[int]
    seed: Final[int]
    rotate: Final[bool]
    def __new__(cls, panels: npt.NDArray[np.uint8], psum: npt.NDArray[np.int32],
                scales: npt.NDArray[np.float32], shape: tuple[int, int], encoding: str,
                kp: int, rotate: bool, block: int, seed: int) -> WeightPlan: ...
    def remember_blocking(self, kind: int, ops: IsaOps, m: int, nthreads: int,
                          blocking: tuple[int, int, int, int, int]) -> None: ...
    def settled_blocking(self, kind: int, ops: IsaOps, m: int,
                         nthreads: int) -> tuple[int, int, int, int, int] | None: ...
    def descriptor_address(self) -> int: ...

class Scratch: ...

# native_api.h's w8_native_api, as a capsule (types.CapsuleType from Python 3.13)
NATIVE_API: object

def product(isa: IsaOps, x: npt.NDArray[np.float32] | npt.NDArray[np.int8],
            weights: list[WeightPlan], outs: list[npt.NDArray[Any]], scratch: Scratch,
            nthreads: int, blockings: list[tuple[int, int, int, int, int]],
            biases: list[npt.NDArray[np.float32] | None], act: int = ...,
            glu: bool = ...) -> int: ...
def page_column_sums(isa: IsaOps, x: npt.NDArray[np.int8], weights: list[WeightPlan],
                     out: npt.NDArray[np.int32], scratch: Scratch, nthreads: int) -> None: ...
def page_row_sums(isa: IsaOps, x: npt.NDArray[np.int8], weights: list[WeightPlan],
                  out: npt.NDArray[np.int32] | npt.NDArray[np.int64], scratch: Scratch,
                  nthreads: int, work: npt.NDArray[Any]) -> None: ...
def page_row_sums_work(rows: int, n: int, k: int) -> int: ...
CALL_ONE: int
CALL_PAIR: int
CALL_GLU: int
SETTLED_ROWS: int
ACTIVATIONS: dict[str, int]
ARG_READY: int
ARG_CONVERT: int
ARG_BAD_TYPE: int
ARG_BAD_DTYPE: int
ARG_BAD_SHAPE: int
ARG_NOT_FINITE: int
ARG_READ_ONLY: int
ARG_OVERLAPS: int
ARG_OTHER_K: int
ARG_OTHER_N: int
ARG_OTHER_ROTATION: int
def activation_code(activation: object) -> int: ...
def pair_fault(w1: WeightPlan, w2: WeightPlan, glu: bool) -> int: ...
def bias_fault(bias: object, n: int) -> int: ...
def out_fault(out: object, x: object, rows: npt.NDArray[np.float32], n: int,
              dtype: object = ...) -> int: ...
def settled_product(
    x: object, plan1: object, plan2: object, bias1: object, bias2: object,
    activation: object, pair: bool, glu: bool, scratch: object, out: object = ...,
) -> (npt.NDArray[np.float32]
      | tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None): ...
