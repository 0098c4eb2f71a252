# Type stub of the compiled output memory (_outputs.pyx).
import numpy as np
import numpy.typing as npt

ALIGN_BYTES: int
ALIGNED_FROM_BYTES: int
RECYCLED_BUFFERS: int
RECYCLED_BYTES: int
def recycled_bytes() -> int: ...
def empty_output(shape: tuple[int, ...]) -> npt.NDArray[np.float32]: ...
ARG_READY: int
ARG_CONVERT: int
ARG_BAD_TYPE: int
ARG_BAD_DTYPE: int
ARG_BAD_SHAPE: int
ARG_READ_ONLY: int
ARG_OVERLAPS: int
def out_fault(out: object, x: object, rows: npt.NDArray[np.float32], n: int,
              dtype: object = ...) -> int: ...
