"""The contenders of the bench's table: the data of a shape, and each contender (numpy
float32, a pyw8a8 ISA, rotated or not, and the peers) as a function of no arguments that
runs one product, built where it is timed (in a process of its own)."""
import numpy as np

from .. import _cpu
from ..matmul import matmul
from ..packing import pack_weight
from . import peers


def shape_data(m, k, n):
    """The float32 activations (M, K) and weight (N, K) of one shape: the same in every
    process (an isolated contender builds its own), whatever shapes came before."""
    rng = np.random.default_rng((m, k, n))
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    w *= np.float32(1 / np.sqrt(k))
    return x, w


def _numpy_f32(x, w):
    wt = np.ascontiguousarray(w.T)
    return lambda: x @ wt


def pyw8a8_product(x, w, isa, rotate=False):
    """matmul of x with w packed, on ISA `isa`: called as a user calls it where `isa` is
    the process's ISA; another ISA runs in a use_ops body built once (use_isa would
    check the name and build its IsaOps on every call)."""
    packed = pack_weight(w, rotate=rotate)
    if isa == _cpu.isa():
        return lambda: matmul(x, packed)
    ops = _cpu.checked_ops(isa, "isa")

    def run():
        with _cpu.use_ops(ops, exactly=False):
            return matmul(x, packed)
    return run


#: torchao's int8 Linear compiled by Inductor (peers.torchao_matmul).
TORCHAO = "torchao inductor"
#: The suffix of the table's rotated pyw8a8 contender (block 128, the default).
ROTATED = " rotated"


def contender_names(isas, with_peers=True, rotated=True):
    """The table's contenders: numpy float32, each pyw8a8 ISA of `isas`, (`rotated`) the
    first of them with rotation on, then (`with_peers`) ONNX Runtime, XNNPACK (LiteRT),
    torchao compiled by Inductor and each of torch's engines where they are installed."""
    names = ["numpy f32"] + [f"pyw8a8 {isa}" for isa in isas]
    names += [f"pyw8a8 {isas[0]}{ROTATED}"] if rotated else []
    if with_peers:
        names += ["onnxruntime int8"] if peers.onnxruntime_available() else []
        names += ["xnnpack int8"] if peers.xnnpack_available() else []
        names += [TORCHAO] if peers.torchao_available() else []
        names += [f"torch {e}" for e in peers.torch_engines() or ()]
    return names


def build_contender(name, m, k, n):
    """The function of no arguments that times contender `name` (one of
    :func:`contender_names`) at shape (M, K, N), on :func:`shape_data`."""
    x, w = shape_data(m, k, n)
    kind, _, detail = name.partition(" ")
    if kind == "pyw8a8":
        isa, _, variant = detail.partition(" ")
        return pyw8a8_product(x, w, isa, rotate=variant == ROTATED.strip())
    if kind == "torch":
        return peers.torch_matmul(x, w, detail)
    return {"numpy f32": _numpy_f32, "onnxruntime int8": peers.onnxruntime_matmul,
            "xnnpack int8": peers.xnnpack_matmul, TORCHAO: peers.torchao_matmul}[name](x, w)
