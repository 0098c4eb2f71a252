# Type stub of the compiled output memory (_outputs.pyx).
import numpy as np
import numpy.typing as npt

ALIGN_BYTES: int
ALIGNED_FROM_BYTES: int
RECYCLED_BUFFERS: int
RECYCLED_BYTES: int
def recycled_bytes() -> int: ...
def empty_output(shape: tuple[int, ...]) -> npt.NDArray[np.float32]: ...
