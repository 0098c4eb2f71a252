# Type stub of the compiled core (_kernels.pyx): what the Python modules call.
from typing import Any, Final

import numpy as np
import numpy.typing as npt

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

def cpu_features() -> dict[str, bool]: ...
def cache_bytes(level: int) -> int: ...
def data_address(arr: np.ndarray[Any, Any]) -> int: ...
def isa_names() -> list[str]: ...
def isa_supported(name: str) -> bool: ...
def isa_explicit_only(name: str) -> bool: ...
def best_isa() -> str: ...

class IsaOps:
    name: Final[str]
    index: Final[int]
    mr: Final[int]
    npanels: Final[int]
    whole_k: Final[bool]
    def __new__(cls, name: str, noop_kernel: bool = False,
                tile_of: str | None = None) -> IsaOps: ...
    auto_encoding: Final[str]
    def row_sums(self, enc: int) -> bool: ...
    def activation_key(self, enc: int) -> tuple[int, bool]: ...

def quantize_rows(isa: IsaOps, enc: int, x: npt.NDArray[np.float32],
                  q: npt.NDArray[np.uint8], scale: npt.NDArray[np.float32],
                  psum: npt.NDArray[np.int32], nthreads: int, block: int = 0,
                  seed: int = 0) -> int: ...
def amx_config_roundtrip() -> bool | None: ...
def master_cpu() -> int: ...
def leave_master_cpu(cpu: int) -> bool: ...
def omp_max_threads() -> int: ...

class WeightPlan:
    panels: Final[npt.NDArray[np.uint8]]
    psum: Final[npt.NDArray[np.int32]]
    scales: Final[npt.NDArray[np.float32]]
    shape: Final[tuple[int, int]]
    encoding: Final[str]
    signs: Final[npt.NDArray[np.float32] | None]
    blocking: Final[dict[Any, tuple[int, int, int, int, int]]]
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
    def describes(self, panels: object, psum: object, scales: object, shape: object,
                  encoding: object) -> bool: ...

class Scratch: ...

def activate(isa: IsaOps, x: npt.NDArray[np.float32], act: int) -> None: ...
def product(isa: IsaOps, x: npt.NDArray[np.float32] | npt.NDArray[np.int8],
            weights: list[WeightPlan], outs: list[npt.NDArray[Any]], scratch: Scratch,
            nthreads: int, blockings: list[tuple[int, int, int, int, int]],
            biases: list[npt.NDArray[np.float32] | None], act: int = ...,
            glu: bool = ...) -> int: ...
